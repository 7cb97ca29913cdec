/* The hierarchical communicator: replicas of one process sum through shared memory, local member 0
 * of each process sums those partial results across processes with MPI, and the local members copy
 * its result (local reduce, MPI across ranks, local broadcast). Only one thread per process and
 * group talks to MPI, and the bytes cross the network once per process, not once per replica.
 * When member 0's MPI stage fails it aborts the local group, so that its local members, waiting
 * for the broadcast, return instead of waiting forever. */
#include "comm/comm.h"

#include <string.h>

static ch_hier *hier_of(ch_comm *c) { return c->group; }

/* Member 0's MPI stage, then the local broadcast of its result. */
static ch_status across_then_share(ch_comm *c, void *buf, size_t bytes,
                                   ch_status (*stage)(ch_comm *, void *, size_t, ch_err *),
                                   size_t n, ch_err *err)
{
    ch_hier *h = hier_of(c);
    if (h->local.rank == 0) {
        memcpy(h->mpi.what, c->what, sizeof c->what);
        h->mpi.at = c->at;
        ch_status st = stage(&h->mpi, buf, n, err);
        if (st != CH_STATUS_OK) {
            ch_comm_abort(&h->local, err ? err->msg : "MPI stage failed");
            return st;
        }
    }
    if (h->local.size == 1) return CH_STATUS_OK;
    return ch_local_broadcast_bytes(&h->local, buf, bytes, 0, err);
}

static ch_status stage_sum(ch_comm *m, void *buf, size_t n, ch_err *err)
{
    return ch_comm_allreduce_sum(m, buf, n, err);
}

static ch_status stage_sum_f64(ch_comm *m, void *buf, size_t n, ch_err *err)
{
    return ch_comm_allreduce_sum_f64(m, buf, n, err);
}

static ch_status hier_allreduce_sum(ch_comm *c, ch_real *buf, size_t n, ch_err *err)
{
    ch_hier *h = hier_of(c);
    CH_TRY(ch_comm_allreduce_sum(&h->local, buf, n, err));
    if (!h->has_mpi) return CH_STATUS_OK;
    return across_then_share(c, buf, sizeof(ch_real) * n, stage_sum, n, err);
}

static ch_status hier_allreduce_sum_f64(ch_comm *c, double *buf, size_t n, ch_err *err)
{
    ch_hier *h = hier_of(c);
    CH_TRY(ch_comm_allreduce_sum_f64(&h->local, buf, n, err));
    if (!h->has_mpi) return CH_STATUS_OK;
    return across_then_share(c, buf, sizeof(double) * n, stage_sum_f64, n, err);
}

/* Nonblocking only when the process has one replica (the MPI stage is all there is); with local
 * members the stages must run in the same order on every member, so it completes at once. */
static ch_status hier_iallreduce_sum(ch_comm *c, ch_real *buf, size_t n, ch_request *req, ch_err *err)
{
    ch_hier *h = hier_of(c);
    if (h->has_mpi && h->local.size == 1) {
        memcpy(h->mpi.what, c->what, sizeof c->what);
        h->mpi.at = c->at;
        return ch_comm_iallreduce_sum(&h->mpi, buf, n, req, err);
    }
    req->done = true;
    return hier_allreduce_sum(c, buf, n, err);
}

static ch_status hier_test(ch_comm *c, ch_request *req, bool *done, ch_err *err)
{
    return ch_comm_test(&hier_of(c)->mpi, req, done, err);
}

/* From any member: the root's process first gives it to its local member 0 (a local broadcast
 * from the root), member 0 of every process then takes it over MPI from the root's process, and
 * each process's members copy member 0's. Every member computes the same plan from root. */
static ch_status hier_broadcast(ch_comm *c, void *buf, size_t bytes, int root, ch_err *err)
{
    ch_hier *h = hier_of(c);
    if (root < 0 || root >= c->size)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "broadcast root %d outside 0..%d", root, c->size - 1);
    const int D = h->local.size, root_proc = root / D, root_member = root % D;
    if (!h->has_mpi) return ch_comm_broadcast_bytes(&h->local, buf, bytes, root_member, err);
    if (h->mpi.rank == root_proc && root_member != 0 && D > 1)
        CH_TRY(ch_comm_broadcast_bytes(&h->local, buf, bytes, root_member, err));
    if (h->local.rank == 0) {
        memcpy(h->mpi.what, c->what, sizeof c->what);
        ch_status st = ch_comm_broadcast_bytes(&h->mpi, buf, bytes, root_proc, err);
        if (st != CH_STATUS_OK) {
            ch_comm_abort(&h->local, err ? err->msg : "MPI stage failed");
            return st;
        }
    }
    if (D == 1) return CH_STATUS_OK;
    return ch_local_broadcast_bytes(&h->local, buf, bytes, 0, err);
}

static ch_status hier_barrier(ch_comm *c, ch_err *err)
{
    ch_hier *h = hier_of(c);
    CH_TRY(ch_comm_barrier(&h->local, err));
    if (h->has_mpi && h->local.rank == 0) {
        ch_status st = ch_comm_barrier(&h->mpi, err);
        if (st != CH_STATUS_OK) {
            ch_comm_abort(&h->local, err ? err->msg : "MPI barrier failed");
            return st;
        }
    }
    return ch_comm_barrier(&h->local, err);
}

static void hier_abort(ch_comm *c, const char *why)
{
    ch_hier *h = hier_of(c);
    ch_comm_abort(&h->local, why);
    if (h->has_mpi) ch_comm_abort(&h->mpi, why);
}

static const ch_comm_ops hier_ops = {
    .name = "hier",
    .allreduce_sum = hier_allreduce_sum,
    .allreduce_sum_f64 = hier_allreduce_sum_f64,
    .iallreduce_sum = hier_iallreduce_sum,
    .test = hier_test,
    .broadcast = hier_broadcast,
    .barrier = hier_barrier,
    .abort = hier_abort,
};

void ch_hier_comm_init(ch_comm *c, ch_hier *h, ch_local_group *g, int member, ch_comm *mpi)
{
    *h = (ch_hier){ 0 };
    ch_local_comm_init(&h->local, g, member);
    h->has_mpi = mpi != NULL;
    if (mpi) h->mpi = *mpi;
    const int procs = mpi ? mpi->size : 1, proc = mpi ? mpi->rank : 0;
    *c = (ch_comm){ .ops = &hier_ops, .rank = proc * h->local.size + member,
                    .size = procs * h->local.size, .group = h };
}
