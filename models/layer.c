/* models/layer.c: the generic layer functions (sizes, costs, lifetime) and
 * the two composites, seq and residual, which split B and W exactly like
 * leaves so blocks need no hand-written backward.
 *
 * Buffer layouts (every piece rounded up to 64 bytes):
 *   seq      stash:   for child i: [out_i if i < k-1][stash_i]
 *            wstash:  for child i: [dout_i if i < k-1][wstash_i]
 *            scratch: max_i scratch_i
 *   residual stash:   [f_out][f.stash]      wstash: [f.wstash]
 *            scratch: [d f_in][f.scratch]
 * The output of the last child is the composite's own output (the caller's). */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/layer_impl.h"

size_t bg__align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

bg_status_t bg_layer_create(const bg_layer_ops_t *ops, const char *name, int nparams,
                            const bg_param_t *params, void *impl, bg_layer_t **layer_p)
{
    if (!ops || !ops->out_shape || !ops->forward || !ops->backward_input)
        return bg_error(BG_ERR_INVALID, "layer \"%s\": ops must provide out_shape, forward and backward_input",
                        name ? name : "?");
    bg_layer_t *l = calloc(1, sizeof(*l));
    if (!l)
        return bg_error(BG_ERR_NOMEM, "cannot allocate layer %s", name);
    l->ops = ops;
    snprintf(l->name, sizeof(l->name), "%s", name ? name : ops->type);
    if (nparams > 0) {
        l->params = calloc((size_t)nparams, sizeof(bg_param_t));
        if (!l->params) {
            free(l);
            return bg_error(BG_ERR_NOMEM, "cannot allocate parameters of layer %s", name);
        }
        memcpy(l->params, params, (size_t)nparams * sizeof(bg_param_t));
        for (int i = 0; i < nparams; i++) {
            size_t n = 1;
            for (int d = 0; d < l->params[i].ndim; d++)
                n *= (size_t)l->params[i].shape[d];
            l->params[i].numel = n;
        }
    }
    l->nparams = nparams;
    l->impl = impl;
    *layer_p = l;
    return BG_OK;
}

void bg_layer_destroy(bg_layer_t *l)
{
    if (!l)
        return;
    for (int i = 0; i < l->nchildren; i++)
        bg_layer_destroy(l->children[i]);
    free(l->children);
    if (l->ops->destroy)
        l->ops->destroy(l);
    free(l->params);
    free(l);
}

bg_status_t bg_layer_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    return l->ops->out_shape(l, in, out_p);
}

#define BG__SIZE_FN(fname, slot)                                                                     \
    size_t fname(const bg_layer_t *l, bg_shape_t in) { return l->ops->slot ? l->ops->slot(l, in) : 0; }
BG__SIZE_FN(bg_layer_stash_bytes, stash_bytes)
BG__SIZE_FN(bg_layer_wstash_bytes, wstash_bytes)
BG__SIZE_FN(bg_layer_scratch_bytes, scratch_bytes)
#undef BG__SIZE_FN

double bg_layer_fwd_flops(const bg_layer_t *l, bg_shape_t in) { return l->ops->fwd_flops ? l->ops->fwd_flops(l, in) : 0; }
double bg_layer_bwd_flops(const bg_layer_t *l, bg_shape_t in) { return l->ops->bwd_flops ? l->ops->bwd_flops(l, in) : 0; }

size_t bg_layer_param_count(const bg_layer_t *l)
{
    size_t n = 0;
    for (int i = 0; i < l->nparams; i++)
        n += l->params[i].numel;
    for (int i = 0; i < l->nchildren; i++)
        n += bg_layer_param_count(l->children[i]);
    return n;
}

size_t bg__layer_out_bytes(const bg_layer_t *l, bg_shape_t in)
{
    bg_shape_t out;
    if (bg_layer_out_shape(l, in, &out) != BG_OK)
        return 0;
    return bg__align64(bg_shape_numel(out) * sizeof(float));
}

/* ------------------------------------------------------------------ seq */

