/* Depthwise convolutions (one input and one output channel per group: MobileNet's, EfficientNet's,
 * ConvNeXt's 3x3 to 9x9 filters, any stride and dilation), direct rather than im2col + GEMM: a
 * group's GEMM is a 1 x k*k by k*k x P product, too small for a library call to pay for itself,
 * and the planes are small (7x7, 4x4), so row-by-row loops are all overhead. Instead each tap is
 * one long contiguous loop over the whole plane (see dw_geom), which the compiler vectorises
 * (AVX2 or AVX-512, whatever -march gives).
 * Small planes (MobileNetV2's 7x7 to 2x2 ones) take another layout: channels in the vector lanes
 * (ch_cpu_conv_dw_lanes).
 * Forward and backward data split the (sample, channel) planes among the threads; the weight
 * gradient splits the channels, and each thread sums its channels' samples in sample order, so
 * the bits do not depend on the thread count. */
#include "kernels/cpu/cpu.h"

#include <string.h>

/* Beyond 9x9 the grouped path's im2col is as good. */
enum { DW_MAX_TAPS = 81, L8 = 8 };

bool ch_cpu_conv_is_depthwise(const ch_conv_desc *d)
{
    return ch_conv_groups(d) > 1 && d->groups == d->c && d->oc == d->c && d->kh * d->kw <= DW_MAX_TAPS;
}

/* A plane is worked on in a "wide" layout that turns every tap into one long contiguous loop:
 * the zero-padded input is split into stride x stride phases (padded row r, column c go to phase
 * (r % s, c % s) at row r / s, column c / s), each phase a grid of rows of L = ceil(wp / s)
 * columns. Output (i, j) is then sum over taps t of w_t * phase_t[i * L + j + off_t], so with the
 * output kept L wide (its columns ow..L-1 are garbage, dropped or zeroed) a tap is
 * out[k] += w_t * phase_t[k + off_t] for k < oh * L, whatever the stride, dilation or size. */
typedef struct dw_geom {
    int s, D, L, rows;     /* stride, dilation, phase row length, rows per phase */
    size_t plane, wide;    /* floats per phase (slack for garbage reads included), per wide output */
    size_t per_thread;     /* the phases, then the wide output */
} dw_geom;

static dw_geom geom_of(const ch_conv_desc *d)
{
    dw_geom g;
    g.s = d->stride;
    g.D = ch_conv_dilation(d);
    g.L = (d->w + 2 * d->pad + g.s - 1) / g.s;
    g.rows = (d->h + 2 * d->pad + g.s - 1) / g.s;
    /* The wide output rounded up to whole lane blocks for the weight gradient's sums. */
    g.wide = ((size_t)d->oh * g.L + L8 - 1) / L8 * L8;
    /* A tap reads up to wide - 1 + its offset, and an offset is below rows * L - (oh - 1) * L. */
    g.plane = (size_t)g.rows * g.L + g.wide;
    g.per_thread = (size_t)g.s * g.s * g.plane + g.wide;
    return g;
}

static size_t thread_len(const ch_conv_desc *d);

size_t ch_cpu_conv_dw_workspace(const ch_conv_desc *d, int nthreads)
{
    return thread_len(d) * (size_t)(nthreads > 0 ? nthreads : 1);
}

/* Rows here are 2 to 100 floats: a loop, not a memcpy call per row. */
static inline void copy_row(ch_real *dst, const ch_real *src, int len)
{
    for (int j = 0; j < len; j++) dst[j] = src[j];
}

/* Where tap (p, q) starts reading: its phase, and its row and column in it. */
static size_t tap_offset(const dw_geom *g, int p, int q)
{
    const int r = p * g->D, c = q * g->D;
    return (size_t)((r % g->s) * g->s + c % g->s) * g->plane + (size_t)(r / g->s) * g->L + (size_t)(c / g->s);
}

