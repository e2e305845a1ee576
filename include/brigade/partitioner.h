/**
 * @file partitioner.h
 * @brief Split a model into contiguous pipeline stages that fit each device's
 *        memory, search pipeline x data-parallel layouts, write and read plans.
 *
 * Two levels:
 *  - bg_partition(): the exact partitioner. Given per-layer costs and memory
 *    and, per (virtual) stage, a device (speed, budget) and the slot counts
 *    the schedule keeps on it, it finds contiguous layer ranges minimising the
 *    slowest stage's time per microbatch (compute / speed + its boundary
 *    transfers), subject to every stage fitting its budget, recomputing
 *    activations on a stage only where that is needed to fit. Exact (a pruned
 *    dynamic program, see docs/partitioner.md), not greedy.
 *  - bg_plan_search(): for a model description (any list of layers: a
 *    builder's or the host's own; the planner reads only the sizes and FLOPs
 *    its layers report, bg_model_profile()), a world size and devices,
 *    enumerate pipeline x data-parallel layouts, microbatch counts and
 *    schedules, partition each, simulate each with bg_schedule_simulate(),
 *    rank them by predicted step time. A plan is saved as JSON
 *    (docs/partitioner.md), with the model's description JSON in it, that
 *    `brigade train --plan FILE` runs as is.
 *
 * Ownership and threads: plans and plan sets belong to the caller
 * (bg_plan_free, bg_plan_set_free); a plan got from a set
 * (bg_plan_set_get) is borrowed and lives as long as the set. The
 * partitioner keeps no global state: calls on distinct objects may run
 * concurrently, and a plan may be read from several threads while nothing
 * modifies it. The model a bg_plan_params_t points to stays the caller's.
 *
 * @code
 *   bg_model_config_t mc = BG_MODEL_CONFIG_INIT;
 *   mc.layers = 48; mc.d_model = 2048; mc.heads = 16; mc.seq_len = 1024;
 *   bg_model_desc_t *desc;
 *   if (bg_model_build(&mc, &desc) != BG_OK) return 1;   // or a description of your own layers
 *   bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
 *   pp.model = desc;
 *   pp.world = 8; uint64_t mem = 24ull << 30; pp.mem = &mem; pp.nmem = 1;
 *   pp.batch = 64; pp.microbatch_size = 1;
 *   bg_plan_set_t *set;
 *   if (bg_plan_search(&pp, &set) == BG_OK) {
 *       const bg_plan_t *best = bg_plan_set_get(set, 0);
 *       bg_plan_save(best, "plan.json");
 *       bg_plan_set_free(set);
 *   } else {
 *       fprintf(stderr, "%s\n", bg_last_error());
 *   }
 *   bg_model_desc_destroy(desc);
 * @endcode
 */
#ifndef BRIGADE_PARTITIONER_H
#define BRIGADE_PARTITIONER_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/model.h"
#include "brigade/schedule.h"
#include "brigade/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* The exact partitioner                                                    */

/** One layer as the partitioner sees it (bytes as in bg_layer_profile_t). */
typedef struct bg_part_layer {
    size_t params;        /**< parameters (4 bytes each, plus gradient and optimizer state) */
    size_t stash_bytes;   /**< kept per microbatch from F to the end of backward (incl. its output) */
    size_t wstash_bytes;  /**< kept from B to W in a split backward (incl. its output gradient) */
    size_t scratch_bytes; /**< temporary of one call */
    size_t output_bytes;  /**< its output as kept and sent to the next stage when it ends a stage */
    double fwd_time;      /**< forward seconds per microbatch on a speed-1 device */
    double bwd_time;      /**< backward (B + W) seconds per microbatch on a speed-1 device */
    size_t grad_bytes;    /**< its output's gradient (fp32), received from the next stage and held in the
                               backward's buffers; 0: output_bytes (outputs kept in fp32) */
} bg_part_layer_t;

