/* In-memory labelled image data sets (uint8 pixels) and batch assembly. */
#ifndef CH_DATA_DATASET_H
#define CH_DATA_DATASET_H

#include "cohort.h"
#include "core/real.h"

struct ch_dataset {
    size_t n;
    int c, h, w, classes;
    uint8_t *images;    /* (n, c, h, w), owned */
    uint8_t *labels;    /* (n), owned, each < classes */
};

/* True when DIR (or DIR/cifar-10-batches-bin) holds test_batch.bin. */
bool ch_cifar_present(const char *dir);

/* Pixels of samples idx[0..count) as ch_real in [0, 1] (ToTensor), labels as int32. */
void ch_dataset_gather(const ch_dataset *d, const uint32_t *idx, int count, ch_real *x,
                       int32_t *labels);

#endif
