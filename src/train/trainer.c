/* The training loop over D replicas: the trainer's set-up, epoch order, the split of each global
 * batch, the crew's jobs, exact metrics and failure reporting. Its configuration checks, ranks,
 * parameter servers, trace and checkpoints have files of their own (trainer_*.c); the replicas'
 * own work is in replica.c. */
#include "train/trainer.h"

#include "train/checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <unistd.h>

#include "comm/world.h"
#include "core/clock.h"
#include "core/cpu.h"
#include "core/file.h"
#include "core/rng.h"
#include "core/status.h"
#include "data/folder.h"
#include "data/loader.h"
#include "graph/graph.h"
#include "graph/graph_json.h"
#include "kernels/cpu/cpu.h"
#include "models/zoo.h"
#include "train/ps.h"

ch_train_config ch_train_config_default(void)
{
    return (ch_train_config){ .model = "lenet", .epochs = 10,
                              .batch_size = 256, .lr = 0.1, .seed = 0, .threads = 0,
                              .devices = "cpu:0", .bucket_mb = 25,
                              .timeout_s = 300, .trace_steps = 20, .eps = -1,
                              .gamma = 0.1, .staleness = -1 };
}

void ch_trainer_slice(int n, int nreplicas, int r, int *offset, int *count)
{
    const int base = n / nreplicas, extra = n % nreplicas;
    *count = base + (r < extra);
    *offset = r * base + (r < extra ? r : extra);
}

/* The first failure that started in a replica, else the first failure: the message to show. */
static ch_status collect_failure(ch_trainer *t, ch_err *err)
{
    const ch_replica *pick = NULL;
    for (int r = 0; r < t->nreplicas; r++) {
        const ch_replica *rp = &t->replicas[r];
        if (rp->status == CH_STATUS_OK) continue;
        if (!pick || (rp->root_cause && !pick->root_cause)) pick = rp;
    }
    if (!pick) return CH_STATUS_OK;
    t->broken = true;
    t->broken_err = pick->err;
    if (err) *err = pick->err;
    return pick->status;
}

static void job_setup(void *arg, int r)
{
    ch_trainer *t = arg;
    ch_replica_setup(&t->replicas[r], &t->spec);
}

/* Threads per replica and, when the shares fit the CPUs we may use, which CPUs each one gets. */
static ch_status start_crew(ch_trainer *t, ch_err *err)
{
    /* By default the ranks on one host share its cores. */
    const int local_procs = t->procs > 1 ? ch_world_local_size() : 1;
    const int cores = ch_cpu_count() / local_procs;
    const int D = t->nreplicas, T = t->cfg.threads > 0 ? t->cfg.threads : (cores > 1 ? cores : 1);
    int allowed[1024];
    const int P = ch_cpu_allowed(allowed, 1024);
    int total = 0;
    for (int r = 0; r < D; r++) {
        const int share = T / D + (r < T % D);
        t->replicas[r].nthreads = share > 0 ? share : 1;
        total += t->replicas[r].nthreads;
    }
    /* Ranks of one host that see the same CPUs take consecutive ranges of them. */
    const int first = t->procs > 1 ? ch_world_local_rank() * total : 0;
    const bool pin = P > 0 && P <= 1024 && first + total <= P;
    const int *cpus[CH_MAX_DEVICES];
    int ncpus[CH_MAX_DEVICES], at = first;
    for (int r = 0; r < D; r++) {
        cpus[r] = pin ? allowed + at : NULL;
        ncpus[r] = pin ? t->replicas[r].nthreads : 0;
        at += t->replicas[r].nthreads;
    }
    return ch_crew_create(D, cpus, ncpus, &t->crew, err);
}

static ch_status make_replicas(ch_trainer *t, ch_err *err)
{
    const int D = t->nreplicas;
    t->replicas = calloc((size_t)D, sizeof *t->replicas);
    CH_CHECK_ALLOC(err, t->replicas);
    CH_TRY(ch_local_group_create(D, &t->grads_group, err));
    CH_TRY(ch_local_group_create(D, &t->ctl_group, err));
    const bool mpi = t->procs > 1;
    /* With parameter servers a bucket's MPI stage is its push to the servers. */
    ch_comm *grads_mpi = t->ps ? &t->ps_comm : mpi ? &t->mpi_grads_comm : NULL;
    for (int r = 0; r < D; r++) {
        ch_replica *rp = &t->replicas[r];
        rp->index = r;
        rp->global_index = t->proc * D + r;
        rp->device = t->devices.dev[r];
        ch_hier_comm_init(&rp->grads_comm, &rp->grads_hier, t->grads_group, r, grads_mpi);
        ch_hier_comm_init(&rp->ctl_comm, &rp->ctl_hier, t->ctl_group, r, mpi ? &t->mpi_ctl_comm : NULL);
    }
    CH_TRY(start_crew(t, err));
    ch_crew_run(t->crew, job_setup, t);
    return collect_failure(t, err);
}