/** How many microbatch slots of a stage are, at one point of its rank's
 *  program, begun (input buffer), forwarded (data + activations), holding an
 *  output gradient, inside a backward (its backward buffer), and holding full
 *  activations if the stage recomputes (the slots in a backward, plus the one
 *  being forwarded). The stage's activation memory is the largest over its
 *  points of begun x input + forwarded x (data + activations) + dout x output
 *  gradient + backward x backward buffer + lingering x backward buffer (when its
 *  gradient message lingers: bg_part_problem_t.linger_bytes); with
 *  recomputation forwarded x (data + kept output) + recomputing x activations
 *  replaces the middle term. */
typedef struct bg_part_counts {
    int begun, forwarded, dout, backward, recomputing;
    int lingering; /**< fused-backward slots whose gradient send is issued, still held until the next compute
                        instruction is over (a send the transport completes later: see linger_bytes) */
    int fused;     /**< of `backward`, the slots in a full (fused) backward: they hold the fused buffer
                        (bg_part_stage_t.fused_bw_bytes) even on a stage whose backward is split elsewhere in
                        the program (DualPipe, DualPipeV run both kinds) */
    int offloaded; /**< of `forwarded`, the slots whose layers' activations are off the device (activation
                        offload, bg_part_schedule_counts_offact; 0 otherwise); a recomputing stage keeps none
                        there, so the byte model ignores it on such a stage */
} bg_part_counts_t;

/** The device of one (virtual) stage and what the schedule keeps on it. */
typedef struct bg_part_stage_spec {
    double speed;                   /**< relative speed (> 0): compute time is divided by it */
    size_t budget_bytes;            /**< memory this stage may use */
    int split_backward;             /**< 1: B and W are separate (zero-bubble): the B..W buffer */
    int ncounts;                    /**< entries of counts (>= 1) */
    const bg_part_counts_t *counts; /**< slot counts at the program points that can be peaks */
} bg_part_stage_spec_t;

/** A partitioning problem; start from BG_PART_PROBLEM_INIT. Stages are in
 *  pipeline order (virtual stage 0 holds layer 0). */
typedef struct bg_part_problem {
    size_t size;                        /**< sizeof(bg_part_problem_t) */
    int nlayers;
    const bg_part_layer_t *layers;      /**< [nlayers] */
    int nstages;
    const bg_part_stage_spec_t *stages; /**< [nstages] */
    size_t bytes_per_param;             /**< parameters + gradients + optimizer state (4 + 4 + 8 for AdamW) */
    size_t input_bytes;                 /**< model input per microbatch when it is features (floats); 0 for tokens */
    size_t token_bytes;                 /**< tokens the first stage holds per microbatch (token input) */
    size_t target_bytes;                /**< targets the last stage holds per microbatch */
    double link_latency;                /**< seconds per message */
    double link_bandwidth;              /**< bytes per second; 0 = infinite */
    int allow_recompute;                /**< a stage may keep only its input per microbatch and recompute */
    int quick_no_fit;                   /**< 1: bg_partition() answers BG_ERR_NO_FIT without measuring the
                                             shortfall for its message (a search that only needs yes/no) */
    size_t bucket_bytes;                /**< --zero 2: bytes a gradient bucket aims at (BRIGADE_BUCKET_MB) */
    int bucket_buffers;                 /**< --zero 2 and 3: bucket buffers wanted (BRIGADE_ZERO_BUFFERS); 0: not
                                             --zero 2. A stage holds, besides bytes_per_param, buffers of its
                                             largest layer-aligned bucket, the buckets and the buffers' count
                                             sized from its shard as the executor does (bucket_dp) */
    size_t linger_bytes;                /**< a stage whose input gradient message is at least this many bytes
                                             keeps a lingering slot's backward buffer (counts.lingering,
                                             holding that gradient; bg_stage_release frees the rest): the transport
                                             completes such a send only after the next compute instruction
                                             (UCX's rendezvous threshold); 0: no slot lingers */
    int paired;                         /**< 1: the executor runs a forward beside another microbatch's backward
                                             (BRIGADE_TP_OVERLAP=microbatch): a stage holds a second scratch
                                             (the stages' counts come from bg_part_schedule_counts, paired) */
    size_t guard_bytes;                 /**< bytes a stage reserves after each gradient buffer of its backward
                                             (bg_layer_profile_t.guard_bytes; the layers' stash, wstash and
                                             scratch bytes include theirs already); 0: none */
    int bucket_dp;                      /**< --zero 2: the data-parallel degree the shard is cut over */
    int param_buffers;                  /**< --zero 3 (with bucket_buffers set): parameter gather buffers wanted
                                             (BRIGADE_ZERO_PREFETCH + 1), of the largest bucket each, fewer while
                                             they would hold what sharding the parameters saves (none: the stage
                                             holds them whole, as the executor does); 0: not --zero 3 */
} bg_part_problem_t;
/** Defaults of bg_part_problem_t: no layers or stages yet, AdamW's 16 bytes per parameter, free links. */
#define BG_PART_PROBLEM_INIT                                                                            \
    { .size = sizeof(bg_part_problem_t), .nlayers = 0, .layers = NULL, .nstages = 0, .stages = NULL,      \
      .bytes_per_param = 16, .input_bytes = 0, .token_bytes = 0, .target_bytes = 0, .link_latency = 0.0,  \
      .link_bandwidth = 0.0, .allow_recompute = 0, .quick_no_fit = 0, .bucket_bytes = 0,                  \
      .bucket_buffers = 0, .linger_bytes = 0, .paired = 0, .guard_bytes = 0,   \
      .bucket_dp = 1, .param_buffers = 0 }

