/* The CUDA plugin's own kernels: everything but GEMM and convolution (cuda_dnn.c). The per-element
 * arithmetic comes from the same headers the CPU table runs (act_body.h, norm_body.h,
 * optim_body.h, core/philox.h), and each sum runs in the CPU kernel's order where a thread owns it
 * (pooling and broadcast backward gather instead of scattering), so results match the CPU's;
 * this file is built with --fmad=false for the same reason. Reductions over a channel or a batch
 * (BatchNorm's statistics, the loss) are one block each, summed in double in a fixed tree:
 * deterministic, and within rounding of the CPU's lane sums. */
#include <float.h>

#include "core/philox.h"
#include "kernels/act_body.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/loss_body.h"
#include "kernels/move_body.h"
#include "kernels/norm_body.h"
#include "kernels/optim_body.h"
#include "kernels/pool_body.h"

enum { NT = 256, RT = 512 };

static unsigned grid_for(size_t len)
{
    const size_t b = (len + NT - 1) / NT;
    return (unsigned)(b < 1 ? 1 : b > (1u << 20) ? (1u << 20) : b);
}

#define FOR_EACH(i, len) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (len); i += (size_t)blockDim.x * gridDim.x)

#define LAUNCH(kernel, len, kc, ...)                                                      \
    do {                                                                                  \
        if ((len) == 0) break;                                                            \
        kernel<<<grid_for(len), NT, 0, cu_stream_of(kc)>>>(__VA_ARGS__);                 \
        CU_CHECK(cudaGetLastError());                                                     \
    } while (0)

/* The sum of v over the block's RT threads, in a fixed tree; every thread gets it. */
__device__ static double block_sum(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = RT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    const double r = sh[0];
    __syncthreads();
    return r;
}

/* ---- elementwise ------------------------------------------------------------------------ */

__global__ static void k_relu(size_t len, const ch_real *x, ch_real *y)
{
    FOR_EACH(i, len) y[i] = x[i] < 0 ? 0 : x[i];
}

__global__ static void k_relu_back(size_t len, const ch_real *y, const ch_real *dy, ch_real *dx)
{
    FOR_EACH(i, len) dx[i] = y[i] > 0 ? dy[i] : 0;
}

__global__ static void k_add(size_t len, const ch_real *a, const ch_real *b, ch_real *y)
{
    FOR_EACH(i, len) y[i] = a[i] + b[i];
}

extern "C" void cu_relu_forward(const ch_kctx *kc, size_t len, const ch_real *x, ch_real *y)
{
    LAUNCH(k_relu, len, kc, len, x, y);
}

extern "C" void cu_relu_backward(const ch_kctx *kc, size_t len, const ch_real *y, const ch_real *dy, ch_real *dx)
{
    LAUNCH(k_relu_back, len, kc, len, y, dy, dx);
}

extern "C" void cu_relu_mask(const ch_kctx *kc, size_t len, const ch_real *y, ch_real *dy)
{
    LAUNCH(k_relu_back, len, kc, len, y, dy, dy);
}

extern "C" void cu_add(const ch_kctx *kc, size_t len, const ch_real *a, const ch_real *b, ch_real *y)
{
    LAUNCH(k_add, len, kc, len, a, b, y);
}

/* The CPU's act_span, element by element (NaN passes through the piecewise kinds as there). */
__device__ static ch_real act_at(const ch_act a, ch_real x)
{
    const ch_real alpha = (ch_real)a.alpha, lo = (ch_real)a.lo, hi = (ch_real)a.hi;
    switch (a.kind) {
    case CH_ACT_LEAKY_RELU: return x > 0 ? x : alpha * x;
    case CH_ACT_CLIP: return x < lo ? lo : x > hi ? hi : x;
    case CH_ACT_SIGMOID: return (ch_real)(1 / (1 + exp(-(double)x)));
    case CH_ACT_TANH: return (ch_real)tanh((double)x);
    case CH_ACT_HARDSIGMOID: return x <= -3 ? 0 : x >= 3 ? 1 : (x + 3) / 6;
    case CH_ACT_HARDSWISH: return x <= -3 ? 0 : x >= 3 ? x : x * (x + 3) / 6;
    case CH_ACT_AFFINE: return (ch_real)((double)a.alpha * x + a.beta);
    case CH_ACT_ERF: return (ch_real)erf((double)x);
    case CH_ACT_GELU: return (ch_real)ch_gelu((double)x);
    case CH_ACT_GELU_TANH: return (ch_real)ch_gelu_tanh((double)x);
    }
    return x;
}

__device__ static ch_real act_back_at(const ch_act a, ch_real x, ch_real y, ch_real dy)
{
    const ch_real alpha = (ch_real)a.alpha, lo = (ch_real)a.lo, hi = (ch_real)a.hi;
    switch (a.kind) {
    case CH_ACT_LEAKY_RELU: return x > 0 ? dy : dy * alpha;
    case CH_ACT_CLIP: return x < lo || x > hi ? 0 : dy;
    case CH_ACT_SIGMOID: return dy * (y * (1 - y));
    case CH_ACT_TANH: return dy * (1 - y * y);
    case CH_ACT_HARDSIGMOID: return x > -3 && x < 3 ? dy * (ch_real)(1.0 / 6) : 0;
    case CH_ACT_HARDSWISH: return x < -3 ? 0 : x <= 3 ? dy * (x / 3 + (ch_real)0.5) : dy;
    case CH_ACT_AFFINE: return dy * alpha;
    case CH_ACT_ERF: return (ch_real)(dy * ch_erf_slope((double)x));
    case CH_ACT_GELU: return (ch_real)(dy * ch_gelu_slope((double)x));
    case CH_ACT_GELU_TANH: return (ch_real)(dy * ch_gelu_tanh_slope((double)x));
    }
    return dy;
}