/* The devices' kind names their backend: --devices alone picks it (lazy:0,lazy:1 for the lazy
 * test backend), no environment variable does. */
static const char *backend_of(const ch_device_list *l)
{
    return ch_device_kind_name(l->count ? l->dev[0].kind : CH_DEVICE_CPU);
}

static ch_status setup(ch_trainer *t, ch_err *err)
{
    const ch_dataset *d = t->train;
    if (d->n == 0) return ch_fail(err, CH_STATUS_BAD_INPUT, "the training set is empty");
    if (t->test && (t->test->c != d->c || t->test->h != d->h || t->test->w != d->w ||
                    t->test->classes != d->classes))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "test set shape %dx%dx%d differs from training set %dx%dx%d",
                       t->test->c, t->test->h, t->test->w, d->c, d->h, d->w);
    CH_TRY(ch_device_list_parse(t->cfg.devices ? t->cfg.devices : "cpu:0", &t->devices, err));
    ch_device_list_format(&t->devices, t->devices_text, sizeof t->devices_text);
    t->nreplicas = t->devices.count;
    CH_TRY(ch_trainer_join_ranks(t, err));
    if (!t->cfg.graph)
        CH_TRY(ch_zoo_graph(t->model_name, (ch_shape3){ d->c, d->h, d->w }, d->classes, &t->zoo_graph, err));
    if (t->ps_server) return ch_trainer_serve(t, err);
    const int D = t->nreplicas, B = t->cfg.batch_size, R = t->procs * D;
    CH_TRY(ch_shares_init(&t->shares, t->cfg.shares, t->procs, D, err));
    t->counts = malloc(sizeof *t->counts * (size_t)R);
    t->offsets = malloc(sizeof *t->offsets * (size_t)R);
    t->scratch = malloc(sizeof *t->scratch * (size_t)R);
    if (!t->counts || !t->offsets || !t->scratch) return CH_SYS_FAIL(err, "allocation of the batch's cut");
    /* With auto, a rank may come to hold most of a batch: its batch buffers are sized for that,
     * but its model stays planned for the even split, and a slice that outgrows the plan runs as
     * more micro-batches. */
    const int K = t->cfg.accum_steps > 1 ? t->cfg.accum_steps : 1, slice = ch_shares_max_slice(&t->shares, B);
    const int planned = t->shares.automatic ? (B + R - 1) / R : slice;
    t->spec = (ch_replica_spec){
        .graph = t->cfg.graph ? t->cfg.graph : t->zoo_graph, .init = t->init, .seed = t->cfg.seed,
        .input = { d->c, d->h, d->w }, .classes = d->classes, .max_slice = slice,
        .accum = K, .max_micro = (planned + K - 1) / K, .accum_buffer = K > 1 || t->shares.automatic,
        .nglobal = R, .zero = t->cfg.zero == 1, .ps = t->ps,
        .ps_async = t->ps && ch_ps_mode_of(t->ps) == CH_PS_ASYNC,
        .nan_check = t->cfg.nan_check, .sync_bn = t->cfg.sync_bn, .bf16 = ch_trainer_bf16(&t->cfg),
        .bucket_elems = (size_t)((t->cfg.bucket_mb > 0 ? t->cfg.bucket_mb : 25) * (1 << 20) /
                                 sizeof(ch_real)),
        .backend = backend_of(&t->devices),
    };
    ch_backend *probe;   /* a backend that cannot start is one line here, not one per replica */
    CH_TRY(ch_backend_create(t->spec.backend, 0, 1, &probe, err));
    ch_backend_free(probe);
    CH_TRY(ch_trainer_nccl_setup(t, err));
    CH_TRY(ch_trainer_parse_fault(&t->spec.fault, err));
    CH_TRY(ch_trainer_optim_config(&t->cfg, &t->spec.optim, err));
    CH_TRY(ch_trainer_schedule_config(&t->cfg, &t->sched, err));
    t->spec.augment = (ch_augment){ .crop_padding = t->cfg.random_crop, .flip = t->cfg.random_flip };
    if (t->cfg.random_crop < 0 || t->cfg.random_crop > 1024)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "random crop padding %d, expected 0..1024", t->cfg.random_crop);
    if (t->cfg.random_crop > 0 && d->folder)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--random-crop is for IDX and CIFAR-10 data; an ImageFolder "
                       "trains with RandomResizedCrop(--image-size)");
    if (!t->cfg.normalize && d->folder) { /* torchvision's ImageNet recipe */
        snprintf(t->normalize, sizeof t->normalize, "imagenet");
        t->cfg.normalize = t->normalize;
    }
    if (t->cfg.normalize) CH_TRY(ch_augment_parse_normalize(&t->spec.augment, t->cfg.normalize, d->c, err));
    t->lr = ch_schedule_lr(&t->sched, 0, 0, 1);
    t->spec.trace_capacity = t->cfg.trace ? 8192 : 0;
    if (t->cfg.checkpoint_dir && t->proc == 0) CH_TRY(ch_checkpoint_lock(t->cfg.checkpoint_dir, &t->ckpt_lock, err));
    t->perm = malloc(sizeof(uint32_t) * d->n);
    CH_CHECK_ALLOC(err, t->perm);
    if (t->cfg.loader_workers < 0 || t->cfg.loader_workers > CH_LOADER_MAX_WORKERS)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "-j %d: expected 0..%d loader workers", t->cfg.loader_workers,
                       CH_LOADER_MAX_WORKERS);
    if (t->cfg.loader_workers > 0) {
        t->plan = malloc(sizeof *t->plan * ((d->n + (size_t)B - 1) / (size_t)B));
        CH_CHECK_ALLOC(err, t->plan);
        CH_TRY(ch_loader_create(t->cfg.loader_workers, D * t->spec.max_slice, ch_shape3_size(t->spec.input),
                                &t->loader, err));
    }
    if (t->ps) ch_ps_comm_init(&t->ps_comm, t->ps);   /* before the replicas copy it */
    CH_TRY(make_replicas(t, err));
    if (t->ps) {
        const ch_model *m = t->replicas[0].model;
        CH_TRY(ch_ps_attach(t->ps, m->nparams, m->ntensors + 1, err));
        CH_TRY(ch_trainer_ps_hand_over(t, false, "set-up, the parameter servers' start", err));
    }
    /* Before the first step's sums; error feedback keeps one value per gradient. */
    if (t->mpi_grads)
        CH_TRY(ch_mpi_group_set_compress(t->mpi_grads, t->compress, t->replicas[0].model->nparams, err));
    return ch_trainer_align_trace_clocks(t, err);
}

