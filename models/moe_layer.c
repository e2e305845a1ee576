/* models/moe_layer.c: the mixture-of-experts leaf (bg_layer_moe): a linear
 * router over d_model to E experts, top-k routing with softmax (renormalised
 * over the top k) or sigmoid gates, a per-expert capacity with dropped
 * assignments counted, SwiGLU experts, and the Switch/GShard load-balancing
 * loss whose gradient reaches the router. Composed from the backend's
 * existing ops (gemm, swiglu, copy, axpy, scale); the routing itself is
 * decided on the host from the router's logits, by one pure function that
 * forward and both backward halves call, so nothing routing-shaped is kept
 * between calls and the assignments are those of the forward, bitwise.
 * Built for expert parallelism (bg_moe_t.ep = P > 1) it holds the experts
 * of its group member (ctx->ep) only: each source rank routes its own
 * tokens, sends each expert's rows to the member holding it (one alltoallv
 * of the per-expert counts, one of the rows) and gets their outputs back
 * (one more), and combines them as the whole layer does; the holder runs
 * each (source, expert) block of rows as its own GEMMs, the shapes one
 * process holding every expert runs. The backward sends the outputs'
 * gradients the same way and the inputs' back. Must not know any model
 * builder or any strategy (the group comes from the runtime). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "models/layer_impl.h"

#define ROWS(s) ((s).n * (s).t)

typedef struct {
    bg_moe_t m;
    double aux;      /* the auxiliary loss of the last forward */
    int64_t dropped; /* dropped assignments of the last forward */
    int64_t dropped_total;
    double aux_total;
    int64_t forwards;
} moe_t;

/* One forward's routing (host). Assignments are grouped by expert, in token order inside an expert. */
typedef struct {
    int N, E, k;
    float *logits; /* (N, E) the router's output */
    double *prob;  /* (N, E) softmax over every expert (the auxiliary loss's P) */
    int *sel;      /* (N, k) chosen experts, best first (ties: the lower index) */
    float *gate;   /* (N, k) their gates */
    int *slot;     /* (N, k) assignment index, -1: dropped by the capacity */
    int *cnt;      /* (E) assignments kept per expert */
    int *off;      /* (E) first assignment of each expert */
    int *tok;      /* (N k) token of each assignment */
    float *agate;  /* (N k) gate of each assignment */
    int *routed;   /* (E) tokens routed to each expert before the capacity (the auxiliary loss's f) */
    int64_t dropped;
    double aux;
} route_t;

static int moe_assign(const bg_moe_t *m, bg_shape_t in) { return ROWS(in) * m->top_k; }
static int moe_ep(const bg_moe_t *m) { return m->ep > 1 ? m->ep : 1; }

/* The capacity of each expert for N tokens: ceil(factor N k / E); N (no limit) when the factor is 0. */
static int moe_capacity(const bg_moe_t *m, int N)
{
    if (m->capacity_factor <= 0)
        return N;
    double c = ceil((double)m->capacity_factor * N * m->top_k / m->experts);
    return c > N ? N : (int)c;
}

/* Rows this rank's experts run at most per call: its own assignments (ep 1); with ep P, what P sources of the
 * same N tokens can send (a token picks each expert once, so min(k, E/P) rows per token per holder, and each
 * expert keeps at most the capacity from each source). */
static int moe_rows(const bg_moe_t *m, bg_shape_t in)
{
    int P = moe_ep(m), N = ROWS(in), el = m->experts / P;
    if (P == 1)
        return moe_assign(m, in);
    int64_t a = (int64_t)P * N * (m->top_k < el ? m->top_k : el), b = (int64_t)m->experts * moe_capacity(m, N);
    return (int)(a < b ? a : b);
}

static void route_free(route_t *r)
{
    free(r->logits);
    free(r->prob);
    free(r->sel);
    free(r->gate);
    free(r->slot);
    free(r->cnt);
    free(r->off);
    free(r->tok);
    free(r->agate);
    free(r->routed);
    memset(r, 0, sizeof(*r));
}

/* Top-k of row n by logit, ties to the lower expert index, and the gates of the chosen. */
static void route_row(const bg_moe_t *m, route_t *r, int n)
{
    const float *lg = r->logits + (size_t)n * r->E;
    int *sel = r->sel + (size_t)n * r->k;
    for (int j = 0; j < r->k; j++) {
        int best = -1;
        for (int e = 0; e < r->E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= sel[i] == e;
            if (!taken && (best < 0 || lg[e] > lg[best]))
                best = e;
        }
        sel[j] = best;
    }
    double mx = lg[0], z = 0, zs = 0;
    for (int e = 1; e < r->E; e++)
        mx = fmax(mx, lg[e]);
    for (int e = 0; e < r->E; e++)
        z += exp(lg[e] - mx);
    for (int e = 0; e < r->E; e++)
        r->prob[(size_t)n * r->E + e] = exp(lg[e] - mx) / z;
    for (int j = 0; j < r->k; j++)
        zs += exp(lg[sel[j]] - lg[sel[0]]);
    for (int j = 0; j < r->k; j++) {
        double l = lg[sel[j]];
        r->gate[(size_t)n * r->k + j] =
            (float)(m->gate == BG_MOE_SIGMOID ? 1.0 / (1.0 + exp(-l)) : exp(l - lg[sel[0]]) / zs);
    }
}

