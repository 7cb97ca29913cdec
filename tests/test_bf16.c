/* --precision bf16's convolutions (cpu_dnnl_conv.c), on a CPU with native bf16, or on one with
 * AVX-512 through oneDNN's emulation of bf16 (COHORT_BF16=emulate, which this program sets there);
 * below AVX-512 the program exits 77 (skipped, never passed). The rounding they rely on (oneDNN's fp32 -> bf16
 * reorder) is checked on every CPU, in test_kernels.
 * - Each pass is held to the reference table run on the operands rounded to bf16 (x and w
 *   forward, dy and w backward data, x and dy backward weights): the products are exact in fp32,
 *   so what remains is the order of fp32 sums, within 2e-6 of each result's scale. An operand
 *   whose rounding were dropped would be off by ~1e-3 (the fixtures are not bf16 values: the test
 *   also requires the plain fp32 reference to differ by more than 1e-4).
 * - The weight gradient of those layers by im2col and bf16 GEMMs (cpu_conv_bf16w.c), over
 *   several chunks of samples, against the same reference; larger planes keep oneDNN's pass.
 * - The path is taken where it should be (stride 2, 5x5 stride 2, a 3x3 2x2 plane no Winograd
 *   takes; fused ReLU or not; 1 and 2 threads; batches 1, 3 and 5) and nowhere else (fp32 layers,
 *   1x1, fewer than 16 channels, layers a Winograd takes).
 * - Two runs give the same bits (resume in bf16 rests on it).
 * - cpu_wino3.c's F(4x4, 3x3) with bf16 point products (3x3 stride-1 bf16 layers): within a stated
 *   error of the fp32 reference, far from the fp32 Winograd's own (so bf16 did run), its forward
 *   close to a double model of where it rounds; small planes run several groups per GEMM; layers
 *   oneDNN's fp32 Winograd takes in fp32 (7x7, 4x4, channels in 16s) come here in bf16.
 * - Linear layers' GEMMs in bf16 (cpu_gemm_bf16.c): each of the three shapes against the reference
 *   on rounded operands, the same bits at 1 and 2 threads, fp32 below 2^26 multiply-adds; in a
 *   model (the zoo's mlp), the layer large enough goes bf16 in forward and backward, the lazy
 *   backend giving the CPU's bits. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/bf16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "models/zoo.h"
#include "nn/layer.h"
#include "nn/model.h"
#include "test_util.h"

enum { MAX_OC = 192 };
static const double tol = 2e-6;
/* Winograd F(4x4, 3x3) with bf16 point products (the transforms and sums fp32): its error against
 * the fp32 reference, rms over each result and worst relative to its largest value. The
 * transforms' coefficients (up to 5 in BT, 8 in AT) magnify each operand's rounding (2^-9 at
 * most): measured here 1.0-3.1% rms (the most at 4x4, whose one tile per sample is mostly
 * border), 7.2% worst (bf16 direct: ~0.25% rms), against ~1e-6 for the fp32 Winograd. A dropped
 * or doubled rounding, a transposed operand or a wrong stride gives errors of order 1. */
static const double wino_rms_tol = 0.04, wino_worst_tol = 0.1;

/* A copy of p rounded to bf16 (to nearest even: core/bf16.h, as oneDNN's reorder). */
static ch_real *rounded(const ch_real *p, size_t n)
{
    ch_real *r = malloc(sizeof(ch_real) * (n ? n : 1));
    assert_non_null(r);
    for (size_t i = 0; i < n; i++) r[i] = ch_bf16_to_float(ch_bf16_from_float(p[i]));
    return r;
}

static ch_conv_desc shaped(ch_conv_desc d)
{
    d.oh = ch_window_out(d.h, d.kh, d.stride, d.pad);
    d.ow = ch_window_out(d.w, d.kw, d.stride, d.pad);
    return d;
}

typedef struct conv_case {
    ch_conv_desc d;
    int n, threads;
    size_t xs, ys, wl;
    ch_real *x, *w, *b, *dy;   /* the fixture */
    ch_real *xr, *wr, *dyr;    /* rounded to bf16 */
} conv_case;

static conv_case case_make(ch_conv_desc d, int n, int threads)
{
    conv_case c = { .d = shaped(d), .n = n, .threads = threads };
    c.xs = (size_t)n * d.c * d.h * d.w;
    c.ys = (size_t)n * d.oc * c.d.oh * c.d.ow;
    c.wl = (size_t)d.oc * d.c * d.kh * d.kw;
    c.x = tu_uniform(c.xs, 11), c.w = tu_uniform(c.wl, 12), c.b = tu_uniform((size_t)d.oc, 13);
    c.dy = tu_uniform(c.ys, 14);
    c.xr = rounded(c.x, c.xs), c.wr = rounded(c.w, c.wl), c.dyr = rounded(c.dy, c.ys);
    return c;
}

static void case_free(conv_case *c)
{
    free(c->x), free(c->w), free(c->b), free(c->dy), free(c->xr), free(c->wr), free(c->dyr);
}

/* The CPU table's three passes on the fixture (dy masked in place with a fused ReLU). */
typedef struct conv_out {
    ch_real *y, *dy, *dx, *dw, db[MAX_OC];
} conv_out;

static conv_out run_cpu(const conv_case *c)
{
    const ch_kernels *k = ch_kernels_cpu();
    ch_kctx kc = { .nthreads = c->threads, .cache = ch_cpu_kcache_create() };
    assert_non_null(kc.cache);
    const size_t wsz = k->conv2d_workspace(&kc, &c->d, c->n);
    kc.ws = malloc(sizeof(ch_real) * (wsz ? wsz : 1)), kc.ws_len = wsz;
    conv_out o = { .y = malloc(sizeof(ch_real) * c->ys), .dy = malloc(sizeof(ch_real) * c->ys),
                   .dx = malloc(sizeof(ch_real) * c->xs), .dw = malloc(sizeof(ch_real) * c->wl) };
    assert_true(kc.ws && o.y && o.dy && o.dx && o.dw);
    /* The workspace is NaNs before each pass: none may read what it did not write */
    const size_t ws_bytes = sizeof(ch_real) * wsz;
    memcpy(o.dy, c->dy, sizeof(ch_real) * c->ys);
    memset(o.y, 0xff, sizeof(ch_real) * c->ys);   /* and the outputs: each pass writes all of its own */
    memset(o.dx, 0xff, sizeof(ch_real) * c->xs);
    memset(kc.ws, 0xff, ws_bytes);
    k->conv2d_forward(&kc, &c->d, c->n, c->x, c->w, c->b, o.y);
    memset(kc.ws, 0xff, ws_bytes);
    k->conv2d_backward_weights(&kc, &c->d, c->n, c->x, o.y, o.dy, o.dw, o.db);
    memset(kc.ws, 0xff, ws_bytes);
    k->conv2d_backward_data(&kc, &c->d, c->n, o.dy, c->w, o.dx);
    free(kc.ws);
    ch_cpu_kcache_free(kc.cache);
    return o;
}

static void out_free(conv_out *o) { free(o->y), free(o->dy), free(o->dx), free(o->dw); }

/* The reference table's passes on (x, w, dy), with y (the bf16 pass's, so that the same outputs
 * mask a fused ReLU's dy) given. */
static conv_out run_ref(const conv_case *c, const ch_real *x, const ch_real *w, const ch_real *dy,
                        const ch_real *y)
{
    const ch_kernels *k = ch_kernels_ref();
    ch_kctx rk = { .nthreads = 1 };
    conv_out o = { .y = malloc(sizeof(ch_real) * c->ys), .dy = malloc(sizeof(ch_real) * c->ys),
                   .dx = malloc(sizeof(ch_real) * c->xs), .dw = malloc(sizeof(ch_real) * c->wl) };
    assert_true(o.y && o.dy && o.dx && o.dw);
    memcpy(o.dy, dy, sizeof(ch_real) * c->ys);
    k->conv2d_forward(&rk, &c->d, c->n, x, w, c->b, o.y);
    k->conv2d_backward_weights(&rk, &c->d, c->n, x, y, o.dy, o.dw, o.db);
    k->conv2d_backward_data(&rk, &c->d, c->n, o.dy, w, o.dx);
    return o;
}

static double worst(const conv_case *c, const conv_out *a, const conv_out *b)
{
    double e = tu_max_norm_err(a->y, b->y, c->ys);
    const double parts[] = { tu_max_norm_err(a->dx, b->dx, c->xs), tu_max_norm_err(a->dw, b->dw, c->wl),
                             tu_max_norm_err(a->db, b->db, (size_t)c->d.oc) };
    for (int i = 0; i < 3; i++)
        e = tu_worse(e, parts[i]);
    return e;
}

