/* runtime/sample.c: sampling tokens from a whole token model (GPT) (bg_generate).
 *
 * Owns: running the model's trunk (every layer but the head) on the context,
 * the head's logits for the last position, greedy / temperature / top-k
 * sampling. Must not: modify the model (it runs a copy of the trunk). No KV
 * cache: each token costs one forward of the context (at most seq_len). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/checkpoint.h"
#include "core/check.h"

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
    double sum = 0;
    for (int i = 0; i < k; i++) {
        c[i].logit = exp((c[i].logit - c[0].logit) / temperature);
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

bg_status_t bg_generate(bg_model_t *full, const int32_t *prompt, int n, int ntokens, float temperature, int top_k,
                        uint64_t seed, int32_t *out)
{
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

    bg_rng_t rng;
    bg_rng_seed(&rng, seed);
    memcpy(all, prompt, (size_t)n * sizeof(int32_t));
    int len = n;
    for (int k = 0; k < ntokens; k++) {
        int t = len < T ? len : T;
        const int32_t *ctx = all + (len - t);
        float *in, *o;
        bg_shape_t oshape;
        BG_CHECK_GOTO(bg_stage_begin(stage, 0, bg_model_input_shape(trunk, 1, t), &in), st, out);
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
