/**
 * @file model.h
 * @brief Models (GPT, MLP) as lists of layers, their flat parameter buffers,
 *        stages that run F/B/W on microbatches, data, optimizers, safetensors.
 *
 * A model is an ordered list of top-level layers: the units a pipeline splits
 * (GPT: embed, blocks.0 .. blocks.L-1, ln_f, head; MLP: fc.0, act.0, ...,
 * head). A bg_model_t may hold a contiguous range of them only (one pipeline
 * stage): it allocates parameters, gradients and optimizer state for that
 * range alone, in one flat buffer each, with the layers' parameters pointing
 * into them. Initialisation is seeded per tensor by its full name, so the
 * same seed gives the same weights however the model is split.
 */
#ifndef BRIGADE_MODEL_H
#define BRIGADE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/backend.h"
#include "brigade/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum bg_model_kind { BG_MODEL_GPT = 0, BG_MODEL_MLP = 1 } bg_model_kind_t;

/** Model configuration (grows by appending; size header). */
typedef struct bg_model_config {
    size_t size;          /**< sizeof(bg_model_config_t) */
    bg_model_kind_t kind;
    int layers;           /**< GPT: transformer blocks; MLP: hidden layers */
    int d_model;          /**< GPT: model width; MLP: hidden width */
    int heads;            /**< GPT: attention heads (divides d_model) */
    int seq_len;          /**< GPT: maximum sequence length */
    int vocab;            /**< GPT: vocabulary (256: bytes) */
    int in_features;      /**< MLP: input features */
    int classes;          /**< MLP: classes of the synthetic task */
    uint64_t seed;        /**< initialisation seed */
    int tie_embeddings;   /**< GPT: the head's weight is tied to the token embedding (kept
                               identical: same init, gradients summed before each update) */
} bg_model_config_t;
#define BG_MODEL_CONFIG_INIT {sizeof(bg_model_config_t), BG_MODEL_GPT, 4, 128, 4, 64, 256, 32, 8, 1337, 0}

/** Check a configuration; BG_ERR_INVALID with a message naming the field. */
bg_status_t bg_model_config_check(const bg_model_config_t *cfg);

typedef struct bg_model bg_model_t;

/** Create the layers [first, last] (inclusive; -1, -1 = all) of a model and
 *  allocate their parameters, gradients (zeroed) and optimizer state lazily. */
bg_status_t bg_model_create(const bg_model_config_t *cfg, bg_backend_t *be, int first, int last, bg_model_t **model_p);
void bg_model_destroy(bg_model_t *m);

int bg_model_total_layers(const bg_model_t *m);      /**< layers of the full model */
int bg_model_first_layer(const bg_model_t *m);
int bg_model_last_layer(const bg_model_t *m);
bg_layer_t *bg_model_layer(bg_model_t *m, int i);    /**< global index i in [first, last] */
const bg_model_config_t *bg_model_config(const bg_model_t *m);
bg_backend_t *bg_model_backend(const bg_model_t *m);
/** Shape of the model's input for a microbatch of n sequences (GPT: tokens of length t). */
bg_shape_t bg_model_input_shape(const bg_model_t *m, int n, int t);

/** Parameters held (this range only). */
size_t bg_model_param_count(const bg_model_t *m);
float *bg_model_params(bg_model_t *m);   /**< flat (param_count) */
float *bg_model_grads(bg_model_t *m);    /**< flat (param_count) */
void bg_model_zero_grads(bg_model_t *m);

/** Named tensors of this range, in a fixed order: "blocks.3.attn.qkv.weight". */
int bg_model_num_tensors(const bg_model_t *m);
const char *bg_model_tensor_name(const bg_model_t *m, int i);
bg_param_t *bg_model_tensor(bg_model_t *m, int i);
/** Find a tensor by full name; NULL if this range does not hold it. */
bg_param_t *bg_model_find_tensor(bg_model_t *m, const char *name);
/** Tied embeddings: the two copies are "embed.wte" (first layer) and
 *  "head.weight" (last layer). Each holds its own copy so that any split
 *  keeps them identical the same way: before the optimizer step both
 *  gradients become embed + head. This sums them when both are in @p m
 *  (no-op otherwise, or when not tied). */
void bg_model_tie_grads_local(bg_model_t *m);

