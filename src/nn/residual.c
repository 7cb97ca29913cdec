/* Residual blocks: z = bn2(conv2(relu(bn1(conv1(x))))), s = shortcut(x) or x, y = relu(z + s);
 * conv1 is 3x3 with the block's stride, conv2 3x3 stride 1. Two kinds, the same computation:
 *  - reference program D's (d2l's Residual): convs with biases, the shortcut a 1x1 conv with the
 *    stride named conv3; children in its registration order conv1, conv2, conv3, bn1, bn2;
 *  - torchvision's BasicBlock (resnet18-imagenet): convs without biases, the shortcut
 *    downsample = Sequential(1x1 conv with the stride, BatchNorm) where the shape changes; children
 *    conv1, bn1, conv2, bn2, downsample.
 * Children order is the order of the flat buffers and of the state_dict.
 * Memory: only what backward cannot do without is kept between forward and backward.
 *  - bn2 writes into y, where the shortcut is added and ReLU runs in place (BatchNorm's backward
 *    reads its input, not its output).
 *  - a1 = relu(bn1(conv1(x))) is not kept: forward writes it into the run's scratch, and backward
 *    recomputes it from conv1's output with bn1's saved scale and shift (the same bits), one
 *    elementwise pass against a GEMM-bound step (resnet18 batch 256: 188 MiB less).
 *  - backward writes gradients over what is dead by then: dz (the gradient at z + s) over dy,
 *    bn2's and bn1's input gradients over their inputs (conv2's and conv1's outputs). */
#include "nn/layer.h"

#include <stdlib.h>

typedef struct res_impl {
    ch_layer *conv1, *conv2, *shortcut, *bn1, *bn2;   /* borrowed from children; shortcut may be NULL */
    size_t slot;        /* elements of one scratch slot: (max_batch, larger of in and out) */
} res_impl;

/* Two scratch slots: a1, and a gradient (conv2's input gradient, then the shortcut's). */
static ch_status res_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    res_impl *r = l->impl;
    const size_t in = ch_shape3_size(l->in), out = ch_shape3_size(l->out);
    r->slot = (in > out ? in : out) * (size_t)pl->max_batch;
    CH_TRY(ch_layer_alloc_output(l, pl->max_batch, err));
    ch_layer_borrow_output(r->bn1, NULL);   /* pointed into the scratch at each call */
    ch_layer_borrow_output(r->bn2, l->y);
    CH_ASSERT(!r->bn2->ops->overwrites_dy);   /* dz is read again by the shortcut's backward */
    l->scratch_own = 2 * r->slot;
    return CH_STATUS_OK;
}

/* a1's place for this call: the run's first slot, where bn1 writes its output. */
static ch_real *inner_activation(const res_impl *r, const ch_run *run)
{
    r->bn1->y = run->scratch;
    return run->scratch;
}

static void run_fwd(ch_layer *c, const ch_run *run, int n, const ch_real *x)
{
    c->ops->forward(c, run, n, x);
}

static void res_forward(ch_layer *l, const ch_run *run, int n, const ch_real *x)
{
    res_impl *r = l->impl;
    const size_t len = ch_shape3_size(l->out) * (size_t)n;
    const ch_run above = ch_run_above(run, l), *a = &above;
    ch_real *a1 = inner_activation(r, run);
    run_fwd(r->conv1, a, n, x);
    run_fwd(r->bn1, a, n, r->conv1->y);
    run->k->relu_forward(&run->kc, len, a1, a1);
    run_fwd(r->conv2, a, n, a1);
    run_fwd(r->bn2, a, n, r->conv2->y);
    const ch_real *shortcut = x;
    if (r->shortcut) {
        run_fwd(r->shortcut, a, n, x);
        shortcut = r->shortcut->y;
    }
    run->k->add(&run->kc, len, l->y, shortcut, l->y);    /* bn2->y is y */
    run->k->relu_forward(&run->kc, len, l->y, l->y);
}

static void res_backward(ch_layer *l, const ch_run *run, int n, const ch_real *x,
                         const ch_real *dy, ch_real *dx)
{
    res_impl *r = l->impl;
    const size_t len = ch_shape3_size(l->out) * (size_t)n;
    const ch_run above = ch_run_above(run, l), *a = &above;
    ch_real *a1 = inner_activation(r, run), *t = a1 + r->slot;
    ch_real *dz = (ch_real *)dy, *d2 = r->conv2->y, *d1 = r->conv1->y;   /* overwritten */
    run->k->relu_backward(&run->kc, len, l->y, dy, dz);
    r->bn2->ops->backward(r->bn2, a, n, r->conv2->y, dz, d2);
    ch_batchnorm2d_reapply(r->bn1, run, n, r->conv1->y, a1);
    run->k->relu_forward(&run->kc, len, a1, a1);
    r->conv2->ops->backward(r->conv2, a, n, a1, d2, t);
    run->k->relu_backward(&run->kc, len, a1, t, t);
    r->bn1->ops->backward(r->bn1, a, n, r->conv1->y, t, d1);
    r->conv1->ops->backward(r->conv1, a, n, x, d1, dx);
    if (r->shortcut) {
        r->shortcut->ops->backward(r->shortcut, a, n, x, dz, dx ? t : NULL);
        if (dx) run->k->add(&run->kc, ch_shape3_size(l->in) * (size_t)n, dx, t, dx);
    } else if (dx) {
        run->k->add(&run->kc, len, dx, dz, dx);
    }
}

static const ch_layer_ops res_ops = {
    .kind = "Residual", .plan = res_plan, .forward = res_forward, .backward = res_backward,
    .overwrites_dy = true,
};

