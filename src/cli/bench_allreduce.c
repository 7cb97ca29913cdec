/* cohort bench allreduce: nccl-tests style table (size, count, time, algbw, busbw) for the local
 * communicator with D member threads, or, under mpirun, for the communicator training uses between
 * ranks (D threads per rank: local reduce, MPI_Iallreduce across ranks, local broadcast; with one
 * device per rank, MPI alone). Every size's result is checked against the serial sum first.
 * --compress bf16 times the compressed exchange (--grad-compress) next to fp32 at every size.
 * busbw = algbw * 2 (R - 1) / R for R members in all, the nccl-tests definition. */
#include <ctype.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "comm/mpi.h"
#include "comm/world.h"
#include "core/clock.h"
#include "core/real.h"

typedef struct ar_member {
    ch_comm comm, ccomm;    /* fp32; and, with --compress, the compressed communicator */
    ch_hier hier, chier;
    bool compressed;
    size_t max_count, min_count;
    int max_iters;       /* timed calls per size at most (--iters) */
    ch_real *buf;
    int ok;              /* out: every check passed */
} ar_member;

/* Small whole numbers: their sums are exact in fp32 and in bf16 (below 256), so a compressed sum
 * must equal the serial sum too. */
static ch_real fill_value(int rank, size_t i) { return (ch_real)(rank + 1) + (ch_real)(i % 13); }

/* One communicator at one size: a checked call, then timed calls on zeros (so sums stay finite):
 * 256 MiB worth, between 5 and max_iters of them. *t: seconds per call. */
static int time_sum(ch_comm *c, ch_real *buf, size_t count, int max_iters, double *t)
{
    ch_err err;
    const int d = c->size;
    for (size_t i = 0; i < count; i++) buf[i] = fill_value(c->rank, i);
    c->at = 0;
    if (ch_comm_allreduce_sum(c, buf, count, &err) != CH_STATUS_OK) return 0;
    for (size_t i = 0; i < count; i++) {
        ch_real s = fill_value(0, i);
        for (int r = 1; r < d; r++) s += fill_value(r, i);
        if (buf[i] != s) return 0;
    }
    memset(buf, 0, sizeof(ch_real) * count);
    const size_t bytes = count * sizeof(ch_real);
    int iters = (int)((256u << 20) / (bytes ? bytes : 1));
    iters = iters > max_iters ? max_iters : iters;
    iters = iters < 5 ? 5 : iters;
    for (int it = 0; it < 3; it++)     /* warm-up: caches, page faults, threads awake */
        if (ch_comm_allreduce_sum(c, buf, count, &err) != CH_STATUS_OK) return 0;
    if (ch_comm_barrier(c, &err) != CH_STATUS_OK) return 0;
    const double t0 = ch_clock_s();
    for (int it = 0; it < iters; it++)
        if (ch_comm_allreduce_sum(c, buf, count, &err) != CH_STATUS_OK) return 0;
    *t = (ch_clock_s() - t0) / iters;
    return 1;
}

/* One size: fp32, then (--compress) the compressed sum of the same fp32 values. algbw counts fp32
 * bytes either way, so the two columns compare what a step waits for. Rank 0 prints. */
static int run_size(ar_member *m, size_t count)
{
    double t = 0, tc = 0;
    if (!time_sum(&m->comm, m->buf, count, m->max_iters, &t)) return 0;
    if (m->compressed && !time_sum(&m->ccomm, m->buf, count, m->max_iters, &tc)) return 0;
    if (m->comm.rank == 0) {
        const int d = m->comm.size;
        const size_t bytes = count * sizeof(ch_real);
        const double algbw = bytes / t / 1e9;
        printf("%12zu %12zu %10.1f %8.2f %8.2f", bytes, count, t * 1e6, algbw, algbw * 2.0 * (d - 1) / d);
        if (m->compressed) printf(" %10.1f %8.2f %7.2fx", tc * 1e6, bytes / tc / 1e9, t / tc);
        printf(" %6s\n", "ok");
        fflush(stdout);
    }
    return 1;
}

