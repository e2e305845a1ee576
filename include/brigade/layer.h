/**
 * @file layer.h
 * @brief The layer interface: forward, backward-input and backward-weight.
 *
 * A layer maps an activation of shape (n, t, c) to another. It exposes three
 * compute functions so zero-bubble schedules can run them apart:
 *   - forward (F):          out = f(in), keeping what backward needs in its stash;
 *   - backward_input (B):   din from dout, keeping what W needs in its wstash;
 *   - backward_weight (W):  parameter gradients += from in, dout and the wstash.
 * Full backward is B then W. Parameter gradients accumulate (+=), activation
 * gradients are assigned (=). The caller (the stage, see model.h) owns every
 * buffer: the input, the output, the stash (kept from F until the last of B/W),
 * the wstash (kept from B to W) and a scratch area valid during one call. A
 * layer reports their sizes so the partitioner and the memory model can count
 * them before anything is allocated.
 *
 * A layer may be a composite: `seq` runs children in order, `residual` adds
 * its input to its child's output. Composites split B and W exactly as leaves
 * do, so a transformer block is a tree of leaves with no hand-written backward.
 *
 * Users add a layer type by filling a bg_layer_ops_t and calling
 * bg_layer_create(); see docs/layers.md.
 *
 * Ownership and threads: a layer made by bg_layer_create() or a built-in
 * constructor is the caller's until it is added to a composite or a model
 * description, which then owns and destroys it (bg_layer_destroy only for a
 * layer owned by nobody). A layer is bound to at most one model at a time and
 * its compute functions run on one thread at a time (the stage's); its ops
 * table must outlive it. Layers of different models are independent.
 */
