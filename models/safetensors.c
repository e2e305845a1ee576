/* models/safetensors.c: the one safetensors reader and writer (see
 * models/safetensors.h for the layout and every check a file must pass), the
 * CRC32C of checkpoints, and the public safetensors functions of model.h
 * built on them: saving and loading a model range, comparing directories.
 * Must not: know checkpoints' manifests or any other file format. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brigade/model.h"
#include "core/check.h"
#include "core/fileio.h"
#include "models/safetensors.h"

#define ST_CHUNK_FLOATS 65536 /* host staging buffer when writing from a backend */
#define ST_SUFFIX ".safetensors"

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

/* ---------------------------------------------------------------- shapes */

/* "[40,16]" (truncated with "..." beyond cap) */
static void shape_text(char *out, size_t cap, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(out + k, cap - k, "%s%lld", d ? "," : "", (long long)shape[d]);
    if (k < cap)
        snprintf(out + k, cap - k, "]");
}

/* Bytes of an F32 tensor of this shape; -1 when a dimension is negative or
 * the product overflows. */
static int shape_bytes(int ndim, const int64_t *shape, uint64_t *numel_p, uint64_t *bytes_p)
{
    uint64_t numel = 1, bytes;
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[d], &numel))
            return -1;
    if (__builtin_mul_overflow(numel, (uint64_t)sizeof(float), &bytes))
        return -1;
    *numel_p = numel;
    *bytes_p = bytes;
    return 0;
}

/* ---------------------------------------------------------------- writing */

/* __metadata__: the caller's object with string values, plus format and producer. */
static bg_status_t make_metadata(const char *path, const char *metadata_json, json_t **meta_p)
{
    json_t *meta = json_object();
    if (!meta)
        return bg_error(BG_ERR_NOMEM, "%s: metadata", path);
    if (metadata_json) {
        json_error_t err;
        json_t *extra = json_loads(metadata_json, 0, &err);
        if (!json_is_object(extra)) {
            json_decref(extra);
            json_decref(meta);
            return bg_error(BG_ERR_INVALID, "%s: safetensors metadata is not a JSON object: %s", path,
                            extra ? "another JSON value" : err.text);
        }
        const char *k;
        json_t *v;
        json_object_foreach(extra, k, v)
        {
            if (json_is_string(v)) {
                json_object_set(meta, k, v);
            } else {
                char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
                json_object_set_new(meta, k, json_string(s ? s : ""));
                free(s);
            }
        }
        json_decref(extra);
    }
    if (!json_object_get(meta, "format"))
        json_object_set_new(meta, "format", json_string("pt"));
    if (!json_object_get(meta, "producer"))
        json_object_set_new(meta, "producer", json_string("brigade " BRIGADE_VERSION_STRING));
    *meta_p = meta;
    return BG_OK;
}

/* The header's text: tensors at consecutive offsets in the given order;
 * *data_bytes_p the size of the data section. */
static bg_status_t make_header(const char *path, const bg__st_wtensor_t *t, int n, const char *metadata_json,
                               char **text_p, uint64_t *data_bytes_p)
{
    json_t *hdr = json_object(), *meta = NULL;
    if (!hdr)
        return bg_error(BG_ERR_NOMEM, "%s: header", path);
    bg_status_t st = BG_OK;
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t numel, bytes;
        const char *name = t[i].name;
        if (!name || !*name || strlen(name) >= BG_ST_NAME_MAX || !strcmp(name, "__metadata__")) {
            st = bg_error(BG_ERR_INVALID, "%s: tensor %d's name \"%.64s\" is empty, reserved or longer than %d bytes",
                          path, i, name ? name : "", BG_ST_NAME_MAX - 1);
            goto out;
        }
        if (t[i].ndim < 0 || t[i].ndim > BG_ST_MAX_DIMS || shape_bytes(t[i].ndim, t[i].shape, &numel, &bytes) ||
            __builtin_add_overflow(off, bytes, &off)) {
            st = bg_error(BG_ERR_INVALID, "%s: tensor %s has a bad shape (%d dims)", path, name, t[i].ndim);
            goto out;
        }
        if (json_object_get(hdr, name)) {
            st = bg_error(BG_ERR_INVALID, "%s: tensor %s is given twice (overlapping model chunks?)", path, name);
            goto out;
        }
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++)
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
                              (json_int_t)(off - bytes), (json_int_t)off);
        if (!e || json_object_set_new(hdr, name, e) != 0) {
            st = bg_error(BG_ERR_INVALID, "%s: tensor %s: cannot be put in the header (name not UTF-8?)", path, name);
            goto out;
        }
    }
    BG_CHECK_GOTO(make_metadata(path, metadata_json, &meta), st, out);
    json_object_set_new(hdr, "__metadata__", meta);
    *text_p = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    if (!*text_p)
        st = bg_error(BG_ERR_NOMEM, "%s: header text", path);
    *data_bytes_p = off;
