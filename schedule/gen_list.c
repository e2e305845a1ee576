/* schedule/gen_list.c: the generators' list scheduler (see generate.c for
 * the machinery as a whole).
 *
 * Owns: running a policy (or a fixed per-rank order) under per-stage costs
 * and a link delay, event by event, with every dependency of the chains of
 * stages; inserting the communication ops around each compute op; the step
 * time and per-rank peak stash of what it built; the costs read from the
 * simulator's inputs.
 * Must not: choose among candidates or know any family's order (generate.c,
 * gen_orders.c, gen_dualpipe.c call it; it calls none of them). */
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
    const bg_schedule_t *s;
    const bg__costs_t *c;
    int S, M;
    int *nf, *nb, *nw;          /* [S] next microbatch of F, B (or full), W per stage */
    double *f_end, *b_end;      /* [S*M] end times */
    /* per stage, from the schedule's chains and stage map (read at every
     * event: kept apart from the divisions that derive them) */
    int *mb_end;                /* [S] one past the last microbatch through the stage */
    unsigned char *first, *last; /* [S] the stage begins / ends its chain */
    double *d_in, *d_back;      /* [S] delay of the activation from st - 1 / the gradient from st + 1 */
} bg__gen_t;

/* times are sums of the same costs in the same order, so equal times compare
 * equal; the slack only absorbs rounding when a cost is tiny */
#define BG__LE(a, t) ((a) <= (t) + 1e-12 * (1.0 + fabs(t)))

/* when the input of the next forward of stage st is there (-1: not produced yet) */
static inline double bg__f_at(const bg__gen_t *g, int st)
{
    int i = g->nf[st];
    if (i >= g->mb_end[st])
        return -1;
    if (g->first[st])
        return 0;
    if (g->nf[st - 1] <= i)
        return -1;
    return g->f_end[(size_t)(st - 1) * g->M + i] + g->d_in[st];
}

/* when the next backward (-input) of stage st has its gradient and stash (-1: not yet) */
static inline double bg__b_at(const bg__gen_t *g, int st)
{
    int i = g->nb[st];
    if (i >= g->mb_end[st] || g->nf[st] <= i)
        return -1;
    double own = g->f_end[(size_t)st * g->M + i];
    if (g->last[st])
        return own;
    if (g->nb[st + 1] <= i)
        return -1;
    double in = g->b_end[(size_t)(st + 1) * g->M + i] + g->d_back[st];
    return in > own ? in : own;
}

/* The per-stage tables of g (bg__gen_t); 0 when out of memory. */
static int bg__gen_tables(bg__gen_t *g)
{
    const bg_schedule_t *s = g->s;
    int S = g->S;
    g->mb_end = malloc(sizeof(int) * (size_t)S);
    g->first = malloc((size_t)S * 2);
    g->d_in = malloc(sizeof(double) * (size_t)S * 2);
    if (!g->mb_end || !g->first || !g->d_in)
        return 0;
    g->last = g->first + S;
    g->d_back = g->d_in + S;
    for (int st = 0; st < S; st++) {
        g->mb_end[st] = bg__mb_first(s, st) + bg__mb_count(s);
        g->first[st] = (unsigned char)bg__chain_first(s, st);
        g->last[st] = (unsigned char)bg__chain_last(s, st);
        /* the same expressions as a delay read at the event: 0 or the link's */
        g->d_in[st] = !g->first[st] && s->stage_rank[st - 1] != s->stage_rank[st] ? g->c->act : 0;
        g->d_back[st] = !g->last[st] && s->stage_rank[st + 1] != s->stage_rank[st] ? g->c->grad : 0;
    }
    return 1;
}

static int bg__f_ready(const bg__gen_t *g, int st, double t)
{
    double a = bg__f_at(g, st);
    return a >= 0 && BG__LE(a, t);
}

static int bg__b_ready(const bg__gen_t *g, int st, double t)
{
    double a = bg__b_at(g, st);
    return a >= 0 && BG__LE(a, t);
}

static int bg__w_ready(const bg__gen_t *g, int st, double t)
{
    int i = g->nw[st];
    return i < g->nb[st] && BG__LE(g->b_end[(size_t)st * g->M + i], t);
}

/* smaller key = preferred. Forward: earlier group, then lower chunk (interleaved)
 * or deeper stage (V-shape), then microbatch. Backward: mirror image. */
