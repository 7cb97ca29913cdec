/* Labelled image data sets: uint8 pixels in memory (IDX, CIFAR-10), or an ImageFolder whose files
 * are decoded on demand (data/folder.h). */
#ifndef CH_DATA_DATASET_H
#define CH_DATA_DATASET_H

#include "cohort.h"

typedef struct ch_folder ch_folder;

/* Labels are 16-bit: an ImageFolder may have ImageNet's 1000 classes. */
enum { CH_MAX_CLASSES = 65535 };

struct ch_dataset {
    size_t n;
    int c, h, w, classes;   /* for a folder, (c, h, w) is the shape after the transforms */
    uint8_t *images;        /* (n, c, h, w), owned; NULL for a folder */
    uint16_t *labels;       /* (n), owned, each < classes */
    ch_folder *folder;      /* owned; NULL for in-memory data */
};

/* The loaders with a limit: only the first `limit` samples are read (0: all). */
ch_status ch_idx_load(const char *dir, ch_split split, size_t limit, ch_dataset **out, ch_err *err);
ch_status ch_cifar_load(const char *dir, ch_split split, size_t limit, ch_dataset **out, ch_err *err);

/* True when DIR (or DIR/cifar-10-batches-bin) holds test_batch.bin. */
bool ch_cifar_present(const char *dir);

/* Batches are gathered by ch_augment_gather (data/augment.h): with no transforms it is
 * torchvision's ToTensor, pixels / 255. */

#endif
