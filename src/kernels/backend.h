/* A backend: what one replica computes with, in the shape of ggml's backend interface.
 * It is a kernel table (kernels.h), a context made for the replica (threads; later a device and its
 * streams) and the memory operations through which everything else reaches the replica's memory.
 *
 * The contract. Replica memory (parameters, gradients, BatchNorm buffers, optimizer state,
 * activations, the batch, workspace) is allocated with ch_backend_alloc and is touched only by the
 * backend's kernels or through upload, download, zero and copy. Host code never dereferences it,
 * unless the backend says it is host memory (host_visible): then callers may skip a staging copy
 * (the CPU backend's sums over ranks read gradients in place). Kernel arguments that are tensors
 * (ch_real *, int32_t *) are replica memory; double results (statistics, losses) are host memory.
 *
 * The "scramble" backend (kernels/scramble/) keeps its memory XOR-scrambled and unscrambles only
 * inside its kernels and its upload/download: any code that reads or writes replica memory behind
 * the backend's back computes garbage, so tests run on it catch what a CUDA backend would break.
 * The "lazy" backend (kernels/lazy/) is scramble's memory behind streams whose work runs later, on
 * a worker thread, only when something waits for it: a result read without the right wait is
 * stale, as on a GPU. */
#ifndef CH_KERNELS_BACKEND_H
#define CH_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#include "core/status.h"
#include "kernels/kernels.h"

typedef struct ch_backend ch_backend;

/* A stream is a backend's queue of work, run in the order it was queued; an event is a point in a
 * stream that the host or another stream can wait for. Each backend instance has CH_STREAMS
 * streams: kernels and the blocking memory operations go on COMPUTE; the gradient sync's
 * downloads and uploads go on TRANSFER, ordered against COMPUTE by events only. */
typedef struct ch_stream ch_stream;
typedef struct ch_event ch_event;
enum { CH_STREAM_COMPUTE, CH_STREAM_TRANSFER, CH_STREAMS };

