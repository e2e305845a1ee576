/* runtime/strat_ep.c: expert parallelism (params.ep = P > 1, docs/executor.md):
 * the P consecutive data-parallel ranks of a stage [k P, (k+1) P) form an
 * expert-parallel group, over which the model's MoE layers (built for ep P)
 * spread their experts and exchange their tokens (the group's alltoallv, as
 * ctx->ep); the description is bound to it before the chunks' models exist,
 * so each rank initialises and loads only its experts' slices. A bucket's
 * gradients are reduced in runs of tensors: the replicated ones over the
 * whole data-parallel group, as the dp strategy does, the experts' over the
 * dp / P ranks that hold the same experts (none when P = dp). It must not
 * touch the interpreter's slots. */
#include <stdlib.h>

#include "core/check.h"
#include "runtime/exec_impl.h"

typedef struct {
    bg_tp_comm_t c;      /* the group as the layers see it */
    bg_group_t *ep;      /* the P ranks holding every expert between them */
    bg_group_t *rep;     /* the dp / P ranks holding the same experts (NULL: P = dp) */
    bg__xfer_t **extra;  /* this step's reductions beyond each bucket's first, waited for before the optimizer */
    int nextra, cap;
} ep_t;

static int ep_active(const exec_t *x) { return x->p.ep > 1; }

static bg_status_t ep_allgather(void *arg, const float *send, float *recv, size_t count)
{
    return bg_group_allgather(((ep_t *)arg)->ep, send, recv, count, BG_F32);
}

static bg_status_t ep_alltoallv(void *arg, const float *send, const size_t *sendcounts, const size_t *sdispls,
                                float *recv, const size_t *recvcounts, const size_t *rdispls)
{
    return bg_group_alltoallv(((ep_t *)arg)->ep, send, sendcounts, sdispls, recv, recvcounts, rdispls, BG_F32);
}

static void ep_destroy(exec_t *x, void *self)
{
    ep_t *e = self;
    if (!e)
        return;
    for (int i = 0; i < e->nextra; i++)
        bg__xfree(e->extra[i]);
    free(e->extra);
    if (bg_model_desc_ep(x->desc) == &e->c)
        bg_model_desc_set_ep(x->desc, NULL);
    bg_group_destroy(e->ep);
    bg_group_destroy(e->rep);
    free(e);
}

static bg_status_t ep_setup(exec_t *x, void **self_p)
{
    int P = x->p.ep, D = x->lay.dp, me = x->lay.me.dp, first = me / P * P;
    ep_t *e = calloc(1, sizeof(*e));
    int *dp = malloc(2 * (size_t)D * sizeof(int));
    if (!e || !dp) {
        free(e);
        free(dp);
        return bg_error(BG_ERR_NOMEM, "expert-parallel group");
    }
    int *r = dp + D;
    bg__layout_dp_ranks(&x->lay, dp);
    for (int i = 0; i < P; i++)
        r[i] = dp[first + i];
    bg_status_t st = bg_group_create(x->comm, P, r, &e->ep);
    if (st == BG_OK && D > P) {
        for (int j = 0; j < D / P; j++)
            r[j] = dp[me % P + j * P];
        st = bg_group_create(x->comm, D / P, r, &e->rep);
    }
    free(dp);
    e->c = (bg_tp_comm_t){.size = P, .rank = me - first, .allgather = ep_allgather, .alltoallv = ep_alltoallv,
                          .arg = e};
    if (st == BG_OK)
        st = bg_model_desc_set_ep(x->desc, &e->c);
    if (st != BG_OK) {
        ep_destroy(x, e);
        return st;
    }
    *self_p = e;
    return BG_OK;
}

/* Start the sum of floats [lo, hi) of ch's gradients over g (NULL: nothing to sum). */
static bg_status_t start_run(exec_t *x, ep_t *e, chunk_t *ch, bg__bucket_t *bk, bg_group_t *g, size_t lo, size_t hi)
{
    if (!g || hi <= lo)
        return BG_OK;
    bg__xfer_t *rq;
    BG_CHECK(bg__xallreduce(&x->stg, g, bg_model_grads(ch->model) + lo, hi - lo, BG_REDUCE_SUM, &rq));
    if (!bk->req) {
        bk->req = rq;
        return BG_OK;
    }
    if (e->nextra == e->cap) {
        int cap = e->cap ? 2 * e->cap : 16;
        bg__xfer_t **n = realloc(e->extra, (size_t)cap * sizeof(*n));
        if (!n) {
            bg__xfree(rq);
            return bg_error(BG_ERR_NOMEM, "expert-parallel reductions");
        }
        e->extra = n, e->cap = cap;
    }
    e->extra[e->nextra++] = rq;
    return BG_OK;
}

/* Bucket b's runs of replicated and of expert tensors, each over its group, in the chunk's order (the same on
 * every member of a group: the members hold the same stage). */
static bg_status_t ep_reduce(exec_t *x, void *self, chunk_t *ch, int b)
{
    ep_t *e = self;
    bg__bucket_t *bk = &ch->buckets[b];
    const float *g = bg_model_grads(ch->model);
    size_t lo = bk->off, hi = bk->off + bk->count, run = lo;
    int kind = -1;
    for (int i = 0; i < bg_model_num_tensors(ch->model); i++) {
        const bg_param_t *p = bg_model_tensor(ch->model, i);
        size_t o = (size_t)(p->grad - g);
        if (!p->numel || o < lo || o >= hi)
            continue;
        if (kind >= 0 && p->split_ep != kind) {
            BG_CHECK(start_run(x, e, ch, bk, kind ? e->rep : x->dp_group, run, o));
            run = o;
        }
        kind = p->split_ep;
    }
    BG_CHECK(start_run(x, e, ch, bk, kind > 0 ? e->rep : x->dp_group, run, hi));
    bg__exec_trace_bucket(x, ch, b);
    return BG_OK;
}

static bg_status_t ep_before_optimizer(exec_t *x, void *self)
{
    (void)x;
    ep_t *e = self;
    bg_status_t st = BG_OK;
    for (int i = 0; i < e->nextra; i++) {
        if (st == BG_OK)
            st = bg__exec_wait_free(&e->extra[i]);
        bg__xfree(e->extra[i]);
        e->extra[i] = NULL;
    }
    e->nextra = 0;
    return st;
}

static void ep_cancel(exec_t *x, void *self)
{
    (void)x;
    ep_t *e = self;
    for (int i = 0; i < e->nextra; i++)
        bg__xfree(e->extra[i]);
    e->nextra = 0;
}

const bg__strategy_ops_t bg__strategy_ep = {
    .name = "ep",
    .active = ep_active,
    .setup = ep_setup,
    .reduce = ep_reduce,
    .before_optimizer = ep_before_optimizer,
    .cancel = ep_cancel,
    .destroy = ep_destroy,
};
