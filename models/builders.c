/* models/builders.c: the built-in model builders, GPT, Llama and MLP. Each
 * makes a plain model description; nothing downstream knows which builder
 * made it (its JSON records the builder so that a file can rebuild it:
 * bg_model_desc_from_json, here). Uses desc.c; desc.c never calls back. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "models/model_impl.h"

/* What the tensor-parallel degree must divide, named by layer, before any
 * rank allocates. */
static bg_status_t tp_check(const bg_model_config_t *c)
{
    int tp = c->tp ? c->tp : 1; /* 0: a config filled without BG_MODEL_CONFIG_INIT */
    if (tp < 1)
        return bg_error(BG_ERR_INVALID, "tp must be >= 1 (got %d)", tp);
    if (tp == 1)
        return BG_OK;
    if (c->sequence_parallel && c->kind == BG_MODEL_MLP)
        return bg_error(BG_ERR_INVALID, "sequence parallelism needs a GPT or a Llama (an MLP has no sequence to split)");
    if (c->sequence_parallel && c->seq_len % tp != 0)
        return bg_error(BG_ERR_INVALID, "sequence parallelism: the sequence length %d is not divisible by tp %d", c->seq_len,
                        tp);
    if (c->kind == BG_MODEL_LLAMA) {
        int kv = c->kv_heads ? c->kv_heads : c->heads;
        if (kv % tp != 0)
            return bg_error(BG_ERR_INVALID, "tp %d: layer blocks.0.attn has %d key/value heads (--kv-heads), which tp "
                                            "%d does not divide: each member holds whole key/value groups "
                                            "(--kv-heads must be a multiple of tp)", tp, kv, tp);
        if (bg__llama_ffn(c) % tp != 0)
            return bg_error(BG_ERR_INVALID, "tp %d: layer blocks.0.mlp has a SwiGLU hidden size of %d, which tp %d "
                                            "does not divide", tp, bg__llama_ffn(c), tp);
    }
    if (c->kind == BG_MODEL_GPT || c->kind == BG_MODEL_LLAMA) {
        if (c->heads % tp != 0)
            return bg_error(BG_ERR_INVALID, "tp %d: layer blocks.0.attn has %d heads, which tp %d does not divide", tp,
                            c->heads, tp);
        if (c->vocab % tp != 0)
            return bg_error(BG_ERR_INVALID, "tp %d: layers embed and head have a vocabulary of %d, which tp %d does "
                                            "not divide", tp, c->vocab, tp);
    } else {
        if (c->layers > 1 && c->d_model % tp != 0)
            return bg_error(BG_ERR_INVALID, "tp %d: layer fc.0 has %d output features (d_model), which tp %d does not "
                                            "divide", tp, c->d_model, tp);
        if (c->classes % tp != 0)
            return bg_error(BG_ERR_INVALID, "tp %d: layer head has %d classes, which tp %d does not divide", tp,
                            c->classes, tp);
    }
    return BG_OK;
}

/* The MoE fields: only on token models. Under tp each member runs the whole MoE layer (its router and its
 * experts whole) on the same tokens; sequence parallelism, which gives each member a slice of them, is refused. */
