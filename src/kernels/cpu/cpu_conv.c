/* Convolution as im2col + GEMM, one sample per thread.
 * Per sample: col (K = c*kh*kw, P = oh*ow) gathers the input windows, then
 *   forward:          y_n (oc, P)  = W (oc, K) * col (K, P) + b
 *   backward data:    dcol (K, P)  = W^T (K, oc) * dy_n (oc, P), scattered back by col2im
 *   backward weights: dW (oc, K)  += dy_n (oc, P) * col^T (P, K)
 * Threads take contiguous runs of samples (static schedule) and call a single-threaded GEMM; weight
 * gradients go to per-thread partial sums reduced in thread order, so results are deterministic for
 * a given thread count. 1x1 stride-1 unpadded convolutions skip im2col: col is the input itself.
 * When the caller gives a cols cache (training, when it fits the memory budget), the forward pass
 * writes each sample's col there and backward weights reads it instead of running im2col again.
 * Workspace per thread: col (K*P) + dW partial (oc*K) + db partial (oc). */
#include "kernels/cpu/cpu.h"

#include <string.h>

static size_t conv_k(const ch_conv_desc *d) { return (size_t)d->c * d->kh * d->kw; }
static size_t conv_p(const ch_conv_desc *d) { return (size_t)d->oh * d->ow; }
static bool conv_is_pointwise(const ch_conv_desc *d)
{
    return d->kh == 1 && d->kw == 1 && d->stride == 1 && d->pad == 0;
}
static size_t per_thread(const ch_conv_desc *d)
{
    return conv_k(d) * conv_p(d) + (size_t)d->oc * conv_k(d) + (size_t)d->oc;
}
static int team_size(const ch_kctx *kc, int n) { return n < kc->nthreads ? (n > 0 ? n : 1) : kc->nthreads; }

size_t ch_cpu_conv2d_workspace(const ch_conv_desc *d, int nthreads)
{
    return per_thread(d) * (size_t)nthreads;
}

/* A pointwise convolution's col is its input: nothing to keep. */
size_t ch_cpu_conv2d_cols_len(const ch_conv_desc *d)
{
    return conv_is_pointwise(d) ? 0 : conv_k(d) * conv_p(d);
}

/* The outputs j whose tap q lands inside a row of width w: iw = j*s - pad + q in [0, w). */
static void valid_cols(const ch_conv_desc *d, int q, int *lo, int *hi)
{
    const int s = d->stride, a = d->pad - q;        /* need j*s >= a and j*s <= w - 1 + a */
    int l = a > 0 ? (a + s - 1) / s : 0;
    int h = d->w - 1 + a >= 0 ? (d->w - 1 + a) / s + 1 : 0;
    if (h > d->ow) h = d->ow;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* col[(ci*kh + p)*kw + q][i*ow + j] = x[ci][i*s - pad + p][j*s - pad + q], 0 outside.
 * Each row is a zero head, a copied (contiguous when s == 1) middle and a zero tail: no per-element
 * bounds test. */
static void im2col(const ch_conv_desc *desc, const ch_real *x, ch_real *col)
{
    const ch_conv_desc local = *desc, *d = &local;   /* a copy the stores cannot alias */
    const int s = d->stride;
    for (int ci = 0; ci < d->c; ci++) {
        const ch_real *xc = x + (size_t)ci * d->h * d->w;
        for (int p = 0; p < d->kh; p++) {
            for (int q = 0; q < d->kw; q++) {
                ch_real *row = col + (((size_t)ci * d->kh + p) * d->kw + q) * conv_p(d);
                int lo, hi;
                valid_cols(d, q, &lo, &hi);
                for (int i = 0; i < d->oh; i++) {
                    const int ih = i * s - d->pad + p;
                    ch_real *out = row + (size_t)i * d->ow;
                    if (ih < 0 || ih >= d->h || lo >= hi) {
                        memset(out, 0, sizeof(ch_real) * (size_t)d->ow);
                        continue;
                    }
                    const ch_real *xr = xc + (size_t)ih * d->w + (q - d->pad);
                    for (int j = 0; j < lo; j++) out[j] = 0;
                    if (s == 1) {
                        for (int j = lo; j < hi; j++) out[j] = xr[j];   /* short rows: no memcpy call */
                    } else {
                        for (int j = lo; j < hi; j++) out[j] = xr[j * s];
                    }
                    for (int j = hi; j < d->ow; j++) out[j] = 0;
                }
            }
        }
    }
}

/* The adjoint of im2col: dx[ci][ih][iw] += dcol[...]; dx must be zeroed by the caller. */
static void col2im(const ch_conv_desc *desc, const ch_real *col, ch_real *dx)
{
    const ch_conv_desc local = *desc, *d = &local;   /* a copy the stores cannot alias */
    const int s = d->stride;
    for (int ci = 0; ci < d->c; ci++) {
        ch_real *xc = dx + (size_t)ci * d->h * d->w;
        for (int p = 0; p < d->kh; p++) {
            for (int q = 0; q < d->kw; q++) {
                const ch_real *row = col + (((size_t)ci * d->kh + p) * d->kw + q) * conv_p(d);
                int lo, hi;
                valid_cols(d, q, &lo, &hi);
                for (int i = 0; i < d->oh; i++) {
                    const int ih = i * s - d->pad + p;
                    if (ih < 0 || ih >= d->h) continue;
                    ch_real *xr = xc + (size_t)ih * d->w + (q - d->pad);
                    const ch_real *in = row + (size_t)i * d->ow;
                    if (s == 1) {
                        for (int j = lo; j < hi; j++) xr[j] += in[j];
                    } else {
                        for (int j = lo; j < hi; j++) xr[j * s] += in[j];
                    }
                }
            }
        }
    }
}

static void forward_sample(const ch_kctx *kc, const ch_conv_desc *d, const ch_real *xn,
                           const ch_real *w, const ch_real *b, ch_real *yn, ch_real *col)
{
    /* col: scratch, or this sample's slot of the cols cache */
    const int K = (int)conv_k(d), P = (int)conv_p(d);
    const ch_real *src = xn;
    if (!conv_is_pointwise(d)) {
        im2col(d, xn, col);
        src = col;
    }
    if (b) {
        for (int o = 0; o < d->oc; o++) {
            ch_real *yo = yn + (size_t)o * P;
            for (int p = 0; p < P; p++) yo[p] = b[o];
        }
    }
    ch_cpu_gemm(kc, false, false, d->oc, P, K, 1, w, K, src, P, b ? 1 : 0, yn, P);
}

void ch_cpu_conv2d_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                           const ch_real *w, const ch_real *b, ch_real *y, ch_real *cols)
{
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * conv_p(d);
    const size_t kp = conv_k(d) * conv_p(d);
    const int T = team_size(kc, n);
#pragma omp parallel for num_threads(T) schedule(static) if (T > 1)
    for (int s = 0; s < n; s++) {
        ch_real *col = cols ? cols + kp * (size_t)s : kc->ws + per_thread(d) * (size_t)ch_omp_thread();
        forward_sample(kc, d, x + s * xs, w, b, y + s * ys, col);
    }
}

