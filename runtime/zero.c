/* runtime/zero.c: sharded data parallelism for one model chunk (ZeRO stages
 * 1 and 2, docs/data_parallel.md). The D replicas of a stage cut every
 * gradient bucket the way the ring collectives do (bg_group_chunk): replica
 * d owns chunk d of each bucket. A bucket's gradients are reduce-scattered
 * (the first half of the ring all-reduce, so the owned sums are bit for bit
 * those of --zero 0); each replica updates its owned parameters with the
 * optimizer state it alone holds (1/D of it); the parameters are then
 * all-gathered bucket by bucket without blocking, and waited for before the
 * chunk's next forward.
 *
 * Level 2 also shards the gradients: there is no flat gradient buffer. Each
 * microbatch's backward writes a bucket's gradients into one of a few
 * (BRIGADE_ZERO_BUFFERS, fewer when they would hold what the shard saves:
 * schedule/memory.h, whose rule also sizes the buckets) buffers of the
 * largest bucket's size (zeroed before the bucket's first layer, the layers'
 * grad pointers aimed at it), which is reduce-scattered as soon as
 * the bucket's last layer is done; once it completes, the owned chunk is
 * added to the replica's gradient shard (1/D) and the buffer is free for
 * the next bucket. So only those buckets are whole, at the price of one reduce-scatter
 * per microbatch instead of one per step; the shard sums replicas first,
 * then microbatches in the order their backwards ran (deterministic, within
 * rounding of --zero 0). A bucket holding a tied tensor keeps a whole buffer
 * for the step and is all-reduced once, as at level 1 (the executor adds the
 * tie's two gradients). A chunk where even the fewest buffers, with its
 * tied buckets, would hold as much as its whole gradients runs as level 1.
 *
 * Level 3 also shards the parameters (runtime/zero_params.c): the gradients
 * as at level 2, the optimizer updating the owned parameters in their shard,
 * each layer's weights gathered before its compute instead of every bucket
 * after the step.
 *
 * Owns: the shard's optimizer state and the all-gather requests. Must not
 * know schedules or pipelines (the executor calls it per chunk). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "runtime/zero.h"
#include "schedule/memory.h"

/* Level 2: at most this many bucket buffers (BRIGADE_ZERO_BUFFERS). */
#define POOL 16

typedef struct piece {
    int tensor;      /* index in the model */
    int bucket;
    size_t off, len; /* floats of the flat buffers */
    size_t soff;     /* floats of the shard's optimizer state */
} piece_t;

struct bg__zero {
    int level;
    bg_model_t *m;
    bg_backend_t *be;
    bg_group_t *dp;
    bg__dcoll_t *dc; /* dp's collectives on the backend's buffers (runtime/devcoll.h) */
    int D, me;
    bg__zero_bucket_t *buckets;
    int *whole;      /* per bucket: all-reduced (holds a tied tensor) */
    bg__xfer_t **ag; /* per bucket: the parameters' all-gather in flight */
    /* level 2 */
    float **buf;       /* per bucket: its gradients (NULL: none now) */
    bg__xfer_t **rs; /* per bucket: the reduce-scatter of a microbatch's gradients in flight */
    size_t *soff;      /* per bucket: where its owned chunk starts in the shard */
    int64_t *rs_seq;   /* per bucket: when its reduce-scatter started (oldest first when waiting) */
    char *folded;      /* per bucket: its shard chunk holds this step's sum so far (else: the next fold copies) */
    int64_t seq;
    int64_t waits;     /* blocking waits so far (bg__zero_waits) */
    float *pool[POOL]; /* the buffers the buckets take turns in (the largest bucket's size each) */
    int *slot;         /* per bucket: the pool buffer it holds, -1 none (a whole bucket has its own) */
    size_t pool_count; /* floats of each pool buffer */
    int npool;         /* BRIGADE_ZERO_BUFFERS, or fewer (bg__zero2_buffers): 1 waits for each reduce-scatter */
    float *sg;         /* the reduced gradient shard (owned floats) */
    int nbuckets;
    piece_t *pieces;
    int npieces;
    size_t owned;
    size_t *toff;      /* per tensor: its offset in the flat buffers */
    bg__zparams_t *zp; /* level 3: the parameters' shard (NULL: whole) */
    bg_optim_kind_t kind;
    float *sm, *sv;  /* the shard's optimizer state (owned floats each; sv: AdamW only) */
};

