/* models/model.c: GPT and MLP as lists of top-level layers, the flat
 * parameter/gradient/optimizer buffers of a layer range, deterministic
 * per-tensor initialisation, the per-layer profile and the optimizer step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/model.h"
#include "core/check.h"
#include "models/layer_impl.h"

typedef struct tensor_ref {
    char name[2 * BG_NAME_MAX];
    bg_param_t *p;
} tensor_ref_t;

struct bg_model {
    bg_model_config_t cfg;
    bg_backend_t *be;
    int total, first, last;
    bg_layer_t **layers;   /* all `total` layers (descriptors); params bound for [first, last] only */
    tensor_ref_t *tensors;
    int ntensors;
    size_t nparams;
    float *params, *grads; /* flat (nparams) */
    float *opt_m, *opt_v;  /* optimizer state, allocated on the first step */
    bg_optim_kind_t opt_kind;
};

bg_status_t bg_model_config_check(const bg_model_config_t *c)
{
    if (c->layers < 1)
        return bg_error(BG_ERR_INVALID, "layers must be >= 1 (got %d)", c->layers);
    if (c->d_model < 1)
        return bg_error(BG_ERR_INVALID, "d_model must be >= 1 (got %d)", c->d_model);
    if (c->kind == BG_MODEL_GPT) {
        if (c->heads < 1 || c->d_model % c->heads != 0)
            return bg_error(BG_ERR_INVALID, "heads (%d) must divide d_model (%d)", c->heads, c->d_model);
        if (c->seq_len < 1)
            return bg_error(BG_ERR_INVALID, "seq_len must be >= 1 (got %d)", c->seq_len);
        if (c->vocab < 2)
            return bg_error(BG_ERR_INVALID, "vocab must be >= 2 (got %d)", c->vocab);
    } else if (c->kind == BG_MODEL_MLP) {
        if (c->tie_embeddings)
            return bg_error(BG_ERR_INVALID, "tied embeddings need a GPT (an MLP has no embedding)");
        if (c->in_features < 1)
            return bg_error(BG_ERR_INVALID, "in_features must be >= 1 (got %d)", c->in_features);
        if (c->classes < 2)
            return bg_error(BG_ERR_INVALID, "classes must be >= 2 (got %d)", c->classes);
    } else {
        return bg_error(BG_ERR_INVALID, "unknown model kind %d", (int)c->kind);
    }
    return BG_OK;
}

/* Build the full list of top-level layers (no memory for parameters). */
static bg_status_t build_layers(const bg_model_config_t *c, bg_layer_t ***layers_p, int *n_p)
{
    int n = c->kind == BG_MODEL_GPT ? c->layers + 3 : 2 * c->layers + 1;
    bg_layer_t **ls = calloc((size_t)n, sizeof(*ls));
    if (!ls)
        return bg_error(BG_ERR_NOMEM, "model layer list");
    bg_status_t st = BG_OK;
    char name[BG_NAME_MAX];
    if (c->kind == BG_MODEL_GPT) {
        float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)c->layers);
        BG_CHECK_GOTO(bg_layer_embedding("embed", c->vocab, c->seq_len, c->d_model, std, &ls[0]), st, err);
        for (int i = 0; i < c->layers; i++) {
            snprintf(name, sizeof(name), "blocks.%d", i);
            BG_CHECK_GOTO(bg_layer_transformer_block(name, c->d_model, c->heads, std, proj_std, &ls[1 + i]), st, err);
        }
        BG_CHECK_GOTO(bg_layer_layernorm("ln_f", c->d_model, &ls[c->layers + 1]), st, err);
        BG_CHECK_GOTO(bg_layer_head("head", c->d_model, c->vocab, 0, std, &ls[c->layers + 2]), st, err);
    } else {
        int in = c->in_features;
        for (int i = 0; i < c->layers; i++) {
            snprintf(name, sizeof(name), "fc.%d", i);
            BG_CHECK_GOTO(bg_layer_linear(name, in, c->d_model, 1, sqrtf(2.0f / (float)in), &ls[2 * i]), st, err);
            snprintf(name, sizeof(name), "act.%d", i);
            BG_CHECK_GOTO(bg_layer_activation(name, BG_ACT_RELU, &ls[2 * i + 1]), st, err);
            in = c->d_model;
        }
        BG_CHECK_GOTO(bg_layer_head("head", in, c->classes, 1, sqrtf(1.0f / (float)in), &ls[n - 1]), st, err);
    }
    *layers_p = ls;
    *n_p = n;
    return BG_OK;
