/* Milliseconds of BatchNorm's per-channel kernels on resnet18's first-stage tensor (256 x 64 x
 * 28 x 28), 2 threads, the best of --reps runs (15): forward's channel_affine (fp32, and keeping
 * the input in bf16 as --precision bf16 does), backward's two kernels on the fp32 input and on the
 * kept bf16 copy. Compare two builds by linking this against each one's libcohort.a (as for
 * bench/conv_kernels.c), or read the bf16 columns against the fp32 ones. */
#include <stdio.h>
#include <stdlib.h>

#include "core/bf16.h"
#include "core/clock.h"
#include "kernels/cpu/cpu.h"

enum { N = 256, C = 64, HW = 28 * 28 };

static double best_ms(double t, double best) { return t * 1e3 < best ? t * 1e3 : best; }

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    const size_t len = (size_t)N * C * HW;
    float *x = malloc(sizeof(float) * len), *dy = malloc(sizeof(float) * len);
    float *y = malloc(sizeof(float) * len), *dx = malloc(sizeof(float) * len);
    uint16_t *keep = malloc(sizeof(uint16_t) * len);
    if (reps < 1 || !x || !dy || !y || !dx || !keep) {
        fprintf(stderr, "norm_kernels: bad reps or out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < len; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f, dy[i] = (float)((i * 13) % 7) / 7.0f - 0.4f;
    float mean[C], invstd[C], gamma[C], shift[C];
    double s1[C], s2[C];
    for (int c = 0; c < C; c++) mean[c] = 0.01f * (float)c, invstd[c] = 1.1f, gamma[c] = 0.9f, shift[c] = 0.1f;
    const ch_kctx kc = { .nthreads = 2 };
    double t[6] = { 1e30, 1e30, 1e30, 1e30, 1e30, 1e30 };
    for (int r = 0; r < reps; r++) {
        double t0 = ch_clock_s();
        ch_cpu_channel_affine(&kc, N, C, HW, x, gamma, shift, y);
        double t1 = ch_clock_s();
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
    printf("%-24s %8s %8s\n", "kernel (ms)", "fp32", "bf16");
    printf("%-24s %8.2f %8.2f\n", "channel_affine", t[0], t[1]);
    printf("%-24s %8.2f %8.2f\n", "backward_reduce", t[2], t[3]);
    printf("%-24s %8.2f %8.2f\n", "backward_data", t[4], t[5]);
    free(x), free(dy), free(y), free(dx), free(keep);
    return 0;
}
