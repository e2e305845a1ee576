/**
 * @file executor.h
 * @brief The executor: trains any model description on a pipeline x data-
 *        parallel layout, one optimizer step per call, driven by its host.
 *
 * Every rank of the job creates the executor with the same parameters (the
 * same model description, built by the same code), then calls
 * bg_executor_step() once per optimizer step. The host owns the loop, the
 * learning-rate schedule, evaluation and when to save. One process is the
 * executor at pp = dp = 1: there is no other training loop. bg_executor_eval()
 * gives the loss of the current weights on a batch (a held-out set's) with
 * a forward-only program, between steps.
 *
 * Each rank walks its program from the schedule generator (the same one the
 * simulator runs); microbatch gradients accumulate in microbatch order on
 * every stage, so for a fixed dp, microbatch count and seed every schedule
 * and pipeline degree gives bitwise the weights of one process. DualPipe
 * (two model copies, each fed half of the microbatches) gives bitwise those
 * of --dp 2 with half the microbatches, and one process's within the
 * data-parallel tolerance (docs/schedules.md).
 *
 * Ownership and threads: the host owns the executor (bg_executor_destroy)
 * and what it lends it: the model description and a comm it passes (both
 * must outlive the executor; a comm the executor created itself is its own).
 * Drive one executor from one thread; bg_executor_request_stop is the
 * exception (it sets a flag: signal handlers and other threads may call it).
 * The executor runs threads of its own (the transport's communication
 * thread, compute threads); data callbacks run on the driving thread.
 *
 * @code
 *   #include <brigade/brigade.h>
 *   #include <stdio.h>
 *
 *   static bg_status_t my_batch(const bg_batch_request_t *rq, int32_t *tokens, float *features,
 *                               int32_t *targets, void *arg)
 *   {
 *       (void)tokens; (void)arg;
 *       size_t n = (size_t)rq->in.n * (size_t)rq->in.t;
 *       for (size_t i = 0; features && i < n * (size_t)rq->in.c; i++)
 *           features[i] = (float)((i + (size_t)rq->step) % 7) - 3.0f;
 *       for (size_t i = 0; targets && i < n; i++)
 *           targets[i] = (int32_t)(i % 4);
 *       return BG_OK;
 *   }
 *
 *   int train_my_model(bg_model_desc_t *desc)   // a checked description ending in a 4-class loss
 *   {
 *       bg_executor_params_t p = BG_EXECUTOR_PARAMS_INIT;
 *       p.model = desc;
 *       p.pp = 2;                        // run under: brigade launch -n 2 -- ./my_program
 *       p.batch = 8; p.microbatches = 4;
 *       p.data.batch = my_batch;
 *       bg_executor_t *x;
 *       if (bg_executor_create(&p, &x) != BG_OK) { fprintf(stderr, "%s\n", bg_last_error()); return 1; }
 *       for (int s = 0; s < 100; s++) {
 *           bg_step_result_t r;
 *           bg_executor_set_lr(x, 1e-3f * (s < 10 ? (float)(s + 1) / 10 : 1.0f));   // the host's schedule
 *           if (bg_executor_step(x, &r) != BG_OK) { fprintf(stderr, "%s\n", bg_last_error()); break; }
 *           if (bg_executor_rank(x) == 0) printf("step %lld loss %.4f\n", (long long)r.step, r.loss);
 *       }
 *       bg_executor_save_weights(x, "out");
 *       return bg_executor_destroy(x) == BG_OK ? 0 : 1;
 *   }
 *
 *   int main(void) { return 0; }   // see docs/byom.md for a whole program that builds its model
 * @endcode
 */
#ifndef BRIGADE_EXECUTOR_H
#define BRIGADE_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/model.h"
#include "brigade/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bg_executor bg_executor_t; /**< this rank's part of a job (opaque) */

