/* Parameter servers (--ps-servers S): the last S ranks of the job hold the parameters and the
 * optimizer state, each a shard of the flat buffer (ch_shard_lo over S); the other W ranks are
 * workers that train. A worker pushes each gradient bucket's pieces to the servers owning them as
 * backward completes the bucket (the push communicator below plugs into the gradient sync where
 * the MPI allreduce would), then pulls every server's updated shard before its next forward.
 *
 *   sync:  a server waits for every worker's push of a step, sums them in worker order, runs the
 *          optimizer on its shard once and sends the result to every worker: the allreduce run's
 *          arithmetic up to the order of float sums.
 *   async: a server applies each worker's push on arrival and answers that worker's pull with the
 *          newest shard; with a staleness bound s a worker's pull is held while it is more than s
 *          steps ahead of the slowest worker still in the epoch. Workers claim the epoch's work
 *          (slices of its global batches) from the first server as they go, so a fast worker
 *          trains more of them; at the epoch's end every worker flushes and all take the same
 *          parameters.
 *
 * Rank 0 sends the servers their starting shard (and a checkpoint's optimizer state) and fetches
 * their state for checkpoints, which therefore hold the full state under PyTorch's names and
 * resume with or without servers. Two-sided MPI only (comm/mpi.h's point to point): a server is a
 * loop that probes for the next message. Every wait is polled under --timeout: a stuck server or
 * worker ends the job naming the rank; a dead one is reported by mpirun. */
#ifndef CH_TRAIN_PS_H
#define CH_TRAIN_PS_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "comm/mpi.h"
#include "optim/optim.h"

typedef enum ch_ps_mode { CH_PS_SYNC, CH_PS_ASYNC } ch_ps_mode;

/* "sync" (or NULL) and "async". */
bool ch_ps_mode_parse(const char *s, ch_ps_mode *out);
const char *ch_ps_mode_name(ch_ps_mode m);

enum { CH_PS_MAX_SERVERS = 64 };   /* --ps-servers at most */

typedef struct ch_ps_config {
    int servers;        /* S >= 1: ranks P - S .. P - 1 */
    ch_ps_mode mode;
    int staleness;      /* async: steps a worker may run ahead of the slowest; < 0: no bound */
    double timeout_s;   /* how long a wait may take before the job ends */
} ch_ps_config;

typedef struct ch_ps ch_ps;

/* Collective over every rank of MPI_COMM_WORLD. *job: a new group over this rank's side (the
 * workers' group is what their trainer's communicators are made from; the caller frees it). */
ch_status ch_ps_create(const ch_ps_config *c, ch_ps **out, ch_mpi_group **job, ch_err *err);
void ch_ps_free(ch_ps *ps);
bool ch_ps_is_server(const ch_ps *ps);
int ch_ps_workers(const ch_ps *ps);
int ch_ps_servers(const ch_ps *ps);
ch_ps_mode ch_ps_mode_of(const ch_ps *ps);
/* The shard of server s (0-based) of nparams parameters: [*lo, *hi). */
void ch_ps_shard(const ch_ps *ps, size_t nparams, int s, size_t *lo, size_t *hi);

/* ---- worker side (only one thread per process talks to the servers: local member 0's) ---- */

/* Size the pushes: nparams parameters, at most max_pushes bucket pushes in flight. */
ch_status ch_ps_attach(ch_ps *ps, size_t nparams, int max_pushes, ch_err *err);
/* The push communicator (ps is borrowed): its iallreduce_sum sends [c->at, c->at + n) of the
 * gradients to the servers owning them and completes when they have it (the buffer is not
 * summed: the servers keep the sum); rank and size are the worker's and W. */
void ch_ps_comm_init(ch_comm *c, ch_ps *ps);
/* The step and learning rate the next pushes carry. */
void ch_ps_set_step(ch_ps *ps, uint64_t step, double lr);
/* params (nparams, host memory) <- every server's shard after this worker's last push. */
ch_status ch_ps_pull(ch_ps *ps, ch_real *params, ch_err *err);
/* async: the next unit of work of epoch (0-based) from the first server; -1 when none is left. */
ch_status ch_ps_claim(ch_ps *ps, int epoch, int64_t *unit, ch_err *err);
/* async, at an epoch's end: wait until every worker is done, then params <- the servers' shards. */
ch_status ch_ps_flush(ch_ps *ps, ch_real *params, ch_err *err);
/* Rank 0 (a no-op elsewhere): the workers end the job on an error every one of them holds, of
 * status why; each server stops waiting for them and fails with the same status, saying nothing. */
ch_status ch_ps_abandon(ch_ps *ps, ch_status why, ch_err *err);
/* Rank 0: each server's shard of params and, with nstate > 0, of the optimizer state (host
 * memory, nparams each), and the optimizer's step count. */
ch_status ch_ps_put_state(ch_ps *ps, const ch_real *params, ch_real *const *state, int nstate, long steps,
                          ch_err *err);
/* Rank 0: every server's optimizer state into state[b] (host, nparams each) and its step count. */
ch_status ch_ps_get_state(ch_ps *ps, ch_real *const *state, int nstate, long *steps, ch_err *err);
/* This worker is done: the servers stop once every worker has said so. */
ch_status ch_ps_stop(ch_ps *ps, ch_err *err);

/* ---- server side ---- */

/* Serve until every worker has stopped: the optimizer oc over this server's shard, and (async)
 * units_per_epoch units of work to hand out per epoch (the first server). Logs a line per epoch
 * of what it did (ch_world_log). */
ch_status ch_ps_serve(ch_ps *ps, const ch_optim_config *oc, int64_t units_per_epoch, ch_err *err);

#endif
