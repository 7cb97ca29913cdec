/* The ONNX importer's shape operators (Shape, Gather, Squeeze, Unsqueeze, Concat, Slice, Reshape,
 * Transpose): what PyTorch emits around x.view(x.size(0), -1), y[:, :, None, None] or a Resize's
 * scales is folded into constants and views, not run; Concat of tensors is the channel
 * concatenation, Slice of tensors the channel slice (x.chunk, x.split, x[:, a:b]); Reshape and
 * Transpose make views and marks (flatten, channel groups, channels-last) and the channel shuffle. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph.h"
#include "graph/onnx_imp.h"

ch_status ch_onnx_op_shape(ch_onnx_imp *m)
{
    ch_oval *v, *o;
    int64_t start = 0, end = 0;
    CH_TRY(ch_onnx_tensor_val(m, 0, &v));
    const ch_gtensor *x = &m->g->tensors[v->tensor];
    const int64_t dims[4] = { CH_ONNX_BATCH, x->dims[0], x->dims[1], x->dims[2] };
    const int r = x->rank + 1;
    CH_TRY(ch_onnx_attr_int(m, "start", 0, &start));
    CH_TRY(ch_onnx_attr_int(m, "end", r, &end));
    start = start < 0 ? start + r : start;
    end = end < 0 ? end + r : end;
    start = start < 0 ? 0 : start > r ? r : start;
    end = end < start ? start : end > r ? r : end;
    CH_TRY(ch_onnx_define(m, 0, CH_OVAL_CONST, &o));
    o->rank = 1;
    o->n = (int)(end - start);
    for (int i = 0; i < o->n; i++) o->f[i] = (double)(o->i[i] = dims[start + i]);
    return CH_STATUS_OK;
}

ch_status ch_onnx_op_gather(ch_onnx_imp *m)
{
    ch_oval *d, *idx, *o;
    int64_t axis = 0;
    CH_TRY(ch_onnx_const_in(m, 0, true, &d));
    CH_TRY(ch_onnx_const_in(m, 1, true, &idx));
    CH_TRY(ch_onnx_attr_int(m, "axis", 0, &axis));
    if (d->rank != 1 || axis != 0 || idx->is_float)
        return ch_onnx_bad(m, "only indexing a shape vector is supported");
    CH_TRY(ch_onnx_define(m, 0, CH_OVAL_CONST, &o));
    o->rank = idx->rank;
    o->n = idx->n;
    for (int i = 0; i < idx->n; i++) {
        int64_t k = idx->i[i] < 0 ? idx->i[i] + d->n : idx->i[i];
        if (k < 0 || k >= d->n) return ch_onnx_bad(m, "index %lld outside a vector of %d", (long long)idx->i[i], d->n);
        o->i[i] = d->i[k];
        o->f[i] = d->f[k];
    }
    o->is_float = d->is_float;
    return CH_STATUS_OK;
}

/* The per-sample shape of tensor value v as ONNX sees it (without the batch); its rank. */
static int sample_shape(const ch_onnx_imp *m, const ch_oval *v, int *d)
{
    const ch_gtensor *t = &m->g->tensors[v->tensor];
    if (v->pending) return (d[0] = v->pdims[0], d[1] = v->pdims[1], 2);
    for (int i = 0; i < t->rank; i++) d[i] = t->dims[i];
    return t->rank;
}

/* Output 0 holds v's values as per-sample shape d (rank r): the same tensor, a flatten or a view
 * in the graph, or a pending (batch, a, b) shape. */
