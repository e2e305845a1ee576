/* schedule/generate_impl.h: what the generator's files share (generate.c,
 * gen_list.c, gen_orders.c, gen_dualpipe.c, search.c): the list scheduler's
 * policy and costs, and the fixed orders. Private to schedule/. */
#ifndef BG_SCHEDULE_GENERATE_IMPL_H
#define BG_SCHEDULE_GENERATE_IMPL_H

#include "brigade/schedule.h"

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
    /* reserve: a rank admits a microbatch (its forward on the rank's chunk 0)
     * only with room under cap and capb for its stash on all the rank's
     * chunks; the later chunks' forwards use that room. The memory-bounded
     * V orders (V-Min, V-Half and between) run so: a cap never stalls them,
     * as the oldest admitted microbatch always has its room. */
    int reserve;
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

static inline int bg__imin(int a, int b) { return a < b ? a : b; }

/* A fixed order's builder: rank r's compute ops as (kind, stage, microbatch)
 * triples appended to q (*n of them). */
typedef void (*bg__seq_fn)(const bg_schedule_t *, int, int *, int *);

/* ---- the list scheduler (gen_list.c) */

/* Run the policy as a list scheduler under the costs, appending the program
 * to s. BG_ERR_DEADLOCK (no message) when a fixed order cannot run. */
bg_status_t bg__run(bg_schedule_t *s, bg__policy_t *pol, const bg__costs_t *cost);
/* run a fixed order (from build, or the compute order of the program from);
 * BG_ERR_DEADLOCK when it cannot run for this p, m */
bg_status_t bg__run_seq(bg_schedule_t *s, bg__policy_t *pol, bg__seq_fn build, const bg_schedule_t *from,
                        const bg__costs_t *cost);
/* The compute order of @p from as listed, each instruction with its receive
 * just before it and its send just after it (no timing: the order alone), on
 * s, then the reductions and optimizer steps: for an order the list scheduler
 * cannot follow (a stage's backwards out of microbatch order). */
bg_status_t bg__run_as_listed(bg_schedule_t *s, const bg_schedule_t *from);
/* append the triple (kind, stage, mb) to q */
void bg__push(int *q, int *n, int kind, int stage, int mb);
/* per-stage costs (per chunk) and link delays from the simulator's inputs
 * (sp NULL: unit costs, free links); the caller frees c->f */
bg_status_t bg__costs_init(bg__costs_t *c, const bg_sim_params_t *sp, int S);

/* ---- the building-block orders (gen_block.c) */

/* The controllable-memory paper's block order of the layout of s (one chain
 * of stages), placed with unit slots (unit) or the costs, with an extra
 * offset gap (in the placement's time) on the first half's forwards and the
 * second half's backward-inputs (0: V-Min on the V; a forward's cost:
 * V-Half) and turn before the last stage's backward-input, run by the list
 * scheduler under cost. BG_ERR_NOT_FOUND (no
 * message) when the layout has two copies or the block cannot be placed. */
bg_status_t bg__run_block(bg_schedule_t *s, bg__policy_t *pol, const bg__costs_t *cost, int unit, double gap,
                          double turn);

/* ---- the fixed orders (gen_orders.c, gen_dualpipe.c) */

void bg__seq_interleaved(const bg_schedule_t *s, int r, int *q, int *n);
void bg__seq_zbh1(const bg_schedule_t *s, int r, int *q, int *n);
void bg__seq_zbv(const bg_schedule_t *s, int r, int *q, int *n);
void bg__seq_zbi(const bg_schedule_t *s, int r, int *q, int *n);
void bg__seq_dualpipev(const bg_schedule_t *s, int r, int *q, int *n);
void bg__seq_dualpipe(const bg_schedule_t *s, int r, int *q, int *n);

#endif
