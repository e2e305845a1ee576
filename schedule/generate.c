/* schedule/generate.c: the schedule generators (GPipe, 1F1B,
 * interleaved 1F1B, ZB-H1, ZB-H2, ZB-V, interleaved zero bubble, DualPipeV,
 * and DualPipe, whose two model copies are two chains of stages, each
 * microbatch running through one: bg__chain_first/last and bg__mb_first in
 * schedule_impl.h give every dependency below its chain).
 *
 * Every generator is a family of orders run by one list scheduler under the
 * costs it is given (per-stage F, B, W and the link delay; unit costs and
 * free links by default): at each event an idle rank starts the ready compute
 * op its policy prefers (a window on in-flight forwards, a cap on stashed
 * microbatches, a priority between B, F and W, and an order among chunks),
 * or the next op of a fixed order (Megatron's interleaved order, ZB-H1's,
 * torch's ZB-V and ZB1P orders). Each candidate's step time under the costs
 * comes out of the same run; the fastest within the family's stash bound is
 * kept. Because every order comes from an execution that respects every
 * dependency, the programs are deadlock-free by construction for any p and m
 * (also m < p, or m not a multiple of p); the validator checks it anyway.
 * Communication ops are inserted around each compute op: the receive just
 * before its consumer, the send just after its producer. The link model here
 * is a fixed delay per message (no queueing); the simulator stays the judge.
 * bg_schedule_search() (search.c) runs the same machinery over every
 * generator and list-scheduler policy of a layout under a memory limit and
 * lets the simulator pick.
 *
 * This file owns the families (each generator's stash bound and candidates)
 * and bg_schedule_generate, which runs them and keeps the fastest; the list
 * scheduler is gen_list.c, the fixed orders gen_orders.c (Megatron's
 * interleaved, ZB-H1, ZB-V, ZB1P) and gen_dualpipe.c (DualPipe, DualPipeV).
 * Must not: simulate (the search does, through simulate.c) or know a fixed
 * order's shape beyond picking it. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/generate.h"
#include "schedule/generate_impl.h"
#include "schedule/schedule_impl.h"

/* The family of a generator: its stash bound per rank (chunk-microbatches),
 * and its candidates: fixed orders and list-scheduler policies that keep
 * within the bound. Candidate k is set up in pol (and *seq for a fixed
 * order); 0 when there is no candidate k. The first candidate is the
 * generator's reference program (the one the closed forms of
 * docs/schedules.md describe at unit costs); a later one replaces it only
 * when strictly faster under the costs. */
static int bg__bound(bg_schedule_kind_t kind, int p, int m, int v, int r)
{
    int big = v * m;
    switch (kind) {
    case BG_SCHED_GPIPE: return m;
    case BG_SCHED_1F1B: return bg__imin(p - r, m);
    case BG_SCHED_INTERLEAVED: return bg__imin((p - r - 1) * 2 + (v - 1) * p + 1, big);
    case BG_SCHED_ZB_H1: return bg__imin(p, m);
    case BG_SCHED_ZB_H2: return bg__imin(2 * p - 1, m);
    case BG_SCHED_ZBV: return bg__imin(2 * p, big);
    case BG_SCHED_ZB_INTERLEAVED: return bg__imin(v * p, big);
    case BG_SCHED_DUALPIPEV: return bg__imin(2 * p + 1, big);
    case BG_SCHED_DUALPIPE: return bg__imin(p + 1, m); /* v * m/2 chunk-microbatches per rank */
    default: return big;
    }
}

