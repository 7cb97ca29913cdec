/* Average pooling's divisor for window (i, j), plain C11 that the CPU pooling and the CUDA kernels
 * both run: its part inside the padded input (count_include_pad), or inside the input alone
 * (exclude_pad). k * k for every window of floor mode with padding counted. */
#ifndef CH_KERNELS_POOL_BODY_H
#define CH_KERNELS_POOL_BODY_H

#include "core/hd.h"
#include "kernels/kernels.h"

static inline CH_HD int ch_avgpool_divisor(const ch_pool_desc *d, int i, int j)
{
    int h0 = i * d->stride - d->pad, w0 = j * d->stride - d->pad;
    int h1 = h0 + d->k, w1 = w0 + d->k;
    if (h1 > d->h + d->pad) h1 = d->h + d->pad;
    if (w1 > d->w + d->pad) w1 = d->w + d->pad;
    if (d->exclude_pad) {
        if (h0 < 0) h0 = 0;
        if (w0 < 0) w0 = 0;
        if (h1 > d->h) h1 = d->h;
        if (w1 > d->w) w1 = d->w;
    }
    const int cnt = (h1 - h0) * (w1 - w0);
    return cnt > 0 ? cnt : 1;
}

#endif
