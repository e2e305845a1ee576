/* runtime/strat_offact.c: --offload activations (docs/offload.md). A
 * forwarded microbatch's stash (its layers' outputs and stashes,
 * bg_stage_stash_bytes) leaves the backend for host memory while the
 * schedule waits for its backward, and comes back ahead of it.
 *
 * Out: at a compute instruction's before_compute, every slot of this rank
 * forwarded earlier whose output nothing reads any more (its SEND_ACT
 * complete, or the next stage ours, which copied it at the forward) and
 * whose first backward piece is more than k compute instructions ahead
 * (k = BRIGADE_OFFLOAD_ACT_AHEAD) is copied out (bg_stage_stash_out). Not on
 * the last stage, whose backward follows its forward at once.
 * In: k compute instructions before the slot's first backward piece (B or
 * the fused backward), and at the latest in that piece's own before_compute
 * (bg_stage_stash_in). A zero-bubble W reads the stash its B brought back.
 * The bytes are the same, so the weights are those of no offload bit for bit.
 *
 * It must not touch the interpreter's slots or the reductions. */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "runtime/exec_impl.h"

enum { ACT_NONE, ACT_ON, ACT_OUT, ACT_DONE }; /* a slot's stash this step */

typedef struct {
    void *buf;     /* host copy of the stash */
    size_t cap;    /* its bytes */
    int state;     /* ACT_* */
    long first_bw; /* index among this rank's compute instructions of its first backward piece (-1: none) */
} act_slot_t;

typedef struct {
    act_slot_t *slots; /* V x M */
    long ahead;        /* BRIGADE_OFFLOAD_ACT_AHEAD */
    long at;           /* compute instructions begun this step */
    int mapped;        /* first_bw filled from the program */
    size_t moved_out, moved_in, host; /* stashes moved and host bytes held, for the log */
} offact_t;

static int offact_active(const exec_t *x) { return (x->p.offload & BG_OFFLOAD_ACTIVATIONS) != 0; }

static bg_status_t offact_setup(exec_t *x, void **self_p)
{
    long long k = 1;
    if (bg_config_int("BRIGADE_OFFLOAD_ACT_AHEAD", &k) != BG_OK || k < 0 || k > 1000)
        return bg_error(BG_ERR_INVALID, "BRIGADE_OFFLOAD_ACT_AHEAD=%s: expected 0 to 1000 (compute instructions "
                        "ahead of a microbatch's backward its stash comes back)",
                        bg_config_str("BRIGADE_OFFLOAD_ACT_AHEAD") ? bg_config_str("BRIGADE_OFFLOAD_ACT_AHEAD") : "");
    offact_t *o = calloc(1, sizeof(*o));
    BG_ALLOC_CHECK(o, sizeof(*o), "activation offload");
    o->ahead = (long)k;
    *self_p = o;
    return BG_OK;
}

static bg_status_t offact_ready(exec_t *x, void *self)
{
    offact_t *o = self;
    size_t n = (size_t)x->V * (size_t)x->M;
    o->slots = calloc(n ? n : 1, sizeof(*o->slots));
    BG_ALLOC_CHECK(o->slots, n * sizeof(*o->slots), "activation offload slots");
    return BG_OK;
}

static int chunk_index(const exec_t *x, int stage)
{
    for (int v = 0; v < x->V; v++)
        if (x->chunks[v].stage == stage)
            return v;
    return -1;
}

/* Each slot's first backward piece among this rank's compute instructions (the program is fixed). */
static void map_program(exec_t *x, offact_t *o)
{
    for (size_t i = 0; i < (size_t)x->V * (size_t)x->M; i++)
        o->slots[i].first_bw = -1;
    long c = 0;
    for (size_t i = 0; i < x->nops; i++) {
        const bg_sched_op_t *op = &x->ops[i];
        if (op->kind > BG_OP_BACKWARD_WEIGHT)
            continue;
        int v = chunk_index(x, op->stage);
        if (v >= 0 && op->microbatch >= 0 && op->microbatch < x->M &&
            (op->kind == BG_OP_BACKWARD || op->kind == BG_OP_BACKWARD_INPUT)) {
            act_slot_t *a = &o->slots[(size_t)v * (size_t)x->M + (size_t)op->microbatch];
            if (a->first_bw < 0)
                a->first_bw = c;
        }
        c++;
    }
    o->mapped = 1;
}

