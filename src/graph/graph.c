/* The graph builder: ch_graph_* of include/cohort.h. Each call checks its inputs by making the
 * node's layer for the shapes at hand (the layer constructors hold every geometry rule, so the
 * builder repeats none), takes the output shape from it and frees it. The first error is kept
 * and names the node; later calls do nothing and return -1. */
#include "graph/graph.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bounds that keep every size computation far from overflow, whatever a file asks for. */
enum { MAX_DIM = 1 << 16, MAX_NODES = 1 << 16, MAX_INPUTS = 1 << 12 };
static const double max_elems = 1u << 31;

static const char *const gop_names[] = {
    [CH_GOP_CONV2D] = "conv2d", [CH_GOP_BATCHNORM2D] = "batchnorm2d", [CH_GOP_RELU] = "relu",
    [CH_GOP_ACT] = "activation", [CH_GOP_MAX_POOL2D] = "max_pool2d", [CH_GOP_AVG_POOL2D] = "avg_pool2d",
    [CH_GOP_GLOBAL_AVG_POOL] = "global_avg_pool", [CH_GOP_MEAN_HW] = "mean", [CH_GOP_FLATTEN] = "flatten",
    [CH_GOP_LINEAR] = "linear", [CH_GOP_DROPOUT] = "dropout", [CH_GOP_ADD] = "add", [CH_GOP_MUL] = "mul",
    [CH_GOP_CONCAT] = "concat", [CH_GOP_VIEW] = "view", [CH_GOP_UPSAMPLE] = "upsample_nearest",
    [CH_GOP_SHUFFLE] = "channel_shuffle", [CH_GOP_SLICE] = "channel_slice",
    [CH_GOP_LAYERNORM] = "layer_norm", [CH_GOP_CONV_T] = "conv_transpose2d",
    [CH_GOP_BILINEAR] = "upsample_bilinear", [CH_GOP_PERMUTE] = "permute",
};

const char *ch_gop_name(ch_gop op) { return gop_names[op]; }

static const char *act_name(const ch_act *a);

const char *ch_gnode_op_name(const ch_gnode *nd)
{
    return nd->op == CH_GOP_ACT ? act_name(&nd->act) : ch_gop_name(nd->op);
}

static const char *act_name(const ch_act *a)
{
    switch (a->kind) {
    case CH_ACT_LEAKY_RELU: return "leaky_relu";
    case CH_ACT_CLIP: return "clip";
    case CH_ACT_SIGMOID: return "sigmoid";
    case CH_ACT_TANH: return "tanh";
    case CH_ACT_HARDSIGMOID: return "hardsigmoid";
    case CH_ACT_HARDSWISH: return "hardswish";
    case CH_ACT_AFFINE: return "affine";
    case CH_ACT_ERF: return "erf";
    case CH_ACT_GELU: case CH_ACT_GELU_TANH: return "gelu";
    }
    return "activation";
}

ch_status ch_graph_create(const char *name, ch_graph **out, ch_err *err)
{
    if (!name || !name[0] || strlen(name) >= sizeof((ch_graph *)0)->name)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "a graph needs a name of 1 to %zu characters",
                       sizeof((ch_graph *)0)->name - 1);
    ch_graph *g = calloc(1, sizeof *g);
    CH_CHECK_ALLOC(err, g);
    snprintf(g->name, sizeof g->name, "%s", name);
    g->input = g->output = -1;
    *out = g;
    return CH_STATUS_OK;
}

void ch_graph_free(ch_graph *g)
{
    if (!g) return;
    for (int i = 0; i < g->nnodes; i++) free(g->nodes[i].in);
    free(g->nodes);
    free(g->tensors);
    for (int i = 0; i < g->ninits; i++) free(g->inits[i].data);
    free(g->inits);
    free(g);
}

ch_status ch_graph_status(const ch_graph *g, ch_err *err)
{
    if (!g) return ch_fail(err, CH_STATUS_BAD_INPUT, "no graph");
    if (g->st != CH_STATUS_OK && err) *err = g->err;
    return g->st;
}

const char *ch_graph_name(const ch_graph *g) { return g->name; }

/* Starting values training cannot start from, refused as a checkpoint's are (checkpoint.c): NaN or
 * infinity anywhere, a negative running variance (BatchNorm takes its square root). */
static ch_status check_initial(const char *tensor, const float *v, size_t n, ch_err *err)
{
    const size_t len = strlen(tensor);
    const bool variance = len >= 11 && strcmp(tensor + len - 11, "running_var") == 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "tensor '%s' holds %s at element %zu: training cannot start from "
                           "it", tensor, isnan(v[i]) ? "nan" : v[i] > 0 ? "inf" : "-inf", i);
        if (variance && v[i] < 0)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "tensor '%s' holds a negative variance %g at element %zu",
                           tensor, (double)v[i], i);
    }
    return CH_STATUS_OK;
}

