/* A compiled graph's working state, shared by the two files that make up the graph layer: exec.c
 * (compile, the gradients' and recomputed outputs' blocks, forward, backward) and exec_plan.c (the
 * plan-time passes that decide which layers fuse and where values live; exec.c's top says what
 * each does and why). Not part of the interface (graph/graph.h). */
#ifndef CH_GRAPH_EXEC_IMPL_H
#define CH_GRAPH_EXEC_IMPL_H

#include <stdint.h>

#include "graph/graph.h"

typedef struct xnode {
    ch_layer *l;          /* borrowed: a child of the graph layer */
    bool relu_fused;      /* its layer does the ReLU after it (its y is read by its backward) */
    bool fwd_in_bn;       /* a ReLU whose forward the BatchNorm before it does (and its remake) */
    bool bwd_in_bn;       /* ... and whose backward too */
    int sum_bn;           /* a sum that does the normalising pass of BatchNorm node sum_bn - 1 (0: none) */
    bool sum_relu;        /* ... and the ReLU over it */
    bool fwd_in_sum;      /* a ReLU whose forward such a sum does */
    int nin, *in, out;    /* tensor ids (in borrowed from the description's copy below) */
    size_t *dx_off;       /* per input read again: the temporary its gradient goes to (offset) */
    bool *dx_add;         /* per input: into a temporary, added to the tensor's gradient after */
} xnode;

/* Where a tensor's gradient lives in backward: a block, over its values, or in bf16 over the copy
 * its BatchNorm keeps (halved's grad16). */
enum { GRAD_BLOCK = 0, GRAD_OVER_VALUES = 1, GRAD_BF16 = 2 };

/* A BatchNorm output (through the in-place ReLU after it, if any) that is not kept. */
typedef struct recompute {
    int bn, relu;         /* nodes; relu -1: none */
    int reader;           /* the one node that reads the values */
    int tensor;           /* what reader reads (the ReLU's output, or the BatchNorm's) */
    size_t fwd_off, bwd_off;   /* its block in forward and in backward (scratch offsets) */
} recompute;

/* A tensor kept in bf16 between forward and backward (see the top of the file). */
typedef struct halved {
    int bn, producer;     /* nodes: its one reader, a BatchNorm, and its maker */
    int tensor;
    size_t fwd_off;       /* its fp32 block in forward, from its maker to the BatchNorm */
    uint16_t *saved;      /* max_batch samples, bf16 (replica memory, the graph layer's) */
    bool direct;          /* its maker writes saved itself, and no fp32 block is taken */
    bool grad16;          /* its gradient goes in bf16 over saved, from the BatchNorm to its maker */
} halved;

typedef struct graph_impl {
    int nnodes, ntensors, input, output;
    xnode *nodes;
    int *ins;             /* all nodes' inputs, one array */
    int *alias;           /* tensor -> the tensor whose values and gradient it shares (itself) */
    int *producer;        /* tensor -> the node that makes it (-1: the input) */
    ch_shape3 *shape;
    size_t *grad_off;     /* tensor -> its gradient's scratch offset (planned) */
    unsigned char *grad_where;   /* tensor -> GRAD_BLOCK (at grad_off) or GRAD_OVER_VALUES */
    int *grad_twin;       /* tensor -> the other operand of a sum whose gradient shares its block (-1) */
    const ch_real **act;  /* tensor -> its values in the current forward */
    ch_real **dxs;        /* scratch for one node's input gradients */
    const ch_real **xs;   /* one node's inputs */
    int maxin;
    int *readers;         /* tensor (by alias) -> nodes that read it once ReLUs are fused (planned) */
    recompute *rc;        /* outputs remade in backward instead of kept */
    int nrc;
    halved *hv;           /* tensors kept in bf16 */
    int nhv;
} graph_impl;

static inline size_t tsize(const graph_impl *gi, int t) { return ch_shape3_size(gi->shape[t]); }

/* May node x write the gradient of its input t over t's own values? (exec_plan.c) */
bool ch_gx_grad_over_values(const graph_impl *gi, const xnode *x, int t);
/* The BatchNorm input kept in bf16 for node bn, or NULL. */
const halved *ch_gx_halved_for(const graph_impl *gi, int bn);
/* The passes before the blocks are planned: ReLUs fused into convolutions, the graph's output by
 * alias, the readers counted, values written in place, BatchNorm fused with its ReLU (forward) and
 * with the sum after it, outputs remade instead of kept, BatchNorm inputs kept in bf16. */
ch_status ch_gx_place_values(ch_layer *l, ch_plan *pl, ch_err *err);
/* The passes once every gradient has its block: BatchNorm fused with its ReLU's backward where
 * exact, and the outputs then passed to convolutions in bf16. */
void ch_gx_place_fused_backward(graph_impl *gi, ch_plan *pl);

#endif
