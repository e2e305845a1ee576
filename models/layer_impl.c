/* models/layer_impl.c: what the layer files share (models/layer_impl.h),
 * so that calls between them go one way: layer.c (the generic functions and
 * the composites), layers.c (the built-in leaves) and tp_layers.c (the
 * tensor-parallel leaves and the blocks) call in here, and this file calls
 * none of them. It owns a leaf's lifetime (bg_layer_create and
 * bg_layer_destroy, public, and bg__make_leaf), the shape checks, the
 * linear layer and the activation (the parallel linears reuse the linear's
 * math; seq fuses a linear with a GELU), the head's sizes and costs, and the
 * fused backward's deferral of tensor-parallel sums. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/layer_impl.h"

#define ROWS(s) ((s).n * (s).t)

size_t bg__align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* ------------------------------------------------------------- lifetime */

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

void bg__free_impl(bg_layer_t *l) { free(l->impl); }

/* -------------------------------------------------------- sizes, buffers */

bg_status_t bg__shape_err(const bg_layer_t *l, bg_shape_t in, const char *want)
{
    return bg_error(BG_ERR_INVALID, "layer %s (%s): input shape (%d,%d,%d) but %s", l->name, l->ops->type,
                    in.n, in.t, in.c, want);
}

bg_status_t bg__want_channels(const bg_layer_t *l, bg_shape_t in, int c)
{
    if (in.c == c && in.n >= 1 && in.t >= 1)
        return BG_OK;
    char want[64];
    snprintf(want, sizeof(want), "%d channels are expected", c);
    return bg__shape_err(l, in, want);
}

size_t bg__layer_out_bytes(const bg_layer_t *l, bg_shape_t in)
{
    bg_shape_t out;
    if (l->ops->out_shape(l, in, &out) != BG_OK)
        return 0;
    return bg__align64(bg_shape_numel(out) * sizeof(float));
}

/* Keep the fp32 activation @p x (n elements) in the bf16 buffer @p kept, and round @p x to what is kept,
 * so that every reader sees the same value (layer.c's header). */
void bg__layer_keep_bf16(bg_backend_t *be, void *kept, float *x, size_t n)
{
    be->ops->convert(be, kept, BG_BF16, x, BG_F32, n);
    be->ops->convert(be, x, BG_F32, kept, BG_BF16, n);
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

/* --------------------------------------------------------------- linear */


bg_status_t bg__linear_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const bg__linear_t *p = l->impl;
    BG_CHECK(bg__want_channels(l, in, p->c_in));
    *out_p = (bg_shape_t){in.n, in.t, p->c_out};
    return BG_OK;
}
double bg__linear_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const bg__linear_t *p = l->impl;
    return 2.0 * ROWS(in) * p->c_in * p->c_out;
}
double bg__linear_bwd_flops(const bg_layer_t *l, bg_shape_t in) { return 2.0 * bg__linear_fwd_flops(l, in); }

/* out = in W^T, without the bias */
static void linear_gemm(const bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const bg__linear_t *p = l->impl;
    ctx->be->ops->gemm(ctx->be, 0, 1, ROWS(ctx->in), p->c_out, p->c_in, 1.0f, in, p->c_in, l->params[0].data, p->c_in,
                       0.0f, out, p->c_out);
}

static bg_status_t linear_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const bg__linear_t *p = l->impl;
    linear_gemm(l, ctx, in, out);
    if (p->bias)
        ctx->be->ops->bias_forward(ctx->be, out, l->params[1].data, ROWS(ctx->in), p->c_out);
    return BG_OK;
}

static bg_status_t linear_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in,
                                         const float *out, const float *dout, float *din)
{
    const bg__linear_t *p = l->impl;
    if (din)
        ctx->be->ops->gemm(ctx->be, 0, 0, ROWS(ctx->in), p->c_in, p->c_out, 1.0f, dout, p->c_out,
                           l->params[0].data, p->c_in, 0.0f, din, p->c_in);
    return BG_OK;
}

/* dW += dout^T in, without the bias gradient */
static void linear_wgrad_gemm(const bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *dout)
{
    const bg__linear_t *p = l->impl;
    ctx->be->ops->gemm(ctx->be, 1, 0, p->c_out, p->c_in, ROWS(ctx->in), 1.0f, dout, p->c_out, in, p->c_in, 1.0f,
                       l->params[0].grad, p->c_in);
}

