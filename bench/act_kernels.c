/* Elements/second of the CPU backend's activation kernels, forward and backward, one thread, on
 * 2^22 floats uniform in [-6, 6) (past ReLU6's and hardswish's corners); the best of --reps runs
 * of each. Prints one line per kind: name, forward Melem/s, backward Melem/s. bench/activations
 * runs it beside PyTorch's same functions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/cpu.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    const size_t n = (size_t)1 << 22;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    float *dy = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    if (!x || !y || !dy || !dx || reps < 1) {
        fprintf(stderr, "act_kernels: out of memory or bad reps\n");
        return 1;
    }
    uint64_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / (double)(1ull << 24) * 12 - 6);
        dy[i] = 1;
    }
    const struct { const char *name; ch_act a; } kinds[] = {
        { "relu6", { .kind = CH_ACT_CLIP, .lo = 0, .hi = 6 } },
        { "leaky_relu", { .kind = CH_ACT_LEAKY_RELU, .alpha = 0.1f } },
        { "hardsigmoid", { .kind = CH_ACT_HARDSIGMOID } },
        { "hardswish", { .kind = CH_ACT_HARDSWISH } },
        { "sigmoid", { .kind = CH_ACT_SIGMOID } },
        { "tanh", { .kind = CH_ACT_TANH } },
        { "erf", { .kind = CH_ACT_ERF } },
        { "gelu", { .kind = CH_ACT_GELU } },
        { "gelu_tanh", { .kind = CH_ACT_GELU_TANH } },
    };
    ch_kctx kc = { .nthreads = 1 };
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        double fwd = 1e30, bwd = 1e30;
        for (int r = 0; r < reps; r++) {
            const double t0 = now();
            ch_cpu_act_forward(&kc, &kinds[k].a, n, x, y);
            const double t1 = now();
            ch_cpu_act_backward(&kc, &kinds[k].a, n, x, y, dy, dx);
            const double t2 = now();
            if (t1 - t0 < fwd) fwd = t1 - t0;
            if (t2 - t1 < bwd) bwd = t2 - t1;
        }
        printf("%s %.0f %.0f\n", kinds[k].name, (double)n / fwd / 1e6, (double)n / bwd / 1e6);
    }
    free(x), free(y), free(dy), free(dx);
    return 0;
}
