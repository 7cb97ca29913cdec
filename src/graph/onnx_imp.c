/* The ONNX importer's shared helpers (onnx_imp.h): messages, attributes, inputs and outputs of the
 * node being imported, and weights taken under their state_dict names. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph.h"
#include "graph/onnx_imp.h"

/* A string from the file as it may appear in a one-line message: printable, at most 80 bytes. */
const char *ch_onnx_show(ch_onnx_imp *m, int slot, const char *s)
{
    char *b = m->shown[slot];
    size_t k = 0;
    for (; s && s[k] && k < 80; k++) b[k] = s[k] > ' ' && s[k] < 127 ? s[k] : '?';
    if (s && s[k]) b[k++] = '~';
    b[k] = 0;
    return b;
}

ch_status ch_onnx_bad(ch_onnx_imp *m, const char *fmt, ...)
{
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m->node)
        return ch_fail(m->err, CH_STATUS_BAD_INPUT, "%s: node '%s' (%s): %s", m->file, ch_onnx_show(m, 2, m->node->name),
                       ch_onnx_show(m, 3, m->node->op_type), msg);
    return ch_fail(m->err, CH_STATUS_BAD_INPUT, "%s: %s", m->file, msg);
}

/* ---- attributes ---- */

const Onnx__AttributeProto *ch_onnx_attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (n->attribute[i]->name && strcmp(n->attribute[i]->name, name) == 0) return n->attribute[i];
    return NULL;
}

ch_status ch_onnx_attr_int(ch_onnx_imp *m, const char *name, int64_t def, int64_t *out)
{
    const Onnx__AttributeProto *a = ch_onnx_attr(m->node, name);
    if (!a) return (*out = def, CH_STATUS_OK);
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT) return ch_onnx_bad(m, "attribute %s is not an integer", name);
    *out = a->i;
    return CH_STATUS_OK;
}

ch_status ch_onnx_attr_float(ch_onnx_imp *m, const char *name, double def, double *out)
{
    const Onnx__AttributeProto *a = ch_onnx_attr(m->node, name);
    if (!a) return (*out = def, CH_STATUS_OK);
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT || !isfinite(a->f))
        return ch_onnx_bad(m, "attribute %s is not a finite float", name);
    *out = a->f;
    return CH_STATUS_OK;
}

/* A pair for the two spatial dimensions that must be equal (cohort's kernels are square), from an
 * attribute of n values (2, or 4 for pads) that is def when absent. */
ch_status ch_onnx_attr_square(ch_onnx_imp *m, const char *name, int n, int64_t def, int64_t lo, int64_t hi, int *out)
{
    const Onnx__AttributeProto *a = ch_onnx_attr(m->node, name);
    if (!a) return (*out = (int)def, CH_STATUS_OK);
    if (a->type != ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS || a->n_ints != (size_t)n)
        return ch_onnx_bad(m, "attribute %s is not %d integers", name, n);
    for (int i = 1; i < n; i++)
        if (a->ints[i] != a->ints[0])
            return ch_onnx_bad(m, "%s (%lld, %lld%s): cohort supports equal values for height and width%s", name,
                       (long long)a->ints[0], (long long)a->ints[1], n == 4 ? ", ..." : "",
                       n == 4 ? " on every side" : "");
    if (a->ints[0] < lo || a->ints[0] > hi) return ch_onnx_bad(m, "%s %lld is outside %lld..%lld", name,
                                                       (long long)a->ints[0], (long long)lo, (long long)hi);
    *out = (int)a->ints[0];
    return CH_STATUS_OK;
}

ch_status ch_onnx_no_auto_pad(ch_onnx_imp *m)
{
    const Onnx__AttributeProto *a = ch_onnx_attr(m->node, "auto_pad");
    if (a && !(a->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING && a->s.len == 6 &&
               memcmp(a->s.data, "NOTSET", 6) == 0))
        return ch_onnx_bad(m, "auto_pad is not supported (PyTorch exports explicit pads)");
    return CH_STATUS_OK;
}

