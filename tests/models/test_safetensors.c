/* tests/models/test_safetensors.c: the one safetensors reader and writer
 * (models/safetensors.h) and every public path built on it.
 * Hostile files, written byte by byte here, must be refused with a message
 * that names the file, the tensor and the problem by each reader path:
 * the reader itself, bg_safetensors_compare_dirs (brigade compare),
 * bg_safetensors_load_dir and bg_safetensors_model_json (brigade
 * generate), and a checkpoint whose manifest vouches for the hostile file.
 * The round trips check what the writer promises: layout, checksums,
 * metadata, and a file that is complete or absent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>

#include "bg_test_backend.h"
#include "bg_test_model.h"
#include "brigade/checkpoint.h"
#include "models/safetensors.h"

extern long long bg__write_fail_after_bytes; /* core/fileio.c: a full disk */

static char tmp[256];

static int group_setup(void **state)
{
    snprintf(tmp, sizeof tmp, "%s/bg-st.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp))
        return -1;
    return setup(state);
}

static int group_teardown(void **state)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return teardown(state) == 0 && system(cmd) == 0 ? 0 : -1;
}

/* a fresh directory tmp/name */
static void mkdir_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmp, name);
    assert_int_equal(mkdir(out, 0755), 0);
}

/* A file: 8-byte little-endian hlen, the header text, data_len bytes. */
static void write_raw(const char *path, uint64_t hlen, const char *header, size_t data_len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)(hlen >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, strlen(header), f), strlen(header));
    for (size_t i = 0; i < data_len; i++)
        fputc((int)(0x40 + i % 7), f);
    assert_int_equal(fclose(f), 0);
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

static bg_model_t *small_mlp(uint64_t seed)
{
    bg_model_config_t c = bg_test_mlp_config(2, 8, 4, 3, seed);
    bg_model_t *m;
    OK(bg_test_model_create(&c, be, -1, -1, &m));
    return m;
}

static void assert_has(const char *msg, const char *want)
{
    if (!strstr(msg, want))
        fail_msg("message \"%s\" lacks \"%s\"", msg, want);
}

/* ---------------------------------------------------------------- hostile files */

typedef struct hostile {
    const char *what;
    const char *header;
    uint64_t hlen; /* 0: strlen(header) */
    size_t data;   /* data bytes after the header */
    const char *expect[2];
} hostile_t;

#define W2(offs) "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":" offs "}}"

static const hostile_t hostile[] = {
    {"INT64_MIN begin", W2("[-9223372036854775808,8]"), 0, 8, {"tensor w", "negative data_offsets"}},
    {"INT64_MIN begin whose signed end - begin wraps to the shape's bytes",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2305843009213693954],\"data_offsets\":[-9223372036854775808,8]}}", 0, 8,
     {"tensor w", "negative data_offsets"}},
    {"negative begin (would read the header as data)", W2("[-8,0]"), 0, 8, {"tensor w", "negative data_offsets"}},
    {"begin after end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, 8,
     {"tensor w", "begin is after end"}},
    {"end beyond the file", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, 8,
     {"tensor w", "beyond the file's 8 data bytes"}},
    {"overlapping tensors",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     0, 12, {"tensors a [0, 8] and b [4, 12] overlap", NULL}},
    {"shape product mismatch", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8,
     {"tensor w", "holding 8 bytes, its shape [3] needs 12"}},
    {"negative dims whose product is right", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2,-1],\"data_offsets\":[0,8]}}", 0,
     8, {"tensor w", "negative shape dimension"}},
    {"header length beyond the file", W2("[0,8]"), 1000, 8, {"header length 1000 exceeds", NULL}},
    {"header not JSON", "{not json", 0, 8, {"header is not valid JSON", NULL}},
    {"header not an object", "[1, 2]", 0, 8, {"header is not a JSON object", NULL}},
    {"dtype not F32", "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 0, 8,
     {"tensor w", "dtype BF16; only F32"}},
    {"a name twice",
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
     0, 16, {"header is not valid JSON", "duplicate"}},
    {"data_offsets not integers", W2("[0.0,8]"), 0, 8, {"tensor w", "not a pair of integers"}},
    {"data_offsets of three", W2("[0,8,8]"), 0, 8, {"tensor w", "not a pair of integers"}},
    {"shape of strings", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 0, 8,
     {"tensor w", "not an integer"}},
    {"__metadata__ not an object", "{\"__metadata__\":\"x\"}", 0, 0, {"__metadata__ is not a JSON object", NULL}},
};

