/* graph_models.py's models in C. Each builder mirrors the Python forward line by line; node names
 * with parameters are the PyTorch module paths, the others (activations, sums) only need to be
 * unique. */
#include "graph_models.h"

#include <stdio.h>
#include <string.h>

static int conv(ch_graph *g, const char *name, int x, int oc, int k, int stride, int pad, int groups, bool bias)
{
    return ch_graph_conv2d(g, name, x, &(ch_conv2d_args){ .out_channels = oc, .kernel = k, .stride = stride,
                                                         .padding = pad, .groups = groups, .no_bias = !bias });
}

/* name(...) with a printf-formatted node name. */
static const char *nm(char *buf, const char *fmt, const char *prefix, const char *suffix)
{
    snprintf(buf, 96, fmt, prefix, suffix);
    return buf;
}

static int basic_block(ch_graph *g, const char *p, int x, int cin, int cout, int stride)
{
    char b[96];
    int y = conv(g, nm(b, "%.80s.%s", p, "conv1"), x, cout, 3, stride, 1, 1, false);
    y = ch_graph_batchnorm2d(g, nm(b, "%.80s.%s", p, "bn1"), y, NULL);
    y = ch_graph_relu(g, nm(b, "%.80s.%s", p, "relu1"), y);
    y = conv(g, nm(b, "%.80s.%s", p, "conv2"), y, cout, 3, 1, 1, 1, false);
    y = ch_graph_batchnorm2d(g, nm(b, "%.80s.%s", p, "bn2"), y, NULL);
    int s = x;
    if (stride != 1 || cin != cout) {
        s = conv(g, nm(b, "%.80s.%s", p, "downsample.0"), x, cout, 1, stride, 0, 1, false);
        s = ch_graph_batchnorm2d(g, nm(b, "%.80s.%s", p, "downsample.1"), s, NULL);
    }
    y = ch_graph_add(g, nm(b, "%.80s.%s", p, "add"), y, s);
    return ch_graph_relu(g, nm(b, "%.80s.%s", p, "relu2"), y);
}

static void resnet(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 1, 28, 28);
    x = conv(g, "conv1", x, 8, 3, 1, 1, 1, false);
    /* Not PyTorch's defaults, as graph_models.py: a dropped eps or momentum shows. */
    x = ch_graph_batchnorm2d(g, "bn1", x, &(ch_batchnorm_args){ .eps = 1e-3, .momentum = 0.3 });
    x = ch_graph_relu(g, "relu", x);
    x = basic_block(g, "layer1.0", x, 8, 8, 1);
    x = basic_block(g, "layer2.0", x, 8, 16, 2);
    x = basic_block(g, "layer3.0", x, 16, 32, 2);
    x = ch_graph_global_avg_pool(g, "avgpool", x);
    x = ch_graph_flatten(g, "flatten", x);
    ch_graph_output(g, ch_graph_linear(g, "fc", x, 10, true));
}

static int squeeze_excite(ch_graph *g, const char *p, int x, int c, int r)
{
    char b[96];
    int s = ch_graph_mean_hw(g, nm(b, "%.80s.%s", p, "mean"), x, true);
    s = conv(g, nm(b, "%.80s.%s", p, "fc1"), s, r, 1, 1, 0, 1, true);
    s = ch_graph_relu(g, nm(b, "%.80s.%s", p, "relu"), s);
    s = conv(g, nm(b, "%.80s.%s", p, "fc2"), s, c, 1, 1, 0, 1, true);
    s = ch_graph_sigmoid(g, nm(b, "%.80s.%s", p, "gate"), s);
    return ch_graph_mul(g, nm(b, "%.80s.%s", p, "mul"), x, s);
}

