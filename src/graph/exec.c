/* A compiled graph: one layer whose children are the nodes' layers, run in node order forward and
 * in reverse backward. docs/ARCHITECTURE.md (memory rules) gives each pass below its reasons and
 * figures.
 * Activations: each node's layer owns its output (backward reads them), except where a pass at
 * plan time finds it need not:
 *  - a ReLU that is the only reader of a convolution's output is done by the convolution
 *    (absorb_relu, fuse_relus); the ReLU node then runs neither pass;
 *  - a ReLU, or a sum of two same-shaped tensors, writes over an input that nothing else reads when
 *    that input's maker does not read its own output in backward (run_in_place): a residual
 *    block's bn2, sum and last ReLU share one buffer;
 *  - such a ReLU after a BatchNorm is done by the BatchNorm's passes where the backend has the
 *    fused kernels (bn_relu_*, fuse_bn_relu_forward): forward and remake clamp as they normalise,
 *    and backward masks dy by the pre-ReLU value recomputed from the input, only where that mask
 *    is the ReLU's own (bn_relu_backward_exact); the bits are those of the two apart;
 *  - such a sum over a BatchNorm's output does the BatchNorm's normalising pass, adding the other
 *    operand and clamping for an in-place ReLU over the sum (bn_add_forward, fuse_bn_sums), at
 *    the sum's place: a downsampling block may make its shortcut in between, so the BatchNorm's
 *    input lives until the sum (last_forward_read); the bits are those of the three apart;
 *  - a BatchNorm output (or the in-place ReLU after it) read by one node only is not kept: forward
 *    writes it into a block of the scratch stack dead once its reader has run, and backward makes
 *    it again from the BatchNorm's input just before its reader's backward (plan_recompute);
 *  - with --precision bf16, an output that only a BatchNorm reads is kept in bf16: its maker
 *    writes it into a scratch block (or, where its kernel rounds as it writes, conv2d_out_bf16,
 *    the bf16 copy itself), the BatchNorm stores it rounded as it normalises, and its backward and
 *    remake read the copy (plan_halves); its gradient then takes a block, or where its maker is a
 *    convolution that reads its dy in bf16 (conv2d_dy_bf16: cohort's F(4x4, 3x3)), the
 *    BatchNorm's backward writes it rounded to bf16 over the copy and the convolution reads it
 *    there: no block, and half the bytes both ways;
 *  - with --precision bf16, a remade BatchNorm + ReLU output whose one reader is a convolution that
 *    takes bf16 input (cohort's F(4x4, 3x3)) is written and remade in bf16, and the convolution
 *    widens it as it packs (plan_bf16_inputs): half the bytes both ways.
 * Gradients: a tensor's gradient lives from the backward of its last consumer, which writes it,
 * to the backward of its producer, which reads it as dy. The plan walks backward once, before any
 * step, and gives every gradient a block of the run's scratch stack for that span; a tensor read
 * by several nodes gets the first writer's values in place and every later one's through a
 * temporary block, added on. A same-shaped sum's two operands' gradients are both its dy: the
 * first's takes its dy's block (takes_dy), the second's too where nothing writes that block before
 * both makers have read it (shares_dy, twin_holds), and the sum's backward copies nothing. The
 * graph's input gets dx (the caller's) or nothing. Forward's recomputed outputs take blocks of the
 * same stack, planned the same way over forward's order (forward and backward never run at once).
 * Blocks get their offsets after each walk (graph/blocks.h). The passes that decide, at plan time,
 * which layers fuse and where values live are exec_plan.c's; the state both files share is
 * exec_impl.h's. */
#include "graph/exec_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trace.h"
#include "graph/blocks.h"


static const ch_layer_ops graph_ops;


/* Does node x's backward leave its dy as it found it? Not where its input gradient may take its dy's
 * block (takes_dy), nor where it writes over dy (overwrites_dy), unless that is only for a ReLU it
 * could absorb and has not (a convolution: kernels.h, dy is an output only with d->relu). */
static bool keeps_dy(const xnode *x)
{
    const ch_layer *l = x->l;
    if (ch_layer_is_relu(l) || ch_layer_is_plain_add(l)) return false;
    return !l->ops->overwrites_dy || (l->ops->absorb_relu && !x->relu_fused);
}

/* May the second operand t of sum x, whose first took x's dy block, have its gradient there too?
 * Only where nothing writes the block before both makers have read it: the first operand has no
 * other reader, the second's others come before the first's maker, and the maker whose backward
 * runs first leaves its dy alone. */