out:
    json_decref(hdr);
    return st;
}

/* Append a tensor's bytes to fd (through host when it lives on a backend). */
static bg_status_t write_tensor(int fd, const char *path, bg__st_wtensor_t *t, float *host, uint32_t *file_crc,
                                int want_crc)
{
    uint64_t numel = 0, bytes = 0;
    shape_bytes(t->ndim, t->shape, &numel, &bytes); /* checked by make_header */
    uint32_t crc = 0;
    for (uint64_t j = 0; j < numel; j += ST_CHUNK_FLOATS) {
        size_t k = numel - j < ST_CHUNK_FLOATS ? (size_t)(numel - j) : ST_CHUNK_FLOATS;
        const float *p = t->src + j;
        if (t->be) {
            t->be->ops->to_host(t->be, host, p, k * sizeof(float));
            p = host;
        }
        if (want_crc) {
            crc = bg__crc32c(crc, p, k * sizeof(float));
            *file_crc = bg__crc32c(*file_crc, p, k * sizeof(float));
        }
        BG_CHECK(bg__fileio_write_all(fd, p, k * sizeof(float), path));
    }
    t->crc32c = crc;
    return BG_OK;
}

bg_status_t bg__st_write(const char *path, bg__st_wtensor_t *t, int n, const char *metadata_json, uint64_t *bytes_p,
                        uint32_t *crc_p)
{
    bg_status_t st = BG_OK;
    char *text = NULL, *tmp = NULL;
    float *host = NULL;
    uint64_t data_bytes = 0;
    int fd = -1;
    BG_CHECK(make_header(path, t, n, metadata_json, &text, &data_bytes));
    size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7; /* the data section starts 8-aligned */
    size_t plen = strlen(path) + 32;
    tmp = malloc(plen);
    host = malloc(ST_CHUNK_FLOATS * sizeof(float));
    if (!tmp || !host) {
        st = bg_error(BG_ERR_NOMEM, "%s: write buffers", path);
        goto out;
    }
    snprintf(tmp, plen, "%s.tmp.%d", path, (int)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = bg_error(BG_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    uint32_t crc = 0;
    if (crc_p) {
        crc = bg__crc32c(crc, len8, 8);
        crc = bg__crc32c(crc, text, hlen);
        crc = bg__crc32c(crc, "        ", padded - hlen);
    }
    BG_CHECK_GOTO(bg__fileio_write_all(fd, len8, 8, tmp), st, err_unlink);
    BG_CHECK_GOTO(bg__fileio_write_all(fd, text, hlen, tmp), st, err_unlink);
    BG_CHECK_GOTO(bg__fileio_write_all(fd, "        ", padded - hlen, tmp), st, err_unlink);
    for (int i = 0; i < n; i++)
        BG_CHECK_GOTO(write_tensor(fd, tmp, &t[i], host, &crc, crc_p != NULL), st, err_unlink);
    if (fsync(fd) != 0) {
        st = bg_error(BG_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
        goto err_unlink;
    }
    int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        st = bg_error(BG_ERR_IO, "closing %s: %s", tmp, strerror(errno));
        goto err_unlink;
    }
    if (rename(tmp, path) != 0) {
        st = bg_error(BG_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
        goto err_unlink;
    }
    BG_CHECK_GOTO(bg__fileio_fsync_parent(path), st, out);
    if (bytes_p)
        *bytes_p = 8 + padded + data_bytes;
    if (crc_p)
        *crc_p = crc;
    goto out;
err_unlink:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
out:
    free(text);
    free(tmp);
    free(host);
    return st;
}

/* ---------------------------------------------------------------- reading */

struct bg__st_file {
    char *path;
    const unsigned char *buf; /* the whole file */
    size_t size;
    char *owned;          /* buf, when bg__st_open read it */
    json_t *hdr;          /* the names point into it */
    json_t *meta;         /* borrowed from hdr */
    bg__st_tensor_t *t;    /* (n) by name */
    int n;
};

static int cmp_offsets(const void *a, const void *b)
{
    const bg__st_tensor_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(((const bg__st_tensor_t *)a)->name, ((const bg__st_tensor_t *)b)->name);
}

/* Check one header entry and fill *t. data_size: bytes after the header. */
static bg_status_t parse_tensor(bg__st_file_t *f, const char *name, json_t *e, uint64_t data_start,
                                uint64_t data_size, bg__st_tensor_t *t)
{
    const char *path = f->path;
    size_t len = strlen(name);
    if (len >= BG_ST_NAME_MAX)
        return bg_error(BG_ERR_PARSE, "%s: tensor %.64s... has a name of %zu bytes, longer than the %d allowed", path,
                        name, len, BG_ST_NAME_MAX - 1);
    if (!json_is_object(e))
        return bg_error(BG_ERR_PARSE, "%s: tensor %s: its header entry is not a JSON object", path, name);
    const char *dtype = json_string_value(json_object_get(e, "dtype"));
    if (!dtype)
        return bg_error(BG_ERR_PARSE, "%s: tensor %s has no dtype string", path, name);
    if (strcmp(dtype, "F32") != 0)
        return bg_error(BG_ERR_PARSE, "%s: tensor %s has dtype %s; only F32 is supported", path, name, dtype);

    json_t *shape = json_object_get(e, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > BG_ST_MAX_DIMS)
        return bg_error(BG_ERR_PARSE, "%s: tensor %s: shape is not an array of at most %d dimensions", path, name,
                        BG_ST_MAX_DIMS);
    t->name = name;
    t->ndim = (int)json_array_size(shape);
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(shape, (size_t)d);
        if (!json_is_integer(x))
            return bg_error(BG_ERR_PARSE, "%s: tensor %s: shape dimension %d is not an integer", path, name, d);
        t->shape[d] = json_integer_value(x);
        if (t->shape[d] < 0)
            return bg_error(BG_ERR_PARSE, "%s: tensor %s has a negative shape dimension (%lld at index %d)", path,
                            name, (long long)t->shape[d], d);
    }
    char stext[160];
    shape_text(stext, sizeof stext, t->ndim, t->shape);
    uint64_t numel, bytes;
    if (shape_bytes(t->ndim, t->shape, &numel, &bytes))
        return bg_error(BG_ERR_PARSE, "%s: tensor %s has shape %s, whose size overflows 64 bits", path, name, stext);

    json_t *offs = json_object_get(e, "data_offsets");
    json_t *jb = json_array_get(offs, 0), *je = json_array_get(offs, 1);
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(jb) || !json_is_integer(je))
        return bg_error(BG_ERR_PARSE, "%s: tensor %s: data_offsets is not a pair of integers", path, name);
    json_int_t b = json_integer_value(jb), en = json_integer_value(je);
    if (b < 0 || en < 0)
        return bg_error(BG_ERR_PARSE, "%s: tensor %s has negative data_offsets [%lld, %lld]", path, name,
                        (long long)b, (long long)en);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)en;
    if (t->begin > t->end)
        return bg_error(BG_ERR_PARSE, "%s: tensor %s has data_offsets [%llu, %llu]: begin is after end", path, name,
                        (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_size)
        return bg_error(BG_ERR_PARSE,
                        "%s: tensor %s has data_offsets [%llu, %llu] beyond the file's %llu data bytes (truncated?)",
                        path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                        (unsigned long long)data_size);
    if (t->end - t->begin != bytes)
        return bg_error(BG_ERR_PARSE, "%s: tensor %s has data_offsets [%llu, %llu] holding %llu bytes, its shape %s "
                                      "needs %llu",
                        path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                        (unsigned long long)(t->end - t->begin), stext, (unsigned long long)bytes);
    t->numel = (size_t)numel; /* numel * 4 <= data_size < SIZE_MAX */
    t->data = f->buf + data_start + t->begin;
    return BG_OK;
}

/* No two tensors with data share a byte (sorts f->t by offsets). */
static bg_status_t check_overlaps(bg__st_file_t *f)
{
    qsort(f->t, (size_t)f->n, sizeof(*f->t), cmp_offsets);
    const bg__st_tensor_t *last = NULL; /* the non-empty tensor that ends last so far */
    for (int i = 0; i < f->n; i++) {
        const bg__st_tensor_t *t = &f->t[i];
        if (t->end == t->begin)
            continue;
        if (last && t->begin < last->end)
            return bg_error(BG_ERR_PARSE, "%s: tensors %s [%llu, %llu] and %s [%llu, %llu] overlap", f->path,
                            last->name, (unsigned long long)last->begin, (unsigned long long)last->end, t->name,
                            (unsigned long long)t->begin, (unsigned long long)t->end);
        if (!last || t->end > last->end)
            last = t;
    }
    return BG_OK;
}

static bg_status_t parse_file(bg__st_file_t *f)
{
    const char *path = f->path;
    if (f->size < 8)
        return bg_error(BG_ERR_PARSE, "%s: truncated: %zu bytes, less than the 8-byte header length", path, f->size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)f->buf[i] << (8 * i);
    if (hlen > (uint64_t)(f->size - 8))
        return bg_error(BG_ERR_PARSE, "%s: header length %llu exceeds the %zu bytes that follow it (truncated?)", path,
                        (unsigned long long)hlen, f->size - 8);
    json_error_t err;
    f->hdr = json_loadb((const char *)f->buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!f->hdr)
        return bg_error(BG_ERR_PARSE, "%s: header is not valid JSON (line %d column %d: %s)", path, err.line,
                        err.column, err.text);
    if (!json_is_object(f->hdr))
        return bg_error(BG_ERR_PARSE, "%s: header is not a JSON object", path);
    uint64_t data_start = 8 + hlen, data_size = f->size - data_start;
    f->t = calloc(json_object_size(f->hdr) + 1, sizeof(*f->t));
    if (!f->t)
        return bg_error(BG_ERR_NOMEM, "%s: tensor list", path);
    const char *key;
    json_t *e;
    json_object_foreach(f->hdr, key, e)
    {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(e))
                return bg_error(BG_ERR_PARSE, "%s: __metadata__ is not a JSON object", path);
            f->meta = e;
            continue;
        }
        BG_CHECK(parse_tensor(f, key, e, data_start, data_size, &f->t[f->n]));
        f->n++;
    }
    BG_CHECK(check_overlaps(f));
    qsort(f->t, (size_t)f->n, sizeof(*f->t), cmp_names);
    return BG_OK;
}

