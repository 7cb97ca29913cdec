/* The convolutions' kept weight transforms (ch_conv_desc's keep): cohort's own Winograds leave U,
 * the transformed weights, in the layer's keep for the backward after the forward, which then
 * skips making it again.
 * - The same bits with and without a keep: y, dy (masked by a fused ReLU), dx, dw and db, both
 *   backward passes at once and apart, fp32 and (where the CPU runs bf16 products, natively or
 *   by oneDNN's AVX-512 emulation) bf16 point products, 1 and 2 threads, batches with a short
 *   last group.
 * - The backward does read the kept U: zeroed after the forward, dx comes out zero.
 * - It reads it only once, and only for the same w: after a backward, or after w changed in
 *   place (an optimizer step), U is made again (a stale U would give other bits).
 * - In a model (resnet18 in fp32 and bf16), the plan keeps U for exactly the layers these
 *   Winograds run, and the step's gradients are the bits of a backend without keeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kernels.h"
#include "nn/model.h"
#include "test_util.h"

enum { KEEP_HEAD = 64 };   /* wino_body.h's WKEEP_HEAD: where U starts in a keep */

/* A layer's fixture and what its passes wrote. */
typedef struct kcase {
    ch_conv_desc d;
    int n, threads;
    size_t xs, ys, wl, keep_len;
    ch_real *x, *w, *b, *dy0;
    ch_real *y, *dy, *dx, *dw, *db;
    ch_kctx kc;
} kcase;

static kcase kcase_make(ch_conv_desc d, int n, int threads)
{
    const ch_kernels *k = ch_kernels_cpu();
    d.oh = ch_window_out(d.h, d.kh, d.stride, d.pad);
    d.ow = ch_window_out(d.w, d.kw, d.stride, d.pad);
    kcase c = { .d = d, .n = n, .threads = threads };
    c.xs = (size_t)n * d.c * d.h * d.w, c.ys = (size_t)n * d.oc * d.oh * d.ow;
    c.wl = (size_t)d.oc * d.c * d.kh * d.kw;
    c.x = tu_uniform(c.xs, 21), c.w = tu_uniform(c.wl, 22), c.b = tu_uniform((size_t)d.oc, 23);
    c.dy0 = tu_uniform(c.ys, 24);
    c.y = malloc(sizeof(ch_real) * c.ys), c.dy = malloc(sizeof(ch_real) * c.ys);
    c.dx = malloc(sizeof(ch_real) * c.xs), c.dw = malloc(sizeof(ch_real) * c.wl);
    c.db = malloc(sizeof(ch_real) * (size_t)d.oc);
    c.kc = (ch_kctx){ .nthreads = threads, .cache = ch_cpu_kcache_create() };
    const size_t wsz = k->conv2d_workspace(&c.kc, &c.d, n);
    c.kc.ws = malloc(sizeof(ch_real) * (wsz ? wsz : 1)), c.kc.ws_len = wsz;
    c.keep_len = k->conv2d_keep_bytes(&c.kc, &c.d, n);
    assert_true(c.x && c.w && c.b && c.dy0 && c.y && c.dy && c.dx && c.dw && c.db && c.kc.cache && c.kc.ws);
    return c;
}

static void kcase_free(kcase *c)
{
    free(c->x), free(c->w), free(c->b), free(c->dy0), free(c->y), free(c->dy), free(c->dx), free(c->dw);
    free(c->db), free(c->kc.ws), free(c->d.keep);
    ch_cpu_kcache_free(c->kc.cache);
}

/* A keep for c's layer, nothing in it yet (as conv_plan gives it). */
static void keep_on(kcase *c)
{
    assert_true(c->keep_len > KEEP_HEAD);
    c->d.keep = calloc(1, c->keep_len);
    assert_non_null(c->d.keep);
}

static void forward(kcase *c)
{
    ch_kernels_cpu()->conv2d_forward(&c->kc, &c->d, c->n, c->x, c->w, c->b, c->y);
}

