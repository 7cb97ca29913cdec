/* BatchNorm2d (PyTorch semantics): training normalises with the batch's biased variance and moves
 * running_mean / running_var (unbiased) by momentum 0.1; evaluation uses the running statistics.
 * Tensors: weight, bias (params); running_mean, running_var (buffers); num_batches_tracked (int64). */
#include "nn/layer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

enum { BN_WEIGHT = 0, BN_BIAS = 1, BN_RMEAN = 0, BN_RVAR = 1 };
static const ch_layer_ops bn_ops;

typedef struct bn_impl {
    double eps, momentum;
    ch_real *mean, *invstd, *scale, *shift;   /* (c) each, saved for backward (replica memory) */
    /* Host copies: gamma, beta, running mean and var as downloaded; mean, invstd, scale, shift as
     * computed (adjacent, uploaded at once); the two parameter gradients. (c) each. */
    ch_real *h_gamma, *h_beta, *h_rm, *h_rv, *h_mean, *h_invstd, *h_scale, *h_shift, *h_dw, *h_db;
    double *batch_mean, *batch_var;           /* (c) each, forward statistics */
    double *sum_dy, *sum_dy_xhat;             /* (c) each, backward reductions */
} bn_impl;

static ch_status bn_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    bn_impl *b = l->impl;
    const size_t c = (size_t)l->in.c;
    b->mean = ch_layer_alloc_saved(l, pl, c * 4, sizeof(ch_real), err);
    if (!b->mean) return CH_STATUS_SYSTEM;
    b->h_gamma = malloc(sizeof(ch_real) * c * 10);
    b->batch_mean = malloc(sizeof(double) * c * 4);
    if (!b->h_gamma || !b->batch_mean) return CH_SYS_FAIL(err, "malloc of batchnorm statistics");
    ch_real **h[] = { &b->h_beta, &b->h_rm, &b->h_rv, &b->h_mean, &b->h_invstd, &b->h_scale,
                      &b->h_shift, &b->h_dw, &b->h_db };
    for (size_t i = 0; i < sizeof h / sizeof *h; i++) *h[i] = b->h_gamma + c * (i + 1);
    b->invstd = b->mean + c;
    b->scale = b->invstd + c;
    b->shift = b->scale + c;
    b->batch_var = b->batch_mean + c;
    b->sum_dy = b->batch_var + c;
    b->sum_dy_xhat = b->sum_dy + c;
    return ch_layer_alloc_output(l, pl, err);
}

static void bn_free(ch_layer *l)
{
    bn_impl *b = l->impl;
    if (!b) return;
    ch_layer_release(l, b->mean);
    free(b->h_gamma);
    free(b->batch_mean);
}

/* Sum a (2c) exchange over the sync-BN group. A failed collective is reported to the run and leaves
 * zeros, so the step stays finite until the trainer sees the failure. */
static void bn_allreduce(const ch_run *r, double *buf, int c)
{
    ch_err e;
    ch_status st = ch_comm_allreduce_sum_f64(r->sync_bn, buf, (size_t)c * 2, &e);
    if (st != CH_STATUS_OK) {
        ch_run_comm_failed(r, st, &e);
        memset(buf, 0, sizeof(double) * (size_t)c * 2);
    }
}

/* sync-BN: this slice's (count, mean, variance) become the global batch's, from the group's sums of
 * count * mean and count * E[x^2] (in double; the slices' variances are two-pass), exchanged in place
 * in batch_mean and batch_var (adjacent, 2c). */
static void bn_sync_stats(const ch_run *r, bn_impl *b, int c, double cnt, double total)
{
    for (int i = 0; i < c; i++) {
        const double m = b->batch_mean[i];
        b->batch_var[i] = cnt * (b->batch_var[i] + m * m);
        b->batch_mean[i] = cnt * m;
    }
    bn_allreduce(r, b->batch_mean, c);
    for (int i = 0; i < c; i++) {
        const double m = b->batch_mean[i] / total, ex2 = b->batch_var[i] / total;
        b->batch_mean[i] = m;
        b->batch_var[i] = ex2 - m * m > 0 ? ex2 - m * m : 0;
    }
}

