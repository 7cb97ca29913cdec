/* The lazy backend's normalisation kernels (BatchNorm, LayerNorm, their per-channel passes, and
 * the bf16 copies of --precision bf16's kept BatchNorm inputs), queued as lazy_kernels.c queues the
 * others: each runs later as the scramble backend's kernel, with its arguments copied now; the
 * double results are host memory written when the kernel runs. lazy_kernels.c's table holds them. */
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/lazy/lazy.h"

static const ch_kernels *sc(void) { return ch_kernels_scramble(); }

typedef struct batchnorm_stats_args {
    int n;
    int c;
    int hw;
    const void *x;   /* ch_real, or uint16_t for the bf16 sibling */
    double *mean;
    double *var;
} batchnorm_stats_args;

static void run_batchnorm_stats(const ch_kctx *kc, const void *args)
{
    const batchnorm_stats_args *g = args;
    sc()->batchnorm_stats(kc, g->n, g->c, g->hw, g->x, g->mean, g->var);
}

void ch_lazy_batchnorm_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, double *mean, double *var)
{
    const batchnorm_stats_args queued = { n, c, hw, x, mean, var };
    ch_lazy_queue_call(kc, run_batchnorm_stats, &queued, sizeof queued);
}

static void run_batchnorm_stats_bf16(const ch_kctx *kc, const void *args)
{
    const batchnorm_stats_args *g = args;
    sc()->batchnorm_stats_bf16(kc, g->n, g->c, g->hw, g->x, g->mean, g->var);
}

void ch_lazy_batchnorm_stats_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x, double *mean,
                                  double *var)
{
    const batchnorm_stats_args queued = { n, c, hw, x, mean, var };
    ch_lazy_queue_call(kc, run_batchnorm_stats_bf16, &queued, sizeof queued);
}

typedef struct batchnorm_finalize_args {
    int c;
    const double *mean;
    const double *var;
    double count, eps, momentum;
    const ch_real *gamma;
    const ch_real *beta;
    ch_real *running_mean;
    ch_real *running_var;
    ch_real *save;
} batchnorm_finalize_args;

static void run_batchnorm_finalize(const ch_kctx *kc, const void *args)
{
    const batchnorm_finalize_args *g = args;
    sc()->batchnorm_finalize(kc, g->c, g->mean, g->var, g->count, g->eps, g->momentum, g->gamma, g->beta,
                             g->running_mean, g->running_var, g->save);
}

void ch_lazy_batchnorm_finalize(const ch_kctx *kc, int c, const double *mean, const double *var, double count,
                                double eps, double momentum, const ch_real *gamma, const ch_real *beta,
                                ch_real *running_mean, ch_real *running_var, ch_real *save)
{
    const batchnorm_finalize_args queued = { c, mean, var, count, eps, momentum, gamma, beta, running_mean,
                                             running_var, save };
    ch_lazy_queue_call(kc, run_batchnorm_finalize, &queued, sizeof queued);
}

typedef struct to_real_args {
    size_t len;
    const double *x;
    ch_real *y;
} to_real_args;

static void run_to_real(const ch_kctx *kc, const void *args)
{
    const to_real_args *g = args;
    sc()->to_real(kc, g->len, g->x, g->y);
}

void ch_lazy_to_real(const ch_kctx *kc, size_t len, const double *x, ch_real *y)
{
    const to_real_args queued = { len, x, y };
    ch_lazy_queue_call(kc, run_to_real, &queued, sizeof queued);
}

typedef struct channel_affine_keep_bf16_args {
    int n;
    int c;
    int hw;
    const ch_real *x;
    const ch_real *scale;
    const ch_real *shift;
    ch_real *y;
    uint16_t *keep;
} channel_affine_keep_bf16_args;

static void run_channel_affine_keep_bf16(const ch_kctx *kc, const void *args)
{
    const channel_affine_keep_bf16_args *g = args;
    sc()->channel_affine_keep_bf16(kc, g->n, g->c, g->hw, g->x, g->scale, g->shift, g->y, g->keep);
}

void ch_lazy_channel_affine_keep_bf16(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                      const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep)
{
    const channel_affine_keep_bf16_args queued = { n, c, hw, x, scale, shift, y, keep };
    ch_lazy_queue_call(kc, run_channel_affine_keep_bf16, &queued, sizeof queued);
}

typedef struct channel_affine_args {
    int n;
    int c;
    int hw;
    const void *x;   /* ch_real, or uint16_t for the bf16 sibling */
    const ch_real *scale;
    const ch_real *shift;
    ch_real *y;
} channel_affine_args;

static void run_channel_affine(const ch_kctx *kc, const void *args)
{
    const channel_affine_args *g = args;
    sc()->channel_affine(kc, g->n, g->c, g->hw, g->x, g->scale, g->shift, g->y);
}

void ch_lazy_channel_affine(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *scale, const ch_real *shift, ch_real *y)
{
    const channel_affine_args queued = { n, c, hw, x, scale, shift, y };
    ch_lazy_queue_call(kc, run_channel_affine, &queued, sizeof queued);
}

static void run_channel_affine_of_bf16(const ch_kctx *kc, const void *args)
{
    const channel_affine_args *g = args;
    sc()->channel_affine_of_bf16(kc, g->n, g->c, g->hw, g->x, g->scale, g->shift, g->y);
}

void ch_lazy_channel_affine_of_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                    const ch_real *scale, const ch_real *shift, ch_real *y)
{
    const channel_affine_args queued = { n, c, hw, x, scale, shift, y };
    ch_lazy_queue_call(kc, run_channel_affine_of_bf16, &queued, sizeof queued);
}

