/* Elementwise kernels and the softmax cross-entropy loss. */
#include "kernels/cpu/cpu.h"

#include <math.h>

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
