/* A parameter server's loop: probe for the next message, act on it, until every worker has
 * stopped. It holds its shard of the parameters, the optimizer state of that shard, and one
 * gradient buffer per worker (a push's pieces arrive bucket by bucket; sync sums the workers' in
 * worker order once all are in, so the sum does not depend on who came first). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "core/clock.h"
#include "kernels/backend.h"
#include "train/ps_wire.h"

typedef struct server {
    ch_ps *ps;
    const ch_backend *be;
    int index, W;           /* which server (0-based); workers */
    size_t lo, n;           /* the shard */
    ch_real *params;        /* n */
    ch_real *sum;           /* n: sync's sum of the workers' gradients */
    ch_real **grads;        /* W x n: each worker's push of the step in progress */
    ch_real **out;          /* W x n, async: the parameters a worker's pull is answered with */
    size_t *got;            /* W: values of the push in progress received */
    double *lr;             /* W: the learning rate each push carries */
    uint64_t *step;         /* W: the step each push carries */
    long *clock;            /* W, async: pushes applied this epoch */
    bool *waiting;          /* W, async: pushed, pull not answered yet */
    bool *flushed;          /* W, async: done with the epoch */
    double *since;          /* W: when the worker's wait began (sync: the step's first push) */
    ch_request *sends;      /* W: the last parameters sent to each worker */
    bool started;           /* the first SET has come */
    double begun;           /* when serving began: the first SET is due within the timeout */
    ch_optim opt;
    bool opt_ready;
    int stopped;
    /* the first server: the epoch's units of work */
    int64_t units, next_unit;
    int unit_epoch;
    long updates;           /* applied this epoch, for the log */
    long lead;              /* async: the most pushes an answered worker was ahead of the slowest, this epoch */
} server;

static ch_status recv_from(server *sv, void *buf, size_t bytes, int source, int tag, const char *what,
                           ch_err *err)
{
    ch_request r;
    CH_TRY(ch_mpi_irecv(sv->ps->g, buf, bytes, source, tag, &r, err));
    return ch_mpi_wait(sv->ps->g, &r, sv->ps->cfg.timeout_s, what, err);
}

static ch_status wait_send(server *sv, int w, ch_err *err)
{
    return ch_mpi_wait(sv->ps->g, &sv->sends[w], 2 * sv->ps->cfg.timeout_s, "parameters to a worker", err);
}

/* The parameters to worker w, from buf (which must stay untouched until the send completes). */
static ch_status send_params(server *sv, int w, const ch_real *buf, ch_err *err)
{
    CH_TRY(wait_send(sv, w, err));
    return ch_mpi_isend(sv->ps->g, buf, sizeof(ch_real) * sv->n, w, CH_PS_TAG_PARAMS, &sv->sends[w], err);
}

static void free_rows(void **p, int rows)
{
    for (int i = 0; p && i < rows; i++) free(p[i]);
    free(p);
}

/* rows buffers of bytes each, or NULL (nothing left allocated). */
static void *alloc_rows(int rows, size_t bytes)
{
    void **p = calloc((size_t)rows, sizeof *p);
    for (int i = 0; p && i < rows; i++)
        if (!(p[i] = malloc(bytes ? bytes : 1))) {
            free_rows(p, rows);
            return NULL;
        }
    return p;
}

static ch_status allocate(server *sv, const ch_optim_config *oc, size_t nparams, ch_err *err)
{
    ch_ps_shard(sv->ps, nparams, sv->index, &sv->lo, &sv->n);
    sv->n -= sv->lo;
    const size_t bytes = sizeof(ch_real) * sv->n;
    const int W = sv->W;
    sv->params = ch_backend_alloc(sv->be, bytes);
    sv->sum = ch_backend_alloc(sv->be, bytes);
    sv->grads = alloc_rows(W, bytes);
    sv->out = sv->ps->cfg.mode == CH_PS_ASYNC ? alloc_rows(W, bytes) : NULL;
    sv->got = calloc((size_t)W, sizeof *sv->got);
    sv->lr = calloc((size_t)W, sizeof *sv->lr);
    sv->step = calloc((size_t)W, sizeof *sv->step);
    sv->clock = calloc((size_t)W, sizeof *sv->clock);
    sv->waiting = calloc((size_t)W, sizeof *sv->waiting);
    sv->flushed = calloc((size_t)W, sizeof *sv->flushed);
    sv->since = calloc((size_t)W, sizeof *sv->since);
    sv->sends = calloc((size_t)W, sizeof *sv->sends);
    if (!sv->params || !sv->sum || !sv->grads || (sv->ps->cfg.mode == CH_PS_ASYNC && !sv->out) || !sv->got ||
        !sv->lr || !sv->step || !sv->clock || !sv->waiting || !sv->flushed || !sv->since || !sv->sends)
        return ch_fail(err, CH_STATUS_SYSTEM, "out of memory for a parameter server's shard of %zu values", sv->n);
    for (int w = 0; w < W; w++) sv->sends[w].done = true;
    CH_TRY(ch_optim_init(&sv->opt, sv->n, oc, sv->be, err));
    sv->opt_ready = true;
    return CH_STATUS_OK;
}

