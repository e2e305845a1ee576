/* transport/store_server.c: the rendezvous store's server. It is one thread
 * with a poll() loop over non-blocking sockets: a slow, silent or hostile
 * client never blocks the others, and a malformed message drops only its own
 * connection. It also keeps the liveness connections: it reports a rank
 * whose connection closed (or went silent past the timeout) to every other
 * rank. It owns the key-value table, the connections and their caps, and the
 * socketless read path (bg__store_fake_*) the fuzzer and tests drive.
 *
 * Hostile clients: until a connection has said hello with the job's token it
 * may send one HELLO frame of at most BG__PREAUTH_FRAME bytes (anything else
 * drops it once its 16-byte header is read), so an unauthenticated client
 * never makes the server buffer more than that. Connections waiting for hello
 * are capped per source address and in total; a new one beyond a cap evicts
 * the oldest unauthenticated one (never a rank's), so idle or slow hostile
 * connections cannot make the server refuse a real rank. Their drops are
 * logged as one summary line per interval, not one line each.
 * It calls only store_wire.c among the transport files; it must not know
 * about UCX, the communicator or the client. */
#include "transport/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "brigade/core.h"
#include "core/check.h"

#define BG__MAX_WBUF (8u << 20)
#define BG__MAX_PREAUTH 512          /* connections waiting for hello, all addresses together */
#define BG__MAX_PREAUTH_PER_ADDR 128 /* ... from one source address */
#define BG__ACCEPT_BATCH 32          /* accepts per loop round: a rank's hello, read the next round,
                                      * is always younger than the per-address cap of evictions */
#define BG__DROP_LOG_S 5.0           /* at most one summary line of dropped connections per this */

/* ---- server ------------------------------------------------------------------- */

typedef struct bg__kv {
    char *key;
    uint8_t *val;
    size_t len;
    struct bg__kv *next;
} bg__kv_t;

typedef struct bg__conn {
    int fd;
    char peer[64];       /* source address (numeric), for the per-address cap and logs */
    bg__rd_t rd;
    uint8_t *wbuf;
    size_t wlen, wcap;
    int hello, rank, role, bye;
    double opened, last_heard;
    /* one parked request at most (clients are request/reply) */
    int parked;          /* 0, BG__OP_WAIT or BG__OP_BARRIER */
    char pkey[BG_STORE_MAX_KEY + 1];
    double pdeadline;
    uint32_t pcount;
} bg__conn_t;

struct bg__store_server {
    bg__store_server_params_t p;
    char token[256];
    size_t token_len;
    char addr[256];
    int lfd, port;
    int wake[2];
    pthread_t thread;
    atomic_int stop;
    double stop_deadline;
    atomic_uint_fast64_t dropped;
    bg__conn_t **conns;
    int nconns, max_conns;   /* max_conns: ranks' connections + max_preauth */
    int max_preauth, max_preauth_addr;
    double accept_paused_until; /* out of file descriptors: stop accepting until then */
    atomic_int stat_open, stat_preauth;
    /* unauthenticated connections dropped since the last summary line, by cause */
    unsigned ndrop[5];
    double drop_since, drop_log_next;
    bg__kv_t *kv;
    char *dead;  /* per rank: reported dead already */
    double last_hb;
    double live_timeout; /* a liveness connection silent this long is dead */
};

static bg__kv_t *bg__kv_find(bg__store_server_t *s, const char *key)
{
    for (bg__kv_t *e = s->kv; e; e = e->next)
        if (strcmp(e->key, key) == 0)
            return e;
    return NULL;
}

static int bg__queue(bg__conn_t *c, uint8_t op, uint8_t status, uint32_t arg, const void *key,
                     size_t klen, const void *val, size_t vlen)
{
    size_t need = c->wlen + BG__HDR + klen + vlen;
    if (need > BG__MAX_WBUF)
        return -1;
    if (need > c->wcap) {
        size_t cap = c->wcap ? c->wcap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *b = realloc(c->wbuf, cap);
        if (!b)
            return -1;
        c->wbuf = b;
        c->wcap = cap;
    }
    bg__store_hdr_t h = {.magic = BG__STORE_MAGIC, .op = op, .status = status,
                         .key_len = (uint16_t)klen, .val_len = (uint32_t)vlen, .arg = arg};
    memcpy(c->wbuf + c->wlen, &h, BG__HDR);
    if (klen)
        memcpy(c->wbuf + c->wlen + BG__HDR, key, klen);
    if (vlen)
        memcpy(c->wbuf + c->wlen + BG__HDR + klen, val, vlen);
    c->wlen = need;
    return 0;
}

