/* models/desc.c: model descriptions: an ordered list of top-level layers
 * (the units a pipeline splits), the input kind, the loss (the last layer)
 * and declared ties between tensors; their one JSON form, used by saves,
 * checkpoints and plans. Holds no parameter memory (see model.c). */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/util.h"
#include "models/cp_attention.h"
#include "models/layer_impl.h"
#include "models/model_impl.h"

#define DESC_FORMAT "brigade-model"
#define DESC_VERSION 1

typedef struct tie {
    char a[2 * BG_NAME_MAX], b[2 * BG_NAME_MAX];
} tie_t;

struct bg_model_desc {
    bg_model_desc_params_t p;
    char name[BG_NAME_MAX];
    bg_layer_t **layers;
    unsigned char *bound; /* per layer: bound to a model */
    int n, cap;
    int *by_name;    /* open-addressed index of layers by name: slot -> layer + 1 (0: empty), by_name_cap slots */
    int by_name_cap; /* a power of two, at least twice n: each add's duplicate check costs O(1), not O(n) */
    tie_t *ties;
    int nties;
    int has_builder;
    bg_model_config_t builder;
    const bg_tp_comm_t *tp; /* the tensor-parallel group the model runs in (NULL: none) */
    const bg_tp_comm_t *ep; /* the expert-parallel group of its MoE layers (NULL: none) */
    const bg_cp_comm_t *cp; /* the context-parallel group the model runs in (NULL: none) */
};

uint64_t bg__fnv1a(const char *s) { return bg__fnv1a_bytes(BG_FNV1A_INIT, s, strlen(s)); }

/* The name index: linear probing from the name's FNV-1a hash. */
static int desc_find_layer(const bg_model_desc_t *d, const char *name)
{
    if (!d->by_name_cap)
        return -1;
    size_t mask = (size_t)d->by_name_cap - 1;
    for (size_t s = (size_t)bg__fnv1a(name) & mask;; s = (s + 1) & mask) {
        int i = d->by_name[s] - 1;
        if (i < 0)
            return -1;
        if (strcmp(d->layers[i]->name, name) == 0)
            return i;
    }
}

/* Layer i, named name, is not in the index yet; the index has a free slot. */
static void desc_index_put(bg_model_desc_t *d, const char *name, int i)
{
    size_t mask = (size_t)d->by_name_cap - 1;
    size_t s = (size_t)bg__fnv1a(name) & mask;
    while (d->by_name[s])
        s = (s + 1) & mask;
    d->by_name[s] = i + 1;
}

/* Double the index (64 slots at first) and re-insert every layer. */
static bg_status_t desc_index_grow(bg_model_desc_t *d)
{
    if (d->by_name_cap > INT_MAX / 4)
        return BG_ERR_NOMEM;
    int cap = d->by_name_cap ? 2 * d->by_name_cap : 64;
    int *idx = calloc((size_t)cap, sizeof(*idx));
    if (!idx)
        return BG_ERR_NOMEM;
    free(d->by_name);
    d->by_name = idx;
    d->by_name_cap = cap;
    for (int i = 0; i < d->n; i++)
        desc_index_put(d, d->layers[i]->name, i);
    return BG_OK;
}

bg_status_t bg_model_desc_create(const bg_model_desc_params_t *p, bg_model_desc_t **desc_p)
{
    if (!p || p->size < offsetof(bg_model_desc_params_t, seed) + sizeof(uint64_t))
        return bg_error(BG_ERR_INVALID, "bg_model_desc_create: params missing or older than this library "
                                        "(initialise them with BG_MODEL_DESC_PARAMS_INIT)");
    if (p->input != BG_INPUT_TOKENS && p->input != BG_INPUT_FEATURES)
        return bg_error(BG_ERR_INVALID, "model input kind %d is neither tokens nor features", (int)p->input);
    if (p->seq_len < 1)
        return bg_error(BG_ERR_INVALID, "model input: seq_len must be >= 1 (got %d)", p->seq_len);
    if (p->input == BG_INPUT_TOKENS && p->vocab < 2)
        return bg_error(BG_ERR_INVALID, "model input: a token model needs vocab >= 2 (got %d)", p->vocab);
    if (p->input == BG_INPUT_FEATURES && p->features < 1)
        return bg_error(BG_ERR_INVALID, "model input: features must be >= 1 (got %d)", p->features);
    bg_model_desc_t *d = calloc(1, sizeof(*d));
    BG_ALLOC_CHECK(d, sizeof(*d), "model description");
    d->p = *p;
    d->p.size = sizeof(d->p);
    snprintf(d->name, sizeof(d->name), "%s", p->name && *p->name ? p->name : "model");
    d->p.name = d->name;
    *desc_p = d;
    return BG_OK;
}