static void server_free(server *sv)
{
    if (sv->opt_ready) ch_optim_free(&sv->opt);
    ch_backend_release(sv->be, sv->params);
    ch_backend_release(sv->be, sv->sum);
    free_rows((void **)sv->grads, sv->W);
    free_rows((void **)sv->out, sv->W);
    free(sv->got);
    free(sv->lr);
    free(sv->step);
    free(sv->clock);
    free(sv->waiting);
    free(sv->flushed);
    free(sv->since);
    free(sv->sends);
}

/* Rank 0's parameters (and optimizer state) for this shard: the start, or a checkpoint. */
static ch_status take_set(server *sv, const ch_optim_config *oc, int source, ch_err *err)
{
    ch_ps_state_hdr hdr;
    CH_TRY(recv_from(sv, &hdr, sizeof hdr, source, CH_PS_TAG_SET_HDR, "rank 0's parameters", err));
    if (!sv->started) CH_TRY(allocate(sv, oc, hdr.nparams, err));
    sv->started = true;
    if (hdr.nstate != 0 && hdr.nstate != sv->opt.nstate)
        return ch_fail(err, CH_STATUS_SYSTEM, "rank 0 sent %d optimizer state buffers, the optimizer has %d",
                       hdr.nstate, sv->opt.nstate);
    const size_t n = sv->n, bytes = sizeof(ch_real) * (size_t)(1 + hdr.nstate) * n;
    ch_real *buf = malloc(bytes ? bytes : 1);
    CH_CHECK_ALLOC(err, buf);
    ch_status st = recv_from(sv, buf, bytes, source, CH_PS_TAG_SET_DATA, "rank 0's parameters", err);
    if (st == CH_STATUS_OK) {
        ch_backend_upload(sv->be, sv->params, buf, sizeof(ch_real) * n);
        /* Without state the optimizer is a fresh one (dispatch made it anew for a later SET). */
        for (int b = 0; b < hdr.nstate; b++)
            ch_backend_upload(sv->be, sv->opt.state[b], buf + (size_t)(b + 1) * n, sizeof(ch_real) * n);
        sv->opt.steps = hdr.steps;
    }
    free(buf);
    if (st != CH_STATUS_OK) return st;
    const int64_t ack = 0;
    ch_request r;
    CH_TRY(ch_mpi_isend(sv->ps->g, &ack, sizeof ack, source, CH_PS_TAG_ACK, &r, err));
    return ch_mpi_wait(sv->ps->g, &r, 2 * sv->ps->cfg.timeout_s, "an acknowledgement", err);
}

/* A new optimizer of the shard restarts Adagrad's accumulator at its initial value: a SET without
 * state must do the same. */
static ch_status reset_state(server *sv, const ch_optim_config *oc, ch_err *err)
{
    ch_optim_free(&sv->opt);
    sv->opt_ready = false;
    CH_TRY(ch_optim_init(&sv->opt, sv->n, oc, sv->be, err));
    sv->opt_ready = true;
    return CH_STATUS_OK;
}

