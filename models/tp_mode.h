/* models/tp_mode.h: a split layer's tensor-parallel mode as data (tensor or
 * sequence parallelism): the collectives its group runs at the boundary of a
 * tensor-parallel region, each paired with the GEMM beside it. Used by
 * models/tp_layers.c alone; it knows nothing of any layer. */
#ifndef BG_MODELS_TP_MODE_H
#define BG_MODELS_TP_MODE_H

#include "models/layer_impl.h"

/* A split layer's tensor-parallel mode, as data: the collectives of the
 * region it enters (column linear, vocabulary head: its input is the
 * region's) or leaves (row linear, vocabulary embedding: its output), as
 * Megatron's ColumnParallelLinear and RowParallelLinear with and without
 * sequence_parallel:
 *                      entry: forward, backward    exit: forward, backward
 *   tensor parallel    identity, all-reduce        all-reduce, identity
 *   sequence parallel  all-gather, reduce-scatter  reduce-scatter, all-gather
 * Each pairs a collective with the GEMM next to it, so that the two overlap.
 * The layers are written once against this table; a mode's arguments n, tl
 * are the sequences and this member's positions of each (tl = t, the whole
 * sequence, in tensor parallelism). */
typedef struct bg__tp_mode {
    /* 1: outside the region the sequence is split over the group (t = tl x T) */
    int seq;
    /* calls of a gather (the identity's: 0) and the share of an all-reduce's bytes that one call moves, for
     * the planner, which costs every call as an all-reduce (a gather or a reduce-scatter moves half) */
    int gather_calls;
    double call_share;
    /* *full_p = the full (n, T tl, c) activation from this member's local (n, tl, c): local itself, or full */
    bg_status_t (*gather)(const bg_tp_comm_t *g, bg_backend_t *be, const float *local, float *full, float *tmp,
                          int n, int tl, int c, const float **full_p);
    /* local (n, tl, c) = this member's positions of full (n, T tl, c) summed over the group; full is local
     * itself in tensor parallelism (summed in place), else full and tmp are clobbered */
    bg_status_t (*reduce)(const bg_tp_comm_t *g, bg_backend_t *be, float *full, float *local, float *tmp, int n,
                          int tl, int c);
    /* out (n, T tl, c_out) = gather(local (n, tl, k)) x w (w^T when trans_b) (sp_gather_gemm) */
    bg_status_t (*gather_gemm)(const bg_tp_comm_t *g, bg_backend_t *be, int trans_b, int n, int tl, int k, int c_out,
                               const float *local, const float *w, float *full, float *tmp, float *out);
    /* local (n, tl, c_out) = reduce(a (n, T tl, k) x w), its sums left running in defer when it allows
     * (sp_gemm_reduce_scatter, gemm_sum) */
    bg_status_t (*gemm_reduce)(const bg_tp_comm_t *g, bg_backend_t *be, int trans_b, int n, int tl, int c_out, int k,
                               const float *a, const float *w, float *full, float *tmp, float *local,
                               bg_tp_deferred_t *defer);
    /* dw += A^T B with A (gather_a) or B gathered; *gathered_p: that operand (sp_gather_weight_grad) */
    bg_status_t (*gather_weight_grad)(const bg_tp_comm_t *g, bg_backend_t *be, int gather_a, int n, int tl, int ka,
                                      int kb, const float *a, const float *b, float *full, float *tmp, float *dw,
                                      const float **gathered_p);
} bg__tp_mode_t;

extern const bg__tp_mode_t bg__tp_tensor;   /* tensor parallelism: the activation outside a region is whole */
extern const bg__tp_mode_t bg__tp_sequence; /* sequence parallelism: it is split along t */

/* The whole sequence of a region's input (n, tl, c) or output: t x T in sequence parallelism. */
static inline bg_shape_t bg__tp_full(const bg__tp_mode_t *m, int tp, bg_shape_t local)
{
    return (bg_shape_t){local.n, local.t * (m->seq ? tp : 1), local.c};
}
/* This member's positions of a whole sequence of t: t / T in sequence parallelism (T divides t). */
static inline int bg__tp_local(const bg__tp_mode_t *m, int tp, int t) { return m->seq ? t / tp : t; }
/* The local positions of a region's output of t positions: t / T in sequence parallelism (BG_ERR_INVALID
 * naming layer l when tp does not divide t). */
bg_status_t bg__tp_split(const bg_layer_t *l, const bg__tp_mode_t *m, int t, int tp, int *tl_p);
/* Bytes of a full activation of n sequences of t positions of c channels (aligned). */
static inline size_t bg__tp_bytes(int n, int t, int c) { return bg__align64((size_t)n * t * c * sizeof(float)); }
/* The region's scratch: full = at, tmp = at + first bytes (NULL, NULL in tensor parallelism, which needs none). */
static inline void bg__tp_bufs(const bg__tp_mode_t *m, void *at, size_t first, float **full_p, float **tmp_p)
{
    *full_p = m->seq ? (float *)at : NULL;
    *tmp_p = m->seq ? (float *)((char *)at + first) : NULL;
}
/* k collectives of (rows, c) floats each, for the planner */
static inline void bg__tp_cost(const bg__tp_mode_t *m, double *calls, double *bytes, int k, double rows, int c)
{
    *calls += k;
    *bytes += k * m->call_share * rows * c * sizeof(float);
}

#endif
