/* transport/transport_impl.h: the private bodies of bg_comm_t, bg_request_t
 * and bg_group_t, shared by the files of transport/: engine.c (the request
 * engine), liveness.c (the communication thread, failure handling), comm.c
 * (create, UCX setup, teardown), comm_store.c (the bg_store_* API), p2p.c
 * (the public request API), coll.c (groups and collectives) and bootstrap.c.
 * Nothing outside transport/ may include it (tests excepted).
 *
 * Calls between the files go one way, from the top down (checked with nm
 * on the objects; no two files call each other):
 *   coll.c      -> p2p.c (wait, free), comm.c (endpoints), engine.c
 *   p2p.c       -> comm.c (endpoints), engine.c
 *   comm.c      -> liveness.c (the thread's body), comm_store.c, engine.c,
 *                  bootstrap.c, store_server.c, store_client.c, store_wire.c
 *   liveness.c  -> engine.c, store_client.c, store_wire.c
 *   comm_store.c -> engine.c, store_client.c
 *   engine.c, bootstrap.c: no other transport file.
 * What the engine must do to collectives (advance them, fail them, free
 * them) it does through the bg__coll_ops_t table that coll.c hands it when
 * it makes the first group: the step machine lives in coll.c, the requests
 * it posts in engine.c. */
#ifndef BG_TRANSPORT_IMPL_H
#define BG_TRANSPORT_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "brigade/core.h"
#include "brigade/transport.h"
#include "transport/store.h"

/* Room for a failure message forwarded between ranks (a peer's whole
 * BG_STORE_ABORT_MAX text) with the prefixes each hop adds ("rank 1 stopped
 * on an error: left after: ..."); 256 bytes cut the part that says what was
 * wrong. */
#define BG__ERR_MSG_MAX (BG_STORE_ABORT_MAX + 256)

/* 64-bit UCX tag layout:
 *   bits 63..32  user tag (point-to-point) or group id (16) | sequence (10) | step (6)
 *   bit  31      1 for collective traffic, 0 for user point-to-point
 *   bits 30..8   source world rank (so receives match by source with a full mask)
 *   bits  7..0   reserved (0) */
#define BG__TAG_COLL (1ull << 31)
#define BG__MAX_RANKS (1 << 23)
static inline uint64_t bg__tag(uint32_t hi, int coll, int src)
{
    return ((uint64_t)hi << 32) | (coll ? BG__TAG_COLL : 0) | ((uint64_t)(uint32_t)src << 8);
}

typedef enum { BG__RQ_SEND = 0, BG__RQ_RECV = 1, BG__RQ_COLL = 2 } bg__rq_kind_t;

typedef struct bg__coll bg__coll_t;

/* The collectives as the request engine sees them (filled by coll.c; every
 * entry called with the comm's lock held). */
typedef struct bg__coll_ops {
    /* a transfer of @p co finished (with or without an error) */
    void (*sub_done_locked)(bg__coll_t *co, bg_request_t *sub);
    /* post the next steps of every active collective whose transfers finished */
    void (*advance_locked)(bg_comm_t *c);
    /* fail every active collective that involves world rank @p rank (-1: all of them) */
    void (*fail_peer_locked)(bg_comm_t *c, int rank, const char *why);
    /* fail one collective; msg NULL: it ran past the comm's timeout */
    void (*fail_locked)(bg__coll_t *co, bg_status_t st, const char *msg);
    /* free a collective (failing it first when still pending) */
    void (*free)(bg__coll_t *co);
} bg__coll_ops_t;

struct bg_request {
    bg_comm_t *comm;
    bg__rq_kind_t kind;
    int peer;              /* world rank (p2p) */
    uint32_t tag;          /* user tag or collective tag's high word */
    size_t bytes;          /* buffer size */
    size_t recvd;          /* bytes received */
    void *ucx;             /* UCX request while UCX still owns it */
    int ucx_released;      /* UCX's callback ran (it may run inside the posting call) */
    atomic_int done;       /* 1 once complete (successfully or not) */
    bg_status_t status;
    char msg[BG__ERR_MSG_MAX]; /* error message when status < 0 */
    int user_freed;        /* freed by the user while UCX still owned it: free on callback */
    int suspect;           /* UCX failed it like a dead peer would: wait for the liveness verdict */
    double suspect_until;
    ucs_status_t ucs_err;
    double t_start;
    ucp_tag_recv_info_t info;
    bg__coll_t *parent;    /* collective this transfer belongs to */
    bg__coll_t *coll;      /* for BG__RQ_COLL: the collective */
    bg_request_t *prev, *next; /* comm's list of requests UCX owns */
};

struct bg_group {
    bg_comm_t *comm;
    int n;
    int *ranks;            /* world rank of each group rank */
    int me;                /* my group rank, -1 if not a member */
    uint16_t id;
    uint32_t seq;          /* collectives started on this group */
};

struct bg_comm {
    int rank, size, local_rank;
    char addr[256];
    int port;
    char token[256];
    double timeout_s;
    int heartbeat_ms;
    long long small_bytes;     /* BRIGADE_ALLREDUCE_SMALL_BYTES */
    const char *source;    /* which variables the bootstrap used */

