/* tests/models/test_layers.c: every layer's input and weight gradients
 * against central finite differences of a double-precision objective;
 * B + W against the fused backward; accumulation semantics; shape errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "bg_test_backend.h"
#include "../../examples/byom/user_layers.h"

/* All parameters of a layer tree, in walk order. */
typedef struct {
    bg_param_t *p[64];
    int n;
} plist_t;
static void walk(bg_layer_t *l, plist_t *pl)
{
    for (int i = 0; i < l->nparams; i++)
        pl->p[pl->n++] = &l->params[i];
    for (int i = 0; i < l->nchildren; i++)
        walk(l->children[i], pl);
}

typedef struct {
    bg_layer_t *l;
    bg_shape_t in, out;
    float *x;          /* input (NULL for tokens) */
    int32_t *tokens, *targets;
    float *y, *R;      /* output, objective weights */
    void *stash, *wstash, *scratch;
    plist_t pl;
    int loss;          /* head: objective = loss_scale * sum(losses) */
    float loss_scale;
} rig_t;

static float *falloc(size_t n) { return bg_backend_alloc(be, n * sizeof(float) + 64, "test"); }

static void rig_init(rig_t *r, bg_layer_t *l, bg_shape_t in, int vocab, int classes, bg_rng_t *rng, float wscale)
{
    memset(r, 0, sizeof(*r));
    r->l = l;
    r->in = in;
    assert_int_equal(bg_layer_out_shape(l, in, &r->out), BG_OK);
    size_t nin = bg_shape_numel(in), nout = bg_shape_numel(r->out);
    size_t rows = (size_t)in.n * in.t;
    if (in.c) {
        r->x = falloc(nin);
        for (size_t i = 0; i < nin; i++) {
            float v = (float)bg_rng_normal(rng);
            if (fabsf(v) < 0.1f) /* keep away from ReLU's kink */
                v = v < 0 ? -0.1f - v : 0.1f + v;
            r->x[i] = v;
        }
    } else {
        r->tokens = bg_backend_alloc(be, rows * sizeof(int32_t), "tokens");
        for (size_t i = 0; i < rows; i++)
            r->tokens[i] = (int32_t)bg_rng_below(rng, (uint64_t)vocab);
    }
    r->targets = bg_backend_alloc(be, rows * sizeof(int32_t), "targets");
    for (size_t i = 0; i < rows; i++)
        r->targets[i] = (int32_t)bg_rng_below(rng, (uint64_t)(classes > 1 ? classes : 2));
    r->y = falloc(nout);
    r->R = falloc(nout);
    for (size_t i = 0; i < nout; i++)
        r->R[i] = (float)bg_rng_normal(rng);
    r->stash = bg_backend_alloc(be, bg_layer_stash_bytes(l, in) + 64, "stash");
    r->wstash = bg_backend_alloc(be, bg_layer_wstash_bytes(l, in) + 64, "wstash");
    r->scratch = bg_backend_alloc(be, bg_layer_scratch_bytes(l, in) + 64, "scratch");
    walk(l, &r->pl);
    for (int i = 0; i < r->pl.n; i++) {
        bg_param_t *p = r->pl.p[i];
        p->data = falloc(p->numel);
        p->grad = falloc(p->numel);
        for (size_t j = 0; j < p->numel; j++) {
            double base = p->init == BG_INIT_CONST ? p->init_value : 0.0;
            p->data[j] = (float)(base + wscale * bg_rng_normal(rng));
            p->grad[j] = 0.0f;
        }
    }
    r->loss = bg_layer_loss_classes(l) > 0;
    r->loss_scale = 1.0f / (float)rows;
}

static void rig_free(rig_t *r)
{
    for (int i = 0; i < r->pl.n; i++) {
        bg_backend_free(be, r->pl.p[i]->data);
        bg_backend_free(be, r->pl.p[i]->grad);
    }
    bg_backend_free(be, r->x);
    bg_backend_free(be, r->tokens);
    bg_backend_free(be, r->targets);
    bg_backend_free(be, r->y);
    bg_backend_free(be, r->R);
    bg_backend_free(be, r->stash);
    bg_backend_free(be, r->wstash);
    bg_backend_free(be, r->scratch);
    bg_layer_destroy(r->l);
}

