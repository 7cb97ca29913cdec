/* Winograd F(3x3, 5x5), written here, forward and backward data, for 5x5 stride-1 convolutions
 * with at least WINO5_MIN_C channels in and WINO5_MIN_OC out: lenet's second layer (20 -> 50 on
 * 13x13). oneDNN has Winograd for 3x3 kernels only (cpu_wino.c).
 * Why: that layer is ~90% of lenet's arithmetic, and im2col + GEMM already ran it near the GEMM's
 * speed. F(3x3, 5x5) computes a 3x3 block of outputs from a 7x7 input tile with 49 multiplies per
 * channel pair where the direct form does 9 x 25 = 225. lenet's step (batch 256, 2 threads, this
 * machine) went from ~16,000 to ~20,000 img/s.
 * Why not fewer output channels: the transform of x (and its adjoint into dx) costs per input
 * channel and tile, the GEMMs per channel pair, so the saving grows with oc. mnist-cnn's 20 -> 20
 * layer ran its step at ~12,500 img/s this way against ~16,000 with im2col.
 * Why not backward weights: written the same way (dU = sum over tiles of E . V, dg = G^T dU G) it
 * added only 2-5% to lenet's step, and it rounds more than im2col (the adjoint transform cancels
 * large terms). Forward and backward data give each sample the same bits however the batch is
 * split, so they keep multi-rank runs as close to one process as im2col does.
 * The algebra, with the interpolation points 0, 1, -1, 2, -2, -1/2 and infinity (matrices below):
 *   forward:          Y = AT [ sum_c U(o,c) . V(c) ] AT^T,  U = G g G^T,  V = BT d BT^T
 *   backward data:    the adjoint of that map in d, so it is exact for the same tiles:
 *                     dd(c) = BT^T [ sum_o U(o,c) . E(o) ] BT,  E = AT^T dY AT, added into dx
 * ("." is elementwise over the 49 points.) Each sum over channels is a GEMM per point p (49 of
 * them): the transforms write their results as [p][channel][tile] so that each point's matrix is
 * a plain row-major block.
 * How the work is cut: threads take contiguous runs of samples; a thread's tiles (ceil(oh/3) x
 * ceil(ow/3) per sample, the last row and column clipped) go in chunks of WINO5_CHUNK, and the
 * transforms run on TB tiles at once, one per vector lane (the windows are gathered from the
 * planes, which is most of the transforms' cost).
 * Numerically the transforms round more than a direct sum, but test_kernels finds them within
 * its 1e-5 of each result's scale. */
#include "kernels/cpu/cpu.h"

#include <limits.h>
#include <string.h>

enum {
    WM = 3, WR = 5, WA = 7, NP = WA * WA, /* output tile, kernel, input tile, points */
    TB = CH_CPU_LANES,                    /* tiles transformed at once */
    WINO5_CHUNK = 128,                    /* tiles per GEMM */
    WINO5_MIN_C = 8, WINO5_MIN_OC = 32,   /* below these the transforms cost more than they save */
};

/* The matrices, for the points 0, 1, -1, 2, -2, -1/2 and infinity (derived by Toom-Cook; the
 * transforms below are these rows written out, zeros skipped):
 *   AT (3 x 7)                BT (7 x 7)
 *   1  1  1  1  1   1    0    4  8  -5 -10   1   2  0
 *   0  1 -1  2 -2 -1/2   0    0  4  12   7  -3  -2  0
 *   0  1  1  4  4  1/4   1    0  4   4  -9  -1   2  0
 *                             0 -2  -5   0   5   2  0
 *                             0 -2  -3   4   3  -2  0
 *                             0 -4   0   5   0  -1  0
 *                             0  4   8  -5 -10   1  2
 * and G (7 x 5) here: */
static const ch_real G[WA][WR] = {
    { 1.0 / 4, 0, 0, 0, 0 },
    { 1.0 / 18, 1.0 / 18, 1.0 / 18, 1.0 / 18, 1.0 / 18 },
    { 1.0 / 6, -1.0 / 6, 1.0 / 6, -1.0 / 6, 1.0 / 6 },
    { 1.0 / 120, 1.0 / 60, 1.0 / 30, 1.0 / 15, 2.0 / 15 },
    { 1.0 / 72, -1.0 / 36, 1.0 / 18, -1.0 / 9, 2.0 / 9 },
    { 32.0 / 45, -16.0 / 45, 8.0 / 45, -4.0 / 45, 2.0 / 45 },
    { 0, 0, 0, 0, 0.5 },
};