__global__ static void k_act(ch_act a, size_t len, const ch_real *x, ch_real *y)
{
    FOR_EACH(i, len) y[i] = act_at(a, x[i]);
}

__global__ static void k_act_back(ch_act a, size_t len, const ch_real *x, const ch_real *y, const ch_real *dy,
                                  ch_real *dx)
{
    FOR_EACH(i, len) dx[i] = act_back_at(a, x ? x[i] : 0, y ? y[i] : 0, dy[i]);
}

extern "C" void cu_act_forward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, ch_real *y)
{
    LAUNCH(k_act, len, kc, *a, len, x, y);
}

extern "C" void cu_act_backward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, const ch_real *y,
                                const ch_real *dy, ch_real *dx)
{
    const bool from_y = a->kind == CH_ACT_SIGMOID || a->kind == CH_ACT_TANH;
    LAUNCH(k_act_back, len, kc, *a, len, from_y ? NULL : x, from_y ? y : NULL, dy, dx);
}

/* ---- broadcasting ----------------------------------------------------------------------- */

__device__ static size_t bindex(const int op[3], const int out[3], int c, int h, int w)
{
    const int cc = op[0] == out[0] ? c : 0, hh = op[1] == out[1] ? h : 0, ww = op[2] == out[2] ? w : 0;
    return ((size_t)cc * op[1] + hh) * op[2] + ww;
}

__global__ static void k_bcast(ch_bcast_desc d, size_t len, const ch_real *a, const ch_real *b, ch_real *y)
{
    const size_t ys = (size_t)d.out[0] * d.out[1] * d.out[2], as = (size_t)d.a[0] * d.a[1] * d.a[2],
                 bs = (size_t)d.b[0] * d.b[1] * d.b[2];
    FOR_EACH(i, len) {
        const size_t s = i / ys, r = i % ys;
        const int c = (int)(r / ((size_t)d.out[1] * d.out[2])), h = (int)(r / d.out[2] % d.out[1]),
                  w = (int)(r % d.out[2]);
        const ch_real u = a[s * as + bindex(d.a, d.out, c, h, w)], v = b[s * bs + bindex(d.b, d.out, c, h, w)];
        y[i] = d.op == CH_BCAST_MUL ? u * v : u + v;
    }
}

/* d(op)[i] for one operand of dims op: dy (times the other operand) summed over the output
 * positions that read element i, in c, h, w order (the CPU's). */
__global__ static void k_bcast_back(ch_bcast_desc d, int n, bool of_a, const ch_real *other, const ch_real *dy, ch_real *dop)
{
    const int *op = of_a ? d.a : d.b, *ot = of_a ? d.b : d.a;
    const size_t ps = (size_t)op[0] * op[1] * op[2], os = (size_t)ot[0] * ot[1] * ot[2],
                 ys = (size_t)d.out[0] * d.out[1] * d.out[2];
    const bool mul = d.op == CH_BCAST_MUL;
    FOR_EACH(i, (size_t)n * ps) {
        const size_t s = i / ps, r = i % ps;
        const int c = (int)(r / ((size_t)op[1] * op[2])), h = (int)(r / op[2] % op[1]), w = (int)(r % op[2]);
        const int c0 = op[0] == d.out[0] ? c : 0, c1 = op[0] == d.out[0] ? c + 1 : d.out[0];
        const int h0 = op[1] == d.out[1] ? h : 0, h1 = op[1] == d.out[1] ? h + 1 : d.out[1];
        const int w0 = op[2] == d.out[2] ? w : 0, w1 = op[2] == d.out[2] ? w + 1 : d.out[2];
        ch_real acc = 0;
        for (int cc = c0; cc < c1; cc++)
            for (int hh = h0; hh < h1; hh++)
                for (int ww = w0; ww < w1; ww++) {
                    const ch_real g = dy[s * ys + ((size_t)cc * d.out[1] + hh) * d.out[2] + ww];
                    acc += mul ? g * other[s * os + bindex(ot, d.out, cc, hh, ww)] : g;
                }
        dop[i] = acc;
    }
}

extern "C" void cu_bcast_forward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                                 const ch_real *b, ch_real *y)
{
    const size_t len = (size_t)n * d->out[0] * d->out[1] * d->out[2];
    LAUNCH(k_bcast, len, kc, *d, len, a, b, y);
}

extern "C" void cu_bcast_backward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                                  const ch_real *b, const ch_real *dy, ch_real *da, ch_real *db)
{
    const ch_bcast_desc bd = *d;
    if (da) LAUNCH(k_bcast_back, (size_t)n * d->a[0] * d->a[1] * d->a[2], kc, bd, n, true, b, dy, da);
    if (db) LAUNCH(k_bcast_back, (size_t)n * d->b[0] * d->b[1] * d->b[2], kc, bd, n, false, a, dy, db);
}

