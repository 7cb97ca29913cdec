/* Import a PyTorch training export (ONNX, opsets 13 to 17) into a graph: ch_graph_load_onnx of
 * include/cohort.h. The file is parsed by protobuf-c with C generated at build time from Debian's
 * onnx.proto; this file walks the nodes in their (topological) order and turns each into builder
 * calls. What PyTorch emits around the model is folded, not run: the shape arithmetic of
 * x.view(x.size(0), -1) (Shape, Gather, Unsqueeze, Concat, Reshape, with the batch symbolic), a
 * trailing LogSoftmax or Softmax (the cross-entropy's own), zero Pads, Identity, Cast. Anything
 * else is refused with one line naming the operator, the node and the file: never a partial
 * graph. Weights keep their state_dict names, which a training export gives its initializers. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "graph/graph.h"
#include "graph/onnx.h"
#include "graph/onnx_values.h"

/* protobuf-c reads at most 2 GiB, as ONNX's own tools do. */
static const size_t max_file = (size_t)2 << 30;
enum { MAX_NODES = 1 << 16, OPSET_MIN = 13, OPSET_MAX = 17 };

typedef struct imp {
    const char *file;
    ch_graph *g;
    const Onnx__GraphProto *gp;
    int opset;
    const char *output;         /* the graph output's name */
    ch_ovals vals;
    ch_err *err;
    const Onnx__NodeProto *node; /* the node being imported, for messages */
    char shown[4][96];
} imp;

/* A string from the file as it may appear in a one-line message: printable, at most 80 bytes. */
static const char *sh(imp *m, int slot, const char *s)
{
    char *b = m->shown[slot];
    size_t k = 0;
    for (; s && s[k] && k < 80; k++) b[k] = s[k] > ' ' && s[k] < 127 ? s[k] : '?';
    if (s && s[k]) b[k++] = '~';
    b[k] = 0;
    return b;
}

static ch_status bad(imp *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ch_status bad(imp *m, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m->node)
        return ch_fail(m->err, CH_STATUS_BAD_INPUT, "%s: node '%s' (%s): %s", m->file, sh(m, 2, m->node->name),
                       sh(m, 3, m->node->op_type), msg);
    return ch_fail(m->err, CH_STATUS_BAD_INPUT, "%s: %s", m->file, msg);
}

/* ---- attributes ---- */

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (n->attribute[i]->name && strcmp(n->attribute[i]->name, name) == 0) return n->attribute[i];
    return NULL;
}

static ch_status attr_int(imp *m, const char *name, int64_t def, int64_t *out)
{
    const Onnx__AttributeProto *a = attr(m->node, name);
    if (!a) return (*out = def, CH_STATUS_OK);
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT) return bad(m, "attribute %s is not an integer", name);
    *out = a->i;
    return CH_STATUS_OK;
}

static ch_status attr_float(imp *m, const char *name, double def, double *out)
{
    const Onnx__AttributeProto *a = attr(m->node, name);
    if (!a) return (*out = def, CH_STATUS_OK);
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT || !isfinite(a->f))
        return bad(m, "attribute %s is not a finite float", name);
    *out = a->f;
    return CH_STATUS_OK;
}

/* A pair for the two spatial dimensions that must be equal (cohort's kernels are square), from an
 * attribute of n values (2, or 4 for pads) that is def when absent. */
static ch_status attr_square(imp *m, const char *name, int n, int64_t def, int64_t lo, int64_t hi, int *out)
{
    const Onnx__AttributeProto *a = attr(m->node, name);
    if (!a) return (*out = (int)def, CH_STATUS_OK);
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS || a->n_ints != (size_t)n)
        return bad(m, "attribute %s is not %d integers", name, n);
    for (int i = 1; i < n; i++)
        if (a->ints[i] != a->ints[0])
            return bad(m, "%s (%lld, %lld%s): cohort supports equal values for height and width%s", name,
                       (long long)a->ints[0], (long long)a->ints[1], n == 4 ? ", ..." : "",
                       n == 4 ? " on every side" : "");
    if (a->ints[0] < lo || a->ints[0] > hi) return bad(m, "%s %lld is outside %lld..%lld", name,
                                                       (long long)a->ints[0], (long long)lo, (long long)hi);
    *out = (int)a->ints[0];
    return CH_STATUS_OK;
}

static ch_status no_auto_pad(imp *m)
{
    const Onnx__AttributeProto *a = attr(m->node, "auto_pad");
    if (a && !(a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING && a->s.len == 6 &&
               memcmp(a->s.data, "NOTSET", 6) == 0))
        return bad(m, "auto_pad is not supported (PyTorch exports explicit pads)");
    return CH_STATUS_OK;
}

/* A float32 attribute holds what the user typed (0.1, 1e-5) to float precision: give it back as
 * typed, so that BatchNorm's momentum is 0.1 as in PyTorch, not 0.100000024. */
static double as_typed(double x)
{
    char b[32];
    snprintf(b, sizeof b, "%.6g", x);
    return strtod(b, NULL);
}

/* ---- values ---- */

/* The k-th input of the node (NULL when absent and optional). */
static ch_status input(imp *m, size_t k, bool required, ch_oval **out)
{
    const Onnx__NodeProto *n = m->node;
    *out = NULL;
    if (k >= n->n_input || !n->input[k][0]) {
        if (required) return bad(m, "input %zu is missing", k);
        return CH_STATUS_OK;
    }
    ch_oval *v = ch_ovals_find(&m->vals, n->input[k]);
    if (!v) return bad(m, "reads '%s', which no earlier node makes and no initializer holds", sh(m, 0, n->input[k]));
    if (v->kind == CH_OVAL_DEAD) return bad(m, "reads '%s', %s", sh(m, 0, v->name), v->why);
    if (v->folded_softmax)
        return bad(m, "reads '%s', the output of a LogSoftmax/Softmax: cohort folds those into the loss, only as "
                   "the model's last operation", sh(m, 0, v->name));
    *out = v;
    return CH_STATUS_OK;
}

/* Input k, which must be a tensor computed from the model's input. */
static ch_status tensor_val(imp *m, size_t k, ch_oval **out)
{
    CH_TRY(input(m, k, true, out));
    if ((*out)->kind != CH_OVAL_TENSOR)
        return bad(m, "input '%s' is a constant or an initializer; cohort supports it only as a tensor computed "
                   "from the model's input", sh(m, 0, (*out)->name));
    if ((*out)->expanded)
        return bad(m, "reads '%s', the output of an Expand: cohort supports Expand only into an Add or Mul, which "
                   "broadcast", sh(m, 0, (*out)->name));
    if ((*out)->pending)
        return bad(m, "reads '%s', a (batch, %d, %d) tensor: cohort has (batch, features) and (batch, c, h, w) "
                   "tensors only", sh(m, 0, (*out)->name), (*out)->pdims[0], (*out)->pdims[1]);
    if ((*out)->padded && strcmp(m->node->op_type, "AveragePool") != 0)
        return bad(m, "reads '%s', the output of a Pad: cohort supports a zero Pad only before an AveragePool "
                   "(AvgPool2d's count_include_pad); pad in the Conv or the pooling instead", sh(m, 0, (*out)->name));
    return CH_STATUS_OK;
}

static ch_status tensor_in(imp *m, size_t k, int *t)
{
    ch_oval *v;
    CH_TRY(tensor_val(m, k, &v));
    *t = v->tensor;
    return CH_STATUS_OK;
}

