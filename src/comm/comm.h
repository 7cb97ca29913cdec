/* Communicators: how replicas combine gradients. Training code talks to a ch_comm and never to
 * threads or MPI directly (design.md). One ch_comm handle per member (replica thread or rank); the
 * members of a group call the same collectives in the same order.
 *
 * Back ends: `local` (threads of one process, shared memory, below), `mpi` (one member per process,
 * comm/mpi.h) and `hier` (below: replica threads of many processes, a local stage and an MPI stage).
 * Every collective returns CH_STATUS_OK, or CH_STATUS_SYSTEM once the group has been aborted (a member
 * failed): no member waits forever for one that will never arrive. */
#ifndef CH_COMM_H
#define CH_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "core/real.h"
#include "core/status.h"

typedef struct ch_comm ch_comm;

/* A collective in flight (see iallreduce_sum). */
typedef struct ch_request {
    unsigned char impl[16]; /* the back end's handle */
    bool done;
    double started;         /* when it started, for the timeout */
    char what[96];          /* what it exchanges, for the timeout message */
} ch_request;

typedef struct ch_comm_ops {
    const char *name;
    /* Besides host memory, the backend whose memory the collectives read and write in place
     * ("cuda" for a device communicator); NULL: host memory only (ch_comm_stages). */
    const char *device_memory;
    /* buf (n) <- the sum over all members' buf, element by element; every member gets the same bits. */
    ch_status (*allreduce_sum)(ch_comm *c, ch_real *buf, size_t n, ch_err *err);
    /* The same for doubles: small exact sums (sync-BN statistics, metrics). */
    ch_status (*allreduce_sum_f64)(ch_comm *c, double *buf, size_t n, ch_err *err);
    /* Optional (NULL: the blocking allreduce_sum is used): start allreduce_sum and return at once.
     * buf must not be touched until test says done. May complete at once (req->done). */
    ch_status (*iallreduce_sum)(ch_comm *c, ch_real *buf, size_t n, ch_request *req, ch_err *err);
    /* Has req completed? Fails when the group was aborted; ends the job after the timeout. */
    ch_status (*test)(ch_comm *c, ch_request *req, bool *done, ch_err *err);
    /* buf (bytes) <- root's buf: any bytes (a device communicator's bootstrap id, a tensor). */
    ch_status (*broadcast)(ch_comm *c, void *buf, size_t bytes, int root, ch_err *err);
    ch_status (*barrier)(ch_comm *c, ch_err *err);
    /* Mark the group failed (why: one line): members blocked in or entering a collective return. */
    void (*abort)(ch_comm *c, const char *why);
} ch_comm_ops;

struct ch_comm {
    const ch_comm_ops *ops;
    int rank, size;
    void *group;    /* back end state shared by the members; owned by the group's creator */
    char what[96];  /* what the next collective exchanges ("step 3, gradient bucket 2 of 5"), for
                     * the message when it times out; set by the caller, may be empty */
    size_t at;      /* where the next sum's buffer starts in the flat buffer it is cut from (a
                     * gradient bucket's offset): a compressed group's error feedback is kept per
                     * element of that buffer (comm/mpi.h); set with what */
};

/* A group of `size` members inside one process. ch_local_group_create returns the shared state;
 * ch_local_comm_init fills member `rank`'s handle. Free the group after every member is done. */
typedef struct ch_local_group ch_local_group;
ch_status ch_local_group_create(int size, ch_local_group **out, ch_err *err);
void ch_local_comm_init(ch_comm *c, ch_local_group *g, int rank);
void ch_local_group_free(ch_local_group *g);
/* buf (bytes) <- root's buf, over a local group (any element type). */
ch_status ch_local_broadcast_bytes(ch_comm *c, void *buf, size_t bytes, int root, ch_err *err);

/* Hierarchical: D replica threads in each of N processes, R = N x D members in all. A collective is
 * the local one among the process's replicas, then (by local member 0 only) the MPI one among the
 * processes, then a local broadcast of the result: every member of every process ends with the same
 * bits. h is the member's own state, owned by the caller, and must outlive c. mpi is NULL for a
 * single process (then it is exactly the local communicator). rank/size are the global member index
 * process x D + member and R. */
typedef struct ch_hier {
    ch_comm local;
    ch_comm mpi;
    bool has_mpi;
} ch_hier;
void ch_hier_comm_init(ch_comm *c, ch_hier *h, ch_local_group *g, int member, ch_comm *mpi);

static inline ch_status ch_comm_allreduce_sum(ch_comm *c, ch_real *buf, size_t n, ch_err *err)
{
    return c->ops->allreduce_sum(c, buf, n, err);
}
static inline ch_status ch_comm_allreduce_sum_f64(ch_comm *c, double *buf, size_t n, ch_err *err)
{
    return c->ops->allreduce_sum_f64(c, buf, n, err);
}
static inline void ch_comm_abort(ch_comm *c, const char *why) { c->ops->abort(c, why); }
/* Start an allreduce; back ends without a nonblocking one complete it here (req->done). */
static inline ch_status ch_comm_iallreduce_sum(ch_comm *c, ch_real *buf, size_t n, ch_request *req,
                                               ch_err *err)
{
    req->done = false;
    if (c->ops->iallreduce_sum) return c->ops->iallreduce_sum(c, buf, n, req, err);
    req->done = true;
    return c->ops->allreduce_sum(c, buf, n, err);
}
static inline ch_status ch_comm_test(ch_comm *c, ch_request *req, bool *done, ch_err *err)
{
    if (req->done) {
        *done = true;
        return CH_STATUS_OK;
    }
    return c->ops->test(c, req, done, err);
}
static inline ch_status ch_comm_broadcast_bytes(ch_comm *c, void *buf, size_t bytes, int root, ch_err *err)
{
    return c->ops->broadcast(c, buf, bytes, root, err);
}
static inline ch_status ch_comm_broadcast(ch_comm *c, ch_real *buf, size_t n, int root, ch_err *err)
{
    return c->ops->broadcast(c, buf, sizeof(ch_real) * n, root, err);
}
static inline ch_status ch_comm_barrier(ch_comm *c, ch_err *err) { return c->ops->barrier(c, err); }

/* Shards: n elements cut over `parts` members, member i holding [ch_shard_lo(n, parts, i),
 * ch_shard_lo(n, parts, i + 1)), floor(n i / parts) computed without overflow. Any n (shards differ
 * by one element at most, some may be empty); every member computes the same cut. */
static inline size_t ch_shard_lo(size_t n, int parts, int i)
{
    const size_t p = (size_t)parts, k = (size_t)i;
    return n / p * k + n % p * k / p;
}

/* Every member's shard of buf (n) to every member: member i's [ch_shard_lo(n, size, i), ...) wins.
 * One broadcast per member, from that member (a shard may be empty). */
static inline ch_status ch_comm_allgather_shards(ch_comm *c, ch_real *buf, size_t n, ch_err *err)
{
    for (int i = 0; i < c->size; i++) {
        const size_t lo = ch_shard_lo(n, c->size, i), hi = ch_shard_lo(n, c->size, i + 1);
        if (hi > lo) CH_TRY(ch_comm_broadcast(c, buf + lo, hi - lo, i, err));
    }
    return CH_STATUS_OK;
}

#endif
