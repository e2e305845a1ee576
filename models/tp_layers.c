/* models/tp_layers.c: the tensor-parallel (Megatron-style) layers: column-
 * and row-parallel linear, the vocabulary-parallel embedding and head (a
 * cross-entropy that never gathers the logits), the tensor-parallel blocks,
 * and the shard layout of their parameters (docs/layers.md).
 *
 * Each rank holds one shard of every split tensor; the full named tensor is
 * what is initialised (models/model.c slices it), saved and loaded. The
 * group's collectives come through ctx->tp (filled by runtime/tp.c): this
 * file never sends a byte itself. Replicated tensors (layernorms, the row-
 * parallel bias, wpe) get the same gradient bits on every member because
 * every collective's result is bitwise equal on all members.
 *
 * Each layer is written once; its tensor-parallel mode is data (its impl's
 * mode, models/tp_mode.h): the collectives of the region it enters or
 * leaves, identity / all-reduce (tensor parallelism) or all-gather /
 * reduce-scatter along the sequence (sequence parallelism), each overlapped
 * with the GEMM beside it. bg_layer_sequence_parallel switches the mode; the
 * replicated tensors of the other layers then get partial gradients
 * (tp_partial), which models/model.c sums (bg_model_tp_sum_grads). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/cp_attention.h"
#include "models/tp_mode.h"

#define ROWS(s) ((s).n * (s).t)

/* ----------------------------------------------------------- shard layout */

/* Elements before and after the split dimension, and its full size. */
static void shard_geometry(const bg_param_t *p, size_t *outer, size_t *inner, int64_t *full_d)
{
    *outer = *inner = 1;
    for (int d = 0; d < p->split_dim; d++)
        *outer *= (size_t)p->shape[d];
    for (int d = p->split_dim + 1; d < p->ndim; d++)
        *inner *= (size_t)p->shape[d];
    *full_d = p->shape[p->split_dim] * (bg_param_is_shard(p) ? p->split_parts : 1);
}

size_t bg_param_full_shape(const bg_param_t *p, int64_t *shape)
{
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++) {
        shape[d] = p->shape[d] * (bg_param_is_shard(p) && d == p->split_dim ? p->split_parts : 1);
        n *= (size_t)shape[d];
    }
    return n;
}

/* The copies between the full tensor and member `part`'s shard: along the
 * split dimension the full tensor is `blocks` blocks, each cut into `parts`
 * pieces; the shard is piece `part` of every block, in block order. */
static void shard_copy(const bg_param_t *p, int part, float *full, float *shard, int to_shard)
{
    size_t outer, inner;
    int64_t F;
    shard_geometry(p, &outer, &inner, &F);
    int k = p->split_blocks > 1 ? p->split_blocks : 1;
    size_t local = (size_t)p->shape[p->split_dim], piece = local / (size_t)k, block = (size_t)F / (size_t)k;
    for (size_t o = 0; o < outer; o++)
        for (int j = 0; j < k; j++) {
            float *f = full + (o * (size_t)F + (size_t)j * block + (size_t)part * piece) * inner;
            float *s = shard + (o * local + (size_t)j * piece) * inner;
            if (to_shard)
                memcpy(s, f, piece * inner * sizeof(float));
            else
                memcpy(f, s, piece * inner * sizeof(float));
        }
}

void bg_param_shard_from_full(const bg_param_t *p, int part, const float *full, float *shard)
{
    if (!bg_param_is_shard(p)) {
        memcpy(shard, full, p->numel * sizeof(float));
        return;
    }
    shard_copy(p, part, (float *)full, shard, 1);
}

void bg_param_full_from_shards(const bg_param_t *p, const float *shards, float *full)
{
    if (!bg_param_is_shard(p)) {
        memcpy(full, shards, p->numel * sizeof(float));
        return;
    }
    for (int r = 0; r < p->split_parts; r++)
        shard_copy(p, r, full, (float *)shards + (size_t)r * p->numel, 0);
}

/* The group's collectives work on the buffers of the backend they are bound to (device memory on a
 * device backend): a shard on a device backend be is gathered there, into a buffer of be, and only the
 * gathered shards come to the host; a shard the host can address (be NULL, or a backend without device
 * buffers: copied to host memory first, which waits for its queued writers) is gathered on host buffers,
 * so a run on the CPU holds no more than its own memory while it saves. */
bg_status_t bg_param_gather_full(const bg_tp_comm_t *tp, bg_backend_t *be, const bg_param_t *p, const float *src,
                                 float *full)
{
    if (!bg_param_is_shard(p)) {
        if (be)
            be->ops->to_host(be, full, src, p->numel * sizeof(float));
        else
            memcpy(full, src, p->numel * sizeof(float));
        return BG_OK;
    }
    if (!tp || tp->size != p->split_parts)
        return bg_error(BG_ERR_INVALID, "tensor %s: a shard of %d without its tensor-parallel group", p->name,
                        p->split_parts);
    size_t n = p->numel, bytes = n * (size_t)tp->size * sizeof(float);
    int on_dev = be && be->ops->device_buffers, copy = be && !on_dev; /* copy: to_host waits for its writers */
    float *all = malloc(bytes), *dev = on_dev ? bg_backend_alloc(be, bytes, "tensor-parallel gather") : NULL;
    float *mine = copy ? malloc(n * sizeof(float)) : NULL;
    bg_status_t st = BG_OK;
    if (!all || (on_dev && !dev) || (copy && !mine)) {
        st = bg_error(BG_ERR_NOMEM, "gathering tensor %s (%zu bytes%s)", p->name, bytes, on_dev ? " on the backend" : "");
    } else {
        if (copy)
            be->ops->to_host(be, mine, src, n * sizeof(float));
        st = tp->allgather(tp->arg, copy ? mine : src, on_dev ? dev : all, n);
        if (st == BG_OK && dev)
            be->ops->to_host(be, all, dev, bytes);
        if (st == BG_OK && dev)
            st = bg_backend_status(be); /* a device fault: nothing gathered to write */
        if (st == BG_OK)
            bg_param_full_from_shards(p, all, full);
    }
    if (dev)
        bg_backend_free(be, dev);
    free(mine);
    free(all);
    return st;
}

