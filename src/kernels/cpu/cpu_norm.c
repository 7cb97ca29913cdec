/* Batch-normalisation pieces, parallel over channels, and layer normalisation, parallel over its
 * groups (the parameter gradients over their elements, each summed in one fixed order). Per-channel sums go through float lanes of at
 * most 64 terms into double: a float sum over 256*28*28 elements would lose digits that the
 * variance needs, and all-double sums cost MobileNetV2 a fifth of its step (float vectors hold twice
 * the numbers and need no conversion). */
#include "kernels/cpu/cpu.h"

#include <omp.h>
#include <string.h>
#include "core/bf16.h"
#include "kernels/norm_body.h"

/* Float lanes hold at most LANE_TERMS terms each before they are added into double: float vectors
 * hold twice as many numbers as double ones and need no conversion, and 64 terms lose no digit
 * that BatchNorm's float tensors keep. */
enum { LANES = CH_CPU_LANES, CHUNK = 1024, LANE_TERMS = CHUNK / LANES };

/* Per-channel sums over n planes of hw values, one plane per sample (c * hw apart):
 * s1 = sum (a[i] - ka), s2 = sum (a[i] - ka) * (b[i] - kb), the statistics' shifted sums
 * (a = b = x) and backward's sums of dy and dy * (x - mean) (ka = 0). A channel's lanes take each
 * plane's whole vectors and carry over from one plane to the next; the rest of a plane goes into
 * double at once. Emptied into double after each plane instead, a 4x4 plane (resnet18's last
 * stage: one vector) paid 32 scalar additions for 16 values read, and the statistics of its 8 MiB
 * took longer than those of the first stage's 51. A and B are the element types and WA(v), WIDE(v)
 * their values: --precision bf16's kept BatchNorm inputs are bf16, and widened they sum as the same
 * values in fp32 would, bit for bit. MASK(a, b) is the a term taken: a itself, or for a fused ReLU
 * (bn_relu_backward_reduce) 0 where b * ms + mt, forward's value before its ReLU, is not > 0.
 * A thread walks its channels CB at a time sample by sample (each sample's planes of those channels
 * lie side by side: one run of memory), holding each channel's lanes between planes: one channel
 * over all samples at a time read hw values then jumped c * hw, which at 7x7 made the sums take
 * twice the time of a pass that streams the same bytes. Each channel sees the same terms in the same
 * order either way: the same bits. */
typedef struct lanes {
    ch_real la[LANES], lb[LANES];
    double u, w;
    int terms;                 /* in each lane since the lanes were last emptied */
    ch_real ka, kb, ms, mt;    /* the channel's shifts and (a fused ReLU's) scale and shift */
} lanes;

enum { CB = 64 };

/* Planes of one sample a vector holds where a plane's hw values divide it (4x4, 2x2, one value):
 * LANES / hw; 0 elsewhere (and for empty planes). The sums' vector path (LANE_SUMS' NAME##_small)
 * and the threads' split of channels (my_sum_channels) both ask this. */
static int planes_per_vector(size_t hw)
{
    return hw > 0 && hw <= LANES && LANES % hw == 0 ? LANES / (int)hw : 0;
}

