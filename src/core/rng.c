/* The sequential reader over Philox-4x32-10 (core/philox.h), and what is drawn from it. */
#include "core/rng.h"

#include <math.h>

#include "core/philox.h"

void ch_philox(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4])
{
    ch_philox_block(seed, stream, counter, out);
}

void ch_rng_init(ch_rng *r, uint64_t seed, uint64_t stream, uint64_t start)
{
    r->seed = seed;
    r->stream = stream;
    r->counter = start;
    r->used = 4;
}

uint32_t ch_rng_u32(ch_rng *r)
{
    if (r->used == 4) {
        ch_philox(r->seed, r->stream, r->counter++, r->buf);
        r->used = 0;
    }
    return r->buf[r->used++];
}

double ch_rng_uniform(ch_rng *r)
{
    uint64_t a = ch_rng_u32(r) >> 5, b = ch_rng_u32(r) >> 6;
    return (double)(a * 67108864u + b) * (1.0 / 9007199254740992.0);
}

double ch_rng_normal(ch_rng *r)
{
    double u1 = ch_rng_uniform(r), u2 = ch_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint32_t ch_rng_below(ch_rng *r, uint32_t n)
{
    /* Lemire's multiply-shift with rejection: no modulo bias. */
    uint64_t m = (uint64_t)ch_rng_u32(r) * n;
    uint32_t lo = (uint32_t)m;
    if (lo < n) {
        uint32_t t = (uint32_t)(-n) % n;
        while (lo < t) {
            m = (uint64_t)ch_rng_u32(r) * n;
            lo = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

void ch_rng_identity(uint32_t *perm, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) perm[i] = i;
}

void ch_rng_permutation(ch_rng *r, uint32_t *perm, uint32_t n)
{
    ch_rng_identity(perm, n);
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = ch_rng_below(r, i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}