static bg_param_t shard_param(const char *name, int ndim, const int64_t *shape, bg_init_kind_t init, float value,
                              int decay, int dim, int parts, int blocks)
{
    bg_param_t p = bg_param_make(name, ndim, shape, init, value, decay);
    if (parts > 1) {
        p.split_dim = dim;
        p.split_parts = parts;
        p.split_blocks = blocks > 1 ? blocks : 1;
    }
    return p;
}

/* ---------------------------------------------------------------- helpers */

static bg_status_t divides(const char *what, const char *name, const char *size_name, int size, int tp)
{
    if (tp < 1)
        return bg_error(BG_ERR_INVALID, "%s %s: tensor-parallel degree %d must be >= 1", what, name, tp);
    if (size < 1 || size % tp != 0)
        return bg_error(BG_ERR_INVALID, "%s %s: %s %d is not divisible by the tensor-parallel degree %d", what, name,
                        size_name, size, tp);
    return BG_OK;
}

/* The group of ctx, checked against the layer's degree. */
static bg_status_t group(const bg_layer_t *l, const bg_layer_ctx_t *ctx, int tp, const bg_tp_comm_t **g_p)
{
    const bg_tp_comm_t *g = ctx->tp;
    int have = g ? g->size : 1;
    if (have != tp)
        return bg_error(BG_ERR_INVALID, "layer %s (%s) is split over %d ranks but runs in a tensor-parallel group of %d",
                        l->name, l->ops->type, tp, have);
    *g_p = g;
    return BG_OK;
}

/* Host copy of n int32 from the backend (tokens, targets). */
static int32_t *host_ids(bg_backend_t *be, const int32_t *src, size_t n)
{
    int32_t *h = malloc(n ? n * sizeof(int32_t) : 1);
    if (h)
        be->ops->to_host(be, h, src, n * sizeof(int32_t));
    return h;
}

/* ------------------------------------------------------ parallel linear */

/* lin: the local sizes of the matrix (c_out x c_in); the column-parallel
 * linear enters a region, the row-parallel one leaves it */
typedef struct { bg__linear_t lin; int tp; const bg__tp_mode_t *mode; } plin_t;

/* column-parallel: in (n, tl, c_in) gathered to (n, t, c_in); out (n, t, c_out/T) */
static bg_status_t col_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const plin_t *p = l->impl;
    BG_CHECK(bg__linear_out_shape(l, in, out_p));
    out_p->t = bg__tp_full(p->mode, p->tp, in).t;
    return BG_OK;
}
/* [full input][member-order copy of the input, or (forward) of the output]
 * [the input gradient's member-order copy, reduce-scattered while the
 * weight gradient computes (bg_layer_ctx_t.deferred)] */
static size_t col_scratch(const bg_layer_t *l, bg_shape_t in)
{
    const plin_t *p = l->impl;
    if (!p->mode->seq)
        return 0;
    size_t a = bg__tp_bytes(in.n, in.t * p->tp, p->lin.c_in), o = bg__tp_bytes(in.n, in.t * p->tp, p->lin.c_out);
    return a + (o > a ? o : a) + a;
}
static double col_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const plin_t *p = l->impl;
    return bg__linear_fwd_flops(l, bg__tp_full(p->mode, p->tp, in));
}
static double col_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const plin_t *p = l->impl;
    return bg__linear_bwd_flops(l, bg__tp_full(p->mode, p->tp, in));
}

static bg_status_t col_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    bg_backend_t *be = ctx->be;
    bg_shape_t f = bg__tp_full(p->mode, p->tp, ctx->in);
    float *full, *tmp;
    bg__tp_bufs(p->mode, ctx->scratch, bg__tp_bytes(f.n, f.t, f.c), &full, &tmp);
    BG_CHECK(p->mode->gather_gemm(g, be, 1, ctx->in.n, ctx->in.t, p->lin.c_in, p->lin.c_out, in, l->params[0].data,
                                  full, tmp, out));
    if (p->lin.bias)
        be->ops->bias_forward(be, out, l->params[1].data, ROWS(f), p->lin.c_out);
    return BG_OK;
}

/* din: every member's output features contribute, summed (this member's positions of it) */
static bg_status_t col_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout, float *din)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    if (!din)
        return BG_OK;
    bg_shape_t f = bg__tp_full(p->mode, p->tp, ctx->in);
    size_t a = bg__tp_bytes(f.n, f.t, f.c), o = bg__tp_bytes(f.n, f.t, p->lin.c_out);
    float *full, *rs;
    bg__tp_bufs(p->mode, ctx->scratch, a + (o > a ? o : a), &full, &rs);
    return p->mode->gemm_reduce(g, ctx->be, 0, f.n, ctx->in.t, p->lin.c_in, p->lin.c_out, dout, l->params[0].data,
                                full, rs, din, ctx->deferred);
}