static int bg__reply(bg__conn_t *c, int status, const void *val, size_t vlen)
{
    return bg__queue(c, BG__OP_REPLY, (uint8_t)status, 0, NULL, 0, val, vlen);
}

static void bg__flush(bg__conn_t *c)
{
    while (c->wlen) {
        ssize_t n = send(c->fd, c->wbuf, c->wlen, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0)
            return;
        memmove(c->wbuf, c->wbuf + n, c->wlen - (size_t)n);
        c->wlen -= (size_t)n;
    }
}

static void bg__announce_dead(bg__store_server_t *s, int rank, const char *why)
{
    if (rank < 0 || rank >= s->p.world_size || s->dead[rank])
        return;
    s->dead[rank] = 1;
    bg_log(BG_LOG_WARN, "store", "rank %d failed: %s", rank, why);
    for (int i = 0; i < s->nconns; i++) {
        bg__conn_t *c = s->conns[i];
        if (c && c->role == BG__ROLE_LIVE && c->hello && c->rank != rank)
            bg__queue(c, BG__OP_DEAD, 0, (uint32_t)rank, NULL, 0, why, strlen(why));
    }
}

/* Why an unauthenticated connection was dropped or refused (counted, summarised). */
enum { BG__DROP_BAD, BG__DROP_TOKEN, BG__DROP_NOHELLO, BG__DROP_EVICTED, BG__DROP_FULL, BG__DROP_N };
static const char *const bg__drop_what[BG__DROP_N] = {
    "malformed, oversized or not a hello", "wrong job token", "closed or silent before hello",
    "evicted for newer ones (too many waiting for hello)", "refused (no room)"};

/* One WARN line for the unauthenticated connections dropped since the last
 * one: at once after a quiet interval, then at most every BG__DROP_LOG_S. */
static void bg__drop_log(bg__store_server_t *s, double now, int force)
{
    unsigned total = 0;
    for (int k = 0; k < BG__DROP_N; k++)
        total += s->ndrop[k];
    if (!total || (!force && now < s->drop_log_next))
        return;
    char what[384];
    int off = 0;
    for (int k = 0; k < BG__DROP_N; k++)
        if (s->ndrop[k] && off < (int)sizeof(what))
            off += snprintf(what + off, sizeof(what) - (size_t)off, "%s%u %s", off ? ", " : "", s->ndrop[k],
                            bg__drop_what[k]);
    int pre = 0;
    for (int i = 0; i < s->nconns; i++)
        pre += !s->conns[i]->hello;
    bg_log(BG_LOG_WARN, "store", "dropped %u unauthenticated connection%s in the last %.1f s (%s); "
           "%d connection%s open, %d waiting for hello", total, total == 1 ? "" : "s",
           now - s->drop_since, what, s->nconns, s->nconns == 1 ? "" : "s", pre);
    memset(s->ndrop, 0, sizeof(s->ndrop));
    s->drop_since = now;
    s->drop_log_next = now + BG__DROP_LOG_S;
}

static void bg__count_drop(bg__store_server_t *s, int kind)
{
    double now = bg_now();
    unsigned total = 0;
    for (int k = 0; k < BG__DROP_N; k++)
        total += s->ndrop[k];
    if (!total && now >= s->drop_log_next)
        s->drop_since = now;
    s->ndrop[kind]++;
    atomic_fetch_add(&s->dropped, 1);
}

/* Drop connection i. kind: a BG__DROP_* for an unauthenticated connection
 * (counted and summarised); -1: an ordinary close (debug line); -2: a rank's
 * connection that broke the protocol (WARN line of its own). */
static void bg__drop(bg__store_server_t *s, int i, const char *why, int kind)
{
    bg__conn_t *c = s->conns[i];
    if (kind >= 0 && !c->hello) {
        bg__count_drop(s, kind);
        bg_log(BG_LOG_DEBUG, "store", "dropping unauthenticated connection from %s: %s", c->peer, why);
    } else {
        if (kind != -1)
            atomic_fetch_add(&s->dropped, 1);
        bg_log(kind != -1 ? BG_LOG_WARN : BG_LOG_DEBUG, "store", "dropping connection (rank %d, %s): %s",
               c->hello ? c->rank : -1, c->peer, why);
    }
    if (c->hello && c->role == BG__ROLE_LIVE && !c->bye)
        bg__announce_dead(s, c->rank, why);
    close(c->fd);
    bg__rd_free(&c->rd);
    free(c->wbuf);
    free(c);
    s->conns[i] = s->conns[--s->nconns];
    s->conns[s->nconns] = NULL;
}

