/* The update rules of optim.h, one OpenMP loop each over the flat buffers. */
#include "optim/optim.h"

#include <math.h>
#include <stdint.h>
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

ch_status ch_optim_init(ch_optim *o, size_t n, const ch_optim_config *c, const ch_backend *be,
                        ch_err *err)
{
    *o = (ch_optim){ .c = *c, .n = n, .be = be };
    CH_TRY(check_config(c, err));
    o->nstate = c->kind == CH_OPTIM_SGD ? (c->momentum != 0) : c->kind == CH_OPTIM_ADAGRAD ? 1 : 2;
    for (int i = 0; i < o->nstate; i++) {
        o->state[i] = n <= SIZE_MAX / sizeof(ch_real) ? ch_backend_alloc(be, sizeof(ch_real) * n) : NULL;
        CH_CHECK_ALLOC(err, o->state[i]);
    }
    if (c->kind == CH_OPTIM_ADAGRAD && n) {
        ch_real *host = malloc(sizeof(ch_real) * n);
        CH_CHECK_ALLOC(err, host);
        for (size_t i = 0; i < n; i++) host[i] = (ch_real)c->initial_accumulator;
        ch_backend_upload(be, o->state[0], host, sizeof(ch_real) * n);
        free(host);
    }
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

/* The step's scalars, as PyTorch computes them (in double where it does). */
static ch_optim_update update_of(const ch_optim *o, double lr)
{
    const ch_optim_config *c = &o->c;
    ch_optim_update u = { .lr = (ch_real)lr, .wd = (ch_real)c->weight_decay, .eps = (ch_real)c->eps };
    switch (c->kind) {
    case CH_OPTIM_SGD:
        u.rule = CH_UPDATE_SGD;
        u.momentum = (ch_real)c->momentum;
        u.damp = (ch_real)(1 - c->dampening);
        u.first = o->steps == 0;
        u.nesterov = c->nesterov;
        break;
    case CH_OPTIM_ADAM:
    case CH_OPTIM_ADAMW: {
        const double t = (double)o->steps + 1;
        u.rule = CH_UPDATE_ADAM;
        u.decoupled = c->kind == CH_OPTIM_ADAMW;
        u.b1 = (ch_real)c->beta1;
        u.b2 = (ch_real)c->beta2;
        u.decay = (ch_real)(1 - (double)(ch_real)lr * c->weight_decay);
        u.step_size = (ch_real)((double)(ch_real)lr / (1 - pow(c->beta1, t)));
        u.bc2_sqrt = (ch_real)sqrt(1 - pow(c->beta2, t));
        break;
    }
    case CH_OPTIM_ADAGRAD:
        u.rule = CH_UPDATE_ADAGRAD;
        u.lr = (ch_real)((double)(ch_real)lr / (1 + (double)o->steps * c->lr_decay));
        break;
    }
    return u;
}

void ch_optim_step(ch_optim *o, double lr, ch_real *params, const ch_real *grads, int nthreads)
{
    const ch_optim_update u = update_of(o, lr);
    ch_kctx kc = ch_backend_kctx(o->be);
    kc.nthreads = nthreads;
    o->be->k->optim_update(&kc, &u, o->n, params, grads, o->state[0], o->state[1]);
    o->steps++;
}

void ch_optim_free(ch_optim *o)
{
    if (!o) return;
    for (int i = 0; i < CH_OPTIM_MAX_STATE; i++) {
        if (o->be) ch_backend_release(o->be, o->state[i]);
        o->state[i] = NULL;
    }
}
