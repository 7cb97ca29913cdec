/* cohort bench allreduce: nccl-tests style table (size, count, time, algbw, busbw) for the local
 * communicator with D member threads, or, under mpirun, for the communicator training uses between
 * ranks (D threads per rank: local reduce, MPI_Iallreduce across ranks, local broadcast; with one
 * device per rank, MPI alone). Every size's result is checked against the serial sum first.
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

typedef struct ar_member {
    ch_comm comm;
    ch_hier hier;
    size_t max_count, min_count;
    ch_real *buf;
    int ok;              /* out: every check passed */
} ar_member;

static ch_real fill_value(int rank, size_t i) { return (ch_real)(rank + 1) + (ch_real)(i % 13); }

/* One size: a checked call, then timed calls on zeros (so sums stay finite). Rank 0 prints. */
static int run_size(ar_member *m, size_t count)
{
    ch_err err;
    const int d = m->comm.size;
    for (size_t i = 0; i < count; i++) m->buf[i] = fill_value(m->comm.rank, i);
    if (ch_comm_allreduce_sum(&m->comm, m->buf, count, &err) != CH_STATUS_OK) return 0;
    for (size_t i = 0; i < count; i++) {
        ch_real s = fill_value(0, i);
        for (int r = 1; r < d; r++) s += fill_value(r, i);
        if (m->buf[i] != s) return 0;
    }
    memset(m->buf, 0, sizeof(ch_real) * count);
    const size_t bytes = count * sizeof(ch_real);
    int iters = (int)((256u << 20) / (bytes ? bytes : 1));
    iters = iters < 5 ? 5 : (iters > 1000 ? 1000 : iters);
    for (int it = 0; it < 3; it++)     /* warm-up: caches, page faults, threads awake */
        if (ch_comm_allreduce_sum(&m->comm, m->buf, count, &err) != CH_STATUS_OK) return 0;
    if (ch_comm_barrier(&m->comm, &err) != CH_STATUS_OK) return 0;
    const double t0 = ch_clock_s();
    for (int it = 0; it < iters; it++)
        if (ch_comm_allreduce_sum(&m->comm, m->buf, count, &err) != CH_STATUS_OK) return 0;
    const double t = (ch_clock_s() - t0) / iters;
    if (m->comm.rank == 0) {
        const double algbw = bytes / t / 1e9;
        printf("%12zu %12zu %10.1f %8.2f %8.2f %6s\n", bytes, count, t * 1e6, algbw,
               algbw * 2.0 * (d - 1) / d, "ok");
        fflush(stdout);
    }
    return 1;
}

static void *run_member(void *arg)
{
    ar_member *m = arg;
    m->ok = 1;
    for (size_t c = m->min_count; c <= m->max_count && m->ok; c *= 2) m->ok = run_size(m, c);
    if (!m->ok) ch_comm_abort(&m->comm, "allreduce result differs from the serial sum");
    return NULL;
}

int ch_cmd_bench_allreduce(int argc, char **argv)
{
    static const struct option opts[] = {
        { "devices", required_argument, NULL, 'd' }, { "min-bytes", required_argument, NULL, 'm' },
        { "max-bytes", required_argument, NULL, 'M' }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    long devices = ch_world_size() > 1 ? 1 : 2, min_b = 8, max_b = 256l << 20;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (c == 'h') {
            puts("usage: cohort bench allreduce [--devices LIST|D] [--min-bytes B] [--max-bytes B]\n"
                 "(see cohort bench --help)");
            return CH_EXIT_OK;
        }
        if (c == '?' || c == ':') {
            fprintf(stderr, "cohort bench allreduce: unknown or incomplete option\n");
            return CH_EXIT_USAGE;
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
        const char *f = c == 'd' ? "devices" : c == 'm' ? "min-bytes" : "max-bytes";
        long *dst = c == 'd' ? &devices : c == 'm' ? &min_b : &max_b;
        if (!ch_arg_int("bench allreduce", f, optarg, c == 'd' ? 1 : 4, c == 'd' ? 64 : 1l << 32, dst))
            return CH_EXIT_USAGE;
    }
    ch_local_group *g;
    ch_err err;
    ch_mpi_group *mg = NULL;
    ch_comm mpi;
    const int ranks = ch_world_size();
    if (ranks > 1) {
        if (ch_mpi_group_create(300, &mg, &err) != CH_STATUS_OK) return ch_exit_for("bench allreduce", CH_STATUS_SYSTEM, &err);
        ch_mpi_comm_init(&mpi, mg);
    }
    if (ch_local_group_create((int)devices, &g, &err) != CH_STATUS_OK)
        return ch_exit_for("bench allreduce", CH_STATUS_BAD_INPUT, &err);
    ar_member *ms = calloc((size_t)devices, sizeof *ms);
    pthread_t *th = calloc((size_t)devices, sizeof *th);
    int rc = CH_EXIT_OK;
    if (ch_world_rank() == 0) {
        if (ranks > 1)
            printf("# allreduce (sum, %s) between ranks: %d ranks x %ld devices (%s), %ld members\n",
                   CH_REAL_NAME, ranks, devices,
                   devices > 1 ? "local reduce, MPI_Iallreduce, local broadcast" : "MPI_Iallreduce",
                   ranks * devices);
        else
            printf("# local allreduce (sum, %s), %ld members\n", CH_REAL_NAME, devices);
        printf("%12s %12s %10s %8s %8s %6s\n", "size(B)", "count", "time(us)", "algbw", "busbw", "check");
    }
    long started = 0;
    for (long r = 0; ms && th && r < devices; r++, started++) {
        ch_hier_comm_init(&ms[r].comm, &ms[r].hier, g, (int)r, ranks > 1 ? &mpi : NULL);
        ms[r].min_count = (size_t)min_b / sizeof(ch_real);
        ms[r].max_count = (size_t)max_b / sizeof(ch_real);
        if (ms[r].min_count == 0) ms[r].min_count = 1;
        ms[r].buf = malloc(sizeof(ch_real) * ms[r].max_count);
        if (!ms[r].buf || pthread_create(&th[r], NULL, run_member, &ms[r]) != 0) {
            /* Release the members already waiting for this one, then join them below. */
            ch_comm_abort(&ms[r].comm, "could not start");
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
    ch_mpi_group_free(mg);
    if (rc != CH_EXIT_OK && ranks > 1) ch_world_abort(rc);
    return rc;
}
