/* models/layer.c: the generic layer functions (sizes, costs) and
 * the two composites, seq and residual, which split B and W exactly like
 * leaves so blocks need no hand-written backward.
 *
 * Buffer layouts (every piece rounded up to 64 bytes):
 *   seq      stash:   for child i: [out_i if i < k-1][stash_i]
 *            wstash:  for child i: [dout_i if i < k-1][wstash_i]
 *            scratch: max_i scratch_i
 *   residual stash:   [f_out][f.stash]      wstash: [f.wstash]
 *            scratch: [d f_in][f.scratch]
 * The output of the last child is the composite's own output (the caller's).
 *
 * Precision (bg_layer_set_precision): with BG_BF16 a composite keeps the
 * activations it owns (seq's out_i, residual's f_out) in bf16, half the bytes,
 * and hands its children fp32 copies in its scratch, so leaves compute in
 * fp32 and see only fp32 buffers:
 *   seq      scratch: [T0][T1][max_i scratch_i], T = the largest inner out_i in fp32
 *            forward: child i writes T[i mod 2], which is rounded through its bf16
 *            copy (stored, then read back) before child i+1 reads it;
 *            backward: child i gets in = T0 (out_{i-1} widened) and out = T1 (out_i)
 *   residual scratch: [A][B][f.scratch], A and B (n,t,c) fp32
 *            forward: f writes A, rounded as above, then out = in + A;
 *            backward: B = f_out widened, A = d f_in
 * So a child always reads the rounded value, forward and backward alike: a
 * bf16 composite computes exactly what the fp32 one computes with a rounding
 * (to bf16 and back) after each of those activations. Gradients stay fp32. */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/layer_impl.h"


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
 * activation (or gradient) between it and the next, @p elem bytes an element
 * (the stash's: the layer's precision; gradients: fp32), then its own part. */
static size_t seq_arena_bytes(const bg_layer_t *l, bg_shape_t in,
                              size_t (*child_bytes)(const bg_layer_t *, bg_shape_t), size_t elem)
{
    bg_shape_t s[BG_SEQ_MAX + 1];
    if (seq_shapes(l, in, s) != BG_OK)
        return 0;
    size_t total = 0;
    for (int i = 0; i < l->nchildren; i++) {
        if (i < l->nchildren - 1)
            total += bg__align64(bg_shape_numel(s[i + 1]) * elem);
        total += bg__align64(child_bytes(l->children[i], s[i]));
    }
    return total;
}
static size_t seq_stash_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return seq_arena_bytes(l, in, bg_layer_stash_bytes, bg_dtype_size(l->precision));
}
static size_t seq_wstash_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return seq_arena_bytes(l, in, bg_layer_wstash_bytes, sizeof(float));
}

/* bf16: bytes of one fp32 temporary, the largest inner activation (0 for fp32, or one child) */
static size_t seq_temp_bytes(const bg_layer_t *l, const bg_shape_t *s)
{
    size_t t = 0;
    for (int i = 1; l->precision == BG_BF16 && i < l->nchildren; i++) {
        size_t b = bg__align64(bg_shape_numel(s[i]) * sizeof(float));
        if (b > t)
            t = b;
    }
    return t;
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
    size_t t = seq_temp_bytes(l, s);
    return t ? 2 * t + m : m;
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
    float *out[BG_SEQ_MAX];     /* child i's output (i < k-1: in the stash, bf16 when the layer's precision is) */
    char *stash[BG_SEQ_MAX];
    float *dout[BG_SEQ_MAX];    /* child i's output gradient (i < k-1: in the wstash) */
    char *wstash[BG_SEQ_MAX];
    float *temp[2];             /* bf16: the two fp32 temporaries (NULL: fp32) */
    char *child_scratch;        /* the children's scratch */
} seq_frame_t;

