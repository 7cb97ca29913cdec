/* Layers: a fixed set of structs with hand-written forward and backward passes.
 * A layer declares its parameters (weights, biases) and buffers (BatchNorm running statistics) as
 * specs; the model gives every spec an offset into one flat parameter buffer (and a mirror gradient
 * buffer) or one flat buffer of buffers, then binds the layer's pointers. A layer owns its output
 * activations y, planned once for the largest batch; nothing is allocated inside a step.
 * Shapes are per sample, NCHW: a batch of n is n * (c, h, w) contiguous values. */
#ifndef CH_NN_LAYER_H
#define CH_NN_LAYER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "kernels/backend.h"

typedef struct ch_shape3 {
    int c, h, w;
} ch_shape3;

static inline size_t ch_shape3_size(ch_shape3 s) { return (size_t)s.c * s.h * s.w; }

/* How a tensor is initialised (PyTorch's defaults unless the model is built with normal init). */
typedef enum ch_init_role {
    CH_ROLE_WEIGHT,      /* conv/linear weight: kaiming-uniform, bound 1/sqrt(fan_in) */
    CH_ROLE_BIAS,        /* conv/linear bias: uniform, bound 1/sqrt(fan_in) */
    CH_ROLE_ONES,        /* BatchNorm weight, running_var */
    CH_ROLE_ZEROS,       /* BatchNorm bias, running_mean */
} ch_init_role;

/* A tensor's PyTorch name (module path + attribute); a graph node's name is shorter by room for the
 * longest attribute, "num_batches_tracked". */
enum { CH_MAX_DIMS = 4, CH_NAME_MAX = 128, CH_NODE_NAME_MAX = 100 };

typedef struct ch_tensor_spec {
    const char *suffix;            /* PyTorch attribute: "weight", "bias", "running_mean", ... */
    int ndim;
    int64_t dims[CH_MAX_DIMS];
    size_t count;
    size_t offset;                 /* into the model's flat buffer; set by the model */
    ch_init_role role;
    int fan_in;
} ch_tensor_spec;

struct ch_comm;

/* Called by a layer's backward as soon as the gradients of its parameters are final, with their
 * place in the flat gradient buffer: the data-parallel trainer starts syncing a bucket of gradients
 * once all of its tensors are in, while backward goes on with earlier layers. */
typedef void (*ch_grads_ready_fn)(void *user, size_t offset, size_t count);

/* What a replica's layers run with: its kernels, threads, workspace and step identity. */
typedef struct ch_run {
    const ch_backend *be;   /* the replica's memory operations; k is be->k */
    const ch_kernels *k;
    ch_kctx kc;
    bool training;
    uint64_t seed;          /* for dropout masks */
    uint64_t step;          /* global step: dropout masks differ per step */
    uint64_t sample_offset; /* index of this slice's first sample in the global batch */
    int global_n;           /* samples in the global batch (this slice is part of it) */
    struct ch_comm *sync_bn;    /* sync-BN: batch statistics over this group; NULL: this slice's */
    ch_status *comm_status;     /* where a layer reports a failed collective (first failure wins) */
    ch_err *comm_err;
    ch_grads_ready_fn grads_ready;
    void *grads_user;
    struct ch_trace_track *trace;   /* record each child's backward as a span; NULL: no trace */
    /* Backward scratch, used as a stack: a layer's backward takes its scratch_own elements from
     * the bottom and runs its children with the rest (ch_run_above). Gradient temporaries live
     * only while their layer's backward runs, so one stack replaces a set of buffers per layer
     * (resnet18 batch 256: ~0.9 GB less). Forward may use the stack too, for values that are
     * dead once the layer's forward returns (a residual block's inner activation, remade in
     * backward: graph/exec.c); nothing lives there between calls. */
    ch_real *scratch;
    size_t scratch_len;
} ch_run;

typedef struct ch_layer ch_layer;

/* Planning input and output: what a layer sizes its memory for. */
typedef struct ch_plan {
    const ch_backend *be;   /* where the layers' outputs and saved values live */
    const ch_kernels *k;
    int max_batch;
    int nthreads;
    bool bf16;          /* --precision bf16: convolutions and Linear layers may multiply in bf16 */
    size_t ws_need;     /* out: the largest kernel workspace (elements) any layer needs */
    size_t saved_bytes; /* out: what layers keep from forward for backward besides their outputs
                         * (pooling argmax, dropout masks) */
    size_t keep_bytes;  /* out: of the convolutions' d->keep (their transformed weights) */
    int convs, bf16_convs; /* out: convolutions, and those whose products the kernels do in bf16 */
    int linears, bf16_linears; /* out: Linear layers, and those whose GEMMs run in bf16 */
    size_t bf16_kept;   /* out: activation values kept in bf16 between forward and backward */
    size_t bf16_direct; /* out: of those, values their convolutions write in bf16 (no fp32 copy) */
    size_t bf16_inputs; /* out: convolution inputs passed in bf16 (values at the max batch) */
    size_t bf16_grads;  /* out: convolution output gradients passed in bf16 (values at the max batch) */
} ch_plan;

