/* The CPU backend's kernels, one file per family; cpu_table.c gathers them into the table. */
#ifndef CH_KERNELS_CPU_H
#define CH_KERNELS_CPU_H

#include <omp.h>
#ifndef CH_REAL_DOUBLE
#include <dnnl_types.h>
#endif

#include "kernels/kernels.h"

/* The calling thread's index inside an OpenMP team (0 outside one). */
static inline int ch_omp_thread(void) { return omp_get_thread_num(); }
/* The size of the calling thread's team (1 outside one). */
static inline int ch_omp_threads(void) { return omp_get_num_threads(); }

/* body(arg, t, T) for t = 0 .. T-1 on a team of T threads, or on the calling thread alone where
 * T <= 1, with no parallel region. Why not `#pragma omp parallel if (T > 1)`: a region whose if is
 * false is still a region, so a region opened inside it (oneDNN's GEMMs, ch_cpu_gemm) is a nested
 * one, and libgomp starts and joins fresh threads for every nested team instead of taking its
 * pool's: ~76 against ~4 us a region on the Zen 5 VM, which made a resnet18 step at 16 samples on
 * 2 threads 2.5x slower than at 17 (one Winograd group, a team of one). Bodies may hold
 * `#pragma omp barrier`: outside any region it binds to no team and waits for no one; inside an
 * active one (a caller's team) a team of one still runs, as before, so that it binds to that. */
typedef void (*ch_team_fn)(void *arg, int t, int T);
static inline void ch_cpu_team(int T, ch_team_fn body, void *arg)
{
    if (T <= 1 && !omp_in_parallel()) {
        body(arg, 0, 1);
        return;
    }
    T = T > 1 ? T : 1;
#pragma omp parallel num_threads(T)
    body(arg, omp_get_thread_num(), T);
}

/* Partial sums per row sum (cpu_reduce.c, in double: two AVX-512 vectors) and per dot product of
 * the first-layer weight-gradient tiles (cpu_conv.c, in float: one vector). */
enum { CH_CPU_LANES = 16 };
/* In double: sum p[i], and sum (p[i] - m)^2. */
double ch_cpu_sum(const ch_real *p, size_t len);
double ch_cpu_sum_bf16(const uint16_t *p, size_t len);
double ch_cpu_sum_sq_dev(const ch_real *p, size_t len, double m);
/* *sum_dy += sum dy[i], *sum_dyx += sum dy[i] * (x[i] - m), in double. */
void ch_cpu_sum_dy_dyx(const ch_real *dy, const ch_real *x, size_t len, double m, double *sum_dy,
                       double *sum_dyx);

void ch_cpu_gemm(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, ch_real alpha,
                 const ch_real *a, int lda, const ch_real *b, int ldb, ch_real beta, ch_real *c,
                 int ldc);

/* A strided batch of GEMMs: for i < batch, C_i = op(A_i) op(B_i), plus C_i where accumulate, with
 * A_i at a + i*sa (likewise B and C); row-major, lda/ldb/ldc as for ch_cpu_gemm. The batch runs
 * on the calling thread (callers run it inside their own parallel regions of up to kc->nthreads
 * threads). scratch: at least ch_cpu_gemm_batch_scratch(kc, g) bytes. That query makes the
 * shape's kernel in kc's cache (ch_cpu_kcache_gemms) on first use, so a caller that asks while
 * planning its workspace does that before the first step. */
typedef struct ch_gemm_batch {
    int batch, m, n, k, lda, ldb, ldc;
    size_t sa, sb, sc;
    bool ta, tb, accumulate;
    bool bf16;   /* A and B are bf16 (ch_cpu_gemm_batch_bf16), C fp32 */
} ch_gemm_batch;
size_t ch_cpu_gemm_batch_scratch(const ch_kctx *kc, const ch_gemm_batch *g);
void ch_cpu_gemm_batch(const ch_kctx *kc, const ch_gemm_batch *g, const ch_real *a,
                       const ch_real *b, ch_real *c, void *scratch);
/* The same with bf16 A and B (g->bf16 set), the products summed in fp32 (--precision bf16's
 * Winograd point GEMMs, wino_body.h). */
void ch_cpu_gemm_batch_bf16(const ch_kctx *kc, const ch_gemm_batch *g, const uint16_t *a,
                            const uint16_t *b, ch_real *c, void *scratch);
