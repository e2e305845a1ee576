/* models/tp_mode.c: the collectives of tensor and sequence parallelism at
 * the boundary of a tensor-parallel region, each fused with the GEMM beside
 * it so that the two overlap, and the two modes' tables (models/tp_mode.h).
 * The group's collectives come through bg_tp_comm_t (runtime/tp.c): this
 * file never sends a byte itself, and knows no layer. Every result is
 * bitwise equal on all members of the group. */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/tp_mode.h"

static bg_status_t allreduce(const bg_tp_comm_t *g, float *buf, size_t n)
{
    return g && g->size > 1 ? g->allreduce(g->arg, buf, n) : BG_OK;
}

/* out (N, n) = a (N, k) x w^T (w: (n, k), trans_b) or a x w (w: (k, n)),
 * then, when `sum`, summed over the group. With a non-blocking sum the rows
 * go in two halves and the first half's sum runs (on the transport's
 * thread) while the second half computes: the reduction overlaps the
 * layer's own independent compute. With `defer` (bg_layer_ctx_t.deferred:
 * a fused backward's input gradient) the two sums are left running there,
 * to overlap the layer's weight gradient too; the same collectives on the
 * same rows, so the same bits. */
static bg_status_t gemm_sum(const bg_tp_comm_t *g, bg_backend_t *be, int sum, int trans_b, int N, int n, int k,
                            const float *a, const float *w, float *out, bg_tp_deferred_t *defer)
{
    int split = sum && g && g->size > 1 && g->iallreduce && g->wait && N >= 2;
    int cut[3] = {0, split ? N / 2 : N, N};
    void *req[2] = {NULL, NULL};
    bg_status_t st = BG_OK;
    for (int h = 0; h < (split ? 2 : 1); h++) {
        int r0 = cut[h], rows = (split ? cut[h + 1] : N) - r0;
        be->ops->gemm(be, 0, trans_b, rows, n, k, 1.0f, a + (size_t)r0 * k, k, w, trans_b ? k : n, 0.0f,
                      out + (size_t)r0 * n, n);
        if (split && st == BG_OK)
            st = g->iallreduce(g->arg, out + (size_t)r0 * n, (size_t)rows * n, &req[h]);
    }
    if (split && st == BG_OK && defer && defer->n + 2 <= BG_TP_DEFER_MAX) {
        defer->req[defer->n++] = req[0];
        defer->req[defer->n++] = req[1];
        return BG_OK;
    }
    for (int h = 0; h < 2; h++) /* every started sum is waited for, also after a failure */
        if (req[h]) {
            bg_status_t ws = g->wait(g->arg, req[h]);
            if (st == BG_OK)
                st = ws;
        }
    if (!split && sum)
        st = allreduce(g, out, (size_t)N * n);
    return st;
}

/* ------------------------------------------------- the regions' collectives */

/* Between the tensor-parallel regions the activation (n, t, c) is either
 * whole on every member (tensor parallelism) or split along t (sequence
 * parallelism): member r holds positions [r tl, (r+1) tl) of every sequence,
 * (n, tl, c) with tl = t / T. A region's collectives move between the two;
 * the sequence-parallel ones below need scratch [full activation][member-
 * order copy]. */

/* full (n, T tl, c) from every member's local (n, tl, c): the group's gather
 * (member-major) into tmp, then each member's rows to their positions. */
static bg_status_t sp_gather(const bg_tp_comm_t *g, bg_backend_t *be, const float *local, float *full, float *tmp,
                             int n, int tl, int c)
{
    int T = g ? g->size : 1;
    size_t piece = (size_t)tl * c, each = (size_t)n * piece;
    if (T == 1) {
        be->ops->copy(be, full, local, each);
        return BG_OK;
    }
    if (n == 1) /* member-major is sequence order */
        return g->allgather(g->arg, local, full, each);
    BG_CHECK(g->allgather(g->arg, local, tmp, each));
    for (int r = 0; r < T; r++)
        for (int b = 0; b < n; b++)
            be->ops->copy(be, full + ((size_t)b * T + r) * piece, tmp + ((size_t)r * n + b) * piece, piece);
    return BG_OK;
}

/* local (n, tl, c) = this member's positions of full (n, T tl, c) summed over
 * the group: full's rows in member order (into tmp), then the group's
 * reduce-scatter (or, without one, a sum of everything). full and tmp are
 * clobbered. */
