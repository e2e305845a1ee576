/**
 * @file schedule.h
 * @brief Pipeline schedules: the IR, generators, validator, JSON, simulator, SVG.
 *
 * A schedule is, per pipeline rank, an ordered list of instructions
 * (bg_sched_op_t). The executor walks each rank's list in order; the
 * simulator walks the very same lists. See docs/schedules.md.
 *
 * Ownership and threads: schedules, simulation results and trace costs
 * belong to the caller (bg_schedule_free, bg_sim_result_free,
 * bg_trace_costs_free); arrays returned by accessors (a rank's instructions,
 * the events) are borrowed from their owner. No global state: calls on
 * distinct objects may run concurrently, and a schedule or a result may be
 * read from several threads while nothing modifies it.
 *
 * @code
 *   bg_schedule_params_t p = BG_SCHEDULE_PARAMS_INIT;
 *   p.kind = BG_SCHED_ZB_H1; p.stages = 4; p.microbatches = 8;
 *   bg_schedule_t *s;
 *   bg_sim_result_t *r;
 *   bg_sim_params_t sp = BG_SIM_PARAMS_INIT;          // F = B = W = 1, free links
 *   if (bg_schedule_generate(&p, &s) != BG_OK ||
 *       bg_schedule_validate(s) != BG_OK ||
 *       bg_schedule_simulate(s, &sp, &r) != BG_OK)
 *       fprintf(stderr, "%s\n", bg_last_error());
 *   printf("step %g bubble %g\n", bg_sim_step_time(r), bg_sim_bubble(r, -1));
 *   bg_sim_result_free(r);
 *   bg_schedule_free(s);
 * @endcode
 *
 * Semantics of each instruction on rank R (stage S, microbatch I):
 *  - FORWARD: run stage S's forward on microbatch I. Its input is the
 *    activation received by the preceding RECV_ACT (or, when stage S-1 lives
 *    on the same rank, the output of FORWARD(I, S-1) kept locally; stage 0
 *    reads the data). Stashes what the backward needs.
 *  - BACKWARD: full backward (input and weight gradients) of (I, S); frees
 *    the stash. Its output gradient comes from the preceding RECV_GRAD (or
 *    from the local BACKWARD/BACKWARD_INPUT of (I, S+1), or the loss on the
 *    last stage). Weight gradients accumulate.
 *  - BACKWARD_INPUT (B): input gradient only; keeps the stash for W.
 *  - BACKWARD_WEIGHT (W): weight gradient of (I, S); frees the stash.
 *  - SEND_ACT: non-blocking send of FORWARD(I, S)'s output to stage
 *    peer_stage = S+1 on peer_rank. Issued after the FORWARD.
 *  - RECV_ACT: stage S's input for microbatch I from peer_stage = S-1. The
 *    executor may post the receive early; the instruction is the point where
 *    the data must have arrived (it blocks until it has).
 *  - SEND_GRAD: non-blocking send of the gradient w.r.t. stage S's input to
 *    peer_stage = S-1, after the BACKWARD or BACKWARD_INPUT of (I, S).
 *  - RECV_GRAD: gradient w.r.t. stage S's output from peer_stage = S+1.
 *  - REDUCE_GRADS: all-reduce stage S's gradients over data parallelism
 *    (microbatch = -1), after every backward piece of stage S.
 *  - OPTIMIZER_STEP: update stage S's parameters (microbatch = -1), after
 *    its REDUCE_GRADS.
 * Between two consecutive stages on the same rank (the turn of a V-shaped
 * schedule on the last rank) there is no send or receive.
 *
 * A forward-only program (bg_schedule_forward_only: evaluation) holds only
 * FORWARD, SEND_ACT and RECV_ACT; its forwards stash nothing (the slot is
 * freed once the output is handed on) and the last stage's forward gives the
 * loss.
 */
#ifndef BRIGADE_SCHEDULE_H
#define BRIGADE_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** X(enum suffix, JSON name, text token) */
#define BG_SCHED_OP_MAP(X)                                                      \
    X(FORWARD, "forward", "F")                                                  \
    X(BACKWARD, "backward", "B")                                                \
    X(BACKWARD_INPUT, "backward_input", "b")                                    \
    X(BACKWARD_WEIGHT, "backward_weight", "W")                                  \
    X(SEND_ACT, "send_act", "sa")                                               \
    X(RECV_ACT, "recv_act", "ra")                                               \
    X(SEND_GRAD, "send_grad", "sg")                                             \
    X(RECV_GRAD, "recv_grad", "rg")                                             \
    X(REDUCE_GRADS, "reduce_grads", "R")                                        \
    X(OPTIMIZER_STEP, "optimizer_step", "O")