#define LANE_SUMS(NAME, A, WA, B, WIDE, MASK)                                                              \
    static void NAME##_plane(lanes *s, const A *ap, const B *bp, size_t hw)                                \
    {                                                                                                      \
        const ch_real ka = s->ka, kb = s->kb, ms = s->ms, mt = s->mt;                                      \
        (void)ms, (void)mt;                                                                                \
        const size_t full = hw - hw % LANES;                                                               \
        double u = s->u, w = s->w;                                                                         \
        if (full > 0) { /* a plane of fewer values (BatchNorm1d's one) leaves the lanes be */              \
            ch_real la[LANES], lb[LANES];                                                                  \
            memcpy(la, s->la, sizeof la), memcpy(lb, s->lb, sizeof lb);                                    \
            int terms = s->terms;                                                                          \
            for (size_t i0 = 0; i0 < full;) {                                                              \
                if (terms == LANE_TERMS) {                                                                 \
                    for (int j = 0; j < LANES; j++) u += la[j], w += lb[j], la[j] = lb[j] = 0;             \
                    terms = 0;                                                                             \
                }                                                                                          \
                const size_t room = (size_t)(LANE_TERMS - terms) * LANES;                                  \
                const size_t end = full - i0 < room ? full : i0 + room;                                    \
                for (size_t i = i0; i < end; i += LANES) {                                                 \
                    _Pragma("omp simd") for (int j = 0; j < LANES; j++)                                    \
                    {                                                                                      \
                        const ch_real av = WA(ap[i + j]); /* read always: see bn_data_plane */             \
                        const ch_real v = MASK(av, WIDE(bp[i + j])) - ka;                                  \
                        la[j] += v;                                                                        \
                        lb[j] += v * (WIDE(bp[i + j]) - kb);                                               \
                    }                                                                                      \
                }                                                                                          \
                terms += (int)((end - i0) / LANES);                                                        \
                i0 = end;                                                                                  \
            }                                                                                              \
            memcpy(s->la, la, sizeof la), memcpy(s->lb, lb, sizeof lb);                                    \
            s->terms = terms;                                                                              \
        }                                                                                                  \
        for (size_t i = full; i < hw; i++) {                                                               \
            const double v = (double)MASK(WA(ap[i]), WIDE(bp[i])) - ka;                                    \
            u += v;                                                                                        \
            w += v * ((double)WIDE(bp[i]) - kb);                                                           \
        }                                                                                                  \
        s->u = u, s->w = w;                                                                                \
    }                                                                                                      \
    /* Planes of hw values where hw divides LANES (4x4, MobileNetV2's 2x2, BatchNorm1d's 1): a vector holds \
     * LANES / hw whole planes of one sample, consecutive channels, so each lane sums one position of one  \
     * channel over the samples, emptied into double every LANE_TERMS samples, a channel's lanes in       \
     * order. Plane by plane, planes below LANES values went scalar in double, a call each                 \
     * (bench/norm_kernels m2). A thread walks its channels CB at a time sample by sample, as the          \
     * plane-by-plane path does; c0 is a multiple of LANES / hw (my_sum_channels). Returns the channel     \
     * where it stopped: the last channels, fewer than a vector's, go plane by plane. */                   \
    static int NAME##_small(const A *a, const B *b, int c0, int c1, int n, int c, size_t hw, bool shift,   \
                            const ch_real *kbp, const ch_real *msp, const ch_real *mtp, double *s1, double *s2) \
    {                                                                                                      \
        const int per = planes_per_vector(hw);                                                             \
        if (per == 0) return c0;                                                                           \
        const int end = c0 + (c1 - c0) / per * per;                                                        \
        for (int b0 = c0; b0 < end; b0 += CB) {                                                            \
            const int nv = ((end - b0 < CB ? end - b0 : CB) / per);                                        \
            ch_real ka[CB][LANES], kb[CB][LANES], ml[CB][LANES], tl[CB][LANES];                    \
            ch_real la[CB][LANES] = { { 0 } }, lb[CB][LANES] = { { 0 } };                                  \
            double u[CB] = { 0 }, w[CB] = { 0 };                                                           \
            for (int v = 0; v < nv; v++)                                                                   \
                for (int j = 0; j < LANES; j++) {                                                          \
                    const int q = b0 + v * per + j / (int)hw;                                              \
                    ka[v][j] = shift ? WA(a[(size_t)q * hw]) : 0;                                          \
                    kb[v][j] = shift ? ka[v][j] : kbp ? kbp[q] : 0;                                        \
                    ml[v][j] = msp ? msp[q] : 0, tl[v][j] = mtp ? mtp[q] : 0;                              \
                }                                                                                          \
            for (int p0 = 0; p0 < n; p0 += LANE_TERMS) {                                                   \
                const int p1 = n - p0 < LANE_TERMS ? n : p0 + LANE_TERMS;                                  \
                for (int p = p0; p < p1; p++)                                                              \
                    for (int v = 0; v < nv; v++) {                                                         \
                        const size_t at = ((size_t)p * c + b0) * hw + (size_t)v * LANES;                   \
                        _Pragma("omp simd") for (int j = 0; j < LANES; j++)                                \
                        {                                                                                  \
                            const ch_real ms = ml[v][j], mt = tl[v][j];                                    \
                            const ch_real av = WA(a[at + j]), bv = WIDE(b[at + j]);                        \
                            (void)ms, (void)mt;                                                            \
                            const ch_real t = MASK(av, bv) - ka[v][j];                                     \
                            la[v][j] += t;                                                                 \
                            lb[v][j] += t * (bv - kb[v][j]);                                               \
                        }                                                                                  \
                    }                                                                                      \
                /* A channel's lanes in order, as the plane-by-plane path empties them: at 4x4 (one       \
                 * vector a plane) the same sums in the same order, so the same bits. */                   \
                for (int v = 0; v < nv; v++)                                                               \
                    for (int j = 0; j < LANES; j++) {                                                      \
                        const int k = v * per + j / (int)hw;                                               \
                        u[k] += la[v][j], w[k] += lb[v][j], la[v][j] = lb[v][j] = 0;                       \
                    }                                                                                      \
            }                                                                                              \
            for (int k = 0; k < nv * per; k++) s1[b0 + k] = u[k], s2[b0 + k] = w[k];                       \
        }                                                                                                  \
        return end;                                                                                        \
    }                                                                                                      \
    /* Channels [c0, c1) of c; kb, ms, mt per channel (NULL: 0); ka 0, or with shift (the statistics,      \
     * a = b, n * hw > 0) ka = kb = the channel's first value. */                                          \
    static void NAME(const A *a, const B *b, int c0, int c1, int n, int c, size_t hw, bool shift,          \
                     const ch_real *kb, const ch_real *ms, const ch_real *mt, double *s1, double *s2)      \
    {                                                                                                      \
        lanes st[CB];                                                                                      \
        c0 = NAME##_small(a, b, c0, c1, n, c, hw, shift, kb, ms, mt, s1, s2);                              \
        for (int b0 = c0; b0 < c1; b0 += CB) {                                                             \
            const int b1 = c1 - b0 < CB ? c1 : b0 + CB;                                                    \
            memset(st, 0, sizeof st);                                                                      \
            for (int ch = b0; ch < b1; ch++) {                                                             \
                lanes *q = &st[ch - b0];                                                                   \
                q->ka = shift ? WA(a[(size_t)ch * hw]) : 0;                                                \
                q->kb = shift ? q->ka : kb ? kb[ch] : 0;                                                   \
                q->ms = ms ? ms[ch] : 0, q->mt = mt ? mt[ch] : 0;                                          \
            }                                                                                              \
            for (int p = 0; p < n; p++)                                                                    \
                for (int ch = b0; ch < b1; ch++) {                                                         \
                    const size_t at = ((size_t)p * c + ch) * hw;                                           \
                    NAME##_plane(&st[ch - b0], a + at, b + at, hw);                                        \
                }                                                                                          \
            for (int ch = b0; ch < b1; ch++) {                                                             \
                const lanes *q = &st[ch - b0];                                                             \
                double u = q->u, w = q->w;                                                                 \
                for (int j = 0; j < LANES; j++) u += q->la[j], w += q->lb[j];                              \
                s1[ch] = u, s2[ch] = w;                                                                    \
            }                                                                                              \
        }                                                                                                  \
    }
