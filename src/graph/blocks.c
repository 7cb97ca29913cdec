/* The scratch stack's plan (graph/blocks.h). */
#include "graph/blocks.h"

#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>

/* A block of len for the walk from now; *id names it until ch_blocks_place gives it an offset. */
ch_status ch_block_take(ch_blocks *b, size_t len, size_t *id, ch_err *err)
{
    if (b->n == b->cap) {
        const int cap = b->cap ? 2 * b->cap : 64;
        ch_span *s = realloc(b->s, sizeof *s * (size_t)cap);
        if (!s) return CH_SYS_FAIL(err, "realloc of scratch blocks");
        b->s = s;
        b->cap = cap;
    }
    b->s[b->n] = (ch_span){ .len = len, .from = b->clock++, .to = LONG_MAX };
    *id = (size_t)b->n++;
    return CH_STATUS_OK;
}

void ch_block_give(ch_blocks *b, size_t id)
{
    CH_ASSERT(id < (size_t)b->n && b->s[id].to == LONG_MAX);
    b->s[id].to = b->clock++;
}

/* Block ids, the largest first, then in the order taken (an insertion sort: a few hundred). */
static void larger_first(const ch_blocks *b, int *order)
{
    for (int i = 0; i < b->n; i++) {
        int k = i;
        while (k > 0 && b->s[order[k - 1]].len < b->s[i].len) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
}

/* The lowest offset where block i fits beside the placed blocks that are live with it. */
static size_t lowest_fit(const ch_blocks *b, const bool *placed, int i)
{
    size_t off = 0;
    for (bool moved = true; moved;) {
        moved = false;
        for (int j = 0; j < b->n; j++) {
            const ch_span *o = &b->s[j];
            if (!placed[j] || o->to <= b->s[i].from || b->s[i].to <= o->from) continue;
            if (off < o->off + o->len && o->off < off + b->s[i].len) {
                off = o->off + o->len;
                moved = true;
            }
        }
    }
    return off;
}

/* Offsets for every block, the largest placed first, each at the lowest offset free of the blocks
 * live at the same time (greedy by size, as arena planners for inference do); the stack's size to
 * *top. Placing as the walk goes (best fit, in the order taken) left holes: a block handed on
 * from one residual block's end to the next keeps its first, late-stage place, and the early
 * stages' larger blocks go above it (resnet18 in bf16: 4.5 of its largest activations where 4
 * do; lenet's backward 1.45 M floats at batch 64 against 1.08 M placed this way). */
ch_status ch_blocks_place(ch_blocks *b, size_t *top, ch_err *err)
{
    int *order = malloc(sizeof *order * (size_t)(b->n ? b->n : 1));
    bool *placed = calloc((size_t)(b->n ? b->n : 1), sizeof *placed);
    if (!order || !placed) {
        free(order);
        free(placed);
        return CH_SYS_FAIL(err, "allocation of the scratch plan");
    }
    larger_first(b, order);
    *top = 0;
    for (int k = 0; k < b->n; k++) {
        ch_span *s = &b->s[order[k]];
        s->off = lowest_fit(b, placed, order[k]);
        placed[order[k]] = true;
        if (s->off + s->len > *top) *top = s->off + s->len;
    }
    free(order);
    free(placed);
    return CH_STATUS_OK;
}

/* The offset that block *id was given. */
void ch_block_offset(const ch_blocks *b, size_t *id) { *id = b->s[*id].off; }