/** One stage of a partition, or the evaluation of a layer range on a stage. */
typedef struct bg_part_stage {
    int first, last;        /**< layer range, inclusive */
    int recompute;          /**< 1: activations recomputed in the backward */
    int fits;               /**< mem_bytes <= the stage's budget */
    double compute_time;    /**< seconds per microbatch: (F + B + W [+ F]) / speed */
    double comm_time;       /**< its boundary transfers: output forward, input gradient backward */
    double time;            /**< compute_time + comm_time */
    size_t mem_bytes;       /**< predicted peak: static + scratch + activations */
    size_t static_bytes;    /**< parameters, gradients and optimizer state */
    size_t scratch_bytes;   /**< the stage's shared scratch */
    size_t act_bytes;       /**< peak microbatch memory (the counts times the per-slot buffers) */
    size_t stash_per_mb;    /**< input + data + activations (recomputation: + kept output) per stashed microbatch */
    size_t input_bytes;     /**< per slot: input buffer */
    size_t data_bytes;      /**< per slot: tokens and targets */
    size_t layer_act_bytes; /**< per slot: the layers' activations (as bg_stage_memory's stash minus input) */
    size_t dout_bytes;      /**< per slot: incoming output gradient */
    size_t bw_bytes;        /**< per slot in a backward: its buffer (split_backward: B..W's; else fused) */
    size_t fused_bw_bytes;  /**< per slot in a full backward (counts.fused, counts.lingering): its buffer */
    size_t keep_bytes;      /**< per slot with recomputation: the stage's output, kept from F to the backward */
    size_t linger_bytes;    /**< per lingering slot: its backward buffer when its input gradient is sent as a
                                 message of at least bg_part_problem_t.linger_bytes, else 0 */
} bg_part_stage_t;

/** Bytes of the slots that row @p n counts on a stage with the per-slot sizes of @p e (input_bytes,
 *  data_bytes, keep_bytes, layer_act_bytes, dout_bytes, bw_bytes, fused_bw_bytes, linger_bytes, recompute):
 *  the byte model of docs/partitioner.md, which the partitioner, the plan's rank peaks and the executor's
 *  prediction all use. */
size_t bg_part_row_bytes(const bg_part_counts_t *n, const bg_part_stage_t *e);
/** 1 when row @p a needs at least the bytes of row @p b whatever the per-slot sizes (every count at least
 *  b's; full and split backwards compared apart). */
int bg_part_counts_dominate(const bg_part_counts_t *a, const bg_part_counts_t *b);

