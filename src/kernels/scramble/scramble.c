/* The scramble backend: a test backend whose replica memory is not plain host memory.
 * Every 8-byte word is stored XORed with a key that is a hash of its address (so any part of a buffer
 * can be unscrambled alone, and bytes moved to another address without the backend read as
 * garbage there); upload and download scramble and unscramble, and each kernel unscrambles its
 * tensor arguments in place, runs the CPU kernel and scrambles them again. Code that reads or
 * writes replica memory without the backend sees or leaves garbage, and the tests run on this
 * backend (gradient checks, devices and ranks against one device) fail. Arguments that overlap
 * (dx over dy, a concatenation's rows) are merged into one region, so no byte is toggled twice. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"

/* The key of the aligned word at a (splitmix64's finalizer of its index: never 0 in practice, and
 * different for every word). */
static uint64_t word_key(uintptr_t a)
{
    uint64_t z = (uint64_t)(a >> 3) + 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static uint8_t key_byte(const uint8_t *b)
{
    return (uint8_t)(word_key((uintptr_t)b) >> (8 * ((uintptr_t)b & 7)));
}

/* XOR [p, p + bytes) with the key of each byte's address. */
static void toggle(void *p, size_t bytes)
{
    uint8_t *b = p;
    while (bytes && ((uintptr_t)b & 7)) {
        *b ^= key_byte(b);
        b++;
        bytes--;
    }
    for (; bytes >= 8; b += 8, bytes -= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        w ^= word_key((uintptr_t)b);   /* little-endian: byte j of the key is byte j of the word */
        memcpy(b, &w, 8);
    }
    for (; bytes; b++, bytes--) *b ^= key_byte(b);
}

static void *sc_alloc(const ch_backend *be, size_t bytes)
{
    (void)be;
    if (bytes > SIZE_MAX - 64) return NULL;
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) return NULL;
    memset(p, 0, bytes);
    toggle(p, bytes);   /* zero, as the backend stores it: not zero bytes */
    return p;
}

static void sc_free(const ch_backend *be, void *p)
{
    (void)be;
    free(p);
}

static void sc_upload(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memmove(dst, src, bytes);
    toggle(dst, bytes);
}

static void sc_download(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    /* The keys are the source's: each byte is unscrambled where it was stored. */
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t i = 0;
    for (; i < bytes && ((uintptr_t)(s + i) & 7); i++) d[i] = s[i] ^ key_byte(s + i);
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        w ^= word_key((uintptr_t)(s + i));
        memcpy(d + i, &w, 8);
    }
    for (; i < bytes; i++) d[i] = s[i] ^ key_byte(s + i);
}

static void sc_copy(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    uint8_t *d = dst;
    const uint8_t *s = src;
    for (size_t i = 0; i < bytes; i++) d[i] = s[i] ^ key_byte(s + i) ^ key_byte(d + i);
}

static void sc_zero(const ch_backend *be, void *dst, size_t bytes)
{
    (void)be;
    memset(dst, 0, bytes);
    toggle(dst, bytes);
}

const ch_backend_ops ch_scramble_ops = {
    .name = "scramble", .host_visible = false, .alloc = sc_alloc, .free = sc_free,
    .upload = sc_upload, .download = sc_download, .copy = sc_copy, .zero = sc_zero,
};

/* ---- the kernels: regions of the arguments, merged, toggled around the CPU kernel ---- */

enum { MAX_REGIONS = 8 };

typedef struct regions {
    int n;
    uintptr_t lo[MAX_REGIONS], hi[MAX_REGIONS];
} regions;

static void add(regions *r, const void *p, size_t bytes)
{
    if (!p || bytes == 0) return;
    uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    /* Merge with every region it overlaps or touches; what is left is disjoint. */
    for (int i = 0; i < r->n;) {
        if (r->lo[i] <= hi && lo <= r->hi[i]) {
            if (r->lo[i] < lo) lo = r->lo[i];
            if (r->hi[i] > hi) hi = r->hi[i];
            r->lo[i] = r->lo[r->n - 1];
            r->hi[i] = r->hi[r->n - 1];
            r->n--;
        } else {
            i++;
        }
    }
    CH_ASSERT(r->n < MAX_REGIONS);
    r->lo[r->n] = lo;
    r->hi[r->n] = hi;
    r->n++;
}

static void flip(const regions *r)
{
    for (int i = 0; i < r->n; i++) toggle((void *)r->lo[i], r->hi[i] - r->lo[i]);
}