static void download_c(const ch_run *r, ch_real *host, const ch_real *dev, int c)
{
    ch_backend_download(r->be, host, dev, sizeof(ch_real) * (size_t)c);
}

static void upload_c(const ch_run *r, ch_real *dev, const ch_real *host, int c)
{
    ch_backend_upload(r->be, dev, host, sizeof(ch_real) * (size_t)c);
}

/* The per-channel arithmetic runs on the host over a few hundred values: the running statistics
 * and the parameters come down, the new statistics and the saved scale/shift go up. */
static void bn_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    bn_impl *b = l->impl;
    const int c = l->in.c, hw = l->in.h * l->in.w;
    ch_real *gamma = b->h_gamma, *beta = b->h_beta, *rm = b->h_rm, *rv = b->h_rv;
    download_c(r, gamma, l->p[BN_WEIGHT], c);
    download_c(r, beta, l->p[BN_BIAS], c);
    download_c(r, rm, l->b[BN_RMEAN], c);
    download_c(r, rv, l->b[BN_RVAR], c);
    if (r->training) {
        r->k->batchnorm_stats(&r->kc, n, c, hw, x, b->batch_mean, b->batch_var);
        ch_backend_sync(r->be, CH_STREAM_COMPUTE);   /* the host reads the sums next */
        double cnt = (double)n * hw;
        if (r->sync_bn) {
            const double total = (double)r->global_n * hw;
            bn_sync_stats(r, b, c, cnt, total);
            cnt = total;
        }
        for (int i = 0; i < c; i++) {
            const double mean = b->batch_mean[i], var = b->batch_var[i];
            b->h_mean[i] = (ch_real)mean;
            b->h_invstd[i] = (ch_real)(1.0 / sqrt(var + b->eps));
            const double unbiased = cnt > 1 ? var * cnt / (cnt - 1) : var;
            rm[i] = (ch_real)((1 - b->momentum) * rm[i] + b->momentum * mean);
            rv[i] = (ch_real)((1 - b->momentum) * rv[i] + b->momentum * unbiased);
        }
        upload_c(r, l->b[BN_RMEAN], rm, c);
        upload_c(r, l->b[BN_RVAR], rv, c);
        ++*l->num_batches_tracked;
    } else {
        for (int i = 0; i < c; i++) {
            b->h_mean[i] = rm[i];
            b->h_invstd[i] = (ch_real)(1.0 / sqrt((double)rv[i] + b->eps));
        }
    }
    for (int i = 0; i < c; i++) {
        b->h_scale[i] = gamma[i] * b->h_invstd[i];
        b->h_shift[i] = beta[i] - b->h_mean[i] * b->h_scale[i];
    }
    upload_c(r, b->mean, b->h_mean, 4 * c);   /* mean, invstd, scale, shift: adjacent on both sides */
    r->k->channel_affine(&r->kc, n, c, hw, x, b->scale, b->shift, l->y);
}

void ch_batchnorm2d_reapply(const ch_layer *l, const ch_run *r, int n, const ch_real *x, ch_real *y)
{
    const bn_impl *b = l->impl;
    CH_ASSERT(ch_layer_is_batchnorm(l));
    r->k->channel_affine(&r->kc, n, l->in.c, l->in.h * l->in.w, x, b->scale, b->shift, y);
}

