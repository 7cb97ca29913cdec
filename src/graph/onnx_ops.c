/* The ONNX importer's operators: each node's attributes and inputs checked and turned into graph
 * builder calls, or refused in one line naming the node; what PyTorch emits around a model (a
 * final softmax, Identity, Cast, a zero Pad; the shape arithmetic of view is onnx_shape.c's)
 * folded, not run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph.h"
#include "graph/onnx_imp.h"

/* ---- operators ---- */

static int features_of(const ch_graph *g, int t)
{
    const ch_gtensor *x = &g->tensors[t];
    return x->rank == 1 ? x->dims[0] : x->dims[1] == 1 && x->dims[2] == 1 ? x->dims[0] : -1;
}

/* Conv, and ConvTranspose (nn.ConvTranspose2d: weight (c, out / group, k, k), output_padding). */
static ch_status op_conv(ch_onnx_imp *m)
{
    const bool tr = strcmp(m->node->op_type, "ConvTranspose") == 0;
    int x = 0, k = 0, stride = 0, pad = 0, dil = 0, out_pad = 0;
    int64_t group = 0;
    const Onnx__TensorProto *w = NULL;
    char prefix[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_tensor_in(m, 0, &x));
    CH_TRY(ch_onnx_weight_of(m, 1, &w, prefix));
    CH_TRY(ch_onnx_no_auto_pad(m));
    if (w->n_dims != 4) return ch_onnx_bad(m, "weight '%s' has %zu dimensions, not 4", ch_onnx_show(m, 0, w->name), w->n_dims);
    CH_TRY(ch_onnx_attr_square(m, "kernel_shape", 2, w->dims[2], 1, 1 << 12, &k));
    CH_TRY(ch_onnx_attr_square(m, "strides", 2, 1, 1, 1 << 12, &stride));
    CH_TRY(ch_onnx_attr_square(m, "pads", 4, 0, 0, 1 << 12, &pad));
    CH_TRY(ch_onnx_attr_square(m, "dilations", 2, 1, 1, 1 << 12, &dil));
    CH_TRY(ch_onnx_attr_int(m, "group", 1, &group));
    if (tr) {
        CH_TRY(ch_onnx_attr_square(m, "output_padding", 2, 0, 0, 1 << 12, &out_pad));
        if (ch_onnx_attr(m->node, "output_shape"))
            return ch_onnx_bad(m, "output_shape is not supported: give the padding and output_padding instead");
    }
    const int cin = m->g->tensors[x].dims[0];
    if (m->g->tensors[x].rank != 3) return ch_onnx_bad(m, "needs a (batch, c, h, w) input");
    const int64_t cout = tr ? w->dims[1] * (group > 0 && group <= cin ? group : 1) : w->dims[0];
    if (group < 1 || group > cin || cin % group != 0 || cout % group != 0 || cout < 1 || cout > (1 << 16) ||
        (tr && w->dims[0] != cin))
        return ch_onnx_bad(m, "group %lld does not divide %d input and %lld output channels, or the weight does not fit "
                   "them", (long long)group, cin, (long long)cout);
    const int64_t shape[4] = { tr ? cin : cout, tr ? cout / group : cin / group, k, k };
    bool has_bias = m->node->n_input > 2 && m->node->input[2][0];
    int twin;
    const ch_conv2d_args a = { .out_channels = (int)cout, .kernel = k, .stride = stride, .padding = pad,
                               .dilation = dil, .groups = (int)group, .no_bias = !has_bias };
    CH_TRY(ch_onnx_twin(m, 1, 2, &twin));
    if (twin >= 0) {
        const ch_conv2d_args *t = &m->g->nodes[twin].conv;
        return ch_onnx_reuse_out(m, twin, x, m->g->nodes[twin].op == (tr ? CH_GOP_CONV_T : CH_GOP_CONV2D) &&
                                 m->g->nodes[twin].out_pad == out_pad && t->out_channels == a.out_channels && t->kernel == a.kernel &&
                                 t->stride == a.stride && t->padding == a.padding && t->dilation == a.dilation &&
                                 t->groups == a.groups && t->no_bias == a.no_bias);
    }
    CH_TRY(ch_onnx_param(m, 1, prefix, "weight", shape, 4, NULL));
    const int64_t bias_shape[1] = { cout };
    CH_TRY(ch_onnx_param(m, 2, prefix, "bias", bias_shape, 1, &has_bias));
    return ch_onnx_tensor_out(m, tr ? ch_graph_conv_transpose2d(m->g, prefix, x, &a, out_pad) : ch_graph_conv2d(m->g, prefix, x, &a));
}

