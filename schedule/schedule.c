/* schedule/schedule.c: the schedule IR itself: names of kinds, the
 * program-set container (create, append, accessors, free) and the text
 * table. Generators, validation, JSON, simulation and SVG live in their own
 * files; this one must not know about any of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/schedule_impl.h"

static const char *const bg__op_names[] = {
#define BG__N(e, json, tok) json,
    BG_SCHED_OP_MAP(BG__N)
#undef BG__N
};
static const char *const bg__op_tokens[] = {
#define BG__T(e, json, tok) tok,
    BG_SCHED_OP_MAP(BG__T)
#undef BG__T
};
static const char *const bg__sched_names[] = {"gpipe", "1f1b", "interleaved", "zb-h1",
                                              "zb-h2", "zbv", "zb-interleaved", "dualpipev", "dualpipe", "custom"};

const char *bg_sched_op_kind_name(bg_sched_op_kind_t kind)
{
    return (unsigned)kind < BG_OP_KIND_COUNT ? bg__op_names[kind] : NULL;
}

const char *bg_sched_op_kind_token(bg_sched_op_kind_t kind)
{
    return (unsigned)kind < BG_OP_KIND_COUNT ? bg__op_tokens[kind] : NULL;
}

const char *bg_schedule_kind_name(bg_schedule_kind_t kind)
{
    return (unsigned)kind < BG_SCHED_KIND_COUNT ? bg__sched_names[kind] : NULL;
}

bg_status_t bg_sched_op_kind_parse(const char *name, bg_sched_op_kind_t *kind_p)
{
    for (int k = 0; k < BG_OP_KIND_COUNT; k++)
        if (name && !strcmp(name, bg__op_names[k])) {
            *kind_p = (bg_sched_op_kind_t)k;
            return BG_OK;
        }
    return bg_error(BG_ERR_NOT_FOUND,
                    "unknown instruction kind \"%s\" (expected forward, backward, backward_input, "
                    "backward_weight, send_act, recv_act, send_grad, recv_grad, reduce_grads or "
                    "optimizer_step)", name ? name : "(null)");
}

bg_status_t bg_schedule_kind_parse(const char *name, bg_schedule_kind_t *kind_p)
{
    for (int k = 0; k < BG_SCHED_CUSTOM; k++)
        if (name && !strcmp(name, bg__sched_names[k])) {
            *kind_p = (bg_schedule_kind_t)k;
            return BG_OK;
        }
    return bg_error(BG_ERR_NOT_FOUND,
                    "unknown schedule \"%s\" (expected gpipe, 1f1b, interleaved, zb-h1, zb-h2, zbv, zb-interleaved, "
                    "dualpipev or dualpipe)",
                    name ? name : "(null)");
}

/* ---- growable string ---- */

void bg__str_printf(bg__str_t *s, const char *fmt, ...)
{
    if (s->oom)
        return;
    for (;;) {
        va_list ap;
        size_t room = s->cap - s->len;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf ? s->buf + s->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            s->oom = 1;
            return;
        }
        if ((size_t)n < room) {
            s->len += (size_t)n;
            return;
        }
        size_t ncap = s->cap ? s->cap * 2 : 4096;
        while (ncap - s->len <= (size_t)n)
            ncap *= 2;
        char *nb = realloc(s->buf, ncap);
        if (!nb) {
            s->oom = 1;
            return;
        }
        s->buf = nb;
        s->cap = ncap;
    }
}