err:
    for (int i = 0; i < n; i++)
        bg_layer_destroy(ls[i]);
    free(ls);
    return st;
}

/* Walk a layer tree collecting (full name, param) pairs; refs may be NULL to count. */
static void collect(bg_layer_t *l, const char *prefix, tensor_ref_t *refs, int *n)
{
    char path[2 * BG_NAME_MAX];
    int len;
    if (l->name[0])
        len = snprintf(path, sizeof(path), "%s%s%s", prefix, prefix[0] ? "." : "", l->name);
    else
        len = snprintf(path, sizeof(path), "%s", prefix);
    if (len >= (int)sizeof(path))
        bg_log(BG_LOG_WARN, "models", "tensor path %s... truncated", path);
    for (int i = 0; i < l->nparams; i++) {
        if (refs) {
            len = snprintf(refs[*n].name, sizeof(refs[*n].name), "%s.%s", path, l->params[i].name);
            if (len >= (int)sizeof(refs[*n].name))
                bg_log(BG_LOG_WARN, "models", "tensor name %s truncated", refs[*n].name);
            refs[*n].p = &l->params[i];
        }
        (*n)++;
    }
    for (int i = 0; i < l->nchildren; i++)
        collect(l->children[i], path, refs, n);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

static bg_status_t init_params(bg_model_t *m)
{
    size_t maxn = 0;
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].p->numel > maxn)
            maxn = m->tensors[i].p->numel;
    float *host = malloc(maxn * sizeof(float));
    BG_ALLOC_CHECK(host, maxn * sizeof(float), "parameter initialisation");
    for (int i = 0; i < m->ntensors; i++) {
        bg_param_t *p = m->tensors[i].p;
        bg_rng_t rng;
        /* a tied head starts as a copy of the embedding */
        const char *seed_name = m->tensors[i].name;
        if (m->cfg.tie_embeddings && m->cfg.kind == BG_MODEL_GPT && !strcmp(seed_name, "head.weight"))
            seed_name = "embed.wte";
        bg_rng_seed(&rng, m->cfg.seed ^ fnv1a(seed_name));
        for (size_t j = 0; j < p->numel; j++)
            host[j] = p->init == BG_INIT_NORMAL ? (float)(p->init_value * bg_rng_normal(&rng)) : p->init_value;
        m->be->ops->from_host(m->be, p->data, host, p->numel * sizeof(float));
    }
    free(host);
    return BG_OK;
}

bg_status_t bg_model_create(const bg_model_config_t *cfg, bg_backend_t *be, int first, int last, bg_model_t **model_p)
{
    bg_status_t st;
    BG_CHECK(bg_model_config_check(cfg));
    bg_model_t *m = calloc(1, sizeof(*m));
    BG_ALLOC_CHECK(m, sizeof(*m), "model");
    memcpy(&m->cfg, cfg, cfg->size < sizeof(m->cfg) ? cfg->size : sizeof(m->cfg));
    m->cfg.size = sizeof(m->cfg);
    m->be = be;
    BG_CHECK_GOTO(build_layers(&m->cfg, &m->layers, &m->total), st, err_free_model);
    if (first < 0 && last < 0) {
        first = 0;
        last = m->total - 1;
    }
    if (first < 0 || last >= m->total || first > last) {
        st = bg_error(BG_ERR_INVALID, "layer range [%d, %d] is not within the model's %d layers", first, last,
                      m->total);
        goto err_free_layers;
    }
    m->first = first;
    m->last = last;
    int n = 0;
    for (int i = first; i <= last; i++)
        collect(m->layers[i], "", NULL, &n);
    m->tensors = calloc(n ? (size_t)n : 1, sizeof(*m->tensors));
    if (!m->tensors) {
        st = bg_error(BG_ERR_NOMEM, "tensor list");
        goto err_free_layers;
    }
    m->ntensors = 0;
    for (int i = first; i <= last; i++)
        collect(m->layers[i], "", m->tensors, &m->ntensors);
    for (int i = 0; i < m->ntensors; i++)
        m->nparams += m->tensors[i].p->numel;
    m->params = bg_backend_alloc(be, m->nparams * sizeof(float), "parameters");
    if (!m->params) {
        st = BG_ERR_NOMEM;
        goto err_free_buffers;
    }
    m->grads = bg_backend_alloc(be, m->nparams * sizeof(float), "gradients");
    if (!m->grads) {
        st = BG_ERR_NOMEM;
        goto err_free_buffers;
    }
    size_t off = 0;
    for (int i = 0; i < m->ntensors; i++) {
        m->tensors[i].p->data = m->params + off;
        m->tensors[i].p->grad = m->grads + off;
        off += m->tensors[i].p->numel;
    }
    BG_CHECK_GOTO(init_params(m), st, err_free_buffers);
    bg_model_zero_grads(m);
    *model_p = m;
    return BG_OK;
err_free_buffers:
    bg_backend_free(be, m->params);
    bg_backend_free(be, m->grads);
    free(m->tensors);
err_free_layers:
    for (int i = 0; i < m->total; i++)
        bg_layer_destroy(m->layers[i]);
    free(m->layers);
err_free_model:
    free(m);
    return st;
}

