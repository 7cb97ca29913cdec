/* A replica's jobs: set up, train one slice of a global batch, evaluate its share of a data set.
 * The gradient of a slice of n samples is scaled by 1/global_n (not 1/n), so the sum over replicas
 * is exactly the gradient of the mean loss over the global batch. */
#include "train/replica.h"

#include "core/clock.h"
#include "graph/graph.h"
#include "kernels/cuda/plugin.h"
#include "train/ps.h"

#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* This replica failed on its own: say so, and release every member waiting in a collective. */
static ch_status fail_here(ch_replica *rp, ch_status st, const ch_err *why)
{
    rp->status = st;
    rp->err = *why;
    rp->root_cause = true;
    ch_comm_abort(&rp->ctl_comm, why->msg);
    ch_comm_abort(&rp->grads_comm, why->msg);
    if (rp->nccl) ch_comm_abort(&rp->dev_ctl, why->msg);
    return st;
}

static ch_status fail_collective(ch_replica *rp, ch_status st, const ch_err *why)
{
    rp->status = st;
    rp->err = *why;
    return st;
}

static ch_status alloc_buffers(ch_replica *rp, const ch_replica_spec *s, ch_err *err)
{
    const size_t per = ch_shape3_size(s->input), b = (size_t)s->max_slice;
    size_t x_bytes = sizeof(ch_real) * per * b;
    /* The injected fault is a request no machine can satisfy: the real failure path. */
    if (s->fault.kind == CH_FAULT_ALLOC && s->fault.replica == rp->global_index) x_bytes = SIZE_MAX / 2;
    const ch_backend *be = rp->be;
    /* Two slots where uploads can run beside the compute (a backend with streams), else one. */
    const int slots = ch_backend_async(be) ? 2 : 1;
    for (int k = 0; k < slots; k++) {
        rp->x_slot[k] = ch_backend_alloc(be, x_bytes);
        rp->labels_slot[k] = ch_backend_alloc(be, sizeof(int32_t) * b);
        if (!rp->x_slot[k] || !rp->labels_slot[k]) return CH_SYS_FAIL(err, "allocation of replica batch buffers");
    }
    rp->x_slot[1] = rp->x_slot[slots - 1];
    rp->labels_slot[1] = rp->labels_slot[slots - 1];
    rp->slot = 1;   /* the first batch takes slot 0 (next_slot) */
    rp->x = rp->x_slot[1];
    rp->labels = rp->labels_slot[1];
    rp->dlogits = ch_backend_alloc(be, sizeof(ch_real) * (size_t)s->classes * (size_t)s->max_micro);
    rp->class_hits = calloc((size_t)s->classes, sizeof(int64_t));
    rp->class_counts = calloc((size_t)s->classes, sizeof(int64_t));
    rp->batch_loss = ch_backend_host_alloc(be, sizeof(double) + sizeof(int64_t));
    if (!rp->dlogits || !rp->class_hits || !rp->class_counts || !rp->batch_loss)
        return CH_SYS_FAIL(err, "allocation of replica batch buffers");
    rp->batch_correct = (int64_t *)(rp->batch_loss + 1);
    if (s->accum_buffer) {
        rp->accum = ch_backend_alloc(be, sizeof(ch_real) * rp->model->nparams);
        CH_CHECK_ALLOC(err, rp->accum);
    }
    if (be->ops->host_visible) return CH_STATUS_OK;
    const ch_model *m = rp->model;
    for (int k = 0; k < slots; k++) {
        rp->x_host_slot[k] = ch_backend_host_alloc(be, x_bytes);
        rp->labels_host_slot[k] = ch_backend_host_alloc(be, sizeof(int32_t) * b);
        if (!rp->x_host_slot[k] || !rp->labels_host_slot[k]) return CH_SYS_FAIL(err, "allocation of replica staging buffers");
    }
    rp->x_host_slot[1] = rp->x_host_slot[slots - 1];
    rp->labels_host_slot[1] = rp->labels_host_slot[slots - 1];
    rp->x_host = rp->x_host_slot[1];
    rp->labels_host = rp->labels_host_slot[1];
    rp->logits_host = ch_backend_host_alloc(be, sizeof(ch_real) * (size_t)s->classes * b);
    rp->stage = ch_backend_host_alloc(be, sizeof(ch_real) * ((m->nparams > m->nbuffers ? m->nparams : m->nbuffers) + 1));
    if (!rp->logits_host || !rp->stage)
        return CH_SYS_FAIL(err, "allocation of replica staging buffers");
    return CH_STATUS_OK;
}

/* The next batch takes the other slot. */
static void next_slot(ch_replica *rp)
{
    rp->slot ^= 1;
    rp->x = rp->x_slot[rp->slot];
    rp->labels = rp->labels_slot[rp->slot];
    rp->x_host = rp->x_host_slot[rp->slot];
    rp->labels_host = rp->labels_host_slot[rp->slot];
}

