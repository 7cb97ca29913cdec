/* MaxPool2d, AvgPool2d, the global average pool (AdaptiveAvgPool2d((1, 1))), nearest upsampling
 * (nn.Upsample(scale_factor=k)) and bilinear resizing (mode='bilinear', align_corners either way):
 * the resampling layers. */
#include "nn/layer.h"

#include <stdlib.h>
#include <string.h>

typedef struct pool_impl {
    ch_pool_desc d;
    int32_t *argmax;   /* max pooling: winner per output, planned for the largest batch */
} pool_impl;

static ch_status pool_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    return ch_layer_alloc_output(l, pl, err);
}

static ch_status maxpool_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    pool_impl *p = l->impl;
    const size_t len = ch_shape3_size(l->out) * (size_t)pl->max_batch;
    p->argmax = ch_layer_alloc_saved(l, pl, len, sizeof(int32_t), err);
    if (!p->argmax) return CH_STATUS_SYSTEM;
    pl->saved_bytes += sizeof(int32_t) * len;
    return pool_plan(l, pl, err);
}

static void maxpool_free(ch_layer *l)
{
    pool_impl *p = l->impl;
    if (p) ch_layer_release(l, p->argmax);
}

static void maxpool_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    pool_impl *p = l->impl;
    r->k->maxpool2d_forward(&r->kc, &p->d, n, x, l->y, p->argmax);
}

static void maxpool_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x,
                             const ch_real *dy, ch_real *dx)
{
    (void)x;
    pool_impl *p = l->impl;
    if (dx) r->k->maxpool2d_backward(&r->kc, &p->d, n, dy, p->argmax, dx);
}

static void avgpool_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    pool_impl *p = l->impl;
    r->k->avgpool2d_forward(&r->kc, &p->d, n, x, l->y);
}

static void avgpool_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x,
                             const ch_real *dy, ch_real *dx)
{
    (void)x;
    pool_impl *p = l->impl;
    if (dx) r->k->avgpool2d_backward(&r->kc, &p->d, n, dy, dx);
}

static const ch_layer_ops maxpool_ops = {
    .kind = "MaxPool2d", .plan = maxpool_plan, .forward = maxpool_forward,
    .backward = maxpool_backward, .free_impl = maxpool_free,
};
static const ch_layer_ops avgpool_ops = {
    .kind = "AvgPool2d", .plan = pool_plan, .forward = avgpool_forward, .backward = avgpool_backward,
};
static const ch_layer_ops global_avgpool_ops = {
    .kind = "AdaptiveAvgPool2d", .plan = pool_plan, .forward = avgpool_forward,
    .backward = avgpool_backward,
};

static ch_status pool_create(const ch_layer_ops *ops, const char *name, ch_shape3 in,
                             const ch_pool2d_opts *o, ch_layer **out, ch_err *err)
{
    const int k = o->kernel, stride = o->stride, pad = o->pad;
    const int oh = o->ceil_mode ? ch_window_out_ceil(in.h, k, stride, pad) : ch_window_out(in.h, k, stride, pad);
    const int ow = o->ceil_mode ? ch_window_out_ceil(in.w, k, stride, pad) : ch_window_out(in.w, k, stride, pad);
    if (oh <= 0 || ow <= 0 || pad < 0 || 2 * pad > k)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "pool %s: kernel %d stride %d pad %d does not fit input %dx%dx%d", name, k,
                       stride, pad, in.c, in.h, in.w);
    ch_layer *l = ch_layer_alloc(ops, name, in, (ch_shape3){ in.c, oh, ow });
    CH_CHECK_ALLOC(err, l);
    pool_impl *p = calloc(1, sizeof *p);
    if (!p) {
        ch_layer_free(l);
        return CH_SYS_FAIL(err, "calloc of pool");
    }
    p->d = (ch_pool_desc){ .c = in.c, .h = in.h, .w = in.w, .k = k, .stride = stride, .pad = pad,
                           .oh = oh, .ow = ow, .exclude_pad = !o->count_include_pad };
    l->impl = p;
    *out = l;
    return CH_STATUS_OK;
}

ch_status ch_maxpool2d_create_opts(const char *name, ch_shape3 in, const ch_pool2d_opts *o,
                                   ch_layer **out, ch_err *err)
{
    return pool_create(&maxpool_ops, name, in, o, out, err);
}

ch_status ch_avgpool2d_create_opts(const char *name, ch_shape3 in, const ch_pool2d_opts *o,
                                   ch_layer **out, ch_err *err)
{
    return pool_create(&avgpool_ops, name, in, o, out, err);
}