/** Parameters of bg_executor_create() (grows by appending; size header). */
typedef struct bg_executor_params {
    size_t size;                 /**< sizeof(bg_executor_params_t), set by BG_EXECUTOR_PARAMS_INIT */
    bg_model_desc_t *model;      /**< the model (checked); must outlive the executor */
    int pp;                      /**< pipeline ranks (1: none) */
    int dp;                      /**< data-parallel replicas (1: none) */
    int tp;                      /**< tensor-parallel degree: the model's tensor-parallel layers are of this
                                      degree (1: none); world = pp * dp * tp, tp fastest */
    const char *schedule;        /**< gpipe|1f1b|interleaved|zb-h1|zb-h2|zbv|zb-interleaved|dualpipev|dualpipe; NULL: 1f1b */
    int chunks;                  /**< model chunks per pipeline rank (0: the schedule's default) */
    const int *split;            /**< layers per virtual stage (pp*chunks entries), or NULL: even */
    int nsplit;
    int batch;                   /**< global batch: sequences per optimizer step */
    int microbatches;            /**< per step and replica; batch = dp * microbatches * sequences per microbatch */
    bg_optim_config_t optim;     /**< the optimizer (its lr: see bg_executor_set_lr) */
    bg_batch_source_t data;      /**< where microbatches come from (required) */
    const char *backend;         /**< kernel backend; NULL: "cpu" */
    int threads;                 /**< compute threads; 0: BRIGADE_NUM_THREADS or all cores */
    bg_comm_t *comm;             /**< the job's communicator; NULL: one is created from the environment
                                      (brigade launch, torchrun, Open MPI or Slurm variables) and owned */
    int recompute;               /**< recompute activations in the backward on every stage */
    const int *recompute_stages; /**< or per (virtual) stage: 1 = recompute; NULL = none */
    int nrecompute_stages;
    const char *trace_path;      /**< Chrome trace-event JSON of every op, written by bg_executor_write_trace */
    int process_wide;            /**< 1: the host gives brigade the process (the CLI does): bind it to its
                                      local rank's NUMA node as BRIGADE_NUMA says, set OpenBLAS to one
                                      thread, tune malloc, install the UCX log handler; 0: none of these
                                      process-wide side effects (docs/architecture.md, "Process-wide state") */
    const char *schedule_json;   /**< run this program (the JSON of brigade schedule --json, any program
                                      bg_schedule_validate accepts) instead of generating `schedule`;
                                      it must be for pp ranks and `microbatches` (and `chunks` when set);
                                      NULL: generate */
    int zero;                    /**< sharding across the dp replicas of a stage (docs/data_parallel.md): 0 none;
                                      1 the optimizer state (1/dp each, the weights of 0 bitwise); 2 also the
                                      reduced gradients (each microbatch's buckets reduce-scattered; within
                                      rounding of 0); 3 also the parameters (each layer's weights gathered
                                      before its compute; within rounding of 0). dp = 1: changes nothing */
    const char *emulate;         /**< emulated scale: a layer profile (brigade profile --json); each compute
                                      instruction sleeps its stages' profiled time x emulate_scale instead of
                                      running (buffers and messages of the real sizes, no arithmetic, no
                                      optimizer update: the weights do not change); NULL: compute */
    double emulate_scale;        /**< factor on the profiled times (0: 1) */
    int ps;                      /**< parameter servers (docs/parameter_server.md): ranks 0 .. ps-1 hold the
                                      parameters and optimizer state, sharded by whole tensors; the other
                                      world - ps ranks are workers, each a replica: one rank, or a pipeline
                                      of pp consecutive ranks (world - ps a multiple of pp; tp = 1, no zero,
                                      not dualpipe; dp: 1 or (world - ps) / pp); 0: none */
    int staleness;               /**< with ps: a worker computes step t on parameters of a version >= t - K
                                      (0: synchronous, the weights of dp = (world - ps) / pp) */
    const size_t *device_mem;    /**< caps on the ranks' backend memory in bytes (bg_backend_params_t.mem_cap,
                                      enforced by the backend's allocator on every backend, the CPU's too):
                                      one entry for every rank, or one per rank of the job (heterogeneous
                                      devices); an allocation past its rank's cap fails the create or the
                                      step naming the stage, buffer and bytes; 0 in an entry, or NULL: none */
    int ndevice_mem;             /**< entries of device_mem: 0, 1 or the job's world size */
    double clip_grad;            /**< > 0: clip by global norm: before the optimizer step every gradient is
                                      multiplied by min(1, clip_grad / (norm + 1e-6)), norm being the L2 norm of
                                      the whole model's gradients (over pp, dp, tp, ZeRO shards, parameter
                                      servers), summed exactly so that it does not depend on the layout; the
                                      updates then wait for every stage's norm (the step's end); 0: none */
    uint64_t data_seed;          /**< the host's data seed: the executor does not use it, but every rank
                                      of the job must have the same (compared when the executor is created,
                                      with the other settings; a host without one leaves 0) */
    int ep;                      /**< expert parallelism (docs/executor.md): the model's MoE layers are built for
                                      this degree (bg_model_config_t.ep) and each group of ep consecutive
                                      data-parallel ranks of a stage holds their experts between them; divides
                                      dp (1: none) */
    int cp;                      /**< context-parallel degree (docs/executor.md, "Context parallelism"): each
                                      sequence is split over cp ranks, 2 cp chunks of T / (2 cp) positions,
                                      member i holding chunks i and 2 cp - 1 - i; attention runs as a ring
                                      over them, every other layer is position-wise; world = pp * dp * cp * tp
                                      (cp between dp and tp in the rank order); the gradients are summed over
                                      dp x cp. Needs sequence lengths divisible by 2 cp, models whose layers
                                      all support it (GPT's), no ZeRO, no parameter servers, no sequence
                                      parallelism; 1 (or 0 in params of an older size): none */
    int offload;                 /**< what lives outside the backend's memory (docs/offload.md), BG_OFFLOAD_* bits:
                                      OPTIMIZER the optimizer state (--zero 1|2: each replica's shard) in host
                                      memory or in files under offload_dir, not counted against device_mem
                                      (backends whose buffers are host memory: the cpu backend); ACTIVATIONS
                                      each forwarded microbatch's stash in host memory until just before its
                                      backward (not counted off the device by predicted_act_bytes yet);
                                      PARAMS (--zero 3) each replica's parameter shard; 0: none */
    const char *offload_dir;     /**< with offload: files there (memory-mapped, unlinked at once, a full disk
                                      an error at create), created when missing; NULL or "": host memory */
} bg_executor_params_t;

