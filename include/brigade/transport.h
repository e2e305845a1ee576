/**
 * @file transport.h
 * @brief brigade's transport: bootstrap, rendezvous store, UCX point-to-point,
 *        process groups and collectives, failure detection.
 *
 * Transport moves bytes; it knows nothing of tensors. Collectives take a
 * count of elements and their bg_dtype_t (brigade/core.h): reductions add
 * fp32, fp64, bf16 (through fp32, rounded to nearest even per addition),
 * int32 and int64 (modulo 2^bits) in a fixed order; all-gather and broadcast
 * also take BG_U8 for raw bytes.
 *
 * @code
 *   float out[256], in[256], grad[1024];            // this rank's buffers
 *   bg_comm_t *comm;
 *   bg_comm_params_t p = BG_COMM_PARAMS_INIT;      // everything from the environment
 *   if (bg_comm_create(&p, &comm) != BG_OK) { fprintf(stderr, "%s\n", bg_last_error()); return 1; }
 *   int rank = bg_comm_rank(comm), world = bg_comm_size(comm);
 *
 *   bg_request_t *rq, *sq;                          // point-to-point
 *   bg_irecv(comm, (rank + world - 1) % world, 7, in, sizeof in, &rq);
 *   bg_isend(comm, (rank + 1) % world, 7, out, sizeof out, &sq);
 *   // ... compute while the communication thread moves the bytes ...
 *   bg_wait(sq); bg_wait(rq); bg_request_free(sq); bg_request_free(rq);
 *
 *   int ranks[] = {0, 1};                           // collectives on a group
 *   bg_group_t *g;
 *   bg_group_create(comm, 2, ranks, &g);            // called by ranks 0 and 1 only
 *   bg_group_allreduce(g, grad, 1024, BG_F32, BG_REDUCE_AVG);
 *   bg_group_destroy(g);
 *   bg_comm_destroy(comm);
 * @endcode
 *
 * Ownership: the caller owns the comm (bg_comm_destroy), its groups
 * (bg_group_destroy) and its requests (bg_request_free, before the comm is
 * destroyed); strings returned are static.
 *
 * Thread safety: every function may be called from any thread, concurrently
 * (calls are serialised on the UCX worker's lock). A given bg_request_t must
 * be used by one thread at a time. Groups: collectives on one group must be
 * started in the same order on all of its members (as in MPI); different
 * groups are independent.
 *
 * Buffers: a buffer given to bg_isend/bg_irecv/bg_group_i* belongs to
 * transport until the request completes (bg_test says done, or bg_wait
 * returns) or is cancelled. A send that failed because its peer died may still
 * be read by UCX: its buffer must stay valid until bg_comm_destroy() returns
 * (the request itself may be freed at once). Blocking calls own their buffers
 * only for the call.
 *
 * Failure: a peer that dies (or stops sending heartbeats for BRIGADE_TIMEOUT
 * seconds) makes every pending operation that involves it fail with
 * BG_ERR_PEER and a message naming the rank; an operation that does not
 * complete within BRIGADE_TIMEOUT seconds fails with BG_ERR_TIMEOUT. See
 * docs/transport.md.
 */
#ifndef BRIGADE_TRANSPORT_H
#define BRIGADE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/core.h"
#include "brigade/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bg_comm bg_comm_t;       /**< world communicator */
typedef struct bg_request bg_request_t; /**< a non-blocking operation */
typedef struct bg_group bg_group_t;     /**< a subset of the world's ranks */

