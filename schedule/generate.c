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
 * bg_schedule_search() (at the end) runs the same machinery over every
 * generator and list-scheduler policy of a layout under a memory limit and
 * lets the simulator pick. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/schedule_impl.h"

typedef struct {
    int split;        /* B and W separate */
    int gpipe;        /* backwards only once the rank did all its forwards */
    int fwd_first;    /* F preferred over B */
    int w_first;      /* W preferred over F (frees stash before taking more; the search tries it) */
    int group;        /* microbatch group for chunk ordering (interleaved: p); 0 = none */
    int *window;      /* [p] max forwards not yet backward(-input)ed */
    int *cap;         /* [p] max stashed microbatches (F done, W/full B not done) */
    const double *sb; /* [S] stash bytes of a microbatch on each stage, or NULL: no byte cap */
    double *capb;     /* [p] max stashed bytes (with sb) */
    /* strict mode: a fixed compute order per rank, run as is (NULL = greedy) */
    int **seq;        /* [p] lists of (kind, stage, microbatch) triples */
    int *seqlen;      /* [p] number of triples */
    double makespan;  /* out: step time of the generated order under the costs */
    int *peak;        /* out: [p] peak stashed chunk-microbatches */
} bg__policy_t;

/* the costs a program is built for (per virtual stage) and the link delay */
typedef struct {
    double *f, *b, *w; /* [S] */
    double act, grad;  /* delay of an activation / gradient message between two ranks */
} bg__costs_t;

typedef struct {
    const bg_schedule_t *s;
    const bg__costs_t *c;
    int S, M;
    int *nf, *nb, *nw;          /* [S] next microbatch of F, B (or full), W per stage */
    double *f_end, *b_end;      /* [S*M] end times */
} bg__gen_t;

/* times are sums of the same costs in the same order, so equal times compare
 * equal; the slack only absorbs rounding when a cost is tiny */
#define BG__LE(a, t) ((a) <= (t) + 1e-12 * (1.0 + fabs(t)))

/* when the input of the next forward of stage st is there (-1: not produced yet) */
static double bg__f_at(const bg__gen_t *g, int st)
{
    int i = g->nf[st];
    if (i >= bg__mb_first(g->s, st) + bg__mb_count(g->s))
        return -1;
    if (bg__chain_first(g->s, st))
        return 0;
    if (g->nf[st - 1] <= i)
        return -1;
    double d = g->s->stage_rank[st - 1] != g->s->stage_rank[st] ? g->c->act : 0;
    return g->f_end[(size_t)(st - 1) * g->M + i] + d;
}

