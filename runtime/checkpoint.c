/* runtime/checkpoint.c: checkpoints of a job's weights and optimizer state
 * (see include/brigade/checkpoint.h for the layout and protocol): the manifest
 * and the checkpoint root, shared by checkpoint_save.c and checkpoint_load.c.
 *
 * Owns: the manifest's text (its own CRC32C, written and checked here, one
 * convention), parsing and checking a manifest, what bg_checkpoint_read_info
 * reports, the files' sizes against it, listing the step-N directories of a
 * root and finding the newest complete checkpoint; the small path helpers the
 * writer and the reader share (checkpoint_impl.h).
 * Must not: write rank files, publish or prune (checkpoint_save.c), load into
 * a model (checkpoint_load.c), nor call into either: they call this file. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "brigade/checkpoint.h"
#include "core/check.h"
#include "core/fileio.h"
#include "models/safetensors.h"
#include "runtime/checkpoint_impl.h"

/* ---------------------------------------------------------------- files */

/* a + sep + b into buf; the path is truncated (and later fails to open)
 * only beyond cap, which the callers' PATH_MAX-sized buffers make moot */
void bg__ckpt_pjoin(char *buf, size_t cap, const char *a, const char *sep, const char *b)
{
    int n = snprintf(buf, cap, "%s%s%s", a, sep, b);
    if (n < 0 || (size_t)n >= cap)
        bg_log(BG_LOG_WARN, "checkpoint", "path %s%s... truncated to %zu bytes", a, sep, cap);
}

/* "step-00000050" (exactly, no suffix) -> 50; -1 if not that form */
int64_t bg__ckpt_parse_step_name(const char *name)
{
    if (strncmp(name, "step-", 5) != 0)
        return -1;
    const char *d = name + 5;
    if (strlen(d) < 8)
        return -1;
    int64_t v = 0;
    for (; *d; d++) {
        if (*d < '0' || *d > '9' || v > INT64_MAX / 10 - 10)
            return -1;
        v = v * 10 + (*d - '0');
    }
    return v;
}

/* Optimizer state the models have now: 0 none, 1 SGD (m), 2 AdamW (m, v). */
int bg__ckpt_model_optim(bg_model_t *m)
{
    return bg_model_optim_state(m, 0) ? (bg_model_optim_state(m, 1) ? 2 : 1) : 0;
}

/* ---------------------------------------------------------------- manifest */

#define MANIFEST_FLAGS (JSON_INDENT(1) | JSON_SORT_KEYS)

/* Text of the manifest with its own checksum over the text without it. */
char *bg__ckpt_manifest_text(json_t *m)
{
    json_object_del(m, "manifest_crc32c");
    char *body = json_dumps(m, MANIFEST_FLAGS);
    if (!body)
        return NULL;
    uint32_t crc = bg__crc32c(0, body, strlen(body));
    free(body);
    json_object_set_new(m, "manifest_crc32c", json_integer(crc));
    return json_dumps(m, MANIFEST_FLAGS);
}

/* Parse and check a manifest's text (n bytes; path names it in messages):
 * *m_p is the object (caller decrefs). */