#define AS_IS(v) (v)
#define ALL(a, b) (a)
#define RELU_MASK(a, b) ((b) * ms + mt > 0 ? (a) : 0)
LANE_SUMS(lane_sums, ch_real, AS_IS, ch_real, AS_IS, ALL)
LANE_SUMS(lane_sums_relu, ch_real, AS_IS, ch_real, AS_IS, RELU_MASK)
#define WIDEN(v) ((ch_real)ch_bf16_to_float(v))
LANE_SUMS(lane_sums_bf16, ch_real, AS_IS, uint16_t, WIDEN, ALL)
LANE_SUMS(lane_sums_bf16_relu, ch_real, AS_IS, uint16_t, WIDEN, RELU_MASK)
LANE_SUMS(lane_sums_of_bf16, uint16_t, WIDEN, uint16_t, WIDEN, ALL)

/* This thread's share of count channels or samples (the same split as a static schedule's). */
static void my_share(int count, int *lo, int *hi)
{
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    *lo = (int)((long)count * t / nt), *hi = (int)((long)count * (t + 1) / nt);
}

/* This thread's channels for the per-channel sums (LANE_SUMS): whole groups of the channels whose
 * planes share a vector, so that which channels go through those vectors, and so the bits, do not
 * depend on the thread count. */
