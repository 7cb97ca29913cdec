/* The compiled graph's plan-time passes: which layers fuse (a convolution and its ReLU, a
 * BatchNorm and its ReLU or the sum after it), which values are written in place, remade in
 * backward instead of kept, kept in bf16, or passed to a convolution in bf16. exec.c's top says
 * what each does and why; exec.c plans the blocks between the two halves below. */
#include "graph/exec_impl.h"

#include <stdlib.h>
#include <string.h>

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
bool ch_gx_grad_over_values(const graph_impl *gi, const xnode *x, int t)
{
    if (!ch_layer_is_batchnorm(x->l) || t == gi->input || t == gi->output || gi->readers[t] != 1) return false;
    const xnode *p = &gi->nodes[gi->producer[t]];
    return p->l->ops->y_unread_by_backward && !p->relu_fused && p->l->y_owned;
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

const halved *ch_gx_halved_for(const graph_impl *gi, int bn)
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
    const halved *h = ch_gx_halved_for(gi, b);
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
    return !gi->nodes[b].l->absorbed && ch_gx_grad_over_values(gi, &gi->nodes[b], *t);
}

/* --precision bf16: BatchNorm inputs kept in bf16 (see the top of the file), where the backend
 * has the conversions; their makers' fp32 outputs are freed; and their gradients passed in bf16
 * where the maker reads them so. */
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
        /* A convolution that reads its dy in bf16 reads it there: the BatchNorm's backward writes
         * it over the copy, which nothing reads after that, and no fp32 block is taken. */
        h->grad16 = k->bn_backward_data_to_bf16 && ch_conv2d_grad_bf16(gi->nodes[h->producer].l, pl, h->saved);
        if (h->grad16) ch_batchnorm2d_grad_bf16(gi->nodes[b].l);
        pl->bf16_grads += h->grad16 ? count : 0;
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
ch_status ch_gx_place_values(ch_layer *l, ch_plan *pl, ch_err *err)
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
    return plan_halves(l, pl, err);
}

void ch_gx_place_fused_backward(graph_impl *gi, ch_plan *pl)
{
    fuse_bn_relu_backward(gi);
    plan_bf16_inputs(gi, pl);
}
