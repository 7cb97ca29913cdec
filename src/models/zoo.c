/* The zoo, built as graphs through the public builder (include/cohort.h), so a zoo model and a
 * user's model are one kind of thing. Node names are the PyTorch module paths, so tensor names
 * match the reference programs' state_dict():
 *   lenet     (program A): Conv(1->20,3) ReLU AvgPool(2,2) Conv(20->50,5) ReLU AvgPool(2,2) Flatten
 *                          Linear(800->128) ReLU Linear(128->10)
 *   mnist-cnn (program C): Conv(1->20,5,pad 2) ReLU MaxPool(2,2) Conv(20->20,5,pad 2) ReLU MaxPool(2,2)
 *                          Flatten Linear(980->10)
 *   resnet18  (program D): Conv(1->64,3,pad 1) BN ReLU, resnet_block1..4 (2 residual blocks each,
 *                          64/128/256/512 channels, stride 2 + 1x1 shortcut conv3 at the start of
 *                          2..4; d2l's Residual: convs with biases), global_avg_pool,
 *                          fc = Sequential(Flatten, Linear(512->classes))
 *   mlp:                   Flatten Linear(784->256) ReLU Linear(256->10)
 *   resnet18-imagenet (program B): torchvision's resnet18: conv1 (7x7 stride 2, no bias) bn1 relu
 *                          maxpool (3x3 stride 2 pad 1), layer1..4 of two BasicBlocks (64..512
 *                          channels, no conv biases, stride 2 + downsample = Sequential(1x1 conv,
 *                          BN) at the start of 2..4), avgpool, fc
 *   linear    (program E): Flatten Linear(c*h*w->classes), softmax regression; on 1x1x5 inputs with
 *                          5 classes it is program E's Linear(5, 5)
 * A residual block is y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); its memory (bn1's
 * output recomputed in backward, bn2, the sum and the last ReLU sharing one buffer) is the graph
 * executor's doing (graph/exec.c), as it is for any graph of that form. */
#include "models/zoo.h"

#include <stdio.h>
#include <string.h>

#include "graph/graph.h"

static int conv(ch_graph *g, const char *name, int x, int out, int k, int stride, int pad, bool bias)
{
    return ch_graph_conv2d(g, name, x, &(ch_conv2d_args){ .out_channels = out, .kernel = k,
                                                          .stride = stride, .padding = pad,
                                                          .no_bias = !bias });
}

/* 2x2 pooling with stride 2. */
static int pool2(ch_graph *g, const char *name, int x, bool max)
{
    const ch_pool2d_args a = { .kernel = 2, .stride = 2 };
    return max ? ch_graph_max_pool2d(g, name, x, &a) : ch_graph_avg_pool2d(g, name, x, &a);
}

/* The root Sequential's children are named 0, 1, 2, ... */
static int build_lenet(ch_graph *g, int x, int classes)
{
    x = pool2(g, "2", ch_graph_relu(g, "1", conv(g, "0", x, 20, 3, 1, 0, true)), false);
    x = pool2(g, "5", ch_graph_relu(g, "4", conv(g, "3", x, 50, 5, 1, 0, true)), false);
    x = ch_graph_relu(g, "8", ch_graph_linear(g, "7", ch_graph_flatten(g, "6", x), 128, true));
    return ch_graph_linear(g, "9", x, classes, true);
}

static int build_mnist_cnn(ch_graph *g, int x, int classes)
{
    x = pool2(g, "2", ch_graph_relu(g, "1", conv(g, "0", x, 20, 5, 1, 2, true)), true);
    x = pool2(g, "5", ch_graph_relu(g, "4", conv(g, "3", x, 20, 5, 1, 2, true)), true);
    return ch_graph_linear(g, "7", ch_graph_flatten(g, "6", x), classes, true);
}

static int build_mlp(ch_graph *g, int x, int classes)
{
    x = ch_graph_flatten(g, "0", x);
    x = ch_graph_relu(g, "2", ch_graph_linear(g, "1", x, 256, true));
    return ch_graph_linear(g, "3", x, classes, true);
}

static int build_linear(ch_graph *g, int x, int classes)
{
    return ch_graph_linear(g, "1", ch_graph_flatten(g, "0", x), classes, true);
}

/* PATH.SUFFIX into buf. */
static const char *sub(char *buf, const char *path, const char *suffix)
{
    snprintf(buf, CH_NODE_NAME_MAX, "%s.%s", path, suffix);
    return buf;
}

