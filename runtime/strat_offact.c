/* runtime/strat_offact.c: --offload activations (docs/offload.md). A
 * forwarded microbatch's stash (its layers' outputs and stashes,
 * bg_stage_stash_bytes) leaves the backend for the offload store (host
 * memory, or files under --offload-dir: runtime/offload.c) while the
 * schedule waits for its backward, and comes back ahead of it.
 *
 * Where: the points schedule/offact.c gives for this rank's program, which
 * the executor's prediction counts too (the act_counts hook,
 * bg_part_schedule_counts_offact), so the predicted peak is the measured
 * one. Out at the first compute instruction after the slot's forward and
 * its SEND_ACT, after waiting there for that send (the output is part of
 * the stash; it has normally completed, and the points were chosen so that
 * the wait cannot close a cycle); in k compute instructions before the
 * slot's first backward piece (B or the fused backward; k =
 * BRIGADE_OFFLOAD_ACT_AHEAD). A zero-bubble W reads the stash its B brought
 * back. Not on the last stage, whose backward follows its forward at once.
 * The bytes are the same, so the weights are those of no offload bit for
 * bit. Each slot that moves has its host buffer from the start (sized for
 * the longest sequence), so a full --offload-dir fails before the first
 * step, naming it.
 *
 * It must not touch the interpreter's slots or the reductions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "runtime/exec_impl.h"
#include "runtime/offload.h"
#include "schedule/memory.h"
#include "schedule/offact.h"

enum { ACT_NONE, ACT_ON, ACT_OUT }; /* a slot's stash this step: not forwarded (or back), on the device, out */

typedef struct {
    void *buf;  /* host copy of the stash (from the store) */
    size_t cap; /* its bytes */
    int state;  /* ACT_* */
} act_slot_t;

typedef struct {
    act_slot_t *slots;         /* V x M */
    bg__offact_slot_t *pts;    /* V x M: where each moves (schedule/offact.h) */
    const bg_sched_op_t **cop; /* this rank's compute instructions, in order */
    long ncomp;
    int ahead;                 /* BRIGADE_OFFLOAD_ACT_AHEAD */
    long at;                   /* compute instructions begun this step */
    bg__offload_t *store;
    bg_optim_store_t mem;      /* the store's alloc / release */
    size_t moved_out, moved_in, host; /* stashes moved and host bytes held, for the log */
} offact_t;

static int offact_active(const exec_t *x) { return (x->p.offload & BG_OFFLOAD_ACTIVATIONS) != 0; }

static bg_status_t offact_setup(exec_t *x, void **self_p)
{
    int k;
    BG_CHECK(bg__offact_ahead(&k));
    offact_t *o = calloc(1, sizeof(*o));
    BG_ALLOC_CHECK(o, sizeof(*o), "activation offload");
    o->ahead = k;
    bg_status_t st = bg__offload_create(x->p.offload_dir, &o->store);
    if (st != BG_OK) {
        free(o);
        return st;
    }
    o->mem = bg__offload_optim_store(o->store, 0);
    *self_p = o;
    return BG_OK;
}

/* The bytes chunk ch's stash has at the longest sequence (the largest a slot's can be). */
static bg_status_t stash_cap(exec_t *x, chunk_t *ch, size_t *bytes_p)
{
    bg_shape_t in;
    bg_stage_mem_t mem;
    BG_CHECK(bg__exec_shape_at(x, ch, x->Tmax, &in));
    BG_CHECK(bg_stage_memory(ch->st, in, &mem));
    size_t inb = in.c ? bg_shape_numel(in) * bg_dtype_size(bg_stage_input_dtype(ch->st)) : 0;
    *bytes_p = mem.stash - inb; /* bg_stage_memory's stash holds the input, which stays */
    return BG_OK;
}

/* The program's points, its compute instructions, and a host buffer for every slot that moves. */
static bg_status_t offact_ready(exec_t *x, void *self)
{
    offact_t *o = self;
    size_t n = (size_t)x->V * (size_t)x->M, nops = 0;
    o->slots = calloc(n ? n : 1, sizeof(*o->slots));
    BG_ALLOC_CHECK(o->slots, n * sizeof(*o->slots), "activation offload slots");
    BG_CHECK(bg__offact_points(x->sched, x->lay.me.pp, o->ahead, &o->pts));
    const bg_sched_op_t *ops = bg_schedule_rank_ops(x->sched, x->lay.me.pp, &nops);
    o->cop = malloc((nops ? nops : 1) * sizeof(*o->cop));
    BG_ALLOC_CHECK(o->cop, nops * sizeof(*o->cop), "activation offload program");
    for (size_t i = 0; i < nops; i++)
        if (ops[i].kind <= BG_OP_BACKWARD_WEIGHT) {
            if (ops[i].chunk < 0 || ops[i].chunk >= x->V || x->chunks[ops[i].chunk].stage != ops[i].stage)
                return bg_error(BG_ERR_INTERNAL, "rank %d: activation offload: the program's chunk %d of stage %d "
                                "is not this rank's", x->lay.rank, ops[i].chunk, ops[i].stage);
            o->cop[o->ncomp++] = &ops[i];
        }
    for (int v = 0; v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        size_t bytes = 0;
        if (!ch->st || bg_stage_recompute(ch->st)) /* recomputation keeps no stash: nothing moves */
            continue;
        BG_CHECK(stash_cap(x, ch, &bytes));
        for (int m = 0; m < x->M && bytes; m++) {
            act_slot_t *a = &o->slots[(size_t)v * x->M + m];
            if (o->pts[(size_t)v * x->M + m].out_at < 0)
                continue;
            char what[96];
            snprintf(what, sizeof what, "offloaded activations (stage %d, microbatch %d)", ch->stage, m);
            BG_CHECK(o->mem.alloc(o->mem.arg, bytes, what, &a->buf));
            a->cap = bytes;
            o->host += bytes;
        }
    }
    return BG_OK;
}

