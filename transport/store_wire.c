/* transport/store_wire.c: the rendezvous store's wire format, shared by the
 * server (store_server.c) and the client (store_client.c): the incremental
 * frame reader, message encoding, a blocking write with a deadline, and the
 * socket helpers both sides use (address resolution, non-blocking mode).
 * It owns no connection and no state: it must not know about the server's
 * tables, the client's retries, or UCX, and it calls no other transport file. */
#include "transport/store.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "brigade/core.h"
#include "core/check.h"

_Static_assert(sizeof(bg__store_hdr_t) == 16, "store header is 16 bytes on the wire");

/* ---- framing ---------------------------------------------------------------- */

void bg__rd_free(bg__rd_t *rd)
{
    free(rd->buf);
    rd->buf = NULL;
    rd->len = rd->cap = 0;
}

int bg__rd_reserve(bg__rd_t *rd, size_t need)
{
    if (rd->cap >= need)
        return 0;
    size_t cap = rd->cap ? rd->cap : rd->max_frame ? rd->max_frame : 4096;
    while (cap < need)
        cap *= 2;
    uint8_t *b = realloc(rd->buf, cap);
    if (!b)
        return -1;
    rd->buf = b;
    rd->cap = cap;
    return 0;
}

/* Bytes the front message needs in total (header included), 0 if unknown yet. */
static size_t bg__rd_need(const bg__rd_t *rd)
{
    if (rd->len < BG__HDR)
        return BG__HDR;
    bg__store_hdr_t h;
    memcpy(&h, rd->buf, BG__HDR);
    if (h.key_len > BG_STORE_MAX_KEY || h.val_len > BG_STORE_MAX_VALUE)
        return BG__HDR;
    size_t total = BG__HDR + h.key_len + (size_t)h.val_len;
    if (rd->max_frame && total > rd->max_frame)
        return BG__HDR; /* refused by bg__rd_peek: read nothing of it */
    return total;
}

int bg__rd_fill(bg__rd_t *rd, int fd)
{
    size_t need = bg__rd_need(rd);
    size_t want = need > rd->len ? need - rd->len : 0;
    if (rd->max_frame) /* before hello: never past the one frame allowed */
        want = rd->max_frame > rd->len ? rd->max_frame - rd->len : 0;
    else if (want < 4096)
        want = 4096; /* read ahead a little: pipelined small messages */
    if (want == 0)
        return 0;
    if (bg__rd_reserve(rd, rd->len + want) != 0)
        return -1;
    ssize_t n = recv(fd, rd->buf + rd->len, want, MSG_DONTWAIT);
    if (n == 0)
        return -1;
    if (n < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    rd->len += (size_t)n;
    return 1;
}

int bg__rd_peek(bg__rd_t *rd, bg__store_hdr_t *hdr_p, const uint8_t **key_p, const uint8_t **val_p)
{
    if (rd->len < BG__HDR)
        return 0;
    bg__store_hdr_t h;
    memcpy(&h, rd->buf, BG__HDR);
    if (h.magic != BG__STORE_MAGIC || h.op == 0 || h.op > BG__OP_MAX ||
        h.key_len > BG_STORE_MAX_KEY || h.val_len > BG_STORE_MAX_VALUE)
        return -1;
    size_t total = BG__HDR + h.key_len + (size_t)h.val_len;
    if (rd->max_frame && total > rd->max_frame)
        return -1;
    if (rd->len < total)
        return 0;
    *hdr_p = h;
    *key_p = rd->buf + BG__HDR;
    *val_p = rd->buf + BG__HDR + h.key_len;
    return 1;
}

void bg__rd_pop(bg__rd_t *rd)
{
    bg__store_hdr_t h;
    memcpy(&h, rd->buf, BG__HDR);
    size_t total = BG__HDR + h.key_len + (size_t)h.val_len;
    memmove(rd->buf, rd->buf + total, rd->len - total);
    rd->len -= total;
}

uint8_t *bg__msg_encode(uint8_t op, uint8_t status, uint32_t arg, const void *key, size_t klen,
                        const void *val, size_t vlen, size_t *len_p)
{
    bg__store_hdr_t h = {.magic = BG__STORE_MAGIC, .op = op, .status = status,
                         .key_len = (uint16_t)klen, .val_len = (uint32_t)vlen, .arg = arg};
    uint8_t *m = malloc(BG__HDR + klen + vlen + 1);
    if (!m)
        return NULL;
    memcpy(m, &h, BG__HDR);
    if (klen)
        memcpy(m + BG__HDR, key, klen);
    if (vlen)
        memcpy(m + BG__HDR + klen, val, vlen);
    *len_p = BG__HDR + klen + vlen;
    return m;
}

bg_status_t bg__write_all(int fd, const void *buf, size_t len, double deadline)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return bg_error(BG_ERR_IO, "store: send failed: %s", strerror(errno));
        double left = deadline - bg_now();
        if (left <= 0)
            return bg_error(BG_ERR_TIMEOUT, "store: send did not finish before the deadline");
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        poll(&pfd, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    }
    return BG_OK;
}

void bg__set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bg_status_t bg__resolve(const char *addr, int port, struct sockaddr_storage *ss, socklen_t *len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int rc = getaddrinfo(addr, ps, &hints, &res);
    if (rc != 0 || !res)
        return bg_error(BG_ERR_INVALID, "store: cannot resolve address \"%s\": %s", addr,
                        gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return BG_OK;
}