    bg__store_server_t *server; /* rank 0 */
    bg__store_client_t kv;      /* request/reply store connection */
    pthread_mutex_t kv_lock;
    bg__store_client_t live;    /* liveness connection (communication thread) */

    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h *eps;              /* per world rank, made on first use */
    void *my_addr;
    size_t my_addr_len;

    pthread_mutex_t lock;       /* the worker, the request list, the collectives */
    bg_request_t *pending;      /* requests UCX owns */
    bg__coll_t *colls;          /* active collectives */
    const bg__coll_ops_t *coll_ops; /* set by the first bg_group_create, before any collective exists */
    void **leaks;               /* buffers abandoned sends may still read; freed at destroy */
    int nleaks, capleaks;

    pthread_t thread;
    atomic_int stop;
    atomic_int active;          /* operations in flight */
    atomic_int demand;          /* API threads wanting the lock or waiting */
    atomic_int sleeping;
    atomic_llong last_api_ns;   /* when an API thread last touched the worker */
    int wake_fd;                /* eventfd: wakes the communication thread */
    double last_heard, last_sent;

    int nsuspects;              /* requests waiting for a liveness verdict */
    atomic_int failed;          /* a peer died or the store was lost */
    atomic_int fail_told;       /* the caller got an error from an operation after the failure */
    atomic_int fail_acked;      /* the host carries on without the failed ranks (bg_comm_acknowledge_failures):
                                   leaving is a clean exit (bye), not "left after" a failure */
    char *dead;                 /* per rank: failed */
    char fail_msg[BG__ERR_MSG_MAX]; /* first failure */
    char abort_msg[BG_STORE_ABORT_MAX]; /* bg_comm_abort's message, sent by the communication thread */
    atomic_int abort_pending;
    /* leave notices (bg_comm_announce_leave / bg_comm_enter_step): positions are epoch << 40 | step */
    atomic_llong position;      /* this rank's: the step it is in */
    int64_t *left_at;           /* per rank: the position it left at, -1: still here (under the lock) */
    atomic_int any_left;
    int64_t leave_pos;          /* this rank's leave, sent by the communication thread */
    atomic_int leave_pending;
    uint32_t epochs;            /* bg_comm_epoch_begin calls */
    pthread_mutex_t scratch_lock; /* reusable collective buffers (no page faults per call) */
    void *scratch[8];
    size_t scratch_bytes[8];
    int group_ids[64][2];       /* (hash, occurrences) for group ids */
    int ngroup_ids;
};

/* Silence after which the store (or a rank, on the store's side) counts as
 * dead; also the longest a suspect request waits for the liveness verdict. */
static inline double bg__live_timeout(const bg_comm_t *c)
{
    double t = c->timeout_s / 2, min = 5 * c->heartbeat_ms / 1000.0;
    return t > min ? t : min;
}

/* engine.c */
void bg__lock(bg_comm_t *c);
void bg__unlock(bg_comm_t *c);
/* Under the lock: progress UCX and advance collectives. Returns events. */
unsigned bg__progress_locked(bg_comm_t *c);
/* Under the lock: post a tagged transfer for a collective (or p2p when parent is NULL). */
bg_status_t bg__post_locked(bg_comm_t *c, bg__rq_kind_t kind, int peer, uint32_t hi, int coll,
                            void *buf, size_t bytes, bg__coll_t *parent, bg_request_t **req_p);
/* Under the lock: fail an operation with @p st and @p msg (cancels or abandons UCX's part). */
void bg__fail_locked(bg_comm_t *c, bg_request_t *r, bg_status_t st, const char *msg);
void bg__request_release_locked(bg_request_t *r);
void bg__leak_locked(bg_comm_t *c, void *p);
void bg__kick(bg_comm_t *c);
/* A buffer of at least @p bytes from the comm's cache (or malloc); give it back with put. */
void *bg__scratch_get(bg_comm_t *c, size_t bytes, size_t *got_p);
void bg__scratch_put(bg_comm_t *c, void *p, size_t bytes);
/* Error status for a peer that failed (message names it), BG_OK if alive. */
bg_status_t bg__peer_status(bg_comm_t *c, int peer, const char *during);
/* Under the lock (or with no other thread left): take @p r off the comm's
 * list of requests UCX owns (teardown). */
void bg__pending_del(bg_comm_t *c, bg_request_t *r);

/* liveness.c */
/* The communication thread's body (@p arg: the comm); comm.c starts and joins it. */
void *bg__comm_thread(void *arg);

/* comm.c */
/* The endpoint to @p peer, made on first use from the address it published in the store. */
bg_status_t bg__ensure_ep(bg_comm_t *c, int peer);

/* comm_store.c */
/* The kv connection's check: a wait ends once any rank failed. */
bg_status_t bg__kv_check(void *arg);
/* A barrier of every rank named @p name (a generation per name), waiting at
 * most @p tmo seconds; the result in *st_p. */
void bg__store_barrier_named(bg_comm_t *c, const char *name, double tmo, bg_status_t *st_p);

/* coll.c exports nothing to the other files: see bg__coll_ops_t. */

/* bootstrap.c */
typedef struct bg__boot {
    int rank, size, local_rank;
    char addr[256];
    int port;
    const char *source;
} bg__boot_t;
bg_status_t bg__bootstrap(const bg_comm_params_t *p, bg__boot_t *b);

#endif