/* The last kernel that reads the current slot has been queued. */
static void slot_consumed(ch_replica *rp)
{
    ch_backend_record(rp->be, rp->consumed[rp->slot], CH_STREAM_COMPUTE);
}

/* Where the host gathers a batch: the replica's own buffers when they are host memory, else the
 * slot's staging buffers, once the last upload from them has run (the steps that read it may still
 * be computing: the host does not wait for them). */
static ch_real *x_gather(ch_replica *rp)
{
    if (!rp->x_host) return rp->x;
    ch_backend_event_sync(rp->be, rp->uploaded[rp->slot]);
    return rp->x_host;
}
static int32_t *labels_gather(ch_replica *rp) { return rp->labels_host ? rp->labels_host : rp->labels; }

/* The gathered n samples at `at` to the slot's replica memory (nothing to do when gathered in
 * place): on the transfer stream, once the last step that read the slot is done with it; the
 * compute stream's next kernels wait for the copy, so it overlaps the kernels queued before. */
static void upload_batch(ch_replica *rp, const ch_replica_spec *s, int n, size_t at)
{
    if (!rp->x_host) return;
    const ch_backend *be = rp->be;
    const size_t per = ch_shape3_size(s->input);
    ch_backend_wait(be, CH_STREAM_TRANSFER, rp->consumed[rp->slot]);
    ch_backend_upload_async(be, CH_STREAM_TRANSFER, rp->x + per * at, rp->x_host + per * at, sizeof(ch_real) * per * (size_t)n);
    ch_backend_upload_async(be, CH_STREAM_TRANSFER, rp->labels + at, rp->labels_host + at, sizeof(int32_t) * (size_t)n);
    ch_backend_record(be, rp->uploaded[rp->slot], CH_STREAM_TRANSFER);
    ch_backend_wait(be, CH_STREAM_COMPUTE, rp->uploaded[rp->slot]);
}

/* The control group's communicator for replica memory: NCCL's second one in an NCCL job (the
 * ctl_comm's message about what is exchanged goes with it), else ctl_comm. */
static ch_comm *ctl_for_device(ch_replica *rp)
{
    if (!rp->nccl) return &rp->ctl_comm;
    snprintf(rp->dev_ctl.what, sizeof rp->dev_ctl.what, "%s", rp->ctl_comm.what);
    return &rp->dev_ctl;
}

/* A collective over n values of replica memory: in place where the communicator can
 * (ch_comm_stages: NCCL on GPU memory, the host's groups on host memory), else through rp->stage
 * (down, the collective, up). */
typedef ch_status (*vec_op)(ch_comm *c, ch_real *v, size_t n, void *arg, ch_err *err);

static ch_status ctl_collective(ch_replica *rp, ch_real *dev, size_t n, vec_op op, void *arg, ch_err *err)
{
    ch_comm *c = ctl_for_device(rp);
    if (!ch_comm_stages(c, rp->be)) {
        ch_backend_sync(rp->be, CH_STREAM_COMPUTE);   /* the collective reads what was queued */
        return op(c, dev, n, arg, err);
    }
    ch_backend_download(rp->be, rp->stage, dev, sizeof(ch_real) * n);
    CH_TRY(op(c, rp->stage, n, arg, err));
    ch_backend_upload(rp->be, dev, rp->stage, sizeof(ch_real) * n);
    return CH_STATUS_OK;
}

static ch_status bcast_op(ch_comm *c, ch_real *v, size_t n, void *arg, ch_err *err)
{
    (void)arg;
    return ch_comm_broadcast(c, v, n, 0, err);
}

static ch_status sum_op(ch_comm *c, ch_real *v, size_t n, void *arg, ch_err *err)
{
    (void)arg;
    return ch_comm_allreduce_sum(c, v, n, err);
}

/* The BatchNorm buffers scaled by w on the device (a kernel: x * w, the bits of a float product),
 * then summed over the group. */
static ch_status weighted_buffer_sum(ch_replica *rp, ch_real w, ch_err *err)
{
    ch_model *m = rp->model;
    const ch_kctx kc = ch_backend_kctx(rp->be);
    const ch_act scale = { .kind = CH_ACT_AFFINE, .alpha = (float)w, .beta = 0 };
    rp->be->k->act_forward(&kc, &scale, m->nbuffers, m->buffers, m->buffers);
    return ctl_collective(rp, m->buffers, m->nbuffers, sum_op, NULL, err);
}

static ch_status broadcast_dev(ch_replica *rp, ch_real *dev, size_t n, ch_err *err)
{
    return ctl_collective(rp, dev, n, bcast_op, NULL, err);
}

static ch_status allgather_op(ch_comm *c, ch_real *v, size_t n, void *arg, ch_err *err)
{
    (void)arg;
    return ch_comm_allgather_shards(c, v, n, err);
}