static size_t F(size_t count) { return count * sizeof(ch_real); }
/* A strided matrix's span: rows of cols values, ld apart. */
static size_t span(int rows, int cols, size_t ld) { return rows > 0 && cols > 0 ? F((size_t)(rows - 1) * ld + (size_t)cols) : 0; }

#define AROUND(r, call) \
    do {                \
        flip(&(r));     \
        call;           \
        flip(&(r));     \
    } while (0)

/* The memory a GEMM reads and writes: A and B (none when k is 0), and C. */
static regions gemm_regions(bool ta, bool tb, int m, int n, int k, const ch_real *a, int lda,
                            const ch_real *b, int ldb, const ch_real *c, int ldc)
{
    regions r = { 0 };
    if (k > 0) {
        add(&r, a, span(ta ? k : m, ta ? m : k, (size_t)lda));
        add(&r, b, span(tb ? n : k, tb ? k : n, (size_t)ldb));
    }
    add(&r, c, span(m, n, (size_t)ldc));
    return r;
}

static void sc_gemm(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, ch_real alpha,
                    const ch_real *a, int lda, const ch_real *b, int ldb, ch_real beta, ch_real *c,
                    int ldc)
{
    regions r = gemm_regions(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    AROUND(r, ch_cpu_gemm(kc, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

static void sc_gemm_bf16(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k,
                         const ch_real *a, int lda, const ch_real *b, int ldb, bool accumulate,
                         ch_real *c, int ldc)
{
    regions r = gemm_regions(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    AROUND(r, ch_cpu_gemm_bf16(kc, ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc));
}

static size_t conv_x(const ch_conv_desc *d, int n) { return F((size_t)n * d->c * d->h * d->w); }
static size_t conv_y(const ch_conv_desc *d, int n) { return F((size_t)n * d->oc * d->oh * d->ow); }
static size_t conv_w(const ch_conv_desc *d) { return F((size_t)d->oc * (d->c / ch_conv_groups(d)) * d->kh * d->kw); }

static void sc_conv_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                            const ch_real *w, const ch_real *b, ch_real *y)
{
    regions r = { 0 };
    add(&r, x, conv_x(d, n));
    add(&r, w, conv_w(d));
    add(&r, b, F((size_t)d->oc));
    add(&r, y, conv_y(d, n));
    AROUND(r, ch_cpu_conv2d_forward(kc, d, n, x, w, b, y));
}

static void sc_conv_forward_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                 const ch_real *w, const ch_real *b, uint16_t *y)
{
    regions r = { 0 };
    add(&r, x, conv_x(d, n));
    add(&r, w, conv_w(d));
    add(&r, b, F((size_t)d->oc));
    add(&r, y, sizeof(uint16_t) * (size_t)n * d->oc * d->oh * d->ow);
    AROUND(r, ch_cpu_conv2d_forward_bf16(kc, d, n, x, w, b, y));
}

static void sc_conv_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                  const ch_real *dy, const ch_real *w, ch_real *dx)
{
    regions r = { 0 };
    add(&r, dy, conv_y(d, n));
    add(&r, w, conv_w(d));
    add(&r, dx, conv_x(d, n));
    AROUND(r, ch_cpu_conv2d_backward_data(kc, d, n, dy, w, dx));
}

static void sc_conv_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                     const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                     ch_real *db)
{
    regions r = { 0 };
    add(&r, x, conv_x(d, n));
    if (d->relu) add(&r, y, conv_y(d, n));
    add(&r, dy, conv_y(d, n));
    add(&r, dw, conv_w(d));
    add(&r, db, F((size_t)d->oc));
    AROUND(r, ch_cpu_conv2d_backward_weights(kc, d, n, x, y, dy, dw, db));
}

static size_t pool_x(const ch_pool_desc *d, int n) { return F((size_t)n * d->c * d->h * d->w); }
static size_t pool_y(const ch_pool_desc *d, int n) { return F((size_t)n * d->c * d->oh * d->ow); }
static size_t pool_i(const ch_pool_desc *d, int n) { return sizeof(int32_t) * (size_t)n * d->c * d->oh * d->ow; }

static void sc_maxpool_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                               ch_real *y, int32_t *argmax)
{
    regions r = { 0 };
    add(&r, x, pool_x(d, n));
    add(&r, y, pool_y(d, n));
    add(&r, argmax, pool_i(d, n));
    AROUND(r, ch_cpu_maxpool2d_forward(kc, d, n, x, y, argmax));
}