/** Evaluate layers [first, last] on stage @p stage, with or without
 *  recomputation (the same arithmetic the partitioner uses). */
bg_status_t bg_part_stage_eval(const bg_part_problem_t *prob, int stage, int first, int last, int recompute,
                               bg_part_stage_t *eval_p);

/** Solve: out[nstages] gets the stages; *bottleneck_p the slowest stage's
 *  time. BG_ERR_NO_FIT when no split fits (message: the culprit and the
 *  shortfall, from bg_part_shortfall()); BG_ERR_INVALID for a bad problem. */
bg_status_t bg_partition(const bg_part_problem_t *prob, bg_part_stage_t *out, double *bottleneck_p);

/** Why a problem does not fit, and by how much. */
typedef struct bg_part_shortfall {
    size_t extra_bytes;     /**< smallest amount that, added to every stage's budget, makes it fit (0: fits) */
    int stage;              /**< at that amount, the stage that needs it all */
    int first, last;        /**< its layers */
    size_t need_bytes;      /**< what that stage needs */
    size_t budget_bytes;    /**< its budget */
    int biggest_layer;      /**< the layer of that stage with most static + stash memory */
} bg_part_shortfall_t;
/** Compute the shortfall (exact: extra_bytes fits, extra_bytes - 1 does not). */
bg_status_t bg_part_shortfall(const bg_part_problem_t *prob, bg_part_shortfall_t *sf_p);

/** The smallest input-gradient message that lingers (bg_part_problem_t.linger_bytes): UCX's rendezvous
 *  threshold as the transport sets it (UCX_RNDV_THRESH, else BRIGADE_UCX_RNDV_THRESH, default 256K);
 *  1 (every message) when it is not a plain size such as "auto". */
size_t bg_plan_linger_bytes(void);
/** 1 when a run of this layout pairs instructions, so that a plan counts their memory
 *  (bg_part_problem_t.paired): BRIGADE_TP_OVERLAP=microbatch, @p tp > 1, and no @p zero over @p dp > 1
 *  replicas. (The executor also leaves --ps and --emulate runs, and backends that queue work, unpaired.) */
int bg_plan_paired_for(int tp, int zero, int dp);


/** Slot counts of pipeline rank @p rank over its program, replaying the
 *  executor's allocation order (receives posted up to the next two compute
 *  instructions ahead, fused-backward slots ending after their gradient is
 *  sent; @p paired: the instructions bg_sched_pair_partner pairs hold their
 *  buffers at once, BRIGADE_TP_OVERLAP=microbatch). *rows_p: *npoints_p rows of
 *  `chunks` entries each (entry c: chunk c's counts at one program point; rows
 *  dominated by another are dropped). malloc'ed; free() it. */
bg_status_t bg_part_schedule_counts(const bg_schedule_t *sched, int rank, int paired, bg_part_counts_t **rows_p,
                                    int *npoints_p);
/** bg_part_schedule_counts (unpaired) with activation offload (--offload activations, k = @p ahead, the
 *  executor's BRIGADE_OFFLOAD_ACT_AHEAD): a forwarded slot's stash leaves the device at the first compute
 *  instruction after its forward and its activation's send (later where waiting for that send there could
 *  deadlock) and comes back k compute instructions before its first backward piece (B or the fused backward;
 *  a split backward's W reads what B brought back); never on a chain's last stage, nor where it would be back
 *  no later than it left. Each row's counts.offloaded holds the forwarded slots whose stash is off the device
 *  at that point (bg_part_row_bytes leaves their layer activations out, unless the stage recomputes: it keeps
 *  no stash, nothing moves). malloc'ed; free() it. */
bg_status_t bg_part_schedule_counts_offact(const bg_schedule_t *sched, int rank, int ahead,
                                           bg_part_counts_t **rows_p, int *npoints_p);
