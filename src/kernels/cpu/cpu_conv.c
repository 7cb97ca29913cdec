/* Convolution as im2col + GEMM over groups of samples.
 * A group of g samples shares one GEMM: col (K = c*kh*kw rows, g*P columns, P = oh*ow) holds the
 * samples' input windows side by side, so that
 *   forward:          Y (oc, g*P)   = W (oc, K) * col (K, g*P), scattered to y's samples, + b
 *   backward data:    dcol (K, g*P) = W^T (K, oc) * dY (oc, g*P), scattered back by col2im, or for
 *                     "same" convolutions the forward code run on dY with flipped weights (below)
 *   backward weights: dW (oc, K)   += dY (oc, g*P) * col^T (g*P, K)
 * Why groups: resnet18's late stages have P = 49 and 16, and per-sample GEMMs that thin ran at a
 * third of the GEMM's speed (backward weights re-read and re-wrote all of dW for 16 columns of
 * work). g is chosen so that g*P is about CONV_GROUP_COLS. Layers with P >= CONV_GROUP_MIN_P keep
 * g = 1: measured on this machine (lenet's P = 81, mnist-cnn's and resnet18 stage 2's P = 196),
 * grouping them made the forward GEMM slower and saved nothing overall; for P = 49 and 16 it saved
 * 10-15% of the layer's time.
 * Threads take contiguous runs of groups (static schedule) and call a single-threaded GEMM; weight
 * gradients go to per-thread partial sums reduced in thread order, so results are deterministic for
 * a given thread count. 1x1 stride-1 unpadded convolutions skip im2col: col is the input (one
 * sample) or the group's inputs side by side.
 * Backward weights runs im2col again rather than keeping forward's col for the batch: the kept
 * matrices (up to 47 MiB for mnist-cnn at batch 100) went to DRAM and back, while a group's col is
 * built in the thread's scratch and read from cache; lenet and mnist-cnn measured 5-30% faster.
 * Workspace per thread: col (K*g*P, or oc*kh*kw*g*P if larger for flipped backward data) + packed
 * Y/dY/dX (oc or c rows of g*P) + dW partial (oc*K) + db partial (oc) + a padded plane for stride-1
 * im2col; then, shared, the flipped weights. */
#include "kernels/cpu/cpu.h"
#include "core/bf16.h"
#include "core/status.h"

#include <string.h>

enum { CONV_GROUP_COLS = 256, CONV_GROUP_MAX = 16, CONV_GROUP_MIN_P = 64 };

static size_t conv_k(const ch_conv_desc *d) { return (size_t)d->c * d->kh * d->kw; }
static size_t conv_p(const ch_conv_desc *d) { return (size_t)d->oh * d->ow; }
static bool conv_is_pointwise(const ch_conv_desc *d)
{
    return d->kh == 1 && d->kw == 1 && d->stride == 1 && d->pad == 0;
}

/* Samples per GEMM for this layer, before the batch caps it. Pointwise layers group too where
 * their planes are small (MobileNet's 1x1 layers at 7x7 to 2x2): their col is the group's inputs
 * side by side, a copy, where per-sample GEMMs re-read and re-wrote all of a 960 x 160 dW for four
 * columns of work. */
static int conv_group_max(const ch_conv_desc *d)
{
    const int p = (int)conv_p(d);
    if (p >= CONV_GROUP_MIN_P) return 1;
    const int g = (CONV_GROUP_COLS + p - 1) / p;
    return g < CONV_GROUP_MAX ? g : CONV_GROUP_MAX;
}

/* How a batch of n is cut: groups of g samples (the last may be shorter), T threads. */
typedef struct conv_split {
    int g, groups, threads;
} conv_split;

static conv_split conv_split_of(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    conv_split s;
    const int per_thread_samples = (n + kc->nthreads - 1) / kc->nthreads;
    s.g = conv_group_max(d);
    if (s.g > per_thread_samples) s.g = per_thread_samples > 0 ? per_thread_samples : 1;
    s.groups = (n + s.g - 1) / s.g;
    s.threads = s.groups < kc->nthreads ? (s.groups > 0 ? s.groups : 1) : kc->nthreads;
    return s;
}

/* Backward data as a forward convolution of dY with the flipped weights, for "same" convolutions
 * (stride 1, square kernel, 2 pad = k - 1): dX (c, g*h*w) = W' (c, oc*kh*kw) *
 * im2col(dY), where the flipped convolution has the same pad and the same P. (Where pad is smaller,
 * as in lenet's unpadded 5x5, the flipped convolution would multiply h*w/(oh*ow) times as many
 * columns, mostly zeros: measured 6% slower on lenet, so those layers keep col2im.)
 * The col2im way, dcol = W^T (K, oc) * dY (oc, P) then a scatter-add, has a GEMM whose inner
 * dimension is oc (20 in mnist-cnn's conv2), which oneDNN runs far below its speed, and col2im
 * adds rows of 7 to 28 elements, which do not vectorise. This way the GEMM has the forward's shape,
 * with oc*kh*kw as its inner dimension, and writes dx itself: no memset, no scatter. */
