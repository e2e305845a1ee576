/**
 * @file model.h
 * @brief Model descriptions (any list of layers: the user's own or the GPT
 *        and MLP builders), their flat parameter buffers, stages that run
 *        F/B/W on microbatches, data sources, optimizers, safetensors.
 *
 * A model description (bg_model_desc_t) is an ordered list of top-level
 * layers, the units a pipeline splits (GPT: embed, blocks.0 .. blocks.L-1,
 * ln_f, head), plus the input kind and shape, the loss (the last layer must
 * be a loss layer) and the tied tensors. It holds no parameter memory. Every
 * process of a job builds the same description (the same code or the same
 * JSON); a bg_model_t then binds a contiguous range of its layers (one
 * pipeline stage) to one flat buffer each of parameters, gradients and
 * optimizer state. Initialisation is seeded per tensor by its full name, so
 * the same seed gives the same weights however the model is split.
 *
 * Ownership and threads: the caller owns a description (bg_model_desc_destroy
 * frees it with its layers) and every bg_model_t bound to it
 * (bg_model_destroy; the description must outlive its models). A model, its
 * stage and its data set are used by one thread at a time; distinct models
 * (other stages, other processes) are independent, and a checked
 * description may be read (to JSON, profiled) from several threads while
 * nothing modifies it. JSON text returned through a char ** is malloc'ed
 * (free() it); names returned as const char * are borrowed from their owner.
 *
 * @code
 *   bg_model_desc_params_t dp = BG_MODEL_DESC_PARAMS_INIT;
 *   dp.input = BG_INPUT_FEATURES; dp.features = 16; dp.name = "tiny";
 *   bg_model_desc_t *d;
 *   bg_layer_t *fc, *act, *head;
 *   if (bg_model_desc_create(&dp, &d) != BG_OK) return 1;
 *   bg_layer_linear("fc", 16, 32, 1, 0.1f, &fc);
 *   bg_layer_activation("act", BG_ACT_RELU, &act);
 *   bg_layer_head("head", 32, 4, 1, 0.1f, &head);
 *   bg_model_desc_add(d, fc);      // the description owns its layers
 *   bg_model_desc_add(d, act);
 *   bg_model_desc_add(d, head);    // the last layer is the loss
 *   if (bg_model_desc_check(d) != BG_OK) puts(bg_last_error());
 *   bg_model_desc_destroy(d);
 * @endcode
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

/* ---------------------------------------------------------------- descriptions */

/** What a model's first layer takes. */
typedef enum bg_input_kind {
    BG_INPUT_TOKENS = 0,   /**< (n, t) int32 token ids in [0, vocab) */
    BG_INPUT_FEATURES = 1, /**< (n, t, features) floats */
} bg_input_kind_t;

/** Parameters of bg_model_desc_create() (grows by appending; size header). */
typedef struct bg_model_desc_params {
    size_t size;           /**< sizeof(bg_model_desc_params_t), set by BG_MODEL_DESC_PARAMS_INIT */
    const char *name;      /**< the model's name, stored in saves and checkpoints ("gpt", "my-net") */
    bg_input_kind_t input;
    int vocab;             /**< TOKENS: ids are in [0, vocab) */
    int seq_len;           /**< positions per sequence at most (TOKENS); FEATURES: positions (1: vectors) */
    int features;          /**< FEATURES: channels per position */
    uint64_t seed;         /**< initialisation seed */
} bg_model_desc_params_t;
/** Defaults of bg_model_desc_params_t: "model", one feature vector per sample, seed 1337. */
#define BG_MODEL_DESC_PARAMS_INIT                                                                       \
    { .size = sizeof(bg_model_desc_params_t), .name = "model", .input = BG_INPUT_FEATURES, .vocab = 0,    \
      .seq_len = 1, .features = 1, .seed = 1337 }

typedef struct bg_model_desc bg_model_desc_t; /**< a model description (opaque) */

/** An empty description. */
bg_status_t bg_model_desc_create(const bg_model_desc_params_t *p, bg_model_desc_t **desc_p);
/** Destroys the description and its layers (no model may still use it). */
void bg_model_desc_destroy(bg_model_desc_t *d);
/** Append a top-level layer (built-in, composite or the user's). The
 *  description owns it from now on, also on failure. Top-level names must
 *  be unique and non-empty; tensor names are the path of layer names. */
bg_status_t bg_model_desc_add(bg_model_desc_t *d, bg_layer_t *layer);
/** Declare that tensor @p b is tied to tensor @p a (full names, e.g.
 *  "embed.wte" and "head.weight"): b starts as a copy of a (it is initialised
 *  from a's seed), and before every optimizer step both gradients become
 *  a + b, so the two stay identical wherever the split puts them. The
 *  shapes must match (checked by bg_model_desc_check). */