/* Reply to every parked WAIT on @p key. */
static void bg__wake_waiters(bg__store_server_t *s, const char *key, const bg__kv_t *e)
{
    for (int i = 0; i < s->nconns; i++) {
        bg__conn_t *c = s->conns[i];
        if (c->parked == BG__OP_WAIT && strcmp(c->pkey, key) == 0) {
            c->parked = 0;
            bg__reply(c, BG__ST_OK, e->val, e->len);
        }
    }
}

static void bg__barrier_check(bg__store_server_t *s, const char *key, uint32_t count)
{
    uint32_t n = 0;
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i]->parked == BG__OP_BARRIER && strcmp(s->conns[i]->pkey, key) == 0)
            n++;
    if (n < count)
        return;
    for (int i = 0; i < s->nconns; i++) {
        bg__conn_t *c = s->conns[i];
        if (c->parked == BG__OP_BARRIER && strcmp(c->pkey, key) == 0) {
            c->parked = 0;
            bg__reply(c, BG__ST_OK, NULL, 0);
        }
    }
}

/* The message a barrier that timed out sends back: who is missing. */
static void bg__barrier_timeout(bg__store_server_t *s, bg__conn_t *me)
{
    char msg[512];
    int w = s->p.world_size > 0 ? s->p.world_size : 0;
    char *seen = calloc((size_t)w + 1, 1);
    uint32_t n = 0;
    for (int i = 0; i < s->nconns; i++) {
        bg__conn_t *c = s->conns[i];
        if (c->parked == BG__OP_BARRIER && strcmp(c->pkey, me->pkey) == 0) {
            n++;
            if (seen && c->rank >= 0 && c->rank < w)
                seen[c->rank] = 1;
        }
    }
    int off = snprintf(msg, sizeof(msg), "%u of %u ranks arrived; missing:", n, me->pcount);
    int listed = 0;
    for (int r = 0; seen && r < w && off < (int)sizeof(msg) - 16; r++)
        if (!seen[r]) {
            off += snprintf(msg + off, sizeof(msg) - (size_t)off, "%s %d", listed ? "," : "", r);
            listed++;
        }
    free(seen);
    /* everyone waiting in this barrier gets the same answer now */
    char key[BG_STORE_MAX_KEY + 1];
    memcpy(key, me->pkey, sizeof(key));
    for (int i = 0; i < s->nconns; i++) {
        bg__conn_t *c = s->conns[i];
        if (c->parked == BG__OP_BARRIER && strcmp(c->pkey, key) == 0) {
            c->parked = 0;
            bg__reply(c, BG__ST_TIMEOUT, msg, strlen(msg));
        }
    }
}

/* Whether @p key equals the job's token, in time that depends only on the
 * token's length: how many leading bytes matched must not show in the reply's delay. */
static int bg__token_equal(const bg__store_server_t *s, const uint8_t *key, size_t klen)
{
    volatile uint8_t diff = (uint8_t)(klen != s->token_len);
    for (size_t i = 0; i < s->token_len; i++)
        diff |= (uint8_t)((uint8_t)s->token[i] ^ (i < klen ? key[i] : 0u));
    return diff == 0;
}

/* The first message of a connection: a HELLO with the job's token. -1 drops
 * the connection, with *drop_p set to its BG__DROP_* cause (-1: a refusal
 * with the right token, logged on its own line). */