static bool conv_backward_as_forward(const ch_conv_desc *d)
{
    return d->stride == 1 && !conv_is_pointwise(d) && d->kh == d->kw && 2 * d->pad == d->kh - 1;
}

/* The convolution that backward data runs in that case: dY in, dX out, pad kh - 1 - pad. */
static ch_conv_desc conv_flipped(const ch_conv_desc *d)
{
    return (ch_conv_desc){ .c = d->oc, .h = d->oh, .w = d->ow, .oc = d->c, .kh = d->kh,
                           .kw = d->kw, .stride = 1, .pad = d->kh - 1 - d->pad, .oh = d->h,
                           .ow = d->w };
}

/* A zero-bordered copy of one input plane, which stride-1 im2col copies rows from. */
static size_t padded_plane_len(const ch_conv_desc *d)
{
    return (size_t)(d->h + 2 * d->pad) * (size_t)(d->w + 2 * d->pad);
}

/* The per-thread col holds a group's windows of x, or of dY when backward data runs as a forward
 * convolution (same P, so the same groups); packed holds a group's Y, dY or, then, dX. */
static size_t col_len(const ch_conv_desc *d)
{
    const size_t gp = (size_t)conv_group_max(d) * conv_p(d);
    const size_t k = conv_backward_as_forward(d) ? (size_t)d->oc * d->kh * d->kw : 0;
    return (conv_k(d) > k ? conv_k(d) : k) * gp;
}

static size_t packed_len(const ch_conv_desc *d)
{
    const size_t gp = (size_t)conv_group_max(d) * conv_p(d);
    const int rows = conv_backward_as_forward(d) && d->c > d->oc ? d->c : d->oc;
    return (size_t)rows * gp;
}

static size_t plane_len(const ch_conv_desc *d)
{
    size_t n = d->stride == 1 ? padded_plane_len(d) : 0;
    if (conv_backward_as_forward(d)) {
        const ch_conv_desc f = conv_flipped(d);
        if (padded_plane_len(&f) > n) n = padded_plane_len(&f);
    }
    return n;
}

static size_t per_thread(const ch_conv_desc *d)
{
    return col_len(d) + packed_len(d) + (size_t)d->oc * conv_k(d) + (size_t)d->oc + plane_len(d);
}

/* After the threads' scratch: the flipped weights (c, oc*kh*kw), shared. Or Winograd's
 * (cpu_dnnl_conv.c, cpu_wino5.c, cpu_wino3.c) or oneDNN's direct ones, bf16 or fp32
 * (cpu_dnnl_conv.c), where one applies and needs more; im2col stays possible for other batches. */
size_t ch_cpu_conv2d_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    const int nthreads = kc->nthreads;
    if (ch_cpu_conv_is_grouped(d)) return ch_cpu_conv_group_workspace(d, n, nthreads);
    const size_t flipped = conv_backward_as_forward(d) ? (size_t)d->oc * conv_k(d) : 0;
    const size_t im2col = per_thread(d) * (size_t)nthreads + flipped;
    size_t most = im2col;
    const size_t other[6] = { ch_cpu_wino_workspace(kc, d, n),
                              ch_cpu_wino5_workspace(kc, d, n),
                              ch_cpu_wino3_workspace(kc, d, n),
                              ch_cpu_conv_direct_workspace(kc, d, n),
                              ch_cpu_conv_bf16w_workspace(kc, d, n),
                              ch_cpu_conv_bf16p_workspace(kc, d, n) };
    for (int i = 0; i < 6; i++)
        if (other[i] > most) most = other[i];
    return most;
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

/* n >= 1 elements as fixed-size copies, the last one overlapping the one before: GCC inlines a
 * memcpy of constant size as vector moves, while a loop of unknown count (rows of 7 to 28 here)
 * ran its remainder one element at a time. */
static void copy_row(ch_real *restrict dst, const ch_real *restrict src, int n)
{
    enum { CHUNK = 16 };
    if (n >= CHUNK) {
        int j = 0;
        for (; j + CHUNK <= n; j += CHUNK) memcpy(dst + j, src + j, sizeof(ch_real) * CHUNK);
        if (j < n) memcpy(dst + n - CHUNK, src + n - CHUNK, sizeof(ch_real) * CHUNK);
    } else if (n >= 8) {
        memcpy(dst, src, sizeof(ch_real) * 8);
        memcpy(dst + n - 8, src + n - 8, sizeof(ch_real) * 8);
    } else if (n >= 4) {
        memcpy(dst, src, sizeof(ch_real) * 4);
        memcpy(dst + n - 4, src + n - 4, sizeof(ch_real) * 4);
    } else {
        for (int j = 0; j < n; j++) dst[j] = src[j];
    }
}

