/* The trainer's internals, visible to tests (the public face is in cohort.h).
 * A trainer owns D replicas (one per device), a crew of D pinned threads that runs them, and two
 * local communicator groups: `grads` for the bucketed gradient sync (used by the replicas' sync
 * threads) and `ctl` for everything the replicas' compute threads exchange (initial parameters,
 * sync-BN statistics, BatchNorm running statistics). Two groups, because a sync thread's bucket and a
 * compute thread's sync-BN exchange are in flight at the same time. */
#ifndef CH_TRAIN_TRAINER_H
#define CH_TRAIN_TRAINER_H

#include "cohort.h"
#include "comm/comm.h"
#include "comm/mpi.h"
#include "optim/schedule.h"
#include "train/crew.h"
#include "train/position.h"
#include "train/replica.h"
#include "train/shares.h"



struct ch_trainer {
    ch_train_config cfg;
    char model_name[64], init[64];
    uint64_t graph_print;       /* cfg.graph's fingerprint (0: a zoo model) */
    char *graph_json;           /* cfg.graph as JSON, for checkpoints' graph.json (owned; NULL: zoo) */
    ch_graph *zoo_graph;        /* cfg.model's graph (owned; NULL: cfg.graph is the model) */
    char checkpoint_dir[4096];  /* cfg.checkpoint_dir points here */
    int ckpt_lock;              /* rank 0: the checkpoint folder's lock (-1: none) */
    char trace_path[4096];      /* cfg.trace points here */
    char normalize[256];        /* cfg.normalize points here ("" when none) */
    uint64_t trace_first;       /* the first traced step */
    int64_t trace_offset_ns;    /* added to this rank's times: rank 0's clock */
    bool trace_done;
    ch_device_list devices;
    char devices_text[CH_MAX_DEVICES * 8];
    const ch_dataset *train, *test;
    ch_replica_spec spec;
    int nreplicas;
    ch_replica *replicas;
    ch_local_group *grads_group, *ctl_group;
    /* Across processes (MPI ranks): procs is 1 and the groups NULL in a single process. The
     * replicas' hierarchical communicators use mpi_grads and mpi_ctl through local member 0; the
     * trainer's own sums (metrics, the data check) go through main_comm. */
    int procs, proc;
    ch_mpi_group *mpi_grads, *mpi_ctl, *mpi_main;
    ch_comm mpi_grads_comm, mpi_ctl_comm, main_comm;
    ch_grad_compress compress;  /* how mpi_grads' sums travel (--grad-compress) */
    /* --ps-servers: the parameter servers (NULL without); procs and proc count the workers only.
     * ps_job is this rank's side of the job (the workers' communicators are made from it). */
    struct ch_ps *ps;
    ch_mpi_group *ps_job;
    ch_comm ps_comm;            /* the gradient pushes: the replicas' MPI stage instead of mpi_grads */
    bool ps_server;             /* this rank served; it has no replicas */
    int ps_part;                /* async: the part of the batch this worker's step trains (else -1) */
    ch_crew *crew;
    ch_shares shares;       /* each rank's part of every batch (--shares) */
    int *counts, *offsets;  /* the step's cut: every replica's slice and where it starts (job-wide) */
    int *scratch;           /* the cut of other batch sizes (local_range: a read-only trainer's) */
    int job_micro;          /* with sync-BN: the micro-batches every replica runs this step */
    double last_busy_s;     /* the last step's busy time of this rank (its slowest replica) */
    bool probed;            /* --shares auto re-balanced after its first measured steps */
    uint32_t *perm;         /* epoch order over the training set */
    int epoch;              /* epochs completed */
    uint64_t step;          /* steps completed */
    ch_ckpt_position pos;   /* a resumed checkpoint's position, then the last epoch's metrics */
    bool mid_epoch;         /* resumed inside an epoch: the next epoch starts at pos */
    double lr;              /* the learning rate of the next step (the schedule's) */
    ch_schedule sched;
    bool broken;            /* a replica failed: the replicas may disagree, no more steps */
    bool abandoned;         /* the servers were told that the workers end the job */
    ch_err broken_err;
    ch_progress_fn progress;
    void *progress_user;
    /* the threaded loader (-j): each step's part of this process, planned per epoch */
    struct ch_loader *loader;
    struct ch_loader_batch *plan;
    bool loading;           /* ch_trainer_step takes its data from the loader */
    /* the job in flight (read by the crew threads) */
    const uint32_t *job_idx;
    int job_n;
    const ch_real *job_x;   /* the loader's batch: this process's samples from job_first on */
    const int32_t *job_labels;
    int job_first;
    const ch_dataset *job_data;
};

