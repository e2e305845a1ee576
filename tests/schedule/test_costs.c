/* tests/schedule/test_costs.c: generators built for the costs they are given,
 * over a grid of F:B:W ratios (1:1:1, 1:2:1, 1:1.5:0.5, 2:2:1)
 * and uneven per-stage costs. References: torch.distributed.pipelining's
 * ZB-V step times at F=1, B=2, W=1 (134 at p=4 m=16, 270 at p=8 m=32), the
 * closed-form bound v m (F+B+W) + (p-1)(F + max(B-W, 0)) for ZB-V and the
 * interleaved zero-bubble schedule (equal to the lower bound v m (F+B+W) +
 * (p-1)F at unit costs, so exact there), each family's stash bound, and the same
 * generator built for unit costs (a program built for the costs must never
 * simulate slower under them). */
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

static const double ratios[4][3] = {{1, 1, 1}, {1, 2, 1}, {1, 1.5, 0.5}, {2, 2, 1}};

static bg_schedule_t *gen(bg_schedule_kind_t kind, int p, int m, int v, const bg_sim_params_t *costs)
{
    bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
    gp.kind = kind, gp.stages = p, gp.microbatches = m, gp.chunks = v, gp.costs = costs;
    bg_schedule_t *s = NULL;
    if (bg_schedule_generate(&gp, &s) != BG_OK)
        fail_msg("generate %s p=%d m=%d v=%d: %s", bg_schedule_kind_name(kind), p, m, v, bg_last_error());
    if (bg_schedule_validate(s) != BG_OK)
        fail_msg("%s p=%d m=%d v=%d does not validate: %s", bg_schedule_kind_name(kind), p, m, v, bg_last_error());
    return s;
}

/* step time, largest peak stash (chunk-microbatches) and largest peak stash bytes of s under costs */
static double sim_all(const bg_schedule_t *s, const bg_sim_params_t *sp, int *stash_p, double *bytes_p)
{
    bg_sim_result_t *r = NULL;
    if (bg_schedule_simulate(s, sp, &r) != BG_OK)
        fail_msg("simulate %s: %s", bg_schedule_name(s), bg_last_error());
    double t = bg_sim_step_time(r), bytes = 0;
    int peak = 0;
    for (int k = 0; k < bg_schedule_ranks(s); k++) {
        peak = bg_sim_peak_stash(r, k) > peak ? bg_sim_peak_stash(r, k) : peak;
        bytes = bg_sim_peak_stash_bytes(r, k) > bytes ? bg_sim_peak_stash_bytes(r, k) : bytes;
    }
    *stash_p = peak;
    *bytes_p = bytes;
    bg_sim_result_free(r);
    return t;
}

static double sim(const bg_schedule_t *s, const bg_sim_params_t *sp, int *stash_p)
{
    double bytes;
    return sim_all(s, sp, stash_p, &bytes);
}

/* the family's stash bound on rank r (docs/schedules.md §4) */
static int bound(bg_schedule_kind_t k, int p, int m, int v, int r)
{
    int big = v * m;
    switch (k) {
    case BG_SCHED_GPIPE: return m;
    case BG_SCHED_1F1B: return p - r < m ? p - r : m;
    case BG_SCHED_INTERLEAVED: return 2 * (p - r - 1) + (v - 1) * p + 1 < big ? 2 * (p - r - 1) + (v - 1) * p + 1 : big;
    case BG_SCHED_ZB_H1: return p < m ? p : m;
    case BG_SCHED_ZB_H2: return 2 * p - 1 < m ? 2 * p - 1 : m;
    case BG_SCHED_ZBV: return 2 * p < big ? 2 * p : big;
    case BG_SCHED_DUALPIPEV: return 2 * p + 1; /* DualPipe's published PP + 1, PP = 2p virtual stages */
    case BG_SCHED_DUALPIPE: return p + 1;      /* DualPipe's published PP + 1, PP = p */
    default: return v * p < big ? v * p : big;
    }
}

/* the generator applies to p ranks and m microbatches */
static int applies(int k, int p, int m)
{
    if (k == BG_SCHED_DUALPIPEV)
        return m >= 2 * p;
    if (k == BG_SCHED_DUALPIPE)
        return p % 2 == 0 && m % 2 == 0 && m >= 2 * p;
    return 1;
}

