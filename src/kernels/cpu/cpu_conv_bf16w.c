/* The weight gradient of a --precision bf16 direct layer (one that oneDNN's bf16 convolution
 * takes: resnet18's 3x3 stride-2 layers) by im2col and a bf16 GEMM, where that is the faster.
 * Why: oneDNN 2.6's bf16 backward-weights kernel (`jit_bf16:avx512_core_bf16`) runs at about half
 * its forward's rate on the same layer (Zen 5, batch 256, 2 threads, ONEDNN_VERBOSE, in training:
 * 128@14x14 -> 256 20.8 ms against 9.7 forward, 256@7x7 -> 512 30.4 against 15.9), and needs x and
 * dy reordered into its blocked layout first. The same sum as one GEMM per chunk of samples,
 * dW (oc x c*kh*kw) += dY (oc x cols) col^T, runs in oneDNN's bf16 matmul near its GEMM rate.
 * How: each thread takes a contiguous run of the batch and goes through it in chunks of CH
 * samples. A chunk's columns are its samples' output positions, CH * oh * ow of them (a short
 * last chunk padded with zero columns, so that every GEMM has one shape, made at plan time):
 * col^T (c*kh*kw rows) takes x's taps rounded to bf16, written along the rows from NCHW x with
 * no transpose; dY^T (oc rows) takes dy's planes rounded to bf16. The thread's GEMMs add into its
 * partial dW (or straight into dw with one thread); after a barrier each thread adds its slice
 * of the partials in thread order, so a split gives the same bits every run. db is summed from
 * the rounded dy the GEMMs read, as oneDNN's pass did. The rounding is to nearest even, as
 * oneDNN's reorders rounded (ch_bf16_from_float's for dy; for x, where the build has AVX512-BF16,
 * the instruction's, which also flushes subnormals to zero): tests hold the result to the
 * reference run on rounded operands. */
#include "kernels/cpu/cpu.h"

#include <stdint.h>
#include <string.h>

#include "core/bf16.h"

#if defined(__AVX512BF16__) && defined(__AVX512VL__)
#include <immintrin.h>
#endif

#ifndef CH_REAL_DOUBLE

enum { BW_ALIGN = 64, BW_COLS = 1024 };   /* a chunk's columns: about this many */

typedef struct bw_geo {
    int T, ch, cols, k;   /* threads, samples per chunk, columns (ch * p), c*kh*kw */
    size_t p;             /* output positions per sample */
} bw_geo;

static size_t align_up(size_t b) { return (b + BW_ALIGN - 1) & ~(size_t)(BW_ALIGN - 1); }

void ch_cpu_bf16_chunks(const ch_kctx *kc, int n, size_t p, int *T, int *ch)
{
    int t = kc->nthreads < 1 ? 1 : kc->nthreads;
    if (t > n) t = n > 0 ? n : 1;
    const int per = (n + t - 1) / t;
    int c = (int)((BW_COLS + p - 1) / p);
    if (c > per) c = per > 0 ? per : 1;
    *T = t, *ch = c;
}

static bw_geo geo_of(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    bw_geo g;
    g.p = (size_t)d->oh * d->ow;
    ch_cpu_bf16_chunks(kc, n, g.p, &g.T, &g.ch);
    g.cols = g.ch * (int)g.p;
    g.k = d->c * d->kh * d->kw;
    return g;
}

static ch_gemm_batch gemm_of(const ch_conv_desc *d, const bw_geo *g, bool accumulate)
{
    return (ch_gemm_batch){ .batch = 1, .m = d->oc, .n = g->k, .k = g->cols, .lda = g->cols,
                            .ldb = g->cols, .ldc = g->k, .sa = (size_t)d->oc * g->cols,
                            .sb = (size_t)g->k * g->cols, .sc = (size_t)d->oc * g->k, .tb = true,
                            .accumulate = accumulate, .bf16 = true };
}

/* A thread's share of the workspace, in bytes: col^T, dY^T, the partial dW and db, the GEMM's
 * scratch. */
typedef struct bw_share {
    uint16_t *col, *dyt;
    ch_real *dw;
    double *db;   /* the thread's sums of its rounded dy per channel */
    void *scratch;
} bw_share;

