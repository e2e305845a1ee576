/* tests/models/test_model.c: models, stages, data, safetensors and training.
 * The split tests are the single-process form of pipeline equivalence: a
 * model cut into stages that pass activations and gradients by hand must
 * give bitwise the gradients of the whole model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "bg_test_backend.h"
#include "bg_test_model.h"

/* Under AddressSanitizer the out-of-memory probe (test_stage_misuse) must get NULL, as it does from the real
 * allocators, instead of ASan's abort (as test_conformance). */
const char *__asan_default_options(void) __attribute__((used));
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static bg_model_config_t small_gpt(void) { return bg_test_gpt_config(3, 16, 2, 8, 256, 7); }
static bg_model_config_t small_mlp(void) { return bg_test_mlp_config(3, 24, 10, 5, 3); }

static void test_param_count(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    bg_model_t *m;
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m), BG_OK);
    size_t C = 16, V = 256, T = 8, L = 3;
    size_t expect = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C + V * C;
    assert_int_equal(bg_model_param_count(m), expect);
    assert_int_equal(bg_model_total_layers(m), 6);
    assert_non_null(bg_model_find_tensor(m, "blocks.1.attn.qkv.weight"));
    assert_non_null(bg_model_find_tensor(m, "blocks.2.mlp.proj.bias"));
    assert_non_null(bg_model_find_tensor(m, "embed.wte"));
    assert_non_null(bg_model_find_tensor(m, "head.weight"));
    bg_layer_profile_t prof[16];
    int n;
    assert_int_equal(bg_test_profile(&c, 2, 8, prof, 16, &n), BG_OK);
    assert_int_equal(n, 6);
    size_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += prof[i].params;
    assert_int_equal(sum, expect);
    /* linear FLOPs of a block: 2 * rows * (3C*C + C*C + 4C*C + 4C*C) forward */
    assert_true(prof[1].fwd_flops >= 2.0 * 16 * 12 * C * C);
    assert_int_equal(prof[1].output_bytes, 2 * 8 * C * sizeof(float));
    bg_test_model_destroy(m);
    c.heads = 3;
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "heads (3) must divide d_model (16)"));
}

/* A builder-made description gives its configuration back, also after a
 * round trip through its JSON; a description of the host's own layers has none. */
static void test_desc_builder(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt(), got;
    c.tie_embeddings = 1;
    bg_model_desc_t *d, *r;
    assert_int_equal(bg_model_build(&c, &d), BG_OK);
    char *json;
    assert_int_equal(bg_model_desc_to_json(d, &json), BG_OK);
    assert_int_equal(bg_model_desc_from_json(json, &r), BG_OK);
    free(json);
    assert_int_equal(bg_model_desc_builder(r, &got), BG_OK);
    assert_int_equal(got.kind, c.kind);
    assert_int_equal(got.layers, c.layers);
    assert_int_equal(got.d_model, c.d_model);
    assert_int_equal(got.heads, c.heads);
    assert_int_equal(got.seq_len, c.seq_len);
    assert_int_equal(got.vocab, c.vocab);
    assert_int_equal(got.seed, c.seed);
    assert_int_equal(got.tie_embeddings, 1);
    bg_model_desc_destroy(r);
    bg_model_desc_destroy(d);
    bg_model_desc_params_t dp = BG_MODEL_DESC_PARAMS_INIT;
    dp.features = 4, dp.name = "own";
    bg_layer_t *head;
    assert_int_equal(bg_model_desc_create(&dp, &d), BG_OK);
    assert_int_equal(bg_layer_head("head", 4, 3, 1, 0.1f, &head), BG_OK);
    assert_int_equal(bg_model_desc_add(d, head), BG_OK);
    assert_int_equal(bg_model_desc_builder(d, &got), BG_ERR_UNSUPPORTED);
    assert_non_null(strstr(bg_last_error(), "model own"));
    bg_model_desc_destroy(d);
}

static void test_init_independent_of_range(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    bg_model_t *full, *part;
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &full), BG_OK);
    assert_int_equal(bg_test_model_create(&c, be, 2, 3, &part), BG_OK);
    assert_true(bg_model_param_count(part) < bg_model_param_count(full));
    for (int i = 0; i < bg_model_num_tensors(part); i++) {
        bg_param_t *p = bg_model_tensor(part, i);
        bg_param_t *q = bg_model_find_tensor(full, bg_model_tensor_name(part, i));
        assert_non_null(q);
        assert_int_equal(p->numel, q->numel);
        assert_memory_equal(p->data, q->data, p->numel * sizeof(float));
    }
    bg_test_model_destroy(full);
    bg_test_model_destroy(part);
    assert_int_equal(bg_test_model_create(&c, be, 4, 9, &part), BG_ERR_INVALID);
}

/* A model of some tensors (a parameter server's share): those tensors only,
 * in the description's order, initialised as in the whole model, with an
 * optimizer step of their own; a bad selection is refused. */
static void test_model_of_tensors(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    bg_model_t *full, *some;
    bg_model_desc_t *d;
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &full), BG_OK);
    assert_int_equal(bg_model_build(&c, &d), BG_OK);
    int n = bg_model_desc_num_tensors(d);
    assert_int_equal(n, bg_model_num_tensors(full));
    unsigned char *which = calloc((size_t)n, 1);
    size_t want = 0;
    for (int i = 0; i < n; i++) {
        which[i] = i % 3 == 1;
        want += which[i] ? bg_model_tensor(full, i)->numel : 0;
        char name[2 * BG_NAME_MAX];
        size_t numel = 0;
        assert_int_equal(bg_model_desc_tensor(d, i, name, sizeof name, &numel), BG_OK);
        assert_int_equal(numel, bg_model_tensor(full, i)->numel);
        assert_string_equal(name, bg_model_tensor_name(full, i));
    }
    assert_int_equal(bg_model_desc_tensor(d, n, NULL, 0, NULL), BG_ERR_INVALID);
    assert_int_equal(bg_model_create_tensors(d, be, which, &some), BG_OK);
    assert_int_equal(bg_model_param_count(some), want);
    for (int i = 0, k = 0; i < n; i++) {
        if (!which[i])
            continue;
        assert_string_equal(bg_model_tensor_name(some, k), bg_model_tensor_name(full, i));
        bg_param_t *p = bg_model_tensor(some, k++), *q = bg_model_tensor(full, i);
        assert_memory_equal(p->data, q->data, p->numel * sizeof(float));
    }
    assert_null(bg_model_find_tensor(some, bg_model_tensor_name(full, 0)));
    bg_optim_config_t o = BG_OPTIM_CONFIG_INIT;
    assert_int_equal(bg_model_optim_step(some, &o, 1), BG_OK);
    assert_non_null(bg_model_optim_state(some, 1));
    assert_int_equal(bg_model_create_tensors(d, be, NULL, &some), BG_ERR_INVALID);
    bg_model_destroy(some);
    bg_model_desc_destroy(d);
    bg_test_model_destroy(full);
    free(which);
}

/* bg_model_optim_step_range over a split of the flat buffer at tensor
 * boundaries (the executor's buckets, in any order) gives the bits of one
 * bg_model_optim_step; a range updates its tensors only. */
static void test_optim_step_range(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    bg_model_t *a, *b;
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &a), BG_OK);
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &b), BG_OK);
    size_t n = bg_model_param_count(a);
    bg_rng_t r;
    bg_rng_seed(&r, 7);
    for (size_t i = 0; i < n; i++)
        bg_model_grads(a)[i] = bg_model_grads(b)[i] = (float)bg_rng_normal(&r);
    bg_optim_config_t o = BG_OPTIM_CONFIG_INIT;
    o.weight_decay = 0.1f;
    int nt = bg_model_num_tensors(a), cut = nt / 2;
    size_t mid = (size_t)(bg_model_tensor(b, cut)->data - bg_model_params(b));
    float *before = malloc(n * sizeof(float));
    memcpy(before, bg_model_params(b), n * sizeof(float));
    for (int t = 1; t <= 3; t++) {
        assert_int_equal(bg_model_optim_step(a, &o, t), BG_OK);
        assert_int_equal(bg_model_optim_step_range(b, &o, t, mid, n - mid), BG_OK); /* the last layers first */
        if (t == 1) /* the first range alone: the tensors before it untouched */
            assert_memory_equal(bg_model_params(b), before, mid * sizeof(float));
        assert_int_equal(bg_model_optim_step_range(b, &o, t, 0, mid), BG_OK);
    }
    assert_memory_equal(bg_model_params(a), bg_model_params(b), n * sizeof(float));
    assert_memory_equal(bg_model_optim_state(a, 0), bg_model_optim_state(b, 0), n * sizeof(float));
    assert_memory_equal(bg_model_optim_state(a, 1), bg_model_optim_state(b, 1), n * sizeof(float));
    free(before);
    bg_test_model_destroy(a);
    bg_test_model_destroy(b);
}

