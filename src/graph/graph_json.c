/* A graph as JSON (graph.json in checkpoints), so that eval, export and --resume rebuild an
 * imported or hand-built model without its original file or code. Reading replays the builder
 * calls, so a hand-edited or hostile file meets every check a builder call makes; tensor ids in
 * the file are only references to earlier entries. Starting values are not written: a
 * checkpoint's weights are in its model.safetensors. */
#include "graph/graph_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"

enum { FORMAT = 1, MAX_NODES = 1 << 16 };

static void add_num(cJSON *o, const char *k, double v) { cJSON_AddNumberToObject(o, k, v); }

static void put_args(cJSON *o, const ch_gnode *nd)
{
    switch (nd->op) {
    case CH_GOP_CONV2D:
    case CH_GOP_CONV_T:
        if (nd->op == CH_GOP_CONV_T) add_num(o, "output_padding", nd->out_pad);
        add_num(o, "out_channels", nd->conv.out_channels);
        add_num(o, "kernel", nd->conv.kernel);
        add_num(o, "stride", nd->conv.stride ? nd->conv.stride : 1);
        add_num(o, "padding", nd->conv.padding);
        add_num(o, "dilation", nd->conv.dilation ? nd->conv.dilation : 1);
        add_num(o, "groups", nd->conv.groups ? nd->conv.groups : 1);
        cJSON_AddBoolToObject(o, "bias", !nd->conv.no_bias);
        break;
    case CH_GOP_BATCHNORM2D:
        add_num(o, "eps", nd->bn.eps);
        add_num(o, "momentum", nd->bn.momentum);
        break;
    case CH_GOP_ACT:
        if (nd->act.kind == CH_ACT_GELU || nd->act.kind == CH_ACT_GELU_TANH) {
            cJSON_AddStringToObject(o, "approximate", nd->act.kind == CH_ACT_GELU ? "none" : "tanh");
            break;
        }
        if (nd->act.kind == CH_ACT_AFFINE) {
            add_num(o, "scale", nd->act.alpha);
            add_num(o, "shift", nd->act.beta);
            break;
        }
        add_num(o, "alpha", nd->act.alpha);
        /* JSON has no infinity: an open bound is left out. */
        if (isfinite(nd->act.lo)) add_num(o, "min", nd->act.lo);
        if (isfinite(nd->act.hi)) add_num(o, "max", nd->act.hi);
        break;
    case CH_GOP_MAX_POOL2D:
    case CH_GOP_AVG_POOL2D:
        add_num(o, "kernel", nd->pool.kernel);
        add_num(o, "stride", nd->pool.stride ? nd->pool.stride : nd->pool.kernel);
        add_num(o, "padding", nd->pool.padding);
        cJSON_AddBoolToObject(o, "ceil_mode", nd->pool.ceil_mode);
        cJSON_AddBoolToObject(o, "exclude_pad", nd->pool.exclude_pad);
        break;
    case CH_GOP_MEAN_HW: cJSON_AddBoolToObject(o, "keepdim", nd->keepdim); break;
    case CH_GOP_SHUFFLE: add_num(o, "groups", nd->groups); break;
    case CH_GOP_LAYERNORM:
        add_num(o, "axis", nd->ln_axis);
        add_num(o, "eps", nd->bn.eps);
        break;
    case CH_GOP_SLICE:
        add_num(o, "start", nd->slice[0]);
        add_num(o, "count", nd->slice[1]);
        break;
    case CH_GOP_BILINEAR:
        add_num(o, "height", nd->scale[0]);
        add_num(o, "width", nd->scale[1]);
        cJSON_AddBoolToObject(o, "align_corners", nd->align);
        break;
    case CH_GOP_UPSAMPLE:
        add_num(o, "scale_h", nd->scale[0]);
        add_num(o, "scale_w", nd->scale[1]);
        break;
    case CH_GOP_LINEAR:
        add_num(o, "features", nd->features);
        cJSON_AddBoolToObject(o, "bias", nd->bias);
        break;
    case CH_GOP_DROPOUT: add_num(o, "p", nd->p); break;
    case CH_GOP_VIEW: cJSON_AddItemToObject(o, "shape", cJSON_CreateIntArray(nd->view, 3)); break;
    case CH_GOP_PERMUTE: {
        const int perm[4] = { 0, nd->view[0] + 1, nd->view[1] + 1, nd->view[2] + 1 };
        cJSON_AddItemToObject(o, "perm", cJSON_CreateIntArray(perm, 4));
        break;
    }
    default: break;
    }
}

