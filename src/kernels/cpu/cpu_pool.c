/* Max and average pooling, parallel over (sample, channel) planes. */
#include "kernels/cpu/cpu.h"
#include "kernels/pool_body.h"

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
 * several NaNs the argmax may name another of them than the direct loops do). A fixed count of
 * POOL_CHUNK outputs: GCC vectorises a loop of unknown count only for its full vectors and runs
 * the rest in scalar code whose compares branch, so rows of 7 or 14 outputs (mnist-cnn's) ran
 * at about 28 cycles per output, 4-6x slower than this. i0 and i1 are the flat input indices of
 * the chunk's first window's top and bottom left corners. */
enum { POOL_CHUNK = 16 };

static void maxpool_chunk_2x2(const ch_real *restrict r0, const ch_real *restrict r1, int32_t i0,
                              int32_t i1, ch_real *restrict y, int32_t *restrict am)
{
    for (int j = 0; j < POOL_CHUNK; j++) {
        const ch_real a = r0[2 * j], b = r0[2 * j + 1], c = r1[2 * j], e = r1[2 * j + 1];
        const int tb = (b > a) | (b != b), te = (e > c) | (e != e);   /* | not ||: no branch */
        const ch_real m0 = tb ? b : a, m1 = te ? e : c;
        /* row 1 wins if greater or NaN, unless row 0's winner is already NaN */
        const int t1 = !(m1 <= m0) & !(m0 != m0);
        y[j] = t1 ? m1 : m0;
        am[j] = t1 ? i1 + 2 * j + te : i0 + 2 * j + tb;
    }
}

/* A row's last outputs (fewer than a chunk) through zero-padded copies, so the chunk reads
 * nothing past the row. */
static void maxpool_tail_2x2(const ch_real *r0, const ch_real *r1, int n, int32_t i0, int32_t i1,
                             ch_real *y, int32_t *am)
{
    ch_real p0[2 * POOL_CHUNK] = { 0 }, p1[2 * POOL_CHUNK] = { 0 }, py[POOL_CHUNK];
    int32_t pa[POOL_CHUNK];
    memcpy(p0, r0, sizeof(ch_real) * 2 * (size_t)n);
    memcpy(p1, r1, sizeof(ch_real) * 2 * (size_t)n);
    maxpool_chunk_2x2(p0, p1, i0, i1, py, pa);
    memcpy(y, py, sizeof(ch_real) * (size_t)n);
    memcpy(am, pa, sizeof(int32_t) * (size_t)n);
}

/* The planes [lo, hi) of this thread (plane ends xs and ys apart; x_end ends x). A row's last
 * outputs, fewer than a chunk, are computed as a whole chunk on the input after them where that
 * stays inside x and this thread's part of y: the surplus lands on the outputs of later rows,
 * which this thread writes afterwards. Only the rest go through padded copies. mnist-cnn's rows
 * of 14 and 7 outputs spent more in those copies than in the pooling. */
static void maxpool_planes_2x2(const ch_pool_desc *d, const ch_real *x, const ch_real *x_end,
                               ch_real *y, int32_t *am, long lo, long hi)
{
    const int w = d->w, ow = d->ow;
    const size_t xs = (size_t)d->h * w, ys = (size_t)d->oh * ow;
    const ch_real *y_end = y + hi * ys;
    for (long pl = lo; pl < hi; pl++)
        for (int i = 0; i < d->oh; i++) {
            const ch_real *r0 = x + pl * xs + (size_t)(2 * i) * w, *r1 = r0 + w;
            ch_real *yr = y + pl * ys + (size_t)i * ow;
            int32_t *ar = am + pl * ys + (size_t)i * ow;
            const int32_t base = 2 * i * w;
            for (int j = 0; j < ow; j += POOL_CHUNK) {
                const bool room = yr + j + POOL_CHUNK <= y_end && r1 + 2 * (j + POOL_CHUNK) <= x_end;
                if (j + POOL_CHUNK <= ow || room)
                    maxpool_chunk_2x2(r0 + 2 * j, r1 + 2 * j, base + 2 * j, base + w + 2 * j,
                                      yr + j, ar + j);
                else
                    maxpool_tail_2x2(r0 + 2 * j, r1 + 2 * j, ow - j, base + 2 * j,
                                     base + w + 2 * j, yr + j, ar + j);
            }
        }
}

/* The threads a pass over `planes` planes uses, and thread t's contiguous run [lo, hi). */
static int plane_team(long planes, int nthreads)
{
    return planes < nthreads ? (planes > 0 ? (int)planes : 1) : nthreads;
}

static void thread_planes(long planes, int t, int T, long *lo, long *hi)
{
    *lo = planes * t / T;
    *hi = planes * (t + 1) / T;
}

void ch_cpu_maxpool2d_forward_direct(const ch_kctx *kc, const ch_pool_desc *d, int n,
                                     const ch_real *x, ch_real *y, int32_t *argmax)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) maxpool_plane(d, x + pl * xs, y + pl * ys, argmax + pl * ys);
}

