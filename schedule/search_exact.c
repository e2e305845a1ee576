/* schedule/search_exact.c: bg_schedule_search_exact, the optimal program of
 * a small one-chunk or V layout under a memory limit, by branch and bound.
 *
 * Owns: the enumeration of every program (each rank's order of F, b, W, each
 * stage taking its microbatches in order, run as soon as each op's inputs
 * are there, as the simulator runs it), its lower bound per node, the node
 * budget and what is proved when the budget stops it.
 * Must not: be used for large p, m (the space grows factorially; the caller
 * gives a budget) nor model what the simulator does not: messages take a
 * fixed latency (no bandwidth queue). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/generate_impl.h"
#include "schedule/schedule_impl.h"

#define BG__EPS 1e-9
#define BG__EXACT_MAXS 16  /* stages */
#define BG__EXACT_MAXOPS 600 /* compute ops: the recursion's depth */

typedef struct {
    int p, S, m, v;
    const int *rank_of, *chunk_stage;
    const double *f, *b, *w, *sb;
    double *d_in, *d_back;       /* [S] message delay into stage s from s-1 / from s+1 */
    double lim;                  /* stash limit per rank (INFINITY: none) */
    int *nf, *nb, *nw;           /* [S] next microbatch of each kind */
    double *fe, *be;             /* [S*m] end of F, b */
    double *fr, *stash, *rem;    /* [p] rank free at, stash, work left */
    double *es;                  /* [2*S*m + p] scratch of the bound */
    double *rt;                  /* [S] the shortest a microbatch holds its stash on a stage: its F there to
                                    its W there, through the rest of the chain and back */
    int *slots;                  /* [S] microbatches the rank's limit holds when it has this stage only; else 0 */
    int *path, *best_path, npath;/* (kind, stage, mb) triples in start order */
    double best;                 /* smallest step found (or given) */
    int found;                   /* best_path holds a program of step best */
    long long nodes, budget;
    int stopped;
    double open;                 /* smallest bound of the subtrees left when stopped */
} bg__bb_t;

/* a lower bound of every completion of the node: each op no earlier than
 * its inputs, its stage's previous microbatch, its rank's free time and the
 * last start (ops are placed in start order); each rank's work left */
static double bg__bb_bound(bg__bb_t *q, double last)
{
    int S = q->S, m = q->m;
    double lb = 0;
    double *ef = q->es, *eb = q->es + (size_t)S * m, *lo_r = q->es + 2 * (size_t)S * m;
    for (int r = 0; r < q->p; r++)
        lo_r[r] = INFINITY; /* the earliest start of the rank's work left */
    for (int s = 0; s < S; s++) {
        double lo = q->fr[q->rank_of[s]] > last ? q->fr[q->rank_of[s]] : last, prev = lo;
        for (int i = 0; i < m; i++) {
            if (i < q->nf[s]) {
                ef[s * m + i] = q->fe[s * m + i];
                continue;
            }
            double t = prev;
            if (s > 0 && ef[(s - 1) * m + i] + q->d_in[s] > t)
                t = ef[(s - 1) * m + i] + q->d_in[s];
            if (t < lo_r[q->rank_of[s]])
                lo_r[q->rank_of[s]] = t;
            ef[s * m + i] = t + q->f[s];
            prev = ef[s * m + i];
        }
    }
    for (int s = S - 1; s >= 0; s--) {
        double lo = q->fr[q->rank_of[s]] > last ? q->fr[q->rank_of[s]] : last, prev = lo;
        for (int i = 0; i < m; i++) {
            if (i < q->nb[s]) {
                eb[s * m + i] = q->be[s * m + i];
                continue;
            }
            double t = prev > ef[s * m + i] ? prev : ef[s * m + i];
            if (s < S - 1 && eb[(s + 1) * m + i] + q->d_back[s] > t)
                t = eb[(s + 1) * m + i] + q->d_back[s];
            if (t < lo_r[q->rank_of[s]])
                lo_r[q->rank_of[s]] = t;
            eb[s * m + i] = t + q->b[s];
            prev = eb[s * m + i];
            if (i >= q->nw[s] && eb[s * m + i] + q->w[s] > lb) /* its W still to run */
                lb = eb[s * m + i] + q->w[s];
        }
        if (q->nw[s] < q->nb[s]) { /* the W's of b's already run, in order */
            double t = lo;
            double w0 = q->be[s * m + q->nw[s]] > lo ? q->be[s * m + q->nw[s]] : lo;
            if (w0 < lo_r[q->rank_of[s]])
                lo_r[q->rank_of[s]] = w0;
            for (int i = q->nw[s]; i < q->nb[s]; i++)
                t = (q->be[s * m + i] > t ? q->be[s * m + i] : t) + q->w[s];
            if (t > lb)
                lb = t;
        }
    }
    for (int r = 0; r < q->p; r++) /* each rank's work left, from its earliest start */
        if (q->rem[r] > 0 && lo_r[r] + q->rem[r] > lb)
            lb = lo_r[r] + q->rem[r];
    if (q->lim < INFINITY) { /* memory: what is not yet forwarded holds its stash at least rt[] each */
        double *area = lo_r; /* reused: [p] stash x time still to hold */
        for (int r = 0; r < q->p; r++)
            area[r] = 0;
        for (int st = 0; st < S; st++) {
            int k = m - q->nf[st], r = q->rank_of[st];
            area[r] += k * q->sb[st] * q->rt[st];
            if (k > 0 && q->slots[st] > 0) { /* one stage on the rank: slots of whole microbatches */
                double t = last + ceil((double)k / q->slots[st]) * q->rt[st];
                lb = t > lb ? t : lb;
            }
        }
        for (int r = 0; r < q->p; r++)
            if (area[r] > 0 && last + area[r] / q->lim > lb)
                lb = last + area[r] / q->lim;
    }
    return lb;
}