/* Every reader path refuses the file, naming it and the problem. */
static void refused(bg_status_t st, const char *file, const hostile_t *h)
{
    if (st != BG_ERR_PARSE)
        fail_msg("%s: got %s (%s), want a refusal", h->what, bg_status_string(st), bg_last_error());
    const char *e = bg_last_error();
    assert_has(e, file);
    for (int k = 0; k < 2; k++)
        if (h->expect[k])
            assert_has(e, h->expect[k]);
}

static void test_hostile_files(void **state)
{
    (void)state;
    char good[512], path[600];
    mkdir_in(good, sizeof good, "good");
    snprintf(path, sizeof path, "%s/w.safetensors", good);
    write_raw(path, strlen(W2("[0,8]")), W2("[0,8]"), 8);
    bg__st_file_t *f;
    OK(bg__st_open(path, &f)); /* the well-formed twin of the cases */
    bg__st_close(f);

    bg_model_t *m = small_mlp(1);
    size_t bytes = bg_model_param_count(m) * sizeof(float);
    float *snap = malloc(bytes);
    memcpy(snap, bg_model_params(m), bytes);
    for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++) {
        const hostile_t *h = &hostile[i];
        char dir[512], name[64];
        snprintf(name, sizeof name, "hostile-%zu", i);
        mkdir_in(dir, sizeof dir, name);
        snprintf(path, sizeof path, "%s/bad.safetensors", dir);
        write_raw(path, h->hlen ? h->hlen : strlen(h->header), h->header, h->data);
        print_message("case %zu: %s\n", i, h->what);

        refused(bg__st_open(path, &f), path, h);
        bg_compare_result_t r;
        refused(bg_safetensors_compare_dirs(dir, good, &r), path, h);
        refused(bg_safetensors_compare_dirs(good, dir, &r), path, h);
        refused(bg_safetensors_load_dir(dir, &m, 1), path, h);
        assert_memory_equal(bg_model_params(m), snap, bytes); /* untouched */
        char *json = NULL;
        refused(bg_safetensors_model_json(dir, &json), path, h);
        assert_null(json);
        refused(bg_model_load_safetensors(m, path), path, h);
        assert_memory_equal(bg_model_params(m), snap, bytes);
    }
    /* shorter than the header length itself */
    snprintf(path, sizeof path, "%s/short.safetensors", tmp);
    FILE *s = fopen(path, "wb");
    fputs("abc", s);
    fclose(s);
    assert_int_equal(bg__st_open(path, &f), BG_ERR_PARSE);
    assert_has(bg_last_error(), "short.safetensors: truncated: 3 bytes");
    /* a name too long for any tensor of ours */
    char big[BG_ST_NAME_MAX + 128];
    int n = snprintf(big, sizeof big, "{\"");
    for (int i = 0; i < BG_ST_NAME_MAX; i++)
        big[n++] = 'x';
    snprintf(big + n, sizeof big - (size_t)n, "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}");
    snprintf(path, sizeof path, "%s/long.safetensors", tmp);
    write_raw(path, strlen(big), big, 8);
    assert_int_equal(bg__st_open(path, &f), BG_ERR_PARSE);
    assert_has(bg_last_error(), "long.safetensors: tensor xxxx");
    assert_has(bg_last_error(), "longer than the");
    bg_test_model_destroy(m);
    free(snap);
}