static void my_sum_channels(int c, int hw, int *c0, int *c1)
{
    const int per = planes_per_vector((size_t)hw) > 0 ? planes_per_vector((size_t)hw) : 1;
    int g0, g1;
    my_share((c + per - 1) / per, &g0, &g1);
    *c0 = g0 * per < c ? g0 * per : c, *c1 = g1 * per < c ? g1 * per : c;
}

/* Small planes (fewer than SMALL_HW values: MobileNetV2's 2x2 and 1x1, BatchNorm1d's one value):
 * a pass plane by plane cost a call and its channel's constants per handful of values, ten times
 * the time per byte of a 28x28 plane (bench/norm_kernels m2). There a thread walks its samples a
 * block of channels at a time, each channel's constants spread over its hw values once per block
 * (at most SPREAD values), and runs one loop over the block's values of each sample: the same
 * operations on each value, so the same bits. */
enum { SMALL_HW = 16, SPREAD = 512 };

/* Channels [c0, c0 + *nc) of c as one block of small planes: *nc of them, *len values. */
static void spread_block(int c, int hw, int c0, int *nc, int *len)
{
    const int cb = SPREAD / hw;
    *nc = c - c0 < cb ? c - c0 : cb;
    *len = *nc * hw;
}

/* One pass over x: sums shifted by the channel's first value, which lies within a few standard
 * deviations of the mean, so that E[v^2] - E[v]^2 loses no digit that matters in double (the
 * unshifted form would, for data far from zero). Two passes (mean, then squared deviations) cost
 * a whole read of every BatchNorm input more. */
static void stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *xf, const uint16_t *xh,
                  double *mean, double *var)
{
    const double cnt = (double)n * hw;
    const bool shift = cnt > 0;
#pragma omp parallel num_threads(kc->nthreads)
    {
        int c0, c1;
        my_sum_channels(c, hw, &c0, &c1);
        if (xh) lane_sums_of_bf16(xh, xh, c0, c1, n, c, (size_t)hw, shift, NULL, NULL, NULL, mean, var);
        else lane_sums(xf, xf, c0, c1, n, c, (size_t)hw, shift, NULL, NULL, NULL, mean, var);
        for (int ch = c0; ch < c1; ch++) {
            const size_t first = (size_t)ch * hw;
            const ch_real k = !shift ? 0 : xh ? (ch_real)ch_bf16_to_float(xh[first]) : xf[first];
            const double d = shift ? mean[ch] / cnt : 0, v = shift ? var[ch] / cnt - d * d : 0;
            mean[ch] = k + d;
            var[ch] = v > 0 ? v : 0;
        }
    }
}

void ch_cpu_batchnorm_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                            double *mean, double *var)
{
    stats(kc, n, c, hw, x, NULL, mean, var);
}

/* The same of bf16 x (a convolution's output written in bf16 for its BatchNorm): the statistics of
 * the widened values, bit for bit, reading half the bytes. */
void ch_cpu_batchnorm_stats_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                 double *mean, double *var)
{
    stats(kc, n, c, hw, NULL, x, mean, var);
}

/* A few hundred channels: one thread. */
void ch_cpu_batchnorm_finalize(const ch_kctx *kc, int c, const double *mean, const double *var, double count,
                               double eps, double momentum, const ch_real *gamma, const ch_real *beta,
                               ch_real *running_mean, ch_real *running_var, ch_real *save)
{
    (void)kc;
    for (int i = 0; i < c; i++)
        ch_bn_finalize_channel(i, c, mean, var, count, eps, momentum, gamma, beta, running_mean, running_var, save);
}

void ch_cpu_to_real(const ch_kctx *kc, size_t len, const double *x, ch_real *y)
{
    (void)kc;
    for (size_t i = 0; i < len; i++) y[i] = (ch_real)x[i];
}

/* channel_affine over len values: y = x * a + b from fp32 x (xf) or bf16 x (xh), or with relu that
 * value where it is not below 0 (NaN passes, as in ch_cpu_relu_span), into y or, where y is NULL,
 * rounded to bf16 into yh (a convolution's input kept in bf16); keep, when not NULL, gets xf
 * rounded to bf16 in a second loop while it is in cache (the pass that reads x anyway keeps it:
 * --precision bf16's BatchNorm inputs). a and b advance by step a value: 0 for one plane (its
 * channel's), 1 for a block of small planes (spread_block). Both callers pass step as a constant. */
