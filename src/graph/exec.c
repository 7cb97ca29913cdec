/* A compiled graph: one layer whose children are the nodes' layers, run in node order forward and
 * in reverse backward.
 * Activations: each node's layer owns its output, as in a Sequential (backward reads them).
 * Gradients: a tensor's gradient lives from the backward of its last consumer, which writes it,
 * to the backward of its producer, which reads it as dy. The plan walks backward once, before any
 * step, and gives every gradient a block of the run's scratch stack for that span, reusing blocks
 * whose tensors are done; a tensor read by several nodes gets the first writer's values in place
 * and every later one's through a temporary block, added on. The graph's input gets dx (the
 * caller's) or nothing.
 * Fusion: a ReLU that is the only reader of a convolution's output is done by the convolution
 * (absorb_relu, as in a Sequential); the ReLU node then runs neither pass, its output is the
 * convolution's, and so is its gradient block. */
#include "graph/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trace.h"

typedef struct xnode {
    ch_layer *l;          /* borrowed: a child of the graph layer */
    int nin, *in, out;    /* tensor ids (in borrowed from the description's copy below) */
    size_t *dx_off;       /* per input: where backward writes its gradient (scratch offset) */
    bool *dx_add;         /* per input: into a temporary, added to the tensor's gradient after */
} xnode;

typedef struct graph_impl {
    int nnodes, ntensors, input, output;
    xnode *nodes;
    int *ins;             /* all nodes' inputs, one array */
    int *alias;           /* tensor -> the tensor whose values and gradient it shares (itself) */
    int *producer;        /* tensor -> the node that makes it (-1: the input) */
    ch_shape3 *shape;
    size_t *grad_off;     /* tensor -> its gradient's scratch offset (planned) */
    const ch_real **act;  /* tensor -> its values in the current forward */
    ch_real **dxs;        /* scratch for one node's input gradients */
    const ch_real **xs;   /* one node's inputs */
    int maxin;
} graph_impl;

static const ch_layer_ops graph_ops;

static size_t tsize(const graph_impl *gi, int t) { return ch_shape3_size(gi->shape[t]); }

/* ---- the gradient blocks: first fit over blocks freed so far ---- */

typedef struct blocks {
    size_t *off, *len;
    bool *busy;
    int n, cap;
    size_t top;           /* the arena's size so far */
} blocks;

static ch_status block_take(blocks *b, size_t len, size_t *off, ch_err *err)
{
    int best = -1;
    for (int i = 0; i < b->n; i++)
        if (!b->busy[i] && b->len[i] >= len && (best < 0 || b->len[i] < b->len[best])) best = i;
    if (best < 0) {
        if (b->n == b->cap) {
            const int cap = b->cap ? 2 * b->cap : 16;
            size_t *o = realloc(b->off, sizeof *o * (size_t)cap);
            if (o) b->off = o;
            size_t *l = realloc(b->len, sizeof *l * (size_t)cap);
            if (l) b->len = l;
            bool *u = realloc(b->busy, sizeof *u * (size_t)cap);
            if (u) b->busy = u;
            if (!o || !l || !u) return CH_SYS_FAIL(err, "realloc of gradient blocks");
            b->cap = cap;
        }
        best = b->n++;
        b->off[best] = b->top;
        b->len[best] = len;
        b->top += len;
    }
    b->busy[best] = true;
    *off = b->off[best];
    return CH_STATUS_OK;
}

static void block_give(blocks *b, size_t off)
{
    for (int i = 0; i < b->n; i++)
        if (b->off[i] == off) b->busy[i] = false;
}

/* The backward plan: walk the nodes in reverse; a node's output gradient is released after it,
 * its inputs' gradients are taken when first written. held[t]: t's gradient has a block. */
