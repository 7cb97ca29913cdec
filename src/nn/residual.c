/* Reference program D's residual block (d2l's Residual):
 *   z = bn2(conv2(relu(bn1(conv1(x)))));  s = conv3(x) if use_1x1conv else x;  y = relu(z + s)
 * conv1 is 3x3 with the block's stride, conv2 3x3 stride 1, conv3 1x1 with the stride; all convs
 * have biases. Children are kept in PyTorch's registration order (conv1, conv2, conv3, bn1, bn2), which
 * is also the order of the flat buffers and of the state_dict. */
#include "nn/layer.h"

#include <stdlib.h>

typedef struct res_impl {
    ch_layer *conv1, *conv2, *conv3, *bn1, *bn2;   /* borrowed from children */
    ch_real *a1;        /* relu(bn1(.)) (n, out) */
    ch_real *dz;        /* gradient at z + s (n, out) */
    ch_real *s1, *s2;   /* gradient scratch (n, out) */
    ch_real *s3;        /* shortcut input gradient (n, in), with conv3 only */
} res_impl;

static ch_status res_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    res_impl *r = l->impl;
    const size_t out = ch_shape3_size(l->out) * (size_t)pl->max_batch;
    r->a1 = malloc(sizeof(ch_real) * out * 4);
    CH_CHECK_ALLOC(err, r->a1);
    r->dz = r->a1 + out;
    r->s1 = r->dz + out;
    r->s2 = r->s1 + out;
    if (r->conv3) {
        r->s3 = malloc(sizeof(ch_real) * ch_shape3_size(l->in) * (size_t)pl->max_batch);
        CH_CHECK_ALLOC(err, r->s3);
    }
    return ch_layer_alloc_output(l, pl->max_batch, err);
}

static void res_free(ch_layer *l)
{
    res_impl *r = l->impl;
    if (!r) return;
    free(r->a1);
    free(r->s3);
}

static void run_fwd(ch_layer *c, const ch_run *run, int n, const ch_real *x)
{
    c->ops->forward(c, run, n, x);
}

static void res_forward(ch_layer *l, const ch_run *run, int n, const ch_real *x)
{
    res_impl *r = l->impl;
    const size_t len = ch_shape3_size(l->out) * (size_t)n;
    run_fwd(r->conv1, run, n, x);
    run_fwd(r->bn1, run, n, r->conv1->y);
    run->k->relu_forward(&run->kc, len, r->bn1->y, r->a1);
    run_fwd(r->conv2, run, n, r->a1);
    run_fwd(r->bn2, run, n, r->conv2->y);
    const ch_real *shortcut = x;
    if (r->conv3) {
        run_fwd(r->conv3, run, n, x);
        shortcut = r->conv3->y;
    }
    run->k->add(&run->kc, len, r->bn2->y, shortcut, l->y);
    run->k->relu_forward(&run->kc, len, l->y, l->y);
}

static void res_backward(ch_layer *l, const ch_run *run, int n, const ch_real *x,
                         const ch_real *dy, ch_real *dx)
{
    res_impl *r = l->impl;
    const size_t len = ch_shape3_size(l->out) * (size_t)n;
    run->k->relu_backward(&run->kc, len, l->y, dy, r->dz);
    r->bn2->ops->backward(r->bn2, run, n, r->conv2->y, r->dz, r->s1);
    r->conv2->ops->backward(r->conv2, run, n, r->a1, r->s1, r->s2);
    run->k->relu_backward(&run->kc, len, r->a1, r->s2, r->s2);
    r->bn1->ops->backward(r->bn1, run, n, r->conv1->y, r->s2, r->s1);
    r->conv1->ops->backward(r->conv1, run, n, x, r->s1, dx);
    if (r->conv3) {
        r->conv3->ops->backward(r->conv3, run, n, x, r->dz, dx ? r->s3 : NULL);
        if (dx) run->k->add(&run->kc, ch_shape3_size(l->in) * (size_t)n, dx, r->s3, dx);
    } else if (dx) {
        run->k->add(&run->kc, len, dx, r->dz, dx);
    }
}

static const ch_layer_ops res_ops = {
    .kind = "Residual", .plan = res_plan, .forward = res_forward, .backward = res_backward,
    .free_impl = res_free,
};

ch_status ch_residual_create(const char *name, ch_shape3 in, int out_channels, bool use_1x1conv,
                             int stride, ch_layer **out, ch_err *err)
{
    if (!use_1x1conv && (stride != 1 || in.c != out_channels))
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "residual %s: without a 1x1 conv the shortcut needs stride 1 and %d == %d "
                       "channels", name, in.c, out_channels);
    ch_layer *c1, *c2 = NULL, *c3 = NULL, *b1 = NULL, *b2 = NULL;
    CH_TRY(ch_conv2d_create("conv1", in, out_channels, 3, stride, 1, true, &c1, err));
    ch_layer *l = ch_layer_alloc(&res_ops, name, in, c1->out);
    res_impl *r = calloc(1, sizeof *r);
    if (!l || !r) {
        free(r);
        ch_layer_free(l);
        ch_layer_free(c1);
        return CH_SYS_FAIL(err, "calloc of residual");
    }
    l->impl = r;
    ch_status st = ch_layer_add_child(l, c1, err);
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
    *r = (res_impl){ .conv1 = c1, .conv2 = c2, .conv3 = c3, .bn1 = b1, .bn2 = b2 };
    *out = l;
    return CH_STATUS_OK;
}
