/* runtime/schedule/generate.c: the schedule generators (GPipe, 1F1B,
 * interleaved 1F1B, ZB-H1, ZB-H2, ZB-V).
 *
 * Every generator is one list scheduler run with unit costs (F = B = W = 1,
 * full backward 2, free links): at each time step an idle rank picks the
 * ready compute op its policy prefers (a window on in-flight forwards, a cap
 * on stashed microbatches, a priority between B, F and W, and an order among
 * chunks). Because the order comes from an execution that respects every
 * dependency, the programs are deadlock-free by construction for any p and m
 * (also m < p, or m not a multiple of p); the validator checks it anyway.
 * Communication ops are inserted around each compute op: the receive just
 * before its consumer, the send just after its producer. This file must not
 * depend on the simulator's cost model. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "runtime/schedule/schedule_impl.h"

typedef struct {
    int split;        /* B and W separate */
    int gpipe;        /* backwards only once the rank did all its forwards */
    int fwd_first;    /* F preferred over B */
    int group;        /* microbatch group for chunk ordering (interleaved: p); 0 = none */
    int *window;      /* [p] max forwards not yet backward(-input)ed */
    int *cap;         /* [p] max stashed microbatches (F done, W/full B not done) */
    /* strict mode: a fixed compute order per rank, run as is (NULL = greedy) */
    int **seq;        /* [p] lists of (kind, stage, microbatch) triples */
    int *seqlen;      /* [p] number of triples */
    long long makespan; /* out: unit-cost step time of the generated order */
} bg__policy_t;

typedef struct {
    const bg_schedule_t *s;
    int S, M;
    int *nf, *nb, *nw;          /* [S] next microbatch of F, B (or full), W per stage */
    long long *f_end, *b_end;   /* [S*M] end times */
} bg__gen_t;

static int bg__f_ready(const bg__gen_t *g, int st, long long t)
{
    int i = g->nf[st];
    if (i >= g->M)
        return 0;
    if (st == 0)
        return 1;
    return g->nf[st - 1] > i && g->f_end[(size_t)(st - 1) * g->M + i] <= t;
}

static int bg__b_ready(const bg__gen_t *g, int st, long long t)
{
    int i = g->nb[st];
    if (i >= g->M || g->nf[st] <= i || g->f_end[(size_t)st * g->M + i] > t)
        return 0;
    if (st == g->S - 1)
        return 1;
    return g->nb[st + 1] > i && g->b_end[(size_t)(st + 1) * g->M + i] <= t;
}

