/* Elementwise kernels and the softmax cross-entropy loss. */
#include "kernels/act_body.h"
#include "kernels/loss_body.h"
#include "kernels/move_body.h"
#include "core/philox.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_vmath.h"

#include <math.h>
#include <string.h>

void ch_cpu_relu_span(size_t len, const ch_real *x, ch_real *y)
{
    /* Written so that NaN passes through, as in PyTorch: a diverging run must not look healthy. */
    for (size_t i = 0; i < len; i++) y[i] = x[i] < 0 ? 0 : x[i];
}

/* dy is read whether or not the mask passes it, here and in act_backward_span: read only where it
 * does, these loops vectorised into masked loads, which a Zen 5 runs several times slower than
 * plain ones (cpu_norm.c's fused ReLU backward: 8.6 against 2.5 ms on 64 x 28 x 28, batch 256). */
void ch_cpu_relu_backward_span(size_t len, const ch_real *y, const ch_real *dy, ch_real *dx)
{
    for (size_t i = 0; i < len; i++) {
        const ch_real g = dy[i];
        dx[i] = y[i] > 0 ? g : 0;
    }
}

/* [*lo, *hi): thread t's contiguous share of len elements among T. */
static void share(size_t len, int t, int T, size_t *lo, size_t *hi)
{
    *lo = len * (size_t)t / (size_t)T;
    *hi = len * (size_t)(t + 1) / (size_t)T;
}

void ch_cpu_relu_forward(const ch_kctx *kc, size_t len, const ch_real *x, ch_real *y)
{
#pragma omp parallel num_threads(kc->nthreads)
    {
        size_t lo, hi;
        share(len, ch_omp_thread(), ch_omp_threads(), &lo, &hi);
        ch_cpu_relu_span(hi - lo, x + lo, y + lo);
    }
}

void ch_cpu_relu_backward(const ch_kctx *kc, size_t len, const ch_real *y, const ch_real *dy,
                          ch_real *dx)
{
#pragma omp parallel num_threads(kc->nthreads)
    {
        size_t lo, hi;
        share(len, ch_omp_thread(), ch_omp_threads(), &lo, &hi);
        ch_cpu_relu_backward_span(hi - lo, y + lo, dy + lo, dx + lo);
    }
}

void ch_cpu_add(const ch_kctx *kc, size_t len, const ch_real *a, const ch_real *b, ch_real *y)
{
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (size_t i = 0; i < len; i++) y[i] = a[i] + b[i];
}

/* loss_i = logsumexp(z_i) - z_i[label], per sample from kernels/loss_body.h. */
void ch_cpu_softmax_xent(const ch_kctx *kc, int n, int k, const ch_real *logits,
                         const int32_t *labels, double scale, ch_real *dlogits,
                         double *loss_sum, int64_t *correct)
{
    double loss = 0, hits = 0;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static) reduction(+ : loss, hits)
    for (int i = 0; i < n; i++)
        ch_xent_sample(logits + (size_t)i * k, k, labels[i], scale, dlogits ? dlogits + (size_t)i * k : NULL, &loss,
                       &hits);
    *loss_sum = loss;
    *correct = (int64_t)hits;
}

void ch_cpu_mse(const ch_kctx *kc, size_t len, const ch_real *pred, const ch_real *target,
                double scale, ch_real *dpred, double *loss_sum)
{
    double loss = 0;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static) reduction(+ : loss)
    for (size_t i = 0; i < len; i++) {
        const double d = (double)pred[i] - target[i];
        loss += d * d;
        if (dpred) dpred[i] = (ch_real)(2 * d * scale);
    }
    *loss_sum = loss;
}

/* The smooth kinds per element. The float build uses cpu_vmath.h's branch-free float functions,
 * so that each loop below vectorises; the double build (gradient checks) keeps libm's through
 * act_body.h. GELU's tanh form is written as x * sigmoid(2u), the same function as
 * x (1 + tanh u) / 2 without its cancellation for large negative x. */