/** Parameters of bg_comm_create(). Zero / NULL fields come from the environment. */
typedef struct bg_comm_params {
    size_t size;             /**< sizeof(bg_comm_params_t), set by BG_COMM_PARAMS_INIT */
    int rank;                /**< this process's rank; -1: from the environment */
    int world_size;          /**< number of ranks; 0: from the environment */
    int local_rank;          /**< rank on this machine; -1: from the environment */
    const char *master_addr; /**< rank 0's store address; NULL: from the environment */
    int master_port;         /**< rank 0's store port; 0: from the environment */
    const char *token;       /**< job token; NULL: BRIGADE_JOB_TOKEN */
    double timeout_s;        /**< deadline in seconds; 0: BRIGADE_TIMEOUT */
    int heartbeat_ms;        /**< liveness period; 0: BRIGADE_HEARTBEAT_MS */
    /** 1: install brigade's UCX log handler (ucs_log_push_handler, process-wide,
     *  once per process and never removed). It turns UCX's fatal error for a
     *  shared-memory (CMA) copy from a peer that died into a logged warning and
     *  a failed transfer, and hides UCX's pool-leak warnings of a forced
     *  teardown. Without it such a copy aborts the process, as UCX decides.
     *  0: leave UCX's logging alone. */
    int ucx_log_handler;
} bg_comm_params_t;

/** Defaults of bg_comm_params_t: everything from the environment. */
#define BG_COMM_PARAMS_INIT                                                     \
    { .size = sizeof(bg_comm_params_t), .rank = -1, .world_size = 0,            \
      .local_rank = -1, .master_addr = NULL, .master_port = 0, .token = NULL,  \
      .timeout_s = 0, .heartbeat_ms = 0, .ucx_log_handler = 0 }

/**
 * Join the job: find rank and world (BRIGADE_*, else torchrun's, Open MPI's,
 * Slurm's variables; a world of one needs none), start the store on rank 0 or
 * connect to it, start UCX and the communication thread, and wait until every
 * rank has joined (at most the timeout). Collective over the world.
 */
bg_status_t bg_comm_create(const bg_comm_params_t *params, bg_comm_t **comm_p);
/**
 * The world size bg_comm_create() would find in the environment
 * (BRIGADE_WORLD_SIZE, else torchrun's, Open MPI's, Slurm's variables; 1 when
 * none is set), without joining anything: for a host that derives its layout
 * from the number of ranks it was started with (brigade train --dp auto).
 */
bg_status_t bg_comm_env_world(int *world_p);
/**
 * Leave the job. When every rank is alive this is collective and graceful
 * (barrier, close endpoints, barrier, destroy); after a peer failed it closes
 * everything by force without waiting on anyone. Never hangs.
 */
bg_status_t bg_comm_destroy(bg_comm_t *comm);
int bg_comm_rank(const bg_comm_t *comm); /**< this process's rank in the world */
int bg_comm_size(const bg_comm_t *comm); /**< ranks in the world */
int bg_comm_local_rank(const bg_comm_t *comm); /**< this process's rank on its machine */
/** 1 when the transport reads and writes CUDA device memory itself: the UCX
 *  it runs on lists CUDA among its memory types (a UCX built with CUDA, such
 *  as the libucx-cu13 wheel, on a machine whose driver it can load); else 0.
 *  The executor then hands device buffers to sends and receives directly
 *  (runtime/staging.h). */
int bg_comm_device_memory(const bg_comm_t *comm);
/** The UCX library loaded: its version and file, e.g. "1.13.1 (/lib/x86_64-linux-gnu/libucp.so.0)". */
const char *bg_transport_ucx_version(void);
/** Seconds an operation may wait before it fails with BG_ERR_TIMEOUT. */
double bg_comm_timeout(const bg_comm_t *comm);
/** BG_OK while every peer is alive, else BG_ERR_PEER with the first failure's message. */
bg_status_t bg_comm_health(bg_comm_t *comm);
/** 1 while rank @p peer is alive (no death or abort of it reported), else 0. */
int bg_comm_peer_alive(bg_comm_t *comm, int peer);
/** The host handled every failure reported so far (it carries on without the
 *  ranks that died, as the parameter server does with workers): the
 *  bg_comm_destroy() of this rank no longer reports them as an unclean end,
 *  and it leaves with a clean bye (call it only once this rank's transfers
 *  are done). Operations with the dead ranks still fail. */
