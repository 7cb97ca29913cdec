/* Buckets, their countdowns and the sync thread's queue. The queue is a ring of bucket indices
 * (each bucket enters it once per step, so nbuckets slots suffice). */
#include "train/gradsync.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"

typedef struct bucket {
    size_t lo, hi;          /* [lo, hi) of the flat gradient buffer */
    size_t pending;         /* elements not yet reported this step */
    bool queued;
    int64_t t_start;        /* when its sum started (trace) */
    int lane;               /* its trace lane while in flight */
    ch_event *ready;        /* its gradients are written (compute stream) */
    ch_event *summed;       /* its sums are back in replica memory (transfer stream) */
} bucket;

struct ch_gradsync {
    ch_comm *comm;
    const ch_backend *be;
    ch_real *grads;         /* replica memory */
    ch_real *mirror;        /* where the sums run when grads are not host memory (else NULL) */
    int nbuckets;
    bucket *buckets;        /* in sync order: buckets[0] holds the last parameters */
    int *queue;
    int head, tail;         /* queue[head..tail) waits for the sync thread (indices mod nbuckets) */
    ch_request *reqs;       /* reqs[out_head..out_tail): sums in flight, oldest first */
    int *inflight;          /* the bucket of each of reqs' slots */
    int out_head, out_tail;
    int done;               /* buckets summed this step */
    uint64_t step;
    ch_trace_track *trace, *trace_next; /* this step's track (sync thread only); the next step's */
    unsigned lanes_busy;    /* trace lanes holding a bucket in flight */
    ch_status status;
    ch_err err;
    bool quit;
    pthread_mutex_t mu;
    pthread_cond_t work, finished;
    pthread_t thread;
    bool started;
};

/* The span of bucket b's sum, from its start to now. */
static void trace_bucket(ch_gradsync *s, int b)
{
    if (!s->trace) return;
    char name[56];
    snprintf(name, sizeof name, "allreduce bucket %d of %d", b + 1, s->nbuckets);
    ch_trace_span_lane(s->trace, "sync", name, s->buckets[b].t_start,
                       (int64_t)((s->buckets[b].hi - s->buckets[b].lo) * sizeof(ch_real)), s->buckets[b].lane);
    s->lanes_busy &= ~(1u << s->buckets[b].lane);
}

/* The lowest trace lane with no bucket in flight (buckets overlap in time, not by nesting). */
static int take_lane(ch_gradsync *s)
{
    int lane = 0;
    while (lane < 31 && (s->lanes_busy >> lane & 1u)) lane++;
    s->lanes_busy |= 1u << lane;
    return lane;
}

static void record_failure(ch_gradsync *s, ch_status st, const ch_err *e)
{
    if (st != CH_STATUS_OK && s->status == CH_STATUS_OK) {
        s->status = st;
        s->err = *e;
    }
}

/* Where bucket b's sum runs: the gradients themselves once written, or their host mirror
 * (downloaded first, after they are written). */
static ch_real *sum_base(ch_gradsync *s, const bucket *b)
{
    if (!s->mirror) {
        ch_backend_event_sync(s->be, b->ready);
        return s->grads;
    }
    ch_backend_wait(s->be, CH_STREAM_TRANSFER, b->ready);
    ch_backend_download_async(s->be, CH_STREAM_TRANSFER, s->mirror + b->lo, s->grads + b->lo,
                              sizeof(ch_real) * (b->hi - b->lo));
    ch_backend_sync(s->be, CH_STREAM_TRANSFER);
    return s->mirror;
}

/* Bucket bi's sum is complete: back to replica memory from the mirror (the mirror's part is not
 * written again before the next step's download, which the same stream runs after this). */
static void sum_done(ch_gradsync *s, int bi)
{
    const bucket *b = &s->buckets[bi];
    if (!s->mirror || s->status != CH_STATUS_OK) return;
    ch_backend_upload_async(s->be, CH_STREAM_TRANSFER, s->grads + b->lo, s->mirror + b->lo,
                            sizeof(ch_real) * (b->hi - b->lo));
    ch_backend_record(s->be, b->summed, CH_STREAM_TRANSFER);
}

/* Call with mu held: the next queued bucket's sum is started (nonblocking where the communicator
 * can: MPI between processes), and joins the in-flight list unless it completed at once. */
