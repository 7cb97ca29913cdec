/* The body of a hand-written Winograd convolution F(WM x WM, WR x WR), all three passes, with a
 * group of TB samples in the vector lanes: cpu_wino5.c (F(3x3, 5x5)) and cpu_wino3.c (F(4x4, 3x3))
 * each define the sizes, the matrices' transforms and the names, then include this. What it does
 * and why is told at the top of cpu_wino5.c, the first of them. Its parts: the sample lanes and
 * their transposes (wino_lanes.h), then here the chunks, scratch and the forward and backward data
 * passes, then the passes that make the weights' gradient (wino_grads.h).
 * The including file defines, before it:
 *   WM, WR, WA = WM + WR - 1, NP = WA * WA, TB (lanes), WINO_POS (tile positions per chunk at
 *   most), WINO_COLS = WINO_POS * TB, WINO_MIN_C and WINO_MIN_OC (the smallest layer it takes);
 *   G[WA][WR]; bt_lanes, btt_lanes (BT and its transpose), at_lanes, att_lanes (AT and its
 *   transpose), each a 1-D transform on TB lanes (input k of lane j at in[k*is + j], output i at
 *   out[i*os + j]); and WINO_FN(name), its public names. */
#ifndef WINO_FN
#error "wino_body.h is included by a file that defines the transform first"
#endif

#include <stdint.h>
#include <string.h>

#include "core/bf16.h"

#if defined(__AVX512BF16__) && !defined(CH_REAL_DOUBLE)
#include <immintrin.h>
#endif

#include "kernels/cpu/wino_lanes.h"

/* The 2-D transforms. Windows and blocks are read from (and dx's windows added into) a group's
 * planes, whose element (r, c) is the vector at r*rs + c*TB; a chunk buffer's point p of a row is
 * at p*ps from the row's lanes. */
static void transform_in(const ch_real *restrict win, size_t rs, ch_real *restrict out, size_t ps)
{
    ch_real t[NP * TB];
    for (int m = 0; m < WA; m++) bt_lanes(win + m * TB, rs, t + m * TB, WA * TB);
    for (int i = 0; i < WA; i++) bt_lanes(t + i * WA * TB, TB, out + i * WA * ps, ps);
}

static void adjoint_in_add(const ch_real *restrict in, size_t ps, ch_real *restrict win, size_t rs)
{
    ch_real t[NP * TB], out[NP * TB];
    for (int j = 0; j < WA; j++) btt_lanes(in + j * ps, WA * ps, t + j * TB, WA * TB);
    for (int k = 0; k < WA; k++) btt_lanes(t + k * WA * TB, TB, out + k * WA * TB, TB);
    for (int a = 0; a < WA; a++)
        for (int b = 0; b < WA; b++) {
            ch_real *to = win + a * rs + b * TB;
            const ch_real *from = out + (a * WA + b) * TB;
#pragma omp simd
            for (int l = 0; l < TB; l++) to[l] += from[l];
        }
}

/* AT M AT^T for one row of a chunk, + bias, ReLU if fused, stored as a WM x WM block of vectors:
 * into blk, or where blk16 is not NULL rounded to bf16 there (lanes_to_bf16) instead. */
static void transform_out(const ch_real *restrict in, size_t ps, ch_real bias, bool relu,
                          ch_real *restrict blk, uint16_t *restrict blk16, size_t rs)
{
    ch_real t[WM * WA * TB];
    for (int m = 0; m < WA; m++) at_lanes(in + m * ps, WA * ps, t + m * TB, WA * TB);
    for (int i = 0; i < WM; i++) {
        ch_real out[WM * TB];
        at_lanes(t + i * WA * TB, TB, out, TB);
        for (int j = 0; j < WM; j++) {
            ch_real v[TB];
#pragma omp simd
            for (int l = 0; l < TB; l++) {
                const ch_real x = out[j * TB + l] + bias;
                v[l] = relu && x < 0 ? 0 : x;   /* NaN passes, as in ch_cpu_relu_span */
            }
            if (blk16) lanes_to_bf16(v, blk16 + i * rs + j * TB);
            else memcpy(blk + i * rs + j * TB, v, sizeof v);
        }
    }
}

static void transform_dy_block(const ch_real *restrict blk, size_t rs, ch_real *restrict out,
                               size_t ps)
{
    ch_real t[WA * WM * TB];
    for (int j = 0; j < WM; j++) att_lanes(blk + j * TB, rs, t + j * TB, WM * TB);
    for (int k = 0; k < WA; k++) att_lanes(t + k * WM * TB, TB, out + k * WA * ps, ps);
}

/* The n x n vectors at `in` (rows rs apart) of planes held in bf16, widened (exactly) into `out`
 * (rows n * TB apart), for the transforms above: a window, or a block, in L1. */
static void widen_square(const uint16_t *restrict in, size_t rs, int n, ch_real *restrict out)
{
    for (int a = 0; a < n; a++)
#pragma omp simd
        for (int l = 0; l < n * TB; l++) out[a * n * TB + l] = (ch_real)ch_bf16_to_float(in[a * rs + l]);
}