bg_status_t bg__st_parse(const char *path, const void *buf, size_t size, bg__st_file_t **f_p)
{
    bg__st_file_t *f = calloc(1, sizeof(*f));
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return bg_error(BG_ERR_NOMEM, "%s: reader", path);
    }
    f->buf = buf;
    f->size = size;
    bg_status_t st = parse_file(f);
    if (st != BG_OK) {
        bg__st_close(f);
        return st;
    }
    *f_p = f;
    return BG_OK;
}

bg_status_t bg__st_open(const char *path, bg__st_file_t **f_p)
{
    char *buf;
    size_t size;
    BG_CHECK(bg__fileio_read(path, &buf, &size));
    bg_status_t st = bg__st_parse(path, buf, size, f_p);
    if (st != BG_OK) {
        free(buf);
        return st;
    }
    (*f_p)->owned = buf;
    return BG_OK;
}

void bg__st_close(bg__st_file_t *f)
{
    if (!f)
        return;
    json_decref(f->hdr);
    free(f->t);
    free(f->owned);
    free(f->path);
    free(f);
}

void bg__st_close_all(bg__st_file_t **files, int n)
{
    for (int i = 0; i < n; i++)
        bg__st_close(files[i]);
    free(files);
}

bg_status_t bg__st_open_dir(const char *dir, bg__st_file_t ***files_p, int *n_p)
{
    char **names;
    int n, opened = 0;
    BG_CHECK(bg__fileio_list_dir(dir, "", ST_SUFFIX, &names, &n));
    bg_status_t st = BG_OK;
    bg__st_file_t **files = NULL;
    if (n == 0) {
        st = bg_error(BG_ERR_NOT_FOUND, "no .safetensors files in %s", dir);
        goto out;
    }
    files = calloc((size_t)n, sizeof(*files));
    if (!files) {
        st = bg_error(BG_ERR_NOMEM, "file list of %s", dir);
        goto out;
    }
    for (; opened < n; opened++) {
        size_t plen = strlen(dir) + strlen(names[opened]) + 2;
        char *path = malloc(plen);
        if (!path) {
            st = bg_error(BG_ERR_NOMEM, "file list of %s", dir);
            break;
        }
        snprintf(path, plen, "%s/%s", dir, names[opened]);
        st = bg__st_open(path, &files[opened]);
        free(path);
        if (st != BG_OK)
            break;
    }
    if (st != BG_OK) {
        bg__st_close_all(files, opened);
        goto out;
    }
    *files_p = files;
    *n_p = n;
out:
    bg__fileio_free_names(names, n);
    return st;
}