static ch_status op_batchnorm(ch_onnx_imp *m)
{
    int x = 0;
    const Onnx__TensorProto *w = NULL;
    char prefix[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_tensor_in(m, 0, &x));
    int64_t training = m->node->n_output > 1; /* opset 13: five outputs in training mode */
    if (m->opset >= 14) CH_TRY(ch_onnx_attr_int(m, "training_mode", 0, &training));
    if (!training) return ch_onnx_inference_export(m, m->node->n_input > 3 ? m->node->input[3] : "?");
    double eps = 0, momentum = 0;
    CH_TRY(ch_onnx_attr_float(m, "epsilon", 1e-5, &eps));
    CH_TRY(ch_onnx_attr_float(m, "momentum", 0.9, &momentum));
    if (!(eps > 0 && eps < 1) || !(momentum >= 0 && momentum < 1))
        return ch_onnx_bad(m, "epsilon %g or momentum %g outside (0, 1)", eps, momentum);
    /* ONNX keeps momentum * running + (1 - momentum) * batch: PyTorch's momentum is 1 - it. */
    const ch_batchnorm_args a = { .eps = ch_onnx_as_typed(eps), .momentum = ch_onnx_as_typed(1 - momentum) };
    /* A BatchNorm module called again reads the same four initializers; it moves the same running
     * statistics, after the first call, as PyTorch's module does (ONNX's second node reads them
     * unmoved, but the file is a trace of PyTorch's module). */
    int twin;
    CH_TRY(ch_onnx_twin(m, 1, 4, &twin));
    if (twin >= 0) {
        CH_TRY(ch_onnx_reuse_out(m, twin, x, m->g->nodes[twin].op == CH_GOP_BATCHNORM2D &&
                                 m->g->nodes[twin].bn.eps == a.eps && m->g->nodes[twin].bn.momentum == a.momentum));
        return ch_onnx_dead_from(m, 1, "a running statistic of BatchNormalization, which cohort keeps itself");
    }
    CH_TRY(ch_onnx_weight_of(m, 1, &w, prefix));
    /* A (batch, features) input is BatchNorm1d's; a (batch, c, length) one has no cohort shape. */
    const int64_t c[1] = { m->g->tensors[x].dims[0] };
    static const char *const names[4] = { "weight", "bias", "running_mean", "running_var" };
    for (size_t i = 0; i < 4; i++) CH_TRY(ch_onnx_param(m, i + 1, prefix, names[i], c, 1, NULL));
    CH_TRY(ch_onnx_tensor_out(m, ch_graph_batchnorm2d(m->g, prefix, x, &a)));
    return ch_onnx_dead_from(m, 1, "a running statistic of BatchNormalization, which cohort keeps itself");
}

/* nn.LayerNorm (opset 17's LayerNormalization): over the trailing dimensions from axis, or over the
 * channels of a channels-last view (ConvNeXt's permute, LayerNorm, permute back). */
static ch_status op_layernorm(ch_onnx_imp *m)
{
    ch_oval *v;
    int64_t axis = -1, stash = 1;
    double eps = 0;
    const Onnx__TensorProto *w = NULL;
    char prefix[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_input(m, 0, true, &v));
    const bool last = v->kind == CH_OVAL_TENSOR && v->channels_last;
    if (!last) CH_TRY(ch_onnx_tensor_val(m, 0, &v));
    CH_TRY(ch_onnx_attr_int(m, "axis", -1, &axis));
    CH_TRY(ch_onnx_attr_float(m, "epsilon", 1e-5, &eps));
    CH_TRY(ch_onnx_attr_int(m, "stash_type", 1, &stash));
    if (stash != 1) return ch_onnx_bad(m, "stash_type %lld: only float statistics (1) are supported", (long long)stash);
    const ch_gtensor *x = &m->g->tensors[v->tensor];
    const int rank = x->rank + 1;
    axis = axis < 0 ? axis + rank : axis;
    if (last && axis != 3)
        return ch_onnx_bad(m, "a LayerNorm of a channels-last view over more than its last axis (the channels) is not supported");
    if (axis < 1 || axis >= rank)
        return ch_onnx_bad(m, "axis %lld: a LayerNorm over the batch dimension is not supported", (long long)axis);
    int64_t shape[3];
    int nd = 0;
    if (last) shape[nd++] = x->dims[0];
    else
        for (int a = (int)axis; a < rank; a++) shape[nd++] = x->dims[a - 1];
    CH_TRY(ch_onnx_weight_of(m, 1, &w, prefix));
    bool has_bias;
    int twin;
    CH_TRY(ch_onnx_twin(m, 1, 2, &twin));
    if (twin >= 0)
        return ch_onnx_reuse_out(m, twin, v->tensor, !last && m->g->nodes[twin].op == CH_GOP_LAYERNORM &&
                                 m->g->nodes[twin].ln_axis == axis && m->g->nodes[twin].bn.eps == ch_onnx_as_typed(eps));
    CH_TRY(ch_onnx_param(m, 1, prefix, "weight", shape, nd, NULL));
    CH_TRY(ch_onnx_param(m, 2, prefix, "bias", shape, nd, &has_bias));
    if (!has_bias) return ch_onnx_bad(m, "a LayerNorm without a bias is not supported");
    const int t = ch_graph_layer_norm(m->g, prefix, v->tensor, last ? CH_LAYER_NORM_CHANNELS : (int)axis,
                                      ch_onnx_as_typed(eps));
    CH_TRY(ch_onnx_viewed_out(m, t, last));
    return ch_onnx_dead_from(m, 1, "a statistic of LayerNormalization, which cohort does not give out");
}

