/* The trainer's internals, visible to tests (the public face is in cohort.h). */
#ifndef CH_TRAIN_TRAINER_H
#define CH_TRAIN_TRAINER_H

#include "cohort.h"
#include "data/dataset.h"
#include "nn/model.h"
#include "optim/sgd.h"

struct ch_trainer {
    ch_train_config cfg;
    char model_name[32], init[64], devices[64];
    const ch_dataset *train, *test;
    const ch_kernels *k;
    int nthreads;
    ch_model *model;
    ch_sgd opt;
    ch_real *x;             /* batch input (batch, c, h, w) */
    int32_t *labels;        /* batch labels */
    ch_real *dlogits;       /* (batch, classes) */
    uint32_t *perm;         /* epoch order over the training set */
    uint32_t *eval_idx;     /* 0..batch-1 offsets for evaluation */
    int epoch;              /* epochs completed */
    uint64_t step;          /* steps completed */
    ch_progress_fn progress;
    void *progress_user;
};

/* One training step on samples idx[0..n): forward, loss (mean over the n samples), backward,
 * update. Returns the summed loss and the correct count. */
ch_status ch_trainer_step(ch_trainer *t, const uint32_t *idx, int n, double *loss_sum,
                          int64_t *correct, ch_err *err);

#endif
