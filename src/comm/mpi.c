/* The MPI communicator: a ch_comm over one MPI communicator (a duplicate of MPI_COMM_WORLD per
 * use, so that the gradient buckets, the control exchanges and the trainer's own sums never match
 * each other's messages). Every collective is started nonblocking (MPI_Iallreduce, MPI_Ibcast,
 * MPI_Ibarrier) and completed by polling MPI_Test under the world lock, so that
 *  - several threads can use MPI at MPI_THREAD_SERIALIZED without one holding the lock while it waits,
 *  - a wait ends when the group is aborted (a local replica failed), and
 *  - a collective that has not finished after the timeout ends the job with a message naming what
 *    was being exchanged (ch_comm.what), instead of hanging on a stuck or vanished rank.
 * Polling yields the CPU between tests and then sleeps, so a waiting sync thread leaves the cores
 * to the compute threads. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_group.h"
#include "comm/world.h"
#include "core/clock.h"

ch_status ch_mpi_fail(ch_err *err, const char *call, int rc)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
    return ch_fail(err, CH_STATUS_SYSTEM, "%s failed: %s", call, text);
}

/* One MPI_Test of req. On abort the request is left behind: the process is going down. After the
 * timeout the job ends, naming what was being exchanged. */
static ch_status test_once(struct ch_mpi_group *g, MPI_Request *req, const char *what,
                           const char *call, double t0, bool check_clock, bool *done, ch_err *err)
{
    int flag = 0;
    ch_world_lock();
    const int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    ch_world_unlock();
    if (rc != MPI_SUCCESS) return ch_mpi_fail(err, call, rc);
    *done = flag != 0;
    if (*done) return CH_STATUS_OK;
    return ch_mpi_still_waiting(g, what, call, t0, check_clock, err);
}

ch_status ch_mpi_still_waiting(struct ch_mpi_group *g, const char *what, const char *call, double t0,
                               bool check_clock, ch_err *err)
{
    if (atomic_load(&g->aborted))
        return ch_fail(err, CH_STATUS_SYSTEM, "MPI communicator aborted: %s", g->why);
    if (check_clock && ch_clock_s() - t0 > g->timeout_s) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s: %s did not finish within %g s (--timeout): a rank is stuck or gone",
                 what[0] ? what : "collective", call, g->timeout_s);
        ch_world_fatal(1, msg);
    }
    return CH_STATUS_OK;
}

/* Complete req by polling. */
static ch_status wait_request(ch_comm *c, MPI_Request *req, const char *call, ch_err *err)
{
    const double t0 = ch_clock_s();
    for (int round = 0;; round++) {
        bool done = false;
        CH_TRY(test_once(c->group, req, c->what, call, t0, (round & 63) == 63, &done, err));
        if (done) return CH_STATUS_OK;
        ch_poll_pause(round);
    }
}

static ch_status start_and_wait(ch_comm *c, int rc, MPI_Request *req, const char *call, ch_err *err)
{
    ch_world_unlock();
    if (rc != MPI_SUCCESS) return ch_mpi_fail(err, call, rc);
    return wait_request(c, req, call, err);
}

/* MPI counts are int: large buffers go in pieces of at most 1 Gi elements. */
enum { MAX_PIECE = 1 << 30 };

static ch_status mpi_allreduce_type(ch_comm *c, void *buf, size_t n, MPI_Datatype type,
                                    size_t elem, ch_err *err)
{
    struct ch_mpi_group *g = c->group;
    for (size_t at = 0; at < n; at += MAX_PIECE) {
        const int len = (int)(n - at < MAX_PIECE ? n - at : MAX_PIECE);
        MPI_Request req;
        ch_world_lock();
        const int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + at * elem, len, type, MPI_SUM,
                                      g->comm, &req);
        CH_TRY(start_and_wait(c, rc, &req, "MPI_Iallreduce", err));
    }
    return CH_STATUS_OK;
}

static MPI_Datatype real_type(void) { return sizeof(ch_real) == sizeof(float) ? MPI_FLOAT : MPI_DOUBLE; }

