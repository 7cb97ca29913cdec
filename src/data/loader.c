/* The threaded batch loader (see loader.h). One mutex guards the ring; workers drop it while they
 * decode. */
#include "data/loader.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"

typedef struct slot {
    ch_real *x;
    int32_t *labels;
    int batch;          /* the batch this slot is filled with or waits for */
    int done;           /* samples of it written */
} slot;

struct ch_loader {
    int workers;
    size_t sample_elems;
    slot slots[CH_LOADER_DEPTH];
    pthread_t threads[CH_LOADER_MAX_WORKERS];
    int running;        /* threads started */
    pthread_mutex_t lock;
    pthread_cond_t ready, space;
    /* the epoch being loaded */
    const ch_augment *aug;
    const ch_dataset *data;
    uint64_t seed;
    int epoch;
    const ch_loader_batch *batches;
    int nbatches;
    int claim_batch, claim_pos; /* the next samples a worker takes */
    int next;                   /* the batch the consumer takes next */
    bool stop, failed;
    ch_status status;
    ch_err err;
    double wait_s;
};

ch_status ch_loader_create(int workers, int max_batch, size_t sample_elems, ch_loader **out, ch_err *err)
{
    if (workers < 1 || workers > CH_LOADER_MAX_WORKERS)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "-j %d: expected 0..%d loader workers", workers, CH_LOADER_MAX_WORKERS);
    ch_loader *l = calloc(1, sizeof *l);
    CH_CHECK_ALLOC(err, l);
    l->workers = workers;
    l->sample_elems = sample_elems;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->ready, NULL);
    pthread_cond_init(&l->space, NULL);
    bool ok = true;
    for (int i = 0; i < CH_LOADER_DEPTH; i++) {
        l->slots[i].x = malloc((size_t)max_batch * sample_elems * sizeof(ch_real));
        l->slots[i].labels = malloc((size_t)max_batch * sizeof(int32_t));
        ok = ok && l->slots[i].x && l->slots[i].labels;
    }
    if (!ok) {
        ch_loader_free(l);
        return CH_SYS_FAIL(err, "allocation of the loader's batch buffers");
    }
    *out = l;
    return CH_STATUS_OK;
}

/* Samples a worker claims at once: one file (decoding dominates), or a run of in-memory samples
 * (gathering one costs about as much as taking the lock). */
static int chunk_for(const ch_dataset *d)
{
    return d->folder ? 1 : 64;
}

static void fail_locked(ch_loader *l, ch_status st, const ch_err *err)
{
    if (!l->failed) {
        l->failed = true;
        l->status = st;
        l->err = *err;
    }
    pthread_cond_broadcast(&l->ready);
    pthread_cond_broadcast(&l->space);
}

static void *work(void *arg)
{
    ch_loader *l = arg;
    const int chunk = chunk_for(l->data);
    pthread_mutex_lock(&l->lock);
    while (!l->stop && !l->failed && l->claim_batch < l->nbatches) {
        const int k = l->claim_batch;
        slot *s = &l->slots[k % CH_LOADER_DEPTH];
        if (s->batch != k) {    /* the ring is full: wait for the consumer */
            pthread_cond_wait(&l->space, &l->lock);
            continue;
        }
        const ch_loader_batch *b = &l->batches[k];
        const int lo = l->claim_pos, cnt = b->count - lo < chunk ? b->count - lo : chunk;
        l->claim_pos += cnt;
        if (l->claim_pos >= b->count) {
            l->claim_batch++;
            l->claim_pos = 0;
        }
        ch_status st = CH_STATUS_OK;
        ch_err err;
        if (cnt > 0) {
            pthread_mutex_unlock(&l->lock);
            st = ch_augment_gather(l->aug, l->data, b->idx + lo, cnt, true, l->seed, l->epoch,
                                   s->x + (size_t)lo * l->sample_elems, s->labels + lo, &err);
            pthread_mutex_lock(&l->lock);
        }
        if (st != CH_STATUS_OK) {
            fail_locked(l, st, &err);
            break;
        }
        s->done += cnt;
        if (s->done == b->count) pthread_cond_broadcast(&l->ready);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

ch_status ch_loader_start(ch_loader *l, const ch_augment *a, const ch_dataset *d, uint64_t seed, int epoch,
                          const ch_loader_batch *batches, int nbatches, ch_err *err)
{
    CH_ASSERT(l->running == 0);
    l->aug = a;
    l->data = d;
    l->seed = seed;
    l->epoch = epoch;
    l->batches = batches;
    l->nbatches = nbatches;
    l->claim_batch = l->claim_pos = l->next = 0;
    l->stop = l->failed = false;
    for (int i = 0; i < CH_LOADER_DEPTH; i++) l->slots[i] = (slot){ l->slots[i].x, l->slots[i].labels, i, 0 };
    for (int i = 0; i < l->workers; i++) {
        if (pthread_create(&l->threads[i], NULL, work, l) != 0) {
            ch_loader_stop(l);
            return CH_SYS_FAIL(err, "start of a loader thread");
        }
        l->running++;
    }
    return CH_STATUS_OK;
}

ch_status ch_loader_next(ch_loader *l, const ch_real **x, const int32_t **labels, ch_err *err)
{
    pthread_mutex_lock(&l->lock);
    CH_ASSERT(l->next < l->nbatches);
    const int k = l->next;
    slot *s = &l->slots[k % CH_LOADER_DEPTH];
    const double t0 = ch_clock_s();
    while (!l->failed && !(s->batch == k && s->done == l->batches[k].count)) pthread_cond_wait(&l->ready, &l->lock);
    l->wait_s += ch_clock_s() - t0;
    const bool failed = l->failed;
    if (failed) *err = l->err;
    const ch_status st = l->status;
    pthread_mutex_unlock(&l->lock);
    if (failed) return st;
    *x = s->x;
    *labels = s->labels;
    return CH_STATUS_OK;
}

void ch_loader_release(ch_loader *l)
{
    pthread_mutex_lock(&l->lock);
    slot *s = &l->slots[l->next % CH_LOADER_DEPTH];
    s->batch = l->next + CH_LOADER_DEPTH;
    s->done = 0;
    l->next++;
    pthread_cond_broadcast(&l->space);
    pthread_mutex_unlock(&l->lock);
}

void ch_loader_stop(ch_loader *l)
{
    pthread_mutex_lock(&l->lock);
    l->stop = true;
    pthread_cond_broadcast(&l->space);
    pthread_cond_broadcast(&l->ready);
    pthread_mutex_unlock(&l->lock);
    for (int i = 0; i < l->running; i++) pthread_join(l->threads[i], NULL);
    l->running = 0;
}

double ch_loader_take_wait_s(ch_loader *l)
{
    pthread_mutex_lock(&l->lock);
    const double w = l->wait_s;
    l->wait_s = 0;
    pthread_mutex_unlock(&l->lock);
    return w;
}

void ch_loader_free(ch_loader *l)
{
    if (!l) return;
    if (l->running) ch_loader_stop(l);
    for (int i = 0; i < CH_LOADER_DEPTH; i++) {
        free(l->slots[i].x);
        free(l->slots[i].labels);
    }
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->ready);
    pthread_cond_destroy(&l->space);
    free(l);
}
