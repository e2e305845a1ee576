/* models/llama_layers.c: the Llama-style leaves (RMSNorm, SwiGLU, causal
 * grouped-query attention with rotary positions) and the blocks built of
 * them, tensor-parallel when tp > 1 (bg_layer_llama_block), and the
 * attention's decode cache (generation one position at a time). Each leaf
 * computes only through the backend table (its Llama slots; a backend that
 * leaves one NULL is refused by name). Must not know any model builder: the
 * Llama builder (models/builders.c) assembles these. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/cp_attention.h"
#include "models/layer_impl.h"

#define ROWS(s) ((s).n * (s).t)
#define RMS_EPS 1e-5f

/* BG_ERR_UNSUPPORTED when the backend lacks a slot layer l needs. */
#define NEED_SLOT(l, be, slot)                                                                                     \
    do {                                                                                                           \
        if (!(be)->ops->slot)                                                                                      \
            return bg_error(BG_ERR_UNSUPPORTED, "layer %s (%s): backend %s has no %s kernel", (l)->name,          \
                            (l)->ops->type, (be)->ops->name, #slot);                                               \
    } while (0)

/* ---------------------------------------------------------------- RMSNorm */

typedef struct { int c; } rms_t;

static bg_status_t rms_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    BG_CHECK(bg__want_channels(l, in, ((const rms_t *)l->impl)->c));
    *out_p = in;
    return BG_OK;
}
/* stash: one reciprocal RMS per row */
static size_t rms_stash(const bg_layer_t *l, bg_shape_t in) { return bg__align64((size_t)ROWS(in) * sizeof(float)); }
static double rms_fwd_flops(const bg_layer_t *l, bg_shape_t in) { return 4.0 * (double)bg_shape_numel(in); }
static double rms_bwd_flops(const bg_layer_t *l, bg_shape_t in) { return 9.0 * (double)bg_shape_numel(in); }

static bg_status_t rms_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    NEED_SLOT(l, ctx->be, rmsnorm_forward);
    ctx->be->ops->rmsnorm_forward(ctx->be, out, ctx->stash, in, l->params[0].data, RMS_EPS, ROWS(ctx->in),
                                  ctx->in.c);
    return BG_OK;
}

static bg_status_t rms_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout, float *din)
{
    NEED_SLOT(l, ctx->be, rmsnorm_backward_input);
    if (din)
        ctx->be->ops->rmsnorm_backward_input(ctx->be, din, dout, in, l->params[0].data, ctx->stash, ROWS(ctx->in),
                                             ctx->in.c);
    return BG_OK;
}

static bg_status_t rms_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                       const float *dout)
{
    NEED_SLOT(l, ctx->be, rmsnorm_backward_weight);
    ctx->be->ops->rmsnorm_backward_weight(ctx->be, l->params[0].grad, dout, in, ctx->stash, ROWS(ctx->in),
                                          ctx->in.c);
    return BG_OK;
}

static const bg_layer_ops_t rms_ops = {
    .type = "rmsnorm",
    .out_shape = rms_out_shape,
    .stash_bytes = rms_stash,
    .fwd_flops = rms_fwd_flops,
    .bwd_flops = rms_bwd_flops,
    .forward = rms_forward,
    .backward_input = rms_backward_input,
    .backward_weight = rms_backward_weight,
    .destroy = bg__free_impl,
};

bg_status_t bg_layer_rmsnorm(const char *name, int c, bg_layer_t **layer_p)
{
    if (c < 1)
        return bg_error(BG_ERR_INVALID, "rmsnorm %s: %d channels", name, c);
    rms_t p = {c};
    bg_param_t w = bg_param_make("weight", 1, (int64_t[]){c}, BG_INIT_CONST, 1.0f, 0);
    return bg__make_leaf(&rms_ops, name, 1, &w, &p, sizeof(p), layer_p);
}

/* ----------------------------------------------------------------- SwiGLU */

typedef struct { int h; } swiglu_t;

static bg_status_t swiglu_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    int h = ((const swiglu_t *)l->impl)->h;
    BG_CHECK(bg__want_channels(l, in, 2 * h));
    *out_p = (bg_shape_t){in.n, in.t, h};
    return BG_OK;
}
static double swiglu_fwd_flops(const bg_layer_t *l, bg_shape_t in) { return 3.0 * (double)bg_shape_numel(in); }
static double swiglu_bwd_flops(const bg_layer_t *l, bg_shape_t in) { return 5.0 * (double)bg_shape_numel(in); }

