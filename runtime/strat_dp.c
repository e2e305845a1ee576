/* runtime/strat_dp.c: the data-parallel strategy (dp > 1, no ZeRO, no
 * parameter servers): each bucket of a chunk's gradients is all-reduced
 * (a sum) over the stage's data-parallel group as soon as it is ready,
 * without blocking; the optimizer step is the core's, bucket by bucket as
 * the reductions complete (bg__exec_optimizer_step). The loss scale is
 * 1 / (positions of the global batch) on every replica, so the sum is the
 * mean gradient. It must not touch the interpreter's slots. */
#include "core/check.h"
#include "runtime/exec_impl.h"

static int dp_active(const exec_t *x) { return x->lay.dp > 1 && x->lay.servers == 0 && x->p.zero == 0; }

static bg_status_t dp_reduce(exec_t *x, void *self, chunk_t *ch, int b)
{
    (void)self;
    bg__bucket_t *bk = &ch->buckets[b];
    BG_CHECK(bg__dcoll_start(x->dp_coll, BG__COLL_ALLREDUCE, NULL, bg_model_grads(ch->model) + bk->off, bk->count,
                             BG_REDUCE_SUM, &bk->req));
    bg__exec_trace_bucket(x, ch, b);
    return BG_OK;
}

const bg__strategy_ops_t bg__strategy_dp = {
    .name = "dp",
    .active = dp_active,
    .reduce = dp_reduce,
};