/* A constant input (a Constant's output, folded shape arithmetic, or a small initializer). */
static ch_status const_in(imp *m, size_t k, bool required, ch_oval **out)
{
    CH_TRY(input(m, k, required, out));
    ch_oval *v = *out;
    if (!v) return CH_STATUS_OK;
    if (v->kind == CH_OVAL_PARAM) {
        char what[160];
        snprintf(what, sizeof what, "initializer '%s'", sh(m, 0, v->name));
        ch_oval c = *v;
        ch_err e;
        if (ch_onnx_tensor_const(v->init, what, &c, &e) != CH_STATUS_OK) return bad(m, "%s", e.msg);
        c.uses = v->uses + 1; /* read: not an unused initializer */
        *v = c;               /* from now on, the constant it holds */
    }
    if (v->kind != CH_OVAL_CONST)
        return bad(m, "input '%s' must be a constant: cohort computes no shapes or bounds from data",
                   sh(m, 0, v->name));
    return CH_STATUS_OK;
}

static ch_status define(imp *m, size_t k, ch_oval_kind kind, ch_oval **out)
{
    const Onnx__NodeProto *n = m->node;
    if (k >= n->n_output || !n->output[k][0]) {
        *out = NULL;
        return kind == CH_OVAL_DEAD ? CH_STATUS_OK : bad(m, "output %zu is missing", k);
    }
    ch_err e;
    *out = ch_ovals_add(&m->vals, n->output[k], kind, &e);
    return *out ? CH_STATUS_OK : bad(m, "%s", e.msg);
}

/* Outputs from k on are ones cohort does not compute: reading them is refused, saying why. */
static ch_status dead_from(imp *m, size_t k, const char *why)
{
    for (; k < m->node->n_output; k++) {
        ch_oval *v;
        CH_TRY(define(m, k, CH_OVAL_DEAD, &v));
        if (v) v->why = why;
    }
    return CH_STATUS_OK;
}

/* The node's output 0 is graph tensor t (a builder result: -1 carries the builder's error). */
static ch_status tensor_out(imp *m, int t)
{
    if (t < 0) {
        ch_err e;
        ch_graph_status(m->g, &e);
        return bad(m, "%s", e.msg);
    }
    ch_oval *v;
    CH_TRY(define(m, 0, CH_OVAL_TENSOR, &v));
    v->tensor = t;
    return CH_STATUS_OK;
}

/* Output 0 is input value src under a new name (Identity and the ops folded away). */
static ch_status alias_out(imp *m, const ch_oval *src)
{
    const ch_oval copy = *src;
    ch_oval *v;
    CH_TRY(define(m, 0, copy.kind, &v));
    const char *name = v->name;
    *v = copy;
    v->name = name;
    v->uses = 0;
    return CH_STATUS_OK;
}

/* A name for a node without weights: its own when usable, else OP_INDEX. */
static const char *node_name(imp *m, char *buf, size_t len)
{
    const char *s = m->node->name;
    bool ok = s && s[0] && strlen(s) < CH_NODE_NAME_MAX;
    for (const char *c = s; ok && *c; c++) ok = *c > ' ' && *c < 127;
    if (ok) return s;
    snprintf(buf, len, "%s_%d", sh(m, 0, m->node->op_type), ch_graph_node_count(m->g));
    return buf;
}

/* ---- weights ---- */

static ch_status inference_export(imp *m, const char *init)
{
    return bad(m, "an inference export (initializer '%s'; BatchNorm folded into Conv or run in eval mode) cannot "
               "train: export with torch.onnx.export(model, x, \"%s\", training=torch.onnx.TrainingMode.TRAINING, "
               "do_constant_folding=False, dynamic_axes={\"input\": {0: \"batch\"}})", sh(m, 0, init),
               sh(m, 1, m->file));
}

/* The module path of a weight named PATH.weight, which a training export keeps. */
static ch_status weight_prefix(imp *m, const ch_oval *w, char *prefix)
{
    const char *s = w->name;
    const size_t len = strlen(s);
    if (strncmp(s, "onnx::", 6) == 0) return inference_export(m, s);
    if (len < 8 || strcmp(s + len - 7, ".weight") != 0 || len - 7 >= CH_NODE_NAME_MAX)
        return bad(m, "weight '%s' is not a state_dict name (MODULE.weight, under %d characters): export the "
                   "nn.Module in training mode", sh(m, 0, s), CH_NODE_NAME_MAX);
    memcpy(prefix, s, len - 7);
    prefix[len - 7] = 0;
    return CH_STATUS_OK;
}

/* Input k is the initializer PREFIX.SUFFIX of the given shape, read by no other node: its values
 * become the graph's starting values. Absent and optional: *present false. */
static ch_status param(imp *m, size_t k, const char *prefix, const char *suffix, const int64_t *shape, int rank,
                       bool *present)
{
    ch_oval *v;
    CH_TRY(input(m, k, present == NULL, &v));
    if (present) *present = v != NULL;
    if (!v) return CH_STATUS_OK;
    if (v->kind == CH_OVAL_PARAM_T) v = ch_ovals_find(&m->vals, v->init->name);
    if (!v || v->kind != CH_OVAL_PARAM)
        return bad(m, "input %zu ('%s') must be an initializer (a weight)", k, v ? sh(m, 0, v->name) : "?");
    char want[CH_NAME_MAX];
    snprintf(want, sizeof want, "%s.%s", prefix, suffix);
    if (strncmp(v->name, "onnx::", 6) == 0) return inference_export(m, v->name);
    if (strcmp(v->name, want) != 0)
        return bad(m, "initializer '%s' should be named '%s' (state_dict names, as a training export keeps them)",
                   sh(m, 0, v->name), sh(m, 1, want));
    if (v->uses++ > 0)
        return bad(m, "initializer '%s' is read by two nodes: shared weights are not supported", sh(m, 0, v->name));
    const Onnx__TensorProto *t = v->init;
    bool same = t->n_dims == (size_t)rank;
    for (int i = 0; same && i < rank; i++) same = t->dims[i] == shape[i];
    if (!same) {
        char got[96] = "", need[96] = "";
        for (size_t i = 0; i < t->n_dims && i < 6; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->dims[i]);
        for (int i = 0; i < rank; i++)
            snprintf(need + strlen(need), sizeof need - strlen(need), "%s%lld", i ? ", " : "", (long long)shape[i]);
        return bad(m, "initializer '%s' has shape (%s); the node needs (%s)", sh(m, 0, v->name), got, need);
    }
    float *data;
    size_t count;
    char what[160];
    ch_err e;
    snprintf(what, sizeof what, "initializer '%s'", sh(m, 0, v->name));
    if (ch_onnx_tensor_floats(t, what, &data, &count, &e) != CH_STATUS_OK) return bad(m, "%s", e.msg);
    /* The graph checks the values as a checkpoint's are checked (NaN, a negative running_var). */
    if (ch_graph_take_initial(m->g, v->name, data, count, &e) != CH_STATUS_OK) return bad(m, "initializer: %s", e.msg);
    return CH_STATUS_OK;
}

/* The weight input k (an initializer, maybe transposed) and its module path. */
static ch_status weight_of(imp *m, size_t k, const Onnx__TensorProto **t, char *prefix)
{
    ch_oval *v;
    CH_TRY(input(m, k, true, &v));
    if (v->kind != CH_OVAL_PARAM && v->kind != CH_OVAL_PARAM_T)
        return bad(m, "input %zu ('%s') must be an initializer (a weight)", k, sh(m, 0, v->name));
    const ch_oval *w = v->kind == CH_OVAL_PARAM_T ? ch_ovals_find(&m->vals, v->init->name) : v;
    *t = v->init;
    return weight_prefix(m, w, prefix);
}

/* ---- operators ---- */

static int features_of(const ch_graph *g, int t)
{
    const ch_gtensor *x = &g->tensors[t];
    return x->rank == 1 ? x->dims[0] : x->dims[1] == 1 && x->dims[2] == 1 ? x->dims[0] : -1;
}

