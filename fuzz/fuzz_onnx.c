/* libFuzzer harness over the ONNX importer: protobuf-c's parse of the bytes, then every check of
 * onnx.c and onnx_values.c (opsets, inputs, initializer sizes and storage, attributes, the value
 * table, folded shape arithmetic, the graph builder's own checks). Any input must give a clean
 * status, never a crash, a leak or undefined behaviour; what imports must be a complete graph
 * whose starting values are finite. Built and run by scripts/fuzz. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "graph/graph.h"
#include "graph/onnx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ch_err err;
    ch_graph *g = NULL;
    if (ch_onnx_import(data, size, "fuzz.onnx", &g, &err) != CH_STATUS_OK) {
        if (g) abort(); /* a refused file leaves nothing behind */
        return 0;
    }
    if (ch_graph_status(g, &err) != CH_STATUS_OK || g->output < 0 || g->input < 0) abort();
    for (int i = 0; i < g->ninits; i++)
        for (size_t k = 0; k < g->inits[i].count; k++)
            if (!isfinite(g->inits[i].data[k])) abort();
    ch_graph_free(g);
    return 0;
}
