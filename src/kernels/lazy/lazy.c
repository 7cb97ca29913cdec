/* The lazy backend: a test backend with the asynchronous interface of a GPU, run on the CPU.
 *
 * Its memory is the scramble backend's (stored XOR-scrambled, so the host cannot read it behind
 * the backend's back). Every kernel and memory operation is queued on a stream and nothing runs
 * when it is queued: one worker thread per backend runs queued work only when the host waits for
 * it (a stream or event sync, a blocking copy, a free), or when a queue grows past a bound, and
 * then only what the wait needs: the stream up to the awaited point and, through the waits queued
 * on it, whatever other streams that point depends on. Among the streams that may run next it
 * picks one at random (seeded by the device index), so independent streams interleave
 * differently from run to run of the code but identically for the same code.
 *
 * So a host read of a kernel's result, a download's buffer, a loss or a sum without the right
 * wait sees what was there before (work a GPU would still be doing), and a stream that reads
 * another's results without waiting on its event reads them before they are made. Correct code
 * gives the CPU backend's bits. */
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/lazy/lazy.h"

/* Past this many queued operations on a backend, work runs without a wait (bounded memory). */
enum { MAX_QUEUED = 4096, MAX_DEMANDS = 16 };

typedef enum op_kind { OP_CALL, OP_UPLOAD, OP_DOWNLOAD, OP_COPY, OP_ZERO, OP_RECORD, OP_WAIT } op_kind;

typedef struct lazy_event lazy_event;

typedef struct lazy_op {
    struct lazy_op *next;
    uint64_t seq;           /* its place in its stream, from 1 */
    op_kind kind;
    void *dst;              /* memory operations */
    const void *src;
    size_t bytes;
    lazy_event *ev;         /* record, wait */
    uint64_t value;         /* the record's count, or the one a wait waits for */
    int wstream;            /* a wait: where that record sits */
    uint64_t wseq;
    ch_lazy_call call;      /* OP_CALL */
} lazy_op;

typedef struct lazy_stream {
    struct lazy *lz;
    int index;
    lazy_op *head, *tail;
    uint64_t queued, done;  /* seq of the last queued and the last run operation */
} lazy_stream;

struct lazy_event {
    uint64_t recorded, completed;
    int stream;             /* the last record's stream and place */
    uint64_t seq;
};

typedef struct lazy {
    const ch_backend *be;
    pthread_mutex_t mu;
    pthread_cond_t work, progress;
    pthread_t worker;
    bool quit, started;
    lazy_stream streams[CH_STREAMS];
    struct { int stream; uint64_t seq; } demand[MAX_DEMANDS];
    int ndemands;
    size_t nqueued;
    uint64_t rng;
} lazy;

static lazy_stream *ls(ch_stream *s) { return (lazy_stream *)(void *)s; }

