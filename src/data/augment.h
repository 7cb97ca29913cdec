/* Transforms on the way from the data set to a batch, as torchvision's:
 *   in memory (IDX, CIFAR-10):
 *     RandomCrop(size, padding=P): zero-pad by P on every side, take a random size x size window;
 *   ImageFolder (files decoded here, data/folder.h):
 *     training: RandomResizedCrop(S, scale=(0.08, 1), ratio=(3/4, 4/3)), bilinear;
 *     evaluation: Resize(S x 256/224) of the shorter side + CenterCrop(S);
 *   both:
 *     RandomHorizontalFlip(0.5) (training);
 *     ToTensor + Normalize(mean, std): x = (pixel / 255 - mean[c]) / std[c].
 * The random choices of a sample come from Philox keyed by (seed, epoch, sample index), so they do
 * not depend on the batch split, the devices, the ranks or the loader threads. */
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
 * transforms of (seed, epoch). Fails only for an ImageFolder file that does not decode. */
ch_status ch_augment_gather(const ch_augment *a, const ch_dataset *d, const uint32_t *idx, int count,
                            bool train, uint64_t seed, int epoch, ch_real *x, int32_t *labels, ch_err *err);

/* The RandomResizedCrop window (x, y, w, h) of a W x H image, from the sample's random stream. */
void ch_augment_rrc_window(uint64_t seed, int epoch, uint32_t sample, int W, int H, int *x, int *y, int *w,
                           int *h);

#endif
