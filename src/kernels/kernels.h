/* The kernel table: the only way layers reach arithmetic.
 * A backend is a table of function pointers (ggml style). Layers call ctx->k->fn(...), never a library
 * directly, so a backend (cpu today, cuda later) can be swapped and every backend can be checked against
 * the naive reference table (kernels/ref). All tensors are NCHW, contiguous, ch_real.
 * Threads: a kernel uses up to kc->nthreads threads and nothing else; it may use kc->ws (at least the
 * size its *_workspace function returned) as scratch. Kernels never allocate and never fail: shapes
 * are validated when the model is built. */
#ifndef CH_KERNELS_H
#define CH_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/real.h"

struct ch_stream;
struct ch_kcache;

/* What a kernel may use besides its arguments. */
typedef struct ch_kctx {
    int nthreads;     /* >= 1 */
    ch_real *ws;      /* scratch, ws_len elements */
    size_t ws_len;
    /* The stream a backend that queues its work puts this kernel on (backend.h); the CPU kernels
     * run at once and ignore it. Arguments a queued kernel reads or writes on the host (double
     * sums, losses) are read and written when it runs: the host waits on an event first. */
    struct ch_stream *stream;
    /* What the kernels keep between calls for this replica (the CPU kernels' oneDNN engine, stream,
     * primitives and their argument handles: kernels/cpu/cpu_dnnl_conv.c), made and freed with the
     * backend; one replica's kernels run one at a time, so it needs no process-wide lock. NULL (a
     * ch_kctx made by hand in tests and tools): such kernels make what a call needs and free it
     * when it returns, which is correct and slow. */
    struct ch_kcache *cache;
} ch_kctx;

/* Convolution geometry for one sample: x (c, h, w) -> y (oc, oh, ow), square stride, padding and
 * dilation. groups splits the channels: output channel o sees only the c/groups input channels of
 * its group (o / (oc/groups)), and w is (oc, c/groups, kh, kw), as in PyTorch. */
typedef struct ch_conv_desc {
    int c, h, w;
    int oc, kh, kw, stride, pad;
    int oh, ow;
    /* A ReLU fused on the output: forward writes max(0, conv(x) + b) while each group is in
     * cache, and backward weights first applies ReLU's backward to dy in place (dy = 0 where
     * y <= 0), so it must run before backward data, which then reads the masked dy. */
    bool relu;
    int groups, dilation;   /* 0 or 1: none (descriptors written before these fields existed) */
    /* --precision bf16: the backend may compute the products in bf16 (operands rounded to bf16,
     * sums in fp32) where that is the faster; x, w, y, dx and dw stay fp32 either way. */
    bool bf16;
    /* Where the forward may leave what the backward after it reuses (the CPU's own Winograds:
     * the transformed weights), conv2d_keep_bytes of it, owned by the layer; NULL: nothing kept.
     * The backward reuses it only for the same w, unchanged since that forward (checked on a few
     * of its values, not all: changing w between a forward and its backward breaks the layer
     * contract already, nn/layer.h). */
    void *keep;
} ch_conv_desc;

static inline int ch_conv_groups(const ch_conv_desc *d) { return d->groups > 1 ? d->groups : 1; }
static inline int ch_conv_dilation(const ch_conv_desc *d) { return d->dilation > 1 ? d->dilation : 1; }

/* Pooling geometry: x (c, h, w) -> y (c, oh, ow). A window is clipped to the input; with ceil_mode
 * the last window may also reach past the right/bottom padding. Average pooling divides by the
 * window's part inside the padded input (PyTorch's count_include_pad=True, the default), or by its
 * part inside the input alone with exclude_pad (count_include_pad=False). */
typedef struct ch_pool_desc {
    int c, h, w;
    int k, stride, pad;
    int oh, ow;
    bool exclude_pad;
} ch_pool_desc;