static size_t gemm_scratch(const ch_kctx *kc, const ch_conv_desc *d, const bw_geo *g)
{
    const ch_gemm_batch first = gemm_of(d, g, false), then = gemm_of(d, g, true);
    const size_t a = ch_cpu_gemm_batch_scratch(kc, &first), b = ch_cpu_gemm_batch_scratch(kc, &then);
    return a > b ? a : b;
}

static size_t share_bytes(const ch_conv_desc *d, const bw_geo *g, size_t scratch)
{
    return align_up(sizeof(uint16_t) * (size_t)g->k * g->cols) +
           align_up(sizeof(uint16_t) * (size_t)d->oc * g->cols) +
           align_up(sizeof(ch_real) * (size_t)d->oc * g->k) + align_up(sizeof(double) * (size_t)d->oc) +
           align_up(scratch);
}

static bw_share share_of(const ch_kctx *kc, const ch_conv_desc *d, const bw_geo *g, size_t scratch,
                         int t)
{
    char *at = (char *)(((uintptr_t)kc->ws + BW_ALIGN - 1) & ~(uintptr_t)(BW_ALIGN - 1));
    at += share_bytes(d, g, scratch) * (size_t)t;
    bw_share s;
    s.col = (uint16_t *)at, at += align_up(sizeof(uint16_t) * (size_t)g->k * g->cols);
    s.dyt = (uint16_t *)at, at += align_up(sizeof(uint16_t) * (size_t)d->oc * g->cols);
    s.dw = (ch_real *)at, at += align_up(sizeof(ch_real) * (size_t)d->oc * g->k);
    s.db = (double *)at, at += align_up(sizeof(double) * (size_t)d->oc);
    s.scratch = at;
    return s;
}

/* Where it was measured the faster: output planes up to 14x14 (resnet18's; larger ones are
 * unmeasured and keep oneDNN's). */
static bool wins(const ch_conv_desc *d)
{
    return (long)d->oh * d->ow <= 14 * 14;
}

/* The workspace: the threads' shares, then the taps' positions (tap_index's). */
static size_t ws_bytes(const ch_conv_desc *d, const bw_geo *g, size_t scratch)
{
    return BW_ALIGN + share_bytes(d, g, scratch) * (size_t)g->T +
           sizeof(int) * (size_t)d->kh * d->kw * g->p;
}

/* The layers it takes, and whether every GEMM has oneDNN's fast kernel. */
static bool takes(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    if (n <= 0 || !(ch_cpu_conv_bf16_direct(d) || ch_cpu_conv_bf16p_geometry(d)) || !wins(d)) return false;
    const bw_geo g = geo_of(kc, d, n);
    const ch_gemm_batch first = gemm_of(d, &g, false), then = gemm_of(d, &g, true);
    return ch_cpu_gemm_batch_fast(kc, &first) && ch_cpu_gemm_batch_fast(kc, &then);
}

size_t ch_cpu_conv_bf16w_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    if (!takes(kc, d, n)) return 0;
    const bw_geo g = geo_of(kc, d, n);
    const size_t bytes = ws_bytes(d, &g, gemm_scratch(kc, d, &g));
    return (bytes + sizeof(ch_real) - 1) / sizeof(ch_real);
}

/* For tap (i, j), where each output position q reads the plane: tap[q] = ih * w + iw, or -1 in
 * the padding. */
static void tap_index(const ch_conv_desc *d, int i, int j, int *tap)
{
    for (int oh = 0; oh < d->oh; oh++)
        for (int ow = 0; ow < d->ow; ow++) {
            const int ih = oh * d->stride - d->pad + i, iw = ow * d->stride - d->pad + j;
            tap[oh * d->ow + ow] = ih >= 0 && ih < d->h && iw >= 0 && iw < d->w ? ih * d->w + iw : -1;
        }
}

void ch_cpu_bf16_taps(const ch_conv_desc *d, int *taps)
{
    const size_t P = (size_t)d->oh * d->ow;
    for (int i = 0; i < d->kh; i++)
        for (int j = 0; j < d->kw; j++) tap_index(d, i, j, taps + (size_t)(i * d->kw + j) * P);
}

/* Reading x is most of building the columns, and this CPU's (Zen 5's, in its VM) own prefetching
 * does not run ahead of it: asking for channel c + 1's plane while channel c's taps are moved cut
 * the columns' time of 64@28x28 -> 128 from ~8 to ~3.5 ms a thread (bench/conv_kernels, the weight
 * pass 19.5 -> 15.2 ms; docs/PERFORMANCE.md). */