static int bg__candidate(bg_schedule_kind_t kind, int p, int m, int v, int k, bg__policy_t *pol, bg__seq_fn *seq)
{
    int big = v * m;
    pol->split = pol->gpipe = pol->fwd_first = pol->group = 0;
    *seq = NULL;
    for (int r = 0; r < p; r++)
        pol->cap[r] = bg__bound(kind, p, m, v, r);
    switch (kind) {
    case BG_SCHED_GPIPE:
        if (k > 0)
            return 0;
        pol->gpipe = pol->fwd_first = 1;
        for (int r = 0; r < p; r++)
            pol->window[r] = big;
        return 1;
    case BG_SCHED_1F1B:
        if (k > 0)
            return 0;
        for (int r = 0; r < p; r++)
            pol->window[r] = bg__imin(p - r, m);
        return 1;
    case BG_SCHED_INTERLEAVED:
        if (k > 1)
            return 0;
        pol->group = p;
        for (int r = 0; r < p; r++)
            pol->window[r] = pol->cap[r];
        if (k == 0)
            *seq = bg__seq_interleaved;
        return 1;
    case BG_SCHED_ZB_H1:
    case BG_SCHED_ZB_H2:
    case BG_SCHED_ZBV:
    case BG_SCHED_ZB_INTERLEAVED: {
        /* 0: the fixed order (zb-h1, zbv, zb-interleaved); then the list
         * scheduler, b > F > W with the family's window (other priorities
         * and windows were tried: they won in under 0.1% of the cost grid);
         * zb-h1 last: the same with p forwards in flight on every rank (the
         * zero-bubble paper's ZB-1p heuristic: the warm-up takes as many
         * forwards as the stash p allows, which hides a link delay at m = p:
         * p 8, m 8, latency 0.5: 44 -> 38) */
        int fixed = kind != BG_SCHED_ZB_H2, extra = kind == BG_SCHED_ZB_H1;
        if (k > fixed + extra)
            return 0;
        pol->split = 1;
        if (kind == BG_SCHED_ZB_INTERLEAVED)
            pol->group = p;
        if (fixed && k == 0) {
            *seq = kind == BG_SCHED_ZB_H1 ? bg__seq_zbh1 : kind == BG_SCHED_ZBV ? bg__seq_zbv : bg__seq_zbi;
            for (int r = 0; r < p; r++)
                pol->window[r] = big;
            return 1;
        }
        for (int r = 0; r < p; r++) {
            int w = kind == BG_SCHED_ZB_H1   ? (k > fixed ? p : p - r)
                    : kind == BG_SCHED_ZB_H2 ? 2 * (p - r) - 1
                    : kind == BG_SCHED_ZBV   ? 2 * p
                                             : (v - 1) * p + p - r;
            pol->window[r] = bg__imin(w, big);
        }
        return 1;
    }
    case BG_SCHED_DUALPIPEV: /* its published order only */
    case BG_SCHED_DUALPIPE:
        if (k > 0)
            return 0;
        *seq = kind == BG_SCHED_DUALPIPE ? bg__seq_dualpipe : bg__seq_dualpipev;
        for (int r = 0; r < p; r++)
            pol->window[r] = big;
        return 1;
    default:
        return 0;
    }
}

/* The checks bg_schedule_generate makes before generating: BG_OK when the
 * params describe a program it makes (*v_p: the chunks per rank, the kind's
 * default for 0; *sp_p: the costs, or NULL), else the error it returns. */
