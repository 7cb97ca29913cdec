/* Ranks over Open MPI must compute what one process computes. Run under mpirun with N = 1, 2, 4
 * (ctest does; oversubscribed on small machines). Every rank also builds a single-process trainer
 * (local_only) on the whole global batch as its reference.
 * - one step (lr 0) of lenet, mnist-cnn and resnet18 with sync-BN on a global batch that does not
 *   divide evenly gives the single-process gradient within 1e-5 relative, on every rank;
 * - one epoch of lenet on a subset of real MNIST (size not a multiple of N x batch) ends with the
 *   single-process parameters within 1e-4, every rank holds the same bits, and every training sample
 *   was gathered exactly once across all ranks and replicas;
 * - evaluation splits the test set over the ranks and reports exactly the single-process accuracy;
 * - every job shape (these ranks x 1-2 devices, batch 1-5, epochs whose last batch holds 1-3
 *   samples, so ranks and replicas often have no sample) ends an epoch with one device's
 *   parameters (linear and lenet, 1e-5).
 * A failed check prints the rank and ends the job (MPI_Abort) so no rank waits for another.
 * usage: test_mpi DATA_ROOT (holding mnist/) */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "nn/model.h"
#include "test_util.h"
#include "train/options.h"
#include "train/trainer.h"

static int rank, size;

#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "test_mpi: rank %d of %d: %s:%d: ", rank, size, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            MPI_Abort(MPI_COMM_WORLD, 1);                                             \
        }                                                                             \
    } while (0)

static ch_trainer *make(const char *model, const ch_dataset *train, const ch_dataset *test,
                        const char *devices, int batch, double lr, double momentum,
                        bool local_only)
{
    ch_train_config cfg = ch_train_config_default();
    cfg.model = model;
    cfg.batch_size = batch;
    cfg.lr = lr;
    cfg.momentum = momentum;
    cfg.seed = 11;
    cfg.threads = 1;
    cfg.devices = tu_devices(devices);
    cfg.sync_bn = true;
    cfg.bucket_mb = 0.05;   /* several buckets, several Iallreduce per step */
    cfg.local_only = local_only;
    cfg.timeout_s = 120;
    ch_trainer *t = NULL;
    ch_err err;
    ch_status st = ch_trainer_create(&cfg, train, test, &t, &err);
    CHECK(st == CH_STATUS_OK, "trainer: %s", err.msg);
    CHECK(strcmp(t->replicas[0].be->ops->name, tu_backend) == 0, "the job runs on %s, not on --backend=%s",
          t->replicas[0].be->ops->name, tu_backend);
    return t;
}

/* A host copy of n values of m's memory (the backend --backend names); the caller frees it. */
static ch_real *down(const ch_model *m, const ch_real *dev, size_t n)
{
    ch_real *h = malloc(sizeof(ch_real) * (n ? n : 1));
    CHECK(h != NULL, "malloc");
    ch_backend_download(m->be, h, dev, sizeof(ch_real) * n);
    return h;
}

