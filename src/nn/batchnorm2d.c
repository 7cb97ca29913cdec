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
    /* (c) each, adjacent, replica memory: what forward applies and backward reads (the
     * batchnorm_finalize kernel's save) */
    ch_real *mean, *invstd, *scale, *shift;
    /* (c) each, the kernels' double results (host memory a queued kernel writes when it runs,
     * from the backend's host_alloc: mapped into a GPU's address space, so its kernels write
     * here): forward statistics, backward reductions. The host reads them only with sync-BN, after a
     * wait, to sum them over the group. */
    double *batch_mean, *batch_var;
    double *sum_dy, *sum_dy_xhat;
    uint16_t *keep;   /* NULL, or where training's forward stores its input in bf16 and backward
                       * reads it (a parent's) */
    bool keep_made;   /* keep is the input itself, written there by its maker (every forward) */
    bool relu_fwd;    /* forward (and reapply) also does the ReLU after it: y is the ReLU's output */
    bool relu_bwd;    /* backward also does that ReLU's backward: dy is the ReLU's dy */
    bool apply_later; /* forward stops before normalising: a parent's sum does it (apply_sum) */
    bool out_bf16;    /* with relu_fwd: y holds bf16 (ch_batchnorm2d_output_bf16) */
    bool dx_bf16;     /* backward writes dx rounded to bf16 over keep (ch_batchnorm2d_grad_bf16) */
} bn_impl;

static ch_status bn_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    bn_impl *b = l->impl;
    const size_t c = (size_t)l->in.c;
    b->mean = ch_layer_alloc_saved(l, pl, c * 4, sizeof(ch_real), err);
    if (!b->mean) return CH_STATUS_SYSTEM;
    b->batch_mean = ch_backend_host_alloc(pl->be, sizeof(double) * c * 4);
    if (!b->batch_mean) return CH_SYS_FAIL(err, "allocation of batchnorm statistics");
    memset(b->batch_mean, 0, sizeof(double) * c * 4);
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
    if (b->batch_mean) ch_backend_host_free(l->be, b->batch_mean);
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

/* The fused BatchNorm + ReLU's normalising pass from x (fp32) or xh, into y as fp32 or as bf16. */
static void bn_relu_apply(const bn_impl *b, const ch_run *r, int n, int c, int hw, const ch_real *x,
                          const uint16_t *xh, ch_real *y, uint16_t *keep)
{
    if (b->out_bf16)
        r->k->bn_relu_forward_to_bf16(&r->kc, n, c, hw, x, xh, b->scale, b->shift, (uint16_t *)y, keep);
    else
        r->k->bn_relu_forward(&r->kc, n, c, hw, x, xh, b->scale, b->shift, y, keep);
}

/* Statistics, then the per-channel step (a kernel too: nothing of a step is computed on the host
 * unless sync-BN must sum the statistics over the group), then the normalisation. */
static void bn_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    bn_impl *b = l->impl;
    const int c = l->in.c, hw = l->in.h * l->in.w;
    const double *mean = NULL, *var = NULL;
    double cnt = 0;
    if (r->training) {
        if (b->keep_made)
            r->k->batchnorm_stats_bf16(&r->kc, n, c, hw, b->keep, b->batch_mean, b->batch_var);
        else
            r->k->batchnorm_stats(&r->kc, n, c, hw, x, b->batch_mean, b->batch_var);
        cnt = (double)n * hw;
        if (r->sync_bn) {
            ch_backend_sync(r->be, CH_STREAM_COMPUTE);   /* the host sums the statistics next */
            const double total = (double)r->global_n * hw;
            bn_sync_stats(r, b, c, cnt, total);
            cnt = total;
        }
        mean = b->batch_mean;
        var = b->batch_var;
        ++*l->num_batches_tracked;
    }
    r->k->batchnorm_finalize(&r->kc, c, mean, var, cnt, b->eps, b->momentum, l->p[BN_WEIGHT], l->p[BN_BIAS],
                             l->b[BN_RMEAN], l->b[BN_RVAR], b->mean);
    if (b->apply_later) return;
    if (b->relu_fwd)
        bn_relu_apply(b, r, n, c, hw, b->keep_made ? NULL : x, b->keep_made ? b->keep : NULL, l->y,
                      r->training && b->keep && !b->keep_made ? b->keep : NULL);
    else if (b->keep_made)
        r->k->channel_affine_of_bf16(&r->kc, n, c, hw, b->keep, b->scale, b->shift, l->y);
    else if (r->training && b->keep)
        r->k->channel_affine_keep_bf16(&r->kc, n, c, hw, x, b->scale, b->shift, l->y, b->keep);
    else
        r->k->channel_affine(&r->kc, n, c, hw, x, b->scale, b->shift, l->y);
}

void ch_batchnorm2d_keep_input(ch_layer *l, uint16_t *keep, bool made_there)
{
    CH_ASSERT(ch_layer_is_batchnorm(l));
    ((bn_impl *)l->impl)->keep = keep;
    ((bn_impl *)l->impl)->keep_made = made_there;
}

void ch_batchnorm2d_grad_bf16(ch_layer *l)
{
    CH_ASSERT(ch_layer_is_batchnorm(l));
    bn_impl *b = l->impl;
    CH_ASSERT(b->keep);
    b->dx_bf16 = true;
}

void ch_batchnorm2d_fuse_relu(ch_layer *l, bool forward, bool backward)
{
    CH_ASSERT(ch_layer_is_batchnorm(l) && (forward || !backward));
    ((bn_impl *)l->impl)->relu_fwd = forward;
    ((bn_impl *)l->impl)->relu_bwd = backward;
}

