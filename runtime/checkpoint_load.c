/* runtime/checkpoint_load.c: reading a checkpoint back (see
 * include/brigade/checkpoint.h for the layout and protocol).
 *
 * Owns: verified by-name loading into any layer split (resharding: each
 * tensor found by name in whichever rank file holds it, checked against its
 * shape and the manifest's CRC32C per file), the damaged/incompatible verdict
 * of a failed load, bg_checkpoint_verify, and loading a directory of plain
 * safetensors files.
 * Must not: write anything; it never modifies a model unless every byte it is
 * about to copy has been verified. The manifest's parsing is checkpoint.c's. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/checkpoint.h"
#include "core/check.h"
#include "core/fileio.h"
#include "models/safetensors.h"
#include "runtime/checkpoint_impl.h"

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
        /* optimizer state a store holds (--offload optimizer) is host memory: written in place */
        bg_backend_t *be = nd[i].which >= 0 && bg_model_optim_on_host(m) ? NULL : bg_model_backend(m);
        BG_CHECK(bg__st_copy_param(nd[i].src, nd[i].p, bg__st_part(m, nd[i].p), be, dst));
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
    bg__ckpt_pjoin(path, sizeof path, dir, "/", json_string_value(json_object_get(fe, "name")));
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
            int mo = bg__ckpt_model_optim(models[k]);
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
    bg_status_t st = bg__ckpt_manifest_read(path, &m);
    if (st != BG_OK) {
        *damaged_p = st != BG_ERR_UNSUPPORTED; /* another format version is no damage */
        return st;
    }
    /* a step-N directory holds step N (a manifest copied or renamed is not it) */
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int64_t named = bg__ckpt_parse_step_name(base);
    if (named >= 0 && json_integer_value(json_object_get(m, "step")) != named) {
        st = bg_error(BG_ERR_MISMATCH, "%s: its manifest says step %lld, its name step %lld", path,
                      (long long)json_integer_value(json_object_get(m, "step")), (long long)named);
        json_decref(m);
        return st;
    }
    bg_checkpoint_info_t info;
    st = bg__ckpt_info_from_manifest(m, path, &info);
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
    BG_CHECK(bg__ckpt_manifest_read(path, &m));
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