static bg_status_t moe_check(const bg_model_config_t *c)
{
    if (c->experts == 0)
        return BG_OK;
    if (c->experts < 0 || (c->kind != BG_MODEL_GPT && c->kind != BG_MODEL_LLAMA))
        return bg_error(BG_ERR_INVALID, "experts %d: MoE blocks need a GPT or a Llama and experts >= 1", c->experts);
    if (c->top_k < 1 || c->top_k > c->experts || c->top_k > 64)
        return bg_error(BG_ERR_INVALID, "top_k %d must be in 1 .. min(experts %d, 64)", c->top_k, c->experts);
    if (c->moe_every < 1)
        return bg_error(BG_ERR_INVALID, "moe_every must be >= 1 (got %d)", c->moe_every);
    if (!(c->capacity_factor >= 0) || !isfinite(c->capacity_factor) || !(c->moe_aux_coef >= 0) ||
        !isfinite(c->moe_aux_coef))
        return bg_error(BG_ERR_INVALID, "capacity_factor %g and moe_aux_coef %g must be finite and >= 0",
                        (double)c->capacity_factor, (double)c->moe_aux_coef);
    if (c->moe_gate != BG_MOE_SOFTMAX && c->moe_gate != BG_MOE_SIGMOID)
        return bg_error(BG_ERR_INVALID, "moe_gate %d is neither softmax nor sigmoid", (int)c->moe_gate);
    if (c->tp > 1 && c->sequence_parallel)
        return bg_error(BG_ERR_UNSUPPORTED, "tp %d with --sequence-parallel: MoE layers under sequence parallelism "
                                            "are not built (MoE composes with tp without it)", c->tp);
    if (c->ep > 1 && c->experts % c->ep != 0)
        return bg_error(BG_ERR_INVALID, "ep %d does not divide experts %d (each rank of an expert-parallel group holds "
                                        "experts / ep experts)", c->ep, c->experts);
    return BG_OK;
}

bg_status_t bg_model_config_check(const bg_model_config_t *c)
{
    if (c->layers < 1)
        return bg_error(BG_ERR_INVALID, "layers must be >= 1 (got %d)", c->layers);
    if (c->d_model < 1)
        return bg_error(BG_ERR_INVALID, "d_model must be >= 1 (got %d)", c->d_model);
    if (c->kind == BG_MODEL_GPT || c->kind == BG_MODEL_LLAMA) {
        if (c->heads < 1 || c->d_model % c->heads != 0)
            return bg_error(BG_ERR_INVALID, "heads (%d) must divide d_model (%d)", c->heads, c->d_model);
        if (c->kind == BG_MODEL_LLAMA) {
            if (c->kv_heads < 0 || (c->kv_heads && c->heads % c->kv_heads != 0))
                return bg_error(BG_ERR_INVALID, "kv_heads (%d) must divide heads (%d)", c->kv_heads, c->heads);
            if ((c->d_model / c->heads) % 2 != 0 || c->d_model / c->heads > 1024)
                return bg_error(BG_ERR_INVALID, "the head size d_model / heads = %d must be even and at most 1024 "
                                                "(rotary pairs)", c->d_model / c->heads);
            if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
                return bg_error(BG_ERR_INVALID, "rope_theta must be > 1 (got %g)", (double)c->rope_theta);
            if (c->ffn_hidden < 0)
                return bg_error(BG_ERR_INVALID, "ffn_hidden must be >= 0 (got %d)", c->ffn_hidden);
        }
        if (c->seq_len < 1)
            return bg_error(BG_ERR_INVALID, "seq_len must be >= 1 (got %d)", c->seq_len);
        if (c->vocab < 2)
            return bg_error(BG_ERR_INVALID, "vocab must be >= 2 (got %d)", c->vocab);
    } else if (c->kind == BG_MODEL_MLP) {
        if (c->tie_embeddings)
            return bg_error(BG_ERR_INVALID, "tied embeddings need a GPT or a Llama (an MLP has no embedding)");
        if (c->in_features < 1)
            return bg_error(BG_ERR_INVALID, "in_features must be >= 1 (got %d)", c->in_features);
        if (c->classes < 2)
            return bg_error(BG_ERR_INVALID, "classes must be >= 2 (got %d)", c->classes);
    } else {
        return bg_error(BG_ERR_INVALID, "unknown model kind %d", (int)c->kind);
    }
    if (c->precision != BG_F32 && c->precision != BG_BF16)
        return bg_error(BG_ERR_INVALID, "precision must be fp32 or bf16 (got %d)", (int)c->precision);
    if (c->precision == BG_BF16 && c->kind == BG_MODEL_MLP)
        return bg_error(BG_ERR_INVALID, "precision bf16 needs a GPT or a Llama: bf16 stores the activations kept inside "
                                        "composite layers (a GPT's blocks), and the MLP has none");
    BG_CHECK(moe_check(c));
    return tp_check(c);
}

