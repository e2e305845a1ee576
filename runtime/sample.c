/* runtime/sample.c: sampling tokens from a whole token model (GPT, Llama) (bg_generate, bg_generate_with).
 *
 * Owns: running the model's trunk (every layer but the head) on the context,
 * the head's logits for the last position, greedy / temperature / top-k
 * sampling, and the key/value cache's use: when the trunk's attention leaves
 * are all gqa_attention and no layer has a position table, the prompt runs
 * once and each new token one position (models/llama_layers.c keeps the
 * keys and values); otherwise, or once the context passes seq_len, each token
 * costs one forward of the context (at most seq_len). Must not: modify the
 * model (it runs a copy of the trunk, whose layers hold the cache). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/checkpoint.h"
#include "core/check.h"
#include "models/layer_impl.h"

typedef struct {
    double logit;
    int id;
} cand_t;

static int cmp_cand(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* Pick a token from logits (V): greedy when temperature <= 0. */
static int pick(const double *logits, int V, float temperature, int top_k, bg_rng_t *rng, cand_t *c)
{
    if (!(temperature > 0)) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best])
                best = v;
        return best;
    }
    for (int v = 0; v < V; v++)
        c[v] = (cand_t){logits[v], v};
    qsort(c, (size_t)V, sizeof(*c), cmp_cand);
    int k = top_k > 0 && top_k < V ? top_k : V;
    double sum = 0, top = c[0].logit; /* kept: c[0].logit becomes its weight in the first pass */
    for (int i = 0; i < k; i++) {
        c[i].logit = exp((c[i].logit - top) / temperature);
        sum += c[i].logit;
    }
    double u = bg_rng_uniform(rng) * sum, acc = 0;
    for (int i = 0; i < k; i++) {
        acc += c[i].logit;
        if (u < acc)
            return c[i].id;
    }
    return c[k - 1].id;
}

/* Can the trunk decode with a cache? *ok_p: it has gqa_attention leaves, no other attention and no position
 * table (a layer's "wpe"). */
static void cache_scan(const bg_layer_t *l, int *gqa, int *other)
{
    if (bg__layer_is_gqa(l))
        (*gqa)++;
    else if (!strcmp(l->ops->type, "attention"))
        (*other)++;
    for (int i = 0; i < l->nparams; i++)
        if (!strcmp(l->params[i].name, "wpe"))
            (*other)++;
    for (int i = 0; i < l->nchildren; i++)
        cache_scan(l->children[i], gqa, other);
}

/* Attach (on) or detach (off) a cache of cap positions to every gqa_attention leaf under l. */
static bg_status_t cache_set(bg_layer_t *l, bg_backend_t *be, int cap, int on)
{
    if (bg__layer_is_gqa(l)) {
        if (!on) {
            bg__gqa_cache_detach(l, be);
            return BG_OK;
        }
        return bg__gqa_cache_attach(l, be, cap);
    }
    for (int i = 0; i < l->nchildren; i++)
        BG_CHECK(cache_set(l->children[i], be, cap, on));
    return BG_OK;
}

bg_status_t bg_generate(bg_model_t *full, const int32_t *prompt, int n, int ntokens, float temperature, int top_k,
                        uint64_t seed, int32_t *out)
{
    bg_generate_params_t p = BG_GENERATE_PARAMS_INIT;
    p.temperature = temperature;
    p.top_k = top_k;
    p.seed = seed;
    return bg_generate_with(full, prompt, n, ntokens, &p, out);
}