/** The device bytes of chunk @p chunk's stashes on pipeline rank @p rank with activation offload (k = @p
 *  ahead): the most stashes of it on the device at once over the program (forwarded and not offloaded,
 *  bg_part_schedule_counts_offact) times @p stash_bytes (a slot's layer_act_bytes: its layers' outputs and
 *  stashes). Without offload the same count is the most forwarded slots. */
bg_status_t bg_part_offact_stash_bytes(const bg_schedule_t *sched, int rank, int chunk, int ahead,
                                       size_t stash_bytes, size_t *bytes_p);

/* ------------------------------------------------------------------------ */
/* Plans                                                                    */

/** Layer times measured the way a tensor-parallel plan runs them (brigade plan --measure, tools/measure.c):
 *  the layers of the model built for degree @p tp, run by a group of tp processes with the group's real
 *  collectives, every member busy. Seconds per microbatch, per layer of that build, speed 1. */
typedef struct bg_plan_layer_times {
    int tp;              /**< the degree they were measured at (>= 1) */
    const double *fwd_s; /**< forward, collectives included */
    const double *bwd_s; /**< fused backward, collectives included */
    const double *b_s;   /**< backward-input of the split backward, or NULL (then B = W = bwd_s / 2) */
    const double *w_s;   /**< backward-weight, or NULL (both or neither) */
    const double *tp_s;  /**< the share of fwd_s + bwd_s spent in the group's collectives (waits included),
                              recorded in the plan, or NULL */
    int sequence_parallel; /**< the build measured had sequence parallelism (its times serve only such
                              layouts, and the others only layouts without it) */
    const double *opt_s; /**< the optimizer step over each layer's parameters (its shard), measured on the
                              group, or NULL (then 10 FLOP per parameter at bg_plan_params_t.flops) */
} bg_plan_layer_times_t;