/* In sequence parallelism the input is gathered again (the stash keeps the local rows only). */
static bg_status_t col_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                       const float *dout)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    bg_shape_t f = bg__tp_full(p->mode, p->tp, ctx->in);
    float *full, *tmp;
    const float *gathered;
    bg__tp_bufs(p->mode, ctx->scratch, bg__tp_bytes(f.n, f.t, f.c), &full, &tmp);
    /* weight (c_out, c_in) += dout^T x gathered input */
    BG_CHECK(p->mode->gather_weight_grad(g, ctx->be, 0, f.n, ctx->in.t, p->lin.c_out, p->lin.c_in, dout, in, full, tmp,
                                         l->params[0].grad, &gathered));
    if (p->lin.bias) /* dout: every position already */
        ctx->be->ops->bias_backward(ctx->be, l->params[1].grad, dout, ROWS(f), p->lin.c_out);
    return BG_OK;
}

/* forward: the input's gather; backward: the input gradient's sum, and the input's gather again in W */
static void col_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const plin_t *p = l->impl;
    if (p->tp < 2)
        return;
    bg_shape_t f = bg__tp_full(p->mode, p->tp, in);
    int gc = p->mode->gather_calls;
    bg__tp_cost(p->mode, &cost->fwd_calls, &cost->fwd_bytes, gc, ROWS(f), p->lin.c_in);
    bg__tp_cost(p->mode, &cost->bwd_calls, &cost->bwd_bytes, 1 + gc, ROWS(f), p->lin.c_in);
}

static const bg_layer_ops_t column_ops = {
    .type = "column_linear",
    .out_shape = col_out_shape,
    .scratch_bytes = col_scratch,
    .fwd_flops = col_fwd_flops,
    .bwd_flops = col_bwd_flops,
    .forward = col_forward,
    .backward_input = col_backward_input,
    .backward_weight = col_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = col_tp_cost,
};

/* row-parallel: in (n, t, c_in/T); out (n, tl, c_out), summed (reduce-scattered) */
static bg_status_t row_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const plin_t *p = l->impl;
    BG_CHECK(bg__linear_out_shape(l, in, out_p));
    return bg__tp_split(l, p->mode, in.t, p->tp, &out_p->t);
}
/* [full output (gradient)][member-order copy of it, or (B) of the input gradient] */
static size_t row_scratch(const bg_layer_t *l, bg_shape_t in)
{
    const plin_t *p = l->impl;
    if (!p->mode->seq)
        return 0;
    size_t a = bg__tp_bytes(in.n, in.t, p->lin.c_out), d = bg__tp_bytes(in.n, in.t, p->lin.c_in);
    return a + (d > a ? d : a);
}
/* this member's positions of each sequence of the layer's full input */
static int row_tl(const plin_t *p, bg_shape_t in) { return bg__tp_local(p->mode, p->tp, in.t); }

static bg_status_t row_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    bg_backend_t *be = ctx->be;
    int tl = row_tl(p, ctx->in);
    float *full, *tmp;
    bg__tp_bufs(p->mode, ctx->scratch, bg__tp_bytes(ctx->in.n, ctx->in.t, p->lin.c_out), &full, &tmp);
    /* partial sums over the split input features, summed */
    BG_CHECK(p->mode->gemm_reduce(g, be, 1, ctx->in.n, tl, p->lin.c_out, p->lin.c_in, in, l->params[0].data, full, tmp,
                                  out, NULL));
    if (p->lin.bias) /* replicated: added once, after the sum */
        be->ops->bias_forward(be, out, l->params[1].data, ctx->in.n * tl, p->lin.c_out);
    return BG_OK;
}

static bg_status_t row_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout, float *din)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    if (!din)
        return BG_OK;
    float *full, *tmp;
    bg__tp_bufs(p->mode, ctx->scratch, bg__tp_bytes(ctx->in.n, ctx->in.t, p->lin.c_out), &full, &tmp);
    /* din = gathered dout x weight (row-parallel: no sum) */
    return p->mode->gather_gemm(g, ctx->be, 0, ctx->in.n, row_tl(p, ctx->in), p->lin.c_out, p->lin.c_in, dout,
                                l->params[0].data, full, tmp, din);
}

/* In sequence parallelism the output gradient is gathered again: the
 * weight's and the bias's gradients come from every position (the bias's:
 * the same bits on every member, no sum needed). */
static bg_status_t row_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                       const float *dout)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    float *full, *tmp;
    const float *dfull;
    bg__tp_bufs(p->mode, ctx->scratch, bg__tp_bytes(ctx->in.n, ctx->in.t, p->lin.c_out), &full, &tmp);
    /* weight (c_out, c_in/T) += gathered dout^T x input */
    BG_CHECK(p->mode->gather_weight_grad(g, ctx->be, 1, ctx->in.n, row_tl(p, ctx->in), p->lin.c_out, p->lin.c_in, dout,
                                         in, full, tmp, l->params[0].grad, &dfull));
    if (p->lin.bias) /* every position's: the same bits on every member */
        ctx->be->ops->bias_backward(ctx->be, l->params[1].grad, dfull, ROWS(ctx->in), p->lin.c_out);
    return BG_OK;
}

/* forward: the output's sum; backward: the output gradient's gather in B and again in W */
static void row_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const plin_t *p = l->impl;
    if (p->tp < 2)
        return;
    int gc = p->mode->gather_calls;
    bg__tp_cost(p->mode, &cost->fwd_calls, &cost->fwd_bytes, 1, ROWS(in), p->lin.c_out);
    bg__tp_cost(p->mode, &cost->bwd_calls, &cost->bwd_bytes, 2 * gc, ROWS(in), p->lin.c_out);
}

static const bg_layer_ops_t row_ops = {
    .type = "row_linear",
    .out_shape = row_out_shape,
    .scratch_bytes = row_scratch,
    .fwd_flops = bg__linear_fwd_flops,
    .bwd_flops = bg__linear_bwd_flops,
    .forward = row_forward,
    .backward_input = row_backward_input,
    .backward_weight = row_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = row_tp_cost,
};

