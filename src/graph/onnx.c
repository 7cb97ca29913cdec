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
#include "graph/onnx_imp.h"
#include "graph/onnx_values.h"

/* protobuf-c reads at most 2 GiB, as ONNX's own tools do. */
static const size_t max_file = (size_t)2 << 30;
enum { MAX_NODES = 1 << 16, OPSET_MIN = CH_ONNX_OPSET_MIN, OPSET_MAX = CH_ONNX_OPSET_MAX };

static ch_status check_opset(ch_onnx_imp *m, const Onnx__ModelProto *mp)
{
    m->opset = -1;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
        if (!o->domain || !o->domain[0] || strcmp(o->domain, "ai.onnx") == 0) m->opset = (int)(o->has_version ? o->version : -1);
    }
    if (m->opset < OPSET_MIN || m->opset > OPSET_MAX)
        return ch_onnx_bad(m, "ONNX opset %d: cohort imports opsets %d to %d (torch.onnx.export(..., opset_version=%d))",
                   m->opset, OPSET_MIN, OPSET_MAX, OPSET_MAX);
    return CH_STATUS_OK;
}

/* The data input: the one graph input that is no initializer, (batch, c, h, w) float. */
static ch_status add_input(ch_onnx_imp *m)
{
    const Onnx__GraphProto *gp = m->gp;
    const Onnx__ValueInfoProto *in = NULL;
    for (size_t i = 0; i < gp->n_input; i++) {
        const ch_oval *v = ch_ovals_find(&m->vals, gp->input[i]->name);
        if (v && v->kind == CH_OVAL_PARAM) continue;
        if (in) return ch_onnx_bad(m, "the model has several inputs ('%s', '%s'); cohort feeds one batch of images",
                           ch_onnx_show(m, 0, in->name), ch_onnx_show(m, 1, gp->input[i]->name));
        in = gp->input[i];
    }
    if (!in || !in->name) return ch_onnx_bad(m, "the model has no input");
    const Onnx__TypeProto *t = in->type;
    const Onnx__TensorShapeProto *s = t && t->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && t->tensor_type
                                          ? t->tensor_type->shape : NULL;
    if (!s || t->tensor_type->elem_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || s->n_dim != 4)
        return ch_onnx_bad(m, "input '%s' is not a float tensor of shape (batch, c, h, w)", ch_onnx_show(m, 0, in->name));
    int d[3];
    for (int i = 0; i < 3; i++) {
        const Onnx__TensorShapeProto__Dimension *x = s->dim[i + 1];
        if (x->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE || x->dim_value < 1 ||
            x->dim_value > 65536)
            return ch_onnx_bad(m, "input '%s': dimension %d is not a number 1..65536", ch_onnx_show(m, 0, in->name), i + 1);
        d[i] = (int)x->dim_value;
    }
    ch_oval *v;
    ch_err e;
    if (!(v = ch_ovals_add(&m->vals, in->name, CH_OVAL_TENSOR, &e))) return ch_onnx_bad(m, "%s", e.msg);
    char buf[CH_NODE_NAME_MAX];
    const bool usable = strlen(in->name) < sizeof buf && !strpbrk(in->name, " \t\n\r");
    v->tensor = ch_graph_input(m->g, usable ? in->name : "input", d[0], d[1], d[2]);
    if (v->tensor < 0) return (ch_graph_status(m->g, &e), ch_onnx_bad(m, "%s", e.msg));
    return CH_STATUS_OK;
}

/* Every node whose operator cohort does not import, found before the walk: all of them at once
 * (one line each, then the list of what is imported), and never a symptom downstream of one (a
 * shape Concat that feeds a Resize). One alone is the walk's usual line. */
