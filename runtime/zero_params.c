/* runtime/zero_params.c: --zero 3's sharded parameters for one model chunk
 * (docs/data_parallel.md). The chunk's flat parameter buffer is freed; each
 * replica keeps the owned chunk of every gradient bucket (bg_group_chunk,
 * the chunks runtime/zero.c's optimizer updates) in a compact shard. Before a
 * layer computes (the stage's layer-begin callback: forward, recomputation,
 * backward input, zero-bubble weight, fused backward) its bucket is
 * all-gathered into one of a few pool buffers of the largest bucket's size
 * and the bucket's tensors' data aimed at it; the next BRIGADE_ZERO_PREFETCH
 * buckets in the pass's direction are gathered ahead without blocking. A
 * gathered bucket stays until its buffer is taken for another bucket (the
 * least recently used one that the pass does not need next) or its owned
 * chunk is updated; a later pass that needs it again (the backward after
 * the forward, a zero-bubble W after its B, a recomputation) gathers it
 * again when it was dropped. Every replica runs the same layers in the same
 * order, so the gathers are posted in the same order everywhere.
 *
 * Checkpoints, evaluation, saving and loading weights see whole tensors:
 * materialize holds the flat buffer again, fills it from the shard and
 * all-gathers every bucket (collective); the next step's start keeps the
 * owned chunks (they may have been loaded) and frees it.
 *
 * --offload params: the shard comes from the offload store (host memory or
 * files under --offload-dir, runtime/offload.c) instead of the backend, so
 * only the pool counts against the device; a gather copies the owned chunk
 * from the store into its pool buffer (on the cpu backend, a memcpy from
 * the store's memory) and all-gathers there, as without offload.
 * On a backend whose kernels cannot address the store (a store with a step:
 * the host-held optimizer step of runtime/offload.c; cuda, or cpu-async under
 * BRIGADE_OFFLOAD_STEP=host) the owned chunk is uploaded instead: from_host_async on the
 * copy stream, completing the bucket's upload event; the compute stream waits
 * on that event before the all-gather is queued, the host does not. The
 * upload waits for no event: a pool buffer is free only once the host has
 * synchronized the compute stream past its last reader (start's victim, the
 * step's update, materialize), so it runs beside the kernels already queued.
 * With one bucket prefetched (BRIGADE_ZERO_PREFETCH=1) its upload and gather
 * are queued at once, before the current layer's kernels (which wait for the
 * upload, 1/D of the bucket, and not for the gather); with two or more, the
 * furthest bucket's upload is queued at one layer's call and its gather
 * started at the next, so the upload overlaps the layer in between. Gathers
 * start at points of the program only, so every replica starts them in the
 * same order. The host waits for a bucket's upload before its owned chunk is
 * updated (the optimizer steps it on the host where it lives), before the
 * pool buffer is freed and before the shard is.
 *
 * Owns: the shard, the pool and the gathers in flight. Must not know
 * schedules or pipelines (the executor calls it per chunk). */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "runtime/zero.h"
#include "schedule/memory.h"

#define PPOOL 16

