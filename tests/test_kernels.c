/* The CPU backend against the naive reference backend (float), at 1 and 2 threads, over
 * geometries the zoo uses and a few it does not (padding, stride 2, 1x1, odd sizes). */
#define _GNU_SOURCE   /* RTLD_NEXT */
#include "test_util.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include <dnnl.h>
#include <omp.h>

#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/act_body.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"

/* float against double-accumulated loops, relative to each result's scale */
static const double tol = 1e-5;


static void check_gemm(bool ta, bool tb, int m, int n, int k, int threads)
{
    const ch_kernels *cpu = ch_kernels_cpu(), *ref = ch_kernels_ref();
    ch_real *a = tu_uniform((size_t)m * k, 1), *b = tu_uniform((size_t)k * n, 2);
    ch_real *c1 = tu_uniform((size_t)m * n, 3), *c2 = malloc(sizeof(ch_real) * (size_t)m * n);
    memcpy(c2, c1, sizeof(ch_real) * (size_t)m * n);
    ch_kctx kc = { .nthreads = threads };
    const int lda = ta ? m : k, ldb = tb ? k : n;
    cpu->gemm(&kc, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c1, n);
    ref->gemm(&kc, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c2, n);
    assert_true(tu_max_norm_err(c1, c2, (size_t)m * n) < tol);
    free(a), free(b), free(c1), free(c2);
}

static void gemm_matches_reference_for_every_transpose(void **state)
{
    (void)state;
    for (int t = 1; t <= 2; t++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                check_gemm(ta, tb, 17, 23, 31, t);
                check_gemm(ta, tb, 64, 5, 300, t);
            }
}

/* A strided batch of GEMMs (oneDNN's batched matmul where it has a fast kernel, else a loop)
 * against the reference GEMM per matrix, with accumulation on and off; dense operands (the
 * batched kernel) and padded ones (row and matrix strides past the data). */
/* An empty inner dimension (a replica with no sample: dW = dY^T X over 0 rows) is an empty sum:
 * C = beta * C, written even when C held garbage, in both tables. */
static void gemm_with_empty_sum_writes_beta_c(void **state)
{
    (void)state;
    const ch_kernels *ks[2] = { ch_kernels_cpu(), ch_kernels_ref() };
    for (int t = 0; t < 2; t++) {
        ch_kctx kc = { .nthreads = 2 };
        ch_real c[6], a[1] = { 0 }, b[1] = { 0 };
        for (int i = 0; i < 6; i++) c[i] = (ch_real)NAN;
        ks[t]->gemm(&kc, true, false, 2, 3, 0, 1, a, 2, b, 3, 0, c, 3);
        for (int i = 0; i < 6; i++) if (c[i] != 0) fail_msg("%s: C[%d] = %g after k = 0, beta = 0", ks[t]->name, i, c[i]);
        for (int i = 0; i < 6; i++) c[i] = (ch_real)(i + 1);
        ks[t]->gemm(&kc, false, false, 2, 3, 0, 1, a, 1, b, 3, 0.5, c, 3);
        for (int i = 0; i < 6; i++) assert_true(c[i] == (ch_real)(0.5 * (i + 1)));
    }
}

/* g against the reference, through a replica's kernel cache: the scratch query makes its kernel
 * (a float build's one entry more) and the call makes none; then the same call on a ch_kctx
 * without a cache (a kernel made for the call) gives the same bits. */
static void check_gemm_batch(ch_gemm_batch g)
{
    const ch_kernels *ref = ch_kernels_ref();
    const size_t la = g.sa * g.batch, lb = g.sb * g.batch, lc = g.sc * g.batch;
    ch_real *a = tu_uniform(la, 4), *b = tu_uniform(lb, 5), *c1 = tu_uniform(lc, 6);
    ch_real *c2 = malloc(sizeof(ch_real) * lc), *c3 = malloc(sizeof(ch_real) * lc);
    memcpy(c2, c1, sizeof(ch_real) * lc);
    memcpy(c3, c1, sizeof(ch_real) * lc);
    struct ch_kcache *cache = ch_cpu_kcache_create();
    assert_non_null(cache);
    const struct ch_gb_cache *gemms = ch_cpu_kcache_gemms(cache);
    ch_kctx kc = { .nthreads = 1, .cache = cache };
    const size_t before = ch_cpu_gb_cache_entries(gemms);
    const size_t bytes = ch_cpu_gemm_batch_scratch(&kc, &g);
    const size_t planned = ch_cpu_gb_cache_entries(gemms);
#ifndef CH_REAL_DOUBLE
    assert_int_equal(planned, before + 1);
#endif
    void *scratch = malloc(bytes ? bytes : 1);
    assert_non_null(scratch);
    ch_cpu_gemm_batch(&kc, &g, a, b, c1, scratch);
    assert_int_equal(ch_cpu_gb_cache_entries(gemms), planned);
    for (int i = 0; i < g.batch; i++)
        ref->gemm(&kc, g.ta, g.tb, g.m, g.n, g.k, 1, a + g.sa * i, g.lda, b + g.sb * i, g.ldb,
                  g.accumulate ? 1 : 0, c2 + g.sc * i, g.ldc);
    assert_true(tu_max_norm_err(c1, c2, lc) < tol);
    kc.cache = NULL;
    ch_cpu_gemm_batch(&kc, &g, a, b, c3, scratch);
    assert_memory_equal(c1, c3, sizeof(ch_real) * lc);
    ch_cpu_kcache_free(cache);
    free(a), free(b), free(c1), free(c2), free(c3), free(scratch);
}

/* The threads of a team run one cached kernel at once, each on its own stream and handles: 2
 * threads, each its own C and scratch, calling it back to back in one region (as a Winograd's
 * team does), every result with the bits of one thread alone (threads sharing one set of handles
 * would write into each other's C). */
static void gemm_batch_threads_run_at_once(void **state)
{
    (void)state;
    enum { T = 2, ROUNDS = 20000 };
    const int m = 16, n = 32, k = 24;
    const ch_gemm_batch g = { .batch = 3, .m = m, .n = n, .k = k, .lda = k, .ldb = n, .ldc = n,
                              .sa = (size_t)m * k, .sb = (size_t)k * n, .sc = (size_t)m * n };
    const size_t lc = g.sc * g.batch;
    ch_real *a = tu_uniform(g.sa * g.batch, 8), *b = tu_uniform(g.sb * g.batch, 9);
    ch_real *one = malloc(sizeof(ch_real) * lc), *c[T];
    struct ch_kcache *cache = ch_cpu_kcache_create();
    assert_non_null(cache);
    ch_kctx kc = { .nthreads = T, .cache = cache };
    const size_t bytes = ch_cpu_gemm_batch_scratch(&kc, &g);
    void *scratch[T];
    for (int t = 0; t < T; t++) {
        c[t] = malloc(sizeof(ch_real) * lc), scratch[t] = malloc(bytes ? bytes : 1);
        assert_non_null(c[t]), assert_non_null(scratch[t]);
    }
    ch_cpu_gemm_batch(&kc, &g, a, b, one, scratch[0]);
    int wrong = 0;
#pragma omp parallel num_threads(T) reduction(+ : wrong)
    {
        const int t = omp_get_thread_num();
#pragma omp barrier   /* both threads awake before the first call */
        for (int r = 0; r < ROUNDS; r++) {
            for (size_t i = 0; i < lc; i++) c[t][i] = (ch_real)-1;
            ch_cpu_gemm_batch(&kc, &g, a, b, c[t], scratch[t]);
            wrong += memcmp(c[t], one, sizeof(ch_real) * lc) != 0;
        }
    }
    assert_int_equal(wrong, 0);
    ch_cpu_kcache_free(cache);
    for (int t = 0; t < T; t++) free(c[t]), free(scratch[t]);
    free(a), free(b), free(one);
}

static void gemm_batch_matches_reference(void **state)
{
    (void)state;
    for (int pad = 0; pad < 2; pad++)
        for (int acc = 0; acc < 2; acc++) {
            const int m = 20, n = 144, k = 17, ld = n + 16 * pad;
            /* C (m x n) = A (m x k) B (k x n), as Winograd's forward */
            check_gemm_batch((ch_gemm_batch){ .batch = 7, .m = m, .n = n, .k = k, .lda = k,
                                              .ldb = ld, .ldc = ld, .sa = (size_t)m * k,
                                              .sb = (size_t)k * ld + 32 * pad,
                                              .sc = (size_t)m * ld, .accumulate = acc });
            /* C (k x n) = A^T B, A stored m x k: backward data */
            check_gemm_batch((ch_gemm_batch){ .batch = 5, .m = k, .n = n, .k = m, .lda = k,
                                              .ldb = ld, .ldc = ld, .sa = (size_t)m * k,
                                              .sb = (size_t)m * ld, .sc = (size_t)k * ld,
                                              .ta = true, .accumulate = acc });
            /* C (m x k) = A B^T, both stored along n: backward weights */
            check_gemm_batch((ch_gemm_batch){ .batch = 6, .m = m, .n = k, .k = n, .lda = ld,
                                              .ldb = ld, .ldc = k, .sa = (size_t)m * ld,
                                              .sb = (size_t)k * ld, .sc = (size_t)m * k + pad,
                                              .tb = true, .accumulate = acc });
        }
}

/* The CPU backend's three passes against the reference, with the workspace planned for batches of
 * ws_batch: y, dx and db within bound, dw within dw_bound. */
static void check_conv_tol(ch_conv_desc d, int n, int threads, int ws_batch, double bound,
                           double dw_bound)
{
    const int D = ch_conv_dilation(&d);
    d.oh = ch_window_out(d.h, D * (d.kh - 1) + 1, d.stride, d.pad);
    d.ow = ch_window_out(d.w, D * (d.kw - 1) + 1, d.stride, d.pad);
    const ch_kernels *cpu = ch_kernels_cpu(), *ref = ch_kernels_ref();
    const size_t xs = (size_t)n * d.c * d.h * d.w, ys = (size_t)n * d.oc * d.oh * d.ow;
    const size_t ws_len = (size_t)d.oc * (d.c / ch_conv_groups(&d)) * d.kh * d.kw;
    ch_real *x = tu_uniform(xs, 4), *w = tu_uniform(ws_len, 5), *b = tu_uniform((size_t)d.oc, 6);
    /* each backend's (a fused ReLU masks it) */
    ch_real *dy1 = tu_uniform(ys, 7), *dy2 = tu_uniform(ys, 7);
    ch_real *y1 = malloc(sizeof(ch_real) * ys), *y2 = malloc(sizeof(ch_real) * ys);
    ch_real *dx1 = malloc(sizeof(ch_real) * xs), *dx2 = malloc(sizeof(ch_real) * xs);
    ch_real *dw1 = malloc(sizeof(ch_real) * ws_len), *dw2 = malloc(sizeof(ch_real) * ws_len);
    ch_real db1[128], db2[128];
    assert_true(d.oc <= 128);
    /* A replica's kernel cache, as a backend's: the workspace query makes its primitives. */
    ch_kctx kc = { .nthreads = threads, .cache = ch_cpu_kcache_create() };
    assert_non_null(kc.cache);
    size_t wsz = cpu->conv2d_workspace(&kc, &d, ws_batch);
    kc.ws = malloc(sizeof(ch_real) * (wsz ? wsz : 1)), kc.ws_len = wsz;
    ch_kctx rk = { .nthreads = 1 };

    cpu->conv2d_forward(&kc, &d, n, x, w, b, y1);
    ref->conv2d_forward(&rk, &d, n, x, w, b, y2);
    assert_true(tu_max_norm_err(y1, y2, ys) < bound);
    /* Backward weights first: with a fused ReLU it masks dy, which backward data then reads. Both
     * get the same y, so that an output within rounding of 0 cannot mask differently. */
    ref->conv2d_backward_weights(&rk, &d, n, x, y1, dy2, dw2, db2);
    cpu->conv2d_backward_weights(&kc, &d, n, x, y1, dy1, dw1, db1);
    assert_true(tu_max_norm_err(dy1, dy2, ys) == 0);
    assert_true(tu_max_norm_err(dw1, dw2, ws_len) < dw_bound);
    assert_true(tu_max_norm_err(db1, db2, (size_t)d.oc) < bound);
    cpu->conv2d_backward_data(&kc, &d, n, dy1, w, dx1);
    ref->conv2d_backward_data(&rk, &d, n, dy2, w, dx2);
    assert_true(tu_max_norm_err(dx1, dx2, xs) < bound);
    free(x), free(w), free(b), free(dy1), free(dy2), free(y1), free(y2), free(dx1), free(dx2);
    free(dw1), free(dw2), free(kc.ws);
    ch_cpu_kcache_free(kc.cache);
}

static void check_conv(ch_conv_desc d, int n, int threads)
{
    check_conv_tol(d, n, threads, n, tol, tol);
}