/* One-dimensional transforms on TB lanes: input k of lane j is in[k*is + j], output i goes to
 * out[i*os + j]. A 2-D transform is one pass down the columns and one along the rows. */
static void bt_lanes(const ch_real *restrict in, size_t is, ch_real *restrict out, size_t os)
{
#pragma omp simd
    for (int j = 0; j < TB; j++) {
        const ch_real d0 = in[j], d1 = in[is + j], d2 = in[2 * is + j], d3 = in[3 * is + j];
        const ch_real d4 = in[4 * is + j], d5 = in[5 * is + j], d6 = in[6 * is + j];
        out[j] = 4 * d0 + 8 * d1 - 5 * d2 - 10 * d3 + d4 + 2 * d5;
        out[os + j] = 4 * d1 + 12 * d2 + 7 * d3 - 3 * d4 - 2 * d5;
        out[2 * os + j] = 4 * d1 + 4 * d2 - 9 * d3 - d4 + 2 * d5;
        out[3 * os + j] = -2 * d1 - 5 * d2 + 5 * d4 + 2 * d5;
        out[4 * os + j] = -2 * d1 - 3 * d2 + 4 * d3 + 3 * d4 - 2 * d5;
        out[5 * os + j] = -4 * d1 + 5 * d3 - d5;
        out[6 * os + j] = 4 * d1 + 8 * d2 - 5 * d3 - 10 * d4 + d5 + 2 * d6;
    }
}

static void btt_lanes(const ch_real *restrict in, size_t is, ch_real *restrict out, size_t os)
{
#pragma omp simd
    for (int j = 0; j < TB; j++) {
        const ch_real d0 = in[j], d1 = in[is + j], d2 = in[2 * is + j], d3 = in[3 * is + j];
        const ch_real d4 = in[4 * is + j], d5 = in[5 * is + j], d6 = in[6 * is + j];
        out[j] = 4 * d0;
        out[os + j] = 8 * d0 + 4 * d1 + 4 * d2 - 2 * d3 - 2 * d4 - 4 * d5 + 4 * d6;
        out[2 * os + j] = -5 * d0 + 12 * d1 + 4 * d2 - 5 * d3 - 3 * d4 + 8 * d6;
        out[3 * os + j] = -10 * d0 + 7 * d1 - 9 * d2 + 4 * d4 + 5 * d5 - 5 * d6;
        out[4 * os + j] = d0 - 3 * d1 - d2 + 5 * d3 + 3 * d4 - 10 * d6;
        out[5 * os + j] = 2 * d0 - 2 * d1 + 2 * d2 + 2 * d3 - 2 * d4 - d5 + d6;
        out[6 * os + j] = 2 * d6;
    }
}

static void at_lanes(const ch_real *restrict in, size_t is, ch_real *restrict out, size_t os)
{
    const ch_real half = (ch_real)0.5, quarter = (ch_real)0.25;
#pragma omp simd
    for (int j = 0; j < TB; j++) {
        const ch_real d0 = in[j], d1 = in[is + j], d2 = in[2 * is + j], d3 = in[3 * is + j];
        const ch_real d4 = in[4 * is + j], d5 = in[5 * is + j], d6 = in[6 * is + j];
        out[j] = d0 + d1 + d2 + d3 + d4 + d5;
        out[os + j] = d1 - d2 + 2 * d3 - 2 * d4 - half * d5;
        out[2 * os + j] = d1 + d2 + 4 * d3 + 4 * d4 + quarter * d5 + d6;
    }
}

