/* What this CPU's instruction set allows, as oneDNN sees it (its effective ISA: the best it will
 * dispatch to here, after any ONEDNN_MAX_CPU_ISA limit). */
#include "kernels/cpu/cpu.h"

#include <stdio.h>

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

bool ch_cpu_bf16_native(char *isa, size_t len)
{
#ifndef CH_REAL_DOUBLE
    const unsigned e = (unsigned)dnnl_get_effective_cpu_isa();
    if (isa) snprintf(isa, len, "%s", isa_name(e));
    return (e & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
#else
    if (isa) snprintf(isa, len, "%s", isa_name(0));
    return false;
#endif
}