void bg_model_desc_destroy(bg_model_desc_t *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->n; i++)
        bg_layer_destroy(d->layers[i]);
    free(d->layers);
    free(d->bound);
    free(d->by_name);
    free(d->ties);
    free(d);
}

bg_status_t bg_model_desc_add(bg_model_desc_t *d, bg_layer_t *layer)
{
    if (!layer)
        return bg_error(BG_ERR_INVALID, "model %s: layer %d is NULL", d->name, d->n);
    if (!layer->name[0]) {
        bg_status_t st = bg_error(BG_ERR_INVALID, "model %s: top-level layer %d (type %s) has no name", d->name, d->n,
                                  layer->ops->type ? layer->ops->type : "?");
        bg_layer_destroy(layer);
        return st;
    }
    int dup = desc_find_layer(d, layer->name);
    if (dup >= 0) {
        bg_status_t st = bg_error(BG_ERR_INVALID, "model %s: two top-level layers are named \"%s\" (%d and %d)",
                                  d->name, layer->name, dup, d->n);
        bg_layer_destroy(layer);
        return st;
    }
    if (2 * (d->n + 1) > d->by_name_cap && desc_index_grow(d) != BG_OK) {
        bg_layer_destroy(layer);
        return bg_error(BG_ERR_NOMEM, "model %s: name index of %d layers", d->name, d->n + 1);
    }
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 16;
        bg_layer_t **ls = realloc(d->layers, (size_t)cap * sizeof(*ls));
        unsigned char *b = ls ? realloc(d->bound, (size_t)cap) : NULL;
        if (ls)
            d->layers = ls;
        if (!ls || !b) {
            bg_layer_destroy(layer);
            return bg_error(BG_ERR_NOMEM, "model %s: layer list of %d", d->name, cap);
        }
        d->bound = b;
        d->cap = cap;
    }
    d->bound[d->n] = 0;
    desc_index_put(d, layer->name, d->n);
    d->layers[d->n++] = layer;
    return BG_OK;
}

bg_status_t bg_model_desc_tie(bg_model_desc_t *d, const char *a, const char *b)
{
    if (!a || !b || !*a || !*b || strlen(a) >= 2 * BG_NAME_MAX || strlen(b) >= 2 * BG_NAME_MAX)
        return bg_error(BG_ERR_INVALID, "model %s: a tie needs two tensor names shorter than %d", d->name,
                        2 * BG_NAME_MAX);
    if (strcmp(a, b) == 0)
        return bg_error(BG_ERR_INVALID, "model %s: tensor %s is tied to itself", d->name, a);
    tie_t *t = realloc(d->ties, (size_t)(d->nties + 1) * sizeof(*t));
    BG_ALLOC_CHECK(t, (size_t)(d->nties + 1) * sizeof(*t), "tie list");
    d->ties = t;
    snprintf(t[d->nties].a, sizeof(t->a), "%s", a);
    snprintf(t[d->nties].b, sizeof(t->b), "%s", b);
    d->nties++;
    return BG_OK;
}

/* Walk a layer tree collecting (full name, param) pairs; refs may be NULL to count. */
static void collect(bg_layer_t *l, const char *prefix, int layer, bg_tensor_ref_t *refs, int *n)
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
            refs[*n].layer = layer;
        }
        (*n)++;
    }
    for (int i = 0; i < l->nchildren; i++)
        collect(l->children[i], path, layer, refs, n);
}

void bg__desc_tensors(const bg_model_desc_t *d, int first, int last, bg_tensor_ref_t *refs, int *n_p)
{
    int n = 0;
    for (int i = first; i <= last; i++)
        collect(d->layers[i], "", i, refs, &n);
    *n_p = n;
}

bg_status_t bg__desc_bind(bg_model_desc_t *d, int first, int last, int on)
{
    if (on)
        for (int i = first; i <= last; i++)
            if (d->bound[i])
                return bg_error(BG_ERR_INVALID, "model %s: layer %s is already bound to another model (a "
                                                "description's layer holds one model's parameters at a time)",
                                d->name, d->layers[i]->name);
    for (int i = first; i <= last; i++)
        d->bound[i] = (unsigned char)(on ? 1 : 0);
    return BG_OK;
}

const bg_model_config_t *bg__desc_builder(const bg_model_desc_t *d) { return d->has_builder ? &d->builder : NULL; }
bg_status_t bg_model_desc_builder(const bg_model_desc_t *d, bg_model_config_t *cfg_p)
{
    if (!d->has_builder)
        return bg_error(BG_ERR_UNSUPPORTED, "model %s was not made by a built-in builder (gpt, mlp): it has no "
                                            "builder configuration", d->name);
    *cfg_p = d->builder;
    return BG_OK;
}
void bg__desc_set_builder(bg_model_desc_t *d, const bg_model_config_t *cfg)
{
    d->builder = *cfg;
    d->builder.size = sizeof(d->builder);
    d->has_builder = 1;
}