/* Backward of the training-mode forward (the batch statistics depend on x). */
static void bn_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                        ch_real *dx)
{
    bn_impl *b = l->impl;
    const int c = l->in.c, hw = l->in.h * l->in.w;
    r->k->batchnorm_backward_reduce(&r->kc, n, c, hw, x, dy, b->mean, b->invstd, b->sum_dy,
                                    b->sum_dy_xhat);
    ch_backend_sync(r->be, CH_STREAM_COMPUTE);   /* the host reads the sums next */
    /* The parameter gradients are this slice's sums: the gradient sync adds the slices up. */
    for (int i = 0; i < c; i++) {
        b->h_dw[i] = (ch_real)b->sum_dy_xhat[i];
        b->h_db[i] = (ch_real)b->sum_dy[i];
    }
    upload_c(r, l->g[BN_WEIGHT], b->h_dw, c);
    upload_c(r, l->g[BN_BIAS], b->h_db, c);
    ch_run_grads_ready(r, l);
    double count = (double)n * hw;
    if (r->sync_bn) {
        /* dx depends on the whole batch's sums; sum_dy and sum_dy_xhat are adjacent (2c). */
        bn_allreduce(r, b->sum_dy, c);
        count = (double)r->global_n * hw;
    }
    if (dx)
        r->k->batchnorm_backward_data(&r->kc, n, c, hw, x, dy, b->mean, b->invstd, l->p[BN_WEIGHT],
                                      b->sum_dy, b->sum_dy_xhat, count, dx);
}

static const ch_layer_ops bn_ops = {
    .kind = "BatchNorm2d", .plan = bn_plan, .forward = bn_forward, .backward = bn_backward,
    .free_impl = bn_free, .y_unread_by_backward = true,
};

/* The same layer over (features) tensors (h = w = 1), named as PyTorch names it. */
static const ch_layer_ops bn1d_ops = {
    .kind = "BatchNorm1d", .plan = bn_plan, .forward = bn_forward, .backward = bn_backward,
    .free_impl = bn_free, .y_unread_by_backward = true,
};

bool ch_layer_is_batchnorm(const ch_layer *l) { return l->ops == &bn_ops || l->ops == &bn1d_ops; }

static ch_status create(const ch_layer_ops *ops, const char *name, ch_shape3 in, double eps, double momentum,
                        ch_layer **out, ch_err *err);

ch_status ch_batchnorm2d_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err)
{
    return ch_batchnorm2d_create_opts(name, in, 1e-5, 0.1, out, err);
}

ch_status ch_batchnorm2d_create_opts(const char *name, ch_shape3 in, double eps, double momentum,
                                     ch_layer **out, ch_err *err)
{
    return create(&bn_ops, name, in, eps, momentum, out, err);
}

ch_status ch_batchnorm1d_create_opts(const char *name, int features, double eps, double momentum, ch_layer **out,
                                     ch_err *err)
{
    return create(&bn1d_ops, name, (ch_shape3){ features, 1, 1 }, eps, momentum, out, err);
}

static ch_status create(const ch_layer_ops *ops, const char *name, ch_shape3 in, double eps, double momentum,
                        ch_layer **out, ch_err *err)
{
    if (!(eps > 0 && eps < 1) || !(momentum >= 0 && momentum <= 1))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "batchnorm %s: eps %g must be in (0, 1) and momentum "
                       "%g in [0, 1]", name, eps, momentum);
    ch_layer *l = ch_layer_alloc(ops, name, in, in);
    CH_CHECK_ALLOC(err, l);
    bn_impl *b = calloc(1, sizeof(bn_impl));
    l->impl = b;
    if (!b) {
        ch_layer_free(l);
        return CH_SYS_FAIL(err, "calloc of batchnorm");
    }
    b->eps = eps;
    b->momentum = momentum;
    const int64_t c[1] = { in.c };
    ch_status st = ch_layer_add_param(l, "weight", 1, c, CH_ROLE_ONES, 0, err);
    if (st == CH_STATUS_OK) st = ch_layer_add_param(l, "bias", 1, c, CH_ROLE_ZEROS, 0, err);
    if (st == CH_STATUS_OK) st = ch_layer_add_buffer(l, "running_mean", 1, c, CH_ROLE_ZEROS, err);
    if (st == CH_STATUS_OK) st = ch_layer_add_buffer(l, "running_var", 1, c, CH_ROLE_ONES, err);
    return ch_layer_finish(l, st, out);
}
