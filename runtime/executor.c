/* runtime/executor.c: the executor's core: trains any model description
 * on a pipeline x data-parallel x tensor-parallel layout, one optimizer
 * step per call of its host. Each rank walks its program from the schedule
 * generator (the same program the simulator runs) through the
 * interpreter's table of instruction handlers (runtime/exec_ops.c):
 * receives are posted ahead, sends never block, compute runs on the rank's
 * stages (one per model chunk), and each chunk's gradient buckets are
 * reduced as soon as their last backward piece is done
 * (runtime/exec_grads.c), so the reduction overlaps the pipeline's drain.
 * One process is the executor at pp = dp = 1.
 *
 * What differs between ways of training (data-parallel all-reduce, ZeRO,
 * parameter servers, DualPipe's two copies, tied weights, emulation) is a
 * strategy's (runtime/strat_*.c) behind the hooks of runtime/exec_impl.h;
 * this file creates, steps and destroys, calling them, and must not branch
 * on which strategies are active. Who holds what is the rank layout's
 * (runtime/layout.c).
 *
 * Data: replica d takes sequences [d*B/D, (d+1)*B/D) of each step's global
 * batch, in M microbatches, from the host's batch source. The loss scale is
 * 1 / (positions of the global batch) on every replica and the reduction is
 * a sum, so the arithmetic of a stage's gradients is the one of a single
 * process for dp = 1 (bitwise), and within rounding for dp > 1.
 *
 * Shapes: a microbatch's sequence length is a pure function of (step, mb)
 * (the batch source's seq_len), so every rank knows every message's size
 * without a header: variable lengths cost nothing on the wire. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/partitioner.h"
#include "core/check.h"
#include "runtime/exec_impl.h"
#include "runtime/cp.h"
#include "runtime/numa.h"
#include "runtime/ps.h"

/* Positions in one step's global batch (the loss is their mean). */
bg_status_t bg__exec_step_tokens(exec_t *x, int64_t step, double *tokens_p)
{
    double tokens = 0;
    for (int mb = 0; mb < x->M; mb++) {
        int t = 0;
        BG_CHECK(bg__exec_seq_len(x, step, mb, &t));
        tokens += (double)x->mbn * x->lay.dp * t;
    }
    *tokens_p = tokens;
    return BG_OK;
}

/* Layers per virtual stage: explicit split, or as even as possible. */
static bg_status_t layer_ranges(const bg_executor_params_t *c, int total, int S, int *first, int *last)
{
    if (c->split && c->nsplit) {
        if (c->nsplit != S)
            return bg_error(BG_ERR_INVALID, "--split has %d entries but there are %d pipeline stages", c->nsplit, S);
        int sum = 0;
        for (int i = 0; i < S; i++) {
            if (c->split[i] < 1)
                return bg_error(BG_ERR_INVALID, "--split entry %d is %d; every stage needs at least one layer", i,
                                c->split[i]);
            first[i] = sum;
            sum += c->split[i];
            last[i] = sum - 1;
        }
        if (sum != total)
            return bg_error(BG_ERR_INVALID, "--split sums to %d layers but the model has %d", sum, total);
        return BG_OK;
    }
    if (S > total)
        return bg_error(BG_ERR_INVALID, "%d pipeline stages but the model has only %d layers", S, total);
    for (int i = 0, at = 0; i < S; i++) {
        int n = total / S + (i < total % S ? 1 : 0);
        first[i] = at;
        last[i] = at + n - 1;
        at += n;
    }
    return BG_OK;
}

/* Context parallelism (--cp): what it composes with, and the length's chunks. */
static bg_status_t check_cp(const bg_executor_params_t *p, const bg_model_desc_params_t *mp)
{
    int cp = p->size >= offsetof(bg_executor_params_t, cp) + sizeof(int) ? p->cp : 1;
    if (cp == 0 || cp == 1)
        return BG_OK;
    if (cp < 0)
        return bg_error(BG_ERR_INVALID, "cp must be >= 1 (got %d)", cp);
    const char *no = p->ps > 0 ? "--ps" : mp->input != BG_INPUT_TOKENS ? "a model of feature inputs" : NULL;
    if (no)
        return bg_error(BG_ERR_UNSUPPORTED, "--cp %d with %s is not built (context parallelism composes with --pp, "
                        "--dp, --tp, --zero, every schedule and --emulate; docs/executor.md)", cp, no);
    int seq = p->data.seq ? p->data.seq : mp->seq_len;
    if (seq % (2 * cp) != 0)
        return bg_error(BG_ERR_INVALID, "--cp %d: the sequence length %d is not divisible by 2 x cp = %d (each "
                        "member holds two of 2 cp equal chunks)", cp, seq, 2 * cp);
    return BG_OK;
}

/* This rank's activation memory, predicted as the planner predicts it (one
 * model for both): the peak over the program's points of the slot counts the
 * planner's replay gives (bg_part_schedule_counts: receives posted ahead,
 * forwards, gradient buffers, backwards, lingering sends, and the paired
 * instructions of BRIGADE_TP_OVERLAP=microbatch; a strategy's act_counts
 * hook instead, with the stashes it keeps off the device: activation offload)
 * times each chunk's per-slot buffers (bg_stage_memory), plus each stage's
 * scratch. And the simulator's
 * peak count of stashed microbatches (F to the last backward piece). */