static bg_status_t swiglu_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    NEED_SLOT(l, ctx->be, swiglu_forward);
    ctx->be->ops->swiglu_forward(ctx->be, out, in, ROWS(ctx->in), ((const swiglu_t *)l->impl)->h);
    return BG_OK;
}

static bg_status_t swiglu_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                         const float *dout, float *din)
{
    NEED_SLOT(l, ctx->be, swiglu_backward);
    if (din)
        ctx->be->ops->swiglu_backward(ctx->be, din, in, dout, ROWS(ctx->in), ((const swiglu_t *)l->impl)->h);
    return BG_OK;
}

static const bg_layer_ops_t swiglu_ops = {
    .type = "swiglu",
    .out_shape = swiglu_out_shape,
    .fwd_flops = swiglu_fwd_flops,
    .bwd_flops = swiglu_bwd_flops,
    .forward = swiglu_forward,
    .backward_input = swiglu_backward_input,
    .destroy = bg__free_impl,
};

bg_status_t bg_layer_swiglu(const char *name, int h, bg_layer_t **layer_p)
{
    if (h < 1)
        return bg_error(BG_ERR_INVALID, "swiglu %s: %d channels", name, h);
    swiglu_t p = {h};
    return bg__make_leaf(&swiglu_ops, name, 0, NULL, &p, sizeof(p), layer_p);
}

/* ------------------------------------------- rotary grouped-query attention */

/* heads query heads in kv groups of g = heads / kv, hs channels each; the
 * input row is kv groups of [g query heads | key | value] (bg_layer_gqa_attention).
 * stash: [qkv (n, t, 3C) rotated and expanded, the attention's input][lse];
 * scratch: forward [rotated grouped input]; backward [dqkv (n, t, 3C)][the
 * attention's scratch]. */
typedef struct { int heads, kv, hs; float theta; bg__kv_cache_t *cache; int ring; } gqa_t; /* ring: the context group's size once bound (bg__gqa_set_ring), else 0 */

/* The decode cache (bg__gqa_cache_attach): every position's rotated keys and values so far, per kv head,
 * and the buffers of one position's attention. */
struct bg__kv_cache {
    int cap, len;
    float *k, *v;  /* (kv, cap, hs) each */
    float *rot;    /* (kv (g + 2) hs): one position's rotated input */
    float *score;  /* (g, cap) */
    float *prob;   /* (g, cap) */
};

static int gqa_g(const gqa_t *p) { return p->heads / p->kv; }
static int gqa_cin(const gqa_t *p) { return p->kv * (gqa_g(p) + 2) * p->hs; }
static int gqa_c(const gqa_t *p) { return p->heads * p->hs; }
static size_t gqa_qkv_bytes(const gqa_t *p, bg_shape_t in)
{
    return bg__align64((size_t)ROWS(in) * 3 * (size_t)gqa_c(p) * sizeof(float));
}

static bg_status_t gqa_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const gqa_t *p = l->impl;
    BG_CHECK(bg__want_channels(l, in, gqa_cin(p)));
    *out_p = (bg_shape_t){in.n, in.t, gqa_c(p)};
    return BG_OK;
}
static size_t gqa_stash(const bg_layer_t *l, bg_shape_t in)
{
    const gqa_t *p = l->impl;
    return gqa_qkv_bytes(p, in) + bg__align64(bg_attention_ws_floats(in.n, in.t, gqa_c(p), p->heads) * sizeof(float));
}
static size_t gqa_scratch(const bg_layer_t *l, bg_shape_t in)
{
    const gqa_t *p = l->impl;
    size_t fwd = bg__align64((size_t)ROWS(in) * (size_t)gqa_cin(p) * sizeof(float));
    size_t bwd = gqa_qkv_bytes(p, in) + bg_attention_scratch_floats(in.n, in.t, gqa_c(p), p->heads) * sizeof(float);
    size_t own = fwd > bwd ? fwd : bwd;
    return p->ring ? bg__align64(own) + bg__cp_ring_bytes(in.n, in.t, gqa_c(p)) : own;
}