static void test_zbv_torch_anchors(void **state)
{
    (void)state;
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    sp.f_cost = 1, sp.b_cost = 2, sp.w_cost = 1;
    static const int cases[2][3] = {{4, 16, 134}, {8, 32, 270}};
    for (int i = 0; i < 2; i++) {
        int p = cases[i][0], m = cases[i][1], stash;
        bg_schedule_t *s = gen(BG_SCHED_ZBV, p, m, 0, &sp);
        double t = sim(s, &sp, &stash);
        if (t > cases[i][2] || stash > 2 * p)
            fail_msg("zbv p=%d m=%d at F=1 B=2 W=1: step %g stash %d, torch's ZB-V: %d with 2p = %d", p, m, t, stash,
                     cases[i][2], 2 * p);
        bg_schedule_free(s);
    }
}

static void test_cost_grid(void **state)
{
    (void)state;
    int checked = 0;
    for (int c = 0; c < 4; c++) {
        bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
        sp.f_cost = ratios[c][0], sp.b_cost = ratios[c][1], sp.w_cost = ratios[c][2];
        double F = sp.f_cost, B = sp.b_cost, W = sp.w_cost;
        for (int p = 1; p <= 8; p++)
            for (int m = p; m <= 4 * p; m += p)
                for (int k = 0; k < BG_SCHED_CUSTOM; k++)
                    for (int v = 2; v <= (k == BG_SCHED_INTERLEAVED || k == BG_SCHED_ZB_INTERLEAVED ? 4 : 2); v++) {
                        int vv = k == BG_SCHED_INTERLEAVED || k == BG_SCHED_ZB_INTERLEAVED ? v : 0, st_c, st_u;
                        if (!applies(k, p, m))
                            continue; /* dualpipev: m >= 2p; dualpipe: p, m even, m >= 2p */
                        bg_schedule_t *sc = gen((bg_schedule_kind_t)k, p, m, vv, &sp);
                        bg_schedule_t *su = gen((bg_schedule_kind_t)k, p, m, vv, NULL);
                        int nv = bg_schedule_chunks(sc), cp = bg_schedule_copies(sc);
                        double tc = sim(sc, &sp, &st_c), tu = sim(su, &sp, &st_u);
                        const char *name = bg_schedule_kind_name((bg_schedule_kind_t)k);
                        if (tc > tu + 1e-9)
                            fail_msg("%s p=%d m=%d v=%d F:B:W=%g:%g:%g: built for the costs %g, slower than built "
                                     "for unit costs %g", name, p, m, nv, F, B, W, tc, tu);
                        bg_sim_result_t *r;
                        assert_int_equal(bg_schedule_simulate(sc, &sp, &r), BG_OK);
                        for (int rk = 0; rk < p; rk++)
                            if (bg_sim_peak_stash(r, rk) > bound((bg_schedule_kind_t)k, p, m, nv, rk))
                                fail_msg("%s p=%d m=%d v=%d F:B:W=%g:%g:%g rank %d: stash %d > the family's %d", name,
                                         p, m, nv, F, B, W, rk, bg_sim_peak_stash(r, rk),
                                         bound((bg_schedule_kind_t)k, p, m, nv, rk));
                        bg_sim_result_free(r);
                        /* lower bound: the last rank waits (p-1)F for its first input, then works v m (F+B+W);
                         * with two copies fed from both ends, a middle rank waits (p/2-1)F and each chunk
                         * sees m/2 microbatches */
                        double low = nv * m / cp * (F + B + W) + (cp == 2 ? p / 2 - 1 : p - 1) * F;
                        if (tc < low - 1e-9)
                            fail_msg("%s p=%d m=%d v=%d F:B:W=%g:%g:%g: step %g below the lower bound %g", name, p, m,
                                     nv, F, B, W, tc, low);
                        int zb = k == BG_SCHED_ZBV || k == BG_SCHED_ZB_INTERLEAVED;
                        if (zb && m >= (k == BG_SCHED_ZBV ? 2 * p : p)) {
                            double want = nv * m * (F + B + W) + (p - 1) * (F + (B > W ? B - W : 0));
                            if (tc > want + 1e-9)
                                fail_msg("%s p=%d m=%d v=%d F:B:W=%g:%g:%g: step %g > v m (F+B+W) + (p-1)(F + "
                                         "max(B-W, 0)) = %g", name, p, m, nv, F, B, W, tc, want);
                        }
                        checked++;
                        bg_schedule_free(sc), bg_schedule_free(su);
                    }
    }
    assert_true(checked > 1000);
}