/** Bits of bg_executor_params_t.offload. */
enum { BG_OFFLOAD_OPTIMIZER = 1, BG_OFFLOAD_ACTIVATIONS = 2, BG_OFFLOAD_PARAMS = 4 };

/** Defaults of bg_executor_params_t: one process, 1F1B, batch 8 in 4 microbatches, AdamW. */
#define BG_EXECUTOR_PARAMS_INIT                                                                            \
    { .size = sizeof(bg_executor_params_t), .model = NULL, .pp = 1, .dp = 1, .tp = 1, .schedule = NULL,      \
      .chunks = 0, .split = NULL, .nsplit = 0, .batch = 8, .microbatches = 4,                                \
      .optim = BG_OPTIM_CONFIG_INIT, .data = {.batch = NULL, .seq_len = NULL, .arg = NULL, .seq = 0},        \
      .backend = NULL, .threads = 0, .comm = NULL, .recompute = 0, .recompute_stages = NULL,                \
      .nrecompute_stages = 0, .trace_path = NULL, .process_wide = 0, .schedule_json = NULL, .zero = 0,       \
      .emulate = NULL, .emulate_scale = 0, .ps = 0, .staleness = 0, .device_mem = NULL,       \
      .ndevice_mem = 0, .clip_grad = 0, .data_seed = 0, .ep = 1, .cp = 1, .offload = 0, .offload_dir = NULL }