ch_status ch_maxpool2d_create(const char *name, ch_shape3 in, int kernel, int stride, int pad,
                              ch_layer **out, ch_err *err)
{
    const ch_pool2d_opts o = { .kernel = kernel, .stride = stride, .pad = pad, .count_include_pad = true };
    return pool_create(&maxpool_ops, name, in, &o, out, err);
}

ch_status ch_avgpool2d_create(const char *name, ch_shape3 in, int kernel, int stride, int pad,
                              ch_layer **out, ch_err *err)
{
    const ch_pool2d_opts o = { .kernel = kernel, .stride = stride, .pad = pad, .count_include_pad = true };
    return pool_create(&avgpool_ops, name, in, &o, out, err);
}

/* Square inputs only: a window of the whole plane. */
ch_status ch_global_avgpool_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err)
{
    if (in.h != in.w)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "global pool %s: input %dx%d is not square",
                       name, in.h, in.w);
    const ch_pool2d_opts o = { .kernel = in.h, .stride = in.h, .count_include_pad = true };
    return pool_create(&global_avgpool_ops, name, in, &o, out, err);
}

typedef struct upsample_impl {
    int sh, sw;
} upsample_impl;

static void upsample_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    const upsample_impl *u = l->impl;
    r->k->upsample_forward(&r->kc, n, l->in.c, l->in.h, l->in.w, u->sh, u->sw, x, l->y);
}

static void upsample_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                              ch_real *dx)
{
    (void)x;
    const upsample_impl *u = l->impl;
    if (dx) r->k->upsample_backward(&r->kc, n, l->in.c, l->in.h, l->in.w, u->sh, u->sw, dy, dx);
}

static const ch_layer_ops upsample_ops = {
    .kind = "Upsample", .plan = pool_plan, .forward = upsample_forward, .backward = upsample_backward,
    .y_unread_by_backward = true,
};

ch_status ch_upsample_nearest_create(const char *name, ch_shape3 in, int sh, int sw, ch_layer **out,
                                     ch_err *err)
{
    if (sh < 1 || sw < 1 || sh > CH_UPSAMPLE_MAX || sw > CH_UPSAMPLE_MAX ||
        (long)in.h * sh > CH_UPSAMPLE_MAX_SIDE || (long)in.w * sw > CH_UPSAMPLE_MAX_SIDE)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "upsample %s: factors %d x %d of a %dx%d input: each must be 1..%d and the output at most "
                       "%d a side", name, sh, sw, in.h, in.w, CH_UPSAMPLE_MAX, CH_UPSAMPLE_MAX_SIDE);
    upsample_impl *u =
        ch_layer_alloc_impl(&upsample_ops, name, in, (ch_shape3){ in.c, in.h * sh, in.w * sw }, sizeof *u, out, err);
    if (!u) return CH_STATUS_SYSTEM;
    *u = (upsample_impl){ sh, sw };
    return CH_STATUS_OK;
}

typedef struct bilinear_impl {
    bool align;
} bilinear_impl;

static void bilinear_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    const bilinear_impl *u = l->impl;
    r->k->bilinear_forward(&r->kc, n * l->in.c, l->in.h, l->in.w, l->out.h, l->out.w, u->align, x, l->y);
}

static void bilinear_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy, ch_real *dx)
{
    (void)x;
    const bilinear_impl *u = l->impl;
    if (dx) r->k->bilinear_backward(&r->kc, n * l->in.c, l->in.h, l->in.w, l->out.h, l->out.w, u->align, dy, dx);
}

static const ch_layer_ops bilinear_ops = {
    .kind = "UpsampleBilinear", .plan = pool_plan, .forward = bilinear_forward, .backward = bilinear_backward,
    .y_unread_by_backward = true,
};

ch_status ch_upsample_bilinear_create(const char *name, ch_shape3 in, int oh, int ow, bool align_corners,
                                      ch_layer **out, ch_err *err)
{
    if (oh < 1 || ow < 1 || oh > CH_UPSAMPLE_MAX_SIDE || ow > CH_UPSAMPLE_MAX_SIDE)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "upsample %s: a %dx%d output: each side must be 1..%d", name, oh, ow,
                       CH_UPSAMPLE_MAX_SIDE);
    bilinear_impl *u = ch_layer_alloc_impl(&bilinear_ops, name, in, (ch_shape3){ in.c, oh, ow }, sizeof *u, out, err);
    if (!u) return CH_STATUS_SYSTEM;
    u->align = align_corners;
    return CH_STATUS_OK;
}
