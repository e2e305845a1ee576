/* tests/checkpoint/test_checkpoint.c: checkpoints and sampling.
 * Every expectation comes from an independent source: tensor values are a
 * pure function of (tensor name, index, salt), so any split of the model has
 * the expected bits without reading a checkpoint; CRC32C against its
 * published check value; greedy sampling against the argmin of the whole
 * model's cross-entropy over every candidate token. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>

#include "brigade/brigade.h"
#include "bg_test_model.h"
#include "brigade/checkpoint.h"
#include "brigade/transport.h"
#include "transport/ranks.h"

/* internal hooks: core/fileio.c (full disk), models/safetensors.c (CRC32C) */
extern long long bg__write_fail_after_bytes;
uint32_t bg__crc32c(uint32_t crc, const void *data, size_t n);

static bg_backend_t *be;
static char tmp[256];

static int setup(void **state)
{
    (void)state;
    bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
    p.num_threads = 1;
    snprintf(tmp, sizeof tmp, "%s/bg-ckpt.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp))
        return -1;
    return bg_backend_create("cpu", &p, &be) == BG_OK ? 0 : -1;
}
static int teardown(void **state)
{
    (void)state;
    bg_backend_destroy(be);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static bg_model_config_t small_gpt(void) { return bg_test_gpt_config(3, 16, 2, 8, 32, 7); }

static bg_model_t *make(int first, int last)
{
    bg_model_config_t c = small_gpt();
    bg_model_t *m;
    OK(bg_test_model_create(&c, be, first, last, &m));
    return m;
}

/* value(name, j, salt, which): a pure function, so every split agrees */
static float value(const char *name, size_t j, uint32_t salt, int which)
{
    uint64_t h = 1469598103934665603ULL ^ salt ^ ((uint64_t)which << 32);
    for (const char *s = name; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    h ^= j * 0x9e3779b97f4a7c15ULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return (float)((double)(h & 0xffffff) / (double)0xffffff - 0.5) * (which == 2 ? 1e-3f : 1.0f);
}

/* Walks weights (w 0) and, with states, AdamW's m and v (w 1, 2) of every
 * tensor: write sets them to value(salt); else the elements that differ from
 * it are counted. */
static long walk_values(bg_model_t *m, uint32_t salt, int states, int write)
{
    long bad = 0;
    float *params = bg_model_params(m);
    for (int i = 0; i < bg_model_num_tensors(m); i++) {
        bg_param_t *p = bg_model_tensor(m, i);
        const char *name = bg_model_tensor_name(m, i);
        size_t off = (size_t)(p->data - params);
        float *h = malloc(p->numel * sizeof(float));
        for (int w = 0; w < (states ? 3 : 1); w++) {
            float *dev = w == 0 ? p->data : bg_model_optim_state(m, w - 1) + off;
            if (!write)
                be->ops->to_host(be, h, dev, p->numel * sizeof(float));
            for (size_t j = 0; j < p->numel; j++) {
                float want = value(name, j, salt, w);
                if (write)
                    h[j] = want;
                else if (memcmp(&h[j], &want, sizeof want) != 0)
                    bad++;
            }
            if (write)
                be->ops->from_host(be, dev, h, p->numel * sizeof(float));
        }
        free(h);
    }
    return bad;
}

/* Fill weights and AdamW state (allocating it) with value(). */
static void fill(bg_model_t *m, uint32_t salt)
{
    OK(bg_model_optim_init(m, BG_OPTIM_ADAMW));
    walk_values(m, salt, 1, 1);
}

/* Number of elements (weights, m, v) that differ from value(salt); -1 if state is missing. */
static long mismatches(bg_model_t *m, uint32_t salt, int with_state)
{
    if (with_state && (!bg_model_optim_state(m, 0) || !bg_model_optim_state(m, 1)))
        return -1;
    return walk_values(m, salt, with_state, 0);
}

/* Bytes of the parameters (to check "untouched") */
static float *snapshot(bg_model_t *m)
{
    size_t n = bg_model_param_count(m);
    float *h = malloc(n * sizeof(float));
    be->ops->to_host(be, h, bg_model_params(m), n * sizeof(float));
    return h;
}
static int same_as(bg_model_t *m, const float *snap)
{
    float *h = snapshot(m);
    int same = memcmp(h, snap, bg_model_param_count(m) * sizeof(float)) == 0;
    free(h);
    return same;
}

static void dir_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmp, name);
}

/* Save models as ranks (rank 0 last), comm NULL. */
static bg_status_t save_ranks(const char *root, int64_t step, bg_model_t **models, int world, int keep)
{
    for (int r = world - 1; r >= 0; r--) {
        bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
        p.root = root;
        p.step = step;
        p.models = &models[r];
        p.nmodels = 1;
        p.rank = r;
        p.world = world;
        p.keep = keep;
        p.extra_json = "{\"layout\":{\"pp\":3},\"lr\":0.001}";
        bg_status_t st = bg_checkpoint_save(&p);
        if (st != BG_OK)
            return st;
    }
    return BG_OK;
}

static int count_entries(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' && (!needle || strstr(de->d_name, needle)))
            n++;
    closedir(d);
    return n;
}

static void run(const char *cmd)
{
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

/* ---------------------------------------------------------------- tests */

static void test_crc32c(void **state)
{
    (void)state;
    /* the published check value of CRC-32C (Castagnoli) */
    assert_int_equal(bg__crc32c(0, "123456789", 9), 0xE3069283u);
    /* incremental == one shot, across the slice-by-8 boundary */
    char buf[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = (char)(i * 7 + 3);
    uint32_t one = bg__crc32c(0, buf, sizeof buf);
    uint32_t inc = bg__crc32c(bg__crc32c(bg__crc32c(0, buf, 3), buf + 3, 500), buf + 503, 497);
    assert_int_equal(one, inc);
    /* a bytewise reference */
    uint32_t c = 0xffffffffu;
    for (int i = 0; i < 1000; i++) {
        c ^= (uint8_t)buf[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    assert_int_equal(one, ~c);
}

static void test_roundtrip(void **state)
{
    (void)state;
    char root[512], dir[600];
    dir_path(root, sizeof root, "roundtrip");
    bg_model_t *a = make(-1, -1);
    fill(a, 11);
    assert_int_equal(mismatches(a, 11, 1), 0);
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = root;
    p.step = 50;
    p.models = &a;
    p.nmodels = 1;
    p.extra_json = "{\"seed\": 5, \"schedule\": \"1f1b\"}";
    OK(bg_checkpoint_save(&p));
    int64_t step;
    OK(bg_checkpoint_latest(root, dir, sizeof dir, &step));
    assert_int_equal(step, 50);
    assert_non_null(strstr(dir, "step-00000050"));
    OK(bg_checkpoint_verify(dir));

    bg_model_t *b = make(-1, -1); /* other values, no optimizer state */
    assert_true(mismatches(b, 11, 0) > 0);
    assert_null(bg_model_optim_state(b, 0));
    bg_checkpoint_info_t info;
    OK(bg_checkpoint_load(dir, &b, 1, &info));
    assert_int_equal(mismatches(b, 11, 1), 0);
    assert_int_equal(info.step, 50);
    assert_int_equal(info.data_position, 50);
    assert_int_equal(info.world, 1);
    assert_int_equal(info.files, 1);
    assert_int_equal(info.has_optim, 2);
    /* the manifest holds the model description: it matches the model, and names what differs for another */
    assert_non_null(info.model_json);
    OK(bg_model_desc_match_json(bg_model_desc(b), info.model_json, "manifest"));
    {
        bg_model_config_t other = small_gpt();
        other.d_model = 32;
        bg_model_desc_t *od;
        OK(bg_model_build(&other, &od));
        assert_int_equal(bg_model_desc_match_json(od, info.model_json, "manifest"), BG_ERR_MISMATCH);
        assert_non_null(strstr(bg_last_error(), "manifest is from another model"));
        bg_model_desc_destroy(od);
    }
    json_t *x = json_loads(info.extra_json, 0, NULL);
    assert_non_null(x);
    assert_int_equal(json_integer_value(json_object_get(x, "seed")), 5);
    assert_string_equal(json_string_value(json_object_get(x, "schedule")), "1f1b");
    json_decref(x);
    bg_checkpoint_info_clear(&info);

    /* the files are what the docs say */
    char f[700];
    snprintf(f, sizeof f, "%s/rank-00000.safetensors", dir);
    assert_int_equal(access(f, R_OK), 0);
    snprintf(f, sizeof f, "%s/manifest.json", dir);
    json_t *man = json_load_file(f, 0, NULL);
    assert_non_null(man);
    assert_int_equal(json_integer_value(json_object_get(man, "step")), 50);
    json_t *t = json_object_get(json_array_get(json_object_get(man, "files"), 0), "tensors");
    assert_non_null(json_object_get(t, "blocks.1.attn.qkv.weight"));
    assert_non_null(json_object_get(t, "optim.m.blocks.1.attn.qkv.weight"));
    assert_non_null(json_object_get(t, "optim.v.head.weight"));
    json_decref(man);
    assert_int_equal(count_entries(root, NULL), 1);

    /* saving the same step again replaces it (an earlier run got this far) */
    fill(a, 12);
    OK(bg_checkpoint_save(&p));
    OK(bg_checkpoint_load(dir, &b, 1, NULL));
    assert_int_equal(mismatches(b, 12, 1), 0);
    assert_int_equal(count_entries(root, NULL), 1);
    bg_test_model_destroy(a);
    bg_test_model_destroy(b);
}

/* The model split over three ranks (layers 0-1, 2-3, 4-5) filled from seed
 * and saved as step step_no under root; dir gets that step's directory. */
static void save_three(bg_model_t *three[3], const char *root, int64_t step_no, uint32_t seed, char *dir, size_t dir_size)
{
    three[0] = make(0, 1);
    three[1] = make(2, 3);
    three[2] = make(4, 5);
    for (int r = 0; r < 3; r++)
        fill(three[r], seed);
    OK(save_ranks(root, step_no, three, 3, 0));
    int64_t step;
    OK(bg_checkpoint_latest(root, dir, dir_size, &step));
    assert_int_equal(step, step_no);
}

/* GPT with 3 blocks = 6 top-level layers: embed, blocks.0-2, ln_f, head */
static void test_reshard(void **state)
{
    (void)state;
    char root[512], dir[600];
    dir_path(root, sizeof root, "reshard");
    bg_model_t *three[3];
    save_three(three, root, 30, 21, dir, sizeof dir);
    int64_t step;
    char f[700];
    for (int r = 0; r < 3; r++) {
        snprintf(f, sizeof f, "%s/rank-%05d.safetensors", dir, r);
        assert_int_equal(access(f, R_OK), 0);
    }
    assert_int_equal(count_entries(dir, ".json"), 1); /* the sidecars are gone, the manifest stays */

    /* into two ranges */
    bg_model_t *two[2] = {make(0, 2), make(3, 5)};
    for (int r = 0; r < 2; r++) {
        assert_true(mismatches(two[r], 21, 0) > 0);
        bg_checkpoint_info_t info;
        OK(bg_checkpoint_load(dir, &two[r], 1, &info));
        assert_int_equal(info.world, 3);
        assert_int_equal(info.files, 3);
        bg_checkpoint_info_clear(&info);
        assert_int_equal(mismatches(two[r], 21, 1), 0);
    }
    /* into the whole model */
    bg_model_t *whole = make(-1, -1);
    OK(bg_checkpoint_load(dir, &whole, 1, NULL));
    assert_int_equal(mismatches(whole, 21, 1), 0);
    /* into several chunks of one rank at once (interleaved layouts) */
    bg_model_t *chunks[2] = {make(0, 0), make(5, 5)};
    OK(bg_checkpoint_load(dir, chunks, 2, NULL));
    assert_int_equal(mismatches(chunks[0], 21, 1), 0);
    assert_int_equal(mismatches(chunks[1], 21, 1), 0);

    /* and back: the whole model saved as one file loads into the 3 ranges */
    fill(whole, 22);
    char root2[512];
    dir_path(root2, sizeof root2, "reshard-back");
    OK(save_ranks(root2, 7, &whole, 1, 0));
    OK(bg_checkpoint_latest(root2, dir, sizeof dir, &step));
    for (int r = 0; r < 3; r++) {
        OK(bg_checkpoint_load(dir, &three[r], 1, NULL));
        assert_int_equal(mismatches(three[r], 22, 1), 0);
    }
    for (int r = 0; r < 3; r++)
        bg_test_model_destroy(three[r]);
    for (int r = 0; r < 2; r++) {
        bg_test_model_destroy(two[r]);
        bg_test_model_destroy(chunks[r]);
    }
    bg_test_model_destroy(whole);
}

static void test_keep_and_latest(void **state)
{
    (void)state;
    char root[512], dir[600], cmd[8192];
    dir_path(root, sizeof root, "keep");
    int64_t step;
    assert_int_equal(bg_checkpoint_latest(root, dir, sizeof dir, &step), BG_ERR_NOT_FOUND);
    bg_model_t *m = make(-1, -1);
    fill(m, 31);
    OK(save_ranks(root, 10, &m, 1, 2));
    /* a stale .tmp directory of a dead run */
    snprintf(cmd, sizeof cmd, "cp -r %s/step-00000010 %s/step-00000015.tmp-deadrun", root, root);
    run(cmd);
    OK(bg_checkpoint_latest(root, dir, sizeof dir, &step));
    assert_int_equal(step, 10); /* .tmp ignored */
    for (int s = 20; s <= 40; s += 10)
        OK(save_ranks(root, s, &m, 1, 2));
    assert_int_equal(count_entries(root, NULL), 2);
    assert_int_equal(count_entries(root, "step-00000030"), 1);
    assert_int_equal(count_entries(root, "step-00000040"), 1);
    assert_int_equal(count_entries(root, ".tmp"), 0); /* the stale one was removed */

    /* newer directories that are not complete checkpoints are skipped */
    snprintf(cmd, sizeof cmd,
             "cp -r %s/step-00000040 %s/step-00000099.tmp-x && "                      /* in progress */
             "mkdir %s/step-00000080 && cp %s/step-00000040/rank-00000.safetensors %s/step-00000080/ && " /* no manifest */
             "cp -r %s/step-00000040 %s/step-00000090 && "                            /* corrupt manifest */
             "sed -i 's/\"step\": 40/\"step\": 41/' %s/step-00000090/manifest.json && "
             "cp -r %s/step-00000040 %s/step-00000070 && "                            /* manifest says 40 */
             "cp -r %s/step-00000040 %s/step-00000060 && "                            /* truncated file */
             "truncate -s 100 %s/step-00000060/rank-00000.safetensors && "
             "mkdir %s/step-00000050 && echo '{not json' > %s/step-00000050/manifest.json",
             root, root, root, root, root, root, root, root, root, root, root, root, root, root, root);
    run(cmd);
    OK(bg_checkpoint_latest(root, dir, sizeof dir, &step));
    assert_int_equal(step, 40);
    assert_non_null(strstr(dir, "step-00000040"));
    /* the corrupt manifest is refused by name */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/step-00000090", root);
    assert_int_equal(bg_checkpoint_load(bad, &m, 1, NULL), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "manifest.json is corrupted"));
    bg_test_model_destroy(m);
}

/* flip one byte of tensor `name`'s data in a rank file */
static void flip_tensor_byte(const char *file, const char *name)
{
    FILE *f = fopen(file, "r+b");
    assert_non_null(f);
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)len8[i] << (8 * i);
    char *h = malloc(hlen + 1);
    assert_int_equal(fread(h, 1, hlen, f), hlen);
    json_t *hdr = json_loadb(h, hlen, 0, NULL);
    free(h);
    json_t *offs = json_object_get(json_object_get(hdr, name), "data_offsets");
    assert_non_null(offs);
    long pos = (long)(8 + hlen + (uint64_t)json_integer_value(json_array_get(offs, 0)) + 5);
    json_decref(hdr);
    fseek(f, pos, SEEK_SET);
    int c = fgetc(f);
    fseek(f, pos, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void test_refusals(void **state)
{
    (void)state;
    char root[512], dir[600], cmd[4096], bad[600], file[700];
    dir_path(root, sizeof root, "refuse");
    bg_model_t *three[3];
    save_three(three, root, 5, 41, dir, sizeof dir);
    int64_t step;
    bg_model_t *whole = make(-1, -1);
    float *snap = snapshot(whole);
    assert_null(bg_model_optim_state(whole, 0));

    /* truncated file */
    snprintf(bad, sizeof bad, "%s/../refuse-trunc", root);
    snprintf(cmd, sizeof cmd, "cp -r %s %s && truncate -s -10 %s/rank-00001.safetensors", dir, bad, bad);
    run(cmd);
    assert_int_equal(bg_checkpoint_load(bad, &whole, 1, NULL), BG_ERR_MISMATCH);
    const char *e = bg_last_error();
    assert_non_null(strstr(e, "rank-00001.safetensors"));
    assert_non_null(strstr(e, "truncated"));
    assert_non_null(strstr(e, "tensor ")); /* names the first damaged tensor */
    assert_true(same_as(whole, snap));
    assert_null(bg_model_optim_state(whole, 0));
    assert_int_equal(bg_checkpoint_verify(bad), BG_ERR_MISMATCH);

    /* one flipped byte in a tensor's data: the checksum names the file and the tensor */
    snprintf(bad, sizeof bad, "%s/../refuse-flip", root);
    snprintf(cmd, sizeof cmd, "cp -r %s %s", dir, bad);
    run(cmd);
    snprintf(file, sizeof file, "%s/rank-00002.safetensors", bad);
    flip_tensor_byte(file, "optim.v.ln_f.weight");
    assert_int_equal(bg_checkpoint_load(bad, &whole, 1, NULL), BG_ERR_MISMATCH);
    e = bg_last_error();
    assert_non_null(strstr(e, "rank-00002.safetensors is corrupted"));
    assert_non_null(strstr(e, "tensor optim.v.ln_f.weight"));
    assert_true(same_as(whole, snap));
    assert_null(bg_model_optim_state(whole, 0));
    /* a range that does not need the damaged file still loads from it */
    bg_model_t *front = make(0, 2);
    OK(bg_checkpoint_load(bad, &front, 1, NULL));
    assert_int_equal(mismatches(front, 41, 1), 0);
    bg_test_model_destroy(front);

    /* a missing tensor: only ranks 0 and 1 of the 3 wrote (rank 2, ln_f and head, never did) */
    char root2[512];
    dir_path(root2, sizeof root2, "refuse-missing");
    for (int r = 1; r >= 0; r--) {
        bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
        p.root = root2;
        p.step = 5;
        p.models = &three[r];
        p.nmodels = 1;
        p.rank = r;
        p.world = 3;
        OK(bg_checkpoint_save(&p));
    }
    OK(bg_checkpoint_latest(root2, bad, sizeof bad, &step));
    assert_int_equal(bg_checkpoint_load(bad, &whole, 1, NULL), BG_ERR_NOT_FOUND);
    e = bg_last_error();
    assert_non_null(strstr(e, "tensor ln_f."));
    assert_non_null(strstr(e, "step-00000005"));
    assert_true(same_as(whole, snap));

    /* another model configuration */
    bg_model_config_t c = small_gpt();
    c.d_model = 24;
    bg_model_t *other;
    OK(bg_test_model_create(&c, be, -1, -1, &other));
    float *osnap = snapshot(other);
    assert_int_equal(bg_checkpoint_load(dir, &other, 1, NULL), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "is from another model: layers[0] {\"name\":\"embed\""));
    assert_true(same_as(other, osnap));
    bg_test_model_destroy(other);
    free(osnap);
    c = small_gpt();
    c.kind = BG_MODEL_MLP;
    OK(bg_test_model_create(&c, be, -1, -1, &other));
    assert_int_equal(bg_checkpoint_load(dir, &other, 1, NULL), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "is from another model: name \"gpt\" there, \"mlp\" here"));
    bg_test_model_destroy(other);

    c = small_gpt();
    c.tie_embeddings = 1;
    OK(bg_test_model_create(&c, be, -1, -1, &other));
    assert_int_equal(bg_checkpoint_load(dir, &other, 1, NULL), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "ties [] there, [[\"embed.wte\",\"head.weight\"]] here"));
    bg_test_model_destroy(other);

    /* an optimizer state of another kind */
    OK(bg_model_optim_init(whole, BG_OPTIM_SGD));
    assert_int_equal(bg_checkpoint_load(dir, &whole, 1, NULL), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "AdamW"));
    assert_true(same_as(whole, snap));

    /* a shape mismatch (plain safetensors directory; no config to compare first) */
    c = small_gpt();
    c.vocab = 40;
    OK(bg_test_model_create(&c, be, -1, -1, &other));
    char sdir[600];
    snprintf(sdir, sizeof sdir, "%s/../plain", root);
    mkdir(sdir, 0755);
    snprintf(file, sizeof file, "%s/model.safetensors", sdir);
    OK(bg_model_save_safetensors(other, file, NULL));
    assert_int_equal(bg_safetensors_load_dir(sdir, &whole, 1), BG_ERR_MISMATCH);
    e = bg_last_error();
    assert_non_null(strstr(e, "model.safetensors: tensor embed."));
    assert_non_null(strstr(e, "has shape [40,16], the model expects [32,16]"));
    assert_true(same_as(whole, snap));
    bg_test_model_destroy(other);

    for (int r = 0; r < 3; r++)
        bg_test_model_destroy(three[r]);
    bg_test_model_destroy(whole);
    free(snap);
}

static void test_full_disk(void **state)
{
    (void)state;
    char root[512], dir[600], file[700];
    dir_path(root, sizeof root, "full");
    bg_model_t *m = make(-1, -1);
    fill(m, 51);
    OK(save_ranks(root, 10, &m, 1, 1));
    int64_t step;
    OK(bg_checkpoint_latest(root, dir, sizeof dir, &step));
    snprintf(file, sizeof file, "%s/rank-00000.safetensors", dir);
    struct stat sb;
    assert_int_equal(stat(file, &sb), 0);
    long long fsz = (long long)sb.st_size;

    fill(m, 52);
    /* the disk fills at every stage: the rank file's header, its data, its
     * sidecar, the manifest; the previous checkpoint survives every time */
    long long limits[] = {0, 5, 100, fsz / 2, fsz - 1, fsz, fsz + 20, fsz + 2000, fsz + 6000, fsz + 9000};
    int failures = 0;
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        bg__write_fail_after_bytes = limits[i];
        bg_status_t st = save_ranks(root, 20, &m, 1, 1);
        bg__write_fail_after_bytes = -1;
        if (st == BG_OK)
            break; /* enough room at last */
        failures++;
        assert_int_equal(st, BG_ERR_IO);
        assert_non_null(strstr(bg_last_error(), "No space left on device"));
        OK(bg_checkpoint_latest(root, dir, sizeof dir, &step));
        assert_int_equal(step, 10);
        assert_int_equal(count_entries(root, NULL), 1); /* nothing partial visible */
        OK(bg_checkpoint_verify(dir));
        bg_model_t *b = make(-1, -1);
        OK(bg_checkpoint_load(dir, &b, 1, NULL));
        assert_int_equal(mismatches(b, 51, 1), 0);
        bg_test_model_destroy(b);
    }
    assert_true(failures >= 8);

    /* an unwritable root (a path under a regular file): a clear error, nothing else changes */
    char under[700];
    snprintf(under, sizeof under, "%s/rank-00000.safetensors/sub", dir);
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = under;
    p.step = 30;
    p.models = &m;
    p.nmodels = 1;
    assert_int_equal(bg_checkpoint_save(&p), BG_ERR_IO);
    assert_non_null(strstr(bg_last_error(), "rank-00000.safetensors"));
    OK(bg_checkpoint_verify(dir));
    /* bad params */
    p.root = root;
    p.extra_json = "[1, 2]";
    assert_int_equal(bg_checkpoint_save(&p), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "not a JSON object"));
    OK(bg_checkpoint_latest(root, dir, sizeof dir, &step));
    assert_int_equal(count_entries(root, NULL), 1);
    p.extra_json = NULL;
    p.nmodels = 0;
    assert_int_equal(bg_checkpoint_save(&p), BG_ERR_INVALID);
    bg_test_model_destroy(m);
}

