/* schedule/gen_block.c: the building-block orders of the controllable-memory
 * paper (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"):
 * one microbatch's pass through the chain of stages placed once (the
 * block), repeated every T (one microbatch's work on the busiest rank), and
 * each rank's compute order read off the repeated pattern.
 *
 * Owns: placing the block (forwards down the chain, backward-inputs back up,
 * each weight gradient in the first free time after its backward-input, no
 * two ops of a rank overlapping modulo T) and turning it into a fixed order
 * per rank. With the smallest offsets between neighbouring stages the block
 * on the V layout is the paper's V-Min (a rank's stash is its two chunks'
 * lifespans over T: about a third of 1F1B's); one extra forward offset on the
 * first half of the chain and one extra backward offset on the second half
 * give V-Half (about a half); larger offsets continue towards ZB-V's memory.
 * Must not: time the order (the list scheduler in gen_list.c runs it as soon
 * as each op is ready, which squeezes the block's warm-up and cool-down) nor
 * choose among blocks (search.c does). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/generate_impl.h"
#include "schedule/schedule_impl.h"

typedef struct {
    double t;  /* start in the block (microbatch 0) */
    int kind;  /* BG_OP_FORWARD, BG_OP_BACKWARD_INPUT, BG_OP_BACKWARD_WEIGHT */
    int stage;
    int order; /* placement index: ties at one time keep dependency order */
} bg__bop_t;

/* does [a, a+d) overlap [c, c+e) modulo T (both no longer than T)? */
static int bg__collide(double a, double d, double c, double e, double T)
{
    const double eps = 1e-9 * (1 + T);
    if (d <= eps || e <= eps)
        return 0;
    double o = c - a;
    o -= floor(o / T) * T; /* c's start after a's, in [0, T) */
    return o < d - eps || o + e > T + eps;
}

/* the earliest start >= t0 at which an op of length d fits on rank r among
 * the n ops placed (start[], len[], rank[]); -1 when no gap holds it */
static double bg__fit(double t0, double d, int r, const double *start, const double *len, const int *rank, int n,
                      double T)
{
    double best = -1;
    for (int k = -1; k < n; k++) { /* candidates: t0, or the end of a placed op shifted to >= t0 */
        double c = t0;
        if (k >= 0) {
            if (rank[k] != r)
                continue;
            double e = start[k] + len[k];
            c = e + ceil((t0 - e) / T - 1e-12) * T;
            if (c < t0)
                c += T;
        }
        if (best >= 0 && c >= best)
            continue;
        int ok = 1;
        for (int j = 0; j < n && ok; j++)
            if (rank[j] == r && bg__collide(c, d, start[j], len[j], T))
                ok = 0;
        if (ok)
            best = c;
    }
    return best;
}

static int bg__bop_cmp(const void *a, const void *b)
{
    const bg__bop_t *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return x->order - y->order;
}

/* place one op of length d on rank r at the earliest fit from t0 (entry *n
 * of ops, start, len, rank); 0 when no gap holds it */
static int bg__put(bg__bop_t *ops, double *start, double *len, int *rank, int *n, double t0, double d, int r,
                   int kind, int st, double T)
{
    double t = bg__fit(t0, d, r, start, len, rank, *n, T);
    if (t < 0)
        return 0;
    start[*n] = t, len[*n] = d, rank[*n] = r;
    ops[*n] = (bg__bop_t){t, kind, st, *n};
    (*n)++;
    return 1;
}

/* Place the block: ops[3*S] (F of stages 0..S-1, then b of S-1..0, then W of
 * S-1..0), period T. dur: the placement's op lengths (the costs, or unit
 * slots). gap: extra offset of forwards on the first half of the chain and
 * of backward-inputs on the second half; turn: delay of the chain's last
 * backward-input (the paper's patterns shift the backward half by a few
 * slots for some p). 0 when some op fits no gap. */
static int bg__place(const bg_schedule_t *s, const bg__costs_t *dur, double gap, double turn, double T, bg__bop_t *ops,
                     double *start, double *len, int *rank)
{
    int S = s->nstages, n = 0;
    for (int st = 0; st < S; st++) { /* forwards down the chain */
        int r = s->stage_rank[st];
        double t0 = 0;
        if (st > 0) {
            int cross = s->stage_rank[st - 1] != r;
            t0 = start[st - 1] + len[st - 1] + (cross ? dur->act : 0) + (cross && 2 * st < S ? gap : 0);
        }
        if (!bg__put(ops, start, len, rank, &n, t0, dur->f[st], r, BG_OP_FORWARD, st, T))
            return 0;
    }
    for (int st = S - 1; st >= 0; st--) { /* backward-inputs up the chain */
        int r = s->stage_rank[st];
        double t0 = start[st] + len[st] + (st == S - 1 ? turn : 0); /* its own forward */
        if (st < S - 1) {
            int cross = s->stage_rank[st + 1] != r;
            double in = start[n - 1] + len[n - 1] + (cross ? dur->grad : 0) + (cross && 2 * st >= S ? gap : 0);
            t0 = in > t0 ? in : t0;
        }
        if (!bg__put(ops, start, len, rank, &n, t0, dur->b[st], r, BG_OP_BACKWARD_INPUT, st, T))
            return 0;
    }
    for (int k = 0; k < S; k++) { /* weight gradients in the first room after their backward-input */
        int st = S - 1 - k, r = s->stage_rank[st], bi = S + k;
        if (!bg__put(ops, start, len, rank, &n, start[bi] + len[bi], dur->w[st], r, BG_OP_BACKWARD_WEIGHT, st, T))
            return 0;
    }
    return 1;
}