static int holds_tie(const bg_model_desc_t *d, int lo, int hi)
{
    for (int t = 0; t < bg_model_desc_num_ties(d); t++) {
        const char *a, *b;
        bg_model_desc_tie_names(d, t, &a, &b);
        int la = bg_model_desc_tensor_layer(d, a), lb = bg_model_desc_tensor_layer(d, b);
        if ((la >= lo && la <= hi) || (lb >= lo && lb <= hi))
            return 1;
    }
    return 0;
}

/* Bucket b's owned chunk: its offset and length in the bucket (the whole bucket when this replica alone holds
 * it). */
static void owned_chunk(const bg__zero_t *z, int b, size_t *co_p, size_t *cl_p)
{
    const bg__dcoll_t *dc = z->buckets[b].dc;
    bg_group_t *g = dc ? bg__dcoll_group(dc) : NULL;
    bg_group_chunk(z->buckets[b].count, g ? bg_group_size(g) : 1, g ? bg_group_rank(g) : 0, co_p, cl_p);
}

/* Start collective ck on bucket b's floats at buf over its group (none when this replica alone holds it). */
/* host: buf is host memory beside the backend's buffers (the transport's collective on it, never the device's). */
static bg_status_t bucket_coll_on(const bg__zero_t *z, int b, bg__coll_kind_t ck, float *buf, int host,
                                  bg__xfer_t **req_p)
{
    const bg__dcoll_t *dc = z->buckets[b].dc;
    *req_p = NULL;
    if (!dc || bg_group_size(bg__dcoll_group(dc)) == 1 || !z->buckets[b].count)
        return BG_OK;
    if (host)
        return bg__dcoll_start_host(z->buckets[b].dc, ck, NULL, buf, z->buckets[b].count, BG_REDUCE_SUM, req_p);
    return bg__dcoll_start(z->buckets[b].dc, ck, NULL, buf, z->buckets[b].count, BG_REDUCE_SUM, req_p);
}

static bg_status_t bucket_coll(const bg__zero_t *z, int b, bg__coll_kind_t ck, float *buf, bg__xfer_t **req_p)
{
    return bucket_coll_on(z, b, ck, buf, 0, req_p);
}

/* The owned range of every bucket cut at tensor boundaries (weight decay is per tensor). */
static bg_status_t make_pieces(bg__zero_t *z)
{
    int nt = bg_model_num_tensors(z->m);
    const float *base = bg_model_params(z->m);
    z->toff = calloc((size_t)nt + 1, sizeof(*z->toff));
    BG_ALLOC_CHECK(z->toff, sizeof(*z->toff), "tensor offsets");
    for (int i = 0; i < nt; i++)
        z->toff[i] = (size_t)(bg_model_tensor(z->m, i)->data - base);
    z->pieces = calloc((size_t)(z->nbuckets * (nt + 1) + 1), sizeof(piece_t));
    BG_ALLOC_CHECK(z->pieces, sizeof(piece_t), "shard pieces");
    for (int b = 0; b < z->nbuckets; b++) {
        size_t co, cl;
        z->soff[b] = z->owned;
        owned_chunk(z, b, &co, &cl);
        size_t lo = z->buckets[b].off + co, hi = lo + cl;
        for (int i = 0; i < nt && lo < hi; i++) {
            size_t to = z->toff[i], te = to + bg_model_tensor(z->m, i)->numel;
            size_t a = lo > to ? lo : to, e = hi < te ? hi : te;
            if (a >= e)
                continue;
            z->pieces[z->npieces++] = (piece_t){.tensor = i, .bucket = b, .off = a, .len = e - a, .soff = z->owned};
            z->owned += e - a;
        }
    }
    return BG_OK;
}

/* Aim the grad pointers of bucket b's tensors at buf (NULL: none). */
static void aim(bg__zero_t *z, int b, float *buf)
{
    size_t lo = z->buckets[b].off, hi = lo + z->buckets[b].count;
    for (int i = 0; i < bg_model_num_tensors(z->m); i++)
        if (z->toff[i] >= lo && z->toff[i] < hi)
            bg_model_tensor(z->m, i)->grad = buf ? buf + (z->toff[i] - lo) : NULL;
}

