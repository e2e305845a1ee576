/* models/layer_impl.h: what the layer files (layer.c, layers.c, tp_layers.c)
 * share, all defined in models/layer_impl.c, which calls none of them: calls
 * between the layer files go one way, into that file. */
#ifndef BG_MODELS_LAYER_IMPL_H
#define BG_MODELS_LAYER_IMPL_H

#include <stdio.h>

#include "brigade/layer.h"

/* Round a byte count up to a multiple of 64 (every buffer piece is aligned). */
size_t bg__align64(size_t bytes);
/* Bytes a stage reserves after every buffer it hands a layer (BRIGADE_GUARD:
 * canaries or guard zones; 0: off), as models/stage.c allocates them: the
 * profile counts them so that predictions match the allocator. */
size_t bg__guard_bytes(void);
/* BG_ERR_INVALID: layer l's input shape in, and what it wants instead. */
bg_status_t bg__shape_err(const bg_layer_t *l, bg_shape_t in, const char *want);
/* A float input of exactly c channels, n >= 1, t >= 1 (else bg__shape_err). */
bg_status_t bg__want_channels(const bg_layer_t *l, bg_shape_t in, int c);
/* The one rule of what a stage keeps between top-level layers (models/stage.c) and the profile counts
 * (models/desc.c): bytes an element of the output of top-level layer g of n (g = -1: the model's own
 * input, fp32), es for the precision's; the model's last output, the losses, is fp32. */
static inline size_t bg__kept_es(size_t es, int g, int n) { return g >= 0 && g < n - 1 ? es : sizeof(float); }
/* The scratch of a top-level layer's call: `copies` bytes of fp32 copies of its input and output (bf16:
 * models/stage.c) in front of its own scratch (`own` bytes), which then starts 64-byte aligned. */
static inline size_t bg__call_scratch(size_t copies, size_t own) { return copies ? copies + bg__align64(own) : own; }
/* Bytes of a layer's output for an input shape (aligned), 0 on a bad shape. */
size_t bg__layer_out_bytes(const bg_layer_t *l, bg_shape_t in);
/* Keep fp32 x (n elements) in the bf16 buffer kept and round x to it (layer.c's header). */
void bg__layer_keep_bf16(bg_backend_t *be, void *kept, float *x, size_t n);

/* The fused backward's deferral (bg_layer_backward): &d when leaf @p l may
 * leave din's group sums running during its backward_weight (it has one, and
 * ctx's group has iallreduce and wait), else NULL. d->n = 0. */
bg_tp_deferred_t *bg__layer_deferral(const bg_layer_t *l, const bg_layer_ctx_t *ctx, bg_tp_deferred_t *d);
/* Wait for every request in @p d (NULL: none); the first failure of st and the waits. */
bg_status_t bg__layer_wait_deferred(const bg_layer_ctx_t *ctx, bg_tp_deferred_t *d, bg_status_t st);

/* A leaf with a copy of impl (impl_size bytes), freed by bg__free_impl. */
bg_status_t bg__make_leaf(const bg_layer_ops_t *ops, const char *name, int np, const bg_param_t *params,
                          const void *impl, size_t impl_size, bg_layer_t **layer_p);
void bg__free_impl(bg_layer_t *l);

/* The linear layer (bg_layer_linear: impl a bg__linear_t) and the
 * activation (bg_layer_activation: impl a bg__act_t), here because seq fuses
 * the pair (bg__linear_gelu_fused knows them by these tables). The linear's
 * shape, costs and weight gradient are shared with the column- and
 * row-parallel ones, whose impl starts with a bg__linear_t of their shard's
 * sizes. */
typedef struct { int c_in, c_out, bias; } bg__linear_t;
typedef struct { bg_activation_t kind; } bg__act_t;
extern const bg_layer_ops_t bg__linear_ops;
extern const bg_layer_ops_t bg__act_ops;
bg_status_t bg__linear_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p);
double bg__linear_fwd_flops(const bg_layer_t *l, bg_shape_t in);
double bg__linear_bwd_flops(const bg_layer_t *l, bg_shape_t in);
bg_status_t bg__linear_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout);