ch_status ch_graph_take_initial(ch_graph *g, const char *tensor, float *data, size_t count, ch_err *err)
{
    ch_status st = check_initial(tensor, data, count, err);
    if (st == CH_STATUS_OK && strlen(tensor) >= CH_NAME_MAX)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "tensor name '%.60s...' is longer than %d characters", tensor,
                     CH_NAME_MAX - 1);
    for (int i = 0; st == CH_STATUS_OK && i < g->ninits; i++)
        if (strcmp(g->inits[i].name, tensor) == 0)
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "two starting values for tensor '%s'", tensor);
    if (st == CH_STATUS_OK && g->ninits == g->init_cap) {
        const int cap = g->init_cap ? 2 * g->init_cap : 16;
        ch_ginit *n = realloc(g->inits, sizeof *n * (size_t)cap);
        if (n) {
            g->inits = n;
            g->init_cap = cap;
        } else {
            st = CH_SYS_FAIL(err, "realloc of starting values");
        }
    }
    if (st != CH_STATUS_OK) {
        free(data);
        return st;
    }
    ch_ginit *v = &g->inits[g->ninits++];
    v->data = data;
    v->count = count;
    snprintf(v->name, sizeof v->name, "%s", tensor);
    return CH_STATUS_OK;
}
int ch_graph_node_count(const ch_graph *g) { return g->nnodes; }

/* Keep the first error; returns -1 for the caller to return. */
static int fail(ch_graph *g, ch_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ch_graph *g, ch_status st, const char *fmt, ...)
{
    if (g->st != CH_STATUS_OK) return -1;
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof g->err.msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ch_fail(&g->err, st, "graph %s: %s", g->name, msg);
    g->st = st;
    return -1;
}

ch_shape3 ch_graph_shape(const ch_graph *g, int t)
{
    const ch_gtensor *x = &g->tensors[t];
    return (ch_shape3){ x->dims[0], x->dims[1], x->dims[2] };
}

static int new_tensor(ch_graph *g, int rank, ch_shape3 s, int producer)
{
    if (g->ntensors == g->tensor_cap) {
        const int cap = g->tensor_cap ? 2 * g->tensor_cap : 16;
        ch_gtensor *t = realloc(g->tensors, sizeof *t * (size_t)cap);
        if (!t) return fail(g, CH_STATUS_SYSTEM, "out of memory for tensors");
        g->tensors = t;
        g->tensor_cap = cap;
    }
    g->tensors[g->ntensors] = (ch_gtensor){ .rank = rank, .dims = { s.c, s.h, s.w },
                                            .dtype = CH_DTYPE_F32, .producer = producer };
    return g->ntensors++;
}

/* A name a node may have: 1..CH_NODE_NAME_MAX-1 printable characters, not taken. */
static bool check_name(ch_graph *g, const char *name)
{
    if (!name || !name[0] || strlen(name) >= CH_NODE_NAME_MAX) {
        fail(g, CH_STATUS_BAD_INPUT, "node names need 1 to %d characters ('%.40s')",
             CH_NODE_NAME_MAX - 1, name ? name : "(null)");
        return false;
    }
    for (const char *c = name; *c; c++)
        if (*c <= ' ' || *c == 127) {
            fail(g, CH_STATUS_BAD_INPUT, "node name '%s': spaces and control characters are not allowed", name);
            return false;
        }
    if (strcmp(name, g->input_name) == 0) {
        fail(g, CH_STATUS_BAD_INPUT, "node name '%s' is the input's", name);
        return false;
    }
    for (int i = 0; i < g->nnodes; i++)
        if (strcmp(g->nodes[i].name, name) == 0) {
            fail(g, CH_STATUS_BAD_INPUT, "two nodes are named '%s'", name);
            return false;
        }
    return true;
}

int ch_graph_input(ch_graph *g, const char *name, int c, int h, int w)
{
    if (!g || g->st != CH_STATUS_OK) return -1;
    if (g->input >= 0) return fail(g, CH_STATUS_BAD_INPUT, "a second input '%s' (one per graph)", name ? name : "");
    if (!check_name(g, name)) return -1;
    if (c < 1 || h < 1 || w < 1 || c > MAX_DIM || h > MAX_DIM || w > MAX_DIM ||
        (double)c * h * w > max_elems)
        return fail(g, CH_STATUS_BAD_INPUT, "input '%s': shape %dx%dx%d (each 1..%d)", name, c, h, w, MAX_DIM);
    snprintf(g->input_name, sizeof g->input_name, "%s", name);
    g->input = new_tensor(g, 3, (ch_shape3){ c, h, w }, -1);
    return g->input;
}