ch_status ch_trainer_create(const ch_train_config *cfg, const ch_dataset *train,
                            const ch_dataset *test, ch_trainer **out, ch_err *err)
{
    /* The ranks agreed on their settings (the CLI compares its flags first), so a setting refused is
     * refused by every rank: one line from rank 0 and a clean exit, not one per rank and an abort. */
    ch_status st = ch_trainer_check_config(cfg, err);
    if (!cfg->local_only)
        st = ch_world_fail_together("set-up", st, cfg->timeout_s > 0 && cfg->timeout_s <= 1e6 ? cfg->timeout_s : 300,
                                    err);
    CH_TRY(st);
    ch_trainer *t = calloc(1, sizeof *t);
    CH_CHECK_ALLOC(err, t);
    t->ckpt_lock = -1;
    t->cfg = *cfg;
    snprintf(t->model_name, sizeof t->model_name, "%s", cfg->graph ? ch_graph_name(cfg->graph) : cfg->model);
    /* Without a choice, an imported model starts from its file's weights, as fine-tuning does. */
    const bool has_values = cfg->graph && cfg->graph->ninits > 0;
    snprintf(t->init, sizeof t->init, "%s", cfg->init ? cfg->init : has_values ? "file" : "default");
    t->cfg.model = cfg->graph ? NULL : t->model_name;
    t->cfg.init = t->init;
    if (cfg->checkpoint_dir) {
        snprintf(t->checkpoint_dir, sizeof t->checkpoint_dir, "%s", cfg->checkpoint_dir);
        t->cfg.checkpoint_dir = t->checkpoint_dir;
    }
    if (cfg->trace) {
        snprintf(t->trace_path, sizeof t->trace_path, "%s", cfg->trace);
        t->cfg.trace = t->trace_path;
    }
    if (cfg->normalize) {
        snprintf(t->normalize, sizeof t->normalize, "%s", cfg->normalize);
        t->cfg.normalize = t->normalize;
    }
    /* The graph is the caller's only while this runs: checkpoints keep it as graph.json. */
    if (cfg->graph && !(t->graph_json = ch_graph_to_json(cfg->graph))) {
        free(t);
        return CH_SYS_FAIL(err, "graph.json of the model");
    }
    t->graph_print = t->graph_json ? ch_graph_text_fingerprint(t->graph_json) : 0;
    ch_grad_compress_parse(cfg->grad_compress, &t->compress);   /* checked by check_config */
    t->pos = (ch_ckpt_position){ .train_loss = -1, .train_acc = -1, .test_loss = -1, .test_acc = -1 };
    t->ps_part = -1;
    t->train = train;
    t->test = test;
    st = setup(t, err);
    /* The caller's strings were borrowed for parsing only. */
    t->cfg.devices = t->devices_text;
    t->cfg.shares = NULL;   /* t->shares holds them */
    t->cfg.grad_compress = ch_grad_compress_name(t->compress);
    if (st != CH_STATUS_OK) {
        ch_trainer_free(t);
        return st;
    }
    *out = t;
    return CH_STATUS_OK;
}

void ch_trainer_set_progress(ch_trainer *t, ch_progress_fn fn, void *user)
{
    t->progress = fn;
    t->progress_user = user;
}