struct bg__zparams {
    bg_model_t *m;
    bg_backend_t *be;
    bg__dcoll_t *dc;     /* the data-parallel group's collectives on the backend's buffers (runtime/devcoll.h) */
    int D, me;
    bg__zero_bucket_t *buckets;
    int nbuckets;
    size_t *toff;        /* per tensor: its offset in the flat layout */
    size_t *soff;        /* per bucket: where its owned chunk starts in the shard */
    size_t owned;
    float *shard;        /* owned parameters */
    bg_optim_store_t store; /* where the shard lives (alloc NULL: the backend) */
    float *pool[PPOOL];  /* gather buffers (pool_count floats each) */
    size_t pool_count;
    int npool;
    int *slot;           /* per bucket: the pool buffer holding it, -1 none */
    bg__xfer_t **ag;      /* per bucket: its gather in flight */
    int64_t *used;       /* per bucket: when it was last needed (the least recent is dropped first) */
    int64_t clock, waits, gathers;
    double *issued;      /* per bucket: when its prefetched or demanded gather started (0: a materialize's) */
    double gather_s;     /* those gathers' time from start to found complete (at a layer's call, or waited for) */
    double exposed_s;    /* of which the computes waited for (blocked in a wait) */
    int whole;           /* the flat buffer is held and authoritative (materialize) */
    /* a shard the backend's kernels cannot address (host): uploaded on the copy stream */
    int host;            /* 1: the store has a step (runtime/offload.c's host-held step) */
    int nowait;          /* BRIGADE_FAULT_UPLOAD_NOWAIT: the compute stream does not wait for the upload (tests) */
    bg_event_t **up;     /* per bucket: its upload's completion (NULL: no streams) */
    char *uploading;     /* per bucket: an upload queued, not yet waited for by the host */
    int *pending;        /* buckets uploaded whose gather starts at the next layer's call, in the order queued */
    int npending;
};

int bg__zero_prefetch(void)
{
    long long n = 1;
    if (bg_config_int("BRIGADE_ZERO_PREFETCH", &n) != BG_OK)
        n = 1;
    return n < 0 ? 0 : n > PPOOL - 1 ? PPOOL - 1 : (int)n;
}

/* Aim the data of bucket b's tensors at buf (NULL: none). */
static void aim(bg__zparams_t *zp, int b, float *buf)
{
    size_t lo = zp->buckets[b].off, hi = lo + zp->buckets[b].count;
    for (int i = 0; i < bg_model_num_tensors(zp->m); i++)
        if (zp->toff[i] >= lo && zp->toff[i] < hi)
            bg_model_tensor(zp->m, i)->data = buf ? buf + (zp->toff[i] - lo) : NULL;
}

/* Bucket b's gather found complete now (blocked since t_wait when t_wait > 0): its time counted. */
static void gathered(bg__zparams_t *zp, int b, double t_wait)
{
    double now = bg_now();
    if (zp->issued[b] > 0) {
        zp->gather_s += now - zp->issued[b];
        zp->exposed_s += t_wait > 0 ? now - t_wait : 0;
    }
    zp->issued[b] = 0;
    bg__xfree(zp->ag[b]);
    zp->ag[b] = NULL;
}

static bg_status_t wait_gather(bg__zparams_t *zp, int b)
{
    if (!zp->ag[b])
        return BG_OK;
    int done = 0;
    double t_wait = 0;
    bg_status_t st = bg__xtest(zp->ag[b], &done);
    if (st == BG_OK && !done) {
        zp->waits++;
        t_wait = bg_now();
        st = bg__xwait(zp->ag[b]);
    }
    gathered(zp, b, t_wait);
    return st;
}

/* The gathers in flight that have completed, taken (their time ends here, not when a compute needs them). */
static bg_status_t poll_gathers(bg__zparams_t *zp)
{
    for (int b = 0; b < zp->nbuckets; b++) {
        int done = 0;
        if (zp->ag[b]) {
            BG_CHECK(bg__xtest(zp->ag[b], &done));
            if (done)
                gathered(zp, b, 0);
        }
    }
    return BG_OK;
}

/* The host waits for bucket b's upload (it reads the shard and writes the pool buffer). */
static void upload_done(bg__zparams_t *zp, int b)
{
    if (zp->uploading && zp->uploading[b]) {
        zp->be->ops->event_wait(zp->be, zp->up[b]);
        zp->uploading[b] = 0;
    }
}

/* Bucket b taken off the list of gathers to start (its upload waited for: nothing reads the shard after). */
static void unpend(bg__zparams_t *zp, int b)
{
    for (int i = 0; i < zp->npending; i++)
        if (zp->pending[i] == b) {
            memmove(zp->pending + i, zp->pending + i + 1, (size_t)(zp->npending - i - 1) * sizeof(int));
            zp->npending--;
            break;
        }
    upload_done(zp, b);
}

