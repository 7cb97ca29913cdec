/* In-memory labelled image data sets (uint8 pixels) and batch assembly. */
#ifndef CH_DATA_DATASET_H
#define CH_DATA_DATASET_H

#include "cohort.h"

struct ch_dataset {
    size_t n;
    int c, h, w, classes;
    uint8_t *images;    /* (n, c, h, w), owned */
    uint8_t *labels;    /* (n), owned, each < classes */
};

/* True when DIR (or DIR/cifar-10-batches-bin) holds test_batch.bin. */
bool ch_cifar_present(const char *dir);

/* Batches are gathered by ch_augment_gather (data/augment.h): with no transforms it is
 * torchvision's ToTensor, pixels / 255. */

#endif