static ch_status op_activation(ch_onnx_imp *m)
{
    int x = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_tensor_in(m, 0, &x));
    const char *op = m->node->op_type, *name = ch_onnx_node_name(m, buf, sizeof buf);
    if (strcmp(op, "Relu") == 0) return ch_onnx_tensor_out(m, ch_graph_relu(m->g, name, x));
    if (strcmp(op, "Sigmoid") == 0) return ch_onnx_tensor_out(m, ch_graph_sigmoid(m->g, name, x));
    if (strcmp(op, "Tanh") == 0) return ch_onnx_tensor_out(m, ch_graph_tanh(m->g, name, x));
    if (strcmp(op, "Erf") == 0) return ch_onnx_tensor_out(m, ch_graph_erf(m->g, name, x));
    if (strcmp(op, "HardSwish") == 0) return ch_onnx_tensor_out(m, ch_graph_hardswish(m->g, name, x));
    if (strcmp(op, "HardSigmoid") == 0) {
        double alpha = 0, beta = 0;
        CH_TRY(ch_onnx_attr_float(m, "alpha", 0.2, &alpha));
        CH_TRY(ch_onnx_attr_float(m, "beta", 0.5, &beta));
        if ((float)alpha != (float)(1.0 / 6) || beta != 0.5)
            return ch_onnx_bad(m, "alpha %g, beta %g: only PyTorch's hardsigmoid (alpha 1/6, beta 0.5) is supported", alpha,
                       beta);
        return ch_onnx_tensor_out(m, ch_graph_hardsigmoid(m->g, name, x));
    }
    if (strcmp(op, "LeakyRelu") == 0) {
        double alpha = 0;
        CH_TRY(ch_onnx_attr_float(m, "alpha", 0.01, &alpha));
        return ch_onnx_tensor_out(m, ch_graph_leaky_relu(m->g, name, x, ch_onnx_as_typed(alpha)));
    }
    /* Clip: bounds are optional constant inputs (opset 11 on). */
    ch_oval *lo, *hi;
    CH_TRY(ch_onnx_const_in(m, 1, false, &lo));
    CH_TRY(ch_onnx_const_in(m, 2, false, &hi));
    if ((lo && lo->n != 1) || (hi && hi->n != 1)) return ch_onnx_bad(m, "Clip bounds must be scalars");
    return ch_onnx_tensor_out(m, ch_graph_clip(m->g, name, x, lo ? lo->f[0] : -INFINITY, hi ? hi->f[0] : INFINITY));
}

static ch_status op_pool(ch_onnx_imp *m)
{
    int x = 0, k = 0, stride = 0, pad = 0, dil = 0;
    int64_t ceil_mode = 0, include_pad = 0, order = 0;
    char buf[CH_NODE_NAME_MAX];
    const bool is_max = strcmp(m->node->op_type, "MaxPool") == 0;
    ch_oval *xv;
    CH_TRY(ch_onnx_tensor_val(m, 0, &xv));
    x = xv->tensor;
    CH_TRY(ch_onnx_no_auto_pad(m));
    if (!ch_onnx_attr(m->node, "kernel_shape")) return ch_onnx_bad(m, "no kernel_shape");
    CH_TRY(ch_onnx_attr_square(m, "kernel_shape", 2, 1, 1, 1 << 12, &k));
    CH_TRY(ch_onnx_attr_square(m, "strides", 2, 1, 1, 1 << 12, &stride));
    CH_TRY(ch_onnx_attr_square(m, "pads", 4, 0, 0, 1 << 12, &pad));
    CH_TRY(ch_onnx_attr_square(m, "dilations", 2, 1, 1, 1, &dil));
    CH_TRY(ch_onnx_attr_int(m, "ceil_mode", 0, &ceil_mode));
    CH_TRY(ch_onnx_attr_int(m, "count_include_pad", 0, &include_pad));
    CH_TRY(ch_onnx_attr_int(m, "storage_order", 0, &order));
    if (order != 0) return ch_onnx_bad(m, "storage_order %lld (column-major indices) is not supported", (long long)order);
    if (xv->padded) {
        /* Pad + AveragePool: AvgPool2d(padding=p) with count_include_pad, as torch exports it. */
        if (pad != 0 || ceil_mode != 0)
            return ch_onnx_bad(m, "an AveragePool with pads or ceil_mode after a Pad is not supported");
        pad = xv->padded;
        include_pad = 1;
    }
    const ch_pool2d_args a = { .kernel = k, .stride = stride, .padding = pad, .ceil_mode = ceil_mode != 0,
                               .exclude_pad = include_pad == 0 };
    const char *name = ch_onnx_node_name(m, buf, sizeof buf);
    CH_TRY(ch_onnx_tensor_out(m, is_max ? ch_graph_max_pool2d(m->g, name, x, &a) : ch_graph_avg_pool2d(m->g, name, x, &a)));
    return ch_onnx_dead_from(m, 1, "MaxPool's indices, which cohort does not compute");
}

static ch_status op_global_pool(ch_onnx_imp *m)
{
    int x = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_tensor_in(m, 0, &x));
    return ch_onnx_tensor_out(m, ch_graph_global_avg_pool(m->g, ch_onnx_node_name(m, buf, sizeof buf), x));
}

static ch_status op_reduce_mean(ch_onnx_imp *m)
{
    int x = 0;
    int64_t keep = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_tensor_in(m, 0, &x));
    CH_TRY(ch_onnx_attr_int(m, "keepdims", 1, &keep));
    const Onnx__AttributeProto *a = ch_onnx_attr(m->node, "axes");
    bool hw = a && a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS && a->n_ints == 2 &&
              m->g->tensors[x].rank == 3;
    for (size_t i = 0; hw && i < 2; i++) hw = a->ints[i] == 2 || a->ints[i] == 3 || a->ints[i] == -1 || a->ints[i] == -2;
    if (hw) hw = (a->ints[0] + 4) % 4 != (a->ints[1] + 4) % 4;
    if (!hw) return ch_onnx_bad(m, "only the mean over height and width (axes 2, 3) of a (batch, c, h, w) tensor is supported");
    return ch_onnx_tensor_out(m, ch_graph_mean_hw(m->g, ch_onnx_node_name(m, buf, sizeof buf), x, keep != 0));
}

static ch_status op_flatten(ch_onnx_imp *m)
{
    ch_oval *v;
    int64_t axis = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_tensor_val(m, 0, &v));
    CH_TRY(ch_onnx_attr_int(m, "axis", 1, &axis));
    if (axis != 1) return ch_onnx_bad(m, "axis %lld: only flattening all but the batch dimension (axis 1) is supported",
                              (long long)axis);
    if (m->g->tensors[v->tensor].rank == 1) return ch_onnx_alias_out(m, v);
    return ch_onnx_tensor_out(m, ch_graph_flatten(m->g, ch_onnx_node_name(m, buf, sizeof buf), v->tensor));
}

