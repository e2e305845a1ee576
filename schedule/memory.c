/* schedule/memory.c: the memory model of a rank's program, shared by the
 * planner (partitioner/: stage evaluation, the plan's rank peaks) and the
 * executor (runtime/: its predicted peak, its choice to pair instructions).
 * It owns the replay of a program that gives the microbatch slot counts at
 * every point in the executor's allocation order (bg_part_schedule_counts),
 * the bytes a row of counts holds (bg_part_row_bytes, bg_part_counts_dominate),
 * when a gradient message lingers (bg_plan_linger_bytes) and when a layout
 * pairs instructions (bg_plan_paired_for); with activation offload, the
 * stashes off the device between the points schedule/offact.c gives
 * (bg_part_schedule_counts_offact, bg_part_offact_stash_bytes). The names keep the planner's
 * prefixes of the public API (brigade/partitioner.h declares them, with the
 * counts and per-slot sizes they read). It lives below both users because it
 * is a walk of schedule programs and nothing else. Must not: call the
 * planner, create a model, touch a backend or send a byte. */
#include <stdlib.h>
#include <string.h>

#include "brigade/partitioner.h"
#include "brigade/schedule.h"
#include "core/check.h"
#include "core/util.h"
#include "schedule/memory.h"
#include "schedule/offact.h"
#include "schedule/schedule_impl.h"

size_t bg_part_row_bytes(const bg_part_counts_t *n, const bg_part_stage_t *e) { return bg__row_bytes(n, e); }

int bg_part_counts_dominate(const bg_part_counts_t *a, const bg_part_counts_t *b) { return bg__counts_dominate(a, b); }

size_t bg_plan_linger_bytes(void)
{
    /* UCX's own variable wins over brigade's, as in transport/comm.c; a size
     * UCX picks itself ("auto", or anything not a plain size) may be small:
     * every gradient message lingers */
    const char *v = getenv("UCX_RNDV_THRESH");
    if (!v || !*v)
        v = bg_config_str("BRIGADE_UCX_RNDV_THRESH");
    uint64_t n;
    return bg_parse_bytes(v, &n) == 0 ? (size_t)n : 1;
}

int bg_plan_paired_for(int tp, int zero, int dp)
{
    return tp > 1 && !(zero && dp > 1) && strcmp(bg_config_str("BRIGADE_TP_OVERLAP"), "microbatch") == 0;
}

/* ------------------------------------------------------------------------ */
/* Replay of a rank's program: slot counts at every point                   */

typedef struct slot {
    unsigned char begun, fwd, dout, bw, fused, pending;
} slot_t;

/* A fused-backward slot whose gradient's send is issued ends when a test
 * after an instruction finds the send complete. An eager message is
 * complete at once; a rendezvous one (UCX: at least its RNDV_THRESH) only
 * once the receiver has fetched it and the sender has heard so, which is
 * often after the next compute instruction has allocated its buffers: the
 * executor waits for it when that instruction is over (runtime/executor.c
 * reap_pending). The replay counts such a slot as lingering
 * (counts.lingering) from the send until then; the byte model
 * charges it only for stages whose gradient message is rendezvous-sized
 * (bg_part_problem_t.linger_bytes). Measured (docs/partitioner.md): the
 * last stage's peak under GPipe and 1F1B exceeded the prediction by one
 * slot's backward buffer or stash without it, and matches with it. */
typedef struct pend {
    int c, mb;
} pend_t;

typedef struct replay {
    int V, M;
    slot_t *slots;           /* [V][M] */
    bg_part_counts_t *cur;   /* [V] (offloaded: activation offload's stashes off the device) */
    bg_part_counts_t *rows;  /* Pareto rows, [cap][V] */
    int nrows, cap;
    int dirty;               /* a count rose since the last row: only then can a new peak row appear */
} replay_t;

/* Row a needs at least row b's bytes on every chunk. */
static int dominates(const bg_part_counts_t *a, const bg_part_counts_t *b, int V)
{
    for (int c = 0; c < V; c++)
        if (!bg__counts_dominate(&a[c], &b[c]))
            return 0;
    return 1;
}

