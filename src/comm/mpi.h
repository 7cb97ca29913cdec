/* The MPI back end of ch_comm: one group per MPI_Comm_dup of MPI_COMM_WORLD, one member per
 * process. Only usable once ch_world_init found an MPI launcher (ch_world_mpi()). Built when CMake
 * finds MPI; without it the functions below fail cleanly (no group can be made). */
#ifndef CH_COMM_MPI_H
#define CH_COMM_MPI_H

#include <stdint.h>

#include "comm/comm.h"

typedef struct ch_mpi_group ch_mpi_group;

#ifdef CH_HAVE_MPI
/* A new communicator over all ranks. Collective: every rank calls it, in the same order.
 * timeout_s: how long any one collective may take before the job is ended (see mpi.c). */
ch_status ch_mpi_group_create(double timeout_s, ch_mpi_group **out, ch_err *err);
/* Fill this process's handle (rank and size are the MPI ones). */
void ch_mpi_comm_init(ch_comm *c, ch_mpi_group *g);
void ch_mpi_group_free(ch_mpi_group *g);
/* all (count x ranks) <- every rank's mine (count), in rank order, over MPI_COMM_WORLD. Polled like
 * every collective here: after timeout_s the job ends, naming what. */
ch_status ch_mpi_world_allgather_u64(const uint64_t *mine, int count, uint64_t *all, double timeout_s,
                                     const char *what, ch_err *err);
#else
static inline ch_status ch_mpi_group_create(double timeout_s, ch_mpi_group **out, ch_err *err)
{
    (void)timeout_s;
    *out = NULL;
    return ch_fail(err, CH_STATUS_SYSTEM, "cohort was built without MPI");
}
static inline void ch_mpi_comm_init(ch_comm *c, ch_mpi_group *g) { (void)c; (void)g; }
static inline void ch_mpi_group_free(ch_mpi_group *g) { (void)g; }
static inline ch_status ch_mpi_world_allgather_u64(const uint64_t *mine, int count, uint64_t *all,
                                                   double timeout_s, const char *what, ch_err *err)
{
    (void)mine; (void)count; (void)all; (void)timeout_s; (void)what;
    return ch_fail(err, CH_STATUS_SYSTEM, "cohort was built without MPI");
}
#endif

#endif