/* At stride 1 the one phase is the padded plane: only its border and slack need zeros. */
static void pad_plane(const ch_conv_desc *d, const dw_geom *g, const ch_real *x, ch_real *ph)
{
    const size_t top = (size_t)d->pad * g->L, body = (size_t)(d->pad + d->h) * g->L;
    memset(ph, 0, sizeof(ch_real) * top);
    for (int ih = 0; ih < d->h; ih++) {
        ch_real *row = ph + top + (size_t)ih * g->L;
        for (int j = 0; j < d->pad; j++) row[j] = 0;
        copy_row(row + d->pad, x + (size_t)ih * d->w, d->w);
        for (int j = d->pad + d->w; j < g->L; j++) row[j] = 0;
    }
    memset(ph + body, 0, sizeof(ch_real) * (g->plane - body));
}

/* Padded row r's part in column phase pc: *at is where it starts in the phase, and it holds input
 * columns iw0, iw0 + s, ... (cnt of them). One division per row, none per element. */
static void phase_row(const ch_conv_desc *d, const dw_geom *g, ch_real *ph, int r, int pc, ch_real **at,
                      int *iw0, int *cnt)
{
    const int first = ((pc - d->pad) % g->s + g->s) % g->s;   /* (first + pad) % s == pc */
    *iw0 = first;
    *cnt = first < d->w ? (d->w - 1 - first) / g->s + 1 : 0;
    *at = ph + (size_t)((r % g->s) * g->s + pc) * g->plane + (size_t)(r / g->s) * g->L + (first + d->pad) / g->s;
}

/* The phases of one zero-padded input plane. */
static void to_phases(const ch_conv_desc *d, const dw_geom *g, const ch_real *x, ch_real *ph)
{
    if (g->s == 1) {
        pad_plane(d, g, x, ph);
        return;
    }
    memset(ph, 0, sizeof(ch_real) * (size_t)g->s * g->s * g->plane);
    for (int ih = 0; ih < d->h; ih++) {
        const int r = ih + d->pad;
        const ch_real *xr = x + (size_t)ih * d->w;
        for (int pc = 0; pc < g->s; pc++) {
            ch_real *dst;
            int iw0, cnt;
            phase_row(d, g, ph, r, pc, &dst, &iw0, &cnt);
            for (int t = 0; t < cnt; t++) dst[t] = xr[iw0 + t * g->s];
        }
    }
}

/* dx = the phases' entries inside the unpadded plane (the adjoint of to_phases). */
static void from_phases(const ch_conv_desc *d, const dw_geom *g, const ch_real *ph, ch_real *dx)
{
    for (int ih = 0; ih < d->h; ih++) {
        const int r = ih + d->pad;
        ch_real *dr = dx + (size_t)ih * d->w;
        if (g->s == 1) {
            copy_row(dr, ph + (size_t)r * g->L + d->pad, d->w);
            continue;
        }
        for (int pc = 0; pc < g->s; pc++) {
            ch_real *src;
            int iw0, cnt;
            phase_row(d, g, (ch_real *)ph, r, pc, &src, &iw0, &cnt);
            for (int t = 0; t < cnt; t++) dr[iw0 + t * g->s] = src[t];
        }
    }
}

/* One plane of dy in the wide layout, its garbage columns and the rounding tail zero. */
static void to_wide(const ch_conv_desc *d, const dw_geom *g, const ch_real *dy, ch_real *wide)
{
    memset(wide, 0, sizeof(ch_real) * g->wide);
    for (int i = 0; i < d->oh; i++)
        copy_row(wide + (size_t)i * g->L, dy + (size_t)i * d->ow, d->ow);
}

/* wide[k] = bias + sum over taps of w_t * phase_t[k + off_t], k < oh * L. 3x3 filters (nearly all
 * of them) take one pass with the nine taps in registers; other sizes a pass per tap. */
static void wide_taps(const ch_conv_desc *d, const dw_geom *g, const ch_real *ph, const ch_real *wc,
                      ch_real bias, ch_real *wide)
{
    const size_t len = (size_t)d->oh * g->L;
    if (d->kh == 3 && d->kw == 3) {
        const ch_real *t[9];
        for (int i = 0; i < 9; i++) t[i] = ph + tap_offset(g, i / 3, i % 3);
        const ch_real w0 = wc[0], w1 = wc[1], w2 = wc[2], w3 = wc[3], w4 = wc[4], w5 = wc[5], w6 = wc[6],
                      w7 = wc[7], w8 = wc[8];
        for (size_t k = 0; k < len; k++)
            wide[k] = bias + w0 * t[0][k] + w1 * t[1][k] + w2 * t[2][k] + w3 * t[3][k] + w4 * t[4][k] +
                      w5 * t[5][k] + w6 * t[6][k] + w7 * t[7][k] + w8 * t[8][k];
        return;
    }
    for (size_t k = 0; k < len; k++) wide[k] = bias;
    for (int p = 0; p < d->kh; p++)
        for (int q = 0; q < d->kw; q++) {
            const ch_real wv = wc[p * d->kw + q], *src = ph + tap_offset(g, p, q);
            for (size_t k = 0; k < len; k++) wide[k] += wv * src[k];
        }
}

