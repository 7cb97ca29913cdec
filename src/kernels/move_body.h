/* Index maps of the data-movement kernels, plain C11 that the CUDA kernels include as they are. */
#ifndef CH_KERNELS_MOVE_BODY_H
#define CH_KERNELS_MOVE_BODY_H

#include "core/hd.h"
#include "kernels/kernels.h"

/* The strides of x's sample dimensions (c, h, w) in elements. */
static inline CH_HD size_t ch_permute_stride(const ch_permute_desc *d, int dim)
{
    return dim == 0 ? (size_t)d->dims[1] * d->dims[2] : dim == 1 ? (size_t)d->dims[2] : 1;
}

/* Which element of x's sample the permuted sample's element i (in its own order) is. */
static inline CH_HD size_t ch_permute_source(const ch_permute_desc *d, size_t i)
{
    const size_t o1 = (size_t)d->dims[d->perm[1]], o2 = (size_t)d->dims[d->perm[2]];
    const size_t i2 = i % o2, i1 = i / o2 % o1, i0 = i / (o2 * o1);
    return i0 * ch_permute_stride(d, d->perm[0]) + i1 * ch_permute_stride(d, d->perm[1]) +
           i2 * ch_permute_stride(d, d->perm[2]);
}

#endif