static void transform_in16(const uint16_t *restrict win, size_t rs, ch_real *restrict out, size_t ps)
{
    ch_real w[NP * TB];
    widen_square(win, rs, WA, w);
    transform_in(w, WA * TB, out, ps);
}

static void transform_dy_block16(const uint16_t *restrict blk, size_t rs, ch_real *restrict out, size_t ps)
{
    ch_real b[WM * WM * TB];
    widen_square(blk, rs, WM, b);
    transform_dy_block(b, WM * TB, out, ps);
}

/* bf16 products (products_in_bf16): a tile's NP transformed points, computed in fp32 into t
 * (point p's lanes at p*TB), rounded to bf16 into a chunk buffer of bf16 at p*ps. Rounding the
 * tile while it is in L1 instead of the chunk after it: a pass over the chunk (1.5 MB at 64
 * channels) would read it back from L3. Where the build has AVX512-BF16 (-march=native on a CPU
 * with it), one vcvtneps2bf16 a point: to nearest even, a NaN kept a NaN (quiet), as
 * ch_bf16_from_float, but subnormal values (below 1.2e-38) flushed to zero, as oneDNN's own
 * conversions and PyTorch's CPU autocast do; against the integer sequence it replaces, resnet18's
 * bf16 F(4x4, 3x3) forwards 5-15% faster (docs/PERFORMANCE.md, "bf16"). Elsewhere
 * ch_bf16_from_float's rounding, vectorised: lanes_to_bf16 rounds each point. */
static void store_points_bf16(const ch_real *restrict t, uint16_t *restrict out, size_t ps)
{
    for (int p = 0; p < NP; p++) lanes_to_bf16(t + p * TB, out + p * ps);
}

/* The layer's tiling: tiles of WM x WM outputs at ty x tx positions per sample (the last row and
 * column clipped). A group's x (or dx) is held as c planes of xh x xw vectors, padded so that
 * every tile's WA x WA window lies inside (origin at (-pad, -pad)); its y (or dy) as oc planes of
 * yh x yw vectors (whole tiles). The positions of `G` consecutive groups (a run: positions
 * numbered group by group, G * pos of them) go through the GEMMs in chunks of at most WINO_POS:
 * G is 1 but for bf16 products on planes of fewer than WINO_POS positions, where one group's few
 * columns made GEMMs that read all of U per 16 samples (512@4x4: one tile per sample, 16 columns). */
typedef struct wgeo {
    const ch_conv_desc *d;
    int ty, tx, pos, G, span;
    int xh, xw, yh, yw;
    bool bf16;        /* the point GEMMs multiply bf16 (products_in_bf16) */
    size_t scratch;   /* the GEMMs' scratch per thread, in elements */
} wgeo;

/* Whether chunks of `positions` spread their NP points over the cache. A chunk buffer's point
 * stride is rows x positions vectors of 64 bytes (see point_stride); the transforms write a tile's
 * NP points at that stride, and where it is a multiple of 16 or more lines they fall into 4 or
 * fewer of L1's 64 sets and evict each other: mnist-cnn's 20 x 8 positions (160 lines) made
 * both input transforms 1.5-2x slower than 20 x 9. */
static bool spreads(int rows, int positions)
{
    return (rows * positions) % 16 != 0;
}

/* Positions per chunk, for `chunks` chunks of a group's pos: the fewest that fit, unless that
 * or the last chunk's rest does not spread and a larger one (up to WINO_POS) does. */
static int chunk_positions(const ch_conv_desc *d, int pos, int chunks)
{
    const int even = (pos + chunks - 1) / chunks;
    for (int s = even; s <= WINO_POS && s * (chunks - 1) < pos; s++) {
        const int rest = pos - s * (chunks - 1);
        if (spreads(d->c, s) && spreads(d->oc, s) && spreads(d->c, rest) && spreads(d->oc, rest))
            return s;
    }
    return even;
}

static bool products_in_bf16(const ch_conv_desc *d);

static wgeo tiling_of(const ch_conv_desc *d)
{
    wgeo g = { .d = d, .ty = (d->oh + WM - 1) / WM, .tx = (d->ow + WM - 1) / WM,
               .bf16 = products_in_bf16(d) };
    g.pos = g.ty * g.tx;
    g.G = g.bf16 && g.pos < WINO_POS ? WINO_POS / g.pos : 1;
    g.span = chunk_positions(d, g.G * g.pos, (g.G * g.pos + WINO_POS - 1) / WINO_POS);
    g.xh = g.ty * WM + WR - 1, g.xw = g.tx * WM + WR - 1;
    g.yh = g.ty * WM, g.yw = g.tx * WM;
    return g;
}

static size_t gemm_scratch_len(const ch_kctx *kc, const wgeo *g);
/* The geometry with the GEMM scratch (which makes the GEMMs in kc's cache on first use). */
static wgeo geo_of(const ch_kctx *kc, const ch_conv_desc *d)
{
    wgeo g = tiling_of(d);
    g.scratch = gemm_scratch_len(kc, &g);
    return g;
}

/* Chunk i of a run of ng groups: tile positions [p0, p1) of the run (g->span each, the last one
 * the rest), cols = the chunk's GEMM columns. */