static bg_status_t seq_frame(const bg_layer_t *l, const bg_layer_ctx_t *ctx, float *out, const float *dout,
                             seq_frame_t *f)
{
    BG_CHECK(seq_shapes(l, ctx->in, f->shape));
    char *sp = ctx->stash, *wp = ctx->wstash;
    int k = l->nchildren;
    size_t t = seq_temp_bytes(l, f->shape), es = bg_dtype_size(l->precision);
    f->temp[0] = t ? (float *)ctx->scratch : NULL;
    f->temp[1] = t ? (float *)((char *)ctx->scratch + t) : NULL;
    f->child_scratch = (char *)ctx->scratch + 2 * t;
    for (int i = 0; i < k; i++) {
        size_t n = bg_shape_numel(f->shape[i + 1]);
        if (i < k - 1) {
            f->out[i] = (float *)sp;
            sp += bg__align64(n * es);
            f->dout[i] = wp ? (float *)wp : NULL;
            if (wp)
                wp += bg__align64(n * sizeof(float));
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
    int k = l->nchildren;
    for (int i = 0; i < k; i++) {
        bg_layer_ctx_t c = *ctx;
        c.in = f.shape[i];
        c.stash = f.stash[i];
        c.wstash = NULL;
        c.scratch = f.child_scratch;
        int fused = 0; /* children i and i + 1: a linear and its GELU, in fp32 (bf16 keeps each output apart) */
        if (i + 1 < k && !f.temp[0])
            BG_CHECK(bg__linear_gelu_fused(l->children[i], l->children[i + 1], ctx, &fused));
        if (fused) {
            BG_CHECK(bg__linear_gelu_forward(l->children[i], &c, x, f.out[i], f.out[i + 1]));
            x = f.out[++i];
            continue;
        }
        float *y = f.temp[0] && i < k - 1 ? f.temp[i & 1] : f.out[i];
        BG_CHECK(l->children[i]->ops->forward(l->children[i], &c, x, y));
        if (y != f.out[i])
            bg__layer_keep_bf16(ctx->be, f.out[i], y, bg_shape_numel(f.shape[i + 1]));
        x = y;
    }
    return BG_OK;
}

/* Child i's backward context in frame f: its shape, stash, wstash and scratch; no deferral (the callers that
 * allow one set it). Its input *x_p and output *y_p in fp32: bf16 ones widened into the temporaries. */
static bg_layer_ctx_t seq_child_ctx(const bg_layer_t *l, const bg_layer_ctx_t *ctx, const seq_frame_t *f, int i,
                                    const float *in, const float **x_p, const float **y_p)
{
    bg_layer_ctx_t c = *ctx;
    c.in = f->shape[i];
    c.stash = f->stash[i];
    c.wstash = f->wstash[i];
    c.scratch = f->child_scratch;
    c.deferred = NULL;
    int k = l->nchildren;
    *x_p = i > 0 ? f->out[i - 1] : in;
    *y_p = f->out[i];
    if (f->temp[0]) {
        bg_backend_t *be = ctx->be;
        if (i > 0) {
            be->ops->convert(be, f->temp[0], BG_F32, f->out[i - 1], BG_BF16, bg_shape_numel(f->shape[i]));
            *x_p = f->temp[0];
        }
        if (i < k - 1) {
            be->ops->convert(be, f->temp[1], BG_F32, f->out[i], BG_BF16, bg_shape_numel(f->shape[i + 1]));
            *y_p = f->temp[1];
        }
    }
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
    /* a fused linear + GELU (seq_forward), when B and W run together: the GELU's input gradient also sums the
     * bias gradient, and the linear's weight gradient leaves it out. Not when they run apart: a B adds no
     * weight gradient (a program may run the B of microbatch 2 before the B of 1, only the W must keep
     * microbatch order: docs/schedules.md), so W sums the bias gradient as unfused. pair: the previous
     * iteration (child i + 1) was the GELU of a fused pair, so child i is its linear. */
    int pair = 0;
    for (int i = l->nchildren - 1; i >= 0; i--) {
        bg_layer_t *ch = l->children[i];
        int lin_of = pair, gelu_of = 0;
        pair = 0;
        if (!input && !ch->ops->backward_weight)
            continue;
        if (input && weight && i > 0 && !f.temp[0])
            BG_CHECK(bg__linear_gelu_fused(l->children[i - 1], ch, ctx, &gelu_of));
        const float *x, *y;
        bg_layer_ctx_t c = seq_child_ctx(l, ctx, &f, i, in, &x, &y);
        float *dx = i > 0 ? f.dout[i - 1] : din;
        if (gelu_of) {
            BG_CHECK(bg__linear_gelu_backward_act(l->children[i - 1], &c, x, f.dout[i], dx));
            pair = 1;
            continue;
        }
        if (lin_of) {
            BG_CHECK(ch->ops->backward_input(ch, &c, x, y, f.dout[i], dx));
            BG_CHECK(bg__linear_gelu_backward_weight(ch, &c, x, f.dout[i]));
            continue;
        }
        if (input && weight)
            BG_CHECK(bg_layer_backward(ch, &c, x, y, f.dout[i], dx));
        else if (input)
            BG_CHECK(ch->ops->backward_input(ch, &c, x, y, f.dout[i], dx));
        else
            BG_CHECK(ch->ops->backward_weight(ch, &c, x, y, f.dout[i]));
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
/* f_out as kept: fp32 or bf16 */
static size_t res_kept_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return bg__align64(bg_shape_numel(in) * bg_dtype_size(l->precision));
}
static int res_bf16(const bg_layer_t *l) { return l->precision == BG_BF16; }
static size_t res_stash_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return res_kept_bytes(l, in) + bg__align64(bg_layer_stash_bytes(l->children[0], in));
}
static size_t res_wstash_bytes(const bg_layer_t *l, bg_shape_t in) { return bg_layer_wstash_bytes(l->children[0], in); }
/* [d f_in][f.scratch]; bf16: [d f_in, or f_out in the forward][f_out widened][f.scratch] */
static size_t res_temps(const bg_layer_t *l, bg_shape_t in) { return (res_bf16(l) ? 2 : 1) * res_act_bytes(in); }
static size_t res_scratch_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return res_temps(l, in) + bg__align64(bg_layer_scratch_bytes(l->children[0], in));
}
static double res_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    return bg_layer_fwd_flops(l->children[0], in) + (double)bg_shape_numel(in);
}
static double res_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    return bg_layer_bwd_flops(l->children[0], in) + (double)bg_shape_numel(in);
}

