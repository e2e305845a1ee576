/* runtime/staging.c: transfers of backend buffers between ranks, staged
 * through host memory when the backend's buffers are device memory (see
 * staging.h). */
#include "runtime/staging.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/core.h"
#include "core/check.h"

typedef enum { XF_SEND, XF_RECV, XF_COLL } xf_kind_t;

struct bg__xfer {
    bg__staging_t *sg; /* NULL: direct (one request on the caller's buffer) */
    bg__staging_t *pg; /* the staging whose queue its tests and waits progress (direct ones too) */
    xf_kind_t kind;
    char *dev;         /* the backend buffer */
    char *host;        /* staging block (staged only) */
    size_t bytes, chunk;
    int n, landed;     /* requests; those complete (receive, reduction: their data sent on to dev) */
    int failed;        /* a request failed: keep the host block */
    /* with streams (sg->async); without, every request starts at once (started = n) */
    int started;       /* requests started: a send's chunk i, a reduction's collective, once ev[i] completed */
    int queued;        /* in sg's queue of transfers waiting for their copies */
    bg_status_t err;   /* starting a request failed (in bg__staging_progress) */
    bg_comm_t *comm;   /* what a request started later needs */
    bg_group_t *group;
    int peer;
    uint32_t tag;
    bg_reduce_op_t op;
    bg__coll_kind_t ck; /* a collective's kind */
    size_t count;       /* its count (bg__xcoll) */
    const char *src;    /* a collective's input on the backend (copied to host + src_off, src_bytes) */
    size_t src_off, src_bytes, dst_off; /* its result: host + dst_off, bytes, copied to dev */
    bg_event_t *prod;  /* compute stream: after the producer (send, reduction) or the buffer's earlier users (receive) */
    bg_event_t *back;  /* copy stream: after the last host-to-device copy (receive, reduction); NULL: none queued */
    int joined;        /* the compute stream waits for back */
    struct bg__xfer *next; /* in sg's queue */
    bg_request_t **rq; /* n, after the struct */
    bg_event_t **ev;   /* n: chunk i's device-to-host copy (send, reduction) */
};

const char *bg_executor_device_transport(void)
{
#ifdef BG_UCX_CUDA_DIR
    return "handed to UCX directly (its cuda_copy and cuda_ipc transports) where UCX reports CUDA memory at run "
           "time, else staged through pinned host memory in pipelined chunks; reductions staged (this build links "
           "the CUDA-aware UCX at " BG_UCX_CUDA_DIR ")";
#else
    return "staged through pinned host memory in pipelined chunks (this build links the system UCX, which has no "
           "CUDA transports; a CUDA-aware one, the libucx-cu13 wheel, is linked when found at configure time)";
#endif
}

bg_status_t bg__staging_init(bg__staging_t *sg, bg_backend_t *be, const bg_comm_t *comm)
{
    memset(sg, 0, sizeof(*sg));
    const char *mode = bg_config_str("BRIGADE_STAGING");
    if (!strcmp(mode, "auto")) {
        sg->on = be->ops->device_buffers;
        sg->direct = sg->on && bg_comm_device_memory(comm);
    } else if (!strcmp(mode, "always")) {
        sg->on = 1;
    } else if (!strcmp(mode, "direct")) {
        sg->on = sg->direct = 1;
    } else {
        return bg_error(BG_ERR_INVALID, "BRIGADE_STAGING=\"%s\": expected auto, always or direct", mode);
    }
    long long kb = 0;
    BG_CHECK(bg_config_int("BRIGADE_STAGE_CHUNK_KB", &kb));
    if (kb < 1 || kb > (1 << 20))
        return bg_error(BG_ERR_INVALID, "BRIGADE_STAGE_CHUNK_KB=%lld: expected 1 to 1048576", kb);
    sg->chunk = (size_t)kb << 10;
    const bg_backend_ops_t *o = be->ops;
    int slots = !!o->event_create + !!o->event_destroy + !!o->event_record + !!o->event_query + !!o->event_wait +
                !!o->stream_wait + !!o->to_host_async + !!o->from_host_async;
    if (slots != 0 && slots != 8)
        return bg_error(BG_ERR_INVALID, "backend %s fills %d of the 8 stream and event slots: all or none", o->name,
                        slots);
    sg->async = sg->on && slots == 8;
    pthread_mutex_init(&sg->lock, NULL);
    sg->be = be; /* ready: bg__staging_fini has work to do */
    return BG_OK;
}