/* A float32 attribute holds what the user typed (0.1, 1e-5) to float precision: give it back as
 * typed, so that BatchNorm's momentum is 0.1 as in PyTorch, not 0.100000024. */
double ch_onnx_as_typed(double x)
{
    char b[32];
    snprintf(b, sizeof b, "%.6g", x);
    return strtod(b, NULL);
}

/* ---- values ---- */

/* The k-th input of the node (NULL when absent and optional). */
ch_status ch_onnx_input(ch_onnx_imp *m, size_t k, bool required, ch_oval **out)
{
    const Onnx__NodeProto *n = m->node;
    *out = NULL;
    if (k >= n->n_input || !n->input[k][0]) {
        if (required) return ch_onnx_bad(m, "input %zu is missing", k);
        return CH_STATUS_OK;
    }
    ch_oval *v = ch_ovals_find(&m->vals, n->input[k]);
    if (!v) return ch_onnx_bad(m, "reads '%s', which no earlier node makes and no initializer holds", ch_onnx_show(m, 0, n->input[k]));
    if (v->kind == CH_OVAL_DEAD) return ch_onnx_bad(m, "reads '%s', %s", ch_onnx_show(m, 0, v->name), v->why);
    if (v->folded_softmax)
        return ch_onnx_bad(m, "reads '%s', the output of a LogSoftmax/Softmax: cohort folds those into the loss, only as "
                   "the model's last operation", ch_onnx_show(m, 0, v->name));
    *out = v;
    return CH_STATUS_OK;
}

/* A channels-last view (x.permute(0, 2, 3, 1), kept as a mark for the LayerNorm that usually reads
 * it) read by another op: the permutation becomes a node, and the value its output from then on. */
static ch_status materialise_channels_last(ch_onnx_imp *m, size_t k, ch_oval *v)
{
    static const int to_last[4] = { 0, 2, 3, 1 };
    char buf[CH_NODE_NAME_MAX], name[CH_NODE_NAME_MAX + 24];
    snprintf(name, sizeof name, "%s/permute_in%zu", ch_onnx_node_name(m, buf, sizeof buf), k);
    const int t = ch_graph_permute(m->g, name, v->tensor, to_last);
    if (t < 0) {
        ch_err e;
        ch_graph_status(m->g, &e);
        return ch_onnx_bad(m, "%s", e.msg);
    }
    v->tensor = t;
    v->channels_last = false;
    return CH_STATUS_OK;
}

/* Input k, which must be a tensor computed from the model's input. */
ch_status ch_onnx_tensor_val(ch_onnx_imp *m, size_t k, ch_oval **out)
{
    CH_TRY(ch_onnx_input(m, k, true, out));
    if ((*out)->kind != CH_OVAL_TENSOR)
        return ch_onnx_bad(m, "input '%s' is a constant or an initializer; cohort supports it only as a tensor computed "
                   "from the model's input", ch_onnx_show(m, 0, (*out)->name));
    if ((*out)->expanded)
        return ch_onnx_bad(m, "reads '%s', the output of an Expand: cohort supports Expand only into an Add or Mul, which "
                   "broadcast", ch_onnx_show(m, 0, (*out)->name));
    if ((*out)->pending)
        return ch_onnx_bad(m, "reads '%s', a (batch, %d, %d) tensor: cohort has (batch, features) and (batch, c, h, w) "
                   "tensors only", ch_onnx_show(m, 0, (*out)->name), (*out)->pdims[0], (*out)->pdims[1]);
    if ((*out)->channels_last) CH_TRY(materialise_channels_last(m, k, *out));
    if ((*out)->grouped[0])
        return ch_onnx_bad(m, "reads '%s', a (batch, %d, %d, h, w) view into channel groups: cohort imports it only as a "
                   "channel shuffle (Transpose with perm (0, 2, 1, 3, 4), then a Reshape back to (batch, c, h, w))",
                   ch_onnx_show(m, 0, (*out)->name), (*out)->grouped[0], (*out)->grouped[1]);
    if ((*out)->padded && strcmp(m->node->op_type, "AveragePool") != 0)
        return ch_onnx_bad(m, "reads '%s', the output of a Pad: cohort supports a zero Pad only before an AveragePool "
                   "(AvgPool2d's count_include_pad); pad in the Conv or the pooling instead", ch_onnx_show(m, 0, (*out)->name));
    return CH_STATUS_OK;
}