bg_status_t bg_layer_column_linear(const char *name, int c_in, int c_out, int blocks, int bias, float init_std, int tp,
                                   bg_layer_t **layer_p)
{
    if (blocks < 1)
        blocks = 1;
    if (c_in < 1 || c_out < 1 || c_out % blocks != 0)
        return bg_error(BG_ERR_INVALID, "column_linear %s: sizes %d -> %d (in %d blocks) must be positive", name, c_in,
                        c_out, blocks);
    BG_CHECK(divides("column_linear", name, blocks > 1 ? "output block size" : "output features", c_out / blocks, tp));
    plin_t p = {{c_in, c_out / tp, bias ? 1 : 0}, tp, &bg__tp_tensor};
    bg_param_t params[2];
    params[0] = shard_param("weight", 2, (int64_t[]){c_out / tp, c_in}, BG_INIT_NORMAL, init_std, 1, 0, tp, blocks);
    params[1] = shard_param("bias", 1, (int64_t[]){c_out / tp}, BG_INIT_CONST, 0.0f, 0, 0, tp, blocks);
    return bg__make_leaf(&column_ops, name, bias ? 2 : 1, params, &p, sizeof(p), layer_p);
}

bg_status_t bg_layer_row_linear(const char *name, int c_in, int c_out, int bias, float init_std, int tp,
                                bg_layer_t **layer_p)
{
    if (c_in < 1 || c_out < 1)
        return bg_error(BG_ERR_INVALID, "row_linear %s: sizes %d -> %d must be positive", name, c_in, c_out);
    BG_CHECK(divides("row_linear", name, "input features", c_in, tp));
    plin_t p = {{c_in / tp, c_out, bias ? 1 : 0}, tp, &bg__tp_tensor};
    bg_param_t params[2];
    params[0] = shard_param("weight", 2, (int64_t[]){c_out, c_in / tp}, BG_INIT_NORMAL, init_std, 1, 1, tp, 1);
    params[1] = bg_param_make("bias", 1, (int64_t[]){c_out}, BG_INIT_CONST, 0.0f, 0);
    return bg__make_leaf(&row_ops, name, bias ? 2 : 1, params, &p, sizeof(p), layer_p);
}

/* ------------------------------------------------- vocabulary embedding */

/* vocab: this rank's rows; the region's exit: out (n, tl, c) summed (reduce-scattered) */
/* pos 0: no position table (rotary models) */
typedef struct { int vocab, max_t, c, tp, pos; const bg__tp_mode_t *mode; } vemb_t;

static bg_status_t vemb_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const vemb_t *p = l->impl;
    if (in.c != 0 || in.n < 1 || in.t < 1)
        return bg_error(BG_ERR_INVALID, "layer %s (%s): input shape (%d,%d,%d) but token ids (c = 0) are expected",
                        l->name, l->ops->type, in.n, in.t, in.c);
    if (in.t > p->max_t)
        return bg_error(BG_ERR_INVALID, "layer %s: sequence length %d exceeds the model's maximum %d", l->name, in.t,
                        p->max_t);
    *out_p = (bg_shape_t){in.n, in.t, p->c};
    return bg__tp_split(l, p->mode, in.t, p->tp, &out_p->t);
}
/* [every position's rows (gradient)][member-order copy] */
static size_t vemb_scratch(const bg_layer_t *l, bg_shape_t in)
{
    const vemb_t *p = l->impl;
    return p->mode->seq ? 2 * bg__tp_bytes(in.n, in.t, p->c) : 0;
}
static double vemb_flops(const bg_layer_t *l, bg_shape_t in) { return (double)ROWS(in) * ((vemb_t *)l->impl)->c; }

/* out = the rows of this rank's vocabulary slice (zero for other tokens),
 * summed over the group (this member's positions of it), then + wpe: the
 * bits of wte[tok] + wpe[t]. */
static bg_status_t vemb_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const vemb_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    if (!ctx->tokens)
        return bg_error(BG_ERR_INVALID, "layer %s: no input tokens", l->name);
    bg_backend_t *be = ctx->be;
    int B = ctx->in.n, T = ctx->in.t, C = p->c, lo = (g ? g->rank : 0) * p->vocab;
    int tl = bg__tp_local(p->mode, p->tp, T), first = p->mode->seq ? (g ? g->rank : 0) * tl : 0;
    float *full, *tmp;
    bg__tp_bufs(p->mode, ctx->scratch, bg__tp_bytes(B, T, C), &full, &tmp);
    float *rows = p->mode->seq ? full : out; /* every position's rows, summed in place in tensor parallelism */
    int32_t *tok = host_ids(be, ctx->tokens, (size_t)B * T);
    BG_ALLOC_CHECK(tok, (size_t)B * T * sizeof(int32_t), "embedding tokens");
    for (int r = 0; r < B * T; r++) {
        float *o = rows + (size_t)r * C;
        int id = tok[r] - lo;
        if (id >= 0 && id < p->vocab)
            be->ops->copy(be, o, l->params[0].data + (size_t)id * C, (size_t)C);
        else
            be->ops->fill(be, o, 0.0f, (size_t)C);
    }
    free(tok);
    BG_CHECK(p->mode->reduce(g, be, rows, out, tmp, B, tl, C));
    if (ctx->cp && p->pos) { /* the table at this member's global positions (context parallelism) */
        bg__cp_pos_table(ctx, out, l->params[1].data, B, first, tl, T, C, 0);
        return BG_OK;
    }
    for (int b = 0; b < B && p->pos; b++)
        be->ops->axpy(be, out + (size_t)b * tl * C, 1.0f, l->params[1].data + (size_t)first * C, (size_t)tl * C);
    return BG_OK;
}

