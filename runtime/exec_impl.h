/* runtime/exec_impl.h: the executor's private body, shared by its files:
 * the core (executor.c: create, the step loop, destroy; exec_ops.c: the
 * table of instruction handlers; exec_grads.c: gradient buckets and the
 * norm; exec_ckpt.c: checkpoints and weights; exec_eval.c: evaluation with
 * forward-only programs) and the strategies that plug into it
 * (runtime/strat_*.c, registered in runtime/strategy.c).
 *
 * A strategy is a table of hooks (bg__strategy_ops_t) plus its private
 * state; the core calls the hooks at fixed points and never branches on
 * which strategies are active (docs/architecture.md, "The executor core
 * and its strategies"). Nothing outside runtime/ includes this header. */
#ifndef BG_RUNTIME_EXEC_IMPL_H
#define BG_RUNTIME_EXEC_IMPL_H

#include <signal.h>
#include <stddef.h>

#include "brigade/executor.h"
#include "brigade/partitioner.h"
#include "brigade/schedule.h"
#include "brigade/train.h"
#include "core/fiber.h"
#include "runtime/emulate.h"
#include "schedule/layout.h"
#include "runtime/devcoll.h"
#include "runtime/staging.h"
#include "runtime/tp.h"
#include "runtime/trace.h"

/* A gradient bucket: contiguous layers of a chunk, last layers first. */
typedef struct bg__bucket {
    int lo, hi;           /* layers */
    size_t off, count;    /* floats of the flat gradient buffer */
    bg__xfer_t *req;      /* its reduction in flight (the strategy's reduce hook), else NULL */
    int started;
} bg__bucket_t;

typedef struct chunk {
    int stage;              /* virtual stage */
    int first, last;        /* layer range */
    bg_model_t *model;
    bg_stage_t *st;         /* NULL: a model without a stage (a parameter server's tensors) */
    int is_first, is_last;  /* first / last stage of the whole pipeline (of its copy's chain) */
    int copy, mb_last;      /* model copy (0: one copy) and the last microbatch through it */
    int prev_local, next_local; /* stage-1 / stage+1 live on this rank */
    int prev_rank, next_rank;   /* ranks of the neighbouring stages */
    /* per microbatch */
    bg__xfer_t **act_recv, **grad_recv, **act_send, **grad_send;
    float **out;            /* forward output (valid until the slot ends) */
    float **din;            /* input gradient (valid until the slot ends) */
    int *begun, *pending_end;
    bg_shape_t *out_shape;
    void *hook;             /* the layer-done callback's argument */
    bg__bucket_t *buckets;
    int nbuckets;
    double gsq;             /* sum of squares of the chunk's reduced gradients this step (grad_sumsq) */
    double *tsq;            /* per tensor: the sum of squares of its reduced gradient this step */
    int norm_counted;       /* this step's tsq count in the model's norm on this rank (clipping) */
    const bg_optim_store_t *param_store; /* --zero 3's parameter shard from here (--offload params); NULL: the backend */
} chunk_t;

typedef struct bg_executor exec_t;

/* ---- strategies ----
 *
 * Hooks of kind EVERY are called for every active strategy, in registry
 * order; hooks of kind ONE are handled by the first active strategy whose
 * slot is non-NULL, else by the core's default (named per hook). Any slot
 * may be NULL. `self` is the strategy's private state (from setup). */
