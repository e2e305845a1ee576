/* core/fiber.h: two coroutines on the calling thread (core/fiber.c), so that
 * one can compute while the other waits for a collective. Used by the
 * executor to run a forward of one microbatch beside a backward of another
 * under tensor parallelism (BRIGADE_TP_OVERLAP=microbatch, docs/executor.md).
 * Internal: not installed. */
#ifndef BG_CORE_FIBER_H
#define BG_CORE_FIBER_H

#include <stddef.h>

#include "brigade/status.h"

typedef struct bg_pair bg_pair_t;

/* A function one lane runs: its status is what bg__pair_run reports for it. */
typedef bg_status_t (*bg_pair_fn)(void *arg);

/* Two stacks of @p stack_bytes each (rounded up to pages; reserved, touched
 * only as used, with a guard page below each). */
bg_status_t bg__pair_create(size_t stack_bytes, bg_pair_t **pair_p);
void bg__pair_destroy(bg_pair_t *pair); /* NULL is a no-op; not while it runs */

/* Run fn0(arg0) on lane 0 and fn1(arg1) on lane 1 and return when both have
 * returned, their statuses in st_p[0] and st_p[1]. Lane 0 starts; a lane
 * runs until it returns or calls bg__pair_yield, which resumes the other
 * lane where it left off. Each lane's error message (bg_last_error, which is
 * per thread, so the lane's own is copied as it returns) is kept in
 * msg_p[lane] when its status is not BG_OK ("" otherwise; msg_p may be NULL).
 * Not nested. */
void bg__pair_run(bg_pair_t *pair, bg_pair_fn fn0, void *arg0, bg_pair_fn fn1, void *arg1, bg_status_t st_p[2],
                  char (*msg_p)[256]);

/* Inside bg__pair_run, on a lane whose partner has not returned: switch to
 * the partner and return 1 when it switches back. Otherwise (no pair running
 * on this thread, or the partner is done) return 0 at once. */
int bg__pair_yield(void);
/* A wait found its request incomplete: hand the thread to the other lane and
 * return 1 when it comes back, or return 0 at once when there is no lane to
 * hand it to (the caller then blocks as it would outside a pair). After 32
 * such turns in a row (*idle_p counts them; start it at 0) each turn also
 * gives up the core for a moment (sched_yield), as a blocked wait does, so
 * two lanes that both wait do not starve the processes beside them. */
int bg__pair_wait_turn(int *idle_p);
/* Whether bg__pair_yield would switch now (a pair runs here and the
 * partner has not returned). */
int bg__pair_busy(void);
/* The calling lane (0 or 1); 0 outside bg__pair_run. */
int bg__pair_lane(void);

#endif
