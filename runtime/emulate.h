/* runtime/emulate.h: emulated compute for brigade train --emulate (internal). */
#ifndef BG_RUNTIME_EMULATE_H
#define BG_RUNTIME_EMULATE_H

#include "brigade/core.h"
#include "brigade/schedule.h"
#include "brigade/transport.h"
#include "runtime/staging.h"

/* Per virtual stage F, b, W seconds (already scaled) from a layer profile. */
typedef struct bg__emulate {
    int S;
    double *f, *b, *w;
    double late;     /* how late the last compute ended (s), made up by the next back-to-back one */
    double last_end; /* when it ended (bg_now) */
} bg__emulate_t;

/* Read PROFILE (brigade profile --json: layers[].fwd_s, bwd_input_s,
 * bwd_weight_s) for a model of `nlayers` layers, sum each stage's layers
 * [first[s], last[s]] and multiply by `scale` (> 0). One clear error naming
 * the file and field on bad input. */
bg_status_t bg__emulate_load(const char *path, double scale, int nlayers, const int *first, const int *last, int S,
                             bg__emulate_t **em_p);
void bg__emulate_free(bg__emulate_t *em);
/* Stand in for `seconds` of compute: sleep (never spin) until that much time
 * has passed since the call. A sleep ends late when the process gets its
 * core back late; a compute instruction that starts right after the previous
 * one (within 100 us) ends that much earlier, so back-to-back compute keeps
 * the profile's pace. The first load sets this process's timer slack to
 * 1 ns, so sleeps end on time where a core is free. */
void bg__emulate_wait(bg__emulate_t *em, double seconds);
/* Wait (up to 10 s) for rq to complete by testing and sleeping, not spinning;
 * the caller then bg_wait()s it (instant, or with the transport's timeout). */
void bg__emulate_idle(bg__xfer_t *rq);
/* Rebuild *sched (a generated program: its kind, p, m, v) for the emulated
 * per-stage costs, as brigade schedule --f-costs/--b-costs/--w-costs does. */
bg_status_t bg__emulate_regenerate(const bg__emulate_t *em, bg_schedule_t **sched);

#endif