static bg_status_t sp_reduce_scatter(const bg_tp_comm_t *g, bg_backend_t *be, float *full, float *local, float *tmp,
                                     int n, int tl, int c)
{
    int T = g ? g->size : 1;
    size_t piece = (size_t)tl * c, each = (size_t)n * piece;
    if (T == 1) {
        be->ops->copy(be, local, full, each);
        return BG_OK;
    }
    float *src = full;
    if (n > 1) {
        for (int r = 0; r < T; r++)
            for (int b = 0; b < n; b++)
                be->ops->copy(be, tmp + ((size_t)r * n + b) * piece, full + ((size_t)b * T + r) * piece, piece);
        src = tmp;
    }
    if (g->reduce_scatter)
        return g->reduce_scatter(g->arg, src, local, each);
    BG_CHECK(g->allreduce(g->arg, src, each * (size_t)T));
    be->ops->copy(be, local, src + (size_t)g->rank * each, each);
    return BG_OK;
}

/* local (n, tl, c_out) = this member's positions of a (n, T tl, k) x w
 * (trans_b as gemm_sum) summed over the group. With a non-blocking
 * reduce-scatter the sequences go in two halves, as gemm_sum's rows: the
 * first half's reduce-scatter runs while the second half's GEMM computes.
 * full and tmp: n T tl c_out floats each, clobbered. With `defer` (a fused
 * backward's input gradient, bg_layer_ctx_t.deferred) both reduce-scatters
 * are left running there with their copies into local, to overlap the
 * layer's weight gradient too: tmp must then be scratch that the weight
 * gradient leaves alone. */
static bg_status_t sp_gemm_reduce_scatter(const bg_tp_comm_t *g, bg_backend_t *be, int trans_b, int n, int tl,
                                          int c_out, int k, const float *a, const float *w, float *full, float *tmp,
                                          float *local, bg_tp_deferred_t *defer)
{
    int T = g ? g->size : 1;
    if (T == 1 || n < 2 || !g->ireduce_scatter || !g->wait) {
        BG_CHECK(gemm_sum(g, be, 0, trans_b, n * T * tl, c_out, k, a, w, full, NULL));
        return sp_reduce_scatter(g, be, full, local, tmp, n, tl, c_out);
    }
    size_t piece = (size_t)tl * c_out, seq = (size_t)T * piece;
    int cut[3] = {0, n / 2, n};
    void *req[2] = {NULL, NULL};
    bg_status_t st = BG_OK;
    for (int h = 0; h < 2 && st == BG_OK; h++) {
        int b0 = cut[h], nb = cut[h + 1] - b0, rows = nb * T * tl;
        const float *ah = a + (size_t)b0 * T * tl * k;
        float *fh = full + (size_t)b0 * seq, *th = tmp + (size_t)b0 * seq; /* this half's sequences */
        be->ops->gemm(be, 0, trans_b, rows, c_out, k, 1.0f, ah, k, w, trans_b ? k : c_out, 0.0f, fh, c_out);
        for (int r = 0; r < T; r++) /* member-major: member r's positions of the half's sequences */
            for (int b = 0; b < nb; b++)
                be->ops->copy(be, th + ((size_t)r * nb + b) * piece, fh + (size_t)b * seq + (size_t)r * piece, piece);
        st = g->ireduce_scatter(g->arg, th, (size_t)nb * piece, &req[h]);
    }
    if (st == BG_OK && defer && defer->n + 2 <= BG_TP_DEFER_MAX && defer->ncopy + 2 <= BG_TP_DEFER_MAX) {
        for (int h = 0; h < 2; h++) {
            int b0 = cut[h], nb = cut[h + 1] - b0;
            defer->req[defer->n++] = req[h];
            defer->copy[defer->ncopy].dst = local + (size_t)b0 * piece;
            defer->copy[defer->ncopy].src = tmp + (size_t)b0 * seq + (size_t)g->rank * nb * piece;
            defer->copy[defer->ncopy++].n = (size_t)nb * piece;
        }
        return BG_OK;
    }
    for (int h = 0; h < 2; h++) /* every started one is waited for, also after a failure */
        if (req[h]) {
            bg_status_t ws = g->wait(g->arg, req[h]);
            if (st == BG_OK)
                st = ws;
        }
    for (int h = 0; h < 2 && st == BG_OK; h++) {
        int b0 = cut[h], nb = cut[h + 1] - b0;
        be->ops->copy(be, local + (size_t)b0 * piece, tmp + (size_t)b0 * seq + (size_t)g->rank * nb * piece,
                      (size_t)nb * piece);
    }
    return st;
}