/* A reused node names the node whose operation and parameters it takes; its arguments are that
 * node's (written too, for a reader's eyes). */
static void put_tie(cJSON *o, const ch_graph *g, const ch_gnode *nd)
{
    if (nd->tied) cJSON_AddStringToObject(o, "reuses", g->nodes[nd->tied - 1].name);
}

char *ch_graph_to_json(const ch_graph *g)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    add_num(j, "format_version", FORMAT);
    cJSON_AddStringToObject(j, "name", g->name);
    cJSON *in = cJSON_AddObjectToObject(j, "input");
    cJSON_AddStringToObject(in, "name", g->input_name);
    add_num(in, "id", g->input);
    const ch_gtensor *x = &g->tensors[g->input];
    cJSON_AddItemToObject(in, "shape", cJSON_CreateIntArray(x->dims, 3));
    cJSON *nodes = cJSON_AddArrayToObject(j, "nodes");
    for (int i = 0; i < g->nnodes; i++) {
        const ch_gnode *nd = &g->nodes[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(nodes, o);
        cJSON_AddStringToObject(o, "name", nd->name);
        cJSON_AddStringToObject(o, "op", ch_gnode_op_name(nd));
        cJSON_AddItemToObject(o, "in", cJSON_CreateIntArray(nd->in, nd->nin));
        add_num(o, "out", nd->out);
        put_args(o, nd);
        put_tie(o, g, nd);
    }
    add_num(j, "output", g->output);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    return text;
}

uint64_t ch_graph_text_fingerprint(const char *json)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *c = (const unsigned char *)json; *c; c++) h = (h ^ *c) * 0x100000001b3ull;
    return h;
}

ch_status ch_graph_fingerprint(const ch_graph *g, uint64_t *out, ch_err *err)
{
    char *text = ch_graph_to_json(g);
    CH_CHECK_ALLOC(err, text);
    *out = ch_graph_text_fingerprint(text);
    free(text);
    return CH_STATUS_OK;
}

/* ---- reading ---- */

typedef struct reader {
    const char *path;
    const cJSON *node;
    int index;
    ch_err *err;
} reader;

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static ch_status num(reader *r, const char *k, double lo, double hi, double def, double *out)
{
    const cJSON *v = get(r->node, k);
    if (!v) return (*out = def, CH_STATUS_OK);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: '%s' is not a number in %g..%g", r->path, r->index,
                       k, lo, hi);
    *out = v->valuedouble;
    return CH_STATUS_OK;
}

/* Key k, an argument of range a (graph.h's table, the builder's). */
static ch_status arg(reader *r, const char *k, ch_garg a, double def, double *out)
{
    const ch_garg_range g = ch_garg_range_of(a);
    return num(r, k, g.lo, g.hi, def, out);
}

static ch_status whole(reader *r, const char *k, ch_garg a, int def, int *out)
{
    double d = 0;
    CH_TRY(arg(r, k, a, def, &d));
    if (d != floor(d))
        return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: '%s' is not a whole number", r->path, r->index, k);
    *out = (int)d;
    return CH_STATUS_OK;
}

static ch_status flag(reader *r, const char *k, bool *out)
{
    const cJSON *v = get(r->node, k);
    if (!v) return (*out = false, CH_STATUS_OK);
    if (!cJSON_IsBool(v)) return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: '%s' is not true or false",
                                         r->path, r->index, k);
    *out = cJSON_IsTrue(v);
    return CH_STATUS_OK;
}

