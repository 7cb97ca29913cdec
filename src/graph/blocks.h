/* The scratch stack's plan: blocks taken and given back as a plan walks a graph's nodes, recorded,
 * then all given offsets at once, the largest first (graph/exec.c's forward and backward plans). */
#ifndef CH_GRAPH_BLOCKS_H
#define CH_GRAPH_BLOCKS_H

#include <stddef.h>

#include "core/status.h"

/* A block: its size, its offset once placed, and the walk's clock when it was taken and given back
 * (never: LONG_MAX). */
typedef struct ch_span {
    size_t len, off;
    long from, to;
} ch_span;

/* Zero-initialised to start; s is the caller's to free. */
typedef struct ch_blocks {
    ch_span *s;           /* in the order taken: a block's id is its index */
    int n, cap;
    long clock;
} ch_blocks;

/* A block of len for the walk from now; *id names it until ch_blocks_place gives it an offset. */
ch_status ch_block_take(ch_blocks *b, size_t len, size_t *id, ch_err *err);
/* Block id is free from now (given twice: an internal error). */
void ch_block_give(ch_blocks *b, size_t id);
/* Every block's offset, the stack's size to *top. */
ch_status ch_blocks_place(ch_blocks *b, size_t *top, ch_err *err);
/* *id, a block's id, becomes the offset it was placed at. */
void ch_block_offset(const ch_blocks *b, size_t *id);

#endif