/* Rank 0's bits, everywhere (x is n values of m's memory). */
static void check_same_on_all_ranks(const ch_model *m, const ch_real *x, size_t n, const char *what)
{
    ch_real *here = down(m, x, n), *mine = down(m, x, n);
    MPI_Bcast(mine, (int)(n * sizeof(ch_real)), MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK(memcmp(mine, here, sizeof(ch_real) * n) == 0, "%s differ from rank 0's", what);
    free(mine);
    free(here);
}

/* One step of a batch of n images of size x size on the job against one process: the gradients
 * within tol (relative, per tensor), and the same bits on every rank. */
static void test_gradient(const char *model, const char *devices, int n, int size_px, double tol)
{
    ch_dataset *d = tu_synthetic(64, size_px, 5);
    ch_trainer *job = make(model, d, NULL, devices, n, 0, 0.9, false);
    ch_trainer *one = make(model, d, NULL, "cpu:0", n, 0, 0.9, true);
    uint32_t idx[64];
    for (int i = 0; i < n; i++) idx[i] = (uint32_t)((i * 7 + 3) % 64);
    double l1, l2;
    int64_t c1, c2;
    ch_err err;
    CHECK(ch_trainer_step(job, idx, n, &l1, &c1, &err) == CH_STATUS_OK, "%s", err.msg);
    CHECK(ch_trainer_step(one, idx, n, &l2, &c2, &err) == CH_STATUS_OK, "%s", err.msg);
    const ch_model *m = job->replicas[0].model;
    const ch_model *m1 = one->replicas[0].model;
    ch_real *gj = down(m, m->grads, m->nparams), *g1 = down(m1, m1->grads, m->nparams);
    const double e = tu_grad_error(m, gj, g1);
    free(gj);
    free(g1);
    if (rank == 0)
        printf("gradient %-9s %d ranks x [%s], batch %2d: %.3g relative to one process\n", model,
               size, devices, n, e);
    CHECK(e <= tol, "%s gradient differs from one process by %.3g (> %g)", model, e, tol);
    check_same_on_all_ranks(m, m->grads, m->nparams, "synced gradients");
    ch_trainer_free(job);
    ch_trainer_free(one);
    ch_dataset_free(d);
}

static void test_epoch(const char *root)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/mnist", root);
    ch_dataset *train, *test;
    ch_err err;
    CHECK(ch_dataset_load_idx(dir, CH_SPLIT_TRAIN, &train, &err) == CH_STATUS_OK, "%s", err.msg);
    CHECK(ch_dataset_load_idx(dir, CH_SPLIT_TEST, &test, &err) == CH_STATUS_OK, "%s", err.msg);
    /* 1100 = 17 x 64 + 12: the last step is short, and with 4 ranks each of its slices is 3. */
    const size_t n = 1100;
    const int batch = 64;
    CHECK(n % (size_t)(size * batch) != 0 || size == 1, "subset size must not divide evenly");
    ch_dataset_truncate(train, n);
    ch_dataset_truncate(test, 1000);
    /* lr 0.2, reference program A's. At 0.3 to 0.32 this net sits at a loss of ~2.25 for the
     * epoch, where one hidden ReLU falling the other way in one step moves the parameters by 2-5%:
     * the check then measured that knife edge (the im2col build already reached 4.9e-5 at 0.32,
     * and Winograd's different rounding crossed it), not whether the ranks train as one. */
    ch_trainer *job = make("lenet", train, test, "cpu:0", batch, 0.2, 0.9, false);
    ch_trainer *one = make("lenet", train, test, "cpu:0", batch, 0.2, 0.9, true);

    /* Before training both hold the same parameters: evaluation must agree exactly. */
    double jl, ja, ol, oa;
    CHECK(ch_trainer_evaluate(job, test, &jl, &ja, &err) == CH_STATUS_OK, "%s", err.msg);
    CHECK(ch_trainer_evaluate(one, test, &ol, &oa, &err) == CH_STATUS_OK, "%s", err.msg);
    CHECK(ja == oa, "test accuracy %.6f over the ranks, %.6f in one process", ja, oa);
    CHECK(fabs(jl - ol) <= 1e-6 * fabs(ol), "test loss %.9f over the ranks, %.9f in one process", jl, ol);

    uint32_t *counts = calloc(n, sizeof *counts);
    CHECK(counts != NULL, "calloc");
    job->spec.sample_counts = counts;
    ch_epoch_stats sj, so;
    CHECK(ch_trainer_run_epoch(job, &sj, &err) == CH_STATUS_OK, "%s", err.msg);
    CHECK(ch_trainer_run_epoch(one, &so, &err) == CH_STATUS_OK, "%s", err.msg);
    MPI_Allreduce(MPI_IN_PLACE, counts, (int)n, MPI_UINT32_T, MPI_SUM, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++) CHECK(counts[i] == 1, "training sample %zu used %u times in the epoch", i, counts[i]);
    size_t share_train, share_test, sums[2];
    ch_trainer_share(job, &share_train, &share_test);
    sums[0] = share_train;
    sums[1] = share_test;
    MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sums[0] == n && sums[1] == 1000, "the ranks' shares add up to %zu and %zu", sums[0], sums[1]);

    const size_t np = ch_trainer_param_count(job);
    float *pj = malloc(sizeof(float) * np), *po = malloc(sizeof(float) * np);
    CHECK(pj && po, "malloc");
    ch_trainer_get_params(job, pj);
    ch_trainer_get_params(one, po);
    const double e = tu_max_norm_err_f32(pj, po, np);
    if (rank == 0)
        printf("epoch lenet %d ranks, %zu samples, batch %d: parameters %.3g from one process; "
               "loss %.6f vs %.6f, test acc %.4f vs %.4f\n",
               size, n, batch, e, sj.loss, so.loss, sj.test_acc, so.test_acc);
    CHECK(e <= 1e-4, "after one epoch the parameters differ from one process by %.3g (> 1e-4)", e);
    CHECK(sj.train_images == n, "epoch reports %zu images, expected %zu", sj.train_images, n);
    const ch_model *m = job->replicas[0].model;
    check_same_on_all_ranks(m, m->params, m->nparams, "parameters after an epoch");
    free(pj);
    free(po);
    free(counts);
    ch_trainer_free(job);
    ch_trainer_free(one);
    ch_dataset_free(train);
    ch_dataset_free(test);
}

