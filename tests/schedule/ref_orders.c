/* tests/schedule/ref_orders.c: the memory-bounded orders of the zero-bubble
 * papers (ZB-1p; V-Min, V-Half and the V orders between), replayed from the
 * papers' descriptions as oracles for the generators and the search.
 *
 * Owns: one event loop over stages placed on ranks, each idle rank taking
 * the op the papers' heuristic picks: a backward-input whose gradient is
 * there first (it is on the critical path), else a forward if the stash cap
 * allows one (the warm-up takes as many as memory allows), else a deferred
 * backward-weight (it fills what would be a bubble, and frees stash).
 * Must not: use libbrigade (see ref_orders.h). */
#include <math.h>
#include <stdlib.h>

#include "schedule/ref_orders.h"

#define REF_MAXS 64
#define REF_MAXM 256

typedef struct {
    int S, m;
    int rank[REF_MAXS];           /* stage -> rank */
    int nf[REF_MAXS], nb[REF_MAXS], nw[REF_MAXS];
    double fe[REF_MAXS][REF_MAXM]; /* end of F of (stage, mb) */
    double be[REF_MAXS][REF_MAXM]; /* end of b of (stage, mb) */
} ref_state_t;

/* when the next F of stage i has its input (INFINITY: not produced yet) */
static double ref_f_in(const ref_state_t *g, int i, double lat)
{
    int k = g->nf[i];
    if (k >= g->m)
        return INFINITY;
    if (i == 0)
        return 0;
    if (g->nf[i - 1] <= k)
        return INFINITY;
    return g->fe[i - 1][k] + (g->rank[i - 1] != g->rank[i] ? lat : 0);
}

/* when the next b of stage i has its gradient and its own forward done */
static double ref_b_in(const ref_state_t *g, int i, double lat)
{
    int k = g->nb[i];
    if (k >= g->m || g->nf[i] <= k)
        return INFINITY;
    double own = g->fe[i][k];
    if (i == g->S - 1)
        return own;
    if (g->nb[i + 1] <= k)
        return INFINITY;
    double in = g->be[i + 1][k] + (g->rank[i + 1] != g->rank[i] ? lat : 0);
    return in > own ? in : own;
}

/* whether the rank of stage i holds a stage before i (a microbatch meets it
 * earlier there), and how many after i when i is the rank's first */
static int ref_earlier(const ref_state_t *g, int i)
{
    for (int j = 0; j < i; j++)
        if (g->rank[j] == g->rank[i])
            return 1;
    return 0;
}

static int ref_later(const ref_state_t *g, int i)
{
    int n = 0;
    for (int j = i + 1; j < g->S; j++)
        n += g->rank[j] == g->rank[i];
    return n;
}

/* A microbatch enters a rank (its first stage there) only when the rank has
 * room for its stash on every stage the rank holds (the controllable-memory
 * paper's building block holds a microbatch's whole V on a rank at once);
 * its later stages there use the room kept for them (owed). */
static int ref_fits(const ref_state_t *g, int i, int stash, int owed, int cap)
{
    if (ref_earlier(g, i))
        return 1;
    return stash + owed + 1 + ref_later(g, i) <= cap;
}

