/* Winograd F(4x4, 3x3)'s point GEMMs (36 per chunk of 10 tile positions x 16 samples, as
 * src/kernels/cpu/cpu_wino3.c runs them) as one oneDNN batched matmul, fp32 operands against bf16
 * operands with fp32 results, and fp32 with fpmath_mode bf16: microseconds per batch and GFLOP/s
 * on one thread. Built and run by bench/wino_bf16. */
#define _POSIX_C_SOURCE 199309L   /* clock_gettime */
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OK(call)                                                                 \
    do {                                                                         \
        if ((call) != dnnl_success) {                                            \
            fprintf(stderr, "point_gemm_bf16: %s failed\n", #call);              \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

enum { POINTS = 36, COLS = 160, REPS = 200 };

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A dense batch x rows x cols matrix of type t. */
static dnnl_memory_desc_t dense(int rows, int cols, dnnl_data_type_t t)
{
    dnnl_memory_desc_t md;
    const dnnl_dims_t dims = { POINTS, rows, cols };
    const dnnl_dims_t strides = { (dnnl_dim_t)rows * cols, cols, 1 };
    OK(dnnl_memory_desc_init_by_strides(&md, 3, dims, t, strides));
    return md;
}

/* M (oc x COLS) = U (oc x c) V (c x COLS) per point; returns microseconds per batch. */
static double time_batch(dnnl_engine_t eng, int oc, int c, dnnl_data_type_t in, bool fpmath_bf16,
                         const char **impl)
{
    dnnl_memory_desc_t a = dense(oc, c, in), b = dense(c, COLS, in), d = dense(oc, COLS, dnnl_f32);
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    OK(dnnl_matmul_desc_init(&desc, &a, &b, NULL, &d));
    OK(dnnl_primitive_attr_create(&attr));
    if (fpmath_bf16) OK(dnnl_primitive_attr_set_fpmath_mode(attr, dnnl_fpmath_mode_bf16));
    OK(dnnl_primitive_desc_create(&pd, &desc, attr, eng, NULL));
    OK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, impl));
    OK(dnnl_primitive_create(&p, pd));
    const dnnl_memory_desc_t *mds[3] = { &a, &b, &d };
    const int args[3] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST };
    dnnl_memory_t mem[3];
    dnnl_exec_arg_t ex[3];
    void *buf[3];
    for (int i = 0; i < 3; i++) {
        const size_t bytes = dnnl_memory_desc_get_size(mds[i]);
        buf[i] = malloc(bytes);
        if (!buf[i]) exit(1);
        memset(buf[i], 0x3c, bytes);   /* finite values in either type */
        OK(dnnl_memory_create(&mem[i], mds[i], eng, buf[i]));
        ex[i] = (dnnl_exec_arg_t){ args[i], mem[i] };
    }
    dnnl_stream_t s;
    OK(dnnl_stream_create(&s, eng, dnnl_stream_default_flags));
    for (int r = 0; r < 5; r++) OK(dnnl_primitive_execute(p, s, 3, ex));
    OK(dnnl_stream_wait(s));
    const double t0 = seconds();
    for (int r = 0; r < REPS; r++) OK(dnnl_primitive_execute(p, s, 3, ex));
    OK(dnnl_stream_wait(s));
    const double us = (seconds() - t0) / REPS * 1e6;
    dnnl_stream_destroy(s);
    for (int i = 0; i < 3; i++) {
        dnnl_memory_destroy(mem[i]);
        free(buf[i]);
    }
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    return us;
}

int main(void)
{
    omp_set_num_threads(1);
    dnnl_engine_t eng;
    OK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    printf("%-22s %10s %10s %10s %8s  %s\n", "36 x oc x cols x c", "fp32_us", "fpmath_us", "bf16_us",
           "fp32/bf16", "kernels (fp32, fpmath, bf16)");
    const int channels[] = { 64, 128, 256 };
    for (int i = 0; i < 3; i++) {
        const int ch = channels[i];
        const char *i32, *imath, *i16;
        const double f = time_batch(eng, ch, ch, dnnl_f32, false, &i32);
        const double m = time_batch(eng, ch, ch, dnnl_f32, true, &imath);
        const double h = time_batch(eng, ch, ch, dnnl_bf16, false, &i16);
        printf("36 x %3dx%dx%-3d      %10.1f %10.1f %10.1f %8.2fx  %s, %s, %s\n", ch, COLS, ch, f, m,
               h, f / h, i32, imath, i16);
    }
    dnnl_engine_destroy(eng);
    return 0;
}