static bg_status_t offact_step_begin(exec_t *x, void *self)
{
    offact_t *o = self;
    if (!o->mapped)
        map_program(x, o);
    o->at = 0;
    for (size_t i = 0; i < (size_t)x->V * (size_t)x->M; i++)
        o->slots[i].state = ACT_NONE;
    return BG_OK;
}

/* Is slot mb of ch's output read by nothing any more (its send complete, or handed over at the forward)? */
static bg_status_t output_free(chunk_t *ch, int mb, int *free_p)
{
    *free_p = 0;
    if (ch->next_local)
        *free_p = 1;
    else if (ch->act_send[mb])
        BG_CHECK(bg__xtest(ch->act_send[mb], free_p));
    return BG_OK;
}

static bg_status_t stash_out(offact_t *o, chunk_t *ch, int mb, act_slot_t *a)
{
    size_t bytes = bg_stage_stash_bytes(ch->st, mb);
    if (!bytes) { /* recomputation: nothing kept */
        a->state = ACT_DONE;
        return BG_OK;
    }
    if (bytes > a->cap) {
        void *p = realloc(a->buf, bytes);
        BG_ALLOC_CHECK(p, bytes, "offloaded activations (host)");
        o->host += bytes - a->cap;
        a->buf = p;
        a->cap = bytes;
    }
    BG_CHECK(bg_stage_stash_out(ch->st, mb, a->buf));
    a->state = ACT_OUT;
    o->moved_out++;
    return BG_OK;
}

static bg_status_t stash_in(offact_t *o, chunk_t *ch, int mb, act_slot_t *a)
{
    BG_CHECK(bg_stage_stash_in(ch->st, mb, a->buf));
    a->state = ACT_DONE;
    o->moved_in++;
    return BG_OK;
}

/* Before compute instruction number o->at (of chunk ch, microbatch mb): stashes out and in as the header says. */
static bg_status_t offact_before_compute(exec_t *x, void *self, chunk_t *ch, int mb, bg_sched_op_kind_t kind)
{
    offact_t *o = self;
    if (x->forward_only || !o->slots || !ch->st)
        return BG_OK;
    long now = o->at++;
    int me = (int)(ch - x->chunks);
    for (int v = 0; v < x->V; v++) {
        chunk_t *c = &x->chunks[v];
        for (int m = 0; c->st && m < x->M; m++) {
            act_slot_t *a = &o->slots[(size_t)v * (size_t)x->M + (size_t)m];
            if (v == me && m == mb)
                continue; /* this instruction's own slot: below */
            if (a->state == ACT_ON && a->first_bw > now + o->ahead) {
                int done = 0;
                BG_CHECK(output_free(c, m, &done));
                if (done)
                    BG_CHECK(stash_out(o, c, m, a));
            } else if (a->state == ACT_OUT && a->first_bw >= 0 && a->first_bw <= now + o->ahead)
                BG_CHECK(stash_in(o, c, m, a));
        }
    }
    act_slot_t *a = &o->slots[(size_t)me * (size_t)x->M + (size_t)mb];
    if (kind == BG_OP_FORWARD)
        a->state = ch->is_last ? ACT_DONE : ACT_ON; /* the last stage's backward follows at once */
    else if (a->state == ACT_OUT) /* at the latest: this backward piece reads it */
        BG_CHECK(stash_in(o, ch, mb, a));
    else if (kind != BG_OP_BACKWARD_WEIGHT)
        a->state = ACT_DONE;
    return BG_OK;
}

static void offact_destroy(exec_t *x, void *self)
{
    offact_t *o = self;
    if (!o)
        return;
    bg_log(BG_LOG_INFO, "offload", "rank %d: activations: %zu stashes offloaded, %zu brought back, %zu bytes of host buffers",
           x->lay.rank, o->moved_out, o->moved_in, o->host);
    for (size_t i = 0; o->slots && i < (size_t)x->V * (size_t)x->M; i++)
        free(o->slots[i].buf);
    free(o->slots);
    free(o);
}

const bg__strategy_ops_t bg__strategy_offact = {
    .name = "offload activations",
    .active = offact_active,
    .setup = offact_setup,
    .ready = offact_ready,
    .step_begin = offact_step_begin,
    .before_compute = offact_before_compute,
    .destroy = offact_destroy,
};