#ifdef CH_REAL_DOUBLE
static inline ch_real sigmoid_of(ch_real x) { return 1 / (1 + exp(-x)); }
static inline ch_real tanh_of(ch_real x) { return tanh(x); }
static inline ch_real erf_of(ch_real x) { return erf(x); }
static inline ch_real gelu_of(ch_real x) { return ch_gelu(x); }
static inline ch_real gelu_tanh_of(ch_real x) { return ch_gelu_tanh(x); }
static inline ch_real erf_slope_of(ch_real x) { return ch_erf_slope(x); }
static inline ch_real gelu_slope_of(ch_real x) { return ch_gelu_slope(x); }
static inline ch_real gelu_tanh_slope_of(ch_real x) { return ch_gelu_tanh_slope(x); }
#else
static inline float sigmoid_of(float x) { return ch_vm_sigmoid(x); }
static inline float tanh_of(float x) { return ch_vm_tanh(x); }
static inline float erf_of(float x) { return ch_vm_erf(x); }
static inline float gelu_of(float x)
{
    return 0.5f * x * ch_vm_twice_normal_cdf(x);
}
static inline float erf_slope_of(float x) { return (float)CH_2_SQRTPI * ch_vm_exp_neg_square(x, 1.0f); }
static inline float gelu_slope_of(float x)
{
    return 0.5f * ch_vm_twice_normal_cdf(x) +
           x * (float)CH_INV_SQRT_2PI * ch_vm_exp_neg_square(x, 0.5f);
}
/* 2u, u = sqrt(2 / pi) (x + 0.044715 x^3), and its slope d(2u)/dx. */
static inline float gelu_tanh_2u(float x)
{
    return 2.0f * (float)CH_SQRT_2_PI * (x + (float)CH_GELU_CUBIC * x * x * x);
}
static inline float gelu_tanh_of(float x) { return x * ch_vm_sigmoid(gelu_tanh_2u(x)); }
/* d/dx x s(2u) = s + x s (1 - s) 2u'; 1 - s taken as e s (e = e^-2u) where s is near 1. Where
 * s (1 - s) is 0 the second term is 0, also for |x| so large that 2u' is inf (0 * inf). */
static inline float gelu_tanh_slope_of(float x)
{
    const float e = ch_vm_exp(-gelu_tanh_2u(x)), s = 1.0f / (1.0f + e);
    const float spread = s * (s > 0.5f ? e * s : 1.0f - s);
    const float slope_2u = 2.0f * (float)CH_SQRT_2_PI * (1.0f + 3.0f * (float)CH_GELU_CUBIC * x * x);
    const float second = x * spread * slope_2u;
    return s + (spread == 0 ? 0.0f : second);
}
#endif

/* One loop per kind, the kind chosen outside it, so that the compiler vectorises each (a switch
 * per element did not: MobileNet's ReLU6 took a third of a step). The piecewise kinds run in float,
 * as PyTorch's. Comparisons are written so that NaN passes through, as ReLU's. */