/* Run M microbatches through stages [cuts] chained by hand; return the models. */
static void run_split(const bg_model_config_t *c, int nst, const int *first, const int *last, int split_bw,
                      bg_model_t **models)
{
    int gpt = c->kind == BG_MODEL_GPT;
    int M = 3, n = 2, T = gpt ? c->seq_len : 1;
    bg_data_t *data;
    if (gpt) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/data/kjv.txt", getenv("BRIGADE_SOURCE_DIR"));
        assert_int_equal(bg_data_open_text(path, T, 1, &data), BG_OK);
    } else {
        assert_int_equal(bg_data_synthetic(c->in_features, c->classes, 1, &data), BG_OK);
    }
    bg_stage_t *st[8];
    for (int k = 0; k < nst; k++) {
        assert_int_equal(bg_test_model_create(c, be, first[k], last[k], &models[k]), BG_OK);
        assert_int_equal(bg_stage_create(models[k], M, &st[k]), BG_OK);
    }
    int32_t tok[64], tgt[64];
    float inp[64 * 16];
    float scale = 1.0f / (float)(M * n * T);
    for (int mb = 0; mb < M; mb++) {
        assert_int_equal(bg_data_batch(data, 0, mb * n, n, T, tok, inp, tgt), BG_OK);
        bg_shape_t shape = bg_model_input_shape(models[0], n, T);
        float *prev = NULL;
        for (int k = 0; k < nst; k++) {
            float *in, *out;
            bg_shape_t os;
            assert_int_equal(bg_stage_begin(st[k], mb, shape, &in), BG_OK);
            if (k == 0 && !gpt)
                memcpy(in, inp, (size_t)n * c->in_features * sizeof(float));
            if (k > 0)
                memcpy(in, prev, bg_shape_numel(shape) * sizeof(float));
            assert_int_equal(bg_stage_set_data(st[k], mb, k == 0 && gpt ? tok : NULL, k == nst - 1 ? tgt : NULL, scale),
                             BG_OK);
            assert_int_equal(bg_stage_forward(st[k], mb, &out, &os), BG_OK);
            prev = out;
            shape = os;
        }
    }
    for (int mb = 0; mb < M; mb++) {
        float *din = NULL, dbuf[4096];
        for (int k = nst - 1; k >= 0; k--) {
            if (k < nst - 1) {
                float *dout;
                assert_int_equal(bg_stage_grad_buffer(st[k], mb, &dout), BG_OK);
                /* every stage boundary here carries (n, T, d_model) activations */
                size_t bytes = (size_t)n * T * c->d_model * sizeof(float);
                memcpy(dout, din, bytes);
            }
            float *d;
            if (split_bw) {
                assert_int_equal(bg_stage_backward_input(st[k], mb, &d), BG_OK);
                if (k > 0)
                    memcpy(din = dbuf, d, (size_t)n * T * c->d_model * sizeof(float));
                assert_int_equal(bg_stage_backward_weight(st[k], mb), BG_OK);
            } else {
                assert_int_equal(bg_stage_backward(st[k], mb, &d), BG_OK);
                /* all but din goes (as the executor does while din is being sent); din is read after it */
                size_t held = bg_backend_memstats(be).current;
                assert_int_equal(bg_stage_release(st[k], mb), BG_OK);
                assert_true(bg_backend_memstats(be).current < held);
                if (k > 0)
                    memcpy(din = dbuf, d, (size_t)n * T * c->d_model * sizeof(float));
                bg_stage_end(st[k], mb);
            }
        }
    }
    for (int k = 0; k < nst; k++)
        bg_stage_destroy(st[k]);
    bg_data_close(data);
}

static void compare_grads(bg_model_t *ref, bg_model_t **parts, int nparts)
{
    int seen = 0;
    for (int k = 0; k < nparts; k++)
        for (int i = 0; i < bg_model_num_tensors(parts[k]); i++) {
            bg_param_t *p = bg_model_tensor(parts[k], i);
            bg_param_t *q = bg_model_find_tensor(ref, bg_model_tensor_name(parts[k], i));
            assert_non_null(q);
            if (memcmp(p->grad, q->grad, p->numel * sizeof(float)) != 0)
                fail_msg("gradient of %s differs from the whole model's", bg_model_tensor_name(parts[k], i));
            double ss = 0;
            for (size_t j = 0; j < p->numel; j++)
                ss += fabs(p->grad[j]);
            if (strstr(bg_model_tensor_name(parts[k], i), "wpe") == NULL)
                assert_true(ss > 0); /* gradients really flowed */
            seen++;
        }
    assert_int_equal(seen, bg_model_num_tensors(ref));
}

static void check_splits(bg_model_config_t c)
{
    bg_model_t *whole[1], *parts[4];
    int L = c.kind == BG_MODEL_GPT ? c.layers + 3 : 2 * c.layers + 1;
    int f1[1] = {0}, l1[1] = {L - 1};
    run_split(&c, 1, f1, l1, 0, whole);
    /* three uneven stages, fused and split backward */
    int f3[3] = {0, 1, 4}, l3[3] = {0, 3, L - 1};
    for (int split = 0; split < 2; split++) {
        run_split(&c, 3, f3, l3, split, parts);
        compare_grads(whole[0], parts, 3);
        for (int k = 0; k < 3; k++)
            bg_test_model_destroy(parts[k]);
    }
    /* the whole model with B and W split */
    run_split(&c, 1, f1, l1, 1, parts);
    compare_grads(whole[0], parts, 1);
    bg_test_model_destroy(parts[0]);
    bg_test_model_destroy(whole[0]);
}

static void test_split_equivalence_gpt(void **s)
{
    (void)s;
    check_splits(small_gpt());
}
static void test_split_equivalence_mlp(void **s)
{
    (void)s;
    check_splits(small_mlp());
}

static void test_stage_misuse(void **s)
{
    (void)s;
    bg_model_config_t c = small_mlp();
    bg_model_t *m;
    bg_stage_t *st;
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m), BG_OK);
    assert_int_equal(bg_stage_create(m, 2, &st), BG_OK);
    float *out, *din;
    bg_shape_t os;
    assert_int_equal(bg_stage_forward(st, 0, &out, &os), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "microbatch 0"));
    assert_int_equal(bg_stage_backward(st, 5, &din), BG_ERR_INVALID);
    size_t before = bg_backend_memstats(be).current;
    float *in;
    assert_int_equal(bg_stage_begin(st, 1, (bg_shape_t){2, 1, 10}, &in), BG_OK);
    assert_int_equal(bg_stage_begin(st, 1, (bg_shape_t){2, 1, 10}, &in), BG_ERR_INVALID);
    assert_int_equal(bg_stage_release(st, 1), BG_ERR_INVALID); /* before its fused backward */
    assert_non_null(strstr(bg_last_error(), "release of microbatch 1"));
    bg_stage_end(st, 1);
    assert_int_equal(bg_backend_memstats(be).current, before); /* nothing leaked */
    assert_int_equal(bg_stage_begin(st, 0, (bg_shape_t){2, 1, 11}, &in), BG_ERR_INVALID);
    /* out of memory (a 640 TiB input: more than a 47-bit address space, whatever the overcommit policy):
     * the message says whose buffer, which, the bytes asked and free; nothing is left allocated and the
     * slot can begin again */
    assert_int_equal(bg_stage_begin(st, 1, (bg_shape_t){1 << 30, 1 << 14, 10}, &in), BG_ERR_NOMEM);
    const char *e = bg_last_error();
    assert_non_null(strstr(e, "stage of layers 0.."));
    assert_non_null(strstr(e, "microbatch 1: cpu backend out of memory: 703687441776640 bytes asked for stage input"));
    assert_non_null(strstr(e, "bytes free"));
    assert_int_equal(bg_backend_memstats(be).current, before);
    assert_int_equal(bg_stage_begin(st, 1, (bg_shape_t){2, 1, 10}, &in), BG_OK);
    bg_stage_end(st, 1);
    bg_stage_destroy(st);
    bg_test_model_destroy(m);
}

/* A tie between tensors of one size but different shapes (a 16 -> 32 and a
 * 32 -> 16 linear) is refused with both shapes in the message. */