static ch_status answer_state(server *sv, int source, ch_err *err)
{
    int64_t dummy;
    CH_TRY(recv_from(sv, &dummy, sizeof dummy, source, CH_PS_TAG_GET, "a request", err));
    ch_ps_state_hdr hdr = { .nparams = sv->n, .steps = sv->opt.steps, .nstate = sv->opt.nstate };
    const size_t n = sv->n;
    ch_real *buf = malloc(sizeof(ch_real) * ((size_t)sv->opt.nstate * n + 1));
    CH_CHECK_ALLOC(err, buf);
    for (int b = 0; b < sv->opt.nstate; b++) ch_backend_download(sv->be, buf + (size_t)b * n, sv->opt.state[b], sizeof(ch_real) * n);
    ch_request rh, rd;
    ch_status st = ch_mpi_isend(sv->ps->g, &hdr, sizeof hdr, source, CH_PS_TAG_STATE_HDR, &rh, err);
    if (st == CH_STATUS_OK)
        st = ch_mpi_isend(sv->ps->g, buf, sizeof(ch_real) * (size_t)sv->opt.nstate * n, source, CH_PS_TAG_STATE_DATA,
                          &rd, err);
    if (st == CH_STATUS_OK) st = ch_mpi_wait(sv->ps->g, &rh, 2 * sv->ps->cfg.timeout_s, "the optimizer state", err);
    if (st == CH_STATUS_OK) st = ch_mpi_wait(sv->ps->g, &rd, 2 * sv->ps->cfg.timeout_s, "the optimizer state", err);
    free(buf);
    return st;
}

/* Sync: every worker's push of the step is in; sum in worker order, update, answer every pull. */
static ch_status complete_sync_step(server *sv, ch_err *err)
{
    const int W = sv->W;
    for (int w = 1; w < W; w++)
        if (sv->step[w] != sv->step[0])
            return ch_fail(err, CH_STATUS_SYSTEM, "workers 0 and %d pushed steps %llu and %llu at once", w,
                           (unsigned long long)sv->step[0] + 1, (unsigned long long)sv->step[w] + 1);
    const ch_kctx kc = ch_backend_kctx(sv->be);
    ch_backend_copy(sv->be, sv->sum, sv->grads[0], sizeof(ch_real) * sv->n);
    for (int w = 1; w < W; w++) sv->be->k->add(&kc, sv->n, sv->sum, sv->grads[w], sv->sum);
    ch_optim_step(&sv->opt, sv->lr[0], sv->params, sv->sum, 1);
    sv->updates++;
    for (int w = 0; w < W; w++) {
        sv->got[w] = 0;
        CH_TRY(send_params(sv, w, sv->params, err));
    }
    return CH_STATUS_OK;
}

/* Async: answer every held pull that the staleness bound now allows. */
static ch_status release_pulls(server *sv, ch_err *err)
{
    long slowest = -1;
    for (int w = 0; w < sv->W; w++)
        if (!sv->flushed[w] && (slowest < 0 || sv->clock[w] < slowest)) slowest = sv->clock[w];
    const int s = sv->ps->cfg.staleness;
    for (int w = 0; w < sv->W; w++) {
        if (!sv->waiting[w] || (s >= 0 && slowest >= 0 && sv->clock[w] - slowest > s)) continue;
        /* What the bound allowed, recorded as it happens (at the epoch's end the gap is gone). */
        if (slowest >= 0 && sv->clock[w] - slowest > sv->lead) sv->lead = sv->clock[w] - slowest;
        CH_TRY(wait_send(sv, w, err));
        ch_backend_download(sv->be, sv->out[w], sv->params, sizeof(ch_real) * sv->n);
        CH_TRY(send_params(sv, w, sv->out[w], err));
        sv->waiting[w] = false;
    }
    return CH_STATUS_OK;
}

