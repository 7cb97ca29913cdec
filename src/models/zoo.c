/* The zoo. Each builder appends layers to a root Sequential whose child names are the PyTorch
 * module names, so tensor names match the reference programs' state_dict():
 *   lenet     (program A): Conv(1->20,3) ReLU AvgPool(2,2) Conv(20->50,5) ReLU AvgPool(2,2) Flatten
 *                          Linear(800->128) ReLU Linear(128->10)
 *   mnist-cnn (program C): Conv(1->20,5,pad 2) ReLU MaxPool(2,2) Conv(20->20,5,pad 2) ReLU MaxPool(2,2)
 *                          Flatten Linear(980->10)
 *   resnet18  (program D): Conv(1->64,3,pad 1) BN ReLU, resnet_block1..4 (2 residual blocks each,
 *                          64/128/256/512 channels, stride 2 + 1x1 shortcut at the start of 2..4),
 *                          global_avg_pool, fc = Sequential(Flatten, Linear(512->classes))
 *   mlp:                   Flatten Linear(784->256) ReLU Linear(256->10)
 *   resnet18-imagenet (program B): torchvision's resnet18: conv1 (7x7 stride 2, no bias) bn1 relu
 *                          maxpool (3x3 stride 2 pad 1), layer1..4 of two BasicBlocks (64..512
 *                          channels, stride 2 + downsample at the start of 2..4), avgpool, fc
 *   linear    (program E): Flatten Linear(c*h*w->classes), softmax regression; on 1x1x5 inputs with
 *                          5 classes it is program E's Linear(5, 5) */
#include "models/zoo.h"

#include <stdio.h>
#include <string.h>

/* Builders chain through this: each step runs only while the status is OK. */
typedef struct builder {
    ch_layer *seq;
    ch_status st;
    ch_err *err;
    int next;       /* next numeric child name */
} builder;

static void add(builder *b, ch_layer *l, ch_status made)
{
    if (b->st != CH_STATUS_OK) {
        if (made == CH_STATUS_OK) ch_layer_free(l);
        return;
    }
    b->st = made;
    if (made == CH_STATUS_OK) b->st = ch_sequential_append(b->seq, l, b->err);
}

static const char *next_name(builder *b, char *buf)
{
    sprintf(buf, "%d", b->next++);
    return buf;
}