static void test_tie_shape_message(void **s)
{
    (void)s;
    bg_model_desc_params_t dp = BG_MODEL_DESC_PARAMS_INIT;
    dp.features = 16;
    bg_model_desc_t *d;
    bg_layer_t *fc, *fc2, *head;
    assert_int_equal(bg_model_desc_create(&dp, &d), BG_OK);
    assert_int_equal(bg_layer_linear("fc", 16, 32, 1, 0.02f, &fc), BG_OK);
    assert_int_equal(bg_layer_linear("fc2", 32, 16, 1, 0.02f, &fc2), BG_OK);
    assert_int_equal(bg_layer_head("head", 16, 4, 1, 0.02f, &head), BG_OK);
    assert_int_equal(bg_model_desc_add(d, fc), BG_OK);
    assert_int_equal(bg_model_desc_add(d, fc2), BG_OK);
    assert_int_equal(bg_model_desc_add(d, head), BG_OK);
    assert_int_equal(bg_model_desc_check(d), BG_OK);
    assert_int_equal(bg_model_desc_tie(d, "fc.weight", "fc2.weight"), BG_OK);
    assert_int_equal(bg_model_desc_check(d), BG_ERR_INVALID);
    const char *e = bg_last_error();
    assert_non_null(strstr(e, "fc.weight -> fc2.weight"));
    assert_non_null(strstr(e, "[32, 16] vs [16, 32]"));
    bg_model_desc_destroy(d);
}

/* Recomputation: the same gradients bitwise, less memory kept between F and
 * B, and every byte returned when the slots end. */
static void test_recompute(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    float *g[2];
    size_t kept[2];
    for (int rc = 0; rc < 2; rc++) {
        bg_model_t *m;
        bg_stage_t *st;
        size_t base = bg_backend_memstats(be).current;
        assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m), BG_OK);
        assert_int_equal(bg_stage_create(m, 2, &st), BG_OK);
        bg_stage_set_recompute(st, rc);
        int32_t tok[2 * 8], tgt[2 * 8];
        for (int i = 0; i < 16; i++) {
            tok[i] = (i * 37) % 256;
            tgt[i] = (i * 11 + 5) % 256;
        }
        float *in, *out, *din;
        bg_shape_t os;
        size_t before = bg_backend_memstats(be).current;
        assert_int_equal(bg_stage_begin(st, 0, (bg_shape_t){2, 8, 0}, &in), BG_OK);
        assert_int_equal(bg_stage_set_data(st, 0, tok, tgt, 1.0f / 16), BG_OK);
        assert_int_equal(bg_stage_forward(st, 0, &out, &os), BG_OK);
        kept[rc] = bg_backend_memstats(be).current - before;
        assert_int_equal(bg_stage_backward(st, 0, &din), BG_OK);
        bg_stage_end(st, 0);
        g[rc] = malloc(bg_model_param_count(m) * sizeof(float));
        memcpy(g[rc], bg_model_grads(m), bg_model_param_count(m) * sizeof(float));
        bg_stage_mem_t mem;
        assert_int_equal(bg_stage_memory(st, (bg_shape_t){2, 8, 0}, &mem), BG_OK);
        assert_int_equal(rc ? mem.recompute > 0 : mem.recompute == 0, 1);
        bg_stage_destroy(st);
        bg_test_model_destroy(m);
        assert_int_equal(bg_backend_memstats(be).current, base); /* nothing leaked */
    }
    bg_model_config_t c2 = small_gpt();
    bg_model_t *m;
    assert_int_equal(bg_test_model_create(&c2, be, -1, -1, &m), BG_OK);
    assert_memory_equal(g[0], g[1], bg_model_param_count(m) * sizeof(float));
    bg_test_model_destroy(m);
    assert_true(kept[1] < kept[0] / 4); /* input + output instead of every activation */
    free(g[0]);
    free(g[1]);
}

/* A microbatch of small_gpt's: 2 sequences of 8 tokens and their targets. */
static void small_batch(int32_t tok[16], int32_t tgt[16])
{
    for (int i = 0; i < 16; i++)
        tok[i] = (i * 37) % 256, tgt[i] = (i * 11 + 5) % 256;
}

/* Activation offload (bg_stage_stash_out/_in): between F and B the slot's stash leaves the backend (its
 * current bytes fall by exactly the stash, which is the memory model's per-microbatch stash of a token-input
 * stage), and the fused and the split backward after it give the gradients of a run that kept it, bitwise.
 * Misuse is refused; under recomputation there is nothing to move. */
static void test_stash_offload(void **s)
{
    (void)s;
    int32_t tok[16], tgt[16];
    small_batch(tok, tgt);
    for (int split = 0; split < 2; split++) {
        float *g[2] = {NULL, NULL};
        size_t np = 0;
        for (int off = 0; off < 2; off++) {
            bg_model_config_t c = small_gpt();
            bg_model_t *m;
            bg_stage_t *st;
            size_t base = bg_backend_memstats(be).current;
            assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m), BG_OK);
            assert_int_equal(bg_stage_create(m, 2, &st), BG_OK);
            float *in, *out, *din;
            bg_shape_t os;
            assert_int_equal(bg_stage_begin(st, 0, (bg_shape_t){2, 8, 0}, &in), BG_OK);
            assert_int_equal(bg_stage_stash_bytes(st, 0), 0); /* not forwarded */
            assert_int_equal(bg_stage_stash_out(st, 0, tok), BG_ERR_INVALID);
            assert_int_equal(bg_stage_set_data(st, 0, tok, tgt, 1.0f / 16), BG_OK);
            assert_int_equal(bg_stage_forward(st, 0, &out, &os), BG_OK);
            size_t bytes = bg_stage_stash_bytes(st, 0);
            bg_stage_mem_t mem;
            assert_int_equal(bg_stage_memory(st, (bg_shape_t){2, 8, 0}, &mem), BG_OK);
            assert_int_equal(bytes, mem.stash); /* token input: the stash is the outputs and the layers' stashes */
            void *host = NULL;
            if (off) {
                host = malloc(bytes);
                assert_non_null(host);
                assert_int_equal(bg_stage_stash_in(st, 0, host), BG_ERR_INVALID); /* not out */
                size_t cur = bg_backend_memstats(be).current;
                assert_int_equal(bg_stage_stash_out(st, 0, host), BG_OK);
                assert_int_equal(cur - bg_backend_memstats(be).current, bytes);
                assert_int_equal(bg_stage_stash_bytes(st, 0), bytes);
                assert_int_equal(bg_stage_stash_out(st, 0, host), BG_ERR_INVALID); /* already out */
                assert_int_equal(bg_stage_backward(st, 0, &din), BG_ERR_INVALID);
                assert_int_equal(bg_stage_backward_input(st, 0, &din), BG_ERR_INVALID);
                /* the freed device bytes overwritten: the backward can only read what comes back */
                void *junk = bg_backend_alloc(be, bytes, "junk"), *ones = malloc(bytes);
                assert_non_null(junk);
                assert_non_null(ones);
                memset(ones, 0xff, bytes);
                be->ops->from_host(be, junk, ones, bytes);
                bg_backend_free(be, junk);
                free(ones);
                assert_int_equal(bg_stage_stash_in(st, 0, host), BG_OK);
                assert_int_equal(bg_backend_memstats(be).current, cur);
            }
            if (split) {
                assert_int_equal(bg_stage_backward_input(st, 0, &din), BG_OK);
                assert_int_equal(bg_stage_backward_weight(st, 0), BG_OK);
            } else {
                assert_int_equal(bg_stage_backward(st, 0, &din), BG_OK);
                bg_stage_end(st, 0);
            }
            free(host);
            np = bg_model_param_count(m);
            g[off] = malloc(np * sizeof(float));
            assert_non_null(g[off]);
            memcpy(g[off], bg_model_grads(m), np * sizeof(float));
            bg_stage_destroy(st);
            bg_test_model_destroy(m);
            assert_int_equal(bg_backend_memstats(be).current, base); /* nothing leaked */
        }
        assert_memory_equal(g[0], g[1], np * sizeof(float));
        free(g[0]);
        free(g[1]);
    }
    /* recomputation keeps no stash between F and B: nothing to move, and the backward recomputes it */
    bg_model_config_t c = small_gpt();
    bg_model_t *m;
    bg_stage_t *st;
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m), BG_OK);
    assert_int_equal(bg_stage_create(m, 1, &st), BG_OK);
    bg_stage_set_recompute(st, 1);
    float *in, *out, *din;
    bg_shape_t os;
    assert_int_equal(bg_stage_begin(st, 0, (bg_shape_t){2, 8, 0}, &in), BG_OK);
    assert_int_equal(bg_stage_set_data(st, 0, tok, tgt, 1.0f / 16), BG_OK);
    assert_int_equal(bg_stage_forward(st, 0, &out, &os), BG_OK);
    assert_int_equal(bg_stage_stash_bytes(st, 0), 0);
    assert_int_equal(bg_stage_stash_out(st, 0, NULL), BG_OK);
    assert_int_equal(bg_stage_backward(st, 0, &din), BG_OK);
    bg_stage_end(st, 0);
    bg_stage_destroy(st);
    bg_test_model_destroy(m);
}