/* the heuristic on S stages over p ranks; cap chunk-microbatches per rank */
static double ref_run(ref_state_t *g, int p, ref_costs_t c, int cap)
{
    double busy[REF_MAXS] = {0}, t = 0, end = 0;
    int stash[REF_MAXS] = {0}, owed[REF_MAXS] = {0}, left = 3 * g->S * g->m;
    const double eps = 1e-9;
    while (left > 0) {
        for (int r = 0; r < p; r++) {
            if (busy[r] > t + eps)
                continue;
            /* b first: oldest microbatch, then the deeper stage; then F, the
             * same order; then the oldest deferred W */
            int kind = -1, best = -1;
            for (int pass = 0; pass < 3 && best < 0; pass++)
                for (int i = g->S - 1; i >= 0; i--) {
                    if (g->rank[i] != r)
                        continue;
                    int ok = pass == 0   ? ref_b_in(g, i, c.lat) <= t + eps
                             : pass == 1 ? ref_fits(g, i, stash[r], owed[r], cap) && ref_f_in(g, i, c.lat) <= t + eps
                                         : g->nw[i] < g->nb[i];
                    int key = pass == 0 ? g->nb[i] : pass == 1 ? g->nf[i] : g->nw[i];
                    int bk = best < 0 ? 0 : pass == 0 ? g->nb[best] : pass == 1 ? g->nf[best] : g->nw[best];
                    if (ok && (best < 0 || key < bk))
                        best = i, kind = pass;
                }
            if (best < 0)
                continue;
            double d = kind == 0 ? c.b : kind == 1 ? c.f : c.w;
            if (kind == 0)
                g->be[best][g->nb[best]++] = t + d;
            else if (kind == 1)
                g->fe[best][g->nf[best]++] = t + d, stash[r]++,
                owed[r] += ref_earlier(g, best) ? -1 : ref_later(g, best);
            else
                g->nw[best]++, stash[r]--;
            busy[r] = t + d;
            end = busy[r] > end ? busy[r] : end;
            left--;
        }
        double next = INFINITY;
        for (int r = 0; r < p; r++)
            if (busy[r] > t + eps && busy[r] < next)
                next = busy[r];
        for (int i = 0; i < g->S; i++) {
            double a = ref_f_in(g, i, c.lat), b = ref_b_in(g, i, c.lat);
            if (a > t + eps && a < next)
                next = a;
            if (b > t + eps && b < next)
                next = b;
        }
        if (next == INFINITY)
            return left > 0 ? INFINITY : end; /* nothing will ever be ready: the cap cannot run */
        t = next;
    }
    return end;
}

double ref_zb1p(int p, int m, ref_costs_t c, int cap)
{
    if (p > REF_MAXS || m > REF_MAXM)
        abort();
    ref_state_t *g = calloc(1, sizeof *g);
    if (!g)
        abort();
    g->S = p, g->m = m;
    for (int i = 0; i < p; i++)
        g->rank[i] = i;
    double t = ref_run(g, p, c, cap);
    free(g);
    return t;
}

double ref_vcap(int p, int m, ref_costs_t c, int cap)
{
    if (2 * p > REF_MAXS || m > REF_MAXM)
        abort();
    ref_state_t *g = calloc(1, sizeof *g);
    if (!g)
        abort();
    g->S = 2 * p, g->m = m;
    for (int r = 0; r < p; r++)
        g->rank[r] = r, g->rank[2 * p - 1 - r] = r;
    double t = ref_run(g, p, c, cap);
    free(g);
    return t;
}

/* the papers' activation memory in whole-stage microbatches, (p+4)/3 and
 * (p+2)/2, as chunk-microbatches (a V chunk holds half a stage) */
int ref_vmin_cap(int p) { return 2 * ((p + 4) / 3); }
int ref_vhalf_cap(int p) { return 2 * ((p + 2) / 2); }

/* The controllable-memory paper's stable patterns on the V (its reference
 * code's slots, period 6 unit slots per microbatch, rank i): V-Min: chunk 0's
 * forward at i, chunk 1's at 2p-1-i, chunk 1's backward-input at 2p+d+i,
 * chunk 0's at 4p+d-1-i, d = 2 when 3 | p (else two ranks' slots collide);
 * V-Half: 2i, 3p-2-i, 3p+d+2i-1, 6p+d-2-i, d = 3 when p is even. The
 * pattern repeats every 6 slots per microbatch; each free slot takes a
 * pending weight gradient (chunk 1's first). Each rank then runs its slots'
 * order as soon as every input is there, under the costs (the paper's
 * "squeeze"; its further reordering is left out, so this is an upper bound
 * on the paper's figure). */
#define REF_SLOTS (6 * REF_MAXM + 12 * REF_MAXS)
typedef struct {
    int kind, stage, mb; /* kind 0 F, 1 b, 2 W */
} ref_slot_t;