const bg_model_desc_params_t *bg_model_desc_params(const bg_model_desc_t *d) { return &d->p; }
int bg_model_desc_num_layers(const bg_model_desc_t *d) { return d->n; }
bg_layer_t *bg_model_desc_layer(const bg_model_desc_t *d, int i) { return i >= 0 && i < d->n ? d->layers[i] : NULL; }
int bg_model_desc_classes(const bg_model_desc_t *d) { return d->n ? bg_layer_loss_classes(d->layers[d->n - 1]) : 0; }
int bg_model_desc_num_ties(const bg_model_desc_t *d) { return d->nties; }
void bg_model_desc_tie_names(const bg_model_desc_t *d, int i, const char **a_p, const char **b_p)
{
    *a_p = d->ties[i].a;
    *b_p = d->ties[i].b;
}

bg_shape_t bg_model_desc_input_shape(const bg_model_desc_t *d, int n, int t)
{
    if (d->p.input == BG_INPUT_TOKENS)
        return (bg_shape_t){n, t, 0};
    return (bg_shape_t){n, d->p.seq_len, d->p.features};
}

/* Shards' degree: what every split tensor of the tree over the tensor group (ep = 0) or the expert-parallel
 * group (ep = 1) agrees on (1: none); -1 on disagreement. */
static int layer_split_degree(const bg_layer_t *l, int ep, int deg)
{
    for (int i = 0; i < l->nparams && deg >= 0; i++)
        if (bg_param_is_shard(&l->params[i]) && !!l->params[i].split_ep == ep)
            deg = deg == 1 || deg == l->params[i].split_parts ? l->params[i].split_parts : -1;
    for (int i = 0; i < l->nchildren && deg >= 0; i++)
        deg = layer_split_degree(l->children[i], ep, deg);
    return deg;
}

static int desc_split_degree(const bg_model_desc_t *d, int ep)
{
    int deg = 1;
    for (int i = 0; i < d->n && deg >= 0; i++)
        deg = layer_split_degree(d->layers[i], ep, deg);
    return deg;
}

int bg_model_desc_tp_degree(const bg_model_desc_t *d) { return desc_split_degree(d, 0); }
int bg_model_desc_ep_degree(const bg_model_desc_t *d) { return desc_split_degree(d, 1); }

/* 1 when pred holds for a layer of the description (any depth). */
static int layer_any(const bg_layer_t *l, int (*pred)(const bg_layer_t *))
{
    if (pred(l))
        return 1;
    for (int i = 0; i < l->nchildren; i++)
        if (layer_any(l->children[i], pred))
            return 1;
    return 0;
}
static int desc_any(const bg_model_desc_t *d, int (*pred)(const bg_layer_t *))
{
    for (int i = 0; i < d->n; i++)
        if (layer_any(d->layers[i], pred))
            return 1;
    return 0;
}

static int has_partial(const bg_layer_t *l)
{
    for (int i = 0; i < l->nparams; i++)
        if (l->params[i].tp_partial)
            return 1;
    return 0;
}
int bg_model_desc_sequence_parallel(const bg_model_desc_t *d) { return desc_any(d, has_partial); }

bg_status_t bg_model_desc_set_precision(bg_model_desc_t *d, bg_dtype_t precision)
{
    for (int i = 0; i < d->n; i++)
        BG_CHECK(bg_layer_set_precision(d->layers[i], precision));
    d->builder.precision = precision; /* a rebuild for another tp degree keeps it (partitioner/plan_search.c) */
    return BG_OK;
}

static int is_bf16(const bg_layer_t *l) { return l->precision == BG_BF16; }
bg_dtype_t bg_model_desc_precision(const bg_model_desc_t *d) { return desc_any(d, is_bf16) ? BG_BF16 : BG_F32; }

bg_status_t bg_model_desc_set_tp(bg_model_desc_t *d, const bg_tp_comm_t *tp)
{
    if (!tp) { /* unbinding always works; binding models checks the degree */
        d->tp = NULL;
        return BG_OK;
    }
    int deg = bg_model_desc_tp_degree(d), have = tp ? tp->size : 1;
    if (deg < 0)
        return bg_error(BG_ERR_INVALID, "model %s: its tensor-parallel layers are split over different degrees", d->name);
    if (deg != have)
        return bg_error(BG_ERR_INVALID, "model %s has tensor-parallel layers of degree %d but runs in a tensor-parallel "
                                        "group of %d (tp must be %d)", d->name, deg, have, deg);
    if (tp && (tp->rank < 0 || tp->rank >= tp->size || (tp->size > 1 && (!tp->allreduce || !tp->allgather))))
        return bg_error(BG_ERR_INVALID, "model %s: tensor-parallel group rank %d of %d without its collectives",
                        d->name, tp->rank, tp->size);
    d->tp = tp && tp->size > 1 ? tp : NULL;
    return BG_OK;
}

