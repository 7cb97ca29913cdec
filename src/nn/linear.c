/* Linear: y = x W^T + b with W (out, in), b (out); x must be flat (in, 1, 1), as after Flatten. */
#include "nn/layer.h"

#include <stdlib.h>

/* Whether the layer's GEMMs run in bf16: --precision bf16, and the kernels take its passes in
 * bf16 at the planned batch (large enough to pay). Decided at plan time. */
typedef struct linear_impl {
    bool bf16;
} linear_impl;

/* One of the layer's three GEMMs (each argument as ch_kernels's gemm), in bf16 where planned. */
static void product(const ch_layer *l, const ch_run *r, bool ta, bool tb, int m, int n, int k,
                    const ch_real *a, int lda, const ch_real *b, int ldb, bool accumulate,
                    ch_real *c, int ldc)
{
    const linear_impl *li = l->impl;
    if (li->bf16)
        r->k->gemm_bf16(&r->kc, ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    else
        r->k->gemm(&r->kc, ta, tb, m, n, k, 1, a, lda, b, ldb, accumulate ? 1 : 0, c, ldc);
}

static ch_status linear_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    linear_impl *li = l->impl;
    const int in = l->in.c, out = l->out.c, n = pl->max_batch;
    const ch_kctx kc = ch_plan_kctx(pl);
    pl->linears++;
    li->bf16 = false;
    if (pl->bf16 && pl->k->gemm_bf16_workspace && pl->k->gemm_bf16) {
        /* the forward's, backward weights' and backward data's shapes, as the passes below call */
        const size_t need[3] = { pl->k->gemm_bf16_workspace(&kc, false, true, n, out, in, out, true),
                                 pl->k->gemm_bf16_workspace(&kc, true, false, out, in, n, in, false),
                                 pl->k->gemm_bf16_workspace(&kc, false, false, n, in, out, in, false) };
        li->bf16 = need[0] && need[1] && need[2];
        for (int i = 0; li->bf16 && i < 3; i++)
            if (need[i] > pl->ws_need) pl->ws_need = need[i];
    }
    pl->bf16_linears += li->bf16;
    return ch_layer_alloc_output(l, pl, err);
}

static void linear_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    const int in = l->in.c, out = l->out.c;
    /* y = b in every row (or 0), then the product is added */
    if (l->nparams > 1) r->k->copy_rows(&r->kc, n, (size_t)out, l->p[1], 0, l->y, (size_t)out);
    else ch_backend_zero(r->be, l->y, sizeof(ch_real) * (size_t)n * out);
    /* y (n, out) += x (n, in) * W^T (in, out) */
    product(l, r, false, true, n, out, in, x, in, l->p[0], in, true, l->y, out);
}

static void linear_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x,
                            const ch_real *dy, ch_real *dx)
{
    const int in = l->in.c, out = l->out.c;
    /* dW (out, in) = dy^T (out, n) * x (n, in) */
    product(l, r, true, false, out, in, n, dy, out, x, in, false, l->g[0], in);
    /* db[o] = sum_i dy[i][o], samples in order */
    if (l->nparams > 1) r->k->col_sum(&r->kc, n, (size_t)out, dy, l->g[1]);
    ch_run_grads_ready(r, l);
    /* dx (n, in) = dy (n, out) * W (out, in) */
    if (dx) product(l, r, false, false, n, in, out, dy, out, l->p[0], in, false, dx, in);
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
    ch_layer *l = NULL;
    if (!ch_layer_alloc_impl(&linear_ops, name, in, (ch_shape3){ out_features, 1, 1 },
                             sizeof(linear_impl), &l, err))
        return CH_STATUS_SYSTEM;
    ch_status st = ch_layer_add_param(l, "weight", 2, (int64_t[]){ out_features, in.c }, CH_ROLE_WEIGHT, in.c, err);
    if (st == CH_STATUS_OK && bias)
        st = ch_layer_add_param(l, "bias", 1, (int64_t[]){ out_features }, CH_ROLE_BIAS, in.c, err);
    return ch_layer_finish(l, st, out);
}
