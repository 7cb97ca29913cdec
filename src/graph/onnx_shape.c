/* The ONNX importer's shape operators (Shape, Gather, Squeeze, Unsqueeze, Concat, Slice): what
 * PyTorch emits around x.view(x.size(0), -1), y[:, :, None, None] or a Resize's scales is folded
 * into constants and views, not run; Concat of tensors is the channel concatenation, Slice of
 * tensors the channel slice (x.chunk, x.split, x[:, a:b]). */
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
