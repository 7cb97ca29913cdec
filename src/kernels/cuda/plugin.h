/* What libcohort and the CUDA plugin (libcohort-cuda.so) agree on. The plugin is a separate shared
 * library, loaded with dlopen only when a device list names a GPU, so that the cohort program and
 * libcohort have no link-time CUDA dependency and one build runs on machines with and without
 * GPUs. Its one exported symbol, ch_cuda_plugin_entry, returns this table; libcohort checks the
 * ABI number and the struct sizes before it uses anything else. */
#ifndef CH_KERNELS_CUDA_PLUGIN_H
#define CH_KERNELS_CUDA_PLUGIN_H

#include <stddef.h>

#include "comm/comm.h"
#include "core/status.h"
#include "kernels/backend.h"

enum { CH_CUDA_PLUGIN_ABI = 6, CH_NCCL_ID_BYTES = 128 };   /* 4: ch_kctx's cache; the workspace query takes a ch_kctx; 5: the kernel table's bf16 GEMM entries; 6: its bf16 convolution outputs */

typedef struct ch_cuda_plugin {
    int abi;
    size_t backend_size, kernels_size, ops_size, comm_size, comm_ops_size;   /* sizeof what it was built with */
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
    /* NCCL (kernels/cuda/cuda_nccl.c). nccl_id: a new communicator's unique id, drawn by one
     * member and handed to all. nccl_init: c becomes member rank of nranks on GPU device, once
     * every member has called it (polled against timeout_s); a collective communicator over
     * device memory (device_memory "cuda"). nccl_free: c's resources (after an abort too). */
    ch_status (*nccl_id)(unsigned char id[CH_NCCL_ID_BYTES], ch_err *err);
    ch_status (*nccl_init)(ch_comm *c, int device, int nranks, int rank, const unsigned char id[CH_NCCL_ID_BYTES],
                           double timeout_s, ch_err *err);
    void (*nccl_free)(ch_comm *c);
} ch_cuda_plugin;

typedef const ch_cuda_plugin *(*ch_cuda_plugin_entry_fn)(void);
#define CH_CUDA_PLUGIN_SYMBOL "ch_cuda_plugin_entry"
#define CH_CUDA_PLUGIN_FILE "libcohort-cuda.so"

/* libcohort's side (kernels/cuda_loader.c): the plugin, loaded once per process; NULL and an
 * error naming the file and dlopen's reason when it cannot be. */
const ch_cuda_plugin *ch_cuda_plugin_load(ch_err *err);

#endif
