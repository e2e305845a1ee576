/* tests/models/test_lr.c: the learning-rate schedules (models/lr.c) against
 * their closed forms written out here at every step, hand-computed values at
 * the corners (end of warm-up, midpoint, the wsd knee, after decay_steps),
 * and the checks' messages. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "brigade/lr.h"

static bg_lr_schedule_t sched(bg_lr_kind_t k, double lr, double min_lr, int64_t w, int64_t d)
{
    bg_lr_schedule_t s = BG_LR_SCHEDULE_INIT;
    s.kind = k, s.lr = lr, s.min_lr = min_lr, s.warmup = w, s.decay_steps = d;
    return s;
}

/* The closed forms of lr.h, written independently of models/lr.c. */
static double closed(const bg_lr_schedule_t *s, int64_t t)
{
    double P = s->lr, m = s->min_lr, W = (double)s->warmup, D = (double)s->decay_steps;
    if (t < s->warmup)
        return P * (t + 1) / W;
    double q = fmin(1.0, (t - W) / (D - W));
    switch (s->kind) {
    case BG_LR_CONSTANT: return P;
    case BG_LR_COSINE: return m + (P - m) * (1 + cos(3.14159265358979323846 * q)) / 2;
    case BG_LR_LINEAR: return P - (P - m) * q;
    case BG_LR_WSD: {
        double len = ceil(s->wsd_decay * (D - W) - 1e-9), e = D - len;
        return t < e ? P : P - (P - m) * fmin(1.0, (t - e + 1) / len);
    }
    }
    return NAN;
}

static void every_step(void **state)
{
    (void)state;
    bg_lr_kind_t kinds[] = {BG_LR_CONSTANT, BG_LR_COSINE, BG_LR_LINEAR, BG_LR_WSD};
    int64_t warm[] = {0, 1, 5, 37};
    for (int k = 0; k < 4; k++)
        for (int w = 0; w < 4; w++) {
            bg_lr_schedule_t s = sched(kinds[k], 3e-3, 3e-4, warm[w], 200);
            s.wsd_decay = 0.3;
            assert_int_equal(bg_lr_check(&s), BG_OK);
            for (int64_t t = 0; t < 260; t++) {
                double a = bg_lr_at(&s, t), b = closed(&s, t);
                if (fabs(a - b) > 1e-15 * b)
                    fail_msg("%s warmup %lld step %lld: %.17g, closed form %.17g", bg_lr_kind_name(kinds[k]),
                             (long long)warm[w], (long long)t, a, b);
            }
        }
}

static void near(double a, double b)
{
    if (!(fabs(a - b) <= 1e-15))
        fail_msg("%.17g, expected %.17g", a, b);
}

static void corners(void **state)
{
    (void)state;
    bg_lr_schedule_t c = sched(BG_LR_CONSTANT, 1, 0.1, 2, 10);
    assert_true(bg_lr_at(&c, 0) == 0.5 && bg_lr_at(&c, 1) == 1 && bg_lr_at(&c, 1000) == 1);
    bg_lr_schedule_t l = sched(BG_LR_LINEAR, 1, 0.1, 2, 10);
    assert_true(bg_lr_at(&l, 1) == 1 && bg_lr_at(&l, 2) == 1);
    near(bg_lr_at(&l, 6), 0.55);
    near(bg_lr_at(&l, 10), 0.1);
    near(bg_lr_at(&l, 50), 0.1);
    bg_lr_schedule_t cs = sched(BG_LR_COSINE, 1, 0.1, 2, 10);
    assert_true(bg_lr_at(&cs, 2) == 1);
    near(bg_lr_at(&cs, 6), 0.55); /* cos(pi/2) = 0: halfway */
    near(bg_lr_at(&cs, 10), 0.1);
    near(bg_lr_at(&cs, 11), 0.1);
    /* wsd: 10 steps after a 2-step warm-up, 20% decaying: steps 2..9 at 1, 10 halfway, 11 at min */
    bg_lr_schedule_t w = sched(BG_LR_WSD, 1, 0.1, 2, 12);
    w.wsd_decay = 0.2;
    assert_true(bg_lr_at(&w, 0) == 0.5 && bg_lr_at(&w, 2) == 1 && bg_lr_at(&w, 9) == 1);
    near(bg_lr_at(&w, 10), 0.55);
    near(bg_lr_at(&w, 11), 0.1);
    near(bg_lr_at(&w, 30), 0.1);
}

static void checks(void **state)
{
    (void)state;
    bg_lr_kind_t k;
    assert_int_equal(bg_lr_kind_parse("wsd", &k), BG_OK);
    assert_int_equal(k, BG_LR_WSD);
    assert_int_equal(bg_lr_kind_parse("step", &k), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "constant, cosine, linear or wsd"));
    bg_lr_schedule_t s = sched(BG_LR_COSINE, 1e-3, 0, 10, 10);
    assert_int_equal(bg_lr_check(&s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "--decay-steps"));
    s = sched(BG_LR_LINEAR, 1e-3, 2e-3, 0, 10);
    assert_int_equal(bg_lr_check(&s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "--min-lr"));
    s = sched(BG_LR_WSD, 1e-3, 0, 0, 10);
    s.wsd_decay = 0;
    assert_int_equal(bg_lr_check(&s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "--wsd-decay"));
    s = sched(BG_LR_CONSTANT, 1e-3, 0, 5, 0); /* constant needs no decay_steps */
    assert_int_equal(bg_lr_check(&s), BG_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(every_step), cmocka_unit_test(corners),
                                       cmocka_unit_test(checks)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
