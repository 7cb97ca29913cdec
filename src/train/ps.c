/* Parameter servers, the workers' side: roles, the push communicator, pulls, claims, flushes and
 * the optimizer state's trips to and from rank 0. The servers' loop is in ps_server.c; the
 * messages both speak are in ps_wire.h. */
#include "train/ps.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "core/clock.h"
#include "train/ps_wire.h"

bool ch_ps_mode_parse(const char *s, ch_ps_mode *out)
{
    if (!s || strcmp(s, "sync") == 0) *out = CH_PS_SYNC;
    else if (strcmp(s, "async") == 0) *out = CH_PS_ASYNC;
    else return false;
    return true;
}

const char *ch_ps_mode_name(ch_ps_mode m) { return m == CH_PS_ASYNC ? "async" : "sync"; }

ch_status ch_ps_create(const ch_ps_config *c, ch_ps **out, ch_mpi_group **job, ch_err *err)
{
    *out = NULL;
    *job = NULL;
    ch_ps *ps = calloc(1, sizeof *ps);
    CH_CHECK_ALLOC(err, ps);
    ps->cfg = *c;
    ps->size = ch_world_size();
    ps->rank = ch_world_rank();
    ps->workers = ps->size - c->servers;
    ch_status st = ch_mpi_group_create(c->timeout_s, &ps->g, err);
    if (st == CH_STATUS_OK) st = ch_mpi_group_split(ps->g, ps->rank >= ps->workers, job, err);
    if (st != CH_STATUS_OK) {
        ch_ps_free(ps);
        return st;
    }
    *out = ps;
    return CH_STATUS_OK;
}

void ch_ps_free(ch_ps *ps)
{
    if (!ps) return;
    free(ps->records);
    ch_mpi_group_free(ps->g);
    free(ps);
}

bool ch_ps_is_server(const ch_ps *ps) { return ps->rank >= ps->workers; }
int ch_ps_workers(const ch_ps *ps) { return ps->workers; }
int ch_ps_servers(const ch_ps *ps) { return ps->cfg.servers; }
ch_ps_mode ch_ps_mode_of(const ch_ps *ps) { return ps->cfg.mode; }

void ch_ps_shard(const ch_ps *ps, size_t nparams, int s, size_t *lo, size_t *hi)
{
    *lo = ch_shard_lo(nparams, ps->cfg.servers, s);
    *hi = ch_shard_lo(nparams, ps->cfg.servers, s + 1);
}

ch_status ch_ps_attach(ch_ps *ps, size_t nparams, int max_pushes, ch_err *err)
{
    ps->nparams = nparams;
    ps->nrecords = max_pushes > 0 ? max_pushes : 1;
    ps->records = calloc((size_t)ps->nrecords, sizeof *ps->records);
    CH_CHECK_ALLOC(err, ps->records);
    return CH_STATUS_OK;
}

void ch_ps_set_step(ch_ps *ps, uint64_t step, double lr)
{
    ps->step = step;
    ps->lr = lr;
    ps->next_record = 0;
}

/* Wait for one message exchange, naming what for the timeout: workers wait twice the timeout, so
 * that a server waiting for a stuck worker names that worker first. */
static ch_status wait_for(ch_ps *ps, ch_request *req, const char *what, ch_err *err)
{
    return ch_mpi_wait(ps->g, req, 2 * ps->cfg.timeout_s, what, err);
}

/* ---- the push communicator ---- */

static ch_ps *ps_of(ch_comm *c) { return c->group; }