bg_status_t bg__manifest_parse(const char *path, const char *text, size_t n, json_t **m_p)
{
    json_error_t err;
    json_t *m = json_loadb(text, n, 0, &err);
    if (!json_is_object(m)) {
        json_decref(m);
        return bg_error(BG_ERR_PARSE, "%s is not a JSON object (line %d: %s): corrupted", path, err.line, err.text);
    }
    json_t *c = json_object_get(m, "manifest_crc32c");
    const char *fmt = json_string_value(json_object_get(m, "format"));
    if (!json_is_integer(c) || !fmt || strcmp(fmt, CKPT_FORMAT) != 0) {
        json_decref(m);
        return bg_error(BG_ERR_PARSE, "%s is not a brigade checkpoint manifest (no format or manifest_crc32c)", path);
    }
    uint32_t want = (uint32_t)json_integer_value(c);
    json_object_del(m, "manifest_crc32c");
    char *body = json_dumps(m, MANIFEST_FLAGS);
    uint32_t have = body ? bg__crc32c(0, body, strlen(body)) : 0;
    free(body);
    json_t *ver = json_object_get(m, "version");
    if (have != want) {
        int other = json_is_integer(ver) && json_integer_value(ver) != CKPT_VERSION;
        long long v = other ? (long long)json_integer_value(ver) : 0;
        json_decref(m); /* ver goes with it */
        if (other)
            return bg_error(BG_ERR_MISMATCH, "%s is corrupted or of another format version (it says version %lld, "
                            "this brigade reads version %d): its checksum is 0x%08x, it says 0x%08x", path,
                            v, CKPT_VERSION, have, want);
        return bg_error(BG_ERR_MISMATCH, "%s is corrupted: its checksum is 0x%08x, it says 0x%08x", path, have, want);
    }
    /* the checksum holds: the version is what the writer meant */
    if (!json_is_integer(ver) || json_integer_value(ver) != CKPT_VERSION) {
        const char *prod = json_string_value(json_object_get(m, "producer"));
        char v[32];
        if (json_is_integer(ver))
            snprintf(v, sizeof v, "%lld", (long long)json_integer_value(ver));
        else
            snprintf(v, sizeof v, "%s", ver ? "not an integer" : "missing");
        bg_status_t e = bg_error(BG_ERR_UNSUPPORTED, "%s: checkpoint format version %s%s%s%s is not supported: this "
                                 "brigade (" BRIGADE_VERSION_STRING ") reads version %d", path, v,
                                 prod ? " (written by " : "", prod ? prod : "", prod ? ")" : "", CKPT_VERSION);
        json_decref(m);
        return e;
    }
    json_t *files = json_object_get(m, "files");
    if (!json_is_array(files) || !json_is_integer(json_object_get(m, "step")) ||
        !json_is_object(json_object_get(m, "model"))) {
        json_decref(m);
        return bg_error(BG_ERR_PARSE, "%s lacks step, model or files", path);
    }
    json_t *optim = json_object_get(m, "optim");
    if (optim && (!json_is_integer(optim) || json_integer_value(optim) < 0 || json_integer_value(optim) > 2)) {
        char got[32];
        snprintf(got, sizeof got, json_is_integer(optim) ? "%lld" : "not an integer",
                 (long long)json_integer_value(optim));
        json_decref(m);
        return bg_error(BG_ERR_PARSE, "%s: optim is %s; expected 0 (no optimizer state), 1 (SGD's momentum) or 2 "
                        "(AdamW's m and v)", path, got);
    }
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f)
    {
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!name || strchr(name, '/') || !json_is_integer(json_object_get(f, "bytes")) ||
            !json_is_integer(json_object_get(f, "crc32c")) || !json_is_object(json_object_get(f, "tensors"))) {
            json_decref(m);
            return bg_error(BG_ERR_PARSE, "%s: files[%zu] lacks name, bytes, crc32c or tensors", path, i);
        }
    }
    *m_p = m;
    return BG_OK;
}

/* Parse and check DIR/manifest.json: *m_p is the object (caller decrefs). */
bg_status_t bg__ckpt_manifest_read(const char *dir, json_t **m_p)
{
    char path[CKPT_PATH_MAX], *text;
    size_t n;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    BG_CHECK(bg__fileio_read(path, &text, &n));
    bg_status_t st = bg__manifest_parse(path, text, n, m_p);
    free(text);
    return st;
}

bg_status_t bg__ckpt_info_from_manifest(json_t *m, const char *dir, bg_checkpoint_info_t *info)
{
    bg_checkpoint_info_t r;
    memset(&r, 0, sizeof r);
    (void)dir;
    r.step = json_integer_value(json_object_get(m, "step"));
    json_t *dp = json_object_get(m, "data_position");
    r.data_position = json_is_integer(dp) ? json_integer_value(dp) : r.step;
    r.world = (int)json_integer_value(json_object_get(m, "world"));
    r.files = (int)json_array_size(json_object_get(m, "files"));
    r.has_optim = (int)json_integer_value(json_object_get(m, "optim"));
    json_t *extra = json_object_get(m, "extra");
    r.extra_json = extra ? json_dumps(extra, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : strdup("{}");
    r.model_json = json_dumps(json_object_get(m, "model"), JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!r.extra_json || !r.model_json) {
        free(r.extra_json);
        free(r.model_json);
        return bg_error(BG_ERR_NOMEM, "checkpoint extra JSON");
    }
    *info = r;
    return BG_OK;
}

void bg_checkpoint_info_clear(bg_checkpoint_info_t *info)
{
    if (info) {
        free(info->extra_json);
        free(info->model_json);
        info->extra_json = NULL;
        info->model_json = NULL;
    }
}

bg_status_t bg__checkpoint_info_parse(const char *path, const char *text, size_t n, bg_checkpoint_info_t *info_p)
{
    json_t *m;
    BG_CHECK(bg__manifest_parse(path, text, n, &m));
    bg_status_t st = bg__ckpt_info_from_manifest(m, path, info_p);
    json_decref(m);
    return st;
}

bg_status_t bg_checkpoint_read_info(const char *path, bg_checkpoint_info_t *info_p)
{
    json_t *m;
    BG_CHECK(bg__ckpt_manifest_read(path, &m));
    bg_status_t st = bg__ckpt_info_from_manifest(m, path, info_p);
    json_decref(m);
    return st;
}

/* Sizes of every file match the manifest. */
bg_status_t bg__ckpt_check_sizes(json_t *m, const char *dir)
{
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(m, "files"), i, f)
    {
        char path[CKPT_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(f, "name")));
        struct stat sb;
        if (stat(path, &sb) != 0)
            return bg_error(BG_ERR_NOT_FOUND, "%s is missing: %s", path, strerror(errno));
        long long want = json_integer_value(json_object_get(f, "bytes"));
        if ((long long)sb.st_size != want)
            return bg_error(BG_ERR_MISMATCH, "%s has %lld bytes, the manifest says %lld (truncated?)", path,
                            (long long)sb.st_size, want);
    }
    return BG_OK;
}