/* grads_comm and dev_ctl become this replica's members of the job's two NCCL communicators, on
 * its GPU. First thing after the backend: every member waits in each set-up for all the others. */
static ch_status join_nccl(ch_replica *rp, const ch_replica_spec *s, ch_err *err)
{
    const ch_cuda_plugin *p = ch_cuda_plugin_load(err);
    if (!p) return CH_STATUS_BAD_INPUT;
    /* Made aside: until both are made, grads_comm stays the host group's handle, which a failure
     * aborts. */
    ch_comm grads, ctl;
    CH_TRY(p->nccl_init(&grads, rp->be->device, s->nglobal, rp->global_index, s->nccl_id, s->timeout_s, err));
    const ch_status st = p->nccl_init(&ctl, rp->be->device, s->nglobal, rp->global_index, s->nccl_ctl_id, s->timeout_s, err);
    if (st != CH_STATUS_OK) {
        p->nccl_free(&grads);
        return st;
    }
    rp->grads_comm = grads;
    rp->dev_ctl = ctl;
    rp->nccl = true;
    return CH_STATUS_OK;
}

static ch_status build(ch_replica *rp, const ch_replica_spec *s, ch_err *err)
{
    /* oneDNN's GEMM threads by the calling thread's OpenMP setting: this thread's share. */
    omp_set_num_threads(rp->nthreads);
    CH_TRY(ch_backend_create(s->backend, rp->device.index, rp->nthreads, &rp->be, err));
    if (ch_backend_async(rp->be)) {
        rp->loss_done = ch_backend_event(rp->be);
        bool made = rp->loss_done;
        for (int k = 0; k < 2; k++) {
            rp->uploaded[k] = ch_backend_event(rp->be);
            rp->consumed[k] = ch_backend_event(rp->be);
            made = made && rp->uploaded[k] && rp->consumed[k];
        }
        if (!made) return CH_SYS_FAIL(err, "creation of the replica's events");
    }
    if (s->nccl) CH_TRY(join_nccl(rp, s, err));
    CH_TRY(ch_model_create_graph(s->graph, s->input, s->classes, rp->be, &rp->model, err));
    CH_TRY(ch_model_init_params(rp->model, s->init, s->seed, err));
    if (strcmp(s->init, "file") == 0) CH_TRY(ch_model_load_initial(rp->model, s->graph, err));
    rp->model->bf16 = s->bf16;
    CH_TRY(ch_model_plan(rp->model, s->max_micro, rp->nthreads, err));
    /* --zero 1: this replica keeps the optimizer state of its shard of the parameters only. */
    const size_t P = rp->model->nparams;
    rp->sharded = s->zero && s->nglobal > 1;
    rp->shard_lo = rp->sharded ? ch_shard_lo(P, s->nglobal, rp->global_index) : 0;
    rp->shard_n = rp->sharded ? ch_shard_lo(P, s->nglobal, rp->global_index + 1) - rp->shard_lo : P;
    /* With parameter servers the state lives on the servers; global replica 0 keeps room for the
     * whole of it, where checkpoints gather and load it. */
    rp->state_on_servers = s->ps != NULL;
    if (s->ps && rp->global_index != 0) rp->shard_n = 0;
    CH_TRY(ch_optim_init(&rp->opt, rp->shard_n, &s->optim, rp->be, err));
    CH_TRY(alloc_buffers(rp, s, err));
    if (s->trace_capacity > 0) {
        char dev[32], name[48];
        ch_device_name(&rp->device, dev, sizeof dev);
        snprintf(name, sizeof name, "%s compute", dev);
        CH_TRY(ch_trace_track_init(&rp->trace_compute, name, 2 * rp->index, s->trace_capacity, err));
        snprintf(name, sizeof name, "%s sync", dev);
        CH_TRY(ch_trace_track_init(&rp->trace_sync, name, 2 * rp->index + 1, s->trace_capacity, err));
    }
    if (rp->grads_comm.size > 1 || s->ps || s->nccl)
        CH_TRY(ch_gradsync_create(&rp->grads_comm, rp->model, s->bucket_elems, &rp->sync, err));
    return CH_STATUS_OK;
}

ch_status ch_replica_setup(ch_replica *rp, const ch_replica_spec *s)
{
    ch_err err;
    rp->status = CH_STATUS_OK;
    ch_status st = build(rp, s, &err);
    if (st != CH_STATUS_OK) {
        ch_err why;
        char dev[32];
        ch_device_name(&rp->device, dev, sizeof dev);
        ch_fail(&why, st, "%s: %.490s", dev, err.msg);
        return fail_here(rp, st, &why);
    }
    /* Every replica of every process starts from rank 0's replica 0, whatever the seeds did. */
    ch_model *m = rp->model;
    snprintf(rp->ctl_comm.what, sizeof rp->ctl_comm.what, "set-up, initial parameters");
    st = broadcast_dev(rp, m->params, m->nparams, &err);
    if (st == CH_STATUS_OK && m->nbuffers) st = broadcast_dev(rp, m->buffers, m->nbuffers, &err);
    return st == CH_STATUS_OK ? CH_STATUS_OK : fail_collective(rp, st, &err);
}

