/* Per-element bodies of the smooth activations, in double: plain C11 today, written so that a
 * device kernel can include them as they are (no state, no libc beyond math.h). */
#ifndef CH_KERNELS_ACT_BODY_H
#define CH_KERNELS_ACT_BODY_H

#include "core/hd.h"

#include <math.h>

#define CH_SQRT1_2 0.70710678118654752440    /* 1 / sqrt 2 */
#define CH_INV_SQRT_2PI 0.39894228040143267794 /* 1 / sqrt(2 pi) */
#define CH_SQRT_2_PI 0.79788456080286535588  /* sqrt(2 / pi) */
#define CH_2_SQRTPI 1.12837916709551257390   /* 2 / sqrt(pi) */
#define CH_GELU_CUBIC 0.044715               /* the tanh form's cubic term, as PyTorch's */

/* d erf(x) / dx = 2 / sqrt(pi) * exp(-x^2). */
static inline CH_HD double ch_erf_slope(double x) { return CH_2_SQRTPI * exp(-x * x); }

static inline CH_HD double ch_gelu(double x) { return 0.5 * x * (1 + erf(x * CH_SQRT1_2)); }

/* Phi(x) + x * phi(x): the normal CDF and density. */
static inline CH_HD double ch_gelu_slope(double x)
{
    return 0.5 * (1 + erf(x * CH_SQRT1_2)) + x * CH_INV_SQRT_2PI * exp(-0.5 * x * x);
}

static inline CH_HD double ch_gelu_tanh(double x)
{
    return 0.5 * x * (1 + tanh(CH_SQRT_2_PI * (x + CH_GELU_CUBIC * x * x * x)));
}

static inline CH_HD double ch_gelu_tanh_slope(double x)
{
    const double t = tanh(CH_SQRT_2_PI * (x + CH_GELU_CUBIC * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * CH_SQRT_2_PI * (1 + 3 * CH_GELU_CUBIC * x * x);
}

#endif