void bg__str_free(bg__str_t *s)
{
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

/* ---- container ---- */

bg_status_t bg__schedule_alloc(const char *name, bg_schedule_kind_t kind, int p, int m, int v,
                               const int *chunk_stage, bg_schedule_t **sched_p)
{
    if (p < 1 || m < 1 || v < 1)
        return bg_error(BG_ERR_INVALID, "a schedule needs ranks >= 1, microbatches >= 1 and chunks >= 1, "
                                        "got ranks %d, microbatches %d, chunks %d", p, m, v);
    if ((long long)p * v > 1 << 20 || m > 1 << 24)
        return bg_error(BG_ERR_INVALID, "schedule too large: %d ranks x %d chunks x %d microbatches", p, v, m);
    int n = p * v;
    bg_schedule_t *s = calloc(1, sizeof(*s));
    BG_ALLOC_CHECK(s, sizeof(*s), "schedule");
    s->kind = kind;
    snprintf(s->name, sizeof(s->name), "%s", name ? name : "custom");
    s->p = p, s->m = m, s->v = v, s->nstages = n, s->copies = 1;
    s->stage_rank = malloc(sizeof(int) * (size_t)n);
    s->stage_chunk = malloc(sizeof(int) * (size_t)n);
    s->chunk_stage = malloc(sizeof(int) * (size_t)n);
    s->ops = calloc((size_t)p, sizeof(*s->ops));
    s->nops = calloc((size_t)p, sizeof(size_t));
    s->cap = calloc((size_t)p, sizeof(size_t));
    if (!s->stage_rank || !s->stage_chunk || !s->chunk_stage || !s->ops || !s->nops || !s->cap) {
        bg_schedule_free(s);
        return bg_error(BG_ERR_NOMEM, "cannot allocate a schedule of %d ranks x %d chunks", p, v);
    }
    for (int i = 0; i < n; i++)
        s->stage_rank[i] = -1;
    for (int r = 0; r < p; r++)
        for (int c = 0; c < v; c++) {
            int st = chunk_stage ? chunk_stage[r * v + c] : c * p + r;
            if (st < 0 || st >= n || s->stage_rank[st] >= 0) {
                bg_schedule_free(s);
                return bg_error(BG_ERR_INVALID,
                                "stage map: (rank %d, chunk %d) -> stage %d is %s (stages 0..%d, each once)",
                                r, c, st, st < 0 || st >= n ? "out of range" : "used twice", n - 1);
            }
            s->chunk_stage[r * v + c] = st;
            s->stage_rank[st] = r;
            s->stage_chunk[st] = c;
        }
    *sched_p = s;
    return BG_OK;
}

bg_status_t bg_schedule_create(const char *name, int ranks, int microbatches, int chunks,
                               const int *stage_of_chunk, bg_schedule_t **sched_p)
{
    return bg__schedule_alloc(name, BG_SCHED_CUSTOM, ranks, microbatches, chunks, stage_of_chunk, sched_p);
}

bg_status_t bg_schedule_append(bg_schedule_t *s, int rank, const bg_sched_op_t *op)
{
    if (!s || !op || rank < 0 || rank >= s->p)
        return bg_error(BG_ERR_INVALID, "append: rank %d out of range (0..%d)", rank, s ? s->p - 1 : -1);
    if (s->nops[rank] == s->cap[rank]) {
        size_t nc = s->cap[rank] ? s->cap[rank] * 2 : s->reserve ? s->reserve : 64;
        bg_sched_op_t *no = realloc(s->ops[rank], nc * sizeof(*no));
        BG_ALLOC_CHECK(no, nc * sizeof(*no), "schedule instructions");
        s->ops[rank] = no;
        s->cap[rank] = nc;
    }
    s->ops[rank][s->nops[rank]++] = *op;
    return BG_OK;
}

void bg__schedule_reserve_generated(bg_schedule_t *s)
{
    s->reserve = 7 * (size_t)s->m * (size_t)s->v + 2 * (size_t)s->v;
}

void bg__schedule_clear(bg_schedule_t *s)
{
    for (int r = 0; r < s->p; r++)
        s->nops[r] = 0;
}

void bg_schedule_free(bg_schedule_t *s)
{
    if (!s)
        return;
    if (s->ops)
        for (int r = 0; r < s->p; r++)
            free(s->ops[r]);
    free(s->ops);
    free(s->nops);
    free(s->cap);
    free(s->stage_rank);
    free(s->stage_chunk);
    free(s->chunk_stage);
    free(s);
}

bg_schedule_kind_t bg_schedule_kind(const bg_schedule_t *s) { return s->kind; }
const char *bg_schedule_name(const bg_schedule_t *s) { return s->name; }
int bg_schedule_ranks(const bg_schedule_t *s) { return s->p; }
int bg_schedule_microbatches(const bg_schedule_t *s) { return s->m; }
int bg_schedule_chunks(const bg_schedule_t *s) { return s->v; }
int bg_schedule_stages(const bg_schedule_t *s) { return s->nstages; }

int bg_schedule_copies(const bg_schedule_t *s) { return s->copies; }

bg_status_t bg_schedule_set_copies(bg_schedule_t *s, int copies)
{
    if (!s)
        return bg_error(BG_ERR_INVALID, "bg_schedule_set_copies: NULL schedule");
    if (copies < 1 || s->nstages % copies || s->m % copies)
        return bg_error(BG_ERR_INVALID, "%d model copies must divide both the %d virtual stages and the %d "
                                        "microbatches", copies, s->nstages, s->m);
    s->copies = copies;
    return BG_OK;
}

int bg_schedule_is_forward_only(const bg_schedule_t *s) { return s->forward_only; }

bg_status_t bg_schedule_set_forward_only(bg_schedule_t *s, int on)
{
    if (!s)
        return bg_error(BG_ERR_INVALID, "bg_schedule_set_forward_only: NULL schedule");
    s->forward_only = on != 0;
    return BG_OK;
}

/* Keeping each rank's forwards and activation transfers in their order keeps
 * the program deadlock-free: dropping instructions from an order that
 * completes never makes a receive wait for a send that is no longer issued
 * (every activation receive's send is kept), and sends never block. */
bg_status_t bg_schedule_forward_only(const bg_schedule_t *s, bg_schedule_t **fwd_p)
{
    if (!s || !fwd_p)
        return bg_error(BG_ERR_INVALID, "bg_schedule_forward_only: NULL argument");
    bg_schedule_t *f = NULL;
    BG_CHECK(bg__schedule_alloc(s->name, s->kind, s->p, s->m, s->v, s->chunk_stage, &f));
    f->copies = s->copies;
    f->forward_only = 1;
    bg_status_t st = BG_OK;
    for (int r = 0; r < s->p && st == BG_OK; r++)
        for (size_t i = 0; i < s->nops[r] && st == BG_OK; i++) {
            int k = s->ops[r][i].kind;
            if (k == BG_OP_FORWARD || k == BG_OP_SEND_ACT || k == BG_OP_RECV_ACT)
                st = bg_schedule_append(f, r, &s->ops[r][i]);
        }
    if (st != BG_OK) {
        bg_schedule_free(f);
        return st;
    }
    *fwd_p = f;
    return BG_OK;
}

int bg_schedule_stage_copy(const bg_schedule_t *s, int stage)
{
    return stage >= 0 && stage < s->nstages ? stage / (s->nstages / s->copies) : -1;
}

int bg_schedule_model_stage(const bg_schedule_t *s, int stage)
{
    return stage >= 0 && stage < s->nstages ? stage % (s->nstages / s->copies) : -1;
}

int bg_schedule_microbatch_copy(const bg_schedule_t *s, int microbatch)
{
    return microbatch >= 0 && microbatch < s->m ? microbatch / (s->m / s->copies) : -1;
}

int bg_schedule_stage_rank(const bg_schedule_t *s, int stage)
{
    return stage >= 0 && stage < s->nstages ? s->stage_rank[stage] : -1;
}

int bg_schedule_stage_chunk(const bg_schedule_t *s, int stage)
{
    return stage >= 0 && stage < s->nstages ? s->stage_chunk[stage] : -1;
}

size_t bg_sched_pair_partner(const bg_sched_op_t *ops, size_t n, size_t i)
{
    if (i >= n || ops[i].kind > BG_OP_BACKWARD_WEIGHT)
        return 0;
    for (size_t j = i + 1; j < n; j++) {
        const bg_sched_op_t *q = &ops[j];
        if (q->kind == BG_OP_SEND_ACT || q->kind == BG_OP_SEND_GRAD || q->kind == BG_OP_RECV_ACT ||
            q->kind == BG_OP_RECV_GRAD)
            continue;
        if (q->kind > BG_OP_BACKWARD_WEIGHT || q->microbatch == ops[i].microbatch ||
            (q->kind == BG_OP_FORWARD) == (ops[i].kind == BG_OP_FORWARD))
            return 0;
        return j;
    }
    return 0;
}

const bg_sched_op_t *bg_schedule_rank_ops(const bg_schedule_t *s, int rank, size_t *count_p)
{
    if (rank < 0 || rank >= s->p) {
        *count_p = 0;
        return NULL;
    }
    *count_p = s->nops[rank];
    return s->ops[rank];
}

void bg__op_describe(char *buf, size_t n, int rank, size_t idx, const bg_sched_op_t *op)
{
    const char *k = bg_sched_op_kind_name((bg_sched_op_kind_t)op->kind);
    if (op->kind == BG_OP_SEND_ACT || op->kind == BG_OP_SEND_GRAD)
        snprintf(buf, n, "rank %d op %zu (%s mb %d stage %d -> stage %d)", rank, idx, k, op->microbatch,
                 op->stage, op->peer_stage);
    else if (op->kind == BG_OP_RECV_ACT || op->kind == BG_OP_RECV_GRAD)
        snprintf(buf, n, "rank %d op %zu (%s mb %d stage %d <- stage %d)", rank, idx, k, op->microbatch,
                 op->stage, op->peer_stage);
    else if (k)
        snprintf(buf, n, "rank %d op %zu (%s mb %d stage %d)", rank, idx, k, op->microbatch, op->stage);
    else
        snprintf(buf, n, "rank %d op %zu (kind %d)", rank, idx, op->kind);
}

/* ---- text ---- */

bg_status_t bg_schedule_format_text(const bg_schedule_t *s, unsigned flags, char **text_p)
{
    bg__str_t out = {0};
    int w = s->p > 10 ? 2 : 1;
    for (int r = 0; r < s->p; r++) {
        bg__str_printf(&out, "rank %*d |", w, r);
        for (size_t i = 0; i < s->nops[r]; i++) {
            const bg_sched_op_t *op = &s->ops[r][i];
            int comm = op->kind >= BG_OP_SEND_ACT && op->kind <= BG_OP_RECV_GRAD;
            int tail = op->kind == BG_OP_REDUCE_GRADS || op->kind == BG_OP_OPTIMIZER_STEP;
            if (comm && !(flags & BG_SCHED_TEXT_COMM))
                continue;
            if (tail && !(flags & BG_SCHED_TEXT_COMM))
                continue;
            const char *tok = bg_sched_op_kind_token((bg_sched_op_kind_t)op->kind);
            if (!tok)
                tok = "?";
            if (tail)
                bg__str_printf(&out, " %s", tok);
            else
                bg__str_printf(&out, " %s%d", tok, op->microbatch);
            if (s->v > 1)
                bg__str_printf(&out, ".%d", op->chunk);
        }
        bg__str_printf(&out, "\n");
    }
    if (out.oom || !out.buf) {
        bg__str_free(&out);
        return bg_error(BG_ERR_NOMEM, "cannot format the schedule as text");
    }
    *text_p = out.buf;
    return BG_OK;
}
