/* runtime/strat_ep.c: expert parallelism (params.ep = P > 1, docs/executor.md):
 * the P consecutive data-parallel ranks of a stage [k P, (k+1) P) form an
 * expert-parallel group, over which the model's MoE layers (built for ep P)
 * spread their experts and exchange their tokens (the group's alltoallv, as
 * ctx->ep); the description is bound to it before the chunks' models exist,
 * so each rank initialises and loads only its experts' slices. A bucket's
 * gradients are reduced in runs of tensors: the replicated ones over the
 * whole data-parallel group, as the dp strategy does, the experts' over the
 * dp / P ranks that hold the same experts (none when P = dp). Under
 * --emulate the stages run no layer, so this module runs each MoE layer's
 * all-to-alls itself before an emulated forward or backward, with the
 * messages and bytes the layer's cost model expects (bg_layer_tp_cost:
 * uniform routing, nothing dropped). On a backend whose buffers the
 * executor stages (device memory, or BRIGADE_STAGING=always) each all-to-all
 * is staged through host memory of the calling lane: the send buffer copied
 * out (to_host, ordered after the compute that wrote it), the transport's
 * all-to-all on the host copies, each member's received rows copied back
 * (from_host, ordered before the compute that reads them): the same bytes
 * in the same places, so bitwise the host run. It must not touch the
 * interpreter's slots. */
#include <stdlib.h>

#include "core/check.h"
#include "runtime/devcoll.h"
#include "runtime/exec_impl.h"
#include "runtime/staging.h"
#include "runtime/tp.h"

#define EP_MAX_EMU 64 /* members of an emulated group at most (the counts live on the stack) */

typedef struct {
    bg_tp_comm_t c;      /* the group as the layers see it */
    bg_group_t *ep[2];   /* the P ranks holding every expert between them: lane 0 (and outside a pair), lane 1 */
    bg_group_t *rep;     /* the dp / P ranks holding the same experts (NULL: P = dp) */
    bg__dcoll_t *rep_coll; /* rep's collectives on the backend's buffers, as dp_coll is dp_group's */
    bg__xfer_t **extra;  /* this step's reductions beyond each bucket's first, waited for before the optimizer */
    int nextra, cap;
    float *emu[2];       /* --emulate: each lane's all-to-alls' send and receive buffers (zeros), emu_n floats each
                          * (a lane's exchange may be in flight while the other's grows its buffers) */
    size_t emu_n[2];
    uint64_t *bytes_sent; /* the step's point-to-point bytes (the executor's): the all-to-alls' pairwise sends */
    exec_t *x;            /* its staging (the all-to-alls' waits), trace (made after the strategies) and step:
                           * each all-to-all is an "ep_a2a" event */
    float *host[2];       /* staged backends: each lane's host copies of an all-to-all's send and receive rows */
    size_t host_n[2];     /* their floats */
} ep_t;

static int ep_active(const exec_t *x) { return x->p.ep > 1; }

/* Wait for @p req and free it; inside the executor's coroutine pair (BRIGADE_TP_OVERLAP=microbatch) the other
 * lane runs while it is not complete, as a tensor group's sum waits (runtime/tp.c). */
static bg_status_t ep_wait(const ep_t *e, bg_request_t *req)
{
    bg__xfer_t *x;
    BG_CHECK(bg__xwrap(&e->x->stg, req, &x));
    return bg__tp_pair_wait(x);
}

/* The calling lane's group: each lane's exchanges match in order on every member, whichever order the lanes
 * interleave in. */
static bg_group_t *lane_group(const ep_t *e) { return e->ep[bg__pair_lane()]; }

static bg_status_t ep_allgather(void *arg, const float *send, float *recv, size_t count)
{
    bg_request_t *r;
    BG_CHECK(bg_group_iallgather(lane_group(arg), send, recv, count, BG_F32, &r));
    return ep_wait(arg, r);
}

/* The calling lane's host buffer of at least n floats (kept for the next all-to-all; one per lane, though the
 * executor pairs no instructions on a backend that queues work today). */