void bg__gqa_set_ring(bg_layer_t *l, int size) { ((gqa_t *)l->impl)->ring = size; }

static void gqa_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const gqa_t *p = l->impl;
    bg__cp_ring_cost(p->ring, in.n, in.t, gqa_c(p), cost);
}

/* Under context parallelism: the ring's blocks after the layer's own scratch (gqa_scratch) */
static void *gqa_ring(const bg_layer_t *l, const bg_layer_ctx_t *ctx)
{
    const gqa_t *p = l->impl;
    return (char *)ctx->scratch + bg__align64(gqa_scratch(l, ctx->in) - bg__cp_ring_bytes(ctx->in.n, ctx->in.t,
                                                                                          gqa_c(p)));
}
/* the fused attention's counts (models/layers.c's attention) plus RoPE's 6 flops per rotated pair */
static double gqa_pairs(const gqa_t *p, bg_shape_t in) { return (double)in.n * p->heads * in.t * (in.t + 1.0) / 2.0; }
static double gqa_rope_flops(const gqa_t *p, bg_shape_t in)
{
    return 3.0 * (double)ROWS(in) * (p->heads + p->kv) * p->hs;
}
static double gqa_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const gqa_t *p = l->impl;
    return gqa_pairs(p, in) * (4.0 * p->hs + 5.0) + gqa_rope_flops(p, in);
}
static double gqa_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const gqa_t *p = l->impl;
    return gqa_pairs(p, in) * (10.0 * p->hs + 8.0) + gqa_rope_flops(p, in) + (double)ROWS(in) * 2 * gqa_c(p);
}

static bg_status_t gqa_need(const bg_layer_t *l, bg_backend_t *be)
{
    NEED_SLOT(l, be, rope);
    NEED_SLOT(l, be, gqa_expand);
    NEED_SLOT(l, be, gqa_reduce);
    return BG_OK;
}

static float *gqa_lse(const gqa_t *p, const bg_layer_ctx_t *ctx)
{
    return (float *)((char *)ctx->stash + gqa_qkv_bytes(p, ctx->in));
}

/* Decode: the positions of in (1, t, Cin) one after another at positions len, len + 1, ...: each rotated,
 * its key and value appended to the cache, its queries attending to every cached position (itself
 * included), through GEMMs and the softmax (scores (g, len) per kv group). */
static bg_status_t gqa_decode(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const gqa_t *p = l->impl;
    bg__kv_cache_t *c = p->cache;
    bg_backend_t *be = ctx->be;
    int g = gqa_g(p), hs = p->hs, Cin = gqa_cin(p), C = gqa_c(p);
    if (ctx->in.n != 1 || c->len + ctx->in.t > c->cap)
        return bg_error(BG_ERR_INVALID, "layer %s: decoding %d sequence(s) of %d positions after %d cached, but the "
                                        "cache holds one sequence of %d", l->name, ctx->in.n, ctx->in.t, c->len, c->cap);
    for (int t = 0; t < ctx->in.t; t++) {
        be->ops->rope(be, c->rot, in + (size_t)t * Cin, 1, 1, p->kv, g + 1, hs, p->theta, c->len, 0);
        for (int j = 0; j < p->kv; j++) {
            const float *grp = c->rot + (size_t)j * (g + 2) * hs;
            size_t at = ((size_t)j * c->cap + c->len) * hs;
            be->ops->copy(be, c->k + at, grp + (size_t)g * hs, (size_t)hs);
            be->ops->copy(be, c->v + at, grp + (size_t)(g + 1) * hs, (size_t)hs);
        }
        int L = ++c->len;
        for (int j = 0; j < p->kv; j++) {
            const float *q = c->rot + (size_t)j * (g + 2) * hs;
            const float *k = c->k + (size_t)j * c->cap * hs, *v = c->v + (size_t)j * c->cap * hs;
            be->ops->gemm(be, 0, 1, g, L, hs, 1.0f / sqrtf((float)hs), q, hs, k, hs, 0.0f, c->score, L);
            be->ops->softmax_forward(be, c->prob, c->score, g, L);
            be->ops->gemm(be, 0, 0, g, hs, L, 1.0f, c->prob, L, v, hs, 0.0f, out + (size_t)t * C + (size_t)j * g * hs,
                          hs);
        }
    }
    return BG_OK;
}