static ch_status op_gemm(ch_onnx_imp *m)
{
    int x = 0;
    int64_t ta = 0, tb = 0;
    double alpha = 0, beta = 0;
    const Onnx__TensorProto *w = NULL;
    char prefix[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_tensor_in(m, 0, &x));
    CH_TRY(ch_onnx_weight_of(m, 1, &w, prefix));
    CH_TRY(ch_onnx_attr_int(m, "transA", 0, &ta));
    CH_TRY(ch_onnx_attr_int(m, "transB", 0, &tb));
    CH_TRY(ch_onnx_attr_float(m, "alpha", 1, &alpha));
    CH_TRY(ch_onnx_attr_float(m, "beta", 1, &beta));
    if (ta != 0 || tb != 1 || alpha != 1 || beta != 1)
        return ch_onnx_bad(m, "only nn.Linear's form (transA 0, transB 1, alpha 1, beta 1) is supported");
    const int f = features_of(m->g, x);
    if (f < 0) return ch_onnx_bad(m, "input is not flat: flatten it first");
    if (w->n_dims != 2 || w->dims[0] < 1 || w->dims[0] > (1 << 20))
        return ch_onnx_bad(m, "weight '%s' is not (out_features, in_features)", ch_onnx_show(m, 0, w->name));
    const int64_t shape[2] = { w->dims[0], f };
    bool has_bias = m->node->n_input > 2 && m->node->input[2][0];
    int twin;
    CH_TRY(ch_onnx_twin(m, 1, 2, &twin));
    if (twin >= 0)
        return ch_onnx_reuse_out(m, twin, x, m->g->nodes[twin].op == CH_GOP_LINEAR &&
                                 m->g->nodes[twin].features == w->dims[0] && m->g->nodes[twin].bias == has_bias);
    CH_TRY(ch_onnx_param(m, 1, prefix, "weight", shape, 2, NULL));
    CH_TRY(ch_onnx_param(m, 2, prefix, "bias", shape, 1, &has_bias));
    return ch_onnx_tensor_out(m, ch_graph_linear(m->g, prefix, x, (int)w->dims[0], has_bias));
}

/* nn.Linear without bias: MatMul(x, Transpose(weight)). */
static ch_status op_matmul(ch_onnx_imp *m)
{
    int x = 0;
    ch_oval *b;
    const Onnx__TensorProto *w = NULL;
    char prefix[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_tensor_in(m, 0, &x));
    CH_TRY(ch_onnx_input(m, 1, true, &b));
    if (b->kind != CH_OVAL_PARAM_T)
        return ch_onnx_bad(m, "only x @ weight.t() (nn.Linear without bias) is supported");
    CH_TRY(ch_onnx_weight_of(m, 1, &w, prefix));
    const int f = features_of(m->g, x);
    if (f < 0) return ch_onnx_bad(m, "input is not flat: flatten it first");
    if (w->dims[0] < 1 || w->dims[0] > (1 << 20)) return ch_onnx_bad(m, "weight '%s' has %lld rows", ch_onnx_show(m, 0, w->name),
                                                             (long long)w->dims[0]);
    const int64_t shape[2] = { w->dims[0], f };
    int twin;
    CH_TRY(ch_onnx_twin(m, 1, 1, &twin));
    if (twin >= 0)
        return ch_onnx_reuse_out(m, twin, x, m->g->nodes[twin].op == CH_GOP_LINEAR &&
                                 m->g->nodes[twin].features == w->dims[0] && !m->g->nodes[twin].bias);
    CH_TRY(ch_onnx_param(m, 1, prefix, "weight", shape, 2, NULL));
    return ch_onnx_tensor_out(m, ch_graph_linear(m->g, prefix, x, (int)w->dims[0], false));
}

/* Input k of an elementwise op: a tensor (maybe an Expand's output) or a single constant number. */
static ch_status operand(ch_onnx_imp *m, size_t k, ch_oval **out)
{
    CH_TRY(ch_onnx_input(m, k, true, out));
    if ((*out)->kind == CH_OVAL_TENSOR) return (*out)->pending ? ch_onnx_tensor_val(m, k, out) : CH_STATUS_OK;
    CH_TRY(ch_onnx_const_in(m, k, true, out));
    if ((*out)->n != 1)
        return ch_onnx_bad(m, "input '%s' is a constant of %d numbers: cohort combines tensors with tensors or with single "
                   "numbers", ch_onnx_show(m, 0, (*out)->name), (*out)->n);
    return CH_STATUS_OK;
}

