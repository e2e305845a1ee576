/* tests/schedule/test_orders.c: the generators and the search against the
 * memory-bounded orders of the zero-bubble papers, replayed independently
 * in ref_orders.c: ZB-H1 against ZB-1p at the same stash p, and (under a
 * memory limit) the search against V-Min, V-Half and the V orders between.
 * A generator or search that the published order beats fails here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "brigade/schedule.h"
#include "schedule/ref_orders.h"

static const ref_costs_t grid_costs[] = {{1, 1, 1, 0}, {1, 2, 1, 0}, {2, 3, 2, 0}};

/* step time and largest peak stash of a generated program under the costs */
static double gen_step(bg_schedule_kind_t kind, int p, int m, ref_costs_t c, int *stash_p)
{
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    sp.f_cost = c.f, sp.b_cost = c.b, sp.w_cost = c.w, sp.latency = c.lat;
    bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
    gp.kind = kind, gp.stages = p, gp.microbatches = m, gp.costs = &sp;
    bg_schedule_t *s = NULL;
    if (bg_schedule_generate(&gp, &s) != BG_OK)
        fail_msg("generate %s p=%d m=%d: %s", bg_schedule_kind_name(kind), p, m, bg_last_error());
    bg_sim_result_t *r = NULL;
    if (bg_schedule_simulate(s, &sp, &r) != BG_OK)
        fail_msg("simulate %s p=%d m=%d: %s", bg_schedule_kind_name(kind), p, m, bg_last_error());
    double t = bg_sim_step_time(r);
    *stash_p = 0;
    for (int k = 0; k < p; k++)
        if (bg_sim_peak_stash(r, k) > *stash_p)
            *stash_p = bg_sim_peak_stash(r, k);
    bg_sim_result_free(r);
    bg_schedule_free(s);
    return t;
}

/* ZB-H1 keeps ZB-1p's stash (p microbatches) and is never slower than the
 * paper's heuristic at that stash, with and without a link delay; the
 * paper's figure at p 8, m 8, unit costs, latency 0.5 is 38 */
static void test_zbh1_vs_zb1p(void **state)
{
    (void)state;
    int checked = 0;
    for (int p = 2; p <= 8; p *= 2)
        for (int mm = 1; mm <= 3; mm++)
            for (size_t ci = 0; ci < sizeof grid_costs / sizeof *grid_costs; ci++)
                for (int li = 0; li < 2; li++) {
                    int m = mm * p, stash;
                    ref_costs_t c = grid_costs[ci];
                    c.lat = li * 0.5 * c.f;
                    double ref = ref_zb1p(p, m, c, p), t = gen_step(BG_SCHED_ZB_H1, p, m, c, &stash);
                    if (!(ref < INFINITY))
                        fail_msg("the ZB-1p oracle stalls at p=%d m=%d", p, m);
                    if (stash > p)
                        fail_msg("zb-h1 p=%d m=%d: stash %d over p", p, m, stash);
                    if (t > ref + 1e-9)
                        fail_msg("zb-h1 p=%d m=%d F:b:W=%g:%g:%g latency %g: step %g, ZB-1p %g", p, m, c.f, c.b, c.w,
                                 c.lat, t, ref);
                    checked++;
                }
    assert_int_equal(checked, 54);
    int stash;
    ref_costs_t c = {1, 1, 1, 0.5};
    assert_true(fabs(ref_zb1p(8, 8, c, 8) - 38) < 1e-9); /* the oracle gives the paper's figure */
    double t = gen_step(BG_SCHED_ZB_H1, 8, 8, c, &stash);
    if (t > 38 + 1e-9)
        fail_msg("zb-h1 p=8 m=8 latency 0.5: step %g, ZB-1p 38", t);
}

/* Both bubble metrics: 1F1B's whole-step bubble and its per-stage bubble
 * are both (p-1)/(m+p-1) (rank 0 starts at 0 and ends the step: its span is
 * the step); ZB-H2's per-stage bubble is 0 where its whole-step one is not
 * (m >= 2p: the zero-bubble paper's "zero bubble" is the per-stage figure);
 * and every per-stage bubble is at most its rank's whole-step bubble. */
static void test_bubble_metrics(void **state)
{
    (void)state;
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 16; m++) {
            bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
            for (int kind = BG_SCHED_1F1B; kind <= BG_SCHED_ZB_H2; kind += BG_SCHED_ZB_H2 - BG_SCHED_1F1B) {
                bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
                gp.kind = (bg_schedule_kind_t)kind, gp.stages = p, gp.microbatches = m;
                bg_schedule_t *s = NULL;
                bg_sim_result_t *r = NULL;
                assert_int_equal(bg_schedule_generate(&gp, &s), BG_OK);
                assert_int_equal(bg_schedule_simulate(s, &sp, &r), BG_OK);
                int at = -1;
                double sb = bg_sim_stage_bubble(r, &at), want = (double)(p - 1) / (m + p - 1);
                assert_true(at >= 0 && at < p);
                assert_true(fabs(sb - bg_sim_span_bubble(r, at)) < 1e-12);
                for (int k = 0; k < p; k++)
                    assert_true(bg_sim_span_bubble(r, k) <= sb + 1e-12 && sb <= 1);
                if (kind == BG_SCHED_1F1B && (fabs(sb - want) > 1e-9 || fabs(bg_sim_bubble(r, -1) - want) > 1e-9))
                    fail_msg("1f1b p=%d m=%d: per-stage bubble %g, whole-step %g, want both %g", p, m, sb,
                             bg_sim_bubble(r, -1), want);
                if (kind == BG_SCHED_ZB_H2 && m >= 2 * p && (sb > 1e-12 || (p > 1 && bg_sim_bubble(r, -1) <= 0)))
                    fail_msg("zb-h2 p=%d m=%d: per-stage bubble %g (want 0), whole-step %g (want > 0)", p, m, sb,
                             bg_sim_bubble(r, -1));
                bg_sim_result_free(r);
                bg_schedule_free(s);
            }
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zbh1_vs_zb1p),
        cmocka_unit_test(test_bubble_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