static ch_status push_start(ch_comm *c, ch_real *buf, size_t n, ch_request *req, ch_err *err)
{
    ch_ps *ps = ps_of(c);
    CH_ASSERT(ps->next_record < ps->nrecords && c->at + n <= ps->nparams);
    const int at = ps->next_record++;
    ch_ps_record *rec = &ps->records[at];
    rec->nreq = 0;
    for (int s = 0; s < ps->cfg.servers; s++) {
        size_t lo, hi;
        ch_ps_shard(ps, ps->nparams, s, &lo, &hi);
        const size_t a = lo > c->at ? lo : c->at, b = hi < c->at + n ? hi : c->at + n;
        if (a >= b) continue;
        CH_ASSERT(rec->nreq + 2 <= CH_PS_MAX_SERVERS * 2);
        rec->hdr[s] = (ch_ps_push_hdr){ .lo = a, .n = b - a, .step = ps->step, .lr = ps->lr };
        const int dest = ps->workers + s;
        rec->dest[rec->nreq] = rec->dest[rec->nreq + 1] = dest;
        CH_TRY(ch_mpi_isend(ps->g, &rec->hdr[s], sizeof rec->hdr[s], dest, CH_PS_TAG_PUSH_HDR,
                            &rec->req[rec->nreq++], err));
        CH_TRY(ch_mpi_isend(ps->g, buf + (a - c->at), sizeof(ch_real) * (b - a), dest, CH_PS_TAG_PUSH_DATA,
                            &rec->req[rec->nreq++], err));
    }
    req->done = rec->nreq == 0;
    req->started = ch_clock_s();
    memcpy(req->what, c->what, sizeof req->what);
    memcpy(req->impl, &at, sizeof at);
    return CH_STATUS_OK;
}

static ch_status push_test(ch_comm *c, ch_request *req, bool *done, ch_err *err)
{
    ch_ps *ps = ps_of(c);
    int at;
    memcpy(&at, req->impl, sizeof at);
    ch_ps_record *rec = &ps->records[at];
    int waiting_for = -1;
    for (int i = 0; i < rec->nreq; i++) {
        bool d = false;
        CH_TRY(ch_mpi_test_p2p(ps->g, &rec->req[i], &d, err));
        if (!d && waiting_for < 0) waiting_for = rec->dest[i];
    }
    *done = waiting_for < 0;
    if (*done) {
        req->done = true;
        return CH_STATUS_OK;
    }
    if (ch_clock_s() - req->started > 2 * ps->cfg.timeout_s) {
        char msg[512], why[96];
        ch_mpi_timeout_words(ps->g, 2 * ps->cfg.timeout_s, why, sizeof why);
        snprintf(msg, sizeof msg, "%s: server rank %d did not take the gradients within %s: a server "
                 "is stuck or gone", req->what[0] ? req->what : "a push", waiting_for, why);
        ch_world_fatal(1, msg);
    }
    return CH_STATUS_OK;
}

static ch_status push_wait(ch_comm *c, ch_real *buf, size_t n, ch_err *err)
{
    ch_request req;
    CH_TRY(push_start(c, buf, n, &req, err));
    for (int round = 0;; round++) {
        bool done = false;
        CH_TRY(push_test(c, &req, &done, err));
        if (done) return CH_STATUS_OK;
        ch_poll_pause(round);
    }
}

static ch_status push_not_f64(ch_comm *c, double *buf, size_t n, ch_err *err)
{
    (void)c, (void)buf, (void)n;
    return ch_fail(err, CH_STATUS_SYSTEM, "the parameter servers' push communicator only sends gradients");
}

static ch_status push_no_broadcast(ch_comm *c, void *buf, size_t bytes, int root, ch_err *err)
{
    (void)c, (void)buf, (void)bytes, (void)root;
    return ch_fail(err, CH_STATUS_SYSTEM, "the parameter servers' push communicator only sends gradients");
}

static ch_status push_no_barrier(ch_comm *c, ch_err *err)
{
    (void)c;
    return ch_fail(err, CH_STATUS_SYSTEM, "the parameter servers' push communicator only sends gradients");
}

static void push_abort(ch_comm *c, const char *why)
{
    /* A local replica failed: the process ends the job (main's MPI_Abort); nothing waits on it here
     * that its own polls would not end. */
    (void)c, (void)why;
}

static const ch_comm_ops push_ops = {
    .name = "ps-push",
    .allreduce_sum = push_wait,
    .allreduce_sum_f64 = push_not_f64,
    .iallreduce_sum = push_start,
    .test = push_test,
    .broadcast = push_no_broadcast,
    .barrier = push_no_barrier,
    .abort = push_abort,
};