static void plane_forward(const ch_conv_desc *d, const dw_geom *g, const ch_real *x, const ch_real *wc,
                          ch_real bias, ch_real *ph, ch_real *wide, ch_real *y)
{
    to_phases(d, g, x, ph);
    wide_taps(d, g, ph, wc, bias, wide);
    for (int i = 0; i < d->oh; i++) {
        ch_real *yr = y + (size_t)i * d->ow;
        copy_row(yr, wide + (size_t)i * g->L, d->ow);
        if (d->relu) ch_cpu_relu_span((size_t)d->ow, yr, yr);
    }
}

/* At stride 1 with a square filter, backward data is itself a depthwise convolution: dy padded by
 * D * (k - 1) - pad, with the filter turned round. This is that convolution's geometry, or false
 * where it does not apply (the pass then scatters tap by tap). */
static bool transposed(const ch_conv_desc *d, ch_conv_desc *t)
{
    const int D = ch_conv_dilation(d);
    if (d->stride != 1 || d->kh != d->kw || d->pad > D * (d->kh - 1)) return false;
    *t = *d;
    t->h = d->oh, t->w = d->ow, t->oh = d->h, t->ow = d->w;
    t->pad = D * (d->kh - 1) - d->pad;
    t->relu = false;
    return true;
}

static bool lanes_pay(const ch_conv_desc *d);
static size_t lanes_len(const ch_conv_desc *d);

/* Floats of workspace per thread: the larger of the two geometries a pass may use. */
static size_t thread_len(const ch_conv_desc *d)
{
    if (lanes_pay(d)) return lanes_len(d);
    ch_conv_desc t;
    const size_t own = geom_of(d).per_thread;
    if (!transposed(d, &t)) return own;
    const size_t other = geom_of(&t).per_thread;
    return own > other ? own : other;
}

/* The stride-1 backward data of one plane as its transposed convolution t (geometry tg). */
static void plane_backward_turned(const ch_conv_desc *t, const dw_geom *tg, const ch_real *dy, const ch_real *wc,
                                  ch_real *ph, ch_real *dx)
{
    ch_real turned[DW_MAX_TAPS];
    const int taps = t->kh * t->kw;
    for (int i = 0; i < taps; i++) turned[i] = wc[taps - 1 - i];
    plane_forward(t, tg, dy, turned, 0, ph, ph + (size_t)tg->s * tg->s * tg->plane, dx);
}

/* Backward data of one plane otherwise: each tap scatters w_t * dy into its phase. */
static void plane_backward_scatter(const ch_conv_desc *d, const dw_geom *g, const ch_real *dy,
                                   const ch_real *wc, ch_real *ph, ch_real *dx)
{
    ch_real *wide = ph + (size_t)g->s * g->s * g->plane;
    to_wide(d, g, dy, wide);
    memset(ph, 0, sizeof(ch_real) * (size_t)g->s * g->s * g->plane);
    const size_t len = (size_t)d->oh * g->L;
    for (int p = 0; p < d->kh; p++)
        for (int q = 0; q < d->kw; q++) {
            const ch_real wv = wc[p * d->kw + q];
            ch_real *dst = ph + tap_offset(g, p, q);
            for (size_t k = 0; k < len; k++) dst[k] += wv * wide[k];
        }
    from_phases(d, g, ph, dx);
}

