/* transport/comm.c: the world communicator: bootstrap, the store (server on
 * rank 0, client everywhere), UCX context/worker/endpoints, point-to-point
 * requests, the communication thread (background progress + liveness) and
 * teardown. Endpoints use UCP_ERR_HANDLING_MODE_NONE so that shared memory
 * stays the path between ranks on one machine; failures are detected by the
 * liveness connection to the store and by deadlines, and handled here by
 * cancelling or abandoning the affected UCX requests (docs/transport.md). */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <stdarg.h>

#include <ucs/debug/log_def.h>

#include "core/check.h"
#include "transport/transport_impl.h"

#define BG__UCS_CHECK(call, what)                                                        \
    do {                                                                                  \
        ucs_status_t bg__us = (call);                                                     \
        if (bg__us != UCS_OK)                                                             \
            return bg_error(BG_ERR_TRANSPORT, "%s failed: %s", (what),                    \
                            ucs_status_string(bg__us));                                   \
    } while (0)

void bg__lock(bg_comm_t *c) { pthread_mutex_lock(&c->lock); }
void bg__unlock(bg_comm_t *c) { pthread_mutex_unlock(&c->lock); }

/* Called by API threads when they leave the worker: the communication thread
 * holds off for a moment (see bg__comm_thread). */
static inline void bg__api_touch(bg_comm_t *c)
{
    atomic_store_explicit(&c->last_api_ns, (long long)(bg_now() * 1e9), memory_order_relaxed);
}

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

static void bg__list_add(bg_comm_t *c, bg_request_t *r)
{
    r->prev = NULL;
    r->next = c->pending;
    if (c->pending)
        c->pending->prev = r;
    c->pending = r;
}

static void bg__list_del(bg_comm_t *c, bg_request_t *r)
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

static double bg__live_timeout(const bg_comm_t *c);

/* Resolve a suspect request (see bg__ucx_done) with a final status. */
static void bg__suspect_resolve(bg_request_t *r, bg_status_t st, const char *msg)
{
    bg_comm_t *c = r->comm;
    r->suspect = 0;
    c->nsuspects--;
    bg__list_del(c, r);
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
    bg__list_del(c, r);
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
            bg__list_add(c, r);
        return BG_OK;
    }
    r->ucx = ur;
    bg__list_add(c, r);
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

/* ---- failure handling -------------------------------------------------------------- */

/* A peer failed (or the store was lost: rank = -1, every operation fails). */
static void bg__peer_failed(bg_comm_t *c, int rank, const char *why)
{
    char msg[BG__ERR_MSG_MAX];
    if (rank >= 0 && strncmp(why, "stopped on an error", 19) == 0)
        snprintf(msg, sizeof(msg), "rank %d %s", rank, why);
    else if (rank >= 0)
        snprintf(msg, sizeof(msg), "rank %d died (%s)", rank, why);
    else
        snprintf(msg, sizeof(msg), "%s", why);
    bg__lock(c);
    if (rank >= 0 && rank < c->size) {
        if (c->dead[rank]) {
            bg__unlock(c);
            return;
        }
        c->dead[rank] = 1;
    } else {
        memset(c->dead, 1, (size_t)c->size);
        c->dead[c->rank] = 0;
    }
    if (!atomic_load(&c->failed))
        snprintf(c->fail_msg, sizeof(c->fail_msg), "%s", msg);
    atomic_store(&c->failed, 1);
    bg_log(BG_LOG_ERROR, "transport", "%s: failing the operations that involve it", msg);
    /* collectives first: they fail as a whole with the collective's name */
    if (c->colls)
        c->coll_ops->fail_peer_locked(c, rank, msg);
    for (bg_request_t *r = c->pending, *nx; r; r = nx) {
        nx = r->next;
        if (rank >= 0 && r->peer != rank && !r->suspect)
            continue;
        char m[BG__ERR_MSG_MAX];
        snprintf(m, sizeof(m), "%.*s during %s rank %d (tag %u, %zu bytes)", (int)(sizeof(m) - 96), msg,
                 r->kind == BG__RQ_SEND ? "send to" : "receive from", r->peer, r->tag, r->bytes);
        bg__fail_locked(c, r, BG_ERR_PEER, m);
    }
    bg__unlock(c);
}