static int bg__handle_hello(bg__store_server_t *s, bg__conn_t *c, const bg__store_hdr_t *h,
                            const uint8_t *key, int *drop_p)
{
    *drop_p = BG__DROP_BAD;
    if (h->op != BG__OP_HELLO || h->val_len != 0 || h->status > BG__ROLE_LIVE)
        return -1;
    if (s->token_len && !bg__token_equal(s, key, h->key_len)) {
        *drop_p = BG__DROP_TOKEN;
        bg__reply(c, BG__ST_ERR, "wrong job token", 15);
        bg__flush(c);
        return -1;
    }
    *drop_p = -1; /* the token is right: a refusal below is logged on its own line */
    if (s->p.world_size > 0 && h->arg >= (uint32_t)s->p.world_size) {
        char m[96];
        int n = snprintf(m, sizeof(m), "rank %u out of range for a world of %d", h->arg, s->p.world_size);
        bg_log(BG_LOG_ERROR, "store", "refused a client: %s", m);
        bg__reply(c, BG__ST_ERR, m, (size_t)n);
        bg__flush(c);
        return -1;
    }
    if (h->status == BG__ROLE_LIVE)
        for (int i = 0; i < s->nconns; i++) {
            bg__conn_t *o = s->conns[i];
            if (o != c && o->hello && o->role == BG__ROLE_LIVE && !o->bye && o->rank == (int)h->arg) {
                bg_log(BG_LOG_ERROR, "store", "a second process claims rank %u: refused "
                       "(two processes with the same rank variable?)", h->arg);
                bg__reply(c, BG__ST_ERR, "rank already taken", 18);
                bg__flush(c);
                return -1;
            }
        }
    c->hello = 1;
    c->rd.max_frame = 0; /* authenticated: the protocol's own limits from now on */
    c->rank = (int)h->arg;
    c->role = h->status;
    *drop_p = -2;
    return bg__reply(c, BG__ST_OK, NULL, 0);
}

/* The per-op handlers below take the key NUL-terminated (@p k) and return
 * what bg__handle returns: -1 drops the connection. */

static int bg__op_set(bg__store_server_t *s, bg__conn_t *c, const bg__store_hdr_t *h, const char *k,
                      const uint8_t *val)
{
    bg__kv_t *e = bg__kv_find(s, k);
    uint8_t *v = malloc(h->val_len + 1);
    if (!v)
        return -1;
    memcpy(v, val, h->val_len);
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (!e || !(e->key = strdup(k))) {
            free(e);
            free(v);
            return -1;
        }
        e->next = s->kv;
        s->kv = e;
    } else {
        free(e->val);
    }
    e->val = v;
    e->len = h->val_len;
    bg__wake_waiters(s, k, e);
    return bg__reply(c, BG__ST_OK, NULL, 0);
}

static int bg__op_wait(bg__store_server_t *s, bg__conn_t *c, const bg__store_hdr_t *h, const char *k)
{
    bg__kv_t *e = bg__kv_find(s, k);
    if (e)
        return bg__reply(c, BG__ST_OK, e->val, e->len);
    c->parked = BG__OP_WAIT;
    memcpy(c->pkey, k, h->key_len + 1);
    c->pdeadline = bg_now() + h->arg / 1000.0;
    return 0;
}

static int bg__op_add(bg__store_server_t *s, bg__conn_t *c, const bg__store_hdr_t *h, const char *k,
                      const uint8_t *val)
{
    if (h->val_len != 8)
        return -1;
    int64_t d, cur = 0;
    memcpy(&d, val, 8);
    bg__kv_t *e = bg__kv_find(s, k);
    if (e && e->len == 8)
        memcpy(&cur, e->val, 8);
    if (__builtin_add_overflow(cur, d, &cur))
        return -1; /* no counter of ours gets near 2^63: a hostile or broken client */
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (!e || !(e->key = strdup(k))) {
            free(e);
            return -1;
        }
        e->next = s->kv;
        s->kv = e;
    }
    if (e->len != 8) {
        free(e->val);
        e->val = malloc(8);
        if (!e->val)
            return -1;
        e->len = 8;
    }
    memcpy(e->val, &cur, 8);
    bg__wake_waiters(s, k, e);
    return bg__reply(c, BG__ST_OK, &cur, 8);
}

static int bg__op_barrier(bg__store_server_t *s, bg__conn_t *c, const bg__store_hdr_t *h, const char *k,
                          const uint8_t *val)
{
    if (h->val_len != 4 || h->arg == 0)
        return -1;
    uint32_t ms;
    memcpy(&ms, val, 4);
    c->parked = BG__OP_BARRIER;
    memcpy(c->pkey, k, h->key_len + 1);
    c->pcount = h->arg;
    c->pdeadline = bg_now() + ms / 1000.0;
    bg__barrier_check(s, k, h->arg);
    return 0;
}

static int bg__op_del(bg__store_server_t *s, bg__conn_t *c, const char *k)
{
    for (bg__kv_t **pp = &s->kv; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->key, k) == 0) {
            bg__kv_t *e = *pp;
            *pp = e->next;
            free(e->key);
            free(e->val);
            free(e);
            return bg__reply(c, BG__ST_OK, NULL, 0);
        }
    }
    return bg__reply(c, BG__ST_NOTFOUND, NULL, 0);
}

