/* The lazy backend's kernel table: each kernel is queued on its context's stream with a copy of
 * its arguments (descriptors by value: callers' descriptors may live on their stack) and runs
 * later as the scramble backend's kernel, on scrambled memory. Pointers are kept as they are:
 * tensors are replica memory; the double results and inputs of the BatchNorm and loss kernels are
 * host memory read and written when the kernel runs, so the host waits before reading them. The
 * normalisation kernels are lazy_norm.c's. */
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/lazy/lazy.h"

static const ch_kernels *sc(void) { return ch_kernels_scramble(); }

typedef struct gemm_args {
    bool ta;
    bool tb;
    int m;
    int n;
    int k;
    ch_real alpha;
    const ch_real *a;
    int lda;
    const ch_real *b;
    int ldb;
    ch_real beta;
    ch_real *c;
    int ldc;
} gemm_args;

static void run_gemm(const ch_kctx *kc, const void *args)
{
    const gemm_args *g = args;
    sc()->gemm(kc, g->ta, g->tb, g->m, g->n, g->k, g->alpha, g->a, g->lda, g->b, g->ldb, g->beta, g->c, g->ldc);
}

static void lz_gemm(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, ch_real alpha, const ch_real *a, int lda, const ch_real *b, int ldb, ch_real beta, ch_real *c, int ldc)
{
    const gemm_args queued = { ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc };
    ch_lazy_queue_call(kc, run_gemm, &queued, sizeof queued);
}

typedef struct gemm_bf16_args {
    bool ta;
    bool tb;
    int m;
    int n;
    int k;
    const ch_real *a;
    int lda;
    const ch_real *b;
    int ldb;
    bool accumulate;
    ch_real *c;
    int ldc;
} gemm_bf16_args;

static void run_gemm_bf16(const ch_kctx *kc, const void *args)
{
    const gemm_bf16_args *g = args;
    sc()->gemm_bf16(kc, g->ta, g->tb, g->m, g->n, g->k, g->a, g->lda, g->b, g->ldb, g->accumulate, g->c, g->ldc);
}

static void lz_gemm_bf16(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, const ch_real *a, int lda, const ch_real *b, int ldb, bool accumulate, ch_real *c, int ldc)
{
    const gemm_bf16_args queued = { ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc };
    ch_lazy_queue_call(kc, run_gemm_bf16, &queued, sizeof queued);
}

typedef struct conv2d_forward_args {
    ch_conv_desc d;
    int n;
    const ch_real *x;
    const ch_real *w;
    const ch_real *b;
    void *y;   /* ch_real, or uint16_t for the bf16 sibling */
} conv2d_forward_args;

static void run_conv2d_forward(const ch_kctx *kc, const void *args)
{
    const conv2d_forward_args *g = args;
    sc()->conv2d_forward(kc, &g->d, g->n, g->x, g->w, g->b, g->y);
}

static void lz_conv2d_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x, const ch_real *w, const ch_real *b, ch_real *y)
{
    const conv2d_forward_args queued = { *d, n, x, w, b, y };
    ch_lazy_queue_call(kc, run_conv2d_forward, &queued, sizeof queued);
}

static void run_conv2d_forward_bf16(const ch_kctx *kc, const void *args)
{
    const conv2d_forward_args *g = args;
    sc()->conv2d_forward_bf16(kc, &g->d, g->n, g->x, g->w, g->b, g->y);
}

static void lz_conv2d_forward_bf16(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                   const ch_real *w, const ch_real *b, uint16_t *y)
{
    const conv2d_forward_args queued = { *d, n, x, w, b, y };
    ch_lazy_queue_call(kc, run_conv2d_forward_bf16, &queued, sizeof queued);
}

typedef struct conv2d_backward_data_args {
    ch_conv_desc d;
    int n;
    const ch_real *dy;
    const ch_real *w;
    ch_real *dx;
} conv2d_backward_data_args;

