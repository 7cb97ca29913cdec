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

/* The common 2x2 stride-2 unpadded window, branch-free so it vectorises: the pairs of each row
 * first, then the rows. Same winner as the direct loops: the first maximum in (0,0) (0,1) (1,0)
 * (1,1) order; a NaN anywhere in the window is the result, so NaN propagates as in PyTorch (with
 * several NaNs the argmax may name another of them than the direct loops do). */
static void maxpool_plane_2x2(const ch_pool_desc *d, const ch_real *x, ch_real *y, int32_t *am)
{
    const int w = d->w, ow = d->ow, oh = d->oh;   /* locals: the stores cannot alias them */
    for (int i = 0; i < oh; i++) {
        const ch_real *restrict r0 = x + (size_t)(2 * i) * w, *restrict r1 = r0 + w;
        ch_real *restrict yr = y + (size_t)i * ow;
        int32_t *restrict ar = am + (size_t)i * ow;
        const int32_t base = 2 * i * w;
        for (int j = 0; j < ow; j++) {
            const ch_real a = r0[2 * j], b = r0[2 * j + 1], c = r1[2 * j], e = r1[2 * j + 1];
            const int tb = (b > a) | (b != b), te = (e > c) | (e != e);   /* | not ||: no branch */
            const ch_real m0 = tb ? b : a, m1 = te ? e : c;
            const int32_t i0 = base + 2 * j + tb, i1 = base + w + 2 * j + te;
            /* written so that gcc vectorises it: row 1 wins if greater or NaN, unless row 0's
             * winner is already NaN */
            const int t1 = !(m1 <= m0) & !(m0 != m0);
            yr[j] = t1 ? m1 : m0;
            ar[j] = t1 ? i1 : i0;
        }
    }
}

void ch_cpu_maxpool2d_forward_direct(const ch_kctx *kc, const ch_pool_desc *d, int n,
                                     const ch_real *x, ch_real *y, int32_t *argmax)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) maxpool_plane(d, x + pl * xs, y + pl * ys, argmax + pl * ys);
}

void ch_cpu_maxpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                              ch_real *y, int32_t *argmax)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
    const bool fast = d->k == 2 && d->stride == 2 && d->pad == 0;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        if (fast)
            maxpool_plane_2x2(d, x + pl * xs, y + pl * ys, argmax + pl * ys);
        else
            maxpool_plane(d, x + pl * xs, y + pl * ys, argmax + pl * ys);
    }
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
/* 2x2 stride-2 unpadded (lenet's pools), branch-free so it vectorises; the same additions in the
 * same order as the general loops, so the same bits. */
static void avgpool_plane_2x2(const ch_pool_desc *d, const ch_real *x, ch_real *y)
{
    const int w = d->w, ow = d->ow, oh = d->oh;
    for (int i = 0; i < oh; i++) {
        const ch_real *restrict r0 = x + (size_t)(2 * i) * w, *restrict r1 = r0 + w;
        ch_real *restrict yr = y + (size_t)i * ow;
        for (int j = 0; j < ow; j++)
            yr[j] = (((ch_real)0 + r0[2 * j] + r0[2 * j + 1]) + r1[2 * j] + r1[2 * j + 1]) * (ch_real)0.25;
    }
}

/* Its backward: the windows do not overlap, so every input gets its window's gradient once (and
 * a last odd row or column, outside every window, gets zero). */
static void avgpool_backward_plane_2x2(const ch_pool_desc *d, const ch_real *dy, ch_real *dx)
{
    const int w = d->w, h = d->h, ow = d->ow, oh = d->oh;
    for (int i = 0; i < oh; i++) {
        ch_real *restrict r0 = dx + (size_t)(2 * i) * w, *restrict r1 = r0 + w;
        const ch_real *restrict g = dy + (size_t)i * ow;
        for (int j = 0; j < ow; j++) {
            const ch_real v = g[j] * (ch_real)0.25;
            r0[2 * j] = r0[2 * j + 1] = r1[2 * j] = r1[2 * j + 1] = v;
        }
        if (w > 2 * ow) r0[w - 1] = r1[w - 1] = 0;
    }
    if (h > 2 * oh) memset(dx + (size_t)(h - 1) * w, 0, sizeof(ch_real) * (size_t)w);
}

static bool avgpool_fast(const ch_pool_desc *d) { return d->k == 2 && d->stride == 2 && d->pad == 0; }

static void avgpool_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                            ch_real *y, bool fast)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
    const ch_real inv = (ch_real)1 / (ch_real)(d->k * d->k);
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        const ch_real *xp = x + pl * xs;
        ch_real *yp = y + pl * ys;
        if (fast) {
            avgpool_plane_2x2(d, xp, yp);
            continue;
        }
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

static void avgpool_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy,
                             ch_real *dx, bool fast)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
    const ch_real inv = (ch_real)1 / (ch_real)(d->k * d->k);
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        ch_real *dxp = dx + pl * xs;
        const ch_real *dyp = dy + pl * ys;
        if (fast) {
            avgpool_backward_plane_2x2(d, dyp, dxp);
            continue;
        }
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

void ch_cpu_avgpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                              ch_real *y)
{
    avgpool_forward(kc, d, n, x, y, avgpool_fast(d));
}

void ch_cpu_avgpool2d_forward_direct(const ch_kctx *kc, const ch_pool_desc *d, int n,
                                     const ch_real *x, ch_real *y)
{
    avgpool_forward(kc, d, n, x, y, false);
}

void ch_cpu_avgpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n,
                               const ch_real *dy, ch_real *dx)
{
    avgpool_backward(kc, d, n, dy, dx, avgpool_fast(d));
}

void ch_cpu_avgpool2d_backward_direct(const ch_kctx *kc, const ch_pool_desc *d, int n,
                                      const ch_real *dy, ch_real *dx)
{
    avgpool_backward(kc, d, n, dy, dx, false);
}