typedef struct ch_backend_ops {
    const char *name;
    bool host_visible;
    /* Replica memory of bytes bytes, zero; NULL when it cannot be had. free waits for the work
     * queued on the memory first. */
    void *(*alloc)(const ch_backend *be, size_t bytes);
    void (*free)(const ch_backend *be, void *p);
    /* host -> replica, replica -> host, replica -> replica (may not overlap), zero. These are the
     * synchronous forms, for a backend with no streams: the work is done when they return. */
    void (*upload)(const ch_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(const ch_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(const ch_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(const ch_backend *be, void *dst, size_t bytes);

    /* The asynchronous interface; NULL in a backend whose every call is complete when it returns
     * (cpu, scramble), for which the wrappers below run the synchronous forms and waits are
     * nothing. Queued memory operations read and write host memory when they run: the host
     * buffer of an upload must stay unchanged, and that of a download unread, until an event
     * after it has completed. */
    void (*start)(ch_backend *be);   /* make the streams (at create) */
    void (*stop)(ch_backend *be);    /* finish all queued work, drop the streams (at free) */
    void (*upload_async)(const ch_backend *be, ch_stream *s, void *dst, const void *src, size_t bytes);
    void (*download_async)(const ch_backend *be, ch_stream *s, void *dst, const void *src, size_t bytes);
    void (*copy_async)(const ch_backend *be, ch_stream *s, void *dst, const void *src, size_t bytes);
    void (*zero_async)(const ch_backend *be, ch_stream *s, void *dst, size_t bytes);
    ch_event *(*event_create)(const ch_backend *be);
    void (*event_free)(const ch_backend *be, ch_event *e);
    void (*record)(const ch_backend *be, ch_event *e, ch_stream *s);   /* e = the end of s now */
    void (*wait)(const ch_backend *be, ch_stream *s, ch_event *e);     /* s runs on after e only */
    void (*event_sync)(const ch_backend *be, ch_event *e);              /* the host waits for e */
    bool (*query)(const ch_backend *be, ch_event *e);                   /* e complete? */
    /* Host memory the device copies from and to at full speed (page-locked on a GPU); NULL:
     * plain malloc. What stages replica memory (the batch, the gradient mirror) is this. */
    void *(*host_alloc)(const ch_backend *be, size_t bytes);
    void (*host_free)(const ch_backend *be, void *p);
    void (*stream_sync)(const ch_backend *be, ch_stream *s);           /* the host waits for s */
} ch_backend_ops;

/* The kernels' workspace in a backend's memory: one per backend instance, grown to the largest any
 * model planned on it asks for (ch_backend_reserve_workspace). Its kernels run one at a time on
 * the compute stream, so the models of one backend can share it. */
typedef struct ch_workspace {
    ch_real *p;
    size_t len;   /* reals */
} ch_workspace;

struct ch_backend {
    const ch_backend_ops *ops;
    const ch_kernels *k;
    int nthreads;
    int device;                       /* the device's index in its kind */
    ch_stream *streams[CH_STREAMS];   /* NULL on a backend without streams */
    ch_workspace *ws;                 /* owned (ch_backend_host's is static) */
    void *ctx;                        /* the backend's own state */
    struct ch_kcache *kcache;         /* owned: what its kernels keep between calls (ch_kctx's
                                       * cache); NULL where they keep nothing (cuda) */
};

/* The backend called name ("cpu", "scramble", "lazy") for device index device and a replica of
 * nthreads threads. */
ch_status ch_backend_create(const char *name, int device, int nthreads, ch_backend **out, ch_err *err);
void ch_backend_free(ch_backend *be);
/* A process-wide CPU backend (one thread) for code with no replica: tools and tests. Its workspace
 * is shared: plan models on it from one thread only. */
const ch_backend *ch_backend_host(void);

static inline ch_stream *ch_backend_stream(const ch_backend *be, int which) { return be->streams[which]; }
static inline bool ch_backend_async(const ch_backend *be) { return be->ops->upload_async != NULL; }

static inline void *ch_backend_alloc(const ch_backend *be, size_t bytes)
{
    return be->ops->alloc(be, bytes ? bytes : 1);
}
static inline void ch_backend_release(const ch_backend *be, void *p)
{
    if (p) be->ops->free(be, p);
}
/* What a kernel on this backend gets: its threads, its compute stream and its workspace. (This
 * and the reserve below are inline, as the memory wrappers are: the model code calls them, and
 * the tools that link the model code without the backends, the fuzzers, need no backend.c.) */
static inline ch_kctx ch_backend_kctx(const ch_backend *be)
{
    return (ch_kctx){ .nthreads = be->nthreads, .stream = be->streams[CH_STREAM_COMPUTE],
                      .ws = be->ws ? be->ws->p : NULL, .ws_len = be->ws ? be->ws->len : 0,
                      .cache = be->kcache };
}

/* Grows the workspace to at least elems reals (plan time: a larger one replaces the old after the
 * work queued on it has run, which the backend's free waits for). */
static inline ch_status ch_backend_reserve_workspace(const ch_backend *be, size_t elems, ch_err *err)
{
    CH_ASSERT(be->ws);
    if (be->ws->p && elems <= be->ws->len) return CH_STATUS_OK;
    ch_real *p = (ch_real *)ch_backend_alloc(be, sizeof(ch_real) * elems);
    if (!p) return CH_SYS_FAIL(err, "allocation of the kernels' workspace");
    ch_backend_release(be, be->ws->p);
    be->ws->p = p;
    be->ws->len = elems;
    return CH_STATUS_OK;
}

/* Staging memory for copies to and from this backend (pinned where the backend pins); NULL when
 * it cannot be had. */
static inline void *ch_backend_host_alloc(const ch_backend *be, size_t bytes)
{
    return be->ops->host_alloc ? be->ops->host_alloc(be, bytes ? bytes : 1) : malloc(bytes ? bytes : 1);
}
static inline void ch_backend_host_free(const ch_backend *be, void *p)
{
    if (be->ops->host_free) be->ops->host_free(be, p);
    else free(p);
}

/* The host waits until everything queued on stream which has run. */
static inline void ch_backend_sync(const ch_backend *be, int which)
{
    if (ch_backend_async(be)) be->ops->stream_sync(be, be->streams[which]);
}

/* Asynchronous memory operations on stream s (synchronous on a backend without streams). */
static inline void ch_backend_upload_async(const ch_backend *be, int s, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    if (ch_backend_async(be)) be->ops->upload_async(be, be->streams[s], dst, src, bytes);
    else be->ops->upload(be, dst, src, bytes);
}
static inline void ch_backend_download_async(const ch_backend *be, int s, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    if (ch_backend_async(be)) be->ops->download_async(be, be->streams[s], dst, src, bytes);
    else be->ops->download(be, dst, src, bytes);
}

/* Blocking memory operations on the compute stream: queued after all its work, and complete (the
 * host buffer written or free again) when they return. */
static inline void ch_backend_upload(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    ch_backend_upload_async(be, CH_STREAM_COMPUTE, dst, src, bytes);
    ch_backend_sync(be, CH_STREAM_COMPUTE);
}
static inline void ch_backend_download(const ch_backend *be, void *dst, const void *src,
                                       size_t bytes)
{
    if (!bytes) return;
    ch_backend_download_async(be, CH_STREAM_COMPUTE, dst, src, bytes);
    ch_backend_sync(be, CH_STREAM_COMPUTE);
}
/* Replica to replica and zero: queued on the compute stream, in order with the kernels; nothing
 * on the host waits for them. */
static inline void ch_backend_copy(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src) return;
    if (ch_backend_async(be)) be->ops->copy_async(be, be->streams[CH_STREAM_COMPUTE], dst, src, bytes);
    else be->ops->copy(be, dst, src, bytes);
}
static inline void ch_backend_zero(const ch_backend *be, void *dst, size_t bytes)
{
    if (!bytes) return;
    if (ch_backend_async(be)) be->ops->zero_async(be, be->streams[CH_STREAM_COMPUTE], dst, bytes);
    else be->ops->zero(be, dst, bytes);
}

/* Events. On a backend without streams an event is a null handle and every wait is nothing. */
static inline ch_event *ch_backend_event(const ch_backend *be)
{
    return ch_backend_async(be) ? be->ops->event_create(be) : NULL;
}
static inline void ch_backend_event_free(const ch_backend *be, ch_event *e)
{
    if (e) be->ops->event_free(be, e);
}
static inline void ch_backend_record(const ch_backend *be, ch_event *e, int s)
{
    if (e) be->ops->record(be, e, be->streams[s]);
}
static inline void ch_backend_wait(const ch_backend *be, int s, ch_event *e)
{
    if (e) be->ops->wait(be, be->streams[s], e);
}
static inline void ch_backend_event_sync(const ch_backend *be, ch_event *e)
{
    if (e) be->ops->event_sync(be, e);
}

/* The scramble backend's pieces (kernels/scramble/scramble.c), which the lazy one builds on. */
extern const ch_backend_ops ch_scramble_ops;
const ch_kernels *ch_kernels_scramble(void);
/* The lazy backend (kernels/lazy/lazy.c). */
extern const ch_backend_ops ch_lazy_ops;
const ch_kernels *ch_kernels_lazy(void);

#endif
