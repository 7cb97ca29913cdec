/* The ONNX importer's working state and the helpers its parts share (onnx.c walks the file,
 * onnx_ops.c turns each operator into builder calls, onnx_imp.c holds these): reading a node's
 * attributes and inputs, defining its outputs, taking weights, and the one-line refusals. Not
 * part of the interface (graph/onnx.h). */
#ifndef CH_GRAPH_ONNX_IMP_H
#define CH_GRAPH_ONNX_IMP_H

#include "graph/graph.h"
#include "graph/onnx_values.h"

enum { CH_ONNX_OPSET_MIN = 13, CH_ONNX_OPSET_MAX = 17 };

typedef struct ch_onnx_imp {
    const char *file;
    ch_graph *g;
    const Onnx__GraphProto *gp;
    int opset;
    const char *output;         /* the graph output's name */
    ch_ovals vals;
    ch_err *err;
    const Onnx__NodeProto *node; /* the node being imported, for messages */
    char shown[4][96];
} ch_onnx_imp;

/* A string from the file as it may appear in a one-line message: printable, at most 80 bytes, in
 * one of m's 4 slots (a message shows up to 4 at once). */
const char *ch_onnx_show(ch_onnx_imp *m, int slot, const char *s);
/* BAD_INPUT with "FILE: node 'NAME' (OP): MESSAGE" in m->err (without a node: "FILE: MESSAGE"). */
ch_status ch_onnx_bad(ch_onnx_imp *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The node's attributes: absent ones are def; a wrong type or value is refused. */
const Onnx__AttributeProto *ch_onnx_attr(const Onnx__NodeProto *n, const char *name);
ch_status ch_onnx_attr_int(ch_onnx_imp *m, const char *name, int64_t def, int64_t *out);
ch_status ch_onnx_attr_float(ch_onnx_imp *m, const char *name, double def, double *out);
/* A pair for the two spatial dimensions that must be equal (cohort's kernels are square), from an
 * attribute of n values (2, or 4 for pads) that is def when absent. */
ch_status ch_onnx_attr_square(ch_onnx_imp *m, const char *name, int n, int64_t def, int64_t lo, int64_t hi,
                              int *out);
ch_status ch_onnx_no_auto_pad(ch_onnx_imp *m);
/* A float32 attribute holds what the user typed (0.1, 1e-5) to float precision: give it back as
 * typed, so that BatchNorm's momentum is 0.1 as in PyTorch, not 0.100000024. */
double ch_onnx_as_typed(double x);
/* The k-th input of the node (NULL when absent and optional). */
ch_status ch_onnx_input(ch_onnx_imp *m, size_t k, bool required, ch_oval **out);
/* Input k, which must be a tensor computed from the model's input. */
ch_status ch_onnx_tensor_val(ch_onnx_imp *m, size_t k, ch_oval **out);
ch_status ch_onnx_tensor_in(ch_onnx_imp *m, size_t k, int *t);
/* A constant input (a Constant's output, folded shape arithmetic, or a small initializer). */
ch_status ch_onnx_const_in(ch_onnx_imp *m, size_t k, bool required, ch_oval **out);
ch_status ch_onnx_define(ch_onnx_imp *m, size_t k, ch_oval_kind kind, ch_oval **out);
/* Outputs from k on are ones cohort does not compute: reading them is refused, saying why. */
ch_status ch_onnx_dead_from(ch_onnx_imp *m, size_t k, const char *why);
/* The node's output 0 is graph tensor t (a builder result: -1 carries the builder's error). */
ch_status ch_onnx_tensor_out(ch_onnx_imp *m, int t);
/* Output 0 is input value src under a new name (Identity and the ops folded away). */
ch_status ch_onnx_alias_out(ch_onnx_imp *m, const ch_oval *src);
/* A name for a node without weights: its own when usable, else OP_INDEX. */
const char *ch_onnx_node_name(ch_onnx_imp *m, char *buf, size_t len);
/* Refuses an initializer named like an inference export's (folded BatchNorm), with the call to use. */
ch_status ch_onnx_inference_export(ch_onnx_imp *m, const char *init);
/* Input k is the initializer PREFIX.SUFFIX of the given shape, read by no other node: its values
 * become the graph's starting values. Absent and optional: *present false. */
ch_status ch_onnx_param(ch_onnx_imp *m, size_t k, const char *prefix, const char *suffix, const int64_t *shape,
                        int rank, bool *present);
/* A module called twice: when the initializer of weight input k already became a parameter of an
 * earlier node, *twin is that node (else -1), and the node's other parameter inputs (k + 1 to
 * last) must be that node's too. */
ch_status ch_onnx_twin(ch_onnx_imp *m, size_t k, size_t last, int *twin);
/* Output 0 is twin's operation and parameters again on tensor x (ch_graph_reuse), when the node's
 * arguments are the twin's (same); refused naming the twin otherwise. */
ch_status ch_onnx_reuse_out(ch_onnx_imp *m, int twin, int x, bool same);
/* The weight input k (an initializer, maybe transposed) and its module path. */
ch_status ch_onnx_weight_of(ch_onnx_imp *m, size_t k, const Onnx__TensorProto **t, char *prefix);
/* Whether cohort imports n's operator at all (its domain and op type), and what in PyTorch makes an
 * operator it does not import ("nn.Upsample or F.interpolate" for Resize), or NULL. */
bool ch_onnx_op_known(const Onnx__NodeProto *n);
/* "operator 'Resize' is not supported (nn.Upsample or F.interpolate, in module up1)": for a node
 * whose operator (or domain) cohort does not import. */
void ch_onnx_unknown_why(ch_onnx_imp *m, const Onnx__NodeProto *n, char *buf, size_t len);
#define CH_ONNX_IMPORTS                                                                                            \
    "cohort imports Conv, ConvTranspose, BatchNormalization, Relu, LeakyRelu, Clip, Sigmoid, Tanh, Erf, HardSigmoid, HardSwish, " \
    "MaxPool, AveragePool, GlobalAveragePool, ReduceMean, Flatten, Reshape, Gemm, MatMul, Add, Mul (of tensors or " \
    "by numbers), Sub and Div by numbers, Expand into Add or Mul, Concat, Dropout, Resize (nearest by whole factors, and bilinear), " \
    "LayerNormalization (and the permutes around a channels-last one), Slice of channels, a channel shuffle (a Reshape into groups, Transpose, Reshape back), a final (Log)Softmax and shape arithmetic"
const char *ch_onnx_op_hint(const char *op);
/* The shape operators (onnx_shape.c), for the walk's table. */
ch_status ch_onnx_op_shape(ch_onnx_imp *m);
ch_status ch_onnx_op_gather(ch_onnx_imp *m);
ch_status ch_onnx_op_squeeze(ch_onnx_imp *m);
ch_status ch_onnx_op_concat(ch_onnx_imp *m);
ch_status ch_onnx_op_slice(ch_onnx_imp *m);
ch_status ch_onnx_op_reshape(ch_onnx_imp *m);
ch_status ch_onnx_op_transpose(ch_onnx_imp *m);
/* Output 0 is tensor t (a builder result), viewed channels-last or not (LayerNorm's permutes). */
ch_status ch_onnx_viewed_out(ch_onnx_imp *m, int t, bool channels_last);
/* Node n of the walk into the graph, by its operator; a refusal names it. */
ch_status ch_onnx_import_node(ch_onnx_imp *m, const Onnx__NodeProto *n);

#endif