const bg_tp_comm_t *bg_model_desc_tp(const bg_model_desc_t *d) { return d->tp; }

bg_status_t bg_model_desc_set_ep(bg_model_desc_t *d, const bg_tp_comm_t *ep)
{
    int deg = bg_model_desc_ep_degree(d), have = ep ? ep->size : 1;
    if (!ep) {
        d->ep = NULL;
        return BG_OK;
    }
    if (deg < 0)
        return bg_error(BG_ERR_INVALID, "model %s: its MoE layers are split over different expert-parallel degrees",
                        d->name);
    if (deg != have)
        return bg_error(BG_ERR_INVALID, "model %s has MoE layers of expert-parallel degree %d but runs in an "
                                        "expert-parallel group of %d (ep must be %d)", d->name, deg, have, deg);
    if (ep->rank < 0 || ep->rank >= ep->size || (ep->size > 1 && (!ep->allgather || !ep->alltoallv)))
        return bg_error(BG_ERR_INVALID, "model %s: expert-parallel group rank %d of %d without its collectives",
                        d->name, ep->rank, ep->size);
    d->ep = ep->size > 1 ? ep : NULL;
    return BG_OK;
}

const bg_tp_comm_t *bg_model_desc_ep(const bg_model_desc_t *d) { return d->ep; }

const bg_tp_comm_t *bg_model_desc_group_of(const bg_model_desc_t *d, const bg_param_t *p)
{
    if (!bg_param_is_shard(p))
        return NULL;
    return p->split_ep ? d->ep : d->tp;
}
/* Leaf types that run under context parallelism: the position-wise ones,
 * and those that read positions and know the group (models/cp_attention.c).
 * Experts (their load balance counts a sequence's tokens) do not yet. */
static const char *const cp_types[] = {"activation", "linear", "layernorm", "residual", "rmsnorm", "swiglu",
                                       "column_linear", "row_linear", "head", "vocab_head", "embedding", "vocab_embedding",
                                       "attention", "gqa_attention", NULL};
/* The attention leaves, whose scratch holds the ring's blocks once bound. */
static const struct {
    const char *type;
    void (*set_ring)(bg_layer_t *l, int size);
} cp_rings[] = {{"attention", bg__attention_set_ring}, {"gqa_attention", bg__gqa_set_ring}};

/* The first leaf of l's tree that cannot run under cp (NULL: none); with
 * mark >= 0, every attention leaf bound to a group of mark members, or unbound (0) (its ring's scratch). */
static const bg_layer_t *cp_unsupported(bg_layer_t *l, int mark)
{
    if (l->nchildren == 0) {
        for (size_t i = 0; mark >= 0 && i < sizeof cp_rings / sizeof cp_rings[0]; i++)
            if (strcmp(l->ops->type, cp_rings[i].type) == 0)
                cp_rings[i].set_ring(l, mark);
        for (int i = 0; cp_types[i]; i++)
            if (strcmp(l->ops->type, cp_types[i]) == 0)
                return NULL;
        return l;
    }
    for (int i = 0; i < l->nchildren; i++) {
        const bg_layer_t *bad = cp_unsupported(l->children[i], mark);
        if (bad)
            return bad;
    }
    return NULL;
}

bg_status_t bg_model_desc_set_cp(bg_model_desc_t *d, const bg_cp_comm_t *cp)
{
    if (!cp || cp->size == 1) {
        for (int i = 0; i < d->n; i++)
            cp_unsupported(d->layers[i], 0);
        d->cp = NULL;
        return BG_OK;
    }
    if (cp->rank < 0 || cp->rank >= cp->size || !cp->ring_start || !cp->wait)
        return bg_error(BG_ERR_INVALID, "model %s: context-parallel group rank %d of %d without its ring", d->name,
                        cp->rank, cp->size);
    for (int i = 0; i < d->n; i++) {
        const bg_layer_t *bad = cp_unsupported(d->layers[i], -1);
        if (bad)
            return bg_error(BG_ERR_UNSUPPORTED, "model %s: context parallelism (cp %d) needs position-wise layers, "
                            "embeddings and attention, but layer %s is a %s", d->name, cp->size, bad->name,
                            bad->ops->type);
    }
    for (int i = 0; i < d->n; i++)
        cp_unsupported(d->layers[i], cp->size);
    d->cp = cp;
    return BG_OK;
}

const bg_cp_comm_t *bg_model_desc_cp(const bg_model_desc_t *d) { return d->cp; }

