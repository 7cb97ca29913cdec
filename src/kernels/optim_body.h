/* The optimizers' per-element updates (PyTorch's rules; optim/optim.h), plain C11 that the CPU
 * kernel runs in its loops and a device kernel can include as its body. Element i of the flat
 * buffers; the step's scalars come computed (optim.c). */
#ifndef CH_KERNELS_OPTIM_BODY_H
#define CH_KERNELS_OPTIM_BODY_H

#include "core/hd.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/real.h"

/* SGD with weight decay, momentum (buf; NULL without), dampening and Nesterov. */
static inline CH_HD void ch_sgd_at(size_t i, ch_real lr, ch_real wd, ch_real mom, ch_real damp, bool first, bool nesterov,
                             ch_real *p, const ch_real *grad, ch_real *buf)
{
    ch_real g = grad[i] + wd * p[i];
    if (buf) {
        const ch_real b = first ? g : mom * buf[i] + damp * g;
        buf[i] = b;
        g = nesterov ? g + mom * b : b;
    }
    p[i] -= lr * g;
}

/* Adam (L2 weight decay) or AdamW (decoupled: p scaled by decay first). */
static inline CH_HD void ch_adam_at(size_t i, bool decoupled, ch_real b1, ch_real b2, ch_real eps, ch_real wd, ch_real decay,
                              ch_real step_size, ch_real bc2_sqrt, ch_real *p, const ch_real *grad, ch_real *m1,
                              ch_real *m2)
{
    ch_real g = grad[i];
    if (decoupled) p[i] *= decay;
    else g += wd * p[i];
    m1[i] = m1[i] * b1 + (1 - b1) * g;
    m2[i] = m2[i] * b2 + (1 - b2) * g * g;
    const ch_real denom = (ch_real)(sqrt((double)m2[i]) / bc2_sqrt + eps);
    p[i] -= step_size * (m1[i] / denom);
}

/* Adagrad with the decayed rate clr. */
static inline CH_HD void ch_adagrad_at(size_t i, ch_real clr, ch_real wd, ch_real eps, ch_real *p, const ch_real *grad,
                                 ch_real *sum)
{
    const ch_real g = grad[i] + wd * p[i];
    sum[i] += g * g;
    p[i] -= clr * (g / (sqrt((double)sum[i]) + eps));
}

#endif