static bg_status_t record(replay_t *r)
{
    int V = r->V;
    if (!r->dirty)
        return BG_OK; /* only counts that fell since the last row: dominated by it */
    r->dirty = 0;
    for (int i = 0; i < r->nrows; i++)
        if (dominates(&r->rows[(size_t)i * V], r->cur, V))
            return BG_OK;
    int k = 0;
    for (int i = 0; i < r->nrows; i++)
        if (!dominates(r->cur, &r->rows[(size_t)i * V], V)) {
            if (k != i)
                memcpy(&r->rows[(size_t)k * V], &r->rows[(size_t)i * V], (size_t)V * sizeof(bg_part_counts_t));
            k++;
        }
    r->nrows = k;
    if (r->nrows == r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        bg_part_counts_t *n = realloc(r->rows, (size_t)cap * V * sizeof(*n));
        BG_ALLOC_CHECK(n, (size_t)cap * V * sizeof(*n), "schedule count rows");
        r->rows = n;
        r->cap = cap;
    }
    memcpy(&r->rows[(size_t)r->nrows * V], r->cur, (size_t)V * sizeof(bg_part_counts_t));
    r->nrows++;
    return BG_OK;
}

/* Activation offload at the start of compute instruction g (before its own buffers, after a forward's input):
 * the stashes whose out point it is leave the device, then those whose in point it is come back, as
 * runtime/strat_offact.c moves them. */
static void rp_offact(replay_t *r, const bg__offact_slot_t *pts, int g)
{
    for (int in = 0; in < 2; in++)
        for (int c = 0; c < r->V; c++)
            for (int mb = 0; mb < r->M; mb++) {
                const bg__offact_slot_t *p = &pts[(size_t)c * r->M + mb];
                if ((in ? p->in_at : p->out_at) != g)
                    continue;
                r->cur[c].offloaded += in ? -1 : 1;
                r->dirty |= in;
            }
}

static void rp_begin(replay_t *r, int c, int mb)
{
    slot_t *s = &r->slots[(size_t)c * r->M + mb];
    if (!s->begun) {
        s->begun = 1;
        r->cur[c].begun++;
        r->dirty = 1;
    }
}
static void rp_dout(replay_t *r, int c, int mb)
{
    slot_t *s = &r->slots[(size_t)c * r->M + mb];
    if (s->begun && !s->dout) {
        s->dout = 1;
        r->cur[c].dout++;
        r->dirty = 1;
    }
}
static void rp_end(replay_t *r, int c, int mb)
{
    slot_t *s = &r->slots[(size_t)c * r->M + mb];
    if (s->begun)
        r->cur[c].begun--;
    if (s->fwd)
        r->cur[c].forwarded--;
    if (s->dout)
        r->cur[c].dout--;
    if (s->bw) {
        r->cur[c].backward--;
        r->cur[c].recomputing--;
    }
    if (s->fused)
        r->cur[c].fused--;
    memset(s, 0, sizeof(*s));
}

/* The program being replayed: what the start and the end of an instruction
 * do to the counts (replay_t r, with the rank's stages). */
typedef struct prog {
    const bg_schedule_t *sched;
    int rank, S, L, M;
    pend_t *pend; /* fused-backward slots waiting for their gradient send */
    int npend;
} prog_t;

static int prog_local(const prog_t *g, int stage)
{
    return stage >= 0 && stage < g->S && g->sched->stage_rank[stage] == g->rank;
}

/* The buffers instruction o holds while it runs (a compute instruction), or what it does (the rest). */
static void op_start(replay_t *r, prog_t *g, const bg_sched_op_t *o)
{
    int c = o->chunk, mb = o->microbatch, stage = o->stage, L = g->L;
    slot_t *sl = mb >= 0 ? &r->slots[(size_t)c * g->M + mb] : NULL;
    switch (o->kind) {
    case BG_OP_FORWARD:
        rp_begin(r, c, mb);
        sl->fwd = 1;
        r->cur[c].forwarded++;
        r->cur[c].recomputing++; /* while it runs, the forward holds its full activations */
        r->dirty = 1;
        if (stage % L < L - 1 && prog_local(g, stage + 1))
            rp_begin(r, g->sched->stage_chunk[stage + 1], mb); /* prog_local: a stage of this rank */
        break;
    case BG_OP_BACKWARD:
    case BG_OP_BACKWARD_INPUT:
        sl->bw = 1;
        r->cur[c].backward++;
        if (o->kind == BG_OP_BACKWARD) { /* a full backward holds the fused buffer */
            sl->fused = 1;
            r->cur[c].fused++;
        }
        r->cur[c].recomputing++; /* a recomputing stage rebuilds them here, until the slot ends */
        r->dirty = 1;
        if (stage % L > 0 && prog_local(g, stage - 1))
            rp_dout(r, g->sched->stage_chunk[stage - 1], mb); /* prog_local: a stage of this rank */
        break;
    case BG_OP_SEND_GRAD:
        /* a fused-backward slot ends once its gradient has been sent
         * (eager); a rendezvous send lingers until the next compute
         * instruction is over */
        if (sl->pending) {
            rp_end(r, c, mb);
            sl->pending = 2;
            r->cur[c].lingering++;
            r->dirty = 1;
        }
        break;
    case BG_OP_RECV_ACT:
        rp_begin(r, c, mb);
        break;
    case BG_OP_RECV_GRAD:
        rp_dout(r, c, mb);
        break;
    default:
        break;
    }
}

