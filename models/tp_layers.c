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
 * every collective's result is bitwise equal on all members. A sum that
 * follows a GEMM overlaps the second half of its rows (gemm_sum). Sequence
 * parallelism (bg_layer_sequence_parallel) switches the split layers to
 * variants that gather / reduce-scatter along the sequence; the replicated
 * tensors of the other layers then get partial gradients (tp_partial),
 * which models/model.c sums (bg_model_tp_sum_grads). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/layer_impl.h"

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

bg_status_t bg_param_gather_full(const bg_tp_comm_t *tp, bg_backend_t *be, const bg_param_t *p, const float *src,
                                 float *full)
{
    if (!bg_param_is_shard(p)) {
        be->ops->to_host(be, full, src, p->numel * sizeof(float));
        return BG_OK;
    }
    if (!tp || tp->size != p->split_parts)
        return bg_error(BG_ERR_INVALID, "tensor %s: a shard of %d without its tensor-parallel group", p->name,
                        p->split_parts);
    size_t n = p->numel;
    float *mine = malloc(n * sizeof(float)), *all = malloc(n * (size_t)tp->size * sizeof(float));
    bg_status_t st = BG_OK;
    if (!mine || !all) {
        st = bg_error(BG_ERR_NOMEM, "gathering tensor %s", p->name);
    } else {
        be->ops->to_host(be, mine, src, n * sizeof(float));
        st = tp->allgather(tp->arg, mine, all, n);
        if (st == BG_OK)
            bg_param_full_from_shards(p, all, full);
    }
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

static bg_status_t allreduce(const bg_tp_comm_t *g, float *buf, size_t n)
{
    return g && g->size > 1 ? g->allreduce(g->arg, buf, n) : BG_OK;
}

/* out (N, n) = a (N, k) x w^T (w: (n, k), trans_b) or a x w (w: (k, n)),
 * then, when `sum`, summed over the group. With a non-blocking sum the rows
 * go in two halves and the first half's sum runs (on the transport's
 * thread) while the second half computes: the reduction overlaps the
 * layer's own independent compute. With `defer` (bg_layer_ctx_t.deferred:
 * a fused backward's input gradient) the two sums are left running there,
 * to overlap the layer's weight gradient too; the same collectives on the
 * same rows, so the same bits. */
static bg_status_t gemm_sum(const bg_tp_comm_t *g, bg_backend_t *be, int sum, int trans_b, int N, int n, int k,
                            const float *a, const float *w, float *out, bg_tp_deferred_t *defer)
{
    int split = sum && g && g->size > 1 && g->iallreduce && g->wait && N >= 2;
    int cut[3] = {0, split ? N / 2 : N, N};
    void *req[2] = {NULL, NULL};
    bg_status_t st = BG_OK;
    for (int h = 0; h < (split ? 2 : 1); h++) {
        int r0 = cut[h], rows = (split ? cut[h + 1] : N) - r0;
        be->ops->gemm(be, 0, trans_b, rows, n, k, 1.0f, a + (size_t)r0 * k, k, w, trans_b ? k : n, 0.0f,
                      out + (size_t)r0 * n, n);
        if (split && st == BG_OK)
            st = g->iallreduce(g->arg, out + (size_t)r0 * n, (size_t)rows * n, &req[h]);
    }
    if (split && st == BG_OK && defer && defer->n + 2 <= BG_TP_DEFER_MAX) {
        defer->req[defer->n++] = req[0];
        defer->req[defer->n++] = req[1];
        return BG_OK;
    }
    for (int h = 0; h < 2; h++) /* every started sum is waited for, also after a failure */
        if (req[h]) {
            bg_status_t ws = g->wait(g->arg, req[h]);
            if (st == BG_OK)
                st = ws;
        }
    if (!split && sum)
        st = allreduce(g, out, (size_t)N * n);
    return st;
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

/* c_in, c_out: the local sizes of the matrix (c_out x c_in) */
typedef struct { bg__linear_t lin; int tp, row; } plin_t;

static bg_status_t plin_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    bg_backend_t *be = ctx->be;
    int N = ROWS(ctx->in);
    /* row-parallel: partial sums over the split input features */
    BG_CHECK(gemm_sum(g, be, p->row, 1, N, p->lin.c_out, p->lin.c_in, in, l->params[0].data, out, NULL));
    if (p->lin.bias)
        be->ops->bias_forward(be, out, l->params[1].data, N, p->lin.c_out);
    return BG_OK;
}

static bg_status_t plin_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                       const float *dout, float *din)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    if (!din)
        return BG_OK;
    int N = ROWS(ctx->in);
    /* column-parallel: every rank's output features contribute */
    BG_CHECK(gemm_sum(g, ctx->be, !p->row, 0, N, p->lin.c_in, p->lin.c_out, dout, l->params[0].data, din,
                      ctx->deferred));
    return BG_OK;
}

static void plin_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const plin_t *p = l->impl;
    if (p->tp < 2)
        return;
    if (p->row) { /* the output's sum forward */
        cost->fwd_calls += 1;
        cost->fwd_bytes += (double)ROWS(in) * p->lin.c_out * sizeof(float);
    } else { /* the input gradient's sum backward */
        cost->bwd_calls += 1;
        cost->bwd_bytes += (double)ROWS(in) * p->lin.c_in * sizeof(float);
    }
}

static const bg_layer_ops_t column_ops = {
    .type = "column_linear",
    .out_shape = bg__linear_out_shape,
    .fwd_flops = bg__linear_fwd_flops,
    .bwd_flops = bg__linear_bwd_flops,
    .forward = plin_forward,
    .backward_input = plin_backward_input,
    .backward_weight = bg__linear_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = plin_tp_cost,
};

