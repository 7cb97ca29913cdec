/* The CUDA plugin's kernel table (kernels.h): cuBLAS and cuDNN for GEMM and convolution
 * (cuda_dnn.c), this plugin's CUDA C for the rest (cuda_kernels.cu). With COHORT_CUDA_PROFILE=1
 * the plugin hands out the second table, each call timed on its stream (cuda_profile.c). */
#include "kernels/cuda/cuda_impl.h"

const ch_kernels ch_cuda_kernel_table = {
    .name = "cuda",
    .gemm = cu_gemm,
    .conv2d_workspace = cu_conv2d_workspace,
    .conv2d_forward = cu_conv2d_forward,
    .conv2d_backward_data = cu_conv2d_backward_data,
    .conv2d_backward_weights = cu_conv2d_backward_weights,
    .maxpool2d_forward = cu_maxpool2d_forward,
    .maxpool2d_backward = cu_maxpool2d_backward,
    .avgpool2d_forward = cu_avgpool2d_forward,
    .avgpool2d_backward = cu_avgpool2d_backward,
    .upsample_forward = cu_upsample_forward,
    .upsample_backward = cu_upsample_backward,
    .bilinear_forward = cu_bilinear_forward,
    .bilinear_backward = cu_bilinear_backward,
    .batchnorm_stats = cu_batchnorm_stats,
    .batchnorm_finalize = cu_batchnorm_finalize,
    .channel_affine = cu_channel_affine,
    .batchnorm_backward_reduce = cu_batchnorm_backward_reduce,
    .batchnorm_backward_data = cu_batchnorm_backward_data,
    .bn_relu_forward = cu_bn_relu_forward,
    .bn_relu_backward_reduce = cu_bn_relu_backward_reduce,
    .bn_relu_backward_data = cu_bn_relu_backward_data,
    .bn_add_forward = cu_bn_add_forward,
    .layernorm_forward = cu_layernorm_forward,
    .layernorm_backward = cu_layernorm_backward,
    .relu_forward = cu_relu_forward,
    .relu_backward = cu_relu_backward,
    .add = cu_add,
    .act_forward = cu_act_forward,
    .act_backward = cu_act_backward,
    .bcast_forward = cu_bcast_forward,
    .bcast_backward = cu_bcast_backward,
    .copy_rows = cu_copy_rows,
    .permute = cu_permute,
    .dropout_mask = cu_dropout_mask,
    .to_real = cu_to_real,
    .col_sum = cu_col_sum,
    .optim_update = cu_optim_update,
    .softmax_xent = cu_softmax_xent,
    .mse = cu_mse,
};

/* The same calls, timed (the wrappers follow kernels.h's members in order; index = member). */
static void p_gemm(const ch_kctx *kc, bool trans_a, bool trans_b, int m, int n, int k, ch_real alpha, const ch_real *a, int lda, const ch_real *b, int ldb, ch_real beta, ch_real *c, int ldc)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_gemm(kc, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    cu_profile_end(kc, 0, "gemm", ev_);
}

static void p_conv2d_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x, const ch_real *w, const ch_real *b, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_conv2d_forward(kc, d, n, x, w, b, y);
    cu_profile_end(kc, 2, "conv2d_forward", ev_);
}

static void p_conv2d_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy, const ch_real *w, ch_real *dx)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_conv2d_backward_data(kc, d, n, dy, w, dx);
    cu_profile_end(kc, 3, "conv2d_backward_data", ev_);
}

static void p_conv2d_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw, ch_real *db)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_conv2d_backward_weights(kc, d, n, x, y, dy, dw, db);
    cu_profile_end(kc, 4, "conv2d_backward_weights", ev_);
}

static void p_maxpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x, ch_real *y, int32_t *argmax)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_maxpool2d_forward(kc, d, n, x, y, argmax);
    cu_profile_end(kc, 5, "maxpool2d_forward", ev_);
}

static void p_maxpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy, const int32_t *argmax, ch_real *dx)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_maxpool2d_backward(kc, d, n, dy, argmax, dx);
    cu_profile_end(kc, 6, "maxpool2d_backward", ev_);
}

static void p_avgpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_avgpool2d_forward(kc, d, n, x, y);
    cu_profile_end(kc, 7, "avgpool2d_forward", ev_);
}

static void p_avgpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy, ch_real *dx)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_avgpool2d_backward(kc, d, n, dy, dx);
    cu_profile_end(kc, 8, "avgpool2d_backward", ev_);
}

static void p_upsample_forward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw, const ch_real *x, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_upsample_forward(kc, n, c, h, w, sh, sw, x, y);
    cu_profile_end(kc, 9, "upsample_forward", ev_);
}

static void p_upsample_backward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw, const ch_real *dy, ch_real *dx)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_upsample_backward(kc, n, c, h, w, sh, sw, dy, dx);
    cu_profile_end(kc, 10, "upsample_backward", ev_);
}