static void sc_maxpool_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy,
                                const int32_t *argmax, ch_real *dx)
{
    regions r = { 0 };
    add(&r, dy, pool_y(d, n));
    add(&r, argmax, pool_i(d, n));
    add(&r, dx, pool_x(d, n));
    AROUND(r, ch_cpu_maxpool2d_backward(kc, d, n, dy, argmax, dx));
}

static void sc_avgpool_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                               ch_real *y)
{
    regions r = { 0 };
    add(&r, x, pool_x(d, n));
    add(&r, y, pool_y(d, n));
    AROUND(r, ch_cpu_avgpool2d_forward(kc, d, n, x, y));
}

static void sc_avgpool_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy,
                                ch_real *dx)
{
    regions r = { 0 };
    add(&r, dy, pool_y(d, n));
    add(&r, dx, pool_x(d, n));
    AROUND(r, ch_cpu_avgpool2d_backward(kc, d, n, dy, dx));
}

static void sc_bn_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, double *mean,
                        double *var)
{
    regions r = { 0 };
    add(&r, x, F((size_t)n * c * hw));
    AROUND(r, ch_cpu_batchnorm_stats(kc, n, c, hw, x, mean, var));
}

static void sc_bn_stats_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x, double *mean,
                             double *var)
{
    regions r = { 0 };
    add(&r, x, sizeof(uint16_t) * (size_t)n * c * hw);
    AROUND(r, ch_cpu_batchnorm_stats_bf16(kc, n, c, hw, x, mean, var));
}

static void sc_bn_finalize(const ch_kctx *kc, int c, const double *mean, const double *var, double count,
                           double eps, double momentum, const ch_real *gamma, const ch_real *beta,
                           ch_real *running_mean, ch_real *running_var, ch_real *save)
{
    regions r = { 0 };
    add(&r, gamma, F((size_t)c));
    add(&r, beta, F((size_t)c));
    add(&r, running_mean, F((size_t)c));
    add(&r, running_var, F((size_t)c));
    add(&r, save, F((size_t)c * 4));
    AROUND(r, ch_cpu_batchnorm_finalize(kc, c, mean, var, count, eps, momentum, gamma, beta, running_mean,
                                        running_var, save));
}

static void sc_dropout_mask(const ch_kctx *kc, int n, size_t per, uint64_t seed, uint64_t stream, uint64_t step,
                            uint64_t sample0, uint32_t threshold, ch_real keep, ch_real *mask)
{
    regions r = { 0 };
    add(&r, mask, F((size_t)(n > 0 ? n : 0) * per));
    AROUND(r, ch_cpu_dropout_mask(kc, n, per, seed, stream, step, sample0, threshold, keep, mask));
}

static void sc_to_real(const ch_kctx *kc, size_t len, const double *x, ch_real *y)
{
    regions r = { 0 };
    add(&r, y, F(len));
    AROUND(r, ch_cpu_to_real(kc, len, x, y));
}

static void sc_channel_affine_keep_bf16(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                       const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep)
{
    regions r = { 0 };
    add(&r, x, F((size_t)n * c * hw));
    add(&r, scale, F((size_t)c));
    add(&r, shift, F((size_t)c));
    add(&r, y, F((size_t)n * c * hw));
    add(&r, keep, sizeof(uint16_t) * (size_t)n * c * hw);
    AROUND(r, ch_cpu_channel_affine_keep_bf16(kc, n, c, hw, x, scale, shift, y, keep));
}

static void sc_channel_affine_of_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                      const ch_real *scale, const ch_real *shift, ch_real *y)
{
    regions r = { 0 };
    add(&r, x, sizeof(uint16_t) * (size_t)n * c * hw);
    add(&r, scale, F((size_t)c));
    add(&r, shift, F((size_t)c));
    add(&r, y, F((size_t)n * c * hw));
    AROUND(r, ch_cpu_channel_affine_of_bf16(kc, n, c, hw, x, scale, shift, y));
}

static void sc_channel_affine(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                              const ch_real *scale, const ch_real *shift, ch_real *y)
{
    regions r = { 0 };
    add(&r, x, F((size_t)n * c * hw));
    add(&r, scale, F((size_t)c));
    add(&r, shift, F((size_t)c));
    add(&r, y, F((size_t)n * c * hw));
    AROUND(r, ch_cpu_channel_affine(kc, n, c, hw, x, scale, shift, y));
}

