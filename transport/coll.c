/* transport/coll.c: process groups and collectives. Every collective is
 * compiled at start into a list of steps (at most one send and one receive
 * each, then an optional local operation: add, divide, copy); a state machine
 * advanced under the worker lock by whoever progresses (the communication
 * thread, bg_test or bg_wait) posts each step when the previous one finished.
 * Summation orders are fixed by the algorithm and the group size, never by
 * timing (docs/transport.md states them). Elements are of a bg_dtype_t; the
 * reductions add them in that type (bf16 through fp32, rounded to nearest
 * even once per addition). Must not know what the numbers mean. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "transport/transport_impl.h"

enum { BG__POST_NONE = 0, BG__POST_ADD, BG__POST_DIV, BG__POST_COPY };

typedef struct bg__xfer {
    int send;
    int peer; /* world rank */
    void *buf;
    size_t bytes;
} bg__xfer_t;

typedef struct bg__step {
    int nx;
    bg__xfer_t x[2];
    int post;
    bg_dtype_t dt; /* of dst, a, b */
    void *dst;     /* ADD: dst = a + b; DIV: dst /= div; COPY: dst = a (n elements) */
    const void *a, *b;
    size_t n;
    int div;
    uint32_t tag;  /* 0..63, the same on every member for matching transfers */
} bg__step_t;

struct bg__coll {
    bg_comm_t *comm;
    int n, me;
    int *ranks;
    char desc[160];        /* built lazily (errors only): it costs a microsecond */
    const char *dfmt, *dunits, *dalgo; /* the description's format: count, units, algorithm */
    size_t dx;
    uint32_t hi_base;
    bg__step_t *steps;
    int nsteps, cap, cur, posted;
    bg_request_t *subs[2];
    void *tmp, *work;       /* scratch buffers from the comm's cache */
    size_t tmp_bytes, work_bytes;
    bg_request_t *req;
    int done, abandoned;
    bg__coll_t *prev, *next;
};

static const char *bg__coll_desc(bg__coll_t *co);
static const bg__coll_ops_t bg__coll_ops;

/* ---- groups ------------------------------------------------------------------ */

bg_status_t bg_group_create(bg_comm_t *c, int n, const int *ranks, bg_group_t **group_p)
{
    if (!c || !ranks || !group_p || n < 1 || n > c->size)
        return bg_error(BG_ERR_INVALID, "bg_group_create: need 1..%d ranks, got %d", c ? c->size : 0, n);
    char *seen = calloc((size_t)c->size, 1);
    BG_ALLOC_CHECK(seen, c->size, "group validation");
    uint32_t h = 2166136261u;
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= c->size || seen[ranks[i]]) {
            free(seen);
            return bg_error(BG_ERR_INVALID, "bg_group_create: ranks[%d] = %d is %s (world of %d)", i,
                            ranks[i], ranks[i] < 0 || ranks[i] >= c->size ? "out of range" : "repeated",
                            c->size);
        }
        seen[ranks[i]] = 1;
        if (ranks[i] == c->rank)
            me = i;
        h = (h ^ (uint32_t)ranks[i]) * 16777619u;
    }
    free(seen);
    bg_group_t *g = calloc(1, sizeof(*g));
    BG_ALLOC_CHECK(g, sizeof(*g), "a group");
    g->ranks = malloc((size_t)n * sizeof(int));
    if (!g->ranks) {
        free(g);
        return bg_error(BG_ERR_NOMEM, "cannot allocate a group of %d ranks", n);
    }
    memcpy(g->ranks, ranks, (size_t)n * sizeof(int));
    g->comm = c;
    g->n = n;
    g->me = me;
    /* id: hash of the member list, and how many groups with that list this process
     * made before (members create groups in the same order) */
    bg__lock(c);
    c->coll_ops = &bg__coll_ops; /* the engine calls back into the step machine through it */
    int occ = 0, k;
    for (k = 0; k < c->ngroup_ids; k++)
        if (c->group_ids[k][0] == (int)h)
            break;
    if (k < c->ngroup_ids)
        occ = c->group_ids[k][1]++;
    else if (c->ngroup_ids < 64) {
        c->group_ids[c->ngroup_ids][0] = (int)h;
        c->group_ids[c->ngroup_ids++][1] = 1;
    }
    bg__unlock(c);
    g->id = (uint16_t)((h ^ (h >> 16)) + (uint32_t)occ * 40503u);
    *group_p = g;
    return BG_OK;
}

void bg_group_destroy(bg_group_t *g)
{
    if (!g)
        return;
    free(g->ranks);
    free(g);
}

int bg_group_rank(const bg_group_t *g) { return g->me; }
int bg_group_size(const bg_group_t *g) { return g->n; }
int bg_group_world_rank(const bg_group_t *g, int r) { return r >= 0 && r < g->n ? g->ranks[r] : -1; }

/* ---- the step machine --------------------------------------------------------------- */