__global__ static void k_copy_rows(size_t len, size_t total, const ch_real *src, size_t ss, ch_real *dst, size_t ds)
{
    FOR_EACH(i, total) dst[i / len * ds + i % len] = src[i / len * ss + i % len];
}

extern "C" void cu_copy_rows(const ch_kctx *kc, int rows, size_t len, const ch_real *src, size_t src_stride,
                             ch_real *dst, size_t dst_stride)
{
    const size_t total = (size_t)(rows > 0 ? rows : 0) * len;
    LAUNCH(k_copy_rows, total, kc, len, total, src, src_stride, dst, dst_stride);
}

/* One thread per element of y, reading x where kernels/move_body.h says (the CPU's map). */
__global__ static void k_permute(ch_permute_desc d, size_t per, size_t total, const ch_real *x, ch_real *y)
{
    FOR_EACH(i, total) y[i] = x[i / per * per + ch_permute_source(&d, i % per)];
}

extern "C" void cu_permute(const ch_kctx *kc, const ch_permute_desc *d, int n, const ch_real *x, ch_real *y)
{
    const size_t per = (size_t)d->dims[0] * d->dims[1] * d->dims[2], total = (size_t)(n > 0 ? n : 0) * per;
    LAUNCH(k_permute, total, kc, *d, per, total, x, y);
}

/* ---- dropout, conversions, sums, optimizers -------------------------------------------- */

__global__ static void k_dropout(int n, size_t per, uint64_t seed, uint64_t stream, uint64_t step, uint64_t sample0,
                                 uint32_t threshold, ch_real keep, ch_real *mask)
{
    const size_t quads = (per + 3) / 4;
    FOR_EACH(i, (size_t)n * quads) {
        const uint64_t s = i / quads, q = i % quads;
        const uint64_t start = (step << 32) ^ ((sample0 + s) * quads);
        uint32_t w[4];
        ch_philox_block(seed, stream, start + q, w);
        for (size_t e = q * 4; e < per && e < q * 4 + 4; e++) mask[s * per + e] = w[e % 4] >= threshold ? keep : 0;
    }
}

extern "C" void cu_dropout_mask(const ch_kctx *kc, int n, size_t per, uint64_t seed, uint64_t stream, uint64_t step,
                                uint64_t sample0, uint32_t threshold, ch_real keep, ch_real *mask)
{
    LAUNCH(k_dropout, (size_t)n * ((per + 3) / 4), kc, n, per, seed, stream, step, sample0, threshold, keep, mask);
}

__global__ static void k_to_real(size_t len, const double *x, ch_real *y)
{
    FOR_EACH(i, len) y[i] = (ch_real)x[i];
}

extern "C" void cu_to_real(const ch_kctx *kc, size_t len, const double *x, ch_real *y)
{
    LAUNCH(k_to_real, len, kc, len, x, y);
}

__global__ static void k_col_sum(int rows, size_t len, const ch_real *x, ch_real *y)
{
    FOR_EACH(j, len) {
        ch_real s = 0;
        for (int i = 0; i < rows; i++) s += x[(size_t)i * len + j];
        y[j] = s;
    }
}

extern "C" void cu_col_sum(const ch_kctx *kc, int rows, size_t len, const ch_real *x, ch_real *y)
{
    LAUNCH(k_col_sum, len, kc, rows, len, x, y);
}

__global__ static void k_optim(ch_optim_update u, size_t n, ch_real *p, const ch_real *g, ch_real *s0, ch_real *s1)
{
    FOR_EACH(i, n) {
        switch (u.rule) {
        case CH_UPDATE_SGD: ch_sgd_at(i, u.lr, u.wd, u.momentum, u.damp, u.first, u.nesterov, p, g, s0); break;
        case CH_UPDATE_ADAM:
            ch_adam_at(i, u.decoupled, u.b1, u.b2, u.eps, u.wd, u.decay, u.step_size, u.bc2_sqrt, p, g, s0, s1);
            break;
        case CH_UPDATE_ADAGRAD: ch_adagrad_at(i, u.lr, u.wd, u.eps, p, g, s0); break;
        }
    }
}

extern "C" void cu_optim_update(const ch_kctx *kc, const ch_optim_update *u, size_t n, ch_real *p, const ch_real *g,
                                ch_real *s0, ch_real *s1)
{
    LAUNCH(k_optim, n, kc, *u, n, p, g, s0, s1);
}

/* ---- losses: one block; the sums land in host memory the caller mapped (host_alloc) -------- */

__global__ static void k_softmax_xent(int n, int k, const ch_real *logits, const int32_t *labels, double scale,
                                      ch_real *dlogits, double *loss_sum, int64_t *correct)
{
    __shared__ double sh[RT];
    double loss = 0, hits = 0;
    for (int i = threadIdx.x; i < n; i += RT)
        ch_xent_sample(logits + (size_t)i * k, k, labels[i], scale, dlogits ? dlogits + (size_t)i * k : NULL, &loss,
                       &hits);
    loss = block_sum(loss, sh);
    hits = block_sum(hits, sh);
    if (threadIdx.x == 0) {
        *loss_sum = loss;
        *correct = (int64_t)hits;
    }
}

