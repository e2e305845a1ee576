/* models/cp_attention.c: context parallelism inside the layers that read
 * positions (docs/executor.md, "Context parallelism"). A member of a group of
 * N holds, of every sequence of T = 2 N c positions, chunks rank and
 * 2N-1-rank of c positions each (causal load balance: each member's queries
 * see about the same number of keys). Attention runs as a ring: the member's
 * key/value block (its packed qkv) goes to the next member while the block
 * in hand is attended to by the backend's block kernel (attention_block_*:
 * the blocked flash kernel with explicit positions), the partial results
 * merged by log-sum-exp; after N steps every query has seen every earlier
 * key. The backward passes the blocks around again, each with the gradient
 * of its keys and values accumulating as it goes, back to its owner at the
 * end. The position table of an embedding is read at the global positions.
 *
 * The ring's five block buffers (5 x the packed qkv) are in the layer's
 * scratch, after its own (bg__cp_ring_bytes), so the stage's memory model
 * counts them. Rotary positions (Llama) are those of the global positions. Must not send a byte itself: the group's ring_start/wait do. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/cp_attention.h"
#include "models/layer_impl.h"

int bg_cp_position(const bg_cp_comm_t *cp, int t, int t_local)
{
    if (!cp)
        return t;
    int c = t_local / 2;
    return t < c ? cp->rank * c + t : (2 * cp->size - 1 - cp->rank) * c + (t - c);
}

/* Global positions of member m's t_local positions into pos. */
static void positions(const bg_cp_comm_t *cp, int m, int t_local, int *pos)
{
    bg_cp_comm_t who = *cp;
    who.rank = m;
    for (int t = 0; t < t_local; t++)
        pos[t] = bg_cp_position(&who, t, t_local);
}

/* One block: the packed qkv (B,T,3C) of n sequences of t positions. */
static size_t block_bytes(int n, int t, int c) { return bg__align64((size_t)n * t * 3 * (size_t)c * sizeof(float)); }
size_t bg__cp_ring_bytes(int n, int t, int c) { return 5 * block_bytes(n, t, c); }

void bg__cp_ring_cost(int size, int n, int t, int c, bg_tp_cost_t *cost)
{
    if (size < 2)
        return;
    double blk = (double)n * t * 3 * c * sizeof(float); /* what a step sends: the packed qkv, unpadded */
    cost->cp_fwd_msgs += size - 1;
    cost->cp_fwd_bytes += (size - 1) * blk;
    cost->cp_bwd_msgs += 2 * size - 1; /* the blocks again (size - 1) and their gradients (size) */
    cost->cp_bwd_bytes += (2 * size - 1) * blk;
}

/* The ring's buffers (at @p ring in the layer's scratch) and position tables of one call. */
typedef struct {
    float *blk[2], *dblk[2]; /* key/value blocks in flight (B,T,3C); their gradients (backward) */
    float *loc;              /* backward, overlapped: a step's own contribution to a block's gradient */
    int *qpos, *kpos;
} ring_t;

static void ring_free(ring_t *r)
{
    free(r->qpos);
    free(r->kpos);
}

static bg_status_t ring_alloc(const bg_layer_t *l, const bg_layer_ctx_t *ctx, void *ring, int c, ring_t *r)
{
    *r = (ring_t){0};
    int T = ctx->in.t;
    size_t blk = block_bytes(ctx->in.n, T, c);
    char *at = ring;
    for (int i = 0; i < 2; i++) {
        r->blk[i] = (float *)(at + (size_t)i * blk);
        r->dblk[i] = (float *)(at + (size_t)(2 + i) * blk);
    }
    r->loc = (float *)(at + 4 * blk);
    r->qpos = malloc((size_t)T * sizeof(int));
    r->kpos = malloc((size_t)T * sizeof(int));
    if (!r->qpos || !r->kpos) {
        ring_free(r);
        return bg_error(BG_ERR_NOMEM, "layer %s: context parallelism's positions", l->name);
    }
    positions(ctx->cp, ctx->cp->rank, T, r->qpos);
    return BG_OK;
}

bg_status_t bg__cp_check(const bg_layer_t *l, const bg_layer_ctx_t *ctx, int hs)
{
    const bg_cp_comm_t *cp = ctx->cp;
    if (!ctx->be->ops->attention_block_forward || !ctx->be->ops->attention_block_backward)
        return bg_error(BG_ERR_UNSUPPORTED, "attention %s: the %s backend has no ring attention kernels "
                        "(attention_block_forward/backward): context parallelism (cp %d) runs on the cpu backend",
                        l->name, ctx->be->ops->name, cp->size);
    if (hs > BG_CP_MAX_HEAD)
        return bg_error(BG_ERR_UNSUPPORTED, "attention %s: head size %d is above ring attention's largest, %d: use "
                        "more heads", l->name, hs, BG_CP_MAX_HEAD);
    if (ctx->in.t % 2 != 0)
        return bg_error(BG_ERR_INVALID, "attention %s: a context member's %d positions are not two equal chunks",
                        l->name, ctx->in.t);
    return BG_OK;
}