static void check_case(ch_conv_desc d, int n, int threads)
{
    conv_case c = case_make(d, n, threads);
    const ch_kctx kt = { .nthreads = threads };
    if (d.kh == 1 && d.kw == 1)   /* the path is taken: cpu_conv_bf16p.c's, or oneDNN's bf16 direct */
        assert_true(ch_cpu_conv_bf16p_workspace(&kt, &c.d, n) > 0);
    else
        assert_true(ch_cpu_conv_bf16_workspace(&kt, &c.d, n) > 0);
    if ((long)d.oh * d.ow <= 14 * 14)   /* and the weight gradient by im2col and bf16 GEMMs */
        assert_true(ch_cpu_conv_bf16w_workspace(&kt, &c.d, n) > 0);
    conv_out got = run_cpu(&c);
    conv_out exact = run_ref(&c, c.xr, c.wr, c.dyr, got.y), plain = run_ref(&c, c.x, c.w, c.dy, got.y);
    const double e = worst(&c, &got, &exact), from_fp32 = worst(&c, &got, &plain);
    if (e >= tol || from_fp32 <= 1e-4)
        fprintf(stderr, "%d@%dx%d -> %d k%d s%d relu %d n %d threads %d: %.3g from the bf16 reference, "
                "%.3g from fp32\n", d.c, d.h, d.w, d.oc, d.kh, d.stride, d.relu, n, threads, e, from_fp32);
    assert_true(e < tol);
    assert_true(from_fp32 > 1e-4);
    /* The masked dy the pass leaves is dy's, unrounded (backward data reads it, in fp32 callers too). */
    for (size_t i = 0; i < c.ys; i++) assert_true(got.dy[i] == (got.y[i] > 0 || !d.relu ? c.dy[i] : 0));
    conv_out again = run_cpu(&c);
    assert_true(worst(&c, &got, &again) == 0 && tu_max_norm_err(got.y, again.y, c.ys) == 0);
    out_free(&got), out_free(&exact), out_free(&plain), out_free(&again);
    case_free(&c);
}

