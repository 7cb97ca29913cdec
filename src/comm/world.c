/* The process's place in the job. Under an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE, Slurm's
 * srun and other PMI launchers PMI_SIZE or PMIX_RANK) MPI is initialised and the process is one rank
 * of the job; started on its own it is rank 0 of 1 and MPI is never touched, so the same binary
 * runs both ways and a plain run pays nothing for MPI. */
#include "comm/world.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
     * reduce-scatter + allgather matches it at every size (measured: docs/PERFORMANCE.md) and gives
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
