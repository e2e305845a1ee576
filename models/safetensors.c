/* models/safetensors.c: the model's tensors as a safetensors file
 * (8-byte little-endian header length, JSON header, raw F32 data), written
 * atomically: a temporary file in the same directory, fsync, rename, fsync of
 * the directory. A reader checks names, dtypes, shapes and offsets. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brigade/model.h"
#include "core/check.h"

static bg_status_t write_all(int fd, const void *buf, size_t n, const char *path)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return bg_error(BG_ERR_IO, "writing %s: %s", path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return BG_OK;
}

static bg_status_t fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return BG_ERR_NOMEM;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    free(copy);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return BG_OK;
}

bg_status_t bg_model_save_safetensors(bg_model_t *m, const char *path, const char *metadata_json)
{
    bg_backend_t *be = bg_model_backend(m);
    bg_status_t st = BG_OK;
    json_t *hdr = json_object();
    size_t off = 0;
    int n = bg_model_num_tensors(m);
    for (int i = 0; i < n; i++) {
        bg_param_t *p = bg_model_tensor(m, i);
        json_t *shape = json_array();
        for (int d = 0; d < p->ndim; d++)
            json_array_append_new(shape, json_integer(p->shape[d]));
        size_t bytes = p->numel * sizeof(float);
        json_object_set_new(hdr, bg_model_tensor_name(m, i),
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
    }
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(meta, "producer", json_string("brigade " BRIGADE_VERSION_STRING));
    if (metadata_json) {
        json_error_t err;
        json_t *extra = json_loads(metadata_json, 0, &err);
        if (!json_is_object(extra)) {
            json_decref(extra);
            json_decref(meta);
            json_decref(hdr);
            return bg_error(BG_ERR_INVALID, "safetensors metadata is not a JSON object: %s", err.text);
        }
        const char *k;
        json_t *v;
        json_object_foreach(extra, k, v)
        {
            /* safetensors metadata values are strings */
            if (json_is_string(v))
                json_object_set(meta, k, v);
            else {
                char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
                json_object_set_new(meta, k, json_string(s ? s : ""));
                free(s);
            }
        }
        json_decref(extra);
    }
    json_object_set_new(hdr, "__metadata__", meta);
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(hdr);
    if (!text)
        return bg_error(BG_ERR_NOMEM, "safetensors header");
    size_t hlen = strlen(text);
    size_t padded = (hlen + 7) & ~(size_t)7;

    size_t plen = strlen(path) + 32;
    char *tmp = malloc(plen);
    float *host = malloc(65536 * sizeof(float));
    if (!tmp || !host) {
        free(text);
        free(tmp);
        free(host);
        return bg_error(BG_ERR_NOMEM, "safetensors buffers");
    }
    snprintf(tmp, plen, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        st = bg_error(BG_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)(padded >> (8 * i));
    BG_CHECK_GOTO(write_all(fd, len8, 8, tmp), st, err_unlink);
    BG_CHECK_GOTO(write_all(fd, text, hlen, tmp), st, err_unlink);
    BG_CHECK_GOTO(write_all(fd, "        ", padded - hlen, tmp), st, err_unlink);
    for (int i = 0; i < n; i++) {
        bg_param_t *p = bg_model_tensor(m, i);
        for (size_t j = 0; j < p->numel; j += 65536) {
            size_t k = p->numel - j < 65536 ? p->numel - j : 65536;
            be->ops->to_host(be, host, p->data + j, k * sizeof(float));
            BG_CHECK_GOTO(write_all(fd, host, k * sizeof(float), tmp), st, err_unlink);
        }
    }
    if (fsync(fd) != 0) {
        st = bg_error(BG_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
        goto err_unlink;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) != 0) {
        st = bg_error(BG_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
        goto err_unlink;
    }
    fsync_dir_of(path);
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

/* Read a safetensors file's header: *hdr_p the parsed JSON object, *hlen_p
 * its length, *fsize_p the file's size. Errors name the file. */
static bg_status_t read_header(FILE *f, const char *path, json_t **hdr_p, uint64_t *hlen_p, long *fsize_p)
{
    uint8_t len8[8];
    if (fread(len8, 1, 8, f) != 8)
        return bg_error(BG_ERR_PARSE, "%s: truncated (no header length)", path);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)len8[i] << (8 * i);
    fseek(f, 0, SEEK_END);
    long fsize = ftell(f);
    if (hlen > (uint64_t)fsize - 8 || hlen > (100u << 20))
        return bg_error(BG_ERR_PARSE, "%s: header length %llu exceeds the file (%ld bytes)", path,
                        (unsigned long long)hlen, fsize);
    fseek(f, 8, SEEK_SET);
    char *text = malloc(hlen + 1);
    if (!text || fread(text, 1, hlen, f) != hlen) {
        free(text);
        return bg_error(BG_ERR_PARSE, "%s: truncated header", path);
    }
    text[hlen] = 0;
    json_error_t err;
    json_t *hdr = json_loads(text, 0, &err);
    free(text);
    if (!json_is_object(hdr)) {
        json_decref(hdr);
        return bg_error(BG_ERR_PARSE, "%s: header is not JSON (line %d column %d: %s)", path, err.line, err.column,
                        err.text);
    }
    *hdr_p = hdr;
    *hlen_p = hlen;
    *fsize_p = fsize;
    return BG_OK;
}

bg_status_t bg_model_load_safetensors(bg_model_t *m, const char *path)
{
    bg_backend_t *be = bg_model_backend(m);
    bg_status_t st = BG_OK;
    FILE *f = fopen(path, "rb");
    if (!f)
        return bg_error(BG_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    json_t *hdr = NULL;
    float *host = NULL;
    uint64_t hlen;
    long fsize;
    BG_CHECK_GOTO(read_header(f, path, &hdr, &hlen, &fsize), st, out);
    size_t data_start = 8 + hlen, data_len = (size_t)fsize - data_start;
    host = malloc(65536 * sizeof(float));
    if (!host) {
        st = BG_ERR_NOMEM;
        goto out;
    }
    for (int i = 0; i < bg_model_num_tensors(m); i++) {
        const char *name = bg_model_tensor_name(m, i);
        bg_param_t *p = bg_model_tensor(m, i);
        json_t *e = json_object_get(hdr, name);
        if (!e) {
            st = bg_error(BG_ERR_NOT_FOUND, "%s: tensor %s is missing", path, name);
            goto out;
        }
        json_t *shape = json_object_get(e, "shape"), *offs = json_object_get(e, "data_offsets");
        const char *dtype = json_string_value(json_object_get(e, "dtype"));
        if (!dtype || strcmp(dtype, "F32") != 0) {
            st = bg_error(BG_ERR_MISMATCH, "%s: tensor %s has dtype %s, expected F32", path, name, dtype ? dtype : "?");
            goto out;
        }
        int ok = json_is_array(shape) && json_array_size(shape) == (size_t)p->ndim;
        for (int d = 0; ok && d < p->ndim; d++)
            ok = json_integer_value(json_array_get(shape, (size_t)d)) == p->shape[d];
        if (!ok) {
            char *s = json_dumps(shape, JSON_COMPACT);
            st = bg_error(BG_ERR_MISMATCH, "%s: tensor %s has shape %s, the model expects %d dims starting %lld",
                          path, name, s ? s : "?", p->ndim, (long long)p->shape[0]);
            free(s);
            goto out;
        }
        json_int_t a = json_integer_value(json_array_get(offs, 0)), b = json_integer_value(json_array_get(offs, 1));
        if (!json_is_array(offs) || a < 0 || b - a != (json_int_t)(p->numel * sizeof(float)) ||
            (size_t)b > data_len) {
            st = bg_error(BG_ERR_PARSE, "%s: tensor %s has bad data_offsets (file truncated?)", path, name);
            goto out;
        }
        fseek(f, (long)(data_start + (size_t)a), SEEK_SET);
        for (size_t j = 0; j < p->numel; j += 65536) {
            size_t k = p->numel - j < 65536 ? p->numel - j : 65536;
            if (fread(host, sizeof(float), k, f) != k) {
                st = bg_error(BG_ERR_PARSE, "%s: tensor %s is truncated", path, name);
                goto out;
            }
            be->ops->from_host(be, p->data + j, host, k * sizeof(float));
        }
    }
out:
    json_decref(hdr);
    free(host);
    fclose(f);
    return st;
}

/* ---------------------------------------------------------------- comparing */

#include <dirent.h>

typedef struct host_tensor {
    char *name;
    int ndim;
    int64_t shape[8];
    float *data;
    size_t numel;
} host_tensor_t;

typedef struct host_set {
    host_tensor_t *t;
    size_t n, cap;
} host_set_t;

static void host_set_free(host_set_t *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->t[i].name);
        free(s->t[i].data);
    }
    free(s->t);
}

