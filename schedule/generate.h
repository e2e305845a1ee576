/* schedule/generate.h: what the library's own callers (the planner's
 * search) need of the generators beyond the public API: whether a program
 * can be made, without making it. Private to the library; it must not be
 * installed or used outside it. */
#ifndef BG_SCHEDULE_GENERATE_H
#define BG_SCHEDULE_GENERATE_H

#include "brigade/schedule.h"

/* BG_OK exactly when bg_schedule_generate(params) passes its checks of the
 * params (kind, stages, microbatches, chunks, costs), else the error it
 * would return; generating nothing. A program whose params pass is made
 * unless memory runs out, or (fixed orders only: dualpipe, dualpipev) no
 * order of the family runs for p and m. */
bg_status_t bg__schedule_generate_check(const bg_schedule_params_t *params);

#endif