/* Input shape of every child; shapes has nchildren+1 entries. */
static bg_status_t seq_shapes(const bg_layer_t *l, bg_shape_t in, bg_shape_t *shapes)
{
    shapes[0] = in;
    for (int i = 0; i < l->nchildren; i++) {
        bg_status_t st = bg_layer_out_shape(l->children[i], shapes[i], &shapes[i + 1]);
        if (st != BG_OK)
            return st;
    }
    return BG_OK;
}

/* Allocation-free scratch for shapes: composites are at most this wide. */
#define BG_SEQ_MAX 64

static bg_status_t seq_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    bg_shape_t s[BG_SEQ_MAX + 1];
    BG_CHECK(seq_shapes(l, in, s));
    *out_p = s[l->nchildren];
    return BG_OK;
}

/* The stash and the wstash have the same layout: for each child, the
 * activation (or gradient) between it and the next, then its own part. */
static size_t seq_arena_bytes(const bg_layer_t *l, bg_shape_t in,
                              size_t (*child_bytes)(const bg_layer_t *, bg_shape_t))
{
    bg_shape_t s[BG_SEQ_MAX + 1];
    if (seq_shapes(l, in, s) != BG_OK)
        return 0;
    size_t total = 0;
    for (int i = 0; i < l->nchildren; i++) {
        if (i < l->nchildren - 1)
            total += bg__align64(bg_shape_numel(s[i + 1]) * sizeof(float));
        total += bg__align64(child_bytes(l->children[i], s[i]));
    }
    return total;
}
static size_t seq_stash_bytes(const bg_layer_t *l, bg_shape_t in) { return seq_arena_bytes(l, in, bg_layer_stash_bytes); }
static size_t seq_wstash_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return seq_arena_bytes(l, in, bg_layer_wstash_bytes);
}

static size_t seq_scratch_bytes(const bg_layer_t *l, bg_shape_t in)
{
    bg_shape_t s[BG_SEQ_MAX + 1];
    if (seq_shapes(l, in, s) != BG_OK)
        return 0;
    size_t m = 0;
    for (int i = 0; i < l->nchildren; i++) {
        size_t b = bg_layer_scratch_bytes(l->children[i], s[i]);
        if (b > m)
            m = b;
    }
    return m;
}

static double seq_flops(const bg_layer_t *l, bg_shape_t in, int bwd)
{
    bg_shape_t s[BG_SEQ_MAX + 1];
    if (seq_shapes(l, in, s) != BG_OK)
        return 0;
    double f = 0;
    for (int i = 0; i < l->nchildren; i++)
        f += bwd ? bg_layer_bwd_flops(l->children[i], s[i]) : bg_layer_fwd_flops(l->children[i], s[i]);
    return f;
}
static double seq_fwd_flops(const bg_layer_t *l, bg_shape_t in) { return seq_flops(l, in, 0); }
static double seq_bwd_flops(const bg_layer_t *l, bg_shape_t in) { return seq_flops(l, in, 1); }

/* Pointers of every child for one call. */
typedef struct seq_frame {
    bg_shape_t shape[BG_SEQ_MAX + 1];
    float *out[BG_SEQ_MAX];     /* child i's output (i < k-1: in the stash) */
    char *stash[BG_SEQ_MAX];
    float *dout[BG_SEQ_MAX];    /* child i's output gradient (i < k-1: in the wstash) */
    char *wstash[BG_SEQ_MAX];
} seq_frame_t;

static bg_status_t seq_frame(const bg_layer_t *l, const bg_layer_ctx_t *ctx, float *out, const float *dout,
                             seq_frame_t *f)
{
    BG_CHECK(seq_shapes(l, ctx->in, f->shape));
    char *sp = ctx->stash, *wp = ctx->wstash;
    int k = l->nchildren;
    for (int i = 0; i < k; i++) {
        size_t ob = bg__align64(bg_shape_numel(f->shape[i + 1]) * sizeof(float));
        if (i < k - 1) {
            f->out[i] = (float *)sp;
            sp += ob;
            f->dout[i] = wp ? (float *)wp : NULL;
            if (wp)
                wp += ob;
        } else {
            f->out[i] = out;
            f->dout[i] = (float *)dout;
        }
        f->stash[i] = sp;
        sp += bg__align64(bg_layer_stash_bytes(l->children[i], f->shape[i]));
        f->wstash[i] = wp;
        if (wp)
            wp += bg__align64(bg_layer_wstash_bytes(l->children[i], f->shape[i]));
    }
    return BG_OK;
}