/* A tensor and a number: x + c, c + x, x * c, c * x, x - c, c - x, x / c as one affine node. */
static ch_status op_with_number(ch_onnx_imp *m, const ch_oval *a, const ch_oval *b)
{
    const bool x_first = a->kind == CH_OVAL_TENSOR;
    const ch_oval *x = x_first ? a : b, *c = x_first ? b : a;
    const double v = c->is_float ? c->f[0] : (double)c->i[0];
    const char *op = m->node->op_type;
    double scale = 1, shift = 0;
    if (x->expanded)
        return ch_onnx_bad(m, "reads '%s', the output of an Expand, with a number: only tensors broadcast", ch_onnx_show(m, 0, x->name));
    if (strcmp(op, "Add") == 0) shift = v;
    else if (strcmp(op, "Mul") == 0) scale = v;
    else if (strcmp(op, "Sub") == 0) scale = x_first ? 1 : -1, shift = x_first ? -v : v;
    else if (x_first && v != 0) scale = 1 / v;
    else return ch_onnx_bad(m, "%s: only a tensor divided by a nonzero number is supported", x_first ? "division by 0" : "a number divided by a tensor");
    if (!isfinite(scale) || !isfinite(shift)) return ch_onnx_bad(m, "constant %g is not finite", v);
    char buf[CH_NODE_NAME_MAX];
    return ch_onnx_tensor_out(m, ch_graph_affine(m->g, ch_onnx_node_name(m, buf, sizeof buf), x->tensor, scale, shift));
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
static ch_status check_expanded(ch_onnx_imp *m, const ch_oval *a, const ch_oval *b, int t)
{
    if (!a->expanded && !b->expanded) return CH_STATUS_OK;
    int da[3], db[3], got[3];
    aligned(m->g, a, da);
    aligned(m->g, b, db);
    const ch_oval r = { .kind = CH_OVAL_TENSOR, .tensor = t };
    aligned(m->g, &r, got);
    for (int i = 0; i < 3; i++)
        if (got[i] != (da[i] == 1 ? db[i] : da[i]))
            return ch_onnx_bad(m, "an Expand to %dx%dx%d is wider than the broadcast of its %s: not supported",
                       (a->expanded ? a : b)->edims[0], (a->expanded ? a : b)->edims[1],
                       (a->expanded ? a : b)->edims[2], m->node->op_type);
    return CH_STATUS_OK;
}

/* Add, Sub, Mul, Div of two integer constants of the same length (or one a single number) that
 * hold no batch size: shape arithmetic, like x.size(1) // groups before a view. Folded as ONNX
 * computes integers (Div truncates toward zero); anything else from constants alone is refused. */
/* A short vector of integers that are sizes (not the batch, within +-2^31). */
static bool shape_ints(const ch_oval *v)
{
    bool ok = v->kind == CH_OVAL_CONST && !v->is_float && v->rank <= 1 && v->n >= 1;
    for (int k = 0; ok && k < v->n; k++) ok = v->i[k] != CH_ONNX_BATCH && v->i[k] >= -(1LL << 31) && v->i[k] <= 1LL << 31;
    return ok;
}

static ch_status fold_shape_arithmetic(ch_onnx_imp *m, const ch_oval *a, const ch_oval *b)
{
    const char *op = m->node->op_type;
    if (!shape_ints(a) || !shape_ints(b) || !(a->n == b->n || a->n == 1 || b->n == 1)) return ch_onnx_bad(m, "both inputs are constants: cohort computes nothing from constants alone");
    ch_oval c = { .kind = CH_OVAL_CONST, .rank = a->rank > b->rank ? a->rank : b->rank };
    c.n = a->n > b->n ? a->n : b->n;
    for (int k = 0; k < c.n; k++) {
        const int64_t x = a->i[a->n == 1 ? 0 : k], y = b->i[b->n == 1 ? 0 : k];
        if (op[0] == 'D' && y == 0) return ch_onnx_bad(m, "a shape divided by zero");
        c.i[k] = op[0] == 'A' ? x + y : op[0] == 'S' ? x - y : op[0] == 'M' ? x * y : x / y;
        c.f[k] = (double)c.i[k];
    }
    return ch_onnx_alias_out(m, &c);
}

static ch_status op_binary(ch_onnx_imp *m)
{
    ch_oval *a, *b;
    CH_TRY(operand(m, 0, &a));
    CH_TRY(operand(m, 1, &b));
    const char *op = m->node->op_type;
    if (a->kind != CH_OVAL_TENSOR && b->kind != CH_OVAL_TENSOR) return fold_shape_arithmetic(m, a, b);
    if (a->kind != CH_OVAL_TENSOR || b->kind != CH_OVAL_TENSOR) return op_with_number(m, a, b);
    if (strcmp(op, "Add") != 0 && strcmp(op, "Mul") != 0)
        return ch_onnx_bad(m, "%s of two tensors is not supported (Add and Mul are)", ch_onnx_show(m, 0, op));
    char buf[CH_NODE_NAME_MAX];
    const char *name = ch_onnx_node_name(m, buf, sizeof buf);
    const int t = op[0] == 'A' ? ch_graph_add(m->g, name, a->tensor, b->tensor)
                               : ch_graph_mul(m->g, name, a->tensor, b->tensor);
    if (t >= 0) CH_TRY(check_expanded(m, a, b, t));
    return ch_onnx_tensor_out(m, t);
}

/* y.expand_as(x), y.expand(n, c, h, w): kept as a mark on y for the Add or Mul that reads it. */
static ch_status op_expand(ch_onnx_imp *m)
{
    ch_oval *v, *s;
    CH_TRY(ch_onnx_tensor_val(m, 0, &v));
    CH_TRY(ch_onnx_const_in(m, 1, true, &s));
    if (s->is_float || s->rank != 1 || s->n < 2 || s->n > 4)
        return ch_onnx_bad(m, "the target shape must be 2 to 4 integers (batch first)");
    if (s->i[0] != CH_ONNX_BATCH && s->i[0] != 1)
        return ch_onnx_bad(m, "expands to a batch of %lld, fixed when the model was exported: write y.expand_as(x)",
                   (long long)s->i[0]);
    int have[3], want[3] = { 1, 1, 1 };
    aligned(m->g, v, have);
    for (int i = 1; i < s->n; i++) {
        const int64_t d = s->i[i];
        if (d < 1 || d > (1 << 20)) return ch_onnx_bad(m, "target dimension %d is %lld", i, d == CH_ONNX_BATCH ? -2LL : (long long)d);
        want[3 - s->n + i] = (int)d;
    }
    bool same = true;
    for (int i = 0; i < 3; i++) {
        if (have[i] != want[i] && have[i] != 1 && want[i] != 1)
            return ch_onnx_bad(m, "cannot expand dimension %d of size %d to %d", i + 1, have[i], want[i]);
        want[i] = have[i] == 1 ? want[i] : have[i];
        same = same && want[i] == have[i];
    }
    CH_TRY(ch_onnx_alias_out(m, v));
    if (same) return CH_STATUS_OK;
    ch_oval *o = ch_ovals_find(&m->vals, m->node->output[0]);
    o->expanded = true;
    memcpy(o->edims, want, sizeof want);
    return CH_STATUS_OK;
}

static ch_status op_dropout(ch_onnx_imp *m)
{
    int x = 0;
    ch_oval *ratio;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_tensor_in(m, 0, &x));
    CH_TRY(ch_onnx_const_in(m, 1, false, &ratio));
    if (ratio && ratio->n != 1) return ch_onnx_bad(m, "ratio must be a scalar");
    /* training_mode (input 2) only says how the module was exported; cohort trains with it on. */
    CH_TRY(ch_onnx_tensor_out(m, ch_graph_dropout(m->g, ch_onnx_node_name(m, buf, sizeof buf), x, ratio ? ratio->f[0] : 0.5)));
    return ch_onnx_dead_from(m, 1, "Dropout's mask, which cohort does not give out");
}