/** What one step did (the same on every rank except the per-rank fields). */
typedef struct bg_step_result {
    int64_t step;            /**< steps completed after this one (1-based number of this step) */
    double loss;             /**< mean loss over the global batch's positions */
    double tokens;           /**< positions in the global batch */
    double step_ms;          /**< wall time on this rank */
    double tokens_per_s;     /**< tokens / step time */
    double bubble;           /**< per rank: idle fraction of the step (1 - compute time / step time) */
    uint64_t bytes_sent;     /**< per rank: point-to-point bytes sent */
    size_t peak_bytes;       /**< per rank: the allocator's peak so far */
    int stop;                /**< 1: some rank called bg_executor_request_stop (all ranks agree) */
    double grad_norm;        /**< global L2 norm of the whole model's gradients (all stages, after the
                                  data-parallel sum, before the optimizer step; a tied tensor counted
                                  once); the same on every rank; within 1e-6 relative across layouts
                                  (with clip_grad: summed exactly, the same bits in every layout whose
                                  gradients are; the norm before clipping).
                                  --ps: a server's own tensors; NaN on a worker */
    /* ---- parameter-server mode (bg_executor_params_t.ps); zero otherwise ---- */
    int ps_role;             /**< 1: a server, 2: a worker */
    int staleness;           /**< worker: this step minus the version of the parameters it computed on */
    uint64_t bytes_recv;     /**< point-to-point bytes received: pushed gradients (server), parameters (worker) */
    double optim_ms;         /**< server: summing the pushes and the optimizer step */
    double idle;             /**< server: fraction of the step spent waiting for the workers' pushes */
    int live_workers;        /**< server: workers alive after this step */
    /* ---- MoE layers (bg_layer_moe) on this rank; NaN and 0 without any ---- */
    double moe_aux;          /**< per rank: the mean of the load-balancing loss E sum_e f_e P_e (without its
                                  coefficient) over this rank's MoE layers' forwards of the step */
    int64_t moe_dropped;     /**< per rank: token-expert choices the capacity dropped in the step's forwards
                                  (this rank's tokens: the routing is its own, whatever the expert layout) */
} bg_step_result_t;

/** What the executor holds and predicts on this rank. */
typedef struct bg_executor_info {
    int rank, world;             /**< this process and the job */
    int pp_rank, dp_rank;        /**< this rank's pipeline position and replica */
    int stages;                  /**< virtual stages of the pipeline */
    int chunks;                  /**< model chunks on this rank */
    size_t params;               /**< parameters held on this rank (dualpipe: both copies' stages, so 2x) */
    double flops_per_step;       /**< model FLOPs (forward + backward) of one step of the whole job */
    size_t predicted_bytes;      /**< params + grads + optimizer (the shard with zero) + predicted activations
                                      (+ the other copy's gradient with dualpipe) */
    size_t predicted_act_bytes;  /**< predicted as brigade plan predicts it: the planner's replay of this rank's
                                      program (bg_part_schedule_counts) times each chunk's slot buffers, + scratch */
    int predicted_stashed;       /**< the simulator's peak of microbatches stashed on this rank */
    int peak_stashed;            /**< measured peak so far */
    size_t peak_act_bytes;       /**< measured peak of activation memory so far */
    int numa_node;               /**< NUMA node this rank was bound to, -1 if none */
    const char *schedule;        /**< the schedule's name */
    int zero;                    /**< the sharding stage in effect (0 when dp = 1) */
} bg_executor_info_t;

/** Create this rank's part of the job: checks everything (messages name the
 *  field), connects the ranks, builds and initialises this rank's stages. */
bg_status_t bg_executor_create(const bg_executor_params_t *params, bg_executor_t **x_p);
/** Run one optimizer step on every rank (collective). On an error the
 *  message names the rank, stage, step, operation and microbatch; the
 *  executor cannot step again (destroy it; resume from a checkpoint). */
bg_status_t bg_executor_step(bg_executor_t *x, bg_step_result_t *result_p);
/** What bg_executor_eval() measured (the same on every rank except eval_ms). */
typedef struct bg_eval_result {
    double loss;             /**< mean loss over the batch's positions, reduced over the replicas as
                                  bg_step_result_t.loss is (fp32): bitwise the loss a step on the same batch
                                  and weights reports */
    double tokens;           /**< positions in the global batch */
    double eval_ms;          /**< wall time on this rank */
} bg_eval_result_t;