static ch_status take_push(server *sv, int w, ch_err *err)
{
    ch_ps_push_hdr h;
    CH_TRY(recv_from(sv, &h, sizeof h, w, CH_PS_TAG_PUSH_HDR, "a push's header", err));
    if (h.lo < sv->lo || h.n > sv->n - (h.lo - sv->lo) || sv->got[w] + h.n > sv->n)
        return ch_fail(err, CH_STATUS_SYSTEM, "worker %d pushed values [%llu, %llu), outside this server's shard", w,
                       (unsigned long long)h.lo, (unsigned long long)(h.lo + h.n));
    CH_TRY(recv_from(sv, sv->grads[w] + (h.lo - sv->lo), sizeof(ch_real) * h.n, w, CH_PS_TAG_PUSH_DATA,
                     "a push's gradients", err));
    if (sv->got[w] == 0) sv->since[w] = ch_clock_s();
    sv->got[w] += h.n;
    sv->lr[w] = h.lr;
    sv->step[w] = h.step;
    if (sv->got[w] < sv->n) return CH_STATUS_OK;
    if (sv->ps->cfg.mode == CH_PS_SYNC) {
        for (int v = 0; v < sv->W; v++)
            if (sv->got[v] < sv->n) return CH_STATUS_OK;
        return complete_sync_step(sv, err);
    }
    ch_optim_step(&sv->opt, h.lr, sv->params, sv->grads[w], 1);
    sv->updates++;
    sv->got[w] = 0;
    sv->clock[w]++;
    sv->waiting[w] = true;
    sv->since[w] = ch_clock_s();
    return release_pulls(sv, err);
}

/* Async: worker w is done with the epoch; once all are, every one gets the same parameters. */
static ch_status take_flush(server *sv, int w, ch_err *err)
{
    int64_t dummy;
    CH_TRY(recv_from(sv, &dummy, sizeof dummy, w, CH_PS_TAG_FLUSH, "a flush", err));
    sv->flushed[w] = true;
    sv->since[w] = ch_clock_s();
    bool all = true;
    for (int v = 0; v < sv->W; v++) all = all && sv->flushed[v] && !sv->waiting[v] && sv->got[v] == 0;
    if (!all) return release_pulls(sv, err);
    char line[200];
    snprintf(line, sizeof line, "parameter server %d: epoch done, %ld updates, largest lead %ld, pushes per worker:",
             sv->index + 1, sv->updates, sv->lead);
    for (int v = 0; v < sv->W; v++) {
        const size_t len = strlen(line);
        snprintf(line + len, sizeof line - len, " %ld", sv->clock[v]);
    }
    ch_world_log(line);
    for (int v = 0; v < sv->W; v++) {
        sv->flushed[v] = false;
        sv->clock[v] = 0;
        CH_TRY(wait_send(sv, v, err));
        ch_backend_download(sv->be, sv->out[v], sv->params, sizeof(ch_real) * sv->n);
        CH_TRY(send_params(sv, v, sv->out[v], err));
    }
    sv->updates = 0;
    sv->lead = 0;
    return CH_STATUS_OK;
}

static ch_status take_claim(server *sv, int w, ch_err *err)
{
    int64_t epoch;
    CH_TRY(recv_from(sv, &epoch, sizeof epoch, w, CH_PS_TAG_CLAIM, "a claim", err));
    if (epoch != sv->unit_epoch) {
        sv->unit_epoch = (int)epoch;
        sv->next_unit = 0;
    }
    int64_t unit = sv->next_unit < sv->units ? sv->next_unit++ : -1;
    ch_request r;
    CH_TRY(ch_mpi_isend(sv->ps->g, &unit, sizeof unit, w, CH_PS_TAG_UNIT, &r, err));
    return ch_mpi_wait(sv->ps->g, &r, 2 * sv->ps->cfg.timeout_s, "a unit of work", err);
}

/* Nothing came for a while: past the timeout, name who the server has been waiting for. */
static void check_waits(server *sv)
{
    const double now = ch_clock_s(), limit = sv->ps->cfg.timeout_s;
    if (!sv->started) {
        /* Rank 0 sets up what the server was spared (its replicas, their plans): that is seconds. */
        if (now - sv->begun <= limit) return;
        char msg[256];
        snprintf(msg, sizeof msg, "parameter server %d: rank 0 sent no starting parameters within %g s (--timeout): "
                 "rank 0 is stuck or gone", sv->index + 1, limit);
        ch_world_fatal(1, msg);
    }
    char who[256] = "";
    const bool sync = sv->ps->cfg.mode == CH_PS_SYNC;
    bool any = false, late = false;
    /* Who waits: sync, the workers whose push of the step is in; async, those whose pull is held
     * (staleness) or who are done with the epoch. The ones named are those they wait for. */
    for (int w = 0; w < sv->W; w++) {
        const bool waits = sync ? sv->got[w] > 0 : sv->waiting[w] || sv->flushed[w];
        any = any || waits;
        if (waits) late = late || now - sv->since[w] > limit;
    }
    if (!any || !late) return;
    for (int w = 0; w < sv->W; w++) {
        const bool missing = sync ? sv->got[w] < sv->n : !sv->flushed[w] && !sv->waiting[w];
        const size_t len = strlen(who);
        if (missing) snprintf(who + len, sizeof who - len, "%s%d", len ? ", " : "", w);
    }
    char msg[512];
    snprintf(msg, sizeof msg, "parameter server %d: no gradients from worker rank%s %s within %g s (--timeout): "
             "a worker is stuck or gone", sv->index + 1, strchr(who, ',') ? "s" : "", who, limit);
    ch_world_fatal(1, msg);
}