static ch_status op_conv(imp *m)
{
    int x = 0, k = 0, stride = 0, pad = 0, dil = 0;
    int64_t group = 0;
    const Onnx__TensorProto *w = NULL;
    char prefix[CH_NODE_NAME_MAX];
    CH_TRY(tensor_in(m, 0, &x));
    CH_TRY(weight_of(m, 1, &w, prefix));
    CH_TRY(no_auto_pad(m));
    if (w->n_dims != 4) return bad(m, "weight '%s' has %zu dimensions, not 4", sh(m, 0, w->name), w->n_dims);
    CH_TRY(attr_square(m, "kernel_shape", 2, w->dims[2], 1, 1 << 12, &k));
    CH_TRY(attr_square(m, "strides", 2, 1, 1, 1 << 12, &stride));
    CH_TRY(attr_square(m, "pads", 4, 0, 0, 1 << 12, &pad));
    CH_TRY(attr_square(m, "dilations", 2, 1, 1, 1 << 12, &dil));
    CH_TRY(attr_int(m, "group", 1, &group));
    const int cin = m->g->tensors[x].dims[0];
    if (m->g->tensors[x].rank != 3) return bad(m, "needs a (batch, c, h, w) input");
    if (group < 1 || group > cin || cin % group != 0 || w->dims[0] % group != 0 || w->dims[0] < 1 ||
        w->dims[0] > (1 << 16))
        return bad(m, "group %lld does not divide %d input and %lld output channels", (long long)group, cin,
                   (long long)w->dims[0]);
    const int64_t shape[4] = { w->dims[0], cin / group, k, k };
    bool has_bias;
    CH_TRY(param(m, 1, prefix, "weight", shape, 4, NULL));
    CH_TRY(param(m, 2, prefix, "bias", shape, 1, &has_bias));
    const ch_conv2d_args a = { .out_channels = (int)w->dims[0], .kernel = k, .stride = stride, .padding = pad,
                               .dilation = dil, .groups = (int)group, .no_bias = !has_bias };
    return tensor_out(m, ch_graph_conv2d(m->g, prefix, x, &a));
}

static ch_status op_batchnorm(imp *m)
{
    int x = 0;
    const Onnx__TensorProto *w = NULL;
    char prefix[CH_NODE_NAME_MAX];
    CH_TRY(tensor_in(m, 0, &x));
    int64_t training = m->node->n_output > 1; /* opset 13: five outputs in training mode */
    if (m->opset >= 14) CH_TRY(attr_int(m, "training_mode", 0, &training));
    if (!training) return inference_export(m, m->node->n_input > 3 ? m->node->input[3] : "?");
    CH_TRY(weight_of(m, 1, &w, prefix));
    /* A (batch, features) input is BatchNorm1d's; a (batch, c, length) one has no cohort shape. */
    const int64_t c[1] = { m->g->tensors[x].dims[0] };
    static const char *const names[4] = { "weight", "bias", "running_mean", "running_var" };
    for (size_t i = 0; i < 4; i++) CH_TRY(param(m, i + 1, prefix, names[i], c, 1, NULL));
    double eps = 0, momentum = 0;
    CH_TRY(attr_float(m, "epsilon", 1e-5, &eps));
    CH_TRY(attr_float(m, "momentum", 0.9, &momentum));
    if (!(eps > 0 && eps < 1) || !(momentum >= 0 && momentum < 1))
        return bad(m, "epsilon %g or momentum %g outside (0, 1)", eps, momentum);
    /* ONNX keeps momentum * running + (1 - momentum) * batch: PyTorch's momentum is 1 - it. */
    const ch_batchnorm_args a = { .eps = as_typed(eps), .momentum = as_typed(1 - momentum) };
    CH_TRY(tensor_out(m, ch_graph_batchnorm2d(m->g, prefix, x, &a)));
    return dead_from(m, 1, "a running statistic of BatchNormalization, which cohort keeps itself");
}

static ch_status op_activation(imp *m)
{
    int x = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(tensor_in(m, 0, &x));
    const char *op = m->node->op_type, *name = node_name(m, buf, sizeof buf);
    if (strcmp(op, "Relu") == 0) return tensor_out(m, ch_graph_relu(m->g, name, x));
    if (strcmp(op, "Sigmoid") == 0) return tensor_out(m, ch_graph_sigmoid(m->g, name, x));
    if (strcmp(op, "Tanh") == 0) return tensor_out(m, ch_graph_tanh(m->g, name, x));
    if (strcmp(op, "HardSwish") == 0) return tensor_out(m, ch_graph_hardswish(m->g, name, x));
    if (strcmp(op, "HardSigmoid") == 0) {
        double alpha = 0, beta = 0;
        CH_TRY(attr_float(m, "alpha", 0.2, &alpha));
        CH_TRY(attr_float(m, "beta", 0.5, &beta));
        if ((float)alpha != (float)(1.0 / 6) || beta != 0.5)
            return bad(m, "alpha %g, beta %g: only PyTorch's hardsigmoid (alpha 1/6, beta 0.5) is supported", alpha,
                       beta);
        return tensor_out(m, ch_graph_hardsigmoid(m->g, name, x));
    }
    if (strcmp(op, "LeakyRelu") == 0) {
        double alpha = 0;
        CH_TRY(attr_float(m, "alpha", 0.01, &alpha));
        return tensor_out(m, ch_graph_leaky_relu(m->g, name, x, as_typed(alpha)));
    }
    /* Clip: bounds are optional constant inputs (opset 11 on). */
    ch_oval *lo, *hi;
    CH_TRY(const_in(m, 1, false, &lo));
    CH_TRY(const_in(m, 2, false, &hi));
    if ((lo && lo->n != 1) || (hi && hi->n != 1)) return bad(m, "Clip bounds must be scalars");
    return tensor_out(m, ch_graph_clip(m->g, name, x, lo ? lo->f[0] : -INFINITY, hi ? hi->f[0] : INFINITY));
}

static ch_status op_pool(imp *m)
{
    int x = 0, k = 0, stride = 0, pad = 0, dil = 0;
    int64_t ceil_mode = 0, include_pad = 0, order = 0;
    char buf[CH_NODE_NAME_MAX];
    const bool is_max = strcmp(m->node->op_type, "MaxPool") == 0;
    ch_oval *xv;
    CH_TRY(tensor_val(m, 0, &xv));
    x = xv->tensor;
    CH_TRY(no_auto_pad(m));
    if (!attr(m->node, "kernel_shape")) return bad(m, "no kernel_shape");
    CH_TRY(attr_square(m, "kernel_shape", 2, 1, 1, 1 << 12, &k));
    CH_TRY(attr_square(m, "strides", 2, 1, 1, 1 << 12, &stride));
    CH_TRY(attr_square(m, "pads", 4, 0, 0, 1 << 12, &pad));
    CH_TRY(attr_square(m, "dilations", 2, 1, 1, 1, &dil));
    CH_TRY(attr_int(m, "ceil_mode", 0, &ceil_mode));
    CH_TRY(attr_int(m, "count_include_pad", 0, &include_pad));
    CH_TRY(attr_int(m, "storage_order", 0, &order));
    if (order != 0) return bad(m, "storage_order %lld (column-major indices) is not supported", (long long)order);
    if (xv->padded) {
        /* Pad + AveragePool: AvgPool2d(padding=p) with count_include_pad, as torch exports it. */
        if (pad != 0 || ceil_mode != 0)
            return bad(m, "an AveragePool with pads or ceil_mode after a Pad is not supported");
        pad = xv->padded;
        include_pad = 1;
    }
    const ch_pool2d_args a = { .kernel = k, .stride = stride, .padding = pad, .ceil_mode = ceil_mode != 0,
                               .exclude_pad = include_pad == 0 };
    const char *name = node_name(m, buf, sizeof buf);
    CH_TRY(tensor_out(m, is_max ? ch_graph_max_pool2d(m->g, name, x, &a) : ch_graph_avg_pool2d(m->g, name, x, &a)));
    return dead_from(m, 1, "MaxPool's indices, which cohort does not compute");
}