double ref_vpattern(int p, int m, ref_costs_t c, int half, int *peak_p)
{
    if (2 * p > REF_MAXS || m > REF_MAXM)
        abort();
    int S = 2 * p;
    ref_slot_t *slot = malloc(sizeof *slot * (size_t)REF_SLOTS * (size_t)p);
    int *used = calloc((size_t)REF_SLOTS * (size_t)p, sizeof(int));
    double *fe = calloc((size_t)S * m, sizeof(double)), *be = calloc((size_t)S * m, sizeof(double));
    if (!slot || !used || !fe || !be)
        abort();
    int last = 0;
    for (int r = 0; r < p; r++) {
        int d = half ? (p % 2 == 0 ? 3 : 0) : (p % 3 == 0 ? 2 : 0);
        int at[4] = {r, 2 * p - 1 - r, 2 * p + d + r, 4 * p + d - 1 - r};
        if (half)
            at[0] = 2 * r, at[1] = 3 * p - 2 - r, at[2] = 3 * p + d + 2 * r - 1, at[3] = 6 * p + d - 2 - r;
        int stg[4] = {r, 2 * p - 1 - r, 2 * p - 1 - r, r}, kind[4] = {0, 0, 1, 1};
        for (int i = 0; i < m; i++)
            for (int k = 0; k < 4; k++) {
                int t = at[k] + 6 * i;
                if (t >= REF_SLOTS || used[r * REF_SLOTS + t])
                    abort(); /* the published pattern never collides */
                used[r * REF_SLOTS + t] = 1;
                slot[r * REF_SLOTS + t] = (ref_slot_t){kind[k], stg[k], i};
                last = t > last ? t : last;
            }
    }
    /* weight gradients into the free slots, chunk 1's first, each after its b */
    for (int r = 0; r < p; r++) {
        int pend[2] = {0, 0}, nw[2] = {0, 0}; /* [chunk 1, chunk 0] */
        int st[2] = {2 * p - 1 - r, r};
        for (int t = 0; t < REF_SLOTS; t++) {
            if (used[r * REF_SLOTS + t]) {
                ref_slot_t *q = &slot[r * REF_SLOTS + t];
                if (q->kind == 1)
                    pend[q->stage == r]++;
                continue;
            }
            for (int w = 0; w < 2; w++)
                if (pend[w]) {
                    used[r * REF_SLOTS + t] = 1;
                    slot[r * REF_SLOTS + t] = (ref_slot_t){2, st[w], nw[w]++};
                    pend[w]--;
                    last = t > last ? t : last;
                    break;
                }
        }
        if (pend[0] || pend[1])
            abort();
    }
    /* run every rank's slot order as soon as possible, slots in time order
     * (a slot's inputs are in earlier slots) */
    double free_at[REF_MAXS] = {0}, end = 0;
    int stash[REF_MAXS] = {0}, peak = 0;
    for (int t = 0; t <= last; t++)
        for (int r = 0; r < p; r++) {
            if (!used[r * REF_SLOTS + t])
                continue;
            ref_slot_t q = slot[r * REF_SLOTS + t];
            int s = q.stage, i = q.mb;
            double ready = free_at[r], d;
            if (q.kind == 0) {
                if (s > 0) {
                    double in = fe[(s - 1) * m + i] + (s != p ? c.lat : 0);
                    ready = in > ready ? in : ready;
                }
                d = c.f, fe[s * m + i] = ready + d;
                stash[r]++;
            } else if (q.kind == 1) {
                double in = s == S - 1 ? fe[s * m + i] : be[(s + 1) * m + i] + (s != p - 1 ? c.lat : 0);
                ready = in > ready ? in : ready;
                d = c.b, be[s * m + i] = ready + d;
            } else {
                ready = be[s * m + i] > ready ? be[s * m + i] : ready;
                d = c.w;
                stash[r]--;
            }
            free_at[r] = ready + d;
            end = free_at[r] > end ? free_at[r] : end;
            peak = stash[r] > peak ? stash[r] : peak;
        }
    free(slot), free(used), free(fe), free(be);
    if (peak_p)
        *peak_p = peak;
    return end;
}
