/* The update rules of optim.h, one OpenMP loop each over the flat buffers. */
#include "optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = { "sgd", "adam", "adamw", "adagrad" };

ch_status ch_optim_kind_parse(const char *name, ch_optim_kind *out, ch_err *err)
{
    for (int k = 0; k < 4; k++)
        if (strcmp(name, kind_names[k]) == 0) {
            *out = (ch_optim_kind)k;
            return CH_STATUS_OK;
        }
    return ch_fail(err, CH_STATUS_BAD_INPUT, "unknown optimizer '%s' (expected sgd, adam, adamw or adagrad)", name);
}

const char *ch_optim_kind_name(ch_optim_kind k) { return k <= CH_OPTIM_ADAGRAD ? kind_names[k] : "?"; }

ch_optim_config ch_optim_defaults(ch_optim_kind kind)
{
    ch_optim_config c = { .kind = kind, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8 };
    if (kind == CH_OPTIM_ADAMW) c.weight_decay = 1e-2;
    if (kind == CH_OPTIM_ADAGRAD) c.eps = 1e-10;
    return c;
}

static ch_status check_config(const ch_optim_config *c, ch_err *err)
{
    if (c->nesterov && (c->kind != CH_OPTIM_SGD || c->momentum <= 0 || c->dampening != 0))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "Nesterov momentum needs SGD with momentum > 0 and no dampening");
    if (!(c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "betas %g, %g: expected 0 <= beta < 1", c->beta1, c->beta2);
    if (!(c->eps >= 0) || !(c->weight_decay >= 0) || !(c->lr_decay >= 0) || !(c->initial_accumulator >= 0))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "eps, weight decay, lr decay and initial accumulator must be >= 0");
    return CH_STATUS_OK;
}

ch_status ch_optim_init(ch_optim *o, size_t n, const ch_optim_config *c, ch_err *err)
{
    *o = (ch_optim){ .c = *c, .n = n };
    CH_TRY(check_config(c, err));
    o->nstate = c->kind == CH_OPTIM_SGD ? (c->momentum != 0) : c->kind == CH_OPTIM_ADAGRAD ? 1 : 2;
    for (int i = 0; i < o->nstate; i++) {
        o->state[i] = calloc(n ? n : 1, sizeof(ch_real));
        CH_CHECK_ALLOC(err, o->state[i]);
    }
    if (c->kind == CH_OPTIM_ADAGRAD)
        for (size_t i = 0; i < n; i++) o->state[0][i] = (ch_real)c->initial_accumulator;
    return CH_STATUS_OK;
}

const char *ch_optim_state_name(const ch_optim *o, int i)
{
    switch (o->c.kind) {
    case CH_OPTIM_SGD: return "momentum_buffer";
    case CH_OPTIM_ADAGRAD: return "sum";
    default: return i == 0 ? "exp_avg" : "exp_avg_sq";
    }
}

static void sgd_step(ch_optim *o, ch_real lr, ch_real *p, const ch_real *grad, int nthreads)
{
    const ch_real wd = (ch_real)o->c.weight_decay, mom = (ch_real)o->c.momentum;
    const ch_real damp = (ch_real)(1 - o->c.dampening);
    const bool first = o->steps == 0, nesterov = o->c.nesterov;
    ch_real *buf = o->state[0];
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (size_t i = 0; i < o->n; i++) {
        ch_real g = grad[i] + wd * p[i];
        if (buf) {
            const ch_real b = first ? g : mom * buf[i] + damp * g;
            buf[i] = b;
            g = nesterov ? g + mom * b : b;
        }
        p[i] -= lr * g;
    }
}

static void adam_step(ch_optim *o, ch_real lr, ch_real *p, const ch_real *grad, int nthreads)
{
    const bool decoupled = o->c.kind == CH_OPTIM_ADAMW;
    const ch_real b1 = (ch_real)o->c.beta1, b2 = (ch_real)o->c.beta2, eps = (ch_real)o->c.eps;
    const ch_real wd = (ch_real)o->c.weight_decay, decay = (ch_real)(1 - (double)lr * o->c.weight_decay);
    const double t = (double)o->steps + 1;
    const ch_real step_size = (ch_real)((double)lr / (1 - pow(o->c.beta1, t)));
    const ch_real bc2_sqrt = (ch_real)sqrt(1 - pow(o->c.beta2, t));
    ch_real *m1 = o->state[0], *m2 = o->state[1];
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (size_t i = 0; i < o->n; i++) {
        ch_real g = grad[i];
        if (decoupled) p[i] *= decay;
        else g += wd * p[i];
        m1[i] = m1[i] * b1 + (1 - b1) * g;
        m2[i] = m2[i] * b2 + (1 - b2) * g * g;
        const ch_real denom = sqrt(m2[i]) / bc2_sqrt + eps;
        p[i] -= step_size * (m1[i] / denom);
    }
}

static void adagrad_step(ch_optim *o, ch_real lr, ch_real *p, const ch_real *grad, int nthreads)
{
    const ch_real wd = (ch_real)o->c.weight_decay, eps = (ch_real)o->c.eps;
    const ch_real clr = (ch_real)((double)lr / (1 + (double)o->steps * o->c.lr_decay));
    ch_real *sum = o->state[0];
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (size_t i = 0; i < o->n; i++) {
        const ch_real g = grad[i] + wd * p[i];
        sum[i] += g * g;
        p[i] -= clr * (g / (sqrt(sum[i]) + eps));
    }
}

void ch_optim_step(ch_optim *o, double lr, ch_real *params, const ch_real *grads, int nthreads)
{
    switch (o->c.kind) {
    case CH_OPTIM_SGD: sgd_step(o, (ch_real)lr, params, grads, nthreads); break;
    case CH_OPTIM_ADAM:
    case CH_OPTIM_ADAMW: adam_step(o, (ch_real)lr, params, grads, nthreads); break;
    case CH_OPTIM_ADAGRAD: adagrad_step(o, (ch_real)lr, params, grads, nthreads); break;
    }
    o->steps++;
}

void ch_optim_free(ch_optim *o)
{
    if (!o) return;
    for (int i = 0; i < CH_OPTIM_MAX_STATE; i++) {
        free(o->state[i]);
        o->state[i] = NULL;
    }
}
