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
