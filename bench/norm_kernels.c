/* Milliseconds of BatchNorm's per-channel kernels on one of resnet18's tensors (batch 256; its
 * BatchNorms at 28x28, 14x14, 7x7 and 4x4) or MobileNetV2's two smallest planes, 2 threads, the best of REPS runs (15): forward's
 * statistics and channel_affine (fp32, and keeping the input in bf16 as --precision bf16 does),
 * backward's two kernels on the fp32 input and on the kept bf16 copy. Compare two builds by linking
 * this against each one's libcohort.a (as for bench/conv_kernels.c), or read the bf16 columns
 * against the fp32 ones. Then a BatchNorm and the ReLU after it (fp32), apart (channel_affine then
 * relu_forward; relu_backward then backward's two kernels) against fused (bn_relu_*, graph/exec.c),
 * and a residual block's end, BatchNorm + sum + ReLU forward, apart (channel_affine, add in place,
 * relu_forward in place) against fused (bn_add_forward).
 *   norm_kernels [REPS [l1|l2|l3|l4|m4|m2]]   (l1: 64 x 28 x 28, the default; l4: 512 x 4 x 4;
 *   m4 and m2: MobileNetV2's 576 x 4 x 4 and 960 x 2 x 2, whose cost is per plane, not per value) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/clock.h"
#include "kernels/cpu/cpu.h"

enum { N = 256, CMAX = 960 };

static double best_ms(double t, double best) { return t * 1e3 < best ? t * 1e3 : best; }

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    const char *shape = argc > 2 ? argv[2] : "l1";
    const struct { const char *name; int c, hw; } shapes[] = {
        { "l1", 64, 28 * 28 }, { "l2", 128, 14 * 14 }, { "l3", 256, 7 * 7 }, { "l4", 512, 4 * 4 },
        { "m4", 576, 4 * 4 }, { "m2", 960, 2 * 2 },   /* MobileNetV2's (bench/speed_models.py) last stages */
    };
    int C = 0, HW = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shape, shapes[i].name) == 0) C = shapes[i].c, HW = shapes[i].hw;
    if (!C) {
        fprintf(stderr, "norm_kernels: unknown shape '%s' (l1, l2, l3, l4, m4 or m2)\n", shape);
        return 2;
    }
    const size_t len = (size_t)N * C * HW;
    float *x = malloc(sizeof(float) * len), *dy = malloc(sizeof(float) * len);
    float *y = malloc(sizeof(float) * len), *dx = malloc(sizeof(float) * len);
    uint16_t *keep = malloc(sizeof(uint16_t) * len);
    if (reps < 1 || !x || !dy || !y || !dx || !keep) {
        fprintf(stderr, "norm_kernels: bad reps or out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < len; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f, dy[i] = (float)((i * 13) % 7) / 7.0f - 0.4f;
    for (size_t i = 0; i < len; i++) keep[i] = ch_bf16_from_float(x[i]);
    float mean[CMAX], invstd[CMAX], gamma[CMAX], shift[CMAX];
    double s1[CMAX], s2[CMAX];
    for (int c = 0; c < C; c++) mean[c] = 0.01f * (float)c, invstd[c] = 1.1f, gamma[c] = 0.9f, shift[c] = 0.1f;
    const ch_kctx kc = { .nthreads = 2 };
    double t[8] = { 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30, 1e30 };
    for (int r = 0; r < reps; r++) {
        double t0 = ch_clock_s();
        ch_cpu_batchnorm_stats(&kc, N, C, HW, x, s1, s2);
        double t1 = ch_clock_s();
        t[6] = best_ms(t1 - t0, t[6]);
        ch_cpu_batchnorm_stats_bf16(&kc, N, C, HW, keep, s1, s2);
        t0 = ch_clock_s();
        t[7] = best_ms(t0 - t1, t[7]);
        ch_cpu_channel_affine(&kc, N, C, HW, x, gamma, shift, y);
        t1 = ch_clock_s();
        t[0] = best_ms(t1 - t0, t[0]);
        ch_cpu_channel_affine_keep_bf16(&kc, N, C, HW, x, gamma, shift, y, keep);
        t0 = ch_clock_s();
        t[1] = best_ms(t0 - t1, t[1]);
        ch_cpu_batchnorm_backward_reduce(&kc, N, C, HW, x, dy, mean, invstd, s1, s2);
        t1 = ch_clock_s();
        t[2] = best_ms(t1 - t0, t[2]);
        ch_cpu_batchnorm_backward_reduce_bf16(&kc, N, C, HW, keep, dy, mean, invstd, s1, s2);
        t0 = ch_clock_s();
        t[3] = best_ms(t0 - t1, t[3]);
        ch_cpu_batchnorm_backward_data(&kc, N, C, HW, x, dy, mean, invstd, gamma, s1, s2, 1e5, dx);
        t1 = ch_clock_s();
        t[4] = best_ms(t1 - t0, t[4]);
        ch_cpu_batchnorm_backward_data_bf16(&kc, N, C, HW, keep, dy, mean, invstd, gamma, s1, s2, 1e5, dx);
        t[5] = best_ms(ch_clock_s() - t1, t[5]);
    }
    /* BatchNorm + ReLU as a graph runs them: the ReLU's backward in place over dy, dx written over
     * the BatchNorm's input (both restored before each variant, untimed). */
    float *xa = malloc(sizeof(float) * len), *da = malloc(sizeof(float) * len);
    if (!xa || !da) {
        fprintf(stderr, "norm_kernels: out of memory\n");
        return 1;
    }
    double f[6] = { 1e30, 1e30, 1e30, 1e30, 1e30, 1e30 };   /* forward apart, fused; backward apart,
                                                            * fused; block end apart, fused */
    for (int r = 0; r < reps; r++) {
        double t0 = ch_clock_s();
        ch_cpu_channel_affine(&kc, N, C, HW, x, gamma, shift, y);
        ch_cpu_relu_forward(&kc, len, y, y);
        double t1 = ch_clock_s();
        f[0] = best_ms(t1 - t0, f[0]);
        ch_cpu_bn_relu_forward(&kc, N, C, HW, x, NULL, gamma, shift, y, NULL);
        f[1] = best_ms(ch_clock_s() - t1, f[1]);
        memcpy(xa, x, sizeof(float) * len), memcpy(da, dy, sizeof(float) * len);
        t0 = ch_clock_s();
        ch_cpu_relu_backward(&kc, len, y, da, da);
        ch_cpu_batchnorm_backward_reduce(&kc, N, C, HW, xa, da, mean, invstd, s1, s2);
        ch_cpu_batchnorm_backward_data(&kc, N, C, HW, xa, da, mean, invstd, gamma, s1, s2, 1e5, xa);
        f[2] = best_ms(ch_clock_s() - t0, f[2]);
        memcpy(xa, x, sizeof(float) * len), memcpy(da, dy, sizeof(float) * len);
        t0 = ch_clock_s();
        ch_cpu_bn_relu_backward_reduce(&kc, N, C, HW, xa, NULL, da, mean, invstd, gamma, shift, s1, s2);
        ch_cpu_bn_relu_backward_data(&kc, N, C, HW, xa, NULL, da, mean, invstd, gamma, gamma, shift, s1, s2, 1e5, xa);
        f[3] = best_ms(ch_clock_s() - t0, f[3]);
        t0 = ch_clock_s();   /* dy stands for the residual */
        ch_cpu_channel_affine(&kc, N, C, HW, x, gamma, shift, y);
        ch_cpu_add(&kc, len, y, dy, y);
        ch_cpu_relu_forward(&kc, len, y, y);
        t1 = ch_clock_s();
        f[4] = best_ms(t1 - t0, f[4]);
        ch_cpu_bn_add_forward(&kc, N, C, HW, x, NULL, gamma, shift, dy, true, y, NULL);
        f[5] = best_ms(ch_clock_s() - t1, f[5]);
    }
    printf("%d x %d x %d, 2 threads, best of %d\n", N, C, HW, reps);
    printf("%-24s %8s %8s\n", "kernel (ms)", "fp32", "bf16");
    printf("%-24s %8.2f %8.2f\n", "stats", t[6], t[7]);
    printf("%-24s %8.2f %8.2f\n", "channel_affine", t[0], t[1]);
    printf("%-24s %8.2f %8.2f\n", "backward_reduce", t[2], t[3]);
    printf("%-24s %8.2f %8.2f\n", "backward_data", t[4], t[5]);
    printf("%-24s %8s %8s %8s\n", "BatchNorm + ReLU (ms)", "apart", "fused", "ratio");
    printf("%-24s %8.2f %8.2f %7.2fx\n", "forward", f[0], f[1], f[0] / f[1]);
    printf("%-24s %8.2f %8.2f %7.2fx\n", "backward", f[2], f[3], f[2] / f[3]);
    printf("%-24s %8.2f %8.2f %7.2fx\n", "BN + sum + ReLU forward", f[4], f[5], f[4] / f[5]);
    free(x), free(dy), free(y), free(dx), free(keep), free(xa), free(da);
    return 0;
}