typedef struct batchnorm_backward_reduce_args {
    int n;
    int c;
    int hw;
    const void *x;   /* ch_real, or uint16_t for the bf16 sibling */
    const ch_real *dy;
    const ch_real *mean;
    const ch_real *invstd;
    double *sum_dy;
    double *sum_dy_xhat;
} batchnorm_backward_reduce_args;

static void run_batchnorm_backward_reduce(const ch_kctx *kc, const void *args)
{
    const batchnorm_backward_reduce_args *g = args;
    sc()->batchnorm_backward_reduce(kc, g->n, g->c, g->hw, g->x, g->dy, g->mean, g->invstd, g->sum_dy, g->sum_dy_xhat);
}

void ch_lazy_batchnorm_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *dy, const ch_real *mean, const ch_real *invstd, double *sum_dy, double *sum_dy_xhat)
{
    const batchnorm_backward_reduce_args queued = { n, c, hw, x, dy, mean, invstd, sum_dy, sum_dy_xhat };
    ch_lazy_queue_call(kc, run_batchnorm_backward_reduce, &queued, sizeof queued);
}

typedef struct batchnorm_backward_data_args {
    int n;
    int c;
    int hw;
    const void *x;   /* ch_real, or uint16_t for the bf16 sibling */
    const ch_real *dy;
    const ch_real *mean;
    const ch_real *invstd;
    const ch_real *gamma;
    const double *sum_dy;
    const double *sum_dy_xhat;
    double count;
    ch_real *dx;
} batchnorm_backward_data_args;

static void run_batchnorm_backward_data(const ch_kctx *kc, const void *args)
{
    const batchnorm_backward_data_args *g = args;
    sc()->batchnorm_backward_data(kc, g->n, g->c, g->hw, g->x, g->dy, g->mean, g->invstd, g->gamma, g->sum_dy, g->sum_dy_xhat, g->count, g->dx);
}

void ch_lazy_batchnorm_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat, double count, ch_real *dx)
{
    const batchnorm_backward_data_args queued = { n, c, hw, x, dy, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, dx };
    ch_lazy_queue_call(kc, run_batchnorm_backward_data, &queued, sizeof queued);
}

typedef struct layernorm_forward_args {
    int outer, len, inner;
    const ch_real *x, *gamma, *beta;
    double eps;
    ch_real *y, *mean, *invstd;
} layernorm_forward_args;

static void run_layernorm_forward(const ch_kctx *kc, const void *args)
{
    const layernorm_forward_args *g = args;
    sc()->layernorm_forward(kc, g->outer, g->len, g->inner, g->x, g->gamma, g->beta, g->eps, g->y, g->mean, g->invstd);
}

void ch_lazy_layernorm_forward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *gamma, const ch_real *beta, double eps, ch_real *y, ch_real *mean, ch_real *invstd)
{
    const layernorm_forward_args queued = { outer, len, inner, x, gamma, beta, eps, y, mean, invstd };
    ch_lazy_queue_call(kc, run_layernorm_forward, &queued, sizeof queued);
}

typedef struct layernorm_backward_args {
    int outer, len, inner;
    const ch_real *x, *dy, *gamma, *mean, *invstd;
    ch_real *dx, *dgamma, *dbeta;
} layernorm_backward_args;

static void run_layernorm_backward(const ch_kctx *kc, const void *args)
{
    const layernorm_backward_args *g = args;
    sc()->layernorm_backward(kc, g->outer, g->len, g->inner, g->x, g->dy, g->gamma, g->mean, g->invstd, g->dx, g->dgamma, g->dbeta);
}

void ch_lazy_layernorm_backward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *dy, const ch_real *gamma, const ch_real *mean, const ch_real *invstd, ch_real *dx, ch_real *dgamma, ch_real *dbeta)
{
    const layernorm_backward_args queued = { outer, len, inner, x, dy, gamma, mean, invstd, dx, dgamma, dbeta };
    ch_lazy_queue_call(kc, run_layernorm_backward, &queued, sizeof queued);
}

static void run_bn_backward_reduce_bf16(const ch_kctx *kc, const void *args)
{
    const batchnorm_backward_reduce_args *g = args;
    sc()->batchnorm_backward_reduce_bf16(kc, g->n, g->c, g->hw, g->x, g->dy, g->mean, g->invstd, g->sum_dy,
                                         g->sum_dy_xhat);
}

void ch_lazy_batchnorm_backward_reduce_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                            const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                            double *sum_dy, double *sum_dy_xhat)
{
    const batchnorm_backward_reduce_args queued = { n, c, hw, x, dy, mean, invstd, sum_dy, sum_dy_xhat };
    ch_lazy_queue_call(kc, run_bn_backward_reduce_bf16, &queued, sizeof queued);
}

static void run_bn_backward_data_bf16(const ch_kctx *kc, const void *args)
{
    const batchnorm_backward_data_args *g = args;
    sc()->batchnorm_backward_data_bf16(kc, g->n, g->c, g->hw, g->x, g->dy, g->mean, g->invstd, g->gamma, g->sum_dy,
                                       g->sum_dy_xhat, g->count, g->dx);
}

void ch_lazy_batchnorm_backward_data_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                          const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                          const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat,
                                          double count, ch_real *dx)
{
    const batchnorm_backward_data_args queued = { n, c, hw, x, dy, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, dx };
    ch_lazy_queue_call(kc, run_bn_backward_data_bf16, &queued, sizeof queued);
}