/* GELU's "approximate": "none" (the default, as PyTorch's) or "tanh". */
static ch_status gelu_approximate(reader *r, bool *tanh_form)
{
    const cJSON *v = get(r->node, "approximate");
    *tanh_form = false;
    if (!v) return CH_STATUS_OK;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "none") == 0) return CH_STATUS_OK;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "tanh") == 0) return (*tanh_form = true, CH_STATUS_OK);
    return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: 'approximate' is not \"none\" or \"tanh\"", r->path,
                   r->index);
}

/* Three whole numbers 1..2^20 under key k (a view's shape). */
static ch_status shape3(reader *r, const char *k, int out[3])
{
    const cJSON *v = get(r->node, k);
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 3)
        return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: '%s' is not a list of 3 numbers", r->path, r->index, k);
    for (int i = 0; i < 3; i++) {
        const cJSON *d = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(d) || !(d->valuedouble >= 1 && d->valuedouble <= (1 << 20)) ||
            d->valuedouble != floor(d->valuedouble))
            return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: '%s' dimension %d is not a whole number 1..2^20",
                           r->path, r->index, k, i);
        out[i] = (int)d->valuedouble;
    }
    return CH_STATUS_OK;
}

/* 'perm' of a permute node: 4 whole numbers as x.permute takes them (the builder checks the order). */
static ch_status perm4(reader *r, int out[4])
{
    const cJSON *v = get(r->node, "perm");
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 4)
        return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: 'perm' is not a list of 4 numbers", r->path, r->index);
    for (int i = 0; i < 4; i++) {
        const cJSON *d = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(d) || !(d->valuedouble >= 0 && d->valuedouble <= 3) || d->valuedouble != floor(d->valuedouble))
            return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: 'perm' entry %d is not 0, 1, 2 or 3", r->path,
                           r->index, i);
        out[i] = (int)d->valuedouble;
    }
    return CH_STATUS_OK;
}