/* A compressed sum (mpi_bf16.c), polled to the end; pieces keep MPI's counts in int. */
static ch_status compressed_sum(ch_comm *c, ch_real *buf, size_t n, ch_err *err)
{
    const size_t at = c->at;
    ch_status st = CH_STATUS_OK;
    for (size_t piece = 0; piece < n && st == CH_STATUS_OK; piece += MAX_PIECE) {
        ch_bf16_sum *x;
        c->at = at + piece;
        st = ch_bf16_sum_start(c, buf + piece, n - piece < MAX_PIECE ? n - piece : MAX_PIECE, &x, err);
        const double t0 = ch_clock_s();
        bool done = false;
        for (int round = 0; st == CH_STATUS_OK && !done; round++) {
            st = ch_bf16_sum_test(c, x, c->what, t0, (round & 63) == 63, &done, err);
            if (st == CH_STATUS_OK && !done) ch_poll_pause(round);
        }
    }
    c->at = at;
    return st;
}

static ch_status mpi_allreduce_sum(ch_comm *c, ch_real *buf, size_t n, ch_err *err)
{
    if (((struct ch_mpi_group *)c->group)->compress != CH_COMPRESS_NONE) return compressed_sum(c, buf, n, err);
    return mpi_allreduce_type(c, buf, n, real_type(), sizeof(ch_real), err);
}

static ch_status mpi_allreduce_sum_f64(ch_comm *c, double *buf, size_t n, ch_err *err)
{
    return mpi_allreduce_type(c, buf, n, MPI_DOUBLE, sizeof(double), err);
}

_Static_assert(sizeof(MPI_Request) <= sizeof(((ch_request *)0)->impl), "MPI_Request fits ch_request");
_Static_assert(sizeof(ch_bf16_sum *) <= sizeof(((ch_request *)0)->impl), "a pointer fits ch_request");

static ch_status mpi_iallreduce_sum(ch_comm *c, ch_real *buf, size_t n, ch_request *req, ch_err *err)
{
    struct ch_mpi_group *g = c->group;
    if (n > MAX_PIECE) {
        req->done = true;
        return mpi_allreduce_sum(c, buf, n, err);
    }
    memcpy(req->what, c->what, sizeof req->what);
    req->started = ch_clock_s();
    if (g->compress != CH_COMPRESS_NONE) {
        ch_bf16_sum *x;
        CH_TRY(ch_bf16_sum_start(c, buf, n, &x, err));
        memcpy(req->impl, &x, sizeof x);
        return CH_STATUS_OK;
    }
    MPI_Request r;
    ch_world_lock();
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, real_type(), MPI_SUM, g->comm, &r);
    ch_world_unlock();
    if (rc != MPI_SUCCESS) return ch_mpi_fail(err, "MPI_Iallreduce", rc);
    memcpy(req->impl, &r, sizeof r);
    return CH_STATUS_OK;
}

static ch_status mpi_test(ch_comm *c, ch_request *req, bool *done, ch_err *err)
{
    if (((struct ch_mpi_group *)c->group)->compress != CH_COMPRESS_NONE) {
        ch_bf16_sum *x;
        memcpy(&x, req->impl, sizeof x);
        ch_status st = ch_bf16_sum_test(c, x, req->what, req->started, true, done, err);
        if (*done) req->done = true;
        return st;
    }
    MPI_Request r;
    memcpy(&r, req->impl, sizeof r);
    ch_status st = test_once(c->group, &r, req->what, "MPI_Iallreduce", req->started, true, done, err);
    memcpy(req->impl, &r, sizeof r);
    if (*done) req->done = true;
    return st;
}

static ch_status mpi_broadcast(ch_comm *c, void *buf, size_t bytes, int root, ch_err *err)
{
    struct ch_mpi_group *g = c->group;
    if (root < 0 || root >= c->size)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "broadcast root %d outside 0..%d", root, c->size - 1);
    for (size_t at = 0; at < bytes; at += MAX_PIECE) {
        const int len = (int)(bytes - at < MAX_PIECE ? bytes - at : MAX_PIECE);
        MPI_Request req;
        ch_world_lock();
        const int rc = MPI_Ibcast((char *)buf + at, len, MPI_BYTE, root, g->comm, &req);
        CH_TRY(start_and_wait(c, rc, &req, "MPI_Ibcast", err));
    }
    return CH_STATUS_OK;
}

