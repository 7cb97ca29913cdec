/* A model: a layer tree plus the flat buffers its layers point into.
 * params and grads share one layout (PyTorch's parameters() order); buffers hold BatchNorm running
 * statistics; counters hold num_batches_tracked. tensors lists every tensor in state_dict() order with
 * its PyTorch name, for checkpoints and tests. One model is one replica: not shared between threads. */
#ifndef CH_NN_MODEL_H
#define CH_NN_MODEL_H

#include "nn/layer.h"

typedef enum ch_tensor_kind { CH_TENSOR_PARAM, CH_TENSOR_BUFFER, CH_TENSOR_COUNTER } ch_tensor_kind;

typedef struct ch_tensor_ref {
    char name[CH_NAME_MAX];
    ch_tensor_kind kind;
    const ch_tensor_spec *spec;     /* shape; NULL for counters (a scalar) */
    ch_real *data;                  /* params/buffers (replica memory) */
    int64_t *counter;               /* counters */
} ch_tensor_ref;

typedef struct ch_model {
    char arch[64];
    ch_shape3 input;
    int classes;
    ch_layer *root;
    size_t nparams, nbuffers;
    int ncounters, ntensors;
    const ch_backend *be;           /* whose memory the flat buffers and activations are */
    ch_real *params, *grads, *buffers;  /* replica memory: through be only */
    ch_real *tied_grads;            /* the gradients of layers tied to others (ntied values) */
    size_t ntied;
    int64_t *counters;
    ch_tensor_ref *tensors;
    int max_batch, nthreads;        /* as planned */
    bool bf16;                      /* set before planning: --precision bf16 (kernels.h's conv bf16) */
    int convs, bf16_convs;          /* planned: convolutions, and those multiplying in bf16 */
    int linears, bf16_linears;      /* planned: Linear layers, and those multiplying in bf16 */
    size_t bf16_kept;               /* planned: activation values kept in bf16 for backward */
    size_t bf16_direct;             /* planned: of those, written in bf16 by their convolutions */
    size_t bf16_inputs;             /* planned: convolution inputs passed in bf16 (at the max batch) */
    size_t bf16_grads;              /* planned: convolution output gradients passed in bf16 (likewise) */
    size_t ws_len;                  /* the kernels' workspace it needs (reals): be holds it */
    ch_real *scratch;               /* the layers' backward scratch stack, planned */
    size_t scratch_len;
    size_t saved_bytes;             /* kept from forward for backward besides outputs, planned */
    size_t keep_bytes;              /* the convolutions' kept transformed weights (ch_conv_desc's keep) */
} ch_model;

/* Build around an existing tree (takes ownership of root, also on failure). be (borrowed) holds
 * every buffer of the model and runs its kernels. */
ch_status ch_model_create_from(const char *arch, ch_layer *root, int classes, const ch_backend *be,
                               ch_model **out, ch_err *err);
/* init: "default" (PyTorch's) or "normal:STD" (weights N(0, STD), biases 0). */
ch_status ch_model_init_params(ch_model *m, const char *init, uint64_t seed, ch_err *err);
/* Allocate activations and workspace for up to max_batch samples with nthreads threads. */
ch_status ch_model_plan(ch_model *m, int max_batch, int nthreads, ch_err *err);
/* A run context for this model's backend and workspace. */
ch_run ch_model_run(const ch_model *m, bool training);
/* x: (n, input) -> logits (n, classes), returned (owned by the model, valid until the next call). */
const ch_real *ch_model_forward(ch_model *m, const ch_run *r, int n, const ch_real *x);
/* Writes m->grads from dlogits (n, classes); call after ch_model_forward on the same x.
 * dlogits is used as scratch (it may be overwritten), and so are the saved activations: a second
 * backward needs a new forward. */
void ch_model_backward(ch_model *m, const ch_run *r, int n, const ch_real *x,
                       const ch_real *dlogits);
/* Set a parameter or buffer from host floats (spec->count of them). */
ch_status ch_model_write_tensor(ch_model *m, const ch_tensor_ref *t, const float *values, ch_err *err);
/* n values of replica memory dev to host floats, queued on the compute stream: out is written
 * once the host has synced that stream (the double test build converts on the host, and so syncs
 * here). */
ch_status ch_model_download_floats_async(const ch_model *m, float *out, const ch_real *dev, size_t n,
                                         ch_err *err);
/* The same, complete when it returns; and back. */
ch_status ch_model_download_floats(const ch_model *m, float *out, const ch_real *dev, size_t n,
                                   ch_err *err);
ch_status ch_model_upload_floats(const ch_model *m, ch_real *dev, const float *values, size_t n,
                                 ch_err *err);
/* The tensor with this PyTorch name, or NULL. */
const ch_tensor_ref *ch_model_find(const ch_model *m, const char *name);
void ch_model_free(ch_model *m);

#endif