/* Bucket b's gathered copy dropped (its gather, or its upload when the gather never started, waited for
 * first: the buffer and the owned chunk are free after). */
static bg_status_t drop(bg__zparams_t *zp, int b)
{
    unpend(zp, b);
    bg_status_t st = wait_gather(zp, b);
    if (zp->slot[b] >= 0)
        aim(zp, b, NULL);
    zp->slot[b] = -1;
    return st;
}

/* Start the all-gather of bucket b, whose owned chunk is in its pool buffer or on its way there on the copy
 * stream (the compute stream, not the host, waits for that upload first). */
static bg_status_t gather(bg__zparams_t *zp, int b)
{
    if (zp->up && !zp->nowait)
        zp->be->ops->stream_wait(zp->be, zp->up[b]);
    return zp->D > 1 ? bg__dcoll_start(zp->dc, BG__COLL_ALLGATHER_CHUNKS, NULL, zp->pool[zp->slot[b]],
                                       zp->buckets[b].count, BG_REDUCE_SUM, &zp->ag[b])
                     : BG_OK;
}

/* Start gathering bucket b unless it is there or on its way; a buffer taken
 * from the least recently needed bucket not in keep[0..nk). now 0: with a host-held shard only its upload is
 * queued, its gather starts at the next layer's call (gather_pending). */
static bg_status_t start(bg__zparams_t *zp, int b, const int *keep, int nk, int now)
{
    if (zp->slot[b] >= 0 || !zp->buckets[b].count)
        return BG_OK;
    int used[PPOOL] = {0}, victim = -1;
    for (int q = 0; q < zp->nbuckets; q++) {
        if (zp->slot[q] < 0)
            continue;
        used[zp->slot[q]] = 1;
        int kept = 0;
        for (int j = 0; j < nk; j++)
            kept |= keep[j] == q;
        if (!kept && (victim < 0 || zp->used[q] < zp->used[victim]))
            victim = q;
    }
    int k = -1;
    for (int j = 0; j < zp->npool && k < 0; j++)
        if (!used[j])
            k = j;
    if (k < 0 && victim < 0)
        return BG_OK; /* every buffer holds a bucket the pass needs sooner: no prefetch */
    if (k < 0) {
        k = zp->slot[victim];
        BG_CHECK(drop(zp, victim));
        zp->be->ops->synchronize(zp->be); /* nothing queued still reads the buffer */
    }
    size_t co, cl;
    bg_group_chunk(zp->buckets[b].count, zp->D, zp->me, &co, &cl);
    float *buf = zp->pool[k];
    const bg_backend_ops_t *d = zp->be->ops;
    zp->slot[b] = k;
    zp->used[b] = zp->clock++;
    zp->gathers++;
    aim(zp, b, buf);
    zp->issued[b] = bg_now();
    if (!zp->host) {
        d->copy(zp->be, buf + co, zp->shard + zp->soff[b], cl);
        d->synchronize(zp->be); /* the gather reads what the copy wrote */
        return gather(zp, b);
    }
    if (!zp->up) { /* no streams: a copy the host waits for */
        d->from_host(zp->be, buf + co, zp->shard + zp->soff[b], cl * sizeof(float));
        return gather(zp, b);
    }
    d->from_host_async(zp->be, buf + co, zp->shard + zp->soff[b], cl * sizeof(float), NULL, zp->up[b]);
    zp->uploading[b] = 1;
    if (now)
        return gather(zp, b);
    zp->pending[zp->npending++] = b; /* gathered at the next layer's call */
    return BG_OK;
}

/* The gathers of the buckets uploaded at an earlier call, in the order their uploads were queued. */
static bg_status_t gather_pending(bg__zparams_t *zp)
{
    bg_status_t st = BG_OK;
    for (int i = 0; i < zp->npending && st == BG_OK; i++)
        st = gather(zp, zp->pending[i]);
    zp->npending = 0;
    return st;
}

