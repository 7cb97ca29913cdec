/* The process's place in the job. Under an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE, Slurm's
 * srun and other PMI launchers PMI_SIZE or PMIX_RANK) MPI is initialised and the process is one rank
 * of the job; started on its own it is rank 0 of 1 and MPI is never touched, so the same binary
 * runs both ways and a plain run pays nothing for MPI. */
#include "comm/world.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/mpi.h"

#ifdef CH_HAVE_MPI
#include <mpi.h>
#endif

static struct {
    bool initialised, mpi;
    int rank, size, local_rank, local_size;
    char host[256];
    FILE *log;
} world = { .size = 1, .local_size = 1 };

static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;

void ch_world_lock(void) { pthread_mutex_lock(&mpi_lock); }
void ch_world_unlock(void) { pthread_mutex_unlock(&mpi_lock); }
bool ch_world_mpi(void) { return world.mpi; }

static bool launched_by_mpi(void)
{
    const char *force = getenv("COHORT_MPI");
    if (force && *force) return strcmp(force, "0") != 0;
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

static void read_host(void)
{
    if (gethostname(world.host, sizeof world.host) != 0) snprintf(world.host, sizeof world.host, "?");
    world.host[sizeof world.host - 1] = 0;
}

#ifdef CH_HAVE_MPI
static ch_status mpi_fail(ch_err *err, const char *call, int rc)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
    return ch_fail(err, CH_STATUS_SYSTEM, "%s failed: %s", call, text);
}

static ch_status init_mpi(int *argc, char ***argv, ch_err *err)
{
    /* Open MPI's nonblocking allreduce (libnbc) picks a binomial tree for few ranks, which runs
     * 25 MB gradient buckets at half the speed of the blocking MPI_Allreduce; Rabenseifner's
     * reduce-scatter + allgather matches it at every size (measured: docs/PERFORMANCE-HISTORY.md) and gives
     * every rank the same bits. The user's own setting wins. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
    int provided = 0, rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return ch_fail(err, CH_STATUS_SYSTEM, "MPI_Init_thread failed (code %d)", rc);
    world.mpi = true;
    /* Errors come back as codes, so that a failure is reported in cohort's words. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_SERIALIZED)
        return ch_fail(err, CH_STATUS_SYSTEM,
                       "this MPI gives thread level %d, cohort needs MPI_THREAD_SERIALIZED", provided);
    if ((rc = MPI_Comm_rank(MPI_COMM_WORLD, &world.rank)) != MPI_SUCCESS) return mpi_fail(err, "MPI_Comm_rank", rc);
    if ((rc = MPI_Comm_size(MPI_COMM_WORLD, &world.size)) != MPI_SUCCESS) return mpi_fail(err, "MPI_Comm_size", rc);
    /* The ranks sharing this host's memory: the local rank, as torchrun's LOCAL_RANK. */
    MPI_Comm node;
    rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world.rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) return mpi_fail(err, "MPI_Comm_split_type", rc);
    MPI_Comm_rank(node, &world.local_rank);
    MPI_Comm_size(node, &world.local_size);
    MPI_Comm_free(&node);
    return CH_STATUS_OK;
}
#endif

ch_status ch_world_init(int *argc, char ***argv, ch_err *err)
{
    if (world.initialised) return CH_STATUS_OK;
    world.initialised = true;
    read_host();
    if (!launched_by_mpi()) return CH_STATUS_OK;
#ifdef CH_HAVE_MPI
    return init_mpi(argc, argv, err);
#else
    (void)argc;
    (void)argv;
    return ch_fail(err, CH_STATUS_BAD_INPUT,
                   "started by an MPI launcher, but this cohort was built without MPI "
                   "(install libopenmpi-dev and rebuild)");
#endif
}

int ch_world_rank(void) { return world.rank; }
int ch_world_size(void) { return world.size; }
int ch_world_local_rank(void) { return world.local_rank; }
int ch_world_local_size(void) { return world.local_size; }

const char *ch_world_host(void)
{
    if (!world.host[0]) read_host();
    return world.host;
}

void ch_world_set_log(FILE *log) { world.log = log; }

void ch_world_log(const char *line)
{
    if (!world.log) return;
    fprintf(world.log, "%s\n", line);
    fflush(world.log);
}