#ifndef BRIGADE_LAYER_H
#define BRIGADE_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/backend.h"
#include "brigade/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Activation shape: n sequences of t positions of c channels. c = 0 means
 *  the activation is t int32 tokens per sequence (the embedding's input). */
typedef struct bg_shape {
    int n; /**< sequences in the microbatch */
    int t; /**< positions per sequence (1 for an MLP) */
    int c; /**< channels; 0 = token ids */
} bg_shape_t;

/** Elements of an activation of shape @p s: n * t * c (n * t token ids when c = 0). */
static inline size_t bg_shape_numel(bg_shape_t s) { return (size_t)s.n * (size_t)s.t * (size_t)(s.c ? s.c : 1); }

#define BG_PARAM_MAX_DIMS 4 /**< dimensions of a parameter tensor at most (bg_param_t.shape) */
#define BG_NAME_MAX 96 /**< bytes of a name buffer (a layer's or a parameter's local name), its NUL included */

/** Parameter initialisation. */
typedef enum bg_init_kind {
    BG_INIT_NORMAL = 0, /**< normal(0, std) */
    BG_INIT_CONST = 1,  /**< every element = value */
} bg_init_kind_t;

/** One parameter tensor of a layer. data/grad are views into the model's
 *  flat buffers, set when the model binds its parameters. */
typedef struct bg_param {
    char name[BG_NAME_MAX];             /**< local name: "weight", "bias" */
    int ndim;
    int64_t shape[BG_PARAM_MAX_DIMS];
    size_t numel;
    bg_init_kind_t init;
    float init_value;                   /**< std (NORMAL) or value (CONST) */
    int decay;                          /**< 1: weight decay applies */
    float *data;                        /**< (numel) on the backend */
    float *grad;                        /**< (numel) on the backend */
    /* tensor parallelism (docs/layers.md): a shard of a larger named tensor */
    int split_dim;                      /**< dimension split across the tensor-parallel group */
    int split_parts;                    /**< 0 or 1: the whole tensor; T: this is one of T equal shards */
    int split_blocks;                   /**< 0 or 1: one contiguous piece of split_dim; k: split_dim is k
                                             equal blocks (q, k, v) and the shard holds a piece of each */
    int tp_partial;                     /**< 1: a replicated tensor whose gradient each member of the tensor
                                             group computes from its own rows only (sequence parallelism,
                                             bg_layer_sequence_parallel): summed over the group before the
                                             optimizer (bg_model_tp_sum_grads) */
    int split_ep;                       /**< 1: the shard (split_dim, split_parts) is over the description's
                                             expert-parallel group (bg_model_desc_set_ep), not its tensor
                                             group: an MoE layer's experts; its gradient is reduced over the
                                             replicas that hold the same experts only */
} bg_param_t;

/**
 * A tensor-parallel group as layers see it (filled by the runtime over its
 * transport; models/ never sends a byte itself). Buffers are the backend's.
 * Results must be bitwise equal on every member, so replicated computation
 * stays replicated.
 */
typedef struct bg_tp_comm {
    int size; /**< members (the tensor-parallel degree T) */
    int rank; /**< this process's index in the group, 0 .. size-1 */
    /** In-place sum of @p count floats over the group. */
    bg_status_t (*allreduce)(void *arg, float *buf, size_t count);
    /** Every member's @p count floats: recv holds size * count, member i's at i * count. */
    bg_status_t (*allgather)(void *arg, const float *send, float *recv, size_t count);
    void *arg; /**< passed to the functions */
    /** Optional (NULL: the layers use allreduce): start the in-place sum of @p count floats, progressed
     *  while the caller computes; @p buf belongs to the group until wait returns. */
    bg_status_t (*iallreduce)(void *arg, float *buf, size_t count, void **req_p);
    /** With iallreduce: wait for a sum it started, and free its request. */
    bg_status_t (*wait)(void *arg, void *req);
    /** Optional (NULL: the layers use allreduce and keep their part): @p send holds size * @p count floats;
     *  member i gets in @p recv (count floats) the sum over the group of elements [i*count, (i+1)*count).
     *  Sequence-parallel layers use it. */
    bg_status_t (*reduce_scatter)(void *arg, const float *send, float *recv, size_t count);
    /** Optional, with wait (NULL: reduce_scatter): start the in-place reduce-scatter of @p buf, size *
     *  @p count floats, progressed while the caller computes; when wait returns, elements [rank*count,
     *  (rank+1)*count) hold their sum over the group (the rest: undefined). @p buf belongs to the group
     *  until then. */
    bg_status_t (*ireduce_scatter)(void *arg, float *buf, size_t count, void **req_p);
    /** Optional, with wait (NULL: allgather): start the in-place gather of @p buf, size * @p count
     *  floats, this member's at [rank*count, (rank+1)*count); when wait returns, every member's. */
    bg_status_t (*iallgather)(void *arg, float *buf, size_t count, void **req_p);
    /** Optional (expert parallelism's group; NULL elsewhere): all-to-all with variable counts of floats:
     *  sendcounts[j] floats from send + sdispls[j] to member j, recvcounts[i] floats from member i into
     *  recv + rdispls[i]; recvcounts[i] must equal member i's sendcounts[me] (bg_group_alltoallv). Blocking. */
    bg_status_t (*alltoallv)(void *arg, const float *send, const size_t *sendcounts, const size_t *sdispls,
                             float *recv, const size_t *recvcounts, const size_t *rdispls);
} bg_tp_comm_t;

/**
 * A context-parallel group as layers see it (filled by the runtime over its
 * transport; docs/executor.md, "Context parallelism"). Every sequence of a
 * microbatch is cut into 2 size chunks of equal length; member rank holds
 * chunks rank and 2 size - 1 - rank, in that order, as its t positions
 * (bg_cp_position). Attention passes key/value blocks around the ring of
 * members; every other layer must be position-wise. Buffers are the backend's.
 */
typedef struct bg_cp_comm {
    int size; /**< members (the context-parallel degree) */
    int rank; /**< this member, 0 .. size-1 */
    /** Start one ring step: send @p count floats of @p send to member rank + 1 and receive as many from
     *  member rank - 1 into @p recv; both buffers belong to the group until wait returns. @p lane (0 or 1)
     *  keeps two rings apart (a backward's key/value blocks and their gradients); on one lane the steps
     *  match in the order started, which must be the same on every member. */
    bg_status_t (*ring_start)(void *arg, int lane, const float *send, float *recv, size_t count, void **req_p);
    /** Wait for a step ring_start started, and free its request. */
    bg_status_t (*wait)(void *arg, void *req);
    void *arg; /**< passed to the functions */
} bg_cp_comm_t;

/** The global position of local position @p t (of @p t_local) on member @p cp->rank (NULL: t). */
int bg_cp_position(const bg_cp_comm_t *cp, int t, int t_local);

typedef struct bg_layer bg_layer_t; /**< a layer (its body is below) */

/** The tensor-parallel group collectives of one call, and the expert-parallel all-to-alls (the planner's
 *  cost model). */
typedef struct bg_tp_cost {
    double fwd_calls, fwd_bytes; /**< forward: collectives, and bytes each member puts in them */
    double bwd_calls, bwd_bytes; /**< backward (B + W) */
    double ep_fwd_msgs, ep_fwd_bytes; /**< forward: messages each member of an MoE layer's expert-parallel group
                                           (bg_moe_t.ep > 1) sends to the others in its all-to-alls, and their
                                           bytes, expected under uniform routing with nothing dropped */
    double ep_bwd_msgs, ep_bwd_bytes; /**< the same, backward (B; W sends nothing) */
    double cp_fwd_msgs, cp_fwd_bytes; /**< forward: ring steps each member of an attention layer's context group
                                           (bound by bg_model_desc_set_cp, cp > 1) sends to the next member, and
                                           their bytes: cp - 1 blocks of its packed qkv */
    double cp_bwd_msgs, cp_bwd_bytes; /**< the same, backward (B; W sends nothing): cp - 1 blocks again and cp
                                           blocks of their gradients */
} bg_tp_cost_t;

/** Group collectives a layer's backward_input started and left running (bg_layer_backward): at most
 *  BG_TP_DEFER_MAX requests of the group's iallreduce or ireduce_scatter, waited for with its wait;
 *  then, when all succeeded, the copies (backend copy of n floats from src to dst, in order: a
 *  reduce-scatter's result moved from the layer's scratch into din). */
#define BG_TP_DEFER_MAX 4
typedef struct bg_tp_deferred {
    void *req[BG_TP_DEFER_MAX];
    int n;
    struct {
        float *dst;
        const float *src;
        size_t n;
    } copy[BG_TP_DEFER_MAX];
    int ncopy;
} bg_tp_deferred_t;

/** Per-call context. Buffers are on the backend. */
typedef struct bg_layer_ctx {
    bg_backend_t *be;
    bg_shape_t in;            /**< shape of this call's input */
    const int32_t *tokens;    /**< (n, t) input tokens of the microbatch (embedding) */
    const int32_t *targets;   /**< (n, t) targets of the microbatch (loss layers) */
    float loss_scale;         /**< d(objective)/d(each token's loss) (loss layers) */
    void *stash;              /**< stash_bytes(in): kept from F until the last of B and W */
    void *wstash;             /**< wstash_bytes(in): kept from B until W */
    void *scratch;            /**< scratch_bytes(in): valid during one call only */
    const bg_tp_comm_t *tp;   /**< the tensor-parallel group (NULL: none, T = 1) */
    /** backward_input only, NULL otherwise: the caller runs this layer's backward_weight next (with the
     *  same scratch) and reads din only after waiting (tp->wait) for the requests left here and making
     *  the copies, so a tensor-parallel layer may start din's group sum (tp->iallreduce) or reduce-scatter
     *  (tp->ireduce_scatter, into scratch that its backward_weight leaves alone, with a copy into din),
     *  add the request (while n < BG_TP_DEFER_MAX) and return: the collective then overlaps the weight
     *  gradient. bg_layer_backward sets it. */
    bg_tp_deferred_t *deferred;
    /** forward only, 0 otherwise: 1 when no backward will read this forward's stash (the stage drops it as
     *  the forward returns: recomputation, whose backward runs the forward again first, or a forward-only
     *  program such as an evaluation). A layer that keeps state of its own for the backward, beyond its
     *  stash (the Python binding's torch adapter keeps an autograd graph), keeps none then. */
    int no_backward;
    /** The expert-parallel group (bg_model_desc_set_ep; NULL: none, every expert here): an MoE layer built
     *  for ep = N holds E/N experts, those of member rank, and exchanges tokens with alltoallv. */
    const bg_tp_comm_t *ep;
    /** The context-parallel group (NULL: none): the input holds this member's positions of every
     *  sequence (bg_cp_position); layers that mix positions (attention) or read them (position tables)
     *  use it, the others are position-wise. Appended last. */
    const bg_cp_comm_t *cp;
} bg_layer_ctx_t;

/** A layer type: its functions (filled with designated initialisers; see docs/layers.md). */
typedef struct bg_layer_ops {
    const char *type; /**< "linear", "layernorm", ... */
    /** Output shape for an input shape; BG_ERR_INVALID with a message if the shape is wrong. */
    bg_status_t (*out_shape)(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p);
    size_t (*stash_bytes)(const bg_layer_t *l, bg_shape_t in);   /**< may be NULL: 0 */
    size_t (*wstash_bytes)(const bg_layer_t *l, bg_shape_t in);  /**< may be NULL: 0 */
    size_t (*scratch_bytes)(const bg_layer_t *l, bg_shape_t in); /**< may be NULL: 0 */
    double (*fwd_flops)(const bg_layer_t *l, bg_shape_t in);
    double (*bwd_flops)(const bg_layer_t *l, bg_shape_t in); /**< B + W */
    /** out = f(in). in is NULL for token inputs (use ctx->tokens). */
    bg_status_t (*forward)(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out);
    /** din = d/din given dout. din may be NULL (first layer of a model). dout is
     *  NULL for loss layers, which use ctx->targets and ctx->loss_scale. */
    bg_status_t (*backward_input)(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                  const float *out, const float *dout, float *din);
    /** grads += from in, dout and the wstash. May be NULL (no parameters). */
    bg_status_t (*backward_weight)(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                   const float *out, const float *dout);
    /** Frees impl. May be NULL. */
    void (*destroy)(bg_layer_t *l);
    /** Loss layers only (NULL for every other layer): the number of target
     *  classes; targets are ids in [0, classes). A loss layer's output is
     *  (n, t, 1) per-position losses and its backward_input starts from
     *  ctx->targets and ctx->loss_scale. A model's last layer must be one. */
    int (*loss_classes)(const bg_layer_t *l);
    /** Tensor-parallel layers only (NULL: none): adds the group collectives of one forward and one
     *  backward for input @p in to *cost. */
    void (*tp_cost)(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost);
    /** Optional (NULL: bg_layer_backward runs backward_input, then backward_weight): backward_input and
     *  backward_weight in one call, for composites, which run bg_layer_backward on each child so that
     *  a child's weight gradient follows its input gradient (and overlaps its deferred sums). */
    bg_status_t (*backward)(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                            const float *dout, float *din);
} bg_layer_ops_t;

/** A layer: its type, name, parameters and children. */
struct bg_layer {
    const bg_layer_ops_t *ops;
    char name[BG_NAME_MAX]; /**< local name; the full name is the path from the model's root */
    int nparams;
    bg_param_t *params;     /**< nparams entries */
    int nchildren;
    bg_layer_t **children;  /**< composites only */
    void *impl;             /**< the type's private state */
    /** Storage of the activations the layer keeps itself between forward and backward (set by
     *  bg_layer_set_precision; BG_F32 at creation). The composites keep theirs in bf16 under BG_BF16 and
     *  give their children fp32 copies; a leaf's stash is its own business (the built-in leaves keep fp32). */
    bg_dtype_t precision;
};

/** Create a layer of a user-defined type. params (nparams entries) are copied. */
bg_status_t bg_layer_create(const bg_layer_ops_t *ops, const char *name, int nparams,
                            const bg_param_t *params, void *impl, bg_layer_t **layer_p);
/** Destroy a layer and its children. */
void bg_layer_destroy(bg_layer_t *l);

/** Set the storage precision of @p l and every layer below it (BG_F32 or BG_BF16; else BG_ERR_INVALID).
 *  Under BG_BF16 the composites (seq, residual) keep the activations between their children in bf16:
 *  about half of a transformer block's activation bytes; every leaf still computes in fp32 on fp32
 *  buffers, reading each kept activation as rounded to bf16 (forward and backward alike), and gradients,
 *  weights and optimizer state stay fp32. Changes the sizes the layer reports, so set it before the
 *  description is checked, planned or bound (bg_model_desc_set_precision does it for a whole model). */
bg_status_t bg_layer_set_precision(bg_layer_t *l, bg_dtype_t precision);

/* ---- sizes and costs of any layer (composites included) ---- */
bg_status_t bg_layer_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p); /**< output shape for input @p in; BG_ERR_INVALID with a message if @p in is wrong */
size_t bg_layer_stash_bytes(const bg_layer_t *l, bg_shape_t in); /**< bytes kept per microbatch from F until the last of B and W */
size_t bg_layer_wstash_bytes(const bg_layer_t *l, bg_shape_t in); /**< bytes kept from B until W */
size_t bg_layer_scratch_bytes(const bg_layer_t *l, bg_shape_t in); /**< temporary bytes during one call */
size_t bg_layer_param_count(const bg_layer_t *l); /**< including children */
double bg_layer_fwd_flops(const bg_layer_t *l, bg_shape_t in); /**< FLOPs of the forward */
double bg_layer_bwd_flops(const bg_layer_t *l, bg_shape_t in); /**< FLOPs of the backward (B + W) */
/** Adds the tensor-parallel collectives of one F and one B of @p l (composites: their children's) to *cost. */
void bg_layer_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost);
/** Target classes of a loss layer (a seq whose last child is one counts); 0: not a loss layer. */
int bg_layer_loss_classes(const bg_layer_t *l);
/** The fused backward of @p l (backward_input, then backward_weight; ops->backward for composites):
 *  din and the gradients as the two calls give them, bitwise. With a tensor group that has iallreduce and
 *  wait, a layer with a weight gradient may leave din's group sum running during its backward_weight
 *  (bg_layer_ctx_t.deferred); every such sum has been waited for when this returns, also on failure. */