/* The routing of N tokens from the router's logits on the backend (a pure function of them). */
static bg_status_t route(const bg_moe_t *m, bg_backend_t *be, const float *logits_dev, int N, route_t *r)
{
    memset(r, 0, sizeof(*r));
    int E = m->experts, k = m->top_k, A = N * k;
    r->N = N, r->E = E, r->k = k;
    r->logits = malloc((size_t)N * E * sizeof(float));
    r->prob = malloc((size_t)N * E * sizeof(double));
    r->sel = malloc((size_t)A * sizeof(int));
    r->gate = malloc((size_t)A * sizeof(float));
    r->slot = malloc((size_t)A * sizeof(int));
    r->cnt = calloc((size_t)E, sizeof(int));
    r->off = calloc((size_t)E, sizeof(int));
    r->tok = malloc((size_t)A * sizeof(int));
    r->agate = malloc((size_t)A * sizeof(float));
    r->routed = calloc((size_t)E, sizeof(int));
    if (!r->logits || !r->prob || !r->sel || !r->gate || !r->slot || !r->cnt || !r->off || !r->tok || !r->agate ||
        !r->routed) {
        route_free(r);
        return bg_error(BG_ERR_NOMEM, "moe: routing of %d tokens over %d experts", N, E);
    }
    be->ops->to_host(be, r->logits, logits_dev, (size_t)N * E * sizeof(float));
    int cap = moe_capacity(m, N);
    for (int n = 0; n < N; n++) {
        route_row(m, r, n);
        /* earlier tokens first: an expert keeps its first cap tokens */
        for (int j = 0; j < k; j++) {
            int e = r->sel[n * k + j];
            r->routed[e]++;
            if (r->cnt[e] < cap) {
                r->slot[n * k + j] = r->cnt[e]++;
            } else {
                r->slot[n * k + j] = -1;
                r->dropped++;
            }
        }
    }
    for (int e = 1; e < E; e++)
        r->off[e] = r->off[e - 1] + r->cnt[e - 1];
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int *s = &r->slot[n * k + j];
            if (*s < 0)
                continue;
            *s += r->off[r->sel[n * k + j]];
            r->tok[*s] = n;
            r->agate[*s] = r->gate[n * k + j];
        }
    /* aux = E sum_e f_e P_e, f_e the share of the N k choices that picked e, P_e the mean probability */
    for (int e = 0; e < E; e++) {
        double P = 0;
        for (int n = 0; n < N; n++)
            P += r->prob[(size_t)n * E + e];
        r->aux += (double)E * ((double)r->routed[e] / A) * (P / N);
    }
    return BG_OK;
}

/* ---- sizes (A: this rank's assignments, R: rows its experts run, moe_rows; ep 1: R = A, and the pieces
 *      marked ep are empty):
 *      stash [logits (N,E)][U (R,2h)][H (R,h)][Y (A,c)][ep: xr (R,c)][ep: counts (P, E/P)],
 *      wstash [dlogits (N,E)][dU (R,2h)][dY (A,c)][ep: dyr (R,c)],
 *      scratch [xg (N,c); ep: (A,c)][dgate (A)][dH (N,h)][dxg (N,c); ep: (A,c)][ep: yr (R,c)][ep: sendc (E)]
 *      (sendc: the counts this member sends, so that every all-to-all is on the backend's buffers) ---- */

#define FB(x) bg__align64((size_t)(x) * sizeof(float))