/* xp = the plane xc with a border of pad zeros, rows of w + 2 pad. */
static void pad_plane(const ch_conv_desc *d, const ch_real *xc, ch_real *xp)
{
    const int pad = d->pad, wp = d->w + 2 * pad;
    memset(xp, 0, sizeof(ch_real) * (size_t)wp * (size_t)pad);
    for (int y = 0; y < d->h; y++) {
        ch_real *r = xp + (size_t)(y + pad) * wp;
        for (int j = 0; j < pad; j++) r[j] = r[pad + d->w + j] = 0;
        memcpy(r + pad, xc + (size_t)y * d->w, sizeof(ch_real) * (size_t)d->w);
    }
    memset(xp + (size_t)(d->h + pad) * wp, 0, sizeof(ch_real) * (size_t)wp * (size_t)pad);
}

/* Stride 1: every row of col is a run of ow elements of the padded plane, no bounds to test. */
static void im2col_stride1(const ch_conv_desc *d, const ch_real *x, ch_real *col, size_t ld,
                           ch_real *xp)
{
    const int wp = d->w + 2 * d->pad;
    for (int ci = 0; ci < d->c; ci++) {
        pad_plane(d, x + (size_t)ci * d->h * d->w, xp);
        for (int p = 0; p < d->kh; p++)
            for (int q = 0; q < d->kw; q++) {
                ch_real *row = col + (((size_t)ci * d->kh + p) * d->kw + q) * ld;
                const ch_real *src = xp + (size_t)p * wp + q;
                for (int i = 0; i < d->oh; i++)
                    copy_row(row + (size_t)i * d->ow, src + (size_t)i * wp, d->ow);
            }
    }
}

/* col[((ci*kh + p)*kw + q) * ld + i*ow + j] = x[ci][i*s - pad + p][j*s - pad + q], 0 outside;
 * ld is the row length of the group's col, so one sample fills P columns of each row.
 * Stride 1 goes through a padded copy of each plane (xp, padded_plane_len elements). Otherwise
 * each row is a zero head, a strided middle and a zero tail: no per-element bounds test. */
static void im2col(const ch_conv_desc *desc, const ch_real *x, ch_real *col, size_t ld,
                   ch_real *xp)
{
    const ch_conv_desc local = *desc, *d = &local;   /* a copy the stores cannot alias */
    const int s = d->stride;
    if (s == 1) {
        im2col_stride1(d, x, col, ld, xp);
        return;
    }
    for (int ci = 0; ci < d->c; ci++) {
        const ch_real *xc = x + (size_t)ci * d->h * d->w;
        for (int p = 0; p < d->kh; p++) {
            for (int q = 0; q < d->kw; q++) {
                ch_real *row = col + (((size_t)ci * d->kh + p) * d->kw + q) * ld;
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
                    for (int j = lo; j < hi; j++) out[j] = xr[j * s];
                    for (int j = hi; j < d->ow; j++) out[j] = 0;
                }
            }
        }
    }
}

