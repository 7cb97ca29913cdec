/* The CUDA plugin's backend: device memory, streams, events and staging memory (backend.h's
 * interface), the plugin's entry point, and what cohort info says about the GPUs.
 * Memory: cudaMalloc, zeroed; a replica allocates when its model is planned and frees at the end,
 * so no caching allocator is needed yet. Staging memory is page-locked and mapped
 * (cudaHostAlloc): copies from it run at full speed, and kernels write their double results
 * (BatchNorm's sums, the loss) straight into it. No managed memory anywhere. */
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/plugin.h"

#include <nccl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local int current_device = -1;
static _Thread_local char start_error[256];

void cu_fail(const char *what, const char *error, const char *file, int line)
{
    fprintf(stderr, "cohort: cuda: %s failed: %s (%s:%d)\n", what, error, file, line);
    exit(EXIT_FAILURE);
}

void cu_use_device(int device)
{
    if (device == current_device) return;
    CU_CHECK(cudaSetDevice(device));
    current_device = device;
}

const cu_stream *cu_of(const ch_kctx *kc)
{
    if (!kc->stream) cu_fail("a CUDA kernel", "called without a stream (not from a cuda backend's context)", __FILE__, __LINE__);
    return (const cu_stream *)kc->stream;
}

cudaStream_t cu_stream_of(const ch_kctx *kc)
{
    const cu_stream *st = cu_of(kc);
    cu_use_device(st->device);
    return st->s;
}

typedef struct cu_ctx {
    cu_stream st[CH_STREAMS];
} cu_ctx;

static cudaStream_t stream_of(const ch_backend *be, ch_stream *s)
{
    cu_use_device(be->device);
    return ((cu_stream *)s)->s;
}

/* Why a start failed, for ch_backend_create's line. */
#define START_CHECK(call, lib_name)                                                              \
    do {                                                                                         \
        if (!(call)) {                                                                           \
            snprintf(start_error, sizeof start_error, "%s failed: %s", #call, lib_name);          \
            goto fail;                                                                           \
        }                                                                                        \
    } while (0)

static void cu_stop(ch_backend *be);

static void cu_start(ch_backend *be)
{
    cu_ctx *c = calloc(1, sizeof *c);
    if (!c) return;
    be->ctx = c;
    cudaError_t e = cudaSetDevice(be->device);
    START_CHECK(e == cudaSuccess, cudaGetErrorName(e));
    current_device = be->device;
    for (int i = 0; i < CH_STREAMS; i++) {
        c->st[i].device = be->device;
        e = cudaStreamCreateWithFlags(&c->st[i].s, cudaStreamNonBlocking);
        START_CHECK(e == cudaSuccess, cudaGetErrorName(e));
        be->streams[i] = (ch_stream *)&c->st[i];
    }
    cu_stream *comp = &c->st[CH_STREAM_COMPUTE];
    cublasStatus_t b = cublasCreate(&comp->blas);
    START_CHECK(b == CUBLAS_STATUS_SUCCESS, cublasGetStatusName(b));
    b = cublasSetStream(comp->blas, comp->s);
    START_CHECK(b == CUBLAS_STATUS_SUCCESS, cublasGetStatusName(b));
    /* Plain fp32: no TF32 tensor-core rounding unless a user asks for it. */
    b = cublasSetMathMode(comp->blas, CUBLAS_PEDANTIC_MATH);
    START_CHECK(b == CUBLAS_STATUS_SUCCESS, cublasGetStatusName(b));
    cudnnStatus_t d = cudnnCreate(&comp->dnn);
    START_CHECK(d == CUDNN_STATUS_SUCCESS, cudnnGetErrorString(d));
    d = cudnnSetStream(comp->dnn, comp->s);
    START_CHECK(d == CUDNN_STATUS_SUCCESS, cudnnGetErrorString(d));
    e = cudaMalloc((void **)&comp->scratch, sizeof(double) * CU_SCRATCH);
    START_CHECK(e == cudaSuccess, cudaGetErrorName(e));
    return;
fail:
    cu_stop(be);
}

static void cu_stop(ch_backend *be)
{
    cu_ctx *c = be->ctx;
    if (!c) return;
    cu_use_device(be->device);
    for (int i = 0; i < CH_STREAMS; i++) {
        if (c->st[i].s) CU_CHECK(cudaStreamSynchronize(c->st[i].s));
        if (c->st[i].scratch) cudaFree(c->st[i].scratch);
        if (c->st[i].dnn) cudnnDestroy(c->st[i].dnn);
        if (c->st[i].blas) cublasDestroy(c->st[i].blas);
        if (c->st[i].s) cudaStreamDestroy(c->st[i].s);
        be->streams[i] = NULL;
    }
    free(c);
    be->ctx = NULL;
}

static void *cu_alloc(const ch_backend *be, size_t bytes)
{
    cu_use_device(be->device);
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();   /* an allocation failure is not sticky: clear it, report NULL */
        return NULL;
    }
    CU_CHECK(cudaMemset(p, 0, bytes));
    return p;
}