static void prefetch_plane(const ch_real *plane, size_t len)
{
    const char *at = (const char *)plane;
    for (size_t b = 0; b < sizeof(ch_real) * len; b += 64) __builtin_prefetch(at + b, 0, 3);
}

#if defined(__AVX512BF16__) && defined(__AVX512VL__) && defined(__AVX512BW__)
/* Stride 2, a kernel 3 wide or more, output rows of 12 to 16 and input rows of at most 32
 * (resnet18's 64@28x28 -> 128): output ow of tap j reads column 2*ow - pad + j, which is lane
 * ow + off of the row's even or odd columns (phase (j - pad) & 1, off = (j - pad - phase) / 2), so
 * each input row is split into its two phases once (two loads, two permutes, two roundings) and
 * every tap's output row is one of them moved by off lanes (-1, 0 or 1). The same bits as the
 * gather below, 0 in the padding; at 28x28 -> 14x14 the columns take 40% less time, on narrower
 * rows (7 and 4 outputs) the gather's fewer, wider steps are the faster. */
static bool rows_split(const ch_conv_desc *d)
{
    return d->stride == 2 && d->kw >= 3 && d->ow >= 12 && d->ow <= 16 && d->w <= 32 && d->pad <= 2 &&
           d->kw - 1 - d->pad <= 3;
}

/* The row's columns 2k + phase (k < 16), rounded; 0 past w. */
static void row_phases(const ch_real *row, int w, __m256i *even, __m256i *odd)
{
    const __mmask16 m0 = (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1);
    const __mmask16 m1 = (__mmask16)(w <= 16 ? 0 : w >= 32 ? 0xffff : (1u << (w - 16)) - 1);
    const __m512 lo = _mm512_maskz_loadu_ps(m0, row), hi = _mm512_maskz_loadu_ps(m1, row + 16);
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    *even = (__m256i)_mm512_cvtneps_pbh(_mm512_permutex2var_ps(lo, ie, hi));
    *odd = (__m256i)_mm512_cvtneps_pbh(_mm512_permutex2var_ps(lo, io, hi));
}

/* v's lanes moved by off: lane k gets lane k + off, 0 where that is outside 0..15. */
static __m256i lanes_moved(__m256i v, int off)
{
    if (off == 0) return v;
    const __m256i k = _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m256i at = _mm256_add_epi16(k, _mm256_set1_epi16((short)off));
    return _mm256_maskz_permutexvar_epi16(off < 0 ? (__mmask16)0xfffe : (__mmask16)0x7fff, at, v);
}

static void sample_cols_split(const ch_conv_desc *d, size_t ld, const ch_real *xs, int s, uint16_t *col)
{
    const int kk = d->kh * d->kw, P = d->oh * d->ow;
    const size_t hw = (size_t)d->h * d->w;
    const __mmask16 out = (__mmask16)((1u << d->ow) - 1);
    for (int c = 0; c < d->c; c++) {
        const ch_real *plane = xs + (size_t)c * hw;
        if (c + 1 < d->c) prefetch_plane(plane + hw, hw);
        for (int oh = 0; oh < d->oh; oh++)
            for (int i = 0; i < d->kh; i++) {
                const int ih = 2 * oh - d->pad + i;
                __m256i ph[2] = { _mm256_setzero_si256(), _mm256_setzero_si256() };
                if (ih >= 0 && ih < d->h) row_phases(plane + (size_t)ih * d->w, d->w, &ph[0], &ph[1]);
                for (int j = 0; j < d->kw; j++) {
                    const int e = j - d->pad, phase = e & 1, off = (e - phase) / 2;
                    uint16_t *to = col + (size_t)(c * kk + i * d->kw + j) * ld + (size_t)s * P + (size_t)oh * d->ow;
                    _mm256_mask_storeu_epi16(to, out, lanes_moved(ph[phase], off));
                }
            }
    }
}
#endif

