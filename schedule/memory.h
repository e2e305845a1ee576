/* schedule/memory.h: the bytes a row of slot counts holds (memory.c's
 * bg_part_row_bytes) as an inline function, for the partitioner's inner
 * loop, which evaluates it for every range and row it tries. Private to the
 * library; the one definition of the formula: bg_part_row_bytes calls it. */
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

#endif