/** Per-layer profile of the FULL model for microbatches of n sequences of t positions. */
typedef struct bg_layer_profile {
    char name[BG_NAME_MAX];
    size_t params;        /**< parameters */
    size_t stash_bytes;   /**< kept per microbatch from F to the end of backward (stash + output) */
    size_t wstash_bytes;  /**< kept from B to W (zero-bubble schedules) beyond the stash */
    size_t scratch_bytes; /**< temporary during a call */
    size_t output_bytes;  /**< bytes of its output (sent to the next stage at a boundary) */
    double fwd_flops;
    double bwd_flops;     /**< B + W */
} bg_layer_profile_t;
/** Fills profile[0 .. total_layers-1]; *count_p = total layers. */
bg_status_t bg_model_profile(const bg_model_config_t *cfg, int n, int t, bg_layer_profile_t *profile, int max,
                             int *count_p);

/* ---------------------------------------------------------------- optimizers */
typedef enum bg_optim_kind { BG_OPTIM_ADAMW = 0, BG_OPTIM_SGD = 1 } bg_optim_kind_t;
typedef struct bg_optim_config {
    size_t size;
    bg_optim_kind_t kind;
    float lr;
    float beta1, beta2, eps; /**< AdamW */
    float momentum;          /**< SGD */
    float weight_decay;      /**< applied to tensors whose param.decay is set */
} bg_optim_config_t;
#define BG_OPTIM_CONFIG_INIT {sizeof(bg_optim_config_t), BG_OPTIM_ADAMW, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.9f, 0.0f}
/** Bytes of optimizer state per parameter (AdamW 8, SGD 4). */
size_t bg_optim_state_bytes(bg_optim_kind_t kind);
/** One optimizer step over the range's parameters (t is the 1-based step).
 *  Allocates the optimizer state on first use. */
bg_status_t bg_model_optim_step(bg_model_t *m, const bg_optim_config_t *opt, int t);
/** Allocate (zeroed) the optimizer state of @p kind if not yet there (before loading a checkpoint). */
bg_status_t bg_model_optim_init(bg_model_t *m, bg_optim_kind_t kind);
/** Optimizer state, flat like the parameters (tensor i's slice starts at
 *  bg_model_tensor(m, i)->data - bg_model_params(m)): which 0 = first moment
 *  (AdamW m, SGD momentum), 1 = second moment (AdamW v). NULL when absent. */
float *bg_model_optim_state(bg_model_t *m, int which);

/* ---------------------------------------------------------------- stages */

/**
 * A stage runs the model's layer range on microbatches: F, then B and W
 * (split for zero-bubble schedules) or the fused backward, keeping each
 * microbatch's activations in a slot from F until its last backward piece.
 * All buffers are counted by the backend's allocator.
 */
typedef struct bg_stage bg_stage_t;

bg_status_t bg_stage_create(bg_model_t *m, int max_microbatches, bg_stage_t **stage_p);
void bg_stage_destroy(bg_stage_t *s);

/** Prepare slot mb for input of shape @p in (allocates the input buffer; the
 *  shape must be the model's input for the first stage or the previous stage's
 *  output). Returns where to put the input (floats; NULL for token input). */
bg_status_t bg_stage_begin(bg_stage_t *s, int mb, bg_shape_t in, float **input_p);
/** Input and output shapes of slot mb (from bg_stage_begin until the slot ends). */
bg_status_t bg_stage_slot_shapes(const bg_stage_t *s, int mb, bg_shape_t *in_p, bg_shape_t *out_p);
/** Give the microbatch's tokens/targets (host arrays of n*t; copied to the
 *  backend). tokens: first stage of a GPT; targets: last stage. */
bg_status_t bg_stage_set_data(bg_stage_t *s, int mb, const int32_t *tokens, const int32_t *targets, float loss_scale);
/** Forward; *out_p points at the stage's output (kept until the slot ends);
 *  *out_shape_p its shape. On the last stage the output is per-position losses. */
bg_status_t bg_stage_forward(bg_stage_t *s, int mb, float **out_p, bg_shape_t *out_shape_p);
/** Where the incoming output gradient goes (not used on the last stage). */
bg_status_t bg_stage_grad_buffer(bg_stage_t *s, int mb, float **dout_p);
/** Backward-input. *din_p (NULL on the first stage) is valid until W/the fused backward ends the slot. */
bg_status_t bg_stage_backward_input(bg_stage_t *s, int mb, float **din_p);
/** Backward-weight: accumulates gradients and ends the slot (frees its memory). */
bg_status_t bg_stage_backward_weight(bg_stage_t *s, int mb);
/** Fused backward: B then W layer by layer (less memory than B+W). *din_p is
 *  valid until bg_stage_end(). */