/* The context a plan-time kernel query (conv2d_workspace) gets: the backend's cache and the
 * plan's threads; no workspace yet. */
static inline ch_kctx ch_plan_kctx(const ch_plan *pl)
{
    ch_kctx kc = ch_backend_kctx(pl->be);
    kc.nthreads = pl->nthreads;
    kc.ws = NULL;
    kc.ws_len = 0;
    return kc;
}

typedef struct ch_layer_ops {
    const char *kind;
    /* Allocate y for up to pl->max_batch samples (children are planned first); set
     * l->scratch_own to the backward scratch it needs (elements); raise pl->ws_need to the
     * kernel workspace this layer needs. */
    ch_status (*plan)(ch_layer *l, ch_plan *pl, ch_err *err);
    /* x: (n, in) -> l->y: (n, out). */
    void (*forward)(ch_layer *l, const ch_run *r, int n, const ch_real *x);
    /* Writes the parameter gradients (overwriting) and, when dx is not NULL, dx: (n, in).
     * x and l->y are what the last forward saw. dy is not modified unless overwrites_dy says so;
     * a layer may leave its own children's outputs overwritten (they are dead after backward). */
    void (*backward)(ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *dy,
                     ch_real *dx);
    /* Frees what impl owns (children, y and the struct are freed by ch_layer_free). */
    void (*free_impl)(ch_layer *l);
    /* backward never reads l->y, so a following in-place layer may overwrite it. */
    bool y_unread_by_backward;
    /* backward may write over dy: the caller passes a gradient it does not need afterwards. */
    bool overwrites_dy;
    /* Take over the ReLU that follows: apply it to y in forward and its backward to dy in backward
     * (the layer's own y is then the ReLU's output). NULL or false: not supported. */
    bool (*absorb_relu)(ch_layer *l);
    /* Layers of several inputs (add, mul, concat) have these instead of forward and backward:
     * xs[i] is input i, of shape l->ins[i]; dxs[i] is written when not NULL (overwritten). */
    void (*forward_multi)(ch_layer *l, const ch_run *r, int n, const ch_real *const *xs);
    void (*backward_multi)(ch_layer *l, const ch_run *r, int n, const ch_real *const *xs,
                           const ch_real *dy, ch_real *const *dxs);
} ch_layer_ops;

struct ch_layer {
    const ch_layer_ops *ops;
    char name[CH_NAME_MAX];        /* module name inside the parent: "0", "conv1", "fc" */
    ch_shape3 in, out;
    int nin;                       /* inputs of a multi-input layer (ins, owned); 0 otherwise */
    ch_shape3 *ins;
    int nparams, nbuffers;         /* any number; params, p, g and buffers, b are owned arrays */
    ch_tensor_spec *params, *buffers;
    ch_real **p, **g, **b;         /* bound to the model's flat buffers */
    int64_t *num_batches_tracked;  /* BatchNorm only; bound by the model */
    /* Weights shared by several layers (a module called twice): a layer tied_to an earlier one has
     * no tensors of its own; its p are the earlier layer's, its g a private gradient (the model's
     * tied_grads) that the earlier layer adds to its own before it reports them ready. The earlier
     * layer lists its ties in tie_next order. Both borrowed. */
    ch_layer *tied_to, *tie_next;
    const ch_backend *be;          /* whose memory y and the impl's saved values are (planned) */
    ch_real *y;                    /* output activations (replica memory); owned when y_owned */
    bool y_owned;
    bool absorbed;                 /* a ReLU whose work the layer before it does: not run */
    size_t scratch_own;            /* backward scratch this layer takes (elements), planned */
    size_t scratch_need;           /* the subtree's: own + the largest child's, planned */
    int nchildren;
    ch_layer **children;           /* owned */
    void *impl;                    /* owned, layer-specific */
};