/** Kind of one instruction. */
typedef enum bg_sched_op_kind {
#define BG__SCHED_OP_ENUM(e, json, tok) BG_OP_##e,
    BG_SCHED_OP_MAP(BG__SCHED_OP_ENUM)
#undef BG__SCHED_OP_ENUM
    BG_OP_KIND_COUNT
} bg_sched_op_kind_t;

/** One instruction of a rank's program (a small value type). */
typedef struct bg_sched_op {
    int32_t kind;       /**< bg_sched_op_kind_t */
    int32_t microbatch; /**< 0..m-1; -1 for REDUCE_GRADS / OPTIMIZER_STEP */
    int32_t chunk;      /**< model chunk on this rank, 0..v-1 */
    int32_t stage;      /**< global (virtual) stage 0..p*v-1 that the chunk holds */
    int32_t peer_stage; /**< communication ops: the other stage (S+1 or S-1); else -1 */
    int32_t peer_rank;  /**< communication ops: the rank holding peer_stage; else -1 */
} bg_sched_op_t;

/** The generators. */
typedef enum bg_schedule_kind {
    BG_SCHED_GPIPE = 0,    /**< fill-drain: all forwards, then all backwards */
    BG_SCHED_1F1B,         /**< PipeDream-Flush */
    BG_SCHED_INTERLEAVED,  /**< interleaved 1F1B, v chunks per rank (Megatron) */
    BG_SCHED_ZB_H1,        /**< zero bubble, 1F1B memory (Qi et al. 2024) */
    BG_SCHED_ZB_H2,        /**< zero bubble, about twice 1F1B's memory */
    BG_SCHED_ZBV,          /**< V-shape, 2 chunks per rank, B/W split */
    BG_SCHED_ZB_INTERLEAVED, /**< interleaved zero bubble (ZB1P), v >= 2 chunks per rank, B/W split */
    BG_SCHED_DUALPIPEV,    /**< DualPipeV (DeepSeek): V-shape, 2 chunks per rank, F and B of different
                                microbatches paired; m >= 2p */
    BG_SCHED_DUALPIPE,     /**< DualPipe (DeepSeek-V3): two copies of the model (2 copies, parameters 2x), rank r
                                holds stage r of copy 0 and stage p-1-r of copy 1; the first m/2 microbatches
                                enter at rank 0, the others at rank p-1; F and B paired; p even, m even, m >= 2p */
    BG_SCHED_CUSTOM,       /**< read from JSON or built by hand */
    BG_SCHED_KIND_COUNT
} bg_schedule_kind_t;

struct bg_sim_params;

/** Parameters of bg_schedule_generate(); start from BG_SCHEDULE_PARAMS_INIT. */
typedef struct bg_schedule_params {
    size_t size;             /**< sizeof(bg_schedule_params_t), for growth */
    bg_schedule_kind_t kind; /**< which generator */
    int stages;              /**< p: pipeline ranks, >= 1 */
    int microbatches;        /**< m: microbatches per step, >= 1 */
    int chunks;              /**< v: model chunks per rank; 0 = the kind's default
                                  (2 for interleaved, zbv, zb-interleaved, dualpipev and dualpipe, 1 otherwise) */
    const struct bg_sim_params *costs; /**< the costs to build the program for: per-stage F, B, W
                                            (f_costs.. or the scalars, per chunk) and the link
                                            (latency + bytes / bandwidth); NULL: unit costs, free links */
} bg_schedule_params_t;

/** Defaults of bg_schedule_params_t: 1F1B, one stage, one microbatch, the kind's chunks, unit costs. */
#define BG_SCHEDULE_PARAMS_INIT                                                                         \
    { .size = sizeof(bg_schedule_params_t), .kind = BG_SCHED_1F1B, .stages = 1, .microbatches = 1,        \
      .chunks = 0, .costs = NULL }

/** Opaque program set: one instruction list per rank. */
typedef struct bg_schedule bg_schedule_t;

