/* schedule/offact.c: the points where activation offload moves each stash
 * (schedule/offact.h), for the executor's strategy and the replay alike.
 *
 * Out: at the first compute instruction after the slot's forward and its
 * SEND_ACT, once the send has completed (the stash holds the output the
 * send reads). The strategy waits for that send there; it completes once
 * the next stage's rank has posted its receive, which the executor does
 * when that rank reaches the instruction after the second-to-last compute
 * instruction before the receive (runtime/exec_ops.c bg__exec_post_ahead).
 * Such a wait could close a cycle the program does not have (that rank
 * waiting, before it posts, for something this rank sends later), so every
 * rank's program is walked with the executor's waits (a receive waits for
 * its send to be issued; an out point waits for the receiver's post): the
 * out point a blocked rank waits at moves one compute instruction later,
 * until nothing blocks or it reaches its in point (then the slot stays on
 * the device). The waits only ever wait for something that happens in
 * every run, whatever the timing, so the run cannot deadlock where the
 * walk does not; the walk's end state does not depend on the order it
 * steps the ranks in, so every rank computes the same points.
 * In: `ahead` compute instructions before the first backward piece.
 * Not on the last stage of a chain: its backward follows its forward.
 *
 * Must not: know tensors, bytes or backends. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "schedule/offact.h"
#include "schedule/schedule_impl.h"

typedef struct pt {
    int out_at, in_at; /* compute indices (bg__offact_slot_t) */
    int wait_rank;     /* the rank receiving the output; -1: the next stage is this rank's (no wait) */
    size_t wait_pos;   /* the op of wait_rank at which it posts that receive */
} pt_t;

typedef struct walk {
    const bg_schedule_t *s;
    int P, S, M, V;
    int **cidx;      /* [P][nops]: compute index of each op, -1 for the rest */
    pt_t **pt;       /* [P][V * M] */
    size_t *sends;   /* [2 * S * M]: op index of SEND_ACT (then SEND_GRAD) of (stage, mb) on its rank */
    size_t *posted;  /* [S * M]: op index at which the rank of (stage, mb)'s RECV_ACT posts it */
    int *first_bw;   /* [S * M]: compute index of (stage, mb)'s first backward piece (B or fused) on its rank */
    size_t *pos;     /* [P]: the op each rank is at */
} walk_t;

static int is_compute(int kind) { return kind <= BG_OP_BACKWARD_WEIGHT; }

/* The op tables: compute indices, sends, and where each activation receive is posted. */
static void index_ops(walk_t *w)
{
    const bg_schedule_t *s = w->s;
    for (int r = 0; r < w->P; r++) {
        size_t c1 = SIZE_MAX, c2 = SIZE_MAX; /* the last two compute ops seen */
        int g = 0;
        for (size_t i = 0; i < s->nops[r]; i++) {
            const bg_sched_op_t *op = &s->ops[r][i];
            size_t id = (size_t)op->stage * w->M + (size_t)op->microbatch;
            w->cidx[r][i] = is_compute(op->kind) ? g++ : -1;
            if (op->kind == BG_OP_SEND_ACT || op->kind == BG_OP_SEND_GRAD)
                w->sends[(size_t)(op->kind == BG_OP_SEND_GRAD) * w->S * w->M + id] = i;
            else if (op->kind == BG_OP_RECV_ACT) /* posted once the window of two computes reaches it */
                w->posted[id] = c1 == SIZE_MAX ? 0 : c1 + 1;
            else if ((op->kind == BG_OP_BACKWARD || op->kind == BG_OP_BACKWARD_INPUT) && w->first_bw[id] < 0)
                w->first_bw[id] = w->cidx[r][i];
            if (is_compute(op->kind)) {
                c1 = c2;
                c2 = i;
            }
        }
    }
}

/* Rank r's candidate points: out at the first compute op after the forward and its send, in `ahead` before
 * the first backward piece. */
