/* transport/store.h: the rendezvous store's wire protocol (store_wire.c), its
 * server (store_server.c, run by rank 0 in a thread of its own) and its
 * blocking client (store_client.c). Private to transport/; tests include it
 * to drive the server directly. The server and the client each call only
 * the wire format, never each other.
 *
 * Wire format (host byte order; every rank of a job runs on one architecture):
 *   16-byte header {magic "BGST", op, status, key_len (u16), val_len (u32), arg (u32)}
 *   then key_len bytes of key, then val_len bytes of value.
 * key_len <= BG_STORE_MAX_KEY and val_len <= BG_STORE_MAX_VALUE; anything else,
 * a wrong magic or an unknown op drops the connection (only that one). */
#ifndef BG_TRANSPORT_STORE_H
#define BG_TRANSPORT_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "brigade/status.h"
#include "brigade/transport.h"

#define BG__STORE_MAGIC 0x54534742u /* "BGST" little-endian */

enum {
    BG__OP_HELLO = 1,   /* key = token, arg = rank, status = role */
    BG__OP_SET = 2,     /* key, value */
    BG__OP_GET = 3,     /* key */
    BG__OP_WAIT = 4,    /* key, arg = timeout ms */
    BG__OP_ADD = 5,     /* key, value = int64 delta */
    BG__OP_BARRIER = 6, /* key, arg = count, value = u32 timeout ms */
    BG__OP_HB = 7,      /* heartbeat, both directions on liveness connections */
    BG__OP_BYE = 8,     /* graceful leave on a liveness connection */
    BG__OP_DEAD = 9,    /* server -> clients: arg = rank, value = reason */
    BG__OP_REPLY = 10,  /* status = BG__ST_*, value = payload */
    BG__OP_FAIL = 11,   /* client -> server on a liveness connection: this rank stopped on an error
                           (value = the message); the server announces it to the others as DEAD */
    BG__OP_DEL = 12,    /* key: forget it (a key per checkpoint would otherwise stay for the whole job) */
    BG__OP_LEAVE = 13,  /* client -> server on a liveness connection: this rank leaves (value = its 8-byte
                           position, bg_comm_announce_leave); the server tells the others as LEFT */
    BG__OP_LEFT = 14,   /* server -> clients: arg = rank, value = its LEAVE's position; the rank is not dead */
    BG__OP_MAX = 14,
#define BG_STORE_ABORT_MAX 1024 /* bytes of a FAIL message kept */
};

enum { BG__ROLE_KV = 0, BG__ROLE_LIVE = 1 };
enum { BG__ST_OK = 0, BG__ST_NOTFOUND = 1, BG__ST_TIMEOUT = 2, BG__ST_ERR = 3 };

typedef struct bg__store_hdr {
    uint32_t magic;
    uint8_t op;
    uint8_t status;
    uint16_t key_len;
    uint32_t val_len;
    uint32_t arg;
} bg__store_hdr_t;

#define BG__HDR sizeof(bg__store_hdr_t)

/* Incremental reader of framed messages from a non-blocking socket. */
typedef struct bg__rd {
    uint8_t *buf;
    size_t len, cap;
    size_t max_frame; /* 0: the protocol's limits; else the largest message (header included)
                       * accepted: the server sets BG__PREAUTH_FRAME until the hello, so an
                       * unauthenticated client can never make it buffer more than that */
} bg__rd_t;

/* Before hello, only a HELLO frame of at most this size is accepted (a token <= 256 bytes, no value). */
#define BG__PREAUTH_FRAME (16 + BG_STORE_MAX_KEY)

void bg__rd_free(bg__rd_t *rd);
/* Grow the buffer to hold at least @p need bytes: 0, or -1 on OOM. */
int bg__rd_reserve(bg__rd_t *rd, size_t need);
/* Read what is available: 1 read something, 0 nothing (EAGAIN), -1 EOF or error. */
int bg__rd_fill(bg__rd_t *rd, int fd);
/* 1: a complete message is at the front (*hdr_p, *key_p, *val_p point into the
 * buffer until bg__rd_pop); 0: incomplete; -1: malformed or over the limits. */
int bg__rd_peek(bg__rd_t *rd, bg__store_hdr_t *hdr_p, const uint8_t **key_p, const uint8_t **val_p);
void bg__rd_pop(bg__rd_t *rd);