static bg__step_t *bg__step(bg__coll_t *co)
{
    if (co->nsteps == co->cap) {
        int cap = co->cap ? co->cap * 2 : 8;
        bg__step_t *s = realloc(co->steps, (size_t)cap * sizeof(*s));
        if (!s)
            return NULL;
        co->steps = s;
        co->cap = cap;
    }
    bg__step_t *s = &co->steps[co->nsteps++];
    memset(s, 0, sizeof(*s));
    s->tag = (uint32_t)(co->nsteps - 1);
    return s;
}

static void bg__xf(bg__step_t *s, int send, int peer, void *buf, size_t bytes)
{
    s->x[s->nx++] = (bg__xfer_t){.send = send, .peer = peer, .buf = buf, .bytes = bytes};
}

static void bg__list_del(bg__coll_t *co)
{
    bg_comm_t *c = co->comm;
    if (co->prev)
        co->prev->next = co->next;
    else if (c->colls == co)
        c->colls = co->next;
    if (co->next)
        co->next->prev = co->prev;
    co->prev = co->next = NULL;
}

static void bg__release_subs(bg__coll_t *co)
{
    for (int i = 0; i < 2; i++) {
        bg_request_t *s = co->subs[i];
        if (!s)
            continue;
        s->parent = NULL;
        if (s->ucx && s->kind == BG__RQ_SEND)
            co->abandoned = 1; /* UCX may still read our buffers */
        bg__request_release_locked(s);
        co->subs[i] = NULL;
    }
}

static void bg__coll_finish(bg__coll_t *co, bg_status_t st, const char *msg)
{
    if (co->done)
        return;
    co->done = 1;
    bg_request_t *r = co->req;
    r->status = st;
    if (st < 0)
        snprintf(r->msg, sizeof(r->msg), "%s", msg);
    bg__list_del(co);
    atomic_store_explicit(&r->done, 1, memory_order_release);
    atomic_fetch_sub(&co->comm->active, 1);
}

static void bg__coll_fail_locked(bg__coll_t *co, bg_status_t st, const char *msg)
{
    if (co->done)
        return;
    char m[BG__ERR_MSG_MAX];
    if (msg)
        snprintf(m, sizeof(m), "%.*s during %s at step %d of %d", (int)(sizeof(m) - 192), msg, bg__coll_desc(co),
                 co->cur + 1, co->nsteps);
    else
        snprintf(m, sizeof(m), "%s did not complete within %.0f s (BRIGADE_TIMEOUT): stuck at step %d "
                 "of %d", bg__coll_desc(co), co->comm->timeout_s, co->cur + 1, co->nsteps);
    for (int i = 0; i < 2; i++)
        if (co->subs[i]) {
            co->subs[i]->parent = NULL;
            bg__fail_locked(co->comm, co->subs[i], st, m);
        }
    bg__release_subs(co);
    bg__coll_finish(co, st, m);
}

static void bg__coll_on_sub_done_locked(bg__coll_t *co, bg_request_t *sub)
{
    if (sub->status < 0 && !co->done) {
        char m[BG__ERR_MSG_MAX];
        snprintf(m, sizeof(m), "%s", sub->msg);
        bg__coll_fail_locked(co, sub->status, m);
    }
}