static float *host_rows(ep_t *e, size_t n)
{
    int lane = bg__pair_lane();
    if (n <= e->host_n[lane])
        return e->host[lane];
    size_t bytes = n * sizeof(float);
    float *p = bg__host_alloc(e->x->be, bytes);
    if (!p) {
        bg_error(BG_ERR_NOMEM, "expert-parallel all-to-all staged through host memory: %zu bytes", bytes);
        return NULL;
    }
    if (!e->host[0] && !e->host[1])
        bg_log(BG_LOG_INFO, "executor", "rank %d: the expert-parallel all-to-alls staged through host memory",
               e->x->lay.rank);
    bg__host_free(e->x->be, e->host[lane]);
    e->host[lane] = p, e->host_n[lane] = n;
    return p;
}

/* The group's all-to-all on host buffers, waited for. */
static bg_status_t host_alltoallv(ep_t *e, const float *send, const size_t *sc, const size_t *sd, float *recv,
                                  const size_t *rc, const size_t *rd)
{
    bg_request_t *r;
    BG_CHECK(bg_group_ialltoallv(lane_group(e), send, sc, sd, recv, rc, rd, BG_F32, &r));
    return ep_wait(e, r);
}

/* The all-to-all of backend buffers staged through the lane's host buffer: each member's rows out, the
 * transport's all-to-all on the copies, each member's rows back. */
static bg_status_t staged_alltoallv(ep_t *e, const float *send, const size_t *sc, const size_t *sd, float *recv,
                                    const size_t *rc, const size_t *rd)
{
    bg_backend_t *be = e->x->be;
    size_t ns = 0, nr = 0;
    for (int d = 0; d < e->c.size; d++) {
        ns = sd[d] + sc[d] > ns ? sd[d] + sc[d] : ns;
        nr = rd[d] + rc[d] > nr ? rd[d] + rc[d] : nr;
    }
    float *hs = host_rows(e, ns + nr), *hr = hs + ns;
    if (!hs)
        return BG_ERR_NOMEM;
    for (int d = 0; d < e->c.size; d++)
        if (sc[d])
            be->ops->to_host(be, hs + sd[d], send + sd[d], sc[d] * sizeof(float));
    BG_CHECK(host_alltoallv(e, hs, sc, sd, hr, rc, rd));
    for (int d = 0; d < e->c.size; d++)
        if (rc[d])
            be->ops->from_host(be, recv + rd[d], hr + rd[d], rc[d] * sizeof(float));
    return BG_OK;
}

static bg_status_t ep_alltoallv(void *arg, const float *send, const size_t *sendcounts, const size_t *sdispls,
                                float *recv, const size_t *recvcounts, const size_t *rdispls)
{
    ep_t *e = arg;
    for (int d = 0; d < e->c.size; d++)
        *e->bytes_sent += d == e->c.rank ? 0 : sendcounts[d] * sizeof(float);
    double t0 = bg_now();
    bg_status_t st = e->x->stg.on && !e->x->em /* --emulate: its own host buffers, no layer runs */
                         ? staged_alltoallv(e, send, sendcounts, sdispls, recv, recvcounts, rdispls)
                         : host_alltoallv(e, send, sendcounts, sdispls, recv, recvcounts, rdispls);
    if (e->x->trace)
        bg__trace_event(e->x->trace, "ep_a2a", -1, -1, t0, bg_now(), (int)e->x->step + 1);
    return st;
}

static void ep_destroy(exec_t *x, void *self)
{
    ep_t *e = self;
    if (!e)
        return;
    for (int i = 0; i < e->nextra; i++)
        bg__xfree(e->extra[i]);
    free(e->extra);
    free(e->emu[0]);
    free(e->emu[1]);
    bg__host_free(e->x->be, e->host[0]);
    bg__host_free(e->x->be, e->host[1]);
    if (bg_model_desc_ep(x->desc) == &e->c)
        bg_model_desc_set_ep(x->desc, NULL);
    if (x->ep_coll == e->rep_coll)
        x->ep_coll = NULL;
    bg__dcoll_destroy(e->rep_coll);
    bg_group_destroy(e->ep[0]);
    bg_group_destroy(e->ep[1]);
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
    bg_status_t st = bg_group_create(x->comm, P, r, &e->ep[0]);
    if (st == BG_OK) /* lane 1's: created whether or not the executor pairs instructions, the same on every member */
        st = bg_group_create(x->comm, P, r, &e->ep[1]);
    if (st == BG_OK && D > P) {
        for (int j = 0; j < D / P; j++)
            r[j] = dp[me % P + j * P];
        st = bg_group_create(x->comm, D / P, r, &e->rep);
        if (st == BG_OK)
            st = bg__dcoll_create(&x->stg, e->rep, "expert replicas", x->lay.rank, &e->rep_coll);
    }
    free(dp);
    e->c = (bg_tp_comm_t){.size = P, .rank = me - first, .allgather = ep_allgather, .alltoallv = ep_alltoallv,
                          .arg = e};
    e->bytes_sent = &x->bytes_sent;
    e->x = x;
    if (st == BG_OK)
        st = bg_model_desc_set_ep(x->desc, &e->c);
    x->ep_coll = e->rep_coll;
    if (st != BG_OK) {
        ep_destroy(x, e);
        return st;
    }
    *self_p = e;
    return BG_OK;
}

