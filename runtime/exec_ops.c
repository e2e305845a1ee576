/* runtime/exec_ops.c: the executor's interpreter: one handler per
 * instruction kind of the schedule IR, in one table (exec_ops[]), and what
 * the handlers share: the microbatch slots, the point-to-point transfers
 * between stages (receives posted ahead, sends never blocking), the batch
 * source, and the paired instructions of BRIGADE_TP_OVERLAP=microbatch.
 *
 * A forward-only program (evaluation, runtime/exec_eval.c) runs through a
 * table of its own: forwards that keep no stash, activation transfers.
 *
 * Each compute handler calls the strategies' before_compute and
 * after_compute hooks around its compute, each receive their before_wait
 * hook; the optimizer instruction hands the update to the strategies. It
 * must not branch on which strategies are active (runtime/exec_impl.h).
 *
 * Tags: bit 31 step parity, bit 30 direction (0 act, 1 grad), bits 16..29
 * the receiving stage, bits 0..15 the microbatch (runtime/exec_impl.h names
 * the stage values the strategies' exchanges use). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "runtime/exec_impl.h"

/* Positions of microbatch mb of step `step`. */
bg_status_t bg__exec_seq_len(exec_t *x, int64_t step, int mb, int *t_p)
{
    if (!x->tokens_in) {
        *t_p = x->Tmax; /* feature inputs have fixed positions */
        return BG_OK;
    }
    const bg_batch_source_t *d = &x->p.data;
    int t = d->seq_len ? d->seq_len(step, mb, d->arg) : (d->seq ? d->seq : x->Tmax);
    if (t < 1 || t > x->Tmax)
        return bg_error(BG_ERR_INVALID, "batch source: microbatch %d of step %lld has %d positions, outside [1, %d] "
                                        "(the model's seq_len)", mb, (long long)step + 1, t, x->Tmax);
    if (x->p.tp > 1 && bg_model_desc_sequence_parallel(x->p.model) && t % x->p.tp != 0)
        return bg_error(BG_ERR_INVALID, "batch source: microbatch %d of step %lld has %d positions, which sequence "
                                        "parallelism over tp %d cannot split (a multiple of tp is needed)",
                        mb, (long long)step + 1, t, x->p.tp);
    if (x->lay.cp > 1 && t % (2 * x->lay.cp) != 0)
        return bg_error(BG_ERR_INVALID, "batch source: microbatch %d of step %lld has %d positions, which context "
                                        "parallelism over cp %d cannot split (a multiple of 2 x cp = %d is needed)",
                        mb, (long long)step + 1, t, x->lay.cp, 2 * x->lay.cp);
    *t_p = t;
    return BG_OK;
}

/* Context parallelism: keep this member's two chunks of each of the n
 * sequences of T ids (chunks cp and 2 C - 1 - cp of 2 C), in place, in that
 * order: n x T / C ids. Every destination precedes its source. */
static void cp_select(const exec_t *x, int32_t *ids, int n, int T)
{
    int C = x->lay.cp, c = T / (2 * C), tl = T / C;
    if (!ids || C == 1)
        return;
    for (int b = 0; b < n; b++) {
        memmove(ids + (size_t)b * tl, ids + (size_t)b * T + (size_t)x->lay.me.cp * c, (size_t)c * sizeof(int32_t));
        memmove(ids + (size_t)b * tl + c, ids + (size_t)b * T + (size_t)(2 * C - 1 - x->lay.me.cp) * c,
                (size_t)c * sizeof(int32_t));
    }
}

/* Ask the batch source for microbatch mb of this step and replica (what this
 * rank needs: inputs on the first stage, targets on the last), then check
 * what it wrote: every id in range, every feature finite. */