typedef struct bg__strategy_ops {
    const char *name;
    /* Is it on for this executor? Called once, after the layout is bound. Required. */
    int (*active)(const exec_t *x);
    /* EVERY: allocate the private state, after the groups and the backend, before the chunks. */
    bg_status_t (*setup)(exec_t *x, void **self_p);
    /* ONE: build chunk ch's model and stage (default: the layers first..last on a stage). */
    bg_status_t (*chunk_model)(exec_t *x, void *self, chunk_t *ch);
    /* ONE: the floats chunk ch's gradient buckets aim at, given the configured ones
     * (BRIGADE_BUCKET_MB; default: those). Buckets stay whole layers. */
    size_t (*bucket_floats)(exec_t *x, void *self, chunk_t *ch, size_t configured);
    /* EVERY: chunk ch's model, stage and buckets exist, before its optimizer state (chunk_optim). */
    bg_status_t (*chunk_made)(exec_t *x, void *self, chunk_t *ch);
    /* ONE: chunk ch's optimizer state (default: the whole model's), after its buckets. */
    bg_status_t (*chunk_optim)(exec_t *x, void *self, chunk_t *ch);
    /* EVERY: every chunk exists (partners, buffers, maps over all chunks). */
    bg_status_t (*ready)(exec_t *x, void *self);
    /* ONE: the whole step of a rank that runs no program (default: the program). */
    bg_status_t (*step)(exec_t *x, void *self, double tokens, bg_step_result_t *result_p);
    /* EVERY: before the first instruction of a step (a failure fails the step). */
    bg_status_t (*step_begin)(exec_t *x, void *self);
    /* EVERY: a compute instruction's slot is ready, before its compute. */
    bg_status_t (*before_compute)(exec_t *x, void *self, chunk_t *ch, int mb, bg_sched_op_kind_t kind);
    /* EVERY: after the compute of a forward, backward (split: input only) or weight instruction. */
    void (*after_compute)(exec_t *x, void *self, chunk_t *ch, bg_sched_op_kind_t kind);
    /* EVERY: a receive instruction is about to wait for @p rq. */
    void (*before_wait)(exec_t *x, void *self, bg__xfer_t *rq);
    /* ONE: are @p layer's weight gradients reduced every microbatch (default 0: once a step)? */
    int (*per_microbatch)(exec_t *x, void *self, chunk_t *ch, int layer);
    /* EVERY: before each layer's compute in a stage (every pass: bg_stage_set_layer_begin). */
    bg_status_t (*layer_begin)(exec_t *x, void *self, chunk_t *ch, int layer, int mb, bg_stage_pass_t pass);
    /* EVERY: after each layer's weight gradient of microbatch mb (tensor sums done). */
    bg_status_t (*layer_done)(exec_t *x, void *self, chunk_t *ch, int layer, int mb);
    /* ONE: bucket b of ch is ready: start its reduction into ch->buckets[b].req (default: none). */
    bg_status_t (*reduce)(exec_t *x, void *self, chunk_t *ch, int b);
    /* EVERY: once a step, before this rank's first optimizer step, every reduction finished
     * (the core finishes them first when any active strategy has this hook). */
    bg_status_t (*before_optimizer)(exec_t *x, void *self);
    /* EVERY: does tensor p count in the gradient norm (0: no; the core also asks tp)? */
    int (*in_norm)(exec_t *x, void *self, const bg_param_t *p);
    /* ONE: chunk ch's optimizer step (default: bucket by bucket, bg__exec_optimizer_step). */
    bg_status_t (*optimizer)(exec_t *x, void *self, chunk_t *ch);
    /* ONE: after the program, with clip_grad: the global norm and the deferred updates
     * (default: bg__exec_clip's exact allreduce, then the hook update per chunk). */
    bg_status_t (*clip)(exec_t *x, void *self);
    /* ONE: with clip_grad: scale chunk ch's gradients by k (k < 1) and update it (default bg__exec_update). */
    bg_status_t (*update)(exec_t *x, void *self, chunk_t *ch, float k);
    /* ONE: after the program: the step's result (default: one allreduce of loss, norm and stop). */
    bg_status_t (*step_end)(exec_t *x, void *self, double t0, double tokens, bg_step_result_t *result_p);
    /* EVERY: every chunk's parameters whole (before saving, loading, destroying). */
    bg_status_t (*settle)(exec_t *x, void *self);
    /* ONE: write a checkpoint (default: every chunk's full tensors, bg_checkpoint_save). */
    bg_status_t (*save_checkpoint)(exec_t *x, void *self, const char *root, int keep);
    /* EVERY: before a checkpoint is saved (loading 0) or loaded (1): the full optimizer state in the models. */
    bg_status_t (*state_begin)(exec_t *x, void *self, int loading);
    /* EVERY: after it (st: how it went). */
    void (*state_end)(exec_t *x, void *self, int loading, bg_status_t st);
    /* ONE: where chunk v's weights go, "" when this rank writes none of them (default: replica 0 writes). */
    void (*weights_path)(exec_t *x, void *self, int v, const char *dir, char *path, size_t cap);
    /* ONE: how many ranks of the job write weights (default: replica 0's, world / dp). */
    int (*weights_writers)(exec_t *x, void *self);
    /* ONE: this rank's slot counts over its program, for the predicted activation bytes, with the forwarded
     * slots whose stash is off the device in counts.offloaded (default: bg_part_schedule_counts). */
    bg_status_t (*act_counts)(exec_t *x, void *self, bg_part_counts_t **rows_p, int *nrows_p);
    /* EVERY: the predicted parameter bytes, optimizer elements and gradient bytes (bg_executor_info), adjusted. */
    void (*memory)(exec_t *x, void *self, size_t *param_bytes, size_t *optim_elems, size_t *grad_bytes);
    /* EVERY: after a failed step: free what is in flight. */
    void (*cancel)(exec_t *x, void *self);
    /* EVERY: bg_executor_destroy, before anything is freed (broken: a step failed). */
    void (*finish)(exec_t *x, void *self, int broken);
    /* EVERY: free the private state (the models still exist). */
    void (*destroy)(exec_t *x, void *self);
} bg__strategy_ops_t;