static const ch_layer_ops basic_ops = {
    .kind = "BasicBlock", .plan = res_plan, .forward = res_forward, .backward = res_backward,
    .overwrites_dy = true,
};

/* The block shell with its impl; frees conv1 on failure. */
static ch_status shell(const ch_layer_ops *ops, const char *name, ch_shape3 in, ch_layer *c1,
                       ch_layer **out, res_impl **impl, ch_err *err)
{
    *out = NULL;
    ch_layer *l = ch_layer_alloc(ops, name, in, c1->out);
    res_impl *r = calloc(1, sizeof *r);
    if (!l || !r) {
        free(r);
        ch_layer_free(l);
        ch_layer_free(c1);
        return CH_SYS_FAIL(err, "calloc of a residual block");
    }
    l->impl = r;
    *out = l;
    *impl = r;
    return ch_layer_add_child(l, c1, err);
}

/* Append c (made with status st; freed by the parent on failure) and record it in *slot. */
static ch_status child(ch_layer *l, ch_status st, ch_layer *c, ch_layer **slot, ch_err *err)
{
    if (st != CH_STATUS_OK) return st;
    *slot = c;
    return ch_layer_add_child(l, c, err);
}

/* torchvision's downsample: Sequential(0: 1x1 conv with the stride, no bias; 1: BatchNorm). */
static ch_status downsample(ch_shape3 in, int out_channels, int stride, ch_layer **out, ch_err *err)
{
    ch_layer *seq, *conv = NULL, *bn = NULL;
    CH_TRY(ch_sequential_create("downsample", in, &seq, err));
    ch_status st = ch_conv2d_create("0", in, out_channels, 1, stride, 0, false, &conv, err);
    if (st == CH_STATUS_OK) st = ch_sequential_append(seq, conv, err);
    if (st == CH_STATUS_OK) st = ch_batchnorm2d_create("1", conv->out, &bn, err);
    if (st == CH_STATUS_OK) st = ch_sequential_append(seq, bn, err);
    if (st != CH_STATUS_OK) {
        ch_layer_free(seq);
        return st;
    }
    *out = seq;
    return CH_STATUS_OK;
}

ch_status ch_basicblock_create(const char *name, ch_shape3 in, int out_channels, int stride,
                               ch_layer **out, ch_err *err)
{
    ch_layer *c1, *l = NULL, *c = NULL;
    res_impl *r = NULL;
    CH_TRY(ch_conv2d_create("conv1", in, out_channels, 3, stride, 1, false, &c1, err));
    ch_status st = shell(&basic_ops, name, in, c1, &l, &r, err);
    if (!l) return st;
    r->conv1 = c1;
    /* One statement per child: c must be made before it is passed on. */
    if (st == CH_STATUS_OK) {
        const ch_status made = ch_batchnorm2d_create("bn1", c1->out, &c, err);
        st = child(l, made, c, &r->bn1, err);
    }
    if (st == CH_STATUS_OK) {
        const ch_status made = ch_conv2d_create("conv2", c1->out, out_channels, 3, 1, 1, false, &c, err);
        st = child(l, made, c, &r->conv2, err);
    }
    if (st == CH_STATUS_OK) {
        const ch_status made = ch_batchnorm2d_create("bn2", c1->out, &c, err);
        st = child(l, made, c, &r->bn2, err);
    }
    if (st == CH_STATUS_OK && (stride != 1 || in.c != out_channels)) {
        const ch_status made = downsample(in, out_channels, stride, &c, err);
        st = child(l, made, c, &r->shortcut, err);
    }
    if (st != CH_STATUS_OK) {
        ch_layer_free(l);
        return st;
    }
    *out = l;
    return CH_STATUS_OK;
}

ch_status ch_residual_create(const char *name, ch_shape3 in, int out_channels, bool use_1x1conv,
                             int stride, ch_layer **out, ch_err *err)
{
    if (!use_1x1conv && (stride != 1 || in.c != out_channels))
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "residual %s: without a 1x1 conv the shortcut needs stride 1 and %d == %d "
                       "channels", name, in.c, out_channels);
    ch_layer *c1, *c2 = NULL, *c3 = NULL, *b1 = NULL, *b2 = NULL, *l = NULL;
    res_impl *r = NULL;
    CH_TRY(ch_conv2d_create("conv1", in, out_channels, 3, stride, 1, true, &c1, err));
    ch_status st = shell(&res_ops, name, in, c1, &l, &r, err);
    if (!l) return st;
    if (st == CH_STATUS_OK) st = ch_conv2d_create("conv2", c1->out, out_channels, 3, 1, 1, true, &c2, err);
    if (st == CH_STATUS_OK) st = ch_layer_add_child(l, c2, err);
    if (st == CH_STATUS_OK && use_1x1conv) {
        st = ch_conv2d_create("conv3", in, out_channels, 1, stride, 0, true, &c3, err);
        if (st == CH_STATUS_OK) st = ch_layer_add_child(l, c3, err);
    }
    if (st == CH_STATUS_OK) st = ch_batchnorm2d_create("bn1", c1->out, &b1, err);
    if (st == CH_STATUS_OK) st = ch_layer_add_child(l, b1, err);
    if (st == CH_STATUS_OK) st = ch_batchnorm2d_create("bn2", c1->out, &b2, err);
    if (st == CH_STATUS_OK) st = ch_layer_add_child(l, b2, err);
    if (st != CH_STATUS_OK) {
        ch_layer_free(l);
        return st;
    }
    *r = (res_impl){ .conv1 = c1, .conv2 = c2, .shortcut = c3, .bn1 = b1, .bn2 = b2 };
    *out = l;
    return CH_STATUS_OK;
}