static ch_status mpi_barrier(ch_comm *c, ch_err *err)
{
    struct ch_mpi_group *g = c->group;
    MPI_Request req;
    ch_world_lock();
    const int rc = MPI_Ibarrier(g->comm, &req);
    return start_and_wait(c, rc, &req, "MPI_Ibarrier", err);
}

static void mpi_abort_group(ch_comm *c, const char *why)
{
    struct ch_mpi_group *g = c->group;
    if (atomic_load(&g->aborted)) return;
    snprintf(g->why, sizeof g->why, "%s", why);
    atomic_store(&g->aborted, 1);
}

static const ch_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce_sum = mpi_allreduce_sum,
    .allreduce_sum_f64 = mpi_allreduce_sum_f64,
    .iallreduce_sum = mpi_iallreduce_sum,
    .test = mpi_test,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .abort = mpi_abort_group,
};

ch_status ch_mpi_world_allgather_u64(const uint64_t *mine, int count, uint64_t *all, double timeout_s,
                                     const char *what, ch_err *err)
{
    /* A group for this one exchange on MPI_COMM_WORLD itself: no MPI_Comm_dup, which blocks, so a
     * rank that never comes is caught by the poll's timeout. */
    struct ch_mpi_group g = { .comm = MPI_COMM_WORLD, .timeout_s = timeout_s > 0 ? timeout_s : 300 };
    atomic_init(&g.aborted, 0);
    ch_comm c = { .ops = &mpi_ops, .group = &g };
    snprintf(c.what, sizeof c.what, "%s", what);
    MPI_Request req;
    ch_world_lock();
    const int rc = MPI_Iallgather(mine, count, MPI_UINT64_T, all, count, MPI_UINT64_T, MPI_COMM_WORLD, &req);
    return start_and_wait(&c, rc, &req, "MPI_Iallgather", err);
}

/* Rank 0's counts, displacements and buffer for a gather of counts[r] bytes each. */
static ch_status gather_layout(const int *counts, int size, int **displs, char **buf, ch_err *err)
{
    *displs = malloc(sizeof **displs * (size_t)size);
    CH_CHECK_ALLOC(err, *displs);
    int64_t total = 0;
    for (int r = 0; r < size; r++) {
        (*displs)[r] = (int)total;
        total += counts[r];
        if (counts[r] < 0 || total > INT_MAX)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "a gather of more than 2 GiB (rank %d's part: %d bytes)", r,
                           counts[r]);
    }
    *buf = malloc((size_t)total + 1);
    CH_CHECK_ALLOC(err, *buf);
    return CH_STATUS_OK;
}

ch_status ch_mpi_gather_bytes(ch_comm *c, const char *mine, size_t len, char **all, size_t *lens, ch_err *err)
{
    struct ch_mpi_group *g = c->group;
    const bool root = c->rank == 0;
    /* A part too large still takes part in the gathers (as -1 bytes), so that no rank waits for it. */
    const int n = len <= INT_MAX ? (int)len : -1;
    int *counts = root ? calloc((size_t)c->size, sizeof *counts) : NULL;
    if (root && !counts) return CH_SYS_FAIL(err, "allocation of a gather's counts");
    MPI_Request req;
    ch_world_lock();
    int rc = MPI_Igather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, g->comm, &req);
    ch_status st = start_and_wait(c, rc, &req, "MPI_Igather", err);
    int *displs = NULL;
    char *buf = NULL;
    ch_status layout = CH_STATUS_OK;
    if (st == CH_STATUS_OK && root) layout = gather_layout(counts, c->size, &displs, &buf, err);
    /* Rank 0 tells the others whether the bytes may come (one int: a broadcast never blocks on a
     * failed layout). */
    int go = layout == CH_STATUS_OK && n >= 0;
    if (st == CH_STATUS_OK) {
        ch_world_lock();
        rc = MPI_Ibcast(&go, 1, MPI_INT, 0, g->comm, &req);
        st = start_and_wait(c, rc, &req, "MPI_Ibcast", err);
    }
    if (st == CH_STATUS_OK && go) {
        ch_world_lock();
        rc = MPI_Igatherv(mine, n, MPI_CHAR, buf, counts, displs, MPI_CHAR, 0, g->comm, &req);
        st = start_and_wait(c, rc, &req, "MPI_Igatherv", err);
    } else if (st == CH_STATUS_OK) {
        st = layout != CH_STATUS_OK ? layout
             : ch_fail(err, CH_STATUS_BAD_INPUT, "a gather's parts must stay under 2 GiB each");
    }
    for (int r = 0; root && st == CH_STATUS_OK && r < c->size; r++) lens[r] = (size_t)counts[r];
    free(counts);
    free(displs);
    if (st != CH_STATUS_OK || !root) {
        free(buf);
        buf = NULL;
    }
    *all = buf;
    return st;
}