/* Elementwise activations besides ReLU (which has its own kernels and fusions). */
typedef enum ch_act_kind {
    CH_ACT_LEAKY_RELU,   /* x > 0 ? x : alpha * x */
    CH_ACT_CLIP,         /* min(max(x, lo), hi): ReLU6 is clip(0, 6) */
    CH_ACT_SIGMOID,
    CH_ACT_TANH,
    CH_ACT_HARDSIGMOID,  /* min(max(x / 6 + 1/2, 0), 1), PyTorch's */
    CH_ACT_HARDSWISH,    /* x * hardsigmoid(x) */
    CH_ACT_AFFINE,       /* alpha * x + beta (constants: x * 0.5, x / 6, x + 3) */
    CH_ACT_ERF,          /* erf(x): how ONNX spells the exact GELU */
    CH_ACT_GELU,         /* x * (1 + erf(x / sqrt 2)) / 2, PyTorch's nn.GELU() */
    CH_ACT_GELU_TANH,    /* x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) / 2, approximate='tanh' */
} ch_act_kind;

typedef struct ch_act {
    ch_act_kind kind;
    float alpha, lo, hi;
    float beta;          /* affine */
} ch_act;

/* Two operands of per-sample shapes a and b combined into y of shape out (all (c, h, w)); each
 * dimension of a and b is out's or 1 (broadcast), as numpy's rules give once the shapes are
 * aligned. Every operand has the batch dimension n. */
typedef enum ch_bcast_op { CH_BCAST_ADD, CH_BCAST_MUL } ch_bcast_op;

typedef struct ch_bcast_desc {
    ch_bcast_op op;
    int out[3], a[3], b[3];
} ch_bcast_desc;

/* A permutation of a sample's (c, h, w) dimensions, x.permute(0, 1 + perm[0], 1 + perm[1],
 * 1 + perm[2]): y's sample has dims (dims[perm[0]], dims[perm[1]], dims[perm[2]]). */
typedef struct ch_permute_desc {
    int dims[3], perm[3];
} ch_permute_desc;

/* One optimizer step's rule and scalars (optim.c fills it from the configuration and the step
 * count; the kernel only runs the elementwise loop). */
typedef enum ch_update_rule { CH_UPDATE_SGD, CH_UPDATE_ADAM, CH_UPDATE_ADAGRAD } ch_update_rule;

typedef struct ch_optim_update {
    ch_update_rule rule;
    ch_real lr, wd;
    /* SGD */
    ch_real momentum, damp;     /* damp = 1 - dampening; momentum 0: no state */
    bool first, nesterov;
    /* Adam(W) */
    bool decoupled;
    ch_real b1, b2, eps, decay, step_size, bc2_sqrt;
    /* Adagrad: lr is the decayed clr, eps as above */
} ch_optim_update;

