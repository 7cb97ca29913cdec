/* Max and average pooling, parallel over (sample, channel) planes. */
#include "kernels/cpu/cpu.h"

#include <float.h>
#include <string.h>

static void maxpool_plane(const ch_pool_desc *d, const ch_real *x, ch_real *y, int32_t *am)
{
    for (int i = 0; i < d->oh; i++) {
        for (int j = 0; j < d->ow; j++) {
            ch_real best = -(ch_real)FLT_MAX;
            int32_t arg = -1;
            for (int p = 0; p < d->k; p++) {
                const int ih = i * d->stride - d->pad + p;
                if (ih < 0 || ih >= d->h) continue;
                for (int q = 0; q < d->k; q++) {
                    const int iw = j * d->stride - d->pad + q;
                    if (iw < 0 || iw >= d->w) continue;
                    const ch_real v = x[ih * d->w + iw];
                    /* First maximum wins, and NaN propagates (as PyTorch). */
                    if (arg < 0 || v > best || v != v) {
                        best = v;
                        arg = ih * d->w + iw;
                    }
                }
            }
            y[i * d->ow + j] = best;
            am[i * d->ow + j] = arg;
        }
    }
}

void ch_cpu_maxpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                              ch_real *y, int32_t *argmax)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++)
        maxpool_plane(d, x + pl * xs, y + pl * ys, argmax + pl * ys);
}

void ch_cpu_maxpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n,
                               const ch_real *dy, const int32_t *argmax, ch_real *dx)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        ch_real *dxp = dx + pl * xs;
        const ch_real *dyp = dy + pl * ys;
        const int32_t *am = argmax + pl * ys;
        memset(dxp, 0, sizeof(ch_real) * xs);
        for (size_t o = 0; o < ys; o++) dxp[am[o]] += dyp[o];
    }
}

/* Average pooling counts padded positions in the divisor (PyTorch's count_include_pad=True). */
void ch_cpu_avgpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                              ch_real *y)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
    const ch_real inv = (ch_real)1 / (ch_real)(d->k * d->k);
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        const ch_real *xp = x + pl * xs;
        ch_real *yp = y + pl * ys;
        for (int i = 0; i < d->oh; i++) {
            for (int j = 0; j < d->ow; j++) {
                ch_real s = 0;
                for (int p = 0; p < d->k; p++) {
                    const int ih = i * d->stride - d->pad + p;
                    if (ih < 0 || ih >= d->h) continue;
                    for (int q = 0; q < d->k; q++) {
                        const int iw = j * d->stride - d->pad + q;
                        if (iw >= 0 && iw < d->w) s += xp[ih * d->w + iw];
                    }
                }
                yp[i * d->ow + j] = s * inv;
            }
        }
    }
}

void ch_cpu_avgpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n,
                               const ch_real *dy, ch_real *dx)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
    const ch_real inv = (ch_real)1 / (ch_real)(d->k * d->k);
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        ch_real *dxp = dx + pl * xs;
        const ch_real *dyp = dy + pl * ys;
        memset(dxp, 0, sizeof(ch_real) * xs);
        for (int i = 0; i < d->oh; i++) {
            for (int j = 0; j < d->ow; j++) {
                const ch_real g = dyp[i * d->ow + j] * inv;
                for (int p = 0; p < d->k; p++) {
                    const int ih = i * d->stride - d->pad + p;
                    if (ih < 0 || ih >= d->h) continue;
                    for (int q = 0; q < d->k; q++) {
                        const int iw = j * d->stride - d->pad + q;
                        if (iw >= 0 && iw < d->w) dxp[ih * d->w + iw] += g;
                    }
                }
            }
        }
    }
}