static int bg__op_fail(bg__store_server_t *s, bg__conn_t *c, const bg__store_hdr_t *h, const uint8_t *val)
{
    char why[BG_STORE_ABORT_MAX + 32];
    snprintf(why, sizeof(why), "stopped on an error: %.*s",
             (int)(h->val_len < BG_STORE_ABORT_MAX ? h->val_len : BG_STORE_ABORT_MAX), (const char *)val);
    bg__announce_dead(s, c->rank, why);
    return 0;
}

/* A rank leaves (not a failure: the others decide from its position whether it left early). */
static int bg__op_leave(bg__store_server_t *s, bg__conn_t *c, const bg__store_hdr_t *h, const uint8_t *val)
{
    if (h->val_len != sizeof(int64_t))
        return -1;
    for (int i = 0; i < s->nconns; i++) {
        bg__conn_t *o = s->conns[i];
        if (o && o != c && o->role == BG__ROLE_LIVE && o->hello && !o->bye && o->rank != c->rank)
            bg__queue(o, BG__OP_LEFT, 0, (uint32_t)c->rank, NULL, 0, val, sizeof(int64_t));
    }
    return 0;
}

/* Handle one message; -1 drops the connection (a protocol violation, or a
 * refused hello, with *drop_p set to its BG__DROP_* cause). */
static int bg__handle(bg__store_server_t *s, bg__conn_t *c, const bg__store_hdr_t *h,
                      const uint8_t *key, const uint8_t *val, int *drop_p)
{
    char k[BG_STORE_MAX_KEY + 1];
    memcpy(k, key, h->key_len);
    k[h->key_len] = '\0';
    c->last_heard = bg_now();
    if (!c->hello)
        return bg__handle_hello(s, c, h, key, drop_p);
    if (c->parked)
        return -1; /* request/reply protocol: nothing may come while parked */
    switch (h->op) {
    case BG__OP_SET:
        return bg__op_set(s, c, h, k, val);
    case BG__OP_GET: {
        bg__kv_t *e = bg__kv_find(s, k);
        return e ? bg__reply(c, BG__ST_OK, e->val, e->len) : bg__reply(c, BG__ST_NOTFOUND, NULL, 0);
    }
    case BG__OP_WAIT:
        return bg__op_wait(s, c, h, k);
    case BG__OP_ADD:
        return bg__op_add(s, c, h, k, val);
    case BG__OP_BARRIER:
        return bg__op_barrier(s, c, h, k, val);
    case BG__OP_DEL:
        return bg__op_del(s, c, k);
    case BG__OP_HB:
        return 0;
    case BG__OP_BYE:
        c->bye = 1;
        return 0;
    case BG__OP_FAIL:
        return bg__op_fail(s, c, h, val);
    case BG__OP_LEAVE:
        return c->role == BG__ROLE_LIVE ? bg__op_leave(s, c, h, val) : -1;
    default:
        return -1;
    }
}

/* Drop the oldest connection still waiting for hello (from @p peer only when
 * given). 1 if one was dropped. */
static int bg__evict_oldest(bg__store_server_t *s, const char *peer)
{
    int best = -1;
    for (int i = 0; i < s->nconns; i++) {
        bg__conn_t *c = s->conns[i];
        if (!c->hello && (!peer || strcmp(c->peer, peer) == 0) &&
            (best < 0 || c->opened < s->conns[best]->opened))
            best = i;
    }
    if (best < 0)
        return 0;
    bg__drop(s, best, "evicted: too many connections waiting for hello", BG__DROP_EVICTED);
    return 1;
}

static void bg__accept(bg__store_server_t *s, double now)
{
    for (int k = 0; k < BG__ACCEPT_BATCH; k++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EMFILE && errno != ENFILE)
                return; /* EAGAIN: none left */
            /* out of descriptors: make room from the unauthenticated, else pause */
            if (bg__evict_oldest(s, NULL))
                continue;
            s->accept_paused_until = now + 0.1;
            return;
        }
        char peer[64] = "?";
        if (ss.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, peer, sizeof(peer));
        else if (ss.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, peer, sizeof(peer));
        int pre = 0, pre_addr = 0;
        for (int i = 0; i < s->nconns; i++)
            if (!s->conns[i]->hello) {
                pre++;
                pre_addr += strcmp(s->conns[i]->peer, peer) == 0;
            }
        /* the caps hold the unauthenticated: the newcomer replaces the oldest of them */
        if (pre_addr >= s->max_preauth_addr)
            bg__evict_oldest(s, peer);
        else if (pre >= s->max_preauth)
            bg__evict_oldest(s, NULL);
        bg__conn_t *c = s->nconns < s->max_conns || bg__evict_oldest(s, NULL) ? calloc(1, sizeof(*c)) : NULL;
        if (!c) {
            bg__count_drop(s, BG__DROP_FULL); /* the client retries until its deadline */
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->fd = fd;
        snprintf(c->peer, sizeof(c->peer), "%s", peer);
        c->rd.max_frame = BG__PREAUTH_FRAME;
        c->rank = -1;
        c->opened = c->last_heard = now;
        s->conns[s->nconns++] = c;
    }
}