/* Pad of a (batch, c, h, w) tensor with zeros: nothing, or the same number of pixels on every
 * side of h and w, marked for the AveragePool that must read it (tensor_val). */
/* A string attribute equal to one of the texts in want (NULL-ended), or absent (def). */
static bool attr_is(const ch_onnx_imp *m, const char *name, const char *def, const char *const *want)
{
    const Onnx__AttributeProto *a = ch_onnx_attr(m->node, name);
    const char *s = def;
    size_t len = strlen(def);
    if (a) {
        if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING) return false;
        s = (const char *)a->s.data, len = a->s.len;
    }
    for (; *want; want++)
        if (strlen(*want) == len && memcmp(*want, s, len) == 0) return true;
    return false;
}

/* A Resize's output sides (h, w) from its constant scales (1, 1, sh, sw) or sizes (n, c, H, W). */
static ch_status resize_sides(ch_onnx_imp *m, const ch_gtensor *t, const ch_oval *scales, const ch_oval *sizes, double o[2])
{
    if (scales && scales->n > 0) {
        if (scales->n != 4 || scales->f[0] != 1 || scales->f[1] != 1)
            return ch_onnx_bad(m, "scales must be (1, 1, sh, sw): batch and channels stay");
        for (int i = 0; i < 2; i++) o[i] = t->dims[i + 1] * scales->f[i + 2];
        return CH_STATUS_OK;
    }
    if (!sizes || sizes->n != 4 || sizes->i[1] != t->dims[0])
        return ch_onnx_bad(m, "needs constant scales (1, 1, sh, sw) or sizes (n, c, H, W)");
    o[0] = (double)sizes->i[2], o[1] = (double)sizes->i[3];
    return CH_STATUS_OK;
}

/* Bilinear Resize (mode linear): PyTorch's half-pixel mapping or align_corners, to whole output sides. */
static ch_status resize_linear(ch_onnx_imp *m, int x, const double o[2])
{
    static const char *const half[] = { "half_pixel", "pytorch_half_pixel", NULL }, *const corners[] = { "align_corners", NULL };
    const bool align = attr_is(m, "coordinate_transformation_mode", "half_pixel", corners);
    if (!align && !attr_is(m, "coordinate_transformation_mode", "half_pixel", half))
        return ch_onnx_bad(m, "bilinear: only PyTorch's mappings (half_pixel, pytorch_half_pixel, align_corners) are imported");
    for (int i = 0; i < 2; i++)
        if (!(o[i] >= 1 && o[i] <= CH_UPSAMPLE_MAX_SIDE && o[i] == floor(o[i])))
            return ch_onnx_bad(m, "bilinear: an output side of %g: only whole sides 1..%d are imported", o[i], CH_UPSAMPLE_MAX_SIDE);
    char buf[CH_NODE_NAME_MAX];
    return ch_onnx_tensor_out(m, ch_graph_upsample_bilinear(m->g, ch_onnx_node_name(m, buf, sizeof buf), x, (int)o[0],
                                                            (int)o[1], align));
}

/* Resize (nn.Upsample, F.interpolate): in nearest mode by whole factors, each input pixel becomes a
 * block (for whole factors PyTorch's asymmetric + floor mapping and the half-pixel ones, with any
 * rounding, pick the same source pixel; asymmetric with rounding to nearest would not); in linear
 * mode, bilinear resizing. */
static ch_status op_resize(ch_onnx_imp *m)
{
    int x = 0;
    char buf[CH_NODE_NAME_MAX];
    ch_oval *scales, *sizes;
    CH_TRY(ch_onnx_tensor_in(m, 0, &x));
    CH_TRY(ch_onnx_const_in(m, 2, false, &scales));
    CH_TRY(ch_onnx_const_in(m, 3, false, &sizes));
    static const char *const nearest[] = { "nearest", NULL }, *const floor_[] = { "floor", NULL };
    static const char *const asym[] = { "asymmetric", NULL }, *const half[] = { "half_pixel", "pytorch_half_pixel", NULL };
    static const char *const linear[] = { "linear", NULL };
    const ch_gtensor *t = &m->g->tensors[x];
    if (t->rank != 3) return ch_onnx_bad(m, "the input is not (batch, c, h, w)");
    double o[2] = { 0, 0 }, f[2];
    CH_TRY(resize_sides(m, t, scales, sizes, o));
    if (attr_is(m, "mode", "nearest", linear)) return resize_linear(m, x, o);
    if (!attr_is(m, "mode", "nearest", nearest))
        return ch_onnx_bad(m, "only modes 'nearest' and 'linear' (bilinear) are imported (bicubic Resize is not yet)");
    if (!attr_is(m, "coordinate_transformation_mode", "half_pixel", half) &&
        !(attr_is(m, "coordinate_transformation_mode", "half_pixel", asym) && attr_is(m, "nearest_mode", "round_prefer_floor", floor_)))
        return ch_onnx_bad(m, "only PyTorch's nearest mapping (asymmetric with floor, or half_pixel) is imported");
    for (int i = 0; i < 2; i++) f[i] = o[i] / t->dims[i + 1];
    for (int i = 0; i < 2; i++)
        if (!(f[i] >= 1 && f[i] <= CH_UPSAMPLE_MAX && f[i] == floor(f[i])))
            return ch_onnx_bad(m, "scale %g: only whole factors 1..%d are imported (nearest upsampling)", f[i],
                               CH_UPSAMPLE_MAX);
    return ch_onnx_tensor_out(m, ch_graph_upsample_nearest(m->g, ch_onnx_node_name(m, buf, sizeof buf), x, (int)f[0],
                                                           (int)f[1]));
}

