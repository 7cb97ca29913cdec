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
 * Loading reads and checks everything on rank 0 before touching the model (nothing half-loaded),
 * then broadcasts the state to every replica of every rank. */
#ifndef CH_TRAIN_CHECKPOINT_H
#define CH_TRAIN_CHECKPOINT_H

#include "train/position.h"
#include "train/trainer.h"

enum { CH_CHECKPOINT_FORMAT = CH_POSITION_FORMAT };


/* Create dir (and its parents) if needed; fail when it is no directory or cannot be written. */
ch_status ch_checkpoint_prepare(const char *dir, ch_err *err);
/* Prepare dir, then take its lock (flock on DIR/.cohort-lock, held until ch_checkpoint_unlock):
 * a second trainer on the same folder is refused with one line naming the first one's pid. With
 * the lock held, what a killed save left (DIR/.cohort-tmp-*, .cohort-old-*, .cohort-latest.*) is
 * removed; nothing else in the folder is touched. */
ch_status ch_checkpoint_lock(const char *dir, int *fd, ch_err *err);
void ch_checkpoint_unlock(int fd);
/* Collective over the trainer's ranks (only rank 0 writes). name: "epoch-0003", "step-00000620". */
ch_status ch_checkpoint_save(ch_trainer *t, const char *dir, const char *name,
                             const ch_ckpt_position *pos, ch_err *err);
/* Collective. path: a checkpoint directory, or DIR with a `latest` file. On success the trainer's
 * replicas hold the checkpoint's state and pos where it stood. */
ch_status ch_checkpoint_load(ch_trainer *t, const char *path, ch_ckpt_position *pos, ch_err *err);
/* Only the weights and buffers from a model.safetensors-style file (a `module.` prefix, as
 * PyTorch's DataParallel writes, is stripped). Collective. */
ch_status ch_checkpoint_load_weights(ch_trainer *t, const char *file, ch_err *err);
/* Write the trainer's state_dict alone to file (atomically). Rank 0 only. */
ch_status ch_checkpoint_export(const ch_trainer *t, const char *file, ch_err *err);
/* Export straight from a checkpoint directory (no data set needed): its model.safetensors is read,
 * checked against the architecture in its trainer.json, and written to file. */
ch_status ch_checkpoint_export_dir(const char *path, const char *file, ch_err *err);
/* Resolve a --resume/--checkpoint argument: DIR/NAME as given, or DIR's latest. */
ch_status ch_checkpoint_resolve(const char *path, char *out, size_t len, ch_err *err);
/* Read the model name, class count and input normalization ("" for none) a checkpoint was written
 * for (for cohort eval). */
/* The graph a checkpoint (a directory, or one with latest) keeps in graph.json, rebuilt; *out is
 * NULL for a model of the zoo. The caller frees it. */
ch_status ch_checkpoint_graph(const char *path, ch_graph **out, ch_err *err);
ch_status ch_checkpoint_peek(const char *path, char *model, size_t len, int *classes, char *normalize,
                             size_t nlen, int *image_side, ch_err *err);

#endif
