/**
 * @file lr.h
 * @brief Learning-rate schedules: the rate of every optimizer step as a pure
 *        function of the step, for hosts of the executor and for the CLI.
 *
 * A schedule is a small value the caller fills (start from
 * BG_LR_SCHEDULE_INIT); bg_lr_at() gives the rate of the 0-based step s,
 * which a host hands to bg_executor_set_lr() before bg_executor_step(). The
 * rate depends on nothing but the schedule and s, so a resumed run (s from
 * bg_executor_steps_done()) continues with exactly the rates of the
 * uninterrupted run. Closed forms (W warmup, D decay_steps, P lr, m min_lr):
 *
 *   warm-up (s < W):        P * (s + 1) / W, for every kind
 *   constant:               P
 *   cosine:                 m + (P - m) * (1 + cos(pi * q)) / 2,  q = min(1, (s - W) / (D - W))
 *   linear:                 P - (P - m) * q
 *   wsd (warmup-stable-decay, decay fraction f): E = D - ceil(f * (D - W)) steps at P, then
 *                           P - (P - m) * min(1, (s - E + 1) / (D - E)), reaching m at step D - 1
 *
 * Ownership and threads: a value type; the functions keep no state and may
 * be called from any thread.
 */
#ifndef BRIGADE_LR_H
#define BRIGADE_LR_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The shapes after the warm-up. */
typedef enum bg_lr_kind {
    BG_LR_CONSTANT = 0, /**< the peak rate throughout */
    BG_LR_COSINE = 1,   /**< half a cosine from the peak down to min_lr at decay_steps */
    BG_LR_LINEAR = 2,   /**< a straight line from the peak down to min_lr at decay_steps */
    BG_LR_WSD = 3       /**< warmup-stable-decay: the peak, then a straight line to min_lr over the last
                             wsd_decay of the steps after the warm-up */
} bg_lr_kind_t;

/** A learning-rate schedule (grows by appending; size header). */
typedef struct bg_lr_schedule {
    size_t size;        /**< sizeof(bg_lr_schedule_t), set by BG_LR_SCHEDULE_INIT */
    bg_lr_kind_t kind;  /**< shape after the warm-up */
    double lr;          /**< peak rate (> 0) */
    double min_lr;      /**< final rate of cosine, linear and wsd (0 <= min_lr <= lr) */
    int64_t warmup;     /**< steps of linear warm-up from lr / warmup to lr (0: none) */
    int64_t decay_steps; /**< step at which the decay reaches min_lr (> warmup for cosine, linear, wsd);
                              the rate stays min_lr after it. The CLI uses --steps when not given */
    double wsd_decay;   /**< wsd: fraction of the steps after the warm-up spent decaying, in (0, 1] */
} bg_lr_schedule_t;

/** Defaults: constant at 1e-3, no warm-up, min_lr 0, decay_steps 0, wsd_decay 0.2. */
#define BG_LR_SCHEDULE_INIT                                                                                  \
    { .size = sizeof(bg_lr_schedule_t), .kind = BG_LR_CONSTANT, .lr = 1e-3, .min_lr = 0.0, .warmup = 0,      \
      .decay_steps = 0, .wsd_decay = 0.2 }

/** Check a schedule: BG_ERR_INVALID with a message naming the field (as the CLI's flag) when it is not one. */
bg_status_t bg_lr_check(const bg_lr_schedule_t *s);
/** The learning rate of 0-based step @p step (the closed forms above); the schedule must pass bg_lr_check. */
double bg_lr_at(const bg_lr_schedule_t *s, int64_t step);
/** "constant", "cosine", "linear" or "wsd" -> *kind_p; BG_ERR_INVALID (listing them) for another name. */
bg_status_t bg_lr_kind_parse(const char *name, bg_lr_kind_t *kind_p);
/** The name of a kind ("constant", ...), "?" for none. */
const char *bg_lr_kind_name(bg_lr_kind_t kind);

#ifdef __cplusplus
}
#endif
#endif