/* --ps-servers: this process's member 0 takes every server's new shard (flush: after every
 * worker's last push of the epoch), and hands the parameters to the process's other replicas. */
static ch_status take_from_servers(ch_replica *rp, const ch_replica_spec *s, bool flush, ch_err *err)
{
    ch_model *m = rp->model;
    ch_comm *local = &rp->ctl_hier.local;
    if (local->rank == 0) {
        ch_real *host = rp->stage ? rp->stage : m->params;
        CH_TRY(flush ? ch_ps_flush(s->ps, host, err) : ch_ps_pull(s->ps, host, err));
        if (rp->stage) ch_backend_upload(rp->be, m->params, rp->stage, sizeof(ch_real) * m->nparams);
    }
    if (local->size == 1) return CH_STATUS_OK;
    snprintf(local->what, sizeof local->what, "the parameter servers' parameters");
    if (!rp->stage) return ch_comm_broadcast(local, m->params, m->nparams, 0, err);
    ch_backend_download(rp->be, rp->stage, m->params, sizeof(ch_real) * m->nparams);
    CH_TRY(ch_comm_broadcast(local, rp->stage, m->nparams, 0, err));
    ch_backend_upload(rp->be, m->params, rp->stage, sizeof(ch_real) * m->nparams);
    return CH_STATUS_OK;
}

static ch_status pull_params(ch_replica *rp, const ch_replica_spec *s, ch_err *err)
{
    return take_from_servers(rp, s, false, err);
}

/* Per-replica BatchNorm: running statistics become the slices' average weighted by slice size,
 * so every replica keeps the same values (a slice of 0 samples counts for nothing). */
static ch_status average_buffers(ch_replica *rp, const ch_slice *sl, ch_err *err)
{
    ch_model *m = rp->model;
    if (m->nbuffers == 0) return CH_STATUS_OK;
    ch_real w = (ch_real)((double)sl->n / sl->global_n);
    snprintf(rp->ctl_comm.what, sizeof rp->ctl_comm.what, "step %llu, BatchNorm running statistics",
             (unsigned long long)sl->step + 1);
    return weighted_buffer_sum(rp, w, err);
}

static bool injected(const ch_replica *rp, const ch_replica_spec *s, ch_fault_kind kind,
                     uint64_t step)
{
    /* Async workers train the batches they claim: there STEP counts the replica's own steps. */
    const uint64_t at = s->ps_async ? rp->steps_run : step;
    return s->fault.kind == kind && s->fault.replica == rp->global_index && s->fault.step == at + 1;
}

/* The faults that take the whole process down, or freeze it, at the start of a step. */
static void inject_process_faults(const ch_replica *rp, const ch_replica_spec *s, uint64_t step)
{
    if (injected(rp, s, CH_FAULT_KILL, step)) raise(SIGKILL);
    if (injected(rp, s, CH_FAULT_HANG, step))
        for (;;) pause();
}

static void count_samples(const ch_replica_spec *s, const ch_slice *sl)
{
    if (!s->sample_counts) return;
    for (int i = 0; i < sl->n; i++) __atomic_fetch_add(&s->sample_counts[sl->idx[i]], 1, __ATOMIC_RELAXED);
}

/* With micro-batches, the samples of micro-batch j over the whole job: every replica's slice cut
 * into K parts the same way (sync-BN's count; with sync-BN every replica runs K). */
static int micro_part(int c, int K, int j) { return (int)((int64_t)c * (j + 1) / K - (int64_t)c * j / K); }

static int micro_global(const int *counts, int R, int K, int j)
{
    int n = 0;
    for (int g = 0; g < R; g++) n += micro_part(counts[g], K, j);
    return n;
}

/* The loss kernel was just queued: what the host reads once it has run (loss_done). */
static void loss_queued(ch_replica *rp)
{
    ch_backend_record(rp->be, rp->loss_done, CH_STREAM_COMPUTE);
    rp->loss_pending = true;
}

/* The last queued loss kernel's sums into the replica's totals, once it has run. Called before
 * the next loss kernel is queued (it writes the same two values), at the end of a step, or at
 * once where the NaN check needs the value: one wait per step without micro-batches, and none
 * between a micro-batch's forward and its backward. */
static void take_loss(ch_replica *rp)
{
    if (!rp->loss_pending) return;
    ch_backend_event_sync(rp->be, rp->loss_done);
    rp->loss_pending = false;
    rp->loss_sum += *rp->batch_loss;
    rp->correct += *rp->batch_correct;
}

/* grads_ready hooks with accumulation. Before the last micro-batch each finished tensor's gradient
 * is added into rp->accum (copied, on the first); in the last one the sum so far is added into the
 * gradient, which then goes to the sync like any other. */
