/* Winograd F(3x3, 5x5), written here, all three passes, for 5x5 stride-1 convolutions with at
 * least WINO_MIN_C channels in and WINO_MIN_OC out: lenet's second layer (20 -> 50 on
 * 13x13) and mnist-cnn's (20 -> 20 on 14x14, pad 2). oneDNN has Winograd for 3x3 kernels only
 * (cpu_wino.c).
 * Why: those layers are ~90% and ~80% of their nets' arithmetic, and im2col + GEMM already ran them
 * near the GEMM's speed. F(3x3, 5x5) computes a 3x3 block of outputs from a 7x7 input tile with 49
 * multiplies per channel pair where the direct form does 9 x 25 = 225.
 * Why samples in the vector lanes: a group of TB samples is transposed once (pack_group) so that
 * element (r, c) of a channel's plane is one vector holding it for all TB samples. A tile's 7x7
 * window is then 49 plain vector loads, its 3x3 outputs 9 plain stores, and every transform is
 * lane-wise. Putting tiles in the lanes instead (the first version) needed a gather per window
 * element and a scalar scatter per output: the transforms cost more than the GEMMs, and lenet's
 * step ran at ~18,000 img/s against ~26,000 this way (batch 256, 2 threads, this machine). The
 * price: a group's lanes past the batch's end compute on zeros (a batch of 100 is 7 groups).
 * Why 16 output channels: the transforms cost per channel, the GEMMs per channel pair. With the
 * gathers, mnist-cnn's 20 -> 20 layer was slower than im2col; without them its step is 6-13%
 * faster (measured at 16 and 32 as the threshold, interleaved).
 * Backward weights too: dU(o,c) = sum over tiles of E(o) . V(c), one GEMM per point over the
 * chunk's columns, then dg = G^T dU G. It rounds more than im2col (the adjoint transform of the
 * weights cancels large terms: ~4e-6 relative RMS in float against the reference), which SGD
 * does not feel, and it took lenet's step from ~23,000 to ~29,500 img/s. (With tiles in the
 * lanes it had added only 2-5%.) Each lane is treated alike, so forward and backward data give a
 * sample the same bits wherever the batch puts it; dw and db are summed per thread and added in
 * thread order, so the same split gives the same bits.
 * The algebra, with the interpolation points 0, 1, -1, 2, -2, -1/2 and infinity (matrices below):
 *   forward:          Y = AT [ sum_c U(o,c) . V(c) ] AT^T,  U = G g G^T,  V = BT d BT^T
 *   backward data:    the adjoint of that map in d, so it is exact for the same tiles:
 *                     dd(c) = BT^T [ sum_o U(o,c) . E(o) ] BT,  E = AT^T dY AT, added into dx
 *   backward weights: the adjoint in g: dg(o,c) = G^T [ sum_tiles E(o) . V(c) ] G
 * ("." is elementwise over the 49 points.) Each sum over channels is a GEMM per point p (49 of
 * them): the transforms write their results as [p][channel][position][lane] so that each point's
 * matrix is a plain row-major block, a chunk of up to WINO_POS tile positions wide.
 * How the work is cut: the batch is cut into groups of TB samples; threads take contiguous runs of
 * groups; a group's tile positions (ceil(oh/3) x ceil(ow/3), the last row and column clipped) go
 * through the GEMMs in chunks.
 * Numerically the transforms round more than a direct sum: test_kernels holds y and dx to 1e-5 of
 * each result's scale, dw to 3e-5. */
#include "kernels/cpu/cpu.h"

enum {
    WM = 3, WR = 5, WA = WM + WR - 1, NP = WA * WA, /* output tile, kernel, input tile, points */
    TB = CH_CPU_LANES,                    /* samples transformed at once, one per lane */
    WINO_POS = 10,                        /* tile positions per GEMM at most */
    WINO_COLS = WINO_POS * TB,            /* a chunk buffer's row, at most */
    WINO_MIN_C = 8, WINO_MIN_OC = 16,     /* below these the transforms cost more than they save */
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

#define WINO_FN(name) ch_cpu_wino5_##name
#include "kernels/cpu/wino_body.h"