static long long bg__key(const bg__gen_t *g, const bg__policy_t *pol, int st, int mb, int backward)
{
    const bg_schedule_t *s = g->s;
    int c = s->stage_chunk[st];
    if (pol->group > 0) {
        long long grp = mb / pol->group;
        int co = backward ? s->v - 1 - c : c;
        return (grp * s->v + co) * (long long)g->M + mb;
    }
    /* oldest microbatch first; among equals the deeper stage */
    return (long long)mb * g->S + (g->S - 1 - st);
}

/* reserve: can rank r start the forward of stage st now (chunk 0 admits
 * the microbatch with room for all the rank's chunks; later chunks use the
 * room reserved for them) */
static int bg__admit(const bg_schedule_t *s, const bg__policy_t *pol, int r, int st, int stash, int resv,
                     double stash_b, double resv_b)
{
    double all = 0, one = pol->sb ? pol->sb[st] : 0;
    if (pol->reserve == 2) { /* keep room for one later chunk's forward only */
        int c = s->stage_chunk[st];
        double spare = c + 1 < s->v && pol->sb ? pol->sb[s->chunk_stage[r * s->v + c + 1]] : 0;
        return stash + 1 + (c + 1 < s->v) <= pol->cap[r] &&
               (!pol->sb || BG__LE(stash_b + one + spare, pol->capb[r]));
    }
    if (s->stage_chunk[st] > 0)
        return 1;
    for (int c = 0; c < s->v; c++)
        all += pol->sb ? pol->sb[s->chunk_stage[r * s->v + c]] : 0;
    return stash + resv + s->v <= pol->cap[r] && (!pol->sb || BG__LE(stash_b + resv_b + all, pol->capb[r]));
}

static bg_status_t bg__emit(bg_schedule_t *s, int r, int kind, int mb, int st)
{
    int c = s->stage_chunk[st];
    int has_prev = !bg__chain_first(s, st), has_next = !bg__chain_last(s, st);
    bg_sched_op_t op = {kind, mb, c, st, -1, -1};
    if (kind == BG_OP_FORWARD && has_prev && s->stage_rank[st - 1] != r) {
        bg_sched_op_t rc = {BG_OP_RECV_ACT, mb, c, st, st - 1, s->stage_rank[st - 1]};
        BG_CHECK(bg__schedule_push(s, r, &rc));
    }
    if ((kind == BG_OP_BACKWARD || kind == BG_OP_BACKWARD_INPUT) && has_next && s->stage_rank[st + 1] != r) {
        bg_sched_op_t rc = {BG_OP_RECV_GRAD, mb, c, st, st + 1, s->stage_rank[st + 1]};
        BG_CHECK(bg__schedule_push(s, r, &rc));
    }
    BG_CHECK(bg__schedule_push(s, r, &op));
    if (kind == BG_OP_FORWARD && has_next && s->stage_rank[st + 1] != r) {
        bg_sched_op_t sd = {BG_OP_SEND_ACT, mb, c, st, st + 1, s->stage_rank[st + 1]};
        BG_CHECK(bg__schedule_push(s, r, &sd));
    }
    if ((kind == BG_OP_BACKWARD || kind == BG_OP_BACKWARD_INPUT) && has_prev && s->stage_rank[st - 1] != r) {
        bg_sched_op_t sd = {BG_OP_SEND_GRAD, mb, c, st, st - 1, s->stage_rank[st - 1]};
        BG_CHECK(bg__schedule_push(s, r, &sd));
    }
    return BG_OK;
}

/* gradients reduced and parameters updated once per chunk, after everything */
static bg_status_t bg__tail(bg_schedule_t *s)
{
    for (int r = 0; r < s->p; r++)
        for (int k = 0; k < 2; k++)
            for (int c = 0; c < s->v; c++) {
                bg_sched_op_t op = {k ? BG_OP_OPTIMIZER_STEP : BG_OP_REDUCE_GRADS, -1, c,
                                    s->chunk_stage[r * s->v + c], -1, -1};
                BG_CHECK(bg__schedule_push(s, r, &op));
            }
    return BG_OK;
}

/* Run the policy as a list scheduler under the costs, appending the program
 * to s. BG_ERR_DEADLOCK (no message) when a fixed order cannot run. */