typedef struct wspan {
    int p0, p1, cols;
} wspan;

static int run_chunks(const wgeo *g, int ng) { return (ng * g->pos + g->span - 1) / g->span; }

static wspan chunk_span(const wgeo *g, int ng, int i)
{
    const int total = ng * g->pos;
    const int p0 = g->span * i, p1 = p0 + g->span < total ? p0 + g->span : total;
    return (wspan){ p0, p1, (p1 - p0) * TB };
}

static wlayout x_layout(const wgeo *g)
{
    return (wlayout){ g->d->c, g->d->h, g->d->w, g->d->pad, g->xh, g->xw };
}

static wlayout y_layout(const wgeo *g)
{
    return (wlayout){ g->d->oc, g->d->oh, g->d->ow, 0, g->yh, g->yw };
}

/* Run position r's WA x WA window in channel c's x planes, its WM x WM block in channel o's y
 * planes (row strides x_rs and y_rs; the run's groups' planes one after another), and its lanes
 * in row `row` of a chunk buffer. */
static size_t x_window_at(const wgeo *g, int c, int r)
{
    const int q = r % g->pos;
    return group_len(x_layout(g)) * (size_t)(r / g->pos) +
           (((size_t)c * g->xh + q / g->tx * WM) * g->xw + q % g->tx * WM) * TB;
}

static size_t y_block_at(const wgeo *g, int o, int r)
{
    const int q = r % g->pos;
    return group_len(y_layout(g)) * (size_t)(r / g->pos) +
           (((size_t)o * g->yh + q / g->tx * WM) * g->yw + q % g->tx * WM) * TB;
}

static ch_real *x_window(const wgeo *g, ch_real *xg, int c, int r) { return xg + x_window_at(g, c, r); }
static ch_real *y_block(const wgeo *g, ch_real *yg, int o, int r) { return yg + y_block_at(g, o, r); }

static size_t x_rs(const wgeo *g) { return (size_t)g->xw * TB; }
static size_t y_rs(const wgeo *g) { return (size_t)g->yw * TB; }

static ch_real *chunk_lanes(ch_real *buf, int row, wspan k, int q)
{
    return buf + (size_t)row * k.cols + (size_t)(q - k.p0) * TB;
}

/* The same in a chunk buffer holding bf16 (an operand of bf16 products: the buffer's memory,
 * sized for fp32, read as half as many bytes per element). */
static uint16_t *chunk_lanes_bf16(ch_real *buf, int row, wspan k, int q)
{
    return (uint16_t *)buf + (size_t)row * k.cols + (size_t)(q - k.p0) * TB;
}

/* U[p][o][c] = (G w(o,c) G^T)[p] for the pairs [lo, hi), TB pairs at a time, one per lane: the
 * same sums in the same order as one pair at a time, vectorised, and the stores to U run along
 * the pairs (one pair at a time stored NP elements a plane apart, and was 4% of ResNet-20's
 * step). */
static void transform_weights(const ch_conv_desc *d, const ch_real *w, int lo, int hi,
                              ch_real *u, bool bf16)
{
    const size_t plane = (size_t)d->oc * d->c;
    for (int k0 = lo; k0 < hi; k0 += TB) {
        const int nl = hi - k0 < TB ? hi - k0 : TB;
        /* The TB pairs' kernels are one contiguous run: copied whole (a short last run padded
         * with zeros), then turned into lanes from L1 (a strided gather from w with a bound per
         * lane was a third of the pass on the 512-channel layers). */
        ch_real raw[TB * WR * WR] = { 0 }, g[WR * WR][TB], t[WA][WR][TB];
        if (nl == TB)   /* sizes the compiler knows: moves, not a call of memcpy per row */
            memcpy(raw, w + (size_t)k0 * WR * WR, sizeof raw);
        else
            memcpy(raw, w + (size_t)k0 * WR * WR, sizeof(ch_real) * WR * WR * (size_t)nl);
        for (int e = 0; e < WR * WR; e++)
#pragma omp simd
            for (int j = 0; j < TB; j++) g[e][j] = raw[j * WR * WR + e];
        for (int i = 0; i < WA; i++)
            for (int b = 0; b < WR; b++) {
                ch_real acc[TB] = { 0 };
                for (int a = 0; a < WR; a++)
#pragma omp simd
                    for (int j = 0; j < TB; j++) acc[j] += G[i][a] * g[a * WR + b][j];
                memcpy(t[i][b], acc, sizeof acc);
            }
        for (int i = 0; i < WA; i++)
            for (int jj = 0; jj < WA; jj++) {
                ch_real acc[TB] = { 0 };
                for (int b = 0; b < WR; b++)
#pragma omp simd
                    for (int j = 0; j < TB; j++) acc[j] += t[i][b][j] * G[jj][b];
                if (bf16) {
                    uint16_t h[TB], *to = (uint16_t *)u + (size_t)(i * WA + jj) * plane + k0;
#pragma omp simd
                    for (int j = 0; j < TB; j++) h[j] = ch_bf16_from_float((float)acc[j]);
                    if (nl == TB) memcpy(to, h, sizeof h);
                    else memcpy(to, h, sizeof(uint16_t) * (size_t)nl);
                } else if (nl == TB) {
                    memcpy(u + (size_t)(i * WA + jj) * plane + k0, acc, sizeof acc);
                } else {
                    memcpy(u + (size_t)(i * WA + jj) * plane + k0, acc, sizeof(ch_real) * (size_t)nl);
                }
            }
    }
}