static bg_status_t vemb_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                       const float *dout, float *din)
{
    return BG_OK; /* tokens have no gradient */
}

/* Every position's gradient (gathered in sequence parallelism): this
 * member's wte rows and wpe from all of them. */
static bg_status_t vemb_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                        const float *dout)
{
    const vemb_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    bg_backend_t *be = ctx->be;
    int B = ctx->in.n, T = ctx->in.t, C = p->c;
    int lo = (ctx->tp ? ctx->tp->rank : 0) * p->vocab;
    float *full, *tmp;
    const float *d;
    bg__tp_bufs(p->mode, ctx->scratch, bg__tp_bytes(B, T, C), &full, &tmp);
    BG_CHECK(p->mode->gather(g, be, dout, full, tmp, B, bg__tp_local(p->mode, p->tp, T), C, &d));
    int32_t *tok = host_ids(be, ctx->tokens, (size_t)B * T);
    BG_ALLOC_CHECK(tok, (size_t)B * T * sizeof(int32_t), "embedding tokens");
    for (int r = 0; r < B * T; r++) { /* (b, t) order, as the whole embedding's kernel */
        int id = tok[r] - lo;
        if (id >= 0 && id < p->vocab)
            be->ops->axpy(be, l->params[0].grad + (size_t)id * C, 1.0f, d + (size_t)r * C, (size_t)C);
    }
    free(tok);
    if (ctx->cp && p->pos) {
        bg__cp_pos_table(ctx, l->params[1].grad, d, B, 0, T, T, C, 1);
        return BG_OK;
    }
    for (int b = 0; b < B && p->pos; b++)
        be->ops->axpy(be, l->params[1].grad, 1.0f, d + (size_t)b * T * C, (size_t)T * C);
    return BG_OK;
}

/* forward: the rows' sum; backward: the output gradient's gather (in W) */
static void vemb_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const vemb_t *p = l->impl;
    if (p->tp < 2)
        return;
    bg__tp_cost(p->mode, &cost->fwd_calls, &cost->fwd_bytes, 1, ROWS(in), p->c);
    bg__tp_cost(p->mode, &cost->bwd_calls, &cost->bwd_bytes, p->mode->gather_calls, ROWS(in), p->c);
}

static const bg_layer_ops_t vemb_ops = {
    .type = "vocab_embedding",
    .out_shape = vemb_out_shape,
    .scratch_bytes = vemb_scratch,
    .fwd_flops = vemb_flops,
    .bwd_flops = vemb_flops,
    .forward = vemb_forward,
    .backward_input = vemb_backward_input,
    .backward_weight = vemb_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = vemb_tp_cost,
};

/* pos_table 0: token rows only (rotary models) */
static bg_status_t vocab_embedding(const char *name, int vocab, int max_t, int c, float init_std, int tp, int pos_table,
                                   bg_layer_t **layer_p)
{
    if (vocab < 1 || max_t < 1 || c < 1)
        return bg_error(BG_ERR_INVALID, "vocab_embedding %s: vocab %d, max_t %d, c %d must be positive", name, vocab,
                        max_t, c);
    BG_CHECK(divides("vocab_embedding", name, "vocabulary", vocab, tp));
    vemb_t p = {vocab / tp, max_t, c, tp, pos_table ? 1 : 0, &bg__tp_tensor};
    bg_param_t params[2];
    params[0] = shard_param("wte", 2, (int64_t[]){vocab / tp, c}, BG_INIT_NORMAL, init_std, 1, 0, tp, 1);
    params[1] = bg_param_make("wpe", 2, (int64_t[]){max_t, c}, BG_INIT_NORMAL, init_std * 0.5f, 1);
    return bg__make_leaf(&vemb_ops, name, pos_table ? 2 : 1, params, &p, sizeof(p), layer_p);
}

bg_status_t bg_layer_vocab_embedding(const char *name, int vocab, int max_t, int c, float init_std, int tp,
                                     bg_layer_t **layer_p)
{
    return vocab_embedding(name, vocab, max_t, c, init_std, tp, 1, layer_p);
}

bg_status_t bg_layer_vocab_token_embedding(const char *name, int vocab, int max_t, int c, float init_std, int tp,
                                           bg_layer_t **layer_p)
{
    return vocab_embedding(name, vocab, max_t, c, init_std, tp, 0, layer_p);
}

/* ----------------------------------------------------- vocabulary head */

/* h: the shard's head (classes: this rank's); the region's entry: in (n, tl,
 * c) gathered to (n, t, c); out (n, t, 1), the losses of every position on
 * every member. stash: probs (N, V/T); wstash: dlogits (N, V/T), of every
 * position, as the whole head. Scratch: in sequence parallelism [full input]
 * [member-order copy][the input gradient's member-order copy], then the
 * head's logits (N, V/T). */
typedef struct { bg__head_t h; int tp; const bg__tp_mode_t *mode; } vhead_t;

static bg_shape_t vhead_full(const vhead_t *p, bg_shape_t in) { return bg__tp_full(p->mode, p->tp, in); }
static bg_status_t vhead_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    return bg__head_out_shape(l, vhead_full(l->impl, in), out_p);
}
static size_t vhead_probs(const bg_layer_t *l, bg_shape_t in) { return bg__head_probs_bytes(l, vhead_full(l->impl, in)); }
/* The logits (N, V); once they are on the host, the loss's gather of 3 floats a position from each
 * member, and this member's 3 floats a position before it (the group's collectives take the backend's
 * buffers): the larger of the two. */
