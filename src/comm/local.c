/* The local communicator: replica threads of one process, through shared memory.
 * allreduce is a reduce-scatter and an allgather fused in one pass: each member publishes its buffer,
 * then member r owns chunk r of the index range, sums that chunk over all members' buffers (always in
 * member order 0..D-1, so every member ends with the same bits) and writes the sum back into every
 * member's buffer. The work and the memory traffic are spread over all members, and chunks are
 * disjoint, so no locks are needed between the two barriers that frame the pass.
 * The barrier spins briefly on an atomic generation counter (members of a step arrive within
 * microseconds of each other, and a futex sleep and wake costs tens of microseconds), then sleeps on
 * a condition variable. It never spins when members outnumber the cores, where spinning would take
 * the core from the member being waited for. An abort flag releases every waiting member, so that
 * a failed member never leaves the others waiting. */
#include "comm/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort.h"

/* About 20-50 microseconds of pause instructions on current x86 cores. */
enum { SPIN_ITERATIONS = 4000 };

struct ch_local_group {
    int size;
    int spin;               /* iterations to spin before sleeping */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int arrived;
    atomic_ulong generation;
    atomic_int aborted;
    char why[256];          /* written under mu before aborted is set */
    void **bufs;            /* published buffers, one per member */
};

static ch_status aborted_status(struct ch_local_group *g, ch_err *err)
{
    pthread_mutex_lock(&g->mu);
    ch_status st = ch_fail(err, CH_STATUS_SYSTEM, "local communicator aborted: %s", g->why);
    pthread_mutex_unlock(&g->mu);
    return st;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Wait until all members arrive (or the group is aborted). */
static ch_status group_barrier(struct ch_local_group *g, ch_err *err)
{
    if (atomic_load(&g->aborted)) return aborted_status(g, err);
    /* We have not arrived yet, so this barrier's generation cannot have moved on. */
    const unsigned long gen = atomic_load_explicit(&g->generation, memory_order_acquire);
    if (atomic_fetch_add(&g->arrived, 1) + 1 == g->size) {
        atomic_store(&g->arrived, 0);
        pthread_mutex_lock(&g->mu);
        atomic_store_explicit(&g->generation, gen + 1, memory_order_release);
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        return CH_STATUS_OK;
    }
    for (int i = 0; i < g->spin; i++) {
        if (atomic_load_explicit(&g->generation, memory_order_acquire) != gen) return CH_STATUS_OK;
        if (atomic_load_explicit(&g->aborted, memory_order_relaxed)) break;
        cpu_relax();
    }
    pthread_mutex_lock(&g->mu);
    while (atomic_load(&g->generation) == gen && !atomic_load(&g->aborted))
        pthread_cond_wait(&g->cv, &g->mu);
    const bool passed = atomic_load(&g->generation) != gen;
    pthread_mutex_unlock(&g->mu);
    return passed ? CH_STATUS_OK : aborted_status(g, err);
}

static ch_status local_barrier(ch_comm *c, ch_err *err) { return group_barrier(c->group, err); }

static void chunk_of(size_t n, int size, int rank, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)rank / (size_t)size;
    *hi = n * (size_t)(rank + 1) / (size_t)size;
}

/* One pass of the fused reduce-scatter + allgather over element type T, between the two barriers
 * that frame it. Block by block through a small stack buffer, so every loop is contiguous and
 * vectorises. */
#define DEFINE_ALLREDUCE(fname, T)                                                            \
    static ch_status fname(ch_comm *c, T *buf, size_t n, ch_err *err)                         \
    {                                                                                         \
        struct ch_local_group *g = c->group;                                                  \
        if (g->size == 1) return atomic_load(&g->aborted) ? aborted_status(g, err) : CH_STATUS_OK; \
        g->bufs[c->rank] = buf;                                                               \
        CH_TRY(group_barrier(g, err));                                                        \
        size_t lo, hi;                                                                        \
        chunk_of(n, g->size, c->rank, &lo, &hi);                                              \
        enum { BLOCK = 2048 };                                                                \
        T acc[BLOCK];                                                                         \
        for (size_t b = lo; b < hi; b += BLOCK) {                                             \
            const size_t len = hi - b < BLOCK ? hi - b : BLOCK;                               \
            memcpy(acc, (T *)g->bufs[0] + b, sizeof(T) * len);                                \
            for (int m = 1; m < g->size; m++) {                                               \
                const T *src = (const T *)g->bufs[m] + b;                                     \
                for (size_t i = 0; i < len; i++) acc[i] += src[i];                            \
            }                                                                                 \
            for (int m = 0; m < g->size; m++) memcpy((T *)g->bufs[m] + b, acc, sizeof(T) * len); \
        }                                                                                     \
        /* Nobody may reuse its buffer before every chunk is written. */                      \
        return group_barrier(g, err);                                                         \
    }

DEFINE_ALLREDUCE(local_allreduce_sum, ch_real)
DEFINE_ALLREDUCE(local_allreduce_sum_f64, double)

ch_status ch_local_broadcast_bytes(ch_comm *c, void *buf, size_t bytes, int root, ch_err *err)
{
    struct ch_local_group *g = c->group;
    if (root < 0 || root >= g->size)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "broadcast root %d outside 0..%d", root, g->size - 1);
    if (g->size == 1) return atomic_load(&g->aborted) ? aborted_status(g, err) : CH_STATUS_OK;
    g->bufs[c->rank] = buf;
    CH_TRY(group_barrier(g, err));
    if (c->rank != root) memcpy(buf, g->bufs[root], bytes);
    return group_barrier(g, err);
}

static void local_abort(ch_comm *c, const char *why)
{
    struct ch_local_group *g = c->group;
    pthread_mutex_lock(&g->mu);
    if (!atomic_load(&g->aborted)) {
        snprintf(g->why, sizeof g->why, "member %d: %s", c->rank, why);
        atomic_store(&g->aborted, 1);
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static const ch_comm_ops local_ops = {
    .name = "local",
    .allreduce_sum = local_allreduce_sum,
    .allreduce_sum_f64 = local_allreduce_sum_f64,
    .broadcast = ch_local_broadcast_bytes,
    .barrier = local_barrier,
    .abort = local_abort,
};

ch_status ch_local_group_create(int size, ch_local_group **out, ch_err *err)
{
    if (size < 1 || size > 1024)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "local group of %d members, expected 1..1024", size);
    struct ch_local_group *g = calloc(1, sizeof *g);
    CH_CHECK_ALLOC(err, g);
    g->bufs = calloc((size_t)size, sizeof *g->bufs);
    if (!g->bufs) {
        free(g);
        return CH_SYS_FAIL(err, "calloc of local group");
    }
    g->size = size;
    g->spin = size <= ch_cpu_count() ? SPIN_ITERATIONS : 0;
    if (pthread_mutex_init(&g->mu, NULL) != 0 || pthread_cond_init(&g->cv, NULL) != 0) {
        free(g->bufs);
        free(g);
        return CH_SYS_FAIL(err, "pthread mutex/cond init");
    }
    *out = g;
    return CH_STATUS_OK;
}

void ch_local_comm_init(ch_comm *c, ch_local_group *g, int rank)
{
    CH_ASSERT(rank >= 0 && rank < g->size);
    *c = (ch_comm){ .ops = &local_ops, .rank = rank, .size = g->size, .group = g };
}

void ch_local_group_free(ch_local_group *g)
{
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->bufs);
    free(g);
}
