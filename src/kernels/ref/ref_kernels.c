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

/* The indices i in [*lo, *hi) of 0..n-1 whose position i*step - off lies in [0, size). Both the
 * taps of one output that fall inside the input (step: the dilation, off: minus the output's
 * first input position) and the outputs one tap reaches (step: the stride, off: the pad less the
 * tap's offset). The sums below run over exactly the taps inside the input, in (ci, p, q) or
 * (s, i, j) order, as a test of every tap against the padding would: found once per row instead
 * of tested per element, which made these loops the bulk of the kernel tests' time under the
 * sanitizers. */
static void span(int off, int step, int size, int n, int *lo, int *hi)
{
    int l = off > 0 ? (off + step - 1) / step : 0;   /* i*step >= off */
    int h = size - 1 + off >= 0 ? (size - 1 + off) / step + 1 : 0;   /* i*step <= size - 1 + off */
    if (h > n) h = n;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* The taps (p, q) of output (i, j) inside the input: p in [p0, p1), q in [q0, q1); (ih, iw) is
 * tap (0, 0)'s position, perhaps in the padding. */
typedef struct taps {
    int p0, p1, q0, q1, ih, iw;
} taps;

static taps taps_of(const ch_conv_desc *d, int i, int j)
{
    taps t;
    const int dl = ch_conv_dilation(d);
    t.ih = i * d->stride - d->pad;
    t.iw = j * d->stride - d->pad;
    span(-t.ih, dl, d->h, d->kh, &t.p0, &t.p1);
    span(-t.iw, dl, d->w, d->kw, &t.q0, &t.q1);
    return t;
}

/* The input channels output channel o sees: [*c0, *c0 + *cg). */
static void group_channels(const ch_conv_desc *d, int o, int *c0, int *cg)
{
    const int G = ch_conv_groups(d);
    *cg = d->c / G;
    *c0 = o / (d->oc / G) * *cg;
}

/* Channel ci of sample s's plane in x (c channels of h x w), and output channel o's filter for
 * its input channel ci: where the loops below index from. */
static const ch_real *x_plane(const ch_conv_desc *d, const ch_real *x, int s, int ci)
{
    return &X_AT(x, d, s, ci, 0, 0);
}

static const ch_real *w_filter(const ch_conv_desc *d, const ch_real *w, int o, int ci)
{
    return &W_AT(w, d, o, ci, 0, 0);
}

static void ref_conv_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                             const ch_real *w, const ch_real *b, ch_real *y)
{
    (void)kc;
    const int dl = ch_conv_dilation(d);
    for (int s = 0; s < n; s++)
        for (int o = 0; o < d->oc; o++) {
            int c0, cg;
            group_channels(d, o, &c0, &cg);
            for (int i = 0; i < d->oh; i++)
                for (int j = 0; j < d->ow; j++) {
                    const taps t = taps_of(d, i, j);
                    double acc = b ? b[o] : 0;
                    for (int ci = 0; ci < cg && t.q0 < t.q1; ci++) {
                        const ch_real *xc = x_plane(d, x, s, c0 + ci), *wc = w_filter(d, w, o, ci);
                        for (int p = t.p0; p < t.p1; p++) {
                            /* Input row ih + p dl from its first tap inside, q0. */
                            const ch_real *xr = xc + (size_t)(t.ih + p * dl) * d->w + (t.iw + t.q0 * dl);
                            const ch_real *wr = wc + (size_t)p * d->kw;
                            for (int q = t.q0; q < t.q1; q++)
                                acc += (double)wr[q] * xr[(q - t.q0) * dl];
                        }
                    }
                    Y_AT(y, d, s, o, i, j) = d->relu && acc < 0 ? 0 : (ch_real)acc;
                }
        }
}

static void ref_conv_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                   const ch_real *dy, const ch_real *w, ch_real *dx)
{
    (void)kc;
    const int dl = ch_conv_dilation(d);
    memset(dx, 0, sizeof(ch_real) * (size_t)n * d->c * d->h * d->w);
    for (int s = 0; s < n; s++)
        for (int o = 0; o < d->oc; o++) {
            int c0, cg;
            group_channels(d, o, &c0, &cg);
            for (int i = 0; i < d->oh; i++)
                for (int j = 0; j < d->ow; j++) {
                    const taps t = taps_of(d, i, j);
                    const ch_real g = Y_AT(dy, d, s, o, i, j);
                    for (int ci = 0; ci < cg && t.q0 < t.q1; ci++) {
                        ch_real *xc = &X_AT(dx, d, s, c0 + ci, 0, 0);
                        const ch_real *wc = w_filter(d, w, o, ci);
                        for (int p = t.p0; p < t.p1; p++) {
                            ch_real *xr = xc + (size_t)(t.ih + p * dl) * d->w + (t.iw + t.q0 * dl);
                            const ch_real *wr = wc + (size_t)p * d->kw;
                            for (int q = t.q0; q < t.q1; q++) xr[(q - t.q0) * dl] += wr[q] * g;
                        }
                    }
                }
        }
}

static void ref_conv_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                      const ch_real *x, const ch_real *y, ch_real *dy,
                                      ch_real *dw, ch_real *db)
{
    (void)kc;
    const int dl = ch_conv_dilation(d), st = d->stride;
    if (d->relu)
        for (size_t i = 0; i < (size_t)n * d->oc * d->oh * d->ow; i++)
            if (!(y[i] > 0)) dy[i] = 0;
    for (int o = 0; o < d->oc; o++) {
        int c0, cg;
        group_channels(d, o, &c0, &cg);
        for (int ci = 0; ci < cg; ci++)
            for (int p = 0; p < d->kh; p++)
                for (int q = 0; q < d->kw; q++) {
                    /* The outputs (i, j) whose tap (p, q) lies inside the input. */
                    int i0, i1, j0, j1;
                    span(d->pad - p * dl, st, d->h, d->oh, &i0, &i1);
                    span(d->pad - q * dl, st, d->w, d->ow, &j0, &j1);
                    double acc = 0;
                    for (int s = 0; s < n && j0 < j1; s++) {
                        const ch_real *xc = x_plane(d, x, s, c0 + ci), *gy = &Y_AT(dy, d, s, o, 0, 0);
                        for (int i = i0; i < i1; i++) {
                            /* Input row i st - pad + p dl from output j0's tap. */
                            const ch_real *xr = xc + (size_t)(i * st - d->pad + p * dl) * d->w +
                                                (j0 * st - d->pad + q * dl);
                            const ch_real *gr = gy + (size_t)i * d->ow;
                            for (int j = j0; j < j1; j++)
                                acc += (double)gr[j] * xr[(j - j0) * st];
                        }
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