static void *bg__server_main(void *arg)
{
    bg__store_server_t *s = arg;
    struct pollfd *pfd = calloc((size_t)s->max_conns + 2, sizeof(*pfd));
    if (!pfd)
        return NULL;
    for (;;) {
        double now = bg_now();
        if (atomic_load(&s->stop)) {
            int live = 0;
            for (int i = 0; i < s->nconns; i++)
                live += s->conns[i]->role == BG__ROLE_LIVE && s->conns[i]->hello;
            if (live == 0 || now > s->stop_deadline)
                break;
        }
        /* heartbeats out; silent liveness connections and timed-out requests */
        int hb = now - s->last_hb >= s->p.heartbeat_ms / 1000.0;
        if (hb)
            s->last_hb = now;
        for (int i = 0; i < s->nconns; i++) {
            bg__conn_t *c = s->conns[i];
            if (!c->hello && now - c->opened > s->p.hello_timeout_s) {
                bg__drop(s, i--, "no hello before the deadline", BG__DROP_NOHELLO);
                continue;
            }
            if (c->hello && c->role == BG__ROLE_LIVE && !c->bye) {
                if (now - c->last_heard > s->live_timeout) {
                    char why[96];
                    snprintf(why, sizeof(why), "no heartbeat for %.1f s", now - c->last_heard);
                    bg__drop(s, i--, why, -1);
                    continue;
                }
                if (hb)
                    bg__queue(c, BG__OP_HB, 0, 0, NULL, 0, NULL, 0);
            }
            if (c->parked && now > c->pdeadline) {
                if (c->parked == BG__OP_WAIT) {
                    c->parked = 0;
                    bg__reply(c, BG__ST_TIMEOUT, "key was not set before the deadline", 35);
                } else {
                    bg__barrier_timeout(s, c);
                }
            }
            bg__flush(c);
        }
        int n = 0;
        pfd[n++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = now < s->accept_paused_until ? -1 : s->lfd, .events = POLLIN};
        for (int i = 0; i < s->nconns; i++)
            pfd[n++] = (struct pollfd){.fd = s->conns[i]->fd,
                                       .events = (short)(POLLIN | (s->conns[i]->wlen ? POLLOUT : 0))};
        int tmo = s->p.heartbeat_ms < 50 ? s->p.heartbeat_ms : 50;
        if (poll(pfd, (nfds_t)n, tmo) < 0 && errno != EINTR)
            break;
        if (pfd[0].revents & POLLIN) {
            char b[64];
            while (read(s->wake[0], b, sizeof(b)) > 0) {
            }
        }
        if (pfd[1].revents & POLLIN)
            bg__accept(s, bg_now());
        /* connections: iterate over the ones polled (accepts appended new ones) */
        int polled = n - 2;
        for (int i = polled - 1; i >= 0; i--) {
            short re = pfd[i + 2].revents;
            if (i >= s->nconns || s->conns[i]->fd != pfd[i + 2].fd || !re)
                continue;
            bg__conn_t *c = s->conns[i];
            if (re & POLLOUT)
                bg__flush(c);
            if (!(re & (POLLIN | POLLHUP | POLLERR)))
                continue;
            int r = bg__rd_fill(&c->rd, c->fd);
            int bad = 0, kind = -2;
            for (;;) {
                bg__store_hdr_t h;
                const uint8_t *k, *v;
                int m = bg__rd_peek(&c->rd, &h, &k, &v);
                if (m == 0)
                    break;
                kind = c->hello ? -2 : BG__DROP_BAD;
                if (m < 0 || bg__handle(s, c, &h, k, v, &kind) < 0) {
                    bad = 1;
                    break;
                }
                bg__rd_pop(&c->rd);
            }
            if (bad)
                bg__drop(s, i, kind == BG__DROP_TOKEN ? "wrong job token"
                               : "malformed, oversized or unexpected message", kind);
            else if (r < 0)
                bg__drop(s, i, "connection closed", c->hello ? -1 : BG__DROP_NOHELLO);
            else
                bg__flush(c);
        }
        now = bg_now();
        bg__drop_log(s, now, 0);
        int pre = 0;
        for (int i = 0; i < s->nconns; i++)
            pre += !s->conns[i]->hello;
        atomic_store(&s->stat_open, s->nconns);
        atomic_store(&s->stat_preauth, pre);
    }
    for (int i = s->nconns - 1; i >= 0; i--)
        bg__drop(s, i, "store shutting down", -1);
    bg__drop_log(s, bg_now(), 1);
    free(pfd);
    return NULL;
}

