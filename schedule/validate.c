/* schedule/validate.c: proves a program set correct before anything
 * runs: ranges, each compute piece exactly once, per-rank order of the
 * dependencies, send/receive matching, and a deadlock-freedom walk under the
 * executor's semantics (each rank walks its list in order; a receive blocks
 * until its matching send has been issued; sends are buffered and never
 * block). It reports the first offending instruction, in rank then program
 * order, and for a deadlock the cycle of waits. It never modifies the
 * schedule and knows nothing of costs. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/schedule_impl.h"

enum { P_F, P_BW, P_B, P_W, P_SA, P_RA, P_SG, P_RG, P_COUNT };

typedef struct {
    const bg_schedule_t *s;
    int S, M;
    int *pos[P_COUNT];   /* [S*M]: index in the owning rank's list, -1 when absent */
    int *red, *opt;      /* [S] */
} bg__val_t;

static int bg__slot(int kind)
{
    switch (kind) {
    case BG_OP_FORWARD: return P_F;
    case BG_OP_BACKWARD: return P_BW;
    case BG_OP_BACKWARD_INPUT: return P_B;
    case BG_OP_BACKWARD_WEIGHT: return P_W;
    case BG_OP_SEND_ACT: return P_SA;
    case BG_OP_RECV_ACT: return P_RA;
    case BG_OP_SEND_GRAD: return P_SG;
    case BG_OP_RECV_GRAD: return P_RG;
    default: return -1;
    }
}

#define BG__FAIL(st, r, i, op, ...)                                                                \
    do {                                                                                           \
        char d__[160], m__[700];                                                                   \
        bg__op_describe(d__, sizeof d__, (r), (i), (op));                                          \
        snprintf(m__, sizeof m__, __VA_ARGS__);                                                    \
        return bg_error((st), "invalid schedule: %s: %s", d__, m__);                              \
    } while (0)

/* pass 1: ranges and duplicates */
static bg_status_t bg__pass_ranges(bg__val_t *V)
{
    const bg_schedule_t *s = V->s;
    for (int r = 0; r < s->p; r++)
        for (size_t i = 0; i < s->nops[r]; i++) {
            const bg_sched_op_t *op = &s->ops[r][i];
            if (op->kind < 0 || op->kind >= BG_OP_KIND_COUNT)
                BG__FAIL(BG_ERR_INVALID, r, i, op, "unknown instruction kind %d", op->kind);
            if (op->stage < 0 || op->stage >= V->S)
                BG__FAIL(BG_ERR_INVALID, r, i, op, "stage %d out of range 0..%d", op->stage, V->S - 1);
            if (s->stage_rank[op->stage] != r)
                BG__FAIL(BG_ERR_INVALID, r, i, op, "stage %d lives on rank %d, not rank %d", op->stage,
                         s->stage_rank[op->stage], r);
            if (op->chunk != s->stage_chunk[op->stage])
                BG__FAIL(BG_ERR_INVALID, r, i, op, "stage %d is chunk %d of rank %d, not chunk %d", op->stage,
                         s->stage_chunk[op->stage], r, op->chunk);
            if (s->forward_only && op->kind != BG_OP_FORWARD && op->kind != BG_OP_SEND_ACT &&
                op->kind != BG_OP_RECV_ACT)
                BG__FAIL(BG_ERR_INVALID, r, i, op, "a forward-only program holds forwards and activation transfers "
                         "only (no backward, gradient transfer, reduce or optimizer step)");
            if (op->kind == BG_OP_REDUCE_GRADS || op->kind == BG_OP_OPTIMIZER_STEP) {
                int *t = op->kind == BG_OP_REDUCE_GRADS ? V->red : V->opt;
                if (t[op->stage] >= 0)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "duplicate: the same instruction is already op %d",
                             t[op->stage]);
                t[op->stage] = (int)i;
                continue;
            }
            if (op->microbatch < 0 || op->microbatch >= V->M)
                BG__FAIL(BG_ERR_INVALID, r, i, op, "microbatch %d out of range 0..%d", op->microbatch, V->M - 1);
            if (!bg__mb_on(s, op->stage, op->microbatch))
                BG__FAIL(BG_ERR_INVALID, r, i, op, "microbatch %d goes through copy %d of the model, but stage %d "
                         "belongs to copy %d", op->microbatch, bg_schedule_microbatch_copy(s, op->microbatch),
                         op->stage, bg_schedule_stage_copy(s, op->stage));
            int comm = op->kind >= BG_OP_SEND_ACT && op->kind <= BG_OP_RECV_GRAD;
            if (comm) {
                int up = op->kind == BG_OP_SEND_ACT || op->kind == BG_OP_RECV_GRAD;
                int want = up ? op->stage + 1 : op->stage - 1;
                if (up ? bg__chain_last(s, op->stage) : bg__chain_first(s, op->stage))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "stage %d has no %s neighbour to talk to%s", op->stage,
                             up ? "next" : "previous",
                             s->copies > 1 ? " (it ends its copy's chain of stages)" : "");
                if (op->peer_stage != want)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "peer stage must be %d, got %d", want, op->peer_stage);
                if (op->peer_rank >= 0 && op->peer_rank != s->stage_rank[want])
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "peer rank must be %d (holder of stage %d), got %d",
                             s->stage_rank[want], want, op->peer_rank);
                if (s->stage_rank[want] == r)
                    BG__FAIL(BG_ERR_INVALID, r, i, op,
                             "stages %d and %d both live on rank %d: no transfer between them is needed "
                             "(the data stays local)", op->stage, want, r);
            }
            int *t = V->pos[bg__slot(op->kind)];
            size_t at = (size_t)op->stage * V->M + op->microbatch;
            if (t[at] >= 0)
                BG__FAIL(BG_ERR_INVALID, r, i, op, "duplicate: the same instruction is already op %d", t[at]);
            t[at] = (int)i;
        }
    return BG_OK;
}