extern "C" void cu_softmax_xent(const ch_kctx *kc, int n, int k, const ch_real *logits, const int32_t *labels,
                                double scale, ch_real *dlogits, double *loss_sum, int64_t *correct)
{
    k_softmax_xent<<<1, RT, 0, cu_stream_of(kc)>>>(n, k, logits, labels, scale, dlogits, loss_sum, correct);
    CU_CHECK(cudaGetLastError());
}

__global__ static void k_mse(size_t len, const ch_real *pred, const ch_real *target, double scale, ch_real *dpred,
                             double *loss_sum)
{
    __shared__ double sh[RT];
    double loss = 0;
    for (size_t i = threadIdx.x; i < len; i += RT) {
        const double d = (double)pred[i] - target[i];
        loss += d * d;
        if (dpred) dpred[i] = (ch_real)(2 * d * scale);
    }
    loss = block_sum(loss, sh);
    if (threadIdx.x == 0) *loss_sum = loss;
}

extern "C" void cu_mse(const ch_kctx *kc, size_t len, const ch_real *pred, const ch_real *target, double scale,
                       ch_real *dpred, double *loss_sum)
{
    k_mse<<<1, RT, 0, cu_stream_of(kc)>>>(len, pred, target, scale, dpred, loss_sum);
    CU_CHECK(cudaGetLastError());
}

/* ---- pooling and upsampling ------------------------------------------------------------- */

__global__ static void k_maxpool(ch_pool_desc d, size_t len, const ch_real *x, ch_real *y, int32_t *am)
{
    FOR_EACH(o, len) {
        const size_t pl = o / ((size_t)d.oh * d.ow);
        const int i = (int)(o / d.ow % d.oh), j = (int)(o % d.ow);
        const ch_real *xp = x + pl * d.h * d.w;
        ch_real best = -FLT_MAX;
        int32_t arg = -1;
        for (int p = 0; p < d.k; p++) {
            const int ih = i * d.stride - d.pad + p;
            if (ih < 0 || ih >= d.h) continue;
            for (int q = 0; q < d.k; q++) {
                const int iw = j * d.stride - d.pad + q;
                if (iw < 0 || iw >= d.w) continue;
                const ch_real v = xp[ih * d.w + iw];
                if (arg < 0 || v > best || v != v) {
                    best = v;
                    arg = ih * d.w + iw;
                }
            }
        }
        y[o] = best;
        am[o] = arg;
    }
}

/* The outputs whose windows hold input row (or column) i: [*lo, *hi). */
__device__ static void windows_over(int i, int k, int stride, int pad, int out, int *lo, int *hi)
{
    const int top = i + pad - k + 1;
    *lo = top <= 0 ? 0 : (top + stride - 1) / stride;
    *hi = (i + pad) / stride + 1;
    if (*hi > out) *hi = out;
}

/* dx gathered per input element from the outputs whose argmax names it, in output order (the
 * CPU's scatter adds in that order too). */
__global__ static void k_maxpool_back(ch_pool_desc d, size_t len, const ch_real *dy, const int32_t *am, ch_real *dx)
{
    FOR_EACH(e, len) {
        const size_t pl = e / ((size_t)d.h * d.w);
        const int ih = (int)(e / d.w % d.h), iw = (int)(e % d.w), at = ih * d.w + iw;
        int i0, i1, j0, j1;
        windows_over(ih, d.k, d.stride, d.pad, d.oh, &i0, &i1);
        windows_over(iw, d.k, d.stride, d.pad, d.ow, &j0, &j1);
        const size_t base = pl * d.oh * d.ow;
        ch_real s = 0;
        for (int i = i0; i < i1; i++)
            for (int j = j0; j < j1; j++)
                if (am[base + (size_t)i * d.ow + j] == at) s += dy[base + (size_t)i * d.ow + j];
        dx[e] = s;
    }
}

__global__ static void k_avgpool(ch_pool_desc d, size_t len, const ch_real *x, ch_real *y)
{
    FOR_EACH(o, len) {
        const size_t pl = o / ((size_t)d.oh * d.ow);
        const int i = (int)(o / d.ow % d.oh), j = (int)(o % d.ow);
        const ch_real *xp = x + pl * d.h * d.w;
        ch_real s = 0;
        for (int p = 0; p < d.k; p++) {
            const int ih = i * d.stride - d.pad + p;
            if (ih < 0 || ih >= d.h) continue;
            for (int q = 0; q < d.k; q++) {
                const int iw = j * d.stride - d.pad + q;
                if (iw >= 0 && iw < d.w) s += xp[ih * d.w + iw];
            }
        }
        y[o] = s * ((ch_real)1 / (ch_real)ch_avgpool_divisor(&d, i, j));
    }
}