/* Parameters of the full tensors of a layer tree (shards count whole). */
static size_t layer_full_params(const bg_layer_t *l)
{
    int64_t shape[BG_PARAM_MAX_DIMS];
    size_t n = 0;
    for (int i = 0; i < l->nparams; i++)
        n += bg_param_full_shape(&l->params[i], shape);
    for (int i = 0; i < l->nchildren; i++)
        n += layer_full_params(l->children[i]);
    return n;
}

size_t bg_model_desc_param_count(const bg_model_desc_t *d)
{
    size_t n = 0;
    for (int i = 0; i < d->n; i++)
        n += bg_layer_param_count(d->layers[i]);
    return n;
}

int bg_model_desc_num_tensors(const bg_model_desc_t *d)
{
    int n = 0;
    if (d->n > 0)
        bg__desc_tensors(d, 0, d->n - 1, NULL, &n);
    return n;
}

bg_status_t bg_model_desc_tensor(const bg_model_desc_t *d, int i, char *name, size_t cap, size_t *numel_p)
{
    int n = bg_model_desc_num_tensors(d);
    if (i < 0 || i >= n)
        return bg_error(BG_ERR_INVALID, "tensor %d of model %s: it has %d", i, d->name, n);
    bg_tensor_ref_t *refs = calloc((size_t)n, sizeof(*refs));
    BG_ALLOC_CHECK(refs, (size_t)n * sizeof(*refs), "tensor list");
    bg__desc_tensors(d, 0, d->n - 1, refs, &n);
    if (name && cap)
        snprintf(name, cap, "%s", refs[i].name);
    if (numel_p)
        *numel_p = refs[i].p->numel;
    free(refs);
    return BG_OK;
}

/* All tensors of the model (malloc'ed). */
static bg_status_t all_tensors(const bg_model_desc_t *d, bg_tensor_ref_t **refs_p, int *n_p)
{
    int n = 0;
    bg__desc_tensors(d, 0, d->n - 1, NULL, &n);
    bg_tensor_ref_t *refs = calloc(n ? (size_t)n : 1, sizeof(*refs));
    BG_ALLOC_CHECK(refs, (size_t)n * sizeof(*refs), "tensor list");
    bg__desc_tensors(d, 0, d->n - 1, refs, &n);
    *refs_p = refs;
    *n_p = n;
    return BG_OK;
}

/* "[32, 16]": a tensor's shape for messages. */
static void shape_text(const bg_param_t *p, char *buf, size_t size)
{
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int k = 0; k < p->ndim && len < size; k++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", k ? ", " : "", (long long)p->shape[k]);
    if (len < size)
        snprintf(buf + len, size - len, "]");
}

static int find_ref(const bg_tensor_ref_t *refs, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(refs[i].name, name) == 0)
            return i;
    return -1;
}

static int cmp_ref_name(const void *a, const void *b)
{
    return strcmp(((const bg_tensor_ref_t *)a)->name, ((const bg_tensor_ref_t *)b)->name);
}

bg_status_t bg_model_desc_check(const bg_model_desc_t *d)
{
    if (d->n == 0)
        return bg_error(BG_ERR_INVALID, "model %s has no layers", d->name);
    if (bg_model_desc_classes(d) < 1)
        return bg_error(BG_ERR_INVALID, "model %s: its last layer %s (type %s) is not a loss layer; a model must end "
                                        "in one (for instance bg_layer_head)", d->name, d->layers[d->n - 1]->name,
                        d->layers[d->n - 1]->ops->type);
    for (int i = 0; i < d->n - 1; i++)
        if (bg_layer_loss_classes(d->layers[i]) > 0)
            return bg_error(BG_ERR_INVALID, "model %s: layer %s (%d of %d) is a loss layer; only the last layer may be",
                            d->name, d->layers[i]->name, i, d->n);
    bg_shape_t s = bg_model_desc_input_shape(d, 1, d->p.seq_len);
    for (int i = 0; i < d->n; i++) {
        bg_shape_t o;
        if (bg_layer_out_shape(d->layers[i], s, &o) != BG_OK)
            return bg_error(BG_ERR_INVALID, "model %s: layer %s does not take the shape the layers before it give "
                                            "(n %d, t %d, c %d): %s", d->name, d->layers[i]->name, s.n, s.t, s.c,
                            bg_last_error());
        s = o;
    }
    if (s.c != 1)
        return bg_error(BG_ERR_INVALID, "model %s: the loss layer %s gives %d channels per position, not 1 (a loss)",
                        d->name, d->layers[d->n - 1]->name, s.c);
    bg_tensor_ref_t *refs = NULL;
    int n = 0;
    BG_CHECK(all_tensors(d, &refs, &n));
    bg_status_t st = BG_OK;
    for (int t = 0; t < d->nties && st == BG_OK; t++) {
        int ia = find_ref(refs, n, d->ties[t].a), ib = find_ref(refs, n, d->ties[t].b);
        if (ia < 0 || ib < 0) {
            st = bg_error(BG_ERR_INVALID, "model %s: tie %s -> %s: the model has no tensor %s", d->name, d->ties[t].a,
                          d->ties[t].b, ia < 0 ? d->ties[t].a : d->ties[t].b);
            break;
        }
        const bg_param_t *a = refs[ia].p, *b = refs[ib].p;
        int same = a->ndim == b->ndim;
        for (int k = 0; same && k < a->ndim; k++)
            same = a->shape[k] == b->shape[k];
        if (!same) {
            char sa[96], sb[96];
            shape_text(a, sa, sizeof(sa));
            shape_text(b, sb, sizeof(sb));
            st = bg_error(BG_ERR_INVALID, "model %s: tie %s -> %s: shapes differ (%s vs %s)", d->name, d->ties[t].a,
                          d->ties[t].b, sa, sb);
            break;
        }
        for (int u = 0; u < t; u++) {
            const char *x[2] = {d->ties[u].a, d->ties[u].b}, *y[2] = {d->ties[t].a, d->ties[t].b};
            for (int i = 0; i < 4; i++)
                if (strcmp(x[i / 2], y[i % 2]) == 0) {
                    st = bg_error(BG_ERR_INVALID, "model %s: tensor %s is in two ties (chain ties through one source "
                                                  "instead)", d->name, y[i % 2]);
                    i = 4;
                }
            if (st != BG_OK)
                break;
        }
    }
    if (st == BG_OK) {
        qsort(refs, (size_t)n, sizeof(*refs), cmp_ref_name);
        for (int i = 1; i < n; i++)
            if (strcmp(refs[i - 1].name, refs[i].name) == 0) {
                st = bg_error(BG_ERR_INVALID, "model %s: two tensors are named %s", d->name, refs[i].name);
                break;
            }
    }
    free(refs);
    return st;
}