static void sc_bn_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                  const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                  double *sum_dy, double *sum_dy_xhat)
{
    regions r = { 0 };
    add(&r, x, F((size_t)n * c * hw));
    add(&r, dy, F((size_t)n * c * hw));
    add(&r, mean, F((size_t)c));
    add(&r, invstd, F((size_t)c));
    AROUND(r, ch_cpu_batchnorm_backward_reduce(kc, n, c, hw, x, dy, mean, invstd, sum_dy, sum_dy_xhat));
}

static void sc_bn_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                const ch_real *gamma, const double *sum_dy,
                                const double *sum_dy_xhat, double count, ch_real *dx)
{
    regions r = { 0 };
    add(&r, x, F((size_t)n * c * hw));
    add(&r, dy, F((size_t)n * c * hw));
    add(&r, mean, F((size_t)c));
    add(&r, invstd, F((size_t)c));
    add(&r, gamma, F((size_t)c));
    add(&r, dx, F((size_t)n * c * hw));
    AROUND(r, ch_cpu_batchnorm_backward_data(kc, n, c, hw, x, dy, mean, invstd, gamma, sum_dy,
                                             sum_dy_xhat, count, dx));
}

static void sc_bn_backward_reduce_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                       const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                       double *sum_dy, double *sum_dy_xhat)
{
    regions r = { 0 };
    add(&r, x, sizeof(uint16_t) * (size_t)n * c * hw);
    add(&r, dy, F((size_t)n * c * hw));
    add(&r, mean, F((size_t)c));
    add(&r, invstd, F((size_t)c));
    AROUND(r, ch_cpu_batchnorm_backward_reduce_bf16(kc, n, c, hw, x, dy, mean, invstd, sum_dy, sum_dy_xhat));
}

static void sc_bn_backward_data_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                     const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                     const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat,
                                     double count, ch_real *dx)
{
    regions r = { 0 };
    add(&r, x, sizeof(uint16_t) * (size_t)n * c * hw);
    add(&r, dy, F((size_t)n * c * hw));
    add(&r, mean, F((size_t)c));
    add(&r, invstd, F((size_t)c));
    add(&r, gamma, F((size_t)c));
    add(&r, dx, F((size_t)n * c * hw));
    AROUND(r, ch_cpu_batchnorm_backward_data_bf16(kc, n, c, hw, x, dy, mean, invstd, gamma, sum_dy, sum_dy_xhat,
                                                  count, dx));
}

static void sc_ln_forward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *gamma,
                          const ch_real *beta, double eps, ch_real *y, ch_real *mean, ch_real *invstd)
{
    regions r = { 0 };
    const size_t all = (size_t)outer * len * inner, groups = (size_t)outer * inner;
    add(&r, x, F(all));
    add(&r, gamma, F((size_t)len));
    add(&r, beta, F((size_t)len));
    add(&r, y, F(all));
    add(&r, mean, F(groups));
    add(&r, invstd, F(groups));
    AROUND(r, ch_cpu_layernorm_forward(kc, outer, len, inner, x, gamma, beta, eps, y, mean, invstd));
}

static void sc_ln_backward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *dy,
                           const ch_real *gamma, const ch_real *mean, const ch_real *invstd, ch_real *dx,
                           ch_real *dgamma, ch_real *dbeta)
{
    regions r = { 0 };
    const size_t all = (size_t)outer * len * inner, groups = (size_t)outer * inner;
    add(&r, x, F(all));
    add(&r, dy, F(all));
    add(&r, gamma, F((size_t)len));
    add(&r, mean, F(groups));
    add(&r, invstd, F(groups));
    if (dx) add(&r, dx, F(all));
    add(&r, dgamma, F((size_t)len));
    add(&r, dbeta, F((size_t)len));
    AROUND(r, ch_cpu_layernorm_backward(kc, outer, len, inner, x, dy, gamma, mean, invstd, dx, dgamma, dbeta));
}

static void sc_relu_forward(const ch_kctx *kc, size_t len, const ch_real *x, ch_real *y)
{
    regions r = { 0 };
    add(&r, x, F(len));
    add(&r, y, F(len));
    AROUND(r, ch_cpu_relu_forward(kc, len, x, y));
}

static void sc_relu_backward(const ch_kctx *kc, size_t len, const ch_real *y, const ch_real *dy,
                             ch_real *dx)
{
    regions r = { 0 };
    add(&r, y, F(len));
    add(&r, dy, F(len));
    add(&r, dx, F(len));
    AROUND(r, ch_cpu_relu_backward(kc, len, y, dy, dx));
}