/* The layer-begin callback (bg_stage_set_layer_begin) fires before every layer compute of every pass, in the
 * pass's order, and nothing reads a layer's weights before it: with the flat parameter buffer freed
 * (bg_model_params_hold) and only the calling layer's tensors aimed at a copy of them (every other layer's
 * data NULL), the fused, split and recomputing backwards give the gradients of the model as built, bitwise.
 * An error from the callback fails the call. */
typedef struct {
    bg_model_t *m;
    const float *copy;
    size_t *off;
    int log[64][2], n; /* (layer, pass) */
    int fail_at;
} begin_log_t;
static bg_status_t on_begin(int layer, int mb, bg_stage_pass_t pass, void *arg)
{
    begin_log_t *b = arg;
    (void)mb;
    if (b->n < 64)
        b->log[b->n][0] = layer, b->log[b->n][1] = pass, b->n++;
    if (layer == b->fail_at)
        return bg_error(BG_ERR_INVALID, "layer %d refused", layer);
    for (int i = 0; i < bg_model_num_tensors(b->m); i++) {
        int l = bg_model_desc_tensor_layer(bg_model_desc(b->m), bg_model_tensor_name(b->m, i));
        bg_model_tensor(b->m, i)->data = l == layer ? (float *)b->copy + b->off[i] : NULL;
    }
    return BG_OK;
}
static void test_layer_begin(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    int32_t tok[16], tgt[16];
    small_batch(tok, tgt);
    /* mode 0: fused backward, 1: split B and W, 2: recomputation; run 0: reference, run 1: weights by the callback */
    for (int mode = 0; mode < 3; mode++) {
        float *g[2] = {NULL, NULL};
        size_t np = 0;
        for (int run = 0; run < 2; run++) {
            bg_model_t *m;
            bg_stage_t *st;
            assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m), BG_OK);
            np = bg_model_param_count(m);
            int nt = bg_model_num_tensors(m), L = bg_model_last_layer(m) + 1;
            begin_log_t b = {.m = m, .fail_at = -1};
            float *copy = malloc(np * sizeof(float));
            b.off = malloc((size_t)nt * sizeof(size_t));
            memcpy(copy, bg_model_params(m), np * sizeof(float));
            for (int i = 0; i < nt; i++)
                b.off[i] = (size_t)(bg_model_tensor(m, i)->data - bg_model_params(m));
            b.copy = copy;
            assert_int_equal(bg_stage_create(m, 2, &st), BG_OK);
            bg_stage_set_recompute(st, mode == 2);
            if (run) {
                assert_int_equal(bg_model_params_hold(m, 0), BG_OK);
                assert_null(bg_model_params(m));
                assert_null(bg_model_tensor(m, 0)->data);
                bg_stage_set_layer_begin(st, on_begin, &b);
            }
            float *in, *out, *din;
            bg_shape_t os;
            assert_int_equal(bg_stage_begin(st, 0, (bg_shape_t){2, 8, 0}, &in), BG_OK);
            assert_int_equal(bg_stage_set_data(st, 0, tok, tgt, 1.0f / 16), BG_OK);
            assert_int_equal(bg_stage_forward(st, 0, &out, &os), BG_OK);
            if (mode == 1) {
                assert_int_equal(bg_stage_backward_input(st, 0, &din), BG_OK);
                assert_int_equal(bg_stage_backward_weight(st, 0), BG_OK);
            } else {
                assert_int_equal(bg_stage_backward(st, 0, &din), BG_OK);
                bg_stage_end(st, 0);
            }
            g[run] = malloc(np * sizeof(float));
            memcpy(g[run], bg_model_grads(m), np * sizeof(float));
            if (run) { /* the order: F up; (recomputation up); then B down (and W down) */
                int passes[3][3] = {{BG_PASS_FORWARD, BG_PASS_BACKWARD, -1},
                                    {BG_PASS_FORWARD, BG_PASS_BACKWARD_INPUT, BG_PASS_BACKWARD_WEIGHT},
                                    {BG_PASS_FORWARD, BG_PASS_RECOMPUTE, BG_PASS_BACKWARD}};
                int k = 0;
                for (int p = 0; p < 3 && passes[mode][p] >= 0; p++)
                    for (int j = 0; j < L; j++, k++) {
                        int up = passes[mode][p] == BG_PASS_FORWARD || passes[mode][p] == BG_PASS_RECOMPUTE;
                        assert_int_equal(b.log[k][0], up ? j : L - 1 - j);
                        assert_int_equal(b.log[k][1], passes[mode][p]);
                    }
                assert_int_equal(b.n, k);
                /* an error from the callback fails the call, naming what it said */
                b.fail_at = 1;
                assert_int_equal(bg_stage_begin(st, 1, (bg_shape_t){2, 8, 0}, &in), BG_OK);
                assert_int_equal(bg_stage_set_data(st, 1, tok, tgt, 1.0f / 16), BG_OK);
                assert_int_equal(bg_stage_forward(st, 1, &out, &os), BG_ERR_INVALID);
                assert_non_null(strstr(bg_last_error(), "layer 1 refused"));
                bg_stage_end(st, 1);
                assert_int_equal(bg_model_params_hold(m, 1), BG_OK); /* held again: the tensors aimed at it */
                assert_ptr_equal(bg_model_tensor(m, 0)->data, bg_model_params(m));
            }
            bg_stage_destroy(st);
            bg_test_model_destroy(m);
            free(copy);
            free(b.off);
        }
        assert_memory_equal(g[0], g[1], np * sizeof(float));
        free(g[0]);
        free(g[1]);
    }
}

/* The MLP's fc -> gelu runs fused (bias in the GELU's pass both ways,
 * models/layer.c) when the backend has the fused kernels: the same gradients
 * bitwise as the backend without them (NULL slots: the two layers apart),
 * over two microbatches (accumulation), with B and W together and split; and
 * the fused kernels really ran, once per block and microbatch each way (the
 * backward only with B and W together: a B must add no weight gradient). */
static int fused_fwd_calls, fused_bwd_calls;
static const bg_backend_ops_t *plain_ops;
static void count_fwd(bg_backend_t *b, float *pre, float *out, const float *bias, int N, int C)
{
    fused_fwd_calls++;
    plain_ops->bias_gelu_forward(b, pre, out, bias, N, C);
}
static void count_bwd(bg_backend_t *b, float *din, float *dbias, const float *pre, const float *dout, int N, int C)
{
    fused_bwd_calls++;
    plain_ops->gelu_bias_backward(b, din, dbias, pre, dout, N, C);
}

static void test_fused_bias_gelu(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    plain_ops = be->ops;
    bg_backend_ops_t counting = *be->ops, unfused = *be->ops;
    counting.bias_gelu_forward = count_fwd;
    counting.gelu_bias_backward = count_bwd;
    unfused.bias_gelu_forward = NULL;
    unfused.gelu_bias_backward = NULL;
    float *g[4] = {0};
    size_t np = 0;
    for (int v = 0; v < 4; v++) { /* unfused, fused; B and W together, split */
        int fused = v & 1, split = v >> 1;
        be->ops = fused ? &counting : &unfused;
        fused_fwd_calls = fused_bwd_calls = 0;
        bg_model_t *m;
        bg_stage_t *st;
        assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m), BG_OK);
        assert_int_equal(bg_stage_create(m, 2, &st), BG_OK);
        for (int mb = 0; mb < 2; mb++) {
            int32_t tok[16], tgt[16];
            for (int i = 0; i < 16; i++) {
                tok[i] = (i * 37 + 11 * mb) % 256;
                tgt[i] = (i * 11 + 5 + mb) % 256;
            }
            float *in, *out, *din;
            bg_shape_t os;
            assert_int_equal(bg_stage_begin(st, mb, (bg_shape_t){2, 8, 0}, &in), BG_OK);
            assert_int_equal(bg_stage_set_data(st, mb, tok, tgt, 1.0f / 32), BG_OK);
            assert_int_equal(bg_stage_forward(st, mb, &out, &os), BG_OK);
            if (split) {
                assert_int_equal(bg_stage_backward_input(st, mb, &din), BG_OK);
                assert_int_equal(bg_stage_backward_weight(st, mb), BG_OK);
            } else {
                assert_int_equal(bg_stage_backward(st, mb, &din), BG_OK);
            }
            bg_stage_end(st, mb);
        }
        np = bg_model_param_count(m);
        g[v] = malloc(np * sizeof(float));
        memcpy(g[v], bg_model_grads(m), np * sizeof(float));
        assert_int_equal(fused_fwd_calls, fused ? 2 * c.layers : 0);
        assert_int_equal(fused_bwd_calls, fused && !split ? 2 * c.layers : 0);
        bg_stage_destroy(st);
        bg_test_model_destroy(m);
    }
    be->ops = plain_ops;
    for (int v = 1; v < 4; v++)
        if (memcmp(g[0], g[v], np * sizeof(float)) != 0)
            fail_msg("gradients of variant %d (fused %d, B/W split %d) differ from the unfused ones", v, v & 1, v >> 1);
    for (int v = 0; v < 4; v++)
        free(g[v]);
}