void *bg__host_alloc(bg_backend_t *be, size_t bytes)
{
    size_t sz = bytes ? bytes : 1;
    return be->ops->host_alloc ? be->ops->host_alloc(be, sz) : aligned_alloc(64, (sz + 63) & ~(size_t)63);
}

void bg__host_free(bg_backend_t *be, void *p)
{
    if (!p)
        return;
    if (be->ops->host_free)
        be->ops->host_free(be, p);
    else
        free(p);
}

static void host_release(bg__staging_t *sg, void *p) { bg__host_free(sg->be, p); }

/* ---------------------------------------------------------------- events */

/* An event from the cache, else a new one (NULL: out of memory, reported). */
static bg_event_t *ev_take(bg__staging_t *sg)
{
    if (sg->nevents)
        return sg->free_events[--sg->nevents];
    bg_event_t *ev = sg->be->ops->event_create(sg->be);
    if (!ev)
        bg_error(BG_ERR_NOMEM, "staging: backend %s cannot create an event", sg->be->ops->name);
    return ev;
}

/* Back to the cache; the caller knows it completed, or that nothing waits on
 * it any more but work queued before (an event re-recorded marks the new point). */
static void ev_give(bg__staging_t *sg, bg_event_t *ev)
{
    if (!ev)
        return;
    if (sg->nevents == sg->capevents) {
        int cap = sg->capevents ? 2 * sg->capevents : 16;
        bg_event_t **e = realloc(sg->free_events, (size_t)cap * sizeof(*e));
        if (!e) {
            sg->be->ops->event_destroy(sg->be, ev);
            return;
        }
        sg->free_events = e;
        sg->capevents = cap;
    }
    sg->free_events[sg->nevents++] = ev;
}

/* ---------------------------------------------------------------- blocks */

static void host_give(bg__staging_t *sg, void *p, size_t bytes);

/* Held blocks whose host-to-device copies have completed go back to the
 * cache (wait: every one, waiting for its copy). */
static void reap_held(bg__staging_t *sg, int wait)
{
    bg_backend_t *be = sg->be;
    for (int i = 0; i < sg->nheld;) {
        struct bg__held_block h = sg->held[i];
        if (wait)
            be->ops->event_wait(be, h.ev);
        else if (!be->ops->event_query(be, h.ev)) {
            i++;
            continue;
        }
        sg->held[i] = sg->held[--sg->nheld];
        ev_give(sg, h.ev);
        host_give(sg, h.p, h.bytes);
    }
}

void bg__staging_fini(bg__staging_t *sg)
{
    if (!sg->be)
        return;
    reap_held(sg, 1);
    for (int i = 0; i < sg->nevents; i++)
        sg->be->ops->event_destroy(sg->be, sg->free_events[i]);
    free(sg->free_events);
    free(sg->held);
    for (int i = 0; i < sg->nfree; i++)
        host_release(sg, sg->free_blocks[i].p);
    free(sg->free_blocks);
    pthread_mutex_destroy(&sg->lock);
    memset(sg, 0, sizeof(*sg));
}

/* A cached block of at least bytes (the smallest that fits), else a new one. */
static void *host_take(bg__staging_t *sg, size_t bytes)
{
    void *p = NULL;
    if (sg->nheld)
        reap_held(sg, 0);
    pthread_mutex_lock(&sg->lock);
    int best = -1;
    for (int i = 0; i < sg->nfree; i++)
        if (sg->free_blocks[i].bytes >= bytes && (best < 0 || sg->free_blocks[i].bytes < sg->free_blocks[best].bytes))
            best = i;
    if (best >= 0) {
        p = sg->free_blocks[best].p;
        sg->free_blocks[best] = sg->free_blocks[--sg->nfree];
    }
    pthread_mutex_unlock(&sg->lock);
    if (p)
        return p;
    size_t sz = bytes ? bytes : 1;
    p = bg__host_alloc(sg->be, sz);
    if (!p) {
        bg_error(BG_ERR_NOMEM, "staging transfers through host memory: %zu bytes asked (%zu held)", sz,
                 sg->host_bytes);
        return NULL;
    }
    pthread_mutex_lock(&sg->lock);
    sg->host_bytes += sz;
    if (sg->host_bytes > sg->host_peak)
        sg->host_peak = sg->host_bytes;
    pthread_mutex_unlock(&sg->lock);
    return p;
}