static bool shares_dy(const graph_impl *gi, const xnode *x, int j, int t)
{
    const int t0 = gi->alias[x->in[0]];
    if (j != 1 || !ch_layer_is_plain_add(x->l) || t == gi->input || t == t0 || gi->readers[t0] != 1) return false;
    const int p0 = gi->producer[t0], p1 = gi->producer[t], self = (int)(x - gi->nodes);
    for (int i = 0; i < gi->nnodes; i++)
        if (i != self && !gi->nodes[i].l->absorbed)
            for (int k = 0; k < gi->nodes[i].nin; k++)
                if (gi->alias[gi->nodes[i].in[k]] == t && i >= p0) return false;
    return keeps_dy(&gi->nodes[p0 > p1 ? p0 : p1]);
}

/* Will sum node a's two operands both have their gradients in its dy's block (shares_dy)? Asked
 * before a's backward is planned, by the ReLU over it. */
static bool sum_shares(const graph_impl *gi, const xnode *a)
{
    return ch_layer_is_plain_add(a->l) && gi->alias[a->out] != gi->output && gi->alias[a->in[0]] != gi->input &&
           shares_dy(gi, a, 1, gi->alias[a->in[1]]);
}

/* Does node x write input j's gradient over its output's (dy), when that is a block of ours?
 * A ReLU may (dx may alias dy), and a same-shaped sum's first input's gradient is dy itself. Not a
 * ReLU over a sum whose operands will share that block: one block would then carry the gradient
 * through every block end and pin the stack (resnet18: 4 largest activations against 3). */
static bool takes_dy(const graph_impl *gi, const xnode *x, int j)
{
    const int out = gi->alias[x->out];
    if (j != 0 || out == gi->output || gi->grad_where[out] != GRAD_BLOCK) return false;
    if (ch_layer_is_plain_add(x->l)) return true;
    if (!ch_layer_is_relu(x->l)) return false;
    const int p = gi->producer[gi->alias[x->in[0]]];
    return p < 0 || !sum_shares(gi, &gi->nodes[p]);
}

/* Is tensor t's gradient block still another's (a sum's twin operand whose maker's backward has
 * not run yet, at node i of the backward walk)? Then that maker gives it back, not t's. */
static bool twin_holds(const graph_impl *gi, int t, int i)
{
    const int u = gi->grad_twin[t];
    return u >= 0 && gi->producer[u] < i;
}

/* Where the first gradient written for input j of node x goes; true when it takes x's dy block. */
static ch_status place_first_grad(graph_impl *gi, ch_blocks *b, xnode *x, int j, int max_batch,
                                  bool *took_dy, ch_err *err)
{
    const int t = gi->alias[x->in[j]];
    if (t == gi->input) return CH_STATUS_OK;   /* the caller's dx */
    if (ch_gx_grad_over_values(gi, x, t)) {
        gi->grad_where[t] = GRAD_OVER_VALUES;
        return CH_STATUS_OK;
    }
    const halved *h = ch_gx_halved_for(gi, (int)(x - gi->nodes));
    if (h && h->grad16) {   /* the BatchNorm writes it over its bf16 copy, its maker reads it there */
        gi->grad_where[t] = GRAD_BF16;
        return CH_STATUS_OK;
    }
    if (!*took_dy && takes_dy(gi, x, j)) {
        gi->grad_off[t] = gi->grad_off[gi->alias[x->out]];
        *took_dy = true;
        return CH_STATUS_OK;
    }
    if (*took_dy && shares_dy(gi, x, j, t)) {
        gi->grad_off[t] = gi->grad_off[gi->alias[x->out]];
        gi->grad_twin[t] = gi->alias[x->in[0]];
        gi->grad_twin[gi->alias[x->in[0]]] = t;
        return CH_STATUS_OK;
    }
    return ch_block_take(b, tsize(gi, t) * (size_t)max_batch, &gi->grad_off[t], err);
}

/* The placed blocks' offsets for the ids the backward walk stored (SIZE_MAX: a gradient with no
 * block). */
static void place_backward(graph_impl *gi, const ch_blocks *b)
{
    for (int t = 0; t < gi->ntensors; t++) {
        if (gi->grad_off[t] == SIZE_MAX) gi->grad_off[t] = 0;
        else ch_block_offset(b, &gi->grad_off[t]);
    }
    for (int i = 0; i < gi->nnodes; i++)
        for (int j = 0; j < gi->nodes[i].nin; j++)
            if (gi->nodes[i].dx_add[j]) ch_block_offset(b, &gi->nodes[i].dx_off[j]);
    for (int k = 0; k < gi->nrc; k++) ch_block_offset(b, &gi->rc[k].bwd_off);
}