bg_status_t bg_model_desc_tie(bg_model_desc_t *d, const char *a, const char *b);
/** Check a complete description: at least one layer, the last layer a loss,
 *  shapes that chain from the input, unique tensor names, ties between
 *  existing tensors of one shape, no tensor in two ties. The message names
 *  the layer or tensor. */
bg_status_t bg_model_desc_check(const bg_model_desc_t *d);

const bg_model_desc_params_t *bg_model_desc_params(const bg_model_desc_t *d); /**< the parameters it was created with */
int bg_model_desc_num_layers(const bg_model_desc_t *d); /**< top-level layers */
bg_layer_t *bg_model_desc_layer(const bg_model_desc_t *d, int i); /**< top-level layer @p i; NULL when out of range */
/** Classes of the loss layer (targets are ids in [0, classes)); 0 if the last layer is no loss. */
int bg_model_desc_classes(const bg_model_desc_t *d);
int bg_model_desc_num_ties(const bg_model_desc_t *d); /**< ties declared */
int bg_model_desc_num_tensors(const bg_model_desc_t *d); /**< named parameter tensors of the whole model */
/** Full name (at most @p cap bytes with its NUL; @p name may be NULL) and
 *  elements (@p numel_p may be NULL) of tensor @p i of the whole model, in
 *  bg_model_desc_num_tensors order: a tensor without building a model. */
bg_status_t bg_model_desc_tensor(const bg_model_desc_t *d, int i, char *name, size_t cap, size_t *numel_p);
/** Tie i: *a_p is the source, *b_p the copy. */
void bg_model_desc_tie_names(const bg_model_desc_t *d, int i, const char **a_p, const char **b_p);
/** Shape of the model's input for n sequences of t positions (t is ignored
 *  for FEATURES inputs, whose positions are fixed). */
bg_shape_t bg_model_desc_input_shape(const bg_model_desc_t *d, int n, int t);
/** Parameters of the whole model (this member's shards where layers are split). */
size_t bg_model_desc_param_count(const bg_model_desc_t *d);
/** The tensor-parallel degree of the description's split tensors (1: none;
 *  -1: layers split over different degrees). */
int bg_model_desc_tp_degree(const bg_model_desc_t *d);
/** 1 when a tensor of the description gets partial gradients (bg_param_t.tp_partial: a tree switched
 *  to sequence parallelism by bg_layer_sequence_parallel), else 0. */
int bg_model_desc_sequence_parallel(const bg_model_desc_t *d);
/** Run the description in tensor-parallel group @p tp (NULL: none): its
 *  shards are this member's (initialisation slices the full tensors, saves
 *  gather them) and its layers use the group's collectives. The group must
 *  outlive the models bound to the description; its size must equal
 *  bg_model_desc_tp_degree() (BG_ERR_INVALID naming both). The executor
 *  calls it; a host only when it binds models itself. */
bg_status_t bg_model_desc_set_tp(bg_model_desc_t *d, const bg_tp_comm_t *tp);
const bg_tp_comm_t *bg_model_desc_tp(const bg_model_desc_t *d); /**< the group of bg_model_desc_set_tp (NULL: none) */
/** The expert-parallel degree of the description's MoE layers (bg_moe_t.ep): 1 when none is split,
 *  -1 when they disagree. */
int bg_model_desc_ep_degree(const bg_model_desc_t *d);
/** Run the description's MoE layers in expert-parallel group @p ep (NULL: none; its size must be
 *  bg_model_desc_ep_degree(), and it needs allgather and alltoallv): the executor does it. */
bg_status_t bg_model_desc_set_ep(bg_model_desc_t *d, const bg_tp_comm_t *ep);
const bg_tp_comm_t *bg_model_desc_ep(const bg_model_desc_t *d); /**< the group of bg_model_desc_set_ep (NULL: none) */
/** The group a shard @p p is split over: the expert-parallel group for an expert shard (split_ep), else the
 *  tensor group (NULL: p is whole, or the description is not bound). */
const bg_tp_comm_t *bg_model_desc_group_of(const bg_model_desc_t *d, const bg_param_t *p);
/** Run the description's models in context-parallel group @p cp (NULL or size 1: none): their layers
 *  see this member's positions of every sequence (bg_layer_ctx_t.cp). Every leaf layer must support it
 *  (position-wise layers, embedding and attention; BG_ERR_UNSUPPORTED naming the first that does not).
 *  The group must outlive the models; the executor calls it. */
bg_status_t bg_model_desc_set_cp(bg_model_desc_t *d, const bg_cp_comm_t *cp);
const bg_cp_comm_t *bg_model_desc_cp(const bg_model_desc_t *d); /**< the group of bg_model_desc_set_cp (NULL: none) */
/** Set the storage precision of every layer of the description (bg_layer_set_precision; layers added
 *  later keep their own). Not part of the model's identity (its JSON): a save loads under either. */
