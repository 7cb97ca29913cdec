/* What this CPU's instruction set allows, as oneDNN sees it (its effective ISA: the best it will
 * dispatch to here, after any ONEDNN_MAX_CPU_ISA limit). */
#include "kernels/cpu/cpu.h"

#include "core/cpu.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CH_REAL_DOUBLE
#include <dnnl.h>
#endif

static const char *isa_name(unsigned isa)
{
#ifndef CH_REAL_DOUBLE
    /* Highest first: each value's bits contain the ones below it. */
    static const struct { unsigned bits; const char *name; } names[] = {
        { dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx" },
        { dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16" },
        { dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni" },
        { dnnl_cpu_isa_avx512_core, "avx512_core" },
        { dnnl_cpu_isa_avx2_vnni, "avx2_vnni" },
        { dnnl_cpu_isa_avx2, "avx2" },
        { dnnl_cpu_isa_avx, "avx" },
        { dnnl_cpu_isa_sse41, "sse41" },
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if ((isa & names[i].bits) == names[i].bits) return names[i].name;
#endif
    (void)isa;
    return "baseline";
}

#ifndef CH_REAL_DOUBLE
/* Whether oneDNN dispatches to isa here: its effective ISA holds every bit of isa. */
static bool isa_has(unsigned isa)
{
    return ((unsigned)dnnl_get_effective_cpu_isa() & isa) == isa;
}
#endif

bool ch_cpu_avx512(void)
{
#ifndef CH_REAL_DOUBLE
    return isa_has(dnnl_cpu_isa_avx512_core);
#else
    return false;
#endif
}

bool ch_cpu_bf16_native(char *isa, size_t len)
{
#ifndef CH_REAL_DOUBLE
    if (isa) snprintf(isa, len, "%s", isa_name((unsigned)dnnl_get_effective_cpu_isa()));
    return isa_has(dnnl_cpu_isa_avx512_core_bf16);
#else
    if (isa) snprintf(isa, len, "%s", isa_name(0));
    return false;
#endif
}

int ch_cpu_bf16_emulate_mode(const char *s)
{
    if (!s || !*s) return 0;
    return strcmp(s, "emulate") == 0 ? 1 : -1;
}

/* oneDNN runs its bf16 convolutions and matmuls on avx512_core by emulating the bf16 conversion
 * and dot product with AVX-512 sequences (jit_bf16:avx512_core, brg:avx512_core in
 * ONEDNN_VERBOSE); below AVX-512 it has no bf16 kernels at all. */
bool ch_cpu_bf16_emulated(void)
{
    return ch_cpu_bf16_emulate_mode(getenv("COHORT_BF16")) == 1 && !ch_cpu_bf16_native(NULL, 0) &&
           ch_cpu_avx512();
}

bool ch_cpu_bf16_runs(char *isa, size_t len)
{
    return ch_cpu_bf16_native(isa, len) || ch_cpu_bf16_emulated();
}

int ch_cpu_bf16_products_mode(const char *s)
{
    if (!s || !*s || strcmp(s, "auto") == 0) return -1;
    if (strcmp(s, "on") == 0) return 1;
    if (strcmp(s, "off") == 0) return 0;
    return -2;
}

bool ch_cpu_bf16_inputs(void) { return ch_cpu_bf16_products_mode(getenv("COHORT_BF16_INPUTS")) != 0; }

/* Intel's cores before AMX issue the bf16 dot product (vdpbf16ps) on one port and FMAs on two,
 * so a bf16 dot product, twice an FMA's multiplies, does the same work a cycle as fp32 and pays
 * the rounding besides. Measured (bench/wino_bf16: oneDNN's batched matmul, one thread, bf16
 * against fp32): an Intel family 6 model 207 with AVX512-BF16 and no AMX 0.54-0.60x, slower; AMD
 * Zen 5 1.8-2.3x faster. AMX multiplies bf16 tiles at many times the FMA rate. */
static bool products_pay_here(void)
{
#ifndef CH_REAL_DOUBLE
    if (isa_has(dnnl_cpu_isa_avx512_core_amx)) return true;
#endif
    char vendor[13];
    return !ch_cpu_vendor(vendor) || strcmp(vendor, "GenuineIntel") != 0;
}

bool ch_cpu_bf16_products(char *why, size_t len)
{
    static _Atomic int pays = -1;   /* the CPU's answer, found once: the same every call */
    if (!ch_cpu_bf16_runs(NULL, 0)) {
        if (why) snprintf(why, len, "no native bf16");
        return false;
    }
    const int mode = ch_cpu_bf16_products_mode(getenv("COHORT_BF16_PRODUCTS"));
    if (mode >= 0) {
        if (why) snprintf(why, len, "COHORT_BF16_PRODUCTS=%s", mode ? "on" : "off");
        return mode == 1;
    }
    int p = atomic_load_explicit(&pays, memory_order_relaxed);
    if (p < 0) {
        p = products_pay_here();
        atomic_store_explicit(&pays, p, memory_order_relaxed);
    }
    if (why)
        snprintf(why, len, "%s", p ? "bf16 dot products outrun fp32 FMAs on this CPU"
                                   : "this CPU's bf16 dot products run no faster than its fp32 FMAs (Intel without AMX)");
    return p == 1;
}