static void accum_hook(void *user, size_t offset, size_t count)
{
    ch_replica *rp = user;
    const ch_kctx kc = ch_backend_kctx(rp->be);
    ch_real *acc = rp->accum + offset, *g = rp->model->grads + offset;
    if (rp->micro == 0) ch_backend_copy(rp->be, acc, g, sizeof(ch_real) * count);
    else rp->be->k->add(&kc, count, acc, g, acc);
}

static void accum_last_hook(void *user, size_t offset, size_t count)
{
    ch_replica *rp = user;
    const ch_kctx kc = ch_backend_kctx(rp->be);
    ch_real *g = rp->model->grads + offset;
    rp->be->k->add(&kc, count, g, rp->accum + offset, g);
    rp->accum_reported += count;
    if (rp->micro_sync) ch_gradsync_ready(rp->sync, offset, count);
}

/* Forward, loss and backward of the n samples from lo of the slice (one micro-batch); the last one
 * starts the gradient sync, overlapped with its backward. */
static ch_status micro_step(ch_replica *rp, const ch_replica_spec *s, const ch_slice *sl, ch_run *r, int lo,
                            int n, ch_trace_track *tr, const ch_status *comm_st, ch_err *err)
{
    ch_model *m = rp->model;
    const bool last = rp->micro == sl->micro - 1;
    const ch_real *x = rp->x + ch_shape3_size(s->input) * (size_t)lo;
    int64_t t0 = tr ? ch_trace_now() : 0;
    const ch_real *logits = ch_model_forward(m, r, n, x);
    if (*comm_st != CH_STATUS_OK) return fail_collective(rp, *comm_st, err);
    take_loss(rp);   /* the previous micro-batch's */
    r->k->softmax_xent(&r->kc, n, m->classes, logits, rp->labels + lo, 1.0 / sl->global_n, rp->dlogits,
                       rp->batch_loss, rp->batch_correct);
    loss_queued(rp);
    if (s->nan_check) take_loss(rp);
    if (tr) ch_trace_span(tr, "forward", "forward + loss", t0, -1);
    if (s->nan_check && !isfinite(rp->loss_sum)) {
        char dev[32];
        ch_device_name(&rp->device, dev, sizeof dev);
        ch_fail(err, CH_STATUS_NUMERIC, "step %llu: the loss is %g on %s", (unsigned long long)sl->step + 1,
                rp->loss_sum, dev);
        return fail_here(rp, CH_STATUS_NUMERIC, err);
    }
    if (last && injected(rp, s, CH_FAULT_ERROR, sl->step)) {
        char dev[32];
        ch_device_name(&rp->device, dev, sizeof dev);
        ch_fail(err, CH_STATUS_SYSTEM, "step %llu: injected fault on %s", (unsigned long long)sl->step + 1, dev);
        return fail_here(rp, CH_STATUS_SYSTEM, err);
    }
    r->grads_ready = NULL;
    r->grads_user = NULL;
    if (last && rp->micro_sync) {
        ch_gradsync_set_trace(rp->sync, tr ? &rp->trace_sync : NULL);
        ch_gradsync_begin(rp->sync, sl->step);
        r->grads_ready = ch_gradsync_ready;
        r->grads_user = rp->sync;
    }
    if (sl->micro > 1) {
        CH_ASSERT(rp->accum);
        r->grads_ready = last ? accum_last_hook : accum_hook;
        r->grads_user = rp;
    }
    t0 = tr ? ch_trace_now() : 0;
    ch_model_backward(m, r, n, x, rp->dlogits);
    if (tr) ch_trace_span(tr, "backward", "backward", t0, -1);
    if (*comm_st != CH_STATUS_OK) return fail_collective(rp, *comm_st, err);
    return CH_STATUS_OK;
}

