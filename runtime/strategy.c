/* runtime/strategy.c: the registry of the executor's strategies and their
 * selection. A strategy is one file (runtime/strat_*.c) exporting a
 * bg__strategy_ops_t; adding one means adding its file and a line here.
 * The order is the order EVERY hooks run in and ONE hooks are looked for:
 * the gradient's owners (ps, zero, ep, dp: ep's buckets before dp's, the others alone) first, then
 * what happens around them (copies before ties: the copies' sum comes
 * first), then emulation (the context ring's emulated steps before the compute's). It must not know what any strategy does. */
#include <stddef.h>
#include <string.h>

#include "core/check.h"
#include "runtime/exec_impl.h"

extern const bg__strategy_ops_t bg__strategy_ps_server, bg__strategy_ps_worker, bg__strategy_zero, bg__strategy_ep,
    bg__strategy_dp, bg__strategy_copies, bg__strategy_ties, bg__strategy_emulate, bg__strategy_offload,
    bg__strategy_offact, bg__strategy_cp_emulate;

const bg__strategy_ops_t *const bg__strategies[] = {
    &bg__strategy_ps_server, &bg__strategy_ps_worker,   &bg__strategy_zero,    &bg__strategy_ep,
    &bg__strategy_dp,        &bg__strategy_copies,      &bg__strategy_ties,    &bg__strategy_cp_emulate,
    &bg__strategy_emulate,   &bg__strategy_offload,     &bg__strategy_offact,
    NULL,
};

bg_status_t bg__strategies_select(exec_t *x)
{
    x->nstrat = 0;
    for (int i = 0; bg__strategies[i]; i++) {
        if (!bg__strategies[i]->active(x))
            continue;
        if (x->nstrat == (int)(sizeof(x->strat) / sizeof(x->strat[0])))
            return bg_error(BG_ERR_INTERNAL, "more than %d active strategies", x->nstrat);
        bg__strategy_t *s = &x->strat[x->nstrat++];
        s->ops = bg__strategies[i];
        s->self = NULL;
        if (s->ops->setup)
            BG_CHECK(s->ops->setup(x, &s->self));
    }
    return BG_OK;
}

bg__strategy_t *bg__strategy_find(exec_t *x, size_t slot_offset)
{
    BG__EACH_STRATEGY(x, s) {
        void (*slot)(void); /* every slot is a function pointer: copied, not read through another type */
        memcpy(&slot, (const char *)s->ops + slot_offset, sizeof slot);
        if (slot)
            return s;
    }
    return NULL;
}