ch_status ch_onnx_tensor_in(ch_onnx_imp *m, size_t k, int *t)
{
    ch_oval *v;
    CH_TRY(ch_onnx_tensor_val(m, k, &v));
    *t = v->tensor;
    return CH_STATUS_OK;
}

/* A constant input (a Constant's output, folded shape arithmetic, or a small initializer). */
ch_status ch_onnx_const_in(ch_onnx_imp *m, size_t k, bool required, ch_oval **out)
{
    CH_TRY(ch_onnx_input(m, k, required, out));
    ch_oval *v = *out;
    if (!v) return CH_STATUS_OK;
    if (v->kind == CH_OVAL_PARAM) {
        char what[160];
        snprintf(what, sizeof what, "initializer '%s'", ch_onnx_show(m, 0, v->name));
        ch_oval c = *v;
        ch_err e;
        if (ch_onnx_tensor_const(v->init, what, &c, &e) != CH_STATUS_OK) return ch_onnx_bad(m, "%s", e.msg);
        c.uses = v->uses + 1; /* read: not an unused initializer */
        *v = c;               /* from now on, the constant it holds */
    }
    if (v->kind != CH_OVAL_CONST)
        return ch_onnx_bad(m, "input '%s' must be a constant: cohort computes no shapes or bounds from data",
                   ch_onnx_show(m, 0, v->name));
    return CH_STATUS_OK;
}

ch_status ch_onnx_define(ch_onnx_imp *m, size_t k, ch_oval_kind kind, ch_oval **out)
{
    const Onnx__NodeProto *n = m->node;
    if (k >= n->n_output || !n->output[k][0]) {
        *out = NULL;
        return kind == CH_OVAL_DEAD ? CH_STATUS_OK : ch_onnx_bad(m, "output %zu is missing", k);
    }
    ch_err e;
    *out = ch_ovals_add(&m->vals, n->output[k], kind, &e);
    return *out ? CH_STATUS_OK : ch_onnx_bad(m, "%s", e.msg);
}

/* Outputs from k on are ones cohort does not compute: reading them is refused, saying why. */
ch_status ch_onnx_dead_from(ch_onnx_imp *m, size_t k, const char *why)
{
    for (; k < m->node->n_output; k++) {
        ch_oval *v;
        CH_TRY(ch_onnx_define(m, k, CH_OVAL_DEAD, &v));
        if (v) v->why = why;
    }
    return CH_STATUS_OK;
}

/* The node's output 0 is graph tensor t (a builder result: -1 carries the builder's error). */
ch_status ch_onnx_tensor_out(ch_onnx_imp *m, int t)
{
    if (t < 0) {
        ch_err e;
        ch_graph_status(m->g, &e);
        return ch_onnx_bad(m, "%s", e.msg);
    }
    ch_oval *v;
    CH_TRY(ch_onnx_define(m, 0, CH_OVAL_TENSOR, &v));
    v->tensor = t;
    return CH_STATUS_OK;
}

/* Output 0 is input value src under a new name (Identity and the ops folded away). */
ch_status ch_onnx_alias_out(ch_onnx_imp *m, const ch_oval *src)
{
    const ch_oval copy = *src;
    ch_oval *v;
    CH_TRY(ch_onnx_define(m, 0, copy.kind, &v));
    const char *name = v->name;
    *v = copy;
    v->name = name;
    v->uses = 0;
    return CH_STATUS_OK;
}