bg_status_t bg_layer_backward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                              const float *dout, float *din);

/* ---- built-in layers ---- */
/** Fully connected: (n, t, c_in) -> (n, t, c_out); weight (c_out, c_in) from normal(0, init_std), bias (optional) zeros. */
bg_status_t bg_layer_linear(const char *name, int c_in, int c_out, int bias, float init_std, bg_layer_t **layer_p);
typedef enum bg_activation { BG_ACT_GELU = 0, BG_ACT_RELU = 1 } bg_activation_t; /**< the function of bg_layer_activation(); GELU is the tanh approximation (GPT-2) */
/** Elementwise activation: (n, t, c) -> (n, t, c); no parameters. */
bg_status_t bg_layer_activation(const char *name, bg_activation_t kind, bg_layer_t **layer_p);
/** LayerNorm over the last dimension of c channels (eps 1e-5); weight starts at ones, bias at zeros. */
bg_status_t bg_layer_layernorm(const char *name, int c, bg_layer_t **layer_p);
/** token + position embedding: (n, t) tokens -> (n, t, c); t <= max_t. */
bg_status_t bg_layer_embedding(const char *name, int vocab, int max_t, int c, float init_std, bg_layer_t **layer_p);
/** causal multi-head attention core: (n, t, 3c) qkv -> (n, t, c); no parameters. */
bg_status_t bg_layer_attention(const char *name, int c, int heads, bg_layer_t **layer_p);
/** Linear c -> classes (bias optional) + softmax cross-entropy against ctx->targets:
 *  output (n, t, 1) = per-position losses. */
