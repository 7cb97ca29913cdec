/* Sequential container: children run in order; y is the last child's output.
 * Backward runs the chain of leaves: a child that is itself a Sequential is opened up into its
 * children (recursively), so nested Sequentials (resnet18's stages) add no buffers of their own,
 * and a ReLU absorbed by the convolution before it is left out.
 * Gradients pass between consecutive leaves through ping-pong buffers taken from the run's scratch
 * stack, sized to the largest leaf input they must hold; one buffer when the chain has two leaves. */
#include "nn/layer.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/trace.h"

typedef struct seq_impl {
    ch_layer **chain;   /* the leaves in forward order (borrowed), nested Sequentials opened up */
    int nchain;
    bool inlined;       /* a parent Sequential runs this one's leaves: its backward is not called */
} seq_impl;

static const ch_layer_ops seq_ops;

static bool is_sequential(const ch_layer *l) { return l->ops == &seq_ops; }

/* Build l's chain from its children's (already planned, so nested chains exist). */
static ch_status build_chain(ch_layer *l, ch_err *err)
{
    seq_impl *s = l->impl;
    int len = 0;
    for (int i = 0; i < l->nchildren; i++) {
        const ch_layer *c = l->children[i];
        len += is_sequential(c) ? ((const seq_impl *)c->impl)->nchain : 1;
    }
    s->chain = malloc(sizeof *s->chain * (size_t)(len ? len : 1));
    CH_CHECK_ALLOC(err, s->chain);
    s->nchain = 0;
    for (int i = 0; i < l->nchildren; i++) {
        ch_layer *c = l->children[i];
        if (!is_sequential(c)) {
            if (!c->absorbed) s->chain[s->nchain++] = c;
            continue;
        }
        seq_impl *cs = c->impl;
        for (int j = 0; j < cs->nchain; j++) s->chain[s->nchain++] = cs->chain[j];
        /* The nested one's buffers are never used: what it needs above it is its children's most. */
        cs->inlined = true;
        c->scratch_own = 0;
        c->scratch_need = ch_layer_children_need(c);
    }
    return CH_STATUS_OK;
}

static ch_status seq_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    /* A ReLU after a layer that can absorb it (Conv2d) is done by that layer, in forward while
     * each group of its output is in cache and in backward on dy: two passes over memory less.
     * Otherwise an in-place child (ReLU) after one whose backward does not read its output
     * (BatchNorm2d, Linear) writes over that output: one activation less to keep. */
    for (int i = 1; i < l->nchildren; i++) {
        ch_layer *prev = l->children[i - 1], *c = l->children[i];
        if (!prev->y_owned) continue;
        if (ch_layer_is_relu(c) && prev->ops->absorb_relu && prev->ops->absorb_relu(prev)) {
            ch_layer_borrow_output(c, prev->y);
            c->absorbed = true;
        } else if (c->ops->in_place && prev->ops->y_unread_by_backward) {
            ch_layer_borrow_output(c, prev->y);
        }
    }
    CH_TRY(build_chain(l, err));
    const seq_impl *s = l->impl;
    size_t most = 0;
    for (int i = 1; i < s->nchain; i++) {
        size_t sz = ch_shape3_size(s->chain[i]->in);
        if (sz > most) most = sz;
    }
    const size_t nbuf = s->nchain > 2 ? 2 : s->nchain == 2 ? 1 : 0;
    l->scratch_own = nbuf * most * (size_t)pl->max_batch;
    l->y = l->nchildren ? l->children[l->nchildren - 1]->y : NULL;
    l->y_owned = false;
    return CH_STATUS_OK;
}

static void seq_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    const ch_real *cur = x;
    for (int i = 0; i < l->nchildren; i++) {
        ch_layer *c = l->children[i];
        if (!c->absorbed) c->ops->forward(c, r, n, cur);
        cur = c->y;
    }
}

static void seq_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                         ch_real *dx)
{
    const seq_impl *s = l->impl;
    CH_ASSERT(!s->inlined);
    const size_t half = s->nchain > 2 ? l->scratch_own / 2 : 0;
    ch_real *buf[2] = { r->scratch, r->scratch + half };
    const ch_run above = ch_run_above(r, l);
    const ch_real *g = dy;
    for (int i = s->nchain - 1; i >= 0; i--) {
        ch_layer *c = s->chain[i];
        const ch_real *cx = i > 0 ? s->chain[i - 1]->y : x;
        ch_real *cdx = i > 0 ? buf[i & 1] : dx;
        const int64_t t0 = r->trace ? ch_trace_now() : 0;
        c->ops->backward(c, &above, n, cx, g, cdx);
        if (r->trace) {
            char name[56];
            snprintf(name, sizeof name, "%.40s %s", c->name, c->ops->kind);
            ch_trace_span(r->trace, "backward", name, t0, -1);
        }
        g = cdx;
    }
}

static void seq_free(ch_layer *l)
{
    seq_impl *s = l->impl;
    if (s) free(s->chain);
}

static const ch_layer_ops seq_ops = {
    .kind = "Sequential", .plan = seq_plan, .forward = seq_forward, .backward = seq_backward,
    .free_impl = seq_free, .overwrites_dy = true,
};

ch_status ch_sequential_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err)
{
    ch_layer *l = ch_layer_alloc(&seq_ops, name, in, in);
    CH_CHECK_ALLOC(err, l);
    l->impl = calloc(1, sizeof(seq_impl));
    if (!l->impl) {
        ch_layer_free(l);
        return CH_SYS_FAIL(err, "calloc of a sequential");
    }
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