static bg_status_t predict_activations(exec_t *x)
{
    /* the stashed microbatches: the simulator's count (bg_sim_peak_stash) */
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    bg_sim_result_t *r = NULL;
    BG_CHECK(bg_schedule_simulate(x->sched, &sp, &r));
    x->predicted_stashed = bg_sim_peak_stash(r, x->lay.me.pp);
    bg_sim_result_free(r);
    /* the bytes: the planner's replay of this rank's program (the slot counts at every point,
     * bg_part_schedule_counts) times each chunk's per-slot buffers as its stage allocates them
     * (bg_part_row_bytes, the planner's byte model) */
    bg_part_stage_t *b = calloc((size_t)x->V, sizeof(*b));
    BG_ALLOC_CHECK(b, (size_t)x->V * sizeof(*b), "slot sizes");
    size_t lingers = bg_plan_linger_bytes(), fixed = 0;
    bg_status_t st = BG_OK;
    for (int v = 0; v < x->V && st == BG_OK; v++) {
        chunk_t *ch = &x->chunks[v];
        bg_shape_t in;
        bg_stage_mem_t mem;
        int64_t save = x->step;
        x->step = 0;
        st = bg__exec_input_shape(x, ch, 0, &in);
        x->step = save;
        if (st == BG_OK)
            st = bg_stage_memory(ch->st, in, &mem);
        if (st != BG_OK)
            break;
        bg_log(BG_LOG_DEBUG, "memory",
               "stage %d per microbatch: stash %zu data %zu dout %zu; split_bw %zu fused_bw %zu recompute %zu "
               "scratch %zu",
               ch->stage, mem.stash, mem.data, mem.dout, mem.split_bw, mem.fused_bw, mem.recompute, mem.scratch);
        bg_part_stage_t *e = &b[v];
        e->recompute = bg_stage_recompute(ch->st);
        e->input_bytes = in.c ? bg_shape_numel(in) * bg_dtype_size(bg_stage_input_dtype(ch->st)) : 0;
        e->data_bytes = mem.data;
        e->layer_act_bytes = e->recompute ? mem.recompute : mem.stash - e->input_bytes;
        e->keep_bytes = e->recompute ? mem.stash - e->input_bytes : 0; /* recomputation keeps the output */
        e->dout_bytes = mem.dout;
        /* the replay counts the slots in a full backward apart (counts.fused): the others are between B and W */
        e->bw_bytes = mem.split_bw;
        e->fused_bw_bytes = mem.fused_bw;
        /* a slot whose input gradient's send lingers holds its (full) backward's buffer (docs/partitioner.md) */
        size_t din_bytes = in.c ? bg_shape_numel(in) * sizeof(float) : 0; /* the gradient sent back: fp32 */
        e->linger_bytes = !ch->is_first && lingers && din_bytes >= lingers ? mem.fused_bw : 0;
        fixed += mem.scratch * (x->pair ? 2 : 1); /* kept by the stage once allocated (a lane each, paired) */
    }
    bg_part_counts_t *rows = NULL;
    int nrows = 0;
    bg__strategy_t *own = BG__ONE(x, act_counts); /* with a strategy's stashes off the device (activation offload) */
    if (st == BG_OK && own)
        st = own->ops->act_counts(x, own->self, &rows, &nrows);
    else if (st == BG_OK)
        st = bg_part_schedule_counts(x->sched, x->lay.me.pp, x->pair != NULL, &rows, &nrows);
    size_t peak = 0;
    for (int k = 0; st == BG_OK && k < nrows; k++) {
        size_t sum = 0;
        for (size_t i = (size_t)k * x->V, v = 0; v < (size_t)x->V; v++, i++)
            sum += bg_part_row_bytes(&rows[i], &b[v]);
        if (sum > peak)
            peak = sum;
    }
    if (st == BG_OK)
        x->predicted_act_bytes = peak + fixed;
    free(rows);
    free(b);
    return st;
}

bg_status_t bg__exec_chunk_models(exec_t *x, bg_model_t ***models_p)
{
    bg_model_t **models = malloc((size_t)x->V * sizeof(*models));
    BG_ALLOC_CHECK(models, (size_t)x->V * sizeof(*models), "model chunk list");
    for (int v = 0; v < x->V; v++)
        models[v] = x->chunks[v].model;
    *models_p = models;
    return BG_OK;
}

static void free_chunk(chunk_t *ch)
{
    if (!ch->st) { /* a parameter server's model only */
        bg_model_destroy(ch->model);
        return;
    }
    bg_stage_destroy(ch->st);
    bg_model_destroy(ch->model);
    free(ch->act_recv);
    free(ch->grad_recv);
    free(ch->act_send);
    free(ch->grad_send);
    free(ch->out);
    free(ch->din);
    free(ch->begun);
    free(ch->pending_end);
    free(ch->out_shape);
    free(ch->buckets);
    free(ch->tsq);
    free(ch->hook);
}

static void cancel_all(exec_t *x)
{
    for (int v = 0; x->chunks && v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        for (int mb = 0; ch->act_recv && mb < x->M; mb++) {
            bg__xfree(ch->act_recv[mb]);
            bg__xfree(ch->grad_recv[mb]);
            ch->act_recv[mb] = ch->grad_recv[mb] = NULL;
            /* sends to a dead peer: their buffers stay until the comm is destroyed */
            bg__xfree(ch->act_send[mb]);
            bg__xfree(ch->grad_send[mb]);
            ch->act_send[mb] = ch->grad_send[mb] = NULL;
        }
        for (int b = 0; b < ch->nbuckets; b++) {
            bg__xfree(ch->buckets[b].req);
            ch->buckets[b].req = NULL;
        }
    }
    BG__EACH_STRATEGY(x, s) if (s->ops->cancel) s->ops->cancel(x, s->self);
}

static void exec_free(exec_t *x)
{
    /* first: their requests and pointers aim into the models (a parameter server's, ZeRO's) */
    BG__EACH_STRATEGY(x, s) if (s->ops->destroy) s->ops->destroy(x, s->self);
    if (x->trace)
        bg__trace_destroy(x->trace);
    for (int v = 0; x->chunks && v < x->V; v++)
        free_chunk(&x->chunks[v]);
    free(x->chunks);
    bg__dcoll_destroy(x->dp_coll);
    bg_group_destroy(x->dp_group);
    bg_group_destroy(x->world_group);
    if (x->stg.transfers)
        bg_log(BG_LOG_INFO, "executor", "rank %d: staged %zu transfers (%zu chunks, %zu bytes) through %zu bytes of "
               "host memory%s", x->lay.rank, x->stg.transfers, x->stg.chunks, x->stg.bytes, x->stg.host_peak,
               x->stg.async ? " (copies on the backend's copy stream)" : "");
    if (x->stg.direct_transfers)
        bg_log(BG_LOG_INFO, "executor", "rank %d: handed %zu transfers (%zu bytes) of backend buffers to the "
               "transport directly", x->lay.rank, x->stg.direct_transfers, x->stg.direct_bytes);
    if (x->stg.async)
        bg_log(BG_LOG_INFO, "executor", "rank %d: %zu transfers started after their events completed, "
               "%zu of them later than queued", x->lay.rank, x->stg.queued, x->stg.deferred);
    bg__staging_fini(&x->stg);
    bg_backend_free(x->be, x->loss_dev);
    free(x->loss_n);
    free(x->loss_mb);
    bg__tp_destroy(x->tp, x->desc); /* after the models: they use its group */
    bg__cp_destroy(x->cp, x->desc);
    bg_backend_destroy(x->be);
    bg_schedule_free(x->sched);
    bg_schedule_free(x->eval_sched);
    free(x->tokens);
    free(x->targets);
    free(x->features);
    free(x->first);
    free(x->last);
    bg__emulate_free(x->em);
    bg__pair_destroy(x->pair);
}