bg_status_t bg_layer_head(const char *name, int c, int classes, int bias, float init_std, bg_layer_t **layer_p);
/** Composite: children in order (takes ownership of them, also on failure). */
bg_status_t bg_layer_seq(const char *name, int n, bg_layer_t **children, bg_layer_t **layer_p);
/** Composite: out = in + child(in) (takes ownership of child, also on failure). */
bg_status_t bg_layer_residual(const char *name, bg_layer_t *child, bg_layer_t **layer_p);
/** Pre-norm causal self-attention block: x + proj(attn(qkv(ln(x)))). */
bg_status_t bg_layer_attention_block(const char *name, int c, int heads, float init_std, float proj_std, bg_layer_t **layer_p);
/** Pre-norm MLP block: x + proj(gelu(fc(ln(x)))), hidden 4c. */
bg_status_t bg_layer_mlp_block(const char *name, int c, float init_std, float proj_std, bg_layer_t **layer_p);
/** Transformer block: attention block then MLP block. */
bg_status_t bg_layer_transformer_block(const char *name, int c, int heads, float init_std, float proj_std, bg_layer_t **layer_p);

/* ---- mixture of experts (docs/layers.md) ---- */
/** How the router's logits become the gates of the chosen experts. */
typedef enum bg_moe_gate {
    BG_MOE_SOFTMAX = 0, /**< softmax over the top-k logits (renormalised over the chosen) */
    BG_MOE_SIGMOID = 1, /**< sigmoid of each chosen logit, not renormalised */
} bg_moe_gate_t;
/** The sizes and settings of an MoE layer. */
typedef struct bg_moe {
    int c;                 /**< model width (d_model) */
    int experts;           /**< E: experts */
    int top_k;             /**< experts per token, 1 .. min(E, 64) */
    int ffn;               /**< each expert's SwiGLU hidden size */
    bg_moe_gate_t gate;    /**< gating function */
    float capacity_factor; /**< each expert takes at most ceil(factor N k / E) of a microbatch's N tokens, earlier
                                tokens first, the rest dropped (counted); 0: no limit (dropless) */
    float aux_coef;        /**< coefficient of the load-balancing loss E sum_e f_e P_e (0: none) */
    float init_std;        /**< std of the router and the experts' up projections */
    float proj_std;        /**< std of the experts' down projections */
    int ep;                /**< expert-parallel degree N (0 or 1: every expert on each rank): the layer holds
                                experts [r E/N, (r+1) E/N) of its group's member r (ctx->ep); N divides E */
} bg_moe_t;
/** Mixture-of-experts MLP: (n, t, c) -> (n, t, c) = sum over each token's top-k experts of gate * down_e(
 *  swiglu(up_e(x))); ties in the top-k go to the lower expert index, and each token sums its experts in
 *  expert order, so the result does not depend on threads. Tensors "router" (E, c), "up" (E, 2 ffn, c) and
 *  "down" (E, c, ffn). The load-balancing loss (f_e: share of the N k choices that picked expert e before the
 *  capacity, P_e: mean softmax probability of e) enters the objective as aux_coef * aux once per token of the
 *  microbatch, weighted like the tokens' losses (ctx->loss_scale); its gradient reaches the router only. */