static bg_status_t moe_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    BG_CHECK(bg__want_channels(l, in, ((const moe_t *)l->impl)->m.c));
    *out_p = in;
    return BG_OK;
}
static size_t moe_stash(const bg_layer_t *l, bg_shape_t in)
{
    const bg_moe_t *m = &((const moe_t *)l->impl)->m;
    size_t N = (size_t)ROWS(in), A = (size_t)moe_assign(m, in), R = (size_t)moe_rows(m, in);
    size_t ep = moe_ep(m) > 1 ? FB(R * m->c) + FB(m->experts) : 0;
    return FB(N * m->experts) + FB(R * 2 * m->ffn) + FB(R * m->ffn) + FB(A * m->c) + ep;
}
static size_t moe_wstash(const bg_layer_t *l, bg_shape_t in)
{
    const bg_moe_t *m = &((const moe_t *)l->impl)->m;
    size_t N = (size_t)ROWS(in), A = (size_t)moe_assign(m, in), R = (size_t)moe_rows(m, in);
    return FB(N * m->experts) + FB(R * 2 * m->ffn) + FB(A * m->c) + (moe_ep(m) > 1 ? FB(R * m->c) : 0);
}
static size_t moe_scratch(const bg_layer_t *l, bg_shape_t in)
{
    const bg_moe_t *m = &((const moe_t *)l->impl)->m;
    size_t N = (size_t)ROWS(in), A = (size_t)moe_assign(m, in), R = (size_t)moe_rows(m, in);
    size_t xg = moe_ep(m) > 1 ? (A > N ? A : N) : N;
    return 2 * FB(xg * m->c) + FB(A) + FB(N * m->ffn) + (moe_ep(m) > 1 ? FB(R * m->c) + FB(m->experts) : 0);
}
/* router 2NEc; per assignment: up 4ch, swiglu 3h, down 2hc, gated sum 2c (the whole capacity counted) */
static double moe_fwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const bg_moe_t *m = &((const moe_t *)l->impl)->m;
    double N = ROWS(in), A = moe_assign(m, in), c = m->c, h = m->ffn;
    return 2.0 * N * m->experts * c + A * (6.0 * c * h + 3.0 * h + 2.0 * c);
}
static double moe_bwd_flops(const bg_layer_t *l, bg_shape_t in)
{
    const bg_moe_t *m = &((const moe_t *)l->impl)->m;
    double N = ROWS(in), A = moe_assign(m, in), c = m->c, h = m->ffn;
    return 4.0 * N * m->experts * c + A * (12.0 * c * h + 5.0 * h + 4.0 * c);
}

/* ep > 1, per call: the counts' and the rows' all-to-alls (forward: counts, rows out, outputs back; backward:
 * dY out, dx back), each sending P - 1 messages; a member keeps the 1/P of its rows bound for its own experts. */
static void moe_tp_cost(const bg_layer_t *l, bg_shape_t in, bg_tp_cost_t *cost)
{
    const bg_moe_t *m = &((const moe_t *)l->impl)->m;
    int P = moe_ep(m);
    if (P < 2)
        return;
    double rows = (double)moe_assign(m, in) * (P - 1) / P, row = (double)m->c * sizeof(float);
    cost->ep_fwd_msgs += 3.0 * (P - 1);
    cost->ep_fwd_bytes += (double)(P - 1) * (m->experts / P) * sizeof(float) + 2 * rows * row;
    cost->ep_bwd_msgs += 2.0 * (P - 1);
    cost->ep_bwd_bytes += 2 * rows * row;
}

typedef struct {
    float *logits, *U, *H, *Y, *xr, *counts; /* stash (xr, counts: ep only) */
    float *dlogits, *dU, *dY, *dyr;          /* wstash (dyr: ep only) */
    float *xg, *dgate, *dH, *dxg, *yr, *sendc; /* scratch (yr, sendc: ep only) */
} moe_bufs_t;

static moe_bufs_t moe_bufs(const bg_moe_t *m, const bg_layer_ctx_t *ctx)
{
    size_t N = (size_t)ROWS(ctx->in), A = (size_t)moe_assign(m, ctx->in), h = (size_t)m->ffn, c = (size_t)m->c;
    size_t R = (size_t)moe_rows(m, ctx->in);
    int ep = moe_ep(m) > 1;
    size_t xg = ep && A > N ? A : N;
    moe_bufs_t b = {0};
    char *s = ctx->stash;
    b.logits = (float *)s, s += FB(N * m->experts);
    b.U = (float *)s, s += FB(R * 2 * h);
    b.H = (float *)s, s += FB(R * h);
    b.Y = (float *)s, s += FB(A * c);
    if (ep) {
        b.xr = (float *)s, s += FB(R * c);
        b.counts = (float *)s;
    }
    if ((s = ctx->wstash)) {
        b.dlogits = (float *)s, s += FB(N * m->experts);
        b.dU = (float *)s, s += FB(R * 2 * h);
        b.dY = (float *)s, s += FB(A * c);
        b.dyr = ep ? (float *)s : b.dY;
    }
    s = ctx->scratch;
    b.xg = (float *)s, s += FB(xg * c);
    b.dgate = (float *)s, s += FB(A);
    b.dH = (float *)s, s += FB(N * h);
    b.dxg = (float *)s, s += FB(xg * c);
    b.yr = ep ? (float *)s : NULL;
    b.sendc = ep ? (float *)(s + FB(R * c)) : NULL;
    return b;
}

/* What every call of the layer starts from: its sizes, buffers and weights. */
typedef struct {
    moe_t *p;
    const bg_moe_t *m;
    bg_backend_t *be;
    int N, E, c, h;
    moe_bufs_t b;
    const float *wr, *wup, *wdn; /* router (E, c), up (E, 2h, c), down (E, c, h) */
} moe_call_t;

