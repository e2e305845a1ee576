/* runtime/strat_emulate.c: emulated compute (--emulate PROFILE): each
 * compute instruction sleeps its stage's profiled time instead of
 * computing (its ready hook sets the stages to compute nothing; the last
 * stage adds no loss and the optimizer steps update nothing: they read
 * x->em, which bg_executor_create loads with the schedule), and a
 * receive waits by sleeping rather than spinning, so many ranks emulate a
 * large job on a few cores. The times are runtime/emulate.c's; this file
 * must not touch the interpreter's slots. */
#include "runtime/exec_impl.h"

static int emulate_active(const exec_t *x) { return x->em != NULL; }

/* Every stage allocates its buffers and runs no layer. */
static bg_status_t emulate_ready(exec_t *x, void *self)
{
    (void)self;
    for (int v = 0; v < x->V; v++)
        if (x->chunks[v].st)
            bg_stage_set_emulate(x->chunks[v].st, 1);
    return BG_OK;
}

static void emulate_after_compute(exec_t *x, void *self, chunk_t *ch, bg_sched_op_kind_t kind)
{
    (void)self;
    bg__emulate_t *em = x->em;
    int s = ch->stage;
    double t = kind == BG_OP_FORWARD          ? em->f[s]
               : kind == BG_OP_BACKWARD       ? em->b[s] + em->w[s]
               : kind == BG_OP_BACKWARD_INPUT ? em->b[s]
                                              : em->w[s];
    bg__emulate_wait(em, t);
}

static void emulate_before_wait(exec_t *x, void *self, bg__xfer_t *rq)
{
    (void)x, (void)self;
    bg__emulate_idle(rq);
}

const bg__strategy_ops_t bg__strategy_emulate = {
    .name = "emulate",
    .active = emulate_active,
    .ready = emulate_ready,
    .after_compute = emulate_after_compute,
    .before_wait = emulate_before_wait,
};