/* Replay one node's builder call; *t receives the new tensor (or -1 with the graph's error). */
static ch_status replay(reader *r, ch_graph *g, const char *op, const char *name, const int *in, int nin, int *t)
{
    const int x = in[0];
    bool b = false;
    int k = 0, s = 0, p = 0, d = 0, gr = 0, f = 0;
    double a = 0, lo = 0, hi = 0;
    const cJSON *reuses = get(r->node, "reuses");
    if (reuses) {
        if (!cJSON_IsString(reuses) || nin != 1)
            return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: 'reuses' must name a node, with one input", r->path,
                           r->index);
        *t = ch_graph_reuse(g, name, reuses->valuestring, x);
        if (*t >= 0 && strcmp(ch_gnode_op_name(&g->nodes[g->nnodes - 1]), op) != 0)
            return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: op '%.40s' reuses a %s node", r->path, r->index, op,
                           ch_gnode_op_name(&g->nodes[g->nnodes - 1]));
        return CH_STATUS_OK;
    }
    if (strcmp(op, "conv2d") == 0 || strcmp(op, "conv_transpose2d") == 0) {
        int op_pad = 0;
        if (op[4] == '_') CH_TRY(whole(r, "output_padding", CH_GARG_PADDING, 0, &op_pad));
        CH_TRY(whole(r, "out_channels", CH_GARG_CHANNELS, 0, &f));
        CH_TRY(whole(r, "kernel", CH_GARG_KERNEL, 0, &k));
        CH_TRY(whole(r, "stride", CH_GARG_STRIDE, 1, &s));
        CH_TRY(whole(r, "padding", CH_GARG_PADDING, 0, &p));
        CH_TRY(whole(r, "dilation", CH_GARG_DILATION, 1, &d));
        CH_TRY(whole(r, "groups", CH_GARG_CHANNELS, 1, &gr));
        CH_TRY(flag(r, "bias", &b));
        const ch_conv2d_args ca = { .out_channels = f, .kernel = k, .stride = s, .padding = p, .dilation = d,
                                    .groups = gr, .no_bias = !b };
        *t = op[4] == '_' ? ch_graph_conv_transpose2d(g, name, x, &ca, op_pad) : ch_graph_conv2d(g, name, x, &ca);
    } else if (strcmp(op, "batchnorm2d") == 0) {
        CH_TRY(arg(r, "eps", CH_GARG_BN_EPS, 1e-5, &a));
        CH_TRY(arg(r, "momentum", CH_GARG_BN_MOMENTUM, 0.1, &lo));
        *t = ch_graph_batchnorm2d(g, name, x, &(ch_batchnorm_args){ .eps = a, .momentum = lo });
    } else if (strcmp(op, "layer_norm") == 0) {
        CH_TRY(whole(r, "axis", CH_GARG_LN_AXIS, 0, &k));
        CH_TRY(arg(r, "eps", CH_GARG_BN_EPS, 1e-5, &a));
        *t = ch_graph_layer_norm(g, name, x, k, a);
    } else if (strcmp(op, "relu") == 0) {
        *t = ch_graph_relu(g, name, x);
    } else if (strcmp(op, "leaky_relu") == 0) {
        CH_TRY(arg(r, "alpha", CH_GARG_LEAKY_ALPHA, 0.01, &a));
        *t = ch_graph_leaky_relu(g, name, x, a);
    } else if (strcmp(op, "clip") == 0) {
        CH_TRY(arg(r, "min", CH_GARG_CLIP_BOUND, -INFINITY, &lo));
        CH_TRY(arg(r, "max", CH_GARG_CLIP_BOUND, INFINITY, &hi));
        *t = ch_graph_clip(g, name, x, lo, hi);
    } else if (strcmp(op, "sigmoid") == 0) {
        *t = ch_graph_sigmoid(g, name, x);
    } else if (strcmp(op, "tanh") == 0) {
        *t = ch_graph_tanh(g, name, x);
    } else if (strcmp(op, "hardsigmoid") == 0) {
        *t = ch_graph_hardsigmoid(g, name, x);
    } else if (strcmp(op, "hardswish") == 0) {
        *t = ch_graph_hardswish(g, name, x);
    } else if (strcmp(op, "erf") == 0) {
        *t = ch_graph_erf(g, name, x);
    } else if (strcmp(op, "gelu") == 0) {
        bool tanh_form = false;
        CH_TRY(gelu_approximate(r, &tanh_form));
        *t = ch_graph_gelu(g, name, x, tanh_form);
    } else if (strcmp(op, "affine") == 0) {
        CH_TRY(arg(r, "scale", CH_GARG_AFFINE, 1, &a));
        CH_TRY(arg(r, "shift", CH_GARG_AFFINE, 0, &lo));
        *t = ch_graph_affine(g, name, x, a, lo);
    } else if (strcmp(op, "max_pool2d") == 0 || strcmp(op, "avg_pool2d") == 0) {
        bool ceil = false;
        CH_TRY(whole(r, "kernel", CH_GARG_KERNEL, 0, &k));
        CH_TRY(whole(r, "stride", CH_GARG_STRIDE, k, &s));
        CH_TRY(whole(r, "padding", CH_GARG_PADDING, 0, &p));
        CH_TRY(flag(r, "ceil_mode", &ceil));
        CH_TRY(flag(r, "exclude_pad", &b));
        const ch_pool2d_args pa = { .kernel = k, .stride = s, .padding = p, .ceil_mode = ceil, .exclude_pad = b };
        *t = op[0] == 'm' ? ch_graph_max_pool2d(g, name, x, &pa) : ch_graph_avg_pool2d(g, name, x, &pa);
    } else if (strcmp(op, "global_avg_pool") == 0) {
        *t = ch_graph_global_avg_pool(g, name, x);
    } else if (strcmp(op, "mean") == 0) {
        CH_TRY(flag(r, "keepdim", &b));
        *t = ch_graph_mean_hw(g, name, x, b);
    } else if (strcmp(op, "flatten") == 0) {
        *t = ch_graph_flatten(g, name, x);
    } else if (strcmp(op, "upsample_nearest") == 0) {
        int sh = 0, sw = 0;
        CH_TRY(whole(r, "scale_h", CH_GARG_SCALE, 0, &sh));
        CH_TRY(whole(r, "scale_w", CH_GARG_SCALE, 0, &sw));
        *t = ch_graph_upsample_nearest(g, name, x, sh, sw);
    } else if (strcmp(op, "upsample_bilinear") == 0) {
        CH_TRY(whole(r, "height", CH_GARG_SIDE, 0, &k));
        CH_TRY(whole(r, "width", CH_GARG_SIDE, 0, &s));
        CH_TRY(flag(r, "align_corners", &b));
        *t = ch_graph_upsample_bilinear(g, name, x, k, s, b);
    } else if (strcmp(op, "channel_shuffle") == 0) {
        CH_TRY(whole(r, "groups", CH_GARG_CHANNELS, 0, &f));
        *t = ch_graph_channel_shuffle(g, name, x, f);
    } else if (strcmp(op, "permute") == 0) {
        int perm[4];
        CH_TRY(perm4(r, perm));
        *t = ch_graph_permute(g, name, x, perm);
    } else if (strcmp(op, "channel_slice") == 0) {
        CH_TRY(whole(r, "start", CH_GARG_PADDING, 0, &p));
        CH_TRY(whole(r, "count", CH_GARG_CHANNELS, 0, &f));
        *t = ch_graph_channel_slice(g, name, x, p, f);
    } else if (strcmp(op, "view") == 0) {
        int v[3];
        CH_TRY(shape3(r, "shape", v));
        *t = ch_graph_view(g, name, x, v[0], v[1], v[2]);
    } else if (strcmp(op, "linear") == 0) {
        CH_TRY(whole(r, "features", CH_GARG_FEATURES, 0, &f));
        CH_TRY(flag(r, "bias", &b));
        *t = ch_graph_linear(g, name, x, f, b);
    } else if (strcmp(op, "dropout") == 0) {
        CH_TRY(arg(r, "p", CH_GARG_DROPOUT_P, 0.5, &a));
        *t = ch_graph_dropout(g, name, x, a);
    } else if ((strcmp(op, "add") == 0 || strcmp(op, "mul") == 0) && nin == 2) {
        *t = op[0] == 'a' ? ch_graph_add(g, name, in[0], in[1]) : ch_graph_mul(g, name, in[0], in[1]);
    } else if (strcmp(op, "concat") == 0) {
        *t = ch_graph_concat(g, name, in, nin);
    } else {
        return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: unknown op '%.40s' (or a wrong number of inputs)",
                       r->path, r->index, op);
    }
    if (*t < 0) {
        ch_err e;
        ch_graph_status(g, &e);
        return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: %s", r->path, e.msg);
    }
    return CH_STATUS_OK;
}

