/* runtime/exec_eval.c: evaluation (bg_executor_eval): the loss of the
 * current weights on one global batch, with the forward-only program of the
 * executor's schedule (bg_schedule_forward_only), run through the
 * interpreter's forward-only table (runtime/exec_ops.c) and reduced over the
 * job as a step's loss is. It must not touch gradients, optimizer state,
 * the step count or anything a step reads afterwards: it borrows the batch
 * source, the step index and the program for the call and puts them back. */
#include <stdio.h>

#include "core/check.h"
#include "runtime/exec_impl.h"

/* This rank's forward-only program: receives posted ahead; a send is never
 * waited for before the program's end (a rendezvous send completes only
 * when its receiver reaches the receive, which may lie behind this rank's
 * later sends), its slot ends when a test finds it done. */
static bg_status_t run_forward_only(exec_t *x)
{
    for (size_t i = 0; i < x->nops; i++) {
        const bg_sched_op_t *op = &x->ops[i];
        bg__staging_progress(&x->stg);
        BG_CHECK(bg__exec_post_ahead(x, i));
        bg_status_t st = bg__exec_run_op(x, op);
        if (st != BG_OK)
            return bg__exec_op_failed(x, st, op, op);
        BG_CHECK(bg__exec_reap_pending(x, 0));
    }
    return bg__exec_reap_pending(x, 1);
}

/* The program's loss over the job: one fp64 allreduce of the fp32-rounded
 * shares, as the step's end sums them (runtime/executor.c). */
static bg_status_t eval_program(exec_t *x, double tokens, double *loss_p)
{
    x->loss_scale = (float)(1.0 / tokens);
    x->loss = 0;
    x->loss_k = 0;
    /* no settle: each forward's before_compute hooks wait for ZeRO's gathers of the last step, and --zero 3
     * gathers each layer before it computes, as in training (the parameters are not held whole) */
    BG_CHECK(run_forward_only(x));
    BG_CHECK(bg__exec_sum_losses(x));
    double red = (double)(float)x->loss;
    if (x->lay.world > 1)
        BG_CHECK(bg_group_allreduce(x->world_group, &red, 1, BG_F64, BG_REDUCE_SUM));
    *loss_p = (float)red;
    return BG_OK;
}

bg_status_t bg_executor_eval(bg_executor_t *x, const bg_batch_source_t *data, int64_t index,
                             bg_eval_result_t *result_p)
{
    if (!x || !result_p)
        return bg_error(BG_ERR_INVALID, "bg_executor_eval: NULL argument");
    if (x->broken)
        return bg_error(BG_ERR_INVALID, "executor: an earlier step failed; destroy it and resume from a checkpoint");
    if (index < 0)
        return bg_error(BG_ERR_INVALID, "bg_executor_eval: batch index %lld must be >= 0", (long long)index);
    if (data && !data->batch)
        return bg_error(BG_ERR_INVALID, "bg_executor_eval: the batch source has no batch callback");
    if (x->lay.servers > 0 || x->em)
        return bg_error(BG_ERR_UNSUPPORTED, "evaluation with %s is not built (the forward-only program runs on "
                        "every other layout)", x->em ? "--emulate (its stages compute no loss)"
                                                     : "--ps (the workers pull the parameters inside their step)");
    if (!x->eval_sched) {
        BG_CHECK(bg_schedule_forward_only(x->sched, &x->eval_sched));
        bg_status_t vst = bg_schedule_validate(x->eval_sched);
        if (vst != BG_OK) {
            bg_schedule_free(x->eval_sched);
            x->eval_sched = NULL;
            return vst;
        }
    }
    /* borrowed for the call: the source, the step index (what the source is asked for), the program */
    bg_batch_source_t train = x->p.data;
    int64_t step = x->step;
    const bg_sched_op_t *ops = x->ops;
    size_t nops = x->nops;
    if (data)
        x->p.data = *data;
    x->step = index;
    x->fetched_step = -1; /* the buffers hold a training batch */
    x->ops = bg_schedule_rank_ops(x->eval_sched, x->lay.me.pp, &x->nops);
    if (!x->ops)
        x->nops = 0;
    x->forward_only = 1;
    for (int v = 0; v < x->V; v++)
        if (x->chunks[v].st)
            bg_stage_set_forward_only(x->chunks[v].st, 1);
    double t0 = bg_now(), tokens = 0, loss = 0;
    bg_status_t st = bg__exec_step_tokens(x, index, &tokens); /* the same answer on every rank: nothing to stop */
    int ran = st == BG_OK;
    if (ran)
        st = eval_program(x, tokens, &loss);
    x->p.data = train;
    x->step = step;
    x->fetched_step = -1;
    x->ops = ops;
    x->nops = nops;
    x->forward_only = 0;
    for (int v = 0; v < x->V; v++)
        if (x->chunks[v].st)
            bg_stage_set_forward_only(x->chunks[v].st, 0);
    if (st != BG_OK)
        return ran ? bg__exec_step_failed(x, st) : st;
    bg_eval_result_t r = {.loss = loss, .tokens = tokens, .eval_ms = (bg_now() - t0) * 1e3};
    *result_p = r;
    return BG_OK;
}