static void cu_free(const ch_backend *be, void *p)
{
    cu_use_device(be->device);
    CU_CHECK(cudaFree(p));   /* waits for the work queued on the device first */
}

static void cu_upload(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    cu_use_device(be->device);
    CU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

static void cu_download(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    cu_use_device(be->device);
    CU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static void cu_copy(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    cu_use_device(be->device);
    CU_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

static void cu_zero(const ch_backend *be, void *dst, size_t bytes)
{
    cu_use_device(be->device);
    CU_CHECK(cudaMemset(dst, 0, bytes));
}

static void cu_upload_async(const ch_backend *be, ch_stream *s, void *dst, const void *src, size_t bytes)
{
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(be, s)));
}

static void cu_download_async(const ch_backend *be, ch_stream *s, void *dst, const void *src, size_t bytes)
{
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_of(be, s)));
}

static void cu_copy_async(const ch_backend *be, ch_stream *s, void *dst, const void *src, size_t bytes)
{
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(be, s)));
}

static void cu_zero_async(const ch_backend *be, ch_stream *s, void *dst, size_t bytes)
{
    CU_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_of(be, s)));
}

static ch_event *cu_event_create(const ch_backend *be)
{
    cu_use_device(be->device);
    cudaEvent_t e;
    CU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return (ch_event *)e;
}

static void cu_event_free(const ch_backend *be, ch_event *e)
{
    cu_use_device(be->device);
    CU_CHECK(cudaEventDestroy((cudaEvent_t)e));
}

static void cu_record(const ch_backend *be, ch_event *e, ch_stream *s)
{
    CU_CHECK(cudaEventRecord((cudaEvent_t)e, stream_of(be, s)));
}

static void cu_wait(const ch_backend *be, ch_stream *s, ch_event *e)
{
    CU_CHECK(cudaStreamWaitEvent(stream_of(be, s), (cudaEvent_t)e, 0));
}

static void cu_event_sync(const ch_backend *be, ch_event *e)
{
    cu_use_device(be->device);
    CU_CHECK(cudaEventSynchronize((cudaEvent_t)e));
}

static bool cu_query(const ch_backend *be, ch_event *e)
{
    cu_use_device(be->device);
    const cudaError_t r = cudaEventQuery((cudaEvent_t)e);
    if (r == cudaErrorNotReady) return false;
    CU_CHECK(r);
    return true;
}

static void cu_stream_sync(const ch_backend *be, ch_stream *s)
{
    CU_CHECK(cudaStreamSynchronize(stream_of(be, s)));
}