bg_status_t bg_comm_abort(bg_comm_t *c, const char *why)
{
    if (!c)
        return BG_OK;
    bg__lock(c);
    if (!atomic_load(&c->failed))
        snprintf(c->fail_msg, sizeof(c->fail_msg), "this rank stopped on an error: %s", why ? why : "");
    atomic_store(&c->failed, 1);
    int first = c->abort_msg[0] == '\0';
    if (first)
        snprintf(c->abort_msg, sizeof(c->abort_msg), "%s", why && *why ? why : "(no message)");
    bg__unlock(c);
    if (!first || c->size == 1 || c->live.fd < 0)
        return BG_OK;
    atomic_store(&c->abort_pending, 1);
    bg__kick(c);
    /* the host may exit right after this: wait (briefly) until it is sent */
    double deadline = bg_now() + 2;
    while (atomic_load(&c->abort_pending) && bg_now() < deadline) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return BG_OK;
}

/* ---- the communication thread ---------------------------------------------------- */

/* Silence after which the store (or a rank, on the store's side) counts as dead. */
static double bg__live_timeout(const bg_comm_t *c)
{
    double t = c->timeout_s / 2, min = 5 * c->heartbeat_ms / 1000.0;
    return t > min ? t : min;
}

static void bg__live_poll(bg_comm_t *c)
{
    if (c->live.fd < 0)
        return;
    if (atomic_load(&c->abort_pending)) { /* bg_comm_abort: tell the store, which tells the others */
        size_t len;
        uint8_t *m = bg__msg_encode(BG__OP_FAIL, 0, 0, NULL, 0, c->abort_msg, strlen(c->abort_msg), &len);
        if (m) {
            bg__write_all(c->live.fd, m, len, bg_now() + 1);
            free(m);
        }
        atomic_store(&c->abort_pending, 0);
    }
    double now = bg_now();
    if (now - c->last_sent >= c->heartbeat_ms / 1000.0) {
        size_t len;
        uint8_t *m = bg__msg_encode(BG__OP_HB, 0, 0, NULL, 0, NULL, 0, &len);
        if (m) {
            ssize_t w = send(c->live.fd, m, len, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
            free(m);
        }
        c->last_sent = now;
    }
    int r = bg__rd_fill(&c->live.rd, c->live.fd);
    if (r > 0)
        c->last_heard = now;
    for (;;) {
        bg__store_hdr_t h;
        const uint8_t *k, *v;
        int m = bg__rd_peek(&c->live.rd, &h, &k, &v);
        if (m <= 0) {
            if (m < 0)
                r = -1;
            break;
        }
        if (h.op == BG__OP_DEAD) {
            char why[BG_STORE_ABORT_MAX + 64]; /* the store's "stopped on an error: " + the whole message */
            size_t n = h.val_len < sizeof(why) - 1 ? h.val_len : sizeof(why) - 1;
            memcpy(why, v, n);
            why[n] = '\0';
            bg__peer_failed(c, (int)h.arg, why);
        }
        bg__rd_pop(&c->live.rd);
    }
    if (r < 0) {
        bg__store_close(&c->live);
        bg__peer_failed(c, -1, "rank 0 died (store connection closed)");
    } else if (now - c->last_heard > bg__live_timeout(c)) {
        char why[128];
        snprintf(why, sizeof(why), "rank 0 died (no heartbeat from the store for %.1f s)",
                 now - c->last_heard);
        bg__store_close(&c->live);
        bg__peer_failed(c, -1, why);
    }
}

/* The communication thread's naps while operations are in flight and nothing
 * moves (bg__comm_thread). */
#define BG__NAP_MIN_NS 20000L
#define BG__NAP_MAX_NS 1000000L

static void *bg__comm_thread(void *arg)
{
    bg_comm_t *c = arg;
    double last_live = 0;
    int idle = 0;
    while (!atomic_load(&c->stop)) {
        double now = bg_now();
        int active = atomic_load(&c->active);
        if (atomic_load(&c->demand) > 0 || active == 0) {
            /* Someone waiting drives progress itself; or nothing to do: sleep on
             * the liveness socket and the wake-up eventfd. */
            struct pollfd pfd[2] = {{.fd = c->wake_fd, .events = POLLIN},
                                    {.fd = c->live.fd, .events = POLLIN}};
            int tmo = 1;
            atomic_store(&c->sleeping, 1);
            if (atomic_load(&c->active) == active)
                poll(pfd, c->live.fd >= 0 ? 2 : 1, tmo);
            atomic_store(&c->sleeping, 0);
            if (pfd[0].revents & POLLIN) {
                uint64_t v;
                ssize_t rd = read(c->wake_fd, &v, sizeof(v));
                (void)rd;
            }
            bg__live_poll(c);
            last_live = bg_now();
            continue;
        }
        /* An API thread that was just here (posting, then about to wait) is
         * better left alone: taking the lock now would make it sleep on it. */
        if ((long long)(now * 1e9) - atomic_load(&c->last_api_ns) < 30000) {
            sched_yield();
            continue;
        }
        if (pthread_mutex_trylock(&c->lock) == 0) {
            unsigned n = bg__progress_locked(c);
            bg__unlock(c);
            idle = n ? 0 : idle < (1 << 20) ? idle + 1 : idle; /* capped: it only counts up to the nap's cap */
        }
        if (idle > 64) {
            /* Nothing moved for a while: sleep instead of spinning, so the
             * compute threads keep the cores (a thread waiting on a request
             * drives progress itself, so this costs no latency there): 20 us,
             * doubling while nothing moves, up to BG__NAP_MAX_NS. Each wake-up
             * can preempt a computing thread: on 2 vCPUs with two pipeline
             * ranks computing, a 200 us nap cost each ~1,500 preemptions a
             * second and the 1F1B pipeline 10 % of its throughput
             * (docs/transport.md). */
            long ns = BG__NAP_MIN_NS << (idle - 65 < 8 ? idle - 65 : 8);
            struct timespec ts = {0, ns < BG__NAP_MAX_NS ? ns : BG__NAP_MAX_NS};
            nanosleep(&ts, NULL);
        } else if (idle > 16)
            sched_yield();
        if (now - last_live > 0.002) {
            bg__live_poll(c);
            last_live = now;
        }
    }
    return NULL;
}

/* ---- bootstrap and teardown --------------------------------------------------------- */

/* UCX 1.13 with UCP_ERR_HANDLING_MODE_NONE turns a failed process_vm_readv/writev
 * to a peer that died (CMA, the shared-memory zero-copy path) into a fatal error
 * that aborts the survivor. That failure is exactly what our liveness channel
 * reports a moment later, so it is demoted: logged, and the transfer fails with
 * an I/O error (its request is then failed or cancelled by the liveness path).
 *
 * UCX's log handlers are process-wide, so the handler is installed only when a
 * caller asks for it (bg_comm_params_t.ucx_log_handler), once per process, and
 * never popped: ucs_log_pop_handler removes the newest handler, which may be the
 * host's. Both variables below are process-wide for that reason. */
static atomic_int bg__ucs_quiet; /* > 0 while a forced teardown destroys a worker */

static ucs_log_func_rc_t bg__ucs_log(const char *file, unsigned line, const char *function,
                                     ucs_log_level_t level, const ucs_log_component_config_t *cc,
                                     const char *message, va_list ap)
{
    (void)line;
    (void)function;
    (void)cc;
    /* a forced teardown leaves requests in UCX's pools on purpose: no warning for that */
    if (level == UCS_LOG_LEVEL_WARN && atomic_load(&bg__ucs_quiet) && file &&
        (strstr(file, "mpool.c") || strstr(file, "tag_match.c")))
        return UCS_LOG_FUNC_RC_STOP;
    if (level != UCS_LOG_LEVEL_FATAL || !file || !strstr(file, "cma_ep.c"))
        return UCS_LOG_FUNC_RC_CONTINUE;
    char buf[512];
    vsnprintf(buf, sizeof(buf), message, ap);
    if (!strstr(buf, "No such process") && !strstr(buf, "Bad address"))
        return UCS_LOG_FUNC_RC_CONTINUE;
    bg_log(BG_LOG_WARN, "ucx", "shared-memory copy from a peer that died: %s", buf);
    return UCS_LOG_FUNC_RC_STOP;
}

static pthread_once_t bg__ucs_once = PTHREAD_ONCE_INIT;
static void bg__ucs_install(void) { ucs_log_push_handler(bg__ucs_log); }

static bg_status_t bg__kv_check(void *arg)
{
    bg_comm_t *c = arg;
    return bg__peer_status(c, -1, "store");
}

/* A reconnect to the store gives up once rank 0 (the store) is known dead:
 * a refused connection then means it is gone, not busy. */
static bg_status_t bg__store_alive_check(void *arg)
{
    bg_comm_t *c = arg;
    return bg__peer_status(c, 0, "store");
}

static bg_status_t bg__ucx_init(bg_comm_t *c, int log_handler)
{
    if (log_handler)
        pthread_once(&bg__ucs_once, bg__ucs_install);
    ucp_config_t *cfg;
    BG__UCS_CHECK(ucp_config_read(NULL, NULL, &cfg), "ucp_config_read");
    const char *tls = bg_config_str("BRIGADE_UCX_TLS");
    if (tls && *tls)
        ucp_config_modify(cfg, "TLS", tls);
    /* Eager up to 256 KiB: on shared memory it is 3-6x faster than UCX's automatic
     * rendezvous threshold for 16-256 KiB messages (measured with bench p2p); UCX's
     * own variable, when set, wins. */
    const char *rt = bg_config_str("BRIGADE_UCX_RNDV_THRESH");
    if (rt && *rt && !getenv("UCX_RNDV_THRESH") &&
        ucp_config_modify(cfg, "RNDV_THRESH", rt) != UCS_OK) {
        ucp_config_release(cfg);
        return bg_error(BG_ERR_INVALID, "BRIGADE_UCX_RNDV_THRESH=\"%s\" is not a size UCX accepts", rt);
    }
    ucp_params_t up = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                       .features = UCP_FEATURE_TAG, .mt_workers_shared = 0};
    ucs_status_t us = ucp_init(&up, cfg, &c->ctx);
    ucp_config_release(cfg);
    if (us != UCS_OK)
        return bg_error(BG_ERR_TRANSPORT, "ucp_init failed: %s", ucs_status_string(us));
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SERIALIZED};
    us = ucp_worker_create(c->ctx, &wp, &c->worker);
    if (us != UCS_OK) {
        ucp_cleanup(c->ctx);
        c->ctx = NULL;
        return bg_error(BG_ERR_TRANSPORT, "ucp_worker_create failed: %s", ucs_status_string(us));
    }
    ucp_address_t *a;
    us = ucp_worker_get_address(c->worker, &a, &c->my_addr_len);
    if (us != UCS_OK)
        return bg_error(BG_ERR_TRANSPORT, "ucp_worker_get_address failed: %s", ucs_status_string(us));
    c->my_addr = malloc(c->my_addr_len);
    BG_ALLOC_CHECK(c->my_addr, c->my_addr_len, "the worker address");
    memcpy(c->my_addr, a, c->my_addr_len);
    ucp_worker_release_address(c->worker, a);
    return BG_OK;
}

