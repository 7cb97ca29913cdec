/* Data set accessors and batch assembly. */
#include "data/dataset.h"

#include <stdlib.h>

size_t ch_dataset_size(const ch_dataset *d) { return d->n; }
int ch_dataset_classes(const ch_dataset *d) { return d->classes; }

void ch_dataset_shape(const ch_dataset *d, int *c, int *h, int *w)
{
    *c = d->c;
    *h = d->h;
    *w = d->w;
}

void ch_dataset_truncate(ch_dataset *d, size_t n)
{
    if (n > 0 && n < d->n) d->n = n;
}

void ch_dataset_free(ch_dataset *d)
{
    if (!d) return;
    free(d->images);
    free(d->labels);
    free(d);
}

void ch_dataset_gather(const ch_dataset *d, const uint32_t *idx, int count, ch_real *x,
                       int32_t *labels)
{
    const size_t per = (size_t)d->c * d->h * d->w;
    const ch_real scale = (ch_real)(1.0 / 255.0);
    for (int i = 0; i < count; i++) {
        const uint8_t *src = d->images + (size_t)idx[i] * per;
        ch_real *dst = x + (size_t)i * per;
        for (size_t j = 0; j < per; j++) dst[j] = src[j] * scale;
        labels[i] = d->labels[idx[i]];
    }
}