/* Expert parallelism: the description's MoE layers built for ep, ep dividing dp, and the strategies it is built
 * with (ep: 1 when the field predates the params). */
static bg_status_t check_ep(const bg_executor_params_t *p, int ep)
{
    int deg = bg_model_desc_ep_degree(p->model);
    const char *name = bg_model_desc_params(p->model)->name;
    if (deg < 0)
        return bg_error(BG_ERR_INVALID, "model %s: its MoE layers are built for different expert-parallel degrees", name);
    if (deg != ep)
        return bg_error(BG_ERR_INVALID, "ep = %d but model %s has %s (build it for ep = %d: bg_model_config_t.ep; "
                                        "docs/layers.md)", ep, name,
                        deg == 1 ? "no expert-parallel MoE layers" : "MoE layers of another expert-parallel degree", ep);
    if (ep == 1)
        return BG_OK;
    if (p->dp % ep != 0)
        return bg_error(BG_ERR_INVALID, "ep %d must divide dp %d (an expert-parallel group is ep consecutive "
                                        "data-parallel ranks of a stage)", ep, p->dp);
    const char *no = p->zero > 1 ? "--zero 2 and 3" : p->ps > 0 ? "--ps" : NULL;
    if (no)
        return bg_error(BG_ERR_UNSUPPORTED, "ep %d with %s is not built yet (expert parallelism composes with dp, pp, "
                                            "--zero 1, every schedule and --emulate)", ep, no);
    return BG_OK;
}

/* What --offload takes (docs/offload.md); the optimizer's backend is checked at setup (strat_offload.c). */
static bg_status_t check_offload(const bg_executor_params_t *p)
{
    if (p->offload & ~(BG_OFFLOAD_OPTIMIZER | BG_OFFLOAD_ACTIVATIONS | BG_OFFLOAD_PARAMS))
        return bg_error(BG_ERR_INVALID, "offload = %#x: unknown bits (BG_OFFLOAD_OPTIMIZER, _ACTIVATIONS, _PARAMS)",
                        (unsigned)p->offload);
    int zero = p->size >= offsetof(bg_executor_params_t, zero) + sizeof(int) ? p->zero : 0;
    if ((p->offload & BG_OFFLOAD_PARAMS) && (zero != 3 || p->dp < 2))
        return bg_error(BG_ERR_INVALID, "--offload params needs --zero 3 over dp >= 2 (got --zero %d, dp %d): "
                                        "what it offloads is each replica's shard of the parameters", zero, p->dp);
    if (p->offload_dir && *p->offload_dir && !p->offload)
        return bg_error(BG_ERR_INVALID, "--offload-dir %s without --offload: say what to offload (--offload "
                                        "optimizer)", p->offload_dir);
    return BG_OK;
}

static bg_status_t check_params(const bg_executor_params_t *p)
{
    if (!p->model)
        return bg_error(BG_ERR_INVALID, "executor: no model description");
    BG_CHECK(bg_model_desc_check(p->model));
    if (p->size >= offsetof(bg_executor_params_t, zero) + sizeof(int) && (p->zero < 0 || p->zero > 3))
        return bg_error(BG_ERR_INVALID, "zero = %d: the sharding stage must be 0, 1, 2 or 3", p->zero);
    if (p->size >= offsetof(bg_executor_params_t, offload_dir) + sizeof(char *))
        BG_CHECK(check_offload(p));
    if (p->pp < 1 || p->dp < 1)
        return bg_error(BG_ERR_INVALID, "pp and dp must be >= 1 (got %d, %d)", p->pp, p->dp);
    BG_CHECK(bg__tp_check_params(p->model, p->tp));
    int has_ep = p->size >= offsetof(bg_executor_params_t, ep) + sizeof(int);
    if (has_ep && p->ep < 0)
        return bg_error(BG_ERR_INVALID, "ep must be >= 1 (got %d)", p->ep);
    BG_CHECK(check_ep(p, has_ep && p->ep > 0 ? p->ep : 1));
    if (p->batch < 1 || p->microbatches < 1)
        return bg_error(BG_ERR_INVALID, "batch (%d) and microbatches (%d) must be >= 1", p->batch, p->microbatches);
    if (p->batch % (p->dp * p->microbatches) != 0)
        return bg_error(BG_ERR_INVALID, "batch %d does not split into %d replicas x %d equal microbatches", p->batch,
                        p->dp, p->microbatches);
    if (!p->data.batch)
        return bg_error(BG_ERR_INVALID, "executor: no batch source (params.data.batch is NULL)");
    const bg_model_desc_params_t *mp = bg_model_desc_params(p->model);
    if (p->data.seq < 0 || (mp->input == BG_INPUT_TOKENS && p->data.seq > mp->seq_len))
        return bg_error(BG_ERR_INVALID, "sequence length %d must be in [1, %d] (the model's maximum)", p->data.seq,
                        mp->seq_len);
    BG_CHECK(check_cp(p, mp));
    if (p->tp > 1 && bg_model_desc_sequence_parallel(p->model)) { /* sequence parallelism */
        int seq = mp->input == BG_INPUT_TOKENS && p->data.seq ? p->data.seq : mp->seq_len;
        if (seq % p->tp != 0)
            return bg_error(BG_ERR_INVALID, "sequence parallelism: the sequence length %d is not divisible by tp %d",
                            seq, p->tp);
    }
    if (!(p->optim.lr > 0))
        return bg_error(BG_ERR_INVALID, "learning rate must be > 0 (got %g)", (double)p->optim.lr);
    if (p->optim.kind != BG_OPTIM_ADAMW && p->optim.kind != BG_OPTIM_SGD)
        return bg_error(BG_ERR_INVALID, "unknown optimizer %d", (int)p->optim.kind);
    if (p->size >= offsetof(bg_executor_params_t, staleness) + sizeof(int))
        BG_CHECK(bg__ps_check_params(p));
    if (p->size >= offsetof(bg_executor_params_t, clip_grad) + sizeof(double) && !(p->clip_grad >= 0))
        return bg_error(BG_ERR_INVALID, "clip_grad must be >= 0 (got %g; 0: no clipping)", p->clip_grad);
    return BG_OK;
}