static inline ch_real affine_value(const ch_real *xf, const uint16_t *xh, int j, ch_real a, ch_real b, bool relu)
{
    const ch_real v = (xh ? (ch_real)ch_bf16_to_float(xh[j]) : xf[j]) * a + b;
    return relu && v < 0 ? 0 : v;
}

static inline void affine_values(int len, const ch_real *xf, const uint16_t *xh, const ch_real *restrict a,
                                 const ch_real *restrict b, int step, bool relu, ch_real *y, uint16_t *yh,
                                 uint16_t *keep)
{
    if (y)
        for (int j = 0; j < len; j++) y[j] = affine_value(xf, xh, j, a[j * step], b[j * step], relu);
    else
        for (int j = 0; j < len; j++)
            yh[j] = ch_bf16_from_float((float)affine_value(xf, xh, j, a[j * step], b[j * step], relu));
    if (keep && xf)
        for (int j = 0; j < len; j++) keep[j] = ch_bf16_from_float((float)xf[j]);
}

static void affine_small(const ch_kctx *kc, int n, int c, int hw, const ch_real *xf, const uint16_t *xh,
                         const ch_real *scale, const ch_real *shift, bool relu, ch_real *y, uint16_t *yh,
                         uint16_t *keep)
{
#pragma omp parallel num_threads(kc->nthreads)
    {
        int p0, p1;
        my_share(n, &p0, &p1);
        ch_real a[SPREAD], b[SPREAD];
        for (int c0 = 0, nc, len; c0 < c; c0 += nc) {
            spread_block(c, hw, c0, &nc, &len);
            for (int k = 0; k < len; k++) a[k] = scale[c0 + k / hw], b[k] = shift[c0 + k / hw];
            for (int p = p0; p < p1; p++) {
                const size_t at = ((size_t)p * c + c0) * hw;
                affine_values(len, xf ? xf + at : NULL, xh ? xh + at : NULL, a, b, 1, relu, y ? y + at : NULL,
                              yh ? yh + at : NULL, keep ? keep + at : NULL);
            }
        }
    }
}

static void affine_planes(const ch_kctx *kc, int n, int c, int hw, const ch_real *xf, const uint16_t *xh,
                          const ch_real *scale, const ch_real *shift, bool relu, ch_real *y, uint16_t *yh,
                          uint16_t *keep)
{
    if (hw < SMALL_HW) {
        affine_small(kc, n, c, hw, xf, xh, scale, shift, relu, y, yh, keep);
        return;
    }
    const long planes = (long)n * c;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        const int ch = (int)(pl % c);
        const size_t at = (size_t)pl * (size_t)hw;
        affine_values(hw, xf ? xf + at : NULL, xh ? xh + at : NULL, scale + ch, shift + ch, 0, relu,
                      y ? y + at : NULL, yh ? yh + at : NULL, keep ? keep + at : NULL);
    }
}

void ch_cpu_channel_affine(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                           const ch_real *scale, const ch_real *shift, ch_real *y)
{
    affine_planes(kc, n, c, hw, x, NULL, scale, shift, false, y, NULL, NULL);
}

void ch_cpu_channel_affine_keep_bf16(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                     const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep)
{
    affine_planes(kc, n, c, hw, x, NULL, scale, shift, false, y, NULL, keep);
}

void ch_cpu_channel_affine_of_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                   const ch_real *scale, const ch_real *shift, ch_real *y)
{
    affine_planes(kc, n, c, hw, NULL, x, scale, shift, false, y, NULL, NULL);
}

void ch_cpu_bn_relu_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                            const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep)
{
    affine_planes(kc, n, c, hw, x, x ? NULL : xh, scale, shift, true, y, NULL, keep);
}

void ch_cpu_bn_relu_forward_to_bf16(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                    const ch_real *scale, const ch_real *shift, uint16_t *y, uint16_t *keep)
{
    affine_planes(kc, n, c, hw, x, x ? NULL : xh, scale, shift, true, NULL, y, keep);
}

/* v = x * a + b plus r, clamped at 0 with relu as ch_cpu_relu_span clamps. */
static inline ch_real sum_act(ch_real v, ch_real r, bool relu)
{
    const ch_real s = v + r;
    return relu && s < 0 ? 0 : s;
}

/* One plane of bn_add_forward; keep as in affine_values. relu is the same for the whole loop, which
 * the compiler takes out of it. */
