/* Graphs of operations: the description a user builds (include/cohort.h's ch_graph_* calls, or an
 * importer), and its compilation into a layer that runs it.
 * A graph is a list of nodes in the order they were added; a node reads tensors made before it, so
 * the list is already a topological order and cannot hold a cycle. Tensor shapes are per sample
 * (the batch dimension is open): rank 3 (c, h, w) or rank 1 (features). dtype is float32 today;
 * tensors carry it so that other types need no second description. */
#ifndef CH_GRAPH_GRAPH_H
#define CH_GRAPH_GRAPH_H

#include "cohort.h"
#include "core/status.h"
#include "nn/layer.h"
#include "nn/model.h"

typedef enum ch_gop {
    CH_GOP_CONV2D, CH_GOP_BATCHNORM2D, CH_GOP_RELU, CH_GOP_ACT, CH_GOP_MAX_POOL2D,
    CH_GOP_AVG_POOL2D, CH_GOP_GLOBAL_AVG_POOL, CH_GOP_MEAN_HW, CH_GOP_FLATTEN, CH_GOP_LINEAR,
    CH_GOP_DROPOUT, CH_GOP_ADD, CH_GOP_MUL, CH_GOP_CONCAT, CH_GOP_VIEW, CH_GOP_UPSAMPLE,
    CH_GOP_SHUFFLE, CH_GOP_SLICE, CH_GOP_LAYERNORM, CH_GOP_CONV_T,
    CH_GOP_BILINEAR, CH_GOP_PERMUTE,
} ch_gop;

typedef enum ch_dtype { CH_DTYPE_F32 = 0 } ch_dtype;

/* The ops' numeric arguments, each with the one range the builder, the importers (which build
 * through it) and graph.json's reader accept, so that what is written is always readable. Values
 * are checked as stored: a float argument after its rounding to float. */
typedef enum ch_garg {
    CH_GARG_BN_EPS, CH_GARG_BN_MOMENTUM, CH_GARG_LEAKY_ALPHA, CH_GARG_CLIP_BOUND, CH_GARG_AFFINE,
    CH_GARG_DROPOUT_P, CH_GARG_KERNEL, CH_GARG_STRIDE, CH_GARG_PADDING, CH_GARG_DILATION, CH_GARG_CHANNELS,
    CH_GARG_FEATURES, CH_GARG_SCALE, CH_GARG_LN_AXIS, CH_GARG_SIDE, CH_GARG_COUNT
} ch_garg;

typedef struct ch_garg_range {
    double lo, hi;
} ch_garg_range;

ch_garg_range ch_garg_range_of(ch_garg a);
/* v within a's range (NaN never is). */
bool ch_garg_ok(ch_garg a, double v);

typedef struct ch_gtensor {
    int rank;           /* 3: (c, h, w); 1: (features) in dims[0] */
    int dims[3];        /* unused dimensions are 1 */
    ch_dtype dtype;
    int producer;       /* node index; -1: the graph's input */
} ch_gtensor;

typedef struct ch_gnode {
    char name[CH_NODE_NAME_MAX];
    ch_gop op;
    int nin;
    int *in;            /* tensor ids (owned) */
    int out;            /* tensor id */
    /* Arguments, by op. */
    ch_conv2d_args conv;
    int out_pad;        /* conv_transpose2d's output_padding */
    ch_pool2d_args pool;
    ch_batchnorm_args bn;
    ch_act act;
    int features;       /* linear */
    bool bias;          /* linear */
    bool keepdim;       /* mean_hw */
    double p;           /* dropout */
    int view[3];        /* view: the per-sample shape (c, h, w); permute: the order of (c, h, w) (0..2) */
    int scale[2];       /* upsample: whole factors (h, w); bilinear: the output's (h, w) */
    bool align;         /* bilinear: align_corners */
    int groups;         /* channel shuffle */
    int slice[2];       /* channel slice: start, count */
    int ln_axis;        /* layer norm (eps in bn.eps) */
    int tied;           /* 1 + the node whose parameters this one uses (ch_graph_reuse); 0: its own */
} ch_gnode;

/* A tensor's starting values (an imported file's weights), by state_dict name. */
typedef struct ch_ginit {
    char name[CH_NAME_MAX];
    size_t count;
    float *data;        /* owned */
} ch_ginit;

struct ch_graph {
    char name[64];
    char input_name[CH_NODE_NAME_MAX];
    int nnodes, ntensors, node_cap, tensor_cap;
    ch_gnode *nodes;
    ch_gtensor *tensors;
    int input, output;  /* tensor ids; -1: not set yet */
    int ninits, init_cap;
    ch_ginit *inits;    /* starting values; none for a graph built in code */
    ch_status st;       /* the first error (sticky) */
    ch_err err;
};

/* Record tensor's starting values, taking data (malloc'd; freed here on failure too): a model
 * made from the graph starts from them when its init is "file". */
ch_status ch_graph_take_initial(ch_graph *g, const char *tensor, float *data, size_t count, ch_err *err);

/* The per-sample shape of tensor t as a layer sees it: rank 1 is (features, 1, 1). */
ch_shape3 ch_graph_shape(const ch_graph *g, int t);
/* Make node i's layer for the shapes of its inputs (named after the node). */
ch_status ch_graph_node_layer(const ch_graph *g, int i, ch_layer **out, ch_err *err);
/* Compile a complete graph into one layer that runs it (the root of a model): its children are the
 * nodes' layers, named by the nodes' names, so the model's tensors get the PyTorch names. Checks
 * the graph first: an output, every node on a path to it. */
ch_status ch_graph_compile(const ch_graph *g, ch_layer **out, ch_err *err);
/* "conv2d", "batchnorm2d", ...: what the builder and error messages call op. */
const char *ch_gop_name(ch_gop op);
/* The same, with activations by kind ("sigmoid", "hardswish", ...): a node's op in graph.json. */
const char *ch_gnode_op_name(const ch_gnode *nd);

/* ---- graph -> model (graph_model.c) ---- */

/* Build a graph's model (include/cohort.h's ch_graph; the zoo's are graphs too, models/zoo.h) for
 * inputs of shape `input` and `classes` outputs, which must be the graph's: a mismatch names both.
 * Allocates the flat buffers and binds the layers; parameters are zero until
 * ch_model_init_params. */
ch_status ch_model_create_graph(const ch_graph *g, ch_shape3 input, int classes,
                                const ch_backend *be, ch_model **out, ch_err *err);
/* Set every parameter and buffer from the graph's starting values (an imported file's weights):
 * each must be there, of the model's size. */
ch_status ch_model_load_initial(ch_model *m, const ch_graph *g, ch_err *err);

#endif