/* Whether oneDNN has a fast kernel for g (false: the calls above run plain loops). */
bool ch_cpu_gemm_batch_fast(const ch_kctx *kc, const ch_gemm_batch *g);
/* A replica's batched-matmul kernels (cpu_gemm.c), held by its kernel cache and made on its
 * engine (the float build's; NULL where memory fails); free before the engine. */
struct ch_gb_cache;
#ifndef CH_REAL_DOUBLE
struct ch_gb_cache *ch_cpu_gb_cache_create(dnnl_engine_t engine);
#endif
void ch_cpu_gb_cache_free(struct ch_gb_cache *c);
/* The kernel table's gemm_bf16 and its workspace query (cpu_gemm_bf16.c). */
size_t ch_cpu_gemm_bf16_workspace(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k,
                                  int ldc, bool accumulate);
void ch_cpu_gemm_bf16(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, const ch_real *a,
                      int lda, const ch_real *b, int ldb, bool accumulate, ch_real *c, int ldc);

size_t ch_cpu_conv2d_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n);
size_t ch_cpu_conv2d_keep_bytes(const ch_kctx *kc, const ch_conv_desc *d, int n);
bool ch_cpu_conv2d_in_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n);

/* The CPU kernels' per-replica state (ch_kctx's cache; cpu_dnnl_conv.c): a oneDNN engine and
 * stream, the primitives of each convolution geometry with their argument handles, and the
 * batched matmuls (ch_cpu_kcache_gemms), made at plan time by the workspace queries. create: NULL
 * when memory or oneDNN fails. free: NULL is nothing; no kernel may be running on it. */
struct ch_kcache *ch_cpu_kcache_create(void);
void ch_cpu_kcache_free(struct ch_kcache *c);
/* The geometries c holds primitives for (tests: what plan time made, and that passes made none). */
size_t ch_cpu_kcache_entries(const struct ch_kcache *c);
/* c's batched matmuls (NULL in the double build), and how many shapes it holds. */
struct ch_gb_cache *ch_cpu_kcache_gemms(const struct ch_kcache *c);
size_t ch_cpu_gb_cache_entries(const struct ch_gb_cache *c);
void ch_cpu_conv2d_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                           const ch_real *w, const ch_real *b, ch_real *y);
bool ch_cpu_conv2d_out_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n);
/* One sample's output plane of P values (+ *b where b, ReLU where relu) rounded to bf16 into to,
 * as the im2col layers write their outputs for a BatchNorm (cpu_conv.c, cpu_conv_bf16p.c). */
void ch_cpu_round_plane(const ch_real *from, size_t P, const ch_real *b, bool relu, uint16_t *to);
void ch_cpu_conv2d_forward_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                const ch_real *w, const ch_real *b, uint16_t *y);
bool ch_cpu_conv2d_x_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n);
void ch_cpu_conv2d_forward_of_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                                   const ch_real *w, const ch_real *b, ch_real *y, uint16_t *yh);
void ch_cpu_conv2d_backward_of_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                                    const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx, ch_real *dw,
                                    ch_real *db);
void ch_cpu_conv2d_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                 const ch_real *dy, const ch_real *w, ch_real *dx);
bool ch_cpu_conv2d_dy_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n);
void ch_cpu_conv2d_backward_dy_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                    const uint16_t *xh, const uint16_t *dy, const ch_real *w, ch_real *dx,
                                    ch_real *dw, ch_real *db);
void ch_cpu_conv2d_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                    const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                    ch_real *db);
/* Both backward passes at once where one of cohort's own Winograds takes the layer (the kernel
 * table's conv2d_backward): false, with nothing written, elsewhere. */
bool ch_cpu_conv2d_backward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                            const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx,
                            ch_real *dw, ch_real *db);

/* oneDNN's direct convolutions (cpu_dnnl_conv.c), in two uses, a layer taking at most one:
 *  - bf16 operands and fp32 sums, for d->bf16 layers where that is the faster (no Winograd
 *    applies; not 1x1; 16 channels or more each way) on a CPU whose bf16 products pay;
 *  - fp32, for 3x3 stride-2 layers with 16 channels or more each way on an AVX-512 CPU that the
 *    first does not take: forward and backward data always, the weight gradient where the output
 *    plane is 7x7 or more (false on smaller ones, which keep im2col's).
 * The same contract as the Winograds below (0 and false where it does not apply).
 * ch_cpu_conv_bf16_workspace is the first use's share alone (is a layer's bf16 kernel taken). */