/* Tell the run's listener (if any) that layer l's parameter gradients are written, after adding the
 * gradients of the layers tied to it (which ran their backward before it: they come later in
 * forward); a tied layer reports nothing, its gradients are not the model's. */
void ch_run_grads_ready(const ch_run *r, const ch_layer *l);
/* Record a failed collective in the run (keeps the first). */
void ch_run_comm_failed(const ch_run *r, ch_status st, const ch_err *err);

/* Allocate a layer shell with the given ops, name and shapes; NULL on allocation failure. */
ch_layer *ch_layer_alloc(const ch_layer_ops *ops, const char *name, ch_shape3 in, ch_shape3 out);
/* The same into *l, with a zeroed impl of impl_size bytes (the layer's, freed with it), which it
 * returns; NULL on failure, with err set, nothing left allocated and *l NULL. */
void *ch_layer_alloc_impl(const ch_layer_ops *ops, const char *name, ch_shape3 in, ch_shape3 out, size_t impl_size,
                          ch_layer **l, ch_err *err);
/* Free a layer, its children, its y and its impl. NULL is a no-op. */
void ch_layer_free(ch_layer *l);
/* Add a parameter / buffer spec (SYSTEM when the arrays cannot grow; the layer stays whole). */
ch_status ch_layer_add_param(ch_layer *l, const char *suffix, int ndim, const int64_t *dims,
                             ch_init_role role, int fan_in, ch_err *err);
ch_status ch_layer_add_buffer(ch_layer *l, const char *suffix, int ndim, const int64_t *dims,
                              ch_init_role role, ch_err *err);
/* A constructor's last step: *out = l when st is OK, else l is freed; returns st. */
ch_status ch_layer_finish(ch_layer *l, ch_status st, ch_layer **out);
/* Append a child (takes ownership; frees it on failure). */
ch_status ch_layer_add_child(ch_layer *l, ch_layer *child, ch_err *err);
/* Allocate l->y for pl->max_batch samples in pl->be's memory (and remember the backend). */
ch_status ch_layer_alloc_output(ch_layer *l, const ch_plan *pl, ch_err *err);
/* Replica memory of count elements of size each for l's impl (pl->be's); NULL and an error on
 * failure. Freed with ch_layer_release. */
void *ch_layer_alloc_saved(ch_layer *l, const ch_plan *pl, size_t count, size_t size, ch_err *err);
void ch_layer_release(const ch_layer *l, void *p);
/* Make l write its output into buf (owned by the caller) instead of its own y, which is freed:
 * for a parent that knows l's output is consumed at once and not read by l's backward. */
void ch_layer_borrow_output(ch_layer *l, ch_real *buf);
/* The run for l's children: r with l's own scratch taken off the bottom of the stack. */
ch_run ch_run_above(const ch_run *r, const ch_layer *l);
/* The most scratch any of l's children needs (their scratch_need, planned). */
size_t ch_layer_children_need(const ch_layer *l);
/* Plan l and its whole subtree. */
ch_status ch_layer_plan_tree(ch_layer *l, ch_plan *pl, ch_err *err);

/* Constructors: validate shapes against the input and return the layer in *out.
 * Errors are CH_STATUS_BAD_INPUT (impossible geometry) or CH_STATUS_SYSTEM (allocation). */
ch_status ch_conv2d_create(const char *name, ch_shape3 in, int out_channels, int kernel,
                           int stride, int pad, bool bias, ch_layer **out, ch_err *err);
/* The general form: dilation and groups (1: none); in.c and out_channels must divide by groups. */
typedef struct ch_conv2d_opts {
    int out_channels, kernel, stride, pad, dilation, groups;
    bool bias;
} ch_conv2d_opts;
ch_status ch_conv2d_create_opts(const char *name, ch_shape3 in, const ch_conv2d_opts *o,
                                ch_layer **out, ch_err *err);
/* ConvTranspose2d (o's fields as Conv2d's, out_channels being the output's), output_padding out_pad. */
ch_status ch_conv_transpose2d_create(const char *name, ch_shape3 in, const ch_conv2d_opts *o, int out_pad,
                                     ch_layer **out, ch_err *err);
ch_status ch_linear_create(const char *name, ch_shape3 in, int out_features, ch_layer **out,
                           ch_err *err);
ch_status ch_linear_create_opts(const char *name, ch_shape3 in, int out_features, bool bias,
                                ch_layer **out, ch_err *err);
ch_status ch_maxpool2d_create(const char *name, ch_shape3 in, int kernel, int stride, int pad,
                              ch_layer **out, ch_err *err);