static bg_status_t moe_call(bg_layer_t *l, const bg_layer_ctx_t *ctx, moe_call_t *k)
{
    bg_backend_t *be = ctx->be;
    if (!be->ops->swiglu_forward || !be->ops->swiglu_backward || !be->ops->gemm_strided_batched)
        return bg_error(BG_ERR_UNSUPPORTED, "layer %s (moe): backend %s lacks swiglu or batched gemm kernels",
                        l->name, be->ops->name);
    k->p = l->impl;
    k->m = &k->p->m;
    k->be = be;
    k->N = ROWS(ctx->in), k->E = k->m->experts, k->c = k->m->c, k->h = k->m->ffn;
    k->b = moe_bufs(k->m, ctx);
    k->wr = l->params[0].data, k->wup = l->params[1].data, k->wdn = l->params[2].data;
    return BG_OK;
}

/* rows [base, base+m) of dst (ld c) = rows tok[base..] of src */
static void gather_rows(bg_backend_t *be, float *dst, const float *src, const int *tok, int m, int c)
{
    for (int i = 0; i < m; i++)
        be->ops->copy(be, dst + (size_t)i * c, src + (size_t)tok[i] * c, (size_t)c);
}

/* dst[tok[a]] (+)= w a's row of rows, a in assignment order (expert order, token order inside): each token sums its
 * experts in expert order, whatever the threads or the layout; w NULL: weight 1. */
static void scatter_add(bg_backend_t *be, float *dst, const route_t *r, const float *rows, const float *w, int c)
{
    for (int e = 0; e < r->E; e++)
        for (int i = 0; i < r->cnt[e]; i++) {
            int a = r->off[e] + i;
            be->ops->axpy(be, dst + (size_t)r->tok[a] * c, w ? w[a] : 1.0f, rows + (size_t)a * c, (size_t)c);
        }
}

/* ---- expert parallelism: who sends which rows to whom ---- */

typedef struct {
    const bg_tp_comm_t *g;
    int P, El, R;          /* members, experts per member, rows this member's experts run */
    int *to, *toff;        /* (P) rows this member sends member d, from assignment toff[d] */
    int *from, *foff;      /* (P) rows member s sends here, at row foff[s] of the received rows */
    int *cnt;              /* (P, El) rows member s sends for local expert el */
    size_t *sc, *sd, *rc, *rd; /* (P) an exchange's counts and offsets in floats */
} xplan_t;

static void xplan_free(xplan_t *x)
{
    free(x->to);
    free(x->cnt);
    free(x->sc);
    memset(x, 0, sizeof(*x));
}

/* The group of a layer built for ep > 1, checked. */
static bg_status_t ep_group(const bg_layer_t *l, const bg_layer_ctx_t *ctx, const bg_moe_t *m, const bg_tp_comm_t **g_p)
{
    const bg_tp_comm_t *g = ctx->ep;
    if (!g)
        return bg_error(BG_ERR_INVALID, "layer %s (moe): built for ep %d but runs in no expert-parallel group "
                                        "(bg_model_desc_set_ep)", l->name, m->ep);
    if (g->size != m->ep || !g->alltoallv)
        return bg_error(BG_ERR_INVALID, "layer %s (moe): built for ep %d but runs in an expert-parallel group of %d%s",
                        l->name, m->ep, g->size, g->alltoallv ? "" : " without alltoallv");
    *g_p = g;
    return BG_OK;
}

/* The plan of one call from the routing: the per-expert counts are exchanged (forward: kept in the stash) or
 * read back from the stash (the backward halves). */