/* The samples [first, first + count) of a global batch of n that this process's replicas take. */
static void local_range(const ch_trainer *t, int n, int *first, int *count)
{
    const int g0 = t->proc * t->nreplicas;
    ch_shares_split(&t->shares, n, t->scratch);
    *first = 0;
    *count = 0;
    for (int g = 0; g < g0; g++) *first += t->scratch[g];
    for (int r = 0; r < t->nreplicas; r++) *count += t->scratch[g0 + r];
}

/* Micro-batches for a slice of cnt samples: --accum-steps, or more where the slice outgrew what the
 * model is planned for (--shares auto gave this rank a larger part). */
static int micro_for(const ch_trainer *t, int cnt)
{
    const int M = t->spec.max_micro, need = (cnt + M - 1) / M;
    return need > t->spec.accum ? need : t->spec.accum;
}

/* The step's cut of n samples over the job's replicas. With sync-BN every replica runs the same
 * micro-batches (each one's statistics are a collective), so the largest slice decides. */
static void cut_batch(ch_trainer *t, int n)
{
    const int R = t->procs * t->nreplicas;
    ch_shares_split(&t->shares, n, t->counts);
    t->job_micro = 0;
    for (int g = 0, at = 0; g < R; at += t->counts[g], g++) {
        t->offsets[g] = at;
        const int k = micro_for(t, t->counts[g]);
        if (t->cfg.sync_bn && k > t->job_micro) t->job_micro = k;
    }
}

/* This process's samples in the last step: its replicas' parts of the step's cut (no new cut). */
static int step_local_count(const ch_trainer *t)
{
    int sum = 0;
    for (int r = 0; r < t->nreplicas; r++) sum += t->counts[t->replicas[r].global_index];
    return sum;
}

static int local_count(const ch_trainer *t, int n)
{
    int first, count;
    local_range(t, n, &first, &count);
    return count;
}

static void job_step(void *arg, int r)
{
    ch_trainer *t = arg;
    /* async parameter servers: the part of the batch this worker claimed (one device per worker) */
    const int g = t->ps_part >= 0 ? t->ps_part : t->replicas[r].global_index, off = t->offsets[g],
              cnt = t->counts[g];
    ch_slice sl = { .idx = t->job_idx + off, .n = cnt, .offset = (uint64_t)off,
                    .global_n = t->job_n, .step = t->step, .lr = t->lr, .epoch = t->epoch,
                    .micro = t->job_micro ? t->job_micro : micro_for(t, cnt), .counts = t->counts };
    if (t->job_x) {
        sl.x = t->job_x + (size_t)(off - t->job_first) * ch_shape3_size(t->spec.input);
        sl.labels = t->job_labels + (off - t->job_first);
    }
    ch_replica_step(&t->replicas[r], &t->spec, t->train, &sl);
}

static ch_status check_usable(const ch_trainer *t, ch_err *err)
{
    if (!t->broken) return CH_STATUS_OK;
    return ch_fail(err, CH_STATUS_SYSTEM, "the trainer stopped after a failure: %s",
                   t->broken_err.msg);
}

ch_status ch_trainer_step(ch_trainer *t, const uint32_t *idx, int n, double *loss_sum,
                          int64_t *correct, ch_err *err)
{
    CH_TRY(check_usable(t, err));
    CH_ASSERT(n >= 1 && n <= t->cfg.batch_size);
    t->job_idx = idx;
    t->job_n = n;
    const bool tracing = t->cfg.trace && !t->trace_done && t->step - t->trace_first < (uint64_t)t->cfg.trace_steps;
    for (int r = 0; r < t->nreplicas; r++) t->replicas[r].tracing = tracing;
    t->job_x = NULL;
    t->job_labels = NULL;
    cut_batch(t, n);
    if (t->loading) {
        CH_TRY(ch_loader_next(t->loader, &t->job_x, &t->job_labels, err));
        int cnt;
        local_range(t, n, &t->job_first, &cnt);
    }
    ch_crew_run(t->crew, job_step, t);
    if (t->loading) ch_loader_release(t->loader);
    CH_TRY(collect_failure(t, err));
    /* Exact totals, in replica order: the same sums whatever the thread timing. */
    *loss_sum = 0;
    *correct = 0;
    t->last_busy_s = 0;
    for (int r = 0; r < t->nreplicas; r++) {
        *loss_sum += t->replicas[r].loss_sum;
        *correct += t->replicas[r].correct;
        if (t->replicas[r].busy_s > t->last_busy_s) t->last_busy_s = t->replicas[r].busy_s;
    }
    t->step++;
    if (tracing && t->step - t->trace_first == (uint64_t)t->cfg.trace_steps) CH_TRY(ch_trainer_write_trace(t, err));
    return CH_STATUS_OK;
}