/* One step; with tr, each phase is a span on the replica's compute track. */
static ch_status step_traced(ch_replica *rp, const ch_replica_spec *s, const ch_dataset *d,
                             const ch_slice *sl, ch_trace_track *tr)
{
    const double start = ch_clock_s();
    int64_t t0 = tr ? ch_trace_now() : 0;
    ch_model *m = rp->model;
    ch_err err;
    ch_status comm_st = CH_STATUS_OK;
    if (s->fault.kind == CH_FAULT_SLOW && s->fault.replica == rp->global_index)
        nanosleep(&(struct timespec){ .tv_sec = (time_t)(s->fault.step * (uint64_t)sl->n / 1000000),
                                      .tv_nsec = (long)(s->fault.step * (uint64_t)sl->n % 1000000) * 1000 }, NULL);
    rp->status = CH_STATUS_OK;
    inject_process_faults(rp, s, sl->step);
    count_samples(s, sl);
    next_slot(rp);
    ch_real *xg = x_gather(rp);
    if (sl->x && rp->x_host) {
        /* gathered by the loader into its own (pageable) memory: into the staging buffers, whose
         * upload the host need not wait for */
        memcpy(xg, sl->x, (size_t)sl->n * ch_shape3_size(s->input) * sizeof *rp->x);
        memcpy(labels_gather(rp), sl->labels, (size_t)sl->n * sizeof *rp->labels);
        upload_batch(rp, s, sl->n, 0);
    } else if (sl->x) {
        /* host memory: straight in (one copy either way) */
        ch_backend_upload(rp->be, rp->x, sl->x, (size_t)sl->n * ch_shape3_size(s->input) * sizeof *rp->x);
        ch_backend_upload(rp->be, rp->labels, sl->labels, (size_t)sl->n * sizeof *rp->labels);
    } else {
        const ch_status st = ch_augment_gather(&s->augment, d, sl->idx, sl->n, true, s->seed, sl->epoch,
                                               xg, labels_gather(rp), &err);
        if (st != CH_STATUS_OK) return fail_here(rp, st, &err);
        upload_batch(rp, s, sl->n, 0);
    }
    if (injected(rp, s, CH_FAULT_NAN, sl->step) && sl->n > 0) {
        const ch_real nan = (ch_real)NAN;
        ch_backend_upload(rp->be, rp->x, &nan, sizeof nan);
    }
    if (tr) ch_trace_span(tr, "data", "data", t0, (int64_t)sl->n);

    /* An NCCL job's statistics go over NCCL, even a one-member job's (COHORT_NCCL=1). */
    const bool sync_bn = s->sync_bn && (rp->ctl_comm.size > 1 || rp->nccl), sync = rp->sync && !s->skip_sync;
    if (sync_bn)
        snprintf(rp->ctl_comm.what, sizeof rp->ctl_comm.what, "step %llu, sync-BN statistics",
                 (unsigned long long)sl->step + 1);
    ch_run r = ch_model_run(m, true);
    r.seed = s->seed;
    r.step = sl->step;
    r.sync_bn = sync_bn ? ctl_for_device(rp) : NULL;
    r.comm_status = &comm_st;
    r.comm_err = &err;
    r.trace = tr;   /* a span per graph node, in forward and backward */
    rp->loss_sum = 0;
    rp->correct = 0;
    rp->accum_reported = 0;
    rp->micro_sync = sync;
    if (s->ps && rp->index == 0) ch_ps_set_step(s->ps, sl->step, sl->lr);
    const int K = sl->micro;
    for (int j = 0; j < K; j++) {
        const int lo = (int)((int64_t)sl->n * j / K), hi = (int)((int64_t)sl->n * (j + 1) / K);
        rp->micro = j;
        r.sample_offset = sl->offset + (uint64_t)lo;
        r.global_n = K > 1 ? micro_global(sl->counts, s->nglobal, K, j) : sl->global_n;
        const ch_status st = micro_step(rp, s, sl, &r, lo, hi - lo, tr, &comm_st, &err);
        if (st != CH_STATUS_OK) return st;
    }
    slot_consumed(rp);   /* backward was the last reader of the batch */
    CH_ASSERT(K == 1 || rp->accum_reported == m->nparams);
    rp->busy_s = ch_clock_s() - start;
    if (sync) {
        t0 = tr ? ch_trace_now() : 0;
        ch_status st = ch_gradsync_finish(rp->sync, &err);
        if (tr) ch_trace_span(tr, "sync", "wait for gradient sync", t0, -1);
        if (st == CH_STATUS_OK && s->ps) {
            t0 = tr ? ch_trace_now() : 0;
            st = pull_params(rp, s, &err);
            if (tr) ch_trace_span(tr, "sync", "pull parameters", t0, -1);
        }
        if (st == CH_STATUS_OK && !s->sync_bn && !s->ps_async) st = average_buffers(rp, sl, &err);
        if (st != CH_STATUS_OK) return fail_collective(rp, st, &err);
        if (s->ps) return CH_STATUS_OK;
    }
    t0 = tr ? ch_trace_now() : 0;
    ch_optim_step(&rp->opt, sl->lr, m->params + rp->shard_lo, m->grads + rp->shard_lo, rp->nthreads);
    if (tr) ch_trace_span(tr, "optimizer", "optimizer", t0, -1);
    if (!rp->sharded) return CH_STATUS_OK;
    /* Each replica updated its own shard: every shard to every replica. */
    t0 = tr ? ch_trace_now() : 0;
    snprintf(rp->ctl_comm.what, sizeof rp->ctl_comm.what, "step %llu, updated parameter shards (--zero 1)",
             (unsigned long long)sl->step + 1);
    const ch_status st = ctl_collective(rp, m->params, m->nparams, allgather_op, NULL, &err);
    if (tr) ch_trace_span(tr, "sync", "parameter allgather", t0, -1);
    return st == CH_STATUS_OK ? CH_STATUS_OK : fail_collective(rp, st, &err);
}