bg_status_t bg__run(bg_schedule_t *s, bg__policy_t *pol, const bg__costs_t *cost)
{
    bg_status_t st = BG_OK;
    int p = s->p, v = s->v, S = s->nstages, M = s->m;
    bg__gen_t g = {.s = s, .c = cost, .S = S, .M = M};
    g.nf = calloc((size_t)S, sizeof(int));
    g.nb = calloc((size_t)S, sizeof(int));
    g.nw = calloc((size_t)S, sizeof(int));
    g.f_end = malloc(sizeof(double) * (size_t)S * (size_t)M);
    g.b_end = malloc(sizeof(double) * (size_t)S * (size_t)M);
    double *busy = calloc((size_t)p, sizeof(double));
    int *fdone = calloc((size_t)p, sizeof(int)), *inflight = calloc((size_t)p, sizeof(int));
    int *stash = calloc((size_t)p, sizeof(int));
    int *seqk = calloc((size_t)p, sizeof(int));
    double *stash_b = calloc((size_t)p, sizeof(double)), *resv_b = calloc((size_t)p, sizeof(double));
    int *resv = calloc((size_t)p, sizeof(int)); /* reserve: chunk-microbatches admitted, forward not yet run */
    int tables = bg__gen_tables(&g);
    if (!tables || !seqk || !stash_b || !resv_b || !resv || !g.nf || !g.nb || !g.nw || !g.f_end || !g.b_end ||
        !busy || !fdone || !inflight || !stash) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate the generator's state for %d stages x %d microbatches", S, M);
        goto out;
    }
    for (int r = 0; r < p; r++)
        pol->peak[r] = 0;
    for (int i = 0; i < S; i++) /* each stage from the first microbatch of its copy */
        g.nf[i] = g.nb[i] = g.nw[i] = bg__mb_first(s, i);
    int Mc = bg__mb_count(s); /* microbatches through each stage */
    long long remaining = (long long)S * Mc * (pol->split ? 3 : 2);
    if (pol->seq) { /* a fixed order may mix full and split backwards */
        remaining = 0;
        for (int r = 0; r < p; r++)
            remaining += pol->seqlen[r];
    }
    double t = 0;
    int relax = 0, free_links = cost->act == 0 && cost->grad == 0;
    while (remaining > 0) {
        int started = 0;
        for (int r = 0; r < p; r++) {
            if (!BG__LE(busy[r], t))
                continue;
            int kind = -1, sg = -1;
            if (pol->seq) {
                if (seqk[r] >= pol->seqlen[r])
                    continue;
                const int *q = &pol->seq[r][3 * seqk[r]];
                int ok = 0, want;
                if (q[0] == BG_OP_FORWARD)
                    ok = bg__f_ready(&g, q[1], t), want = g.nf[q[1]];
                else if (q[0] == BG_OP_BACKWARD_WEIGHT)
                    ok = bg__w_ready(&g, q[1], t), want = g.nw[q[1]];
                else
                    ok = bg__b_ready(&g, q[1], t), want = g.nb[q[1]];
                if (want != q[2]) {
                    st = bg_error(BG_ERR_INTERNAL, "%s generator: rank %d lists mb %d of stage %d out of order",
                                  s->name, r, q[2], q[1]);
                    goto out;
                }
                if (!ok)
                    continue;
                kind = q[0], sg = q[1];
                seqk[r]++;
                goto start;
            }
            int bf = -1, bb = -1, bw = -1;
            long long kf = LLONG_MAX, kb = LLONG_MAX, kw = LLONG_MAX;
            for (int c = 0; c < v; c++) {
                int sg = s->chunk_stage[r * v + c];
                if (bg__f_ready(&g, sg, t) &&
                    (!pol->reserve || relax || bg__admit(s, pol, r, sg, stash[r], resv[r], stash_b[r], resv_b[r]))) {
                    long long k = bg__key(&g, pol, sg, g.nf[sg], 0);
                    if (k < kf)
                        kf = k, bf = sg;
                }
                if (bg__b_ready(&g, sg, t)) {
                    long long k = bg__key(&g, pol, sg, g.nb[sg], 1);
                    if (k < kb)
                        kb = k, bb = sg;
                }
                if (pol->split && bg__w_ready(&g, sg, t)) {
                    long long k = bg__key(&g, pol, sg, g.nw[sg], 1);
                    if (k < kw)
                        kw = k, bw = sg;
                }
            }
            int f_ok = bf >= 0 && (relax || (inflight[r] < pol->window[r] &&
                                             (pol->reserve || (stash[r] < pol->cap[r] &&
                                              (!pol->sb || BG__LE(stash_b[r] + pol->sb[bf], pol->capb[r]))))));
            int b_ok = bb >= 0 && (relax || !pol->gpipe || fdone[r] == v * Mc);
            if (pol->fwd_first && f_ok)
                kind = BG_OP_FORWARD, sg = bf;
            else if (b_ok)
                kind = pol->split ? BG_OP_BACKWARD_INPUT : BG_OP_BACKWARD, sg = bb;
            else if (pol->w_first && bw >= 0)
                kind = BG_OP_BACKWARD_WEIGHT, sg = bw;
            else if (f_ok)
                kind = BG_OP_FORWARD, sg = bf;
            else if (bw >= 0)
                kind = BG_OP_BACKWARD_WEIGHT, sg = bw;
            if (kind < 0)
                continue;
        start:;
            size_t at;
            int mb;
            double dur;
            if (kind == BG_OP_FORWARD) {
                mb = g.nf[sg]++;
                at = (size_t)sg * M + mb;
                dur = cost->f[sg];
                g.f_end[at] = t + dur;
                fdone[r]++, inflight[r]++, stash[r]++;
                stash_b[r] += pol->sb ? pol->sb[sg] : 0;
                if (pol->reserve == 1 && s->stage_chunk[sg] > 0) /* its room was reserved at admission */
                    resv[r]--, resv_b[r] -= pol->sb ? pol->sb[sg] : 0;
                else if (pol->reserve == 1)
                    for (int c = 1; c < v; c++)
                        resv[r]++, resv_b[r] += pol->sb ? pol->sb[s->chunk_stage[r * v + c]] : 0;
                if (stash[r] > pol->peak[r])
                    pol->peak[r] = stash[r];
            } else if (kind == BG_OP_BACKWARD_WEIGHT) {
                mb = g.nw[sg]++;
                dur = cost->w[sg];
                stash[r]--;
                stash_b[r] -= pol->sb ? pol->sb[sg] : 0;
            } else {
                mb = g.nb[sg]++;
                at = (size_t)sg * M + mb;
                dur = kind == BG_OP_BACKWARD ? cost->b[sg] + cost->w[sg] : cost->b[sg];
                g.b_end[at] = t + dur;
                inflight[r]--;
                if (kind == BG_OP_BACKWARD) /* its weight gradient is done too */
                    stash[r]--, stash_b[r] -= pol->sb ? pol->sb[sg] : 0, g.nw[sg]++;
            }
            busy[r] = t + dur;
            remaining--;
            started = 1;
            BG_CHECK_GOTO(bg__emit(s, r, kind, mb, sg), st, out);
        }
        /* next event: the earliest end of a running op or arrival of a message.
         * With free links (no delay) a message arrives when the op that sends it
         * ends: a time after t is then the end of the op its rank runs, the same
         * double as busy[r], so the ranks' ends alone give the same minimum */
        double next = INFINITY;
        for (int r = 0; r < p; r++) {
            if (busy[r] > t && !BG__LE(busy[r], t) && busy[r] < next)
                next = busy[r];
            for (int c = 0; c < v && !free_links; c++) {
                int sg = s->chunk_stage[r * v + c];
                double a = bg__f_at(&g, sg), b = bg__b_at(&g, sg);
                if (a > t && !BG__LE(a, t) && a < next)
                    next = a;
                if (b > t && !BG__LE(b, t) && b < next)
                    next = b;
            }
        }
        if (next == INFINITY) {
            if (started)
                continue; /* zero-cost ops: look again at the same time */
            if (remaining > 0) {
                if (pol->seq) {
                    st = BG_ERR_DEADLOCK; /* the fixed order cannot run: the caller drops it */
                    goto out;
                }
                if (relax) {
                    st = bg_error(BG_ERR_INTERNAL, "schedule generator %s stalled at time %g", s->name, t);
                    goto out;
                }
                relax = 1; /* every rank is held by its window: let the best op through */
                continue;
            }
            break;
        }
        relax = 0;
        t = next;
    }
    pol->makespan = 0;
    for (int r = 0; r < p; r++)
        if (busy[r] > pol->makespan)
            pol->makespan = busy[r];
    st = bg__tail(s);