/* Whether the windows are those of floor mode: a ceil_mode count may add a last, partial window
 * that the 2x2 paths do not clip. */
static bool pool_floor_windows(const ch_pool_desc *d)
{
    return d->oh == ch_window_out(d->h, d->k, d->stride, d->pad) &&
           d->ow == ch_window_out(d->w, d->k, d->stride, d->pad);
}

static bool maxpool_fast(const ch_pool_desc *d)
{
    return d->k == 2 && d->stride == 2 && d->pad == 0 && pool_floor_windows(d);
}

void ch_cpu_maxpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                              ch_real *y, int32_t *argmax)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w;
    if (!maxpool_fast(d)) {
        ch_cpu_maxpool2d_forward_direct(kc, d, n, x, y, argmax);
        return;
    }
    const int T = plane_team(planes, kc->nthreads);
#pragma omp parallel num_threads(T) if (T > 1)
    {
        long lo, hi;
        thread_planes(planes, ch_omp_thread(), T, &lo, &hi);
        maxpool_planes_2x2(d, x, x + planes * xs, y, argmax, lo, hi);
    }
}

/* One input row under a row of POOL_CHUNK 2x2 windows: element 2j + b gets g[j] where window j's
 * argmax is i0 + 2j + b (i0: the row's first index in the plane), else 0. A fixed count, so it
 * vectorises; the top and bottom rows go separately so that no call's writes overlap. */
static void maxpool_back_row_2x2(const ch_real *restrict g, const int32_t *restrict am, int32_t i0,
                                 ch_real *restrict r)
{
#pragma omp simd   /* inlined without it, GCC unrolled the loop into scalar code */
    for (int j = 0; j < POOL_CHUNK; j++) {
        const int32_t a = am[j] - i0 - 2 * j;
        const ch_real v = (ch_real)0 + g[j];   /* as the scatter's 0 + g: -0 becomes +0 */
        r[2 * j] = a == 0 ? v : 0;
        r[2 * j + 1] = a == 1 ? v : 0;
    }
}

/* The same for fewer than a chunk, through padded copies. */
static void maxpool_back_tail_2x2(const ch_real *g, const int32_t *am, int n, int32_t i0,
                                  ch_real *r)
{
    ch_real pg[POOL_CHUNK] = { 0 }, pr[2 * POOL_CHUNK];
    int32_t pa[POOL_CHUNK] = { 0 };
    memcpy(pg, g, sizeof(ch_real) * (size_t)n);
    memcpy(pa, am, sizeof(int32_t) * (size_t)n);
    maxpool_back_row_2x2(pg, pa, i0, pr);
    memcpy(r, pr, sizeof(ch_real) * 2 * (size_t)n);
}

/* The backward of maxpool_planes_2x2 on the planes [lo, hi): every element of dx written (no
 * memset, no scatter), short rows as whole chunks where the surplus stays inside dy and this
 * thread's part of dx (later rows overwrite it), the column and row outside every window (odd
 * sizes) zeroed after their row's chunks. */
static void maxpool_backward_planes_2x2(const ch_pool_desc *d, const ch_real *dy,
                                        const ch_real *dy_end, const int32_t *am, ch_real *dx,
                                        long lo, long hi)
{
    const int w = d->w, h = d->h, ow = d->ow, oh = d->oh;
    const size_t xs = (size_t)h * w, ys = (size_t)oh * ow;
    const ch_real *dx_end = dx + hi * xs;
    for (long pl = lo; pl < hi; pl++) {
        ch_real *dxp = dx + pl * xs;
        for (int i = 0; i < oh; i++)
            for (int b = 0; b < 2; b++) {
                ch_real *r = dxp + (size_t)(2 * i + b) * w;
                const ch_real *g = dy + pl * ys + (size_t)i * ow;
                const int32_t *a = am + pl * ys + (size_t)i * ow;
                const int32_t i0 = (2 * i + b) * w;
                for (int j = 0; j < ow; j += POOL_CHUNK) {
                    const bool room = r + 2 * (j + POOL_CHUNK) <= dx_end &&
                                      g + j + POOL_CHUNK <= dy_end;
                    if (j + POOL_CHUNK <= ow || room)
                        maxpool_back_row_2x2(g + j, a + j, i0 + 2 * j, r + 2 * j);
                    else
                        maxpool_back_tail_2x2(g + j, a + j, ow - j, i0 + 2 * j, r + 2 * j);
                }
                if (w > 2 * ow) r[w - 1] = 0;
            }
        if (h > 2 * oh) memset(dxp + (size_t)(h - 1) * w, 0, sizeof(ch_real) * (size_t)w);
    }
}