static ch_status op_global_pool(imp *m)
{
    int x = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(tensor_in(m, 0, &x));
    return tensor_out(m, ch_graph_global_avg_pool(m->g, node_name(m, buf, sizeof buf), x));
}

static ch_status op_reduce_mean(imp *m)
{
    int x = 0;
    int64_t keep = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(tensor_in(m, 0, &x));
    CH_TRY(attr_int(m, "keepdims", 1, &keep));
    const Onnx__AttributeProto *a = attr(m->node, "axes");
    bool hw = a && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS && a->n_ints == 2 &&
              m->g->tensors[x].rank == 3;
    for (size_t i = 0; hw && i < 2; i++) hw = a->ints[i] == 2 || a->ints[i] == 3 || a->ints[i] == -1 || a->ints[i] == -2;
    if (hw) hw = (a->ints[0] + 4) % 4 != (a->ints[1] + 4) % 4;
    if (!hw) return bad(m, "only the mean over height and width (axes 2, 3) of a (batch, c, h, w) tensor is supported");
    return tensor_out(m, ch_graph_mean_hw(m->g, node_name(m, buf, sizeof buf), x, keep != 0));
}

static ch_status op_flatten(imp *m)
{
    ch_oval *v;
    int64_t axis = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(tensor_val(m, 0, &v));
    CH_TRY(attr_int(m, "axis", 1, &axis));
    if (axis != 1) return bad(m, "axis %lld: only flattening all but the batch dimension (axis 1) is supported",
                              (long long)axis);
    if (m->g->tensors[v->tensor].rank == 1) return alias_out(m, v);
    return tensor_out(m, ch_graph_flatten(m->g, node_name(m, buf, sizeof buf), v->tensor));
}

/* Reshape with the batch symbolic: to (batch, c*h*w) is flatten; to the same shape, nothing; to
 * another (batch, c, h, w), a view. */
static ch_status op_reshape(imp *m)
{
    ch_oval *v, *s;
    int64_t allowzero = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(tensor_val(m, 0, &v));
    CH_TRY(const_in(m, 1, true, &s));
    CH_TRY(attr_int(m, "allowzero", 0, &allowzero));
    const ch_gtensor *x = &m->g->tensors[v->tensor];
    const int64_t in[4] = { CH_ONNX_BATCH, x->dims[0], x->rank == 3 ? x->dims[1] : 1, x->rank == 3 ? x->dims[2] : 1 };
    const int in_rank = x->rank + 1;
    const double per = (double)x->dims[0] * x->dims[1] * x->dims[2];
    if (s->is_float || s->rank != 1 || s->n < 2 || s->n > 4 || allowzero)
        return bad(m, "the target shape must be 2 to 4 integers (batch first)");
    int64_t t[4];
    int infer = -1;
    double known = 1;
    for (int i = 0; i < s->n; i++) {
        t[i] = s->i[i];
        if (t[i] == 0 && i < in_rank) t[i] = in[i];
        if (t[i] == -1) {
            if (infer >= 0) return bad(m, "two dimensions of the target shape are -1");
            infer = i;
        } else if (i > 0 && (t[i] < 1 || t[i] > (1 << 30))) {
            return bad(m, "target dimension %d is %lld", i, t[i] == CH_ONNX_BATCH ? -2LL : (long long)t[i]);
        } else if (i > 0) {
            known *= (double)t[i];
        }
    }
    if (t[0] != CH_ONNX_BATCH && infer != 0)
        return bad(m, "reshapes to a batch of %lld, fixed when the model was exported: write x.view(x.size(0), -1) "
                   "or torch.flatten(x, 1)", (long long)t[0]);
    if (infer > 0) t[infer] = (int64_t)(per / known);
    if (infer > 0 ? fmod(per, known) != 0 : known != per)
        return bad(m, "target shape does not hold the %.0f values of a sample", per);
    if (s->n == 2) {
        if (x->rank == 1) return alias_out(m, v);
        return tensor_out(m, ch_graph_flatten(m->g, node_name(m, buf, sizeof buf), v->tensor));
    }
    if (s->n == in_rank && x->rank == 3 && t[1] == in[1] && t[2] == in[2] && t[3] == in[3]) return alias_out(m, v);
    if (s->n == 4)
        return tensor_out(m, ch_graph_view(m->g, node_name(m, buf, sizeof buf), v->tensor, (int)t[1], (int)t[2],
                                           (int)t[3]));
    return bad(m, "reshape of a (%d, %d, %d) sample to %d dimensions: cohort reshapes to (batch, features) or "
               "(batch, c, h, w) only", x->dims[0], x->dims[1], x->dims[2], s->n);
}

static ch_status op_gemm(imp *m)
{
    int x = 0;
    int64_t ta = 0, tb = 0;
    double alpha = 0, beta = 0;
    const Onnx__TensorProto *w = NULL;
    char prefix[CH_NODE_NAME_MAX];
    CH_TRY(tensor_in(m, 0, &x));
    CH_TRY(weight_of(m, 1, &w, prefix));
    CH_TRY(attr_int(m, "transA", 0, &ta));
    CH_TRY(attr_int(m, "transB", 0, &tb));
    CH_TRY(attr_float(m, "alpha", 1, &alpha));
    CH_TRY(attr_float(m, "beta", 1, &beta));
    if (ta != 0 || tb != 1 || alpha != 1 || beta != 1)
        return bad(m, "only nn.Linear's form (transA 0, transB 1, alpha 1, beta 1) is supported");
    const int f = features_of(m->g, x);
    if (f < 0) return bad(m, "input is not flat: flatten it first");
    if (w->n_dims != 2 || w->dims[0] < 1 || w->dims[0] > (1 << 20))
        return bad(m, "weight '%s' is not (out_features, in_features)", sh(m, 0, w->name));
    const int64_t shape[2] = { w->dims[0], f };
    bool has_bias;
    CH_TRY(param(m, 1, prefix, "weight", shape, 2, NULL));
    CH_TRY(param(m, 2, prefix, "bias", shape, 1, &has_bias));
    return tensor_out(m, ch_graph_linear(m->g, prefix, x, (int)w->dims[0], has_bias));
}

/* nn.Linear without bias: MatMul(x, Transpose(weight)). */
static ch_status op_matmul(imp *m)
{
    int x = 0;
    ch_oval *b;
    const Onnx__TensorProto *w = NULL;
    char prefix[CH_NODE_NAME_MAX];
    CH_TRY(tensor_in(m, 0, &x));
    CH_TRY(input(m, 1, true, &b));
    if (b->kind != CH_OVAL_PARAM_T)
        return bad(m, "only x @ weight.t() (nn.Linear without bias) is supported");
    CH_TRY(weight_of(m, 1, &w, prefix));
    const int f = features_of(m->g, x);
    if (f < 0) return bad(m, "input is not flat: flatten it first");
    if (w->dims[0] < 1 || w->dims[0] > (1 << 20)) return bad(m, "weight '%s' has %lld rows", sh(m, 0, w->name),
                                                             (long long)w->dims[0]);
    const int64_t shape[2] = { w->dims[0], f };
    CH_TRY(param(m, 1, prefix, "weight", shape, 2, NULL));
    return tensor_out(m, ch_graph_linear(m->g, prefix, x, (int)w->dims[0], false));
}

