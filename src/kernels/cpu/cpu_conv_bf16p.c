/* 1x1 strided convolutions (resnet18's shortcuts: 1x1, stride 2) under --precision bf16: the
 * forward and backward data by bf16 GEMMs over chunks of samples; their weight gradient is
 * cpu_conv_bf16w.c's (the same columns, dW += dY col^T).
 * Why: in fp32 such a layer is im2col + sgemm with c (64 to 256) as the inner dimension, 150-270
 * GFLOP/s on 2 threads of the Zen 5, and oneDNN's bf16 direct kernel gained nothing on them (its
 * reorders cost what its products saved: docs/PERFORMANCE.md, bf16). Its columns are x at the
 * stride's positions, a quarter of x; rounded as they are gathered (the next plane prefetched, as
 * cpu_conv_bf16w.c does), one bf16 GEMM per chunk runs near oneDNN's bf16 rate.
 * How: each thread takes a contiguous run of the batch in chunks of about 1,024 output
 * positions, whole samples (ch_cpu_bf16_chunks, as cpu_conv_bf16w.c's pass). One GEMM shape,
 * made at plan time, serves every chunk: a short chunk's other columns hold whatever was there
 * (an earlier chunk's values, or the workspace's), and as each output column depends on its own
 * input column alone, only the live ones are written out.
 *  - forward: the chunk's columns (c rows) times W rounded to bf16 (each thread rounds a share of
 *    its rows, once per call), Y (oc x cols) written out per sample with the bias (and ReLU where
 *    fused), or rounded to bf16 where the layer writes its output so (conv2d_forward_bf16);
 *  - backward data: dy's planes rounded into columns, dX (c x cols) = W^T dY, then each sample's
 *    dx planes written whole: the products at the stride's positions, 0 elsewhere.
 * Rounding to nearest even, as cpu_conv_bf16w.c's; tests hold the results to the reference run on
 * the rounded operands. */
#include "kernels/cpu/cpu.h"

#include <stdint.h>
#include <string.h>

#ifndef CH_REAL_DOUBLE

enum { BP_ALIGN = 64, P_MAX = 14 * 14 };

typedef struct bp_geo {
    int T, ch, cols, rows;   /* threads, samples per chunk, columns, max(c, oc) */
    size_t p;                /* output positions per sample */
} bp_geo;

static size_t align_up(size_t b) { return (b + BP_ALIGN - 1) & ~(size_t)(BP_ALIGN - 1); }

bool ch_cpu_conv_bf16p_geometry(const ch_conv_desc *d)
{
    return d->bf16 && ch_conv_groups(d) == 1 && ch_conv_dilation(d) == 1 && d->kh == 1 && d->kw == 1 &&
           d->pad == 0 && d->stride >= 2 && d->c >= 16 && d->oc >= 16 &&
           (long)d->oh * d->ow <= P_MAX &&   /* resnet18's, the planes measured */
           ch_cpu_bf16_products(NULL, 0);
}

static bp_geo geo_of(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    bp_geo g;
    g.p = (size_t)d->oh * d->ow;
    ch_cpu_bf16_chunks(kc, n, g.p, &g.T, &g.ch);
    g.cols = g.ch * (int)g.p;
    g.rows = d->c > d->oc ? d->c : d->oc;
    return g;
}

/* forward: Y (oc x cols) = W (oc x c) col; backward data: dX (c x cols) = W^T dY. */
static ch_gemm_batch gemm_of(const ch_conv_desc *d, const bp_geo *g, bool data)
{
    const size_t wl = (size_t)d->oc * d->c;
    if (data)
        return (ch_gemm_batch){ .batch = 1, .m = d->c, .n = g->cols, .k = d->oc, .lda = d->c,
                                .ldb = g->cols, .ldc = g->cols, .sa = wl, .sb = (size_t)d->oc * g->cols,
                                .sc = (size_t)d->c * g->cols, .ta = true, .bf16 = true };
    return (ch_gemm_batch){ .batch = 1, .m = d->oc, .n = g->cols, .k = d->c, .lda = d->c, .ldb = g->cols,
                            .ldc = g->cols, .sa = wl, .sb = (size_t)d->c * g->cols,
                            .sc = (size_t)d->oc * g->cols, .bf16 = true };
}

static size_t gemm_scratch(const ch_kctx *kc, const ch_conv_desc *d, const bp_geo *g)
{
    const ch_gemm_batch f = gemm_of(d, g, false), b = gemm_of(d, g, true);
    const size_t a = ch_cpu_gemm_batch_scratch(kc, &f), c = ch_cpu_gemm_batch_scratch(kc, &b);
    return a > c ? a : c;
}