/* The job's groups: this rank's data-parallel group (none when the
 * replicas do not reduce among themselves) and the world. */
static bg_status_t make_groups(exec_t *x)
{
    int *ranks = malloc((size_t)x->lay.world * sizeof(int)); /* dp x cp <= world */
    BG_ALLOC_CHECK(ranks, (size_t)x->lay.world * sizeof(int), "group ranks");
    int n = bg__layout_dp_ranks(&x->lay, ranks);
    bg_status_t st = n > 0 ? bg_group_create(x->comm, n, ranks, &x->dp_group) : BG_OK;
    for (int r = 0; st == BG_OK && r < x->lay.world; r++)
        ranks[r] = r;
    if (st == BG_OK)
        st = bg_group_create(x->comm, x->lay.world, ranks, &x->world_group);
    free(ranks);
    return st;
}

/* The per-microbatch bookkeeping of a chunk's slots. */
static bg_status_t alloc_slots(exec_t *x, chunk_t *ch)
{
    size_t M = (size_t)x->M;
    ch->act_recv = calloc(M, sizeof(void *));
    ch->grad_recv = calloc(M, sizeof(void *));
    ch->act_send = calloc(M, sizeof(void *));
    ch->grad_send = calloc(M, sizeof(void *));
    ch->out = calloc(M, sizeof(float *));
    ch->din = calloc(M, sizeof(float *));
    ch->begun = calloc(M, sizeof(int));
    ch->pending_end = calloc(M, sizeof(int));
    ch->out_shape = calloc(M, sizeof(bg_shape_t));
    if (!ch->act_recv || !ch->grad_recv || !ch->act_send || !ch->grad_send || !ch->out || !ch->din || !ch->begun ||
        !ch->pending_end || !ch->out_shape)
        return bg_error(BG_ERR_NOMEM, "executor bookkeeping");
    return BG_OK;
}

/* Model, stage, buckets and bookkeeping of virtual stage `stage` on this
 * rank; the strategies' chunk_model (a model of their own, maybe without a
 * stage) and chunk_optim (the optimizer state) hooks. */
static bg_status_t make_chunk(exec_t *x, chunk_t *ch, int stage)
{
    ch->stage = stage;
    ch->first = x->first[stage];
    ch->last = x->last[stage];
    int ms = bg__layout_model_stage(&x->lay, stage); /* a plan lists each model stage once */
    ch->is_first = ms == 0;
    ch->is_last = ms == x->L - 1;
    ch->copy = bg__layout_copy(&x->lay, stage);
    ch->mb_last = (ch->copy + 1) * (x->M / x->copies) - 1;
    ch->prev_local = !ch->is_first && bg__layout_stage_pp(&x->lay, stage - 1) == x->lay.me.pp;
    ch->next_local = !ch->is_last && bg__layout_stage_pp(&x->lay, stage + 1) == x->lay.me.pp;
    ch->prev_rank = !ch->is_first ? bg__layout_stage_rank(&x->lay, stage - 1, x->lay.me.dp) : -1;
    ch->next_rank = !ch->is_last ? bg__layout_stage_rank(&x->lay, stage + 1, x->lay.me.dp) : -1;
    bg__strategy_t *own = BG__ONE(x, chunk_model);
    if (own) {
        BG_CHECK(own->ops->chunk_model(x, own->self, ch));
        if (!ch->st)
            return BG_OK; /* a model that runs nothing (a parameter server's tensors) */
    } else {
        BG_CHECK(bg_model_create(x->desc, x->be, ch->first, ch->last, &ch->model));
        BG_CHECK(bg_stage_create(ch->model, x->M, &ch->st));
    }
    const bg_executor_params_t *p = &x->p;
    /* dualpipe: both copies of a model stage recompute alike */
    if (p->recompute || (p->recompute_stages && ms < p->nrecompute_stages && p->recompute_stages[ms]))
        bg_stage_set_recompute(ch->st, 1);
    BG_CHECK(bg__exec_make_buckets(x, ch));
    ch->tsq = calloc((size_t)bg_model_num_tensors(ch->model) + 1, sizeof(double));
    BG_ALLOC_CHECK(ch->tsq, sizeof(double), "per-tensor gradient norms");
    BG__EACH_STRATEGY(x, s) if (s->ops->chunk_made) BG_CHECK(s->ops->chunk_made(x, s->self, ch));
    /* optimizer state now, so the activation peak measured later is activations only */
    bg__strategy_t *opt = BG__ONE(x, chunk_optim);
    if (opt)
        BG_CHECK(opt->ops->chunk_optim(x, opt->self, ch));
    else
        BG_CHECK(bg_model_optim_init(ch->model, p->optim.kind));
    BG_CHECK(alloc_slots(x, ch));
    x->params += bg_model_param_count(ch->model);
    return BG_OK;
}

/* The fields of the params, and the schedule: a bad schedule fails before
 * anyone connects. */