static ch_status plan_backward(ch_layer *l, int max_batch, ch_err *err)
{
    graph_impl *gi = l->impl;
    blocks b = { 0 };
    bool *held = calloc((size_t)gi->ntensors, sizeof *held);
    CH_CHECK_ALLOC(err, held);
    ch_status st = CH_STATUS_OK;
    for (int i = gi->nnodes - 1; i >= 0 && st == CH_STATUS_OK; i--) {
        xnode *x = &gi->nodes[i];
        if (x->l->absorbed) continue;
        for (int j = 0; j < x->nin && st == CH_STATUS_OK; j++) {
            const int t = gi->alias[x->in[j]];
            x->dx_add[j] = held[t];
            if (held[t]) {
                /* Written already by a later node: a temporary, added on after this node. */
                st = block_take(&b, tsize(gi, t) * (size_t)max_batch, &x->dx_off[j], err);
            } else if (t != gi->input) {
                /* The input's first gradient goes straight to the caller's dx. */
                st = block_take(&b, tsize(gi, t) * (size_t)max_batch, &gi->grad_off[t], err);
                x->dx_off[j] = gi->grad_off[t];
            }
            held[t] = true;
        }
        /* This node's temporaries, then its output's gradient (the caller's for the output), are
         * free once it has run; its temporaries were all taken at once, so none share a block. */
        for (int j = 0; j < x->nin; j++)
            if (x->dx_add[j]) block_give(&b, x->dx_off[j]);
        const int out = gi->alias[x->out];
        if (out != gi->output) block_give(&b, gi->grad_off[out]);
    }
    l->scratch_own = b.top;
    free(b.off);
    free(b.len);
    free(b.busy);
    free(held);
    return st;
}

/* ---- compile ---- */

/* Reject nodes whose output nothing reads (their gradients would never be written). */
static ch_status check_reachable(const ch_graph *g, ch_err *err)
{
    if (g->input < 0) return ch_fail(err, CH_STATUS_BAD_INPUT, "graph %s: no input", g->name);
    if (g->output < 0) return ch_fail(err, CH_STATUS_BAD_INPUT, "graph %s: no output marked", g->name);
    int *readers = calloc((size_t)g->ntensors, sizeof *readers);
    CH_CHECK_ALLOC(err, readers);
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i].nin; j++) readers[g->nodes[i].in[j]]++;
    ch_status st = CH_STATUS_OK;
    if (readers[g->input] == 0)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "graph %s: no node reads the input '%s'", g->name, g->input_name);
    for (int i = 0; i < g->nnodes && st == CH_STATUS_OK; i++)
        if (readers[g->nodes[i].out] == 0 && g->nodes[i].out != g->output)
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "graph %s: the output of node '%s' (%s) is never used "
                         "(every node must lead to the output)", g->name, g->nodes[i].name,
                         ch_gop_name(g->nodes[i].op));
    free(readers);
    return st;
}