/* ---------------------------------------------------------------- with a comm (forked ranks) */

typedef struct {
    const char *root;
    int world, dp;    /* ranks: pp_i = rank / dp holds range pp_i of a 2-split; dp_i = rank % dp */
    int fail_rank;    /* this rank's disk "fills" (-1: none) */
    int64_t step;
    uint32_t salt;
} comm_case_t;

static int comm_rank(int rank, int world, void *arg)
{
    comm_case_t *c = arg;
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = 1;
    bg_backend_t *b2;
    RK_OK(bg_backend_create("cpu", &bp, &b2));
    bg_comm_t *comm;
    bg_comm_params_t cp = BG_COMM_PARAMS_INIT;
    cp.timeout_s = 20;
    RK_OK(bg_comm_create(&cp, &comm));
    RK_CHECK(bg_comm_size(comm) == world, "world");
    bg_model_config_t cfg = small_gpt();
    int pp_i = rank / c->dp, dp_i = rank % c->dp;
    bg_model_t *m;
    RK_OK(bg_test_model_create(&cfg, b2, pp_i == 0 ? 0 : 3, pp_i == 0 ? 2 : 5, &m));
    bg_backend_t *saved = be;
    be = b2;
    fill(m, c->salt);
    be = saved;
    if (rank == c->fail_rank)
        bg__write_fail_after_bytes = 64;
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = c->root;
    p.step = c->step;
    p.models = &m;
    p.nmodels = 1;
    p.comm = comm;
    p.writer = dp_i == 0;
    p.keep = 2;
    bg_status_t st = bg_checkpoint_save(&p);
    if (c->fail_rank >= 0) {
        RK_CHECK(st == BG_ERR_IO, "every rank fails: got %s (%s)", bg_status_string(st), bg_last_error());
        if (rank == 0 && c->fail_rank != 0)
            RK_CHECK(strstr(bg_last_error(), "1 rank(s) failed to write"), "message: %s", bg_last_error());
        if (rank != 0 && rank != c->fail_rank)
            RK_CHECK(strstr(bg_last_error(), "failed on rank 0"), "message: %s", bg_last_error());
        if (rank == c->fail_rank)
            RK_CHECK(strstr(bg_last_error(), "No space left"), "message: %s", bg_last_error());
    } else {
        RK_OK(st);
    }
    bg_test_model_destroy(m);
    RK_OK(bg_comm_destroy(comm));
    bg_backend_destroy(b2);
    return 0;
}