out:
    free(g.nf), free(g.nb), free(g.nw), free(g.f_end), free(g.b_end);
    free(g.mb_end), free(g.first), free(g.d_in);
    free(busy), free(fdone), free(inflight), free(stash), free(seqk), free(stash_b), free(resv_b), free(resv);
    return st;
}

void bg__push(int *q, int *n, int kind, int stage, int mb)
{
    q[3 * *n] = kind, q[3 * *n + 1] = stage, q[3 * *n + 2] = mb;
    (*n)++;
}

/* the compute order of rank r of another program (to re-time it under the costs) */
static void bg__seq_of(const bg_schedule_t *from, int r, int *q, int *n)
{
    for (size_t i = 0; i < from->nops[r]; i++) {
        const bg_sched_op_t *o = &from->ops[r][i];
        if (o->kind == BG_OP_FORWARD || o->kind == BG_OP_BACKWARD || o->kind == BG_OP_BACKWARD_INPUT ||
            o->kind == BG_OP_BACKWARD_WEIGHT)
            bg__push(q, n, o->kind, o->stage, o->microbatch);
    }
}

bg_status_t bg__run_as_listed(bg_schedule_t *s, const bg_schedule_t *from)
{
    for (int r = 0; r < s->p; r++)
        for (size_t i = 0; i < from->nops[r]; i++) {
            const bg_sched_op_t *o = &from->ops[r][i];
            if (o->kind == BG_OP_FORWARD || o->kind == BG_OP_BACKWARD || o->kind == BG_OP_BACKWARD_INPUT ||
                o->kind == BG_OP_BACKWARD_WEIGHT)
                BG_CHECK(bg__emit(s, r, o->kind, o->microbatch, o->stage));
        }
    return bg__tail(s);
}

