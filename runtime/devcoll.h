/* runtime/devcoll.h: the group collectives of the runtime's strategies (the
 * tensor group's sums and gathers, ZeRO's reduce-scatters and all-gathers,
 * the data-parallel all-reduce) on backend buffers, behind one interface
 * whose provider is chosen per group when the group is bound:
 *
 *   host     the backend's buffers are host memory (cpu): the transport's
 *            collectives on the buffers themselves (brigade/transport.h);
 *   staging  device buffers (or BRIGADE_STAGING=always) through host memory
 *            (runtime/staging.c: the input copied out on the copy stream
 *            behind an event, the transport's collective on the host copy,
 *            the result copied back, the compute stream made to wait);
 *   direct   a transport that reads device memory (a CUDA-aware UCX, or
 *            BRIGADE_STAGING=direct): collectives that only move bytes (the
 *            all-gather in chunks) on the device buffer itself, the
 *            reductions staged (the transport reduces on the host);
 *   nccl     a CUDA backend with NCCL loadable (dlopen of libnccl.so.2, never
 *            linked) and BRIGADE_COLL=nccl: every collective queued on the
 *            backend's compute stream (its native_stream slot), the group's
 *            unique id sent from its first member over the transport.
 *
 * host, staging and direct run the transport's algorithm on the same bytes
 * in the same order: bitwise the same results. NCCL sums in an order of its
 * own (ring or tree, by size): results agree within rounding (the tests'
 * tolerance for a different summation order, 1e-5 relative L2), and are
 * still equal on every member of the group (NCCL's reductions give every
 * member the same bits), so replicated tensors stay replicated.
 *
 * Every call returns a transfer of runtime/staging.h (bg__xtest, bg__xwait,
 * bg__xfree); with nccl it is complete at once for the host (the compute
 * stream is ordered after it). Must not know what the buffers mean.
 * bg_executor_collective_providers (brigade/executor.h) describes them. */
#ifndef BG_RUNTIME_DEVCOLL_H
#define BG_RUNTIME_DEVCOLL_H

#include "runtime/staging.h"

typedef struct bg__dcoll bg__dcoll_t;


/* Collectives of group g (this rank a member) on the buffers of sg's backend
 * (sg NULL: host buffers, no backend). what names the group in the log line
 * that says which provider it got. BRIGADE_COLL=nccl on a group whose
 * backend cannot use NCCL is an error naming why. */
bg_status_t bg__dcoll_create(bg__staging_t *sg, bg_group_t *g, const char *what, int log_rank, bg__dcoll_t **dc_p);
void bg__dcoll_destroy(bg__dcoll_t *dc); /* NULL is a no-op */
/* "host", "staging", "direct" or "nccl". */
const char *bg__dcoll_provider(const bg__dcoll_t *dc);
bg_group_t *bg__dcoll_group(const bg__dcoll_t *dc);

/* A collective (bg__coll_kind_t) started: in place on recv, or send to
 * recv; buffers valid until the transfer is freed. */
bg_status_t bg__dcoll_start(bg__dcoll_t *dc, bg__coll_kind_t ck, const float *send, float *recv, size_t count,
                            bg_reduce_op_t op, bg__xfer_t **x_p);
/* The same collective on host buffers (the transport in place, whatever the group's provider): for
 * what lives in host memory beside the backend's buffers (a checkpoint's host-held optimizer state). */
bg_status_t bg__dcoll_start_host(bg__dcoll_t *dc, bg__coll_kind_t ck, const float *send, float *recv, size_t count,
                                 bg_reduce_op_t op, bg__xfer_t **x_p);
/* Broadcast of buf (count) from member root; blocking (the host waits). */
bg_status_t bg__dcoll_bcast(bg__dcoll_t *dc, float *buf, size_t count, int root);

#endif