bg_status_t bg__ensure_ep(bg_comm_t *c, int peer)
{
    if (c->eps[peer])
        return BG_OK;
    char key[64];
    snprintf(key, sizeof(key), "bg/ucx/%d", peer);
    uint8_t *addr = malloc(BG_STORE_MAX_VALUE);
    BG_ALLOC_CHECK(addr, BG_STORE_MAX_VALUE, "a worker address");
    size_t len = 0;
    bg_status_t st = bg_store_wait(c, key, addr, BG_STORE_MAX_VALUE, &len);
    if (st != BG_OK) {
        free(addr);
        return st;
    }
    bg__lock(c);
    if (!c->eps[peer]) {
        ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                            UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                              .address = (ucp_address_t *)addr,
                              .err_mode = UCP_ERR_HANDLING_MODE_NONE};
        ucs_status_t us = ucp_ep_create(c->worker, &ep, &c->eps[peer]);
        if (us != UCS_OK)
            st = bg_error(BG_ERR_TRANSPORT, "rank %d: cannot make an endpoint to rank %d: %s", c->rank,
                          peer, ucs_status_string(us));
    }
    bg__unlock(c);
    free(addr);
    return st;
}

static void bg__store_barrier_named(bg_comm_t *c, const char *name, double tmo, bg_status_t *st_p);