static ch_status reshaped_out(ch_onnx_imp *m, const ch_oval *v, const int *d, int r)
{
    const ch_gtensor *t = &m->g->tensors[v->tensor];
    char buf[CH_NODE_NAME_MAX];
    if (r == 2) {
        CH_TRY(ch_onnx_alias_out(m, v));
        ch_oval *o = ch_ovals_find(&m->vals, m->node->output[0]);
        o->pending = true;
        o->pdims[0] = d[0];
        o->pdims[1] = d[1];
        return CH_STATUS_OK;
    }
    ch_oval plain = *v;
    plain.pending = false;
    if (r == 1 && t->rank == 1) return ch_onnx_alias_out(m, &plain);
    if (r == 1) return ch_onnx_tensor_out(m, ch_graph_flatten(m->g, ch_onnx_node_name(m, buf, sizeof buf), v->tensor));
    if (r == 3 && t->rank == 3 && d[0] == t->dims[0] && d[1] == t->dims[1] && d[2] == t->dims[2])
        return ch_onnx_alias_out(m, &plain);
    if (r == 3) return ch_onnx_tensor_out(m, ch_graph_view(m->g, ch_onnx_node_name(m, buf, sizeof buf), v->tensor, d[0], d[1], d[2]));
    return ch_onnx_bad(m, "makes a (batch%s) tensor: cohort has (batch, features) and (batch, c, h, w) tensors only",
               r == 0 ? "" : ", ...");
}

/* Squeeze and Unsqueeze of a tensor (y.unsqueeze(-1).unsqueeze(-1), y[:, :, None, None],
 * x.squeeze(-1), x.squeeze()): the same values in another shape. The batch stays. */
static ch_status squeeze_tensor(ch_onnx_imp *m, ch_oval *v, bool un)
{
    ch_oval *axes;
    int d[4], r = sample_shape(m, v, d);
    CH_TRY(ch_onnx_const_in(m, 1, un, &axes));
    if (axes && (axes->is_float || axes->n < 1 || axes->n > 3))
        return ch_onnx_bad(m, "axes must be 1 to 3 integers");
    const int rank = r + 1, out_rank = un ? rank + axes->n : rank; /* with the batch */
    bool at[8] = { false };
    for (int i = 0; axes && i < axes->n; i++) {
        const int64_t a = axes->i[i] < 0 ? axes->i[i] + out_rank : axes->i[i];
        if (a < 1 || a >= out_rank || at[a])
            return ch_onnx_bad(m, "axis %lld: only axes after the batch, each once, are supported", (long long)axes->i[i]);
        at[a] = true;
    }
    int o[8], k = 0;
    if (un) {
        for (int a = 1, j = 0; a < out_rank; a++) o[k++] = at[a] ? 1 : d[j++];
    } else {
        for (int a = 1; a < rank; a++) {
            const bool drop = axes ? at[a] : d[a - 1] == 1;
            if (drop && d[a - 1] != 1) return ch_onnx_bad(m, "axis %d has size %d, not 1", a, d[a - 1]);
            if (!drop) o[k++] = d[a - 1];
        }
    }
    if (k > 3) return ch_onnx_bad(m, "makes a tensor of %d dimensions: cohort has (batch, features) and (batch, c, h, w) only",
                          k + 1);
    return reshaped_out(m, v, o, k);
}

/* Unsqueeze and Squeeze: of tensors, a reshape; of constants, between a scalar and a one-element
 * vector. */
ch_status ch_onnx_op_squeeze(ch_onnx_imp *m)
{
    ch_oval *d, *axes;
    const bool un = strcmp(m->node->op_type, "Unsqueeze") == 0;
    CH_TRY(ch_onnx_input(m, 0, true, &d));
    if (d->kind == CH_OVAL_TENSOR && !d->expanded) return squeeze_tensor(m, d, un);
    CH_TRY(ch_onnx_const_in(m, 0, true, &d));
    CH_TRY(ch_onnx_const_in(m, 1, un, &axes));
    const bool axis0 = !axes || (axes->n == 1 && (axes->i[0] == 0 || axes->i[0] == -1));
    if (!axis0 || (un ? d->rank != 0 : d->n != 1))
        return ch_onnx_bad(m, "only %s of a constant scalar at axis 0 is supported", un ? "unsqueezing" : "squeezing");
    ch_oval c = *d;
    c.rank = un;
    return ch_onnx_alias_out(m, &c);
}