static void att_lanes(const ch_real *restrict in, size_t is, ch_real *restrict out, size_t os)
{
    const ch_real half = (ch_real)0.5, quarter = (ch_real)0.25;
#pragma omp simd
    for (int j = 0; j < TB; j++) {
        const ch_real d0 = in[j], d1 = in[is + j], d2 = in[2 * is + j];
        out[j] = d0;
        out[os + j] = d0 + d1 + d2;
        out[2 * os + j] = d0 - d1 + d2;
        out[3 * os + j] = d0 + 2 * d1 + 4 * d2;
        out[4 * os + j] = d0 - 2 * d1 + 4 * d2;
        out[5 * os + j] = d0 - half * d1 + quarter * d2;
        out[6 * os + j] = d2;
    }
}

/* The layer's tiling. Windows of x are read from planes padded so that every tile's 7x7 window
 * lies inside (xh x xw, origin at (-pad, -pad)); blocks of dy from planes of yh x yw (whole
 * tiles). Where a plane already has that shape (lenet's 13x13 input and 9x9 output, no pad) it is
 * read in place; otherwise a chunk's samples are copied, one channel at a time, into the thread's
 * plane buffer. So the gathers need no bounds tests. */
typedef struct wgeo {
    const ch_conv_desc *d;
    int ty, tx, per_sample;   /* tiles down, across, per sample */
    int xh, xw, yh, yw;       /* padded plane shapes */
    bool x_in_place, dy_in_place;
    int s0;                   /* the thread's first sample */
} wgeo;

static wgeo geo_of(const ch_conv_desc *d)
{
    wgeo g = { .d = d, .ty = (d->oh + WM - 1) / WM, .tx = (d->ow + WM - 1) / WM };
    g.per_sample = g.ty * g.tx;
    g.xh = g.ty * WM + WR - 1, g.xw = g.tx * WM + WR - 1;
    g.yh = g.ty * WM, g.yw = g.tx * WM;
    g.x_in_place = d->pad == 0 && g.xh == d->h && g.xw == d->w;
    g.dy_in_place = g.yh == d->oh && g.yw == d->ow;
    return g;
}

/* Samples a chunk's tiles can span, and the plane buffer for them. */
static int chunk_samples(const wgeo *g) { return (WINO5_CHUNK - 1) / g->per_sample + 2; }
static size_t planes_len(const wgeo *g)
{
    const size_t a = (size_t)g->xh * g->xw, b = (size_t)g->yh * g->yw;
    return (a > b ? a : b) * (size_t)chunk_samples(g);
}

/* A chunk: tiles t0 .. t0+live-1 of the thread's, on samples sa .. sa+ns-1, and where each
 * tile's window starts in a channel's planes of x (xoff) and of dy (yoff). Lanes past live repeat
 * the first tile, so that whole vectors read valid data; their results are not used. */
typedef struct wchunk {
    int t0, live, sa, ns;
    int xoff[WINO5_CHUNK], yoff[WINO5_CHUNK];
} wchunk;

static void chunk_of(const wgeo *g, int t0, int live, wchunk *k)
{
    const ch_conv_desc *d = g->d;
    const size_t xss = g->x_in_place ? (size_t)d->c * d->h * d->w : (size_t)g->xh * g->xw;
    const size_t yss = g->dy_in_place ? (size_t)d->oc * d->oh * d->ow : (size_t)g->yh * g->yw;
    k->t0 = t0, k->live = live;
    k->sa = g->s0 + t0 / g->per_sample;
    k->ns = g->s0 + (t0 + live - 1) / g->per_sample - k->sa + 1;
    const int lanes = (live + TB - 1) / TB * TB;
    for (int l = 0; l < lanes; l++) {
        const int t = t0 + (l < live ? l : 0), r = t % g->per_sample;
        const int s = g->s0 + t / g->per_sample - k->sa, oy = r / g->tx * WM, ox = r % g->tx * WM;
        k->xoff[l] = (int)((size_t)s * xss) + oy * g->xw + ox;
        k->yoff[l] = (int)((size_t)s * yss) + oy * g->yw + ox;
    }
}

/* One channel's planes (h x w) for the chunk's samples, each padded to ph x pw with `pad` zeros
 * on the top and left (the rest of the border zero too): in place where they already have that
 * shape, or copied into buf. `planes` is the batch's tensor, with `planes_per_sample` planes. */
typedef struct wplanes {
    const ch_real *t;
    int planes_per_sample, ch, h, w, pad, ph, pw;
    bool in_place;
} wplanes;