void bg_comm_acknowledge_failures(bg_comm_t *comm);
/** This rank stopped on an error: tell every other rank (through the
 *  store), whose operations involving this rank then fail at once with
 *  "rank R stopped on an error: <why>" instead of waiting for a timeout.
 *  This rank's comm counts as failed afterwards. The first call's message
 *  is kept; later calls do nothing. */
bg_status_t bg_comm_abort(bg_comm_t *comm, const char *why);
/** Leave notices: a rank that stops stepping before the others (its host
 *  destroyed the executor, or stopped calling step) tells them, and a rank
 *  that is in, or enters, a later step fails at once with "rank R left the
 *  job after step N ..." instead of waiting for a timeout. A loop over steps
 *  takes an epoch (one per executor, in the same order on every rank),
 *  marks each step it enters (1-based) and announces its leave with the
 *  steps it did; ranks that leave after the same step end cleanly.
 *  bg_comm_enter_step returns BG_ERR_PEER when a rank left before @p step;
 *  bg_comm_announce_leave waits at most 2 s for the notice to go out. */
uint32_t bg_comm_epoch_begin(bg_comm_t *comm);
bg_status_t bg_comm_enter_step(bg_comm_t *comm, uint32_t epoch, int64_t step);
void bg_comm_announce_leave(bg_comm_t *comm, uint32_t epoch, int64_t steps);

/* ---- point-to-point: byte buffers, 32-bit tags ---------------------------- */

/**
 * Start sending @p bytes from @p buf to @p peer with @p tag. Messages from
 * one peer with distinct tags may be received in any order; with equal tags
 * they match in the order sent. @p buf must stay valid until the request
 * completes (see the header comment for a failed send).
 */
bg_status_t bg_isend(bg_comm_t *comm, int peer, uint32_t tag, const void *buf,
                     size_t bytes, bg_request_t **req_p);
/**
 * Start receiving into @p buf (capacity @p bytes) a message from @p peer with
 * @p tag. A message larger than @p bytes fails the request (BG_ERR_TRANSPORT).
 */
bg_status_t bg_irecv(bg_comm_t *comm, int peer, uint32_t tag, void *buf,
                     size_t bytes, bg_request_t **req_p);
/** *done_p = 1 when complete; returns the operation's error if it failed. Progresses the transport once;
 *  a request older than the comm's timeout that nothing progressed fails as under bg_wait, so a loop of
 *  tests ends too. */
bg_status_t bg_test(bg_request_t *req, int *done_p);
/** Wait until complete: BG_OK, or the error (BG_ERR_PEER naming the rank,
 *  BG_ERR_TIMEOUT after the comm's timeout, BG_ERR_CANCELED). */
bg_status_t bg_wait(bg_request_t *req);
/** Cancel a pending operation; wait or test it afterwards as usual. A receive
 *  or a collective completes with BG_ERR_CANCELED (or BG_OK if it had already
 *  completed). A send already in flight may be impossible to cancel: it then
 *  completes normally once delivered, and its buffer is in use until then. */
bg_status_t bg_cancel(bg_request_t *req);
/** Received size of a completed receive (bytes), else 0. */
size_t bg_request_bytes(const bg_request_t *req);
/** Free a request. A request still pending is cancelled first. NULL is a no-op. */
void bg_request_free(bg_request_t *req);
/** Blocking helpers: isend/irecv + wait + free. */
bg_status_t bg_send(bg_comm_t *comm, int peer, uint32_t tag, const void *buf, size_t bytes);
bg_status_t bg_recv(bg_comm_t *comm, int peer, uint32_t tag, void *buf, size_t bytes);

/* ---- groups and collectives ------------------------------------------------- */

/** Reduction of the collectives. */
typedef enum bg_reduce_op {
    BG_REDUCE_SUM = 0, /**< elementwise sum in the elements' type */
    BG_REDUCE_AVG = 1, /**< sum divided by the group size (integers: truncated toward zero) */
} bg_reduce_op_t;