/* The registry (runtime/strategy.c), in the order hooks are called. */
extern const bg__strategy_ops_t *const bg__strategies[];

typedef struct bg__strategy {
    const bg__strategy_ops_t *ops;
    void *self;
} bg__strategy_t;

struct bg_executor {
    bg_executor_params_t p;
    bg_model_desc_t *desc;
    bg_comm_t *comm;
    int own_comm;
    bg_group_t *dp_group, *world_group; /* dp_group: NULL when the replicas do not reduce among themselves */
    bg__dcoll_t *dp_coll; /* dp_group's collectives on the backend's buffers (runtime/devcoll.h); NULL with it */
    bg__dcoll_t *ep_coll; /* under --ep: the collectives of the replicas holding this rank's experts (strat_ep.c),
                           * over which --zero shards them; NULL: ep = 1, or this replica alone holds them */
    bg__tp_t *tp;           /* the tensor-parallel group (runtime/tp.c; NULL: tp = 1) */
    struct bg__cp *cp;      /* the context-parallel group (runtime/cp.c; NULL: cp = 1) */
    bg_layout_t lay;        /* who holds what: degrees, this rank's coordinates, stage placement */
    bg_backend_t *be;
    bg__staging_t stg;      /* transfers of backend buffers between ranks */
    bg_schedule_t *sched;
    const bg_sched_op_t *ops;
    size_t nops;
    bg_schedule_t *eval_sched; /* the forward-only program of sched (bg_executor_eval), made at its first call */
    int forward_only;          /* ops is eval_sched's: the interpreter runs its table of forward-only handlers */
    int V, M, S;
    int copies, L;          /* model copies (bg_schedule_copies) and model stages S / copies */
    chunk_t *chunks;        /* V */
    int *first, *last;      /* layer range of each virtual stage */
    int mbn;                /* sequences per microbatch per replica */
    int tokens_in;          /* the model takes token ids */
    int has_first, has_last; /* this rank holds the pipeline's first / last stage */
    int classes, vocab, Tmax;
    int64_t step;           /* steps done */
    uint32_t epoch;         /* this executor's on the comm (bg_comm_epoch_begin): leave notices */
    float loss_scale;
    double loss;            /* this rank's share of the step's loss */
    /* a backend that queues work (ops->event_record): each microbatch's
     * per-token losses are copied here on the device and summed at the
     * step's end, in the order the forwards ran, the host not waiting for
     * the compute stream per microbatch (the same sums in the same order as
     * summing at once; NULL on the CPU, which sums at once) */
    float *loss_dev;        /* M x per_mb_floats */
    size_t *loss_n;         /* each microbatch's count */
    int *loss_mb, loss_k;   /* microbatches in forward order; how many this step */
    size_t per_mb_floats;   /* tokens (or samples) of a microbatch at most: mbn x Tmax */
    int32_t *tokens, *targets;
    float *features;
    size_t nfeatures;
    int64_t fetched_step;   /* (step, mb) whose batch is in the buffers */
    int fetched_mb;
    bg_trace_t *trace;
    int stashed, peak_stashed;
    int64_t shared_step;    /* step whose before_optimizer hooks ran */
    double busy;            /* compute seconds in the step */
    uint64_t bytes_sent;    /* point-to-point bytes sent in the step */
    volatile sig_atomic_t stop_req;
    int broken;             /* a step failed: the executor cannot step again */
    size_t act_base;        /* allocator bytes before the first step (params, grads, optimizer) */
    size_t params;
    double flops_per_step;
    size_t predicted_act_bytes;
    int predicted_stashed;
    int numa_node;
    bg__emulate_t *em;      /* --emulate: per-stage times; the stages compute nothing, the optimizer updates nothing */
    bg_pair_t *pair;        /* BRIGADE_TP_OVERLAP=microbatch: two coroutines for paired instructions, else NULL */
    int pair_j_lane;        /* inside bg__exec_run_pair: 1 + the lane running the pair's second instruction (0: none) */
    int pair_i_ended;       /* inside bg__exec_run_pair: the pair's first instruction has ended */
    bg__strategy_t strat[16]; /* the active strategies, in registry order */
    int nstrat;
    double clip_norm;       /* with clip_grad: this step's global norm before clipping (exact sum) */
    int64_t data_position;  /* the checkpoints' data_position (bg_executor_set_data_position; -1: the step) */
};