const char *bg__st_path(const bg__st_file_t *f) { return f->path; }
int bg__st_count(const bg__st_file_t *f) { return f->n; }
const bg__st_tensor_t *bg__st_tensor(const bg__st_file_t *f, int i) { return &f->t[i]; }
json_t *bg__st_metadata(const bg__st_file_t *f) { return f->meta; }

static int cmp_key(const void *key, const void *t) { return strcmp(key, ((const bg__st_tensor_t *)t)->name); }

const bg__st_tensor_t *bg__st_find(const bg__st_file_t *f, const char *name)
{
    return f->n ? bsearch(name, f->t, (size_t)f->n, sizeof(*f->t), cmp_key) : NULL;
}

bg_status_t bg__st_check_shape(const bg__st_file_t *f, const bg__st_tensor_t *t, int ndim, const int64_t *shape)
{
    if (t->ndim == ndim && memcmp(t->shape, shape, (size_t)ndim * sizeof(*shape)) == 0)
        return BG_OK;
    char have[160], want[160];
    shape_text(have, sizeof have, t->ndim, t->shape);
    shape_text(want, sizeof want, ndim, shape);
    return bg_error(BG_ERR_MISMATCH, "%s: tensor %s has shape %s, the model expects %s", f->path, t->name, have, want);
}