/* Fill pol->seq from the block repeated m times every T. */
static bg_status_t bg__block_seq(const bg_schedule_t *s, bg__policy_t *pol, const bg__bop_t *ops, double T)
{
    int p = s->p, S = s->nstages, m = s->m;
    size_t per = (size_t)3 * s->v * m;
    bg__bop_t *all = malloc(sizeof *all * per);
    BG_ALLOC_CHECK(all, sizeof *all * per, "the block's order");
    for (int r = 0; r < p; r++) {
        size_t n = 0;
        for (int i = 0; i < m; i++)
            for (int k = 0; k < 3 * S; k++)
                if (s->stage_rank[ops[k].stage] == r) {
                    all[n] = ops[k];
                    all[n].t += i * T;
                    all[n].order = k + 3 * S * i; /* equal times (zero costs): microbatch, then dependency order */
                    n++;
                }
        qsort(all, n, sizeof *all, bg__bop_cmp);
        int *nmb = calloc((size_t)S * 3, sizeof(int)); /* next microbatch per (stage, kind) */
        if (!nmb) {
            free(all);
            return bg_error(BG_ERR_NOMEM, "cannot allocate the block's order");
        }
        pol->seqlen[r] = 0;
        for (size_t k = 0; k < n; k++) {
            int kk = all[k].kind == BG_OP_FORWARD ? 0 : all[k].kind == BG_OP_BACKWARD_INPUT ? 1 : 2;
            bg__push(pol->seq[r], &pol->seqlen[r], all[k].kind, all[k].stage, nmb[all[k].stage * 3 + kk]++);
        }
        free(nmb);
    }
    free(all);
    return BG_OK;
}

bg_status_t bg__run_block(bg_schedule_t *s, bg__policy_t *pol, const bg__costs_t *cost, int unit, double gap,
                          double turn)
{
    int p = s->p, S = s->nstages;
    if (s->copies != 1)
        return BG_ERR_NOT_FOUND;
    bg__costs_t dur = *cost;
    double *one = NULL;
    if (unit) { /* the paper's slots: every op one unit, free links */
        one = malloc(sizeof(double) * (size_t)S);
        BG_ALLOC_CHECK(one, sizeof(double) * (size_t)S, "the block's slots");
        for (int i = 0; i < S; i++)
            one[i] = 1;
        dur.f = dur.b = dur.w = one;
        dur.act = dur.grad = 0;
    }
    double T = 0; /* one microbatch's work on the busiest rank */
    for (int r = 0; r < p; r++) {
        double w = 0;
        for (int i = 0; i < S; i++)
            if (s->stage_rank[i] == r)
                w += dur.f[i] + dur.b[i] + dur.w[i];
        T = w > T ? w : T;
    }
    bg_status_t st = BG_OK;
    bg__bop_t *ops = malloc(sizeof *ops * (size_t)S * 3);
    double *start = malloc(sizeof(double) * (size_t)S * 6);
    int *rank = malloc(sizeof(int) * (size_t)S * 3);
    pol->seq = calloc((size_t)p, sizeof(int *));
    pol->seqlen = calloc((size_t)p, sizeof(int));
    if (!ops || !start || !rank || !pol->seq || !pol->seqlen) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate the block of %d stages", S);
        goto out;
    }
    for (int r = 0; r < p; r++)
        if (!(pol->seq[r] = malloc(sizeof(int) * (size_t)9 * s->v * s->m))) {
            st = bg_error(BG_ERR_NOMEM, "cannot allocate the block's order");
            goto out;
        }
    if (!(T > 0)) {
        st = BG_ERR_NOT_FOUND; /* no work: nothing repeats */
        goto out;
    }
    /* uneven lengths can leave gaps too small for an op: widen the period */
    int placed = 0;
    for (int tries = 0; tries < 16 && !placed; tries++, T *= 1.05)
        placed = bg__place(s, &dur, gap, turn, T, ops, start, start + 3 * S, rank);
    if (!placed) {
        st = BG_ERR_NOT_FOUND;
        goto out;
    }
    T /= 1.05;
    BG_CHECK_GOTO(bg__block_seq(s, pol, ops, T), st, out);
    st = bg__run(s, pol, cost);
out:
    if (pol->seq)
        for (int r = 0; r < p; r++)
            free(pol->seq[r]);
    free(pol->seq), free(pol->seqlen);
    pol->seq = NULL, pol->seqlen = NULL;
    free(ops), free(start), free(rank), free(one);
    return st;
}