bg_status_t bg_model_desc_set_precision(bg_model_desc_t *d, bg_dtype_t precision);
/** BG_BF16 when some layer of the description keeps bf16 activations, else BG_F32. */
bg_dtype_t bg_model_desc_precision(const bg_model_desc_t *d);
/** The top-level layer that holds tensor @p name (full name); -1 if none. */
int bg_model_desc_tensor_layer(const bg_model_desc_t *d, const char *name);

/**
 * The description as JSON text (malloc'ed; free() it): name, input, seed,
 * every top-level layer's name, type and parameter count, every tensor's
 * name and shape, the ties, and for builder-made models the builder and
 * its configuration. Stored in saves, checkpoints and plans.
 */
bg_status_t bg_model_desc_to_json(const bg_model_desc_t *d, char **json_p);
/** Rebuild a description from bg_model_desc_to_json() text. Only builder-
 *  made models can be rebuilt (a user's layers are code, not data):
 *  BG_ERR_UNSUPPORTED otherwise, naming the model. */
bg_status_t bg_model_desc_from_json(const char *json, bg_model_desc_t **desc_p);
/** Is @p json (from bg_model_desc_to_json) the same model as @p d? BG_OK
 *  if so; else BG_ERR_MISMATCH naming the first difference, prefixed by
 *  @p where (a file name). */
bg_status_t bg_model_desc_match_json(const bg_model_desc_t *d, const char *json, const char *where);

/* ---------------------------------------------------------------- builders */

/** The built-in builders. */
typedef enum bg_model_kind { BG_MODEL_GPT = 0, BG_MODEL_MLP = 1, BG_MODEL_LLAMA = 2 } bg_model_kind_t;

/** Configuration of the two built-in builders (grows by appending; size header). */
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
    int tie_embeddings;   /**< GPT: the head's weight is tied to the token embedding */
    int tp;               /**< tensor-parallel degree of the layers built (1: plain layers); not part of
                               the model's identity (its JSON): saves load under any tp */
    int sequence_parallel; /**< GPT, tp > 1: sequence parallelism (bg_layer_sequence_parallel): layernorms,
                               residuals and the activations between blocks split along the sequence
                               (seq_len a multiple of tp); tp = 1: no effect. Not part of the model's identity */
    bg_dtype_t precision; /**< GPT: storage of the activations kept inside the blocks (bg_layer_set_precision);
                               BG_BF16 on an MLP (no composite layers, nothing to store in bf16) is an error.
                               Not part of the model's identity */
    int kv_heads;         /**< Llama: key/value heads (divides heads); 0: heads (no grouping) */
    int ffn_hidden;       /**< Llama: SwiGLU hidden size; 0: 8 d_model / 3 rounded up to a multiple of 64 */
    float rope_theta;     /**< Llama: RoPE base (default 10000) */
    int experts;          /**< GPT, Llama: experts of the MoE blocks (bg_layer_moe); 0: no MoE, every MLP dense */
    int top_k;            /**< MoE: experts per token (default 2) */
    int moe_every;        /**< MoE: block i's MLP is an MoE when (i + 1) is a multiple of it (default 1: every block) */
    float capacity_factor; /**< MoE: tokens an expert takes, as a multiple of its fair share; 0: dropless (default) */
    float moe_aux_coef;   /**< MoE: coefficient of the load-balancing loss (default 0.01) */
    bg_moe_gate_t moe_gate; /**< MoE: the gates (default BG_MOE_SOFTMAX) */
    int ep;               /**< MoE: expert-parallel degree of the layers built (1: every expert on each rank;
                               divides experts); not part of the model's identity: saves load under any ep */
} bg_model_config_t;
/** Defaults of bg_model_config_t: a small GPT (4 blocks of width 128, 4 heads, 64 positions, bytes),
 *  untied, tp = 1, fp32; the MLP fields for a 32-feature, 8-class task. */
#define BG_MODEL_CONFIG_INIT                                                                            \
    { .size = sizeof(bg_model_config_t), .kind = BG_MODEL_GPT, .layers = 4, .d_model = 128, .heads = 4,   \
      .seq_len = 64, .vocab = 256, .in_features = 32, .classes = 8, .seed = 1337, .tie_embeddings = 0,    \
      .tp = 1, .sequence_parallel = 0, .precision = BG_F32, .kv_heads = 0, .ffn_hidden = 0,                 \
      .rope_theta = 10000.0f, .experts = 0, .top_k = 2, .moe_every = 1, .capacity_factor = 0.0f,             \
      .moe_aux_coef = 0.01f, .moe_gate = BG_MOE_SOFTMAX, .ep = 1 }

/** Check a builder configuration; BG_ERR_INVALID with a message naming the field. */
bg_status_t bg_model_config_check(const bg_model_config_t *cfg);
/** Build the description of a GPT (embed, blocks.i, ln_f, head; tie
 *  "embed.wte" -> "head.weight" when tie_embeddings), a Llama (embed (no position table), blocks.i
 *  (bg_layer_llama_block), norm (RMSNorm), head (no bias); the same tie) or an MLP (fc.i, act.i,
 *  head). The result is a plain description: nothing downstream knows
 *  which builder made it, except its JSON, which can rebuild it. */