/* Node i's input ids, each one an earlier tensor of the file (map: file id -> graph id). */
static ch_status inputs(reader *r, const int *map, int nmap, int **out, int *nin)
{
    const cJSON *in = get(r->node, "in");
    const int n = cJSON_IsArray(in) ? cJSON_GetArraySize(in) : 0;
    if (n < 1 || n > 4096)
        return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: 'in' is not a list of 1 to 4096 tensor ids", r->path,
                       r->index);
    int *ids = malloc(sizeof(int) * (size_t)n);
    CH_CHECK_ALLOC(r->err, ids);
    for (int i = 0; i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(in, i);
        const double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (!(d >= 0 && d < nmap && d == floor(d)) || map[(int)d] < 0) {
            free(ids);
            return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d reads tensor %g, which no earlier entry makes",
                           r->path, r->index, d);
        }
        ids[i] = map[(int)d];
    }
    *out = ids;
    *nin = n;
    return CH_STATUS_OK;
}

static ch_status read_nodes(reader *r, const cJSON *j, ch_graph *g, int *map, int nmap)
{
    const cJSON *nodes = get(j, "nodes");
    if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) > MAX_NODES)
        return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: 'nodes' is not a list of at most %d", r->path, MAX_NODES);
    r->index = 0;
    for (const cJSON *nd = nodes->child; nd; nd = nd->next, r->index++) {
        r->node = nd;
        const cJSON *name = get(nd, "name"), *op = get(nd, "op");
        double out = -1;
        if (!cJSON_IsString(name) || !cJSON_IsString(op))
            return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d has no name or op", r->path, r->index);
        CH_TRY(num(r, "out", 0, nmap - 1, -1, &out));
        if (out != floor(out) || out < 0 || map[(int)out] >= 0)
            return ch_fail(r->err, CH_STATUS_BAD_INPUT, "%s: node %d: 'out' is no new tensor id", r->path, r->index);
        int *in = NULL, nin = 0, t = -1;
        CH_TRY(inputs(r, map, nmap, &in, &nin));
        const ch_status st = replay(r, g, op->valuestring, name->valuestring, in, nin, &t);
        free(in);
        CH_TRY(st);
        map[(int)out] = t;
    }
    return CH_STATUS_OK;
}