static const bg_layer_ops_t row_ops = {
    .type = "row_linear",
    .out_shape = bg__linear_out_shape,
    .fwd_flops = bg__linear_fwd_flops,
    .bwd_flops = bg__linear_bwd_flops,
    .forward = plin_forward,
    .backward_input = plin_backward_input,
    .backward_weight = bg__linear_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = plin_tp_cost,
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
    plin_t p = {{c_in, c_out / tp, bias ? 1 : 0}, tp, 0};
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
    plin_t p = {{c_in / tp, c_out, bias ? 1 : 0}, tp, 1};
    bg_param_t params[2];
    params[0] = shard_param("weight", 2, (int64_t[]){c_out, c_in / tp}, BG_INIT_NORMAL, init_std, 1, 1, tp, 1);
    params[1] = bg_param_make("bias", 1, (int64_t[]){c_out}, BG_INIT_CONST, 0.0f, 0);
    return bg__make_leaf(&row_ops, name, bias ? 2 : 1, params, &p, sizeof(p), layer_p);
}

/* ------------------------------------------------- vocabulary embedding */

typedef struct { int vocab, max_t, c, tp; } vemb_t; /* vocab: this rank's rows */

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
    return BG_OK;
}
static double vemb_flops(const bg_layer_t *l, bg_shape_t in) { return (double)ROWS(in) * ((vemb_t *)l->impl)->c; }

/* out = the rows of this rank's vocabulary slice (zero for other tokens),
 * summed over the group, then + wpe: the bits of wte[tok] + wpe[t]. */
static bg_status_t vemb_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const vemb_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    if (!ctx->tokens)
        return bg_error(BG_ERR_INVALID, "layer %s: no input tokens", l->name);
    bg_backend_t *be = ctx->be;
    int B = ctx->in.n, T = ctx->in.t, C = p->c, lo = (g ? g->rank : 0) * p->vocab;
    int32_t *tok = host_ids(be, ctx->tokens, (size_t)B * T);
    BG_ALLOC_CHECK(tok, (size_t)B * T * sizeof(int32_t), "embedding tokens");
    for (int r = 0; r < B * T; r++) {
        float *o = out + (size_t)r * C;
        int id = tok[r] - lo;
        if (id >= 0 && id < p->vocab)
            be->ops->copy(be, o, l->params[0].data + (size_t)id * C, (size_t)C);
        else
            be->ops->fill(be, o, 0.0f, (size_t)C);
    }
    free(tok);
    BG_CHECK(allreduce(g, out, (size_t)B * T * C));
    for (int b = 0; b < B; b++)
        be->ops->axpy(be, out + (size_t)b * T * C, 1.0f, l->params[1].data, (size_t)T * C);
    return BG_OK;
}

static bg_status_t vemb_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                       const float *dout, float *din)
{
    return BG_OK; /* tokens have no gradient */
}

static bg_status_t vemb_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                        const float *dout)
{
    const vemb_t *p = l->impl;
    bg_backend_t *be = ctx->be;
    int B = ctx->in.n, T = ctx->in.t, C = p->c;
    int lo = (ctx->tp ? ctx->tp->rank : 0) * p->vocab;
    int32_t *tok = host_ids(be, ctx->tokens, (size_t)B * T);
    BG_ALLOC_CHECK(tok, (size_t)B * T * sizeof(int32_t), "embedding tokens");
    for (int r = 0; r < B * T; r++) { /* (b, t) order, as the whole embedding's kernel */
        int id = tok[r] - lo;
        if (id >= 0 && id < p->vocab)
            be->ops->axpy(be, l->params[0].grad + (size_t)id * C, 1.0f, dout + (size_t)r * C, (size_t)C);
    }
    free(tok);
    for (int b = 0; b < B; b++)
        be->ops->axpy(be, l->params[1].grad, 1.0f, dout + (size_t)b * T * C, (size_t)T * C);
    return BG_OK;
}

static void vemb_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const vemb_t *p = l->impl;
    if (p->tp < 2)
        return;
    cost->fwd_calls += 1;
    cost->fwd_bytes += (double)ROWS(in) * p->c * sizeof(float);
}

static const bg_layer_ops_t vemb_ops = {
    .type = "vocab_embedding",
    .out_shape = vemb_out_shape,
    .fwd_flops = vemb_flops,
    .bwd_flops = vemb_flops,
    .forward = vemb_forward,
    .backward_input = vemb_backward_input,
    .backward_weight = vemb_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = vemb_tp_cost,
};

bg_status_t bg_layer_vocab_embedding(const char *name, int vocab, int max_t, int c, float init_std, int tp,
                                     bg_layer_t **layer_p)
{
    if (vocab < 1 || max_t < 1 || c < 1)
        return bg_error(BG_ERR_INVALID, "vocab_embedding %s: vocab %d, max_t %d, c %d must be positive", name, vocab,
                        max_t, c);
    BG_CHECK(divides("vocab_embedding", name, "vocabulary", vocab, tp));
    vemb_t p = {vocab / tp, max_t, c, tp};
    bg_param_t params[2];
    params[0] = shard_param("wte", 2, (int64_t[]){vocab / tp, c}, BG_INIT_NORMAL, init_std, 1, 0, tp, 1);
    params[1] = bg_param_make("wpe", 2, (int64_t[]){max_t, c}, BG_INIT_NORMAL, init_std * 0.5f, 1);
    return bg__make_leaf(&vemb_ops, name, 2, params, &p, sizeof(p), layer_p);
}