static void bf16_passes_match_the_rounded_reference(void **state)
{
    (void)state;
    const ch_conv_desc cases[] = {
        { .c = 16, .h = 9, .w = 7, .oc = 32, .kh = 3, .kw = 3, .stride = 2, .pad = 1, .bf16 = true },
        { .c = 24, .h = 8, .w = 8, .oc = 16, .kh = 3, .kw = 3, .stride = 2, .pad = 1, .bf16 = true },
        { .c = 16, .h = 11, .w = 11, .oc = 48, .kh = 5, .kw = 5, .stride = 2, .pad = 2, .bf16 = true },
        { .c = 32, .h = 2, .w = 2, .oc = 32, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int relu = 0; relu < 2; relu++)
            for (int t = 1; t <= 2; t++)
                for (int n = 1; n <= 5; n += 2) {
                    ch_conv_desc d = cases[i];
                    d.relu = relu;
                    check_case(d, n, t);
                }
}

/* The weight gradient by im2col and bf16 GEMMs (cpu_conv_bf16w.c), which takes the layers above
 * (every output plane there is at most 14x14), over several chunks of samples: at 28x28 -> 14x14 a
 * chunk holds 6 samples (1024 columns), so 13 samples are 6 + 6 + 1 (zero-padded) on one thread
 * and 6, 6 + 1 on two. The same rounded reference; a chunk's GEMM that overwrote instead of
 * adding, or a short chunk's stale columns, would be off by O(1). Larger planes keep oneDNN's. */
static void bf16_weight_gradient_in_chunks(void **state)
{
    (void)state;
    ch_conv_desc d = shaped((ch_conv_desc){ .c = 16, .h = 28, .w = 28, .oc = 16, .kh = 3, .kw = 3,
                                            .stride = 2, .pad = 1, .bf16 = true });
    for (int t = 1; t <= 2; t++) {
        assert_true(ch_cpu_conv_bf16w_workspace(&(ch_kctx){ .nthreads = t }, &d, 13) > 0);
        for (int relu = 0; relu < 2; relu++) {
            d.relu = relu;
            check_case(d, 13, t);
        }
    }
    /* Output rows of 12 or more split each input row into its even and odd columns (rows_split):
     * 3x3 on rows of 32 (both halves of the row read, 16 outputs), and 5x5 with pad 2, whose taps
     * move the phases by -1, 0 and +1 lanes, on rows of 31 (the last lane past the row); and 3x3
     * with pad 2 on rows of 32, 17 outputs: one more than a vector, the gather's. */
    const ch_conv_desc split[] = {
        { .c = 16, .h = 23, .w = 32, .oc = 16, .kh = 3, .kw = 3, .stride = 2, .pad = 1, .bf16 = true },
        { .c = 16, .h = 23, .w = 31, .oc = 16, .kh = 5, .kw = 5, .stride = 2, .pad = 2, .bf16 = true },
        { .c = 16, .h = 19, .w = 32, .oc = 16, .kh = 3, .kw = 3, .stride = 2, .pad = 2, .bf16 = true },
    };
    for (int i = 0; i < 3; i++) check_case(shaped(split[i]), 3, 2);
    ch_conv_desc big = shaped((ch_conv_desc){ .c = 16, .h = 30, .w = 30, .oc = 16, .kh = 3, .kw = 3,
                                              .stride = 2, .pad = 1, .bf16 = true });   /* 15x15 */
    assert_true(ch_cpu_conv_bf16_workspace(&(ch_kctx){ .nthreads = 1 }, &big, 4) > 0);
    assert_true(ch_cpu_conv_bf16w_workspace(&(ch_kctx){ .nthreads = 1 }, &big, 4) == 0);
    check_case(big, 3, 2);   /* oneDNN's pass, held to the same reference */
    big.bf16 = false;
    assert_true(ch_cpu_conv_bf16w_workspace(&(ch_kctx){ .nthreads = 1 }, &big, 4) == 0);
}

/* 1x1 strided layers (resnet18's shortcuts) in bf16 (cpu_conv_bf16p.c, the weight gradient by
 * cpu_conv_bf16w.c): the same rounded reference, over several chunks (28x28 -> 14x14: 6 samples a
 * chunk, 13 samples 6 + 6 + 1 on one thread), odd planes whose last row and column no output
 * reads, and stride 3. dx is NaNs before the pass: every element is written, 0 off the stride's
 * positions. Stride 1, fp32, too few channels or larger planes keep im2col + sgemm. */
static void bf16_pointwise_strided_layers(void **state)
{
    (void)state;
    const ch_conv_desc cases[] = {
        { .c = 16, .h = 28, .w = 28, .oc = 32, .kh = 1, .kw = 1, .stride = 2, .bf16 = true },
        { .c = 24, .h = 9, .w = 7, .oc = 16, .kh = 1, .kw = 1, .stride = 2, .bf16 = true },
        { .c = 16, .h = 10, .w = 11, .oc = 20, .kh = 1, .kw = 1, .stride = 3, .bf16 = true },
    };
    for (int i = 0; i < 3; i++)
        for (int t = 1; t <= 2; t++)
            for (int relu = 0; relu < 2; relu++) {
                ch_conv_desc d = cases[i];
                d.relu = relu;
                check_case(d, i == 0 ? 13 : 3, t);
            }
    const ch_kctx one = { .nthreads = 1 };
    ch_conv_desc d = shaped(cases[0]);
    d.stride = 1, d = shaped(d);   /* pointwise at stride 1 (and a 28x28 plane) */
    assert_true(ch_cpu_conv_bf16p_workspace(&one, &d, 4) == 0);
    d = shaped(cases[0]), d.bf16 = false;
    assert_true(ch_cpu_conv_bf16p_workspace(&one, &d, 4) == 0 && ch_cpu_conv_bf16w_workspace(&one, &d, 4) == 0);
    d = shaped(cases[0]), d.c = 8;
    assert_true(ch_cpu_conv_bf16p_workspace(&one, &d, 4) == 0);
    d = cases[0], d.h = d.w = 30, d = shaped(d);   /* 15x15 outputs */
    assert_true(ch_cpu_conv_bf16p_workspace(&one, &d, 4) == 0 && ch_cpu_conv_bf16w_workspace(&one, &d, 4) == 0);
}

/* Where bf16 is not the faster, or not asked for, the layer keeps its fp32 path. */
static void bf16_only_where_it_wins(void **state)
{
    (void)state;
    const ch_conv_desc strided = { .c = 16, .h = 9, .w = 9, .oc = 32, .kh = 3, .kw = 3, .stride = 2,
                                   .pad = 1, .bf16 = true };
    ch_conv_desc d = shaped(strided);
    const ch_kctx one = { .nthreads = 1 };
    assert_true(ch_cpu_conv_bf16_workspace(&one, &d, 4) > 0);
    /* resnet18's first stride-2 layer: the planner's workspace holds the bf16 passes' (short, they
     * would decline to fp32; at 9x9 im2col's is the larger anyway) */
    ch_conv_desc big = { .c = 64, .h = 28, .w = 28, .oc = 128, .kh = 3, .kw = 3, .stride = 2,
                         .pad = 1, .bf16 = true };
    big = shaped(big);
    assert_true(ch_cpu_conv_bf16_workspace(&one, &big, 8) > 0);
    assert_true(ch_cpu_conv2d_workspace(&one, &big, 8) >= ch_cpu_conv_bf16_workspace(&one, &big, 8));
    d.bf16 = false;   /* fp32 */
    assert_true(ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
    d = shaped(strided), d.c = 8;   /* too few channels in */
    assert_true(ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
    d = shaped(strided), d.oc = 8;   /* too few out */
    assert_true(ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
    d = strided, d.kh = d.kw = 1, d.pad = 0, d = shaped(d);   /* 1x1 */
    assert_true(ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
    d = strided, d.stride = 1, d = shaped(d);   /* 3x3 stride 1 at 9x9: a Winograd's */
    assert_true(ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
    d = strided, d.groups = 2, d = shaped(d);   /* grouped: cpu_conv_group.c */
    assert_true(ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
    /* 32 channels at 14x14, stride 1: cohort's own F(4x4, 3x3) (cpu_wino3.c), not oneDNN's */
    d = strided, d.c = d.oc = 32, d.h = d.w = 14, d.stride = 1, d = shaped(d);
    assert_true(ch_cpu_wino3_workspace(&one, &d, 4) > 0 && ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
    /* 5x5, stride 1: F(3x3, 5x5) (cpu_wino5.c) */
    d = strided, d.kh = d.kw = 5, d.pad = 2, d.stride = 1, d = shaped(d);
    assert_true(ch_cpu_wino5_workspace(&one, &d, 4) > 0 && ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
}

/* sqrt(mean (a - b)^2) / sqrt(mean b^2). */
static double rms_err(const ch_real *a, const ch_real *b, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return r > 0 ? sqrt(e / r) : sqrt(e);
}

/* The CPU table's passes on c's fixture as an fp32 layer (d.bf16 cleared). */
static conv_out run_fp32(const conv_case *c)
{
    conv_case f = *c;
    f.d.bf16 = false;
    return run_cpu(&f);
}

typedef struct wino_errs {
    double rms[3], worst[3];   /* y, dx, dw against the fp32 reference on the unrounded operands */
} wino_errs;

static wino_errs errs_of(const conv_case *c, const conv_out *got, const conv_out *ref)
{
    const size_t len[3] = { c->ys, c->xs, c->wl };
    const ch_real *a[3] = { got->y, got->dx, got->dw }, *b[3] = { ref->y, ref->dx, ref->dw };
    wino_errs e;
    for (int i = 0; i < 3; i++) e.rms[i] = rms_err(a[i], b[i], len[i]), e.worst[i] = tu_max_norm_err(a[i], b[i], len[i]);
    return e;
}

static void wino_case(ch_conv_desc d, int n, int threads, bool positive_x)
{
    conv_case c = case_make(d, n, threads);
    if (positive_x)   /* ReLU'd inputs: a mean the transforms' large coefficients carry */
        for (size_t i = 0; i < c.xs; i++) c.x[i] = c.x[i] < 0 ? -c.x[i] : c.x[i];
    assert_true(ch_cpu_wino3_in_bf16(&c.d));
    conv_out got = run_cpu(&c), ref = run_ref(&c, c.x, c.w, c.dy, got.y), fp32 = run_fp32(&c);
    conv_out ref32 = run_ref(&c, c.x, c.w, c.dy, fp32.y);   /* a fused ReLU masks by each run's own y */
    const wino_errs e = errs_of(&c, &got, &ref), f = errs_of(&c, &fp32, &ref32);
    for (int i = 0; i < 3; i++) {
        if (e.rms[i] >= wino_rms_tol || e.worst[i] >= wino_worst_tol || e.rms[i] <= 10 * f.rms[i])
            fprintf(stderr, "%d@%dx%d -> %d relu %d n %d threads %d %s: rms %.3g worst %.3g (fp32 %.3g)\n", d.c,
                    d.h, d.w, d.oc, d.relu, n, threads, (const char *[]){ "y", "dx", "dw" }[i], e.rms[i],
                    e.worst[i], f.rms[i]);
        assert_true(e.rms[i] < wino_rms_tol && e.worst[i] < wino_worst_tol);
        assert_true(e.rms[i] > 10 * f.rms[i]);   /* bf16 products, not the fp32 path */
    }
    conv_out again = run_cpu(&c);
    assert_true(worst(&c, &got, &again) == 0 && tu_max_norm_err(got.y, again.y, c.ys) == 0);
    out_free(&got), out_free(&ref), out_free(&fp32), out_free(&ref32), out_free(&again);
    case_free(&c);
}

/* F(4x4, 3x3)'s forward done here in double with cpu_wino3.c's matrices, the transformed weights
 * and input tiles rounded to bf16 (ties to even) before their products: what the kernel computes,
 * but for the order of its fp32 sums. That order flips an operand's rounding now and then (the
 * transforms cancel, so fp32 and double land either side of a rounding boundary; ~3% of outputs
 * move, measured 0.047% rms, 0.37% worst from the model) where the full bf16 error is 2.3% rms;
 * the bounds, 0.3% rms and 1.5% worst, sit between. Pins where the rounding happens and how. */
static const double WG[6][3] = { { 1.0 / 4, 0, 0 },          { -1.0 / 6, -1.0 / 6, -1.0 / 6 },
                                 { -1.0 / 6, 1.0 / 6, -1.0 / 6 }, { 1.0 / 24, 1.0 / 12, 1.0 / 6 },
                                 { 1.0 / 24, -1.0 / 12, 1.0 / 6 }, { 0, 0, 1 } };
static const double WBT[6][6] = { { 4, 0, -5, 0, 1, 0 },  { 0, -4, -4, 1, 1, 0 }, { 0, 4, -4, -1, 1, 0 },
                                  { 0, -2, -1, 2, 1, 0 }, { 0, 2, -1, -2, 1, 0 }, { 0, 4, 0, -5, 0, 1 } };
static const double WAT[4][6] = { { 1, 1, 1, 1, 1, 0 }, { 0, 1, -1, 2, -2, 0 }, { 0, 1, 1, 4, 4, 0 },
                                  { 0, 1, -1, 8, -8, 1 } };

static double bf16_of(double v) { return ch_bf16_to_float(ch_bf16_from_float((float)v)); }

/* out (6x6) = bf16(L in R), L 6 x k, in k x k, R = L^T. */
static void sandwich_bf16(const double *l, int k, const double *in, double out[6][6])
{
    double t[6][6] = { { 0 } };
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < k; j++)
            for (int a = 0; a < k; a++) t[i][j] += l[i * k + a] * in[a * k + j];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) {
            double v = 0;
            for (int b = 0; b < k; b++) v += t[i][b] * l[j * k + b];
            out[i][j] = bf16_of(v);
        }
}

static void wino3_bf16_forward_model(const conv_case *c, ch_real *y)
{
    const ch_conv_desc *d = &c->d;
    const int ty = (d->oh + 3) / 4, tx = (d->ow + 3) / 4;
    double(*u)[6][6] = malloc(sizeof(double[6][6]) * (size_t)d->oc * d->c);
    assert_non_null(u);
    for (int o = 0; o < d->oc; o++)
        for (int ci = 0; ci < d->c; ci++) {
            double g[9];
            for (int e = 0; e < 9; e++) g[e] = c->w[((size_t)o * d->c + ci) * 9 + e];
            sandwich_bf16(&WG[0][0], 3, g, u[(size_t)o * d->c + ci]);
        }
    for (int s = 0; s < c->n; s++)
        for (int p = 0; p < ty * tx; p++) {
            const int r0 = p / tx * 4 - d->pad, c0 = p % tx * 4 - d->pad;
            double m[6][6][64] = { { { 0 } } };
            assert_true(d->oc <= 64);
            for (int ci = 0; ci < d->c; ci++) {
                double win[36], v[6][6];
                for (int a = 0; a < 6; a++)
                    for (int b = 0; b < 6; b++) {
                        const int r = r0 + a, q = c0 + b;
                        win[a * 6 + b] = r < 0 || r >= d->h || q < 0 || q >= d->w ? 0
                                         : c->x[(((size_t)s * d->c + ci) * d->h + r) * d->w + q];
                    }
                /* V = BT d B: the sandwich with L = BT */
                double t[6][6] = { { 0 } };
                for (int i = 0; i < 6; i++)
                    for (int j = 0; j < 6; j++)
                        for (int a = 0; a < 6; a++) t[i][j] += WBT[i][a] * win[a * 6 + j];
                for (int i = 0; i < 6; i++)
                    for (int j = 0; j < 6; j++) {
                        double acc = 0;
                        for (int b = 0; b < 6; b++) acc += t[i][b] * WBT[j][b];
                        v[i][j] = bf16_of(acc);
                    }
                for (int o = 0; o < d->oc; o++)
                    for (int i = 0; i < 6; i++)
                        for (int j = 0; j < 6; j++) m[i][j][o] += u[(size_t)o * d->c + ci][i][j] * v[i][j];
            }
            for (int o = 0; o < d->oc; o++)
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) {
                        double acc = 0;
                        for (int a = 0; a < 6; a++)
                            for (int b = 0; b < 6; b++) acc += WAT[i][a] * m[a][b][o] * WAT[j][b];
                        const int r = p / tx * 4 + i, q = p % tx * 4 + j;
                        if (r < d->oh && q < d->ow)
                            y[(((size_t)s * d->oc + o) * d->oh + r) * d->ow + q] = (ch_real)(acc + c->b[o]);
                    }
        }
    free(u);
}

/* Planes of 9x11 (9 tile positions a sample: one group per GEMM run), 7x7 (4: runs of 2 groups)
 * and 4x4 (1: runs of 10); 37 and 40 samples make runs shorter than the rest and a group with 5
 * or 8 lanes live. */
static void wino3_bf16_rounds_where_it_should(void **state)
{
    (void)state;
    const struct { int h, w, n1, n2; } shapes[] = { { 9, 11, 3, 17 }, { 7, 7, 5, 40 }, { 4, 4, 3, 37 } };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int t = 1; t <= 2; t++) {
        const ch_conv_desc d = { .c = 24, .h = shapes[i].h, .w = shapes[i].w, .oc = 40, .kh = 3, .kw = 3,
                                 .stride = 1, .pad = 1, .bf16 = true };
        conv_case c = case_make(d, t == 1 ? shapes[i].n1 : shapes[i].n2, t);
        conv_out got = run_cpu(&c);
        ch_real *model = malloc(sizeof(ch_real) * c.ys);
        assert_non_null(model);
        wino3_bf16_forward_model(&c, model);
        const double e = tu_max_norm_err(got.y, model, c.ys), r = rms_err(got.y, model, c.ys);
        if (e >= 1.5e-2 || r >= 3e-3)
            fprintf(stderr, "wino3 bf16 forward %dx%d n %d: %.3g from the model (rms %.3g)\n", d.h, d.w, c.n, e, r);
        assert_true(e < 1.5e-2 && r < 3e-3);
        free(model), out_free(&got), case_free(&c);
    }
}

/* cpu_wino3.c's F(4x4, 3x3) with bf16 point products, against the fp32 reference: bounded, and
 * far from the fp32 path's error (the products are bf16). Channel counts off 16 (oneDNN's
 * Winograd leaves them to cohort's; pairs of channels off 16 too), planes with clipped tiles, 17 samples (a second group with
 * one lane live), ReLU'd and zero-mean inputs. */
static void wino3_bf16_products_within_tolerance(void **state)
{
    (void)state;
    const ch_conv_desc cases[] = {
        { .c = 24, .h = 9, .w = 11, .oc = 40, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
        { .c = 40, .h = 14, .w = 14, .oc = 24, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
        /* 360 channel pairs: the weights' transform ends on 8 of a vector's 16 lanes */
        { .c = 20, .h = 9, .w = 11, .oc = 18, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int relu = 0; relu < 2; relu++)
            for (int t = 1; t <= 2; t++) {
                ch_conv_desc d = cases[i];
                d.relu = relu;
                wino_case(d, t == 1 ? 3 : 17, t, relu);
            }
    /* Runs of several groups per GEMM (7x7: 2, 4x4: 10), the last one short */
    const ch_conv_desc small[] = {
        { .c = 24, .h = 7, .w = 7, .oc = 40, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
        { .c = 40, .h = 4, .w = 4, .oc = 24, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
    };
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
        for (int t = 1; t <= 2; t++) wino_case(small[i], 37, t, t == 2);
}

/* Layers oneDNN's fp32 Winograd takes in fp32 (channels in 16s, 7x7 and 4x4 planes) go to cohort's
 * bf16 products in bf16, all three passes; the fp32 layer stays oneDNN's. */
static void wino_bf16_takes_onednn_layers(void **state)
{
    (void)state;
    const int planes[] = { 7, 4 };
    for (int i = 0; i < 2; i++) {
        ch_conv_desc d = { .c = 32, .h = planes[i], .w = planes[i], .oc = 32, .kh = 3, .kw = 3, .stride = 1,
                           .pad = 1 };
        d = shaped(d);
        const ch_kctx one = { .nthreads = 1 };
        assert_true(ch_cpu_wino_workspace(&one, &d, 5) > 0);   /* fp32: oneDNN's */
        d.bf16 = true;
        assert_true(ch_cpu_wino_workspace(&one, &d, 5) == 0 && ch_cpu_wino3_in_bf16(&d));
        conv_case c = case_make(d, 21, 2);
        conv_out got = run_cpu(&c), fp32 = run_fp32(&c), ref = run_ref(&c, c.x, c.w, c.dy, got.y);
        conv_out ref32 = run_ref(&c, c.x, c.w, c.dy, fp32.y);
        const wino_errs e = errs_of(&c, &got, &ref), f = errs_of(&c, &fp32, &ref32);
        for (int k = 0; k < 3; k++)
            assert_true(e.rms[k] < wino_rms_tol && e.worst[k] < wino_worst_tol && e.rms[k] > 10 * f.rms[k]);
        out_free(&got), out_free(&fp32), out_free(&ref), out_free(&ref32);
        case_free(&c);
    }
}

/* A Linear layer's three GEMMs through the CPU table's gemm_bf16 (cpu_gemm_bf16.c), as linear.c
 * calls them: the forward adding onto bias rows (x W^T), backward weights with A transposed
 * (dy^T x) and backward data (dy W). */
typedef struct gemm_shape {
    bool ta, tb, accumulate;
    int m, n, k;
} gemm_shape;

static size_t stored(int rows, int cols) { return (size_t)rows * cols; }

/* C for s: gemm_bf16 (bf16 on) or the table k's gemm on (a, b), C starting from c0. */
static ch_real *gemm_run(const ch_kernels *k, bool bf16, gemm_shape s, const ch_real *a,
                         const ch_real *b, const ch_real *c0, int threads)
{
    ch_kctx kc = { .nthreads = threads, .cache = ch_cpu_kcache_create() };
    assert_non_null(kc.cache);
    const size_t wsz = bf16 ? k->gemm_bf16_workspace(&kc, s.ta, s.tb, s.m, s.n, s.k, s.n, s.accumulate) : 0;
    kc.ws = malloc(sizeof(ch_real) * (wsz ? wsz : 1)), kc.ws_len = wsz;
    ch_real *c = malloc(sizeof(ch_real) * stored(s.m, s.n));
    assert_true(kc.ws && c);
    memcpy(c, c0, sizeof(ch_real) * stored(s.m, s.n));
    const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    if (bf16)
        k->gemm_bf16(&kc, s.ta, s.tb, s.m, s.n, s.k, a, lda, b, ldb, s.accumulate, c, s.n);
    else
        k->gemm(&kc, s.ta, s.tb, s.m, s.n, s.k, 1, a, lda, b, ldb, s.accumulate ? 1 : 0, c, s.n);
    free(kc.ws);
    ch_cpu_kcache_free(kc.cache);
    return c;
}

/* conv2d_forward_bf16 on case c: y rounded to bf16 as it is written, the bits of conv2d_forward's y
 * rounded (to nearest even: core/bf16.h), for odd sizes, remainders of samples (n not a multiple of
 * 16) and columns (7-wide rows), with a bias, with and without a fused ReLU, both thread counts. */
static void conv_out_bf16_case(ch_conv_desc d, int n, int threads)
{
    conv_case c = case_make(d, n, threads);
    const ch_kernels *k = ch_kernels_cpu();
    ch_kctx kc = { .nthreads = threads, .cache = ch_cpu_kcache_create() };
    assert_true(k->conv2d_out_bf16(&kc, &c.d, n));
    const size_t wsz = k->conv2d_workspace(&kc, &c.d, n);
    kc.ws = malloc(sizeof(ch_real) * wsz), kc.ws_len = wsz;
    ch_real *y = malloc(sizeof(ch_real) * c.ys);
    uint16_t *h = malloc(sizeof(uint16_t) * c.ys);
    assert_true(kc.cache && kc.ws && y && h);
    k->conv2d_forward(&kc, &c.d, n, c.x, c.w, c.b, y);
    k->conv2d_forward_bf16(&kc, &c.d, n, c.x, c.w, c.b, h);
    size_t off = 0, changed = 0, nonzero = 0;
    for (size_t i = 0; i < c.ys; i++) {
        off += h[i] != ch_bf16_from_float(y[i]);
        changed += ch_bf16_to_float(h[i]) != y[i];
        nonzero += y[i] != 0;
    }
    if (off) fprintf(stderr, "%d@%dx%d -> %d n %d threads %d: %zu of %zu outputs not y rounded\n", d.c, d.h,
                     d.w, d.oc, n, threads, off, c.ys);
    assert_true(off == 0);
    assert_true(changed > nonzero / 2 && nonzero > c.ys / 3);   /* rounded, not values that fit */
    free(y), free(h), free(kc.ws);
    ch_cpu_kcache_free(kc.cache);
    case_free(&c);
}

/* F(4x4, 3x3)'s bf16 layers at odd sizes: channels off 16, rows of 11, 7 and 3 values (shorter
 * than the transposes' blocks of 8: read and written under a mask). */
static const ch_conv_desc wino_odd[] = {
    { .c = 24, .h = 9, .w = 11, .oc = 40, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
    { .c = 32, .h = 7, .w = 7, .oc = 48, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
    { .c = 16, .h = 2, .w = 3, .oc = 24, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
    /* 64 channels and more: the backward passes run apart (wino_grads.h, apart_faster) */
    { .c = 64, .h = 5, .w = 6, .oc = 72, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true },
};
enum { WINO_ODD = sizeof wino_odd / sizeof wino_odd[0] };

/* run on each of n cases at batch 17 (a group and one sample) and, with a fused ReLU (the kernels'
 * contracts hold with one too), at batch 3, on 1 and 2 threads. */
static void each_case(const ch_conv_desc *cases, size_t n, void (*run)(ch_conv_desc d, int n, int threads))
{
    for (size_t i = 0; i < n; i++)
        for (int t = 1; t <= 2; t++) {
            ch_conv_desc d = cases[i];
            run(d, 17, t);
            d.relu = true;
            run(d, 3, t);
        }
}

/* A bf16 path that neither oneDNN's layers (a strided 3x3 with 32 channels), the 5x5 Winograd's
 * nor an fp32 layer takes. */
static void not_taken_by(bool (*takes)(const ch_kctx *kc, const ch_conv_desc *d, int n))
{
    const ch_kctx kc = { .nthreads = 2 };
    const ch_conv_desc strided = shaped((ch_conv_desc){ .c = 32, .h = 14, .w = 14, .oc = 64, .kh = 3, .kw = 3,
                                                        .stride = 2, .pad = 1, .bf16 = true });
    const ch_conv_desc five = shaped((ch_conv_desc){ .c = 16, .h = 14, .w = 14, .oc = 32, .kh = 5, .kw = 5,
                                                     .stride = 1, .pad = 2, .bf16 = true });
    ch_conv_desc fp32 = shaped(wino_odd[1]);
    fp32.bf16 = false;
    assert_false(takes(&kc, &strided, 8));
    assert_false(takes(&kc, &five, 8));
    assert_false(takes(&kc, &fp32, 8));
}

/* The im2col layers that write their output in bf16: a resnet18 stem (one channel in, 7x7
 * stride 2) and a 1x1 layer. */
static const ch_conv_desc im2col_cases[] = {
    { .c = 1, .h = 21, .w = 19, .oc = 16, .kh = 7, .kw = 7, .stride = 2, .pad = 3, .bf16 = true },
    { .c = 24, .h = 6, .w = 5, .oc = 40, .kh = 1, .kw = 1, .stride = 1, .pad = 0, .bf16 = true },
    { .c = 16, .h = 9, .w = 7, .oc = 24, .kh = 1, .kw = 1, .stride = 2, .pad = 0, .bf16 = true },   /* bf16p */
};

/* The convolutions that write their output in bf16 for a BatchNorm (graph/exec.c): F(4x4, 3x3)'s
 * bf16 layers, whose unpacking rounds, and the im2col ones, which round from the GEMM's scratch;
 * oneDNN's, the 5x5 Winograd's and fp32 layers keep fp32 outputs, a stem planned fp32 too. */
static void conv_output_in_bf16(void **state)
{
    (void)state;
    each_case(wino_odd, WINO_ODD, conv_out_bf16_case);
    each_case(im2col_cases, sizeof im2col_cases / sizeof im2col_cases[0], conv_out_bf16_case);
    not_taken_by(ch_kernels_cpu()->conv2d_out_bf16);
    ch_conv_desc stem32 = shaped(im2col_cases[0]);
    stem32.bf16 = false;
    const ch_kctx kc = { .nthreads = 2 };
    assert_false(ch_kernels_cpu()->conv2d_out_bf16(&kc, &stem32, 8));
}

/* A fixture's convolution with its input kept in bf16: the kernels and their scratch. */
typedef struct xh_run {
    const ch_kernels *k;
    ch_kctx kc;
    uint16_t *xh;   /* c.x rounded: c.xr's bits, in half the bytes */
} xh_run;

static xh_run xh_run_make(const conv_case *c)
{
    xh_run r = { .k = ch_kernels_cpu(), .kc = { .nthreads = c->threads, .cache = ch_cpu_kcache_create() } };
    const size_t wsz = r.k->conv2d_workspace(&r.kc, &c->d, c->n);
    r.kc.ws = malloc(sizeof(ch_real) * wsz), r.kc.ws_len = wsz;
    r.xh = malloc(sizeof(uint16_t) * c->xs);
    assert_true(r.kc.cache && r.kc.ws && r.xh);
    for (size_t i = 0; i < c->xs; i++) r.xh[i] = ch_bf16_from_float(c->x[i]);
    return r;
}

static void xh_run_free(xh_run *r)
{
    free(r->kc.ws), free(r->xh);
    ch_cpu_kcache_free(r->kc.cache);
}

/* Both backward passes of case c, from c.xr in fp32 (xh NULL: conv2d_backward, or the two apart
 * where it declines) or from xh, with dx where with_dx, into o (o.y given; dy copied from c.dy
 * first, a fused ReLU masks it in place). */
static void backward_of(const xh_run *r, const conv_case *c, const uint16_t *xh, bool with_dx, conv_out *o)
{
    memcpy(o->dy, c->dy, sizeof(ch_real) * c->ys);
    ch_real *dx = with_dx ? o->dx : NULL;
    if (xh)
        r->k->conv2d_backward_of_bf16(&r->kc, &c->d, c->n, xh, o->y, o->dy, c->w, dx, o->dw, o->db);
    else if (!r->k->conv2d_backward(&r->kc, &c->d, c->n, c->xr, o->y, o->dy, c->w, dx, o->dw, o->db)) {
        r->k->conv2d_backward_weights(&r->kc, &c->d, c->n, c->xr, o->y, o->dy, o->dw, o->db);
        if (dx) r->k->conv2d_backward_data(&r->kc, &c->d, c->n, o->dy, c->w, dx);
    }
}

static void same_grads(const conv_case *c, const conv_out *a, const conv_out *b, bool dx)
{
    assert_memory_equal(a->dy, b->dy, sizeof(ch_real) * c->ys);
    assert_memory_equal(a->dw, b->dw, sizeof(ch_real) * c->wl);
    assert_memory_equal(a->db, b->db, sizeof(ch_real) * (size_t)c->d.oc);
    if (dx) assert_memory_equal(a->dx, b->dx, sizeof(ch_real) * c->xs);
}

/* conv2d_forward_of_bf16 and conv2d_backward_of_bf16 on case c: from x kept in bf16, the bits of
 * the fp32-input passes on x widened (c.xr, not c.x: the rounding is the caller's, at the write),
 * y in fp32 and rounded to bf16, dy as a fused ReLU masks it, dx, dw and db; the backward also
 * with dx NULL, and with x stored in dx's own bytes (the passes then run apart, x read first). */
static void conv_x_bf16_case(ch_conv_desc d, int n, int threads)
{
    conv_case c = case_make(d, n, threads);
    xh_run r = xh_run_make(&c);
    assert_true(r.k->conv2d_x_bf16(&r.kc, &c.d, n));
    conv_out want = { .y = malloc(sizeof(ch_real) * c.ys), .dy = malloc(sizeof(ch_real) * c.ys),
                      .dx = malloc(sizeof(ch_real) * c.xs), .dw = malloc(sizeof(ch_real) * c.wl) };
    conv_out got = { .y = malloc(sizeof(ch_real) * c.ys), .dy = malloc(sizeof(ch_real) * c.ys),
                     .dx = malloc(sizeof(ch_real) * c.xs), .dw = malloc(sizeof(ch_real) * c.wl) };
    uint16_t *yh = malloc(sizeof(uint16_t) * c.ys), *yh2 = malloc(sizeof(uint16_t) * c.ys);
    assert_true(want.y && want.dy && want.dx && want.dw && got.y && got.dy && got.dx && got.dw && yh && yh2);
    r.k->conv2d_forward(&r.kc, &c.d, n, c.xr, c.w, c.b, want.y);
    r.k->conv2d_forward_of_bf16(&r.kc, &c.d, n, r.xh, c.w, c.b, got.y, NULL);
    assert_memory_equal(got.y, want.y, sizeof(ch_real) * c.ys);
    r.k->conv2d_forward_bf16(&r.kc, &c.d, n, c.xr, c.w, c.b, yh);
    r.k->conv2d_forward_of_bf16(&r.kc, &c.d, n, r.xh, c.w, c.b, NULL, yh2);
    assert_memory_equal(yh2, yh, sizeof(uint16_t) * c.ys);
    backward_of(&r, &c, NULL, true, &want);
    backward_of(&r, &c, r.xh, true, &got);
    same_grads(&c, &got, &want, true);
    backward_of(&r, &c, r.xh, false, &got);
    same_grads(&c, &got, &want, false);
    memset(got.dx, 0, sizeof(ch_real) * c.xs);
    memcpy(got.dx, r.xh, sizeof(uint16_t) * c.xs);   /* x in dx's first half */
    memcpy(got.dy, c.dy, sizeof(ch_real) * c.ys);
    r.k->conv2d_backward_of_bf16(&r.kc, &c.d, n, (const uint16_t *)got.dx, got.y, got.dy, c.w, got.dx, got.dw,
                                 got.db);
    same_grads(&c, &got, &want, true);
    /* The fixture's x does not fit bf16: an input read in fp32 would show. */
    size_t changed = 0;
    for (size_t i = 0; i < c.xs; i++) changed += c.x[i] != c.xr[i];
    assert_true(changed > c.xs / 2);
    out_free(&want), out_free(&got), free(yh), free(yh2);
    xh_run_free(&r);
    case_free(&c);
}

/* The convolutions that take their input in bf16 (graph/exec.c, a BatchNorm + ReLU output read by
 * one of them): F(4x4, 3x3)'s, at sizes with remainders of samples and of columns (rows of 11, of
 * 7, of 3: widened under a mask), with a bias, with and without a fused ReLU, both thread
 * counts; no other kernel takes one. */
static void conv_input_in_bf16(void **state)
{
    (void)state;
    const ch_conv_desc four = { .c = 16, .h = 4, .w = 4, .oc = 16, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .bf16 = true };
    each_case(wino_odd, WINO_ODD, conv_x_bf16_case);
    each_case(&four, 1, conv_x_bf16_case);
    const ch_kernels *k = ch_kernels_cpu();
    not_taken_by(k->conv2d_x_bf16);
    const ch_kctx kc = { .nthreads = 2 };
    const ch_conv_desc stem = shaped(im2col_cases[0]);
    const ch_conv_desc grouped = shaped((ch_conv_desc){ .c = 32, .h = 14, .w = 14, .oc = 32, .kh = 3, .kw = 3,
                                                        .stride = 1, .pad = 1, .groups = 32, .bf16 = true });
    assert_false(k->conv2d_x_bf16(&kc, &stem, 8));
    assert_false(k->conv2d_x_bf16(&kc, &grouped, 8));
    assert_false(k->conv2d_x_bf16(&kc, &wino_odd[1], 0));
}

/* conv2d_backward_dy_bf16 on case c: from dy kept in bf16, the bits of conv2d_backward on dy
 * widened (c.dyr), x in fp32 or in bf16, dx made or not, and x stored in dx's own bytes (the
 * passes then run apart). A layer with a fused ReLU (whose backward masks dy in place) is not
 * taken. */
static void conv_dy_bf16_case(ch_conv_desc d, int n, int threads)
{
    conv_case c = case_make(d, n, threads);
    xh_run r = xh_run_make(&c);
    if (c.d.relu) {
        assert_false(r.k->conv2d_dy_bf16(&r.kc, &c.d, n));
        xh_run_free(&r), case_free(&c);
        return;
    }
    assert_true(r.k->conv2d_dy_bf16(&r.kc, &c.d, n));
    conv_out want = { .y = malloc(sizeof(ch_real) * c.ys), .dy = malloc(sizeof(ch_real) * c.ys),
                      .dx = malloc(sizeof(ch_real) * c.xs), .dw = malloc(sizeof(ch_real) * c.wl) };
    conv_out got = { .dx = malloc(sizeof(ch_real) * c.xs), .dw = malloc(sizeof(ch_real) * c.wl) };
    uint16_t *dyh = malloc(sizeof(uint16_t) * c.ys);
    assert_true(want.y && want.dy && want.dx && want.dw && got.dx && got.dw && dyh);
    for (size_t i = 0; i < c.ys; i++) dyh[i] = ch_bf16_from_float(c.dy[i]);
    conv_case widened = c;
    widened.dy = c.dyr;
    backward_of(&r, &widened, NULL, true, &want);
    for (int from16 = 0; from16 <= 1; from16++) {
        const ch_real *xf = from16 ? NULL : c.xr;
        const uint16_t *xh = from16 ? r.xh : NULL;
        r.k->conv2d_backward_dy_bf16(&r.kc, &c.d, n, xf, xh, dyh, c.w, got.dx, got.dw, got.db);
        assert_memory_equal(got.dx, want.dx, sizeof(ch_real) * c.xs);
        assert_memory_equal(got.dw, want.dw, sizeof(ch_real) * c.wl);
        assert_memory_equal(got.db, want.db, sizeof(ch_real) * (size_t)c.d.oc);
        memset(got.dw, 0, sizeof(ch_real) * c.wl);
        r.k->conv2d_backward_dy_bf16(&r.kc, &c.d, n, xf, xh, dyh, c.w, NULL, got.dw, got.db);
        assert_memory_equal(got.dw, want.dw, sizeof(ch_real) * c.wl);
        if (from16) memcpy(got.dx, r.xh, sizeof(uint16_t) * c.xs);   /* x in dx's own bytes */
        else memcpy(got.dx, c.xr, sizeof(ch_real) * c.xs);
        r.k->conv2d_backward_dy_bf16(&r.kc, &c.d, n, from16 ? NULL : got.dx, from16 ? (const uint16_t *)got.dx : NULL,
                                     dyh, c.w, got.dx, got.dw, got.db);
        assert_memory_equal(got.dx, want.dx, sizeof(ch_real) * c.xs);
        assert_memory_equal(got.dw, want.dw, sizeof(ch_real) * c.wl);
    }
    /* dy in dx's bytes is declined, nothing written (the data's pass would write one sample's dx
     * over another's dy), by both bf16 backward entries. */
    memcpy(got.dx, dyh, sizeof(uint16_t) * c.ys);
    memset(got.dw, 0, sizeof(ch_real) * c.wl);
    assert_false(ch_cpu_wino3_backward_dy_bf16(&r.kc, &c.d, n, c.xr, NULL, (const uint16_t *)got.dx, c.w, got.dx,
                                               got.dw, got.db));
    assert_false(ch_cpu_wino3_backward_of_bf16(&r.kc, &c.d, n, r.xh, NULL, got.dx, c.w, got.dx, got.dw, got.db));
    assert_memory_equal(got.dx, dyh, sizeof(uint16_t) * c.ys);
    for (size_t i = 0; i < c.wl; i++) assert_true(got.dw[i] == 0);
    /* The fixture's dy does not fit bf16: a dy read unrounded would show. */
    size_t changed = 0;
    for (size_t i = 0; i < c.ys; i++) changed += c.dy[i] != c.dyr[i];
    assert_true(changed > c.ys / 2);
    out_free(&want), free(got.dx), free(got.dw), free(dyh);
    xh_run_free(&r);
    case_free(&c);
}

/* The convolutions that read their output's gradient in bf16 (graph/exec.c, a kept BatchNorm
 * input's gradient): F(4x4, 3x3)'s without a fused ReLU, at the odd sizes of conv_input_in_bf16,
 * with a bias, both thread counts; no other kernel takes one. */
static void conv_grad_in_bf16(void **state)
{
    (void)state;
    each_case(wino_odd, WINO_ODD, conv_dy_bf16_case);
    const ch_kernels *k = ch_kernels_cpu();
    not_taken_by(k->conv2d_dy_bf16);
    const ch_kctx kc = { .nthreads = 2 };
    const ch_conv_desc stem = shaped(im2col_cases[0]);
    assert_false(k->conv2d_dy_bf16(&kc, &stem, 8));
    assert_false(k->conv2d_dy_bf16(&kc, &wino_odd[1], 0));
}

/* Per-channel scale and shift for the BatchNorm + ReLU tests: about half the values below 0. */
enum { BN_C = 5 };
static const ch_real bn_scale[BN_C] = { 0.5f, 1.25f, -2, 3, 0.75f }, bn_shift[BN_C] = { -0.1f, 0.3f, 0, -1.5f, 0.2f };

/* bn_backward_data_to_bf16: the dx of bn_relu_backward_data (with scale) or of
 * batchnorm_backward_data_bf16 (without) from the same bf16 input, rounded to bf16, bit for bit;
 * written over that input; on planes of 49 and of 6 (the small planes' path); NaN stays NaN. */
static void bn_grad_in_bf16(void **state)
{
    (void)state;
    enum { N = 3, C = BN_C };
    const int hws[2] = { 49, 6 };
    const ch_kernels *k = ch_kernels_cpu();
    const ch_kctx kc = { .nthreads = 2 };
    const ch_real mean[C] = { 0.1f, -0.2f, 0.3f, 0, 0.05f }, invstd[C] = { 1.5f, 0.8f, 2, 1.1f, 0.9f };
    const ch_real gamma[C] = { 0.9f, 1.2f, -0.7f, 1.1f, 0.6f };
    const double sums[2 * C] = { 0.3, -1.2, 0.8, 2.5, -0.4, 1.7, 0.2, -0.9, 0.6, -2.1 };
    for (int i = 0; i < 2; i++) {
        const int hw = hws[i], len = N * C * hw;
        const double count = 0.75 * N * hw;
        ch_real *x = tu_uniform((size_t)len, 41 + (uint64_t)i), *dy = tu_uniform((size_t)len, 43 + (uint64_t)i);
        ch_real *dx = malloc(sizeof(ch_real) * (size_t)len);
        uint16_t *xh = malloc(sizeof(uint16_t) * (size_t)len), *dxh = malloc(sizeof(uint16_t) * (size_t)len);
        uint16_t *plain = malloc(sizeof(uint16_t) * (size_t)len);
        assert_true(dx && xh && dxh && plain);
        dy[5] = NAN;
        for (int relu = 0; relu <= 1; relu++) {
            for (int j = 0; j < len; j++) xh[j] = ch_bf16_from_float(x[j]);
            if (relu)
                k->bn_relu_backward_data(&kc, N, C, hw, NULL, xh, dy, mean, invstd, gamma, bn_scale, bn_shift, sums,
                                         sums + C, count, dx);
            else
                k->batchnorm_backward_data_bf16(&kc, N, C, hw, xh, dy, mean, invstd, gamma, sums, sums + C, count, dx);
            k->bn_backward_data_to_bf16(&kc, N, C, hw, xh, dy, mean, invstd, gamma, relu ? bn_scale : NULL,
                                        relu ? bn_shift : NULL, sums, sums + C, count, dxh);
            size_t off = 0, gated = 0, inexact = 0;
            for (int j = 0; j < len; j++) {
                off += dxh[j] != ch_bf16_from_float((float)dx[j]);
                gated += relu && dxh[j] != plain[j];
                inexact += ch_bf16_to_float(dxh[j]) != dx[j];
                if (!relu) plain[j] = dxh[j];
            }
            assert_true(off == 0 && inexact > (size_t)len / 2);
            assert_true(relu ? gated > (size_t)len / 4 : isnan(ch_bf16_to_float(dxh[5])));   /* the mask counts */
            k->bn_backward_data_to_bf16(&kc, N, C, hw, xh, dy, mean, invstd, gamma, relu ? bn_scale : NULL,
                                        relu ? bn_shift : NULL, sums, sums + C, count, xh);   /* over its input */
            assert_memory_equal(xh, dxh, sizeof(uint16_t) * (size_t)len);
        }
        free(x), free(dy), free(dx), free(xh), free(dxh), free(plain);
    }
}

/* The weights' products split by rows of dU (wino_body.h, split_layer): a layer whose partial dU
 * is 4 MiB or more (168 -> 176 channels: 36 x 176 x 168 floats) on 4x4 planes, 37 samples on 2
 * threads (3 groups: 1 and 2 a thread, chunks of 16 and 32 columns). All three passes within the
 * bf16 bounds of the reference; both passes at once giving the bits of the two apart; every GEMM
 * shape of the split made by the workspace query, none by the passes. */
static void wino3_bf16_split_weights(void **state)
{
    (void)state;
    const ch_conv_desc d = { .c = 168, .h = 4, .w = 4, .oc = 176, .kh = 3, .kw = 3, .stride = 1, .pad = 1,
                             .bf16 = true };
    wino_case(d, 37, 2, true);
    conv_x_bf16_case(d, 37, 2);
    conv_case c = case_make(d, 37, 2);
    xh_run r = xh_run_make(&c);
    const struct ch_gb_cache *gemms = ch_cpu_kcache_gemms(r.kc.cache);
    const size_t planned = ch_cpu_gb_cache_entries(gemms);
    conv_out o = { .y = malloc(sizeof(ch_real) * c.ys), .dy = malloc(sizeof(ch_real) * c.ys),
                   .dx = malloc(sizeof(ch_real) * c.xs), .dw = malloc(sizeof(ch_real) * c.wl) };
    assert_true(planned > 0 && o.y && o.dy && o.dx && o.dw);
    r.k->conv2d_forward(&r.kc, &c.d, c.n, c.xr, c.w, c.b, o.y);
    backward_of(&r, &c, NULL, true, &o);
    backward_of(&r, &c, r.xh, false, &o);
    assert_int_equal(ch_cpu_gb_cache_entries(gemms), planned);
    out_free(&o);
    xh_run_free(&r);
    case_free(&c);
}

/* bn_relu_forward_to_bf16: bn_relu_forward's y rounded to bf16, bit for bit, from x in fp32 (and
 * keeping it in bf16) or from bf16 x, on planes of 49 and of 6 (the small planes' path), with
 * shifts that put about half the values below 0; NaN stays NaN. */
static void bn_relu_output_in_bf16(void **state)
{
    (void)state;
    enum { N = 3, C = BN_C };
    const int hws[2] = { 49, 6 };
    const ch_kernels *k = ch_kernels_cpu();
    const ch_kctx kc = { .nthreads = 2 };
    for (int i = 0; i < 2; i++) {
        const int hw = hws[i], len = N * C * hw;
        ch_real *x = tu_uniform((size_t)len, 31 + (uint64_t)i), *y = malloc(sizeof(ch_real) * (size_t)len);
        uint16_t *xh = malloc(sizeof(uint16_t) * (size_t)len), *keep = malloc(sizeof(uint16_t) * (size_t)len);
        uint16_t *keep2 = malloc(sizeof(uint16_t) * (size_t)len), *yh = malloc(sizeof(uint16_t) * (size_t)len);
        assert_true(y && xh && keep && keep2 && yh);
        x[7] = NAN;
        for (int j = 0; j < len; j++) xh[j] = ch_bf16_from_float(x[j]);
        for (int from16 = 0; from16 <= 1; from16++) {
            const ch_real *xf = from16 ? NULL : x;
            k->bn_relu_forward(&kc, N, C, hw, xf, xh, bn_scale, bn_shift, y, from16 ? NULL : keep);
            k->bn_relu_forward_to_bf16(&kc, N, C, hw, xf, xh, bn_scale, bn_shift, yh, from16 ? NULL : keep2);
            size_t off = 0, zeros = 0, inexact = 0;
            for (int j = 0; j < len; j++) {
                off += yh[j] != ch_bf16_from_float((float)y[j]);
                zeros += y[j] == 0;
                inexact += ch_bf16_to_float(yh[j]) != y[j];
            }
            assert_true(off == 0 && zeros > (size_t)len / 4 && zeros < (size_t)len * 3 / 4 && inexact > (size_t)len / 4);
            assert_true(isnan(ch_bf16_to_float(yh[7])));
            if (!from16) assert_memory_equal(keep2, keep, sizeof(uint16_t) * (size_t)len);
        }
        free(x), free(y), free(xh), free(keep), free(keep2), free(yh);
    }
}

/* Whether this CPU's answer, by the rule ch_cpu_bf16_products states: Intel without AMX keeps fp32
 * products (its bf16 dot products run no faster than its FMAs), every other CPU multiplies in bf16.
 * The maker from /proc/cpuinfo, not from ch_cpu_vendor, which the rule itself calls. */
static bool products_expected_here(void)
{
    char isa[32], vendor[64];
    ch_cpu_bf16_native(isa, sizeof isa);
    assert_true(tu_cpuinfo_vendor(vendor, sizeof vendor));
    return strcmp(isa, "avx512_core_amx") == 0 || strcmp(vendor, "GenuineIntel") != 0;
}

/* The rest of the program's setting, also after a failed check above left another. */
static int products_on(void **state)
{
    (void)state;
    return setenv("COHORT_BF16_PRODUCTS", "on", 1);
}

/* Where the CPU's bf16 products are no faster, --precision bf16 keeps fp32 products
 * (ch_cpu_bf16_products); COHORT_BF16_PRODUCTS=on|off overrides that, and the rest of this program
 * runs with on. Off: no convolution multiplies in bf16, the Linear GEMM's workspace is 0, the
 * three passes of a bf16 layer are the fp32 layer's bits, and F(4x4, 3x3)'s layers (fp32 products
 * now) still write a BatchNorm's input in bf16 as y rounded. Auto: the CPU's rule. */
static void products_follow_the_cpu_unless_told(void **state)
{
    (void)state;
    assert_int_equal(ch_cpu_bf16_products_mode(NULL), -1);
    assert_int_equal(ch_cpu_bf16_products_mode(""), -1);
    assert_int_equal(ch_cpu_bf16_products_mode("auto"), -1);
    assert_int_equal(ch_cpu_bf16_products_mode("on"), 1);
    assert_int_equal(ch_cpu_bf16_products_mode("off"), 0);
    assert_int_equal(ch_cpu_bf16_products_mode("On"), -2);
    assert_int_equal(ch_cpu_bf16_products_mode("1"), -2);
    const ch_kernels *k = ch_kernels_cpu();
    const ch_kctx kc = { .nthreads = 2 };
    const ch_conv_desc wino = { .c = 32, .h = 14, .w = 14, .oc = 48, .kh = 3, .kw = 3, .stride = 1,
                                .pad = 1, .bf16 = true };
    const ch_conv_desc strided = shaped((ch_conv_desc){ .c = 32, .h = 14, .w = 14, .oc = 64, .kh = 3,
                                                        .kw = 3, .stride = 2, .pad = 1, .bf16 = true });
    const ch_conv_desc w14 = shaped(wino);
    const bool modes[2] = { false, true };
    for (int i = 0; i < 2; i++) {
        setenv("COHORT_BF16_PRODUCTS", modes[i] ? "on" : "off", 1);
        assert_true(ch_cpu_bf16_products(NULL, 0) == modes[i]);
        assert_true(k->conv2d_in_bf16(&kc, &w14, 8) == modes[i]);
        assert_true(k->conv2d_in_bf16(&kc, &strided, 8) == modes[i]);
        assert_true((k->gemm_bf16_workspace(&kc, false, true, 256, 512, 512, 512, true) > 0) == modes[i]);
        assert_true(k->conv2d_out_bf16(&kc, &w14, 8));
    }
    setenv("COHORT_BF16_PRODUCTS", "off", 1);
    conv_out_bf16_case(wino, 9, 2);   /* fp32 products' y, rounded as it is unpacked */
    conv_case c = case_make(wino, 5, 2);
    conv_out got = run_cpu(&c), f32 = run_fp32(&c);
    assert_memory_equal(got.y, f32.y, sizeof(ch_real) * c.ys);
    assert_memory_equal(got.dx, f32.dx, sizeof(ch_real) * c.xs);
    assert_memory_equal(got.dw, f32.dw, sizeof(ch_real) * c.wl);
    out_free(&got), out_free(&f32);
    case_free(&c);
    setenv("COHORT_BF16_PRODUCTS", "auto", 1);
    assert_true(ch_cpu_bf16_products(NULL, 0) == products_expected_here());
}

/* batchnorm_stats_bf16: the statistics of the widened values, bit for bit (planes of 49: a
 * remainder past the lanes), from half the bytes. */
static void batchnorm_stats_of_bf16(void **state)
{
    (void)state;
    enum { N = 5, C = 6, HW = 49, LEN = N * C * HW };
    ch_real *x = tu_uniform(LEN, 21);
    uint16_t h[LEN];
    for (int i = 0; i < LEN; i++) {
        h[i] = ch_bf16_from_float(3 + 2 * x[i]);   /* a mean far from 0, as after a convolution */
        x[i] = ch_bf16_to_float(h[i]);
    }
    double m32[C], v32[C], m16[C], v16[C];
    const ch_kctx kc = { .nthreads = 2 };
    ch_kernels_cpu()->batchnorm_stats(&kc, N, C, HW, x, m32, v32);
    ch_kernels_cpu()->batchnorm_stats_bf16(&kc, N, C, HW, h, m16, v16);
    assert_memory_equal(m16, m32, sizeof m32);
    assert_memory_equal(v16, v32, sizeof v32);
    for (int ch = 0; ch < C; ch++) assert_true(m32[ch] > 2 && m32[ch] < 4 && v32[ch] > 0.1);
    free(x);
}

static void linear_gemm_case(gemm_shape s)
{
    const size_t al = stored(s.m, s.k), bl = stored(s.n, s.k), cl = stored(s.m, s.n);
    ch_real *a = tu_uniform(al, 21), *b = tu_uniform(bl, 22), *c0 = tu_uniform(cl, 23);
    ch_real *ar = rounded(a, al), *br = rounded(b, bl);
    const ch_kernels *cpu = ch_kernels_cpu(), *ref = ch_kernels_ref();
    assert_true(cpu->gemm_bf16_workspace(&(ch_kctx){ .nthreads = 2 }, s.ta, s.tb, s.m, s.n, s.k, s.n,
                                         s.accumulate) > 0);   /* the path is taken */
    ch_real *exact = gemm_run(ref, false, s, ar, br, c0, 1), *plain = gemm_run(ref, false, s, a, b, c0, 1);
    ch_real *one = gemm_run(cpu, true, s, a, b, c0, 1), *two = gemm_run(cpu, true, s, a, b, c0, 2);
    const double e = tu_max_norm_err(two, exact, cl), from_fp32 = tu_max_norm_err(two, plain, cl);
    if (e >= tol || from_fp32 <= 1e-4)
        fprintf(stderr, "gemm ta %d tb %d acc %d %dx%dx%d: %.3g from the bf16 reference, %.3g from fp32\n",
                s.ta, s.tb, s.accumulate, s.m, s.n, s.k, e, from_fp32);
    assert_true(e < tol);
    assert_true(from_fp32 > 1e-4);
    assert_true(memcmp(one, two, sizeof(ch_real) * cl) == 0);   /* each element's sum, at any thread count */
    free(a), free(b), free(c0), free(ar), free(br), free(exact), free(plain), free(one), free(two);
}

static void linear_gemms_match_the_rounded_reference(void **state)
{
    (void)state;
    /* n 70 samples, 1030 -> 940: 67.8 M multiply-adds a pass, just past where bf16 pays */
    const int n = 70, in = 1030, out = 940;
    linear_gemm_case((gemm_shape){ .tb = true, .accumulate = true, .m = n, .n = out, .k = in });
    linear_gemm_case((gemm_shape){ .ta = true, .m = out, .n = in, .k = n });
    linear_gemm_case((gemm_shape){ .m = n, .n = in, .k = out });
}

/* Below 2^26 multiply-adds the workspace is 0 and a call gives the fp32 gemm's bits. */
static void linear_gemm_small_stays_fp32(void **state)
{
    (void)state;
    const gemm_shape s = { .tb = true, .accumulate = true, .m = 256, .n = 128, .k = 800 };
    const ch_kernels *cpu = ch_kernels_cpu();
    assert_true(cpu->gemm_bf16_workspace(&(ch_kctx){ .nthreads = 2 }, s.ta, s.tb, s.m, s.n, s.k, s.n,
                                         s.accumulate) == 0);
    const size_t cl = stored(s.m, s.n);
    ch_real *a = tu_uniform(stored(s.m, s.k), 31), *b = tu_uniform(stored(s.n, s.k), 32), *c0 = tu_uniform(cl, 33);
    ch_real *got = gemm_run(cpu, true, s, a, b, c0, 2), *fp32 = gemm_run(cpu, false, s, a, b, c0, 2);
    assert_true(memcmp(got, fp32, sizeof(ch_real) * cl) == 0);
    free(a), free(b), free(c0), free(got), free(fp32);
}

/* The zoo's mlp on 3x32x32 inputs (Flatten, Linear 3072 -> 256, ReLU, Linear 256 -> 10): its
 * parameter gradients (floats into g) after one step of n samples on backend be, planned in bf16
 * or not; *bf16_linears: how many Linear layers the plan put in bf16. */
static void mlp_step(ch_backend *be, bool bf16, int n, float *g, int *bf16_linears)
{
    ch_model *m = tu_zoo_step(be, "mlp", (ch_shape3){ 3, 32, 32 }, 5, bf16, n, g);
    *bf16_linears = m->bf16_linears;
    ch_model_free(m);
}

/* A gemm that rounds A and B to bf16 where gemm_bf16 would take the GEMM (its workspace query is
 * not 0), then runs the CPU's fp32 gemm: a model planned in fp32 on a table with it stands for what
 * bf16 should do to each of a Linear layer's passes, whichever passes linear.c sends to gemm_bf16. */
static void rounding_gemm(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, ch_real alpha,
                          const ch_real *a, int lda, const ch_real *b, int ldb, ch_real beta,
                          ch_real *c, int ldc)
{
    if (!ch_cpu_gemm_bf16_workspace(kc, ta, tb, m, n, k, ldc, beta != 0)) {
        ch_cpu_gemm(kc, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    ch_real *ar = rounded(a, (size_t)(ta ? k : m) * lda), *br = rounded(b, (size_t)(tb ? n : k) * ldb);
    ch_cpu_gemm(kc, ta, tb, m, n, k, alpha, ar, lda, br, ldb, beta, c, ldc);
    free(ar), free(br);
}

/* At batch 100 the mlp's first Linear (78.6 M multiply-adds a pass) runs in bf16 and its second
 * (0.26 M) in fp32. A step's gradients are within 1e-5 of an fp32-planned model whose gemm rounds
 * the operands of GEMMs that large (measured 2.5e-7: the same products summed in another order),
 * and more than 1e-3 from plain fp32's (measured 2.4%: the roundings flip a few hidden ReLUs); the
 * lazy backend (kernels queued, run later on scrambled memory) gives the CPU backend's bits. */
static void mlp_linear_in_bf16(void **state)
{
    (void)state;
    enum { N = 100, P = 3072 * 256 + 256 + 256 * 10 + 10 };
    ch_backend *cpu, *emu, *lazy;
    ch_err err;
    if (ch_backend_create("cpu", 0, 2, &cpu, &err) != CH_STATUS_OK ||
        ch_backend_create("cpu", 0, 2, &emu, &err) != CH_STATUS_OK ||
        ch_backend_create("lazy", 0, 2, &lazy, &err) != CH_STATUS_OK)
        fail_msg("%s", err.msg);
    ch_kernels emulated = *cpu->k;
    emulated.gemm = rounding_gemm;
    emu->k = &emulated;
    float *fp32 = malloc(sizeof(float) * P), *want = malloc(sizeof(float) * P);
    float *bf = malloc(sizeof(float) * P), *lz = malloc(sizeof(float) * P);
    assert_true(fp32 && want && bf && lz);
    int n32, nwant, nbf, nlz;
    mlp_step(cpu, false, N, fp32, &n32);
    mlp_step(emu, false, N, want, &nwant);
    mlp_step(cpu, true, N, bf, &nbf);
    mlp_step(lazy, true, N, lz, &nlz);
    assert_true(n32 == 0 && nwant == 0 && nbf == 1 && nlz == 1);
    const double e = tu_max_norm_err_f32(bf, want, P), from_fp32 = tu_max_norm_err_f32(bf, fp32, P);
    if (e >= 1e-5 || from_fp32 <= 1e-3 || getenv("SHOW"))
        fprintf(stderr, "mlp bf16 gradients: %.3g from the rounding model's, %.3g from fp32's\n", e, from_fp32);
    assert_true(e < 1e-5);
    assert_true(from_fp32 > 1e-3);
    assert_true(memcmp(bf, lz, sizeof(float) * P) == 0);
    free(fp32), free(want), free(bf), free(lz);
    ch_backend_free(lazy);
    ch_backend_free(emu);
    ch_backend_free(cpu);
}

int main(void)
{
    /* Without native bf16, oneDNN's AVX-512 emulation of it runs the same kernels (slower): so
     * these checks hold on CI's AVX-512 machines that lack bf16 too. Below AVX-512, skipped. */
    const int here = tu_bf16_here(false, NULL);
    if (here) return here;
    /* The bf16 kernels are what this program checks, also on a CPU whose --precision bf16 keeps
     * fp32 products (ch_cpu_bf16_products). */
    setenv("COHORT_BF16_PRODUCTS", "on", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_passes_match_the_rounded_reference),
        cmocka_unit_test(bf16_weight_gradient_in_chunks),
        cmocka_unit_test(bf16_pointwise_strided_layers),
        cmocka_unit_test(bf16_only_where_it_wins),
        cmocka_unit_test(wino3_bf16_products_within_tolerance),
        cmocka_unit_test(wino3_bf16_rounds_where_it_should),
        cmocka_unit_test(wino3_bf16_split_weights),
        cmocka_unit_test(wino_bf16_takes_onednn_layers),
        cmocka_unit_test(conv_output_in_bf16),
        cmocka_unit_test(conv_input_in_bf16),
        cmocka_unit_test(bn_relu_output_in_bf16),
        cmocka_unit_test(conv_grad_in_bf16),
        cmocka_unit_test(bn_grad_in_bf16),
        cmocka_unit_test_teardown(products_follow_the_cpu_unless_told, products_on),
        cmocka_unit_test(batchnorm_stats_of_bf16),
        cmocka_unit_test(linear_gemms_match_the_rounded_reference),
        cmocka_unit_test(linear_gemm_small_stays_fp32),
        cmocka_unit_test(mlp_linear_in_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
