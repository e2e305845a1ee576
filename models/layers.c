/* models/layers.c: the built-in leaf layers (linear and activation, whose
 * ops live in models/layer_impl.c beside what shares them; layernorm,
 * embedding, attention core, head = linear + cross-entropy). Each leaf
 * computes only through the backend table. The blocks built from them are
 * in models/tp_layers.c (the tensor-parallel blocks of degree 1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/cp_attention.h"
#include "models/layer_impl.h"

#define ROWS(s) ((s).n * (s).t)

/* -------------------------------------------------- linear, activation */

/* A leaf of ops whose parameters are weight [c_out, c_in] (normal, init_std)
 * and, with bias, bias [c_out] (zero): the linear layer and the head. */
static bg_status_t make_affine(const bg_layer_ops_t *ops, const char *name, int c_in, int c_out, int bias,
                               float init_std, const void *impl, size_t impl_size, bg_layer_t **layer_p)
{
    bg_param_t params[2];
    params[0] = bg_param_make("weight", 2, (int64_t[]){c_out, c_in}, BG_INIT_NORMAL, init_std, 1);
    params[1] = bg_param_make("bias", 1, (int64_t[]){c_out}, BG_INIT_CONST, 0.0f, 0);
    return bg__make_leaf(ops, name, bias ? 2 : 1, params, impl, impl_size, layer_p);
}

bg_status_t bg_layer_linear(const char *name, int c_in, int c_out, int bias, float init_std, bg_layer_t **layer_p)
{
    if (c_in < 1 || c_out < 1)
        return bg_error(BG_ERR_INVALID, "linear %s: sizes %d -> %d must be positive", name, c_in, c_out);
    bg__linear_t p = {c_in, c_out, bias ? 1 : 0};
    return make_affine(&bg__linear_ops, name, c_in, c_out, bias, init_std, &p, sizeof(p), layer_p);
}

bg_status_t bg_layer_activation(const char *name, bg_activation_t kind, bg_layer_t **layer_p)
{
    if (kind != BG_ACT_GELU && kind != BG_ACT_RELU)
        return bg_error(BG_ERR_INVALID, "activation %s: unknown kind %d", name, (int)kind);
    bg__act_t p = {kind};
    return bg__make_leaf(&bg__act_ops, name, 0, NULL, &p, sizeof(p), layer_p);
}

/* ------------------------------------------------------------ layernorm */

typedef struct { int c; } ln_t;

static bg_status_t ln_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const ln_t *p = l->impl;
    BG_CHECK(bg__want_channels(l, in, p->c));
    *out_p = in;
    return BG_OK;
}
/* stash: mean (N) then rstd (N) */
static float *ln_mean(const bg_layer_ctx_t *ctx) { return ctx->stash; }
static float *ln_rstd(const bg_layer_ctx_t *ctx)
{
    return (float *)((char *)ctx->stash + bg__align64((size_t)ROWS(ctx->in) * sizeof(float)));
}
static size_t ln_stash_bytes(const bg_layer_t *l, bg_shape_t in) { return 2 * bg__align64((size_t)ROWS(in) * sizeof(float)); }
static double ln_fwd_flops(const bg_layer_t *l, bg_shape_t in) { return 7.0 * (double)bg_shape_numel(in); }
static double ln_bwd_flops(const bg_layer_t *l, bg_shape_t in) { return 12.0 * (double)bg_shape_numel(in); }

static bg_status_t ln_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    int N = ROWS(ctx->in), C = ctx->in.c;
    ctx->be->ops->layernorm_forward(ctx->be, out, ln_mean(ctx), ln_rstd(ctx), in, l->params[0].data, l->params[1].data, N, C);
    return BG_OK;
}

static bg_status_t ln_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                     const float *out, const float *dout, float *din)
{
    int N = ROWS(ctx->in), C = ctx->in.c;
    if (din)
        ctx->be->ops->layernorm_backward_input(ctx->be, din, dout, in, l->params[0].data, ln_mean(ctx), ln_rstd(ctx),
                                               N, C);
    return BG_OK;
}

static bg_status_t ln_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                      const float *out, const float *dout)
{
    int N = ROWS(ctx->in), C = ctx->in.c;
    ctx->be->ops->layernorm_backward_weight(ctx->be, l->params[0].grad, l->params[1].grad, dout, in, ln_mean(ctx),
                                            ln_rstd(ctx), N, C);
    return BG_OK;
}

