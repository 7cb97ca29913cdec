/* The CUDA plugin's internals, shared by its C host code (cuda_ops.c, cuda_dnn.c, cuda_table.c)
 * and its kernels (cuda_kernels.cu, compiled by nvcc as C++). A ch_stream of this backend is a
 * cu_stream; the compute stream also owns the cuBLAS and cuDNN handles bound to it, so replicas
 * that share a GPU never share a handle. Every CUDA, cuBLAS and cuDNN return code is checked: a
 * failure inside a kernel call (which cannot return one) is one line naming the call and the
 * error, and the process exits, as a device fault leaves nothing to recover. */
#ifndef CH_KERNELS_CUDA_IMPL_H
#define CH_KERNELS_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "kernels/kernels.h"
#ifndef __CUDACC__
#include "core/status.h"   /* C11 only (_Noreturn): the host files need it, the kernels do not */
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cu_stream {
    cudaStream_t s;
    int device;
    cublasHandle_t blas;   /* compute stream only, else NULL */
    cudnnHandle_t dnn;
    /* The partial sums of the reductions over a channel (BatchNorm's, a convolution's bias
     * gradient), device memory in the compute stream's order: CU_SCRATCH doubles. */
    double *scratch;
} cu_stream;

enum { CU_SCRATCH = 1 << 19 };

/* Reports the failed call (what), the library's name for the error, and where; exits. */
void cu_fail(const char *what, const char *error, const char *file, int line);
/* Make device current on this thread (a no-op when it already is). */
void cu_use_device(int device);
/* The kernel's stream (its device made current); the legacy stream when kc has none. */
cudaStream_t cu_stream_of(const ch_kctx *kc);
const cu_stream *cu_of(const ch_kctx *kc);

#define CU_CHECK(call)                                                                     \
    do {                                                                                   \
        const cudaError_t cu_e_ = (call);                                                  \
        if (cu_e_ != cudaSuccess) cu_fail(#call, cudaGetErrorName(cu_e_), __FILE__, __LINE__); \
    } while (0)
#define CUBLAS_CHECK(call)                                                                       \
    do {                                                                                         \
        const cublasStatus_t cu_e_ = (call);                                                     \
        if (cu_e_ != CUBLAS_STATUS_SUCCESS) cu_fail(#call, cublasGetStatusName(cu_e_), __FILE__, __LINE__); \
    } while (0)
#define CUDNN_CHECK(call)                                                                        \
    do {                                                                                         \
        const cudnnStatus_t cu_e_ = (call);                                                      \
        if (cu_e_ != CUDNN_STATUS_SUCCESS) cu_fail(#call, cudnnGetErrorString(cu_e_), __FILE__, __LINE__); \
    } while (0)

/* cuda_kernels.cu: the kernels written here, each on kc's stream. */
void cu_relu_forward(const ch_kctx *kc, size_t len, const ch_real *x, ch_real *y);
void cu_relu_backward(const ch_kctx *kc, size_t len, const ch_real *y, const ch_real *dy, ch_real *dx);
void cu_add(const ch_kctx *kc, size_t len, const ch_real *a, const ch_real *b, ch_real *y);
void cu_act_forward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, ch_real *y);
void cu_act_backward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, const ch_real *y,
                     const ch_real *dy, ch_real *dx);
void cu_bcast_forward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a, const ch_real *b,
                      ch_real *y);
void cu_bcast_backward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a, const ch_real *b,
                       const ch_real *dy, ch_real *da, ch_real *db);
void cu_copy_rows(const ch_kctx *kc, int rows, size_t len, const ch_real *src, size_t src_stride, ch_real *dst,
                  size_t dst_stride);
void cu_permute(const ch_kctx *kc, const ch_permute_desc *d, int n, const ch_real *x, ch_real *y);
void cu_dropout_mask(const ch_kctx *kc, int n, size_t per, uint64_t seed, uint64_t stream, uint64_t step,
                     uint64_t sample0, uint32_t threshold, ch_real keep, ch_real *mask);
void cu_to_real(const ch_kctx *kc, size_t len, const double *x, ch_real *y);
void cu_col_sum(const ch_kctx *kc, int rows, size_t len, const ch_real *x, ch_real *y);
void cu_optim_update(const ch_kctx *kc, const ch_optim_update *u, size_t n, ch_real *p, const ch_real *g,
                     ch_real *s0, ch_real *s1);
