/* GFLOP/s (and ms) of the CPU backend's convolution passes on the 3x3 layer shapes of
 * bench/speed_models.py's ResNet-20 (28x28 input: 16, 32 and 64 channels, and its two stride-2
 * layers), resnet18's (its first stage at 56x56 and at reference program D's 28x28, its second at
 * 14x14, and the stride-2 first layers of its stages 2-4 at 28x28) and mnist-cnn's 5x5 second
 * layer and MobileNetV2's depthwise layers (mbv2.*): forward, backward data, backward weights, the best of the first argument's runs (5), and
 * where the layer has it the one pass that does both backward passes (a training step's,
 * conv2d_backward) next to the two apart; a second argument runs that shape alone; a third sets
 * the threads (1: OpenMP held to one, as `--threads 1` does: oneDNN's batched GEMMs would
 * otherwise take every core); a fourth the batch (64 by default, 16 for resnet18's 56x56); a fifth,
 * "bf16", runs the passes as `--precision bf16` does (bf16 products where the layer takes them, on a
 * CPU with native bf16; the same fp32 passes elsewhere). A FLOP
 * is counted as in the direct sum (2 * oc * c * kh * kw * oh * ow per sample), so Winograd's
 * figures are "effective" ones and padding or garbage columns gain nothing. Compare two builds by
 * linking this against each one's libcohort.a. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "core/bf16.h"
#include "core/clock.h"
#include "core/rng.h"
#include "kernels/cpu/cpu.h"

static void fill(float *p, size_t n, uint64_t seed)
{
    ch_rng r;
    ch_rng_init(&r, seed, 0, 0);
    for (size_t k = 0; k < n; k++) p[k] = (float)(ch_rng_uniform(&r) - 0.5);
}

/* --precision bf16's layers whose input the BatchNorm + ReLU before them writes in bf16: forward
 * (y in bf16 for the BatchNorm after, as in training) and both backward passes, from x in fp32 and
 * from x in bf16, interleaved, best of reps. */