bg_status_t bg_comm_create(const bg_comm_params_t *params, bg_comm_t **comm_p)
{
    bg_comm_params_t pv = BG_COMM_PARAMS_INIT;
    const bg_comm_params_t *p = &pv;
    if (params) {
        /* a caller built against an older header passes a shorter struct: the
         * fields it lacks keep their defaults */
        if (params->size < offsetof(bg_comm_params_t, heartbeat_ms) + sizeof(int))
            return bg_error(BG_ERR_INVALID, "bg_comm_create: params.size is %zu; use BG_COMM_PARAMS_INIT",
                            params->size);
        memcpy(&pv, params, params->size < sizeof(pv) ? params->size : sizeof(pv));
        pv.size = sizeof(pv);
    }
    bg__boot_t b;
    BG_CHECK(bg__bootstrap(p, &b));
    bg_status_t st;
    bg_comm_t *c = calloc(1, sizeof(*c));
    BG_ALLOC_CHECK(c, sizeof(*c), "the communicator");
    c->rank = b.rank;
    c->size = b.size;
    c->local_rank = b.local_rank;
    c->source = b.source;
    snprintf(c->addr, sizeof(c->addr), "%s", b.addr);
    c->port = b.port;
    snprintf(c->token, sizeof(c->token), "%s", p->token ? p->token : bg_config_str("BRIGADE_JOB_TOKEN"));
    c->timeout_s = p->timeout_s;
    if (c->timeout_s <= 0 && (st = bg_config_double("BRIGADE_TIMEOUT", &c->timeout_s)) != BG_OK)
        goto err_free;
    if (c->timeout_s <= 0)
        c->timeout_s = 1e9;
    c->heartbeat_ms = p->heartbeat_ms;
    if (c->heartbeat_ms <= 0) {
        long long hb;
        if ((st = bg_config_int("BRIGADE_HEARTBEAT_MS", &hb)) != BG_OK)
            goto err_free;
        c->heartbeat_ms = hb > 0 ? (int)hb : 200;
    }
    if ((st = bg_config_int("BRIGADE_ALLREDUCE_SMALL_BYTES", &c->small_bytes)) != BG_OK)
        goto err_free;
    c->kv.fd = c->live.fd = -1;
    c->wake_fd = -1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->kv_lock, NULL);
    pthread_mutex_init(&c->scratch_lock, NULL);
    c->dead = calloc((size_t)c->size, 1);
    c->eps = calloc((size_t)c->size, sizeof(*c->eps));
    if (!c->dead || !c->eps) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate per-rank tables for %d ranks", c->size);
        goto err_free;
    }
    bg_log_set_rank(c->rank);
    double deadline = bg_now() + c->timeout_s;
    if (c->rank == 0) {
        bg__store_server_params_t sp = {.addr = c->addr, .port = c->port, .token = c->token,
                                        .world_size = c->size, .timeout_s = c->timeout_s,
                                        .heartbeat_ms = c->heartbeat_ms, .hello_timeout_s = 10};
        BG_CHECK_GOTO(bg__store_server_start(&sp, &c->server), st, err_free);
        c->port = bg__store_server_port(c->server);
    }
    BG_CHECK_GOTO(bg__store_connect(c->addr, c->port, c->token, c->rank, BG__ROLE_KV, deadline, bg__kv_check, c,
                                    &c->kv),
                  st, err_server);
    BG_CHECK_GOTO(bg__store_connect(c->addr, c->port, c->token, c->rank, BG__ROLE_LIVE, deadline, NULL, NULL,
                                    &c->live), st, err_kv);
    c->last_heard = c->last_sent = bg_now();
    c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->wake_fd < 0) {
        st = bg_error(BG_ERR_IO, "eventfd: %s", strerror(errno));
        goto err_live;
    }
    BG_CHECK_GOTO(bg__ucx_init(c, p->ucx_log_handler), st, err_efd);
    char key[64];
    snprintf(key, sizeof(key), "bg/ucx/%d", c->rank);
    BG_CHECK_GOTO(bg_store_set(c, key, c->my_addr, c->my_addr_len), st, err_ucx);
    if (pthread_create(&c->thread, NULL, bg__comm_thread, c) != 0) {
        st = bg_error(BG_ERR_INTERNAL, "cannot start the communication thread");
        goto err_ucx;
    }
    /* every rank joined (or the ones missing are named) */
    bg__store_barrier_named(c, "bg/join", deadline - bg_now(), &st);
    if (st != BG_OK) {
        char m[512];
        snprintf(m, sizeof(m), "%s", bg_last_error());
        double c_timeout = c->timeout_s;
        atomic_store(&c->failed, 1);
        bg_comm_destroy(c);
        return bg_error(st, "rank %d: not every rank joined the job at %s:%d within %.0f s: %s",
                        b.rank, b.addr, b.port, c_timeout, m);
    }
    bg_log(BG_LOG_INFO, "transport", "rank %d of %d joined (%s bootstrap, store %s:%d)", c->rank,
           c->size, c->source, c->addr, c->port);
    *comm_p = c;
    return BG_OK;