static size_t vhead_scratch(const bg_layer_t *l, bg_shape_t in)
{
    const vhead_t *p = l->impl;
    bg_shape_t f = vhead_full(p, in);
    size_t logits = bg__head_probs_bytes(l, f);
    size_t gather = bg__align64((size_t)ROWS(f) * 3 * (size_t)(p->tp + 1) * sizeof(float));
    return (p->mode->seq ? 3 * bg__tp_bytes(f.n, f.t, f.c) : 0) + (logits > gather ? logits : gather);
}
static double vhead_fwd_flops(const bg_layer_t *l, bg_shape_t in) { return bg__head_fwd_flops(l, vhead_full(l->impl, in)); }
static double vhead_bwd_flops(const bg_layer_t *l, bg_shape_t in) { return bg__head_bwd_flops(l, vhead_full(l->impl, in)); }

/* ctx for the whole head's computation on the full input; *full_p, *tmp_p:
 * the region's two activations (the input gradient's member-order copy
 * follows: *tmp_p + a), NULL in tensor parallelism */
static bg_layer_ctx_t vhead_ctx(const vhead_t *p, const bg_layer_ctx_t *ctx, float **full_p, float **tmp_p)
{
    bg_layer_ctx_t c = *ctx;
    c.in = vhead_full(p, ctx->in);
    size_t a = bg__tp_bytes(c.in.n, c.in.t, c.in.c);
    bg__tp_bufs(p->mode, ctx->scratch, a, full_p, tmp_p);
    if (p->mode->seq)
        c.scratch = (char *)ctx->scratch + 3 * a;
    return c;
}

/* Per position, each rank's (max logit, sum of exp(logit - max), target
 * logit or 0) is gathered: 3 floats per position instead of the logits. */
static bg_status_t vhead_loss(bg_layer_t *l, const bg_layer_ctx_t *ctx, const bg_tp_comm_t *g, const float *in,
                              float *out)
{
    const vhead_t *p = l->impl;
    if (!ctx->targets)
        return bg_error(BG_ERR_INVALID, "layer %s: no targets for the loss", l->name);
    bg_backend_t *be = ctx->be;
    int N = ROWS(ctx->in), V = p->h.classes, tp = p->tp, me = g ? g->rank : 0, lo = me * V;
    float *logits = ctx->scratch, *probs = ctx->stash;
    be->ops->gemm(be, 0, 1, N, V, p->h.c, 1.0f, in, p->h.c, l->params[0].data, p->h.c, 0.0f, logits, V);
    if (p->h.bias)
        be->ops->bias_forward(be, logits, l->params[1].data, N, V);
    size_t nl = (size_t)N * V;
    float *host = malloc(nl * sizeof(float)), *mine = malloc((size_t)N * 3 * sizeof(float));
    float *all = malloc((size_t)N * 3 * tp * sizeof(float)), *loss = malloc((size_t)N * sizeof(float));
    int32_t *tgt = host_ids(be, ctx->targets, (size_t)N);
    bg_status_t st = BG_OK;
    if (!host || !mine || !all || !loss || !tgt) {
        st = bg_error(BG_ERR_NOMEM, "layer %s: cross-entropy buffers", l->name);
        goto out;
    }
    be->ops->to_host(be, host, logits, nl * sizeof(float));
    for (int n = 0; n < N; n++) {
        const float *x = host + (size_t)n * V;
        float mx = x[0];
        for (int v = 1; v < V; v++)
            mx = x[v] > mx ? x[v] : mx;
        double s = 0;
        for (int v = 0; v < V; v++)
            s += exp((double)(x[v] - mx));
        int t = tgt[n] - lo;
        mine[3 * n] = mx;
        mine[3 * n + 1] = (float)s;
        mine[3 * n + 2] = t >= 0 && t < V ? x[t] : 0.0f;
    }
    if (g && tp > 1) { /* through the scratch (the logits are on the host now): the group gathers backend buffers */
        be->ops->from_host(be, logits, mine, (size_t)N * 3 * sizeof(float));
        BG_CHECK_GOTO(g->allgather(g->arg, logits, logits + (size_t)N * 3, (size_t)N * 3), st, out);
        be->ops->to_host(be, all, logits + (size_t)N * 3, (size_t)N * 3 * tp * sizeof(float));
    } else {
        memcpy(all, mine, (size_t)N * 3 * sizeof(float));
    }
    for (int n = 0; n < N; n++) {
        float mx = all[3 * n];
        for (int r = 1; r < tp; r++)
            mx = all[(size_t)r * N * 3 + 3 * n] > mx ? all[(size_t)r * N * 3 + 3 * n] : mx;
        double s = 0;
        for (int r = 0; r < tp; r++)
            s += (double)all[(size_t)r * N * 3 + 3 * n + 1] * exp((double)(all[(size_t)r * N * 3 + 3 * n] - mx));
        int owner = tgt[n] / V;
        if (tgt[n] < 0 || owner >= tp) {
            st = bg_error(BG_ERR_INVALID, "layer %s: target %d outside [0, %d)", l->name, tgt[n], V * tp);
            goto out;
        }
        float xt = all[(size_t)owner * N * 3 + 3 * n + 2];
        loss[n] = (float)(log(s) - (double)(xt - mx));
        float *pr = host + (size_t)n * V;
        for (int v = 0; v < V; v++)
            pr[v] = (float)(exp((double)(pr[v] - mx)) / s);
    }
    be->ops->from_host(be, probs, host, nl * sizeof(float));
    be->ops->from_host(be, out, loss, (size_t)N * sizeof(float));
out:
    free(host), free(mine), free(all), free(loss), free(tgt);
    return st;
}

static bg_status_t vhead_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const vhead_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    float *full, *tmp;
    const float *x;
    bg_layer_ctx_t c = vhead_ctx(p, ctx, &full, &tmp);
    BG_CHECK(p->mode->gather(g, ctx->be, in, full, tmp, ctx->in.n, ctx->in.t, p->h.c, &x));
    return vhead_loss(l, &c, g, x, out);
}