bg_status_t bg_layer_moe(const char *name, const bg_moe_t *m, bg_layer_t **layer_p);
/** What the last forward of an MoE layer routed. */
typedef struct bg_moe_stats {
    double aux_loss;       /**< E sum_e f_e P_e of the last forward (without the coefficient) */
    int64_t dropped;       /**< token-expert choices the capacity dropped in the last forward */
    int64_t dropped_total; /**< the same, summed over every forward since creation */
    double aux_total;      /**< aux_loss summed over every forward since creation */
    int64_t forwards;      /**< forwards since creation */
} bg_moe_stats_t;
/** 1 when @p l is an MoE layer (bg_layer_moe). */
int bg_layer_is_moe(const bg_layer_t *l);
/** The routing statistics of MoE layer @p l (BG_ERR_INVALID when it is not one). */
bg_status_t bg_layer_moe_stats(const bg_layer_t *l, bg_moe_stats_t *stats_p);

/* ---- Llama-style layers (docs/layers.md; they need the backend's Llama kernels, BG_ERR_UNSUPPORTED naming the
 *      slot otherwise) ---- */
/** RMSNorm over the last dimension of c channels (eps 1e-5): x / rms(x) * weight; weight starts at ones. */
bg_status_t bg_layer_rmsnorm(const char *name, int c, bg_layer_t **layer_p);
/** SwiGLU: (n, t, 2h) = [a | b] -> (n, t, h) = silu(a) * b; no parameters. */
bg_status_t bg_layer_swiglu(const char *name, int h, bg_layer_t **layer_p);
/** Causal grouped-query attention core with rotary positions (RoPE, rotate-half pairs, frequencies
 *  rope_theta^(-2i/head_dim), positions 0 .. t-1): (n, t, kv_heads (g + 2) head_dim) -> (n, t, heads head_dim),
 *  g = heads / kv_heads. The input row is kv_heads groups, each [g query heads | one key head | one value
 *  head]; queries and keys are rotated, then each key/value head serves its group's g queries. No parameters. */
