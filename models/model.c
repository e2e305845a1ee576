/* models/model.c: the flat parameter/gradient/optimizer buffers of a layer
 * range of a model description, deterministic per-tensor initialisation and
 * the optimizer step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/model.h"
#include "core/check.h"
#include "models/layer_impl.h"
#include "models/model_impl.h"

struct bg_model {
    bg_model_desc_t *desc;
    bg_backend_t *be;
    int total, first, last;
    bg_tensor_ref_t *tensors;
    int ntensors;
    int npartial; /* tensors marked tp_partial (sequence parallelism) */
    size_t nparams;
    float *params, *grads; /* flat (nparams) */
    float *opt_m, *opt_v;  /* optimizer state, allocated on the first step */
    bg_optim_kind_t opt_kind;
    bg_optim_store_t store; /* alloc NULL: the optimizer state is the backend's */
};

/* Each tensor from its own generator, seeded by the model's seed and the
 * tensor's full name (a tie's copy by its source's name: it starts equal). */
static bg_status_t init_params(bg_model_t *m)
{
    const bg_model_desc_t *d = m->desc;
    size_t maxn = 0;
    int64_t full[BG_PARAM_MAX_DIMS];
    for (int i = 0; i < m->ntensors; i++) {
        size_t n = bg_param_full_shape(m->tensors[i].p, full);
        const bg_tp_comm_t *g = bg_model_desc_group_of(d, m->tensors[i].p);
        if (bg_param_is_shard(m->tensors[i].p) && (!g || g->size != m->tensors[i].p->split_parts))
            return bg_error(BG_ERR_INVALID, "tensor %s is a shard of %d but the model runs in no %s group of that size "
                                            "(%s)", m->tensors[i].name, m->tensors[i].p->split_parts,
                            m->tensors[i].p->split_ep ? "expert-parallel" : "tensor-parallel",
                            m->tensors[i].p->split_ep ? "bg_model_desc_set_ep" : "bg_model_desc_set_tp");
        if (n > maxn)
            maxn = n;
    }
    /* a shard is a slice of its full tensor, drawn whole: the same weights under any tp or ep */
    float *host = malloc(2 * maxn * sizeof(float));
    BG_ALLOC_CHECK(host, 2 * maxn * sizeof(float), "parameter initialisation");
    for (int i = 0; i < m->ntensors; i++) {
        bg_param_t *p = m->tensors[i].p;
        bg_rng_t rng;
        const char *seed_name = m->tensors[i].name;
        for (int t = 0; t < bg_model_desc_num_ties(d); t++) {
            const char *a, *b;
            bg_model_desc_tie_names(d, t, &a, &b);
            if (strcmp(seed_name, b) == 0)
                seed_name = a;
        }
        bg_rng_seed(&rng, bg_model_desc_params(d)->seed ^ bg__fnv1a(seed_name));
        size_t n = bg_param_full_shape(p, full);
        float *src = host;
        for (size_t j = 0; j < n; j++)
            host[j] = p->init == BG_INIT_NORMAL ? (float)(p->init_value * bg_rng_normal(&rng)) : p->init_value;
        if (bg_param_is_shard(p)) {
            src = host + maxn;
            bg_param_shard_from_full(p, bg_model_desc_group_of(d, p)->rank, host, src);
        }
        m->be->ops->from_host(m->be, p->data, src, p->numel * sizeof(float));
    }
    free(host);
    return BG_OK;
}

static bg_status_t model_create(bg_model_desc_t *desc, bg_backend_t *be, int first, int last,
                                const unsigned char *which, int grads, bg_model_t **model_p);

bg_status_t bg__model_create_gradless(bg_model_desc_t *desc, bg_backend_t *be, int first, int last,
                                      bg_model_t **model_p)
{
    return model_create(desc, be, first, last, NULL, 0, model_p);
}

bg_status_t bg_model_create(bg_model_desc_t *desc, bg_backend_t *be, int first, int last, bg_model_t **model_p)
{
    return model_create(desc, be, first, last, NULL, 1, model_p);
}

bg_status_t bg_model_create_tensors(bg_model_desc_t *desc, bg_backend_t *be, const unsigned char *which,
                                    bg_model_t **model_p)
{
    if (!which)
        return bg_error(BG_ERR_INVALID, "bg_model_create_tensors: no tensor selection");
    return model_create(desc, be, -1, -1, which, 1, model_p);
}

/* Layers [first, last] (both < 0: all); with `which`, only the tensors i
 * (whole-model order) with which[i] != 0 get buffers; grads 0: no gradient buffer. */
