/* --precision bf16's convolutions (cpu_dnnl_conv.c), on a CPU with native bf16; elsewhere the
 * program exits 77 (skipped, never passed). The rounding they rely on (oneDNN's fp32 -> bf16
 * reorder) is checked on every CPU, in test_kernels.
 * - Each pass is held to the reference table run on the operands rounded to bf16 (x and w
 *   forward, dy and w backward data, x and dy backward weights): the products are exact in fp32,
 *   so what remains is the order of fp32 sums, within 2e-6 of each result's scale. An operand
 *   whose rounding were dropped would be off by ~1e-3 (the fixtures are not bf16 values: the test
 *   also requires the plain fp32 reference to differ by more than 1e-4).
 * - The path is taken where it should be (stride 2, 5x5 stride 2, a 3x3 2x2 plane no Winograd
 *   takes; fused ReLU or not; 1 and 2 threads; batches 1, 3 and 5) and nowhere else (fp32 layers,
 *   1x1, fewer than 16 channels, layers a Winograd takes).
 * - Two runs give the same bits (resume in bf16 rests on it). */
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
#include "kernels/kernels.h"
#include "nn/layer.h"
#include "test_util.h"

enum { MAX_OC = 64 };
static const double tol = 2e-6;

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
    memcpy(o.dy, c->dy, sizeof(ch_real) * c->ys);
    k->conv2d_forward(&kc, &c->d, c->n, c->x, c->w, c->b, o.y);
    k->conv2d_backward_weights(&kc, &c->d, c->n, c->x, o.y, o.dy, o.dw, o.db);
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
        if (parts[i] > e) e = parts[i];
    return e;
}

static void check_case(ch_conv_desc d, int n, int threads)
{
    conv_case c = case_make(d, n, threads);
    assert_true(ch_cpu_conv_bf16_workspace(&(ch_kctx){ .nthreads = threads }, &c.d, n) > 0);   /* the path is taken */
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

/* Where bf16 is not the faster, or not asked for, the layer keeps its fp32 path. */
static void bf16_only_where_it_wins(void **state)
{
    (void)state;
    const ch_conv_desc strided = { .c = 16, .h = 9, .w = 9, .oc = 32, .kh = 3, .kw = 3, .stride = 2,
                                   .pad = 1, .bf16 = true };
    ch_conv_desc d = shaped(strided);
    const ch_kctx one = { .nthreads = 1 };
    assert_true(ch_cpu_conv_bf16_workspace(&one, &d, 4) > 0);
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
    assert_true(ch_cpu_wino3_workspace(&d, 4, 1) > 0 && ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
    /* 5x5, stride 1: F(3x3, 5x5) (cpu_wino5.c) */
    d = strided, d.kh = d.kw = 5, d.pad = 2, d.stride = 1, d = shaped(d);
    assert_true(ch_cpu_wino5_workspace(&d, 4, 1) > 0 && ch_cpu_conv_bf16_workspace(&one, &d, 4) == 0);
}

int main(void)
{
    char isa[32];
    if (!ch_cpu_bf16_native(isa, sizeof isa)) {
        printf("skipped: this CPU has no native bf16 (oneDNN's effective ISA: %s)\n", isa);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_passes_match_the_rounded_reference),
        cmocka_unit_test(bf16_only_where_it_wins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