/* dlogits (N, V/T) into the wstash: (probs - onehot(target)) * loss scale, as the whole head */
static bg_status_t vhead_dlogits(bg_layer_t *l, const bg_layer_ctx_t *ctx, const bg_tp_comm_t *g)
{
    const vhead_t *p = l->impl;
    bg_backend_t *be = ctx->be;
    int N = ROWS(ctx->in), V = p->h.classes, lo = (g ? g->rank : 0) * V;
    float *dlogits = ctx->wstash;
    int32_t *tgt = host_ids(be, ctx->targets, (size_t)N);
    BG_ALLOC_CHECK(tgt, (size_t)N * sizeof(int32_t), "head targets");
    be->ops->copy(be, dlogits, ctx->stash, (size_t)N * V);
    be->ops->scale(be, dlogits, ctx->loss_scale, (size_t)N * V);
    for (int n = 0; n < N; n++) { /* (p - 1) * dloss at the target, as the whole head */
        int t = tgt[n] - lo;
        if (t >= 0 && t < V) {
            float pt, d;
            be->ops->to_host(be, &pt, (const float *)ctx->stash + (size_t)n * V + t, sizeof(float));
            d = (pt - 1.0f) * ctx->loss_scale;
            be->ops->from_host(be, dlogits + (size_t)n * V + t, &d, sizeof(float));
        }
    }
    free(tgt);
    return BG_OK;
}

/* dlogits, then din = dlogits x weight summed over the group (this member's positions of it) */
static bg_status_t vhead_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                        const float *dout, float *din)
{
    const vhead_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    float *full, *tmp;
    bg_layer_ctx_t c = vhead_ctx(p, ctx, &full, &tmp);
    BG_CHECK(vhead_dlogits(l, &c, g));
    if (!din)
        return BG_OK;
    float *rs = p->mode->seq ? (float *)((char *)tmp + bg__tp_bytes(c.in.n, c.in.t, c.in.c)) : NULL;
    return p->mode->gemm_reduce(g, ctx->be, 0, ctx->in.n, ctx->in.t, p->h.c, p->h.classes, c.wstash,
                                l->params[0].data, full, rs, din, ctx->deferred);
}

/* In sequence parallelism the input is gathered again (the stash keeps the local rows only). */
static bg_status_t vhead_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                         const float *dout)
{
    const vhead_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    float *full, *tmp;
    const float *x;
    bg_layer_ctx_t c = vhead_ctx(p, ctx, &full, &tmp);
    BG_CHECK(p->mode->gather(g, ctx->be, in, full, tmp, ctx->in.n, ctx->in.t, p->h.c, &x));
    bg_backend_t *be = ctx->be;
    int N = ROWS(c.in), V = p->h.classes;
    const float *dlogits = c.wstash;
    be->ops->gemm(be, 1, 0, V, p->h.c, N, 1.0f, dlogits, V, x, p->h.c, 1.0f, l->params[0].grad, p->h.c);
    if (p->h.bias)
        be->ops->bias_backward(be, l->params[1].grad, dlogits, N, V);
    return BG_OK;
}

static int vhead_classes(const bg_layer_t *l)
{
    const vhead_t *p = l->impl;
    return p->h.classes * p->tp;
}

/* forward: the gather of 3 floats per position, and the input's; backward:
 * the input gradient's sum, and the input's gather again in W */
static void vhead_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const vhead_t *p = l->impl;
    if (p->tp < 2)
        return;
    bg_shape_t f = vhead_full(p, in);
    int gc = p->mode->gather_calls;
    cost->fwd_calls += 1;
    cost->fwd_bytes += 3.0 * ROWS(f) * sizeof(float);
    bg__tp_cost(p->mode, &cost->fwd_calls, &cost->fwd_bytes, gc, ROWS(f), f.c);
    bg__tp_cost(p->mode, &cost->bwd_calls, &cost->bwd_bytes, 1 + gc, ROWS(f), f.c);
}

static const bg_layer_ops_t vhead_ops = {
    .type = "vocab_head",
    .loss_classes = vhead_classes,
    .out_shape = vhead_out_shape,
    .stash_bytes = vhead_probs,
    .wstash_bytes = vhead_probs,
    .scratch_bytes = vhead_scratch,
    .fwd_flops = vhead_fwd_flops,
    .bwd_flops = vhead_bwd_flops,
    .forward = vhead_forward,
    .backward_input = vhead_backward_input,
    .backward_weight = vhead_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = vhead_tp_cost,
};

bg_status_t bg_layer_vocab_head(const char *name, int c, int classes, int bias, float init_std, int tp,
                                bg_layer_t **layer_p)
{
    if (c < 1 || classes < 2)
        return bg_error(BG_ERR_INVALID, "vocab_head %s: %d channels, %d classes (need >= 1 and >= 2)", name, c,
                        classes);
    BG_CHECK(divides("vocab_head", name, "classes (vocabulary)", classes, tp));
    vhead_t p = {{c, classes / tp, bias ? 1 : 0}, tp, &bg__tp_tensor};
    bg_param_t params[2];
    params[0] = shard_param("weight", 2, (int64_t[]){classes / tp, c}, BG_INIT_NORMAL, init_std, 1, 0, tp, 1);
    params[1] = shard_param("bias", 1, (int64_t[]){classes / tp}, BG_INIT_CONST, 0.0f, 0, 0, tp, 1);
    return bg__make_leaf(&vhead_ops, name, bias ? 2 : 1, params, &p, sizeof(p), layer_p);
}

