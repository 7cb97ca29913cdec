/* ReLU, Flatten and View: layers without parameters. */
#include "nn/layer.h"

static ch_status own_output_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    return ch_layer_alloc_output(l, pl, err);
}

static void relu_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    r->k->relu_forward(&r->kc, ch_shape3_size(l->out) * (size_t)n, x, l->y);
}

static void relu_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                          ch_real *dx)
{
    (void)x;
    if (dx) r->k->relu_backward(&r->kc, ch_shape3_size(l->out) * (size_t)n, l->y, dy, dx);
}

static const ch_layer_ops relu_ops = {
    .kind = "ReLU", .plan = own_output_plan, .forward = relu_forward, .backward = relu_backward,
};

bool ch_layer_is_relu(const ch_layer *l) { return l->ops == &relu_ops; }

ch_status ch_relu_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err)
{
    *out = ch_layer_alloc(&relu_ops, name, in, in);
    CH_CHECK_ALLOC(err, *out);
    return CH_STATUS_OK;
}

/* Flatten copies: the values are few (a classifier head) and a copy keeps y owned by the layer. */
static void flatten_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    ch_backend_copy(r->be, l->y, x, sizeof(ch_real) * ch_shape3_size(l->out) * (size_t)n);
}

static void flatten_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x,
                             const ch_real *dy, ch_real *dx)
{
    (void)x;
    if (dx) ch_backend_copy(r->be, dx, dy, sizeof(ch_real) * ch_shape3_size(l->out) * (size_t)n);
}

static const ch_layer_ops flatten_ops = {
    .kind = "Flatten", .plan = own_output_plan, .forward = flatten_forward,
    .backward = flatten_backward,
};

ch_status ch_flatten_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err)
{
    *out = ch_layer_alloc(&flatten_ops, name, in, (ch_shape3){ (int)ch_shape3_size(in), 1, 1 });
    CH_CHECK_ALLOC(err, *out);
    return CH_STATUS_OK;
}

/* x.view(n, c, h, w): the same values in the same order, so the same copies as Flatten. */
static const ch_layer_ops view_ops = {
    .kind = "View", .plan = own_output_plan, .forward = flatten_forward, .backward = flatten_backward,
};

ch_status ch_view_create(const char *name, ch_shape3 in, ch_shape3 shape, ch_layer **out, ch_err *err)
{
    if (ch_shape3_size(shape) != ch_shape3_size(in))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "view %s: %dx%dx%d holds %zu values, the input %zu", name, shape.c,
                       shape.h, shape.w, ch_shape3_size(shape), ch_shape3_size(in));
    *out = ch_layer_alloc(&view_ops, name, in, shape);
    CH_CHECK_ALLOC(err, *out);
    return CH_STATUS_OK;
}