size_t ch_cpu_conv_direct_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n);
size_t ch_cpu_conv_bf16_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n);
bool ch_cpu_conv_direct_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                const ch_real *w, const ch_real *b, ch_real *y);
bool ch_cpu_conv_direct_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                      const ch_real *dy, const ch_real *w, ch_real *dx);
bool ch_cpu_conv_direct_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                         const ch_real *x, const ch_real *y, ch_real *dy,
                                         ch_real *dw, ch_real *db);

/* Whether d is a layer the first use above takes (bf16 direct). */
bool ch_cpu_conv_bf16_direct(const ch_conv_desc *d);
/* The weight gradient of such a layer by im2col and a bf16 GEMM where that is the faster
 * (cpu_conv_bf16w.c): the same contract (0 and false where it does not apply). */
size_t ch_cpu_conv_bf16w_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n);
bool ch_cpu_conv_bf16w_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                        const ch_real *x, const ch_real *y, ch_real *dy,
                                        ch_real *dw, ch_real *db);
/* 1x1 strided layers under --precision bf16 (cpu_conv_bf16p.c): forward (into y, or with y16
 * rounded to bf16 there) and backward data by bf16 GEMMs; their weight gradient is the one above.
 * geometry: the layers it and the weight gradient take (output planes up to 14x14). The same
 * contract as the others (0 and false where it does not apply). */
bool ch_cpu_conv_bf16p_geometry(const ch_conv_desc *d);
size_t ch_cpu_conv_bf16p_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n);
bool ch_cpu_conv_bf16p_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                               const ch_real *w, const ch_real *b, ch_real *y, uint16_t *y16);
bool ch_cpu_conv_bf16p_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                     const ch_real *w, ch_real *dx);
/* Its columns, which cpu_conv_bf16p.c's passes build too: tap positions (kh*kw rows of oh*ow,
 * -1 in the padding) into taps; sample s's rows of im2col (c*kh*kw rows of ld) from its planes
 * xs, at columns s*oh*ow .., rounded to bf16; rows planes of p values into columns s*p .. of
 * rows of ld, rounded; and columns from .. cols-1 of rows rows set to 0. */
void ch_cpu_bf16_taps(const ch_conv_desc *d, int *taps);
/* The team (*T, at most n) and samples per chunk (*ch: about 1,024 output positions, at most a
 * thread's share) of both files' passes over n samples of p output positions each. */
void ch_cpu_bf16_chunks(const ch_kctx *kc, int n, size_t p, int *T, int *ch);
void ch_cpu_bf16_cols(const ch_conv_desc *d, size_t ld, const int *taps, const ch_real *xs, int s,
                      uint16_t *col);
void ch_cpu_bf16_planes(int rows, size_t p, size_t ld, const ch_real *src, int s, uint16_t *dst);
void ch_cpu_bf16_zero_tail(uint16_t *m, int rows, size_t cols, size_t from);

/* Winograd convolution (cpu_dnnl_conv.c) for 3x3 stride-1 pad-1 layers whose channel counts are
 * multiples of 16. The workspace is 0, and the passes return false without touching anything,
 * where it does not apply (other geometry, no such oneDNN kernel on this CPU, too little
 * workspace, the double build); the conv2d kernels then run im2col. */
size_t ch_cpu_wino_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n);
/* Whether cpu_dnnl_conv.c's passes (the Winograd below, or the bf16 or fp32 direct convolutions
 * above) are the ones chosen for d by geometry: they come first in the conv2d kernels' chains. */
bool ch_cpu_dnnl_conv_takes(const ch_conv_desc *d, int n);
bool ch_cpu_wino_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                         const ch_real *w, const ch_real *b, ch_real *y);
bool ch_cpu_wino_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                               const ch_real *w, ch_real *dx);
bool ch_cpu_wino_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                  const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                  ch_real *db);

/* Winograd F(3x3, 5x5) (cpu_wino5.c), all three passes, for 5x5 stride-1 layers with at
 * least 8 channels in and 16 out; the same contract as above (0 and false where it does not apply
 * or the workspace is short). */
size_t ch_cpu_wino5_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n);
size_t ch_cpu_wino5_keep_bytes(const ch_kctx *kc, const ch_conv_desc *d, int n);
/* Whether the geometry is one it takes (no workspace query: that one sizes the point GEMMs, whose
 * cache is shared by the process). */
bool ch_cpu_wino5_applies(const ch_conv_desc *d);
/* Whether it takes d and multiplies its point GEMMs in bf16 (a d->bf16 layer on a CPU with native
 * bf16; F(3x3, 5x5) never: its transforms' coefficients would magnify the rounding further). */
