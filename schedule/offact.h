/* schedule/offact.h: where activation offload (--offload activations)
 * moves each stash of a rank's program (schedule/offact.c). The executor's
 * strategy (runtime/strat_offact.c) moves them there and the replay
 * (schedule/memory.c, bg_part_schedule_counts_offact) counts them off the
 * device there: one answer for both, so the prediction is the peak. Private
 * to the library. */
#ifndef BG_SCHEDULE_OFFACT_H
#define BG_SCHEDULE_OFFACT_H

#include "brigade/schedule.h"

/* One forwarded slot (chunk c, microbatch mb) of a rank: at the start of its
 * compute instruction number out_at (counted from 0 among the rank's
 * forwards, backwards and weight pieces) the stash leaves the device, after
 * its output's send has completed; at the start of compute instruction
 * in_at it comes back. -1, -1: it stays on the device. */
typedef struct bg__offact_slot {
    int out_at, in_at;
} bg__offact_slot_t;

/* The points of every slot of rank @p rank, k = @p ahead (BRIGADE_OFFLOAD_ACT_AHEAD):
 * out at the first compute instruction after the slot's forward and its
 * SEND_ACT, in k compute instructions before its first backward piece (B or
 * the fused backward); none where that is not later than the out point, on
 * the last stage of a chain, or where waiting for the send there could
 * deadlock (a walk of every rank's program: such a point moves later).
 * *slots_p: V x M entries (chunk c, microbatch mb at c * M + mb), malloc'ed. */
bg_status_t bg__offact_points(const bg_schedule_t *sched, int rank, int ahead, bg__offact_slot_t **slots_p);
/* The same for every rank from the one walk: *slots_p holds P x V x M entries, rank r's at r * V * M. */
bg_status_t bg__offact_points_all(const bg_schedule_t *sched, int ahead, bg__offact_slot_t **slots_p);

/* k: BRIGADE_OFFLOAD_ACT_AHEAD, 0..1000 (else BG_ERR_INVALID naming it), for the strategy and the planner. */
bg_status_t bg__offact_ahead(int *ahead_p);

#endif