static void test_job_shapes(const char *model)
{
    ch_dataset *d = tu_synthetic(16, 28, 21);
    static const char *const devices[] = { "cpu:0", "cpu:0,cpu:1" };
    double worst = 0;
    for (int dv = 0; dv < 2; dv++)
        for (int B = 1; B <= 5; B++)
            for (int r = 0; r <= 3 && (r == 0 || r < B); r++) {
                d->n = (size_t)(2 * B + r);
                const double e = tu_job_shape_error(model, d, devices[dv], B, 0.05, false, false);
                CHECK(e <= 1e-5, "%s: %zu samples, batch %d, %d ranks x [%s]: parameters %.3g from one "
                      "device (> 1e-5)", model, d->n, B, size, devices[dv], e);
                worst = e > worst ? e : worst;
            }
    if (rank == 0)
        printf("job shapes %-6s %d ranks x 1-2 devices, batch 1-5: worst parameter error %.3g\n", model,
               size, worst);
    d->n = 16;
    ch_dataset_free(d);
}

/* --accum-steps over ranks: micro-batches summed before one sync equal whole batches on one
 * device (lenet has no BatchNorm, so only float rounding parts them). */
static void test_accumulation(void)
{
    /* The batch of 10 (micro-batches of 0 to 2 samples on a rank) on 200 samples: its 60 steps of
     * 8 micro-batches on 600 took 25 s of the sanitizer pass. */
    static const struct { const char *devices; int batch, accum, samples; } cases[] = {
        { "cpu:0", 256, 4, 600 }, { "cpu:0,cpu:1", 100, 3, 600 }, { "cpu:0", 10, 8, 200 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ch_dataset *d = tu_synthetic((size_t)cases[i].samples, 28, 9);
        const double e = tu_accum_error("lenet", d, cases[i].devices, cases[i].batch, cases[i].accum, 0.05, false,
                                        false);
        ch_dataset_free(d);
        if (rank == 0)
            printf("accumulation lenet %d ranks x [%s], batch %d in %d micro-batches: parameters %.3g from "
                   "whole batches on one device\n", size, cases[i].devices, cases[i].batch, cases[i].accum, e);
        CHECK(e <= 1e-5, "--accum-steps %d, batch %d, %d ranks x [%s]: parameters %.3g from whole batches",
              cases[i].accum, cases[i].batch, size, cases[i].devices, e);
    }
}

/* --shares: rank r takes a part of every batch in proportion to its share, each slice still weighted
 * by its count, so the parameters equal one process's (lenet: float rounding only). With rank 1 made
 * slower (COHORT_INJECT_FAULT=slow:1:US sleeps US microseconds per sample), auto moves samples to
 * the other ranks at the first epoch's end, and the parameters still equal one process's. */
static void test_shares(void)
{
    ch_dataset *d = tu_synthetic(600, 28, 11);
    char given[64] = "", after[256];
    for (int r = 0; r < size; r++)
        snprintf(given + strlen(given), sizeof given - strlen(given), "%s%d", r ? "," : "", r % 2 ? 1 : 3);
    static const char *const devices[] = { "cpu:0", "cpu:0,cpu:1" };
    /* Rank r's part of the 600 samples: 600 w_r / sum w, to within a sample per device and step. */
    int total = 0;
    for (int r = 0; r < size; r++) total += r % 2 ? 1 : 3;
    const double expect = 600.0 * (rank % 2 ? 1 : 3) / total;
    for (int i = 0; i < 2; i++) {
        size_t mine = 0;
        const double e = tu_shares_error("lenet", d, devices[i], 64, given, 1, after, sizeof after, &mine);
        CHECK(fabs((double)mine - expect) <= 10.0 * (i + 1), "--shares %s, [%s]: rank %d trains on %zu of 600 samples, "
              "expected about %.0f", given, devices[i], rank, mine, expect);
        if (rank == 0)
            printf("shares %s lenet %d ranks x [%s], batch 64: parameters %.3g from one device\n", given, size,
                   devices[i], e);
        CHECK(e <= 1e-5, "--shares %s, %d ranks x [%s]: parameters %.3g from one device", given, size, devices[i], e);
        CHECK(strcmp(after, given) == 0, "--shares %s: the trainer reports %s", given, after);
    }
    /* 25 ms per sample: rank 1 is several times slower than any rank's compute, also on the scramble
     * backend, under ASan, and with other tests sharing the two cores. Lenet's compute is ~4 ms a
     * sample under ASan alone, and a sleeper gets the cores back first when it wakes, so under load
     * the rank that only computes is the one held up: at 0.4 ms, and again at 4 ms, a CI run under
     * such load measured the ranks within 5% and kept 1000,1000 (under ASan beside four spinning
     * processes, 4 ms gave 1167,833; 25 ms gave 1611,389). The sleep leaves the cores to the other
     * tests, so it costs CI seconds of wall time only (~8 s at 2 ranks). */
    setenv("COHORT_INJECT_FAULT", "slow:1:25000", 1);
    const double e = tu_shares_error("lenet", d, "cpu:0", 64, "auto", 2, after, sizeof after, NULL);
    unsetenv("COHORT_INJECT_FAULT");
    long w[2] = { 0, 0 };
    CHECK(sscanf(after, "%ld,%ld", &w[0], &w[1]) == 2, "--shares auto reports '%s'", after);
    if (rank == 0)
        printf("shares auto lenet %d ranks, rank 1 slowed: shares %s after an epoch; parameters %.3g from one "
               "device\n", size, after, e);
    CHECK(e <= 1e-5, "--shares auto: parameters %.3g from one device", e);
    CHECK(w[1] * 3 < w[0] * 2, "--shares auto with rank 1 slowed: shares %s (rank 1 should take less)", after);
    ch_dataset_free(d);
}

/* Through the library (no CLI flag comparison in front): ranks whose --shares, --accum-steps or
 * --zero differ are refused at set-up on every rank, naming the setting, before any step could cut the
 * batches differently. */
static void test_settings_disagree(void)
{
    ch_dataset *d = tu_synthetic(64, 28, 5);
    char shares[64] = "";
    for (int r = 0; r < size; r++)   /* rank 1: 1,1,...; the others: 2,2,... */
        snprintf(shares + strlen(shares), sizeof shares - strlen(shares), "%s%d", r ? "," : "", rank == 1 ? 1 : 2);
    for (int which = 0; which < 3; which++) {
        ch_train_config cfg = ch_train_config_default();
        cfg.model = "lenet";
        cfg.batch_size = 16;
        cfg.timeout_s = 60;
        if (which == 0) cfg.shares = shares;
        else if (which == 1) cfg.accum_steps = rank == 1 ? 2 : 1;
        else cfg.zero = rank == 1;   /* a sharded rank would wait for shards the others never send */
        const char *name = which == 0 ? "--shares" : which == 1 ? "--accum-steps" : "--zero";
        ch_trainer *t = NULL;
        ch_err err;
        const ch_status st = ch_trainer_create(&cfg, d, NULL, &t, &err);
        CHECK(st == CH_STATUS_BAD_INPUT && strstr(err.msg, name), "ranks given different %s: status %d, '%s'", name,
              (int)st, st == CH_STATUS_OK ? "" : err.msg);
        ch_trainer_free(t);
    }
    ch_dataset_free(d);
}

/* A value other than the default for row o, one the library takes on its own. */
static void perturb(const ch_opt *o, ch_train_config *c)
{
    static const struct { const char *name, *value; } strings[] = {
        { "init", "normal:0.01" }, { "optimizer", "adam" }, { "schedule", "cosine" }, { "milestones", "5" },
        { "normalize", "0.5/0.5" }, { "shares", "1,2,3,4" }, { "grad-compress", "bf16" }, { "ps-mode", "sync" },
        { "checkpoint-dir", "agree-ck" }, { "trace", "agree-trace.json" },
    };
    void *f = (char *)c + o->offset;
    const ch_train_config def = ch_train_config_default();
    switch (o->type) {
    case CH_OPT_INT: {
        const int d = *(const int *)(const void *)((const char *)&def + o->offset);
        *(int *)f = d != (int)o->lo ? (int)o->lo : (int)o->lo + 1;
        break;
    }
    case CH_OPT_DOUBLE: {
        const double d = *(const double *)(const void *)((const char *)&def + o->offset);
        *(double *)f = d != o->lo ? o->lo : (o->lo + (o->hi < 1 ? o->hi : 1)) / 2;
        break;
    }
    case CH_OPT_U64: *(uint64_t *)f += 1; break;
    case CH_OPT_CHOICE: *(int *)f = 1; break;
    case CH_OPT_FLAG: *(bool *)f = true; break;
    default:
        if (strcmp(o->name, "betas") == 0) {
            c->beta1 = 0.5;
            c->beta2 = 0.6;
        }
        for (size_t i = 0; i < sizeof strings / sizeof *strings; i++)
            if (strcmp(o->name, strings[i].name) == 0) *(const char **)f = strings[i].value;
    }
}

/* Every setting the option table marks as one the ranks share (train/options.h), each changed on
 * rank 1 alone: refused at set-up on every rank, naming the flag, through the library alone (no
 * command line compares flags in front of it). A row whose change the library refuses by itself
 * on rank 1 (a setting that needs another) is refused as well, and counted apart. */
static void test_every_shared_setting_disagrees(void)
{
    ch_dataset *d = tu_synthetic(64, 28, 5);
    int n, named = 0, alone = 0;
    const ch_opt *o = ch_opt_table(&n);
    for (int i = 0; i < n; i++) {
        if (!(o[i].cmds & CH_CMD_TRAIN) || o[i].where != CH_IN_CFG ||
            (o[i].agree != CH_AGREE_VALUE && o[i].agree != CH_AGREE_GIVEN))
            continue;
        ch_train_config cfg = ch_train_config_default();
        cfg.model = "lenet";
        cfg.batch_size = 16;
        cfg.timeout_s = 60;
        if (rank == 1) perturb(&o[i], &cfg);
        ch_trainer *t = NULL;
        ch_err err;
        const ch_status st = ch_trainer_create(&cfg, d, NULL, &t, &err);
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", o[i].name);
        CHECK(st == CH_STATUS_BAD_INPUT, "ranks given different %s: status %d, '%s'", flag, (int)st,
              st == CH_STATUS_OK ? "" : err.msg);
        const bool says = strstr(err.msg, "disagree") && strstr(err.msg, flag);
        int both[2] = { says, !says && strstr(err.msg, "set-up: rank 1 of 2") != NULL };
        MPI_Allreduce(MPI_IN_PLACE, both, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (both[0]) named++;
        else alone++;
        if (!both[0] && rank == 0) printf("test_mpi: %s changed on rank 1 alone is refused there: %s\n", flag, err.msg);
        ch_trainer_free(t);
    }
    ch_dataset_free(d);
    if (rank == 0) printf("test_mpi: %d shared settings refused by name, %d refused on rank 1 alone\n", named, alone);
    CHECK(named >= 30 && alone <= 1, "only %d of the option table's shared settings were refused by name", named);
}

int main(int argc, char **argv)
{
    ch_err err;
    if (ch_world_init(&argc, &argv, &err) != CH_STATUS_OK) {
        fprintf(stderr, "test_mpi: %s\n", err.msg);
        return 1;
    }
    tu_take_backend(&argc, argv);   /* --backend=lazy: ctest's mpi_equivalence_np2_lazy */
    /* --epoch-only: the multi-host test, where each exchange crosses a (namespaced) network. */
    const bool epoch_only = argc == 3 && strcmp(argv[1], "--epoch-only") == 0;
    if (argc != 2 && !epoch_only) {
        fprintf(stderr, "usage: mpirun -np N test_mpi [--backend=NAME] [--epoch-only] DATA_ROOT\n");
        return 2;
    }
    if (!getenv("OMPI_COMM_WORLD_SIZE")) {
        fprintf(stderr, "test_mpi: run me under mpirun\n");
        return 2;
    }
    rank = ch_world_rank();
    size = ch_world_size();
    /* With one rank, a job of cpu:0 is the reference itself: those checks need 2 ranks or more.
     * One rank still runs the 2-device gradient, the job shapes and the epoch (mpirun's world of
     * one against local_only). */
#ifdef CH_REAL_DOUBLE
    /* test_mpi_f64: resnet18 with sync-BN over the ranks, in double. In float its 2x2 planes meet
     * pre-activations within rounding of zero, and oneDNN picks its GEMM and Winograd kernels by
     * the batch it is given, so a slice of 3 and a batch of 9 can flip one ReLU mask and move every
     * gradient by ~0.5% (seen at 4 ranks on an AVX-512 Zen 5: 5.0e-3; 1.5e-5 with im2col): the
     * check measured the hardware. In double it is exact to ~1e-12, and a missing sync-BN
     * exchange is off by > 1e-3. */
    if (size > 1) test_gradient("resnet18", "cpu:0", 9, 12, 1e-9);
    if (rank == 0) printf("test_mpi_f64: %d ranks: all checks passed\n", size);
    ch_world_finalize();
    return 0;
#endif
    if (!epoch_only && size > 1) {
        test_gradient("lenet", "cpu:0", 13, 28, 1e-5);
        test_gradient("mnist-cnn", "cpu:0", 11, 28, 1e-5);
    }
    test_gradient("lenet", "cpu:0,cpu:1", 13, 28, 1e-5);
    if (!epoch_only) {
        test_job_shapes("linear");
        test_job_shapes("lenet");
        test_accumulation();
        if (size > 1) {
            test_shares();
            test_settings_disagree();
            test_every_shared_setting_disagrees();
        }
    }
    test_epoch(argv[argc - 1]);
    if (rank == 0) printf("test_mpi: %d ranks: all checks passed\n", size);
    ch_world_finalize();
    return 0;
}