bg_status_t bg_model_build(const bg_model_config_t *cfg, bg_model_desc_t **desc_p);
/** The builder configuration of a description made by bg_model_build() (or
 *  rebuilt by bg_model_desc_from_json()) into *cfg_p; BG_ERR_UNSUPPORTED,
 *  naming the model, for a description of the host's own layers. */
bg_status_t bg_model_desc_builder(const bg_model_desc_t *d, bg_model_config_t *cfg_p);

/* ---------------------------------------------------------------- models */

typedef struct bg_model bg_model_t; /**< a layer range bound to its buffers (opaque) */

/** Bind the layers [first, last] (inclusive; -1, -1 = all) of a checked
 *  description to new flat buffers: parameters (initialised), gradients
 *  (zeroed); optimizer state lazily. A layer can be bound to one model at a
 *  time; the description must outlive the model. */
bg_status_t bg_model_create(bg_model_desc_t *desc, bg_backend_t *be, int first, int last, bg_model_t **model_p);
/** A model of some of the description's tensors: those i (whole-model order,
 *  bg_model_desc_num_tensors of them) with @p which[i] != 0, with buffers,
 *  initialisation and optimizer state for them only (a parameter server's
 *  share). Binds every layer; its layers cannot run (the other tensors have
 *  no buffers): for holding, updating and saving tensors. */
bg_status_t bg_model_create_tensors(bg_model_desc_t *desc, bg_backend_t *be, const unsigned char *which,
                                    bg_model_t **model_p);
void bg_model_destroy(bg_model_t *m); /**< frees the model's buffers; the description stays (NULL is a no-op) */

const bg_model_desc_t *bg_model_desc(const bg_model_t *m); /**< the description the model binds */
int bg_model_total_layers(const bg_model_t *m);      /**< layers of the full model */
int bg_model_first_layer(const bg_model_t *m); /**< global index of the range's first layer */
int bg_model_last_layer(const bg_model_t *m); /**< global index of the range's last layer (inclusive) */
bg_layer_t *bg_model_layer(bg_model_t *m, int i);    /**< global index i in [0, total) (descriptors) */
bg_backend_t *bg_model_backend(const bg_model_t *m); /**< the backend that holds the model's buffers */
/** Shape of the model's input for a microbatch of n sequences of t positions. */
bg_shape_t bg_model_input_shape(const bg_model_t *m, int n, int t);

/** Parameters held (this range only). */
size_t bg_model_param_count(const bg_model_t *m);
float *bg_model_params(bg_model_t *m);   /**< flat (param_count) */
float *bg_model_grads(bg_model_t *m);    /**< flat (param_count) */
void bg_model_zero_grads(bg_model_t *m); /**< set the range's gradients to zero */

/** Named tensors of this range, in a fixed order: "blocks.3.attn.qkv.weight". */
int bg_model_num_tensors(const bg_model_t *m);
const char *bg_model_tensor_name(const bg_model_t *m, int i);
bg_param_t *bg_model_tensor(bg_model_t *m, int i);
/** Find a tensor by full name; NULL if this range does not hold it. */
bg_param_t *bg_model_find_tensor(bg_model_t *m, const char *name);

/** Per-layer profile of a model for microbatches of n sequences of t positions. */
typedef struct bg_layer_profile {
    char name[BG_NAME_MAX];
    size_t params;        /**< parameters */
    size_t stash_bytes;   /**< kept per microbatch from F to the end of backward (stash + output) */
    size_t wstash_bytes;  /**< kept from B to W (zero-bubble schedules) beyond the stash */
    size_t scratch_bytes; /**< temporary during a call */
    size_t output_bytes;  /**< bytes of its output as kept and sent to the next stage at a boundary (the
                               model's precision; the last layer's losses fp32) */
    double fwd_flops;
    double bwd_flops;     /**< B + W */
    bg_tp_cost_t tp;      /**< its tensor-parallel group collectives (tensor-parallel layers; else 0) */
    size_t grad_bytes;    /**< bytes of its output's gradient (fp32; = output_bytes unless the model is bf16) */
    size_t guard_bytes;   /**< bytes a stage reserves after each buffer it hands the layer (BRIGADE_GUARD:
                               canaries or guard zones; 0: off), included in stash_bytes, wstash_bytes and
                               scratch_bytes; the partitioner adds them to each gradient buffer
                               (bg_part_problem_t.guard_bytes) */
} bg_layer_profile_t;
/** Fills profile[0 .. layers-1] from what each layer reports; *count_p = layers. */
bg_status_t bg_model_profile(const bg_model_desc_t *d, int n, int t, bg_layer_profile_t *profile, int max,
                             int *count_p);