/* ---------------------------------------------------------------- JSON */

static json_t *builder_json_dense(const bg_model_config_t *m)
{
    if (m->kind == BG_MODEL_LLAMA) /* a GPT's and an MLP's JSON stay as they were */
        return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:b, s:i, s:i, s:f}", "name", "llama", "layers",
                         m->layers, "d_model", m->d_model, "heads", m->heads, "seq_len", m->seq_len, "vocab", m->vocab,
                         "in_features", m->in_features, "classes", m->classes, "seed", (json_int_t)m->seed,
                         "tie_embeddings", m->tie_embeddings, "kv_heads", m->kv_heads ? m->kv_heads : m->heads,
                         "ffn_hidden", bg__llama_ffn(m), "rope_theta", (double)m->rope_theta);
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:b}", "name",
                     m->kind == BG_MODEL_GPT ? "gpt" : "mlp", "layers", m->layers, "d_model", m->d_model, "heads",
                     m->heads, "seq_len", m->seq_len, "vocab", m->vocab, "in_features", m->in_features, "classes",
                     m->classes, "seed", (json_int_t)m->seed, "tie_embeddings", m->tie_embeddings);
}

/* A model without experts keeps the JSON it had before MoE existed. */
static json_t *builder_json(const bg_model_config_t *m)
{
    json_t *b = builder_json_dense(m);
    if (!b || m->experts < 1)
        return b;
    json_object_set_new(b, "experts", json_integer(m->experts));
    json_object_set_new(b, "top_k", json_integer(m->top_k));
    json_object_set_new(b, "moe_every", json_integer(m->moe_every));
    json_object_set_new(b, "ffn_hidden", json_integer(bg__llama_ffn(m)));
    json_object_set_new(b, "capacity_factor", json_real(m->capacity_factor));
    json_object_set_new(b, "moe_aux_coef", json_real(m->moe_aux_coef));
    json_object_set_new(b, "moe_gate", json_string(m->moe_gate == BG_MOE_SIGMOID ? "sigmoid" : "softmax"));
    return b;
}