/* ---- the strategies' dispatch (runtime/strategy.c) ---- */
bg_status_t bg__strategies_select(exec_t *x);   /* the active ones, then their setup */
/* Walk the active strategies in registry order (EVERY hooks):
 *     BG__EACH_STRATEGY(x, s) if (s->ops->step_begin) BG_CHECK(s->ops->step_begin(x, s->self)); */
#define BG__EACH_STRATEGY(x, s) for (bg__strategy_t *s = (x)->strat; s < (x)->strat + (x)->nstrat; s++)
/* The first active strategy having ONE hook h, NULL: none (the core's default). */
#define BG__ONE(x, h) bg__strategy_find((x), offsetof(bg__strategy_ops_t, h))
bg__strategy_t *bg__strategy_find(exec_t *x, size_t slot_offset);

/* ---- the core's pieces other files use ---- */
/* executor.c */
bg_step_result_t bg__exec_step_result(const exec_t *x, double tokens, double dt);
bg_status_t bg__exec_step_failed(exec_t *x, bg_status_t st);
bg_status_t bg__exec_chunk_models(exec_t *x, bg_model_t ***models_p);
bg_status_t bg__exec_step_tokens(exec_t *x, int64_t step, double *tokens_p); /* positions of a step's global batch */
bg_status_t bg__exec_sum_losses(exec_t *x); /* the program's end: the device-kept losses into x->loss, the queue drained, the backend's sticky error */
/* exec_ops.c */
bg_status_t bg__exec_seq_len(exec_t *x, int64_t step, int mb, int *t_p);
bg_status_t bg__exec_input_shape(exec_t *x, chunk_t *ch, int mb, bg_shape_t *shape_p);
bg_status_t bg__exec_shape_at(exec_t *x, chunk_t *ch, int T, bg_shape_t *shape_p); /* at T positions (of the sequence) */
/* fn(arg, kind, cost) for each layer of chunk ch in order, with its cost model (bg_layer_tp_cost) at
 * microbatch mb's shapes: what an emulating strategy sends before an emulated compute of @p kind. */