static const bg_layer_ops_t ln_ops = {
    .type = "layernorm",
    .out_shape = ln_out_shape,
    .stash_bytes = ln_stash_bytes,
    .fwd_flops = ln_fwd_flops,
    .bwd_flops = ln_bwd_flops,
    .forward = ln_forward,
    .backward_input = ln_backward_input,
    .backward_weight = ln_backward_weight,
    .destroy = bg__free_impl,
};

bg_status_t bg_layer_layernorm(const char *name, int c, bg_layer_t **layer_p)
{
    if (c < 1)
        return bg_error(BG_ERR_INVALID, "layernorm %s: %d channels", name, c);
    ln_t p = {c};
    bg_param_t params[2];
    params[0] = bg_param_make("weight", 1, (int64_t[]){c}, BG_INIT_CONST, 1.0f, 0);
    params[1] = bg_param_make("bias", 1, (int64_t[]){c}, BG_INIT_CONST, 0.0f, 0);
    return bg__make_leaf(&ln_ops, name, 2, params, &p, sizeof(p), layer_p);
}

/* ------------------------------------------------------------ embedding */

typedef struct { int vocab, max_t, c, pos; } emb_t; /* pos 0: no position table (rotary models) */

static bg_status_t emb_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const emb_t *p = l->impl;
    if (in.c != 0 || in.n < 1 || in.t < 1)
        return bg__shape_err(l, in, "token ids (c = 0) are expected");
    if (in.t > p->max_t)
        return bg_error(BG_ERR_INVALID, "layer %s: sequence length %d exceeds the model's maximum %d",
                        l->name, in.t, p->max_t);
    *out_p = (bg_shape_t){in.n, in.t, p->c};
    return BG_OK;
}
static double emb_fwd_flops(const bg_layer_t *l, bg_shape_t in) { return (double)ROWS(in) * ((emb_t *)l->impl)->c; }

static bg_status_t emb_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const emb_t *p = l->impl;
    if (!ctx->tokens)
        return bg_error(BG_ERR_INVALID, "layer %s: no input tokens", l->name);
    if (ctx->cp && p->pos)
        return bg__cp_embedding_forward(ctx, out, l->params[0].data, l->params[1].data, p->c);
    ctx->be->ops->embedding_forward(ctx->be, out, ctx->tokens, l->params[0].data, p->pos ? l->params[1].data : NULL,
                                    ctx->in.n, ctx->in.t, p->c);
    return BG_OK;
}

static bg_status_t emb_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                      const float *out, const float *dout, float *din)
{
    return BG_OK; /* tokens have no gradient */
}

static bg_status_t emb_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                       const float *out, const float *dout)
{
    const emb_t *p = l->impl;
    if (ctx->cp && p->pos)
        return bg__cp_embedding_backward(ctx, l->params[0].grad, l->params[1].grad, dout, p->c);
    ctx->be->ops->embedding_backward(ctx->be, l->params[0].grad, p->pos ? l->params[1].grad : NULL, dout, ctx->tokens,
                                     ctx->in.n, ctx->in.t, p->c);
    return BG_OK;
}

static const bg_layer_ops_t emb_ops = {
    .type = "embedding",
    .out_shape = emb_out_shape,
    .fwd_flops = emb_fwd_flops,
    .bwd_flops = emb_fwd_flops,
    .forward = emb_forward,
    .backward_input = emb_backward_input,
    .backward_weight = emb_backward_weight,
    .destroy = bg__free_impl,
};

bg_status_t bg_layer_embedding(const char *name, int vocab, int max_t, int c, float init_std, bg_layer_t **layer_p)
{
    if (vocab < 1 || max_t < 1 || c < 1)
        return bg_error(BG_ERR_INVALID, "embedding %s: vocab %d, max_t %d, c %d must be positive", name, vocab,
                        max_t, c);
    emb_t p = {vocab, max_t, c, 1};
    bg_param_t params[2];
    params[0] = bg_param_make("wte", 2, (int64_t[]){vocab, c}, BG_INIT_NORMAL, init_std, 1);
    params[1] = bg_param_make("wpe", 2, (int64_t[]){max_t, c}, BG_INIT_NORMAL, init_std * 0.5f, 1);
    return bg__make_leaf(&emb_ops, name, 2, params, &p, sizeof(p), layer_p);
}

