/* runtime/exec_grads.c: the executor's gradients: each chunk's buckets
 * (contiguous layer ranges of its flat gradient buffer, last layers first),
 * started as soon as the last microbatch has finished their layers so the
 * reductions overlap the backward and the pipeline's drain; the once-a-step
 * point before the first optimizer step; the gradient norm; and the default
 * optimizer step, bucket by bucket.
 *
 * What a bucket's reduction is (an all-reduce, a reduce-scatter, a push to
 * the servers, none) is the strategies' (the ONE hook reduce); this file
 * must not branch on which strategies are active. */
#include <stdlib.h>

#include "core/check.h"
#include "runtime/exec_impl.h"

void bg__exec_trace_bucket(exec_t *x, chunk_t *ch, int b)
{
    if (x->trace) { /* the moment the bucket's reduction starts (microbatch field: bucket index) */
        double now = bg_now();
        bg__trace_event(x->trace, "ar_start", b, ch->stage, now, now, (int)x->step + 1);
    }
}

size_t bg__exec_bucket_run(const chunk_t *ch, int b, size_t from, int *expert_p)
{
    const float *base = bg_model_params(ch->model);
    size_t hi = ch->buckets[b].off + ch->buckets[b].count;
    int kind = -1;
    for (int i = 0; i < bg_model_num_tensors(ch->model); i++) {
        const bg_param_t *p = bg_model_tensor(ch->model, i);
        size_t o = (size_t)(p->data - base);
        if (!p->numel || o < from || o >= hi)
            continue;
        if (kind >= 0 && p->split_ep != kind)
            return o;
        *expert_p = kind = p->split_ep;
    }
    if (kind < 0)
        *expert_p = 0;
    return hi;
}

/* Start the reduction of every bucket whose layers are all >= layer. */
bg_status_t bg__exec_start_buckets(exec_t *x, chunk_t *ch, int layer)
{
    bg__strategy_t *r = BG__ONE(x, reduce);
    for (int b = 0; b < ch->nbuckets; b++) {
        bg__bucket_t *bk = &ch->buckets[b];
        if (bk->started || bk->lo < layer)
            continue;
        bk->started = 1;
        if (r && bk->count)
            BG_CHECK(r->ops->reduce(x, r->self, ch, b));
    }
    return BG_OK;
}

bg_status_t bg__exec_wait_bucket(exec_t *x, chunk_t *ch, int b)
{
    double t0 = bg_now();
    int had = ch->buckets[b].req != NULL;
    bg_status_t st = bg__exec_wait_free(&ch->buckets[b].req);
    if (x->trace && had) /* time spent waiting for the reduction after the backward */
        bg__trace_event(x->trace, "ar_wait", b, ch->stage, t0, bg_now(), (int)x->step + 1);
    ch->buckets[b].started = 0;
    return st;
}

bg_status_t bg__exec_wait_buckets(exec_t *x, chunk_t *ch)
{
    /* once one reduction failed the step is lost: the others are freed by
     * cancel_all, not waited for (one with a rank that left the job would
     * otherwise hold this rank until BRIGADE_TIMEOUT) */
    for (int b = 0; b < ch->nbuckets; b++)
        BG_CHECK(bg__exec_wait_bucket(x, ch, b));
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
    exec_t *x = h->x;
    chunk_t *ch = h->ch;
    bg__staging_progress(&x->stg); /* during the backward too */
    int last = mb == ch->mb_last;  /* the chunk's last microbatch (DualPipe: of its copy) */
    /* sequence parallelism: the layer's replicated tensors saw this member's
     * rows only; their sums over the tensor group come before the replicas':
     * once a step, or every microbatch whose gradients a strategy reduces now */
    bg__strategy_t *pm = BG__ONE(x, per_microbatch);
    if (last || (pm && pm->ops->per_microbatch(x, pm->self, ch, layer)))
        BG_CHECK(bg_model_tp_sum_grads(ch->model, layer));
    BG__EACH_STRATEGY(x, s) if (s->ops->layer_done) BG_CHECK(s->ops->layer_done(x, s->self, ch, layer, mb));
    if (!last)
        return BG_OK;
    return bg__exec_start_buckets(x, ch, layer);
}

/* The stage calls this before each layer's compute: the strategies' layer_begin hooks. */
static bg_status_t on_layer_begin(int layer, int mb, bg_stage_pass_t pass, void *arg)
{
    hook_arg_t *h = arg;
    BG__EACH_STRATEGY(h->x, s)
    if (s->ops->layer_begin)
        BG_CHECK(s->ops->layer_begin(h->x, s->self, h->ch, layer, mb, pass));
    return BG_OK;
}

/* Buckets of about BRIGADE_BUCKET_MB (or what a strategy asks) over the
 * chunk's layers, from the last; and the layer-done callback that starts them. */