static bg_status_t fetch_batch(exec_t *x, int mb)
{
    if (x->fetched_step == x->step && x->fetched_mb == mb)
        return BG_OK;
    int has_first = x->has_first, has_last = x->has_last;
    int T = 0;
    BG_CHECK(bg__exec_seq_len(x, x->step, mb, &T));
    bg_batch_request_t rq = {x->step, mb, x->lay.me.dp, x->lay.me.dp * (x->p.batch / x->lay.dp) + mb * x->mbn,
                             bg_model_desc_input_shape(x->desc, x->mbn, T)};
    size_t n = (size_t)x->mbn * (size_t)rq.in.t;
    int32_t *tok = has_first && x->tokens_in ? x->tokens : NULL;
    float *feat = has_first && !x->tokens_in ? x->features : NULL;
    int32_t *tgt = has_last ? x->targets : NULL;
    x->nfeatures = feat ? n * (size_t)rq.in.c : 0;
    for (size_t i = 0; tok && i < n; i++)
        tok[i] = -1;
    for (size_t i = 0; tgt && i < n; i++)
        tgt[i] = -1;
    for (size_t i = 0; i < x->nfeatures; i++)
        feat[i] = NAN;
    char where[160];
    snprintf(where, sizeof(where), "batch source, step %lld, microbatch %d, replica %d", (long long)x->step + 1, mb,
             x->lay.me.dp);
    bg_status_t st = x->p.data.batch(&rq, tok, feat, tgt, x->p.data.arg);
    if (st != BG_OK)
        return bg_error(st, "%s: %s", where, bg_last_error());
    for (size_t i = 0; tok && i < n; i++)
        if (tok[i] < 0 || tok[i] >= x->vocab)
            return bg_error(BG_ERR_INVALID, "%s: token %zu of %zu (sequence %zu, position %zu) is %d, outside the "
                                            "vocabulary [0, %d)%s", where, i, n, i / (size_t)rq.in.t,
                            i % (size_t)rq.in.t, tok[i], x->vocab, tok[i] == -1 ? " (not written?)" : "");
    for (size_t i = 0; tgt && i < n; i++)
        if (tgt[i] < 0 || tgt[i] >= x->classes)
            return bg_error(BG_ERR_INVALID, "%s: target %zu of %zu is %d, outside the loss layer's classes [0, %d)%s",
                            where, i, n, tgt[i], x->classes, tgt[i] == -1 ? " (not written?)" : "");
    for (size_t i = 0; i < x->nfeatures; i++)
        if (!isfinite(feat[i]))
            return bg_error(BG_ERR_INVALID, "%s: feature %zu of %zu (shape %d x %d x %d) is %s", where, i,
                            x->nfeatures, rq.in.n, rq.in.t, rq.in.c,
                            isnan(feat[i]) ? "NaN (not written?)" : "infinite");
    cp_select(x, tok, x->mbn, rq.in.t);
    cp_select(x, tgt, x->mbn, rq.in.t);
    x->fetched_step = x->step;
    x->fetched_mb = mb;
    return BG_OK;
}

static chunk_t *chunk_of_stage(exec_t *x, int stage)
{
    for (int i = 0; i < x->V; i++)
        if (x->chunks[i].stage == stage)
            return &x->chunks[i];
    return NULL;
}

uint32_t bg__exec_tag(const exec_t *x, int grad, int recv_stage, int mb)
{
    return ((uint32_t)(x->step & 1) << 31) | ((uint32_t)grad << 30) | ((uint32_t)(recv_stage & 0x3fff) << 16) |
           (uint32_t)(mb & 0xffff);
}

/* Shape of the input of stage `stage` for microbatch mb of this step (this
 * context member's positions). */
bg_status_t bg__exec_input_shape(exec_t *x, chunk_t *ch, int mb, bg_shape_t *shape_p)
{
    int T = 0;
    BG_CHECK(bg__exec_seq_len(x, x->step, mb, &T));
    return bg__exec_shape_at(x, ch, T, shape_p);
}

bg_status_t bg__exec_shape_at(exec_t *x, chunk_t *ch, int T, bg_shape_t *shape_p)
{
    T /= x->lay.cp;
    bg_shape_t s = bg_model_input_shape(ch->model, x->mbn, T);
    /* walk the layers before this stage (descriptors of the full model) */
    for (int i = 0; i < ch->first; i++)
        BG_CHECK(bg_layer_out_shape(bg_model_layer(ch->model, i), s, &s));
    *shape_p = s;
    return BG_OK;
}

bg_status_t bg__exec_layer_costs(exec_t *x, chunk_t *ch, int mb, bg_sched_op_kind_t kind,
                                 bg_status_t (*fn)(void *arg, bg_sched_op_kind_t kind, const bg_tp_cost_t *cost),
                                 void *arg)
{
    bg_shape_t s;
    BG_CHECK(bg__exec_input_shape(x, ch, mb, &s));
    for (int i = ch->first; i <= ch->last; i++) {
        const bg_layer_t *l = bg_model_layer(ch->model, i);
        bg_tp_cost_t cost = {0};
        bg_layer_tp_cost(l, s, &cost);
        BG_CHECK(fn(arg, kind, &cost));
        BG_CHECK(bg_layer_out_shape(l, s, &s));
    }
    return BG_OK;
}

