/* tests/bg_test_model.h: models of builder configurations for the cmocka
 * programs (each model with a description of its own), their OK() check of a
 * call, and the small configurations they share (also used by fuzz/, which
 * uses only the configurations). */
#ifndef BG_TEST_MODEL_H
#define BG_TEST_MODEL_H

#include "brigade/brigade.h"

/* A cmocka program's check of a call: a failed status fails the test with
 * the call, the status and the library's last error (needs cmocka.h). */
#define OK(call)                                                                                         \
    do {                                                                                                 \
        bg_status_t st__ = (call);                                                                       \
        if (st__ != BG_OK)                                                                               \
            fail_msg("%s -> %s: %s", #call, bg_status_string(st__), bg_last_error());                   \
    } while (0)

/* The small builder configurations the programs test with, named by the
 * fields they set (the rest BG_MODEL_CONFIG_INIT's). */
static inline bg_model_config_t bg_test_config(bg_model_kind_t kind, int layers, int d_model, uint64_t seed)
{
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    c.kind = kind;
    c.layers = layers;
    c.d_model = d_model;
    c.seed = seed;
    return c;
}

static inline bg_model_config_t bg_test_gpt_config(int layers, int d_model, int heads, int seq_len, int vocab,
                                                   uint64_t seed)
{
    bg_model_config_t c = bg_test_config(BG_MODEL_GPT, layers, d_model, seed);
    c.heads = heads;
    c.seq_len = seq_len;
    c.vocab = vocab;
    return c;
}

static inline bg_model_config_t bg_test_mlp_config(int layers, int d_model, int in_features, int classes,
                                                   uint64_t seed)
{
    bg_model_config_t c = bg_test_config(BG_MODEL_MLP, layers, d_model, seed);
    c.in_features = in_features;
    c.classes = classes;
    return c;
}

/* A model of a builder configuration, with a description of its own (so
 * that several models of one configuration can live at once); destroy it
 * with bg_test_model_destroy, which destroys the description too. */
static inline bg_status_t bg_test_model_create(const bg_model_config_t *c, bg_backend_t *b, int first, int last,
                                               bg_model_t **m_p)
{
    bg_model_desc_t *d;
    bg_status_t st = bg_model_build(c, &d);
    if (st != BG_OK)
        return st;
    st = bg_model_create(d, b, first, last, m_p);
    if (st != BG_OK)
        bg_model_desc_destroy(d);
    return st;
}

static inline void bg_test_model_destroy(bg_model_t *m)
{
    if (!m)
        return;
    bg_model_desc_t *d = (bg_model_desc_t *)bg_model_desc(m);
    bg_model_destroy(m);
    bg_model_desc_destroy(d);
}

/* The per-layer profile of a builder configuration. */
static inline bg_status_t bg_test_profile(const bg_model_config_t *c, int n, int t, bg_layer_profile_t *prof, int max,
                                          int *count_p)
{
    bg_model_desc_t *d;
    bg_status_t st = bg_model_build(c, &d);
    if (st == BG_OK)
        st = bg_model_profile(d, n, t, prof, max, count_p);
    bg_model_desc_destroy(d);
    return st;
}

#endif
