/* transport/engine.c: the request engine. It owns the comm's lock, the list
 * of requests UCX owns, posting tagged transfers, their completion (UCX's
 * callbacks), failing or releasing a request, suspects awaiting the liveness
 * verdict, progress, and the comm's scratch buffers and abandoned buffers.
 * It is the bottom of the transport's call graph: it calls no other
 * transport file (collectives are reached only through the bg__coll_ops_t
 * table, the liveness verdict only through the comm's fields), and it must
 * not touch the store, the communication thread or the public API's argument
 * checks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "transport/transport_impl.h"

void bg__lock(bg_comm_t *c) { pthread_mutex_lock(&c->lock); }
void bg__unlock(bg_comm_t *c) { pthread_mutex_unlock(&c->lock); }

/* Wake the communication thread. Not used on the hot path: a wake-up costs a
 * syscall and a context switch per operation (measured: 8-byte ping-pong went
 * from 0.7 to 34 us with it, on 2 vCPUs); the idle thread polls every
 * millisecond instead, so background progress starts at most 1 ms late. */
void bg__kick(bg_comm_t *c)
{
    if (atomic_load(&c->sleeping) > 1) {
        uint64_t one = 1;
        ssize_t w = write(c->wake_fd, &one, sizeof(one));
        (void)w;
    }
}

void *bg__scratch_get(bg_comm_t *c, size_t bytes, size_t *got_p)
{
    pthread_mutex_lock(&c->scratch_lock);
    int best = -1;
    for (int i = 0; i < 8; i++)
        if (c->scratch[i] && c->scratch_bytes[i] >= bytes &&
            (best < 0 || c->scratch_bytes[i] < c->scratch_bytes[best]))
            best = i;
    void *p = NULL;
    if (best >= 0) {
        p = c->scratch[best];
        *got_p = c->scratch_bytes[best];
        c->scratch[best] = NULL;
    }
    pthread_mutex_unlock(&c->scratch_lock);
    if (!p) {
        p = malloc(bytes ? bytes : 1);
        *got_p = bytes;
    }
    return p;
}

void bg__scratch_put(bg_comm_t *c, void *p, size_t bytes)
{
    if (!p)
        return;
    pthread_mutex_lock(&c->scratch_lock);
    int slot = -1;
    for (int i = 0; i < 8 && slot < 0; i++)
        if (!c->scratch[i])
            slot = i;
    if (slot < 0) { /* full: replace the smallest if this one is bigger */
        int sm = 0;
        for (int i = 1; i < 8; i++)
            if (c->scratch_bytes[i] < c->scratch_bytes[sm])
                sm = i;
        if (c->scratch_bytes[sm] < bytes) {
            free(c->scratch[sm]);
            slot = sm;
        }
    }
    if (slot >= 0) {
        c->scratch[slot] = p;
        c->scratch_bytes[slot] = bytes;
        p = NULL;
    }
    pthread_mutex_unlock(&c->scratch_lock);
    free(p);
}

void bg__leak_locked(bg_comm_t *c, void *p)
{
    if (!p)
        return;
    if (c->nleaks == c->capleaks) {
        int cap = c->capleaks ? 2 * c->capleaks : 16;
        void **l = realloc(c->leaks, (size_t)cap * sizeof(*l));
        if (!l)
            return; /* leaking is the fallback anyway */
        c->leaks = l;
        c->capleaks = cap;
    }
    c->leaks[c->nleaks++] = p;
}

bg_status_t bg__peer_status(bg_comm_t *c, int peer, const char *during)
{
    if (!atomic_load(&c->failed))
        return BG_OK;
    if (peer < 0 || (peer < c->size && c->dead[peer])) {
        atomic_store(&c->fail_told, 1);
        return bg_error(BG_ERR_PEER, "%s", c->fail_msg);
    }
    return BG_OK;
}

/* ---- requests ------------------------------------------------------------------ */

static void bg__pending_add(bg_comm_t *c, bg_request_t *r)
{
    r->prev = NULL;
    r->next = c->pending;
    if (c->pending)
        c->pending->prev = r;
    c->pending = r;
}