static bg_status_t fold(bg__zero_t *z, int b);
static void bucket_sizes(const bg__zero_t *z, size_t *whole_p, size_t *inflight_p);

/* A zeroed buffer for bucket b's gradients: a whole bucket's own, or one of
 * the pool's (one being written, the others being reduced). When all are
 * taken it first waits for the oldest reduce-scatter (every replica started
 * it before getting here, so it completes). */
static bg_status_t bucket_buffer(bg__zero_t *z, int b)
{
    if (z->whole[b]) {
        z->buf[b] = bg_backend_alloc(z->be, z->buckets[b].count * sizeof(float), "gradient bucket (tied)");
        if (!z->buf[b])
            return BG_ERR_NOMEM;
    } else {
        int k = -1;
        while (k < 0) {
            int used[POOL] = {0}, oldest = -1;
            for (int q = 0; q < z->nbuckets; q++) {
                if (z->slot[q] >= 0)
                    used[z->slot[q]] = 1;
                if (z->rs[q] && (oldest < 0 || z->rs_seq[q] < z->rs_seq[oldest]))
                    oldest = q;
            }
            for (int q = 0; q < z->npool && k < 0; q++)
                if (!used[q])
                    k = q;
            if (k < 0 && oldest < 0)
                return bg_error(BG_ERR_INTERNAL, "zero: every gradient buffer taken and no reduction in flight");
            if (k < 0)
                BG_CHECK(fold(z, oldest));
        }
        z->slot[b] = k;
        z->buf[b] = z->pool[k];
    }
    z->be->ops->fill(z->be, z->buf[b], 0.0f, z->buckets[b].count);
    aim(z, b, z->buf[b]);
    return BG_OK;
}

/* Wait for rq, counting it in z->waits when it was not complete yet (bg__zero_waits). */
static bg_status_t counted_wait(bg__zero_t *z, bg__xfer_t *rq)
{
    int done = 0;
    bg_status_t st = bg__xtest(rq, &done);
    if (st == BG_OK && !done) {
        z->waits++;
        st = bg__xwait(rq);
    }
    return st;
}

/* Bucket b's reduce-scatter is done (or is waited for): its owned chunk into the shard, its buffer freed. */
static bg_status_t fold(bg__zero_t *z, int b)
{
    bg_status_t st = counted_wait(z, z->rs[b]);
    bg__xfree(z->rs[b]);
    z->rs[b] = NULL;
    if (st != BG_OK)
        return st;
    size_t co, cl;
    owned_chunk(z, b, &co, &cl);
    if (z->folded[b]) /* the shard adds the microbatches in the order their backwards ran */
        z->be->ops->residual_forward(z->be, z->sg + z->soff[b], z->sg + z->soff[b], z->buf[b] + co, cl);
    else /* the step's first: a copy, not an addition to zeros (one pass fewer, and no zeroing of the shard) */
        z->be->ops->copy(z->be, z->sg + z->soff[b], z->buf[b] + co, cl);
    z->folded[b] = 1;
    aim(z, b, NULL);
    z->slot[b] = -1; /* its pool buffer is free again */
    z->buf[b] = NULL;
    return BG_OK;
}

/* Fold every bucket whose reduce-scatter has completed. */
static bg_status_t reap(bg__zero_t *z)
{
    for (int b = 0; b < z->nbuckets; b++) {
        int done = 0;
        if (z->rs[b]) {
            BG_CHECK(bg__xtest(z->rs[b], &done));
            if (done)
                BG_CHECK(fold(z, b));
        }
    }
    return BG_OK;
}

bg_status_t bg__zero_prepare(bg__zero_t *z, int layer)
{
    if (z->level < 2)
        return BG_OK;
    for (int b = 0; b < z->nbuckets; b++) {
        if (layer < z->buckets[b].lo || layer > z->buckets[b].hi)
            continue;
        if (z->whole[b] || !z->buckets[b].count)
            return BG_OK;
        if (z->rs[b]) /* the previous microbatch's: wait, so that the shard adds microbatches in order */
            BG_CHECK(fold(z, b));
        return z->buf[b] ? BG_OK : bucket_buffer(z, b);
    }
    return BG_OK;
}

