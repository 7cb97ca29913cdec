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
 *    remake read the copy (plan_halves); its gradient then takes a block;
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
 * Blocks get their offsets after each walk (graph/blocks.h). */
#include "graph/graph.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trace.h"
#include "graph/blocks.h"

typedef struct xnode {
    ch_layer *l;          /* borrowed: a child of the graph layer */
    bool relu_fused;      /* its layer does the ReLU after it (its y is read by its backward) */
    bool fwd_in_bn;       /* a ReLU whose forward the BatchNorm before it does (and its remake) */
    bool bwd_in_bn;       /* ... and whose backward too */
    int sum_bn;           /* a sum that does the normalising pass of BatchNorm node sum_bn - 1 (0: none) */
    bool sum_relu;        /* ... and the ReLU over it */
    bool fwd_in_sum;      /* a ReLU whose forward such a sum does */
    int nin, *in, out;    /* tensor ids (in borrowed from the description's copy below) */
    size_t *dx_off;       /* per input read again: the temporary its gradient goes to (offset) */
    bool *dx_add;         /* per input: into a temporary, added to the tensor's gradient after */
} xnode;

/* Where a tensor's gradient lives in backward. */
enum { GRAD_BLOCK = 0, GRAD_OVER_VALUES = 1 };

/* A BatchNorm output (through the in-place ReLU after it, if any) that is not kept. */
typedef struct recompute {
    int bn, relu;         /* nodes; relu -1: none */
    int reader;           /* the one node that reads the values */
    int tensor;           /* what reader reads (the ReLU's output, or the BatchNorm's) */
    size_t fwd_off, bwd_off;   /* its block in forward and in backward (scratch offsets) */
} recompute;

/* A tensor kept in bf16 between forward and backward (see the top of the file). */
typedef struct halved {
    int bn, producer;     /* nodes: its one reader, a BatchNorm, and its maker */
    int tensor;
    size_t fwd_off;       /* its fp32 block in forward, from its maker to the BatchNorm */
    uint16_t *saved;      /* max_batch samples, bf16 (replica memory, the graph layer's) */
    bool direct;          /* its maker writes saved itself, and no fp32 block is taken */
} halved;

typedef struct graph_impl {
    int nnodes, ntensors, input, output;
    xnode *nodes;
    int *ins;             /* all nodes' inputs, one array */
    int *alias;           /* tensor -> the tensor whose values and gradient it shares (itself) */
    int *producer;        /* tensor -> the node that makes it (-1: the input) */
    ch_shape3 *shape;
    size_t *grad_off;     /* tensor -> its gradient's scratch offset (planned) */
    unsigned char *grad_where;   /* tensor -> GRAD_BLOCK (at grad_off) or GRAD_OVER_VALUES */
    int *grad_twin;       /* tensor -> the other operand of a sum whose gradient shares its block (-1) */
    const ch_real **act;  /* tensor -> its values in the current forward */
    ch_real **dxs;        /* scratch for one node's input gradients */
    const ch_real **xs;   /* one node's inputs */
    int maxin;
    int *readers;         /* tensor (by alias) -> nodes that read it once ReLUs are fused (planned) */
    recompute *rc;        /* outputs remade in backward instead of kept */
    int nrc;
    halved *hv;           /* tensors kept in bf16 */
    int nhv;
} graph_impl;

static const ch_layer_ops graph_ops;

static size_t tsize(const graph_impl *gi, int t) { return ch_shape3_size(gi->shape[t]); }

/* Readers of each tensor by alias (a fused ReLU reads nothing: its output is its input's), counted
 * into cnt (ntensors, zeroed here). */
static void count_readers(const graph_impl *gi, int *cnt)
{
    memset(cnt, 0, sizeof *cnt * (size_t)gi->ntensors);
    for (int i = 0; i < gi->nnodes; i++)
        if (!gi->nodes[i].l->absorbed)
            for (int j = 0; j < gi->nodes[i].nin; j++) cnt[gi->alias[gi->nodes[i].in[j]]]++;
}

/* The one node that reads tensor t (by alias), counted by count_readers. */
static int only_reader(const graph_impl *gi, int t)
{
    for (int i = 0; i < gi->nnodes; i++)
        if (!gi->nodes[i].l->absorbed)
            for (int j = 0; j < gi->nodes[i].nin; j++)
                if (gi->alias[gi->nodes[i].in[j]] == t) return i;
    return -1;
}