static int bucket_of(const bg__zparams_t *zp, int layer)
{
    for (int b = 0; b < zp->nbuckets; b++)
        if (layer >= zp->buckets[b].lo && layer <= zp->buckets[b].hi)
            return b;
    return -1;
}

bg_status_t bg__zparams_layer(bg__zparams_t *zp, int layer, int ascending)
{
    if (!zp || zp->whole)
        return BG_OK;
    int b = bucket_of(zp, layer);
    if (b < 0)
        return bg_error(BG_ERR_INTERNAL, "zero 3: layer %d is in no bucket of the chunk", layer);
    BG_CHECK(gather_pending(zp));
    BG_CHECK(poll_gathers(zp));
    /* buckets run from the last layers (bucket 0) down: a forward goes to lower indices */
    int keep[PPOOL], nk = 0;
    for (int q = b; q >= 0 && q < zp->nbuckets && nk < zp->npool; q += ascending ? -1 : 1)
        keep[nk++] = q;
    for (int j = 0; j < nk; j++) /* a host-held shard: the furthest of two or more prefetched gathered next call */
        BG_CHECK(start(zp, keep[j], keep, nk, j < 2 || j < nk - 1));
    zp->used[b] = zp->clock++;
    return wait_gather(zp, b);
}

void bg__zparams_release(bg__zparams_t *zp, int b)
{
    if (zp && !zp->whole)
        (void)drop(zp, b); /* no gather is in flight after a step's backward; an error was reported there */
}

/* Copy between the shard and the flat buffer (to_flat: the owned chunks into it); a host-held shard with the
 * backend's synchronous copies to and from the host (no upload is in flight: every bucket was dropped). */
static void move(bg__zparams_t *zp, int to_flat)
{
    float *flat = bg_model_params(zp->m);
    const bg_backend_ops_t *d = zp->be->ops;
    d->synchronize(zp->be); /* the flat buffer's writers (a checkpoint's load) */
    for (int b = 0; b < zp->nbuckets; b++) {
        size_t co, cl;
        bg_group_chunk(zp->buckets[b].count, zp->D, zp->me, &co, &cl);
        float *f = flat + zp->buckets[b].off + co, *s = zp->shard + zp->soff[b];
        if (!zp->host)
            d->copy(zp->be, to_flat ? f : s, to_flat ? s : f, cl);
        else if (to_flat)
            d->from_host(zp->be, f, s, cl * sizeof(float));
        else
            d->to_host(zp->be, s, f, cl * sizeof(float));
    }
    d->synchronize(zp->be);
}

bg_status_t bg__zparams_materialize(bg__zparams_t *zp)
{
    if (!zp || zp->whole)
        return BG_OK;
    bg_status_t st = BG_OK;
    for (int b = 0; b < zp->nbuckets; b++) {
        bg_status_t s2 = drop(zp, b);
        st = st == BG_OK ? s2 : st;
    }
    BG_CHECK(st);
    BG_CHECK(bg_model_params_hold(zp->m, 1));
    zp->whole = 1;
    move(zp, 1);
    for (int b = 0; b < zp->nbuckets && zp->D > 1; b++)
        if (zp->buckets[b].count)
            BG_CHECK(bg__dcoll_start(zp->dc, BG__COLL_ALLGATHER_CHUNKS, NULL, bg_model_params(zp->m) + zp->buckets[b].off,
                                     zp->buckets[b].count, BG_REDUCE_SUM, &zp->ag[b]));
    for (int b = 0; b < zp->nbuckets; b++) {
        bg_status_t s2 = wait_gather(zp, b);
        st = st == BG_OK ? s2 : st;
    }
    return st;
}