static void candidates(walk_t *w, int r, int ahead)
{
    const bg_schedule_t *s = w->s;
    size_t n = s->nops[r], VM = (size_t)w->V * w->M;
    for (size_t k = 0; k < VM; k++)
        w->pt[r][k] = (pt_t){-1, -1, -1, 0};
    for (size_t i = 0; i < n; i++) {
        const bg_sched_op_t *f = &s->ops[r][i];
        if (f->kind != BG_OP_FORWARD || bg__chain_last(s, f->stage))
            continue;
        int mb = f->microbatch, next = f->stage + 1, b = w->first_bw[(size_t)f->stage * w->M + mb];
        size_t from = i; /* the out point comes after this op */
        pt_t p = {-1, -1, -1, 0};
        if (s->stage_rank[next] != r) {
            size_t sa = w->sends[(size_t)f->stage * w->M + mb], post = w->posted[(size_t)next * w->M + mb];
            if (sa == SIZE_MAX || post == SIZE_MAX)
                continue;
            from = sa > i ? sa : i;
            p.wait_rank = s->stage_rank[next];
            p.wait_pos = post;
        }
        for (size_t j = from + 1; j < n && p.out_at < 0; j++)
            p.out_at = w->cidx[r][j];
        p.in_at = b - ahead;
        if (b >= 0 && p.out_at >= 0 && p.out_at < p.in_at)
            w->pt[r][(size_t)f->chunk * w->M + mb] = p;
    }
}

/* The out points at rank r's compute instruction g whose receiver has not posted yet: how many. relax: move
 * each one compute instruction later (none once it reaches its in point). */
static int stash_waits(walk_t *w, int r, int g, int relax)
{
    int n = 0;
    for (size_t k = 0; k < (size_t)w->V * w->M; k++) {
        pt_t *p = &w->pt[r][k];
        if (p->out_at != g || p->wait_rank < 0 || w->pos[p->wait_rank] >= p->wait_pos)
            continue;
        n++;
        if (relax && ++p->out_at >= p->in_at)
            p->out_at = p->in_at = -1;
    }
    return n;
}

/* Can rank r run the op it is at? */
static int can_run(walk_t *w, int r)
{
    const bg_schedule_t *s = w->s;
    const bg_sched_op_t *op = &s->ops[r][w->pos[r]];
    if (op->kind == BG_OP_RECV_ACT || op->kind == BG_OP_RECV_GRAD) {
        size_t at = w->sends[(size_t)(op->kind == BG_OP_RECV_GRAD) * w->S * w->M +
                             (size_t)op->peer_stage * w->M + (size_t)op->microbatch];
        return at != SIZE_MAX && w->pos[s->stage_rank[op->peer_stage]] > at;
    }
    return !is_compute(op->kind) || stash_waits(w, r, w->cidx[r][w->pos[r]], 0) == 0;
}

/* Walk every rank as far as it goes; relax the first out point a blocked rank waits at, and again, until every
 * rank reaches its end. A program that blocks on receives alone (the validator refuses it) keeps every stash. */
static void walk(walk_t *w)
{
    const bg_schedule_t *s = w->s;
    for (;;) {
        for (int progress = 1; progress;) {
            progress = 0;
            for (int r = 0; r < w->P; r++)
                while (w->pos[r] < s->nops[r] && can_run(w, r)) {
                    w->pos[r]++;
                    progress = 1;
                }
        }
        int done = 1, relaxed = 0;
        for (int r = 0; r < w->P; r++) {
            if (w->pos[r] >= s->nops[r])
                continue;
            done = 0;
            int g = w->cidx[r][w->pos[r]];
            if (!relaxed && g >= 0)
                relaxed = stash_waits(w, r, g, 1) > 0;
        }
        if (done)
            return;
        if (!relaxed) {
            for (int r = 0; r < w->P; r++)
                for (size_t k = 0; k < (size_t)w->V * w->M; k++)
                    w->pt[r][k].out_at = w->pt[r][k].in_at = -1;
            return;
        }
    }
}

