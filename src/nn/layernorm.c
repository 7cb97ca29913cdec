/* LayerNorm (PyTorch semantics): each sample normalised by its own mean and biased variance over
 * its trailing dimensions from an axis (nn.LayerNorm(normalized_shape) on a (batch, c, h, w) or a
 * (batch, features) tensor), or over its channels at every pixel (ConvNeXt's channels-last
 * LayerNorm: x.permute(0, 2, 3, 1), LayerNorm(c), and the permute back), then scaled and shifted
 * elementwise. Tensors: weight and bias of the normalised shape. No running statistics: training
 * and evaluation compute the same. */
#include "nn/layer.h"

#include <stdlib.h>

enum { LN_WEIGHT = 0, LN_BIAS = 1 };

typedef struct ln_impl {
    double eps;
    int outer, len, inner;      /* per sample: groups outer * inner of len values inner apart */
    ch_real *mean, *invstd;     /* (max batch * outer * inner) each, adjacent: saved for backward */
} ln_impl;

static ch_status ln_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    ln_impl *u = l->impl;
    const size_t groups = (size_t)pl->max_batch * u->outer * u->inner;
    u->mean = ch_layer_alloc_saved(l, pl, groups * 2, sizeof(ch_real), err);
    if (!u->mean) return CH_STATUS_SYSTEM;
    u->invstd = u->mean + groups;
    return ch_layer_alloc_output(l, pl, err);
}

static void ln_free(ch_layer *l)
{
    ln_impl *u = l->impl;
    if (u) ch_layer_release(l, u->mean);
}

static void ln_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    const ln_impl *u = l->impl;
    r->k->layernorm_forward(&r->kc, n * u->outer, u->len, u->inner, x, l->p[LN_WEIGHT], l->p[LN_BIAS], u->eps, l->y,
                            u->mean, u->invstd);
}

static void ln_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy, ch_real *dx)
{
    const ln_impl *u = l->impl;
    r->k->layernorm_backward(&r->kc, n * u->outer, u->len, u->inner, x, dy, l->p[LN_WEIGHT], u->mean, u->invstd, dx,
                             l->g[LN_WEIGHT], l->g[LN_BIAS]);
    ch_run_grads_ready(r, l);
}

static const ch_layer_ops ln_ops = {
    .kind = "LayerNorm", .plan = ln_plan, .forward = ln_forward, .backward = ln_backward, .free_impl = ln_free,
    .y_unread_by_backward = true,
};

ch_status ch_layernorm_create(const char *name, ch_shape3 in, int axis, bool flat, double eps, ch_layer **out,
                              ch_err *err)
{
    if (!(eps > 0 && eps < 1) || axis < CH_LN_CHANNELS || axis > 3 || (flat && axis > 1))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "layernorm %s: eps %g must be in (0, 1) and the axis 1..3 (1 on "
                       "features), or the channels", name, eps);
    ch_layer *l;
    ln_impl *u = ch_layer_alloc_impl(&ln_ops, name, in, in, sizeof *u, &l, err);
    if (!u) return CH_STATUS_SYSTEM;
    u->eps = eps;
    const int d[3] = { in.c, in.h, in.w };
    int64_t dims[3];
    int nd = 0;
    if (axis == CH_LN_CHANNELS) {
        u->outer = 1, u->len = in.c, u->inner = in.h * in.w;
        dims[nd++] = in.c;
    } else {
        u->outer = 1, u->len = 1, u->inner = 1;
        for (int a = 1; a <= 3; a++) {
            if (a < axis) u->outer *= d[a - 1];
            else u->len *= d[a - 1];
            if (a >= axis && (!flat || a == 1)) dims[nd++] = d[a - 1];
        }
    }
    ch_status st = ch_layer_add_param(l, "weight", nd, dims, CH_ROLE_ONES, 0, err);
    if (st == CH_STATUS_OK) st = ch_layer_add_param(l, "bias", nd, dims, CH_ROLE_ZEROS, 0, err);
    return ch_layer_finish(l, st, out);
}
