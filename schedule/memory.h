/* schedule/memory.h: the bytes a row of slot counts holds and whether a row
 * dominates another (memory.c's bg_part_row_bytes, bg_part_counts_dominate)
 * as inline functions, for the inner loops of the partitioner (every range
 * and row it tries), the program replay and the planner's rows. Private to
 * the library; the one definition of each: the exported functions call
 * them. */
#ifndef BG_SCHEDULE_MEMORY_H
#define BG_SCHEDULE_MEMORY_H

#include <stddef.h>

#include "brigade/partitioner.h"

static inline size_t bg__row_bytes(const bg_part_counts_t *n, const bg_part_stage_t *e)
{
    return (size_t)n->begun * e->input_bytes + (size_t)n->forwarded * (e->data_bytes + e->keep_bytes) +
           (size_t)(e->recompute ? n->recomputing : n->forwarded) * e->layer_act_bytes +
           (size_t)n->dout * e->dout_bytes + (size_t)(n->backward - n->fused) * e->bw_bytes +
           (size_t)n->fused * e->fused_bw_bytes + (size_t)n->lingering * e->linger_bytes;
}

/* Row a needs at least the bytes of row b for every stage (bg_part_counts_dominate). */
static inline int bg__counts_dominate(const bg_part_counts_t *a, const bg_part_counts_t *b)
{
    return a->begun >= b->begun && a->forwarded >= b->forwarded && a->dout >= b->dout && a->fused >= b->fused &&
           a->backward - a->fused >= b->backward - b->fused && a->recomputing >= b->recomputing &&
           a->lingering >= b->lingering;
}

#endif