void ch_ps_comm_init(ch_comm *c, ch_ps *ps)
{
    *c = (ch_comm){ .ops = &push_ops, .rank = ps->rank, .size = ps->workers, .group = ps };
}

/* ---- pulls, claims, flushes ---- */

ch_status ch_ps_pull(ch_ps *ps, ch_real *params, ch_err *err)
{
    ch_request req[CH_PS_MAX_SERVERS];
    for (int s = 0; s < ps->cfg.servers; s++) {
        size_t lo, hi;
        ch_ps_shard(ps, ps->nparams, s, &lo, &hi);
        CH_TRY(ch_mpi_irecv(ps->g, params + lo, sizeof(ch_real) * (hi - lo), ps->workers + s, CH_PS_TAG_PARAMS,
                            &req[s], err));
    }
    for (int s = 0; s < ps->cfg.servers; s++) {
        char what[128];
        snprintf(what, sizeof what, "step %llu: the parameters of server rank %d",
                 (unsigned long long)ps->step + 1, ps->workers + s);
        CH_TRY(wait_for(ps, &req[s], what, err));
    }
    return CH_STATUS_OK;
}

/* A small message to server s and, when reply is given, its answer. */
static ch_status ask(ch_ps *ps, int s, int tag, int64_t value, int reply_tag, void *reply, size_t reply_bytes,
                     const char *what, ch_err *err)
{
    ch_request sreq, rreq;
    int64_t msg = value;
    const int dest = ps->workers + s;
    if (reply) CH_TRY(ch_mpi_irecv(ps->g, reply, reply_bytes, dest, reply_tag, &rreq, err));
    CH_TRY(ch_mpi_isend(ps->g, &msg, sizeof msg, dest, tag, &sreq, err));
    CH_TRY(wait_for(ps, &sreq, what, err));
    return reply ? wait_for(ps, &rreq, what, err) : CH_STATUS_OK;
}

ch_status ch_ps_claim(ch_ps *ps, int epoch, int64_t *unit, ch_err *err)
{
    char what[96];
    snprintf(what, sizeof what, "epoch %d: work from server rank %d", epoch + 1, ps->workers);
    return ask(ps, 0, CH_PS_TAG_CLAIM, epoch, CH_PS_TAG_UNIT, unit, sizeof *unit, what, err);
}

ch_status ch_ps_flush(ch_ps *ps, ch_real *params, ch_err *err)
{
    for (int s = 0; s < ps->cfg.servers; s++) {
        char what[96];
        snprintf(what, sizeof what, "the end of an epoch at server rank %d", ps->workers + s);
        CH_TRY(ask(ps, s, CH_PS_TAG_FLUSH, 0, 0, NULL, 0, what, err));
    }
    return ch_ps_pull(ps, params, err);
}

ch_status ch_ps_stop(ch_ps *ps, ch_err *err)
{
    for (int s = 0; s < ps->cfg.servers; s++)
        CH_TRY(ask(ps, s, CH_PS_TAG_STOP, 0, 0, NULL, 0, "the end of the run", err));
    return CH_STATUS_OK;
}

ch_status ch_ps_abandon(ch_ps *ps, ch_status why, ch_err *err)
{
    if (ps->rank != 0) return CH_STATUS_OK;
    for (int s = 0; s < ps->cfg.servers; s++)
        CH_TRY(ask(ps, s, CH_PS_TAG_ABANDON, why, 0, NULL, 0, "the news that the workers give up", err));
    return CH_STATUS_OK;
}

/* ---- the optimizer state's trips ---- */

/* Room for k buffers of the largest shard (host memory; the caller frees it). */
static ch_real *shard_buffers(const ch_ps *ps, int k)
{
    return malloc(sizeof(ch_real) * ((size_t)k * (ps->nparams / (size_t)ps->cfg.servers + 1) + 1));
}

