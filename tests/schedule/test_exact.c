/* tests/schedule/test_exact.c: bg_schedule_search_exact against a brute
 * force of its own, the heuristic search and the closed forms.
 *
 * Owns: an independent enumeration of every program of tiny layouts (each
 * rank's order of F, b, W with each stage's microbatches in order, timed as
 * soon as inputs are there), the checks that the exact search finds its
 * minimum, is never beaten by the heuristic search, and meets the closed
 * forms (ZB-H1's 3m + p - 1, the lower bound, at 1F1B's stash).
 * Must not: share code with the library's search (an oracle that shares it
 * cannot catch its mistakes). */
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

#define MAXR 3
#define MAXOPS 24

typedef struct {
    int kind, stage, mb; /* kind 0 F, 1 b, 2 W */
} op_t;

typedef struct {
    int p, S, m, rank[8];
    double f, b, w, lat, lim;
    op_t ops[MAXR][MAXOPS];  /* the rank's ops */
    int nops[MAXR];
    op_t ord[MAXR][MAXOPS];  /* the order being built */
    int used[MAXR][MAXOPS];
    double best;
    long long tried;
} bf_t;

/* time the orders: each rank runs its next op when its inputs are there;
 * INFINITY when they deadlock or a rank's stash passes the limit */
static double bf_eval(bf_t *g)
{
    double fe[8][8], be[8][8], fr[MAXR] = {0}, end = 0;
    int df[8][8] = {{0}}, db[8][8] = {{0}}, k[MAXR] = {0}, left = 0;
    double stash[MAXR] = {0};
    for (int r = 0; r < g->p; r++)
        left += g->nops[r];
    while (left > 0) {
        int moved = 0;
        for (int r = 0; r < g->p; r++) {
            if (k[r] >= g->nops[r])
                continue;
            op_t o = g->ord[r][k[r]];
            int s = o.stage, i = o.mb;
            double t = fr[r];
            if (o.kind == 0) {
                if (s > 0) {
                    if (!df[s - 1][i])
                        continue;
                    double in = fe[s - 1][i] + (g->rank[s - 1] != r ? g->lat : 0);
                    t = in > t ? in : t;
                }
                fe[s][i] = t + g->f, df[s][i] = 1, fr[r] = t + g->f;
                if (++stash[r] > g->lim + 1e-9)
                    return INFINITY;
            } else if (o.kind == 1) {
                if (!df[s][i])
                    continue;
                t = fe[s][i] > t ? fe[s][i] : t;
                if (s < g->S - 1) {
                    if (!db[s + 1][i])
                        continue;
                    double in = be[s + 1][i] + (g->rank[s + 1] != r ? g->lat : 0);
                    t = in > t ? in : t;
                }
                be[s][i] = t + g->b, db[s][i] = 1, fr[r] = t + g->b;
            } else {
                if (!db[s][i])
                    continue;
                t = be[s][i] > t ? be[s][i] : t;
                fr[r] = t + g->w, stash[r]--;
            }
            end = fr[r] > end ? fr[r] : end;
            k[r]++, left--, moved = 1;
        }
        if (!moved)
            return INFINITY;
    }
    return end;
}

/* may op j of rank r come next: its stage's earlier microbatch of the kind
 * and its own earlier kinds are already in the order */
static int bf_ok(const bf_t *g, int r, int j)
{
    op_t o = g->ops[r][j];
    for (int x = 0; x < g->nops[r]; x++) {
        op_t q = g->ops[r][x];
        if (g->used[r][x] || q.stage != o.stage)
            continue;
        if ((q.kind == o.kind && q.mb < o.mb) || (q.mb == o.mb && q.kind < o.kind))
            return 0;
    }
    return 1;
}

static void bf_rank(bf_t *g, int r, int n)
{
    if (r == g->p) {
        double t = bf_eval(g);
        g->tried++;
        if (t < g->best)
            g->best = t;
        return;
    }
    if (n == g->nops[r]) {
        bf_rank(g, r + 1, 0);
        return;
    }
    for (int j = 0; j < g->nops[r]; j++)
        if (!g->used[r][j] && bf_ok(g, r, j)) {
            g->used[r][j] = 1;
            g->ord[r][n] = g->ops[r][j];
            bf_rank(g, r, n + 1);
            g->used[r][j] = 0;
        }
}