static const ch_real *chunk_planes(const wplanes *p, const wchunk *k, ch_real *buf)
{
    const size_t plane = (size_t)p->h * p->w, ss = plane * (size_t)p->planes_per_sample;
    const ch_real *first = p->t + (size_t)k->sa * ss + (size_t)p->ch * plane;
    if (p->in_place) return first;
    for (int i = 0; i < k->ns; i++) {
        ch_real *dst = buf + (size_t)i * p->ph * p->pw;
        memset(dst, 0, sizeof(ch_real) * (size_t)p->ph * p->pw);
        for (int r = 0; r < p->h; r++)
            memcpy(dst + (size_t)(r + p->pad) * p->pw + p->pad, first + i * ss + (size_t)r * p->w,
                   sizeof(ch_real) * p->w);
    }
    return buf;
}

static const ch_real *x_planes(const wgeo *g, const wchunk *k, const ch_real *x, int c,
                               ch_real *buf)
{
    const ch_conv_desc *d = g->d;
    const wplanes p = { x, d->c, c, d->h, d->w, d->pad, g->xh, g->xw, g->x_in_place };
    return chunk_planes(&p, k, buf);
}

static const ch_real *dy_planes(const wgeo *g, const wchunk *k, const ch_real *dy, int o,
                                ch_real *buf)
{
    const ch_conv_desc *d = g->d;
    const wplanes p = { dy, d->oc, o, d->oh, d->ow, 0, g->yh, g->yw, g->dy_in_place };
    return chunk_planes(&p, k, buf);
}

/* n x n windows, one per lane, from planes of row length pw: in[(a*n + b)*TB + l]. */
static void gather(const ch_real *planes, const int *off, int pw, int n, ch_real *in)
{
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            const ch_real *src = planes + a * pw + b;
            ch_real *dst = in + (a * n + b) * TB;
#pragma omp simd
            for (int l = 0; l < TB; l++) dst[l] = src[off[l]];
        }
}

/* The 2-D transforms; a chunk buffer's point p of a row is at p*ps from the row's lanes. */
static void transform_in(const ch_real *restrict in, ch_real *restrict out, size_t ps)
{
    ch_real t[NP * TB];
    for (int m = 0; m < WA; m++) bt_lanes(in + m * TB, WA * TB, t + m * TB, WA * TB);
    for (int i = 0; i < WA; i++) bt_lanes(t + i * WA * TB, TB, out + i * WA * ps, ps);
}

static void adjoint_in(const ch_real *restrict in, size_t ps, ch_real *restrict out)
{
    ch_real t[NP * TB];
    for (int j = 0; j < WA; j++) btt_lanes(in + j * ps, WA * ps, t + j * TB, WA * TB);
    for (int k = 0; k < WA; k++) btt_lanes(t + k * WA * TB, TB, out + k * WA * TB, TB);
}

static void transform_out(const ch_real *restrict in, size_t ps, ch_real *restrict out)
{
    ch_real t[WM * WA * TB];
    for (int m = 0; m < WA; m++) at_lanes(in + m * ps, WA * ps, t + m * TB, WA * TB);
    for (int i = 0; i < WM; i++) at_lanes(t + i * WA * TB, TB, out + i * WM * TB, TB);
}

static void transform_dy_block(const ch_real *restrict in, ch_real *restrict out, size_t ps)
{
    ch_real t[WA * WM * TB];
    for (int j = 0; j < WM; j++) att_lanes(in + j * TB, WM * TB, t + j * TB, WM * TB);
    for (int k = 0; k < WA; k++) att_lanes(t + k * WM * TB, TB, out + k * WA * ps, ps);
}

/* Where a chunk buffer holds row `row` of block b at point 0. */
static ch_real *lanes_at(ch_real *buf, int row, int b)
{
    return buf + (size_t)row * WINO5_CHUNK + (size_t)b * TB;
}

static size_t point_stride(int rows) { return (size_t)rows * WINO5_CHUNK; }