/* Re-sign a checkpoint's manifest after its rank file was replaced, as if
 * the hostile file had been written by the checkpoint itself. */
static void resign_manifest(const char *dir, const char *file, const char *fname)
{
    char mpath[700], *buf;
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    json_t *m = json_load_file(mpath, 0, NULL);
    assert_non_null(m);
    FILE *f = fopen(file, "rb");
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    rewind(f);
    buf = malloc(size);
    assert_int_equal(fread(buf, 1, size, f), size);
    fclose(f);
    json_t *fe = json_array_get(json_object_get(m, "files"), 0);
    assert_string_equal(json_string_value(json_object_get(fe, "name")), fname);
    json_object_set_new(fe, "bytes", json_integer((json_int_t)size));
    json_object_set_new(fe, "crc32c", json_integer(bg__crc32c(0, buf, size)));
    free(buf);
    json_object_del(m, "manifest_crc32c");
    char *body = json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_object_set_new(m, "manifest_crc32c", json_integer(bg__crc32c(0, body, strlen(body))));
    free(body);
    assert_int_equal(json_dump_file(m, mpath, JSON_INDENT(1) | JSON_SORT_KEYS), 0);
    json_decref(m);
}

/* A checkpoint whose manifest vouches for a file with overlapping tensors
 * is refused by the same reader (the checksums alone cannot catch it). */
static void test_hostile_checkpoint(void **state)
{
    (void)state;
    char root[512], dir[600], file[700];
    snprintf(root, sizeof root, "%s/ckpt", tmp);
    bg_model_t *m = small_mlp(2);
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = root;
    p.step = 7;
    p.models = &m;
    p.nmodels = 1;
    OK(bg_checkpoint_save(&p));
    int64_t step;
    OK(bg_checkpoint_latest(root, dir, sizeof dir, &step));
    snprintf(file, sizeof file, "%s/rank-00000.safetensors", dir);

    /* move the second tensor (by offset) to start 4 bytes into the first */
    FILE *f = fopen(file, "rb");
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    rewind(f);
    char *buf = malloc(size);
    assert_int_equal(fread(buf, 1, size, f), size);
    fclose(f);
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    json_t *hdr = json_loadb(buf + 8, hlen, 0, NULL);
    assert_non_null(hdr);
    const char *key, *first = NULL, *second = NULL;
    json_t *e;
    json_int_t b0 = 0;
    json_object_foreach(hdr, key, e)
    {
        json_t *o = json_object_get(e, "data_offsets");
        if (!o)
            continue;
        json_int_t b = json_integer_value(json_array_get(o, 0));
        if (b == 0)
            first = key;
        else if (!second || b < b0) {
            second = key;
            b0 = b;
        }
    }
    assert_non_null(first);
    assert_non_null(second);
    json_t *o = json_object_get(json_object_get(hdr, second), "data_offsets");
    json_int_t len = json_integer_value(json_array_get(o, 1)) - json_integer_value(json_array_get(o, 0));
    json_array_set_new(o, 0, json_integer(4));
    json_array_set_new(o, 1, json_integer(4 + len));
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    size_t tl = strlen(text), pad = (tl + 7) & ~(size_t)7;
    char *header = calloc(1, pad + 1);
    memset(header, ' ', pad);
    memcpy(header, text, tl);
    write_raw(file, pad, header, 0);
    f = fopen(file, "ab");
    assert_int_equal(fwrite(buf + 8 + hlen, 1, size - 8 - hlen, f), size - 8 - hlen);
    fclose(f);
    resign_manifest(dir, file, "rank-00000.safetensors");
    char want[256];
    snprintf(want, sizeof want, "tensors %s [0, ", first);

    bg_model_t *other = small_mlp(3);
    float *snap = malloc(bg_model_param_count(other) * sizeof(float));
    memcpy(snap, bg_model_params(other), bg_model_param_count(other) * sizeof(float));
    assert_int_equal(bg_checkpoint_load(dir, &other, 1, NULL), BG_ERR_PARSE);
    assert_has(bg_last_error(), "rank-00000.safetensors");
    assert_has(bg_last_error(), want);
    assert_has(bg_last_error(), "overlap");
    assert_memory_equal(bg_model_params(other), snap, bg_model_param_count(other) * sizeof(float));
    assert_null(bg_model_optim_state(other, 0));
    assert_int_equal(bg_checkpoint_verify(dir), BG_ERR_PARSE);
    assert_has(bg_last_error(), "overlap");
    free(text);
    free(header);
    free(buf);
    free(snap);
    json_decref(hdr);
    bg_test_model_destroy(other);
    bg_test_model_destroy(m);
}