/* The backend's fused grouped-query attention (no expanded copy of the keys and values): the stash then holds
 * the rotated grouped input, not the expanded qkv. Context parallelism's ring takes the expanded layout. */
static int gqa_fused(const bg_layer_ctx_t *ctx)
{
    return !ctx->cp && ctx->be->ops->gqa_attention_forward && ctx->be->ops->gqa_attention_backward;
}

static bg_status_t gqa_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const gqa_t *p = l->impl;
    bg_backend_t *be = ctx->be;
    int B = ctx->in.n, T = ctx->in.t, g = gqa_g(p);
    BG_CHECK(gqa_need(l, be));
    if (p->cache)
        return gqa_decode(l, ctx, in, out);
    if (gqa_fused(ctx)) { /* grouped (B,T,Cin) <= the stash's qkv (B,T,3C) */
        be->ops->rope(be, ctx->stash, in, B, T, p->kv, g + 1, p->hs, p->theta, 0, 0);
        be->ops->gqa_attention_forward(be, out, gqa_lse(p, ctx), ctx->stash, B, T, p->kv, g, p->hs);
        return BG_OK;
    }
    float *rot = ctx->scratch, *qkv = ctx->stash;
    if (ctx->cp)
        bg__cp_rope(ctx, rot, in, gqa_cin(p), p->kv, g + 1, p->hs, p->theta, 0);
    else
        be->ops->rope(be, rot, in, B, T, p->kv, g + 1, p->hs, p->theta, 0, 0);
    be->ops->gqa_expand(be, qkv, rot, B, T, p->kv, g, p->hs);
    if (ctx->cp)
        return bg__cp_attention_forward(l, ctx, out, gqa_lse(p, ctx), qkv, gqa_ring(l, ctx), gqa_c(p), p->heads);
    bg_attention_forward(be, out, gqa_lse(p, ctx), qkv, B, T, gqa_c(p), p->heads);
    return BG_OK;
}

/* din = rope^T(reduce(d attention)): the reduce lands in din, rotated back in place */
static bg_status_t gqa_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout, float *din)
{
    const gqa_t *p = l->impl;
    bg_backend_t *be = ctx->be;
    int B = ctx->in.n, T = ctx->in.t, g = gqa_g(p);
    if (!din)
        return BG_OK;
    BG_CHECK(gqa_need(l, be));
    float *dqkv = ctx->scratch, *ascratch = (float *)((char *)ctx->scratch + gqa_qkv_bytes(p, ctx->in));
    if (gqa_fused(ctx)) {
        be->ops->gqa_attention_backward(be, din, ascratch, dout, ctx->stash, out, gqa_lse(p, ctx), B, T, p->kv, g,
                                        p->hs);
        be->ops->rope(be, din, din, B, T, p->kv, g + 1, p->hs, p->theta, 0, 1);
        return BG_OK;
    }
    if (ctx->cp) {
        BG_CHECK(bg__cp_attention_backward(l, ctx, dqkv, ascratch, dout, ctx->stash, out, gqa_lse(p, ctx),
                                           gqa_ring(l, ctx), gqa_c(p), p->heads));
        be->ops->gqa_reduce(be, din, dqkv, B, T, p->kv, g, p->hs);
        return bg__cp_rope(ctx, din, din, gqa_cin(p), p->kv, g + 1, p->hs, p->theta, 1);
    }
    bg_attention_backward(be, dqkv, ascratch, dout, ctx->stash, out, gqa_lse(p, ctx), B, T, gqa_c(p), p->heads);
    be->ops->gqa_reduce(be, din, dqkv, B, T, p->kv, g, p->hs);
    be->ops->rope(be, din, din, B, T, p->kv, g + 1, p->hs, p->theta, 0, 1);
    return BG_OK;
}

static void gqa_destroy(bg_layer_t *l);

static const bg_layer_ops_t gqa_ops = {
    .type = "gqa_attention",
    .out_shape = gqa_out_shape,
    .stash_bytes = gqa_stash,
    .scratch_bytes = gqa_scratch,
    .fwd_flops = gqa_fwd_flops,
    .bwd_flops = gqa_bwd_flops,
    .tp_cost = gqa_tp_cost,
    .forward = gqa_forward,
    .backward_input = gqa_backward_input,
    .destroy = gqa_destroy,
};

