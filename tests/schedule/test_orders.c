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

/* step time of the search on the V layout under a limit of lim
 * chunk-microbatches per rank (each chunk's stash counted 1); INFINITY when
 * nothing fits. The smallest limit it reports goes to *min_p. */
static double search_v(int p, int m, ref_costs_t c, double lim, double *min_p, char *from, size_t nfrom)
{
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    sp.f_cost = c.f, sp.b_cost = c.b, sp.w_cost = c.w, sp.latency = c.lat, sp.stash_bytes = 1;
    bg_schedule_search_params_t q = BG_SCHEDULE_SEARCH_PARAMS_INIT;
    q.stages = p, q.microbatches = m, q.chunks = 2, q.vshape = 1, q.costs = &sp, q.mem_limit = lim;
    bg_schedule_search_result_t res;
    bg_schedule_t *s = NULL;
    bg_status_t st = bg_schedule_search(&q, &res, &s);
    if (min_p)
        *min_p = res.min_limit;
    if (st == BG_ERR_NOT_FOUND)
        return INFINITY;
    if (st != BG_OK)
        fail_msg("search p=%d m=%d limit %g: %s", p, m, lim, bg_last_error());
    if (from)
        snprintf(from, nfrom, "%s", res.from);
    if (res.peak > lim + 1e-9)
        fail_msg("search p=%d m=%d: peak %g over the limit %g", p, m, res.peak, lim);
    bg_schedule_free(s);
    return res.step;
}

/* Under 0.5x and 0.75x of 1F1B's peak (p stage-microbatches = 2p V
 * chunk-microbatches) the search on the V layout is never beaten by a V
 * order of the controllable-memory paper that fits the limit: V-Min,
 * V-Half and every cap between */
static void test_search_vs_v_orders(void **state)
{
    (void)state;
    int checked = 0;
    for (int p = 4; p <= 8; p *= 2)
        for (int m = 2 * p; m <= 32; m *= 2)
            for (size_t ci = 0; ci < sizeof grid_costs / sizeof *grid_costs; ci++)
                for (int fi = 0; fi < 2; fi++)
                    for (int li = 0; li < 2; li++) {
                        ref_costs_t c = grid_costs[ci];
                        c.lat = li * 0.5 * c.f;
                        double lim = (fi ? 0.75 : 0.5) * 2 * p;
                        char from[128] = "";
                        double t = search_v(p, m, c, lim, NULL, from, sizeof from);
                        for (int cap = ref_vmin_cap(p); cap <= (int)lim; cap++) {
                            double ref = ref_vcap(p, m, c, cap);
                            if (t > ref + 1e-9)
                                fail_msg("search p=%d m=%d F:b:W=%g:%g:%g latency %g limit %g: %g (%s), the V order "
                                         "capped at %d: %g", p, m, c.f, c.b, c.w, c.lat, lim, t, from, cap, ref);
                            checked++;
                        }
                    }
    assert_true(checked >= 48);
}

/* The controllable-memory paper's V-Min and V-Half (their published
 * patterns, replayed in ref_orders.c): at V-Min's own peak, and at 0.5x of
 * 1F1B's (p chunk-microbatches) where V-Min fits, the search is never
 * slower than V-Min; at V-Half's peak never slower than V-Half. */
static void test_search_vs_v_patterns(void **state)
{
    (void)state;
    int checked = 0;
    for (int p = 3; p <= 8; p++)
        for (int m = 2 * p; m <= 32; m += m < 16 ? p : 16)
            for (size_t ci = 0; ci < sizeof grid_costs / sizeof *grid_costs; ci++)
                for (int li = 0; li < 2; li++)
                    for (int half = 0; half <= 1; half++) {
                        ref_costs_t c = grid_costs[ci];
                        c.lat = li * 0.5 * c.f;
                        int peak;
                        double ref = ref_vpattern(p, m, c, half, &peak);
                        for (int at = 0; at <= !half; at++) {
                            double lim = at ? p : peak;
                            if (lim < peak)
                                continue;
                            char from[128] = "";
                            double t = search_v(p, m, c, lim, NULL, from, sizeof from);
                            if (t > ref + 1e-9)
                                fail_msg("search p=%d m=%d F:b:W=%g:%g:%g latency %g limit %g: %g (%s), %s "
                                         "(peak %d): %g", p, m, c.f, c.b, c.w, c.lat, lim, t, from,
                                         half ? "V-Half" : "V-Min", peak, ref);
                            checked++;
                        }
                    }
    assert_true(checked >= 100);
}

/* The smallest limit the search states is exact: a microbatch's stash on
 * all of a rank's chunks (its last forward there comes before its first
 * backward), the largest over ranks; the search finds a program at that
 * limit and none below it. Stash bytes differ per stage. */
static void test_smallest_limit(void **state)
{
    (void)state;
    for (int p = 2; p <= 6; p += 2)
        for (int vs = 0; vs < 3; vs++) { /* one stage per rank, interleaved v = 2, V */
            int v = vs ? 2 : 1, S = p * v;
            double sb[12];
            for (int i = 0; i < S; i++)
                sb[i] = 1 + (i * 7 % 5) * 0.25;
            double need = 0;
            for (int r = 0; r < p; r++) {
                double all = 0;
                for (int i = 0; i < S; i++) /* the stages of rank r in each layout */
                    if ((vs == 0 && i == r) || (vs == 1 && i % p == r) || (vs == 2 && (i == r || i == 2 * p - 1 - r)))
                        all += sb[i];
                need = all > need ? all : need;
            }
            bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
            sp.stash_bytes_per_stage = sb;
            bg_schedule_search_params_t q = BG_SCHEDULE_SEARCH_PARAMS_INIT;
            q.stages = p, q.microbatches = 2 * p, q.chunks = v, q.vshape = vs == 2, q.costs = &sp;
            bg_schedule_search_result_t res;
            bg_schedule_t *s = NULL;
            q.mem_limit = need * 0.999;
            assert_int_equal(bg_schedule_search(&q, &res, &s), BG_ERR_NOT_FOUND);
            if (fabs(res.min_limit - need) > 1e-9)
                fail_msg("p=%d layout %d: smallest limit %g, want %g", p, vs, res.min_limit, need);
            q.mem_limit = need;
            if (bg_schedule_search(&q, &res, &s) != BG_OK)
                fail_msg("p=%d layout %d: nothing at the smallest limit %g: %s", p, vs, need, bg_last_error());
            assert_true(res.peak <= need * (1 + 1e-12));
            bg_schedule_free(s);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zbh1_vs_zb1p),
        cmocka_unit_test(test_bubble_metrics),
        cmocka_unit_test(test_search_vs_v_orders),
        cmocka_unit_test(test_search_vs_v_patterns),
        cmocka_unit_test(test_smallest_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
