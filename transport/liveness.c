/* transport/liveness.c: failure detection and handling. It owns the
 * communication thread (background progress, heartbeats on the liveness
 * connection to the store, death notices from it), marking a rank failed and
 * failing every operation that involves it, bg_comm_abort, and the queries on
 * failures (bg_comm_health, bg_comm_peer_alive,
 * bg_comm_acknowledge_failures), and leave notices (a rank that stops
 * stepping before the others says so; bg_comm_announce_leave). It calls the request engine (engine.c) and
 * the store's wire format and client; it must not create or destroy the comm
 * (comm.c starts and joins its thread) nor post transfers of its own. */
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "transport/transport_impl.h"

/* ---- failure handling -------------------------------------------------------------- */

/* A peer failed (or the store was lost: rank = -1, every operation fails). */
static void bg__peer_failed(bg_comm_t *c, int rank, const char *why)
{
    char msg[BG__ERR_MSG_MAX];
    if (rank >= 0 && (strncmp(why, "stopped on an error", 19) == 0 || strncmp(why, "left the job", 12) == 0))
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

/* Hand a message to the communication thread (*pending = 1) and wait
 * (briefly) until it is sent: the host may exit right after. */
static void send_by_thread(bg_comm_t *c, atomic_int *pending)
{
    atomic_store(pending, 1);
    bg__kick(c);
    double deadline = bg_now() + 2;
    while (atomic_load(pending) && bg_now() < deadline) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
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
    send_by_thread(c, &c->abort_pending);
    return BG_OK;
}

/* ---- leave notices ------------------------------------------------------------------ */

#define POS_EPOCH(p) ((uint64_t)(p) >> 40)
#define POS_STEP(p) ((int64_t)((uint64_t)(p) & ((1ull << 40) - 1)))
/* The position of (epoch, step): the epoch above bit 40, the step below (POS_EPOCH, POS_STEP). */
#define POS_OF(epoch, step) ((int64_t)((uint64_t)(epoch) << 40 | ((uint64_t)(step) & ((1ull << 40) - 1))))

uint32_t bg_comm_epoch_begin(bg_comm_t *c)
{
    bg__lock(c);
    uint32_t e = ++c->epochs;
    bg__unlock(c);
    return e;
}

/* The first rank (other than this one) that left in this rank's epoch at a
 * step before the one this rank is in, -1: none. Under the lock. */
static int left_early_locked(bg_comm_t *c, int64_t pos, int64_t *left_p)
{
    for (int r = 0; r < c->size; r++) {
        int64_t l = c->left_at[r];
        if (r != c->rank && l >= 0 && !c->dead[r] && POS_EPOCH(l) == POS_EPOCH(pos) && POS_STEP(l) < POS_STEP(pos)) {
            *left_p = l;
            return r;
        }
    }
    return -1;
}

/* Rank r left at position l while this rank is at pos: it fails as a dead rank would, named with its step. */
static void left_early(bg_comm_t *c, int r, int64_t l, int64_t pos)
{
    char why[160];
    snprintf(why, sizeof(why), "left the job after step %lld (its executor was destroyed) while this rank is at "
             "step %lld", (long long)POS_STEP(l), (long long)POS_STEP(pos));
    bg__peer_failed(c, r, why);
}

bg_status_t bg_comm_enter_step(bg_comm_t *c, uint32_t epoch, int64_t step)
{
    int64_t pos = POS_OF(epoch, step), l = 0;
    atomic_store(&c->position, pos);
    if (!atomic_load(&c->any_left))
        return BG_OK;
    bg__lock(c);
    int r = left_early_locked(c, pos, &l);
    bg__unlock(c);
    if (r < 0)
        return BG_OK;
    left_early(c, r, l, pos);
    return bg__peer_status(c, r, "the start of a step");
}

void bg_comm_announce_leave(bg_comm_t *c, uint32_t epoch, int64_t steps)
{
    if (!c || c->size == 1 || c->live.fd < 0 || atomic_load(&c->failed))
        return;
    c->leave_pos = POS_OF(epoch, steps);
    send_by_thread(c, &c->leave_pending);
}

/* The communication thread: rank r's notice (from the store). */
static void on_left(bg_comm_t *c, int r, const uint8_t *v, size_t n)
{
    int64_t l, pos = atomic_load(&c->position);
    if (r < 0 || r >= c->size || r == c->rank || n != sizeof l)
        return;
    memcpy(&l, v, sizeof l);
    bg__lock(c);
    c->left_at[r] = l;
    atomic_store(&c->any_left, 1);
    int early = left_early_locked(c, pos, &l) == r;
    bg__unlock(c);
    if (early)
        left_early(c, r, l, pos);
}

/* ---- the communication thread ---------------------------------------------------- */

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
    if (atomic_load(&c->leave_pending)) { /* bg_comm_announce_leave */
        size_t len;
        uint8_t *m = bg__msg_encode(BG__OP_LEAVE, 0, 0, NULL, 0, &c->leave_pos, sizeof c->leave_pos, &len);
        if (m) {
            bg__write_all(c->live.fd, m, len, bg_now() + 1);
            free(m);
        }
        atomic_store(&c->leave_pending, 0);
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
        } else if (h.op == BG__OP_LEFT) {
            on_left(c, (int)h.arg, v, h.val_len);
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

void *bg__comm_thread(void *arg)
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