static uint64_t next_rand(lazy *lz)
{
    uint64_t z = (lz->rng += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static bool wait_complete(const lazy_op *op) { return op->ev->completed >= op->value; }

/* Call with mu held: how far each stream must run for the waits now pending, and what those
 * points wait for on other streams. */
static void needs(lazy *lz, uint64_t need[CH_STREAMS])
{
    const bool all = lz->quit || lz->nqueued > MAX_QUEUED;
    for (int s = 0; s < CH_STREAMS; s++) need[s] = all ? lz->streams[s].queued : 0;
    for (int d = 0; d < lz->ndemands; d++)
        if (need[lz->demand[d].stream] < lz->demand[d].seq) need[lz->demand[d].stream] = lz->demand[d].seq;
    for (int round = 0; round < CH_STREAMS; round++)
        for (int s = 0; s < CH_STREAMS; s++)
            for (const lazy_op *op = lz->streams[s].head; op && op->seq <= need[s]; op = op->next)
                if (op->kind == OP_WAIT && !wait_complete(op) && need[op->wstream] < op->wseq)
                    need[op->wstream] = op->wseq;
}

/* Call with mu held: the stream whose head runs next (chosen at random among those that may), or
 * -1 when nothing needed can run. */
static int pick(lazy *lz)
{
    uint64_t need[CH_STREAMS];
    needs(lz, need);
    int cand[CH_STREAMS], n = 0;
    for (int s = 0; s < CH_STREAMS; s++) {
        const lazy_op *h = lz->streams[s].head;
        if (h && h->seq <= need[s] && (h->kind != OP_WAIT || wait_complete(h))) cand[n++] = s;
    }
    return n ? cand[next_rand(lz) % (uint64_t)n] : -1;
}

static void execute(lazy *lz, const lazy_op *op)
{
    const ch_backend *be = lz->be;
    switch (op->kind) {
    case OP_CALL: op->call.run(&op->call.kc, op->call.args); break;
    case OP_UPLOAD: ch_scramble_ops.upload(be, op->dst, op->src, op->bytes); break;
    case OP_DOWNLOAD: ch_scramble_ops.download(be, op->dst, op->src, op->bytes); break;
    case OP_COPY: ch_scramble_ops.copy(be, op->dst, op->src, op->bytes); break;
    case OP_ZERO: ch_scramble_ops.zero(be, op->dst, op->bytes); break;
    case OP_RECORD: case OP_WAIT: break;
    }
}

static void *worker_main(void *p)
{
    lazy *lz = p;
    omp_set_num_threads(lz->be->nthreads);   /* oneDNN's GEMM threads by the caller's setting */
    pthread_mutex_lock(&lz->mu);
    for (;;) {
        int s;
        while ((s = pick(lz)) < 0) {
            if (lz->quit && lz->nqueued == 0) {
                pthread_mutex_unlock(&lz->mu);
                return NULL;
            }
            pthread_cond_wait(&lz->work, &lz->mu);
        }
        lazy_stream *st = &lz->streams[s];
        lazy_op *op = st->head;
        st->head = op->next;
        if (!st->head) st->tail = NULL;
        pthread_mutex_unlock(&lz->mu);
        execute(lz, op);
        pthread_mutex_lock(&lz->mu);
        st->done = op->seq;
        if (op->kind == OP_RECORD && op->ev->completed < op->value) op->ev->completed = op->value;
        lz->nqueued--;
        free(op);
        pthread_cond_broadcast(&lz->progress);
    }
}

static lazy *of(const ch_backend *be) { return be->ctx; }

/* Call with mu held. */
static void enqueue(lazy *lz, lazy_stream *st, lazy_op *op)
{
    op->seq = ++st->queued;
    if (st->tail) st->tail->next = op;
    else st->head = op;
    st->tail = op;
    if (++lz->nqueued > MAX_QUEUED) pthread_cond_signal(&lz->work);
}

static lazy_op *new_op(op_kind kind)
{
    lazy_op *op = calloc(1, sizeof *op);
    CH_ASSERT(op);   /* a few hundred bytes: the test backend gives up rather than lose work */
    op->kind = kind;
    return op;
}

static void queue(lazy_stream *st, lazy_op *op)
{
    lazy *lz = st->lz;
    pthread_mutex_lock(&lz->mu);
    enqueue(lz, st, op);
    pthread_mutex_unlock(&lz->mu);
}

void ch_lazy_queue_call(const ch_kctx *kc, void (*run)(const ch_kctx *kc, const void *args), const void *args,
                        size_t n)
{
    CH_ASSERT(kc->stream && n <= CH_LAZY_ARGS);
    lazy_op *op = new_op(OP_CALL);
    op->call.run = run;
    op->call.kc = *kc;
    memcpy(op->call.args, args, n);
    queue(ls(kc->stream), op);
}

/* Call with mu held: the host blocks until stream s has run through seq. */
static void demand(lazy *lz, int s, uint64_t seq, const lazy_event *ev, uint64_t value)
{
    CH_ASSERT(lz->ndemands < MAX_DEMANDS);
    const int d = lz->ndemands++;
    lz->demand[d].stream = s;
    lz->demand[d].seq = seq;
    pthread_cond_signal(&lz->work);
    while (ev ? ev->completed < value : lz->streams[s].done < seq) pthread_cond_wait(&lz->progress, &lz->mu);
    for (int i = 0; i < lz->ndemands; i++)
        if (lz->demand[i].stream == s && lz->demand[i].seq == seq) {
            lz->demand[i] = lz->demand[--lz->ndemands];
            break;
        }
}

static void lz_stream_sync(const ch_backend *be, ch_stream *s)
{
    lazy *lz = of(be);
    lazy_stream *st = ls(s);
    pthread_mutex_lock(&lz->mu);
    if (st->done < st->queued) demand(lz, st->index, st->queued, NULL, 0);
    pthread_mutex_unlock(&lz->mu);
}

static void sync_all(lazy *lz)
{
    for (int s = 0; s < CH_STREAMS; s++) lz_stream_sync(lz->be, (ch_stream *)(void *)&lz->streams[s]);
}

static void *lz_alloc(const ch_backend *be, size_t bytes) { return ch_scramble_ops.alloc(be, bytes); }

/* Work still queued may use p: all of it runs first. */
static void lz_free(const ch_backend *be, void *p)
{
    sync_all(of(be));
    ch_scramble_ops.free(be, p);
}

static void queue_mem(ch_stream *s, op_kind kind, void *dst, const void *src, size_t bytes)
{
    lazy_op *op = new_op(kind);
    op->dst = dst;
    op->src = src;
    op->bytes = bytes;
    queue(ls(s), op);
}

static void lz_upload_async(const ch_backend *be, ch_stream *s, void *dst, const void *src, size_t bytes)
{
    (void)be;
    queue_mem(s, OP_UPLOAD, dst, src, bytes);
}

static void lz_download_async(const ch_backend *be, ch_stream *s, void *dst, const void *src, size_t bytes)
{
    (void)be;
    queue_mem(s, OP_DOWNLOAD, dst, src, bytes);
}

static void lz_copy_async(const ch_backend *be, ch_stream *s, void *dst, const void *src, size_t bytes)
{
    (void)be;
    queue_mem(s, OP_COPY, dst, src, bytes);
}

static void lz_zero_async(const ch_backend *be, ch_stream *s, void *dst, size_t bytes)
{
    (void)be;
    queue_mem(s, OP_ZERO, dst, NULL, bytes);
}

/* The synchronous forms: queued on the compute stream, then waited for. */
static void lz_upload(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    lz_upload_async(be, be->streams[CH_STREAM_COMPUTE], dst, src, bytes);
    lz_stream_sync(be, be->streams[CH_STREAM_COMPUTE]);
}

static void lz_download(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    lz_download_async(be, be->streams[CH_STREAM_COMPUTE], dst, src, bytes);
    lz_stream_sync(be, be->streams[CH_STREAM_COMPUTE]);
}

static void lz_copy(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    lz_copy_async(be, be->streams[CH_STREAM_COMPUTE], dst, src, bytes);
    lz_stream_sync(be, be->streams[CH_STREAM_COMPUTE]);
}

static void lz_zero(const ch_backend *be, void *dst, size_t bytes)
{
    lz_zero_async(be, be->streams[CH_STREAM_COMPUTE], dst, bytes);
    lz_stream_sync(be, be->streams[CH_STREAM_COMPUTE]);
}

static ch_event *lz_event_create(const ch_backend *be)
{
    (void)be;
    lazy_event *e = calloc(1, sizeof *e);
    return (ch_event *)(void *)e;
}

static void lz_event_free(const ch_backend *be, ch_event *e)
{
    sync_all(of(be));   /* a queued record or wait may still point at it */
    free(e);
}

static void lz_record(const ch_backend *be, ch_event *ev, ch_stream *s)
{
    lazy *lz = of(be);
    lazy_event *e = (lazy_event *)(void *)ev;
    lazy_op *op = new_op(OP_RECORD);
    op->ev = e;
    pthread_mutex_lock(&lz->mu);
    op->value = ++e->recorded;
    enqueue(lz, ls(s), op);
    e->stream = ls(s)->index;
    e->seq = op->seq;
    pthread_mutex_unlock(&lz->mu);
}

static void lz_wait(const ch_backend *be, ch_stream *s, ch_event *ev)
{
    lazy *lz = of(be);
    lazy_event *e = (lazy_event *)(void *)ev;
    pthread_mutex_lock(&lz->mu);
    if (e->completed < e->recorded) {   /* an event never recorded, or already passed: nothing */
        lazy_op *op = new_op(OP_WAIT);
        op->ev = e;
        op->value = e->recorded;
        op->wstream = e->stream;
        op->wseq = e->seq;
        enqueue(lz, ls(s), op);
    }
    pthread_mutex_unlock(&lz->mu);
}

static void lz_event_sync(const ch_backend *be, ch_event *ev)
{
    lazy *lz = of(be);
    lazy_event *e = (lazy_event *)(void *)ev;
    pthread_mutex_lock(&lz->mu);
    if (e->completed < e->recorded) demand(lz, e->stream, e->seq, e, e->recorded);
    pthread_mutex_unlock(&lz->mu);
}

static bool lz_query(const ch_backend *be, ch_event *ev)
{
    lazy *lz = of(be);
    const lazy_event *e = (const lazy_event *)(const void *)ev;
    pthread_mutex_lock(&lz->mu);
    const bool done = e->completed >= e->recorded;
    pthread_mutex_unlock(&lz->mu);
    return done;
}

static void lz_start(ch_backend *be)
{
    lazy *lz = calloc(1, sizeof *lz);
    if (!lz) return;
    lz->be = be;
    lz->rng = 0x2545f4914f6cdd1du ^ (uint64_t)be->device;
    for (int s = 0; s < CH_STREAMS; s++) {
        lz->streams[s] = (lazy_stream){ .lz = lz, .index = s };
        be->streams[s] = (ch_stream *)(void *)&lz->streams[s];
    }
    if (pthread_mutex_init(&lz->mu, NULL) != 0 || pthread_cond_init(&lz->work, NULL) != 0 ||
        pthread_cond_init(&lz->progress, NULL) != 0 || pthread_create(&lz->worker, NULL, worker_main, lz) != 0) {
        free(lz);
        return;
    }
    be->ctx = lz;
}

static void lz_stop(ch_backend *be)
{
    lazy *lz = of(be);
    if (!lz) return;
    pthread_mutex_lock(&lz->mu);
    lz->quit = true;   /* the worker runs what is left, then ends */
    pthread_cond_signal(&lz->work);
    pthread_mutex_unlock(&lz->mu);
    pthread_join(lz->worker, NULL);
    pthread_mutex_destroy(&lz->mu);
    pthread_cond_destroy(&lz->work);
    pthread_cond_destroy(&lz->progress);
    free(lz);
    be->ctx = NULL;
}

const ch_backend_ops ch_lazy_ops = {
    .name = "lazy", .host_visible = false, .alloc = lz_alloc, .free = lz_free,
    .upload = lz_upload, .download = lz_download, .copy = lz_copy, .zero = lz_zero,
    .start = lz_start, .stop = lz_stop,
    .upload_async = lz_upload_async, .download_async = lz_download_async,
    .copy_async = lz_copy_async, .zero_async = lz_zero_async,
    .event_create = lz_event_create, .event_free = lz_event_free, .record = lz_record, .wait = lz_wait,
    .event_sync = lz_event_sync, .query = lz_query, .stream_sync = lz_stream_sync,
};