/* ---------------------------------------------------------------- round trips */

static void test_round_trip(void **state)
{
    (void)state;
    char dir[512], path[600];
    mkdir_in(dir, sizeof dir, "rt");
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    float a[6] = {1, -2, 3.5f, 0, 1e-30f, -7}, s = 42;
    int64_t sa[2] = {2, 3}, se[1] = {0};
    bg__st_wtensor_t t[3] = {
        {.name = "a.weight", .ndim = 2, .shape = sa, .src = a},
        {.name = "scalar", .ndim = 0, .shape = NULL, .src = &s},
        {.name = "empty", .ndim = 1, .shape = se, .src = NULL},
    };
    uint64_t bytes;
    uint32_t crc;
    OK(bg__st_write(path, t, 3, "{\"step\": 3, \"note\": \"hi\", \"list\": [1, 2]}", &bytes, &crc));
    assert_int_equal(t[0].crc32c, bg__crc32c(0, a, sizeof a));
    assert_int_equal(t[1].crc32c, bg__crc32c(0, &s, sizeof s));
    assert_int_equal(count_files(dir), 1); /* no temporary file left */

    bg__st_file_t *f;
    OK(bg__st_open(path, &f));
    FILE *fp = fopen(path, "rb");
    char raw[4096];
    size_t got = fread(raw, 1, sizeof raw, fp);
    fclose(fp);
    assert_int_equal(got, bytes);
    assert_int_equal(crc, bg__crc32c(0, raw, got));
    uint64_t hlen;
    memcpy(&hlen, raw, 8);
    assert_int_equal(hlen % 8, 0); /* the data section starts aligned */
    assert_int_equal(bytes, 8 + hlen + sizeof a + sizeof s);

    assert_int_equal(bg__st_count(f), 3);
    const bg__st_tensor_t *x = bg__st_find(f, "a.weight");
    assert_non_null(x);
    assert_int_equal(x->ndim, 2);
    assert_int_equal(x->shape[0], 2);
    assert_int_equal(x->shape[1], 3);
    assert_int_equal(x->numel, 6);
    assert_int_equal(x->begin, 0);
    assert_memory_equal(x->data, a, sizeof a);
    float back[6];
    bg__st_copy(x, NULL, back);
    assert_memory_equal(back, a, sizeof a);
    OK(bg__st_check_shape(f, x, 2, sa));
    int64_t wrong[2] = {3, 2};
    assert_int_equal(bg__st_check_shape(f, x, 2, wrong), BG_ERR_MISMATCH);
    assert_has(bg_last_error(), "x.safetensors: tensor a.weight has shape [2,3], the model expects [3,2]");
    x = bg__st_find(f, "scalar");
    assert_non_null(x);
    assert_int_equal(x->ndim, 0);
    assert_int_equal(x->numel, 1);
    assert_memory_equal(x->data, &s, sizeof s);
    x = bg__st_find(f, "empty");
    assert_non_null(x);
    assert_int_equal(x->numel, 0);
    assert_null(bg__st_find(f, "nope"));
    json_t *meta = bg__st_metadata(f);
    assert_string_equal(json_string_value(json_object_get(meta, "step")), "3");
    assert_string_equal(json_string_value(json_object_get(meta, "note")), "hi");
    assert_string_equal(json_string_value(json_object_get(meta, "list")), "[1,2]");
    assert_string_equal(json_string_value(json_object_get(meta, "format")), "pt");
    assert_non_null(strstr(json_string_value(json_object_get(meta, "producer")), "brigade"));
    bg__st_close(f);

    /* failures leave the old file as it was and no temporary file */
    struct stat before, after;
    assert_int_equal(stat(path, &before), 0);
    bg__st_wtensor_t dup[2] = {t[0], t[0]};
    assert_int_equal(bg__st_write(path, dup, 2, NULL, NULL, NULL), BG_ERR_INVALID);
    assert_has(bg_last_error(), "tensor a.weight is given twice");
    assert_int_equal(bg__st_write(path, t, 1, "[1]", NULL, NULL), BG_ERR_INVALID);
    assert_has(bg_last_error(), "not a JSON object");
    bg__write_fail_after_bytes = 20; /* the disk fills inside the header */
    assert_int_equal(bg__st_write(path, t, 3, NULL, NULL, NULL), BG_ERR_IO);
    bg__write_fail_after_bytes = -1;
    assert_has(bg_last_error(), "No space left on device");
    assert_int_equal(stat(path, &after), 0);
    assert_int_equal(after.st_size, before.st_size);
    assert_int_equal(count_files(dir), 1);
    OK(bg__st_open(path, &f));
    bg__st_close(f);
    snprintf(path, sizeof path, "%s/none/x.safetensors", dir);
    assert_int_equal(bg__st_write(path, t, 1, NULL, NULL, NULL), BG_ERR_IO);
    assert_has(bg_last_error(), "none/x.safetensors");
}