int bg__layer_is_gqa(const bg_layer_t *l) { return l && l->ops == &gqa_ops; }

void bg__gqa_cache_detach(bg_layer_t *l, bg_backend_t *be)
{
    gqa_t *p = bg__layer_is_gqa(l) ? l->impl : NULL;
    if (!p || !p->cache)
        return;
    bg__kv_cache_t *c = p->cache;
    bg_backend_free(be, c->k);
    bg_backend_free(be, c->v);
    bg_backend_free(be, c->rot);
    bg_backend_free(be, c->score);
    bg_backend_free(be, c->prob);
    free(c);
    p->cache = NULL;
}

bg_status_t bg__gqa_cache_attach(bg_layer_t *l, bg_backend_t *be, int cap)
{
    if (!bg__layer_is_gqa(l) || cap < 1)
        return bg_error(BG_ERR_INVALID, "decode cache: layer %s is not a gqa_attention, or capacity %d < 1",
                        l ? l->name : "(null)", cap);
    gqa_t *p = l->impl;
    if (p->cache)
        return bg_error(BG_ERR_INVALID, "layer %s: a decode cache is already attached", l->name);
    BG_CHECK(gqa_need(l, be));
    bg__kv_cache_t *c = calloc(1, sizeof(*c));
    BG_ALLOC_CHECK(c, sizeof(*c), "decode cache");
    size_t kvb = (size_t)p->kv * cap * p->hs * sizeof(float), sb = (size_t)gqa_g(p) * cap * sizeof(float);
    c->cap = cap;
    c->k = bg_backend_alloc(be, kvb, "decode cache keys");
    c->v = bg_backend_alloc(be, kvb, "decode cache values");
    c->rot = bg_backend_alloc(be, (size_t)gqa_cin(p) * sizeof(float), "decode cache row");
    c->score = bg_backend_alloc(be, sb, "decode cache scores");
    c->prob = bg_backend_alloc(be, sb, "decode cache probabilities");
    p->cache = c;
    if (!c->k || !c->v || !c->rot || !c->score || !c->prob) {
        bg__gqa_cache_detach(l, be);
        return bg_error(BG_ERR_NOMEM, "layer %s: decode cache of %d positions", l->name, cap);
    }
    return BG_OK;
}

/* a cache left attached is the caller's bug: its buffers belong to a backend this layer cannot know */
static void gqa_destroy(bg_layer_t *l)
{
    const gqa_t *p = l->impl;
    if (p && p->cache)
        bg_log(BG_LOG_WARN, "models", "layer %s destroyed with its decode cache attached", l->name);
    bg__free_impl(l);
}

bg_status_t bg_layer_gqa_attention(const char *name, int heads, int kv_heads, int head_dim, float rope_theta,
                                   bg_layer_t **layer_p)
{
    if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0)
        return bg_error(BG_ERR_INVALID, "gqa_attention %s: kv_heads (%d) must divide heads (%d)", name, kv_heads,
                        heads);
    if (head_dim < 2 || head_dim % 2 != 0 || head_dim > 1024)
        return bg_error(BG_ERR_INVALID, "gqa_attention %s: the head size %d must be even and in [2, 1024] (rotary "
                                        "pairs)", name, head_dim);
    if (!(rope_theta > 1.0f) || !isfinite(rope_theta))
        return bg_error(BG_ERR_INVALID, "gqa_attention %s: rope theta %g must be > 1", name, (double)rope_theta);
    gqa_t p = {heads, kv_heads, head_dim, rope_theta, NULL, 0};
    return bg__make_leaf(&gqa_ops, name, 0, NULL, &p, sizeof(p), layer_p);
}

/* ----------------------------------------------------------------- blocks */

/* The blocks: tp = 1 plain linears, tp > 1 the same names over column- and row-parallel ones (full tensors
 * split, so a save of either loads into the other). No biases. */
static bg_status_t col(const char *name, int c_in, int c_out, int blocks, float std, int tp, bg_layer_t **l)
{
    return tp > 1 ? bg_layer_column_linear(name, c_in, c_out, blocks, 0, std, tp, l)
                  : bg_layer_linear(name, c_in, c_out, 0, std, l);
}
static bg_status_t row(const char *name, int c_in, int c_out, float std, int tp, bg_layer_t **l)
{
    return tp > 1 ? bg_layer_row_linear(name, c_in, c_out, 0, std, tp, l) : bg_layer_linear(name, c_in, c_out, 0, std, l);
}

