/* schedule/search.c: bg_schedule_search, the fastest program of a layout
 * whose peak stash keeps within a memory limit.
 *
 * Owns: the candidates (every generator of the layout, built for the costs,
 * and list-scheduler policies, uncapped and capped at the limit), the lower
 * bound, and the choice by the simulator's step time and peak.
 * Must not: build programs itself: generate.c and the list scheduler
 * (gen_list.c) do. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/generate_impl.h"
#include "schedule/schedule_impl.h"

typedef struct {
    const bg_schedule_search_params_t *sp;
    const bg_sim_params_t *sim;
    bg_schedule_search_result_t *res;
    bg_schedule_t *best;
} bg__search_t;

/* simulate a candidate and keep it when it fits and is the fastest so far
 * (takes s); indep: the program does not depend on the limit, so its peak is
 * a limit that works whatever limit was asked for */
static bg_status_t bg__consider(bg__search_t *q, bg_schedule_t *s, const char *label, int indep)
{
    bg_sim_result_t *r = NULL;
    bg_status_t st = bg_schedule_simulate(s, q->sim, &r);
    if (st != BG_OK) { /* a generated program always validates: this is a bug */
        bg_schedule_free(s);
        return st;
    }
    double peak = 0, step = bg_sim_step_time(r);
    for (int k = 0; k < s->p; k++)
        if (bg_sim_peak_stash_bytes(r, k) > peak)
            peak = bg_sim_peak_stash_bytes(r, k);
    bg_sim_result_free(r);
    q->res->tried++;
    if (indep && peak < q->res->min_limit)
        q->res->min_limit = peak;
    double lim = q->sp->mem_limit;
    if ((lim <= 0 || peak <= lim * (1 + 1e-12)) && (!q->best || step < q->res->step)) {
        bg_schedule_free(q->best);
        q->best = s;
        q->res->step = step, q->res->peak = peak;
        snprintf(q->res->from, sizeof q->res->from, "%s", label);
    } else {
        bg_schedule_free(s);
    }
    return BG_OK;
}

/* The memory-bounded orders: every rank admits a microbatch only with room
 * for its stash on all the rank's chunks (or, "room 1", for the next chunk's
 * only), under a cap of j microbatches' stash (or the limit, whichever is
 * smaller), j = 1, 1 + 1/v, .. up to what the limit holds. On the V layout these are the controllable-memory paper's V orders:
 * V-Min near j = (p+4)/3, V-Half near (p+2)/2, ZB-V's memory at p, and the
 * continuum between; the same admission bounds the other layouts. B/W split
 * or full backward, W or F first after b. */
static bg_status_t bg__search_bounded(bg__search_t *q, bg__policy_t *pol, const bg__costs_t *cost, const int *map,
                                      const double *sb, double need)
{
    const bg_schedule_search_params_t *sp = q->sp;
    int p = sp->stages, m = sp->microbatches, v = sp->chunks, big = v * m;
    for (int j = v, at_limit = 0; j <= v * m && !at_limit && need <= sp->mem_limit * (1 + 1e-12); j++) {
        at_limit = 1;
        for (int r = 0; r < p; r++) {
            double all = 0;
            for (int c = 0; c < v; c++)
                all += sb[map[r * v + c]];
            pol->capb[r] = j * all / v < sp->mem_limit ? j * all / v : sp->mem_limit;
            at_limit &= pol->capb[r] == sp->mem_limit;
            pol->window[r] = pol->cap[r] = big;
        }
        for (int res = 1; res <= 2; res++)
        for (int split = 1; split >= 0; split--)
            for (int wf = 0; wf <= 2 * split; wf++) {
                pol->split = split, pol->w_first = wf == 1, pol->fwd_first = wf == 2, pol->gpipe = 0;
                pol->reserve = res;
                pol->group = v > 1 && !sp->vshape ? p : 0;
                pol->sb = sb;
                bg_schedule_t *s;
                BG_CHECK(bg__schedule_alloc("search", BG_SCHED_CUSTOM, p, m, v, map, &s));
                bg_status_t st = bg__run(s, pol, cost);
                if (st != BG_OK) {
                    bg_schedule_free(s);
                    return st;
                }
                char label[160];
                snprintf(label, sizeof label, "%s j=%g%s%s%s", sp->vshape ? "bounded V" : "bounded list",
                         (double)j / v,
                         res == 2 ? " room 1" : "", split ? " split" : " full", wf == 1 ? " W first"
                                                                                : wf == 2 ? " F first" : "");
                BG_CHECK(bg__consider(q, s, label, 0));
            }
    }
    return BG_OK;
}

