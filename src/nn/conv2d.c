/* Conv2d: weight (oc, c, k, k), optional bias (oc). ConvTranspose2d: the adjoint of a convolution
 * from its output to its input (its "mirror"), so the three convolution kernels run it with the
 * roles of forward and backward data swapped; weight (c, oc / groups, k, k) as PyTorch keeps it.
 * Arithmetic in the kernel table. */
#include "nn/layer.h"

#include <stdlib.h>

typedef struct conv_impl {
    ch_conv_desc d;
    bool bias;
    uint16_t *out16;   /* NULL, or where forward writes y rounded to bf16 instead of l->y */
    bool x16;          /* x is bf16 (a BatchNorm + ReLU output kept so: ch_conv2d_input_bf16) */
    const uint16_t *dy16;   /* NULL, or where backward reads dy in bf16 (ch_conv2d_grad_bf16) */
} conv_impl;

static ch_status conv_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    conv_impl *c = l->impl;
    c->d.bf16 = pl->bf16;
    pl->convs++;
    const ch_kctx kc = ch_plan_kctx(pl);
    if (pl->bf16 && pl->k->conv2d_in_bf16 && pl->k->conv2d_in_bf16(&kc, &c->d, pl->max_batch))
        pl->bf16_convs++;
    size_t need = pl->k->conv2d_workspace(&kc, &c->d, pl->max_batch);
    if (need > pl->ws_need) pl->ws_need = need;
    ch_layer_release(l, c->d.keep);   /* a layer planned again */
    c->d.keep = NULL;
    const size_t keep = pl->k->conv2d_keep_bytes ? pl->k->conv2d_keep_bytes(&kc, &c->d, pl->max_batch) : 0;
    if (keep) {   /* the backend's alloc gives zeros: nothing kept yet */
        c->d.keep = ch_layer_alloc_saved(l, pl, keep, 1, err);
        if (!c->d.keep) return CH_STATUS_SYSTEM;
        pl->keep_bytes += keep;
    }
    return ch_layer_alloc_output(l, pl, err);
}

static void conv_free(ch_layer *l)
{
    conv_impl *c = l->impl;
    if (c) ch_layer_release(l, c->d.keep);
}

static void conv_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    conv_impl *c = l->impl;
    if (c->x16) {
        r->k->conv2d_forward_of_bf16(&r->kc, &c->d, n, (const uint16_t *)x, l->p[0], c->bias ? l->p[1] : NULL,
                                     c->out16 ? NULL : l->y, c->out16);
        return;
    }
    if (c->out16) {
        r->k->conv2d_forward_bf16(&r->kc, &c->d, n, x, l->p[0], c->bias ? l->p[1] : NULL, c->out16);
        return;
    }
    r->k->conv2d_forward(&r->kc, &c->d, n, x, l->p[0], c->bias ? l->p[1] : NULL, l->y);
}

/* With a fused ReLU, backward weights masks dy in place first (the ReLU's backward), and backward
 * data then reads the masked dy. Where the backend does both in one pass (conv2d_backward), the
 * gradients are reported ready after both, a data pass later than apart. */
static void conv_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                          ch_real *dx)
{
    conv_impl *c = l->impl;
    CH_ASSERT(!c->d.relu || dy != l->y);
    ch_real *db = c->bias ? l->g[1] : NULL;
    if (c->dy16) {
        r->k->conv2d_backward_dy_bf16(&r->kc, &c->d, n, c->x16 ? NULL : x, c->x16 ? (const uint16_t *)x : NULL,
                                      c->dy16, l->p[0], dx, l->g[0], db);
        ch_run_grads_ready(r, l);
        return;
    }
    if (c->x16) {
        r->k->conv2d_backward_of_bf16(&r->kc, &c->d, n, (const uint16_t *)x, l->y, (ch_real *)dy, l->p[0], dx,
                                      l->g[0], db);
        ch_run_grads_ready(r, l);
        return;
    }
    if (dx && r->k->conv2d_backward &&
        r->k->conv2d_backward(&r->kc, &c->d, n, x, l->y, (ch_real *)dy, l->p[0], dx, l->g[0], db)) {
        ch_run_grads_ready(r, l);
        return;
    }
    r->k->conv2d_backward_weights(&r->kc, &c->d, n, x, l->y, (ch_real *)dy, l->g[0], db);
    ch_run_grads_ready(r, l);
    if (dx) r->k->conv2d_backward_data(&r->kc, &c->d, n, dy, l->p[0], dx);
}

