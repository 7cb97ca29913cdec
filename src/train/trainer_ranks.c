/* The trainer's place among the ranks: its MPI groups (and parameter servers' roles), the ranks'
 * agreement on every setting and on the data before any collective depends on them, and a common
 * clock origin for traces. */
#include "train/trainer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "comm/world.h"
#include "core/trace.h"
#include "data/folder.h"
#include "kernels/cuda/plugin.h"
#include "train/options.h"
#include "train/ps.h"

static ch_status check_ranks_agree(ch_trainer *t, ch_err *err);

/* The MPI groups, made in the same order on every rank, once the ranks agree on the job (so that
 * a rank with other settings never reaches a collective the others do not run). */
ch_status ch_trainer_join_ranks(ch_trainer *t, ch_err *err)
{
    t->procs = t->cfg.local_only ? 1 : ch_world_size();
    t->proc = t->cfg.local_only ? 0 : ch_world_rank();
    if (t->procs == 1) return CH_STATUS_OK;
    CH_TRY(check_ranks_agree(t, err));
    if (t->cfg.ps_servers > 0) {
        /* The servers leave the trainers' communicators to the workers. */
        ch_ps_config pc = { .servers = t->cfg.ps_servers, .staleness = t->cfg.staleness,
                            .timeout_s = t->cfg.timeout_s > 0 ? t->cfg.timeout_s : 300 };
        ch_ps_mode_parse(t->cfg.ps_mode, &pc.mode);   /* checked by check_config */
        CH_TRY(ch_ps_create(&pc, &t->ps, &t->ps_job, err));
        t->ps_server = ch_ps_is_server(t->ps);
        t->procs = ch_ps_workers(t->ps);
        if (t->ps_server || t->procs == 1) return CH_STATUS_OK;
        CH_TRY(ch_mpi_group_dup(t->ps_job, &t->mpi_grads, err));
        CH_TRY(ch_mpi_group_dup(t->ps_job, &t->mpi_ctl, err));
        CH_TRY(ch_mpi_group_dup(t->ps_job, &t->mpi_main, err));
        ch_mpi_comm_init(&t->mpi_grads_comm, t->mpi_grads);
        ch_mpi_comm_init(&t->mpi_ctl_comm, t->mpi_ctl);
        ch_mpi_comm_init(&t->main_comm, t->mpi_main);
        return CH_STATUS_OK;
    }
    CH_TRY(ch_mpi_group_create(t->cfg.timeout_s, &t->mpi_grads, err));
    CH_TRY(ch_mpi_group_create(t->cfg.timeout_s, &t->mpi_ctl, err));
    CH_TRY(ch_mpi_group_create(t->cfg.timeout_s, &t->mpi_main, err));
    ch_mpi_comm_init(&t->mpi_grads_comm, t->mpi_grads);
    ch_mpi_comm_init(&t->mpi_ctl_comm, t->mpi_ctl);
    ch_mpi_comm_init(&t->main_comm, t->mpi_main);
    return CH_STATUS_OK;
}

static uLong crc32_bytes(uLong crc, const uint8_t *p, size_t len)
{
    for (size_t at = 0; at < len; at += 1u << 30)
        crc = crc32(crc, p + at, (uInt)(len - at < (1u << 30) ? len - at : (1u << 30)));
    return crc;
}

/* A data set as text: size, shape, classes and a CRC-32 of its contents (an ImageFolder's: its
 * file names relative to the split's folder, since hosts may mount it elsewhere). */