static void *cu_host_alloc(const ch_backend *be, size_t bytes)
{
    cu_use_device(be->device);
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(const ch_backend *be, void *p)
{
    (void)be;
    CU_CHECK(cudaFreeHost(p));
}

static const ch_backend_ops cu_ops = {
    .name = "cuda", .host_visible = false,
    .alloc = cu_alloc, .free = cu_free, .upload = cu_upload, .download = cu_download, .copy = cu_copy,
    .zero = cu_zero, .start = cu_start, .stop = cu_stop, .upload_async = cu_upload_async,
    .download_async = cu_download_async, .copy_async = cu_copy_async, .zero_async = cu_zero_async,
    .event_create = cu_event_create, .event_free = cu_event_free, .record = cu_record, .wait = cu_wait,
    .event_sync = cu_event_sync, .query = cu_query, .host_alloc = cu_host_alloc, .host_free = cu_host_free,
    .stream_sync = cu_stream_sync,
};

static int device_count(char *why, size_t len)
{
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, len, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        (void)cudaGetLastError();
        return -1;
    }
    if (n == 0) snprintf(why, len, "CUDA sees no GPU (CUDA_VISIBLE_DEVICES=%s)",
                         getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    return n;
}

static size_t append(char *buf, size_t len, size_t at, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static size_t append(char *buf, size_t len, size_t at, const char *fmt, ...)
{
    if (at >= len) return at;
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(buf + at, len - at, fmt, ap);
    va_end(ap);
    return w < 0 ? at : at + (size_t)w;
}

static void describe(char *buf, size_t len)
{
    size_t at = 0;
    if (len) buf[0] = '\0';
    char why[256];
    const int n = device_count(why, sizeof why);
    for (int i = 0; i < n; i++) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        at = append(buf, len, at, "gpu:        cuda:%d %s, %.1f GiB, compute capability %d.%d, %d multiprocessors\n", i,
                    p.name, (double)p.totalGlobalMem / (1 << 30), p.major, p.minor, p.multiProcessorCount);
    }
    if (n <= 0) at = append(buf, len, at, "gpu:        none: %s\n", why);
    int drv = 0, rt = 0, nccl = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    ncclGetVersion(&nccl);
    const size_t dnn = cudnnGetVersion();
    int blas = 0;
    cublasGetProperty(MAJOR_VERSION, &blas);
    int blas_minor = 0;
    cublasGetProperty(MINOR_VERSION, &blas_minor);
    char driver[32] = "none";
    if (drv > 0) snprintf(driver, sizeof driver, "%d.%d", drv / 1000, drv % 1000 / 10);
    at = append(buf, len, at, "cuda libs:  driver %s, runtime %d.%d, cuDNN %zu.%zu.%zu, cuBLAS %d.%d, NCCL %d.%d.%d\n",
                driver, rt / 1000, rt % 1000 / 10, dnn / 10000, dnn % 10000 / 100, dnn % 100, blas, blas_minor,
                nccl / 10000, nccl % 10000 / 100, nccl % 100);
}

static const char *last_error(void) { return start_error; }

extern const ch_kernels ch_cuda_kernel_table, ch_cuda_kernel_table_profiled;

static ch_cuda_plugin plugin = {
    .abi = CH_CUDA_PLUGIN_ABI, .backend_size = sizeof(ch_backend), .kernels_size = sizeof(ch_kernels),
    .ops_size = sizeof(ch_backend_ops), .comm_size = sizeof(ch_comm), .comm_ops_size = sizeof(ch_comm_ops),
    .ops = &cu_ops, .kernels = &ch_cuda_kernel_table, .device_count = device_count, .describe = describe,
    .last_error = last_error, .nccl_id = cu_nccl_id, .nccl_init = cu_nccl_init, .nccl_free = cu_nccl_free,
};

__attribute__((visibility("default"))) const ch_cuda_plugin *ch_cuda_plugin_entry(void);
const ch_cuda_plugin *ch_cuda_plugin_entry(void)
{
    /* cuDNN's and cuBLAS's fp32 paths may round through TF32 on tensor cores unless told not to;
     * cohort's fp32 means fp32 (a user can still set the variable to 1 before starting). */
    setenv("NVIDIA_TF32_OVERRIDE", "0", 0);
    const char *profile = getenv("COHORT_CUDA_PROFILE");
    if (profile && strcmp(profile, "1") == 0) plugin.kernels = &ch_cuda_kernel_table_profiled;
    return &plugin;
}