static void run_conv2d_backward_data(const ch_kctx *kc, const void *args)
{
    const conv2d_backward_data_args *g = args;
    sc()->conv2d_backward_data(kc, &g->d, g->n, g->dy, g->w, g->dx);
}

static void lz_conv2d_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy, const ch_real *w, ch_real *dx)
{
    const conv2d_backward_data_args queued = { *d, n, dy, w, dx };
    ch_lazy_queue_call(kc, run_conv2d_backward_data, &queued, sizeof queued);
}

typedef struct conv2d_backward_weights_args {
    ch_conv_desc d;
    int n;
    const ch_real *x;
    const ch_real *y;
    ch_real *dy;
    ch_real *dw;
    ch_real *db;
} conv2d_backward_weights_args;

static void run_conv2d_backward_weights(const ch_kctx *kc, const void *args)
{
    const conv2d_backward_weights_args *g = args;
    sc()->conv2d_backward_weights(kc, &g->d, g->n, g->x, g->y, g->dy, g->dw, g->db);
}

static void lz_conv2d_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw, ch_real *db)
{
    const conv2d_backward_weights_args queued = { *d, n, x, y, dy, dw, db };
    ch_lazy_queue_call(kc, run_conv2d_backward_weights, &queued, sizeof queued);
}

typedef struct maxpool2d_forward_args {
    ch_pool_desc d;
    int n;
    const ch_real *x;
    ch_real *y;
    int32_t *argmax;
} maxpool2d_forward_args;

static void run_maxpool2d_forward(const ch_kctx *kc, const void *args)
{
    const maxpool2d_forward_args *g = args;
    sc()->maxpool2d_forward(kc, &g->d, g->n, g->x, g->y, g->argmax);
}

static void lz_maxpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x, ch_real *y, int32_t *argmax)
{
    const maxpool2d_forward_args queued = { *d, n, x, y, argmax };
    ch_lazy_queue_call(kc, run_maxpool2d_forward, &queued, sizeof queued);
}

typedef struct maxpool2d_backward_args {
    ch_pool_desc d;
    int n;
    const ch_real *dy;
    const int32_t *argmax;
    ch_real *dx;
} maxpool2d_backward_args;

static void run_maxpool2d_backward(const ch_kctx *kc, const void *args)
{
    const maxpool2d_backward_args *g = args;
    sc()->maxpool2d_backward(kc, &g->d, g->n, g->dy, g->argmax, g->dx);
}

static void lz_maxpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy, const int32_t *argmax, ch_real *dx)
{
    const maxpool2d_backward_args queued = { *d, n, dy, argmax, dx };
    ch_lazy_queue_call(kc, run_maxpool2d_backward, &queued, sizeof queued);
}

typedef struct avgpool2d_forward_args {
    ch_pool_desc d;
    int n;
    const ch_real *x;
    ch_real *y;
} avgpool2d_forward_args;

static void run_avgpool2d_forward(const ch_kctx *kc, const void *args)
{
    const avgpool2d_forward_args *g = args;
    sc()->avgpool2d_forward(kc, &g->d, g->n, g->x, g->y);
}

static void lz_avgpool2d_forward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x, ch_real *y)
{
    const avgpool2d_forward_args queued = { *d, n, x, y };
    ch_lazy_queue_call(kc, run_avgpool2d_forward, &queued, sizeof queued);
}

typedef struct avgpool2d_backward_args {
    ch_pool_desc d;
    int n;
    const ch_real *dy;
    ch_real *dx;
} avgpool2d_backward_args;

static void run_avgpool2d_backward(const ch_kctx *kc, const void *args)
{
    const avgpool2d_backward_args *g = args;
    sc()->avgpool2d_backward(kc, &g->d, g->n, g->dy, g->dx);
}