/* Replica r's share of a global batch of n: n / R, the first n % R replicas one more. With
 * processes, r is the global replica index (process x D + device) and R all replicas of the job. */
void ch_trainer_slice(int n, int nreplicas, int r, int *offset, int *count);

/* --ps-servers: every worker waits here until rank 0 has handed the servers what they hold (the
 * start, a loaded checkpoint, a fetched state), so that no push overtakes it. Collective over the
 * workers; what names it for the timeout. */
ch_status ch_trainer_ps_barrier(ch_trainer *t, const char *what, ch_err *err);
/* --ps-servers: rank 0 gives the servers global replica 0's parameters (and, with_state, its
 * optimizer state) with the optimizer's step count, and every worker waits until they hold them
 * (ch_trainer_ps_barrier). At the start and after a checkpoint is loaded. Collective. */
ch_status ch_trainer_ps_hand_over(ch_trainer *t, bool with_state, const char *what, ch_err *err);
/* --ps-servers: st, unchanged; when it is a failure every worker holds (err->on_every_rank),
 * rank 0 first tells the servers that no more will come, so they end too (once per run). */
ch_status ch_trainer_ps_give_up(ch_trainer *t, ch_status st, const ch_err *err);

/* trainer_config.c: the checks of a configuration that need no other rank (BAD_INPUT, one line),
 * and the optimizer, schedule and injected fault (COHORT_INJECT_FAULT) it gives. */
ch_status ch_trainer_check_config(const ch_train_config *c, ch_err *err);
/* --precision bf16 (checked: the CPU has it natively). */
bool ch_trainer_bf16(const ch_train_config *c);
/* How many of the model's layers multiply in bf16 (0 under fp32, and under --precision bf16 where
 * the device keeps fp32 products: ch_cpu_bf16_products). */
int ch_trainer_bf16_layers(const ch_trainer *t);
ch_status ch_trainer_optim_config(const ch_train_config *c, ch_optim_config *o, ch_err *err);
ch_status ch_trainer_schedule_config(const ch_train_config *c, ch_schedule *s, ch_err *err);
ch_status ch_trainer_parse_fault(ch_fault *f, ch_err *err);

/* trainer_ranks.c: t->procs and t->proc, the ranks' agreement on the job, the MPI groups (and the
 * parameter servers' roles); collective over every rank. Then the trace's common clock origin. */
ch_status ch_trainer_join_ranks(ch_trainer *t, ch_err *err);
ch_status ch_trainer_align_trace_clocks(ch_trainer *t, ch_err *err);
/* Whether the job's GPU replicas sum over NCCL, and if so its id, drawn on rank 0 and broadcast
 * (t->spec.nccl, nccl_id). Collective over every rank. */
ch_status ch_trainer_nccl_setup(ch_trainer *t, ch_err *err);

/* trainer_ps.c: a server rank's whole part in the job (serve until every worker has stopped). */
ch_status ch_trainer_serve(ch_trainer *t, ch_err *err);

/* trainer_ckpt.c: the trainer's side of checkpoints. */
/* Checkpoint DIR/name of the run at pos into cfg.checkpoint_dir (rank 0 writes; others return). */
ch_status ch_trainer_save_checkpoint(ch_trainer *t, const char *name, const ch_ckpt_position *pos,
                                     ch_err *err);
/* Collective: the checkpoint at path (a directory, or one with latest) or, with weights given,
 * only that weights file, read and checked on rank 0, then in every replica of every rank; pos
 * (may be NULL) gets where the run stood. */
ch_status ch_trainer_load_checkpoint(ch_trainer *t, const char *path, const char *weights,
                                     ch_ckpt_position *pos, ch_err *err);

#endif