/* May node x write the gradient of its input t over t's own values? A BatchNorm may (its kernel
 * allows dx to alias x) when it is t's one reader and t's maker does not read them in backward:
 * a convolution's output then holds its own gradient, as in PyTorch's in-place tricks. */
static bool grad_over_values(const graph_impl *gi, const xnode *x, int t)
{
    if (!ch_layer_is_batchnorm(x->l) || t == gi->input || t == gi->output || gi->readers[t] != 1) return false;
    const xnode *p = &gi->nodes[gi->producer[t]];
    return p->l->ops->y_unread_by_backward && !p->relu_fused && p->l->y_owned;
}

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
    if (grad_over_values(gi, x, t)) {
        gi->grad_where[t] = GRAD_OVER_VALUES;
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
        p->relu_fused = true;
        gi->alias[r->out] = gi->alias[t];
    }
    free(cnt);
    return CH_STATUS_OK;
}

/* May a node write over tensor t (by alias), its input? Only when it is t's one reader and t's
 * maker never reads t again (see the top of the file). */
static bool overwritable(const graph_impl *gi, int t)
{
    if (t == gi->input || t == gi->output || gi->readers[t] != 1) return false;
    const xnode *p = &gi->nodes[gi->producer[t]];
    return p->l->ops->y_unread_by_backward && !p->relu_fused && p->l->y;
}

/* ReLUs and residual sums in place (see the top of the file). */
static void run_in_place(graph_impl *gi)
{
    for (int i = 0; i < gi->nnodes; i++) {
        xnode *x = &gi->nodes[i];
        if (x->l->absorbed) continue;
        const int ncand = ch_layer_is_relu(x->l) ? 1 : ch_layer_is_plain_add(x->l) ? 2 : 0;
        for (int j = 0; j < ncand; j++) {
            const int t = gi->alias[x->in[j]];
            if (!overwritable(gi, t)) continue;
            ch_layer_borrow_output(x->l, gi->nodes[gi->producer[t]].l->y);
            break;
        }
    }
}

/* The BatchNorm input kept in bf16 for node bn, or NULL. */
static const halved *halved_for(const graph_impl *gi, int bn)
{
    for (int k = 0; k < gi->nhv; k++)
        if (gi->hv[k].bn == bn) return &gi->hv[k];
    return NULL;
}

/* The one reader of node i's output when it writes over that output in place, or -1. */
static int in_place_reader(const graph_impl *gi, int i)
{
    const xnode *x = &gi->nodes[i];
    const int t = gi->alias[x->out];
    if (x->l->absorbed || !x->l->y || t == gi->output || gi->readers[t] != 1) return -1;
    const int r = only_reader(gi, t);
    return gi->nodes[r].l->y == x->l->y ? r : -1;
}

/* The ReLU that writes over BatchNorm node b's output in place, its one reader, or -1. */
static int relu_over_bn(const graph_impl *gi, int b)
{
    if (!ch_layer_is_batchnorm(gi->nodes[b].l)) return -1;
    const int r = in_place_reader(gi, b);
    return r >= 0 && ch_layer_is_relu(gi->nodes[r].l) ? r : -1;
}

/* BatchNorm + sum (+ ReLU) forward (see the top of the file), where the backend has the kernel. */
static void fuse_bn_sums(graph_impl *gi, const ch_kernels *k)
{
    if (!k->bn_add_forward) return;
    for (int b = 0; b < gi->nnodes; b++) {
        const int a = ch_layer_is_batchnorm(gi->nodes[b].l) ? in_place_reader(gi, b) : -1;
        if (a < 0 || !ch_layer_is_plain_add(gi->nodes[a].l)) continue;
        const int r = in_place_reader(gi, a);
        gi->nodes[a].sum_bn = b + 1;
        gi->nodes[a].sum_relu = r >= 0 && ch_layer_is_relu(gi->nodes[r].l);
        if (gi->nodes[a].sum_relu) gi->nodes[r].fwd_in_sum = true;
        ch_batchnorm2d_apply_later(gi->nodes[b].l);
    }
}

/* BatchNorm + ReLU forward (see the top of the file): each ReLU over a BatchNorm's output in place
 * is done by the BatchNorm's pass, where the backend has the fused kernels. */