/** Inputs of bg_plan_search(); start from BG_PLAN_PARAMS_INIT. */
typedef struct bg_plan_params {
    size_t size;                 /**< sizeof(bg_plan_params_t) */
    const bg_model_desc_t *model;/**< the model (checked by bg_model_desc_check); the caller builds and
                                      destroys it. Its input (bg_model_desc_params: kind, seq_len,
                                      features) gives the sequence length and the input and target bytes */
    int world;                   /**< devices */
    const uint64_t *mem;         /**< budgets in bytes: 1 entry (all devices) or world entries */
    int nmem;
    const double *speed;         /**< relative speeds: NULL/0 entries (all 1), 1 or world entries */
    int nspeed;
    int batch;                   /**< global batch, sequences */
    int microbatch_size;         /**< sequences per microbatch per replica; 0 = search */
    int pp;                      /**< pipeline stages; 0 = search */
    const char *schedules;       /**< comma-separated names, NULL = all */
    int chunks;                  /**< 0 = the schedule's default */
    bg_optim_kind_t optim;
    int allow_recompute;
    double flops;                /**< FLOP/s of a speed-1 device */
    double link_latency;         /**< seconds */
    double link_bandwidth;       /**< bytes per second, 0 = infinite */
    const double *layer_fwd_s;   /**< measured forward seconds per layer per microbatch (speed 1), or NULL */
    const double *layer_bwd_s;   /**< measured backward seconds, or NULL (both given or neither) */
    int top;                     /**< how many plans to keep (0 = 5) */
    const double *layer_b_s;     /**< measured backward-input seconds per layer (split backward), or NULL */
    const double *layer_w_s;     /**< measured backward-weight seconds per layer, or NULL (both or neither;
                                      without them a split backward is B = W = backward / 2) */
    int zero;                    /**< sharding across the dp replicas (docs/data_parallel.md): 0, 1, 2 or 3, or
                                      BG_PLAN_ZERO_AUTO: per layout, the fastest stage that fits (the
                                      lowest, except with offload: a shard moves fewer bytes) */
    int tp;                      /**< tensor-parallel degree: 0 (default) = 1, unless no layout fits at 1
                                      (then the smallest degree that fits, said in bg_plan_set_note); N >= 1 =
                                      only N; BG_PLAN_TP_ALL = every degree dividing the devices. Degrees > 1
                                      need a builder-made model (rebuilt with that tp) or one of
                                      tensor-parallel layers */
    const bg_plan_layer_times_t *tp_times; /**< measured per tensor-parallel degree (ntp_times entries, at
                                      most one per degree; NULL: none): a layout of degree T with an entry
                                      uses its times as they are; without one, layer_fwd_s.. / T plus each
                                      collective's link cost (docs/partitioner.md) or the FLOPs */
    int ntp_times;
    const double *layer_opt_s;   /**< measured optimizer step seconds per layer (its parameters, speed 1), or
                                      NULL: 10 FLOP per parameter at flops. A stage's step is the sum over
                                      its layers */
    int offload;                 /**< the optimizer state (its shard under zero) outside the device budgets
                                      (brigade train --offload optimizer, docs/offload.md): 0 counted on the
                                      device; 1 offloaded; 2 offloaded and, at zero 3, the parameter shard
                                      too (--offload optimizer,params); BG_PLAN_OFFLOAD_AUTO: per layout
                                      the fastest choice that fits (2 at zero 3 only). The step time counts
                                      the same optimizer step either way, plus the transfers over
                                      host_bandwidth */
    int cp;                      /**< context-parallel degree (docs/executor.md "Context parallelism"): 0 or
                                      1 = 1; N > 1 = every sequence split over N devices (N divides the
                                      devices, 2N the sequence; pp x dp groups of N x tp devices, each
                                      member's layers profiled at seq / N with the ring's scratch and
                                      steps, the gradients summed and sharded over dp x N);
                                      BG_PLAN_CP_AUTO: 1, else the smallest degree that fits. A builder-made
                                      token model (GPT, Llama), without measured layer times */
    double host_bandwidth;       /**< bytes per second between a device and its host memory, one copy stream
                                      (brigade plan --host-bw), 0 = infinite: what an offloaded plan moves over
                                      it each step is added to its step, none assumed hidden (docs/offload.md
                                      "The planner"): --offload optimizer 12 bytes per parameter its replica
                                      updates (gradient and parameter down, parameter up), optimizer,params 4
                                      (the gradient shard down) plus 4 per shard parameter at every gather.
                                      0 is the CPU backend's figure (the store is the device's own memory) */
    int offload_activations;     /**< activation offload (brigade train --offload activations, docs/offload.md):
                                      0 no; 1 each stage but a chain's last keeps its stashed activations in
                                      host memory between their points (bg_part_schedule_counts_offact at
                                      BRIGADE_OFFLOAD_ACT_AHEAD), each moved out and back over
                                      host_bandwidth, none of it hidden (the copies block); the layout runs
                                      unpaired; BG_PLAN_OFFLOAD_AUTO: per layout only where nothing fits
                                      without it */
} bg_plan_params_t;
#define BG_PLAN_ZERO_AUTO (-1) /**< bg_plan_params_t.zero: choose */
#define BG_PLAN_TP_ALL (-1) /**< bg_plan_params_t.tp: search every tensor-parallel degree */
#define BG_PLAN_OFFLOAD_AUTO (-1) /**< bg_plan_params_t.offload: choose */
#define BG_PLAN_CP_AUTO (-1) /**< bg_plan_params_t.cp: 1, else the smallest degree that fits */
/** Defaults of bg_plan_params_t: one device, batch 8, everything else searched; AdamW, 1 TFLOP/s devices
 *  on 5 us, 10 GB/s links, 25 GB/s to their host (about what a PCIe 4.0 x16 link moves in pinned copies); the 5 best
 *  plans. */
#define BG_PLAN_PARAMS_INIT                                                                                        \
    { .size = sizeof(bg_plan_params_t), .model = NULL, .world = 1, .mem = NULL, .nmem = 0, .speed = NULL,          \
      .nspeed = 0, .batch = 8, .microbatch_size = 0, .pp = 0, .schedules = NULL, .chunks = 0,                     \
      .optim = BG_OPTIM_ADAMW, .allow_recompute = 0, .flops = 1e12, .link_latency = 5e-6, .link_bandwidth = 10e9,  \
      .layer_fwd_s = NULL, .layer_bwd_s = NULL, .top = 5, .layer_b_s = NULL, .layer_w_s = NULL, .zero = 0,        \
      .tp = 0, .tp_times = NULL, .ntp_times = 0, .layer_opt_s = NULL, .offload = 0, .cp = 0,                     \
      .host_bandwidth = 25e9, .offload_activations = 0 }