#define ADD(b, ctor, ...)                                                              \
    do {                                                                               \
        char nm_[16];                                                                  \
        ch_layer *l_ = NULL;                                                           \
        ch_status st_ = (b)->st == CH_STATUS_OK                                        \
                            ? ctor(next_name((b), nm_), (b)->seq->out, ##__VA_ARGS__, &l_, (b)->err) \
                            : (b)->st;                                                 \
        add((b), l_, st_);                                                             \
    } while (0)

static void build_lenet(builder *b, int classes)
{
    ADD(b, ch_conv2d_create, 20, 3, 1, 0, true);
    ADD(b, ch_relu_create);
    ADD(b, ch_avgpool2d_create, 2, 2, 0);
    ADD(b, ch_conv2d_create, 50, 5, 1, 0, true);
    ADD(b, ch_relu_create);
    ADD(b, ch_avgpool2d_create, 2, 2, 0);
    ADD(b, ch_flatten_create);
    ADD(b, ch_linear_create, 128);
    ADD(b, ch_relu_create);
    ADD(b, ch_linear_create, classes);
}

static void build_mnist_cnn(builder *b, int classes)
{
    ADD(b, ch_conv2d_create, 20, 5, 1, 2, true);
    ADD(b, ch_relu_create);
    ADD(b, ch_maxpool2d_create, 2, 2, 0);
    ADD(b, ch_conv2d_create, 20, 5, 1, 2, true);
    ADD(b, ch_relu_create);
    ADD(b, ch_maxpool2d_create, 2, 2, 0);
    ADD(b, ch_flatten_create);
    ADD(b, ch_linear_create, classes);
}

static void build_mlp(builder *b, int classes)
{
    ADD(b, ch_flatten_create);
    ADD(b, ch_linear_create, 256);
    ADD(b, ch_relu_create);
    ADD(b, ch_linear_create, classes);
}

static void build_linear(builder *b, int classes)
{
    ADD(b, ch_flatten_create);
    ADD(b, ch_linear_create, classes);
}

/* A named child Sequential built by fill(). */
static void add_named_seq(builder *b, const char *name, void (*fill)(builder *, int), int arg)
{
    if (b->st != CH_STATUS_OK) return;
    ch_layer *s;
    b->st = ch_sequential_create(name, b->seq->out, &s, b->err);
    if (b->st != CH_STATUS_OK) return;
    builder inner = { .seq = s, .st = CH_STATUS_OK, .err = b->err };
    fill(&inner, arg);
    add(b, s, inner.st);
    if (inner.st != CH_STATUS_OK) b->st = inner.st;
}

/* arg = stage (1..4): two residual blocks; stages 2-4 halve the size with a 1x1 shortcut. */
static void fill_stage(builder *b, int stage)
{
    const int ch = 64 << (stage - 1);
    ADD(b, ch_residual_create, ch, stage > 1, stage > 1 ? 2 : 1);
    ADD(b, ch_residual_create, ch, false, 1);
}

static void fill_fc(builder *b, int classes)
{
    ADD(b, ch_flatten_create);
    ADD(b, ch_linear_create, classes);
}

static void build_resnet18(builder *b, int classes)
{
    ADD(b, ch_conv2d_create, 64, 3, 1, 1, true);
    ADD(b, ch_batchnorm2d_create);
    ADD(b, ch_relu_create);
    static const char *stages[] = { "resnet_block1", "resnet_block2", "resnet_block3",
                                    "resnet_block4" };
    for (int s = 0; s < 4; s++) add_named_seq(b, stages[s], fill_stage, s + 1);
    if (b->st == CH_STATUS_OK) {
        ch_layer *l = NULL;
        ch_status st = ch_global_avgpool_create("global_avg_pool", b->seq->out, &l, b->err);
        add(b, l, st);
    }
    add_named_seq(b, "fc", fill_fc, classes);
}

/* A child with an explicit (torchvision) name. */
#define ADD_NAMED(b, name, ctor, ...)                                                  \
    do {                                                                               \
        ch_layer *l_ = NULL;                                                           \
        ch_status st_ = (b)->st == CH_STATUS_OK                                        \
                            ? ctor((name), (b)->seq->out, ##__VA_ARGS__, &l_, (b)->err) \
                            : (b)->st;                                                 \
        add((b), l_, st_);                                                             \
    } while (0)

/* arg = stage (1..4) of torchvision's ResNet-18: two BasicBlocks. */
static void fill_layer(builder *b, int stage)
{
    const int ch = 64 << (stage - 1);
    ADD(b, ch_basicblock_create, ch, stage > 1 ? 2 : 1);
    ADD(b, ch_basicblock_create, ch, 1);
}

static void build_resnet18_imagenet(builder *b, int classes)
{
    ADD_NAMED(b, "conv1", ch_conv2d_create, 64, 7, 2, 3, false);
    ADD_NAMED(b, "bn1", ch_batchnorm2d_create);
    ADD_NAMED(b, "relu", ch_relu_create);
    ADD_NAMED(b, "maxpool", ch_maxpool2d_create, 3, 2, 1);
    static const char *layers[] = { "layer1", "layer2", "layer3", "layer4" };
    for (int s = 0; s < 4; s++) add_named_seq(b, layers[s], fill_layer, s + 1);
    ADD_NAMED(b, "avgpool", ch_global_avgpool_create);
    ADD_NAMED(b, "flatten", ch_flatten_create);
    ADD_NAMED(b, "fc", ch_linear_create, classes);
}

typedef struct arch {
    const char *name;
    void (*build)(builder *, int classes);
} arch;

static const arch archs[] = {
    { "lenet", build_lenet },
    { "mnist-cnn", build_mnist_cnn },
    { "resnet18", build_resnet18 },
    { "mlp", build_mlp },
    { "linear", build_linear },
    { "resnet18-imagenet", build_resnet18_imagenet },
};

static const char *const arch_names[] = { "lenet", "mnist-cnn", "resnet18", "mlp", "linear",
                                          "resnet18-imagenet", NULL };

const char *const *ch_model_names(void) { return arch_names; }

bool ch_zoo_has(const char *name)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(archs[i].name, name) == 0) return true;
    return false;
}

ch_status ch_zoo_build(const char *name, ch_shape3 in, int classes, ch_layer **root, ch_err *err)
{
    const arch *a = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(archs[i].name, name) == 0) a = &archs[i];
    if (!a)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "unknown model '%s' (expected lenet, mnist-cnn, resnet18, mlp, linear or resnet18-imagenet)", name);
    if (classes < 2)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "model %s: %d classes, need at least 2", name,
                       classes);
    builder b = { .st = CH_STATUS_OK, .err = err };
    CH_TRY(ch_sequential_create("", in, &b.seq, err));
    a->build(&b, classes);
    if (b.st != CH_STATUS_OK) {
        ch_layer_free(b.seq);
        char inner[sizeof err->msg];
        snprintf(inner, sizeof inner, "%s", err ? err->msg : "");
        return ch_fail(err, b.st, "model %s cannot take %dx%dx%d inputs: %s", name, in.c, in.h,
                       in.w, inner);
    }
    *root = b.seq;
    return CH_STATUS_OK;
}