/* out (n, T tl, c_out) = gather(local (n, tl, k)) x w (trans_b as gemm_sum).
 * With a non-blocking gather it runs (member-major, into full) while this
 * member's own rows compute; the output is member-major (in tmp) until the
 * others' rows are done, then put in sequence order. full: n T tl k floats,
 * tmp: n T tl c_out (without the non-blocking gather: n T tl k). */
static bg_status_t sp_gather_gemm(const bg_tp_comm_t *g, bg_backend_t *be, int trans_b, int n, int tl, int k,
                                  int c_out, const float *local, const float *w, float *full, float *tmp, float *out)
{
    int T = g ? g->size : 1, ldw = trans_b ? k : c_out;
    if (T == 1 || !g->iallgather || !g->wait) {
        BG_CHECK(sp_gather(g, be, local, full, tmp, n, tl, k));
        return gemm_sum(g, be, 0, trans_b, n * T * tl, c_out, k, full, w, out, NULL);
    }
    int me = g->rank, rows = n * tl;
    size_t each = (size_t)rows * k, eo = (size_t)rows * c_out, piece = (size_t)tl * c_out;
    void *req = NULL;
    be->ops->copy(be, full + (size_t)me * each, local, each);
    bg_status_t st = g->iallgather(g->arg, full, each, &req);
    if (st == BG_OK)
        be->ops->gemm(be, 0, trans_b, rows, c_out, k, 1.0f, local, k, w, ldw, 0.0f, tmp + (size_t)me * eo, c_out);
    if (req) {
        bg_status_t ws = g->wait(g->arg, req);
        st = st == BG_OK ? ws : st;
    }
    BG_CHECK(st);
    if (me > 0) /* members [0, me), then (me, T): contiguous rows of the member-major input */
        be->ops->gemm(be, 0, trans_b, me * rows, c_out, k, 1.0f, full, k, w, ldw, 0.0f, tmp, c_out);
    if (me < T - 1)
        be->ops->gemm(be, 0, trans_b, (T - 1 - me) * rows, c_out, k, 1.0f, full + (size_t)(me + 1) * each, k, w, ldw,
                      0.0f, tmp + (size_t)(me + 1) * eo, c_out);
    for (int r = 0; r < T; r++)
        for (int b = 0; b < n; b++)
            be->ops->copy(be, out + ((size_t)b * T + r) * piece, tmp + ((size_t)r * n + b) * piece, piece);
    return BG_OK;
}

/* dw (ka x kb) += A^T B over every position, A and B (n, T tl, ka / kb) in
 * sequence order, one of them given as this member's local part (n, tl, k)
 * to gather (gather_a: A). With a non-blocking gather the member's own rows
 * compute while it runs; the sum over positions then goes member by member
 * (member-major: the full operand is copied so, into tmp). *gathered_p = full:
 * the gathered operand, member-major (with the non-blocking gather) or in
 * sequence order (without: sp_gather, then one GEMM). full: n T tl k_gathered
 * floats; tmp: n T tl k_other (without the non-blocking gather: k_gathered). */
static bg_status_t sp_gather_weight_grad(const bg_tp_comm_t *g, bg_backend_t *be, int gather_a, int n, int tl, int ka,
                                         int kb, const float *a, const float *b, float *full, float *tmp, float *dw,
                                         const float **gathered_p)
{
    int T = g ? g->size : 1, kg = gather_a ? ka : kb, kf = gather_a ? kb : ka, N = n * T * tl;
    const float *local = gather_a ? a : b, *other = gather_a ? b : a;
    *gathered_p = full;
    if (T == 1 || !g->iallgather || !g->wait) {
        BG_CHECK(sp_gather(g, be, local, full, tmp, n, tl, kg));
        be->ops->gemm(be, 1, 0, ka, kb, N, 1.0f, gather_a ? full : a, ka, gather_a ? b : full, kb, 1.0f, dw, kb);
        return BG_OK;
    }
    int me = g->rank, rows = n * tl;
    size_t eg = (size_t)rows * kg, ef = (size_t)rows * kf, piece = (size_t)tl * kf;
    for (int r = 0; r < T; r++) /* the full operand member-major */
        for (int q = 0; q < n; q++)
            be->ops->copy(be, tmp + ((size_t)r * n + q) * piece, other + ((size_t)q * T + r) * piece, piece);
    void *req = NULL;
    be->ops->copy(be, full + (size_t)me * eg, local, eg);
    bg_status_t st = g->iallgather(g->arg, full, eg, &req);
    /* member r's rows: A_r^T B_r */
#define SP_WG(r0, cnt)                                                                                              \
    be->ops->gemm(be, 1, 0, ka, kb, (cnt) * rows, 1.0f,                                                            \
                  gather_a ? full + (size_t)(r0) * eg : tmp + (size_t)(r0) * ef, ka,                                 \
                  gather_a ? tmp + (size_t)(r0) * ef : full + (size_t)(r0) * eg, kb, 1.0f, dw, kb)
    if (st == BG_OK)
        SP_WG(me, 1);
    if (req) {
        bg_status_t ws = g->wait(g->arg, req);
        st = st == BG_OK ? ws : st;
    }
    BG_CHECK(st);
    if (me > 0)
        SP_WG(0, me);
    if (me < T - 1)
        SP_WG(me + 1, T - 1 - me);
#undef SP_WG
    return BG_OK;
}