static int inverted_residual(ch_graph *g, const char *p, int x, int cin, int cout, int stride, int expand)
{
    char b[96];
    const int h = cin * expand;
    int y = conv(g, nm(b, "%.80s.%s", p, "expand.0"), x, h, 1, 1, 0, 1, false);
    y = ch_graph_batchnorm2d(g, nm(b, "%.80s.%s", p, "expand.1"), y, NULL);
    y = ch_graph_relu6(g, nm(b, "%.80s.%s", p, "expand.2"), y);
    y = conv(g, nm(b, "%.80s.%s", p, "dw.0"), y, h, 3, stride, 1, h, false);
    y = ch_graph_batchnorm2d(g, nm(b, "%.80s.%s", p, "dw.1"), y, NULL);
    y = ch_graph_relu6(g, nm(b, "%.80s.%s", p, "dw.2"), y);
    y = squeeze_excite(g, nm(b, "%.80s.%s", p, "se"), y, h, h / 4 > 1 ? h / 4 : 1);
    y = conv(g, nm(b, "%.80s.%s", p, "project.0"), y, cout, 1, 1, 0, 1, false);
    y = ch_graph_batchnorm2d(g, nm(b, "%.80s.%s", p, "project.1"), y, NULL);
    return stride == 1 && cin == cout ? ch_graph_add(g, nm(b, "%.80s.%s", p, "add"), x, y) : y;
}

static void mobilenet(ch_graph *g, double dropout)
{
    int x = ch_graph_input(g, "x", 1, 28, 28);
    x = conv(g, "stem.0", x, 8, 3, 2, 1, 1, false);
    x = ch_graph_batchnorm2d(g, "stem.1", x, NULL);
    x = ch_graph_relu6(g, "stem.2", x);
    x = inverted_residual(g, "blocks.0", x, 8, 8, 1, 2);
    x = inverted_residual(g, "blocks.1", x, 8, 16, 2, 2);
    x = conv(g, "head.0", x, 32, 1, 1, 0, 1, false);
    x = ch_graph_batchnorm2d(g, "head.1", x, NULL);
    x = ch_graph_relu6(g, "head.2", x);
    x = ch_graph_mean_hw(g, "mean", x, false);
    x = ch_graph_dropout(g, "dropout", x, dropout);
    ch_graph_output(g, ch_graph_linear(g, "classifier", x, 10, true));
}

static int dense_layer(ch_graph *g, const char *p, int x, int growth)
{
    char b[96];
    int y = ch_graph_batchnorm2d(g, nm(b, "%.80s.%s", p, "norm"), x, NULL);
    y = ch_graph_relu(g, nm(b, "%.80s.%s", p, "relu"), y);
    y = conv(g, nm(b, "%.80s.%s", p, "conv"), y, growth, 3, 1, 1, 1, false);
    return ch_graph_concat(g, nm(b, "%.80s.%s", p, "cat"), (const int[]){ x, y }, 2);
}

static void densenet(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 1, 28, 28);
    x = conv(g, "conv0", x, 8, 3, 1, 1, 1, false);
    x = ch_graph_max_pool2d(g, "pool0", x, &(ch_pool2d_args){ .kernel = 3, .stride = 2, .ceil_mode = true });
    x = dense_layer(g, "block1.0", x, 4);
    x = dense_layer(g, "block1.1", x, 4);
    x = ch_graph_batchnorm2d(g, "trans.0", x, NULL);
    x = ch_graph_relu(g, "trans.1", x);
    x = conv(g, "trans.2", x, 8, 1, 1, 0, 1, false);
    x = ch_graph_avg_pool2d(g, "trans.3", x, &(ch_pool2d_args){ .kernel = 3, .stride = 2, .padding = 1,
                                                               .exclude_pad = true });
    x = dense_layer(g, "block2.0", x, 4);
    x = dense_layer(g, "block2.1", x, 4);
    x = ch_graph_batchnorm2d(g, "norm5", x, &(ch_batchnorm_args){ .eps = 1e-4, .momentum = 0.05 });
    x = ch_graph_relu(g, "relu5", x);
    x = ch_graph_global_avg_pool(g, "pool5", x);
    x = ch_graph_flatten(g, "flatten", x);
    ch_graph_output(g, ch_graph_linear(g, "classifier", x, 10, true));
}

static void lognet(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 1, 28, 28);
    x = ch_graph_conv2d(g, "conv1", x, &(ch_conv2d_args){ .out_channels = 8, .kernel = 3, .padding = 2,
                                                         .dilation = 2 });
    x = ch_graph_tanh(g, "tanh", x);
    x = ch_graph_max_pool2d(g, "pool1", x, &(ch_pool2d_args){ .kernel = 2 });
    x = conv(g, "conv2", x, 16, 3, 1, 0, 2, true);
    x = ch_graph_leaky_relu(g, "leaky", x, 0.1);
    x = ch_graph_avg_pool2d(g, "pool2", x, &(ch_pool2d_args){ .kernel = 3, .stride = 2, .ceil_mode = true });
    x = ch_graph_flatten(g, "view", x);
    x = ch_graph_linear(g, "fc1", x, 32, true);
    x = ch_graph_sigmoid(g, "sigmoid", x);
    /* log_softmax is the loss's: cross-entropy of logits is the NLL of their log_softmax. */
    ch_graph_output(g, ch_graph_linear(g, "fc2", x, 10, false));
}

