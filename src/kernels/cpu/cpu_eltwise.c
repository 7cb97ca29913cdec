/* Elementwise kernels and the softmax cross-entropy loss. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <string.h>

void ch_cpu_relu_span(size_t len, const ch_real *x, ch_real *y)
{
    /* Written so that NaN passes through, as in PyTorch: a diverging run must not look healthy. */
    for (size_t i = 0; i < len; i++) y[i] = x[i] < 0 ? 0 : x[i];
}

void ch_cpu_relu_backward_span(size_t len, const ch_real *y, const ch_real *dy, ch_real *dx)
{
    for (size_t i = 0; i < len; i++) dx[i] = y[i] > 0 ? dy[i] : 0;
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

/* loss_i = logsumexp(z_i) - z_i[label]; computed with the max subtracted for stability. */
void ch_cpu_softmax_xent(const ch_kctx *kc, int n, int k, const ch_real *logits,
                         const int32_t *labels, double scale, ch_real *dlogits,
                         double *loss_sum, int64_t *correct)
{
    double loss = 0;
    int64_t hits = 0;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static) reduction(+ : loss, hits)
    for (int i = 0; i < n; i++) {
        const ch_real *z = logits + (size_t)i * k;
        int arg = 0;
        for (int j = 1; j < k; j++)
            if (z[j] > z[arg]) arg = j;
        const double zmax = z[arg];
        double se = 0;
        for (int j = 0; j < k; j++) se += exp((double)z[j] - zmax);
        const double lse = zmax + log(se);
        loss += lse - z[labels[i]];
        hits += arg == labels[i];
        if (dlogits) {
            ch_real *g = dlogits + (size_t)i * k;
            for (int j = 0; j < k; j++)
                g[j] = (ch_real)((exp((double)z[j] - lse) - (j == labels[i])) * scale);
        }
    }
    *loss_sum = loss;
    *correct = hits;
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

static ch_real act_value(const ch_act *a, ch_real x)
{
    switch (a->kind) {
    case CH_ACT_LEAKY_RELU: return x > 0 ? x : (ch_real)a->alpha * x;
    /* Comparisons that let NaN through, as ReLU's. */
    case CH_ACT_CLIP: return x < (ch_real)a->lo ? (ch_real)a->lo : x > (ch_real)a->hi ? (ch_real)a->hi : x;
    case CH_ACT_SIGMOID: return (ch_real)(1 / (1 + exp(-(double)x)));
    case CH_ACT_TANH: return (ch_real)tanh((double)x);
    case CH_ACT_HARDSIGMOID: return x <= -3 ? 0 : x >= 3 ? 1 : (ch_real)((double)x / 6 + 0.5);
    case CH_ACT_HARDSWISH: return x <= -3 ? 0 : x >= 3 ? x : (ch_real)((double)x * ((double)x + 3) / 6);
    case CH_ACT_AFFINE: return (ch_real)((double)a->alpha * x + a->beta);
    }
    return x;
}

static ch_real act_slope(const ch_act *a, ch_real x, ch_real y)
{
    switch (a->kind) {
    case CH_ACT_LEAKY_RELU: return x > 0 ? 1 : (ch_real)a->alpha;
    case CH_ACT_CLIP: return x < (ch_real)a->lo || x > (ch_real)a->hi ? 0 : 1;
    case CH_ACT_SIGMOID: return y * (1 - y);
    case CH_ACT_TANH: return 1 - y * y;
    /* PyTorch's: open interval for hardsigmoid, (-3, 3] for hardswish's middle piece. */
    case CH_ACT_HARDSIGMOID: return x > -3 && x < 3 ? (ch_real)(1.0 / 6) : 0;
    case CH_ACT_HARDSWISH: return x < -3 ? 0 : x <= 3 ? (ch_real)((double)x / 3 + 0.5) : 1;
    case CH_ACT_AFFINE: return (ch_real)a->alpha;
    }
    return 1;
}

void ch_cpu_act_forward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, ch_real *y)
{
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (size_t i = 0; i < len; i++) y[i] = act_value(a, x[i]);
}

void ch_cpu_act_backward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x,
                         const ch_real *y, const ch_real *dy, ch_real *dx)
{
    /* Leaky ReLU and clip read x, sigmoid and tanh read y: the caller may pass NULL for the other. */
    const bool from_y = a->kind == CH_ACT_SIGMOID || a->kind == CH_ACT_TANH;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (size_t i = 0; i < len; i++)
        dx[i] = dy[i] * act_slope(a, from_y ? 0 : x[i], from_y ? y[i] : 0);
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