/* V[p][c][tile] for the chunk. */
static void transform_x(const wgeo *g, const wchunk *k, const ch_real *x, ch_real *planes,
                        ch_real *vbuf)
{
    ch_real in[NP * TB];
    const int c = g->d->c;
    for (int ch = 0; ch < c; ch++) {
        const ch_real *pl = x_planes(g, k, x, ch, planes);
        for (int b = 0; b * TB < k->live; b++) {
            gather(pl, k->xoff + b * TB, g->xw, WA, in);
            transform_in(in, lanes_at(vbuf, ch, b), point_stride(c));
        }
    }
}

/* E[p][o][tile] for the chunk. */
static void transform_dy(const wgeo *g, const wchunk *k, const ch_real *dy, ch_real *planes,
                         ch_real *ebuf)
{
    ch_real in[WM * WM * TB];
    const int oc = g->d->oc;
    for (int o = 0; o < oc; o++) {
        const ch_real *pl = dy_planes(g, k, dy, o, planes);
        for (int b = 0; b * TB < k->live; b++) {
            gather(pl, k->yoff + b * TB, g->yw, WM, in);
            transform_dy_block(in, lanes_at(ebuf, o, b), point_stride(oc));
        }
    }
}

/* Tiles in block b of the chunk (the last block may be short). */
static int block_live(const wchunk *k, int b)
{
    return k->live - b * TB < TB ? k->live - b * TB : TB;
}

/* y's 3x3 blocks of plane o for block b's tiles, + bias, ReLU if fused; clipped at the edge. */
static void scatter_y(const wgeo *g, const wchunk *k, int b, const ch_real *out, int o,
                      ch_real bias, ch_real *y)
{
    const ch_conv_desc *d = g->d;
    const int live = block_live(k, b);
    for (int l = 0; l < live; l++) {
        const int t = k->t0 + b * TB + l, r = t % g->per_sample;
        const int oy = r / g->tx * WM, ox = r % g->tx * WM;
        ch_real *pl = y + ((size_t)(g->s0 + t / g->per_sample) * d->oc + o) * d->oh * d->ow;
        for (int i = 0; i < WM && oy + i < d->oh; i++)
            for (int j = 0; j < WM && ox + j < d->ow; j++) {
                ch_real v = out[(i * WM + j) * TB + l] + bias;
                if (d->relu && v < 0) v = 0;   /* NaN passes, as in ch_cpu_relu_span */
                pl[(size_t)(oy + i) * d->ow + ox + j] = v;
            }
    }
}

/* U[p][o][c] = (G w(o,c) G^T)[p] for the pairs [lo, hi). */
static void transform_weights(const ch_conv_desc *d, const ch_real *w, int lo, int hi,
                              ch_real *u)
{
    const size_t plane = (size_t)d->oc * d->c;
    for (int k = lo; k < hi; k++) {
        const ch_real *g = w + (size_t)k * WR * WR;
        ch_real t[WA][WR];
        for (int i = 0; i < WA; i++)
            for (int b = 0; b < WR; b++) {
                ch_real s = 0;
                for (int a = 0; a < WR; a++) s += G[i][a] * g[a * WR + b];
                t[i][b] = s;
            }
        for (int i = 0; i < WA; i++)
            for (int j = 0; j < WA; j++) {
                ch_real s = 0;
                for (int b = 0; b < WR; b++) s += t[i][b] * G[j][b];
                u[(size_t)(i * WA + j) * plane + k] = s;
            }
    }
}

/* Offsets into a chunk's planes are ints (the gathers' indices), at most a sample's x or dy per
 * sample the chunk spans: a layer too large for that runs im2col. */
static bool wino5_applies(const ch_conv_desc *d)
{
    if (d->kh != WR || d->kw != WR || d->stride != 1 || d->c < WINO5_MIN_C ||
        d->oc < WINO5_MIN_OC || d->oh <= 0 || d->ow <= 0)
        return false;
    const wgeo g = geo_of(d);
    const size_t x = (size_t)d->c * d->h * d->w, y = (size_t)d->oc * d->oh * d->ow;
    return (x > y ? x : y) * (size_t)chunk_samples(&g) < (size_t)INT_MAX;
}

static int team_size(int n, int nthreads) { return n < nthreads ? (n > 0 ? n : 1) : nthreads; }