/** Names: "forward"... (JSON), "F"... (text), "gpipe", "1f1b", "interleaved",
 *  "zb-h1", "zb-h2", "zbv", "zb-interleaved", "dualpipev", "dualpipe", "custom". NULL for an out-of-range value. */
const char *bg_sched_op_kind_name(bg_sched_op_kind_t kind);
const char *bg_sched_op_kind_token(bg_sched_op_kind_t kind);
const char *bg_schedule_kind_name(bg_schedule_kind_t kind);
/** Parse names; BG_ERR_NOT_FOUND with a message listing the valid names. */
bg_status_t bg_sched_op_kind_parse(const char *name, bg_sched_op_kind_t *kind_p);
bg_status_t bg_schedule_kind_parse(const char *name, bg_schedule_kind_t *kind_p);

/** What bg_schedule_search() looks among; start from BG_SCHEDULE_SEARCH_PARAMS_INIT. */
typedef struct bg_schedule_search_params {
    size_t size;        /**< sizeof(bg_schedule_search_params_t), for growth */
    int stages;         /**< p: pipeline ranks, >= 1 */
    int microbatches;   /**< m, >= 1 */
    int chunks;         /**< v: 1 (one stage per rank) or 2..64 (interleaved layout, or a V with vshape) */
    int vshape;         /**< 1: the V layout of zbv (chunks must be 2) */
    const struct bg_sim_params *costs; /**< per-stage F, B, W, the link, and stash bytes per stage
                                            (stash_bytes_per_stage or stash_bytes; both 0: one unit per
                                            chunk-microbatch); NULL: unit costs and units */
    double mem_limit;   /**< peak stash per rank, in the bytes (or units) above, as the simulator
                             counts it; 0: no limit */
} bg_schedule_search_params_t;
/** Defaults of bg_schedule_search_params_t: p = m = v = 1, unit costs, no memory limit. */
#define BG_SCHEDULE_SEARCH_PARAMS_INIT                                                                  \
    { .size = sizeof(bg_schedule_search_params_t), .stages = 1, .microbatches = 1, .chunks = 1,          \
      .vshape = 0, .costs = NULL, .mem_limit = 0.0 }

/** What bg_schedule_search() found (filled also when nothing fits). */
typedef struct bg_schedule_search_result {
    double step;        /**< simulated step time of the program returned (0 when none fits) */
    double peak;        /**< its largest peak stash over ranks (bytes or units) */
    double lower_bound; /**< no program of this layout can be faster: max over ranks of (time before
                             its first input can arrive + its busy time) */
    double min_limit;   /**< the smallest largest-peak-stash among the programs tried: the limit to ask for
                             when nothing fits */
    int tried;          /**< programs simulated */
    char from[64];      /**< the order that won: a generator's name, or "list w=.. split|full .." */
} bg_schedule_search_result_t;

/**
 * The program with the smallest simulated step time under params->costs
 * whose peak stash fits params->mem_limit on every rank, among the orders of
 * one layout: every generator of the layout built for the costs, and list
 * schedules over windows of forwards in flight, B/W split or full backward,
 * and W or F first, each capped at the limit, memory-bounded admission
 * orders, and the controllable-memory paper's building blocks (V-Min,
 * V-Half and larger offsets). Heuristic, not exhaustive:
 * result->lower_bound says how far from optimal it can be. BG_ERR_NOT_FOUND
 * when no program tried fits (result->min_limit: the smallest limit that
 * works); @p sched_p is set only on success.
 */
bg_status_t bg_schedule_search(const bg_schedule_search_params_t *params, bg_schedule_search_result_t *result,
                               bg_schedule_t **sched_p);

/** How bg_schedule_search_exact() searches; start from BG_SCHEDULE_EXACT_PARAMS_INIT. */
typedef struct bg_schedule_exact_params {
    size_t size;         /**< sizeof(bg_schedule_exact_params_t), for growth */
    long long max_nodes; /**< node budget: it stops after so many nodes with the best found and a bound */
    int seed;            /**< 1: start from bg_schedule_search()'s program as the bound to beat; 0: from
                              none (every branch is searched until a program is found: for tests) */
} bg_schedule_exact_params_t;
/** Defaults: 10 million nodes, seeded with the heuristic search. */
#define BG_SCHEDULE_EXACT_PARAMS_INIT { .size = sizeof(bg_schedule_exact_params_t), .max_nodes = 10000000LL, .seed = 1 }