static int bg__w_ready(const bg__gen_t *g, int st, long long t)
{
    int i = g->nw[st];
    return i < g->nb[st] && g->b_end[(size_t)st * g->M + i] <= t;
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

static bg_status_t bg__emit(bg_schedule_t *s, int r, int kind, int mb, int st)
{
    int S = s->nstages;
    int c = s->stage_chunk[st];
    bg_sched_op_t op = {kind, mb, c, st, -1, -1};
    if (kind == BG_OP_FORWARD && st > 0 && s->stage_rank[st - 1] != r) {
        bg_sched_op_t rc = {BG_OP_RECV_ACT, mb, c, st, st - 1, s->stage_rank[st - 1]};
        BG_CHECK(bg_schedule_append(s, r, &rc));
    }
    if ((kind == BG_OP_BACKWARD || kind == BG_OP_BACKWARD_INPUT) && st < S - 1 && s->stage_rank[st + 1] != r) {
        bg_sched_op_t rc = {BG_OP_RECV_GRAD, mb, c, st, st + 1, s->stage_rank[st + 1]};
        BG_CHECK(bg_schedule_append(s, r, &rc));
    }
    BG_CHECK(bg_schedule_append(s, r, &op));
    if (kind == BG_OP_FORWARD && st < S - 1 && s->stage_rank[st + 1] != r) {
        bg_sched_op_t sd = {BG_OP_SEND_ACT, mb, c, st, st + 1, s->stage_rank[st + 1]};
        BG_CHECK(bg_schedule_append(s, r, &sd));
    }
    if ((kind == BG_OP_BACKWARD || kind == BG_OP_BACKWARD_INPUT) && st > 0 && s->stage_rank[st - 1] != r) {
        bg_sched_op_t sd = {BG_OP_SEND_GRAD, mb, c, st, st - 1, s->stage_rank[st - 1]};
        BG_CHECK(bg_schedule_append(s, r, &sd));
    }
    return BG_OK;
}

static bg_status_t bg__run(bg_schedule_t *s, bg__policy_t *pol)
{
    bg_status_t st = BG_OK;
    int p = s->p, v = s->v, S = s->nstages, M = s->m;
    bg__gen_t g = {.s = s, .S = S, .M = M};
    g.nf = calloc((size_t)S, sizeof(int));
    g.nb = calloc((size_t)S, sizeof(int));
    g.nw = calloc((size_t)S, sizeof(int));
    g.f_end = malloc(sizeof(long long) * (size_t)S * (size_t)M);
    g.b_end = malloc(sizeof(long long) * (size_t)S * (size_t)M);
    long long *busy = calloc((size_t)p, sizeof(long long));
    int *fdone = calloc((size_t)p, sizeof(int)), *inflight = calloc((size_t)p, sizeof(int));
    int *stash = calloc((size_t)p, sizeof(int));
    int *seqk = calloc((size_t)p, sizeof(int));
    if (!seqk || !g.nf || !g.nb || !g.nw || !g.f_end || !g.b_end || !busy || !fdone || !inflight || !stash) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate the generator's state for %d stages x %d microbatches", S, M);
        goto out;
    }
    long long remaining = (long long)S * M * (pol->split ? 3 : 2);
    long long t = 0;
    int relax = 0;
    while (remaining > 0) {
        int started = 0;
        for (int r = 0; r < p; r++) {
            if (busy[r] > t)
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
                if (bg__f_ready(&g, sg, t)) {
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
            int f_ok = bf >= 0 && (relax || (inflight[r] < pol->window[r] && stash[r] < pol->cap[r]));
            int b_ok = bb >= 0 && (relax || !pol->gpipe || fdone[r] == v * M);
            if (pol->fwd_first && f_ok)
                kind = BG_OP_FORWARD, sg = bf;
            else if (b_ok)
                kind = pol->split ? BG_OP_BACKWARD_INPUT : BG_OP_BACKWARD, sg = bb;
            else if (f_ok)
                kind = BG_OP_FORWARD, sg = bf;
            else if (bw >= 0)
                kind = BG_OP_BACKWARD_WEIGHT, sg = bw;
            if (kind < 0)
                continue;
        start:;
            size_t at;
            int mb;
            long long cost = 1;
            if (kind == BG_OP_FORWARD) {
                mb = g.nf[sg]++;
                at = (size_t)sg * M + mb;
                g.f_end[at] = t + 1;
                fdone[r]++, inflight[r]++, stash[r]++;
            } else if (kind == BG_OP_BACKWARD_WEIGHT) {
                mb = g.nw[sg]++;
                stash[r]--;
            } else {
                mb = g.nb[sg]++;
                at = (size_t)sg * M + mb;
                cost = kind == BG_OP_BACKWARD ? 2 : 1;
                g.b_end[at] = t + cost;
                inflight[r]--;
                if (kind == BG_OP_BACKWARD)
                    stash[r]--;
            }
            busy[r] = t + cost;
            remaining--;
            started = 1;
            BG_CHECK_GOTO(bg__emit(s, r, kind, mb, sg), st, out);
        }
        /* next event: the earliest end of a running op */
        long long next = LLONG_MAX;
        for (int r = 0; r < p; r++)
            if (busy[r] > t && busy[r] < next)
                next = busy[r];
        if (next == LLONG_MAX) {
            if (remaining > 0 && !started) {
                if (pol->seq) {
                    st = BG_ERR_DEADLOCK; /* the fixed order cannot run: the caller falls back */
                    goto out;
                }
                if (relax) {
                    st = bg_error(BG_ERR_INTERNAL, "schedule generator %s stalled at time %lld", s->name, t);
                    goto out;
                }
                relax = 1; /* every rank is held by its window: let the best op through */
                continue;
            }
            next = t + 1;
        }
        relax = 0;
        t = next;
    }
    pol->makespan = 0;
    for (int r = 0; r < p; r++)
        if (busy[r] > pol->makespan)
            pol->makespan = busy[r];
    /* gradients reduced and parameters updated once per chunk, after everything */
    for (int r = 0; r < p; r++) {
        for (int c = 0; c < v; c++) {
            int sg = s->chunk_stage[r * v + c];
            bg_sched_op_t op = {BG_OP_REDUCE_GRADS, -1, c, sg, -1, -1};
            BG_CHECK_GOTO(bg_schedule_append(s, r, &op), st, out);
        }
        for (int c = 0; c < v; c++) {
            int sg = s->chunk_stage[r * v + c];
            bg_sched_op_t op = {BG_OP_OPTIMIZER_STEP, -1, c, sg, -1, -1};
            BG_CHECK_GOTO(bg_schedule_append(s, r, &op), st, out);
        }
    }
out:
    free(g.nf), free(g.nb), free(g.nw), free(g.f_end), free(g.b_end);
    free(busy), free(fdone), free(inflight), free(stash), free(seqk);
    return st;
}

static int bg__imin(int a, int b) { return a < b ? a : b; }

static void bg__push(int *q, int *n, int kind, int stage, int mb)
{
    q[3 * *n] = kind, q[3 * *n + 1] = stage, q[3 * *n + 2] = mb;
    (*n)++;
}

/* Megatron's interleaved order on rank r: microbatches in groups of p (the
 * last group may be smaller), each group run through chunk 0, 1, ..; the
 * backward mirrors it with the chunks reversed; warm-up 2(p-r-1) + (v-1)p. */
static void bg__interleaved_mb(int k, int p, int v, int m, int backward, int *mb, int *c)
{
    int full = m / p, grp = k / (p * v);
    if (grp < full) {
        int w = k % (p * v);
        *c = w / p, *mb = grp * p + w % p;
    } else {
        int q = m - full * p, w = k - full * p * v;
        *c = w / q, *mb = full * p + w % q;
    }
    if (backward)
        *c = v - 1 - *c;
}

static void bg__seq_interleaved(const bg_schedule_t *s, int r, int *q, int *n)
{
    int p = s->p, v = s->v, m = s->m, total = v * m, mb, c;
    int warm = bg__imin((p - r - 1) * 2 + (v - 1) * p, total);
    for (int k = 0; k < warm; k++) {
        bg__interleaved_mb(k, p, v, m, 0, &mb, &c);
        bg__push(q, n, BG_OP_FORWARD, s->chunk_stage[r * v + c], mb);
    }
    for (int k = 0; k < total; k++) {
        if (k + warm < total) {
            bg__interleaved_mb(k + warm, p, v, m, 0, &mb, &c);
            bg__push(q, n, BG_OP_FORWARD, s->chunk_stage[r * v + c], mb);
        }
        bg__interleaved_mb(k, p, v, m, 1, &mb, &c);
        bg__push(q, n, BG_OP_BACKWARD, s->chunk_stage[r * v + c], mb);
    }
}

/* ZB-H1 on rank r: 1F1B's warm-up and F/B rhythm, with each W(i) issued
 * after B(i + r): the later the rank, the more W's it postpones, which fills
 * the cool-down bubble while keeping at most p microbatches stashed. */
static void bg__seq_zbh1(const bg_schedule_t *s, int r, int *q, int *n)
{
    int p = s->p, m = s->m, st = s->chunk_stage[r];
    int warm = bg__imin(p - r - 1, m);
    for (int i = 0; i < warm; i++)
        bg__push(q, n, BG_OP_FORWARD, st, i);
    for (int i = 0; i < m; i++) {
        if (i + warm < m)
            bg__push(q, n, BG_OP_FORWARD, st, i + warm);
        bg__push(q, n, BG_OP_BACKWARD_INPUT, st, i);
        if (i - r >= 0)
            bg__push(q, n, BG_OP_BACKWARD_WEIGHT, st, i - r);
    }
    for (int i = m - r > 0 ? m - r : 0; i < m; i++)
        bg__push(q, n, BG_OP_BACKWARD_WEIGHT, st, i);
}

/* run a fixed order; on BG_ERR_DEADLOCK (it cannot run for this p, m) the
 * schedule is reset for the greedy policy */
static bg_status_t bg__run_seq(bg_schedule_t *s, bg__policy_t *pol,
                               void (*build)(const bg_schedule_t *, int, int *, int *))
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
        build(s, r, pol->seq[r], &pol->seqlen[r]);
    }
    st = bg__run(s, pol);
    if (st == BG_ERR_DEADLOCK) {
        for (int r = 0; r < p; r++)
            s->nops[r] = 0;
        bg_log(BG_LOG_DEBUG, "schedule", "%s: fixed order stalls for p=%d m=%d, using the list scheduler", s->name,
               s->p, s->m);
    }
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