/* The adjoint of im2col (same ld): dx[ci][ih][iw] += dcol[...]; dx must be zeroed by the caller. */
static void col2im(const ch_conv_desc *desc, const ch_real *col, size_t ld, ch_real *dx)
{
    const ch_conv_desc local = *desc, *d = &local;   /* a copy the stores cannot alias */
    const int s = d->stride;
    for (int ci = 0; ci < d->c; ci++) {
        ch_real *xc = dx + (size_t)ci * d->h * d->w;
        for (int p = 0; p < d->kh; p++) {
            for (int q = 0; q < d->kw; q++) {
                const ch_real *row = col + (((size_t)ci * d->kh + p) * d->kw + q) * ld;
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

/* A thread's scratch: the group's col, the packed Y or dY, the dW and db partials, and a padded
 * plane for stride-1 im2col. */
typedef struct conv_scratch {
    ch_real *col, *packed, *dw, *db, *plane;
} conv_scratch;

static conv_scratch scratch_of(const ch_kctx *kc, const ch_conv_desc *d, int thread)
{
    conv_scratch s;
    s.col = kc->ws + per_thread(d) * (size_t)thread;
    s.packed = s.col + col_len(d);
    s.dw = s.packed + packed_len(d);
    s.db = s.dw + (size_t)d->oc * conv_k(d);
    s.plane = s.db + d->oc;
    return s;
}

/* Samples in the group starting at sample s0 (the last group may be short). */
static int group_width(const conv_split *sp, int n, int s0)
{
    return n - s0 < sp->g ? n - s0 : sp->g;
}

/* The groups thread t of the split owns: [*lo, *hi). */
static void thread_groups(const conv_split *sp, int t, int *lo, int *hi)
{
    *lo = (int)((long)sp->groups * t / sp->threads);
    *hi = (int)((long)sp->groups * (t + 1) / sp->threads);
}

/* gw samples of (rows, P) side by side as one (rows, gw*P) matrix: dY, or a pointwise layer's x. */
static void pack_rows(int rows, size_t P, int gw, const ch_real *src, ch_real *packed)
{
    const size_t ld = (size_t)gw * P;
    for (int s = 0; s < gw; s++)
        for (int o = 0; o < rows; o++)
            memcpy(packed + o * ld + s * P, src + ((size_t)s * rows + o) * P, sizeof(ch_real) * P);
}

/* The inverse of pack_rows: a pointwise layer's grouped dX back to its samples. */
static void unpack_rows(int rows, size_t P, int gw, const ch_real *packed, ch_real *dst)
{
    const size_t ld = (size_t)gw * P;
    for (int s = 0; s < gw; s++)
        for (int o = 0; o < rows; o++)
            memcpy(dst + ((size_t)s * rows + o) * P, packed + o * ld + s * P, sizeof(ch_real) * P);
}

static void pack_dy(const ch_conv_desc *d, int gw, const ch_real *dy, ch_real *packed)
{
    pack_rows(d->oc, conv_p(d), gw, dy, packed);
}

/* A group's inputs as its GEMM reads them: im2col, or for a pointwise layer the samples side by
 * side (one sample: x itself). */
static const ch_real *group_col(const ch_conv_desc *d, int gw, const ch_real *x, const conv_scratch *sc)
{
    const size_t P = conv_p(d), ld = (size_t)gw * P, xs = (size_t)d->c * d->h * d->w;
    if (conv_is_pointwise(d)) {
        if (gw == 1) return x;
        pack_rows(d->c, P, gw, x, sc->col);
        return sc->col;
    }
    for (int s = 0; s < gw; s++) im2col(d, x + s * xs, sc->col + s * P, ld, sc->plane);
    return sc->col;
}

/* One sample's plane of the GEMM's output (+ bias, ReLU where fused) rounded to bf16 (a
 * convolution's output written in bf16 for its BatchNorm). No bias: the value as it is (adding 0
 * would turn a -0 into +0). */
void ch_cpu_round_plane(const ch_real *from, size_t P, const ch_real *b, bool relu, uint16_t *to)
{
    for (size_t p = 0; p < P; p++) {
        const ch_real v = b ? from[p] + *b : from[p];
        to[p] = ch_bf16_from_float((float)(relu && v < 0 ? 0 : v));   /* NaN passes, as in relu_span */
    }
}

/* A group of gw samples: y, or with y16 the same values rounded to bf16 there (y unused). */
static void forward_group(const ch_kctx *kc, const ch_conv_desc *d, int gw, const ch_real *x,
                          const ch_real *w, const ch_real *b, ch_real *y, uint16_t *y16,
                          const conv_scratch *sc)
{
    ch_real *packed = sc->packed;
    const size_t K = conv_k(d), P = conv_p(d), ld = (size_t)gw * P;
    const ch_real *src = group_col(d, gw, x, sc);
    /* One sample: the GEMM writes y itself, over the bias. */
    ch_real *out = gw == 1 && !y16 ? y : packed;
    ch_cpu_gemm(kc, false, false, d->oc, (int)ld, (int)K, 1, w, (int)K, src, (int)ld, 0, out,
                (int)ld);
    if (y16) {   /* rounded from the scratch while it is in cache */
        for (int s = 0; s < gw; s++)
            for (int o = 0; o < d->oc; o++)
                ch_cpu_round_plane(out + o * ld + s * P, P, b ? b + o : NULL, d->relu,
                            y16 + ((size_t)s * d->oc + o) * P);
        return;
    }
    if (gw > 1 || b)
        for (int s = 0; s < gw; s++)
            for (int o = 0; o < d->oc; o++) {
                const ch_real bo = b ? b[o] : 0, *from = out + o * ld + s * P;
                ch_real *to = y + ((size_t)s * d->oc + o) * P;
                for (size_t p = 0; p < P; p++) to[p] = from[p] + bo;
            }
    /* The group's output is still in cache: a separate ReLU pass would read it back from memory. */
    if (d->relu) ch_cpu_relu_span((size_t)gw * d->oc * P, y, y);
}

/* bf16 direct (which refuses grouped layers), or cpu_wino3.c's bf16 point GEMMs (oneDNN's fp32
 * Winograd leaves it every such layer). */
bool ch_cpu_conv2d_in_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    return ch_cpu_conv_bf16_workspace(kc, d, n) > 0 || ch_cpu_conv_bf16p_workspace(kc, d, n) > 0 ||
           (n > 0 && ch_cpu_wino3_in_bf16(d));
}

static void im2col_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                           const ch_real *w, const ch_real *b, ch_real *y, uint16_t *y16);

/* Which kernel runs d's forward at batch n: the first of the chain whose geometry takes it. The
 * forward below dispatches on it and conv2d_out_bf16 asks it, so the two cannot disagree. */
typedef enum { FWD_GROUPED, FWD_DNNL, FWD_WINO5, FWD_WINO3, FWD_IM2COL } fwd_kernel;

static fwd_kernel forward_kernel(const ch_conv_desc *d, int n)
{
    if (ch_cpu_conv_is_grouped(d)) return FWD_GROUPED;
    if (ch_cpu_dnnl_conv_takes(d, n)) return FWD_DNNL;
    if (ch_cpu_wino5_applies(d)) return FWD_WINO5;
    return ch_cpu_wino3_applies(d) ? FWD_WINO3 : FWD_IM2COL;
}

/* The kept transformed weights of cohort's own Winograds (wino_body.h, u_for), where one runs
 * the forward. */
size_t ch_cpu_conv2d_keep_bytes(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    if (n <= 0) return 0;
    switch (forward_kernel(d, n)) {
    case FWD_WINO5: return ch_cpu_wino5_keep_bytes(kc, d, n);
    case FWD_WINO3: return ch_cpu_wino3_keep_bytes(kc, d, n);
    default: return 0;
    }
}

void ch_cpu_conv2d_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                           const ch_real *w, const ch_real *b, ch_real *y)
{
    /* A kernel that declines (no workspace for this batch) hands on to the next of the chain. */
    switch (forward_kernel(d, n)) {
    case FWD_GROUPED: ch_cpu_conv_group_forward(kc, d, n, x, w, b, y); return;
    case FWD_DNNL:
        if (ch_cpu_conv_direct_forward(kc, d, n, x, w, b, y) || ch_cpu_wino_forward(kc, d, n, x, w, b, y))
            return;
        /* fall through */
    case FWD_WINO5:
        if (ch_cpu_wino5_forward(kc, d, n, x, w, b, y)) return;
        /* fall through */
    case FWD_WINO3:
        if (ch_cpu_wino3_forward(kc, d, n, x, w, b, y)) return;
        /* fall through */
    case FWD_IM2COL: break;
    }
    im2col_forward(kc, d, n, x, w, b, y, NULL);
}

/* What an im2col pass's team members share (ch_cpu_team's arg). */
typedef struct conv_team {
    const ch_kctx *kc;
    const ch_conv_desc *d;
    const conv_split *sp;
    int n;
    const ch_real *x;               /* what the GEMMs read: x (forward, weights), dy (data) */
    const ch_real *w, *b, *y;       /* y: forward's output (weights, with d->relu) */
    ch_real *out;                   /* y (forward), dx (data), dw (weights) */
    uint16_t *out16;                /* forward: y rounded to bf16 instead */
    ch_real *dy, *db;               /* weights: dy (masked in place with d->relu), db */
    size_t in_stride, out_stride;   /* forward and data: a sample's elements in x and out */
    bool data;                      /* backward data: col2im's, or with f a flipped forward's */
    const ch_conv_desc *f;
} conv_team;

/* An empty share's weight and bias gradients: zeros, as the passes over samples leave them. */
static void no_grads(const ch_conv_desc *d, ch_real *dw, ch_real *db)
{
    memset(dw, 0, sizeof(ch_real) * (size_t)d->oc * conv_k(d));
    if (db) memset(db, 0, sizeof(ch_real) * (size_t)d->oc);
}

/* --precision bf16's convolution output gradients in bf16 (conv2d_dy_bf16 and the pass after it):
 * the layers cohort's F(4x4, 3x3) runs without a fused ReLU, which widen dy as they pack it, so
 * that the BatchNorm after them writes half the bytes and the packing reads half. */
bool ch_cpu_conv2d_dy_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    return !d->relu && ch_cpu_conv2d_x_bf16(kc, d, n);
}