bg_status_t bg_layer_gqa_attention(const char *name, int heads, int kv_heads, int head_dim, float rope_theta,
                                   bg_layer_t **layer_p);
/** Token embedding without a position table (rotary models): (n, t) tokens -> (n, t, c); one tensor "wte". */
bg_status_t bg_layer_token_embedding(const char *name, int vocab, int max_t, int c, float init_std,
                                     bg_layer_t **layer_p);
/** The sizes of a Llama block. */
typedef struct bg_llama_block {
    int c;            /**< model width */
    int heads;        /**< query heads (divides c) */
    int kv_heads;     /**< key/value heads (divides heads) */
    int ffn;          /**< SwiGLU hidden size */
    float rope_theta; /**< RoPE base (10000 in Llama 2) */
    float init_std;   /**< std of qkv and up */
    float proj_std;   /**< std of proj and down */
    const bg_moe_t *moe; /**< NULL: a dense SwiGLU MLP; else the MLP is this MoE layer (ffn unused; tp must be 1) */
} bg_llama_block_t;
/** Llama block: x + proj(attn(qkv(rmsnorm(x)))), then x + down(swiglu(up(rmsnorm(x)))), no biases; children
 *  "attn" (norm, qkv, attn, proj) and "mlp" (norm, up, swiglu, down; with b->moe: norm, moe). tp > 1: qkv and up column-parallel,
 *  proj and down row-parallel, each member holding kv_heads / tp whole key/value groups and ffn / tp
 *  SwiGLU channels (tp must divide kv_heads and ffn). */