/* Sample s's rows of col^T from its planes xs (c x h x w): row (c, i, j), columns s*p .., the
 * tap (i, j) of every output position (taps: tap_index's, kh*kw of p each), 0 in the padding.
 * With AVX-512, 16 positions at a time by a masked gather from the plane (in L1: every tap of a
 * channel reads the same plane): a run along each output row moved 4 to 14 values a step on
 * resnet18's stride-2 layers. */
void ch_cpu_bf16_cols(const ch_conv_desc *d, size_t ld, const int *taps, const ch_real *xs, int s, uint16_t *col)
{
    const int kk = d->kh * d->kw, P = d->oh * d->ow;
    const size_t hw = (size_t)d->h * d->w;
#if defined(__AVX512BF16__) && defined(__AVX512VL__) && defined(__AVX512BW__)
    if (rows_split(d)) {
        sample_cols_split(d, ld, xs, s, col);
        return;
    }
#endif
    for (int c = 0; c < d->c; c++) {
        const ch_real *plane = xs + (size_t)c * hw;
        if (c + 1 < d->c) prefetch_plane(plane + hw, hw);
        for (int t = 0; t < kk; t++) {
            uint16_t *row = col + (size_t)(c * kk + t) * ld + (size_t)s * P;
            const int *tap = taps + (size_t)t * P;
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
            for (int q = 0; q < P; q += 16) {
                const __mmask16 live = (__mmask16)(P - q >= 16 ? 0xffff : (1u << (P - q)) - 1);
                const __m512i at = _mm512_maskz_loadu_epi32(live, tap + q);
                const __mmask16 in = _mm512_mask_cmpge_epi32_mask(live, at, _mm512_setzero_si512());
                const __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in, at, plane, 4);
                _mm256_mask_storeu_epi16(row + q, live, (__m256i)_mm512_cvtneps_pbh(v));
            }
#else
            for (int q = 0; q < P; q++) row[q] = tap[q] < 0 ? 0 : ch_bf16_from_float((float)plane[tap[q]]);
#endif
        }
    }
}

void ch_cpu_bf16_planes(int rows, size_t p, size_t ld, const ch_real *src, int s, uint16_t *dst)
{
    for (int o = 0; o < rows; o++) {
        const ch_real *from = src + (size_t)o * p;
        uint16_t *to = dst + (size_t)o * ld + (size_t)s * p;
#pragma omp simd
        for (size_t q = 0; q < p; q++) to[q] = ch_bf16_from_float((float)from[q]);
    }
}

/* What the team shares (ch_cpu_team's arg). */
typedef struct bw_team {
    const ch_kctx *kc;
    const ch_conv_desc *d;
    const bw_geo *g;
    size_t scratch;
    const int *taps;   /* tap_index's, for every tap */
    int n;
    const ch_real *x, *y;
    ch_real *dy, *dw, *db;
} bw_team;

/* Adds each row of the chunk's dY^T (its first len columns: the rounded dy the GEMM reads, as
 * oneDNN's pass summed it) into db. */
static void add_bias_sums(const ch_conv_desc *d, const bw_geo *g, const uint16_t *dyt, size_t len,
                          double *db)
{
    for (int o = 0; o < d->oc; o++) {
        const uint16_t *row = dyt + (size_t)o * g->cols;
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (size_t q = 0; q < len; q++) acc += ch_bf16_to_float(row[q]);
        db[o] += acc;
    }
}

void ch_cpu_bf16_zero_tail(uint16_t *m, int rows, size_t cols, size_t from)
{
    for (int r = 0; r < rows; r++) memset(m + (size_t)r * cols + from, 0, sizeof(uint16_t) * (cols - from));
}

/* The thread's samples [s0, s1) (never empty: geo_of's team is at most n), dy masked by the fused ReLU, its chunks' GEMMs into dw, and
 * where bias, its sums of dy into sh->db. */