/** A plan's stage (virtual stage for interleaved/zbv). */
typedef struct bg_plan_stage {
    int rank;                    /**< pipeline rank holding it */
    int chunk;                   /**< chunk on that rank */
    int first_layer, last_layer; /**< inclusive */
    size_t params;
    uint64_t budget_bytes;       /**< the share of its rank's budget the partitioner gave it */
    uint64_t predicted_peak_bytes;
    int recompute;
    double predicted_ms_per_microbatch;
} bg_plan_stage_t;

typedef struct bg_plan bg_plan_t; /**< a plan (opaque) */
typedef struct bg_plan_set bg_plan_set_t; /**< the plans of a search, best first (opaque) */

/** Search layouts. BG_ERR_NO_FIT (with the shortfall, the smallest budget
 *  and device count that fit) when nothing fits; BG_ERR_INVALID for bad input. */
bg_status_t bg_plan_search(const bg_plan_params_t *params, bg_plan_set_t **set_p);
int bg_plan_set_count(const bg_plan_set_t *set); /**< plans kept (at most params.top) */
/** Candidates evaluated (fitting or not). */
int bg_plan_set_evaluated(const bg_plan_set_t *set);
/** What the search had to do to find a fit, for the user ("nothing fits at tp = 1 (...); tp = 2 is the
 *  smallest tensor-parallel degree that fits"); empty when nothing was needed. */
const char *bg_plan_set_note(const bg_plan_set_t *set);
const bg_plan_t *bg_plan_set_get(const bg_plan_set_t *set, int i); /**< best first */
void bg_plan_set_free(bg_plan_set_t *set); /**< frees the set and its plans (NULL is a no-op) */

/** Write / read the plan JSON (docs/partitioner.md). Load checks the schema
 *  (every field, BG_ERR_PARSE naming its JSON path) and that the stages cover
 *  the layers; it keeps the model's description JSON as it is. A builder-made
 *  model is rebuilt from it and checked against the plan's layers; a model of
 *  the host's own layers cannot be rebuilt from a file, and is checked when
 *  the host gives its description to bg_plan_check_model(). */
bg_status_t bg_plan_save(const bg_plan_t *plan, const char *path);
bg_status_t bg_plan_to_json(const bg_plan_t *plan, char **json_p);
bg_status_t bg_plan_load(const char *path, bg_plan_t **plan_p);
bg_status_t bg_plan_from_json(const char *json, bg_plan_t **plan_p);
bg_plan_t *bg_plan_copy(const bg_plan_t *plan); /**< a deep copy; NULL when out of memory */
void bg_plan_free(bg_plan_t *plan); /**< frees a plan (NULL is a no-op) */

