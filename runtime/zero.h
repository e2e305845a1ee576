/* runtime/zero.h: sharded data parallelism (ZeRO stages 1 and 2) for one
 * model chunk of the executor; see runtime/zero.c. Internal to runtime/. */
#ifndef BG_RUNTIME_ZERO_H
#define BG_RUNTIME_ZERO_H

#include "brigade/model.h"
#include "brigade/transport.h"
#include "runtime/devcoll.h"

typedef struct bg__zero bg__zero_t;

/* A gradient bucket of the chunk: layers [lo, hi], floats [off, off + count)
 * of the flat buffers. */
typedef struct bg__zero_bucket {
    int lo, hi;
    size_t off, count;
} bg__zero_bucket_t;

/* Sharded state of model @p m over the data-parallel group of @p dc (level 1 or 2; its collectives on the
 * backend's buffers, runtime/devcoll.h):
 * this replica owns chunk dp_rank of every bucket (bg_group_chunk) and holds
 * the optimizer state of those elements only. The model's own optimizer
 * state must be absent. */
bg_status_t bg__zero_create(int level, bg_model_t *m, bg__dcoll_t *dc, const bg__zero_bucket_t *buckets, int nbuckets,
                            bg_optim_kind_t kind, bg__zero_t **z_p);
void bg__zero_destroy(bg__zero_t *z);
/* Start the data-parallel reduction of bucket b: a reduce-scatter, or an
 * all-reduce when the bucket holds a tied tensor (whose a + b needs the whole
 * reduced gradient). Either way the sums are those of the all-reduce of
 * --zero 0, bit for bit. */
bg_status_t bg__zero_reduce(bg__zero_t *z, int b, bg__xfer_t **req_p);
/* At the start of a step (level 2: the shard and whole buckets zeroed). */
bg_status_t bg__zero_begin_step(bg__zero_t *z);
/* Level 2: before a backward that writes weight gradients, from @p layer
 * (the chunk's last) down: a buffer for the bucket holding it. */
bg_status_t bg__zero_prepare(bg__zero_t *z, int layer);
/* Level 2, after each layer's weight gradients of a microbatch: reduce-scatter
 * the bucket it closes, fold finished ones, prepare the next layer's bucket. */
bg_status_t bg__zero_layer_done(bg__zero_t *z, int layer);
/* Level 2: are @p layer's weight gradients one microbatch's only (its bucket
 * is reduce-scattered every microbatch, not a whole bucket kept for the step)? */
int bg__zero_per_microbatch(const bg__zero_t *z, int layer);
/* Bucket buffers of level 2 (BRIGADE_ZERO_BUFFERS, 2..16; default 3). */
int bg__zero_buffers(void);
/* Bytes of gradients this level holds (level 2: the shard, whole buckets
 * and the bucket buffers; else the flat buffer). */
size_t bg__zero_grad_bytes(const bg__zero_t *z);
/* Bucket b's reduction is complete (the executor waited for what
 * bg__zero_reduce started; level 2: the last microbatch's reduce-scatter is
 * waited for and folded here). tsq != NULL: adds to tsq[i] the sum of squares
 * of the owned part of each tensor i of the bucket, piece by piece in order. */
bg_status_t bg__zero_bucket_done(bg__zero_t *z, int b, double *tsq);
/* Multiply the owned gradient elements of bucket b by k (clipping, after bg__zero_bucket_done). */
void bg__zero_bucket_scale(bg__zero_t *z, int b, float k);
/* Update the owned elements of bucket b (after bg__zero_bucket_done), then
 * start the all-gather of its parameters. */
bg_status_t bg__zero_bucket_step(bg__zero_t *z, int b, const bg_optim_config_t *opt, int t);
/* Wait for the parameters' all-gathers (every replica's parameters whole). */
bg_status_t bg__zero_settle(bg__zero_t *z);
/* Cancel what is in flight (after a failed step). */
void bg__zero_cancel(bg__zero_t *z);
/* How many times this chunk's sharding has blocked so far (a reduce-scatter
 * or an all-gather not yet complete when needed): the executor's trace marks
 * the calls that waited (rs_wait, ag_wait). */
int64_t bg__zero_waits(const bg__zero_t *z);
/* Elements whose optimizer state this replica holds. */
size_t bg__zero_owned(const bg__zero_t *z);
/* Collective over the group: the full optimizer state into the model (for a
 * checkpoint: full named tensors); bg_model_optim_free afterwards. */
bg_status_t bg__zero_gather_state(bg__zero_t *z);
/* Local: the full optimizer state into the model, with this replica's shard
 * in place and zeros elsewhere (before a checkpoint loads into it). */
bg_status_t bg__zero_expand_state(bg__zero_t *z);
/* After a checkpoint loaded the full state into the model: keep this
 * replica's shard, free the full state. No state in the model: nothing. */
void bg__zero_take_state(bg__zero_t *z);

#endif