static void lz_avgpool2d_backward(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy, ch_real *dx)
{
    const avgpool2d_backward_args queued = { *d, n, dy, dx };
    ch_lazy_queue_call(kc, run_avgpool2d_backward, &queued, sizeof queued);
}

typedef struct upsample_forward_args {
    int n;
    int c;
    int h;
    int w;
    int sh;
    int sw;
    const ch_real *x;
    ch_real *y;
} upsample_forward_args;

static void run_upsample_forward(const ch_kctx *kc, const void *args)
{
    const upsample_forward_args *g = args;
    sc()->upsample_forward(kc, g->n, g->c, g->h, g->w, g->sh, g->sw, g->x, g->y);
}

static void lz_upsample_forward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw, const ch_real *x, ch_real *y)
{
    const upsample_forward_args queued = { n, c, h, w, sh, sw, x, y };
    ch_lazy_queue_call(kc, run_upsample_forward, &queued, sizeof queued);
}

typedef struct upsample_backward_args {
    int n;
    int c;
    int h;
    int w;
    int sh;
    int sw;
    const ch_real *dy;
    ch_real *dx;
} upsample_backward_args;

static void run_upsample_backward(const ch_kctx *kc, const void *args)
{
    const upsample_backward_args *g = args;
    sc()->upsample_backward(kc, g->n, g->c, g->h, g->w, g->sh, g->sw, g->dy, g->dx);
}

static void lz_upsample_backward(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw, const ch_real *dy, ch_real *dx)
{
    const upsample_backward_args queued = { n, c, h, w, sh, sw, dy, dx };
    ch_lazy_queue_call(kc, run_upsample_backward, &queued, sizeof queued);
}

typedef struct dropout_mask_args {
    int n;
    size_t per;
    uint64_t seed, stream, step, sample0;
    uint32_t threshold;
    ch_real keep;
    ch_real *mask;
} dropout_mask_args;

static void run_dropout_mask(const ch_kctx *kc, const void *args)
{
    const dropout_mask_args *g = args;
    sc()->dropout_mask(kc, g->n, g->per, g->seed, g->stream, g->step, g->sample0, g->threshold, g->keep, g->mask);
}

static void lz_dropout_mask(const ch_kctx *kc, int n, size_t per, uint64_t seed, uint64_t stream, uint64_t step,
                            uint64_t sample0, uint32_t threshold, ch_real keep, ch_real *mask)
{
    const dropout_mask_args queued = { n, per, seed, stream, step, sample0, threshold, keep, mask };
    ch_lazy_queue_call(kc, run_dropout_mask, &queued, sizeof queued);
}

typedef struct bilinear_args {
    int planes, h, w, oh, ow;
    bool align;
    const ch_real *from;
    ch_real *to;
} bilinear_args;

static void run_bilinear_forward(const ch_kctx *kc, const void *args)
{
    const bilinear_args *g = args;
    sc()->bilinear_forward(kc, g->planes, g->h, g->w, g->oh, g->ow, g->align, g->from, g->to);
}

static void lz_bilinear_forward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align, const ch_real *x, ch_real *y)
{
    const bilinear_args queued = { planes, h, w, oh, ow, align, x, y };
    ch_lazy_queue_call(kc, run_bilinear_forward, &queued, sizeof queued);
}

static void run_bilinear_backward(const ch_kctx *kc, const void *args)
{
    const bilinear_args *g = args;
    sc()->bilinear_backward(kc, g->planes, g->h, g->w, g->oh, g->ow, g->align, g->from, g->to);
}

static void lz_bilinear_backward(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align, const ch_real *dy, ch_real *dx)
{
    const bilinear_args queued = { planes, h, w, oh, ow, align, dy, dx };
    ch_lazy_queue_call(kc, run_bilinear_backward, &queued, sizeof queued);
}

typedef struct relu_forward_args {
    size_t len;
    const ch_real *x;
    ch_real *y;
} relu_forward_args;