static ch_status refuse_unknown_operators(ch_onnx_imp *m)
{
    const Onnx__GraphProto *gp = m->gp;
    size_t unknown = 0, first = 0;
    for (size_t i = 0; i < gp->n_node; i++)
        if (!ch_onnx_op_known(gp->node[i]) && !unknown++) first = i;
    if (unknown == 0) return CH_STATUS_OK;
    if (unknown == 1) return ch_onnx_import_node(m, gp->node[first]);
    enum { SHOWN = 3 };   /* and the list line: what ch_err holds */
    char text[sizeof m->err->msg] = "";
    size_t at = 0, shown = 0;
    for (size_t i = first; i < gp->n_node && shown < SHOWN; i++) {
        if (ch_onnx_op_known(gp->node[i])) continue;
        char why[200];
        ch_onnx_unknown_why(m, gp->node[i], why, sizeof why);
        m->node = gp->node[i];
        ch_onnx_bad(m, "%s", why);   /* the line as a single refusal reads, escaped */
        at += (size_t)snprintf(text + at, sizeof text - at, "%s\n", m->err->msg);
        if (at >= sizeof text) at = sizeof text - 1;
        shown++;
    }
    m->node = NULL;
    char more[64] = "";
    if (unknown > shown) snprintf(more, sizeof more, " (%zu more not shown)", unknown - shown);
    ch_onnx_bad(m, "%zu operators above%s are not supported; " CH_ONNX_IMPORTS, unknown, more);
    /* Lines the caller prints one by one (ch_err's text is otherwise one line). */
    snprintf(text + at, sizeof text - at, "%s", m->err->msg);
    memcpy(m->err->msg, text, sizeof text);
    return CH_STATUS_BAD_INPUT;
}

static ch_status import_graph(ch_onnx_imp *m)
{
    const Onnx__GraphProto *gp = m->gp;
    ch_err e;
    if (gp->n_node > MAX_NODES) return ch_onnx_bad(m, "%zu nodes, more than %d", gp->n_node, MAX_NODES);
    if (gp->n_sparse_initializer) return ch_onnx_bad(m, "sparse initializers are not supported");
    for (size_t i = 0; i < gp->n_initializer; i++) {
        ch_oval *v = ch_ovals_add(&m->vals, gp->initializer[i]->name, CH_OVAL_PARAM, &e);
        if (!v) return ch_onnx_bad(m, "initializer: %s", e.msg);
        v->init = gp->initializer[i];
        /* Sizes and storage are checked here, before any node looks at a dimension. */
        size_t count;
        char what[120];
        snprintf(what, sizeof what, "initializer '%s'", ch_onnx_show(m, 0, v->name));
        if (ch_onnx_tensor_count(v->init, what, &count, &e) != CH_STATUS_OK) return ch_onnx_bad(m, "%s", e.msg);
    }
    if (gp->n_output != 1 || !gp->output[0]->name)
        return ch_onnx_bad(m, "the model has %zu outputs; cohort trains one (the logits)", gp->n_output);
    m->output = gp->output[0]->name;
    CH_TRY(add_input(m));
    CH_TRY(refuse_unknown_operators(m));
    for (size_t i = 0; i < gp->n_node; i++) CH_TRY(ch_onnx_import_node(m, gp->node[i]));
    m->node = NULL;
    const ch_oval *out = ch_ovals_find(&m->vals, m->output);
    if (!out || out->kind != CH_OVAL_TENSOR || out->expanded || out->pending)
        return ch_onnx_bad(m, "output '%s' is made by no node, or is no tensor computed from the input", ch_onnx_show(m, 0, m->output));
    if (ch_graph_output(m->g, out->tensor) != CH_STATUS_OK) return (ch_graph_status(m->g, &e), ch_onnx_bad(m, "%s", e.msg));
    for (size_t i = 0; i < m->vals.n; i++)
        if (m->vals.v[i].kind == CH_OVAL_PARAM && m->vals.v[i].uses == 0)
            return ch_onnx_bad(m, "initializer '%s' is read by no node cohort imports", ch_onnx_show(m, 0, m->vals.v[i].name));
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
    ch_onnx_imp m = { .file = path, .gp = mp->graph, .err = err };
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
