/* runtime/staging.h: the executor's transfers between ranks (sends, receives,
 * data-parallel reductions, the parameter servers' pushes and pulls) of
 * backend buffers. Where the backend's buffers are host memory the transport
 * reads them in place; where they are device memory (ops->device_buffers)
 * every transfer is staged through host memory from ops->host_alloc (pinned
 * on CUDA): a send copies chunk i to the host and starts sending it before it
 * copies chunk i+1; a receive posts one receive
 * per chunk (equal tags match in order) and copies each chunk to the device as
 * it lands; a reduction copies the buffer out, reduces it on the host and
 * copies it back, and so does every group collective of runtime/devcoll.h
 * (bg__xcoll: the input out, the transport's collective, the result back).
 * BRIGADE_STAGING=always sends host buffers through the same path (tests);
 * BRIGADE_STAGE_CHUNK_KB sets the chunk. Results are bitwise those of the
 * direct path: the bytes and the reduction are the same.
 *
 * Where the transport reads device memory itself (bg_comm_device_memory: a
 * CUDA-aware UCX), sends and receives skip the host ("direct"): the same
 * chunks, each request on the device buffer itself, a send started once an
 * event recorded after its producer has completed, a receive posted once an
 * event recorded after the buffer's earlier users has; reductions stay
 * staged. BRIGADE_STAGING=direct forces that path (tests: on cpu-async its
 * events and queue run on host buffers).
 *
 * With a backend that has streams (the event and *_async slots: cuda, and
 * cpu-async in tests) nothing here waits for the compute stream: a send or a
 * reduction records an event after the producing kernels, its device-to-host
 * copies are queued on the copy stream behind that event, and its requests
 * (chunk i's send, the reduction's collective) start once their copy's event
 * has completed, checked by bg__staging_progress, which every call below
 * runs; transfers start strictly in the order queued (so collectives keep
 * their order on every rank). A receive's chunks are copied to the device on
 * the copy stream as they land, behind an event recorded when the receive was
 * posted (the buffer's earlier readers), and once the last is queued the
 * compute stream (not the host) waits for it; a reduction's result likewise.
 * A host block is reused only once the copies reading it have completed. */
#ifndef BG_RUNTIME_STAGING_H
#define BG_RUNTIME_STAGING_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "brigade/backend.h"
#include "brigade/transport.h"

typedef struct bg__xfer bg__xfer_t; /* a transfer: one transport request, or a staged set of them */

/* The group collectives on backend buffers (bg__xcoll; fp32), as the
 * transport's of the same names (brigade/transport.h). */
typedef enum {
    BG__COLL_ALLREDUCE,              /* buf (count) reduced in place on every member */
    BG__COLL_REDUCE_SCATTER_INPLACE, /* buf (count): member i's chunk (bg_group_chunk) reduced in place */
    BG__COLL_ALLGATHER_CHUNKS,       /* buf (count): member i's chunk gathered to every member */
    BG__COLL_ALLGATHER,              /* send (count) to recv (count x size), member i's at i count */
    BG__COLL_REDUCE_SCATTER,         /* send (count x size) reduced, member i's count to recv (count) */
} bg__coll_kind_t;

/* Host staging of one executor: the decision and a cache of host blocks (so
 * that steady-state steps allocate no pinned memory). */
typedef struct bg__staging {
    bg_backend_t *be;
    int on;               /* 1: transfers are staged (sends and receives: unless direct) */
    int direct;           /* 1 (with on): sends and receives hand the backend's buffer to the transport, in
                           * the staged path's chunks, ordered against the compute stream by events; the
                           * reductions stay staged (the transport reduces on the host) */
    size_t chunk;         /* bytes per staged point-to-point message */
    pthread_mutex_t lock; /* the block cache */
    struct bg__stage_block {
        void *p;
        size_t bytes;
    } *free_blocks;
    int nfree, capfree;
    size_t transfers, chunks, bytes; /* staged so far (brigade's info log) */
    size_t direct_transfers, direct_bytes; /* handed to the transport directly so far (direct) */
    size_t host_bytes, host_peak;    /* staging memory held now / at most */
    /* the backend's streams (ops->to_host_async and the event slots), used
     * when it has them: */
    int async;
    size_t queued, deferred; /* transfers queued behind their copies; those not started at once (the log) */
    struct bg__xfer *head, *tail; /* transfers whose requests wait for their copies, in the order queued */
    bg_event_t **free_events;    /* completed events for reuse */
    int nevents, capevents;
    struct bg__held_block {      /* host blocks a host-to-device copy still reads */
        void *p;
        size_t bytes;
        bg_event_t *ev;
    } *held;
    int nheld, capheld;
} bg__staging_t;