bg_status_t bg__linear_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout)
{
    const bg__linear_t *p = l->impl;
    linear_wgrad_gemm(l, ctx, in, dout);
    if (p->bias)
        ctx->be->ops->bias_backward(ctx->be, l->params[1].grad, dout, ROWS(ctx->in), p->c_out);
    return BG_OK;
}


const bg_layer_ops_t bg__linear_ops = {
    .type = "linear",
    .out_shape = bg__linear_out_shape,
    .fwd_flops = bg__linear_fwd_flops,
    .bwd_flops = bg__linear_bwd_flops,
    .forward = linear_forward,
    .backward_input = linear_backward_input,
    .backward_weight = bg__linear_backward_weight,
    .destroy = bg__free_impl,
};

/* ----------------------------------------------------------- activation */

static bg_status_t same_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    if (in.c < 1 || in.n < 1 || in.t < 1)
        return bg__shape_err(l, in, "a float activation is expected");
    *out_p = in;
    return BG_OK;
}
static double act_flops(const bg_layer_t *l, bg_shape_t in) { return 8.0 * (double)bg_shape_numel(in); }

static bg_status_t act_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const bg__act_t *p = l->impl;
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
    const bg__act_t *p = l->impl;
    size_t n = bg_shape_numel(ctx->in);
    if (!din)
        return BG_OK;
    if (p->kind == BG_ACT_GELU)
        ctx->be->ops->gelu_backward(ctx->be, din, in, dout, n);
    else
        ctx->be->ops->relu_backward(ctx->be, din, in, dout, n);
    return BG_OK;
}

const bg_layer_ops_t bg__act_ops = {
    .type = "activation",
    .out_shape = same_shape,
    .fwd_flops = act_flops,
    .bwd_flops = act_flops,
    .forward = act_forward,
    .backward_input = act_backward_input,
    .destroy = bg__free_impl,
};

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
    if (lin->ops != &bg__linear_ops || act->ops != &bg__act_ops)
        return BG_OK;
    int on;
    BG_CHECK(bg__layer_fuse_setting(&on));
    const bg__linear_t *p = lin->impl;
    const bg__act_t *a = act->impl;
    const bg_backend_ops_t *o = ctx->be->ops;
    *fused_p = on && p->bias && a->kind == BG_ACT_GELU && o->bias_gelu_forward && o->gelu_bias_backward &&
               (!ctx->tp || ctx->tp->size <= 1);
    return BG_OK;
}

bg_status_t bg__linear_gelu_forward(bg_layer_t *lin, const bg_layer_ctx_t *ctx, const float *in, float *pre, float *out)
{
    const bg__linear_t *p = lin->impl;
    linear_gemm(lin, ctx, in, pre);
    ctx->be->ops->bias_gelu_forward(ctx->be, pre, out, lin->params[1].data, ROWS(ctx->in), p->c_out);
    return BG_OK;
}

bg_status_t bg__linear_gelu_backward_act(bg_layer_t *lin, const bg_layer_ctx_t *act_ctx, const float *pre,
                                         const float *dout, float *dpre)
{
    const bg__linear_t *p = lin->impl;
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

/* ----------------------------------------------------------------- head */

bg_status_t bg__head_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const bg__head_t *p = l->impl;
    BG_CHECK(bg__want_channels(l, in, p->c));
    *out_p = (bg_shape_t){in.n, in.t, 1};
    return BG_OK;
}
size_t bg__head_probs_bytes(const bg_layer_t *l, bg_shape_t in)
{
    return bg__align64((size_t)ROWS(in) * (size_t)((bg__head_t *)l->impl)->classes * sizeof(float));
}
/* stash: probs (N, V); wstash: dlogits (N, V); scratch: logits (N, V) */
double bg__head_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const bg__head_t *p = l->impl;
    return 2.0 * ROWS(in) * (double)p->c * p->classes + 5.0 * ROWS(in) * (double)p->classes;
}
double bg__head_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const bg__head_t *p = l->impl;
    return 4.0 * ROWS(in) * (double)p->c * p->classes + 2.0 * ROWS(in) * (double)p->classes;
}
