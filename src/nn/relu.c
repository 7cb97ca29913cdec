/* ReLU, Flatten, View, the channel shuffle, the channel slice and Permute: layers without
 * parameters. */
#include "nn/layer.h"

#include <stdlib.h>

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

/* ---- channel shuffle ---- */

typedef struct shuffle_impl {
    int groups;
} shuffle_impl;

/* Input channel i * m + j (group i of g, m = c / g) is output channel j * g + i. back: the other
 * way, from the output's gradient to the input's. Each copy moves whole planes: per sample and
 * group (m planes hw apart to m planes g * hw apart), or per channel over the batch (n planes c * hw
 * apart), whichever makes fewer calls. */
static void shuffle_planes(const ch_layer *l, const ch_run *r, int n, const ch_real *from, ch_real *to, bool back)
{
    const int g = ((const shuffle_impl *)l->impl)->groups, c = l->in.c, m = c / g;
    const size_t hw = (size_t)l->in.h * l->in.w, per = (size_t)c * hw;
    if ((long)n * g <= c) {
        for (int s = 0; s < n; s++)
            for (int i = 0; i < g; i++) {
                const size_t grouped = s * per + (size_t)i * m * hw, spread = s * per + (size_t)i * hw;
                if (back) r->k->copy_rows(&r->kc, m, hw, from + spread, g * hw, to + grouped, hw);
                else r->k->copy_rows(&r->kc, m, hw, from + grouped, hw, to + spread, g * hw);
            }
        return;
    }
    for (int i = 0; i < g; i++)
        for (int j = 0; j < m; j++) {
            const size_t grouped = ((size_t)i * m + j) * hw, spread = ((size_t)j * g + i) * hw;
            r->k->copy_rows(&r->kc, n, hw, from + (back ? spread : grouped), per, to + (back ? grouped : spread), per);
        }
}

static void shuffle_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    shuffle_planes(l, r, n, x, l->y, false);
}

static void shuffle_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                             ch_real *dx)
{
    (void)x;
    if (dx) shuffle_planes(l, r, n, dy, dx, true);
}

static const ch_layer_ops shuffle_ops = {
    .kind = "ChannelShuffle", .plan = own_output_plan, .forward = shuffle_forward, .backward = shuffle_backward,
    .y_unread_by_backward = true,
};

ch_status ch_channel_shuffle_create(const char *name, ch_shape3 in, int groups, ch_layer **out, ch_err *err)
{
    if (groups < 1 || in.c % groups != 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "channel shuffle %s: %d groups do not divide %d channels", name,
                       groups, in.c);
    shuffle_impl *u = ch_layer_alloc_impl(&shuffle_ops, name, in, in, sizeof *u, out, err);
    if (!u) return CH_STATUS_SYSTEM;
    u->groups = groups;
    return CH_STATUS_OK;
}

/* ---- channel slice ---- */

typedef struct slice_impl {
    int start;
} slice_impl;

static void slice_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    const size_t hw = (size_t)l->in.h * l->in.w, per_in = ch_shape3_size(l->in), len = ch_shape3_size(l->out);
    const int start = ((const slice_impl *)l->impl)->start;
    r->k->copy_rows(&r->kc, n, len, x + (size_t)start * hw, per_in, l->y, len);
}

/* dx is the whole input's gradient: zero outside the slice (the graph sums it with the gradients
 * of the input's other readers, another slice's among them). */
static void slice_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                           ch_real *dx)
{
    (void)x;
    if (!dx) return;
    const size_t hw = (size_t)l->in.h * l->in.w, per_in = ch_shape3_size(l->in), len = ch_shape3_size(l->out);
    const int start = ((const slice_impl *)l->impl)->start;
    if (len < per_in) ch_backend_zero(r->be, dx, sizeof(ch_real) * per_in * (size_t)n);
    r->k->copy_rows(&r->kc, n, len, dy, len, dx + (size_t)start * hw, per_in);
}

static const ch_layer_ops slice_ops = {
    .kind = "ChannelSlice", .plan = own_output_plan, .forward = slice_forward, .backward = slice_backward,
    .y_unread_by_backward = true,
};

ch_status ch_channel_slice_create(const char *name, ch_shape3 in, int start, int count, ch_layer **out, ch_err *err)
{
    if (start < 0 || count < 1 || start > in.c - count)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "channel slice %s: channels %d..%d of %d", name, start,
                       start + count - 1, in.c);
    slice_impl *u = ch_layer_alloc_impl(&slice_ops, name, in, (ch_shape3){ count, in.h, in.w }, sizeof *u, out, err);
    if (!u) return CH_STATUS_SYSTEM;
    u->start = start;
    return CH_STATUS_OK;
}

/* ---- permute ---- */

/* The descriptor of the forward permutation, and of the inverse one (from the output's dims) that
 * takes dy back to dx. */
typedef struct permute_impl {
    ch_permute_desc fwd, back;
} permute_impl;

static void permute_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    r->k->permute(&r->kc, &((const permute_impl *)l->impl)->fwd, n, x, l->y);
}

static void permute_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                             ch_real *dx)
{
    (void)x;
    if (dx) r->k->permute(&r->kc, &((const permute_impl *)l->impl)->back, n, dy, dx);
}

static const ch_layer_ops permute_ops = {
    .kind = "Permute", .plan = own_output_plan, .forward = permute_forward, .backward = permute_backward,
    .y_unread_by_backward = true,
};

ch_status ch_permute_create(const char *name, ch_shape3 in, const int perm[3], ch_layer **out, ch_err *err)
{
    bool seen[3] = { false };
    for (int i = 0; i < 3; i++) {
        if (perm[i] < 0 || perm[i] > 2 || seen[perm[i]])
            return ch_fail(err, CH_STATUS_BAD_INPUT, "permute %s: (%d, %d, %d) is not an order of the dimensions 0, 1, 2 "
                           "of (c, h, w)", name, perm[0], perm[1], perm[2]);
        seen[perm[i]] = true;
    }
    const int dims[3] = { in.c, in.h, in.w };
    const ch_shape3 o = { dims[perm[0]], dims[perm[1]], dims[perm[2]] };
    permute_impl *u = ch_layer_alloc_impl(&permute_ops, name, in, o, sizeof *u, out, err);
    if (!u) return CH_STATUS_SYSTEM;
    for (int i = 0; i < 3; i++) {
        u->fwd.dims[i] = dims[i];
        u->fwd.perm[i] = perm[i];
        u->back.dims[i] = dims[perm[i]];
        u->back.perm[perm[i]] = i;
    }
    return CH_STATUS_OK;
}
