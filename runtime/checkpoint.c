/* runtime/checkpoint.c: checkpoints of a job's weights and optimizer state
 * (see include/brigade/checkpoint.h for the layout and protocol).
 *
 * Owns: what the rank files hold (weights and optim.m./optim.v. tensors,
 * written and read through models/safetensors.h, the one safetensors reader
 * and writer) and their sidecars, the manifest (sizes, CRC32C per file and per
 * tensor, its own checksum), the atomic publish (tmp dir, fsync, barrier,
 * rename, fsync of the root), keep-K pruning, finding the newest complete
 * checkpoint, and verified by-name loading into any layer split.
 * Must not: run training or decide when to save; it never modifies a model
 * unless every byte it is about to copy has been verified. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "brigade/checkpoint.h"
#include "runtime/checkpoint_impl.h"
#include "core/check.h"
#include "core/fileio.h"
#include "models/safetensors.h"
#include "runtime/checkpoint_impl.h"

#define CKPT_FORMAT "brigade-checkpoint"
#define CKPT_VERSION 1
#define CKPT_PATH_MAX 4096

/* ---------------------------------------------------------------- files */

/* a + sep + b into buf; the path is truncated (and later fails to open)
 * only beyond cap, which the callers' PATH_MAX-sized buffers make moot */
static void pjoin(char *buf, size_t cap, const char *a, const char *sep, const char *b)
{
    int n = snprintf(buf, cap, "%s%s%s", a, sep, b);
    if (n < 0 || (size_t)n >= cap)
        bg_log(BG_LOG_WARN, "checkpoint", "path %s%s... truncated to %zu bytes", a, sep, cap);
}