/* ----------------------------------------------------- vocabulary head */

/* h: the shard's head (classes: this rank's); stash: probs (N, V/T);
 * wstash: dlogits (N, V/T); scratch: logits (N, V/T), as the whole head */
typedef struct { bg__head_t h; int tp; } vhead_t;

/* Per position, each rank's (max logit, sum of exp(logit - max), target
 * logit or 0) is gathered: 3 floats per position instead of the logits. */
static bg_status_t vhead_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const vhead_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
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
    if (g && tp > 1)
        BG_CHECK_GOTO(g->allgather(g->arg, mine, all, (size_t)N * 3), st, out);
    else
        memcpy(all, mine, (size_t)N * 3 * sizeof(float));
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

/* dlogits into the wstash and, when din, din = dlogits x weight, summed over
 * the group when `sum` */
static bg_status_t vhead_bwd(bg_layer_t *l, const bg_layer_ctx_t *ctx, const bg_tp_comm_t *g, int sum, float *din)
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
    if (din) {
        BG_CHECK(gemm_sum(g, be, sum, 0, N, p->h.c, V, dlogits, l->params[0].data, din, ctx->deferred));
    }
    return BG_OK;
}

static bg_status_t vhead_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                        const float *dout, float *din)
{
    const vhead_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    return vhead_bwd(l, ctx, g, 1, din);
}

static bg_status_t vhead_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                         const float *dout)
{
    const vhead_t *p = l->impl;
    bg_backend_t *be = ctx->be;
    int N = ROWS(ctx->in), V = p->h.classes;
    const float *dlogits = ctx->wstash;
    be->ops->gemm(be, 1, 0, V, p->h.c, N, 1.0f, dlogits, V, in, p->h.c, 1.0f, l->params[0].grad, p->h.c);
    if (p->h.bias)
        be->ops->bias_backward(be, l->params[1].grad, dlogits, N, V);
    return BG_OK;
}

static int vhead_classes(const bg_layer_t *l)
{
    const vhead_t *p = l->impl;
    return p->h.classes * p->tp;
}

static void vhead_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const vhead_t *p = l->impl;
    if (p->tp < 2)
        return;
    cost->fwd_calls += 1; /* the gather of 3 floats per position */
    cost->fwd_bytes += 3.0 * ROWS(in) * sizeof(float);
    cost->bwd_calls += 1;
    cost->bwd_bytes += (double)ROWS(in) * p->h.c * sizeof(float);
}

static const bg_layer_ops_t vhead_ops = {
    .type = "vocab_head",
    .loss_classes = vhead_classes,
    .out_shape = bg__head_out_shape,
    .stash_bytes = bg__head_probs_bytes,
    .wstash_bytes = bg__head_probs_bytes,
    .scratch_bytes = bg__head_probs_bytes,
    .fwd_flops = bg__head_fwd_flops,
    .bwd_flops = bg__head_bwd_flops,
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
    vhead_t p = {{c, classes / tp, bias ? 1 : 0}, tp};
    bg_param_t params[2];
    params[0] = shard_param("weight", 2, (int64_t[]){classes / tp, c}, BG_INIT_NORMAL, init_std, 1, 0, tp, 1);
    params[1] = shard_param("bias", 1, (int64_t[]){classes / tp}, BG_INIT_CONST, 0.0f, 0, 0, tp, 1);
    return bg__make_leaf(&vhead_ops, name, bias ? 2 : 1, params, &p, sizeof(p), layer_p);
}

/* ------------------------------------------------ sequence parallelism */

/* Between the tensor-parallel regions the activation (n, t, c) is split along
 * t: member r holds positions [r tl, (r+1) tl) of every sequence, (n, tl, c)
 * with tl = t / T. The sequence-parallel variants below (the same types and
 * impls, other ops; bg_layer_sequence_parallel switches a tree to them) move
 * between the split and the full activation with the group's gather and
 * reduce-scatter. Their scratch is [full activation][member-order copy]. */

/* full (n, T tl, c) from every member's local (n, tl, c): the group's gather
 * (member-major) into tmp, then each member's rows to their positions. */
static bg_status_t sp_gather(const bg_tp_comm_t *g, bg_backend_t *be, const float *local, float *full, float *tmp,
                             int n, int tl, int c)
{
    int T = g ? g->size : 1;
    size_t piece = (size_t)tl * c, each = (size_t)n * piece;
    if (T == 1) {
        be->ops->copy(be, full, local, each);
        return BG_OK;
    }
    if (n == 1) /* member-major is sequence order */
        return g->allgather(g->arg, local, full, each);
    BG_CHECK(g->allgather(g->arg, local, tmp, each));
    for (int r = 0; r < T; r++)
        for (int b = 0; b < n; b++)
            be->ops->copy(be, full + ((size_t)b * T + r) * piece, tmp + ((size_t)r * n + b) * piece, piece);
    return BG_OK;
}

/* local (n, tl, c) = this member's positions of full (n, T tl, c) summed over
 * the group: full's rows in member order (into tmp), then the group's
 * reduce-scatter (or, without one, a sum of everything). full and tmp are
 * clobbered. */