/* One ring step's exchange on lane: send, receive, in flight until waited. */
static bg_status_t ring_wait(const bg_cp_comm_t *cp, void **req)
{
    if (!*req)
        return BG_OK;
    bg_status_t st = cp->wait(cp->arg, *req);
    *req = NULL;
    return st;
}

bg_status_t bg__cp_attention_forward(const bg_layer_t *l, const bg_layer_ctx_t *ctx, float *out, float *lse,
                                     const float *qkv, void *ring, int c, int heads)
{
    const bg_cp_comm_t *cp = ctx->cp;
    bg_backend_t *be = ctx->be;
    int B = ctx->in.n, T = ctx->in.t, N = cp->size, hs = c / heads;
    BG_CHECK(bg__cp_check(l, ctx, hs));
    size_t floats = (size_t)B * T * 3 * c;
    ring_t r;
    BG_CHECK(ring_alloc(l, ctx, ring, c, &r));
    bg_status_t st = BG_OK;
    const float *cur = qkv; /* the block in hand: member src's */
    void *req = NULL;
    for (int s = 0, src = cp->rank; s < N && st == BG_OK; s++, src = (src + N - 1) % N) {
        float *next = r.blk[s % 2];
        if (s < N - 1) /* the next block travels while this one is computed */
            st = cp->ring_start(cp->arg, 0, cur, next, floats, &req);
        if (st != BG_OK)
            break;
        positions(cp, src, T, r.kpos);
        be->ops->attention_block_forward(be, out, lse, qkv, cur, r.qpos, r.kpos, s > 0, B, T, heads, hs);
        if ((st = ring_wait(cp, &req)) != BG_OK)
            break;
        cur = next;
    }
    if (st != BG_OK)
        ring_wait(cp, &req);
    ring_free(&r);
    return st;
}

/* One backward ring step's kernel: block cur's contribution to its dK/dV summed
 * into dacc (dQ into dqkv, key tiles in order). */
static void ring_bwd_block(const bg_layer_ctx_t *ctx, float *dqkv, float *dacc, float *dvec, const float *dout,
                           const float *qkv, const float *cur, const float *out, const float *lse, const ring_t *r,
                           int heads, int hs)
{
    bg_backend_t *be = ctx->be;
    be->ops->attention_block_backward(be, dqkv, dacc, dvec, dout, qkv, cur, out, lse, r->qpos, r->kpos, ctx->in.n,
                                      ctx->in.t, heads, hs);
}

/* The backward ring. A block's dK/dV accumulator travels with the block:
 * member m adds its queries' contribution and passes it on, the last hop
 * bringing each owner its own block's gradient summed over every member.
 * Overlapped (BRIGADE_CP_OVERLAP=on, the default): step s's contribution is
 * computed into a block of its own (r.loc, zeroed) while the accumulator of
 * step s-1 is still in flight, then added to it when it arrives and sent
 * on. The kernel adds each key row's contribution to the accumulator once
 * (acc = acc + local, the local sum started from +0), so both orders do the
 * same additions: the results are bitwise those of the serial order (off),
 * which accumulates in place and waits for each hop before the next step. */