/* Reads BRIGADE_STAGING and BRIGADE_STAGE_CHUNK_KB; *sg is ready for the calls below. comm (NULL: none)
 * says whether the transport reads device memory itself (bg_comm_device_memory). */
bg_status_t bg__staging_init(bg__staging_t *sg, bg_backend_t *be, const bg_comm_t *comm);
/* Host memory for copies to and from be's buffers: its host_alloc (pinned on CUDA), else aligned malloc;
 * NULL on failure. bg__host_free frees it (NULL: nothing). */
void *bg__host_alloc(bg_backend_t *be, size_t bytes);
void bg__host_free(bg_backend_t *be, void *p);
/* Frees the cached host blocks (every transfer freed first). */
void bg__staging_fini(bg__staging_t *sg);
/* How device buffers reach other ranks, for `brigade info` and the log. */
const char *bg_executor_device_transport(void);

/* As bg_isend / bg_irecv / bg_group_iallreduce, on a backend buffer. */
bg_status_t bg__xsend(bg__staging_t *sg, bg_comm_t *c, int peer, uint32_t tag, const void *buf, size_t bytes,
                      bg__xfer_t **x_p);
bg_status_t bg__xrecv(bg__staging_t *sg, bg_comm_t *c, int peer, uint32_t tag, void *buf, size_t bytes,
                      bg__xfer_t **x_p);
bg_status_t bg__xallreduce(bg__staging_t *sg, bg_group_t *g, float *buf, size_t count, bg_reduce_op_t op,
                           bg__xfer_t **x_p);
/* A collective of kind ck on backend buffers (in place: recv, send unused): staged, the input is copied
 * to a host block (behind an event, with streams), the transport's collective runs on it (the same
 * algorithm and summation order as on host buffers: bitwise the same result) and the result is copied
 * back to recv as a reduction's is; direct, a collective that only moves bytes (allgather in chunks)
 * hands recv to the transport, the others are staged. Buffers stay valid until the transfer is freed. */
bg_status_t bg__xcoll(bg__staging_t *sg, bg_group_t *g, bg__coll_kind_t ck, const float *send, float *recv,
                      size_t count, bg_reduce_op_t op, bg__xfer_t **x_p);
/* Broadcast of buf (count) from member root, blocking: the collectives queued before start first. */
bg_status_t bg__xbcast(bg__staging_t *sg, bg_group_t *g, float *buf, size_t count, int root);
/* Starts the queued requests whose copies have completed; never blocks.
 * Called by every function here; the executor calls it between instructions
 * so that sends leave while it computes. */
void bg__staging_progress(bg__staging_t *sg);
/* A transfer of a request started elsewhere on a host buffer (NULL: *x_p = NULL). */
bg_status_t bg__xwrap(bg__staging_t *sg, bg_request_t *rq, bg__xfer_t **x_p);
/* A transfer complete at once (work ordered on the backend's stream instead: NCCL). */
bg_status_t bg__xdone(bg__staging_t *sg, bg__xfer_t **x_p);
/* *done_p = 1 once complete (a receive's or reduction's data are in buf). */
bg_status_t bg__xtest(bg__xfer_t *x, int *done_p);
bg_status_t bg__xwait(bg__xfer_t *x);
/* Cancels what is pending and frees (NULL is a no-op). A staged send that did
 * not complete keeps its host block (the transport may still read it). With
 * streams, the compute stream is made to wait for the copies the transfer
 * queued, so a device buffer freed after this call is free on every stream
 * (the rule the CUDA pool's reuse relies on: cuda_pool.h). */
void bg__xfree(bg__xfer_t *x);

#endif
