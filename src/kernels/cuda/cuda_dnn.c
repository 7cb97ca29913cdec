/* GEMM through cuBLAS and convolutions through cuDNN, for the CUDA plugin.
 * A convolution's plan (its cuDNN descriptors and the three algorithms) is made once per geometry,
 * batch size and workspace limit, and shared by every replica in the process: descriptors are
 * plain host structures that concurrent calls only read. Algorithms come from cuDNN's heuristics,
 * the first in its order that is deterministic, runs without TF32 (fp32 results within 1e-4 of the
 * CPU's) and fits the workspace the model planned: the same choice on every run, so the same
 * command gives the same bits. COHORT_CUDNN_BENCHMARK=1 times them instead (cuDNN's Find, what
 * PyTorch's cudnn.benchmark does) and keeps the fastest: which one wins may differ from run to run
 * (timing noise), and so may the last bits of the results. */
#include "kernels/cuda/cuda_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Row-major C = alpha op(A) op(B) + beta C is column-major C^T = alpha op(B)^T op(A)^T + beta C^T:
 * the row-major operands are already the column-major transposes, so only the order changes. */
void cu_gemm(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, ch_real alpha, const ch_real *a, int lda,
             const ch_real *b, int ldb, ch_real beta, ch_real *c, int ldc)
{
    if (m <= 0 || n <= 0) return;
    const cu_stream *st = cu_of(kc);
    cu_use_device(st->device);
    CUBLAS_CHECK(cublasSgemm(st->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                             &alpha, b, ldb, a, lda, &beta, c, ldc));
}

typedef struct conv_plan {
    ch_conv_desc d;
    int n;
    size_t limit;   /* the workspace bytes it was chosen under */
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv_fwd, conv_data, conv_filter;   /* one per math type chosen */
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t data;
    cudnnConvolutionBwdFilterAlgo_t filter;
    size_t ws;      /* the largest of the three's workspace */
    struct conv_plan *next;
} conv_plan;

static pthread_mutex_t plans_lock = PTHREAD_MUTEX_INITIALIZER;
static conv_plan *plans;
/* A handle per device for choosing algorithms outside a kernel call (the workspace query). */
static cudnnHandle_t planners[64];

static bool same_geometry(const ch_conv_desc *a, const ch_conv_desc *b)
{
    return a->c == b->c && a->h == b->h && a->w == b->w && a->oc == b->oc && a->kh == b->kh && a->kw == b->kw &&
           a->stride == b->stride && a->pad == b->pad && a->oh == b->oh && a->ow == b->ow &&
           ch_conv_groups(a) == ch_conv_groups(b) && ch_conv_dilation(a) == ch_conv_dilation(b);
}

static bool acceptable(cudnnStatus_t status, size_t memory, cudnnDeterminism_t det, cudnnMathType_t math, size_t limit)
{
    return status == CUDNN_STATUS_SUCCESS && memory <= limit && det == CUDNN_DETERMINISTIC &&
           math != CUDNN_TENSOR_OP_MATH && math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

static cudnnConvolutionDescriptor_t conv_desc(const ch_conv_desc *d, cudnnMathType_t math)
{
    cudnnConvolutionDescriptor_t c;
    const int dil = ch_conv_dilation(d);
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&c));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(c, d->pad, d->pad, d->stride, d->stride, dil, dil,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionGroupCount(c, ch_conv_groups(d)));
    CUDNN_CHECK(cudnnSetConvolutionMathType(c, math));
    return c;
}

static void fail_no_algo(const char *pass, const ch_conv_desc *d, int n, size_t limit)
{
    char what[200];
    snprintf(what, sizeof what, "a deterministic fp32 %s algorithm for conv %dx%dx%d -> %d k%d s%d p%d g%d, batch %d, within %zu bytes",
             pass, d->c, d->h, d->w, d->oc, d->kh, d->stride, d->pad, ch_conv_groups(d), n, limit);
    cu_fail(what, "none found", __FILE__, __LINE__);
}

enum { MAX_ALGOS = 16 };