static bg_status_t make_schedule(exec_t *x)
{
    if (x->p.schedule_json) { /* the user's program (zero when pin is older than the field) */
        BG_CHECK(bg_schedule_load_program(x->p.schedule_json, x->lay.pp, x->M, x->p.chunks, &x->sched));
    } else {
        bg_schedule_kind_t kind = BG_SCHED_1F1B;
        if (x->p.schedule)
            BG_CHECK(bg_schedule_kind_parse(x->p.schedule, &kind));
        bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
        sp.kind = kind;
        sp.stages = x->lay.pp;
        sp.microbatches = x->M;
        sp.chunks = x->p.chunks;
        BG_CHECK(bg_schedule_generate(&sp, &x->sched));
        BG_CHECK(bg_schedule_validate(x->sched));
    }
    x->V = bg_schedule_chunks(x->sched);
    x->S = bg_schedule_stages(x->sched);
    x->copies = bg_schedule_copies(x->sched);
    x->L = x->S / x->copies;
    if (x->copies > 2 || (x->copies > 1 && x->p.zero >= 2)) /* levels 2 and 3 have no whole gradient buffer */
        return bg_error(BG_ERR_UNSUPPORTED, "%s: %d copies of the model%s", bg_schedule_name(x->sched), x->copies,
                        x->copies > 2 ? " (the executor sums two)" : x->p.zero == 3 ? " with --zero 3 is not supported (--zero 1 is)"
                                                                        : " with --zero 2 is not supported (--zero 1 is)");
    if (x->lay.servers > 0 && x->copies > 1)
        return bg_error(BG_ERR_UNSUPPORTED, "--ps with %s: its two copies of each stage would push every tensor "
                        "twice; not built (every other schedule is)", bg_schedule_name(x->sched));
    if (x->M > 0xfffe || x->S > 0x3ffe) /* the message tags' fields */
        return bg_error(BG_ERR_UNSUPPORTED, "%d microbatches on %d stages: at most 65534 microbatches and 16382 "
                        "stages", x->M, x->S);
    x->first = calloc((size_t)x->S, sizeof(int));
    x->last = calloc((size_t)x->S, sizeof(int));
    if (!x->first || !x->last)
        return bg_error(BG_ERR_NOMEM, "stage table");
    /* layers per model stage; every copy of a stage holds the same layers */
    BG_CHECK(layer_ranges(&x->p, bg_model_desc_num_layers(x->desc), x->L, x->first, x->last));
    for (int s = x->L; s < x->S; s++)
        x->first[s] = x->first[s % x->L], x->last[s] = x->last[s % x->L];
    if (x->p.emulate) {
        BG_CHECK(bg__emulate_load(x->p.emulate, x->p.emulate_scale > 0 ? x->p.emulate_scale : 1.0,
                                  bg_model_desc_num_layers(x->desc), x->first, x->last, x->S, &x->em));
        if (!x->p.schedule_json) /* a generated program is built for the emulated costs */
            BG_CHECK(bg__emulate_regenerate(x->em, &x->sched));
    }
    return BG_OK;
}

/* The job: the communicator, the layout bound to it, the groups, the
 * backend (and its NUMA node), the staging of backend buffers. */
static bg_status_t connect(exec_t *x)
{
    if (x->p.comm) {
        x->comm = x->p.comm;
    } else {
        bg_comm_params_t cp = BG_COMM_PARAMS_INIT;
        cp.ucx_log_handler = x->p.process_wide;
        BG_CHECK(bg_comm_create(&cp, &x->comm));
        x->own_comm = 1;
    }
    bg_log_set_rank(bg_comm_rank(x->comm));
    BG_CHECK(bg__layout_bind(&x->lay, bg_comm_size(x->comm), bg_comm_rank(x->comm)));
    bg__layout_set_schedule(&x->lay, x->sched);
    BG_CHECK(make_groups(x));
    BG_CHECK(bg__exec_agree(x)); /* before any other message: ranks that disagree fail alike, at once */
    x->epoch = bg_comm_epoch_begin(x->comm); /* leave notices name this executor's steps */
    BG_CHECK(bg__tp_create(x->comm, x->desc, x->lay.tp, bg__layout_tp_first(&x->lay), &x->tp));
    int cpr[x->lay.cp];
    bg__layout_cp_ranks(&x->lay, cpr);
    BG_CHECK(bg__cp_create(x->comm, x->desc, x->lay.cp, cpr, x->lay.me.cp, &x->bytes_sent, &x->cp));
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = x->p.threads;
    bp.set_blas_threads = x->p.process_wide;
    bp.tune_malloc = x->p.process_wide;
    bp.device = bg_comm_local_rank(x->comm) < 0 ? 0 : bg_comm_local_rank(x->comm);
    bp.device_wrap = 1; /* ranks share a machine's GPUs round-robin */
    bp.precision = bg_model_desc_precision(x->desc);
    if (x->p.ndevice_mem) { /* none in params older than the field (init_fields zeroes it) */
        if (!x->p.device_mem || (x->p.ndevice_mem != 1 && x->p.ndevice_mem != x->lay.world))
            return bg_error(BG_ERR_INVALID, "device memory caps: %d given for a job of %d ranks (one for every "
                            "rank, or one per rank)", x->p.ndevice_mem, x->lay.world);
        bp.mem_cap = x->p.device_mem[x->p.ndevice_mem == 1 ? 0 : x->lay.rank];
    }
    BG_CHECK(bg_backend_create(x->p.backend ? x->p.backend : "cpu", &bp, &x->be));
    if (x->cp && !x->be->ops->attention_block_forward)
        return bg_error(BG_ERR_UNSUPPORTED, "--cp %d: the %s backend has no ring attention kernels "
                        "(attention_block_forward/backward; the cpu backend has them)", x->lay.cp, x->be->ops->name);
    if (x->p.process_wide) { /* after the backend (its device's node), before the buffers */
        char bus[64];
        int dev_node = bg__numa_device_node(x->be, "/sys", bus, sizeof(bus));
        BG_CHECK(bg__numa_bind(bg_comm_local_rank(x->comm), dev_node, bus, &x->numa_node));
    }
    BG_CHECK(bg__staging_init(&x->stg, x->be, x->comm));
    if (x->stg.on && x->lay.world > 1)
        bg_log(BG_LOG_INFO, "executor", "rank %d: UCX %s; sends and receives of device buffers %s", x->lay.rank,
               bg_transport_ucx_version(),
               x->stg.direct ? "hand the buffer to UCX (reductions staged)" : "staged through host memory");
    /* the strategies' collectives on the backend's buffers, a provider per group (logged) */
    if (x->dp_group)
        BG_CHECK(bg__dcoll_create(&x->stg, x->dp_group, "data-parallel", x->lay.rank, &x->dp_coll));
    return bg__tp_bind(x->tp, &x->stg, x->lay.rank);
}