/* Rank 0 says the workers end the job on an error each of them holds (rank 0 alone says it):
 * end with their status, quietly. */
static ch_status take_abandon(server *sv, int source, ch_err *err)
{
    if (source != 0) return ch_fail(err, CH_STATUS_SYSTEM, "an abandon from rank %d, not rank 0", source);
    int64_t why;
    CH_TRY(recv_from(sv, &why, sizeof why, source, CH_PS_TAG_ABANDON, "the workers' verdict", err));
    ch_status st = ch_fail(err, why == CH_STATUS_BAD_INPUT ? CH_STATUS_BAD_INPUT : CH_STATUS_SYSTEM,
                           "parameter server %d: the workers ended the job", sv->index + 1);
    err->on_every_rank = true;
    err->speaks = false;
    return st;
}

static ch_status dispatch(server *sv, const ch_optim_config *oc, const ch_mpi_msg *m, ch_err *err)
{
    if (m->tag == CH_PS_TAG_ABANDON) return take_abandon(sv, m->source, err);
    if (!sv->started && m->tag != CH_PS_TAG_SET_HDR)
        return ch_fail(err, CH_STATUS_SYSTEM, "rank %d spoke (tag %d) before rank 0 sent the parameters", m->source,
                       m->tag);
    if (m->source >= sv->W && m->tag != CH_PS_TAG_SET_HDR)
        return ch_fail(err, CH_STATUS_SYSTEM, "a message from rank %d, which is no worker", m->source);
    switch (m->tag) {
    case CH_PS_TAG_SET_HDR:
        if (m->source != 0) return ch_fail(err, CH_STATUS_SYSTEM, "parameters from rank %d, not rank 0", m->source);
        if (sv->started && sv->opt.nstate) CH_TRY(reset_state(sv, oc, err));
        return take_set(sv, oc, m->source, err);
    case CH_PS_TAG_PUSH_HDR: return take_push(sv, m->source, err);
    case CH_PS_TAG_FLUSH: return take_flush(sv, m->source, err);
    case CH_PS_TAG_CLAIM: return take_claim(sv, m->source, err);
    case CH_PS_TAG_GET: return answer_state(sv, m->source, err);
    case CH_PS_TAG_STOP: {
        int64_t dummy;
        CH_TRY(recv_from(sv, &dummy, sizeof dummy, m->source, CH_PS_TAG_STOP, "a stop", err));
        sv->stopped++;
        return CH_STATUS_OK;
    }
    default:
        return ch_fail(err, CH_STATUS_SYSTEM, "an unexpected message (tag %d) from rank %d", m->tag, m->source);
    }
}

ch_status ch_ps_serve(ch_ps *ps, const ch_optim_config *oc, int64_t units_per_epoch, ch_err *err)
{
    server sv = { .ps = ps, .be = ch_backend_host(), .index = ps->rank - ps->workers, .W = ps->workers,
                  .units = units_per_epoch, .unit_epoch = -1, .begun = ch_clock_s() };
    ch_status st = CH_STATUS_OK;
    for (int round = 0; st == CH_STATUS_OK && sv.stopped < sv.W;) {
        bool found = false;
        ch_mpi_msg m;
        st = ch_mpi_probe(ps->g, &found, &m, err);
        if (st != CH_STATUS_OK) break;
        if (found) {
            st = dispatch(&sv, oc, &m, err);
            round = 0;
            continue;
        }
        if ((round & 63) == 63) check_waits(&sv);
        ch_poll_pause(round++);
    }
    for (int w = 0; st == CH_STATUS_OK && w < sv.W && sv.sends; w++) st = wait_send(&sv, w, err);
    server_free(&sv);
    return st;
}