/** What bg_schedule_search_exact() found. */
typedef struct bg_schedule_exact_result {
    double step;           /**< step time of the program returned: the optimum when proved */
    double bound;          /**< no program is faster: = step when proved, else the smallest bound of the
                                subtrees the budget left unexplored */
    int proved;            /**< 1: every program was enumerated or pruned (step is optimal) */
    long long nodes;       /**< nodes expanded (at most the budget) */
    double heuristic_step; /**< bg_schedule_search()'s step on the same params */
    double lower_bound;    /**< bg_schedule_search()'s lower bound (critical path, per-rank work) */
    double peak;           /**< the returned program's largest peak stash over ranks */
    char from[64];         /**< "branch and bound", or the heuristic's order when nothing beat it */
} bg_schedule_exact_result_t;

/**
 * The optimal program of a small one-chunk (chunks 1) or V (vshape) layout
 * whose peak stash fits params->mem_limit, by branch and bound over every
 * program: each rank's order of forwards, backward-inputs and
 * backward-weights (each stage's microbatches in order), timed as the
 * simulator times it (a fixed latency per message; a finite bandwidth with
 * message bytes is refused). Costs must be > 0. It starts from
 * bg_schedule_search()'s program (exact->seed) and prunes with a
 * critical-path and per-rank-work bound; after exact->max_nodes nodes it
 * stops with the best found and result->bound (result->proved 0). @p exact
 * NULL: BG_SCHEDULE_EXACT_PARAMS_INIT. At most 16 stages and 600 compute
 * ops. BG_ERR_NOT_FOUND when nothing fits (as bg_schedule_search).
 */
bg_status_t bg_schedule_search_exact(const bg_schedule_search_params_t *params,
                                     const bg_schedule_exact_params_t *exact, bg_schedule_exact_result_t *result,
                                     bg_schedule_t **sched_p);

/** Build the programs of a generator for the costs in params->costs: each
 *  generator tries the orders of its family (its fixed order and list-scheduler
 *  policies) within the family's stash bound and keeps the fastest for those
 *  costs. Errors: p or m < 1, or a chunk count the schedule cannot use (a
 *  one-line message says why). */
bg_status_t bg_schedule_generate(const bg_schedule_params_t *params, bg_schedule_t **sched_p);

/**
 * An empty program set to fill by hand with bg_schedule_append().
 * @param stage_of_chunk  [ranks * chunks]: stage of (rank r, chunk c) at
 *        r*chunks + c, a permutation of 0..ranks*chunks-1; NULL = interleaved
 *        (stage c*ranks + r).
 */
bg_status_t bg_schedule_create(const char *name, int ranks, int microbatches, int chunks,
                               const int *stage_of_chunk, bg_schedule_t **sched_p);
/** Append one instruction to @p rank's list (copied; no checks beyond the
 *  rank index: bg_schedule_validate() judges the program). */
bg_status_t bg_schedule_append(bg_schedule_t *sched, int rank, const bg_sched_op_t *op);
void bg_schedule_free(bg_schedule_t *sched); /**< frees the program set (NULL is a no-op) */

bg_schedule_kind_t bg_schedule_kind(const bg_schedule_t *sched); /**< its generator; BG_SCHED_CUSTOM when built by hand or read from JSON */
const char *bg_schedule_name(const bg_schedule_t *sched); /**< its name (the generator's, or the one it was created or read with) */
int bg_schedule_ranks(const bg_schedule_t *sched);        /**< p */
int bg_schedule_microbatches(const bg_schedule_t *sched); /**< m */
int bg_schedule_chunks(const bg_schedule_t *sched);       /**< v */
int bg_schedule_stages(const bg_schedule_t *sched);       /**< p*v virtual stages */
/** Copies of the model the virtual stages hold (1; DualPipe 2). With c copies
 *  the p*v virtual stages form c chains of L = p*v/c stages: virtual stage s
 *  is stage s % L of copy s / L (its layers are those of model stage s % L),
 *  and microbatch i goes through copy i / (m/c) only (the first m/c
 *  microbatches through copy 0, ...). Each copy's first stage reads the data,
 *  its last computes the loss; no message crosses copies. Before the
 *  optimizer step the gradients of the c copies of each stage are summed. */
int bg_schedule_copies(const bg_schedule_t *sched);
/** Make a hand-built program set (bg_schedule_create) hold @p copies copies:
 *  copies must divide both p*v and m. Call it before validating. */