/* The layer of node nd for input shapes ins (what both the builder and the compiler make). */
static ch_status node_layer(const ch_graph *g, const ch_gnode *nd, ch_layer **out, ch_err *err)
{
    const ch_shape3 x = ch_graph_shape(g, nd->in[0]);
    switch (nd->op) {
    case CH_GOP_CONV2D:
    case CH_GOP_CONV_T: {
        const ch_conv2d_args *a = &nd->conv;
        const ch_conv2d_opts o = { .out_channels = a->out_channels, .kernel = a->kernel,
                                   .stride = a->stride ? a->stride : 1, .pad = a->padding,
                                   .dilation = a->dilation ? a->dilation : 1,
                                   .groups = a->groups ? a->groups : 1, .bias = !a->no_bias };
        if (nd->op == CH_GOP_CONV_T) return ch_conv_transpose2d_create(nd->name, x, &o, nd->out_pad, out, err);
        return ch_conv2d_create_opts(nd->name, x, &o, out, err);
    }
    case CH_GOP_BATCHNORM2D:
        if (g->tensors[nd->in[0]].rank == 1)
            return ch_batchnorm1d_create_opts(nd->name, x.c, nd->bn.eps, nd->bn.momentum, out, err);
        return ch_batchnorm2d_create_opts(nd->name, x, nd->bn.eps, nd->bn.momentum, out, err);
    case CH_GOP_RELU: return ch_relu_create(nd->name, x, out, err);
    case CH_GOP_ACT: return ch_activation_create(nd->name, x, &nd->act, out, err);
    case CH_GOP_MAX_POOL2D:
    case CH_GOP_AVG_POOL2D: {
        const ch_pool2d_opts o = { .kernel = nd->pool.kernel,
                                   .stride = nd->pool.stride ? nd->pool.stride : nd->pool.kernel,
                                   .pad = nd->pool.padding, .ceil_mode = nd->pool.ceil_mode,
                                   .count_include_pad = !nd->pool.exclude_pad };
        return nd->op == CH_GOP_MAX_POOL2D ? ch_maxpool2d_create_opts(nd->name, x, &o, out, err)
                                           : ch_avgpool2d_create_opts(nd->name, x, &o, out, err);
    }
    case CH_GOP_GLOBAL_AVG_POOL:
    case CH_GOP_MEAN_HW: return ch_global_avgpool_create(nd->name, x, out, err);
    case CH_GOP_FLATTEN: return ch_flatten_create(nd->name, x, out, err);
    case CH_GOP_BILINEAR: return ch_upsample_bilinear_create(nd->name, x, nd->scale[0], nd->scale[1], nd->align, out, err);
    case CH_GOP_UPSAMPLE: return ch_upsample_nearest_create(nd->name, x, nd->scale[0], nd->scale[1], out, err);
    case CH_GOP_LAYERNORM:
        return ch_layernorm_create(nd->name, x, nd->ln_axis, g->tensors[nd->in[0]].rank == 1, nd->bn.eps, out, err);
    case CH_GOP_SLICE: return ch_channel_slice_create(nd->name, x, nd->slice[0], nd->slice[1], out, err);
    case CH_GOP_SHUFFLE: return ch_channel_shuffle_create(nd->name, x, nd->groups, out, err);
    case CH_GOP_PERMUTE: return ch_permute_create(nd->name, x, nd->view, out, err);
    case CH_GOP_VIEW:
        return ch_view_create(nd->name, x, (ch_shape3){ nd->view[0], nd->view[1], nd->view[2] }, out, err);
    case CH_GOP_LINEAR: return ch_linear_create_opts(nd->name, x, nd->features, nd->bias, out, err);
    case CH_GOP_DROPOUT: return ch_dropout_create(nd->name, x, nd->p, (uint32_t)(nd - g->nodes), out, err);
    case CH_GOP_ADD:
    case CH_GOP_MUL: {
        /* Aligned from the right: a rank-1 operand is (1, 1, F) beside a rank-3 one. */
        const ch_gtensor *a = &g->tensors[nd->in[0]], *b = &g->tensors[nd->in[1]];
        int da[3], db[3], o[3];
        const bool flat = a->rank == 1 && b->rank == 1;
        for (int i = 0; i < 3; i++) {
            da[i] = a->rank == 1 && !flat ? (i == 2 ? a->dims[0] : 1) : a->dims[i];
            db[i] = b->rank == 1 && !flat ? (i == 2 ? b->dims[0] : 1) : b->dims[i];
            o[i] = da[i] == 1 ? db[i] : da[i];
        }
        return ch_bcast_create(nd->name, nd->op == CH_GOP_ADD ? CH_BCAST_ADD : CH_BCAST_MUL, da, db,
                               (ch_shape3){ o[0], o[1], o[2] }, out, err);
    }
    case CH_GOP_CONCAT: {
        ch_shape3 *ins = malloc(sizeof *ins * (size_t)nd->nin);
        CH_CHECK_ALLOC(err, ins);
        for (int i = 0; i < nd->nin; i++) ins[i] = ch_graph_shape(g, nd->in[i]);
        const ch_status st = ch_concat_create(nd->name, ins, nd->nin, out, err);
        free(ins);
        return st;
    }
    }
    return ch_fail(err, CH_STATUS_BAD_INPUT, "node %s: unknown op %d", nd->name, (int)nd->op);
}