/* ---------------------------------------------------------------- the root */

static int cmp_step_desc(const void *a, const void *b)
{
    int64_t x = ((const bg__ckpt_dir_t *)a)->step, y = ((const bg__ckpt_dir_t *)b)->step;
    return (x < y) - (x > y);
}

bg_status_t bg__checkpoint_dirs(const char *root, bg__ckpt_dir_t **list_p, size_t *n_p)
{
    DIR *d = opendir(root);
    if (!d)
        return bg_error(errno == ENOENT ? BG_ERR_NOT_FOUND : BG_ERR_IO, "cannot open checkpoint root %s: %s", root,
                        strerror(errno));
    bg__ckpt_dir_t *list = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s = bg__ckpt_parse_step_name(de->d_name);
        /* step-NNNNNNNN names are short; a longer one is not ours */
        if (s < 0 || strlen(de->d_name) >= sizeof list->name)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            bg__ckpt_dir_t *q = realloc(list, cap * sizeof(*q));
            if (!q) {
                free(list);
                closedir(d);
                return bg_error(BG_ERR_NOMEM, "checkpoint list");
            }
            list = q;
        }
        list[n].step = s;
        memcpy(list[n].name, de->d_name, strlen(de->d_name) + 1); /* fits: checked above */
        n++;
    }
    closedir(d);
    if (n)
        qsort(list, n, sizeof(*list), cmp_step_desc);
    *list_p = list;
    *n_p = n;
    return BG_OK;
}

/* A complete checkpoint: its manifest reads, its step is its name's, and
 * (check_sizes) its files have the sizes it lists. */
static bg_status_t check_complete(const char *dir, int64_t step, int check_sizes)
{
    json_t *m;
    BG_CHECK(bg__ckpt_manifest_read(dir, &m));
    bg_status_t st = check_sizes ? bg__ckpt_check_sizes(m, dir) : BG_OK;
    if (st == BG_OK && json_integer_value(json_object_get(m, "step")) != step)
        st = bg_error(BG_ERR_MISMATCH, "%s: manifest step %lld does not match the name", dir,
                      (long long)json_integer_value(json_object_get(m, "step")));
    json_decref(m);
    return st;
}

/* Complete checkpoints under root, newest first (*n_p of them; caller frees). */
bg_status_t bg__ckpt_list_complete(const char *root, int check_sizes, bg__ckpt_dir_t **list_p, size_t *n_p)
{
    bg__ckpt_dir_t *list;
    size_t n, k = 0;
    BG_CHECK(bg__checkpoint_dirs(root, &list, &n));
    for (size_t i = 0; i < n; i++) {
        char dir[CKPT_PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", root, list[i].name);
        if (check_complete(dir, list[i].step, check_sizes) != BG_OK) {
            bg_log(BG_LOG_INFO, "checkpoint", "skipping %s: %s", dir, bg_last_error());
            continue;
        }
        list[k++] = list[i];
    }
    *list_p = list;
    *n_p = k;
    return BG_OK;
}

bg_status_t bg_checkpoint_latest(const char *root, char *path_out, size_t cap, int64_t *step_p)
{
    bg__ckpt_dir_t *list;
    size_t n;
    BG_CHECK(bg__ckpt_list_complete(root, 1, &list, &n));
    if (n == 0) {
        free(list);
        return bg_error(BG_ERR_NOT_FOUND, "no complete checkpoint under %s", root);
    }
    int len = snprintf(path_out, cap, "%s/%s", root, list[0].name);
    int64_t s = list[0].step;
    free(list);
    if (len < 0 || (size_t)len >= cap)
        return bg_error(BG_ERR_INVALID, "checkpoint path %s/... does not fit in %zu bytes", root, cap);
    *step_p = s;
    return BG_OK;
}