static bg_status_t model_create(bg_model_desc_t *desc, bg_backend_t *be, int first, int last,
                                const unsigned char *which, int grads, bg_model_t **model_p)
{
    bg_status_t st;
    BG_CHECK(bg_model_desc_check(desc));
    int total = bg_model_desc_num_layers(desc);
    if (first < 0 && last < 0) {
        first = 0;
        last = total - 1;
    }
    if (first < 0 || last >= total || first > last)
        return bg_error(BG_ERR_INVALID, "layer range [%d, %d] is not within the model's %d layers", first, last, total);
    BG_CHECK(bg__desc_bind(desc, first, last, 1));
    bg_model_t *m = calloc(1, sizeof(*m));
    if (!m) {
        st = bg_error(BG_ERR_NOMEM, "model");
        goto err_unbind;
    }
    m->desc = desc;
    m->be = be;
    m->total = total;
    m->first = first;
    m->last = last;
    int n;
    bg__desc_tensors(desc, first, last, NULL, &n);
    m->tensors = calloc(n ? (size_t)n : 1, sizeof(*m->tensors));
    if (!m->tensors) {
        st = bg_error(BG_ERR_NOMEM, "tensor list");
        goto err_free_model;
    }
    bg__desc_tensors(desc, first, last, m->tensors, &m->ntensors);
    if (which) { /* keep the selected tensors, in order */
        int k = 0;
        for (int i = 0; i < m->ntensors; i++)
            if (which[i])
                m->tensors[k++] = m->tensors[i];
        m->ntensors = k;
    }
    for (int i = 0; i < m->ntensors; i++) {
        m->nparams += m->tensors[i].p->numel;
        m->npartial += m->tensors[i].p->tp_partial != 0;
    }
    m->params = bg_backend_alloc(be, m->nparams * sizeof(float), "parameters");
    if (!m->params) {
        st = BG_ERR_NOMEM;
        goto err_free_buffers;
    }
    m->grads = grads ? bg_backend_alloc(be, m->nparams * sizeof(float), "gradients") : NULL;
    if (grads && !m->grads) {
        st = BG_ERR_NOMEM;
        goto err_free_buffers;
    }
    size_t off = 0;
    for (int i = 0; i < m->ntensors; i++) {
        m->tensors[i].p->data = m->params + off;
        m->tensors[i].p->grad = m->grads ? m->grads + off : NULL;
        off += m->tensors[i].p->numel;
    }
    BG_CHECK_GOTO(init_params(m), st, err_free_buffers);
    bg_model_zero_grads(m);
    *model_p = m;
    return BG_OK;
err_free_buffers:
    for (int i = 0; i < m->ntensors; i++)
        m->tensors[i].p->data = m->tensors[i].p->grad = NULL;
    bg_backend_free(be, m->params);
    bg_backend_free(be, m->grads);
    free(m->tensors);
err_free_model:
    free(m);
err_unbind:
    bg__desc_bind(desc, first, last, 0);
    return st;
}

void bg_model_destroy(bg_model_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->ntensors; i++)
        m->tensors[i].p->data = m->tensors[i].p->grad = NULL;
    bg__desc_bind(m->desc, m->first, m->last, 0);
    bg_backend_free(m->be, m->params);
    bg_backend_free(m->be, m->grads);
    bg_model_optim_free(m);
    free(m->tensors);
    free(m);
}

int bg_model_total_layers(const bg_model_t *m) { return m->total; }
int bg_model_first_layer(const bg_model_t *m) { return m->first; }
int bg_model_last_layer(const bg_model_t *m) { return m->last; }
bg_layer_t *bg_model_layer(bg_model_t *m, int i) { return bg_model_desc_layer(m->desc, i); }
const bg_model_desc_t *bg_model_desc(const bg_model_t *m) { return m->desc; }
bg_backend_t *bg_model_backend(const bg_model_t *m) { return m->be; }
size_t bg_model_param_count(const bg_model_t *m) { return m->nparams; }
float *bg_model_params(bg_model_t *m) { return m->params; }
float *bg_model_grads(bg_model_t *m) { return m->grads; }
void bg_model_zero_grads(bg_model_t *m)
{
    if (m->grads)
        m->be->ops->fill(m->be, m->grads, 0.0f, m->nparams);
}

/* Free (hold 0) or allocate if absent (1) one of the flat buffers, every tensor's data (grads 0) or grad
 * (grads 1) aimed at it (NULL when freed). */
static bg_status_t flat_hold(bg_model_t *m, float **flat, int grads, int hold)
{
    if (!hold) {
        for (int i = 0; i < m->ntensors; i++)
            *(grads ? &m->tensors[i].p->grad : &m->tensors[i].p->data) = NULL;
        bg_backend_free(m->be, *flat);
        *flat = NULL;
        return BG_OK;
    }
    if (*flat)
        return BG_OK;
    *flat = bg_backend_alloc(m->be, m->nparams * sizeof(float), grads ? "gradients" : "parameters");
    if (!*flat)
        return BG_ERR_NOMEM;
    size_t off = 0;
    for (int i = 0; i < m->ntensors; i++) {
        *(grads ? &m->tensors[i].p->grad : &m->tensors[i].p->data) = *flat + off;
        off += m->tensors[i].p->numel;
    }
    if (grads)
        bg_model_zero_grads(m);
    return BG_OK;
}

bg_status_t bg_model_params_hold(bg_model_t *m, int hold) { return flat_hold(m, &m->params, 0, hold); }
bg_status_t bg_model_grads_hold(bg_model_t *m, int hold) { return flat_hold(m, &m->grads, 1, hold); }