static void host_give(bg__staging_t *sg, void *p, size_t bytes)
{
    pthread_mutex_lock(&sg->lock);
    if (sg->nfree == sg->capfree) {
        int cap = sg->capfree ? 2 * sg->capfree : 16;
        struct bg__stage_block *b = realloc(sg->free_blocks, (size_t)cap * sizeof(*b));
        if (!b) { /* cannot cache it: give it back */
            sg->host_bytes -= bytes ? bytes : 1;
            pthread_mutex_unlock(&sg->lock);
            host_release(sg, p);
            return;
        }
        sg->free_blocks = b;
        sg->capfree = cap;
    }
    sg->free_blocks[sg->nfree].p = p;
    sg->free_blocks[sg->nfree].bytes = bytes ? bytes : 1;
    sg->nfree++;
    pthread_mutex_unlock(&sg->lock);
}

/* A block a host-to-device copy may still read: kept until ev completes
 * (waited for here when the list cannot grow). */
static void host_hold(bg__staging_t *sg, void *p, size_t bytes, bg_event_t *ev)
{
    if (sg->nheld == sg->capheld) {
        int cap = sg->capheld ? 2 * sg->capheld : 16;
        struct bg__held_block *h = realloc(sg->held, (size_t)cap * sizeof(*h));
        if (!h) {
            sg->be->ops->event_wait(sg->be, ev);
            ev_give(sg, ev);
            host_give(sg, p, bytes);
            return;
        }
        sg->held = h;
        sg->capheld = cap;
    }
    sg->held[sg->nheld++] = (struct bg__held_block){p, bytes, ev};
}

/* ------------------------------------------------------------- transfers */

/* A transfer of bytes (a collective: host_bytes of host block) on buf. A
 * point-to-point one, or a collective that only moves bytes (bytes_only),
 * is direct where the staging is (on the device buffer itself, in chunks). */
static bg_status_t xf_new(bg__staging_t *sg, xf_kind_t kind, void *buf, size_t bytes, size_t host_bytes, int n,
                          int bytes_only, bg__xfer_t **x_p)
{
    bg__xfer_t *x = calloc(1, sizeof(*x) + (size_t)n * (sizeof(bg_request_t *) + sizeof(bg_event_t *)));
    BG_ALLOC_CHECK(x, sizeof(*x), "a transfer");
    x->rq = (bg_request_t **)(x + 1);
    x->ev = (bg_event_t **)(x->rq + n);
    int direct = sg->on && sg->direct && (kind != XF_COLL || bytes_only);
    x->sg = sg->on ? sg : NULL;
    x->pg = sg;
    x->kind = kind;
    x->dev = buf;
    x->bytes = bytes;
    x->chunk = kind == XF_COLL ? (bytes ? bytes : 1) : sg->chunk;
    x->n = n;
    x->started = n; /* the streams' path says otherwise */
    if (x->sg && !direct && !(x->host = host_take(sg, host_bytes))) {
        free(x);
        return BG_ERR_NOMEM;
    }
    if (x->sg) {
        pthread_mutex_lock(&sg->lock);
        if (direct) {
            sg->direct_transfers++;
            sg->direct_bytes += bytes;
        } else {
            sg->transfers++;
            sg->chunks += (size_t)n;
            sg->bytes += bytes;
        }
        pthread_mutex_unlock(&sg->lock);
    }
    *x_p = x;
    return BG_OK;
}

static int chunks_of(const bg__staging_t *sg, size_t bytes)
{
    return !sg->on || bytes == 0 ? 1 : (int)((bytes + sg->chunk - 1) / sg->chunk);
}

static size_t chunk_len(const bg__xfer_t *x, int i)
{
    size_t off = (size_t)i * x->chunk;
    return x->bytes - off < x->chunk ? x->bytes - off : x->chunk;
}

static int async(const bg__xfer_t *x) { return x->sg && x->sg->async; }

/* Copies of some transfer queued in x's staging: waits must poll, not block. */
static int copies_queued(const bg__xfer_t *x) { return x->pg && x->pg->async && x->pg->head; }

/* A staging transfer that hands the backend's buffer to the transport (no host block). */
static int direct(const bg__xfer_t *x) { return x->sg && !x->host; }