static bg_layer_ctx_t rig_ctx(rig_t *r)
{
    bg_layer_ctx_t c = {be, r->in, r->tokens, r->targets, r->loss_scale, r->stash, r->wstash, r->scratch, NULL, NULL, 0, NULL, NULL};
    return c;
}

static double objective(rig_t *r)
{
    bg_layer_ctx_t c = rig_ctx(r);
    assert_int_equal(r->l->ops->forward(r->l, &c, r->x, r->y), BG_OK);
    size_t n = bg_shape_numel(r->out);
    double j = 0;
    for (size_t i = 0; i < n; i++)
        j += r->loss ? (double)r->y[i] * r->loss_scale : (double)r->y[i] * r->R[i];
    return j;
}

/* Analytic gradients: din and parameter grads (zeroed first). */
static void analytic(rig_t *r, float *din)
{
    for (int i = 0; i < r->pl.n; i++)
        memset(r->pl.p[i]->grad, 0, r->pl.p[i]->numel * sizeof(float));
    objective(r);
    bg_layer_ctx_t c = rig_ctx(r);
    const float *dout = r->loss ? NULL : r->R;
    assert_int_equal(r->l->ops->backward_input(r->l, &c, r->x, r->y, dout, din), BG_OK);
    if (r->l->ops->backward_weight)
        assert_int_equal(r->l->ops->backward_weight(r->l, &c, r->x, r->y, dout), BG_OK);
}

/* Compare analytic vs central differences on up to `probes` entries of v. */
static double fd_error(rig_t *r, float *v, const float *g, size_t n, int probes, double eps, bg_rng_t *rng,
                       const char *what)
{
    double maxerr = 0, maxg = 1e-3;
    for (size_t i = 0; i < n; i++)
        maxg = fmax(maxg, fabs(g[i]));
    for (int k = 0; k < probes && k < (int)n; k++) {
        size_t i = (int)n <= probes ? (size_t)k : (size_t)bg_rng_below(rng, n);
        float save = v[i];
        v[i] = (float)(save + eps);
        double jp = objective(r);
        v[i] = (float)(save - eps);
        double jm = objective(r);
        v[i] = save;
        double fd = (jp - jm) / (2 * eps);
        double err = fabs(fd - g[i]) / maxg;
        if (err > maxerr)
            maxerr = err;
    }
    if (getenv("BG_TEST_VERBOSE") || maxerr > 2e-3)
        print_error("%s: layer %s: finite-difference error %.3g (max |grad| %.3g)\n", what, r->l->name, maxerr, maxg);
    return maxerr;
}

static void check_layer(bg_layer_t *l, bg_shape_t in, int vocab, int classes, uint64_t seed, double eps)
{
    bg_rng_t rng;
    bg_rng_seed(&rng, seed);
    rig_t r;
    rig_init(&r, l, in, vocab, classes, &rng, 0.3f);
    size_t nin = bg_shape_numel(in);
    float *din = in.c ? falloc(nin) : NULL;
    analytic(&r, din);
    /* copy the analytic gradients before FD (objective() does not touch them, but be safe) */
    if (din) {
        float *g = malloc(nin * sizeof(float));
        memcpy(g, din, nin * sizeof(float));
        assert_true(fd_error(&r, r.x, g, nin, 40, eps, &rng, "input") < 2e-3);
        free(g);
    }
    for (int i = 0; i < r.pl.n; i++) {
        bg_param_t *p = r.pl.p[i];
        float *g = malloc(p->numel * sizeof(float));
        memcpy(g, p->grad, p->numel * sizeof(float));
        char what[128];
        snprintf(what, sizeof(what), "param %s", p->name);
        assert_true(fd_error(&r, p->data, g, p->numel, 25, eps, &rng, what) < 2e-3);
        free(g);
    }
    /* W accumulates: a second backward_weight doubles every parameter gradient */
    if (r.pl.n && l->ops->backward_weight) {
        analytic(&r, din);
        bg_param_t *p = r.pl.p[0];
        float *g1 = malloc(p->numel * sizeof(float));
        memcpy(g1, p->grad, p->numel * sizeof(float));
        bg_layer_ctx_t c = rig_ctx(&r);
        assert_int_equal(l->ops->backward_weight(l, &c, r.x, r.y, r.loss ? NULL : r.R), BG_OK);
        for (size_t j = 0; j < p->numel; j++)
            assert_float_equal(p->grad[j], 2.0f * g1[j], 1e-5f * (1.0f + fabsf(g1[j])));
        free(g1);
    }
    bg_backend_free(be, din);
    rig_free(&r);
}