void bg_model_destroy(bg_model_t *m)
{
    if (!m)
        return;
    bg_backend_free(m->be, m->params);
    bg_backend_free(m->be, m->grads);
    bg_backend_free(m->be, m->opt_m);
    bg_backend_free(m->be, m->opt_v);
    for (int i = 0; i < m->total; i++)
        bg_layer_destroy(m->layers[i]);
    free(m->layers);
    free(m->tensors);
    free(m);
}

int bg_model_total_layers(const bg_model_t *m) { return m->total; }
int bg_model_first_layer(const bg_model_t *m) { return m->first; }
int bg_model_last_layer(const bg_model_t *m) { return m->last; }
bg_layer_t *bg_model_layer(bg_model_t *m, int i) { return (i >= 0 && i < m->total) ? m->layers[i] : NULL; }
const bg_model_config_t *bg_model_config(const bg_model_t *m) { return &m->cfg; }
bg_backend_t *bg_model_backend(const bg_model_t *m) { return m->be; }
size_t bg_model_param_count(const bg_model_t *m) { return m->nparams; }
float *bg_model_params(bg_model_t *m) { return m->params; }
float *bg_model_grads(bg_model_t *m) { return m->grads; }
void bg_model_zero_grads(bg_model_t *m) { m->be->ops->fill(m->be, m->grads, 0.0f, m->nparams); }
int bg_model_num_tensors(const bg_model_t *m) { return m->ntensors; }
const char *bg_model_tensor_name(const bg_model_t *m, int i) { return m->tensors[i].name; }
bg_param_t *bg_model_tensor(bg_model_t *m, int i) { return m->tensors[i].p; }

bg_param_t *bg_model_find_tensor(bg_model_t *m, const char *name)
{
    for (int i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0)
            return m->tensors[i].p;
    return NULL;
}

void bg_model_tie_grads_local(bg_model_t *m)
{
    if (!m->cfg.tie_embeddings || m->cfg.kind != BG_MODEL_GPT)
        return;
    bg_param_t *e = bg_model_find_tensor(m, "embed.wte"), *h = bg_model_find_tensor(m, "head.weight");
    if (!e || !h)
        return;
    m->be->ops->residual_forward(m->be, e->grad, e->grad, h->grad, e->numel); /* e + h */
    m->be->ops->copy(m->be, h->grad, e->grad, e->numel);
}

bg_shape_t bg_model_input_shape(const bg_model_t *m, int n, int t)
{
    if (m->cfg.kind == BG_MODEL_GPT)
        return (bg_shape_t){n, t, 0};
    return (bg_shape_t){n, 1, m->cfg.in_features};
}

