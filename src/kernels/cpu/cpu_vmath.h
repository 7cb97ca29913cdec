/* Float e^x, tanh, erf and erfc as straight-line arithmetic: no libm call and no branch, so that
 * a loop over an array of them vectorises (GCC turns the selects into blends and fmaf into FMA
 * under -march=native). The activation kernels of the float build use them; the double build
 * keeps libm (act_body.h), whose accuracy the gradient checks need.
 * Why not libm: glibc's exp, tanh and erf are scalar double calls; sigmoid, tanh, erf and both
 * GELUs ran at 29-87 Melem/s on one Zen 3 core that way, 360-760 this way (bench/activations,
 * docs/PERFORMANCE.md).
 * Accuracy (test_kernels, against libm in double): within 3.3 float ulps, GELU's the worst.
 * Edge values: NaN gives NaN, +-inf the limits; e^x is 0 below -87.34 (where it is subnormal)
 * and +inf above 88.37, a little before float's true overflow at 88.72.
 * The coefficients were fitted here (weighted least squares, iterated to minimax, in double):
 * erf(x) / x as a polynomial in x^2 on [0, 1]; erfc(x) e^(x^2) as a polynomial in
 * t = 1 / (1 + x / 2) on [0, 10] (relative error 6e-9 in double). e^x's polynomial and tanh's
 * below 0.625 are the published Cephes expf and tanhf coefficients.
 * Without -march=native (COHORT_NATIVE=OFF) fmaf may be a libm call: still exact, not vectorised. */
#ifndef CH_KERNELS_CPU_VMATH_H
#define CH_KERNELS_CPU_VMATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define CH_VM_EXP_LO (-87.33654f)
#define CH_VM_EXP_HI 88.37626f

static inline uint32_t ch_vm_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ch_vm_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* c[0] t^(n-1) + c[1] t^(n-2) + ... + c[n-1] by Horner's rule (n is a constant at every call, so
 * the loop unrolls into n - 1 multiply-adds). */
static inline float ch_vm_poly(float t, const float *c, int n)
{
    float p = c[0];
    for (int i = 1; i < n; i++) p = p * t + c[i];
    return p;
}

/* e^x = 2^n e^r, n = round(x / ln 2), |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact). The
 * rounding adds 1.5 * 2^23, which leaves n in the low mantissa bits of t: no float-to-int
 * conversion, so a NaN only flows through (its bits make a garbage scale times a NaN). */
static inline float ch_vm_exp(float x)
{
    const float xc = x < CH_VM_EXP_LO ? CH_VM_EXP_LO : x > CH_VM_EXP_HI ? CH_VM_EXP_HI : x;
    const float t = xc * 1.44269504088896341f + 12582912.0f;
    const float n = t - 12582912.0f;
    const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    static const float c[6] = { 1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f };
    const float p = ch_vm_poly(r, c, 6);
    const float y = (p * r * r + r + 1.0f) * ch_vm_float((ch_vm_bits(t) - 0x4B400000u + 127u) << 23);
    return x < CH_VM_EXP_LO ? 0.0f : x > CH_VM_EXP_HI ? INFINITY : y;
}

/* e^(-k x^2) for k 1 or 1/2, with x^2's rounding error lo (x^2 = h + lo exactly, by FMA) folded
 * in as e^(-k lo) = 1 - k lo: without it the result is off by k x^2 ulps, 16 at x = 4. |x| is
 * held at 14 (where the result is already 0), so that a huge x gives 0, not inf - inf = NaN. */
static inline float ch_vm_exp_neg_square(float x, float k)
{
    const float ax = fabsf(x) > 14.0f ? 14.0f : fabsf(x);
    const float h = ax * ax, lo = fmaf(ax, ax, -h);
    return ch_vm_exp(-k * h) * (1.0f - k * lo);
}

static inline float ch_vm_sigmoid(float x) { return 1.0f / (1.0f + ch_vm_exp(-x)); }

/* Below 0.625 an odd polynomial (Cephes tanhf's), where 1 - 2 / (e^2x + 1) would cancel. */
static inline float ch_vm_tanh(float x)
{
    const float ax = fabsf(x), z = x * x;
    static const float c[5] = { -5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f,
                                1.33314422036e-1f, -3.33332819422e-1f };
    const float p = ch_vm_poly(z, c, 5);
    const float small = copysignf(p * z * x + x, x);   /* tanh(-0) = -0 */
    const float large = copysignf(1.0f - 2.0f / (ch_vm_exp(2.0f * ax) + 1.0f), x);
    return ax < 0.625f ? small : large;
}

/* erf(x) for |x| <= 1 (used up to 1/2, where 1 - erfc would cancel). */
static inline float ch_vm_erf_small(float x)
{
    static const float c[7] = { 7.853904010e-05f, -8.010207802e-04f, 5.188329501e-03f, -2.685381305e-02f,
                                1.128358518e-01f, -3.761262583e-01f, 1.128379166e+00f };
    return ch_vm_poly(x * x, c, 7) * x;
}

/* erfc(|s|) (0 past |s| ~9.3, where it underflows), where s = c x and c^2 = k: the polynomial
 * reads s, the factor e^(-s^2) = e^(-k x^2) reads x, so that the rounding of c x does not pass
 * through the exponential (it would cost 2 s^2 ulps: ~85 in GELU at x = -12). */
static inline float ch_vm_erfc(float s, float x, float k)
{
    static const float c[11] = { 2.774819960e-02f, -2.098573859e-01f, 6.404642285e-01f, -9.660413316e-01f,
                                 6.833941190e-01f, -2.513730204e-01f, 2.850760628e-01f, 2.234463250e-01f,
                                 2.852900574e-01f, 2.818441693e-01f, 8.570464889e-06f };
    return ch_vm_poly(1.0f / (1.0f + 0.5f * fabsf(s)), c, 11) * ch_vm_exp_neg_square(x, k);
}

/* erf(x) as 1 - erfc(|x|) where that does not cancel (|x| > 1/2). */
static inline float ch_vm_erf(float x)
{
    const float large = copysignf(1.0f - ch_vm_erfc(x, x, 1.0f), x);
    return fabsf(x) <= 0.5f ? ch_vm_erf_small(x) : large;
}

/* 1 + erf(x / sqrt 2) (twice the normal CDF, GELU's factor) = erfc(-x / sqrt 2): 2 - erfc for
 * x > 0, erfc itself below, neither of which cancels. */
static inline float ch_vm_twice_normal_cdf(float x)
{
    const float c = ch_vm_erfc(x * 0.70710678118654752f, x, 0.5f);
    const bool positive = x > 0;
    return (positive ? 2.0f : 0.0f) + (positive ? -c : c);   /* selects GCC keeps branch-free */
}

#endif
