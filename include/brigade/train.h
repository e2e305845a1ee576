/**
 * @file train.h
 * @brief The CLI's training job: the built-in models and data, the step
 *        loop, metrics, checkpoints and saving, over the executor.
 *
 * `batch` is the global batch (sequences per optimizer step), split into
 * `microbatches` equal microbatches whose gradients accumulate in microbatch
 * order before one optimizer step. The loss is the mean over the batch's
 * tokens (positions), so gradients do not depend on how the batch is split.
 *
 * Ownership and threads: the configuration's strings and arrays stay the
 * caller's (read during bg_train only); a result owns its per-rank array
 * until bg_train_result_free(). bg_train drives one job from the calling
 * thread (one job per process); on_step and on_resume run on that thread;
 * stop_flag may be set from a signal handler or another thread.
 */
#ifndef BRIGADE_TRAIN_H
#define BRIGADE_TRAIN_H

#include "brigade/executor.h"
#include "brigade/lr.h"
#include "brigade/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Called after every step (the CLI prints progress from it). */
typedef struct bg_step_info {
    int step;            /**< 1-based */
    int steps;           /**< total */
    double loss;         /**< mean loss of the step's batch */
    double step_ms;      /**< wall time of the step */
    double tokens_per_s; /**< batch tokens / step time */
    int rank;            /**< rank reporting (0 in a single process) */
    double grad_norm;    /**< global L2 norm of the gradients before the optimizer step (bg_step_result_t) */
    double lr;           /**< learning rate of the step (the schedule's, bg_lr_at) */
    double val_loss;     /**< held-out loss after this step (eval_every), NaN when the step did not evaluate;
                              its perplexity is exp(val_loss) */
} bg_step_info_t;
typedef void (*bg_step_fn)(const bg_step_info_t *info, void *arg);