/* The backward plan: walk the nodes in reverse; a node's output gradient is released after it,
 * its inputs' gradients are placed when first written. held[t]: t's gradient has a place. */
static ch_status plan_backward(ch_layer *l, int max_batch, ch_err *err)
{
    graph_impl *gi = l->impl;
    ch_blocks b = { 0 };
    bool *held = calloc((size_t)gi->ntensors, sizeof *held);
    CH_CHECK_ALLOC(err, held);
    for (int t = 0; t < gi->ntensors; t++)   /* no block yet, none shared, none over values */
        gi->grad_off[t] = SIZE_MAX, gi->grad_twin[t] = -1, gi->grad_where[t] = GRAD_BLOCK;
    ch_status st = CH_STATUS_OK;
    for (int i = gi->nnodes - 1; i >= 0 && st == CH_STATUS_OK; i--) {
        xnode *x = &gi->nodes[i];
        if (x->l->absorbed) continue;
        /* Values remade for this node's backward: held until their last reader (the ReLU that
         * reads its own output, else this node) is done. */
        for (int k = 0; k < gi->nrc && st == CH_STATUS_OK; k++)
            if (gi->rc[k].reader == i)
                st = ch_block_take(&b, tsize(gi, gi->rc[k].tensor) * (size_t)max_batch, &gi->rc[k].bwd_off, err);
        bool took_dy = false;
        for (int j = 0; j < x->nin && st == CH_STATUS_OK; j++) {
            const int t = gi->alias[x->in[j]];
            x->dx_add[j] = held[t];
            /* Written already by a later node: a temporary, added on after this node. */
            if (held[t]) st = ch_block_take(&b, tsize(gi, t) * (size_t)max_batch, &x->dx_off[j], err);
            else st = place_first_grad(gi, &b, x, j, max_batch, &took_dy, err);
            held[t] = true;
        }
        /* This node's temporaries, then its output's gradient (the caller's for the output), are
         * free once it has run; its temporaries were all taken at once, so none share a block. */
        for (int j = 0; j < x->nin; j++)
            if (x->dx_add[j]) ch_block_give(&b, x->dx_off[j]);
        const int out = gi->alias[x->out];
        if (out != gi->output && gi->grad_where[out] == GRAD_BLOCK && !took_dy && !twin_holds(gi, out, i))
            ch_block_give(&b, gi->grad_off[out]);
        for (int k = 0; k < gi->nrc; k++)
            if ((gi->rc[k].relu >= 0 ? gi->rc[k].relu : gi->rc[k].reader) == i) ch_block_give(&b, gi->rc[k].bwd_off);
    }
    size_t top = 0;
    if (st == CH_STATUS_OK) st = ch_blocks_place(&b, &top, err);
    if (top > l->scratch_own) l->scratch_own = top;
    if (st == CH_STATUS_OK) place_backward(gi, &b);
    free(b.s);
    free(held);
    return st;
}

/* The last node whose forward reads node i's inputs: the sum that normalises for it, or i. */
static int last_forward_read(const graph_impl *gi, int i)
{
    for (int a = 0; a < gi->nnodes; a++)
        if (gi->nodes[a].sum_bn == i + 1) return a;
    return i;
}

/* Forward's blocks for the outputs that are not kept: from their BatchNorm to their reader, and
 * for those kept in bf16, from their maker to their BatchNorm. A node's blocks are all taken
 * before the blocks it frees are given back: what it reads and what it writes never share one. */