static void time_x_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, int reps, const float *x, float *y,
                        float *dy, const float *w, const float *b, float *dx, float *dw, float *db,
                        const char *name)
{
    const size_t xl = (size_t)n * d->c * d->h * d->w, yl = (size_t)n * d->oc * d->oh * d->ow;
    uint16_t *xh = malloc(sizeof(uint16_t) * xl), *yh = malloc(sizeof(uint16_t) * yl);
    if (!xh || !yh) {
        fprintf(stderr, "conv_kernels: out of memory\n");
        exit(1);
    }
    for (size_t k = 0; k < xl; k++) xh[k] = ch_bf16_from_float(x[k]);
    double best[4] = { 1e30, 1e30, 1e30, 1e30 };
    for (int r = 0; r < reps; r++) {
        const double t0 = ch_clock_s();
        ch_cpu_conv2d_forward_bf16(kc, d, n, x, w, b, yh);
        const double t1 = ch_clock_s();
        ch_cpu_conv2d_forward_of_bf16(kc, d, n, xh, w, b, NULL, yh);
        const double t2 = ch_clock_s();
        ch_cpu_conv2d_backward(kc, d, n, x, y, dy, w, dx, dw, db);
        const double t3 = ch_clock_s();
        ch_cpu_conv2d_backward_of_bf16(kc, d, n, xh, y, dy, w, dx, dw, db);
        const double t4 = ch_clock_s();
        const double t[4] = { t1 - t0, t2 - t1, t3 - t2, t4 - t3 };
        for (int k = 0; k < 4; k++)
            if (t[k] < best[k]) best[k] = t[k];
    }
    printf("%s x in bf16: forward %.2f ms (x in fp32 %.2f), both backward %.2f (%.2f): %.3fx\n", name,
           best[1] * 1e3, best[0] * 1e3, best[3] * 1e3, best[2] * 1e3, (best[0] + best[2]) / (best[1] + best[3]));
    free(xh), free(yh);
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    const char *only = argc > 2 ? argv[2] : NULL;   /* a shape's name: that one alone */
    const int threads = argc > 3 ? atoi(argv[3]) : 1, batch = argc > 4 ? atoi(argv[4]) : 0;
    const bool bf16 = argc > 5 && strcmp(argv[5], "bf16") == 0;
    if (argc > 5 && !bf16) {
        fprintf(stderr, "conv_kernels: the fifth argument is bf16 or nothing, not %s\n", argv[5]);
        return 1;
    }
    const struct { const char *name; int n, c, hw, oc, k, pad, stride, groups; } shapes[] = {
        { "resnet20.s1", 64, 16, 28, 16, 3, 1, 1, 1 },
        { "resnet20.s2", 64, 32, 14, 32, 3, 1, 1, 1 },
        { "resnet20.s3", 64, 64, 7, 64, 3, 1, 1, 1 },
        { "resnet18.l1", 16, 64, 56, 64, 3, 1, 1, 1 },
        { "resnet18.d1", 64, 64, 28, 64, 3, 1, 1, 1 },     /* reference program D's first stage */
        { "resnet18.l2", 64, 128, 14, 128, 3, 1, 1, 1 },   /* reference program D's second stage */
        { "resnet18.l3", 64, 256, 7, 256, 3, 1, 1, 1 },    /* its third and fourth */
        { "resnet18.l4", 64, 512, 4, 512, 3, 1, 1, 1 },
        { "mnist-cnn.c2", 100, 20, 14, 20, 5, 2, 1, 1 },   /* F(3x3, 5x5)'s */
        /* ResNet-20's stride-2 layers */
        { "resnet20.t2", 64, 16, 28, 32, 3, 1, 2, 1 },
        { "resnet20.t3", 64, 32, 14, 64, 3, 1, 2, 1 },
        /* resnet18's (reference program D, 28x28) first layer of stages 2-4, stride 2 */
        { "resnet18.s2", 64, 64, 28, 128, 3, 1, 2, 1 },
        { "resnet18.s3", 64, 128, 14, 256, 3, 1, 2, 1 },
        { "resnet18.s4", 64, 256, 7, 512, 3, 1, 2, 1 },
        /* and their 1x1 stride-2 shortcuts */
        { "resnet18.p2", 64, 64, 28, 128, 1, 0, 2, 1 },
        { "resnet18.p3", 64, 128, 14, 256, 1, 0, 2, 1 },
        { "resnet18.p4", 64, 256, 7, 512, 1, 0, 2, 1 },
        /* MobileNetV2's depthwise layers at a 28x28 input (bench/speed_models.py, batch 64) */
        { "mbv2.dw28", 64, 32, 28, 32, 3, 1, 1, 32 },
        { "mbv2.dw28s2", 64, 96, 28, 96, 3, 1, 2, 96 },
        { "mbv2.dw14", 64, 144, 14, 144, 3, 1, 1, 144 },
        { "mbv2.dw14s2", 64, 144, 14, 144, 3, 1, 2, 144 },
        { "mbv2.dw7", 64, 192, 7, 192, 3, 1, 1, 192 },
        { "mbv2.dw7s2", 64, 192, 7, 192, 3, 1, 2, 192 },
        { "mbv2.dw4", 64, 576, 4, 576, 3, 1, 1, 576 },
        { "mbv2.dw4s2", 64, 576, 4, 576, 3, 1, 2, 576 },
        { "mbv2.dw2", 64, 960, 2, 960, 3, 1, 1, 960 },
        /* ConvNeXt-style 7x7 depthwise layers at 14x14 and 7x7 */
        { "convnext.dw14", 64, 96, 14, 96, 7, 3, 1, 96 },
        { "convnext.dw7", 64, 192, 7, 192, 7, 3, 1, 192 },
    };
    if (reps < 1 || threads < 1) {
        fprintf(stderr, "conv_kernels: bad reps or threads\n");
        return 1;
    }
    omp_set_num_threads(threads);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        if (only && strcmp(only, shapes[i].name) != 0) continue;
        const int st = shapes[i].stride, ohw = (shapes[i].hw + 2 * shapes[i].pad - shapes[i].k) / st + 1;
        const ch_conv_desc d = { .c = shapes[i].c, .h = shapes[i].hw, .w = shapes[i].hw,
                                 .oc = shapes[i].oc, .kh = shapes[i].k, .kw = shapes[i].k,
                                 .stride = st, .pad = shapes[i].pad, .oh = ohw, .ow = ohw,
                                 .groups = shapes[i].groups, .bf16 = bf16 };
        const int n = batch > 0 ? batch : shapes[i].n;
        const size_t xl = (size_t)n * d.c * d.h * d.w, yl = (size_t)n * d.oc * d.oh * d.ow;
        const size_t wl = (size_t)d.oc * (d.c / d.groups) * d.kh * d.kw;
        /* A replica's kernel cache, as the trainer's: primitives made once, here. */
        ch_kctx kc = { .nthreads = threads, .cache = ch_cpu_kcache_create() };
        if (!kc.cache) {
            fprintf(stderr, "conv_kernels: the CPU kernels' cache could not be made\n");
            return 1;
        }
        const size_t ws = ch_cpu_conv2d_workspace(&kc, &d, n);
        float *x = malloc(sizeof(float) * xl), *y = malloc(sizeof(float) * yl);
        float *dy = malloc(sizeof(float) * yl), *dx = malloc(sizeof(float) * xl);
        float *w = malloc(sizeof(float) * wl), *dw = malloc(sizeof(float) * wl);
        float *b = malloc(sizeof(float) * d.oc), *db = malloc(sizeof(float) * d.oc);
        float *wsp = malloc(sizeof(float) * (ws ? ws : 1));
        if (!x || !y || !dy || !dx || !w || !dw || !b || !db || !wsp) {
            fprintf(stderr, "conv_kernels: out of memory\n");
            return 1;
        }
        fill(x, xl, 1), fill(dy, yl, 2), fill(w, wl, 3), fill(b, d.oc, 4);
        kc.ws = wsp, kc.ws_len = ws;
        double best[4] = { 1e30, 1e30, 1e30, 1e30 };
        bool both = false;
        for (int r = 0; r < reps; r++) {
            const double t0 = ch_clock_s();
            ch_cpu_conv2d_forward(&kc, &d, n, x, w, b, y);
            const double t1 = ch_clock_s();
            ch_cpu_conv2d_backward_data(&kc, &d, n, dy, w, dx);
            const double t2 = ch_clock_s();
            ch_cpu_conv2d_backward_weights(&kc, &d, n, x, y, dy, dw, db);
            const double t3 = ch_clock_s();
            /* Both backward passes in one, where the layer has that pass (a training step's). */
            both = ch_cpu_conv2d_backward(&kc, &d, n, x, y, dy, w, dx, dw, db);
            const double t4 = ch_clock_s();
            const double t[4] = { t1 - t0, t2 - t1, t3 - t2, t4 - t3 };
            for (int k = 0; k < 4; k++)
                if (t[k] < best[k]) best[k] = t[k];
        }
        const double flop = 2.0 * (double)wl * d.oh * d.ow * n;
        printf("%s fwd %.1f bwd_data %.1f bwd_weights %.1f GFLOP/s (%.2f / %.2f / %.2f ms)\n",
               shapes[i].name, flop / best[0] * 1e-9, flop / best[1] * 1e-9,
               flop / best[2] * 1e-9, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3);
        if (both)
            printf("%s both backward passes at once %.2f ms (apart %.2f): %.3fx\n", shapes[i].name,
                   best[3] * 1e3, (best[1] + best[2]) * 1e3, (best[1] + best[2]) / best[3]);
        if (bf16 && ch_cpu_conv2d_x_bf16(&kc, &d, n) && ch_cpu_conv2d_out_bf16(&kc, &d, n))
            time_x_bf16(&kc, &d, n, reps, x, y, dy, w, b, dx, dw, db, shapes[i].name);
        free(x), free(y), free(dy), free(dx), free(w), free(dw), free(b), free(db), free(wsp);
        ch_cpu_kcache_free(kc.cache);
    }
    return 0;
}