static bool conv_absorb_relu(ch_layer *l)
{
    conv_impl *c = l->impl;
    c->d.relu = true;
    return true;
}

bool ch_conv2d_output_bf16(ch_layer *l, const ch_plan *pl, uint16_t *y)
{
    if (l->ops->plan != conv_plan) return false;
    conv_impl *c = l->impl;
    const ch_kctx kc = ch_plan_kctx(pl);
    if (c->d.relu || !pl->k->conv2d_out_bf16 || !pl->k->conv2d_forward_bf16 ||
        !pl->k->conv2d_out_bf16(&kc, &c->d, pl->max_batch))
        return false;
    c->out16 = y;
    return true;
}

bool ch_conv2d_input_bf16(ch_layer *l, const ch_plan *pl)
{
    if (l->ops->plan != conv_plan) return false;
    conv_impl *c = l->impl;
    const ch_kctx kc = ch_plan_kctx(pl);
    const ch_kernels *k = pl->k;
    if (!k->conv2d_x_bf16 || !k->conv2d_forward_of_bf16 || !k->conv2d_backward_of_bf16 ||
        !k->conv2d_x_bf16(&kc, &c->d, pl->max_batch))
        return false;
    c->x16 = true;
    return true;
}

bool ch_conv2d_grad_bf16(ch_layer *l, const ch_plan *pl, const uint16_t *dy)
{
    if (l->ops->plan != conv_plan) return false;
    conv_impl *c = l->impl;
    const ch_kctx kc = ch_plan_kctx(pl);
    const ch_kernels *k = pl->k;
    if (c->d.relu || !k->conv2d_dy_bf16 || !k->conv2d_backward_dy_bf16 || !k->conv2d_dy_bf16(&kc, &c->d, pl->max_batch))
        return false;
    c->dy16 = dy;
    return true;
}

static const ch_layer_ops conv_ops = {
    .kind = "Conv2d", .plan = conv_plan, .forward = conv_forward, .backward = conv_backward, .free_impl = conv_free,
    .y_unread_by_backward = true,   /* unless it absorbed a ReLU, whose output y then is */
    .absorb_relu = conv_absorb_relu, .overwrites_dy = true,
};