/* when the next backward (-input) of stage st has its gradient and stash (-1: not yet) */
static double bg__b_at(const bg__gen_t *g, int st)
{
    int i = g->nb[st];
    if (i >= bg__mb_first(g->s, st) + bg__mb_count(g->s) || g->nf[st] <= i)
        return -1;
    double own = g->f_end[(size_t)st * g->M + i];
    if (bg__chain_last(g->s, st))
        return own;
    if (g->nb[st + 1] <= i)
        return -1;
    double d = g->s->stage_rank[st + 1] != g->s->stage_rank[st] ? g->c->grad : 0;
    double in = g->b_end[(size_t)(st + 1) * g->M + i] + d;
    return in > own ? in : own;
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

/* BG__PAIRED on a forward of a fixed order: it and the full backward after
 * it are a pair (DualPipe's F&B) that starts once both inputs are there: the
 * backward's recv_grad is placed before the forward */
#define BG__PAIRED 0x100

static bg_status_t bg__emit(bg_schedule_t *s, int r, int kind, int mb, int st, const int *pair, unsigned char *rg_done)
{
    int c = s->stage_chunk[st];
    int has_prev = !bg__chain_first(s, st), has_next = !bg__chain_last(s, st);
    bg_sched_op_t op = {kind, mb, c, st, -1, -1};
    if (pair && !bg__chain_last(s, pair[1]) && s->stage_rank[pair[1] + 1] != r) { /* the pair's gradient first */
        bg_sched_op_t rc = {BG_OP_RECV_GRAD, pair[2], s->stage_chunk[pair[1]], pair[1], pair[1] + 1,
                            s->stage_rank[pair[1] + 1]};
        BG_CHECK(bg_schedule_append(s, r, &rc));
        rg_done[(size_t)pair[1] * s->m + pair[2]] = 1;
    }
    if (kind == BG_OP_FORWARD && has_prev && s->stage_rank[st - 1] != r) {
        bg_sched_op_t rc = {BG_OP_RECV_ACT, mb, c, st, st - 1, s->stage_rank[st - 1]};
        BG_CHECK(bg_schedule_append(s, r, &rc));
    }
    if ((kind == BG_OP_BACKWARD || kind == BG_OP_BACKWARD_INPUT) && has_next && s->stage_rank[st + 1] != r &&
        !rg_done[(size_t)st * s->m + mb]) {
        bg_sched_op_t rc = {BG_OP_RECV_GRAD, mb, c, st, st + 1, s->stage_rank[st + 1]};
        BG_CHECK(bg_schedule_append(s, r, &rc));
    }
    BG_CHECK(bg_schedule_append(s, r, &op));
    if (kind == BG_OP_FORWARD && has_next && s->stage_rank[st + 1] != r) {
        bg_sched_op_t sd = {BG_OP_SEND_ACT, mb, c, st, st + 1, s->stage_rank[st + 1]};
        BG_CHECK(bg_schedule_append(s, r, &sd));
    }
    if ((kind == BG_OP_BACKWARD || kind == BG_OP_BACKWARD_INPUT) && has_prev && s->stage_rank[st - 1] != r) {
        bg_sched_op_t sd = {BG_OP_SEND_GRAD, mb, c, st, st - 1, s->stage_rank[st - 1]};
        BG_CHECK(bg_schedule_append(s, r, &sd));
    }
    return BG_OK;
}

/* Run the policy as a list scheduler under the costs, appending the program
 * to s. BG_ERR_DEADLOCK (no message) when a fixed order cannot run. */
static bg_status_t bg__run(bg_schedule_t *s, bg__policy_t *pol, const bg__costs_t *cost)
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
    double *stash_b = calloc((size_t)p, sizeof(double));
    unsigned char *rg_done = calloc((size_t)S * M, 1);
    if (!seqk || !stash_b || !rg_done || !g.nf || !g.nb || !g.nw || !g.f_end || !g.b_end || !busy || !fdone ||
        !inflight || !stash) {
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
    int relax = 0;
    while (remaining > 0) {
        int started = 0;
        for (int r = 0; r < p; r++) {
            if (!BG__LE(busy[r], t))
                continue;
            int kind = -1, sg = -1;
            const int *pair = NULL;
            if (pol->seq) {
                if (seqk[r] >= pol->seqlen[r])
                    continue;
                const int *q = &pol->seq[r][3 * seqk[r]];
                int ok = 0, want;
                if ((q[0] & ~BG__PAIRED) == BG_OP_FORWARD) {
                    ok = bg__f_ready(&g, q[1], t), want = g.nf[q[1]];
                    if (q[0] & BG__PAIRED) /* and the backward after it can start too */
                        pair = q + 3, ok = ok && bg__b_ready(&g, pair[1], t) && g.nb[pair[1]] == pair[2];
                } else if (q[0] == BG_OP_BACKWARD_WEIGHT)
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
                kind = q[0] & ~BG__PAIRED, sg = q[1];
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
            int f_ok = bf >= 0 && (relax || (inflight[r] < pol->window[r] && stash[r] < pol->cap[r] &&
                                             (!pol->sb || BG__LE(stash_b[r] + pol->sb[bf], pol->capb[r]))));
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
            BG_CHECK_GOTO(bg__emit(s, r, kind, mb, sg, pair, rg_done), st, out);
        }
        /* next event: the earliest end of a running op or arrival of a message */
        double next = INFINITY;
        for (int r = 0; r < p; r++) {
            if (busy[r] > t && !BG__LE(busy[r], t) && busy[r] < next)
                next = busy[r];
            for (int c = 0; c < v; c++) {
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
    free(busy), free(fdone), free(inflight), free(stash), free(seqk), free(stash_b), free(rg_done);
    return st;
}

static int bg__imin(int a, int b) { return a < b ? a : b; }

static void bg__push(int *q, int *n, int kind, int stage, int mb)
{
    q[3 * *n] = kind, q[3 * *n + 1] = stage, q[3 * *n + 2] = mb;
    (*n)++;
}

/* push only microbatches < m (orders whose counters run past m) */
static void bg__push_lt(int *q, int *n, int m, int kind, int stage, int mb)
{
    if (mb < m)
        bg__push(q, n, kind, stage, mb);
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

/* Megatron's chunk order on rank r after `warm` forwards: F and backward in
 * turn; zb: the backward split, each b followed by the W of the backward r
 * steps earlier (the last r W's close the step) */
static void bg__seq_megatron(const bg_schedule_t *s, int r, int warm, int zb, int *q, int *n)
{
    int p = s->p, v = s->v, m = s->m, total = v * m, mb, c, nw = 0;
    warm = bg__imin(warm, total);
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
        bg__push(q, n, zb ? BG_OP_BACKWARD_INPUT : BG_OP_BACKWARD, s->chunk_stage[r * v + c], mb);
        if (zb && k >= r) {
            bg__interleaved_mb(nw++, p, v, m, 1, &mb, &c);
            bg__push(q, n, BG_OP_BACKWARD_WEIGHT, s->chunk_stage[r * v + c], mb);
        }
    }
    while (zb && nw < total) {
        bg__interleaved_mb(nw++, p, v, m, 1, &mb, &c);
        bg__push(q, n, BG_OP_BACKWARD_WEIGHT, s->chunk_stage[r * v + c], mb);
    }
}

static void bg__seq_interleaved(const bg_schedule_t *s, int r, int *q, int *n)
{
    bg__seq_megatron(s, r, (s->p - r - 1) * 2 + (s->v - 1) * s->p, 0, q, n);
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

/* torch.distributed.pipelining's ZB-V order on rank r (ScheduleZBVZeroBubble,
 * after the Zero Bubble paper's V schedule): 2(p-r)-1 chunk-0 forwards,
 * r pairs of chunk-1/chunk-0 forwards, p-r chunk-1 F b W, then F b W of
 * chunk 0 and chunk 1 alternating, and a cool-down that defers W's. Counters
 * run past m (as in torch, which pads to 2p-1) and ops beyond m are dropped. */
static void bg__seq_zbv(const bg_schedule_t *s, int r, int *q, int *n)
{
    int p = s->p, m = s->m, nm = m > 2 * p - 1 ? m : 2 * p - 1;
    int s0 = s->chunk_stage[r * 2], s1 = s->chunk_stage[r * 2 + 1];
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    for (int i = 0; i < 2 * (p - r) - 1; i++)
        bg__push_lt(q, n, m, BG_OP_FORWARD, s0, f0++);
    for (int i = 0; i < r; i++) {
        bg__push_lt(q, n, m, BG_OP_FORWARD, s1, f1++);
        bg__push_lt(q, n, m, BG_OP_FORWARD, s0, f0++);
    }
    for (int i = 0; i < p - r; i++) {
        bg__push_lt(q, n, m, BG_OP_FORWARD, s1, f1++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s1, b1);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s1, b1++);
    }
    while (f1 < f0 || f0 < nm) {
        if (f0 < nm)
            bg__push_lt(q, n, m, BG_OP_FORWARD, s0, f0++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s0, b0);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s0, b0++);
        bg__push_lt(q, n, m, BG_OP_FORWARD, s1, f1++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s1, b1);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s1, b1++);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < r; i++) {
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s0, b0++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s1, b1++);
    }
    for (int i = 0; i < p - r; i++) {
        bg__push_lt(q, n, m, BG_OP_BACKWARD_INPUT, s0, b0++);
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s0, w0++);
    }
    while (w1 < b1)
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s1, w1++);
    while (w0 < b0)
        bg__push_lt(q, n, m, BG_OP_BACKWARD_WEIGHT, s0, w0++);
}