typedef struct {
    double t;
    int kind, stage, r;
} bg__cand_t;

static int bg__cand_cmp(const void *a, const void *b)
{
    const bg__cand_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    if (x->kind != y->kind) /* b before F before W: the critical path first */
        return x->kind == BG_OP_BACKWARD_INPUT ? -1 : y->kind == BG_OP_BACKWARD_INPUT ? 1
               : x->kind == BG_OP_FORWARD ? -1 : 1;
    return x->r - y->r;
}

/* candidates of the node: every op whose inputs are placed and whose start
 * keeps the (start, rank) order of the ops placed so far */
static int bg__bb_cands(const bg__bb_t *q, double last, int last_r, bg__cand_t *c)
{
    int n = 0, m = q->m;
    for (int s = 0; s < q->S; s++) {
        int r = q->rank_of[s];
        double fr = q->fr[r];
        int i = q->nf[s];
        if (i < m && (s == 0 || q->nf[s - 1] > i) && q->stash[r] + q->sb[s] <= q->lim * (1 + 1e-12)) {
            double t = s == 0 ? 0 : q->fe[(s - 1) * m + i] + q->d_in[s];
            c[n++] = (bg__cand_t){t > fr ? t : fr, BG_OP_FORWARD, s, r};
        }
        i = q->nb[s];
        if (i < q->nf[s] && (s == q->S - 1 || q->nb[s + 1] > i)) {
            double t = q->fe[s * m + i];
            if (s < q->S - 1 && q->be[(s + 1) * m + i] + q->d_back[s] > t)
                t = q->be[(s + 1) * m + i] + q->d_back[s];
            c[n++] = (bg__cand_t){t > fr ? t : fr, BG_OP_BACKWARD_INPUT, s, r};
        }
        i = q->nw[s];
        if (i < q->nb[s]) {
            double t = q->be[s * m + i];
            c[n++] = (bg__cand_t){t > fr ? t : fr, BG_OP_BACKWARD_WEIGHT, s, r};
        }
    }
    int k = 0;
    for (int j = 0; j < n; j++)
        if (c[j].t > last + BG__EPS || (c[j].t >= last - BG__EPS && c[j].r > last_r))
            c[k++] = c[j];
    qsort(c, (size_t)k, sizeof *c, bg__cand_cmp);
    return k;
}

