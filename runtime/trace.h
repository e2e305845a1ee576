/* runtime/trace.h: Chrome trace-event recording for the executor. Each rank
 * records its ops; bg__trace_write gathers them on rank 0, shifted onto rank
 * 0's clock by an offset measured at creation, and writes one JSON file. */
#ifndef BG_RUNTIME_TRACE_H
#define BG_RUNTIME_TRACE_H

#include "brigade/transport.h"

typedef struct bg_trace bg_trace_t;

/* Collective over the comm's world: measures this rank's clock offset. */
bg_status_t bg__trace_create(bg_comm_t *comm, int rank, bg_trace_t **trace_p);
/* Record one op [t0, t1) (bg_now() seconds). */
void bg__trace_event(bg_trace_t *t, const char *name, int microbatch, int stage, double t0, double t1, int step);
/* Collective: rank 0 writes every rank's events to path (atomically), with
 * `meta_json` (a JSON object's text, or NULL) as the file's "otherData". */
bg_status_t bg__trace_write(bg_trace_t *t, const char *path, const char *meta_json);
void bg__trace_destroy(bg_trace_t *t);

#endif