/* The batch buffers and this rank's chunks, then the strategies' ready hooks. */
static bg_status_t make_chunks(exec_t *x)
{
    const bg_model_desc_params_t *mp = bg_model_desc_params(x->desc);
    size_t per = (size_t)x->mbn * (size_t)x->Tmax;
    x->per_mb_floats = per;
    x->tokens = malloc(per * sizeof(int32_t));
    x->targets = malloc(per * sizeof(int32_t));
    x->features = x->tokens_in ? NULL : malloc(per * (size_t)mp->features * sizeof(float));
    x->chunks = calloc((size_t)x->V, sizeof(chunk_t));
    if (!x->tokens || !x->targets || (!x->tokens_in && !x->features) || !x->chunks)
        return bg_error(BG_ERR_NOMEM, "executor buffers");
    for (int v = 0; v < x->V; v++) {
        int stage = bg__layout_chunk_stage(&x->lay, x->lay.me.pp, v);
        BG_CHECK(make_chunk(x, &x->chunks[v], stage));
        x->has_first |= x->chunks[v].is_first;
        x->has_last |= x->chunks[v].is_last;
    }
    BG__EACH_STRATEGY(x, s) if (s->ops->ready) BG_CHECK(s->ops->ready(x, s->self));
    return BG_OK;
}

/* BRIGADE_TP_OVERLAP=microbatch: the two lanes, where they are built. */
static bg_status_t make_pair(exec_t *x)
{
    if ((x->lay.tp == 1 && x->p.ep <= 1) || BG__ONE(x, step) ||
        strcmp(bg_config_str("BRIGADE_TP_OVERLAP"), "microbatch") != 0)
        return BG_OK;
    const char *no = x->p.zero && x->lay.dp > 1 ? "--zero"
                     : x->p.offload & BG_OFFLOAD_ACTIVATIONS               ? "--offload activations"
                     : x->lay.servers                                      ? "--ps"
                     : x->be->ops->event_record                            ? "a backend that queues work"
                                                                           : NULL;
    if (no) { /* each would put collectives of its own inside both lanes, or the lanes' work on one queue */
        bg_log(BG_LOG_WARN, "executor", "BRIGADE_TP_OVERLAP=microbatch is not built with %s: rank %d overlaps "
                                        "as with =weight", no, x->lay.rank);
        return BG_OK;
    }
    return bg__pair_create((size_t)8 << 20, &x->pair);
}

/* The FLOPs of a step (the model's profile at the first microbatch's length). */
static bg_status_t count_flops(exec_t *x)
{
    int L = bg_model_desc_num_layers(x->desc), cnt;
    bg_layer_profile_t *prof = calloc((size_t)L, sizeof(*prof));
    if (!prof)
        return bg_error(BG_ERR_NOMEM, "profile");
    int T0 = 0;
    bg_status_t st = bg__exec_seq_len(x, 0, 0, &T0);
    if (st == BG_OK)
        st = bg_model_profile(x->desc, x->p.batch / x->M, T0, prof, L, &cnt);
    for (int i = 0; st == BG_OK && i < cnt; i++)
        x->flops_per_step += (prof[i].fwd_flops + prof[i].bwd_flops) * x->M;
    free(prof);
    return st;
}

static void init_fields(exec_t *x, const bg_executor_params_t *pin)
{
    memcpy(&x->p, pin, pin->size < sizeof(x->p) ? pin->size : sizeof(x->p));
    x->p.size = sizeof(x->p);
    if (x->p.ep < 1) /* params older than the field */
        x->p.ep = 1;
    x->desc = x->p.model;
    x->shared_step = -1;
    x->fetched_step = -1;
    x->data_position = -1;
    x->numa_node = -1;
    if (x->p.cp < 1) /* params older than the field */
        x->p.cp = 1;
    bg__layout_init(&x->lay, x->p.pp, x->p.dp, x->p.cp, x->p.tp, x->p.ps);
    if (x->p.zero && x->lay.dp == 1) {
        bg_log(BG_LOG_INFO, "train", "--zero %d with dp = 1 changes nothing (one replica holds everything)", x->p.zero);
        x->p.zero = 0;
    }
    x->M = x->p.microbatches;
    const bg_model_desc_params_t *mp = bg_model_desc_params(x->desc);
    x->tokens_in = mp->input == BG_INPUT_TOKENS;
    x->vocab = mp->vocab;
    x->Tmax = mp->seq_len;
    x->classes = bg_model_desc_classes(x->desc);
    x->mbn = x->p.batch / (x->lay.dp * x->M);
}

bg_status_t bg_executor_create(const bg_executor_params_t *pin, bg_executor_t **x_p)
{
    if (!pin || pin->size < offsetof(bg_executor_params_t, process_wide) + sizeof(int))
        return bg_error(BG_ERR_INVALID, "bg_executor_create: params missing or older than this library (initialise "
                                        "them with BG_EXECUTOR_PARAMS_INIT)");
    BG_CHECK(check_params(pin));
    exec_t *x = calloc(1, sizeof(*x));
    BG_ALLOC_CHECK(x, sizeof(*x), "executor");
    bg_status_t st = BG_OK;
    init_fields(x, pin);
    BG_CHECK_GOTO(make_schedule(x), st, err);
    BG_CHECK_GOTO(connect(x), st, err);
    BG_CHECK_GOTO(bg__strategies_select(x), st, err); /* each strategy's private state */
    BG_CHECK_GOTO(make_chunks(x), st, err);
    if (x->p.trace_path)
        BG_CHECK_GOTO(bg__trace_create(x->comm, x->lay.rank, &x->trace), st, err);
    BG_CHECK_GOTO(make_pair(x), st, err);
    bg__tp_set_trace(x->tp, x->trace, &x->step);
    int program = BG__ONE(x, step) == NULL; /* a rank whose step a strategy owns runs no program */
    if (program)
        BG_CHECK_GOTO(predict_activations(x), st, err);
    BG_CHECK_GOTO(count_flops(x), st, err);
    x->ops = bg_schedule_rank_ops(x->sched, x->lay.me.pp, &x->nops);
    if (!program)
        x->nops = 0;
    x->act_base = bg_backend_memstats(x->be).current;
    bg_backend_reset_peak(x->be);
    *x_p = x;
    return BG_OK;
err:
    exec_free(x);
    if (x->own_comm && x->comm) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s", bg_last_error());
        bg_comm_destroy(x->comm);
        bg_error(st, "%s", msg); /* keep the first failure's message */
    }
    free(x);
    return st;
}


/* A failed step: an error of this rank (not a peer's) stops the others at
 * once, with its message; what is in flight is cancelled. */