static void test_linear(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(bg_layer_linear("lin", 7, 5, 1, 0.3f, &l), BG_OK);
    check_layer(l, (bg_shape_t){3, 1, 7}, 0, 0, 1, 1e-2);
    assert_int_equal(bg_layer_linear("lin", 13, 1, 0, 0.3f, &l), BG_OK);
    check_layer(l, (bg_shape_t){1, 3, 13}, 0, 0, 2, 1e-2);
}

static void test_activations(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(bg_layer_activation("gelu", BG_ACT_GELU, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 3, 11}, 0, 0, 3, 1e-3);
    assert_int_equal(bg_layer_activation("relu", BG_ACT_RELU, &l), BG_OK);
    check_layer(l, (bg_shape_t){5, 1, 7}, 0, 0, 4, 1e-3);
}

static void test_layernorm(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(bg_layer_layernorm("ln", 13, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 3, 13}, 0, 0, 5, 1e-2);
    assert_int_equal(bg_layer_layernorm("ln1", 1, &l), BG_OK); /* C = 1: output is the bias */
    check_layer(l, (bg_shape_t){3, 1, 1}, 0, 0, 6, 1e-2);
}

static void test_embedding(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(bg_layer_embedding("emb", 11, 9, 6, 0.3f, &l), BG_OK);
    check_layer(l, (bg_shape_t){3, 7, 0}, 11, 0, 7, 1e-2);
}

static void test_attention(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(bg_layer_attention("attn", 12, 3, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 5, 36}, 0, 0, 8, 1e-2);
    assert_int_equal(bg_layer_attention("attn1", 4, 1, &l), BG_OK);
    check_layer(l, (bg_shape_t){1, 1, 12}, 0, 0, 9, 1e-2); /* T = 1 */
}

static void test_head(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(bg_layer_head("head", 9, 7, 1, 0.3f, &l), BG_OK);
    check_layer(l, (bg_shape_t){3, 2, 9}, 0, 7, 10, 1e-2);
    assert_int_equal(bg_layer_head("head2", 5, 13, 0, 0.3f, &l), BG_OK);
    check_layer(l, (bg_shape_t){1, 5, 5}, 0, 13, 11, 1e-2);
}

static void test_blocks(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(bg_layer_mlp_block("mlp", 8, 0.3f, 0.3f, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 3, 8}, 0, 0, 12, 1e-2);
    assert_int_equal(bg_layer_attention_block("attnb", 8, 2, 0.3f, 0.3f, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 5, 8}, 0, 0, 13, 1e-2);
    assert_int_equal(bg_layer_transformer_block("block", 12, 3, 0.3f, 0.3f, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 4, 12}, 0, 0, 14, 1e-2);
}

/* Layers defined outside brigade through the public interface (the byom
 * example's RMSNorm, SwiGLU and a block of them with built-in linears)
 * pass the same checks as the built-in ones. */
static void test_user_layers(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(byom_rmsnorm("rms", 13, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 3, 13}, 0, 0, 21, 1e-2);
    assert_int_equal(byom_swiglu("gate", 6, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 3, 12}, 0, 0, 22, 1e-3);
    assert_int_equal(byom_ffn_block("ffn", 8, 12, 0.3f, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 3, 8}, 0, 0, 23, 1e-2);
    bg_shape_t o;
    assert_int_equal(byom_rmsnorm("rms", 13, &l), BG_OK);
    assert_int_equal(bg_layer_out_shape(l, (bg_shape_t){2, 3, 12}, &o), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "rmsnorm rms: input has 12 channels, expected 13"));
    bg_layer_destroy(l);
}

/* ---- Llama-style layers ---- */

/* Forward of l on input x (n, t, c) into a new buffer (owned by the caller); l's parameters bound to host
 * buffers the caller filled (rig-less: one call). */