/* uneven per-stage costs and a slow link: still valid, within the stash
 * bound, and never slower than the program built for unit costs */
static void test_uneven_costs(void **state)
{
    (void)state;
    unsigned seed = 17;
    for (int trial = 0; trial < 60; trial++) {
        int p = 2 + trial % 6, m = p * (1 + trial % 3) + trial % 2;
        for (int k = 0; k < BG_SCHED_CUSTOM; k++) {
            if (!applies(k, p, m))
                continue; /* dualpipev: m >= 2p; dualpipe: p, m even, m >= 2p */
            int v = k == BG_SCHED_INTERLEAVED || k == BG_SCHED_ZB_INTERLEAVED || k == BG_SCHED_ZBV ||
                            k == BG_SCHED_DUALPIPEV || k == BG_SCHED_DUALPIPE ? 2 : 1;
            int S = p * v;
            double f[16], b[16], w[16];
            for (int i = 0; i < S; i++) {
                seed = seed * 1103515245u + 12345u;
                f[i] = 0.5 + (seed >> 16) % 100 / 50.0;
                b[i] = f[i] * (1 + (seed >> 8) % 3 * 0.5);
                w[i] = f[i] * (0.5 + (seed >> 4) % 2 * 0.5);
            }
            bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
            sp.f_costs = f, sp.b_costs = b, sp.w_costs = w;
            sp.latency = trial % 3 == 0 ? 0.3 : 0;
            int st_c, st_u;
            bg_schedule_t *sc = gen((bg_schedule_kind_t)k, p, m, 0, &sp), *su = gen((bg_schedule_kind_t)k, p, m, 0, NULL);
            double tc = sim(sc, &sp, &st_c), tu = sim(su, &sp, &st_u);
            int nv = bg_schedule_chunks(sc), lim = 0;
            for (int rk = 0; rk < p; rk++)
                if (bound((bg_schedule_kind_t)k, p, m, nv, rk) > lim)
                    lim = bound((bg_schedule_kind_t)k, p, m, nv, rk);
            if (tc > tu + 1e-9 || st_c > lim)
                fail_msg("%s p=%d m=%d trial %d: built for the costs %g (stash %d), for unit costs %g (bound %d)",
                         bg_schedule_kind_name((bg_schedule_kind_t)k), p, m, trial, tc, st_c, tu, lim);
            bg_schedule_free(sc), bg_schedule_free(su);
        }
    }
}

/* the largest peak stash in bytes (as sp counts them) over ranks */
static double peak_bytes(const bg_schedule_t *s, const bg_sim_params_t *sp)
{
    double bytes;
    int stash;
    sim_all(s, sp, &stash, &bytes);
    return bytes;
}

/* the search under a limit against every fixed generator of the same layout
 * at the same limit: never slower, always valid, within the limit, not below
 * its own lower bound; when nothing fits, no generator fits either and the
 * smallest limit it reports does work */