bg_status_t bg_layer_llama_block(const char *name, const bg_llama_block_t *b, int tp, bg_layer_t **layer_p);

/* ---- tensor-parallel layers (Megatron-style; docs/layers.md) ----
 * Each takes the tensor-parallel degree @p tp and holds this rank's shard of
 * full named tensors (saved and loaded whole). They need the model bound to a
 * group of tp ranks (bg_model_desc_set_tp; the executor does it). Sizes that
 * tp does not divide fail with a message naming the layer and the sizes. */
/** Column-parallel linear: (n, t, c_in) -> (n, t, c_out / tp), output features split; no communication
 *  forward, a sum of the input gradient backward. blocks > 1: the output is blocks equal groups (packed
 *  q, k, v: 3) and each rank holds a slice of every group. */
bg_status_t bg_layer_column_linear(const char *name, int c_in, int c_out, int blocks, int bias, float init_std, int tp,
                                   bg_layer_t **layer_p);
/** Row-parallel linear: (n, t, c_in / tp) -> (n, t, c_out), input features split; one sum of the output
 *  forward (the bias, replicated, is added after it), none backward. */
bg_status_t bg_layer_row_linear(const char *name, int c_in, int c_out, int bias, float init_std, int tp,
                                bg_layer_t **layer_p);
/** Vocabulary-parallel token + position embedding: (n, t) tokens -> (n, t, c); each rank holds vocab / tp
 *  rows of "wte" (wpe is replicated); one sum forward. */