/* Both backward passes, at once (conv2d_backward) or apart (weights, then data). */
static void backward(kcase *c, bool apart)
{
    const ch_kernels *k = ch_kernels_cpu();
    memcpy(c->dy, c->dy0, sizeof(ch_real) * c->ys);
    memset(c->dx, 0xff, sizeof(ch_real) * c->xs);
    if (!apart && k->conv2d_backward(&c->kc, &c->d, c->n, c->x, c->y, c->dy, c->w, c->dx, c->dw, c->db)) return;
    assert_true(apart);   /* these layers have the pass that does both */
    k->conv2d_backward_weights(&c->kc, &c->d, c->n, c->x, c->y, c->dy, c->dw, c->db);
    k->conv2d_backward_data(&c->kc, &c->d, c->n, c->dy, c->w, c->dx);
}

static void same_outputs(const kcase *a, const kcase *b)
{
    assert_memory_equal(a->y, b->y, sizeof(ch_real) * a->ys);
    assert_memory_equal(a->dy, b->dy, sizeof(ch_real) * a->ys);
    assert_memory_equal(a->dx, b->dx, sizeof(ch_real) * a->xs);
    assert_memory_equal(a->dw, b->dw, sizeof(ch_real) * a->wl);
    assert_memory_equal(a->db, b->db, sizeof(ch_real) * (size_t)a->d.oc);
}

/* Layers only cohort's F(4x4, 3x3) and F(3x3, 5x5) take: 24 channels (not in 16s, which oneDNN's
 * Winograd would take in fp32), planes with a short last tile, a fused ReLU or not. */
static const ch_conv_desc shapes[] = {
    { .c = 24, .h = 10, .w = 10, .oc = 40, .kh = 3, .kw = 3, .stride = 1, .pad = 1 },
    { .c = 24, .h = 9, .w = 7, .oc = 24, .kh = 3, .kw = 3, .stride = 1, .pad = 1, .relu = true },
    { .c = 24, .h = 11, .w = 11, .oc = 24, .kh = 5, .kw = 5, .stride = 1, .pad = 2 },
};

/* The precisions this CPU runs the Winograds' products in (main): fp32 always, bf16 where it can. */
static int nprec = 1;

static void same_bits_case(ch_conv_desc d, int n, int threads, bool apart)
{
    kcase plain = kcase_make(d, n, threads), kept = kcase_make(d, n, threads);
    keep_on(&kept);
    for (int step = 0; step < 2; step++) {   /* the second forward remakes what the first kept */
        forward(&plain), backward(&plain, apart);
        forward(&kept), backward(&kept, apart);
        same_outputs(&plain, &kept);
    }
    kcase_free(&plain), kcase_free(&kept);
}

static void kept_transform_gives_the_same_bits(void **state)
{
    (void)state;
    for (int p = 0; p < nprec; p++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int threads = 1; threads <= 2; threads++) {
                ch_conv_desc d = shapes[s];
                d.bf16 = p == 1;
                same_bits_case(d, 19, threads, false);
                same_bits_case(d, 19, threads, true);
            }
}

static bool all_zero(const ch_real *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] != 0) return false;
    return true;
}

/* U after the forward set to zeros: a backward that reads it writes dx = 0 (dw does not read U). */
static void zero_kept_u(kcase *c) { memset((char *)c->d.keep + KEEP_HEAD, 0, c->keep_len - KEEP_HEAD); }

static void backward_reads_the_kept_transform(void **state)
{
    (void)state;
    for (int p = 0; p < nprec; p++)
        for (int apart = 0; apart < 2; apart++) {
            ch_conv_desc d = shapes[0];
            d.bf16 = p == 1;
            kcase c = kcase_make(d, 17, 2);
            keep_on(&c);
            forward(&c);
            zero_kept_u(&c);
            backward(&c, apart);
            assert_true(all_zero(c.dx, c.xs));
            assert_false(all_zero(c.dw, c.wl));
            kcase_free(&c);
        }
}