/* The end of compute instruction o: what it frees, or keeps for a send. */
static void op_end(replay_t *r, prog_t *g, const bg_sched_op_t *o)
{
    int c = o->chunk, mb = o->microbatch, stage = o->stage, L = g->L;
    slot_t *sl = &r->slots[(size_t)c * g->M + mb];
    if (o->kind == BG_OP_FORWARD) {
        r->cur[c].recomputing--;
        /* the executor posts the gradient's receive right after the forward (runtime/executor.c
         * do_forward): its buffer is held from here */
        if (stage % L < L - 1 && !prog_local(g, stage + 1))
            rp_dout(r, c, mb);
    } else if (o->kind == BG_OP_BACKWARD) {
        if (stage % L == 0 || prog_local(g, stage - 1))
            rp_end(r, c, mb);
        else {
            sl->pending = 1;
            g->pend[g->npend].c = c;
            g->pend[g->npend].mb = mb;
            g->npend++;
        }
    } else if (o->kind == BG_OP_BACKWARD_WEIGHT) {
        rp_end(r, c, mb);
    }
}

/* After instruction o (@p paired: after a pair, whose sends are all waited for): a compute instruction
 * is over, so the slots sent before it are gone; those sent at this one go after the next. */
static void op_after(replay_t *r, prog_t *g, const bg_sched_op_t *o, int paired)
{
    if (o->kind <= BG_OP_BACKWARD_WEIGHT) {
        int w = 0;
        for (int q = 0; q < g->npend; q++) {
            slot_t *ps = &r->slots[(size_t)g->pend[q].c * g->M + g->pend[q].mb];
            if (ps->pending == 3 || (paired && ps->pending == 2)) {
                r->cur[g->pend[q].c].lingering--;
                ps->pending = 0;
            } else
                g->pend[w++] = g->pend[q];
        }
        g->npend = w;
    }
    for (int q = 0; q < g->npend; q++) { /* sent at this instruction: over after the next compute one */
        slot_t *ps = &r->slots[(size_t)g->pend[q].c * g->M + g->pend[q].mb];
        if (ps->pending == 2)
            ps->pending = 3;
    }
}

/* The receives the executor posts ahead at instruction i: up to the second compute instruction. */
static void post_ahead(replay_t *r, const bg_sched_op_t *ops, size_t n, size_t i)
{
    int computes = 0;
    for (size_t j = i; j < n && computes < 2; j++) {
        const bg_sched_op_t *o = &ops[j];
        if (o->kind == BG_OP_RECV_ACT)
            rp_begin(r, o->chunk, o->microbatch);
        else if (o->kind == BG_OP_RECV_GRAD)
            rp_dout(r, o->chunk, o->microbatch);
        else if (o->kind <= BG_OP_BACKWARD_WEIGHT)
            computes++;
    }
}

/* The replay of rank's program (bg_part_schedule_counts); pts: activation offload's points of the rank
 * (bg__offact_points; NULL: none), counted in each row's offloaded. */