/* Also: fewer multiplies than the direct form for this plane, NP per tile against WR * WR per
 * output. A 2x2 output in one 4x4 tile costs F(4x4, 3x3) 36 multiplies, as many as directly: no
 * gain, only the transforms' rounding; a 1x1 output costs F(3x3, 5x5) 49 against 25. */
static bool wino_applies(const ch_conv_desc *d)
{
    const long tiles = (long)((d->oh + WM - 1) / WM) * ((d->ow + WM - 1) / WM);
    return d->kh == WR && d->kw == WR && d->stride == 1 && d->c >= WINO_MIN_C &&
           d->oc >= WINO_MIN_OC && d->oh > 0 && d->ow > 0 &&
           tiles * NP < (long)d->oh * d->ow * WR * WR;
}

/* --precision bf16: the point GEMMs multiply bf16 (the transforms and every sum stay fp32) where
 * the including file allows it (WINO_BF16) and the CPU has native bf16. */
static bool products_in_bf16(const ch_conv_desc *d)
{
#if defined(WINO_BF16) && !defined(CH_REAL_DOUBLE)
    return d->bf16 && ch_cpu_bf16_products(NULL, 0);
#else
    (void)d;
    return false;
#endif
}

static int groups_of(int n) { return (n + TB - 1) / TB; }
static int team_size(int n, int nthreads)
{
    const int g = groups_of(n);
    return g < nthreads ? (g > 0 ? g : 1) : nthreads;
}

/* A chunk buffer is dense, [p][row][col] with k.cols columns: oneDNN's batched kernel (brgemm)
 * takes only dense operands, and with a fixed row of WINO_COLS the shorter chunks ran its slower
 * gemm-based one. */
static size_t point_stride(int rows, wspan k)
{
    const size_t dense = (size_t)rows * k.cols;
    return spreads(rows, k.cols / TB) ? dense : dense + TB;
}

/* The NP GEMMs of a chunk of `cols` columns, one per point, as one strided batch:
 *   forward:          M[p] (oc x cols) = U[p] (oc x c) V[p] (c x cols)
 *   backward data:    dV[p] (c x cols) = U[p]^T E[p]
 *   backward weights: dU[p] (oc x c) += E[p] (oc x cols) V[p]^T */
typedef enum { PASS_FORWARD, PASS_DATA, PASS_WEIGHTS } wpass_kind;

static ch_gemm_batch point_gemms(const ch_conv_desc *d, wpass_kind kind, wspan k)
{
    const size_t uc = (size_t)d->oc * d->c, vs = point_stride(d->c, k);
    const size_t es = point_stride(d->oc, k);
    switch (kind) {
    case PASS_FORWARD:
        return (ch_gemm_batch){ .batch = NP, .m = d->oc, .n = k.cols, .k = d->c, .lda = d->c,
                                .ldb = k.cols, .ldc = k.cols, .sa = uc, .sb = vs, .sc = es };
    case PASS_DATA:
        return (ch_gemm_batch){ .batch = NP, .m = d->c, .n = k.cols, .k = d->oc, .lda = d->c,
                                .ldb = k.cols, .ldc = k.cols, .sa = uc, .sb = es, .sc = vs,
                                .ta = true };
    default:
        return (ch_gemm_batch){ .batch = NP, .m = d->oc, .n = d->c, .k = k.cols, .lda = k.cols,
                                .ldb = k.cols, .ldc = d->c, .sa = es, .sb = vs, .sc = uc,
                                .tb = true, .accumulate = true };
    }
}

/* The weights' products split by rows of dU (wino_grads.h, split_member): where every thread's
 * groups are one chunk, each thread multiplies every thread's chunk for its share of dU's rows,
 * [oc * t / T, oc * (t + 1) / T), into one dU, instead of all rows for its own chunk into a partial
 * that the untransform then reads with the others. Layers whose partial is SPLIT_MIN_BYTES or
 * more, in bf16 (where several groups share a chunk: G > 1), with a team of every thread. */
enum { SPLIT_MIN_BYTES = 4 << 20 };

static bool split_layer(const ch_kctx *kc, const wgeo *g)
{
    const size_t partial = (size_t)NP * g->d->oc * g->d->c * sizeof(ch_real);
    return g->bf16 && kc->nthreads > 1 && partial >= SPLIT_MIN_BYTES;
}

static int split_row(const ch_conv_desc *d, int t, int T) { return (int)((long)d->oc * t / T); }

/* dU[p] rows [o, o + rows) (+)= E[p] rows [o, o + rows) V[p]^T for one point of one thread's
 * chunk k: a weights' GEMM with m = rows (the caller offsets E and dU by point and rows); set where
 * first. One point at a time, every thread's chunk in turn: the rows stay in cache between them. */