/** Evaluate the current weights on one global batch (collective): every rank runs the forward-only
 *  program of the schedule (bg_schedule_forward_only: stage forwards and activation transfers in the
 *  schedule's order, the loss on the last stage, no backward and no stash kept). The batch has the
 *  training layout (batch, microbatches, replicas); its microbatches come from @p data (NULL: the
 *  training source), asked with step = @p index (e.g. the held-out set's batch number; its seq_len
 *  callback, if any, gives the lengths). Changes no weight, gradient, optimizer state or step count: a
 *  run that evaluates between steps trains bitwise as one that does not. Errors: BG_ERR_UNSUPPORTED
 *  under parameter servers or emulation; a failure breaks the executor as a failed step does. */
bg_status_t bg_executor_eval(bg_executor_t *x, const bg_batch_source_t *data, int64_t index,
                             bg_eval_result_t *result_p);
/** The learning rate of the next steps (the host's schedule; every rank must set the same: the
 *  step's end compares it across the ranks, and a step taken with different ones fails on every
 *  rank naming the values and the ranks). */
void bg_executor_set_lr(bg_executor_t *x, float lr);
/** Ask the job to stop: the next step's result has stop = 1 on every rank (signal-safe: sets a flag). */
void bg_executor_request_stop(bg_executor_t *x);
/** Steps completed (the next step's 0-based index). */
int64_t bg_executor_steps_done(const bg_executor_t *x);
int bg_executor_rank(const bg_executor_t *x); /**< this process's rank in the job */
bg_comm_t *bg_executor_comm(bg_executor_t *x); /**< the job's communicator (the host's, or the one the executor created) */
void bg_executor_info(bg_executor_t *x, bg_executor_info_t *info_p); /**< what the executor holds and predicts on this rank */

/** Save a checkpoint (weights, optimizer state, the model description,
 *  layout) of the steps done under @p root, keeping the newest @p keep
 *  (0: all). Collective; atomic (see checkpoint.h). */
bg_status_t bg_executor_save_checkpoint(bg_executor_t *x, const char *root, int keep);
/** The data position the next checkpoints record (bg_checkpoint_info_t.data_position): where the host's
 *  data continues after the steps done (bg_train: the token files' sequence count); -1 (the default):
 *  the step count, for data that is a function of the step. Every rank should set the same. */
void bg_executor_set_data_position(bg_executor_t *x, int64_t position);
/** Load the newest valid checkpoint under @p root (saved under any layout):
 *  weights, optimizer state and the step count; an invalid newer one is
 *  skipped with a warning in the log. *found_p = 0 (and nothing changes)
 *  when there is none. bg_executor_resume_with() says more and can refuse. */
bg_status_t bg_executor_resume(bg_executor_t *x, const char *root, int *found_p);

/** Where bg_executor_resume_with() looks (grows by appending; size header). */
typedef struct bg_resume_params {
    size_t size;          /**< sizeof(bg_resume_params_t), set by BG_RESUME_PARAMS_INIT */
    const char *root;     /**< a checkpoint root: its newest valid checkpoint */
    const char *path;     /**< or exactly this checkpoint directory (wins over root); it must be valid */
    int strict;           /**< 1: with root, fail when the newest checkpoint is invalid instead of
                               falling back to the previous complete one */
} bg_resume_params_t;

#define BG_RESUME_PARAMS_INIT { .size = sizeof(bg_resume_params_t), .root = NULL, .path = NULL, .strict = 0 }

/** What bg_executor_resume_with() did (the same on every rank). */
typedef struct bg_resume_result {
    int found;             /**< 1: a checkpoint was loaded; 0: none (nothing changed) */
    int64_t step;          /**< its step: the steps done now */
    char path[4096];       /**< its directory */
    int pp, dp;            /**< the layout that wrote it (its manifest's "extra"; 0: not recorded) */
    int world;             /**< ranks of the job that wrote it */
    int invalid;           /**< step-N directories skipped as invalid (newer than the one loaded, or all
                                of them when found = 0) */
    char invalid_what[1024]; /**< the newest invalid one and what is wrong with it (one line), or "" */
} bg_resume_result_t;