bg_status_t bg_generate_with(bg_model_t *full, const int32_t *prompt, int n, int ntokens,
                             const bg_generate_params_t *params, int32_t *out)
{
    bg_generate_params_t gp = BG_GENERATE_PARAMS_INIT;
    if (params) {
        memcpy(&gp, params, params->size < sizeof(gp) ? params->size : sizeof(gp));
        gp.size = sizeof(gp);
    }
    float temperature = gp.temperature;
    int top_k = gp.top_k;
    if (!full || !prompt || !out)
        return bg_error(BG_ERR_INVALID, "bg_generate: model, prompt and out must not be NULL");
    const bg_model_desc_t *desc = bg_model_desc(full);
    const bg_model_desc_params_t *mp = bg_model_desc_params(desc);
    int total = bg_model_total_layers(full);
    if (mp->input != BG_INPUT_TOKENS || total < 2)
        return bg_error(BG_ERR_INVALID, "bg_generate needs a token model whose last layer is the output head");
    if (bg_model_first_layer(full) != 0 || bg_model_last_layer(full) != total - 1)
        return bg_error(BG_ERR_INVALID, "bg_generate needs the whole model (layers 0..%d), got layers %d..%d",
                        total - 1, bg_model_first_layer(full), bg_model_last_layer(full));
    if (n < 1 || ntokens < 0)
        return bg_error(BG_ERR_INVALID, "bg_generate: the prompt needs >= 1 token (got %d) and ntokens >= 0 (got %d)",
                        n, ntokens);
    if (temperature < 0 || top_k < 0)
        return bg_error(BG_ERR_INVALID, "bg_generate: temperature (%g) and top_k (%d) must be >= 0",
                        (double)temperature, top_k);
    bg_layer_t *head = bg_model_layer(full, total - 1);
    int V = bg_model_desc_classes(desc), T = mp->seq_len;
    if (head->nparams < 1 || head->params[0].ndim != 2 || head->params[0].shape[0] != V)
        return bg_error(BG_ERR_INVALID, "bg_generate: the loss layer %s has no (%d, d) weight as its first tensor",
                        head->name, V);
    int C = (int)head->params[0].shape[1];
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return bg_error(BG_ERR_INVALID, "bg_generate: prompt token %d is %d, outside the vocabulary [0, %d)", i,
                            (int)prompt[i], V);
    bg_param_t *hw = &head->params[0], *hb = head->nparams > 1 ? &head->params[1] : NULL;

    bg_status_t st = BG_OK;
    bg_backend_t *be = bg_model_backend(full);
    bg_model_t *trunk = NULL;
    bg_model_desc_t *tdesc = NULL;
    char *json = NULL;
    bg_stage_t *stage = NULL;
    float *W = malloc((size_t)V * (size_t)C * sizeof(float)), *B = malloc((size_t)V * sizeof(float));
    float *h = malloc((size_t)C * sizeof(float));
    double *logits = malloc((size_t)V * sizeof(double));
    cand_t *cand = malloc((size_t)V * sizeof(cand_t));
    int32_t *all = malloc(((size_t)n + (size_t)ntokens) * sizeof(int32_t));
    if (!W || !B || !h || !logits || !cand || !all) {
        st = bg_error(BG_ERR_NOMEM, "bg_generate buffers (vocab %d, d_model %d)", V, C);
        goto out;
    }
    be->ops->to_host(be, W, hw->data, (size_t)V * (size_t)C * sizeof(float));
    if (hb)
        be->ops->to_host(be, B, hb->data, (size_t)V * sizeof(float));
    else
        memset(B, 0, (size_t)V * sizeof(float));

    /* the trunk: every layer but the head, with the model's weights, in a
     * description of its own (the full model's layers are bound to it) */
    BG_CHECK_GOTO(bg_model_desc_to_json(desc, &json), st, out);
    BG_CHECK_GOTO(bg_model_desc_from_json(json, &tdesc), st, out);
    BG_CHECK_GOTO(bg_model_create(tdesc, be, 0, total - 2, &trunk), st, out);
    for (int i = 0; i < bg_model_num_tensors(trunk); i++) {
        bg_param_t *dst = bg_model_tensor(trunk, i), *src = bg_model_find_tensor(full, bg_model_tensor_name(trunk, i));
        if (!src || src->numel != dst->numel) {
            st = bg_error(BG_ERR_INTERNAL, "bg_generate: tensor %s differs between the model and its trunk",
                          bg_model_tensor_name(trunk, i));
            goto out;
        }
        be->ops->copy(be, dst->data, src->data, dst->numel);
    }
    BG_CHECK_GOTO(bg_stage_create(trunk, 1, &stage), st, out);
    bg_stage_set_forward_only(stage, 1);
    int gqa = 0, other = 0, cached = 0; /* cached: positions in the cache (-1: none) */
    for (int i = 0; i < total - 1; i++)
        cache_scan(bg_model_layer(trunk, i), &gqa, &other);
    cached = gp.kv_cache && gqa > 0 && other == 0 ? 0 : -1;
    for (int i = 0; i < total - 1 && cached == 0; i++)
        BG_CHECK_GOTO(cache_set(bg_model_layer(trunk, i), be, T, 1), st, out);

    bg_rng_t rng;
    bg_rng_seed(&rng, gp.seed);
    memcpy(all, prompt, (size_t)n * sizeof(int32_t));
    int len = n;
    for (int k = 0; k < ntokens; k++) {
        /* the cache while the whole context fits (its positions are then those of the recomputed window),
         * then recomputation of the last T tokens */
        if (cached >= 0 && len > T) {
            for (int i = 0; i < total - 1; i++)
                cache_set(bg_model_layer(trunk, i), be, T, 0);
            cached = -1;
        }
        int t = cached >= 0 ? len - cached : len < T ? len : T;
        const int32_t *ctx = all + (len - t);
        float *in, *o;
        bg_shape_t oshape;
        BG_CHECK_GOTO(bg_stage_begin(stage, 0, bg_model_input_shape(trunk, 1, t), &in), st, out);
        if (cached >= 0)
            cached = len;
        st = bg_stage_set_data(stage, 0, ctx, NULL, 1.0f);
        if (st == BG_OK)
            st = bg_stage_forward(stage, 0, &o, &oshape);
        if (st == BG_OK)
            be->ops->to_host(be, h, o + (size_t)(t - 1) * (size_t)C, (size_t)C * sizeof(float));
        bg_stage_end(stage, 0);
        if (st != BG_OK)
            goto out;
        for (int v = 0; v < V; v++) {
            double s = B[v];
            const float *w = W + (size_t)v * (size_t)C;
            for (int c = 0; c < C; c++)
                s += (double)w[c] * (double)h[c];
            logits[v] = s;
        }
        all[len++] = pick(logits, V, temperature, top_k, &rng, cand);
    }
    memcpy(out, all + n, (size_t)ntokens * sizeof(int32_t));
out:
    for (int i = 0; trunk && i < total - 1; i++)
        cache_set(bg_model_layer(trunk, i), be, T, 0);
    bg_stage_destroy(stage);
    bg_model_destroy(trunk);
    bg_model_desc_destroy(tdesc);
    free(json);
    free(W);
    free(B);
    free(h);
    free(logits);
    free(cand);
    free(all);
    return st;
}