static void p_batchnorm_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, double *mean, double *var)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_batchnorm_stats(kc, n, c, hw, x, mean, var);
    cu_profile_end(kc, 11, "batchnorm_stats", ev_);
}

static void p_batchnorm_finalize(const ch_kctx *kc, int c, const double *mean, const double *var, double count, double eps, double momentum, const ch_real *gamma, const ch_real *beta, ch_real *running_mean, ch_real *running_var, ch_real *save)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_batchnorm_finalize(kc, c, mean, var, count, eps, momentum, gamma, beta, running_mean, running_var, save);
    cu_profile_end(kc, 12, "batchnorm_finalize", ev_);
}

static void p_channel_affine(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *scale, const ch_real *shift, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_channel_affine(kc, n, c, hw, x, scale, shift, y);
    cu_profile_end(kc, 13, "channel_affine", ev_);
}

static void p_batchnorm_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *dy, const ch_real *mean, const ch_real *invstd, double *sum_dy, double *sum_dy_xhat)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_batchnorm_backward_reduce(kc, n, c, hw, x, dy, mean, invstd, sum_dy, sum_dy_xhat);
    cu_profile_end(kc, 14, "batchnorm_backward_reduce", ev_);
}

static void p_batchnorm_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat, double count, ch_real *dx)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_batchnorm_backward_data(kc, n, c, hw, x, dy, mean, invstd, gamma, sum_dy, sum_dy_xhat, count, dx);
    cu_profile_end(kc, 15, "batchnorm_backward_data", ev_);
}

static void p_bn_relu_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh, const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_bn_relu_forward(kc, n, c, hw, x, xh, scale, shift, y, keep);
    cu_profile_end(kc, 35, "bn_relu_forward", ev_);
}

static void p_bn_relu_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh, const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *scale, const ch_real *shift, double *sum_dy, double *sum_dy_xhat)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_bn_relu_backward_reduce(kc, n, c, hw, x, xh, dy, mean, invstd, scale, shift, sum_dy, sum_dy_xhat);
    cu_profile_end(kc, 36, "bn_relu_backward_reduce", ev_);
}

static void p_bn_relu_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh, const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma, const ch_real *scale, const ch_real *shift, const double *sum_dy, const double *sum_dy_xhat, double count, ch_real *dx)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_bn_relu_backward_data(kc, n, c, hw, x, xh, dy, mean, invstd, gamma, scale, shift, sum_dy, sum_dy_xhat, count, dx);
    cu_profile_end(kc, 37, "bn_relu_backward_data", ev_);
}

static void p_bn_add_forward(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh, const ch_real *scale, const ch_real *shift, const ch_real *res, bool relu, ch_real *y, uint16_t *keep)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_bn_add_forward(kc, n, c, hw, x, xh, scale, shift, res, relu, y, keep);
    cu_profile_end(kc, 38, "bn_add_forward", ev_);
}

static void p_bilinear_forward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align, const ch_real *x, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_bilinear_forward(kc, planes, h, w, oh, ow, align, x, y);
    cu_profile_end(kc, 32, "bilinear_forward", ev_);
}

static void p_bilinear_backward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align, const ch_real *dy, ch_real *dx)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_bilinear_backward(kc, planes, h, w, oh, ow, align, dy, dx);
    cu_profile_end(kc, 33, "bilinear_backward", ev_);
}

static void p_layernorm_forward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *gamma, const ch_real *beta, double eps, ch_real *y, ch_real *mean, ch_real *invstd)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_layernorm_forward(kc, outer, len, inner, x, gamma, beta, eps, y, mean, invstd);
    cu_profile_end(kc, 30, "layernorm_forward", ev_);
}

static void p_layernorm_backward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *dy, const ch_real *gamma, const ch_real *mean, const ch_real *invstd, ch_real *dx, ch_real *dgamma, ch_real *dbeta)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_layernorm_backward(kc, outer, len, inner, x, dy, gamma, mean, invstd, dx, dgamma, dbeta);
    cu_profile_end(kc, 31, "layernorm_backward", ev_);
}

static void p_relu_forward(const ch_kctx *kc, size_t len, const ch_real *x, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_relu_forward(kc, len, x, y);
    cu_profile_end(kc, 16, "relu_forward", ev_);
}

static void p_relu_backward(const ch_kctx *kc, size_t len, const ch_real *y, const ch_real *dy, ch_real *dx)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_relu_backward(kc, len, y, dy, dx);
    cu_profile_end(kc, 17, "relu_backward", ev_);
}

static void p_add(const ch_kctx *kc, size_t len, const ch_real *a, const ch_real *b, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_add(kc, len, a, b, y);
    cu_profile_end(kc, 18, "add", ev_);
}

static void p_act_forward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_act_forward(kc, a, len, x, y);
    cu_profile_end(kc, 19, "act_forward", ev_);
}

static void p_act_backward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, const ch_real *y, const ch_real *dy, ch_real *dx)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_act_backward(kc, a, len, x, y, dy, dx);
    cu_profile_end(kc, 20, "act_backward", ev_);
}

