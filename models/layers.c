/* models/layers.c: the built-in leaf layers (linear, activation, layernorm,
 * embedding, attention core, head = linear + cross-entropy) and the blocks
 * built from them. Each leaf computes only through the backend table. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/layer_impl.h"

#define ROWS(s) ((s).n * (s).t)

static bg_status_t shape_err(const bg_layer_t *l, bg_shape_t in, const char *want)
{
    return bg_error(BG_ERR_INVALID, "layer %s (%s): input shape (%d,%d,%d) but %s", l->name, l->ops->type,
                    in.n, in.t, in.c, want);
}

/* A float input of exactly c channels, n >= 1, t >= 1. */
static bg_status_t want_channels(const bg_layer_t *l, bg_shape_t in, int c)
{
    if (in.c == c && in.n >= 1 && in.t >= 1)
        return BG_OK;
    char want[64];
    snprintf(want, sizeof(want), "%d channels are expected", c);
    return shape_err(l, in, want);
}

/* --------------------------------------------------------------- linear */

typedef bg__linear_t linear_t;

bg_status_t bg__linear_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const linear_t *p = l->impl;
    BG_CHECK(want_channels(l, in, p->c_in));
    *out_p = (bg_shape_t){in.n, in.t, p->c_out};
    return BG_OK;
}
double bg__linear_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const linear_t *p = l->impl;
    return 2.0 * ROWS(in) * p->c_in * p->c_out;
}
double bg__linear_bwd_flops(const bg_layer_t *l, bg_shape_t in) { return 2.0 * bg__linear_fwd_flops(l, in); }

/* out = in W^T, without the bias */
static void linear_gemm(const bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const linear_t *p = l->impl;
    ctx->be->ops->gemm(ctx->be, 0, 1, ROWS(ctx->in), p->c_out, p->c_in, 1.0f, in, p->c_in, l->params[0].data, p->c_in,
                       0.0f, out, p->c_out);
}

static bg_status_t linear_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const linear_t *p = l->impl;
    linear_gemm(l, ctx, in, out);
    if (p->bias)
        ctx->be->ops->bias_forward(ctx->be, out, l->params[1].data, ROWS(ctx->in), p->c_out);
    return BG_OK;
}

static bg_status_t linear_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                         const float *out, const float *dout, float *din)
{
    const linear_t *p = l->impl;
    if (din)
        ctx->be->ops->gemm(ctx->be, 0, 0, ROWS(ctx->in), p->c_in, p->c_out, 1.0f, dout, p->c_out,
                           l->params[0].data, p->c_in, 0.0f, din, p->c_in);
    return BG_OK;
}

/* dW += dout^T in, without the bias gradient */
static void linear_wgrad_gemm(const bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *dout)
{
    const linear_t *p = l->impl;
    ctx->be->ops->gemm(ctx->be, 1, 0, p->c_out, p->c_in, ROWS(ctx->in), 1.0f, dout, p->c_out, in, p->c_in, 1.0f,
                       l->params[0].grad, p->c_in);
}

bg_status_t bg__linear_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout)
{
    const linear_t *p = l->impl;
    linear_wgrad_gemm(l, ctx, in, dout);
    if (p->bias)
        ctx->be->ops->bias_backward(ctx->be, l->params[1].grad, dout, ROWS(ctx->in), p->c_out);
    return BG_OK;
}

void bg__free_impl(bg_layer_t *l) { free(l->impl); }

static const bg_layer_ops_t linear_ops = {
    .type = "linear",
    .out_shape = bg__linear_out_shape,
    .fwd_flops = bg__linear_fwd_flops,
    .bwd_flops = bg__linear_bwd_flops,
    .forward = linear_forward,
    .backward_input = linear_backward_input,
    .backward_weight = bg__linear_backward_weight,
    .destroy = bg__free_impl,
};

bg_status_t bg__make_leaf(const bg_layer_ops_t *ops, const char *name, int np, const bg_param_t *params,
                          const void *impl, size_t impl_size, bg_layer_t **layer_p)
{
    void *copy = malloc(impl_size);
    if (!copy)
        return bg_error(BG_ERR_NOMEM, "layer %s", name);
    memcpy(copy, impl, impl_size);
    bg_status_t st = bg_layer_create(ops, name, np, params, copy, layer_p);
    if (st != BG_OK)
        free(copy);
    return st;
}

bg_status_t bg_layer_linear(const char *name, int c_in, int c_out, int bias, float init_std, bg_layer_t **layer_p)
{
    if (c_in < 1 || c_out < 1)
        return bg_error(BG_ERR_INVALID, "linear %s: sizes %d -> %d must be positive", name, c_in, c_out);
    linear_t p = {c_in, c_out, bias ? 1 : 0};
    bg_param_t params[2];
    params[0] = bg_param_make("weight", 2, (int64_t[]){c_out, c_in}, BG_INIT_NORMAL, init_std, 1);
    params[1] = bg_param_make("bias", 1, (int64_t[]){c_out}, BG_INIT_CONST, 0.0f, 0);
    return bg__make_leaf(&linear_ops, name, bias ? 2 : 1, params, &p, sizeof(p), layer_p);
}