static bg_status_t begin_slot(exec_t *x, chunk_t *ch, int mb, float **in_p)
{
    if (ch->begun[mb]) {
        *in_p = NULL;
        return BG_OK;
    }
    bg_shape_t s;
    BG_CHECK(bg__exec_input_shape(x, ch, mb, &s));
    BG_CHECK(bg_stage_begin(ch->st, mb, s, in_p));
    ch->begun[mb] = 1;
    return BG_OK;
}

static bg_status_t post_act_recv(exec_t *x, chunk_t *ch, int mb)
{
    if (ch->act_recv[mb])
        return BG_OK;
    float *in;
    BG_CHECK(begin_slot(x, ch, mb, &in));
    bg_shape_t s, o;
    BG_CHECK(bg_stage_slot_shapes(ch->st, mb, &s, &o));
    return bg__xrecv(&x->stg, x->comm, ch->prev_rank, bg__exec_tag(x, 0, ch->stage, mb), in,
                     bg_shape_numel(s) * bg_dtype_size(bg_stage_input_dtype(ch->st)), &ch->act_recv[mb]);
}

static bg_status_t post_grad_recv(exec_t *x, chunk_t *ch, int mb)
{
    if (ch->grad_recv[mb] || !ch->begun[mb])
        return BG_OK; /* posted when the slot exists */
    float *dout;
    BG_CHECK(bg_stage_grad_buffer(ch->st, mb, &dout));
    bg_shape_t s, o;
    BG_CHECK(bg_stage_slot_shapes(ch->st, mb, &s, &o));
    return bg__xrecv(&x->stg, x->comm, ch->next_rank, bg__exec_tag(x, 1, ch->stage, mb), dout,
                     bg_shape_numel(o) * sizeof(float), &ch->grad_recv[mb]);
}

bg_status_t bg__exec_wait_free(bg__xfer_t **rq)
{
    if (!*rq)
        return BG_OK;
    bg_status_t st = bg__xwait(*rq);
    bg__xfree(*rq);
    *rq = NULL;
    return st;
}

/* End a slot once its outgoing messages are done. */
static bg_status_t end_slot(exec_t *x, chunk_t *ch, int mb, int split)
{
    BG_CHECK(bg__exec_wait_free(&ch->act_send[mb]));
    BG_CHECK(bg__exec_wait_free(&ch->grad_send[mb]));
    if (!split)
        bg_stage_end(ch->st, mb);
    ch->begun[mb] = 0;
    ch->out[mb] = ch->din[mb] = NULL;
    return BG_OK;
}

/* Fused backward slots whose din is still being sent end later (and so do a
 * forward-only program's slots whose output is being sent): when a test
 * after an instruction finds the send complete (force 0); at the latest when
 * the first compute instruction after the send is over (force 2: every slot
 * whose send is issued, waited for), which bounds what the partitioner
 * counts as lingering (docs/partitioner.md); force 1: all, at the step's end. */
bg_status_t bg__exec_reap_pending(exec_t *x, int force)
{
    for (int v = 0; v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        for (int mb = 0; mb < x->M; mb++) {
            /* the send the slot waits for: its gradient's (its activation's send is done by then), or in a
             * forward-only program its activation's */
            bg__xfer_t *out = ch->grad_send[mb] ? ch->grad_send[mb] : ch->act_send[mb];
            if (!ch->pending_end[mb] || (force == 2 && !out))
                continue;
            if (!force) {
                int done = 0;
                if (!out)
                    continue; /* its SEND_GRAD is not issued yet */
                BG_CHECK(bg__xtest(out, &done));
                if (!done)
                    continue;
            }
            ch->pending_end[mb] = 0;
            BG_CHECK(end_slot(x, ch, mb, 0)); /* waits for what is still in flight */
        }
    }
    return BG_OK;
}