static ch_status plan_forward(ch_layer *l, int max_batch, ch_err *err)
{
    graph_impl *gi = l->impl;
    ch_blocks b = { 0 };
    ch_status st = CH_STATUS_OK;
    for (int i = 0; i < gi->nnodes && st == CH_STATUS_OK; i++) {
        for (int k = 0; k < gi->nrc && st == CH_STATUS_OK; k++)
            if (gi->rc[k].bn == i)
                st = ch_block_take(&b, tsize(gi, gi->rc[k].tensor) * (size_t)max_batch, &gi->rc[k].fwd_off, err);
        for (int k = 0; k < gi->nhv && st == CH_STATUS_OK; k++)
            if (gi->hv[k].producer == i && !gi->hv[k].direct)
                st = ch_block_take(&b, tsize(gi, gi->hv[k].tensor) * (size_t)max_batch, &gi->hv[k].fwd_off, err);
        for (int k = 0; k < gi->nrc; k++)
            if (last_forward_read(gi, gi->rc[k].reader) == i) ch_block_give(&b, gi->rc[k].fwd_off);
        for (int k = 0; k < gi->nhv; k++)
            if (last_forward_read(gi, gi->hv[k].bn) == i && !gi->hv[k].direct) ch_block_give(&b, gi->hv[k].fwd_off);
    }
    if (st == CH_STATUS_OK) st = ch_blocks_place(&b, &l->scratch_own, err);
    for (int k = 0; k < gi->nrc && st == CH_STATUS_OK; k++) ch_block_offset(&b, &gi->rc[k].fwd_off);
    for (int k = 0; k < gi->nhv && st == CH_STATUS_OK; k++)
        if (!gi->hv[k].direct) ch_block_offset(&b, &gi->hv[k].fwd_off);
    free(b.s);
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
    gi->grad_where = calloc((size_t)g->ntensors, sizeof *gi->grad_where);
    gi->grad_twin = malloc(sizeof *gi->grad_twin * (size_t)g->ntensors);
    gi->act = calloc((size_t)g->ntensors, sizeof *gi->act);
    gi->dxs = calloc((size_t)maxin, sizeof *gi->dxs);
    gi->xs = calloc((size_t)maxin, sizeof *gi->xs);
    size_t *dx_off = calloc(total ? total : 1, sizeof *dx_off);
    bool *dx_add = calloc(total ? total : 1, sizeof *dx_add);
    if (!gi->nodes || !gi->ins || !gi->alias || !gi->producer || !gi->shape || !gi->grad_off || !gi->grad_where || !gi->grad_twin || !gi->act || !gi->dxs ||
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
    free(gi->grad_where);
    free(gi->grad_twin);
    free(gi->act);
    free(gi->dxs);
    free(gi->xs);
    free(gi->rc);
    free(gi->readers);
    for (int k = 0; k < gi->nhv; k++) ch_layer_release(l, gi->hv[k].saved);
    free(gi->hv);
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
        /* A reused node's layer is tied to its twin's, at the end of the twin's list of ties. */
        if (st == CH_STATUS_OK && g->nodes[i].tied) {
            ch_layer **at = &gi->nodes[g->nodes[i].tied - 1].l->tie_next;
            while (*at) at = &(*at)->tie_next;
            *at = c;
            c->tied_to = gi->nodes[g->nodes[i].tied - 1].l;
        }
    }
    if (st != CH_STATUS_OK) {
        ch_layer_free(l);
        return st;
    }
    *out = l;
    return CH_STATUS_OK;
}

/* ---- plan, forward, backward ---- */

static ch_status graph_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    graph_impl *gi = l->impl;
    CH_TRY(ch_gx_place_values(l, pl, err));
    CH_TRY(plan_forward(l, pl->max_batch, err));
    CH_TRY(plan_backward(l, pl->max_batch, err));
    ch_gx_place_fused_backward(gi, pl);
    l->y = gi->nodes[gi->producer[gi->output]].l->y;
    l->y_owned = false;
    return CH_STATUS_OK;
}

static void trace_node(const ch_run *r, const char *pass, const ch_layer *c, int64_t t0)
{
    if (!r->trace) return;
    char name[56];
    snprintf(name, sizeof name, "%.40s %s", c->name, c->ops->kind);
    ch_trace_span(r->trace, pass, name, t0, -1);
}

/* A remade output's values are at p: its BatchNorm (and ReLU) write there, its reader reads there. */
static void point_remade(graph_impl *gi, const recompute *rc, ch_real *p)
{
    gi->nodes[rc->bn].l->y = p;
    if (rc->relu >= 0) gi->nodes[rc->relu].l->y = p;
    gi->act[gi->nodes[rc->bn].out] = gi->act[rc->tensor] = p;
}

/* Make a remade output again, for its reader's backward: from the BatchNorm's input, or from its
 * bf16 copy. */
static void remake(graph_impl *gi, const recompute *rc, const ch_run *r, int n)
{
    ch_real *p = r->scratch + rc->bwd_off;
    const xnode *bn = &gi->nodes[rc->bn];
    const halved *h = ch_gx_halved_for(gi, rc->bn);
    if (h) ch_batchnorm2d_reapply_bf16(bn->l, r, n, h->saved, p);
    else ch_batchnorm2d_reapply(bn->l, r, n, gi->act[bn->in[0]], p);
    if (rc->relu >= 0 && !gi->nodes[rc->relu].fwd_in_bn)
        r->k->relu_forward(&r->kc, tsize(gi, rc->tensor) * (size_t)n, p, p);
    point_remade(gi, rc, p);
}