int bg__zero_per_microbatch(const bg__zero_t *z, int layer)
{
    if (z->level < 2)
        return 0;
    for (int b = 0; b < z->nbuckets; b++)
        if (layer >= z->buckets[b].lo && layer <= z->buckets[b].hi)
            return !z->whole[b];
    return 0;
}

bg_status_t bg__zero_layer_done(bg__zero_t *z, int layer)
{
    if (z->level < 2)
        return BG_OK;
    for (int b = 0; b < z->nbuckets; b++) {
        if (z->buckets[b].lo != layer || z->whole[b] || !z->buf[b])
            continue;
        BG_CHECK(bg__dcoll_start(z->dc, BG__COLL_REDUCE_SCATTER_INPLACE, NULL, z->buf[b], z->buckets[b].count,
                                 BG_REDUCE_SUM, &z->rs[b]));
        z->rs_seq[b] = z->seq++;
    }
    BG_CHECK(reap(z));
    return layer > bg_model_first_layer(z->m) ? bg__zero_prepare(z, layer - 1) : BG_OK;
}

/* Where piece k's reduced gradient is. */
static const float *piece_grad(bg__zero_t *z, int k)
{
    const piece_t *pc = &z->pieces[k];
    if (z->level < 2)
        return bg_model_grads(z->m) + pc->off;
    if (z->whole[pc->bucket])
        return z->buf[pc->bucket] + (pc->off - z->buckets[pc->bucket].off);
    return z->sg + pc->soff;
}

bg_status_t bg__zero_create(int level, bg_model_t *m, bg__dcoll_t *dc, const bg__zero_bucket_t *buckets, int nbuckets,
                            bg_optim_kind_t kind, const bg_optim_store_t *pstore, bg__zero_t **z_p)
{
    if (bg_model_optim_state(m, 0))
        return bg_error(BG_ERR_INTERNAL, "zero: the model already holds its full optimizer state");
    bg__zero_t *z = calloc(1, sizeof(*z));
    BG_ALLOC_CHECK(z, sizeof(*z), "zero state");
    bg_status_t st = BG_OK;
    int params = level >= 3; /* level 3: level 2's gradients, and the parameters sharded */
    level = level > 2 ? 2 : level;
    z->level = level;
    z->m = m;
    z->be = bg_model_backend(m);
    z->dc = dc;
    z->dp = bg__dcoll_group(dc);
    z->D = bg_group_size(z->dp);
    z->me = bg_group_rank(z->dp);
    z->kind = kind;
    z->nbuckets = nbuckets;
    z->buckets = calloc((size_t)nbuckets + 1, sizeof(*z->buckets));
    z->whole = calloc((size_t)nbuckets + 1, sizeof(int));
    z->ag = calloc((size_t)nbuckets + 1, sizeof(*z->ag));
    z->buf = calloc((size_t)nbuckets + 1, sizeof(*z->buf));
    z->rs = calloc((size_t)nbuckets + 1, sizeof(*z->rs));
    z->soff = calloc((size_t)nbuckets + 1, sizeof(*z->soff));
    z->rs_seq = calloc((size_t)nbuckets + 1, sizeof(*z->rs_seq));
    z->folded = calloc((size_t)nbuckets + 1, 1);
    z->slot = malloc(((size_t)nbuckets + 1) * sizeof(*z->slot));
    if (!z->buckets || !z->whole || !z->ag || !z->buf || !z->rs || !z->soff || !z->rs_seq || !z->folded || !z->slot) {
        st = bg_error(BG_ERR_NOMEM, "zero buckets");
        goto err;
    }
    memcpy(z->buckets, buckets, (size_t)nbuckets * sizeof(*buckets));
    int pooled = 0; /* buckets that take turns in the pool */
    for (int b = 0; b < nbuckets; b++) {
        z->whole[b] = holds_tie(bg_model_desc(m), buckets[b].lo, buckets[b].hi);
        z->slot[b] = -1;
        if (!z->whole[b] && buckets[b].count > z->pool_count)
            z->pool_count = buckets[b].count;
        pooled += !z->whole[b] && buckets[b].count;
    }
    z->npool = bg__zero2_buffers(bg__zero_buffers(), pooled, z->pool_count, bg_model_param_count(m), z->D);
    BG_CHECK_GOTO(make_pieces(z), st, err);
    size_t whole, inflight;
    bucket_sizes(z, &whole, &inflight);
    /* tied buckets are whole beside their shard: fewer buffers, and when even
     * one (or none fits at all) would cost what the shard saves, --zero 1's whole gradients */
    while (z->npool > 1 && z->owned + whole + (size_t)z->npool * z->pool_count >= bg_model_param_count(m))
        z->npool--;
    inflight = (size_t)z->npool * z->pool_count;
    if (level >= 2 && ((pooled && !z->npool) || z->owned + whole + inflight >= bg_model_param_count(m)))
        z->level = level = 1;
    size_t n = z->owned ? z->owned : 1;
    /* zeroed, from the model's optimizer store (--offload optimizer) or its backend */
    BG_CHECK_GOTO(bg_model_optim_alloc(m, n, "optimizer state shard (first moment)", &z->sm), st, err);
    if (kind == BG_OPTIM_ADAMW)
        BG_CHECK_GOTO(bg_model_optim_alloc(m, n, "optimizer state shard (second moment)", &z->sv), st, err);
    /* the parameters sharded (the flat buffer freed) before the gradient shard and buffers exist: never both */
    if (params)
        BG_CHECK_GOTO(bg__zparams_create(m, dc, buckets, nbuckets, pstore, &z->zp), st, err);
    if (level < 2) /* level 1 (or 2 that fell back to it): the whole gradients (a model made without them) */
        BG_CHECK_GOTO(bg_model_grads_hold(m, 1), st, err);
    if (level >= 2) {
        BG_CHECK_GOTO(bg_model_grads_hold(m, 0), st, err); /* whole gradients (a model made with them) freed first */
        z->sg = bg_backend_alloc(z->be, n * sizeof(float), "gradient shard");
        if (!z->sg) {
            st = BG_ERR_NOMEM;
            goto err;
        }
        for (int k = 0; k < z->npool; k++)
            if (!(z->pool[k] = bg_backend_alloc(z->be, z->pool_count * sizeof(float), "gradient bucket"))) {
                st = BG_ERR_NOMEM;
                goto err;
            }
        for (int b = 0; b < nbuckets; b++)
            if (z->whole[b] && buckets[b].count)
                BG_CHECK_GOTO(bucket_buffer(z, b), st, err);
    }
    *z_p = z;
    return BG_OK;
err:
    bg__zero_destroy(z);
    return st;
}