/* Encode one message into a fresh buffer (*len_p bytes). NULL on OOM. */
uint8_t *bg__msg_encode(uint8_t op, uint8_t status, uint32_t arg, const void *key, size_t klen,
                        const void *val, size_t vlen, size_t *len_p);
/* Blocking write of a whole buffer with a deadline (bg_now() seconds). */
bg_status_t bg__write_all(int fd, const void *buf, size_t len, double deadline);
/* Make @p fd non-blocking with TCP_NODELAY. */
void bg__set_nonblock(int fd);
/* Resolve @p addr:@p port (numeric or a host name) into *ss, *len. */
bg_status_t bg__resolve(const char *addr, int port, struct sockaddr_storage *ss, socklen_t *len);

/* ---- server ---------------------------------------------------------------- */
typedef struct bg__store_server bg__store_server_t;

typedef struct bg__store_server_params {
    const char *addr;   /* numeric IPv4 address or host name to bind (never "any" unless asked: "0.0.0.0") */
    int port;           /* 0: an ephemeral port (tests) */
    const char *token;  /* "" or NULL: no token required */
    int world_size;     /* ranks expected (for liveness and barrier reports) */
    double timeout_s;   /* BRIGADE_TIMEOUT; a liveness connection silent for half of it
                         * (at least 5 heartbeats) is declared dead */
    int heartbeat_ms;   /* period of the server's heartbeats */
    double hello_timeout_s; /* a connection that has not said hello by then is dropped */
} bg__store_server_params_t;

bg_status_t bg__store_server_start(const bg__store_server_params_t *p, bg__store_server_t **srv_p);
int bg__store_server_port(const bg__store_server_t *srv);
/* Number of connections dropped or refused: protocol violations, wrong tokens,
 * no hello in time, evicted or refused for the caps (tests). */
uint64_t bg__store_server_dropped(const bg__store_server_t *srv);
/* Connections open now, and how many of them have not said hello (tests). */
void bg__store_server_conns(bg__store_server_t *srv, int *open_p, int *preauth_p);
/* Wait (at most @p wait_s) until every liveness connection has left, then stop. */
void bg__store_server_stop(bg__store_server_t *srv, double wait_s);

/* ---- the server's read path without sockets (fuzz/, tests) ---------------------
 * A server that never listens and runs no thread: bytes handed to
 * bg__store_fake_feed go through the same decoder and request handler as a
 * socket's, as connection @p conn (0 .. connections open; that count opens a
 * new one). Replies are discarded as if the client read them. */
bg__store_server_t *bg__store_fake_create(const bg__store_server_params_t *p);
/* 0: every complete message handled; -1: the connection was dropped (a
 * violation; the last connection takes its index) or conn is out of range. */
int bg__store_fake_feed(bg__store_server_t *s, int conn, const void *bytes, size_t n);
/* Every parked WAIT or BARRIER answered as if its deadline passed. */
void bg__store_fake_expire(bg__store_server_t *s);
void bg__store_fake_destroy(bg__store_server_t *s);

/* ---- blocking client ------------------------------------------------------------ */
/* check(): called while waiting; a non-OK status aborts the wait with it. */
typedef bg_status_t (*bg__store_check_fn)(void *arg);

typedef struct bg__store_client {
    int fd;
    int rank;
    bg__rd_t rd;
    bg__store_check_fn check;
    void *check_arg;
} bg__store_client_t;

/* Connect and say hello, retrying with backoff (10 ms doubling to 500 ms) until
 * @p deadline (bg_now() seconds) while the store is unreachable, or closes the
 * connection before answering the hello (full, or evicting under a flood of
 * unauthenticated connections). An explicit refusal (wrong token, rank out of
 * range or taken) fails at once. @p check (may be NULL) is asked before each
 * retry; a non-OK status ends the retries with it (a reconnect after the join
 * gives up once the store is known dead). c->check is set to it. */
bg_status_t bg__store_connect(const char *addr, int port, const char *token, int rank, int role,
                              double deadline, bg__store_check_fn check, void *check_arg, bg__store_client_t *c);
void bg__store_close(bg__store_client_t *c);
/* One request and its reply. On BG_OK *st_p is the server's BG__ST_*, and the
 * reply's value (malloc'd, NUL-terminated, may be NULL when empty) is in *val_p. */
bg_status_t bg__store_call(bg__store_client_t *c, uint8_t op, uint32_t arg, const char *key,
                           const void *val, size_t vlen, double deadline, int *st_p,
                           uint8_t **val_p, size_t *vlen_p);

#endif