static void test_search_vs_generators(void **state)
{
    (void)state;
    unsigned seed = 5;
    int checked = 0;
    for (int trial = 0; trial < 24; trial++) {
        int p = 2 + trial % 4, m = trial % 3 == 0 ? p : trial % 3 == 1 ? 2 * p : 3 * p + 1;
        for (int layout = 0; layout < 3; layout++) { /* one stage per rank, V, interleaved v = 2 */
            int v = layout == 0 ? 1 : 2, S = p * v;
            double f[16], b[16], w[16], sb[16];
            const double *ra = ratios[trial % 4];
            for (int i = 0; i < S; i++) {
                seed = seed * 1103515245u + 12345u;
                double scale = trial % 2 ? 0.5 + (seed >> 16) % 100 / 50.0 : 1; /* uneven on odd trials */
                f[i] = ra[0] * scale, b[i] = ra[1] * scale, w[i] = ra[2] * scale;
                sb[i] = 1000 + (trial % 2 ? (seed >> 8) % 1000 : 0);
            }
            bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
            sp.f_costs = f, sp.b_costs = b, sp.w_costs = w, sp.stash_bytes_per_stage = sb;
            static const bg_schedule_kind_t one[] = {BG_SCHED_GPIPE, BG_SCHED_1F1B, BG_SCHED_ZB_H1, BG_SCHED_ZB_H2};
            static const bg_schedule_kind_t vee[] = {BG_SCHED_ZBV};
            static const bg_schedule_kind_t inter[] = {BG_SCHED_INTERLEAVED, BG_SCHED_ZB_INTERLEAVED};
            const bg_schedule_kind_t *kinds = layout == 0 ? one : layout == 1 ? vee : inter;
            int nk = layout == 0 ? 4 : layout == 1 ? 1 : 2;
            double gstep[4], gpeak[4];
            for (int k = 0; k < nk; k++) {
                int st;
                bg_schedule_t *g = gen(kinds[k], p, m, v, &sp);
                gstep[k] = sim(g, &sp, &st);
                gpeak[k] = peak_bytes(g, &sp);
                bg_schedule_free(g);
            }
            /* limits: each generator's peak, half the smallest, and none */
            for (int l = 0; l <= nk + 1; l++) {
                double lim = l < nk ? gpeak[l] : l == nk ? gpeak[0] / 2 : 0;
                for (int k = 0; k < nk; k++)
                    lim = l == nk && gpeak[k] / 2 < lim ? gpeak[k] / 2 : lim;
                bg_schedule_search_params_t q = BG_SCHEDULE_SEARCH_PARAMS_INIT;
                q.stages = p, q.microbatches = m, q.chunks = v, q.vshape = layout == 1, q.costs = &sp, q.mem_limit = lim;
                bg_schedule_search_result_t res;
                bg_schedule_t *s = NULL;
                bg_status_t st = bg_schedule_search(&q, &res, &s);
                double best_fixed = INFINITY, min_fixed = INFINITY;
                for (int k = 0; k < nk; k++) {
                    if (lim == 0 || gpeak[k] <= lim)
                        best_fixed = gstep[k] < best_fixed ? gstep[k] : best_fixed;
                    min_fixed = gpeak[k] < min_fixed ? gpeak[k] : min_fixed;
                }
                if (st == BG_ERR_NOT_FOUND) {
                    if (best_fixed < INFINITY)
                        fail_msg("search p=%d m=%d layout %d limit %g: nothing found, but a generator fits", p, m,
                                 layout, lim);
                    if (!(res.min_limit <= min_fixed))
                        fail_msg("search p=%d m=%d layout %d: smallest limit %g > a generator's peak %g", p, m, layout,
                                 res.min_limit, min_fixed);
                    q.mem_limit = res.min_limit;
                    assert_int_equal(bg_schedule_search(&q, &res, &s), BG_OK); /* the smallest limit works */
                }
                assert_int_equal(bg_schedule_validate(s), BG_OK);
                int stash;
                double t = sim(s, &sp, &stash), pk = peak_bytes(s, &sp);
                if (t > best_fixed + 1e-9 || (q.mem_limit > 0 && pk > q.mem_limit * (1 + 1e-12)) ||
                    t < res.lower_bound - 1e-9 || fabs(t - res.step) > 1e-9 * (1 + t))
                    fail_msg("search p=%d m=%d layout %d limit %g: step %g (reported %g, lower bound %g) peak %g, "
                             "best fixed generator within the limit %g", p, m, layout, q.mem_limit, t, res.step,
                             res.lower_bound, pk, best_fixed);
                bg_schedule_free(s);
                checked++;
            }
        }
    }
    assert_true(checked > 100);
}

/* the search within a zero-bubble generator's own stash bound (in chunk
 * units, the same on every rank for these families) finds nothing faster
 * than the generator: the generators are not beaten by their own family */
