/* runtime/exec_ckpt.c: the executor's state on disk: checkpoints (save,
 * and resume with every rank agreeing on which one), weights, the trace.
 * A strategy that holds state of its own takes part through the hooks
 * settle, state_begin / state_end, save_checkpoint and weights_path; this
 * file must not branch on which strategies are active. */
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "brigade/checkpoint.h"
#include "core/check.h"
#include "core/fileio.h"
#include "runtime/checkpoint_impl.h"
#include "runtime/exec_impl.h"

/* The backend's queued work done, and its first fault if any: state copied in or out under a fault is not
 * the steps' (nothing of it may be written, or kept as loaded). */
static bg_status_t device_done(exec_t *x)
{
    x->be->ops->synchronize(x->be);
    return bg_backend_status(x->be);
}

/* Every chunk's parameters whole (the EVERY hook settle). */
bg_status_t bg__exec_settle(exec_t *x)
{
    BG__EACH_STRATEGY(x, s) if (s->ops->settle) BG_CHECK(s->ops->settle(x, s->self));
    return device_done(x);
}

bg_status_t bg_executor_save_checkpoint(bg_executor_t *x, const char *root, int keep)
{
    BG_CHECK(device_done(x)); /* a device fault: the weights are not the steps' */
    bg__strategy_t *own = BG__ONE(x, save_checkpoint);
    if (own)
        return own->ops->save_checkpoint(x, own->self, root, keep);
    bg_model_t **models = NULL;
    /* the full state while saving (full named tensors) */
    BG__EACH_STRATEGY(x, s) if (s->ops->state_begin) BG_CHECK(s->ops->state_begin(x, s->self, 0));
    BG_CHECK(bg__exec_chunk_models(x, &models));
    int nmodels = 0; /* copies > 1: copy 0 is the model (the copies are identical); loading fills every copy */
    for (int v = 0; v < x->V; v++)
        if (x->chunks[v].copy == 0)
            models[nmodels++] = x->chunks[v].model;
    char extra[512];
    snprintf(extra, sizeof(extra),
             "{\"layout\":{\"pp\":%d,\"dp\":%d,\"tp\":%d,\"chunks\":%d,\"schedule\":\"%s\"},"
             "\"optimizer\":\"%s\",\"lr\":%g,\"batch\":%d,\"microbatches\":%d}",
             x->lay.pp, x->lay.dp, x->lay.tp, x->V, bg_schedule_name(x->sched),
             x->p.optim.kind == BG_OPTIM_ADAMW ? "adamw" : "sgd",
             (double)x->p.optim.lr, x->p.batch, x->M);
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = root;
    p.step = x->step;
    p.models = models;
    p.nmodels = nmodels;
    p.comm = x->comm;
    p.writer = bg__layout_lead(&x->lay) && x->lay.me.tp == 0; /* member 0 writes the tensor group's gathered tensors */
    p.data_position = x->data_position;
    p.extra_json = extra;
    p.keep = keep;
    bg_status_t st = bg_checkpoint_save(&p);
    free(models);
    if (st == BG_OK) /* a device fault in the gathers or the copies out: the files are not the state */
        st = device_done(x);
    BG__EACH_STRATEGY(x, s) if (s->ops->state_end) s->ops->state_end(x, s->self, 0, st);
    return st;
}

/* One rank's outcome of verifying or loading a checkpoint; every rank
 * gathers all of them, so all agree on the checkpoint and on why one fails. */
typedef struct load_vote {
    int32_t st;
    int32_t damaged;
    char msg[504];
} load_vote_t;

/* Every rank's outcome of `mine` -> the job's: BG_OK when every rank's was;
 * else the first failing rank's status and message (an incompatibility
 * before damage, which a fallback cannot mend), *damaged_p as it says. */
static bg_status_t agree(exec_t *x, bg_status_t mine, int damaged, int *damaged_p)
{
    load_vote_t v;
    memset(&v, 0, sizeof v);
    v.st = mine;
    v.damaged = damaged;
    if (mine != BG_OK)
        snprintf(v.msg, sizeof v.msg, "%s", bg_last_error());
    *damaged_p = damaged;
    if (x->lay.world == 1)
        return mine;
    load_vote_t *all = malloc((size_t)x->lay.world * sizeof(*all));
    BG_ALLOC_CHECK(all, (size_t)x->lay.world * sizeof(*all), "resume votes");
    bg_status_t st = bg_group_allgather(x->world_group, &v, all, sizeof v, BG_U8);
    if (st != BG_OK) {
        free(all);
        return st;
    }
    int bad = -1;
    for (int r = 0; r < x->lay.world; r++)
        if (all[r].st != BG_OK && (bad < 0 || (all[bad].damaged && !all[r].damaged)))
            bad = r;
    if (bad >= 0) {
        all[bad].msg[sizeof all[bad].msg - 1] = 0;
        *damaged_p = all[bad].damaged;
        st = bg_error((bg_status_t)all[bad].st, "%s", all[bad].msg);
    }
    free(all);
    return st;
}