static void act_span(const ch_act *a, size_t len, const ch_real *x, ch_real *y)
{
    const ch_real alpha = (ch_real)a->alpha, lo = (ch_real)a->lo, hi = (ch_real)a->hi;
    switch (a->kind) {
    case CH_ACT_LEAKY_RELU:
        for (size_t i = 0; i < len; i++) y[i] = x[i] > 0 ? x[i] : alpha * x[i];
        return;
    case CH_ACT_CLIP:
        for (size_t i = 0; i < len; i++) y[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
        return;
    case CH_ACT_SIGMOID:
        for (size_t i = 0; i < len; i++) y[i] = sigmoid_of(x[i]);
        return;
    case CH_ACT_TANH:
        for (size_t i = 0; i < len; i++) y[i] = tanh_of(x[i]);
        return;
    case CH_ACT_HARDSIGMOID:
        for (size_t i = 0; i < len; i++) y[i] = x[i] <= -3 ? 0 : x[i] >= 3 ? 1 : (x[i] + 3) / 6;
        return;
    case CH_ACT_HARDSWISH:
        for (size_t i = 0; i < len; i++) y[i] = x[i] <= -3 ? 0 : x[i] >= 3 ? x[i] : x[i] * (x[i] + 3) / 6;
        return;
    case CH_ACT_AFFINE:
        for (size_t i = 0; i < len; i++) y[i] = (ch_real)((double)a->alpha * x[i] + a->beta);
        return;
    case CH_ACT_ERF:
        for (size_t i = 0; i < len; i++) y[i] = erf_of(x[i]);
        return;
    case CH_ACT_GELU:
        for (size_t i = 0; i < len; i++) y[i] = gelu_of(x[i]);
        return;
    case CH_ACT_GELU_TANH:
        for (size_t i = 0; i < len; i++) y[i] = gelu_tanh_of(x[i]);
        return;
    }
    memcpy(y, x, sizeof(ch_real) * len);
}

/* dx = dy * act'(x): sigmoid and tanh read y, every other kind x. */
static void act_backward_span(const ch_act *a, size_t len, const ch_real *x, const ch_real *y,
                              const ch_real *dy, ch_real *dx)
{
    const ch_real alpha = (ch_real)a->alpha, lo = (ch_real)a->lo, hi = (ch_real)a->hi;
    switch (a->kind) {
    case CH_ACT_LEAKY_RELU:
        for (size_t i = 0; i < len; i++) dx[i] = x[i] > 0 ? dy[i] : dy[i] * alpha;
        return;
    case CH_ACT_CLIP:
        for (size_t i = 0; i < len; i++) {
            const ch_real g = dy[i], v = x[i];
            dx[i] = v < lo || v > hi ? 0 : g;
        }
        return;
    case CH_ACT_SIGMOID:
        for (size_t i = 0; i < len; i++) dx[i] = dy[i] * (y[i] * (1 - y[i]));
        return;
    case CH_ACT_TANH:
        for (size_t i = 0; i < len; i++) dx[i] = dy[i] * (1 - y[i] * y[i]);
        return;
    /* PyTorch's: open interval for hardsigmoid, (-3, 3] for hardswish's middle piece. */
    case CH_ACT_HARDSIGMOID:
        for (size_t i = 0; i < len; i++) {
            const ch_real g = dy[i], v = x[i];
            dx[i] = v > -3 && v < 3 ? g * (ch_real)(1.0 / 6) : 0;
        }
        return;
    case CH_ACT_HARDSWISH:
        for (size_t i = 0; i < len; i++) {
            const ch_real g = dy[i], v = x[i];
            dx[i] = v < -3 ? 0 : v <= 3 ? g * (v / 3 + (ch_real)0.5) : g;
        }
        return;
    case CH_ACT_AFFINE:
        for (size_t i = 0; i < len; i++) dx[i] = dy[i] * alpha;
        return;
    case CH_ACT_ERF:
        for (size_t i = 0; i < len; i++) dx[i] = dy[i] * erf_slope_of(x[i]);
        return;
    case CH_ACT_GELU:
        for (size_t i = 0; i < len; i++) dx[i] = dy[i] * gelu_slope_of(x[i]);
        return;
    case CH_ACT_GELU_TANH:
        for (size_t i = 0; i < len; i++) dx[i] = dy[i] * gelu_tanh_slope_of(x[i]);
        return;
    }
    memcpy(dx, dy, sizeof(ch_real) * len);
}

void ch_cpu_act_forward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, ch_real *y)
{
#pragma omp parallel num_threads(kc->nthreads)
    {
        size_t lo, hi;
        share(len, ch_omp_thread(), ch_omp_threads(), &lo, &hi);
        act_span(a, hi - lo, x + lo, y + lo);
    }
}

void ch_cpu_act_backward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x,
                         const ch_real *y, const ch_real *dy, ch_real *dx)
{
    const bool from_y = a->kind == CH_ACT_SIGMOID || a->kind == CH_ACT_TANH;
#pragma omp parallel num_threads(kc->nthreads)
    {
        size_t lo, hi;
        share(len, ch_omp_thread(), ch_omp_threads(), &lo, &hi);
        act_backward_span(a, hi - lo, from_y ? NULL : x + lo, from_y ? y + lo : NULL, dy + lo, dx + lo);
    }
}

/* Strides of an operand of dims op inside out: 0 along a broadcast dimension. */
static void bcast_strides(const int out[3], const int op[3], size_t st[3])
{
    st[2] = op[2] == out[2] ? 1 : 0;
    st[1] = op[1] == out[1] ? (size_t)op[2] : 0;
    st[0] = op[0] == out[0] ? (size_t)op[1] * op[2] : 0;
}

static size_t dims_size(const int d[3]) { return (size_t)d[0] * d[1] * d[2]; }

void ch_cpu_bcast_forward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                          const ch_real *b, ch_real *y)
{
    size_t sa[3], sb[3];
    bcast_strides(d->out, d->a, sa);
    bcast_strides(d->out, d->b, sb);
    const size_t as = dims_size(d->a), bs = dims_size(d->b), ys = dims_size(d->out);
    const bool mul = d->op == CH_BCAST_MUL;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (int s = 0; s < n; s++)
        for (int c = 0; c < d->out[0]; c++)
            for (int h = 0; h < d->out[1]; h++) {
                const ch_real *pa = a + s * as + c * sa[0] + h * sa[1];
                const ch_real *pb = b + s * bs + c * sb[0] + h * sb[1];
                ch_real *py = y + s * ys + ((size_t)c * d->out[1] + h) * d->out[2];
                for (int w = 0; w < d->out[2]; w++) {
                    const ch_real u = pa[w * sa[2]], v = pb[w * sb[2]];
                    py[w] = mul ? u * v : u + v;
                }
            }
}