static float *forward_once(bg_layer_t *l, bg_shape_t in, const float *x)
{
    bg_shape_t o;
    assert_int_equal(bg_layer_out_shape(l, in, &o), BG_OK);
    float *y = falloc(bg_shape_numel(o));
    void *st = bg_backend_alloc(be, bg_layer_stash_bytes(l, in) + 64, "stash");
    void *sc = bg_backend_alloc(be, bg_layer_scratch_bytes(l, in) + 64, "scratch");
    bg_layer_ctx_t c = {be, in, NULL, NULL, 1.0f, st, NULL, sc, NULL, NULL, 0, NULL, NULL};
    assert_int_equal(l->ops->forward(l, &c, x, y), BG_OK);
    bg_backend_free(be, st);
    bg_backend_free(be, sc);
    return y;
}

/* Rotary grouped-query causal attention in double, written from its definition: head h reads key/value
 * head h / g; query and key pairs (i, i + hs/2) rotated by t theta^(-2i/hs). */
static void gqa_reference(double *out, const float *x, int B, int T, int H, int K, int hs, double theta)
{
    int g = H / K, Cin = K * (g + 2) * hs;
    double *q = malloc(sizeof(double) * hs), *k = malloc(sizeof(double) * hs), *w = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int j = h / g;
                const float *row = x + ((size_t)b * T + t) * Cin;
                const float *qh = row + ((size_t)j * (g + 2) + h % g) * hs;
                for (int i = 0; i < hs / 2; i++) {
                    double a = t * pow(theta, -2.0 * i / hs);
                    q[i] = qh[i] * cos(a) - qh[i + hs / 2] * sin(a);
                    q[i + hs / 2] = qh[i] * sin(a) + qh[i + hs / 2] * cos(a);
                }
                double mx = -1e300, sum = 0;
                for (int s2 = 0; s2 <= t; s2++) {
                    const float *kh = x + ((size_t)b * T + s2) * Cin + ((size_t)j * (g + 2) + g) * hs;
                    for (int i = 0; i < hs / 2; i++) {
                        double a = s2 * pow(theta, -2.0 * i / hs);
                        k[i] = kh[i] * cos(a) - kh[i + hs / 2] * sin(a);
                        k[i + hs / 2] = kh[i] * sin(a) + kh[i + hs / 2] * cos(a);
                    }
                    double d = 0;
                    for (int i = 0; i < hs; i++)
                        d += q[i] * k[i];
                    w[s2] = d / sqrt((double)hs);
                    mx = fmax(mx, w[s2]);
                }
                for (int s2 = 0; s2 <= t; s2++)
                    sum += (w[s2] = exp(w[s2] - mx));
                double *o = out + ((size_t)b * T + t) * H * hs + (size_t)h * hs;
                for (int i = 0; i < hs; i++) {
                    double acc = 0;
                    for (int s2 = 0; s2 <= t; s2++)
                        acc += w[s2] / sum * x[((size_t)b * T + s2) * Cin + ((size_t)j * (g + 2) + g + 1) * hs + i];
                    o[i] = acc;
                }
            }
    free(q);
    free(k);
    free(w);
}

static void check_gqa_forward(int B, int T, int H, int K, int hs, float theta, uint64_t seed)
{
    bg_layer_t *l;
    assert_int_equal(bg_layer_gqa_attention("attn", H, K, hs, theta, &l), BG_OK);
    bg_shape_t in = {B, T, K * (H / K + 2) * hs};
    bg_rng_t rng;
    bg_rng_seed(&rng, seed);
    float *x = falloc(bg_shape_numel(in));
    for (size_t i = 0; i < bg_shape_numel(in); i++)
        x[i] = (float)bg_rng_normal(&rng);
    float *y = forward_once(l, in, x);
    size_t n = (size_t)B * T * H * hs;
    double *ref = malloc(n * sizeof(double)), maxerr = 0;
    gqa_reference(ref, x, B, T, H, K, hs, theta);
    for (size_t i = 0; i < n; i++)
        maxerr = fmax(maxerr, fabs(y[i] - ref[i]));
    if (maxerr > 1e-5)
        print_error("gqa_attention B %d T %d H %d K %d hs %d: max error %.3g against the reference\n", B, T, H, K, hs,
                    maxerr);
    assert_true(maxerr < 1e-5);
    free(ref);
    bg_backend_free(be, x);
    bg_backend_free(be, y);
    bg_layer_destroy(l);
}

