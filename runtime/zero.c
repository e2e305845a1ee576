/* runtime/zero.c: sharded data parallelism for one model chunk (ZeRO stages
 * 1 and 2, docs/data_parallel.md). The D replicas of a stage cut every
 * gradient bucket the way the ring collectives do (bg_group_chunk): replica
 * d owns chunk d of each bucket. A bucket's gradients are reduce-scattered
 * (the first half of the ring all-reduce, so the owned sums are bit for bit
 * those of --zero 0); each replica updates its owned parameters with the
 * optimizer state it alone holds (1/D of it); the parameters are then
 * all-gathered bucket by bucket without blocking, and waited for before the
 * chunk's next forward. Level 2 also gives the gradient buffer back between
 * the optimizer step and the next step's backward.
 *
 * Owns: the shard's optimizer state and the all-gather requests. Must not
 * know schedules or pipelines (the executor calls it per chunk). */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "runtime/zero.h"

typedef struct piece {
    int tensor;      /* index in the model */
    size_t off, len; /* floats of the flat buffers */
    size_t soff;     /* floats of the shard's optimizer state */
} piece_t;

struct bg__zero {
    int level;
    bg_model_t *m;
    bg_backend_t *be;
    bg_group_t *dp;
    int D, me;
    bg__zero_bucket_t *buckets;
    int *whole;      /* per bucket: all-reduced (holds a tied tensor) */
    bg_request_t **ag; /* per bucket: the parameters' all-gather in flight */
    int nbuckets;
    piece_t *pieces;
    int npieces;
    size_t owned;
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

/* The owned range of every bucket cut at tensor boundaries (weight decay is per tensor). */
static bg_status_t make_pieces(bg__zero_t *z)
{
    int nt = bg_model_num_tensors(z->m);
    const float *base = bg_model_params(z->m);
    z->pieces = calloc((size_t)(z->nbuckets * (nt + 1) + 1), sizeof(piece_t));
    BG_ALLOC_CHECK(z->pieces, sizeof(piece_t), "shard pieces");
    for (int b = 0; b < z->nbuckets; b++) {
        size_t co, cl;
        bg_group_chunk(z->buckets[b].count, z->D, z->me, &co, &cl);
        size_t lo = z->buckets[b].off + co, hi = lo + cl;
        for (int i = 0; i < nt && lo < hi; i++) {
            bg_param_t *p = bg_model_tensor(z->m, i);
            size_t to = (size_t)(p->data - base), te = to + p->numel;
            size_t a = lo > to ? lo : to, e = hi < te ? hi : te;
            if (a >= e)
                continue;
            z->pieces[z->npieces++] = (piece_t){.tensor = i, .off = a, .len = e - a, .soff = z->owned};
            z->owned += e - a;
        }
    }
    return BG_OK;
}

bg_status_t bg__zero_create(int level, bg_model_t *m, bg_group_t *dp, const bg__zero_bucket_t *buckets, int nbuckets,
                            bg_optim_kind_t kind, bg__zero_t **z_p)
{
    if (bg_model_optim_state(m, 0))
        return bg_error(BG_ERR_INTERNAL, "zero: the model already holds its full optimizer state");
    bg__zero_t *z = calloc(1, sizeof(*z));
    BG_ALLOC_CHECK(z, sizeof(*z), "zero state");
    bg_status_t st = BG_OK;
    z->level = level;
    z->m = m;
    z->be = bg_model_backend(m);
    z->dp = dp;
    z->D = bg_group_size(dp);
    z->me = bg_group_rank(dp);
    z->kind = kind;
    z->nbuckets = nbuckets;
    z->buckets = calloc((size_t)nbuckets + 1, sizeof(*z->buckets));
    z->whole = calloc((size_t)nbuckets + 1, sizeof(int));
    z->ag = calloc((size_t)nbuckets + 1, sizeof(*z->ag));
    if (!z->buckets || !z->whole || !z->ag) {
        st = bg_error(BG_ERR_NOMEM, "zero buckets");
        goto err;
    }
    memcpy(z->buckets, buckets, (size_t)nbuckets * sizeof(*buckets));
    for (int b = 0; b < nbuckets; b++)
        z->whole[b] = holds_tie(bg_model_desc(m), buckets[b].lo, buckets[b].hi);
    BG_CHECK_GOTO(make_pieces(z), st, err);
    size_t n = z->owned ? z->owned : 1;
    z->sm = bg_backend_alloc(z->be, n * sizeof(float), "optimizer state shard (first moment)");
    if (!z->sm) {
        st = BG_ERR_NOMEM;
        goto err;
    }
    z->be->ops->fill(z->be, z->sm, 0.0f, n);
    if (kind == BG_OPTIM_ADAMW) {
        z->sv = bg_backend_alloc(z->be, n * sizeof(float), "optimizer state shard (second moment)");
        if (!z->sv) {
            st = BG_ERR_NOMEM;
            goto err;
        }
        z->be->ops->fill(z->be, z->sv, 0.0f, n);
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
        bg_request_free(z->ag[b]);
        z->ag[b] = NULL;
    }
}

void bg__zero_destroy(bg__zero_t *z)
{
    if (!z)
        return;
    bg__zero_cancel(z);
    bg_backend_free(z->be, z->sm);
    bg_backend_free(z->be, z->sv);
    free(z->buckets);
    free(z->whole);
    free(z->ag);
    free(z->pieces);
    free(z);
}

size_t bg__zero_owned(const bg__zero_t *z) { return z->owned; }

bg_status_t bg__zero_reduce(bg__zero_t *z, int b, bg_request_t **req_p)
{
    float *buf = bg_model_grads(z->m) + z->buckets[b].off;
    if (z->whole[b])
        return bg_group_iallreduce(z->dp, buf, z->buckets[b].count, BG_REDUCE_SUM, req_p);
    return bg_group_ireduce_scatter_inplace(z->dp, buf, z->buckets[b].count, BG_REDUCE_SUM, req_p);
}

bg_status_t bg__zero_begin_step(bg__zero_t *z)
{
    return z->level >= 2 ? bg_model_grads_hold(z->m, 1) : BG_OK;
}

double bg__zero_tensor_sumsq(bg__zero_t *z, int i)
{
    const float *g = bg_model_grads(z->m);
    double s = 0;
    for (int k = 0; g && k < z->npieces; k++)
        if (z->pieces[k].tensor == i)
            s += z->be->ops->sumsq(z->be, g + z->pieces[k].off, z->pieces[k].len);
    return s;
}

static bg_status_t start_gathers(bg__zero_t *z, float *flat)
{
    for (int b = 0; b < z->nbuckets; b++)
        if (z->buckets[b].count && z->D > 1)
            BG_CHECK(bg_group_iallgather_chunks(z->dp, flat + z->buckets[b].off, z->buckets[b].count, &z->ag[b]));
    return BG_OK;
}

bg_status_t bg__zero_step(bg__zero_t *z, const bg_optim_config_t *opt, int t)
{
    if (opt->kind != z->kind)
        return bg_error(BG_ERR_INVALID, "optimizer changed between steps");
    bg_backend_t *be = z->be;
    float *params = bg_model_params(z->m), *grads = bg_model_grads(z->m);
    if (!grads)
        return bg_error(BG_ERR_INTERNAL, "zero: optimizer step without gradients");
    for (int k = 0; k < z->npieces; k++) {
        const piece_t *pc = &z->pieces[k];
        float wd = bg_model_tensor(z->m, pc->tensor)->decay ? opt->weight_decay : 0.0f;
        if (z->kind == BG_OPTIM_ADAMW)
            be->ops->adamw(be, params + pc->off, grads + pc->off, z->sm + pc->soff, z->sv + pc->soff, pc->len,
                           opt->lr, opt->beta1, opt->beta2, opt->eps, wd, t);
        else
            be->ops->sgd_momentum(be, params + pc->off, grads + pc->off, z->sm + pc->soff, pc->len, opt->lr,
                                  opt->momentum, wd);
    }
    be->ops->synchronize(be); /* the gathers read what the update wrote */
    if (z->level >= 2)
        BG_CHECK(bg_model_grads_hold(z->m, 0));
    return start_gathers(z, params);
}

bg_status_t bg__zero_settle(bg__zero_t *z)
{
    bg_status_t st = BG_OK;
    for (int b = 0; b < z->nbuckets; b++) {
        if (!z->ag[b])
            continue;
        bg_status_t s2 = bg_wait(z->ag[b]);
        bg_request_free(z->ag[b]);
        z->ag[b] = NULL;
        if (st == BG_OK)
            st = s2;
    }
    return st;
}

/* Copy between the shard's compact state and the model's flat state. */
static void move_state(bg__zero_t *z, int to_model)
{
    for (int which = 0; which < (z->kind == BG_OPTIM_ADAMW ? 2 : 1); which++) {
        float *full = bg_model_optim_state(z->m, which), *sh = which ? z->sv : z->sm;
        for (int k = 0; k < z->npieces; k++) {
            const piece_t *pc = &z->pieces[k];
            if (to_model)
                z->be->ops->copy(z->be, full + pc->off, sh + pc->soff, pc->len);
            else
                z->be->ops->copy(z->be, sh + pc->soff, full + pc->off, pc->len);
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

bg_status_t bg__zero_gather_state(bg__zero_t *z)
{
    BG_CHECK(bg__zero_settle(z));
    BG_CHECK(bg__zero_expand_state(z));
    for (int which = 0; which < (z->kind == BG_OPTIM_ADAMW ? 2 : 1); which++) {
        BG_CHECK(start_gathers(z, bg_model_optim_state(z->m, which)));
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