/* bg_model_save_safetensors, then every public reader of the format */
static void test_model_round_trip(void **state)
{
    (void)state;
    char d1[512], d2[512], path[600];
    mkdir_in(d1, sizeof d1, "m1");
    mkdir_in(d2, sizeof d2, "m2");
    bg_model_t *a = small_mlp(4), *b = small_mlp(5);
    size_t bytes = bg_model_param_count(a) * sizeof(float);
    snprintf(path, sizeof path, "%s/model.safetensors", d1);
    char *meta;
    OK(bg_model_metadata_json(bg_model_desc(a), &meta));
    OK(bg_model_save_safetensors(a, path, meta));
    free(meta);
    snprintf(path, sizeof path, "%s/model.safetensors", d2);
    OK(bg_model_save_safetensors(b, path, NULL));
    bg_compare_result_t r;
    OK(bg_safetensors_compare_dirs(d1, d2, &r));
    assert_int_equal(r.tensors, bg_model_num_tensors(a));
    assert_true(r.identical < r.tensors); /* biases and norms start alike, weights not */
    assert_true(r.rel_l2 > 0);
    char *json = NULL;
    OK(bg_safetensors_model_json(d1, &json));
    OK(bg_model_desc_match_json(bg_model_desc(b), json, "m1")); /* the same model description */
    free(json);
    assert_int_equal(bg_safetensors_model_json(d2, &json), BG_ERR_NOT_FOUND);

    assert_memory_not_equal(bg_model_params(a), bg_model_params(b), bytes);
    OK(bg_safetensors_load_dir(d1, &b, 1));
    assert_memory_equal(bg_model_params(a), bg_model_params(b), bytes);
    OK(bg_model_save_safetensors(b, path, NULL));
    OK(bg_safetensors_compare_dirs(d1, d2, &r));
    assert_int_equal(r.identical, r.tensors);
    assert_int_equal(r.only_a + r.only_b + r.shape_mismatch, 0);
    assert_true(r.rel_l2 == 0);
    bg_test_model_destroy(a);
    bg_test_model_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_model_round_trip),
        cmocka_unit_test(test_hostile_files),
        cmocka_unit_test(test_hostile_checkpoint),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