static void test_generators_not_beaten_in_family(void **state)
{
    (void)state;
    static const bg_schedule_kind_t kinds[] = {BG_SCHED_ZB_H1, BG_SCHED_ZB_H2, BG_SCHED_ZBV, BG_SCHED_ZB_INTERLEAVED};
    int checked = 0;
    for (int c = 0; c < 4; c++) {
        bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
        sp.f_cost = ratios[c][0], sp.b_cost = ratios[c][1], sp.w_cost = ratios[c][2];
        for (int p = 2; p <= 6; p++)
            for (int m = p; m <= 3 * p; m += p)
                for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
                    int st;
                    bg_schedule_t *g = gen(kinds[k], p, m, 0, &sp);
                    int v = bg_schedule_chunks(g);
                    double tg = sim(g, &sp, &st);
                    bg_schedule_search_params_t q = BG_SCHEDULE_SEARCH_PARAMS_INIT;
                    q.stages = p, q.microbatches = m, q.chunks = v, q.vshape = kinds[k] == BG_SCHED_ZBV, q.costs = &sp;
                    q.mem_limit = bound(kinds[k], p, m, v, 0); /* the same on every rank for these families */
                    bg_schedule_search_result_t res;
                    bg_schedule_t *s = NULL;
                    assert_int_equal(bg_schedule_search(&q, &res, &s), BG_OK);
                    if (res.step < tg - 1e-9)
                        fail_msg("%s p=%d m=%d F:B:W=%g:%g:%g: the search finds %g (%s) within the family's stash "
                                 "bound %g, the generator %g", bg_schedule_kind_name(kinds[k]), p, m, sp.f_cost,
                                 sp.b_cost, sp.w_cost, res.step, res.from, q.mem_limit, tg);
                    bg_schedule_free(s), bg_schedule_free(g);
                    checked++;
                }
    }
    assert_true(checked >= 100);
}

/* DualPipeV against the closed forms published with DualPipe (DeepSeek-V3;
 * the DualPipe repository's table): bubble (PP/2 - 1)(F&B + B - 3W) per rank
 * and activation PP + 1, with PP = 2p virtual stages, F, B (full backward =
 * b + W) and W per chunk, and F&B the paired forward and backward, which one
 * device runs one after the other: F&B = F + B. The published bubble has the
 * pair start once both inputs are there; brigade starts the pair's forward
 * as soon as its own input is there (only the backward waits for its
 * gradient, as torch's DualPipeV does), which takes F off every one of the
 * PP/2 - 1 waits: idle (PP/2 - 1)(F&B + B - 3W - F), never above the
 * published bubble. The derivation takes F = b (a forward chunk as long as a
 * backward-input chunk), where it is exact; for the other ratios the idle is
 * at most the published bubble and the stash is still exact. */
static void test_dualpipev_closed_forms(void **state)
{
    (void)state;
    static const double fb[][3] = {{1, 1, 1}, {2, 2, 1}, {1, 1, 0.5}, {2, 2, 2}, {1.5, 1.5, 0.25}, /* F = b */
                                   {1, 2, 1}, {1, 1.5, 0.5}};
    int checked = 0;
    for (size_t c = 0; c < sizeof fb / sizeof *fb; c++) {
        bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
        double F = fb[c][0], b = fb[c][1], W = fb[c][2], B = b + W;
        sp.f_cost = F, sp.b_cost = b, sp.w_cost = W;
        for (int p = 1; p <= 8; p++)
            for (int m = 2 * p; m <= 4 * p + 1; m += p > 1 ? p - 1 : 1) {
                bg_schedule_t *s = gen(BG_SCHED_DUALPIPEV, p, m, 0, &sp);
                bg_sim_result_t *r;
                assert_int_equal(bg_schedule_simulate(s, &sp, &r), BG_OK);
                int PP = 2 * p;
                double published = (PP / 2 - 1) * ((F + B) + B - 3 * W), bubble = published - (PP / 2 - 1) * F;
                for (int k = 0; k < p; k++) {
                    if (bg_sim_peak_stash(r, k) != 2 * p + 1)
                        fail_msg("dualpipev p=%d m=%d F:b:W=%g:%g:%g rank %d: stash %d, want PP + 1 = %d", p, m, F, b,
                                 W, k, bg_sim_peak_stash(r, k), 2 * p + 1);
                    if (F == b && fabs(bg_sim_idle(r, k) - bubble) > 1e-9)
                        fail_msg("dualpipev p=%d m=%d F:b:W=%g:%g:%g rank %d: idle %g, want (PP/2-1)(F&B+B-3W-F) = %g",
                                 p, m, F, b, W, k, bg_sim_idle(r, k), bubble);
                    if (bg_sim_idle(r, k) > published + 1e-9)
                        fail_msg("dualpipev p=%d m=%d F:b:W=%g:%g:%g rank %d: idle %g, over the published bubble %g",
                                 p, m, F, b, W, k, bg_sim_idle(r, k), published);
                }
                bg_sim_result_free(r);
                bg_schedule_free(s);
                checked++;
            }
    }
    assert_true(checked > 150);
    /* m < 2p: a one-line refusal */
    bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
    gp.kind = BG_SCHED_DUALPIPEV, gp.stages = 4, gp.microbatches = 7;
    bg_schedule_t *s = NULL;
    assert_int_equal(bg_schedule_generate(&gp, &s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "dualpipev needs at least 2p = 8 microbatches"));
}