/* The library's RMSNorm and SwiGLU against the byom example's (written apart, as a user would) on the same
 * input and weights: the same function within float rounding. */
static void check_same_forward(bg_layer_t *lib, bg_layer_t *user, bg_shape_t in, uint64_t seed)
{
    bg_rng_t rng;
    bg_rng_seed(&rng, seed);
    float *x = falloc(bg_shape_numel(in));
    for (size_t i = 0; i < bg_shape_numel(in); i++)
        x[i] = (float)bg_rng_normal(&rng);
    for (int i = 0; i < lib->nparams; i++) {
        lib->params[i].data = user->params[i].data = falloc(lib->params[i].numel);
        for (size_t j = 0; j < lib->params[i].numel; j++)
            lib->params[i].data[j] = 1.0f + 0.3f * (float)bg_rng_normal(&rng);
    }
    float *a = forward_once(lib, in, x), *b = forward_once(user, in, x);
    bg_shape_t o;
    assert_int_equal(bg_layer_out_shape(lib, in, &o), BG_OK);
    for (size_t i = 0; i < bg_shape_numel(o); i++)
        assert_float_equal(a[i], b[i], 1e-5f * (1.0f + fabsf(b[i])));
    for (int i = 0; i < lib->nparams; i++)
        bg_backend_free(be, lib->params[i].data);
    bg_backend_free(be, x);
    bg_backend_free(be, a);
    bg_backend_free(be, b);
    bg_layer_destroy(lib);
    bg_layer_destroy(user);
}

static void test_llama_layers(void **s)
{
    (void)s;
    bg_layer_t *l, *u;
    assert_int_equal(bg_layer_rmsnorm("rms", 13, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 3, 13}, 0, 0, 31, 1e-2);
    assert_int_equal(bg_layer_swiglu("gate", 6, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 3, 12}, 0, 0, 32, 1e-3);
    assert_int_equal(bg_layer_rmsnorm("rms", 9, &l), BG_OK);
    assert_int_equal(byom_rmsnorm("rms", 9, &u), BG_OK);
    check_same_forward(l, u, (bg_shape_t){3, 2, 9}, 33);
    assert_int_equal(bg_layer_swiglu("gate", 7, &l), BG_OK);
    assert_int_equal(byom_swiglu("gate", 7, &u), BG_OK);
    check_same_forward(l, u, (bg_shape_t){3, 2, 14}, 34);
    /* grouped (4 query heads on 2 kv heads), one group (multi-query), no grouping, T = 1 */
    assert_int_equal(bg_layer_gqa_attention("attn", 4, 2, 4, 10000.0f, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 5, 2 * 4 * 4}, 0, 0, 35, 1e-2);
    assert_int_equal(bg_layer_gqa_attention("attn", 3, 1, 6, 100.0f, &l), BG_OK);
    check_layer(l, (bg_shape_t){1, 6, 5 * 6}, 0, 0, 36, 1e-2);
    assert_int_equal(bg_layer_gqa_attention("attn", 2, 2, 4, 10000.0f, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 4, 2 * 3 * 4}, 0, 0, 37, 1e-2);
    assert_int_equal(bg_layer_gqa_attention("attn", 2, 1, 2, 10000.0f, &l), BG_OK);
    check_layer(l, (bg_shape_t){1, 1, 4 * 2}, 0, 0, 38, 1e-2);
    check_gqa_forward(2, 7, 4, 2, 8, 10000.0f, 39);
    check_gqa_forward(1, 9, 3, 1, 4, 50.0f, 40);
    check_gqa_forward(2, 5, 2, 2, 6, 10000.0f, 41);
    assert_int_equal(bg_layer_token_embedding("emb", 11, 9, 6, 0.3f, &l), BG_OK);
    assert_int_equal(l->nparams, 1);
    check_layer(l, (bg_shape_t){3, 7, 0}, 11, 0, 42, 1e-2);
    bg_llama_block_t b = {16, 4, 2, 24, 10000.0f, 0.3f, 0.3f, NULL};
    assert_int_equal(bg_layer_llama_block("block", &b, 1, &l), BG_OK);
    check_layer(l, (bg_shape_t){2, 4, 16}, 0, 0, 43, 1e-2);
    /* sizes that cannot be built, named */
    assert_int_equal(bg_layer_gqa_attention("attn", 4, 3, 4, 10000.0f, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "kv_heads (3) must divide heads (4)"));
    assert_int_equal(bg_layer_gqa_attention("attn", 4, 2, 5, 10000.0f, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "head size 5 must be even"));
    assert_int_equal(bg_layer_llama_block("block", &b, 4, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "tp 4 must divide kv_heads (2)"));
}