static void affine_add_plane(int hw, const ch_real *xf, const uint16_t *xh, ch_real a, ch_real b, const ch_real *res,
                             bool relu, ch_real *y, uint16_t *keep)
{
    if (xh)
        for (int j = 0; j < hw; j++) y[j] = sum_act((ch_real)ch_bf16_to_float(xh[j]) * a + b, res[j], relu);
    else
        for (int j = 0; j < hw; j++) y[j] = sum_act(xf[j] * a + b, res[j], relu);
    if (keep && xf)
        for (int j = 0; j < hw; j++) keep[j] = ch_bf16_from_float((float)xf[j]);
}

void ch_cpu_bn_add_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                           const ch_real *scale, const ch_real *shift, const ch_real *res, bool relu, ch_real *y,
                           uint16_t *keep)
{
    const long planes = (long)n * c;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        const int ch = (int)(pl % c);
        const size_t at = (size_t)pl * (size_t)hw;
        affine_add_plane(hw, x ? x + at : NULL, x ? NULL : xh + at, scale[ch], shift[ch], res + at, relu,
                         y + at, keep ? keep + at : NULL);
    }
}

/* BatchNorm's backward sums over x in fp32 (x) or bf16 (xh), per channel; with scale (a fused
 * ReLU), of dy masked where x * scale + shift is not > 0. */
static void bn_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                               const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *scale,
                               const ch_real *shift, double *sum_dy, double *sum_dy_xhat)
{
#pragma omp parallel num_threads(kc->nthreads)
    {
        int c0, c1;
        my_sum_channels(c, hw, &c0, &c1);
        const size_t len = (size_t)hw;
        if (xh && scale) lane_sums_bf16_relu(dy, xh, c0, c1, n, c, len, false, mean, scale, shift, sum_dy, sum_dy_xhat);
        else if (xh) lane_sums_bf16(dy, xh, c0, c1, n, c, len, false, mean, NULL, NULL, sum_dy, sum_dy_xhat);
        else if (scale) lane_sums_relu(dy, x, c0, c1, n, c, len, false, mean, scale, shift, sum_dy, sum_dy_xhat);
        else lane_sums(dy, x, c0, c1, n, c, len, false, mean, NULL, NULL, sum_dy, sum_dy_xhat);
        for (int ch = c0; ch < c1; ch++) sum_dy_xhat[ch] *= invstd[ch];
    }
}

void ch_cpu_batchnorm_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                      const ch_real *dy, const ch_real *mean,
                                      const ch_real *invstd, double *sum_dy,
                                      double *sum_dy_xhat)
{
    bn_backward_reduce(kc, n, c, hw, x, NULL, dy, mean, invstd, NULL, NULL, sum_dy, sum_dy_xhat);
}

void ch_cpu_batchnorm_backward_reduce_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                           const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                           double *sum_dy, double *sum_dy_xhat)
{
    bn_backward_reduce(kc, n, c, hw, NULL, x, dy, mean, invstd, NULL, NULL, sum_dy, sum_dy_xhat);
}

void ch_cpu_bn_relu_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                    const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                    const ch_real *scale, const ch_real *shift, double *sum_dy, double *sum_dy_xhat)
{
    bn_backward_reduce(kc, n, c, hw, x, x ? NULL : xh, dy, mean, invstd, scale, shift, sum_dy, sum_dy_xhat);
}

/* The per-channel values of one plane's dx: gamma * invstd, mean, invstd, the two means of the
 * sums, and with a fused ReLU the scale and shift whose value masks dy. */
typedef struct bn_plane {
    ch_real g, m, is, mdy, mdx;
    bool relu;
    ch_real ms, mt;
} bn_plane;

static bn_plane plane_consts(int ch, const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                             const ch_real *scale, const ch_real *shift, const double *sum_dy,
                             const double *sum_dy_xhat, double count)
{
    const ch_real is = invstd[ch];
    return (bn_plane){ .g = gamma[ch] * is, .m = mean[ch], .is = is, .mdy = (ch_real)(sum_dy[ch] / count),
                       .mdx = (ch_real)(sum_dy_xhat[ch] / count), .relu = scale != NULL,
                       .ms = scale ? scale[ch] : 0, .mt = scale ? shift[ch] : 0 };
}

/* One value of dx, and dy as a fused ReLU passes it. */
static inline ch_real bn_dx(ch_real xv, ch_real d, ch_real g, ch_real m, ch_real is, ch_real mdy, ch_real mdx)
{
    return g * (d - mdy - (xv - m) * is * mdx);
}