bg_status_t bg_stage_backward(bg_stage_t *s, int mb, float **din_p);
/** Called after each layer's weight gradient of a microbatch is complete
 *  (in W, or in the fused backward), with the layer's global index, the
 *  microbatch, and `arg`. The executor uses it to start a gradient bucket's
 *  reduction as soon as the last microbatch has finished that bucket's layers. */
typedef bg_status_t (*bg_stage_layer_done_fn)(int layer, int mb, void *arg);
void bg_stage_set_layer_done(bg_stage_t *s, bg_stage_layer_done_fn fn, void *arg);
/** Activation recomputation: between a microbatch's forward and its
 *  backward keep only its input and output; the backward reruns the forward
 *  (bitwise the same activations) before differentiating. */
void bg_stage_set_recompute(bg_stage_t *s, int on);
int bg_stage_recompute(const bg_stage_t *s);
/** Frees what is left of slot mb (after the fused backward). */
void bg_stage_end(bg_stage_t *s, int mb);
/** Memory of one microbatch of input shape `in` on this stage, in bytes, as
 *  the layers report it; the stage allocates exactly these amounts. */
typedef struct bg_stage_mem {
    size_t stash;         /**< kept from F to the end of the backward: input, outputs, layer stashes */
    size_t data;          /**< tokens and targets */
    size_t dout;          /**< the incoming output gradient (not on the last stage) */
    size_t split_bw;      /**< kept from B to W: inner gradients, wstashes, din */
    size_t fused_bw;      /**< temporary of the fused backward */
    size_t scratch;       /**< the stage's shared scratch (once per stage) */
    size_t recompute;     /**< with recomputation: the activations rebuilt during one microbatch's
                               backward (stash then holds only the input and the output) */
} bg_stage_mem_t;
bg_status_t bg_stage_memory(bg_stage_t *s, bg_shape_t in, bg_stage_mem_t *mem_p);

/* ---------------------------------------------------------------- data */

typedef struct bg_data bg_data_t;
/** Text corpus (bytes are tokens). Refuses a missing, empty or too-short file. */
bg_status_t bg_data_open_text(const char *path, int seq_len, uint64_t seed, bg_data_t **data_p);
/** Synthetic classification: x ~ N(0,1)^features, label = argmax of a fixed random teacher. */
bg_status_t bg_data_synthetic(int features, int classes, uint64_t seed, bg_data_t **data_p);
void bg_data_close(bg_data_t *d);
size_t bg_data_size(const bg_data_t *d); /**< corpus bytes (text) or 0 */
/** Sequences [first, first+count) of global step `step`'s batch: tokens and
 *  targets (count*t each) for text; inputs (count*features) and targets
 *  (count) for synthetic data. Deterministic in (seed, step, sequence index)
 *  only, so any sharding of a step's batch sees the same data. */
bg_status_t bg_data_batch(const bg_data_t *d, int64_t step, int first, int count, int t, int32_t *tokens,
                          float *inputs, int32_t *targets);
/** Read the whole corpus (for sampling prompts) */
const uint8_t *bg_data_bytes(const bg_data_t *d);

/* ---------------------------------------------------------------- safetensors */

/** Write the range's tensors to @p path atomically (temporary file, fsync,
 *  rename): the file is complete or absent. metadata: JSON object text or NULL. */
bg_status_t bg_model_save_safetensors(bg_model_t *m, const char *path, const char *metadata_json);
/** Load every tensor of this range from @p path (names and shapes must match). */
bg_status_t bg_model_load_safetensors(bg_model_t *m, const char *path);

/** Result of comparing two sets of safetensors files tensor by tensor. */
typedef struct bg_compare_result {
    int tensors;          /**< tensors compared (present in both) */
    int identical;        /**< bitwise equal */
    int only_a, only_b;   /**< names present on one side only */
    int shape_mismatch;
    double max_abs;       /**< largest |a - b| */
    double max_rel;       /**< largest |a - b| / max|a| over a tensor */
    char worst[2 * BG_NAME_MAX]; /**< tensor with max_rel */
    double rel_l2;        /**< ||a - b|| / ||a|| over all compared tensors together */
} bg_compare_result_t;
/** Compare every *.safetensors file under dir_a with those under dir_b (the
 *  union of each directory's files, so different splits compare directly). */
bg_status_t bg_safetensors_compare_dirs(const char *dir_a, const char *dir_b, bg_compare_result_t *result_p);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_MODEL_H */