err_ucx:
    if (c->worker)
        ucp_worker_destroy(c->worker);
    if (c->ctx)
        ucp_cleanup(c->ctx);
    free(c->my_addr);
err_efd:
    close(c->wake_fd);
err_live:
    bg__store_close(&c->live);
err_kv:
    bg__store_close(&c->kv);
err_server:
    if (c->server)
        bg__store_server_stop(c->server, 0);
err_free:
    free(c->dead);
    free(c->eps);
    free(c);
    return st;
}

/* Progress until every request in @p reqs is done or @p deadline passes. */
static void bg__drain(bg_comm_t *c, void **reqs, int n, double deadline)
{
    for (;;) {
        int left = 0;
        bg__lock(c);
        ucp_worker_progress(c->worker);
        for (int i = 0; i < n; i++) {
            if (!reqs[i] || UCS_PTR_IS_ERR(reqs[i]))
                continue;
            if (ucp_request_check_status(reqs[i]) != UCS_INPROGRESS) {
                ucp_request_free(reqs[i]);
                reqs[i] = NULL;
            } else {
                left++;
            }
        }
        if (left && bg_now() > deadline) {
            /* past the deadline: release what is still in flight (UCX frees it
             * when it completes or with the worker; an unreleased request makes
             * ucp_worker_destroy abort on an assertion) */
            for (int i = 0; i < n; i++)
                if (reqs[i] && !UCS_PTR_IS_ERR(reqs[i])) {
                    ucp_request_free(reqs[i]);
                    reqs[i] = NULL;
                }
            left = 0;
        }
        bg__unlock(c);
        if (!left)
            return;
        sched_yield();
    }
}

