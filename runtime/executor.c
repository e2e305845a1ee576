/* runtime/executor.c: pipeline- and data-parallel training. Each rank walks
 * its program from the schedule generator (the same program the simulator
 * runs): receives are posted ahead, sends never block, compute runs on the
 * rank's stages (one per model chunk), and each chunk's gradients are
 * all-reduced over its data-parallel group without blocking as soon as its
 * last backward piece is done, so the reduction overlaps the pipeline's drain.
 *
 * Layout (ARCHITECTURE.md): world = pp x dp (tp = 1 for now),
 * rank = pp_i * dp + dp_i. Data: replica d takes sequences
 * [d*B/D, (d+1)*B/D) of each step's global batch, in M microbatches.
 * The loss scale is 1 / (tokens of the global batch) on every replica and the
 * reduction is a sum, so the arithmetic of a stage's gradients is the one of
 * a single process for dp = 1 (bitwise), and within rounding for dp > 1.
 *
 * Shapes: a microbatch's sequence length is a pure function of (step, mb)
 * (bg_train_seq_len), so every rank knows every message's size without a
 * header: variable lengths cost nothing on the wire.
 *
 * Tags: bit 31 step parity, bit 30 direction (0 act, 1 grad), bits 16..29
 * the receiving stage, bits 0..15 the microbatch. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/checkpoint.h"
#include "brigade/schedule.h"
#include "brigade/train.h"
#include "brigade/transport.h"
#include "core/check.h"
#include "runtime/numa.h"
#include "runtime/trace.h"

double bg__train_step_tokens(const bg_train_config_t *c, int64_t step);
void bg__train_config_json(const bg_model_config_t *m, char *buf, size_t n);

typedef struct chunk {
    int stage;              /* virtual stage */
    int first, last;        /* layer range */
    bg_model_t *model;
    bg_stage_t *st;
    int is_first, is_last;  /* first / last stage of the whole pipeline */
    int prev_local, next_local; /* stage-1 / stage+1 live on this rank */
    int prev_rank, next_rank;   /* ranks of the neighbouring stages */
    /* per microbatch */
    bg_request_t **act_recv, **grad_recv, **act_send, **grad_send;
    float **out;            /* forward output (valid until the slot ends) */
    float **din;            /* input gradient (valid until the slot ends) */
    int *begun, *pending_end;
    bg_shape_t *out_shape;
    void *hook;             /* hook_arg_t of the layer-done callback */
    /* gradient buckets: contiguous layer ranges, last layers first */
    struct bucket {
        int lo, hi;           /* layers */
        size_t off, count;    /* floats of the flat gradient buffer */
        bg_request_t *req;
        int started;
    } *buckets;
    int nbuckets;
} chunk_t;

typedef struct exec {
    const bg_train_config_t *c;
    bg_comm_t *comm;
    bg_group_t *dp_group, *world_group;
    bg_backend_t *be;
    bg_schedule_t *sched;
    int rank, world, pp_i, dp_i, P, D, V, M, S;
    chunk_t *chunks;        /* V */
    bg_data_t *data;
    int mbn;                /* sequences per microbatch per replica */
    int64_t step;
    float loss_scale;
    double loss;            /* this rank's share of the step's loss */
    int32_t *tokens, *targets;
    float *inputs;
    bg_trace_t *trace;
    int stashed, peak_stashed;
    float *tie_buf;         /* the partner's tied-embedding gradient */
    int64_t tie_step;       /* step whose tied gradients were summed locally */
    double busy;            /* compute seconds in the step */
    uint64_t bytes_sent;    /* point-to-point bytes sent in the step */
} exec_t;

static chunk_t *chunk_of_stage(exec_t *x, int stage)
{
    for (int i = 0; i < x->V; i++)
        if (x->chunks[i].stage == stage)
            return &x->chunks[i];
    return NULL;
}

static uint32_t tag_of(exec_t *x, int grad, int recv_stage, int mb)
{
    return ((uint32_t)(x->step & 1) << 31) | ((uint32_t)grad << 30) | ((uint32_t)(recv_stage & 0x3fff) << 16) |
           (uint32_t)(mb & 0xffff);
}

/* Shape of the input of stage `stage` for microbatch mb of this step. */
static bg_status_t input_shape(exec_t *x, chunk_t *ch, int mb, bg_shape_t *shape_p)
{
    int T = bg_train_seq_len(x->c, x->step, mb);
    bg_shape_t s = bg_model_input_shape(ch->model, x->mbn, T);
    /* walk the layers before this stage (descriptors of the full model) */
    for (int i = 0; i < ch->first; i++)
        BG_CHECK(bg_layer_out_shape(bg_model_layer(ch->model, i), s, &s));
    *shape_p = s;
    return BG_OK;
}

static bg_status_t begin_slot(exec_t *x, chunk_t *ch, int mb, float **in_p)
{
    if (ch->begun[mb]) {
        *in_p = NULL;
        return BG_OK;
    }
    bg_shape_t s;
    BG_CHECK(input_shape(x, ch, mb, &s));
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
    return bg_irecv(x->comm, ch->prev_rank, tag_of(x, 0, ch->stage, mb), in, bg_shape_numel(s) * sizeof(float),
                    &ch->act_recv[mb]);
}

