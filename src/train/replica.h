/* One replica: a copy of the model on one device, with its optimizer state, batch buffers and
 * communicator handles. Everything here runs on the replica's own (crew) thread. */
#ifndef CH_TRAIN_REPLICA_H
#define CH_TRAIN_REPLICA_H

#include "cohort.h"
#include "comm/comm.h"
#include "data/dataset.h"
#include "nn/model.h"
#include "optim/optim.h"
#include "core/trace.h"
#include "data/augment.h"
#include "train/gradsync.h"

/* A fault to inject for the failure tests (COHORT_INJECT_FAULT=KIND:REPLICA[:STEP]). REPLICA is
 * the global replica index (process x devices per process + device), so with one device per
 * process it is the rank. kill sends the process SIGKILL; hang stops the replica for good (a stuck
 * rank, for the --timeout test). */
typedef enum ch_fault_kind {
    CH_FAULT_NONE, CH_FAULT_ALLOC, CH_FAULT_ERROR, CH_FAULT_NAN, CH_FAULT_KILL, CH_FAULT_HANG,
    CH_FAULT_SLOW,      /* a slower machine: `step` is microseconds of sleep per sample, every step */
} ch_fault_kind;

typedef struct ch_fault {
    ch_fault_kind kind;
    int replica;
    uint64_t step;      /* 1-based step for error, nan, kill and hang */
} ch_fault;

/* What every replica is built from (shared, read-only). */
typedef struct ch_replica_spec {
    const char *init;
    const ch_graph *graph;  /* the model's (borrowed): the user's, or the trainer's of a zoo name */
    uint64_t seed;
    ch_shape3 input;
    int classes;
    int max_slice;          /* most samples one replica gets in a step */
    int accum;              /* micro-batches per step (>= 1) */
    int max_micro;          /* most samples of one micro-batch: what the model is planned for */
    bool accum_buffer;      /* keep a gradient sum across micro-batches (accum > 1, or --shares auto,
                             * where a slice may outgrow max_micro) */
    ch_optim_config optim;
    ch_augment augment;
    bool nan_check, sync_bn;
    bool bf16;              /* --precision bf16: the models' convolutions may multiply in bf16 */
    size_t bucket_elems;
    const char *backend;    /* every replica's backend: "cpu", or "scramble" for the tests */
    ch_fault fault;
    int nglobal;            /* replicas in the whole job (processes x devices) */
    bool zero;              /* --zero 1: optimizer state sharded over the nglobal replicas */
    struct ch_ps *ps;       /* --ps-servers (a worker's; borrowed): the servers hold the optimizer
                             * and answer each step's pushes with new parameters; NULL: none */
    bool ps_async;          /* --ps-mode async: no per-step exchange between the workers */
    /* benchmark and test hooks */
    bool skip_sync;         /* bench only: no gradient sync (the cost of sync, by difference) */
    /* GPU replicas exchange over NCCL (ch_trainer_nccl_setup): two communicators' ids, the same
     * for every member of the job (the gradients'; the other device collectives'), and the limit
     * on their set-up and calls. */
    bool nccl;
    unsigned char nccl_id[128], nccl_ctl_id[128];
    double timeout_s;
    uint32_t *sample_counts; /* tests only: count every training sample a replica gathers */
    int trace_capacity;     /* spans per track when tracing (0: no trace tracks) */
} ch_replica_spec;