void bg__zero_cancel(bg__zero_t *z)
{
    for (int b = 0; z && b < z->nbuckets; b++) {
        bg__xfree(z->ag[b]);
        bg__xfree(z->rs[b]);
        z->ag[b] = z->rs[b] = NULL;
    }
    if (z)
        bg__zparams_cancel(z->zp);
}

void bg__zero_destroy(bg__zero_t *z)
{
    if (!z)
        return;
    bg__zero_cancel(z);
    bg__zparams_destroy(z->zp);
    free(z->toff);
    bg_model_optim_release(z->m, z->sm);
    bg_model_optim_release(z->m, z->sv);
    bg_backend_free(z->be, z->sg);
    for (int b = 0; z->buf && b < z->nbuckets; b++)
        if (z->buf[b]) {
            aim(z, b, NULL);
            if (z->whole && z->whole[b])
                bg_backend_free(z->be, z->buf[b]);
        }
    for (int k = 0; k < POOL; k++)
        bg_backend_free(z->be, z->pool[k]);
    free(z->slot);
    free(z->buf);
    free(z->rs);
    free(z->soff);
    free(z->rs_seq);
    free(z->folded);
    free(z->buckets);
    free(z->whole);
    free(z->ag);
    free(z->pieces);
    free(z);
}

size_t bg__zero_owned(const bg__zero_t *z) { return z->owned; }

int64_t bg__zero_waits(const bg__zero_t *z) { return z->waits + bg__zparams_waits(z->zp); }
int bg__zero_gather_seconds(const bg__zero_t *z, double *gather_s, double *exposed_s)
{
    bg__zparams_gather_seconds(z ? z->zp : NULL, gather_s, exposed_s);
    return z && z->zp;
}

