/* The reference backend: the definitions written as plain loops, single-threaded, with double
 * accumulators. Tests check the fast backends against it; it is never used for training.
 * Pooling, normalisation, elementwise and loss kernels of the CPU backend are still the direct
 * formulation, so the table shares them until a faster CPU version replaces one (max pooling's
 * 2x2 fast path already has: the table takes the direct version). */
#include "kernels/cpu/cpu.h"

#include <string.h>

static void ref_gemm(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, ch_real alpha,
                     const ch_real *a, int lda, const ch_real *b, int ldb, ch_real beta,
                     ch_real *c, int ldc)
{
    (void)kc;
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++)
                s += (double)(ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]) *
                     (tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j]);
            ch_real *cij = &c[(size_t)i * ldc + j];
            *cij = (ch_real)(alpha * s + (beta == 0 ? 0 : (double)beta * *cij));
        }
    }
}

static size_t ref_conv_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    (void)kc;
    (void)d;
    (void)n;
    return 0;
}

#define X_AT(x, d, s, ci, ih, iw) (x)[(((size_t)(s) * (d)->c + (ci)) * (d)->h + (ih)) * (d)->w + (iw)]
#define Y_AT(y, d, s, o, i, j) (y)[(((size_t)(s) * (d)->oc + (o)) * (d)->oh + (i)) * (d)->ow + (j)]
/* w is (oc, c / groups, kh, kw): ci is the channel within the output channel's group. */
#define W_AT(w, d, o, ci, p, q) \
    (w)[(((size_t)(o) * ((d)->c / ch_conv_groups(d)) + (ci)) * (d)->kh + (p)) * (d)->kw + (q)]

/* Input position of tap (p, q) of output (i, j); false when it falls in the padding. */
static bool tap(const ch_conv_desc *d, int i, int j, int p, int q, int *ih, int *iw)
{
    *ih = i * d->stride - d->pad + p * ch_conv_dilation(d);
    *iw = j * d->stride - d->pad + q * ch_conv_dilation(d);
    return *ih >= 0 && *ih < d->h && *iw >= 0 && *iw < d->w;
}

/* The input channels output channel o sees: [*c0, *c0 + *cg). */
static void group_channels(const ch_conv_desc *d, int o, int *c0, int *cg)
{
    const int G = ch_conv_groups(d);
    *cg = d->c / G;
    *c0 = o / (d->oc / G) * *cg;
}

static void ref_conv_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                             const ch_real *w, const ch_real *b, ch_real *y)
{
    (void)kc;
    for (int s = 0; s < n; s++)
        for (int o = 0; o < d->oc; o++)
            for (int i = 0; i < d->oh; i++)
                for (int j = 0; j < d->ow; j++) {
                    double acc = b ? b[o] : 0;
                    int c0, cg;
                    group_channels(d, o, &c0, &cg);
                    for (int ci = 0; ci < cg; ci++)
                        for (int p = 0; p < d->kh; p++)
                            for (int q = 0; q < d->kw; q++) {
                                int ih, iw;
                                if (tap(d, i, j, p, q, &ih, &iw))
                                    acc += (double)W_AT(w, d, o, ci, p, q) * X_AT(x, d, s, c0 + ci, ih, iw);
                            }
                    Y_AT(y, d, s, o, i, j) = d->relu && acc < 0 ? 0 : (ch_real)acc;
                }
}

static void ref_conv_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                   const ch_real *dy, const ch_real *w, ch_real *dx)
{
    (void)kc;
    memset(dx, 0, sizeof(ch_real) * (size_t)n * d->c * d->h * d->w);
    for (int s = 0; s < n; s++)
        for (int o = 0; o < d->oc; o++)
            for (int i = 0; i < d->oh; i++)
                for (int j = 0; j < d->ow; j++) {
                    int c0, cg;
                    group_channels(d, o, &c0, &cg);
                    for (int ci = 0; ci < cg; ci++)
                        for (int p = 0; p < d->kh; p++)
                            for (int q = 0; q < d->kw; q++) {
                                int ih, iw;
                                if (tap(d, i, j, p, q, &ih, &iw))
                                    X_AT(dx, d, s, c0 + ci, ih, iw) +=
                                        W_AT(w, d, o, ci, p, q) * Y_AT(dy, d, s, o, i, j);
                            }
                }
}