bg_status_t bg_layer_token_embedding(const char *name, int vocab, int max_t, int c, float init_std,
                                     bg_layer_t **layer_p)
{
    if (vocab < 1 || max_t < 1 || c < 1)
        return bg_error(BG_ERR_INVALID, "embedding %s: vocab %d, max_t %d, c %d must be positive", name, vocab,
                        max_t, c);
    emb_t p = {vocab, max_t, c, 0};
    bg_param_t wte = bg_param_make("wte", 2, (int64_t[]){vocab, c}, BG_INIT_NORMAL, init_std, 1);
    return bg__make_leaf(&emb_ops, name, 1, &wte, &p, sizeof(p), layer_p);
}

/* ------------------------------------------------------ attention core */

typedef struct { int c, heads, ring; } attn_t; /* ring: its context group's size (bg__attention_set_ring), or 0 */

void bg__attention_set_ring(bg_layer_t *l, int size) { ((attn_t *)l->impl)->ring = size; }

static bg_status_t attn_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const attn_t *p = l->impl;
    BG_CHECK(bg__want_channels(l, in, 3 * p->c)); /* packed q, k, v */
    *out_p = (bg_shape_t){in.n, in.t, p->c};
    return BG_OK;
}
static size_t attn_stash_bytes(const bg_layer_t *l, bg_shape_t in)
{
    const attn_t *p = l->impl;
    return bg_attention_ws_floats(in.n, in.t, p->c, p->heads) * sizeof(float);
}
static size_t attn_scratch_bytes(const bg_layer_t *l, bg_shape_t in)
{
    const attn_t *p = l->impl;
    size_t own = bg_attention_scratch_floats(in.n, in.t, p->c, p->heads) * sizeof(float);
    return p->ring ? bg__align64(own) + bg__cp_ring_bytes(in.n, in.t, p->c) : own;
}
static void attn_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const attn_t *p = l->impl;
    bg__cp_ring_cost(p->ring, in.n, in.t, p->c, cost);
}
/* The fused kernel visits the T(T+1)/2 causal (query, key) pairs per head:
 * forward q.k and p v (2 hs multiply-adds) and about 5 flops of softmax per
 * pair; backward recomputes q.k, then do.v, dq, dk and dv (5 hs
 * multiply-adds) and about 8 flops per pair. */
static double attn_pairs(const attn_t *p, bg_shape_t in) { return (double)in.n * p->heads * in.t * (in.t + 1.0) / 2.0; }
static double attn_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const attn_t *p = l->impl;
    return attn_pairs(p, in) * (4.0 * (p->c / p->heads) + 5.0);
}
static double attn_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const attn_t *p = l->impl;
    return attn_pairs(p, in) * (10.0 * (p->c / p->heads) + 8.0);
}

/* The ring's blocks under context parallelism: after the backward's scratch */
static void *attn_ring(const attn_t *p, const bg_layer_ctx_t *ctx)
{
    return (char *)ctx->scratch +
           bg__align64(bg_attention_scratch_floats(ctx->in.n, ctx->in.t, p->c, p->heads) * sizeof(float));
}

static bg_status_t attn_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const attn_t *p = l->impl;
    int hs = p->c / p->heads, max = ctx->be->ops->attention_max_head;
    if (max > 0 && hs > max) /* before anything is written: the step fails with nothing changed */
        return bg_error(BG_ERR_UNSUPPORTED, "attention %s: head size %d (d_model %d / %d heads) is above the %s "
                        "backend's largest, %d: use more heads", l->name, hs, p->c, p->heads, ctx->be->ops->name, max);
    if (ctx->cp)
        return bg__cp_attention_forward(l, ctx, out, ctx->stash, in, attn_ring(p, ctx), p->c, p->heads);
    bg_attention_forward(ctx->be, out, ctx->stash, in, ctx->in.n, ctx->in.t, p->c, p->heads);
    return BG_OK;
}

static bg_status_t attn_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                       const float *out, const float *dout, float *din)
{
    const attn_t *p = l->impl;
    if (din && ctx->cp)
        return bg__cp_attention_backward(l, ctx, din, ctx->scratch, dout, in, out, ctx->stash, attn_ring(p, ctx),
                                         p->c, p->heads);
    if (din)
        bg_attention_backward(ctx->be, din, ctx->scratch, dout, in, out, ctx->stash, ctx->in.n, ctx->in.t, p->c,
                              p->heads);
    return BG_OK;
}