static bg_status_t sp_reduce_scatter(const bg_tp_comm_t *g, bg_backend_t *be, float *full, float *local, float *tmp,
                                     int n, int tl, int c)
{
    int T = g ? g->size : 1;
    size_t piece = (size_t)tl * c, each = (size_t)n * piece;
    if (T == 1) {
        be->ops->copy(be, local, full, each);
        return BG_OK;
    }
    float *src = full;
    if (n > 1) {
        for (int r = 0; r < T; r++)
            for (int b = 0; b < n; b++)
                be->ops->copy(be, tmp + ((size_t)r * n + b) * piece, full + ((size_t)b * T + r) * piece, piece);
        src = tmp;
    }
    if (g->reduce_scatter)
        return g->reduce_scatter(g->arg, src, local, each);
    BG_CHECK(g->allreduce(g->arg, src, each * (size_t)T));
    be->ops->copy(be, local, src + (size_t)g->rank * each, each);
    return BG_OK;
}

/* local (n, tl, c_out) = this member's positions of a (n, T tl, k) x w
 * (trans_b as gemm_sum) summed over the group. With a non-blocking
 * reduce-scatter the sequences go in two halves, as gemm_sum's rows: the
 * first half's reduce-scatter runs while the second half's GEMM computes.
 * full and tmp: n T tl c_out floats each, clobbered. With `defer` (a fused
 * backward's input gradient, bg_layer_ctx_t.deferred) both reduce-scatters
 * are left running there with their copies into local, to overlap the
 * layer's weight gradient too: tmp must then be scratch that the weight
 * gradient leaves alone. */
static bg_status_t sp_gemm_reduce_scatter(const bg_tp_comm_t *g, bg_backend_t *be, int trans_b, int n, int tl,
                                          int c_out, int k, const float *a, const float *w, float *full, float *tmp,
                                          float *local, bg_tp_deferred_t *defer)
{
    int T = g ? g->size : 1;
    if (T == 1 || n < 2 || !g->ireduce_scatter || !g->wait) {
        BG_CHECK(gemm_sum(g, be, 0, trans_b, n * T * tl, c_out, k, a, w, full, NULL));
        return sp_reduce_scatter(g, be, full, local, tmp, n, tl, c_out);
    }
    size_t piece = (size_t)tl * c_out, seq = (size_t)T * piece;
    int cut[3] = {0, n / 2, n};
    void *req[2] = {NULL, NULL};
    bg_status_t st = BG_OK;
    for (int h = 0; h < 2 && st == BG_OK; h++) {
        int b0 = cut[h], nb = cut[h + 1] - b0, rows = nb * T * tl;
        const float *ah = a + (size_t)b0 * T * tl * k;
        float *fh = full + (size_t)b0 * seq, *th = tmp + (size_t)b0 * seq; /* this half's sequences */
        be->ops->gemm(be, 0, trans_b, rows, c_out, k, 1.0f, ah, k, w, trans_b ? k : c_out, 0.0f, fh, c_out);
        for (int r = 0; r < T; r++) /* member-major: member r's positions of the half's sequences */
            for (int b = 0; b < nb; b++)
                be->ops->copy(be, th + ((size_t)r * nb + b) * piece, fh + (size_t)b * seq + (size_t)r * piece, piece);
        st = g->ireduce_scatter(g->arg, th, (size_t)nb * piece, &req[h]);
    }
    if (st == BG_OK && defer && defer->n + 2 <= BG_TP_DEFER_MAX && defer->ncopy + 2 <= BG_TP_DEFER_MAX) {
        for (int h = 0; h < 2; h++) {
            int b0 = cut[h], nb = cut[h + 1] - b0;
            defer->req[defer->n++] = req[h];
            defer->copy[defer->ncopy].dst = local + (size_t)b0 * piece;
            defer->copy[defer->ncopy].src = tmp + (size_t)b0 * seq + (size_t)g->rank * nb * piece;
            defer->copy[defer->ncopy++].n = (size_t)nb * piece;
        }
        return BG_OK;
    }
    for (int h = 0; h < 2; h++) /* every started one is waited for, also after a failure */
        if (req[h]) {
            bg_status_t ws = g->wait(g->arg, req[h]);
            if (st == BG_OK)
                st = ws;
        }
    for (int h = 0; h < 2 && st == BG_OK; h++) {
        int b0 = cut[h], nb = cut[h + 1] - b0;
        be->ops->copy(be, local + (size_t)b0 * piece, tmp + (size_t)b0 * seq + (size_t)g->rank * nb * piece,
                      (size_t)nb * piece);
    }
    return st;
}

/* out (n, T tl, c_out) = gather(local (n, tl, k)) x w (trans_b as gemm_sum).
 * With a non-blocking gather it runs (member-major, into full) while this
 * member's own rows compute; the output is member-major (in tmp) until the
 * others' rows are done, then put in sequence order. full: n T tl k floats,
 * tmp: n T tl c_out (without the non-blocking gather: n T tl k). */