static void p_bcast_forward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a, const ch_real *b, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_bcast_forward(kc, d, n, a, b, y);
    cu_profile_end(kc, 21, "bcast_forward", ev_);
}

static void p_bcast_backward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a, const ch_real *b, const ch_real *dy, ch_real *da, ch_real *db)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_bcast_backward(kc, d, n, a, b, dy, da, db);
    cu_profile_end(kc, 22, "bcast_backward", ev_);
}

static void p_copy_rows(const ch_kctx *kc, int rows, size_t len, const ch_real *src, size_t src_stride, ch_real *dst, size_t dst_stride)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_copy_rows(kc, rows, len, src, src_stride, dst, dst_stride);
    cu_profile_end(kc, 23, "copy_rows", ev_);
}

static void p_permute(const ch_kctx *kc, const ch_permute_desc *d, int n, const ch_real *x, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_permute(kc, d, n, x, y);
    cu_profile_end(kc, 34, "permute", ev_);
}

static void p_dropout_mask(const ch_kctx *kc, int n, size_t per, uint64_t seed, uint64_t stream, uint64_t step, uint64_t sample0, uint32_t threshold, ch_real keep, ch_real *mask)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_dropout_mask(kc, n, per, seed, stream, step, sample0, threshold, keep, mask);
    cu_profile_end(kc, 24, "dropout_mask", ev_);
}

static void p_to_real(const ch_kctx *kc, size_t len, const double *x, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_to_real(kc, len, x, y);
    cu_profile_end(kc, 25, "to_real", ev_);
}

static void p_col_sum(const ch_kctx *kc, int rows, size_t len, const ch_real *x, ch_real *y)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_col_sum(kc, rows, len, x, y);
    cu_profile_end(kc, 26, "col_sum", ev_);
}

static void p_optim_update(const ch_kctx *kc, const struct ch_optim_update *u, size_t n, ch_real *p, const ch_real *g, ch_real *s0, ch_real *s1)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_optim_update(kc, u, n, p, g, s0, s1);
    cu_profile_end(kc, 27, "optim_update", ev_);
}

static void p_softmax_xent(const ch_kctx *kc, int n, int k, const ch_real *logits, const int32_t *labels, double scale, ch_real *dlogits, double *loss_sum, int64_t *correct)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_softmax_xent(kc, n, k, logits, labels, scale, dlogits, loss_sum, correct);
    cu_profile_end(kc, 28, "softmax_xent", ev_);
}

static void p_mse(const ch_kctx *kc, size_t len, const ch_real *pred, const ch_real *target, double scale, ch_real *dpred, double *loss_sum)
{
    const cudaEvent_t ev_ = cu_profile_begin(kc);
    cu_mse(kc, len, pred, target, scale, dpred, loss_sum);
    cu_profile_end(kc, 29, "mse", ev_);
}

const ch_kernels ch_cuda_kernel_table_profiled = {
    .name = "cuda",
    .gemm = p_gemm,
    .conv2d_workspace = cu_conv2d_workspace,
    .conv2d_forward = p_conv2d_forward,
    .conv2d_backward_data = p_conv2d_backward_data,
    .conv2d_backward_weights = p_conv2d_backward_weights,
    .maxpool2d_forward = p_maxpool2d_forward,
    .maxpool2d_backward = p_maxpool2d_backward,
    .avgpool2d_forward = p_avgpool2d_forward,
    .avgpool2d_backward = p_avgpool2d_backward,
    .upsample_forward = p_upsample_forward,
    .upsample_backward = p_upsample_backward,
    .bilinear_forward = p_bilinear_forward,
    .bilinear_backward = p_bilinear_backward,
    .batchnorm_stats = p_batchnorm_stats,
    .batchnorm_finalize = p_batchnorm_finalize,
    .channel_affine = p_channel_affine,
    .batchnorm_backward_reduce = p_batchnorm_backward_reduce,
    .batchnorm_backward_data = p_batchnorm_backward_data,
    .bn_relu_forward = p_bn_relu_forward,
    .bn_relu_backward_reduce = p_bn_relu_backward_reduce,
    .bn_relu_backward_data = p_bn_relu_backward_data,
    .bn_add_forward = p_bn_add_forward,
    .layernorm_forward = p_layernorm_forward,
    .layernorm_backward = p_layernorm_backward,
    .relu_forward = p_relu_forward,
    .relu_backward = p_relu_backward,
    .add = p_add,
    .act_forward = p_act_forward,
    .act_backward = p_act_backward,
    .bcast_forward = p_bcast_forward,
    .bcast_backward = p_bcast_backward,
    .copy_rows = p_copy_rows,
    .permute = p_permute,
    .dropout_mask = p_dropout_mask,
    .to_real = p_to_real,
    .col_sum = p_col_sum,
    .optim_update = p_optim_update,
    .softmax_xent = p_softmax_xent,
    .mse = p_mse,
};
