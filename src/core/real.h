/* The engine's floating-point type.
 * The library is compiled twice from the same sources: as float (libcohort, what users run) and as
 * double (libcohort_f64, built for the tests only) so that gradients of the very same layer code can
 * be checked against central differences in double precision. */
#ifndef CH_REAL_H
#define CH_REAL_H

#include <math.h>

#ifdef CH_REAL_DOUBLE
typedef double ch_real;
#define CH_REAL_NAME "float64"
#else
typedef float ch_real;
#define CH_REAL_NAME "float32"
#endif

/* a * b + c in one rounding. -std=c11 keeps GCC from contracting the expression itself, so hot
 * loops that want the FMA instruction call this. */
static inline ch_real ch_fma(ch_real a, ch_real b, ch_real c)
{
#ifdef CH_REAL_DOUBLE
    return fma(a, b, c);
#else
    return fmaf(a, b, c);
#endif
}

#endif
