/* BatchNorm's per-channel arithmetic between its statistics and its normalisation, and LayerNorm's
 * per-group passes: plain C11 that the CPU kernels run per channel or group and a device kernel can
 * include as its body. BatchNorm's is all the host's former arithmetic, in the same order and
 * precision, so the bits did not move. */
#ifndef CH_KERNELS_NORM_BODY_H
#define CH_KERNELS_NORM_BODY_H

#include "core/hd.h"

#include <math.h>
#include <stddef.h>

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

/* LayerNorm of one group: len values inner apart from x, normalised by their mean and biased
 * variance (two passes in double), then y = xhat * gamma[j] + beta[j]. The group's mean and 1/std
 * go to *mean and *invstd, which backward reads. */
static inline CH_HD void ch_ln_forward_group(int len, size_t inner, const ch_real *x, const ch_real *gamma,
                                             const ch_real *beta, double eps, ch_real *y, ch_real *mean,
                                             ch_real *invstd)
{
    double s = 0, v = 0;
    for (int j = 0; j < len; j++) s += x[j * inner];
    const double m = s / len;
    for (int j = 0; j < len; j++) {
        const double d = x[j * inner] - m;
        v += d * d;
    }
    const double is = 1.0 / sqrt(v / len + eps);
    for (int j = 0; j < len; j++) y[j * inner] = (ch_real)((x[j * inner] - m) * is * gamma[j] + beta[j]);
    *mean = (ch_real)m;
    *invstd = (ch_real)is;
}

/* dx of one group from forward's saved mean and invstd: with g = dy * gamma[j] and xhat,
 * dx = invstd * (g - mean(g) - xhat * mean(g * xhat)), the means over the group, in double. */
static inline CH_HD void ch_ln_backward_group(int len, size_t inner, const ch_real *x, const ch_real *dy,
                                              const ch_real *gamma, ch_real mean, ch_real invstd, ch_real *dx)
{
    double a = 0, b = 0;
    for (int j = 0; j < len; j++) {
        const double g = (double)dy[j * inner] * gamma[j];
        a += g;
        b += g * ((x[j * inner] - mean) * invstd);
    }
    a /= len;
    b /= len;
    for (int j = 0; j < len; j++) {
        const double xh = (x[j * inner] - mean) * invstd, g = (double)dy[j * inner] * gamma[j];
        dx[j * inner] = (ch_real)(invstd * (g - a - xh * b));
    }
}

/* The gradients of gamma[j] and beta[j]: dy * xhat and dy summed over every group (outer, then
 * inner order), in double. x and dy are (outer, len, inner); mean and invstd (outer, inner). */
static inline CH_HD void ch_ln_param_grads(int j, int outer, int len, size_t inner, const ch_real *x,
                                           const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                           ch_real *dgamma, ch_real *dbeta)
{
    double sg = 0, sb = 0;
    for (int o = 0; o < outer; o++)
        for (size_t i = 0; i < inner; i++) {
            const size_t at = ((size_t)o * len + j) * inner + i, grp = (size_t)o * inner + i;
            sg += (double)dy[at] * ((x[at] - mean[grp]) * invstd[grp]);
            sb += dy[at];
        }
    dgamma[j] = (ch_real)sg;
    dbeta[j] = (ch_real)sb;
}

#endif