/* the brute-force optimum of p ranks, one chunk (vshape 0) or the V */
static double brute(int p, int m, int vshape, double f, double b, double w, double lat, double lim)
{
    bf_t *g = calloc(1, sizeof *g);
    assert_non_null(g);
    g->p = p, g->m = m, g->S = vshape ? 2 * p : p;
    g->f = f, g->b = b, g->w = w, g->lat = lat, g->lim = lim > 0 ? lim : INFINITY, g->best = INFINITY;
    for (int s = 0; s < g->S; s++) {
        int r = s < p ? s : 2 * p - 1 - s;
        g->rank[s] = r;
        for (int i = 0; i < m; i++)
            for (int kd = 0; kd < 3; kd++)
                g->ops[r][g->nops[r]++] = (op_t){kd, s, i};
    }
    bf_rank(g, 0, 0);
    double t = g->best;
    free(g);
    return t;
}

/* seeded: from the heuristic's program (the default), else from no bound,
 * so that the enumeration itself finds the optimum */
static int seeded = 1;

static bg_status_t exact(int p, int m, int vshape, double f, double b, double w, double lat, double lim,
                         long long budget, bg_schedule_exact_result_t *res)
{
    bg_schedule_exact_params_t xp = BG_SCHEDULE_EXACT_PARAMS_INIT;
    xp.max_nodes = budget, xp.seed = seeded;
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    sp.f_cost = f, sp.b_cost = b, sp.w_cost = w, sp.latency = lat, sp.stash_bytes = 1;
    bg_schedule_search_params_t q = BG_SCHEDULE_SEARCH_PARAMS_INIT;
    q.stages = p, q.microbatches = m, q.chunks = vshape ? 2 : 1, q.vshape = vshape, q.costs = &sp;
    q.mem_limit = lim;
    bg_schedule_t *s = NULL;
    bg_status_t st = bg_schedule_search_exact(&q, &xp, res, &s);
    if (st != BG_OK)
        return st;
    /* the program returned validates and the simulator gives its step and peak */
    assert_int_equal(bg_schedule_validate(s), BG_OK);
    bg_sim_result_t *r = NULL;
    assert_int_equal(bg_schedule_simulate(s, &sp, &r), BG_OK);
    double peak = 0;
    for (int k = 0; k < p; k++)
        peak = bg_sim_peak_stash(r, k) > peak ? bg_sim_peak_stash(r, k) : peak;
    if (fabs(bg_sim_step_time(r) - res->step) > 1e-9 || (lim > 0 && peak > lim + 1e-9))
        fail_msg("p=%d m=%d: exact says %g, the simulator %g (peak %g, limit %g)", p, m, res->step,
                 bg_sim_step_time(r), peak, lim);
    bg_sim_result_free(r);
    bg_schedule_free(s);
    return BG_OK;
}

static const double costs[][3] = {{1, 1, 1}, {1, 2, 1}, {2, 3, 2}};

/* on tiny layouts the exact search's optimum is the brute force's, with and
 * without latency and a memory limit; the heuristic is never better */
static void test_exact_vs_brute(void **state)
{
    (void)state;
    static const int cases[][3] = {{2, 2, 0}, {2, 3, 0}, {3, 2, 0}, {2, 4, 0}, {3, 3, 0}, {1, 2, 1}, {2, 1, 1}};
    int checked = 0;
    for (seeded = 0; seeded <= 1; seeded++)
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (size_t c = 0; c < sizeof costs / sizeof *costs; c++)
            for (int li = 0; li < 2; li++)
                for (int lim = 0; lim <= 3; lim++) {
                    int p = cases[k][0], m = cases[k][1], vs = cases[k][2];
                    double lat = li * 0.5, f = costs[c][0], b = costs[c][1], w = costs[c][2];
                    if (vs && lim == 1)
                        continue; /* a V rank holds two chunks of a microbatch at once */
                    double want = brute(p, m, vs, f, b, w, lat, lim);
                    bg_schedule_exact_result_t res;
                    bg_status_t st = exact(p, m, vs, f, b, w, lat, lim, 10000000, &res);
                    if (want == INFINITY) {
                        assert_int_equal(st, BG_ERR_NOT_FOUND);
                        continue;
                    }
                    if (st != BG_OK)
                        fail_msg("p=%d m=%d v%d limit %d: %s", p, m, vs, lim, bg_last_error());
                    if (!seeded && strcmp(res.from, "branch and bound"))
                        fail_msg("p=%d m=%d: unseeded, the enumeration found nothing (%s)", p, m, res.from);
                    if (!res.proved || fabs(res.step - want) > 1e-9 || fabs(res.bound - res.step) > 1e-9)
                        fail_msg("seed %d p=%d m=%d %s F:b:W %g:%g:%g latency %g limit %d: exact %g (bound %g, "
                                 "proved %d), brute force %g", seeded, p, m, vs ? "V" : "one chunk", f, b, w, lat, lim, res.step,
                                 res.bound, res.proved, want);
                    if (res.heuristic_step < res.step - 1e-9 || res.lower_bound > res.step + 1e-9)
                        fail_msg("p=%d m=%d: heuristic %g or lower bound %g against the optimum %g", p, m,
                                 res.heuristic_step, res.lower_bound, res.step);
                    checked++;
                }
    assert_true(checked >= 160);
    seeded = 1;
}