bg_status_t bg_model_tp_sum_grads(bg_model_t *m, int layer)
{
    const bg_tp_comm_t *tp = bg_model_desc_tp(m->desc);
    if (!tp || tp->size < 2 || !m->npartial)
        return BG_OK;
    /* neighbours in the flat buffer (a layernorm's weight and bias) go in one sum */
    for (int i = 0; i < m->ntensors;) {
        const bg_tensor_ref_t *t = &m->tensors[i];
        if (!t->p->tp_partial || !t->p->grad || (layer >= 0 && t->layer != layer)) {
            i++;
            continue;
        }
        float *start = t->p->grad;
        size_t n = 0;
        while (i < m->ntensors && m->tensors[i].p->tp_partial && (layer < 0 || m->tensors[i].layer == layer) &&
               m->tensors[i].p->grad && m->tensors[i].p->grad == start + n)
            n += m->tensors[i++].p->numel;
        BG_CHECK(tp->allreduce(tp->arg, start, n));
    }
    return BG_OK;
}

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

bg_shape_t bg_model_input_shape(const bg_model_t *m, int n, int t) { return bg_model_desc_input_shape(m->desc, n, t); }

size_t bg_optim_state_bytes(bg_optim_kind_t kind) { return kind == BG_OPTIM_ADAMW ? 8 : 4; }

bg_status_t bg_model_optim_step(bg_model_t *m, const bg_optim_config_t *opt, int t)
{
    return bg_model_optim_step_range(m, opt, t, 0, m->nparams);
}

bg_status_t bg_model_optim_step_range(bg_model_t *m, const bg_optim_config_t *opt, int t, size_t lo, size_t count)
{
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
        if (off < lo || off - lo >= count)
            continue;
        BG_CHECK(bg_model_optim_update(m, opt, p->decay ? opt->weight_decay : 0.0f, t, p->data, p->grad,
                                       m->opt_m + off, m->opt_v ? m->opt_v + off : NULL, p->numel));
    }
    return BG_OK;
}

bg_status_t bg_model_optim_update(bg_model_t *m, const bg_optim_config_t *opt, float wd, int t, float *param,
                                  const float *grad, float *mom, float *var, size_t n)
{
    bg_backend_t *be = m->be;
    if (m->store.step)
        return m->store.step(m->store.arg, be, opt, wd, t, param, grad, mom, opt->kind == BG_OPTIM_ADAMW ? var : NULL,
                             n);
    if (opt->kind == BG_OPTIM_ADAMW)
        be->ops->adamw(be, param, grad, mom, var, n, opt->lr, opt->beta1, opt->beta2, opt->eps, wd, t);
    else
        be->ops->sgd_momentum(be, param, grad, mom, n, opt->lr, opt->momentum, wd);
    return BG_OK;
}

bg_status_t bg_model_set_optim_store(bg_model_t *m, const bg_optim_store_t *store)
{
    if (m->opt_m)
        return bg_error(BG_ERR_INVALID, "the optimizer state exists already: set its store before it is allocated");
    m->store = store ? *store : (bg_optim_store_t){0};
    return BG_OK;
}

int bg_model_optim_on_host(const bg_model_t *m) { return m->store.alloc != NULL; }

bg_status_t bg_model_optim_alloc(bg_model_t *m, size_t n, const char *what, float **ptr_p)
{
    if (m->store.alloc) {
        void *p = NULL;
        BG_CHECK(m->store.alloc(m->store.arg, n * sizeof(float), what, &p));
        *ptr_p = p;
        return BG_OK;
    }
    float *p = bg_backend_alloc(m->be, n * sizeof(float), what);
    if (!p)
        return BG_ERR_NOMEM; /* the allocator recorded what and where */
    m->be->ops->fill(m->be, p, 0.0f, n);
    *ptr_p = p;
    return BG_OK;
}

void bg_model_optim_release(bg_model_t *m, float *ptr)
{
    if (!ptr)
        return;
    if (m->store.alloc)
        m->store.release(m->store.arg, ptr);
    else
        bg_backend_free(m->be, ptr);
}

bg_status_t bg_model_optim_init(bg_model_t *m, bg_optim_kind_t kind)
{
    if (m->opt_m)
        return kind == m->opt_kind ? BG_OK : bg_error(BG_ERR_INVALID, "optimizer state exists for another optimizer");
    m->opt_kind = kind;
    BG_CHECK(bg_model_optim_alloc(m, m->nparams, "optimizer state (first moment)", &m->opt_m));
    if (kind == BG_OPTIM_ADAMW)
        BG_CHECK(bg_model_optim_alloc(m, m->nparams, "optimizer state (second moment)", &m->opt_v));
    return BG_OK;
}

float *bg_model_optim_state(bg_model_t *m, int which) { return which == 0 ? m->opt_m : m->opt_v; }

void bg_model_optim_free(bg_model_t *m)
{
    bg_model_optim_release(m, m->opt_m);
    bg_model_optim_release(m, m->opt_v);
    m->opt_m = m->opt_v = NULL;
}