/* This rank's spans as JSON array elements (no brackets), in memory: *text (malloc'ed), *len. */
bool ch_trainer_shares(const ch_trainer *t, char *out, size_t len)
{
    out[0] = '\0';
    if (!t->shares.given || t->procs == 1) return false;
    ch_shares_format(&t->shares, out, len);
    return true;
}

void ch_trainer_share(const ch_trainer *t, size_t *train, size_t *test)
{
    const size_t B = (size_t)t->cfg.batch_size, n = t->train->n;
    *train = 0;
    for (size_t seen = 0; seen < n; seen += B) *train += (size_t)local_count(t, (int)(n - seen < B ? n - seen : B));
    *test = 0;
    if (!t->test) return;
    /* Evaluation chunks of max_micro (what a model is planned for) go round-robin over the job's
     * replicas. */
    const size_t chunk = (size_t)t->spec.max_micro, R = (size_t)t->procs * t->nreplicas;
    for (int r = 0; r < t->nreplicas; r++)
        for (size_t at = (size_t)t->replicas[r].global_index * chunk; at < t->test->n; at += R * chunk)
            *test += t->test->n - at < chunk ? t->test->n - at : chunk;
}

/* Sum v (n doubles) over the ranks; a no-op in a single process. */
static ch_status sum_over_ranks(ch_trainer *t, double *v, int n, const char *what, ch_err *err)
{
    if (t->procs == 1) return CH_STATUS_OK;
    snprintf(t->main_comm.what, sizeof t->main_comm.what, "%s", what);
    return ch_comm_allreduce_sum_f64(&t->main_comm, v, (size_t)n, err);
}

/* A step checkpoint inside an epoch: the partial sums over all ranks go with it. Collective. */
static ch_status save_step_checkpoint(ch_trainer *t, int steps_done, size_t seen, double loss,
                                      int64_t hits, ch_err *err)
{
    double sums[2] = { loss, (double)hits };
    CH_TRY(sum_over_ranks(t, sums, 2, "checkpoint, partial epoch sums", err));
    ch_ckpt_position p = t->pos;
    p.epoch = t->epoch;
    p.step_in_epoch = steps_done;
    p.seen_in_epoch = seen;
    p.global_step = t->step;
    p.loss_sum = sums[0];
    p.hits = sums[1];
    char name[64];
    snprintf(name, sizeof name, "step-%08llu", (unsigned long long)t->step);
    return ch_trainer_save_checkpoint(t, name, &p, err);
}

static ch_status save_epoch_checkpoint(ch_trainer *t, ch_err *err)
{
    ch_ckpt_position p = t->pos;
    p.epoch = t->epoch;
    p.step_in_epoch = 0;
    p.seen_in_epoch = 0;
    p.global_step = t->step;
    p.loss_sum = p.hits = 0;
    char name[64];
    snprintf(name, sizeof name, "epoch-%04d", t->epoch);
    return ch_trainer_save_checkpoint(t, name, &p, err);
}

static bool step_checkpoint_due(const ch_trainer *t, size_t seen)
{
    return t->cfg.checkpoint_dir && t->cfg.checkpoint_every > 0 && seen < t->train->n &&
           t->step % (uint64_t)t->cfg.checkpoint_every == 0;
}

/* The loader's plan for the rest of the epoch from sample `seen`: this process's part of each step. */
static ch_status start_loader(ch_trainer *t, size_t seen, ch_err *err)
{
    const size_t B = (size_t)t->cfg.batch_size, n = t->train->n;
    int k = 0;
    for (size_t at = seen; at < n; at += B, k++) {
        int first, count;
        local_range(t, (int)(n - at < B ? n - at : B), &first, &count);
        t->plan[k] = (ch_loader_batch){ .idx = t->perm + at + first, .count = count };
    }
    CH_TRY(ch_loader_start(t->loader, &t->spec.augment, t->train, t->cfg.seed, t->epoch, t->plan, k, err));
    t->loading = true;
    return CH_STATUS_OK;
}

/* --shares auto: every rank's measured busy seconds and samples to every rank, then the new shares
 * (the same integers everywhere). Collective. */
static ch_status rebalance_shares(ch_trainer *t, bool *moved, ch_err *err)
{
    const int P = t->procs;
    double *v = calloc(2 * (size_t)P, sizeof *v);
    CH_CHECK_ALLOC(err, v);
    v[t->proc] = t->shares.busy_s;
    v[P + t->proc] = t->shares.samples;
    const ch_status st = sum_over_ranks(t, v, 2 * P, "--shares auto, the ranks' step times", err);
    *moved = st == CH_STATUS_OK && ch_shares_rebalance(&t->shares, v, v + P);
    free(v);
    t->shares.busy_s = t->shares.samples = 0;
    t->shares.measured = 0;
    return st;
}

/* --shares auto: this step's busy time, past the epoch's first two steps (warm-up, the loader's
 * start); after the run's first CH_SHARES_PROBE measured steps the shares are re-balanced once
 * (and the loader re-planned from *seen), then at every epoch end. */