static void start_next(ch_gradsync *s)
{
    const int bi = s->queue[s->head % s->nbuckets];
    const bucket *b = &s->buckets[bi];
    s->head++;
    const bool failed = s->status != CH_STATUS_OK;
    snprintf(s->comm->what, sizeof s->comm->what, "step %llu, gradient bucket %d of %d",
             (unsigned long long)s->step + 1, bi + 1, s->nbuckets);
    s->comm->at = b->lo;
    ch_request *req = &s->reqs[s->out_tail % s->nbuckets];
    s->buckets[bi].t_start = s->trace ? ch_trace_now() : 0;
    if (s->trace) s->buckets[bi].lane = take_lane(s);
    s->inflight[s->out_tail % s->nbuckets] = bi;
    pthread_mutex_unlock(&s->mu);
    ch_err e;
    ch_status st = CH_STATUS_OK;
    if (failed) req->done = true;
    else st = ch_comm_iallreduce_sum(s->comm, sum_base(s, b) + b->lo, b->hi - b->lo, req, &e);
    pthread_mutex_lock(&s->mu);
    record_failure(s, st, &e);
    if (st != CH_STATUS_OK || req->done) {
        sum_done(s, bi);
        trace_bucket(s, bi);
        s->done++;
        pthread_cond_signal(&s->finished);
    } else {
        s->out_tail++;
    }
}

/* Call with mu held: test the oldest sum in flight; true when it has completed (or failed). */
static bool test_oldest(ch_gradsync *s)
{
    ch_request *req = &s->reqs[s->out_head % s->nbuckets];
    pthread_mutex_unlock(&s->mu);
    ch_err e;
    bool done = false;
    ch_status st = ch_comm_test(s->comm, req, &done, &e);
    pthread_mutex_lock(&s->mu);
    record_failure(s, st, &e);
    if (!done && st == CH_STATUS_OK) return false;
    sum_done(s, s->inflight[s->out_head % s->nbuckets]);
    trace_bucket(s, s->inflight[s->out_head % s->nbuckets]);
    s->out_head++;
    s->done++;
    pthread_cond_signal(&s->finished);
    return true;
}