static void fuse_bn_relu_forward(graph_impl *gi, const ch_kernels *k)
{
    if (!k->bn_relu_forward || !k->bn_relu_backward_reduce || !k->bn_relu_backward_data) return;
    for (int b = 0; b < gi->nnodes; b++) {
        const int r = relu_over_bn(gi, b);
        if (r < 0) continue;
        gi->nodes[r].fwd_in_bn = true;
        ch_batchnorm2d_fuse_relu(gi->nodes[b].l, true, false);
    }
}

/* The BatchNorm whose forward does ReLU node r's, or -1. */
static int bn_of_relu(const graph_impl *gi, int r)
{
    return gi->nodes[r].fwd_in_bn ? gi->producer[gi->nodes[r].in[0]] : -1;
}

/* Is the fused ReLU r's backward, done by its BatchNorm b, the same as its own? Its input's
 * gradient must be its dy's block (the BatchNorm reads that block as its dy and masks it), and the
 * values the BatchNorm's backward reads (its input, or the bf16 copy it keeps) must be those its
 * forward or remake normalised into the ReLU's output: not where forward read an fp32 input it
 * rounded for backward and the output was kept, not remade. */
static bool bn_relu_backward_exact(const graph_impl *gi, int b, int r)
{
    const xnode *x = &gi->nodes[r];
    const int to = gi->alias[x->out], ti = gi->alias[x->in[0]];
    if (to == gi->output || gi->grad_where[to] != GRAD_BLOCK || gi->grad_where[ti] != GRAD_BLOCK ||
        gi->grad_off[ti] != gi->grad_off[to] || x->dx_add[0])
        return false;
    const halved *h = halved_for(gi, b);
    bool remade = false;
    for (int k = 0; k < gi->nrc; k++) remade |= gi->rc[k].bn == b;
    return !h || h->direct || remade;
}

/* BatchNorm + ReLU backward, once every gradient has its place. */
static void fuse_bn_relu_backward(graph_impl *gi)
{
    for (int r = 0; r < gi->nnodes; r++) {
        const int b = bn_of_relu(gi, r);
        if (b < 0 || !bn_relu_backward_exact(gi, b, r)) continue;
        gi->nodes[r].bwd_in_bn = true;
        ch_batchnorm2d_fuse_relu(gi->nodes[b].l, true, true);
    }
}

/* Does node b make a BatchNorm output that can be remade instead of kept? Fills rc when it does. */
static bool find_recompute(const graph_impl *gi, const bool *remade, int b, recompute *rc)
{
    const xnode *bn = &gi->nodes[b];
    if (bn->l->absorbed || !ch_layer_is_batchnorm(bn->l) || remade[gi->alias[bn->in[0]]]) return false;
    int t = gi->alias[bn->out];
    if (t == gi->output || gi->readers[t] != 1) return false;
    const int relu = relu_over_bn(gi, b);
    if (relu >= 0) {
        t = gi->alias[gi->nodes[relu].out];
        if (t == gi->output || gi->readers[t] != 1) return false;
    }
    const int reader = only_reader(gi, t);
    /* A reader that writes over the values would leave nothing to remake them over. */
    if (gi->nodes[reader].l->y == bn->l->y) return false;
    *rc = (recompute){ .bn = b, .relu = relu, .reader = reader, .tensor = t };
    return true;
}

/* BatchNorm outputs remade in backward (see the top of the file): their buffers are freed. */
static ch_status plan_recompute(graph_impl *gi, ch_err *err)
{
    bool *remade = calloc((size_t)gi->ntensors, sizeof *remade);
    gi->rc = calloc((size_t)gi->nnodes, sizeof *gi->rc);
    if (!remade || !gi->rc) {
        free(remade);
        return CH_SYS_FAIL(err, "allocation of the recompute plan");
    }
    for (int i = 0; i < gi->nnodes; i++) {
        recompute rc;
        if (!find_recompute(gi, remade, i, &rc)) continue;
        remade[gi->alias[gi->nodes[i].out]] = remade[rc.tensor] = true;
        ch_layer_borrow_output(gi->nodes[i].l, NULL);
        if (rc.relu >= 0) gi->nodes[rc.relu].l->y = NULL;
        gi->rc[gi->nrc++] = rc;
    }
    free(remade);
    return CH_STATUS_OK;
}

/* Is the input of node b, t, one to keep in bf16? Exactly where a BatchNorm would write its input
 * gradient over its input (grad_over_values): it is t's one reader, and t's maker keeps t only for
 * it. (Once kept in bf16 the maker's buffer is gone, and the gradient takes a block.) */
