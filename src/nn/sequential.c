/* Sequential container: children run in order; y is the last child's output.
 * Backward passes gradients between children through two ping-pong buffers taken from the run's
 * scratch stack, each sized to the largest child input it must hold. */
#include "nn/layer.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/trace.h"

static ch_status seq_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    (void)err;
    size_t most = 0;
    for (int i = 1; i < l->nchildren; i++) {
        size_t sz = ch_shape3_size(l->children[i]->in);
        if (sz > most) most = sz;
    }
    l->scratch_own = 2 * most * (size_t)pl->max_batch;
    /* An in-place child (ReLU) after one whose backward does not read its output (Conv2d,
     * BatchNorm2d, Linear) writes over that output: one activation less to keep, one pass less. */
    for (int i = 1; i < l->nchildren; i++) {
        ch_layer *prev = l->children[i - 1], *c = l->children[i];
        if (c->ops->in_place && prev->ops->y_unread_by_backward && prev->y_owned)
            ch_layer_borrow_output(c, prev->y);
    }
    l->y = l->nchildren ? l->children[l->nchildren - 1]->y : NULL;
    l->y_owned = false;
    return CH_STATUS_OK;
}

static void seq_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    const ch_real *cur = x;
    for (int i = 0; i < l->nchildren; i++) {
        l->children[i]->ops->forward(l->children[i], r, n, cur);
        cur = l->children[i]->y;
    }
}

static void seq_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                         ch_real *dx)
{
    const size_t half = l->scratch_own / 2;
    ch_real *buf[2] = { r->scratch, r->scratch + half };
    const ch_run above = ch_run_above(r, l);
    const ch_real *g = dy;
    for (int i = l->nchildren - 1; i >= 0; i--) {
        ch_layer *c = l->children[i];
        const ch_real *cx = i > 0 ? l->children[i - 1]->y : x;
        ch_real *cdx = i > 0 ? buf[i & 1] : dx;
        const int64_t t0 = r->trace ? ch_trace_now() : 0;
        c->ops->backward(c, &above, n, cx, g, cdx);
        if (r->trace) {
            char name[56];
            snprintf(name, sizeof name, "%s %s", c->name, c->ops->kind);
            ch_trace_span(r->trace, "backward", name, t0, -1);
        }
        g = cdx;
    }
}

static const ch_layer_ops seq_ops = {
    .kind = "Sequential", .plan = seq_plan, .forward = seq_forward, .backward = seq_backward,
};

ch_status ch_sequential_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err)
{
    ch_layer *l = ch_layer_alloc(&seq_ops, name, in, in);
    CH_CHECK_ALLOC(err, l);
    *out = l;
    return CH_STATUS_OK;
}

ch_status ch_sequential_append(ch_layer *seq, ch_layer *child, ch_err *err)
{
    const ch_shape3 a = seq->out, b = child->in;
    if (a.c != b.c || a.h != b.h || a.w != b.w) {
        ch_status st = ch_fail(err, CH_STATUS_BAD_INPUT,
                               "sequential %s: child %s expects %dx%dx%d, previous output is %dx%dx%d",
                               seq->name, child->name, b.c, b.h, b.w, a.c, a.h, a.w);
        ch_layer_free(child);
        return st;
    }
    const ch_shape3 out = child->out;
    CH_TRY(ch_layer_add_child(seq, child, err));
    seq->out = out;
    return CH_STATUS_OK;
}