ch_status ch_graph_node_layer(const ch_graph *g, int i, ch_layer **out, ch_err *err)
{
    return node_layer(g, &g->nodes[i], out, err);
}

/* The rank of a node's output, from its op and inputs. */
static int out_rank(const ch_graph *g, const ch_gnode *nd)
{
    const ch_gtensor *x = &g->tensors[nd->in[0]];
    switch (nd->op) {
    case CH_GOP_FLATTEN:
    case CH_GOP_LINEAR: return 1;
    case CH_GOP_VIEW: return 3;
    case CH_GOP_MEAN_HW: return nd->keepdim ? 3 : 1;
    case CH_GOP_ADD:
    case CH_GOP_MUL: return x->rank > g->tensors[nd->in[1]].rank ? x->rank : g->tensors[nd->in[1]].rank;
    default: return x->rank;
    }
}

/* Ops that need (c, h, w) inputs. */
static bool needs_rank3(ch_gop op)
{
    return op == CH_GOP_CONV2D || op == CH_GOP_CONV_T || op == CH_GOP_MAX_POOL2D ||
           op == CH_GOP_AVG_POOL2D || op == CH_GOP_GLOBAL_AVG_POOL || op == CH_GOP_MEAN_HW || op == CH_GOP_UPSAMPLE || op == CH_GOP_BILINEAR ||
           op == CH_GOP_SHUFFLE || op == CH_GOP_SLICE || op == CH_GOP_PERMUTE;
}

/* Append node nd (op and args set) named name, reading in (copied); returns its output tensor. */
static int add_node(ch_graph *g, const char *name, ch_gnode *nd, const int *in, int nin)
{
    if (!g || g->st != CH_STATUS_OK) return -1;
    if (!check_name(g, name)) return -1;
    snprintf(nd->name, sizeof nd->name, "%s", name);
    const char *what = ch_gnode_op_name(nd);
    if (g->output >= 0)
        return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s) added after the output was marked", nd->name, what);
    if (g->nnodes >= MAX_NODES) return fail(g, CH_STATUS_BAD_INPUT, "more than %d nodes", MAX_NODES);
    if (nin < 1 || nin > MAX_INPUTS)
        return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): %d inputs", nd->name, what, nin);
    for (int i = 0; i < nin; i++)
        if (in[i] < 0 || in[i] >= g->ntensors)
            return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): input %d is tensor %d, which does not exist",
                        nd->name, what, i, in[i]);
    if (needs_rank3(nd->op) && g->tensors[in[0]].rank != 3)
        return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): needs a (c, h, w) input, got (%d) features",
                    nd->name, what, g->tensors[in[0]].dims[0]);
    if (nd->op == CH_GOP_CONCAT)
        for (int i = 1; i < nin; i++)
            if (g->tensors[in[i]].rank != g->tensors[in[0]].rank)
                return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (concat): inputs of rank 1 and 3", nd->name);
    nd->in = malloc(sizeof(int) * (size_t)nin);
    if (!nd->in) return fail(g, CH_STATUS_SYSTEM, "out of memory for node '%s'", nd->name);
    memcpy(nd->in, in, sizeof(int) * (size_t)nin);
    nd->nin = nin;
    if (g->nnodes == g->node_cap) {
        const int cap = g->node_cap ? 2 * g->node_cap : 16;
        ch_gnode *n = realloc(g->nodes, sizeof *n * (size_t)cap);
        if (!n) {
            free(nd->in);
            return fail(g, CH_STATUS_SYSTEM, "out of memory for nodes");
        }
        g->nodes = n;
        g->node_cap = cap;
    }
    /* The layer is the check: it refuses what does not fit and gives the output shape. */
    ch_layer *l = NULL;
    ch_err e;
    const ch_status st = node_layer(g, nd, &l, &e);
    if (st != CH_STATUS_OK) {
        free(nd->in);
        return fail(g, st, "node '%s' (%s): %s", nd->name, what, e.msg);
    }
    const ch_shape3 s = l->out;
    ch_layer_free(l);
    if ((double)s.c * s.h * s.w > max_elems) {
        free(nd->in);
        return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): output %dx%dx%d is too large", nd->name, what,
                    s.c, s.h, s.w);
    }
    const int rank = out_rank(g, nd);
    const int t = new_tensor(g, rank, s, g->nnodes);
    if (t < 0) {
        free(nd->in);
        return -1;
    }
    nd->out = t;
    g->nodes[g->nnodes++] = *nd;
    return t;
}