/* Shared: U (NP x oc x c). Per thread: the two chunk buffers and the plane buffer. */
static size_t shared_len(const ch_conv_desc *d) { return (size_t)NP * d->oc * d->c; }
static size_t thread_len(const ch_conv_desc *d)
{
    const wgeo g = geo_of(d);
    return (size_t)NP * (d->c + d->oc) * WINO5_CHUNK + planes_len(&g);
}

size_t ch_cpu_wino5_workspace(const ch_conv_desc *d, int n, int nthreads)
{
    if (!wino5_applies(d)) return 0;
    return shared_len(d) + thread_len(d) * (size_t)team_size(n, nthreads);
}

/* Thread t's scratch. */
typedef struct wscratch {
    ch_real *v, *e, *planes;   /* V or dV chunk (c rows), M or E chunk (oc rows), padded planes */
} wscratch;

static wscratch scratch_of(const ch_kctx *kc, const wgeo *g, int t)
{
    const ch_conv_desc *d = g->d;
    wscratch s;
    s.v = kc->ws + shared_len(d) + thread_len(d) * (size_t)t;
    s.e = s.v + (size_t)NP * d->c * WINO5_CHUNK;
    s.planes = s.e + (size_t)NP * d->oc * WINO5_CHUNK;
    return s;
}

/* Thread t of T: its first sample into g, and its number of tiles. */
static int thread_tiles(wgeo *g, int n, int t, int T)
{
    g->s0 = (int)((long)n * t / T);
    return ((int)((long)n * (t + 1) / T) - g->s0) * g->per_sample;
}

static bool wino5_usable(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    return wino5_applies(d) && n > 0 && kc->ws &&
           kc->ws_len >= ch_cpu_wino5_workspace(d, n, kc->nthreads);
}

/* What a pass does with each chunk of a thread's tiles, and on what. */
typedef struct wpass wpass;
struct wpass {
    const ch_real *in, *bias;   /* x and b (forward, b may be NULL), or dy */
    ch_real *out;               /* y, or dx */
    bool sums_into_dx;          /* out is dx, which the chunks add into: zeroed first */
    void (*chunk)(const ch_kctx *kc, const wgeo *g, const wchunk *k, const wpass *p,
                  const ch_real *u, const wscratch *s);
};

/* Y for a chunk: V, then M[p] (oc x tiles) = U[p] (oc x c) V[p] (c x tiles), then AT M AT^T. */
static void forward_chunk(const ch_kctx *kc, const wgeo *g, const wchunk *k, const wpass *p,
                          const ch_real *u, const wscratch *s)
{
    const ch_conv_desc *d = g->d;
    transform_x(g, k, p->in, s->planes, s->v);
    for (int q = 0; q < NP; q++)
        ch_cpu_gemm(kc, false, false, d->oc, k->live, d->c, 1, u + (size_t)q * d->oc * d->c, d->c,
                    s->v + q * point_stride(d->c), WINO5_CHUNK, 0, s->e + q * point_stride(d->oc),
                    WINO5_CHUNK);
    ch_real out[WM * WM * TB];
    for (int o = 0; o < d->oc; o++)
        for (int b = 0; b * TB < k->live; b++) {
            transform_out(lanes_at(s->e, o, b), point_stride(d->oc), out);
            scatter_y(g, k, b, out, o, p->bias ? p->bias[o] : 0, p->out);
        }
}

/* Tiles in the chunk starting at t0 of a thread's `tiles`. */
static int chunk_live(int tiles, int t0)
{
    return tiles - t0 < WINO5_CHUNK ? tiles - t0 : WINO5_CHUNK;
}

/* A pass over the batch: U from w, then each thread's chunks in order. */
static void run_pass(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *w,
                     const wpass *p)
{
    const int T = team_size(n, kc->nthreads), pairs = d->oc * d->c;
    const size_t xs = (size_t)d->c * d->h * d->w;
    ch_real *u = kc->ws;
#pragma omp parallel num_threads(T) if (T > 1)
    {
        const int t = ch_omp_thread();
        transform_weights(d, w, pairs * t / T, pairs * (t + 1) / T, u);
        wgeo g = geo_of(d);
        const int tiles = thread_tiles(&g, n, t, T);
        if (p->sums_into_dx)
            memset(p->out + (size_t)g.s0 * xs, 0,
                   sizeof(ch_real) * xs * (size_t)(tiles / g.per_sample));
#pragma omp barrier
        const wscratch s = scratch_of(kc, &g, t);
        wchunk k;
        for (int t0 = 0; t0 < tiles; t0 += WINO5_CHUNK) {
            chunk_of(&g, t0, chunk_live(tiles, t0), &k);
            p->chunk(kc, &g, &k, p, u, &s);
        }
    }
}