/** A training job of the CLI; start from BG_TRAIN_CONFIG_INIT or bg_train_config_init(). */
typedef struct bg_train_config {
    size_t size;                 /**< sizeof(bg_train_config_t) */
    bg_model_config_t model;
    bg_optim_config_t optim;
    int batch;                   /**< global batch, sequences */
    int microbatches;            /**< per step; divides batch */
    int seq;                     /**< GPT: training sequence length (<= model.seq_len); 0 = model.seq_len */
    int steps;
    const char *data_path;       /**< GPT: text corpus or token files (data_format) */
    uint64_t data_seed;          /**< order of the data */
    const char *metrics_path;    /**< JSON lines, one per step; NULL = none */
    const char *save_dir;        /**< final weights as DIR/model.safetensors; NULL = none */
    const char *backend;         /**< "cpu" (default), "cuda" */
    int threads;                 /**< compute threads; 0 = default */
    bg_step_fn on_step;
    void *on_step_arg;
    /* ---- parallel training (runtime/executor.c); pp = dp = 1 is one process ---- */
    int pp;                      /**< pipeline stages (ranks); 1 = none */
    int dp;                      /**< data-parallel replicas; 1 = none */
    const char *schedule;        /**< gpipe|1f1b|interleaved|zb-h1|zb-h2|zbv|zb-interleaved|dualpipev|dualpipe (default 1f1b) */
    int chunks;                  /**< model chunks per pipeline rank (0: the schedule's default) */
    const int *split;            /**< layers per virtual stage (pp*chunks entries), or NULL: even */
    int nsplit;
    int seq_min;                 /**< GPT: > 0 makes each microbatch's length vary in [seq_min, seq] */
    const char *trace_path;      /**< Chrome trace-event JSON of every op on every rank; NULL = none */
    int recompute;               /**< recompute activations in the backward on every stage */
    const int *recompute_stages; /**< or per (virtual) stage: 1 = recompute (from a plan); NULL = none */
    int nrecompute_stages;
    /* ---- checkpoints (runtime/checkpoint.c); any of them runs the executor ---- */
    const char *checkpoint_dir;  /**< root of the checkpoints; NULL = none */
    int checkpoint_every;        /**< save every N steps (0: only at the end and on a stop request) */
    int keep;                    /**< keep the newest K complete checkpoints (0: all) */
    int resume;                  /**< continue from the newest complete checkpoint, if any */
    int process_wide;            /**< 1: process-wide settings (NUMA binding, OpenBLAS threads, malloc,
                                      UCX log handler; see executor.h); the CLI sets it */
    volatile int *stop_flag;     /**< set (e.g. by a SIGTERM handler) to stop at the next step boundary
                                      (checkpointing when checkpoint_dir is set) and return; every rank
                                      agrees on the step. Handlers are safe: the CPU backend holds a
                                      thread's asynchronous signals while oneDNN runs (its JIT kernels
                                      move rsp into the heap; docs/kernels.md) */
    /* ---- resume (bg_executor_resume_with) ---- */
    const char *resume_from;     /**< resume from exactly this checkpoint directory (implies resume) */
    int resume_strict;           /**< with resume: an invalid newest checkpoint is an error, not skipped */
    void (*on_resume)(const bg_resume_result_t *r, const char *where, int rank, void *arg);
                                 /**< what resume did (where: resume_from or checkpoint_dir), called on
                                      every rank before the first step; arg: on_step_arg */
    /* ---- a program to run instead of a generated schedule ---- */
    const char *schedule_json;   /**< JSON program (brigade schedule --json) run instead of `schedule`;
                                      NULL: generate (see bg_executor_params_t.schedule_json) */
    int zero;                    /**< sharding across the dp replicas (executor.h: bg_executor_params_t.zero) */
    const char *emulate;         /**< emulated compute from this layer profile (bg_executor_params_t.emulate) */
    double emulate_scale;        /**< its factor (0: 1) */
    /* ---- parameter servers (bg_executor_params_t.ps; docs/parameter_server.md) ---- */
    int ps;                      /**< servers: ranks 0 .. ps-1; the other ranks are workers; 0: none */
    int staleness;               /**< with ps: the staleness bound K (0: synchronous) */
    int seq_multiple;            /**< GPT with seq_min: lengths rounded up to a multiple of this (it divides
                                      seq); 0: 1, or tp under sequence parallelism */
    const size_t *device_mem;    /**< caps on the ranks' backend memory (bg_executor_params_t.device_mem) */
    int ndevice_mem;             /**< its entries: 0 (none), 1 (every rank) or the world size */
    /* ---- learning rate (brigade/lr.h) ---- */
    bg_lr_schedule_t lr_schedule; /**< the rate of every step: its kind, warmup, min_lr, decay_steps and
                                       wsd_decay; its peak is optim.lr (lr_schedule.lr is not read);
                                       decay_steps 0: steps. Default: constant, no warm-up */
    const char *data_format;      /**< GPT: how data_path is read: "text" (bytes are tokens), "llmc", "raw16",
                                       "raw32" (token files, bg_data_open_tokens: data_path may list shards),
                                       "auto" or NULL: llmc when the first file starts with llm.c's magic,
                                       raw16 when it ends in .bin or data_path names several files or a
                                       pattern, else text */
    double clip_grad;             /**< > 0: clip the gradients by global norm (bg_executor_params_t.clip_grad) */
    const char *run_config_json;  /**< the run's effective settings as a JSON object (the CLI: its flags), kept
                                       with its outputs: the metrics header's "config" and, by rank 0,
                                       checkpoint_dir/config.json; NULL: none */
    /* ---- evaluation (bg_executor_eval: a forward-only program) ---- */
    int eval_every;              /**< the held-out loss after every N steps and after the last; 0: never */
    int eval_batches;            /**< global batches per evaluation (the held-out set's batches 0..M-1, the same
                                      each time, at the full sequence length); 0: 4 */
    double val_fraction;         /**< with eval_every: hold out this last fraction of the corpus (the training
                                      data is the rest; synthetic data: other samples of the task); 0: 0.1
                                      (without eval_every nothing is held out) */
    const char *val_path;        /**< GPT with eval_every: a held-out text file instead (nothing held out of
                                      data_path) */
    int cp;                      /**< context-parallel degree (bg_executor_params_t.cp): each sequence split
                                      over cp ranks, attention as a ring; 0 or 1: none */
    int offload;                 /**< BG_OFFLOAD_* bits (bg_executor_params_t.offload); 0: none */
    const char *offload_dir;     /**< with offload: its files' directory (bg_executor_params_t.offload_dir) */
} bg_train_config_t;

/** Defaults of bg_train_config_t (what bg_train_config_init() sets): GPT as BG_MODEL_CONFIG_INIT, AdamW
 *  lr 1e-3, batch 8 in 4 microbatches, 20 steps, data seed 1, the CPU backend, one process (pp = dp = 0
 *  count as 1), nothing saved. */
#define BG_TRAIN_CONFIG_INIT                                                                             \
    { .size = sizeof(bg_train_config_t), .model = BG_MODEL_CONFIG_INIT, .optim = BG_OPTIM_CONFIG_INIT,   \
      .batch = 8, .microbatches = 4, .seq = 0, .steps = 20, .data_path = NULL, .data_seed = 1,           \
      .metrics_path = NULL, .save_dir = NULL, .backend = "cpu", .threads = 0, .on_step = NULL,           \
      .on_step_arg = NULL, .pp = 0, .dp = 0, .schedule = NULL, .chunks = 0, .split = NULL, .nsplit = 0,  \
      .seq_min = 0, .trace_path = NULL, .recompute = 0, .recompute_stages = NULL,                        \
      .nrecompute_stages = 0, .checkpoint_dir = NULL, .checkpoint_every = 0, .keep = 0, .resume = 0,     \
      .process_wide = 0, .stop_flag = NULL, .resume_from = NULL, .resume_strict = 0, .on_resume = NULL,  \
      .schedule_json = NULL, .zero = 0, .emulate = NULL, .emulate_scale = 0.0, .ps = 0, .staleness = 0,  \
      .seq_multiple = 0, .device_mem = NULL, .ndevice_mem = 0, .lr_schedule = BG_LR_SCHEDULE_INIT,      \
      .data_format = NULL, .clip_grad = 0.0, .run_config_json = NULL,                                \
      .eval_every = 0, .eval_batches = 0, .val_fraction = 0.0, .val_path = NULL, .cp = 1, .offload = 0,  \
      .offload_dir = NULL }