static ch_gnode node_of(ch_gop op) { return (ch_gnode){ .op = op }; }

/* Why these bounds: eps keeps BatchNorm's 1/sqrt(var + eps) finite in float; slopes, clip bounds
 * and affine constants stay finite as floats with room to spare; dropout keeps 1/(1 - p) finite;
 * sizes stay within what the kernels' int arithmetic and the planner take. */
static const ch_garg_range garg_ranges[CH_GARG_COUNT] = {
    [CH_GARG_BN_EPS] = { 1e-12, 1 },       [CH_GARG_BN_MOMENTUM] = { 0, 1 },
    [CH_GARG_LEAKY_ALPHA] = { -1e6, 1e6 }, [CH_GARG_CLIP_BOUND] = { -1e30, 1e30 },
    [CH_GARG_AFFINE] = { -1e30, 1e30 },    [CH_GARG_DROPOUT_P] = { 0, 0.999999 },
    [CH_GARG_KERNEL] = { 1, 1 << 12 },     [CH_GARG_STRIDE] = { 1, 1 << 12 },
    [CH_GARG_PADDING] = { 0, 1 << 12 },    [CH_GARG_DILATION] = { 1, 1 << 12 },
    [CH_GARG_CHANNELS] = { 1, 1 << 16 },   [CH_GARG_FEATURES] = { 1, 1 << 20 },
    [CH_GARG_SCALE] = { 1, CH_UPSAMPLE_MAX },     [CH_GARG_LN_AXIS] = { CH_LAYER_NORM_CHANNELS, 3 },
    [CH_GARG_SIDE] = { 1, CH_UPSAMPLE_MAX_SIDE },
};

ch_garg_range ch_garg_range_of(ch_garg a) { return garg_ranges[a]; }

bool ch_garg_ok(ch_garg a, double v) { return v >= garg_ranges[a].lo && v <= garg_ranges[a].hi; }

/* "node 'n' (op): what v is not in lo..hi" into g; -1. */
static int refuse_arg(ch_graph *g, const char *name, const char *op, const char *what, double v, ch_garg a)
{
    return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): %s %.9g is not in %g..%g", name ? name : "", op, what, v,
                    garg_ranges[a].lo, garg_ranges[a].hi) : -1;
}

/* A size argument where 0 means the op's default (stride, dilation, groups). */
static bool size_ok(ch_garg a, int v, bool zero_default) { return (zero_default && v == 0) || ch_garg_ok(a, v); }

/* conv2d's and conv_transpose2d's node (the transposed one with output padding out_pad). */
static int conv_node(ch_graph *g, const char *name, int x, const ch_conv2d_args *a, ch_gop op, int out_pad)
{
    ch_gnode nd = node_of(op);
    const char *what = op == CH_GOP_CONV2D ? "conv2d" : "conv_transpose2d";
    if (!a) return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): no arguments", name ? name : "", what) : -1;
    if (!size_ok(CH_GARG_PADDING, out_pad, false))
        return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): output_padding %d", name ? name : "", what, out_pad) : -1;
    nd.out_pad = out_pad;
    nd.conv = *a;
    if (!size_ok(CH_GARG_CHANNELS, a->out_channels, false) || !size_ok(CH_GARG_KERNEL, a->kernel, false) ||
        !size_ok(CH_GARG_STRIDE, a->stride, true) || !size_ok(CH_GARG_PADDING, a->padding, false) ||
        !size_ok(CH_GARG_DILATION, a->dilation, true) || !size_ok(CH_GARG_CHANNELS, a->groups, true))
        return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): out_channels %d, kernel %d, stride %d, "
                        "padding %d, dilation %d, groups %d (channels and groups up to %d, the others up to %d)",
                        name ? name : "", what, a->out_channels, a->kernel, a->stride, a->padding, a->dilation, a->groups,
                        1 << 16, 1 << 12) : -1;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_conv2d(ch_graph *g, const char *name, int x, const ch_conv2d_args *a)
{
    return conv_node(g, name, x, a, CH_GOP_CONV2D, 0);
}

int ch_graph_conv_transpose2d(ch_graph *g, const char *name, int x, const ch_conv2d_args *a, int output_padding)
{
    return conv_node(g, name, x, a, CH_GOP_CONV_T, output_padding);
}