/* Post the receives that follow op i up to (and including) the next compute op. */
bg_status_t bg__exec_post_ahead(exec_t *x, size_t i)
{
    int computes = 0;
    for (size_t j = i; j < x->nops && computes < 2; j++) {
        const bg_sched_op_t *o = &x->ops[j];
        chunk_t *ch = chunk_of_stage(x, o->stage);
        if (o->kind == BG_OP_RECV_ACT)
            BG_CHECK(post_act_recv(x, ch, o->microbatch));
        else if (o->kind == BG_OP_RECV_GRAD)
            BG_CHECK(post_grad_recv(x, ch, o->microbatch));
        else if (o->kind == BG_OP_FORWARD || o->kind == BG_OP_BACKWARD || o->kind == BG_OP_BACKWARD_INPUT ||
                 o->kind == BG_OP_BACKWARD_WEIGHT)
            computes++;
    }
    return BG_OK;
}

/* EVERY hook before_compute / after_compute around a compute instruction's compute. */
static bg_status_t before_compute(exec_t *x, chunk_t *ch, int mb, bg_sched_op_kind_t kind)
{
    BG__EACH_STRATEGY(x, s) if (s->ops->before_compute) BG_CHECK(s->ops->before_compute(x, s->self, ch, mb, kind));
    return BG_OK;
}

static void after_compute(exec_t *x, chunk_t *ch, bg_sched_op_kind_t kind)
{
    BG__EACH_STRATEGY(x, s) if (s->ops->after_compute) s->ops->after_compute(x, s->self, ch, kind);
}

/* The step's loss share of a forward on the last stage: summed now, or (a
 * backend that queues work) copied on the device and summed at the step's end. */
static bg_status_t add_loss(exec_t *x, chunk_t *ch, int mb)
{
    bg_backend_t *be = x->be;
    size_t n = bg_shape_numel(ch->out_shape[mb]);
    if (be->ops->event_record && n <= x->per_mb_floats) { /* summed at the step's end (loss_dev) */
        if (!x->loss_dev) {
            x->loss_dev = bg_backend_alloc(be, (size_t)x->M * x->per_mb_floats * sizeof(float),
                                           "per-microbatch losses (summed at the step's end)");
            x->loss_n = calloc((size_t)x->M, sizeof(size_t));
            x->loss_mb = calloc((size_t)x->M, sizeof(int));
            if (!x->loss_dev || !x->loss_n || !x->loss_mb)
                return bg_error(BG_ERR_NOMEM, "rank %d: the per-microbatch losses (%d x %zu floats)", x->lay.rank,
                                x->M, x->per_mb_floats);
        }
        be->ops->copy(be, x->loss_dev + (size_t)mb * x->per_mb_floats, ch->out[mb], n);
        x->loss_n[mb] = n;
        x->loss_mb[x->loss_k++] = mb;
    } else {
        x->loss += be->ops->sum(be, ch->out[mb], n) * (double)x->loss_scale;
    }
    return BG_OK;
}

/* BRIGADE_TP_OVERLAP=microbatch (bg__exec_run_pair): the pair's second instruction, a forward, posts
 * its output gradient's buffer only once the first has ended, which is the order the memory replay
 * counts (schedule/memory.c: i ends, then j). Without it the order followed the timing: when i is a
 * backward-weight its lane starts second, and a forward whose collectives all completed at their first
 * test ran to its end before it, holding that buffer beside the slot the backward-weight then frees. */
static void pair_hold(exec_t *x)
{
    for (int idle = 0; x->pair_j_lane == bg__pair_lane() + 1 && !x->pair_i_ended && bg__pair_wait_turn(&idle);)
        ;
}

/* A forward of a training program (eval 0) or of a forward-only one (eval 1): the same compute; an
 * evaluation's slot stashes nothing for a backward, receives no gradient and ends once its output is
 * handed on: at once (the loss, or the next stage on this rank), or when its send completes (reaped). */