/** Allreduce algorithms. */
typedef enum bg_allreduce_algo {
    BG_ALLREDUCE_AUTO = 0,      /**< by size (BRIGADE_ALLREDUCE_SMALL_BYTES) */
    BG_ALLREDUCE_RING = 1,      /**< ring reduce-scatter + allgather */
    BG_ALLREDUCE_RECURSIVE = 2, /**< recursive doubling */
} bg_allreduce_algo_t;

/**
 * Make a group of @p n world ranks @p ranks (distinct, any order; the group
 * rank of ranks[i] is i). Called by every member with the same list, in the
 * same order relative to its other group creations; local, no communication.
 */
bg_status_t bg_group_create(bg_comm_t *comm, int n, const int *ranks, bg_group_t **group_p);
void bg_group_destroy(bg_group_t *group); /**< frees the group (local; NULL is a no-op) */
int bg_group_rank(const bg_group_t *group);  /**< this process's rank in the group, -1 if not a member */
int bg_group_size(const bg_group_t *group); /**< members */
int bg_group_world_rank(const bg_group_t *group, int group_rank); /**< world rank of member @p group_rank; -1 when out of range */

/** Return once every member has entered the barrier (collective over the group). */
bg_status_t bg_group_barrier(bg_group_t *group);
/** Broadcast @p count elements of type @p dtype in @p buf from group rank @p root. */
bg_status_t bg_group_bcast(bg_group_t *group, void *buf, size_t count, bg_dtype_t dtype, int root);
/** In-place allreduce of @p count elements of type @p dtype in @p buf (not BG_U8). */
bg_status_t bg_group_allreduce(bg_group_t *group, void *buf, size_t count, bg_dtype_t dtype, bg_reduce_op_t op);
/** Non-blocking allreduce: progressed by the communication thread; @p buf
 *  belongs to transport until the request completes. */
bg_status_t bg_group_iallreduce(bg_group_t *group, void *buf, size_t count, bg_dtype_t dtype,
                                bg_reduce_op_t op, bg_request_t **req_p);
/** Same, with an explicit algorithm (benchmarks, tests). */
bg_status_t bg_group_iallreduce_algo(bg_group_t *group, void *buf, size_t count, bg_dtype_t dtype,
                                     bg_reduce_op_t op, bg_allreduce_algo_t algo,
                                     bg_request_t **req_p);
/** Gather @p count elements of type @p dtype from every member: recvbuf holds size * count,
 *  member i's at element i * count. @p sendbuf may alias recvbuf's element rank * count. */
bg_status_t bg_group_allgather(bg_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                               bg_dtype_t dtype);
/** Reduce size * @p count elements of type @p dtype of @p sendbuf; member i gets elements
 *  [i*count, (i+1)*count) of the result in @p recvbuf (count elements). */
bg_status_t bg_group_reduce_scatter(bg_group_t *group, const void *sendbuf, void *recvbuf,
                                    size_t count, bg_dtype_t dtype, bg_reduce_op_t op);
/** Non-blocking bg_group_allgather, the same messages: @p sendbuf is copied before it returns;
 *  @p recvbuf belongs to transport until the request completes. */
bg_status_t bg_group_iallgather(bg_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                                bg_dtype_t dtype, bg_request_t **req_p);
/** Non-blocking bg_group_reduce_scatter, the same messages and sums: @p sendbuf is copied before it
 *  returns; @p recvbuf belongs to transport until the request completes. */
bg_status_t bg_group_ireduce_scatter(bg_group_t *group, const void *sendbuf, void *recvbuf, size_t count,
                                     bg_dtype_t dtype, bg_reduce_op_t op, bg_request_t **req_p);
