/* The trainer's side of checkpoints: what of a run checkpoint.c may see (ch_ckpt_run, filled here
 * so that checkpoint.c never reads the trainer's struct), the save on rank 0, and the collective
 * load: rank 0 reads and checks, every rank learns whether that worked and where the run stood,
 * then every replica takes global replica 0's state. */
#include "train/checkpoint.h"
#include "train/ps.h"
#include "train/trainer.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ch_ckpt_run run_of(ch_trainer *t)
{
    ch_replica *rp = &t->replicas[0];
    return (ch_ckpt_run){ .model = rp->model, .opt = &rp->opt, .model_name = t->model_name, .init = t->init,
                          .normalize = t->normalize, .graph_json = t->graph_json,
                          .graph_print = t->graph_print, .cfg = &t->cfg, .optim = &t->spec.optim,
                          .sched = &t->sched, .train_samples = t->train->n, .world_size = t->procs,
                          .devices = &t->devices,
                          .shares = t->shares.given && t->procs > 1 ? t->shares.w : NULL };
}

/* The first failure of the crew's last job. */
static ch_status crew_status(ch_trainer *t, ch_err *err)
{
    for (int r = 0; r < t->nreplicas; r++)
        if (t->replicas[r].status != CH_STATUS_OK) {
            if (err) *err = t->replicas[r].err;
            return t->replicas[r].status;
        }
    return CH_STATUS_OK;
}

typedef struct state_job {
    ch_trainer *t;
    ch_real **full;     /* CH_OPTIM_MAX_STATE buffers of every parameter's state */
} state_job;

static void job_gather(void *arg, int r)
{
    state_job *j = arg;
    ch_replica *rp = &j->t->replicas[r];
    ch_replica_gather_state(rp, rp->global_index == 0 ? j->full : NULL);
}

/* --zero 1: the whole optimizer state, gathered from its shards into global replica 0's memory
 * (full[b], released by the caller), so that the checkpoint holds it as an unsharded run's does.
 * Collective over every replica of every rank. */
static ch_status gather_full_state(ch_trainer *t, ch_real **full, ch_err *err)
{
    ch_replica *r0 = &t->replicas[0];
    for (int b = 0; t->proc == 0 && b < r0->opt.nstate; b++) {
        full[b] = ch_backend_alloc(r0->be, sizeof(ch_real) * (r0->model->nparams + 1));
        CH_CHECK_ALLOC(err, full[b]);
    }
    state_job j = { t, full };
    ch_crew_run(t->crew, job_gather, &j);
    return crew_status(t, err);
}

/* --ps-servers: the servers' optimizer state and step count into global replica 0 (rank 0), so
 * that the checkpoint holds it as an allreduce run's does. Every worker waits until rank 0 has it:
 * in async mode another worker's next push would otherwise move the state past the parameters. */
static ch_status fetch_server_state(ch_trainer *t, ch_err *err)
{
    ch_status st = CH_STATUS_OK;
    if (t->proc == 0) {
        ch_replica *r0 = &t->replicas[0];
        const size_t P = r0->model->nparams;
        ch_real *state[CH_OPTIM_MAX_STATE] = { 0 };
        for (int b = 0; b < r0->opt.nstate && st == CH_STATUS_OK; b++)
            if (!(state[b] = malloc(sizeof(ch_real) * (P + 1)))) st = CH_SYS_FAIL(err, "allocation of optimizer state");
        long steps = 0;
        if (st == CH_STATUS_OK) st = ch_ps_get_state(t->ps, state, r0->opt.nstate, &steps, err);
        for (int b = 0; b < r0->opt.nstate; b++) {
            if (st == CH_STATUS_OK) ch_backend_upload(r0->be, r0->opt.state[b], state[b], sizeof(ch_real) * P);
            free(state[b]);
        }
        if (st == CH_STATUS_OK) r0->opt.steps = steps;
    }
    if (st != CH_STATUS_OK) return st;
    return ch_trainer_ps_barrier(t, "checkpoint, the parameter servers' state", err);
}