static ch_status op_pad(ch_onnx_imp *m)
{
    ch_oval *v, *pads, *value;
    CH_TRY(ch_onnx_tensor_val(m, 0, &v));
    CH_TRY(ch_onnx_const_in(m, 1, true, &pads));
    CH_TRY(ch_onnx_const_in(m, 2, false, &value));
    const Onnx__AttributeProto *mode = ch_onnx_attr(m->node, "mode");
    if (mode && !(mode->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING && mode->s.len == 8 &&
                  memcmp(mode->s.data, "constant", 8) == 0))
        return ch_onnx_bad(m, "only constant padding is supported (reflect and edge are not)");
    if (value && (value->n != 1 || value->f[0] != 0)) return ch_onnx_bad(m, "only padding with zeros is supported");
    bool zero = true;
    for (int i = 0; i < pads->n; i++) zero = zero && pads->i[i] == 0;
    if (zero) return ch_onnx_alias_out(m, v);
    /* pads: (n, c, h, w) begins, then ends. */
    const int64_t *p = pads->i;
    if (pads->n != 8 || m->g->tensors[v->tensor].rank != 3 || p[0] || p[1] || p[4] || p[5] || p[2] != p[3] ||
        p[2] != p[6] || p[2] != p[7] || p[2] < 1 || p[2] > 1 << 12)
        return ch_onnx_bad(m, "only the same zero padding on every side of h and w is supported (as before an "
                   "AvgPool2d with count_include_pad); pad in the Conv or the pooling instead");
    CH_TRY(ch_onnx_alias_out(m, v));
    ch_ovals_find(&m->vals, m->node->output[0])->padded = (int)p[2];
    return CH_STATUS_OK;
}

/* The cross-entropy's log-softmax, exported by a model that ends in log_softmax (or softmax):
 * the graph's output is its input, the logits. */
static ch_status op_softmax(ch_onnx_imp *m)
{
    ch_oval *v, *o;
    int64_t axis = 0;
    CH_TRY(ch_onnx_tensor_val(m, 0, &v));
    CH_TRY(ch_onnx_attr_int(m, "axis", m->opset >= 13 ? -1 : 1, &axis));
    if (features_of(m->g, v->tensor) < 0 || (axis != 1 && axis != -1 && !(axis == -3 && m->g->tensors[v->tensor].rank == 3)))
        return ch_onnx_bad(m, "only a softmax over the classes of (batch, classes) logits is supported");
    if (m->node->n_output < 1 || strcmp(m->node->output[0], m->output) != 0)
        return ch_onnx_bad(m, "a %s is supported only as the model's last operation (folded into the cross-entropy)",
                   ch_onnx_show(m, 0, m->node->op_type));
    CH_TRY(ch_onnx_alias_out(m, v));
    o = ch_ovals_find(&m->vals, m->node->output[0]);
    o->folded_softmax = true;
    return CH_STATUS_OK;
}

static ch_status op_identity(ch_onnx_imp *m)
{
    ch_oval *v;
    CH_TRY(ch_onnx_input(m, 0, true, &v));
    return ch_onnx_alias_out(m, v);
}

static ch_status op_cast(ch_onnx_imp *m)
{
    ch_oval *v;
    int64_t to = 0;
    CH_TRY(ch_onnx_input(m, 0, true, &v));
    CH_TRY(ch_onnx_attr_int(m, "to", 0, &to));
    const bool to_float = to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    if (v->kind == CH_OVAL_TENSOR && to_float) return ch_onnx_alias_out(m, v);
    if (v->kind != CH_OVAL_CONST && v->kind != CH_OVAL_PARAM)
        return ch_onnx_bad(m, "casts of tensors to type %lld are not supported", (long long)to);
    CH_TRY(ch_onnx_const_in(m, 0, true, &v));
    ch_oval c = *v;
    c.is_float = to_float || to == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
    for (int i = 0; i < c.n; i++) c.f[i] = c.is_float ? c.f[i] : (double)c.i[i];
    return ch_onnx_alias_out(m, &c);
}