static float bg__bf16_in(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; a NaN stays a (quiet) NaN. */
static uint16_t bg__bf16_out(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* dst = a + b elementwise in type T (dst may alias a or b, never partly). */
#define BG__ADD(T, dst, a, b, n)                                                                   \
    do {                                                                                           \
        T *d_ = (T *)(dst);                                                                        \
        const T *a_ = (const T *)(a), *b_ = (const T *)(b);                                        \
        for (size_t i_ = 0; i_ < (n); i_++)                                                        \
            d_[i_] = a_[i_] + b_[i_];                                                              \
    } while (0)
#define BG__DIV(T, dst, div, n)                                                                    \
    do {                                                                                           \
        T *d_ = (T *)(dst);                                                                        \
        for (size_t i_ = 0; i_ < (n); i_++)                                                        \
            d_[i_] /= (T)(div);                                                                    \
    } while (0)

/* Integers add modulo 2^bits (as unsigned: no overflow is undefined) and
 * divide truncating toward zero. */
static void bg__post_add(bg__step_t *s)
{
    switch (s->dt) {
    case BG_F32: BG__ADD(float, s->dst, s->a, s->b, s->n); break;
    case BG_F64: BG__ADD(double, s->dst, s->a, s->b, s->n); break;
    case BG_I32: BG__ADD(uint32_t, s->dst, s->a, s->b, s->n); break;
    case BG_I64: BG__ADD(uint64_t, s->dst, s->a, s->b, s->n); break;
    case BG_BF16: {
        uint16_t *d = s->dst;
        const uint16_t *a = s->a, *b = s->b;
        for (size_t i = 0; i < s->n; i++)
            d[i] = bg__bf16_out(bg__bf16_in(a[i]) + bg__bf16_in(b[i]));
        break;
    }
    default: break; /* rejected when the collective was built */
    }
}

static void bg__post_div(bg__step_t *s)
{
    switch (s->dt) {
    case BG_F32: BG__DIV(float, s->dst, s->div, s->n); break;
    case BG_F64: BG__DIV(double, s->dst, s->div, s->n); break;
    case BG_I32: BG__DIV(int32_t, s->dst, s->div, s->n); break;
    case BG_I64: BG__DIV(int64_t, s->dst, s->div, s->n); break;
    case BG_BF16: {
        uint16_t *d = s->dst;
        for (size_t i = 0; i < s->n; i++)
            d[i] = bg__bf16_out(bg__bf16_in(d[i]) / (float)s->div);
        break;
    }
    default: break;
    }
}

static void bg__post_op(bg__step_t *s)
{
    switch (s->post) {
    case BG__POST_ADD:
        bg__post_add(s);
        break;
    case BG__POST_DIV:
        bg__post_div(s);
        break;
    case BG__POST_COPY:
        memmove(s->dst, s->a, s->n * bg_dtype_size(s->dt));
        break;
    default:
        break;
    }
}

static void bg__coll_advance(bg__coll_t *co)
{
    bg_comm_t *c = co->comm;
    while (!co->done) {
        if (!co->posted) {
            if (co->cur == co->nsteps) {
                bg__coll_finish(co, BG_OK, NULL);
                return;
            }
            bg__step_t *s = &co->steps[co->cur];
            uint32_t hi = co->hi_base | (s->tag & 63u);
            co->posted = 1;
            /* receives first: a matching send may complete at once */
            for (int pass = 0; pass < 2 && !co->done; pass++)
                for (int i = 0; i < s->nx && !co->done; i++) {
                    bg__xfer_t *x = &s->x[i];
                    if (x->send != pass)
                        continue;
                    bg_request_t *sub = NULL;
                    bg_status_t st = bg__post_locked(c, x->send ? BG__RQ_SEND : BG__RQ_RECV, x->peer, hi,
                                                     1, x->buf, x->bytes, co, &sub);
                    if (st != BG_OK) {
                        char m[BG__ERR_MSG_MAX];
                        snprintf(m, sizeof(m), "%s", bg_last_error());
                        bg__coll_fail_locked(co, st, m);
                        return;
                    }
                    if (co->done) { /* it failed at once and failed the collective */
                        sub->parent = NULL;
                        bg__request_release_locked(sub);
                        return;
                    }
                    co->subs[i] = sub;
                }
            if (co->done)
                return;
        }
        for (int i = 0; i < 2; i++)
            if (co->subs[i] && !atomic_load(&co->subs[i]->done))
                return;
        bg__release_subs(co);
        bg__post_op(&co->steps[co->cur]);
        co->cur++;
        co->posted = 0;
    }
}

static void bg__colls_advance_locked(bg_comm_t *c)
{
    for (bg__coll_t *co = c->colls, *nx; co; co = nx) {
        nx = co->next;
        bg__coll_advance(co);
    }
}

/* rank -1: every collective (the store was lost, or the comm is destroyed) */
static void bg__colls_fail_peer_locked(bg_comm_t *c, int rank, const char *why)
{
    if (rank < 0) {
        while (c->colls)
            bg__coll_fail_locked(c->colls, BG_ERR_PEER, why);
        return;
    }
    for (bg__coll_t *co = c->colls, *nx; co; co = nx) {
        nx = co->next;
        for (int i = 0; i < co->n; i++)
            if (co->ranks[i] == rank) {
                bg__coll_fail_locked(co, BG_ERR_PEER, why);
                break;
            }
    }
}

static void bg__coll_free(bg__coll_t *co)
{
    if (!co)
        return;
    if (!co->done)
        bg__coll_fail_locked(co, BG_ERR_CANCELED, "collective freed while pending");
    if (co->abandoned) {
        bg__leak_locked(co->comm, co->tmp);
        bg__leak_locked(co->comm, co->work);
    } else {
        bg__scratch_put(co->comm, co->tmp, co->tmp_bytes);
        bg__scratch_put(co->comm, co->work, co->work_bytes);
    }
    free(co->steps);
    free(co->ranks);
    free(co);
}

static const bg__coll_ops_t bg__coll_ops = {
    .sub_done_locked = bg__coll_on_sub_done_locked,
    .advance_locked = bg__colls_advance_locked,
    .fail_peer_locked = bg__colls_fail_peer_locked,
    .fail_locked = bg__coll_fail_locked,
    .free = bg__coll_free,
};

/* ---- building and starting ------------------------------------------------------------- */

static bg_status_t bg__coll_new(bg_group_t *g, const char *what, bg__coll_t **co_p)
{
    if (!g)
        return bg_error(BG_ERR_INVALID, "%s: NULL group", what);
    if (g->me < 0)
        return bg_error(BG_ERR_INVALID, "%s: rank %d is not a member of this group of %d ranks", what,
                        g->comm->rank, g->n);
    bg__coll_t *co = calloc(1, sizeof(*co));
    BG_ALLOC_CHECK(co, sizeof(*co), "a collective");
    co->ranks = malloc((size_t)g->n * sizeof(int));
    if (!co->ranks) {
        free(co);
        return bg_error(BG_ERR_NOMEM, "cannot allocate a collective");
    }
    memcpy(co->ranks, g->ranks, (size_t)g->n * sizeof(int));
    co->comm = g->comm;
    co->n = g->n;
    co->me = g->me;
    co->hi_base = ((uint32_t)g->id << 16) | ((g->seq++ & 1023u) << 6);
    *co_p = co;
    return BG_OK;
}

static void bg__desc(bg__coll_t *co, const char *fmt, size_t x, const char *algo)
{
    co->dfmt = fmt;
    co->dx = x;
    co->dalgo = algo;
}

static const char *bg__coll_desc(bg__coll_t *co)
{
    if (co->desc[0] || !co->dfmt)
        return co->desc;
    int off = snprintf(co->desc, sizeof(co->desc), co->dfmt, co->dx, co->dunits, co->dalgo);
    off += snprintf(co->desc + off, sizeof(co->desc) - (size_t)off, " on a group of %d ranks [", co->n);
    for (int i = 0; i < co->n && off < (int)sizeof(co->desc) - 8; i++)
        off += snprintf(co->desc + off, sizeof(co->desc) - (size_t)off, i ? " %d" : "%d", co->ranks[i]);
    if (off < (int)sizeof(co->desc) - 2)
        snprintf(co->desc + off, sizeof(co->desc) - (size_t)off, "]");
    return co->desc;
}

/* Start: make endpoints, register, advance once. On error frees co. */
static bg_status_t bg__coll_start(bg__coll_t *co, bg_request_t **req_p)
{
    bg_comm_t *c = co->comm;
    bg_status_t st = BG_OK;
    for (int i = 0; i < co->n && st == BG_OK; i++) {
        st = bg__peer_status(c, co->ranks[i], "collective");
        if (st == BG_OK)
            st = bg__ensure_ep(c, co->ranks[i]);
    }
    bg_request_t *r = st == BG_OK ? calloc(1, sizeof(*r)) : NULL;
    if (st != BG_OK || !r) {
        if (st == BG_OK)
            st = bg_error(BG_ERR_NOMEM, "cannot allocate a request");
        else {
            char m[BG__ERR_MSG_MAX];
            snprintf(m, sizeof(m), "%s", bg_last_error());
            st = bg_error(st, "%s during %s", m, bg__coll_desc(co));
        }
        bg__scratch_put(c, co->tmp, co->tmp_bytes);
        bg__scratch_put(c, co->work, co->work_bytes);
        free(co->steps);
        free(co->ranks);
        free(co);
        return st;
    }
    r->comm = c;
    r->kind = BG__RQ_COLL;
    r->peer = -1;
    r->coll = co;
    r->t_start = bg_now();
    co->req = r;
    atomic_fetch_add(&c->demand, 1);
    bg__lock(c);
    atomic_fetch_add(&c->active, 1);
    co->next = c->colls;
    if (c->colls)
        c->colls->prev = co;
    c->colls = co;
    bg__coll_advance(co);
    bg__unlock(c);
    atomic_store_explicit(&c->last_api_ns, (long long)(bg_now() * 1e9), memory_order_relaxed);
    atomic_fetch_sub(&c->demand, 1);
    bg__kick(c);
    *req_p = r;
    return BG_OK;
}

static bg_status_t bg__run(bg__coll_t *co)
{
    bg_request_t *r;
    BG_CHECK(bg__coll_start(co, &r));
    bg_status_t st = bg_wait(r);
    bg_request_free(r);
    return st;
}

static void bg__chunk(size_t count, int n, int c, size_t *off, size_t *len)
{
    size_t q = count / (size_t)n, rem = count % (size_t)n;
    *off = (size_t)c * q + ((size_t)c < rem ? (size_t)c : rem);
    *len = q + ((size_t)c < rem);
}

#define BG__NOMEM(co) do { free(co->steps); bg__scratch_put(co->comm, co->tmp, co->tmp_bytes); \
        bg__scratch_put(co->comm, co->work, co->work_bytes); free(co->ranks); free(co); \
        return bg_error(BG_ERR_NOMEM, "out of memory building a collective"); } while (0)

static int bg__mod(int a, int n) { return ((a % n) + n) % n; }

/* Ring reduce-scatter on @p buf in place: afterwards group rank me holds the
 * reduced chunk me (chunk c = fold over ranks c+1, c+2, ..., c in that order). */
static int bg__build_ring_rs(bg__coll_t *co, char *buf, size_t count, bg_dtype_t dt, void *tmp)
{
    size_t es = bg_dtype_size(dt);
    int n = co->n, me = co->me;
    int right = co->ranks[(me + 1) % n], left = co->ranks[bg__mod(me - 1, n)];
    for (int s = 0; s < n - 1; s++) {
        int sc = bg__mod(me - s - 1, n), rc = bg__mod(me - s - 2, n);
        size_t so, sl, ro, rl;
        bg__chunk(count, n, sc, &so, &sl);
        bg__chunk(count, n, rc, &ro, &rl);
        bg__step_t *st = bg__step(co);
        if (!st)
            return -1;
        bg__xf(st, 0, left, tmp, rl * es);
        bg__xf(st, 1, right, buf + so * es, sl * es);
        st->post = BG__POST_ADD;
        st->dt = dt;
        st->dst = buf + ro * es;
        st->a = tmp;            /* partial from the left: ranks rc+1 .. me-1 */
        st->b = buf + ro * es;  /* then my own value */
        st->n = rl;
    }
    return 0;
}

/* rs_only: stop after the ring's reduce-scatter (a buffer that goes by
 * recursive doubling is still reduced whole): bg_group_ireduce_scatter_inplace. */
/* Ring allgather of the chunks of @p buf in place (group rank c holds chunk
 * c): the second half of the ring allreduce; step tags from @p tag0. */
static int bg__build_ring_ag(bg__coll_t *co, char *buf, size_t count, size_t es, uint32_t tag0)
{
    int n = co->n, me = co->me;
    int right = co->ranks[(me + 1) % n], left = co->ranks[bg__mod(me - 1, n)];
    for (int s = 0; s < n - 1; s++) {
        size_t so, sl, ro, rl;
        bg__chunk(count, n, bg__mod(me - s, n), &so, &sl);
        bg__chunk(count, n, bg__mod(me - s - 1, n), &ro, &rl);
        bg__step_t *st = bg__step(co);
        if (!st)
            return -1;
        st->tag = tag0 + (uint32_t)s;
        bg__xf(st, 0, left, buf + ro * es, rl * es);
        bg__xf(st, 1, right, buf + so * es, sl * es);
    }
    return 0;
}

/* The element types a reduction takes (every one but BG_U8). */
static int bg__reducible(bg_dtype_t dt)
{
    return dt == BG_F32 || dt == BG_F64 || dt == BG_BF16 || dt == BG_I32 || dt == BG_I64;
}

/* "allreduce of 12 floats (ring)": the unit of a description, per type. */
static const char *bg__units(bg_dtype_t dt)
{
    switch (dt) {
    case BG_F32: return "floats";
    case BG_F64: return "doubles";
    case BG_BF16: return "bf16 values";
    case BG_I32: return "int32 values";
    case BG_I64: return "int64 values";
    default: return "bytes";
    }
}

static bg_status_t bg__build_allreduce(bg_group_t *g, void *vbuf, size_t count, bg_dtype_t dt, bg_reduce_op_t op,
                                       bg_allreduce_algo_t algo, int rs_only, bg__coll_t **co_p)
{
    if ((!vbuf && count) || (op != BG_REDUCE_SUM && op != BG_REDUCE_AVG) || !bg__reducible(dt))
        return bg_error(BG_ERR_INVALID, "allreduce: NULL buffer, unknown op %d or a type it cannot reduce (%s)",
                        (int)op, bg_dtype_name(dt));
    char *buf = vbuf;
    size_t es = bg_dtype_size(dt);
    bg__coll_t *co;
    BG_CHECK(bg__coll_new(g, "allreduce", &co));
    int n = co->n, me = co->me;
    if (algo == BG_ALLREDUCE_AUTO) {
        long long small = co->comm->small_bytes;
        algo = (count * es <= (size_t)small || count < (size_t)n) ? BG_ALLREDUCE_RECURSIVE : BG_ALLREDUCE_RING;
    }
    co->dunits = bg__units(dt);
    bg__desc(co, "allreduce of %zu %s (%s)", count, algo == BG_ALLREDUCE_RING ? "ring" : "recursive doubling");
    if (n == 1) {
        /* nothing to exchange; AVG divides by one */
    } else if (algo == BG_ALLREDUCE_RING) {
        size_t maxc = count / (size_t)n + 1;
        co->tmp = bg__scratch_get(co->comm, maxc * es, &co->tmp_bytes);
        if (!co->tmp || bg__build_ring_rs(co, buf, count, dt, co->tmp) != 0)
            BG__NOMEM(co);
        size_t mo, ml;
        bg__chunk(count, n, me, &mo, &ml);
        if (op == BG_REDUCE_AVG) {
            bg__step_t *st = bg__step(co);
            if (!st)
                BG__NOMEM(co);
            *st = (bg__step_t){.post = BG__POST_DIV, .dt = dt, .dst = buf + mo * es, .n = ml, .div = n};
        }
        if (rs_only) {
            *co_p = co;
            return BG_OK;
        }
        if (bg__build_ring_ag(co, buf, count, es, (uint32_t)(n - 1)) != 0)
            BG__NOMEM(co);
        *co_p = co;
        return BG_OK;
    } else {
        int p = 1;
        while (p * 2 <= n)
            p *= 2;
        int rem = n - p;
        co->tmp = bg__scratch_get(co->comm, count * es + 1, &co->tmp_bytes);
        if (!co->tmp)
            BG__NOMEM(co);
        void *tmp = co->tmp;
        size_t bytes = count * es;
        bg__step_t *st;
        if (me >= p) {
            if (!(st = bg__step(co)))
                BG__NOMEM(co);
            st->tag = 0;
            bg__xf(st, 1, co->ranks[me - p], buf, bytes);
            if (!(st = bg__step(co)))
                BG__NOMEM(co);
            st->tag = 40;
            bg__xf(st, 0, co->ranks[me - p], buf, bytes);
            *co_p = co;
            return BG_OK;
        }
        if (me < rem) {
            if (!(st = bg__step(co)))
                BG__NOMEM(co);
            st->tag = 0;
            bg__xf(st, 0, co->ranks[me + p], tmp, bytes);
            st->post = BG__POST_ADD;
            st->dt = dt;
            st->dst = buf;
            st->a = buf; /* lower rank first */
            st->b = tmp;
            st->n = count;
        }
        for (int d = 1, lg = 1; d < p; d *= 2, lg++) {
            int partner = me ^ d;
            if (!(st = bg__step(co)))
                BG__NOMEM(co);
            st->tag = (uint32_t)lg;
            bg__xf(st, 0, co->ranks[partner], tmp, bytes);
            bg__xf(st, 1, co->ranks[partner], buf, bytes);
            st->post = BG__POST_ADD;
            st->dt = dt;
            st->dst = buf;
            st->a = me < partner ? buf : tmp;
            st->b = me < partner ? tmp : buf;
            st->n = count;
        }
        if (op == BG_REDUCE_AVG) {
            if (!(st = bg__step(co)))
                BG__NOMEM(co);
            *st = (bg__step_t){.post = BG__POST_DIV, .dt = dt, .dst = buf, .n = count, .div = n};
        }
        if (me < rem) {
            if (!(st = bg__step(co)))
                BG__NOMEM(co);
            st->tag = 40;
            bg__xf(st, 1, co->ranks[me + p], buf, bytes);
        }
        *co_p = co;
        return BG_OK;
    }
    *co_p = co;
    return BG_OK;
}

/* Starts a non-blocking allreduce (rs_only 0) or its reduce-scatter half
 * (rs_only 1); who names the public entry point in the error. */
static bg_status_t bg__iallreduce_start(bg_group_t *g, void *buf, size_t count, bg_dtype_t dtype, bg_reduce_op_t op,
                                        bg_allreduce_algo_t algo, int rs_only, const char *who, bg_request_t **req_p)
{
    if (!req_p)
        return bg_error(BG_ERR_INVALID, "%s: NULL request output", who);
    bg__coll_t *co;
    BG_CHECK(bg__build_allreduce(g, buf, count, dtype, op, algo, rs_only, &co));
    return bg__coll_start(co, req_p);
}

bg_status_t bg_group_iallreduce_algo(bg_group_t *g, void *buf, size_t count, bg_dtype_t dtype, bg_reduce_op_t op,
                                     bg_allreduce_algo_t algo, bg_request_t **req_p)
{
    return bg__iallreduce_start(g, buf, count, dtype, op, algo, 0, "bg_group_iallreduce", req_p);
}

bg_status_t bg_group_iallreduce(bg_group_t *g, void *buf, size_t count, bg_dtype_t dtype, bg_reduce_op_t op,
                                bg_request_t **req_p)
{
    return bg_group_iallreduce_algo(g, buf, count, dtype, op, BG_ALLREDUCE_AUTO, req_p);
}

bg_status_t bg_group_allreduce(bg_group_t *g, void *buf, size_t count, bg_dtype_t dtype, bg_reduce_op_t op)
{
    bg__coll_t *co;
    BG_CHECK(bg__build_allreduce(g, buf, count, dtype, op, BG_ALLREDUCE_AUTO, 0, &co));
    return bg__run(co);
}

bg_status_t bg_group_barrier(bg_group_t *g)
{
    bg__coll_t *co;
    BG_CHECK(bg__coll_new(g, "barrier", &co));
    co->dunits = "";
    bg__desc(co, "barrier%.0zu%s%s", 0, "");
    /* zero-byte messages: any address that outlives the collective will do, and
     * the collective itself does (no shared static buffer) */
    for (int d = 1; d < co->n; d *= 2) {
        bg__step_t *st = bg__step(co);
        if (!st)
            BG__NOMEM(co);
        bg__xf(st, 0, co->ranks[bg__mod(co->me - d, co->n)], co, 0);
        bg__xf(st, 1, co->ranks[(co->me + d) % co->n], co, 0);
    }
    return bg__run(co);
}

bg_status_t bg_group_bcast(bg_group_t *g, void *buf, size_t count, bg_dtype_t dtype, int root)
{
    size_t bytes = count * bg_dtype_size(dtype);
    if (!g || root < 0 || root >= g->n || (!buf && count) || !bg_dtype_size(dtype))
        return bg_error(BG_ERR_INVALID, "bg_group_bcast: root %d is not a rank of the group of %d, NULL "
                        "buffer, or unknown type %d", root, g ? g->n : 0, (int)dtype);
    bg__coll_t *co;
    BG_CHECK(bg__coll_new(g, "broadcast", &co));
    co->dunits = bg__units(dtype);
    bg__desc(co, "broadcast of %zu %s%s", count, "");
    int n = co->n, vr = bg__mod(co->me - root, n);
    int mask = 1, lg = 0;
    while (mask < n) {
        if (vr & mask) {
            bg__step_t *st = bg__step(co);
            if (!st)
                BG__NOMEM(co);
            st->tag = (uint32_t)lg;
            bg__xf(st, 0, co->ranks[bg__mod(vr - mask + root, n)], buf, bytes);
            break;
        }
        mask <<= 1;
        lg++;
    }
    for (mask >>= 1, lg--; mask > 0; mask >>= 1, lg--) {
        if (vr + mask < n) {
            bg__step_t *st = bg__step(co);
            if (!st)
                BG__NOMEM(co);
            st->tag = (uint32_t)lg;
            bg__xf(st, 1, co->ranks[bg__mod(vr + mask + root, n)], buf, bytes);
        }
    }
    return bg__run(co);
}

/* The ring allgather (bg_group_allgather, bg_group_iallgather); sendbuf is copied now. */
static bg_status_t build_allgather(bg_group_t *g, const void *sendbuf, void *recvbuf, size_t count, bg_dtype_t dt,
                                   bg__coll_t **co_p)
{
    size_t bytes = count * bg_dtype_size(dt);
    if (!g || ((!sendbuf || !recvbuf) && count) || !bg_dtype_size(dt))
        return bg_error(BG_ERR_INVALID, "bg_group_allgather: NULL group or buffer, or unknown type %d", (int)dt);
    bg__coll_t *co;
    BG_CHECK(bg__coll_new(g, "allgather", &co));
    co->dunits = bg__units(dt);
    bg__desc(co, "allgather of %zu %s per rank%s", count, "");
    int n = co->n, me = co->me;
    uint8_t *out = recvbuf;
    if (bytes && (const uint8_t *)sendbuf != out + (size_t)me * bytes)
        memmove(out + (size_t)me * bytes, sendbuf, bytes);
    int right = co->ranks[(me + 1) % n], left = co->ranks[bg__mod(me - 1, n)];
    for (int s = 0; s < n - 1; s++) {
        bg__step_t *st = bg__step(co);
        if (!st)
            BG__NOMEM(co);
        bg__xf(st, 0, left, out + (size_t)bg__mod(me - s - 1, n) * bytes, bytes);
        bg__xf(st, 1, right, out + (size_t)bg__mod(me - s, n) * bytes, bytes);
    }
    *co_p = co;
    return BG_OK;
}

bg_status_t bg_group_allgather(bg_group_t *g, const void *sendbuf, void *recvbuf, size_t count, bg_dtype_t dtype)
{
    bg__coll_t *co;
    BG_CHECK(build_allgather(g, sendbuf, recvbuf, count, dtype, &co));
    return bg__run(co);
}

bg_status_t bg_group_iallgather(bg_group_t *g, const void *sendbuf, void *recvbuf, size_t count, bg_dtype_t dtype,
                                bg_request_t **req_p)
{
    if (!req_p)
        return bg_error(BG_ERR_INVALID, "bg_group_iallgather: NULL request output");
    bg__coll_t *co;
    BG_CHECK(build_allgather(g, sendbuf, recvbuf, count, dtype, &co));
    return bg__coll_start(co, req_p);
}

/* The ring reduce-scatter (bg_group_reduce_scatter, bg_group_ireduce_scatter); sendbuf is copied now. */
static bg_status_t build_reduce_scatter(bg_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                                        bg_dtype_t dt, bg_reduce_op_t op, bg__coll_t **co_p)
{
    if (!g || ((!sendbuf || !recvbuf) && count) || (op != BG_REDUCE_SUM && op != BG_REDUCE_AVG) || !bg__reducible(dt))
        return bg_error(BG_ERR_INVALID, "bg_group_reduce_scatter: NULL group or buffer, unknown op, or a type it "
                        "cannot reduce (%s)", bg_dtype_name(dt));
    size_t es = bg_dtype_size(dt);
    bg__coll_t *co;
    BG_CHECK(bg__coll_new(g, "reduce-scatter", &co));
    co->dunits = bg__units(dt);
    bg__desc(co, "reduce-scatter of %zu %s per rank (%s)", count, "ring");
    int n = co->n, me = co->me;
    size_t total = count * (size_t)n;
    co->work = bg__scratch_get(co->comm, total * es + 1, &co->work_bytes);
    co->tmp = bg__scratch_get(co->comm, count * es + 1, &co->tmp_bytes);
    if (!co->work || !co->tmp)
        BG__NOMEM(co);
    if (total)
        memcpy(co->work, sendbuf, total * es);
    if (bg__build_ring_rs(co, co->work, total, dt, co->tmp) != 0)
        BG__NOMEM(co);
    bg__step_t *st = bg__step(co);
    if (!st)
        BG__NOMEM(co);
    *st = (bg__step_t){.post = BG__POST_COPY, .dt = dt, .dst = recvbuf,
                       .a = (char *)co->work + (size_t)me * count * es, .n = count};
    if (op == BG_REDUCE_AVG) {
        if (!(st = bg__step(co)))
            BG__NOMEM(co);
        *st = (bg__step_t){.post = BG__POST_DIV, .dt = dt, .dst = recvbuf, .n = count, .div = n};
    }
    *co_p = co;
    return BG_OK;
}

bg_status_t bg_group_reduce_scatter(bg_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                                    bg_dtype_t dtype, bg_reduce_op_t op)
{
    bg__coll_t *co;
    BG_CHECK(build_reduce_scatter(g, sendbuf, recvbuf, count, dtype, op, &co));
    return bg__run(co);
}

bg_status_t bg_group_ireduce_scatter(bg_group_t *g, const void *sendbuf, void *recvbuf, size_t count,
                                     bg_dtype_t dtype, bg_reduce_op_t op, bg_request_t **req_p)
{
    if (!req_p)
        return bg_error(BG_ERR_INVALID, "bg_group_ireduce_scatter: NULL request output");
    bg__coll_t *co;
    BG_CHECK(build_reduce_scatter(g, sendbuf, recvbuf, count, dtype, op, &co));
    return bg__coll_start(co, req_p);
}

/* The pairwise all-to-all (bg_group_alltoallv, bg_group_ialltoallv); the own block is copied now, the others are
 * sent from sendbuf as the steps run. */
static bg_status_t build_alltoallv(bg_group_t *g, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                                   void *recvbuf, const size_t *recvcounts, const size_t *rdispls, bg_dtype_t dtype,
                                   bg__coll_t **co_p)
{
    size_t es = bg_dtype_size(dtype);
    if (!g || !sendcounts || !sdispls || !recvcounts || !rdispls || !es || !sendbuf || !recvbuf)
        return bg_error(BG_ERR_INVALID, "bg_group_alltoallv: NULL group, buffer or count array, or unknown type %d",
                        (int)dtype);
    int n = g->n, me = g->me;
    if (me >= 0 && sendcounts[me] != recvcounts[me])
        return bg_error(BG_ERR_INVALID, "bg_group_alltoallv: group rank %d sends itself %zu elements but expects %zu",
                        me, sendcounts[me], recvcounts[me]);
    size_t sent = 0;
    for (int j = 0; j < n; j++)
        sent += j == me ? 0 : sendcounts[j];
    bg__coll_t *co;
    BG_CHECK(bg__coll_new(g, "all-to-all", &co));
    co->dunits = bg__units(dtype);
    bg__desc(co, "all-to-all of %zu %s sent to the others (pairwise%s)", sent, "");
    const char *src = sendbuf;
    char *dst = recvbuf;
    if (sendcounts[me])
        memmove(dst + rdispls[me] * es, src + sdispls[me] * es, sendcounts[me] * es);
    for (int s = 1; s < n; s++) {
        int to = (me + s) % n, from = bg__mod(me - s, n);
        bg__step_t *st = bg__step(co);
        if (!st)
            BG__NOMEM(co);
        if (recvcounts[from])
            bg__xf(st, 0, co->ranks[from], dst + rdispls[from] * es, recvcounts[from] * es);
        if (sendcounts[to])
            bg__xf(st, 1, co->ranks[to], (void *)(src + sdispls[to] * es), sendcounts[to] * es);
    }
    *co_p = co;
    return BG_OK;
}

bg_status_t bg_group_alltoallv(bg_group_t *g, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                               void *recvbuf, const size_t *recvcounts, const size_t *rdispls, bg_dtype_t dtype)
{
    bg__coll_t *co;
    BG_CHECK(build_alltoallv(g, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype, &co));
    return bg__run(co);
}

bg_status_t bg_group_ialltoallv(bg_group_t *g, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                                void *recvbuf, const size_t *recvcounts, const size_t *rdispls, bg_dtype_t dtype,
                                bg_request_t **req_p)
{
    if (!req_p)
        return bg_error(BG_ERR_INVALID, "bg_group_ialltoallv: NULL request output");
    bg__coll_t *co;
    BG_CHECK(build_alltoallv(g, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dtype, &co));
    return bg__coll_start(co, req_p);
}

void bg_group_chunk(size_t count, int n, int i, size_t *off_p, size_t *len_p)
{
    if (n < 1 || i < 0 || i >= n) {
        *off_p = *len_p = 0;
        return;
    }
    bg__chunk(count, n, i, off_p, len_p);
}

bg_status_t bg_group_ireduce_scatter_inplace(bg_group_t *g, void *buf, size_t count, bg_dtype_t dtype,
                                             bg_reduce_op_t op, bg_request_t **req_p)
{
    return bg__iallreduce_start(g, buf, count, dtype, op, BG_ALLREDUCE_AUTO, 1, "bg_group_ireduce_scatter_inplace",
                                req_p);
}

bg_status_t bg_group_iallgather_chunks(bg_group_t *g, void *buf, size_t count, bg_dtype_t dtype,
                                       bg_request_t **req_p)
{
    if (!req_p || (!buf && count) || !bg_dtype_size(dtype))
        return bg_error(BG_ERR_INVALID, "bg_group_iallgather_chunks: NULL buffer or request output, or unknown "
                        "type %d", (int)dtype);
    bg__coll_t *co;
    BG_CHECK(bg__coll_new(g, "allgather", &co));
    co->dunits = bg__units(dtype);
    bg__desc(co, "allgather of %zu %s in chunks%s", count, "");
    if (bg__build_ring_ag(co, buf, count, bg_dtype_size(dtype), 0) != 0)
        BG__NOMEM(co);
    return bg__coll_start(co, req_p);
}