static bg_status_t read_file_tensors(const char *path, host_set_t *set)
{
    bg_status_t st = BG_OK;
    FILE *f = fopen(path, "rb");
    if (!f)
        return bg_error(BG_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    uint64_t hlen = 0;
    long fsize = 0;
    json_t *hdr = NULL;
    BG_CHECK_GOTO(read_header(f, path, &hdr, &hlen, &fsize), st, out);
    const char *key;
    json_t *e;
    json_object_foreach(hdr, key, e)
    {
        if (!strcmp(key, "__metadata__"))
            continue;
        const char *dtype = json_string_value(json_object_get(e, "dtype"));
        json_t *shape = json_object_get(e, "shape"), *offs = json_object_get(e, "data_offsets");
        if (!dtype || strcmp(dtype, "F32") || !json_is_array(shape) || json_array_size(shape) > 8 ||
            !json_is_array(offs)) {
            st = bg_error(BG_ERR_PARSE, "%s: tensor %s is not an F32 tensor with shape and offsets", path, key);
            goto out;
        }
        if (set->n == set->cap) {
            size_t cap = set->cap ? 2 * set->cap : 64;
            host_tensor_t *t = realloc(set->t, cap * sizeof(*t));
            if (!t) {
                st = BG_ERR_NOMEM;
                goto out;
            }
            set->t = t;
            set->cap = cap;
        }
        host_tensor_t *t = &set->t[set->n];
        memset(t, 0, sizeof(*t));
        t->ndim = (int)json_array_size(shape);
        t->numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            t->shape[d] = json_integer_value(json_array_get(shape, (size_t)d));
            t->numel *= (size_t)t->shape[d];
        }
        json_int_t a = json_integer_value(json_array_get(offs, 0)), b = json_integer_value(json_array_get(offs, 1));
        if (b - a != (json_int_t)(t->numel * 4) || (uint64_t)b > (uint64_t)fsize - 8 - hlen) {
            st = bg_error(BG_ERR_PARSE, "%s: tensor %s: bad data_offsets (truncated?)", path, key);
            goto out;
        }
        t->name = strdup(key);
        t->data = malloc(t->numel * sizeof(float) + 1);
        if (!t->name || !t->data) {
            free(t->name);
            free(t->data);
            st = BG_ERR_NOMEM;
            goto out;
        }
        set->n++;
        fseek(f, (long)(8 + hlen + (uint64_t)a), SEEK_SET);
        if (fread(t->data, sizeof(float), t->numel, f) != t->numel) {
            st = bg_error(BG_ERR_PARSE, "%s: tensor %s is truncated", path, key);
            goto out;
        }
    }
out:
    json_decref(hdr);
    fclose(f);
    return st;
}