/* A sum node that does its BatchNorm's normalising pass: the other operand is the residual. */
static void run_bn_sum(const graph_impl *gi, const xnode *a, const ch_run *r, int n)
{
    const xnode *bn = &gi->nodes[a->sum_bn - 1];
    const int other = gi->alias[a->in[0]] == gi->alias[bn->out] ? 1 : 0;
    ch_batchnorm2d_apply_sum(bn->l, r, n, gi->act[bn->in[0]], gi->act[a->in[other]], a->sum_relu);
}

static void graph_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    graph_impl *gi = l->impl;
    gi->act[gi->input] = x;
    const ch_run above = ch_run_above(r, l);
    for (int i = 0; i < gi->nnodes; i++) {
        xnode *nd = &gi->nodes[i];
        for (int k = 0; k < gi->nrc; k++)
            if (gi->rc[k].bn == i) point_remade(gi, &gi->rc[k], r->scratch + gi->rc[k].fwd_off);
        for (int k = 0; k < gi->nhv; k++)
            if (gi->hv[k].producer == i && !gi->hv[k].direct) nd->l->y = r->scratch + gi->hv[k].fwd_off;
        const int64_t t0 = r->trace ? ch_trace_now() : 0;
        const bool runs = !nd->l->absorbed && !nd->fwd_in_bn && !nd->fwd_in_sum;
        if (runs) {
            if (nd->sum_bn) {
                run_bn_sum(gi, nd, &above, n);
            } else if (nd->l->ops->forward_multi) {
                for (int j = 0; j < nd->nin; j++) gi->xs[j] = gi->act[nd->in[j]];
                nd->l->ops->forward_multi(nd->l, &above, n, gi->xs);
            } else {
                nd->l->ops->forward(nd->l, &above, n, gi->act[nd->in[0]]);
            }
        }
        gi->act[nd->out] = nd->l->y;
        if (runs) trace_node(r, "forward", nd->l, t0);
    }
}

/* Tensor t's gradient (not the graph's input's or output's); NULL where it is bf16: its writer and
 * reader know where (GRAD_BF16). */
static ch_real *grad_at(const graph_impl *gi, ch_real *base, int t)
{
    if (gi->grad_where[t] == GRAD_BF16) return NULL;
    return gi->grad_where[t] == GRAD_OVER_VALUES ? gi->nodes[gi->producer[t]].l->y : base + gi->grad_off[t];
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
        for (int k = 0; k < gi->nrc; k++)
            if (gi->rc[k].reader == i) remake(gi, &gi->rc[k], r, n);
        if (nd->bwd_in_bn) continue;   /* its BatchNorm's backward masks the block they share */
        const int out = gi->alias[nd->out];
        /* dy of the output is the caller's; the layers may write over dy (overwrites_dy). */
        const ch_real *g = out == gi->output ? dy : grad_at(gi, base, out);
        for (int j = 0; j < nd->nin; j++) {
            const int t = gi->alias[nd->in[j]];
            const bool to_input = t == gi->input;
            if (to_input && !dx) gi->dxs[j] = NULL;
            else if (nd->dx_add[j]) gi->dxs[j] = base + nd->dx_off[j];
            else gi->dxs[j] = to_input ? dx : grad_at(gi, base, t);
            gi->xs[j] = gi->act[nd->in[j]];
        }
        const int64_t t0 = r->trace ? ch_trace_now() : 0;
        if (nd->l->ops->backward_multi)
            nd->l->ops->backward_multi(nd->l, &above, n, gi->xs, g, gi->dxs);
        else
            nd->l->ops->backward(nd->l, &above, n, gi->xs[0], g, gi->dxs[0]);
        trace_node(r, "backward", nd->l, t0);
        for (int j = 0; j < nd->nin; j++) {
            if (!gi->dxs[j] || !nd->dx_add[j]) continue;
            const int t = gi->alias[nd->in[j]];
            ch_real *acc = t == gi->input ? dx : grad_at(gi, base, t);
            r->k->add(&r->kc, tsize(gi, t) * (size_t)n, acc, gi->dxs[j], acc);
        }
    }
}

static const ch_layer_ops graph_ops = {
    .kind = "Graph", .plan = graph_plan, .forward = graph_forward, .backward = graph_backward,
    .free_impl = graph_free_impl, .overwrites_dy = true,
};