static void run_relu_forward(const ch_kctx *kc, const void *args)
{
    const relu_forward_args *g = args;
    sc()->relu_forward(kc, g->len, g->x, g->y);
}

static void lz_relu_forward(const ch_kctx *kc, size_t len, const ch_real *x, ch_real *y)
{
    const relu_forward_args queued = { len, x, y };
    ch_lazy_queue_call(kc, run_relu_forward, &queued, sizeof queued);
}

typedef struct relu_backward_args {
    size_t len;
    const ch_real *y;
    const ch_real *dy;
    ch_real *dx;
} relu_backward_args;

static void run_relu_backward(const ch_kctx *kc, const void *args)
{
    const relu_backward_args *g = args;
    sc()->relu_backward(kc, g->len, g->y, g->dy, g->dx);
}

static void lz_relu_backward(const ch_kctx *kc, size_t len, const ch_real *y, const ch_real *dy, ch_real *dx)
{
    const relu_backward_args queued = { len, y, dy, dx };
    ch_lazy_queue_call(kc, run_relu_backward, &queued, sizeof queued);
}

typedef struct add_args {
    size_t len;
    const ch_real *a;
    const ch_real *b;
    ch_real *y;
} add_args;

static void run_add(const ch_kctx *kc, const void *args)
{
    const add_args *g = args;
    sc()->add(kc, g->len, g->a, g->b, g->y);
}

static void lz_add(const ch_kctx *kc, size_t len, const ch_real *a, const ch_real *b, ch_real *y)
{
    const add_args queued = { len, a, b, y };
    ch_lazy_queue_call(kc, run_add, &queued, sizeof queued);
}

typedef struct act_forward_args {
    ch_act a;
    size_t len;
    const ch_real *x;
    ch_real *y;
} act_forward_args;

static void run_act_forward(const ch_kctx *kc, const void *args)
{
    const act_forward_args *g = args;
    sc()->act_forward(kc, &g->a, g->len, g->x, g->y);
}

static void lz_act_forward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, ch_real *y)
{
    const act_forward_args queued = { *a, len, x, y };
    ch_lazy_queue_call(kc, run_act_forward, &queued, sizeof queued);
}

typedef struct act_backward_args {
    ch_act a;
    size_t len;
    const ch_real *x;
    const ch_real *y;
    const ch_real *dy;
    ch_real *dx;
} act_backward_args;

static void run_act_backward(const ch_kctx *kc, const void *args)
{
    const act_backward_args *g = args;
    sc()->act_backward(kc, &g->a, g->len, g->x, g->y, g->dy, g->dx);
}

static void lz_act_backward(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x, const ch_real *y, const ch_real *dy, ch_real *dx)
{
    const act_backward_args queued = { *a, len, x, y, dy, dx };
    ch_lazy_queue_call(kc, run_act_backward, &queued, sizeof queued);
}

typedef struct bcast_forward_args {
    ch_bcast_desc d;
    int n;
    const ch_real *a;
    const ch_real *b;
    ch_real *y;
} bcast_forward_args;

static void run_bcast_forward(const ch_kctx *kc, const void *args)
{
    const bcast_forward_args *g = args;
    sc()->bcast_forward(kc, &g->d, g->n, g->a, g->b, g->y);
}

static void lz_bcast_forward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a, const ch_real *b, ch_real *y)
{
    const bcast_forward_args queued = { *d, n, a, b, y };
    ch_lazy_queue_call(kc, run_bcast_forward, &queued, sizeof queued);
}

typedef struct bcast_backward_args {
    ch_bcast_desc d;
    int n;
    const ch_real *a;
    const ch_real *b;
    const ch_real *dy;
    ch_real *da;
    ch_real *db;
} bcast_backward_args;

static void run_bcast_backward(const ch_kctx *kc, const void *args)
{
    const bcast_backward_args *g = args;
    sc()->bcast_backward(kc, &g->d, g->n, g->a, g->b, g->dy, g->da, g->db);
}