bg_status_t bg_schedule_search(const bg_schedule_search_params_t *sp, bg_schedule_search_result_t *res,
                               bg_schedule_t **sched_p)
{
    if (!sp || sp->size < sizeof(bg_schedule_search_params_t) || !res || !sched_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_search: params missing or not initialised with "
                                        "BG_SCHEDULE_SEARCH_PARAMS_INIT");
    int p = sp->stages, m = sp->microbatches, v = sp->chunks;
    if (p < 1 || m < 1 || p > 65536 || m > 1 << 22)
        return bg_error(BG_ERR_INVALID, "schedule search: %d stages x %d microbatches (each must be >= 1)", p, m);
    if (v < 1 || v > 64 || (sp->vshape && v != 2))
        return bg_error(BG_ERR_INVALID, "schedule search: %d chunks per rank%s", v,
                        sp->vshape ? " (a V places exactly 2)" : " (expected 1..64)");
    if (!(sp->mem_limit >= 0) || !isfinite(sp->mem_limit))
        return bg_error(BG_ERR_INVALID, "schedule search: memory limit %g (expected a finite number >= 0)",
                        sp->mem_limit);
    if ((long long)p * v * m > 5000000LL)
        return bg_error(BG_ERR_INVALID, "schedule search: %d stages x %d chunks x %d microbatches is more than the "
                                        "5M compute steps it searches", p, v, m);
    memset(res, 0, sizeof *res);
    res->min_limit = INFINITY;
    bg_sim_params_t sim = BG_SIM_PARAMS_INIT;
    if (sp->costs) {
        size_t n = sp->costs->size < sizeof sim ? sp->costs->size : sizeof sim;
        memcpy(&sim, sp->costs, n);
        sim.size = sizeof sim;
    }
    if (!sim.stash_bytes_per_stage && sim.stash_bytes == 0)
        sim.stash_bytes = 1; /* count chunk-microbatches */
    int S = p * v, big = v * m;
    bg__costs_t cost = {0};
    BG_CHECK(bg__costs_init(&cost, &sim, S));
    bg__search_t q = {.sp = sp, .sim = &sim, .res = res};
    bg_status_t st = BG_OK;
    int *map = malloc(sizeof(int) * (size_t)S), *rank_of = malloc(sizeof(int) * (size_t)S);
    double *sb = malloc(sizeof(double) * (size_t)S);
    bg__policy_t pol = {0};
    pol.window = malloc(sizeof(int) * (size_t)p);
    pol.cap = malloc(sizeof(int) * (size_t)p);
    pol.peak = malloc(sizeof(int) * (size_t)p);
    pol.capb = malloc(sizeof(double) * (size_t)p);
    double *head = malloc(sizeof(double) * (size_t)p), *busy = calloc((size_t)p, sizeof(double));
    if (!map || !rank_of || !sb || !pol.window || !pol.cap || !pol.peak || !pol.capb || !head || !busy) {
        st = bg_error(BG_ERR_NOMEM, "schedule search for %d stages", S);
        goto out;
    }
    for (int r = 0; r < p; r++)
        for (int c = 0; c < v; c++) {
            int stg = sp->vshape ? (c == 0 ? r : 2 * p - 1 - r) : c * p + r;
            map[r * v + c] = stg, rank_of[stg] = r;
        }
    for (int i = 0; i < S; i++)
        sb[i] = sim.stash_bytes_per_stage ? sim.stash_bytes_per_stage[i] : sim.stash_bytes;
    /* lower bound: a rank cannot start before its first input can arrive, then works m (F+B+W) per stage */
    for (int r = 0; r < p; r++)
        head[r] = INFINITY;
    {
        double t = 0;
        for (int i = 0; i < S; i++) {
            int r = rank_of[i];
            if (t < head[r])
                head[r] = t;
            busy[r] += m * (cost.f[i] + cost.b[i] + cost.w[i]);
            t += cost.f[i] + (i + 1 < S && rank_of[i + 1] != r ? cost.act : 0);
        }
        for (int r = 0; r < p; r++)
            if (head[r] + busy[r] > res->lower_bound)
                res->lower_bound = head[r] + busy[r];
    }
    /* 1: every generator of the layout, built for the costs */
    static const bg_schedule_kind_t one[] = {BG_SCHED_GPIPE, BG_SCHED_1F1B, BG_SCHED_ZB_H1, BG_SCHED_ZB_H2};
    static const bg_schedule_kind_t inter[] = {BG_SCHED_INTERLEAVED, BG_SCHED_ZB_INTERLEAVED};
    static const bg_schedule_kind_t vee[] = {BG_SCHED_ZBV, BG_SCHED_DUALPIPEV};
    const bg_schedule_kind_t *kinds = v == 1 ? one : sp->vshape ? vee : inter;
    int nk = v == 1 ? 4 : sp->vshape ? (m >= 2 * p ? 2 : 1) : 2; /* dualpipev needs m >= 2p */
    for (int k = 0; k < nk; k++) {
        bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
        gp.kind = kinds[k], gp.stages = p, gp.microbatches = m, gp.chunks = v, gp.costs = &sim;
        bg_schedule_t *s;
        BG_CHECK_GOTO(bg_schedule_generate(&gp, &s), st, out);
        BG_CHECK_GOTO(bg__consider(&q, s, bg_schedule_kind_name(kinds[k]), 1), st, out);
    }
    /* 2: list schedules, uncapped and capped at the limit: windows of
     * forwards in flight (the same on every rank, or staggered like 1F1B's),
     * B/W split or full backward, W or F first after B */
    for (int capped = 0; capped <= (sp->mem_limit > 0); capped++)
    for (int split = 1; split >= 0; split--)
        for (int wf = 0; wf <= split; wf++)
            for (int w = 0; w < 6; w++) {
                pol.split = split, pol.w_first = wf, pol.gpipe = pol.fwd_first = pol.reserve = 0;
                pol.group = v > 1 && !sp->vshape ? p : 0;
                pol.sb = sb;
                for (int r = 0; r < p; r++) {
                    int win = w == 0 ? 1 : w == 1 ? p : w == 2 ? 2 * p : w == 3 ? big
                            : (v - 1) * p + (w - 3) * (p - r);
                    pol.window[r] = bg__imin(win < 1 ? 1 : win, big);
                    pol.cap[r] = big;
                    pol.capb[r] = capped ? sp->mem_limit : INFINITY;
                }
                bg_schedule_t *s;
                BG_CHECK_GOTO(bg__schedule_alloc("search", BG_SCHED_CUSTOM, p, m, v, map, &s), st, out);
                st = bg__run(s, &pol, &cost);
                if (st != BG_OK) {
                    bg_schedule_free(s);
                    goto out;
                }
                char label[64];
                snprintf(label, sizeof label, "list %s%s%s, window %s", split ? "B/W split" : "full backward",
                         wf ? ", W first" : "", capped ? ", capped" : "",
                         w == 0 ? "1" : w == 1 ? "p" : w == 2 ? "2p" : w == 3 ? "all" : w == 4 ? "(v-1)p+p-r"
                                                                                            : "(v-1)p+2(p-r)");
                BG_CHECK_GOTO(bg__consider(&q, s, label, !capped), st, out);
            }
    /* 3: the building-block orders (gen_block.c), placed with unit slots as
     * the paper does and with the costs, offsets 0 (V-Min on the V), one
     * forward (V-Half) and up to 4 forwards (towards ZB-V's memory), the
     * backward half shifted by 0..3 forwards */
    {
        double fmean = 0;
        for (int i = 0; i < S; i++)
            fmean += cost.f[i] / S;
        for (int unit = 1; unit >= 0; unit--)
            for (int g = 0; g <= 4; g++)
            for (int turn = 0; turn <= 3; turn++) {
                double unitf = unit ? 1 : fmean;
                bg_schedule_t *s;
                BG_CHECK_GOTO(bg__schedule_alloc("search", BG_SCHED_CUSTOM, p, m, v, map, &s), st, out);
                st = bg__run_block(s, &pol, &cost, unit, g * unitf, turn * unitf);
                if (st != BG_OK) {
                    bg_schedule_free(s);
                    if (st != BG_ERR_NOT_FOUND && st != BG_ERR_DEADLOCK)
                        goto out;
                    st = BG_OK;
                    continue;
                }
                char label[64];
                snprintf(label, sizeof label, "%s block, offset +%d, turn +%d, %s",
                         !sp->vshape ? "list" : g == 0 ? "V-Min" : g == 1 ? "V-Half" : "V", g, turn,
                         unit ? "slots" : "costs");
                BG_CHECK_GOTO(bg__consider(&q, s, label, 1), st, out);
            }
    }
    /* 4: the smallest limit, exact: a microbatch's stash on all of a rank's
     * chunks is held at once (its last forward there comes before its first
     * backward), and a rank admitting one microbatch at a time (4 with j = 1)
     * needs no more */
    double need = 0;
    for (int r = 0; r < p; r++) {
        double all = 0;
        for (int c = 0; c < v; c++)
            all += sb[map[r * v + c]];
        need = all > need ? all : need;
    }
    res->min_limit = need;
    if (sp->mem_limit > 0)
        BG_CHECK_GOTO(bg__search_bounded(&q, &pol, &cost, map, sb, need), st, out);
    if (!q.best) {
        st = bg_error(BG_ERR_NOT_FOUND, "no program of %d tried keeps its peak stash within %g on every rank; the "
                                        "smallest limit that works is %g", res->tried, sp->mem_limit, res->min_limit);
        goto out;
    }
    *sched_p = q.best;
    q.best = NULL;
out:
    bg_schedule_free(q.best);
    free(cost.f), free(map), free(rank_of), free(sb), free(head), free(busy);
    free(pol.window), free(pol.cap), free(pol.peak), free(pol.capb);
    return st;
}