static void thread_sums(const bw_team *m, const bw_share *sh, int s0, int s1, ch_real *dw, bool bias)
{
    const ch_conv_desc *d = m->d;
    const bw_geo *g = m->g;
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * g->p;
    ch_real *dy = m->dy + (size_t)s0 * ys;
    if (d->relu) ch_cpu_relu_backward_span((size_t)(s1 - s0) * ys, m->y + (size_t)s0 * ys, dy, dy);
    if (bias) memset(sh->db, 0, sizeof(double) * (size_t)d->oc);
    for (int a = s0; a < s1; a += g->ch) {
        const int live = s1 - a < g->ch ? s1 - a : g->ch;
        for (int s = 0; s < live; s++) {
            ch_cpu_bf16_cols(d, (size_t)g->cols, m->taps, m->x + (size_t)(a + s) * xs, s, sh->col);
            ch_cpu_bf16_planes(d->oc, g->p, (size_t)g->cols, m->dy + (size_t)(a + s) * ys, s, sh->dyt);
        }
        if (live < g->ch) {   /* zero columns: they add nothing */
            ch_cpu_bf16_zero_tail(sh->col, g->k, (size_t)g->cols, (size_t)live * g->p);
            ch_cpu_bf16_zero_tail(sh->dyt, d->oc, (size_t)g->cols, (size_t)live * g->p);
        }
        const ch_gemm_batch gb = gemm_of(d, g, a != s0);
        ch_cpu_gemm_batch_bf16(m->kc, &gb, sh->dyt, sh->col, dw, sh->scratch);
        if (bias) add_bias_sums(d, g, sh->dyt, (size_t)live * g->p, sh->db);
    }
}

/* dw[lo, hi) = the threads' partials added in thread order (0 + p0 is p0: the bits of a sum
 * element by element), a slice at a time. A share's place was computed per element and thread
 * before: 8% of resnet18.s4's three passes (`bench/conv_kernels`, perf). */
static void add_partials(const bw_team *m, int T, size_t lo, size_t hi)
{
    ch_real *restrict dw = m->dw;
    memcpy(dw + lo, share_of(m->kc, m->d, m->g, m->scratch, 0).dw + lo, sizeof(ch_real) * (hi - lo));
    for (int u = 1; u < T; u++) {
        const ch_real *restrict part = share_of(m->kc, m->d, m->g, m->scratch, u).dw;
#pragma omp simd
        for (size_t i = lo; i < hi; i++) dw[i] += part[i];
    }
}

/* Thread t of T: its samples' sums, then its slice of dw (and db) from the partials. */
static void bw_member(void *arg, int t, int T)
{
    const bw_team *m = arg;
    const ch_conv_desc *d = m->d;
    const bw_share sh = share_of(m->kc, d, m->g, m->scratch, t);
    const int s0 = (int)((long)m->n * t / T), s1 = (int)((long)m->n * (t + 1) / T);
    thread_sums(m, &sh, s0, s1, T == 1 ? m->dw : sh.dw, m->db != NULL);
    if (T > 1) {
#pragma omp barrier
        const size_t wl = (size_t)d->oc * m->g->k, lo = wl * (size_t)t / (size_t)T;
        const size_t hi = wl * (size_t)(t + 1) / (size_t)T;
        add_partials(m, T, lo, hi);
    }
    for (int o = t; m->db && o < d->oc; o += T) {
        double acc = 0;
        for (int u = 0; u < T; u++) acc += share_of(m->kc, d, m->g, m->scratch, u).db[o];
        m->db[o] = (ch_real)acc;
    }
}

bool ch_cpu_conv_bf16w_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                        const ch_real *x, const ch_real *y, ch_real *dy,
                                        ch_real *dw, ch_real *db)
{
    if (!takes(kc, d, n) || !kc->ws) return false;
    const bw_geo g = geo_of(kc, d, n);
    const size_t scratch = gemm_scratch(kc, d, &g);
    if (ws_bytes(d, &g, scratch) > kc->ws_len * sizeof(ch_real)) return false;
    int *taps = (int *)((char *)share_of(kc, d, &g, scratch, g.T).col);   /* past the last share */
    ch_cpu_bf16_taps(d, taps);
    bw_team m = { .kc = kc, .d = d, .g = &g, .scratch = scratch, .taps = taps, .n = n, .x = x, .y = y,
                  .dy = dy, .dw = dw, .db = db };
    ch_cpu_team(g.T, bw_member, &m);
    return true;
}

#else

size_t ch_cpu_conv_bf16w_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    (void)kc, (void)d, (void)n;
    return 0;
}

bool ch_cpu_conv_bf16w_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                        const ch_real *x, const ch_real *y, ch_real *dy,
                                        ch_real *dw, ch_real *db)
{
    (void)kc, (void)d, (void)n, (void)x, (void)y, (void)dy, (void)dw, (void)db;
    return false;
}

#endif