void cu_softmax_xent(const ch_kctx *kc, int n, int k, const ch_real *logits, const int32_t *labels, double scale,
                     ch_real *dlogits, double *loss_sum, int64_t *correct);
void cu_mse(const ch_kctx *kc, size_t len, const ch_real *pred, const ch_real *target, double scale,
            ch_real *dpred, double *loss_sum);
void cu_maxpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x, ch_real *y,
                          int32_t *argmax);
void cu_maxpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy,
                           const int32_t *argmax, ch_real *dx);
void cu_avgpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x, ch_real *y);
void cu_avgpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy, ch_real *dx);
void cu_upsample_forward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw, const ch_real *x,
                         ch_real *y);
void cu_upsample_backward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw, const ch_real *dy,
                          ch_real *dx);
void cu_batchnorm_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, double *mean, double *var);
void cu_batchnorm_finalize(const ch_kctx *kc, int c, const double *mean, const double *var, double count,
                           double eps, double momentum, const ch_real *gamma, const ch_real *beta,
                           ch_real *running_mean, ch_real *running_var, ch_real *save);
void cu_channel_affine(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *scale,
                       const ch_real *shift, ch_real *y);
void cu_batchnorm_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *dy,
                                  const ch_real *mean, const ch_real *invstd, double *sum_dy, double *sum_dy_xhat);
void cu_batchnorm_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *dy,
                                const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                                const double *sum_dy, const double *sum_dy_xhat, double count, ch_real *dx);
void cu_bn_relu_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                        const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep);
void cu_bn_relu_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *scale,
                                const ch_real *shift, double *sum_dy, double *sum_dy_xhat);
void cu_bn_relu_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                              const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                              const ch_real *scale, const ch_real *shift, const double *sum_dy,
                              const double *sum_dy_xhat, double count, ch_real *dx);
void cu_bn_add_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                       const ch_real *scale, const ch_real *shift, const ch_real *res, bool relu, ch_real *y,
                       uint16_t *keep);
void cu_bilinear_forward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align, const ch_real *x,
                         ch_real *y);
void cu_bilinear_backward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align, const ch_real *dy,
                          ch_real *dx);
void cu_layernorm_forward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *gamma,
                          const ch_real *beta, double eps, ch_real *y, ch_real *mean, ch_real *invstd);
void cu_layernorm_backward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *dy,
                           const ch_real *gamma, const ch_real *mean, const ch_real *invstd, ch_real *dx,
                           ch_real *dgamma, ch_real *dbeta);
/* The convolution's companions: y += b[o] then ReLU where asked; dy = 0 where y <= 0; db[o] = the
 * sum of dy over samples and positions. */
void cu_bias_relu(const ch_kctx *kc, int n, int oc, int hw, const ch_real *b, bool relu, ch_real *y);
void cu_relu_mask(const ch_kctx *kc, size_t len, const ch_real *y, ch_real *dy);
void cu_channel_sum(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, ch_real *sum);

#ifndef __CUDACC__
/* cuda_nccl.c: the NCCL communicator (plugin.h says what each does). */
struct ch_comm;
ch_status cu_nccl_id(unsigned char id[128], ch_err *err);
ch_status cu_nccl_init(struct ch_comm *c, int device, int nranks, int rank, const unsigned char id[128], double timeout_s,
                       ch_err *err);
void cu_nccl_free(struct ch_comm *c);
#endif

/* cuda_profile.c: COHORT_CUDA_PROFILE's events around a call. */
cudaEvent_t cu_profile_begin(const ch_kctx *kc);
void cu_profile_end(const ch_kctx *kc, int kind, const char *name, cudaEvent_t start);

/* cuda_dnn.c: cuBLAS and cuDNN. */
void cu_gemm(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, ch_real alpha, const ch_real *a, int lda,
             const ch_real *b, int ldb, ch_real beta, ch_real *c, int ldc);
size_t cu_conv2d_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n);
void cu_conv2d_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x, const ch_real *w,
                       const ch_real *b, ch_real *y);
void cu_conv2d_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy, const ch_real *w,
                             ch_real *dx);
void cu_conv2d_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x, const ch_real *y,
                                ch_real *dy, ch_real *dw, ch_real *db);

#ifdef __cplusplus
}
#endif

#endif