/* Start the sum of floats [lo, hi) of ch's gradients over dc (NULL: nothing to sum). */
static bg_status_t start_run(ep_t *e, chunk_t *ch, bg__bucket_t *bk, bg__dcoll_t *dc, size_t lo, size_t hi)
{
    if (!dc || hi <= lo)
        return BG_OK;
    bg__xfer_t *rq;
    BG_CHECK(bg__dcoll_start(dc, BG__COLL_ALLREDUCE, NULL, bg_model_grads(ch->model) + lo, hi - lo, BG_REDUCE_SUM,
                             &rq));
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
    for (size_t run = bk->off, end; run < bk->off + bk->count; run = end) {
        int expert;
        end = bg__exec_bucket_run(ch, b, run, &expert);
        BG_CHECK(start_run(e, ch, bk, expert ? e->rep_coll : x->dp_coll, run, end));
    }
    bg__exec_trace_bucket(x, ch, b);
    return BG_OK;
}

/* --emulate: n all-to-alls of `bytes` in all from this member, an equal share to each other member. */
static bg_status_t emulate_exchanges(ep_t *e, double msgs, double bytes)
{
    int P = e->c.size, n = (int)(msgs / (P - 1) + 0.5);
    if (n < 1)
        return BG_OK;
    size_t each = (size_t)(bytes / n / (P - 1) / sizeof(float) + 0.5), need = each * (size_t)P;
    int lane = bg__pair_lane();
    if (need > e->emu_n[lane]) {
        float *b = calloc(2 * need, sizeof(float));
        if (!b)
            return bg_error(BG_ERR_NOMEM, "emulated all-to-all of %zu floats", need);
        free(e->emu[lane]);
        e->emu[lane] = b, e->emu_n[lane] = need;
    }
    size_t c[4 * EP_MAX_EMU];
    if (P > EP_MAX_EMU)
        return bg_error(BG_ERR_UNSUPPORTED, "--emulate with ep %d: at most %d members emulated", P, EP_MAX_EMU);
    for (int d = 0; d < P; d++) {
        c[d] = c[2 * P + d] = d == e->c.rank ? 0 : each;
        c[P + d] = c[3 * P + d] = (size_t)d * each;
    }
    for (int i = 0; i < n; i++)
        BG_CHECK(ep_alltoallv(e, e->emu[lane], c, c + P, e->emu[lane] + e->emu_n[lane], c + 2 * P, c + 3 * P));
    return BG_OK;
}

/* One layer's all-to-alls before an emulated compute of kind (bg__exec_layer_costs). */
static bg_status_t emulate_layer(void *self, bg_sched_op_kind_t kind, const bg_tp_cost_t *cost)
{
    return kind == BG_OP_FORWARD ? emulate_exchanges(self, cost->ep_fwd_msgs, cost->ep_fwd_bytes)
                                 : emulate_exchanges(self, cost->ep_bwd_msgs, cost->ep_bwd_bytes);
}

/* --emulate: before an emulated F, B or b, the chunk's MoE layers' all-to-alls in layer order. */
static bg_status_t ep_before_compute(exec_t *x, void *self, chunk_t *ch, int mb, bg_sched_op_kind_t kind)
{
    if (!x->em || kind == BG_OP_BACKWARD_WEIGHT)
        return BG_OK;
    return bg__exec_layer_costs(x, ch, mb, kind, emulate_layer, self);
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
    .before_compute = ep_before_compute,
    .reduce = ep_reduce,
    .before_optimizer = ep_before_optimizer,
    .cancel = ep_cancel,
    .destroy = ep_destroy,
};