static ch_status impl_alloc(graph_impl *gi, const ch_graph *g, ch_err *err)
{
    size_t total = 0;
    int maxin = 1;
    for (int i = 0; i < g->nnodes; i++) {
        total += (size_t)g->nodes[i].nin;
        if (g->nodes[i].nin > maxin) maxin = g->nodes[i].nin;
    }
    gi->nnodes = g->nnodes;
    gi->ntensors = g->ntensors;
    gi->input = g->input;
    gi->output = g->output;
    gi->maxin = maxin;
    gi->nodes = calloc((size_t)g->nnodes, sizeof *gi->nodes);
    gi->ins = malloc(sizeof *gi->ins * total);
    gi->alias = malloc(sizeof *gi->alias * (size_t)g->ntensors);
    gi->producer = malloc(sizeof *gi->producer * (size_t)g->ntensors);
    gi->shape = malloc(sizeof *gi->shape * (size_t)g->ntensors);
    gi->grad_off = calloc((size_t)g->ntensors, sizeof *gi->grad_off);
    gi->act = calloc((size_t)g->ntensors, sizeof *gi->act);
    gi->dxs = calloc((size_t)maxin, sizeof *gi->dxs);
    gi->xs = calloc((size_t)maxin, sizeof *gi->xs);
    size_t *dx_off = calloc(total ? total : 1, sizeof *dx_off);
    bool *dx_add = calloc(total ? total : 1, sizeof *dx_add);
    if (!gi->nodes || !gi->ins || !gi->alias || !gi->producer || !gi->shape || !gi->grad_off || !gi->act || !gi->dxs ||
        !gi->xs || !dx_off || !dx_add) {
        free(dx_off);
        free(dx_add);
        return CH_SYS_FAIL(err, "allocation of a compiled graph");
    }
    size_t at = 0;
    for (int i = 0; i < g->nnodes; i++) {
        xnode *x = &gi->nodes[i];
        x->nin = g->nodes[i].nin;
        x->in = gi->ins + at;
        x->dx_off = dx_off + at;
        x->dx_add = dx_add + at;
        memcpy(x->in, g->nodes[i].in, sizeof(int) * (size_t)x->nin);
        x->out = g->nodes[i].out;
        at += (size_t)x->nin;
    }
    for (int t = 0; t < g->ntensors; t++) {
        gi->alias[t] = t;
        gi->producer[t] = g->tensors[t].producer;
        gi->shape[t] = ch_graph_shape(g, t);
    }
    return CH_STATUS_OK;
}

static void graph_free_impl(ch_layer *l)
{
    graph_impl *gi = l->impl;
    if (!gi) return;
    if (gi->nodes && gi->nnodes > 0) {
        free(gi->nodes[0].dx_off);
        free(gi->nodes[0].dx_add);
    }
    free(gi->nodes);
    free(gi->ins);
    free(gi->alias);
    free(gi->producer);
    free(gi->shape);
    free(gi->grad_off);
    free(gi->act);
    free(gi->dxs);
    free(gi->xs);
}

ch_status ch_graph_compile(const ch_graph *g, ch_layer **out, ch_err *err)
{
    CH_TRY(ch_graph_status(g, err));
    CH_TRY(check_reachable(g, err));
    const ch_shape3 in = ch_graph_shape(g, g->input), o = ch_graph_shape(g, g->output);
    ch_layer *l = ch_layer_alloc(&graph_ops, "", in, o);
    CH_CHECK_ALLOC(err, l);
    graph_impl *gi = calloc(1, sizeof *gi);
    l->impl = gi;
    ch_status st = gi ? impl_alloc(gi, g, err) : CH_SYS_FAIL(err, "calloc of a compiled graph");
    for (int i = 0; i < g->nnodes && st == CH_STATUS_OK; i++) {
        ch_layer *c = NULL;
        st = ch_graph_node_layer(g, i, &c, err);
        if (st == CH_STATUS_OK) st = ch_layer_add_child(l, c, err);
        if (st == CH_STATUS_OK) gi->nodes[i].l = c;
    }
    if (st != CH_STATUS_OK) {
        ch_layer_free(l);
        return st;
    }
    *out = l;
    return CH_STATUS_OK;
}

/* ---- plan, forward, backward ---- */

/* Readers of each tensor (by alias), counted into cnt (ntensors). */
static void count_readers(const graph_impl *gi, int *cnt)
{
    for (int i = 0; i < gi->nnodes; i++)
        for (int j = 0; j < gi->nodes[i].nin; j++) cnt[gi->nodes[i].in[j]]++;
}