ch_status ch_replica_step(ch_replica *rp, const ch_replica_spec *s, const ch_dataset *d,
                          const ch_slice *sl)
{
    ch_trace_track *tr = rp->tracing ? &rp->trace_compute : NULL;
    const int64_t t_step = tr ? ch_trace_now() : 0;
    take_loss(rp);   /* a failed step's, still queued: its kernel must not write into this step's */
    ch_status st = step_traced(rp, s, d, sl, tr);
    take_loss(rp);
    rp->steps_run++;
    if (tr) {
        char name[32];
        snprintf(name, sizeof name, "step %llu", (unsigned long long)sl->step + 1);
        ch_trace_span(tr, "step", name, t_step, (int64_t)sl->n);
    }
    return st;
}

/* Per-class tallies, with the loss kernel's rule for the predicted class (the first maximum).
 * logits and labels are replica memory: read through host copies where it is not host memory. */
static void tally_classes(ch_replica *rp, int n, int classes, const ch_real *logits)
{
    const int32_t *labels = rp->labels;
    if (rp->logits_host) {
        ch_backend_download(rp->be, rp->logits_host, logits, sizeof(ch_real) * (size_t)n * classes);
        logits = rp->logits_host;
        labels = rp->labels_host;   /* as gathered, n of them */
    }
    for (int i = 0; i < n; i++) {
        const ch_real *z = logits + (size_t)i * classes;
        int arg = 0;
        for (int j = 1; j < classes; j++)
            if (z[j] > z[arg]) arg = j;
        rp->class_counts[labels[i]]++;
        rp->class_hits[labels[i]] += arg == labels[i];
    }
}

ch_status ch_replica_evaluate(ch_replica *rp, const ch_replica_spec *s, const ch_dataset *d)
{
    rp->status = CH_STATUS_OK;
    rp->loss_sum = 0;
    rp->correct = 0;
    for (int c = 0; c < s->classes; c++) rp->class_hits[c] = rp->class_counts[c] = 0;
    ch_run r = ch_model_run(rp->model, false);
    const size_t B = (size_t)s->max_micro;   /* the model's planned batch */
    uint32_t idx[256];
    for (size_t at = (size_t)rp->global_index * B; at < d->n; at += (size_t)s->nglobal * B) {
        const int n = (int)(B < d->n - at ? B : d->n - at);
        next_slot(rp);
        /* Gather in pieces of up to 256 indices: no allocation per chunk. */
        for (int done = 0; done < n;) {
            const int piece = n - done < 256 ? n - done : 256;
            for (int i = 0; i < piece; i++) idx[i] = (uint32_t)(at + (size_t)(done + i));
            ch_err err;
            const ch_status st = ch_augment_gather(&s->augment, d, idx, piece, false, s->seed, 0,
                                                   x_gather(rp) + ch_shape3_size(s->input) * (size_t)done,
                                                   labels_gather(rp) + done, &err);
            if (st != CH_STATUS_OK) return fail_here(rp, st, &err);
            upload_batch(rp, s, piece, (size_t)done);
            done += piece;
        }
        const ch_real *logits = ch_model_forward(rp->model, &r, n, rp->x);
        r.k->softmax_xent(&r.kc, n, rp->model->classes, logits, rp->labels, 1.0, NULL, rp->batch_loss,
                          rp->batch_correct);
        loss_queued(rp);
        take_loss(rp);
        tally_classes(rp, n, rp->model->classes, logits);
        slot_consumed(rp);
    }
    return CH_STATUS_OK;
}

static ch_status share(ch_replica *rp, ch_err *err)
{
    ch_model *m = rp->model;
    ch_comm *c = &rp->ctl_comm;
    snprintf(c->what, sizeof c->what, "loading a checkpoint");
    CH_TRY(broadcast_dev(rp, m->params, m->nparams, err));
    if (m->nbuffers) CH_TRY(broadcast_dev(rp, m->buffers, m->nbuffers, err));
    /* Sharded state comes from the staged checkpoint instead (ch_replica_take_state); with
     * parameter servers it goes to the servers. */
    for (int i = 0; !rp->sharded && !rp->state_on_servers && i < rp->opt.nstate; i++)
        CH_TRY(broadcast_dev(rp, rp->opt.state[i], m->nparams, err));
    if (m->ncounters == 0) return CH_STATUS_OK;
    /* Counters are int64: exact through a double sum of replica 0's value and zeros. */
    double *v = calloc((size_t)m->ncounters, sizeof *v);
    CH_CHECK_ALLOC(err, v);
    if (rp->global_index == 0)
        for (int i = 0; i < m->ncounters; i++) v[i] = (double)m->counters[i];
    ch_status st = ch_comm_allreduce_sum_f64(c, v, (size_t)m->ncounters, err);
    for (int i = 0; st == CH_STATUS_OK && i < m->ncounters; i++) m->counters[i] = (int64_t)v[i];
    free(v);
    return st;
}