static bg_status_t bg__generate_params(const bg_schedule_params_t *params, int *v_p, const bg_sim_params_t **sp_p)
{
    if (!params || params->size < sizeof(size_t) + sizeof(int) * 4)
        return bg_error(BG_ERR_INVALID, "bg_schedule_generate: params missing or not initialised with "
                                        "BG_SCHEDULE_PARAMS_INIT");
    bg_schedule_kind_t kind = params->kind;
    const char *name = bg_schedule_kind_name(kind);
    int p = params->stages, m = params->microbatches, v = params->chunks;
    const bg_sim_params_t *sp =
        params->size >= offsetof(bg_schedule_params_t, costs) + sizeof(params->costs) ? params->costs : NULL;
    if (!name || kind == BG_SCHED_CUSTOM)
        return bg_error(BG_ERR_INVALID, "unknown schedule kind %d (expected gpipe, 1f1b, interleaved, zb-h1, "
                                        "zb-h2, zbv, zb-interleaved, dualpipev or dualpipe)", (int)kind);
    if (p < 1)
        return bg_error(BG_ERR_INVALID, "%s: stages must be >= 1, got %d", name, p);
    if (m < 1)
        return bg_error(BG_ERR_INVALID, "%s: microbatches must be >= 1, got %d", name, m);
    if (p > 65536 || m > 1 << 22)
        return bg_error(BG_ERR_INVALID, "%s: %d stages x %d microbatches is larger than supported "
                                        "(stages <= 65536, microbatches <= 4194304)", name, p, m);
    if (kind == BG_SCHED_INTERLEAVED || kind == BG_SCHED_ZB_INTERLEAVED) {
        if (v == 0)
            v = 2;
        if (v < 2 || v > 64)
            return bg_error(BG_ERR_INVALID, "%s needs 2..64 chunks per rank, got %d%s", name, v,
                            v == 1 ? (kind == BG_SCHED_INTERLEAVED ? " (with one chunk per rank use 1f1b)"
                                                                   : " (with one chunk per rank use zb-h1)") : "");
    } else if (kind == BG_SCHED_ZBV || kind == BG_SCHED_DUALPIPEV || kind == BG_SCHED_DUALPIPE) {
        if (v == 0)
            v = 2;
        if (v != 2)
            return bg_error(BG_ERR_INVALID, "%s places exactly 2 chunks per rank (%s), got %d chunks", name,
                            kind == BG_SCHED_DUALPIPE ? "one stage of each model copy" : "a V", v);
        if (kind == BG_SCHED_DUALPIPEV && m < 2 * p)
            return bg_error(BG_ERR_INVALID, "dualpipev needs at least 2p = %d microbatches (one per virtual stage), "
                                            "got %d", 2 * p, m);
        if (kind == BG_SCHED_DUALPIPE && p % 2)
            return bg_error(BG_ERR_INVALID, "dualpipe needs an even number of pipeline ranks (its two halves mirror "
                                            "each other), got %d", p);
        if (kind == BG_SCHED_DUALPIPE && (m % 2 || m < 2 * p))
            return bg_error(BG_ERR_INVALID, "dualpipe needs an even number of microbatches, at least 2p = %d (m/2 "
                                            "enter from each end, at least p each), got %d", 2 * p, m);
    } else {
        if (v == 0)
            v = 1;
        if (v != 1)
            return bg_error(BG_ERR_INVALID, "%s places one chunk per rank, got %d chunks "
                                            "(use interleaved, zb-interleaved or zbv for several)", name, v);
    }
    if ((long long)p * v * m > 50000000LL)
        return bg_error(BG_ERR_INVALID, "%s: %d stages x %d chunks x %d microbatches is more than the "
                                        "50M compute steps supported", name, p, v, m);
    if (sp && sp->size < offsetof(bg_sim_params_t, grad_bytes) + sizeof(double))
        return bg_error(BG_ERR_INVALID, "bg_schedule_generate: costs not initialised with BG_SIM_PARAMS_INIT");
    *v_p = v;
    *sp_p = sp;
    return BG_OK;
}

bg_status_t bg__schedule_generate_check(const bg_schedule_params_t *params)
{
    int v = 0;
    const bg_sim_params_t *sp = NULL;
    return bg__generate_params(params, &v, &sp);
}