bg_status_t bg__store_server_start(const bg__store_server_params_t *p, bg__store_server_t **srv_p)
{
    bg_status_t st;
    bg__store_server_t *s = calloc(1, sizeof(*s));
    BG_ALLOC_CHECK(s, sizeof(*s), "the store server");
    s->p = *p;
    snprintf(s->token, sizeof(s->token), "%s", p->token ? p->token : "");
    s->token_len = strlen(s->token);
    snprintf(s->addr, sizeof(s->addr), "%s", p->addr ? p->addr : "127.0.0.1");
    s->p.addr = s->addr;
    if (s->p.heartbeat_ms <= 0)
        s->p.heartbeat_ms = 200;
    if (s->p.timeout_s <= 0)
        s->p.timeout_s = 60;
    s->live_timeout = s->p.timeout_s / 2;
    if (s->live_timeout < 5 * s->p.heartbeat_ms / 1000.0)
        s->live_timeout = 5 * s->p.heartbeat_ms / 1000.0;
    if (s->p.hello_timeout_s <= 0)
        s->p.hello_timeout_s = 10;
    /* caps: every rank's two connections (and reconnections) always fit; the
     * unauthenticated share at most a quarter of the descriptors this process may open */
    s->max_preauth = BG__MAX_PREAUTH;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 4 < (rlim_t)s->max_preauth)
        s->max_preauth = rl.rlim_cur / 4 > 8 ? (int)(rl.rlim_cur / 4) : 8;
    s->max_preauth_addr = s->max_preauth / 4 > BG__MAX_PREAUTH_PER_ADDR ? s->max_preauth / 4 : BG__MAX_PREAUTH_PER_ADDR;
    if (s->max_preauth_addr > s->max_preauth)
        s->max_preauth_addr = s->max_preauth;
    s->max_conns = (p->world_size > 0 ? 4 * p->world_size + 64 : 1024) + s->max_preauth;
    s->conns = calloc((size_t)s->max_conns, sizeof(*s->conns));
    s->dead = calloc((size_t)(p->world_size > 0 ? p->world_size : 1), 1);
    s->lfd = -1;
    s->wake[0] = s->wake[1] = -1;
    if (!s->dead || !s->conns) {
        st = bg_error(BG_ERR_NOMEM, "store: out of memory");
        goto err_free;
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    BG_CHECK_GOTO(bg__resolve(s->addr, p->port, &ss, &sl), st, err_free);
    s->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&ss, sl) != 0 || listen(s->lfd, 4096) != 0) {
        st = bg_error(BG_ERR_IO, "store: cannot listen on %s:%d: %s (is the port in use?)", s->addr,
                      p->port, strerror(errno));
        goto err_close;
    }
    bg__set_nonblock(s->lfd);
    sl = sizeof(ss);
    getsockname(s->lfd, (struct sockaddr *)&ss, &sl);
    s->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                            : ((struct sockaddr_in6 *)&ss)->sin6_port);
    if (pipe2(s->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        st = bg_error(BG_ERR_IO, "store: pipe: %s", strerror(errno));
        goto err_close;
    }
    s->last_hb = bg_now();
    if (pthread_create(&s->thread, NULL, bg__server_main, s) != 0) {
        st = bg_error(BG_ERR_INTERNAL, "store: cannot start the server thread");
        goto err_pipe;
    }
    bg_log(BG_LOG_DEBUG, "store", "serving on %s:%d", s->addr, s->port);
    *srv_p = s;
    return BG_OK;
err_pipe:
    close(s->wake[0]);
    close(s->wake[1]);
err_close:
    if (s->lfd >= 0)
        close(s->lfd);
err_free:
    free(s->conns);
    free(s->dead);
    free(s);
    return st;
}

int bg__store_server_port(const bg__store_server_t *srv) { return srv->port; }