ch_status ch_replica_share_state(ch_replica *rp)
{
    ch_err err;
    rp->status = CH_STATUS_OK;
    ch_status st = share(rp, &err);
    return st == CH_STATUS_OK ? CH_STATUS_OK : fail_collective(rp, st, &err);
}

/* Each state buffer's shards, from their owners, into full (global replica 0's) through a host
 * buffer of one shard. */
static ch_status gather_state(ch_replica *rp, ch_real *const *full, ch_err *err)
{
    const size_t P = rp->model->nparams;
    const int R = rp->ctl_comm.size;
    ch_real *buf = malloc(sizeof(ch_real) * (P / (size_t)R + 2));
    CH_CHECK_ALLOC(err, buf);
    snprintf(rp->ctl_comm.what, sizeof rp->ctl_comm.what, "saving a checkpoint, optimizer shards (--zero 1)");
    ch_status st = CH_STATUS_OK;
    for (int b = 0; b < rp->opt.nstate && st == CH_STATUS_OK; b++)
        for (int i = 0; i < R && st == CH_STATUS_OK; i++) {
            const size_t lo = ch_shard_lo(P, R, i), n = ch_shard_lo(P, R, i + 1) - lo;
            if (n == 0) continue;
            if (i == rp->global_index) ch_backend_download(rp->be, buf, rp->opt.state[b], sizeof(ch_real) * n);
            st = ch_comm_broadcast(&rp->ctl_comm, buf, n, i, err);
            if (st == CH_STATUS_OK && full) ch_backend_upload(rp->be, full[b] + lo, buf, sizeof(ch_real) * n);
        }
    free(buf);
    return st;
}

ch_status ch_replica_gather_state(ch_replica *rp, ch_real *const *full)
{
    ch_err err;
    rp->status = CH_STATUS_OK;
    const ch_status st = gather_state(rp, full, &err);
    return st == CH_STATUS_OK ? CH_STATUS_OK : fail_collective(rp, st, &err);
}

void ch_replica_take_state(ch_replica *rp, ch_real *const *full)
{
    for (int b = 0; b < rp->opt.nstate; b++)
        ch_backend_upload(rp->be, rp->opt.state[b], full[b] + rp->shard_lo, sizeof(ch_real) * rp->shard_n);
}

ch_status ch_replica_ps_flush(ch_replica *rp, const ch_replica_spec *s)
{
    ch_err err;
    rp->status = CH_STATUS_OK;
    ch_status st = take_from_servers(rp, s, true, &err);
    ch_model *m = rp->model;
    if (st == CH_STATUS_OK && m->nbuffers) {
        ch_real w = (ch_real)(1.0 / rp->ctl_comm.size);
        snprintf(rp->ctl_comm.what, sizeof rp->ctl_comm.what, "the epoch's end, BatchNorm running statistics");
        st = weighted_buffer_sum(rp, w, &err);
    }
    return st == CH_STATUS_OK ? CH_STATUS_OK : fail_collective(rp, st, &err);
}

void ch_replica_free(ch_replica *rp)
{
    ch_gradsync_free(rp->sync);
    ch_trace_track_free(&rp->trace_compute);
    ch_trace_track_free(&rp->trace_sync);
    ch_optim_free(&rp->opt);
    if (rp->be) {
        for (int k = 0; k < 2 && (k == 0 || rp->x_slot[1] != rp->x_slot[0]); k++) {
            ch_backend_release(rp->be, rp->x_slot[k]);
            ch_backend_release(rp->be, rp->labels_slot[k]);
        }
        ch_backend_release(rp->be, rp->dlogits);
        ch_backend_release(rp->be, rp->accum);
    }
    ch_model_free(rp->model);
    const bool two = rp->x_host_slot[1] != rp->x_host_slot[0];   /* one slot: [1] names [0] */
    void *host[] = { rp->x_host_slot[0], two ? rp->x_host_slot[1] : NULL, rp->labels_host_slot[0],
                     two ? rp->labels_host_slot[1] : NULL, rp->logits_host, rp->stage, rp->batch_loss };
    for (size_t i = 0; i < sizeof host / sizeof *host; i++)
        if (host[i]) ch_backend_host_free(rp->be, host[i]);
    if (rp->be) {
        ch_backend_event_free(rp->be, rp->loss_done);
        for (int k = 0; k < 2; k++) {
            ch_backend_event_free(rp->be, rp->uploaded[k]);
            ch_backend_event_free(rp->be, rp->consumed[k]);
        }
    }
    ch_err e;
    const ch_cuda_plugin *p = rp->nccl ? ch_cuda_plugin_load(&e) : NULL;
    if (p) {
        p->nccl_free(&rp->grads_comm);
        p->nccl_free(&rp->dev_ctl);
    }
    ch_backend_free(rp->be);
    free(rp->class_hits);
    free(rp->class_counts);
}