static bg_status_t forward(exec_t *x, chunk_t *ch, int mb, int eval)
{
    bg_backend_t *be = x->be;
    float *in;
    BG_CHECK(begin_slot(x, ch, mb, &in));
    BG_CHECK(before_compute(x, ch, mb, BG_OP_FORWARD));
    if (ch->is_first || ch->is_last)
        BG_CHECK(fetch_batch(x, mb));
    if (ch->is_first && x->features)
        be->ops->from_host(be, in, x->features, x->nfeatures * sizeof(float));
    /* every stage gets the step's loss scale: a layer with a loss of its own (an MoE's load balancing)
     * weights its gradient by it wherever it sits */
    BG_CHECK(bg_stage_set_data(ch->st, mb, ch->is_first && x->tokens_in ? x->tokens : NULL,
                               ch->is_last ? x->targets : NULL, x->loss_scale));
    if (!ch->is_first && !ch->prev_local)
        BG_CHECK(bg__exec_wait_free(&ch->act_recv[mb]));
    BG_CHECK(bg_stage_forward(ch->st, mb, &ch->out[mb], &ch->out_shape[mb]));
    after_compute(x, ch, BG_OP_FORWARD);
    /* stashed from its forward to its last backward piece, as the simulator counts */
    if (!eval && ++x->stashed > x->peak_stashed)
        x->peak_stashed = x->stashed;
    /* every member of a tensor group computes the same losses; emulated stages compute none */
    if (ch->is_last && !x->em && x->lay.me.tp == 0)
        BG_CHECK(add_loss(x, ch, mb));
    /* The output gradient's buffer is counted with the stash from here (bg_stage_memory's dout): receive
     * into it now, so that the next stage's send completes when it is made and frees the next stage's
     * backward buffers (a rendezvous send would otherwise hold them until this stage's backward) */
    if (!eval && !ch->is_last && !ch->next_local) {
        pair_hold(x);
        BG_CHECK(post_grad_recv(x, ch, mb));
    }
    if (!ch->is_last && ch->next_local) {
        /* the next stage is ours: hand the output over now */
        chunk_t *nx = chunk_of_stage(x, ch->stage + 1);
        float *nin;
        BG_CHECK(begin_slot(x, nx, mb, &nin));
        bg_dtype_t t = bg_stage_output_dtype(ch->st); /* = the next stage's input type */
        be->ops->convert(be, nin, t, ch->out[mb], t, bg_shape_numel(ch->out_shape[mb]));
    }
    if (eval && (ch->is_last || ch->next_local))
        BG_CHECK(end_slot(x, ch, mb, 0));
    return BG_OK;
}

static bg_status_t op_forward(exec_t *x, chunk_t *ch, int mb) { return forward(x, ch, mb, 0); }
static bg_status_t op_eval_forward(exec_t *x, chunk_t *ch, int mb) { return forward(x, ch, mb, 1); }

/* A full backward (split 0) or its input half (split 1). */
static bg_status_t backward(exec_t *x, chunk_t *ch, int mb, int split)
{
    bg_backend_t *be = x->be;
    bg_sched_op_kind_t kind = split ? BG_OP_BACKWARD_INPUT : BG_OP_BACKWARD;
    if (!ch->is_last && !ch->next_local)
        BG_CHECK(bg__exec_wait_free(&ch->grad_recv[mb]));
    float *din;
    BG_CHECK(before_compute(x, ch, mb, kind));
    if (split)
        BG_CHECK(bg_stage_backward_input(ch->st, mb, &din));
    else
        BG_CHECK(bg_stage_backward(ch->st, mb, &din));
    after_compute(x, ch, kind);
    ch->din[mb] = din;
    if (!split)
        x->stashed--; /* its last backward piece is done (the memory may wait for a send) */
    if (!ch->is_first && ch->prev_local) {
        chunk_t *pv = chunk_of_stage(x, ch->stage - 1);
        float *dout;
        BG_CHECK(bg_stage_grad_buffer(pv->st, mb, &dout));
        be->ops->copy(be, dout, din, bg_shape_numel(pv->out_shape[mb]));
    }
    if (!split && (ch->is_first || ch->prev_local))
        BG_CHECK(end_slot(x, ch, mb, 0));
    else if (!split) {
        /* the slot ends after its SEND_GRAD completes (a rendezvous-sized one: after the next compute
         * instruction has allocated): until then it holds din alone. Its output's send is complete by
         * now (the next stage computed this gradient from it), so waiting for it costs no time. */
        BG_CHECK(bg__exec_wait_free(&ch->act_send[mb]));
        BG_CHECK(bg_stage_release(ch->st, mb));
        ch->out[mb] = NULL;
        ch->pending_end[mb] = 1;
    }
    return BG_OK;
}

static bg_status_t op_backward(exec_t *x, chunk_t *ch, int mb) { return backward(x, ch, mb, 0); }
static bg_status_t op_backward_input(exec_t *x, chunk_t *ch, int mb) { return backward(x, ch, mb, 1); }

