/* models/cp_attention.h: context parallelism inside the layers that read
 * positions (models/cp_attention.c): ring attention and the position table
 * at global positions. Internal to models/. */
#ifndef BG_MODELS_CP_ATTENTION_H
#define BG_MODELS_CP_ATTENTION_H

#include "brigade/layer.h"

/* The largest head size of the backends' ring attention kernels (backend.h). */
#define BG_CP_MAX_HEAD 128

/* Mark an attention layer ("attention", models/layers.c; "gqa_attention", models/llama_layers.c) as
 * bound to a context group of @p size members (its scratch then holds the ring's blocks, its cost model
 * counts the ring's steps), or unbound (0): bg_model_desc_set_cp calls them on every such leaf. */
void bg__attention_set_ring(bg_layer_t *l, int size);
void bg__gqa_set_ring(bg_layer_t *l, int size);
/* The ring's buffers in an attention layer's scratch: five blocks of the packed qkv (n, t, 3c). */
size_t bg__cp_ring_bytes(int n, int t, int c);
/* The ring's steps and bytes of one attention call over a context group of @p size (< 2: none) into
 * cost's cp_* fields, as bg__cp_attention_forward/backward send them. */
void bg__cp_ring_cost(int size, int n, int t, int c, bg_tp_cost_t *cost);

/* The backend has the ring kernels, the head size fits and the positions are two chunks. */
bg_status_t bg__cp_check(const bg_layer_t *l, const bg_layer_ctx_t *ctx, int hs);
/* out (B,T,C) and lse (B,NH,T) of causal attention over the whole sequence, for this member's
 * positions (ctx->cp), from its qkv (B,T,3C) and the other members' passed around the ring; the ring's
 * blocks at @p ring (bg__cp_ring_bytes, in the layer's scratch). */
bg_status_t bg__cp_attention_forward(const bg_layer_t *l, const bg_layer_ctx_t *ctx, float *out, float *lse,
                                     const float *qkv, void *ring, int c, int heads);
/* dqkv (B,T,3C) assigned: dq from every member's keys, dk and dv from every member's queries (the
 * blocks passed around the ring again); dvec (B,NH,T) scratch. */
bg_status_t bg__cp_attention_backward(const bg_layer_t *l, const bg_layer_ctx_t *ctx, float *dqkv,
                                      float *dvec, const float *dout, const float *qkv, const float *out,
                                      const float *lse, void *ring, int c, int heads);
/* The backend's rope (rows of cin floats) at this member's global positions, chunk by chunk. */
bg_status_t bg__cp_rope(const bg_layer_ctx_t *ctx, float *out, const float *in, int cin, int G, int R, int hs,
                       float theta, int inverse);
/* A position table at this member's global positions, for the rows of its positions [first, first + n)
 * of t_local (nseq sequences of them, rows of c floats, sequence b's at row b n): grad 0: y (the rows)
 * += x (the table's rows); grad 1: y (the table's gradient) += x (the rows). Runs of consecutive global
 * positions in one call each. */
void bg__cp_pos_table(const bg_layer_ctx_t *ctx, float *y, const float *x, int nseq, int first, int n, int t_local,
                      int c, int grad);
/* The embedding with its position table read at this member's global positions. */
bg_status_t bg__cp_embedding_forward(const bg_layer_ctx_t *ctx, float *out, const float *wte, const float *wpe,
                                     int c);
bg_status_t bg__cp_embedding_backward(const bg_layer_ctx_t *ctx, float *dwte, float *dwpe, const float *dout,
                                      int c);

#endif
