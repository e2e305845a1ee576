/* schedule/layout.h: the rank layout (like Megatron's parallel_state): which
 * world rank holds which pipeline rank, replica, tensor member, model chunk
 * and role (worker or parameter server). In schedule/, below the planner and
 * the runtime, so both ask it: the executor builds one and it and its
 * strategies ask it every "which rank" question; no other file of runtime/
 * computes a rank from coordinates.
 *
 * Order (docs/architecture.md): tp varies fastest, then cp (context
 * parallelism: the members splitting one sequence), then dp, then pp:
 *     rank = ((pp * dp_degree + dp) * cp_degree + cp) * tp_degree + tp.
 * A tensor group is tp consecutive ranks; a context group the cp ranks of the
 * same (pp, dp, tp) tp apart. The gradient of a stage is summed over its dp x
 * cp ranks (context members see different positions of the same sequences).
 * With parameter servers (--ps S, tp = 1): ranks 0 .. S-1 are the servers,
 * then each worker's pipeline on consecutive ranks, pp fastest:
 *     rank = S + dp * pp_degree + pp   (worker dp is a replica).
 * A virtual stage's pipeline rank and chunk index come from the schedule's
 * placement (bg_schedule_stage_rank / _chunk).
 *
 * It owns no memory and sends nothing; it may become public later, so its
 * API stays small. Internal (bg__ functions, not exported). */
#ifndef BG_RUNTIME_LAYOUT_H
#define BG_RUNTIME_LAYOUT_H

#include "brigade/core.h"
#include "brigade/schedule.h"

typedef enum bg_layout_role {
    BG_LAYOUT_WORKER = 0, /* runs a program: a pipeline rank of a replica */
    BG_LAYOUT_SERVER = 1, /* a parameter server: runs no program */
} bg_layout_role_t;

/* Where a rank sits. A server has pp = cp = tp = 0, dp = -1. */
typedef struct bg_layout_coord {
    int pp, dp, cp, tp;
    bg_layout_role_t role;
} bg_layout_coord_t;

typedef struct bg_layout {
    int pp, dp, cp, tp;          /* degrees; dp: the replicas (with servers: the workers) */
    int servers;                 /* parameter servers, ranks 0 .. servers-1; 0: none */
    int world, rank;             /* the job and this rank (after bg__layout_bind) */
    bg_layout_coord_t me;        /* this rank's coordinates (after bg__layout_bind) */
    const bg_schedule_t *sched;  /* virtual stage -> pipeline rank and chunk (NULL: not set) */
} bg_layout_t;

/* The degrees the job asks for (dp: requested; with servers it is fixed by
 * the job's size at bind). Nothing is checked yet. */
void bg__layout_init(bg_layout_t *l, int pp, int dp, int cp, int tp, int servers);
/* Place this job: @p world ranks, this one @p rank. Checks that the world
 * fits the degrees (pp x dp x cp x tp; with servers (cp = tp = 1), whole pipelines of workers
 * after them, dp then being the number of workers) and fills me. */
bg_status_t bg__layout_bind(bg_layout_t *l, int world, int rank);
/* The schedule whose stage placement the stage questions use (kept, not owned). */
void bg__layout_set_schedule(bg_layout_t *l, const bg_schedule_t *sched);

/* World rank of worker coordinates (pipeline rank, replica, context member, tensor member). */
int bg__layout_rank(const bg_layout_t *l, int pp, int dp, int cp, int tp);
/* Coordinates of world rank @p rank. */
bg_layout_coord_t bg__layout_coord(const bg_layout_t *l, int rank);
/* Pipeline rank holding virtual stage @p stage (the schedule's placement). */
int bg__layout_stage_pp(const bg_layout_t *l, int stage);
/* World rank holding virtual stage @p stage in replica @p dp, as this rank's context and tensor member. */
int bg__layout_stage_rank(const bg_layout_t *l, int stage, int dp);
/* The virtual stage that is chunk @p chunk of pipeline rank @p pp, -1: none. */
int bg__layout_chunk_stage(const bg_layout_t *l, int pp, int chunk);
/* DualPipe's copies (bg_schedule_copies): virtual stage @p stage is model
 * stage bg__layout_model_stage of copy bg__layout_copy; the other copy of
 * the same model stage is virtual stage bg__layout_twin (copies = 2). */
int bg__layout_model_stage(const bg_layout_t *l, int stage);
int bg__layout_copy(const bg_layout_t *l, int stage);
int bg__layout_twin(const bg_layout_t *l, int stage);
/* The ranks this rank's gradients are summed over into @p ranks (dp x cp
 * entries: ranks[d * cp + c] for replica d, context member c); returns how
 * many, 0 when the replicas do not reduce among themselves (parameter
 * servers: the workers push to the servers). */
int bg__layout_dp_ranks(const bg_layout_t *l, int *ranks);
/* This rank's context group into @p ranks (cp entries, ranks[c] for member c,
 * the ring's order); returns cp. */
int bg__layout_cp_ranks(const bg_layout_t *l, int *ranks);
/* 1: this rank is replica 0's context member 0 (it writes and counts what the
 * replicas and context members hold alike). */
int bg__layout_lead(const bg_layout_t *l);
/* The first world rank of this rank's tensor group (tp consecutive ranks). */
int bg__layout_tp_first(const bg_layout_t *l);

#endif