static bool halvable(const graph_impl *gi, int b, int *t)
{
    *t = gi->alias[gi->nodes[b].in[0]];
    return !gi->nodes[b].l->absorbed && grad_over_values(gi, &gi->nodes[b], *t);
}

/* --precision bf16: BatchNorm inputs kept in bf16 (see the top of the file), where the backend
 * has the conversions; their makers' fp32 outputs are freed. */
static ch_status plan_halves(ch_layer *l, ch_plan *pl, ch_err *err)
{
    graph_impl *gi = l->impl;
    const ch_kernels *k = pl->k;
    if (!pl->bf16 || !k->channel_affine_keep_bf16 || !k->channel_affine_of_bf16 || !k->batchnorm_backward_reduce_bf16 ||
        !k->batchnorm_backward_data_bf16)
        return CH_STATUS_OK;
    gi->hv = calloc((size_t)gi->nnodes, sizeof *gi->hv);
    CH_CHECK_ALLOC(err, gi->hv);
    for (int b = 0; b < gi->nnodes; b++) {
        int t;
        if (!halvable(gi, b, &t)) continue;
        halved *h = &gi->hv[gi->nhv];
        *h = (halved){ .bn = b, .producer = gi->producer[t], .tensor = t };
        const size_t count = tsize(gi, t) * (size_t)pl->max_batch;
        h->saved = ch_layer_alloc_saved(l, pl, count, sizeof(uint16_t), err);
        if (!h->saved) return CH_STATUS_SYSTEM;
        gi->nhv++;
        pl->saved_bytes += sizeof(uint16_t) * count;
        pl->bf16_kept += count;
        ch_layer_borrow_output(gi->nodes[h->producer].l, NULL);
        /* A convolution that rounds as it writes (the kernels say which) writes the copy itself:
         * no fp32 output at all, and the BatchNorm reads half the bytes. */
        h->direct = k->batchnorm_stats_bf16 && ch_conv2d_output_bf16(gi->nodes[h->producer].l, pl, h->saved);
        pl->bf16_direct += h->direct ? count : 0;
        ch_batchnorm2d_keep_input(gi->nodes[b].l, h->saved, h->direct);
    }
    return CH_STATUS_OK;
}

/* --precision bf16: remade BatchNorm + ReLU outputs whose one reader is a convolution that takes
 * its input in bf16 (see the top of the file). Only where the ReLU's backward is the BatchNorm's,
 * which recomputes its mask from the BatchNorm's input: nothing else reads the output, so nothing
 * reads it as fp32. Their blocks keep their fp32 size (planned before the ReLU's backward had its
 * place); what halves is the bytes written and read. */
static void plan_bf16_inputs(graph_impl *gi, ch_plan *pl)
{
    if (!pl->bf16 || !pl->k->bn_relu_forward_to_bf16) return;
    for (int i = 0; i < gi->nrc; i++) {
        const recompute *rc = &gi->rc[i];
        if (rc->relu < 0 || !gi->nodes[rc->relu].bwd_in_bn || !ch_conv2d_input_bf16(gi->nodes[rc->reader].l, pl))
            continue;
        ch_batchnorm2d_output_bf16(gi->nodes[rc->bn].l);
        pl->bf16_inputs += tsize(gi, rc->tensor) * (size_t)pl->max_batch;
    }
}

static ch_status graph_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    graph_impl *gi = l->impl;
    CH_TRY(fuse_relus(gi, err));
    gi->output = gi->alias[gi->output];
    /* The later passes change where values live, not who reads them: counted once. */
    gi->readers = malloc(sizeof *gi->readers * (size_t)gi->ntensors);
    CH_CHECK_ALLOC(err, gi->readers);
    count_readers(gi, gi->readers);
    run_in_place(gi);
    fuse_bn_relu_forward(gi, pl->k);
    fuse_bn_sums(gi, pl->k);
    CH_TRY(plan_recompute(gi, err));
    CH_TRY(plan_halves(l, pl, err));
    CH_TRY(plan_forward(l, pl->max_batch, err));
    CH_TRY(plan_backward(l, pl->max_batch, err));
    fuse_bn_relu_backward(gi);
    plan_bf16_inputs(gi, pl);
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
    const halved *h = halved_for(gi, rc->bn);
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

/* Tensor t's gradient (not the graph's input's or output's). */
static ch_real *grad_at(const graph_impl *gi, ch_real *base, int t)
{
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
