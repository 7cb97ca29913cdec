/* libFuzzer harness over graph.json as eval, export and --resume read it (cJSON, then a replay
 * of the builder calls). Any input must give a clean status, never a crash, a leak or undefined
 * behaviour; what reads must be a complete graph. Built and run by scripts/fuzz. */
#include <stdint.h>
#include <stdlib.h>

#include "graph/graph.h"
#include "graph/graph_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ch_err err;
    ch_graph *g = NULL;
    if (ch_graph_from_json((const char *)data, size, "graph.json", &g, &err) != CH_STATUS_OK) {
        if (g) abort();
        return 0;
    }
    if (ch_graph_status(g, &err) != CH_STATUS_OK || g->output < 0 || g->input < 0) abort();
    ch_graph_free(g);
    return 0;
}