void bg__pending_del(bg_comm_t *c, bg_request_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else if (c->pending == r)
        c->pending = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

static void bg__complete_locked(bg_request_t *r, bg_status_t st, const char *msg)
{
    if (atomic_load(&r->done))
        return;
    r->status = st;
    if (st < 0 && msg)
        snprintf(r->msg, sizeof(r->msg), "%s", msg);
    atomic_store_explicit(&r->done, 1, memory_order_release);
    atomic_fetch_sub(&r->comm->active, 1);
    if (r->parent)
        r->comm->coll_ops->sub_done_locked(r->parent, r);
}

/* Resolve a suspect request (see bg__ucx_done) with a final status. */
static void bg__suspect_resolve(bg_request_t *r, bg_status_t st, const char *msg)
{
    bg_comm_t *c = r->comm;
    r->suspect = 0;
    c->nsuspects--;
    bg__pending_del(c, r);
    bg__complete_locked(r, st, msg);
}

/* UCX is done with the request (completed, cancelled or failed). */
static void bg__ucx_done(bg_request_t *r, void *ucx_req, ucs_status_t us)
{
    bg_comm_t *c = r->comm;
    r->ucx = NULL;
    r->ucx_released = 1;
    ucp_request_free(ucx_req);
    if ((us == UCS_ERR_IO_ERROR || us == UCS_ERR_CONNECTION_RESET || us == UCS_ERR_ENDPOINT_TIMEOUT ||
         us == UCS_ERR_UNREACHABLE) && !atomic_load(&r->done) && !r->user_freed) {
        /* This is how a transfer with a process that died looks from here (or with
         * one that just exited after seeing another rank die). The liveness channel
         * will say which rank died, within milliseconds; until then keep it pending. */
        r->suspect = 1;
        r->ucs_err = us;
        double g = bg__live_timeout(c);
        r->suspect_until = bg_now() + (g < 2 ? g : 2);
        c->nsuspects++;
        return;
    }
    bg__pending_del(c, r);
    if (us == UCS_OK) {
        bg__complete_locked(r, BG_OK, NULL);
    } else if (!atomic_load(&r->done)) {
        char m[256];
        bg_status_t st = BG_ERR_TRANSPORT;
        if (us == UCS_ERR_CANCELED) {
            st = BG_ERR_CANCELED;
            snprintf(m, sizeof(m), "%s rank %d (tag %u, %zu bytes) was cancelled",
                     r->kind == BG__RQ_SEND ? "send to" : "receive from", r->peer, r->tag, r->bytes);
        } else if (us == UCS_ERR_MESSAGE_TRUNCATED) {
            snprintf(m, sizeof(m), "receive from rank %d (tag %u): the message is larger than the "
                     "%zu-byte buffer", r->peer, r->tag, r->bytes);
        } else {
            snprintf(m, sizeof(m), "%s rank %d (tag %u, %zu bytes) failed: %s",
                     r->kind == BG__RQ_SEND ? "send to" : "receive from", r->peer, r->tag, r->bytes,
                     ucs_status_string(us));
        }
        bg__complete_locked(r, st, m);
    }
    if (r->user_freed)
        free(r);
}

/* Suspects whose grace ran out without a death notice: a genuine transport error. */
static void bg__suspects_expire(bg_comm_t *c)
{
    double now = bg_now();
    for (bg_request_t *r = c->pending, *nx; r && c->nsuspects; r = nx) {
        nx = r->next;
        if (!r->suspect || now < r->suspect_until)
            continue;
        char m[256];
        snprintf(m, sizeof(m), "%s rank %d (tag %u, %zu bytes) failed: %s (and no rank was reported dead)",
                 r->kind == BG__RQ_SEND ? "send to" : "receive from", r->peer, r->tag, r->bytes,
                 ucs_status_string(r->ucs_err));
        bg__suspect_resolve(r, BG_ERR_TRANSPORT, m);
    }
}

static void bg__send_cb(void *req, ucs_status_t us, void *user)
{
    bg__ucx_done(user, req, us);
}

static void bg__recv_cb(void *req, ucs_status_t us, const ucp_tag_recv_info_t *info, void *user)
{
    bg_request_t *r = user;
    if (us == UCS_OK && info)
        r->recvd = info->length;
    bg__ucx_done(r, req, us);
}

void bg__fail_locked(bg_comm_t *c, bg_request_t *r, bg_status_t st, const char *msg)
{
    if (r->suspect) {
        bg__suspect_resolve(r, st, msg);
        return;
    }
    if (atomic_load(&r->done))
        return;
    bg__complete_locked(r, st, msg);
    if (r->ucx) {
        /* A receive is cancelled (its callback runs, now or at a later progress).
         * A rendezvous send to a dead peer may not be cancellable: it stays in the
         * list, owned by transport, and is dropped with the worker at teardown. */
        ucp_request_cancel(c->worker, r->ucx);
    }
}

bg_status_t bg__post_locked(bg_comm_t *c, bg__rq_kind_t kind, int peer, uint32_t hi, int coll,
                            void *buf, size_t bytes, bg__coll_t *parent, bg_request_t **req_p)
{
    bg_request_t *r = calloc(1, sizeof(*r));
    BG_ALLOC_CHECK(r, sizeof(*r), "a request");
    r->comm = c;
    r->kind = kind;
    r->peer = peer;
    r->tag = hi;
    r->bytes = bytes;
    r->parent = parent;
    r->t_start = bg_now();
    atomic_fetch_add(&c->active, 1);
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .user_data = r};
    void *ur;
    if (kind == BG__RQ_SEND) {
        prm.cb.send = bg__send_cb;
        ur = ucp_tag_send_nbx(c->eps[peer], buf, bytes, bg__tag(hi, coll, c->rank), &prm);
    } else {
        /* always through the callback: it reports the received length reliably */
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        prm.cb.recv = bg__recv_cb;
        prm.recv_info.tag_info = &r->info;
        ur = ucp_tag_recv_nbx(c->worker, buf, bytes, bg__tag(hi, coll, peer), ~0ull, &prm);
    }
    *req_p = r;
    if (ur == NULL) {
        if (kind == BG__RQ_RECV)
            r->recvd = r->info.length;
        bg__complete_locked(r, BG_OK, NULL);
        return BG_OK;
    }
    if (UCS_PTR_IS_ERR(ur)) {
        char m[200];
        snprintf(m, sizeof(m), "%s rank %d (%zu bytes) failed to start: %s",
                 kind == BG__RQ_SEND ? "send to" : "receive from", peer, bytes,
                 ucs_status_string(UCS_PTR_STATUS(ur)));
        bg__complete_locked(r, BG_ERR_TRANSPORT, m);
        return BG_OK;
    }
    /* A receive that finds its message already here completes inside
     * ucp_tag_recv_nbx (NO_IMM_CMPL): the callback has run and freed `ur`.
     * Keeping `ur` would leave the request on the pending list for the
     * communicator's lifetime (one per such receive: the heap grew by a
     * request per step) holding a freed UCX request. Only a suspect (a
     * failure awaiting the liveness verdict) stays listed, without `ur`. */
    if (r->ucx_released) {
        if (r->suspect)
            bg__pending_add(c, r);
        return BG_OK;
    }
    r->ucx = ur;
    bg__pending_add(c, r);
    return BG_OK;
}

void bg__request_release_locked(bg_request_t *r)
{
    if (!r)
        return;
    if (r->suspect)
        bg__suspect_resolve(r, BG_ERR_CANCELED, "freed while pending");
    if (r->ucx && !atomic_load(&r->done))
        bg__fail_locked(r->comm, r, BG_ERR_CANCELED, "freed while pending");
    if (r->ucx) {
        r->user_freed = 1; /* freed by the callback, or with the worker */
        return;
    }
    free(r);
}

unsigned bg__progress_locked(bg_comm_t *c)
{
    unsigned n = 0, k;
    int spins = 0;
    while ((k = ucp_worker_progress(c->worker)) != 0 && spins++ < 64)
        n += k;
    if (c->nsuspects)
        bg__suspects_expire(c);
    if (c->colls)
        c->coll_ops->advance_locked(c);
    return n;
}