bg_status_t bg__zparams_shard_again(bg__zparams_t *zp)
{
    if (!zp || !zp->whole)
        return BG_OK;
    move(zp, 0);
    zp->whole = 0;
    return bg_model_params_hold(zp->m, 0);
}

/* A host-held shard on a backend with streams: the events of its uploads; the test knob read. */
static bg_status_t upload_events(bg__zparams_t *zp)
{
    BG_CHECK(bg_config_on("BRIGADE_FAULT_UPLOAD_NOWAIT", &zp->nowait));
    const bg_backend_ops_t *d = zp->be->ops;
    if (!zp->host || !d->event_create)
        return BG_OK;
    zp->up = calloc((size_t)zp->nbuckets + 1, sizeof(*zp->up));
    zp->uploading = calloc((size_t)zp->nbuckets + 1, 1);
    if (!zp->up || !zp->uploading)
        return bg_error(BG_ERR_NOMEM, "zero 3: the events of the parameter shard's uploads");
    for (int b = 0; b < zp->nbuckets; b++)
        if (!(zp->up[b] = d->event_create(zp->be)))
            return bg_error(BG_ERR_NOMEM, "zero 3: the events of the parameter shard's uploads");
    return BG_OK;
}

bg_status_t bg__zparams_create(bg_model_t *m, bg__dcoll_t *dc, const bg__zero_bucket_t *buckets, int nbuckets,
                               const bg_optim_store_t *store, bg__zparams_t **zp_p)
{
    *zp_p = NULL;
    bg_group_t *dp = bg__dcoll_group(dc);
    int D = bg_group_size(dp), me = bg_group_rank(dp), nt = bg_model_num_tensors(m);
    size_t owned = 0, largest = 0, N = bg_model_param_count(m);
    for (int b = 0; b < nbuckets; b++) {
        size_t co, cl;
        bg_group_chunk(buckets[b].count, D, me, &co, &cl);
        owned += cl;
        largest = buckets[b].count > largest ? buckets[b].count : largest;
    }
    int npool = bg__zero3_buffers(bg__zero_prefetch() + 1, nbuckets, owned, largest, N);
    if (npool == 0 || D < 2)
        return BG_OK;
    bg__zparams_t *zp = calloc(1, sizeof(*zp));
    BG_ALLOC_CHECK(zp, sizeof(*zp), "zero 3 parameter shard");
    *zp = (bg__zparams_t){.m = m, .be = bg_model_backend(m), .dc = dc, .D = D, .me = me, .nbuckets = nbuckets,
                          .owned = owned, .pool_count = largest, .npool = npool};
    zp->buckets = calloc((size_t)nbuckets + 1, sizeof(*zp->buckets));
    zp->toff = calloc((size_t)nt + 1, sizeof(*zp->toff));
    zp->soff = calloc((size_t)nbuckets + 1, sizeof(*zp->soff));
    zp->slot = calloc((size_t)nbuckets + 1, sizeof(*zp->slot));
    zp->ag = calloc((size_t)nbuckets + 1, sizeof(*zp->ag));
    zp->used = calloc((size_t)nbuckets + 1, sizeof(*zp->used));
    zp->issued = calloc((size_t)nbuckets + 1, sizeof(*zp->issued));
    zp->pending = calloc((size_t)nbuckets + 1, sizeof(*zp->pending));
    bg_status_t st = BG_OK;
    size_t sbytes = (owned ? owned : 1) * sizeof(float);
    if (store && store->alloc) {
        zp->store = *store;
        zp->host = store->step != NULL;
        BG_CHECK_GOTO(upload_events(zp), st, err);
        void *s = NULL;
        BG_CHECK_GOTO(store->alloc(store->arg, sbytes, "parameter shard (--offload params)", &s), st, err);
        zp->shard = s;
    } else {
        zp->shard = bg_backend_alloc(zp->be, sbytes, "parameter shard");
    }
    if (!zp->buckets || !zp->toff || !zp->soff || !zp->slot || !zp->ag || !zp->used || !zp->issued || !zp->pending ||
        !zp->shard) {
        st = bg_error(BG_ERR_NOMEM, "zero 3 parameter shard");
        goto err;
    }
    memcpy(zp->buckets, buckets, (size_t)nbuckets * sizeof(*buckets));
    for (int i = 0; i < nt; i++)
        zp->toff[i] = (size_t)(bg_model_tensor(m, i)->data - bg_model_params(m));
    for (size_t b = 0, o = 0; b < (size_t)nbuckets; b++) {
        size_t co, cl;
        bg_group_chunk(buckets[b].count, D, me, &co, &cl);
        zp->soff[b] = o;
        zp->slot[b] = -1;
        o += cl;
    }
    zp->whole = 1; /* the model's initial parameters: kept, then the flat buffer freed */
    BG_CHECK_GOTO(bg__zparams_shard_again(zp), st, err);
    for (int k = 0; k < npool; k++) /* after: the flat buffer and the gather buffers never together */
        if (!(zp->pool[k] = bg_backend_alloc(zp->be, largest * sizeof(float), "parameter gather buffer"))) {
            st = BG_ERR_NOMEM;
            goto err;
        }
    *zp_p = zp;
    return BG_OK;
err:
    bg__zparams_destroy(zp);
    return st;
}