static inline ch_real relu_gate(ch_real xv, ch_real dv, ch_real ms, ch_real mt) { return xv * ms + mt > 0 ? dv : 0; }

/* dx[j] from x[j] (fp32 xf or bf16 xh) and dy[j], gated where relu. */
static inline ch_real bn_data_value(const ch_real *xf, const uint16_t *xh, const ch_real *dy, int j, bool relu,
                                    ch_real ms, ch_real mt, ch_real g, ch_real m, ch_real is, ch_real mdy, ch_real mdx)
{
    const ch_real xv = xh ? (ch_real)ch_bf16_to_float(xh[j]) : xf[j], dv = dy[j];
    return bn_dx(xv, relu ? relu_gate(xv, dv, ms, mt) : dv, g, m, is, mdy, mdx);
}

/* dx of one plane from fp32 x (xf) or bf16 x (xh), into dx, or where dx is NULL rounded to bf16
 * into dxh. dx (dxh) may alias x or dy: each element is read before it is written. With a fused
 * ReLU dy is read whether or not the mask passes it: read only where it does, the loop vectorised
 * into masked loads, which made the pass 3-4 times slower than the one without the mask on a Zen 5
 * (64 x 28 x 28, batch 256: 8.6 against 2.5 ms). */
static void bn_data_plane(int hw, const ch_real *xf, const uint16_t *xh, const ch_real *dy, const bn_plane *p,
                          ch_real *dx, uint16_t *dxh)
{
    const ch_real g = p->g, m = p->m, is = p->is, mdy = p->mdy, mdx = p->mdx, ms = p->ms, mt = p->mt;
    const bool relu = p->relu;   /* a local, so that the loop can be split on it: dx may alias *p */
    if (dx)
        for (int j = 0; j < hw; j++) dx[j] = bn_data_value(xf, xh, dy, j, relu, ms, mt, g, m, is, mdy, mdx);
    else
        for (int j = 0; j < hw; j++)
            dxh[j] = ch_bf16_from_float((float)bn_data_value(xf, xh, dy, j, relu, ms, mt, g, m, is, mdy, mdx));
}

/* The same over a block of small planes, the constants per value (spread_block). */
typedef struct bn_spread {
    ch_real g[SPREAD], m[SPREAD], is[SPREAD], mdy[SPREAD], mdx[SPREAD], ms[SPREAD], mt[SPREAD];
    bool relu;
} bn_spread;

static void bn_data_run(int len, const ch_real *xf, const uint16_t *xh, const ch_real *dy,
                        const bn_spread *restrict k, ch_real *dx, uint16_t *dxh)
{
    const bool relu = k->relu;
    if (dx)
        for (int j = 0; j < len; j++)
            dx[j] = bn_data_value(xf, xh, dy, j, relu, k->ms[j], k->mt[j], k->g[j], k->m[j], k->is[j], k->mdy[j],
                                  k->mdx[j]);
    else
        for (int j = 0; j < len; j++)
            dxh[j] = ch_bf16_from_float((float)bn_data_value(xf, xh, dy, j, relu, k->ms[j], k->mt[j], k->g[j], k->m[j],
                                                             k->is[j], k->mdy[j], k->mdx[j]));
}

/* bn_backward_data on small planes: each thread its samples, a block of channels at a time, the
 * block's constants spread per value once (as affine_small). */
static void bn_data_small(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                          const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                          const ch_real *scale, const ch_real *shift, const double *sum_dy,
                          const double *sum_dy_xhat, double count, ch_real *dx, uint16_t *dxh)
{
#pragma omp parallel num_threads(kc->nthreads)
    {
        int p0, p1;
        my_share(n, &p0, &p1);
        bn_spread k;
        k.relu = scale != NULL;
        for (int c0 = 0, nc, len; c0 < c; c0 += nc) {
            spread_block(c, hw, c0, &nc, &len);
            for (int j = 0; j < len; j++) {
                const bn_plane p = plane_consts(c0 + j / hw, mean, invstd, gamma, scale, shift, sum_dy,
                                                sum_dy_xhat, count);
                k.g[j] = p.g, k.m[j] = p.m, k.is[j] = p.is, k.mdy[j] = p.mdy, k.mdx[j] = p.mdx;
                k.ms[j] = p.ms, k.mt[j] = p.mt;
            }
            for (int q = p0; q < p1; q++) {
                const size_t at = ((size_t)q * c + c0) * hw;
                bn_data_run(len, x ? x + at : NULL, xh ? xh + at : NULL, dy + at, &k, dx ? dx + at : NULL,
                            dx ? NULL : dxh + at);
            }
        }
    }
}