/* Write a whole small file (fsync'ed). */
static bg_status_t write_file(const char *path, const char *text, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return bg_error(BG_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    bg_status_t st = bg__fileio_write_all(fd, text, n, path);
    if (st == BG_OK && fsync(fd) != 0)
        st = bg_error(BG_ERR_IO, "fsync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && st == BG_OK)
        st = bg_error(BG_ERR_IO, "closing %s: %s", path, strerror(errno));
    if (st != BG_OK)
        unlink(path);
    return st;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void rm_rf(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* "step-00000050" (exactly, no suffix) -> 50; -1 if not that form */
static int64_t parse_step_name(const char *name)
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

/* ---------------------------------------------------------------- writing a rank file */

static void rank_file_name(char *buf, size_t cap, int rank, const char *ext)
{
    snprintf(buf, cap, "rank-%05d.%s", rank, ext);
}

/* Optimizer state the models have now: 0 none, 1 SGD (m), 2 AdamW (m, v). */
static int model_optim(bg_model_t *m)
{
    return bg_model_optim_state(m, 0) ? (bg_model_optim_state(m, 1) ? 2 : 1) : 0;
}

/* Writes DIR/rank-R.safetensors and its sidecar DIR/rank-R.json. */
/* Optimizer state every model has (the least of them). */
static int models_optim(bg_model_t *const *models, int nmodels)
{
    int optim = 2;
    for (int k = 0; k < nmodels; k++) {
        int have = model_optim(models[k]);
        if (have < optim)
            optim = have;
    }
    return optim;
}

/* Tensor-parallel shards gathered whole before a save (a collective of each
 * tensor group): full[i] is the i-th tensor write_rank_file writes, in its
 * order (NULL: a whole tensor, written from the model). */
typedef struct gathered {
    float **full;
    int64_t (*shape)[BG_PARAM_MAX_DIMS];
    int n;
} gathered_t;

static void gathered_free(gathered_t *g)
{
    for (int i = 0; g->full && i < g->n; i++)
        free(g->full[i]);
    free(g->full);
    free(g->shape);
    memset(g, 0, sizeof *g);
}

static bg_status_t gather_shards(bg_model_t *const *models, int nmodels, gathered_t *g)
{
    const bg_tp_comm_t *tp = bg_model_desc_tp(bg_model_desc(models[0]));
    memset(g, 0, sizeof *g);
    if (!tp)
        return BG_OK;
    int optim = models_optim(models, nmodels), n = 0;
    for (int k = 0; k < nmodels; k++)
        n += (1 + optim) * bg_model_num_tensors(models[k]);
    g->n = n;
    g->full = calloc(n ? (size_t)n : 1, sizeof(*g->full));
    g->shape = calloc(n ? (size_t)n : 1, sizeof(*g->shape));
    if (!g->full || !g->shape) {
        gathered_free(g);
        return bg_error(BG_ERR_NOMEM, "checkpoint: gathering tensor-parallel shards");
    }
    bg_status_t st = BG_OK;
    int i = 0;
    for (int k = 0; k < nmodels; k++) {
        bg_model_t *m = models[k];
        for (int t = 0; t < bg_model_num_tensors(m); t++) {
            const bg_param_t *p = bg_model_tensor(m, t);
            size_t off = (size_t)(p->data - bg_model_params(m));
            for (int s = 0; s <= optim; s++, i++) {
                if (!bg_param_is_shard(p))
                    continue;
                size_t numel = bg_param_full_shape(p, g->shape[i]);
                g->full[i] = malloc(numel * sizeof(float));
                if (!g->full[i]) /* the other members time out in the gather, naming this rank */
                    st = bg_error(BG_ERR_NOMEM, "checkpoint: gathering %s", bg_model_tensor_name(m, t));
                const float *src = s == 0 ? p->data : bg_model_optim_state(m, s - 1) + off;
                if (st == BG_OK)
                    st = bg_param_gather_full(tp, bg_model_backend(m), p, src, g->full[i]);
            }
        }
    }
    if (st != BG_OK)
        gathered_free(g);
    return st;
}

static bg_status_t write_rank_file(const char *dir, int rank, int64_t step, bg_model_t *const *models, int nmodels,
                                   const gathered_t *g)
{
    bg_status_t st = BG_OK;
    int n = 0, optim = models_optim(models, nmodels);
    for (int k = 0; k < nmodels; k++)
        n += 3 * bg_model_num_tensors(models[k]);
    bg__st_wtensor_t *t = calloc(n ? (size_t)n : 1, sizeof(*t));
    char(*names)[BG_ST_NAME_MAX] = calloc(n ? (size_t)n : 1, sizeof(*names));
    json_t *sidecar_tensors = json_object();
    char path[CKPT_PATH_MAX], side[CKPT_PATH_MAX], fname[64];
    if (!t || !names || !sidecar_tensors) {
        st = bg_error(BG_ERR_NOMEM, "checkpoint buffers for rank %d", rank);
        goto out;
    }
    int nt = 0;
    for (int k = 0; k < nmodels; k++) {
        bg_model_t *m = models[k];
        float *params = bg_model_params(m);
        for (int i = 0; i < bg_model_num_tensors(m); i++) {
            const bg_param_t *p = bg_model_tensor(m, i);
            size_t off = (size_t)(p->data - params);
            for (int s = 0; s <= optim; s++, nt++) {
                snprintf(names[nt], sizeof names[nt], "%s%s", s == 0 ? "" : s == 1 ? "optim.m." : "optim.v.",
                         bg_model_tensor_name(m, i));
                t[nt] = (bg__st_wtensor_t){.name = names[nt], .ndim = p->ndim, .shape = p->shape,
                                          .src = s == 0 ? p->data : bg_model_optim_state(m, s - 1) + off,
                                          .be = bg_model_backend(m)};
                if (g->full && g->full[nt]) {
                    t[nt].shape = g->shape[nt];
                    t[nt].src = g->full[nt];
                    t[nt].be = NULL;
                }
            }
        }
    }
    char meta[96];
    snprintf(meta, sizeof meta, "{\"step\": \"%" PRId64 "\", \"rank\": \"%d\"}", step, rank);
    rank_file_name(fname, sizeof fname, rank, "safetensors");
    pjoin(path, sizeof path, dir, "/", fname);
    uint64_t bytes;
    uint32_t crc;
    BG_CHECK_GOTO(bg__st_write(path, t, nt, meta, &bytes, &crc), st, out);
    for (int i = 0; i < nt; i++)
        json_object_set_new(sidecar_tensors, t[i].name, json_integer(t[i].crc32c));
    json_t *sc = json_pack("{s:s, s:i, s:I, s:I, s:i, s:O}", "name", fname, "rank", rank, "bytes", (json_int_t)bytes,
                           "crc32c", (json_int_t)crc, "optim", optim, "tensors", sidecar_tensors);
    char *sct = sc ? json_dumps(sc, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(sc);
    if (!sct) {
        st = bg_error(BG_ERR_NOMEM, "checkpoint sidecar of rank %d", rank);
        goto err_unlink;
    }
    rank_file_name(side, sizeof side, rank, "json");
    char sp[CKPT_PATH_MAX];
    pjoin(sp, sizeof sp, dir, "/", side);
    st = write_file(sp, sct, strlen(sct));
    free(sct);
    if (st == BG_OK)
        goto out;
err_unlink:
    unlink(path);
out:
    json_decref(sidecar_tensors);
    free(names);
    free(t);
    return st;
}

/* ---------------------------------------------------------------- manifest */

#define MANIFEST_FLAGS (JSON_INDENT(1) | JSON_SORT_KEYS)

/* Text of the manifest with its own checksum over the text without it. */
static char *manifest_text(json_t *m)
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
static bg_status_t manifest_read(const char *dir, json_t **m_p)
{
    char path[CKPT_PATH_MAX], *text;
    size_t n;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    BG_CHECK(bg__fileio_read(path, &text, &n));
    bg_status_t st = bg__manifest_parse(path, text, n, m_p);
    free(text);
    return st;
}

static bg_status_t info_from_manifest(json_t *m, const char *dir, bg_checkpoint_info_t *info)
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
    bg_status_t st = info_from_manifest(m, path, info_p);
    json_decref(m);
    return st;
}

bg_status_t bg_checkpoint_read_info(const char *path, bg_checkpoint_info_t *info_p)
{
    json_t *m;
    BG_CHECK(manifest_read(path, &m));
    bg_status_t st = info_from_manifest(m, path, info_p);
    json_decref(m);
    return st;
}

/* Sizes of every file match the manifest. */
static bg_status_t manifest_check_sizes(json_t *m, const char *dir)
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

/* ---------------------------------------------------------------- save */

/* Rank 0: gather the sidecars into the manifest, publish the directory, prune. */
static bg_status_t finalize(const bg_checkpoint_params_t *p, bg_model_t *model0, int world, const char *tmpdir,
                            const char *final, const char *token)
{
    json_t *man = NULL, *files = NULL;
    char **names;
    int nn;
    BG_CHECK(bg__fileio_list_dir(tmpdir, "rank-", ".json", &names, &nn));
    bg_status_t st = BG_OK;
    if (nn == 0) {
        st = bg_error(BG_ERR_NOT_FOUND, "%s: no rank wrote a file (is any rank a writer?)", tmpdir);
        goto out;
    }
    if (!(files = json_array())) {
        st = bg_error(BG_ERR_NOMEM, "checkpoint file list");
        goto out;
    }
    int optim = 2;
    for (int i = 0; i < nn; i++) {
        char path[CKPT_PATH_MAX], *text;
        size_t n;
        pjoin(path, sizeof path, tmpdir, "/", names[i]);
        BG_CHECK_GOTO(bg__fileio_read(path, &text, &n), st, out);
        json_error_t err;
        json_t *sc = json_loadb(text, n, 0, &err);
        free(text);
        if (!json_is_object(sc) || !json_is_integer(json_object_get(sc, "bytes"))) {
            json_decref(sc);
            st = bg_error(BG_ERR_PARSE, "%s: malformed sidecar (%s)", path, err.text);
            goto out;
        }
        int o = (int)json_integer_value(json_object_get(sc, "optim"));
        if (o < optim)
            optim = o;
        json_object_del(sc, "optim");
        json_array_append_new(files, sc);
    }
    man = json_object();
    json_object_set_new(man, "format", json_string(CKPT_FORMAT));
    json_object_set_new(man, "version", json_integer(CKPT_VERSION));
    json_object_set_new(man, "producer", json_string("brigade " BRIGADE_VERSION_STRING));
    json_object_set_new(man, "step", json_integer(p->step));
    json_object_set_new(man, "data_position", json_integer(p->data_position >= 0 ? p->data_position : p->step));
    json_object_set_new(man, "world", json_integer(world));
    json_object_set_new(man, "optim", json_integer(optim));
    {
        char *desc = NULL;
        json_t *mj = NULL;
        if (bg_model_desc_to_json(bg_model_desc(model0), &desc) == BG_OK)
            mj = json_loads(desc, 0, NULL);
        free(desc);
        if (!mj) {
            st = bg_error(BG_ERR_NOMEM, "checkpoint manifest: model description");
            goto out;
        }
        json_object_set_new(man, "model", mj);
    }
    json_object_set_new(man, "created_unix", json_integer((json_int_t)time(NULL)));
    json_object_set(man, "files", files);
    if (p->extra_json) {
        json_error_t err;
        json_t *x = json_loads(p->extra_json, 0, &err);
        if (!json_is_object(x)) {
            json_decref(x);
            st = bg_error(BG_ERR_INVALID, "checkpoint extra_json is not a JSON object (%s)", err.text);
            goto out;
        }
        json_object_set_new(man, "extra", x);
    } else {
        json_object_set_new(man, "extra", json_object());
    }
    char *text = manifest_text(man);
    if (!text) {
        st = bg_error(BG_ERR_NOMEM, "checkpoint manifest");
        goto out;
    }
    char mpath[CKPT_PATH_MAX];
    pjoin(mpath, sizeof mpath, tmpdir, "/", "manifest.json");
    st = write_file(mpath, text, strlen(text));
    free(text);
    if (st != BG_OK)
        goto out;
    for (int i = 0; i < nn; i++) { /* the sidecars are in the manifest now */
        char path[CKPT_PATH_MAX];
        pjoin(path, sizeof path, tmpdir, "/", names[i]);
        unlink(path);
    }
    BG_CHECK_GOTO(manifest_check_sizes(man, tmpdir), st, out);
    BG_CHECK_GOTO(bg__fileio_fsync_path(tmpdir, 1), st, out);

    /* a directory with the final name already (an earlier run reached this
     * step): move it aside under a .tmp name, then replace it */
    char aside[CKPT_PATH_MAX];
    char sfx[160];
    snprintf(sfx, sizeof sfx, ".tmp-replaced-%s", token);
    pjoin(aside, sizeof aside, final, "", sfx);
    struct stat sb;
    int moved = 0;
    if (stat(final, &sb) == 0) {
        if (rename(final, aside) != 0) {
            st = bg_error(BG_ERR_IO, "cannot move the existing %s aside: %s", final, strerror(errno));
            goto out;
        }
        moved = 1;
    }
    if (rename(tmpdir, final) != 0) {
        st = bg_error(BG_ERR_IO, "cannot rename %s to %s: %s", tmpdir, final, strerror(errno));
        if (moved)
            rename(aside, final);
        goto out;
    }
    BG_CHECK_GOTO(bg__fileio_fsync_path(p->root, 1), st, out);
    if (moved)
        rm_rf(aside);
out:
    bg__fileio_free_names(names, nn);
    json_decref(files);
    json_decref(man);
    return st;
}

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
        int64_t s = parse_step_name(de->d_name);
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
    BG_CHECK(manifest_read(dir, &m));
    bg_status_t st = check_sizes ? manifest_check_sizes(m, dir) : BG_OK;
    if (st == BG_OK && json_integer_value(json_object_get(m, "step")) != step)
        st = bg_error(BG_ERR_MISMATCH, "%s: manifest step %lld does not match the name", dir,
                      (long long)json_integer_value(json_object_get(m, "step")));
    json_decref(m);
    return st;
}

/* Complete checkpoints under root, newest first (*n_p of them; caller frees). */
static bg_status_t list_complete(const char *root, int check_sizes, bg__ckpt_dir_t **list_p, size_t *n_p)
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

/* Keep the newest `keep` complete checkpoints; remove stale .tmp directories. */
static void prune(const char *root, int keep)
{
    DIR *d = opendir(root);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (strncmp(de->d_name, "step-", 5) == 0 && strstr(de->d_name, ".tmp-")) {
                char dir[CKPT_PATH_MAX];
                snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
                bg_log(BG_LOG_INFO, "checkpoint", "removing stale %s", dir);
                rm_rf(dir);
            }
        }
        closedir(d);
    }
    if (keep <= 0)
        return;
    bg__ckpt_dir_t *list;
    size_t n;
    if (list_complete(root, 0, &list, &n) != BG_OK)
        return;
    for (size_t i = (size_t)keep; i < n; i++) {
        char dir[CKPT_PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", root, list[i].name);
        bg_log(BG_LOG_INFO, "checkpoint", "removing old checkpoint %s (keep %d)", dir, keep);
        /* first out of sight (a .tmp name, atomically): a crash while deleting
         * leaves a directory the next save removes, never a half checkpoint */
        char gone[CKPT_PATH_MAX + 64], sfx[64];
        snprintf(sfx, sizeof sfx, ".tmp-deleting-%d", (int)getpid());
        pjoin(gone, sizeof gone, dir, "", sfx);
        rm_rf(rename(dir, gone) == 0 ? gone : dir);
    }
    free(list);
    bg__fileio_fsync_path(root, 1);
}

/* Saves started by this process: names the store keys of one save. Every rank
 * counts its own saves; they agree because a save is collective (every rank of
 * the job calls it, in the same order). Atomic for saves on other threads. */
static atomic_ulong save_seq;

/* One token per process, made on first use: the temporary directory of a
 * save, so that a test's calls for each rank agree and a later save of the
 * same step by this process finds its own leftovers. */
static char process_tok[40];
static pthread_once_t process_tok_once = PTHREAD_ONCE_INIT;

static void process_tok_init(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(process_tok, sizeof process_tok, "p%d-%llx", (int)getpid(),
             (unsigned long long)((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) & 0xffffffffull);
}

static void process_token(char *buf, size_t cap)
{
    pthread_once(&process_tok_once, process_tok_init);
    snprintf(buf, cap, "%s", process_tok);
}

/* A save's store operation: a failure (rank 0, which serves the store, died
 * or stopped) ends the save on this rank at once, saying which save. */
#define SAVE_STORE(call)                                                                                     \
    do {                                                                                                     \
        bg_status_t st_ = (call);                                                                            \
        if (st_ != BG_OK)                                                                                    \
            return bg_error(st_, "checkpoint of step %lld not saved: %s", (long long)p.step, bg_last_error()); \
    } while (0)

bg_status_t bg_checkpoint_save(const bg_checkpoint_params_t *pin)
{
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    if (!pin)
        return bg_error(BG_ERR_INVALID, "bg_checkpoint_save: params is NULL");
    memcpy(&p, pin, pin->size < sizeof p ? pin->size : sizeof p);
    if (!p.root || !*p.root)
        return bg_error(BG_ERR_INVALID, "checkpoint root directory is not set");
    if (p.step < 0)
        return bg_error(BG_ERR_INVALID, "checkpoint step must be >= 0 (got %lld)", (long long)p.step);
    if (p.nmodels < 1 || !p.models)
        return bg_error(BG_ERR_INVALID, "checkpoint needs this rank's models (got %d)", p.nmodels);
    int rank = p.comm ? bg_comm_rank(p.comm) : p.rank;
    int world = p.comm ? bg_comm_size(p.comm) : p.world;
    if (world < 1 || rank < 0 || rank >= world)
        return bg_error(BG_ERR_INVALID, "checkpoint rank %d is not in a world of %d", rank, world);
    if (p.extra_json) {
        json_error_t err;
        json_t *x = json_loads(p.extra_json, 0, &err);
        int ok = json_is_object(x);
        json_decref(x);
        if (!ok)
            return bg_error(BG_ERR_INVALID, "checkpoint extra_json is not a JSON object (%s)",
                            x ? "another JSON value" : err.text);
    }
    unsigned long seq = atomic_fetch_add(&save_seq, 1) + 1;

    char token[128], key[BG_STORE_MAX_KEY];
    if (p.token) {
        snprintf(token, sizeof token, "%s", p.token);
    } else if (p.comm) {
        snprintf(key, sizeof key, "bg.ckpt.%lu.token", seq);
        if (rank == 0) {
            process_token(token, sizeof token);
            SAVE_STORE(bg_store_set(p.comm, key, token, strlen(token) + 1));
        } else {
            size_t got;
            SAVE_STORE(bg_store_wait(p.comm, key, token, sizeof token, &got));
            token[sizeof token - 1] = 0;
        }
    } else {
        process_token(token, sizeof token);
    }
    char final[CKPT_PATH_MAX], tmpdir[CKPT_PATH_MAX];
    if (snprintf(final, sizeof final, "%s/step-%08lld", p.root, (long long)p.step) >= (int)sizeof final ||
        snprintf(tmpdir, sizeof tmpdir, "%s.tmp-%s", final, token) >= (int)sizeof tmpdir)
        return bg_error(BG_ERR_INVALID, "checkpoint path too long: %s", p.root);

    /* 1. every writer writes its file into the temporary directory (the
     * members of a tensor-parallel group gather their shards first) */
    gathered_t gathered;
    bg_status_t mine = gather_shards(p.models, p.nmodels, &gathered);
    if (p.writer || rank == 0) {
        if (world == 1 && !p.comm)
            rm_rf(tmpdir); /* a leftover of this process's failed save of the same step */
        mine = bg__fileio_mkdir_p(p.root);
        if (mine == BG_OK && mkdir(tmpdir, 0755) != 0 && errno != EEXIST)
            mine = bg_error(BG_ERR_IO, "cannot create %s: %s", tmpdir, strerror(errno));
        if (mine == BG_OK && p.writer)
            mine = write_rank_file(tmpdir, rank, p.step, p.models, p.nmodels, &gathered);
        if (mine != BG_OK)
            bg_log(BG_LOG_ERROR, "checkpoint", "rank %d: %s", rank, bg_last_error());
    }
    gathered_free(&gathered);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mine != BG_OK ? bg_last_error() : "");

    /* 2. barrier; rank 0 learns whether everyone succeeded */
    int64_t failed = mine != BG_OK;
    if (p.comm) {
        snprintf(key, sizeof key, "bg.ckpt.%lu.failed", seq);
        SAVE_STORE(bg_store_add(p.comm, key, failed, &failed));
        SAVE_STORE(bg_store_barrier(p.comm));
        if (rank == 0) {
            SAVE_STORE(bg_store_add(p.comm, key, 0, &failed));
            /* past the barrier every rank has read this save's token and the
             * previous save's result: forget them, or rank 0's store grows by a
             * few hundred bytes per checkpoint for the whole job */
            bg_store_delete(p.comm, key);
            if (!p.token) {
                snprintf(key, sizeof key, "bg.ckpt.%lu.token", seq);
                bg_store_delete(p.comm, key);
            }
            snprintf(key, sizeof key, "bg.ckpt.%lu.result", seq - 1);
            bg_store_delete(p.comm, key);
        }
    } else if (rank != 0) {
        return mine; /* rank 0's call (the last) publishes */
    }

    /* 3. rank 0 publishes (or cleans up), and tells the others */
    bg_status_t st = BG_OK;
    if (rank == 0) {
        if (mine != BG_OK)
            st = bg_error(mine, "checkpoint of step %lld not saved: %s", (long long)p.step, msg);
        else if (failed)
            st = bg_error(BG_ERR_IO, "checkpoint of step %lld not saved: %lld rank(s) failed to write their files",
                          (long long)p.step, (long long)failed);
        else
            st = finalize(&p, p.models[0], world, tmpdir, final, token);
        if (st != BG_OK) {
            snprintf(msg, sizeof msg, "%s", bg_last_error());
            rm_rf(tmpdir); /* nothing partial stays visible */
            st = bg_error(st, "%s", msg);
        } else {
            prune(p.root, p.keep);
        }
        if (p.comm) {
            char res[1100];
            int len = snprintf(res, sizeof res, "%d %s", (int)st, st == BG_OK ? "" : msg);
            snprintf(key, sizeof key, "bg.ckpt.%lu.result", seq);
            bg_status_t s2 = bg_store_set(p.comm, key, res, (size_t)len + 1);
            if (st == BG_OK && s2 != BG_OK)
                st = s2;
        }
        return st;
    }
    char res[1100];
    size_t got;
    snprintf(key, sizeof key, "bg.ckpt.%lu.result", seq);
    SAVE_STORE(bg_store_wait(p.comm, key, res, sizeof res, &got));
    res[sizeof res - 1] = 0;
    int code = atoi(res);
    if (mine != BG_OK) /* this rank's own failure says more than rank 0's summary */
        return bg_error(mine, "checkpoint of step %lld not saved: %s", (long long)p.step, msg);
    if (code == 0)
        return BG_OK;
    const char *sp = strchr(res, ' ');
    return bg_error((bg_status_t)code, "checkpoint of step %lld failed on rank 0: %s", (long long)p.step,
                    sp ? sp + 1 : "?");
}

bg_status_t bg_checkpoint_latest(const char *root, char *path_out, size_t cap, int64_t *step_p)
{
    bg__ckpt_dir_t *list;
    size_t n;
    BG_CHECK(list_complete(root, 1, &list, &n));
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

/* ---------------------------------------------------------------- loading */

/* A tensor to fill. */
typedef struct need {
    char name[BG_ST_NAME_MAX];
    const bg_param_t *p;
    float *dst;                /* on the backend; NULL for optimizer state not yet allocated (see which) */
    bg_model_t *m;
    int which;                 /* -1 weights, 0/1 optimizer state */
    size_t off;                /* offset in the flat buffers */
    const bg__st_tensor_t *src; /* in one of the validated files, once found */
} need_t;

/* The files a load reads: validated, and for a checkpoint checksummed
 * first (bufs[i]: file i's bytes, NULL when files[i] owns them). */
typedef struct src_set {
    bg__st_file_t **files;
    char **bufs;
    int n;
} src_set_t;

static void src_set_free(src_set_t *s)
{
    for (int i = 0; i < s->n; i++) {
        bg__st_close(s->files[i]);
        free(s->bufs ? s->bufs[i] : NULL);
    }
    free(s->files);
    free(s->bufs);
    memset(s, 0, sizeof *s);
}

/* The needs of the models: weights, and optimizer state when `optim` (1: m, 2: m and v). */
static bg_status_t make_needs(bg_model_t *const *models, int nmodels, int optim, need_t **needs_p, int *n_p)
{
    int n = 0;
    for (int k = 0; k < nmodels; k++)
        n += (1 + optim) * bg_model_num_tensors(models[k]);
    need_t *nd = calloc(n ? (size_t)n : 1, sizeof(*nd));
    if (!nd)
        return bg_error(BG_ERR_NOMEM, "checkpoint tensor list");
    int i = 0;
    for (int k = 0; k < nmodels; k++) {
        bg_model_t *m = models[k];
        float *params = bg_model_params(m);
        for (int t = 0; t < bg_model_num_tensors(m); t++) {
            const bg_param_t *p = bg_model_tensor(m, t);
            for (int s = -1; s < optim; s++) {
                need_t *x = &nd[i++];
                snprintf(x->name, sizeof x->name, "%s%s", s < 0 ? "" : s == 0 ? "optim.m." : "optim.v.",
                         bg_model_tensor_name(m, t));
                x->p = p;
                x->m = m;
                x->which = s;
                x->off = (size_t)(p->data - params);
                x->dst = s < 0 ? p->data : NULL;
            }
        }
    }
    *needs_p = nd;
    *n_p = n;
    return BG_OK;
}

/* Copy every need into the models (everything is verified by now). */
static bg_status_t apply_needs(need_t *nd, int n, int optim)
{
    /* allocate missing optimizer state first: an allocation failure must not
     * leave half-copied weights behind */
    for (int i = 0; i < n; i++)
        if (nd[i].which >= 0 && !bg_model_optim_state(nd[i].m, 0))
            BG_CHECK(bg_model_optim_init(nd[i].m, optim == 2 ? BG_OPTIM_ADAMW : BG_OPTIM_SGD));
    for (int i = 0; i < n; i++) {
        bg_model_t *m = nd[i].m;
        float *dst = nd[i].which < 0 ? nd[i].dst : bg_model_optim_state(m, nd[i].which) + nd[i].off;
        const bg_tp_comm_t *tp = bg_model_desc_tp(bg_model_desc(m));
        BG_CHECK(bg__st_copy_param(nd[i].src, nd[i].p, tp ? tp->rank : 0, bg_model_backend(m), dst));
    }
    return BG_OK;
}

/* What in a damaged file (buf, size bytes) differs from the manifest's
 * per-tensor checksums, for the message: the reader's complaint when its
 * header no longer passes, else the first tensor whose CRC differs. */
static void describe_corruption(const char *path, const char *buf, size_t size, json_t *tensors, char *out,
                                size_t cap)
{
    bg__st_file_t *f;
    if (bg__st_parse(path, buf, size, &f) != BG_OK) {
        const char *e = bg_last_error();
        size_t L = strlen(path);
        snprintf(out, cap, "%s", strncmp(e, path, L) == 0 && !strncmp(e + L, ": ", 2) ? e + L + 2 : e);
        return;
    }
    snprintf(out, cap, "its header");
    const char *name;
    json_t *want;
    json_object_foreach(tensors, name, want)
    {
        const bg__st_tensor_t *t = bg__st_find(f, name);
        if (!t) {
            snprintf(out, cap, "tensor %s (not in its header)", name);
            break;
        }
        if (bg__crc32c(0, t->data, t->end - t->begin) != (uint32_t)json_integer_value(want)) {
            snprintf(out, cap, "tensor %s", name);
            break;
        }
    }
    bg__st_close(f);
}

/* Read one manifest file entry, check its size and CRC32C, then validate it:
 * *buf_p its bytes, *file_p the reader over them. */
static bg_status_t load_manifest_file(const char *dir, json_t *fe, char **buf_p, bg__st_file_t **file_p)
{
    char path[CKPT_PATH_MAX], *buf, what[1024];
    size_t size;
    pjoin(path, sizeof path, dir, "/", json_string_value(json_object_get(fe, "name")));
    BG_CHECK(bg__fileio_read(path, &buf, &size));
    long long want = json_integer_value(json_object_get(fe, "bytes"));
    json_t *tensors = json_object_get(fe, "tensors");
    uint32_t crc = bg__crc32c(0, buf, size), wcrc = (uint32_t)json_integer_value(json_object_get(fe, "crc32c"));
    bg_status_t st = BG_OK;
    if ((long long)size != want) {
        describe_corruption(path, buf, size, tensors, what, sizeof what);
        st = bg_error(BG_ERR_MISMATCH, "%s has %zu bytes, the manifest says %lld: truncated or damaged (first bad: %s)",
                      path, size, want, what);
    } else if (crc != wcrc) {
        describe_corruption(path, buf, size, tensors, what, sizeof what);
        st = bg_error(BG_ERR_MISMATCH, "%s is corrupted: CRC32C 0x%08x, the manifest says 0x%08x; damaged: %s", path,
                      crc, wcrc, what);
    } else {
        st = bg__st_parse(path, buf, size, file_p);
    }
    if (st != BG_OK) {
        free(buf);
        return st;
    }
    *buf_p = buf;
    return BG_OK;
}

/* The files of a checkpoint that hold the needed tensors (by its manifest),
 * each checked against the manifest before it is parsed. */
static bg_status_t open_manifest_files(const char *dir, json_t *man, const need_t *nd, int n, src_set_t *s)
{
    json_t *files = json_object_get(man, "files");
    size_t nf = json_array_size(files);
    char *used = calloc(nf ? nf : 1, 1);
    s->files = calloc(nf ? nf : 1, sizeof(*s->files));
    s->bufs = calloc(nf ? nf : 1, sizeof(*s->bufs));
    bg_status_t st = BG_OK;
    if (!used || !s->files || !s->bufs) {
        st = bg_error(BG_ERR_NOMEM, "checkpoint file list");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        size_t j;
        for (j = 0; j < nf; j++)
            if (json_object_get(json_object_get(json_array_get(files, j), "tensors"), nd[i].name))
                break;
        if (j == nf) {
            st = bg_error(BG_ERR_NOT_FOUND, "checkpoint %s: tensor %s is in none of its %zu file(s)", dir, nd[i].name,
                          nf);
            goto out;
        }
        used[j] = 1;
    }
    for (size_t j = 0; j < nf; j++) {
        if (!used[j])
            continue;
        BG_CHECK_GOTO(load_manifest_file(dir, json_array_get(files, j), &s->bufs[s->n], &s->files[s->n]), st, out);
        s->n++;
    }
out:
    free(used);
    return st;
}

/* *damaged_p (may be NULL) on failure: 1 when the files are damaged (a
 * fallback to an older checkpoint may help), 0 when the checkpoint is of
 * another model or optimizer (none will). */
static bg_status_t load_common(const char *dir, json_t *man, bg_model_t *const *models, int nmodels,
                               int *damaged_p, int apply)
{
    int ignored;
    if (!damaged_p)
        damaged_p = &ignored;
    *damaged_p = 0;
    bg_status_t st = BG_OK;
    need_t *nd = NULL;
    int n = 0;
    src_set_t srcs = {0};
    int optim = 0;
    if (nmodels < 1 || !models)
        return bg_error(BG_ERR_INVALID, "no models to load %s into", dir);

    if (man) {
        optim = (int)json_integer_value(json_object_get(man, "optim"));
        char where[CKPT_PATH_MAX + 32];
        snprintf(where, sizeof where, "checkpoint %s", dir);
        char *have = json_dumps(json_object_get(man, "model"), JSON_COMPACT);
        if (!have)
            return bg_error(BG_ERR_PARSE, "checkpoint %s: no model description in the manifest", dir);
        for (int k = 0; k < nmodels && st == BG_OK; k++)
            st = bg_model_desc_match_json(bg_model_desc(models[k]), have, where);
        free(have);
        BG_CHECK(st);
        for (int k = 0; k < nmodels; k++) {
            int mo = model_optim(models[k]);
            if (optim && mo && mo != optim)
                return bg_error(BG_ERR_MISMATCH,
                                "checkpoint %s holds %s optimizer state but the model already has %s state", dir,
                                optim == 2 ? "AdamW" : "SGD", mo == 2 ? "AdamW" : "SGD");
        }
    }
    BG_CHECK(make_needs(models, nmodels, optim, &nd, &n));
    *damaged_p = 1; /* from here on, what fails is the files */
    if (man)
        st = open_manifest_files(dir, man, nd, n, &srcs);
    else
        st = bg__st_open_dir(dir, &srcs.files, &srcs.n);
    if (st != BG_OK)
        goto out;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < srcs.n && !nd[i].src; j++) {
            const bg__st_tensor_t *t = bg__st_find(srcs.files[j], nd[i].name);
            if (t)
                BG_CHECK_GOTO(bg__st_check_param(srcs.files[j], t, nd[i].p), st, out);
            nd[i].src = t;
        }
        if (!nd[i].src) {
            st = bg_error(BG_ERR_NOT_FOUND, "%s: tensor %s is missing (looked in %d file(s)%s%s)", dir, nd[i].name,
                          srcs.n, srcs.n ? ", e.g. " : "", srcs.n ? bg__st_path(srcs.files[0]) : "");
            goto out;
        }
    }
    /* everything verified: now, and only now, modify the models */
    if (apply)
        st = apply_needs(nd, n, optim);
out:
    src_set_free(&srcs);
    free(nd);
    return st;
}

bg_status_t bg__checkpoint_load(const char *path, bg_model_t *const *models, int nmodels,
                                bg_checkpoint_info_t *info_p, int *damaged_p, int apply)
{
    json_t *m;
    int ignored;
    if (!damaged_p)
        damaged_p = &ignored;
    *damaged_p = 1;
    bg_status_t st = manifest_read(path, &m);
    if (st != BG_OK) {
        *damaged_p = st != BG_ERR_UNSUPPORTED; /* another format version is no damage */
        return st;
    }
    /* a step-N directory holds step N (a manifest copied or renamed is not it) */
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int64_t named = parse_step_name(base);
    if (named >= 0 && json_integer_value(json_object_get(m, "step")) != named) {
        st = bg_error(BG_ERR_MISMATCH, "%s: its manifest says step %lld, its name step %lld", path,
                      (long long)json_integer_value(json_object_get(m, "step")), (long long)named);
        json_decref(m);
        return st;
    }
    bg_checkpoint_info_t info;
    st = info_from_manifest(m, path, &info);
    if (st == BG_OK) {
        st = load_common(path, m, models, nmodels, damaged_p, apply);
        if (st == BG_OK && info_p)
            *info_p = info;
        else
            bg_checkpoint_info_clear(&info);
    }
    json_decref(m);
    return st;
}

bg_status_t bg_checkpoint_load(const char *path, bg_model_t *const *models, int nmodels, bg_checkpoint_info_t *info_p)
{
    return bg__checkpoint_load(path, models, nmodels, info_p, NULL, 1);
}

bg_status_t bg_checkpoint_verify(const char *path)
{
    json_t *m;
    BG_CHECK(manifest_read(path, &m));
    bg_status_t st = BG_OK;
    size_t i;
    json_t *fe;
    json_array_foreach(json_object_get(m, "files"), i, fe)
    {
        char *buf;
        bg__st_file_t *f;
        st = load_manifest_file(path, fe, &buf, &f);
        if (st != BG_OK)
            break;
        bg__st_close(f);
        free(buf);
    }
    json_decref(m);
    return st;
}

bg_status_t bg_safetensors_load_dir(const char *dir, bg_model_t *const *models, int nmodels)
{
    return load_common(dir, NULL, models, nmodels, NULL, 1);
}

bg_status_t bg_safetensors_model_json(const char *dir, char **json_p)
{
    bg__st_file_t **files;
    int n;
    bg_status_t st = bg__st_open_dir(dir, &files, &n);
    if (st != BG_OK && st != BG_ERR_NOT_FOUND)
        return st; /* a file that does not pass the reader: say which and why */
    if (st == BG_OK) {
        st = BG_ERR_NOT_FOUND;
        for (int i = 0; i < n && st != BG_OK; i++) {
            const char *text = json_string_value(json_object_get(bg__st_metadata(files[i]), "brigade_model"));
            if (text && (*json_p = strdup(text)) != NULL)
                st = BG_OK;
        }
        bg__st_close_all(files, n);
    }
    if (st != BG_OK)
        return bg_error(BG_ERR_NOT_FOUND,
                        "no model description in the metadata of %s/*.safetensors (not written by brigade?)", dir);
    bg_error_clear();
    return BG_OK;
}