static ch_status read_graph(const cJSON *j, const char *path, ch_graph *g, ch_err *err)
{
    reader r = { .path = path, .err = err, .index = -1 };
    const cJSON *in = get(j, "input"), *shape = get(in, "shape"), *iname = get(in, "name");
    const cJSON *nodes = get(j, "nodes");
    /* First, since the ids' ranges below follow from it (a 'nodes' that is no list once made
     * the message blame 'output'). */
    if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) > MAX_NODES)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: 'nodes' is not a list of at most %d", path, MAX_NODES);
    const int nmap = cJSON_GetArraySize(nodes) + 1;
    uint64_t id = 0, out = 0;
    int dims[3] = { 0, 0, 0 };
    if (!cJSON_IsString(iname) || !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) != 3)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no input name and shape", path);
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetArrayItem(shape, i);
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 && v->valuedouble <= 65536) || v->valuedouble != floor(v->valuedouble))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: input dimension %d is not a whole number 1..65536", path, i);
        dims[i] = (int)v->valuedouble;
    }
    CH_TRY(ch_json_whole(path, in, "id", 0, nmap - 1, &id, err));
    CH_TRY(ch_json_whole(path, j, "output", 0, nmap - 1, &out, err));
    int *map = malloc(sizeof(int) * (size_t)nmap);
    CH_CHECK_ALLOC(err, map);
    for (int i = 0; i < nmap; i++) map[i] = -1;
    map[id] = ch_graph_input(g, iname->valuestring, dims[0], dims[1], dims[2]);
    ch_status st = CH_STATUS_OK;
    if (map[id] < 0) {
        ch_err e;
        ch_graph_status(g, &e);
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %s", path, e.msg);
    }
    if (st == CH_STATUS_OK) st = read_nodes(&r, j, g, map, nmap);
    if (st == CH_STATUS_OK && (map[out] < 0 || ch_graph_output(g, map[out]) != CH_STATUS_OK)) {
        ch_err e = { .msg = "the output is no tensor of the graph" };
        ch_graph_status(g, &e);
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %s", path, e.msg);
    }
    free(map);
    return st;
}

ch_status ch_graph_from_json(const char *text, size_t len, const char *path, ch_graph **out, ch_err *err)
{
    *out = NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: not JSON", path);
    const char *dup = ch_json_duplicate_key(j);
    const cJSON *name = get(j, "name"), *fv = get(j, "format_version");
    ch_status st = CH_STATUS_OK;
    if (dup) st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: key '%.60s' appears twice", path, dup);
    else if (!cJSON_IsNumber(fv) || fv->valuedouble != FORMAT)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: format_version is not %d", path, FORMAT);
    else if (!cJSON_IsString(name)) st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no graph name", path);
    ch_graph *g = NULL;
    if (st == CH_STATUS_OK) st = ch_graph_create(name->valuestring, &g, err);
    if (st == CH_STATUS_OK) st = read_graph(j, path, g, err);
    cJSON_Delete(j);
    if (st != CH_STATUS_OK) {
        ch_graph_free(g);
        return st;
    }
    *out = g;
    return CH_STATUS_OK;
}