bool ch_cpu_wino5_in_bf16(const ch_conv_desc *d);
bool ch_cpu_wino5_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                          const ch_real *w, const ch_real *b, ch_real *y);
bool ch_cpu_wino5_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                const ch_real *w, ch_real *dx);
bool ch_cpu_wino5_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                   const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                   ch_real *db);
/* backward_weights and backward_data in one pass (dy packed and transformed once); false where
 * either would be, or where dx overlaps x or dy. The two passes' bits. */
bool ch_cpu_wino5_backward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                          const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx,
                          ch_real *dw, ch_real *db);

/* Winograd F(4x4, 3x3) (cpu_wino3.c), all three passes, for 3x3 stride-1 layers with at least
 * 8 channels in and 16 out that cpu_dnnl_conv.c does not take; the same contract. */
size_t ch_cpu_wino3_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n);
size_t ch_cpu_wino3_keep_bytes(const ch_kctx *kc, const ch_conv_desc *d, int n);
bool ch_cpu_wino3_applies(const ch_conv_desc *d);
bool ch_cpu_wino3_in_bf16(const ch_conv_desc *d);
bool ch_cpu_wino3_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                          const ch_real *w, const ch_real *b, ch_real *y);
bool ch_cpu_wino3_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                const ch_real *w, ch_real *dx);
bool ch_cpu_wino3_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                   const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                   ch_real *db);
/* backward_weights and backward_data in one pass (dy packed and transformed once); false where
 * either would be, or where dx overlaps x or dy. The two passes' bits. */
bool ch_cpu_wino3_backward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                          const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx,
                          ch_real *dw, ch_real *db);
/* forward with y rounded to bf16 (the bits of forward's y, rounded to nearest even). */
bool ch_cpu_wino3_forward_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                               const ch_real *w, const ch_real *b, uint16_t *y);
/* forward and both backward passes of an input kept in bf16: the bits of the fp32 passes on x
 * widened. forward writes y, or where y is NULL yh rounded; backward's dx may be NULL (weights
 * only) and may overlap x (the passes then run apart), not dy. False only where the layer is not
 * one this Winograd takes at batch n (as forward's), or dx overlaps dy. */
bool ch_cpu_wino3_forward_of_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                                  const ch_real *w, const ch_real *b, ch_real *y, uint16_t *yh);
bool ch_cpu_wino3_backward_of_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                                   const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx, ch_real *dw,
                                   ch_real *db);
/* Both backward passes of dy kept in bf16 (dx NULL: the weights' pass alone), x from x or, where x
 * is NULL, widened from xh: the bits of the fp32 passes on dy widened. dx may overlap x, xh or dy
 * (the passes then run apart). False only where the layer is not one this Winograd takes at batch
 * n, or has a fused ReLU (whose backward masks dy in place). */
bool ch_cpu_wino3_backward_dy_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                   const uint16_t *xh, const uint16_t *dy, const ch_real *w, ch_real *dx,
                                   ch_real *dw, ch_real *db);

void ch_cpu_maxpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                              ch_real *y, int32_t *argmax);
/* The direct formulation for any window (the reference table uses it). */
void ch_cpu_maxpool2d_forward_direct(const ch_kctx *kc, const ch_pool_desc *d, int n,
                                     const ch_real *x, ch_real *y, int32_t *argmax);
void ch_cpu_maxpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n,
                               const ch_real *dy, const int32_t *argmax, ch_real *dx);
/* Its direct formulation (memset and scatter, any window; the reference table uses it). */
void ch_cpu_maxpool2d_backward_direct(const ch_kctx *kc, const ch_pool_desc *d, int n,
                                      const ch_real *dy, const int32_t *argmax, ch_real *dx);
void ch_cpu_upsample_forward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw,
                             const ch_real *x, ch_real *y);
void ch_cpu_upsample_backward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw,
                              const ch_real *dy, ch_real *dx);
void ch_cpu_avgpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                              ch_real *y);
void ch_cpu_avgpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n,
                               const ch_real *dy, ch_real *dx);
/* The direct formulations (the reference table uses them; the above have a 2x2 fast path). */
void ch_cpu_avgpool2d_forward_direct(const ch_kctx *kc, const ch_pool_desc *d, int n,
                                     const ch_real *x, ch_real *y);
void ch_cpu_avgpool2d_backward_direct(const ch_kctx *kc, const ch_pool_desc *d, int n,
                                      const ch_real *dy, ch_real *dx);