/* A name for a node without weights: its own when usable, else OP_INDEX. */
const char *ch_onnx_node_name(ch_onnx_imp *m, char *buf, size_t len)
{
    const char *s = m->node->name;
    bool ok = s && s[0] && strlen(s) < CH_NODE_NAME_MAX;
    for (const char *c = s; ok && *c; c++) ok = *c > ' ' && *c < 127;
    if (ok) return s;
    snprintf(buf, len, "%s_%d", ch_onnx_show(m, 0, m->node->op_type), ch_graph_node_count(m->g));
    return buf;
}

/* ---- weights ---- */

ch_status ch_onnx_inference_export(ch_onnx_imp *m, const char *init)
{
    return ch_onnx_bad(m, "an inference export (initializer '%s'; BatchNorm folded into Conv or run in eval mode) cannot "
               "train: export with torch.onnx.export(model, x, \"%s\", training=torch.onnx.TrainingMode.TRAINING, "
               "do_constant_folding=False, input_names=[\"input\"], output_names=[\"output\"], dynamic_axes={\"input\": "
               "{0: \"batch\"}, \"output\": {0: \"batch\"}})", ch_onnx_show(m, 0, init),
               ch_onnx_show(m, 1, m->file));
}

/* The module path of a weight named PATH.weight, which a training export keeps. */
static ch_status weight_prefix(ch_onnx_imp *m, const ch_oval *w, char *prefix)
{
    const char *s = w->name;
    const size_t len = strlen(s);
    if (strncmp(s, "onnx::", 6) == 0) return ch_onnx_inference_export(m, s);
    if (len < 8 || strcmp(s + len - 7, ".weight") != 0 || len - 7 >= CH_NODE_NAME_MAX)
        return ch_onnx_bad(m, "weight '%s' is not a state_dict name (MODULE.weight, under %d characters): export the "
                   "nn.Module in training mode", ch_onnx_show(m, 0, s), CH_NODE_NAME_MAX);
    memcpy(prefix, s, len - 7);
    prefix[len - 7] = 0;
    return CH_STATUS_OK;
}

/* The initializer behind input k (through a MatMul's transpose), or NULL. */
static const ch_oval *init_of(ch_onnx_imp *m, size_t k)
{
    const Onnx__NodeProto *n = m->node;
    const ch_oval *v = k < n->n_input && n->input[k][0] ? ch_ovals_find(&m->vals, n->input[k]) : NULL;
    if (v && v->kind == CH_OVAL_PARAM_T) v = ch_ovals_find(&m->vals, v->init->name);
    return v && v->kind == CH_OVAL_PARAM ? v : NULL;
}

ch_status ch_onnx_twin(ch_onnx_imp *m, size_t k, size_t last, int *twin)
{
    const ch_oval *w = init_of(m, k);
    *twin = w && w->owner ? w->owner - 1 : -1;
    if (*twin < 0) return CH_STATUS_OK;
    for (size_t i = k + 1; i <= last && i < m->node->n_input; i++) {
        const ch_oval *p = init_of(m, i);
        if (m->node->input[i][0] && (!p || p->owner != w->owner))
            return ch_onnx_bad(m, "reads weight '%s' of node '%s' but not its other parameters ('%s')", ch_onnx_show(m, 0, w->name),
                       ch_onnx_show(m, 1, m->g->nodes[*twin].name), ch_onnx_show(m, 2, m->node->input[i]));
    }
    return CH_STATUS_OK;
}

ch_status ch_onnx_reuse_out(ch_onnx_imp *m, int twin, int x, bool same)
{
    char buf[CH_NODE_NAME_MAX];
    if (!same)
        return ch_onnx_bad(m, "reads the weights of node '%s' with other arguments: a module called twice has the same ones",
                   ch_onnx_show(m, 0, m->g->nodes[twin].name));
    return ch_onnx_tensor_out(m, ch_graph_reuse(m->g, ch_onnx_node_name(m, buf, sizeof buf), m->g->nodes[twin].name, x));
}