static ch_status op_transpose(imp *m)
{
    ch_oval *v, *o;
    CH_TRY(input(m, 0, true, &v));
    const Onnx__AttributeProto *p = attr(m->node, "perm");
    if (v->kind != CH_OVAL_PARAM || v->init->n_dims != 2 || !p || p->n_ints != 2 || p->ints[0] != 1 || p->ints[1] != 0)
        return bad(m, "only the transpose of a 2-D weight, read by MatMul (nn.Linear without bias), is supported");
    CH_TRY(define(m, 0, CH_OVAL_PARAM_T, &o));
    o->init = v->init;
    return CH_STATUS_OK;
}

/* Input k of an elementwise op: a tensor (maybe an Expand's output) or a single constant number. */
static ch_status operand(imp *m, size_t k, ch_oval **out)
{
    CH_TRY(input(m, k, true, out));
    if ((*out)->kind == CH_OVAL_TENSOR) return (*out)->pending ? tensor_val(m, k, out) : CH_STATUS_OK;
    CH_TRY(const_in(m, k, true, out));
    if ((*out)->n != 1)
        return bad(m, "input '%s' is a constant of %d numbers: cohort combines tensors with tensors or with single "
                   "numbers", sh(m, 0, (*out)->name), (*out)->n);
    return CH_STATUS_OK;
}

/* A tensor and a number: x + c, c + x, x * c, c * x, x - c, c - x, x / c as one affine node. */
static ch_status op_with_number(imp *m, const ch_oval *a, const ch_oval *b)
{
    const bool x_first = a->kind == CH_OVAL_TENSOR;
    const ch_oval *x = x_first ? a : b, *c = x_first ? b : a;
    const double v = c->is_float ? c->f[0] : (double)c->i[0];
    const char *op = m->node->op_type;
    double scale = 1, shift = 0;
    if (x->expanded)
        return bad(m, "reads '%s', the output of an Expand, with a number: only tensors broadcast", sh(m, 0, x->name));
    if (strcmp(op, "Add") == 0) shift = v;
    else if (strcmp(op, "Mul") == 0) scale = v;
    else if (strcmp(op, "Sub") == 0) scale = x_first ? 1 : -1, shift = x_first ? -v : v;
    else if (x_first && v != 0) scale = 1 / v;
    else return bad(m, "%s: only a tensor divided by a nonzero number is supported", x_first ? "division by 0" : "a number divided by a tensor");
    if (!isfinite(scale) || !isfinite(shift)) return bad(m, "constant %g is not finite", v);
    char buf[CH_NODE_NAME_MAX];
    return tensor_out(m, ch_graph_affine(m->g, node_name(m, buf, sizeof buf), x->tensor, scale, shift));
}

/* An operand's dims aligned right as (c, h, w): an expanded one's as the Expand made them. */
static void aligned(const ch_graph *g, const ch_oval *v, int d[3])
{
    const ch_gtensor *t = &g->tensors[v->tensor];
    for (int i = 0; i < 3; i++)
        d[i] = v->expanded ? v->edims[i] : t->rank == 1 ? (i == 2 ? t->dims[0] : 1) : t->dims[i];
}

/* Add or Mul of an Expand's output: the broadcast inside the op must give the Expand's shape, or
 * dropping the Expand would change the result. */
static ch_status check_expanded(imp *m, const ch_oval *a, const ch_oval *b, int t)
{
    if (!a->expanded && !b->expanded) return CH_STATUS_OK;
    int da[3], db[3], got[3];
    aligned(m->g, a, da);
    aligned(m->g, b, db);
    const ch_oval r = { .kind = CH_OVAL_TENSOR, .tensor = t };
    aligned(m->g, &r, got);
    for (int i = 0; i < 3; i++)
        if (got[i] != (da[i] == 1 ? db[i] : da[i]))
            return bad(m, "an Expand to %dx%dx%d is wider than the broadcast of its %s: not supported",
                       (a->expanded ? a : b)->edims[0], (a->expanded ? a : b)->edims[1],
                       (a->expanded ? a : b)->edims[2], m->node->op_type);
    return CH_STATUS_OK;
}

static ch_status op_binary(imp *m)
{
    ch_oval *a, *b;
    CH_TRY(operand(m, 0, &a));
    CH_TRY(operand(m, 1, &b));
    const char *op = m->node->op_type;
    if (a->kind != CH_OVAL_TENSOR && b->kind != CH_OVAL_TENSOR)
        return bad(m, "both inputs are constants: cohort computes nothing from constants alone");
    if (a->kind != CH_OVAL_TENSOR || b->kind != CH_OVAL_TENSOR) return op_with_number(m, a, b);
    if (strcmp(op, "Add") != 0 && strcmp(op, "Mul") != 0)
        return bad(m, "%s of two tensors is not supported (Add and Mul are)", sh(m, 0, op));
    char buf[CH_NODE_NAME_MAX];
    const char *name = node_name(m, buf, sizeof buf);
    const int t = op[0] == 'A' ? ch_graph_add(m->g, name, a->tensor, b->tensor)
                               : ch_graph_mul(m->g, name, a->tensor, b->tensor);
    if (t >= 0) CH_TRY(check_expanded(m, a, b, t));
    return tensor_out(m, t);
}

/* y.expand_as(x), y.expand(n, c, h, w): kept as a mark on y for the Add or Mul that reads it. */
static ch_status op_expand(imp *m)
{
    ch_oval *v, *s;
    CH_TRY(tensor_val(m, 0, &v));
    CH_TRY(const_in(m, 1, true, &s));
    if (s->is_float || s->rank != 1 || s->n < 2 || s->n > 4)
        return bad(m, "the target shape must be 2 to 4 integers (batch first)");
    if (s->i[0] != CH_ONNX_BATCH && s->i[0] != 1)
        return bad(m, "expands to a batch of %lld, fixed when the model was exported: write y.expand_as(x)",
                   (long long)s->i[0]);
    int have[3], want[3] = { 1, 1, 1 };
    aligned(m->g, v, have);
    for (int i = 1; i < s->n; i++) {
        const int64_t d = s->i[i];
        if (d < 1 || d > (1 << 20)) return bad(m, "target dimension %d is %lld", i, d == CH_ONNX_BATCH ? -2LL : (long long)d);
        want[3 - s->n + i] = (int)d;
    }
    bool same = true;
    for (int i = 0; i < 3; i++) {
        if (have[i] != want[i] && have[i] != 1 && want[i] != 1)
            return bad(m, "cannot expand dimension %d of size %d to %d", i + 1, have[i], want[i]);
        want[i] = have[i] == 1 ? want[i] : have[i];
        same = same && want[i] == have[i];
    }
    CH_TRY(alias_out(m, v));
    if (same) return CH_STATUS_OK;
    ch_oval *o = ch_ovals_find(&m->vals, m->node->output[0]);
    o->expanded = true;
    memcpy(o->edims, want, sizeof want);
    return CH_STATUS_OK;
}

static ch_status op_dropout(imp *m)
{
    int x = 0;
    ch_oval *ratio;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(tensor_in(m, 0, &x));
    CH_TRY(const_in(m, 1, false, &ratio));
    if (ratio && ratio->n != 1) return bad(m, "ratio must be a scalar");
    /* training_mode (input 2) only says how the module was exported; cohort trains with it on. */
    CH_TRY(tensor_out(m, ch_graph_dropout(m->g, node_name(m, buf, sizeof buf), x, ratio ? ratio->f[0] : 0.5)));
    return dead_from(m, 1, "Dropout's mask, which cohort does not give out");
}

/* Pad of a (batch, c, h, w) tensor with zeros: nothing, or the same number of pixels on every
 * side of h and w, marked for the AveragePool that must read it (tensor_val). */