static void kept_transform_used_once_and_for_the_same_w(void **state)
{
    (void)state;
    for (int p = 0; p < nprec; p++) {
        ch_conv_desc d = shapes[0];
        d.bf16 = p == 1;
        kcase plain = kcase_make(d, 17, 2), kept = kcase_make(d, 17, 2);
        keep_on(&kept);
        /* A second backward after one forward: U made again, not the (zeroed) kept one. */
        forward(&plain), backward(&plain, false);
        forward(&kept), backward(&kept, false);
        zero_kept_u(&kept);
        backward(&kept, false);
        same_outputs(&plain, &kept);
        /* w changed in place between the forward and the backward (every value: an optimizer
         * step): the backward makes U of the new w. */
        forward(&kept);
        for (size_t i = 0; i < plain.wl; i++) plain.w[i] = kept.w[i] = kept.w[i] * (ch_real)0.75 + (ch_real)1e-3;
        forward(&plain);   /* y of the new w, which the backward reads only for a fused ReLU */
        memcpy(kept.y, plain.y, sizeof(ch_real) * plain.ys);
        backward(&plain, false), backward(&kept, false);
        same_outputs(&plain, &kept);
        kcase_free(&plain), kcase_free(&kept);
    }
}

/* resnet18 (28x28 inputs) one step on a backend with keeps and on one without (its table's
 * conv2d_keep_bytes NULL): the same gradients; the plan keeps U for exactly the layers cohort's
 * F(4x4, 3x3) runs: in fp32 the 3x3 stride-1 ones at 28x28 and 14x14 (oneDNN's Winograd takes
 * 7x7 and 4x4), in bf16 all of them. */
static void resnet18_step_same_with_keeps(void **state)
{
    (void)state;
    enum { N = 5, P = 11175818 };
    for (int p = 0; p < nprec; p++) {
        ch_backend *with, *without;
        ch_err err;
        if (ch_backend_create("cpu", 0, 2, &with, &err) != CH_STATUS_OK ||
            ch_backend_create("cpu", 0, 2, &without, &err) != CH_STATUS_OK)
            fail_msg("%s", err.msg);
        ch_kernels none = *without->k;
        none.conv2d_keep_bytes = NULL;
        without->k = &none;
        float *a = malloc(sizeof(float) * P), *b = malloc(sizeof(float) * P);
        assert_true(a && b);
        ch_model *ma = tu_zoo_step(with, "resnet18", (ch_shape3){ 1, 28, 28 }, 4, p == 1, N, a);
        ch_model *mb = tu_zoo_step(without, "resnet18", (ch_shape3){ 1, 28, 28 }, 4, p == 1, N, b);
        print_message("resnet18 %s: %zu bytes of transformed weights kept\n", p ? "bf16" : "fp32", ma->keep_bytes);
        assert_int_equal(mb->keep_bytes, 0);
        /* 36 points of 4 layers 64 x 64, 3 of 128 x 128 (and 3 each of 256 and 512 in bf16) */
        const size_t fp32 = 36 * sizeof(float) * (4 * 64 * 64 + 3 * 128 * 128) + 7 * KEEP_HEAD;
        const size_t bf16 = 36 * 2 * (4 * 64 * 64 + 3 * (128 * 128 + 256 * 256 + 512 * 512)) + 13 * KEEP_HEAD;
        assert_int_equal(ma->keep_bytes, p == 1 ? bf16 : fp32);
        assert_memory_equal(a, b, sizeof(float) * P);
        ch_model_free(ma), ch_model_free(mb);
        free(a), free(b);
        ch_backend_free(with), ch_backend_free(without);
    }
}

int main(void)
{
    /* bf16 products natively, or by oneDNN's emulation on AVX-512 (as test_bf16); below AVX-512
     * only fp32's keeps are checked, and this says so. */
    if (tu_bf16_here(false, NULL) == 0) {
        setenv("COHORT_BF16_PRODUCTS", "on", 1);
        nprec = 2;
    } else {
        printf("test_keep: no bf16 products on this CPU: fp32's kept transforms only\n");
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kept_transform_gives_the_same_bits),
        cmocka_unit_test(backward_reads_the_kept_transform),
        cmocka_unit_test(kept_transform_used_once_and_for_the_same_w),
        cmocka_unit_test(resnet18_step_same_with_keeps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