static void describe_dataset(const ch_dataset *d, char *out, size_t len)
{
    if (!d) {
        snprintf(out, len, "none");
        return;
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    if (d->folder)
        for (size_t i = 0; i < d->n; i++) {
            const char *p = d->folder->paths[i] + strlen(d->folder->root);
            crc = crc32(crc, (const Bytef *)p, (uInt)strlen(p));
        }
    else
        crc = crc32_bytes(crc, d->images, d->n * (size_t)d->c * d->h * d->w);
    crc = crc32_bytes(crc, (const uint8_t *)d->labels, d->n * sizeof *d->labels);
    snprintf(out, len, "%zu samples of %dx%dx%d, %d classes, crc %08lx", d->n, d->c, d->h, d->w, d->classes,
             (unsigned long)crc);
}

enum { AGREE_MAX = CH_OPT_MAX };

typedef struct settings {
    const char *names[AGREE_MAX];
    const char *values[AGREE_MAX];
    char text[AGREE_MAX][128];
    char flag[AGREE_MAX][40];   /* "--NAME" of the option table's rows */
    int n;
} settings;

static void put_setting(settings *s, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void put_setting(settings *s, const char *name, const char *fmt, ...)
{
    CH_ASSERT(s->n < AGREE_MAX);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->text[s->n], sizeof s->text[s->n], fmt, ap);
    va_end(ap);
    s->names[s->n] = name;
    s->values[s->n] = s->text[s->n];
    s->n++;
}

/* Everything the ranks must share, named as the flags that set it: the data (or the ranks' shares
 * overlap and the sums mean nothing), every setting that changes the arithmetic, and every one
 * that decides which collectives run (a checkpoint's sums, the trace's barrier, the epochs). */
static void job_settings(const ch_trainer *t, settings *s)
{
    const ch_train_config *c = &t->cfg;
    s->n = 0;
    char data[128];
    describe_dataset(t->train, data, sizeof data);
    put_setting(s, "the training data (--data, --train-limit)", "%s", data);
    describe_dataset(t->test, data, sizeof data);
    put_setting(s, "the test data (--data, --test-limit)", "%s", data);
    put_setting(s, "the model's graph", "%016llx", (unsigned long long)t->graph_print);
    put_setting(s, "--devices (their number)", "%d", t->nreplicas);
    /* Every flag of the option table that sets the arithmetic or the collectives (train/options.h). */
    int n;
    const ch_opt *o = ch_opt_table(&n);
    for (int i = 0; i < n; i++) {
        if (!(o[i].cmds & CH_CMD_TRAIN) || o[i].where != CH_IN_CFG) continue;
        if (o[i].agree != CH_AGREE_VALUE && o[i].agree != CH_AGREE_GIVEN) continue;
        CH_ASSERT(s->n < AGREE_MAX);
        char value[128];
        ch_opt_show(&o[i], c, value, sizeof value);
        /* A path (GIVEN, a string row): only whether there is one. */
        const bool given = o[i].agree == CH_AGREE_GIVEN;
        const bool there = given && *(const char *const *)(const void *)((const char *)c + o[i].offset);
        snprintf(s->flag[s->n], sizeof s->flag[s->n], "--%s%s", o[i].name, given ? " (given or not)" : "");
        put_setting(s, s->flag[s->n], "%s", !given ? value : there ? "given" : "not given");
    }
}

/* Before any collective that depends on them: every rank must have the same settings. */
static ch_status check_ranks_agree(ch_trainer *t, ch_err *err)
{
    if (t->procs == 1) return CH_STATUS_OK;
    settings s;
    job_settings(t, &s);
    return ch_world_agree("set-up", s.names, s.values, s.n, t->cfg.timeout_s, err);
}

/* The ranks' monotonic clocks differ (other hosts): take rank 0's reading right after a barrier as
 * the common origin. Good to the barrier's skew, microseconds on one host. */
ch_status ch_trainer_align_trace_clocks(ch_trainer *t, ch_err *err)
{
    if (!t->cfg.trace || t->procs == 1) return CH_STATUS_OK;
    snprintf(t->main_comm.what, sizeof t->main_comm.what, "set-up, trace clocks");
    CH_TRY(ch_comm_barrier(&t->main_comm, err));
    const int64_t mine = ch_trace_now();
    double root[1] = { t->proc == 0 ? (double)mine : 0 };
    CH_TRY(ch_comm_allreduce_sum_f64(&t->main_comm, root, 1, err));
    t->trace_offset_ns = (int64_t)root[0] - mine;
    return CH_STATUS_OK;
}

/* Every rank's value in its own slot, one sum: the largest. */
ch_status ch_trainer_max_over_ranks(ch_trainer *t, double *v, ch_err *err)
{
    if (t->procs <= 1) return CH_STATUS_OK;
    double *all = calloc((size_t)t->procs, sizeof *all);
    CH_CHECK_ALLOC(err, all);
    all[t->proc] = *v;
    const ch_status st = ch_comm_allreduce_sum_f64(&t->main_comm, all, (size_t)t->procs, err);
    for (int r = 0; st == CH_STATUS_OK && r < t->procs; r++)
        if (all[r] > *v) *v = all[r];
    free(all);
    return st;
}

/* NCCL where it can serve: every replica of the job a GPU, no two of this process's on one GPU
 * (NCCL refuses that; such replicas sum through host memory), and no exchange of the host's own
 * kind (parameter servers, --grad-compress, --zero 1). COHORT_NCCL=0 keeps the host's sums;
 * COHORT_NCCL=1 uses NCCL even for a single replica (the one-member communicator end to end). The
 * ranks agree first: a rank that would not join would leave the others waiting in the set-up. */
static bool nccl_fits(const ch_trainer *t)
{
    const char *env = getenv("COHORT_NCCL");
    if (strcmp(t->spec.backend, "cuda") != 0 || (env && strcmp(env, "0") == 0)) return false;
    if (t->procs * t->nreplicas < 2 && !(env && strcmp(env, "1") == 0)) return false;
    if (t->ps || t->cfg.zero == 1 || t->compress != CH_COMPRESS_NONE) return false;
    const char *wrap = getenv("COHORT_CUDA_WRAP");
    if (wrap && strcmp(wrap, "1") == 0) return false;
    for (int i = 0; i < t->devices.count; i++)
        for (int j = 0; j < i; j++)
            if (t->devices.dev[i].index == t->devices.dev[j].index) return false;
    return true;
}

ch_status ch_trainer_nccl_setup(ch_trainer *t, ch_err *err)
{
    if (strcmp(t->spec.backend, "cuda") != 0) return CH_STATUS_OK;   /* no new collective in CPU jobs */
    bool use = nccl_fits(t);
    if (t->procs > 1) {
        double votes = use;
        CH_TRY(ch_comm_allreduce_sum_f64(&t->mpi_ctl_comm, &votes, 1, err));
        if (votes != 0 && votes != t->procs)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "ranks disagree on NCCL (%g of %d would use it): give every rank "
                           "the same devices kind and COHORT_NCCL", votes, t->procs);
    }
    if (!use) return CH_STATUS_OK;
    const ch_cuda_plugin *p = ch_cuda_plugin_load(err);
    if (!p) return CH_STATUS_BAD_INPUT;
    if (t->proc == 0) {
        CH_TRY(p->nccl_id(t->spec.nccl_id, err));
        CH_TRY(p->nccl_id(t->spec.nccl_ctl_id, err));
    }
    if (t->procs > 1) {
        CH_TRY(ch_comm_broadcast_bytes(&t->mpi_ctl_comm, t->spec.nccl_id, sizeof t->spec.nccl_id, 0, err));
        CH_TRY(ch_comm_broadcast_bytes(&t->mpi_ctl_comm, t->spec.nccl_ctl_id, sizeof t->spec.nccl_ctl_id, 0, err));
    }
    t->spec.nccl = true;
    t->spec.timeout_s = t->cfg.timeout_s > 0 ? t->cfg.timeout_s : 300;
    return CH_STATUS_OK;
}