/** Resume from a checkpoint, as @p params say (collective: every rank
 *  loads its tensors and all agree on the checkpoint). With a root, the
 *  newest step-N directory that every rank loads whole is used; a damaged
 *  newer one (unreadable or corrupt manifest, a missing, truncated or
 *  corrupt file) is skipped and described in result->invalid_what, or with
 *  strict is an error. No step-N directory at all: found = 0, BG_OK. Every
 *  one invalid: found = 0 and BG_OK (strict: an error); the caller should
 *  say so. A checkpoint of another model, optimizer or format version is an
 *  error, never skipped. On error nothing changed. */
bg_status_t bg_executor_resume_with(bg_executor_t *x, const bg_resume_params_t *params,
                                    bg_resume_result_t *result_p);
/** Write the weights as DIR/model.safetensors (one stage) or
 *  DIR/model-stageNNN.safetensors (one file per stage, replica 0 writes).
 *  Every rank that writes calls it (others may: they return at once). DIR
 *  is replaced as a whole once every writer has finished (written into
 *  DIR.tmp-<token>, then exchanged with DIR): a reader sees the old weights
 *  or the new, and on error DIR is as it was. DIR must hold nothing but
 *  *.safetensors files. */
bg_status_t bg_executor_save_weights(bg_executor_t *x, const char *dir);
/** Load weights by name from a directory written by bg_executor_save_weights (any split). */
bg_status_t bg_executor_load_weights(bg_executor_t *x, const char *dir);
/** Write the trace to params.trace_path (collective: rank 0 gathers every rank's events). */
bg_status_t bg_executor_write_trace(bg_executor_t *x);
/** Destroy this rank's part (collective when it owns the comm). */
bg_status_t bg_executor_destroy(bg_executor_t *x);

/** A tensor-parallel group over the transport, for hosts that drive models
 *  and stages themselves (the executor makes its own): what the layers'
 *  ctx->tp calls (bg_tp_comm_t) as the transport's group collectives. */
typedef struct bg_tp_group bg_tp_group_t;
/** The tensor group of world ranks [@p first, @p first + @p tp) (called by those ranks only, collective
 *  over them), bound to @p desc (bg_model_desc_set_tp), whose tensor-parallel layers must be of degree
 *  @p tp (BG_ERR_INVALID naming both). tp = 1: *group_p = NULL, nothing bound. */
bg_status_t bg_tp_group_create(bg_comm_t *comm, bg_model_desc_t *desc, int tp, int first, bg_tp_group_t **group_p);
/** Unbind @p desc from the group and free it (NULL: nothing). Models built from desc must be gone. */
void bg_tp_group_destroy(bg_tp_group_t *group, bg_model_desc_t *desc);
/** Seconds this member has spent in the group's blocking collectives and in waits for its non-blocking
 *  ones since the group was created (what a trace shows as tp_*; NULL: 0). */
double bg_tp_group_seconds(const bg_tp_group_t *group);

/** How the executor moves a device backend's buffers between ranks (one
 *  line, for brigade info): which UCX this build links (the system's, or a
 *  CUDA-aware one found at configure time, which then gets the device
 *  buffers of sends and receives directly where it reports CUDA memory at
 *  run time), else staged through pinned host memory in chunks. */
const char *bg_executor_device_transport(void);
/** The providers of the group collectives on backend buffers (tensor-parallel, data-parallel and ZeRO
 *  groups: host, staging, direct, nccl), whether each can run here (nccl: whether libnccl.so.2 loads, its
 *  version) and which one each backend's groups would use; lines of text for brigade info. The executor
 *  logs the provider of each of its groups (BRIGADE_LOG=info). */
const char *bg_executor_collective_providers(void);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_EXECUTOR_H */