int bg_plan_world(const bg_plan_t *plan); /**< devices */
int bg_plan_pp(const bg_plan_t *plan); /**< pipeline ranks */
int bg_plan_dp(const bg_plan_t *plan); /**< data-parallel replicas */
int bg_plan_tp(const bg_plan_t *plan); /**< tensor-parallel degree (1) */
int bg_plan_cp(const bg_plan_t *plan); /**< context-parallel degree (1): world = pp x dp x cp x tp */
int bg_plan_microbatches(const bg_plan_t *plan); /**< microbatches per step and replica */
int bg_plan_microbatch_size(const bg_plan_t *plan); /**< sequences per microbatch */
int bg_plan_batch(const bg_plan_t *plan); /**< global batch, sequences */
int bg_plan_seq(const bg_plan_t *plan);   /**< positions per sequence: the model's seq_len */
const char *bg_plan_schedule(const bg_plan_t *plan); /**< the schedule's name */
int bg_plan_chunks(const bg_plan_t *plan); /**< model chunks per pipeline rank */
double bg_plan_step_ms(const bg_plan_t *plan); /**< predicted step time, milliseconds */
double bg_plan_bubble(const bg_plan_t *plan); /**< predicted bubble: idle fraction of the step */
double bg_plan_tokens_per_s(const bg_plan_t *plan); /**< predicted throughput, tokens per second */
int bg_plan_recompute(const bg_plan_t *plan);  /**< 1 if any stage recomputes */
bg_optim_kind_t bg_plan_optimizer(const bg_plan_t *plan); /**< the optimizer whose state the plan counted */
int bg_plan_zero(const bg_plan_t *plan); /**< the sharding stage the plan counted (--zero; 0: none) */
int bg_plan_offload(const bg_plan_t *plan); /**< 1: the plan counted the optimizer state offloaded (--offload optimizer) */
/** Of bg_plan_step_ms, the offload transfers over the host link (bg_plan_params_t.host_bandwidth) on the
 *  pipeline rank they cost most, milliseconds per step; 0 without offload or with a free host link */
double bg_plan_offload_ms(const bg_plan_t *plan);
/** 1: the plan keeps the stashed activations in host memory (--offload activations), counted off the
 *  devices as the executor moves them */
int bg_plan_offload_activations(const bg_plan_t *plan);
/** What the plan offloads as brigade train's --offload value ("optimizer", "optimizer,params",
 *  "activations", "optimizer,activations", "optimizer,params,activations"), "" for nothing */
const char *bg_plan_offload_name(const bg_plan_t *plan);
/** The same name for bg_plan_params_t's choice: @p offload 0..2 (else ""), @p activations 0 or 1 */
const char *bg_plan_offload_choice_name(int offload, int activations);
/** 1: the plan's tp > 1 model is built with sequence parallelism (bg_model_config_t.sequence_parallel,
 *  its builder's; the plan JSON's "sequence_parallel"), so its activations are counted split */
int bg_plan_sequence_parallel(const bg_plan_t *plan);
/** The storage of the activations the plan's layer sizes count (its model's bg_model_desc_precision; the
 *  plan JSON's "precision", absent for fp32). bg_plan_check_model refuses a model of another. */
bg_dtype_t bg_plan_precision(const bg_plan_t *plan);
/** 1: the plan counts the memory of BRIGADE_TP_OVERLAP=microbatch (tp > 1 without --zero, planned with it
 *  set; bg_part_problem_t.paired): "tp_overlap": "microbatch" in its JSON. */
int bg_plan_paired(const bg_plan_t *plan);
/** The model the plan was made for: its bg_model_desc_to_json() text, owned
 *  by the plan. bg_model_desc_from_json() rebuilds a builder-made model from
 *  it; check a description of your own with bg_plan_check_model(). */
const char *bg_plan_model(const bg_plan_t *plan);
/** Number of (virtual) stages: pp * chunks. */
int bg_plan_num_stages(const bg_plan_t *plan);
const bg_plan_stage_t *bg_plan_stage(const bg_plan_t *plan, int i); /**< stage @p i; NULL when out of range */
/** Layers per virtual stage, the executor's --split (bg_train_config_t.split). */
int bg_plan_split(const bg_plan_t *plan, int *split, int max);
/** Predicted peak bytes and budget of pipeline rank @p rank (all its chunks). */
uint64_t bg_plan_rank_peak_bytes(const bg_plan_t *plan, int rank);
uint64_t bg_plan_rank_budget_bytes(const bg_plan_t *plan, int rank);
/** Is @p model the model the plan was made for? BG_OK if so; else
 *  BG_ERR_MISMATCH naming the first difference (bg_model_desc_match_json():
 *  name, input, classes, ties, a layer or a tensor), or a plan whose layers or
 *  sequence length are not the model's. The initialisation seed may differ. */
bg_status_t bg_plan_check_model(const bg_plan_t *plan, const bg_model_desc_t *model);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_PARTITIONER_H */