int ch_graph_batchnorm2d(ch_graph *g, const char *name, int x, const ch_batchnorm_args *a)
{
    ch_gnode nd = node_of(CH_GOP_BATCHNORM2D);
    nd.bn = (ch_batchnorm_args){ .eps = a && a->eps != 0 ? a->eps : 1e-5,
                                 .momentum = a && a->momentum != 0 ? a->momentum : 0.1 };
    if (!ch_garg_ok(CH_GARG_BN_EPS, nd.bn.eps))
        return refuse_arg(g, name, "batchnorm", "eps", nd.bn.eps, CH_GARG_BN_EPS);
    if (!ch_garg_ok(CH_GARG_BN_MOMENTUM, nd.bn.momentum))
        return refuse_arg(g, name, "batchnorm", "momentum", nd.bn.momentum, CH_GARG_BN_MOMENTUM);
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_layer_norm(ch_graph *g, const char *name, int x, int axis, double eps)
{
    ch_gnode nd = node_of(CH_GOP_LAYERNORM);
    nd.bn.eps = eps;
    nd.ln_axis = axis;
    if (!ch_garg_ok(CH_GARG_BN_EPS, nd.bn.eps)) return refuse_arg(g, name, "layer_norm", "eps", nd.bn.eps, CH_GARG_BN_EPS);
    if (!ch_garg_ok(CH_GARG_LN_AXIS, axis)) return refuse_arg(g, name, "layer_norm", "axis", axis, CH_GARG_LN_AXIS);
    return add_node(g, name, &nd, &x, 1);
}

/* Whether nodes a and b (same op) make parameters of the same shapes. */
static bool same_param_shapes(const ch_graph *g, int a, int b)
{
    ch_layer *la = NULL, *lb = NULL;
    ch_err e;
    bool same = ch_graph_node_layer(g, a, &la, &e) == CH_STATUS_OK && ch_graph_node_layer(g, b, &lb, &e) == CH_STATUS_OK &&
                la->nparams == lb->nparams;
    for (int i = 0; same && i < la->nparams; i++) {
        same = la->params[i].ndim == lb->params[i].ndim;
        for (int d = 0; same && d < la->params[i].ndim; d++) same = la->params[i].dims[d] == lb->params[i].dims[d];
    }
    ch_layer_free(la);
    ch_layer_free(lb);
    return same;
}

int ch_graph_reuse(ch_graph *g, const char *name, const char *node, int x)
{
    if (!g || g->st != CH_STATUS_OK) return -1;
    int k = -1;
    for (int i = 0; node && i < g->nnodes && k < 0; i++)
        if (strcmp(g->nodes[i].name, node) == 0) k = i;
    if (k < 0) return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (reuse): no node named '%.40s' before it", name ? name : "",
                           node ? node : "");
    if (g->nodes[k].tied) k = g->nodes[k].tied - 1;
    const ch_gop op = g->nodes[k].op;
    if (op != CH_GOP_CONV2D && op != CH_GOP_CONV_T && op != CH_GOP_LINEAR && op != CH_GOP_LAYERNORM &&
        op != CH_GOP_BATCHNORM2D)
        return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (reuse): '%s' is a %s node; only conv2d, conv_transpose2d, linear, "
                    "layer_norm and batchnorm nodes (modules with parameters) are used again", name ? name : "",
                    g->nodes[k].name, ch_gnode_op_name(&g->nodes[k]));
    ch_gnode nd = g->nodes[k];
    nd.in = NULL;
    nd.nin = 0;
    nd.tied = k + 1;
    const int t = add_node(g, name, &nd, &x, 1);
    if (t >= 0 && !same_param_shapes(g, k, g->nnodes - 1))
        return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (reuse of '%s'): its input gives parameters of other shapes than "
                    "that node's", name, g->nodes[k].name);
    return t;
}

int ch_graph_batchnorm1d(ch_graph *g, const char *name, int x, const ch_batchnorm_args *a)
{
    if (g && g->st == CH_STATUS_OK && x >= 0 && x < g->ntensors && g->tensors[x].rank != 1)
        return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (batchnorm1d): needs a (features) input, got %dx%dx%d",
                    name ? name : "", g->tensors[x].dims[0], g->tensors[x].dims[1], g->tensors[x].dims[2]);
    return ch_graph_batchnorm2d(g, name, x, a);
}

int ch_graph_relu(ch_graph *g, const char *name, int x)
{
    ch_gnode nd = node_of(CH_GOP_RELU);
    return add_node(g, name, &nd, &x, 1);
}