/* ---------------------------------------------------------------- optimizers */
typedef enum bg_optim_kind { BG_OPTIM_ADAMW = 0, BG_OPTIM_SGD = 1 } bg_optim_kind_t; /**< the optimizers */
/** An optimizer and its hyperparameters; start from BG_OPTIM_CONFIG_INIT. */
typedef struct bg_optim_config {
    size_t size;
    bg_optim_kind_t kind;
    float lr;
    float beta1, beta2, eps; /**< AdamW */
    float momentum;          /**< SGD */
    float weight_decay;      /**< applied to tensors whose param.decay is set */
} bg_optim_config_t;
/** Defaults of bg_optim_config_t: AdamW, lr 1e-3, betas 0.9 and 0.95, eps 1e-8, no weight decay. */
#define BG_OPTIM_CONFIG_INIT                                                                            \
    { .size = sizeof(bg_optim_config_t), .kind = BG_OPTIM_ADAMW, .lr = 1e-3f, .beta1 = 0.9f,             \
      .beta2 = 0.95f, .eps = 1e-8f, .momentum = 0.9f, .weight_decay = 0.0f }
/** Bytes of optimizer state per parameter (AdamW 8, SGD 4). */
size_t bg_optim_state_bytes(bg_optim_kind_t kind);
/** One optimizer step over the range's parameters (t is the 1-based step).
 *  Allocates the optimizer state on first use. */
bg_status_t bg_model_optim_step(bg_model_t *m, const bg_optim_config_t *opt, int t);
/** The same step for the tensors whose parameters start in floats [off, off + count) of the
 *  flat buffer only (a gradient bucket: the executor updates each as soon as its reduction is
 *  done). The update is elementwise, so any split into ranges gives the bits of one call. */
bg_status_t bg_model_optim_step_range(bg_model_t *m, const bg_optim_config_t *opt, int t, size_t off,
                                      size_t count);
/** Allocate (zeroed) the optimizer state of @p kind if not yet there (before loading a checkpoint). */
bg_status_t bg_model_optim_init(bg_model_t *m, bg_optim_kind_t kind);
/** Optimizer state, flat like the parameters (tensor i's slice starts at
 *  bg_model_tensor(m, i)->data - bg_model_params(m)): which 0 = first moment
 *  (AdamW m, SGD momentum), 1 = second moment (AdamW v). NULL when absent. */
float *bg_model_optim_state(bg_model_t *m, int which);
/** Free the optimizer state (the executor's sharded modes keep their own
 *  shard and hold the full state only while saving or loading a checkpoint). */
void bg_model_optim_free(bg_model_t *m);
/** Where a model's optimizer state lives instead of its backend's memory
 *  (--offload optimizer): host memory, or memory-mapped files. alloc sets *ptr_p
 *  to @p bytes of zeroed memory the backend's optimizer kernels can address
 *  (host memory: backends whose buffers are host memory only), or fails
 *  naming @p what (bg_error); release frees what alloc gave. What a store holds is not counted against the backend's cap. */
typedef struct bg_optim_store {
    bg_status_t (*alloc)(void *arg, size_t bytes, const char *what, void **ptr_p);
    void (*release)(void *arg, void *ptr);
    void *arg; /**< the store's own state, given to both */
    /** Optional (appended last): the update of @p n elements whose state (@p m, @p v: from alloc; v NULL for
     *  SGD) is this store's, while @p param and @p grad are @p be's buffers, which the host may not address
     *  (a device backend): the store copies them out, steps on the host, copies the parameters back.
     *  NULL: the backend's optimizer kernel on the state where it lives. */
    bg_status_t (*step)(void *arg, bg_backend_t *be, const bg_optim_config_t *opt, float wd, int t, float *param,
                        const float *grad, float *m, float *v, size_t n);
} bg_optim_store_t;
/** Keep @p m's optimizer state (bg_model_optim_init's, and what a sharding
 *  strategy allocates with bg_model_optim_alloc) in @p store (copied; NULL:
 *  the backend's memory again). Only while the model holds no optimizer state. */
bg_status_t bg_model_set_optim_store(bg_model_t *m, const bg_optim_store_t *store);
/** 1 when @p m's optimizer state is a store's (bg_model_set_optim_store): host memory or mapped files,
 *  which the host reads and writes in place whatever the backend (a checkpoint copies it with memcpy,
 *  never the backend's copies); 0 when it is the backend's memory. */
int bg_model_optim_on_host(const bg_model_t *m);
/** @p n zeroed floats of optimizer state from @p m's store (or its backend)
 *  into *ptr_p; freed by bg_model_optim_release. */