static ch_gemm_batch split_gemm(const ch_conv_desc *d, wspan k, int rows, bool first)
{
    ch_gemm_batch b = point_gemms(d, PASS_WEIGHTS, k);
    b.batch = 1, b.m = rows, b.accumulate = !first, b.bf16 = true;
    return b;
}

/* The most scratch of the split's shapes, made here (plan time) for every chunk a thread can
 * have: 0 where the layer does not split. */
static size_t split_scratch_len(const ch_kctx *kc, const wgeo *g)
{
    size_t most = 0;
    if (!split_layer(kc, g)) return 0;
    const int T = kc->nthreads;
    for (int ng = 1; ng <= g->G && run_chunks(g, ng) == 1; ng++)
        for (int t = 0; t < T; t++)
            for (int first = 0; first < 2; first++) {
                const int rows = split_row(g->d, t + 1, T) - split_row(g->d, t, T);
                const ch_gemm_batch b = split_gemm(g->d, chunk_span(g, ng, 0), rows, first);
                const size_t len = ch_cpu_gemm_batch_scratch(kc, &b);
                if (len > most) most = len;
            }
    return (most + sizeof(ch_real) - 1) / sizeof(ch_real);
}

/* The largest GEMM scratch of the layer's chunks and passes, in elements. */
static size_t gemm_scratch_len(const ch_kctx *kc, const wgeo *g)
{
    size_t most = split_scratch_len(kc, g);
    for (int ng = 1; ng <= g->G; ng++)   /* a short last run has its own chunks */
        for (int i = 0; i < run_chunks(g, ng); i++)
            for (int kind = PASS_FORWARD; kind <= PASS_WEIGHTS; kind++) {
                ch_gemm_batch b = point_gemms(g->d, (wpass_kind)kind, chunk_span(g, ng, i));
                b.bf16 = g->bf16;
                for (int pass = 0; pass < 1 + (kind == PASS_WEIGHTS); pass++) {
                    b.accumulate = kind == PASS_WEIGHTS && pass == 0;   /* a thread's first chunk sets */
                    const size_t len = (ch_cpu_gemm_batch_scratch(kc, &b) + sizeof(ch_real) - 1) /
                                       sizeof(ch_real);
                    if (len > most) most = len;
                }
            }
    return most;
}

/* Shared: U, or dU summed (NP x oc x c). Per thread: a run's x and y planes, the two chunk
 * buffers, its partial dU and db (backward weights), and the GEMMs' scratch. */
static size_t shared_len(const ch_conv_desc *d) { return (size_t)NP * d->oc * d->c; }
/* A chunk buffer of `rows` rows at its widest: NP point blocks, each with point_stride's line. */
static size_t chunk_len(int rows) { return (size_t)NP * ((size_t)rows * WINO_COLS + TB); }
static size_t thread_len(const wgeo *g)
{
    const ch_conv_desc *d = g->d;
    return (2 * group_len(x_layout(g)) + group_len(y_layout(g))) * (size_t)g->G +
           chunk_len(d->c) + chunk_len(d->oc) + shared_len(d) + (size_t)d->oc +
           g->scratch;
}

bool WINO_FN(applies)(const ch_conv_desc *d) { return wino_applies(d); }
bool WINO_FN(in_bf16)(const ch_conv_desc *d) { return wino_applies(d) && products_in_bf16(d); }

size_t WINO_FN(workspace)(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    if (!wino_applies(d)) return 0;
    const wgeo g = geo_of(kc, d);
    return shared_len(d) + thread_len(&g) * (size_t)team_size(n, kc->nthreads);
}

/* Thread t's scratch. */
typedef struct wscratch {
    ch_real *xg, *yg;   /* the group's x (or dx) and y (or dy) planes */
    ch_real *v, *e;     /* V or dV chunk (c rows), M or E chunk (oc rows): chunk_len each */
    ch_real *du, *db;   /* backward weights: the thread's dU (NP x oc x c) and db */
    ch_real *gemm;      /* the GEMMs' scratch */
    ch_real *dxg;       /* both backward passes at once: the group's dx planes (xg holds x) */
    bool x16, y16;      /* xg holds x, yg dy (or forward's y), in bf16: a bf16 source or output */
} wscratch;

static wscratch scratch_of(const ch_kctx *kc, const wgeo *g, int t)
{
    const ch_conv_desc *d = g->d;
    wscratch s;
    s.xg = kc->ws + shared_len(d) + thread_len(g) * (size_t)t;
    s.yg = s.xg + group_len(x_layout(g)) * (size_t)g->G;
    s.v = s.yg + group_len(y_layout(g)) * (size_t)g->G;
    s.e = s.v + chunk_len(d->c);
    s.du = s.e + chunk_len(d->oc);
    s.db = s.du + shared_len(d);
    s.gemm = s.db + d->oc;
    s.dxg = s.gemm + g->scratch;
    s.x16 = s.y16 = false;
    return s;
}

/* Thread t's scratch for a pass whose x planes (x16) and y planes (y16) hold bf16: the pass's
 * bf16 source or output (pack_run). */
static wscratch pass_scratch(const ch_kctx *kc, const wgeo *g, int t, bool x16, bool y16)
{
    wscratch s = scratch_of(kc, g, t);
    s.x16 = x16, s.y16 = y16;
    return s;
}