bool ch_cpu_wino5_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                          const ch_real *w, const ch_real *b, ch_real *y)
{
    if (!wino5_usable(kc, d, n)) return false;
    run_pass(kc, d, n, w, &(wpass){ .in = x, .bias = b, .out = y, .chunk = forward_chunk });
    return true;
}

/* Where channel c's windows of dx add up for the chunk: dx itself, or zeroed padded planes. */
static ch_real *dx_planes(const wgeo *g, const wchunk *k, ch_real *dx, int c, ch_real *buf)
{
    const ch_conv_desc *d = g->d;
    if (g->x_in_place) return dx + ((size_t)k->sa * d->c + c) * d->h * d->w;
    memset(buf, 0, sizeof(ch_real) * (size_t)k->ns * g->xh * g->xw);
    return buf;
}

/* dx += the padded planes' inside (a sample split between chunks gets both parts). */
static void add_unpadded(const wgeo *g, const wchunk *k, const ch_real *buf, int c, ch_real *dx)
{
    const ch_conv_desc *d = g->d;
    for (int i = 0; i < k->ns; i++) {
        ch_real *to = dx + ((size_t)(k->sa + i) * d->c + c) * d->h * d->w;
        const ch_real *from = buf + (size_t)i * g->xh * g->xw + (size_t)d->pad * g->xw + d->pad;
        for (int r = 0; r < d->h; r++)
            for (int j = 0; j < d->w; j++) to[(size_t)r * d->w + j] += from[(size_t)r * g->xw + j];
    }
}

/* Block b's 7x7 windows added into the planes (windows overlap: lane by lane, in tile order). */
static void add_windows(const wgeo *g, const wchunk *k, int b, const ch_real *out, ch_real *planes)
{
    const int live = block_live(k, b);
    for (int l = 0; l < live; l++) {
        ch_real *to = planes + k->xoff[b * TB + l];
        for (int i = 0; i < WA; i++)
            for (int j = 0; j < WA; j++) to[i * g->xw + j] += out[(i * WA + j) * TB + l];
    }
}

/* dx for a chunk: E, then dV[p] (c x tiles) = U[p]^T E[p], then BT^T dV BT added into dx. */
static void backward_data_chunk(const ch_kctx *kc, const wgeo *g, const wchunk *k,
                                const wpass *p, const ch_real *u, const wscratch *s)
{
    const ch_conv_desc *d = g->d;
    ch_real *dx = p->out;
    transform_dy(g, k, p->in, s->planes, s->e);
    for (int q = 0; q < NP; q++)
        ch_cpu_gemm(kc, true, false, d->c, k->live, d->oc, 1, u + (size_t)q * d->oc * d->c, d->c,
                    s->e + q * point_stride(d->oc), WINO5_CHUNK, 0, s->v + q * point_stride(d->c),
                    WINO5_CHUNK);
    ch_real out[NP * TB];
    for (int c = 0; c < d->c; c++) {
        ch_real *planes = dx_planes(g, k, dx, c, s->planes);
        for (int b = 0; b * TB < k->live; b++) {
            adjoint_in(lanes_at(s->v, c, b), point_stride(d->c), out);
            add_windows(g, k, b, out, planes);
        }
        if (!g->x_in_place) add_unpadded(g, k, planes, c, dx);
    }
}

bool ch_cpu_wino5_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                const ch_real *w, ch_real *dx)
{
    if (!wino5_usable(kc, d, n)) return false;
    run_pass(kc, d, n, w,
             &(wpass){ .in = dy, .out = dx, .sums_into_dx = true, .chunk = backward_data_chunk });
    return true;
}
