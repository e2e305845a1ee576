/* runtime/executor.c: the executor: trains any model description on a
 * pipeline x data-parallel layout, one optimizer step per call of its host.
 * Each rank walks its program from the schedule generator (the same program
 * the simulator runs): receives are posted ahead, sends never block, compute
 * runs on the rank's stages (one per model chunk), and each chunk's
 * gradients are all-reduced over its data-parallel group without blocking as
 * soon as its last backward piece is done, so the reduction overlaps the
 * pipeline's drain. One process is the executor at pp = dp = 1.
 *
 * Layout (ARCHITECTURE.md): world = pp x dp x tp,
 * rank = (pp_i * dp + dp_i) * tp + tp_i; the members of a tensor group run
 * the same program on their shards (runtime/tp.c). Data: replica d takes sequences
 * [d*B/D, (d+1)*B/D) of each step's global batch, in M microbatches, from
 * the host's batch source. The loss scale is 1 / (positions of the global
 * batch) on every replica and the reduction is a sum, so the arithmetic of a
 * stage's gradients is the one of a single process for dp = 1 (bitwise), and
 * within rounding for dp > 1.
 *
 * Shapes: a microbatch's sequence length is a pure function of (step, mb)
 * (the batch source's seq_len), so every rank knows every message's size
 * without a header: variable lengths cost nothing on the wire.
 *
 * Ties: before the first optimizer step of a step on a rank, every declared
 * tie's two gradients become a + b (after the data-parallel sum): by a
 * device add when this rank holds both tensors, else by exchanging them with
 * the rank that holds the other (same replica), all exchanges posted before
 * any is waited for.
 *
 * Copies (DualPipe: bg_schedule_copies() = 2): each copy of a model stage is
 * a chunk of its own, built from the same layers (so initialised the same);
 * microbatch i runs through copy i / (M/2) only. Before the ties, every
 * chunk's gradient (after the data-parallel sum) becomes g0 + g1 by
 * exchanging it with the rank holding the other copy, so the copies take the
 * same optimizer step and stay identical; the arithmetic is the one of two
 * data-parallel replicas of M/2 microbatches each.
 *
 * Tags: bit 31 step parity, bit 30 direction (0 act, 1 grad), bits 16..29
 * the receiving stage (0x3fff: ties, 0x3ffe: copy sums), bits 0..15 the
 * microbatch (tie index; model stage for copy sums). */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/checkpoint.h"
#include "brigade/executor.h"
#include "brigade/partitioner.h"
#include "brigade/schedule.h"
#include "brigade/train.h"
#include "core/check.h"
#include "core/fiber.h"
#include "core/fileio.h"
#include "runtime/checkpoint_impl.h"
#include "runtime/tp.h"
#include "runtime/emulate.h"
#include "runtime/layout.h"
#include "runtime/numa.h"
#include "runtime/ps.h"
#include "runtime/staging.h"
#include "runtime/trace.h"
#include "runtime/zero.h"

typedef struct chunk {
    int stage;              /* virtual stage */
    int first, last;        /* layer range */
    bg_model_t *model;
    bg_stage_t *st;
    int is_first, is_last;  /* first / last stage of the whole pipeline (of its copy's chain) */
    int copy, mb_last;      /* model copy (0: one copy) and the last microbatch through it */
    int copy_partner;       /* copies > 1: world rank of the other copy of this model stage */
    float *copy_buf;        /* copies > 1: the other copy's gradient */
    bg__xfer_t *copy_rr, *copy_sr;
    int prev_local, next_local; /* stage-1 / stage+1 live on this rank */
    int prev_rank, next_rank;   /* ranks of the neighbouring stages */
    /* per microbatch */
    bg__xfer_t **act_recv, **grad_recv, **act_send, **grad_send;
    float **out;            /* forward output (valid until the slot ends) */
    float **din;            /* input gradient (valid until the slot ends) */
    int *begun, *pending_end;
    bg_shape_t *out_shape;
    void *hook;             /* hook_arg_t of the layer-done callback */
    /* gradient buckets: contiguous layer ranges, last layers first */
    struct bucket {
        int lo, hi;           /* layers */
        size_t off, count;    /* floats of the flat gradient buffer */
        bg__xfer_t *req;
        int started;
    } *buckets;
    int nbuckets;
    double gsq;             /* sum of squares of the chunk's reduced gradients this step (grad_sumsq) */
    double *tsq;            /* per tensor: the sum of squares of its reduced gradient this step */
    bg__zero_t *zero;       /* --zero 1|2: the sharded optimizer state (runtime/zero.c), else NULL */
} chunk_t;

/* A declared tie as this rank sees it. */
typedef struct tie {
    bg_param_t *a, *b;      /* the local tensors (NULL: held by another rank) */
    int partner;            /* rank holding the other tensor when only one is here, else -1 */
    float *buf;             /* the partner's gradient */
    bg__xfer_t *rr, *sr;
} tie_t;

typedef struct bg_executor {
    bg_executor_params_t p;
    bg_model_desc_t *desc;
    bg_comm_t *comm;
    int own_comm;
    bg_group_t *dp_group, *world_group;
    bg__tp_t *tp;           /* the tensor-parallel group (runtime/tp.c; NULL: tp = 1) */
    bg_layout_t lay;        /* who holds what: degrees, this rank's coordinates, stage placement */
    bg_backend_t *be;
    bg__staging_t stg;      /* transfers of backend buffers between ranks */
    bg_schedule_t *sched;
    const bg_sched_op_t *ops;
    size_t nops;
    int V, M, S;
    int copies, L;          /* model copies (bg_schedule_copies) and model stages S / copies */
    chunk_t *chunks;        /* V */
    int *first, *last;      /* layer range of each virtual stage */
    int mbn;                /* sequences per microbatch per replica */
    int tokens_in;          /* the model takes token ids */
    int has_first, has_last; /* this rank holds the pipeline's first / last stage */
    int classes, vocab, Tmax;
    int64_t step;           /* steps done */
    float loss_scale;
    double loss;            /* this rank's share of the step's loss */
    /* a backend that queues work (ops->event_record): each microbatch's
     * per-token losses are copied here on the device and summed at the
     * step's end, in the order the forwards ran, the host not waiting for
     * the compute stream per microbatch (the same sums in the same order as
     * summing at once; NULL on the CPU, which sums at once) */
    float *loss_dev;        /* M x per_mb_floats */
    size_t *loss_n;         /* each microbatch's count */
    int *loss_mb, loss_k;   /* microbatches in forward order; how many this step */
    size_t per_mb_floats;   /* tokens (or samples) of a microbatch at most: mbn x Tmax */
    int32_t *tokens, *targets;
    float *features;
    size_t nfeatures;
    int64_t fetched_step;   /* (step, mb) whose batch is in the buffers */
    int fetched_mb;
    bg_trace_t *trace;
    int stashed, peak_stashed;
    tie_t *ties;
    int nties;
    int64_t tie_step;       /* step whose ties were summed */
    double busy;            /* compute seconds in the step */
    uint64_t bytes_sent;    /* point-to-point bytes sent in the step */
    volatile sig_atomic_t stop_req;
    int broken;             /* a step failed: the executor cannot step again */
    size_t act_base;        /* allocator bytes before the first step (params, grads, optimizer) */
    size_t params;
    double flops_per_step;
    size_t predicted_act_bytes;
    int predicted_stashed;
    int numa_node;
    bg__emulate_t *em;      /* --emulate: per-stage sleeps instead of compute; NULL: compute */
    bg__ps_t *ps;           /* --ps: this rank's part of the parameter-server mode (runtime/ps.c), else NULL */
    bg_model_t **ps_models; /* --ps: the chunks' models, as the parameter-server part sees them */
    bg_pair_t *pair;        /* BRIGADE_TP_OVERLAP=microbatch: two coroutines for paired instructions, else NULL */
} exec_t;

/* A parameter server runs no program: bg__ps_server_step is its step. */
static int is_server(const exec_t *x) { return x->lay.me.role == BG_LAYOUT_SERVER; }

/* Positions of microbatch mb of step `step`. */
static bg_status_t seq_len(exec_t *x, int64_t step, int mb, int *t_p)
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
    *t_p = t;
    return BG_OK;
}

/* Positions in one step's global batch (the loss is their mean). */
static bg_status_t step_tokens(exec_t *x, int64_t step, double *tokens_p)
{
    double tokens = 0;
    for (int mb = 0; mb < x->M; mb++) {
        int t = 0;
        BG_CHECK(seq_len(x, step, mb, &t));
        tokens += (double)x->mbn * x->lay.dp * t;
    }
    *tokens_p = tokens;
    return BG_OK;
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
    BG_CHECK(seq_len(x, x->step, mb, &T));
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
                            x->nfeatures, rq.in.n, rq.in.t, rq.in.c, isnan(feat[i]) ? "NaN (not written?)" : "infinite");
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

static uint32_t tag_of(exec_t *x, int grad, int recv_stage, int mb)
{
    return ((uint32_t)(x->step & 1) << 31) | ((uint32_t)grad << 30) | ((uint32_t)(recv_stage & 0x3fff) << 16) |
           (uint32_t)(mb & 0xffff);
}

/* Shape of the input of stage `stage` for microbatch mb of this step. */
static bg_status_t input_shape(exec_t *x, chunk_t *ch, int mb, bg_shape_t *shape_p)
{
    int T = 0;
    BG_CHECK(seq_len(x, x->step, mb, &T));
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
    return bg__xrecv(&x->stg, x->comm, ch->prev_rank, tag_of(x, 0, ch->stage, mb), in,
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
    return bg__xrecv(&x->stg, x->comm, ch->next_rank, tag_of(x, 1, ch->stage, mb), dout,
                     bg_shape_numel(o) * sizeof(float), &ch->grad_recv[mb]);
}

static bg_status_t wait_free(bg__xfer_t **rq)
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
    BG_CHECK(wait_free(&ch->act_send[mb]));
    BG_CHECK(wait_free(&ch->grad_send[mb]));
    if (!split)
        bg_stage_end(ch->st, mb);
    ch->begun[mb] = 0;
    ch->out[mb] = ch->din[mb] = NULL;
    return BG_OK;
}

