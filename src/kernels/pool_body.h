/* Resampling arithmetic that the CPU pooling and the CUDA kernels both run, plain C11: average
 * pooling's divisor, and bilinear resampling's source pixels and weights. */
#ifndef CH_KERNELS_POOL_BODY_H
#define CH_KERNELS_POOL_BODY_H

#include "core/hd.h"
#include "kernels/kernels.h"

/* Average pooling's divisor for window (i, j): its part inside the padded input
 * (count_include_pad), or inside the input alone (exclude_pad). k * k for every window of floor
 * mode with padding counted. */
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

/* Bilinear resampling along one axis of in values resized to out, as PyTorch's
 * upsample_bilinear2d computes it (in float): output coordinate o reads i0 with weight 1 - *l1 and
 * i1 with weight *l1. align: the corners' centres meet (align_corners=True); else half-pixel
 * centres, clamped at 0. */
static inline CH_HD void ch_bilinear_src(int o, int in, int out, bool align, int *i0, int *i1, float *l1)
{
    float src;
    if (align) {
        src = out > 1 ? (float)(in - 1) / (float)(out - 1) * (float)o : 0.f;
    } else {
        src = (float)in / (float)out * ((float)o + 0.5f) - 0.5f;
        if (src < 0) src = 0;
    }
    int a = (int)src;
    if (a > in - 1) a = in - 1;
    *i0 = a;
    *i1 = a + (a < in - 1);
    *l1 = src - (float)a;
}

/* Output pixel (i, j) of an h x w plane x resized to oh x ow. */
static inline CH_HD ch_real ch_bilinear_at(const ch_real *x, int h, int w, int oh, int ow, bool align, int i, int j)
{
    int h0, h1, w0, w1;
    float lh, lw;
    ch_bilinear_src(i, h, oh, align, &h0, &h1, &lh);
    ch_bilinear_src(j, w, ow, align, &w0, &w1, &lw);
    const float ah = 1 - lh, aw = 1 - lw;
    return ah * (aw * x[h0 * w + w0] + lw * x[h0 * w + w1]) + lh * (aw * x[h1 * w + w0] + lw * x[h1 * w + w1]);
}

/* One plane's backward: dx (h x w) overwritten with dy's contributions, in output order. */
static inline CH_HD void ch_bilinear_plane_back(int h, int w, int oh, int ow, bool align, const ch_real *dy, ch_real *dx)
{
    for (int k = 0; k < h * w; k++) dx[k] = 0;
    for (int i = 0; i < oh; i++) {
        int h0, h1;
        float lh;
        ch_bilinear_src(i, h, oh, align, &h0, &h1, &lh);
        for (int j = 0; j < ow; j++) {
            int w0, w1;
            float lw;
            ch_bilinear_src(j, w, ow, align, &w0, &w1, &lw);
            const float ah = 1 - lh, aw = 1 - lw;
            const ch_real g = dy[i * ow + j];
            dx[h0 * w + w0] += ah * aw * g;
            dx[h0 * w + w1] += ah * lw * g;
            dx[h1 * w + w0] += lh * aw * g;
            dx[h1 * w + w1] += lh * lw * g;
        }
    }
}

#endif