ch_status ch_onnx_op_concat(ch_onnx_imp *m)
{
    const Onnx__NodeProto *n = m->node;
    if (n->n_input < 1 || n->n_input > 4096) return ch_onnx_bad(m, "%zu inputs", n->n_input);
    ch_oval *first;
    int64_t axis = 0;
    CH_TRY(ch_onnx_input(m, 0, true, &first));
    CH_TRY(ch_onnx_attr_int(m, "axis", 0, &axis));
    if (first->kind == CH_OVAL_TENSOR) {
        int *xs = malloc(sizeof(int) * n->n_input);
        CH_CHECK_ALLOC(m->err, xs);
        ch_status st = CH_STATUS_OK;
        for (size_t i = 0; i < n->n_input && st == CH_STATUS_OK; i++) st = ch_onnx_tensor_in(m, i, &xs[i]);
        const int rank = m->g->tensors[first->tensor].rank;
        if (st == CH_STATUS_OK && !(axis == 1 || axis == -rank))
            st = ch_onnx_bad(m, "axis %lld: tensors are concatenated along channels (axis 1) only", (long long)axis);
        char buf[CH_NODE_NAME_MAX];
        if (st == CH_STATUS_OK)
            st = ch_onnx_tensor_out(m, ch_graph_concat(m->g, ch_onnx_node_name(m, buf, sizeof buf), xs, (int)n->n_input));
        free(xs);
        return st;
    }
    /* Integers make a shape, floats a Resize's scales (nn.Upsample exports them so). */
    ch_oval c = { .kind = CH_OVAL_CONST, .rank = 1 };
    for (size_t i = 0; i < n->n_input; i++) {
        ch_oval *v;
        CH_TRY(ch_onnx_const_in(m, i, true, &v));
        if (i == 0) c.is_float = v->is_float;
        if (v->rank != 1 || v->is_float != c.is_float || c.n + v->n > CH_ONNX_CONST_MAX)
            return ch_onnx_bad(m, "only the concatenation of short vectors of one type (a shape, scales) is folded");
        for (int k = 0; k < v->n; k++, c.n++) {
            c.i[c.n] = v->i[k];
            c.f[c.n] = v->f[k];
        }
    }
    return ch_onnx_alias_out(m, &c);
}


/* Slice's bound b on a dimension of size dim, as ONNX clamps it for step 1. */
static int64_t slice_bound(int64_t b, int64_t dim)
{
    if (b < 0) b += dim;
    return b < 0 ? 0 : b > dim ? dim : b;
}

/* Slice along one axis with step 1: of a constant vector, folded (x.shape[2:]); of a tensor, its
 * channels (x.chunk(2, 1) exports as two Slices). */
ch_status ch_onnx_op_slice(ch_onnx_imp *m)
{
    ch_oval *v, *starts, *ends, *axes, *steps;
    CH_TRY(ch_onnx_input(m, 0, true, &v));
    CH_TRY(ch_onnx_const_in(m, 1, true, &starts));
    CH_TRY(ch_onnx_const_in(m, 2, true, &ends));
    CH_TRY(ch_onnx_const_in(m, 3, false, &axes));
    CH_TRY(ch_onnx_const_in(m, 4, false, &steps));
    const ch_oval *ints[4] = { starts, ends, axes, steps };
    for (int i = 0; i < 4; i++)
        if (ints[i] && (ints[i]->is_float || ints[i]->n != 1 || ints[i]->i[0] == CH_ONNX_BATCH))
            return ch_onnx_bad(m, "only a slice along one axis by constant bounds is supported");
    if (steps && steps->i[0] != 1) return ch_onnx_bad(m, "step %lld: only step 1 is supported", (long long)steps->i[0]);
    const int64_t axis = axes ? axes->i[0] : 0;
    if (v->kind != CH_OVAL_TENSOR) {
        CH_TRY(ch_onnx_const_in(m, 0, true, &v));
        if (v->rank != 1 || (axis != 0 && axis != -1)) return ch_onnx_bad(m, "only a slice of a constant vector is supported");
        const int64_t a = slice_bound(starts->i[0], v->n), b = slice_bound(ends->i[0], v->n);
        ch_oval c = *v;
        c.n = b > a ? (int)(b - a) : 0;
        for (int k = 0; k < c.n; k++) {
            c.i[k] = v->i[a + k];
            c.f[k] = v->f[a + k];
        }
        return ch_onnx_alias_out(m, &c);
    }
    CH_TRY(ch_onnx_tensor_val(m, 0, &v));
    const ch_gtensor *x = &m->g->tensors[v->tensor];
    if (x->rank != 3 || (axis != 1 && axis != -3))
        return ch_onnx_bad(m, "only a slice of the channels (axis 1) of a (batch, c, h, w) tensor, as x.chunk, x.split "
                   "and x[:, a:b] make, is supported");
    const int64_t a = slice_bound(starts->i[0], x->dims[0]), b = slice_bound(ends->i[0], x->dims[0]);
    if (b <= a) return ch_onnx_bad(m, "the slice %lld:%lld of %d channels is empty", (long long)starts->i[0],
                                  (long long)ends->i[0], x->dims[0]);
    if (a == 0 && b == x->dims[0]) return ch_onnx_alias_out(m, v);
    char buf[CH_NODE_NAME_MAX];
    return ch_onnx_tensor_out(m, ch_graph_channel_slice(m->g, ch_onnx_node_name(m, buf, sizeof buf), v->tensor,
                                                        (int)a, (int)(b - a)));
}