static void test_data(void **s)
{
    (void)s;
    char path[4096];
    snprintf(path, sizeof(path), "%s/data/kjv.txt", getenv("BRIGADE_SOURCE_DIR"));
    bg_data_t *d;
    assert_int_equal(bg_data_open_text(path, 16, 5, &d), BG_OK);
    int32_t a[8 * 16], b[8 * 16], ta[8 * 16], tb[8 * 16];
    assert_int_equal(bg_data_batch(d, 3, 0, 8, 16, a, NULL, ta), BG_OK);
    /* the same sequences fetched as two shards */
    assert_int_equal(bg_data_batch(d, 3, 0, 3, 16, b, NULL, tb), BG_OK);
    assert_int_equal(bg_data_batch(d, 3, 3, 5, 16, b + 3 * 16, NULL, tb + 3 * 16), BG_OK);
    assert_memory_equal(a, b, sizeof(a));
    assert_memory_equal(ta, tb, sizeof(ta));
    for (int i = 0; i < 8 * 16; i++) {
        assert_true(a[i] >= 0 && a[i] < 256);
        if (i % 16 != 15)
            assert_int_equal(ta[i], a[i + 1]); /* targets are the next byte */
    }
    assert_int_equal(bg_data_batch(d, 4, 0, 8, 16, b, NULL, tb), BG_OK);
    assert_memory_not_equal(a, b, sizeof(a));
    bg_data_close(d);
    assert_int_equal(bg_data_open_text("/nonexistent/file.txt", 16, 1, &d), BG_ERR_IO);
    assert_non_null(strstr(bg_last_error(), "/nonexistent/file.txt"));
    char tmp[] = "/tmp/bg_empty_XXXXXX";
    int fd = mkstemp(tmp);
    close(fd);
    assert_int_equal(bg_data_open_text(tmp, 16, 1, &d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "empty"));
    unlink(tmp);
}

static void test_safetensors(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    bg_model_t *m, *m2;
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m), BG_OK);
    c.seed = 99;
    assert_int_equal(bg_test_model_create(&c, be, -1, -1, &m2), BG_OK);
    char dir[] = "/tmp/bg__st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/m.safetensors", dir);
    assert_int_equal(bg_model_save_safetensors(m, path, "{\"step\": 3}"), BG_OK);
    assert_memory_not_equal(bg_model_params(m), bg_model_params(m2), 64);
    assert_int_equal(bg_model_load_safetensors(m2, path), BG_OK);
    assert_memory_equal(bg_model_params(m), bg_model_params(m2), bg_model_param_count(m) * sizeof(float));
    /* the header is what other tools read: check the layout by hand */
    FILE *f = fopen(path, "rb");
    uint64_t hlen;
    assert_int_equal(fread(&hlen, 8, 1, f), 1);
    assert_int_equal(hlen % 8, 0);
    char *h = calloc(1, hlen + 1);
    assert_int_equal(fread(h, 1, hlen, f), hlen);
    assert_non_null(strstr(h, "\"blocks.0.attn.qkv.weight\""));
    assert_non_null(strstr(h, "\"F32\""));
    fseek(f, 0, SEEK_END);
    assert_int_equal((size_t)ftell(f), 8 + hlen + bg_model_param_count(m) * sizeof(float));
    fclose(f);
    free(h);
    /* truncated file: refused, naming the file and tensor */
    assert_int_equal(truncate(path, 8 + hlen + 100), 0);
    assert_int_equal(bg_model_load_safetensors(m2, path), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "m.safetensors"));
    /* a file of another model: shape mismatch */
    bg_model_config_t c2 = small_gpt();
    c2.d_model = 8;
    bg_model_t *m3;
    assert_int_equal(bg_test_model_create(&c2, be, -1, -1, &m3), BG_OK);
    assert_int_equal(bg_model_save_safetensors(m3, path, NULL), BG_OK);
    assert_int_equal(bg_model_load_safetensors(m2, path), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "embed."));
    /* an unwritable place: error, no file */
    assert_int_equal(bg_model_save_safetensors(m, "/nonexistent-dir/x.safetensors", NULL), BG_ERR_IO);
    unlink(path);
    rmdir(dir);
    bg_test_model_destroy(m);
    bg_test_model_destroy(m2);
    bg_test_model_destroy(m3);
}

static void test_train_mlp_learns(void **s)
{
    (void)s;
    bg_train_config_t c;
    bg_train_config_init(&c);
    c.model = small_mlp();
    c.batch = 32;
    c.microbatches = 4;
    c.steps = 60;
    c.optim.lr = 3e-3f;
    c.threads = 1;
    bg_train_result_t r;
    assert_int_equal(bg_train(&c, &r), BG_OK);
    bg_train_result_free(&r); /* the per-rank table; the figures stay */
    /* chance level is ln(5) = 1.609 */
    assert_true(r.first_loss > 1.0);
    assert_true(r.final_loss < 0.6 * r.first_loss);
    /* peak within 10% of params + grads + optimizer + activations */
    assert_true(fabs((double)r.peak_bytes - (double)r.predicted_bytes) <= 0.10 * (double)r.predicted_bytes);
}

static void test_train_gpt_learns(void **s)
{
    (void)s;
    bg_train_config_t c;
    bg_train_config_init(&c);
    c.model = small_gpt();
    c.model.d_model = 32;
    c.model.seq_len = 32;
    c.batch = 8;
    c.microbatches = 2;
    c.steps = 40;
    c.optim.lr = 3e-3f;
    c.threads = 1;
    char path[4096];
    snprintf(path, sizeof(path), "%s/data/kjv.txt", getenv("BRIGADE_SOURCE_DIR"));
    c.data_path = path;
    bg_train_result_t r;
    assert_int_equal(bg_train(&c, &r), BG_OK);
    bg_train_result_free(&r); /* the per-rank table; the figures stay */
    assert_true(fabs(r.first_loss - log(256.0)) < 0.3); /* starts near uniform */
    assert_true(r.final_loss < 3.5);
    assert_true(fabs((double)r.peak_bytes - (double)r.predicted_bytes) <= 0.10 * (double)r.predicted_bytes);
}

static void test_train_microbatching_invariance(void **s)
{
    (void)s;
    /* the same global batch split into 1 or 4 microbatches trains to nearly the same weights */
    bg_train_config_t c;
    bg_train_config_init(&c);
    c.model = small_mlp();
    c.batch = 8;
    c.steps = 3;
    c.threads = 1;
    char d1[] = "/tmp/bg_mb1_XXXXXX", d4[] = "/tmp/bg_mb4_XXXXXX";
    assert_non_null(mkdtemp(d1));
    assert_non_null(mkdtemp(d4));
    bg_train_result_t r;
    c.microbatches = 1;
    c.save_dir = d1;
    assert_int_equal(bg_train(&c, &r), BG_OK);
    bg_train_result_free(&r); /* the per-rank table; the figures stay */
    c.microbatches = 4;
    c.save_dir = d4;
    assert_int_equal(bg_train(&c, &r), BG_OK);
    bg_train_result_free(&r); /* the per-rank table; the figures stay */
    bg_model_t *a, *b;
    assert_int_equal(bg_test_model_create(&c.model, be, -1, -1, &a), BG_OK);
    assert_int_equal(bg_test_model_create(&c.model, be, -1, -1, &b), BG_OK);
    char p[256];
    snprintf(p, sizeof(p), "%s/model.safetensors", d1);
    assert_int_equal(bg_model_load_safetensors(a, p), BG_OK);
    unlink(p);
    snprintf(p, sizeof(p), "%s/model.safetensors", d4);
    assert_int_equal(bg_model_load_safetensors(b, p), BG_OK);
    unlink(p);
    rmdir(d1);
    rmdir(d4);
    float *x = bg_model_params(a), *y = bg_model_params(b);
    double maxd = 0, maxv = 0;
    for (size_t i = 0; i < bg_model_param_count(a); i++) {
        maxd = fmax(maxd, fabs(x[i] - y[i]));
        maxv = fmax(maxv, fabs(x[i]));
    }
    assert_true(maxd <= 1e-4 * maxv);
    bg_test_model_destroy(a);
    bg_test_model_destroy(b);
}

