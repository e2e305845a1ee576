/* tests/partitioner/test_plan_bound.c: the plan search's lower bounds
 * (partitioner/plan_bound.c) against the simulator, and the search that
 * skips layouts by them against the same search keeping every layout:
 *  - bg__plan_step_bound is at most the simulated step of generated
 *    programs (every kind of one model copy, random per-stage costs, links,
 *    reduce and optimizer costs), at least every rank's busy time, and
 *    exact for 1F1B at equal costs and free links ((m + p - 1)(F + B + W));
 *  - bg__plan_bound_exceeds never says "above" for a limit some split
 *    reaches (brute force over every split of a few layers, each simulated),
 *    and says it for a limit below every split's busiest rank;
 *  - bg_plan_search with a short list (top 3: the bounds skip layouts) gives
 *    the first plans and the evaluated count of the search with room for
 *    every layout (top 1000: nothing skipped). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "brigade/partitioner.h"
#include "brigade/schedule.h"
#include "partitioner/plan_impl.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static double urand(void) /* [0, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static int whole(bg_schedule_kind_t k)
{
    return k == BG_SCHED_GPIPE || k == BG_SCHED_1F1B || k == BG_SCHED_INTERLEAVED;
}

static bg_schedule_t *generate(bg_schedule_kind_t kind, int p, int m)
{
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = kind;
    sp.stages = p;
    sp.microbatches = m;
    bg_schedule_t *s = NULL;
    return bg_schedule_generate(&sp, &s) == BG_OK ? s : NULL;
}

static void test_step_bound_vs_simulation(void **state)
{
    (void)state;
    const bg_schedule_kind_t kinds[] = {BG_SCHED_GPIPE, BG_SCHED_1F1B, BG_SCHED_INTERLEAVED,
                                        BG_SCHED_ZB_H1,  BG_SCHED_ZB_H2, BG_SCHED_ZBV};
    int checked = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int p = 2; p <= 4; p++)
            for (int m = 1; m <= 9; m += 2) {
                bg_schedule_t *s = generate(kinds[k], p, m);
                if (!s)
                    continue;
                int S = bg_schedule_stages(s), V = bg_schedule_chunks(s);
                for (int trial = 0; trial < 20; trial++) {
                    double fc[16], bc[16], wc[16];
                    int equal = trial == 0;
                    for (int v = 0; v < S; v++) {
                        fc[v] = equal ? 1 : 0.1 + urand();
                        bc[v] = equal ? 1 : 0.1 + 2 * urand();
                        wc[v] = equal ? 1 : 2 * urand();
                    }
                    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
                    sp.f_costs = fc, sp.b_costs = bc, sp.w_costs = wc;
                    if (!equal) {
                        sp.latency = 0.2 * urand();
                        sp.bandwidth = 1 + 10 * urand();
                        sp.act_bytes = urand(), sp.grad_bytes = urand();
                        sp.reduce_cost = urand(), sp.optimizer_cost = urand();
                    }
                    bg_sim_result_t *r = NULL;
                    assert_int_equal(bg_schedule_simulate(s, &sp, &r), BG_OK);
                    double hop_a = sp.latency + (sp.bandwidth > 0 ? sp.act_bytes / sp.bandwidth : 0);
                    double hop_g = sp.latency + (sp.bandwidth > 0 ? sp.grad_bytes / sp.bandwidth : 0);
                    double lb = bg__plan_step_bound(s, m, fc, bc, wc, whole(kinds[k]), hop_a, hop_g,
                                                    V * (sp.reduce_cost + sp.optimizer_cost));
                    double step = bg_sim_step_time(r);
                    if (lb > step * (1 + 1e-12))
                        fail_msg("%s p=%d m=%d trial %d: bound %.17g above the simulated step %.17g",
                                 bg_schedule_kind_name(kinds[k]), p, m, trial, lb, step);
                    for (int q = 0; q < p; q++) /* at least the busiest rank's work */
                        assert_true(lb >= bg_sim_busy(r, q) * (1 - 1e-12));
                    if (equal && kinds[k] == BG_SCHED_1F1B)
                        assert_true(fabs(lb - 3.0 * (m + p - 1)) < 1e-9 && fabs(step - lb) < 1e-9);
                    bg_sim_result_free(r);
                    checked++;
                }
                bg_schedule_free(s);
            }
    assert_true(checked > 1000);
}

/* The smallest simulated step over every split of L layers into p stages
 * (layer costs f, b, w, speed 1; the backward half and half as the planner
 * does when B and W are not measured apart), and the smallest busiest-rank
 * time (m x the slowest stage's F + B + W). */
static void brute_force(bg_schedule_t *s, int L, int p, int m, const double *f, const double *b, const double *w,
                        double *best_p, double *busiest_p)
{
    double best = INFINITY, busiest = INFINITY;
    for (unsigned mask = 0; mask < 1u << (L - 1); mask++) { /* bit i: a stage ends after layer i */
        if (__builtin_popcount(mask) != p - 1)
            continue;
        double fc[8] = {0}, bc[8] = {0}, wc[8] = {0}, slow = 0;
        for (int i = 0, st = 0; i < L; i++) {
            fc[st] += f[i], bc[st] += b[i], wc[st] += w[i];
            if (mask >> i & 1)
                st++;
        }
        for (int st = 0; st < p; st++)
            if (m * (fc[st] + bc[st] + wc[st]) > slow)
                slow = m * (fc[st] + bc[st] + wc[st]);
        bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
        sp.f_costs = fc, sp.b_costs = bc, sp.w_costs = wc;
        sp.latency = 0.05;
        bg_sim_result_t *r = NULL;
        assert_int_equal(bg_schedule_simulate(s, &sp, &r), BG_OK);
        if (bg_sim_step_time(r) < best)
            best = bg_sim_step_time(r);
        if (slow < busiest)
            busiest = slow;
        bg_sim_result_free(r);
    }
    *best_p = best;
    *busiest_p = busiest;
}

