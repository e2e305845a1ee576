/* tools/launch_output.c: `brigade launch --tag-output`: the ranks' stdout
 * and stderr forwarded line by line, each line prefixed with its rank.
 *
 * Owns: reading a rank's pipe (one read per wake-up), splitting it into whole
 * lines (a line longer than LAUNCH_LINE_MAX forwarded in pieces, a last line
 * without its newline given one), and writing them out in one write per read.
 * Must not: touch the ranks' processes or the launcher's state beyond its
 * output buffer and the streams it is given. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/launch_impl.h"

static void launch_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return; /* EPIPE and friends: drop the output, keep draining the ranks */
        }
        p += k;
        n -= (size_t)k;
    }
}

/* ---------------------------------------------------------------- output */

/* Append "[rank R] " a b "\n" to the output buffer. */
static void launch_emit(launch_t *L, int rank, const char *a, size_t na, const char *b, size_t nb)
{
    char prefix[32];
    int np = snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    size_t need = L->olen + (size_t)np + na + nb + 1;
    if (need > L->ocap) {
        size_t cap = need > 2 * L->ocap ? need : 2 * L->ocap;
        char *p = realloc(L->obuf, cap);
        if (!p)
            return;
        L->obuf = p;
        L->ocap = cap;
    }
    char *o = L->obuf + L->olen;
    memcpy(o, prefix, (size_t)np);
    if (na)
        memcpy(o + np, a, na);
    if (nb)
        memcpy(o + np + na, b, nb);
    o[np + na + nb] = '\n';
    L->olen = need;
}

/* Write the buffered lines. The launcher is the only writer of its stdout and
 * stderr in this mode, so whole lines never mix, and one write per read of a
 * rank's pipe (rather than per line) keeps up with chatty ranks. */
static void launch_flush(launch_t *L, int fd)
{
    launch_write_all(fd, L->obuf, L->olen);
    L->olen = 0;
}

/* Forward the complete lines in data; keep the tail as the partial line. */
static void launch_lines(launch_t *L, int rank, launch_stream_t *s, const char *data, size_t n)
{
    while (n > 0) {
        const char *nl = memchr(data, '\n', n);
        size_t seg = nl ? (size_t)(nl - data) : n;
        if (nl) {
            launch_emit(L, rank, s->buf, s->len, data, seg);
            s->len = 0;
            data += seg + 1;
            n -= seg + 1;
            continue;
        }
        /* no newline: keep it, forwarding in pieces past LAUNCH_LINE_MAX */
        while (seg > 0) {
            size_t room = LAUNCH_LINE_MAX - s->len;
            size_t take = seg < room ? seg : room;
            memcpy(s->buf + s->len, data, take);
            s->len += take;
            data += take;
            seg -= take;
            n -= take;
            if (s->len == LAUNCH_LINE_MAX) {
                launch_emit(L, rank, s->buf, s->len, NULL, 0);
                s->len = 0;
            }
        }
    }
    launch_flush(L, s->out_fd);
}

void launch_close_stream(launch_t *L, int rank, launch_stream_t *s)
{
    if (s->fd < 0)
        return;
    if (s->len > 0) { /* a last line without its newline: forward it with one */
        launch_emit(L, rank, s->buf, s->len, NULL, 0);
        launch_flush(L, s->out_fd);
    }
    s->len = 0;
    close(s->fd);
    s->fd = -1;
}

void launch_read_stream(launch_t *L, int rank, launch_stream_t *s)
{
    char chunk[LAUNCH_READ_CHUNK];
    for (;;) {
        ssize_t k = read(s->fd, chunk, sizeof chunk);
        if (k > 0) {
            launch_lines(L, rank, s, chunk, (size_t)k);
            return; /* one read per wake-up keeps ranks fair */
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        launch_close_stream(L, rank, s); /* EOF or error */
        return;
    }
}