bg_status_t bg_comm_destroy(bg_comm_t *c)
{
    if (!c)
        return BG_OK;
    bg_status_t st = BG_OK;
    int graceful = !atomic_load(&c->failed);
    /* a failure the caller has not been told of yet (a rank died after the last
     * operation, or dies during this teardown) is this call's error: a rank
     * must not report a clean finish of a job whose peer died */
    int entered_clean = graceful;
    int untold = !graceful && !atomic_load(&c->fail_told);
    char result[BG__ERR_MSG_MAX] = "";
    double grace = c->timeout_s < 30 ? c->timeout_s : 30;
    if (graceful) {
        bg__store_barrier_named(c, "bg/leave1", grace, &st);
        graceful = st == BG_OK && !atomic_load(&c->failed);
        /* a barrier that merely timed out (ranks arriving far apart) is no failure */
        if (st == BG_ERR_PEER) {
            snprintf(result, sizeof(result), "%s", bg_last_error());
            untold = 1;
        }
    }
    /* close endpoints: flush when everyone is alive, by force otherwise */
    void **closing = calloc((size_t)c->size, sizeof(void *));
    bg__lock(c);
    for (int i = 0; i < c->size; i++) {
        if (!c->eps[i])
            continue;
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = graceful ? 0 : UCP_EP_CLOSE_FLAG_FORCE};
        void *r = ucp_ep_close_nbx(c->eps[i], &prm);
        if (closing)
            closing[i] = r;
        c->eps[i] = NULL;
    }
    bg__unlock(c);
    if (closing) {
        bg__drain(c, closing, c->size, bg_now() + (graceful ? grace : 0.2));
        free(closing);
    }
    if (graceful) {
        /* keep this worker progressing while waiting for the others: a peer
         * still flushing its endpoint to us needs our acknowledgements (over
         * TCP a flush otherwise waits for the whole grace period) */
        atomic_fetch_add(&c->active, 1);
        bg__kick(c);
        bg__store_barrier_named(c, "bg/leave2", grace, &st);
        atomic_fetch_sub(&c->active, 1);
        graceful = st == BG_OK;
        if (st == BG_ERR_PEER && !untold) {
            snprintf(result, sizeof(result), "%s", bg_last_error());
            untold = 1;
        }
    }
    /* stop the communication thread, say goodbye on the liveness connection */
    if (c->wake_fd >= 0) {
        atomic_store(&c->stop, 1);
        uint64_t one = 1;
        ssize_t w = write(c->wake_fd, &one, sizeof(one));
        (void)w;
        if (c->thread)
            pthread_join(c->thread, NULL);
    }
    /* a death announced before the thread stopped counts; after its bye nothing is reported */
    if (entered_clean && atomic_load(&c->failed))
        untold = 1;
    if (untold && !result[0])
        snprintf(result, sizeof(result), "%s", c->fail_msg[0] ? c->fail_msg : "a peer failed");
    int me = c->rank;
    if (c->live.fd >= 0 && !entered_clean && !c->abort_msg[0] && c->size > 1 && !atomic_load(&c->fail_acked)) {
        /* leaving a failed job without bg_comm_abort (a peer's failure ended
         * it here): say so, or a rank still waiting on a transfer with this
         * one would learn it only from BRIGADE_TIMEOUT (a bye is a clean exit) */
        char why[BG_STORE_ABORT_MAX];
        snprintf(why, sizeof(why), "left after: %.*s", (int)(sizeof(why) - 16),
                 c->fail_msg[0] ? c->fail_msg : "a peer failed");
        size_t len;
        uint8_t *m = bg__msg_encode(BG__OP_FAIL, 0, 0, NULL, 0, why, strlen(why), &len);
        if (m) {
            bg__write_all(c->live.fd, m, len, bg_now() + 1);
            free(m);
        }
    }
    if (c->live.fd >= 0) {
        size_t len;
        uint8_t *m = bg__msg_encode(BG__OP_BYE, 0, 0, NULL, 0, NULL, 0, &len);
        if (m) {
            bg__write_all(c->live.fd, m, len, bg_now() + 1);
            free(m);
        }
        bg__store_close(&c->live);
    }
    /* requests UCX still owns (abandoned sends to dead peers) go with the worker */
    bg__lock(c);
    if (c->colls)
        c->coll_ops->fail_peer_locked(c, -1, "the communicator was destroyed while a collective was pending");
    for (bg_request_t *r = c->pending, *nx; r; r = nx) {
        nx = r->next;
        if (r->ucx && !atomic_load(&r->done))
            ucp_request_cancel(c->worker, r->ucx);
    }
    for (int i = 0; i < 4 && c->pending; i++)
        ucp_worker_progress(c->worker);
    bg__unlock(c);
    /* destroying the worker purges what is left, through the callbacks */
    if (!graceful)
        atomic_fetch_add(&bg__ucs_quiet, 1);
    if (c->worker)
        ucp_worker_destroy(c->worker);
    c->worker = NULL;
    for (bg_request_t *r = c->pending, *nx; r; r = nx) {
        nx = r->next;
        r->ucx = NULL;
        bg__list_del(c, r);
        if (r->user_freed)
            free(r);
        /* else the user still holds it; it reports done (it failed) */
    }
    if (c->ctx)
        ucp_cleanup(c->ctx);
    if (!graceful)
        atomic_fetch_sub(&bg__ucs_quiet, 1);
    for (int i = 0; i < c->nleaks; i++)
        free(c->leaks[i]);
    for (int i = 0; i < 8; i++)
        free(c->scratch[i]);
    pthread_mutex_destroy(&c->scratch_lock);
    free(c->leaks);
    bg__store_close(&c->kv);
    if (c->server)
        bg__store_server_stop(c->server, graceful ? grace : 1.0);
    if (c->wake_fd >= 0)
        close(c->wake_fd);
    free(c->my_addr);
    free(c->dead);
    free(c->eps);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->kv_lock);
    free(c);
    if (untold)
        return bg_error(BG_ERR_PEER, "rank %d: the job did not end cleanly: %s (seen while leaving the job)", me,
                        result);
    return BG_OK;
}

