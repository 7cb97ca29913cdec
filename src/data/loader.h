/* The threaded loader (-j N): N worker threads decode and augment the samples of the coming batches
 * into a ring of `depth` batch buffers while the training step runs on the current one.
 *
 * Workers claim a few samples at a time of the oldest batch not yet claimed, so all N work on the
 * same batch and it is ready as early as possible; a worker waits when the ring is full. Memory is
 * depth batches, whatever the size of the data set and N. Every sample's transform is keyed by
 * (seed, epoch, sample), so the bits do not depend on N or on which worker took which sample. */
#ifndef CH_DATA_LOADER_H
#define CH_DATA_LOADER_H

#include "core/real.h"
#include "core/status.h"
#include "data/augment.h"
#include "data/dataset.h"

typedef struct ch_loader ch_loader;

/* One batch: its samples' indices into the data set. */
typedef struct ch_loader_batch {
    const uint32_t *idx;
    int count;
} ch_loader_batch;

enum { CH_LOADER_DEPTH = 2, CH_LOADER_MAX_WORKERS = 64 };

/* Buffers for batches of up to max_batch samples of sample_elems values each. */
ch_status ch_loader_create(int workers, int max_batch, size_t sample_elems, ch_loader **out, ch_err *err);

/* Starts the workers on batches[0..nbatches) of a training epoch. The arrays must stay valid
 * until ch_loader_stop. */
ch_status ch_loader_start(ch_loader *l, const ch_augment *a, const ch_dataset *d, uint64_t seed, int epoch,
                          const ch_loader_batch *batches, int nbatches, ch_err *err);

/* Waits for the next batch; x (count, sample) and labels stay valid until ch_loader_release.
 * Fails with the first worker's error (an image that does not decode). */
ch_status ch_loader_next(ch_loader *l, const ch_real **x, const int32_t **labels, ch_err *err);
void ch_loader_release(ch_loader *l);

/* Stops and joins the workers (at the end of an epoch, or early after a failure). */
void ch_loader_stop(ch_loader *l);

/* Seconds ch_loader_next spent waiting for data since the last call (then reset). */
double ch_loader_take_wait_s(ch_loader *l);

void ch_loader_free(ch_loader *l);

#endif
