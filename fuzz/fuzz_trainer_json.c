/* libFuzzer harness over the trainer.json reader that --resume trusts: duplicate keys, types,
 * whole numbers, ranges, and the position checked against a run of 1000 samples in batches of
 * 64. Any input must give a clean status; what is accepted must be a position inside that run.
 * Built and run by scripts/fuzz. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "train/position.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ch_ckpt_expect e = { .model = "lenet", .classes = 10, .seed = 4, .train_samples = 1000,
                               .batch_size = 64, .optimizer = "sgd" };
    ch_ckpt_position p;
    double steps = 0;
    ch_err err;
    if (ch_checkpoint_parse_position((const char *)data, size, "fuzz", &e, &p, &steps, &err) != CH_STATUS_OK)
        return 0;
    if (p.epoch < 0 || p.step_in_epoch < 0 || p.seen_in_epoch >= 1000 ||
        p.seen_in_epoch != (uint64_t)p.step_in_epoch * 64 || !(steps >= 0) || p.hits < 0 ||
        p.hits > (double)p.seen_in_epoch || !(p.train_acc >= -1 && p.train_acc <= 1))
        abort();
    return 0;
}