bg_status_t bg_model_desc_to_json(const bg_model_desc_t *d, char **json_p)
{
    json_t *root = json_object(), *layers = json_array(), *tensors = json_array(), *ties = json_array();
    json_t *in = d->p.input == BG_INPUT_TOKENS
                     ? json_pack("{s:s, s:i, s:i}", "kind", "tokens", "vocab", d->p.vocab, "seq_len", d->p.seq_len)
                     : json_pack("{s:s, s:i, s:i}", "kind", "features", "seq_len", d->p.seq_len, "features",
                                 d->p.features);
    bg_tensor_ref_t *refs = NULL;
    int n = 0;
    bg_status_t st = all_tensors(d, &refs, &n);
    if (st != BG_OK || !root || !layers || !tensors || !ties || !in) {
        json_decref(root), json_decref(layers), json_decref(tensors), json_decref(ties), json_decref(in);
        free(refs);
        return st != BG_OK ? st : bg_error(BG_ERR_NOMEM, "model description JSON");
    }
    for (int i = 0; i < d->n; i++)
        json_array_append_new(layers, json_pack("{s:s, s:s, s:I}", "name", d->layers[i]->name, "type",
                                                d->layers[i]->ops->type ? d->layers[i]->ops->type : "?", "params",
                                                (json_int_t)layer_full_params(d->layers[i])));
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        int64_t full[BG_PARAM_MAX_DIMS];
        bg_param_full_shape(refs[i].p, full);
        for (int k = 0; k < refs[i].p->ndim; k++)
            json_array_append_new(shape, json_integer(full[k]));
        json_array_append_new(tensors, json_pack("{s:s, s:o}", "name", refs[i].name, "shape", shape));
    }
    free(refs);
    for (int t = 0; t < d->nties; t++)
        json_array_append_new(ties, json_pack("[s, s]", d->ties[t].a, d->ties[t].b));
    json_object_set_new(root, "format", json_string(DESC_FORMAT));
    json_object_set_new(root, "version", json_integer(DESC_VERSION));
    json_object_set_new(root, "name", json_string(d->name));
    json_object_set_new(root, "input", in);
    json_object_set_new(root, "classes", json_integer(bg_model_desc_classes(d)));
    json_object_set_new(root, "seed", json_integer((json_int_t)d->p.seed));
    size_t total = 0;
    for (int i = 0; i < d->n; i++)
        total += layer_full_params(d->layers[i]);
    json_object_set_new(root, "params", json_integer((json_int_t)total));
    json_object_set_new(root, "layers", layers);
    json_object_set_new(root, "tensors", tensors);
    json_object_set_new(root, "ties", ties);
    if (d->has_builder)
        json_object_set_new(root, "builder", builder_json(&d->builder));
    char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text)
        return bg_error(BG_ERR_NOMEM, "model description JSON");
    *json_p = text;
    return BG_OK;
}

bg_status_t bg__desc_json_parse(const char *json, const char *where, json_t **root_p)
{
    json_error_t e;
    json_t *root = json_loads(json ? json : "", 0, &e);
    if (!root)
        return bg_error(BG_ERR_PARSE, "%s: model description is not JSON (line %d: %s)", where, e.line, e.text);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    json_t *ver = json_object_get(root, "version");
    if (!json_is_object(root) || !fmt || strcmp(fmt, DESC_FORMAT) != 0) {
        json_decref(root);
        return bg_error(BG_ERR_PARSE, "%s: not a brigade model description (no \"format\": \"%s\")", where,
                        DESC_FORMAT);
    }
    if (!json_is_integer(ver) || json_integer_value(ver) != DESC_VERSION) {
        /* format the message before the decref: ver belongs to root */
        char got[32];
        if (json_is_integer(ver))
            snprintf(got, sizeof got, "%" JSON_INTEGER_FORMAT, json_integer_value(ver));
        else
            snprintf(got, sizeof got, "%s", ver ? "not an integer" : "missing");
        bg_status_t st = bg_error(BG_ERR_PARSE, "%s: model description version %s; this library reads version %d",
                                  where, got, DESC_VERSION);
        json_decref(root);
        return st;
    }
    *root_p = root;
    return BG_OK;
}

bg_status_t bg_model_desc_match_json(const bg_model_desc_t *d, const char *json, const char *where)
{
    char *mine;
    json_t *have;
    BG_CHECK(bg__desc_json_parse(json, where, &have));
    bg_status_t st = bg_model_desc_to_json(d, &mine);
    json_t *want = st == BG_OK ? json_loads(mine, 0, NULL) : NULL;
    free(mine);
    if (!want) {
        json_decref(have);
        return st != BG_OK ? st : bg_error(BG_ERR_INTERNAL, "model description JSON does not parse back");
    }
    /* what shapes the tensors and their meaning must agree; the seed and the
     * builder's seed need not (a load replaces the initial weights) */
    static const char *keys[] = {"name", "input", "classes", "ties"};
    for (size_t i = 0; i < BG_ARRAY_LEN(keys) && st == BG_OK; i++)
        if (!json_equal(json_object_get(want, keys[i]), json_object_get(have, keys[i]))) {
            char *a = json_dumps(json_object_get(want, keys[i]), JSON_COMPACT | JSON_ENCODE_ANY);
            char *b = json_dumps(json_object_get(have, keys[i]), JSON_COMPACT | JSON_ENCODE_ANY);
            st = bg_error(BG_ERR_MISMATCH, "%s is from another model: %s %.200s there, %.200s here", where, keys[i],
                          b ? b : "(none)", a ? a : "(none)");
            free(a);
            free(b);
        }
    static const char *lists[] = {"layers", "tensors"};
    for (size_t k = 0; k < BG_ARRAY_LEN(lists) && st == BG_OK; k++) {
        json_t *wa = json_object_get(want, lists[k]), *ha = json_object_get(have, lists[k]);
        size_t nw = json_array_size(wa), nh = json_array_size(ha);
        for (size_t i = 0; i < (nw > nh ? nw : nh) && st == BG_OK; i++) {
            json_t *x = json_array_get(wa, i), *y = json_array_get(ha, i);
            if (x && y && json_equal(x, y))
                continue;
            /* a layer and its tensor-parallel form hold the same full tensors:
             * layers agree when their names and parameter counts do */
            if (k == 0 && x && y && json_equal(json_object_get(x, "name"), json_object_get(y, "name")) &&
                json_equal(json_object_get(x, "params"), json_object_get(y, "params")))
                continue;
            char *a = x ? json_dumps(x, JSON_COMPACT) : NULL, *b = y ? json_dumps(y, JSON_COMPACT) : NULL;
            st = bg_error(BG_ERR_MISMATCH, "%s is from another model: %s[%zu] %.200s there, %.200s here", where,
                          lists[k], i, b ? b : "(none)", a ? a : "(none)");
            free(a);
            free(b);
        }
    }
    json_decref(want);
    json_decref(have);
    return st;
}

