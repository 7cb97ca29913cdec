/* Winograd F(4x4, 3x3), written here, all three passes, for 3x3 stride-1 convolutions with at
 * least WINO_MIN_C channels in and WINO_MIN_OC out that oneDNN's Winograd (cpu_wino.c) does not
 * take: every such layer on a CPU without AVX-512 (this project's Zen 3 machines), and channel
 * counts that are not multiples of 16 elsewhere. ResNet-20's and VGG's 3x3 layers, resnet18's.
 * Why: on AVX2 those layers ran as im2col + sgemm, ~70% of ResNet-20's step, with im2col a fifth
 * of it. F(4x4, 3x3) computes a 4x4 block of outputs from a 6x6 input tile with 36 multiplies per
 * channel pair where the direct form does 16 x 9 = 144.
 * The machinery (samples in the vector lanes, chunks of tile positions through one batched GEMM
 * per point, the adjoint passes) is cpu_wino5.c's, shared through wino_body.h; this file gives
 * the sizes and the transforms. The points 0, 1, -1, 2, -2 and infinity round less than
 * F(3x3, 5x5)'s seven: test_kernels holds y and dx to 1e-5 of each result's scale, dw to 3e-5,
 * as for that one. */
#include "kernels/cpu/cpu.h"

enum {
    WM = 4, WR = 3, WA = WM + WR - 1, NP = WA * WA, /* output tile, kernel, input tile, points */
    TB = CH_CPU_LANES,                    /* samples transformed at once, one per lane */
    WINO_POS = 10,                        /* tile positions per GEMM at most */
    WINO_COLS = WINO_POS * TB,            /* a chunk buffer's row, at most */
    WINO_MIN_C = 8, WINO_MIN_OC = 16,     /* F(3x3, 5x5)'s thresholds, not measured for 3x3 */
};

/* --precision bf16 layers multiply their point GEMMs in bf16 (wino_body.h, products_in_bf16). */
#define WINO_BF16 1

/* The matrices (Lavin and Gray's, for the points 0, 1, -1, 2, -2 and infinity; the transforms
 * below are these rows written out, zeros skipped):
 *   AT (4 x 6)             BT (6 x 6)
 *   1  1  1  1  1  0       4  0 -5  0  1  0
 *   0  1 -1  2 -2  0       0 -4 -4  1  1  0
 *   0  1  1  4  4  0       0  4 -4 -1  1  0
 *   0  1 -1  8 -8  1       0 -2 -1  2  1  0
 *                          0  2 -1 -2  1  0
 *                          0  4  0 -5  0  1
 * and G (6 x 3) here: */
static const ch_real G[WA][WR] = {
    { 1.0 / 4, 0, 0 },
    { -1.0 / 6, -1.0 / 6, -1.0 / 6 },
    { -1.0 / 6, 1.0 / 6, -1.0 / 6 },
    { 1.0 / 24, 1.0 / 12, 1.0 / 6 },
    { 1.0 / 24, -1.0 / 12, 1.0 / 6 },
    { 0, 0, 1 },
};

/* One-dimensional transforms on TB lanes: input k of lane j is in[k*is + j], output i goes to
 * out[i*os + j]. */
static void bt_lanes(const ch_real *restrict in, size_t is, ch_real *restrict out, size_t os)
{
#pragma omp simd
    for (int j = 0; j < TB; j++) {
        const ch_real d0 = in[j], d1 = in[is + j], d2 = in[2 * is + j], d3 = in[3 * is + j];
        const ch_real d4 = in[4 * is + j], d5 = in[5 * is + j];
        out[j] = 4 * d0 - 5 * d2 + d4;
        out[os + j] = -4 * d1 - 4 * d2 + d3 + d4;
        out[2 * os + j] = 4 * d1 - 4 * d2 - d3 + d4;
        out[3 * os + j] = -2 * d1 - d2 + 2 * d3 + d4;
        out[4 * os + j] = 2 * d1 - d2 - 2 * d3 + d4;
        out[5 * os + j] = 4 * d1 - 5 * d3 + d5;
    }
}

static void btt_lanes(const ch_real *restrict in, size_t is, ch_real *restrict out, size_t os)
{
#pragma omp simd
    for (int j = 0; j < TB; j++) {
        const ch_real e0 = in[j], e1 = in[is + j], e2 = in[2 * is + j], e3 = in[3 * is + j];
        const ch_real e4 = in[4 * is + j], e5 = in[5 * is + j];
        out[j] = 4 * e0;
        out[os + j] = -4 * e1 + 4 * e2 - 2 * e3 + 2 * e4 + 4 * e5;
        out[2 * os + j] = -5 * e0 - 4 * e1 - 4 * e2 - e3 - e4;
        out[3 * os + j] = e1 - e2 + 2 * e3 - 2 * e4 - 5 * e5;
        out[4 * os + j] = e0 + e1 + e2 + e3 + e4;
        out[5 * os + j] = e5;
    }
}

static void at_lanes(const ch_real *restrict in, size_t is, ch_real *restrict out, size_t os)
{
#pragma omp simd
    for (int j = 0; j < TB; j++) {
        const ch_real m0 = in[j], m1 = in[is + j], m2 = in[2 * is + j], m3 = in[3 * is + j];
        const ch_real m4 = in[4 * is + j], m5 = in[5 * is + j];
        out[j] = m0 + m1 + m2 + m3 + m4;
        out[os + j] = m1 - m2 + 2 * m3 - 2 * m4;
        out[2 * os + j] = m1 + m2 + 4 * m3 + 4 * m4;
        out[3 * os + j] = m1 - m2 + 8 * m3 - 8 * m4 + m5;
    }
}

static void att_lanes(const ch_real *restrict in, size_t is, ch_real *restrict out, size_t os)
{
#pragma omp simd
    for (int j = 0; j < TB; j++) {
        const ch_real y0 = in[j], y1 = in[is + j], y2 = in[2 * is + j], y3 = in[3 * is + j];
        out[j] = y0;
        out[os + j] = y0 + y1 + y2 + y3;
        out[2 * os + j] = y0 - y1 + y2 - y3;
        out[3 * os + j] = y0 + 2 * y1 + 4 * y2 + 8 * y3;
        out[4 * os + j] = y0 - 2 * y1 + 4 * y2 - 8 * y3;
        out[5 * os + j] = y3;
    }
}

#define WINO_FN(name) ch_cpu_wino3_##name
#include "kernels/cpu/wino_body.h"
