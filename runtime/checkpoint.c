/* runtime/checkpoint.c: checkpoints of a job's weights and optimizer state
 * (see include/brigade/checkpoint.h for the layout and protocol).
 *
 * Owns: the rank files (safetensors with weights and optim.m./optim.v.
 * tensors) and their sidecars, the manifest (sizes, CRC32C per file and per
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
#include "core/check.h"

#define CKPT_FORMAT "brigade-checkpoint"
#define CKPT_VERSION 1
#define CKPT_PATH_MAX 4096
#define CKPT_CHUNK_FLOATS 65536

/* Test hook (internal): when >= 0, the number of bytes checkpoint writes may
 * still write; a write beyond it fails with ENOSPC (a full disk). Each write
 * decrements it. -1: off. */
long long bg__checkpoint_fail_after_bytes = -1;

/* ---------------------------------------------------------------- CRC32C */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1; /* Castagnoli, reflected */
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int s = 1; s < 8; s++)
            crc_table[s][i] = (crc_table[s - 1][i] >> 8) ^ crc_table[0][crc_table[s - 1][i] & 0xff];
}

/* Continue a CRC32C: crc = 0 to start; the result is final (no separate finish). */
uint32_t bg__crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = data;
    crc = ~crc;
    while (n >= 8) { /* slice-by-8 */
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
              crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
              crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

/* ---------------------------------------------------------------- files */

/* a + sep + b into buf; the path is truncated (and later fails to open)
 * only beyond cap, which the callers' PATH_MAX-sized buffers make moot */
static void pjoin(char *buf, size_t cap, const char *a, const char *sep, const char *b)
{
    int n = snprintf(buf, cap, "%s%s%s", a, sep, b);
    if (n < 0 || (size_t)n >= cap)
        bg_log(BG_LOG_WARN, "checkpoint", "path %s%s... truncated to %zu bytes", a, sep, cap);
}

static bg_status_t ckpt_write_all(int fd, const void *buf, size_t n, const char *path)
{
    const char *p = buf;
    while (n) {
        size_t k = n;
        ssize_t w;
        if (bg__checkpoint_fail_after_bytes >= 0 && (long long)k > bg__checkpoint_fail_after_bytes)
            k = (size_t)bg__checkpoint_fail_after_bytes;
        if (k == 0) {
            errno = ENOSPC;
            w = -1;
        } else {
            w = write(fd, p, k);
        }
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return bg_error(BG_ERR_IO, "writing %s: %s", path, strerror(errno));
        }
        if (bg__checkpoint_fail_after_bytes >= 0)
            bg__checkpoint_fail_after_bytes -= w;
        p += w;
        n -= (size_t)w;
    }
    return BG_OK;
}