__global__ static void k_avgpool_back(ch_pool_desc d, size_t len, const ch_real *dy, ch_real *dx)
{
    FOR_EACH(e, len) {
        const size_t pl = e / ((size_t)d.h * d.w);
        const int ih = (int)(e / d.w % d.h), iw = (int)(e % d.w);
        int i0, i1, j0, j1;
        windows_over(ih, d.k, d.stride, d.pad, d.oh, &i0, &i1);
        windows_over(iw, d.k, d.stride, d.pad, d.ow, &j0, &j1);
        const ch_real *g = dy + pl * d.oh * d.ow;
        ch_real s = 0;
        for (int i = i0; i < i1; i++)
            for (int j = j0; j < j1; j++) s += g[(size_t)i * d.ow + j] * ((ch_real)1 / (ch_real)ch_avgpool_divisor(&d, i, j));
        dx[e] = s;
    }
}

extern "C" void cu_maxpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x, ch_real *y,
                                     int32_t *argmax)
{
    const size_t len = (size_t)n * d->c * d->oh * d->ow;
    LAUNCH(k_maxpool, len, kc, *d, len, x, y, argmax);
}

extern "C" void cu_maxpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy,
                                      const int32_t *argmax, ch_real *dx)
{
    const size_t len = (size_t)n * d->c * d->h * d->w;
    LAUNCH(k_maxpool_back, len, kc, *d, len, dy, argmax, dx);
}

extern "C" void cu_avgpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x, ch_real *y)
{
    const size_t len = (size_t)n * d->c * d->oh * d->ow;
    LAUNCH(k_avgpool, len, kc, *d, len, x, y);
}

extern "C" void cu_avgpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy, ch_real *dx)
{
    const size_t len = (size_t)n * d->c * d->h * d->w;
    LAUNCH(k_avgpool_back, len, kc, *d, len, dy, dx);
}

__global__ static void k_upsample(size_t len, int h, int w, int sh, int sw, const ch_real *x, ch_real *y)
{
    const size_t ow = (size_t)w * sw, oh = (size_t)h * sh;
    FOR_EACH(o, len) {
        const size_t pl = o / (oh * ow), i = o / ow % oh, j = o % ow;
        y[o] = x[(pl * h + i / sh) * w + j / sw];
    }
}

__global__ static void k_upsample_back(size_t len, int h, int w, int sh, int sw, const ch_real *dy, ch_real *dx)
{
    const size_t ow = (size_t)w * sw;
    FOR_EACH(e, len) {
        const size_t pl = e / ((size_t)h * w), i = e / w % h, j = e % w;
        const ch_real *g = dy + ((size_t)pl * h + i) * sh * ow;
        ch_real s = 0;
        for (int r = 0; r < sh; r++)
            for (int q = 0; q < sw; q++) s += g[r * ow + j * sw + q];
        dx[e] = s;
    }
}

extern "C" void cu_upsample_forward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw, const ch_real *x,
                                    ch_real *y)
{
    const size_t len = (size_t)n * c * h * sh * w * sw;
    LAUNCH(k_upsample, len, kc, len, h, w, sh, sw, x, y);
}

extern "C" void cu_upsample_backward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw,
                                     const ch_real *dy, ch_real *dx)
{
    const size_t len = (size_t)n * c * h * w;
    LAUNCH(k_upsample_back, len, kc, len, h, w, sh, sw, dy, dx);
}

/* Bilinear: a thread per output pixel forward; backward a thread per plane, summing in the CPU's
 * output order (pool_body.h) without atomics. */
__global__ static void k_bilinear(size_t len, int h, int w, int oh, int ow, bool align, const ch_real *x, ch_real *y)
{
    FOR_EACH(i, len) {
        const size_t p = i / ((size_t)oh * ow), q = i % ((size_t)oh * ow);
        y[i] = ch_bilinear_at(x + p * h * w, h, w, oh, ow, align, (int)(q / ow), (int)(q % ow));
    }
}

__global__ static void k_bilinear_back(size_t planes, int h, int w, int oh, int ow, bool align, const ch_real *dy,
                                       ch_real *dx)
{
    FOR_EACH(p, planes) ch_bilinear_plane_back(h, w, oh, ow, align, dy + p * oh * ow, dx + p * h * w);
}

extern "C" void cu_bilinear_forward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align,
                                    const ch_real *x, ch_real *y)
{
    const size_t len = (size_t)planes * oh * ow;
    LAUNCH(k_bilinear, len, kc, len, h, w, oh, ow, align, x, y);
}

extern "C" void cu_bilinear_backward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align,
                                     const ch_real *dy, ch_real *dx)
{
    LAUNCH(k_bilinear_back, (size_t)planes, kc, (size_t)planes, h, w, oh, ow, align, dy, dx);
}

/* ---- BatchNorm and the convolution's per-channel companions ----------------------------- */

/* Reductions over a channel (n samples of hw values): a grid of blocks per channel, each summing
 * a contiguous part in double into the stream's scratch, then one thread per channel adding the
 * parts in order. Deterministic, and enough blocks to keep the GPU's memory busy (one block per
 * channel left ResNet's 64-channel layers on half the multiprocessors). */
enum { SUM_X, SUM_SQDEV, SUM_DY_DYX, SUM_DY_DYX_RELU };

/* channel_affine's value, in one place: the fused BatchNorm + ReLU kernels remake it to mask dy,
 * and the mask must be the forward's (the same arithmetic; no FMA, --fmad=false). */
__device__ static ch_real bn_value(ch_real x, ch_real scale, ch_real shift) { return x * scale + shift; }