static ch_status measure_step(ch_trainer *t, int i, int first, size_t seen, ch_err *err)
{
    if (!t->shares.automatic || t->procs == 1 || i - first < 2) return CH_STATUS_OK;
    t->shares.busy_s += t->last_busy_s;
    t->shares.samples += step_local_count(t);
    t->shares.measured++;
    if (t->probed || t->shares.measured < CH_SHARES_PROBE || seen >= t->train->n) return CH_STATUS_OK;
    t->probed = true;
    bool moved;
    CH_TRY(rebalance_shares(t, &moved, err));
    if (!moved || !t->loader) return CH_STATUS_OK;
    ch_loader_stop(t->loader);
    t->loading = false;
    return start_loader(t, seen, err);
}

/* The epoch's steps from step `first` (sample *seen), adding to the running sums. */
static ch_status train_steps(ch_trainer *t, int first, size_t *seen, double *loss, int64_t *hits,
                             double *lr_last, double t0, ch_err *err)
{
    const size_t B = (size_t)t->cfg.batch_size, N = t->train->n;
    const int steps = first + (int)((N - *seen + B - 1) / B);
    const long per_epoch = (long)((N + B - 1) / B);
    size_t mine = 0;
    for (int i = first; *seen < N; i++) {
        const int n = (int)(B < N - *seen ? B : N - *seen);
        t->lr = ch_schedule_lr(&t->sched, t->epoch, i, per_epoch);
        *lr_last = t->lr;
        double l;
        int64_t c;
        CH_TRY(ch_trainer_step(t, t->perm + *seen, n, &l, &c, err));
        *loss += l;
        *hits += c;
        *seen += (size_t)n;
        mine += (size_t)step_local_count(t);
        CH_TRY(measure_step(t, i, first, *seen, err));
        /* The running figures are this process's share; the epoch's are exact over all ranks. */
        if (t->progress)
            t->progress(t->progress_user, i + 1, steps, mine ? *loss / mine : 0,
                        mine ? (double)*hits / mine : 0, *seen, ch_clock_s() - t0);
        if (step_checkpoint_due(t, *seen)) CH_TRY(save_step_checkpoint(t, i + 1, *seen, *loss, *hits, err));
    }
    return CH_STATUS_OK;
}

static void job_flush(void *arg, int r)
{
    ch_trainer *t = arg;
    ch_replica_ps_flush(&t->replicas[r], &t->spec);
}

/* --ps-mode async: this worker trains the units of the epoch it claims from the first server (a
 * unit is one worker's part of one global batch, as the sync split cuts it) until none is left;
 * then every worker flushes and takes the same parameters. */
static ch_status train_claimed(ch_trainer *t, size_t *seen, double *loss, int64_t *hits, double *lr_last, double t0,
                               ch_err *err)
{
    const size_t B = (size_t)t->cfg.batch_size, N = t->train->n;
    const long per_epoch = (long)((N + B - 1) / B);
    const int W = t->procs;
    const uint64_t base = t->step;
    size_t mine = 0;
    for (int done = 1;; done++) {
        int64_t unit;
        CH_TRY(ch_ps_claim(t->ps, t->epoch, &unit, err));
        if (unit < 0) break;
        const size_t at = (size_t)(unit / W) * B;
        const int n = (int)(B < N - at ? B : N - at);
        t->lr = ch_schedule_lr(&t->sched, t->epoch, (int)(unit / W), per_epoch);
        *lr_last = t->lr;
        t->step = base + (uint64_t)(unit / W);   /* the batch's global step: the same dropout masks */
        t->ps_part = (int)(unit % W);
        double l;
        int64_t c;
        const ch_status st = ch_trainer_step(t, t->perm + at, n, &l, &c, err);
        t->ps_part = -1;
        CH_TRY(st);
        *loss += l;
        *hits += c;
        mine += (size_t)t->counts[unit % W];
        if (t->progress)
            t->progress(t->progress_user, done, (int)((per_epoch + W - 1) / W), mine ? *loss / mine : 0,
                        mine ? (double)*hits / mine : 0, mine, ch_clock_s() - t0);
    }
    ch_crew_run(t->crew, job_flush, t);
    CH_TRY(collect_failure(t, err));
    t->step = base + (uint64_t)per_epoch;
    *seen = N;
    return CH_STATUS_OK;
}

static ch_status run_epoch(ch_trainer *t, ch_epoch_stats *s, ch_err *err);

ch_status ch_trainer_run_epoch(ch_trainer *t, ch_epoch_stats *s, ch_err *err)
{
    return ch_trainer_ps_give_up(t, run_epoch(t, s, err), err);
}

