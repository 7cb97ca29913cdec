/* BatchNorm's per-channel arithmetic between its statistics and its normalisation: plain C11 that
 * the CPU kernel runs per channel and a device kernel can include as its body. All the host's
 * former arithmetic, in the same order and precision, so the bits did not move. */
#ifndef CH_KERNELS_NORM_BODY_H
#define CH_KERNELS_NORM_BODY_H

#include "core/hd.h"

#include <math.h>

#include "core/real.h"

/* Channel i. Training (mean != NULL): the batch's mean and biased variance (count values) give the
 * saved mean and 1/std, and move the running statistics by momentum (the variance unbiased).
 * Evaluation (mean == NULL): the running statistics give them. Then scale = gamma / std and
 * shift = beta - mean * scale, what forward applies. save holds mean, invstd, scale, shift, c
 * apart. */
static inline CH_HD void ch_bn_finalize_channel(int i, int c, const double *mean, const double *var, double count,
                                          double eps, double momentum, const ch_real *gamma,
                                          const ch_real *beta, ch_real *rmean, ch_real *rvar, ch_real *save)
{
    ch_real *s_mean = save, *s_invstd = save + c, *s_scale = save + 2 * c, *s_shift = save + 3 * c;
    if (mean) {
        const double m = mean[i], v = var[i];
        s_mean[i] = (ch_real)m;
        s_invstd[i] = (ch_real)(1.0 / sqrt(v + eps));
        const double unbiased = count > 1 ? v * count / (count - 1) : v;
        rmean[i] = (ch_real)((1 - momentum) * rmean[i] + momentum * m);
        rvar[i] = (ch_real)((1 - momentum) * rvar[i] + momentum * unbiased);
    } else {
        s_mean[i] = rmean[i];
        s_invstd[i] = (ch_real)(1.0 / sqrt((double)rvar[i] + eps));
    }
    s_scale[i] = gamma[i] * s_invstd[i];
    s_shift[i] = beta[i] - s_mean[i] * s_scale[i];
}

#endif
