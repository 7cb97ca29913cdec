/* cohort info: version, kernels and libraries in use, the CPU, threads, optional back ends. */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#ifdef CH_HAVE_MPI
#include <mpi.h>
#endif
#include "core/real.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/plugin.h"

#ifndef CH_REAL_DOUBLE
#include <dnnl.h>
#endif

/* The GPUs and the CUDA libraries' versions, from the plugin when it loads; else one line why. */
static void print_cuda(void)
{
    ch_err err;
    const ch_cuda_plugin *p = ch_cuda_plugin_load(&err);
    if (!p) {
        printf("cuda:       not available: %s\n", err.msg);
        return;
    }
    char buf[4096];
    p->describe(buf, sizeof buf);
    printf("cuda:       plugin %s loaded (--devices cuda:0, cuda*N). Run on an H100 and an H200: every\n"
           "            kernel, one SGD step of each zoo and parity model against PyTorch, training, checkpoints\n"
           "            across devices, NCCL with one member; not yet run on a GPU: NCCL with two or more\n"
           "            members (docs/PERFORMANCE.md, \"CUDA\")\n%s",
           CH_CUDA_PLUGIN_FILE, buf);
}

int ch_cmd_info(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        puts("usage: cohort info\n\nVersion, precision, kernels, CPU, default threads, Open MPI (and this\n"
             "process's rank) and CUDA availability.");
        return CH_EXIT_OK;
    }
    if (argc > 1) {
        fprintf(stderr, "cohort info: takes no arguments\n");
        return CH_EXIT_USAGE;
    }
    char cpu[160];
    ch_cpu_describe(cpu, sizeof cpu);
    const dnnl_version_t *v = dnnl_version();
    printf("cohort %s\n", ch_version());
    printf("precision:  %s\n", CH_REAL_NAME);
    printf("kernels:    cpu (oneDNN %d.%d.%d: sgemm under im2col, Winograd and direct convolutions; "
           "hand-written Winograd F(4x4, 3x3) and F(3x3, 5x5); OpenMP %d)\n", v->major, v->minor,
           v->patch, _OPENMP);
    printf("oneDNN cpu: %s\n", v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP runtime" : "other runtime");
    printf("cpu:        %s\n", cpu);
    char isa[32];
    const bool bf16 = ch_cpu_bf16_runs(isa, sizeof isa);
    printf("bf16:       %s (oneDNN's effective ISA: %s)\n",
           !bf16 ? "not native: --precision bf16 is refused"
           : ch_cpu_bf16_emulated() ? "emulated (COHORT_BF16=emulate: oneDNN's AVX-512 emulation, for tests; slower than fp32)"
                                    : "native", isa);
    char why[160];
    if (bf16)
        printf("            --precision bf16 multiplies in %s: %s\n", ch_cpu_bf16_products(why, sizeof why) ? "bf16" : "fp32, keeping BatchNorm inputs in bf16", why);
    printf("backends:   cpu (--devices cpu:0,cpu:1); scramble (--devices scramble:0,scramble:1: a test backend, the\n"
           "            CPU kernels on memory stored XOR-scrambled, which gives the CPU backend's bits);\n"
           "            lazy (--devices lazy:0,lazy:1: a test backend, scramble's memory behind streams whose\n"
           "            work runs later, only when waited for; it gives the CPU backend's bits too)\n");
    printf("threads:    %d by default (--threads T to change)\n", ch_cpu_count());
#ifdef CH_HAVE_MPI
    printf("mpi:        Open MPI %d.%d.%d; this process is rank %d of %d on %s%s\n",
           OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION, ch_world_rank(),
           ch_world_size(), ch_world_host(), ch_world_size() > 1 ? "" : " (started without mpirun)");
#else
    printf("mpi:        not available (install libopenmpi-dev and rebuild)\n");
#endif
    print_cuda();
    return CH_EXIT_OK;
}
