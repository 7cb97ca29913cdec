/* Graphs to and from JSON: the graph.json of a checkpoint (see graph_json.c). */
#ifndef CH_GRAPH_GRAPH_JSON_H
#define CH_GRAPH_GRAPH_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"

/* A complete graph as JSON text the caller frees (NULL when memory is out). */
char *ch_graph_to_json(const ch_graph *g);
/* The graph of JSON text (len bytes; path names it in messages), rebuilt through the builder:
 * BAD_INPUT with one line for anything a builder call would refuse. */
ch_status ch_graph_from_json(const char *text, size_t len, const char *path, ch_graph **out, ch_err *err);

/* A hash of the graph's JSON, which holds everything that defines the computation (names, ops,
 * arguments, edges, the input shape): ranks compare it before they train together, and --resume
 * compares the checkpoint's with the run's. The text form is for JSON already made. */
ch_status ch_graph_fingerprint(const ch_graph *g, uint64_t *out, ch_err *err);
uint64_t ch_graph_text_fingerprint(const char *json);

#endif