/** Defaults: GPT as BG_MODEL_CONFIG_INIT, AdamW lr 1e-3, batch 8, 4 microbatches, 20 steps. */
void bg_train_config_init(bg_train_config_t *cfg);

/** One rank's figures at the end of bg_train() (bg_train_result_t.ranks). */
typedef struct bg_train_rank {
    int rank;                   /**< rank in the job */
    int pp_rank, dp_rank;       /**< its pipeline position and replica */
    size_t params;              /**< parameters it holds */
    size_t peak_bytes;          /**< the allocator's peak */
    size_t peak_act_bytes;      /**< peak of activation memory (allocator) */
    size_t predicted_act_bytes; /**< its prediction (bg_executor_info_t.predicted_act_bytes) */
    int peak_stashed;           /**< peak microbatches stashed at once */
    int predicted_stashed;      /**< the simulator's peak */
    double bubble;              /**< measured idle fraction of its median step */
    int numa_node;              /**< NUMA node it was bound to, -1 if none */
    size_t predicted_bytes;     /**< params + grads + optimizer (its shard with zero) + predicted activations */
} bg_train_rank_t;

/** What bg_train() did, on this rank. */
typedef struct bg_train_result {
    double final_loss;        /**< loss of the last step */
    double first_loss;        /**< loss of the first step */
    double median_step_ms;    /**< median of the run's steps (of its last 4096), its first left out when it
                                   ran 3 or more (the first allocates and touches everything) */
    double tokens_per_s;      /**< median */
    double flops_per_step;    /**< model FLOPs (forward + backward) per step, from the layers */
    size_t params;
    size_t peak_bytes;        /**< the allocator's peak */
    size_t predicted_bytes;   /**< params + grads + optimizer + activations as layers report them */
    int rank;                 /**< this process's rank (parallel runs) */
    int world;                /**< ranks in the job */
    double bubble;            /**< measured idle fraction of this rank's step (median step) */
    size_t peak_act_bytes;    /**< peak of activation memory on this rank (allocator) */
    int peak_stashed;         /**< peak microbatches stashed at once on this rank */
    int predicted_stashed;    /**< the simulator's peak for this rank and schedule */
    size_t predicted_act_bytes; /**< the planner's replay of this rank's program x its slot buffers + scratch
                                     (bg_executor_info_t.predicted_act_bytes) */
    int start_step;           /**< first step run (> 0 when resumed) */
    int steps_done;           /**< steps completed when it returned */
    int stopped;              /**< 1: returned early on a stop request (after checkpointing when
                                   checkpoint_dir is set; the final weights are not saved) */
    int numa_node;            /**< NUMA node this rank was bound to, -1 if none (BRIGADE_NUMA) */
    bg_train_rank_t *ranks;   /**< every rank's figures in rank order (nranks = world entries, gathered
                                   over the job's communicator before the executor goes; the same on every
                                   rank); owned by the result: bg_train_result_free() */
    int nranks;
    double val_loss;          /**< the last evaluation's held-out loss (eval_every), NaN when none ran */
} bg_train_result_t;

/** Free what a bg_train() result owns (ranks); the struct itself is the caller's. NULL is a no-op. */
void bg_train_result_free(bg_train_result_t *r);

/** Check the configuration (messages name the flag-level field) without running. */
bg_status_t bg_train_check(const bg_train_config_t *cfg);
/** Run a whole training job of a built-in model (GPT on a corpus, MLP on
 *  the synthetic task) to completion: this rank's part of a pipeline/data-
 *  parallel job (the world comes from the environment, see transport.h;
 *  every rank calls bg_train with the same configuration; one process is
 *  pp = dp = 1). A host loop over the executor (executor.h), which is what
 *  a framework drives directly for its own models and data. */
bg_status_t bg_train(const bg_train_config_t *cfg, bg_train_result_t *result_p);
/** Sequence length of microbatch `mb` of step `step` (variable lengths). */
int bg_train_seq_len(const bg_train_config_t *cfg, int64_t step, int mb);

#ifdef __cplusplus
}
#endif
#endif
