/* GEMM for the CPU backend.
 * float: oneDNN's dnnl_sgemm. Measured on this machine (Zen 5, AVX-512): ~227 GFLOP/s on one core
 * against ~117 for Debian's OpenBLAS 0.3.21, which mis-detects the CPU unless OPENBLAS_CORETYPE is set
 * before the library loads; oneDNN dispatches on CPU features, so full speed needs no user setting.
 * It threads with OpenMP: omp_get_max_threads() of the calling thread outside a parallel region,
 * one thread inside one.
 * double (the test build only): plain loops; the float path is checked against the reference table. */
#include "kernels/cpu/cpu.h"

#include "core/status.h"

#ifndef CH_REAL_DOUBLE
#include <dnnl.h>
#endif

void ch_cpu_gemm(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, ch_real alpha,
                 const ch_real *a, int lda, const ch_real *b, int ldb, ch_real beta, ch_real *c,
                 int ldc)
{
    (void)kc;
    if (m <= 0 || n <= 0) return;
#ifndef CH_REAL_DOUBLE
    dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                                  beta, c, ldc);
    CH_ASSERT(st == dnnl_success);
#else
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                double av = ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
                double bv = tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j];
                s += av * bv;
            }
            ch_real *cij = &c[(size_t)i * ldc + j];
            *cij = (ch_real)(alpha * s + (beta == 0 ? 0 : beta * *cij));
        }
    }
#endif
}
