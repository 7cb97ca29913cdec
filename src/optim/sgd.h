/* SGD with momentum, dampening, Nesterov and weight decay, PyTorch semantics, over a flat buffer:
 *   g = grad + wd * p
 *   buf = g (first step) | momentum * buf + (1 - dampening) * g
 *   g = g + momentum * buf (Nesterov) | buf
 *   p -= lr * g */
#ifndef CH_OPTIM_SGD_H
#define CH_OPTIM_SGD_H

#include <stdbool.h>
#include <stddef.h>

#include "core/real.h"
#include "core/status.h"

typedef struct ch_sgd {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
    size_t n;
    ch_real *buf;       /* momentum buffer (n), owned; NULL without momentum */
    long steps;
} ch_sgd;

ch_status ch_sgd_init(ch_sgd *o, size_t n, double lr, double momentum, double dampening,
                      double weight_decay, bool nesterov, ch_err *err);
/* One update of params (n) from grads (n); nthreads threads. */
void ch_sgd_step(ch_sgd *o, ch_real *params, const ch_real *grads, int nthreads);
void ch_sgd_free(ch_sgd *o);

#endif