static bool timed(void)
{
    const char *v = getenv("COHORT_CUDNN_BENCHMARK");
    return v && strcmp(v, "1") == 0;
}

/* COHORT_CUDNN_ALGOS=fixed: the same three deterministic algorithms for every shape and batch
 * (implicit GEMM forward, ALGO_1 backward), fast or not. For tests: whether results that differ
 * between batch sizes (a batch against its slices) do so because cuDNN chose per shape. */
static bool fixed(void)
{
    const char *v = getenv("COHORT_CUDNN_ALGOS");
    return v && strcmp(v, "fixed") == 0;
}

static void choose_fixed(cudnnHandle_t h, conv_plan *p)
{
    size_t f = 0, dd = 0, ff = 0;
    p->fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    p->data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    p->filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    p->conv_fwd = conv_desc(&p->d, CUDNN_FMA_MATH);
    p->conv_data = conv_desc(&p->d, CUDNN_FMA_MATH);
    p->conv_filter = conv_desc(&p->d, CUDNN_FMA_MATH);
    CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p->x, p->w, p->conv_fwd, p->y, p->fwd, &f));
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, p->w, p->y, p->conv_data, p->x, p->data, &dd));
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p->x, p->y, p->conv_filter, p->w, p->filter, &ff));
    p->ws = f > dd ? f : dd;
    if (ff > p->ws) p->ws = ff;
    if (p->ws > p->limit) fail_no_algo("fixed (COHORT_CUDNN_ALGOS)", &p->d, p->n, p->limit);
}

static void choose(cudnnHandle_t h, conv_plan *p)
{
    if (fixed()) {
        choose_fixed(h, p);
        return;
    }
    const ch_conv_desc *d = &p->d;
    const bool find = timed();
    cudnnConvolutionDescriptor_t probe = conv_desc(d, CUDNN_DEFAULT_MATH);
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fw[MAX_ALGOS];
    if (find) CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, p->x, p->w, probe, p->y, MAX_ALGOS, &got, fw));
    else CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p->x, p->w, probe, p->y, MAX_ALGOS, &got, fw));
    int i = 0;
    while (i < got && !acceptable(fw[i].status, fw[i].memory, fw[i].determinism, fw[i].mathType, p->limit)) i++;
    if (i == got) fail_no_algo("forward", d, p->n, p->limit);
    p->fwd = fw[i].algo;
    p->conv_fwd = conv_desc(d, fw[i].mathType);
    p->ws = fw[i].memory;
    cudnnConvolutionBwdDataAlgoPerf_t bd[MAX_ALGOS];
    if (find) CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, p->w, p->y, probe, p->x, MAX_ALGOS, &got, bd));
    else CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p->w, p->y, probe, p->x, MAX_ALGOS, &got, bd));
    for (i = 0; i < got && !acceptable(bd[i].status, bd[i].memory, bd[i].determinism, bd[i].mathType, p->limit); i++) {}
    if (i == got) fail_no_algo("backward data", d, p->n, p->limit);
    p->data = bd[i].algo;
    p->conv_data = conv_desc(d, bd[i].mathType);
    if (bd[i].memory > p->ws) p->ws = bd[i].memory;
    cudnnConvolutionBwdFilterAlgoPerf_t bf[MAX_ALGOS];
    if (find) CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, p->x, p->y, probe, p->w, MAX_ALGOS, &got, bf));
    else CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p->x, p->y, probe, p->w, MAX_ALGOS, &got, bf));
    for (i = 0; i < got && !acceptable(bf[i].status, bf[i].memory, bf[i].determinism, bf[i].mathType, p->limit); i++) {}
    if (i == got) fail_no_algo("backward filter", d, p->n, p->limit);
    p->filter = bf[i].algo;
    p->conv_filter = conv_desc(d, bf[i].mathType);
    if (bf[i].memory > p->ws) p->ws = bf[i].memory;
    CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(probe));
}