/* Fused backward slots whose din is still being sent end later: when a test
 * after an instruction finds the send complete (force 0); at the latest when
 * the first compute instruction after the send is over (force 2: every slot
 * whose send is issued, waited for), which bounds what the partitioner
 * counts as lingering (docs/partitioner.md); force 1: all, at the step's end. */
static bg_status_t reap_pending(exec_t *x, int force)
{
    for (int v = 0; v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        for (int mb = 0; mb < x->M; mb++) {
            if (!ch->pending_end[mb] || (force == 2 && !ch->grad_send[mb]))
                continue;
            if (!force) {
                int done = 0;
                if (!ch->grad_send[mb])
                    continue; /* its SEND_GRAD is not issued yet */
                BG_CHECK(bg__xtest(ch->grad_send[mb], &done));
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

/* --zero: the calls into the chunk's sharding around the compute; one that
 * blocked on a collective shows in the trace for its duration, as ag_wait (the
 * parameters' all-gathers of the last step, before a forward) or rs_wait
 * (--zero 2: the backward waiting for a bucket's reduce-scatter). */
enum { ZERO_SETTLE, ZERO_PREPARE, ZERO_LAYER_DONE };
static bg_status_t zero_call(exec_t *x, chunk_t *ch, int mb, int what, int layer)
{
    int64_t w0 = bg__zero_waits(ch->zero);
    double t0 = x->trace ? bg_now() : 0;
    BG_CHECK(what == ZERO_SETTLE    ? bg__zero_settle(ch->zero)
             : what == ZERO_PREPARE ? bg__zero_prepare(ch->zero, layer)
                                    : bg__zero_layer_done(ch->zero, layer));
    if (x->trace && bg__zero_waits(ch->zero) != w0)
        bg__trace_event(x->trace, what == ZERO_SETTLE ? "ag_wait" : "rs_wait", mb, ch->stage, t0, bg_now(),
                        (int)x->step + 1);
    return BG_OK;
}

static bg_status_t do_forward(exec_t *x, chunk_t *ch, int mb)
{
    bg_backend_t *be = x->be;
    float *in;
    BG_CHECK(begin_slot(x, ch, mb, &in));
    if (ch->zero) /* the parameters' all-gathers of the last step */
        BG_CHECK(zero_call(x, ch, mb, ZERO_SETTLE, 0));
    if (ch->is_first || ch->is_last)
        BG_CHECK(fetch_batch(x, mb));
    if (ch->is_first && x->features)
        be->ops->from_host(be, in, x->features, x->nfeatures * sizeof(float));
    if (ch->is_first || ch->is_last)
        BG_CHECK(bg_stage_set_data(ch->st, mb, ch->is_first && x->tokens_in ? x->tokens : NULL,
                                   ch->is_last ? x->targets : NULL, x->loss_scale));
    if (!ch->is_first && !ch->prev_local)
        BG_CHECK(wait_free(&ch->act_recv[mb]));
    BG_CHECK(bg_stage_forward(ch->st, mb, &ch->out[mb], &ch->out_shape[mb]));
    if (x->em)
        bg__emulate_wait(x->em, x->em->f[ch->stage]);
    /* stashed from its forward to its last backward piece, as the simulator counts */
    if (++x->stashed > x->peak_stashed)
        x->peak_stashed = x->stashed;
    if (ch->is_last && !x->em && x->lay.me.tp == 0) { /* every member of a tensor group computes the same losses */
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
    }
    /* The output gradient's buffer is counted with the stash from here (bg_stage_memory's dout): receive
     * into it now, so that the next stage's send completes when it is made and frees the next stage's
     * backward buffers (a rendezvous send would otherwise hold them until this stage's backward) */
    if (!ch->is_last && !ch->next_local)
        BG_CHECK(post_grad_recv(x, ch, mb));
    if (!ch->is_last && ch->next_local) {
        /* the next stage is ours: hand the output over now */
        chunk_t *nx = chunk_of_stage(x, ch->stage + 1);
        float *nin;
        BG_CHECK(begin_slot(x, nx, mb, &nin));
        bg_dtype_t t = bg_stage_output_dtype(ch->st); /* = the next stage's input type */
        be->ops->convert(be, nin, t, ch->out[mb], t, bg_shape_numel(ch->out_shape[mb]));
    }
    return BG_OK;
}

static bg_status_t do_backward(exec_t *x, chunk_t *ch, int mb, int split)
{
    bg_backend_t *be = x->be;
    if (!ch->is_last && !ch->next_local)
        BG_CHECK(wait_free(&ch->grad_recv[mb]));
    float *din;
    if (!split && ch->zero) /* --zero 2: where the weight gradients go */
        BG_CHECK(zero_call(x, ch, mb, ZERO_PREPARE, ch->last));
    if (split)
        BG_CHECK(bg_stage_backward_input(ch->st, mb, &din));
    else
        BG_CHECK(bg_stage_backward(ch->st, mb, &din));
    if (x->em)
        bg__emulate_wait(x->em, x->em->b[ch->stage] + (split ? 0 : x->em->w[ch->stage]));
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
        BG_CHECK(wait_free(&ch->act_send[mb]));
        BG_CHECK(bg_stage_release(ch->st, mb));
        ch->out[mb] = NULL;
        ch->pending_end[mb] = 1;
    }
    return BG_OK;
}

static bg_status_t do_weight(exec_t *x, chunk_t *ch, int mb)
{
    BG_CHECK(wait_free(&ch->grad_send[mb])); /* W frees din */
    BG_CHECK(wait_free(&ch->act_send[mb]));
    if (ch->zero)
        BG_CHECK(zero_call(x, ch, mb, ZERO_PREPARE, ch->last));
    BG_CHECK(bg_stage_backward_weight(ch->st, mb));
    if (x->em)
        bg__emulate_wait(x->em, x->em->w[ch->stage]);
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
        if (x->ps) { /* push instead of all-reduce (a tie's a + b is the server's) */
            if (bk->count)
                BG_CHECK(bg__ps_push_range(x->ps, (int)(ch - x->chunks), bk->off, bk->count));
        } else if (x->lay.dp > 1 && bk->count) {
            if (ch->zero) { /* host buffers only (refused with staging at create) */
                bg_request_t *rq = NULL;
                BG_CHECK(bg__zero_reduce(ch->zero, b, &rq));
                BG_CHECK(bg__xwrap(&x->stg, rq, &bk->req));
            } else {
                BG_CHECK(bg__xallreduce(&x->stg, x->dp_group, bg_model_grads(ch->model) + bk->off, bk->count,
                                        BG_REDUCE_SUM, &bk->req));
            }
            if (x->trace) { /* the moment the bucket's reduction starts (microbatch field: bucket index) */
                double now = bg_now();
                bg__trace_event(x->trace, "ar_start", b, ch->stage, now, now, (int)x->step + 1);
            }
        }
    }
    return BG_OK;
}

static bg_status_t wait_bucket(exec_t *x, chunk_t *ch, int b)
{
    double t0 = bg_now();
    int had = ch->buckets[b].req != NULL;
    bg_status_t st = wait_free(&ch->buckets[b].req);
    if (x->trace && had) /* time spent waiting for the reduction after the backward */
        bg__trace_event(x->trace, "ar_wait", b, ch->stage, t0, bg_now(), (int)x->step + 1);
    ch->buckets[b].started = 0;
    return st;
}

static bg_status_t wait_buckets(exec_t *x, chunk_t *ch)
{
    /* once one reduction failed the step is lost: the others are freed by
     * cancel_all, not waited for (one with a rank that left the job would
     * otherwise hold this rank until BRIGADE_TIMEOUT) */
    for (int b = 0; b < ch->nbuckets; b++)
        BG_CHECK(wait_bucket(x, ch, b));
    return BG_OK;
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
    bg__staging_progress(&h->x->stg); /* during the backward too */
    int last = mb == h->ch->mb_last; /* the chunk's last microbatch (DualPipe: of its copy) */
    /* sequence parallelism: the layer's replicated tensors saw this member's
     * rows only; their sums over the tensor group come before the replicas':
     * once a step, or with --zero 2 every microbatch whose gradients are
     * reduce-scattered now */
    if (last || (h->ch->zero && bg__zero_per_microbatch(h->ch->zero, layer)))
        BG_CHECK(bg_model_tp_sum_grads(h->ch->model, layer));
    if (h->ch->zero) /* --zero 2: every microbatch's buckets */
        BG_CHECK(zero_call(h->x, h->ch, mb, ZERO_LAYER_DONE, layer));
    if (!last || (h->x->lay.dp == 1 && !h->x->ps))
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

/* Copies > 1: every chunk's gradient becomes g0 + g1, the sum of its model
 * stage's two copies (see the top), all exchanges posted before any is
 * waited for. Both ranks add the same two buffers (IEEE addition is
 * commutative), so both copies hold the same bits. */
static bg_status_t sync_copies(exec_t *x)
{
    bg_backend_t *be = x->be;
    bg_status_t st = BG_OK;
    for (int v = 0; v < x->V && st == BG_OK; v++) {
        chunk_t *ch = &x->chunks[v];
        size_t bytes = bg_model_param_count(ch->model) * sizeof(float);
        uint32_t tag = tag_of(x, 1, 0x3ffe, bg__layout_model_stage(&x->lay, ch->stage));
        st = bg__xrecv(&x->stg, x->comm, ch->copy_partner, tag, ch->copy_buf, bytes, &ch->copy_rr);
        if (st == BG_OK)
            st = bg__xsend(&x->stg, x->comm, ch->copy_partner, tag, bg_model_grads(ch->model), bytes, &ch->copy_sr);
        x->bytes_sent += bytes;
    }
    for (int v = 0; v < x->V; v++) {
        bg_status_t s1 = wait_free(&x->chunks[v].copy_rr), s2 = wait_free(&x->chunks[v].copy_sr);
        if (st == BG_OK)
            st = s1 != BG_OK ? s1 : s2;
    }
    if (st != BG_OK)
        return st;
    for (int v = 0; v < x->V; v++) {
        chunk_t *ch = &x->chunks[v];
        float *g = bg_model_grads(ch->model);
        size_t n = bg_model_param_count(ch->model);
        be->ops->residual_forward(be, g, g, ch->copy_buf, n); /* g0 + g1 = g1 + g0, bit for bit */
    }
    return BG_OK;
}

/* What the copies and the ties share (see the top). Runs once per step,
 * before the first optimizer step on this rank, when every backward on the
 * rank is done: it finishes every chunk's data-parallel reduction, sums the
 * copies' gradients (copies > 1), then makes every tie's gradients a + b on
 * both tensors. */
static bg_status_t sync_shared(exec_t *x)
{
    if ((x->nties == 0 && x->copies == 1) || x->tie_step == x->step)
        return BG_OK;
    x->tie_step = x->step;
    bg_backend_t *be = x->be;
    for (int v = 0; v < x->V; v++)
        BG_CHECK(start_buckets(x, &x->chunks[v], x->chunks[v].first));
    for (int v = 0; v < x->V; v++)
        BG_CHECK(wait_buckets(x, &x->chunks[v]));
    if (x->copies > 1)
        BG_CHECK(sync_copies(x));
    bg_status_t st = BG_OK;
    for (int t = 0; t < x->nties && st == BG_OK; t++) {
        tie_t *ti = &x->ties[t];
        if (ti->partner < 0)
            continue;
        bg_param_t *mine = ti->a ? ti->a : ti->b;
        size_t bytes = mine->numel * sizeof(float);
        if (!ti->buf && !(ti->buf = bg_backend_alloc(be, bytes, "tied gradient")))
            return BG_ERR_NOMEM;
        uint32_t tag = tag_of(x, 1, 0x3fff, t);
        st = bg__xrecv(&x->stg, x->comm, ti->partner, tag, ti->buf, bytes, &ti->rr);
        if (st == BG_OK)
            st = bg__xsend(&x->stg, x->comm, ti->partner, tag, mine->grad, bytes, &ti->sr);
        x->bytes_sent += bytes;
    }
    for (int t = 0; t < x->nties; t++) {
        bg_status_t s1 = wait_free(&x->ties[t].rr), s2 = wait_free(&x->ties[t].sr);
        if (st == BG_OK)
            st = s1 != BG_OK ? s1 : s2;
    }
    if (st != BG_OK)
        return st;
    for (int t = 0; t < x->nties; t++) {
        tie_t *ti = &x->ties[t];
        if (ti->a && ti->b) {
            be->ops->residual_forward(be, ti->a->grad, ti->a->grad, ti->b->grad, ti->a->numel); /* a + b */
            be->ops->copy(be, ti->b->grad, ti->a->grad, ti->a->numel);
        } else if (ti->a) {
            be->ops->residual_forward(be, ti->a->grad, ti->a->grad, ti->buf, ti->a->numel);
        } else if (ti->b) {
            be->ops->residual_forward(be, ti->b->grad, ti->buf, ti->b->grad, ti->b->numel);
        }
    }
    return BG_OK;
}

/* Does tensor i count in the model's gradient norm? The second tensor of
 * every tie is left out (both copies hold a + b, and the model's norm counts
 * a tied tensor once), and a tensor replicated over the tensor group counts
 * once (member 0). */
static int in_norm(exec_t *x, chunk_t *ch, int i)
{
    bg_param_t *p = bg_model_tensor(ch->model, i);
    for (int t = 0; t < x->nties; t++)
        if (x->ties[t].b == p)
            return 0;
    return p->numel && (x->lay.me.tp == 0 || bg_param_is_shard(p));
}

/* Sum of squares of a chunk's reduced gradients from the per-tensor sums
 * (ch->tsq, in double, filled bucket by bucket by optimizer_step), added
 * tensor by tensor in the chunk's fixed order whatever order the buckets
 * finished in. Summed over the pipeline (one replica) it is the square of
 * the model's gradient norm. */
static double grad_sumsq(exec_t *x, chunk_t *ch)
{
    double s = 0;
    for (int i = 0; i < bg_model_num_tensors(ch->model); i++)
        if (in_norm(x, ch, i))
            s += ch->tsq[i];
    return s;
}

/* The chunk's optimizer step, bucket by bucket in the order their reductions
 * started (the last layers first): each bucket is waited for, its squares
 * summed (the gradient norm) and its parameters updated (--zero: its owned
 * elements, then its parameters' all-gather starts), so the reductions still
 * in flight, the last bucket's above all, overlap the updates of the buckets
 * before them. The update is elementwise: the same bits as one step over the
 * chunk after every reduction. */
static bg_status_t optimizer_step(exec_t *x, chunk_t *ch)
{
    int norm = ch->copy == 0; /* the model's norm counts one copy */
    int nt = bg_model_num_tensors(ch->model), t = (int)x->step + 1;
    const float *base = bg_model_params(ch->model);
    for (int i = 0; i < nt; i++)
        ch->tsq[i] = 0;
    for (int b = 0; b < ch->nbuckets; b++) {
        struct bucket *bk = &ch->buckets[b];
        BG_CHECK(wait_bucket(x, ch, b));
        if (ch->zero) {
            BG_CHECK(bg__zero_bucket_done(ch->zero, b, norm ? ch->tsq : NULL));
        } else {
            for (int i = 0; norm && i < nt; i++) {
                bg_param_t *p = bg_model_tensor(ch->model, i);
                size_t o = (size_t)(p->data - base);
                if (o >= bk->off && o - bk->off < bk->count && in_norm(x, ch, i))
                    ch->tsq[i] = x->be->ops->sumsq(x->be, p->grad, p->numel);
            }
        }
        if (x->em)
            continue; /* emulated: no update (the simulator's optimizer costs nothing) */
        if (ch->zero)
            BG_CHECK(bg__zero_bucket_step(ch->zero, b, &x->p.optim, t));
        else
            BG_CHECK(bg_model_optim_step_range(ch->model, &x->p.optim, t, bk->off, bk->count));
    }
    ch->gsq = norm ? grad_sumsq(x, ch) : 0;
    return BG_OK;
}

/* The schedule IR's names: the text tokens of compute ops (F, B, b, W), the
 * JSON names of the rest (send_act, ..., reduce_grads, optimizer_step). */
static const char *op_label(int kind)
{
    const char *n = kind >= BG_OP_FORWARD && kind <= BG_OP_BACKWARD_WEIGHT
                        ? bg_sched_op_kind_token((bg_sched_op_kind_t)kind)
                        : bg_sched_op_kind_name((bg_sched_op_kind_t)kind);
    return n ? n : "?";
}

static bg_status_t run_op(exec_t *x, const bg_sched_op_t *o)
{
    chunk_t *ch = chunk_of_stage(x, o->stage);
    if (!ch)
        return bg_error(BG_ERR_INTERNAL, "rank %d: program names stage %d, which this rank does not hold", x->lay.rank,
                        o->stage);
    int mb = o->microbatch;
    bg_shape_t s, so;
    switch (o->kind) {
    case BG_OP_FORWARD: return do_forward(x, ch, mb);
    case BG_OP_BACKWARD: return do_backward(x, ch, mb, 0);
    case BG_OP_BACKWARD_INPUT: return do_backward(x, ch, mb, 1);
    case BG_OP_BACKWARD_WEIGHT: return do_weight(x, ch, mb);
    case BG_OP_SEND_ACT: { /* in the model's precision (bf16: half the bytes) */
        size_t bytes = bg_shape_numel(ch->out_shape[mb]) * bg_dtype_size(bg_stage_output_dtype(ch->st));
        x->bytes_sent += bytes;
        return bg__xsend(&x->stg, x->comm, ch->next_rank, tag_of(x, 0, ch->stage + 1, mb), ch->out[mb], bytes,
                         &ch->act_send[mb]);
    }
    case BG_OP_SEND_GRAD:
        BG_CHECK(bg_stage_slot_shapes(ch->st, mb, &s, &so));
        x->bytes_sent += bg_shape_numel(s) * sizeof(float);
        return bg__xsend(&x->stg, x->comm, ch->prev_rank, tag_of(x, 1, ch->stage - 1, mb), ch->din[mb],
                         bg_shape_numel(s) * sizeof(float), &ch->grad_send[mb]);
    case BG_OP_RECV_ACT:
        BG_CHECK(post_act_recv(x, ch, mb));
        if (x->em)
            bg__emulate_idle(ch->act_recv[mb]);
        return wait_free(&ch->act_recv[mb]);
    case BG_OP_RECV_GRAD:
        BG_CHECK(post_grad_recv(x, ch, mb));
        if (!ch->grad_recv[mb])
            return bg_error(BG_ERR_INTERNAL, "rank %d: gradient of microbatch %d for stage %d before its forward",
                            x->lay.rank, mb, ch->stage);
        if (x->em)
            bg__emulate_idle(ch->grad_recv[mb]);
        return wait_free(&ch->grad_recv[mb]);
    case BG_OP_REDUCE_GRADS:
        return start_buckets(x, ch, ch->first); /* whatever the backward hook did not start */
    case BG_OP_OPTIMIZER_STEP:
        if (x->ps) /* the servers update (bg__ps_worker_end pushes what is left); a tie's a + b is theirs */
            return wait_buckets(x, ch);
        BG_CHECK(sync_shared(x));
        return optimizer_step(x, ch);
    }
    return bg_error(BG_ERR_INVALID, "rank %d: unknown instruction kind %d", x->lay.rank, o->kind);
}

/* ---- BRIGADE_TP_OVERLAP=microbatch: a compute instruction beside the next one ----
 *
 * Op i (a compute instruction) and the next compute instruction j run as two
 * coroutines on this thread (core/fiber.h) when exactly one of them is a
 * forward and their microbatches differ (bg_sched_pair_partner; the
 * partitioner's replay pairs the same ones): then neither reads what the other
 * writes, the forward adds no gradient and the backward no loss, so every
 * sum happens in the order it does unpaired and the step is bitwise the
 * same. Lane 0 runs i, then the sends between i and j (whose data i or an
 * earlier instruction made); lane 1 waits for the receives between them,
 * then runs j. A lane whose tensor group's collective (or receive) is not
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
            st = run_op(x, o);
        double b = bg_now();
        if (st != BG_OK) {
            L->failed = L->ops[k];
            return st;
        }
        if (compute)
            L->a = a, L->b = b;
        if (x->trace)
            bg__trace_event(x->trace, op_label(o->kind), o->microbatch, o->stage, a, b, (int)x->step + 1);
    }
    return BG_OK;
}

/* Run ops i and j (bg_sched_pair_partner) and what lies between them, as two lanes. */
static bg_status_t run_pair(exec_t *x, size_t i, size_t j)
{
    lane_job_t job[2] = {{.x = x}, {.x = x}};
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
    bg_status_t st[2];
    char msg[2][256];
    bg__pair_run(x->pair, lane_run, &job[0], lane_run, &job[1], st, msg);
    double a = job[0].a < job[1].a ? job[0].a : job[1].a, b = job[0].b > job[1].b ? job[0].b : job[1].b;
    if (st[0] == BG_OK && st[1] == BG_OK) {
        x->busy += b - a;
        return BG_OK;
    }
    int k = st[0] != BG_OK ? 0 : 1;
    const bg_sched_op_t *o = &x->ops[job[k].failed];
    return bg_error(st[k], "%s of microbatch %d (beside %s of microbatch %d): %s", op_label(o->kind), o->microbatch,
                    op_label(x->ops[k ? i : j].kind), x->ops[k ? i : j].microbatch, msg[k]);
}

/* The error of instruction @p op that failed with @p st (@p label: name it; NULL: the message, from
 * run_pair, names the instruction): a peer's failure found by the transport's health check wins. */
static bg_status_t op_failed(exec_t *x, bg_status_t st, const bg_sched_op_t *op, const bg_sched_op_t *label)
{
    bg_status_t st2 = bg_comm_health(x->comm);
    char msg[1024], what[64] = "";
    snprintf(msg, sizeof(msg), "%s", bg_last_error());
    if (st2 != BG_OK && st != BG_ERR_PEER)
        st = st2, snprintf(msg, sizeof(msg), "%s", bg_last_error());
    if (label)
        snprintf(what, sizeof(what), "%s of microbatch %d: ", op_label(label->kind), label->microbatch);
    return bg_error(st, "rank %d (stage %d) at step %lld, %s%s", x->lay.rank, op->stage, (long long)x->step + 1, what, msg);
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

/* This rank's activation memory, predicted as the planner predicts it (one
 * model for both): the peak over the program's points of the slot counts the
 * planner's replay gives (bg_part_schedule_counts: receives posted ahead,
 * forwards, gradient buffers, backwards, lingering sends, and the paired
 * instructions of BRIGADE_TP_OVERLAP=microbatch) times each chunk's per-slot
 * buffers (bg_stage_memory), plus each stage's scratch. And the simulator's
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
        st = input_shape(x, ch, 0, &in);
        x->step = save;
        if (st == BG_OK)
            st = bg_stage_memory(ch->st, in, &mem);
        if (st != BG_OK)
            break;
        bg_log(BG_LOG_DEBUG, "memory",
               "stage %d per microbatch: stash %zu data %zu dout %zu; split_bw %zu fused_bw %zu recompute %zu scratch %zu",
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
    if (st == BG_OK)
        st = bg_part_schedule_counts(x->sched, x->lay.me.pp, x->pair != NULL, &rows, &nrows);
    size_t peak = 0;
    for (int k = 0; st == BG_OK && k < nrows; k++) {
        size_t sum = 0;
        for (int v = 0; v < x->V; v++)
            sum += bg_part_row_bytes(&rows[(size_t)k * x->V + v], &b[v]);
        if (sum > peak)
            peak = sum;
    }
    if (st == BG_OK)
        x->predicted_act_bytes = peak + fixed;
    free(rows);
    free(b);
    return st;
}

/* Every chunk's parameters whole (the all-gathers of --zero done). */
static bg_status_t zero_settle(exec_t *x)
{
    for (int v = 0; v < x->V; v++)
        if (x->chunks[v].zero)
            BG_CHECK(bg__zero_settle(x->chunks[v].zero));
    return BG_OK;
}

static bg_status_t chunk_models(exec_t *x, bg_model_t ***models_p)
{
    bg_model_t **models = malloc((size_t)x->V * sizeof(*models));
    BG_ALLOC_CHECK(models, (size_t)x->V * sizeof(*models), "model chunk list");
    for (int v = 0; v < x->V; v++)
        models[v] = x->chunks[v].model;
    *models_p = models;
    return BG_OK;
}

/* --ps: every server writes its tensors (weights and optimizer state) as a
 * rank of a job of S ranks, server 0 last: full named tensors, the files of
 * any layout. Workers hold nothing to save. */
static bg_status_t ps_save_checkpoint(exec_t *x, const char *root, int keep)
{
    if (!is_server(x))
        return BG_OK;
    char extra[512];
    snprintf(extra, sizeof(extra),
             "{\"layout\":{\"pp\":%d,\"dp\":%d,\"tp\":1,\"chunks\":%d,\"schedule\":\"%s\",\"ps\":%d,"
             "\"staleness\":%d},\"optimizer\":\"%s\",\"lr\":%g,\"batch\":%d,\"microbatches\":%d}",
             x->lay.pp, x->lay.dp, bg_schedule_chunks(x->sched), bg_schedule_name(x->sched), x->lay.servers, x->p.staleness,
             x->p.optim.kind == BG_OPTIM_ADAMW ? "adamw" : "sgd", (double)x->p.optim.lr, x->p.batch, x->M);
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = root;
    p.step = x->step;
    p.extra_json = extra;
    p.keep = keep;
    return bg__ps_save_checkpoint(x->ps, &p);
}

bg_status_t bg_executor_save_checkpoint(bg_executor_t *x, const char *root, int keep)
{
    if (x->ps)
        return ps_save_checkpoint(x, root, keep);
    bg_model_t **models = NULL;
    for (int v = 0; v < x->V; v++) /* --zero: the full state while saving (full named tensors) */
        if (x->chunks[v].zero)
            BG_CHECK(bg__zero_gather_state(x->chunks[v].zero));
    BG_CHECK(chunk_models(x, &models));
    int nmodels = 0; /* copies > 1: copy 0 is the model (the copies are identical); loading fills every copy */
    for (int v = 0; v < x->V; v++)
        if (x->chunks[v].copy == 0)
            models[nmodels++] = x->chunks[v].model;
    char extra[512];
    snprintf(extra, sizeof(extra),
             "{\"layout\":{\"pp\":%d,\"dp\":%d,\"tp\":%d,\"chunks\":%d,\"schedule\":\"%s\"},"
             "\"optimizer\":\"%s\",\"lr\":%g,\"batch\":%d,\"microbatches\":%d}",
             x->lay.pp, x->lay.dp, x->lay.tp, x->V, bg_schedule_name(x->sched), x->p.optim.kind == BG_OPTIM_ADAMW ? "adamw" : "sgd",
             (double)x->p.optim.lr, x->p.batch, x->M);
    bg_checkpoint_params_t p = BG_CHECKPOINT_PARAMS_INIT;
    p.root = root;
    p.step = x->step;
    p.models = models;
    p.nmodels = nmodels;
    p.comm = x->comm;
    p.writer = x->lay.me.dp == 0 && x->lay.me.tp == 0; /* member 0 writes the tensor group's gathered tensors */
    p.extra_json = extra;
    p.keep = keep;
    bg_status_t st = bg_checkpoint_save(&p);
    free(models);
    for (int v = 0; v < x->V; v++)
        if (x->chunks[v].zero)
            bg_model_optim_free(x->chunks[v].model);
    return st;
}

/* One rank's outcome of verifying or loading a checkpoint; every rank
 * gathers all of them, so all agree on the checkpoint and on why one fails. */
typedef struct load_vote {
    int32_t st;
    int32_t damaged;
    char msg[504];
} load_vote_t;

/* Every rank's outcome of `mine` -> the job's: BG_OK when every rank's was;
 * else the first failing rank's status and message (an incompatibility
 * before damage, which a fallback cannot mend), *damaged_p as it says. */
static bg_status_t agree(exec_t *x, bg_status_t mine, int damaged, int *damaged_p)
{
    load_vote_t v;
    memset(&v, 0, sizeof v);
    v.st = mine;
    v.damaged = damaged;
    if (mine != BG_OK)
        snprintf(v.msg, sizeof v.msg, "%s", bg_last_error());
    *damaged_p = damaged;
    if (x->lay.world == 1)
        return mine;
    load_vote_t *all = malloc((size_t)x->lay.world * sizeof(*all));
    BG_ALLOC_CHECK(all, (size_t)x->lay.world * sizeof(*all), "resume votes");
    bg_status_t st = bg_group_allgather(x->world_group, &v, all, sizeof v);
    if (st != BG_OK) {
        free(all);
        return st;
    }
    int bad = -1;
    for (int r = 0; r < x->lay.world; r++)
        if (all[r].st != BG_OK && (bad < 0 || (all[bad].damaged && !all[r].damaged)))
            bad = r;
    if (bad >= 0) {
        all[bad].msg[sizeof all[bad].msg - 1] = 0;
        *damaged_p = all[bad].damaged;
        st = bg_error((bg_status_t)all[bad].st, "%s", all[bad].msg);
    }
    free(all);
    return st;
}

/* Load checkpoint `dir` on every rank, or on none: the ranks first verify
 * what they would read (apply = 0) and agree, so that a checkpoint damaged
 * in one rank's file leaves every rank's models as they were. */
static bg_status_t load_agreed(exec_t *x, bg_model_t **models, const char *dir, bg_checkpoint_info_t *info,
                               int *damaged_p)
{
    int damaged = 0;
    bg_status_t st;
    if (x->lay.world > 1) {
        bg_checkpoint_info_t probe;
        st = bg__checkpoint_load(dir, models, x->V, &probe, &damaged, 0);
        if (st == BG_OK)
            bg_checkpoint_info_clear(&probe);
        BG_CHECK(agree(x, st, damaged, damaged_p));
    }
    st = bg__checkpoint_load(dir, models, x->V, info, &damaged, 1);
    bg_status_t all = agree(x, st, damaged, damaged_p);
    if (all != BG_OK && st == BG_OK)
        bg_checkpoint_info_clear(info);
    return all;
}

/* The layout recorded by bg_executor_save_checkpoint in the manifest's "extra". */
static void stored_layout(const char *extra_json, int *pp_p, int *dp_p)
{
    *pp_p = *dp_p = 0;
    json_t *e = json_loads(extra_json ? extra_json : "{}", 0, NULL);
    json_t *l = json_object_get(e, "layout");
    if (json_is_integer(json_object_get(l, "pp")))
        *pp_p = (int)json_integer_value(json_object_get(l, "pp"));
    if (json_is_integer(json_object_get(l, "dp")))
        *dp_p = (int)json_integer_value(json_object_get(l, "dp"));
    json_decref(e);
}

static void resume_found(exec_t *x, const char *dir, bg_checkpoint_info_t *info, bg_resume_result_t *r)
{
    x->step = info->step;
    r->found = 1;
    r->step = info->step;
    r->world = info->world;
    snprintf(r->path, sizeof r->path, "%s", dir);
    stored_layout(info->extra_json, &r->pp, &r->dp);
    bg_checkpoint_info_clear(info);
    bg_log(BG_LOG_INFO, "train", "resumed from %s (step %lld)", dir, (long long)r->step);
}

bg_status_t bg_executor_resume_with(bg_executor_t *x, const bg_resume_params_t *pin, bg_resume_result_t *result_p)
{
    bg_resume_params_t p = BG_RESUME_PARAMS_INIT;
    if (!pin || !result_p)
        return bg_error(BG_ERR_INVALID, "bg_executor_resume_with: NULL params or result");
    memcpy(&p, pin, pin->size < sizeof p ? pin->size : sizeof p);
    if (!(p.path && *p.path) && !(p.root && *p.root))
        return bg_error(BG_ERR_INVALID, "bg_executor_resume_with: neither a checkpoint root nor a path");
    bg_resume_result_t r;
    memset(&r, 0, sizeof r);
    bg_model_t **models = NULL;
    BG_CHECK(zero_settle(x));
    for (int v = 0; v < x->V; v++) /* --zero: load the full state, then keep the shard */
        if (x->chunks[v].zero)
            BG_CHECK(bg__zero_expand_state(x->chunks[v].zero));
    BG_CHECK(chunk_models(x, &models));
    bg_checkpoint_info_t info;
    int damaged;
    bg_status_t st = BG_OK;
    if (p.path && *p.path) {
        st = load_agreed(x, models, p.path, &info, &damaged);
        if (st == BG_OK)
            resume_found(x, p.path, &info, &r);
        else
            st = bg_error(st, "cannot resume from %s: %s", p.path, bg_last_error());
        goto out;
    }
    bg__ckpt_dir_t *dirs = NULL;
    size_t n = 0;
    st = bg__checkpoint_dirs(p.root, &dirs, &n);
    if (st == BG_ERR_NOT_FOUND) { /* no root yet: nothing to resume */
        bg_error_clear();
        st = BG_OK;
        goto out;
    }
    for (size_t i = 0; st == BG_OK && i < n; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", p.root, dirs[i].name);
        st = load_agreed(x, models, dir, &info, &damaged);
        if (st == BG_OK) {
            resume_found(x, dir, &info, &r);
            break;
        }
        if (!damaged) /* another model, optimizer or format: an older one is no better */
            break;
        if (r.invalid++ == 0)
            snprintf(r.invalid_what, sizeof r.invalid_what, "%s", bg_last_error());
        bg_log(BG_LOG_INFO, "train", "checkpoint %s is invalid: %s", dir, bg_last_error());
        if (p.strict) {
            st = bg_error(st, "the newest checkpoint is invalid (and strict resume refuses older ones): %s",
                          r.invalid_what);
            break;
        }
        st = BG_OK;
    }
    free(dirs);
    if (st == BG_OK && !r.found && r.invalid && p.strict)
        st = bg_error(BG_ERR_NOT_FOUND, "no valid checkpoint under %s (%d invalid; newest: %s)", p.root, r.invalid,
                      r.invalid_what);
out:
    free(models);
    for (int v = 0; v < x->V; v++)
        if (x->chunks[v].zero)
            bg__zero_take_state(x->chunks[v].zero);
    if (x->ps && st == BG_OK) {
        for (int v = 0; !is_server(x) && v < x->V; v++) /* a worker holds no optimizer state (the loader allocated it) */
            bg_model_optim_free(x->chunks[v].model);
        bg__ps_set_version(x->ps, x->step);
    }
    if (st == BG_OK)
        *result_p = r;
    return st;
}

bg_status_t bg_executor_resume(bg_executor_t *x, const char *root, int *found_p)
{
    bg_resume_params_t p = BG_RESUME_PARAMS_INIT;
    p.root = root;
    bg_resume_result_t *r = malloc(sizeof *r);
    BG_ALLOC_CHECK(r, sizeof *r, "resume result");
    bg_status_t st = bg_executor_resume_with(x, &p, r);
    if (st == BG_OK && r->invalid)
        bg_log(BG_LOG_WARN, "train", "%d invalid checkpoint(s) under %s skipped (%s); %s", r->invalid, root,
               r->invalid_what, r->found ? r->path : "none is valid: nothing resumed");
    if (st == BG_OK)
        *found_p = r->found;
    free(r);
    return st;
}

bg_status_t bg_executor_save_weights(bg_executor_t *x, const char *dir)
{
    BG_CHECK(zero_settle(x));
    if (x->ps && !is_server(x)) { /* the servers write: each its tensors, one file each */
        return BG_OK;
    } else if (!x->ps && x->lay.me.dp != 0) {
        return BG_OK;
    }
    BG_CHECK(bg__fileio_mkdir_p(dir));
    BG_CHECK(bg_check_writable_dir(dir));
    char *meta;
    BG_CHECK(bg_model_metadata_json(x->desc, &meta));
    bg_status_t st = BG_OK;
    for (int v = 0; v < x->V && st == BG_OK; v++) {
        char path[4096];
        if (x->chunks[v].copy > 0)
            continue; /* the copies are identical: copy 0 is the model (its stage = the model stage) */
        if (x->ps && x->lay.servers > 1)
            snprintf(path, sizeof(path), "%s/model-ps%03d.safetensors", dir, x->lay.rank);
        else if (x->S == 1 || x->ps) /* one server: the whole model, however the workers are split */
            snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        else
            snprintf(path, sizeof(path), "%s/model-stage%03d.safetensors", dir, x->chunks[v].stage);
        st = bg_model_save_safetensors(x->chunks[v].model, path, meta);
    }
    free(meta);
    return st;
}

bg_status_t bg_executor_load_weights(bg_executor_t *x, const char *dir)
{
    bg_model_t **models = NULL;
    BG_CHECK(zero_settle(x));
    BG_CHECK(chunk_models(x, &models));
    bg_status_t st = bg_safetensors_load_dir(dir, models, x->V);
    free(models);
    return st;
}

bg_status_t bg_executor_write_trace(bg_executor_t *x)
{
    if (!x->trace)
        return bg_error(BG_ERR_INVALID, "bg_executor_write_trace: the executor was created without a trace_path");
    char meta[512];
    snprintf(meta, sizeof(meta),
             "{\"schedule\":\"%s\",\"pp\":%d,\"dp\":%d,\"tp\":%d,\"microbatches\":%d,\"chunks\":%d,\"steps\":%lld,"
             "\"producer\":\"brigade " BRIGADE_VERSION_STRING "\"}",
             bg_schedule_name(x->sched), x->lay.pp, x->lay.dp, x->lay.tp, x->M, bg_schedule_chunks(x->sched), (long long)x->step);
    return bg__trace_write(x->trace, x->p.trace_path, meta);
}

static void free_chunk(chunk_t *ch)
{
    if (!ch->st) { /* a parameter server's model only */
        bg_model_destroy(ch->model);
        return;
    }
    bg__zero_destroy(ch->zero); /* first: it aims the model's gradient pointers */
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
        bg__zero_cancel(ch->zero);
        bg__xfree(ch->copy_rr);
        bg__xfree(ch->copy_sr);
        ch->copy_rr = ch->copy_sr = NULL;
    }
    for (int t = 0; x->ties && t < x->nties; t++) {
        bg__xfree(x->ties[t].rr);
        bg__xfree(x->ties[t].sr);
        x->ties[t].rr = x->ties[t].sr = NULL;
    }
}

static void exec_free(exec_t *x)
{
    bg__ps_destroy(x->ps); /* first: its requests point into the model */
    free(x->ps_models);
    if (x->trace)
        bg__trace_destroy(x->trace);
    for (int t = 0; x->ties && t < x->nties; t++)
        bg_backend_free(x->be, x->ties[t].buf);
    free(x->ties);
    if (x->chunks)
        for (int v = 0; v < x->V; v++) {
            bg_backend_free(x->be, x->chunks[v].copy_buf);
            free_chunk(&x->chunks[v]);
        }
    free(x->chunks);
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
    bg_backend_destroy(x->be);
    bg_schedule_free(x->sched);
    free(x->tokens);
    free(x->targets);
    free(x->features);
    free(x->first);
    free(x->last);
    bg__emulate_free(x->em);
    bg__pair_destroy(x->pair);
}

static bg_status_t check_params(const bg_executor_params_t *p)
{
    if (!p->model)
        return bg_error(BG_ERR_INVALID, "executor: no model description");
    BG_CHECK(bg_model_desc_check(p->model));
    if (p->size >= offsetof(bg_executor_params_t, zero) + sizeof(int) && (p->zero < 0 || p->zero > 2))
        return bg_error(BG_ERR_INVALID, "zero = %d: the sharding stage must be 0, 1 or 2", p->zero);
    if (p->pp < 1 || p->dp < 1)
        return bg_error(BG_ERR_INVALID, "pp and dp must be >= 1 (got %d, %d)", p->pp, p->dp);
    BG_CHECK(bg__tp_check_params(p->model, p->tp));
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
    return BG_OK;
}

/* The job's groups: this rank's data-parallel group and the world. */
static bg_status_t make_groups(exec_t *x)
{
    int *ranks = malloc((size_t)(x->lay.world > x->lay.dp ? x->lay.world : x->lay.dp) * sizeof(int));
    BG_ALLOC_CHECK(ranks, (size_t)x->lay.world * sizeof(int), "group ranks");
    bg__layout_dp_ranks(&x->lay, ranks);
    /* --ps: the workers do not reduce among themselves */
    bg_status_t st = x->lay.servers > 0 ? BG_OK : bg_group_create(x->comm, x->lay.dp, ranks, &x->dp_group);
    for (int r = 0; st == BG_OK && r < x->lay.world; r++)
        ranks[r] = r;
    if (st == BG_OK)
        st = bg_group_create(x->comm, x->lay.world, ranks, &x->world_group);
    free(ranks);
    return st;
}

/* --zero 1|2: the chunk's sharded optimizer state over its buckets. */
static bg_status_t make_zero(exec_t *x, chunk_t *ch)
{
    bg__zero_bucket_t *zb = calloc((size_t)ch->nbuckets + 1, sizeof(*zb));
    BG_ALLOC_CHECK(zb, sizeof(*zb), "zero buckets");
    for (int b = 0; b < ch->nbuckets; b++)
        zb[b] = (bg__zero_bucket_t){ch->buckets[b].lo, ch->buckets[b].hi, ch->buckets[b].off, ch->buckets[b].count};
    bg_status_t st = bg__zero_create(x->p.zero, ch->model, x->dp_group, zb, ch->nbuckets, x->p.optim.kind, &ch->zero);
    free(zb);
    return st;
}

/* Model, stage, buckets and bookkeeping of virtual stage `stage` on this rank. */
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
    ch->copy_partner = -1;
    if (x->copies == 2)
        ch->copy_partner = bg__layout_stage_rank(&x->lay, bg__layout_twin(&x->lay, stage), x->lay.me.dp);
    ch->prev_local = !ch->is_first && bg__layout_stage_pp(&x->lay, stage - 1) == x->lay.me.pp;
    ch->next_local = !ch->is_last && bg__layout_stage_pp(&x->lay, stage + 1) == x->lay.me.pp;
    ch->prev_rank = !ch->is_first ? bg__layout_stage_rank(&x->lay, stage - 1, x->lay.me.dp) : -1;
    ch->next_rank = !ch->is_last ? bg__layout_stage_rank(&x->lay, stage + 1, x->lay.me.dp) : -1;
    if (is_server(x)) { /* its tensors' parameters and optimizer state: no stage */
        unsigned char *which = NULL;
        BG_CHECK(bg__ps_owned(x->desc, x->lay.servers, x->lay.rank, &which));
        bg_status_t st = bg_model_create_tensors(x->desc, x->be, which, &ch->model);
        free(which);
        BG_CHECK(st);
        x->params += bg_model_param_count(ch->model);
        return bg_model_optim_init(ch->model, x->p.optim.kind);
    }
    BG_CHECK(bg_model_create(x->desc, x->be, ch->first, ch->last, &ch->model));
    BG_CHECK(bg_stage_create(ch->model, x->M, &ch->st));
    const bg_executor_params_t *p = &x->p;
    /* dualpipe: both copies of a model stage recompute alike */
    if (p->recompute || (p->recompute_stages && ms < p->nrecompute_stages && p->recompute_stages[ms]))
        bg_stage_set_recompute(ch->st, 1);
    bg_stage_set_emulate(ch->st, x->em != NULL);
    BG_CHECK(make_buckets(ch));
    ch->tsq = calloc((size_t)bg_model_num_tensors(ch->model) + 1, sizeof(double));
    BG_ALLOC_CHECK(ch->tsq, sizeof(double), "per-tensor gradient norms");
    hook_arg_t *h = malloc(sizeof(*h));
    BG_ALLOC_CHECK(h, sizeof(*h), "backward hook");
    h->x = x;
    h->ch = ch;
    ch->hook = h;
    bg_stage_set_layer_done(ch->st, on_layer_done, h);
    /* optimizer state now, so the activation peak measured later is activations only */
    if (p->zero)
        BG_CHECK(make_zero(x, ch));
    else if (x->lay.servers == 0) /* a parameter server's worker holds no optimizer state */
        BG_CHECK(bg_model_optim_init(ch->model, p->optim.kind));
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
    x->params += bg_model_param_count(ch->model);
    if (x->copies > 1) { /* the other copy's gradient: allocated with the parameters, not in the step */
        size_t bytes = bg_model_param_count(ch->model) * sizeof(float);
        ch->copy_buf = bg_backend_alloc(x->be, bytes ? bytes : sizeof(float), "copy gradient");
        if (!ch->copy_buf)
            return bg_error(BG_ERR_NOMEM, "the other copy's gradient of stage %d (%zu bytes)", stage, bytes);
    }
    return BG_OK;
}

/* Where each tie's tensors live: here, or on which rank of this replica. */
static bg_status_t make_ties(exec_t *x)
{
    x->nties = bg_model_desc_num_ties(x->desc);
    if (x->nties == 0)
        return BG_OK;
    if (x->nties > 0xffff)
        return bg_error(BG_ERR_UNSUPPORTED, "%d ties: at most 65535", x->nties);
    x->ties = calloc((size_t)x->nties, sizeof(*x->ties));
    BG_ALLOC_CHECK(x->ties, (size_t)x->nties * sizeof(*x->ties), "ties");
    for (int t = 0; t < x->nties; t++) {
        tie_t *ti = &x->ties[t];
        const char *na, *nb;
        bg_model_desc_tie_names(x->desc, t, &na, &nb);
        for (int v = 0; v < x->V; v++) {
            if (!ti->a)
                ti->a = bg_model_find_tensor(x->chunks[v].model, na);
            if (!ti->b)
                ti->b = bg_model_find_tensor(x->chunks[v].model, nb);
        }
        ti->partner = -1;
        if (x->copies > 1 && !!ti->a != !!ti->b) /* the copies' partner ranks are not worked out */
            return bg_error(BG_ERR_UNSUPPORTED, "dualpipe: tie %s = %s has one tensor on pipeline rank %d and the "
                            "other elsewhere; only ties whose tensors share a rank (as the input embedding and "
                            "output head do: ranks 0 and p-1 hold the first and last stage) are summed", na, nb,
                            x->lay.me.pp);
        if (!!ti->a != !!ti->b) {
            int layer = bg_model_desc_tensor_layer(x->desc, ti->a ? nb : na), stage = 0;
            while (stage < x->S - 1 && x->last[stage] < layer)
                stage++;
            ti->partner = bg__layout_stage_rank(&x->lay, stage, x->lay.me.dp);
        }
    }
    return BG_OK;
}

/* --ps S: the batch over the layout's workers (each a replica); a server
 * holds one model of its tensors, whatever the workers' chunks. */
static bg_status_t ps_batch(exec_t *x)
{
    int W = x->lay.dp;
    if (x->p.batch % (W * x->M) != 0)
        return bg_error(BG_ERR_INVALID, "batch %d does not split into %d workers x %d equal microbatches",
                        x->p.batch, W, x->M);
    x->mbn = x->p.batch / (W * x->M);
    if (is_server(x))
        x->V = 1;
    return BG_OK;
}

/* --ps: this rank's part, with the pipeline rank holding each tensor (from
 * the schedule's stage placement: every rank computes the same). */
static bg_status_t make_ps(exec_t *x)
{
    int n = bg_model_desc_num_tensors(x->desc);
    int *holder = calloc((size_t)n + 1, sizeof(int));
    bg_model_t **models = NULL;
    BG_ALLOC_CHECK(holder, ((size_t)n + 1) * sizeof(int), "parameter server tensor placement");
    bg_status_t st = chunk_models(x, &models);
    for (int i = 0; st == BG_OK && i < n; i++) {
        char name[2 * BG_NAME_MAX];
        size_t numel;
        st = bg_model_desc_tensor(x->desc, i, name, sizeof name, &numel);
        int layer = st == BG_OK ? bg_model_desc_tensor_layer(x->desc, name) : 0, stage = 0;
        while (stage < x->S - 1 && x->last[stage] < layer)
            stage++;
        holder[i] = bg__layout_stage_pp(&x->lay, stage);
    }
    bg__ps_params_t pp = {.comm = x->comm, .be = x->be, .stg = &x->stg, .emulate = x->em != NULL, .desc = x->desc,
                          .models = models, .nmodels = x->V, .servers = x->lay.servers, .staleness = x->p.staleness,
                          .pp = x->lay.pp, .holder = holder, .loss_rank = bg__layout_stage_pp(&x->lay, x->S - 1),
                          .layout = &x->lay};
    if (st == BG_OK)
        st = bg__ps_create(&pp, &x->ps);
    free(holder);
    if (st != BG_OK)
        free(models);
    else
        x->ps_models = models;
    return st;
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
    memcpy(&x->p, pin, pin->size < sizeof(x->p) ? pin->size : sizeof(x->p));
    x->p.size = sizeof(x->p);
    x->desc = x->p.model;
    x->tie_step = -1;
    x->fetched_step = -1;
    x->numa_node = -1;
    bg__layout_init(&x->lay, x->p.pp, x->p.dp, x->p.tp, x->p.ps);
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

    /* the schedule first: a bad schedule fails before anyone connects */
    if (x->p.schedule_json) { /* the user's program (zero when pin is older than the field) */
        BG_CHECK_GOTO(bg_schedule_load_program(x->p.schedule_json, x->lay.pp, x->M, x->p.chunks, &x->sched), st, err);
    } else {
        bg_schedule_kind_t kind = BG_SCHED_1F1B;
        if (x->p.schedule)
            BG_CHECK_GOTO(bg_schedule_kind_parse(x->p.schedule, &kind), st, err);
        bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
        sp.kind = kind;
        sp.stages = x->lay.pp;
        sp.microbatches = x->M;
        sp.chunks = x->p.chunks;
        BG_CHECK_GOTO(bg_schedule_generate(&sp, &x->sched), st, err);
        BG_CHECK_GOTO(bg_schedule_validate(x->sched), st, err);
    }
    x->V = bg_schedule_chunks(x->sched);
    x->S = bg_schedule_stages(x->sched);
    x->copies = bg_schedule_copies(x->sched);
    x->L = x->S / x->copies;
    if (x->copies > 2 || (x->copies > 1 && x->p.zero == 2)) { /* level 2 has no whole gradient buffer */
        st = bg_error(BG_ERR_UNSUPPORTED, "%s: %d copies of the model%s", bg_schedule_name(x->sched), x->copies,
                      x->copies > 2 ? " (the executor sums two)" : " with --zero 2 is not supported (--zero 1 is)");
        goto err;
    }
    if (x->lay.servers > 0 && x->copies > 1) {
        st = bg_error(BG_ERR_UNSUPPORTED, "--ps with %s: its two copies of each stage would push every tensor twice; "
                      "not built (every other schedule is)", bg_schedule_name(x->sched));
        goto err;
    }
    if (x->M > 0xfffe || x->S > 0x3ffe) { /* the message tags' fields */
        st = bg_error(BG_ERR_UNSUPPORTED, "%d microbatches on %d stages: at most 65534 microbatches and 16382 stages",
                      x->M, x->S);
        goto err;
    }
    x->first = calloc((size_t)x->S, sizeof(int));
    x->last = calloc((size_t)x->S, sizeof(int));
    if (!x->first || !x->last) {
        st = bg_error(BG_ERR_NOMEM, "stage table");
        goto err;
    }
    /* layers per model stage; every copy of a stage holds the same layers */
    BG_CHECK_GOTO(layer_ranges(&x->p, bg_model_desc_num_layers(x->desc), x->L, x->first, x->last), st, err);
    for (int s = x->L; s < x->S; s++)
        x->first[s] = x->first[s % x->L], x->last[s] = x->last[s % x->L];
    if (x->p.emulate) {
        BG_CHECK_GOTO(bg__emulate_load(x->p.emulate, x->p.emulate_scale > 0 ? x->p.emulate_scale : 1.0,
                                       bg_model_desc_num_layers(x->desc), x->first, x->last, x->S, &x->em),
                      st, err);
        if (!x->p.schedule_json) /* a generated program is built for the emulated costs */
            BG_CHECK_GOTO(bg__emulate_regenerate(x->em, &x->sched), st, err);
    }

    if (x->p.comm) {
        x->comm = x->p.comm;
    } else {
        bg_comm_params_t cp = BG_COMM_PARAMS_INIT;
        cp.ucx_log_handler = x->p.process_wide;
        BG_CHECK_GOTO(bg_comm_create(&cp, &x->comm), st, err);
        x->own_comm = 1;
    }
    bg_log_set_rank(bg_comm_rank(x->comm));
    BG_CHECK_GOTO(bg__layout_bind(&x->lay, bg_comm_size(x->comm), bg_comm_rank(x->comm)), st, err);
    bg__layout_set_schedule(&x->lay, x->sched);
    if (x->lay.servers > 0)
        BG_CHECK_GOTO(ps_batch(x), st, err);
    BG_CHECK_GOTO(make_groups(x), st, err);
    BG_CHECK_GOTO(bg__tp_create(x->comm, x->desc, x->lay.tp, bg__layout_tp_first(&x->lay), &x->tp), st, err);
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = x->p.threads;
    bp.set_blas_threads = x->p.process_wide;
    bp.tune_malloc = x->p.process_wide;
    bp.device = bg_comm_local_rank(x->comm) < 0 ? 0 : bg_comm_local_rank(x->comm);
    bp.device_wrap = 1; /* ranks share a machine's GPUs round-robin */
    bp.precision = bg_model_desc_precision(x->desc);
    BG_CHECK_GOTO(bg_backend_create(x->p.backend ? x->p.backend : "cpu", &bp, &x->be), st, err);
    if (x->p.process_wide) { /* after the backend (its device's node), before the buffers */
        char bus[64];
        int dev_node = bg__numa_device_node(x->be, "/sys", bus, sizeof(bus));
        BG_CHECK_GOTO(bg__numa_bind(bg_comm_local_rank(x->comm), dev_node, bus, &x->numa_node), st, err);
    }
    BG_CHECK_GOTO(bg__staging_init(&x->stg, x->be, x->comm), st, err);
    if (x->stg.on && x->lay.world > 1)
        bg_log(BG_LOG_INFO, "executor", "rank %d: UCX %s; sends and receives of device buffers %s", x->lay.rank,
               bg_transport_ucx_version(),
               x->stg.direct ? "hand the buffer to UCX (reductions staged)" : "staged through host memory");
    if (x->stg.on && (x->p.tp > 1 || (x->p.zero > 0 && x->p.dp > 1))) {
        st = bg_error(BG_ERR_UNSUPPORTED, "backend %s: %s with buffers staged through the host is not built yet "
                      "(the tensor group's sums and ZeRO's collectives take host buffers only)",
                      x->p.backend ? x->p.backend : "cpu", x->p.tp > 1 ? "--tp > 1" : "--zero > 0");
        goto err;
    }
    size_t per = (size_t)x->mbn * (size_t)x->Tmax;
    x->per_mb_floats = per;
    x->tokens = malloc(per * sizeof(int32_t));
    x->targets = malloc(per * sizeof(int32_t));
    x->features = x->tokens_in ? NULL : malloc(per * (size_t)mp->features * sizeof(float));
    x->chunks = calloc((size_t)x->V, sizeof(chunk_t));
    if (!x->tokens || !x->targets || (!x->tokens_in && !x->features) || !x->chunks) {
        st = bg_error(BG_ERR_NOMEM, "executor buffers");
        goto err;
    }
    for (int v = 0; v < x->V; v++) {
        int stage = bg__layout_chunk_stage(&x->lay, x->lay.me.pp, v);
        BG_CHECK_GOTO(make_chunk(x, &x->chunks[v], stage), st, err);
        x->has_first |= x->chunks[v].is_first;
        x->has_last |= x->chunks[v].is_last;
    }
    BG_CHECK_GOTO(make_ties(x), st, err);
    if (x->lay.servers > 0)
        BG_CHECK_GOTO(make_ps(x), st, err);
    if (x->p.trace_path)
        BG_CHECK_GOTO(bg__trace_create(x->comm, x->lay.rank, &x->trace), st, err);
    if (x->lay.tp > 1 && !is_server(x) && strcmp(bg_config_str("BRIGADE_TP_OVERLAP"), "microbatch") == 0) {
        const char *no = !bg_plan_paired_for(x->lay.tp, x->p.zero, x->lay.dp) ? "--zero"
                         : x->lay.servers                               ? "--ps"
                         : x->em                                     ? "--emulate"
                         : x->be->ops->event_record                  ? "a backend that queues work"
                                                                     : NULL;
        if (no) /* each would put collectives of its own inside both lanes, or the lanes' work on one queue */
            bg_log(BG_LOG_WARN, "executor", "BRIGADE_TP_OVERLAP=microbatch is not built with %s: rank %d overlaps "
                                            "as with =weight", no, x->lay.rank);
        else
            BG_CHECK_GOTO(bg__pair_create((size_t)8 << 20, &x->pair), st, err);
    }
    bg__tp_set_trace(x->tp, x->trace, &x->step);
    if (!is_server(x))
        BG_CHECK_GOTO(predict_activations(x), st, err);
    {
        int L = bg_model_desc_num_layers(x->desc), cnt;
        bg_layer_profile_t *prof = calloc((size_t)L, sizeof(*prof));
        if (!prof) {
            st = bg_error(BG_ERR_NOMEM, "profile");
            goto err;
        }
        int T0 = 0;
        st = seq_len(x, 0, 0, &T0);
        if (st == BG_OK)
            st = bg_model_profile(x->desc, x->p.batch / x->M, T0, prof, L, &cnt);
        for (int i = 0; st == BG_OK && i < cnt; i++)
            x->flops_per_step += (prof[i].fwd_flops + prof[i].bwd_flops) * x->M;
        free(prof);
        if (st != BG_OK)
            goto err;
    }
    x->ops = bg_schedule_rank_ops(x->sched, x->lay.me.pp, &x->nops);
    if (is_server(x))
        x->nops = 0; /* a server runs bg__ps_server_step instead of a program */
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
static bg_status_t step_failed(exec_t *x, bg_status_t st)
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
static bg_step_result_t step_result(const exec_t *x, double tokens, double dt)
{
    bg_step_result_t r = {0};
    r.step = x->step;
    r.tokens = tokens;
    r.step_ms = dt * 1e3;
    r.tokens_per_s = dt > 0 ? tokens / dt : 0;
    r.peak_bytes = bg_backend_memstats(x->be).peak;
    return r;
}

/* --ps, a worker, after its program: push what is left and the loss share;
 * K = 0: receive the next version (and the step's loss) first. */
static bg_status_t ps_worker_end(exec_t *x, double t0, double tokens, bg_step_result_t *result_p)
{
    int64_t step = x->step;
    bg__ps_stats_t ps;
    double a = bg_now();
    bg_status_t st = bg__ps_worker_end(x->ps, step, x->loss, x->stop_req, &ps);
    if (x->trace) /* the last pushes and, at K = 0, the wait for the next version */
        bg__trace_event(x->trace, "push_pull", -1, 0, a, bg_now(), (int)step + 1);
    if (st != BG_OK) {
        st = bg_error(st, "worker %d (rank %d) at step %lld: %s", x->lay.me.dp, x->lay.rank, (long long)step + 1,
                      bg_last_error());
        return step_failed(x, st);
    }
    double dt = bg_now() - t0;
    if (x->trace)
        bg__trace_event(x->trace, "step", -1, -1, t0, t0 + dt, (int)step + 1);
    x->step = step + 1;
    bg_step_result_t r = step_result(x, tokens, dt);
    r.loss = ps.loss; /* K = 0: the global loss (server 0's sum); K > 0: this worker's own batch */
    r.bubble = dt > 0 ? 1.0 - x->busy / dt : 0;
    r.bytes_sent = ps.bytes_sent;
    r.stop = ps.stop;
    r.grad_norm = NAN;
    r.ps_role = 2;
    r.staleness = ps.staleness;
    r.bytes_recv = ps.bytes_recv;
    *result_p = r;
    return BG_OK;
}

/* --ps, a server: the workers' pushes of this step, the update of its tensors, the new version sent. */
static bg_status_t ps_server_step(exec_t *x, double tokens, bg_step_result_t *result_p)
{
    int64_t step = x->step;
    bg__ps_stats_t ps;
    double t0 = bg_now();
    bg_status_t st = bg__ps_server_step(x->ps, &x->p.optim, step, &ps);
    if (st != BG_OK) {
        st = bg_error(st, "parameter server %d (rank %d) at step %lld: %s", x->lay.rank, x->lay.rank, (long long)step + 1,
                      bg_last_error());
        return step_failed(x, st);
    }
    double dt = bg_now() - t0;
    if (x->trace) { /* waiting for the workers' pushes, then the sum and the update */
        double w = t0 + ps.idle_ms / 1e3;
        bg__trace_event(x->trace, "push_wait", -1, -1, t0, w, (int)step + 1);
        bg__trace_event(x->trace, "update", -1, -1, w, w + ps.optim_ms / 1e3, (int)step + 1);
        bg__trace_event(x->trace, "step", -1, -1, t0, t0 + dt, (int)step + 1);
    }
    x->step = step + 1;
    bg_step_result_t r = step_result(x, tokens, dt);
    r.loss = ps.loss;
    r.bubble = dt > 0 ? ps.idle_ms / 1e3 / dt : 0;
    r.bytes_sent = ps.bytes_sent;
    r.stop = ps.stop;
    r.grad_norm = sqrt(ps.grad_sumsq);
    r.ps_role = 1;
    r.bytes_recv = ps.bytes_recv;
    r.optim_ms = ps.optim_ms;
    r.idle = r.bubble;
    r.live_workers = ps.live;
    *result_p = r;
    return BG_OK;
}

bg_status_t bg_executor_step(bg_executor_t *x, bg_step_result_t *result_p)
{
    if (x->broken)
        return bg_error(BG_ERR_INVALID, "executor: an earlier step failed; destroy it and resume from a checkpoint");
    bg_status_t st = BG_OK;
    int64_t step = x->step;
    double tokens;
    BG_CHECK(step_tokens(x, step, &tokens));
    if (is_server(x))
        return ps_server_step(x, tokens, result_p);
    x->loss_scale = (float)(1.0 / tokens);
    x->loss = 0;
    x->loss_k = 0;
    x->busy = 0;
    x->bytes_sent = 0;
    double t0 = bg_now();
    if (x->ps && (st = bg__ps_worker_begin(x->ps, step)) != BG_OK) {
        st = bg_error(st, "worker %d (rank %d) at step %lld: %s", x->lay.me.dp, x->lay.rank, (long long)step + 1,
                      bg_last_error());
        goto fail;
    }
    if (x->ps && x->trace) /* waiting for parameters recent enough (and for the last pushes to leave) */
        bg__trace_event(x->trace, "pull_wait", -1, 0, t0, bg_now(), (int)step + 1);
    for (int v = 0; v < x->V; v++) {
        if (x->chunks[v].zero)
            BG_CHECK(bg__zero_begin_step(x->chunks[v].zero));
        bg_model_zero_grads(x->chunks[v].model);
        x->chunks[v].gsq = 0;
    }
    for (size_t i = 0; i < x->nops; i++) {
        const bg_sched_op_t *op = &x->ops[i];
        bg__staging_progress(&x->stg); /* sends and reductions whose copies completed leave now */
        BG_CHECK_GOTO(post_ahead(x, x->ops, x->nops, i), st, fail);
        size_t j = x->pair ? bg_sched_pair_partner(x->ops, x->nops, i) : 0;
        if (j) {
            BG_CHECK_GOTO(post_ahead(x, x->ops, x->nops, j), st, fail);
            if ((st = run_pair(x, i, j)) != BG_OK) {
                st = op_failed(x, st, op, NULL);
                goto fail;
            }
            BG_CHECK_GOTO(reap_pending(x, 2), st, fail);
            i = j;
            continue;
        }
        int compute = op->kind <= BG_OP_BACKWARD_WEIGHT || op->kind == BG_OP_OPTIMIZER_STEP;
        double a = bg_now();
        st = run_op(x, op);
        double b = bg_now();
        if (st != BG_OK) {
            st = op_failed(x, st, op, op);
            goto fail;
        }
        if (compute)
            x->busy += b - a;
        if (x->trace)
            bg__trace_event(x->trace, op_label(op->kind), op->microbatch, op->stage, a, b, (int)step + 1);
        /* a compute instruction is over: the slots sent before it end now, done or not */
        BG_CHECK_GOTO(reap_pending(x, op->kind <= BG_OP_BACKWARD_WEIGHT ? 2 : 0), st, fail);
    }
    BG_CHECK_GOTO(reap_pending(x, 1), st, fail);
    for (int k = 0; k < x->loss_k; k++) { /* the step's end: the losses, in the order their forwards ran */
        int mb = x->loss_mb[k];
        x->loss += x->be->ops->sum(x->be, x->loss_dev + (size_t)mb * x->per_mb_floats, x->loss_n[mb]) *
                   (double)x->loss_scale;
    }
    x->loss_k = 0;
    x->be->ops->synchronize(x->be);
    if (x->ps)
        return ps_worker_end(x, t0, tokens, result_p);
    double dt = bg_now() - t0;
    if (x->trace)
        bg__trace_event(x->trace, "step", -1, -1, t0, t0 + dt, (int)step + 1);
    /* the step's loss (the last stage of each replica holds its share), the
     * squared gradient norm (each rank's chunks, in chunk order; replica 0
     * only, as every replica holds the same reduced gradients) and whether
     * any rank was asked to stop: one allreduce, so all agree. The transport
     * sums float32, so the double sum of squares travels as hi + lo floats:
     * exact for one contributing rank, within ~1e-7 relative for several. */
    double gsq = 0;
    for (int v = 0; (x->lay.me.dp == 0 || x->p.zero) && v < x->V; v++) /* --zero: each replica its shard */
        gsq += x->chunks[v].gsq;
    float hi = gsq > FLT_MAX ? INFINITY : (float)gsq;
    float lo = isfinite(hi) ? (float)(gsq - (double)hi) : 0.0f;
    float red[4] = {(float)x->loss, x->stop_req ? 1.0f : 0.0f, hi, lo};
    if (x->lay.world > 1) {
        BG_CHECK_GOTO(bg_group_allreduce(x->world_group, red, 4, BG_REDUCE_SUM), st, fail);
        gsq = (double)red[2] + (double)red[3];
    }
    x->step = step + 1;
    bg_step_result_t r = step_result(x, tokens, dt);
    r.loss = red[0];
    r.bubble = dt > 0 ? 1.0 - x->busy / dt : 0;
    r.bytes_sent = x->bytes_sent;
    r.stop = red[1] > 0;
    r.grad_norm = sqrt(gsq);
    *result_p = r;
    return BG_OK;
fail:
    return step_failed(x, st);
}

void bg_executor_set_lr(bg_executor_t *x, float lr) { x->p.optim.lr = lr; }
void bg_executor_request_stop(bg_executor_t *x) { x->stop_req = 1; }
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
    size_t optim = x->params, grads = x->params * sizeof(float); /* optimizer elements, gradient bytes */
    if (x->p.zero)
        for (int v = optim = grads = 0; v < x->V; v++) {
            optim += bg__zero_owned(x->chunks[v].zero);
            grads += bg__zero_grad_bytes(x->chunks[v].zero);
        }
    if (x->copies > 1) /* the other copy's gradient, received before the optimizer step */
        grads += x->params * sizeof(float);
    i.predicted_bytes = x->params * sizeof(float) + grads + optim * bg_optim_state_bytes(x->p.optim.kind) +
                        x->predicted_act_bytes;
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
    if (x->broken)
        cancel_all(x);
    else if (zero_settle(x) != BG_OK)
        cancel_all(x);
    if (x->ps) {
        /* the last versions are delivered; workers that died are the mode's
         * business, not an unclean end (a server's death still is) */
        if (!x->broken && bg__ps_settle(x->ps, x->step) != BG_OK)
            bg_log(BG_LOG_WARN, "ps", "rank %d: %s", x->lay.rank, bg_last_error());
        int servers_alive = 1;
        for (int s = 0; s < x->lay.servers; s++)
            servers_alive &= s == x->lay.rank || bg_comm_peer_alive(x->comm, s);
        /* a broken worker (a rank of its pipeline died) leaves as failed, so
         * the rest of its pipeline learns it at once (a bye would not tell them) */
        if (servers_alive && !x->broken)
            bg_comm_acknowledge_failures(x->comm);
    }
    exec_free(x);
    bg_status_t st = BG_OK;
    if (x->own_comm)
        st = bg_comm_destroy(x->comm);
    free(x);
    return st;
}