static bg_status_t xplan_make(const moe_call_t *k, const bg_tp_comm_t *g, const route_t *r, int exchange, int rmax,
                              xplan_t *x)
{
    memset(x, 0, sizeof(*x));
    int P = g->size, El = k->E / P, me = g->rank;
    x->g = g, x->P = P, x->El = El;
    x->to = calloc(4 * (size_t)P, sizeof(int));
    x->cnt = calloc((size_t)k->E, sizeof(int));
    x->sc = calloc(4 * (size_t)P, sizeof(size_t));
    float *fc = calloc(2 * (size_t)k->E, sizeof(float));
    if (!x->to || !x->cnt || !x->sc || !fc) {
        free(fc);
        xplan_free(x);
        return bg_error(BG_ERR_NOMEM, "moe: expert-parallel plan of %d members", P);
    }
    x->toff = x->to + P, x->from = x->to + 2 * P, x->foff = x->to + 3 * P;
    x->sd = x->sc + P, x->rc = x->sc + 2 * P, x->rd = x->sc + 3 * P;
    bg_status_t st = BG_OK;
    if (exchange) {
        for (int e = 0; e < k->E; e++)
            fc[k->E + e] = (float)r->cnt[e]; /* exact: at most N k < 2^24 */
        for (int d = 0; d < P; d++)
            x->sc[d] = x->rc[d] = (size_t)El, x->sd[d] = x->rd[d] = (size_t)d * El;
        k->be->ops->from_host(k->be, k->b.sendc, fc + k->E, (size_t)k->E * sizeof(float));
        st = g->alltoallv(g->arg, k->b.sendc, x->sc, x->sd, k->b.counts, x->rc, x->rd);
    }
    if (st == BG_OK) /* forward: the counts received; backward: the forward's, from the stash */
        k->be->ops->to_host(k->be, fc, k->b.counts, (size_t)k->E * sizeof(float));
    for (int d = 0; d < P && st == BG_OK; d++) {
        x->toff[d] = r->off[d * El];
        x->to[d] = r->off[(d + 1) * El - 1] + r->cnt[(d + 1) * El - 1] - x->toff[d];
        x->foff[d] = x->R;
        x->from[d] = 0;
        for (int el = 0; el < El; el++)
            x->from[d] += x->cnt[d * El + el] = (int)fc[d * El + el];
        x->R += x->from[d];
    }
    free(fc);
    if (st == BG_OK && x->R > rmax)
        st = bg_error(BG_ERR_INVALID, "moe: expert-parallel member %d receives %d rows, more than the %d its stash "
                                      "holds (do the members' microbatches have the same tokens?)", me, x->R, rmax);
    if (st != BG_OK)
        xplan_free(x);
    return st;
}

/* Rows of width w: each member's to its experts' holders (back 0), or the holders' results back (back 1). */
static bg_status_t ep_rows(const xplan_t *x, int back, const float *send, float *recv, int w)
{
    for (int d = 0; d < x->P; d++) {
        size_t to = (size_t)x->to[d] * w, toff = (size_t)x->toff[d] * w;
        size_t from = (size_t)x->from[d] * w, foff = (size_t)x->foff[d] * w;
        x->sc[d] = back ? from : to, x->sd[d] = back ? foff : toff;
        x->rc[d] = back ? to : from, x->rd[d] = back ? toff : foff;
    }
    return x->g->alltoallv(x->g->arg, send, x->sc, x->sd, recv, x->rc, x->rd);
}

/* The first received row of local expert el from member s. */
static int xrow(const xplan_t *x, int s, int el)
{
    int row = x->foff[s];
    for (int i = 0; i < el; i++)
        row += x->cnt[s * x->El + i];
    return row;
}

/* The experts' forward on rows [base, base + n) of xs (ld c): U, H at those rows, Y (ld c) from its row 0. */
static void experts_forward(const moe_call_t *k, int e, const float *xs, int base, int n, float *Y)
{
    bg_backend_t *be = k->be;
    float *U = k->b.U + (size_t)base * 2 * k->h, *H = k->b.H + (size_t)base * k->h;
    be->ops->gemm(be, 0, 1, n, 2 * k->h, k->c, 1.0f, xs, k->c, k->wup + (size_t)e * 2 * k->h * k->c, k->c, 0.0f, U,
                  2 * k->h);
    be->ops->swiglu_forward(be, H, U, n, k->h);
    be->ops->gemm(be, 0, 1, n, k->c, k->h, 1.0f, H, k->h, k->wdn + (size_t)e * k->c * k->h, k->h, 0.0f, Y, k->c);
}

/* The experts' backward-input on rows [base, base + n): dU from dY (ld c; dH in scratch), and dx (ld c) when
 * asked. */
static void experts_backward(const moe_call_t *k, int e, const float *dY, int base, int n, float *dx)
{
    bg_backend_t *be = k->be;
    float *dU = k->b.dU + (size_t)base * 2 * k->h;
    be->ops->gemm(be, 0, 0, n, k->h, k->c, 1.0f, dY, k->c, k->wdn + (size_t)e * k->c * k->h, k->h, 0.0f, k->b.dH, k->h);
    be->ops->swiglu_backward(be, dU, k->b.U + (size_t)base * 2 * k->h, k->b.dH, n, k->h);
    if (dx)
        be->ops->gemm(be, 0, 0, n, k->c, 2 * k->h, 1.0f, dU, 2 * k->h, k->wup + (size_t)e * 2 * k->h * k->c, k->c,
                      0.0f, dx, k->c);
}

/* The experts' weight gradients from rows [base, base + n): x (ld c) their inputs, dY (ld c) their outputs'. */
static void experts_weight(const moe_call_t *k, float *gup, float *gdn, int e, const float *x, const float *dY,
                           int base, int n)
{
    bg_backend_t *be = k->be;
    be->ops->gemm(be, 1, 0, 2 * k->h, k->c, n, 1.0f, k->b.dU + (size_t)base * 2 * k->h, 2 * k->h, x, k->c, 1.0f,
                  gup + (size_t)e * 2 * k->h * k->c, k->c);
    be->ops->gemm(be, 1, 0, k->c, k->h, n, 1.0f, dY, k->c, k->b.H + (size_t)base * k->h, k->h, 1.0f,
                  gdn + (size_t)e * k->c * k->h, k->h);
}

