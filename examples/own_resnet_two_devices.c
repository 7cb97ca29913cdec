/* Your own model in C: a small ResNet-style network defined with the graph builder, trained on
 * Fashion-MNIST on two devices.
 *
 * The builder mirrors how the network is written in PyTorch: every call adds one operation and
 * returns its output tensor; a node's name is the PyTorch module path, so the checkpoint's
 * state_dict loads into the same nn.Module with load_state_dict(strict=True). A mistake (a shape
 * that does not fit, a name used twice) is kept with the node's name and reported once, at the end.
 *
 *     own_resnet_two_devices DATA_DIR [EPOCHS [TRAIN_LIMIT]]
 *
 * The network (PyTorch equivalent):
 *     stem: Conv2d(1, 16, 3, padding=1, bias=False), BatchNorm2d(16), ReLU
 *     block1: two 3x3 convs with BN (16 channels), identity shortcut, add, ReLU
 *     block2: the same with 32 channels and stride 2; shortcut Conv2d(16, 32, 1, stride=2) + BN
 *     AdaptiveAvgPool2d(1), flatten, Linear(32, 10) */
#include <stdio.h>
#include <stdlib.h>

#include <cohort.h>

/* conv3x3 -> BN -> ReLU -> conv3x3 -> BN, + shortcut, ReLU; `p` is the block's module path. */
static int residual_block(ch_graph *g, const char *p, int x, int cin, int cout, int stride)
{
    char n[64];
#define NAME(s) (snprintf(n, sizeof n, "%s.%s", p, s), n)
    int y = ch_graph_conv2d(g, NAME("conv1"), x, &(ch_conv2d_args){ .out_channels = cout, .kernel = 3,
                                                                    .stride = stride, .padding = 1, .no_bias = true });
    y = ch_graph_batchnorm2d(g, NAME("bn1"), y, NULL);
    y = ch_graph_relu(g, NAME("relu1"), y);
    y = ch_graph_conv2d(g, NAME("conv2"), y, &(ch_conv2d_args){ .out_channels = cout, .kernel = 3,
                                                                .padding = 1, .no_bias = true });
    y = ch_graph_batchnorm2d(g, NAME("bn2"), y, NULL);
    int s = x;
    if (stride != 1 || cin != cout) {
        s = ch_graph_conv2d(g, NAME("shortcut.0"), x, &(ch_conv2d_args){ .out_channels = cout, .kernel = 1,
                                                                         .stride = stride, .no_bias = true });
        s = ch_graph_batchnorm2d(g, NAME("shortcut.1"), s, NULL);
    }
    y = ch_graph_add(g, NAME("add"), y, s);
    return ch_graph_relu(g, NAME("relu2"), y);
#undef NAME
}

static ch_status build(ch_graph **out, ch_err *err)
{
    ch_graph *g;
    ch_status st = ch_graph_create("own-resnet", &g, err);
    if (st != CH_STATUS_OK) return st;
    int x = ch_graph_input(g, "x", 1, 28, 28);
    x = ch_graph_conv2d(g, "stem.0", x, &(ch_conv2d_args){ .out_channels = 16, .kernel = 3, .padding = 1,
                                                          .no_bias = true });
    x = ch_graph_batchnorm2d(g, "stem.1", x, NULL);
    x = ch_graph_relu(g, "stem.2", x);
    x = residual_block(g, "block1", x, 16, 16, 1);
    x = residual_block(g, "block2", x, 16, 32, 2);
    x = ch_graph_global_avg_pool(g, "pool", x);
    x = ch_graph_flatten(g, "flatten", x);
    ch_graph_output(g, ch_graph_linear(g, "fc", x, 10, true));
    st = ch_graph_status(g, err);   /* the first mistake of any call above, naming its node */
    if (st != CH_STATUS_OK) {
        ch_graph_free(g);
        return st;
    }
    *out = g;
    return CH_STATUS_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR [EPOCHS [TRAIN_LIMIT]]\n", argv[0]);
        return 2;
    }
    ch_err err;
    ch_dataset *train = NULL, *test = NULL;
    ch_graph *g = NULL;
    if (ch_dataset_load_idx(argv[1], CH_SPLIT_TRAIN, &train, &err) != CH_STATUS_OK ||
        ch_dataset_load_idx(argv[1], CH_SPLIT_TEST, &test, &err) != CH_STATUS_OK || build(&g, &err) != CH_STATUS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        ch_dataset_free(train);
        ch_dataset_free(test);
        return 2;
    }
    if (argc > 3) ch_dataset_truncate(train, (size_t)strtoul(argv[3], NULL, 10));

    ch_train_config cfg = ch_train_config_default();
    cfg.graph = g;
    cfg.lr = 0.02;
    cfg.momentum = 0.9;
    cfg.batch_size = 64;
    cfg.epochs = argc > 2 ? atoi(argv[2]) : 3;
    cfg.devices = "cpu:0,cpu:1";

    ch_trainer *t = NULL;
    int rc = 0;
    if (ch_trainer_create(&cfg, train, test, &t, &err) != CH_STATUS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        rc = 1;
    }
    ch_graph_free(g);   /* the trainer's replicas are built: the description is no longer needed */
    if (rc == 0) printf("own-resnet: %zu parameters\n", ch_trainer_param_count(t));
    for (int e = 0; rc == 0 && e < cfg.epochs; e++) {
        ch_epoch_stats s;
        if (ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK) {
            fprintf(stderr, "%s\n", err.msg);
            rc = 1;
            break;
        }
        printf("epoch %d, loss %.3f, train acc %.3f, test acc %.3f, time %.1f sec, %.0f img/s on [%s]\n", s.epoch,
               s.loss, s.train_acc, s.test_acc, s.time_s, s.images_per_s, ch_trainer_devices(t));
    }
    ch_trainer_free(t);
    ch_dataset_free(train);
    ch_dataset_free(test);
    return rc;
}