CH_NORETURN void ch_world_abort(int code)
{
    fflush(stdout);
    fflush(stderr);
    if (world.log) fflush(world.log);
#ifdef CH_HAVE_MPI
    if (world.mpi) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
#endif
    _exit(code);
}

_Noreturn void ch_world_fatal(int code, const char *msg) { ch_world_fatal_as("cohort", code, msg); }

_Noreturn void ch_world_fatal_as(const char *who, int code, const char *msg)
{
    char line[1024];
    snprintf(line, sizeof line, "%s: rank %d of %d (%s): %s", who, world.rank, world.size,
             ch_world_host(), msg);
    fprintf(stderr, "%s\n", line);
    ch_world_log(line);
    ch_world_abort(code);
}

CH_NORETURN void ch_world_exit(int code)
{
    fflush(stdout);
    fflush(stderr);
    if (world.log) fflush(world.log);
    ch_world_finalize();
    exit(code);
}

void ch_world_finalize(void)
{
#ifdef CH_HAVE_MPI
    if (world.mpi) {
        int done = 0;
        MPI_Finalized(&done);
        if (!done) MPI_Finalize();
    }
#endif
    world.mpi = false;
}

/* ---- agreement ----------------------------------------------------------------------------- */

enum { AGREE_SLOTS = 64 };

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return (h ^ 0xff) * 0x100000001b3ull;   /* a terminator, so "ab"+"c" differs from "a"+"bc" */
}

/* Slot i < 62: setting i's name and value; slot 62: every setting past 61; slot 63: the count. */
static void agree_slots(const char *const *names, const char *const *values, int n, uint64_t *h)
{
    for (int i = 0; i < AGREE_SLOTS; i++) h[i] = 0;
    h[AGREE_SLOTS - 1] = (uint64_t)n;
    for (int i = 0; i < n; i++) {
        const int slot = i < AGREE_SLOTS - 2 ? i : AGREE_SLOTS - 2;
        h[slot] = fnv1a(fnv1a(h[slot] ^ 0xcbf29ce484222325ull, names[i]), values[i]);
    }
}

/* The first slot where some rank differs from rank 0, and which ranks (-1: none). */
static int first_disagreement(const uint64_t *all, int P, char *ranks, size_t len)
{
    for (int i = 0; i < AGREE_SLOTS - 1; i++) {
        int named = 0, more = 0;
        ranks[0] = 0;
        for (int r = 1; r < P; r++) {
            if (all[(size_t)r * AGREE_SLOTS + i] == all[i]) continue;
            if (named < 3) {
                const size_t at = strlen(ranks);
                snprintf(ranks + at, len - at, "%s%d", named ? ", " : "", r);
                named++;
            } else {
                more++;
            }
        }
        if (more) {
            const size_t at = strlen(ranks);
            snprintf(ranks + at, len - at, " and %d more", more);
        }
        if (named) return i;
    }
    return -1;
}

ch_status ch_world_agree(const char *what, const char *const *names, const char *const *values, int n,
                         double timeout_s, ch_err *err)
{
    if (world.size == 1 || !world.mpi) return CH_STATUS_OK;
    uint64_t mine[AGREE_SLOTS];
    agree_slots(names, values, n, mine);
    uint64_t *all = malloc(sizeof(uint64_t) * AGREE_SLOTS * (size_t)world.size);
    if (!all) return ch_fail(err, CH_STATUS_SYSTEM, "%s: allocation of %d ranks' settings failed", what, world.size);
    ch_status st = ch_mpi_world_allgather_u64(mine, AGREE_SLOTS, all, timeout_s, what, err);
    char ranks[96];
    const int i = st == CH_STATUS_OK ? first_disagreement(all, world.size, ranks, sizeof ranks) : -1;
    /* Who says it: rank 0 if it has setting i (its count is past i), else the first rank that
     * differs from it there, which does. */
    int speaker = 0;
    for (int r = 1; i >= 0 && all[AGREE_SLOTS - 1] <= (uint64_t)i && r < world.size; r++)
        if (all[(size_t)r * AGREE_SLOTS + i] != all[i]) {
            speaker = r;
            break;
        }
    free(all);
    if (i < 0) return st;
    const bool plural = strchr(ranks, ',') || strstr(ranks, "more");
    const char *name = i < n ? names[i] : "the number of settings";
    const char *value = i < n ? values[i] : "";
    st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: rank%s %s disagree%s with rank 0 on %s (rank %d has '%.200s'): "
                 "every rank needs the same", what, plural ? "s" : "", ranks, plural ? "" : "s", name,
                 world.rank, value);
    err->on_every_rank = true;
    err->speaks = world.rank == speaker;
    return st;
}

