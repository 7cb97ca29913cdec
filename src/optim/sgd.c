/* SGD over the flat parameter buffer. */
#include "optim/sgd.h"

#include <stdlib.h>

ch_status ch_sgd_init(ch_sgd *o, size_t n, double lr, double momentum, double dampening,
                      double weight_decay, bool nesterov, ch_err *err)
{
    *o = (ch_sgd){ .lr = lr, .momentum = momentum, .dampening = dampening,
                   .weight_decay = weight_decay, .nesterov = nesterov, .n = n };
    if (nesterov && (momentum <= 0 || dampening != 0))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "Nesterov momentum needs momentum > 0 and no dampening");
    if (momentum != 0) {
        o->buf = calloc(n ? n : 1, sizeof(ch_real));
        CH_CHECK_ALLOC(err, o->buf);
    }
    return CH_STATUS_OK;
}

void ch_sgd_step(ch_sgd *o, ch_real *params, const ch_real *grads, int nthreads)
{
    const ch_real lr = (ch_real)o->lr, wd = (ch_real)o->weight_decay, mom = (ch_real)o->momentum;
    const ch_real damp = (ch_real)(1 - o->dampening);
    const bool first = o->steps == 0;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (size_t i = 0; i < o->n; i++) {
        ch_real g = grads[i] + wd * params[i];
        if (o->buf) {
            ch_real b = first ? g : mom * o->buf[i] + damp * g;
            o->buf[i] = b;
            g = o->nesterov ? g + mom * b : b;
        }
        params[i] -= lr * g;
    }
    o->steps++;
}

void ch_sgd_free(ch_sgd *o)
{
    if (!o) return;
    free(o->buf);
    o->buf = NULL;
}
