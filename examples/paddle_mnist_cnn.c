/* Reference program C in C: the Paddle MNIST CNN, SGD lr 0.01, batch 100, the loss printed every
 * 200 batches and the parameters saved at the end; started on one device or, as with
 * `python -m paddle.distributed.launch`, on several processes by mpirun.
 *
 *     [mpirun -np N] paddle_mnist_cnn DATA_DIR [EPOCHS [TRAIN_LIMIT [OUT.safetensors]]]
 *
 * The saved file is the state_dict (safetensors) that PyTorch or `cohort eval` loads. */
#include <stdio.h>
#include <stdlib.h>

#include <cohort.h>

typedef struct epoch_ctx {
    int epoch;
} epoch_ctx;

static void every_200(void *user, int step, int steps, double loss, double acc, size_t images,
                      double elapsed)
{
    (void)steps;
    (void)acc;
    (void)images;
    (void)elapsed;
    const epoch_ctx *c = user;
    if (ch_world_rank() == 0 && step % 200 == 0)
        printf("Epoch %d, batch %d, Loss %.5f\n", c->epoch, step, loss);
}

static int fail(const char *what, const ch_err *err)
{
    fprintf(stderr, "paddle_mnist_cnn: rank %d: %s: %s\n", ch_world_rank(), what, err->msg);
    if (ch_world_size() > 1) ch_world_abort(1);
    return 1;
}

int main(int argc, char **argv)
{
    ch_err err;
    if (ch_world_init(&argc, &argv, &err) != CH_STATUS_OK) return fail("MPI", &err);
    if (argc < 2) {
        fprintf(stderr, "usage: [mpirun -np N] %s DATA_DIR [EPOCHS [TRAIN_LIMIT [OUT.safetensors]]]\n", argv[0]);
        return 2;
    }
    ch_dataset *train = NULL, *test = NULL;
    if (ch_dataset_load_idx(argv[1], CH_SPLIT_TRAIN, &train, &err) != CH_STATUS_OK ||
        ch_dataset_load_idx(argv[1], CH_SPLIT_TEST, &test, &err) != CH_STATUS_OK)
        return fail("data", &err);
    if (argc > 3) ch_dataset_truncate(train, (size_t)atol(argv[3]));
    ch_train_config cfg = ch_train_config_default();
    cfg.model = "mnist-cnn";
    cfg.epochs = argc > 2 ? atoi(argv[2]) : 1;
    cfg.batch_size = 100;
    cfg.lr = 0.01;
    ch_trainer *t;
    if (ch_trainer_create(&cfg, train, test, &t, &err) != CH_STATUS_OK) return fail("trainer", &err);
    epoch_ctx ctx = { 0 };
    ch_trainer_set_progress(t, every_200, &ctx);
    for (int e = 0; e < cfg.epochs; e++) {
        ctx.epoch = e;
        ch_epoch_stats s;
        if (ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK) return fail("training", &err);
        if (ch_world_rank() == 0)
            printf("Epoch %d: loss %.4f, test acc %.4f (%d processes)\n", e, s.loss, s.test_acc, ch_world_size());
    }
    const char *out = argc > 4 ? argv[4] : "mnist_cnn.safetensors";
    if (ch_trainer_export(t, out, &err) != CH_STATUS_OK) return fail("save", &err);
    if (ch_world_rank() == 0) printf("saved %s\n", out);
    ch_trainer_free(t);
    ch_dataset_free(train);
    ch_dataset_free(test);
    ch_world_finalize();
    return 0;
}