/* The child's context (its stash after f_out, its scratch after the temporaries) and f_out in fp32: the
 * stash's own, or (bf16) widened into the second temporary. */
static bg_layer_ctx_t res_child_ctx(const bg_layer_t *l, const bg_layer_ctx_t *ctx, const float **fout_p)
{
    bg_layer_ctx_t c = *ctx;
    c.stash = (char *)ctx->stash + res_kept_bytes(l, ctx->in);
    c.scratch = (char *)ctx->scratch + res_temps(l, ctx->in);
    if (fout_p) {
        *fout_p = ctx->stash;
        if (res_bf16(l)) {
            float *b = (float *)((char *)ctx->scratch + res_act_bytes(ctx->in));
            ctx->be->ops->convert(ctx->be, b, BG_F32, ctx->stash, BG_BF16, bg_shape_numel(ctx->in));
            *fout_p = b;
        }
    }
    return c;
}

static bg_status_t res_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    bg_layer_ctx_t c = res_child_ctx(l, ctx, NULL);
    float *fout = res_bf16(l) ? ctx->scratch : ctx->stash;
    BG_CHECK(l->children[0]->ops->forward(l->children[0], &c, in, fout));
    if (res_bf16(l))
        bg__layer_keep_bf16(ctx->be, ctx->stash, fout, bg_shape_numel(ctx->in));
    ctx->be->ops->residual_forward(ctx->be, out, in, fout, bg_shape_numel(ctx->in));
    return BG_OK;
}

static bg_status_t res_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                      const float *out, const float *dout, float *din)
{
    const float *fout;
    float *dfin = ctx->scratch;
    bg_layer_ctx_t c = res_child_ctx(l, ctx, &fout);
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
    const float *fout;
    float *dfin = ctx->scratch;
    bg_layer_ctx_t c = res_child_ctx(l, ctx, &fout);
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
    const float *fout;
    bg_layer_ctx_t c = res_child_ctx(l, ctx, &fout);
    return l->children[0]->ops->backward_weight(l->children[0], &c, in, fout, dout);
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

bg_status_t bg_layer_set_precision(bg_layer_t *l, bg_dtype_t precision)
{
    if (!l || (precision != BG_F32 && precision != BG_BF16))
        return bg_error(BG_ERR_INVALID, "layer %s: precision %d is not fp32 (%d) or bf16 (%d)", l ? l->name : "NULL",
                        (int)precision, (int)BG_F32, (int)BG_BF16);
    l->precision = precision;
    for (int i = 0; i < l->nchildren; i++)
        BG_CHECK(bg_layer_set_precision(l->children[i], precision));
    return BG_OK;
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