/* Add l to d, switched to sequence parallelism when sp. */
static bg_status_t add(bg_model_desc_t *d, bg_layer_t *l, int sp)
{
    bg_status_t st = sp ? bg_layer_sequence_parallel(l) : BG_OK;
    if (st != BG_OK) {
        bg_layer_destroy(l);
        return st;
    }
    return bg_model_desc_add(d, l);
}

/* The MoE layer of block i, or NULL when block i's MLP is dense. */
static const bg_moe_t *block_moe(const bg_model_config_t *c, int i, float std, float proj_std, bg_moe_t *m)
{
    if (c->experts < 1 || (i + 1) % c->moe_every != 0)
        return NULL;
    *m = (bg_moe_t){.c = c->d_model, .experts = c->experts, .top_k = c->top_k, .ffn = bg__llama_ffn(c),
                    .gate = c->moe_gate, .capacity_factor = c->capacity_factor, .aux_coef = c->moe_aux_coef,
                    .init_std = std, .proj_std = proj_std, .ep = c->ep > 1 ? c->ep : 1};
    return m;
}

/* A GPT block whose MLP is an MoE: attn as bg_layer_tp_attention_block, then mlp = x + moe(ln(x)) (the MoE
 * whole on every tensor-parallel member, replicated as the LayerNorm is). */
static bg_status_t gpt_moe_block(const char *name, const bg_model_config_t *c, float std, float proj_std,
                                 const bg_moe_t *m, bg_layer_t **layer_p)
{
    bg_layer_t *ch[2] = {0}, *mc[2] = {0}, *inner = NULL;
    bg_status_t st = bg_layer_tp_attention_block("attn", c->d_model, c->heads, std, proj_std, c->tp, &ch[0]);
    if (st == BG_OK)
        st = bg_layer_layernorm("ln", c->d_model, &mc[0]);
    if (st == BG_OK)
        st = bg_layer_moe("moe", m, &mc[1]);
    if (st == BG_OK) { /* seq and residual own their children from here, also on failure */
        st = bg_layer_seq("", 2, mc, &inner);
        mc[0] = mc[1] = NULL;
        if (st == BG_OK)
            st = bg_layer_residual("mlp", inner, &ch[1]);
    }
    if (st != BG_OK) {
        for (int i = 0; i < 2; i++) {
            bg_layer_destroy(ch[i]);
            bg_layer_destroy(mc[i]);
        }
        return st;
    }
    return bg_layer_seq(name, 2, ch, layer_p);
}

static bg_status_t build_gpt(const bg_model_config_t *c, bg_model_desc_t *d)
{
    int sp = c->tp > 1 && c->sequence_parallel;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)c->layers);
    char name[BG_NAME_MAX];
    bg_layer_t *l;
    int tp = c->tp;
    if (tp > 1)
        BG_CHECK(bg_layer_vocab_embedding("embed", c->vocab, c->seq_len, c->d_model, std, tp, &l));
    else
        BG_CHECK(bg_layer_embedding("embed", c->vocab, c->seq_len, c->d_model, std, &l));
    BG_CHECK(add(d, l, sp));
    for (int i = 0; i < c->layers; i++) {
        snprintf(name, sizeof(name), "blocks.%d", i);
        bg_moe_t mo;
        const bg_moe_t *moe = block_moe(c, i, std, proj_std, &mo);
        if (moe)
            BG_CHECK(gpt_moe_block(name, c, std, proj_std, moe, &l));
        else if (tp > 1)
            BG_CHECK(bg_layer_tp_transformer_block(name, c->d_model, c->heads, std, proj_std, tp, &l));
        else
            BG_CHECK(bg_layer_transformer_block(name, c->d_model, c->heads, std, proj_std, &l));
        BG_CHECK(add(d, l, sp));
    }
    BG_CHECK(bg_layer_layernorm("ln_f", c->d_model, &l));
    BG_CHECK(add(d, l, sp));
    if (tp > 1)
        BG_CHECK(bg_layer_vocab_head("head", c->d_model, c->vocab, 0, std, tp, &l));
    else
        BG_CHECK(bg_layer_head("head", c->d_model, c->vocab, 0, std, &l));
    BG_CHECK(add(d, l, sp));
    if (c->tie_embeddings)
        BG_CHECK(bg_model_desc_tie(d, "embed.wte", "head.weight"));
    return BG_OK;
}

