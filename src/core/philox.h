/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): the body,
 * plain C11 with no state, shared by the host's reader (rng.c) and the dropout-mask kernel, which
 * a device can compile as it is and so draw the host's bits. */
#ifndef CH_CORE_PHILOX_H
#define CH_CORE_PHILOX_H

#include "core/hd.h"

#include <stdint.h>

static inline CH_HD void ch_philox_round(uint32_t ctr[4], const uint32_t key[2])
{
    const uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0];
    const uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr[2];
    const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    ctr[0] = hi1 ^ ctr[1] ^ key[0];
    ctr[1] = lo1;
    ctr[2] = hi0 ^ ctr[3] ^ key[1];
    ctr[3] = lo0;
}

/* Four 32-bit words for (seed, stream, counter). */
static inline CH_HD void ch_philox_block(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4])
{
    uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
    uint32_t ctr[4] = { (uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                        (uint32_t)(stream >> 32) };
    for (int i = 0; i < 10; i++) {
        ch_philox_round(ctr, key);
        key[0] += 0x9E3779B9u;
        key[1] += 0xBB67AE85u;
    }
    for (int i = 0; i < 4; i++) out[i] = ctr[i];
}

#endif