/* Output 0 is tensor t (a builder result), viewed channels-last or not. */
ch_status ch_onnx_viewed_out(ch_onnx_imp *m, int t, bool channels_last)
{
    CH_TRY(ch_onnx_tensor_out(m, t));
    ch_ovals_find(&m->vals, m->node->output[0])->channels_last = channels_last;
    return CH_STATUS_OK;
}

/* The target shape s of a reshape of a (c, h, w) sample x to 5 dimensions, with the batch first and
 * at most one -1: (batch, g, c / g, h, w) into *g, *m; false when it is another shape. */
static bool groups_view(const ch_oval *s, const ch_gtensor *x, int64_t *g, int64_t *m)
{
    if (s->is_float || s->rank != 1 || s->n != 5 || x->rank != 3 || s->i[0] != CH_ONNX_BATCH) return false;
    int64_t t[5];
    int infer = -1;
    double known = 1;
    for (int i = 1; i < 5; i++) {
        t[i] = s->i[i];
        if (t[i] == -1 && infer < 0) infer = i;
        else if (t[i] < 1 || t[i] > (1 << 30)) return false;
        else known *= (double)t[i];
    }
    const double per = (double)x->dims[0] * x->dims[1] * x->dims[2];
    if (infer > 0) {
        if (fmod(per, known) != 0) return false;
        t[infer] = (int64_t)(per / known);
    }
    *g = t[1];
    *m = t[2];
    return t[1] * t[2] == x->dims[0] && t[3] == x->dims[1] && t[4] == x->dims[2];
}

/* Output 0 is v's tensor under v's view into channel groups, or plain (g 0). */
static ch_status grouped_out(ch_onnx_imp *m, int tensor, int g, int per_group)
{
    ch_oval *o;
    CH_TRY(ch_onnx_define(m, 0, CH_OVAL_TENSOR, &o));
    o->tensor = tensor;
    o->grouped[0] = g;
    o->grouped[1] = per_group;
    return CH_STATUS_OK;
}

/* A reshape of a view into channel groups: back to (batch, c, h, w) (or (batch, -1, h, w)) is the
 * tensor itself, whatever the view's order (the shuffle's Transpose has moved the values). */
static ch_status reshape_grouped(ch_onnx_imp *m, const ch_oval *v, const ch_oval *s)
{
    const ch_gtensor *x = &m->g->tensors[v->tensor];
    bool back = !s->is_float && s->rank == 1 && s->n == 4 && s->i[0] == CH_ONNX_BATCH &&
                (s->i[1] == x->dims[0] || s->i[1] == -1) && s->i[2] == x->dims[1] && s->i[3] == x->dims[2];
    if (!back)
        return ch_onnx_bad(m, "reshape of a (batch, %d, %d, %d, %d) view into channel groups: cohort imports only the "
                   "channel shuffle's reshape back to (batch, %d, %d, %d)", v->grouped[0], v->grouped[1], x->dims[1],
                   x->dims[2], x->dims[0], x->dims[1], x->dims[2]);
    return grouped_out(m, v->tensor, 0, 0);
}