/* position of the producer of (mb, stage)'s backward output: full or input backward */
static int bg__bpos(const bg__val_t *V, size_t at)
{
    return V->pos[P_BW][at] >= 0 ? V->pos[P_BW][at] : V->pos[P_B][at];
}

/* position of the piece of (mb, stage) that adds its weight gradient: full backward or W */
static int bg__wpos(const bg__val_t *V, size_t at)
{
    return V->pos[P_BW][at] >= 0 ? V->pos[P_BW][at] : V->pos[P_W][at];
}

/* pass 2: per-instruction order and matching */
static bg_status_t bg__pass_order(bg__val_t *V)
{
    const bg_schedule_t *s = V->s;
    int S = V->S, M = V->M;
    for (int r = 0; r < s->p; r++) {
        /* the rank's last compute or communication instruction: optimizer steps come after it */
        size_t work = 0;
        for (size_t i = 0; i < s->nops[r]; i++)
            if (s->ops[r][i].kind != BG_OP_REDUCE_GRADS && s->ops[r][i].kind != BG_OP_OPTIMIZER_STEP)
                work = i + 1;
        for (size_t i = 0; i < s->nops[r]; i++) {
            const bg_sched_op_t *op = &s->ops[r][i];
            int st = op->stage, mb = op->microbatch, ix = (int)i;
            size_t at = (size_t)st * M + (mb < 0 ? 0 : mb);
            size_t prv = at - (size_t)M, nxt = at + (size_t)M;
            int has_prev = !bg__chain_first(s, st), has_next = !bg__chain_last(s, st);
            int local_prev = has_prev && s->stage_rank[st - 1] == r;
            int local_next = has_next && s->stage_rank[st + 1] == r;
            int mb0 = bg__mb_first(s, st); /* the first microbatch through st */
            switch (op->kind) {
            case BG_OP_FORWARD:
                if (local_prev && !(V->pos[P_F][prv] >= 0 && V->pos[P_F][prv] < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "needs forward of mb %d stage %d (same rank) before it%s",
                             mb, st - 1, V->pos[P_F][prv] < 0 ? ", which is missing" : "");
                if (has_prev && !local_prev && !(V->pos[P_RA][at] >= 0 && V->pos[P_RA][at] < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "needs recv_act of mb %d from stage %d before it%s", mb,
                             st - 1, V->pos[P_RA][at] < 0 ? ", which is missing" : "");
                break;
            case BG_OP_BACKWARD:
            case BG_OP_BACKWARD_INPUT:
                if (op->kind == BG_OP_BACKWARD && V->pos[P_B][at] >= 0)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "the same (mb, stage) also has a backward_input (op %d): "
                             "use either a full backward or B + W", V->pos[P_B][at]);
                if (!(V->pos[P_F][at] >= 0 && V->pos[P_F][at] < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "backward before its forward (%s)",
                             V->pos[P_F][at] < 0 ? "forward missing" : "forward comes later");
                if (local_next && !(bg__bpos(V, nxt) >= 0 && bg__bpos(V, nxt) < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "needs the backward of mb %d stage %d (same rank) before it",
                             mb, st + 1);
                if (has_next && !local_next && !(V->pos[P_RG][at] >= 0 && V->pos[P_RG][at] < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "needs recv_grad of mb %d from stage %d before it%s", mb,
                             st + 1, V->pos[P_RG][at] < 0 ? ", which is missing" : "");
                if (op->kind == BG_OP_BACKWARD && mb > mb0 && !(bg__wpos(V, at - 1) >= 0 && bg__wpos(V, at - 1) < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "weight gradients add up in microbatch order: the weight "
                             "gradient of mb %d stage %d must come before it", mb - 1, st);
                break;
            case BG_OP_BACKWARD_WEIGHT:
                if (V->pos[P_BW][at] >= 0)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "the same (mb, stage) also has a full backward (op %d)",
                             V->pos[P_BW][at]);
                if (!(V->pos[P_B][at] >= 0 && V->pos[P_B][at] < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "W before its B (%s)",
                             V->pos[P_B][at] < 0 ? "backward_input missing" : "backward_input comes later");
                if (mb > mb0 && !(bg__wpos(V, at - 1) >= 0 && bg__wpos(V, at - 1) < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "weight gradients add up in microbatch order: the weight "
                             "gradient of mb %d stage %d must come before it", mb - 1, st);
                if (V->pos[P_SG][at] > ix)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "frees the input gradient that send_grad (op %d) sends "
                             "later: send it before the W", V->pos[P_SG][at]);
                break;
            case BG_OP_SEND_ACT:
                if (!(V->pos[P_F][at] >= 0 && V->pos[P_F][at] < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "sends an activation before the forward producing it");
                if (V->pos[P_RA][nxt] < 0)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "no matching recv_act on rank %d (stage %d)",
                             s->stage_rank[st + 1], st + 1);
                break;
            case BG_OP_SEND_GRAD:
                if (!(bg__bpos(V, at) >= 0 && bg__bpos(V, at) < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "sends a gradient before the backward producing it");
                if (V->pos[P_RG][prv] < 0)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "no matching recv_grad on rank %d (stage %d)",
                             s->stage_rank[st - 1], st - 1);
                break;
            case BG_OP_RECV_ACT:
                if (V->pos[P_SA][prv] < 0)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "no matching send_act on rank %d (stage %d)",
                             s->stage_rank[st - 1], st - 1);
                if (V->pos[P_F][at] < ix)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "no forward of mb %d stage %d after it to consume it", mb, st);
                break;
            case BG_OP_RECV_GRAD:
                if (V->pos[P_SG][nxt] < 0)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "no matching send_grad on rank %d (stage %d)",
                             s->stage_rank[st + 1], st + 1);
                if (bg__bpos(V, at) < ix)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "no backward of mb %d stage %d after it to consume it", mb, st);
                break;
            case BG_OP_REDUCE_GRADS:
                for (int k = mb0; k < mb0 + bg__mb_count(s); k++) {
                    size_t a = (size_t)st * M + k;
                    int last = V->pos[P_BW][a] >= 0 ? V->pos[P_BW][a] : V->pos[P_W][a];
                    if (!(last >= 0 && last < ix))
                        BG__FAIL(BG_ERR_INVALID, r, i, op, "reduces gradients before the last backward piece of "
                                 "mb %d stage %d (%s)", k, st, last < 0 ? "missing" : "comes later");
                }
                break;
            case BG_OP_OPTIMIZER_STEP:
                if (!(V->red[st] >= 0 && V->red[st] < ix))
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "optimizer step before reduce_grads of stage %d (%s)", st,
                             V->red[st] < 0 ? "missing" : "comes later");
                if (i < work)
                    BG__FAIL(BG_ERR_INVALID, r, i, op, "optimizer step before the rank's compute and communication "
                             "are done (op %zu comes later): steps close the rank's program", work - 1);
                break;
            }
        }
    }
    /* completeness */
    for (int st = 0; st < S; st++) {
        int r = s->stage_rank[st];
        for (int mb = bg__mb_first(s, st); mb < bg__mb_first(s, st) + bg__mb_count(s); mb++) {
            size_t at = (size_t)st * M + mb;
            if (V->pos[P_F][at] < 0)
                return bg_error(BG_ERR_INVALID, "invalid schedule: rank %d has no forward of mb %d stage %d", r, mb, st);
            if (s->forward_only)
                continue; /* a forward's stash is freed at once: nothing more is owed */
            if (V->pos[P_BW][at] < 0 && V->pos[P_B][at] < 0)
                return bg_error(BG_ERR_INVALID, "invalid schedule: rank %d has no backward of mb %d stage %d", r, mb, st);
            if (V->pos[P_B][at] >= 0 && V->pos[P_W][at] < 0)
                return bg_error(BG_ERR_INVALID, "invalid schedule: rank %d has a backward_input but no "
                                "backward_weight for mb %d stage %d", r, mb, st);
        }
        if (s->forward_only)
            continue;
        if (V->red[st] < 0)
            return bg_error(BG_ERR_INVALID, "invalid schedule: rank %d has no reduce_grads for stage %d", r, st);
        if (V->opt[st] < 0)
            return bg_error(BG_ERR_INVALID, "invalid schedule: rank %d has no optimizer_step for stage %d", r, st);
    }
    return BG_OK;
}

