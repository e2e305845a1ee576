/* runtime/tp.h: the runtime side of tensor parallelism (runtime/ only; not
 * installed): a model description's tensor group over the transport. */
#ifndef BRIGADE_RUNTIME_TP_H
#define BRIGADE_RUNTIME_TP_H

#include "brigade/model.h"
#include "brigade/transport.h"
#include "runtime/staging.h"
#include "runtime/trace.h"

typedef struct bg_tp_group bg__tp_t; /* the public bg_tp_group_t (executor.h) */

/* Check before anything is allocated or connected: tp >= 1 and the
 * description's split layers are of degree tp (or it has none and tp = 1:
 * tensor parallelism needs tensor-parallel layers). The message names both. */
/* Wait for @p req and free it; inside the executor's coroutine pair (core/fiber.h), the other lane runs
 * while it is not complete (a tensor group's sums, expert parallelism's all-to-alls). */
bg_status_t bg__tp_pair_wait(bg__xfer_t *req);
bg_status_t bg__tp_check_params(const bg_model_desc_t *desc, int tp);

/* The tensor group of world ranks [first, first + tp) and bind @p desc to it
 * (bg_model_desc_set_tp). tp = 1: *tp_p = NULL, nothing bound. */
bg_status_t bg__tp_create(bg_comm_t *comm, bg_model_desc_t *desc, int tp, int first, bg__tp_t **tp_p);
/* The group's collectives on the buffers of sg's backend (runtime/devcoll.h; NULL: host buffers), each
 * lane's provider logged for log_rank. NULL tp: a no-op. */
bg_status_t bg__tp_bind(bg__tp_t *tp, bg__staging_t *sg, int log_rank);
/* Record every collective of the group in @p trace (NULL: none) at step *step + 1. */
void bg__tp_set_trace(bg__tp_t *tp, bg_trace_t *trace, const int64_t *step);
/* Unbind desc and free the group (NULL is a no-op). */
void bg__tp_destroy(bg__tp_t *tp, bg_model_desc_t *desc);

#endif