bg_status_t bg_model_profile(const bg_model_config_t *cfg, int n, int t, bg_layer_profile_t *profile, int max,
                             int *count_p)
{
    BG_CHECK(bg_model_config_check(cfg));
    bg_layer_t **ls;
    int total;
    BG_CHECK(build_layers(cfg, &ls, &total));
    bg_status_t st = BG_OK;
    if (total > max) {
        st = bg_error(BG_ERR_INVALID, "profile needs %d entries, %d given", total, max);
        goto out;
    }
    bg_shape_t s = cfg->kind == BG_MODEL_GPT ? (bg_shape_t){n, t, 0} : (bg_shape_t){n, 1, cfg->in_features};
    for (int i = 0; i < total; i++) {
        bg_layer_profile_t *p = &profile[i];
        bg_shape_t o;
        BG_CHECK_GOTO(bg_layer_out_shape(ls[i], s, &o), st, out);
        memset(p, 0, sizeof(*p));
        snprintf(p->name, sizeof(p->name), "%s", ls[i]->name);
        p->params = bg_layer_param_count(ls[i]);
        p->output_bytes = bg_shape_numel(o) * sizeof(float);
        p->stash_bytes = bg_align64(bg_layer_stash_bytes(ls[i], s)) + bg_align64(p->output_bytes);
        p->wstash_bytes = bg_align64(bg_layer_wstash_bytes(ls[i], s)) + bg_align64(p->output_bytes);
        p->scratch_bytes = bg_layer_scratch_bytes(ls[i], s);
        p->fwd_flops = bg_layer_fwd_flops(ls[i], s);
        p->bwd_flops = bg_layer_bwd_flops(ls[i], s);
        s = o;
    }
    *count_p = total;
out:
    for (int i = 0; i < total; i++)
        bg_layer_destroy(ls[i]);
    free(ls);
    return st;
}

size_t bg_optim_state_bytes(bg_optim_kind_t kind) { return kind == BG_OPTIM_ADAMW ? 8 : 4; }

bg_status_t bg_model_optim_step(bg_model_t *m, const bg_optim_config_t *opt, int t)
{
    bg_backend_t *be = m->be;
    if (opt->kind != BG_OPTIM_ADAMW && opt->kind != BG_OPTIM_SGD)
        return bg_error(BG_ERR_INVALID, "unknown optimizer %d", (int)opt->kind);
    if (!m->opt_m) {
        BG_CHECK(bg_model_optim_init(m, opt->kind));
    } else if (opt->kind != m->opt_kind) {
        return bg_error(BG_ERR_INVALID, "optimizer changed between steps");
    }
    for (int i = 0; i < m->ntensors; i++) {
        bg_param_t *p = m->tensors[i].p;
        size_t off = (size_t)(p->data - m->params);
        float wd = p->decay ? opt->weight_decay : 0.0f;
        if (opt->kind == BG_OPTIM_ADAMW)
            be->ops->adamw(be, p->data, p->grad, m->opt_m + off, m->opt_v + off, p->numel, opt->lr, opt->beta1,
                           opt->beta2, opt->eps, wd, t);
        else
            be->ops->sgd_momentum(be, p->data, p->grad, m->opt_m + off, p->numel, opt->lr, opt->momentum, wd);
    }
    return BG_OK;
}

bg_status_t bg_model_optim_init(bg_model_t *m, bg_optim_kind_t kind)
{
    bg_backend_t *be = m->be;
    if (m->opt_m)
        return kind == m->opt_kind ? BG_OK : bg_error(BG_ERR_INVALID, "optimizer state exists for another optimizer");
    m->opt_kind = kind;
    m->opt_m = bg_backend_alloc(be, m->nparams * sizeof(float), "optimizer state (first moment)");
    if (!m->opt_m)
        return BG_ERR_NOMEM;
    be->ops->fill(be, m->opt_m, 0.0f, m->nparams);
    if (kind == BG_OPTIM_ADAMW) {
        m->opt_v = bg_backend_alloc(be, m->nparams * sizeof(float), "optimizer state (second moment)");
        if (!m->opt_v)
            return BG_ERR_NOMEM;
        be->ops->fill(be, m->opt_v, 0.0f, m->nparams);
    }
    return BG_OK;
}

float *bg_model_optim_state(bg_model_t *m, int which) { return which == 0 ? m->opt_m : m->opt_v; }
