/* Reference program D in C: d2l's ResNet-18 on Fashion-MNIST on two devices, the batch and the
 * learning rate scaled together (one device: batch 256, lr 0.1; two: batch 512, lr 0.2), conv and
 * linear weights N(0, 0.01).
 *
 *     resnet18_two_devices DATA_DIR [EPOCHS [TRAIN_LIMIT [BATCH]]]
 *
 * d2l's train function prints the test accuracy and the time per epoch on its devices; so does
 * this. */
#include <stdio.h>
#include <stdlib.h>

#include <cohort.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR [EPOCHS [TRAIN_LIMIT [BATCH]]]\n", argv[0]);
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
    if (argc > 3) {
        ch_dataset_truncate(train, (size_t)atol(argv[3]));
        ch_dataset_truncate(test, (size_t)atol(argv[3]));
    }
    ch_train_config cfg = ch_train_config_default();
    cfg.model = "resnet18";
    cfg.init = "normal:0.01";
    cfg.devices = "cpu:0,cpu:1";
    cfg.epochs = argc > 2 ? atoi(argv[2]) : 10;
    cfg.batch_size = argc > 4 ? atoi(argv[4]) : 512;
    cfg.lr = 0.1 * cfg.batch_size / 256;     /* d2l: lr 0.2 for batch 512 on 2 GPUs */
    ch_trainer *t;
    if (ch_trainer_create(&cfg, train, test, &t, &err) != CH_STATUS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        ch_dataset_free(train);
        ch_dataset_free(test);
        return 2;
    }
    int rc = 0;
    for (int e = 0; e < cfg.epochs; e++) {
        ch_epoch_stats s;
        if (ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK) {
            fprintf(stderr, "%s\n", err.msg);
            rc = 1;
            break;
        }
        printf("test acc: %.2f, %.1f sec/epoch on [%s]\n", s.test_acc, s.time_s, ch_trainer_devices(t));
    }
    ch_trainer_free(t);
    ch_dataset_free(train);
    ch_dataset_free(test);
    return rc;
}