/* Lane sums of one tap: lane[l] += sum over k = l mod L8 of dy_wide[k] * phase_t[k + off_t]. */
static void tap_lanes(const dw_geom *g, const ch_real *wide, const ch_real *src, ch_real lane[L8])
{
    for (size_t k = 0; k < g->wide; k += L8) {
#pragma omp simd
        for (int l = 0; l < L8; l++) lane[l] += wide[k + l] * src[k + l];
    }
}

/* The nine taps of a 3x3 filter and the bias in one pass over the plane: ten independent chains
 * of lane sums where a pass per row of taps had three (each a multiply-add's latency a step), and
 * dy read once, not four times (MobileNetV2's 28x28 and 14x14 layers' weight pass 1.15-1.35x).
 * Each lane sums in k order as separate passes do: the same bits. */
static void nine_tap_sums(const dw_geom *g, const ch_real *ph, const ch_real *wide, double (*acc)[L8],
                          double bias[L8])
{
    const ch_real *t[9];
    for (int i = 0; i < 9; i++) t[i] = ph + tap_offset(g, i / 3, i % 3);
    ch_real s[9][L8] = { { 0 } }, lb[L8] = { 0 };
    for (size_t k = 0; k < g->wide; k += L8) {
#pragma omp simd
        for (int l = 0; l < L8; l++) {
            const ch_real v = wide[k + l];
            lb[l] += v;
            s[0][l] += v * t[0][k + l], s[1][l] += v * t[1][k + l], s[2][l] += v * t[2][k + l];
            s[3][l] += v * t[3][k + l], s[4][l] += v * t[4][k + l], s[5][l] += v * t[5][k + l];
            s[6][l] += v * t[6][k + l], s[7][l] += v * t[7][k + l], s[8][l] += v * t[8][k + l];
        }
    }
    for (int l = 0; l < L8; l++) bias[l] += lb[l];
    for (int i = 0; i < 9; i++)
        for (int l = 0; l < L8; l++) acc[i][l] += s[i][l];
}

/* acc[t][l] += lane l of sum_k dy_wide[k] * phase_t[k + off_t] for one plane, and bias[l] += lane
 * l of sum_k dy_wide[k]: float lanes over the plane (loops the compiler vectorises without
 * reassociating a sum), added to double lanes, which the caller sums once per channel. 3x3
 * filters take one pass; other sizes a pass for the bias and one per tap. */
static void plane_weight_sums(const ch_conv_desc *d, const dw_geom *g, const ch_real *x, const ch_real *dy,
                              ch_real *ph, ch_real *wide, double (*acc)[L8], double bias[L8])
{
    to_phases(d, g, x, ph);
    to_wide(d, g, dy, wide);
    if (d->kh == 3 && d->kw == 3) {
        nine_tap_sums(g, ph, wide, acc, bias);
        return;
    }
    ch_real lb[L8] = { 0 };
    for (size_t k = 0; k < g->wide; k += L8) {
#pragma omp simd
        for (int l = 0; l < L8; l++) lb[l] += wide[k + l];
    }
    for (int l = 0; l < L8; l++) bias[l] += lb[l];
    for (int p = 0; p < d->kh; p++)
        for (int q = 0; q < d->kw; q++) {
            ch_real lane[L8] = { 0 };
            tap_lanes(g, wide, ph + tap_offset(g, p, q), lane);
            for (int l = 0; l < L8; l++) acc[p * d->kw + q][l] += lane[l];
        }
}

/* Small planes: channels in the lanes. At 2x2 a plane's wide layout (its phases zeroed and
 * filled, nine taps over 8 floats, the copy out) cost ~110 ns a plane for 16 multiply-adds:
 * MobileNetV2's last depthwise layers (960 channels at 2x2, batch 64) took 7 ms forward and 21 ms
 * backward each, and its depthwise layers together half its step. Here DW_CB consecutive channels of one sample, whose
 * planes lie one after another, are turned into positions of DW_CB lanes (lanes_in), each output
 * sums the taps that fall inside the input, in tap order from the bias as wide_taps does (without
 * its products of padding zeros), and the block is turned back (lanes_out). The weight gradient
 * sums each channel's products over samples, then positions, in double. */
enum { DW_CB = 16, DW_LANES_IN = 4096 };