/* Load checkpoint `dir` on every rank, or on none: the ranks first verify
 * what they would read (apply = 0) and agree, so that a checkpoint damaged
 * in one rank's file leaves every rank's models as they were. */
static bg_status_t load_agreed(exec_t *x, bg_model_t **models, const char *dir, bg_checkpoint_info_t *info,
                               int *damaged_p)
{
    int damaged = 0;
    bg_status_t st;
    if (x->lay.world > 1) {
        bg_checkpoint_info_t probe;
        st = bg__checkpoint_load(dir, models, x->V, &probe, &damaged, 0);
        if (st == BG_OK)
            bg_checkpoint_info_clear(&probe);
        BG_CHECK(agree(x, st, damaged, damaged_p));
    }
    st = bg__checkpoint_load(dir, models, x->V, info, &damaged, 1);
    bg_status_t all = agree(x, st, damaged, damaged_p);
    if (all != BG_OK && st == BG_OK)
        bg_checkpoint_info_clear(info);
    return all;
}

/* The layout recorded by bg_executor_save_checkpoint in the manifest's "extra". */
static void stored_layout(const char *extra_json, int *pp_p, int *dp_p)
{
    *pp_p = *dp_p = 0;
    json_t *e = json_loads(extra_json ? extra_json : "{}", 0, NULL);
    json_t *l = json_object_get(e, "layout");
    if (json_is_integer(json_object_get(l, "pp")))
        *pp_p = (int)json_integer_value(json_object_get(l, "pp"));
    if (json_is_integer(json_object_get(l, "dp")))
        *dp_p = (int)json_integer_value(json_object_get(l, "dp"));
    json_decref(e);
}

static void resume_found(exec_t *x, const char *dir, bg_checkpoint_info_t *info, bg_resume_result_t *r)
{
    x->step = info->step;
    r->found = 1;
    r->step = info->step;
    r->world = info->world;
    snprintf(r->path, sizeof r->path, "%s", dir);
    stored_layout(info->extra_json, &r->pp, &r->dp);
    bg_checkpoint_info_clear(info);
    bg_log(BG_LOG_INFO, "train", "resumed from %s (step %lld)", dir, (long long)r->step);
}

bg_status_t bg_executor_resume_with(bg_executor_t *x, const bg_resume_params_t *pin, bg_resume_result_t *result_p)
{
    bg_resume_params_t p = BG_RESUME_PARAMS_INIT;
    if (!pin || !result_p)
        return bg_error(BG_ERR_INVALID, "bg_executor_resume_with: NULL params or result");
    memcpy(&p, pin, pin->size < sizeof p ? pin->size : sizeof p);
    if (!(p.path && *p.path) && !(p.root && *p.root))
        return bg_error(BG_ERR_INVALID, "bg_executor_resume_with: neither a checkpoint root nor a path");
    bg_resume_result_t r;
    memset(&r, 0, sizeof r);
    bg_model_t **models = NULL;
    BG_CHECK(bg__exec_settle(x));
    /* the full state in the models while loading (a strategy keeps its part after) */
    BG__EACH_STRATEGY(x, s) if (s->ops->state_begin) BG_CHECK(s->ops->state_begin(x, s->self, 1));
    BG_CHECK(bg__exec_chunk_models(x, &models));
    bg_checkpoint_info_t info;
    int damaged;
    bg_status_t st = BG_OK;
    if (p.path && *p.path) {
        st = load_agreed(x, models, p.path, &info, &damaged);
        if (st == BG_OK)
            resume_found(x, p.path, &info, &r);
        else
            st = bg_error(st, "cannot resume from %s: %s", p.path, bg_last_error());
        goto out;
    }
    bg__ckpt_dir_t *dirs = NULL;
    size_t n = 0;
    st = bg__checkpoint_dirs(p.root, &dirs, &n);
    if (st == BG_ERR_NOT_FOUND) { /* no root yet: nothing to resume */
        bg_error_clear();
        st = BG_OK;
        goto out;
    }
    for (size_t i = 0; st == BG_OK && i < n; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", p.root, dirs[i].name);
        st = load_agreed(x, models, dir, &info, &damaged);
        if (st == BG_OK) {
            resume_found(x, dir, &info, &r);
            break;
        }
        if (!damaged) /* another model, optimizer or format: an older one is no better */
            break;
        if (r.invalid++ == 0)
            snprintf(r.invalid_what, sizeof r.invalid_what, "%s", bg_last_error());
        bg_log(BG_LOG_INFO, "train", "checkpoint %s is invalid: %s", dir, bg_last_error());
        if (p.strict) {
            st = bg_error(st, "the newest checkpoint is invalid (and strict resume refuses older ones): %s",
                          r.invalid_what);
            break;
        }
        st = BG_OK;
    }
    free(dirs);
    if (st == BG_OK && !r.found && r.invalid && p.strict)
        st = bg_error(BG_ERR_NOT_FOUND, "no valid checkpoint under %s (%d invalid; newest: %s)", p.root, r.invalid,
                      r.invalid_what);
out:
    free(models);
    BG__EACH_STRATEGY(x, s) if (s->ops->state_end) s->ops->state_end(x, s->self, 1, st);
    if (st == BG_OK) /* a device fault in the copies in: the state is not the checkpoint's */
        st = device_done(x);
    if (st == BG_OK)
        *result_p = r;
    return st;
}