static bg_status_t sp_gather_gemm(const bg_tp_comm_t *g, bg_backend_t *be, int trans_b, int n, int tl, int k,
                                  int c_out, const float *local, const float *w, float *full, float *tmp, float *out)
{
    int T = g ? g->size : 1, ldw = trans_b ? k : c_out;
    if (T == 1 || !g->iallgather || !g->wait) {
        BG_CHECK(sp_gather(g, be, local, full, tmp, n, tl, k));
        return gemm_sum(g, be, 0, trans_b, n * T * tl, c_out, k, full, w, out, NULL);
    }
    int me = g->rank, rows = n * tl;
    size_t each = (size_t)rows * k, eo = (size_t)rows * c_out, piece = (size_t)tl * c_out;
    void *req = NULL;
    be->ops->copy(be, full + (size_t)me * each, local, each);
    bg_status_t st = g->iallgather(g->arg, full, each, &req);
    if (st == BG_OK)
        be->ops->gemm(be, 0, trans_b, rows, c_out, k, 1.0f, local, k, w, ldw, 0.0f, tmp + (size_t)me * eo, c_out);
    if (req) {
        bg_status_t ws = g->wait(g->arg, req);
        st = st == BG_OK ? ws : st;
    }
    BG_CHECK(st);
    if (me > 0) /* members [0, me), then (me, T): contiguous rows of the member-major input */
        be->ops->gemm(be, 0, trans_b, me * rows, c_out, k, 1.0f, full, k, w, ldw, 0.0f, tmp, c_out);
    if (me < T - 1)
        be->ops->gemm(be, 0, trans_b, (T - 1 - me) * rows, c_out, k, 1.0f, full + (size_t)(me + 1) * each, k, w, ldw,
                      0.0f, tmp + (size_t)(me + 1) * eo, c_out);
    for (int r = 0; r < T; r++)
        for (int b = 0; b < n; b++)
            be->ops->copy(be, out + ((size_t)b * T + r) * piece, tmp + ((size_t)r * n + b) * piece, piece);
    return BG_OK;
}

/* dw (ka x kb) += A^T B over every position, A and B (n, T tl, ka / kb) in
 * sequence order, one of them given as this member's local part (n, tl, k)
 * to gather (gather_a: A). With a non-blocking gather the member's own rows
 * compute while it runs; the sum over positions then goes member by member
 * (member-major: the full operand is copied so, into tmp). *full_p: the
 * gathered operand, member-major (with the non-blocking gather) or in
 * sequence order (without: sp_gather, then one GEMM). full: n T tl k_gathered
 * floats; tmp: n T tl k_other (without the non-blocking gather: k_gathered). */
static bg_status_t sp_gather_weight_grad(const bg_tp_comm_t *g, bg_backend_t *be, int gather_a, int n, int tl, int ka,
                                         int kb, const float *a, const float *b, float *full, float *tmp, float *dw)
{
    int T = g ? g->size : 1, kg = gather_a ? ka : kb, kf = gather_a ? kb : ka, N = n * T * tl;
    const float *local = gather_a ? a : b, *other = gather_a ? b : a;
    if (T == 1 || !g->iallgather || !g->wait) {
        BG_CHECK(sp_gather(g, be, local, full, tmp, n, tl, kg));
        be->ops->gemm(be, 1, 0, ka, kb, N, 1.0f, gather_a ? full : a, ka, gather_a ? b : full, kb, 1.0f, dw, kb);
        return BG_OK;
    }
    int me = g->rank, rows = n * tl;
    size_t eg = (size_t)rows * kg, ef = (size_t)rows * kf, piece = (size_t)tl * kf;
    for (int r = 0; r < T; r++) /* the full operand member-major */
        for (int q = 0; q < n; q++)
            be->ops->copy(be, tmp + ((size_t)r * n + q) * piece, other + ((size_t)q * T + r) * piece, piece);
    void *req = NULL;
    be->ops->copy(be, full + (size_t)me * eg, local, eg);
    bg_status_t st = g->iallgather(g->arg, full, eg, &req);
    /* member r's rows: A_r^T B_r */
#define SP_WG(r0, cnt)                                                                                              \
    be->ops->gemm(be, 1, 0, ka, kb, (cnt) * rows, 1.0f,                                                            \
                  gather_a ? full + (size_t)(r0) * eg : tmp + (size_t)(r0) * ef, ka,                                 \
                  gather_a ? tmp + (size_t)(r0) * ef : full + (size_t)(r0) * eg, kb, 1.0f, dw, kb)
    if (st == BG_OK)
        SP_WG(me, 1);
    if (req) {
        bg_status_t ws = g->wait(g->arg, req);
        st = st == BG_OK ? ws : st;
    }
    BG_CHECK(st);
    if (me > 0)
        SP_WG(0, me);
    if (me < T - 1)
        SP_WG(me + 1, T - 1 - me);
#undef SP_WG
    return BG_OK;
}

/* The local length of a full sequence of t positions split over tp members. */
static bg_status_t sp_split(const bg_layer_t *l, int t, int tp, int *tl_p)
{
    if (tp < 1 || t % tp != 0)
        return bg_error(BG_ERR_INVALID, "layer %s (%s): sequence length %d is not divisible by the tensor-parallel "
                                        "degree %d (sequence parallelism splits the sequence)",
                        l->name, l->ops->type, t, tp);
    *tl_p = t / tp;
    return BG_OK;
}

/* Bytes of a full activation of n sequences of t positions of c channels. */
static size_t sp_bytes(int n, int t, int c) { return bg__align64((size_t)n * t * c * sizeof(float)); }

/* The collectives' bytes for the planner, which costs each call as an
 * all-reduce: a gather or a reduce-scatter moves half of one. */
static void sp_cost(double *calls, double *bytes, int k, int n, int t, int c)
{
    *calls += k;
    *bytes += k * 0.5 * (double)n * t * c * sizeof(float);
}

/* column-parallel: in (n, tl, c_in) gathered to (n, t, c_in); out (n, t, c_out/T) */
static bg_shape_t col_full(const plin_t *p, bg_shape_t in) { return (bg_shape_t){in.n, in.t * p->tp, in.c}; }