uint64_t bg__store_server_dropped(const bg__store_server_t *srv)
{
    return atomic_load(&((bg__store_server_t *)srv)->dropped);
}

void bg__store_server_conns(bg__store_server_t *srv, int *open_p, int *preauth_p)
{
    *open_p = atomic_load(&srv->stat_open);
    *preauth_p = atomic_load(&srv->stat_preauth);
}

/* What a stopped server still holds: the key-value list and its tables. */
static void bg__server_free(bg__store_server_t *s)
{
    for (bg__kv_t *e = s->kv, *n; e; e = n) {
        n = e->next;
        free(e->key);
        free(e->val);
        free(e);
    }
    free(s->conns);
    free(s->dead);
    free(s);
}

void bg__store_server_stop(bg__store_server_t *s, double wait_s)
{
    if (!s)
        return;
    s->stop_deadline = bg_now() + wait_s;
    atomic_store(&s->stop, 1);
    ssize_t w = write(s->wake[1], "x", 1);
    (void)w;
    pthread_join(s->thread, NULL);
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    bg__server_free(s);
}

/* ---- the server's read path without sockets (fuzzing, tests) ------------------- */

/* These mirror what bg__server_main does for a readable connection (decode,
 * handle, drop on a violation) and for an expired request, on bytes handed
 * in instead of read from a socket. They are kept apart from the poll loop
 * so that the loop stays as it is: a change to one belongs in the other. */

bg__store_server_t *bg__store_fake_create(const bg__store_server_params_t *p)
{
    bg__store_server_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->p = *p;
    snprintf(s->token, sizeof(s->token), "%s", p->token ? p->token : "");
    s->p.token = s->token;
    s->p.addr = s->addr;
    s->lfd = s->wake[0] = s->wake[1] = -1;
    s->max_preauth = BG__MAX_PREAUTH;
    s->max_preauth_addr = BG__MAX_PREAUTH_PER_ADDR;
    s->max_conns = (p->world_size > 0 ? 4 * p->world_size + 64 : 1024) + s->max_preauth;
    s->conns = calloc((size_t)s->max_conns, sizeof(*s->conns));
    s->dead = calloc((size_t)(p->world_size > 0 ? p->world_size : 1), 1);
    if (!s->dead || !s->conns) {
        free(s->conns);
        free(s->dead);
        free(s);
        return NULL;
    }
    return s;
}

int bg__store_fake_feed(bg__store_server_t *s, int conn, const void *bytes, size_t n)
{
    if (conn < 0 || conn > s->nconns || conn >= s->max_conns)
        return -1;
    if (conn == s->nconns) {
        bg__conn_t *c = calloc(1, sizeof(*c));
        if (!c)
            return -1;
        c->fd = -1;
        c->rank = -1;
        c->rd.max_frame = BG__PREAUTH_FRAME;
        snprintf(c->peer, sizeof(c->peer), "fake");
        c->opened = c->last_heard = bg_now();
        s->conns[s->nconns++] = c;
    }
    bg__conn_t *c = s->conns[conn];
    if (bg__rd_reserve(&c->rd, c->rd.len + n + 1) != 0)
        return -1;
    if (n)
        memcpy(c->rd.buf + c->rd.len, bytes, n);
    c->rd.len += n;
    for (;;) {
        bg__store_hdr_t h;
        const uint8_t *k, *v;
        int m = bg__rd_peek(&c->rd, &h, &k, &v);
        if (m == 0)
            break;
        int drop = BG__DROP_BAD;
        if (m < 0 || bg__handle(s, c, &h, k, v, &drop) < 0) {
            bg__drop(s, conn, "malformed, oversized or unexpected message", c->hello ? -2 : drop);
            return -1;
        }
        bg__rd_pop(&c->rd);
    }
    c->wlen = 0; /* the client read the replies */
    return 0;
}

void bg__store_fake_expire(bg__store_server_t *s)
{
    for (int i = 0; i < s->nconns; i++) {
        bg__conn_t *c = s->conns[i];
        if (c->parked == BG__OP_WAIT) {
            c->parked = 0;
            bg__reply(c, BG__ST_TIMEOUT, "key was not set before the deadline", 35);
        } else if (c->parked) {
            bg__barrier_timeout(s, c);
        }
        c->wlen = 0;
    }
}

void bg__store_fake_destroy(bg__store_server_t *s)
{
    if (!s)
        return;
    for (int i = s->nconns - 1; i >= 0; i--)
        bg__drop(s, i, "store shutting down", -1);
    bg__server_free(s);
}
