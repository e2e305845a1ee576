/* schedule/schedule_impl.h: the body of bg_schedule_t and the
 * simulator result, plus a growable string used by the text/SVG writers.
 * Private to schedule/; nothing outside this folder includes it. */
#ifndef BG_SCHEDULE_IMPL_H
#define BG_SCHEDULE_IMPL_H

#include <stdarg.h>
#include <stddef.h>

#include "brigade/schedule.h"

struct bg_schedule {
    bg_schedule_kind_t kind;
    char name[32];
    int p, m, v, nstages;   /* ranks, microbatches, chunks, p*v */
    int copies;             /* model copies (DualPipe 2): nstages/copies stages per chain (bg_schedule_copies) */
    int forward_only;       /* 1: forwards and activation transfers only (bg_schedule_forward_only) */
    int *stage_rank;        /* [nstages] */
    int *stage_chunk;       /* [nstages] */
    int *chunk_stage;       /* [p*v]: stage of (r, c) at r*v + c */
    bg_sched_op_t **ops;    /* [p] lists */
    size_t *nops, *cap;     /* [p] */
    size_t reserve;         /* first capacity of a rank's list (0: grow from 64) */
};

/* Size each rank's first instruction list for the generators' largest
 * program (m x v x (F, B, W and four transfers) + reduce and optimizer per
 * chunk), so that appending never reallocates. */
void bg__schedule_reserve_generated(bg_schedule_t *s);

/* bg_schedule_append for the generators: the store inlined when the list
 * has room (reserved by bg__schedule_reserve_generated), the exported call
 * (which grows the list) otherwise. Same contract as bg_schedule_append. */
static inline bg_status_t bg__schedule_push(bg_schedule_t *s, int rank, const bg_sched_op_t *op)
{
    if (rank >= 0 && rank < s->p && s->nops[rank] < s->cap[rank]) {
        s->ops[rank][s->nops[rank]++] = *op;
        return BG_OK;
    }
    return bg_schedule_append(s, rank, op);
}

/* Empty every rank's program, keeping the stage map and the lists' memory,
 * so the generator refills it for its next candidate. */
void bg__schedule_clear(bg_schedule_t *s);

struct bg_sim_result {
    int p;
    double step;
    double *busy, *start, *end, *peak_bytes; /* [p] */
    int *peak_stash;                          /* [p] */
    bg_sim_event_t *events;
    size_t nevents;
};

/* growable string */
typedef struct bg__str {
    char *buf;
    size_t len, cap;
    int oom;
} bg__str_t;

void bg__str_printf(bg__str_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void bg__str_free(bg__str_t *s);

/* The chains of stages (one per model copy; see bg_schedule_copies):
 * whether a stage begins or ends its chain, and the microbatches
 * [first, first + count) that go through it. With one copy: stage 0, stage
 * S-1 and every microbatch. */
static inline int bg__chain_first(const bg_schedule_t *s, int st) { return st % (s->nstages / s->copies) == 0; }
static inline int bg__chain_last(const bg_schedule_t *s, int st)
{
    int L = s->nstages / s->copies;
    return st % L == L - 1;
}
static inline int bg__mb_first(const bg_schedule_t *s, int st) { return st / (s->nstages / s->copies) * (s->m / s->copies); }
static inline int bg__mb_count(const bg_schedule_t *s) { return s->m / s->copies; }
/* microbatch mb goes through stage st */
static inline int bg__mb_on(const bg_schedule_t *s, int st, int mb)
{
    return mb / (s->m / s->copies) == st / (s->nstages / s->copies);
}

/* Seeds the rank worklist of the simulator and the deadlock check: every
 * rank pushed so that rank 0 is popped first. Returns the stack's height. */
static inline int bg__push_ranks(int *stack, int p)
{
    int top = 0;
    for (int r = p - 1; r >= 0; r--)
        stack[top++] = r;
    return top;
}

/* allocates the arrays of an empty schedule with the given stage map (NULL: interleaved) */
bg_status_t bg__schedule_alloc(const char *name, bg_schedule_kind_t kind, int p, int m, int v,
                               const int *chunk_stage, bg_schedule_t **sched_p);
/* "rank 2 op 7 (B mb 3 stage 2)" */
void bg__op_describe(char *buf, size_t n, int rank, size_t idx, const bg_sched_op_t *op);

/* The timeline drawer shared by the simulator's picture (svg.c) and the
 * trace's measured step (trace_costs.c), so that the two have one layout,
 * scale, legend and axis. */
typedef struct bg__tl_box {
    int32_t rank, kind, chunk, mb; /* kind: bg_sched_op_kind_t, or -1 (another op) */
    double t0, t1;                 /* axis units */
    const char *what;              /* tooltip: the op's name */
    int32_t stage, peer;           /* tooltip: stage and (transfers) the other stage, or -1 */
} bg__tl_box_t;

typedef struct bg__tl {
    const char *title;
    int ranks;
    const bg__tl_box_t *box;
    size_t nbox;
    double step;            /* where the step ends (axis units) */
    double x_max;           /* axis end (axis units), >= step */
    const char *unit;       /* "ms", "unit costs" */
    const char (*note)[64]; /* [ranks] text right of each lane, or NULL */
} bg__tl_t;

bg_status_t bg__timeline_svg(const bg__tl_t *tl, char **svg_p);
/* writes text to path through path.tmp and a rename */
bg_status_t bg__write_atomic(const char *path, const char *text);

#endif
