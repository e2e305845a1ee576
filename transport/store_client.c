/* transport/store_client.c: the rendezvous store's blocking client: connect
 * and hello with retries and backoff, one request and its reply with a
 * deadline, polling a check function so that a waiting call can be aborted
 * when a peer died. It calls only store_wire.c among the transport files; it
 * must not know about the server's tables, the communicator or UCX. */
#include "transport/store.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "brigade/core.h"
#include "core/check.h"

/* ---- client ------------------------------------------------------------------- */

/* Read one whole message with a deadline; polls c->check between slices. */
static bg_status_t bg__client_read(bg__store_client_t *c, double deadline, bg__store_hdr_t *h_p,
                                   uint8_t **val_p, size_t *vlen_p)
{
    for (;;) {
        bg__store_hdr_t h;
        const uint8_t *k, *v;
        int m = bg__rd_peek(&c->rd, &h, &k, &v);
        if (m < 0)
            return bg_error(BG_ERR_PARSE, "store: malformed reply from the store");
        if (m > 0) {
            uint8_t *out = NULL;
            if (val_p) {
                out = malloc(h.val_len + 1);
                BG_ALLOC_CHECK(out, h.val_len + 1, "a store reply");
                memcpy(out, v, h.val_len);
                out[h.val_len] = 0;
                *val_p = out;
            }
            if (vlen_p)
                *vlen_p = h.val_len;
            *h_p = h;
            bg__rd_pop(&c->rd);
            return BG_OK;
        }
        if (c->check)
            BG_CHECK(c->check(c->check_arg));
        double left = deadline - bg_now();
        if (left <= 0)
            return bg_error(BG_ERR_TIMEOUT, "store: no reply from the store before the deadline");
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int r = poll(&pfd, 1, left > 0.05 ? 50 : (int)(left * 1000) + 1);
        if (r > 0 && bg__rd_fill(&c->rd, c->fd) < 0)
            return bg_error(BG_ERR_PEER, "rank 0 died (store connection closed)");
    }
}

/* One try of connect + hello. *transient_p: the failure is worth retrying
 * (unreachable, or closed before answering the hello); *reached_p: connected. */
static bg_status_t bg__connect_once(const struct sockaddr_storage *ss, socklen_t sl, const char *addr, int port,
                                    const char *token, int rank, int role, double deadline,
                                    bg__store_client_t *c, int *transient_p, int *reached_p)
{
    *transient_p = 1;
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *transient_p = 0;
        return bg_error(BG_ERR_IO, "store: socket: %s", strerror(errno));
    }
    if (connect(fd, (const struct sockaddr *)ss, sl) != 0) {
        int e = errno;
        close(fd);
        return bg_error(BG_ERR_IO, "%s", strerror(e));
    }
    *reached_p = 1;
    c->fd = fd;
    bg__set_nonblock(c->fd);
    const char *tok = token ? token : "";
    size_t len;
    uint8_t *m = bg__msg_encode(BG__OP_HELLO, (uint8_t)role, (uint32_t)rank, tok, strlen(tok), NULL, 0, &len);
    bg_status_t st;
    if (!m) {
        *transient_p = 0;
        st = bg_error(BG_ERR_NOMEM, "store: out of memory");
        goto err_close;
    }
    /* a reply comes at once from a store that is up; one that never comes is retried */
    double try_deadline = bg_now() + 2.0 < deadline ? bg_now() + 2.0 : deadline;
    st = bg__write_all(c->fd, m, len, try_deadline);
    free(m);
    if (st != BG_OK)
        goto err_close;
    bg__store_hdr_t h;
    uint8_t *why = NULL;
    st = bg__client_read(c, try_deadline, &h, &why, NULL);
    if (st == BG_ERR_PEER)
        st = bg_error(BG_ERR_PEER, "closed the connection during hello");
    if (st != BG_OK)
        goto err_close;
    if (h.op != BG__OP_REPLY || h.status != BG__ST_OK) {
        *transient_p = 0;
        st = bg_error(BG_ERR_PEER, "the store at %s:%d refused rank %d: %s (check BRIGADE_JOB_TOKEN "
                      "and BRIGADE_RANK)", addr, port, rank, why && *why ? (char *)why : "no reason given");
        free(why);
        goto err_close;
    }
    free(why);
    return BG_OK;