/* dx into dx, or where dx is NULL rounded to bf16 into dxh. */
static void bn_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                             const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                             const ch_real *scale, const ch_real *shift, const double *sum_dy,
                             const double *sum_dy_xhat, double count, ch_real *dx, uint16_t *dxh)
{
    if (hw < SMALL_HW) {
        bn_data_small(kc, n, c, hw, x, xh, dy, mean, invstd, gamma, scale, shift, sum_dy, sum_dy_xhat, count, dx,
                      dxh);
        return;
    }
    const long planes = (long)n * c;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        const bn_plane p = plane_consts((int)(pl % c), mean, invstd, gamma, scale, shift, sum_dy, sum_dy_xhat, count);
        const size_t at = (size_t)pl * (size_t)hw;
        bn_data_plane(hw, x ? x + at : NULL, xh ? xh + at : NULL, dy + at, &p, dx ? dx + at : NULL,
                      dx ? NULL : dxh + at);
    }
}

void ch_cpu_batchnorm_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                    const ch_real *dy, const ch_real *mean,
                                    const ch_real *invstd, const ch_real *gamma,
                                    const double *sum_dy, const double *sum_dy_xhat,
                                    double count, ch_real *dx)
{
    bn_backward_data(kc, n, c, hw, x, NULL, dy, mean, invstd, gamma, NULL, NULL, sum_dy, sum_dy_xhat, count, dx, NULL);
}

void ch_cpu_batchnorm_backward_data_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                         const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                         const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat,
                                         double count, ch_real *dx)
{
    bn_backward_data(kc, n, c, hw, NULL, x, dy, mean, invstd, gamma, NULL, NULL, sum_dy, sum_dy_xhat, count, dx, NULL);
}

void ch_cpu_bn_relu_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                  const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                                  const ch_real *scale, const ch_real *shift, const double *sum_dy,
                                  const double *sum_dy_xhat, double count, ch_real *dx)
{
    bn_backward_data(kc, n, c, hw, x, x ? NULL : xh, dy, mean, invstd, gamma, scale, shift, sum_dy, sum_dy_xhat,
                     count, dx, NULL);
}

void ch_cpu_bn_backward_data_to_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *xh, const ch_real *dy,
                                     const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                                     const ch_real *scale, const ch_real *shift, const double *sum_dy,
                                     const double *sum_dy_xhat, double count, uint16_t *dx)
{
    bn_backward_data(kc, n, c, hw, NULL, xh, dy, mean, invstd, gamma, scale, shift, sum_dy, sum_dy_xhat, count, NULL,
                     dx);
}

void ch_cpu_layernorm_forward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x,
                              const ch_real *gamma, const ch_real *beta, double eps, ch_real *y, ch_real *mean,
                              ch_real *invstd)
{
    const long groups = (long)outer * inner;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long g = 0; g < groups; g++) {
        const size_t at = (size_t)(g / inner) * len * inner + (size_t)(g % inner);
        ch_ln_forward_group(len, (size_t)inner, x + at, gamma, beta, eps, y + at, mean + g, invstd + g);
    }
}

void ch_cpu_layernorm_backward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x,
                               const ch_real *dy, const ch_real *gamma, const ch_real *mean, const ch_real *invstd,
                               ch_real *dx, ch_real *dgamma, ch_real *dbeta)
{
    const long groups = (long)outer * inner;
#pragma omp parallel num_threads(kc->nthreads)
    {
#pragma omp for schedule(static) nowait
        for (int j = 0; j < len; j++) ch_ln_param_grads(j, outer, len, (size_t)inner, x, dy, mean, invstd, dgamma, dbeta);
        if (dx) {
#pragma omp for schedule(static)
            for (long g = 0; g < groups; g++) {
                const size_t at = (size_t)(g / inner) * len * inner + (size_t)(g % inner);
                ch_ln_backward_group(len, (size_t)inner, x + at, dy + at, gamma, mean[g], invstd[g], dx + at);
            }
        }
    }
}
