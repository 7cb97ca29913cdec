/* Backends by name, and the CPU backend's memory: host memory from calloc or, for large blocks,
 * anonymous mappings with huge pages asked for; both come as untouched zero pages (a plan too big
 * for the machine fails its allocation with a message, instead of being killed while zeroing).
 * The CPU backend has no streams: every call is complete when it returns. */
#define _DEFAULT_SOURCE   /* madvise, MAP_ANONYMOUS */
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/plugin.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Blocks of CPU_BIG bytes and more (a model's activations, gradients and workspace) are mapped
 * with transparent huge pages asked for (this project's machines run Linux with THP set to
 * 'madvise': huge pages only where asked). Why: the Winograd packing reads 16 samples a plane
 * apart, the BatchNorm and ReLU passes stream whole batches, and with 4 KiB pages a step walks
 * ~300k pages. Measured on a Zen 5: docs/PERFORMANCE.md ("Huge pages"). Where THP is off, madvise
 * fails and the pages stay small: no harm. Each block has CPU_HEAD bytes before it that hold its
 * whole length, which tells which of the two made it. */
enum { CPU_BIG = 4 << 20, CPU_HEAD = 64 };

/* Under AddressSanitizer every block comes from calloc, whose ends it guards: a kernel writing
 * past its workspace or a tensor lands in another mapping unseen otherwise. */
static bool cpu_mapped(size_t len)
{
#if defined(__SANITIZE_ADDRESS__)
    (void)len;
    return false;
#else
    return len - CPU_HEAD >= CPU_BIG;
#endif
}

static void *cpu_alloc(const ch_backend *be, size_t bytes)
{
    (void)be;
    if (bytes > SIZE_MAX - CPU_HEAD) return NULL;
    const size_t len = bytes + CPU_HEAD;
    char *m;
    if (!cpu_mapped(len)) {
        m = calloc(1, len);
        if (!m) return NULL;
    } else {
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return NULL;        /* zero pages, as calloc's large blocks */
        (void)madvise(m, len, MADV_HUGEPAGE);   /* a request: refused where THP is off */
    }
    memcpy(m, &len, sizeof len);
    return m + CPU_HEAD;
}

static void cpu_free(const ch_backend *be, void *p)
{
    (void)be;
    if (!p) return;
    char *m = (char *)p - CPU_HEAD;
    size_t len;
    memcpy(&len, m, sizeof len);
    if (cpu_mapped(len))
        munmap(m, len);
    else
        free(m);
}

static void cpu_copy(const ch_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
}

static void cpu_zero(const ch_backend *be, void *dst, size_t bytes)
{
    (void)be;
    memset(dst, 0, bytes);
}

static const ch_backend_ops cpu_ops = {
    .name = "cpu", .host_visible = true, .alloc = cpu_alloc, .free = cpu_free,
    .upload = cpu_copy, .download = cpu_copy, .copy = cpu_copy, .zero = cpu_zero,
};

static const struct {
    const char *name;
    const ch_backend_ops *ops;
    const ch_kernels *(*kernels)(void);
} backends[] = {
    { "cpu", &cpu_ops, ch_kernels_cpu },
    { "scramble", &ch_scramble_ops, ch_kernels_scramble },
    { "lazy", &ch_lazy_ops, ch_kernels_lazy },
};

/* The CUDA plugin's table, once GPU `device` is known to be there. Tests that run more replicas
 * than the machine has GPUs (two replicas on one GPU) set COHORT_CUDA_WRAP=1: device d is then
 * GPU d modulo the count. */
static ch_status cuda_backend(int *device, const ch_backend_ops **ops, const ch_kernels **k, ch_err *err)
{
    const ch_cuda_plugin *p = ch_cuda_plugin_load(err);
    if (!p) return CH_STATUS_BAD_INPUT;
    char why[256] = "";
    const int count = p->device_count(why, sizeof why);
    if (count <= 0) return ch_fail(err, CH_STATUS_BAD_INPUT, "cuda:%d: no usable GPU: %s", *device, why);
    const char *wrap = getenv("COHORT_CUDA_WRAP");
    if (wrap && strcmp(wrap, "1") == 0) *device %= count;
    if (*device >= count)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "cuda:%d: this machine has %d GPU%s (cuda:0-%d)", *device, count,
                       count == 1 ? "" : "s", count - 1);
    *ops = p->ops;
    *k = p->kernels;
    return CH_STATUS_OK;
}