bg_status_t bg_layer_vocab_embedding(const char *name, int vocab, int max_t, int c, float init_std, int tp,
                                     bg_layer_t **layer_p);
/** bg_layer_vocab_embedding without the position table (rotary models): one tensor "wte". */
bg_status_t bg_layer_vocab_token_embedding(const char *name, int vocab, int max_t, int c, float init_std, int tp,
                                           bg_layer_t **layer_p);
/** Vocabulary-parallel head: linear c -> classes / tp per rank and a softmax cross-entropy that never
 *  gathers the logits (one allgather of 3 floats per position forward, one sum of the input gradient
 *  backward). Output (n, t, 1) per-position losses, as bg_layer_head. */
bg_status_t bg_layer_vocab_head(const char *name, int c, int classes, int bias, float init_std, int tp,
                                bg_layer_t **layer_p);
/** Tensor-parallel attention block: x + proj(attn(qkv(ln(x)))) with qkv column-parallel (heads / tp heads
 *  per rank), proj row-parallel: one sum forward, one backward. */
bg_status_t bg_layer_tp_attention_block(const char *name, int c, int heads, float init_std, float proj_std, int tp,
                                        bg_layer_t **layer_p);
/** Tensor-parallel MLP block: x + proj(gelu(fc(ln(x)))), fc column-parallel, proj row-parallel. */
bg_status_t bg_layer_tp_mlp_block(const char *name, int c, float init_std, float proj_std, int tp,
                                  bg_layer_t **layer_p);
/** Tensor-parallel transformer block: the two blocks above. */
bg_status_t bg_layer_tp_transformer_block(const char *name, int c, int heads, float init_std, float proj_std, int tp,
                                          bg_layer_t **layer_p);
/** Sequence parallelism (Megatron-LM, Korthikanti et al. 2022; docs/layers.md) on the tree of @p l:
 *  between the tensor-parallel regions the activation (n, t, c) is split along t, member r holding
 *  positions [r t/T, (r+1) t/T) of every sequence, (n, t/T, c). A column-parallel linear then gathers
 *  its input along the sequence (a reduce-scatter of its input gradient backward), a row-parallel one
 *  reduce-scatters its output instead of summing it (a gather of its output gradient backward); the
 *  vocabulary-parallel embedding reduce-scatters its output, the vocabulary-parallel head gathers its
 *  input (its output: the losses of every position). Every other leaf (layernorm, ...) runs on the local
 *  rows and its tensors become tp_partial. t must be a multiple of T. A plain embedding or loss layer
 *  in the tree: BG_ERR_INVALID naming it. Call it before the description is checked. */
bg_status_t bg_layer_sequence_parallel(bg_layer_t *l);

/* ---- shards of tensor-parallel parameters ---- */
/** Is @p p a shard (split_parts > 1)? */
static inline int bg_param_is_shard(const bg_param_t *p) { return p->split_parts > 1; }
/** The full tensor's shape and elements (the shard's own for a whole tensor). */
size_t bg_param_full_shape(const bg_param_t *p, int64_t *shape /* (BG_PARAM_MAX_DIMS) */);
/** Host copy of member @p part's shard out of the full tensor @p full. */
void bg_param_shard_from_full(const bg_param_t *p, int part, const float *full, float *shard);
/** Host copy of the full tensor from every member's shard, concatenated in member order. */
void bg_param_full_from_shards(const bg_param_t *p, const float *shards, float *full);
/** Collective over @p tp: the full tensor (host, bg_param_full_shape elements) from every member's
 *  shard @p src (on @p be, or host memory when @p be is NULL; p->numel floats: the weights or a slice of
 *  optimizer state shaped like them). With @p be the shards are gathered on its buffers (one of the full
 *  tensor's size allocated from @p be and freed; the group's collectives must work on them) and copied to
 *  the host once; a fault of @p be is the result. Without, the group must work on host buffers. */
bg_status_t bg_param_gather_full(const bg_tp_comm_t *tp, bg_backend_t *be, const bg_param_t *p, const float *src,
                                 float *full);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_LAYER_H */