bg_status_t bg_model_optim_alloc(bg_model_t *m, size_t n, const char *what, float **ptr_p);
/** Free what bg_model_optim_alloc returned (NULL: nothing). */
void bg_model_optim_release(bg_model_t *m, float *ptr);
/** The optimizer's update of @p n elements of @p m's parameters (@p param, @p grad: its backend's buffers) with
 *  state @p mom, @p var (from bg_model_optim_alloc; var NULL for SGD): the store's step where it has one, else
 *  the backend's AdamW / SGD kernel. Every optimizer step of a model (its own, a sharding strategy's) goes here. */
bg_status_t bg_model_optim_update(bg_model_t *m, const bg_optim_config_t *opt, float wd, int t, float *param,
                                  const float *grad, float *mom, float *var, size_t n);
/** @p hold = 0: free the flat gradient buffer (every tensor's grad becomes
 *  NULL, bg_model_grads returns NULL); 1: allocate it zeroed if absent. */
bg_status_t bg_model_grads_hold(bg_model_t *m, int hold);
/** The parameters' counterpart (--zero 3 keeps a shard and gathers each layer's weights into buffers of its
 *  own, aiming the tensors' data at them): @p hold = 0 frees the flat parameter buffer (every tensor's data
 *  becomes NULL, bg_model_params returns NULL); 1 allocates it if absent and aims every tensor's data at it
 *  (its contents undefined: the caller fills it). */
bg_status_t bg_model_params_hold(bg_model_t *m, int hold);
/** Sequence parallelism: sum over the description's tensor group (bg_model_desc_set_tp) the gradients
 *  of the tensors marked tp_partial in top-level layer @p layer (-1: every layer of the range), in
 *  place; a group collective, so every member calls it alike. The executor calls it once a step's last
 *  microbatch has finished the layer (with --zero 2, every microbatch whose gradients of the layer
 *  are reduce-scattered at once); a host driving stages itself calls it before the optimizer step.
 *  No group, or no such tensor: nothing. */
bg_status_t bg_model_tp_sum_grads(bg_model_t *m, int layer);

/* ---------------------------------------------------------------- stages */

/**
 * A stage runs the model's layer range on microbatches: F, then B and W
 * (split for zero-bubble schedules) or the fused backward, keeping each
 * microbatch's activations in a slot from F until its last backward piece.
 * All buffers are counted by the backend's allocator. With guard zones on
 * (BRIGADE_GUARD, read at bg_stage_create), a layer call that writes past a
 * size its layer reports fails with BG_ERR_INVALID naming the layer and the
 * buffer (docs/layers.md).
 */
typedef struct bg_stage bg_stage_t;

/** A stage running model @p m, with @p max_microbatches slots (microbatches in flight at once, >= 1). */
bg_status_t bg_stage_create(bg_model_t *m, int max_microbatches, bg_stage_t **stage_p);
void bg_stage_destroy(bg_stage_t *s); /**< frees the stage and its slots (NULL is a no-op) */

/** Prepare slot mb for input of shape @p in (allocates the input buffer; the
 *  shape must be the model's input for the first stage or the previous stage's
 *  output). Returns where to put the input (NULL for token input): elements of bg_stage_input_dtype (fp32,
 *  or bf16 on a later stage of a bf16 model: the previous stage's output as it sent it). */
bg_status_t bg_stage_begin(bg_stage_t *s, int mb, bg_shape_t in, float **input_p);
/** The element type of the stage's input buffer: BG_F32 on the first stage (the model's own input), else the
 *  model's precision (bg_model_desc_precision). */
bg_dtype_t bg_stage_input_dtype(const bg_stage_t *s);
/** The element type of the stage's output: the model's precision, BG_F32 on the last stage (the losses). */
bg_dtype_t bg_stage_output_dtype(const bg_stage_t *s);
/** Input and output shapes of slot mb (from bg_stage_begin until the slot ends). */
bg_status_t bg_stage_slot_shapes(const bg_stage_t *s, int mb, bg_shape_t *in_p, bg_shape_t *out_p);
/** Give the microbatch's tokens/targets (host arrays of n*t; copied to the
 *  backend). tokens: first stage of a GPT; targets: last stage. */
bg_status_t bg_stage_set_data(bg_stage_t *s, int mb, const int32_t *tokens, const int32_t *targets, float loss_scale);
/** Forward; *out_p points at the stage's output (kept until the slot ends; elements of
 *  bg_stage_output_dtype); *out_shape_p its shape. On the last stage the output is per-position losses. */
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
/** Which compute of a layer is about to run (bg_stage_set_layer_begin). */
typedef enum bg_stage_pass {
    BG_PASS_FORWARD = 0,         /**< the forward (the stage's layers in increasing order) */
    BG_PASS_RECOMPUTE = 1,       /**< the forward rerun by a backward (recomputation; increasing) */
    BG_PASS_BACKWARD_INPUT = 2,  /**< B of the split backward (decreasing) */
    BG_PASS_BACKWARD_WEIGHT = 3, /**< W of the split backward (decreasing; layers with weights only) */
    BG_PASS_BACKWARD = 4         /**< the fused backward (decreasing) */
} bg_stage_pass_t;
/** Called before each layer's compute (every pass of bg_stage_pass_t; not when emulating), with the layer's
 *  global index, the microbatch, the pass and `arg`; an error fails the call. The executor's --zero 3
 *  gathers the layer's weights there (docs/data_parallel.md). */