/* append to a fixed buffer, never past its end */
static void bg__cat(char *buf, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void bg__cat(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* pass 3: walk every rank with buffered sends and blocking receives */
static bg_status_t bg__pass_deadlock(bg__val_t *V)
{
    const bg_schedule_t *s = V->s;
    int p = s->p, S = V->S, M = V->M;
    size_t nmsg = (size_t)2 * S * M;
    bg_status_t st = BG_OK;
    unsigned char *issued = calloc(nmsg, 1);
    int *waiter = malloc(sizeof(int) * nmsg);
    size_t *ptr = calloc((size_t)p, sizeof(size_t));
    int *stack = malloc(sizeof(int) * (size_t)p);
    if (!issued || !waiter || !ptr || !stack) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate the deadlock check for %zu messages", nmsg);
        goto out;
    }
    memset(waiter, -1, sizeof(int) * nmsg);
    int top = bg__push_ranks(stack, p);
    while (top > 0) {
        int r = stack[--top];
        while (ptr[r] < s->nops[r]) {
            const bg_sched_op_t *op = &s->ops[r][ptr[r]];
            if (op->kind == BG_OP_RECV_ACT || op->kind == BG_OP_RECV_GRAD) {
                size_t id = ((size_t)(op->kind == BG_OP_RECV_GRAD) * S + op->peer_stage) * M + op->microbatch;
                if (!issued[id]) {
                    waiter[id] = r;
                    break;
                }
            } else if (op->kind == BG_OP_SEND_ACT || op->kind == BG_OP_SEND_GRAD) {
                size_t id = ((size_t)(op->kind == BG_OP_SEND_GRAD) * S + op->stage) * M + op->microbatch;
                issued[id] = 1;
                if (waiter[id] >= 0) {
                    stack[top++] = waiter[id];
                    waiter[id] = -1;
                }
            }
            ptr[r]++;
        }
    }
    for (int r0 = 0; r0 < p; r0++) {
        if (ptr[r0] >= s->nops[r0])
            continue;
        /* follow the waits-for chain from the first blocked rank until it repeats:
         * every rank on it is blocked at a receive whose sender is blocked too */
        char msg[1000], d[160];
        size_t len = 0;
        int *seen = calloc((size_t)p, sizeof(int));
        if (!seen) {
            st = bg_error(BG_ERR_NOMEM, "out of memory while describing a deadlock");
            goto out;
        }
        int nblocked = 0;
        for (int r = 0; r < p; r++)
            nblocked += ptr[r] < s->nops[r];
#define BG__WAITS(r) s->stage_rank[s->ops[(r)][ptr[(r)]].peer_stage]
#define BG__SENDPOS(r)                                                                              \
    V->pos[s->ops[(r)][ptr[(r)]].kind == BG_OP_RECV_GRAD ? P_SG : P_SA]                            \
          [(size_t)s->ops[(r)][ptr[(r)]].peer_stage * M + s->ops[(r)][ptr[(r)]].microbatch]
        int c0 = r0;
        while (!seen[c0]) {
            seen[c0] = 1;
            c0 = BG__WAITS(c0);
        }
        bg__cat(msg, sizeof msg, &len, "deadlock: ");
        int in_cycle = 0;
        for (int r = c0, k = 0; k < p; k++) {
            in_cycle |= r == r0;
            r = BG__WAITS(r);
            if (r == c0)
                break;
        }
        if (!in_cycle) {
            bg__op_describe(d, sizeof d, r0, ptr[r0], &s->ops[r0][ptr[r0]]);
            bg__cat(msg, sizeof msg, &len, "%s waits for rank %d op %d, which is blocked behind a cycle; ", d,
                    BG__WAITS(r0), BG__SENDPOS(r0));
        }
        bg__cat(msg, sizeof msg, &len, "cycle: rank %d", c0);
        for (int r = BG__WAITS(c0), k = 0; k < p; k++, r = BG__WAITS(r)) {
            bg__cat(msg, sizeof msg, &len, " -> rank %d", r);
            if (r == c0)
                break;
        }
        for (int r = c0, k = 0; k < p; k++) {
            bg__op_describe(d, sizeof d, r, ptr[r], &s->ops[r][ptr[r]]);
            bg__cat(msg, sizeof msg, &len, "%s%s waits for rank %d op %d", k ? "; " : ": ", d, BG__WAITS(r),
                    BG__SENDPOS(r));
            r = BG__WAITS(r);
            if (r == c0)
                break;
        }
        bg__cat(msg, sizeof msg, &len, " (%d of %d ranks blocked)", nblocked, p);
#undef BG__WAITS
#undef BG__SENDPOS
        free(seen);
        st = bg_error(BG_ERR_DEADLOCK, "%s", msg);
        goto out;
    }
out:
    free(issued), free(waiter), free(ptr), free(stack);
    return st;
}

bg_status_t bg_schedule_validate(const bg_schedule_t *s)
{
    if (!s)
        return bg_error(BG_ERR_INVALID, "bg_schedule_validate: NULL schedule");
    bg__val_t V = {.s = s, .S = s->nstages, .M = s->m};
    size_t n = (size_t)V.S * V.M;
    bg_status_t st = BG_OK;
    for (int k = 0; k < P_COUNT; k++) {
        V.pos[k] = malloc(sizeof(int) * n);
        if (!V.pos[k]) {
            st = bg_error(BG_ERR_NOMEM, "cannot allocate the validator's tables (%zu entries)", n);
            goto out;
        }
        memset(V.pos[k], -1, sizeof(int) * n);
    }
    V.red = malloc(sizeof(int) * (size_t)V.S);
    V.opt = malloc(sizeof(int) * (size_t)V.S);
    if (!V.red || !V.opt) {
        st = bg_error(BG_ERR_NOMEM, "cannot allocate the validator's tables");
        goto out;
    }
    memset(V.red, -1, sizeof(int) * (size_t)V.S);
    memset(V.opt, -1, sizeof(int) * (size_t)V.S);
    BG_CHECK_GOTO(bg__pass_ranges(&V), st, out);
    BG_CHECK_GOTO(bg__pass_order(&V), st, out);
    BG_CHECK_GOTO(bg__pass_deadlock(&V), st, out);
out:
    for (int k = 0; k < P_COUNT; k++)
        free(V.pos[k]);
    free(V.red), free(V.opt);
    return st;
}