static bg_status_t post_grad_recv(exec_t *x, chunk_t *ch, int mb)
{
    if (ch->grad_recv[mb] || !ch->begun[mb])
        return BG_OK; /* posted when the slot exists */
    float *dout;
    BG_CHECK(bg_stage_grad_buffer(ch->st, mb, &dout));
    bg_shape_t s, o;
    BG_CHECK(bg_stage_slot_shapes(ch->st, mb, &s, &o));
    return bg_irecv(x->comm, ch->next_rank, tag_of(x, 1, ch->stage, mb), dout, bg_shape_numel(o) * sizeof(float),
                    &ch->grad_recv[mb]);
}

static bg_status_t wait_free(bg_request_t **rq)
{
    if (!*rq)
        return BG_OK;
    bg_status_t st = bg_wait(*rq);
    bg_request_free(*rq);
    *rq = NULL;
    return st;
}

/* End a slot once its outgoing messages are done. */
static bg_status_t end_slot(exec_t *x, chunk_t *ch, int mb, int split)
{
    BG_CHECK(wait_free(&ch->act_send[mb]));
    BG_CHECK(wait_free(&ch->grad_send[mb]));
    if (!split)
        bg_stage_end(ch->st, mb);
    ch->begun[mb] = 0;
    ch->out[mb] = ch->din[mb] = NULL;
    return BG_OK;
}