/* The interleaved zero-bubble order (torch's ScheduleInterleavedZeroBubble,
 * "ZB1P") on rank r: Megatron's chunk order with a warm-up of (v-1)g + p-1-r
 * forwards (g: the first microbatch group, min(p, m)), then F and b in turn,
 * each b followed by the W of the backward r steps earlier; the last r W's
 * close the step. */
static void bg__seq_zbi(const bg_schedule_t *s, int r, int *q, int *n)
{
    int g = s->m < s->p ? s->m : s->p;
    bg__seq_megatron(s, r, (s->v - 1) * g + s->p - 1 - r, 1, q, n);
}

/* DualPipeV's W queue: the W of the next b (from *wp on) in q, if any */
static void bg__dpv_w(int *q, int *n, int *wp)
{
    while (*wp < *n && q[3 * *wp] != BG_OP_BACKWARD_INPUT)
        (*wp)++;
    if (*wp < *n) {
        bg__push(q, n, BG_OP_BACKWARD_WEIGHT, q[3 * *wp + 1], q[3 * *wp + 2]);
        (*wp)++;
    }
}

/* DeepSeek's DualPipe order (dualpipe.py; DualPipeV is its half, as
 * torch.distributed.pipelining's ScheduleDualPipeV orders it) on "half
 * rank" r of p: local chunk 0 (stage st[0], its microbatches from mb0[0]) is
 * the one whose data enters nearer, chunk 1 the other. 2(p-r-1) chunk-0
 * forwards; r+1 pairs of F0 F1; p-r-1 of b1 W F1; then m-2p+r+1 rounds of
 * the paired "F&B" (F0 with the full B of chunk 1, F1 with the full B of
 * chunk 0; run one after the other here); p-r-1 of B1 then F1&B0; r+1 of
 * B1 B0 (the second half split into b, W deferred); p-r-1 of W b0; the
 * deferred W's. m microbatches per chunk, m >= 2p. */