static void lz_bcast_backward(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a, const ch_real *b, const ch_real *dy, ch_real *da, ch_real *db)
{
    const bcast_backward_args queued = { *d, n, a, b, dy, da, db };
    ch_lazy_queue_call(kc, run_bcast_backward, &queued, sizeof queued);
}

typedef struct permute_args {
    ch_permute_desc d;
    int n;
    const ch_real *x;
    ch_real *y;
} permute_args;

static void run_permute(const ch_kctx *kc, const void *args)
{
    const permute_args *g = args;
    sc()->permute(kc, &g->d, g->n, g->x, g->y);
}

static void lz_permute(const ch_kctx *kc, const ch_permute_desc *d, int n, const ch_real *x, ch_real *y)
{
    const permute_args queued = { *d, n, x, y };
    ch_lazy_queue_call(kc, run_permute, &queued, sizeof queued);
}

typedef struct copy_rows_args {
    int rows;
    size_t len;
    const ch_real *src;
    size_t src_stride;
    ch_real *dst;
    size_t dst_stride;
} copy_rows_args;

static void run_copy_rows(const ch_kctx *kc, const void *args)
{
    const copy_rows_args *g = args;
    sc()->copy_rows(kc, g->rows, g->len, g->src, g->src_stride, g->dst, g->dst_stride);
}

static void lz_copy_rows(const ch_kctx *kc, int rows, size_t len, const ch_real *src, size_t src_stride, ch_real *dst, size_t dst_stride)
{
    const copy_rows_args queued = { rows, len, src, src_stride, dst, dst_stride };
    ch_lazy_queue_call(kc, run_copy_rows, &queued, sizeof queued);
}

typedef struct col_sum_args {
    int rows;
    size_t len;
    const ch_real *x;
    ch_real *y;
} col_sum_args;

static void run_col_sum(const ch_kctx *kc, const void *args)
{
    const col_sum_args *g = args;
    sc()->col_sum(kc, g->rows, g->len, g->x, g->y);
}

static void lz_col_sum(const ch_kctx *kc, int rows, size_t len, const ch_real *x, ch_real *y)
{
    const col_sum_args queued = { rows, len, x, y };
    ch_lazy_queue_call(kc, run_col_sum, &queued, sizeof queued);
}

typedef struct optim_update_args {
    ch_optim_update u;
    size_t n;
    ch_real *p;
    const ch_real *g;
    ch_real *s0;
    ch_real *s1;
} optim_update_args;

static void run_optim_update(const ch_kctx *kc, const void *args)
{
    const optim_update_args *g = args;
    sc()->optim_update(kc, &g->u, g->n, g->p, g->g, g->s0, g->s1);
}

static void lz_optim_update(const ch_kctx *kc, const ch_optim_update *u, size_t n, ch_real *p, const ch_real *g, ch_real *s0, ch_real *s1)
{
    const optim_update_args queued = { *u, n, p, g, s0, s1 };
    ch_lazy_queue_call(kc, run_optim_update, &queued, sizeof queued);
}

typedef struct softmax_xent_args {
    int n;
    int k;
    const ch_real *logits;
    const int32_t *labels;
    double scale;
    ch_real *dlogits;
    double *loss_sum;
    int64_t *correct;
} softmax_xent_args;

static void run_softmax_xent(const ch_kctx *kc, const void *args)
{
    const softmax_xent_args *g = args;
    sc()->softmax_xent(kc, g->n, g->k, g->logits, g->labels, g->scale, g->dlogits, g->loss_sum, g->correct);
}

static void lz_softmax_xent(const ch_kctx *kc, int n, int k, const ch_real *logits, const int32_t *labels, double scale, ch_real *dlogits, double *loss_sum, int64_t *correct)
{
    const softmax_xent_args queued = { n, k, logits, labels, scale, dlogits, loss_sum, correct };
    ch_lazy_queue_call(kc, run_softmax_xent, &queued, sizeof queued);
}