static void ref_conv_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                      const ch_real *x, const ch_real *y, ch_real *dy,
                                      ch_real *dw, ch_real *db)
{
    (void)kc;
    if (d->relu)
        for (size_t i = 0; i < (size_t)n * d->oc * d->oh * d->ow; i++)
            if (!(y[i] > 0)) dy[i] = 0;
    for (int o = 0; o < d->oc; o++) {
        int c0, cg;
        group_channels(d, o, &c0, &cg);
        for (int ci = 0; ci < cg; ci++)
            for (int p = 0; p < d->kh; p++)
                for (int q = 0; q < d->kw; q++) {
                    double acc = 0;
                    for (int s = 0; s < n; s++)
                        for (int i = 0; i < d->oh; i++)
                            for (int j = 0; j < d->ow; j++) {
                                int ih, iw;
                                if (tap(d, i, j, p, q, &ih, &iw))
                                    acc += (double)Y_AT(dy, d, s, o, i, j) * X_AT(x, d, s, c0 + ci, ih, iw);
                            }
                    W_AT(dw, d, o, ci, p, q) = (ch_real)acc;
                }
        if (db) {
            double acc = 0;
            for (int s = 0; s < n; s++)
                for (int i = 0; i < d->oh; i++)
                    for (int j = 0; j < d->ow; j++) acc += Y_AT(dy, d, s, o, i, j);
            db[o] = (ch_real)acc;
        }
    }
}

/* BatchNorm's two reductions as plain loops in sample order (the CPU table sums in lanes). */
static void ref_batchnorm_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                double *mean, double *var)
{
    (void)kc;
    const double cnt = (double)n * hw;
    for (int ch = 0; ch < c; ch++) {
        double s = 0, ss = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hw; j++) s += x[((size_t)i * c + ch) * hw + j];
        const double m = cnt > 0 ? s / cnt : 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hw; j++) {
                const double v = x[((size_t)i * c + ch) * hw + j] - m;
                ss += v * v;
            }
        mean[ch] = m;
        var[ch] = cnt > 0 ? ss / cnt : 0;
    }
}

static void ref_batchnorm_backward_reduce(const ch_kctx *kc, int n, int c, int hw,
                                          const ch_real *x, const ch_real *dy,
                                          const ch_real *mean, const ch_real *invstd,
                                          double *sum_dy, double *sum_dy_xhat)
{
    (void)kc;
    for (int ch = 0; ch < c; ch++) {
        double s = 0, sx = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < hw; j++) {
                const size_t k = ((size_t)i * c + ch) * hw + j;
                s += dy[k];
                sx += (double)dy[k] * ((double)x[k] - mean[ch]);
            }
        sum_dy[ch] = s;
        sum_dy_xhat[ch] = sx * invstd[ch];
    }
}

static const ch_kernels ref_table = {
    .name = "ref",
    .gemm = ref_gemm,
    .conv2d_workspace = ref_conv_workspace,
    .conv2d_forward = ref_conv_forward,
    .conv2d_backward_data = ref_conv_backward_data,
    .conv2d_backward_weights = ref_conv_backward_weights,
    .maxpool2d_forward = ch_cpu_maxpool2d_forward_direct,
    .maxpool2d_backward = ch_cpu_maxpool2d_backward_direct,
    .avgpool2d_forward = ch_cpu_avgpool2d_forward_direct,
    .avgpool2d_backward = ch_cpu_avgpool2d_backward_direct,
    .upsample_forward = ch_cpu_upsample_forward,
    .upsample_backward = ch_cpu_upsample_backward,
    .bilinear_forward = ch_cpu_bilinear_forward,
    .bilinear_backward = ch_cpu_bilinear_backward,
    .batchnorm_stats = ref_batchnorm_stats,
    .batchnorm_finalize = ch_cpu_batchnorm_finalize,
    .channel_affine = ch_cpu_channel_affine,
    .batchnorm_backward_reduce = ref_batchnorm_backward_reduce,
    .batchnorm_backward_data = ch_cpu_batchnorm_backward_data,
    .layernorm_forward = ch_cpu_layernorm_forward,
    .layernorm_backward = ch_cpu_layernorm_backward,
    .relu_forward = ch_cpu_relu_forward,
    .relu_backward = ch_cpu_relu_backward,
    .add = ch_cpu_add,
    .act_forward = ch_cpu_act_forward,
    .act_backward = ch_cpu_act_backward,
    .bcast_forward = ch_cpu_bcast_forward,
    .bcast_backward = ch_cpu_bcast_backward,
    .copy_rows = ch_cpu_copy_rows,
    .permute = ch_cpu_permute,
    .dropout_mask = ch_cpu_dropout_mask,
    .to_real = ch_cpu_to_real,
    .channel_affine_keep_bf16 = ch_cpu_channel_affine_keep_bf16,
    .channel_affine_of_bf16 = ch_cpu_channel_affine_of_bf16,
    .batchnorm_backward_reduce_bf16 = ch_cpu_batchnorm_backward_reduce_bf16,
    .batchnorm_backward_data_bf16 = ch_cpu_batchnorm_backward_data_bf16,
    .col_sum = ch_cpu_col_sum,
    .optim_update = ch_cpu_optim_update,
    .softmax_xent = ch_cpu_softmax_xent,
    .mse = ch_cpu_mse,
};

const ch_kernels *ch_kernels_ref(void) { return &ref_table; }