static void test_comm(void **state)
{
    (void)state;
    char root[512], dir[600];
    dir_path(root, sizeof root, "comm");
    /* pp 2 x dp 2: replicas 1 don't write */
    comm_case_t c = {root, 4, 2, -1, 100, 61};
    bgt_result_t res;
    assert_int_equal(bgt_run_ranks(4, comm_rank, &c, 60, NULL, -1, &res), 0);
    int64_t step;
    OK(bg_checkpoint_latest(root, dir, sizeof dir, &step));
    assert_int_equal(step, 100);
    bg_checkpoint_info_t info;
    bg_model_t *whole = make(-1, -1);
    OK(bg_checkpoint_load(dir, &whole, 1, &info));
    assert_int_equal(info.world, 4);
    assert_int_equal(info.files, 2); /* ranks 0 and 2 */
    bg_checkpoint_info_clear(&info);
    assert_int_equal(mismatches(whole, 61, 1), 0);
    char f[700];
    snprintf(f, sizeof f, "%s/rank-00002.safetensors", dir);
    assert_int_equal(access(f, R_OK), 0);
    snprintf(f, sizeof f, "%s/rank-00001.safetensors", dir);
    assert_int_not_equal(access(f, R_OK), 0);

    /* pp 2, rank 1's disk fills: every rank fails, step 100 stays the latest */
    comm_case_t c2 = {root, 2, 1, 1, 200, 62};
    assert_int_equal(bgt_run_ranks(2, comm_rank, &c2, 60, NULL, -1, &res), 0);
    OK(bg_checkpoint_latest(root, dir, sizeof dir, &step));
    assert_int_equal(step, 100);
    assert_int_equal(count_entries(root, NULL), 1);
    /* rank 0's own failure */
    comm_case_t c3 = {root, 2, 1, 0, 300, 63};
    assert_int_equal(bgt_run_ranks(2, comm_rank, &c3, 60, NULL, -1, &res), 0);
    assert_int_equal(count_entries(root, NULL), 1);
    OK(bg_checkpoint_load(dir, &whole, 1, NULL));
    assert_int_equal(mismatches(whole, 61, 1), 0);
    bg_test_model_destroy(whole);
}

