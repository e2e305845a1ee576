/* runtime/emulate.c: emulated compute (brigade train --emulate PROFILE.json).
 * The executor and the transport run for real; each compute instruction of a
 * stage is replaced by a sleep of the stage's profiled duration times a scale
 * factor, so a pipeline of many ranks can run on a few cores with messages of
 * the real sizes (see docs/schedules.md, "Emulated scale"). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "core/check.h"
#include "runtime/emulate.h"

void bg__emulate_free(bg__emulate_t *em)
{
    if (!em)
        return;
    free(em->f), free(em->b), free(em->w);
    free(em);
}

static bg_status_t field(const char *path, json_t *l, int i, const char *key, double *out)
{
    json_t *v = json_object_get(l, key);
    double d = json_is_number(v) ? json_number_value(v) : -1;
    if (!json_is_number(v) || !(d >= 0) || !isfinite(d))
        return bg_error(BG_ERR_INVALID, "%s: layers[%d].%s must be a number >= 0 (write the file with brigade profile "
                        "--json)", path, i, key);
    *out = d;
    return BG_OK;
}

bg_status_t bg__emulate_load(const char *path, double scale, int nlayers, const int *first, const int *last, int S,
                             bg__emulate_t **em_p)
{
    if (!(scale > 0) || !isfinite(scale))
        return bg_error(BG_ERR_INVALID, "emulate: the scale must be a number > 0, got %g", scale);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return bg_error(BG_ERR_INVALID, "emulate: %s: %s (line %d column %d)", path, jerr.text, jerr.line,
                        jerr.column);
    bg_status_t st = BG_OK;
    bg__emulate_t *em = calloc(1, sizeof(*em));
    json_t *layers = json_object_get(root, "layers");
    if (!em || !(em->f = calloc((size_t)S, sizeof(double))) || !(em->b = calloc((size_t)S, sizeof(double))) ||
        !(em->w = calloc((size_t)S, sizeof(double)))) {
        st = bg_error(BG_ERR_NOMEM, "emulate: cost tables");
        goto out;
    }
    em->S = S;
    if (!json_is_array(layers)) {
        st = bg_error(BG_ERR_INVALID, "emulate: %s has no \"layers\" array (write the file with brigade profile --json)",
                      path);
        goto out;
    }
    if ((int)json_array_size(layers) != nlayers) {
        st = bg_error(BG_ERR_INVALID, "emulate: %s profiles %zu layers but the model has %d (profile the same model)",
                      path, json_array_size(layers), nlayers);
        goto out;
    }
    for (int s = 0; s < S && st == BG_OK; s++)
        for (int i = first[s]; i <= last[s] && st == BG_OK; i++) {
            json_t *l = json_array_get(layers, (size_t)i);
            double f = 0, b = 0, w = 0;
            if (!json_is_object(l)) {
                st = bg_error(BG_ERR_INVALID, "emulate: %s: layers[%d] is not an object", path, i);
                break;
            }
            if ((st = field(path, l, i, "fwd_s", &f)) != BG_OK || (st = field(path, l, i, "bwd_input_s", &b)) != BG_OK ||
                (st = field(path, l, i, "bwd_weight_s", &w)) != BG_OK)
                break;
            em->f[s] += f * scale, em->b[s] += b * scale, em->w[s] += w * scale;
        }
out:
    json_decref(root);
    if (st != BG_OK) {
        bg__emulate_free(em);
        return st;
    }
#ifdef PR_SET_TIMERSLACK
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL); /* sleeps end on time, not up to 50 us late */
#endif
    *em_p = em;
    return BG_OK;
}

static void sleep_until(double t)
{
    double dt = t - bg_now();
    if (!(dt > 0))
        return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double ns = (double)now.tv_nsec + dt * 1e9;
    now.tv_sec += (time_t)(ns / 1e9);
    now.tv_nsec = (long)fmod(ns, 1e9);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &now, NULL) == EINTR) {
    }
}

void bg__emulate_wait(bg__emulate_t *em, double seconds)
{
    double t0 = bg_now();
    if (t0 - em->last_end > 1e-4)
        em->late = 0; /* it waited for something: nothing to make up */
    double end = t0 + seconds - em->late; /* the end on the profile's pace */
    sleep_until(end);
    em->last_end = bg_now();
    em->late = em->last_end > end ? em->last_end - end : 0;
}

/* Wait for a request without spinning: test, sleep 20 us, test ... (a rank
 * that spins in a receive takes the core a rank emulating compute needs when
 * its sleep ends). After 10 s the caller's bg_wait takes over, with the
 * transport's timeout and failure detection. */
void bg__emulate_idle(bg__xfer_t *rq)
{
    int done = 0;
    double t0 = bg_now();
    while (rq && bg__xtest(rq, &done) == BG_OK && !done && bg_now() - t0 < 10.0) {
        struct timespec t = {0, 20000};
        nanosleep(&t, NULL);
    }
}

bg_status_t bg__emulate_regenerate(const bg__emulate_t *em, bg_schedule_t **sched)
{
    bg_sim_params_t c = BG_SIM_PARAMS_INIT;
    c.f_costs = em->f, c.b_costs = em->b, c.w_costs = em->w;
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = bg_schedule_kind(*sched);
    sp.stages = bg_schedule_ranks(*sched);
    sp.microbatches = bg_schedule_microbatches(*sched);
    sp.chunks = bg_schedule_chunks(*sched);
    sp.costs = &c;
    bg_schedule_t *s = NULL;
    BG_CHECK(bg_schedule_generate(&sp, &s));
    bg_status_t st = bg_schedule_validate(s);
    if (st != BG_OK) {
        bg_schedule_free(s);
        return st;
    }
    bg_schedule_free(*sched);
    *sched = s;
    return BG_OK;
}