/* Reshape with the batch symbolic: to (batch, c*h*w) is flatten; to the same shape, nothing; to
 * another (batch, c, h, w), a view; to (batch, g, c / g, h, w), a view into channel groups that
 * only a channel shuffle may read. */
ch_status ch_onnx_op_reshape(ch_onnx_imp *m)
{
    ch_oval *v, *s;
    int64_t allowzero = 0, groups = 0, per_group = 0;
    char buf[CH_NODE_NAME_MAX];
    CH_TRY(ch_onnx_input(m, 0, true, &v));
    CH_TRY(ch_onnx_const_in(m, 1, true, &s));
    CH_TRY(ch_onnx_attr_int(m, "allowzero", 0, &allowzero));
    if (v->kind == CH_OVAL_TENSOR && v->grouped[0] && !allowzero) return reshape_grouped(m, v, s);
    CH_TRY(ch_onnx_tensor_val(m, 0, &v));
    const ch_gtensor *x = &m->g->tensors[v->tensor];
    const int64_t in[4] = { CH_ONNX_BATCH, x->dims[0], x->rank == 3 ? x->dims[1] : 1, x->rank == 3 ? x->dims[2] : 1 };
    const int in_rank = x->rank + 1;
    const double per = (double)x->dims[0] * x->dims[1] * x->dims[2];
    /* x.view(b, groups, c // groups, h, w), as ShuffleNet's channel shuffle begins. */
    if (!allowzero && groups_view(s, x, &groups, &per_group)) return grouped_out(m, v->tensor, (int)groups, (int)per_group);
    if (!s->is_float && s->rank == 1 && s->n == 5 && x->rank == 3 && s->i[0] == CH_ONNX_BATCH)
        return ch_onnx_bad(m, "reshape of a (%d, %d, %d) sample to 5 dimensions: cohort imports only a view into channel "
                           "groups, (batch, g, c / g, h, w), as a channel shuffle makes", x->dims[0], x->dims[1], x->dims[2]);
    if (s->is_float || s->rank != 1 || s->n < 2 || s->n > 4 || allowzero)
        return ch_onnx_bad(m, "the target shape must be 2 to 4 integers (batch first)");
    int64_t t[4];
    int infer = -1;
    double known = 1;
    for (int i = 0; i < s->n; i++) {
        t[i] = s->i[i];
        if (t[i] == 0 && i < in_rank) t[i] = in[i];
        if (t[i] == -1) {
            if (infer >= 0) return ch_onnx_bad(m, "two dimensions of the target shape are -1");
            infer = i;
        } else if (i > 0 && (t[i] < 1 || t[i] > (1 << 30))) {
            return ch_onnx_bad(m, "target dimension %d is %lld", i, t[i] == CH_ONNX_BATCH ? -2LL : (long long)t[i]);
        } else if (i > 0) {
            known *= (double)t[i];
        }
    }
    if (t[0] != CH_ONNX_BATCH && infer != 0)
        return ch_onnx_bad(m, "reshapes to a batch of %lld, fixed when the model was exported: write x.view(x.size(0), -1) "
                   "or torch.flatten(x, 1)", (long long)t[0]);
    if (infer > 0) t[infer] = (int64_t)(per / known);
    if (infer > 0 ? fmod(per, known) != 0 : known != per)
        return ch_onnx_bad(m, "target shape does not hold the %.0f values of a sample", per);
    if (s->n == 2) {
        if (x->rank == 1) return ch_onnx_alias_out(m, v);
        return ch_onnx_tensor_out(m, ch_graph_flatten(m->g, ch_onnx_node_name(m, buf, sizeof buf), v->tensor));
    }
    if (s->n == in_rank && x->rank == 3 && t[1] == in[1] && t[2] == in[2] && t[3] == in[3]) return ch_onnx_alias_out(m, v);
    if (s->n == 4)
        return ch_onnx_tensor_out(m, ch_graph_view(m->g, ch_onnx_node_name(m, buf, sizeof buf), v->tensor, (int)t[1], (int)t[2],
                                           (int)t[3]));
    return ch_onnx_bad(m, "reshape of a (%d, %d, %d) sample to %d dimensions: cohort reshapes to (batch, features) or "
               "(batch, c, h, w) only", x->dims[0], x->dims[1], x->dims[2], s->n);
}