/* ---------------------------------------------------------------- generation */

/* Independent greedy step: the token v minimising the whole model's
 * cross-entropy at the last position when the target there is v. */
/* The model's next-token probabilities after ctx (t tokens), p[v] = exp(-loss of target v) at the last
 * position: independent of bg_generate's own logits. */
static void next_probs(bg_model_t *m, const int32_t *ctx, int t, double *p)
{
    int V = bg_model_desc_params(bg_model_desc(m))->vocab;
    bg_stage_t *s;
    OK(bg_stage_create(m, 1, &s));
    int32_t *tok = malloc((size_t)V * (size_t)t * sizeof(int32_t)), *tgt = malloc((size_t)V * (size_t)t * sizeof(int32_t));
    for (int v = 0; v < V; v++)
        for (int i = 0; i < t; i++) {
            tok[v * t + i] = ctx[i];
            tgt[v * t + i] = i == t - 1 ? v : 0;
        }
    float *in, *out;
    bg_shape_t os;
    OK(bg_stage_begin(s, 0, bg_model_input_shape(m, V, t), &in));
    OK(bg_stage_set_data(s, 0, tok, tgt, 1.0f));
    OK(bg_stage_forward(s, 0, &out, &os));
    float *loss = malloc((size_t)V * (size_t)t * sizeof(float));
    be->ops->to_host(be, loss, out, (size_t)V * (size_t)t * sizeof(float));
    for (int v = 0; v < V; v++)
        p[v] = exp(-(double)loss[v * t + t - 1]);
    bg_stage_end(s, 0);
    bg_stage_destroy(s);
    free(tok);
    free(tgt);
    free(loss);
}