/* x + f(x) of a pre-norm sequence of n children (owned, also on failure) */
static bg_status_t residual_of(const char *name, int n, bg_layer_t **ch, bg_status_t st, bg_layer_t **layer_p)
{
    bg_layer_t *inner = NULL;
    if (st != BG_OK) {
        for (int i = 0; i < n; i++)
            bg_layer_destroy(ch[i]);
        return st;
    }
    BG_CHECK(bg_layer_seq("", n, ch, &inner));
    return bg_layer_residual(name, inner, layer_p);
}

static bg_status_t llama_attn(const bg_llama_block_t *b, int tp, bg_layer_t **layer_p)
{
    int hs = b->c / b->heads, g = b->heads / b->kv_heads;
    bg_layer_t *ch[4] = {0};
    bg_status_t st = bg_layer_rmsnorm("norm", b->c, &ch[0]);
    if (st == BG_OK) /* kv groups of [g queries | key | value]: a contiguous split gives whole groups */
        st = col("qkv", b->c, b->kv_heads * (g + 2) * hs, 1, b->init_std, tp, &ch[1]);
    if (st == BG_OK)
        st = bg_layer_gqa_attention("attn", b->heads / tp, b->kv_heads / tp, hs, b->rope_theta, &ch[2]);
    if (st == BG_OK)
        st = row("proj", b->c, b->c, b->proj_std, tp, &ch[3]);
    return residual_of("attn", 4, ch, st, layer_p);
}

static bg_status_t llama_mlp(const bg_llama_block_t *b, int tp, bg_layer_t **layer_p)
{
    bg_layer_t *ch[4] = {0};
    bg_status_t st = bg_layer_rmsnorm("norm", b->c, &ch[0]);
    if (b->moe) {
        if (st == BG_OK) /* whole on every tensor-parallel member, replicated as the norm is */
            st = bg_layer_moe("moe", b->moe, &ch[1]);
        return residual_of("mlp", 2, ch, st, layer_p);
    }
    if (st == BG_OK) /* [gate | up]: two blocks, so each member holds the pairs of its slice */
        st = col("up", b->c, 2 * b->ffn, 2, b->init_std, tp, &ch[1]);
    if (st == BG_OK)
        st = bg_layer_swiglu("swiglu", b->ffn / tp, &ch[2]);
    if (st == BG_OK)
        st = row("down", b->ffn, b->c, b->proj_std, tp, &ch[3]);
    return residual_of("mlp", 4, ch, st, layer_p);
}

bg_status_t bg_layer_llama_block(const char *name, const bg_llama_block_t *b, int tp, bg_layer_t **layer_p)
{
    if (b->c < 1 || b->heads < 1 || b->c % b->heads != 0)
        return bg_error(BG_ERR_INVALID, "llama block %s: heads (%d) must divide d_model (%d)", name, b->heads, b->c);
    if (b->kv_heads < 1 || b->heads % b->kv_heads != 0)
        return bg_error(BG_ERR_INVALID, "llama block %s: kv_heads (%d) must divide heads (%d)", name, b->kv_heads,
                        b->heads);
    if (b->ffn < 1 && !b->moe)
        return bg_error(BG_ERR_INVALID, "llama block %s: ffn hidden size %d", name, b->ffn);
    if (tp < 1 || b->kv_heads % tp != 0 || (!b->moe && b->ffn % tp != 0))
        return bg_error(BG_ERR_INVALID, "llama block %s: tp %d must divide kv_heads (%d) and the ffn hidden size "
                                        "(%d): each member holds whole key/value groups", name, tp, b->kv_heads,
                        b->ffn);
    bg_layer_t *ch[2] = {0};
    bg_status_t st = llama_attn(b, tp, &ch[0]);
    if (st == BG_OK)
        st = llama_mlp(b, tp, &ch[1]);
    if (st != BG_OK) {
        bg_layer_destroy(ch[0]);
        bg_layer_destroy(ch[1]);
        return st;
    }
    return bg_layer_seq(name, 2, ch, layer_p);
}