/* ep 1: each expert's rows gathered from in, then its forward (gup NULL) or its weight gradients. */
static void local_experts(const moe_call_t *k, const route_t *r, const float *in, float *gup, float *gdn)
{
    for (int e = 0; e < k->E; e++) {
        int cnt = r->cnt[e], base = r->off[e];
        if (!cnt)
            continue;
        gather_rows(k->be, k->b.xg, in, r->tok + base, cnt, k->c);
        if (gup)
            experts_weight(k, gup, gdn, e, k->b.xg, k->b.dY + (size_t)base * k->c, base, cnt);
        else
            experts_forward(k, e, k->b.xg, base, cnt, k->b.Y + (size_t)base * k->c);
    }
}

static void moe_record(moe_t *p, const route_t *r)
{
    p->aux = r->aux;
    p->dropped = r->dropped;
    p->dropped_total += r->dropped;
    p->aux_total += r->aux;
    p->forwards++;
}

/* ep > 1: the rows to their holders, the local experts on each (member, expert) block, the outputs back. */
static bg_status_t forward_ep(const bg_layer_t *l, const bg_layer_ctx_t *ctx, moe_call_t *k, route_t *r,
                              const float *in)
{
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(ep_group(l, ctx, k->m, &g));
    xplan_t x;
    BG_CHECK(xplan_make(k, g, r, 1, moe_rows(k->m, ctx->in), &x));
    int A = r->off[k->E - 1] + r->cnt[k->E - 1];
    gather_rows(k->be, k->b.xg, in, r->tok, A, k->c);
    bg_status_t st = ep_rows(&x, 0, k->b.xg, k->b.xr, k->c);
    for (int el = 0; el < x.El && st == BG_OK; el++)
        for (int s = 0; s < x.P; s++) {
            int n = x.cnt[s * x.El + el], base = xrow(&x, s, el);
            if (n)
                experts_forward(k, el, k->b.xr + (size_t)base * k->c, base, n, k->b.yr + (size_t)base * k->c);
        }
    if (st == BG_OK)
        st = ep_rows(&x, 1, k->b.yr, k->b.Y, k->c);
    xplan_free(&x);
    return st;
}

static bg_status_t moe_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    moe_call_t k;
    BG_CHECK(moe_call(l, ctx, &k));
    bg_backend_t *be = k.be;
    be->ops->gemm(be, 0, 1, k.N, k.E, k.c, 1.0f, in, k.c, k.wr, k.c, 0.0f, k.b.logits, k.E);
    route_t r;
    BG_CHECK(route(k.m, be, k.b.logits, k.N, &r));
    bg_status_t st = BG_OK;
    if (moe_ep(k.m) > 1)
        st = forward_ep(l, ctx, &k, &r, in);
    else
        local_experts(&k, &r, in, NULL, NULL);
    if (st == BG_OK) {
        be->ops->fill(be, out, 0.0f, (size_t)k.N * k.c);
        scatter_add(be, out, &r, k.b.Y, r.agate, k.c);
        moe_record(k.p, &r);
    }
    route_free(&r);
    return st;
}

/* dlogits (host, then the wstash) from the gates' gradients and the auxiliary loss */
static bg_status_t router_grad(const moe_t *p, const bg_layer_ctx_t *ctx, const route_t *r, const float *dgate_dev,
                               float *dlogits_dev)
{
    const bg_moe_t *m = &p->m;
    bg_backend_t *be = ctx->be;
    int N = r->N, E = r->E, k = r->k, A = N * k;
    float *dg = malloc((size_t)A * sizeof(float));
    float *dl = calloc((size_t)N * E, sizeof(float));
    if (!dg || !dl) {
        free(dg);
        free(dl);
        return bg_error(BG_ERR_NOMEM, "moe %s: router gradient of %d tokens", ctx->be->ops->name, N);
    }
    be->ops->to_host(be, dg, dgate_dev, (size_t)A * sizeof(float));
    /* the objective holds coef * aux once per token of the microbatch, each weighted by loss_scale */
    double s = (double)m->aux_coef * ctx->loss_scale * N;
    for (int n = 0; n < N; n++) {
        const int *sel = r->sel + (size_t)n * k;
        const float *g = r->gate + (size_t)n * k;
        float *row = dl + (size_t)n * E;
        double dgj[64], dot = 0;
        for (int j = 0; j < k; j++) {
            int a = r->slot[n * k + j];
            dgj[j] = a >= 0 ? dg[a] : 0.0; /* a dropped choice adds nothing, but still shares the softmax */
            dot += (double)g[j] * dgj[j];
        }
        for (int j = 0; j < k; j++)
            row[sel[j]] = (float)(m->gate == BG_MOE_SIGMOID ? dgj[j] * g[j] * (1.0 - g[j]) : g[j] * (dgj[j] - dot));
        if (s != 0) {
            const double *pr = r->prob + (size_t)n * E;
            double pg = 0;
            for (int e = 0; e < E; e++)
                pg += pr[e] * ((double)E * r->routed[e] / A / N);
            for (int e = 0; e < E; e++)
                row[e] += (float)(s * pr[e] * ((double)E * r->routed[e] / A / N - pg));
        }
    }
    be->ops->from_host(be, dlogits_dev, dl, (size_t)N * E * sizeof(float));
    free(dg);
    free(dl);
    return BG_OK;
}

