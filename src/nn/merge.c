/* Layers of several inputs: a + b and a * b with broadcasting (a residual sum, a
 * squeeze-excitation gate) and the channel concatenation (DenseNet). They run only inside a graph,
 * which hands them their inputs (forward_multi) and sums the gradients they return. */
#include "nn/layer.h"

#include <stdlib.h>
#include <string.h>

static ch_status own_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    return ch_layer_alloc_output(l, pl, err);
}

/* ---- a op b ---- */

static bool same_dims(const int a[3], const int b[3])
{
    return a[0] == b[0] && a[1] == b[1] && a[2] == b[2];
}

/* Both operands of the output's shape (a residual sum): a plain elementwise add. */
static bool plain_add(const ch_bcast_desc *d)
{
    return d->op == CH_BCAST_ADD && same_dims(d->a, d->out) && same_dims(d->b, d->out);
}

static void bcast_forward(ch_layer *l, const ch_run *r, int n, const ch_real *const *xs)
{
    const ch_bcast_desc *d = l->impl;
    /* Equal shapes: the plain sum (a residual block's) without index arithmetic. */
    if (plain_add(d))
        r->k->add(&r->kc, ch_shape3_size(l->out) * (size_t)n, xs[0], xs[1], l->y);
    else
        r->k->bcast_forward(&r->kc, d, n, xs[0], xs[1], l->y);
}

static void bcast_backward(ch_layer *l, const ch_run *r, int n, const ch_real *const *xs,
                           const ch_real *dy, ch_real *const *dxs)
{
    const ch_bcast_desc *d = l->impl;
    if (plain_add(d)) {
        /* Both gradients are dy: copies, not a reduction per element. */
        const size_t len = ch_shape3_size(l->out);
        for (int i = 0; i < 2; i++)
            if (dxs[i] && dxs[i] != dy) r->k->copy_rows(&r->kc, n, len, dy, len, dxs[i], len);
        return;
    }
    r->k->bcast_backward(&r->kc, d, n, xs[0], xs[1], dy, dxs[0], dxs[1]);
}

/* Neither backward reads y (mul's reads its inputs): a ReLU after them may run in place. */
static const ch_layer_ops add_ops = {
    .kind = "Add", .plan = own_plan, .forward_multi = bcast_forward, .backward_multi = bcast_backward,
    .y_unread_by_backward = true,
};
static const ch_layer_ops mul_ops = {
    .kind = "Mul", .plan = own_plan, .forward_multi = bcast_forward, .backward_multi = bcast_backward,
    .y_unread_by_backward = true,
};

bool ch_layer_is_plain_add(const ch_layer *l)
{
    return l->ops == &add_ops && plain_add(l->impl);
}

/* A shell with n input shapes (copied). */
static ch_status multi_alloc(const ch_layer_ops *ops, const char *name, const ch_shape3 *ins, int n,
                             ch_shape3 out_shape, size_t impl_size, ch_layer **out, ch_err *err)
{
    ch_layer *l = ch_layer_alloc(ops, name, ins[0], out_shape);
    if (l) {
        l->ins = malloc(sizeof *l->ins * (size_t)n);
        l->impl = calloc(1, impl_size);
    }
    if (!l || !l->ins || !l->impl) {
        ch_layer_free(l);
        return CH_SYS_FAIL(err, "allocation of a multi-input layer");
    }
    memcpy(l->ins, ins, sizeof *ins * (size_t)n);
    l->nin = n;
    *out = l;
    return CH_STATUS_OK;
}

ch_status ch_bcast_create(const char *name, ch_bcast_op op, const int a[3], const int b[3],
                          ch_shape3 out_shape, ch_layer **out, ch_err *err)
{
    const int o[3] = { out_shape.c, out_shape.h, out_shape.w };
    for (int i = 0; i < 3; i++)
        if ((a[i] != o[i] && a[i] != 1) || (b[i] != o[i] && b[i] != 1))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %s: shapes %dx%dx%d and %dx%dx%d do not "
                           "broadcast to %dx%dx%d", op == CH_BCAST_ADD ? "add" : "mul", name, a[0],
                           a[1], a[2], b[0], b[1], b[2], o[0], o[1], o[2]);
    const ch_shape3 ins[2] = { { a[0], a[1], a[2] }, { b[0], b[1], b[2] } };
    CH_TRY(multi_alloc(op == CH_BCAST_ADD ? &add_ops : &mul_ops, name, ins, 2, out_shape,
                       sizeof(ch_bcast_desc), out, err));
    ch_bcast_desc *d = (*out)->impl;
    d->op = op;
    memcpy(d->out, o, sizeof o);
    memcpy(d->a, a, sizeof d->a);
    memcpy(d->b, b, sizeof d->b);
    return CH_STATUS_OK;
}

/* ---- concat over channels ---- */

static void concat_forward(ch_layer *l, const ch_run *r, int n, const ch_real *const *xs)
{
    const size_t hw = (size_t)l->out.h * l->out.w, ys = ch_shape3_size(l->out);
    size_t off = 0;
    for (int i = 0; i < l->nin; i++) {
        const size_t len = (size_t)l->ins[i].c * hw;
        r->k->copy_rows(&r->kc, n, len, xs[i], len, l->y + off, ys);
        off += len;
    }
}

static void concat_backward(ch_layer *l, const ch_run *r, int n, const ch_real *const *xs,
                            const ch_real *dy, ch_real *const *dxs)
{
    (void)xs;
    const size_t hw = (size_t)l->out.h * l->out.w, ys = ch_shape3_size(l->out);
    size_t off = 0;
    for (int i = 0; i < l->nin; i++) {
        const size_t len = (size_t)l->ins[i].c * hw;
        if (dxs[i]) r->k->copy_rows(&r->kc, n, len, dy + off, ys, dxs[i], len);
        off += len;
    }
}

static const ch_layer_ops concat_ops = {
    .kind = "Concat", .plan = own_plan, .forward_multi = concat_forward,
    .backward_multi = concat_backward, .y_unread_by_backward = true,
};

ch_status ch_concat_create(const char *name, const ch_shape3 *ins, int n, ch_layer **out,
                           ch_err *err)
{
    if (n < 1)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "concat %s: no inputs", name);
    long c = 0;
    for (int i = 0; i < n; i++) {
        if (ins[i].h != ins[0].h || ins[i].w != ins[0].w)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "concat %s: input %d is %dx%d, input 0 %dx%d: "
                           "only channels may differ", name, i, ins[i].h, ins[i].w, ins[0].h,
                           ins[0].w);
        c += ins[i].c;
    }
    if (c > 1 << 20)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "concat %s: %ld channels", name, c);
    return multi_alloc(&concat_ops, name, ins, n, (ch_shape3){ (int)c, ins[0].h, ins[0].w }, 1, out,
                       err);
}