static bg_status_t read_dir_tensors(const char *dir, host_set_t *set)
{
    DIR *d = opendir(dir);
    if (!d)
        return bg_error(BG_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    struct dirent *de;
    int files = 0;
    bg_status_t st = BG_OK;
    while (st == BG_OK && (de = readdir(d))) {
        size_t L = strlen(de->d_name);
        if (L < 12 || strcmp(de->d_name + L - 12, ".safetensors") != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        st = read_file_tensors(path, set);
        files++;
    }
    closedir(d);
    if (st == BG_OK && files == 0)
        st = bg_error(BG_ERR_NOT_FOUND, "no .safetensors files in %s", dir);
    return st;
}

static host_tensor_t *find_host(host_set_t *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->t[i].name, name))
            return &s->t[i];
    return NULL;
}

bg_status_t bg_safetensors_compare_dirs(const char *dir_a, const char *dir_b, bg_compare_result_t *result_p)
{
    host_set_t a = {0}, b = {0};
    bg_compare_result_t r = {0};
    bg_status_t st = read_dir_tensors(dir_a, &a);
    if (st == BG_OK)
        st = read_dir_tensors(dir_b, &b);
    if (st != BG_OK)
        goto out;
    double ss_diff = 0, ss_a = 0;
    for (size_t i = 0; i < a.n; i++) {
        host_tensor_t *x = &a.t[i], *y = find_host(&b, x->name);
        if (!y) {
            r.only_a++;
            continue;
        }
        if (x->ndim != y->ndim || x->numel != y->numel ||
            memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof(int64_t)) != 0) {
            r.shape_mismatch++;
            continue;
        }
        r.tensors++;
        for (size_t j = 0; j < x->numel; j++) {
            double dd = (double)x->data[j] - (double)y->data[j];
            ss_diff += dd * dd;
            ss_a += (double)x->data[j] * (double)x->data[j];
        }
        if (memcmp(x->data, y->data, x->numel * sizeof(float)) == 0) {
            r.identical++;
            continue;
        }
        double maxabs = 0, maxv = 0;
        for (size_t j = 0; j < x->numel; j++) {
            double dd = fabs((double)x->data[j] - (double)y->data[j]);
            if (dd > maxabs)
                maxabs = dd;
            if (fabs(x->data[j]) > maxv)
                maxv = fabs(x->data[j]);
        }
        double rel = maxv > 0 ? maxabs / maxv : maxabs;
        if (maxabs > r.max_abs)
            r.max_abs = maxabs;
        if (rel >= r.max_rel) {
            r.max_rel = rel;
            snprintf(r.worst, sizeof(r.worst), "%s", x->name);
        }
    }
    for (size_t i = 0; i < b.n; i++)
        if (!find_host(&a, b.t[i].name))
            r.only_b++;
    r.rel_l2 = ss_a > 0 ? sqrt(ss_diff / ss_a) : sqrt(ss_diff);
    *result_p = r;
out:
    host_set_free(&a);
    host_set_free(&b);
    return st;
}