/* Whether a pass can run, with *g its geometry (made once per pass: it looks up every GEMM shape). */
static bool wino_usable(const ch_kctx *kc, const ch_conv_desc *d, int n, wgeo *g)
{
    if (!wino_applies(d) || n <= 0 || !kc->ws) return false;
    *g = geo_of(kc, d);
    return kc->ws_len >= shared_len(d) + thread_len(g) * (size_t)team_size(n, kc->nthreads);
}

/* A run of samples s0 .. s0+live-1 (up to G groups) into consecutive groups' planes from t (each
 * sample `len` elements), and back. The planes take the tensor's precision: from and to bf16 rows
 * they hold bf16 vectors (grp read as uint16_t: half the buffer; wscratch's x16 and y16 say which
 * planes do), which the transforms widen as they read them or round as they store them. A group's
 * planes were 3.7 MB of fp32 at 64@28x28, more than L2, and the transforms waited on reading them
 * back. */
static void *group_at(wlayout l, bool lanes16, void *grp, int i)
{
    return (char *)grp + (lanes16 ? sizeof(uint16_t) : sizeof(ch_real)) * group_len(l) * (size_t)i;
}

static void pack_run(wlayout l, wsrc t, size_t len, int live, ch_real *grp)
{
    for (int i = 0; i * TB < live; i++)
        pack_group(l, src_at(t, len * TB * (size_t)i), live - i * TB < TB ? live - i * TB : TB,
                   group_at(l, t.h != NULL, grp, i));
}

static void unpack_run(wlayout l, const ch_real *grp, int live, size_t len, wdest t)
{
    for (int i = 0; i * TB < live; i++)
        unpack_group(l, group_at(l, t.h != NULL, (void *)grp, i), live - i * TB < TB ? live - i * TB : TB,
                     dest_at(t, len * TB * (size_t)i));
}

/* The samples of the run that starts at group q of a thread's groups [q, hi): up to G groups. */
static int run_live(const wgeo *g, int n, int q, int hi)
{
    const int ng = hi - q < g->G ? hi - q : g->G, s0 = q * TB;
    return n - s0 < ng * TB ? n - s0 : ng * TB;
}

/* What a pass does with each run of samples. */
typedef struct wpass wpass;
struct wpass {
    wsrc in;                    /* x (fp32, or bf16 for forward_of_bf16), or dy */
    const ch_real *bias;        /* b (forward, may be NULL) */
    wdest out;                  /* y (fp32, or bf16 for forward_bf16), or dx */
    void (*group)(const ch_kctx *kc, const wgeo *g, const wpass *p, const ch_real *u,
                  const wscratch *s, int s0, int live);
};

/* One tile's points of plane `row` at run position q, x's (V) or dy's (E), into out at stride ps. */
static void tile_points(const wgeo *g, const wscratch *s, bool dy, int row, int q,
                        ch_real *restrict out, size_t ps)
{
    if (dy && s->y16)
        transform_dy_block16((const uint16_t *)s->yg + y_block_at(g, row, q), y_rs(g), out, ps);
    else if (dy)
        transform_dy_block(y_block(g, s->yg, row, q), y_rs(g), out, ps);
    else if (s->x16)
        transform_in16((const uint16_t *)s->xg + x_window_at(g, row, q), x_rs(g), out, ps);
    else
        transform_in(x_window(g, s->xg, row, q), x_rs(g), out, ps);
}

/* V[p][c][col] for the chunk from the run's x planes into s->v, or E[p][o][col] from its dy planes
 * into s->e; bf16 where g->bf16. */
static void transform_chunk(const wgeo *g, wspan k, const wscratch *s, bool dy)
{
    const int rows = dy ? g->d->oc : g->d->c;
    ch_real *buf = dy ? s->e : s->v;
    const size_t ps = point_stride(rows, k);
    for (int r = 0; r < rows; r++)
        for (int q = k.p0; q < k.p1; q++) {
            if (!g->bf16) {
                tile_points(g, s, dy, r, q, chunk_lanes(buf, r, k, q), ps);
                continue;
            }
            ch_real t[NP * TB];
            tile_points(g, s, dy, r, q, t, TB);
            store_points_bf16(t, chunk_lanes_bf16(buf, r, k, q), ps);
        }
}

/* The chunk's batch of point GEMMs C = op(A) op(B), on bf16 operands where g->bf16 (a and b then
 * hold bf16: U as transform_weights stored it, V and E as the transforms above did). */
static void point_products(const ch_kctx *kc, const wgeo *g, wpass_kind kind, wspan k,
                           const ch_real *a, const ch_real *b, ch_real *c, const wscratch *s)
{
    ch_gemm_batch gb = point_gemms(g->d, kind, k);
    gb.bf16 = g->bf16;
    if (g->bf16)
        ch_cpu_gemm_batch_bf16(kc, &gb, (const uint16_t *)a, (const uint16_t *)b, c, s->gemm);
    else
        ch_cpu_gemm_batch(kc, &gb, a, b, c, s->gemm);
}