/* Where the lanes are the faster (bench/conv_kernels' mbv2.* shapes, batch 64, 2 threads, a
 * Cascade Lake: docs/PERFORMANCE.md): planes of up to 7x7 outputs, and strided layers up to 14x14
 * outputs, whose phases cost the wide layout most; at 14x14 and stride 1 the wide layout wins. */
bool ch_cpu_conv_dw_lanes(const ch_conv_desc *d)
{
    const long out = (long)d->oh * d->ow;
    return (out <= 49 || (d->stride > 1 && out <= 196)) && (long)d->h * d->w <= DW_LANES_IN;
}

static bool lanes_pay(const ch_conv_desc *d) { return ch_cpu_conv_dw_lanes(d); }

/* A thread's input and output positions of one block. */
static size_t lanes_len(const ch_conv_desc *d)
{
    return ((size_t)d->h * d->w + (size_t)d->oh * d->ow) * DW_CB;
}

/* to[k*DW_CB + l] = from[l*len + k] for the block's cb channels; lanes past cb zero. */
static void lanes_in(const ch_real *restrict from, int len, int cb, ch_real *restrict to)
{
    for (int k = 0; k < len; k++) {
        for (int l = 0; l < cb; l++) to[(size_t)k * DW_CB + l] = from[(size_t)l * len + k];
        for (int l = cb; l < DW_CB; l++) to[(size_t)k * DW_CB + l] = 0;
    }
}

static void lanes_out(const ch_real *restrict from, int len, int cb, ch_real *restrict to)
{
    for (int l = 0; l < cb; l++)
        for (int k = 0; k < len; k++) to[(size_t)l * len + k] = from[(size_t)k * DW_CB + l];
}

/* Tap (p, q) of output o: the input position it reads, or -1 where that is padding. */
static int tap_input(const ch_conv_desc *d, int o, int p, int q)
{
    const int D = ch_conv_dilation(d);
    const int ih = o / d->ow * d->stride - d->pad + p * D, iw = o % d->ow * d->stride - d->pad + q * D;
    return ih < 0 || ih >= d->h || iw < 0 || iw >= d->w ? -1 : ih * d->w + iw;
}

/* The block's filters as taps of DW_CB lanes (and its bias, when asked), lanes past cb zero. */
static void lanes_weights(const ch_conv_desc *d, const ch_real *w, const ch_real *b, int c0, int cb,
                          ch_real *wt, ch_real *bt)
{
    const int taps = d->kh * d->kw;
    lanes_in(w + (size_t)c0 * taps, taps, cb, wt);
    for (int l = 0; l < DW_CB; l++) bt[l] = b && l < cb ? b[c0 + l] : 0;
}

static int blocks_of(const ch_conv_desc *d) { return (d->c + DW_CB - 1) / DW_CB; }
static int block_size(const ch_conv_desc *d, int c0) { return d->c - c0 < DW_CB ? d->c - c0 : DW_CB; }

/* Job i of the forward's and backward data's n * blocks_of(d): its sample's block of cb channels
 * from c0, whose planes start at plane pc0, and the calling thread's input positions (P of them)
 * and output positions (O). */
typedef struct dw_job {
    int c0, cb;
    size_t pc0;
    ch_real *in, *out;
} dw_job;

static dw_job job_of(const ch_kctx *kc, const ch_conv_desc *d, long i)
{
    dw_job j;
    const int nb = blocks_of(d);
    j.c0 = (int)(i % nb) * DW_CB, j.cb = block_size(d, j.c0);
    j.pc0 = (size_t)(i / nb) * d->c + (size_t)j.c0;
    j.in = kc->ws + lanes_len(d) * (size_t)ch_omp_thread();
    j.out = j.in + (size_t)d->h * d->w * DW_CB;
    return j;
}

