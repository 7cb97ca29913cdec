/* Dropout (inverted): in training y = x * m / (1 - p) with m ~ Bernoulli(1 - p); identity in eval.
 * The mask of an element is a function of (seed, layer id, step, global sample index, element), so
 * it does not depend on how the batch is split across threads or devices. */
#include "nn/layer.h"

#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

typedef struct dropout_impl {
    double p;
    uint32_t id;
    ch_real *mask;   /* 0 or 1/(1-p) per element, planned for the largest batch */
} dropout_impl;

static ch_status dropout_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    dropout_impl *d = l->impl;
    const size_t len = ch_shape3_size(l->in) * (size_t)pl->max_batch;
    d->mask = malloc(sizeof(ch_real) * len);
    CH_CHECK_ALLOC(err, d->mask);
    pl->saved_bytes += sizeof(ch_real) * len;
    return ch_layer_alloc_output(l, pl->max_batch, err);
}

static void dropout_free(ch_layer *l)
{
    dropout_impl *d = l->impl;
    if (d) free(d->mask);
}

static void dropout_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    dropout_impl *d = l->impl;
    const size_t per = ch_shape3_size(l->in), len = per * (size_t)n;
    if (!r->training || d->p == 0) {
        for (size_t i = 0; i < len; i++) d->mask[i] = 1;
        memcpy(l->y, x, sizeof(ch_real) * len);
        return;
    }
    const ch_real keep = (ch_real)(1.0 / (1.0 - d->p));
    const uint32_t threshold = (uint32_t)(d->p * 4294967296.0);
    for (int s = 0; s < n; s++) {
        ch_rng rng;
        const uint64_t sample = r->sample_offset + (uint64_t)s;
        ch_rng_init(&rng, r->seed, CH_RNG_STREAM_DROPOUT + ((uint64_t)d->id << 8),
                    (r->step << 32) ^ (sample * ((per + 3) / 4)));
        for (size_t e = 0; e < per; e++) {
            const size_t i = (size_t)s * per + e;
            d->mask[i] = ch_rng_u32(&rng) >= threshold ? keep : 0;
            l->y[i] = x[i] * d->mask[i];
        }
    }
}

static void dropout_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x,
                             const ch_real *dy, ch_real *dx)
{
    (void)r;
    (void)x;
    dropout_impl *d = l->impl;
    if (!dx) return;
    const size_t len = ch_shape3_size(l->in) * (size_t)n;
    for (size_t i = 0; i < len; i++) dx[i] = dy[i] * d->mask[i];
}

static const ch_layer_ops dropout_ops = {
    .kind = "Dropout", .plan = dropout_plan, .forward = dropout_forward,
    .backward = dropout_backward, .free_impl = dropout_free,
};

ch_status ch_dropout_create(const char *name, ch_shape3 in, double p, uint32_t id,
                            ch_layer **out, ch_err *err)
{
    if (!(p >= 0 && p < 1))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "dropout %s: p = %g, expected 0 <= p < 1", name, p);
    ch_layer *l = ch_layer_alloc(&dropout_ops, name, in, in);
    CH_CHECK_ALLOC(err, l);
    dropout_impl *d = calloc(1, sizeof *d);
    if (!d) {
        ch_layer_free(l);
        return CH_SYS_FAIL(err, "calloc of dropout");
    }
    d->p = p;
    d->id = id;
    l->impl = d;
    *out = l;
    return CH_STATUS_OK;
}