int bg_comm_rank(const bg_comm_t *c) { return c->rank; }
int bg_comm_size(const bg_comm_t *c) { return c->size; }
int bg_comm_local_rank(const bg_comm_t *c) { return c->local_rank; }
static char bg__ucx_version[512];
static pthread_once_t bg__ucx_version_once = PTHREAD_ONCE_INIT;
static void bg__ucx_version_init(void)
{
    Dl_info di;
    snprintf(bg__ucx_version, sizeof(bg__ucx_version), "%s (%s)", ucp_get_version_string(),
             dladdr((void *)ucp_get_version_string, &di) && di.dli_fname ? di.dli_fname : "?");
}
const char *bg_transport_ucx_version(void)
{
    pthread_once(&bg__ucx_version_once, bg__ucx_version_init);
    return bg__ucx_version;
}

int bg_comm_device_memory(const bg_comm_t *c)
{
    if (!c || !c->ctx)
        return 0;
    ucp_context_attr_t a = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(c->ctx, &a) != UCS_OK)
        return 0;
    return (a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}
double bg_comm_timeout(const bg_comm_t *c) { return c->timeout_s; }
bg_status_t bg_comm_health(bg_comm_t *c) { return bg__peer_status(c, -1, "health"); }

int bg_comm_peer_alive(bg_comm_t *c, int peer)
{
    if (peer < 0 || peer >= c->size)
        return 0;
    if (!atomic_load(&c->failed))
        return 1;
    bg__lock(c);
    int alive = !c->dead[peer];
    bg__unlock(c);
    return alive;
}