/* The transport's collective of kind ck: in place on buf, or from send to recv (bg__coll_kind_t). */
static bg_status_t coll_start(bg_group_t *g, bg__coll_kind_t ck, float *buf, const float *send, float *recv,
                              size_t count, bg_reduce_op_t op, bg_request_t **rq_p)
{
    switch (ck) {
    case BG__COLL_ALLREDUCE:
        return bg_group_iallreduce(g, buf, count, BG_F32, op, rq_p);
    case BG__COLL_REDUCE_SCATTER_INPLACE:
        return bg_group_ireduce_scatter_inplace(g, buf, count, BG_F32, op, rq_p);
    case BG__COLL_ALLGATHER_CHUNKS:
        return bg_group_iallgather_chunks(g, buf, count, BG_F32, rq_p);
    case BG__COLL_ALLGATHER:
        return bg_group_iallgather(g, send, recv, count, BG_F32, rq_p);
    case BG__COLL_REDUCE_SCATTER:
        return bg_group_ireduce_scatter(g, send, recv, count, BG_F32, op, rq_p);
    }
    return bg_error(BG_ERR_INVALID, "staging: unknown collective %d", (int)ck);
}

/* A send's chunk i, or a collective's input: where its device-to-host copy goes, from where, how long. */
static void out_copy(const bg__xfer_t *x, int i, char **dst_p, const char **src_p, size_t *len_p)
{
    size_t off = (size_t)i * x->chunk;
    if (x->kind == XF_COLL)
        *dst_p = x->host + x->src_off, *src_p = x->src, *len_p = x->src_bytes;
    else
        *dst_p = x->host + off, *src_p = x->dev + off, *len_p = chunk_len(x, i);
}

/* A receive's chunk i, or a collective's result: where its host-to-device copy goes, from where, how long. */
static void in_copy(const bg__xfer_t *x, int i, char **dst_p, const char **src_p, size_t *len_p)
{
    size_t off = (size_t)i * x->chunk;
    if (x->kind == XF_COLL)
        *dst_p = x->dev, *src_p = x->host + x->dst_off, *len_p = x->bytes;
    else
        *dst_p = x->dev + off, *src_p = x->host + off, *len_p = chunk_len(x, i);
}

/* Request i of a staging transfer: a chunk of a send or receive, on the host copy (staged) or on dev
 * (direct); the reduction, on the host copy. */
static bg_status_t start(bg__xfer_t *x, int i)
{
    char *p = (x->host ? x->host : x->dev) + (size_t)i * x->chunk;
    if (x->kind == XF_SEND)
        return bg_isend(x->comm, x->peer, x->tag, p, chunk_len(x, i), &x->rq[i]);
    if (x->kind == XF_RECV)
        return bg_irecv(x->comm, x->peer, x->tag, p, chunk_len(x, i), &x->rq[i]);
    return coll_start(x->group, x->ck, (float *)p, (float *)(p + x->src_off), (float *)(p + x->dst_off), x->count,
                      x->op, &x->rq[0]);
}

/* The event request i starts after: its chunk's copy (staged), or the one event of a direct transfer. */
static bg_event_t *gate(const bg__xfer_t *x, int i) { return x->ev[x->host ? i : 0]; }

static void dequeue(bg__xfer_t *x)
{
    bg__staging_t *sg = x->sg;
    bg__xfer_t **pp = &sg->head, *prev = NULL;
    while (*pp && *pp != x)
        prev = *pp, pp = &(*pp)->next;
    if (*pp) {
        *pp = x->next;
        if (sg->tail == x)
            sg->tail = prev;
    }
    x->next = NULL;
    x->queued = 0;
}

void bg__staging_progress(bg__staging_t *sg)
{
    bg_backend_t *be = sg->be;
    while (sg->head) { /* in the order queued: the head's next request first */
        bg__xfer_t *x = sg->head;
        while (x->started < x->n && be->ops->event_query(be, gate(x, x->started))) {
            bg_status_t st = start(x, x->started);
            if (st != BG_OK) { /* the transfer's own test or wait reports it */
                x->err = st;
                x->failed = 1;
                break;
            }
            x->started++;
        }
        if (x->started < x->n && !x->err)
            return;
        dequeue(x);
    }
}

/* Queue a send's or reduction's device-to-host copies behind the producer,
 * or a direct transfer behind one event (a send: after the kernels that wrote
 * dev; a receive: after those queued so far, which may read it); the
 * requests start in bg__staging_progress. */