static void sc_add(const ch_kctx *kc, size_t len, const ch_real *a, const ch_real *b, ch_real *y)
{
    regions r = { 0 };
    add(&r, a, F(len));
    add(&r, b, F(len));
    add(&r, y, F(len));
    AROUND(r, ch_cpu_add(kc, len, a, b, y));
}

static void sc_act_forward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x,
                           ch_real *y)
{
    regions r = { 0 };
    add(&r, x, F(len));
    add(&r, y, F(len));
    AROUND(r, ch_cpu_act_forward(kc, a, len, x, y));
}

static void sc_act_backward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x,
                            const ch_real *y, const ch_real *dy, ch_real *dx)
{
    regions r = { 0 };
    add(&r, x, F(len));
    add(&r, y, F(len));
    add(&r, dy, F(len));
    add(&r, dx, F(len));
    AROUND(r, ch_cpu_act_backward(kc, a, len, x, y, dy, dx));
}

static void sc_upsample_forward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw,
                                const ch_real *x, ch_real *y)
{
    regions r = { 0 };
    const size_t len = (size_t)n * c * h * w;
    add(&r, x, F(len));
    add(&r, y, F(len * sh * sw));
    AROUND(r, ch_cpu_upsample_forward(kc, n, c, h, w, sh, sw, x, y));
}

static void sc_upsample_backward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw,
                                 const ch_real *dy, ch_real *dx)
{
    regions r = { 0 };
    const size_t len = (size_t)n * c * h * w;
    add(&r, dy, F(len * sh * sw));
    add(&r, dx, F(len));
    AROUND(r, ch_cpu_upsample_backward(kc, n, c, h, w, sh, sw, dy, dx));
}

static void sc_bilinear_forward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align,
                                const ch_real *x, ch_real *y)
{
    regions r = { 0 };
    add(&r, x, F((size_t)planes * h * w));
    add(&r, y, F((size_t)planes * oh * ow));
    AROUND(r, ch_cpu_bilinear_forward(kc, planes, h, w, oh, ow, align, x, y));
}

static void sc_bilinear_backward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align,
                                 const ch_real *dy, ch_real *dx)
{
    regions r = { 0 };
    add(&r, dy, F((size_t)planes * oh * ow));
    add(&r, dx, F((size_t)planes * h * w));
    AROUND(r, ch_cpu_bilinear_backward(kc, planes, h, w, oh, ow, align, dy, dx));
}

static size_t vol(const int s[3], int n) { return F((size_t)n * s[0] * s[1] * s[2]); }

static void sc_bcast_forward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                             const ch_real *b, ch_real *y)
{
    regions r = { 0 };
    add(&r, a, vol(d->a, n));
    add(&r, b, vol(d->b, n));
    add(&r, y, vol(d->out, n));
    AROUND(r, ch_cpu_bcast_forward(kc, d, n, a, b, y));
}

static void sc_bcast_backward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                              const ch_real *b, const ch_real *dy, ch_real *da, ch_real *db)
{
    regions r = { 0 };
    add(&r, a, vol(d->a, n));
    add(&r, b, vol(d->b, n));
    add(&r, dy, vol(d->out, n));
    add(&r, da, vol(d->a, n));
    add(&r, db, vol(d->b, n));
    AROUND(r, ch_cpu_bcast_backward(kc, d, n, a, b, dy, da, db));
}

static void sc_copy_rows(const ch_kctx *kc, int rows, size_t len, const ch_real *src,
                         size_t src_stride, ch_real *dst, size_t dst_stride)
{
    regions r = { 0 };
    add(&r, src, span(rows, (int)len, src_stride));
    add(&r, dst, span(rows, (int)len, dst_stride));
    AROUND(r, ch_cpu_copy_rows(kc, rows, len, src, src_stride, dst, dst_stride));
}

static void sc_permute(const ch_kctx *kc, const ch_permute_desc *d, int n, const ch_real *x, ch_real *y)
{
    regions r = { 0 };
    const size_t len = F((size_t)(n > 0 ? n : 0) * d->dims[0] * d->dims[1] * d->dims[2]);
    add(&r, x, len);
    add(&r, y, len);
    AROUND(r, ch_cpu_permute(kc, d, n, x, y));
}