bg_status_t bg__exec_make_buckets(exec_t *x, chunk_t *ch)
{
    long long mb = 4;
    if (bg_config_int("BRIGADE_BUCKET_MB", &mb) != BG_OK || mb < 0)
        mb = 4;
    size_t target = (size_t)mb * 1048576 / sizeof(float);
    bg__strategy_t *bf = BG__ONE(x, bucket_floats);
    if (bf)
        target = bf->ops->bucket_floats(x, bf->self, ch, target);
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
            bg__bucket_t *bk = &ch->buckets[ch->nbuckets++];
            bk->lo = ch->first + i;
            bk->hi = ch->first + hi;
            bk->off = off[i];
            bk->count = off[hi + 1] - off[i];
            hi = i - 1;
        }
    }
    free(off);
    hook_arg_t *h = malloc(sizeof(*h));
    BG_ALLOC_CHECK(h, sizeof(*h), "backward hook");
    h->x = x;
    h->ch = ch;
    ch->hook = h;
    bg_stage_set_layer_done(ch->st, on_layer_done, h);
    BG__EACH_STRATEGY(x, s)
    if (s->ops->layer_begin) { /* the callback only where a strategy needs it */
        bg_stage_set_layer_begin(ch->st, on_layer_begin, h);
        break;
    }
    return BG_OK;
}

/* Once per step, before the first optimizer step on this rank, when every
 * backward on the rank is done: when any active strategy has a
 * before_optimizer hook (DualPipe's copies, ties), every chunk's reduction
 * is finished, then the hooks run in registry order. */
bg_status_t bg__exec_before_optimizer(exec_t *x)
{
    int any = 0;
    BG__EACH_STRATEGY(x, s) any |= s->ops->before_optimizer != NULL;
    if (!any || x->shared_step == x->step)
        return BG_OK;
    x->shared_step = x->step;
    for (int v = 0; v < x->V; v++)
        BG_CHECK(bg__exec_start_buckets(x, &x->chunks[v], x->chunks[v].first));
    for (int v = 0; v < x->V; v++)
        BG_CHECK(bg__exec_wait_buckets(x, &x->chunks[v]));
    BG__EACH_STRATEGY(x, s) if (s->ops->before_optimizer) BG_CHECK(s->ops->before_optimizer(x, s->self));
    return BG_OK;
}

/* Does tensor i count in the model's gradient norm? Not when a strategy
 * says so (the second tensor of a tie: both hold a + b, and the model's
 * norm counts a tied tensor once), and a tensor replicated over the tensor
 * group counts once (member 0), an expert shard (split over the expert group,
 * whole on every tensor member) too. */
int bg__exec_in_norm(exec_t *x, chunk_t *ch, int i)
{
    bg_param_t *p = bg_model_tensor(ch->model, i);
    BG__EACH_STRATEGY(x, s) if (s->ops->in_norm && !s->ops->in_norm(x, s->self, p)) return 0;
    return p->numel && (x->lay.me.tp == 0 || (bg_param_is_shard(p) && !p->split_ep));
}

/* Sum of squares of a chunk's reduced gradients from the per-tensor sums
 * (ch->tsq, in double, filled bucket by bucket by the optimizer step), added
 * tensor by tensor in the chunk's fixed order whatever order the buckets
 * finished in. Summed over the pipeline (one replica) it is the square of
 * the model's gradient norm. */
double bg__exec_grad_sumsq(exec_t *x, chunk_t *ch)
{
    double s = 0;
    for (int i = 0; i < bg_model_num_tensors(ch->model); i++)
        if (bg__exec_in_norm(x, ch, i))
            s += ch->tsq[i];
    return s;
}

/* Does this replica count p in the norm? Every replica (and every context member) holds the same reduced
 * gradients, so replica 0's member 0 counts a replicated tensor; an expert shard (split_ep) is held by the
 * first P replicas, one slice each. */
static int replica_counts(const exec_t *x, const bg_param_t *p)
{
    if (x->lay.me.cp != 0)
        return 0;
    return p->split_ep ? x->lay.me.dp < p->split_parts : x->lay.me.dp == 0;
}

/* The chunk's optimizer step, bucket by bucket in the order their reductions
 * started (the last layers first): each bucket is waited for, its squares
 * summed (the gradient norm) and its parameters updated, so the reductions
 * still in flight, the last bucket's above all, overlap the updates of the
 * buckets before them. The update is elementwise: the same bits as one step
 * over the chunk after every reduction. Replica 0 alone counts the norm
 * (every replica holds the same reduced gradients; replica_counts); emulated stages update
 * nothing (the simulator's optimizer costs nothing). */
bg_status_t bg__exec_optimizer_step(exec_t *x, chunk_t *ch)
{
    int norm = ch->copy == 0; /* the model's norm counts one copy */
    int nt = bg_model_num_tensors(ch->model), t = (int)x->step + 1;
    const float *base = bg_model_params(ch->model);
    for (int i = 0; i < nt; i++)
        ch->tsq[i] = 0;
    for (int b = 0; b < ch->nbuckets; b++) {
        bg__bucket_t *bk = &ch->buckets[b];
        BG_CHECK(bg__exec_wait_bucket(x, ch, b));
        for (int i = 0; norm && i < nt; i++) {
            bg_param_t *p = bg_model_tensor(ch->model, i);
            size_t o = (size_t)(p->data - base);
            if (o >= bk->off && o - bk->off < bk->count && bg__exec_in_norm(x, ch, i) && replica_counts(x, p))
                ch->tsq[i] = x->be->ops->sumsq(x->be, p->grad, p->numel);
        }
        if (!x->em && !(x->p.clip_grad > 0)) /* clipping: after every stage's norm (bg__exec_clip) */
            BG_CHECK(bg_model_optim_step_range(ch->model, &x->p.optim, t, bk->off, bk->count));
    }
    ch->norm_counted = norm; /* tsq holds only what this replica counts */
    ch->gsq = ch->norm_counted ? bg__exec_grad_sumsq(x, ch) : 0;
    return BG_OK;
}
