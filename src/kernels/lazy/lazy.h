/* The lazy backend's queue, shared by its streams and events (lazy.c) and its kernel table
 * (lazy_kernels.c): a queued kernel is a call of the scramble backend's kernel with arguments
 * copied at queue time. */
#ifndef CH_KERNELS_LAZY_H
#define CH_KERNELS_LAZY_H

#include <stddef.h>

#include "kernels/kernels.h"

enum { CH_LAZY_ARGS = 192 };

typedef struct ch_lazy_call {
    void (*run)(const ch_kctx *kc, const void *args);
    ch_kctx kc;
    _Alignas(16) unsigned char args[CH_LAZY_ARGS];
} ch_lazy_call;

/* Queue call on kc->stream (a lazy stream): run later, in the stream's order, with a copy of the
 * bytes of args (n <= CH_LAZY_ARGS) and of *kc. */
void ch_lazy_queue_call(const ch_kctx *kc, void (*run)(const ch_kctx *kc, const void *args), const void *args,
                        size_t n);

#endif