static void lanes_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                          const ch_real *w, const ch_real *b, ch_real *y)
{
    const int P = d->h * d->w, O = d->oh * d->ow;
    const long jobs = (long)n * blocks_of(d);
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long i = 0; i < jobs; i++) {
        const dw_job j = job_of(kc, d, i);
        const int cb = j.cb;
        const size_t pc0 = j.pc0;
        ch_real *xt = j.in, *yt = j.out, wt[DW_MAX_TAPS * DW_CB], bt[DW_CB];
        lanes_weights(d, w, b, j.c0, cb, wt, bt);
        lanes_in(x + pc0 * P, P, cb, xt);
        for (int o = 0; o < O; o++) {
            ch_real acc[DW_CB];
            memcpy(acc, bt, sizeof acc);
            for (int p = 0; p < d->kh; p++)
                for (int q = 0; q < d->kw; q++) {
                    const int ip = tap_input(d, o, p, q);
                    if (ip < 0) continue;
                    const ch_real *wv = wt + (size_t)(p * d->kw + q) * DW_CB, *xv = xt + (size_t)ip * DW_CB;
#pragma omp simd
                    for (int l = 0; l < DW_CB; l++) acc[l] += wv[l] * xv[l];
                }
#pragma omp simd
            for (int l = 0; l < DW_CB; l++) yt[(size_t)o * DW_CB + l] = d->relu && acc[l] < 0 ? 0 : acc[l];
        }
        lanes_out(yt, O, cb, y + pc0 * O);
    }
}

static void lanes_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                const ch_real *w, ch_real *dx)
{
    const int P = d->h * d->w, O = d->oh * d->ow;
    const long jobs = (long)n * blocks_of(d);
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long i = 0; i < jobs; i++) {
        const dw_job j = job_of(kc, d, i);
        const int cb = j.cb;
        const size_t pc0 = j.pc0;
        ch_real *dxt = j.in, *dyt = j.out, wt[DW_MAX_TAPS * DW_CB], bt[DW_CB];
        lanes_weights(d, w, NULL, j.c0, cb, wt, bt);
        lanes_in(dy + pc0 * O, O, cb, dyt);
        memset(dxt, 0, sizeof(ch_real) * (size_t)P * DW_CB);
        for (int o = 0; o < O; o++)
            for (int p = 0; p < d->kh; p++)
                for (int q = 0; q < d->kw; q++) {
                    const int ip = tap_input(d, o, p, q);
                    if (ip < 0) continue;
                    const ch_real *wv = wt + (size_t)(p * d->kw + q) * DW_CB, *gv = dyt + (size_t)o * DW_CB;
                    ch_real *to = dxt + (size_t)ip * DW_CB;
#pragma omp simd
                    for (int l = 0; l < DW_CB; l++) to[l] += wv[l] * gv[l];
                }
        lanes_out(dxt, P, cb, dx + pc0 * P);
    }
}

/* One sample's part of a block's weight gradient: acc[t][l] and bias[l] take its products. */
static void lanes_weight_sums(const ch_conv_desc *d, const ch_real *xt, const ch_real *dyt,
                              double (*acc)[DW_CB], double bias[DW_CB])
{
    for (int o = 0; o < d->oh * d->ow; o++) {
        const ch_real *gv = dyt + (size_t)o * DW_CB;
#pragma omp simd
        for (int l = 0; l < DW_CB; l++) bias[l] += gv[l];
        for (int p = 0; p < d->kh; p++)
            for (int q = 0; q < d->kw; q++) {
                const int ip = tap_input(d, o, p, q);
                if (ip < 0) continue;
                const ch_real *xv = xt + (size_t)ip * DW_CB;
                double *a = acc[p * d->kw + q];
#pragma omp simd
                for (int l = 0; l < DW_CB; l++) a[l] += (double)gv[l] * xv[l];
            }
    }
}

static void lanes_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                   const ch_real *y, ch_real *dy, ch_real *dw, ch_real *db)
{
    const int P = d->h * d->w, O = d->oh * d->ow, nb = blocks_of(d), taps = d->kh * d->kw;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (int blk = 0; blk < nb; blk++) {
        ch_real *xt = kc->ws + lanes_len(d) * (size_t)ch_omp_thread(), *dyt = xt + (size_t)P * DW_CB;
        const int c0 = blk * DW_CB, cb = block_size(d, c0);
        double acc[DW_MAX_TAPS][DW_CB] = { { 0 } }, bias[DW_CB] = { 0 };
        for (int s = 0; s < n; s++) {
            const size_t pc0 = (size_t)s * d->c + (size_t)c0;
            /* The fused ReLU's backward: dy is an output too (see kernels.h). */
            if (d->relu) ch_cpu_relu_backward_span((size_t)cb * O, y + pc0 * O, dy + pc0 * O, dy + pc0 * O);
            lanes_in(x + pc0 * P, P, cb, xt);
            lanes_in(dy + pc0 * O, O, cb, dyt);
            lanes_weight_sums(d, xt, dyt, acc, bias);
        }
        for (int l = 0; l < cb; l++) {
            for (int t = 0; t < taps; t++) dw[(size_t)(c0 + l) * taps + t] = (ch_real)acc[t][l];
            if (db) db[c0 + l] = (ch_real)bias[l];
        }
    }
}