static bg_status_t op_backward_weight(exec_t *x, chunk_t *ch, int mb)
{
    BG_CHECK(bg__exec_wait_free(&ch->grad_send[mb])); /* W frees din */
    BG_CHECK(bg__exec_wait_free(&ch->act_send[mb]));
    BG_CHECK(before_compute(x, ch, mb, BG_OP_BACKWARD_WEIGHT));
    BG_CHECK(bg_stage_backward_weight(ch->st, mb));
    after_compute(x, ch, BG_OP_BACKWARD_WEIGHT);
    x->stashed--;
    return end_slot(x, ch, mb, 1);
}

static bg_status_t op_send_act(exec_t *x, chunk_t *ch, int mb)
{
    /* in the model's precision (bf16: half the bytes) */
    size_t bytes = bg_shape_numel(ch->out_shape[mb]) * bg_dtype_size(bg_stage_output_dtype(ch->st));
    x->bytes_sent += bytes;
    return bg__xsend(&x->stg, x->comm, ch->next_rank, bg__exec_tag(x, 0, ch->stage + 1, mb), ch->out[mb], bytes,
                     &ch->act_send[mb]);
}

static bg_status_t op_send_grad(exec_t *x, chunk_t *ch, int mb)
{
    bg_shape_t s, so;
    BG_CHECK(bg_stage_slot_shapes(ch->st, mb, &s, &so));
    x->bytes_sent += bg_shape_numel(s) * sizeof(float);
    return bg__xsend(&x->stg, x->comm, ch->prev_rank, bg__exec_tag(x, 1, ch->stage - 1, mb), ch->din[mb],
                     bg_shape_numel(s) * sizeof(float), &ch->grad_send[mb]);
}

/* A forward-only program's send: the slot ends when it completes (bg__exec_reap_pending). */
static bg_status_t op_eval_send_act(exec_t *x, chunk_t *ch, int mb)
{
    BG_CHECK(op_send_act(x, ch, mb));
    ch->pending_end[mb] = 1;
    return BG_OK;
}

/* A receive instruction: the EVERY hook before_wait, then the wait. */
static bg_status_t wait_recv(exec_t *x, bg__xfer_t **rq)
{
    BG__EACH_STRATEGY(x, s) if (s->ops->before_wait) s->ops->before_wait(x, s->self, *rq);
    return bg__exec_wait_free(rq);
}

static bg_status_t op_recv_act(exec_t *x, chunk_t *ch, int mb)
{
    BG_CHECK(post_act_recv(x, ch, mb));
    return wait_recv(x, &ch->act_recv[mb]);
}

static bg_status_t op_recv_grad(exec_t *x, chunk_t *ch, int mb)
{
    BG_CHECK(post_grad_recv(x, ch, mb));
    if (!ch->grad_recv[mb])
        return bg_error(BG_ERR_INTERNAL, "rank %d: gradient of microbatch %d for stage %d before its forward",
                        x->lay.rank, mb, ch->stage);
    return wait_recv(x, &ch->grad_recv[mb]);
}

static bg_status_t op_reduce_grads(exec_t *x, chunk_t *ch, int mb)
{
    (void)mb;
    return bg__exec_start_buckets(x, ch, ch->first); /* whatever the backward hook did not start */
}

/* Once a step the before_optimizer hooks (every reduction finished first),
 * then the chunk's update: the ONE hook optimizer, or bucket by bucket. */
static bg_status_t op_optimizer_step(exec_t *x, chunk_t *ch, int mb)
{
    (void)mb;
    BG_CHECK(bg__exec_before_optimizer(x));
    bg__strategy_t *s = BG__ONE(x, optimizer);
    return s ? s->ops->optimizer(x, s->self, ch) : bg__exec_optimizer_step(x, ch);
}

/* The interpreter's table: one handler per instruction kind. */
typedef bg_status_t (*op_fn)(exec_t *x, chunk_t *ch, int mb);
static const op_fn exec_ops[BG_OP_KIND_COUNT] = {
    [BG_OP_FORWARD] = op_forward,
    [BG_OP_BACKWARD] = op_backward,
    [BG_OP_BACKWARD_INPUT] = op_backward_input,
    [BG_OP_BACKWARD_WEIGHT] = op_backward_weight,
    [BG_OP_SEND_ACT] = op_send_act,
    [BG_OP_SEND_GRAD] = op_send_grad,
    [BG_OP_RECV_ACT] = op_recv_act,
    [BG_OP_RECV_GRAD] = op_recv_grad,
    [BG_OP_REDUCE_GRADS] = op_reduce_grads,
    [BG_OP_OPTIMIZER_STEP] = op_optimizer_step,
};

