/* The NCCL communicator (comm/comm.h's interface over device memory): one member per GPU replica of
 * the job, in this process or across ranks and hosts, made from a unique id that global replica 0
 * draws and the trainer hands to every member (over MPI between ranks, as DDP and Horovod do).
 * Each member has its own stream for the collectives. The communicator is non-blocking (NCCL's
 * config.blocking = 0): its set-up and every call are polled, with ncclCommGetAsyncError, against
 * the job's --timeout, so a member that never comes or dies ends the job with one line naming what
 * was exchanged, and ncclCommAbort frees the others. Sums are in device memory in place
 * (device_memory "cuda": the gradient sync hands NCCL its buckets without a host copy); doubles
 * and bytes given in host memory (metrics, ids) go through a small device buffer. */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/plugin.h"

#include <nccl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct nccl_member {
    ncclComm_t comm;
    cudaStream_t s;
    int device;
    double timeout_s;
    void *bounce;          /* device memory for host buffers */
    size_t bounce_bytes;
    atomic_int aborted;
    char why[256];
} nccl_member;

static ch_status failed(ch_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ch_status failed(ch_err *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->on_every_rank = false;
        err->speaks = true;
    }
    return CH_STATUS_SYSTEM;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void nap(void) { nanosleep(&(struct timespec){ .tv_nsec = 20000 }, NULL); }

static nccl_member *member_of(ch_comm *c) { return c->group; }

/* The state of a call NCCL may still be finishing (a non-blocking communicator): polled until it
 * is done, fails or outlasts the timeout, which aborts the communicator. */
static ch_status settle(nccl_member *m, ncclResult_t r, const char *call, const char *what, ch_err *err)
{
    const double t0 = now_s();
    while (r == ncclInProgress) {
        if (atomic_load(&m->aborted)) return failed(err, "nccl: %s", m->why);
        if (now_s() - t0 > m->timeout_s) {
            if (!atomic_exchange(&m->aborted, 1)) {
                snprintf(m->why, sizeof m->why, "%s: %s did not finish within %g s (--timeout): a member is stuck or gone",
                         what && *what ? what : "collective", call, m->timeout_s);
                ncclCommAbort(m->comm);
            }
            return failed(err, "nccl: %s", m->why);
        }
        nap();
        if (ncclCommGetAsyncError(m->comm, &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess)
        return failed(err, "nccl: %s failed for %s: %s", call, what && *what ? what : "a collective", ncclGetErrorString(r));
    return CH_STATUS_OK;
}

/* Until the member's stream has run what was queued on it: polled, with the same limits. */
static ch_status drain(nccl_member *m, const char *call, const char *what, ch_err *err)
{
    const double t0 = now_s();
    for (;;) {
        const cudaError_t q = cudaStreamQuery(m->s);
        if (q == cudaSuccess) return CH_STATUS_OK;
        if (q != cudaErrorNotReady) return failed(err, "nccl: %s: %s", call, cudaGetErrorName(q));
        ncclResult_t r = ncclSuccess;
        ncclCommGetAsyncError(m->comm, &r);
        if (r != ncclSuccess && r != ncclInProgress) return settle(m, r, call, what, err);
        if (atomic_load(&m->aborted)) return failed(err, "nccl: %s", m->why);
        if (now_s() - t0 > m->timeout_s) return settle(m, ncclInProgress, call, what, err);
        nap();
    }
}

enum { BOUNCE_START = 256 << 10 };

static ch_status bounce_room(nccl_member *m, size_t bytes, ch_err *err)
{
    if (bytes <= m->bounce_bytes) return CH_STATUS_OK;
    if (m->bounce) cudaFree(m->bounce);
    m->bounce = NULL;
    m->bounce_bytes = 0;
    if (cudaMalloc(&m->bounce, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return failed(err, "nccl: cudaMalloc of %zu bytes for a host buffer's exchange failed", bytes);
    }
    m->bounce_bytes = bytes;
    return CH_STATUS_OK;
}

static bool on_device(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice;
}

/* One collective over buf (bytes, of type t): in place on device memory, else through the bounce
 * buffer; root < 0: a sum, else a broadcast from root. Blocking. */
static ch_status collective(ch_comm *c, void *buf, size_t count, ncclDataType_t t, size_t elem, int root, ch_err *err)
{
    nccl_member *m = member_of(c);
    if (atomic_load(&m->aborted)) return failed(err, "nccl: %s", m->why);
    cu_use_device(m->device);
    const size_t bytes = count * elem;
    void *dev = buf;
    const bool host = count && !on_device(buf);
    if (host) {
        CH_TRY(bounce_room(m, bytes, err));
        dev = m->bounce;
        if (cudaMemcpyAsync(dev, buf, bytes, cudaMemcpyHostToDevice, m->s) != cudaSuccess)
            return failed(err, "nccl: staging a host buffer: %s", cudaGetErrorName(cudaGetLastError()));
    }
    const char *call = root < 0 ? "ncclAllReduce" : "ncclBroadcast";
    ncclResult_t r = root < 0 ? ncclAllReduce(dev, dev, count, t, ncclSum, m->comm, m->s)
                              : ncclBroadcast(dev, dev, count, t, root, m->comm, m->s);
    CH_TRY(settle(m, r, call, c->what, err));
    if (host && cudaMemcpyAsync(buf, dev, bytes, cudaMemcpyDeviceToHost, m->s) != cudaSuccess)
        return failed(err, "nccl: staging a host buffer: %s", cudaGetErrorName(cudaGetLastError()));
    return drain(m, call, c->what, err);
}

static ch_status nccl_sum(ch_comm *c, ch_real *buf, size_t n, ch_err *err)
{
    return collective(c, buf, n, ncclFloat, sizeof(ch_real), -1, err);
}

static ch_status nccl_sum_f64(ch_comm *c, double *buf, size_t n, ch_err *err)
{
    return collective(c, buf, n, ncclDouble, sizeof(double), -1, err);
}

static ch_status nccl_broadcast(ch_comm *c, void *buf, size_t bytes, int root, ch_err *err)
{
    return collective(c, buf, bytes, ncclUint8, 1, root, err);
}

static ch_status nccl_barrier(ch_comm *c, ch_err *err)
{
    nccl_member *m = member_of(c);
    CH_TRY(bounce_room(m, sizeof(ch_real), err));
    return collective(c, m->bounce, 1, ncclFloat, sizeof(ch_real), -1, err);
}

/* A sum started on the member's stream; req->impl holds the event that marks its end. */
static ch_status nccl_isum(ch_comm *c, ch_real *buf, size_t n, ch_request *req, ch_err *err)
{
    nccl_member *m = member_of(c);
    if (atomic_load(&m->aborted)) return failed(err, "nccl: %s", m->why);
    cu_use_device(m->device);
    snprintf(req->what, sizeof req->what, "%s", c->what);
    req->started = now_s();
    req->done = false;
    CH_TRY(settle(m, ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, m->comm, m->s), "ncclAllReduce", c->what, err));
    cudaEvent_t e;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess || cudaEventRecord(e, m->s) != cudaSuccess)
        return failed(err, "nccl: an event for a sum: %s", cudaGetErrorName(cudaGetLastError()));
    memcpy(req->impl, &e, sizeof e);
    return CH_STATUS_OK;
}

static ch_status nccl_test(ch_comm *c, ch_request *req, bool *done, ch_err *err)
{
    nccl_member *m = member_of(c);
    *done = req->done;
    if (req->done) return CH_STATUS_OK;
    cu_use_device(m->device);
    cudaEvent_t e;
    memcpy(&e, req->impl, sizeof e);
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) {
        cudaEventDestroy(e);
        req->done = *done = true;
        return CH_STATUS_OK;
    }
    if (q != cudaErrorNotReady) return failed(err, "nccl: ncclAllReduce for %s: %s", req->what, cudaGetErrorName(q));
    ncclResult_t r = ncclSuccess;
    ncclCommGetAsyncError(m->comm, &r);
    if (r != ncclSuccess && r != ncclInProgress) return settle(m, r, "ncclAllReduce", req->what, err);
    if (atomic_load(&m->aborted)) return failed(err, "nccl: %s", m->why);
    if (now_s() - req->started > m->timeout_s) return settle(m, ncclInProgress, "ncclAllReduce", req->what, err);
    return CH_STATUS_OK;
}

static void nccl_abort(ch_comm *c, const char *why)
{
    nccl_member *m = member_of(c);
    if (!m || atomic_exchange(&m->aborted, 1)) return;   /* !m: freed after a failed set-up */
    snprintf(m->why, sizeof m->why, "%s", why && *why ? why : "the group was aborted");
    ncclCommAbort(m->comm);
}

static const ch_comm_ops nccl_ops = {
    .name = "nccl", .device_memory = "cuda", .allreduce_sum = nccl_sum, .allreduce_sum_f64 = nccl_sum_f64,
    .iallreduce_sum = nccl_isum, .test = nccl_test, .broadcast = nccl_broadcast, .barrier = nccl_barrier,
    .abort = nccl_abort,
};

ch_status cu_nccl_id(unsigned char id[CH_NCCL_ID_BYTES], ch_err *err)
{
    ncclUniqueId u;
    const ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return failed(err, "nccl: ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u < CH_NCCL_ID_BYTES ? sizeof u : CH_NCCL_ID_BYTES);
    return CH_STATUS_OK;
}

ch_status cu_nccl_init(ch_comm *c, int device, int nranks, int rank, const unsigned char id[CH_NCCL_ID_BYTES],
                       double timeout_s, ch_err *err)
{
    nccl_member *m = calloc(1, sizeof *m);
    if (!m) return failed(err, "nccl: calloc of a member failed");
    m->device = device;
    m->timeout_s = timeout_s > 0 ? timeout_s : 300;
    cu_use_device(device);
    if (cudaStreamCreateWithFlags(&m->s, cudaStreamNonBlocking) != cudaSuccess) {
        free(m);
        return failed(err, "nccl: cudaStreamCreateWithFlags failed: %s", cudaGetErrorName(cudaGetLastError()));
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&m->comm, nranks, u, rank, &config);
    *c = (ch_comm){ .ops = &nccl_ops, .rank = rank, .size = nranks, .group = m };
    snprintf(c->what, sizeof c->what, "the NCCL communicator's set-up (member %d of %d)", rank, nranks);
    const ch_status st = r == ncclSuccess || r == ncclInProgress ? settle(m, r, "ncclCommInitRankConfig", c->what, err)
                                                                  : failed(err, "nccl: ncclCommInitRankConfig failed: %s", ncclGetErrorString(r));
    c->what[0] = '\0';
    /* Room for the host buffers a step exchanges (sync-BN's statistics: 2 doubles per channel), so
     * that no cudaFree, which waits for the whole device, runs while a step's collectives do. */
    const ch_status room = st == CH_STATUS_OK ? bounce_room(m, BOUNCE_START, err) : st;
    if (room != CH_STATUS_OK) {
        cu_nccl_free(c);
        return room;
    }
    return CH_STATUS_OK;
}

void cu_nccl_free(ch_comm *c)
{
    nccl_member *m = c->group;
    if (!m) return;
    cu_use_device(m->device);
    if (m->comm) {
        if (atomic_load(&m->aborted)) {
            /* ncclCommAbort already freed it */
        } else {
            cudaStreamSynchronize(m->s);
            ncclCommDestroy(m->comm);
        }
    }
    if (m->bounce) cudaFree(m->bounce);
    if (m->s) cudaStreamDestroy(m->s);
    free(m);
    c->group = NULL;
}