int bg__llama_ffn(const bg_model_config_t *c)
{
    if (c->ffn_hidden > 0)
        return c->ffn_hidden;
    int h = (8 * c->d_model + 2) / 3; /* 8d/3 rounded up: the parameters of a 4d GELU MLP */
    return (h + 63) / 64 * 64;
}

static bg_status_t build_llama(const bg_model_config_t *c, bg_model_desc_t *d)
{
    int sp = c->tp > 1 && c->sequence_parallel, tp = c->tp;
    bg_llama_block_t b = {c->d_model, c->heads, c->kv_heads ? c->kv_heads : c->heads, bg__llama_ffn(c), c->rope_theta,
                          0.02f, 0.02f / sqrtf(2.0f * (float)c->layers), NULL};
    char name[BG_NAME_MAX];
    bg_layer_t *l;
    if (tp > 1)
        BG_CHECK(bg_layer_vocab_token_embedding("embed", c->vocab, c->seq_len, c->d_model, b.init_std, tp, &l));
    else
        BG_CHECK(bg_layer_token_embedding("embed", c->vocab, c->seq_len, c->d_model, b.init_std, &l));
    BG_CHECK(add(d, l, sp));
    for (int i = 0; i < c->layers; i++) {
        snprintf(name, sizeof(name), "blocks.%d", i);
        bg_moe_t mo;
        b.moe = block_moe(c, i, b.init_std, b.proj_std, &mo);
        BG_CHECK(bg_layer_llama_block(name, &b, tp, &l));
        BG_CHECK(add(d, l, sp));
    }
    BG_CHECK(bg_layer_rmsnorm("norm", c->d_model, &l));
    BG_CHECK(add(d, l, sp));
    if (tp > 1)
        BG_CHECK(bg_layer_vocab_head("head", c->d_model, c->vocab, 0, b.init_std, tp, &l));
    else
        BG_CHECK(bg_layer_head("head", c->d_model, c->vocab, 0, b.init_std, &l));
    BG_CHECK(add(d, l, sp));
    if (c->tie_embeddings)
        BG_CHECK(bg_model_desc_tie(d, "embed.wte", "head.weight"));
    return BG_OK;
}

static bg_status_t build_mlp(const bg_model_config_t *c, bg_model_desc_t *d)
{
    char name[BG_NAME_MAX];
    bg_layer_t *l;
    int in = c->in_features;
    for (int i = 0; i < c->layers; i++) {
        snprintf(name, sizeof(name), "fc.%d", i);
        float std = sqrtf(2.0f / (float)in);
        /* tp > 1: pairs of column- then row-parallel layers (one sum forward,
         * one backward per pair); a last unpaired layer is replicated */
        if (c->tp > 1 && i % 2 == 0 && i + 1 < c->layers)
            BG_CHECK(bg_layer_column_linear(name, in, c->d_model, 1, 1, std, c->tp, &l));
        else if (c->tp > 1 && i % 2 == 1)
            BG_CHECK(bg_layer_row_linear(name, in, c->d_model, 1, std, c->tp, &l));
        else
            BG_CHECK(bg_layer_linear(name, in, c->d_model, 1, std, &l));
        BG_CHECK(bg_model_desc_add(d, l));
        snprintf(name, sizeof(name), "act.%d", i);
        BG_CHECK(bg_layer_activation(name, BG_ACT_RELU, &l));
        BG_CHECK(bg_model_desc_add(d, l));
        in = c->d_model;
    }
    if (c->tp > 1)
        BG_CHECK(bg_layer_vocab_head("head", in, c->classes, 1, sqrtf(1.0f / (float)in), c->tp, &l));
    else
        BG_CHECK(bg_layer_head("head", in, c->classes, 1, sqrtf(1.0f / (float)in), &l));
    return bg_model_desc_add(d, l);
}