ch_status ch_avgpool2d_create(const char *name, ch_shape3 in, int kernel, int stride, int pad,
                              ch_layer **out, ch_err *err);
/* Pooling with PyTorch's ceil_mode and count_include_pad (average pooling only). */
typedef struct ch_pool2d_opts {
    int kernel, stride, pad;
    bool ceil_mode, count_include_pad;
} ch_pool2d_opts;
ch_status ch_maxpool2d_create_opts(const char *name, ch_shape3 in, const ch_pool2d_opts *o,
                                   ch_layer **out, ch_err *err);
ch_status ch_avgpool2d_create_opts(const char *name, ch_shape3 in, const ch_pool2d_opts *o,
                                   ch_layer **out, ch_err *err);
/* Leaky ReLU, clip (ReLU6), sigmoid, tanh, hardsigmoid, hardswish, affine by constants. */
ch_status ch_activation_create(const char *name, ch_shape3 in, const ch_act *a, ch_layer **out,
                               ch_err *err);
/* a + b and a * b with broadcasting: dims a and b of each operand aligned as ch_bcast_desc says
 * (out's or 1), out the result's shape. */
ch_status ch_bcast_create(const char *name, ch_bcast_op op, const int a[3], const int b[3],
                          ch_shape3 out_shape, ch_layer **out, ch_err *err);
/* Channel concatenation of n inputs of the same height and width. */
ch_status ch_concat_create(const char *name, const ch_shape3 *ins, int n, ch_layer **out,
                           ch_err *err);
ch_status ch_global_avgpool_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err);
/* Nearest upsampling by whole factors sh x sw (1..CH_UPSAMPLE_MAX), output sides at most
 * CH_UPSAMPLE_MAX_SIDE. */
enum { CH_UPSAMPLE_MAX = 64, CH_UPSAMPLE_MAX_SIDE = 16384 };
ch_status ch_upsample_nearest_create(const char *name, ch_shape3 in, int sh, int sw, ch_layer **out,
                                     ch_err *err);
/* Bilinear resizing to oh x ow (each 1..CH_UPSAMPLE_MAX_SIDE), PyTorch's mapping with
 * align_corners or without. */
ch_status ch_upsample_bilinear_create(const char *name, ch_shape3 in, int oh, int ow, bool align_corners,
                                      ch_layer **out, ch_err *err);
ch_status ch_relu_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err);
/* ShuffleNet's channel shuffle (include/cohort.h's ch_graph_channel_shuffle); groups divides in.c. */
ch_status ch_channel_shuffle_create(const char *name, ch_shape3 in, int groups, ch_layer **out, ch_err *err);
/* x.permute(0, 1 + perm[0], 1 + perm[1], 1 + perm[2]): perm an order of (c, h, w)'s 0, 1, 2. */
ch_status ch_permute_create(const char *name, ch_shape3 in, const int perm[3], ch_layer **out, ch_err *err);
/* Channels start .. start + count - 1 of the input. */
ch_status ch_channel_slice_create(const char *name, ch_shape3 in, int start, int count, ch_layer **out, ch_err *err);
bool ch_layer_is_relu(const ch_layer *l);
bool ch_layer_is_batchnorm(const ch_layer *l);
/* An add of two inputs of the output's shape (a residual sum): it may write over either input
 * (forward reads each element once; backward reads neither). */
bool ch_layer_is_plain_add(const ch_layer *l);
ch_status ch_flatten_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err);
/* The input's values as per-sample shape `shape` (as many values). */
ch_status ch_view_create(const char *name, ch_shape3 in, ch_shape3 shape, ch_layer **out, ch_err *err);
ch_status ch_batchnorm2d_create(const char *name, ch_shape3 in, ch_layer **out, ch_err *err);
/* With the given epsilon and momentum (PyTorch's: the weight of the batch statistic). */
ch_status ch_batchnorm2d_create_opts(const char *name, ch_shape3 in, double eps, double momentum,
                                     ch_layer **out, ch_err *err);
/* BatchNorm1d: the same layer over (features) tensors, labelled as PyTorch labels it. */
ch_status ch_batchnorm1d_create_opts(const char *name, int features, double eps, double momentum, ch_layer **out,
                                     ch_err *err);
/* Make a BatchNorm also do the ReLU that reads its output in place (the kernel table's bn_relu_*
 * entries must exist): forward, its output is then the ReLU's; backward too (only with forward),
 * its dy is then the ReLU's, masked from its input as forward computed it. For a parent that then
 * runs neither pass of that ReLU, and only where the values backward reads are those forward
 * normalised (not an input forward read in fp32 and backward from its bf16 copy). */