/* Y for chunk i of the group in s->xg: V, then M[p] (oc x cols) = U[p] (oc x c) V[p] (c x cols),
 * then AT M AT^T into s->yg. */
static void forward_chunk(const ch_kctx *kc, const wgeo *g, const wpass *p, const ch_real *u,
                          const wscratch *s, int ng, int i)
{
    const ch_conv_desc *d = g->d;
    const wspan k = chunk_span(g, ng, i);
    transform_chunk(g, k, s, false);
    point_products(kc, g, PASS_FORWARD, k, u, s->v, s->e, s);
    for (int o = 0; o < d->oc; o++)
        for (int q = k.p0; q < k.p1; q++)
            transform_out(chunk_lanes(s->e, o, k, q), point_stride(d->oc, k), p->bias ? p->bias[o] : 0,
                          d->relu, s->y16 ? NULL : y_block(g, s->yg, o, q),
                          s->y16 ? (uint16_t *)s->yg + y_block_at(g, o, q) : NULL, y_rs(g));
}

static void forward_group(const ch_kctx *kc, const wgeo *g, const wpass *p, const ch_real *u,
                          const wscratch *s, int s0, int live)
{
    const ch_conv_desc *d = g->d;
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * d->oh * d->ow;
    const int ng = groups_of(live);
    pack_run(x_layout(g), src_at(p->in, (size_t)s0 * xs), xs, live, s->xg);
    for (int i = 0; i < run_chunks(g, ng); i++) forward_chunk(kc, g, p, u, s, ng, i);
    unpack_run(y_layout(g), s->yg, live, ys, dest_at(p->out, (size_t)s0 * ys));
}

/* dV[p] (c x cols) = U[p]^T E[p] for the chunk's E in s->e, into s->v, then BT^T dV BT added into
 * the windows of the dx planes dxg. */
static void data_products_add(const ch_kctx *kc, const wgeo *g, const ch_real *u,
                              const wscratch *s, wspan k, ch_real *dxg)
{
    const ch_conv_desc *d = g->d;
    point_products(kc, g, PASS_DATA, k, u, s->e, s->v, s);
    for (int c = 0; c < d->c; c++)
        for (int q = k.p0; q < k.p1; q++)   /* windows overlap: added in position order */
            adjoint_in_add(chunk_lanes(s->v, c, k, q), point_stride(d->c, k),
                           x_window(g, dxg, c, q), x_rs(g));
}

/* dX for chunk i of the group's dY in s->yg: E, then its products added into s->xg. */
static void backward_data_chunk(const ch_kctx *kc, const wgeo *g, const ch_real *u,
                                const wscratch *s, int ng, int i)
{
    const wspan k = chunk_span(g, ng, i);
    transform_chunk(g, k, s, true);
    data_products_add(kc, g, u, s, k, s->xg);
}

static void backward_data_group(const ch_kctx *kc, const wgeo *g, const wpass *p,
                                const ch_real *u, const wscratch *s, int s0, int live)
{
    const ch_conv_desc *d = g->d;
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * d->oh * d->ow;
    const int ng = groups_of(live);
    pack_run(y_layout(g), src_at(p->in, (size_t)s0 * ys), ys, live, s->yg);
    memset(s->xg, 0, sizeof(ch_real) * group_len(x_layout(g)) * (size_t)ng);
    for (int i = 0; i < run_chunks(g, ng); i++) backward_data_chunk(kc, g, u, s, ng, i);
    unpack_run(x_layout(g), s->xg, live, xs, dest_at(p->out, (size_t)s0 * xs));
}

/* What a pass's team members share (ch_cpu_team's arg). */
typedef struct wteam {
    const ch_kctx *kc;
    const wgeo *g;
    int n;
    const ch_real *w;
    ch_real *u;             /* where U is (u_for) */
    bool make_u;            /* the team makes U there first */
    const wpass *p;         /* run_pass */
    const struct wgrads *a; /* grads_pass, with its dw */
    ch_real *dw;
} wteam;

/* d->keep (ch_conv_desc): this head, then U as the workspace's head holds it. A forward makes U
 * there and stamps the head; the backward after it, given the same w, uses that U instead of
 * making its own (on resnet18's 512-channel layers in bf16 the weights' transform was ~3 ms of
 * each pass, its 19 MB of U written at memory speed). */
typedef struct wkeep {
    const ch_real *w;              /* the weights U was made from */
    uint32_t guard[3];             /* the bits of three of their values then: first, middle, last */
    bool fresh;                    /* made by a forward, not yet used by a backward */
    bool bf16;                     /* U in bf16 */
} wkeep;
enum { WKEEP_HEAD = 64 };
_Static_assert(sizeof(wkeep) <= WKEEP_HEAD, "the head fits");

static void keep_guard(const ch_conv_desc *d, const ch_real *w, uint32_t out[3])
{
    const size_t len = (size_t)d->oc * d->c * WR * WR, at[3] = { 0, len / 2, len - 1 };
    for (int i = 0; i < 3; i++) {
        const float v = (float)w[at[i]];
        memcpy(&out[i], &v, sizeof v);
    }
}