/* The convolution + ReLU fusion (see the top of the file). */
static ch_status fuse_relus(graph_impl *gi, ch_err *err)
{
    int *cnt = calloc((size_t)gi->ntensors, sizeof *cnt);
    CH_CHECK_ALLOC(err, cnt);
    count_readers(gi, cnt);
    for (int i = 0; i < gi->nnodes; i++) {
        xnode *r = &gi->nodes[i];
        if (!ch_layer_is_relu(r->l)) continue;
        const int t = r->in[0];
        if (t == gi->input || cnt[t] != 1 || t == gi->output) continue;
        xnode *p = &gi->nodes[gi->producer[t]];
        if (!p->l->y_owned || !p->l->ops->absorb_relu || !p->l->ops->absorb_relu(p->l)) continue;
        ch_layer_borrow_output(r->l, p->l->y);
        r->l->absorbed = true;   /* a ReLU the convolution before it does */
        gi->alias[r->out] = gi->alias[t];
    }
    free(cnt);
    return CH_STATUS_OK;
}

static ch_status graph_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    graph_impl *gi = l->impl;
    CH_TRY(fuse_relus(gi, err));
    gi->output = gi->alias[gi->output];
    CH_TRY(plan_backward(l, pl->max_batch, err));
    l->y = gi->nodes[gi->producer[gi->output]].l->y;
    l->y_owned = false;
    return CH_STATUS_OK;
}

static void graph_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    graph_impl *gi = l->impl;
    gi->act[gi->input] = x;
    const ch_run above = ch_run_above(r, l);
    for (int i = 0; i < gi->nnodes; i++) {
        xnode *nd = &gi->nodes[i];
        if (!nd->l->absorbed) {
            if (nd->l->ops->forward_multi) {
                for (int j = 0; j < nd->nin; j++) gi->xs[j] = gi->act[nd->in[j]];
                nd->l->ops->forward_multi(nd->l, &above, n, gi->xs);
            } else {
                nd->l->ops->forward(nd->l, &above, n, gi->act[nd->in[0]]);
            }
        }
        gi->act[nd->out] = nd->l->y;
    }
}

static void trace_node(const ch_run *r, const ch_layer *c, int64_t t0)
{
    if (!r->trace) return;
    char name[56];
    snprintf(name, sizeof name, "%.40s %s", c->name, c->ops->kind);
    ch_trace_span(r->trace, "backward", name, t0, -1);
}

static void graph_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                           ch_real *dx)
{
    (void)x;
    graph_impl *gi = l->impl;
    ch_real *base = r->scratch;
    const ch_run above = ch_run_above(r, l);
    for (int i = gi->nnodes - 1; i >= 0; i--) {
        xnode *nd = &gi->nodes[i];
        if (nd->l->absorbed) continue;
        const int out = gi->alias[nd->out];
        /* dy of the output is the caller's; the layers may write over dy (overwrites_dy). */
        const ch_real *g = out == gi->output ? dy : base + gi->grad_off[out];
        for (int j = 0; j < nd->nin; j++) {
            const int t = gi->alias[nd->in[j]];
            const bool to_input = t == gi->input;
            if (to_input && !dx) gi->dxs[j] = NULL;
            else if (to_input && !nd->dx_add[j]) gi->dxs[j] = dx;
            else gi->dxs[j] = base + nd->dx_off[j];
            gi->xs[j] = gi->act[nd->in[j]];
        }
        const int64_t t0 = r->trace ? ch_trace_now() : 0;
        if (nd->l->ops->backward_multi)
            nd->l->ops->backward_multi(nd->l, &above, n, gi->xs, g, gi->dxs);
        else
            nd->l->ops->backward(nd->l, &above, n, gi->xs[0], g, gi->dxs[0]);
        trace_node(r, nd->l, t0);
        for (int j = 0; j < nd->nin; j++) {
            if (!gi->dxs[j] || !nd->dx_add[j]) continue;
            const int t = gi->alias[nd->in[j]];
            ch_real *acc = t == gi->input ? dx : base + gi->grad_off[t];
            r->k->add(&r->kc, tsize(gi, t) * (size_t)n, acc, gi->dxs[j], acc);
        }
    }
}

static const ch_layer_ops graph_ops = {
    .kind = "Graph", .plan = graph_plan, .forward = graph_forward, .backward = graph_backward,
    .free_impl = graph_free_impl, .overwrites_dy = true,
};