static void *run_member(void *arg)
{
    ar_member *m = arg;
    m->ok = 1;
    for (size_t c = m->min_count; c <= m->max_count && m->ok; c *= 2) m->ok = run_size(m, c);
    if (!m->ok) {
        ch_comm_abort(&m->comm, "allreduce result differs from the serial sum");
        if (m->compressed) ch_comm_abort(&m->ccomm, "allreduce result differs from the serial sum");
    }
    return NULL;
}

static void print_header(long devices, ch_grad_compress how)
{
    const int ranks = ch_world_size();
    if (ranks > 1)
        printf("# allreduce (sum, %s) between ranks: %d ranks x %ld devices (%s), %ld members\n", CH_REAL_NAME,
               ranks, devices, devices > 1 ? "local reduce, MPI_Iallreduce, local broadcast" : "MPI_Iallreduce",
               ranks * devices);
    else
        printf("# local allreduce (sum, %s), %ld members\n", CH_REAL_NAME, devices);
    if (how != CH_COMPRESS_NONE)
        printf("# then --compress %s: bf16 between ranks (reduce-scatter and allgather by MPI_Isend/MPI_Irecv, "
               "fp32 sums); its algbw counts fp32 bytes, speedup is fp32 time / %s time\n",
               ch_grad_compress_name(how), ch_grad_compress_name(how));
    printf("%12s %12s %10s %8s %8s", "size(B)", "count", "time(us)", "algbw", "busbw");
    if (how != CH_COMPRESS_NONE) printf(" %10s %8s %8s", "bf16(us)", "algbw", "speedup");
    printf(" %6s\n", "check");
}

/* The MPI groups: one fp32; with compression a second one, compressed (feedback over max_count). */
static int make_mpi_groups(ch_grad_compress how, size_t max_count, ch_mpi_group **mg, ch_mpi_group **mgc, ch_err *err)
{
    *mg = *mgc = NULL;
    if (ch_world_size() == 1) return 1;
    if (ch_mpi_group_create(300, mg, err) != CH_STATUS_OK) return 0;
    if (how == CH_COMPRESS_NONE) return 1;
    return ch_mpi_group_create(300, mgc, err) == CH_STATUS_OK &&
           ch_mpi_group_set_compress(*mgc, how, max_count, err) == CH_STATUS_OK;
}

