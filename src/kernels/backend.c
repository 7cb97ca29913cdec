/* Backends by name, and the CPU backend's memory: plain host memory from calloc, whose large
 * blocks come as untouched zero pages (a plan too big for the machine fails its allocation with a
 * message, instead of being killed while zeroing). */
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

ch_status ch_backend_create(const char *name, int nthreads, ch_backend **out, ch_err *err)
{
    *out = NULL;
    const ch_backend_ops *ops = NULL;
    const ch_kernels *k = NULL;
    if (strcmp(name, "cpu") == 0) {
        ops = &cpu_ops;
        k = ch_kernels_cpu();
    } else if (strcmp(name, "scramble") == 0) {
        ops = &ch_scramble_ops;
        k = ch_kernels_scramble();
    } else {
        return ch_fail(err, CH_STATUS_BAD_INPUT, "backend '%s': expected cpu or scramble (a test backend)", name);
    }
    ch_backend *be = calloc(1, sizeof *be);
    CH_CHECK_ALLOC(err, be);
    *be = (ch_backend){ .ops = ops, .k = k, .nthreads = nthreads > 0 ? nthreads : 1 };
    *out = be;
    return CH_STATUS_OK;
}

void ch_backend_free(ch_backend *be) { free(be); }

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