void bg_comm_acknowledge_failures(bg_comm_t *c)
{
    if (atomic_load(&c->failed)) {
        atomic_store(&c->fail_told, 1);
        atomic_store(&c->fail_acked, 1);
    }
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

/* ---- store API ----------------------------------------------------------------------- */

static bg_status_t bg__kv(bg_comm_t *c, uint8_t op, uint32_t arg, const char *key, const void *val,
                          size_t vlen, double tmo, int *st_p, uint8_t **out_p, size_t *olen_p)
{
    if (!c || !key)
        return bg_error(BG_ERR_INVALID, "store: NULL communicator or key");
    pthread_mutex_lock(&c->kv_lock);
    bg_status_t st;
    if (c->kv.fd < 0) {
        /* the stream was dropped (a timeout, or the store went away): reconnect,
         * unless rank 0 (the store) is known dead */
        st = bg__store_connect(c->addr, c->port, c->token, c->rank, BG__ROLE_KV, bg_now() + c->timeout_s,
                               bg__store_alive_check, c, &c->kv);
        c->kv.check = bg__kv_check;
        c->kv.check_arg = c;
        if (st != BG_OK) {
            pthread_mutex_unlock(&c->kv_lock);
            return st;
        }
    }
    st = bg__store_call(&c->kv, op, arg, key, val, vlen, bg_now() + tmo, st_p, out_p, olen_p);
    pthread_mutex_unlock(&c->kv_lock);
    return st;
}

bg_status_t bg_store_set(bg_comm_t *c, const char *key, const void *value, size_t bytes)
{
    int s;
    uint8_t *out = NULL;
    BG_CHECK(bg__kv(c, BG__OP_SET, 0, key, value, bytes, c->timeout_s, &s, &out, NULL));
    free(out);
    return s == BG__ST_OK ? BG_OK : bg_error(BG_ERR_TRANSPORT, "store: set \"%s\" refused", key);
}

bg_status_t bg_store_delete(bg_comm_t *c, const char *key)
{
    int s;
    uint8_t *out = NULL;
    BG_CHECK(bg__kv(c, BG__OP_DEL, 0, key, NULL, 0, c->timeout_s, &s, &out, NULL));
    free(out);
    if (s == BG__ST_NOTFOUND)
        return bg_error(BG_ERR_NOT_FOUND, "store: key \"%s\" is not set", key);
    return s == BG__ST_OK ? BG_OK : bg_error(BG_ERR_TRANSPORT, "store: delete \"%s\" refused", key);
}

static bg_status_t bg__get(bg_comm_t *c, uint8_t op, const char *key, void *value, size_t cap,
                           size_t *bytes_p)
{
    int s;
    uint8_t *out = NULL;
    size_t n = 0;
    double tmo = c->timeout_s;
    uint32_t ms = tmo * 1000 > 4e9 ? 4000000000u : (uint32_t)(tmo * 1000);
    BG_CHECK(bg__kv(c, op, ms, key, NULL, 0, tmo + 5, &s, &out, &n));
    bg_status_t st = BG_OK;
    if (s == BG__ST_OK) {
        if (value && cap)
            memcpy(value, out, n < cap ? n : cap);
        if (bytes_p)
            *bytes_p = n;
    } else if (s == BG__ST_NOTFOUND) {
        st = bg_error(BG_ERR_NOT_FOUND, "store: key \"%s\" is not set", key);
    } else if (s == BG__ST_TIMEOUT) {
        st = bg_error(BG_ERR_TIMEOUT, "store: key \"%s\" was not set within %.0f s", key, tmo);
    } else {
        st = bg_error(BG_ERR_TRANSPORT, "store: request for \"%s\" refused", key);
    }
    free(out);
    return st;
}

bg_status_t bg_store_get(bg_comm_t *c, const char *key, void *value, size_t cap, size_t *bytes_p)
{
    return bg__get(c, BG__OP_GET, key, value, cap, bytes_p);
}

bg_status_t bg_store_wait(bg_comm_t *c, const char *key, void *value, size_t cap, size_t *bytes_p)
{
    return bg__get(c, BG__OP_WAIT, key, value, cap, bytes_p);
}

bg_status_t bg_store_add(bg_comm_t *c, const char *key, int64_t delta, int64_t *value_p)
{
    int s;
    uint8_t *out = NULL;
    size_t n = 0;
    BG_CHECK(bg__kv(c, BG__OP_ADD, 0, key, &delta, 8, c->timeout_s, &s, &out, &n));
    bg_status_t st = BG_OK;
    if (s != BG__ST_OK || n != 8)
        st = bg_error(BG_ERR_TRANSPORT, "store: add on \"%s\" refused", key);
    else if (value_p)
        memcpy(value_p, out, 8);
    free(out);
    return st;
}

static void bg__store_barrier_named(bg_comm_t *c, const char *name, double tmo, bg_status_t *st_p)
{
    char key[96];
    /* generation per name: every rank calls barriers in the same order */
    int64_t g = 0;
    snprintf(key, sizeof(key), "%s/gen/%d", name, c->rank);
    bg_status_t st = bg_store_add(c, key, 1, &g);
    if (st != BG_OK) {
        *st_p = st;
        return;
    }
    snprintf(key, sizeof(key), "%s/%lld", name, (long long)g);
    uint32_t ms = tmo <= 0 ? 1 : tmo * 1000 > 4e9 ? 4000000000u : (uint32_t)(tmo * 1000);
    int s;
    uint8_t *out = NULL;
    st = bg__kv(c, BG__OP_BARRIER, (uint32_t)c->size, key, &ms, 4, tmo + 5, &s, &out, NULL);
    if (st == BG_OK && s != BG__ST_OK)
        st = bg_error(s == BG__ST_TIMEOUT ? BG_ERR_TIMEOUT : BG_ERR_TRANSPORT,
                      "store barrier \"%s\" failed after %.0f s: %s", name, tmo, out ? (char *)out : "");
    free(out);
    *st_p = st;
}

bg_status_t bg_store_barrier(bg_comm_t *c)
{
    bg_status_t st;
    bg__store_barrier_named(c, "bg/user", c->timeout_s, &st);
    return st;
}
