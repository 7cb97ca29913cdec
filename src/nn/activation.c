/* Activations besides ReLU: leaky ReLU, clip (ReLU6 = clip(0, 6)), sigmoid, tanh, hardsigmoid,
 * hardswish, an affine map by constants, erf and GELU (exact or tanh). Backward reads y (sigmoid,
 * tanh) or x (all others); both stay alive, as the layer before owns x. */
#include "nn/layer.h"

#include <math.h>
#include <stdlib.h>

static ch_status act_plan(ch_layer *l, ch_plan *pl, ch_err *err)
{
    return ch_layer_alloc_output(l, pl, err);
}

static void act_forward(ch_layer *l, const ch_run *r, int n, const ch_real *x)
{
    r->k->act_forward(&r->kc, l->impl, ch_shape3_size(l->out) * (size_t)n, x, l->y);
}

static void act_backward(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                         ch_real *dx)
{
    if (dx) r->k->act_backward(&r->kc, l->impl, ch_shape3_size(l->out) * (size_t)n, x, l->y, dy, dx);
}

/* One table per kind, so that traces and summaries name it. */
#define ACT_OPS(kind_name) { .kind = kind_name, .plan = act_plan, .forward = act_forward, \
                             .backward = act_backward }
static const ch_layer_ops act_ops[] = { ACT_OPS("LeakyReLU"), ACT_OPS("Clip"), ACT_OPS("Sigmoid"),
                                        ACT_OPS("Tanh"), ACT_OPS("Hardsigmoid"), ACT_OPS("Hardswish"),
                                        ACT_OPS("Affine"), ACT_OPS("Erf"), ACT_OPS("GELU"),
                                        ACT_OPS("GELU(tanh)") };

ch_status ch_activation_create(const char *name, ch_shape3 in, const ch_act *a, ch_layer **out,
                               ch_err *err)
{
    if (a->kind < CH_ACT_LEAKY_RELU || (size_t)a->kind >= sizeof act_ops / sizeof *act_ops)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "activation %s: unknown kind %d", name, (int)a->kind);
    if (a->kind == CH_ACT_LEAKY_RELU && !isfinite(a->alpha))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "leaky_relu %s: alpha %g is not finite", name, a->alpha);
    if (a->kind == CH_ACT_AFFINE && !(isfinite(a->alpha) && isfinite(a->beta)))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "affine %s: scale %g or shift %g is not finite", name, a->alpha,
                       a->beta);
    if (a->kind == CH_ACT_CLIP && !(a->lo <= a->hi))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "clip %s: min %g above max %g (or NaN)", name, a->lo,
                       a->hi);
    ch_layer *l = ch_layer_alloc(&act_ops[a->kind], name, in, in);
    ch_act *impl = malloc(sizeof *impl);
    if (!l || !impl) {
        free(impl);
        ch_layer_free(l);
        return CH_SYS_FAIL(err, "allocation of an activation");
    }
    *impl = *a;
    l->impl = impl;
    *out = l;
    return CH_STATUS_OK;
}