/* ------------------------------------------------ sequence parallelism */

bg_status_t bg_layer_sequence_parallel(bg_layer_t *l)
{
    /* the split layers: where their mode is kept */
    static const struct { const bg_layer_ops_t *ops; size_t mode; } split[] = {
        {&column_ops, offsetof(plin_t, mode)},
        {&row_ops, offsetof(plin_t, mode)},
        {&vemb_ops, offsetof(vemb_t, mode)},
        {&vhead_ops, offsetof(vhead_t, mode)},
    };
    if (!l)
        return bg_error(BG_ERR_INVALID, "bg_layer_sequence_parallel: NULL layer");
    for (int i = 0; i < l->nchildren; i++)
        BG_CHECK(bg_layer_sequence_parallel(l->children[i]));
    if (l->nchildren)
        return BG_OK;
    for (size_t i = 0; i < sizeof split / sizeof split[0]; i++)
        if (l->ops == split[i].ops) {
            *(const bg__tp_mode_t **)((char *)l->impl + split[i].mode) = &bg__tp_sequence;
            return BG_OK;
        }
    if (bg_layer_loss_classes(l) || strcmp(l->ops->type, "embedding") == 0)
        return bg_error(BG_ERR_INVALID, "layer %s (%s): sequence parallelism needs the vocabulary-parallel %s "
                                        "(bg_layer_vocab_%s)", l->name, l->ops->type,
                        bg_layer_loss_classes(l) ? "head" : "embedding", bg_layer_loss_classes(l) ? "head" : "embedding");
    for (int i = 0; i < l->nparams; i++) /* runs on this member's rows: its gradient is a part */
        if (!bg_param_is_shard(&l->params[i]))
            l->params[i].tp_partial = 1;
    return BG_OK;
}

/* ---------------------------------------------------------------- blocks */

/* The blocks: tp = 1 gives the plain blocks (bg_layer_attention_block ...
 * are these), tp > 1 the same names and full tensors split, so that a save
 * of either loads into the other. */
static bg_status_t col_or_linear(const char *name, int c_in, int c_out, int blocks, float std, int tp, bg_layer_t **l)
{
    return tp > 1 ? bg_layer_column_linear(name, c_in, c_out, blocks, 1, std, tp, l)
                  : bg_layer_linear(name, c_in, c_out, 1, std, l);
}
static bg_status_t row_or_linear(const char *name, int c_in, int c_out, float std, int tp, bg_layer_t **l)
{
    return tp > 1 ? bg_layer_row_linear(name, c_in, c_out, 1, std, tp, l) : bg_layer_linear(name, c_in, c_out, 1, std, l);
}

bg_status_t bg_layer_tp_attention_block(const char *name, int c, int heads, float init_std, float proj_std, int tp,
                                        bg_layer_t **layer_p)
{
    if (c < 1 || heads < 1 || c % heads != 0)
        return bg_error(BG_ERR_INVALID, "attention block %s: heads (%d) must divide d_model (%d)", name, heads, c);
    BG_CHECK(divides("attention block", name, "heads", heads, tp));
    bg_layer_t *ch[4] = {0}, *inner = NULL;
    bg_status_t st;
    BG_CHECK_GOTO(bg_layer_layernorm("ln", c, &ch[0]), st, err);
    BG_CHECK_GOTO(col_or_linear("qkv", c, 3 * c, 3, init_std, tp, &ch[1]), st, err);
    BG_CHECK_GOTO(bg_layer_attention("attn", c / tp, heads / tp, &ch[2]), st, err);
    BG_CHECK_GOTO(row_or_linear("proj", c, c, proj_std, tp, &ch[3]), st, err);
    BG_CHECK(bg_layer_seq("", 4, ch, &inner));
    return bg_layer_residual(name, inner, layer_p);
err:
    for (int i = 0; i < 4; i++)
        bg_layer_destroy(ch[i]);
    return st;
}

bg_status_t bg_layer_tp_mlp_block(const char *name, int c, float init_std, float proj_std, int tp,
                                  bg_layer_t **layer_p)
{
    bg_layer_t *ch[4] = {0}, *inner = NULL;
    bg_status_t st;
    BG_CHECK_GOTO(bg_layer_layernorm("ln", c, &ch[0]), st, err);
    BG_CHECK_GOTO(col_or_linear("fc", c, 4 * c, 1, init_std, tp, &ch[1]), st, err);
    BG_CHECK_GOTO(bg_layer_activation("gelu", BG_ACT_GELU, &ch[2]), st, err);
    BG_CHECK_GOTO(row_or_linear("proj", 4 * c, c, proj_std, tp, &ch[3]), st, err);
    BG_CHECK(bg_layer_seq("", 4, ch, &inner));
    return bg_layer_residual(name, inner, layer_p);
err:
    for (int i = 0; i < 4; i++)
        bg_layer_destroy(ch[i]);
    return st;
}

bg_status_t bg_layer_tp_transformer_block(const char *name, int c, int heads, float init_std, float proj_std, int tp,
                                          bg_layer_t **layer_p)
{
    bg_layer_t *ch[2] = {0};
    bg_status_t st;
    BG_CHECK_GOTO(bg_layer_tp_attention_block("attn", c, heads, init_std, proj_std, tp, &ch[0]), st, err);
    BG_CHECK_GOTO(bg_layer_tp_mlp_block("mlp", c, init_std, proj_std, tp, &ch[1]), st, err);
    return bg_layer_seq(name, 2, ch, layer_p);
err:
    bg_layer_destroy(ch[0]);
    bg_layer_destroy(ch[1]);
    return st;
}

/* The plain blocks are the tensor-parallel blocks of degree 1: one
 * construction, plain linear layers where tp = 1. */
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