/* transpose(1, 2) of a (batch, g, m, h, w) view: the channel shuffle, whose output is the
 * (batch, m, g, h, w) view of the shuffled tensor. */
static ch_status transpose_groups(ch_onnx_imp *m, const ch_oval *v, const Onnx__AttributeProto *p)
{
    static const int64_t shuffle[5] = { 0, 2, 1, 3, 4 };
    bool ok = p && p->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS && p->n_ints == 5;
    for (int i = 0; ok && i < 5; i++) ok = p->ints[i] == shuffle[i];
    if (!ok)
        return ch_onnx_bad(m, "transpose of a (batch, %d, %d, h, w) view into channel groups: cohort imports only the "
                   "channel shuffle's, perm (0, 2, 1, 3, 4)", v->grouped[0], v->grouped[1]);
    char buf[CH_NODE_NAME_MAX];
    const int t = ch_graph_channel_shuffle(m->g, ch_onnx_node_name(m, buf, sizeof buf), v->tensor, v->grouped[0]);
    if (t < 0) return ch_onnx_tensor_out(m, t);
    return grouped_out(m, t, v->grouped[1], v->grouped[0]);
}

/* x.permute(0, a, b, c) of a (batch, c, h, w) tensor. (0, 2, 3, 1) and back are a mark, the values
 * staying, for the LayerNorm over channels they usually surround (see op_layernorm; another reader
 * makes the mark a node, and so does another order of a marked value, before its own node); any
 * other order is a permute node. */
static ch_status transpose_tensor(ch_onnx_imp *m, ch_oval *v, const Onnx__AttributeProto *p)
{
    const bool ints4 = p && p->type == ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS && p->n_ints == 4 &&
                       m->g->tensors[v->tensor].rank == 3;
    bool order = ints4 && p->ints[0] == 0;
    bool seen[4] = { true, false, false, false };
    for (int i = 1; order && i < 4; i++) {
        order = p->ints[i] >= 1 && p->ints[i] <= 3 && !seen[p->ints[i]];
        if (order) seen[p->ints[i]] = true;
    }
    if (!order)
        return ch_onnx_bad(m, "a transpose of a tensor: cohort imports x.permute(0, a, b, c) of a (batch, c, h, w) tensor, "
                   "the batch first, and the channel shuffle's");
    int perm[4];
    for (int i = 0; i < 4; i++) perm[i] = (int)p->ints[i];
    if (v->channels_last && perm[1] == 3 && perm[2] == 1 && perm[3] == 2) return ch_onnx_viewed_out(m, v->tensor, false);
    if (v->channels_last) CH_TRY(ch_onnx_tensor_val(m, 0, &v));
    if (perm[1] == 1 && perm[2] == 2 && perm[3] == 3) return ch_onnx_viewed_out(m, v->tensor, false);
    if (perm[1] == 2 && perm[2] == 3 && perm[3] == 1) return ch_onnx_viewed_out(m, v->tensor, true);
    char buf[CH_NODE_NAME_MAX];
    return ch_onnx_tensor_out(m, ch_graph_permute(m->g, ch_onnx_node_name(m, buf, sizeof buf), v->tensor, perm));
}

ch_status ch_onnx_op_transpose(ch_onnx_imp *m)
{
    ch_oval *v, *o;
    CH_TRY(ch_onnx_input(m, 0, true, &v));
    const Onnx__AttributeProto *p = ch_onnx_attr(m->node, "perm");
    if (v->kind == CH_OVAL_TENSOR && v->grouped[0]) return transpose_groups(m, v, p);
    if (v->kind == CH_OVAL_TENSOR) return transpose_tensor(m, v, p);
    if (v->kind != CH_OVAL_PARAM || v->init->n_dims != 2 || !p || p->n_ints != 2 || p->ints[0] != 1 || p->ints[1] != 0)
        return ch_onnx_bad(m, "only the transpose of a 2-D weight, read by MatMul (nn.Linear without bias), is supported");
    CH_TRY(ch_onnx_define(m, 0, CH_OVAL_PARAM_T, &o));
    o->init = v->init;
    return CH_STATUS_OK;
}

