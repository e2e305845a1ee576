/* runtime/cp.h: the runtime side of context parallelism (runtime/ only; not
 * installed): a model description's context group over the transport. */
#ifndef BRIGADE_RUNTIME_CP_H
#define BRIGADE_RUNTIME_CP_H

#include "brigade/model.h"
#include "brigade/transport.h"

typedef struct bg__cp bg__cp_t;

/* The context group of world ranks @p ranks (cp entries, the ring's order;
 * this rank is member @p me) and bind @p desc to it (bg_model_desc_set_cp,
 * which refuses a model with layers that do not support it); the bytes its
 * ring sends are added to *bytes_sent (the step's point-to-point counter).
 * cp = 1: *cp_p = NULL, nothing bound. */
bg_status_t bg__cp_create(bg_comm_t *comm, bg_model_desc_t *desc, int cp, const int *ranks, int me,
                          uint64_t *bytes_sent, bg__cp_t **cp_p);
/* Unbind desc and free the group (NULL is a no-op). */
void bg__cp_destroy(bg__cp_t *cp, bg_model_desc_t *desc);

#endif
