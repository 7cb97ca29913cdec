/* Optimizers with PyTorch's update rules (torch.optim, 1.13), over a flat parameter buffer:
 *   SGD:     g = grad + wd p; buf = g (first step) | m buf + (1 - dampening) g;
 *            g = g + m buf (Nesterov) | buf; p -= lr g
 *   Adam:    t += 1; g = grad + wd p; m1 = b1 m1 + (1 - b1) g; m2 = b2 m2 + (1 - b2) g^2;
 *            p -= lr / (1 - b1^t) * m1 / (sqrt(m2) / sqrt(1 - b2^t) + eps)
 *   AdamW:   p *= 1 - lr wd, then Adam without the wd term
 *   Adagrad: t += 1; g = grad + wd p; clr = lr / (1 + (t - 1) lr_decay); sum += g^2;
 *            p -= clr g / (sqrt(sum) + eps)
 * The learning rate comes with every step (a schedule sets it). State buffers carry PyTorch's
 * names (momentum_buffer; exp_avg, exp_avg_sq; sum) for checkpoints. */
#ifndef CH_OPTIM_OPTIM_H
#define CH_OPTIM_OPTIM_H

#include <stdbool.h>
#include <stddef.h>

#include "core/real.h"
#include "core/status.h"
#include "kernels/backend.h"

typedef enum ch_optim_kind { CH_OPTIM_SGD, CH_OPTIM_ADAM, CH_OPTIM_ADAMW, CH_OPTIM_ADAGRAD } ch_optim_kind;

typedef struct ch_optim_config {
    ch_optim_kind kind;
    double momentum, dampening, weight_decay;
    bool nesterov;
    double beta1, beta2;        /* Adam, AdamW */
    double eps;                 /* Adam, AdamW, Adagrad; < 0: the optimizer's default */
    double lr_decay, initial_accumulator; /* Adagrad */
} ch_optim_config;

enum { CH_OPTIM_MAX_STATE = 2 };

typedef struct ch_optim {
    ch_optim_config c;
    size_t n;
    int nstate;
    const ch_backend *be;       /* whose memory the state is, and whose kernel updates */
    ch_real *state[CH_OPTIM_MAX_STATE];  /* owned (replica memory); n each */
    long steps;                 /* updates done (PyTorch's state "step") */
} ch_optim;

/* "sgd" | "adam" | "adamw" | "adagrad". */
ch_status ch_optim_kind_parse(const char *name, ch_optim_kind *out, ch_err *err);
const char *ch_optim_kind_name(ch_optim_kind k);
/* PyTorch's defaults for kind (betas 0.9/0.999, eps 1e-8, Adagrad eps 1e-10, ...). */
ch_optim_config ch_optim_defaults(ch_optim_kind kind);
/* State for n parameters in be's memory (borrowed; it must outlive o). */
ch_status ch_optim_init(ch_optim *o, size_t n, const ch_optim_config *c, const ch_backend *be,
                        ch_err *err);
/* Name of state buffer i ("momentum_buffer", "exp_avg", "exp_avg_sq", "sum"). */
const char *ch_optim_state_name(const ch_optim *o, int i);
/* One update of params (n) from grads (n), both in the backend's memory, with learning rate lr:
 * the scalars of the step here, the elementwise loop in the backend's optim_update kernel. */
void ch_optim_step(ch_optim *o, double lr, ch_real *params, const ch_real *grads, int nthreads);
void ch_optim_free(ch_optim *o);

#endif