ch_status ch_conv2d_create_opts(const char *name, ch_shape3 in, const ch_conv2d_opts *o,
                                ch_layer **out, ch_err *err)
{
    const int D = o->dilation, G = o->groups, k = o->kernel, ke = D * (k - 1) + 1;
    if (o->out_channels <= 0 || k <= 0 || o->stride <= 0 || D <= 0 || G <= 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "conv %s: out_channels %d, kernel %d, stride %d, "
                       "dilation %d and groups %d must be positive", name, o->out_channels, k,
                       o->stride, D, G);
    if (in.c % G != 0 || o->out_channels % G != 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "conv %s: %d input and %d output channels do not "
                       "divide into %d groups", name, in.c, o->out_channels, G);
    const int oh = ch_window_out(in.h, ke, o->stride, o->pad), ow = ch_window_out(in.w, ke, o->stride, o->pad);
    if (oh <= 0 || ow <= 0 || o->pad < 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "conv %s: kernel %d (dilation %d) stride %d pad %d does not fit input %dx%dx%d",
                       name, k, D, o->stride, o->pad, in.c, in.h, in.w);
    ch_layer *l = ch_layer_alloc(&conv_ops, name, in, (ch_shape3){ o->out_channels, oh, ow });
    CH_CHECK_ALLOC(err, l);
    conv_impl *c = calloc(1, sizeof *c);
    if (!c) {
        ch_layer_free(l);
        return CH_SYS_FAIL(err, "calloc of conv");
    }
    l->impl = c;
    c->d = (ch_conv_desc){ .c = in.c, .h = in.h, .w = in.w, .oc = o->out_channels, .kh = k, .kw = k,
                           .stride = o->stride, .pad = o->pad, .oh = oh, .ow = ow, .groups = G,
                           .dilation = D };
    c->bias = o->bias;
    const int fan_in = in.c / G * k * k;
    ch_status st = ch_layer_add_param(l, "weight", 4, (int64_t[]){ o->out_channels, in.c / G, k, k },
                                      CH_ROLE_WEIGHT, fan_in, err);
    if (st == CH_STATUS_OK && o->bias)
        st = ch_layer_add_param(l, "bias", 1, (int64_t[]){ o->out_channels }, CH_ROLE_BIAS, fan_in, err);
    return ch_layer_finish(l, st, out);
}

ch_status ch_conv2d_create(const char *name, ch_shape3 in, int out_channels, int kernel,
                           int stride, int pad, bool bias, ch_layer **out, ch_err *err)
{
    const ch_conv2d_opts o = { .out_channels = out_channels, .kernel = kernel, .stride = stride,
                               .pad = pad, .dilation = 1, .groups = 1, .bias = bias };
    return ch_conv2d_create_opts(name, in, &o, out, err);
}

/* ---- ConvTranspose2d ---- */

typedef struct convt_impl {
    ch_conv_desc d;     /* the mirror: from this layer's output (c = out channels) to its input */
    bool bias;
    ch_real *ones;      /* max(batch, h * w) ones: the bias through GEMMs */
    ch_real *plane;     /* (out channels, h, w): the bias spread over a sample, or dy summed over the batch */
} convt_impl;

static ch_status convt_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    convt_impl *c = l->impl;
    const ch_kctx kc = ch_plan_kctx(pl);
    const size_t need = pl->k->conv2d_workspace(&kc, &c->d, pl->max_batch);
    if (need > pl->ws_need) pl->ws_need = need;
    if (c->bias) {
        const size_t hw = (size_t)l->out.h * l->out.w, nones = hw > (size_t)pl->max_batch ? hw : (size_t)pl->max_batch;
        c->ones = ch_layer_alloc_saved(l, pl, nones + ch_shape3_size(l->out), sizeof(ch_real), err);
        if (!c->ones) return CH_STATUS_SYSTEM;
        c->plane = c->ones + nones;
        ch_real *h = malloc(sizeof(ch_real) * nones);
        if (!h) return CH_SYS_FAIL(err, "allocation of a transposed convolution's ones");
        for (size_t i = 0; i < nones; i++) h[i] = 1;
        ch_backend_upload(pl->be, c->ones, h, sizeof(ch_real) * nones);
        free(h);
    }
    return ch_layer_alloc_output(l, pl, err);
}

static void convt_free(ch_layer *l)
{
    convt_impl *c = l->impl;
    if (c) ch_layer_release(l, c->ones);
}

static void convt_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    convt_impl *c = l->impl;
    r->k->conv2d_backward_data(&r->kc, &c->d, n, x, l->p[0], l->y);
    if (!c->bias) return;
    const int oc = l->out.c, hw = l->out.h * l->out.w, per = oc * hw;
    r->k->gemm(&r->kc, false, false, oc, hw, 1, 1, l->p[1], 1, c->ones, hw, 0, c->plane, hw);
    r->k->gemm(&r->kc, false, false, n, per, 1, 1, c->ones, 1, c->plane, per, 1, l->y, per);
}