/* The sync thread: starts every bucket as soon as it is queued, and completes them in order. */
static void *sync_main(void *p)
{
    ch_gradsync *s = p;
    int round = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->head == s->tail && s->out_head == s->out_tail && !s->quit)
            pthread_cond_wait(&s->work, &s->mu);
        if (s->quit) break;
        if (s->head != s->tail) {
            start_next(s);
            round = 0;
            continue;
        }
        if (test_oldest(s)) {
            round = 0;
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        ch_poll_pause(round++);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Cut the parameters into buckets of whole tensors, last tensor first. */
static ch_status make_buckets(ch_gradsync *s, const ch_model *m, size_t cap, ch_err *err)
{
    s->buckets = calloc((size_t)m->ntensors + 1, sizeof *s->buckets);
    s->queue = calloc((size_t)m->ntensors + 1, sizeof *s->queue);
    s->reqs = calloc((size_t)m->ntensors + 1, sizeof *s->reqs);
    s->inflight = calloc((size_t)m->ntensors + 1, sizeof *s->inflight);
    CH_CHECK_ALLOC(err, s->inflight);
    CH_CHECK_ALLOC(err, s->buckets);
    CH_CHECK_ALLOC(err, s->queue);
    CH_CHECK_ALLOC(err, s->reqs);
    size_t hi = m->nparams, lo = m->nparams;
    for (int i = m->ntensors - 1; i >= 0; i--) {
        const ch_tensor_ref *t = &m->tensors[i];
        if (t->kind != CH_TENSOR_PARAM) continue;
        lo = t->spec->offset;
        if (hi - lo >= cap) {
            s->buckets[s->nbuckets++] = (bucket){ .lo = lo, .hi = hi };
            hi = lo;
        }
    }
    if (hi > 0 || s->nbuckets == 0) s->buckets[s->nbuckets++] = (bucket){ .lo = 0, .hi = hi };
    return CH_STATUS_OK;
}

ch_status ch_gradsync_create(ch_comm *comm, ch_model *m, size_t bucket_elems, ch_gradsync **out,
                             ch_err *err)
{
    ch_gradsync *s = calloc(1, sizeof *s);
    CH_CHECK_ALLOC(err, s);
    s->comm = comm;
    s->be = m->be;
    s->grads = m->grads;
    if (ch_comm_stages(comm, m->be)) {
        s->mirror = ch_backend_host_alloc(m->be, sizeof(ch_real) * (m->nparams + 1));
        if (!s->mirror) {
            free(s);
            return CH_SYS_FAIL(err, "allocation of a gradient mirror");
        }
    }
    if (pthread_mutex_init(&s->mu, NULL) != 0 || pthread_cond_init(&s->work, NULL) != 0 ||
        pthread_cond_init(&s->finished, NULL) != 0) {
        ch_backend_host_free(m->be, s->mirror);
        free(s);
        return CH_SYS_FAIL(err, "gradsync mutex/cond init");
    }
    ch_status st = make_buckets(s, m, bucket_elems ? bucket_elems : 1, err);
    for (int b = 0; st == CH_STATUS_OK && b < s->nbuckets && ch_backend_async(s->be); b++) {
        s->buckets[b].ready = ch_backend_event(s->be);
        s->buckets[b].summed = ch_backend_event(s->be);
        if (!s->buckets[b].ready || !s->buckets[b].summed) st = CH_SYS_FAIL(err, "creation of a bucket's events");
    }
    if (st == CH_STATUS_OK && pthread_create(&s->thread, NULL, sync_main, s) != 0)
        st = CH_SYS_FAIL(err, "pthread_create of a gradient sync thread");
    s->started = st == CH_STATUS_OK;
    if (st != CH_STATUS_OK) {
        ch_gradsync_free(s);
        return st;
    }
    *out = s;
    return CH_STATUS_OK;
}

void ch_gradsync_begin(ch_gradsync *s, uint64_t step)
{
    pthread_mutex_lock(&s->mu);
    s->step = step;
    s->trace = s->trace_next;
    for (int i = 0; i < s->nbuckets; i++) {
        s->buckets[i].pending = s->buckets[i].hi - s->buckets[i].lo;
        s->buckets[i].queued = false;
    }
    s->head = s->tail = s->done = s->out_head = s->out_tail = 0;
    s->lanes_busy = 0;
    pthread_mutex_unlock(&s->mu);
}

/* Call with mu held. */
static void enqueue(ch_gradsync *s, int b)
{
    s->buckets[b].queued = true;
    s->queue[s->tail % s->nbuckets] = b;
    s->tail++;
    pthread_cond_signal(&s->work);
}

void ch_gradsync_ready(void *user, size_t offset, size_t count)
{
    ch_gradsync *s = user;
    /* Buckets are in decreasing offset order; models have tens of them at most. */
    int b = 0;
    while (b < s->nbuckets - 1 && offset < s->buckets[b].lo) b++;
    pthread_mutex_lock(&s->mu);
    bucket *k = &s->buckets[b];
    k->pending = count < k->pending ? k->pending - count : 0;
    if (k->pending == 0 && !k->queued) {
        ch_backend_record(s->be, k->ready, CH_STREAM_COMPUTE);   /* before the sync thread sees it */
        enqueue(s, b);
    }
    pthread_mutex_unlock(&s->mu);
}

ch_status ch_gradsync_finish(ch_gradsync *s, ch_err *err)
{
    pthread_mutex_lock(&s->mu);
    for (int b = 0; b < s->nbuckets; b++)
        if (!s->buckets[b].queued) {
            ch_backend_record(s->be, s->buckets[b].ready, CH_STREAM_COMPUTE);
            enqueue(s, b);
        }
    while (s->done < s->nbuckets) pthread_cond_wait(&s->finished, &s->mu);
    ch_status st = s->status;
    /* What runs next on the compute stream (the optimizer) reads the sums. */
    for (int b = 0; b < s->nbuckets && st == CH_STATUS_OK; b++)
        ch_backend_wait(s->be, CH_STREAM_COMPUTE, s->buckets[b].summed);
    if (st != CH_STATUS_OK && err) *err = s->err;
    pthread_mutex_unlock(&s->mu);
    return st;
}

int ch_gradsync_buckets(const ch_gradsync *s) { return s->nbuckets; }

bool ch_comm_stages(const ch_comm *c, const ch_backend *be)
{
    if (be->ops->host_visible) return false;
    return !(c->ops->device_memory && strcmp(c->ops->device_memory, be->ops->name) == 0);
}

void ch_gradsync_set_trace(ch_gradsync *s, ch_trace_track *track)
{
    pthread_mutex_lock(&s->mu);
    s->trace_next = track;
    pthread_mutex_unlock(&s->mu);
}

void ch_gradsync_free(ch_gradsync *s)
{
    if (!s) return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->quit = true;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->finished);
    for (int b = 0; s->buckets && b < s->nbuckets; b++) {
        ch_backend_event_free(s->be, s->buckets[b].ready);
        ch_backend_event_free(s->be, s->buckets[b].summed);
    }
    free(s->buckets);
    free(s->queue);
    free(s->reqs);
    free(s->inflight);
    if (s->mirror) ch_backend_host_free(s->be, s->mirror);
    free(s);
}
