/* transport/comm.c: the world communicator's life: bootstrap, the store
 * (server on rank 0, client everywhere), the UCX context, worker and
 * endpoints, starting the communication thread, teardown, and the comm's
 * plain queries. Endpoints use UCP_ERR_HANDLING_MODE_NONE so that shared
 * memory stays the path between ranks on one machine; failures are detected
 * by the liveness connection to the store and by deadlines (liveness.c), and
 * handled by cancelling or abandoning the affected UCX requests (engine.c;
 * docs/transport.md). It calls engine.c, liveness.c (the thread's body),
 * comm_store.c, bootstrap.c and the store; none of those calls it back, and
 * it must not post transfers or handle a failure itself. */
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

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
 * host's. Without it, a forced teardown (after a failure) pushes it for the
 * worker's destruction only, so that UCX's "unexpected tag-receive descriptor
 * ... was not matched" (messages of a failed job nobody will receive) stays
 * off the user's terminal, and pops it only if nobody pushed one meanwhile.
 * The variables below are process-wide for that reason. */
static atomic_int bg__ucs_quiet; /* > 0 while a forced teardown destroys a worker */
static atomic_int bg__ucs_installed; /* the handler is installed for the process */

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
static void bg__ucs_install(void)
{
    ucs_log_push_handler(bg__ucs_log);
    atomic_store(&bg__ucs_installed, 1);
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
    c->left_at = malloc((size_t)c->size * sizeof(*c->left_at));
    if (!c->dead || !c->eps || !c->left_at) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate per-rank tables for %d ranks", c->size);
        goto err_free;
    }
    for (int r = 0; r < c->size; r++)
        c->left_at[r] = -1;
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
    free(c->left_at);
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
    unsigned pushed = 0;
    if (!graceful) {
        atomic_fetch_add(&bg__ucs_quiet, 1);
        if (!atomic_load(&bg__ucs_installed)) {
            ucs_log_push_handler(bg__ucs_log);
            pushed = ucs_log_num_handlers();
        }
    }
    if (c->worker)
        ucp_worker_destroy(c->worker);
    c->worker = NULL;
    for (bg_request_t *r = c->pending, *nx; r; r = nx) {
        nx = r->next;
        r->ucx = NULL;
        bg__pending_del(c, r);
        if (r->user_freed)
            free(r);
        /* else the user still holds it; it reports done (it failed) */
    }
    if (c->ctx)
        ucp_cleanup(c->ctx);
    if (pushed && ucs_log_num_handlers() == pushed) /* still the newest: ours */
        ucs_log_pop_handler();
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
    free(c->left_at);
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