void bg__st_copy(const bg__st_tensor_t *t, bg_backend_t *be, float *dst)
{
    if (be)
        be->ops->from_host(be, dst, t->data, t->numel * sizeof(float));
    else
        memcpy(dst, t->data, t->numel * sizeof(float));
}

bg_status_t bg__st_check_param(const bg__st_file_t *f, const bg__st_tensor_t *t, const bg_param_t *p)
{
    int64_t full[BG_PARAM_MAX_DIMS];
    bg_param_full_shape(p, full);
    return bg__st_check_shape(f, t, p->ndim, full);
}

bg_status_t bg__st_copy_param(const bg__st_tensor_t *t, const bg_param_t *p, int part, bg_backend_t *be, float *dst)
{
    if (!bg_param_is_shard(p)) {
        bg__st_copy(t, be, dst);
        return BG_OK;
    }
    float *host = malloc(p->numel * sizeof(float));
    BG_ALLOC_CHECK(host, p->numel * sizeof(float), "tensor shard");
    bg_param_shard_from_full(p, part, t->data, host);
    if (be)
        be->ops->from_host(be, dst, host, p->numel * sizeof(float));
    else
        memcpy(dst, host, p->numel * sizeof(float));
    free(host);
    return BG_OK;
}

int bg__st_part(bg_model_t *m, const bg_param_t *p)
{
    const bg_tp_comm_t *g = bg_model_desc_group_of(bg_model_desc(m), p);
    return g ? g->rank : 0;
}