bg_status_t bg_schedule_set_copies(bg_schedule_t *sched, int copies);
/** The forward-only program of @p sched (evaluation: the loss without gradients): each rank's FORWARD,
 *  SEND_ACT and RECV_ACT in the order @p sched has them, so every generator's order maps to one; no
 *  backward, gradient transfer, reduce or optimizer step. Same name, kind, stage map and copies. It is
 *  deadlock-free when @p sched is (it drops instructions from an order that completes, keeping every
 *  activation send a kept receive waits for). *fwd_p is the caller's (bg_schedule_free). */
bg_status_t bg_schedule_forward_only(const bg_schedule_t *sched, bg_schedule_t **fwd_p);
/** 1 for a forward-only program (bg_schedule_forward_only, JSON "forward_only": true), 0 for a training one. */
int bg_schedule_is_forward_only(const bg_schedule_t *sched);
/** Mark a hand-built program set forward-only (1) or training (0); call it before validating. */
bg_status_t bg_schedule_set_forward_only(bg_schedule_t *sched, int on);
/** Copy of virtual stage @p stage, and the model stage (0..p*v/copies-1) it holds; -1 when out of range. */
int bg_schedule_stage_copy(const bg_schedule_t *sched, int stage);
int bg_schedule_model_stage(const bg_schedule_t *sched, int stage);
/** Copy microbatch @p microbatch goes through (-1 when out of range). */
int bg_schedule_microbatch_copy(const bg_schedule_t *sched, int microbatch);
/** Rank and chunk holding virtual stage @p stage (-1 when out of range). */
int bg_schedule_stage_rank(const bg_schedule_t *sched, int stage);
int bg_schedule_stage_chunk(const bg_schedule_t *sched, int stage);
/** Rank @p rank's instructions; valid until the schedule is freed or appended to. */
const bg_sched_op_t *bg_schedule_rank_ops(const bg_schedule_t *sched, int rank, size_t *count_p);
/** The instruction that runs beside compute instruction @p i of a rank's program @p ops (@p n of them)
 *  under BRIGADE_TP_OVERLAP=microbatch: the next compute instruction j, when only sends and receives lie
 *  between, exactly one of the two is a forward, and their microbatches differ (so neither reads what the
 *  other writes); 0 when none. */
size_t bg_sched_pair_partner(const bg_sched_op_t *ops, size_t n, size_t i);

/**
 * Prove the programs correct: indices in range, every (microbatch, stage)
 * computed exactly once (F and either B+W or a full backward), forward before
 * backward, B before W, each needed transfer sent once and received once,
 * sends after their producer and receives before their consumer, reduce and
 * optimizer step last, and no deadlock when every rank walks its list with
 * buffered sends and blocking receives. A forward-only program must hold
 * every (microbatch, stage)'s forward with its activation transfers and
 * nothing else (no backward piece, reduce or optimizer step is owed). BG_ERR_INVALID or BG_ERR_DEADLOCK
 * with a message naming the first offending instruction (and the wait cycle).
 */
bg_status_t bg_schedule_validate(const bg_schedule_t *sched);

/** Text: one row per rank ("rank 0 | F0 F1 B0 ..."). Chunk c>0 prints as "F3.1".
 *  flags: BG_SCHED_TEXT_COMM adds communication ops. *text_p is malloc'ed. */
#define BG_SCHED_TEXT_COMM 1u
bg_status_t bg_schedule_format_text(const bg_schedule_t *sched, unsigned flags, char **text_p);

/** JSON interchange format (docs/schedules.md). Strings are malloc'ed. */
bg_status_t bg_schedule_to_json(const bg_schedule_t *sched, char **json_p);
bg_status_t bg_schedule_to_json_file(const bg_schedule_t *sched, const char *path);
/** Parse (and check ranges, not dependencies: call bg_schedule_validate()).
 *  BG_ERR_PARSE with the JSON path of the offending field. */