static void convt_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy, ch_real *dx)
{
    convt_impl *c = l->impl;
    /* The mirror's weight gradient, its input being dy and its output's gradient x (relu is off:
     * x is not written). */
    r->k->conv2d_backward_weights(&r->kc, &c->d, n, dy, x, (ch_real *)x, l->g[0], NULL);
    if (c->bias) {
        const int oc = l->out.c, hw = l->out.h * l->out.w;
        r->k->col_sum(&r->kc, n, (size_t)oc * hw, dy, c->plane);
        r->k->gemm(&r->kc, false, false, oc, 1, hw, 1, c->plane, hw, c->ones, 1, 0, l->g[1], 1);
    }
    ch_run_grads_ready(r, l);
    if (dx) r->k->conv2d_forward(&r->kc, &c->d, n, dy, l->p[0], NULL, dx);
}

static const ch_layer_ops convt_ops = {
    .kind = "ConvTranspose2d", .plan = convt_plan, .forward = convt_forward, .backward = convt_backward,
    .free_impl = convt_free, .y_unread_by_backward = true,
};

ch_status ch_conv_transpose2d_create(const char *name, ch_shape3 in, const ch_conv2d_opts *o, int out_pad,
                                     ch_layer **out, ch_err *err)
{
    const int D = o->dilation, G = o->groups, k = o->kernel, ke = D * (k - 1) + 1, s = o->stride;
    if (o->out_channels <= 0 || k <= 0 || s <= 0 || D <= 0 || G <= 0 || o->pad < 0 || out_pad < 0 ||
        (out_pad >= s && out_pad >= D))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "conv_transpose %s: out_channels %d, kernel %d, stride %d, dilation %d "
                       "and groups %d must be positive, padding %d not negative, output_padding %d below the stride or "
                       "the dilation", name, o->out_channels, k, s, D, G, o->pad, out_pad);
    if (in.c % G != 0 || o->out_channels % G != 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "conv_transpose %s: %d input and %d output channels do not divide "
                       "into %d groups", name, in.c, o->out_channels, G);
    const long oh = (long)(in.h - 1) * s - 2L * o->pad + ke + out_pad, ow = (long)(in.w - 1) * s - 2L * o->pad + ke + out_pad;
    if (oh <= 0 || ow <= 0 || oh > (1 << 16) || ow > (1 << 16) ||
        ch_window_out((int)oh, ke, s, o->pad) != in.h || ch_window_out((int)ow, ke, s, o->pad) != in.w)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "conv_transpose %s: kernel %d (dilation %d) stride %d padding %d makes "
                       "a %ldx%ld output from %dx%d", name, k, D, s, o->pad, oh, ow, in.h, in.w);
    ch_layer *l;
    convt_impl *c =
        ch_layer_alloc_impl(&convt_ops, name, in, (ch_shape3){ o->out_channels, (int)oh, (int)ow }, sizeof *c, &l, err);
    if (!c) return CH_STATUS_SYSTEM;
    c->d = (ch_conv_desc){ .c = o->out_channels, .h = (int)oh, .w = (int)ow, .oc = in.c, .kh = k, .kw = k, .stride = s,
                           .pad = o->pad, .oh = in.h, .ow = in.w, .groups = G, .dilation = D };
    c->bias = o->bias;
    /* PyTorch's init: fan_in from weight.size(1) * k * k, i.e. out_channels / groups. */
    const int fan_in = o->out_channels / G * k * k;
    ch_status st = ch_layer_add_param(l, "weight", 4, (int64_t[]){ in.c, o->out_channels / G, k, k }, CH_ROLE_WEIGHT,
                                      fan_in, err);
    if (st == CH_STATUS_OK && o->bias)
        st = ch_layer_add_param(l, "bias", 1, (int64_t[]){ o->out_channels }, CH_ROLE_BIAS, fan_in, err);
    return ch_layer_finish(l, st, out);
}