static void conv_matches_reference(void **state)
{
    (void)state;
    const ch_conv_desc cases[] = {
        { .c = 1, .h = 28, .w = 28, .oc = 20, .kh = 3, .kw = 3, .stride = 1, .pad = 0 },  /* lenet */
        { .c = 20, .h = 13, .w = 13, .oc = 50, .kh = 5, .kw = 5, .stride = 1, .pad = 0 },
        { .c = 1, .h = 28, .w = 28, .oc = 20, .kh = 5, .kw = 5, .stride = 1, .pad = 2 },  /* mnist-cnn */
        { .c = 8, .h = 9, .w = 9, .oc = 16, .kh = 3, .kw = 3, .stride = 2, .pad = 1 },    /* resnet down */
        { .c = 8, .h = 9, .w = 9, .oc = 16, .kh = 1, .kw = 1, .stride = 2, .pad = 0 },    /* shortcut */
        { .c = 8, .h = 5, .w = 7, .oc = 6, .kh = 1, .kw = 1, .stride = 1, .pad = 0 },     /* pointwise */
        /* pointwise at 2x2 (MobileNetV2's late 1x1 layers): up to 16 samples share a GEMM */
        { .c = 24, .h = 2, .w = 2, .oc = 40, .kh = 1, .kw = 1, .stride = 1, .pad = 0 },
        { .c = 3, .h = 6, .w = 11, .oc = 4, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        /* P = 49 < 64: samples share GEMMs in groups of 6 (n = 9: a full and a partial group) */
        { .c = 4, .h = 7, .w = 7, .oc = 8, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        /* stride-1 im2col rows of 3 and of 37 (two chunks and an overlapping one); mnist-cnn's
         * conv2 shape; and a pad wider than the kernel, which backward data cannot mirror */
        { .c = 2, .h = 5, .w = 5, .oc = 3, .kh = 3, .kw = 3, .stride = 1, .pad = 0 },
        { .c = 3, .h = 20, .w = 37, .oc = 4, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        { .c = 5, .h = 14, .w = 14, .oc = 6, .kh = 5, .kw = 5, .stride = 1, .pad = 2 },
        { .c = 2, .h = 6, .w = 6, .oc = 3, .kh = 3, .kw = 3, .stride = 1, .pad = 3 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int relu = 0; relu < 2; relu++)   /* and with a ReLU fused on the output */
            for (int t = 1; t <= 2; t++)
                for (int n = 1; n <= 9; n += n == 1 ? 2 : 6) {   /* 9: several groups per thread */
                    ch_conv_desc d = cases[i];
                    d.relu = relu;
                    check_conv(d, n, t);
                }
}

/* Depthwise convolutions (cpu_conv_dw.c's direct kernels) against the reference, each case run
 * as given, with the fused ReLU, on 1 and 2 threads, at batches 1, 3 and 9. `lanes`: whether it
 * must take the small planes' channel-lanes path (ch_cpu_conv_dw_lanes), so that a change of that
 * rule cannot leave either path untested. */
static void check_depthwise_cases(const ch_conv_desc *cases, size_t count, bool lanes)
{
    for (size_t i = 0; i < count; i++)
        for (int relu = 0; relu < 2; relu++)
            for (int t = 1; t <= 2; t++)
                for (int n = 1; n <= 9; n += n == 1 ? 2 : 6) {
                    ch_conv_desc d = cases[i];
                    d.oc = d.groups = d.c;
                    d.relu = relu;
                    const int D = ch_conv_dilation(&d);
                    d.oh = ch_window_out(d.h, D * (d.kh - 1) + 1, d.stride, d.pad);
                    d.ow = ch_window_out(d.w, D * (d.kw - 1) + 1, d.stride, d.pad);
                    assert_int_equal(ch_cpu_conv_dw_lanes(&d), lanes);
                    check_conv(d, n, t);
                }
}

/* The wide layout: strides 1 to 3 (one, four and nine input phases), dilation, 1x1 to 7x7 and
 * non-square kernels, padding wider than the kernel, odd widths. */
static void depthwise_matches_reference(void **state)
{
    (void)state;
    const ch_conv_desc cases[] = {
        { .c = 5, .h = 9, .w = 9, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        { .c = 3, .h = 30, .w = 29, .kh = 3, .kw = 3, .stride = 2, .pad = 1 },
        { .c = 3, .h = 12, .w = 12, .kh = 5, .kw = 5, .stride = 1, .pad = 2 },
        { .c = 3, .h = 7, .w = 9, .kh = 3, .kw = 3, .stride = 1, .pad = 2, .dilation = 2 },
        { .c = 2, .h = 32, .w = 31, .kh = 3, .kw = 3, .stride = 2, .pad = 2, .dilation = 2 },
        { .c = 3, .h = 45, .w = 44, .kh = 3, .kw = 3, .stride = 3, .pad = 1 },
        { .c = 2, .h = 10, .w = 10, .kh = 7, .kw = 7, .stride = 1, .pad = 3 },
        { .c = 4, .h = 9, .w = 10, .kh = 1, .kw = 1, .stride = 1, .pad = 0 },
        { .c = 3, .h = 9, .w = 11, .kh = 1, .kw = 3, .stride = 1, .pad = 0 },
        { .c = 2, .h = 5, .w = 5, .kh = 3, .kw = 3, .stride = 1, .pad = 3 },
        { .c = 4, .h = 12, .w = 10, .kh = 3, .kw = 3, .stride = 1, .pad = 0 },
    };
    check_depthwise_cases(cases, sizeof cases / sizeof cases[0], false);
}

/* Small planes, channels in the lanes: blocks of 16 channels with a short last one (20, 37, 17,
 * 18 channels), MobileNetV2's 2x2, 4x4 and 7x7 planes at stride 1 and 2 (7x7 and, strided, 14x14
 * outputs: the rule's bounds), and the wide layout's odd cases at small sizes. */
static void depthwise_small_planes_match_reference(void **state)
{
    (void)state;
    const ch_conv_desc cases[] = {
        { .c = 20, .h = 2, .w = 2, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        { .c = 37, .h = 4, .w = 4, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        { .c = 17, .h = 7, .w = 7, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        { .c = 18, .h = 4, .w = 4, .kh = 3, .kw = 3, .stride = 2, .pad = 1 },
        { .c = 5, .h = 28, .w = 27, .kh = 3, .kw = 3, .stride = 2, .pad = 1 },
        { .c = 6, .h = 9, .w = 8, .kh = 3, .kw = 3, .stride = 2, .pad = 1 },
        { .c = 3, .h = 6, .w = 6, .kh = 5, .kw = 5, .stride = 1, .pad = 2 },
        { .c = 2, .h = 11, .w = 10, .kh = 3, .kw = 3, .stride = 2, .pad = 2, .dilation = 2 },
        { .c = 3, .h = 10, .w = 10, .kh = 3, .kw = 3, .stride = 3, .pad = 1 },
        { .c = 2, .h = 7, .w = 7, .kh = 7, .kw = 7, .stride = 1, .pad = 3 },
        { .c = 4, .h = 5, .w = 6, .kh = 1, .kw = 1, .stride = 1, .pad = 0 },
        { .c = 3, .h = 5, .w = 7, .kh = 1, .kw = 3, .stride = 1, .pad = 0 },
        { .c = 2, .h = 2, .w = 2, .kh = 3, .kw = 3, .stride = 1, .pad = 3 },
        { .c = 4, .h = 6, .w = 5, .kh = 3, .kw = 3, .stride = 1, .pad = 0 },
    };
    check_depthwise_cases(cases, sizeof cases / sizeof cases[0], true);
}

/* The three passes of depthwise layer d at 1 and at 2 threads give the same bits. */
static void check_depthwise_bits(ch_conv_desc d, bool lanes)
{
    d.oh = ch_window_out(d.h, d.kh, d.stride, d.pad), d.ow = ch_window_out(d.w, d.kw, d.stride, d.pad);
    assert_int_equal(ch_cpu_conv_dw_lanes(&d), lanes);
    const ch_kernels *cpu = ch_kernels_cpu();
    const int n = 5;
    const size_t xs = (size_t)n * d.c * d.h * d.w, ys = (size_t)n * d.oc * d.oh * d.ow;
    const size_t wl = (size_t)d.c * d.kh * d.kw, nb = (size_t)d.c;
    ch_real *x = tu_uniform(xs, 4), *w = tu_uniform(wl, 5), *b = tu_uniform(nb, 6);
    ch_real *out[2][3];
    for (int t = 1; t <= 2; t++) {
        ch_kctx kc = { .nthreads = t };
        const size_t wsz = cpu->conv2d_workspace(&kc, &d, n);
        kc.ws = malloc(sizeof(ch_real) * wsz), kc.ws_len = wsz;
        ch_real *y = malloc(sizeof(ch_real) * ys), *dy = tu_uniform(ys, 7);
        ch_real *dx = malloc(sizeof(ch_real) * xs), *dw = malloc(sizeof(ch_real) * (wl + nb));
        cpu->conv2d_forward(&kc, &d, n, x, w, b, y);
        cpu->conv2d_backward_weights(&kc, &d, n, x, y, dy, dw, dw + wl);
        cpu->conv2d_backward_data(&kc, &d, n, dy, w, dx);
        out[t - 1][0] = y, out[t - 1][1] = dx, out[t - 1][2] = dw;
        free(dy), free(kc.ws);
    }
    const size_t len[3] = { ys, xs, wl + nb };
    for (int i = 0; i < 3; i++) {
        assert_memory_equal(out[0][i], out[1][i], sizeof(ch_real) * len[i]);
        free(out[0][i]), free(out[1][i]);
    }
    free(x), free(w), free(b);
}

/* The depthwise kernels split planes (or blocks of 16 channels) and channels, never a sum: their
 * bits are the same at 1 and 2 threads (data parallelism relies on it no more than on any kernel,
 * but it costs nothing): the wide layout at stride 2, and the lanes at 40 channels (three blocks,
 * the last short) on 4x4 planes. */
static void depthwise_bits_do_not_depend_on_threads(void **state)
{
    (void)state;
    check_depthwise_bits((ch_conv_desc){ .c = 6, .h = 30, .w = 30, .oc = 6, .kh = 3, .kw = 3, .stride = 2,
                                         .pad = 1, .groups = 6 }, false);
    check_depthwise_bits((ch_conv_desc){ .c = 40, .h = 4, .w = 4, .oc = 40, .kh = 3, .kw = 3, .stride = 1,
                                         .pad = 1, .groups = 40 }, true);
}

/* Two runs of all three passes give the same bits: the first on a replica's kernel cache, the
 * second on none (a ch_kctx made by hand: the passes make their primitives for the call). */
static void check_conv_repeats(ch_conv_desc d, int n, int threads)
{
    const ch_kernels *cpu = ch_kernels_cpu();
    const size_t xs = (size_t)n * d.c * d.h * d.w, ys = (size_t)n * d.oc * d.oh * d.ow;
    const size_t wl = (size_t)d.oc * d.c * d.kh * d.kw;
    ch_real *x = tu_uniform(xs, 4), *w = tu_uniform(wl, 5), *b = tu_uniform((size_t)d.oc, 6);
    ch_real *out[2][4];
    struct ch_kcache *cache = ch_cpu_kcache_create();
    assert_non_null(cache);
    ch_kctx kc = { .nthreads = threads, .cache = cache };
    size_t wsz = cpu->conv2d_workspace(&kc, &d, n);
    kc.ws = malloc(sizeof(ch_real) * (wsz ? wsz : 1)), kc.ws_len = wsz;
    for (int r = 0; r < 2; r++) {
        kc.cache = r == 0 ? cache : NULL;
        ch_real *y = malloc(sizeof(ch_real) * ys), *dy = tu_uniform(ys, 7);
        ch_real *dx = malloc(sizeof(ch_real) * xs), *dw = malloc(sizeof(ch_real) * (wl + d.oc));
        cpu->conv2d_forward(&kc, &d, n, x, w, b, y);
        cpu->conv2d_backward_weights(&kc, &d, n, x, y, dy, dw, dw + wl);
        cpu->conv2d_backward_data(&kc, &d, n, dy, w, dx);
        out[r][0] = y, out[r][1] = dy, out[r][2] = dx, out[r][3] = dw;
    }
    const size_t len[4] = { ys, ys, xs, wl + d.oc };
    for (int i = 0; i < 4; i++) {
        assert_memory_equal(out[0][i], out[1][i], sizeof(ch_real) * len[i]);
        free(out[0][i]), free(out[1][i]);
    }
    free(x), free(w), free(b), free(kc.ws);
    ch_cpu_kcache_free(cache);
}

/* conv2d_backward (both backward passes in one) against the two passes apart, on a workspace planned
 * for ws_batch: where it is taken, the same bits (dy as masked by a fused ReLU, dx, dw, db); where
 * not, nothing written. At the planned batch it is taken exactly for the layers cohort's own
 * Winograds run (oneDNN's kernels and im2col keep the two passes); with dx over x it declines. */
static void check_backward_together(ch_conv_desc d, int n, int threads, int ws_batch)
{
    const ch_kernels *cpu = ch_kernels_cpu();
    const size_t xs = (size_t)n * d.c * d.h * d.w, ys = (size_t)n * d.oc * d.oh * d.ow;
    const size_t wl = (size_t)d.oc * d.c * d.kh * d.kw, gl = wl + (size_t)d.oc;
    ch_real *x = tu_uniform(xs, 4), *w = tu_uniform(wl, 5), *b = tu_uniform((size_t)d.oc, 6);
    ch_real *dy1 = tu_uniform(ys, 7), *dy2 = tu_uniform(ys, 7), *dy0 = tu_uniform(ys, 7);
    ch_real *y = malloc(sizeof(ch_real) * ys), *x0 = tu_uniform(xs, 4);
    ch_real *dx1 = malloc(sizeof(ch_real) * xs), *dx2 = malloc(sizeof(ch_real) * xs);
    ch_real *g1 = malloc(sizeof(ch_real) * gl), *g2 = malloc(sizeof(ch_real) * gl);
    ch_real *dx0 = malloc(sizeof(ch_real) * xs), *g0 = malloc(sizeof(ch_real) * gl);
    assert_true(y && dx1 && dx2 && g1 && g2 && dx0 && g0);
    /* sentinels: what a declining call must leave as it found */
    memset(dx0, 0x7f, sizeof(ch_real) * xs), memset(g0, 0x7f, sizeof(ch_real) * gl);
    memcpy(dx2, dx0, sizeof(ch_real) * xs), memcpy(g2, g0, sizeof(ch_real) * gl);
    ch_kctx kc = { .nthreads = threads, .cache = ch_cpu_kcache_create() };
    const size_t wsz = cpu->conv2d_workspace(&kc, &d, ws_batch);
    kc.ws = malloc(sizeof(ch_real) * (wsz ? wsz : 1)), kc.ws_len = wsz;
    cpu->conv2d_forward(&kc, &d, n, x, w, b, y);
    cpu->conv2d_backward_weights(&kc, &d, n, x, y, dy1, g1, g1 + wl);
    cpu->conv2d_backward_data(&kc, &d, n, dy1, w, dx1);
    /* dx over x: declined before anything is touched (the fused ReLU's mask included). */
    assert_false(cpu->conv2d_backward(&kc, &d, n, x, y, dy2, w, x, g2, g2 + wl));
    const bool taken = cpu->conv2d_backward(&kc, &d, n, x, y, dy2, w, dx2, g2, g2 + wl);
    const bool ours = (ch_cpu_wino3_applies(&d) || ch_cpu_wino5_applies(&d)) &&
                      !ch_cpu_dnnl_conv_takes(&d, n);
    if (ws_batch == n) assert_true(taken == ours);
    if (taken) {
        assert_memory_equal(dy1, dy2, sizeof(ch_real) * ys);
        assert_memory_equal(dx1, dx2, sizeof(ch_real) * xs);
        assert_memory_equal(g1, g2, sizeof(ch_real) * gl);
    } else {
        assert_memory_equal(dy0, dy2, sizeof(ch_real) * ys);
        assert_memory_equal(dx0, dx2, sizeof(ch_real) * xs);
        assert_memory_equal(g0, g2, sizeof(ch_real) * gl);
    }
    assert_memory_equal(x, x0, sizeof(ch_real) * xs);
    free(x), free(w), free(b), free(dy0), free(dy1), free(dy2), free(y), free(x0);
    free(dx0), free(dx1), free(dx2), free(g0), free(g1), free(g2), free(kc.ws);
    ch_cpu_kcache_free(kc.cache);
}

/* cohort's Winograds' workspace queries in the shape of the callback below (no cache: the GEMMs
 * are made for the call). */
static size_t wino3_taken(const ch_conv_desc *d, int n, int nthreads)
{
    const ch_kctx kc = { .nthreads = nthreads };
    return ch_cpu_wino3_workspace(&kc, d, n);
}

static size_t wino5_taken(const ch_conv_desc *d, int n, int nthreads)
{
    const ch_kctx kc = { .nthreads = nthreads };
    return ch_cpu_wino5_workspace(&kc, d, n);
}

/* oneDNN's Winograd's workspace query in the shape of the others' (no cache: made for the call). */
static size_t dnnl_wino_taken(const ch_conv_desc *d, int n, int nthreads)
{
    const ch_kctx kc = { .nthreads = nthreads };
    return ch_cpu_wino_workspace(&kc, d, n);
}

/* A Winograd's (or oneDNN's direct) path's cases, with and without the fused ReLU, at 1 and 2
 * threads, for batches 1, 3, 9 and up to max_n in steps of 8: against the reference, the same bits
 * twice, and from 9 samples on, the batch on a workspace planned for one sample, which must fall
 * back to im2col where it is short and be right either way. `taken` (if not NULL) is the path's workspace query, which
 * must be non-zero: the path is taken. */
static void check_winograd_cases(const ch_conv_desc *cases, size_t count, int max_n,
                                 double dw_bound, size_t (*taken)(const ch_conv_desc *, int, int))
{
    for (size_t i = 0; i < count; i++)
        for (int relu = 0; relu < 2; relu++)
            for (int t = 1; t <= 2; t++)
                for (int n = 1; n <= max_n; n = n == 1 ? 3 : (n == 3 ? 9 : n + 8)) {
                    ch_conv_desc d = cases[i];
                    d.relu = relu;
                    d.oh = ch_window_out(d.h, d.kh, d.stride, d.pad);
                    d.ow = ch_window_out(d.w, d.kw, d.stride, d.pad);
                    if (taken) assert_true(taken(&d, n, t) > 0);
                    check_conv_tol(d, n, t, n, tol, dw_bound);
                    check_conv_repeats(d, n, t);
                    check_backward_together(d, n, t, n);
                    if (n >= 9) {
                        check_conv_tol(d, n, t, 1, tol, dw_bound);
                        check_backward_together(d, n, t, 1);
                    }
                }
}

/* A replica's oneDNN primitives are made by the workspace query (plan time), once per geometry,
 * batch and thread count, and the passes at that batch make none; another batch makes its own on
 * first use. Where oneDNN has no Winograd kernel (no AVX-512), nothing is kept. */
static void primitives_made_at_plan_time(void **state)
{
    (void)state;
    const bool avx512 = ch_cpu_avx512();
    const ch_kernels *cpu = ch_kernels_cpu();
    ch_conv_desc d = { .c = 16, .h = 6, .w = 6, .oc = 32, .kh = 3, .kw = 3, .stride = 1, .pad = 1,
                       .oh = 6, .ow = 6 };
    ch_kctx kc = { .nthreads = 2, .cache = ch_cpu_kcache_create() };
    assert_non_null(kc.cache);
    const size_t wsz = cpu->conv2d_workspace(&kc, &d, 3);
    assert_true(cpu->conv2d_workspace(&kc, &d, 3) == wsz);   /* asked again: the same entry */
    assert_int_equal(ch_cpu_kcache_entries(kc.cache), avx512 ? 1 : 0);
    kc.ws = malloc(sizeof(ch_real) * wsz), kc.ws_len = wsz;
    ch_real *x = tu_uniform(3 * 16 * 36, 4), *w = tu_uniform(32 * 16 * 9, 5), *dy = tu_uniform(3 * 32 * 36, 6);
    ch_real *y = malloc(sizeof(ch_real) * 3 * 32 * 36), *dx = malloc(sizeof(ch_real) * 3 * 16 * 36);
    ch_real *dw = malloc(sizeof(ch_real) * (32 * 16 * 9 + 32));
    for (int n = 3; n >= 2; n--) {   /* the planned batch, then a smaller one */
        cpu->conv2d_forward(&kc, &d, n, x, w, NULL, y);
        cpu->conv2d_backward_weights(&kc, &d, n, x, y, dy, dw, dw + 32 * 16 * 9);
        cpu->conv2d_backward_data(&kc, &d, n, dy, w, dx);
        assert_int_equal(ch_cpu_kcache_entries(kc.cache), avx512 ? (size_t)(3 - n + 1) : 0);
    }
    free(x), free(w), free(dy), free(y), free(dx), free(dw), free(kc.ws);
    ch_cpu_kcache_free(kc.cache);
}

/* The same for the batched matmuls of cohort's own Winograds (F(4x4, 3x3) at 32@14x14, which it
 * takes on every CPU): the workspace query makes every point-GEMM shape of the three passes (and
 * both at once), and the passes at the planned batch find them all. A float build only: the
 * double build's batches are loops. */
static void gemm_kernels_made_at_plan_time(void **state)
{
    (void)state;
#ifndef CH_REAL_DOUBLE
    const ch_kernels *cpu = ch_kernels_cpu();
    const ch_conv_desc d = { .c = 32, .h = 14, .w = 14, .oc = 32, .kh = 3, .kw = 3, .stride = 1,
                             .pad = 1, .oh = 14, .ow = 14 };
    const int n = 5;
    ch_kctx kc = { .nthreads = 2, .cache = ch_cpu_kcache_create() };
    assert_non_null(kc.cache);
    const struct ch_gb_cache *gemms = ch_cpu_kcache_gemms(kc.cache);
    assert_int_equal(ch_cpu_gb_cache_entries(gemms), 0);
    const size_t wsz = cpu->conv2d_workspace(&kc, &d, n);
    assert_true(wino3_taken(&d, n, 2) > 0);
    const size_t planned = ch_cpu_gb_cache_entries(gemms);
    assert_true(planned > 0);
    kc.ws = malloc(sizeof(ch_real) * wsz), kc.ws_len = wsz;
    const size_t xs = (size_t)n * 32 * 14 * 14, wl = 32 * 32 * 9;
    ch_real *x = tu_uniform(xs, 4), *w = tu_uniform(wl, 5), *dy = tu_uniform(xs, 6);
    ch_real *y = malloc(sizeof(ch_real) * xs), *dx = malloc(sizeof(ch_real) * xs);
    ch_real *dw = malloc(sizeof(ch_real) * (wl + 32));
    cpu->conv2d_forward(&kc, &d, n, x, w, NULL, y);
    cpu->conv2d_backward_weights(&kc, &d, n, x, y, dy, dw, dw + wl);
    cpu->conv2d_backward_data(&kc, &d, n, dy, w, dx);
    assert_true(cpu->conv2d_backward(&kc, &d, n, x, y, dy, w, dx, dw, dw + wl));
    assert_int_equal(ch_cpu_gb_cache_entries(gemms), planned);
    free(x), free(w), free(dy), free(y), free(dx), free(dw), free(kc.ws);
    ch_cpu_kcache_free(kc.cache);
#endif
}

/* Threads started in this process: libgomp starts its own through pthread_create, which this
 * program's definition takes before the C library's (or, under ASan, its interceptor's: RTLD_NEXT). */
static atomic_int threads_started;

int pthread_create(pthread_t *restrict t, const pthread_attr_t *restrict attr, void *(*fn)(void *),
                   void *restrict arg)
{
    static int (*next)(pthread_t *restrict, const pthread_attr_t *restrict, void *(*)(void *), void *restrict);
    if (!next) *(void **)&next = dlsym(RTLD_NEXT, "pthread_create");
    if (!next) return EAGAIN;
    atomic_fetch_add(&threads_started, 1);
    return next(t, attr, fn, arg);
}

/* The three passes and both backward passes at once, twice: the first run warms up (libgomp's
 * pool, the GEMMs' kernels), the second must start no thread. */
static void passes_start_no_threads(const ch_conv_desc *d, int n)
{
    const ch_kernels *cpu = ch_kernels_cpu();
    ch_kctx kc = { .nthreads = 2, .cache = ch_cpu_kcache_create() };
    assert_non_null(kc.cache);
    const size_t wsz = cpu->conv2d_workspace(&kc, d, n);
    kc.ws = malloc(sizeof(ch_real) * (wsz ? wsz : 1)), kc.ws_len = wsz;
    const size_t xs = (size_t)n * d->c * d->h * d->w, ys = (size_t)n * d->oc * d->oh * d->ow;
    const size_t wl = (size_t)d->oc * (d->c / ch_conv_groups(d)) * d->kh * d->kw;
    ch_real *x = tu_uniform(xs, 4), *w = tu_uniform(wl, 5), *dy = tu_uniform(ys, 6);
    ch_real *y = malloc(sizeof(ch_real) * ys), *dx = malloc(sizeof(ch_real) * xs);
    ch_real *dw = malloc(sizeof(ch_real) * (wl + (size_t)d->oc));
    assert_non_null(kc.ws), assert_non_null(y), assert_non_null(dx), assert_non_null(dw);
    int started = 0;
    for (int run = 0; run < 2; run++) {
        const int before = atomic_load(&threads_started);
        cpu->conv2d_forward(&kc, d, n, x, w, dw + wl, y);
        cpu->conv2d_backward_weights(&kc, d, n, x, y, dy, dw, dw + wl);
        cpu->conv2d_backward_data(&kc, d, n, dy, w, dx);
        if (cpu->conv2d_backward) (void)cpu->conv2d_backward(&kc, d, n, x, y, dy, w, dx, dw, dw + wl);
        started = atomic_load(&threads_started) - before;
    }
    if (started != 0)
        print_error("%d@%dx%d -> %d, %dx%d, groups %d, batch %d on 2 threads: %d threads started in the second run\n",
                    d->c, d->h, d->w, d->oc, d->kh, d->kw, ch_conv_groups(d), n, started);
    assert_int_equal(started, 0);
    free(x), free(w), free(dy), free(y), free(dx), free(dw), free(kc.ws);
    ch_cpu_kcache_free(kc.cache);
}

/* A pass whose team is one thread (16 samples: one Winograd group; one sample: im2col's and a
 * grouped layer's) runs on the calling thread with no parallel region around it (cpu.h,
 * ch_cpu_team): inside one, even one of a single thread, the GEMMs' own regions were nested, and
 * libgomp started and joined fresh threads for each, ~1,300 a resnet18 step, which made batch 16
 * 2.5x slower than 17 on 2 threads. Layers as large as resnet18's, where the GEMMs do open regions. */
static void teams_of_one_start_no_threads(void **state)
{
    (void)state;
#ifndef CH_REAL_DOUBLE
    const int icv = omp_get_max_threads();
    omp_set_num_threads(2);   /* what a replica of two threads runs with */
    const ch_conv_desc wino3 = { .c = 64, .h = 28, .w = 28, .oc = 64, .kh = 3, .kw = 3, .stride = 1,
                                 .pad = 1, .oh = 28, .ow = 28 };
    assert_true(wino3_taken(&wino3, 16, 2) > 0);
    passes_start_no_threads(&wino3, 16);
    const ch_conv_desc wino5 = { .c = 32, .h = 14, .w = 14, .oc = 64, .kh = 5, .kw = 5, .stride = 1,
                                 .pad = 2, .oh = 14, .ow = 14 };
    assert_true(ch_cpu_wino5_workspace(&(ch_kctx){ .nthreads = 2 }, &wino5, 16) > 0);
    passes_start_no_threads(&wino5, 16);
    const ch_conv_desc im2col = { .c = 64, .h = 28, .w = 28, .oc = 128, .kh = 1, .kw = 1, .stride = 1,
                                  .pad = 0, .oh = 28, .ow = 28 };
    passes_start_no_threads(&im2col, 1);
    const ch_conv_desc grouped = { .c = 64, .h = 28, .w = 28, .oc = 64, .kh = 3, .kw = 3, .stride = 1,
                                   .pad = 1, .oh = 28, .ow = 28, .groups = 2 };
    passes_start_no_threads(&grouped, 1);
    omp_set_num_threads(icv);
#endif
}

/* Winograd (cpu_wino.c): 3x3, stride 1, pad 1, channels in multiples of 16. Its transforms round
 * more than a direct sum, but within the same bound here (at most 1.2e-6 of each result's scale
 * was seen). Where oneDNN has the kernel (AVX-512) the path must be taken, or this would pass on
 * im2col alone. A workspace planned for one sample makes nine fall back to im2col, which must
 * still be right; and two runs give the same bits. */
static void winograd_matches_reference(void **state)
{
    (void)state;
    const bool avx512 = ch_cpu_avx512();
    const ch_conv_desc cases[] = {
        { .c = 16, .h = 6, .w = 6, .oc = 32, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        { .c = 32, .h = 7, .w = 5, .oc = 16, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        { .c = 16, .h = 4, .w = 4, .oc = 16, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
    };
    check_winograd_cases(cases, sizeof cases / sizeof cases[0], 9, tol,
                         avx512 ? dnnl_wino_taken : NULL);
    const ch_conv_desc other = { .c = 16, .h = 6, .w = 6, .oc = 20, .kh = 3, .kw = 3, .stride = 1,
                                 .pad = 1, .oh = 6, .ow = 6 };
    assert_true(dnnl_wino_taken(&other, 4, 1) == 0);   /* 20 channels: im2col */
    const ch_conv_desc small = { .c = 16, .h = 2, .w = 2, .oc = 16, .kh = 3, .kw = 3, .stride = 1,
                                 .pad = 1, .oh = 2, .ow = 2 };
    assert_true(dnnl_wino_taken(&small, 4, 1) == 0);   /* 2x2: no fewer multiplies */
    /* 14x14 with 32 channels: cohort's own F(4x4, 3x3) is the faster there, and takes it. */
    const ch_conv_desc own = { .c = 32, .h = 14, .w = 14, .oc = 32, .kh = 3, .kw = 3, .stride = 1,
                               .pad = 1, .oh = 14, .ow = 14 };
    assert_true(dnnl_wino_taken(&own, 4, 1) == 0 && wino3_taken(&own, 4, 1) > 0);
}

/* oneDNN's fp32 direct convolution's workspace query (cpu_dnnl_conv.c), in the shape of the others'. */
static size_t dnnl_direct_taken(const ch_conv_desc *d, int n, int nthreads)
{
    const ch_kctx kc = { .nthreads = nthreads };
    return ch_cpu_conv_direct_workspace(&kc, d, n);
}

/* Which of the direct convolution's passes run d at batch 3 (1 each, 0 where they decline): the
 * calls themselves, on a workspace planned for them. */
static void direct_passes(ch_conv_desc d, int taken[3])
{
    d.oh = ch_window_out(d.h, d.kh, d.stride, d.pad), d.ow = ch_window_out(d.w, d.kw, d.stride, d.pad);
    const int n = 3;
    const size_t xs = (size_t)n * d.c * d.h * d.w, ys = (size_t)n * d.oc * d.oh * d.ow;
    const size_t wl = (size_t)d.oc * d.c * 9;
    ch_kctx kc = { .nthreads = 1 };
    const size_t wsz = ch_cpu_conv_direct_workspace(&kc, &d, n);
    kc.ws = malloc(sizeof(ch_real) * (wsz ? wsz : 1)), kc.ws_len = wsz;
    ch_real *x = tu_uniform(xs, 4), *w = tu_uniform(wl, 5), *dy = tu_uniform(ys, 6);
    ch_real *y = malloc(sizeof(ch_real) * ys), *dx = malloc(sizeof(ch_real) * xs);
    ch_real *dw = malloc(sizeof(ch_real) * (wl + (size_t)d.oc));
    assert_true(kc.ws && y && dx && dw);
    taken[0] = ch_cpu_conv_direct_forward(&kc, &d, n, x, w, NULL, y);
    taken[1] = ch_cpu_conv_direct_backward_weights(&kc, &d, n, x, y, dy, dw, dw + wl);
    taken[2] = ch_cpu_conv_direct_backward_data(&kc, &d, n, dy, w, dx);
    free(x), free(w), free(dy), free(y), free(dx), free(dw), free(kc.ws);
}

/* 3x3 stride-2 layers of 16 channels or more run oneDNN's fp32 direct convolution on AVX-512 (its
 * forward and backward data always, its weight gradient where the output plane is 7x7 or more),
 * within the reference's bound through the conv2d kernels (an odd width, whose last window reaches
 * less than the padding; a fused ReLU; a workspace planned for one sample falling back to
 * im2col); each pass is taken, or declines, as that rule says; other layers keep their kernels. */
static void direct_stride2_matches_reference(void **state)
{
    (void)state;
    const bool avx512 = ch_cpu_avx512();
    const ch_conv_desc cases[] = {
        { .c = 16, .h = 14, .w = 13, .oc = 24, .kh = 3, .kw = 3, .stride = 2, .pad = 1 },   /* 7x7 out */
        { .c = 24, .h = 9, .w = 9, .oc = 16, .kh = 3, .kw = 3, .stride = 2, .pad = 1 },     /* 5x5 out */
    };
    check_winograd_cases(cases, sizeof cases / sizeof cases[0], 9, tol,
                         avx512 ? dnnl_direct_taken : NULL);
    /* The planner's workspace holds the direct passes' (short, they would decline to im2col). */
    const ch_conv_desc big = { .c = 64, .h = 28, .w = 28, .oc = 128, .kh = 3, .kw = 3, .stride = 2, .pad = 1,
                               .oh = 14, .ow = 14 };
    const ch_kctx one = { .nthreads = 1 };
    assert_true(ch_cpu_conv2d_workspace(&one, &big, 8) >= dnnl_direct_taken(&big, 8, 1));
    assert_true(dnnl_direct_taken(&big, 8, 1) > 0 || !avx512);
    int taken[3];
    direct_passes(cases[0], taken);
    assert_true(taken[0] == avx512 && taken[1] == avx512 && taken[2] == avx512);
    direct_passes(cases[1], taken);   /* the weight gradient of a 5x5 plane: im2col's */
    assert_true(taken[0] == avx512 && !taken[1] && taken[2] == avx512);
    const ch_conv_desc base = cases[0];
    ch_conv_desc d = base;
    d.c = 15;   /* too few channels in */
    direct_passes(d, taken);
    assert_true(!taken[0] && !taken[1] && !taken[2]);
    d = base, d.oc = 8;   /* too few out */
    direct_passes(d, taken);
    assert_true(!taken[0]);
    d = base, d.stride = 1;   /* stride 1: a Winograd's */
    direct_passes(d, taken);
    assert_true(!taken[0] && !taken[1] && !taken[2]);
    d = base, d.kh = d.kw = 1, d.pad = 0;   /* 1x1 stride 2 */
    direct_passes(d, taken);
    assert_true(!taken[0]);
    d = base, d.groups = 2;   /* grouped: cpu_conv_group.c */
    assert_true(dnnl_direct_taken(&d, 3, 1) == 0);
}

/* --precision bf16's convolutions get their operands through oneDNN's fp32 -> bf16 reorder
 * (cpu_dnnl_conv.c; test_bf16 runs them where bf16 is native). On every CPU: the reorder rounds as
 * core/bf16.h's plain C does (to nearest, ties to even), bit for bit: ties both ways, the values
 * next to them, the largest floats (to infinity), zeros of both signs, infinities, and 4096
 * uniform values over many magnitudes; a NaN stays a NaN. A subnormal may also become a zero of
 * its sign: the native instruction treats subnormal inputs as zero (below 1.2e-38, far below any
 * weight or activation that matters). */
static void bf16_reorder_rounds_as_plain_c(void **state)
{
    (void)state;
    enum { N = 4096 + 16 };
    float *x = malloc(sizeof(float) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    assert_true(x && h);
    const uint32_t bits[] = { 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f817fffu, 0x00000001u,
                              0x00018000u, 0x807f8000u, 0x7f7fffffu, 0xff7f8000u, 0x7f7f7fffu,
                              0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                              0x7f800001u };
    for (int i = 0; i < 16; i++) memcpy(&x[i], &bits[i], sizeof(float));
    ch_rng r;
    ch_rng_init(&r, 21, 0, 0);
    for (int i = 16; i < N; i++)
        x[i] = (float)((ch_rng_uniform(&r) - 0.5) * ldexp(1.0, (int)(ch_rng_uniform(&r) * 80) - 40));
    dnnl_engine_t eng = NULL;
    dnnl_stream_t s = NULL;
    dnnl_memory_desc_t from, to;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    dnnl_memory_t mf = NULL, mt = NULL;
    const dnnl_dims_t dims = { N };
    assert_true(dnnl_engine_create(&eng, dnnl_cpu, 0) == dnnl_success &&
                dnnl_stream_create(&s, eng, dnnl_stream_default_flags) == dnnl_success &&
                dnnl_memory_desc_init_by_tag(&from, 1, dims, dnnl_f32, dnnl_x) == dnnl_success &&
                dnnl_memory_desc_init_by_tag(&to, 1, dims, dnnl_bf16, dnnl_x) == dnnl_success &&
                dnnl_reorder_primitive_desc_create(&pd, &from, eng, &to, eng, NULL) == dnnl_success &&
                dnnl_primitive_create(&p, pd) == dnnl_success &&
                dnnl_memory_create(&mf, &from, eng, x) == dnnl_success &&
                dnnl_memory_create(&mt, &to, eng, h) == dnnl_success);
    dnnl_exec_arg_t args[] = { { DNNL_ARG_FROM, mf }, { DNNL_ARG_TO, mt } };
    assert_true(dnnl_primitive_execute(p, s, 2, args) == dnnl_success && dnnl_stream_wait(s) == dnnl_success);
    for (int i = 0; i < N; i++) {
        const uint16_t want = ch_bf16_from_float(x[i]);
        if (isnan(x[i]))
            assert_true(isnan(ch_bf16_to_float(h[i])) && isnan(ch_bf16_to_float(want)));
        else if (fpclassify(x[i]) == FP_SUBNORMAL && h[i] == (signbit(x[i]) ? 0x8000u : 0u))
            continue;   /* native bf16's conversion (vcvtneps2bf16) flushes subnormals to zero */
        else if (h[i] != want)
            fail_msg("value %d (%a): oneDNN 0x%04x, plain C 0x%04x", i, (double)x[i], h[i], want);
    }
    dnnl_memory_destroy(mf), dnnl_memory_destroy(mt), dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd), dnnl_stream_destroy(s), dnnl_engine_destroy(eng);
    free(x), free(h);
}

/* --precision bf16's kept BatchNorm inputs (graph/exec.c) go through four kernels. At 2 threads,
 * over 3 x 7 planes of 197 values: channel_affine_keep_bf16 writes channel_affine's y and rounds
 * every input as core/bf16.h's plain C does (ties to even both ways, the largest floats to
 * infinity, a NaN to the quiet pattern, subnormals too: no flush here); channel_affine_of_bf16 of
 * those, and BatchNorm's two backward kernels of them, give what the fp32 kernels give for the
 * rounded values widened, bit for bit (sums in the same order, on finite values). */
static void bf16_storage_kernels_match_plain_c(void **state)
{
    (void)state;
    enum { B = 3, C = 7, HW = 197, N = B * C * HW };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *back = malloc(sizeof(float) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    assert_true(x && y && back && h);
    const struct { uint32_t in; uint16_t out; } fixed[] = {
        { 0x3f808000u, 0x3f80u }, { 0x3f818000u, 0x3f82u }, { 0x3f808001u, 0x3f81u }, { 0x3f817fffu, 0x3f81u },
        { 0x00000001u, 0x0000u }, { 0x00018000u, 0x0002u }, { 0x807f8000u, 0x8080u }, { 0x7f7fffffu, 0x7f80u },
        { 0xff7f8000u, 0xff80u }, { 0x7f7f7fffu, 0x7f7fu }, { 0x80000000u, 0x8000u }, { 0xff800000u, 0xff80u },
        { 0x7f800001u, 0x7fc0u }, { 0xffc00001u, 0xffc0u },
    };
    const int nf = (int)(sizeof fixed / sizeof fixed[0]);
    for (int i = 0; i < nf; i++) memcpy(&x[i], &fixed[i].in, sizeof(float));
    ch_rng r;
    ch_rng_init(&r, 23, 0, 0);
    for (int i = nf; i < N; i++)
        x[i] = (float)((ch_rng_uniform(&r) - 0.5) * ldexp(1.0, (int)(ch_rng_uniform(&r) * 80) - 40));
    float scale[C], shift[C];
    for (int c = 0; c < C; c++) scale[c] = 0.75f + 0.125f * (float)c, shift[c] = -0.5f + 0.25f * (float)c;
    memset(h, 0xa5, sizeof(uint16_t) * N);
    memset(back, 0xa5, sizeof(float) * N);
    const ch_kctx two = { .nthreads = 2 };
    const ch_kernels *k = ch_kernels_cpu();
    k->channel_affine_keep_bf16(&two, B, C, HW, x, scale, shift, y, h);
    for (int i = 0; i < nf; i++)
        if (h[i] != fixed[i].out) fail_msg("fixed value %d (0x%08x): 0x%04x, expected 0x%04x", i, fixed[i].in, h[i], fixed[i].out);
    for (int i = 0; i < N; i++) {
        const int c = i / HW % C;
        const float want = x[i] * scale[c] + shift[c];
        if (h[i] != ch_bf16_from_float(x[i]))
            fail_msg("value %d (%a): kernel 0x%04x, plain C 0x%04x", i, (double)x[i], h[i], ch_bf16_from_float(x[i]));
        if (memcmp(&y[i], &want, sizeof want) != 0) fail_msg("y %d: %a, expected %a", i, (double)y[i], (double)want);
    }
    k->channel_affine_of_bf16(&two, B, C, HW, h, scale, shift, y);
    for (int i = 0; i < N; i++) {
        const int c = i / HW % C;
        const float want = ch_bf16_to_float(h[i]) * scale[c] + shift[c];
        if (memcmp(&y[i], &want, sizeof want) != 0) fail_msg("y of bf16 %d: %a, expected %a", i, (double)y[i], (double)want);
    }
    /* Backward, on finite inputs (the fixed values' infinities and NaNs would make every sum NaN). */
    for (int i = 0; i < nf; i++) h[i] = ch_bf16_from_float(0.25f * (float)i - 1.0f);
    for (int i = 0; i < N; i++) back[i] = ch_bf16_to_float(h[i]);   /* the rounded values widened */
    float *dy = tu_uniform(N, 24), *dx = malloc(sizeof(float) * N), *dxh = malloc(sizeof(float) * N);
    float mean[C], invstd[C];
    double s1[C], s2[C], h1[C], h2[C];
    assert_true(dy && dx && dxh);
    for (int c = 0; c < C; c++) mean[c] = 0.01f * (float)c, invstd[c] = 1.5f - 0.1f * (float)c;
    k->batchnorm_backward_reduce(&two, B, C, HW, back, dy, mean, invstd, s1, s2);
    k->batchnorm_backward_reduce_bf16(&two, B, C, HW, h, dy, mean, invstd, h1, h2);
    assert_memory_equal(s1, h1, sizeof s1);
    assert_memory_equal(s2, h2, sizeof s2);
    k->batchnorm_backward_data(&two, B, C, HW, back, dy, mean, invstd, scale, s1, s2, 0.7 * N / C, dx);
    k->batchnorm_backward_data_bf16(&two, B, C, HW, h, dy, mean, invstd, scale, h1, h2, 0.7 * N / C, dxh);
    assert_memory_equal(dx, dxh, sizeof(float) * N);
    for (int i = 0; i < N; i++) assert_true(isfinite(dx[i]));
    free(x), free(y), free(back), free(h), free(dy), free(dx), free(dxh);
}

/* BatchNorm's passes on planes of fewer than 16 values (cpu_norm.c: a thread's samples, a block of
 * channels at a time with the constants spread per value) against plain C per value, bit for bit:
 * planes of 1, 4 and 9 values, 130 channels (past a block at 4 and at 9 values), 3 samples at 2
 * threads. The fused passes' other tests compare them with the separate kernels, which share
 * these paths; here the reference is the arithmetic itself. */
static void small_plane_batchnorm_matches_plain_c(void **state)
{
    (void)state;
    enum { B = 3, C = 130 };
    const ch_kernels *k = ch_kernels_cpu();
    const ch_kctx two = { .nthreads = 2 };
    const int hws[] = { 1, 4, 9 };
    float scale[C], shift[C], mean[C], invstd[C], gamma[C];
    double s1[C], s2[C];
    for (int c = 0; c < C; c++) {
        scale[c] = 0.75f + 0.003f * (float)c, shift[c] = -0.3f + 0.005f * (float)c;
        mean[c] = 0.01f * (float)(c % 17), invstd[c] = 1.5f - 0.004f * (float)c, gamma[c] = 0.5f + 0.002f * (float)c;
        s1[c] = 0.1 * (c % 7) - 0.3, s2[c] = 0.05 * (c % 11) - 0.2;
    }
    for (size_t t = 0; t < sizeof hws / sizeof hws[0]; t++) {
        const int hw = hws[t], n = B * C * hw;
        const double count = 0.7 * B * hw;
        float *x = tu_uniform((size_t)n, 51 + (int)t), *dy = tu_uniform((size_t)n, 61 + (int)t);
        float *y = malloc(sizeof(float) * n), *yr = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
        float *dxr = malloc(sizeof(float) * n);
        uint16_t *h = malloc(sizeof(uint16_t) * n);
        assert_true(x && dy && y && yr && dx && dxr && h);
        k->channel_affine_keep_bf16(&two, B, C, hw, x, scale, shift, y, h);
        k->bn_relu_forward(&two, B, C, hw, x, NULL, scale, shift, yr, NULL);
        for (int i = 0; i < n; i++) {
            const int c = i / hw % C;
            const float v = x[i] * scale[c] + shift[c], r = v < 0 ? 0 : v;
            if (memcmp(&y[i], &v, sizeof v) != 0 || h[i] != ch_bf16_from_float(x[i]))
                fail_msg("hw %d, affine at %d: %a (0x%04x), expected %a", hw, i, (double)y[i], h[i], (double)v);
            if (memcmp(&yr[i], &r, sizeof r) != 0) fail_msg("hw %d, BN + ReLU at %d: %a, expected %a", hw, i, (double)yr[i], (double)r);
        }
        k->channel_affine_of_bf16(&two, B, C, hw, h, scale, shift, y);
        k->batchnorm_backward_data(&two, B, C, hw, x, dy, mean, invstd, gamma, s1, s2, count, dx);
        k->bn_relu_backward_data(&two, B, C, hw, x, NULL, dy, mean, invstd, gamma, scale, shift, s1, s2, count, dxr);
        for (int i = 0; i < n; i++) {
            const int c = i / hw % C;
            const float v = ch_bf16_to_float(h[i]) * scale[c] + shift[c], is = invstd[c], g = gamma[c] * is;
            const float mdy = (float)(s1[c] / count), mdx = (float)(s2[c] / count);
            const float d = g * (dy[i] - mdy - (x[i] - mean[c]) * is * mdx);
            const float gated = x[i] * scale[c] + shift[c] > 0 ? dy[i] : 0;
            const float dr = g * (gated - mdy - (x[i] - mean[c]) * is * mdx);
            if (memcmp(&y[i], &v, sizeof v) != 0) fail_msg("hw %d, affine of bf16 at %d: %a, expected %a", hw, i, (double)y[i], (double)v);
            if (memcmp(&dx[i], &d, sizeof d) != 0) fail_msg("hw %d, backward data at %d: %a, expected %a", hw, i, (double)dx[i], (double)d);
            if (memcmp(&dxr[i], &dr, sizeof dr) != 0) fail_msg("hw %d, BN + ReLU backward data at %d: %a, expected %a", hw, i, (double)dxr[i], (double)dr);
        }
        free(x), free(dy), free(y), free(yr), free(dx), free(dxr), free(h);
    }
}

/* A BatchNorm with the ReLU after it fused (kernels.h, bn_relu_*; graph/exec.c) gives the bits of
 * the separate kernels: forward of fp32, of fp32 keeping bf16, and of bf16 inputs against
 * channel_affine's three forms and relu_forward; backward against relu_backward of forward's y,
 * then BatchNorm's two backward kernels, in fp32 and bf16, and with dx written over x and over dy.
 * 2 threads over 3 x 7 planes of 197 values (lanes and a tail). Fixtures: in channel 1 every 5th
 * value's pre-ReLU value is exactly 0 (x = 1/2, shift = -scale/2: masked, as y > 0 masks it), in
 * channel 0 some are -0 (x = -0, shift -0); forward also has NaN and infinities (NaN passes). */
/* x: the values in fp32 (xh's widened where xh is not NULL, and the fused kernels read xh). */
static void bn_relu_case(const ch_kernels *k, const ch_kctx *kc, const float *x, const uint16_t *xh, const float *dy,
                         const float *mean, const float *invstd, const float *gamma, const float *scale,
                         const float *shift, int n, int c, int hw)
{
    const size_t len = (size_t)n * c * hw;
    const double count = 0.7 * (double)len / c;
    float *y = malloc(sizeof(float) * len), *dr = malloc(sizeof(float) * len), *want = malloc(sizeof(float) * len);
    float *got = malloc(sizeof(float) * len), *xw = malloc(sizeof(float) * len);
    double *s1 = calloc(2 * (size_t)c, sizeof(double)), *s2 = calloc(2 * (size_t)c, sizeof(double));
    assert_true(y && dr && want && got && xw && s1 && s2);
    /* Apart: y, dy masked by y, the sums and dx of the masked dy. */
    if (xh) k->channel_affine_of_bf16(kc, n, c, hw, xh, scale, shift, y);
    else k->channel_affine(kc, n, c, hw, x, scale, shift, y);
    k->relu_forward(kc, len, y, y);
    k->relu_backward(kc, len, y, dy, dr);
    memcpy(xw, x, sizeof(float) * len);
    k->batchnorm_backward_reduce(kc, n, c, hw, xw, dr, mean, invstd, s1, s1 + c);
    k->batchnorm_backward_data(kc, n, c, hw, xw, dr, mean, invstd, gamma, s1, s1 + c, count, want);
    /* Fused. */
    k->bn_relu_forward(kc, n, c, hw, xh ? NULL : x, xh, scale, shift, got, NULL);
    assert_memory_equal(got, y, sizeof(float) * len);
    k->bn_relu_backward_reduce(kc, n, c, hw, xh ? NULL : x, xh, dy, mean, invstd, scale, shift, s2, s2 + c);
    assert_memory_equal(s1, s2, sizeof(double) * 2 * (size_t)c);
    k->bn_relu_backward_data(kc, n, c, hw, xh ? NULL : x, xh, dy, mean, invstd, gamma, scale, shift, s2, s2 + c,
                             count, got);
    assert_memory_equal(got, want, sizeof(float) * len);
    /* dx over dy, and (fp32) over x. */
    memcpy(got, dy, sizeof(float) * len);
    k->bn_relu_backward_data(kc, n, c, hw, xh ? NULL : x, xh, got, mean, invstd, gamma, scale, shift, s2, s2 + c,
                             count, got);
    assert_memory_equal(got, want, sizeof(float) * len);
    if (!xh) {
        k->bn_relu_backward_data(kc, n, c, hw, xw, NULL, dy, mean, invstd, gamma, scale, shift, s2, s2 + c, count, xw);
        assert_memory_equal(xw, want, sizeof(float) * len);
    }
    free(y), free(dr), free(want), free(got), free(xw), free(s1), free(s2);
}

static void bn_relu_kernels_give_the_separate_kernels_bits(void **state)
{
    (void)state;
    enum { B = 3, C = 7, HW = 197, N = B * C * HW };
    const ch_kernels *k = ch_kernels_cpu();
    const ch_kctx two = { .nthreads = 2 };
    float *x = tu_uniform(N, 31), *dy = tu_uniform(N, 32), *y = malloc(sizeof(float) * N);
    float *want = malloc(sizeof(float) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N), *hw = malloc(sizeof(uint16_t) * N);
    assert_true(x && dy && y && want && h && hw);
    float scale[C], shift[C], mean[C], invstd[C], gamma[C];
    for (int c = 0; c < C; c++) {
        scale[c] = 0.75f + 0.125f * (float)c, shift[c] = -0.3f + 0.1f * (float)c;
        mean[c] = 0.01f * (float)c, invstd[c] = 1.5f - 0.1f * (float)c, gamma[c] = 0.5f + 0.25f * (float)c;
    }
    shift[0] = -0.0f, shift[1] = -0.5f * scale[1];
    int zeros = 0;
    for (int s = 0; s < B; s++)
        for (int j = 0; j < HW; j += 5) {
            x[((size_t)s * C + 1) * HW + j] = 0.5f, zeros++;
            x[((size_t)s * C) * HW + j] = -0.0f;
        }
    assert_true(0.5f * scale[1] + shift[1] == 0 && zeros > 100);
    for (int i = 0; i < N; i++) h[i] = ch_bf16_from_float(x[i]), y[i] = ch_bf16_to_float(h[i]);
    bn_relu_case(k, &two, x, NULL, dy, mean, invstd, gamma, scale, shift, B, C, HW);
    bn_relu_case(k, &two, y, h, dy, mean, invstd, gamma, scale, shift, B, C, HW);
    /* Forward with non-finite inputs, and keeping bf16. */
    x[3] = NAN, x[HW + 4] = INFINITY, x[2 * HW + 5] = -INFINITY, x[6] = -NAN;
    k->channel_affine_keep_bf16(&two, B, C, HW, x, scale, shift, want, hw);
    k->relu_forward(&two, N, want, want);
    k->bn_relu_forward(&two, B, C, HW, x, NULL, scale, shift, y, h);
    assert_memory_equal(y, want, sizeof(float) * N);
    assert_memory_equal(h, hw, sizeof(uint16_t) * N);
    assert_true(isnan(y[3]) && isnan(y[6]) && y[2 * HW + 5] == 0);
    free(x), free(dy), free(y), free(want), free(h), free(hw);
}

/* A BatchNorm with the same-shaped sum over its output, and the ReLU over that, in one pass
 * (kernels.h, bn_add_forward; graph/exec.c) gives the bits of channel_affine (of fp32, keeping bf16,
 * of bf16), add and relu_forward apart, with and without the ReLU, where the residual is either
 * operand of add; where the normalised value and the residual are both NaN, a NaN (which one C
 * leaves to the compiler). 2 threads over 3 x 7 planes of 197. Fixtures: in channel 1 every 5th
 * sum is exactly 0 (the residual is minus the normalised value), in channel 0 some are -0 + -0;
 * NaNs of both signs in x and in the residual, one place where both are, and infinities. */
static void bn_add_case(const ch_kernels *k, const ch_kctx *kc, const float *x, const uint16_t *xh, const float *res,
                        const float *scale, const float *shift, bool res_first, bool relu, int n, int c, int hw)
{
    const size_t len = (size_t)n * c * hw;
    float *want = malloc(sizeof(float) * len), *got = malloc(sizeof(float) * len);
    uint16_t *kw = malloc(sizeof(uint16_t) * len), *kg = malloc(sizeof(uint16_t) * len);
    assert_true(want && got && kw && kg);
    if (xh) k->channel_affine_of_bf16(kc, n, c, hw, xh, scale, shift, want);
    else k->channel_affine_keep_bf16(kc, n, c, hw, x, scale, shift, want, kw);
    int both_nan = 0;
    for (size_t i = 0; i < len; i++) both_nan += isnan(want[i]) && isnan(res[i]);
    if (res_first) k->add(kc, len, res, want, want);
    else k->add(kc, len, want, res, want);
    if (relu) k->relu_forward(kc, len, want, want);
    memset(kg, 0xff, sizeof(uint16_t) * len);
    k->bn_add_forward(kc, n, c, hw, xh ? NULL : x, xh, scale, shift, res, relu, got, xh ? NULL : kg);
    for (size_t i = 0; i < len; i++) {
        const bool nans = isnan(got[i]) && isnan(want[i]);
        if (!nans && memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("bn_add_forward (%s input, residual %s, %s) at %zu: %a against %a apart", xh ? "bf16" : "fp32",
                     res_first ? "first" : "second", relu ? "ReLU" : "no ReLU", i, (double)got[i], (double)want[i]);
    }
    assert_int_equal(both_nan, 1);
    if (!xh) assert_memory_equal(kg, kw, sizeof(uint16_t) * len);
    free(want), free(got), free(kw), free(kg);
}

static void bn_add_kernel_gives_the_separate_kernels_bits(void **state)
{
    (void)state;
    enum { B = 3, C = 7, HW = 197, N = B * C * HW };
    const ch_kernels *k = ch_kernels_cpu();
    const ch_kctx two = { .nthreads = 2 };
    float *x = tu_uniform(N, 41), *res = tu_uniform(N, 42), *xw = malloc(sizeof(float) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    assert_true(x && res && xw && h);
    float scale[C], shift[C];
    for (int c = 0; c < C; c++) scale[c] = 0.75f + 0.125f * (float)c, shift[c] = -0.3f + 0.1f * (float)c;
    shift[0] = -0.0f;
    x[3] = NAN, res[3] = -NAN, x[9] = -NAN, res[HW + 7] = NAN, x[2 * HW + 5] = INFINITY, res[2 * HW + 6] = -INFINITY;
    for (int i = 0; i < N; i++) h[i] = ch_bf16_from_float(x[i]), xw[i] = ch_bf16_to_float(h[i]);
    int zeros = 0;
    for (int s = 0; s < B; s++)
        for (int j = 0; j < HW; j += 5) {
            const size_t at = ((size_t)s * C + 1) * HW + j;
            res[at] = -(xw[at] * scale[1] + shift[1]), zeros++;   /* exact for x and its bf16 */
            x[at] = xw[at];
            x[((size_t)s * C) * HW + j] = xw[((size_t)s * C) * HW + j] = -0.0f;
            res[((size_t)s * C) * HW + j] = -0.0f, h[((size_t)s * C) * HW + j] = 0x8000;
        }
    assert_true(x[HW + 5] * scale[1] + shift[1] + res[HW + 5] == 0 && zeros > 100);
    for (int rf = 0; rf < 2; rf++)
        for (int relu = 0; relu < 2; relu++) {
            bn_add_case(k, &two, x, NULL, res, scale, shift, rf, relu, B, C, HW);
            bn_add_case(k, &two, xw, h, res, scale, shift, rf, relu, B, C, HW);
        }
    free(x), free(res), free(xw), free(h);
}

/* Winograd F(3x3, 5x5) (cpu_wino5.c), written here: 5x5, stride 1, at least 8 channels in and 16
 * out, all three passes. Its transforms round more than a direct sum (points up to 2 and 1/2,
 * weights scaled by up to 32/45): y and dx stay within tol; dw, whose adjoint transform of the
 * weights cancels large terms, within wino5_dw_tol (the largest seen on lenet's and mnist-cnn's
 * layers, batches 1 to 256: 1.3e-5 of the largest element, 4e-6 as a relative RMS; the gradient
 * check in double holds it to 3e-8). The path must be taken for these layers and give the
 * same bits twice. It runs 16 samples at a time, one per vector lane: 1, 3 and 9 samples fill part
 * of one group, 17 and 33 end with a group of one, 25 with one of nine; at 2 threads, 17 samples
 * and more on a workspace planned for one sample fall back to im2col. A group's 25 positions in
 * mnist-cnn go through the GEMMs in chunks of 9, 9 and 7 (see chunk_positions). */
static const double wino5_dw_tol = 3e-5;

static void winograd5_matches_reference(void **state)
{
    (void)state;
    const ch_conv_desc cases[] = {
        /* lenet's conv2: no border, 9 tiles per sample */
        { .c = 20, .h = 13, .w = 13, .oc = 50, .kh = 5, .kw = 5, .stride = 1, .pad = 0 },
        /* mnist-cnn's conv2: 14x14 "same" (25 tiles in three chunks, the last row and column cut) */
        { .c = 20, .h = 14, .w = 14, .oc = 20, .kh = 5, .kw = 5, .stride = 1, .pad = 2 },
        /* uneven: 11x9 with pad 1 (3x3 tiles, 2 and 1 clipped), odd channel counts */
        { .c = 9, .h = 11, .w = 9, .oc = 17, .kh = 5, .kw = 5, .stride = 1, .pad = 1 },
        /* 16 -> 16 on 12x12: no chunk length spreads the points, so two even chunks of 8 */
        { .c = 16, .h = 12, .w = 12, .oc = 16, .kh = 5, .kw = 5, .stride = 1, .pad = 2 },
    };
    /* Batches 1, 3, 9 and 17: one tile chunk and several, and the 1-sample plan's fallback from 9
     * on (25 and 33 added nothing to these paths, and took two thirds of the sanitizer pass). */
    check_winograd_cases(cases, sizeof cases / sizeof cases[0], 17, wino5_dw_tol, wino5_taken);
    ch_conv_desc narrow = { .c = 20, .h = 14, .w = 14, .oc = 8, .kh = 5, .kw = 5, .stride = 1,
                            .pad = 2, .oh = 14, .ow = 14 };
    assert_true(wino5_taken(&narrow, 4, 1) == 0);   /* 8 out: im2col */
    narrow.oc = 32, narrow.c = 4;
    assert_true(wino5_taken(&narrow, 4, 1) == 0);   /* 4 in: im2col */
}

/* Winograd F(4x4, 3x3) (cpu_wino3.c, the machinery of cpu_wino5.c with 6x6 tiles): 3x3, stride 1,
 * at least 8 channels in and 16 out, all three passes, within the same bounds as F(3x3, 5x5)
 * (its points reach 2, not 2 and 1/2). Channel counts that are not multiples of 16 are in the
 * cases, so that even where oneDNN's Winograd (AVX-512) takes the others this path runs. */
static void winograd3_matches_reference(void **state)
{
    (void)state;
    const ch_conv_desc cases[] = {
        /* ResNet-20's first stage, smaller: 3x3 tiles of 4x4, one chunk of 9 positions */
        { .c = 16, .h = 12, .w = 12, .oc = 16, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        /* 14x14 "same": 16 positions in two chunks, the last tile row and column cut to 2 */
        { .c = 8, .h = 14, .w = 14, .oc = 16, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        /* uneven: 11x9 without a border (9x7 out: tiles clipped to 1 and 3), odd channel counts */
        { .c = 9, .h = 11, .w = 9, .oc = 17, .kh = 3, .kw = 3, .stride = 1, .pad = 0 },
        /* a pad wider than "same" (7x7 in, 9x9 out), and 32 -> 24 on 7x5 */
        { .c = 8, .h = 7, .w = 7, .oc = 16, .kh = 3, .kw = 3, .stride = 1, .pad = 2 },
        { .c = 32, .h = 7, .w = 5, .oc = 24, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        /* 2x5 tiles: one chunk of the widest kind (10 positions), whose 16-row point blocks get
         * their line of padding: the chunk buffers must hold it */
        { .c = 16, .h = 8, .w = 20, .oc = 16, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
        /* more output channels than one sweep of the bias sums takes (wino_grads.h, DB_BLOCK) */
        { .c = 8, .h = 6, .w = 6, .oc = 72, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
    };
    check_winograd_cases(cases, sizeof cases / sizeof cases[0], 17, wino5_dw_tol, wino3_taken);
    ch_conv_desc other = { .c = 16, .h = 14, .w = 14, .oc = 8, .kh = 3, .kw = 3, .stride = 1,
                           .pad = 1, .oh = 14, .ow = 14 };
    assert_true(wino3_taken(&other, 4, 1) == 0);   /* 8 out: im2col */
    other.oc = 32, other.c = 4;
    assert_true(wino3_taken(&other, 4, 1) == 0);   /* 4 in: im2col */
    other.c = 16, other.stride = 2, other.oh = other.ow = 7;
    assert_true(wino3_taken(&other, 4, 1) == 0);   /* strided: im2col */
    /* A 2x2 output in one 4x4 tile: 36 multiplies either way, so im2col; 3x3 saves 45. */
    other.stride = 1, other.h = other.w = other.oh = other.ow = 2;
    assert_true(wino3_taken(&other, 4, 1) == 0);
    other.h = other.w = other.oh = other.ow = 3;
    assert_true(wino3_taken(&other, 4, 1) > 0);
}

/* `bytes` bytes that end where an unmapped page begins: a read past their end faults. *map and
 * *map_len are for guard_free. */
static void *guarded(size_t bytes, void **map, size_t *map_len)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = (bytes + page - 1) / page;
    *map_len = (pages + 1) * page;
    *map = mmap(NULL, *map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(*map != MAP_FAILED);
    assert_int_equal(mprotect((char *)*map + pages * page, page, PROT_NONE), 0);
    return (char *)*map + pages * page - bytes;
}

/* The Winograds' packing and unpacking move whole blocks of 8 or 16 elements of each sample's
 * rows, under a mask where a row is shorter than a block: nothing read or written past a tensor's
 * end. Every tensor the passes read or write ends at an unmapped page, and a full group (16
 * samples) goes through F(4x4, 3x3)'s forward and both backward passes: fp32, x in bf16 (y
 * rounded to bf16) and dy in bf16. */
static void check_blocks_within_tensors(ch_conv_desc d)
{
    const ch_kernels *cpu = ch_kernels_cpu();
    enum { N = 16, MAPS = 7 };
    const size_t xs = (size_t)N * d.c * d.h * d.w, ys = (size_t)N * d.oc * d.oh * d.ow;
    const size_t wl = (size_t)d.oc * d.c * 9;
    void *maps[MAPS];
    size_t lens[MAPS];
    ch_real *x = guarded(sizeof(ch_real) * xs, &maps[0], &lens[0]);
    ch_real *dy = guarded(sizeof(ch_real) * ys, &maps[1], &lens[1]);
    uint16_t *xh = guarded(sizeof(uint16_t) * xs, &maps[2], &lens[2]);
    uint16_t *dyh = guarded(sizeof(uint16_t) * ys, &maps[3], &lens[3]);
    ch_real *y = guarded(sizeof(ch_real) * ys, &maps[4], &lens[4]);
    uint16_t *yh = guarded(sizeof(uint16_t) * ys, &maps[5], &lens[5]);
    ch_real *dx = guarded(sizeof(ch_real) * xs, &maps[6], &lens[6]);
    ch_real *x0 = tu_uniform(xs, 4), *dy0 = tu_uniform(ys, 7), *w = tu_uniform(wl, 5);
    ch_real *g = malloc(sizeof(ch_real) * (wl + (size_t)d.oc));
    assert_non_null(g);
    memcpy(x, x0, sizeof(ch_real) * xs), memcpy(dy, dy0, sizeof(ch_real) * ys);
    for (size_t i = 0; i < xs; i++) xh[i] = ch_bf16_from_float(x0[i]);
    for (size_t i = 0; i < ys; i++) dyh[i] = ch_bf16_from_float(dy0[i]);
    ch_kctx kc = { .nthreads = 2, .cache = ch_cpu_kcache_create() };
    d.bf16 = true;   /* the largest of the workspaces, the bf16 passes' */
    const size_t wsz = cpu->conv2d_workspace(&kc, &d, N);
    kc.ws = malloc(sizeof(ch_real) * wsz), kc.ws_len = wsz;
    assert_true(wino3_taken(&d, N, 2) > 0);
    const bool bf16 = cpu->conv2d_x_bf16(&kc, &d, N) && cpu->conv2d_dy_bf16(&kc, &d, N);
    d.bf16 = false;
    cpu->conv2d_forward(&kc, &d, N, x, w, NULL, y);
    assert_true(cpu->conv2d_backward(&kc, &d, N, x, y, dy, w, dx, g, g + wl));
    if (bf16) {
        d.bf16 = true;
        cpu->conv2d_forward_of_bf16(&kc, &d, N, xh, w, NULL, NULL, yh);
        cpu->conv2d_backward_dy_bf16(&kc, &d, N, NULL, xh, dyh, w, dx, g, g + wl);
    }
    /* Where the CPU has AVX-512 (the 16-wide blocks), the bf16 passes exist and ran. */
    if (ch_cpu_avx512()) assert_true(bf16);
    for (int i = 0; i < MAPS; i++) munmap(maps[i], lens[i]);
    free(x0), free(dy0), free(w), free(g), free(kc.ws);
    ch_cpu_kcache_free(kc.cache);
}

/* 7x7 planes: x's and dx's rows of 7 in bordered group planes, shorter than either block; 3x3: y's
 * and dy's whole planes of 9 (channel counts off 16, which oneDNN's fp32 Winograd would take). */
static void winograd_blocks_within_tensors(void **state)
{
    (void)state;
    check_blocks_within_tensors((ch_conv_desc){ .c = 8, .h = 7, .w = 7, .oc = 16, .kh = 3, .kw = 3, .stride = 1,
                                                .pad = 1, .oh = 7, .ow = 7 });
    check_blocks_within_tensors((ch_conv_desc){ .c = 8, .h = 3, .w = 3, .oc = 24, .kh = 3, .kw = 3, .stride = 1,
                                                .pad = 1, .oh = 3, .ow = 3 });
}

/* BatchNorm's reductions (lane partial sums) against plain loops, for planes shorter than a
 * vector, exactly one, and with a tail. */
static void check_batchnorm_sums(int n, int c, int hw, int threads)
{
    const ch_kernels *cpu = ch_kernels_cpu(), *ref = ch_kernels_ref();
    const size_t len = (size_t)n * c * hw;
    ch_real *x = tu_uniform(len, 11), *dy = tu_uniform(len, 12);
    for (size_t i = 0; i < len; i++) x[i] = x[i] * 3 + 2;   /* a mean well away from 0 */
    double m1[8], v1[8], m2[8], v2[8], s1[8], sx1[8], s2[8], sx2[8];
    ch_real mean[8], invstd[8];
    ch_kctx kc = { .nthreads = threads };
    cpu->batchnorm_stats(&kc, n, c, hw, x, m1, v1);
    ref->batchnorm_stats(&kc, n, c, hw, x, m2, v2);
    /* The CPU sums in float lanes of at most 64 terms, then in double (cpu_norm.c): float32
     * rounding of those short sums, never a lost term (one is 1e-3 of these sums or more). */
    const double cnt = (double)n * hw;
    for (int ch = 0; ch < c; ch++) {
        assert_true(fabs(m1[ch] - m2[ch]) <= 1e-6 * (1 + fabs(m2[ch])));
        assert_true(fabs(v1[ch] - v2[ch]) <= 1e-6 * (1 + fabs(v2[ch])));
        mean[ch] = (ch_real)m2[ch];
        invstd[ch] = (ch_real)(1 / sqrt(v2[ch] + 1e-5));
    }
    cpu->batchnorm_backward_reduce(&kc, n, c, hw, x, dy, mean, invstd, s1, sx1);
    ref->batchnorm_backward_reduce(&kc, n, c, hw, x, dy, mean, invstd, s2, sx2);
    /* Sums of cnt terms of either sign: their rounding is relative to the terms, not the sum. */
    for (int ch = 0; ch < c; ch++) {
        assert_true(fabs(s1[ch] - s2[ch]) <= 1e-6 * cnt);
        assert_true(fabs(sx1[ch] - sx2[ch]) <= 1e-6 * cnt * invstd[ch] * 6);
    }
    free(x), free(dy);
}

/* Data far from zero against its spread (mean 1000, deviation 0.006), where sum x^2 - (sum x)^2 / n
 * in float would cancel every digit: the variance within 1e-3 of itself. */
static void batchnorm_variance_far_from_zero(void)
{
    const ch_kernels *cpu = ch_kernels_cpu(), *ref = ch_kernels_ref();
    const int n = 4, c = 3, hw = 300;
    const size_t len = (size_t)n * c * hw;
    ch_real *x = tu_uniform(len, 13);
    for (size_t i = 0; i < len; i++) x[i] = x[i] * 0.01f + 1000;
    double m1[3], v1[3], m2[3], v2[3];
    ch_kctx kc = { .nthreads = 2 };
    cpu->batchnorm_stats(&kc, n, c, hw, x, m1, v1);
    ref->batchnorm_stats(&kc, n, c, hw, x, m2, v2);
    for (int ch = 0; ch < c; ch++) {
        assert_true(fabs(m1[ch] - m2[ch]) <= 1e-6 * fabs(m2[ch]));
        assert_true(fabs(v1[ch] - v2[ch]) <= 1e-3 * v2[ch]);
    }
    free(x);
}

/* The float lanes are emptied into double every 64 terms, also when they carry over from one
 * plane to the next: every term 1 + 2^-16, a lane's sum of up to 255 of them is exact in float,
 * and so the whole sum in double; one lane left to take its 600 terms (a plane of 4x4 a sample)
 * rounds. Both reductions' sums of dy, and of dy * (x - mean) with x - mean = 1. */
static void batchnorm_lanes_emptied_every_64_terms(void)
{
    const ch_kernels *cpu = ch_kernels_cpu();
    const struct { int n, hw; } cases[] = { { 600, 16 }, { 300, 49 }, { 4, 1100 } };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int n = cases[k].n, c = 2, hw = cases[k].hw;
        const size_t len = (size_t)n * c * hw;
        ch_real *x = malloc(sizeof *x * len), *dy = malloc(sizeof *dy * len);
        assert_non_null(x);
        assert_non_null(dy);
        const ch_real term = 1.0f + 0x1p-16f;
        for (size_t i = 0; i < len; i++) x[i] = 3, dy[i] = term;
        const ch_real mean[2] = { 2, 2 }, invstd[2] = { 1, 0.5f };
        double s[2], sx[2];
        for (int t = 1; t <= 2; t++) {
            const ch_kctx kc = { .nthreads = t };
            cpu->batchnorm_backward_reduce(&kc, n, c, hw, x, dy, mean, invstd, s, sx);
            const double want = (double)n * hw * (double)term;
            for (int ch = 0; ch < c; ch++) {
                assert_true(s[ch] == want);
                assert_true(sx[ch] == want * invstd[ch]);
            }
        }
        free(x), free(dy);
    }
}

/* The lane order, written plainly for one channel: planes in sample order, each plane's whole
 * 16-value vectors into 16 float lanes that carry over from plane to plane and are emptied into
 * double every 64 terms, the plane's rest into double at once; s1 = sum (a - ka), s2 = sum (a - ka) *
 * (b - kb), the lanes added last. */
static void lane_order(const float *a, float ka, const float *b, float kb, int n, int c, int ch, int hw,
                       double *s1, double *s2)
{
    enum { L = 16, TERMS = 64 };
    float la[L] = { 0 }, lb[L] = { 0 };
    double u = 0, w = 0;
    int terms = 0;
    const int full = hw - hw % L;
    for (int p = 0; p < n; p++) {
        const float *ap = a + ((size_t)p * c + ch) * hw, *bp = b + ((size_t)p * c + ch) * hw;
        for (int i = 0; i < full; i += L) {
            if (terms == TERMS) {
                for (int j = 0; j < L; j++) u += la[j], w += lb[j], la[j] = lb[j] = 0;
                terms = 0;
            }
            for (int j = 0; j < L; j++) {
                const float v = ap[i + j] - ka;
                la[j] += v;
                lb[j] += v * (bp[i + j] - kb);
            }
            terms++;
        }
        for (int i = full; i < hw; i++) {
            const double v = (double)ap[i] - ka;
            u += v;
            w += v * ((double)bp[i] - kb);
        }
    }
    for (int j = 0; j < L; j++) u += la[j], w += lb[j];
    *s1 = u, *s2 = w;
}

/* The lane order of planes of hw < 16 values, hw dividing 16, for the channels whose planes share a
 * vector (16 / hw channels of one sample, counted from channel 0): each of the channel's hw lanes
 * sums its position over the samples in float, emptied into double every 64 samples, the channel's
 * lanes in position order. */
static void lane_order_small(const float *a, float ka, const float *b, float kb, int n, int c, int ch, int hw,
                             double *s1, double *s2)
{
    double u = 0, w = 0;
    for (int p0 = 0; p0 < n; p0 += 64) {
        float la[16] = { 0 }, lb[16] = { 0 };
        for (int p = p0; p < n && p < p0 + 64; p++)
            for (int i = 0; i < hw; i++) {
                const size_t at = ((size_t)p * c + ch) * hw + (size_t)i;
                const float v = a[at] - ka;
                la[i] += v;
                lb[i] += v * (b[at] - kb);
            }
        for (int i = 0; i < hw; i++) u += la[i], w += lb[i];
    }
    *s1 = u, *s2 = w;
}

/* Which order channel ch of c, with planes of hw values, is summed in. */
static void channel_order(const float *a, float ka, const float *b, float kb, int n, int c, int ch, int hw,
                          double *s1, double *s2)
{
    const int per = hw < 16 && 16 % hw == 0 ? 16 / hw : 0;
    if (per && ch < c / per * per)
        lane_order_small(a, ka, b, kb, n, c, ch, hw, s1, s2);
    else
        lane_order(a, ka, b, kb, n, c, ch, hw, s1, s2);
}

/* BatchNorm's statistics and backward sums are, bit for bit, the lane order above for every
 * channel, whichever way the kernel walks memory (CB channels at a time, sample by sample) and at 1
 * and 2 threads: 130 channels (two blocks of 64 and a rest, split between threads mid-block; at
 * planes of 1 and 4 values the last 2 channels do not fill a vector and go the plane-by-plane way),
 * planes of 1, 4, 16, 49 and 197 values, 70 samples (lanes emptied inside planes and between them). */
static void batchnorm_sums_follow_the_lane_order(void)
{
    const int hws[] = { 1, 4, 16, 49, 197 }, n = 70, c = 130;
    for (size_t k = 0; k < sizeof hws / sizeof hws[0]; k++) {
        const int hw = hws[k];
        const size_t len = (size_t)n * c * hw;
        float *x = tu_uniform(len, 40 + k), *dy = tu_uniform(len, 50 + k), mean[130], invstd[130];
        double m[130], v[130], s[130], sx[130];
        assert_true(x && dy);
        for (int ch = 0; ch < c; ch++) mean[ch] = 0.01f * (float)ch - 0.3f, invstd[ch] = 1.25f;
        for (int t = 1; t <= 2; t++) {
            const ch_kctx kc = { .nthreads = t };
            ch_kernels_cpu()->batchnorm_stats(&kc, n, c, hw, x, m, v);
            ch_kernels_cpu()->batchnorm_backward_reduce(&kc, n, c, hw, x, dy, mean, invstd, s, sx);
            for (int ch = 0; ch < c; ch++) {
                const float k0 = x[(size_t)ch * hw];
                double a1, a2, b1, b2;
                channel_order(x, k0, x, k0, n, c, ch, hw, &a1, &a2);
                channel_order(dy, 0, x, mean[ch], n, c, ch, hw, &b1, &b2);
                const double cnt = (double)n * hw, d = a1 / cnt, var = a2 / cnt - d * d;
                if (m[ch] != k0 + d || v[ch] != (var > 0 ? var : 0) || s[ch] != b1 || sx[ch] != b2 * invstd[ch])
                    fail_msg("hw %d, %d threads, channel %d: not the lane order's sums", hw, t, ch);
            }
        }
        free(x), free(dy);
    }
}

static void batchnorm_sums_match_reference(void **state)
{
    (void)state;
    batchnorm_variance_far_from_zero();
    batchnorm_lanes_emptied_every_64_terms();
    batchnorm_sums_follow_the_lane_order();
    const int hws[] = { 1, 7, 16, 20, 49, 1100 };   /* 1100: a full float chunk, a part, a tail */
    for (int t = 1; t <= 2; t++) {
        for (size_t i = 0; i < sizeof hws / sizeof hws[0]; i++) check_batchnorm_sums(3, 5, hws[i], t);
        /* Lanes carried over planes and emptied between them (16: one vector a plane, 64 planes
         * a lane's fill) or inside one (49: three vectors and a tail, 21 planes and a third). */
        check_batchnorm_sums(150, 3, 16, t);
        check_batchnorm_sums(70, 4, 49, t);
    }
}

/* Max pooling's fast 2x2 path against the direct loops, ties included (quantised inputs), both
 * passes bit for bit at 1, 2 and 3 threads: short rows (computed as whole chunks into the next
 * rows' outputs, up to the end of each thread's planes) and odd sizes (a row and column outside
 * every window, which backward must zero). */
static void maxpool_matches_reference(void **state)
{
    (void)state;
    const ch_kernels *cpu = ch_kernels_cpu(), *ref = ch_kernels_ref();
    const ch_pool_desc cases[] = {
        { .c = 3, .h = 8, .w = 10, .k = 2, .stride = 2, .pad = 0, .oh = 4, .ow = 5 },
        { .c = 2, .h = 7, .w = 7, .k = 2, .stride = 2, .pad = 0, .oh = 3, .ow = 3 },
        { .c = 2, .h = 7, .w = 7, .k = 3, .stride = 2, .pad = 1, .oh = 4, .ow = 4 },
        /* rows of exactly one chunk of 16, of two chunks and a tail of 5, odd widths */
        { .c = 2, .h = 32, .w = 33, .k = 2, .stride = 2, .pad = 0, .oh = 16, .ow = 16 },
        { .c = 1, .h = 9, .w = 75, .k = 2, .stride = 2, .pad = 0, .oh = 4, .ow = 37 },
        /* mnist-cnn's pools: rows of 14 and 7 outputs */
        { .c = 4, .h = 28, .w = 28, .k = 2, .stride = 2, .pad = 0, .oh = 14, .ow = 14 },
        { .c = 5, .h = 14, .w = 14, .k = 2, .stride = 2, .pad = 0, .oh = 7, .ow = 7 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int t = 1; t <= 3; t++) {
            const ch_pool_desc *d = &cases[i];
            const int n = 3;
            const size_t xs = (size_t)n * d->c * d->h * d->w;
            const size_t ys = (size_t)n * d->c * d->oh * d->ow;
            ch_real *x = tu_uniform(xs, 9), *dy = tu_uniform(ys, 10);
            ch_real *y1 = malloc(sizeof(ch_real) * ys), *y2 = malloc(sizeof(ch_real) * ys);
            ch_real *dx1 = malloc(sizeof(ch_real) * xs), *dx2 = malloc(sizeof(ch_real) * xs);
            int32_t *a1 = malloc(sizeof(int32_t) * ys), *a2 = malloc(sizeof(int32_t) * ys);
            for (size_t j = 0; j < xs; j++) x[j] = (ch_real)(int)(x[j] * 3);   /* many ties */
            for (size_t j = 0; j < xs; j++) dx1[j] = dx2[j] = (ch_real)NAN;   /* all written */
            ch_kctx kc = { .nthreads = t };
            cpu->maxpool2d_forward(&kc, d, n, x, y1, a1);
            ref->maxpool2d_forward(&kc, d, n, x, y2, a2);
            assert_memory_equal(y1, y2, sizeof(ch_real) * ys);
            assert_memory_equal(a1, a2, sizeof(int32_t) * ys);
            cpu->maxpool2d_backward(&kc, d, n, dy, a1, dx1);
            ref->maxpool2d_backward(&kc, d, n, dy, a2, dx2);
            assert_memory_equal(dx1, dx2, sizeof(ch_real) * xs);
            free(x), free(dy), free(y1), free(y2), free(dx1), free(dx2), free(a1), free(a2);
        }
}

/* The float build's smooth activations (cpu_vmath.h's branch-free functions) against libm in
 * double: over [-20, 20] at 2^-10 steps, tiny values near 0 and the edges (+-0, +-inf, NaN, where
 * e^x underflows and overflows), each result within 8 float ulps of the exact one relative to a
 * scale of at least 1e-28 (near float's underflow, 0 is as good as exact). The scale is |exact|,
 * except: a slope that is a sum of two terms (GELU's crosses 0 near -0.75) takes the sum of their
 * sizes, since float rounds each term; sigmoid's and tanh's slopes are read from y, whose
 * rounding near 1 is absolute (1 - y is 0 once y rounds to 1, as in PyTorch), so theirs is 1.
 * The exact GELU is written with erfc: 0.5 x (1 + erf(x / sqrt 2)) cancels in double itself
 * below x = -6. Measured worst on this CPU (Zen 3): 3.3 ulp (GELU forward). */
typedef struct smooth_case {
    ch_act_kind kind;
    double (*value)(double), (*scale)(double), (*slope)(double), (*slope_scale)(double);
} smooth_case;

static double one(double x) { return (void)x, 1; }
static double sigmoid_d(double x) { return 1 / (1 + exp(-x)); }
static double sigmoid_slope_d(double x) { return sigmoid_d(x) * (1 - sigmoid_d(x)); }
static double tanh_slope_d(double x) { return 1 - tanh(x) * tanh(x); }
static double phi_d(double x) { return CH_INV_SQRT_2PI * exp(-0.5 * x * x); }
static double gelu_d(double x) { return 0.5 * x * erfc(-x * CH_SQRT1_2); }
static double gelu_slope_d(double x) { return 0.5 * erfc(-x * CH_SQRT1_2) + x * phi_d(x); }
static double gelu_slope_scale(double x) { return 0.5 * erfc(-x * CH_SQRT1_2) + fabs(x * phi_d(x)); }
/* x sigmoid(2u): the tanh form without the cancellation of 1 + tanh u. */
static double two_u(double x) { return 2 * CH_SQRT_2_PI * (x + CH_GELU_CUBIC * x * x * x); }
static double gelu_tanh_d(double x) { return x * sigmoid_d(two_u(x)); }
/* Float rounds 2u, and sigmoid(z) moves by z (1 - sigmoid(z)) times z's relative error: in the
 * negative tail (2u = -17 at x = -5) that is the function's own conditioning, not the kernel's;
 * the slope's scale has the same factor. */
static double gelu_tanh_scale(double x)
{
    return fabs(gelu_tanh_d(x)) * (1 + fabs(two_u(x)) * sigmoid_d(-two_u(x)));
}
static double gelu_tanh_slope_parts(double x, bool size)
{
    const double s = sigmoid_d(two_u(x)), one_minus_s = sigmoid_d(-two_u(x));
    const double second = x * s * one_minus_s * 2 * CH_SQRT_2_PI * (1 + 3 * CH_GELU_CUBIC * x * x);
    return size ? s + fabs(second) : s + second;
}
static double gelu_tanh_slope_d(double x) { return gelu_tanh_slope_parts(x, false); }
static double gelu_tanh_slope_scale(double x)
{
    return gelu_tanh_slope_parts(x, true) * (1 + fabs(two_u(x)) * sigmoid_d(-two_u(x)));
}

static size_t smooth_inputs(ch_real *x)
{
    static const float edges[] = { 0.0f, -0.0f, 1e-30f, -1e-30f, 1e-40f, 1e-6f, -1e-6f, 0.5f,
                                   -0.5f, 0.625f, -0.625f, 87.0f, -87.0f, -87.5f, 88.5f, -88.5f,
                                   100.0f, -100.0f, 1e30f, -1e30f };
    size_t n = 0;
    for (int i = -20 * 1024; i <= 20 * 1024; i++) x[n++] = (ch_real)i / 1024;
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) x[n++] = edges[i];
    return n;
}

/* The worst |got - exact| / max(scale(x), 1e-28), scale NULL meaning |exact|. */
static double worst_error(const ch_real *got, const ch_real *x, size_t n, double (*f)(double),
                          double (*scale)(double))
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double want = f(x[i]);
        const double size = fmax(scale ? scale(x[i]) : fabs(want), 1e-28);
        const double err = want == got[i] ? 0 : fabs(got[i] - want) / size;
        worst = tu_worse(worst, err);   /* a NaN result counts as infinite */
    }
    return worst;
}

static void smooth_activations_within_ulps_of_libm(void **state)
{
    (void)state;
    const smooth_case cases[] = {
        { CH_ACT_SIGMOID, sigmoid_d, NULL, sigmoid_slope_d, one },
        { CH_ACT_TANH, tanh, NULL, tanh_slope_d, one },
        { CH_ACT_ERF, erf, NULL, ch_erf_slope, NULL },
        { CH_ACT_GELU, gelu_d, NULL, gelu_slope_d, gelu_slope_scale },
        { CH_ACT_GELU_TANH, gelu_tanh_d, gelu_tanh_scale, gelu_tanh_slope_d, gelu_tanh_slope_scale },
    };
    const size_t cap = 41 * 1024 + 32;
    ch_real *x = malloc(sizeof(ch_real) * cap), *y = malloc(sizeof(ch_real) * cap);
    ch_real *dy = malloc(sizeof(ch_real) * cap), *dx = malloc(sizeof(ch_real) * cap);
    assert_true(x && y && dy && dx);
    const size_t n = smooth_inputs(x);
    for (size_t i = 0; i < n; i++) dy[i] = 1;
    const ch_kernels *cpu = ch_kernels_cpu();
    ch_kctx kc = { .nthreads = 2 };
    const double ulp = 1.0 / (1 << 23);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const ch_act a = { .kind = cases[c].kind };
        cpu->act_forward(&kc, &a, n, x, y);
        cpu->act_backward(&kc, &a, n, x, y, dy, dx);
        const double fw = worst_error(y, x, n, cases[c].value, cases[c].scale);
        const double bw = worst_error(dx, x, n, cases[c].slope, cases[c].slope_scale);
        printf("activation kind %d: worst %.2f ulp forward, %.2f backward\n", (int)a.kind,
               fw / ulp, bw / ulp);
        assert_true(fw <= 8 * ulp);
        assert_true(bw <= 8 * ulp);
        /* NaN in, NaN out; at +-infinity the exact formula's value (GELU's -inf * 0 is NaN). */
        const ch_real edge[3] = { NAN, INFINITY, -INFINITY };
        ch_real out[3];
        cpu->act_forward(&kc, &a, 3, edge, out);
        assert_true(isnan(out[0]));
        for (int i = 1; i < 3; i++) {
            const ch_real want = (ch_real)cases[c].value(edge[i]);
            assert_true(out[i] == want || (isnan(out[i]) && isnan(want)));
        }
    }
    free(x), free(y), free(dy), free(dx);
}


/* Average pooling's 2x2 path against the direct loops, bit for bit, odd sizes included (the last
 * row and column lie outside every window). */
static void avgpool_matches_reference(void **state)
{
    (void)state;
    const ch_kernels *cpu = ch_kernels_cpu(), *ref = ch_kernels_ref();
    const ch_pool_desc cases[] = {
        { .c = 3, .h = 8, .w = 10, .k = 2, .stride = 2, .pad = 0, .oh = 4, .ow = 5 },
        { .c = 2, .h = 7, .w = 9, .k = 2, .stride = 2, .pad = 0, .oh = 3, .ow = 4 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const ch_pool_desc *d = &cases[i];
        const int n = 3;
        const size_t xs = (size_t)n * d->c * d->h * d->w, ys = (size_t)n * d->c * d->oh * d->ow;
        ch_real *x = tu_uniform(xs, 4), *dy = tu_uniform(ys, 5);
        ch_real *y1 = malloc(sizeof(ch_real) * ys), *y2 = malloc(sizeof(ch_real) * ys);
        ch_real *dx1 = malloc(sizeof(ch_real) * xs), *dx2 = malloc(sizeof(ch_real) * xs);
        for (size_t j = 0; j < xs; j++) dx1[j] = dx2[j] = (ch_real)NAN;   /* every element written */
        ch_kctx kc = { .nthreads = 2 };
        cpu->avgpool2d_forward(&kc, d, n, x, y1);
        ref->avgpool2d_forward(&kc, d, n, x, y2);
        assert_memory_equal(y1, y2, sizeof(ch_real) * ys);
        cpu->avgpool2d_backward(&kc, d, n, dy, dx1);
        ref->avgpool2d_backward(&kc, d, n, dy, dx2);
        assert_memory_equal(dx1, dx2, sizeof(ch_real) * xs);
        free(x), free(dy), free(y1), free(y2), free(dx1), free(dx2);
    }
}

/* The lazy backend's streams and events (kernels/lazy/lazy.c): nothing queued runs until the host
 * waits for it, a wait runs exactly what it needs (the transfer stream's download of a kernel's
 * result runs the kernel first only when the stream waits on the kernel's event), and freeing
 * memory runs what is queued on it. */
static void lazy_backend_runs_work_only_when_waited_for(void **state)
{
    (void)state;
    ch_backend *be;
    ch_err err;
    assert_int_equal(ch_backend_create("lazy", 3, 1, &be, &err), CH_STATUS_OK);
    assert_true(ch_backend_async(be) && !be->ops->host_visible);
    enum { N = 1000 };
    ch_real *a = ch_backend_alloc(be, sizeof(ch_real) * N), *b = ch_backend_alloc(be, sizeof(ch_real) * N);
    ch_real host[N], out[N];
    for (int i = 0; i < N; i++) host[i] = (ch_real)(i % 17) - 8;
    ch_backend_upload(be, a, host, sizeof host);   /* blocking: done when it returns */
    for (int i = 0; i < N; i++) host[i] = -1;   /* the upload has read it already */
    const ch_kctx kc = ch_backend_kctx(be);
    be->k->relu_forward(&kc, N, a, b);
    ch_event *relu_done = ch_backend_event(be);
    ch_backend_record(be, relu_done, CH_STREAM_COMPUTE);
    assert_false(be->ops->query(be, relu_done));
    /* A download on the transfer stream that does not wait on the kernel reads b as it was (zero),
     * even though the kernel was queued first. */
    for (int i = 0; i < N; i++) out[i] = -1;
    ch_backend_download_async(be, CH_STREAM_TRANSFER, out, b, sizeof out);
    for (int i = 0; i < N; i++) assert_true(out[i] == -1);   /* queued, not run */
    ch_backend_sync(be, CH_STREAM_TRANSFER);
    for (int i = 0; i < N; i++) assert_true(out[i] == 0);
    nanosleep(&(struct timespec){ .tv_nsec = 50000000 }, NULL);
    assert_false(be->ops->query(be, relu_done));   /* the transfer's sync did not run the kernel */
    /* With the wait, the same download runs the kernel first. */
    ch_backend_wait(be, CH_STREAM_TRANSFER, relu_done);
    ch_backend_download_async(be, CH_STREAM_TRANSFER, out, b, sizeof out);
    ch_backend_sync(be, CH_STREAM_TRANSFER);
    assert_true(be->ops->query(be, relu_done));
    for (int i = 0; i < N; i++) assert_true(out[i] == (ch_real)((i % 17) - 8 > 0 ? (i % 17) - 8 : 0));
    /* An event sync runs its stream up to the event, and a host result is written only then. */
    double sum = -7;
    be->k->mse(&kc, N, a, b, 1.0, NULL, &sum);
    ch_backend_record(be, relu_done, CH_STREAM_COMPUTE);
    assert_true(sum == -7);
    ch_backend_event_sync(be, relu_done);
    double want = 0;
    for (int i = 0; i < N; i++) {
        const double v = (double)((i % 17) - 8);
        want += v < 0 ? v * v : 0;
    }
    assert_true(fabs(sum - want) <= 1e-9 * want);
    /* Released memory: what was queued on it has run (the zero below), nothing is left. */
    ch_backend_zero(be, b, sizeof(ch_real) * N);
    ch_backend_event_free(be, relu_done);
    ch_backend_release(be, a);
    ch_backend_release(be, b);
    ch_backend_free(be);
}

/* The dropout-mask kernel draws, element by element, the words the host's sequential reader
 * (ch_rng) gives for the same (seed, stream, counter): a sample size that is not a multiple of 4,
 * a sample offset, a step, two threads. */
static void dropout_mask_draws_the_host_readers_bits(void **state)
{
    (void)state;
    enum { N = 5, PER = 7 };
    const uint64_t seed = 1234567, stream = 3 + (9u << 8), step = 6, sample0 = 11;
    const uint32_t threshold = (uint32_t)(0.3 * 4294967296.0);
    const ch_real keep = (ch_real)(1 / 0.7);
    ch_real mask[N * PER];
    const ch_kctx kc = { .nthreads = 2 };
    ch_kernels_cpu()->dropout_mask(&kc, N, PER, seed, stream, step, sample0, threshold, keep, mask);
    int kept = 0;
    for (int s = 0; s < N; s++) {
        ch_rng r;
        ch_rng_init(&r, seed, stream, (step << 32) ^ ((sample0 + (uint64_t)s) * ((PER + 3) / 4)));
        for (int e = 0; e < PER; e++) {
            const ch_real want = ch_rng_u32(&r) >= threshold ? keep : 0;
            assert_true(mask[s * PER + e] == want);
            kept += want != 0;
        }
    }
    assert_true(kept > 0 && kept < N * PER);   /* both outcomes occur */
}

/* The VmFlags line of the mapping of /proc/self/smaps that holds p ("" if none is found). */
static void vm_flags_of(const void *p, char *out, size_t len)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    char line[512];
    bool inside = false;
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            snprintf(out, len, "%s", line);
            break;
        }
    }
    fclose(f);
}

/* The CPU backend's memory: blocks either side of the 4 MiB where it switches from calloc to a
 * mapping come zeroed, take writes to their last byte and are released (ASan sees a wrong header
 * or length); the mapped ones are marked for huge pages (VmFlags "hg", where the kernel has THP). */
static void cpu_backend_memory_is_zeroed_and_large_blocks_ask_for_huge_pages(void **state)
{
    (void)state;
    ch_backend *be = NULL;
    ch_err err;
    assert_int_equal(ch_backend_create("cpu", 0, 1, &be, &err), CH_STATUS_OK);
    const size_t sizes[] = { 1, 1000, (4u << 20) - 1, 4u << 20, (9u << 20) + 3 };
#if defined(__SANITIZE_ADDRESS__)
    const bool thp = false;   /* under ASan every block is calloc's, whose ends it guards */
#else
    const bool thp = access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0;
#endif
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *m = ch_backend_alloc(be, sizes[i]);
        assert_non_null(m);
        size_t nonzero = 0;
        for (size_t j = 0; j < sizes[i]; j++) nonzero += m[j] != 0;
        assert_int_equal(nonzero, 0);
        memset(m, 0xA5, sizes[i]);
        char flags[512];
        vm_flags_of(m, flags, sizeof flags);
        if (sizes[i] >= 4u << 20 && thp) assert_non_null(strstr(flags, " hg"));
        if (sizes[i] < 1000) assert_null(strstr(flags, " hg"));   /* the heap: not asked */
        ch_backend_release(be, m);
    }
    ch_backend_free(be);
}

/* An argument runs only the tests whose names match it (a cmocka pattern). */
int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lazy_backend_runs_work_only_when_waited_for),
        cmocka_unit_test(cpu_backend_memory_is_zeroed_and_large_blocks_ask_for_huge_pages),
        cmocka_unit_test(dropout_mask_draws_the_host_readers_bits),
        cmocka_unit_test(gemm_matches_reference_for_every_transpose),
        cmocka_unit_test(gemm_with_empty_sum_writes_beta_c),
        cmocka_unit_test(conv_matches_reference),
        cmocka_unit_test(depthwise_matches_reference),
        cmocka_unit_test(depthwise_small_planes_match_reference),
        cmocka_unit_test(depthwise_bits_do_not_depend_on_threads),
        cmocka_unit_test(primitives_made_at_plan_time),
        cmocka_unit_test(winograd_matches_reference),
        cmocka_unit_test(direct_stride2_matches_reference),
        cmocka_unit_test(bf16_reorder_rounds_as_plain_c),
        cmocka_unit_test(bf16_storage_kernels_match_plain_c),
        cmocka_unit_test(small_plane_batchnorm_matches_plain_c),
        cmocka_unit_test(bn_relu_kernels_give_the_separate_kernels_bits),
        cmocka_unit_test(bn_add_kernel_gives_the_separate_kernels_bits),
        cmocka_unit_test(gemm_batch_matches_reference),
        cmocka_unit_test(gemm_batch_threads_run_at_once),
        cmocka_unit_test(gemm_kernels_made_at_plan_time),
        cmocka_unit_test(teams_of_one_start_no_threads),
        cmocka_unit_test(winograd5_matches_reference),
        cmocka_unit_test(winograd3_matches_reference),
        cmocka_unit_test(winograd_blocks_within_tensors),
        cmocka_unit_test(batchnorm_sums_match_reference),
        cmocka_unit_test(maxpool_matches_reference),
        cmocka_unit_test(avgpool_matches_reference),
        cmocka_unit_test(smooth_activations_within_ulps_of_libm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
