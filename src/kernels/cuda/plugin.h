/* What libcohort and the CUDA plugin (libcohort-cuda.so) agree on. The plugin is a separate shared
 * library, loaded with dlopen only when a device list names a GPU, so that the cohort program and
 * libcohort have no link-time CUDA dependency and one build runs on machines with and without
 * GPUs. Its one exported symbol, ch_cuda_plugin_entry, returns this table; libcohort checks the
 * ABI number and the struct sizes before it uses anything else. */
#ifndef CH_KERNELS_CUDA_PLUGIN_H
#define CH_KERNELS_CUDA_PLUGIN_H

#include <stddef.h>

#include "core/status.h"
#include "kernels/backend.h"

enum { CH_CUDA_PLUGIN_ABI = 1 };

typedef struct ch_cuda_plugin {
    int abi;
    size_t backend_size, kernels_size, ops_size;   /* sizeof what the plugin was built with */
    const ch_backend_ops *ops;
    const ch_kernels *kernels;
    /* The GPUs CUDA sees (after CUDA_VISIBLE_DEVICES); -1 with the reason in why when there is no
     * usable driver or device. */
    int (*device_count)(char *why, size_t len);
    /* cohort info's lines: one per GPU (name, memory, compute capability), then the driver,
     * runtime, cuDNN, cuBLAS and NCCL versions. */
    void (*describe)(char *buf, size_t len);
    /* Why the last start (ops->start leaving be->ctx NULL) failed, for the error line. */
    const char *(*last_error)(void);
} ch_cuda_plugin;

typedef const ch_cuda_plugin *(*ch_cuda_plugin_entry_fn)(void);
#define CH_CUDA_PLUGIN_SYMBOL "ch_cuda_plugin_entry"
#define CH_CUDA_PLUGIN_FILE "libcohort-cuda.so"

/* libcohort's side (kernels/cuda_loader.c): the plugin, loaded once per process; NULL and an
 * error naming the file and dlopen's reason when it cannot be. */
const ch_cuda_plugin *ch_cuda_plugin_load(ch_err *err);

#endif