/* Input k is the initializer PREFIX.SUFFIX of the given shape, read by no other node: its values
 * become the graph's starting values. Absent and optional: *present false. */
ch_status ch_onnx_param(ch_onnx_imp *m, size_t k, const char *prefix, const char *suffix, const int64_t *shape, int rank,
                       bool *present)
{
    ch_oval *v;
    CH_TRY(ch_onnx_input(m, k, present == NULL, &v));
    if (present) *present = v != NULL;
    if (!v) return CH_STATUS_OK;
    if (v->kind == CH_OVAL_PARAM_T) v = ch_ovals_find(&m->vals, v->init->name);
    if (!v || v->kind != CH_OVAL_PARAM)
        return ch_onnx_bad(m, "input %zu ('%s') must be an initializer (a weight)", k, v ? ch_onnx_show(m, 0, v->name) : "?");
    char want[CH_NAME_MAX];
    snprintf(want, sizeof want, "%s.%s", prefix, suffix);
    if (strncmp(v->name, "onnx::", 6) == 0) return ch_onnx_inference_export(m, v->name);
    if (strcmp(v->name, want) != 0)
        return ch_onnx_bad(m, "initializer '%s' should be named '%s' (state_dict names, as a training export keeps them)",
                   ch_onnx_show(m, 0, v->name), ch_onnx_show(m, 1, want));
    if (v->uses++ > 0)
        return ch_onnx_bad(m, "initializer '%s' is read by two nodes of different kinds", ch_onnx_show(m, 0, v->name));
    v->owner = m->g->nnodes + 1;   /* the node the caller makes next */
    const Onnx__TensorProto *t = v->init;
    bool same = t->n_dims == (size_t)rank;
    for (int i = 0; same && i < rank; i++) same = t->dims[i] == shape[i];
    if (!same) {
        char got[96] = "", need[96] = "";
        for (size_t i = 0; i < t->n_dims && i < 6; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->dims[i]);
        for (int i = 0; i < rank; i++)
            snprintf(need + strlen(need), sizeof need - strlen(need), "%s%lld", i ? ", " : "", (long long)shape[i]);
        return ch_onnx_bad(m, "initializer '%s' has shape (%s); the node needs (%s)", ch_onnx_show(m, 0, v->name), got, need);
    }
    float *data;
    size_t count;
    char what[160];
    ch_err e;
    snprintf(what, sizeof what, "initializer '%s'", ch_onnx_show(m, 0, v->name));
    if (ch_onnx_tensor_floats(t, what, &data, &count, &e) != CH_STATUS_OK) return ch_onnx_bad(m, "%s", e.msg);
    /* The graph checks the values as a checkpoint's are checked (NaN, a negative running_var). */
    if (ch_graph_take_initial(m->g, v->name, data, count, &e) != CH_STATUS_OK) return ch_onnx_bad(m, "initializer: %s", e.msg);
    return CH_STATUS_OK;
}

/* The weight input k (an initializer, maybe transposed) and its module path. */
ch_status ch_onnx_weight_of(ch_onnx_imp *m, size_t k, const Onnx__TensorProto **t, char *prefix)
{
    ch_oval *v;
    CH_TRY(ch_onnx_input(m, k, true, &v));
    if (v->kind != CH_OVAL_PARAM && v->kind != CH_OVAL_PARAM_T)
        return ch_onnx_bad(m, "input %zu ('%s') must be an initializer (a weight)", k, ch_onnx_show(m, 0, v->name));
    const ch_oval *w = v->kind == CH_OVAL_PARAM_T ? ch_ovals_find(&m->vals, v->init->name) : v;
    *t = v->init;
    return weight_prefix(m, w, prefix);
}