static bg_status_t seq_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    seq_frame_t f;
    BG_CHECK(seq_frame(l, ctx, out, NULL, &f));
    const float *x = in;
    for (int i = 0; i < l->nchildren; i++) {
        bg_layer_ctx_t c = *ctx;
        c.in = f.shape[i];
        c.stash = f.stash[i];
        c.wstash = NULL;
        BG_CHECK(l->children[i]->ops->forward(l->children[i], &c, x, f.out[i]));
        x = f.out[i];
    }
    return BG_OK;
}

/* Child i's backward context in frame f: its shape, stash and wstash; no deferral (the callers that allow
 * one set it). */
static bg_layer_ctx_t seq_child_ctx(const bg_layer_ctx_t *ctx, const seq_frame_t *f, int i)
{
    bg_layer_ctx_t c = *ctx;
    c.in = f->shape[i];
    c.stash = f->stash[i];
    c.wstash = f->wstash[i];
    c.deferred = NULL;
    return c;
}

/* The backward of every child, last first: B only (weight = 0), W only (input = 0), or each child's B then
 * its W (both: bg_layer_backward, so a child's deferred sums overlap its W). The children's weight gradients
 * run in the same order whichever way. */
static bg_status_t seq_backward_pass(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                     const float *dout, float *din, int input, int weight)
{
    seq_frame_t f;
    BG_CHECK(seq_frame(l, ctx, (float *)out, dout, &f));
    for (int i = l->nchildren - 1; i >= 0; i--) {
        bg_layer_t *ch = l->children[i];
        bg_layer_ctx_t c = seq_child_ctx(ctx, &f, i);
        const float *x = i > 0 ? f.out[i - 1] : in;
        float *dx = i > 0 ? f.dout[i - 1] : din;
        if (input && weight)
            BG_CHECK(bg_layer_backward(ch, &c, x, f.out[i], f.dout[i], dx));
        else if (input)
            BG_CHECK(ch->ops->backward_input(ch, &c, x, f.out[i], f.dout[i], dx));
        else if (ch->ops->backward_weight)
            BG_CHECK(ch->ops->backward_weight(ch, &c, x, f.out[i], f.dout[i]));
    }
    return BG_OK;
}

static bg_status_t seq_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                      const float *out, const float *dout, float *din)
{
    return seq_backward_pass(l, ctx, in, out, dout, din, 1, 0);
}

static bg_status_t seq_backward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                const float *dout, float *din)
{
    return seq_backward_pass(l, ctx, in, out, dout, din, 1, 1);
}

static bg_status_t seq_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                       const float *out, const float *dout)
{
    return seq_backward_pass(l, ctx, in, out, dout, NULL, 0, 1);
}

static void seq_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    bg_shape_t s[BG_SEQ_MAX + 1];
    if (seq_shapes(l, in, s) != BG_OK)
        return;
    for (int i = 0; i < l->nchildren; i++)
        bg_layer_tp_cost(l->children[i], s[i], cost);
}

/* A seq is a loss layer when its last child is one. */
static int seq_loss_classes(const bg_layer_t *l) { return bg_layer_loss_classes(l->children[l->nchildren - 1]); }

static const bg_layer_ops_t seq_ops = {
    .loss_classes = seq_loss_classes,
    .type = "seq",
    .out_shape = seq_out_shape,
    .stash_bytes = seq_stash_bytes,
    .wstash_bytes = seq_wstash_bytes,
    .scratch_bytes = seq_scratch_bytes,
    .fwd_flops = seq_fwd_flops,
    .bwd_flops = seq_bwd_flops,
    .forward = seq_forward,
    .backward_input = seq_backward_input,
    .backward_weight = seq_backward_weight,
    .tp_cost = seq_tp_cost,
    .backward = seq_backward,
};