bg_status_t bg_model_build(const bg_model_config_t *cfg, bg_model_desc_t **desc_p)
{
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    memcpy(&c, cfg, cfg->size < sizeof(c) ? cfg->size : sizeof(c));
    c.size = sizeof(c);
    if (c.tp == 0)
        c.tp = 1;
    BG_CHECK(bg_model_config_check(&c));
    int gpt = c.kind == BG_MODEL_GPT || c.kind == BG_MODEL_LLAMA; /* a token model */
    bg_model_desc_params_t p = BG_MODEL_DESC_PARAMS_INIT;
    p.name = c.kind == BG_MODEL_GPT ? "gpt" : c.kind == BG_MODEL_LLAMA ? "llama" : "mlp";
    p.input = gpt ? BG_INPUT_TOKENS : BG_INPUT_FEATURES;
    p.vocab = gpt ? c.vocab : 0;
    p.seq_len = gpt ? c.seq_len : 1;
    p.features = gpt ? 0 : c.in_features;
    p.seed = c.seed;
    bg_model_desc_t *d;
    BG_CHECK(bg_model_desc_create(&p, &d));
    bg_status_t st = c.kind == BG_MODEL_GPT ? build_gpt(&c, d) : c.kind == BG_MODEL_LLAMA ? build_llama(&c, d)
                                                                                      : build_mlp(&c, d);
    if (st == BG_OK)
        st = bg_model_desc_set_precision(d, c.precision);
    if (st == BG_OK)
        st = bg_model_desc_check(d);
    if (st != BG_OK) {
        bg_model_desc_destroy(d);
        return st;
    }
    bg__desc_set_builder(d, &c);
    *desc_p = d;
    return BG_OK;
}

/* A description from its JSON: only a builder-made one can be rebuilt, by its builder, and it must
 * then match the file (bg_model_desc_match_json). Here, not in desc.c, so that descriptions know
 * nothing of the builders made of them. */
static bg_status_t int_field(json_t *o, const char *key, const char *where, long long lo, long long hi, long long *v)
{
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi)
        return bg_error(BG_ERR_PARSE, "%s: model description field \"%s\" is missing or not an integer in [%lld, %lld]",
                        where, key, lo, hi);
    *v = json_integer_value(x);
    return BG_OK;
}

static bg_status_t moe_from_json(json_t *b, bg_model_config_t *c)
{
    const char *w = "model description builder";
    long long e = 0, k = 0, every = 0, ffn = 0;
    BG_CHECK(int_field(b, "experts", w, 1, 1 << 20, &e));
    BG_CHECK(int_field(b, "top_k", w, 1, 64, &k));
    BG_CHECK(int_field(b, "moe_every", w, 1, 1 << 30, &every));
    BG_CHECK(int_field(b, "ffn_hidden", w, 0, 1 << 30, &ffn));
    json_t *cf = json_object_get(b, "capacity_factor"), *aux = json_object_get(b, "moe_aux_coef");
    const char *gate = json_string_value(json_object_get(b, "moe_gate"));
    if (!json_is_number(cf) || !json_is_number(aux))
        return bg_error(BG_ERR_PARSE, "%s: \"capacity_factor\" or \"moe_aux_coef\" is missing or not a number", w);
    if (!gate || (strcmp(gate, "softmax") && strcmp(gate, "sigmoid")))
        return bg_error(BG_ERR_PARSE, "%s: \"moe_gate\" is missing or neither softmax nor sigmoid", w);
    c->experts = (int)e, c->top_k = (int)k, c->moe_every = (int)every, c->ffn_hidden = (int)ffn;
    c->capacity_factor = (float)json_number_value(cf);
    c->moe_aux_coef = (float)json_number_value(aux);
    c->moe_gate = strcmp(gate, "sigmoid") == 0 ? BG_MOE_SIGMOID : BG_MOE_SOFTMAX;
    return BG_OK;
}

