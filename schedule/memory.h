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
#include "schedule/offact.h"

static inline size_t bg__row_bytes(const bg_part_counts_t *n, const bg_part_stage_t *e)
{
    return (size_t)n->begun * e->input_bytes + (size_t)n->forwarded * (e->data_bytes + e->keep_bytes) +
           (size_t)(e->recompute ? n->recomputing : n->forwarded - n->offloaded) * e->layer_act_bytes +
           (size_t)n->dout * e->dout_bytes + (size_t)(n->backward - n->fused) * e->bw_bytes +
           (size_t)n->fused * e->fused_bw_bytes + (size_t)n->lingering * e->linger_bytes;
}

/* Row a needs at least the bytes of row b for every stage (bg_part_counts_dominate): every count, and the
 * stashes on the device (forwarded less offloaded), at least b's. */
static inline int bg__counts_dominate(const bg_part_counts_t *a, const bg_part_counts_t *b)
{
    return a->begun >= b->begun && a->forwarded >= b->forwarded && a->dout >= b->dout && a->fused >= b->fused &&
           a->backward - a->fused >= b->backward - b->fused && a->recomputing >= b->recomputing &&
           a->lingering >= b->lingering && a->forwarded - a->offloaded >= b->forwarded - b->offloaded;
}

/* --zero 2's gradient buckets of a stage, sized from its shard (the
 * executor makes the buckets, runtime/exec_grads.c, and their buffers,
 * runtime/zero.c; the partitioner counts them): the buffers must never cost
 * more than sharding the gradients saves, (1 - 1/dp) of the stage's
 * gradients. A bucket aims at no more than the stage's parameters /
 * (2 dp (buffers + 2)) floats: the + 2 leaves room for --zero 3's default
 * two gather buffers of a bucket's size, and --zero 2 and 3 cut the same
 * buckets, so they sum in the same order (configured: BRIGADE_BUCKET_MB's,
 * the upper bound; buckets stay whole layers, so one may be larger). */
static inline size_t bg__zero2_bucket_floats(size_t configured, size_t stage_params, int dp, int buffers)
{
    size_t cap = stage_params / (2 * (size_t)dp * ((size_t)buffers + 2));
    return configured < cap ? configured : cap;
}

/* How many buffers of the largest bucket's floats a stage holds: want
 * (BRIGADE_ZERO_BUFFERS), no more than its buckets, and fewer than fill
 * what the shard saves (one: each bucket's reduce-scatter waited for before
 * the next bucket is written, no overlap). 0: not even one fits (a layer
 * holding most of the stage): the stage keeps its gradients whole as --zero
 * 1 does, so that it never costs more. */
static inline int bg__zero2_buffers(int want, int nbuckets, size_t largest, size_t stage_params, int dp)
{
    size_t saved = stage_params - stage_params / (size_t)dp, fit = largest && saved ? (saved - 1) / largest : (size_t)want;
    int n = want < nbuckets ? want : nbuckets;
    return (size_t)n > fit ? (int)fit : n;
}

/* --zero 3's parameter gather buffers of a stage: want (BRIGADE_ZERO_PREFETCH + 1), no more than its
 * buckets, and fewer while the shard (owned floats) and the buffers would hold as much as its parameters
 * (0: none fits, the stage keeps them whole as --zero 2 does; runtime/zero_params.c, the partitioner). */
static inline int bg__zero3_buffers(int want, int nbuckets, size_t owned, size_t largest, size_t stage_params)
{
    int n = want < nbuckets ? want : nbuckets;
    while (n > 0 && owned + (size_t)n * largest >= stage_params)
        n--;
    return n;
}

/* The buckets of layers first..last from the last (params: prefix sums of
 * the layers' parameters, params[i + 1] - params[i] for layer i): a bucket
 * closes once it holds target floats or at the first layer. Returns the
 * count; *largest_p: the largest bucket's floats. */
static inline int bg__zero2_bucket_walk(const size_t *params, int first, int last, size_t target, size_t *largest_p)
{
    int n = 0, hi = last;
    *largest_p = 0;
    for (int i = last; i >= first; i--)
        if (i == first || params[hi + 1] - params[i] >= target) {
            size_t c = params[hi + 1] - params[i];
            *largest_p = c > *largest_p ? c : *largest_p;
            n += c > 0;
            hi = i - 1;
        }
    return n;
}

/* bg_part_schedule_counts_offact with rank's points already known (bg__offact_points; NULL: no offload),
 * for the executor's strategy and the planner, which have them. */
bg_status_t bg__part_schedule_counts_at(const bg_schedule_t *sched, int rank, const bg__offact_slot_t *pts,
                                        bg_part_counts_t **rows_p, int *npoints_p);

#endif