static void backward_data_sample(const ch_kctx *kc, const ch_conv_desc *d, const ch_real *dyn,
                                 const ch_real *w, ch_real *dxn, ch_real *col)
{
    const int K = (int)conv_k(d), P = (int)conv_p(d);
    if (conv_is_pointwise(d)) {
        ch_cpu_gemm(kc, true, false, K, P, d->oc, 1, w, K, dyn, P, 0, dxn, P);
        return;
    }
    ch_cpu_gemm(kc, true, false, K, P, d->oc, 1, w, K, dyn, P, 0, col, P);
    memset(dxn, 0, sizeof(ch_real) * (size_t)d->c * d->h * d->w);
    col2im(d, col, dxn);
}

void ch_cpu_conv2d_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                 const ch_real *dy, const ch_real *w, ch_real *dx)
{
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * conv_p(d);
    const int T = team_size(kc, n);
    if (T == 1) {
        for (int s = 0; s < n; s++) backward_data_sample(kc, d, dy + s * ys, w, dx + s * xs, kc->ws);
        return;
    }
#pragma omp parallel for num_threads(T) schedule(static)
    for (int s = 0; s < n; s++) {
        ch_real *col = kc->ws + per_thread(d) * (size_t)ch_omp_thread();
        backward_data_sample(kc, d, dy + s * ys, w, dx + s * xs, col);
    }
}

/* Accumulate one sample's weight gradient into dw (oc, K) and db (oc). */
static void backward_weights_sample(const ch_kctx *kc, const ch_conv_desc *d, const ch_real *xn,
                                    const ch_real *dyn, ch_real *dw, ch_real *db, ch_real *col,
                                    const ch_real *cached, bool first)
{
    const int K = (int)conv_k(d), P = (int)conv_p(d);
    const ch_real *src = xn;
    if (cached) {
        src = cached;
    } else if (!conv_is_pointwise(d)) {
        im2col(d, xn, col);
        src = col;
    }
    ch_cpu_gemm(kc, false, true, d->oc, K, P, 1, dyn, P, src, P, first ? 0 : 1, dw, K);
    if (!db) return;
    for (int o = 0; o < d->oc; o++) {
        const ch_real *r = dyn + (size_t)o * P;
        ch_real s = 0;
        for (int p = 0; p < P; p++) s += r[p];
        db[o] = first ? s : db[o] + s;
    }
}

void ch_cpu_conv2d_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                    const ch_real *x, const ch_real *dy, ch_real *dw,
                                    ch_real *db, const ch_real *cols)
{
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * conv_p(d);
    const size_t wl = (size_t)d->oc * conv_k(d), pt = per_thread(d), kp = conv_k(d) * conv_p(d);
    const int T = team_size(kc, n);
    if (T == 1) {
        for (int s = 0; s < n; s++)
            backward_weights_sample(kc, d, x + s * xs, dy + s * ys, dw, db, kc->ws,
                                    cols ? cols + kp * (size_t)s : NULL, s == 0);
        if (n == 0) {
            memset(dw, 0, sizeof(ch_real) * wl);
            if (db) memset(db, 0, sizeof(ch_real) * (size_t)d->oc);
        }
        return;
    }
#pragma omp parallel num_threads(T)
    {
        const int t = ch_omp_thread();
        ch_real *col = kc->ws + pt * (size_t)t, *pw = col + kp, *pb = pw + wl;
        const int lo = (int)((long)n * t / T), hi = (int)((long)n * (t + 1) / T);
        for (int s = lo; s < hi; s++)
            backward_weights_sample(kc, d, x + s * xs, dy + s * ys, pw, db ? pb : NULL, col,
                                    cols ? cols + kp * (size_t)s : NULL, s == lo);
#pragma omp barrier
        /* Reduce the partials in thread order: each thread sums a slice of the elements. */
#pragma omp for schedule(static)
        for (size_t i = 0; i < wl + (size_t)d->oc; i++) {
            if (i >= wl && !db) continue;
            ch_real acc = 0;
            for (int u = 0; u < T; u++) acc += kc->ws[pt * (size_t)u + kp + i];
            if (i < wl) dw[i] = acc; else db[i - wl] = acc;
        }
    }
}
