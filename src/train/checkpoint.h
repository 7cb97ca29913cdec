/* Checkpoints: a directory DIR/NAME holding
 *   model.safetensors      the state_dict (weights, BatchNorm buffers, num_batches_tracked as I64),
 *                          names as PyTorch's, loadable by model.load_state_dict;
 *   optimizer.safetensors  SGD momentum buffers, named "<param>.momentum_buffer";
 *   trainer.json           format version, model and configuration, position (epoch, step, samples
 *                          seen in the epoch, global step), the epoch's partial sums, the RNG and
 *                          data-order keys, and the world size and devices it was written with.
 * Rank 0 writes it into DIR/.cohort-tmp-NAME-PID, fsyncs every file and the directory, renames it to
 * DIR/NAME, then replaces DIR/latest (a one-line file naming it) the same way: a crash at any moment
 * leaves the previous checkpoint complete and `latest` pointing at a complete one.
 * Loading reads and checks everything before touching the model (nothing half-loaded) into a
 * staged copy; the trainer (trainer_ckpt.c) runs that on rank 0 and shares the result with every
 * replica of every rank. This module sees a run only through ch_ckpt_run, never the trainer. */
#ifndef CH_TRAIN_CHECKPOINT_H
#define CH_TRAIN_CHECKPOINT_H

#include "cohort.h"
#include "nn/model.h"
#include "optim/optim.h"
#include "optim/schedule.h"
#include "train/position.h"

/* The names of a save in progress (and the folder's lock) all start with this marker, so that
 * clearing up after a save that was killed touches only what cohort made, never the user's own
 * dot files. */
#define CH_CHECKPOINT_MARK ".cohort-"

enum { CH_CHECKPOINT_FORMAT = CH_POSITION_FORMAT };


/* Create dir (and its parents) if needed; fail when it is no directory or cannot be written. */
ch_status ch_checkpoint_prepare(const char *dir, ch_err *err);
/* Prepare dir, then take its lock (flock on DIR/.cohort-lock, held until ch_checkpoint_unlock):
 * a second trainer on the same folder is refused with one line naming the first one's pid. With
 * the lock held, what a killed save left (DIR/.cohort-tmp-*, .cohort-old-*, .cohort-latest.*) is
 * removed; nothing else in the folder is touched. */
ch_status ch_checkpoint_lock(const char *dir, int *fd, ch_err *err);
void ch_checkpoint_unlock(int fd);
/* What a checkpoint records of a run, and where a load lands: the trainer fills it (borrowed
 * pointers, valid while the trainer lives). */
typedef struct ch_ckpt_run {
    ch_model *model;                /* replica 0's: saved from, staged for, loaded into */
    ch_optim *opt;                  /* replica 0's optimizer */
    const char *model_name, *init;
    const char *normalize;          /* "" when none */
    const char *graph_json;         /* the graph's description (NULL: a zoo model) */
    uint64_t graph_print;           /* its fingerprint (0: a zoo model) */
    const ch_train_config *cfg;     /* batch size, lr, momentum, seed, sync-BN, keep, allow_nonfinite */
    const ch_optim_config *optim;
    const ch_schedule *sched;
    uint64_t train_samples;
    int world_size;
    const ch_device_list *devices;
    const int64_t *shares;          /* world_size ranks' --shares in use (NULL: the even split) */
} ch_ckpt_run;

/* Everything read from a checkpoint's files, checked, before anything is copied into a model. */
typedef struct ch_ckpt_staged {
    ch_real *params, *buffers, *state[CH_OPTIM_MAX_STATE];
    double *counters;
    bool has_state;         /* the optimizer file holds state (empty: a fresh optimizer) */
    double opt_steps;
    ch_ckpt_position pos;
} ch_ckpt_staged;

/* Write checkpoint DIR/NAME ("epoch-0003", "step-00000620") of run at pos. Called on rank 0 only. */
ch_status ch_checkpoint_save(const ch_ckpt_run *run, const char *dir, const char *name,
                             const ch_ckpt_position *pos, ch_err *err);
/* Allocate s for run's model (zeros: what ranks other than 0 hold before sharing). */
ch_status ch_checkpoint_stage_alloc(const ch_ckpt_run *run, ch_ckpt_staged *s, ch_err *err);
/* Read and check into s (allocated): the checkpoint directory dir (resolved; its trainer.json must
 * fit run, its graph run's graph), or with dir NULL only the weights file `weights` (a `module.`
 * prefix, as PyTorch's DataParallel writes, is stripped). Touches no model. */
ch_status ch_checkpoint_stage(const ch_ckpt_run *run, const char *dir, const char *weights,
                              ch_ckpt_staged *s, ch_err *err);
/* s's state_dict into m; its optimizer state into opt unless opt is NULL (weights only). */
void ch_checkpoint_apply(const ch_ckpt_staged *s, ch_model *m, ch_optim *opt);
void ch_checkpoint_staged_free(ch_ckpt_staged *s);
/* Write m's state_dict alone to file (atomically), tagged with model_name. */
ch_status ch_checkpoint_export(const ch_model *m, const char *model_name, const char *file, ch_err *err);
/* Refuse paths longer than cohort's buffers take (one line naming it). */
ch_status ch_checkpoint_check_path(const char *path, ch_err *err);
/* Export straight from a checkpoint directory (no data set needed): its model.safetensors is read,
 * checked against the architecture in its trainer.json, and written to file. */
ch_status ch_checkpoint_export_dir(const char *path, const char *file, ch_err *err);
/* DIR/latest exists as an entry (lstat: a dangling or looping symlink counts, and is an error
 * where it is read, never a reason to start afresh). */
bool ch_checkpoint_has_latest(const char *dir);
/* What of a run's checkpoints dir holds ("latest", else the first epoch-* or step-* entry) into
 * name; false when it holds none (or cannot be read: nothing to lose there). */
bool ch_checkpoint_find_any(const char *dir, char *name, size_t len);
/* Resolve a --resume/--checkpoint argument: DIR/NAME as given, or DIR's latest. */
ch_status ch_checkpoint_resolve(const char *path, char *out, size_t len, ch_err *err);
/* The graph a checkpoint (a directory, or one with latest) keeps in graph.json, rebuilt; *out is
 * NULL for a model of the zoo. The caller frees it. */
ch_status ch_checkpoint_graph(const char *path, ch_graph **out, ch_err *err);
/* Read the model name, class count and input normalization ("" for none) a checkpoint was written
 * for (for cohort eval). */
ch_status ch_checkpoint_peek(const char *path, char *model, size_t len, int *classes, char *normalize,
                             size_t nlen, int *image_side, ch_err *err);

#endif