static const char *start_failure(const ch_backend_ops *ops)
{
    if (strcmp(ops->name, "cuda") != 0) return "";
    ch_err e;
    const ch_cuda_plugin *p = ch_cuda_plugin_load(&e);
    return p ? p->last_error() : "";
}

ch_status ch_backend_create(const char *name, int device, int nthreads, ch_backend **out, ch_err *err)
{
    *out = NULL;
    const ch_backend_ops *ops = NULL;
    const ch_kernels *k = NULL;
    const bool cuda = strcmp(name, "cuda") == 0;   /* the others (cpu, scramble, lazy) run the CPU kernels */
    if (cuda) {
        CH_TRY(cuda_backend(&device, &ops, &k, err));
    } else {
        size_t i = 0;
        while (i < sizeof backends / sizeof backends[0] && strcmp(name, backends[i].name) != 0) i++;
        if (i == sizeof backends / sizeof backends[0])
            return ch_fail(err, CH_STATUS_BAD_INPUT, "backend '%s': expected cpu or cuda, or scramble or lazy (test backends)", name);
        ops = backends[i].ops;
        k = backends[i].kernels();
    }
    ch_backend *be = calloc(1, sizeof *be);
    CH_CHECK_ALLOC(err, be);
    ch_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) {
        free(be);
        return CH_SYS_FAIL(err, "allocation of a backend's workspace record");
    }
    *be = (ch_backend){ .ops = ops, .k = k, .nthreads = nthreads > 0 ? nthreads : 1, .device = device, .ws = ws };
    /* The CPU kernels' cache; the CUDA plugin's kernels keep their state per device. */
    if (!cuda && !(be->kcache = ch_cpu_kcache_create())) {
        free(ws);
        free(be);
        return ch_fail(err, CH_STATUS_SYSTEM, "%s:%d: the CPU kernels' cache could not be made (memory, or oneDNN's engine)",
                       name, device);
    }
    if (be->ops->start) {
        be->ops->start(be);
        if (!be->ctx) {
            ch_cpu_kcache_free(be->kcache);
            free(ws);
            free(be);
            return ch_fail(err, CH_STATUS_SYSTEM, "%s:%d: the backend could not start: %s", name, device,
                           start_failure(ops));
        }
    }
    *out = be;
    return CH_STATUS_OK;
}

void ch_backend_free(ch_backend *be)
{
    if (!be) return;
    if (be->ws) ch_backend_release(be, be->ws->p);   /* before stop: free may wait on a stream */
    if (be->ops->stop) be->ops->stop(be);
    ch_cpu_kcache_free(be->kcache);   /* after stop: no kernel is running on it */
    free(be->ws);
    free(be);
}

/* Its workspace and kernel cache are held until exit (reachable, so no leak to LeakSanitizer).
 * Only tests plan models on it, one thread at a time; the library's replicas plan on backends of
 * their own. Without the cache (memory ran out) its kernels make theirs per call. */
static ch_workspace host_ws;
static ch_backend host = { .ops = &cpu_ops, .k = &ch_cpu_kernel_table, .nthreads = 1, .ws = &host_ws };
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

static void host_make_cache(void) { host.kcache = ch_cpu_kcache_create(); }

const ch_backend *ch_backend_host(void)
{
    pthread_once(&host_once, host_make_cache);
    return &host;
}