int bg_model_desc_tensor_layer(const bg_model_desc_t *d, const char *name)
{
    bg_tensor_ref_t *refs = NULL;
    int n = 0, layer = -1;
    if (all_tensors(d, &refs, &n) != BG_OK)
        return -1;
    int i = find_ref(refs, n, name);
    if (i >= 0)
        layer = refs[i].layer;
    free(refs);
    return layer;
}

bg_status_t bg_model_metadata_json(const bg_model_desc_t *d, char **json_p)
{
    char *desc;
    BG_CHECK(bg_model_desc_to_json(d, &desc));
    json_t *o = json_pack("{s:s, s:s}", "format", "pt", "brigade_model", desc);
    free(desc);
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!text)
        return bg_error(BG_ERR_NOMEM, "safetensors metadata");
    *json_p = text;
    return BG_OK;
}

/* ---------------------------------------------------------------- profile */

bg_status_t bg_model_profile(const bg_model_desc_t *d, int n, int t, bg_layer_profile_t *profile, int max,
                             int *count_p)
{
    if (d->n > max)
        return bg_error(BG_ERR_INVALID, "profile needs %d entries, %d given", d->n, max);
    bg_shape_t s = bg_model_desc_input_shape(d, n, t);
    size_t es = bg_dtype_size(bg_model_desc_precision(d)), gz = bg__guard_bytes();
    for (int i = 0; i < d->n; i++) {
        bg_layer_profile_t *p = &profile[i];
        bg_shape_t o;
        BG_CHECK(bg_layer_out_shape(d->layers[i], s, &o));
        memset(p, 0, sizeof(*p));
        snprintf(p->name, sizeof(p->name), "%s", d->layers[i]->name);
        p->params = bg_layer_param_count(d->layers[i]);
        /* as models/stage.c keeps them: the outputs between layers in the precision (the losses fp32), the
         * gradients fp32; under bf16 a call's fp32 copies of its input (not the model's own) and output in
         * front of its scratch */
        int out16 = bg__kept_es(es, i, d->n) == 2, in16 = s.c && bg__kept_es(es, i - 1, d->n) == 2;
        p->output_bytes = bg_shape_numel(o) * (out16 ? 2 : sizeof(float));
        p->grad_bytes = bg_shape_numel(o) * sizeof(float);
        /* each buffer with the guard bytes after it (models/stage.c's piece) */
        p->guard_bytes = gz;
        p->stash_bytes = bg__align64(bg_layer_stash_bytes(d->layers[i], s)) + bg__align64(p->output_bytes) + 2 * gz;
        p->wstash_bytes = bg__align64(bg_layer_wstash_bytes(d->layers[i], s)) + bg__align64(p->grad_bytes) + 2 * gz;
        size_t at = (in16 ? bg__align64(bg_shape_numel(s) * sizeof(float)) + gz : 0) +
                    (out16 ? bg__align64(p->grad_bytes) + gz : 0);
        p->scratch_bytes = bg__call_scratch(at, bg_layer_scratch_bytes(d->layers[i], s));
        if (gz) /* the stage's scratch is one piece too */
            p->scratch_bytes = bg__align64(p->scratch_bytes) + gz;
        p->fwd_flops = bg_layer_fwd_flops(d->layers[i], s);
        p->bwd_flops = bg_layer_bwd_flops(d->layers[i], s);
        bg_layer_tp_cost(d->layers[i], s, &p->tp);
        s = o;
    }
    *count_p = d->n;
    return BG_OK;
}