static void bg__bb_dfs(bg__bb_t *q, double last, int last_r, double end, double plb, int left)
{
    if (left == 0) {
        if (end < q->best - BG__EPS) {
            q->best = end, q->found = 1;
            memcpy(q->best_path, q->path, sizeof(int) * 3 * (size_t)q->npath);
        }
        return;
    }
    double lb = bg__bb_bound(q, last);
    if (lb < end)
        lb = end;
    if (lb < plb) /* the parent's bound holds for its every child */
        lb = plb;
    if (lb >= q->best - BG__EPS)
        return;
    if (++q->nodes > q->budget) {
        q->stopped = 1;
        q->open = lb < q->open ? lb : q->open;
        return;
    }
    bg__cand_t c[3 * BG__EXACT_MAXS];
    int n = bg__bb_cands(q, last, last_r, c), m = q->m;
    for (int k = 0; k < n && !q->stopped; k++) {
        int s = c[k].stage, r = c[k].r, i;
        double t = c[k].t, fr = q->fr[r], d;
        if (c[k].kind == BG_OP_FORWARD)
            i = q->nf[s]++, d = q->f[s], q->fe[s * m + i] = t + d, q->stash[r] += q->sb[s];
        else if (c[k].kind == BG_OP_BACKWARD_INPUT)
            i = q->nb[s]++, d = q->b[s], q->be[s * m + i] = t + d;
        else
            i = q->nw[s]++, d = q->w[s], q->stash[r] -= q->sb[s];
        q->fr[r] = t + d, q->rem[r] -= d;
        int *e = &q->path[3 * q->npath++];
        e[0] = c[k].kind, e[1] = s, e[2] = i;
        bg__bb_dfs(q, t, r, end > t + d ? end : t + d, lb, left - 1);
        q->npath--;
        q->fr[r] = fr, q->rem[r] += d;
        if (c[k].kind == BG_OP_FORWARD)
            q->nf[s]--, q->stash[r] -= q->sb[s];
        else if (c[k].kind == BG_OP_BACKWARD_INPUT)
            q->nb[s]--;
        else
            q->nw[s]--, q->stash[r] += q->sb[s];
    }
    if (q->stopped)
        q->open = lb < q->open ? lb : q->open;
}

/* the program of the order found, built by the list scheduler (which runs
 * each rank's order as soon as it can, as the enumeration timed it) */
static bg_status_t bg__bb_program(const bg__bb_t *q, const bg_schedule_search_params_t *sp, const int *map,
                                  const bg__costs_t *cost, bg_schedule_t **s_p)
{
    int p = q->p, N = 3 * q->S * q->m;
    bg_schedule_t *s;
    BG_CHECK(bg__schedule_alloc("exact", BG_SCHED_CUSTOM, p, q->m, sp->chunks, map, &s));
    bg__policy_t pol = {0};
    bg_status_t st = BG_OK;
    pol.seq = calloc((size_t)p, sizeof(int *));
    pol.seqlen = calloc((size_t)p, sizeof(int));
    pol.peak = calloc((size_t)p, sizeof(int));
    if (!pol.seq || !pol.seqlen || !pol.peak) {
        st = bg_error(BG_ERR_NOMEM, "exact schedule search: the program's order");
        goto out;
    }
    for (int r = 0; r < p; r++)
        if (!(pol.seq[r] = malloc(sizeof(int) * 3 * (size_t)N))) {
            st = bg_error(BG_ERR_NOMEM, "exact schedule search: the program's order");
            goto out;
        }
    for (int k = 0; k < N; k++) {
        const int *e = &q->best_path[3 * k];
        int r = q->rank_of[e[1]];
        bg__push(pol.seq[r], &pol.seqlen[r], e[0], e[1], e[2]);
    }
    st = bg__run(s, &pol, cost);
out:
    if (pol.seq)
        for (int r = 0; r < p; r++)
            free(pol.seq[r]);
    free(pol.seq), free(pol.seqlen), free(pol.peak);
    if (st != BG_OK) {
        bg_schedule_free(s);
        return st == BG_ERR_DEADLOCK ? bg_error(BG_ERR_INTERNAL, "exact schedule search: its order stalls") : st;
    }
    *s_p = s;
    return BG_OK;
}

