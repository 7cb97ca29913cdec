/* Softmax cross-entropy for one sample, plain C11 that the CPU loss kernel runs per sample and the
 * CUDA one per thread: the same arithmetic, in double, on both. */
#ifndef CH_KERNELS_LOSS_BODY_H
#define CH_KERNELS_LOSS_BODY_H

#include <math.h>
#include <stdint.h>

#include "core/hd.h"
#include "core/real.h"

/* Logits z (k) and the label: adds the loss logsumexp(z) - z[label] (the max subtracted for
 * stability) to *loss and 1 to *hits when the first argmax is the label; g (k, skipped when NULL)
 * = (softmax - onehot) * scale. */
static inline CH_HD void ch_xent_sample(const ch_real *z, int k, int32_t label, double scale, ch_real *g,
                                        double *loss, double *hits)
{
    int arg = 0;
    for (int j = 1; j < k; j++)
        if (z[j] > z[arg]) arg = j;
    const double zmax = z[arg];
    double se = 0;
    for (int j = 0; j < k; j++) se += exp((double)z[j] - zmax);
    const double lse = zmax + log(se);
    *loss += lse - z[label];
    *hits += arg == label;
    if (g)
        for (int j = 0; j < k; j++) g[j] = (ch_real)((exp((double)z[j] - lse) - (j == label)) * scale);
}

#endif
