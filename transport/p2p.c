/* transport/p2p.c: the public request API: posting point-to-point
 * transfers (bg_isend, bg_irecv, bg_send, bg_recv) with their argument
 * checks, and bg_test, bg_wait, bg_cancel, bg_request_free for every request
 * kind, collectives included, with the comm's timeout on a wait. It calls
 * engine.c and comm.c (endpoints); in transport/ only coll.c calls it (to
 * wait for and free requests). It must not reach into UCX's requests except
 * through the engine. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/check.h"
#include "transport/transport_impl.h"

/* Called by API threads when they leave the worker: the communication thread
 * holds off for a moment (see bg__comm_thread). */
static inline void bg__api_touch(bg_comm_t *c)
{
    atomic_store_explicit(&c->last_api_ns, (long long)(bg_now() * 1e9), memory_order_relaxed);
}

/* ---- point-to-point API ----------------------------------------------------------------- */

static bg_status_t bg__p2p(bg_comm_t *c, bg__rq_kind_t kind, int peer, uint32_t tag, void *buf,
                           size_t bytes, bg_request_t **req_p)
{
    if (!c || !req_p || (!buf && bytes))
        return bg_error(BG_ERR_INVALID, "%s: NULL communicator, request or buffer",
                        kind == BG__RQ_SEND ? "bg_isend" : "bg_irecv");
    if (peer < 0 || peer >= c->size)
        return bg_error(BG_ERR_INVALID, "%s: peer %d is not a rank of the world of %d",
                        kind == BG__RQ_SEND ? "bg_isend" : "bg_irecv", peer, c->size);
    BG_CHECK(bg__peer_status(c, peer, ""));
    if (kind == BG__RQ_SEND)
        BG_CHECK(bg__ensure_ep(c, peer));
    atomic_fetch_add(&c->demand, 1);
    bg__lock(c);
    bg_status_t st = bg__post_locked(c, kind, peer, tag, 0, buf, bytes, NULL, req_p);
    bg__unlock(c);
    bg__api_touch(c);
    atomic_fetch_sub(&c->demand, 1);
    bg__kick(c);
    return st;
}

bg_status_t bg_isend(bg_comm_t *c, int peer, uint32_t tag, const void *buf, size_t bytes,
                     bg_request_t **req_p)
{
    return bg__p2p(c, BG__RQ_SEND, peer, tag, (void *)buf, bytes, req_p);
}

bg_status_t bg_irecv(bg_comm_t *c, int peer, uint32_t tag, void *buf, size_t bytes,
                     bg_request_t **req_p)
{
    return bg__p2p(c, BG__RQ_RECV, peer, tag, buf, bytes, req_p);
}

static bg_status_t bg__result(bg_request_t *r)
{
    if (r->status < 0) {
        atomic_store(&r->comm->fail_told, 1);
        return bg_error(r->status, "%s", r->msg);
    }
    return BG_OK;
}

static void bg__expire_locked(bg_comm_t *c, bg_request_t *r, unsigned progressed);

bg_status_t bg_test(bg_request_t *r, int *done_p)
{
    if (!r || !done_p)
        return bg_error(BG_ERR_INVALID, "bg_test: NULL request or output");
    if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
        bg_comm_t *c = r->comm;
        atomic_fetch_add(&c->demand, 1);
        bg__lock(c);
        bg__expire_locked(c, r, bg__progress_locked(c)); /* a test loop ends too, past the timeout */
        bg__unlock(c);
        bg__api_touch(c);
        atomic_fetch_sub(&c->demand, 1);
    }
    if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
        *done_p = 0;
        return BG_OK;
    }
    *done_p = 1;
    return bg__result(r);
}

static const char *bg__what(const bg_request_t *r)
{
    return r->kind == BG__RQ_SEND ? "send to" : r->kind == BG__RQ_RECV ? "receive from" : "collective";
}

/* Fail request r if nothing progressed this round and it is older than the timeout. */
static void bg__expire_locked(bg_comm_t *c, bg_request_t *r, unsigned progressed)
{
    if (progressed || atomic_load(&r->done) || bg_now() - r->t_start <= c->timeout_s)
        return;
    if (r->kind == BG__RQ_COLL) {
        c->coll_ops->fail_locked(r->coll, BG_ERR_TIMEOUT, NULL);
    } else {
        char m[300];
        snprintf(m, sizeof(m), "%s rank %d (tag %u, %zu bytes) did not complete within %.0f s (BRIGADE_TIMEOUT); "
                 "rank %d is alive but silent", bg__what(r), r->peer, r->tag, r->bytes, c->timeout_s, r->peer);
        bg__fail_locked(c, r, BG_ERR_TIMEOUT, m);
    }
}

bg_status_t bg_wait(bg_request_t *r)
{
    if (!r)
        return bg_error(BG_ERR_INVALID, "bg_wait: NULL request");
    bg_comm_t *c = r->comm;
    if (!atomic_load_explicit(&r->done, memory_order_acquire)) {
        atomic_fetch_add(&c->demand, 1);
        int idle = 0;
        while (!atomic_load_explicit(&r->done, memory_order_acquire)) {
            bg__lock(c);
            unsigned n = bg__progress_locked(c);
            bg__expire_locked(c, r, n);
            bg__unlock(c);
            idle = n ? 0 : idle + 1;
            if (idle > 32)
                sched_yield();
        }
        bg__api_touch(c);
        atomic_fetch_sub(&c->demand, 1);
    }
    return bg__result(r);
}

bg_status_t bg_cancel(bg_request_t *r)
{
    if (!r)
        return bg_error(BG_ERR_INVALID, "bg_cancel: NULL request");
    bg_comm_t *c = r->comm;
    bg__lock(c);
    if (!atomic_load(&r->done)) {
        char m[200];
        snprintf(m, sizeof(m), "%s rank %d (tag %u) was cancelled", bg__what(r), r->peer, r->tag);
        if (r->kind == BG__RQ_COLL)
            c->coll_ops->fail_locked(r->coll, BG_ERR_CANCELED, "collective cancelled");
        else if (r->kind == BG__RQ_SEND && r->ucx)
            /* UCX may be unable to cancel a send already in flight: then it
             * completes normally, and until then the buffer is still read */
            ucp_request_cancel(c->worker, r->ucx);
        else
            bg__fail_locked(c, r, BG_ERR_CANCELED, m);
    }
    bg__unlock(c);
    return BG_OK;
}

size_t bg_request_bytes(const bg_request_t *r)
{
    return r && atomic_load(&r->done) && r->status == BG_OK ? r->recvd : 0;
}

void bg_request_free(bg_request_t *r)
{
    if (!r)
        return;
    bg_comm_t *c = r->comm;
    bg__lock(c);
    if (r->kind == BG__RQ_COLL) {
        /* freeing fails it first when it is still pending */
        c->coll_ops->free(r->coll);
        free(r);
    } else {
        bg__request_release_locked(r);
    }
    bg__unlock(c);
}

bg_status_t bg_send(bg_comm_t *c, int peer, uint32_t tag, const void *buf, size_t bytes)
{
    bg_request_t *r;
    BG_CHECK(bg_isend(c, peer, tag, buf, bytes, &r));
    bg_status_t st = bg_wait(r);
    bg_request_free(r);
    return st;
}

bg_status_t bg_recv(bg_comm_t *c, int peer, uint32_t tag, void *buf, size_t bytes)
{
    bg_request_t *r;
    BG_CHECK(bg_irecv(c, peer, tag, buf, bytes, &r));
    bg_status_t st = bg_wait(r);
    bg_request_free(r);
    return st;
}
