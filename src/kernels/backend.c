/* Backends by name, and the CPU backend's memory: plain host memory from calloc, whose large
 * blocks come as untouched zero pages (a plan too big for the machine fails its allocation with a
 * message, instead of being killed while zeroing). The CPU backend has no streams: every call is
 * complete when it returns. */
#include "kernels/backend.h"

#include <stdlib.h>
#include <string.h>

static void *cpu_alloc(const ch_backend *be, size_t bytes)
{
    (void)be;
    return calloc(1, bytes);
}

static void cpu_free(const ch_backend *be, void *p)
{
    (void)be;
    free(p);
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

ch_status ch_backend_create(const char *name, int device, int nthreads, ch_backend **out, ch_err *err)
{
    *out = NULL;
    size_t i = 0;
    while (i < sizeof backends / sizeof backends[0] && strcmp(name, backends[i].name) != 0) i++;
    if (i == sizeof backends / sizeof backends[0])
        return ch_fail(err, CH_STATUS_BAD_INPUT, "backend '%s': expected cpu, or scramble or lazy (test backends)", name);
    ch_backend *be = calloc(1, sizeof *be);
    CH_CHECK_ALLOC(err, be);
    *be = (ch_backend){ .ops = backends[i].ops, .k = backends[i].kernels(), .nthreads = nthreads > 0 ? nthreads : 1,
                        .device = device };
    if (be->ops->start) {
        be->ops->start(be);
        if (!be->ctx) {
            free(be);
            return ch_fail(err, CH_STATUS_SYSTEM, "the %s backend could not start its streams for device %d", name, device);
        }
    }
    *out = be;
    return CH_STATUS_OK;
}

void ch_backend_free(ch_backend *be)
{
    if (be && be->ops->stop) be->ops->stop(be);
    free(be);
}

const ch_backend *ch_backend_host(void)
{
    static const ch_backend host = { .ops = &cpu_ops, .k = &ch_cpu_kernel_table, .nthreads = 1 };
    return &host;
}

const char *ch_backend_default_name(void)
{
    const char *v = getenv("COHORT_BACKEND");
    return v && *v ? v : "cpu";
}

ch_kctx ch_backend_kctx(const ch_backend *be)
{
    return (ch_kctx){ .nthreads = be->nthreads, .stream = be->streams[CH_STREAM_COMPUTE] };
}