typedef struct mse_args {
    size_t len;
    const ch_real *pred;
    const ch_real *target;
    double scale;
    ch_real *dpred;
    double *loss_sum;
} mse_args;

static void run_mse(const ch_kctx *kc, const void *args)
{
    const mse_args *g = args;
    sc()->mse(kc, g->len, g->pred, g->target, g->scale, g->dpred, g->loss_sum);
}

static void lz_mse(const ch_kctx *kc, size_t len, const ch_real *pred, const ch_real *target, double scale, ch_real *dpred, double *loss_sum)
{
    const mse_args queued = { len, pred, target, scale, dpred, loss_sum };
    ch_lazy_queue_call(kc, run_mse, &queued, sizeof queued);
}

static const ch_kernels lazy_table = {
    .name = "lazy",
    .gemm = lz_gemm,
    .gemm_bf16_workspace = ch_cpu_gemm_bf16_workspace,
    .gemm_bf16 = lz_gemm_bf16,
    .conv2d_workspace = ch_cpu_conv2d_workspace,
    .conv2d_keep_bytes = ch_cpu_conv2d_keep_bytes,
    .conv2d_in_bf16 = ch_cpu_conv2d_in_bf16,
    .conv2d_forward = lz_conv2d_forward,
    .conv2d_backward_data = lz_conv2d_backward_data,
    .conv2d_backward_weights = lz_conv2d_backward_weights,
    .maxpool2d_forward = lz_maxpool2d_forward,
    .maxpool2d_backward = lz_maxpool2d_backward,
    .avgpool2d_forward = lz_avgpool2d_forward,
    .avgpool2d_backward = lz_avgpool2d_backward,
    .upsample_forward = lz_upsample_forward,
    .upsample_backward = lz_upsample_backward,
    .bilinear_forward = lz_bilinear_forward,
    .bilinear_backward = lz_bilinear_backward,
    .batchnorm_stats = ch_lazy_batchnorm_stats,
    .batchnorm_finalize = ch_lazy_batchnorm_finalize,
    .channel_affine = ch_lazy_channel_affine,
    .batchnorm_backward_reduce = ch_lazy_batchnorm_backward_reduce,
    .batchnorm_backward_data = ch_lazy_batchnorm_backward_data,
    .layernorm_forward = ch_lazy_layernorm_forward,
    .layernorm_backward = ch_lazy_layernorm_backward,
    .relu_forward = lz_relu_forward,
    .relu_backward = lz_relu_backward,
    .add = lz_add,
    .act_forward = lz_act_forward,
    .act_backward = lz_act_backward,
    .bcast_forward = lz_bcast_forward,
    .bcast_backward = lz_bcast_backward,
    .copy_rows = lz_copy_rows,
    .permute = lz_permute,
    .dropout_mask = lz_dropout_mask,
    .to_real = ch_lazy_to_real,
    .channel_affine_keep_bf16 = ch_lazy_channel_affine_keep_bf16,
    .channel_affine_of_bf16 = ch_lazy_channel_affine_of_bf16,
    .batchnorm_backward_reduce_bf16 = ch_lazy_batchnorm_backward_reduce_bf16,
    .batchnorm_backward_data_bf16 = ch_lazy_batchnorm_backward_data_bf16,
    .conv2d_out_bf16 = ch_cpu_conv2d_out_bf16,
    .conv2d_forward_bf16 = lz_conv2d_forward_bf16,
    .batchnorm_stats_bf16 = ch_lazy_batchnorm_stats_bf16,
    .col_sum = lz_col_sum,
    .optim_update = lz_optim_update,
    .softmax_xent = lz_softmax_xent,
    .mse = lz_mse,
};

const ch_kernels *ch_kernels_lazy(void) { return &lazy_table; }