/* ---- bf16 storage in composites ---- */

/* A reference layer: out = in rounded to bf16 (through its scratch), din = dout (straight through). */
static bg_status_t round_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *o)
{
    (void)l;
    *o = in;
    return BG_OK;
}
static size_t round_scratch(const bg_layer_t *l, bg_shape_t in) { (void)l; return bg_shape_numel(in) * 2; }
static bg_status_t round_fwd(bg_layer_t *l, const bg_layer_ctx_t *c, const float *in, float *out)
{
    (void)l;
    size_t n = bg_shape_numel(c->in);
    c->be->ops->convert(c->be, c->scratch, BG_BF16, in, BG_F32, n);
    c->be->ops->convert(c->be, out, BG_F32, c->scratch, BG_BF16, n);
    return BG_OK;
}
static bg_status_t round_bwd(bg_layer_t *l, const bg_layer_ctx_t *c, const float *in, const float *out,
                             const float *dout, float *din)
{
    (void)l, (void)in, (void)out;
    if (din)
        c->be->ops->copy(c->be, din, dout, bg_shape_numel(c->in));
    return BG_OK;
}
static const bg_layer_ops_t round_ops = {.type = "round_bf16", .out_shape = round_shape,
                                         .scratch_bytes = round_scratch, .forward = round_fwd,
                                         .backward_input = round_bwd};
static bg_layer_t *mk_round(void)
{
    bg_layer_t *l;
    assert_int_equal(bg_layer_create(&round_ops, "round", 0, NULL, NULL, &l), BG_OK);
    return l;
}

/* A leaf whose backward reads its output: out = 2 in, din = dout * out / in (= 2 dout). Doubling is exact
 * in bf16, so its output is the same rounded or not, and a composite that hands it a wrong output in the
 * backward (not the kept activation widened) gives other bits. Host pointers: the test backend is the CPU. */
static bg_status_t dbl_fwd(bg_layer_t *l, const bg_layer_ctx_t *c, const float *in, float *out)
{
    (void)l;
    for (size_t i = 0; i < bg_shape_numel(c->in); i++)
        out[i] = 2.0f * in[i];
    return BG_OK;
}
static bg_status_t dbl_bwd(bg_layer_t *l, const bg_layer_ctx_t *c, const float *in, const float *out,
                           const float *dout, float *din)
{
    (void)l;
    for (size_t i = 0; din && i < bg_shape_numel(c->in); i++)
        din[i] = dout[i] * (out[i] / in[i]);
    return BG_OK;
}
static const bg_layer_ops_t dbl_ops = {.type = "double", .out_shape = round_shape, .forward = dbl_fwd,
                                       .backward_input = dbl_bwd};
static bg_layer_t *mk_dbl(void)
{
    bg_layer_t *l;
    assert_int_equal(bg_layer_create(&dbl_ops, "double", 0, NULL, NULL, &l), BG_OK);
    return l;
}

/* seq(residual(seq(ln, fc, gelu, proj, double)), lin, double, gelu, lin2); with rounding layers after
 * every activation a composite keeps (round = 1) */