static ch_status op_pad(imp *m)
{
    ch_oval *v, *pads, *value;
    CH_TRY(tensor_val(m, 0, &v));
    CH_TRY(const_in(m, 1, true, &pads));
    CH_TRY(const_in(m, 2, false, &value));
    const Onnx__AttributeProto *mode = attr(m->node, "mode");
    if (mode && !(mode->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING && mode->s.len == 8 &&
                  memcmp(mode->s.data, "constant", 8) == 0))
        return bad(m, "only constant padding is supported (reflect and edge are not)");
    if (value && (value->n != 1 || value->f[0] != 0)) return bad(m, "only padding with zeros is supported");
    bool zero = true;
    for (int i = 0; i < pads->n; i++) zero = zero && pads->i[i] == 0;
    if (zero) return alias_out(m, v);
    /* pads: (n, c, h, w) begins, then ends. */
    const int64_t *p = pads->i;
    if (pads->n != 8 || m->g->tensors[v->tensor].rank != 3 || p[0] || p[1] || p[4] || p[5] || p[2] != p[3] ||
        p[2] != p[6] || p[2] != p[7] || p[2] < 1 || p[2] > 1 << 12)
        return bad(m, "only the same zero padding on every side of h and w is supported (as before an "
                   "AvgPool2d with count_include_pad); pad in the Conv or the pooling instead");
    CH_TRY(alias_out(m, v));
    ch_ovals_find(&m->vals, m->node->output[0])->padded = (int)p[2];
    return CH_STATUS_OK;
}

/* The cross-entropy's log-softmax, exported by a model that ends in log_softmax (or softmax):
 * the graph's output is its input, the logits. */
static ch_status op_softmax(imp *m)
{
    ch_oval *v, *o;
    int64_t axis = 0;
    CH_TRY(tensor_val(m, 0, &v));
    CH_TRY(attr_int(m, "axis", m->opset >= 13 ? -1 : 1, &axis));
    if (features_of(m->g, v->tensor) < 0 || (axis != 1 && axis != -1 && !(axis == -3 && m->g->tensors[v->tensor].rank == 3)))
        return bad(m, "only a softmax over the classes of (batch, classes) logits is supported");
    if (m->node->n_output < 1 || strcmp(m->node->output[0], m->output) != 0)
        return bad(m, "a %s is supported only as the model's last operation (folded into the cross-entropy)",
                   sh(m, 0, m->node->op_type));
    CH_TRY(alias_out(m, v));
    o = ch_ovals_find(&m->vals, m->node->output[0]);
    o->folded_softmax = true;
    return CH_STATUS_OK;
}

static ch_status op_identity(imp *m)
{
    ch_oval *v;
    CH_TRY(input(m, 0, true, &v));
    return alias_out(m, v);
}

static ch_status op_cast(imp *m)
{
    ch_oval *v;
    int64_t to = 0;
    CH_TRY(input(m, 0, true, &v));
    CH_TRY(attr_int(m, "to", 0, &to));
    const bool to_float = to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    if (v->kind == CH_OVAL_TENSOR && to_float) return alias_out(m, v);
    if (v->kind != CH_OVAL_CONST && v->kind != CH_OVAL_PARAM)
        return bad(m, "casts of tensors to type %lld are not supported", (long long)to);
    CH_TRY(const_in(m, 0, true, &v));
    ch_oval c = *v;
    c.is_float = to_float || to == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
    for (int i = 0; i < c.n; i++) c.f[i] = c.is_float ? c.f[i] : (double)c.i[i];
    return alias_out(m, &c);
}

static ch_status op_constant(imp *m)
{
    ch_oval *o;
    CH_TRY(define(m, 0, CH_OVAL_CONST, &o));
    const Onnx__AttributeProto *a = m->node->n_attribute == 1 ? m->node->attribute[0] : NULL;
    if (a && a->name && strcmp(a->name, "value") == 0 && a->t) {
        char what[120];
        snprintf(what, sizeof what, "the value of Constant '%s'", sh(m, 0, m->node->name));
        ch_err e;
        return ch_onnx_tensor_const(a->t, what, o, &e) == CH_STATUS_OK ? CH_STATUS_OK : bad(m, "%s", e.msg);
    }
    if (a && a->name && (strcmp(a->name, "value_int") == 0 || strcmp(a->name, "value_float") == 0)) {
        o->n = 1;
        o->is_float = a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
        o->f[0] = o->is_float ? a->f : (double)a->i;
        o->i[0] = o->is_float ? 0 : a->i;
        return CH_STATUS_OK;
    }
    if (a && a->name && strcmp(a->name, "value_ints") == 0 && a->n_ints <= CH_ONNX_CONST_MAX) {
        o->rank = 1;
        o->n = (int)a->n_ints;
        for (int i = 0; i < o->n; i++) o->f[i] = (double)(o->i[i] = a->ints[i]);
        return CH_STATUS_OK;
    }
    return bad(m, "only a tensor, int, float or ints value of at most %d numbers is supported", CH_ONNX_CONST_MAX);
}

/* ---- shape arithmetic, folded ---- */

static ch_status op_shape(imp *m)
{
    ch_oval *v, *o;
    int64_t start = 0, end = 0;
    CH_TRY(tensor_val(m, 0, &v));
    const ch_gtensor *x = &m->g->tensors[v->tensor];
    const int64_t dims[4] = { CH_ONNX_BATCH, x->dims[0], x->dims[1], x->dims[2] };
    const int r = x->rank + 1;
    CH_TRY(attr_int(m, "start", 0, &start));
    CH_TRY(attr_int(m, "end", r, &end));
    start = start < 0 ? start + r : start;
    end = end < 0 ? end + r : end;
    start = start < 0 ? 0 : start > r ? r : start;
    end = end < start ? start : end > r ? r : end;
    CH_TRY(define(m, 0, CH_OVAL_CONST, &o));
    o->rank = 1;
    o->n = (int)(end - start);
    for (int i = 0; i < o->n; i++) o->f[i] = (double)(o->i[i] = dims[start + i]);
    return CH_STATUS_OK;
}

static ch_status op_gather(imp *m)
{
    ch_oval *d, *idx, *o;
    int64_t axis = 0;
    CH_TRY(const_in(m, 0, true, &d));
    CH_TRY(const_in(m, 1, true, &idx));
    CH_TRY(attr_int(m, "axis", 0, &axis));
    if (d->rank != 1 || axis != 0 || idx->is_float)
        return bad(m, "only indexing a shape vector is supported");
    CH_TRY(define(m, 0, CH_OVAL_CONST, &o));
    o->rank = idx->rank;
    o->n = idx->n;
    for (int i = 0; i < idx->n; i++) {
        int64_t k = idx->i[i] < 0 ? idx->i[i] + d->n : idx->i[i];
        if (k < 0 || k >= d->n) return bad(m, "index %lld outside a vector of %d", (long long)idx->i[i], d->n);
        o->i[i] = d->i[k];
        o->f[i] = d->f[k];
    }
    o->is_float = d->is_float;
    return CH_STATUS_OK;
}

/* The per-sample shape of tensor value v as ONNX sees it (without the batch); its rank. */
static int sample_shape(const imp *m, const ch_oval *v, int *d)
{
    const ch_gtensor *t = &m->g->tensors[v->tensor];
    if (v->pending) return (d[0] = v->pdims[0], d[1] = v->pdims[1], 2);
    for (int i = 0; i < t->rank; i++) d[i] = t->dims[i];
    return t->rank;
}

/* Output 0 holds v's values as per-sample shape d (rank r): the same tensor, a flatten or a view
 * in the graph, or a pending (batch, a, b) shape. */