/* ---------------------------------------------------------------- descriptions */

static bg_model_desc_t *feature_desc(int features)
{
    bg_model_desc_params_t dp = BG_MODEL_DESC_PARAMS_INIT;
    dp.name = "tiny";
    dp.features = features;
    bg_model_desc_t *d;
    assert_int_equal(bg_model_desc_create(&dp, &d), BG_OK);
    return d;
}

/* add(d, bg_layer_x(..., &l), &l): the layer is read after the call made it */
static void add(bg_model_desc_t *d, bg_status_t st, bg_layer_t **l)
{
    assert_int_equal(st, BG_OK);
    assert_int_equal(bg_model_desc_add(d, *l), BG_OK);
}

static void test_desc_errors(void **s)
{
    (void)s;
    bg_layer_t *l;
    /* no layers; last layer not a loss */
    bg_model_desc_t *d = feature_desc(6);
    assert_int_equal(bg_model_desc_check(d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "model tiny has no layers"));
    add(d, bg_layer_linear("fc", 6, 4, 1, 0.1f, &l), &l);
    assert_int_equal(bg_model_desc_check(d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "its last layer fc (type linear) is not a loss layer"));
    bg_model_t *m = NULL;
    assert_int_equal(bg_model_create(d, be, -1, -1, &m), BG_ERR_INVALID);
    assert_null(m);
    /* a loss in the middle */
    add(d, bg_layer_head("head", 4, 3, 1, 0.1f, &l), &l);
    assert_int_equal(bg_model_desc_check(d), BG_OK);
    assert_int_equal(bg_model_desc_classes(d), 3);
    add(d, bg_layer_head("head2", 1, 3, 1, 0.1f, &l), &l);
    assert_int_equal(bg_model_desc_check(d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "layer head (1 of 3) is a loss layer; only the last layer may be"));
    bg_model_desc_destroy(d);
    /* shapes that do not chain */
    d = feature_desc(6);
    add(d, bg_layer_linear("fc", 5, 4, 1, 0.1f, &l), &l);
    add(d, bg_layer_head("head", 4, 3, 1, 0.1f, &l), &l);
    assert_int_equal(bg_model_desc_check(d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "layer fc does not take the shape"));
    bg_model_desc_destroy(d);
    /* duplicate names; a tie of different shapes; a tie to a missing tensor; two ties on one tensor */
    d = feature_desc(4);
    add(d, bg_layer_linear("fc", 4, 4, 1, 0.1f, &l), &l);
    assert_int_equal(bg_layer_linear("fc", 4, 4, 1, 0.1f, &l), BG_OK);
    assert_int_equal(bg_model_desc_add(d, l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "two top-level layers are named \"fc\""));
    /* the name index across its growths (64, 128, ... slots): every earlier name is found again */
    char nm[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(nm, sizeof nm, "act.%d", i);
        add(d, bg_layer_activation(nm, BG_ACT_RELU, &l), &l);
    }
    for (int i = 0; i < 5000; i += 999) {
        snprintf(nm, sizeof nm, "act.%d", i);
        assert_int_equal(bg_layer_activation(nm, BG_ACT_RELU, &l), BG_OK);
        assert_int_equal(bg_model_desc_add(d, l), BG_ERR_INVALID);
        char want[96];
        snprintf(want, sizeof want, "two top-level layers are named \"%s\" (%d and 5001)", nm, i + 1);
        assert_non_null(strstr(bg_last_error(), want));
    }
    assert_int_equal(bg_layer_linear("fc", 4, 4, 1, 0.1f, &l), BG_OK);
    assert_int_equal(bg_model_desc_add(d, l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "two top-level layers are named \"fc\" (0 and 5001)"));
    assert_int_equal(bg_model_desc_num_layers(d), 5001);
    add(d, bg_layer_linear("fc2", 4, 4, 0, 0.1f, &l), &l);
    add(d, bg_layer_head("head", 4, 3, 1, 0.1f, &l), &l);
    assert_int_equal(bg_model_desc_check(d), BG_OK);
    assert_int_equal(bg_model_desc_tie(d, "fc.weight", "head.weight"), BG_OK);
    assert_int_equal(bg_model_desc_check(d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "tie fc.weight -> head.weight: shapes differ"));
    bg_model_desc_destroy(d);
    d = feature_desc(4);
    add(d, bg_layer_linear("fc", 4, 4, 1, 0.1f, &l), &l);
    add(d, bg_layer_linear("fc2", 4, 4, 1, 0.1f, &l), &l);
    add(d, bg_layer_head("head", 4, 3, 1, 0.1f, &l), &l);
    assert_int_equal(bg_model_desc_tie(d, "fc.weight", "fc2.wieght"), BG_OK);
    assert_int_equal(bg_model_desc_check(d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "the model has no tensor fc2.wieght"));
    bg_model_desc_destroy(d);
    d = feature_desc(4);
    add(d, bg_layer_linear("fc", 4, 4, 1, 0.1f, &l), &l);
    add(d, bg_layer_linear("fc2", 4, 4, 1, 0.1f, &l), &l);
    add(d, bg_layer_linear("fc3", 4, 4, 1, 0.1f, &l), &l);
    add(d, bg_layer_head("head", 4, 3, 1, 0.1f, &l), &l);
    assert_int_equal(bg_model_desc_tie(d, "fc.weight", "fc2.weight"), BG_OK);
    assert_int_equal(bg_model_desc_tie(d, "fc2.weight", "fc3.weight"), BG_OK);
    assert_int_equal(bg_model_desc_check(d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "tensor fc2.weight is in two ties"));
    bg_model_desc_destroy(d);
    /* one model per layer at a time */
    bg_model_config_t c = small_mlp();
    assert_int_equal(bg_model_build(&c, &d), BG_OK);
    bg_model_t *a, *b;
    assert_int_equal(bg_model_create(d, be, 0, 2, &a), BG_OK);
    assert_int_equal(bg_model_create(d, be, 2, 3, &b), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "layer fc.1 is already bound to another model"));
    assert_int_equal(bg_model_create(d, be, 3, -1 + bg_model_desc_num_layers(d), &b), BG_OK);
    bg_model_destroy(a);
    bg_model_destroy(b);
    assert_int_equal(bg_model_create(d, be, -1, -1, &a), BG_OK); /* free again after destroy */
    bg_model_destroy(a);
    bg_model_desc_destroy(d);
}

static void test_desc_json(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    c.tie_embeddings = 1;
    bg_model_desc_t *d, *e;
    char *j, *k;
    assert_int_equal(bg_model_build(&c, &d), BG_OK);
    assert_int_equal(bg_model_desc_to_json(d, &j), BG_OK);
    assert_int_equal(bg_model_desc_from_json(j, &e), BG_OK);
    assert_int_equal(bg_model_desc_to_json(e, &k), BG_OK);
    assert_string_equal(j, k); /* the builder's JSON rebuilds the same description */
    assert_int_equal(bg_model_desc_num_ties(e), 1);
    assert_int_equal(bg_model_desc_tensor_layer(e, "head.weight"), bg_model_desc_num_layers(e) - 1);
    assert_int_equal(bg_model_desc_tensor_layer(e, "blocks.1.mlp.fc.weight"), 2);
    assert_int_equal(bg_model_desc_tensor_layer(e, "nope"), -1);
    assert_int_equal(bg_model_desc_match_json(e, j, "f.json"), BG_OK);
    free(k);
    bg_model_desc_destroy(e);
    /* a builder whose layer count the description's own list cannot hold (a
     * small hostile file asking for 2^30 blocks) is refused before building */
    char *b = strstr(j, "\"builder\""), *lk = b ? strstr(b, "\"layers\":") : NULL;
    assert_non_null(lk);
    size_t head = (size_t)(lk - j) + strlen("\"layers\":");
    while (j[head] == ' ')
        head++;
    size_t tail = head;
    while (j[tail] >= '0' && j[tail] <= '9')
        tail++;
    char *hostile = malloc(strlen(j) + 16);
    assert_non_null(hostile);
    sprintf(hostile, "%.*s1073741824%s", (int)head, j, j + tail);
    assert_int_equal(bg_model_desc_from_json(hostile, &e), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "\"layers\" is 1073741824 but the description lists 6 top-level layers"));
    free(hostile);
    c.layers = 4;
    assert_int_equal(bg_model_build(&c, &e), BG_OK);
    assert_int_equal(bg_model_desc_match_json(e, j, "f.json"), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "f.json is from another model: layers[4] {\"name\":\"ln_f\""));
    bg_model_desc_destroy(e);
    /* a user model's JSON cannot rebuild it, and says so */
    bg_model_desc_t *u = feature_desc(4);
    bg_layer_t *l;
    add(u, bg_layer_head("head", 4, 3, 1, 0.1f, &l), &l);
    free(k = NULL);
    assert_int_equal(bg_model_desc_to_json(u, &k), BG_OK);
    assert_int_equal(bg_model_desc_from_json(k, &e), BG_ERR_UNSUPPORTED);
    assert_non_null(strstr(bg_last_error(), "model tiny was built from the host's own layers"));
    assert_int_equal(bg_model_desc_match_json(u, j, "g.json"), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "g.json is from another model: name \"gpt\" there, \"tiny\" here"));
    assert_int_equal(bg_model_desc_from_json("{\"format\": \"other\"}", &e), BG_ERR_PARSE);
    assert_int_equal(bg_model_desc_from_json("not json", &e), BG_ERR_PARSE);
    /* found by fuzz_model_desc: the messages of a wrong version and an unknown
     * builder read the parsed JSON after it was freed */
    assert_int_equal(bg_model_desc_from_json("{\"format\":\"brigade-model\",\"version\":2}", &e), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "model description version 2; this library reads version 1"));
    assert_int_equal(bg_model_desc_match_json(u, "{\"format\":\"brigade-model\",\"version\":[]}", "m.json"),
                     BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "m.json: model description version not an integer"));
    assert_int_equal(bg_model_desc_from_json("{\"format\":\"brigade-model\",\"version\":1,\"builder\":"
                                             "{\"name\":\"resnet\"}}", &e),
                     BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "unknown builder \"resnet\" (known: gpt, llama, mlp)"));
    free(k);
    free(j);
    bg_model_desc_destroy(u);
    bg_model_desc_destroy(d);
}