/* Tensor parallelism's collectives, with the signatures of the sequence-
 * parallel ones above: the activation outside the region is whole, so the
 * gather is the identity (full and tmp unused) and the reduce an all-reduce
 * in place (full is local). */
static bg_status_t tp_gather(const bg_tp_comm_t *g, bg_backend_t *be, const float *local, float *full, float *tmp,
                             int n, int tl, int c, const float **full_p)
{
    *full_p = local;
    return BG_OK;
}
static bg_status_t sp_gather_to(const bg_tp_comm_t *g, bg_backend_t *be, const float *local, float *full, float *tmp,
                                int n, int tl, int c, const float **full_p)
{
    *full_p = full;
    return sp_gather(g, be, local, full, tmp, n, tl, c);
}
static bg_status_t tp_reduce(const bg_tp_comm_t *g, bg_backend_t *be, float *full, float *local, float *tmp, int n,
                             int tl, int c)
{
    return allreduce(g, local, (size_t)n * tl * c);
}
static bg_status_t tp_gather_gemm(const bg_tp_comm_t *g, bg_backend_t *be, int trans_b, int n, int tl, int k,
                                  int c_out, const float *local, const float *w, float *full, float *tmp, float *out)
{
    return gemm_sum(g, be, 0, trans_b, n * tl, c_out, k, local, w, out, NULL);
}
static bg_status_t tp_gemm_reduce(const bg_tp_comm_t *g, bg_backend_t *be, int trans_b, int n, int tl, int c_out,
                                  int k, const float *a, const float *w, float *full, float *tmp, float *local,
                                  bg_tp_deferred_t *defer)
{
    return gemm_sum(g, be, 1, trans_b, n * tl, c_out, k, a, w, local, defer);
}
static bg_status_t tp_gather_weight_grad(const bg_tp_comm_t *g, bg_backend_t *be, int gather_a, int n, int tl, int ka,
                                         int kb, const float *a, const float *b, float *full, float *tmp, float *dw,
                                         const float **gathered_p)
{
    *gathered_p = gather_a ? a : b;
    be->ops->gemm(be, 1, 0, ka, kb, n * tl, 1.0f, a, ka, b, kb, 1.0f, dw, kb);
    return BG_OK;
}

const bg__tp_mode_t bg__tp_tensor = {
    .seq = 0,
    .gather_calls = 0,
    .call_share = 1.0,
    .gather = tp_gather,
    .reduce = tp_reduce,
    .gather_gemm = tp_gather_gemm,
    .gemm_reduce = tp_gemm_reduce,
    .gather_weight_grad = tp_gather_weight_grad,
};

const bg__tp_mode_t bg__tp_sequence = {
    .seq = 1,
    .gather_calls = 1,
    .call_share = 0.5,
    .gather = sp_gather_to,
    .reduce = sp_reduce_scatter,
    .gather_gemm = sp_gather_gemm,
    .gemm_reduce = sp_gemm_reduce_scatter,
    .gather_weight_grad = sp_gather_weight_grad,
};

bg_status_t bg__tp_split(const bg_layer_t *l, const bg__tp_mode_t *m, int t, int tp, int *tl_p)
{
    if (m->seq && (tp < 1 || t % tp != 0))
        return bg_error(BG_ERR_INVALID, "layer %s (%s): sequence length %d is not divisible by the tensor-parallel "
                                        "degree %d (sequence parallelism splits the sequence)",
                        l->name, l->ops->type, t, tp);
    *tl_p = m->seq ? t / tp : t;
    return BG_OK;
}