/* SENet's gate: pool, view(b, c), Linear, ReLU, Linear, Hardsigmoid, view(b, c, 1, 1), x * gate. */
static int se_gate(ch_graph *g, int x, int c, int r)
{
    int s = ch_graph_global_avg_pool(g, "se.pool", x);
    s = ch_graph_flatten(g, "se.view1", s);
    s = ch_graph_linear(g, "se.fc1", s, r, true);
    s = ch_graph_relu(g, "se.relu", s);
    s = ch_graph_linear(g, "se.fc2", s, c, true);
    s = ch_graph_hardsigmoid(g, "se.gate", s);
    s = ch_graph_view(g, "se.view2", s, c, 1, 1);
    return ch_graph_mul(g, "se.mul", x, s);
}

static void headnet(ch_graph *g, double dropout)
{
    int x = ch_graph_input(g, "x", 1, 28, 28);
    x = conv(g, "conv1", x, 8, 3, 2, 1, 1, false);
    x = ch_graph_batchnorm2d(g, "bn1", x, NULL);
    x = ch_graph_hardswish(g, "act1", x);
    x = conv(g, "conv2", x, 16, 3, 2, 1, 1, true);
    /* x * F.relu6(x + 3) / 6 */
    int h = ch_graph_affine(g, "hs.add", x, 1, 3);
    h = ch_graph_relu6(g, "hs.relu6", h);
    x = ch_graph_mul(g, "hs.mul", x, h);
    x = ch_graph_affine(g, "hs.div", x, 1.0 / 6, 0);
    x = se_gate(g, x, 16, 4);
    /* x + 0.5 * (conv3(x) - 0.25) */
    int y = conv(g, "conv3", x, 16, 3, 1, 1, 1, true);
    y = ch_graph_affine(g, "res.sub", y, 1, -0.25);
    y = ch_graph_affine(g, "res.scale", y, 0.5, 0);
    x = ch_graph_add(g, "res.add", x, y);
    /* a = sigmoid(att(x.mean((2, 3), keepdim=True).squeeze(-1).squeeze(-1))); x * a[..., None, None] */
    int a = ch_graph_mean_hw(g, "att.mean", x, true);
    a = ch_graph_flatten(g, "att.squeeze", a);
    a = ch_graph_sigmoid(g, "att.gate", ch_graph_linear(g, "att", a, 16, true));
    x = ch_graph_mul(g, "att.mul", x, ch_graph_view(g, "att.unsqueeze", a, 16, 1, 1));
    x = ch_graph_flatten(g, "view", x);
    x = ch_graph_linear(g, "fc1", x, 32, true);
    x = ch_graph_batchnorm1d(g, "bn_fc", x, NULL);
    x = ch_graph_relu(g, "relu", x);
    x = ch_graph_dropout(g, "drop", x, dropout);
    ch_graph_output(g, ch_graph_linear(g, "fc2", x, 10, true));
}

ch_status tg_build(const char *name, double dropout, ch_graph **out, ch_err *err)
{
    ch_graph *g;
    ch_status st = ch_graph_create(name, &g, err);
    if (st != CH_STATUS_OK) return st;
    if (strcmp(name, "resnet") == 0) resnet(g);
    else if (strcmp(name, "mobilenet") == 0) mobilenet(g, dropout);
    else if (strcmp(name, "densenet") == 0) densenet(g);
    else if (strcmp(name, "lognet") == 0) lognet(g);
    else if (strcmp(name, "headnet") == 0) headnet(g, dropout);
    else {
        ch_graph_free(g);
        snprintf(err->msg, sizeof err->msg, "unknown test model '%s'", name);
        return CH_STATUS_BAD_INPUT;
    }
    st = ch_graph_status(g, err);
    if (st != CH_STATUS_OK) {
        ch_graph_free(g);
        return st;
    }
    *out = g;
    return CH_STATUS_OK;
}