void ch_batchnorm2d_output_bf16(ch_layer *l)
{
    CH_ASSERT(ch_layer_is_batchnorm(l));
    bn_impl *b = l->impl;
    CH_ASSERT(b->relu_fwd && b->relu_bwd && !b->apply_later);
    b->out_bf16 = true;
}

void ch_batchnorm2d_apply_later(ch_layer *l)
{
    CH_ASSERT(ch_layer_is_batchnorm(l));
    ((bn_impl *)l->impl)->apply_later = true;
}

void ch_batchnorm2d_apply_sum(const ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *res,
                              bool relu)
{
    const bn_impl *b = l->impl;
    CH_ASSERT(ch_layer_is_batchnorm(l) && b->apply_later);
    const int c = l->in.c, hw = l->in.h * l->in.w;
    r->k->bn_add_forward(&r->kc, n, c, hw, b->keep_made ? NULL : x, b->keep_made ? b->keep : NULL, b->scale,
                         b->shift, res, relu, l->y, r->training && b->keep && !b->keep_made ? b->keep : NULL);
}

void ch_batchnorm2d_reapply_bf16(const ch_layer *l, const ch_run *r, int n, const uint16_t *x, ch_real *y)
{
    const bn_impl *b = l->impl;
    CH_ASSERT(ch_layer_is_batchnorm(l));
    const int c = l->in.c, hw = l->in.h * l->in.w;
    if (b->relu_fwd) bn_relu_apply(b, r, n, c, hw, NULL, x, y, NULL);
    else r->k->channel_affine_of_bf16(&r->kc, n, c, hw, x, b->scale, b->shift, y);
}

void ch_batchnorm2d_reapply(const ch_layer *l, const ch_run *r, int n, const ch_real *x, ch_real *y)
{
    const bn_impl *b = l->impl;
    CH_ASSERT(ch_layer_is_batchnorm(l));
    const int c = l->in.c, hw = l->in.h * l->in.w;
    if (b->relu_fwd) bn_relu_apply(b, r, n, c, hw, x, NULL, y, NULL);
    else r->k->channel_affine(&r->kc, n, c, hw, x, b->scale, b->shift, y);
}

/* The backward reduction, of dy masked by the fused ReLU where there is one. */
static void bn_backward_sums(const bn_impl *b, const ch_run *r, int n, int c, int hw, const ch_real *x,
                             const ch_real *dy)
{
    if (b->relu_bwd)
        r->k->bn_relu_backward_reduce(&r->kc, n, c, hw, b->keep ? NULL : x, b->keep, dy, b->mean, b->invstd, b->scale,
                                      b->shift, b->sum_dy, b->sum_dy_xhat);
    else if (b->keep)
        r->k->batchnorm_backward_reduce_bf16(&r->kc, n, c, hw, b->keep, dy, b->mean, b->invstd, b->sum_dy,
                                             b->sum_dy_xhat);
    else
        r->k->batchnorm_backward_reduce(&r->kc, n, c, hw, x, dy, b->mean, b->invstd, b->sum_dy, b->sum_dy_xhat);
}

/* dx from the (summed) reductions, likewise. */
static void bn_backward_dx(const bn_impl *b, const ch_layer *l, const ch_run *r, int n, const ch_real *x,
                           const ch_real *dy, double count, ch_real *dx)
{
    const int c = l->in.c, hw = l->in.h * l->in.w;
    const ch_real *gamma = l->p[BN_WEIGHT];
    if (b->dx_bf16)   /* over keep, which nothing reads after this */
        r->k->bn_backward_data_to_bf16(&r->kc, n, c, hw, b->keep, dy, b->mean, b->invstd, gamma,
                                       b->relu_bwd ? b->scale : NULL, b->relu_bwd ? b->shift : NULL, b->sum_dy,
                                       b->sum_dy_xhat, count, b->keep);
    else if (b->relu_bwd)
        r->k->bn_relu_backward_data(&r->kc, n, c, hw, b->keep ? NULL : x, b->keep, dy, b->mean, b->invstd, gamma,
                                    b->scale, b->shift, b->sum_dy, b->sum_dy_xhat, count, dx);
    else if (b->keep)
        r->k->batchnorm_backward_data_bf16(&r->kc, n, c, hw, b->keep, dy, b->mean, b->invstd, gamma, b->sum_dy,
                                           b->sum_dy_xhat, count, dx);
    else
        r->k->batchnorm_backward_data(&r->kc, n, c, hw, x, dy, b->mean, b->invstd, gamma, b->sum_dy, b->sum_dy_xhat,
                                      count, dx);
}

/* Backward of the training-mode forward (the batch statistics depend on x); x is the kept bf16
 * copy when there is one (the x passed is then not read: its parent has freed it). */
static void bn_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                        ch_real *dx)
{
    bn_impl *b = l->impl;
    const int c = l->in.c, hw = l->in.h * l->in.w;
    bn_backward_sums(b, r, n, c, hw, x, dy);
    /* The parameter gradients are this slice's sums: the gradient sync adds the slices up. */
    r->k->to_real(&r->kc, (size_t)c, b->sum_dy_xhat, l->g[BN_WEIGHT]);
    r->k->to_real(&r->kc, (size_t)c, b->sum_dy, l->g[BN_BIAS]);
    ch_run_grads_ready(r, l);
    double count = (double)n * hw;
    if (r->sync_bn) {
        ch_backend_sync(r->be, CH_STREAM_COMPUTE);   /* the host sums the reductions next */
        /* dx depends on the whole batch's sums; sum_dy and sum_dy_xhat are adjacent (2c). */
        bn_allreduce(r, b->sum_dy, c);
        count = (double)r->global_n * hw;
    }
    if (dx || b->dx_bf16) bn_backward_dx(b, l, r, n, x, dy, count, dx);
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