void ch_cpu_batchnorm_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                            double *mean, double *var);
void ch_cpu_batchnorm_stats_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                 double *mean, double *var);
void ch_cpu_batchnorm_finalize(const ch_kctx *kc, int c, const double *mean, const double *var, double count,
                               double eps, double momentum, const ch_real *gamma, const ch_real *beta,
                               ch_real *running_mean, ch_real *running_var, ch_real *save);
void ch_cpu_dropout_mask(const ch_kctx *kc, int n, size_t per, uint64_t seed, uint64_t stream, uint64_t step,
                         uint64_t sample0, uint32_t threshold, ch_real keep, ch_real *mask);
void ch_cpu_to_real(const ch_kctx *kc, size_t len, const double *x, ch_real *y);
void ch_cpu_channel_affine_keep_bf16(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                     const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep);
void ch_cpu_channel_affine_of_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                   const ch_real *scale, const ch_real *shift, ch_real *y);
void ch_cpu_batchnorm_backward_reduce_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                           const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                           double *sum_dy, double *sum_dy_xhat);
void ch_cpu_batchnorm_backward_data_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                         const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                         const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat,
                                         double count, ch_real *dx);
void ch_cpu_channel_affine(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                           const ch_real *scale, const ch_real *shift, ch_real *y);
/* A BatchNorm and the ReLU after it (kernels.h, bn_relu_*). */
void ch_cpu_bn_relu_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                            const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep);
void ch_cpu_bn_relu_forward_to_bf16(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                    const ch_real *scale, const ch_real *shift, uint16_t *y, uint16_t *keep);
/* A BatchNorm and the sum (and ReLU) over its output (kernels.h, bn_add_forward). */
void ch_cpu_bn_add_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                           const ch_real *scale, const ch_real *shift, const ch_real *res, bool relu, ch_real *y,
                           uint16_t *keep);
void ch_cpu_bn_relu_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                    const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                    const ch_real *scale, const ch_real *shift, double *sum_dy, double *sum_dy_xhat);
void ch_cpu_bn_relu_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                  const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                                  const ch_real *scale, const ch_real *shift, const double *sum_dy,
                                  const double *sum_dy_xhat, double count, ch_real *dx);
void ch_cpu_bn_backward_data_to_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *xh, const ch_real *dy,
                                     const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                                     const ch_real *scale, const ch_real *shift, const double *sum_dy,
                                     const double *sum_dy_xhat, double count, uint16_t *dx);
void ch_cpu_batchnorm_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                      const ch_real *dy, const ch_real *mean,
                                      const ch_real *invstd, double *sum_dy,
                                      double *sum_dy_xhat);
void ch_cpu_batchnorm_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                    const ch_real *dy, const ch_real *mean,
                                    const ch_real *invstd, const ch_real *gamma,
                                    const double *sum_dy, const double *sum_dy_xhat,
                                    double count, ch_real *dx);
void ch_cpu_bilinear_forward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align, const ch_real *x,
                             ch_real *y);
void ch_cpu_bilinear_backward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align,
                              const ch_real *dy, ch_real *dx);
void ch_cpu_layernorm_forward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x,
                              const ch_real *gamma, const ch_real *beta, double eps, ch_real *y, ch_real *mean,
                              ch_real *invstd);
void ch_cpu_layernorm_backward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x,
                               const ch_real *dy, const ch_real *gamma, const ch_real *mean, const ch_real *invstd,
                               ch_real *dx, ch_real *dgamma, ch_real *dbeta);

void ch_cpu_relu_forward(const ch_kctx *kc, size_t len, const ch_real *x, ch_real *y);
/* The same on the calling thread alone (a convolution's fused ReLU, one group at a time). */
void ch_cpu_relu_span(size_t len, const ch_real *x, ch_real *y);
void ch_cpu_relu_backward_span(size_t len, const ch_real *y, const ch_real *dy, ch_real *dx);
void ch_cpu_relu_backward(const ch_kctx *kc, size_t len, const ch_real *y, const ch_real *dy,
                          ch_real *dx);
/* Whether oneDNN dispatches to its AVX-512 kernels here (avx512_core or better). */
bool ch_cpu_avx512(void);
/* Whether oneDNN has native bf16 kernels here (avx512_core_bf16 or AMX); isa (len bytes) gets the
 * name of its effective ISA. */
bool ch_cpu_bf16_native(char *isa, size_t len);
/* COHORT_BF16=emulate on a CPU with AVX-512 and no native bf16: oneDNN's emulation of the bf16
 * instructions stands in for them (for the bf16 tests on machines that lack them: slower than
 * fp32, never a user's choice). 0 unset or empty, 1 emulate, -1 another value. */