typedef struct ch_kernels {
    const char *name;

    /* C = alpha * op(A) * op(B) + beta * C, row-major; op(A) is m x k, op(B) is k x n. */
    void (*gemm)(const ch_kctx *kc, bool trans_a, bool trans_b, int m, int n, int k, ch_real alpha,
                 const ch_real *a, int lda, const ch_real *b, int ldb, ch_real beta, ch_real *c,
                 int ldc);

    /* --precision bf16's GEMMs (Linear layers): C = op(A) op(B), plus C where accumulate, A and B
     * rounded to bf16, the products summed in fp32. The workspace query (elements, plan time; kc->ws
     * not read) is 0 where bf16 would not be the faster or cannot run; a call where it would be 0,
     * or where kc's workspace is short, computes in fp32 as gemm does. NULL: never. */
    size_t (*gemm_bf16_workspace)(const ch_kctx *kc, bool trans_a, bool trans_b, int m, int n,
                                  int k, int ldc, bool accumulate);
    void (*gemm_bf16)(const ch_kctx *kc, bool trans_a, bool trans_b, int m, int n, int k,
                      const ch_real *a, int lda, const ch_real *b, int ldb, bool accumulate,
                      ch_real *c, int ldc);

    /* Whether the three convolution kernels multiply this d->bf16 layer's operands in bf16 at
     * batch n with kc->nthreads threads (NULL: never; what `--dry-run` reports). kc->ws is not
     * read. */
    bool (*conv2d_in_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n);
    /* Scratch (elements) the three convolution kernels need for batches of up to n samples with
     * kc->nthreads threads (kc->ws is not read). This is plan time: it may prepare per-geometry
     * state in kc->cache (the CPU backend's oneDNN primitives), so the passes make none. */
    size_t (*conv2d_workspace)(const ch_kctx *kc, const ch_conv_desc *d, int n);
    /* Bytes of d->keep the passes for d at batch n would use (0, or NULL: none; plan time); the
     * layer allocates it from the backend, zeros meaning nothing kept. */
    size_t (*conv2d_keep_bytes)(const ch_kctx *kc, const ch_conv_desc *d, int n);
    /* y[n,o,i,j] = b[o] + sum_{c,p,q} w[o,c,p,q] * x[n,c,i*s-pad+p,j*s-pad+q]; b may be NULL. */
    void (*conv2d_forward)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                           const ch_real *w, const ch_real *b, ch_real *y);
    /* dx = conv2d_forward's adjoint in x (dx is overwritten). */
    void (*conv2d_backward_data)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                                 const ch_real *w, ch_real *dx);
    /* dw (and db if not NULL) = gradients summed over the batch (overwritten). y is forward's
     * output, read only with d->relu, which also makes dy an output (masked in place). */
    void (*conv2d_backward_weights)(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                    const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                    ch_real *db);
    /* Both of the above at once, with their bits, where the backend has a pass that does both
     * for d at batch n (the CPU's own Winograds transform dy once for the two): false, with
     * nothing written, where it has none. NULL: never. */
    bool (*conv2d_backward)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                            const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx,
                            ch_real *dw, ch_real *db);

    /* Max pooling; argmax[n, c, i, j] = flat index into the (h, w) plane of the winner. */
    void (*maxpool2d_forward)(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                              ch_real *y, int32_t *argmax);
    void (*maxpool2d_backward)(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy,
                               const int32_t *argmax, ch_real *dx);
    void (*avgpool2d_forward)(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *x,
                              ch_real *y);
    void (*avgpool2d_backward)(const ch_kctx *kc, const ch_pool_desc *d, int n, const ch_real *dy,
                               ch_real *dx);
    /* Nearest upsampling by whole factors: y[n, c, i, j] = x[n, c, i / sh, j / sw], x (c, h, w);
     * backward: dx = the sum of dy over the sh x sw block each input went to (overwritten). */
    void (*upsample_forward)(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw,
                             const ch_real *x, ch_real *y);
    void (*upsample_backward)(const ch_kctx *kc, int n, int c, int h, int w, int sh, int sw,
                              const ch_real *dy, ch_real *dx);

    /* Bilinear resampling (PyTorch's upsample_bilinear2d, with align_corners or without;
     * kernels/pool_body.h) of planes h x w planes to oh x ow; backward overwrites dx, each plane's
     * sums in output order. */
    void (*bilinear_forward)(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align,
                             const ch_real *x, ch_real *y);
    void (*bilinear_backward)(const ch_kctx *kc, int planes, int h, int w, int oh, int ow, bool align,
                              const ch_real *dy, ch_real *dx);

    /* Batch normalisation, in pieces so that statistics can be combined across devices between
     * them (sync BN). x, y: (n, c, hw).
     * stats: mean[c] and biased var[c] over (n, hw), two passes in double (a one-pass
     * E[x^2] - E[x]^2 cancels badly when the mean is large against the spread). */
    void (*batchnorm_stats)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                            double *mean, double *var);
    /* The per-channel step between the two (kernels/norm_body.h): from the statistics (mean, var:
     * in training, of count values per channel; NULL in evaluation, which takes the running ones)
     * to save = (mean, invstd, scale, shift), c each, and in training the running statistics
     * moved by momentum. */
    void (*batchnorm_finalize)(const ch_kctx *kc, int c, const double *mean, const double *var,
                               double count, double eps, double momentum, const ch_real *gamma,
                               const ch_real *beta, ch_real *running_mean, ch_real *running_var,
                               ch_real *save);
    /* y = x * scale[c] + shift[c] */
    void (*channel_affine)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                           const ch_real *scale, const ch_real *shift, ch_real *y);
    /* sum_dy[c] = sum dy, sum_dy_xhat[c] = sum dy * (x - mean[c]) * invstd[c], in double. */
    void (*batchnorm_backward_reduce)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                      const ch_real *dy, const ch_real *mean,
                                      const ch_real *invstd, double *sum_dy, double *sum_dy_xhat);
    /* dx = gamma*invstd * (dy - sum_dy/count - xhat * sum_dy_xhat/count), count the batch's
     * element count per channel (all devices' with sync BN). dx may alias x or dy. */
    void (*batchnorm_backward_data)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                    const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                    const ch_real *gamma, const double *sum_dy,
                                    const double *sum_dy_xhat, double count, ch_real *dx);

    /* Layer normalisation: x, y are (outer, len, inner), each of the outer * inner groups of len
     * values inner apart normalised by its own mean and biased variance, then scaled by gamma[j]
     * and shifted by beta[j] (len each; kernels/norm_body.h). mean and invstd (outer * inner) are
     * saved for backward. Backward overwrites dgamma and dbeta (sums over the groups) and, unless
     * NULL, dx. */
    void (*layernorm_forward)(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x,
                              const ch_real *gamma, const ch_real *beta, double eps, ch_real *y,
                              ch_real *mean, ch_real *invstd);
    void (*layernorm_backward)(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x,
                               const ch_real *dy, const ch_real *gamma, const ch_real *mean,
                               const ch_real *invstd, ch_real *dx, ch_real *dgamma, ch_real *dbeta);

    /* Elementwise. */
    void (*relu_forward)(const ch_kctx *kc, size_t len, const ch_real *x, ch_real *y);
    /* dx = dy where y > 0, else 0 (dx may alias dy). */
    void (*relu_backward)(const ch_kctx *kc, size_t len, const ch_real *y, const ch_real *dy,
                          ch_real *dx);
    /* y = a + b (y may alias a or b). */
    void (*add)(const ch_kctx *kc, size_t len, const ch_real *a, const ch_real *b, ch_real *y);

    /* y = act(x) (y may alias x); backward: dx = act'(x) * dy, from x (leaky ReLU, clip) or from
     * y (sigmoid, tanh); dx may alias dy. Clip's gradient is 0 outside [lo, hi] and dy inside, its
     * ends included (PyTorch's hardtanh). */
    void (*act_forward)(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x,
                        ch_real *y);
    void (*act_backward)(const ch_kctx *kc, const ch_act *a, size_t len, const ch_real *x,
                         const ch_real *y, const ch_real *dy, ch_real *dx);
    /* y = a op b with broadcasting (n samples). Backward writes da and db (either may be NULL):
     * dy (times the other operand for MUL) summed over the dimensions the operand was broadcast
     * along. y does not alias a or b; da and db do not alias anything. */
    void (*bcast_forward)(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                          const ch_real *b, ch_real *y);
    void (*bcast_backward)(const ch_kctx *kc, const ch_bcast_desc *d, int n, const ch_real *a,
                           const ch_real *b, const ch_real *dy, ch_real *da, ch_real *db);
    /* rows rows of len values from src (rows src_stride apart) to dst (dst_stride apart): a
     * channel concatenation and its backward, one input at a time. */
    void (*copy_rows)(const ch_kctx *kc, int rows, size_t len, const ch_real *src,
                      size_t src_stride, ch_real *dst, size_t dst_stride);
    /* y = x with each of its n samples' dimensions permuted (ch_permute_desc); y does not alias x.
     * Its backward is the inverse permutation of dy. */
    void (*permute)(const ch_kctx *kc, const ch_permute_desc *d, int n, const ch_real *x, ch_real *y);

    /* Dropout's mask for n samples of per elements: element e of sample s is keep where word e of
     * the Philox stream (seed, stream) read from counter (step << 32) ^ ((sample0 + s) * ((per + 3)
     * / 4)) is at least threshold, else 0 (core/philox.h: the host's ch_rng reader, element by
     * element, so every backend draws the same bits). */
    void (*dropout_mask)(const ch_kctx *kc, int n, size_t per, uint64_t seed, uint64_t stream, uint64_t step,
                         uint64_t sample0, uint32_t threshold, ch_real keep, ch_real *mask);
    /* y = (ch_real) x: double results of the kernels above (BatchNorm's sums) into a tensor. */
    void (*to_real)(const ch_kctx *kc, size_t len, const double *x, ch_real *y);
    /* --precision bf16's kept BatchNorm inputs (graph/exec.c), in the passes that read them anyway:
     * channel_affine that also stores x rounded to bf16 in keep (to nearest even, core/bf16.h: a
     * NaN stays a NaN); channel_affine of bf16 inputs; BatchNorm's two backward kernels of bf16
     * inputs (the same results as the fp32 ones given the bf16 values widened: bit for bit on the
     * CPU). Any NULL: the backend keeps them fp32. */
    void (*channel_affine_keep_bf16)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                     const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep);
    void (*channel_affine_of_bf16)(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                   const ch_real *scale, const ch_real *shift, ch_real *y);
    void (*batchnorm_backward_reduce_bf16)(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                           const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                           double *sum_dy, double *sum_dy_xhat);
    void (*batchnorm_backward_data_bf16)(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                         const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                         const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat,
                                         double count, ch_real *dx);
    /* A kept BatchNorm input that its convolution writes in bf16 itself (graph/exec.c), where the
     * backend rounds it there at no cost: conv2d_out_bf16 (plan time) says whether it does for d
     * at batch n; conv2d_forward_bf16 is conv2d_forward with y rounded to bf16 (the same values,
     * rounded to nearest even; a backend that rounds with the CPU's own instruction may flush
     * subnormal values to zero), batchnorm_stats_bf16 batchnorm_stats of bf16 x (the statistics of
     * the widened values). Any NULL: the convolution writes fp32 and the BatchNorm rounds. */
    bool (*conv2d_out_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n);
    void (*conv2d_forward_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                const ch_real *w, const ch_real *b, uint16_t *y);
    void (*batchnorm_stats_bf16)(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                 double *mean, double *var);
    /* A BatchNorm and the in-place ReLU after it as one layer (graph/exec.c), the ReLU's two passes
     * folded into the BatchNorm's: each reads x in fp32, or in bf16 from xh where x is NULL (the
     * kept input). bn_relu_forward: y = channel_affine's value v = x * scale + shift, or 0 where
     * v < 0 (a NaN passes), keep as in channel_affine_keep_bf16 unless NULL. The backward pair:
     * batchnorm_backward_reduce and batchnorm_backward_data of dy masked as ReLU's backward masks it
     * (0 where not v > 0), v recomputed from x, scale and shift in forward's arithmetic, so that
     * no ReLU output need be read. Bit for bit the separate kernels' results. Any NULL: the ReLU
     * runs apart. */
    void (*bn_relu_forward)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                            const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep);
    void (*bn_relu_backward_reduce)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                    const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                    const ch_real *scale, const ch_real *shift, double *sum_dy, double *sum_dy_xhat);
    void (*bn_relu_backward_data)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                  const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                                  const ch_real *scale, const ch_real *shift, const double *sum_dy,
                                  const double *sum_dy_xhat, double count, ch_real *dx);
    /* --precision bf16's convolution inputs kept in bf16 (graph/exec.c): a BatchNorm + ReLU output
     * whose one reader is a convolution that takes it so. conv2d_x_bf16 (plan time) says whether the
     * backend's passes for d at batch n read x in bf16; conv2d_forward_of_bf16 is conv2d_forward of
     * x widened, into y or, where y is NULL, rounded to bf16 into yh (as conv2d_forward_bf16);
     * conv2d_backward_of_bf16 is conv2d_backward of x widened, dx NULL or not, dx allowed to overlap
     * x, not dy. bn_relu_forward_to_bf16 is bn_relu_forward with y rounded to bf16 (to nearest even, a
     * NaN stays a NaN). The bits of the fp32 kernels given the widened values. Any NULL: the
     * input stays fp32. */
    bool (*conv2d_x_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n);
    void (*conv2d_forward_of_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                                   const ch_real *w, const ch_real *b, ch_real *y, uint16_t *yh);
    void (*conv2d_backward_of_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                                    const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx, ch_real *dw,
                                    ch_real *db);
    void (*bn_relu_forward_to_bf16)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                    const ch_real *scale, const ch_real *shift, uint16_t *y, uint16_t *keep);
    /* --precision bf16's convolution output gradients in bf16 (graph/exec.c): the gradient of a
     * kept BatchNorm input whose maker is a convolution that reads it so, written by the
     * BatchNorm's backward over its kept copy. conv2d_dy_bf16 (plan time) says whether the
     * backend's backward for d at batch n reads dy in bf16; conv2d_backward_dy_bf16 is
     * conv2d_backward of dy widened (dx NULL: the weights' pass alone), x read from x or, where x
     * is NULL, widened from xh, dx allowed to overlap x or xh, not dy. bn_backward_data_to_bf16 is
     * bn_relu_backward_data of the kept input xh (scale NULL: batchnorm_backward_data_bf16), dx
     * rounded to bf16 (to nearest even, a NaN stays a NaN) and allowed to alias xh. The bits of
     * the fp32 kernels given the widened values. Any NULL: the gradient stays fp32. */
    bool (*conv2d_dy_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n);
    void (*conv2d_backward_dy_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                    const uint16_t *xh, const uint16_t *dy, const ch_real *w, ch_real *dx,
                                    ch_real *dw, ch_real *db);
    void (*bn_backward_data_to_bf16)(const ch_kctx *kc, int n, int c, int hw, const uint16_t *xh, const ch_real *dy,
                                     const ch_real *mean, const ch_real *invstd, const ch_real *gamma,
                                     const ch_real *scale, const ch_real *shift, const double *sum_dy,
                                     const double *sum_dy_xhat, double count, uint16_t *dx);
    /* A BatchNorm's normalising pass and the same-shaped sum that writes over its output in place
     * (and the in-place ReLU after that) as one pass (graph/exec.c): y = v + res, v channel_affine's
     * value from x, or from xh where x is NULL; with relu, 0 where that sum is < 0 (a NaN passes);
     * keep as in bn_relu_forward. Bit for bit channel_affine, add and relu_forward apart, save which
     * NaN comes out where v and res are both NaN (C leaves the operand order of a sum to the
     * compiler, add's own loop included). res does not alias y. NULL: they run apart. */
    void (*bn_add_forward)(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                           const ch_real *scale, const ch_real *shift, const ch_real *res, bool relu, ch_real *y,
                           uint16_t *keep);
    /* y[j] = sum over i < rows of x[i * len + j], in the order of i (a Linear layer's bias
     * gradient); rows may be 0. */
    void (*col_sum)(const ch_kctx *kc, int rows, size_t len, const ch_real *x, ch_real *y);
    /* One optimizer update of n parameters p from gradients g and state s0, s1 (optim.h's rules;
     * the scalars of this step in u). */
    void (*optim_update)(const ch_kctx *kc, const struct ch_optim_update *u, size_t n, ch_real *p,
                         const ch_real *g, ch_real *s0, ch_real *s1);

    /* Softmax cross-entropy over logits (n, k): returns the summed loss and the number of correct
     * argmax predictions; dlogits = (softmax - onehot) * scale (skipped when dlogits is NULL). */
    void (*softmax_xent)(const ch_kctx *kc, int n, int k, const ch_real *logits,
                         const int32_t *labels, double scale, ch_real *dlogits, double *loss_sum,
                         int64_t *correct);
    /* Mean squared error: loss_sum = sum (pred - target)^2 over len values;
     * dpred = 2 (pred - target) * scale (skipped when dpred is NULL). PyTorch's MSELoss (mean) is
     * loss_sum / len with scale 1 / len. */
    void (*mse)(const ch_kctx *kc, size_t len, const ch_real *pred, const ch_real *target,
                double scale, ch_real *dpred, double *loss_sum);
} ch_kernels;

/* The CPU backend (oneDNN GEMM, OpenMP threads) and the naive reference used by the tests. */
extern const ch_kernels ch_cpu_kernel_table;
const ch_kernels *ch_kernels_cpu(void);
const ch_kernels *ch_kernels_ref(void);

/* Output size of a window op; returns <= 0 when the geometry is impossible. */
static inline int ch_window_out(int in, int k, int stride, int pad)
{
    if (stride <= 0 || k <= 0 || in + 2 * pad < k) return 0;
    return (in + 2 * pad - k) / stride + 1;
}

/* A pooling window count with ceil_mode: rounded up, but the last window must start inside the
 * input or its left padding (PyTorch's rule). */
static inline int ch_window_out_ceil(int in, int k, int stride, int pad)
{
    if (stride <= 0 || k <= 0 || in + 2 * pad < k) return 0;
    int out = (in + 2 * pad - k + stride - 1) / stride + 1;
    if ((out - 1) * stride >= in + pad) out--;
    return out;
}

#endif