static void test_bound_before_schedule_vs_brute_force(void **state)
{
    (void)state;
    const bg_schedule_kind_t kinds[] = {BG_SCHED_GPIPE, BG_SCHED_1F1B, BG_SCHED_ZB_H1, BG_SCHED_ZB_H2};
    int above = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int p = 2; p <= 4; p++)
            for (int m = 1; m <= 8; m *= 2) {
                bg_schedule_t *s = generate(kinds[k], p, m);
                assert_non_null(s);
                for (int trial = 0; trial < 15; trial++) {
                    int L = p + 1 + (int)(urand() * 5);
                    double f[9], b[9], w[9];
                    for (int i = 0; i < L; i++) {
                        f[i] = 0.1 + urand();
                        b[i] = w[i] = (0.2 + 2 * urand()) / 2;
                    }
                    double best, busiest;
                    brute_force(s, L, p, m, f, b, w, &best, &busiest);
                    /* some split reaches best: never "above" it */
                    if (bg__plan_bound_exceeds(L, f, b, w, whole(kinds[k]), p, m, 1.0, 0.05, best))
                        fail_msg("%s p=%d m=%d L=%d: bound above the best split's step %.17g",
                                 bg_schedule_kind_name(kinds[k]), p, m, L, best);
                    /* no split is faster than its busiest rank */
                    assert_true(bg__plan_bound_exceeds(L, f, b, w, whole(kinds[k]), p, m, 1.0, 0.05, busiest * 0.999));
                    above += bg__plan_bound_exceeds(L, f, b, w, whole(kinds[k]), p, m, 1.0, 0.05,
                                                    busiest + 0.5 * (best - busiest));
                }
                bg_schedule_free(s);
            }
    assert_true(above > 0); /* the pipeline's fill counts: the bound is above the busy time */
}

/* A GPT of 24 blocks on 16 devices: the search keeping 3 plans (layouts
 * skipped by the bounds) against the one keeping every fitting layout. */
static void search_pair(int zero, const char *schedules, int world, const uint64_t *mem, int nmem,
                        const double *speed)
{
    bg_model_config_t mc = BG_MODEL_CONFIG_INIT;
    mc.layers = 24, mc.d_model = 128, mc.heads = 4, mc.seq_len = 64;
    bg_model_desc_t *desc = NULL;
    assert_int_equal(bg_model_build(&mc, &desc), BG_OK);
    bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
    pp.model = desc;
    pp.world = world;
    pp.mem = mem;
    pp.nmem = nmem;
    pp.speed = speed;
    pp.nspeed = speed ? world : 0;
    pp.batch = 64;
    pp.zero = zero;
    pp.schedules = schedules;
    bg_plan_set_t *all = NULL, *few = NULL;
    pp.top = 1000;
    assert_int_equal(bg_plan_search(&pp, &all), BG_OK);
    pp.top = 3;
    assert_int_equal(bg_plan_search(&pp, &few), BG_OK);
    assert_int_equal(bg_plan_set_evaluated(all), bg_plan_set_evaluated(few));
    assert_true(bg_plan_set_count(all) > 3); /* enough layouts fit for the short list to skip some */
    assert_int_equal(bg_plan_set_count(few), 3);
    for (int i = 0; i < 3; i++) {
        const bg_plan_t *a = bg_plan_set_get(all, i), *b = bg_plan_set_get(few, i);
        assert_int_equal(bg_plan_pp(a), bg_plan_pp(b));
        assert_int_equal(bg_plan_dp(a), bg_plan_dp(b));
        assert_int_equal(bg_plan_microbatches(a), bg_plan_microbatches(b));
        assert_int_equal(bg_plan_zero(a), bg_plan_zero(b));
        assert_string_equal(bg_plan_schedule(a), bg_plan_schedule(b));
        assert_true(bg_plan_step_ms(a) == bg_plan_step_ms(b));
    }
    bg_plan_set_free(all);
    bg_plan_set_free(few);
    bg_model_desc_destroy(desc);
}

static void test_search_skips_nothing_it_keeps(void **state)
{
    (void)state;
    uint64_t mem[16], big = 1ull << 30;
    double speed[16];
    for (int i = 0; i < 16; i++) {
        mem[i] = i % 4 < 2 ? big : big / 3;
        speed[i] = i % 4 < 2 ? 1.0 : 0.5;
    }
    search_pair(0, "all", 16, &big, 1, NULL);
    search_pair(1, "1f1b,zb-h1,zbv", 16, &big, 1, NULL);
    search_pair(BG_PLAN_ZERO_AUTO, "all", 16, mem, 16, speed);
    search_pair(0, "gpipe,1f1b,zb-h2,interleaved", 16, mem, 16, speed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_bound_vs_simulation),
        cmocka_unit_test(test_bound_before_schedule_vs_brute_force),
        cmocka_unit_test(test_search_skips_nothing_it_keeps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
