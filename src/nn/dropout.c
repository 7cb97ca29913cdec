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
    ch_real *mask;   /* 0 or 1/(1-p) per element (replica memory), planned for the largest batch,
                      * drawn by the dropout_mask kernel */
    ch_bcast_desc mul; /* y = x * mask, elementwise over a sample */
    bool identity;   /* the last forward copied (evaluation or p = 0) */
} dropout_impl;

static ch_status dropout_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    dropout_impl *d = l->impl;
    const size_t len = ch_shape3_size(l->in) * (size_t)pl->max_batch;
    d->mask = ch_layer_alloc_saved(l, pl, len, sizeof(ch_real), err);
    if (!d->mask) return CH_STATUS_SYSTEM;
    pl->saved_bytes += sizeof(ch_real) * len;
    return ch_layer_alloc_output(l, pl, err);
}

static void dropout_free(ch_layer *l)
{
    dropout_impl *d = l->impl;
    if (!d) return;
    ch_layer_release(l, d->mask);
}

static void dropout_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    dropout_impl *d = l->impl;
    const size_t per = ch_shape3_size(l->in), len = per * (size_t)n;
    if (!r->training || d->p == 0) {
        ch_backend_copy(r->be, l->y, x, sizeof(ch_real) * len);
        d->identity = true;
        return;
    }
    d->identity = false;
    const ch_real keep = (ch_real)(1.0 / (1.0 - d->p));
    const uint32_t threshold = (uint32_t)(d->p * 4294967296.0);
    r->k->dropout_mask(&r->kc, n, per, r->seed, CH_RNG_STREAM_DROPOUT + ((uint64_t)d->id << 8), r->step,
                       r->sample_offset, threshold, keep, d->mask);
    r->k->bcast_forward(&r->kc, &d->mul, n, x, d->mask, l->y);
}

static void dropout_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x,
                             const ch_real *dy, ch_real *dx)
{
    (void)x;
    dropout_impl *d = l->impl;
    if (!dx) return;
    if (d->identity) ch_backend_copy(r->be, dx, dy, sizeof(ch_real) * ch_shape3_size(l->in) * (size_t)n);
    else r->k->bcast_forward(&r->kc, &d->mul, n, dy, d->mask, dx);
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
    const int per = (int)ch_shape3_size(in);
    d->mul = (ch_bcast_desc){ .op = CH_BCAST_MUL, .out = { 1, 1, per }, .a = { 1, 1, per }, .b = { 1, 1, per } };
    l->impl = d;
    *out = l;
    return CH_STATUS_OK;
}