static bg_layer_t *mk_bf16_net(int c, int round)
{
    bg_layer_t *ln, *fc, *act, *proj, *lin, *act2, *lin2, *inner, *res, *net;
    assert_int_equal(bg_layer_layernorm("ln", c, &ln), BG_OK);
    assert_int_equal(bg_layer_linear("fc", c, 4 * c, 1, 0.3f, &fc), BG_OK);
    assert_int_equal(bg_layer_activation("gelu", BG_ACT_GELU, &act), BG_OK);
    assert_int_equal(bg_layer_linear("proj", 4 * c, c, 1, 0.3f, &proj), BG_OK);
    bg_layer_t *in1[10] = {ln, fc, act, proj, mk_dbl()}, *in2[10];
    int k = 5;
    if (round) {
        bg_layer_t *t[10] = {ln, mk_round(), fc, mk_round(), act, mk_round(), proj, mk_round(), in1[4], mk_round()};
        memcpy(in1, t, sizeof(t));
        k = 10;
    }
    assert_int_equal(bg_layer_seq("inner", k, in1, &inner), BG_OK);
    assert_int_equal(bg_layer_residual("res", inner, &res), BG_OK);
    assert_int_equal(bg_layer_linear("lin", c, 2 * c, 0, 0.3f, &lin), BG_OK);
    assert_int_equal(bg_layer_activation("gelu2", BG_ACT_GELU, &act2), BG_OK);
    assert_int_equal(bg_layer_linear("lin2", 2 * c, 3, 1, 0.3f, &lin2), BG_OK);
    if (round) {
        bg_layer_t *t[10] = {res, mk_round(), lin, mk_round(), mk_dbl(), mk_round(), act2, mk_round(), lin2};
        memcpy(in2, t, sizeof(t));
        k = 9;
    } else {
        bg_layer_t *t[10] = {res, lin, mk_dbl(), act2, lin2};
        memcpy(in2, t, sizeof(t));
        k = 5;
    }
    assert_int_equal(bg_layer_seq("net", k, in2, &net), BG_OK);
    if (!round)
        assert_int_equal(bg_layer_set_precision(net, BG_BF16), BG_OK);
    return net;
}

/* One forward and both backwards (B then W, and the fused one) of r; y, din and the gradients into host
 * copies (out: y, din, then every parameter's gradient of the split and then of the fused backward). */
static size_t run_rig(rig_t *r, float *din, float *host)
{
    size_t k = 0, nout = bg_shape_numel(r->out), nin = bg_shape_numel(r->in);
    analytic(r, din);
    memcpy(host + k, r->y, nout * sizeof(float)), k += nout;
    memcpy(host + k, din, nin * sizeof(float)), k += nin;
    for (int i = 0; i < r->pl.n; i++)
        memcpy(host + k, r->pl.p[i]->grad, r->pl.p[i]->numel * sizeof(float)), k += r->pl.p[i]->numel;
    for (int i = 0; i < r->pl.n; i++)
        memset(r->pl.p[i]->grad, 0, r->pl.p[i]->numel * sizeof(float));
    objective(r);
    bg_layer_ctx_t c = rig_ctx(r);
    assert_int_equal(bg_layer_backward(r->l, &c, r->x, r->y, r->R, din), BG_OK);
    memcpy(host + k, din, nin * sizeof(float)), k += nin;
    for (int i = 0; i < r->pl.n; i++)
        memcpy(host + k, r->pl.p[i]->grad, r->pl.p[i]->numel * sizeof(float)), k += r->pl.p[i]->numel;
    return k;
}

/* A bf16 composite computes exactly what the fp32 one computes with a rounding layer after each
 * activation it keeps (layer.c's header): the output, the input gradient and every parameter gradient
 * bitwise, split and fused backward alike (the built-in leaves here read their input in the backward,
 * the doubling leaf its output too).
 * Its stash holds those activations in 2 bytes each, and its scratch the fp32 temporaries: both equal
 * closed forms written from the leaves' own sizes. (No finite differences here: the rounded function is
 * a staircase at bf16's resolution; the rounding layer's reference is fp32, checked by the tests above.) */