/* A thread's share: the chunk's columns in bf16, the GEMM's output, its scratch. */
typedef struct bp_share {
    uint16_t *in;
    ch_real *out;
    void *scratch;
} bp_share;

static size_t share_bytes(const bp_geo *g, size_t scratch)
{
    const size_t cells = (size_t)g->rows * g->cols;
    return align_up(sizeof(uint16_t) * cells) + align_up(sizeof(ch_real) * cells) + align_up(scratch);
}

/* The workspace: W in bf16, the threads' shares, the taps' positions. */
static size_t ws_bytes(const ch_conv_desc *d, const bp_geo *g, size_t scratch)
{
    return BP_ALIGN + align_up(sizeof(uint16_t) * (size_t)d->oc * d->c) + share_bytes(g, scratch) * (size_t)g->T +
           sizeof(int) * g->p;
}

static char *ws_base(const ch_kctx *kc)
{
    return (char *)(((uintptr_t)kc->ws + BP_ALIGN - 1) & ~(uintptr_t)(BP_ALIGN - 1));
}

static uint16_t *ws_weights(const ch_kctx *kc) { return (uint16_t *)ws_base(kc); }

static bp_share share_of(const ch_kctx *kc, const ch_conv_desc *d, const bp_geo *g, size_t scratch, int t)
{
    char *at = ws_base(kc) + align_up(sizeof(uint16_t) * (size_t)d->oc * d->c) + share_bytes(g, scratch) * (size_t)t;
    const size_t cells = (size_t)g->rows * g->cols;
    bp_share s;
    s.in = (uint16_t *)at, at += align_up(sizeof(uint16_t) * cells);
    s.out = (ch_real *)at, at += align_up(sizeof(ch_real) * cells);
    s.scratch = at;
    return s;
}

static bool takes(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    if (n <= 0 || !ch_cpu_conv_bf16p_geometry(d)) return false;
    const bp_geo g = geo_of(kc, d, n);
    const ch_gemm_batch f = gemm_of(d, &g, false), b = gemm_of(d, &g, true);
    return ch_cpu_gemm_batch_fast(kc, &f) && ch_cpu_gemm_batch_fast(kc, &b);
}

size_t ch_cpu_conv_bf16p_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    if (!takes(kc, d, n)) return 0;
    const bp_geo g = geo_of(kc, d, n);
    return (ws_bytes(d, &g, gemm_scratch(kc, d, &g)) + sizeof(ch_real) - 1) / sizeof(ch_real);
}

/* What the team shares (ch_cpu_team's arg). */
typedef struct bp_team {
    const ch_kctx *kc;
    const ch_conv_desc *d;
    const bp_geo *g;
    size_t scratch;
    const int *taps;
    int n;
    const ch_real *in, *w, *b;   /* x (forward) or dy (data); W; the bias */
    ch_real *out;                /* y (forward, unless out16) or dx */
    uint16_t *out16;             /* forward: y rounded to bf16 */
    bool data;
} bp_team;

/* Sample s of the chunk's Y: its oc planes, + bias, ReLU where fused, as fp32 or rounded. */
static void write_y(const bp_team *m, const ch_real *Y, int s, size_t at)
{
    const ch_conv_desc *d = m->d;
    const size_t P = m->g->p;
    for (int o = 0; o < d->oc; o++) {
        const ch_real *from = Y + (size_t)o * m->g->cols + (size_t)s * P;
        const ch_real *b = m->b ? m->b + o : NULL;
        if (m->out16) {
            ch_cpu_round_plane(from, P, b, d->relu, m->out16 + at + (size_t)o * P);
            continue;
        }
        ch_real *to = m->out + at + (size_t)o * P;
        for (size_t q = 0; q < P; q++) {
            const ch_real v = b ? from[q] + *b : from[q];   /* no bias: the value as it is (-0 stays) */
            to[q] = d->relu && v < 0 ? 0 : v;               /* NaN passes, as in ch_cpu_relu_span */
        }
    }
}

/* Sample s of the chunk's dX into its dx planes (c x h x w): the products at the stride's
 * positions, 0 elsewhere. */