static bg_status_t offact_step_begin(exec_t *x, void *self)
{
    offact_t *o = self;
    o->at = 0;
    for (size_t i = 0; i < (size_t)x->V * (size_t)x->M; i++)
        o->slots[i].state = ACT_NONE;
    return BG_OK;
}

/* Slot mb of chunk ch out: once its output's send has completed (the output is part of the stash). */
static bg_status_t stash_out(exec_t *x, offact_t *o, chunk_t *ch, int mb, act_slot_t *a)
{
    if (!ch->next_local && ch->act_send[mb])
        BG_CHECK(bg__xwait(ch->act_send[mb])); /* normally done; the executor frees it at the slot's end */
    size_t bytes = bg_stage_stash_bytes(ch->st, mb);
    if (bytes > a->cap)
        return bg_error(BG_ERR_INTERNAL, "rank %d: stage %d microbatch %d: a stash of %zu bytes for a host buffer "
                        "of %zu (sized at the longest sequence)", x->lay.rank, ch->stage, mb, bytes, a->cap);
    BG_CHECK(bg_stage_stash_out(ch->st, mb, a->buf));
    a->state = ACT_OUT;
    o->moved_out++;
    return BG_OK;
}

static bg_status_t stash_in(offact_t *o, chunk_t *ch, int mb, act_slot_t *a)
{
    BG_CHECK(bg_stage_stash_in(ch->st, mb, a->buf));
    a->state = ACT_NONE;
    o->moved_in++;
    return BG_OK;
}

/* Before compute instruction number o->at (of chunk ch, microbatch mb): the stashes whose out point it is go
 * out, then those whose in point it is come back (schedule/offact.h), as the replay counts them. */
static bg_status_t offact_before_compute(exec_t *x, void *self, chunk_t *ch, int mb, bg_sched_op_kind_t kind)
{
    offact_t *o = self;
    if (x->forward_only || !o->slots || !ch->st)
        return BG_OK;
    long now = o->at++;
    const bg_sched_op_t *op = now < o->ncomp ? o->cop[now] : NULL;
    if (!op || op->stage != ch->stage || op->microbatch != mb || op->kind != (int)kind)
        return bg_error(BG_ERR_INTERNAL, "rank %d: activation offload: compute instruction %ld is not the "
                        "program's (stage %d, microbatch %d)", x->lay.rank, now, ch->stage, mb);
    for (int in = 0; in < 2; in++)
        for (int v = 0; v < x->V; v++)
            for (int m = 0; m < x->M; m++) {
                size_t k = (size_t)v * (size_t)x->M + (size_t)m;
                act_slot_t *a = &o->slots[k];
                if (!in && o->pts[k].out_at == now && a->state == ACT_ON)
                    BG_CHECK(stash_out(x, o, &x->chunks[v], m, a));
                else if (in && o->pts[k].in_at == now && a->state == ACT_OUT)
                    BG_CHECK(stash_in(o, &x->chunks[v], m, a));
            }
    act_slot_t *a = &o->slots[(size_t)(ch - x->chunks) * (size_t)x->M + (size_t)mb];
    if (kind == BG_OP_FORWARD)
        a->state = a->buf ? ACT_ON : ACT_NONE;
    else if (a->state == ACT_OUT) /* cannot happen: its in point is at the latest here */
        return bg_error(BG_ERR_INTERNAL, "rank %d: stage %d microbatch %d: a backward piece while its stash is "
                        "offloaded", x->lay.rank, ch->stage, mb);
    return BG_OK;
}

/* The replay's counts with the stashes off the device between the points this strategy follows (the
 * executor's prediction; ready computed them). */
static bg_status_t offact_act_counts(exec_t *x, void *self, bg_part_counts_t **rows_p, int *nrows_p)
{
    offact_t *o = self;
    return bg__part_schedule_counts_at(x->sched, x->lay.me.pp, o->pts, rows_p, nrows_p);
}

static void offact_destroy(exec_t *x, void *self)
{
    offact_t *o = self;
    if (!o)
        return;
    bg_log(BG_LOG_INFO, "offload", "rank %d: activations: %zu stashes offloaded, %zu brought back, %zu bytes of host buffers",
           x->lay.rank, o->moved_out, o->moved_in, o->host);
    for (size_t i = 0; o->slots && i < (size_t)x->V * (size_t)x->M; i++)
        if (o->slots[i].buf)
            o->mem.release(o->mem.arg, o->slots[i].buf);
    bg__offload_destroy(o->store);
    free(o->slots);
    free(o->pts);
    free(o->cop);
    free(o);
}

const bg__strategy_ops_t bg__strategy_offact = {
    .name = "offload activations",
    .active = offact_active,
    .setup = offact_setup,
    .ready = offact_ready,
    .step_begin = offact_step_begin,
    .before_compute = offact_before_compute,
    .act_counts = offact_act_counts,
    .destroy = offact_destroy,
};