void ch_cpu_conv_dw_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                            const ch_real *w, const ch_real *b, ch_real *y)
{
    if (lanes_pay(d)) {
        lanes_forward(kc, d, n, x, w, b, y);
        return;
    }
    const dw_geom g = geom_of(d);
    const size_t per = thread_len(d);
    const size_t xp = (size_t)d->h * d->w, yp = (size_t)d->oh * d->ow, taps = (size_t)d->kh * d->kw;
    const long planes = (long)n * d->c;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pc = 0; pc < planes; pc++) {
        ch_real *ph = kc->ws + per * (size_t)ch_omp_thread();
        const int c = (int)(pc % d->c);
        plane_forward(d, &g, x + (size_t)pc * xp, w + (size_t)c * taps, b ? b[c] : 0, ph,
                      ph + (size_t)g.s * g.s * g.plane, y + (size_t)pc * yp);
    }
}

void ch_cpu_conv_dw_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                  const ch_real *w, ch_real *dx)
{
    if (lanes_pay(d)) {
        lanes_backward_data(kc, d, n, dy, w, dx);
        return;
    }
    /* Which way, and its geometry, once per call rather than per plane. */
    ch_conv_desc t;
    const bool turn = transposed(d, &t);
    const dw_geom g = geom_of(turn ? &t : d);
    const size_t per = thread_len(d);
    const size_t xp = (size_t)d->h * d->w, yp = (size_t)d->oh * d->ow, taps = (size_t)d->kh * d->kw;
    const long planes = (long)n * d->c;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pc = 0; pc < planes; pc++) {
        ch_real *ph = kc->ws + per * (size_t)ch_omp_thread();
        const ch_real *dyp = dy + (size_t)pc * yp, *wc = w + (size_t)(pc % d->c) * taps;
        if (turn)
            plane_backward_turned(&t, &g, dyp, wc, ph, dx + (size_t)pc * xp);
        else
            plane_backward_scatter(d, &g, dyp, wc, ph, dx + (size_t)pc * xp);
    }
}

void ch_cpu_conv_dw_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                     const ch_real *y, ch_real *dy, ch_real *dw, ch_real *db)
{
    if (lanes_pay(d)) {
        lanes_backward_weights(kc, d, n, x, y, dy, dw, db);
        return;
    }
    const dw_geom g = geom_of(d);
    const size_t per = thread_len(d);
    const size_t xp = (size_t)d->h * d->w, yp = (size_t)d->oh * d->ow, taps = (size_t)d->kh * d->kw;
    const size_t cs = (size_t)d->c;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (int c = 0; c < d->c; c++) {
        ch_real *ph = kc->ws + per * (size_t)ch_omp_thread();
        double acc[DW_MAX_TAPS][L8] = { { 0 } }, bias[L8] = { 0 };
        for (int s = 0; s < n; s++) {
            const size_t pc = (size_t)s * cs + (size_t)c;
            /* The fused ReLU's backward: dy is an output too (see kernels.h). */
            if (d->relu) ch_cpu_relu_backward_span(yp, y + pc * yp, dy + pc * yp, dy + pc * yp);
            plane_weight_sums(d, &g, x + pc * xp, dy + pc * yp, ph, ph + (size_t)g.s * g.s * g.plane, acc, bias);
        }
        for (size_t t = 0; t < taps; t++) {
            double sum = 0;
            for (int l = 0; l < L8; l++) sum += acc[t][l];
            dw[(size_t)c * taps + t] = (ch_real)sum;
        }
        if (db) {
            double sum = 0;
            for (int l = 0; l < L8; l++) sum += bias[l];
            db[c] = (ch_real)sum;
        }
    }
}