bg_status_t bg_executor_resume(bg_executor_t *x, const char *root, int *found_p)
{
    bg_resume_params_t p = BG_RESUME_PARAMS_INIT;
    p.root = root;
    bg_resume_result_t *r = malloc(sizeof *r);
    BG_ALLOC_CHECK(r, sizeof *r, "resume result");
    bg_status_t st = bg_executor_resume_with(x, &p, r);
    if (st == BG_OK && r->invalid)
        bg_log(BG_LOG_WARN, "train", "%d invalid checkpoint(s) under %s skipped (%s); %s", r->invalid, root,
               r->invalid_what, r->found ? r->path : "none is valid: nothing resumed");
    if (st == BG_OK)
        *found_p = r->found;
    free(r);
    return st;
}

/* Where chunk v's weights go: the ONE hook weights_path, or by default
 * replica 0 writes, one file per stage (one file for one stage). "": none. */
static void weights_path(exec_t *x, int v, const char *dir, char *path, size_t cap)
{
    bg__strategy_t *own = BG__ONE(x, weights_path);
    if (own)
        own->ops->weights_path(x, own->self, v, dir, path, cap);
    else if (!bg__layout_lead(&x->lay))
        path[0] = 0;
    else if (x->S == 1)
        snprintf(path, cap, "%s/model.safetensors", dir);
    else
        snprintf(path, cap, "%s/model-stage%03d.safetensors", dir, x->chunks[v].stage);
}

/* ---- weights as a unit ----
 * DIR is replaced as a whole: the writers put their files into a fresh
 * sibling DIR.tmp-<token> and rank 0, once every writer has finished,
 * exchanges it with DIR (bg__fileio_replace_dir). A reader sees the old
 * weights or the new, never one stage of each; a failed save leaves the old
 * as they were. The writers meet through the store, not a group: the
 * workers of parameter servers write nothing and may have died. */

/* Saves of weights by this process: names a save's store keys. The writers
 * agree: each takes part in every save, in the same order. */
static atomic_ulong weights_seq;

/* How many ranks write weights: the ONE hook weights_writers, or by default
 * replica 0's (with their tensor-parallel members, which gather). */
static int weights_writers(exec_t *x)
{
    bg__strategy_t *own = BG__ONE(x, weights_writers);
    return own ? own->ops->weights_writers(x, own->self) : x->lay.world / (x->lay.dp * x->lay.cp);
}

/* This rank's files into dir (made here; it may exist, made by another writer). */
static bg_status_t write_weights(exec_t *x, const char *dir)
{
    char *meta = NULL;
    bg_status_t st = bg__fileio_mkdir_p(dir);
    if (st == BG_OK)
        st = bg_model_metadata_json(x->desc, &meta);
    for (int v = 0; v < x->V && st == BG_OK; v++) {
        char path[4400];
        if (x->chunks[v].copy > 0)
            continue; /* the copies are identical: copy 0 is the model (its stage = the model stage) */
        weights_path(x, v, dir, path, sizeof path);
        if (path[0])
            st = bg_model_save_safetensors(x->chunks[v].model, path, meta);
    }
    free(meta);
    if (st == BG_OK) /* a device fault in the copies out (the gathers of tensor-parallel shards): not the weights */
        st = device_done(x);
    return st;
}

