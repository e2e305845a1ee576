/* fuzz/fuzz_store.c: the rendezvous store's server side (transport/store_server.c):
 * its frame decoder (bg__rd_peek) and request handler, driven without
 * sockets through bg__store_fake_feed, over several connections at once.
 *
 * Input: a first byte choosing the server (bit 0: a job token "tok" is
 * required), then records. Each record starts with a byte c: connection
 * (c & 15) modulo (open connections + 1), that many opening a new one; and
 * by c >> 4:
 *   0-9   a well-formed frame from the next 8 bytes {op, status, key_len,
 *         val_len (one byte each), arg (u32 LE)} and then key and value
 *         bytes (cut short at the end of the input), the magic filled in;
 *   10-13 a raw chunk: a length byte, then that many bytes as they come;
 *   14    the same well-formed frame fed in two pieces (a split read);
 *   15    every parked WAIT and BARRIER times out. */
#include "fuzz/fuzz.h"
#include "transport/store.h"

#define MAX_CONNS 16

static size_t take(const uint8_t **p, size_t *rest, size_t want)
{
    size_t n = want < *rest ? want : *rest;
    *p += n;
    *rest -= n;
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bg_fuzz_init();
    if (size < 1)
        return 0;
    bg__store_server_params_t sp = {.addr = NULL, .port = 0, .token = (data[0] & 1) ? "tok" : "",
                                    .world_size = 4, .timeout_s = 60, .heartbeat_ms = 200, .hello_timeout_s = 10};
    bg__store_server_t *s = bg__store_fake_create(&sp);
    if (!s)
        return 0;
    const uint8_t *p = data + 1;
    size_t rest = size - 1;
    int open = 0;
    uint8_t frame[16 + 255 + 255];
    while (rest > 0) {
        uint8_t c = *p;
        take(&p, &rest, 1);
        int conn = (c & 15) % (open + 1 < MAX_CONNS ? open + 1 : MAX_CONNS);
        int mode = c >> 4, r = 0;
        if (mode == 15) {
            bg__store_fake_expire(s);
            continue;
        }
        if (mode >= 10 && mode <= 13) {
            if (rest == 0)
                break;
            size_t len = *p;
            take(&p, &rest, 1);
            const uint8_t *chunk = p;
            len = take(&p, &rest, len);
            r = bg__store_fake_feed(s, conn, chunk, len);
        } else {
            uint8_t f[8] = {0};
            const uint8_t *q = p;
            size_t got = take(&p, &rest, 8);
            memcpy(f, q, got);
            bg__store_hdr_t h = {.magic = BG__STORE_MAGIC, .op = f[0], .status = f[1], .key_len = f[2],
                                 .val_len = f[3]};
            memcpy(&h.arg, f + 4, 4);
            memcpy(frame, &h, sizeof h);
            /* key then value from the input; what the input lacks stays zero-filled */
            size_t body = (size_t)h.key_len + h.val_len;
            memset(frame + sizeof h, 0, body);
            q = p;
            got = take(&p, &rest, body);
            memcpy(frame + sizeof h, q, got);
            size_t total = sizeof h + body;
            if (mode == 14) {
                size_t half = total / 2;
                r = bg__store_fake_feed(s, conn, frame, half);
                if (r == 0)
                    r = bg__store_fake_feed(s, conn, frame + half, total - half);
            } else {
                r = bg__store_fake_feed(s, conn, frame, total);
            }
        }
        if (r == 0 && conn == open)
            open++; /* a new connection that is still open */
        else if (r < 0 && conn < open)
            open--; /* dropped: the last one took its index */
    }
    bg__store_fake_destroy(s);
    return 0;
}
