/* partitioner/plan_bound.c: lower bounds of a layout's simulated step time,
 * so that the search can skip the work of a layout that cannot enter the
 * list of the best (its schedule, partition or simulation) and still count
 * it. Owns the bounds and their proofs; it must not generate, partition or
 * simulate anything, nor decide what the search keeps (plan_layout.c).
 *
 * Both bounds hold for the simulator's semantics (schedule/simulate.c) on
 * any program of one chain of stages (one model copy) in which every
 * microbatch goes through every stage: a rank runs one instruction at a
 * time; F(s, j) starts after F(s - 1, j) ended (plus the link's latency and
 * transfer when the two stages are on different ranks), B(s, j) (the
 * backward, or its input half) after B(s + 1, j) and F(s, j); a rank's
 * reduce and optimizer instructions (one each per chunk) follow all its
 * compute. So for a rank r holding stages R_r, the lowest s_r:
 *  - nothing on r starts before F_r = the forwards (and hops) of stages
 *    below s_r: its first instruction is a forward of one of its stages;
 *  - r ends after F_r + m x (its F, B and W costs) + its reduce and
 *    optimizer instructions;
 *  - its last backward (of stage s >= s_r) ends after F_r + m x (its F and
 *    B costs), and the gradient of that microbatch then still runs through
 *    every stage below s: the step ends after that + the backwards (and
 *    hops) of stages below s_r + rank 0's reduce and optimizer.
 * Costs are summed here in another order than the simulator's, so a caller
 * compares with a relative margin (BG__PLAN_BOUND_MARGIN) far above the
 * rounding of a few thousand additions. */
#include <math.h>
#include <stdlib.h>

#include "plan_impl.h"

double bg__plan_step_bound(const bg_schedule_t *sched, int m, const double *fc, const double *bc, const double *wc,
                           int full_backward, double hop_act, double hop_grad, double end_cost)
{
    int S = bg_schedule_stages(sched), P = bg_schedule_ranks(sched);
    if (bg_schedule_copies(sched) != 1 || S < 1)
        return 0; /* two chains: no bound (0 is one) */
    /* per rank: its F + B + W costs, its F + B costs, F_r, and the tail below s_r (-1: no stage yet) */
    double *w = calloc((size_t)P * 4, sizeof(double));
    if (!w)
        return 0;
    double *x = w + P, *head = w + 2 * P, *tail = w + 3 * P;
    for (int r = 0; r < P; r++)
        tail[r] = -1;
    double pf = 0, pb = 0; /* forwards and backwards (with hops) of the stages below s */
    for (int s = 0; s < S; s++) {
        int r = bg_schedule_stage_rank(sched, s);
        double bt = bc[s] + (full_backward ? wc[s] : 0); /* the instruction that sends the gradient down */
        if (tail[r] < 0)
            head[r] = pf, tail[r] = pb;
        w[r] += fc[s] + bc[s] + wc[s];
        x[r] += fc[s] + bt;
        int hop = s + 1 < S && bg_schedule_stage_rank(sched, s + 1) != r;
        pf += fc[s] + (hop ? hop_act : 0);
        pb += bt + (hop ? hop_grad : 0);
    }
    double best = 0;
    for (int r = 0; r < P; r++) {
        if (tail[r] < 0)
            continue;
        double a = head[r] + m * w[r], b = head[r] + m * x[r] + tail[r];
        if (a > best)
            best = a;
        if (b > best)
            best = b;
    }
    free(w);
    return best + end_cost;
}

int bg__plan_bound_exceeds(int L, const double *f, const double *b, const double *w, int full_backward, int pp,
                           int m, double speed, double hop, double limit)
{
    /* Every split of the layers over pp stages (stage r on rank r, its costs
     * the sums of its layers' over speed) has a bound of the kind above;
     * the question is whether some split has all of them <= lim. Taking at
     * each stage as many layers as the two terms of the bound allow is
     * optimal: a later start only lowers a stage's terms at the same end
     * (the head grows by a layer's forward, m x the stage's costs shrink by
     * at least as much), so the greedy split reaches at least as far after
     * every stage as any split within lim. Stages left empty at the end are
     * not constrained: a relaxation, so still a lower bound. */
    double lim = limit * (1 + BG__PLAN_BOUND_MARGIN);
    double head = 0, tailsum = 0; /* the F and B-sends of the layers placed so far, over speed */
    int a = 0;
    for (int s = 0; s < pp && a < L; s++) {
        double h = head + s * hop, t = tailsum + s * hop, all = 0, fb = 0;
        int e = a;
        while (e < L) {
            double bt = b[e] + (full_backward ? w[e] : 0);
            double all2 = all + (f[e] + b[e] + w[e]) / speed, fb2 = fb + (f[e] + bt) / speed;
            if (h + m * all2 > lim || h + m * fb2 + t > lim)
                break;
            all = all2, fb = fb2;
            head += f[e] / speed;
            tailsum += bt / speed;
            e++;
        }
        if (e == a)
            return 1; /* not even one layer: the later stages start later still */
        a = e;
    }
    return a < L;
}