bg_status_t bg__exec_step_failed(exec_t *x, bg_status_t st)
{
    if (st != BG_ERR_PEER && x->lay.world > 1) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s", bg_last_error());
        bg_comm_abort(x->comm, msg);
        bg_error(st, "%s", msg);
    }
    cancel_all(x);
    x->broken = 1;
    return st;
}

/* The fields every step's result has: the step done, its tokens and time. */
bg_step_result_t bg__exec_step_result(const exec_t *x, double tokens, double dt)
{
    bg_step_result_t r = {0};
    r.step = x->step;
    r.tokens = tokens;
    r.step_ms = dt * 1e3;
    r.tokens_per_s = dt > 0 ? tokens / dt : 0;
    r.peak_bytes = bg_backend_memstats(x->be).peak;
    return r;
}

/* The program's end: the losses a queueing backend kept on the device, in
 * the order their forwards ran (add_loss), into x->loss; then the backend's
 * queue drained and its sticky error read (a device fault: the losses are
 * not the program's). */
bg_status_t bg__exec_sum_losses(exec_t *x)
{
    for (int k = 0; k < x->loss_k; k++) {
        int mb = x->loss_mb[k];
        x->loss += x->be->ops->sum(x->be, x->loss_dev + (size_t)mb * x->per_mb_floats, x->loss_n[mb]) *
                   (double)x->loss_scale;
    }
    x->loss_k = 0;
    x->be->ops->synchronize(x->be);
    return bg_backend_status(x->be);
}

/* This rank's program, once: each instruction through the interpreter's
 * table (bg__exec_run_op), receives posted ahead, the slots whose sends
 * completed ended; paired instructions as two lanes. */
static bg_status_t run_program(exec_t *x)
{
    bg_status_t st;
    for (size_t i = 0; i < x->nops; i++) {
        const bg_sched_op_t *op = &x->ops[i];
        bg__staging_progress(&x->stg); /* sends and reductions whose copies completed leave now */
        BG_CHECK(bg__exec_post_ahead(x, i));
        size_t j = x->pair ? bg_sched_pair_partner(x->ops, x->nops, i) : 0;
        if (j) {
            BG_CHECK(bg__exec_post_ahead(x, j));
            if ((st = bg__exec_run_pair(x, i, j)) != BG_OK)
                return bg__exec_op_failed(x, st, op, NULL);
            BG_CHECK(bg__exec_reap_pending(x, 2));
            i = j;
            continue;
        }
        int compute = op->kind <= BG_OP_BACKWARD_WEIGHT || op->kind == BG_OP_OPTIMIZER_STEP;
        double a = bg_now();
        st = bg__exec_run_op(x, op);
        double b = bg_now();
        if (st != BG_OK)
            return bg__exec_op_failed(x, st, op, op);
        if (compute)
            x->busy += b - a;
        if (x->trace)
            bg__trace_event(x->trace, bg__exec_op_label(op->kind), op->microbatch, op->stage, a, b, (int)x->step + 1);
        /* a compute instruction is over: the slots sent before it end now, done or not */
        BG_CHECK(bg__exec_reap_pending(x, op->kind <= BG_OP_BACKWARD_WEIGHT ? 2 : 0));
    }
    return bg__exec_reap_pending(x, 1);
}

/* The default step end: the step's loss (the last stage of each replica
 * holds its share), the squared gradient norm (each rank's chunks, in
 * chunk order; the optimizer steps leave 0 where a rank's chunk does not
 * count), whether any rank was asked to stop and the host's per-step values
 * to compare (bg_executor_set_lr): one fp64 allreduce, so all agree. The loss is reported in fp32: each share is rounded to fp32 before
 * the sum and the sum after it, as when it travelled as fp32. */
static bg_status_t step_end(exec_t *x, double t0, double tokens, bg_step_result_t *result_p)
{
    int64_t step = x->step;
    bg_status_t st = BG_OK;
    double dt = bg_now() - t0;
    if (x->trace)
        bg__trace_event(x->trace, "step", -1, -1, t0, t0 + dt, (int)step + 1);
    double gsq = 0;
    for (int v = 0; v < x->V; v++)
        gsq += x->chunks[v].gsq;
    /* the host's per-step values ride along, to be compared (exec_agree.c) */
    double red[3 + BG__STEP_AGREE_DOUBLES] = {(double)(float)x->loss, x->stop_req ? 1.0 : 0.0, gsq};
    if (x->lay.world > 1) {
        bg__exec_step_agree_pack(x, red + 3);
        BG_CHECK_GOTO(bg_group_allreduce(x->world_group, red, 3 + BG__STEP_AGREE_DOUBLES, BG_F64, BG_REDUCE_SUM),
                      st, fail);
        BG_CHECK_GOTO(bg__exec_step_agree_check(x, red + 3), st, fail);
    }
    gsq = red[2];
    x->step = step + 1;
    bg_step_result_t r = bg__exec_step_result(x, tokens, dt);
    r.loss = (float)red[0];
    r.bubble = dt > 0 ? 1.0 - x->busy / dt : 0;
    r.bytes_sent = x->bytes_sent;
    r.stop = red[1] > 0;
    r.grad_norm = x->p.clip_grad > 0 ? x->clip_norm : sqrt(gsq); /* clipping: the exact sum's */
    *result_p = r;
    return BG_OK;
fail:
    return bg__exec_step_failed(x, st);
}

/* The MoE layers' running totals over the tree of l (bg_moe_stats_t): aux, forwards, dropped. */
static void moe_totals(const bg_layer_t *l, double t[3])
{
    bg_moe_stats_t s;
    if (bg_layer_is_moe(l) && bg_layer_moe_stats(l, &s) == BG_OK)
        t[0] += s.aux_total, t[1] += (double)s.forwards, t[2] += (double)s.dropped_total;
    for (int i = 0; i < l->nchildren; i++)
        moe_totals(l->children[i], t);
}

/* This rank's MoE totals over its chunks (both copies of DualPipe's: each runs its own microbatches). */
static void exec_moe_totals(const exec_t *x, double t[3])
{
    t[0] = t[1] = t[2] = 0;
    for (int v = 0; v < x->V; v++)
        for (int i = x->chunks[v].first; i <= x->chunks[v].last; i++)
            moe_totals(bg_model_layer(x->chunks[v].model, i), t);
}

