/* runtime/checkpoint_save.c: writing a checkpoint (see
 * include/brigade/checkpoint.h for the layout and protocol).
 *
 * Owns: what the rank files hold (weights and optim.m./optim.v. tensors,
 * written through models/safetensors.h, the one safetensors writer; the
 * members of a tensor-parallel group gather their shards first) and their
 * sidecars, the manifest assembled from them, the atomic publish (tmp dir,
 * fsync, barrier, rename, fsync of the root), the save's store keys and
 * token, and keep-K pruning.
 * Must not: run training or decide when to save; read a checkpoint back into
 * a model (checkpoint_load.c). The manifest's text and checks are
 * checkpoint.c's. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
#include "core/fileio.h"
#include "models/safetensors.h"
#include "runtime/checkpoint_impl.h"

/* ---------------------------------------------------------------- files */

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


/* ---------------------------------------------------------------- writing a rank file */

static void rank_file_name(char *buf, size_t cap, int rank, const char *ext)
{
    snprintf(buf, cap, "rank-%05d.%s", rank, ext);
}

/* Optimizer state every model has (the least of them). */
static int models_optim(bg_model_t *const *models, int nmodels)
{
    int optim = 2;
    for (int k = 0; k < nmodels; k++) {
        int have = bg__ckpt_model_optim(models[k]);
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

/* Whose copies read tensor kind s (0 the weights, 1/2 the optimizer state) of m: its backend's, or none
 * (NULL: host memory, read in place) for optimizer state a store holds (--offload optimizer), unless
 * BRIGADE_FAULT_CKPT_VIA_BACKEND=on (tests: the device checker must catch the backend's copy of it). */
static bg_backend_t *state_backend(bg_model_t *m, int s)
{
    const char *fault = bg_config_str("BRIGADE_FAULT_CKPT_VIA_BACKEND");
    int via_backend = fault && !strcmp(fault, "on");
    return s > 0 && bg_model_optim_on_host(m) && !via_backend ? NULL : bg_model_backend(m);
}

/* Shard p's tensor kind s (src) gathered whole into full: a collective of p's group g, whose collectives work
 * on the buffers of m's backend, so on a device backend a shard it does not hold (host-held optimizer state)
 * goes into a buffer of it first. */
static bg_status_t gather_one(bg_model_t *m, const bg_tp_comm_t *g, const bg_param_t *p, int s, const float *src,
                              float *full)
{
    bg_backend_t *be = state_backend(m, s), *mb = bg_model_backend(m);
    if (be || !mb || !mb->ops->device_buffers)
        return bg_param_gather_full(g, be, p, src, full);
    size_t bytes = p->numel * sizeof(float);
    float *dev = bg_backend_alloc(mb, bytes, "checkpoint shard");
    if (!dev) /* the other members time out in the gather, naming this rank */
        return bg_error(BG_ERR_NOMEM, "checkpoint: %zu bytes on the backend for a shard of %s", bytes, p->name);
    mb->ops->from_host(mb, dev, src, bytes);
    bg_status_t st = bg_param_gather_full(g, mb, p, dev, full);
    bg_backend_free(mb, dev);
    return st;
}

static bg_status_t gather_shards(bg_model_t *const *models, int nmodels, gathered_t *g)
{
    const bg_model_desc_t *d = bg_model_desc(models[0]);
    memset(g, 0, sizeof *g);
    if (!bg_model_desc_tp(d) && !bg_model_desc_ep(d))
        return BG_OK;
    int optim = models_optim(models, nmodels), n = 0;
    for (int k = 0; k < nmodels; k++)
        n += (1 + optim) * bg_model_num_tensors(models[k]);
    g->n = n;
    g->full = calloc(n ? (size_t)n : 1, sizeof(*g->full));
    g->shape = calloc(n ? (size_t)n : 1, sizeof(*g->shape));
    if (!g->full || !g->shape) {
        gathered_free(g);
        return bg_error(BG_ERR_NOMEM, "checkpoint: gathering tensor- or expert-parallel shards");
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
                    st = gather_one(m, bg_model_desc_group_of(d, p), p, s, src, g->full[i]);
            }
        }
    }
    if (st != BG_OK)
        gathered_free(g);
    return st;
}

/* Writes DIR/rank-R.safetensors and its sidecar DIR/rank-R.json. */
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
                                          .be = state_backend(m, s)};
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
    bg__ckpt_pjoin(path, sizeof path, dir, "/", fname);
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
    bg__ckpt_pjoin(sp, sizeof sp, dir, "/", side);
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
        bg__ckpt_pjoin(path, sizeof path, tmpdir, "/", names[i]);
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
    char *text = bg__ckpt_manifest_text(man);
    if (!text) {
        st = bg_error(BG_ERR_NOMEM, "checkpoint manifest");
        goto out;
    }
    char mpath[CKPT_PATH_MAX];
    bg__ckpt_pjoin(mpath, sizeof mpath, tmpdir, "/", "manifest.json");
    st = write_file(mpath, text, strlen(text));
    free(text);
    if (st != BG_OK)
        goto out;
    for (int i = 0; i < nn; i++) { /* the sidecars are in the manifest now */
        char path[CKPT_PATH_MAX];
        bg__ckpt_pjoin(path, sizeof path, tmpdir, "/", names[i]);
        unlink(path);
    }
    BG_CHECK_GOTO(bg__ckpt_check_sizes(man, tmpdir), st, out);
    BG_CHECK_GOTO(bg__fileio_fsync_path(tmpdir, 1), st, out);

    /* a directory with the final name already (an earlier run reached this
     * step): replaced, and removed under a .tmp name */
    char aside[CKPT_PATH_MAX];
    char sfx[160];
    snprintf(sfx, sizeof sfx, ".tmp-replaced-%s", token);
    bg__ckpt_pjoin(aside, sizeof aside, final, "", sfx);
    st = bg__fileio_replace_dir(tmpdir, final, aside);
out:
    bg__fileio_free_names(names, nn);
    json_decref(files);
    json_decref(man);
    return st;
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
                bg__fileio_rm_rf(dir);
            }
        }
        closedir(d);
    }
    if (keep <= 0)
        return;
    bg__ckpt_dir_t *list;
    size_t n;
    if (bg__ckpt_list_complete(root, 0, &list, &n) != BG_OK)
        return;
    for (size_t i = (size_t)keep; i < n; i++) {
        char dir[CKPT_PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", root, list[i].name);
        bg_log(BG_LOG_INFO, "checkpoint", "removing old checkpoint %s (keep %d)", dir, keep);
        /* first out of sight (a .tmp name, atomically): a crash while deleting
         * leaves a directory the next save removes, never a half checkpoint */
        char gone[CKPT_PATH_MAX + 64], sfx[64];
        snprintf(sfx, sizeof sfx, ".tmp-deleting-%d", (int)getpid());
        bg__ckpt_pjoin(gone, sizeof gone, dir, "", sfx);
        bg__fileio_rm_rf(rename(dir, gone) == 0 ? gone : dir);
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
            bg__fileio_rm_rf(tmpdir); /* a leftover of this process's failed save of the same step */
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
            bg__fileio_rm_rf(tmpdir); /* nothing partial stays visible */
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