/** All-to-all with variable counts (expert parallelism's token exchange): this member sends
 *  sendcounts[j] elements of type @p dtype, from element sdispls[j] of @p sendbuf, to group rank j,
 *  and receives recvcounts[i] elements from group rank i at element rdispls[i] of @p recvbuf. Every
 *  recvcounts[i] must equal member i's sendcounts[me] (exchange the counts first, with an alltoallv of
 *  one element per member); its own block is copied and must have equal counts (else BG_ERR_INVALID).
 *  Pairwise exchange in size - 1 steps (step s: to me + s, from me - s); empty messages are not sent.
 *  Blocking: the buffers are the caller's again when it returns; receive blocks must not overlap. */
bg_status_t bg_group_alltoallv(bg_group_t *group, const void *sendbuf, const size_t *sendcounts,
                               const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                               const size_t *rdispls, bg_dtype_t dtype);
/** Non-blocking bg_group_alltoallv, the same messages: its own block is copied before it returns;
 *  both buffers (and nothing else: the count arrays are read now) belong to transport until the
 *  request completes. */
bg_status_t bg_group_ialltoallv(bg_group_t *group, const void *sendbuf, const size_t *sendcounts,
                                const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                const size_t *rdispls, bg_dtype_t dtype, bg_request_t **req_p);
/** Chunk @p i of @p n of a buffer of @p count elements, as the ring
 *  collectives cut it: the first count % n chunks have one element more. */
void bg_group_chunk(size_t count, int n, int i, size_t *off_p, size_t *len_p);
/** Non-blocking in-place reduce-scatter of @p count elements of type @p dtype in @p buf: member
 *  i then holds chunk i (bg_group_chunk) of the reduced buffer, summed in the
 *  order bg_group_iallreduce sums it, bit for bit (a buffer the all-reduce
 *  reduces by recursive doubling is reduced whole); the other chunks hold
 *  partial sums. @p buf belongs to transport until the request completes. */
bg_status_t bg_group_ireduce_scatter_inplace(bg_group_t *group, void *buf, size_t count, bg_dtype_t dtype,
                                             bg_reduce_op_t op, bg_request_t **req_p);
/** Non-blocking in-place allgather: member i contributes chunk i
 *  (bg_group_chunk) of @p buf; afterwards every member holds all chunks. */
bg_status_t bg_group_iallgather_chunks(bg_group_t *group, void *buf, size_t count, bg_dtype_t dtype,
                                       bg_request_t **req_p);

/* ---- the rendezvous store (small values, served by rank 0) ---------------- */

#define BG_STORE_MAX_KEY 256           /**< bytes in a key */
#define BG_STORE_MAX_VALUE (1u << 20)  /**< bytes in a value */

/** Set @p key (at most BG_STORE_MAX_KEY bytes) to @p bytes of @p value (at most
 *  BG_STORE_MAX_VALUE), replacing what it held. */
bg_status_t bg_store_set(bg_comm_t *comm, const char *key, const void *value, size_t bytes);
/** Value of @p key (BG_ERR_NOT_FOUND if unset); at most @p cap bytes copied,
 *  *bytes_p is the full size. */
bg_status_t bg_store_get(bg_comm_t *comm, const char *key, void *value, size_t cap, size_t *bytes_p);
/** Wait until @p key is set (at most the comm's timeout), then get it. */
bg_status_t bg_store_wait(bg_comm_t *comm, const char *key, void *value, size_t cap, size_t *bytes_p);
/** Atomically add @p delta to the integer at @p key (0 if unset); *value_p = new value. */
bg_status_t bg_store_add(bg_comm_t *comm, const char *key, int64_t delta, int64_t *value_p);
/** Forget @p key (BG_ERR_NOT_FOUND if unset): keys set once per event (a
 *  checkpoint) would otherwise hold rank 0's memory for the whole job. */
bg_status_t bg_store_delete(bg_comm_t *comm, const char *key);
/** Barrier over all world ranks through the store (slow path; no UCX). */
bg_status_t bg_store_barrier(bg_comm_t *comm);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_TRANSPORT_H */
