/* What the ONNX importer knows about each named value of a file: a tensor of the graph being
 * built, a small constant (shape arithmetic, Clip bounds, dropout ratios), a weight initializer,
 * or an output nobody may read (BatchNorm's running statistics, a dropout mask). Values are found
 * by name through a hash table, so a file of many nodes costs linear time. */
#ifndef CH_GRAPH_ONNX_VALUES_H
#define CH_GRAPH_ONNX_VALUES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "onnx.pb-c.h"

/* The batch dimension inside folded shape arithmetic: Shape(x)[0], whatever it will be. */
#define CH_ONNX_BATCH INT64_MIN
enum { CH_ONNX_CONST_MAX = 64 };

typedef enum ch_oval_kind {
    CH_OVAL_TENSOR,     /* a graph tensor: .tensor (maybe .expanded) */
    CH_OVAL_CONST,      /* .n numbers in .i (integers) or .f (floats); .rank 0 or 1 */
    CH_OVAL_PARAM,      /* an initializer: .init */
    CH_OVAL_PARAM_T,    /* Transpose(initializer, perm (1, 0)): a Linear weight used by MatMul */
    CH_OVAL_DEAD,       /* an output cohort does not compute: .why says which */
} ch_oval_kind;

typedef struct ch_oval {
    const char *name;   /* the file's string */
    ch_oval_kind kind;
    int tensor;
    bool is_float, folded_softmax;
    int rank, n;
    int64_t i[CH_ONNX_CONST_MAX];
    double f[CH_ONNX_CONST_MAX];
    const Onnx__TensorProto *init;
    int uses;           /* how many nodes read an initializer */
    int owner;          /* 1 + the graph node whose parameter an initializer became; 0: none yet */
    /* A tensor that an Expand broadcasts to dims (aligned right, as (c, h, w)); only a broadcasting
     * Add or Mul may read it, where the broadcast happens anyway. */
    bool expanded;
    int edims[3];
    /* A tensor whose ONNX shape is (batch, pdims[0], pdims[1]), as between two Unsqueezes: the
     * graph tensor holds its values; only Squeeze and Unsqueeze may read it. */
    bool pending;
    int pdims[2];
    /* A tensor that a zero Pad surrounds by padded pixels on each side of h and w, as PyTorch exports
     * AvgPool2d(padding=p) with count_include_pad: only an AveragePool may read it, which folds
     * the padding into its own, counting the zeros. */
    int padded;
    /* A tensor viewed as (batch, grouped[0], grouped[1], h, w), its channels split into groups (a
     * channel shuffle's 5-D view; 0: not so viewed): only the shuffle's Transpose and a Reshape
     * back to 4 dimensions may read it. */
    int grouped[2];
    /* A tensor viewed channels-last, (batch, h, w, c), as x.permute(0, 2, 3, 1) makes it: only a
     * LayerNorm over its last axis (ConvNeXt's, over the channels) and the permute back may read it. */
    bool channels_last;
    const char *why;
} ch_oval;

typedef struct ch_ovals {
    ch_oval *v;
    size_t n, cap;
    int32_t *slot;      /* open addressing: index into v, -1 empty */
    size_t nslots;
} ch_ovals;

void ch_ovals_free(ch_ovals *t);
ch_oval *ch_ovals_find(const ch_ovals *t, const char *name);
/* A new value named name; NULL with err set when the name is taken or memory is out. */
ch_oval *ch_ovals_add(ch_ovals *t, const char *name, ch_oval_kind kind, ch_err *err);

/* An initializer or a Constant's tensor: its element count (dims bounded, no external data).
 * what names it in messages. */
ch_status ch_onnx_tensor_count(const Onnx__TensorProto *t, const char *what, size_t *count, ch_err *err);
/* Its values as floats (FLOAT tensors only) in a new buffer the caller frees. */
ch_status ch_onnx_tensor_floats(const Onnx__TensorProto *t, const char *what, float **out, size_t *count,
                                ch_err *err);
/* A small constant (at most CH_ONNX_CONST_MAX numbers of an integer, float or bool type) into v. */
ch_status ch_onnx_tensor_const(const Onnx__TensorProto *t, const char *what, ch_oval *v, ch_err *err);

#endif
