/* Reference program B in C: one process per device under mpirun (PyTorch DistributedDataParallel),
 * a checkpoint every epoch, --resume, and a model any number of devices can evaluate.
 *
 *     mpirun -np N ddp_resnet18 DATA_DIR [EPOCHS [TRAIN_LIMIT [BATCH [CHECKPOINT_DIR]]]]
 *
 * What the Python program wires by hand (init_process_group, DistributedSampler, DDP, rank-0
 * printing, saving and resuming) is ch_world_init plus a trainer: every rank loads the data, the
 * trainer splits each global batch over the ranks (each sample once per epoch), sums the gradients
 * with MPI as backward runs, and rank 0 writes checkpoints whose names carry no `module.` prefix.
 * Program B's recipe: SGD lr 0.1, momentum 0.9, weight decay 5e-4, batch 512 (its torchvision
 * ResNet-18 on an ImageFolder is d2l's 28x28 ResNet-18 on Fashion-MNIST here). */
#include <stdio.h>
#include <stdlib.h>

#include <cohort.h>

/* Program B's progress line, every 20 steps and at the end of the epoch (rank 0's share). */
static void progress(void *user, int step, int steps, double loss, double acc, size_t images,
                     double elapsed)
{
    (void)user;
    (void)images;
    (void)elapsed;
    if (ch_world_rank() == 0 && (step % 20 == 0 || step == steps))
        printf("  [%d/%d] Loss: %.3f | Acc: %.3f%%\n", step, steps, loss, 100 * acc);
}

static int fail(const char *what, const ch_err *err)
{
    fprintf(stderr, "ddp_resnet18: rank %d of %d: %s: %s\n", ch_world_rank(), ch_world_size(), what,
            err->msg);
    /* The other ranks are waiting for this one: end the job. */
    if (ch_world_size() > 1) ch_world_abort(1);
    return 1;
}

int main(int argc, char **argv)
{
    ch_err err;
    if (ch_world_init(&argc, &argv, &err) != CH_STATUS_OK) return fail("MPI", &err);
    if (argc < 2) {
        fprintf(stderr, "usage: mpirun -np N %s DATA_DIR [EPOCHS [TRAIN_LIMIT [BATCH [CHECKPOINT_DIR]]]]\n", argv[0]);
        return 2;
    }
    ch_dataset *train = NULL, *test = NULL;
    if (ch_dataset_load_idx(argv[1], CH_SPLIT_TRAIN, &train, &err) != CH_STATUS_OK ||
        ch_dataset_load_idx(argv[1], CH_SPLIT_TEST, &test, &err) != CH_STATUS_OK)
        return fail("data", &err);
    /* A small TRAIN_LIMIT (a quick try) evaluates on as many test images, up to 2000. */
    size_t test_n = 2000;
    if (argc > 3) {
        const size_t n = (size_t)atol(argv[3]);
        ch_dataset_truncate(train, n);
        if (n > 0 && n < test_n) test_n = n;
    }
    ch_dataset_truncate(test, test_n);
    ch_train_config cfg = ch_train_config_default();
    cfg.model = "resnet18";
    cfg.epochs = argc > 2 ? atoi(argv[2]) : 90;
    cfg.batch_size = argc > 4 ? atoi(argv[4]) : 512;
    cfg.lr = 0.1;
    cfg.momentum = 0.9;
    cfg.weight_decay = 5e-4;
    cfg.checkpoint_dir = argc > 5 ? argv[5] : "output";
    ch_trainer *t;
    if (ch_trainer_create(&cfg, train, test, &t, &err) != CH_STATUS_OK) return fail("trainer", &err);
    /* Like --resume: go on from the latest checkpoint when there is one. */
    char latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", cfg.checkpoint_dir);
    FILE *probe = fopen(latest, "r");
    if (probe) {
        fclose(probe);
        if (ch_trainer_resume(t, cfg.checkpoint_dir, &err) != CH_STATUS_OK) return fail("resume", &err);
        if (ch_world_rank() == 0) printf("resumed after epoch %d\n", ch_trainer_epochs_done(t));
    }
    ch_trainer_set_progress(t, progress, NULL);
    for (int e = ch_trainer_epochs_done(t); e < cfg.epochs; e++) {
        ch_epoch_stats s;
        if (ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK) return fail("training", &err);
        if (ch_world_rank() == 0)
            printf("epoch %d, loss %.4f, train acc %.4f, test acc %.4f, %.0f img/s on %d ranks x [%s]\n",
                   s.epoch, s.loss, s.train_acc, s.test_acc, s.images_per_s, ch_world_size(),
                   ch_trainer_devices(t));
    }
    ch_trainer_free(t);
    ch_dataset_free(train);
    ch_dataset_free(test);
    ch_world_finalize();
    return 0;
}