ch_status ch_trainer_save_checkpoint(ch_trainer *t, const char *name, const ch_ckpt_position *pos,
                                     ch_err *err)
{
    const bool sharded = t->replicas[0].sharded;
    if (t->ps) CH_TRY(fetch_server_state(t, err));
    if (t->proc != 0 && !sharded) return CH_STATUS_OK;
    ch_real *full[CH_OPTIM_MAX_STATE] = { 0 };
    ch_status st = sharded ? gather_full_state(t, full, err) : CH_STATUS_OK;
    if (st == CH_STATUS_OK && t->proc == 0) {
        ch_ckpt_run run = run_of(t);
        ch_optim whole = t->replicas[0].opt;   /* the same optimizer over every parameter */
        if (sharded) {
            whole.n = t->replicas[0].model->nparams;
            for (int b = 0; b < whole.nstate; b++) whole.state[b] = full[b];
            run.opt = &whole;
        }
        st = ch_checkpoint_save(&run, t->cfg.checkpoint_dir, name, pos, err);
    }
    for (int b = 0; b < CH_OPTIM_MAX_STATE; b++) ch_backend_release(t->replicas[0].be, full[b]);
    return st;
}

/* Rank 0 stages; then every rank learns whether that worked (a failure on rank 0 is every rank's). */
static ch_status stage_on_root(ch_trainer *t, const ch_ckpt_run *run, const char *dir, const char *weights,
                               ch_ckpt_staged *s, ch_err *err)
{
    ch_status st = ch_checkpoint_stage_alloc(run, s, err);
    if (st == CH_STATUS_OK && t->proc == 0) st = ch_checkpoint_stage(run, dir, weights, s, err);
    if (t->procs == 1) return st;
    double failed[1] = { st != CH_STATUS_OK };
    snprintf(t->main_comm.what, sizeof t->main_comm.what, "loading a checkpoint");
    ch_err e2;
    CH_TRY(ch_comm_allreduce_sum_f64(&t->main_comm, failed, 1, &e2));
    if (failed[0] == 0) return st;
    /* Every rank fails alike; rank 0 alone knows why and says it, and no rank needs MPI_Abort
     * (before, another rank's "rank 0 could not load" could reach the log first and hide it). */
    if (st == CH_STATUS_OK) st = ch_fail(err, CH_STATUS_BAD_INPUT, "rank 0 could not load the checkpoint");
    err->on_every_rank = true;
    err->speaks = t->proc == 0;
    return st;
}

/* Rank 0's staged scalars to every rank (zeros elsewhere, then a sum). */
static ch_status share_scalars(ch_trainer *t, ch_ckpt_staged *s, ch_err *err)
{
    if (t->procs == 1) return CH_STATUS_OK;
    ch_ckpt_position *p = &s->pos;
    double v[12] = { p->epoch, p->step_in_epoch, (double)p->seen_in_epoch, (double)p->global_step,
                     p->loss_sum, p->hits, p->train_loss, p->train_acc, p->test_loss, p->test_acc,
                     s->opt_steps, s->has_state };
    if (t->proc != 0) memset(v, 0, sizeof v);
    CH_TRY(ch_comm_allreduce_sum_f64(&t->main_comm, v, 12, err));
    *p = (ch_ckpt_position){ (int)v[0], (int)v[1], (uint64_t)v[2], (uint64_t)v[3], v[4], v[5],
                             v[6], v[7], v[8], v[9] };
    s->opt_steps = v[10];
    s->has_state = v[11] > 0;
    return CH_STATUS_OK;
}

static void job_share(void *arg, int r)
{
    ch_trainer *t = arg;
    ch_replica_share_state(&t->replicas[r]);
}

/* Global replica 0 (rank 0's replica 0) to every replica; the first failure is returned. */
static ch_status share_with_replicas(ch_trainer *t, ch_err *err)
{
    ch_crew_run(t->crew, job_share, t);
    return crew_status(t, err);
}

static void job_take(void *arg, int r)
{
    state_job *j = arg;
    ch_replica_take_state(&j->t->replicas[r], j->full);
}