bg_status_t bg_schedule_from_json(const char *json, bg_schedule_t **sched_p);
/** torch.distributed.pipelining's CSV schedule format ("compute_only", as
 *  PipelineScheduleMulti._dump_csv writes it): one row per rank, each cell
 *  an action such as 2F0, 1I3, 0W1 or 3B2 (stage, F/I/W/B, microbatch).
 *  Writing keeps the compute ops in each rank's order (a program with two
 *  model copies is refused). Reading takes p from the rows, the stages a rank
 *  holds (its chunks in increasing stage order) from its cells, m from the
 *  microbatches, skips torch's SEND/RECV/UNSHARD/RESHARD actions and places
 *  brigade's own transfers around the compute order, which it keeps as given
 *  but for the weight gradients (bg_schedule_order_weights: torch's
 *  LoopedBFS runs its backwards last microbatch first); an order brigade
 *  cannot run (a stage's forwards out of microbatch order, a missing or
 *  repeated action, a deadlock) is refused with the reason. The _file forms
 *  write a file whole or not at all, and read a file. */
bg_status_t bg_schedule_to_torch_csv(const bg_schedule_t *sched, char **csv_p);
bg_status_t bg_schedule_to_torch_csv_file(const bg_schedule_t *sched, const char *path);
bg_status_t bg_schedule_from_torch_csv(const char *csv, bg_schedule_t **sched_p);
bg_status_t bg_schedule_from_torch_csv_file(const char *path, bg_schedule_t **sched_p);
bg_status_t bg_schedule_from_json_file(const char *path, bg_schedule_t **sched_p);
/** Put every stage's weight gradients in microbatch order, the order their
 *  sums need for the bits of one process (a program may run a stage's
 *  backwards in any order; torch's LoopedBFS runs them last microbatch
 *  first). A weight gradient whose turn has not come (an earlier
 *  microbatch's has not run) moves to just after the one before it; a full
 *  backward in that place is split: its input half (and so its send) stays,
 *  its weight half moves. The moved weight gradient's stash (the layers'
 *  inputs and output gradients) is held until it runs: the simulator and the
 *  memory model judge the program as rewritten, which is what runs. A
 *  program in order is unchanged (the generators' always are). @p moved_p
 *  (may be NULL): how many moved. BG_ERR_INVALID when a waiting weight
 *  gradient's predecessor is missing. */
bg_status_t bg_schedule_order_weights(bg_schedule_t *sched, int *moved_p);
/** A program to run: read @p path (bg_schedule_from_json_file), put its
 *  weight gradients in microbatch order (bg_schedule_order_weights), prove it
 *  correct (bg_schedule_validate) and check it is for @p ranks pipeline
 *  ranks and @p microbatches microbatches, and, when @p chunks > 0, that many
 *  chunks per rank. Errors name the file: the reader's or the validator's
 *  message (first offending instruction, or the wait cycle), or
 *  BG_ERR_INVALID "FILE is a program for p=4 pipeline ranks, but the job has 2". */
bg_status_t bg_schedule_load_program(const char *path, int ranks, int microbatches, int chunks,
                                     bg_schedule_t **sched_p);

/* ------------------------------------------------------------------------ */
/* Simulator                                                                */

/** Simulator inputs; start from BG_SIM_PARAMS_INIT. Times in any unit
 *  (seconds, or "F = 1"), bytes in bytes, bandwidth in bytes per time unit. */
typedef struct bg_sim_params {
    size_t size;               /**< sizeof(bg_sim_params_t) */
    double f_cost;             /**< forward time of one chunk (every stage) */
    double b_cost;             /**< backward-input time; full backward = b + w */
    double w_cost;             /**< backward-weight time */
    const double *f_costs;     /**< [p*v] per-stage overrides, or NULL */
    const double *b_costs;     /**< [p*v] or NULL */
    const double *w_costs;     /**< [p*v] or NULL */
    double latency;            /**< per message */
    double bandwidth;          /**< bytes per time unit; 0 = infinite */
    double act_bytes;          /**< activation message per microbatch */
    double grad_bytes;         /**< gradient message per microbatch */
    double stash_bytes;        /**< held per stashed microbatch per stage */
    const double *stash_bytes_per_stage; /**< [p*v] or NULL */
    double reduce_cost;        /**< REDUCE_GRADS time per stage */
    double optimizer_cost;     /**< OPTIMIZER_STEP time per stage */
    const double *wstash_bytes_per_stage; /**< [p*v] bytes a microbatch holds from its
                                               BACKWARD_INPUT to its BACKWARD_WEIGHT, beyond its stash
                                               (split schedules), counted in the peak bytes; or NULL */
} bg_sim_params_t;