/* ----------------------------------------------------------- activation */

typedef struct { bg_activation_t kind; } act_t;

static bg_status_t same_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    if (in.c < 1 || in.n < 1 || in.t < 1)
        return shape_err(l, in, "a float activation is expected");
    *out_p = in;
    return BG_OK;
}
static double act_flops(const bg_layer_t *l, bg_shape_t in) { return 8.0 * (double)bg_shape_numel(in); }

static bg_status_t act_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const act_t *p = l->impl;
    size_t n = bg_shape_numel(ctx->in);
    if (p->kind == BG_ACT_GELU)
        ctx->be->ops->gelu_forward(ctx->be, out, in, n);
    else
        ctx->be->ops->relu_forward(ctx->be, out, in, n);
    return BG_OK;
}

static bg_status_t act_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                      const float *out, const float *dout, float *din)
{
    const act_t *p = l->impl;
    size_t n = bg_shape_numel(ctx->in);
    if (!din)
        return BG_OK;
    if (p->kind == BG_ACT_GELU)
        ctx->be->ops->gelu_backward(ctx->be, din, in, dout, n);
    else
        ctx->be->ops->relu_backward(ctx->be, din, in, dout, n);
    return BG_OK;
}

static const bg_layer_ops_t act_ops = {
    .type = "activation",
    .out_shape = same_shape,
    .fwd_flops = act_flops,
    .bwd_flops = act_flops,
    .forward = act_forward,
    .backward_input = act_backward_input,
    .destroy = bg__free_impl,
};

bg_status_t bg_layer_activation(const char *name, bg_activation_t kind, bg_layer_t **layer_p)
{
    if (kind != BG_ACT_GELU && kind != BG_ACT_RELU)
        return bg_error(BG_ERR_INVALID, "activation %s: unknown kind %d", name, (int)kind);
    act_t p = {kind};
    return bg__make_leaf(&act_ops, name, 0, NULL, &p, sizeof(p), layer_p);
}

/* ------------------------------------------- linear + GELU, fused (layer.c) */

static struct {
    pthread_once_t once;
    int on;
    char bad[96];
} fuse = {.once = PTHREAD_ONCE_INIT};

/* BRIGADE_FUSE, read once per process: the forward and the B and W passes of
 * every microbatch must agree on where the bias gradient is computed. */
static void fuse_read(void)
{
    const char *v = bg_config_str("BRIGADE_FUSE");
    fuse.on = !strcmp(v, "on");
    if (!fuse.on && strcmp(v, "off") != 0)
        snprintf(fuse.bad, sizeof fuse.bad, "%s", v);
}

bg_status_t bg__layer_fuse_setting(int *on_p)
{
    pthread_once(&fuse.once, fuse_read);
    *on_p = fuse.on;
    return fuse.bad[0] ? bg_error(BG_ERR_INVALID, "BRIGADE_FUSE=\"%s\": expected on or off", fuse.bad) : BG_OK;
}

bg_status_t bg__linear_gelu_fused(const bg_layer_t *lin, const bg_layer_t *act, const bg_layer_ctx_t *ctx,
                                  int *fused_p)
{
    *fused_p = 0;
    if (lin->ops != &linear_ops || act->ops != &act_ops)
        return BG_OK;
    int on;
    BG_CHECK(bg__layer_fuse_setting(&on));
    const linear_t *p = lin->impl;
    const act_t *a = act->impl;
    const bg_backend_ops_t *o = ctx->be->ops;
    *fused_p = on && p->bias && a->kind == BG_ACT_GELU && o->bias_gelu_forward && o->gelu_bias_backward &&
               (!ctx->tp || ctx->tp->size <= 1);
    return BG_OK;
}

bg_status_t bg__linear_gelu_forward(bg_layer_t *lin, const bg_layer_ctx_t *ctx, const float *in, float *pre, float *out)
{
    const linear_t *p = lin->impl;
    linear_gemm(lin, ctx, in, pre);
    ctx->be->ops->bias_gelu_forward(ctx->be, pre, out, lin->params[1].data, ROWS(ctx->in), p->c_out);
    return BG_OK;
}

bg_status_t bg__linear_gelu_backward_act(bg_layer_t *lin, const bg_layer_ctx_t *act_ctx, const float *pre,
                                         const float *dout, float *dpre)
{
    const linear_t *p = lin->impl;
    act_ctx->be->ops->gelu_bias_backward(act_ctx->be, dpre, lin->params[1].grad, pre, dout, ROWS(act_ctx->in),
                                         p->c_out);
    return BG_OK;
}

