/* trainer.json's position: the part of a checkpoint that says where training stood, parsed and
 * checked against the run that resumes it (see position.c). */
#ifndef CH_TRAIN_POSITION_H
#define CH_TRAIN_POSITION_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

enum { CH_POSITION_FORMAT = 1 };   /* trainer.json's format_version */

/* Where training stands, saved with the state. */
typedef struct ch_ckpt_position {
    int epoch;                  /* epochs completed */
    int step_in_epoch;          /* steps done in the next epoch (0 at an epoch's end) */
    uint64_t seen_in_epoch;     /* samples of the next epoch already trained on */
    uint64_t global_step;
    double loss_sum, hits;      /* the partial epoch's sums over all ranks */
    double train_loss, train_acc, test_loss, test_acc; /* the last finished epoch's; -1: none */
} ch_ckpt_position;

/* What a resumed trainer.json must agree with. */
typedef struct ch_ckpt_expect {
    const char *model;
    int classes;
    uint64_t seed;
    size_t train_samples;
    int batch_size;
    const char *optimizer;
} ch_ckpt_expect;

/* trainer.json's text (len bytes; path names it in messages) checked against e: every number for
 * type, integrality and range, duplicate keys refused. pos and opt_steps receive the position. */
ch_status ch_checkpoint_parse_position(const char *text, size_t len, const char *path, const ch_ckpt_expect *e,
                                       ch_ckpt_position *pos, double *opt_steps, ch_err *err);
/* The text as a JSON object of a format this cohort reads, with no duplicate key; NULL with err
 * set otherwise. The caller deletes it. */
cJSON *ch_position_parse_doc(const char *text, size_t len, const char *path, ch_err *err);
/* A metric as JSON: a number, or "nan", "inf", "-inf" (JSON has no NaN; cJSON would write null). */
cJSON *ch_position_metric_item(double v);

#endif