/* A linear layer with a bias followed by a GELU, fused inside a sequence
 * (models/layer.c's seq): the forward adds the bias in the GELU's pass
 * (bias_gelu_forward); when B and W run together, the GELU's input gradient
 * computes the bias gradient in its pass (gelu_bias_backward) and the
 * linear's weight gradient then skips it. The same bits as the two layers run apart, for any thread count.
 * *fused_p = 1 when lin and act are such a pair, BRIGADE_FUSE is on, the
 * backend has both fused kernels and there is no tensor-parallel group
 * (BG_ERR_INVALID: a BRIGADE_FUSE other than on or off). */
bg_status_t bg__linear_gelu_fused(const bg_layer_t *lin, const bg_layer_t *act, const bg_layer_ctx_t *ctx,
                                  int *fused_p);
/* BRIGADE_FUSE (read once per process): *on_p, BG_ERR_INVALID naming it when it is not on or off
 * (bg_stage_create checks it, so a bad value stops a run before its first step). */
bg_status_t bg__layer_fuse_setting(int *on_p);
/* pre = in W^T + b (the linear's output, ctx its context), out = gelu(pre) (the GELU's output) */
bg_status_t bg__linear_gelu_forward(bg_layer_t *lin, const bg_layer_ctx_t *ctx, const float *in, float *pre, float *out);
/* The GELU's input gradient dpre from its dout, and the linear's bias gradient; act_ctx the GELU's context */
bg_status_t bg__linear_gelu_backward_act(bg_layer_t *lin, const bg_layer_ctx_t *act_ctx, const float *pre,
                                         const float *dout, float *dpre);
/* The linear's weight gradient without its bias (already summed by bg__linear_gelu_backward_act) */
bg_status_t bg__linear_gelu_backward_weight(bg_layer_t *lin, const bg_layer_ctx_t *ctx, const float *in,
                                            const float *dpre);

/* The head's sizes and costs (models/layers.c's head), shared with the
 * vocabulary-parallel head (models/tp_layers.c), whose impl starts with a
 * bg__head_t of its shard's classes. */
typedef struct { int c, classes, bias; } bg__head_t;
bg_status_t bg__head_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p);
size_t bg__head_probs_bytes(const bg_layer_t *l, bg_shape_t in); /* probs, dlogits, logits: (N, classes) each */
double bg__head_fwd_flops(const bg_layer_t *l, bg_shape_t in);
double bg__head_bwd_flops(const bg_layer_t *l, bg_shape_t in);

/* The decode cache of a gqa_attention leaf (models/llama_layers.c), for generation: attached, the layer's
 * forward takes one sequence (n = 1) whose positions follow those already cached (RoPE at their absolute
 * positions), appends their keys and values and attends over every cached position; it has no backward
 * then. cap: positions it holds. Detach before the layer is destroyed (frees the cache on be). */
typedef struct bg__kv_cache bg__kv_cache_t;
int bg__layer_is_gqa(const bg_layer_t *l);
bg_status_t bg__gqa_cache_attach(bg_layer_t *l, bg_backend_t *be, int cap);
void bg__gqa_cache_detach(bg_layer_t *l, bg_backend_t *be);

/* Fill a parameter descriptor. */
static inline bg_param_t bg_param_make(const char *name, int ndim, const int64_t *shape, bg_init_kind_t init,
                                       float value, int decay)
{
    bg_param_t p = {0};
    snprintf(p.name, sizeof(p.name), "%s", name);
    p.ndim = ndim;
    p.numel = 1;
    for (int i = 0; i < ndim; i++) {
        p.shape[i] = shape[i];
        p.numel *= (size_t)shape[i];
    }
    p.init = init;
    p.init_value = value;
    p.decay = decay;
    return p;
}

#endif
