/* models/model_impl.h: what models/ shares between its files about model
 * descriptions (never included above models/). */
#ifndef BG_MODELS_MODEL_IMPL_H
#define BG_MODELS_MODEL_IMPL_H

#include "brigade/model.h"

/* A tensor of a layer tree with its full name ("blocks.3.attn.qkv.weight"). */
typedef struct bg_tensor_ref {
    char name[2 * BG_NAME_MAX];
    bg_param_t *p;
    int layer; /* top-level layer index */
} bg_tensor_ref_t;

/* Tensors of top-level layers [first, last] in the fixed order (depth first,
 * parameters before children). refs NULL: count only. */
void bg__desc_tensors(const bg_model_desc_t *d, int first, int last, bg_tensor_ref_t *refs, int *n_p);

/* Mark layers [first, last] bound to a model (on = 1) or free them (on = 0);
 * binding fails naming the layer when one is bound already. */
bg_status_t bg__desc_bind(bg_model_desc_t *d, int first, int last, int on);

/* The builder that made the description (NULL if none). */
const bg_model_config_t *bg__desc_builder(const bg_model_desc_t *d);
void bg__desc_set_builder(bg_model_desc_t *d, const bg_model_config_t *cfg);
/* A Llama configuration's SwiGLU hidden size (ffn_hidden, or its default) (models/builders.c). */
int bg__llama_ffn(const bg_model_config_t *c);

/* Parse a description's JSON text (jansson's json_t), checking its format
 * and version; @p where starts the error messages. */
struct json_t;
bg_status_t bg__desc_json_parse(const char *json, const char *where, struct json_t **root_p);

/* FNV-1a of a string: the per-tensor initialisation seed is seed ^ fnv1a(name). */
uint64_t bg__fnv1a(const char *s);

/* bg_model_create without the flat gradient buffer (the tensors' grad NULL
 * until bg_model_grads_hold(m, 1) or a sharding strategy aims them): --zero 2
 * and 3 never hold the whole gradients, not even while the model is made. */
bg_status_t bg__model_create_gradless(bg_model_desc_t *desc, bg_backend_t *be, int first, int last,
                                      bg_model_t **model_p);

#endif