/* DualPipe (two model copies fed from both ends) against the same published
 * closed forms, now with PP = p ranks: idle (PP/2 - 1)(F&B + B - 3W - F) on
 * every rank (F = b; the pair's forward waits for its own input only, as in
 * DualPipeV above), activations PP + 1 chunk-microbatches on every rank,
 * parameters 2x (every model stage held by two ranks, every rank holding two
 * model stages). Independently of the formulas, a rank of DualPipe on p ranks
 * and m microbatches runs the order of DualPipeV on p/2 ranks and m/2
 * microbatches (its halves mirror each other), so their step times match
 * for every cost ratio. */
static void test_dualpipe_closed_forms(void **state)
{
    (void)state;
    static const double fb[][3] = {{1, 1, 1}, {2, 2, 1}, {1, 1, 0.5}, {2, 2, 2}, {1.5, 1.5, 0.25}, /* F = b */
                                   {1, 2, 1}, {1, 1.5, 0.5}, {2, 1, 1}};
    int checked = 0;
    for (size_t c = 0; c < sizeof fb / sizeof *fb; c++) {
        bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
        double F = fb[c][0], b = fb[c][1], W = fb[c][2], B = b + W;
        sp.f_cost = F, sp.b_cost = b, sp.w_cost = W;
        for (int p = 2; p <= 10; p += 2)
            for (int m = 2 * p; m <= 4 * p + 2; m += 2) {
                bg_schedule_t *s = gen(BG_SCHED_DUALPIPE, p, m, 0, &sp);
                assert_int_equal(bg_schedule_copies(s), 2);
                assert_int_equal(bg_schedule_stages(s), 2 * p);
                bg_sim_result_t *r;
                assert_int_equal(bg_schedule_simulate(s, &sp, &r), BG_OK);
                int PP = p, held[16] = {0};
                double bubble = (PP / 2 - 1) * ((F + B) + B - 3 * W - F), busy = 0;
                for (int k = 0; k < p; k++) {
                    if (bg_sim_peak_stash(r, k) != PP + 1)
                        fail_msg("dualpipe p=%d m=%d F:b:W=%g:%g:%g rank %d: stash %d, want PP + 1 = %d", p, m, F, b,
                                 W, k, bg_sim_peak_stash(r, k), PP + 1);
                    if (F == b && fabs(bg_sim_idle(r, k) - bubble) > 1e-9)
                        fail_msg("dualpipe p=%d m=%d F:b:W=%g:%g:%g rank %d: idle %g, want (PP/2-1)(F&B+B-3W-F) = %g",
                                 p, m, F, b, W, k, bg_sim_idle(r, k), bubble);
                    busy += bg_sim_busy(r, k);
                    /* two chunks: one stage of each copy, of two different model stages (r and p-1-r) */
                    int s0 = -1, s1 = -1;
                    for (int st = 0; st < 2 * p; st++)
                        if (bg_schedule_stage_rank(s, st) == k)
                            *(s0 < 0 ? &s0 : &s1) = st;
                    assert_int_equal(bg_schedule_stage_copy(s, s0), 0);
                    assert_int_equal(bg_schedule_stage_copy(s, s1), 1);
                    assert_int_equal(bg_schedule_model_stage(s, s0), k);
                    assert_int_equal(bg_schedule_model_stage(s, s1), p - 1 - k);
                    held[bg_schedule_model_stage(s, s0)]++, held[bg_schedule_model_stage(s, s1)]++;
                    /* the data enters at rank 0 (copy 0, the first m/2) and at rank p-1 (copy 1) */
                    size_t n;
                    const bg_sched_op_t *ops = bg_schedule_rank_ops(s, k, &n);
                    if (k == 0 || k == p - 1) {
                        assert_int_equal(ops[0].kind, BG_OP_FORWARD);
                        assert_int_equal(ops[0].microbatch, k == 0 ? 0 : m / 2);
                        assert_int_equal(bg_schedule_microbatch_copy(s, ops[0].microbatch), k == 0 ? 0 : 1);
                    }
                }
                for (int st = 0; st < p; st++)
                    assert_int_equal(held[st], 2); /* parameters 2x */
                /* every rank computes m/2 microbatches on each of its two chunks */
                assert_true(fabs(busy - p * m * (F + b + W)) < 1e-9);
                /* the same step as DualPipeV on half the ranks and half the microbatches */
                bg_schedule_t *hv = gen(BG_SCHED_DUALPIPEV, p / 2, m / 2, 0, &sp);
                bg_sim_result_t *rv;
                assert_int_equal(bg_schedule_simulate(hv, &sp, &rv), BG_OK);
                if (fabs(bg_sim_step_time(r) - bg_sim_step_time(rv)) > 1e-9)
                    fail_msg("dualpipe p=%d m=%d F:b:W=%g:%g:%g: step %g, dualpipev p=%d m=%d: %g", p, m, F, b, W,
                             bg_sim_step_time(r), p / 2, m / 2, bg_sim_step_time(rv));
                bg_sim_result_free(rv);
                bg_schedule_free(hv);
                bg_sim_result_free(r);
                bg_schedule_free(s);
                checked++;
            }
    }
    assert_true(checked > 200);
    /* what DualPipe cannot take: one line each */
    static const struct { int p, m, v; const char *msg; } bad[] = {
        {3, 8, 0, "dualpipe needs an even number of pipeline ranks (its two halves mirror each other), got 3"},
        {4, 9, 0, "dualpipe needs an even number of microbatches, at least 2p = 8 (m/2 enter from each end, at least "
                  "p each), got 9"},
        {4, 6, 0, "dualpipe needs an even number of microbatches, at least 2p = 8"},
        {4, 8, 3, "dualpipe places exactly 2 chunks per rank (one stage of each model copy), got 3 chunks"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
        gp.kind = BG_SCHED_DUALPIPE, gp.stages = bad[i].p, gp.microbatches = bad[i].m, gp.chunks = bad[i].v;
        bg_schedule_t *s = NULL;
        assert_int_equal(bg_schedule_generate(&gp, &s), BG_ERR_INVALID);
        if (!strstr(bg_last_error(), bad[i].msg) || strchr(bg_last_error(), '\n'))
            fail_msg("dualpipe p=%d m=%d v=%d: \"%s\", want \"%s\"", bad[i].p, bad[i].m, bad[i].v, bg_last_error(),
                     bad[i].msg);
        assert_null(s);
    }
}

static void test_bad_costs(void **state)
{
    (void)state;
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    sp.b_cost = -1;
    bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
    gp.kind = BG_SCHED_ZBV, gp.stages = 2, gp.microbatches = 4, gp.costs = &sp;
    bg_schedule_t *s = NULL;
    assert_int_equal(bg_schedule_generate(&gp, &s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "stage 0 has a cost of -1"));
    sp.b_cost = 1, sp.latency = NAN;
    assert_int_equal(bg_schedule_generate(&gp, &s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "link delay"));
    assert_null(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zbv_torch_anchors),
        cmocka_unit_test(test_cost_grid),
        cmocka_unit_test(test_uneven_costs),
        cmocka_unit_test(test_search_vs_generators),
        cmocka_unit_test(test_generators_not_beaten_in_family),
        cmocka_unit_test(test_dualpipev_closed_forms),
        cmocka_unit_test(test_dualpipe_closed_forms),
        cmocka_unit_test(test_bad_costs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