err_close:
    bg__store_close(c);
    return st;
}

bg_status_t bg__store_connect(const char *addr, int port, const char *token, int rank, int role,
                              double deadline, bg__store_check_fn check, void *check_arg, bg__store_client_t *c)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    BG_CHECK(bg__resolve(addr, port, &ss, &sl));
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->rank = rank;
    c->check = check;
    c->check_arg = check_arg;
    double backoff = 0.01;
    int tries = 0, reached = 0;
    for (;;) {
        int transient = 0, got_in = 0;
        tries++;
        bg_status_t st = bg__connect_once(&ss, sl, addr, port, token, rank, role, deadline, c, &transient, &got_in);
        if (st == BG_OK) {
            if (tries > 1)
                bg_log(BG_LOG_DEBUG, "store", "rank %d reached the store at %s:%d after %d tries", rank, addr,
                       port, tries);
            return BG_OK;
        }
        if (!transient)
            return st;
        if (check)
            BG_CHECK(check(check_arg));
        reached |= got_in;
        if (bg_now() + backoff > deadline) {
            char last[256];
            snprintf(last, sizeof(last), "%s", bg_last_error());
            if (!reached)
                return bg_error(BG_ERR_TIMEOUT,
                                "rank %d could not reach the store at %s:%d before the deadline "
                                "(last error: %s); is rank 0 running?", rank, addr, port, last);
            return bg_error(BG_ERR_TIMEOUT,
                            "rank %d reached the store at %s:%d but got no answer to its hello in %d "
                            "tries before the deadline (last: %s); the store is full or flooded by other "
                            "clients", rank, addr, port, tries, last);
        }
        struct timespec ts = {0, (long)(backoff * 1e9)};
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
    }
}

void bg__store_close(bg__store_client_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    bg__rd_free(&c->rd);
}

bg_status_t bg__store_call(bg__store_client_t *c, uint8_t op, uint32_t arg, const char *key,
                           const void *val, size_t vlen, double deadline, int *st_p,
                           uint8_t **val_p, size_t *vlen_p)
{
    size_t klen = key ? strlen(key) : 0;
    if (klen > BG_STORE_MAX_KEY)
        return bg_error(BG_ERR_INVALID, "store: key \"%.32s...\" has %zu bytes, at most %d allowed",
                        key, klen, BG_STORE_MAX_KEY);
    if (vlen > BG_STORE_MAX_VALUE)
        return bg_error(BG_ERR_INVALID, "store: value of %zu bytes for key \"%s\", at most %u allowed",
                        vlen, key ? key : "", BG_STORE_MAX_VALUE);
    if (c->fd < 0)
        return bg_error(BG_ERR_IO, "store: not connected");
    size_t len;
    uint8_t *m = bg__msg_encode(op, 0, arg, key, klen, val, vlen, &len);
    BG_ALLOC_CHECK(m, BG__HDR + klen + vlen, "a store request");
    bg_status_t st = bg__write_all(c->fd, m, len, deadline);
    free(m);
    if (st != BG_OK) {
        bg__store_close(c);
        return st;
    }
    bg__store_hdr_t h;
    st = bg__client_read(c, deadline, &h, val_p, vlen_p);
    if (st != BG_OK) {
        /* a reply may still come later: the stream is out of step, drop it */
        bg__store_close(c);
        return st;
    }
    if (h.op != BG__OP_REPLY) {
        if (val_p)
            free(*val_p);
        bg__store_close(c);
        return bg_error(BG_ERR_PARSE, "store: unexpected message (op %d) instead of a reply", h.op);
    }
    *st_p = h.status;
    return BG_OK;
}