int ch_cpu_bf16_emulate_mode(const char *s);
bool ch_cpu_bf16_emulated(void);
/* Whether the bf16 kernels run here: native, or emulated as above. */
bool ch_cpu_bf16_runs(char *isa, size_t len);
/* Whether --precision bf16 layers multiply in bf16 here (the convolutions' and Linear layers' bf16
 * kernels), or keep fp32 products and store only their kept activations in bf16: where the CPU's
 * bf16 products are the faster, native bf16 first. COHORT_BF16_PRODUCTS=on|off|auto overrides the
 * CPU's answer; why (len bytes) gets the reason. */
bool ch_cpu_bf16_products(char *why, size_t len);
/* COHORT_BF16_PRODUCTS's value: 1 on, 0 off, -1 auto (or unset), -2 not one of those. */
int ch_cpu_bf16_products_mode(const char *s);
/* Whether --precision bf16 passes convolution inputs in bf16 where the kernels take them
 * (conv2d_x_bf16): yes unless COHORT_BF16_INPUTS=off (values as COHORT_BF16_PRODUCTS's, auto
 * meaning on). For comparisons with the lazy test backend, which has no fused BatchNorm + ReLU and
 * so cannot take that path: the CPU then keeps those inputs fp32 as the lazy backend does. */
bool ch_cpu_bf16_inputs(void);
/* y[j] = sum_i x[i * len + j] (rows in order); optimizer updates (cpu_optim.c). */
void ch_cpu_col_sum(const ch_kctx *kc, int rows, size_t len, const ch_real *x, ch_real *y);
void ch_cpu_optim_update(const ch_kctx *kc, const ch_optim_update *u, size_t n, ch_real *p,
                         const ch_real *g, ch_real *s0, ch_real *s1);
void ch_cpu_add(const ch_kctx *kc, size_t len, const ch_real *a, const ch_real *b, ch_real *y);
void ch_cpu_act_forward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, ch_real *y);
void ch_cpu_act_backward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x,
                         const ch_real *y, const ch_real *dy, ch_real *dx);
void ch_cpu_bcast_forward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                          const ch_real *b, ch_real *y);
void ch_cpu_bcast_backward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                           const ch_real *b, const ch_real *dy, ch_real *da, ch_real *db);
void ch_cpu_permute(const ch_kctx *kc, const ch_permute_desc *d, int n, const ch_real *x, ch_real *y);
void ch_cpu_copy_rows(const ch_kctx *kc, int rows, size_t len, const ch_real *src,
                      size_t src_stride, ch_real *dst, size_t dst_stride);
/* Depthwise convolutions (cpu_conv_dw.c), which the grouped ones hand over to: direct, per plane,
 * or on small planes (ch_cpu_conv_dw_lanes) with 16 channels in the vector lanes. */
bool ch_cpu_conv_is_depthwise(const ch_conv_desc *d);
bool ch_cpu_conv_dw_lanes(const ch_conv_desc *d);
size_t ch_cpu_conv_dw_workspace(const ch_conv_desc *d, int nthreads);
void ch_cpu_conv_dw_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                            const ch_real *w, const ch_real *b, ch_real *y);
void ch_cpu_conv_dw_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                  const ch_real *w, ch_real *dx);
void ch_cpu_conv_dw_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                     const ch_real *y, ch_real *dy, ch_real *dw, ch_real *db);

/* Convolutions with groups or dilation (cpu_conv_group.c): per sample and group, im2col + GEMM. */
bool ch_cpu_conv_is_grouped(const ch_conv_desc *d);
size_t ch_cpu_conv_group_workspace(const ch_conv_desc *d, int n, int nthreads);
void ch_cpu_conv_group_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                               const ch_real *w, const ch_real *b, ch_real *y);
void ch_cpu_conv_group_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                     const ch_real *dy, const ch_real *w, ch_real *dx);
void ch_cpu_conv_group_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                        const ch_real *x, const ch_real *y, ch_real *dy,
                                        ch_real *dw, ch_real *db);
void ch_cpu_softmax_xent(const ch_kctx *kc, int n, int k, const ch_real *logits,
                         const int32_t *labels, double scale, ch_real *dlogits,
                         double *loss_sum, int64_t *correct);
void ch_cpu_mse(const ch_kctx *kc, size_t len, const ch_real *pred, const ch_real *target,
                double scale, ch_real *dpred, double *loss_sum);

#endif