static void bg__seq_dual(int p, int m, int r, const int st[2], const int mb0[2], int *q, int *n)
{
    int f[2] = {mb0[0], mb0[1]}, b[2] = {mb0[0], mb0[1]}, zb = 0, wp = *n;
    /* the W queue is the order of the b's already in q: wp scans for the next one */
#define BG__F(c) bg__push(q, n, BG_OP_FORWARD, st[c], f[c]++)
#define BG__B(c, split) bg__push(q, n, (split) ? BG_OP_BACKWARD_INPUT : BG_OP_BACKWARD, st[c], b[c]++)
#define BG__W() bg__dpv_w(q, n, &wp)
    for (int i = 0; i < 2 * (p - r - 1); i++)
        BG__F(0);
    for (int i = 0; i < r + 1; i++)
        BG__F(0), BG__F(1);
    for (int i = 0; i < p - r - 1; i++) {
        BG__B(1, 1);
        BG__W();
        BG__F(1);
    }
    for (int i = 0; i < m - 2 * p + r + 1; i++) {
        BG__F(0);
        if (!(i == 0 && r == p - 1)) /* rank p-1's first F0, B1 are not paired */
            q[3 * (*n - 1)] |= BG__PAIRED;
        BG__B(1, 0);
        BG__F(1), q[3 * (*n - 1)] |= BG__PAIRED, BG__B(0, 0);
    }
    for (int i = 0; i < p - r - 1; i++) {
        BG__B(1, 0);
        BG__F(1), q[3 * (*n - 1)] |= BG__PAIRED, BG__B(0, 0);
    }
    for (int i = 0, half = (r + 1) / 2; i < r + 1; i++) {
        if (i == half && r % 2 == 1)
            zb = 1;
        BG__B(1, zb);
        if (i == half && r % 2 == 0)
            zb = 1;
        BG__B(0, zb);
    }
    for (int i = 0; i < p - r - 1; i++) {
        BG__W();
        BG__B(0, zb);
    }
    while (wp < *n) /* the W's still queued */
        BG__W();
#undef BG__F
#undef BG__B
#undef BG__W
}

/* DualPipeV on rank r of the V layout: chunk 0 is stage r, every microbatch */
static void bg__seq_dualpipev(const bg_schedule_t *s, int r, int *q, int *n)
{
    int st[2] = {s->chunk_stage[r * 2], s->chunk_stage[r * 2 + 1]}, mb0[2] = {0, 0};
    bg__seq_dual(s->p, s->m, r, st, mb0, q, n);
}