void ch_cpu_conv2d_backward_dy_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                    const uint16_t *xh, const uint16_t *dy, const ch_real *w, ch_real *dx,
                                    ch_real *dw, ch_real *db)
{
    if (n <= 0) {
        no_grads(d, dw, db);
        return;
    }
    const bool done = ch_cpu_wino3_backward_dy_bf16(kc, d, n, x, xh, dy, w, dx, dw, db);
    CH_ASSERT(done);   /* the plan asked conv2d_dy_bf16 */
}

static void backward_data_group(const ch_kctx *kc, const ch_conv_desc *d, int gw,
                                const ch_real *dy, const ch_real *w, ch_real *dx, ch_real *col,
                                ch_real *packed);

/* Thread t's groups of samples, forward or backward data. */
static void groups_member(void *arg, int t, int T)
{
    (void)T;
    const conv_team *m = arg;
    const conv_scratch sc = scratch_of(m->kc, m->d, t);
    int lo, hi;
    thread_groups(m->sp, t, &lo, &hi);
    for (int q = lo; q < hi; q++) {
        const int s0 = q * m->sp->g, gw = group_width(m->sp, m->n, s0);
        const ch_real *in = m->x + s0 * m->in_stride;
        ch_real *out = m->out ? m->out + s0 * m->out_stride : NULL;
        if (m->data && !m->f)
            backward_data_group(m->kc, m->d, gw, in, m->w, out, sc.col, sc.packed);
        else
            forward_group(m->kc, m->f ? m->f : m->d, gw, in, m->w, m->b, out,
                          m->out16 ? m->out16 + s0 * m->out_stride : NULL, &sc);
    }
}