/* dY = the assignments' dout rows times their gates, dgate = <Y, dY> before the gate; then dlogits and din's
 * router part. */
static bg_status_t output_grads(const moe_call_t *k, const bg_layer_ctx_t *ctx, const route_t *r, const float *dout,
                                float *din)
{
    bg_backend_t *be = k->be;
    int A = r->off[k->E - 1] + r->cnt[k->E - 1];
    for (int e = 0; e < k->E; e++)
        gather_rows(be, k->b.dY + (size_t)r->off[e] * k->c, dout, r->tok + r->off[e], r->cnt[e], k->c);
    if (A)
        be->ops->gemm_strided_batched(be, 0, 1, 1, 1, k->c, 1.0f, k->b.Y, k->c, k->c, k->b.dY, k->c, k->c, 0.0f,
                                      k->b.dgate, 1, 1, A);
    for (int a = 0; a < A; a++)
        be->ops->scale(be, k->b.dY + (size_t)a * k->c, r->agate[a], (size_t)k->c);
    BG_CHECK(router_grad(k->p, ctx, r, k->b.dgate, k->b.dlogits));
    if (din)
        be->ops->gemm(be, 0, 0, k->N, k->c, k->E, 1.0f, k->b.dlogits, k->E, k->wr, k->c, 0.0f, din, k->c);
    return BG_OK;
}

/* ep > 1: dY to the holders, their backward on each (member, expert) block, the inputs' gradients back. */
static bg_status_t backward_ep(const bg_layer_t *l, const bg_layer_ctx_t *ctx, moe_call_t *k, const route_t *r,
                               float *din)
{
    const bg_tp_comm_t *g = NULL;
    BG_CHECK(ep_group(l, ctx, k->m, &g));
    xplan_t x;
    BG_CHECK(xplan_make(k, g, r, 0, moe_rows(k->m, ctx->in), &x));
    bg_status_t st = ep_rows(&x, 0, k->b.dY, k->b.dyr, k->c);
    for (int el = 0; el < x.El && st == BG_OK; el++)
        for (int s = 0; s < x.P; s++) {
            int n = x.cnt[s * x.El + el], base = xrow(&x, s, el);
            if (n)
                experts_backward(k, el, k->b.dyr + (size_t)base * k->c, base, n,
                                 din ? k->b.yr + (size_t)base * k->c : NULL);
        }
    if (st == BG_OK && din) { /* every member has din or none: the same stage of the model */
        st = ep_rows(&x, 1, k->b.yr, k->b.dxg, k->c);
        if (st == BG_OK)
            scatter_add(k->be, din, r, k->b.dxg, NULL, k->c);
    }
    xplan_free(&x);
    return st;
}

static bg_status_t moe_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                      const float *dout, float *din)
{
    (void)in, (void)out;
    moe_call_t k;
    BG_CHECK(moe_call(l, ctx, &k));
    route_t r;
    BG_CHECK(route(k.m, k.be, k.b.logits, k.N, &r));
    bg_status_t st = output_grads(&k, ctx, &r, dout, din);
    if (st == BG_OK && moe_ep(k.m) > 1) {
        st = backward_ep(l, ctx, &k, &r, din);
    } else if (st == BG_OK) {
        for (int e = 0; e < k.E; e++) {
            int cnt = r.cnt[e], base = r.off[e];
            if (!cnt)
                continue;
            experts_backward(&k, e, k.b.dY + (size_t)base * k.c, base, cnt, din ? k.b.dxg : NULL);
            for (int i = 0; din && i < cnt; i++)
                k.be->ops->axpy(k.be, din + (size_t)r.tok[base + i] * k.c, 1.0f, k.b.dxg + (size_t)i * k.c,
                                (size_t)k.c);
        }
    }
    route_free(&r);
    return st;
}

