/* examples/byom/user_layers.c: RMSNorm and SwiGLU as user-defined layers
 * (see user_layers.h). Each fills a bg_layer_ops_t: the output shape, the
 * bytes it keeps (stash: from F to the end of the backward; wstash: from B
 * to W; scratch: during one call), its FLOPs, and the three compute
 * functions F, B (din from dout, assigned) and W (weight gradients,
 * accumulated). brigade allocates every buffer from those sizes, so the
 * planner, the memory model and checkpoints work for these layers as for
 * its own. brigade has the same two layers built in (bg_layer_rmsnorm,
 * bg_layer_swiglu, on the backends' kernels, docs/layers.md); these stay as
 * the demonstration of writing a layer on the host, and test_layers checks
 * that both give the same outputs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "user_layers.h"

#define RMS_EPS 1e-5f

/* ------------------------------------------------------------------ RMSNorm */

typedef struct {
    int c;
} rms_t;

static bg_status_t rms_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const rms_t *p = l->impl;
    if (in.c != p->c)
        return bg_error(BG_ERR_INVALID, "rmsnorm %s: input has %d channels, expected %d", l->name, in.c, p->c);
    *out_p = in;
    return BG_OK;
}
/* stash: one reciprocal RMS per row */
static size_t rms_stash(const bg_layer_t *l, bg_shape_t in)
{
    (void)l;
    return (size_t)in.n * (size_t)in.t * sizeof(float);
}
static double rms_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    (void)l;
    return 4.0 * (double)bg_shape_numel(in);
}
static double rms_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    (void)l;
    return 8.0 * (double)bg_shape_numel(in);
}

static bg_status_t rms_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    const rms_t *p = l->impl;
    const float *w = l->params[0].data;
    float *rstd = ctx->stash;
    size_t rows = (size_t)ctx->in.n * (size_t)ctx->in.t;
    for (size_t r = 0; r < rows; r++) {
        const float *x = in + r * (size_t)p->c;
        float *y = out + r * (size_t)p->c;
        float ss = 0;
        for (int i = 0; i < p->c; i++)
            ss += x[i] * x[i];
        float s = 1.0f / sqrtf(ss / (float)p->c + RMS_EPS);
        rstd[r] = s;
        for (int i = 0; i < p->c; i++)
            y[i] = x[i] * s * w[i];
    }
    return BG_OK;
}

/* dx = s * (w*dy - xhat * mean(w*dy*xhat)), xhat = x * s */
static bg_status_t rms_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout, float *din)
{
    (void)out;
    const rms_t *p = l->impl;
    if (!din)
        return BG_OK;
    const float *w = l->params[0].data, *rstd = ctx->stash;
    size_t rows = (size_t)ctx->in.n * (size_t)ctx->in.t;
    for (size_t r = 0; r < rows; r++) {
        const float *x = in + r * (size_t)p->c, *dy = dout + r * (size_t)p->c;
        float *dx = din + r * (size_t)p->c, s = rstd[r], dot = 0;
        for (int i = 0; i < p->c; i++)
            dot += w[i] * dy[i] * x[i] * s;
        dot /= (float)p->c;
        for (int i = 0; i < p->c; i++)
            dx[i] = s * (w[i] * dy[i] - x[i] * s * dot);
    }
    return BG_OK;
}

/* dw += sum over rows of dy * xhat (rows in order: the same bits for any split) */
static bg_status_t rms_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                       const float *dout)
{
    (void)out;
    const rms_t *p = l->impl;
    float *dw = l->params[0].grad;
    const float *rstd = ctx->stash;
    size_t rows = (size_t)ctx->in.n * (size_t)ctx->in.t;
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < p->c; i++)
            dw[i] += dout[r * (size_t)p->c + (size_t)i] * in[r * (size_t)p->c + (size_t)i] * rstd[r];
    return BG_OK;
}

static void free_impl(bg_layer_t *l) { free(l->impl); }

static const bg_layer_ops_t rms_ops = {
    .type = "rmsnorm",
    .out_shape = rms_out_shape,
    .stash_bytes = rms_stash,
    .fwd_flops = rms_fwd_flops,
    .bwd_flops = rms_bwd_flops,
    .forward = rms_forward,
    .backward_input = rms_backward_input,
    .backward_weight = rms_backward_weight,
    .destroy = free_impl,
};