static int act(ch_graph *g, const char *name, int x, ch_act a)
{
    ch_gnode nd = node_of(CH_GOP_ACT);
    nd.act = a;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_leaky_relu(ch_graph *g, const char *name, int x, double negative_slope)
{
    if (!ch_garg_ok(CH_GARG_LEAKY_ALPHA, (float)negative_slope))
        return refuse_arg(g, name, "leaky_relu", "negative_slope (as float)", (float)negative_slope, CH_GARG_LEAKY_ALPHA);
    return act(g, name, x, (ch_act){ .kind = CH_ACT_LEAKY_RELU, .alpha = (float)negative_slope });
}

int ch_graph_clip(ch_graph *g, const char *name, int x, double min, double max)
{
    /* An open bound is an infinity (ONNX's Clip without min or max); a given one is a float. */
    if (!(min == -INFINITY || ch_garg_ok(CH_GARG_CLIP_BOUND, (float)min)))
        return refuse_arg(g, name, "clip", "min (as float)", (float)min, CH_GARG_CLIP_BOUND);
    if (!(max == INFINITY || ch_garg_ok(CH_GARG_CLIP_BOUND, (float)max)))
        return refuse_arg(g, name, "clip", "max (as float)", (float)max, CH_GARG_CLIP_BOUND);
    return act(g, name, x, (ch_act){ .kind = CH_ACT_CLIP, .lo = (float)min, .hi = (float)max });
}

int ch_graph_relu6(ch_graph *g, const char *name, int x) { return ch_graph_clip(g, name, x, 0, 6); }

int ch_graph_sigmoid(ch_graph *g, const char *name, int x)
{
    return act(g, name, x, (ch_act){ .kind = CH_ACT_SIGMOID });
}

int ch_graph_tanh(ch_graph *g, const char *name, int x)
{
    return act(g, name, x, (ch_act){ .kind = CH_ACT_TANH });
}

int ch_graph_hardsigmoid(ch_graph *g, const char *name, int x)
{
    return act(g, name, x, (ch_act){ .kind = CH_ACT_HARDSIGMOID });
}

int ch_graph_hardswish(ch_graph *g, const char *name, int x)
{
    return act(g, name, x, (ch_act){ .kind = CH_ACT_HARDSWISH });
}

int ch_graph_gelu(ch_graph *g, const char *name, int x, bool tanh_approximation)
{
    return act(g, name, x, (ch_act){ .kind = tanh_approximation ? CH_ACT_GELU_TANH : CH_ACT_GELU });
}

int ch_graph_erf(ch_graph *g, const char *name, int x)
{
    return act(g, name, x, (ch_act){ .kind = CH_ACT_ERF });
}

int ch_graph_affine(ch_graph *g, const char *name, int x, double scale, double shift)
{
    /* As float, the precision of the tensors it scales (x / 1e-30 is a scale just above 1e30). */
    if (!ch_garg_ok(CH_GARG_AFFINE, (float)scale))
        return refuse_arg(g, name, "affine", "scale (as float)", (float)scale, CH_GARG_AFFINE);
    if (!ch_garg_ok(CH_GARG_AFFINE, (float)shift))
        return refuse_arg(g, name, "affine", "shift (as float)", (float)shift, CH_GARG_AFFINE);
    return act(g, name, x, (ch_act){ .kind = CH_ACT_AFFINE, .alpha = (float)scale, .beta = (float)shift });
}

static int pool(ch_graph *g, const char *name, int x, ch_gop op, const ch_pool2d_args *a)
{
    ch_gnode nd = node_of(op);
    if (!a) return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): no arguments", name ? name : "", ch_gop_name(op)) : -1;
    if (!size_ok(CH_GARG_KERNEL, a->kernel, false) || !size_ok(CH_GARG_STRIDE, a->stride, true) ||
        !size_ok(CH_GARG_PADDING, a->padding, false))
        return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (%s): kernel %d, stride %d, padding %d",
                        name ? name : "", ch_gop_name(op), a->kernel, a->stride, a->padding) : -1;
    nd.pool = *a;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_max_pool2d(ch_graph *g, const char *name, int x, const ch_pool2d_args *a)
{
    return pool(g, name, x, CH_GOP_MAX_POOL2D, a);
}

int ch_graph_avg_pool2d(ch_graph *g, const char *name, int x, const ch_pool2d_args *a)
{
    return pool(g, name, x, CH_GOP_AVG_POOL2D, a);
}