void ch_batchnorm2d_fuse_relu(ch_layer *l, bool forward, bool backward);
/* Make a BatchNorm's forward stop after its statistics and scale and shift, for a parent that
 * then calls ch_batchnorm2d_apply_sum: the same-shaped sum that writes over its output in place
 * (and the ReLU over that) in the normalising pass (the kernel table's bn_add_forward must exist). */
void ch_batchnorm2d_apply_later(ch_layer *l);
/* That pass, for x (the BatchNorm's forward input, still live): relu(v + res) (no clamp without
 * relu), v its normalised output, into its own output. */
void ch_batchnorm2d_apply_sum(const ch_layer *l, const ch_run *r, int n, const ch_real *x, const ch_real *res,
                              bool relu);
/* A BatchNorm2d's last forward again: y = its output for input x, from the scale and shift that
 * forward saved (the same bits), for a parent that recomputes the output instead of keeping it. */
void ch_batchnorm2d_reapply(const ch_layer *l, const ch_run *r, int n, const ch_real *x, ch_real *y);
/* The same from x rounded to bf16: what the BatchNorm keeps of its input when told where
 * (ch_batchnorm2d_keep_input). */
void ch_batchnorm2d_reapply_bf16(const ch_layer *l, const ch_run *r, int n, const uint16_t *x, ch_real *y);
/* Make a BatchNorm's training forward also store its input rounded to bf16 at keep (max batch
 * values, the caller's; the kernel table's bf16 BatchNorm entries must exist) and its backward
 * read that instead of its input, for a parent that frees the input after forward; made_there:
 * its input's maker writes keep itself (ch_conv2d_output_bf16), and both passes read only keep. */
void ch_batchnorm2d_keep_input(ch_layer *l, uint16_t *keep, bool made_there);
/* --precision bf16: make a Conv2d's forward write its output rounded to bf16 at y (max batch values,
 * the caller's) instead of its own fp32 output, where the kernels round as they write for this
 * layer (not with a fused ReLU); false (nothing changed) otherwise or for another kind of layer. */
bool ch_conv2d_output_bf16(ch_layer *l, const ch_plan *pl, uint16_t *y);
/* --precision bf16: make a BatchNorm that does the ReLU after it (ch_batchnorm2d_fuse_relu, both
 * passes) write its output, forward and reapplied, rounded to bf16 where its output pointer is (as
 * uint16_t: the caller's block, read by a convolution given ch_conv2d_input_bf16 alone). */
void ch_batchnorm2d_output_bf16(ch_layer *l);
/* --precision bf16: make a Conv2d read its input as bf16 (the pointer its passes get holds uint16_t)
 * in forward and backward, where the kernels take it so for this layer; false (nothing changed)
 * otherwise or for another kind of layer. */
bool ch_conv2d_input_bf16(ch_layer *l, const ch_plan *pl);
/* --precision bf16: make a Conv2d's backward read its output's gradient as bf16 from dy (max
 * batch values, the caller's) instead of the dy its backward gets, where the kernels take it so
 * for this layer (not with a fused ReLU); false (nothing changed) otherwise or for another kind of
 * layer. */
bool ch_conv2d_grad_bf16(ch_layer *l, const ch_plan *pl, const uint16_t *dy);
/* --precision bf16: make a BatchNorm that keeps its input in bf16 (ch_batchnorm2d_keep_input)
 * write its input's gradient rounded to bf16 over that copy, instead of into the dx its backward
 * gets (which may then be NULL): for a maker given ch_conv2d_grad_bf16 on the same copy. The
 * kernel table's bn_backward_data_to_bf16 must exist. */
void ch_batchnorm2d_grad_bf16(ch_layer *l);
/* LayerNorm over the trailing dimensions from axis 1, 2 or 3 of a (c, h, w) sample (weight and bias
 * of that shape; flat: a (features) tensor, axis 1, weight (features)), or with axis CH_LN_CHANNELS
 * over the channels at every pixel (weight (c)). eps in (0, 1). */
enum { CH_LN_CHANNELS = 0 };
ch_status ch_layernorm_create(const char *name, ch_shape3 in, int axis, bool flat, double eps, ch_layer **out,
                              ch_err *err);
ch_status ch_dropout_create(const char *name, ch_shape3 in, double p, uint32_t id,
                            ch_layer **out, ch_err *err);

#endif