static bg_status_t queue_out(bg__xfer_t *x)
{
    bg__staging_t *sg = x->sg;
    bg_backend_t *be = sg->be;
    if (direct(x)) {
        if (!(x->ev[0] = ev_take(sg)))
            return BG_ERR_NOMEM;
        be->ops->event_record(be, x->ev[0]);
    } else {
        if (!(x->prod = ev_take(sg)))
            return BG_ERR_NOMEM;
        be->ops->event_record(be, x->prod); /* after the kernels that wrote dev */
        for (int i = 0; i < x->n; i++) {
            if (!(x->ev[i] = ev_take(sg)))
                return BG_ERR_NOMEM; /* the copies queued are joined by bg__xfree */
            char *dst;
            const char *src;
            size_t len;
            out_copy(x, i, &dst, &src, &len);
            be->ops->to_host_async(be, dst, src, len, i == 0 ? x->prod : NULL, x->ev[i]);
        }
    }
    x->started = 0;
    x->queued = 1;
    if (sg->tail)
        sg->tail->next = x;
    else
        sg->head = x;
    sg->tail = x;
    bg__staging_progress(sg);
    sg->queued++;
    sg->deferred += x->started < x->n;
    return BG_OK;
}

bg_status_t bg__xsend(bg__staging_t *sg, bg_comm_t *c, int peer, uint32_t tag, const void *buf, size_t bytes,
                      bg__xfer_t **x_p)
{
    bg__xfer_t *x;
    BG_CHECK(xf_new(sg, XF_SEND, (void *)buf, bytes, bytes, chunks_of(sg, bytes), 1, &x));
    bg_backend_t *be = sg->be;
    bg_status_t st = BG_OK;
    x->comm = c, x->peer = peer, x->tag = tag;
    if (async(x)) {
        st = queue_out(x);
    } else {
        if (direct(x))
            be->ops->synchronize(be); /* the kernels that wrote dev */
        for (int i = 0; i < x->n && st == BG_OK; i++) {
            char *dst;
            const char *src;
            size_t len;
            out_copy(x, i, &dst, &src, &len);
            if (x->host) /* chunk i is copied while chunk i-1 is on the wire */
                be->ops->to_host(be, dst, src, len);
            if (x->sg)
                st = start(x, i);
            else
                st = bg_isend(c, peer, tag, x->dev, bytes, &x->rq[i]);
        }
    }
    if (st != BG_OK) {
        x->failed = 1;
        bg__xfree(x);
        return st;
    }
    *x_p = x;
    return BG_OK;
}

bg_status_t bg__xrecv(bg__staging_t *sg, bg_comm_t *c, int peer, uint32_t tag, void *buf, size_t bytes,
                      bg__xfer_t **x_p)
{
    bg__xfer_t *x;
    BG_CHECK(xf_new(sg, XF_RECV, buf, bytes, bytes, chunks_of(sg, bytes), 1, &x));
    bg_status_t st = BG_OK;
    x->comm = c, x->peer = peer, x->tag = tag;
    if (direct(x)) { /* posted on dev once its earlier users are done */
        if (async(x))
            st = queue_out(x);
        else
            sg->be->ops->synchronize(sg->be);
    } else if (async(x)) {
        bg__staging_progress(sg);
        if ((x->prod = ev_take(sg)))
            sg->be->ops->event_record(sg->be, x->prod); /* the copies to dev wait for its earlier users */
        else
            st = BG_ERR_NOMEM;
    }
    /* equal tags: chunks match in the order sent (a queued direct receive is posted by bg__staging_progress) */
    for (int i = 0; i < x->n && st == BG_OK && !(direct(x) && async(x)); i++)
        st = x->sg ? start(x, i) : bg_irecv(c, peer, tag, x->dev, bytes, &x->rq[i]);
    if (st != BG_OK) {
        x->failed = 1;
        bg__xfree(x);
        return st;
    }
    *x_p = x;
    return BG_OK;
}