int ch_graph_global_avg_pool(ch_graph *g, const char *name, int x)
{
    ch_gnode nd = node_of(CH_GOP_GLOBAL_AVG_POOL);
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_mean_hw(ch_graph *g, const char *name, int x, bool keepdim)
{
    ch_gnode nd = node_of(CH_GOP_MEAN_HW);
    nd.keepdim = keepdim;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_upsample_nearest(ch_graph *g, const char *name, int x, int scale_h, int scale_w)
{
    ch_gnode nd = node_of(CH_GOP_UPSAMPLE);
    nd.scale[0] = scale_h;
    nd.scale[1] = scale_w;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_upsample_bilinear(ch_graph *g, const char *name, int x, int out_h, int out_w, bool align_corners)
{
    ch_gnode nd = node_of(CH_GOP_BILINEAR);
    nd.scale[0] = out_h;
    nd.scale[1] = out_w;
    nd.align = align_corners;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_channel_shuffle(ch_graph *g, const char *name, int x, int groups)
{
    ch_gnode nd = node_of(CH_GOP_SHUFFLE);
    if (!ch_garg_ok(CH_GARG_CHANNELS, groups)) return refuse_arg(g, name, "channel_shuffle", "groups", groups, CH_GARG_CHANNELS);
    nd.groups = groups;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_permute(ch_graph *g, const char *name, int x, const int perm[4])
{
    ch_gnode nd = node_of(CH_GOP_PERMUTE);
    if (!perm || perm[0] != 0)
        return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (permute): the batch must stay first (perm[0] = 0, got %d)",
                        name ? name : "", perm ? perm[0] : -1)
                 : -1;
    for (int i = 0; i < 3; i++) nd.view[i] = perm[i + 1] - 1;   /* the layer checks it is an order */
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_channel_slice(ch_graph *g, const char *name, int x, int start, int count)
{
    ch_gnode nd = node_of(CH_GOP_SLICE);
    if (!ch_garg_ok(CH_GARG_PADDING, start)) return refuse_arg(g, name, "channel_slice", "start", start, CH_GARG_PADDING);
    if (!ch_garg_ok(CH_GARG_CHANNELS, count)) return refuse_arg(g, name, "channel_slice", "count", count, CH_GARG_CHANNELS);
    nd.slice[0] = start;
    nd.slice[1] = count;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_flatten(ch_graph *g, const char *name, int x)
{
    ch_gnode nd = node_of(CH_GOP_FLATTEN);
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_view(ch_graph *g, const char *name, int x, int c, int h, int w)
{
    ch_gnode nd = node_of(CH_GOP_VIEW);
    if (c < 1 || h < 1 || w < 1 || c > MAX_DIM * 16 || h > MAX_DIM || w > MAX_DIM)
        return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (view): shape %dx%dx%d", name ? name : "", c, h, w) : -1;
    nd.view[0] = c;
    nd.view[1] = h;
    nd.view[2] = w;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_linear(ch_graph *g, const char *name, int x, int out_features, bool bias)
{
    ch_gnode nd = node_of(CH_GOP_LINEAR);
    if (!ch_garg_ok(CH_GARG_FEATURES, out_features))
        return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (linear): %d out_features", name ? name : "",
                        out_features) : -1;
    if (g && g->st == CH_STATUS_OK && x >= 0 && x < g->ntensors && g->tensors[x].rank == 3 &&
        (g->tensors[x].dims[1] != 1 || g->tensors[x].dims[2] != 1))
        return fail(g, CH_STATUS_BAD_INPUT, "node '%s' (linear): input %dx%dx%d is not flat: flatten it first",
                    name ? name : "", g->tensors[x].dims[0], g->tensors[x].dims[1], g->tensors[x].dims[2]);
    nd.features = out_features;
    nd.bias = bias;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_dropout(ch_graph *g, const char *name, int x, double p)
{
    ch_gnode nd = node_of(CH_GOP_DROPOUT);
    if (!ch_garg_ok(CH_GARG_DROPOUT_P, p)) return refuse_arg(g, name, "dropout", "p", p, CH_GARG_DROPOUT_P);
    nd.p = p;
    return add_node(g, name, &nd, &x, 1);
}

int ch_graph_add(ch_graph *g, const char *name, int a, int b)
{
    ch_gnode nd = node_of(CH_GOP_ADD);
    return add_node(g, name, &nd, (const int[]){ a, b }, 2);
}

int ch_graph_mul(ch_graph *g, const char *name, int a, int b)
{
    ch_gnode nd = node_of(CH_GOP_MUL);
    return add_node(g, name, &nd, (const int[]){ a, b }, 2);
}

int ch_graph_concat(ch_graph *g, const char *name, const int *xs, int n)
{
    ch_gnode nd = node_of(CH_GOP_CONCAT);
    if (!xs || n < 1 || n > MAX_INPUTS)
        return g ? fail(g, CH_STATUS_BAD_INPUT, "node '%s' (concat): %d inputs", name ? name : "", n) : -1;
    return add_node(g, name, &nd, xs, n);
}

ch_status ch_graph_output(ch_graph *g, int x)
{
    if (!g) return CH_STATUS_BAD_INPUT;
    if (g->st != CH_STATUS_OK) return g->st;
    if (g->output >= 0) return (fail(g, CH_STATUS_BAD_INPUT, "the output is marked twice"), g->st);
    if (x < 0 || x >= g->ntensors) return (fail(g, CH_STATUS_BAD_INPUT, "the output is tensor %d, which does not exist", x), g->st);
    const ch_gtensor *t = &g->tensors[x];
    if (t->producer < 0) return (fail(g, CH_STATUS_BAD_INPUT, "the output is the input"), g->st);
    if (t->rank == 3 && (t->dims[1] != 1 || t->dims[2] != 1))
        return (fail(g, CH_STATUS_BAD_INPUT, "the output of node '%s' is %dx%dx%d, not a vector of logits",
                     g->nodes[t->producer].name, t->dims[0], t->dims[1], t->dims[2]), g->st);
    g->output = x;
    return CH_STATUS_OK;
}