static void test_bf16_composites(void **s)
{
    (void)s;
    int c = 8;
    bg_shape_t in = {2, 3, c};
    bg_layer_t *b = mk_bf16_net(c, 0), *ref = mk_bf16_net(c, 1);
    rig_t rb, rr;
    bg_rng_t g1, g2;
    bg_rng_seed(&g1, 31);
    bg_rng_seed(&g2, 31);
    rig_init(&rb, b, in, 0, 0, &g1, 0.3f);
    rig_init(&rr, ref, in, 0, 0, &g2, 0.3f);
    assert_int_equal(rb.pl.n, rr.pl.n);
    size_t total = bg_shape_numel(rb.out) + 2 * bg_shape_numel(in) + 2 * bg_layer_param_count(b);
    float *hb = malloc(total * sizeof(float)), *hr = malloc(total * sizeof(float));
    float *db = falloc(bg_shape_numel(in)), *dr = falloc(bg_shape_numel(in));
    assert_int_equal(run_rig(&rb, db, hb), total);
    assert_int_equal(run_rig(&rr, dr, hr), total);
    assert_memory_equal(hb, hr, total * sizeof(float));
    /* and it is not the fp32 result: the rounding happened */
    bg_layer_set_precision(b, BG_F32);
    float *hf = malloc(total * sizeof(float));
    rb.stash = (bg_backend_free(be, rb.stash), bg_backend_alloc(be, bg_layer_stash_bytes(b, in) + 64, "stash"));
    run_rig(&rb, db, hf);
    assert_memory_not_equal(hb, hf, total * sizeof(float));
    bg_layer_set_precision(b, BG_BF16);

    /* sizes: N rows of c channels; the leaves' own stash and scratch */
    size_t N = (size_t)in.n * in.t;
#define A64(x) (((x) + 63) & ~(size_t)63)
    bg_layer_t *inner = b->children[0]->children[0];
    bg_shape_t s4 = {in.n, in.t, 4 * c};
    size_t leaves = 0, mscr = 0;
    bg_shape_t ins[5] = {in, in, s4, s4, in};
    for (int i = 0; i < 5; i++) {
        leaves += A64(bg_layer_stash_bytes(inner->children[i], ins[i]));
        size_t x = bg_layer_scratch_bytes(inner->children[i], ins[i]);
        mscr = x > mscr ? x : mscr;
    }
    size_t inner_stash = 2 * A64(N * c * 2) + 2 * A64(N * 4 * c * 2) + leaves;
    assert_int_equal(bg_layer_stash_bytes(inner, in), inner_stash);
    assert_int_equal(bg_layer_scratch_bytes(inner, in), 2 * A64(N * 4 * c * 4) + mscr);
    size_t res_stash = A64(N * c * 2) + A64(inner_stash);
    assert_int_equal(bg_layer_stash_bytes(b->children[0], in), res_stash);
    assert_int_equal(bg_layer_scratch_bytes(b->children[0], in), 2 * A64(N * c * 4) + A64(2 * A64(N * 4 * c * 4) + mscr));
    size_t outer = A64(N * c * 2) + 3 * A64(N * 2 * c * 2) + A64(res_stash);
    assert_int_equal(bg_layer_stash_bytes(b, in), outer);
#undef A64
    bg_backend_free(be, db);
    bg_backend_free(be, dr);
    free(hb), free(hr), free(hf);
    rig_free(&rb);
    rig_free(&rr);

    bg_layer_t *l;
    assert_int_equal(bg_layer_linear("x", 2, 2, 0, 0.1f, &l), BG_OK);
    assert_int_equal(bg_layer_set_precision(l, (bg_dtype_t)7), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "precision 7 is not fp32"));
    bg_layer_destroy(l);
}

static void test_bad_shapes(void **s)
{
    (void)s;
    bg_layer_t *l;
    bg_shape_t o;
    assert_int_equal(bg_layer_attention("a", 10, 3, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "heads (3) must divide d_model (10)"));
    assert_int_equal(bg_layer_transformer_block("b", 10, 4, 0.02f, 0.02f, &l), BG_ERR_INVALID);
    assert_int_equal(bg_layer_linear("lin", 4, 3, 1, 0.1f, &l), BG_OK);
    assert_int_equal(bg_layer_out_shape(l, (bg_shape_t){2, 1, 5}, &o), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "lin"));
    bg_layer_destroy(l);
    assert_int_equal(bg_layer_embedding("e", 10, 8, 4, 0.1f, &l), BG_OK);
    assert_int_equal(bg_layer_out_shape(l, (bg_shape_t){1, 9, 0}, &o), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "exceeds"));
    bg_layer_destroy(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),    cmocka_unit_test(test_activations), cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_embedding), cmocka_unit_test(test_attention),   cmocka_unit_test(test_head),
        cmocka_unit_test(test_blocks),    cmocka_unit_test(test_user_layers), cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_bf16_composites), cmocka_unit_test(test_llama_layers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