bg_status_t bg__xcoll(bg__staging_t *sg, bg_group_t *g, bg__coll_kind_t ck, const float *send, float *recv,
                      size_t count, bg_reduce_op_t op, bg__xfer_t **x_p)
{
    int n = bg_group_size(g), me = bg_group_rank(g);
    if (n < 1 || me < 0)
        return bg_error(BG_ERR_INVALID, "staging: a collective on a group this rank is not a member of");
    size_t in = count, out = count; /* floats read from the caller, written back */
    if (ck == BG__COLL_ALLGATHER)
        out = count * (size_t)n;
    else if (ck == BG__COLL_REDUCE_SCATTER)
        in = count * (size_t)n;
    int inplace = ck != BG__COLL_ALLGATHER && ck != BG__COLL_REDUCE_SCATTER;
    /* the host block: the whole buffer (in place), recv with send's slot in it (allgather), or send then
     * recv (reduce-scatter); one collective, as on host buffers: the same algorithm and summation order */
    size_t host = ck == BG__COLL_REDUCE_SCATTER ? in + out : out;
    bg__xfer_t *x;
    BG_CHECK(xf_new(sg, XF_COLL, recv, out * sizeof(float), host * sizeof(float), 1,
                    ck == BG__COLL_ALLGATHER_CHUNKS, &x));
    x->group = g, x->op = op, x->ck = ck, x->count = count;
    x->src = (const char *)(inplace ? recv : send);
    x->src_bytes = in * sizeof(float);
    x->src_off = ck == BG__COLL_ALLGATHER ? (size_t)me * count * sizeof(float) : 0;
    x->dst_off = ck == BG__COLL_REDUCE_SCATTER ? in * sizeof(float) : 0;
    bg_status_t st;
    if (async(x)) {
        st = queue_out(x);
    } else if (x->host) {
        sg->be->ops->to_host(sg->be, x->host + x->src_off, x->src, x->src_bytes);
        st = start(x, 0);
    } else { /* host buffers (or direct: the transport reads the device buffer after the kernels that wrote it) */
        if (x->sg)
            sg->be->ops->synchronize(sg->be);
        st = coll_start(g, ck, recv, send, recv, count, op, &x->rq[0]);
    }
    if (st != BG_OK) {
        x->failed = 1;
        bg__xfree(x);
        return st;
    }
    *x_p = x;
    return BG_OK;
}

bg_status_t bg__xallreduce(bg__staging_t *sg, bg_group_t *g, float *buf, size_t count, bg_reduce_op_t op,
                           bg__xfer_t **x_p)
{
    return bg__xcoll(sg, g, BG__COLL_ALLREDUCE, NULL, buf, count, op, x_p);
}

bg_status_t bg__xbcast(bg__staging_t *sg, bg_group_t *g, float *buf, size_t count, int root)
{
    if (!sg->on)
        return bg_group_bcast(g, buf, count, BG_F32, root);
    /* blocking: the collectives queued before it start first (every member starts them in one order) */
    while (sg->head) {
        bg__staging_progress(sg);
        if (sg->head)
            sched_yield();
    }
    bg_backend_t *be = sg->be;
    be->ops->synchronize(be); /* the kernels that wrote buf */
    if (sg->direct)
        return bg_group_bcast(g, buf, count, BG_F32, root);
    size_t bytes = count * sizeof(float);
    void *h = host_take(sg, bytes);
    if (!h)
        return BG_ERR_NOMEM;
    be->ops->to_host(be, h, buf, bytes);
    bg_status_t st = bg_group_bcast(g, h, count, BG_F32, root);
    if (st == BG_OK)
        be->ops->from_host(be, buf, h, bytes);
    host_give(sg, h, bytes);
    return st;
}

bg_status_t bg__xdone(bg__staging_t *sg, bg__xfer_t **x_p)
{
    bg__xfer_t *x = calloc(1, sizeof(*x));
    BG_ALLOC_CHECK(x, sizeof(*x), "a transfer");
    x->pg = sg;
    x->kind = XF_COLL; /* no request: complete (landed = n = 0) */
    *x_p = x;
    return BG_OK;
}

bg_status_t bg__xwrap(bg__staging_t *sg, bg_request_t *rq, bg__xfer_t **x_p)
{
    *x_p = NULL;
    if (!rq)
        return BG_OK;
    bg__xfer_t *x = calloc(1, sizeof(*x) + sizeof(bg_request_t *));
    if (!x) {
        bg_request_free(rq);
        return bg_error(BG_ERR_NOMEM, "out of memory: a transfer");
    }
    x->rq = (bg_request_t **)(x + 1);
    x->pg = sg;
    x->kind = XF_COLL; /* direct: x->sg NULL, nothing lands */
    x->n = x->started = 1;
    x->rq[0] = rq;
    *x_p = x;
    return BG_OK;
}