ch_status ch_ps_put_state(ch_ps *ps, const ch_real *params, ch_real *const *state, int nstate, long steps,
                          ch_err *err)
{
    CH_ASSERT(nstate >= 0 && nstate <= CH_OPTIM_MAX_STATE);
    const size_t P = ps->nparams;
    ch_real *buf = shard_buffers(ps, 1 + nstate);
    CH_CHECK_ALLOC(err, buf);
    ch_status st = CH_STATUS_OK;
    for (int s = 0; s < ps->cfg.servers && st == CH_STATUS_OK; s++) {
        size_t lo, hi;
        ch_ps_shard(ps, P, s, &lo, &hi);
        const size_t n = hi - lo;
        ch_ps_state_hdr hdr = { .nparams = P, .steps = steps, .nstate = nstate };
        memcpy(buf, params + lo, sizeof(ch_real) * n);
        for (int b = 0; b < nstate; b++) memcpy(buf + (size_t)(b + 1) * n, state[b] + lo, sizeof(ch_real) * n);
        ch_request rh, rd, ra;
        int64_t ack;
        char what[96];
        snprintf(what, sizeof what, "parameters and optimizer state to server rank %d", ps->workers + s);
        st = ch_mpi_irecv(ps->g, &ack, sizeof ack, ps->workers + s, CH_PS_TAG_ACK, &ra, err);
        if (st == CH_STATUS_OK) st = ch_mpi_isend(ps->g, &hdr, sizeof hdr, ps->workers + s, CH_PS_TAG_SET_HDR, &rh, err);
        if (st == CH_STATUS_OK)
            st = ch_mpi_isend(ps->g, buf, sizeof(ch_real) * (size_t)(1 + nstate) * n, ps->workers + s,
                              CH_PS_TAG_SET_DATA, &rd, err);
        if (st == CH_STATUS_OK) st = wait_for(ps, &rh, what, err);
        if (st == CH_STATUS_OK) st = wait_for(ps, &rd, what, err);
        /* Held: the server holds them before any worker may push again (the workers' barrier). */
        if (st == CH_STATUS_OK) st = wait_for(ps, &ra, what, err);
    }
    free(buf);
    return st;
}

ch_status ch_ps_get_state(ch_ps *ps, ch_real *const *state, int nstate, long *steps, ch_err *err)
{
    const size_t P = ps->nparams;
    ch_real *buf = shard_buffers(ps, nstate);
    CH_CHECK_ALLOC(err, buf);
    ch_status st = CH_STATUS_OK;
    for (int s = 0; s < ps->cfg.servers && st == CH_STATUS_OK; s++) {
        size_t lo, hi;
        ch_ps_shard(ps, P, s, &lo, &hi);
        const size_t n = hi - lo;
        ch_ps_state_hdr hdr;
        ch_request rh, rd;
        char what[96];
        snprintf(what, sizeof what, "the optimizer state of server rank %d", ps->workers + s);
        st = ch_mpi_irecv(ps->g, &hdr, sizeof hdr, ps->workers + s, CH_PS_TAG_STATE_HDR, &rh, err);
        if (st == CH_STATUS_OK)
            st = ch_mpi_irecv(ps->g, buf, sizeof(ch_real) * (size_t)nstate * n, ps->workers + s,
                              CH_PS_TAG_STATE_DATA, &rd, err);
        if (st == CH_STATUS_OK) st = ask(ps, s, CH_PS_TAG_GET, 0, 0, NULL, 0, what, err);
        if (st == CH_STATUS_OK) st = wait_for(ps, &rh, what, err);
        if (st == CH_STATUS_OK) st = wait_for(ps, &rd, what, err);
        if (st == CH_STATUS_OK && hdr.nstate != nstate)
            st = ch_fail(err, CH_STATUS_SYSTEM, "server rank %d holds %d optimizer state buffers, rank 0 %d",
                         ps->workers + s, hdr.nstate, nstate);
        for (int b = 0; st == CH_STATUS_OK && b < nstate; b++)
            memcpy(state[b] + lo, buf + (size_t)b * n, sizeof(ch_real) * n);
        if (st == CH_STATUS_OK && s == 0) *steps = (long)hdr.steps;
    }
    free(buf);
    return st;
}