typedef bg_status_t (*bg_stage_layer_begin_fn)(int layer, int mb, bg_stage_pass_t pass, void *arg);
void bg_stage_set_layer_begin(bg_stage_t *s, bg_stage_layer_begin_fn fn, void *arg);
/** Activation recomputation: between a microbatch's forward and its
 *  backward keep only its input and output; the backward reruns the forward
 *  (bitwise the same activations) before differentiating. */
void bg_stage_set_recompute(bg_stage_t *s, int on);
/** While on, the stage's forwards are of a forward-only program (an evaluation): no backward follows them, and
 *  their layers are told so (bg_layer_ctx_t.no_backward). */
void bg_stage_set_forward_only(bg_stage_t *s, int on);
int bg_stage_recompute(const bg_stage_t *s);
/** Emulation (brigade train --emulate): every call allocates the buffers it
 *  would, with the shapes it would, but runs no layer (their contents are
 *  undefined); the layer-done callback still fires. */
void bg_stage_set_emulate(bg_stage_t *s, int on);
/** Slot mb's calls use lane @p lane's scratch (0, the default, or 1; lane 1's is allocated when a slot first
 *  uses it): a call of one slot may then be in progress while a call of a slot on the other lane runs (two
 *  coroutines on one thread, BRIGADE_TP_OVERLAP=microbatch). BG_ERR_INVALID for another lane or a slot that
 *  has not begun. */
bg_status_t bg_stage_set_lane(bg_stage_t *s, int mb, int lane);
/** After the fused backward: frees all of slot mb but the buffer that holds its input gradient (din stays
 *  valid until bg_stage_end), so a slot whose din is still being sent holds only that. The stage's output
 *  (from bg_stage_forward) is freed too: nothing may still read or send it. BG_ERR_INVALID if the slot's
 *  fused backward has not run. */
bg_status_t bg_stage_release(bg_stage_t *s, int mb);
/** Activation offload: the bytes slot mb keeps on the backend between its forward and its backward (its layers'
 *  outputs and stashes; not its input, data or incoming gradient), which bg_stage_stash_out moves to host memory;
 *  0 when the slot is not forwarded or keeps none (recomputation). */
size_t bg_stage_stash_bytes(const bg_stage_t *s, int mb);
/** Copies slot mb's stash (bg_stage_stash_bytes bytes) to @p host and frees it on the backend. Only between
 *  its forward and its backward, and only once nothing reads the output bg_stage_forward returned (its sends
 *  complete): the output is part of the stash. A backward before bg_stage_stash_in is refused. A no-op when
 *  the slot keeps no stash (recomputation). BG_ERR_INVALID when the slot is not forwarded or already out. */
bg_status_t bg_stage_stash_out(bg_stage_t *s, int mb, void *host);
/** Allocates slot mb's stash on the backend again and copies it back from @p host: its backward (B and W, or
 *  fused) then reads the bytes its forward wrote. On BG_ERR_NOMEM the slot stays offloaded. */
bg_status_t bg_stage_stash_in(bg_stage_t *s, int mb, const void *host);
/** Frees what is left of slot mb (after the fused backward). */
void bg_stage_end(bg_stage_t *s, int mb);
/** Memory of one microbatch of input shape `in` on this stage, in bytes, as
 *  the layers report it; the stage allocates exactly these amounts (with
 *  BRIGADE_GUARD on, plus a guard zone of 64 to 127 bytes after every piece,
 *  which is not counted here). */
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

/** What the executor asks a batch source for: one microbatch of one replica. */
typedef struct bg_batch_request {
    int64_t step;          /**< 0-based optimizer step */
    int microbatch;        /**< in [0, microbatches) */
    int replica;           /**< data-parallel replica in [0, dp) */
    int first;             /**< index of the first sequence within the step's global batch */
    bg_shape_t in;         /**< the input's shape: n sequences, t positions, c channels (0: tokens) */
} bg_batch_request_t;

/**
 * Fill one microbatch: @p tokens (n*t ids; non-NULL for TOKENS inputs on
 * the first stage), @p features (n*t*c floats; non-NULL for FEATURES inputs
 * on the first stage) and @p targets (n*t class ids; non-NULL on the last
 * stage). A buffer that is NULL is not wanted on this rank. The result must
 * depend only on the request (every rank that asks gets the same data).
 * Return BG_OK, or an error (set a message with bg_error()): the step stops
 * on every rank with it.
 */