static bg_status_t replay(const bg_schedule_t *sched, int rank, int paired, const bg__offact_slot_t *pts,
                          bg_part_counts_t **rows_p, int *npoints_p)
{
    int P = bg_schedule_ranks(sched), V = bg_schedule_chunks(sched), M = bg_schedule_microbatches(sched);
    int S = bg_schedule_stages(sched);
    if (rank < 0 || rank >= P)
        return bg_error(BG_ERR_INVALID, "rank %d out of range [0, %d)", rank, P);
    replay_t r = {V, M, NULL, NULL, NULL, 0, 0, 0};
    /* a chain of stages per model copy (dualpipe: 2) */
    prog_t g = {sched, rank, S, S / bg_schedule_copies(sched), M, NULL, 0};
    r.slots = calloc((size_t)V * M, sizeof(slot_t));
    r.cur = calloc((size_t)V, sizeof(bg_part_counts_t));
    g.pend = malloc((size_t)V * M * sizeof(*g.pend) + 1);
    bg_status_t st = BG_OK;
    if (!r.slots || !r.cur || !g.pend) {
        st = bg_error(BG_ERR_NOMEM, "schedule replay");
        goto out;
    }
    size_t n;
    int computes = 0;
    const bg_sched_op_t *ops = bg_schedule_rank_ops(sched, rank, &n);
    for (size_t i = 0; i < n; i++) {
        post_ahead(&r, ops, n, i);
        size_t j = paired ? bg_sched_pair_partner(ops, n, i) : 0;
        if (j) {
            /* runtime/exec_ops.c bg__exec_run_pair: i starts; at its first wait for the tensor group j
             * starts (a weight gradient has none: j starts first and i beside it); i ends (a forward's
             * output gradient buffer is posted then), its sends leave, and j ends (a forward j posts its
             * buffer only after i's end: exec_ops.c pair_hold) */
            post_ahead(&r, ops, n, j);
            BG_CHECK_GOTO(record(&r), st, out);
            op_start(&r, &g, &ops[i]);
            op_start(&r, &g, &ops[j]);
            BG_CHECK_GOTO(record(&r), st, out);
            op_end(&r, &g, &ops[i]);
            for (size_t k = i + 1; k < j; k++)
                op_start(&r, &g, &ops[k]);
            BG_CHECK_GOTO(record(&r), st, out);
            op_end(&r, &g, &ops[j]);
            op_after(&r, &g, &ops[j], 1);
            BG_CHECK_GOTO(record(&r), st, out);
            i = j;
            continue;
        }
        BG_CHECK_GOTO(record(&r), st, out);
        if (pts && ops[i].kind <= BG_OP_BACKWARD_WEIGHT) {
            /* the executor begins a forward's slot (its input), then the strategy moves stashes, then the
             * instruction allocates */
            if (ops[i].kind == BG_OP_FORWARD)
                rp_begin(&r, ops[i].chunk, ops[i].microbatch);
            BG_CHECK_GOTO(record(&r), st, out);
            rp_offact(&r, pts, computes++);
            BG_CHECK_GOTO(record(&r), st, out);
        }
        op_start(&r, &g, &ops[i]);
        if (ops[i].kind <= BG_OP_BACKWARD_WEIGHT) {
            BG_CHECK_GOTO(record(&r), st, out);
            op_end(&r, &g, &ops[i]);
        }
        op_after(&r, &g, &ops[i], 0);
        BG_CHECK_GOTO(record(&r), st, out);
    }
    *rows_p = r.rows;
    *npoints_p = r.nrows;
    r.rows = NULL;
out:
    free(g.pend);
    free(r.rows);
    free(r.slots);
    free(r.cur);
    return st;
}

bg_status_t bg_part_schedule_counts(const bg_schedule_t *sched, int rank, int paired, bg_part_counts_t **rows_p,
                                    int *npoints_p)
{
    return replay(sched, rank, paired, NULL, rows_p, npoints_p);
}

bg_status_t bg_part_schedule_counts_offact(const bg_schedule_t *sched, int rank, int ahead,
                                           bg_part_counts_t **rows_p, int *npoints_p)
{
    if (rank < 0 || rank >= bg_schedule_ranks(sched)) /* replay's words, before the points' walk */
        return bg_error(BG_ERR_INVALID, "rank %d out of range [0, %d)", rank, bg_schedule_ranks(sched));
    bg__offact_slot_t *pts = NULL;
    BG_CHECK(bg__offact_points(sched, rank, ahead, &pts));
    bg_status_t st = replay(sched, rank, 0, pts, rows_p, npoints_p);
    free(pts);
    return st;
}

bg_status_t bg__part_schedule_counts_at(const bg_schedule_t *sched, int rank, const bg__offact_slot_t *pts,
                                        bg_part_counts_t **rows_p, int *npoints_p)
{
    return replay(sched, rank, 0, pts, rows_p, npoints_p); /* it checks the rank */
}

bg_status_t bg_part_offact_stash_bytes(const bg_schedule_t *sched, int rank, int chunk, int ahead,
                                       size_t stash_bytes, size_t *bytes_p)
{
    int V = bg_schedule_chunks(sched);
    if (chunk < 0 || chunk >= V)
        return bg_error(BG_ERR_INVALID, "chunk %d out of range [0, %d)", chunk, V);
    bg_part_counts_t *rows = NULL;
    int n = 0, most = 0;
    BG_CHECK(bg_part_schedule_counts_offact(sched, rank, ahead, &rows, &n));
    for (int k = 0; k < n; k++) {
        const bg_part_counts_t *r = &rows[(size_t)k * V + chunk];
        most = r->forwarded - r->offloaded > most ? r->forwarded - r->offloaded : most;
    }
    free(rows);
    *bytes_p = (size_t)most * stash_bytes;
    return BG_OK;
}