/* ---------------------------------------------------------------- a model range */

bg_status_t bg_model_save_safetensors(bg_model_t *m, const char *path, const char *metadata_json)
{
    int n = bg_model_num_tensors(m);
    bg__st_wtensor_t *t = calloc(n ? (size_t)n : 1, sizeof(*t));
    if (!t)
        return bg_error(BG_ERR_NOMEM, "%s: tensor list", path);
    /* shards of a tensor-parallel model, or an expert-parallel one's experts: gathered whole (a collective of
     * the group), written by its member 0 */
    const bg_tp_comm_t *tp = bg_model_desc_tp(bg_model_desc(m)), *ep = bg_model_desc_ep(bg_model_desc(m));
    float **full = calloc(n ? (size_t)n : 1, sizeof(*full));
    int64_t(*shapes)[BG_PARAM_MAX_DIMS] = calloc(n ? (size_t)n : 1, sizeof(*shapes));
    bg_status_t st = full && shapes ? BG_OK : bg_error(BG_ERR_NOMEM, "%s: tensor list", path);
    for (int i = 0; i < n && st == BG_OK; i++) {
        const bg_param_t *p = bg_model_tensor(m, i);
        t[i] = (bg__st_wtensor_t){.name = bg_model_tensor_name(m, i), .ndim = p->ndim, .shape = p->shape,
                                 .src = p->data, .be = bg_model_backend(m)};
        if (!bg_param_is_shard(p))
            continue;
        size_t numel = bg_param_full_shape(p, shapes[i]);
        full[i] = malloc(numel * sizeof(float));
        st = full[i] ? bg_param_gather_full(bg_model_desc_group_of(bg_model_desc(m), p), bg_model_backend(m), p,
                                            p->data, full[i])
                     : bg_error(BG_ERR_NOMEM, "%s: gathering %s", path, t[i].name);
        t[i].shape = shapes[i];
        t[i].src = full[i];
        t[i].be = NULL;
    }
    if (st == BG_OK && (!tp || tp->rank == 0) && (!ep || ep->rank == 0) && path && *path)
        st = bg__st_write(path, t, n, metadata_json, NULL, NULL);
    for (int i = 0; full && i < n; i++)
        free(full[i]);
    free(full);
    free(shapes);
    free(t);
    return st;
}