/* im2col + GEMM, into y or, with y16, rounded to bf16 there. */
static void im2col_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                           const ch_real *w, const ch_real *b, ch_real *y, uint16_t *y16)
{
    if (ch_cpu_conv_bf16p_forward(kc, d, n, x, w, b, y, y16)) return;   /* bf16 1x1 strided layers */
    const conv_split sp = conv_split_of(kc, d, n);
    conv_team m = { .kc = kc, .d = d, .sp = &sp, .n = n, .x = x, .w = w, .b = b, .out = y, .out16 = y16,
                    .in_stride = (size_t)d->c * d->h * d->w, .out_stride = (size_t)d->oc * conv_p(d) };
    ch_cpu_team(sp.threads, groups_member, &m);
}

/* --precision bf16's convolution outputs in bf16 (the kernel table's conv2d_out_bf16 and
 * conv2d_forward_bf16), where rounding as it writes costs nothing: the layers cohort's F(4x4, 3x3)
 * runs, whose forward rounds y as it unpacks it (products in bf16 or, where the CPU keeps them
 * fp32, in fp32), and the im2col ones (resnet18's stem), which round each group's GEMM output
 * from the scratch. oneDNN's layers and F(3x3, 5x5) keep their fp32 outputs (their BatchNorms
 * round the copies they keep). */
bool ch_cpu_conv2d_out_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    (void)kc;
    if (n <= 0 || !d->bf16) return false;
    const fwd_kernel k = forward_kernel(d, n);
    return k == FWD_WINO3 || k == FWD_IM2COL;
}

void ch_cpu_conv2d_forward_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                const ch_real *w, const ch_real *b, uint16_t *y)
{
    if (ch_cpu_wino3_forward_bf16(kc, d, n, x, w, b, y)) return;
    CH_ASSERT(forward_kernel(d, n) == FWD_IM2COL);   /* the plan asked conv2d_out_bf16 */
    im2col_forward(kc, d, n, x, w, b, NULL, y);
}

/* --precision bf16's convolution inputs in bf16 (conv2d_x_bf16 and the two passes after it): the
 * layers cohort's F(4x4, 3x3) runs, which widen x as they pack it into the sample lanes, so that
 * the BatchNorm + ReLU before them writes half the bytes and the packing reads half. */
bool ch_cpu_conv2d_x_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    (void)kc;
    return n > 0 && d->bf16 && forward_kernel(d, n) == FWD_WINO3 && ch_cpu_bf16_inputs();
}

void ch_cpu_conv2d_forward_of_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                                   const ch_real *w, const ch_real *b, ch_real *y, uint16_t *yh)
{
    if (n <= 0) return;   /* a replica's empty share */
    const bool done = ch_cpu_wino3_forward_of_bf16(kc, d, n, x, w, b, y, yh);
    CH_ASSERT(done);   /* the plan asked conv2d_x_bf16, and sized the workspace for the batch */
}

void ch_cpu_conv2d_backward_of_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                                    const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx, ch_real *dw,
                                    ch_real *db)
{
    if (n <= 0) {
        no_grads(d, dw, db);
        return;
    }
    const bool done = ch_cpu_wino3_backward_of_bf16(kc, d, n, x, y, dy, w, dx, dw, db);
    CH_ASSERT(done);
}

static void backward_data_group(const ch_kctx *kc, const ch_conv_desc *d, int gw,
                                const ch_real *dy, const ch_real *w, ch_real *dx, ch_real *col,
                                ch_real *packed)
{
    const size_t K = conv_k(d), P = conv_p(d), ld = (size_t)gw * P;
    const size_t xs = (size_t)d->c * d->h * d->w;
    const ch_real *dyg = dy;
    if (gw > 1) {
        pack_dy(d, gw, dy, packed);
        dyg = packed;
    }
    if (conv_is_pointwise(d)) {   /* dcol is dx: one sample's, or the group's side by side */
        ch_cpu_gemm(kc, true, false, (int)K, (int)ld, d->oc, 1, w, (int)K, dyg, (int)ld, 0,
                    gw == 1 ? dx : col, (int)ld);
        if (gw > 1) unpack_rows(d->c, P, gw, col, dx);
        return;
    }
    ch_cpu_gemm(kc, true, false, (int)K, (int)ld, d->oc, 1, w, (int)K, dyg, (int)ld, 0, col,
                (int)ld);
    memset(dx, 0, sizeof(ch_real) * xs * (size_t)gw);
    for (int s = 0; s < gw; s++) col2im(d, col + s * P, ld, dx + s * xs);
}

/* wf[ci][o][p][q] = w[o][ci][kh-1-p][kw-1-q]: the kernel of backward data as a forward convolution. */
static void flip_weights(const ch_conv_desc *d, const ch_real *w, ch_real *wf)
{
    const int kk = d->kh * d->kw;
    for (int ci = 0; ci < d->c; ci++)
        for (int o = 0; o < d->oc; o++) {
            const ch_real *from = w + ((size_t)o * d->c + ci) * kk;
            ch_real *to = wf + ((size_t)ci * d->oc + o) * kk;
            for (int t = 0; t < kk; t++) to[t] = from[kk - 1 - t];
        }
}