bg_status_t bg__linear_gelu_backward_weight(bg_layer_t *lin, const bg_layer_ctx_t *ctx, const float *in,
                                            const float *dpre)
{
    linear_wgrad_gemm(lin, ctx, in, dpre);
    return BG_OK;
}

/* ------------------------------------------------------------ layernorm */

typedef struct { int c; } ln_t;

static bg_status_t ln_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const ln_t *p = l->impl;
    BG_CHECK(want_channels(l, in, p->c));
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

typedef struct { int vocab, max_t, c; } emb_t;

static bg_status_t emb_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const emb_t *p = l->impl;
    if (in.c != 0 || in.n < 1 || in.t < 1)
        return shape_err(l, in, "token ids (c = 0) are expected");
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
    ctx->be->ops->embedding_forward(ctx->be, out, ctx->tokens, l->params[0].data, l->params[1].data, ctx->in.n,
                                    ctx->in.t, p->c);
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
    ctx->be->ops->embedding_backward(ctx->be, l->params[0].grad, l->params[1].grad, dout, ctx->tokens, ctx->in.n,
                                     ctx->in.t, p->c);
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
    emb_t p = {vocab, max_t, c};
    bg_param_t params[2];
    params[0] = bg_param_make("wte", 2, (int64_t[]){vocab, c}, BG_INIT_NORMAL, init_std, 1);
    params[1] = bg_param_make("wpe", 2, (int64_t[]){max_t, c}, BG_INIT_NORMAL, init_std * 0.5f, 1);
    return bg__make_leaf(&emb_ops, name, 2, params, &p, sizeof(p), layer_p);
}

/* ------------------------------------------------------ attention core */

typedef struct { int c, heads; } attn_t;

static bg_status_t attn_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const attn_t *p = l->impl;
    BG_CHECK(want_channels(l, in, 3 * p->c)); /* packed q, k, v */
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
    return bg_attention_scratch_floats(in.n, in.t, p->c, p->heads) * sizeof(float);
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

static bg_status_t attn_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const attn_t *p = l->impl;
    bg_attention_forward(ctx->be, out, ctx->stash, in, ctx->in.n, ctx->in.t, p->c, p->heads);
    return BG_OK;
}

static bg_status_t attn_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                       const float *out, const float *dout, float *din)
{
    const attn_t *p = l->impl;
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
    attn_t p = {c, heads};
    return bg__make_leaf(&attn_ops, name, 0, NULL, &p, sizeof(p), layer_p);
}

/* ----------------------------------------------------------------- head */

typedef bg__head_t head_t;

bg_status_t bg__head_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const head_t *p = l->impl;
    BG_CHECK(want_channels(l, in, p->c));
    *out_p = (bg_shape_t){in.n, in.t, 1};
    return BG_OK;
}
size_t bg__head_probs_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return bg__align64((size_t)ROWS(in) * (size_t)((head_t *)l->impl)->classes * sizeof(float));
}
/* stash: probs (N, V); wstash: dlogits (N, V); scratch: logits (N, V) */
double bg__head_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const head_t *p = l->impl;
    return 2.0 * ROWS(in) * (double)p->c * p->classes + 5.0 * ROWS(in) * (double)p->classes;
}
double bg__head_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const head_t *p = l->impl;
    return 4.0 * ROWS(in) * (double)p->c * p->classes + 2.0 * ROWS(in) * (double)p->classes;
}

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
    bg_param_t params[2];
    params[0] = bg_param_make("weight", 2, (int64_t[]){classes, c}, BG_INIT_NORMAL, init_std, 1);
    params[1] = bg_param_make("bias", 1, (int64_t[]){classes}, BG_INIT_CONST, 0.0f, 0);
    return bg__make_leaf(&head_ops, name, bias ? 2 : 1, params, &p, sizeof(p), layer_p);
}

/* --------------------------------------------------------------- blocks */

/* The blocks are the tensor-parallel blocks of degree 1 (models/tp_layers.c):
 * one construction, plain linear layers where tp = 1. */
bg_status_t bg_layer_attention_block(const char *name, int c, int heads, float init_std, float proj_std,
                                     bg_layer_t **layer_p)
{
    return bg_layer_tp_attention_block(name, c, heads, init_std, proj_std, 1, layer_p);
}

bg_status_t bg_layer_mlp_block(const char *name, int c, float init_std, float proj_std, bg_layer_t **layer_p)
{
    return bg_layer_tp_mlp_block(name, c, init_std, proj_std, 1, layer_p);
}

bg_status_t bg_layer_transformer_block(const char *name, int c, int heads, float init_std, float proj_std,
                                       bg_layer_t **layer_p)
{
    return bg_layer_tp_transformer_block(name, c, heads, init_std, proj_std, 1, layer_p);
}
