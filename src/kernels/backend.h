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
 * the backend's back computes garbage, so tests run on it catch what a CUDA backend would break. */
#ifndef CH_KERNELS_BACKEND_H
#define CH_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"
#include "kernels/kernels.h"

typedef struct ch_backend ch_backend;

typedef struct ch_backend_ops {
    const char *name;
    bool host_visible;
    /* Replica memory of bytes bytes, zero; NULL when it cannot be had. */
    void *(*alloc)(const ch_backend *be, size_t bytes);
    void (*free)(const ch_backend *be, void *p);
    /* host -> replica, replica -> host, replica -> replica (may not overlap), zero. */
    void (*upload)(const ch_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(const ch_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(const ch_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(const ch_backend *be, void *dst, size_t bytes);
} ch_backend_ops;

struct ch_backend {
    const ch_backend_ops *ops;
    const ch_kernels *k;
    int nthreads;
};

/* The backend called name ("cpu", "scramble") for a replica of nthreads threads. */
ch_status ch_backend_create(const char *name, int nthreads, ch_backend **out, ch_err *err);
void ch_backend_free(ch_backend *be);
/* A process-wide CPU backend (one thread) for code with no replica: tools and tests. */
const ch_backend *ch_backend_host(void);
/* The backend tests and benchmarks ask for: COHORT_BACKEND's value, "cpu" when unset. */
const char *ch_backend_default_name(void);

static inline void *ch_backend_alloc(const ch_backend *be, size_t bytes)
{
    return be->ops->alloc(be, bytes ? bytes : 1);
}
static inline void ch_backend_release(const ch_backend *be, void *p)
{
    if (p) be->ops->free(be, p);
}
static inline void ch_backend_upload(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes) be->ops->upload(be, dst, src, bytes);
}
static inline void ch_backend_download(const ch_backend *be, void *dst, const void *src,
                                       size_t bytes)
{
    if (bytes) be->ops->download(be, dst, src, bytes);
}
static inline void ch_backend_copy(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) be->ops->copy(be, dst, src, bytes);
}
static inline void ch_backend_zero(const ch_backend *be, void *dst, size_t bytes)
{
    if (bytes) be->ops->zero(be, dst, bytes);
}

/* The scramble backend's pieces (kernels/scramble/scramble.c). */
extern const ch_backend_ops ch_scramble_ops;
const ch_kernels *ch_kernels_scramble(void);

#endif