/* the closed forms: at 1F1B's stash (min(p, m)) and unit costs, one chunk,
 * the optimum is ZB-H1's 3m + p - 1 (m >= p: the lower bound (p-1)F + 3m),
 * never above 1F1B's 3(m + p - 1); on the V at ZB-V's stash 2p, ZB-V's
 * 6m + p - 1 in chunk units (m >= 2p) */
static void test_exact_closed_forms(void **state)
{
    (void)state;
    for (int p = 2; p <= 4; p++)
        for (int m = p; m <= 8; m++) {
            bg_schedule_exact_result_t res;
            assert_int_equal(exact(p, m, 0, 1, 1, 1, 0, p, 1000000, &res), BG_OK);
            if (!res.proved || fabs(res.step - (3 * m + p - 1)) > 1e-9 || res.step > 3 * (m + p - 1) + 1e-9)
                fail_msg("one chunk p=%d m=%d: exact %g (proved %d), ZB-H1 %d", p, m, res.step, res.proved,
                         3 * m + p - 1);
        }
    for (int p = 2; p <= 3; p++)
        for (int m = 2 * p; m <= 8; m++) {
            bg_schedule_exact_result_t res;
            assert_int_equal(exact(p, m, 1, 1, 1, 1, 0, 2 * p, 1000000, &res), BG_OK);
            if (!res.proved || fabs(res.step - (6 * m + p - 1)) > 1e-9)
                fail_msg("V p=%d m=%d: exact %g (proved %d), ZB-V %d", p, m, res.step, res.proved, 6 * m + p - 1);
        }
}

/* a budget too small stops early: the best found and a bound that the true
 * optimum (the brute force's) lies between */
static void test_exact_budget(void **state)
{
    (void)state;
    int stopped = 0;
    for (int lim = 1; lim <= 3; lim++)
        for (size_t c = 0; c < sizeof costs / sizeof *costs; c++) {
            double f = costs[c][0], b = costs[c][1], w = costs[c][2];
            double want = brute(2, 3, 0, f, b, w, 0.5, lim);
            bg_schedule_exact_result_t res;
            seeded = 0;
            bg_status_t st = exact(2, 3, 0, f, b, w, 0.5, lim, 30, &res);
            seeded = 1;
            assert_int_equal(st, BG_OK);
            if (res.bound > want + 1e-9 || res.step < want - 1e-9 || (res.proved && res.step > want + 1e-9))
                fail_msg("limit %d: budget 30 gives %g, bound %g (proved %d); the optimum is %g", lim, res.step,
                         res.bound, res.proved, want);
            if (!res.proved) {
                stopped++;
                assert_true(res.nodes <= 30);
            }
        }
    assert_true(stopped > 0);
    bg_schedule_search_params_t q = BG_SCHEDULE_SEARCH_PARAMS_INIT;
    q.stages = 4, q.microbatches = 4, q.chunks = 4; /* interleaved: not a layout it enumerates */
    bg_schedule_exact_result_t res;
    bg_schedule_t *s = NULL;
    assert_int_equal(bg_schedule_search_exact(&q, NULL, &res, &s), BG_ERR_INVALID);
    assert_null(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_vs_brute),
        cmocka_unit_test(test_exact_closed_forms),
        cmocka_unit_test(test_exact_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