/* A group over a new communicator made from parent by MPI_Comm_dup (color < 0) or MPI_Comm_split. */
static ch_status group_from(MPI_Comm parent, int color, double timeout_s, ch_mpi_group **out, ch_err *err)
{
    if (!ch_world_mpi()) return ch_fail(err, CH_STATUS_SYSTEM, "MPI is not initialised");
    struct ch_mpi_group *g = calloc(1, sizeof *g);
    CH_CHECK_ALLOC(err, g);
    g->timeout_s = timeout_s > 0 ? timeout_s : 300;
    ch_world_lock();
    int rank = 0;
    MPI_Comm_rank(parent, &rank);
    int rc = color < 0 ? MPI_Comm_dup(parent, &g->comm) : MPI_Comm_split(parent, color, rank, &g->comm);
    if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    ch_world_unlock();
    if (rc != MPI_SUCCESS) {
        free(g);
        return ch_mpi_fail(err, color < 0 ? "MPI_Comm_dup" : "MPI_Comm_split", rc);
    }
    *out = g;
    return CH_STATUS_OK;
}

ch_status ch_mpi_group_create(double timeout_s, ch_mpi_group **out, ch_err *err)
{
    return group_from(MPI_COMM_WORLD, -1, timeout_s, out, err);
}

ch_status ch_mpi_group_split(ch_mpi_group *g, int color, ch_mpi_group **out, ch_err *err)
{
    return group_from(g->comm, color < 0 ? 0 : color, g->timeout_s, out, err);
}

ch_status ch_mpi_group_dup(ch_mpi_group *parent, ch_mpi_group **out, ch_err *err)
{
    return group_from(parent->comm, -1, parent->timeout_s, out, err);
}

static ch_status p2p_bytes(size_t bytes, ch_err *err)
{
    if (bytes > INT_MAX) return ch_fail(err, CH_STATUS_BAD_INPUT, "a message of %zu bytes (at most 2 GiB)", bytes);
    return CH_STATUS_OK;
}

/* MPI_Isend or MPI_Irecv of bytes with peer, its handle kept in req. */
static ch_status p2p_start(ch_mpi_group *g, void *buf, size_t bytes, int peer, int tag, bool send, ch_request *req,
                           ch_err *err)
{
    CH_TRY(p2p_bytes(bytes, err));
    MPI_Request r;
    ch_world_lock();
    const int rc = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, g->comm, &r)
                        : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, g->comm, &r);
    ch_world_unlock();
    if (rc != MPI_SUCCESS) return ch_mpi_fail(err, send ? "MPI_Isend" : "MPI_Irecv", rc);
    req->done = false;
    req->started = ch_clock_s();
    memcpy(req->impl, &r, sizeof r);
    return CH_STATUS_OK;
}

ch_status ch_mpi_isend(ch_mpi_group *g, const void *buf, size_t bytes, int peer, int tag, ch_request *req,
                       ch_err *err)
{
    /* MPI_Isend reads buf only; MPI's C binding takes it as const since MPI 3. */
    return p2p_start(g, (void *)buf, bytes, peer, tag, true, req, err);
}

ch_status ch_mpi_irecv(ch_mpi_group *g, void *buf, size_t bytes, int peer, int tag, ch_request *req, ch_err *err)
{
    return p2p_start(g, buf, bytes, peer, tag, false, req, err);
}