int bg__zero_params_sharded(const bg__zero_t *z) { return z->zp != NULL; }

size_t bg__zero_param_bytes(const bg__zero_t *z)
{
    return z->zp ? bg__zparams_bytes(z->zp) : bg_model_param_count(z->m) * sizeof(float);
}

bg_status_t bg__zero_gather_layer(bg__zero_t *z, int layer, int ascending)
{
    return bg__zparams_layer(z->zp, layer, ascending);
}

int bg__zero_buffers(void)
{
    long long n = 3;
    if (bg_config_int("BRIGADE_ZERO_BUFFERS", &n) != BG_OK)
        n = 3;
    return n < 2 ? 2 : n > POOL ? POOL : (int)n;
}

/* Level 2: the whole buckets' floats, and the pool's. */
static void bucket_sizes(const bg__zero_t *z, size_t *whole_p, size_t *inflight_p)
{
    size_t whole = 0;
    for (int b = 0; b < z->nbuckets; b++)
        if (z->whole[b])
            whole += z->buckets[b].count;
    *whole_p = whole;
    *inflight_p = (size_t)z->npool * z->pool_count;
}

size_t bg__zero_grad_bytes(const bg__zero_t *z)
{
    if (z->level < 2)
        return bg_model_param_count(z->m) * sizeof(float);
    size_t whole, inflight;
    bucket_sizes(z, &whole, &inflight);
    /* the shard, the whole buckets, and the bucket buffers: one written, the others being reduced */
    return (z->owned + whole + inflight) * sizeof(float);
}

bg_status_t bg__zero_reduce(bg__zero_t *z, int b, bg__xfer_t **req_p)
{
    if (z->level >= 2 && !z->whole[b]) {
        *req_p = NULL; /* reduced microbatch by microbatch (bg__zero_layer_done) */
        return BG_OK;
    }
    float *buf = z->level >= 2 ? z->buf[b] : bg_model_grads(z->m) + z->buckets[b].off;
    if (!buf) {
        *req_p = NULL;
        return BG_OK;
    }
    return bucket_coll(z, b, z->whole[b] ? BG__COLL_ALLREDUCE : BG__COLL_REDUCE_SCATTER_INPLACE, buf, req_p);
}

bg_status_t bg__zero_begin_step(bg__zero_t *z)
{
    BG_CHECK(bg__zparams_shard_again(z->zp)); /* after a save, a load or an evaluation: the shard again */
    if (z->level < 2)
        return BG_OK;
    memset(z->folded, 0, (size_t)z->nbuckets); /* the shard: each bucket's first fold of the step copies */
    for (int b = 0; b < z->nbuckets; b++)
        if (z->whole[b] && z->buf[b])
            z->be->ops->fill(z->be, z->buf[b], 0.0f, z->buckets[b].count);
    return BG_OK;
}

bg_status_t bg__zero_bucket_done(bg__zero_t *z, int b, double *tsq)
{
    if (z->level >= 2 && z->rs[b])
        BG_CHECK(fold(z, b)); /* the last microbatch's reduce-scatter */
    for (int k = 0; tsq && k < z->npieces; k++)
        if (z->pieces[k].bucket == b)
            tsq[z->pieces[k].tensor] += z->be->ops->sumsq(z->be, piece_grad(z, k), z->pieces[k].len);
    return BG_OK;
}

static bg_status_t start_gather(bg__zero_t *z, int b, float *flat)
{
    return bucket_coll(z, b, BG__COLL_ALLGATHER_CHUNKS, flat + z->buckets[b].off, &z->ag[b]);
}

/* host: flat is host memory (a store's optimizer state), gathered by the transport in place. */
static bg_status_t start_gathers(bg__zero_t *z, float *flat, int host)
{
    for (int b = 0; b < z->nbuckets; b++)
        BG_CHECK(bucket_coll_on(z, b, BG__COLL_ALLGATHER_CHUNKS, flat + z->buckets[b].off, host, &z->ag[b]));
    return BG_OK;
}

void bg__zero_bucket_scale(bg__zero_t *z, int b, float k)
{
    for (int i = 0; i < z->npieces; i++)
        if (z->pieces[i].bucket == b) /* piece_grad is const for its readers; the storage is this shard's */
            z->be->ops->scale(z->be, (float *)piece_grad(z, i), k, z->pieces[i].len);
}