static conv_plan *make_plan(cudnnHandle_t h, const ch_conv_desc *d, int n, size_t limit)
{
    conv_plan *p = calloc(1, sizeof *p);
    if (!p) cu_fail("calloc of a convolution plan", "out of memory", __FILE__, __LINE__);
    p->d = *d;
    p->n = n;
    p->limit = limit;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, d->c, d->h, d->w));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, d->oc, d->oh, d->ow));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, d->oc, d->c / ch_conv_groups(d),
                                           d->kh, d->kw));
    choose(h, p);
    return p;
}

/* The plan for (d, n) under limit bytes of workspace, made on first use. */
static const conv_plan *plan_for(cudnnHandle_t h, const ch_conv_desc *d, int n, size_t limit)
{
    pthread_mutex_lock(&plans_lock);
    conv_plan *p = plans;
    while (p && !(p->n == n && p->limit == limit && same_geometry(&p->d, d))) p = p->next;
    if (!p) {
        p = make_plan(h, d, n, limit);
        p->next = plans;
        plans = p;
    }
    pthread_mutex_unlock(&plans_lock);
    return p;
}

/* What the model's planner sets aside: the plan for its largest batch under a 256 MiB cap per
 * layer, chosen on this thread's current device. Kernel calls then choose under the workspace
 * they are given, which is at least this. */
enum { PLAN_WS_CAP = 256 << 20 };

size_t cu_conv2d_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    (void)kc;
    int dev = 0;
    CU_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= 64) dev = 0;
    pthread_mutex_lock(&plans_lock);
    if (!planners[dev]) CUDNN_CHECK(cudnnCreate(&planners[dev]));
    cudnnHandle_t h = planners[dev];
    pthread_mutex_unlock(&plans_lock);
    const conv_plan *p = plan_for(h, d, n, PLAN_WS_CAP);
    return (p->ws + sizeof(ch_real) - 1) / sizeof(ch_real);
}

static const conv_plan *plan_in(const ch_kctx *kc, const ch_conv_desc *d, int n, cudnnHandle_t *h)
{
    const cu_stream *st = cu_of(kc);
    cu_use_device(st->device);
    *h = st->dnn;
    const size_t have = kc->ws_len * sizeof(ch_real);
    return plan_for(st->dnn, d, n, have < PLAN_WS_CAP ? have : PLAN_WS_CAP);
}

static const float one = 1, zero = 0;

void cu_conv2d_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x, const ch_real *w,
                       const ch_real *b, ch_real *y)
{
    if (n <= 0) return;
    cudnnHandle_t h;
    const conv_plan *p = plan_in(kc, d, n, &h);
    CUDNN_CHECK(cudnnConvolutionForward(h, &one, p->x, x, p->w, w, p->conv_fwd, p->fwd, kc->ws, p->ws, &zero, p->y, y));
    cu_bias_relu(kc, n, d->oc, d->oh * d->ow, b, d->relu, y);
}

void cu_conv2d_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy, const ch_real *w,
                             ch_real *dx)
{
    if (n <= 0) return;
    cudnnHandle_t h;
    const conv_plan *p = plan_in(kc, d, n, &h);
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, p->w, w, p->y, dy, p->conv_data, p->data, kc->ws, p->ws, &zero,
                                             p->x, dx));
}

void cu_conv2d_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x, const ch_real *y,
                                ch_real *dy, ch_real *dw, ch_real *db)
{
    if (n <= 0) {
        /* No samples: the gradients are zero, as the CPU's sums over nothing. */
        cudaStream_t s = cu_stream_of(kc);
        CU_CHECK(cudaMemsetAsync(dw, 0, sizeof(ch_real) * (size_t)d->oc * (d->c / ch_conv_groups(d)) * d->kh * d->kw, s));
        if (db) CU_CHECK(cudaMemsetAsync(db, 0, sizeof(ch_real) * (size_t)d->oc, s));
        return;
    }
    cudnnHandle_t h;
    const conv_plan *p = plan_in(kc, d, n, &h);
    if (d->relu) cu_relu_mask(kc, (size_t)n * d->oc * d->oh * d->ow, y, dy);
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, p->x, x, p->y, dy, p->conv_filter, p->filter, kc->ws, p->ws,
                                               &zero, p->w, dw));
    if (db) cu_channel_sum(kc, n, d->oc, d->oh * d->ow, dy, db);
}
