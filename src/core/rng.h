/* Counter-based random numbers (Philox-4x32-10).
 * A value is a pure function of (key, counter): no hidden state, so any sample, layer or epoch can
 * draw its numbers independently of thread count and order, and the same command gives the same bits. */
#ifndef CH_RNG_H
#define CH_RNG_H

#include <stdint.h>

/* Streams keep unrelated uses apart even with the same seed. */
enum {
    CH_RNG_STREAM_INIT = 1,     /* parameter initialisation */
    CH_RNG_STREAM_SHUFFLE = 2,  /* epoch permutation */
    CH_RNG_STREAM_DROPOUT = 3,  /* dropout masks */
    CH_RNG_STREAM_AUGMENT = 4,  /* data augmentation: crop offsets and flips */
    CH_RNG_STREAM_AUGMENT_FILE = 5, /* data augmentation: RandomResizedCrop windows */
    CH_RNG_STREAM_TEST = 99,    /* tests and benchmarks */
};

/* Four 32-bit random words for (seed, stream, counter). */
void ch_philox(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4]);

/* A sequential reader over one (seed, stream): counter advances by one block of 4 words. */
typedef struct ch_rng {
    uint64_t seed, stream, counter;
    uint32_t buf[4];
    int used;
} ch_rng;

void ch_rng_init(ch_rng *r, uint64_t seed, uint64_t stream, uint64_t start);
uint32_t ch_rng_u32(ch_rng *r);
double ch_rng_uniform(ch_rng *r);                 /* [0, 1) with 53 random bits */
double ch_rng_normal(ch_rng *r);                  /* standard normal (Box-Muller) */
uint32_t ch_rng_below(ch_rng *r, uint32_t n);     /* uniform in [0, n), unbiased */

/* perm[i] = i: the order before any shuffle. */
void ch_rng_identity(uint32_t *perm, uint32_t n);
/* perm[i] = a uniformly random permutation of 0..n-1 (Fisher-Yates). */
void ch_rng_permutation(ch_rng *r, uint32_t *perm, uint32_t n);

#endif