void ch_cpu_maxpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n,
                               const ch_real *dy, const int32_t *argmax, ch_real *dx)
{
    if (!maxpool_fast(d)) {
        ch_cpu_maxpool2d_backward_direct(kc, d, n, dy, argmax, dx);
        return;
    }
    const long planes = (long)n * d->c;
    const size_t ys = (size_t)d->oh * d->ow;
    const int T = plane_team(planes, kc->nthreads);
#pragma omp parallel num_threads(T) if (T > 1)
    {
        long lo, hi;
        thread_planes(planes, ch_omp_thread(), T, &lo, &hi);
        maxpool_backward_planes_2x2(d, dy, dy + planes * ys, argmax, dx, lo, hi);
    }
}

void ch_cpu_maxpool2d_backward_direct(const ch_kctx *kc, const ch_pool_desc *d, int n,
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

static bool avgpool_fast(const ch_pool_desc *d)
{
    return d->k == 2 && d->stride == 2 && d->pad == 0 && pool_floor_windows(d);
}

static void avgpool_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                            ch_real *y, bool fast)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
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
                yp[i * d->ow + j] = s * ((ch_real)1 / (ch_real)ch_avgpool_divisor(d, i, j));
            }
        }
    }
}

static void avgpool_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy,
                             ch_real *dx, bool fast)
{
    const long planes = (long)n * d->c;
    const size_t xs = (size_t)d->h * d->w, ys = (size_t)d->oh * d->ow;
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
                const ch_real g = dyp[i * d->ow + j] * ((ch_real)1 / (ch_real)ch_avgpool_divisor(d, i, j));
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

/* Nearest upsampling: each input row becomes sh output rows of sw copies of each element. */
void ch_cpu_upsample_forward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw,
                             const ch_real *x, ch_real *y)
{
    const long planes = (long)n * c;
    const size_t ow = (size_t)w * sw;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++)
        for (int i = 0; i < h; i++) {
            const ch_real *xr = x + ((size_t)pl * h + i) * w;
            ch_real *yr = y + ((size_t)pl * h + i) * sh * ow;
            for (size_t j = 0; j < ow; j++) yr[j] = xr[j / (size_t)sw];
            for (int r = 1; r < sh; r++) memcpy(yr + r * ow, yr, sizeof(ch_real) * ow);
        }
}

/* dx[i][j] = the sum of its sh x sw block of dy, rows then columns in order. */
void ch_cpu_upsample_backward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw,
                              const ch_real *dy, ch_real *dx)
{
    const long planes = (long)n * c;
    const size_t ow = (size_t)w * sw;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++)
        for (int i = 0; i < h; i++) {
            ch_real *dr = dx + ((size_t)pl * h + i) * w;
            const ch_real *g = dy + ((size_t)pl * h + i) * sh * ow;
            for (int j = 0; j < w; j++) {
                ch_real s = 0;
                for (int r = 0; r < sh; r++)
                    for (int q = 0; q < sw; q++) s += g[r * ow + (size_t)j * sw + q];
                dr[j] = s;
            }
        }
}

void ch_cpu_bilinear_forward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align, const ch_real *x,
                             ch_real *y)
{
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (int p = 0; p < planes; p++) {
        const ch_real *xp = x + (size_t)p * h * w;
        ch_real *yp = y + (size_t)p * oh * ow;
        for (int i = 0; i < oh; i++)
            for (int j = 0; j < ow; j++) yp[i * ow + j] = ch_bilinear_at(xp, h, w, oh, ow, align, i, j);
    }
}

void ch_cpu_bilinear_backward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align,
                              const ch_real *dy, ch_real *dx)
{
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (int p = 0; p < planes; p++)
        ch_bilinear_plane_back(h, w, oh, ow, align, dy + (size_t)p * oh * ow, dx + (size_t)p * h * w);
}