bg_status_t bg__offact_ahead(int *ahead_p)
{
    long long k = 0;
    if (bg_config_int("BRIGADE_OFFLOAD_ACT_AHEAD", &k) != BG_OK || k < 0 || k > 1000) {
        const char *v = bg_config_str("BRIGADE_OFFLOAD_ACT_AHEAD");
        return bg_error(BG_ERR_INVALID, "BRIGADE_OFFLOAD_ACT_AHEAD=%s: expected 0 to 1000 (compute instructions "
                        "ahead of a microbatch's backward its stash comes back)", v ? v : "");
    }
    *ahead_p = (int)k;
    return BG_OK;
}

/* rank < 0: every rank's points (P x V x M), else rank's (V x M). */
static bg_status_t points(const bg_schedule_t *sched, int rank, int ahead, bg__offact_slot_t **slots_p)
{
    walk_t w = {sched, sched->p, sched->nstages, sched->m, sched->v, NULL, NULL, NULL, NULL, NULL, NULL};
    if (rank < -1 || rank >= w.P || ahead < 0)
        return bg_error(BG_ERR_INVALID, "activation offload points: rank %d of %d, ahead %d", rank, w.P, ahead);
    size_t SM = (size_t)w.S * w.M, VM = (size_t)w.V * w.M, NR = rank < 0 ? (size_t)w.P : 1;
    bg_status_t st = BG_OK;
    bg__offact_slot_t *out = malloc((NR * VM > 0 ? NR * VM : 1) * sizeof(*out));
    w.cidx = calloc((size_t)w.P, sizeof(*w.cidx));
    w.pt = calloc((size_t)w.P, sizeof(*w.pt));
    w.sends = malloc((2 * SM + 1) * sizeof(size_t));
    w.posted = malloc((SM + 1) * sizeof(size_t));
    w.first_bw = malloc((SM + 1) * sizeof(int));
    w.pos = calloc((size_t)w.P, sizeof(size_t));
    if (!out || !w.cidx || !w.pt || !w.sends || !w.posted || !w.first_bw || !w.pos)
        goto nomem;
    for (int r = 0; r < w.P; r++) {
        w.cidx[r] = malloc((sched->nops[r] + 1) * sizeof(int));
        w.pt[r] = malloc((VM + 1) * sizeof(pt_t));
        if (!w.cidx[r] || !w.pt[r])
            goto nomem;
    }
    memset(w.sends, 0xff, 2 * SM * sizeof(size_t));
    memset(w.posted, 0xff, SM * sizeof(size_t));
    memset(w.first_bw, 0xff, SM * sizeof(int));
    index_ops(&w);
    for (int r = 0; r < w.P; r++)
        candidates(&w, r, ahead);
    walk(&w);
    for (size_t r = 0; r < NR; r++)
        for (size_t k = 0; k < VM; k++) {
            const pt_t *p = &w.pt[rank < 0 ? (int)r : rank][k];
            out[r * VM + k] = (bg__offact_slot_t){p->out_at, p->in_at};
        }
    *slots_p = out;
    out = NULL;
    goto done;
nomem:
    st = bg_error(BG_ERR_NOMEM, "activation offload points (%d ranks, %d stages x %d microbatches)", w.P, w.S, w.M);
done:
    for (int r = 0; w.cidx && w.pt && r < w.P; r++) {
        free(w.cidx[r]);
        free(w.pt[r]);
    }
    free(w.cidx), free(w.pt), free(w.sends), free(w.posted), free(w.first_bw), free(w.pos), free(out);
    return st;
}

bg_status_t bg__offact_points(const bg_schedule_t *sched, int rank, int ahead, bg__offact_slot_t **slots_p)
{
    if (rank < 0)
        return bg_error(BG_ERR_INVALID, "activation offload points: rank %d of %d", rank, sched->p);
    return points(sched, rank, ahead, slots_p);
}

bg_status_t bg__offact_points_all(const bg_schedule_t *sched, int ahead, bg__offact_slot_t **slots_p)
{
    return points(sched, -1, ahead, slots_p);
}