/** Defaults of bg_sim_params_t: F = B = W = 1, free communication, no memory. */
#define BG_SIM_PARAMS_INIT                                                                              \
    { .size = sizeof(bg_sim_params_t), .f_cost = 1.0, .b_cost = 1.0, .w_cost = 1.0, .f_costs = NULL,      \
      .b_costs = NULL, .w_costs = NULL, .latency = 0.0, .bandwidth = 0.0, .act_bytes = 0.0,               \
      .grad_bytes = 0.0, .stash_bytes = 0.0, .stash_bytes_per_stage = NULL, .reduce_cost = 0.0,           \
      .optimizer_cost = 0.0, .wstash_bytes_per_stage = NULL }

/** One timeline event. Compute: on rank, [start, end). Sends: the transfer
 *  from issue to arrival (rank = sender). Receives: the wait, if any. */
typedef struct bg_sim_event {
    int32_t rank;
    int32_t kind;       /**< bg_sched_op_kind_t */
    int32_t microbatch;
    int32_t stage;
    int32_t peer_stage; /**< communication: the other stage; else -1 */
    double start, end;
} bg_sim_event_t;

typedef struct bg_sim_result bg_sim_result_t; /**< a simulated timeline (opaque) */

/** Simulate (the programs must validate: it is checked first). */
bg_status_t bg_schedule_simulate(const bg_schedule_t *sched, const bg_sim_params_t *params,
                                 bg_sim_result_t **result_p);
void bg_sim_result_free(bg_sim_result_t *res); /**< frees a result (NULL is a no-op) */

/** Step time: the end of the last instruction on any rank (all ranks start at 0). */
double bg_sim_step_time(const bg_sim_result_t *res);
/** Busy (compute) time of a rank; idle = step time - busy. */
double bg_sim_busy(const bg_sim_result_t *res, int rank);
double bg_sim_idle(const bg_sim_result_t *res, int rank);
/** Bubble fraction idle/step of @p rank; rank -1: overall (sum idle / (p * step)). */
double bg_sim_bubble(const bg_sim_result_t *res, int rank);
/** Steady-state bubble: idle inside the rank's own span (first compute start to
 *  last compute end) / span; rank -1: sum over ranks / sum of spans. It is the
 *  bubble left when steps run back to back (ZB-H2's "zero bubble"). */
double bg_sim_span_bubble(const bg_sim_result_t *res, int rank);
/** Per-stage bubble, the zero-bubble paper's figure: the worst rank's
 *  steady-state bubble (idle inside its span / span, so the wait before its
 *  first forward is not counted), the rank in @p rank_p (may be NULL). */
double bg_sim_stage_bubble(const bg_sim_result_t *res, int *rank_p);
/** The figures of a simulation as JSON ("format": "brigade-simulation": step,
 *  bubble, stage_bubble and its rank, steady_bubble, and per rank busy, idle,
 *  start, end, bubble, span_bubble, peak_stash, peak_stash_bytes); the text
 *  is the caller's to free(). The _file form writes it whole or not at all. */
bg_status_t bg_sim_result_to_json(const bg_sim_result_t *res, char **json_p);
bg_status_t bg_sim_result_to_json_file(const bg_sim_result_t *res, const char *path);
/** First compute start and last instruction end of a rank. */
double bg_sim_rank_start(const bg_sim_result_t *res, int rank);
double bg_sim_rank_end(const bg_sim_result_t *res, int rank);
/** Peak number of microbatches stashed on a rank (from a FORWARD to its
 *  last backward piece, summed over the rank's chunks) and peak stash bytes. */
int bg_sim_peak_stash(const bg_sim_result_t *res, int rank);
double bg_sim_peak_stash_bytes(const bg_sim_result_t *res, int rank);
/** Timeline, sorted by rank then start time. */
const bg_sim_event_t *bg_sim_events(const bg_sim_result_t *res, size_t *count_p);

/** How a timeline is drawn; start from BG_SVG_PARAMS_INIT. Two pictures
 *  given the same x_max and unit share scale and ticks (brigade simulate
 *  draws the simulated and the measured step this way). */