/* --zero 1: rank 0's staged optimizer state to every rank, and each replica takes its shard. */
static ch_status share_shards(ch_trainer *t, ch_ckpt_staged *s, ch_err *err)
{
    const size_t P = t->replicas[0].model->nparams;
    snprintf(t->main_comm.what, sizeof t->main_comm.what, "loading a checkpoint, optimizer state (--zero 1)");
    for (int b = 0; t->procs > 1 && b < t->replicas[0].opt.nstate; b++)
        CH_TRY(ch_comm_broadcast(&t->main_comm, s->state[b], P, 0, err));
    state_job j = { t, s->state };
    ch_crew_run(t->crew, job_take, &j);
    return CH_STATUS_OK;
}

ch_status ch_trainer_load_checkpoint(ch_trainer *t, const char *path, const char *weights,
                                     ch_ckpt_position *pos, ch_err *err)
{
    char dir[PATH_MAX];
    if (weights) CH_TRY(ch_checkpoint_check_path(weights, err));
    else CH_TRY(ch_checkpoint_resolve(path, dir, sizeof dir, err));
    const ch_ckpt_run run = run_of(t);
    ch_ckpt_staged s = { 0 };
    ch_status st = stage_on_root(t, &run, weights ? NULL : dir, weights, &s, err);
    if (st == CH_STATUS_OK) st = share_scalars(t, &s, err);
    if (st == CH_STATUS_OK) {
        const bool sharded = t->replicas[0].sharded, state = !weights && s.has_state;
        if (t->proc == 0) ch_checkpoint_apply(&s, run.model, weights || sharded ? NULL : run.opt);
        /* Without state in the file the optimizer starts afresh, as on a first step. */
        for (int r = 0; r < t->nreplicas; r++)
            t->replicas[r].opt.steps = state ? (long)s.opt_steps : 0;
        st = share_with_replicas(t, err);
        if (st == CH_STATUS_OK && sharded && state) st = share_shards(t, &s, err);
        if (st == CH_STATUS_OK && t->ps && !weights) st = ch_trainer_ps_hand_over(t, state, "loading a checkpoint", err);
    }
    if (st == CH_STATUS_OK && pos) *pos = s.pos;
    ch_checkpoint_staged_free(&s);
    return st;
}

ch_status ch_trainer_resume_auto(ch_trainer *t, const char *dir, bool *resumed, ch_err *err)
{
    *resumed = false;
    char probe[PATH_MAX];
    if (snprintf(probe, sizeof probe, "%s/latest", dir) >= (int)sizeof probe)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--checkpoint-dir: the path is too long");
    /* Rank 0 writes the checkpoints, so its folder is the one that counts. */
    double found[1] = { t->proc == 0 && ch_checkpoint_has_latest(dir) };
    if (t->procs > 1) {
        snprintf(t->main_comm.what, sizeof t->main_comm.what, "--resume auto: looking for a checkpoint");
        CH_TRY(ch_comm_allreduce_sum_f64(&t->main_comm, found, 1, err));
    }
    if (found[0] == 0) return CH_STATUS_OK;
    *resumed = true;
    return ch_trainer_resume(t, dir, err);
}

ch_status ch_trainer_start_fresh(ch_trainer *t, bool overwrite, ch_err *err)
{
    const char *dir = t->cfg.checkpoint_dir;
    if (!dir || overwrite) return CH_STATUS_OK;
    char held[256] = "";
    double found[1] = { t->proc == 0 && ch_checkpoint_find_any(dir, held, sizeof held) };
    if (t->procs > 1) {
        snprintf(t->main_comm.what, sizeof t->main_comm.what, "looking for earlier checkpoints");
        CH_TRY(ch_comm_allreduce_sum_f64(&t->main_comm, found, 1, err));
    }
    if (found[0] == 0) return CH_STATUS_OK;
    ch_status st = ch_fail(err, CH_STATUS_BAD_INPUT, "--checkpoint-dir %s already holds checkpoints (%s), which this "
                           "fresh run would replace: --resume to continue that run, --overwrite to replace them, "
                           "or another folder", dir, held);
    err->on_every_rank = true;
    err->speaks = t->proc == 0;
    return ch_trainer_ps_give_up(t, st, err);
}
