/* COHORT_CUDA_PROFILE=1: the GPU time of each kind of kernel call, measured with CUDA events
 * around every call on its stream and printed at exit (one line per kind: calls, total ms, share).
 * For finding where a step's time goes on a GPU machine without a profiler; off, the table is the
 * plain one and nothing is recorded. One process-wide tally (a mutex per call): a measuring tool,
 * not a fast path. */
#include "kernels/cuda/cuda_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KINDS = 40, PENDING = 4096 };

typedef struct pending {
    cudaEvent_t a, b;
    int kind;
} pending;

static const char *names[KINDS];
static double total_ms[KINDS];
static long calls[KINDS];
static pending queue[PENDING];
static int npending;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void settle_all(void)
{
    for (int i = 0; i < npending; i++) {
        float ms = 0;
        if (cudaEventSynchronize(queue[i].b) == cudaSuccess && cudaEventElapsedTime(&ms, queue[i].a, queue[i].b) == cudaSuccess)
            total_ms[queue[i].kind] += ms;
        cudaEventDestroy(queue[i].a);
        cudaEventDestroy(queue[i].b);
    }
    npending = 0;
}

static void report(void)
{
    pthread_mutex_lock(&lock);
    settle_all();
    double sum = 0;
    for (int k = 0; k < KINDS; k++) sum += total_ms[k];
    fprintf(stderr, "cuda profile: %.1f ms of kernel time in all\n", sum);
    for (int k = 0; k < KINDS; k++)
        if (calls[k]) fprintf(stderr, "cuda profile: %-28s %8ld calls %10.1f ms %5.1f%%\n", names[k], calls[k], total_ms[k],
                              sum > 0 ? 100 * total_ms[k] / sum : 0);
    pthread_mutex_unlock(&lock);
}

static cudaEvent_t mark(cudaStream_t s)
{
    cudaEvent_t e;
    CU_CHECK(cudaEventCreate(&e));
    CU_CHECK(cudaEventRecord(e, s));
    return e;
}

/* Called around each call: begin returns the start event, end files the pair under kind. */
cudaEvent_t cu_profile_begin(const ch_kctx *kc) { return mark(cu_stream_of(kc)); }

void cu_profile_end(const ch_kctx *kc, int kind, const char *name, cudaEvent_t a)
{
    cudaEvent_t b = mark(cu_stream_of(kc));
    pthread_mutex_lock(&lock);
    static bool registered;
    if (!registered) {
        atexit(report);
        registered = true;
    }
    names[kind] = name;
    calls[kind]++;
    if (npending == PENDING) settle_all();
    queue[npending++] = (pending){ a, b, kind };
    pthread_mutex_unlock(&lock);
}