static const bg_layer_ops_t attn_ops = {
    .type = "attention",
    .out_shape = attn_out_shape,
    .stash_bytes = attn_stash_bytes,
    .scratch_bytes = attn_scratch_bytes,
    .tp_cost = attn_tp_cost,
    .fwd_flops = attn_fwd_flops,
    .bwd_flops = attn_bwd_flops,
    .forward = attn_forward,
    .backward_input = attn_backward_input,
    .destroy = bg__free_impl,
};

bg_status_t bg_layer_attention(const char *name, int c, int heads, bg_layer_t **layer_p)
{
    if (c < 1 || heads < 1 || c % heads != 0)
        return bg_error(BG_ERR_INVALID, "attention %s: heads (%d) must divide d_model (%d)", name, heads, c);
    attn_t p = {c, heads, 0};
    return bg__make_leaf(&attn_ops, name, 0, NULL, &p, sizeof(p), layer_p);
}

/* ----------------------------------------------------------------- head */

typedef bg__head_t head_t;

static bg_status_t head_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const head_t *p = l->impl;
    bg_backend_t *be = ctx->be;
    int N = ROWS(ctx->in);
    float *logits = ctx->scratch, *probs = ctx->stash;
    if (!ctx->targets)
        return bg_error(BG_ERR_INVALID, "layer %s: no targets for the loss", l->name);
    be->ops->gemm(be, 0, 1, N, p->classes, p->c, 1.0f, in, p->c, l->params[0].data, p->c, 0.0f, logits, p->classes);
    if (p->bias)
        be->ops->bias_forward(be, logits, l->params[1].data, N, p->classes);
    be->ops->crossentropy_forward(be, out, probs, logits, ctx->targets, N, p->classes);
    return BG_OK;
}

static bg_status_t head_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                       const float *out, const float *dout, float *din)
{
    const head_t *p = l->impl;
    bg_backend_t *be = ctx->be;
    int N = ROWS(ctx->in);
    float *dlogits = ctx->wstash;
    be->ops->crossentropy_backward(be, dlogits, ctx->stash, ctx->targets, ctx->loss_scale, N, p->classes);
    if (din)
        be->ops->gemm(be, 0, 0, N, p->c, p->classes, 1.0f, dlogits, p->classes, l->params[0].data, p->c, 0.0f, din,
                      p->c);
    return BG_OK;
}

static bg_status_t head_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                        const float *out, const float *dout)
{
    const head_t *p = l->impl;
    bg_backend_t *be = ctx->be;
    int N = ROWS(ctx->in);
    const float *dlogits = ctx->wstash;
    be->ops->gemm(be, 1, 0, p->classes, p->c, N, 1.0f, dlogits, p->classes, in, p->c, 1.0f, l->params[0].grad, p->c);
    if (p->bias)
        be->ops->bias_backward(be, l->params[1].grad, dlogits, N, p->classes);
    return BG_OK;
}

static int head_classes(const bg_layer_t *l) { return ((const head_t *)l->impl)->classes; }

static const bg_layer_ops_t head_ops = {
    .type = "head",
    .loss_classes = head_classes,
    .out_shape = bg__head_out_shape,
    .stash_bytes = bg__head_probs_bytes,
    .wstash_bytes = bg__head_probs_bytes,
    .scratch_bytes = bg__head_probs_bytes,
    .fwd_flops = bg__head_fwd_flops,
    .bwd_flops = bg__head_bwd_flops,
    .forward = head_forward,
    .backward_input = head_backward_input,
    .backward_weight = head_backward_weight,
    .destroy = bg__free_impl,
};

bg_status_t bg_layer_head(const char *name, int c, int classes, int bias, float init_std, bg_layer_t **layer_p)
{
    if (c < 1 || classes < 2)
        return bg_error(BG_ERR_INVALID, "head %s: %d channels, %d classes (need >= 1 and >= 2)", name, c, classes);
    head_t p = {c, classes, bias ? 1 : 0};
    return make_affine(&head_ops, name, c, classes, bias, init_std, &p, sizeof(p), layer_p);
}