static int argmax_by_loss(bg_model_t *m, const int32_t *ctx, int t)
{
    double p[64];
    next_probs(m, ctx, t, p);
    int best = 0;
    for (int v = 1; v < bg_model_desc_params(bg_model_desc(m))->vocab; v++)
        if (p[v] > p[best])
            best = v;
    return best;
}

static void test_generate(void **state)
{
    (void)state;
    bg_model_t *m = make(-1, -1);
    fill(m, 71); /* weights of order 1: confident, varied predictions */
    int32_t prompt[11] = {1, 5, 9, 3, 30, 2, 7, 7, 12, 4, 8}; /* longer than seq_len 8 */
    int n = 3, N = 12;
    int32_t g1[12], g2[12], s1[12], s2[12], s3[12], k1[12];
    OK(bg_generate(m, prompt, n, N, 0.0f, 0, 1, g1));
    OK(bg_generate(m, prompt, n, N, 0.0f, 0, 2, g2));
    assert_memory_equal(g1, g2, sizeof g1); /* greedy ignores the seed */
    /* greedy == argmin of the cross-entropy over every candidate, context truncated to seq_len */
    int32_t all[3 + 12];
    memcpy(all, prompt, (size_t)n * sizeof(int32_t));
    int distinct = 0;
    for (int k = 0; k < N; k++) {
        int len = n + k, t = len < 8 ? len : 8;
        int want = argmax_by_loss(m, all + len - t, t);
        assert_int_equal(g1[k], want);
        all[len] = g1[k];
        distinct += k > 0 && g1[k] != g1[k - 1];
    }
    assert_true(distinct > 0);
    /* sampling: deterministic in the seed */
    OK(bg_generate(m, prompt, 11, N, 1.0f, 0, 42, s1));
    OK(bg_generate(m, prompt, 11, N, 1.0f, 0, 42, s2));
    OK(bg_generate(m, prompt, 11, N, 1.0f, 0, 43, s3));
    assert_memory_equal(s1, s2, sizeof s1);
    assert_memory_not_equal(s1, s3, sizeof s1);
    for (int k = 0; k < N; k++)
        assert_true(s1[k] >= 0 && s1[k] < 32);
    /* a temperature near 0 over every candidate is greedy too (the largest logit kept while the weights
     * are written over it) */
    int32_t z1[12];
    OK(bg_generate(m, prompt, n, N, 1e-3f, 0, 7, z1));
    assert_memory_equal(z1, g1, sizeof g1);
    /* the sampled distribution is softmax(logits / T): at T = 0.5, p^2 normalised; the first token of
     * 4000 seeds, total variation distance to it under 0.06 (about 3 standard errors) */
    {
        double p[32], q[32], sum = 0, tv = 0;
        int cnt[32] = {0}, S = 4000;
        next_probs(m, prompt, n, p);
        for (int v = 0; v < 32; v++)
            sum += q[v] = p[v] * p[v];
        for (int i = 0; i < S; i++) {
            int32_t one[1];
            OK(bg_generate(m, prompt, n, 1, 0.5f, 0, (uint64_t)i + 1, one));
            cnt[one[0]]++;
        }
        for (int v = 0; v < 32; v++)
            tv += fabs((double)cnt[v] / S - q[v] / sum) / 2;
        print_message("sampling at T = 0.5: total variation %.4f from softmax(logits / T)\n", tv);
        assert_true(tv < 0.06);
    }
    /* top-k 1 is greedy, whatever the temperature and seed */
    OK(bg_generate(m, prompt, n, N, 5.0f, 1, 99, k1));
    assert_memory_equal(k1, g1, sizeof g1);
    /* the model is not modified */
    assert_int_equal(mismatches(m, 71, 1), 0);
    /* bad input */
    int32_t badp[1] = {32};
    assert_int_equal(bg_generate(m, badp, 1, 1, 0.0f, 0, 0, k1), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "outside the vocabulary"));
    assert_int_equal(bg_generate(m, prompt, 0, 1, 0.0f, 0, 0, k1), BG_ERR_INVALID);
    bg_model_t *part = make(0, 2);
    assert_int_equal(bg_generate(part, prompt, 1, 1, 0.0f, 0, 0, k1), BG_ERR_INVALID);
    bg_test_model_destroy(part);
    bg_test_model_destroy(m);
}