static bg_status_t composite(const bg_layer_ops_t *ops, const char *name, int n, bg_layer_t **children,
                             bg_layer_t **layer_p)
{
    bg_status_t st = BG_OK;
    bg_layer_t *l = NULL;
    if (n < 1 || n > BG_SEQ_MAX) {
        st = bg_error(BG_ERR_INVALID, "composite layer %s: %d children (1..%d allowed)", name, n, BG_SEQ_MAX);
        goto err_free_children;
    }
    for (int i = 0; i < n; i++)
        if (!children[i]) {
            st = bg_error(BG_ERR_INVALID, "composite layer %s: child %d is NULL", name, i);
            goto err_free_children;
        }
    BG_CHECK_GOTO(bg_layer_create(ops, name, 0, NULL, NULL, &l), st, err_free_children);
    l->children = malloc((size_t)n * sizeof(*l->children));
    if (!l->children) {
        free(l);
        st = bg_error(BG_ERR_NOMEM, "composite layer %s", name);
        goto err_free_children;
    }
    memcpy(l->children, children, (size_t)n * sizeof(*children));
    l->nchildren = n;
    *layer_p = l;
    return BG_OK;
err_free_children:
    for (int i = 0; i < n; i++)
        bg_layer_destroy(children[i]);
    return st;
}

bg_status_t bg_layer_seq(const char *name, int n, bg_layer_t **children, bg_layer_t **layer_p)
{
    return composite(&seq_ops, name, n, children, layer_p);
}

/* ------------------------------------------------------------- residual */

static bg_status_t res_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    bg_shape_t o;
    BG_CHECK(bg_layer_out_shape(l->children[0], in, &o));
    if (o.n != in.n || o.t != in.t || o.c != in.c)
        return bg_error(BG_ERR_INVALID, "residual %s: inner output (%d,%d,%d) differs from input (%d,%d,%d)",
                        l->name, o.n, o.t, o.c, in.n, in.t, in.c);
    *out_p = o;
    return BG_OK;
}

static size_t res_act_bytes(bg_shape_t in) { return bg__align64(bg_shape_numel(in) * sizeof(float)); }
static size_t res_stash_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return res_act_bytes(in) + bg__align64(bg_layer_stash_bytes(l->children[0], in));
}
static size_t res_wstash_bytes(const bg_layer_t *l, bg_shape_t in) { return bg_layer_wstash_bytes(l->children[0], in); }
static size_t res_scratch_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return res_act_bytes(in) + bg__align64(bg_layer_scratch_bytes(l->children[0], in));
}
static double res_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    return bg_layer_fwd_flops(l->children[0], in) + (double)bg_shape_numel(in);
}
static double res_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    return bg_layer_bwd_flops(l->children[0], in) + (double)bg_shape_numel(in);
}

static bg_status_t res_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    float *fout = ctx->stash;
    bg_layer_ctx_t c = *ctx;
    c.stash = (char *)ctx->stash + res_act_bytes(ctx->in);
    c.scratch = (char *)ctx->scratch + res_act_bytes(ctx->in);
    BG_CHECK(l->children[0]->ops->forward(l->children[0], &c, in, fout));
    ctx->be->ops->residual_forward(ctx->be, out, in, fout, bg_shape_numel(ctx->in));
    return BG_OK;
}

static bg_status_t res_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                      const float *out, const float *dout, float *din)
{
    float *fout = ctx->stash;
    float *dfin = ctx->scratch;
    bg_layer_ctx_t c = *ctx;
    c.stash = (char *)ctx->stash + res_act_bytes(ctx->in);
    c.scratch = (char *)ctx->scratch + res_act_bytes(ctx->in);
    c.deferred = NULL; /* dfin is read at once */
    BG_CHECK(l->children[0]->ops->backward_input(l->children[0], &c, in, fout, dout, din ? dfin : NULL));
    if (din)
        ctx->be->ops->residual_forward(ctx->be, din, dout, dfin, bg_shape_numel(ctx->in));
    return BG_OK;
}