int ch_cmd_bench_allreduce(int argc, char **argv)
{
    static const struct option opts[] = {
        { "devices", required_argument, NULL, 'd' }, { "min-bytes", required_argument, NULL, 'm' },
        { "max-bytes", required_argument, NULL, 'M' }, { "compress", required_argument, NULL, 'c' },
        { "iters", required_argument, NULL, 'i' }, { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 },
    };
    long devices = ch_world_size() > 1 ? 1 : 2, min_b = 8, max_b = 256l << 20, iters = 1000;
    ch_grad_compress how = CH_COMPRESS_NONE;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            puts("usage: cohort bench allreduce [--devices LIST|D] [--min-bytes B] [--max-bytes B]\n"
                 "                              [--compress none|bf16|bf16-ef] [--iters N]\n"
                 "(see cohort bench --help)");
            return CH_EXIT_OK;
        }
        if (c == '?' || c == ':') {
            fprintf(stderr, "cohort bench allreduce: unknown or incomplete option\n");
            return CH_EXIT_USAGE;
        }
        if (c == 'c') {
            if (!ch_grad_compress_parse(optarg, &how)) {
                fprintf(stderr, "cohort bench allreduce: --compress '%s': expected none, bf16 or bf16-ef\n", optarg);
                return CH_EXIT_USAGE;
            }
            continue;
        }
        if (c == 'd' && !isdigit((unsigned char)optarg[0])) {
            /* The same device list as train's: one member thread per device. */
            ch_device_list l;
            ch_err err;
            if (ch_device_list_parse(optarg, &l, &err) != CH_STATUS_OK)
                return ch_exit_for("bench allreduce", CH_STATUS_BAD_INPUT, &err);
            devices = l.count;
            continue;
        }
        if (c == 'i') {
            if (!ch_arg_int("bench allreduce", "iters", optarg, 5, 1000000, &iters)) return CH_EXIT_USAGE;
            continue;
        }
        const char *f = c == 'd' ? "devices" : c == 'm' ? "min-bytes" : "max-bytes";
        long *dst = c == 'd' ? &devices : c == 'm' ? &min_b : &max_b;
        if (!ch_arg_int("bench allreduce", f, optarg, c == 'd' ? 1 : 4, c == 'd' ? 64 : 1l << 32, dst))
            return CH_EXIT_USAGE;
    }
    const int ranks = ch_world_size();
    if (how != CH_COMPRESS_NONE && ranks == 1) {
        fprintf(stderr, "cohort bench allreduce: --compress is between ranks: run under mpirun with 2 or more\n");
        return CH_EXIT_USAGE;
    }
    ch_local_group *g, *gc = NULL;
    ch_err err;
    ch_mpi_group *mg, *mgc;
    ch_comm mpi, mpic;
    if (!make_mpi_groups(how, (size_t)max_b / sizeof(ch_real), &mg, &mgc, &err)) {
        ch_mpi_group_free(mg);
        ch_mpi_group_free(mgc);
        return ch_exit_for("bench allreduce", CH_STATUS_SYSTEM, &err);
    }
    if (mg) ch_mpi_comm_init(&mpi, mg);
    if (mgc) ch_mpi_comm_init(&mpic, mgc);
    if (ch_local_group_create((int)devices, &g, &err) != CH_STATUS_OK ||
        (mgc && ch_local_group_create((int)devices, &gc, &err) != CH_STATUS_OK))
        return ch_exit_for("bench allreduce", CH_STATUS_BAD_INPUT, &err);
    ar_member *ms = calloc((size_t)devices, sizeof *ms);
    pthread_t *th = calloc((size_t)devices, sizeof *th);
    int rc = CH_EXIT_OK;
    if (ch_world_rank() == 0) print_header(devices, how);
    long started = 0;
    for (long r = 0; ms && th && r < devices; r++, started++) {
        ch_hier_comm_init(&ms[r].comm, &ms[r].hier, g, (int)r, mg ? &mpi : NULL);
        if (mgc) ch_hier_comm_init(&ms[r].ccomm, &ms[r].chier, gc, (int)r, &mpic);
        ms[r].compressed = mgc != NULL;
        ms[r].min_count = (size_t)min_b / sizeof(ch_real);
        ms[r].max_count = (size_t)max_b / sizeof(ch_real);
        ms[r].max_iters = (int)iters;
        if (ms[r].min_count == 0) ms[r].min_count = 1;
        ms[r].buf = malloc(sizeof(ch_real) * ms[r].max_count);
        if (!ms[r].buf || pthread_create(&th[r], NULL, run_member, &ms[r]) != 0) {
            /* Release the members already waiting for this one, then join them below. */
            ch_comm_abort(&ms[r].comm, "could not start");
            if (mgc) ch_comm_abort(&ms[r].ccomm, "could not start");
            free(ms[r].buf);
            rc = CH_EXIT_FAIL;
            break;
        }
    }
    for (long r = 0; r < started; r++) {
        pthread_join(th[r], NULL);
        if (!ms[r].ok) rc = CH_EXIT_FAIL;
        free(ms[r].buf);
    }
    if (!ms || !th) rc = CH_EXIT_FAIL;
    if (rc != CH_EXIT_OK) fprintf(stderr, "cohort bench allreduce: a member failed to start or a result differed from the serial sum\n");
    free(ms);
    free(th);
    ch_local_group_free(g);
    ch_local_group_free(gc);
    ch_mpi_group_free(mg);
    ch_mpi_group_free(mgc);
    if (rc != CH_EXIT_OK && ranks > 1) ch_world_abort(rc);
    return rc;
}