static bg_status_t col_sp_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const plin_t *p = l->impl;
    BG_CHECK(bg__linear_out_shape(l, in, out_p));
    out_p->t *= p->tp;
    return BG_OK;
}
/* [full input][member-order copy of the input, or (forward) of the output]
 * [the input gradient's member-order copy, reduce-scattered while the
 * weight gradient computes (bg_layer_ctx_t.deferred)] */
static size_t col_sp_scratch(const bg_layer_t *l, bg_shape_t in)
{
    const plin_t *p = l->impl;
    size_t a = sp_bytes(in.n, in.t * p->tp, p->lin.c_in), o = sp_bytes(in.n, in.t * p->tp, p->lin.c_out);
    return a + (o > a ? o : a) + a;
}
static double col_sp_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    return bg__linear_fwd_flops(l, col_full(l->impl, in));
}
static double col_sp_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    return bg__linear_bwd_flops(l, col_full(l->impl, in));
}

static bg_status_t col_sp_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    bg_backend_t *be = ctx->be;
    bg_shape_t f = col_full(p, ctx->in);
    float *full = ctx->scratch, *tmp = (float *)((char *)ctx->scratch + sp_bytes(f.n, f.t, f.c));
    BG_CHECK(sp_gather_gemm(g, be, 1, ctx->in.n, ctx->in.t, p->lin.c_in, p->lin.c_out, in, l->params[0].data, full,
                            tmp, out));
    if (p->lin.bias)
        be->ops->bias_forward(be, out, l->params[1].data, ROWS(f), p->lin.c_out);
    return BG_OK;
}

/* din: this member's rows of every member's contribution, summed */
static bg_status_t col_sp_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                         const float *dout, float *din)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    if (!din)
        return BG_OK;
    bg_shape_t f = col_full(p, ctx->in);
    size_t a = sp_bytes(f.n, f.t, f.c), o = sp_bytes(f.n, f.t, p->lin.c_out);
    float *full = ctx->scratch, *rs = (float *)((char *)ctx->scratch + a + (o > a ? o : a));
    return sp_gemm_reduce_scatter(g, ctx->be, 0, f.n, ctx->in.t, p->lin.c_in, p->lin.c_out, dout, l->params[0].data,
                                  full, rs, din, ctx->deferred);
}

/* The input is gathered again (the stash keeps the local rows only). */
static bg_status_t col_sp_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                          const float *dout)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    bg_shape_t f = col_full(p, ctx->in);
    float *full = ctx->scratch, *tmp = (float *)((char *)ctx->scratch + sp_bytes(f.n, f.t, f.c));
    /* weight (c_out, c_in) += dout^T x gathered input */
    BG_CHECK(sp_gather_weight_grad(g, ctx->be, 0, f.n, ctx->in.t, p->lin.c_out, p->lin.c_in, dout, in, full, tmp,
                                   l->params[0].grad));
    if (p->lin.bias) /* dout: every position already */
        ctx->be->ops->bias_backward(ctx->be, l->params[1].grad, dout, ROWS(f), p->lin.c_out);
    return BG_OK;
}

static void col_sp_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const plin_t *p = l->impl;
    if (p->tp < 2)
        return;
    bg_shape_t f = col_full(p, in);
    sp_cost(&cost->fwd_calls, &cost->fwd_bytes, 1, f.n, f.t, p->lin.c_in); /* the gather */
    sp_cost(&cost->bwd_calls, &cost->bwd_bytes, 2, f.n, f.t, p->lin.c_in); /* reduce-scatter, gather again */
}

static const bg_layer_ops_t column_sp_ops = {
    .type = "column_linear",
    .out_shape = col_sp_out_shape,
    .scratch_bytes = col_sp_scratch,
    .fwd_flops = col_sp_fwd_flops,
    .bwd_flops = col_sp_bwd_flops,
    .forward = col_sp_forward,
    .backward_input = col_sp_backward_input,
    .backward_weight = col_sp_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = col_sp_tp_cost,
};

/* row-parallel: in (n, t, c_in/T); out (n, tl, c_out) reduce-scattered */
static bg_status_t row_sp_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const plin_t *p = l->impl;
    BG_CHECK(bg__linear_out_shape(l, in, out_p));
    return sp_split(l, in.t, p->tp, &out_p->t);
}
/* [full output (gradient)][member-order copy of it, or (B) of the input gradient] */
static size_t row_sp_scratch(const bg_layer_t *l, bg_shape_t in)
{
    const plin_t *p = l->impl;
    size_t a = sp_bytes(in.n, in.t, p->lin.c_out), d = sp_bytes(in.n, in.t, p->lin.c_in);
    return a + (d > a ? d : a);
}

static bg_status_t row_sp_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    bg_backend_t *be = ctx->be;
    int N = ROWS(ctx->in), tl = ctx->in.t / p->tp;
    float *full = ctx->scratch, *tmp = (float *)((char *)ctx->scratch + sp_bytes(ctx->in.n, ctx->in.t, p->lin.c_out));
    BG_CHECK(sp_gemm_reduce_scatter(g, be, 1, ctx->in.n, tl, p->lin.c_out, p->lin.c_in, in, l->params[0].data, full,
                                    tmp, out, NULL));
    if (p->lin.bias) /* replicated: added once, after the sum */
        be->ops->bias_forward(be, out, l->params[1].data, N / p->tp, p->lin.c_out);
    return BG_OK;
}

static bg_status_t row_sp_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                         const float *dout, float *din)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    if (!din)
        return BG_OK;
    float *full = ctx->scratch, *tmp = (float *)((char *)ctx->scratch + sp_bytes(ctx->in.n, ctx->in.t, p->lin.c_out));
    /* din = gathered dout x weight (row-parallel: no sum) */
    return sp_gather_gemm(g, ctx->be, 0, ctx->in.n, ctx->in.t / p->tp, p->lin.c_out, p->lin.c_in, dout,
                          l->params[0].data, full, tmp, din);
}