static ch_status op_constant(ch_onnx_imp *m)
{
    ch_oval *o;
    CH_TRY(ch_onnx_define(m, 0, CH_OVAL_CONST, &o));
    const Onnx__AttributeProto *a = m->node->n_attribute == 1 ? m->node->attribute[0] : NULL;
    if (a && a->name && strcmp(a->name, "value") == 0 && a->t) {
        char what[120];
        snprintf(what, sizeof what, "the value of Constant '%s'", ch_onnx_show(m, 0, m->node->name));
        ch_err e;
        return ch_onnx_tensor_const(a->t, what, o, &e) == CH_STATUS_OK ? CH_STATUS_OK : ch_onnx_bad(m, "%s", e.msg);
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
    return ch_onnx_bad(m, "only a tensor, int, float or ints value of at most %d numbers is supported", CH_ONNX_CONST_MAX);
}

/* ---- the walk ---- */

typedef struct op_entry {
    const char *name;
    ch_status (*fn)(ch_onnx_imp *m);
    int max_in;     /* inputs the operator has in opsets 13 to 17 (-1: any number) */
} op_entry;

static const op_entry ops[] = {
    { "Conv", op_conv, 3 }, { "ConvTranspose", op_conv, 3 }, { "BatchNormalization", op_batchnorm, 5 }, { "Relu", op_activation, 1 },
    { "LeakyRelu", op_activation, 1 }, { "Clip", op_activation, 3 }, { "Sigmoid", op_activation, 1 },
    { "Tanh", op_activation, 1 }, { "Erf", op_activation, 1 }, { "MaxPool", op_pool, 1 }, { "AveragePool", op_pool, 1 },
    { "GlobalAveragePool", op_global_pool, 1 }, { "ReduceMean", op_reduce_mean, 1 }, { "Flatten", op_flatten, 1 },
    { "Reshape", ch_onnx_op_reshape, 2 }, { "Gemm", op_gemm, 3 }, { "MatMul", op_matmul, 2 }, { "Transpose", ch_onnx_op_transpose, 1 },
    { "Add", op_binary, 2 }, { "Mul", op_binary, 2 }, { "Sub", op_binary, 2 }, { "Div", op_binary, 2 },
    { "Expand", op_expand, 2 }, { "HardSigmoid", op_activation, 1 }, { "HardSwish", op_activation, 1 },
    { "Concat", ch_onnx_op_concat, -1 }, { "Dropout", op_dropout, 3 },
    { "Pad", op_pad, 3 }, { "LogSoftmax", op_softmax, 1 }, { "Softmax", op_softmax, 1 }, { "Identity", op_identity, 1 },
    { "Cast", op_cast, 1 }, { "Constant", op_constant, 0 }, { "Resize", op_resize, 4 },
    { "LayerNormalization", op_layernorm, 3 },
    { "Shape", ch_onnx_op_shape, 1 }, { "Gather", ch_onnx_op_gather, 2 },
    { "Unsqueeze", ch_onnx_op_squeeze, 2 }, { "Squeeze", ch_onnx_op_squeeze, 2 }, { "Slice", ch_onnx_op_slice, 5 },
};

bool ch_onnx_op_known(const Onnx__NodeProto *n)
{
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0) return false;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (n->op_type && strcmp(n->op_type, ops[i].name) == 0) return true;
    return false;
}

/* "in module stage.0" from a node named "/stage/stage.0/Div" (torch.onnx's scope names): the
 * component before the operator's own. */
static void module_of(const char *node, char *buf, size_t len)
{
    buf[0] = '\0';
    const char *end = node ? strrchr(node, '/') : NULL;
    if (!end || end == node) return;
    const char *start = end - 1;
    while (start > node && start[-1] != '/') start--;
    snprintf(buf, len, "%.*s", (int)(end - start), start);
}

void ch_onnx_unknown_why(ch_onnx_imp *m, const Onnx__NodeProto *n, char *buf, size_t len)
{
    char module[64];
    module_of(n->name, module, sizeof module);
    for (char *c = module; *c; c++)
        if (*c < ' ' || *c > '~') *c = '?';
    const char *hint = ch_onnx_op_hint(n->op_type);
    const bool other = n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0;
    snprintf(buf, len, "%s '%s' is not supported%s%s%s%s%s%s", other ? "operator domain" : "operator",
             ch_onnx_show(m, 0, other ? n->domain : n->op_type), hint || module[0] ? " (" : "", hint ? hint : "",
             hint && module[0] ? ", " : "", module[0] ? "in module " : "", module, hint || module[0] ? ")" : "");
}

const char *ch_onnx_op_hint(const char *op)
{
    static const struct { const char *op, *what; } hints[] = {
        { "Upsample", "nn.Upsample or F.interpolate" },
        { "Elu", "nn.ELU" }, { "ConvTranspose", "nn.ConvTranspose2d" },
        { "InstanceNormalization", "nn.InstanceNorm2d" }, { "ReduceMax", "a max over an axis" },
        { "Pow", "x ** p, as in a hand-written LayerNorm (export with opset_version=17 for nn.LayerNorm)" }, { "Sqrt", "a square root, as in a hand-written LayerNorm" },
    };
    for (size_t i = 0; op && i < sizeof hints / sizeof *hints; i++)
        if (strcmp(op, hints[i].op) == 0) return hints[i].what;
    return NULL;
}

ch_status ch_onnx_import_node(ch_onnx_imp *m, const Onnx__NodeProto *n)
{
    m->node = n;
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx") != 0) {
        char why[200];
        ch_onnx_unknown_why(m, n, why, sizeof why);
        return ch_onnx_bad(m, "%s: only ONNX's own operators", why);
    }
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (!n->op_type || strcmp(n->op_type, ops[i].name) != 0) continue;
        /* An input the handler would never read is not dropped silently. */
        if (ops[i].max_in >= 0 && n->n_input > (size_t)ops[i].max_in)
            return ch_onnx_bad(m, "%zu inputs; %s takes at most %d", n->n_input, ops[i].name, ops[i].max_in);
        return ops[i].fn(m);
    }
    char why[200];
    ch_onnx_unknown_why(m, n, why, sizeof why);
    return ch_onnx_bad(m, "%s; %s", why, CH_ONNX_IMPORTS);
}