size_t bg__zparams_owned_offset(const bg__zparams_t *zp, int b) { return zp->soff[b]; }
float *bg__zparams_shard(bg__zparams_t *zp) { return zp->shard; }
int64_t bg__zparams_waits(const bg__zparams_t *zp) { return zp ? zp->waits : 0; }
int64_t bg__zparams_gathers(const bg__zparams_t *zp) { return zp ? zp->gathers : 0; }

void bg__zparams_gather_seconds(const bg__zparams_t *zp, double *gather_s, double *exposed_s)
{
    *gather_s = zp ? zp->gather_s : 0;
    *exposed_s = zp ? zp->exposed_s : 0;
}

size_t bg__zparams_bytes(const bg__zparams_t *zp)
{
    size_t shard = zp->store.alloc ? 0 : zp->owned ? zp->owned : 1; /* an offloaded shard is not the backend's */
    return (shard + (size_t)zp->npool * zp->pool_count) * sizeof(float);
}

void bg__zparams_cancel(bg__zparams_t *zp)
{
    for (int b = 0; zp && b < zp->nbuckets; b++) {
        bg__xfree(zp->ag[b]);
        zp->ag[b] = NULL;
        upload_done(zp, b); /* the copy stream no longer reads the shard nor writes the pool */
    }
    for (int i = 0; zp && i < zp->npending; i++) { /* never gathered: gathered again when next needed */
        aim(zp, zp->pending[i], NULL);
        zp->slot[zp->pending[i]] = -1;
    }
    if (zp)
        zp->npending = 0;
}

/* Before the model: its tensors' data are aimed at the pool or at its own buffer. */
void bg__zparams_destroy(bg__zparams_t *zp)
{
    if (!zp)
        return;
    bg__zparams_cancel(zp);
    for (int b = 0; zp->slot && b < zp->nbuckets; b++)
        if (zp->slot[b] >= 0)
            aim(zp, b, NULL);
    for (int k = 0; k < PPOOL; k++)
        bg_backend_free(zp->be, zp->pool[k]);
    for (int b = 0; zp->up && b < zp->nbuckets; b++)
        if (zp->up[b])
            zp->be->ops->event_destroy(zp->be, zp->up[b]);
    free(zp->up);
    free(zp->uploading);
    free(zp->pending);
    if (zp->store.alloc)
        zp->store.release(zp->store.arg, zp->shard);
    else
        bg_backend_free(zp->be, zp->shard);
    free(zp->buckets);
    free(zp->toff);
    free(zp->soff);
    free(zp->slot);
    free(zp->ag);
    free(zp->used);
    free(zp->issued);
    free(zp);
}