static void write_dx(const bp_team *m, const ch_real *dX, int s, ch_real *dx)
{
    const ch_conv_desc *d = m->d;
    const size_t P = m->g->p, hw = (size_t)d->h * d->w;
    for (int c = 0; c < d->c; c++) {
        const ch_real *from = dX + (size_t)c * m->g->cols + (size_t)s * P;
        ch_real *plane = dx + (size_t)c * hw;
        memset(plane, 0, sizeof(ch_real) * hw);
        for (int oh = 0; oh < d->oh; oh++) {
            ch_real *row = plane + (size_t)oh * d->stride * d->w;
            for (int ow = 0; ow < d->ow; ow++) row[(size_t)ow * d->stride] = from[(size_t)oh * d->ow + ow];
        }
    }
}

/* Thread t's share of W's rows rounded to bf16 (W as stored, oc x c). */
static void round_weights(const bp_team *m, int t, int T)
{
    const size_t wl = (size_t)m->d->oc * m->d->c;
    const size_t lo = wl * (size_t)t / (size_t)T, hi = wl * (size_t)(t + 1) / (size_t)T;
    ch_cpu_bf16_planes(1, hi - lo, 0, m->w + lo, 0, ws_weights(m->kc) + lo);
}

static void bp_member(void *arg, int t, int T)
{
    const bp_team *m = arg;
    const ch_conv_desc *d = m->d;
    const bp_geo *g = m->g;
    round_weights(m, t, T);
#pragma omp barrier
    const bp_share sh = share_of(m->kc, d, g, m->scratch, t);
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * g->p;
    const int s0 = (int)((long)m->n * t / T), s1 = (int)((long)m->n * (t + 1) / T);
    const ch_gemm_batch gb = gemm_of(d, g, m->data);
    for (int a = s0; a < s1; a += g->ch) {
        const int live = s1 - a < g->ch ? s1 - a : g->ch;
        for (int s = 0; s < live; s++) {
            if (m->data) ch_cpu_bf16_planes(d->oc, g->p, (size_t)g->cols, m->in + (size_t)(a + s) * ys, s, sh.in);
            else ch_cpu_bf16_cols(d, (size_t)g->cols, m->taps, m->in + (size_t)(a + s) * xs, s, sh.in);
        }
        ch_cpu_gemm_batch_bf16(m->kc, &gb, ws_weights(m->kc), sh.in, sh.out, sh.scratch);
        for (int s = 0; s < live; s++) {
            if (m->data) write_dx(m, sh.out, s, m->out + (size_t)(a + s) * xs);
            else write_y(m, sh.out, s, (size_t)(a + s) * ys);
        }
    }
}

static bool run(const ch_kctx *kc, const ch_conv_desc *d, int n, bp_team *m)
{
    if (!takes(kc, d, n) || !kc->ws) return false;
    const bp_geo g = geo_of(kc, d, n);
    const size_t scratch = gemm_scratch(kc, d, &g);
    if (ws_bytes(d, &g, scratch) > kc->ws_len * sizeof(ch_real)) return false;
    int *taps = (int *)((char *)share_of(kc, d, &g, scratch, g.T).in);   /* past the last share */
    ch_cpu_bf16_taps(d, taps);
    m->kc = kc, m->d = d, m->g = &g, m->scratch = scratch, m->taps = taps, m->n = n;
    ch_cpu_team(g.T, bp_member, m);
    return true;
}

bool ch_cpu_conv_bf16p_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                               const ch_real *w, const ch_real *b, ch_real *y, uint16_t *y16)
{
    bp_team m = { .in = x, .w = w, .b = b, .out = y, .out16 = y16 };
    return run(kc, d, n, &m);
}

bool ch_cpu_conv_bf16p_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                     const ch_real *w, ch_real *dx)
{
    bp_team m = { .in = dy, .w = w, .out = dx, .data = true };
    return run(kc, d, n, &m);
}

#else

bool ch_cpu_conv_bf16p_geometry(const ch_conv_desc *d)
{
    (void)d;
    return false;
}

size_t ch_cpu_conv_bf16p_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    (void)kc, (void)d, (void)n;
    return 0;
}

bool ch_cpu_conv_bf16p_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                               const ch_real *w, const ch_real *b, ch_real *y, uint16_t *y16)
{
    (void)kc, (void)d, (void)n, (void)x, (void)w, (void)b, (void)y, (void)y16;
    return false;
}

bool ch_cpu_conv_bf16p_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                     const ch_real *w, ch_real *dx)
{
    (void)kc, (void)d, (void)n, (void)dy, (void)w, (void)dx;
    return false;
}

#endif