static void sc_col_sum(const ch_kctx *kc, int rows, size_t len, const ch_real *x, ch_real *y)
{
    regions r = { 0 };
    add(&r, x, F((size_t)(rows > 0 ? rows : 0) * len));
    add(&r, y, F(len));
    AROUND(r, ch_cpu_col_sum(kc, rows, len, x, y));
}

static void sc_optim_update(const ch_kctx *kc, const ch_optim_update *u, size_t n, ch_real *p,
                            const ch_real *g, ch_real *s0, ch_real *s1)
{
    regions r = { 0 };
    add(&r, p, F(n));
    add(&r, g, F(n));
    add(&r, s0, F(n));
    add(&r, s1, F(n));
    AROUND(r, ch_cpu_optim_update(kc, u, n, p, g, s0, s1));
}

static void sc_softmax_xent(const ch_kctx *kc, int n, int k, const ch_real *logits,
                            const int32_t *labels, double scale, ch_real *dlogits, double *loss_sum,
                            int64_t *correct)
{
    regions r = { 0 };
    add(&r, logits, F((size_t)n * k));
    add(&r, labels, sizeof(int32_t) * (size_t)n);
    add(&r, dlogits, F((size_t)n * k));
    AROUND(r, ch_cpu_softmax_xent(kc, n, k, logits, labels, scale, dlogits, loss_sum, correct));
}

static void sc_mse(const ch_kctx *kc, size_t len, const ch_real *pred, const ch_real *target,
                   double scale, ch_real *dpred, double *loss_sum)
{
    regions r = { 0 };
    add(&r, pred, F(len));
    add(&r, target, F(len));
    add(&r, dpred, F(len));
    AROUND(r, ch_cpu_mse(kc, len, pred, target, scale, dpred, loss_sum));
}

static const ch_kernels scramble_table = {
    .name = "scramble",
    .gemm = sc_gemm,
    .gemm_bf16_workspace = ch_cpu_gemm_bf16_workspace,
    .gemm_bf16 = sc_gemm_bf16,
    .conv2d_workspace = ch_cpu_conv2d_workspace,
    .conv2d_in_bf16 = ch_cpu_conv2d_in_bf16,
    .conv2d_forward = sc_conv_forward,
    .conv2d_backward_data = sc_conv_backward_data,
    .conv2d_backward_weights = sc_conv_backward_weights,
    .maxpool2d_forward = sc_maxpool_forward,
    .maxpool2d_backward = sc_maxpool_backward,
    .avgpool2d_forward = sc_avgpool_forward,
    .avgpool2d_backward = sc_avgpool_backward,
    .upsample_forward = sc_upsample_forward,
    .upsample_backward = sc_upsample_backward,
    .bilinear_forward = sc_bilinear_forward,
    .bilinear_backward = sc_bilinear_backward,
    .batchnorm_stats = sc_bn_stats,
    .batchnorm_finalize = sc_bn_finalize,
    .channel_affine = sc_channel_affine,
    .batchnorm_backward_reduce = sc_bn_backward_reduce,
    .batchnorm_backward_data = sc_bn_backward_data,
    .layernorm_forward = sc_ln_forward,
    .layernorm_backward = sc_ln_backward,
    .relu_forward = sc_relu_forward,
    .relu_backward = sc_relu_backward,
    .add = sc_add,
    .act_forward = sc_act_forward,
    .act_backward = sc_act_backward,
    .bcast_forward = sc_bcast_forward,
    .bcast_backward = sc_bcast_backward,
    .copy_rows = sc_copy_rows,
    .permute = sc_permute,
    .dropout_mask = sc_dropout_mask,
    .to_real = sc_to_real,
    .channel_affine_keep_bf16 = sc_channel_affine_keep_bf16,
    .channel_affine_of_bf16 = sc_channel_affine_of_bf16,
    .batchnorm_backward_reduce_bf16 = sc_bn_backward_reduce_bf16,
    .batchnorm_backward_data_bf16 = sc_bn_backward_data_bf16,
    .conv2d_out_bf16 = ch_cpu_conv2d_out_bf16,
    .conv2d_forward_bf16 = sc_conv_forward_bf16,
    .batchnorm_stats_bf16 = sc_bn_stats_bf16,
    .col_sum = sc_col_sum,
    .optim_update = sc_optim_update,
    .softmax_xent = sc_softmax_xent,
    .mse = sc_mse,
};

const ch_kernels *ch_kernels_scramble(void) { return &scramble_table; }