bg_status_t bg_schedule_search_exact(const bg_schedule_search_params_t *sp, const bg_schedule_exact_params_t *xp,
                                     bg_schedule_exact_result_t *res, bg_schedule_t **sched_p)
{
    bg_schedule_exact_params_t dflt = BG_SCHEDULE_EXACT_PARAMS_INIT;
    if (!xp)
        xp = &dflt;
    if (xp->size < sizeof(bg_schedule_exact_params_t))
        return bg_error(BG_ERR_INVALID, "bg_schedule_search_exact: exact params not initialised with "
                                        "BG_SCHEDULE_EXACT_PARAMS_INIT");
    long long max_nodes = xp->max_nodes;
    if (!sp || sp->size < sizeof(bg_schedule_search_params_t) || !res || !sched_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_search_exact: params missing or not initialised with "
                                        "BG_SCHEDULE_SEARCH_PARAMS_INIT");
    int p = sp->stages, m = sp->microbatches, v = sp->chunks, S = p * v;
    if (!(v == 1 || (v == 2 && sp->vshape)))
        return bg_error(BG_ERR_INVALID, "exact schedule search: one chunk per rank or the V (got %d chunks%s)", v,
                        sp->vshape ? ", V" : ", interleaved");
    if (p < 1 || m < 1 || S > BG__EXACT_MAXS || 3LL * S * m > BG__EXACT_MAXOPS)
        return bg_error(BG_ERR_INVALID, "exact schedule search: %d stages x %d microbatches is %lld compute ops; it "
                                        "enumerates at most %d stages and %d ops (use the heuristic search)",
                        S, m, 3LL * S * m, BG__EXACT_MAXS, BG__EXACT_MAXOPS);
    if (max_nodes < 1)
        return bg_error(BG_ERR_INVALID, "exact schedule search: node budget %lld (expected >= 1)", max_nodes);
    bg_sim_params_t sim = BG_SIM_PARAMS_INIT;
    if (sp->costs) {
        size_t n = sp->costs->size < sizeof sim ? sp->costs->size : sizeof sim;
        memcpy(&sim, sp->costs, n);
        sim.size = sizeof sim;
    }
    if (sim.bandwidth > 0 && (sim.act_bytes > 0 || sim.grad_bytes > 0))
        return bg_error(BG_ERR_INVALID, "exact schedule search: it models a fixed latency per message; a finite "
                                        "bandwidth (%g) queues messages on a link", sim.bandwidth);
    /* the heuristic search first: its program is the bound to beat */
    bg_schedule_search_result_t hr;
    bg_schedule_t *hs = NULL;
    bg_status_t st = bg_schedule_search(sp, &hr, &hs);
    if (st != BG_OK)
        return st;
    if (!sim.stash_bytes_per_stage && sim.stash_bytes == 0)
        sim.stash_bytes = 1;
    bg__costs_t cost = {0};
    st = bg__costs_init(&cost, &sim, S);
    if (st != BG_OK) {
        bg_schedule_free(hs);
        return st;
    }
    for (int i = 0; i < S; i++)
        if (!(cost.f[i] > 0 && cost.b[i] > 0 && cost.w[i] > 0)) {
            st = bg_error(BG_ERR_INVALID, "exact schedule search: stage %d has a zero cost (every F, b, W must "
                                          "take time: ops are enumerated in start order)", i);
            free(cost.f);
            bg_schedule_free(hs);
            return st;
        }
    bg__bb_t q = {.p = p, .S = S, .m = m, .v = v, .f = cost.f, .b = cost.b, .w = cost.w,
                  .lim = sp->mem_limit > 0 ? sp->mem_limit : INFINITY, .budget = max_nodes, .open = INFINITY,
                  .best = xp->seed ? hr.step : INFINITY};
    int *map = malloc(sizeof(int) * (size_t)S), *rank_of = malloc(sizeof(int) * (size_t)S);
    int *cnt = calloc((size_t)S * 3, sizeof(int));
    double *dbl = calloc((size_t)S * 4 + (size_t)p * 4 + (size_t)S * m * 5, sizeof(double));
    int *slots = calloc((size_t)S, sizeof(int));
    int *paths = malloc(sizeof(int) * 6 * (size_t)(3 * S * m));
    if (!map || !rank_of || !cnt || !dbl || !paths || !slots) {
        st = bg_error(BG_ERR_NOMEM, "exact schedule search for %d stages x %d microbatches", S, m);
        goto out;
    }
    for (int r = 0; r < p; r++)
        for (int c = 0; c < v; c++) {
            int stg = sp->vshape ? (c == 0 ? r : 2 * p - 1 - r) : r;
            map[r * v + c] = stg, rank_of[stg] = r;
        }
    double *sb = dbl, *d = dbl + S;
    q.d_in = d, q.d_back = d + S;
    q.fr = dbl + 3 * S, q.stash = q.fr + p, q.rem = q.stash + p;
    q.fe = q.rem + p, q.be = q.fe + (size_t)S * m, q.es = q.be + (size_t)S * m;
    q.nf = cnt, q.nb = cnt + S, q.nw = cnt + 2 * S;
    q.path = paths, q.best_path = paths + 3 * (size_t)(3 * S * m);
    q.rank_of = rank_of, q.sb = sb, q.slots = slots, q.rt = q.es + 2 * (size_t)S * m + p;
    for (int i = 0; i < S; i++) {
        sb[i] = sim.stash_bytes_per_stage ? sim.stash_bytes_per_stage[i] : sim.stash_bytes;
        q.d_in[i] = i > 0 && rank_of[i - 1] != rank_of[i] ? cost.act : 0;
        q.d_back[i] = i < S - 1 && rank_of[i + 1] != rank_of[i] ? cost.grad : 0;
        q.rem[rank_of[i]] += m * (cost.f[i] + cost.b[i] + cost.w[i]);
    }
    for (int i = 0; i < S; i++) {
        double t = cost.f[i] + cost.w[i];
        for (int j = i + 1; j < S; j++)
            t += q.d_in[j] + cost.f[j];
        for (int j = S - 1; j >= i; j--)
            t += cost.b[j] + (j < S - 1 ? q.d_back[j] : 0);
        q.rt[i] = t;
        q.slots[i] = v == 1 && sb[i] > 0 && q.lim < INFINITY ? (int)floor(q.lim / sb[i] * (1 + 1e-12)) : 0;
    }
    bg__bb_dfs(&q, 0, -1, 0, 0, 3 * S * m);
    memset(res, 0, sizeof *res);
    if (!q.found || q.best > hr.step) /* the heuristic's program stays the best known */
        q.found = 0, q.best = hr.step;
    res->step = q.best;
    res->bound = q.stopped ? (q.open < q.best ? q.open : q.best) : q.best;
    if (res->bound < hr.lower_bound) /* both bounds hold: keep the better */
        res->bound = hr.lower_bound;
    res->proved = !q.stopped;
    res->nodes = q.nodes > max_nodes ? max_nodes : q.nodes;
    res->heuristic_step = hr.step;
    res->lower_bound = hr.lower_bound;
    res->peak = hr.peak;
    snprintf(res->from, sizeof res->from, "%s", q.found ? "branch and bound" : hr.from);
    if (q.found) {
        bg_schedule_t *s = NULL;
        BG_CHECK_GOTO(bg__bb_program(&q, sp, map, &cost, &s), st, out);
        bg_sim_result_t *sr = NULL;
        st = bg_schedule_simulate(s, &sim, &sr);
        if (st != BG_OK) {
            bg_schedule_free(s);
            goto out;
        }
        double step = bg_sim_step_time(sr), peak = 0;
        for (int r = 0; r < p; r++)
            peak = bg_sim_peak_stash_bytes(sr, r) > peak ? bg_sim_peak_stash_bytes(sr, r) : peak;
        bg_sim_result_free(sr);
        if (fabs(step - q.best) > 1e-9 * (1 + q.best)) {
            bg_schedule_free(s);
            st = bg_error(BG_ERR_INTERNAL, "exact schedule search: its order takes %g, the simulator says %g",
                          q.best, step);
            goto out;
        }
        res->peak = peak;
        bg_schedule_free(hs);
        hs = s;
    }
    *sched_p = hs;
    hs = NULL;
out:
    bg_schedule_free(hs);
    free(cost.f), free(map), free(rank_of), free(cnt), free(dbl), free(paths), free(slots);
    return st;
}
