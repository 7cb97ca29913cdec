/* Transforms on the way from the uint8 data set to a batch, as torchvision's for tensors:
 *   RandomCrop(size, padding=P): zero-pad by P on every side, take a random size x size window;
 *   RandomHorizontalFlip(0.5);
 *   ToTensor + Normalize(mean, std): x = (pixel / 255 - mean[c]) / std[c].
 * The random choices of a sample come from Philox keyed by (seed, epoch, sample index), so they do
 * not depend on the batch split, the devices, the ranks or the threads. Evaluation applies only
 * the normalization. */
#ifndef CH_DATA_AUGMENT_H
#define CH_DATA_AUGMENT_H

#include <stdbool.h>

#include "core/real.h"
#include "core/status.h"
#include "data/dataset.h"

enum { CH_AUG_MAX_CHANNELS = 4 };

typedef struct ch_augment {
    int crop_padding;           /* < 0: no random crop */
    bool flip;
    bool normalize;
    double mean[CH_AUG_MAX_CHANNELS], std[CH_AUG_MAX_CHANNELS];
} ch_augment;

/* "imagenet" or "M1,M2,M3/S1,S2,S3" (one value per channel, or one for all). */
ch_status ch_augment_parse_normalize(ch_augment *a, const char *spec, int channels, ch_err *err);
/* Samples idx[0..count) of d into x (count, c, h, w) and labels; train: apply the random
 * transforms of (seed, epoch). */
void ch_augment_gather(const ch_augment *a, const ch_dataset *d, const uint32_t *idx, int count,
                       bool train, uint64_t seed, int epoch, ch_real *x, int32_t *labels);

#endif