static size_t keep_len(const wgeo *g)
{
    return WKEEP_HEAD + shared_len(g->d) * (g->bf16 ? sizeof(uint16_t) : sizeof(ch_real));
}

/* Where a pass finds U and whether it makes it: without d->keep, made in the workspace's head;
 * with it, in the kept place, made by a forward (stamped after it: keep_stamp) and by a backward
 * unless the forward before it left U of this w there (used once: fresh is cleared). */
static ch_real *u_for(const ch_kctx *kc, const wgeo *g, const ch_real *w, bool forward, bool *make)
{
    wkeep *k = g->d->keep;
    *make = true;
    if (!k) return kc->ws;
    if (!forward && k->fresh && k->w == w && k->bf16 == g->bf16) {
        uint32_t now[3];
        keep_guard(g->d, w, now);
        *make = memcmp(now, k->guard, sizeof now) != 0;
    }
    k->fresh = false;
    return (ch_real *)((char *)k + WKEEP_HEAD);
}

static void keep_stamp(const wgeo *g, const ch_real *w)
{
    wkeep *k = g->d->keep;
    if (!k) return;
    k->w = w, k->bf16 = g->bf16, k->fresh = true;
    keep_guard(g->d, w, k->guard);
}

/* Thread t of T's share of the weights' transform into U. */
static void transform_share(const wteam *m, int t, int T)
{
    const ch_conv_desc *d = m->g->d;
    const int pairs = d->oc * d->c;
    transform_weights(d, m->w, pairs * t / T, pairs * (t + 1) / T, m->u, m->g->bf16);
}

/* Thread t of T: its share of the weights' transform (where the team makes U), then its groups. */
static void pass_member(void *arg, int t, int T)
{
    const wteam *m = arg;
    const wgeo *g = m->g;
    const int groups = groups_of(m->n);
    if (m->make_u) {   /* the same branch in every thread */
        transform_share(m, t, T);
#pragma omp barrier
    }
    /* forward: x in, y out; backward data: dy in (to yg), dx out of fp32 planes (xg). */
    const bool forward = m->p->group == forward_group;
    const wscratch s = pass_scratch(m->kc, g, t, forward && m->p->in.h,
                                    forward ? m->p->out.h != NULL : m->p->in.h != NULL);
    const int hi = groups * (t + 1) / T;
    for (int q = groups * t / T; q < hi; q += g->G)
        m->p->group(m->kc, g, m->p, m->u, &s, q * TB, run_live(g, m->n, q, hi));
}

/* A pass over the batch: U from w (or kept), then each thread's groups of TB samples in order, G
 * at a time. */
static void run_pass(const ch_kctx *kc, const wgeo *gp, int n, const ch_real *w, const wpass *p)
{
    const wgeo g = *gp;
    const bool forward = p->group == forward_group;
    wteam m = { .kc = kc, .g = &g, .n = n, .w = w, .p = p };
    m.u = u_for(kc, &g, w, forward, &m.make_u);
    ch_cpu_team(team_size(n, kc->nthreads), pass_member, &m);
    if (forward) keep_stamp(&g, w);
}

size_t WINO_FN(keep_bytes)(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    if (!wino_applies(d) || n <= 0) return 0;
    const wgeo g = geo_of(kc, d);
    return keep_len(&g);
}

bool WINO_FN(forward)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                          const ch_real *w, const ch_real *b, ch_real *y)
{
    wgeo g;
    if (!wino_usable(kc, d, n, &g)) return false;
    run_pass(kc, &g, n, w, &(wpass){ .in = { x, NULL }, .bias = b, .out = { y, NULL }, .group = forward_group });
    return true;
}

#ifdef WINO_BF16
/* The forward pass with y rounded to bf16 as it is unpacked: the bits of the pass above rounded,
 * written in half the bytes (a convolution whose BatchNorm keeps its input in bf16). */
bool WINO_FN(forward_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                               const ch_real *w, const ch_real *b, uint16_t *y)
{
    wgeo g;
    if (!wino_usable(kc, d, n, &g)) return false;
    run_pass(kc, &g, n, w, &(wpass){ .in = { x, NULL }, .bias = b, .out = { NULL, y }, .group = forward_group });
    return true;
}

/* The forward pass of an input kept in bf16 (widened exactly as it is packed: the bits of the
 * fp32 pass on the widened values), into y or, where y is NULL, rounded to bf16 into yh. */
bool WINO_FN(forward_of_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                              const ch_real *w, const ch_real *b, ch_real *y, uint16_t *yh)
{
    wgeo g;
    if (!wino_usable(kc, d, n, &g)) return false;
    run_pass(kc, &g, n, w, &(wpass){ .in = { NULL, x }, .bias = b, .out = { y, y ? NULL : yh }, .group = forward_group });
    return true;
}
#endif

bool WINO_FN(backward_data)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                const ch_real *w, ch_real *dx)
{
    wgeo g;
    if (!wino_usable(kc, d, n, &g)) return false;
    run_pass(kc, &g, n, w, &(wpass){ .in = { dy, NULL }, .out = { dx, NULL }, .group = backward_data_group });
    return true;
}

/* The weights' gradient, alone or with dx in the same pass. */
#include "kernels/cpu/wino_grads.h"
