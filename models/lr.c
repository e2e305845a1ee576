/* models/lr.c: learning-rate schedules (include/brigade/lr.h): the rate of
 * a step as a closed form of the step alone. It must not keep state: a
 * resumed run gets its rates from the step count, nothing else. */
#include <math.h>
#include <string.h>

#include "brigade/lr.h"

static const char *const kind_names[] = {"constant", "cosine", "linear", "wsd"};

const char *bg_lr_kind_name(bg_lr_kind_t kind)
{
    return (unsigned)kind < sizeof kind_names / sizeof *kind_names ? kind_names[kind] : "?";
}

bg_status_t bg_lr_kind_parse(const char *name, bg_lr_kind_t *kind_p)
{
    for (unsigned k = 0; name && k < sizeof kind_names / sizeof *kind_names; k++)
        if (strcmp(name, kind_names[k]) == 0) {
            *kind_p = (bg_lr_kind_t)k;
            return BG_OK;
        }
    return bg_error(BG_ERR_INVALID, "--lr-schedule \"%s\": expected constant, cosine, linear or wsd",
                    name ? name : "(null)");
}

bg_status_t bg_lr_check(const bg_lr_schedule_t *s)
{
    if (!s || s->size < sizeof(bg_lr_schedule_t))
        return bg_error(BG_ERR_INVALID, "learning-rate schedule: size %zu, expected %zu (BG_LR_SCHEDULE_INIT)",
                        s ? s->size : 0, sizeof(bg_lr_schedule_t));
    if ((unsigned)s->kind > BG_LR_WSD)
        return bg_error(BG_ERR_INVALID, "learning-rate schedule: unknown kind %d", (int)s->kind);
    if (!(s->lr > 0) || !isfinite(s->lr))
        return bg_error(BG_ERR_INVALID, "--lr must be > 0 (got %g)", s->lr);
    if (!(s->min_lr >= 0) || s->min_lr > s->lr)
        return bg_error(BG_ERR_INVALID, "--min-lr %g must be in [0, --lr %g]", s->min_lr, s->lr);
    if (s->warmup < 0 || s->decay_steps < 0)
        return bg_error(BG_ERR_INVALID, "--warmup %lld and --decay-steps %lld must be >= 0", (long long)s->warmup,
                        (long long)s->decay_steps);
    if (s->kind != BG_LR_CONSTANT && s->decay_steps <= s->warmup)
        return bg_error(BG_ERR_INVALID, "--lr-schedule %s: --decay-steps %lld must be greater than --warmup %lld",
                        bg_lr_kind_name(s->kind), (long long)s->decay_steps, (long long)s->warmup);
    if (s->kind == BG_LR_WSD && !(s->wsd_decay > 0 && s->wsd_decay <= 1))
        return bg_error(BG_ERR_INVALID, "--wsd-decay %g must be in (0, 1]", s->wsd_decay);
    return BG_OK;
}

double bg_lr_at(const bg_lr_schedule_t *s, int64_t step)
{
    double P = s->lr, m = s->min_lr;
    int64_t W = s->warmup, D = s->decay_steps;
    if (step < 0)
        step = 0;
    if (step < W)
        return P * (double)(step + 1) / (double)W;
    if (s->kind == BG_LR_CONSTANT)
        return P;
    if (s->kind == BG_LR_WSD) {
        int64_t n = D - W;
        int64_t len = (int64_t)ceil(s->wsd_decay * (double)n - 1e-9); /* 0.2 * 10 is 2, not 3 */
        len = len < 1 ? 1 : len > n ? n : len;
        int64_t e = D - len;
        if (step < e)
            return P;
        double q = (double)(step - e + 1) / (double)len;
        return P - (P - m) * (q < 1 ? q : 1);
    }
    double q = (double)(step - W) / (double)(D - W);
    if (q > 1)
        q = 1;
    if (s->kind == BG_LR_COSINE)
        return m + (P - m) * 0.5 * (1.0 + cos(M_PI * q));
    return P - (P - m) * q;
}