bg_status_t bg_model_desc_from_json(const char *json, bg_model_desc_t **desc_p)
{
    json_t *root;
    BG_CHECK(bg__desc_json_parse(json, "model description", &root));
    json_t *b = json_object_get(root, "builder");
    bg_status_t st = BG_OK;
    if (!json_is_object(b)) {
        st = bg_error(BG_ERR_UNSUPPORTED, "model %s was built from the host's own layers, which a file cannot rebuild: "
                                          "build the same description in code and pass it instead",
                      json_string_value(json_object_get(root, "name")) ? json_string_value(json_object_get(root, "name"))
                                                                        : "?");
        json_decref(root);
        return st;
    }
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    const char *kind = json_string_value(json_object_get(b, "name"));
    if (!kind || (strcmp(kind, "gpt") && strcmp(kind, "mlp") && strcmp(kind, "llama"))) {
        /* kind belongs to root: the message first */
        st = bg_error(BG_ERR_PARSE, "model description: unknown builder \"%.64s\" (known: gpt, llama, mlp)",
                      kind ? kind : "");
        json_decref(root);
        return st;
    }
    c.kind = strcmp(kind, "gpt") == 0 ? BG_MODEL_GPT : strcmp(kind, "llama") == 0 ? BG_MODEL_LLAMA : BG_MODEL_MLP;
    struct {
        const char *k;
        int *v;
    } f[] = {{"layers", &c.layers}, {"d_model", &c.d_model}, {"heads", &c.heads}, {"seq_len", &c.seq_len},
             {"vocab", &c.vocab}, {"in_features", &c.in_features}, {"classes", &c.classes}};
    for (size_t i = 0; i < BG_ARRAY_LEN(f) && st == BG_OK; i++) {
        long long v = 0;
        st = int_field(b, f[i].k, "model description builder", 0, 1 << 30, &v);
        *f[i].v = (int)v;
    }
    long long seed = 0;
    if (st == BG_OK)
        st = int_field(b, "seed", "model description builder", INT64_MIN, INT64_MAX, &seed);
    c.seed = (uint64_t)seed;
    json_t *tie = json_object_get(b, "tie_embeddings");
    if (st == BG_OK && !json_is_boolean(tie))
        st = bg_error(BG_ERR_PARSE, "model description builder: \"tie_embeddings\" is missing or not a boolean");
    c.tie_embeddings = json_is_true(tie);
    if (st == BG_OK && c.kind == BG_MODEL_LLAMA) { /* the Llama's own fields */
        long long kv = 0, ffn = 0;
        json_t *theta = json_object_get(b, "rope_theta");
        st = int_field(b, "kv_heads", "model description builder", 0, 1 << 30, &kv);
        if (st == BG_OK)
            st = int_field(b, "ffn_hidden", "model description builder", 0, 1 << 30, &ffn);
        if (st == BG_OK && !json_is_number(theta))
            st = bg_error(BG_ERR_PARSE, "model description builder: \"rope_theta\" is missing or not a number");
        c.kv_heads = (int)kv;
        c.ffn_hidden = (int)ffn;
        c.rope_theta = (float)json_number_value(theta);
    }
    if (st == BG_OK && json_object_get(b, "experts")) /* an MoE model's fields (absent: dense) */
        st = moe_from_json(b, &c);
    /* each builder layer makes at least one top-level layer (a GPT's block, an
     * MLP's linear): a count the description's own list cannot hold is refused
     * before anything is built, so a small hostile file cannot ask for 2^30 */
    size_t listed = json_array_size(json_object_get(root, "layers"));
    if (st == BG_OK && (size_t)c.layers > listed)
        st = bg_error(BG_ERR_PARSE, "model description builder: \"layers\" is %d but the description lists %zu "
                                    "top-level layers (a %s of %d layers has more)", c.layers, listed, kind, c.layers);
    bg_model_desc_t *d = NULL;
    if (st == BG_OK)
        st = bg_model_build(&c, &d);
    if (st == BG_OK && (st = bg_model_desc_match_json(d, json, "model description")) != BG_OK) {
        bg_model_desc_destroy(d);
        d = NULL;
    }
    json_decref(root);
    if (st == BG_OK)
        *desc_p = d;
    return st;
}