/* Fused backward slots whose din is still being sent end later. */
static bg_status_t reap_pending(exec_t *x, int force)
{
    for (int v = 0; v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        for (int mb = 0; mb < x->M; mb++) {
            if (!ch->pending_end[mb])
                continue;
            if (!force) {
                int done = 0;
                if (!ch->grad_send[mb])
                    continue; /* its SEND_GRAD is not issued yet */
                BG_CHECK(bg_test(ch->grad_send[mb], &done));
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
static bg_status_t post_ahead(exec_t *x, const bg_sched_op_t *ops, size_t n, size_t i)
{
    int computes = 0;
    for (size_t j = i; j < n && computes < 2; j++) {
        const bg_sched_op_t *o = &ops[j];
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

static bg_status_t do_forward(exec_t *x, chunk_t *ch, int mb)
{
    bg_backend_t *be = x->be;
    float *in;
    BG_CHECK(begin_slot(x, ch, mb, &in));
    int T = bg_train_seq_len(x->c, x->step, mb);
    int first_seq = x->dp_i * (x->c->batch / x->D) + mb * x->mbn;
    int gpt = x->c->model.kind == BG_MODEL_GPT;
    if (ch->is_first || ch->is_last)
        BG_CHECK(bg_data_batch(x->data, x->step, first_seq, x->mbn, T, x->tokens, x->inputs, x->targets));
    if (ch->is_first && !gpt)
        be->ops->from_host(be, in, x->inputs, (size_t)x->mbn * x->c->model.in_features * sizeof(float));
    if (ch->is_first || ch->is_last)
        BG_CHECK(bg_stage_set_data(ch->st, mb, ch->is_first && gpt ? x->tokens : NULL,
                                   ch->is_last ? x->targets : NULL, x->loss_scale));
    if (!ch->is_first && !ch->prev_local)
        BG_CHECK(wait_free(&ch->act_recv[mb]));
    BG_CHECK(bg_stage_forward(ch->st, mb, &ch->out[mb], &ch->out_shape[mb]));
    /* stashed from its forward to its last backward piece, as the simulator counts */
    if (++x->stashed > x->peak_stashed)
        x->peak_stashed = x->stashed;
    if (ch->is_last)
        x->loss += be->ops->sum(be, ch->out[mb], bg_shape_numel(ch->out_shape[mb])) * (double)x->loss_scale;
    if (!ch->is_last && ch->next_local) {
        /* the next stage is ours: hand the output over now */
        chunk_t *nx = chunk_of_stage(x, ch->stage + 1);
        float *nin;
        BG_CHECK(begin_slot(x, nx, mb, &nin));
        be->ops->copy(be, nin, ch->out[mb], bg_shape_numel(ch->out_shape[mb]));
    }
    return BG_OK;
}

static bg_status_t do_backward(exec_t *x, chunk_t *ch, int mb, int split)
{
    bg_backend_t *be = x->be;
    if (!ch->is_last && !ch->next_local)
        BG_CHECK(wait_free(&ch->grad_recv[mb]));
    float *din;
    if (split)
        BG_CHECK(bg_stage_backward_input(ch->st, mb, &din));
    else
        BG_CHECK(bg_stage_backward(ch->st, mb, &din));
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
    else if (!split)
        ch->pending_end[mb] = 1; /* after its SEND_GRAD completes */
    return BG_OK;
}

static bg_status_t do_weight(exec_t *x, chunk_t *ch, int mb)
{
    BG_CHECK(wait_free(&ch->grad_send[mb])); /* W frees din */
    BG_CHECK(wait_free(&ch->act_send[mb]));
    BG_CHECK(bg_stage_backward_weight(ch->st, mb));
    x->stashed--;
    return end_slot(x, ch, mb, 1);
}

/* Start the data-parallel sum of every bucket whose layers are all >= layer. */
static bg_status_t start_buckets(exec_t *x, chunk_t *ch, int layer)
{
    for (int b = 0; b < ch->nbuckets; b++) {
        struct bucket *bk = &ch->buckets[b];
        if (bk->started || bk->lo < layer)
            continue;
        bk->started = 1;
        if (x->D > 1 && bk->count) {
            BG_CHECK(bg_group_iallreduce(x->dp_group, bg_model_grads(ch->model) + bk->off, bk->count, BG_REDUCE_SUM,
                                         &bk->req));
            if (x->trace) { /* the moment the bucket's reduction starts (microbatch field: bucket index) */
                double now = bg_now();
                bg_trace_event(x->trace, "ar_start", b, ch->stage, now, now, (int)x->step + 1);
            }
        }
    }
    return BG_OK;
}

static bg_status_t wait_buckets(exec_t *x, chunk_t *ch)
{
    bg_status_t st = BG_OK;
    for (int b = 0; b < ch->nbuckets; b++) {
        double t0 = bg_now();
        int had = ch->buckets[b].req != NULL;
        bg_status_t s2 = wait_free(&ch->buckets[b].req);
        if (x->trace && had) /* time spent waiting for the reduction after the backward */
            bg_trace_event(x->trace, "ar_wait", b, ch->stage, t0, bg_now(), (int)x->step + 1);
        if (st == BG_OK)
            st = s2;
        ch->buckets[b].started = 0;
    }
    return st;
}

typedef struct {
    exec_t *x;
    chunk_t *ch;
} hook_arg_t;

/* The stage calls this after each layer's weight gradient: once the last
 * microbatch has finished a bucket's layers, its reduction starts, while the
 * backward of the layers below (and the pipeline's drain) goes on. */
static bg_status_t on_layer_done(int layer, int mb, void *arg)
{
    hook_arg_t *h = arg;
    if (mb != h->x->M - 1 || h->x->D == 1)
        return BG_OK;
    return start_buckets(h->x, h->ch, layer);
}

/* Buckets of about BRIGADE_BUCKET_MB over the chunk's layers, from the last. */
static bg_status_t make_buckets(chunk_t *ch)
{
    long long mb = 4;
    if (bg_config_int("BRIGADE_BUCKET_MB", &mb) != BG_OK || mb < 0)
        mb = 4;
    size_t target = (size_t)mb * 1048576 / sizeof(float);
    int n = ch->last - ch->first + 1;
    size_t *off = calloc((size_t)n + 1, sizeof(size_t));
    ch->buckets = calloc((size_t)n, sizeof(*ch->buckets));
    if (!off || !ch->buckets) {
        free(off);
        return bg_error(BG_ERR_NOMEM, "gradient buckets");
    }
    for (int i = 0; i < n; i++)
        off[i + 1] = off[i] + bg_layer_param_count(bg_model_layer(ch->model, ch->first + i));
    int hi = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        if (i == 0 || off[hi + 1] - off[i] >= target) {
            struct bucket *bk = &ch->buckets[ch->nbuckets++];
            bk->lo = ch->first + i;
            bk->hi = ch->first + hi;
            bk->off = off[i];
            bk->count = off[hi + 1] - off[i];
            hi = i - 1;
        }
    }
    free(off);
    return BG_OK;
}

/* Tied embeddings: before the optimizer step of the chunk holding stage 0
 * (embed.wte) or stage S-1 (head.weight), both gradients become embed + head
 * (after the data-parallel sum), by a device add when one rank holds both,
 * else by exchanging them with the partner rank (same replica). */
static bg_status_t tie_grads(exec_t *x, chunk_t *ch)
{
    if (!x->c->model.tie_embeddings || x->c->model.kind != BG_MODEL_GPT || (!ch->is_first && !ch->is_last))
        return BG_OK;
    bg_backend_t *be = x->be;
    if (ch->is_first && ch->is_last) {
        bg_model_tie_grads_local(ch->model);
        return BG_OK;
    }
    chunk_t *other = chunk_of_stage(x, ch->is_first ? x->S - 1 : 0);
    if (other) { /* both on this rank (V-shape, or one pipeline rank) */
        if (x->tie_step == x->step)
            return BG_OK;
        BG_CHECK(wait_buckets(x, other));
        chunk_t *fc = ch->is_first ? ch : other, *lc = ch->is_first ? other : ch;
        bg_param_t *e = bg_model_find_tensor(fc->model, "embed.wte"), *h = bg_model_find_tensor(lc->model, "head.weight");
        be->ops->residual_forward(be, e->grad, e->grad, h->grad, e->numel);
        be->ops->copy(be, h->grad, e->grad, e->numel);
        x->tie_step = x->step;
        return BG_OK;
    }
    bg_param_t *mine = bg_model_find_tensor(ch->model, ch->is_first ? "embed.wte" : "head.weight");
    if (!mine)
        return bg_error(BG_ERR_INTERNAL, "rank %d: tied tensor missing on stage %d", x->rank, ch->stage);
    if (!x->tie_buf && !(x->tie_buf = bg_backend_alloc(be, mine->numel * sizeof(float), "tied gradient")))
        return BG_ERR_NOMEM;
    int partner = bg_schedule_stage_rank(x->sched, ch->is_first ? x->S - 1 : 0) * x->D + x->dp_i;
    uint32_t tag = tag_of(x, 1, 0x3fff, 0xffff);
    bg_request_t *rr = NULL, *sr = NULL;
    size_t bytes = mine->numel * sizeof(float);
    bg_status_t st = bg_irecv(x->comm, partner, tag, x->tie_buf, bytes, &rr);
    if (st == BG_OK)
        st = bg_isend(x->comm, partner, tag, mine->grad, bytes, &sr);
    x->bytes_sent += bytes;
    bg_status_t st1 = wait_free(&rr), st2 = wait_free(&sr);
    if (st == BG_OK)
        st = st1 != BG_OK ? st1 : st2;
    if (st != BG_OK)
        return st;
    if (ch->is_first)
        be->ops->residual_forward(be, mine->grad, mine->grad, x->tie_buf, mine->numel); /* e + h */
    else
        be->ops->residual_forward(be, mine->grad, x->tie_buf, mine->grad, mine->numel); /* e + h */
    return BG_OK;
}

static const char *op_label(int kind)
{
    switch (kind) {
    case BG_OP_FORWARD: return "F";
    case BG_OP_BACKWARD: return "BW";
    case BG_OP_BACKWARD_INPUT: return "B";
    case BG_OP_BACKWARD_WEIGHT: return "W";
    case BG_OP_SEND_ACT: return "send_act";
    case BG_OP_RECV_ACT: return "recv_act";
    case BG_OP_SEND_GRAD: return "send_grad";
    case BG_OP_RECV_GRAD: return "recv_grad";
    case BG_OP_REDUCE_GRADS: return "reduce";
    case BG_OP_OPTIMIZER_STEP: return "optimizer";
    }
    return "?";
}

static bg_status_t run_op(exec_t *x, const bg_sched_op_t *o)
{
    chunk_t *ch = chunk_of_stage(x, o->stage);
    if (!ch)
        return bg_error(BG_ERR_INTERNAL, "rank %d: program names stage %d, which this rank does not hold", x->rank,
                        o->stage);
    int mb = o->microbatch;
    bg_shape_t s, so;
    switch (o->kind) {
    case BG_OP_FORWARD: return do_forward(x, ch, mb);
    case BG_OP_BACKWARD: return do_backward(x, ch, mb, 0);
    case BG_OP_BACKWARD_INPUT: return do_backward(x, ch, mb, 1);
    case BG_OP_BACKWARD_WEIGHT: return do_weight(x, ch, mb);
    case BG_OP_SEND_ACT:
        x->bytes_sent += bg_shape_numel(ch->out_shape[mb]) * sizeof(float);
        return bg_isend(x->comm, ch->next_rank, tag_of(x, 0, ch->stage + 1, mb), ch->out[mb],
                        bg_shape_numel(ch->out_shape[mb]) * sizeof(float), &ch->act_send[mb]);
    case BG_OP_SEND_GRAD:
        BG_CHECK(bg_stage_slot_shapes(ch->st, mb, &s, &so));
        x->bytes_sent += bg_shape_numel(s) * sizeof(float);
        return bg_isend(x->comm, ch->prev_rank, tag_of(x, 1, ch->stage - 1, mb), ch->din[mb],
                        bg_shape_numel(s) * sizeof(float), &ch->grad_send[mb]);
    case BG_OP_RECV_ACT:
        BG_CHECK(post_act_recv(x, ch, mb));
        return wait_free(&ch->act_recv[mb]);
    case BG_OP_RECV_GRAD:
        BG_CHECK(post_grad_recv(x, ch, mb));
        if (!ch->grad_recv[mb])
            return bg_error(BG_ERR_INTERNAL, "rank %d: gradient of microbatch %d for stage %d before its forward",
                            x->rank, mb, ch->stage);
        return wait_free(&ch->grad_recv[mb]);
    case BG_OP_REDUCE_GRADS:
        return start_buckets(x, ch, ch->first); /* whatever the backward hook did not start */
    case BG_OP_OPTIMIZER_STEP:
        BG_CHECK(wait_buckets(x, ch));
        BG_CHECK(tie_grads(x, ch));
        return bg_model_optim_step(ch->model, &x->c->optim, (int)x->step + 1);
    }
    return bg_error(BG_ERR_INVALID, "rank %d: unknown instruction kind %d", x->rank, o->kind);
}

/* Layers per virtual stage: explicit split, or as even as possible. */
static bg_status_t layer_ranges(const bg_train_config_t *c, int total, int S, int *first, int *last)
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

/* What the simulator predicts for this rank's activation memory: the peak of
 * stashed microbatches (F to last backward piece) times each stage's stash
 * (input, outputs, layer stashes, data, incoming gradient), plus what lives
 * outside the stash: each stage's scratch, the receive buffers posted one
 * microbatch ahead, and the largest backward temporary. */
static bg_status_t predict_activations(exec_t *x, bg_train_result_t *res)
{
    double *stash = calloc((size_t)x->S, sizeof(double)), *wstash = calloc((size_t)x->S, sizeof(double));
    if (!stash || !wstash) {
        free(stash);
        free(wstash);
        return bg_error(BG_ERR_NOMEM, "stash sizes");
    }
    size_t extra = 0, maxbw = 0;
    bg_status_t st = BG_OK;
    for (int v = 0; v < x->V && st == BG_OK; v++) {
        chunk_t *ch = &x->chunks[v];
        bg_shape_t in;
        bg_stage_mem_t mem;
        int save = (int)x->step;
        x->step = 0;
        st = input_shape(x, ch, 0, &in);
        x->step = save;
        if (st == BG_OK)
            st = bg_stage_memory(ch->st, in, &mem);
        if (st != BG_OK)
            break;
        stash[ch->stage] = (double)(mem.stash + mem.data + mem.dout);
        bg_log(BG_LOG_DEBUG, "memory",
               "stage %d per microbatch: stash %zu data %zu dout %zu; split_bw %zu fused_bw %zu recompute %zu scratch %zu",
               ch->stage, mem.stash, mem.data, mem.dout, mem.split_bw, mem.fused_bw, mem.recompute, mem.scratch);
        /* split schedules hold split_bw from B to W (the simulator counts it);
         * a fused backward's temporary lives during one op */
        wstash[ch->stage] = (double)mem.split_bw;
        size_t bw = mem.fused_bw + mem.recompute;
        if (bw > maxbw)
            maxbw = bw;
        extra += mem.scratch; /* kept by the stage once allocated */
        /* receives posted ahead: the next microbatch's input and gradient buffers */
        if (!ch->is_first && !ch->prev_local)
            extra += bg_shape_numel(in) * sizeof(float);
        extra += mem.dout;
    }
    extra += maxbw;
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    sp.stash_bytes_per_stage = stash;
    sp.wstash_bytes_per_stage = wstash;
    bg_sim_result_t *r = NULL;
    if (st == BG_OK)
        st = bg_schedule_simulate(x->sched, &sp, &r);
    if (st == BG_OK) {
        res->predicted_stashed = bg_sim_peak_stash(r, x->pp_i);
        res->predicted_act_bytes = (size_t)bg_sim_peak_stash_bytes(r, x->pp_i) + extra;
    }
    bg_sim_result_free(r);
    free(stash);
    free(wstash);
    return st;
}

static bg_status_t save_checkpoint(exec_t *x, int64_t steps_done)
{
    const bg_train_config_t *c = x->c;
    bg_model_t **models = malloc((size_t)x->V * sizeof(*models));
    BG_ALLOC_CHECK(models, (size_t)x->V * sizeof(*models), "checkpoint model list");
    for (int v = 0; v < x->V; v++)
        models[v] = x->chunks[v].model;
    char extra[512];
    snprintf(extra, sizeof(extra),
             "{\"layout\":{\"pp\":%d,\"dp\":%d,\"tp\":1,\"chunks\":%d,\"schedule\":\"%s\"},"
             "\"optimizer\":\"%s\",\"lr\":%g,\"data_seed\":%llu,\"batch\":%d,\"microbatches\":%d}",
             x->P, x->D, x->V, bg_schedule_name(x->sched), c->optim.kind == BG_OPTIM_ADAMW ? "adamw" : "sgd",
             (double)c->optim.lr, (unsigned long long)c->data_seed, c->batch, c->microbatches);
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = c->checkpoint_dir;
    p.step = steps_done;
    p.models = models;
    p.nmodels = x->V;
    p.comm = x->comm;
    p.writer = x->dp_i == 0;
    p.extra_json = extra;
    p.keep = c->keep;
    bg_status_t st = bg_checkpoint_save(&p);
    free(models);
    return st;
}

static bg_status_t resume_checkpoint(exec_t *x, int *start_p)
{
    char dir[4096];
    int64_t step = 0;
    bg_status_t st = bg_checkpoint_latest(x->c->checkpoint_dir, dir, sizeof(dir), &step);
    if (st == BG_ERR_NOT_FOUND) {
        bg_error_clear();
        *start_p = 0;
        return BG_OK; /* nothing to resume from: start at step 0 */
    }
    BG_CHECK(st);
    bg_model_t **models = malloc((size_t)x->V * sizeof(*models));
    BG_ALLOC_CHECK(models, (size_t)x->V * sizeof(*models), "checkpoint model list");
    for (int v = 0; v < x->V; v++)
        models[v] = x->chunks[v].model;
    bg_checkpoint_info_t info;
    memset(&info, 0, sizeof(info));
    st = bg_checkpoint_load(dir, models, x->V, &info);
    free(models);
    if (st == BG_OK) {
        *start_p = (int)info.step;
        bg_log(BG_LOG_INFO, "train", "resumed from %s (step %lld)", dir, (long long)info.step);
    }
    bg_checkpoint_info_clear(&info);
    return st;
}

static bg_status_t save_weights(exec_t *x)
{
    if (!x->c->save_dir || x->dp_i != 0)
        return BG_OK;
    char meta[1024];
    bg__train_config_json(&x->c->model, meta, sizeof(meta));
    for (int v = 0; v < x->V; v++) {
        char path[4096];
        if (x->S == 1)
            snprintf(path, sizeof(path), "%s/model.safetensors", x->c->save_dir);
        else
            snprintf(path, sizeof(path), "%s/model-stage%03d.safetensors", x->c->save_dir, x->chunks[v].stage);
        BG_CHECK(bg_model_save_safetensors(x->chunks[v].model, path, meta));
    }
    return BG_OK;
}

static void free_chunk(chunk_t *ch)
{
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
    free(ch->hook);
}

static void cancel_all(exec_t *x)
{
    for (int v = 0; x->chunks && v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        for (int mb = 0; ch->act_recv && mb < x->M; mb++) {
            bg_request_free(ch->act_recv[mb]);
            bg_request_free(ch->grad_recv[mb]);
            ch->act_recv[mb] = ch->grad_recv[mb] = NULL;
            /* sends to a dead peer: their buffers stay until the comm is destroyed */
            bg_request_free(ch->act_send[mb]);
            bg_request_free(ch->grad_send[mb]);
            ch->act_send[mb] = ch->grad_send[mb] = NULL;
        }
        for (int b = 0; b < ch->nbuckets; b++) {
            bg_request_free(ch->buckets[b].req);
            ch->buckets[b].req = NULL;
        }
    }
}

bg_status_t bg_train_parallel(const bg_train_config_t *cfg, bg_train_result_t *result_p)
{
    bg_status_t st = BG_OK;
    exec_t X = {0}, *x = &X;
    X.tie_step = -1;
    x->c = cfg;
    bg_train_result_t res = {0};
    double *times = NULL, *busy = NULL;
    int *first = NULL, *last = NULL;
    BG_CHECK(bg_train_check(cfg));
    x->P = cfg->pp > 0 ? cfg->pp : 1;
    x->D = cfg->dp > 0 ? cfg->dp : 1;
    x->M = cfg->microbatches;

    /* the schedule first: a bad --schedule fails before anyone connects */
    bg_schedule_kind_t kind = BG_SCHED_1F1B;
    if (cfg->schedule)
        BG_CHECK(bg_schedule_kind_parse(cfg->schedule, &kind));
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = kind;
    sp.stages = x->P;
    sp.microbatches = x->M;
    sp.chunks = cfg->chunks;
    BG_CHECK(bg_schedule_generate(&sp, &x->sched));
    BG_CHECK_GOTO(bg_schedule_validate(x->sched), st, out);
    x->V = bg_schedule_chunks(x->sched);
    x->S = bg_schedule_stages(x->sched);
    if (x->M > 0xfffe || x->S > 0x3ffe) { /* the message tags' fields */
        st = bg_error(BG_ERR_UNSUPPORTED, "%d microbatches on %d stages: at most 65534 microbatches and 16382 stages",
                      x->M, x->S);
        goto out;
    }

    int total = cfg->model.kind == BG_MODEL_GPT ? cfg->model.layers + 3 : 2 * cfg->model.layers + 1;
    first = calloc((size_t)x->S, sizeof(int));
    last = calloc((size_t)x->S, sizeof(int));
    if (!first || !last) {
        st = bg_error(BG_ERR_NOMEM, "stage table");
        goto out;
    }
    BG_CHECK_GOTO(layer_ranges(cfg, total, x->S, first, last), st, out);

    bg_comm_params_t cp = BG_COMM_PARAMS_INIT;
    BG_CHECK_GOTO(bg_comm_create(&cp, &x->comm), st, out);
    x->rank = bg_comm_rank(x->comm);
    x->world = bg_comm_size(x->comm);
    bg_log_set_rank(x->rank);
    if (x->world != x->P * x->D) {
        st = bg_error(BG_ERR_INVALID,
                      "--pp %d x --dp %d = %d ranks, but the job has %d (start it with brigade launch -n %d)", x->P,
                      x->D, x->P * x->D, x->world, x->P * x->D);
        goto out;
    }
    {
        int node;
        BG_CHECK_GOTO(bg_numa_bind(bg_comm_local_rank(x->comm), &node), st, out);
        res.numa_node = node;
    }
    x->pp_i = x->rank / x->D;
    x->dp_i = x->rank % x->D;
    {
        int *ranks = malloc((size_t)(x->world > x->D ? x->world : x->D) * sizeof(int));
        if (!ranks) {
            st = BG_ERR_NOMEM;
            goto out;
        }
        for (int d = 0; d < x->D; d++)
            ranks[d] = x->pp_i * x->D + d;
        st = bg_group_create(x->comm, x->D, ranks, &x->dp_group);
        for (int r = 0; st == BG_OK && r < x->world; r++)
            ranks[r] = r;
        if (st == BG_OK)
            st = bg_group_create(x->comm, x->world, ranks, &x->world_group);
        free(ranks);
        if (st != BG_OK)
            goto out;
    }

    /* metrics: rank 0 starts the file (unless resuming), then all ranks append */
    if (cfg->metrics_path) {
        if (x->rank == 0 && !cfg->resume) {
            int fd = open(cfg->metrics_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0)
                st = bg_error(BG_ERR_IO, "cannot write metrics file %s: %s", cfg->metrics_path, strerror(errno));
            else
                close(fd);
        }
        /* every rank learns whether rank 0 could create it, and none writes before it did */
        float okf = st == BG_OK ? 0.0f : 1.0f;
        if (x->world > 1)
            BG_CHECK_GOTO(bg_group_allreduce(x->world_group, &okf, 1, BG_REDUCE_SUM), st, out);
        if (okf > 0) {
            if (st == BG_OK)
                st = bg_error(BG_ERR_IO, "rank 0 cannot write metrics file %s", cfg->metrics_path);
            goto out;
        }
    }
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = cfg->threads;
    BG_CHECK_GOTO(bg_backend_create(cfg->backend, &bp, &x->be), st, out);
    int gpt = cfg->model.kind == BG_MODEL_GPT;
    x->mbn = cfg->batch / (x->D * x->M);
    int Tmax = gpt ? (cfg->seq ? cfg->seq : cfg->model.seq_len) : 1;
    if (gpt)
        BG_CHECK_GOTO(bg_data_open_text(cfg->data_path, Tmax, cfg->data_seed, &x->data), st, out);
    else
        BG_CHECK_GOTO(bg_data_synthetic(cfg->model.in_features, cfg->model.classes, cfg->data_seed, &x->data), st,
                      out);
    if (cfg->save_dir)
        BG_CHECK_GOTO(bg_check_writable_dir(cfg->save_dir), st, out);
    x->tokens = malloc((size_t)x->mbn * Tmax * sizeof(int32_t));
    x->targets = malloc((size_t)x->mbn * Tmax * sizeof(int32_t));
    x->inputs = gpt ? NULL : malloc((size_t)x->mbn * cfg->model.in_features * sizeof(float));
    x->chunks = calloc((size_t)x->V, sizeof(chunk_t));
    if (!x->tokens || !x->targets || (!gpt && !x->inputs) || !x->chunks) {
        st = bg_error(BG_ERR_NOMEM, "executor buffers");
        goto out;
    }
    for (int v = 0; v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        int stage = -1;
        for (int s = 0; s < x->S; s++)
            if (bg_schedule_stage_rank(x->sched, s) == x->pp_i && bg_schedule_stage_chunk(x->sched, s) == v)
                stage = s;
        ch->stage = stage;
        ch->first = first[stage];
        ch->last = last[stage];
        ch->is_first = stage == 0;
        ch->is_last = stage == x->S - 1;
        int pr = stage > 0 ? bg_schedule_stage_rank(x->sched, stage - 1) : -1;
        int nr = stage < x->S - 1 ? bg_schedule_stage_rank(x->sched, stage + 1) : -1;
        ch->prev_local = pr == x->pp_i;
        ch->next_local = nr == x->pp_i;
        ch->prev_rank = pr >= 0 ? pr * x->D + x->dp_i : -1;
        ch->next_rank = nr >= 0 ? nr * x->D + x->dp_i : -1;
        BG_CHECK_GOTO(bg_model_create(&cfg->model, x->be, ch->first, ch->last, &ch->model), st, out);
        BG_CHECK_GOTO(bg_stage_create(ch->model, x->M, &ch->st), st, out);
        if (cfg->recompute || (cfg->recompute_stages && stage < cfg->nrecompute_stages && cfg->recompute_stages[stage]))
            bg_stage_set_recompute(ch->st, 1);
        BG_CHECK_GOTO(make_buckets(ch), st, out);
        hook_arg_t *h = malloc(sizeof(*h));
        if (!h) {
            st = bg_error(BG_ERR_NOMEM, "backward hook");
            goto out;
        }
        h->x = x;
        h->ch = ch;
        ch->hook = h;
        bg_stage_set_layer_done(ch->st, on_layer_done, h);
        /* optimizer state now, so the activation peak measured below is activations only */
        BG_CHECK_GOTO(bg_model_optim_init(ch->model, cfg->optim.kind), st, out);
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
        if (!ch->act_recv || !ch->grad_recv || !ch->act_send || !ch->grad_send || !ch->out || !ch->din ||
            !ch->begun || !ch->pending_end || !ch->out_shape) {
            st = bg_error(BG_ERR_NOMEM, "executor bookkeeping");
            goto out;
        }
        res.params += bg_model_param_count(ch->model);
    }
    if (cfg->trace_path)
        BG_CHECK_GOTO(bg_trace_create(x->comm, x->rank, &x->trace), st, out);
    BG_CHECK_GOTO(predict_activations(x, &res), st, out);

    size_t nops;
    const bg_sched_op_t *ops = bg_schedule_rank_ops(x->sched, x->pp_i, &nops);
    /* step times for the medians: the last BG_TIMED steps (a ring) */
    enum { BG_TIMED = 4096 };
    times = calloc(BG_TIMED, sizeof(double));
    busy = calloc(BG_TIMED, sizeof(double));
    if (!times || !busy) {
        st = BG_ERR_NOMEM;
        goto out;
    }
    int start = 0;
    if (cfg->checkpoint_dir && cfg->resume)
        BG_CHECK_GOTO(resume_checkpoint(x, &start), st, out);
    res.start_step = start;
    res.steps_done = start;
    size_t act_base = bg_backend_memstats(x->be).current;
    bg_backend_reset_peak(x->be);
    int timed = 0;
    for (int step = start; step < cfg->steps; step++) {
        x->step = step;
        double step_tokens = bg__train_step_tokens(cfg, step);
        x->loss_scale = (float)(1.0 / step_tokens);
        x->loss = 0;
        x->busy = 0;
        x->bytes_sent = 0;
        for (int v = 0; v < x->V; v++)
            bg_model_zero_grads(x->chunks[v].model);
        double t0 = bg_now();
        for (size_t i = 0; i < nops; i++) {
            BG_CHECK_GOTO(post_ahead(x, ops, nops, i), st, fail);
            int compute = ops[i].kind <= BG_OP_BACKWARD_WEIGHT || ops[i].kind == BG_OP_OPTIMIZER_STEP;
            double a = bg_now();
            st = run_op(x, &ops[i]);
            double b = bg_now();
            if (st != BG_OK) {
                bg_status_t st2 = bg_comm_health(x->comm);
                const char *what = op_label(ops[i].kind);
                char msg[1024];
                snprintf(msg, sizeof(msg), "%s", bg_last_error());
                if (st2 != BG_OK && st != BG_ERR_PEER)
                    st = st2, snprintf(msg, sizeof(msg), "%s", bg_last_error());
                st = bg_error(st, "rank %d (stage %d) at step %d, %s of microbatch %d: %s", x->rank, ops[i].stage,
                              step + 1, what, ops[i].microbatch, msg);
                goto fail;
            }
            if (compute)
                x->busy += b - a;
            if (x->trace)
                bg_trace_event(x->trace, op_label(ops[i].kind), ops[i].microbatch, ops[i].stage, a, b, step + 1);
            BG_CHECK_GOTO(reap_pending(x, 0), st, fail);
        }
        BG_CHECK_GOTO(reap_pending(x, 1), st, fail);
        x->be->ops->synchronize(x->be);
        double dt = bg_now() - t0;
        if (x->trace)
            bg_trace_event(x->trace, "step", -1, -1, t0, t0 + dt, step + 1);
        /* the step's loss (the last stage of each replica holds its share) and
         * whether any rank was asked to stop: one allreduce, so all agree */
        float red[2] = {(float)x->loss, cfg->stop_flag && *cfg->stop_flag ? 1.0f : 0.0f};
        if (x->world > 1)
            BG_CHECK_GOTO(bg_group_allreduce(x->world_group, red, 2, BG_REDUCE_SUM), st, fail);
        float lossf = red[0];
        int stop = red[1] > 0;
        times[timed % BG_TIMED] = dt;
        busy[timed % BG_TIMED] = x->busy;
        timed++;
        res.steps_done = step + 1;
        if (step == start)
            res.first_loss = lossf;
        res.final_loss = lossf;
        if (cfg->on_step) {
            bg_step_info_t info = {step + 1, cfg->steps, lossf, dt * 1e3, step_tokens / dt, x->rank};
            cfg->on_step(&info, cfg->on_step_arg);
        }
        if (cfg->metrics_path) {
            /* one line per rank and step, appended with one write (O_APPEND keeps lines whole) */
            char line[512];
            int len = snprintf(line, sizeof(line),
                               "{\"rank\": %d, \"step\": %d, \"loss\": %.6f, \"tokens_per_s\": %.1f, \"step_ms\": %.3f, "
                               "\"bubble\": %.4f, \"bytes_sent\": %llu, \"peak_bytes\": %zu}\n",
                               x->rank, step + 1, lossf, step_tokens / dt, dt * 1e3, dt > 0 ? 1.0 - x->busy / dt : 0.0,
                               (unsigned long long)x->bytes_sent, bg_backend_memstats(x->be).peak);
            int fd = open(cfg->metrics_path, O_WRONLY | O_APPEND | O_CREAT, 0644);
            if (fd < 0 || write(fd, line, (size_t)len) != len) {
                st = bg_error(BG_ERR_IO, "cannot write metrics file %s: %s", cfg->metrics_path, strerror(errno));
                if (fd >= 0)
                    close(fd);
                goto fail;
            }
            close(fd);
        }
        int last = step + 1 == cfg->steps;
        if (cfg->checkpoint_dir &&
            (stop || last || (cfg->checkpoint_every && (step + 1) % cfg->checkpoint_every == 0)))
            BG_CHECK_GOTO(save_checkpoint(x, step + 1), st, fail);
        if (stop && !last) {
            res.stopped = 1;
            break;
        }
    }
    res.peak_act_bytes = bg_backend_memstats(x->be).peak - act_base;
    if (timed > BG_TIMED)
        timed = BG_TIMED;
    if (timed > 0) {
        double step_s = bg_median(times, (size_t)timed);
        res.median_step_ms = step_s * 1e3;
        res.tokens_per_s = bg__train_step_tokens(cfg, timed / 2) / step_s;
        res.bubble = 1.0 - bg_median(busy, (size_t)timed) / step_s;
    }
    res.peak_bytes = bg_backend_memstats(x->be).peak;
    res.peak_stashed = x->peak_stashed;
    res.rank = x->rank;
    res.world = x->world;
    BG_CHECK_GOTO(save_weights(x), st, fail);
    if (x->trace) {
        char meta[512];
        snprintf(meta, sizeof(meta),
                 "{\"schedule\":\"%s\",\"pp\":%d,\"dp\":%d,\"microbatches\":%d,\"chunks\":%d,\"steps\":%d,"
                 "\"producer\":\"brigade " BRIGADE_VERSION_STRING "\"}",
                 bg_schedule_name(x->sched), x->P, x->D, x->M, x->V, cfg->steps);
        BG_CHECK_GOTO(bg_trace_write(x->trace, cfg->trace_path, meta), st, fail);
    }
    *result_p = res;
    goto out;
fail:
    cancel_all(x);
out:
    if (x->trace)
        bg_trace_destroy(x->trace);
    if (x->be)
        bg_backend_free(x->be, x->tie_buf);
    if (x->chunks)
        for (int v = 0; v < x->V; v++)
            free_chunk(&x->chunks[v]);
    free(x->chunks);
    bg_group_destroy(x->dp_group);
    bg_group_destroy(x->world_group);
    if (x->comm) {
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s", bg_last_error());
        bg_status_t st2 = bg_comm_destroy(x->comm);
        if (st == BG_OK)
            st = st2;
        else
            bg_error(st, "%s", msg); /* keep the first failure's message */
    }
    bg_backend_destroy(x->be);
    bg_data_close(x->data);
    bg_schedule_free(x->sched);
    free(x->tokens);
    free(x->targets);
    free(x->inputs);
    free(first);
    free(last);
    free(times);
    free(busy);
    return st;
}