/* A Llama's JSON holds its own fields (kv heads, SwiGLU size, RoPE base) and rebuilds the same model; a
 * GPT's JSON has none of them (files written before stay the same). */
static void test_llama_desc_json(void **s)
{
    (void)s;
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    c.kind = BG_MODEL_LLAMA;
    c.layers = 2, c.d_model = 32, c.heads = 4, c.kv_heads = 2, c.rope_theta = 500000.0f, c.tie_embeddings = 1;
    bg_model_desc_t *d, *e;
    char *j, *k;
    assert_int_equal(bg_model_build(&c, &d), BG_OK);
    assert_string_equal(bg_model_desc_params(d)->name, "llama");
    assert_int_equal(bg_model_desc_to_json(d, &j), BG_OK);
    assert_non_null(strstr(j, "\"kv_heads\":2"));
    assert_non_null(strstr(j, "\"ffn_hidden\":128")); /* 8 * 32 / 3 = 85.3, up to 128 */
    assert_non_null(strstr(j, "\"rope_theta\":500000"));
    assert_null(strstr(j, "wpe")); /* rotary positions: no position table */
    assert_int_equal(bg_model_desc_from_json(j, &e), BG_OK);
    assert_int_equal(bg_model_desc_to_json(e, &k), BG_OK);
    assert_string_equal(j, k);
    bg_model_config_t back;
    assert_int_equal(bg_model_desc_builder(e, &back), BG_OK);
    assert_int_equal(back.kv_heads, 2);
    assert_true(back.rope_theta == 500000.0f);
    free(k);
    bg_model_desc_destroy(e);
    /* another RoPE base is another model */
    c.rope_theta = 10000.0f;
    assert_int_equal(bg_model_build(&c, &e), BG_OK);
    assert_int_equal(bg_model_desc_to_json(e, &k), BG_OK);
    assert_string_not_equal(j, k);
    free(k);
    bg_model_desc_destroy(e);
    free(j);
    bg_model_desc_destroy(d);
    c.kind = BG_MODEL_GPT;
    assert_int_equal(bg_model_build(&c, &d), BG_OK);
    assert_int_equal(bg_model_desc_to_json(d, &j), BG_OK);
    assert_null(strstr(j, "kv_heads"));
    free(j);
    bg_model_desc_destroy(d);
    /* what the builder refuses, named */
    c.kind = BG_MODEL_LLAMA;
    c.kv_heads = 3;
    assert_int_equal(bg_model_build(&c, &d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "kv_heads (3) must divide heads (4)"));
    c.kv_heads = 2, c.tp = 4;
    assert_int_equal(bg_model_build(&c, &d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "tp 4: layer blocks.0.attn has 2 key/value heads (--kv-heads), which tp 4 "
                                            "does not divide"));
}

/* The GPT builder is nothing but public calls: the same layers added by hand
 * (as a user would) train to bitwise the same weights on the executor. */
static bg_status_t text_batch(const bg_batch_request_t *rq, int32_t *tokens, float *features, int32_t *targets,
                              void *arg)
{
    (void)features;
    bg_batch_source_t *src = arg;
    return src->batch(rq, tokens, NULL, targets, src->arg);
}

/* One process, 4 sequences in 2 microbatches, one thread, from src. */
static bg_executor_params_t small_params(bg_model_desc_t *d, bg_batch_source_t *src)
{
    bg_executor_params_t p = BG_EXECUTOR_PARAMS_INIT;
    p.model = d;
    p.batch = 4;
    p.microbatches = 2;
    p.threads = 1;
    p.data.batch = text_batch;
    p.data.arg = src;
    return p;
}