bg_status_t byom_rmsnorm(const char *name, int c, bg_layer_t **layer_p)
{
    if (c < 1)
        return bg_error(BG_ERR_INVALID, "rmsnorm %s: %d channels", name, c);
    rms_t *p = malloc(sizeof(*p));
    if (!p)
        return bg_error(BG_ERR_NOMEM, "rmsnorm %s", name);
    p->c = c;
    bg_param_t w;
    memset(&w, 0, sizeof(w));
    strcpy(w.name, "weight");
    w.ndim = 1;
    w.shape[0] = c;
    w.numel = (size_t)c;
    w.init = BG_INIT_CONST;
    w.init_value = 1.0f;
    bg_status_t st = bg_layer_create(&rms_ops, name, 1, &w, p, layer_p);
    if (st != BG_OK)
        free(p);
    return st;
}

/* ------------------------------------------------------------------ SwiGLU */

typedef struct {
    int h;
} swiglu_t;

static bg_status_t swiglu_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    const swiglu_t *p = l->impl;
    if (in.c != 2 * p->h)
        return bg_error(BG_ERR_INVALID, "swiglu %s: input has %d channels, expected 2 x %d", l->name, in.c, p->h);
    *out_p = (bg_shape_t){in.n, in.t, p->h};
    return BG_OK;
}
static double swiglu_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    (void)l;
    return 3.0 * (double)bg_shape_numel(in);
}
static double swiglu_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    (void)l;
    return 6.0 * (double)bg_shape_numel(in);
}

static float sigmoidf(float a) { return 1.0f / (1.0f + expf(-a)); }

static bg_status_t swiglu_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    int h = ((const swiglu_t *)l->impl)->h;
    size_t rows = (size_t)ctx->in.n * (size_t)ctx->in.t;
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < h; i++) {
            float a = in[r * 2 * (size_t)h + (size_t)i], b = in[r * 2 * (size_t)h + (size_t)h + (size_t)i];
            out[r * (size_t)h + (size_t)i] = a * sigmoidf(a) * b;
        }
    return BG_OK;
}

/* d a = dy * b * silu'(a), d b = dy * silu(a); silu'(a) = s + a s (1 - s) */
static bg_status_t swiglu_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                         const float *dout, float *din)
{
    (void)out;
    if (!din)
        return BG_OK;
    int h = ((const swiglu_t *)l->impl)->h;
    size_t rows = (size_t)ctx->in.n * (size_t)ctx->in.t;
    for (size_t r = 0; r < rows; r++)
        for (int i = 0; i < h; i++) {
            size_t ia = r * 2 * (size_t)h + (size_t)i, ib = ia + (size_t)h;
            float a = in[ia], b = in[ib], s = sigmoidf(a), dy = dout[r * (size_t)h + (size_t)i];
            din[ia] = dy * b * (s + a * s * (1.0f - s));
            din[ib] = dy * a * s;
        }
    return BG_OK;
}

static const bg_layer_ops_t swiglu_ops = {
    .type = "swiglu",
    .out_shape = swiglu_out_shape,
    .fwd_flops = swiglu_fwd_flops,
    .bwd_flops = swiglu_bwd_flops,
    .forward = swiglu_forward,
    .backward_input = swiglu_backward_input,
    .destroy = free_impl,
};

bg_status_t byom_swiglu(const char *name, int h, bg_layer_t **layer_p)
{
    if (h < 1)
        return bg_error(BG_ERR_INVALID, "swiglu %s: %d channels", name, h);
    swiglu_t *p = malloc(sizeof(*p));
    if (!p)
        return bg_error(BG_ERR_NOMEM, "swiglu %s", name);
    p->h = h;
    bg_status_t st = bg_layer_create(&swiglu_ops, name, 0, NULL, p, layer_p);
    if (st != BG_OK)
        free(p);
    return st;
}

/* ------------------------------------------------------------------ the block */

bg_status_t byom_ffn_block(const char *name, int c, int h, float init_std, bg_layer_t **layer_p)
{
    bg_layer_t *ch[4] = {NULL, NULL, NULL, NULL}, *seq = NULL;
    bg_status_t st = byom_rmsnorm("norm", c, &ch[0]);
    if (st == BG_OK)
        st = bg_layer_linear("up", c, 2 * h, 0, init_std, &ch[1]);
    if (st == BG_OK)
        st = byom_swiglu("gate", h, &ch[2]);
    if (st == BG_OK)
        st = bg_layer_linear("down", h, c, 0, init_std, &ch[3]);
    if (st != BG_OK) {
        for (int i = 0; i < 4; i++)
            bg_layer_destroy(ch[i]);
        return st;
    }
    /* the composites take ownership of their children, also on failure */
    if ((st = bg_layer_seq("ffn", 4, ch, &seq)) != BG_OK)
        return st;
    return bg_layer_residual(name, seq, layer_p);
}
