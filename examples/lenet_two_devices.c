/* Reference program A in C: LeNet on Fashion-MNIST, data parallel over two devices.
 *
 * The Gluon program copies the parameters to each device, splits every batch into equal slices,
 * lets each device compute its gradients, adds them up and applies SGD on every device. With cohort
 * that is the trainer's job: name the devices, and it runs one replica per device, splits each
 * global batch, sums the gradients (in buckets, while backward is still running) and applies the
 * same update everywhere.
 *
 *     lenet_two_devices DATA_DIR [EPOCHS [TRAIN_LIMIT]]
 *
 * Program A's recipe: weights N(0, 0.01), biases 0, plain SGD with lr 0.2, global batch 256,
 * 4 epochs. (With this init the first epoch stays at 0.10 test accuracy, in PyTorch too.) */
#include <stdio.h>
#include <stdlib.h>

#include <cohort.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR [EPOCHS [TRAIN_LIMIT]]\n", argv[0]);
        return 2;
    }
    ch_err err;
    ch_dataset *train = NULL, *test = NULL;
    if (ch_dataset_load_idx(argv[1], CH_SPLIT_TRAIN, &train, &err) != CH_STATUS_OK ||
        ch_dataset_load_idx(argv[1], CH_SPLIT_TEST, &test, &err) != CH_STATUS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        ch_dataset_free(train);
        return 2;
    }
    if (argc > 3) ch_dataset_truncate(train, (size_t)strtoul(argv[3], NULL, 10));

    ch_train_config cfg = ch_train_config_default();
    cfg.model = "lenet";
    cfg.init = "normal:0.01";
    cfg.lr = 0.2;
    cfg.batch_size = 256;
    cfg.epochs = argc > 2 ? atoi(argv[2]) : 4;
    cfg.devices = "cpu:0,cpu:1";

    ch_trainer *t = NULL;
    int rc = 0;
    if (ch_trainer_create(&cfg, train, test, &t, &err) != CH_STATUS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        rc = 1;
    }
    for (int e = 0; rc == 0 && e < cfg.epochs; e++) {
        ch_epoch_stats s;
        if (ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK) {
            fprintf(stderr, "%s\n", err.msg);
            rc = 1;
            break;
        }
        printf("epoch %d, time %.1f sec, test acc %.2f on [%s]\n", s.epoch, s.time_s, s.test_acc,
               ch_trainer_devices(t));
    }
    ch_trainer_free(t);
    ch_dataset_free(train);
    ch_dataset_free(test);
    return rc;
}