bg_status_t bg__cp_attention_backward(const bg_layer_t *l, const bg_layer_ctx_t *ctx, float *dqkv,
                                      float *dvec, const float *dout, const float *qkv, const float *out,
                                      const float *lse, void *ring, int c, int heads)
{
    const bg_cp_comm_t *cp = ctx->cp;
    bg_backend_t *be = ctx->be;
    int B = ctx->in.n, T = ctx->in.t, N = cp->size, hs = c / heads;
    int overlap = 1;
    BG_CHECK(bg_config_on("BRIGADE_CP_OVERLAP", &overlap));
    size_t floats = (size_t)B * T * 3 * c;
    ring_t r;
    BG_CHECK(bg__cp_check(l, ctx, hs));
    BG_CHECK(ring_alloc(l, ctx, ring, c, &r));
    be->ops->fill(be, dqkv, 0.0f, floats);
    be->ops->fill(be, r.dblk[0], 0.0f, floats); /* the gradient of this member's own block starts here */
    bg_status_t st = BG_OK;
    const float *cur = qkv;
    void *req = NULL, *dreq = NULL;
    int s = 0;
    for (int src = cp->rank; s < N && st == BG_OK; s++, src = (src + N - 1) % N) {
        float *next = r.blk[s % 2], *dacc = r.dblk[s % 2];
        if (s > 0 && (st = ring_wait(cp, &req)) != BG_OK) /* block src arrived */
            break;
        if (s < N - 1 && (st = cp->ring_start(cp->arg, 0, cur, next, floats, &req)) != BG_OK)
            break;
        positions(cp, src, T, r.kpos);
        if (s > 0 && overlap) { /* the previous accumulator (block src's) travels while this computes */
            be->ops->fill(be, r.loc, 0.0f, floats);
            ring_bwd_block(ctx, dqkv, r.loc, dvec, dout, qkv, cur, out, lse, &r, heads, hs);
            if ((st = ring_wait(cp, &dreq)) != BG_OK)
                break;
            be->ops->axpy(be, dacc, 1.0f, r.loc, floats);
        } else {
            if ((st = ring_wait(cp, &dreq)) != BG_OK)
                break;
            ring_bwd_block(ctx, dqkv, dacc, dvec, dout, qkv, cur, out, lse, &r, heads, hs);
        }
        /* this block's gradient goes on with it; the next block's arrives with it (the last hop brings
         * this member's own block's, summed over every member) */
        if ((st = cp->ring_start(cp->arg, 1, dacc, r.dblk[(s + 1) % 2], floats, &dreq)) != BG_OK)
            break;
        cur = next;
    }
    if (st == BG_OK)
        st = ring_wait(cp, &dreq);
    if (st == BG_OK) /* q part of the gradient block is 0: its key and value parts into dqkv */
        be->ops->axpy(be, dqkv, 1.0f, r.dblk[N % 2], floats);
    ring_wait(cp, &req);
    ring_wait(cp, &dreq);
    ring_free(&r);
    return st;
}

bg_status_t bg__cp_rope(const bg_layer_ctx_t *ctx, float *out, const float *in, int cin, int G, int R, int hs,
                       float theta, int inverse)
{
    int B = ctx->in.n, T = ctx->in.t, h = T / 2;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < 2; k++) { /* each chunk rotated by its global positions */
            size_t row = (size_t)b * T + (size_t)k * h;
            ctx->be->ops->rope(ctx->be, out + row * cin, in + row * cin, 1, h, G, R, hs, theta,
                               bg_cp_position(ctx->cp, k * h, T), inverse);
        }
    return BG_OK;
}

void bg__cp_pos_table(const bg_layer_ctx_t *ctx, float *y, const float *x, int nseq, int first, int n, int t_local,
                      int c, int grad)
{
    bg_backend_t *be = ctx->be;
    for (int b = 0; b < nseq; b++)
        for (int t = 0, len; t < n; t += len) {
            int p0 = bg_cp_position(ctx->cp, first + t, t_local);
            for (len = 1; t + len < n && bg_cp_position(ctx->cp, first + t + len, t_local) == p0 + len; len++) {
            }
            size_t row = ((size_t)b * n + t) * c, pos = (size_t)p0 * c; /* y += x: table rows at pos */
            be->ops->axpy(be, y + (grad ? pos : row), 1.0f, x + (grad ? row : pos), (size_t)len * c);
        }
}

bg_status_t bg__cp_embedding_forward(const bg_layer_ctx_t *ctx, float *out, const float *wte, const float *wpe,
                                     int c)
{
    int B = ctx->in.n, T = ctx->in.t, h = T / 2;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < 2; k++) { /* each chunk reads the table from its global position */
            size_t row = (size_t)b * T + (size_t)k * h;
            int p0 = bg_cp_position(ctx->cp, k * h, T);
            ctx->be->ops->embedding_forward(ctx->be, out + row * c, ctx->tokens + row, wte, wpe + (size_t)p0 * c, 1,
                                            h, c);
        }
    return BG_OK;
}

bg_status_t bg__cp_embedding_backward(const bg_layer_ctx_t *ctx, float *dwte, float *dwpe, const float *dout, int c)
{
    int B = ctx->in.n, T = ctx->in.t, h = T / 2;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < 2; k++) {
            size_t row = (size_t)b * T + (size_t)k * h;
            int p0 = bg_cp_position(ctx->cp, k * h, T);
            ctx->be->ops->embedding_backward(ctx->be, dwte, dwpe + (size_t)p0 * c, dout + row * c, ctx->tokens + row,
                                             1, h, c);
        }
    return BG_OK;
}