/* dop += dy (* other) over out, for one operand; dop holds one sample, zeroed by the caller. */
static void bcast_reduce_sample(const ch_bcast_desc *d, const size_t so[3], const size_t sx[3],
                                const ch_real *dy, const ch_real *other, ch_real *dop)
{
    for (int c = 0; c < d->out[0]; c++)
        for (int h = 0; h < d->out[1]; h++) {
            ch_real *po = dop + c * so[0] + h * so[1];
            const ch_real *px = other ? other + c * sx[0] + h * sx[1] : NULL;
            const ch_real *g = dy + ((size_t)c * d->out[1] + h) * d->out[2];
            for (int w = 0; w < d->out[2]; w++)
                po[w * so[2]] += px ? g[w] * px[w * sx[2]] : g[w];
        }
}

void ch_cpu_bcast_backward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                           const ch_real *b, const ch_real *dy, ch_real *da, ch_real *db)
{
    size_t sa[3], sb[3];
    bcast_strides(d->out, d->a, sa);
    bcast_strides(d->out, d->b, sb);
    const size_t as = dims_size(d->a), bs = dims_size(d->b), ys = dims_size(d->out);
    const bool mul = d->op == CH_BCAST_MUL;
    /* Samples are independent (no operand is broadcast along the batch): a thread per sample range
     * sums in a fixed order, so the bits do not depend on the thread count. */
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (int s = 0; s < n; s++) {
        if (da) {
            memset(da + s * as, 0, sizeof(ch_real) * as);
            bcast_reduce_sample(d, sa, sb, dy + s * ys, mul ? b + s * bs : NULL, da + s * as);
        }
        if (db) {
            memset(db + s * bs, 0, sizeof(ch_real) * bs);
            bcast_reduce_sample(d, sb, sa, dy + s * ys, mul ? a + s * as : NULL, db + s * bs);
        }
    }
}

void ch_cpu_copy_rows(const ch_kctx *kc, int rows, size_t len, const ch_real *src,
                      size_t src_stride, ch_real *dst, size_t dst_stride)
{
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (int r = 0; r < rows; r++)
        memcpy(dst + (size_t)r * dst_stride, src + (size_t)r * src_stride, sizeof(ch_real) * len);
}

/* A row of y (its last dimension) at a time, read from x at that dimension's stride; rows over
 * the threads. */
void ch_cpu_permute(const ch_kctx *kc, const ch_permute_desc *d, int n, const ch_real *x, ch_real *y)
{
    const int o0 = d->dims[d->perm[0]], o1 = d->dims[d->perm[1]], o2 = d->dims[d->perm[2]];
    const size_t per = (size_t)d->dims[0] * d->dims[1] * d->dims[2];
    const size_t s0 = ch_permute_stride(d, d->perm[0]), s1 = ch_permute_stride(d, d->perm[1]);
    const size_t s2 = ch_permute_stride(d, d->perm[2]);
    const long rows = (long)n * o0 * o1;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (long r = 0; r < rows; r++) {
        const size_t s = (size_t)(r / ((long)o0 * o1)), i0 = (size_t)(r / o1 % o0), i1 = (size_t)(r % o1);
        const ch_real *src = x + s * per + i0 * s0 + i1 * s1;
        ch_real *dst = y + (size_t)r * (size_t)o2;
        for (int i2 = 0; i2 < o2; i2++) dst[i2] = src[(size_t)i2 * s2];
    }
}

/* One Philox block per four elements; samples split over the threads (bits independent of them). */
void ch_cpu_dropout_mask(const ch_kctx *kc, int n, size_t per, uint64_t seed, uint64_t stream, uint64_t step,
                         uint64_t sample0, uint32_t threshold, ch_real keep, ch_real *mask)
{
#pragma omp parallel for num_threads(kc->nthreads) schedule(static) if (n > 1 && kc->nthreads > 1)
    for (int s = 0; s < n; s++) {
        const uint64_t start = (step << 32) ^ ((sample0 + (uint64_t)s) * ((per + 3) / 4));
        ch_real *m = mask + (size_t)s * per;
        uint32_t w[4];
        for (size_t e = 0; e < per; e++) {
            if (e % 4 == 0) ch_philox_block(seed, stream, start + e / 4, w);
            m[e] = w[e % 4] >= threshold ? keep : 0;
        }
    }
}