static ch_status reshaped_out(imp *m, const ch_oval *v, const int *d, int r)
{
    const ch_gtensor *t = &m->g->tensors[v->tensor];
    char buf[CH_NODE_NAME_MAX];
    if (r == 2) {
        CH_TRY(alias_out(m, v));
        ch_oval *o = ch_ovals_find(&m->vals, m->node->output[0]);
        o->pending = true;
        o->pdims[0] = d[0];
        o->pdims[1] = d[1];
        return CH_STATUS_OK;
    }
    ch_oval plain = *v;
    plain.pending = false;
    if (r == 1 && t->rank == 1) return alias_out(m, &plain);
    if (r == 1) return tensor_out(m, ch_graph_flatten(m->g, node_name(m, buf, sizeof buf), v->tensor));
    if (r == 3 && t->rank == 3 && d[0] == t->dims[0] && d[1] == t->dims[1] && d[2] == t->dims[2])
        return alias_out(m, &plain);
    if (r == 3) return tensor_out(m, ch_graph_view(m->g, node_name(m, buf, sizeof buf), v->tensor, d[0], d[1], d[2]));
    return bad(m, "makes a (batch%s) tensor: cohort has (batch, features) and (batch, c, h, w) tensors only",
               r == 0 ? "" : ", ...");
}

/* Squeeze and Unsqueeze of a tensor (y.unsqueeze(-1).unsqueeze(-1), y[:, :, None, None],
 * x.squeeze(-1), x.squeeze()): the same values in another shape. The batch stays. */
static ch_status squeeze_tensor(imp *m, ch_oval *v, bool un)
{
    ch_oval *axes;
    int d[4], r = sample_shape(m, v, d);
    CH_TRY(const_in(m, 1, un, &axes));
    if (axes && (axes->is_float || axes->n < 1 || axes->n > 3))
        return bad(m, "axes must be 1 to 3 integers");
    const int rank = r + 1, out_rank = un ? rank + axes->n : rank; /* with the batch */
    bool at[8] = { false };
    for (int i = 0; axes && i < axes->n; i++) {
        const int64_t a = axes->i[i] < 0 ? axes->i[i] + out_rank : axes->i[i];
        if (a < 1 || a >= out_rank || at[a])
            return bad(m, "axis %lld: only axes after the batch, each once, are supported", (long long)axes->i[i]);
        at[a] = true;
    }
    int o[8], k = 0;
    if (un) {
        for (int a = 1, j = 0; a < out_rank; a++) o[k++] = at[a] ? 1 : d[j++];
    } else {
        for (int a = 1; a < rank; a++) {
            const bool drop = axes ? at[a] : d[a - 1] == 1;
            if (drop && d[a - 1] != 1) return bad(m, "axis %d has size %d, not 1", a, d[a - 1]);
            if (!drop) o[k++] = d[a - 1];
        }
    }
    if (k > 3) return bad(m, "makes a tensor of %d dimensions: cohort has (batch, features) and (batch, c, h, w) only",
                          k + 1);
    return reshaped_out(m, v, o, k);
}

/* Unsqueeze and Squeeze: of tensors, a reshape; of constants, between a scalar and a one-element
 * vector. */
static ch_status op_squeeze(imp *m)
{
    ch_oval *d, *axes;
    const bool un = strcmp(m->node->op_type, "Unsqueeze") == 0;
    CH_TRY(input(m, 0, true, &d));
    if (d->kind == CH_OVAL_TENSOR && !d->expanded) return squeeze_tensor(m, d, un);
    CH_TRY(const_in(m, 0, true, &d));
    CH_TRY(const_in(m, 1, un, &axes));
    const bool axis0 = !axes || (axes->n == 1 && (axes->i[0] == 0 || axes->i[0] == -1));
    if (!axis0 || (un ? d->rank != 0 : d->n != 1))
        return bad(m, "only %s of a constant scalar at axis 0 is supported", un ? "unsqueezing" : "squeezing");
    ch_oval c = *d;
    c.rank = un;
    return alias_out(m, &c);
}

static ch_status op_concat(imp *m)
{
    const Onnx__NodeProto *n = m->node;
    if (n->n_input < 1 || n->n_input > 4096) return bad(m, "%zu inputs", n->n_input);
    ch_oval *first;
    int64_t axis = 0;
    CH_TRY(input(m, 0, true, &first));
    CH_TRY(attr_int(m, "axis", 0, &axis));
    if (first->kind == CH_OVAL_TENSOR) {
        int *xs = malloc(sizeof(int) * n->n_input);
        CH_CHECK_ALLOC(m->err, xs);
        ch_status st = CH_STATUS_OK;
        for (size_t i = 0; i < n->n_input && st == CH_STATUS_OK; i++) st = tensor_in(m, i, &xs[i]);
        const int rank = m->g->tensors[first->tensor].rank;
        if (st == CH_STATUS_OK && !(axis == 1 || axis == -rank))
            st = bad(m, "axis %lld: tensors are concatenated along channels (axis 1) only", (long long)axis);
        char buf[CH_NODE_NAME_MAX];
        if (st == CH_STATUS_OK)
            st = tensor_out(m, ch_graph_concat(m->g, node_name(m, buf, sizeof buf), xs, (int)n->n_input));
        free(xs);
        return st;
    }
    ch_oval c = { .kind = CH_OVAL_CONST, .rank = 1 };
    for (size_t i = 0; i < n->n_input; i++) {
        ch_oval *v;
        CH_TRY(const_in(m, i, true, &v));
        if (v->rank != 1 || v->is_float || c.n + v->n > CH_ONNX_CONST_MAX)
            return bad(m, "only the concatenation of short integer vectors (a shape) is folded");
        for (int k = 0; k < v->n; k++, c.n++) {
            c.i[c.n] = v->i[k];
            c.f[c.n] = v->f[k];
        }
    }
    return alias_out(m, &c);
}

/* ---- the walk ---- */

typedef struct op_entry {
    const char *name;
    ch_status (*fn)(imp *m);
    int max_in;     /* inputs the operator has in opsets 13 to 17 (-1: any number) */
} op_entry;

static const op_entry ops[] = {
    { "Conv", op_conv, 3 }, { "BatchNormalization", op_batchnorm, 5 }, { "Relu", op_activation, 1 },
    { "LeakyRelu", op_activation, 1 }, { "Clip", op_activation, 3 }, { "Sigmoid", op_activation, 1 },
    { "Tanh", op_activation, 1 }, { "MaxPool", op_pool, 1 }, { "AveragePool", op_pool, 1 },
    { "GlobalAveragePool", op_global_pool, 1 }, { "ReduceMean", op_reduce_mean, 1 }, { "Flatten", op_flatten, 1 },
    { "Reshape", op_reshape, 2 }, { "Gemm", op_gemm, 3 }, { "MatMul", op_matmul, 2 }, { "Transpose", op_transpose, 1 },
    { "Add", op_binary, 2 }, { "Mul", op_binary, 2 }, { "Sub", op_binary, 2 }, { "Div", op_binary, 2 },
    { "Expand", op_expand, 2 }, { "HardSigmoid", op_activation, 1 }, { "HardSwish", op_activation, 1 },
    { "Concat", op_concat, -1 }, { "Dropout", op_dropout, 3 },
    { "Pad", op_pad, 3 }, { "LogSoftmax", op_softmax, 1 }, { "Softmax", op_softmax, 1 }, { "Identity", op_identity, 1 },
    { "Cast", op_cast, 1 }, { "Constant", op_constant, 0 }, { "Shape", op_shape, 1 }, { "Gather", op_gather, 2 },
    { "Unsqueeze", op_squeeze, 2 }, { "Squeeze", op_squeeze, 2 },
};