/* run a fixed order (from build, or the compute order of the program from);
 * BG_ERR_DEADLOCK when it cannot run for this p, m */
bg_status_t bg__run_seq(bg_schedule_t *s, bg__policy_t *pol, bg__seq_fn build, const bg_schedule_t *from,
                               const bg__costs_t *cost)
{
    int p = s->p;
    size_t per = (size_t)3 * 3 * s->v * s->m;
    bg_status_t st = BG_OK;
    pol->seq = calloc((size_t)p, sizeof(int *));
    pol->seqlen = calloc((size_t)p, sizeof(int));
    if (!pol->seq || !pol->seqlen) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate the generator's order");
        goto out;
    }
    for (int r = 0; r < p; r++) {
        pol->seq[r] = malloc(sizeof(int) * per);
        if (!pol->seq[r]) {
            st = bg_error(BG_ERR_NOMEM, "cannot allocate the generator's order");
            goto out;
        }
        pol->seqlen[r] = 0;
        if (from)
            bg__seq_of(from, r, pol->seq[r], &pol->seqlen[r]);
        else
            build(s, r, pol->seq[r], &pol->seqlen[r]);
    }
    st = bg__run(s, pol, cost);
    if (st == BG_ERR_DEADLOCK)
        bg_log(BG_LOG_DEBUG, "schedule", "%s: fixed order stalls for p=%d m=%d", s->name, s->p, s->m);
out:
    if (pol->seq)
        for (int r = 0; r < p; r++)
            free(pol->seq[r]);
    free(pol->seq);
    free(pol->seqlen);
    pol->seq = NULL;
    pol->seqlen = NULL;
    return st;
}

/* per-stage costs (per chunk) and link delays from the simulator's inputs */
bg_status_t bg__costs_init(bg__costs_t *c, const bg_sim_params_t *sp, int S)
{
    c->f = malloc(sizeof(double) * (size_t)S * 3);
    BG_ALLOC_CHECK(c->f, sizeof(double) * (size_t)S * 3, "generator costs");
    c->b = c->f + S, c->w = c->f + 2 * S;
    for (int i = 0; i < S; i++) {
        c->f[i] = !sp ? 1 : sp->f_costs ? sp->f_costs[i] : sp->f_cost;
        c->b[i] = !sp ? 1 : sp->b_costs ? sp->b_costs[i] : sp->b_cost;
        c->w[i] = !sp ? 1 : sp->w_costs ? sp->w_costs[i] : sp->w_cost;
        if (!(c->f[i] >= 0 && c->b[i] >= 0 && c->w[i] >= 0 && isfinite(c->f[i] + c->b[i] + c->w[i]))) {
            double bad = !(c->f[i] >= 0) || !isfinite(c->f[i])   ? c->f[i]
                         : !(c->b[i] >= 0) || !isfinite(c->b[i]) ? c->b[i]
                                                                 : c->w[i];
            free(c->f);
            return bg_error(BG_ERR_INVALID, "schedule costs: stage %d has a cost of %g (costs must be finite and >= 0)",
                            i, bad);
        }
    }
    c->act = c->grad = 0;
    if (sp) {
        double bw = sp->bandwidth > 0 ? sp->bandwidth : INFINITY;
        c->act = sp->latency + sp->act_bytes / bw;
        c->grad = sp->latency + sp->grad_bytes / bw;
        if (!(c->act >= 0 && c->grad >= 0 && isfinite(c->act + c->grad))) {
            free(c->f);
            return bg_error(BG_ERR_INVALID, "schedule costs: the link delay (latency %g, %g / %g bytes at bandwidth %g) "
                                            "must be finite and >= 0", sp->latency, sp->act_bytes, sp->grad_bytes,
                            sp->bandwidth);
        }
    }
    return BG_OK;
}