static bg_status_t fsync_path(const char *path, int dir)
{
    int fd = open(path, (dir ? O_DIRECTORY : 0) | O_RDONLY);
    if (fd < 0)
        return bg_error(BG_ERR_IO, "cannot open %s to sync it: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL) /* some file systems cannot sync directories */
        return bg_error(BG_ERR_IO, "fsync %s: %s", path, strerror(e));
    return BG_OK;
}

/* Write a whole small file (fsync'ed). */
static bg_status_t write_file(const char *path, const char *text, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return bg_error(BG_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    bg_status_t st = ckpt_write_all(fd, text, n, path);
    if (st == BG_OK && fsync(fd) != 0)
        st = bg_error(BG_ERR_IO, "fsync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && st == BG_OK)
        st = bg_error(BG_ERR_IO, "closing %s: %s", path, strerror(errno));
    if (st != BG_OK)
        unlink(path);
    return st;
}

/* Read a whole file; *size_p bytes (a NUL is appended). */
static bg_status_t read_file(const char *path, char **buf_p, size_t *size_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bg_error(errno == ENOENT ? BG_ERR_NOT_FOUND : BG_ERR_IO, "cannot open %s: %s", path,
                        strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return bg_error(BG_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return bg_error(BG_ERR_NOMEM, "cannot allocate %zu bytes to read %s", n + 1, path);
    }
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return bg_error(BG_ERR_IO, "reading %s: %s", path, k < 0 ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)k;
    }
    close(fd);
    buf[n] = 0;
    *buf_p = buf;
    *size_p = n;
    return BG_OK;
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

/* mkdir -p */
static bg_status_t mkdir_p(const char *dir)
{
    char tmp[CKPT_PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp)
        return bg_error(BG_ERR_INVALID, "checkpoint path too long: %s", dir);
    for (char *s = tmp + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            struct stat sb;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return bg_error(BG_ERR_IO, "cannot create directory %s: %s", tmp, strerror(errno));
            if (stat(tmp, &sb) != 0)
                return bg_error(BG_ERR_IO, "cannot use %s as a directory: %s", tmp, strerror(errno));
            if (!S_ISDIR(sb.st_mode))
                return bg_error(BG_ERR_IO, "cannot use %s as a directory: it is not one", tmp);
            *s = c;
            if (!c)
                break;
        }
    }
    return BG_OK;
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

/* ---------------------------------------------------------------- model config as JSON */

static json_t *config_to_json(const bg_model_config_t *m)
{
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:i}", "model",
                     m->kind == BG_MODEL_GPT ? "gpt" : "mlp", "layers", m->layers, "d_model", m->d_model, "heads",
                     m->heads, "seq_len", m->seq_len, "vocab", m->vocab, "in_features", m->in_features, "classes",
                     m->classes, "seed", (json_int_t)m->seed, "tie_embeddings", m->tie_embeddings);
}

/* Values may be integers or strings (safetensors metadata holds strings). */
static int json_int_field(json_t *o, const char *key, long long *v)
{
    json_t *x = json_object_get(o, key);
    if (json_is_integer(x)) {
        *v = json_integer_value(x);
        return 0;
    }
    if (json_is_string(x)) {
        char *end;
        errno = 0;
        *v = strtoll(json_string_value(x), &end, 10);
        return errno || end == json_string_value(x) || *end ? -1 : 0;
    }
    return -1;
}

static bg_status_t config_from_json(json_t *o, const char *where, bg_model_config_t *cfg)
{
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    const char *kind = json_string_value(json_object_get(o, "model"));
    if (!kind || (strcmp(kind, "gpt") && strcmp(kind, "mlp")))
        return bg_error(BG_ERR_PARSE, "%s: model configuration has no \"model\": \"gpt\"|\"mlp\"", where);
    c.kind = !strcmp(kind, "gpt") ? BG_MODEL_GPT : BG_MODEL_MLP;
    struct {
        const char *k;
        int *v;
    } f[] = {{"layers", &c.layers}, {"d_model", &c.d_model}, {"heads", &c.heads}, {"seq_len", &c.seq_len},
             {"vocab", &c.vocab}, {"in_features", &c.in_features}, {"classes", &c.classes}};
    for (size_t i = 0; i < BG_ARRAY_LEN(f); i++) {
        long long v;
        if (json_int_field(o, f[i].k, &v) != 0 || v < 0 || v > 1 << 30)
            return bg_error(BG_ERR_PARSE, "%s: model configuration field \"%s\" is missing or not an integer", where,
                            f[i].k);
        *f[i].v = (int)v;
    }
    long long seed, tie;
    if (json_int_field(o, "seed", &seed) == 0)
        c.seed = (uint64_t)seed;
    if (json_int_field(o, "tie_embeddings", &tie) == 0) /* absent in older files: untied */
        c.tie_embeddings = tie != 0;
    *cfg = c;
    return BG_OK;
}

/* The fields that shape the tensors must agree (the seed need not). */
static bg_status_t config_compare(const bg_model_config_t *want, const bg_model_config_t *have, const char *where)
{
    const char *kn[] = {"gpt", "mlp"};
    if (want->kind != have->kind)
        return bg_error(BG_ERR_MISMATCH, "%s holds a %s model, the model to load is a %s", where, kn[have->kind],
                        kn[want->kind]);
    struct {
        const char *k;
        int a, b, gpt_only, mlp_only;
    } f[] = {{"layers", want->layers, have->layers, 0, 0},     {"d_model", want->d_model, have->d_model, 0, 0},
             {"heads", want->heads, have->heads, 1, 0},        {"seq_len", want->seq_len, have->seq_len, 1, 0},
             {"vocab", want->vocab, have->vocab, 1, 0},        {"in_features", want->in_features, have->in_features, 0, 1},
             {"classes", want->classes, have->classes, 0, 1},
             {"tie_embeddings", want->tie_embeddings, have->tie_embeddings, 1, 0}};
    for (size_t i = 0; i < BG_ARRAY_LEN(f); i++) {
        if ((f[i].gpt_only && want->kind != BG_MODEL_GPT) || (f[i].mlp_only && want->kind != BG_MODEL_MLP))
            continue;
        if (f[i].a != f[i].b)
            return bg_error(BG_ERR_MISMATCH, "%s is from another model configuration: %s = %d, the model to load has %d",
                            where, f[i].k, f[i].b, f[i].a);
    }
    return BG_OK;
}

/* ---------------------------------------------------------------- writing a rank file */

typedef struct wentry {
    char name[2 * BG_NAME_MAX + 16];
    const bg_param_t *p;
    const float *src; /* on the backend */
    bg_backend_t *be;
} wentry_t;

static void rank_file_name(char *buf, size_t cap, int rank, const char *ext)
{
    snprintf(buf, cap, "rank-%05d.%s", rank, ext);
}

/* Writes DIR/rank-R.safetensors and its sidecar DIR/rank-R.json. */
static bg_status_t write_rank_file(const char *dir, int rank, int64_t step, bg_model_t *const *models, int nmodels)
{
    bg_status_t st = BG_OK;
    int n = 0, optim = 2;
    for (int k = 0; k < nmodels; k++) {
        n += 3 * bg_model_num_tensors(models[k]);
        bg_model_t *m = models[k];
        int have = bg_model_optim_state(m, 0) ? (bg_model_optim_state(m, 1) ? 2 : 1) : 0;
        if (have < optim)
            optim = have;
    }
    wentry_t *e = calloc(n ? (size_t)n : 1, sizeof(*e));
    float *host = malloc(CKPT_CHUNK_FLOATS * sizeof(float));
    json_t *hdr = json_object(), *sidecar_tensors = json_object();
    char *text = NULL, path[CKPT_PATH_MAX], side[CKPT_PATH_MAX], fname[64];
    int fd = -1;
    if (!e || !host || !hdr || !sidecar_tensors) {
        st = bg_error(BG_ERR_NOMEM, "checkpoint buffers for rank %d", rank);
        goto out;
    }
    int ne = 0;
    for (int k = 0; k < nmodels; k++) {
        bg_model_t *m = models[k];
        float *params = bg_model_params(m);
        for (int i = 0; i < bg_model_num_tensors(m); i++) {
            const bg_param_t *p = bg_model_tensor(m, i);
            const char *name = bg_model_tensor_name(m, i);
            size_t off = (size_t)(p->data - params);
            for (int s = 0; s <= optim; s++) {
                wentry_t *w = &e[ne++];
                snprintf(w->name, sizeof w->name, "%s%s", s == 0 ? "" : s == 1 ? "optim.m." : "optim.v.", name);
                w->p = p;
                w->src = s == 0 ? p->data : bg_model_optim_state(m, s - 1) + off;
                w->be = bg_model_backend(m);
            }
        }
    }
    size_t off = 0;
    for (int i = 0; i < ne; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < e[i].p->ndim; d++)
            json_array_append_new(shape, json_integer(e[i].p->shape[d]));
        size_t bytes = e[i].p->numel * sizeof(float);
        if (json_object_get(hdr, e[i].name)) {
            st = bg_error(BG_ERR_INVALID, "rank %d holds tensor %s twice (overlapping model chunks?)", rank, e[i].name);
            json_decref(shape);
            goto out;
        }
        json_object_set_new(hdr, e[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
    }
    char stepbuf[32], rankbuf[32];
    snprintf(stepbuf, sizeof stepbuf, "%" PRId64, step);
    snprintf(rankbuf, sizeof rankbuf, "%d", rank);
    json_object_set_new(hdr, "__metadata__",
                        json_pack("{s:s, s:s, s:s, s:s}", "format", "pt", "producer", "brigade " BRIGADE_VERSION_STRING,
                                  "step", stepbuf, "rank", rankbuf));
    text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    if (!text) {
        st = bg_error(BG_ERR_NOMEM, "safetensors header of rank %d", rank);
        goto out;
    }
    size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7;
    rank_file_name(fname, sizeof fname, rank, "safetensors");
    pjoin(path, sizeof path, dir, "/", fname);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = bg_error(BG_ERR_IO, "cannot create %s: %s", path, strerror(errno));
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)(padded >> (8 * i));
    uint32_t crc = bg__crc32c(0, len8, 8);
    crc = bg__crc32c(crc, text, hlen);
    crc = bg__crc32c(crc, "        ", padded - hlen);
    BG_CHECK_GOTO(ckpt_write_all(fd, len8, 8, path), st, err_unlink);
    BG_CHECK_GOTO(ckpt_write_all(fd, text, hlen, path), st, err_unlink);
    BG_CHECK_GOTO(ckpt_write_all(fd, "        ", padded - hlen, path), st, err_unlink);
    for (int i = 0; i < ne; i++) {
        uint32_t tcrc = 0;
        size_t numel = e[i].p->numel;
        for (size_t j = 0; j < numel; j += CKPT_CHUNK_FLOATS) {
            size_t k = numel - j < CKPT_CHUNK_FLOATS ? numel - j : CKPT_CHUNK_FLOATS;
            e[i].be->ops->to_host(e[i].be, host, e[i].src + j, k * sizeof(float));
            tcrc = bg__crc32c(tcrc, host, k * sizeof(float));
            crc = bg__crc32c(crc, host, k * sizeof(float));
            BG_CHECK_GOTO(ckpt_write_all(fd, host, k * sizeof(float), path), st, err_unlink);
        }
        json_object_set_new(sidecar_tensors, e[i].name, json_integer(tcrc));
    }
    if (fsync(fd) != 0) {
        st = bg_error(BG_ERR_IO, "fsync %s: %s", path, strerror(errno));
        goto err_unlink;
    }
    if (close(fd) != 0) {
        fd = -1;
        st = bg_error(BG_ERR_IO, "closing %s: %s", path, strerror(errno));
        goto err_unlink;
    }
    fd = -1;
    {
        json_t *sc = json_pack("{s:s, s:i, s:I, s:I, s:i, s:O}", "name", fname, "rank", rank, "bytes",
                               (json_int_t)(8 + padded + off), "crc32c", (json_int_t)crc, "optim", optim, "tensors",
                               sidecar_tensors);
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
        if (st != BG_OK)
            goto err_unlink;
    }
    goto out;
err_unlink:
    if (fd >= 0)
        close(fd);
    unlink(path);
out:
    json_decref(hdr);
    json_decref(sidecar_tensors);
    free(text);
    free(host);
    free(e);
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

/* Parse and check DIR/manifest.json: *m_p is the object (caller decrefs). */
static bg_status_t manifest_read(const char *dir, json_t **m_p)
{
    char path[CKPT_PATH_MAX], *text;
    size_t n;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    BG_CHECK(read_file(path, &text, &n));
    json_error_t err;
    json_t *m = json_loadb(text, n, 0, &err);
    free(text);
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
    if (have != want) {
        json_decref(m);
        return bg_error(BG_ERR_MISMATCH, "%s is corrupted: its checksum is 0x%08x, it says 0x%08x", path, have, want);
    }
    json_t *files = json_object_get(m, "files");
    if (!json_is_array(files) || !json_is_integer(json_object_get(m, "step")) ||
        !json_is_object(json_object_get(m, "model_config"))) {
        json_decref(m);
        return bg_error(BG_ERR_PARSE, "%s lacks step, model_config or files", path);
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

static bg_status_t info_from_manifest(json_t *m, const char *dir, bg_checkpoint_info_t *info)
{
    bg_checkpoint_info_t r;
    memset(&r, 0, sizeof r);
    BG_CHECK(config_from_json(json_object_get(m, "model_config"), dir, &r.model));
    r.step = json_integer_value(json_object_get(m, "step"));
    json_t *dp = json_object_get(m, "data_position");
    r.data_position = json_is_integer(dp) ? json_integer_value(dp) : r.step;
    r.world = (int)json_integer_value(json_object_get(m, "world"));
    r.files = (int)json_array_size(json_object_get(m, "files"));
    r.has_optim = (int)json_integer_value(json_object_get(m, "optim"));
    json_t *extra = json_object_get(m, "extra");
    r.extra_json = extra ? json_dumps(extra, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : strdup("{}");
    if (!r.extra_json)
        return bg_error(BG_ERR_NOMEM, "checkpoint extra JSON");
    *info = r;
    return BG_OK;
}

void bg_checkpoint_info_clear(bg_checkpoint_info_t *info)
{
    if (info) {
        free(info->extra_json);
        info->extra_json = NULL;
    }
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

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Rank 0: gather the sidecars into the manifest, publish the directory, prune. */
static bg_status_t finalize(const bg_checkpoint_params_t *p, bg_model_t *model0, int world, const char *tmpdir,
                            const char *final, const char *token)
{
    bg_status_t st = BG_OK;
    json_t *man = NULL, *files = json_array();
    char **names = NULL;
    size_t nn = 0, cap = 0;
    DIR *d = opendir(tmpdir);
    if (!d)
        return bg_error(BG_ERR_IO, "cannot open %s: %s", tmpdir, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t L = strlen(de->d_name);
        if (strncmp(de->d_name, "rank-", 5) != 0 || L < 6 || strcmp(de->d_name + L - 5, ".json") != 0)
            continue;
        if (nn == cap) {
            cap = cap ? 2 * cap : 16;
            char **q = realloc(names, cap * sizeof(*q));
            if (!q) {
                st = bg_error(BG_ERR_NOMEM, "checkpoint file list");
                break;
            }
            names = q;
        }
        if (!(names[nn] = strdup(de->d_name))) {
            st = bg_error(BG_ERR_NOMEM, "checkpoint file list");
            break;
        }
        nn++;
    }
    closedir(d);
    if (st != BG_OK)
        goto out;
    if (nn == 0) {
        st = bg_error(BG_ERR_NOT_FOUND, "%s: no rank wrote a file (is any rank a writer?)", tmpdir);
        goto out;
    }
    qsort(names, nn, sizeof(*names), cmp_str);
    int optim = 2;
    for (size_t i = 0; i < nn; i++) {
        char path[CKPT_PATH_MAX], *text;
        size_t n;
        pjoin(path, sizeof path, tmpdir, "/", names[i]);
        BG_CHECK_GOTO(read_file(path, &text, &n), st, out);
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
    json_object_set_new(man, "model_config", config_to_json(bg_model_config(model0)));
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
    for (size_t i = 0; i < nn; i++) { /* the sidecars are in the manifest now */
        char path[CKPT_PATH_MAX];
        pjoin(path, sizeof path, tmpdir, "/", names[i]);
        unlink(path);
    }
    BG_CHECK_GOTO(manifest_check_sizes(man, tmpdir), st, out);
    BG_CHECK_GOTO(fsync_path(tmpdir, 1), st, out);

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
    BG_CHECK_GOTO(fsync_path(p->root, 1), st, out);
    if (moved)
        rm_rf(aside);
out:
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    json_decref(files);
    json_decref(man);
    return st;
}

typedef struct step_dir {
    int64_t step;
    char name[64];
} step_dir_t;

static int cmp_step_desc(const void *a, const void *b)
{
    int64_t x = ((const step_dir_t *)a)->step, y = ((const step_dir_t *)b)->step;
    return (x < y) - (x > y);
}

/* Complete checkpoints under root, newest first (*n_p of them; caller frees). */
static bg_status_t list_complete(const char *root, int check_sizes, step_dir_t **list_p, size_t *n_p)
{
    DIR *d = opendir(root);
    if (!d)
        return bg_error(errno == ENOENT ? BG_ERR_NOT_FOUND : BG_ERR_IO, "cannot open checkpoint root %s: %s", root,
                        strerror(errno));
    step_dir_t *list = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int64_t s = parse_step_name(de->d_name);
        if (s < 0 || strlen(de->d_name) >= sizeof list->name)
            continue;
        char dir[CKPT_PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
        json_t *m;
        if (manifest_read(dir, &m) != BG_OK) {
            bg_log(BG_LOG_INFO, "checkpoint", "skipping %s: %s", dir, bg_last_error());
            continue;
        }
        bg_status_t ok = check_sizes ? manifest_check_sizes(m, dir) : BG_OK;
        if (ok == BG_OK && json_integer_value(json_object_get(m, "step")) != s)
            ok = bg_error(BG_ERR_MISMATCH, "%s: manifest step %lld does not match the name", dir,
                          (long long)json_integer_value(json_object_get(m, "step")));
        json_decref(m);
        if (ok != BG_OK) {
            bg_log(BG_LOG_INFO, "checkpoint", "skipping %s: %s", dir, bg_last_error());
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            step_dir_t *q = realloc(list, cap * sizeof(*q));
            if (!q) {
                free(list);
                closedir(d);
                return bg_error(BG_ERR_NOMEM, "checkpoint list");
            }
            list = q;
        }
        list[n].step = s;
        /* step-NNNNNNNN names are short; a longer one is not ours */
        if (snprintf(list[n].name, sizeof list[n].name, "%s", de->d_name) >= (int)sizeof list[n].name)
            continue;
        n++;
    }
    closedir(d);
    if (n)
        qsort(list, n, sizeof(*list), cmp_step_desc);
    *list_p = list;
    *n_p = n;
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
    step_dir_t *list;
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
    fsync_path(root, 1);
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
            BG_CHECK(bg_store_set(p.comm, key, token, strlen(token) + 1));
        } else {
            size_t got;
            BG_CHECK(bg_store_wait(p.comm, key, token, sizeof token, &got));
            token[sizeof token - 1] = 0;
        }
    } else {
        process_token(token, sizeof token);
    }
    char final[CKPT_PATH_MAX], tmpdir[CKPT_PATH_MAX];
    if (snprintf(final, sizeof final, "%s/step-%08lld", p.root, (long long)p.step) >= (int)sizeof final ||
        snprintf(tmpdir, sizeof tmpdir, "%s.tmp-%s", final, token) >= (int)sizeof tmpdir)
        return bg_error(BG_ERR_INVALID, "checkpoint path too long: %s", p.root);

    /* 1. every writer writes its file into the temporary directory */
    bg_status_t mine = BG_OK;
    if (p.writer || rank == 0) {
        if (world == 1 && !p.comm)
            rm_rf(tmpdir); /* a leftover of this process's failed save of the same step */
        mine = mkdir_p(p.root);
        if (mine == BG_OK && mkdir(tmpdir, 0755) != 0 && errno != EEXIST)
            mine = bg_error(BG_ERR_IO, "cannot create %s: %s", tmpdir, strerror(errno));
        if (mine == BG_OK && p.writer)
            mine = write_rank_file(tmpdir, rank, p.step, p.models, p.nmodels);
        if (mine != BG_OK)
            bg_log(BG_LOG_ERROR, "checkpoint", "rank %d: %s", rank, bg_last_error());
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mine != BG_OK ? bg_last_error() : "");

    /* 2. barrier; rank 0 learns whether everyone succeeded */
    int64_t failed = mine != BG_OK;
    if (p.comm) {
        snprintf(key, sizeof key, "bg.ckpt.%lu.failed", seq);
        BG_CHECK(bg_store_add(p.comm, key, failed, &failed));
        BG_CHECK(bg_store_barrier(p.comm));
        if (rank == 0)
            BG_CHECK(bg_store_add(p.comm, key, 0, &failed));
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
    BG_CHECK(bg_store_wait(p.comm, key, res, sizeof res, &got));
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
    step_dir_t *list;
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

/* A safetensors file read into memory. */
typedef struct src_file {
    char path[CKPT_PATH_MAX];
    char *buf;
    size_t size;
    json_t *hdr;
    size_t data_start;
} src_file_t;

/* A tensor to fill. */
typedef struct need {
    char name[2 * BG_NAME_MAX + 16];
    const bg_param_t *p;
    float *dst;       /* on the backend; NULL for optimizer state not yet allocated (see which) */
    bg_model_t *m;
    int which;        /* -1 weights, 0/1 optimizer state */
    size_t off;       /* offset in the flat buffers */
    const float *src; /* in a src_file's buffer, once found */
    const char *src_path;
} need_t;

static void src_free(src_file_t *s)
{
    free(s->buf);
    json_decref(s->hdr);
    s->buf = NULL;
    s->hdr = NULL;
}

/* Parse the header of a file in memory. */
static bg_status_t src_parse(src_file_t *s)
{
    if (s->size < 8)
        return bg_error(BG_ERR_PARSE, "%s: truncated (%zu bytes, no header)", s->path, s->size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)(uint8_t)s->buf[i] << (8 * i);
    if (hlen > s->size - 8)
        return bg_error(BG_ERR_PARSE, "%s: header length %llu exceeds the file (%zu bytes): truncated", s->path,
                        (unsigned long long)hlen, s->size);
    json_error_t err;
    s->hdr = json_loadb(s->buf + 8, (size_t)hlen, 0, &err);
    if (!json_is_object(s->hdr))
        return bg_error(BG_ERR_PARSE, "%s: header is not JSON (%s)", s->path, err.text);
    s->data_start = 8 + (size_t)hlen;
    return BG_OK;
}

/* Point need->src at its data in s (checked dtype, shape, bounds); 0 if s lacks it. */
static bg_status_t src_find(src_file_t *s, need_t *nd, int *found)
{
    json_t *e = json_object_get(s->hdr, nd->name);
    *found = e != NULL;
    if (!e)
        return BG_OK;
    const char *dtype = json_string_value(json_object_get(e, "dtype"));
    if (!dtype || strcmp(dtype, "F32") != 0)
        return bg_error(BG_ERR_MISMATCH, "%s: tensor %s has dtype %s, expected F32", s->path, nd->name,
                        dtype ? dtype : "(none)");
    json_t *shape = json_object_get(e, "shape"), *offs = json_object_get(e, "data_offsets");
    int ok = json_is_array(shape) && json_array_size(shape) == (size_t)nd->p->ndim;
    for (int d = 0; ok && d < nd->p->ndim; d++)
        ok = json_integer_value(json_array_get(shape, (size_t)d)) == nd->p->shape[d];
    if (!ok) {
        char *txt = json_dumps(shape, JSON_COMPACT | JSON_ENCODE_ANY), want[128] = "[";
        for (int d = 0; d < nd->p->ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "",
                     (long long)nd->p->shape[d]);
        strcat(want, "]");
        bg_status_t st = bg_error(BG_ERR_MISMATCH, "%s: tensor %s has shape %s, the model expects %s", s->path,
                                  nd->name, txt ? txt : "?", want);
        free(txt);
        return st;
    }
    json_int_t a = json_integer_value(json_array_get(offs, 0)), b = json_integer_value(json_array_get(offs, 1));
    if (!json_is_array(offs) || a < 0 || b - a != (json_int_t)(nd->p->numel * sizeof(float)) ||
        (uint64_t)b > s->size - s->data_start || a % 4)
        return bg_error(BG_ERR_PARSE, "%s: tensor %s: data_offsets [%lld, %lld] are outside the file's %zu data bytes "
                                      "(truncated?)",
                        s->path, nd->name, (long long)a, (long long)b, s->size - s->data_start);
    nd->src = (const float *)(const void *)(s->buf + s->data_start + (size_t)a);
    nd->src_path = s->path;
    return BG_OK;
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

/* Optimizer state the models have now: 0 none, 1 SGD (m), 2 AdamW (m, v). */
static int model_optim(bg_model_t *m)
{
    return bg_model_optim_state(m, 0) ? (bg_model_optim_state(m, 1) ? 2 : 1) : 0;
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
        bg_backend_t *be = bg_model_backend(m);
        be->ops->from_host(be, dst, nd[i].src, nd[i].p->numel * sizeof(float));
    }
    return BG_OK;
}

/* Which tensor of a file in memory does not match its CRC (for the message). */
static void describe_corruption(src_file_t *s, json_t *tensors, char *out, size_t cap)
{
    snprintf(out, cap, "its header");
    json_t *hdr = NULL;
    uint64_t hlen = 0;
    for (int i = 0; i < 8 && s->size >= 8; i++)
        hlen |= (uint64_t)(uint8_t)s->buf[i] << (8 * i);
    if (s->size < 8 || hlen > s->size - 8)
        return;
    hdr = json_loadb(s->buf + 8, (size_t)hlen, 0, NULL);
    if (!json_is_object(hdr))
        return;
    const char *name;
    json_t *want;
    json_object_foreach(tensors, name, want)
    {
        json_t *offs = json_object_get(json_object_get(hdr, name), "data_offsets");
        json_int_t a = json_integer_value(json_array_get(offs, 0)), b = json_integer_value(json_array_get(offs, 1));
        if (!offs || a < 0 || b < a || (uint64_t)b > s->size - 8 - hlen) {
            snprintf(out, cap, "tensor %s (its data lies outside the file: truncated)", name);
            break;
        }
        uint32_t c = bg__crc32c(0, s->buf + 8 + hlen + (size_t)a, (size_t)(b - a));
        if (c != (uint32_t)json_integer_value(want)) {
            snprintf(out, cap, "tensor %s", name);
            break;
        }
    }
    json_decref(hdr);
}

/* Read and verify one manifest file entry. */
static bg_status_t load_manifest_file(const char *dir, json_t *f, src_file_t *s)
{
    snprintf(s->path, sizeof s->path, "%s/%s", dir, json_string_value(json_object_get(f, "name")));
    BG_CHECK(read_file(s->path, &s->buf, &s->size));
    long long want = json_integer_value(json_object_get(f, "bytes"));
    json_t *tensors = json_object_get(f, "tensors");
    char what[2 * BG_NAME_MAX + 128];
    if ((long long)s->size != want) {
        describe_corruption(s, tensors, what, sizeof what);
        return bg_error(BG_ERR_MISMATCH, "%s has %zu bytes, the manifest says %lld: truncated or damaged (first bad: %s)",
                        s->path, s->size, want, what);
    }
    uint32_t crc = bg__crc32c(0, s->buf, s->size), wcrc = (uint32_t)json_integer_value(json_object_get(f, "crc32c"));
    if (crc != wcrc) {
        describe_corruption(s, tensors, what, sizeof what);
        return bg_error(BG_ERR_MISMATCH, "%s is corrupted: CRC32C 0x%08x, the manifest says 0x%08x; damaged: %s",
                        s->path, crc, wcrc, what);
    }
    return src_parse(s);
}

static bg_status_t load_common(const char *dir, json_t *man, bg_model_t *const *models, int nmodels)
{
    bg_status_t st = BG_OK;
    need_t *nd = NULL;
    int n = 0;
    src_file_t *srcs = NULL;
    int nsrc = 0;
    int optim = 0;
    if (nmodels < 1 || !models)
        return bg_error(BG_ERR_INVALID, "no models to load %s into", dir);

    if (man) {
        optim = (int)json_integer_value(json_object_get(man, "optim"));
        bg_model_config_t have;
        BG_CHECK(config_from_json(json_object_get(man, "model_config"), dir, &have));
        char where[CKPT_PATH_MAX + 32];
        snprintf(where, sizeof where, "checkpoint %s", dir);
        for (int k = 0; k < nmodels; k++)
            BG_CHECK(config_compare(bg_model_config(models[k]), &have, where));
        for (int k = 0; k < nmodels; k++) {
            int mo = model_optim(models[k]);
            if (optim && mo && mo != optim)
                return bg_error(BG_ERR_MISMATCH,
                                "checkpoint %s holds %s optimizer state but the model already has %s state", dir,
                                optim == 2 ? "AdamW" : "SGD", mo == 2 ? "AdamW" : "SGD");
        }
    }
    BG_CHECK(make_needs(models, nmodels, optim, &nd, &n));

    if (man) {
        json_t *files = json_object_get(man, "files");
        size_t nf = json_array_size(files);
        char *used = calloc(nf ? nf : 1, 1);
        srcs = calloc(nf ? nf : 1, sizeof(*srcs));
        if (!used || !srcs) {
            free(used);
            st = bg_error(BG_ERR_NOMEM, "checkpoint file list");
            goto out;
        }
        /* which file holds each needed tensor (by the manifest) */
        for (int i = 0; i < n; i++) {
            size_t j;
            for (j = 0; j < nf; j++)
                if (json_object_get(json_object_get(json_array_get(files, j), "tensors"), nd[i].name))
                    break;
            if (j == nf) {
                free(used);
                st = bg_error(BG_ERR_NOT_FOUND, "checkpoint %s: tensor %s is in none of its %zu file(s)", dir,
                              nd[i].name, nf);
                goto out;
            }
            used[j] = 1;
        }
        for (size_t j = 0; j < nf; j++) {
            if (!used[j])
                continue;
            st = load_manifest_file(dir, json_array_get(files, j), &srcs[nsrc++]);
            if (st != BG_OK) {
                free(used);
                goto out;
            }
        }
        free(used);
    } else {
        DIR *d = opendir(dir);
        if (!d)
            return bg_error(BG_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
        struct dirent *de;
        int cap = 0;
        while ((de = readdir(d))) {
            size_t L = strlen(de->d_name);
            if (L < 12 || strcmp(de->d_name + L - 12, ".safetensors") != 0)
                continue;
            if (nsrc == cap) {
                cap = cap ? 2 * cap : 8;
                src_file_t *q = realloc(srcs, (size_t)cap * sizeof(*q));
                if (!q) {
                    st = bg_error(BG_ERR_NOMEM, "file list");
                    break;
                }
                srcs = q;
            }
            src_file_t *s = &srcs[nsrc++];
            memset(s, 0, sizeof(*s));
            snprintf(s->path, sizeof s->path, "%s/%s", dir, de->d_name);
            st = read_file(s->path, &s->buf, &s->size);
            if (st == BG_OK)
                st = src_parse(s);
            if (st != BG_OK)
                break;
        }
        closedir(d);
        if (st != BG_OK)
            goto out;
        if (nsrc == 0) {
            st = bg_error(BG_ERR_NOT_FOUND, "no .safetensors files in %s", dir);
            goto out;
        }
    }
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int j = 0; j < nsrc && !found; j++)
            BG_CHECK_GOTO(src_find(&srcs[j], &nd[i], &found), st, out);
        if (!found) {
            st = bg_error(BG_ERR_NOT_FOUND, "%s: tensor %s is missing (looked in %d file(s)%s%s)", dir, nd[i].name,
                          nsrc, nsrc ? ", e.g. " : "", nsrc ? srcs[0].path : "");
            goto out;
        }
    }
    /* everything verified: now, and only now, modify the models */
    st = apply_needs(nd, n, optim);
out:
    for (int j = 0; j < nsrc; j++)
        src_free(&srcs[j]);
    free(srcs);
    free(nd);
    return st;
}

bg_status_t bg_checkpoint_load(const char *path, bg_model_t *const *models, int nmodels, bg_checkpoint_info_t *info_p)
{
    json_t *m;
    BG_CHECK(manifest_read(path, &m));
    bg_checkpoint_info_t info;
    bg_status_t st = info_from_manifest(m, path, &info);
    if (st == BG_OK) {
        st = load_common(path, m, models, nmodels);
        if (st == BG_OK && info_p)
            *info_p = info;
        else
            bg_checkpoint_info_clear(&info);
    }
    json_decref(m);
    return st;
}

bg_status_t bg_checkpoint_verify(const char *path)
{
    json_t *m;
    BG_CHECK(manifest_read(path, &m));
    bg_status_t st = BG_OK;
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(m, "files"), i, f)
    {
        src_file_t s;
        memset(&s, 0, sizeof s);
        st = load_manifest_file(path, f, &s);
        src_free(&s);
        if (st != BG_OK)
            break;
    }
    json_decref(m);
    return st;
}

bg_status_t bg_safetensors_load_dir(const char *dir, bg_model_t *const *models, int nmodels)
{
    return load_common(dir, NULL, models, nmodels);
}

bg_status_t bg_safetensors_model_config(const char *dir, bg_model_config_t *cfg_p)
{
    DIR *d = opendir(dir);
    if (!d)
        return bg_error(BG_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    struct dirent *de;
    bg_status_t st = BG_ERR_NOT_FOUND;
    while ((de = readdir(d))) {
        size_t L = strlen(de->d_name);
        if (L < 12 || strcmp(de->d_name + L - 12, ".safetensors") != 0)
            continue;
        src_file_t s;
        memset(&s, 0, sizeof s);
        snprintf(s.path, sizeof s.path, "%s/%s", dir, de->d_name);
        bg_model_config_t c;
        if (read_file(s.path, &s.buf, &s.size) == BG_OK && src_parse(&s) == BG_OK) {
            json_t *meta = json_object_get(s.hdr, "__metadata__");
            if (json_is_object(meta) && json_object_get(meta, "model") &&
                config_from_json(meta, s.path, &c) == BG_OK) {
                *cfg_p = c;
                st = BG_OK;
                bg_error_clear();
            }
        }
        src_free(&s);
        if (st == BG_OK)
            break;
    }
    closedir(d);
    if (st != BG_OK)
        st = bg_error(BG_ERR_NOT_FOUND,
                      "no model configuration in the metadata of %s/*.safetensors (not written by brigade train "
                      "--save?)", dir);
    return st;
}