void ch_cpu_conv2d_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                 const ch_real *dy, const ch_real *w, ch_real *dx)
{
    if (ch_cpu_conv_is_grouped(d)) {
        ch_cpu_conv_group_backward_data(kc, d, n, dy, w, dx);
        return;
    }
    if (ch_cpu_conv_bf16p_backward_data(kc, d, n, dy, w, dx) ||
        ch_cpu_conv_direct_backward_data(kc, d, n, dy, w, dx) || ch_cpu_wino_backward_data(kc, d, n, dy, w, dx) ||
        ch_cpu_wino5_backward_data(kc, d, n, dy, w, dx) ||
        ch_cpu_wino3_backward_data(kc, d, n, dy, w, dx))
        return;
    const conv_split sp = conv_split_of(kc, d, n);
    const bool flipped = conv_backward_as_forward(d);
    const ch_conv_desc f = conv_flipped(d);
    ch_real *wf = flipped ? kc->ws + per_thread(d) * (size_t)kc->nthreads : NULL;
    if (flipped) flip_weights(d, w, wf);
    conv_team m = { .kc = kc, .d = d, .sp = &sp, .n = n, .x = dy, .w = flipped ? wf : w, .out = dx,
                    .in_stride = (size_t)d->oc * conv_p(d), .out_stride = (size_t)d->c * d->h * d->w,
                    .data = true, .f = flipped ? &f : NULL };
    ch_cpu_team(sp.threads, groups_member, &m);
}

/* dw[o][k] (+)= sum_p dy[o][p] * col[k][p] for a small K (a first layer: c = 1, K = 9 or 25).
 * As a GEMM this is m = oc, n = K, k = P: tiny output, long reduction, and oneDNN ran it at
 * 14-28 GFLOP/s, a tenth of its speed, which made it 10% of lenet's and mnist-cnn's step. Here a
 * block of DW_OB outputs x DW_KB taps is summed at once: each step over p loads DW_OB + DW_KB
 * vectors for DW_OB * DW_KB multiply-adds, and the DW_OB * DW_KB accumulators (one AVX-512
 * vector each) stay in registers. Each sum's lanes are added in a fixed order at the end, so the
 * result does not depend on the blocking of the other outputs. */
enum { SMALL_K_MAX = 32, LANES = CH_CPU_LANES, DW_OB = 4, DW_KB = 4 };

/* One OB x KB block of dw, as a function per block shape so that the block loops have constant
 * bounds and unroll. ch_fma: -std=c11 keeps GCC from contracting a * b + c into one instruction. */
#define DW_TILE(name, OB, KB)                                                                     \
    static void name(const ch_real *dy, const ch_real *col, size_t len, ch_real *dw, size_t ldw, \
                     bool first)                                                                 \
    {                                                                                            \
        const size_t full = len - len % LANES;                                                   \
        ch_real acc[OB][KB][LANES] = { { { 0 } } };                                              \
        for (size_t p = 0; p < full; p += LANES)                                                 \
            for (int a = 0; a < OB; a++)                                                         \
                for (int b = 0; b < KB; b++)                                                     \
                    _Pragma("omp simd") for (int j = 0; j < LANES; j++)                          \
                        acc[a][b][j] = ch_fma(dy[(size_t)a * len + p + j],                       \
                                            col[(size_t)b * len + p + j], acc[a][b][j]);       \
        for (int a = 0; a < OB; a++)                                                             \
            for (int b = 0; b < KB; b++) {                                                       \
                ch_real s = 0;                                                                   \
                for (int j = 0; j < LANES; j++) s += acc[a][b][j];                               \
                for (size_t p = full; p < len; p++)                                              \
                    s = ch_fma(dy[(size_t)a * len + p], col[(size_t)b * len + p], s);            \
                ch_real *w = dw + (size_t)a * ldw + b;                                           \
                *w = first ? s : *w + s;                                                         \
            }                                                                                    \
    }
DW_TILE(dw_tile_4x4, DW_OB, DW_KB)
DW_TILE(dw_tile_4x1, DW_OB, 1)
DW_TILE(dw_tile_1x1, 1, 1)
#undef DW_TILE

static void dw_small_k(const ch_conv_desc *d, size_t len, const ch_real *dy, const ch_real *col,
                       ch_real *dw, bool first)
{
    const int K = (int)conv_k(d);
    for (int o = 0; o < d->oc; o += DW_OB) {
        const ch_real *dyo = dy + (size_t)o * len;
        ch_real *dwo = dw + (size_t)o * K;
        if (o + DW_OB <= d->oc) {
            int k = 0;
            for (; k + DW_KB <= K; k += DW_KB)
                dw_tile_4x4(dyo, col + (size_t)k * len, len, dwo + k, K, first);
            for (; k < K; k++) dw_tile_4x1(dyo, col + (size_t)k * len, len, dwo + k, K, first);
        } else {
            for (int a = o; a < d->oc; a++)
                for (int k = 0; k < K; k++)
                    dw_tile_1x1(dy + (size_t)a * len, col + (size_t)k * len, len,
                                dw + (size_t)a * K + k, K, first);
        }
    }
}