static void train_desc(bg_model_desc_t *d, bg_batch_source_t *src, float *out, size_t n)
{
    bg_executor_params_t p = small_params(d, src);
    bg_executor_t *x;
    assert_int_equal(bg_executor_create(&p, &x), BG_OK);
    for (int i = 0; i < 3; i++) {
        bg_step_result_t r;
        assert_int_equal(bg_executor_step(x, &r), BG_OK);
        assert_int_equal(r.step, i + 1);
        assert_true(isfinite(r.loss) && r.loss > 0);
    }
    char dir[] = "/tmp/bg-desc-XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(bg_executor_save_weights(x, dir), BG_OK);
    assert_int_equal(bg_executor_destroy(x), BG_OK);
    /* read the weights back through a fresh model of the same description */
    bg_model_t *m;
    assert_int_equal(bg_model_create(d, be, -1, -1, &m), BG_OK);
    assert_int_equal(bg_safetensors_load_dir(dir, &m, 1), BG_OK);
    assert_int_equal(bg_model_param_count(m), n);
    memcpy(out, bg_model_params(m), n * sizeof(float));
    bg_model_destroy(m);
    char path[600];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

static void test_builder_is_public_calls(void **s)
{
    (void)s;
    bg_model_config_t c = small_gpt();
    c.tie_embeddings = 1;
    bg_model_desc_t *built, *hand;
    assert_int_equal(bg_model_build(&c, &built), BG_OK);
    bg_model_desc_params_t dp = BG_MODEL_DESC_PARAMS_INIT;
    dp.name = "gpt";
    dp.input = BG_INPUT_TOKENS;
    dp.vocab = c.vocab;
    dp.seq_len = c.seq_len;
    dp.seed = c.seed;
    assert_int_equal(bg_model_desc_create(&dp, &hand), BG_OK);
    bg_layer_t *l;
    float std = 0.02f, proj = 0.02f / sqrtf(2.0f * (float)c.layers);
    add(hand, bg_layer_embedding("embed", c.vocab, c.seq_len, c.d_model, std, &l), &l);
    for (int i = 0; i < c.layers; i++) {
        char name[32];
        snprintf(name, sizeof(name), "blocks.%d", i);
        add(hand, bg_layer_transformer_block(name, c.d_model, c.heads, std, proj, &l), &l);
    }
    add(hand, bg_layer_layernorm("ln_f", c.d_model, &l), &l);
    add(hand, bg_layer_head("head", c.d_model, c.vocab, 0, std, &l), &l);
    assert_int_equal(bg_model_desc_tie(hand, "embed.wte", "head.weight"), BG_OK);
    assert_int_equal(bg_model_desc_check(hand), BG_OK);
    char path[4096];
    snprintf(path, sizeof(path), "%s/data/kjv.txt", getenv("BRIGADE_SOURCE_DIR"));
    bg_data_t *data;
    assert_int_equal(bg_data_open_text(path, c.seq_len, 1, &data), BG_OK);
    bg_batch_source_t src = bg_data_source(data);
    size_t n = bg_model_desc_param_count(built);
    assert_int_equal(bg_model_desc_param_count(hand), n);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    train_desc(built, &src, a, n);
    train_desc(hand, &src, b, n);
    assert_memory_equal(a, b, n * sizeof(float));
    free(a);
    free(b);
    bg_data_close(data);
    bg_model_desc_destroy(built);
    bg_model_desc_destroy(hand);
}

/* The small GPT with tied embeddings (*c), built, and the corpus read in order `seed`. */
static bg_model_desc_t *tied_gpt(bg_model_config_t *c, uint64_t seed, bg_data_t **data_p)
{
    *c = small_gpt();
    c->tie_embeddings = 1;
    bg_model_desc_t *d;
    assert_int_equal(bg_model_build(c, &d), BG_OK);
    char path[4096];
    snprintf(path, sizeof(path), "%s/data/kjv.txt", getenv("BRIGADE_SOURCE_DIR"));
    assert_int_equal(bg_data_open_text(path, c->seq_len, seed, data_p), BG_OK);
    return d;
}

/* Evaluation (bg_executor_eval) with the forward-only program: on the
 * training source's batch 0 before any step its loss is bitwise the loss
 * step 1 reports on that batch with the same weights; it changes nothing a
 * step reads (a run that evaluates between its steps reports bitwise the
 * losses and gradient norms of one that does not, and both then evaluate
 * alike); another source's batch is asked for by index; bad arguments. */
static void test_eval_forward_only(void **s)
{
    (void)s;
    bg_model_config_t c;
    bg_data_t *data, *held;
    bg_model_desc_t *d = tied_gpt(&c, 1, &data);
    bg_model_desc_destroy(tied_gpt(&c, 7, &held)); /* another order of the corpus: other batches */
    bg_batch_source_t src = bg_data_source(data), hsrc = bg_data_source(held), hwrap = {0};
    hwrap.batch = text_batch, hwrap.arg = &hsrc;
    bg_executor_params_t p = small_params(d, &src);
    bg_executor_t *a, *b;
    bg_step_result_t ra[3], rb[3];
    bg_eval_result_t e0, e1, ea, eb, eh;
    assert_int_equal(bg_executor_create(&p, &a), BG_OK);
    if (bg_executor_eval(a, NULL, 0, &e0) != BG_OK)
        fail_msg("eval: %s", bg_last_error());
    assert_int_equal(bg_executor_eval(a, NULL, 0, &e1), BG_OK); /* twice: the same */
    assert_true(e0.loss == e1.loss && e0.tokens == 4.0 * c.seq_len);
    assert_int_equal(bg_executor_eval(a, &hwrap, 3, &eh), BG_OK);
    assert_true(isfinite(eh.loss) && eh.loss > 0 && eh.loss != e0.loss);
    assert_int_equal(bg_executor_steps_done(a), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(bg_executor_step(a, &ra[i]), BG_OK);
        assert_int_equal(bg_executor_eval(a, &hwrap, i, &ea), BG_OK);
    }
    if (ra[0].loss != e0.loss)
        fail_msg("eval loss %.9g != step 1 loss %.9g on the same batch and weights", e0.loss, ra[0].loss);
    assert_int_equal(bg_executor_eval(a, &hwrap, 3, &ea), BG_OK);
    assert_true(ea.loss < eh.loss); /* three steps learnt something */
    assert_int_equal(bg_executor_destroy(a), BG_OK); /* a description binds one model at a time */
    assert_int_equal(bg_executor_create(&p, &b), BG_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(bg_executor_step(b, &rb[i]), BG_OK);
    assert_int_equal(bg_executor_eval(b, &hwrap, 3, &eb), BG_OK);
    for (int i = 0; i < 3; i++)
        if (ra[i].loss != rb[i].loss || ra[i].grad_norm != rb[i].grad_norm)
            fail_msg("step %d with evaluations: loss %.9g gnorm %.9g; without: %.9g %.9g", i + 1, ra[i].loss,
                     ra[i].grad_norm, rb[i].loss, rb[i].grad_norm);
    assert_true(ea.loss == eb.loss);
    /* bad arguments change nothing */
    bg_batch_source_t none = {0};
    assert_int_equal(bg_executor_eval(b, &none, 0, &eb), BG_ERR_INVALID);
    assert_int_equal(bg_executor_eval(b, NULL, -1, &eb), BG_ERR_INVALID);
    assert_int_equal(bg_executor_step(b, &rb[0]), BG_OK);
    assert_int_equal(bg_executor_destroy(b), BG_OK);
    bg_data_close(data);
    bg_data_close(held);
    bg_model_desc_destroy(d);
}

/* grad_norm of the step result against the gradients the optimizer applied:
 * with SGD (no momentum, no decay) and a power-of-two learning rate the first
 * step moves each weight by exactly lr * grad, so the gradients come back
 * from the weights before and after (within float rounding of the
 * difference: 1e-6 relative for the norm). The tied copy (head.weight holds
 * the same a + b as embed.wte) is counted once. */
static void test_grad_norm(void **s)
{
    (void)s;
    bg_model_config_t c;
    bg_data_t *data;
    bg_model_desc_t *d = tied_gpt(&c, 1, &data);
    bg_batch_source_t src = bg_data_source(data);
    /* the initial weights (a description's layers bind one model at a time) */
    bg_model_t *m;
    assert_int_equal(bg_model_create(d, be, -1, -1, &m), BG_OK);
    size_t n = bg_model_param_count(m);
    float *w0 = malloc(n * sizeof(float));
    assert_non_null(w0);
    memcpy(w0, bg_model_params(m), n * sizeof(float));
    bg_model_destroy(m);
    bg_executor_params_t p = small_params(d, &src);
    p.optim.kind = BG_OPTIM_SGD;
    p.optim.lr = 1024.0f;
    p.optim.momentum = 0.0f;
    p.optim.weight_decay = 0.0f;
    bg_executor_t *x;
    assert_int_equal(bg_executor_create(&p, &x), BG_OK);
    bg_step_result_t r;
    assert_int_equal(bg_executor_step(x, &r), BG_OK);
    char dir[] = "/tmp/bg-gnorm-XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(bg_executor_save_weights(x, dir), BG_OK);
    assert_int_equal(bg_executor_destroy(x), BG_OK);
    assert_int_equal(bg_model_create(d, be, -1, -1, &m), BG_OK);
    assert_int_equal(bg_safetensors_load_dir(dir, &m, 1), BG_OK);
    double once = 0, twice = 0;
    for (int i = 0; i < bg_model_num_tensors(m); i++) {
        bg_param_t *b = bg_model_tensor(m, i);
        const float *a = w0 + (b->data - bg_model_params(m));
        double ss = 0;
        for (size_t j = 0; j < b->numel; j++) {
            double g = ((double)a[j] - (double)b->data[j]) / 1024.0;
            ss += g * g;
        }
        twice += ss;
        if (strcmp(bg_model_tensor_name(m, i), "head.weight") != 0)
            once += ss;
    }
    double ref = sqrt(once);
    assert_true(isfinite(r.grad_norm) && r.grad_norm > 0);
    if (fabs(r.grad_norm - ref) > 1e-6 * ref)
        fail_msg("grad_norm %.9g, from the applied gradients %.9g", r.grad_norm, ref);
    assert_true(sqrt(twice) > ref * 1.0001); /* the tie really is left out once */
    char f[600];
    snprintf(f, sizeof(f), "%s/model.safetensors", dir);
    unlink(f);
    rmdir(dir);
    bg_model_destroy(m);
    free(w0);
    bg_data_close(data);
    bg_model_desc_destroy(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param_count),
        cmocka_unit_test(test_desc_builder),
        cmocka_unit_test(test_init_independent_of_range),
        cmocka_unit_test(test_split_equivalence_gpt),
        cmocka_unit_test(test_split_equivalence_mlp),
        cmocka_unit_test(test_stage_misuse),
        cmocka_unit_test(test_tie_shape_message),
        cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_stash_offload),
        cmocka_unit_test(test_layer_begin),
        cmocka_unit_test(test_fused_bias_gelu),
        cmocka_unit_test(test_data),
        cmocka_unit_test(test_safetensors),
        cmocka_unit_test(test_train_mlp_learns),
        cmocka_unit_test(test_train_gpt_learns),
        cmocka_unit_test(test_train_microbatching_invariance),
        cmocka_unit_test(test_desc_errors),
        cmocka_unit_test(test_desc_json), cmocka_unit_test(test_llama_desc_json),
        cmocka_unit_test(test_builder_is_public_calls),
        cmocka_unit_test(test_grad_norm),
        cmocka_unit_test(test_eval_forward_only),
        cmocka_unit_test(test_model_of_tensors),
        cmocka_unit_test(test_optim_step_range),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
