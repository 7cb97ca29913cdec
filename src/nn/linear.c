/* Linear: y = x W^T + b with W (out, in), b (out); x must be flat (in, 1, 1), as after Flatten. */
#include "nn/layer.h"

#include <stdlib.h>

static ch_status linear_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    return ch_layer_alloc_output(l, pl, err);
}

static void linear_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    const int in = l->in.c, out = l->out.c;
    /* y = b in every row (or 0), then the product is added */
    if (l->nparams > 1) r->k->copy_rows(&r->kc, n, (size_t)out, l->p[1], 0, l->y, (size_t)out);
    else ch_backend_zero(r->be, l->y, sizeof(ch_real) * (size_t)n * out);
    /* y (n, out) += x (n, in) * W^T (in, out) */
    r->k->gemm(&r->kc, false, true, n, out, in, 1, x, in, l->p[0], in, 1, l->y, out);
}

static void linear_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x,
                            const ch_real *dy, ch_real *dx)
{
    const int in = l->in.c, out = l->out.c;
    /* dW (out, in) = dy^T (out, n) * x (n, in) */
    r->k->gemm(&r->kc, true, false, out, in, n, 1, dy, out, x, in, 0, l->g[0], in);
    /* db[o] = sum_i dy[i][o], samples in order */
    if (l->nparams > 1) r->k->col_sum(&r->kc, n, (size_t)out, dy, l->g[1]);
    ch_run_grads_ready(r, l);
    /* dx (n, in) = dy (n, out) * W (out, in) */
    if (dx) r->k->gemm(&r->kc, false, false, n, in, out, 1, dy, out, l->p[0], in, 0, dx, in);
}

static const ch_layer_ops linear_ops = {
    .kind = "Linear", .plan = linear_plan, .forward = linear_forward, .backward = linear_backward,
    .y_unread_by_backward = true,
};

ch_status ch_linear_create(const char *name, ch_shape3 in, int out_features, ch_layer **out,
                           ch_err *err)
{
    return ch_linear_create_opts(name, in, out_features, true, out, err);
}

ch_status ch_linear_create_opts(const char *name, ch_shape3 in, int out_features, bool bias,
                                ch_layer **out, ch_err *err)
{
    if (in.h != 1 || in.w != 1 || out_features <= 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "linear %s: needs a flat input (got %dx%dx%d) and out_features > 0", name,
                       in.c, in.h, in.w);
    ch_layer *l = ch_layer_alloc(&linear_ops, name, in, (ch_shape3){ out_features, 1, 1 });
    CH_CHECK_ALLOC(err, l);
    ch_status st = ch_layer_add_param(l, "weight", 2, (int64_t[]){ out_features, in.c }, CH_ROLE_WEIGHT, in.c, err);
    if (st == CH_STATUS_OK && bias)
        st = ch_layer_add_param(l, "bias", 1, (int64_t[]){ out_features }, CH_ROLE_BIAS, in.c, err);
    return ch_layer_finish(l, st, out);
}