struct red {
    int n, c, hw, parts;
};

static red red_of(int n, int c, int hw)
{
    const size_t cnt = (size_t)n * hw, by_size = cnt / 8192, room = (CU_SCRATCH - (size_t)c) / (2 * (size_t)c);
    size_t parts = by_size < 1 ? 1 : by_size > 64 ? 64 : by_size;
    if (parts > room) parts = room;
    if (3 * (size_t)c > CU_SCRATCH) cu_fail("a channel reduction", "more channels than the scratch holds", __FILE__, __LINE__);
    red r = { n, c, hw, (int)parts };
    return r;
}

/* SUM_DY_DYX_RELU: dy masked as ReLU's backward masks it, by the pre-ReLU value remade from x,
 * scale and shift (0 where not > 0). */
__global__ static void k_partials(int mode, red r, const ch_real *x, const ch_real *dy, const double *mean_d,
                                  const ch_real *mean_f, const ch_real *scale, const ch_real *shift, double *part)
{
    __shared__ double sh[RT];
    const int ch = blockIdx.x, p = blockIdx.y;
    const size_t cnt = (size_t)r.n * r.hw, lo = cnt * p / r.parts, hi = cnt * (p + 1) / r.parts;
    const bool dys = mode == SUM_DY_DYX || mode == SUM_DY_DYX_RELU;
    const double m = mode == SUM_SQDEV ? mean_d[ch] : dys ? (double)mean_f[ch] : 0;
    double a = 0, b = 0;
    for (size_t e = lo + threadIdx.x; e < hi; e += RT) {
        const size_t k = ((e / r.hw) * r.c + ch) * r.hw + e % r.hw;
        if (mode == SUM_X) {
            a += x[k];
        } else if (mode == SUM_SQDEV) {
            const double v = x[k] - m;
            a += v * v;
        } else {
            const ch_real g = mode == SUM_DY_DYX || bn_value(x[k], scale[ch], shift[ch]) > 0 ? dy[k] : 0;
            a += g;
            b += (double)g * ((double)x[k] - m);
        }
    }
    a = block_sum(a, sh);
    if (dys) b = block_sum(b, sh);
    if (threadIdx.x == 0) {
        part[(size_t)ch * r.parts + p] = a;
        if (dys) part[((size_t)r.c + ch) * r.parts + p] = b;
    }
}

__device__ static double parts_sum(const double *part, int ch, int parts)
{
    double s = 0;
    for (int p = 0; p < parts; p++) s += part[(size_t)ch * parts + p];
    return s;
}

/* what: 0 the mean (into mean_d and out), 1 the biased variance (into out), 2 the real sum. */
__global__ static void k_finish(int what, red r, const double *part, double *mean_d, double *out, ch_real *out_real)
{
    const double cnt = (double)r.n * r.hw;
    FOR_EACH(ch, (size_t)r.c) {
        const double s = parts_sum(part, (int)ch, r.parts);
        if (what == 0) {
            const double m = cnt > 0 ? s / cnt : 0;
            mean_d[ch] = m;
            out[ch] = m;
        } else if (what == 1) {
            const double v = cnt > 0 ? s / cnt : 0;
            out[ch] = v > 0 ? v : 0;
        } else {
            out_real[ch] = (ch_real)s;
        }
    }
}

__global__ static void k_finish_dy(red r, const double *part, const ch_real *invstd, double *sum_dy, double *sum_dyx)
{
    FOR_EACH(ch, (size_t)r.c) {
        sum_dy[ch] = parts_sum(part, (int)ch, r.parts);
        sum_dyx[ch] = parts_sum(part, r.c + (int)ch, r.parts) * invstd[ch];
    }
}

static void partials(const ch_kctx *kc, int mode, red r, const ch_real *x, const ch_real *dy, const double *mean_d,
                     const ch_real *mean_f, const ch_real *scale, const ch_real *shift, double *part)
{
    const dim3 grid((unsigned)r.c, (unsigned)r.parts);
    k_partials<<<grid, RT, 0, cu_stream_of(kc)>>>(mode, r, x, dy, mean_d, mean_f, scale, shift, part);
    CU_CHECK(cudaGetLastError());
}

/* Two passes, as the CPU: the mean, then the biased variance about it. */
extern "C" void cu_batchnorm_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, double *mean, double *var)
{
    if (c <= 0) return;
    const red r = red_of(n, c, hw);
    double *part = cu_of(kc)->scratch, *mean_d = part + 2 * (size_t)c * r.parts;
    partials(kc, SUM_X, r, x, NULL, NULL, NULL, NULL, NULL, part);
    LAUNCH(k_finish, (size_t)c, kc, 0, r, part, mean_d, mean, NULL);
    partials(kc, SUM_SQDEV, r, x, NULL, mean_d, NULL, NULL, NULL, part);
    LAUNCH(k_finish, (size_t)c, kc, 1, r, part, mean_d, var, NULL);
}

__global__ static void k_bn_finalize(int c, const double *mean, const double *var, double count, double eps,
                                     double momentum, const ch_real *gamma, const ch_real *beta, ch_real *rm,
                                     ch_real *rv, ch_real *save)
{
    FOR_EACH(i, (size_t)c) ch_bn_finalize_channel((int)i, c, mean, var, count, eps, momentum, gamma, beta, rm, rv, save);
}