/* A forward-only program's table (x->forward_only): a kind it lacks is refused, never run. */
static const op_fn eval_ops[BG_OP_KIND_COUNT] = {
    [BG_OP_FORWARD] = op_eval_forward,
    [BG_OP_SEND_ACT] = op_eval_send_act,
    [BG_OP_RECV_ACT] = op_recv_act,
};

/* The schedule IR's names: the text tokens of compute ops (F, B, b, W), the
 * JSON names of the rest (send_act, ..., reduce_grads, optimizer_step). */
const char *bg__exec_op_label(int kind)
{
    const char *n = kind >= BG_OP_FORWARD && kind <= BG_OP_BACKWARD_WEIGHT
                        ? bg_sched_op_kind_token((bg_sched_op_kind_t)kind)
                        : bg_sched_op_kind_name((bg_sched_op_kind_t)kind);
    return n ? n : "?";
}

bg_status_t bg__exec_run_op(exec_t *x, const bg_sched_op_t *o)
{
    chunk_t *ch = chunk_of_stage(x, o->stage);
    if (!ch)
        return bg_error(BG_ERR_INTERNAL, "rank %d: program names stage %d, which this rank does not hold", x->lay.rank,
                        o->stage);
    const op_fn *table = x->forward_only ? eval_ops : exec_ops;
    if ((unsigned)o->kind >= BG_OP_KIND_COUNT || !table[o->kind])
        return bg_error(BG_ERR_INVALID, "rank %d: instruction kind %d in a %s program", x->lay.rank, o->kind,
                        x->forward_only ? "forward-only" : "training");
    return table[o->kind](x, ch, o->microbatch);
}

/* ---- BRIGADE_TP_OVERLAP=microbatch: a compute instruction beside the next one ----
 *
 * Op i (a compute instruction) and the next compute instruction j run as two
 * coroutines on this thread (core/fiber.h) when exactly one of them is a
 * forward and their microbatches differ (bg_sched_pair_partner; the
 * partitioner's replay pairs the same ones): then neither reads what the other
 * writes, the forward adds no gradient and the backward no loss, so every
 * sum happens in the order it does unpaired and the step is bitwise the
 * same. One lane runs i, then the sends between i and j (whose data i or an
 * earlier instruction made); the other waits for the receives between them,
 * then runs j (i's lane starts, unless i is a W: below). A lane whose tensor group's collective (or receive) is not
 * complete hands the thread to the other lane (runtime/tp.c), so one
 * microbatch's sums run while the other microbatch computes. The two lanes'
 * slots use the stage's two scratch lanes; each lane's collectives go to a
 * group of its own, so their order on the wire is fixed by the program. */

typedef struct lane_job {
    exec_t *x;
    size_t ops[64]; /* program indices, in order */
    int n;
    size_t failed;  /* the op that failed */
    double a, b;    /* the compute instruction's start and end */
    int first;      /* 1: this job runs the pair's first instruction (i) */
} lane_job_t;

/* Run a lane's instructions; a receive is waited for yielding to the other lane. */
static bg_status_t lane_run(void *arg)
{
    lane_job_t *L = arg;
    exec_t *x = L->x;
    for (int k = 0; k < L->n; k++) {
        const bg_sched_op_t *o = &x->ops[L->ops[k]];
        chunk_t *ch = chunk_of_stage(x, o->stage);
        bg__xfer_t *r = NULL;
        if (ch && o->kind == BG_OP_RECV_ACT && post_act_recv(x, ch, o->microbatch) == BG_OK)
            r = ch->act_recv[o->microbatch];
        if (ch && o->kind == BG_OP_RECV_GRAD && post_grad_recv(x, ch, o->microbatch) == BG_OK)
            r = ch->grad_recv[o->microbatch];
        for (int done = 0, idle = 0; r && bg__xtest(r, &done) == BG_OK && !done && bg__pair_wait_turn(&idle);)
            ;
        int compute = o->kind <= BG_OP_BACKWARD_WEIGHT;
        double a = bg_now();
        bg_status_t st = BG_OK;
        if (compute && ch) { /* the slot's calls use this lane's scratch (a forward begins its slot here) */
            float *in;
            if (o->kind == BG_OP_FORWARD)
                st = begin_slot(x, ch, o->microbatch, &in);
            if (st == BG_OK)
                st = bg_stage_set_lane(ch->st, o->microbatch, bg__pair_lane());
        }
        if (st == BG_OK)
            st = bg__exec_run_op(x, o);
        double b = bg_now();
        if (st != BG_OK) {
            L->failed = L->ops[k];
            return st;
        }
        if (compute && L->first)
            x->pair_i_ended = 1;
        if (compute)
            L->a = a, L->b = b;
        if (x->trace)
            bg__trace_event(x->trace, bg__exec_op_label(o->kind), o->microbatch, o->stage, a, b, (int)x->step + 1);
    }
    return BG_OK;
}

