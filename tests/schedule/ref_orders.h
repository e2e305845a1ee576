/* tests/schedule/ref_orders.h: reference step times of the published
 * memory-bounded orders (the zero-bubble paper's ZB-1p heuristic; the
 * controllable-memory paper's V-Min, V-Half and the V orders between them),
 * written from the papers as test oracles.
 *
 * Owns: an event-driven replay of those heuristics on its own state, with
 * the simulator's cost model (per-chunk F, b, W; a fixed delay per message
 * between two ranks).
 * Must not: call into libbrigade: an oracle that shares the generators'
 * code cannot catch their mistakes. */
#ifndef BG_TESTS_REF_ORDERS_H
#define BG_TESTS_REF_ORDERS_H

/* The costs of one chunk (every stage alike) and the delay of a message. */
typedef struct {
    double f, b, w, lat;
} ref_costs_t;

/* ZB-1p (Qi et al., "Zero Bubble Pipeline Parallelism", section 3.1): p
 * stages, one per rank, m microbatches, at most cap microbatches stashed
 * per rank (ZB-1p: cap = p, 1F1B's peak). Step time; INFINITY when the cap
 * cannot run. */
double ref_zb1p(int p, int m, ref_costs_t c, int cap);

/* A V order under a stash cap (Qi et al., "Pipeline Parallelism with
 * Controllable Memory"): rank r holds stages r and 2p-1-r (chunks of half a
 * stage each), at most cap chunk-microbatches stashed per rank: V-Min at
 * about 2p/3 (a third of 1F1B's activations), V-Half at p (a half), ZB-V at
 * 2p, the V orders between at the caps between. Step time; INFINITY when the
 * cap cannot run. */
double ref_vcap(int p, int m, ref_costs_t c, int cap);

/* The controllable-memory paper's V-Min (half 0) or V-Half (half 1): its
 * published stable pattern repeated m times, each rank running its slots'
 * order as soon as it can under the costs. Step time; *peak_p: the largest
 * peak stash over ranks (chunk-microbatches). */
double ref_vpattern(int p, int m, ref_costs_t c, int half, int *peak_p);

/* the caps of V-Min and V-Half for p ranks (chunk-microbatches per rank) */
int ref_vmin_cap(int p);
int ref_vhalf_cap(int p);

#endif