ch_status ch_mpi_test_p2p(ch_mpi_group *g, ch_request *req, bool *done, ch_err *err)
{
    if (req->done) {
        *done = true;
        return CH_STATUS_OK;
    }
    MPI_Request r;
    memcpy(&r, req->impl, sizeof r);
    const ch_status st = test_once(g, &r, "", "MPI_Test", req->started, false, done, err);
    memcpy(req->impl, &r, sizeof r);
    req->done = *done;
    return st;
}

void ch_mpi_timeout_words(const ch_mpi_group *g, double timeout_s, char *out, size_t len)
{
    const double k = timeout_s / g->timeout_s;
    if (k == 1) snprintf(out, len, "%g s (--timeout)", timeout_s);
    else if (k == 2) snprintf(out, len, "%g s (twice --timeout %g)", timeout_s, g->timeout_s);
    else snprintf(out, len, "%g s (%g x --timeout %g)", timeout_s, k, g->timeout_s);
}

ch_status ch_mpi_wait(ch_mpi_group *g, ch_request *req, double timeout_s, const char *what, ch_err *err)
{
    const double t0 = ch_clock_s();
    for (int round = 0;; round++) {
        bool done = false;
        CH_TRY(ch_mpi_test_p2p(g, req, &done, err));
        if (done) return CH_STATUS_OK;
        if ((round & 63) == 63 && ch_clock_s() - t0 > timeout_s) {
            char msg[512], why[96];
            ch_mpi_timeout_words(g, timeout_s, why, sizeof why);
            snprintf(msg, sizeof msg, "%s did not arrive within %s: a rank is stuck or gone", what, why);
            ch_world_fatal(1, msg);
        }
        ch_poll_pause(round);
    }
}

ch_status ch_mpi_probe(ch_mpi_group *g, bool *found, ch_mpi_msg *m, ch_err *err)
{
    int flag = 0, count = 0;
    MPI_Status s;
    ch_world_lock();
    int rc = MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, g->comm, &flag, &s);
    if (rc == MPI_SUCCESS && flag) rc = MPI_Get_count(&s, MPI_BYTE, &count);
    ch_world_unlock();
    if (rc != MPI_SUCCESS) return ch_mpi_fail(err, "MPI_Iprobe", rc);
    *found = flag != 0;
    if (*found) *m = (ch_mpi_msg){ .source = s.MPI_SOURCE, .tag = s.MPI_TAG, .bytes = (size_t)(count > 0 ? count : 0) };
    if (atomic_load(&g->aborted)) return ch_fail(err, CH_STATUS_SYSTEM, "MPI communicator aborted: %s", g->why);
    return CH_STATUS_OK;
}

void ch_mpi_comm_init(ch_comm *c, ch_mpi_group *g)
{
    int rank = 0, size = 1;
    ch_world_lock();
    MPI_Comm_rank(g->comm, &rank);
    MPI_Comm_size(g->comm, &size);
    ch_world_unlock();
    *c = (ch_comm){ .ops = &mpi_ops, .rank = rank, .size = size, .group = g };
}

ch_status ch_mpi_group_set_compress(ch_mpi_group *g, ch_grad_compress how, size_t feedback_elems, ch_err *err)
{
    free(g->fb_sent);
    free(g->fb_summed);
    g->fb_sent = g->fb_summed = NULL;
    g->fb_n = 0;
    g->compress = how;
    if (how != CH_COMPRESS_BF16_EF) return CH_STATUS_OK;
    g->fb_sent = calloc(feedback_elems ? feedback_elems : 1, sizeof(float));
    g->fb_summed = calloc(feedback_elems ? feedback_elems : 1, sizeof(float));
    if (!g->fb_sent || !g->fb_summed)
        return ch_fail(err, CH_STATUS_SYSTEM, "out of memory for the error feedback of %zu gradients",
                       feedback_elems);
    g->fb_n = feedback_elems;
    return CH_STATUS_OK;
}

void ch_mpi_group_free(ch_mpi_group *g)
{
    if (!g) return;
    free(g->fb_sent);
    free(g->fb_summed);
    /* MPI_Comm_free is collective in spirit; after an abort the job is ending anyway. */
    if (!atomic_load(&g->aborted)) {
        ch_world_lock();
        MPI_Comm_free(&g->comm);
        ch_world_unlock();
    }
    free(g);
}