/* A Llama generates the same tokens with its key/value cache as recomputing every context (greedy: each
 * also the independent argmin of the loss; sampled: the same seed, the same tokens), within seq_len and
 * past it, from a short prompt and from one longer than seq_len. */
static void test_generate_llama(void **state)
{
    (void)state;
    bg_model_config_t c = bg_test_gpt_config(2, 16, 4, 8, 32, 7);
    c.kind = BG_MODEL_LLAMA;
    c.kv_heads = 2;
    bg_model_t *m;
    OK(bg_test_model_create(&c, be, -1, -1, &m));
    fill(m, 91);
    int32_t prompt[11] = {1, 5, 9, 3, 30, 2, 7, 7, 12, 4, 8};
    bg_generate_params_t on = BG_GENERATE_PARAMS_INIT, off = BG_GENERATE_PARAMS_INIT;
    off.kv_cache = 0;
    int32_t a[12], b[12], all[3 + 12];
    for (int plen = 2; plen <= 3; plen++) {
        OK(bg_generate_with(m, prompt, plen, 12, &on, a));
        OK(bg_generate_with(m, prompt, plen, 12, &off, b));
        assert_memory_equal(a, b, sizeof a);
        memcpy(all, prompt, (size_t)plen * sizeof(int32_t));
        int distinct = 0;
        for (int k = 0; k < 12; k++) {
            int len = plen + k, t = len < 8 ? len : 8;
            assert_int_equal(a[k], argmax_by_loss(m, all + len - t, t));
            all[len] = a[k];
            distinct += k > 0 && a[k] != a[k - 1];
        }
        assert_true(distinct > 0);
    }
    on.temperature = off.temperature = 1.0f;
    on.seed = off.seed = 42;
    for (int plen = 3; plen <= 11; plen += 8) {
        OK(bg_generate_with(m, prompt, plen, 12, &on, a));
        OK(bg_generate_with(m, prompt, plen, 12, &off, b));
        assert_memory_equal(a, b, sizeof a);
    }
    assert_int_equal(mismatches(m, 91, 1), 0); /* the model is not modified */
    bg_test_model_destroy(m);
}