/* The step's MoE figures from the totals at its start. */
static void moe_step(const exec_t *x, const double t0[3], bg_step_result_t *r)
{
    double t[3];
    exec_moe_totals(x, t);
    r->moe_aux = t[1] > t0[1] ? (t[0] - t0[0]) / (t[1] - t0[1]) : NAN;
    r->moe_dropped = (int64_t)(t[2] - t0[2]);
}

bg_status_t bg_executor_step(bg_executor_t *x, bg_step_result_t *result_p)
{
    double moe0[3];
    exec_moe_totals(x, moe0); /* the step's forwards only: an evaluation between steps runs forwards too */
    if (x->broken)
        return bg_error(BG_ERR_INVALID, "executor: an earlier step failed; destroy it and resume from a checkpoint");
    bg_status_t st = BG_OK;
    int64_t step = x->step;
    /* a rank that left before this step fails it now (and while in it, through the transport) */
    if (x->lay.world > 1 && (st = bg_comm_enter_step(x->comm, x->epoch, step + 1)) != BG_OK)
        return bg__exec_step_failed(x, st);
    double tokens;
    BG_CHECK(bg__exec_step_tokens(x, step, &tokens));
    bg__strategy_t *own = BG__ONE(x, step); /* a rank that runs no program */
    if (own) {
        if ((st = own->ops->step(x, own->self, tokens, result_p)) != BG_OK)
            return st;
        moe_step(x, moe0, result_p);
        BG_CHECK_GOTO(bg_backend_status(x->be), st, fail); /* what the backend recorded so far; no wait */
        return BG_OK;
    }
    x->loss_scale = (float)(1.0 / tokens);
    x->loss = 0;
    x->loss_k = 0;
    x->busy = 0;
    x->bytes_sent = 0;
    double t0 = bg_now();
    BG__EACH_STRATEGY(x, s) if (s->ops->step_begin && (st = s->ops->step_begin(x, s->self)) != BG_OK) goto fail;
    for (int v = 0; v < x->V; v++) {
        bg_model_zero_grads(x->chunks[v].model);
        x->chunks[v].gsq = 0;
    }
    BG_CHECK_GOTO(run_program(x), st, fail);
    BG_CHECK_GOTO(bg__exec_sum_losses(x), st, fail); /* a device fault: the losses are not the step's */
    if (x->p.clip_grad > 0) /* the updates the optimizer instructions left for the global norm */
        BG_CHECK_GOTO(bg__exec_clip(x), st, fail);
    bg__strategy_t *end = BG__ONE(x, step_end);
    st = end ? end->ops->step_end(x, end->self, t0, tokens, result_p) : step_end(x, t0, tokens, result_p);
    if (st != BG_OK)
        return st; /* step_end reported it to the others */
    moe_step(x, moe0, result_p);
    /* faults the backend has recorded so far, without waiting for the optimizer's queued update: a later
     * one fails the next step's program or a save (bg__exec_settle), before anything reads the weights */
    BG_CHECK_GOTO(bg_backend_status(x->be), st, fail);
    return BG_OK;
fail:
    return bg__exec_step_failed(x, st);
}

void bg_executor_set_lr(bg_executor_t *x, float lr) { x->p.optim.lr = lr; }
void bg_executor_request_stop(bg_executor_t *x) { x->stop_req = 1; }
void bg_executor_set_data_position(bg_executor_t *x, int64_t position) { x->data_position = position; }
int64_t bg_executor_steps_done(const bg_executor_t *x) { return x->step; }
int bg_executor_rank(const bg_executor_t *x) { return x->lay.rank; }
bg_comm_t *bg_executor_comm(bg_executor_t *x) { return x->comm; }

void bg_executor_info(bg_executor_t *x, bg_executor_info_t *info_p)
{
    bg_executor_info_t i;
    memset(&i, 0, sizeof(i));
    i.rank = x->lay.rank;
    i.world = x->lay.world;
    i.pp_rank = x->lay.me.pp;
    i.dp_rank = x->lay.me.dp;
    i.stages = x->S;
    i.chunks = x->V;
    i.params = x->params;
    i.flops_per_step = x->flops_per_step;
    i.predicted_act_bytes = x->predicted_act_bytes;
    /* parameter bytes, optimizer elements, gradient bytes */
    size_t params = x->params * sizeof(float), optim = x->params, grads = x->params * sizeof(float);
    BG__EACH_STRATEGY(x, s) if (s->ops->memory) s->ops->memory(x, s->self, &params, &optim, &grads);
    /* a backend that queues work keeps the last stage's per-microbatch losses until the step's end (add_loss:
     * tensor rank 0's, not under emulation) */
    size_t losses = x->has_last && !x->em && x->lay.me.tp == 0 && x->be->ops->event_record
                        ? (size_t)x->M * x->per_mb_floats * sizeof(float) : 0;
    i.predicted_bytes = params + grads + optim * bg_optim_state_bytes(x->p.optim.kind) +
                        x->predicted_act_bytes + losses;
    i.zero = x->p.zero;
    i.predicted_stashed = x->predicted_stashed;
    i.peak_stashed = x->peak_stashed;
    size_t peak = bg_backend_memstats(x->be).peak;
    i.peak_act_bytes = peak > x->act_base ? peak - x->act_base : 0;
    i.numa_node = x->numa_node;
    i.schedule = bg_schedule_name(x->sched);
    *info_p = i;
}

bg_status_t bg_executor_destroy(bg_executor_t *x)
{
    if (!x)
        return BG_OK;
    /* tell the others after which step this rank stops: a rank in a later step fails at once instead of
     * waiting for BRIGADE_TIMEOUT (first: settling may wait on them). Not the workers and servers of
     * --ps, whose ranks may leave at their own steps (the servers deliver what the workers pushed). */
    if (!x->broken && x->lay.world > 1 && x->lay.servers == 0)
        bg_comm_announce_leave(x->comm, x->epoch, x->step);
    if (x->broken)
        cancel_all(x);
    else if (bg__exec_settle(x) != BG_OK)
        cancel_all(x);
    BG__EACH_STRATEGY(x, s) if (s->ops->finish) s->ops->finish(x, s->self, x->broken);
    exec_free(x);
    bg_status_t st = BG_OK;
    if (x->own_comm)
        st = bg_comm_destroy(x->comm);
    free(x);
    return st;
}