/* One residual block at path. d2l (program D): convs with biases, shortcut conv3 (1x1 conv).
 * torchvision: no conv biases, shortcut downsample.0 (1x1 conv) + downsample.1 (BN). */
static int residual(ch_graph *g, const char *path, int x, int ch, int stride, bool project,
                    bool torchvision)
{
    char n[CH_NODE_NAME_MAX];
    const bool bias = !torchvision;
    int y = conv(g, sub(n, path, "conv1"), x, ch, 3, stride, 1, bias);
    y = ch_graph_relu(g, sub(n, path, "relu1"), ch_graph_batchnorm2d(g, sub(n, path, "bn1"), y, NULL));
    y = ch_graph_batchnorm2d(g, sub(n, path, "bn2"), conv(g, sub(n, path, "conv2"), y, ch, 3, 1, 1, bias), NULL);
    int s = x;
    if (project && torchvision)
        s = ch_graph_batchnorm2d(g, sub(n, path, "downsample.1"),
                                 conv(g, sub(n, path, "downsample.0"), x, ch, 1, stride, 0, false), NULL);
    else if (project)
        s = conv(g, sub(n, path, "conv3"), x, ch, 1, stride, 0, true);
    return ch_graph_relu(g, sub(n, path, "relu2"), ch_graph_add(g, sub(n, path, "add"), y, s));
}

/* Four stages of two blocks; stages 2..4 halve the size and double the channels. */
static int stages(ch_graph *g, int x, const char *const names[4], bool torchvision)
{
    for (int st = 0; st < 4; st++) {
        const int ch = 64 << st;
        char path[CH_NODE_NAME_MAX];
        snprintf(path, sizeof path, "%s.0", names[st]);
        x = residual(g, path, x, ch, st > 0 ? 2 : 1, st > 0, torchvision);
        snprintf(path, sizeof path, "%s.1", names[st]);
        x = residual(g, path, x, ch, 1, false, torchvision);
    }
    return x;
}

static int build_resnet18(ch_graph *g, int x, int classes)
{
    x = ch_graph_relu(g, "2", ch_graph_batchnorm2d(g, "1", conv(g, "0", x, 64, 3, 1, 1, true), NULL));
    static const char *const names[4] = { "resnet_block1", "resnet_block2", "resnet_block3", "resnet_block4" };
    x = ch_graph_global_avg_pool(g, "global_avg_pool", stages(g, x, names, false));
    return ch_graph_linear(g, "fc.1", ch_graph_flatten(g, "fc.0", x), classes, true);
}

static int build_resnet18_imagenet(ch_graph *g, int x, int classes)
{
    x = ch_graph_relu(g, "relu", ch_graph_batchnorm2d(g, "bn1", conv(g, "conv1", x, 64, 7, 2, 3, false), NULL));
    x = ch_graph_max_pool2d(g, "maxpool", x, &(ch_pool2d_args){ .kernel = 3, .stride = 2, .padding = 1 });
    static const char *const names[4] = { "layer1", "layer2", "layer3", "layer4" };
    x = ch_graph_global_avg_pool(g, "avgpool", stages(g, x, names, true));
    return ch_graph_linear(g, "fc", ch_graph_flatten(g, "flatten", x), classes, true);
}

typedef struct arch {
    const char *name;
    int (*build)(ch_graph *g, int x, int classes);
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

ch_status ch_zoo_graph(const char *name, ch_shape3 in, int classes, ch_graph **out, ch_err *err)
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
    ch_graph *g;
    CH_TRY(ch_graph_create(name, &g, err));
    ch_graph_output(g, a->build(g, ch_graph_input(g, "x", in.c, in.h, in.w), classes));
    ch_err inner;
    if (ch_graph_status(g, &inner) != CH_STATUS_OK) {
        ch_graph_free(g);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "model %s cannot take %dx%dx%d inputs: %s", name, in.c, in.h,
                       in.w, inner.msg);
    }
    *out = g;
    return CH_STATUS_OK;
}

ch_status ch_zoo_model(const char *name, ch_shape3 in, int classes, const ch_backend *be, ch_model **out,
                       ch_err *err)
{
    ch_graph *g;
    CH_TRY(ch_zoo_graph(name, in, classes, &g, err));
    const ch_status st = ch_model_create_graph(g, in, classes, be, out, err);
    ch_graph_free(g);
    return st;
}