/* Request i completed: its data go to the device. With streams the copy is
 * queued on the copy stream (the first behind prod) and records back, so
 * that back always marks the latest copy queued (one copy stream: it covers
 * the earlier ones), also when the transfer is freed before its last chunk
 * landed (a cancelled receive: bg__xfree holds the host block and joins the
 * compute stream on back); after the last, the compute stream waits for it:
 * the host does not. */
static bg_status_t land(bg__xfer_t *x, int i)
{
    if (x->host && x->kind != XF_SEND) {
        bg_backend_t *be = x->sg->be;
        char *dst;
        const char *src;
        size_t len;
        in_copy(x, i, &dst, &src, &len);
        if (!async(x)) {
            be->ops->from_host(be, dst, src, len);
        } else {
            if (!x->back && !(x->back = ev_take(x->sg)))
                return BG_ERR_NOMEM;
            be->ops->from_host_async(be, dst, src, len, i == 0 ? x->prod : NULL, x->back);
            if (i == x->n - 1) {
                be->ops->stream_wait(be, x->back);
                x->joined = 1;
            }
        }
    }
    x->landed = i + 1;
    return BG_OK;
}

/* One look at the requests, landing those that completed. */
static bg_status_t xtest_once(bg__xfer_t *x, int *done_p)
{
    if (x->err)
        return x->err;
    while (x->landed < x->started) {
        int done = 0;
        bg_status_t st = bg_test(x->rq[x->landed], &done);
        if (st != BG_OK) {
            x->failed = 1;
            return st;
        }
        if (!done)
            break;
        BG_CHECK(land(x, x->landed));
    }
    *done_p = x->landed == x->n;
    return BG_OK;
}

bg_status_t bg__xtest(bg__xfer_t *x, int *done_p)
{
    if (copies_queued(x))
        bg__staging_progress(x->pg);
    return xtest_once(x, done_p);
}

bg_status_t bg__xwait(bg__xfer_t *x)
{
    for (;;) {
        int done = 0;
        if (copies_queued(x))
            bg__staging_progress(x->pg);
        BG_CHECK(xtest_once(x, &done));
        if (done)
            return BG_OK;
        if (x->landed < x->started && !copies_queued(x)) {
            /* no copy to watch: block in the transport (its deadline applies) */
            bg_status_t st = bg_wait(x->rq[x->landed]);
            if (st != BG_OK) {
                x->failed = 1;
                return st;
            }
            BG_CHECK(land(x, x->landed)); /* chunk i goes to the device while chunk i+1 arrives */
        } else {
            sched_yield(); /* copies still running: poll them and the requests */
        }
    }
}

void bg__xfree(bg__xfer_t *x)
{
    if (!x)
        return;
    int pending = x->landed < x->n;
    bg__staging_t *sg = x->sg;
    for (int i = 0; i < x->n; i++)
        bg_request_free(x->rq[i]);
    if (async(x)) {
        bg_backend_t *be = sg->be;
        if (x->queued)
            dequeue(x);
        /* copies that may still run: later work on the compute stream (a new
         * owner of dev) goes after them (cuda_pool.h) */
        if (x->back && !x->joined)
            be->ops->stream_wait(be, x->back);
        int last = -1; /* the last device-to-host copy queued (one copy stream: it covers the others) */
        while (last + 1 < x->n && x->ev[last + 1])
            last++;
        if (last >= 0 && !be->ops->event_query(be, x->ev[last]))
            be->ops->stream_wait(be, x->ev[last]);
        for (int i = 0; i <= last; i++) {
            if (be->ops->event_query(be, x->ev[i]))
                ev_give(sg, x->ev[i]);
            else
                be->ops->event_destroy(be, x->ev[i]); /* released by the backend once it completes */
        }
        ev_give(sg, x->prod); /* re-recording it later leaves the waits queued on it as they are */
    }
    if (x->host) {
        /* a send that did not complete may still be read by the transport
         * until the comm is destroyed (transport.h): its block stays */
        if (x->kind == XF_SEND && (pending || x->failed))
            bg_log(BG_LOG_DEBUG, "executor", "staging: %zu-byte block of an unfinished send left to the transport",
                   x->bytes);
        else if (x->back && !sg->be->ops->event_query(sg->be, x->back))
            host_hold(sg, x->host, x->bytes, x->back); /* a host-to-device copy still reads it */
        else {
            if (x->back)
                ev_give(sg, x->back);
            host_give(sg, x->host, x->bytes);
        }
    } else if (x->back) {
        ev_give(sg, x->back);
    }
    free(x);
}