bg_status_t bg_schedule_generate(const bg_schedule_params_t *params, bg_schedule_t **sched_p)
{
    int v = 0;
    const bg_sim_params_t *sp = NULL;
    if (!sched_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_generate: params missing or not initialised with "
                                        "BG_SCHEDULE_PARAMS_INIT");
    bg_status_t st = bg__generate_params(params, &v, &sp);
    if (st != BG_OK)
        return st;
    bg_schedule_kind_t kind = params->kind;
    const char *name = bg_schedule_kind_name(kind);
    int p = params->stages, m = params->microbatches;

    int *map = NULL, copies = kind == BG_SCHED_DUALPIPE ? 2 : 1;
    if (kind == BG_SCHED_ZBV || kind == BG_SCHED_DUALPIPEV || kind == BG_SCHED_DUALPIPE) {
        /* the V layout; for dualpipe chunk 1 of rank r, stage 2p-1-r, is stage p-1-r of copy 1 */
        map = malloc(sizeof(int) * (size_t)p * 2);
        BG_ALLOC_CHECK(map, sizeof(int) * (size_t)p * 2, "stage map");
        for (int r = 0; r < p; r++)
            map[r * 2] = r, map[r * 2 + 1] = 2 * p - 1 - r;
    }
    bg__costs_t cost = {0}, unitc = {0};
    st = bg__costs_init(&cost, sp, p * v);
    if (st == BG_OK && (st = bg__costs_init(&unitc, NULL, p * v)) != BG_OK)
        free(cost.f);
    if (st != BG_OK) {
        free(map);
        return st;
    }
    int unit = cost.act == 0 && cost.grad == 0;
    for (int i = 0; i < p * v; i++)
        unit &= cost.f[i] == 1 && cost.b[i] == 1 && cost.w[i] == 1;
    bg_schedule_t *best = NULL;
    double best_t = INFINITY;
    int best_fits = 0;
    /* a losing candidate's program set is emptied and refilled by the next
     * candidate (same ranks, map and sizes), so its memory is touched once */
    bg_schedule_t *spare = NULL, *spare_u = NULL;
    bg__policy_t pol = {0};
    pol.window = malloc(sizeof(int) * (size_t)p);
    pol.cap = malloc(sizeof(int) * (size_t)p);
    pol.peak = malloc(sizeof(int) * (size_t)p);
    if (!pol.window || !pol.cap || !pol.peak) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate the generator policy");
        goto out;
    }
    bg__seq_fn seq;
    /* every candidate twice when the costs are not unit costs: the list
     * scheduler deciding under the costs (a), and its unit-cost decisions
     * re-timed under the costs (b), as a greedy choice can be myopic */
    for (int k = 0, pass = 0; bg__candidate(kind, p, m, v, k, &pol, &seq); pass = !pass && !unit && !seq,
             k += !pass) {
        bg_schedule_t *s = spare, *u = spare_u;
        spare = NULL;
        if (!s) {
            BG_CHECK_GOTO(bg__schedule_alloc(name, kind, p, m, v, map, &s), st, out);
            s->copies = copies;
            bg__schedule_reserve_generated(s);
        }
        if (pass) {
            if (!u && (st = bg__schedule_alloc(name, kind, p, m, v, map, &u)) == BG_OK) {
                u->copies = copies;
                bg__schedule_reserve_generated(u);
            }
            spare_u = u;
            if (st == BG_OK)
                st = bg__run(u, &pol, &unitc);
            if (st == BG_OK)
                st = bg__run_seq(s, &pol, NULL, u, &cost);
            if (u)
                bg__schedule_clear(u);
        } else {
            st = seq ? bg__run_seq(s, &pol, seq, NULL, &cost) : bg__run(s, &pol, &cost);
        }
        if (st == BG_ERR_DEADLOCK) { /* this fixed order cannot run for p, m: not a candidate */
            bg__schedule_clear(s);
            spare = s;
            st = BG_OK;
            continue;
        }
        if (st != BG_OK) {
            bg_schedule_free(s);
            goto out;
        }
        int fits = 1;
        for (int r = 0; r < p; r++)
            fits &= pol.peak[r] <= bg__bound(kind, p, m, v, r);
        if ((fits && !best_fits) || (fits == best_fits && pol.makespan < best_t)) {
            bg_log(BG_LOG_DEBUG, "schedule", "%s p=%d m=%d v=%d: candidate %d%s step %g%s", name, p, m, v, k,
                   pass ? " (unit-cost order)" : "", pol.makespan, fits ? "" : " (over the stash bound)");
            if (best)
                bg__schedule_clear(best);
            spare = best;
            best = s, best_t = pol.makespan, best_fits = fits;
        } else {
            bg__schedule_clear(s);
            spare = s;
        }
    }
    if (!best)
        st = bg_error(BG_ERR_INTERNAL, "%s: no order of the family runs for p=%d m=%d v=%d", name, p, m, v);
out:
    bg_schedule_free(spare);
    bg_schedule_free(spare_u);
    free(map);
    free(cost.f);
    free(unitc.f);
    free(pol.window);
    free(pol.cap);
    free(pol.peak);
    if (st != BG_OK) {
        bg_schedule_free(best);
        return st;
    }
    *sched_p = best;
    return BG_OK;
}