bg_status_t bg_schedule_generate(const bg_schedule_params_t *params, bg_schedule_t **sched_p)
{
    if (!params || params->size < sizeof(size_t) + sizeof(int) * 4 || !sched_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_generate: params missing or not initialised with "
                                        "BG_SCHEDULE_PARAMS_INIT");
    bg_schedule_kind_t kind = params->kind;
    const char *name = bg_schedule_kind_name(kind);
    int p = params->stages, m = params->microbatches, v = params->chunks;
    if (!name || kind == BG_SCHED_CUSTOM)
        return bg_error(BG_ERR_INVALID, "unknown schedule kind %d (expected gpipe, 1f1b, interleaved, zb-h1, "
                                        "zb-h2 or zbv)", (int)kind);
    if (p < 1)
        return bg_error(BG_ERR_INVALID, "%s: stages must be >= 1, got %d", name, p);
    if (m < 1)
        return bg_error(BG_ERR_INVALID, "%s: microbatches must be >= 1, got %d", name, m);
    if (p > 65536 || m > 1 << 22)
        return bg_error(BG_ERR_INVALID, "%s: %d stages x %d microbatches is larger than supported "
                                        "(stages <= 65536, microbatches <= 4194304)", name, p, m);
    if (kind == BG_SCHED_INTERLEAVED) {
        if (v == 0)
            v = 2;
        if (v < 2 || v > 64)
            return bg_error(BG_ERR_INVALID, "interleaved needs 2..64 chunks per rank, got %d%s", v,
                            v == 1 ? " (with one chunk per rank use 1f1b)" : "");
    } else if (kind == BG_SCHED_ZBV) {
        if (v == 0)
            v = 2;
        if (v != 2)
            return bg_error(BG_ERR_INVALID, "zbv places exactly 2 chunks per rank (a V), got %d chunks", v);
    } else {
        if (v == 0)
            v = 1;
        if (v != 1)
            return bg_error(BG_ERR_INVALID, "%s places one chunk per rank, got %d chunks "
                                            "(use interleaved or zbv for several)", name, v);
    }
    if ((long long)p * v * m > 50000000LL)
        return bg_error(BG_ERR_INVALID, "%s: %d stages x %d chunks x %d microbatches is more than the "
                                        "50M compute steps supported", name, p, v, m);

    int *map = NULL;
    if (kind == BG_SCHED_ZBV) {
        map = malloc(sizeof(int) * (size_t)p * 2);
        BG_ALLOC_CHECK(map, sizeof(int) * (size_t)p * 2, "stage map");
        for (int r = 0; r < p; r++)
            map[r * 2] = r, map[r * 2 + 1] = 2 * p - 1 - r;
    }
    bg_schedule_t *s;
    bg_status_t st = bg__schedule_alloc(name, kind, p, m, v, map, &s);
    free(map);
    if (st != BG_OK)
        return st;

    bg__policy_t pol = {0};
    pol.window = malloc(sizeof(int) * (size_t)p);
    pol.cap = malloc(sizeof(int) * (size_t)p);
    if (!pol.window || !pol.cap) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate the generator policy");
        goto out;
    }
    for (int r = 0; r < p; r++) {
        int big = v * m;
        switch (kind) {
        case BG_SCHED_GPIPE:
            pol.gpipe = pol.fwd_first = 1;
            pol.window[r] = pol.cap[r] = big;
            break;
        case BG_SCHED_1F1B:
            pol.window[r] = pol.cap[r] = bg__imin(p - r, m);
            break;
        case BG_SCHED_INTERLEAVED:
            pol.group = p;
            pol.window[r] = pol.cap[r] = bg__imin((p - r - 1) * 2 + (v - 1) * p + 1, big);
            break;
        case BG_SCHED_ZB_H1:
            pol.split = 1;
            pol.window[r] = bg__imin(p - r, m);
            pol.cap[r] = bg__imin(p, m);
            break;
        case BG_SCHED_ZB_H2:
            pol.split = 1;
            pol.window[r] = bg__imin(2 * (p - r) - 1, m);
            pol.cap[r] = bg__imin(2 * p - 1, m);
            break;
        case BG_SCHED_ZBV:
            pol.split = 1;
            /* found by search over windows and caps (p <= 8, m <= 24): the
             * smallest stash cap that gives idle (p-1)F per rank for m >= 2p */
            pol.window[r] = bg__imin(2 * p, big);
            pol.cap[r] = bg__imin(2 * p + 2, big);
            break;
        default:
            break;
        }
    }
    st = BG_ERR_DEADLOCK;
    if (kind == BG_SCHED_INTERLEAVED)
        st = bg__run_seq(s, &pol, bg__seq_interleaved);
    else if (kind == BG_SCHED_ZB_H1)
        st = bg__run_seq(s, &pol, bg__seq_zbh1);
    if (st == BG_ERR_DEADLOCK) {
        st = bg__run(s, &pol);
    } else if (st == BG_OK && kind == BG_SCHED_INTERLEAVED && m % p != 0) {
        /* Megatron's order is only tuned for p | m: keep the list scheduler's
         * program when it is faster */
        bg_schedule_t *alt;
        long long fixed = pol.makespan;
        BG_CHECK_GOTO(bg__schedule_alloc(name, kind, p, m, v, NULL, &alt), st, out);
        st = bg__run(alt, &pol);
        if (st == BG_OK && pol.makespan < fixed) {
            bg_schedule_free(s);
            s = alt;
        } else {
            bg_schedule_free(alt);
        }
    }
out:
    free(pol.window);
    free(pol.cap);
    if (st != BG_OK) {
        bg_schedule_free(s);
        return st;
    }
    *sched_p = s;
    return BG_OK;
}