/* DualPipe on rank r: DualPipe's order on half rank min(r, p-1-r) of p/2,
 * m/2 microbatches per copy; a rank of the first half takes copy 0 (data
 * entering at rank 0) as its near chunk, one of the second half copy 1 (data
 * entering at rank p-1), so the two halves run mirror images of one order */
static void bg__seq_dualpipe(const bg_schedule_t *s, int r, int *q, int *n)
{
    int near = r >= s->p / 2, h = near ? s->p - 1 - r : r, half = s->m / 2;
    int st[2] = {s->chunk_stage[r * 2 + near], s->chunk_stage[r * 2 + !near]};
    int mb0[2] = {near * half, !near * half};
    bg__seq_dual(s->p / 2, half, h, st, mb0, q, n);
}

typedef void (*bg__seq_fn)(const bg_schedule_t *, int, int *, int *);

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

/* run a fixed order (from build, or the compute order of the program from);
 * BG_ERR_DEADLOCK when it cannot run for this p, m */
static bg_status_t bg__run_seq(bg_schedule_t *s, bg__policy_t *pol, bg__seq_fn build, const bg_schedule_t *from,
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
         * and windows were tried: they won in under 0.1% of the cost grid) */
        int fixed = kind != BG_SCHED_ZB_H2;
        if (k > fixed)
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
            int w = kind == BG_SCHED_ZB_H1   ? p - r
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

/* per-stage costs (per chunk) and link delays from the simulator's inputs */
static bg_status_t bg__costs_init(bg__costs_t *c, const bg_sim_params_t *sp, int S)
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

bg_status_t bg_schedule_generate(const bg_schedule_params_t *params, bg_schedule_t **sched_p)
{
    if (!params || params->size < sizeof(size_t) + sizeof(int) * 4 || !sched_p)
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

    int *map = NULL, copies = kind == BG_SCHED_DUALPIPE ? 2 : 1;
    if (kind == BG_SCHED_ZBV || kind == BG_SCHED_DUALPIPEV || kind == BG_SCHED_DUALPIPE) {
        /* the V layout; for dualpipe chunk 1 of rank r, stage 2p-1-r, is stage p-1-r of copy 1 */
        map = malloc(sizeof(int) * (size_t)p * 2);
        BG_ALLOC_CHECK(map, sizeof(int) * (size_t)p * 2, "stage map");
        for (int r = 0; r < p; r++)
            map[r * 2] = r, map[r * 2 + 1] = 2 * p - 1 - r;
    }
    bg__costs_t cost = {0}, unitc = {0};
    bg_status_t st = bg__costs_init(&cost, sp, p * v);
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
        bg_schedule_t *s, *u = NULL;
        BG_CHECK_GOTO(bg__schedule_alloc(name, kind, p, m, v, map, &s), st, out);
        s->copies = copies;
        if (pass) {
            st = bg__schedule_alloc(name, kind, p, m, v, map, &u);
            if (st == BG_OK)
                u->copies = copies;
            if (st == BG_OK)
                st = bg__run(u, &pol, &unitc);
            if (st == BG_OK)
                st = bg__run_seq(s, &pol, NULL, u, &cost);
            bg_schedule_free(u);
        } else {
            st = seq ? bg__run_seq(s, &pol, seq, NULL, &cost) : bg__run(s, &pol, &cost);
        }
        if (st == BG_ERR_DEADLOCK) { /* this fixed order cannot run for p, m: not a candidate */
            bg_schedule_free(s);
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
            bg_schedule_free(best);
            best = s, best_t = pol.makespan, best_fits = fits;
        } else {
            bg_schedule_free(s);
        }
    }
    if (!best)
        st = bg_error(BG_ERR_INTERNAL, "%s: no order of the family runs for p=%d m=%d v=%d", name, p, m, v);
out:
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

/* ------------------------------------------------------------------------ */
/* Search under a memory limit                                              */

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
                pol.split = split, pol.w_first = wf, pol.gpipe = pol.fwd_first = 0;
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
