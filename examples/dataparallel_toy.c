/* Reference program E in C: the DataParallel principle on a toy Linear(5, 5).
 *
 *     dataparallel_toy [STEPS]
 *
 * PyTorch's example puts the model on 4 GPUs; a batch of shape (16, 10, 5) becomes four slices of
 * (4, 10, 5), each device runs forward on its slice, the outputs are gathered, the loss is taken and
 * SGD (lr 0.01, momentum 0.9) updates the one model. A Linear(5, 5) acts on the last axis, so the
 * batch is 160 rows of 5 values; cohort's "linear" model on 1x1x5 inputs with 5 classes is that
 * Linear(5, 5). Here the trainer does the scatter (4 slices of 40 rows, (4, 10, 5) each), the
 * per-device forward and backward and the sum of the gradients. The program then trains the same
 * steps on one device and prints how far the two models are apart: the principle says nowhere. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cohort.h>

enum { ROWS = 160, FEATURES = 5 };

/* Rows of 5 values; the label is the position of the largest one, so there is something to learn. */
static ch_dataset *toy_data(ch_err *err)
{
    uint8_t x[ROWS * FEATURES], y[ROWS];
    uint32_t s = 12345;
    for (int i = 0; i < ROWS; i++) {
        int best = 0;
        for (int j = 0; j < FEATURES; j++) {
            s = s * 1664525u + 1013904223u;
            x[i * FEATURES + j] = (uint8_t)(s >> 24);
            if (x[i * FEATURES + j] > x[i * FEATURES + best]) best = j;
        }
        y[i] = (uint8_t)best;
    }
    ch_dataset *d = NULL;
    return ch_dataset_from_memory(ROWS, 1, 1, FEATURES, FEATURES, x, y, &d, err) == CH_STATUS_OK ? d : NULL;
}

static ch_trainer *make(const ch_dataset *d, const char *devices, ch_err *err)
{
    ch_train_config cfg = ch_train_config_default();
    cfg.model = "linear";
    cfg.devices = devices;
    cfg.batch_size = ROWS;                   /* one step = the whole (16, 10, 5) batch */
    cfg.lr = 0.01;
    cfg.momentum = 0.9;
    cfg.seed = 1;
    ch_trainer *t = NULL;
    return ch_trainer_create(&cfg, d, NULL, &t, err) == CH_STATUS_OK ? t : NULL;
}

int main(int argc, char **argv)
{
    const int steps = argc > 1 ? atoi(argv[1]) : 20;
    ch_err err;
    ch_dataset *d = toy_data(&err);
    ch_trainer *four = d ? make(d, "cpu:0-3", &err) : NULL;
    ch_trainer *one = four ? make(d, "cpu:0", &err) : NULL;
    if (!one) {
        fprintf(stderr, "dataparallel_toy: %s\n", err.msg);
        return 1;
    }
    printf("batch (16, 10, 5) = %d rows -> 4 slices of (4, 10, 5) on [%s]\n", ROWS, ch_trainer_devices(four));
    for (int i = 0; i < steps; i++) {
        ch_epoch_stats s4, s1;
        if (ch_trainer_run_epoch(four, &s4, &err) != CH_STATUS_OK || ch_trainer_run_epoch(one, &s1, &err) != CH_STATUS_OK) {
            fprintf(stderr, "dataparallel_toy: %s\n", err.msg);
            return 1;
        }
        if (i == 0 || i == steps - 1)
            printf("step %d: loss %.5f on 4 devices, %.5f on 1 device\n", i + 1, s4.loss, s1.loss);
    }
    const size_t n = ch_trainer_param_count(four);
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    if (!a || !b) return 1;
    ch_trainer_get_params(four, a);
    ch_trainer_get_params(one, b);
    double diff = 0;
    for (size_t i = 0; i < n; i++) diff = fmax(diff, fabs((double)a[i] - b[i]));
    printf("Linear(5, 5): %zu parameters; largest difference between 4 devices and 1: %.3g\n", n, diff);
    free(a);
    free(b);
    ch_trainer_free(four);
    ch_trainer_free(one);
    ch_dataset_free(d);
    return diff <= 1e-5 ? 0 : 1;
}