bg_status_t bg_model_load_safetensors(bg_model_t *m, const char *path)
{
    bg__st_file_t *f;
    BG_CHECK(bg__st_open(path, &f));
    bg_status_t st = BG_OK;
    int n = bg_model_num_tensors(m);
    const bg__st_tensor_t **src = calloc(n ? (size_t)n : 1, sizeof(*src));
    if (!src) {
        st = bg_error(BG_ERR_NOMEM, "%s: tensor list", path);
        goto out;
    }
    for (int i = 0; i < n; i++) { /* everything checked before the model changes */
        const bg_param_t *p = bg_model_tensor(m, i);
        const char *name = bg_model_tensor_name(m, i);
        if (!(src[i] = bg__st_find(f, name))) {
            st = bg_error(BG_ERR_NOT_FOUND, "%s: tensor %s is missing", path, name);
            goto out;
        }
        BG_CHECK_GOTO(bg__st_check_param(f, src[i], p), st, out);
    }
    for (int i = 0; i < n && st == BG_OK; i++)
        st = bg__st_copy_param(src[i], bg_model_tensor(m, i), bg__st_part(m, bg_model_tensor(m, i)), bg_model_backend(m), bg_model_tensor(m, i)->data);
out:
    free(src);
    bg__st_close(f);
    return st;
}

/* ---------------------------------------------------------------- comparing */

/* The first tensor called name among a directory's files. */
static const bg__st_tensor_t *dir_find(bg__st_file_t **files, int n, const char *name)
{
    for (int i = 0; i < n; i++) {
        const bg__st_tensor_t *t = bg__st_find(files[i], name);
        if (t)
            return t;
    }
    return NULL;
}

/* element j of a tensor (its bytes may be unaligned) */
static double value_at(const bg__st_tensor_t *t, size_t j)
{
    float v;
    memcpy(&v, (const char *)t->data + j * sizeof(float), sizeof v);
    return v;
}

bg_status_t bg_safetensors_compare_dirs(const char *dir_a, const char *dir_b, bg_compare_result_t *result_p)
{
    bg__st_file_t **a = NULL, **b = NULL;
    int na = 0, nb = 0;
    bg_compare_result_t r = {0};
    bg_status_t st = bg__st_open_dir(dir_a, &a, &na);
    if (st == BG_OK)
        st = bg__st_open_dir(dir_b, &b, &nb);
    if (st != BG_OK)
        goto out;
    double ss_diff = 0, ss_a = 0;
    for (int fi = 0; fi < na; fi++) {
        for (int ti = 0; ti < bg__st_count(a[fi]); ti++) {
            const bg__st_tensor_t *x = bg__st_tensor(a[fi], ti);
            if (dir_find(a, na, x->name) != x)
                continue; /* a name repeated in a later file: the first counts */
            const bg__st_tensor_t *y = dir_find(b, nb, x->name);
            if (!y) {
                r.only_a++;
                continue;
            }
            if (x->ndim != y->ndim || memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof(int64_t)) != 0) {
                r.shape_mismatch++;
                continue;
            }
            r.tensors++;
            double maxabs = 0, maxv = 0;
            for (size_t j = 0; j < x->numel; j++) {
                double xv = value_at(x, j), dd = xv - value_at(y, j);
                ss_diff += dd * dd;
                ss_a += xv * xv;
                if (fabs(dd) > maxabs)
                    maxabs = fabs(dd);
                if (fabs(xv) > maxv)
                    maxv = fabs(xv);
            }
            if (memcmp(x->data, y->data, x->numel * sizeof(float)) == 0) {
                r.identical++;
                continue;
            }
            double rel = maxv > 0 ? maxabs / maxv : maxabs;
            if (maxabs > r.max_abs)
                r.max_abs = maxabs;
            if (rel >= r.max_rel) {
                r.max_rel = rel;
                snprintf(r.worst, sizeof(r.worst), "%s", x->name);
            }
        }
    }
    for (int fi = 0; fi < nb; fi++)
        for (int ti = 0; ti < bg__st_count(b[fi]); ti++) {
            const bg__st_tensor_t *y = bg__st_tensor(b[fi], ti);
            if (dir_find(b, nb, y->name) == y && !dir_find(a, na, y->name))
                r.only_b++;
        }
    r.rel_l2 = ss_a > 0 ? sqrt(ss_diff / ss_a) : sqrt(ss_diff);
    *result_p = r;
out:
    bg__st_close_all(a, na);
    bg__st_close_all(b, nb);
    return st;
}