/* Rank 0: put the finished tmp in place of dir; stale siblings of killed saves go. */
static bg_status_t publish_weights(const char *tmp, const char *dir, const char *token)
{
    char aside[4200];
    snprintf(aside, sizeof aside, "%s.tmp-old-%s", dir, token); /* dir: at most 4095 bytes, token 63 */
    BG_CHECK(bg_check_replaceable_dir(dir, ".safetensors"));
    BG_CHECK(bg__fileio_fsync_path(tmp, 1));
    return bg__fileio_replace_dir(tmp, dir, aside);
}

#define WEIGHTS_KEY(buf, seq, what) snprintf(buf, sizeof buf, "bg.weights.%lu.%s", seq, what)

/* A writer other than rank 0: say how it went, then wait for rank 0's word. */
static bg_status_t weights_join(exec_t *x, unsigned long seq, int writers, bg_status_t mine)
{
    char key[BG_STORE_MAX_KEY], res[1100];
    int64_t n;
    if (mine != BG_OK) {
        snprintf(res, sizeof res, "rank %d: %s", x->lay.rank, bg_last_error());
        WEIGHTS_KEY(key, seq, "why");
        BG_CHECK(bg_store_set(x->comm, key, res, strlen(res) + 1));
        WEIGHTS_KEY(key, seq, "failed");
        BG_CHECK(bg_store_add(x->comm, key, 1, &n));
    }
    WEIGHTS_KEY(key, seq, "done");
    BG_CHECK(bg_store_add(x->comm, key, 1, &n));
    if (n == writers) {
        WEIGHTS_KEY(key, seq, "all");
        BG_CHECK(bg_store_set(x->comm, key, "", 1));
    }
    if (x->lay.rank == 0)
        return BG_OK;
    size_t got;
    WEIGHTS_KEY(key, seq, "result");
    BG_CHECK(bg_store_wait(x->comm, key, res, sizeof res, &got));
    res[sizeof res - 1] = 0;
    int code = atoi(res);
    const char *sp = strchr(res, ' ');
    if (mine != BG_OK) /* this rank's own failure says more than rank 0's summary */
        return bg_error(mine, "%s", sp ? sp + 1 : "?");
    return code == 0 ? BG_OK : bg_error((bg_status_t)code, "%s", sp ? sp + 1 : "?");
}

/* Rank 0 of a save with other writers: wait for all of them, publish or
 * clean up, say how it went. */
static bg_status_t weights_finish(exec_t *x, unsigned long seq, bg_status_t mine, const char *tmp, const char *dir,
                                  const char *token)
{
    char key[BG_STORE_MAX_KEY], msg[1100], all[8];
    size_t got;
    int64_t failed = 0;
    snprintf(msg, sizeof msg, "%s", mine != BG_OK ? bg_last_error() : "");
    WEIGHTS_KEY(key, seq, "all");
    bg_status_t st = bg_store_wait(x->comm, key, all, sizeof all, &got);
    if (st == BG_OK) {
        WEIGHTS_KEY(key, seq, "failed");
        st = bg_store_add(x->comm, key, 0, &failed);
    }
    if (st != BG_OK) {
        snprintf(msg, sizeof msg, "not every writer finished: %s", bg_last_error());
    } else if (mine == BG_OK && failed) {
        WEIGHTS_KEY(key, seq, "why");
        if (bg_store_get(x->comm, key, msg, sizeof msg, &got) != BG_OK)
            snprintf(msg, sizeof msg, "%lld rank(s) failed to write their files", (long long)failed);
        msg[sizeof msg - 1] = 0;
        st = BG_ERR_IO;
    } else if (mine == BG_OK) {
        st = publish_weights(tmp, dir, token);
        snprintf(msg, sizeof msg, "%s", st != BG_OK ? bg_last_error() : "");
    } else {
        st = mine;
    }
    for (const char *const *k = (const char *const[]){"token", "done", "failed", "why", "all", NULL}; *k; k++) {
        WEIGHTS_KEY(key, seq, *k);
        bg_store_delete(x->comm, key);
    }
    snprintf(key, sizeof key, "bg.weights.%lu.result", seq - 1);
    bg_store_delete(x->comm, key);
    char res[1200];
    int len = snprintf(res, sizeof res, "%d %s", (int)st, msg);
    WEIGHTS_KEY(key, seq, "result");
    bg_store_set(x->comm, key, res, (size_t)(len < (int)sizeof res ? len : (int)sizeof res - 1) + 1);
    if (st != BG_OK)
        bg__fileio_rm_rf(tmp); /* nothing of this save stays */
    return st == BG_OK ? BG_OK : bg_error(st, "%s", msg);
}