extern "C" void cu_batchnorm_finalize(const ch_kctx *kc, int c, const double *mean, const double *var, double count,
                                      double eps, double momentum, const ch_real *gamma, const ch_real *beta,
                                      ch_real *running_mean, ch_real *running_var, ch_real *save)
{
    LAUNCH(k_bn_finalize, (size_t)c, kc, c, mean, var, count, eps, momentum, gamma, beta, running_mean, running_var,
           save);
}

__global__ static void k_channel_affine(size_t len, int c, int hw, const ch_real *x, const ch_real *scale,
                                        const ch_real *shift, ch_real *y)
{
    FOR_EACH(i, len) {
        const int ch = (int)(i / hw % c);
        y[i] = bn_value(x[i], scale[ch], shift[ch]);
    }
}

extern "C" void cu_channel_affine(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *scale,
                                  const ch_real *shift, ch_real *y)
{
    const size_t len = (size_t)n * c * hw;
    LAUNCH(k_channel_affine, len, kc, len, c, hw, x, scale, shift, y);
}

/* BatchNorm's backward sums of dy (mode SUM_DY_DYX) or of dy masked by the fused ReLU
 * (SUM_DY_DYX_RELU, with scale and shift). */
static void dy_sums(const ch_kctx *kc, int mode, int n, int c, int hw, const ch_real *x, const ch_real *dy,
                    const ch_real *mean, const ch_real *invstd, const ch_real *scale, const ch_real *shift,
                    double *sum_dy, double *sum_dy_xhat)
{
    if (c <= 0) return;
    const red r = red_of(n, c, hw);
    double *part = cu_of(kc)->scratch;
    partials(kc, mode, r, x, dy, NULL, mean, scale, shift, part);
    LAUNCH(k_finish_dy, (size_t)c, kc, r, part, invstd, sum_dy, sum_dy_xhat);
}

extern "C" void cu_batchnorm_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                             const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                             double *sum_dy, double *sum_dy_xhat)
{
    dy_sums(kc, SUM_DY_DYX, n, c, hw, x, dy, mean, invstd, NULL, NULL, sum_dy, sum_dy_xhat);
}

/* scale, shift: with them, dy masked as in SUM_DY_DYX_RELU (the fused ReLU's backward). */
__global__ static void k_bn_back_data(size_t len, int c, int hw, const ch_real *x, const ch_real *dy,
                                      const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                                      const ch_real *scale, const ch_real *shift,
                                      const double *sum_dy, const double *sum_dyx, double count, ch_real *dx)
{
    FOR_EACH(i, len) {
        const int ch = (int)(i / hw % c);
        const ch_real is = invstd[ch], m = mean[ch], g = gamma[ch] * is;
        const ch_real mdy = (ch_real)(sum_dy[ch] / count), mdx = (ch_real)(sum_dyx[ch] / count);
        const ch_real d = !scale || bn_value(x[i], scale[ch], shift[ch]) > 0 ? dy[i] : 0;
        dx[i] = g * (d - mdy - (x[i] - m) * is * mdx);
    }
}

extern "C" void cu_batchnorm_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                           const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                           const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat,
                                           double count, ch_real *dx)
{
    const size_t len = (size_t)n * c * hw;
    LAUNCH(k_bn_back_data, len, kc, len, c, hw, x, dy, mean, invstd, gamma, (const ch_real *)NULL,
           (const ch_real *)NULL, sum_dy, sum_dy_xhat, count, dx);
}

/* ---- BatchNorm with the ReLU after it, and with the sum over its output (graph/exec.c) -----
 * kernels.h's contracts, fp32 only: the plugin has no bf16 storage, so xh and keep (the bf16
 * copies) are always NULL here; a caller that passed one would be a planning error. */
static void no_bf16(const void *xh, const void *keep, const char *what)
{
    if (xh || keep) cu_fail(what, "bf16 storage is not built for the GPU", __FILE__, __LINE__);
}

__global__ static void k_bn_relu(size_t len, int c, int hw, const ch_real *x, const ch_real *scale,
                                 const ch_real *shift, ch_real *y)
{
    FOR_EACH(i, len) {
        const int ch = (int)(i / hw % c);
        const ch_real v = bn_value(x[i], scale[ch], shift[ch]);
        y[i] = v < 0 ? 0 : v;   /* k_relu's clamp: -0 and NaN pass */
    }
}

extern "C" void cu_bn_relu_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                   const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep)
{
    no_bf16(xh, keep, "bn_relu_forward");
    const size_t len = (size_t)n * c * hw;
    LAUNCH(k_bn_relu, len, kc, len, c, hw, x, scale, shift, y);
}

extern "C" void cu_bn_relu_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                           const uint16_t *xh, const ch_real *dy, const ch_real *mean,
                                           const ch_real *invstd, const ch_real *scale, const ch_real *shift,
                                           double *sum_dy, double *sum_dy_xhat)
{
    no_bf16(xh, NULL, "bn_relu_backward_reduce");
    dy_sums(kc, SUM_DY_DYX_RELU, n, c, hw, x, dy, mean, invstd, scale, shift, sum_dy, sum_dy_xhat);
}