typedef struct ch_replica {
    int index;              /* within this process */
    int global_index;       /* within the job: process x devices per process + index */
    ch_device device;
    int nthreads;
    ch_backend *be;         /* owned: the replica's kernels and memory */
    ch_model *model;
    ch_optim opt;           /* over [shard_lo, shard_lo + shard_n) of the parameters */
    bool sharded;           /* --zero 1 with more than one replica in the job */
    bool nccl;              /* grads_comm and dev_ctl are NCCL members (the CUDA plugin's) */
    bool state_on_servers;  /* --ps-servers: the optimizer state is the servers' (global replica 0
                             * keeps room for all of it, for checkpoints) */
    size_t shard_lo, shard_n; /* the whole buffer unless sharded */
    ch_real *x;             /* the current batch slot: (max_slice, c, h, w), replica memory */
    int32_t *labels;        /* the current slot's labels, replica memory */
    /* Two batch slots used in turn (slot: the current one), each with its staging buffers: the
     * next batch is uploaded into one, on the transfer stream, while a step may still read the
     * other. A backend without streams has one ([1] names [0]). x, labels, x_host and labels_host
     * point into the current slot. */
    ch_real *x_slot[2];
    int32_t *labels_slot[2];
    ch_real *x_host_slot[2];
    int32_t *labels_host_slot[2];
    int slot;
    ch_real *dlogits;       /* replica memory */
    /* Host copies, only where the backend's memory is not host memory: the batch as gathered,
     * the logits for per-class tallies, and one buffer of max(parameters, buffers) values for
     * what crosses the communicators. */
    ch_real *x_host, *logits_host, *stage;
    int32_t *labels_host;
    ch_comm grads_comm;     /* member of the gradient group (used by the sync thread) */
    ch_comm ctl_comm;       /* member of the control group (parameters, sync-BN, buffers) */
    /* With nccl: the control group's device collectives (sync-BN statistics, BatchNorm buffers,
     * the start's and a loaded checkpoint's broadcasts) over a second NCCL communicator. Its own
     * stream and call order keep them apart from the sync thread's buckets on grads_comm, whose
     * order against the compute thread's calls differs from member to member. */
    ch_comm dev_ctl;
    ch_hier grads_hier, ctl_hier; /* the state behind the two handles */
    ch_trace_track trace_compute, trace_sync; /* --trace: this replica's two timelines */
    bool tracing;           /* record the next steps (set by the trainer) */
    ch_gradsync *sync;      /* NULL with a single replica */
    ch_real *accum;         /* with accum_buffer: the earlier micro-batches' gradient sum (replica memory) */
    int micro;              /* the micro-batch being run (0-based) */
    bool micro_sync;        /* the last micro-batch hands each finished tensor to the sync */
    size_t accum_reported;  /* elements added back from accum in the last micro-batch */
    /* results of the last job */
    ch_status status;
    ch_err err;
    bool root_cause;        /* the failure started here (not a collective aborted by another) */
    double loss_sum;
    int64_t correct;
    /* The loss kernel's results for one batch: host memory it writes when it runs (one block
     * from the backend's host_alloc, which a GPU's kernels can write), read by the host after
     * loss_done (recorded after it on the compute stream; NULL without streams), while
     * loss_pending. */
    double *batch_loss;
    int64_t *batch_correct;
    ch_event *loss_done;
    /* Per slot: uploaded, recorded on the transfer stream after the slot's uploads (the compute
     * stream waits for it before the batch's kernels; the host, before it gathers into the slot's
     * staging buffers again), and consumed, recorded on the compute stream after the last kernel
     * that reads the slot (the next upload into it waits for that). */
    ch_event *uploaded[2], *consumed[2];
    bool loss_pending;
    double busy_s;          /* the last step's time up to its wait for the gradient sync */
    uint64_t steps_run;     /* steps this replica has run in this process */
    int64_t *class_hits, *class_counts; /* evaluation, per class (classes each) */
} ch_replica;

/* One slice of a global batch. */
typedef struct ch_slice {
    const uint32_t *idx;    /* this replica's sample indices */
    int n;                  /* this replica's samples (may be 0) */
    uint64_t offset;        /* index of idx[0] within the global batch */
    int global_n;           /* samples in the global batch */
    uint64_t step;          /* 0-based global step */
    double lr;              /* the schedule's learning rate for this step */
    int epoch;              /* 0-based, for the augmentation's random choices */
    const ch_real *x;       /* the slice already gathered by the loader (-j), or NULL: gather here */
    const int32_t *labels;
    int micro;              /* micro-batches to cut the slice into (>= 1) */
    const int *counts;      /* every replica's slice of this batch (nglobal; sync-BN's counts) */
} ch_slice;

/* Build the replica's model, optimizer and buffers on the calling thread, then take replica 0's
 * parameters and buffers. */
ch_status ch_replica_setup(ch_replica *rp, const ch_replica_spec *s);
/* Forward, loss, backward, gradient sync, update. Sets loss_sum and correct. */
ch_status ch_replica_step(ch_replica *rp, const ch_replica_spec *s, const ch_dataset *d,
                          const ch_slice *sl);
/* Forward only over chunks g, g + R, ... (chunks of max_micro) of d, where g is the replica's global
 * index and R = s->nglobal: every sample of d is seen by exactly one replica of the job. */
ch_status ch_replica_evaluate(ch_replica *rp, const ch_replica_spec *s, const ch_dataset *d);
/* Global replica 0's parameters, buffers, counters and optimizer state to this replica (all replicas of
 * all ranks call it: a checkpoint was just loaded into global replica 0). */
ch_status ch_replica_share_state(ch_replica *rp);
/* --zero 1, every replica of every rank: each optimizer state buffer's shards from their owners into
 * full[b] (nparams each, global replica 0's memory; NULL on every other replica). */
ch_status ch_replica_gather_state(ch_replica *rp, ch_real *const *full);
/* --zero 1: this replica's shard of full optimizer state (host memory, nparams each) into its own. */
void ch_replica_take_state(ch_replica *rp, ch_real *const *full);
/* --ps-mode async, at an epoch's end: every worker's last pushes applied, every replica takes the
 * servers' parameters, and the BatchNorm running statistics become the replicas' plain average. */
ch_status ch_replica_ps_flush(ch_replica *rp, const ch_replica_spec *s);
void ch_replica_free(ch_replica *rp);

#endif
