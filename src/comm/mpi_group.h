/* Inside the MPI communicator (mpi.c) and its compressed sums (mpi_bf16.c): the group's state and
 * the pieces both need. Not part of the communicator's interface (comm/mpi.h). */
#ifndef CH_COMM_MPI_GROUP_H
#define CH_COMM_MPI_GROUP_H

#include <mpi.h>
#include <stdatomic.h>

#include "comm/mpi.h"

struct ch_mpi_group {
    MPI_Comm comm;
    double timeout_s;
    atomic_int aborted;
    char why[256];
    ch_grad_compress compress;
    /* Error feedback (CH_COMPRESS_BF16_EF): what rounding took from each element of the flat
     * buffer the sums are cut from (ch_comm.at indexes them), added back at the next sum: the
     * rank's own contribution (sent) and, for the chunk this rank sums, the rounded total (summed). */
    float *fb_sent, *fb_summed;
    size_t fb_n;
    int tag;              /* the next compressed sum's tag pair (every rank starts sums in one order) */
};

/* One line naming the MPI call that failed and MPI's own words. */
ch_status ch_mpi_fail(ch_err *err, const char *call, int rc);
/* A test found the exchange unfinished: fail when the group was aborted, and past the timeout
 * (checked when check_clock) end the job naming what was exchanged. */
ch_status ch_mpi_still_waiting(struct ch_mpi_group *g, const char *what, const char *call, double t0,
                               bool check_clock, ch_err *err);

/* A compressed sum in flight (mpi_bf16.c). */
typedef struct ch_bf16_sum ch_bf16_sum;
/* Encode c's buf (n, at c->at in the feedback buffer) and send each rank its chunk. */
ch_status ch_bf16_sum_start(ch_comm *c, ch_real *buf, size_t n, ch_bf16_sum **out, ch_err *err);
/* Move x on if its messages have arrived: sum this rank's chunk and send it to every rank, then
 * decode every chunk's sum into buf. *done when buf holds the result (x is then freed). */
ch_status ch_bf16_sum_test(ch_comm *c, ch_bf16_sum *x, const char *what, double t0, bool check_clock,
                           bool *done, ch_err *err);

#endif
