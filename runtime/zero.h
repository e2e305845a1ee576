/* runtime/zero.h: sharded data parallelism (ZeRO stages 1, 2 and 3) for one
 * model chunk of the executor; see runtime/zero.c (stage 3's parameters:
 * runtime/zero_params.c). Internal to runtime/. */
#ifndef BG_RUNTIME_ZERO_H
#define BG_RUNTIME_ZERO_H

#include "brigade/model.h"
#include "brigade/transport.h"
#include "runtime/devcoll.h"

typedef struct bg__zero bg__zero_t;

/* A gradient bucket of the chunk: layers [lo, hi], floats [off, off + count)
 * of the flat buffers, sharded over the group of dc (levels 1 and 2; level 3
 * shards every bucket over bg__zero_create's). Expert parallelism gives the
 * experts' runs of a bucket buckets of their own, over the replicas that hold
 * the same experts (NULL: this replica alone holds them, nothing sharded). */
typedef struct bg__zero_bucket {
    int lo, hi;
    size_t off, count;
    bg__dcoll_t *dc;
} bg__zero_bucket_t;

/* Sharded state of model @p m over the data-parallel group of @p dc (level 1, 2 or 3; its collectives on the
 * backend's buffers, runtime/devcoll.h), each bucket over its own group (bg__zero_bucket_t.dc):
 * this replica owns chunk (its rank in the bucket's group) of every bucket (bg_group_chunk) and holds
 * the optimizer state of those elements only. The model's own optimizer
 * state must be absent. Level 3: the parameter shard from pstore (--offload params; NULL: the backend). */
bg_status_t bg__zero_create(int level, bg_model_t *m, bg__dcoll_t *dc, const bg__zero_bucket_t *buckets, int nbuckets,
                            bg_optim_kind_t kind, const bg_optim_store_t *pstore, bg__zero_t **z_p);
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
/* Wait for the parameters' all-gathers (levels 1 and 2: every replica's parameters whole after). */
bg_status_t bg__zero_settle(bg__zero_t *z);
/* Collective: every tensor whole in the model's flat buffer (level 3: gathered from the shards, held until
 * the next bg__zero_begin_step; else bg__zero_settle). Before saving, loading or evaluating. */
bg_status_t bg__zero_whole(bg__zero_t *z);
/* Level 3, before a compute of @p layer (ascending: a forward pass, else a backward one): its weights
 * gathered, the next buckets' gathers started. Else nothing. */
bg_status_t bg__zero_gather_layer(bg__zero_t *z, int layer, int ascending);
/* Bytes of parameters this level holds (level 3: the shard and the gather buffers; else all of them). */
size_t bg__zero_param_bytes(const bg__zero_t *z);
/* Level 3: the parameters are sharded (0: the chunk keeps them whole, as at level 2, because the gather
 * buffers would hold as much as the shard saves). */
int bg__zero_params_sharded(const bg__zero_t *z);

/* ---- level 3's parameters (runtime/zero_params.c) ---- */
typedef struct bg__zparams bg__zparams_t;
/* The shard of model m's parameters over dc's group, by the buckets' owned chunks (in bucket order); the flat
 * buffer freed. *zp_p = NULL when dp < 2 or no gather buffer fits below what the shard saves. The shard
 * from store (--offload params: host memory or files, not the backend's, and not in bg__zparams_bytes;
 * NULL: the backend). */
bg_status_t bg__zparams_create(bg_model_t *m, bg__dcoll_t *dc, const bg__zero_bucket_t *buckets, int nbuckets,
                               const bg_optim_store_t *store, bg__zparams_t **zp_p);
void bg__zparams_destroy(bg__zparams_t *zp);
void bg__zparams_cancel(bg__zparams_t *zp);
/* The owned parameters: bucket b's owned chunk at its offset in the shard (that of the optimizer state). */
float *bg__zparams_shard(bg__zparams_t *zp);
/* Before a compute of @p layer: its bucket gathered (waited for), the next ones started. */
bg_status_t bg__zparams_layer(bg__zparams_t *zp, int layer, int ascending);
/* Bucket b's owned chunk is about to be updated: its gathered copy dropped, its upload (a host-held shard's)
 * waited for. NULL: nothing. */
void bg__zparams_release(bg__zparams_t *zp, int b);
/* Collective: the flat buffer held and whole (until bg__zparams_shard_again). */
bg_status_t bg__zparams_materialize(bg__zparams_t *zp);
/* The owned chunks taken from the flat buffer (it may have been loaded), the buffer freed. */
bg_status_t bg__zparams_shard_again(bg__zparams_t *zp);
size_t bg__zparams_bytes(const bg__zparams_t *zp);
int64_t bg__zparams_waits(const bg__zparams_t *zp);
/* Gathers started so far (a test counts them). */
int64_t bg__zparams_gathers(const bg__zparams_t *zp);
/* The layers' gathers so far (not a materialize's): seconds from each one's start until it was found
 * complete (polled at every layer's call, so at most a layer late; or waited for), and of those the
 * seconds a compute blocked waiting. 1 - exposed / gather is the share the computes hid. */
void bg__zparams_gather_seconds(const bg__zparams_t *zp, double *gather_s, double *exposed_s);
/* BRIGADE_ZERO_PREFETCH: buckets gathered ahead of the one computing (0..15; default 1). */
int bg__zero_prefetch(void);
/* Cancel what is in flight (after a failed step). */
void bg__zero_cancel(bg__zero_t *z);
/* How many times this chunk's sharding has blocked so far (a reduce-scatter
 * or an all-gather not yet complete when needed): the executor's trace marks
 * the calls that waited (rs_wait, ag_wait). */
int64_t bg__zero_waits(const bg__zero_t *z);
/* Level 3 with sharded parameters: 1 and the layers' gathers' seconds (bg__zparams_gather_seconds);
 * else 0 and zeros. */
int bg__zero_gather_seconds(const bg__zero_t *z, double *gather_s, double *exposed_s);
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