/* Accumulate one group's weight gradient into dw (oc, K) and db (oc); first: overwrite. */
static void backward_weights_group(const ch_kctx *kc, const ch_conv_desc *d, int gw,
                                   const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                   ch_real *db, const conv_scratch *sc, bool first)
{
    if (d->relu) ch_cpu_relu_backward_span((size_t)gw * d->oc * conv_p(d), y, dy, dy);
    const size_t K = conv_k(d), ld = (size_t)gw * conv_p(d);
    const ch_real *src = group_col(d, gw, x, sc);
    const ch_real *dyg = dy;
    if (gw > 1) {
        pack_dy(d, gw, dy, sc->packed);
        dyg = sc->packed;
    }
    if (K <= SMALL_K_MAX)
        dw_small_k(d, ld, dyg, src, dw, first);
    else
        ch_cpu_gemm(kc, false, true, d->oc, (int)K, (int)ld, 1, dyg, (int)ld, src, (int)ld,
                    first ? 0 : 1, dw, (int)K);
    if (!db) return;
    for (int o = 0; o < d->oc; o++) {
        const ch_real s = (ch_real)ch_cpu_sum(dyg + o * ld, ld);
        db[o] = first ? s : db[o] + s;
    }
}

/* Only where neither oneDNN's passes nor a grouped kernel come first in the two chains above, so
 * that a layer gets the kernels the two passes apart would give it. */
bool ch_cpu_conv2d_backward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                            const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx,
                            ch_real *dw, ch_real *db)
{
    if (ch_cpu_conv_is_grouped(d) || ch_cpu_dnnl_conv_takes(d, n)) return false;
    return ch_cpu_wino5_backward(kc, d, n, x, y, dy, w, dx, dw, db) ||
           ch_cpu_wino3_backward(kc, d, n, x, y, dy, w, dx, dw, db);
}

/* Thread t of T: its groups' sums, straight into dw alone, or into its partials, then its slice
 * of the partials' reduction in thread order. */
static void backward_weights_member(void *arg, int t, int T)
{
    const conv_team *m = arg;
    const ch_conv_desc *d = m->d;
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * conv_p(d);
    const size_t wl = (size_t)d->oc * conv_k(d);
    const conv_scratch sc = scratch_of(m->kc, d, t);
    ch_real *dw = m->out, *db = m->db;
    ch_real *pw = T == 1 ? dw : sc.dw, *pb = T == 1 ? db : (db ? sc.db : NULL);
    int lo, hi;
    thread_groups(m->sp, t, &lo, &hi);
    for (int q = lo; q < hi; q++) {
        const int s0 = q * m->sp->g, gw = group_width(m->sp, m->n, s0);
        backward_weights_group(m->kc, d, gw, m->x + s0 * xs, d->relu ? m->y + s0 * ys : NULL,
                               m->dy + s0 * ys, pw, pb, &sc, q == lo);
    }
    if (T == 1) return;
#pragma omp barrier
    const size_t pt = per_thread(d), off = (size_t)(sc.dw - sc.col);
#pragma omp for schedule(static)
    for (size_t i = 0; i < wl + (size_t)d->oc; i++) {
        if (i >= wl && !db) continue;
        ch_real acc = 0;
        for (int u = 0; u < T; u++) acc += m->kc->ws[pt * (size_t)u + off + i];
        if (i < wl) dw[i] = acc; else db[i - wl] = acc;
    }
}

void ch_cpu_conv2d_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                    const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                    ch_real *db)
{
    if (ch_cpu_conv_is_grouped(d)) {
        ch_cpu_conv_group_backward_weights(kc, d, n, x, y, dy, dw, db);
        return;
    }
    if (ch_cpu_conv_bf16w_backward_weights(kc, d, n, x, y, dy, dw, db) ||
        ch_cpu_conv_direct_backward_weights(kc, d, n, x, y, dy, dw, db) ||
        ch_cpu_wino_backward_weights(kc, d, n, x, y, dy, dw, db) ||
        ch_cpu_wino5_backward_weights(kc, d, n, x, y, dy, dw, db) ||
        ch_cpu_wino3_backward_weights(kc, d, n, x, y, dy, dw, db))
        return;
    const conv_split sp = conv_split_of(kc, d, n);
    if (n == 0) {
        no_grads(d, dw, db);
        return;
    }
    conv_team m = { .kc = kc, .d = d, .sp = &sp, .n = n, .x = x, .y = y, .out = dw, .dy = dy, .db = db };
    ch_cpu_team(sp.threads, backward_weights_member, &m);
}