static bg_status_t moe_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                       const float *dout)
{
    (void)out, (void)dout;
    moe_call_t k;
    BG_CHECK(moe_call(l, ctx, &k));
    bg_backend_t *be = k.be;
    float *gr = l->params[0].grad, *gup = l->params[1].grad, *gdn = l->params[2].grad;
    route_t r;
    BG_CHECK(route(k.m, be, k.b.logits, k.N, &r));
    be->ops->gemm(be, 1, 0, k.E, k.c, k.N, 1.0f, k.b.dlogits, k.E, in, k.c, 1.0f, gr, k.c);
    bg_status_t st = BG_OK;
    if (moe_ep(k.m) > 1) {
        const bg_tp_comm_t *g = NULL;
        xplan_t x;
        st = ep_group(l, ctx, k.m, &g);
        if (st == BG_OK)
            st = xplan_make(&k, g, &r, 0, moe_rows(k.m, ctx->in), &x);
        /* each block as one process's GEMMs of that member's rows, members in order */
        for (int el = 0; st == BG_OK && el < x.El; el++)
            for (int s = 0; s < x.P; s++) {
                int n = x.cnt[s * x.El + el], base = xrow(&x, s, el);
                if (n)
                    experts_weight(&k, gup, gdn, el, k.b.xr + (size_t)base * k.c, k.b.dyr + (size_t)base * k.c, base,
                                   n);
            }
        if (st == BG_OK)
            xplan_free(&x);
    } else {
        local_experts(&k, &r, in, gup, gdn);
    }
    route_free(&r);
    return st;
}

static const bg_layer_ops_t moe_ops = {
    .type = "moe",
    .out_shape = moe_out_shape,
    .stash_bytes = moe_stash,
    .wstash_bytes = moe_wstash,
    .scratch_bytes = moe_scratch,
    .fwd_flops = moe_fwd_flops,
    .bwd_flops = moe_bwd_flops,
    .tp_cost = moe_tp_cost,
    .forward = moe_forward,
    .backward_input = moe_backward_input,
    .backward_weight = moe_backward_weight,
    .destroy = bg__free_impl,
};

bg_status_t bg_layer_moe(const char *name, const bg_moe_t *m, bg_layer_t **layer_p)
{
    if (m->c < 1 || m->ffn < 1 || m->experts < 1)
        return bg_error(BG_ERR_INVALID, "moe %s: d_model %d, ffn %d, experts %d (each must be at least 1)", name,
                        m->c, m->ffn, m->experts);
    if (m->top_k < 1 || m->top_k > m->experts || m->top_k > 64)
        return bg_error(BG_ERR_INVALID, "moe %s: top-k %d must be in 1..min(experts %d, 64)", name, m->top_k,
                        m->experts);
    if (m->gate != BG_MOE_SOFTMAX && m->gate != BG_MOE_SIGMOID)
        return bg_error(BG_ERR_INVALID, "moe %s: gate %d is neither softmax nor sigmoid", name, (int)m->gate);
    if (!(m->capacity_factor >= 0) || !(m->aux_coef >= 0))
        return bg_error(BG_ERR_INVALID, "moe %s: capacity factor %g and aux coefficient %g must be >= 0", name,
                        (double)m->capacity_factor, (double)m->aux_coef);
    if (m->ep < 0 || (m->ep > 1 && m->experts % m->ep != 0))
        return bg_error(BG_ERR_INVALID, "moe %s: ep %d does not divide experts %d", name, m->ep, m->experts);
    moe_t p = {.m = *m};
    int P = moe_ep(m);
    int64_t E = m->experts, El = E / P, c = m->c, h = m->ffn;
    bg_param_t w[3] = {
        bg_param_make("router", 2, (int64_t[]){E, c}, BG_INIT_NORMAL, m->init_std, 1),
        bg_param_make("up", 3, (int64_t[]){El, 2 * h, c}, BG_INIT_NORMAL, m->init_std, 1),
        bg_param_make("down", 3, (int64_t[]){El, c, h}, BG_INIT_NORMAL, m->proj_std, 1),
    };
    for (int i = 1; i < 3 && P > 1; i++) { /* each member's experts: a slice of the whole tensors along dim 0 */
        w[i].split_dim = 0;
        w[i].split_parts = P;
        w[i].split_blocks = 1;
        w[i].split_ep = 1;
    }
    return bg__make_leaf(&moe_ops, name, 3, w, &p, sizeof(p), layer_p);
}

int bg_layer_is_moe(const bg_layer_t *l) { return l && l->ops == &moe_ops; }

bg_status_t bg_layer_moe_stats(const bg_layer_t *l, bg_moe_stats_t *stats_p)
{
    if (!bg_layer_is_moe(l))
        return bg_error(BG_ERR_INVALID, "layer %s is not an moe layer", l ? l->name : "(null)");
    const moe_t *p = l->impl;
    stats_p->aux_loss = p->aux;
    stats_p->dropped = p->dropped;
    stats_p->dropped_total = p->dropped_total;
    stats_p->aux_total = p->aux_total;
    stats_p->forwards = p->forwards;
    return BG_OK;
}