extern "C" void cu_bn_relu_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                         const uint16_t *xh, const ch_real *dy, const ch_real *mean,
                                         const ch_real *invstd, const ch_real *gamma, const ch_real *scale,
                                         const ch_real *shift, const double *sum_dy, const double *sum_dy_xhat,
                                         double count, ch_real *dx)
{
    no_bf16(xh, NULL, "bn_relu_backward_data");
    const size_t len = (size_t)n * c * hw;
    LAUNCH(k_bn_back_data, len, kc, len, c, hw, x, dy, mean, invstd, gamma, scale, shift, sum_dy, sum_dy_xhat,
           count, dx);
}

/* y = v + res (k_add's sum, v first), then with relu k_relu's clamp. */
__global__ static void k_bn_add(size_t len, int c, int hw, const ch_real *x, const ch_real *scale,
                                const ch_real *shift, const ch_real *res, bool relu, ch_real *y)
{
    FOR_EACH(i, len) {
        const int ch = (int)(i / hw % c);
        const ch_real v = bn_value(x[i], scale[ch], shift[ch]);
        const ch_real s = v + res[i];
        y[i] = relu && s < 0 ? 0 : s;
    }
}

extern "C" void cu_bn_add_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                  const ch_real *scale, const ch_real *shift, const ch_real *res, bool relu,
                                  ch_real *y, uint16_t *keep)
{
    no_bf16(xh, keep, "bn_add_forward");
    const size_t len = (size_t)n * c * hw;
    LAUNCH(k_bn_add, len, kc, len, c, hw, x, scale, shift, res, relu, y);
}

/* LayerNorm: a thread per group (its len values inner apart), and a thread per parameter for the
 * gradients, each summing in the CPU kernel's order (norm_body.h). Simple rather than fast:
 * LayerNorm's groups are short in the CNNs that use it. */
__global__ static void k_ln_forward(size_t groups, int len, int inner, const ch_real *x, const ch_real *gamma,
                                    const ch_real *beta, double eps, ch_real *y, ch_real *mean, ch_real *invstd)
{
    FOR_EACH(g, groups) {
        const size_t at = g / inner * len * inner + g % inner;
        ch_ln_forward_group(len, (size_t)inner, x + at, gamma, beta, eps, y + at, mean + g, invstd + g);
    }
}

__global__ static void k_ln_backward(size_t groups, int len, int inner, const ch_real *x, const ch_real *dy,
                                     const ch_real *gamma, const ch_real *mean, const ch_real *invstd, ch_real *dx)
{
    FOR_EACH(g, groups) {
        const size_t at = g / inner * len * inner + g % inner;
        ch_ln_backward_group(len, (size_t)inner, x + at, dy + at, gamma, mean[g], invstd[g], dx + at);
    }
}

__global__ static void k_ln_params(int outer, int len, int inner, const ch_real *x, const ch_real *dy,
                                   const ch_real *mean, const ch_real *invstd, ch_real *dgamma, ch_real *dbeta)
{
    FOR_EACH(j, (size_t)len) ch_ln_param_grads((int)j, outer, len, (size_t)inner, x, dy, mean, invstd, dgamma, dbeta);
}

extern "C" void cu_layernorm_forward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x,
                                     const ch_real *gamma, const ch_real *beta, double eps, ch_real *y, ch_real *mean,
                                     ch_real *invstd)
{
    const size_t groups = (size_t)outer * inner;
    LAUNCH(k_ln_forward, groups, kc, groups, len, inner, x, gamma, beta, eps, y, mean, invstd);
}

extern "C" void cu_layernorm_backward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x,
                                      const ch_real *dy, const ch_real *gamma, const ch_real *mean,
                                      const ch_real *invstd, ch_real *dx, ch_real *dgamma, ch_real *dbeta)
{
    const size_t groups = (size_t)outer * inner;
    LAUNCH(k_ln_params, (size_t)len, kc, outer, len, inner, x, dy, mean, invstd, dgamma, dbeta);
    if (dx) LAUNCH(k_ln_backward, groups, kc, groups, len, inner, x, dy, gamma, mean, invstd, dx);
}

__global__ static void k_bias_relu(size_t len, int oc, int hw, const ch_real *b, bool relu, ch_real *y)
{
    FOR_EACH(i, len) {
        ch_real v = y[i];
        if (b) v += b[i / hw % oc];
        y[i] = relu && v < 0 ? 0 : v;
    }
}

extern "C" void cu_bias_relu(const ch_kctx *kc, int n, int oc, int hw, const ch_real *b, bool relu, ch_real *y)
{
    if (!b && !relu) return;
    const size_t len = (size_t)n * oc * hw;
    LAUNCH(k_bias_relu, len, kc, len, oc, hw, b, relu, y);
}

extern "C" void cu_channel_sum(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, ch_real *sum)
{
    if (c <= 0) return;
    const red r = red_of(n, c, hw);
    double *part = cu_of(kc)->scratch;
    partials(kc, SUM_X, r, x, NULL, NULL, NULL, NULL, NULL, part);
    LAUNCH(k_finish, (size_t)c, kc, 2, r, part, NULL, NULL, sum);
}