static ch_status run_epoch(ch_trainer *t, ch_epoch_stats *s, ch_err *err)
{
    CH_TRY(check_usable(t, err));
    const ch_dataset *d = t->train;
    ch_rng rng;
    ch_rng_init(&rng, t->cfg.seed, CH_RNG_STREAM_SHUFFLE, (uint64_t)t->epoch << 40);
    if (t->cfg.in_order) ch_rng_identity(t->perm, (uint32_t)d->n);   /* --shuffle off */
    else ch_rng_permutation(&rng, t->perm, (uint32_t)d->n);

    /* Resumed inside this epoch: go on from the checkpoint's position, with its partial sums
     * (counted once, on rank 0). */
    size_t seen = 0;
    int first = 0;
    double loss = 0;
    int64_t hits = 0;
    if (t->mid_epoch) {
        seen = t->pos.seen_in_epoch;
        first = t->pos.step_in_epoch;
        if (t->proc == 0) {
            loss = t->pos.loss_sum;
            hits = (int64_t)t->pos.hits;
        }
        t->mid_epoch = false;
    }
    /* --shares auto: the last epoch's measurement decides this one's shares (so an epoch's metrics
     * and checkpoint show the shares it ended with). */
    if (t->shares.automatic && t->procs > 1 && t->shares.measured >= 3) {
        bool moved;
        CH_TRY(rebalance_shares(t, &moved, err));
        t->probed = true;
    }
    const size_t seen0 = seen;
    const double t0 = ch_clock_s();
    double lr_last = t->lr, wait_s = 0;
    if (t->loader) CH_TRY(start_loader(t, seen, err));
    const bool claimed = t->spec.ps_async;
    if (claimed && seen > 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--ps-mode async resumes at epoch ends: this checkpoint stopped "
                       "inside epoch %d (resume it without async, or from an epoch checkpoint)", t->epoch + 1);
    ch_status st = claimed ? train_claimed(t, &seen, &loss, &hits, &lr_last, t0, err)
                           : train_steps(t, first, &seen, &loss, &hits, &lr_last, t0, err);
    if (t->loader) {
        ch_loader_stop(t->loader);
        t->loading = false;
        wait_s = ch_loader_take_wait_s(t->loader);
    }
    CH_TRY(st);
    double sums[2] = { loss, (double)hits };
    char what[64];
    snprintf(what, sizeof what, "epoch %d, training metrics", t->epoch + 1);
    CH_TRY(sum_over_ranks(t, sums, 2, what, err));
    const double elapsed = ch_clock_s() - t0;
    t->epoch++;
    *s = (ch_epoch_stats){ .epoch = t->epoch, .loss = sums[0] / seen,
                           .train_acc = sums[1] / seen, .time_s = elapsed,
                           .images_per_s = (seen - seen0) / (elapsed > 0 ? elapsed : 1e-9), .lr = lr_last,
                           .data_wait_s = wait_s,
                           .train_images = seen, .test_acc = -1 };
    double test_loss = -1;
    if (t->test) {
        CH_TRY(ch_trainer_evaluate(t, t->test, &test_loss, &s->test_acc, err));
        s->test_images = t->test->n;
    }
    t->pos.train_loss = s->loss;
    t->pos.train_acc = s->train_acc;
    t->pos.test_loss = test_loss;
    t->pos.test_acc = s->test_acc;
    if (t->cfg.checkpoint_dir) CH_TRY(save_epoch_checkpoint(t, err));
    return CH_STATUS_OK;
}

ch_status ch_trainer_resume(ch_trainer *t, const char *path, ch_err *err)
{
    CH_TRY(check_usable(t, err));
    ch_ckpt_position p;
    ch_status st = ch_trainer_ps_give_up(t, ch_trainer_load_checkpoint(t, path, NULL, &p, err), err);
    if (st != CH_STATUS_OK) {
        /* Checks fail before anything is copied; only a failed exchange leaves replicas apart. */
        for (int r = 0; r < t->nreplicas; r++)
            if (t->replicas[r].status != CH_STATUS_OK) t->broken = true;
        return st;
    }
    t->pos = p;
    t->epoch = p.epoch;
    t->step = p.global_step;
    t->trace_first = p.global_step;
    t->mid_epoch = p.seen_in_epoch > 0;
    return CH_STATUS_OK;
}

ch_status ch_trainer_load_weights(ch_trainer *t, const char *file, ch_err *err)
{
    CH_TRY(check_usable(t, err));
    return ch_trainer_load_checkpoint(t, NULL, file, NULL, err);
}

ch_status ch_trainer_export(const ch_trainer *t, const char *file, ch_err *err)
{
    if (t->proc != 0) return CH_STATUS_OK;
    return ch_checkpoint_export(t->replicas[0].model, t->model_name, file, err);
}

int ch_trainer_epochs_done(const ch_trainer *t) { return t->epoch; }

static void job_evaluate(void *arg, int r)
{
    ch_trainer *t = arg;
    ch_replica_evaluate(&t->replicas[r], &t->spec, t->job_data);
}