/* An exchange of the verdicts that did not finish: a rank that had failed keeps its own failure,
 * the others take the exchange's. */
static ch_status exchange_failed(ch_status st, ch_status got, const ch_err *e2, ch_err *err)
{
    if (st != CH_STATUS_OK) return st;
    *err = *e2;
    return got;
}

/* A verdict as another rank sent it; anything else than a failure status reads as bad input. */
static ch_status failure_of(uint64_t v)
{
    return v >= CH_STATUS_BAD_INPUT && v <= CH_STATUS_NUMERIC ? (ch_status)v : CH_STATUS_BAD_INPUT;
}

/* Some ranks failed (st: this rank's verdict; theirs: the first failing rank's): that rank's line,
 * with its rank and host, reaches every rank (a second exchange, which every rank knows to make),
 * so that rank 0 can say it and the job can end cleanly. When the failing rank and an accepting one
 * each called MPI_Abort, whichever came first killed the job, and CI once lost the failing rank's
 * line so. */
static ch_status share_first_failure(const char *what, int first, int failed, ch_status st, ch_status theirs,
                                     double timeout_s, ch_err *err)
{
    enum { LINE_WORDS = 64 };
    uint64_t line[LINE_WORDS] = { 0 };
    if (world.rank == first)
        snprintf((char *)line, sizeof line, "rank %d of %d (%.64s): %.400s", world.rank, world.size, ch_world_host(),
                 err->msg);
    uint64_t *all = malloc(sizeof line * (size_t)world.size);
    if (!all) return ch_fail(err, CH_STATUS_SYSTEM, "%s: allocation of %d ranks' lines failed", what, world.size);
    ch_err e2;
    const ch_status got = ch_mpi_world_allgather_u64(line, LINE_WORDS, all, timeout_s, what, &e2);
    if (got != CH_STATUS_OK) {
        free(all);
        return exchange_failed(st, got, &e2, err);
    }
    char *said = (char *)(all + (size_t)first * LINE_WORDS);
    said[sizeof line - 1] = '\0';
    char more[32] = "";
    if (failed > 1) snprintf(more, sizeof more, " (and %d more)", failed - 1);
    ch_fail(err, st != CH_STATUS_OK ? st : theirs, "%s: %s%s", what, said, more);
    free(all);
    err->on_every_rank = true;
    err->speaks = world.rank == 0;
    return st != CH_STATUS_OK ? st : theirs;
}

ch_status ch_world_fail_together(const char *what, ch_status st, double timeout_s, ch_err *err)
{
    if (world.size == 1 || !world.mpi) return st;
    const uint64_t mine[1] = { (uint64_t)st };
    uint64_t *all = malloc(sizeof(uint64_t) * (size_t)world.size);
    if (!all) return ch_fail(err, CH_STATUS_SYSTEM, "%s: allocation of %d ranks' verdicts failed", what, world.size);
    ch_err e2;
    const ch_status got = ch_mpi_world_allgather_u64(mine, 1, all, timeout_s, what, &e2);
    int failed = 0, first = -1;
    for (int r = 0; got == CH_STATUS_OK && r < world.size; r++)
        if (all[r]) {
            failed++;
            if (first < 0) first = r;
        }
    const ch_status theirs = first >= 0 ? failure_of(all[first]) : CH_STATUS_OK;
    free(all);
    if (got != CH_STATUS_OK) return exchange_failed(st, got, &e2, err);
    if (failed == world.size) {
        err->on_every_rank = true;
        err->speaks = world.rank == 0;
        return st;
    }
    if (failed == 0) return st;
    return share_first_failure(what, first, failed, st, theirs, timeout_s, err);
}