typedef bg_status_t (*bg_batch_fn)(const bg_batch_request_t *rq, int32_t *tokens, float *features,
                                   int32_t *targets, void *arg);
/** Positions of microbatch mb of step `step` (variable sequence lengths; a
 *  pure function: every rank must get the same answer). */
typedef int (*bg_seq_len_fn)(int64_t step, int mb, void *arg);

/** A source of training data. */
typedef struct bg_batch_source {
    bg_batch_fn batch;     /**< required */
    bg_seq_len_fn seq_len; /**< NULL: every microbatch has `seq` positions */
    void *arg;             /**< passed to both */
    int seq;               /**< positions per sequence when seq_len is NULL (0: the model's seq_len) */
} bg_batch_source_t;

typedef struct bg_data bg_data_t; /**< a built-in data set (opaque) */
/** Text corpus (bytes are tokens). Refuses a missing, empty or too-short file. */
bg_status_t bg_data_open_text(const char *path, int seq_len, uint64_t seed, bg_data_t **data_p);
/** Token files: @p paths is a comma-separated list of files or glob patterns (shards, in that order, a
 *  pattern's matches in name order), each memory-mapped; @p format "llmc" (llm.c's 256 x int32 header,
 *  magic 20240520 version 1 with uint16 tokens, or magic 20240801 version 7 with uint32), "raw16" or
 *  "raw32" (headerless little-endian arrays, nanoGPT's train.bin), "auto" or NULL (llmc when the file
 *  starts with its magic, else raw16). Windows of seq_len + 1 tokens; sequence k = step * batch + index
 *  is window k mod W of the order of epoch k / W (shuffled by @p seed, every window once per epoch), so
 *  the data position is the step. Refuses a missing, empty, truncated or odd-sized file, a wrong magic
 *  or version, and a token >= vocab (naming the file and byte offset). */
bg_status_t bg_data_open_tokens(const char *paths, const char *format, int seq_len, int batch, int vocab,
                                uint64_t seed, bg_data_t **data_p);
/** Token files: step @p step's first sequence is number @p sequences of the shuffled order, later steps
 *  following by batch (a resumed run's position, from its checkpoint's data_position); default: step 0
 *  at sequence 0. Text and synthetic data are functions of the step: no effect. */
void bg_data_set_position(bg_data_t *d, int64_t step, uint64_t sequences);
/** Token files: the sequence number step @p step starts at (its data position); 0 for other data. */
uint64_t bg_data_position(const bg_data_t *d, int64_t step);
/** Whether the file at @p path starts with an llm.c token-file magic (20240520 or 20240801). */
int bg_data_file_is_llmc(const char *path);
/** Synthetic classification: x ~ N(0,1)^features, label = argmax of a fixed random teacher. */
bg_status_t bg_data_synthetic(int features, int classes, uint64_t seed, bg_data_t **data_p);
/** Split off a held-out set (evaluation): text: the last @p fraction of the corpus becomes *held_p (a
 *  copy) and @p d keeps the rest, both sampled as before within their own bytes (each must hold a
 *  sequence); synthetic: *held_p draws other samples (another seed) of the same teacher and @p d is
 *  unchanged. @p fraction in (0, 1). *held_p is the caller's (bg_data_close). */
bg_status_t bg_data_hold_out(bg_data_t *d, double fraction, bg_data_t **held_p);
void bg_data_close(bg_data_t *d); /**< frees a data set (NULL is a no-op) */
size_t bg_data_size(const bg_data_t *d); /**< corpus bytes (text) or 0 */
/** Sequences [first, first+count) of global step `step`'s batch: tokens and
 *  targets (count*t each) for text; inputs (count*features) and targets
 *  (count) for synthetic data. Deterministic in (seed, step, sequence index)
 *  only, so any sharding of a step's batch sees the same data. */
bg_status_t bg_data_batch(const bg_data_t *d, int64_t step, int first, int count, int t, int32_t *tokens,
                          float *inputs, int32_t *targets);
/** The data set as a batch source (seq_len left NULL; the data must outlive the source's users). */
bg_batch_source_t bg_data_source(bg_data_t *d);
/** Read the whole corpus (for sampling prompts) */
const uint8_t *bg_data_bytes(const bg_data_t *d);

/* ---------------------------------------------------------------- safetensors */

/** The safetensors `__metadata__` object for files of this model, as JSON
 *  text (malloc'ed): {"format": "pt", "brigade_model": "<bg_model_desc_to_json text>"}
 *  (safetensors metadata values are strings). */
bg_status_t bg_model_metadata_json(const bg_model_desc_t *d, char **json_p);
/** Write the range's tensors to @p path atomically (temporary file, fsync,
 *  rename): the file is complete or absent. metadata: JSON object text or NULL. Shards are gathered whole
 *  over their group (a collective) and written by its member 0; @p path "" gathers and writes nothing (a
 *  member that takes part in another's gathers). */
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