/* The output gradient is gathered again: the weight's and the bias's
 * gradients come from every position (the bias's: the same bits on every
 * member, no sum needed). */
static bg_status_t row_sp_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                          const float *dout)
{
    const plin_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    float *full = ctx->scratch, *tmp = (float *)((char *)ctx->scratch + sp_bytes(ctx->in.n, ctx->in.t, p->lin.c_out));
    /* weight (c_out, c_in/T) += gathered dout^T x input */
    BG_CHECK(sp_gather_weight_grad(g, ctx->be, 1, ctx->in.n, ctx->in.t / p->tp, p->lin.c_out, p->lin.c_in, dout, in,
                                   full, tmp, l->params[0].grad));
    if (p->lin.bias) /* every position's, gathered: the same bits on every member */
        ctx->be->ops->bias_backward(ctx->be, l->params[1].grad, full, ROWS(ctx->in), p->lin.c_out);
    return BG_OK;
}

static void row_sp_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const plin_t *p = l->impl;
    if (p->tp < 2)
        return;
    sp_cost(&cost->fwd_calls, &cost->fwd_bytes, 1, in.n, in.t, p->lin.c_out); /* the reduce-scatter */
    sp_cost(&cost->bwd_calls, &cost->bwd_bytes, 2, in.n, in.t, p->lin.c_out); /* gather in B, again in W */
}

static const bg_layer_ops_t row_sp_ops = {
    .type = "row_linear",
    .out_shape = row_sp_out_shape,
    .scratch_bytes = row_sp_scratch,
    .fwd_flops = bg__linear_fwd_flops,
    .bwd_flops = bg__linear_bwd_flops,
    .forward = row_sp_forward,
    .backward_input = row_sp_backward_input,
    .backward_weight = row_sp_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = row_sp_tp_cost,
};

/* vocabulary embedding: tokens (n, t); out (n, tl, c), reduce-scattered */
static bg_status_t vemb_sp_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const vemb_t *p = l->impl;
    BG_CHECK(vemb_out_shape(l, in, out_p));
    return sp_split(l, in.t, p->tp, &out_p->t);
}
static size_t vemb_sp_scratch(const bg_layer_t *l, bg_shape_t in)
{
    const vemb_t *p = l->impl;
    return 2 * sp_bytes(in.n, in.t, p->c);
}

/* The whole embedding's rows (wte[tok] + wpe[t], summed as vemb_forward sums
 * them: one member's row and zeros), this member's positions kept. */
static bg_status_t vemb_sp_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const vemb_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    if (!ctx->tokens)
        return bg_error(BG_ERR_INVALID, "layer %s: no input tokens", l->name);
    bg_backend_t *be = ctx->be;
    int B = ctx->in.n, T = ctx->in.t, C = p->c, lo = (g ? g->rank : 0) * p->vocab, tl = T / p->tp;
    int first = (g ? g->rank : 0) * tl;
    float *full = ctx->scratch, *tmp = (float *)((char *)ctx->scratch + sp_bytes(B, T, C));
    int32_t *tok = host_ids(be, ctx->tokens, (size_t)B * T);
    BG_ALLOC_CHECK(tok, (size_t)B * T * sizeof(int32_t), "embedding tokens");
    for (int r = 0; r < B * T; r++) {
        float *o = full + (size_t)r * C;
        int id = tok[r] - lo;
        if (id >= 0 && id < p->vocab)
            be->ops->copy(be, o, l->params[0].data + (size_t)id * C, (size_t)C);
        else
            be->ops->fill(be, o, 0.0f, (size_t)C);
    }
    free(tok);
    BG_CHECK(sp_reduce_scatter(g, be, full, out, tmp, B, tl, C));
    for (int b = 0; b < B; b++)
        be->ops->axpy(be, out + (size_t)b * tl * C, 1.0f, l->params[1].data + (size_t)first * C, (size_t)tl * C);
    return BG_OK;
}

/* Every position's gradient (gathered): this member's wte rows and wpe from
 * all of them, as vemb_backward_weight. */
static bg_status_t vemb_sp_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                           const float *out, const float *dout)
{
    const vemb_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    int B = ctx->in.n, T = ctx->in.t;
    float *full = ctx->scratch, *tmp = (float *)((char *)ctx->scratch + sp_bytes(B, T, p->c));
    BG_CHECK(sp_gather(g, ctx->be, dout, full, tmp, B, T / p->tp, p->c));
    return vemb_backward_weight(l, ctx, in, out, full);
}

static void vemb_sp_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const vemb_t *p = l->impl;
    if (p->tp < 2)
        return;
    sp_cost(&cost->fwd_calls, &cost->fwd_bytes, 1, in.n, in.t, p->c);
    sp_cost(&cost->bwd_calls, &cost->bwd_bytes, 1, in.n, in.t, p->c);
}

static const bg_layer_ops_t vemb_sp_ops = {
    .type = "vocab_embedding",
    .out_shape = vemb_sp_out_shape,
    .scratch_bytes = vemb_sp_scratch,
    .fwd_flops = vemb_flops,
    .bwd_flops = vemb_flops,
    .forward = vemb_sp_forward,
    .backward_input = vemb_backward_input,
    .backward_weight = vemb_sp_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = vemb_sp_tp_cost,
};