bg_status_t bg__zero_bucket_step(bg__zero_t *z, int b, const bg_optim_config_t *opt, int t)
{
    if (opt->kind != z->kind)
        return bg_error(BG_ERR_INVALID, "optimizer changed between steps");
    bg_backend_t *be = z->be;
    /* the owned parameters: in the flat buffer, or (level 3) at the shard's offsets, whose gathered copy is
     * dropped first (gathered again when a layer of the bucket next computes; an upload reading the
     * host-held shard is waited for before the host writes it) */
    float *params = z->zp ? bg__zparams_shard(z->zp) : bg_model_params(z->m);
    bg__zparams_release(z->zp, b);
    for (int k = 0; k < z->npieces; k++) {
        const piece_t *pc = &z->pieces[k];
        if (pc->bucket != b)
            continue;
        const float *g = piece_grad(z, k);
        float *w = params + (z->zp ? pc->soff : pc->off);
        float wd = bg_model_tensor(z->m, pc->tensor)->decay ? opt->weight_decay : 0.0f;
        BG_CHECK(bg_model_optim_update(z->m, opt, wd, t, w, g, z->sm + pc->soff,
                                       z->sv ? z->sv + pc->soff : NULL, pc->len));
    }
    be->ops->synchronize(be); /* the gather reads what the update wrote */
    return z->zp ? BG_OK : start_gather(z, b, params);
}

bg_status_t bg__zero_settle(bg__zero_t *z)
{
    bg_status_t st = BG_OK;
    for (int b = 0; b < z->nbuckets; b++) {
        if (!z->ag[b])
            continue;
        bg_status_t s2 = counted_wait(z, z->ag[b]);
        bg__xfree(z->ag[b]);
        z->ag[b] = NULL;
        if (st == BG_OK)
            st = s2;
    }
    return st;
}

bg_status_t bg__zero_whole(bg__zero_t *z)
{
    BG_CHECK(bg__zero_settle(z));
    return bg__zparams_materialize(z->zp);
}

/* Copy between the shard's compact state and the model's flat state: the backend's copies, or memcpy where
 * both are a store's host memory (--offload optimizer: the model allocates both from its store). */
static void move_state(bg__zero_t *z, int to_model)
{
    int host = bg_model_optim_on_host(z->m);
    for (int which = 0; which < (z->kind == BG_OPTIM_ADAMW ? 2 : 1); which++) {
        float *full = bg_model_optim_state(z->m, which), *sh = which ? z->sv : z->sm;
        for (int k = 0; k < z->npieces; k++) {
            const piece_t *pc = &z->pieces[k];
            float *dst = to_model ? full + pc->off : sh + pc->soff;
            const float *src = to_model ? sh + pc->soff : full + pc->off;
            if (host)
                memcpy(dst, src, pc->len * sizeof(float));
            else
                z->be->ops->copy(z->be, dst, src, pc->len);
        }
    }
    z->be->ops->synchronize(z->be);
}

bg_status_t bg__zero_expand_state(bg__zero_t *z)
{
    BG_CHECK(bg_model_optim_init(z->m, z->kind));
    move_state(z, 1);
    return BG_OK;
}

/* The whole flat state from every replica's owned chunks, bucket by bucket: the backend's collectives, or
 * the transport's on the host memory itself where a store holds the state (no device kernel, no staging). */
bg_status_t bg__zero_gather_state(bg__zero_t *z)
{
    BG_CHECK(bg__zero_whole(z)); /* level 3: the parameters too */
    BG_CHECK(bg__zero_expand_state(z));
    int host = bg_model_optim_on_host(z->m);
    for (int which = 0; which < (z->kind == BG_OPTIM_ADAMW ? 2 : 1); which++) {
        BG_CHECK(start_gathers(z, bg_model_optim_state(z->m, which), host));
        BG_CHECK(bg__zero_settle(z));
    }
    return BG_OK;
}

void bg__zero_take_state(bg__zero_t *z)
{
    if (!bg_model_optim_state(z->m, 0))
        return;
    move_state(z, 0);
    bg_model_optim_free(z->m);
}