ch_status ch_trainer_evaluate_classes(ch_trainer *t, const ch_dataset *d, double *loss, double *acc,
                                      int64_t *hits, int64_t *counts, ch_err *err)
{
    CH_TRY(check_usable(t, err));
    if (d->c != t->train->c || d->h != t->train->h || d->w != t->train->w)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "evaluation data shape %dx%dx%d does not fit the model",
                       d->c, d->h, d->w);
    t->job_data = d;
    ch_crew_run(t->crew, job_evaluate, t);
    CH_TRY(collect_failure(t, err));
    /* Loss sums in replica order, counts exact; then over the ranks. */
    const int K = t->spec.classes;
    double *v = calloc((size_t)(2 * K + 2), sizeof *v);
    CH_CHECK_ALLOC(err, v);
    for (int r = 0; r < t->nreplicas; r++) {
        const ch_replica *rp = &t->replicas[r];
        v[0] += rp->loss_sum;
        v[1] += (double)rp->correct;
        for (int c = 0; c < K; c++) {
            v[2 + c] += (double)rp->class_hits[c];
            v[2 + K + c] += (double)rp->class_counts[c];
        }
    }
    ch_status st = sum_over_ranks(t, v, 2 * K + 2, "evaluation metrics", err);
    if (st == CH_STATUS_OK) {
        *loss = d->n ? v[0] / d->n : 0;
        *acc = d->n ? v[1] / d->n : 0;
        for (int c = 0; hits && c < K; c++) hits[c] = (int64_t)v[2 + c];
        for (int c = 0; counts && c < K; c++) counts[c] = (int64_t)v[2 + K + c];
    }
    free(v);
    return st;
}

ch_status ch_trainer_evaluate(ch_trainer *t, const ch_dataset *d, double *loss, double *acc,
                              ch_err *err)
{
    return ch_trainer_evaluate_classes(t, d, loss, acc, NULL, NULL, err);
}

const char *ch_trainer_devices(const ch_trainer *t) { return t->devices_text; }
const ch_device_list *ch_trainer_device_list(const ch_trainer *t) { return &t->devices; }

int ch_trainer_zero(const ch_trainer *t) { return t->replicas && t->replicas[0].sharded ? 1 : 0; }

bool ch_trainer_is_ps_server(const ch_trainer *t) { return t->ps_server; }

const char *ch_trainer_ps(const ch_trainer *t, int *servers)
{
    if (!t->ps) return NULL;
    if (servers) *servers = ch_ps_servers(t->ps);
    return ch_ps_mode_name(ch_ps_mode_of(t->ps));
}

size_t ch_trainer_optimizer_bytes(const ch_trainer *t)
{
    size_t bytes = 0;
    for (int r = 0; r < t->nreplicas; r++)
        bytes += (size_t)t->replicas[r].opt.nstate * t->replicas[r].opt.n * sizeof(ch_real);
    return bytes;
}

const char *ch_trainer_grad_compress(const ch_trainer *t)
{
    return ch_grad_compress_name(t->procs > 1 ? t->compress : CH_COMPRESS_NONE);
}
size_t ch_trainer_param_count(const ch_trainer *t) { return t->replicas[0].model->nparams; }

void ch_trainer_get_params(const ch_trainer *t, float *out)
{
    const ch_model *m = t->replicas[0].model;
    ch_err err;
    if (ch_model_download_floats(m, out, m->params, m->nparams, &err) != CH_STATUS_OK)
        for (size_t i = 0; i < m->nparams; i++) out[i] = NAN;
}

static void job_free(void *arg, int r)
{
    ch_trainer *t = arg;
    /* On its own thread: the sync thread it started is joined by the thread that owns it. */
    ch_replica_free(&t->replicas[r]);
}

void ch_trainer_free(ch_trainer *t)
{
    if (!t) return;
    /* A worker tells the servers it is done (after a failure the job is ending anyway). */
    ch_err err;
    if (t->ps && !t->ps_server && t->replicas && !t->broken) (void)ch_ps_stop(t->ps, &err);
    if (t->crew) ch_crew_run(t->crew, job_free, t);
    ch_crew_free(t->crew);
    if (!t->crew && t->replicas)
        for (int r = 0; r < t->nreplicas; r++) ch_replica_free(&t->replicas[r]);
    ch_local_group_free(t->grads_group);
    ch_local_group_free(t->ctl_group);
    ch_mpi_group_free(t->mpi_grads);
    ch_mpi_group_free(t->mpi_ctl);
    ch_mpi_group_free(t->mpi_main);
    ch_ps_free(t->ps);
    ch_mpi_group_free(t->ps_job);
    free(t->replicas);
    free(t->perm);
    ch_loader_free(t->loader);
    free(t->plan);
    ch_checkpoint_unlock(t->ckpt_lock);
    ch_shares_free(&t->shares);
    free(t->counts);
    free(t->offsets);
    free(t->scratch);
    free(t->graph_json);
    ch_graph_free(t->zoo_graph);
    free(t);
}