bg_status_t bg_executor_save_weights(bg_executor_t *x, const char *dir)
{
    BG_CHECK(bg__exec_settle(x));
    int writes = 0;
    for (int v = 0; v < x->V && !writes; v++) {
        char path[4096];
        weights_path(x, v, "d", path, sizeof path);
        writes = x->chunks[v].copy == 0 && path[0];
    }
    if (!writes) {
        /* an expert-parallel group gathers its experts' slices together: the writer's gathers need this rank */
        for (int v = 0; v < x->V && bg_model_desc_ep(x->desc); v++)
            if (x->chunks[v].copy == 0)
                BG_CHECK(bg_model_save_safetensors(x->chunks[v].model, "", NULL));
        return BG_OK;
    }
    int shared = x->lay.world > 1 && weights_writers(x) > 1;
    if (shared && bg_comm_health(x->comm) != BG_OK) {
        /* ranks failed and the job went on without them (--ps tolerates its workers'): the store
         * refuses every call now, so each writer writes its files in place, not as a unit */
        bg_error_clear();
        bg_log(BG_LOG_WARN, "checkpoint", "saving the weights in %s file by file (ranks of this job failed)", dir);
        return write_weights(x, dir);
    }
    unsigned long seq = atomic_fetch_add(&weights_seq, 1) + 1;
    char token[64], key[BG_STORE_MAX_KEY], tmp[4096 + 80];
    size_t got;
    if (x->lay.rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(token, sizeof token, "p%d-%lx", (int)getpid(), (unsigned long)ts.tv_nsec ^ (unsigned long)seq);
        WEIGHTS_KEY(key, seq, "token");
        if (shared)
            BG_CHECK(bg_store_set(x->comm, key, token, strlen(token) + 1));
    } else {
        WEIGHTS_KEY(key, seq, "token");
        BG_CHECK(bg_store_wait(x->comm, key, token, sizeof token, &got));
        token[sizeof token - 1] = 0;
    }
    char base[4096];
    if (snprintf(base, sizeof base, "%s", dir) >= (int)sizeof base)
        return bg_error(BG_ERR_INVALID, "weights directory path too long: %s", dir);
    for (size_t n = strlen(base); n > 1 && base[n - 1] == '/';) /* "out/" and "out" are one directory */
        base[--n] = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp-%s", base, token);
    bg_status_t mine = bg_check_replaceable_dir(base, ".safetensors");
    if (mine == BG_OK)
        mine = write_weights(x, tmp);
    if (!shared) {
        if (mine == BG_OK)
            mine = publish_weights(tmp, base, token);
        if (mine != BG_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", bg_last_error());
            bg__fileio_rm_rf(tmp);
            return bg_error(mine, "%s", msg);
        }
        return BG_OK;
    }
    BG_CHECK(weights_join(x, seq, weights_writers(x), mine));
    return x->lay.rank == 0 ? weights_finish(x, seq, mine, tmp, base, token) : BG_OK;
}

bg_status_t bg_executor_load_weights(bg_executor_t *x, const char *dir)
{
    bg_model_t **models = NULL;
    BG_CHECK(bg__exec_settle(x));
    BG_CHECK(bg__exec_chunk_models(x, &models));
    bg_status_t st = bg_safetensors_load_dir(dir, models, x->V);
    free(models);
    return st;
}

bg_status_t bg_executor_write_trace(bg_executor_t *x)
{
    if (!x->trace)
        return bg_error(BG_ERR_INVALID, "bg_executor_write_trace: the executor was created without a trace_path");
    char meta[512];
    snprintf(meta, sizeof(meta),
             "{\"schedule\":\"%s\",\"pp\":%d,\"dp\":%d,\"tp\":%d,\"microbatches\":%d,\"chunks\":%d,\"steps\":%lld,"
             "\"producer\":\"brigade " BRIGADE_VERSION_STRING "\"}",
             bg_schedule_name(x->sched), x->lay.pp, x->lay.dp, x->lay.tp, x->M, bg_schedule_chunks(x->sched),
             (long long)x->step);
    return bg__trace_write(x->trace, x->p.trace_path, meta);
}