bg_status_t bg__exec_layer_costs(exec_t *x, chunk_t *ch, int mb, bg_sched_op_kind_t kind,
                                 bg_status_t (*fn)(void *arg, bg_sched_op_kind_t kind, const bg_tp_cost_t *cost),
                                 void *arg);
uint32_t bg__exec_tag(const exec_t *x, int grad, int recv_stage, int mb);
bg_status_t bg__exec_wait_free(bg__xfer_t **rq);
bg_status_t bg__exec_reap_pending(exec_t *x, int force);
bg_status_t bg__exec_post_ahead(exec_t *x, size_t i);
bg_status_t bg__exec_run_op(exec_t *x, const bg_sched_op_t *o);
bg_status_t bg__exec_run_pair(exec_t *x, size_t i, size_t j);
const char *bg__exec_op_label(int kind);
bg_status_t bg__exec_op_failed(exec_t *x, bg_status_t st, const bg_sched_op_t *op, const bg_sched_op_t *label);
/* exec_grads.c */
bg_status_t bg__exec_make_buckets(exec_t *x, chunk_t *ch);
bg_status_t bg__exec_start_buckets(exec_t *x, chunk_t *ch, int layer);
bg_status_t bg__exec_wait_bucket(exec_t *x, chunk_t *ch, int b);
bg_status_t bg__exec_wait_buckets(exec_t *x, chunk_t *ch);
bg_status_t bg__exec_before_optimizer(exec_t *x);
int bg__exec_in_norm(exec_t *x, chunk_t *ch, int i);
double bg__exec_grad_sumsq(exec_t *x, chunk_t *ch);
bg_status_t bg__exec_optimizer_step(exec_t *x, chunk_t *ch);
void bg__exec_trace_bucket(exec_t *x, chunk_t *ch, int b);
/* The end of the run of bucket b's floats from @p from whose tensors are of one kind: an MoE layer's experts,
 * split over the expert-parallel group (*expert_p = 1: bg_param_t.split_ep), or not (0); the tensors in the
 * order of their offsets. A bucket's runs: from its off, each from the last one's end, to off + count. */
size_t bg__exec_bucket_run(const chunk_t *ch, int b, size_t from, int *expert_p);
/* exec_clip.c */
bg_status_t bg__exec_clip(exec_t *x);
bg_status_t bg__exec_update(exec_t *x, chunk_t *ch, float k);
/* exec_ckpt.c */
bg_status_t bg__exec_settle(exec_t *x);
/* exec_agree.c: every rank's settings against rank 0's, at create (collective) */
bg_status_t bg__exec_agree(exec_t *x);
/* Per-step agreement: the doubles this rank adds to the step-end SUM
 * allreduce, and the check of the job's sums (a mismatch: an error naming
 * the value, the step and the ranks, on every rank alike). */
#define BG__STEP_AGREE_DOUBLES 4
void bg__exec_step_agree_pack(const exec_t *x, double out[BG__STEP_AGREE_DOUBLES]);
bg_status_t bg__exec_step_agree_check(exec_t *x, const double sums[BG__STEP_AGREE_DOUBLES]);

/* Tags: bit 31 step parity, bit 30 direction (0 act, 1 grad), bits 16..29
 * the receiving stage, or one of these for the strategies' exchanges, bits
 * 0..15 the microbatch (a strategy's index; the context ring's lane). The parameter servers'
 * protocol (runtime/ps.c) uses 0x3ffe too: it never runs with DualPipe's
 * copies (refused at create). */
enum { BG__TAG_TIES = 0x3fff, BG__TAG_COPIES = 0x3ffe, BG__TAG_CP = 0x3ffd };

#endif