static bg_status_t res_backward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                const float *dout, float *din)
{
    (void)out;
    float *fout = ctx->stash;
    float *dfin = ctx->scratch;
    bg_layer_ctx_t c = *ctx;
    c.stash = (char *)ctx->stash + res_act_bytes(ctx->in);
    c.scratch = (char *)ctx->scratch + res_act_bytes(ctx->in);
    BG_CHECK(bg_layer_backward(l->children[0], &c, in, fout, dout, din ? dfin : NULL));
    if (din)
        ctx->be->ops->residual_forward(ctx->be, din, dout, dfin, bg_shape_numel(ctx->in));
    return BG_OK;
}

static bg_status_t res_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                       const float *out, const float *dout)
{
    if (!l->children[0]->ops->backward_weight)
        return BG_OK;
    bg_layer_ctx_t c = *ctx;
    c.stash = (char *)ctx->stash + res_act_bytes(ctx->in);
    c.scratch = (char *)ctx->scratch + res_act_bytes(ctx->in);
    return l->children[0]->ops->backward_weight(l->children[0], &c, in, ctx->stash, dout);
}

static void res_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    bg_layer_tp_cost(l->children[0], in, cost);
}

static const bg_layer_ops_t res_ops = {
    .type = "residual",
    .out_shape = res_out_shape,
    .stash_bytes = res_stash_bytes,
    .wstash_bytes = res_wstash_bytes,
    .scratch_bytes = res_scratch_bytes,
    .fwd_flops = res_fwd_flops,
    .bwd_flops = res_bwd_flops,
    .forward = res_forward,
    .backward_input = res_backward_input,
    .backward_weight = res_backward_weight,
    .tp_cost = res_tp_cost,
    .backward = res_backward,
};

bg_status_t bg_layer_residual(const char *name, bg_layer_t *child, bg_layer_t **layer_p)
{
    return composite(&res_ops, name, 1, &child, layer_p);
}

bg_tp_deferred_t *bg__layer_deferral(const bg_layer_t *l, const bg_layer_ctx_t *ctx, bg_tp_deferred_t *d)
{
    const bg_tp_comm_t *g = ctx->tp;
    d->n = 0;
    d->ncopy = 0;
    /* leaves only: a composite without ops->backward runs its children's input gradients back to back */
    return l->nchildren == 0 && l->ops->backward_weight && g && g->size > 1 && g->iallreduce && g->wait ? d : NULL;
}

bg_status_t bg__layer_wait_deferred(const bg_layer_ctx_t *ctx, bg_tp_deferred_t *d, bg_status_t st)
{
    for (int i = 0; d && i < d->n; i++) { /* every started collective, also after a failure */
        bg_status_t ws = ctx->tp->wait(ctx->tp->arg, d->req[i]);
        if (st == BG_OK)
            st = ws;
    }
    for (int i = 0; d && st == BG_OK && i < d->ncopy; i++)
        ctx->be->ops->copy(ctx->be, d->copy[i].dst, d->copy[i].src, d->copy[i].n);
    return st;
}

bg_status_t bg_layer_backward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                              const float *dout, float *din)
{
    if (l->ops->backward)
        return l->ops->backward(l, ctx, in, out, dout, din);
    bg_tp_deferred_t d, *dp = bg__layer_deferral(l, ctx, &d);
    bg_layer_ctx_t c = *ctx;
    c.deferred = dp;
    bg_status_t st = l->ops->backward_input(l, &c, in, out, dout, din);
    if (st == BG_OK && l->ops->backward_weight) {
        c.deferred = NULL;
        st = l->ops->backward_weight(l, &c, in, out, dout);
    }
    return bg__layer_wait_deferred(ctx, dp, st);
}

void bg_layer_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    if (l->ops->tp_cost)
        l->ops->tp_cost(l, in, cost);
}

int bg_layer_loss_classes(const bg_layer_t *l)
{
    return l && l->ops->loss_classes ? l->ops->loss_classes(l) : 0;
}