/* `brigade generate` prints the prompt and exactly bg_generate's tokens */
static void test_generate_cli(void **state)
{
    (void)state;
    const char *bin = getenv("BRIGADE_BINARY_DIR");
    assert_non_null(bin); /* set by CTest */
    bg_model_config_t c = small_gpt();
    c.vocab = 256;
    c.layers = 1;
    bg_model_t *m;
    OK(bg_test_model_create(&c, be, -1, -1, &m));
    fill(m, 81);
    char root[512];
    dir_path(root, sizeof root, "gen");
    OK(save_ranks(root, 3, &m, 1, 0));
    const char *prompt = "In the";
    int32_t ptok[6];
    for (int i = 0; i < 6; i++)
        ptok[i] = (uint8_t)prompt[i];
    struct {
        const char *flags;
        float temp;
        int top_k;
        uint64_t seed;
    } cases[] = {{"--temperature 0", 0.0f, 40, 1}, {"--temperature 0.9 --top-k 7 --seed 12", 0.9f, 7, 12}};
    for (int k = 0; k < 2; k++) {
        int32_t want[15];
        OK(bg_generate(m, ptok, 6, 15, cases[k].temp, cases[k].top_k, cases[k].seed, want));
        char cmd[2048], out[256];
        snprintf(cmd, sizeof cmd, "'%s/brigade' generate --checkpoint '%s' --prompt '%s' --tokens 15 %s 2>/dev/null",
                 bin, root, prompt, cases[k].flags);
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        size_t n = fread(out, 1, sizeof out, f);
        assert_int_equal(pclose(f), 0);
        assert_int_equal(n, 6 + 15 + 1);
        assert_memory_equal(out, prompt, 6);
        for (int i = 0; i < 15; i++)
            assert_int_equal((uint8_t)out[6 + i], want[i]);
        assert_int_equal(out[21], '\n');
    }
    bg_test_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c),   cmocka_unit_test(test_roundtrip), cmocka_unit_test(test_reshard),
        cmocka_unit_test(test_keep_and_latest), cmocka_unit_test(test_refusals), cmocka_unit_test(test_full_disk),
        cmocka_unit_test(test_comm),     cmocka_unit_test(test_generate), cmocka_unit_test(test_generate_llama),
        cmocka_unit_test(test_generate_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