/* vocabulary head: in (n, tl, c) gathered to (n, t, c); out (n, t, 1), the
 * losses of every position on every member. Scratch: [full input][member-
 * order copy][the head's logits]; stash and wstash: the head's, of every
 * position. */
static bg_shape_t vhead_full(const vhead_t *p, bg_shape_t in) { return (bg_shape_t){in.n, in.t * p->tp, in.c}; }
static bg_status_t vhead_sp_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    return bg__head_out_shape(l, vhead_full(l->impl, in), out_p);
}
static size_t vhead_sp_probs(const bg_layer_t *l, bg_shape_t in)
{
    return bg__head_probs_bytes(l, vhead_full(l->impl, in));
}
static size_t vhead_sp_scratch(const bg_layer_t *l, bg_shape_t in)
{
    bg_shape_t f = vhead_full(l->impl, in);
    return 3 * sp_bytes(f.n, f.t, f.c) + bg__head_probs_bytes(l, f);
}
static double vhead_sp_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    return bg__head_fwd_flops(l, vhead_full(l->impl, in));
}
static double vhead_sp_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    return bg__head_bwd_flops(l, vhead_full(l->impl, in));
}

/* ctx for the whole head's functions on the gathered input; *full_p, *tmp_p: the scratch's two activations,
 * then the input gradient's member-order copy (reduce-scattered while the weight gradient computes: *tmp_p + a) */
static bg_layer_ctx_t vhead_sp_ctx(const vhead_t *p, const bg_layer_ctx_t *ctx, float **full_p, float **tmp_p)
{
    bg_layer_ctx_t c = *ctx;
    c.in = vhead_full(p, ctx->in);
    size_t a = sp_bytes(c.in.n, c.in.t, c.in.c);
    *full_p = ctx->scratch;
    *tmp_p = (float *)((char *)ctx->scratch + a);
    c.scratch = (char *)ctx->scratch + 3 * a;
    return c;
}

static bg_status_t vhead_sp_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const vhead_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    float *full, *tmp;
    bg_layer_ctx_t c = vhead_sp_ctx(p, ctx, &full, &tmp);
    BG_CHECK(sp_gather(g, ctx->be, in, full, tmp, ctx->in.n, ctx->in.t, p->h.c));
    return vhead_forward(l, &c, full, out);
}

static bg_status_t vhead_sp_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                           const float *out, const float *dout, float *din)
{
    const vhead_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    float *full, *tmp;
    bg_layer_ctx_t c = vhead_sp_ctx(p, ctx, &full, &tmp);
    BG_CHECK(vhead_bwd(l, &c, g, 0, NULL)); /* dlogits (the wstash) */
    if (!din)
        return BG_OK;
    float *rs = (float *)((char *)tmp + sp_bytes(c.in.n, c.in.t, c.in.c));
    return sp_gemm_reduce_scatter(g, ctx->be, 0, ctx->in.n, ctx->in.t, p->h.c, p->h.classes, c.wstash,
                                  l->params[0].data, full, rs, din, ctx->deferred);
}

static bg_status_t vhead_sp_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                            const float *out, const float *dout)
{
    const vhead_t *p = l->impl;
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(group(l, ctx, p->tp, &g));
    float *full, *tmp;
    bg_layer_ctx_t c = vhead_sp_ctx(p, ctx, &full, &tmp);
    BG_CHECK(sp_gather(g, ctx->be, in, full, tmp, ctx->in.n, ctx->in.t, p->h.c));
    return vhead_backward_weight(l, &c, full, out, dout);
}

static void vhead_sp_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const vhead_t *p = l->impl;
    if (p->tp < 2)
        return;
    bg_shape_t f = vhead_full(p, in);
    cost->fwd_calls += 1; /* the gather of 3 floats per position */
    cost->fwd_bytes += 3.0 * ROWS(f) * sizeof(float);
    sp_cost(&cost->fwd_calls, &cost->fwd_bytes, 1, f.n, f.t, f.c);
    sp_cost(&cost->bwd_calls, &cost->bwd_bytes, 2, f.n, f.t, f.c);
}

static const bg_layer_ops_t vhead_sp_ops = {
    .type = "vocab_head",
    .loss_classes = vhead_classes,
    .out_shape = vhead_sp_out_shape,
    .stash_bytes = vhead_sp_probs,
    .wstash_bytes = vhead_sp_probs,
    .scratch_bytes = vhead_sp_scratch,
    .fwd_flops = vhead_sp_fwd_flops,
    .bwd_flops = vhead_sp_bwd_flops,
    .forward = vhead_sp_forward,
    .backward_input = vhead_sp_backward_input,
    .backward_weight = vhead_sp_backward_weight,
    .destroy = bg__free_impl,
    .tp_cost = vhead_sp_tp_cost,
};

bg_status_t bg_layer_sequence_parallel(bg_layer_t *l)
{
    static const struct { const bg_layer_ops_t *from, *to; } sp[] = {
        {&column_ops, &column_sp_ops}, {&row_ops, &row_sp_ops}, {&vemb_ops, &vemb_sp_ops}, {&vhead_ops, &vhead_sp_ops}};
    if (!l)
        return bg_error(BG_ERR_INVALID, "bg_layer_sequence_parallel: NULL layer");
    for (int i = 0; i < l->nchildren; i++)
        BG_CHECK(bg_layer_sequence_parallel(l->children[i]));
    if (l->nchildren)
        return BG_OK;
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        if (l->ops == sp[i].from || l->ops == sp[i].to) {
            l->ops = sp[i].to;
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