typedef struct bg_svg_params {
    size_t size;       /**< sizeof(bg_svg_params_t), for growth */
    double time_scale; /**< simulator times are multiplied by it for the axis (1e3: seconds to ms); 0 = 1 */
    const char *unit;  /**< the axis unit; NULL: "unit costs" (simulator), "ms" (trace) */
    double x_max;      /**< the axis' end in axis units; 0 (or less than the step): the step */
    const char *title; /**< NULL: one made from the schedule and the step */
} bg_svg_params_t;
/** Defaults of bg_svg_params_t: unit costs, the step's width, a title made from the schedule. */
#define BG_SVG_PARAMS_INIT                                                                              \
    { .size = sizeof(bg_svg_params_t), .time_scale = 1.0, .unit = NULL, .x_max = 0.0, .title = NULL }

/** Write an SVG Gantt chart (one lane per rank) of a simulated schedule to
 *  @p path (written whole or not at all): compute boxes by kind (chunks > 0
 *  hatched), transfers and receive waits under each lane, idle time as the
 *  grey lane, a time axis in unit costs, a legend of the kinds drawn. */
bg_status_t bg_schedule_svg(const bg_schedule_t *sched, const bg_sim_result_t *res, const char *path);
/** Same, to a malloc'ed string. */
bg_status_t bg_schedule_svg_string(const bg_schedule_t *sched, const bg_sim_result_t *res, char **svg_p);
/** bg_schedule_svg() and bg_schedule_svg_string() with units, scale and title
 *  from @p params (NULL: the defaults). */
bg_status_t bg_schedule_svg_with(const bg_schedule_t *sched, const bg_sim_result_t *res,
                                 const bg_svg_params_t *params, const char *path);
bg_status_t bg_schedule_svg_string_with(const bg_schedule_t *sched, const bg_sim_result_t *res,
                                        const bg_svg_params_t *params, char **svg_p);

/* ------------------------------------------------------------------------ */
/* Executor traces                                                          */

/** What an executor trace (brigade train --trace, bg_executor_write_trace())
 *  measured, read back for the simulator: the schedule the run used, per
 *  virtual stage the medians over steps 2.. (all steps when there are fewer)
 *  of its F, B, W (or full backward), send and optimizer times, and the
 *  measured step time (per step the longest rank's span; the median). */
typedef struct bg_trace_costs bg_trace_costs_t;

/** Parse a trace's text (@p len bytes, need not be NUL-terminated; @p where
 *  names it in messages, e.g. its path). Every field used is checked:
 *  BG_ERR_PARSE naming the event (traceEvents[i]) and the field. Memory is
 *  proportional to the number of events, whatever numbers they hold. */
bg_status_t bg_trace_costs_parse(const char *text, size_t len, const char *where, bg_trace_costs_t **costs_p);
/** bg_trace_costs_parse() of the file at @p path. */
bg_status_t bg_trace_costs_load(const char *path, bg_trace_costs_t **costs_p);
void bg_trace_costs_free(bg_trace_costs_t *costs);
/** The schedule the trace ran: kind, stages (pp), microbatches, chunks into @p sp. */
void bg_trace_costs_schedule(const bg_trace_costs_t *costs, bg_schedule_params_t *sp);
/** Per-stage costs in seconds into @p sp: f_costs, b_costs, w_costs (valid
 *  while @p costs lives) and optimizer_cost. The time a stage spends issuing
 *  its sends is charged to the compute op before it, unless @p compute_only. */
void bg_trace_costs_sim(const bg_trace_costs_t *costs, int compute_only, bg_sim_params_t *sp);
/** Measured step time in seconds; *steps_p (may be NULL): the number of steps it is the median of. */
double bg_trace_costs_step_time(const bg_trace_costs_t *costs, int *steps_p);
/** Draw the measured step nearest the median as an SVG Gantt chart at @p path
 *  (one lane per rank; written atomically); *step_p (may be NULL): that step. */
bg_status_t bg_trace_costs_svg(const bg_trace_costs_t *costs, const char *path, int *step_p);
/** Seconds from the first to the last event (over all ranks) of the step
 *  bg_trace_costs_svg() draws: its axis' end unless told a longer one. */
double bg_trace_costs_drawn_span(const bg_trace_costs_t *costs);
/** Same as bg_trace_costs_svg(), drawn by the simulator's drawer in ms with @p params' x_max and
 *  title (time_scale and unit are ignored; NULL: the defaults). */
bg_status_t bg_trace_costs_svg_with(const bg_trace_costs_t *costs, const bg_svg_params_t *params, const char *path,
                                    int *step_p);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_SCHEDULE_H */
