/* bfloat16: the top half of a float's bits (8 exponent bits, 7 of mantissa). Used where values
 * travel: the compressed gradient exchange (--grad-compress bf16). --precision bf16's products
 * round through oneDNN's reorders instead, which tests hold to this. */
#ifndef CH_BF16_H
#define CH_BF16_H

#include <stdint.h>
#include <string.h>

/* Round to nearest, ties to even, as PyTorch's and oneDNN's conversions do. A NaN stays a NaN
 * (quiet, so that rounding cannot carry its payload into the infinity pattern); values within half
 * a bf16 step of the largest float round to infinity, as they must. */
static inline uint16_t ch_bf16_from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x0040u;
    /* A select, not a branch: loops over arrays of these vectorise. */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

static inline float ch_bf16_to_float(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
