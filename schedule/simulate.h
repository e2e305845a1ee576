/* schedule/simulate.h: the simulator's entry for callers inside the library
 * that need a timeline's figures (step, busy, peaks) but not its events, as
 * the planner's search of thousands of layouts. Private to the library; it
 * must not be installed or used outside it. */
#ifndef BG_SCHEDULE_SIMULATE_H
#define BG_SCHEDULE_SIMULATE_H

#include "brigade/schedule.h"

/* bg_schedule_simulate without the event list and without validating the
 * program first: for programs bg_schedule_generate made (deadlock-free by
 * construction), whose caller validates the ones it keeps (the planner's
 * search: the plans it lists). The result's step, busy, start, end and peak
 * figures are those bg_schedule_simulate gives; it has no events
 * (bg_sim_result_events: none). A program that deadlocks ends in
 * BG_ERR_INTERNAL, never a hang. */
bg_status_t bg__schedule_simulate_figures(const bg_schedule_t *sched, const bg_sim_params_t *params,
                                          bg_sim_result_t **result_p);

#endif