static ch_status import_node(imp *m, const Onnx__NodeProto *n)
{
    m->node = n;
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0)
        return bad(m, "operator domain '%s' is not supported (only ONNX's own operators)", sh(m, 0, n->domain));
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (!n->op_type || strcmp(n->op_type, ops[i].name) != 0) continue;
        /* An input the handler would never read is not dropped silently. */
        if (ops[i].max_in >= 0 && n->n_input > (size_t)ops[i].max_in)
            return bad(m, "%zu inputs; %s takes at most %d", n->n_input, ops[i].name, ops[i].max_in);
        return ops[i].fn(m);
    }
    return bad(m, "operator '%s' is not supported; cohort imports Conv, BatchNormalization, Relu, LeakyRelu, Clip, "
               "Sigmoid, Tanh, HardSigmoid, HardSwish, MaxPool, AveragePool, GlobalAveragePool, ReduceMean, Flatten, "
               "Reshape, Gemm, MatMul, Add, Mul (of tensors or by numbers), Sub and Div by numbers, Expand into Add "
               "or Mul, Concat, Dropout, a final (Log)Softmax and shape arithmetic", sh(m, 0, n->op_type));
}

static ch_status check_opset(imp *m, const Onnx__ModelProto *mp)
{
    m->opset = -1;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
        if (!o->domain || !o->domain[0] || strcmp(o->domain, "ai.onnx") == 0) m->opset = (int)(o->has_version ? o->version : -1);
    }
    if (m->opset < OPSET_MIN || m->opset > OPSET_MAX)
        return bad(m, "ONNX opset %d: cohort imports opsets %d to %d (torch.onnx.export(..., opset_version=%d))",
                   m->opset, OPSET_MIN, OPSET_MAX, OPSET_MAX);
    return CH_STATUS_OK;
}

/* The data input: the one graph input that is no initializer, (batch, c, h, w) float. */
static ch_status add_input(imp *m)
{
    const Onnx__GraphProto *gp = m->gp;
    const Onnx__ValueInfoProto *in = NULL;
    for (size_t i = 0; i < gp->n_input; i++) {
        const ch_oval *v = ch_ovals_find(&m->vals, gp->input[i]->name);
        if (v && v->kind == CH_OVAL_PARAM) continue;
        if (in) return bad(m, "the model has several inputs ('%s', '%s'); cohort feeds one batch of images",
                           sh(m, 0, in->name), sh(m, 1, gp->input[i]->name));
        in = gp->input[i];
    }
    if (!in || !in->name) return bad(m, "the model has no input");
    const Onnx__TypeProto *t = in->type;
    const Onnx__TensorShapeProto *s = t && t->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && t->tensor_type
                                          ? t->tensor_type->shape : NULL;
    if (!s || t->tensor_type->elem_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || s->n_dim != 4)
        return bad(m, "input '%s' is not a float tensor of shape (batch, c, h, w)", sh(m, 0, in->name));
    int d[3];
    for (int i = 0; i < 3; i++) {
        const Onnx__TensorShapeProto__Dimension *x = s->dim[i + 1];
        if (x->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE || x->dim_value < 1 ||
            x->dim_value > 65536)
            return bad(m, "input '%s': dimension %d is not a number 1..65536", sh(m, 0, in->name), i + 1);
        d[i] = (int)x->dim_value;
    }
    ch_oval *v;
    ch_err e;
    if (!(v = ch_ovals_add(&m->vals, in->name, CH_OVAL_TENSOR, &e))) return bad(m, "%s", e.msg);
    char buf[CH_NODE_NAME_MAX];
    const bool usable = strlen(in->name) < sizeof buf && !strpbrk(in->name, " \t\n\r");
    v->tensor = ch_graph_input(m->g, usable ? in->name : "input", d[0], d[1], d[2]);
    if (v->tensor < 0) return (ch_graph_status(m->g, &e), bad(m, "%s", e.msg));
    return CH_STATUS_OK;
}

static ch_status import_graph(imp *m)
{
    const Onnx__GraphProto *gp = m->gp;
    ch_err e;
    if (gp->n_node > MAX_NODES) return bad(m, "%zu nodes, more than %d", gp->n_node, MAX_NODES);
    if (gp->n_sparse_initializer) return bad(m, "sparse initializers are not supported");
    for (size_t i = 0; i < gp->n_initializer; i++) {
        ch_oval *v = ch_ovals_add(&m->vals, gp->initializer[i]->name, CH_OVAL_PARAM, &e);
        if (!v) return bad(m, "initializer: %s", e.msg);
        v->init = gp->initializer[i];
        /* Sizes and storage are checked here, before any node looks at a dimension. */
        size_t count;
        char what[120];
        snprintf(what, sizeof what, "initializer '%s'", sh(m, 0, v->name));
        if (ch_onnx_tensor_count(v->init, what, &count, &e) != CH_STATUS_OK) return bad(m, "%s", e.msg);
    }
    if (gp->n_output != 1 || !gp->output[0]->name)
        return bad(m, "the model has %zu outputs; cohort trains one (the logits)", gp->n_output);
    m->output = gp->output[0]->name;
    CH_TRY(add_input(m));
    for (size_t i = 0; i < gp->n_node; i++) CH_TRY(import_node(m, gp->node[i]));
    m->node = NULL;
    const ch_oval *out = ch_ovals_find(&m->vals, m->output);
    if (!out || out->kind != CH_OVAL_TENSOR || out->expanded || out->pending)
        return bad(m, "output '%s' is made by no node, or is no tensor computed from the input", sh(m, 0, m->output));
    if (ch_graph_output(m->g, out->tensor) != CH_STATUS_OK) return (ch_graph_status(m->g, &e), bad(m, "%s", e.msg));
    for (size_t i = 0; i < m->vals.n; i++)
        if (m->vals.v[i].kind == CH_OVAL_PARAM && m->vals.v[i].uses == 0)
            return bad(m, "initializer '%s' is read by no node cohort imports", sh(m, 0, m->vals.v[i].name));
    return CH_STATUS_OK;
}

/* The graph's name: the file's, without folders and .onnx. */
static void name_of(const char *path, char *name, size_t len)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t k = 0;
    for (; b[k] && k + 1 < len; k++) name[k] = b[k] > ' ' && b[k] < 127 ? b[k] : '_';
    name[k] = 0;
    if (k > 5 && strcmp(name + k - 5, ".onnx") == 0) name[k - 5] = 0;
    if (!name[0]) snprintf(name, len, "onnx");
}

ch_status ch_graph_load_onnx(const char *path, ch_graph **out, ch_err *err)
{
    *out = NULL;
    uint8_t *buf;
    size_t len;
    CH_TRY(ch_file_read(path, max_file, &buf, &len, err));
    const ch_status st = ch_onnx_import(buf, len, path, out, err);
    free(buf);
    return st;
}

ch_status ch_onnx_import(const uint8_t *buf, size_t len, const char *path, ch_graph **out, ch_err *err)
{
    *out = NULL;
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, buf);
    if (!mp || !mp->graph) {
        if (mp) onnx__model_proto__free_unpacked(mp, NULL);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: not an ONNX model (the protobuf does not parse: truncated or "
                       "another kind of file)", path);
    }
    imp m = { .file = path, .gp = mp->graph, .err = err };
    char name[64];
    name_of(path, name, sizeof name);
    ch_status st = check_opset(&m, mp);
    if (st == CH_STATUS_OK) st = ch_graph_create(name, &m.g, err);
    if (st == CH_STATUS_OK) st = import_graph(&m);
    ch_ovals_free(&m.vals);
    onnx__model_proto__free_unpacked(mp, NULL);
    if (st != CH_STATUS_OK) {
        ch_graph_free(m.g);
        return st;
    }
    *out = m.g;
    return CH_STATUS_OK;
}