/* Run ops i and j (bg_sched_pair_partner) and what lies between them, as two lanes. */
bg_status_t bg__exec_run_pair(exec_t *x, size_t i, size_t j)
{
    lane_job_t job[2] = {{.x = x, .first = 1}, {.x = x}};
    job[0].ops[job[0].n++] = i;
    for (size_t k = i + 1; k < j; k++) {
        int send = x->ops[k].kind == BG_OP_SEND_ACT || x->ops[k].kind == BG_OP_SEND_GRAD;
        lane_job_t *L = &job[send ? 0 : 1];
        if (L->n == (int)(sizeof(L->ops) / sizeof(L->ops[0])) - 1)
            return bg_error(BG_ERR_INTERNAL, "rank %d: more than %zu instructions between two compute instructions",
                            x->lay.rank, sizeof(L->ops) / sizeof(L->ops[0]) - 2);
        L->ops[L->n++] = k;
    }
    job[1].ops[job[1].n++] = j;
    /* A backward-weight instruction exchanges and receives nothing, so a lane running it never hands the
     * thread over: when i is one, j's job starts first (as lane 0), and j's exchanges are in flight while i
     * computes. The two touch nothing of each other's, whichever runs first; each member of a group holds the
     * same stage and program, so each lane's exchanges still meet on the same group everywhere. */
    int w = x->ops[i].kind == BG_OP_BACKWARD_WEIGHT;
    bg_status_t st[2];
    char msg[2][256];
    x->pair_j_lane = 1 + !w; /* job[1] runs on lane !w (pair_hold) */
    x->pair_i_ended = 0;
    bg__pair_run(x->pair, lane_run, &job[w], lane_run, &job[!w], st, msg);
    x->pair_j_lane = 0;
    double a = job[0].a < job[1].a ? job[0].a : job[1].a, b = job[0].b > job[1].b ? job[0].b : job[1].b;
    if (st[0] == BG_OK && st[1] == BG_OK) {
        x->busy += b - a;
        return BG_OK;
    }
    int lane = st[0] != BG_OK ? 0 : 1, k = lane ^ w; /* the lane that failed, and its job */
    const bg_sched_op_t *o = &x->ops[job[k].failed];
    return bg_error(st[lane], "%s of microbatch %d (beside %s of microbatch %d): %s", bg__exec_op_label(o->kind),
                    o->microbatch, bg__exec_op_label(x->ops[k ? i : j].kind), x->ops[k ? i : j].microbatch,
                    msg[lane]);
}

/* The error of instruction @p op that failed with @p st (@p label: name it; NULL: the message, from
 * run_pair, names the instruction): a peer's failure found by the transport's health check wins. */
bg_status_t bg__exec_op_failed(exec_t *x, bg_status_t st, const bg_sched_op_t *op, const bg_sched_op_t *label)
{
    bg_status_t st2 = bg_comm_health(x->comm);
    char msg[1024], what[64] = "";
    snprintf(msg, sizeof(msg), "%s", bg_last_error());
    if (st2 != BG_OK && st != BG_ERR_PEER)
        st = st2, snprintf(msg, sizeof(msg), "%s", bg_last_error());
    if (label)
        snprintf(what, sizeof(what), "%s of microbatch %d: ", bg__exec_op_label(label->kind), label->microbatch);
    return bg_error(st, "rank %d (stage %d) at step %lld, %s%s", x->lay.rank, op->stage, (long long)x->step + 1, what,
                    msg);
}

