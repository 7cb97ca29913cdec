/* Batch-normalisation pieces, parallel over channels. Per-channel sums are accumulated in double:
 * a float sum over 256*28*28 elements would lose digits that the variance needs. */
#include "kernels/cpu/cpu.h"

void ch_cpu_batchnorm_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                            double *mean, double *var)
{
    const double cnt = (double)n * hw;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (int ch = 0; ch < c; ch++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += ch_cpu_sum(x + ((size_t)i * c + ch) * hw, (size_t)hw);
        const double m = cnt > 0 ? s / cnt : 0;
        double ss = 0;
        for (int i = 0; i < n; i++)
            ss += ch_cpu_sum_sq_dev(x + ((size_t)i * c + ch) * hw, (size_t)hw, m);
        mean[ch] = m;
        var[ch] = cnt > 0 ? ss / cnt : 0;
    }
}

void ch_cpu_channel_affine(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                           const ch_real *scale, const ch_real *shift, ch_real *y)
{
    const long planes = (long)n * c;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        const int ch = (int)(pl % c);
        const ch_real a = scale[ch], b = shift[ch];
        const ch_real *xp = x + pl * hw;
        ch_real *yp = y + pl * hw;
        for (int j = 0; j < hw; j++) yp[j] = xp[j] * a + b;
    }
}

void ch_cpu_batchnorm_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                      const ch_real *dy, const ch_real *mean,
                                      const ch_real *invstd, double *sum_dy,
                                      double *sum_dy_xhat)
{
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (int ch = 0; ch < c; ch++) {
        double s = 0, sx = 0;
        const ch_real m = mean[ch];
        for (int i = 0; i < n; i++) {
            const size_t off = ((size_t)i * c + ch) * hw;
            ch_cpu_sum_dy_dyx(dy + off, x + off, (size_t)hw, m, &s, &sx);
        }
        sum_dy[ch] = s;
        sum_dy_xhat[ch] = sx * invstd[ch];
    }
}

void ch_cpu_batchnorm_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                    const ch_real *dy, const ch_real *mean,
                                    const ch_real *invstd, const ch_real *gamma,
                                    const double *sum_dy, const double *sum_dy_xhat,
                                    double count, ch_real *dx)
{
    const long planes = (long)n * c;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        const int ch = (int)(pl % c);
        const ch_real is = invstd[ch], m = mean[ch], g = gamma[ch] * is;
        const ch_real mdy = (ch_real)(sum_dy[ch] / count), mdx = (ch_real)(sum_dy_xhat[ch] / count);
        const ch_real *xp = x + pl * hw, *dyp = dy + pl * hw;
        ch_real *dxp = dx + pl * hw;
        for (int j = 0; j < hw; j++) dxp[j] = g * (dyp[j] - mdy - (xp[j] - m) * is * mdx);
    }
}
