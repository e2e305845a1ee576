/* runtime/strat_zero.c: the ZeRO strategy (--zero 1|2|3 over dp > 1;
 * docs/data_parallel.md): each chunk's optimizer state (level 2: and its
 * gradients) sharded over the data-parallel group, bucket by bucket. The
 * sharding is runtime/zero.c's; this file calls it at the executor's hooks
 * (a chunk's state, the step's start, before the compute, after each layer,
 * a bucket's reduction, the optimizer, checkpoints; level 3: before each
 * layer's compute) and must not touch the interpreter's slots. A call that
 * blocked on a collective shows in the trace for its duration: ag_wait (the
 * parameters' all-gathers of the last step, before a forward; level 3: a
 * layer's gather, before its compute) or rs_wait (levels 2 and 3: the
 * backward waiting for a bucket's reduce-scatter). Under expert parallelism
 * (level 1) each bucket is cut into runs of tensors (bg__exec_bucket_run):
 * the replicated ones sharded over the data-parallel group, the experts' over
 * the replicas that hold the same experts (x->ep_coll), each run a bucket of
 * runtime/zero.c's; the executor's bucket waits for its first run's
 * reduction, this file for the others'. */
#include <stdlib.h>

#include "core/check.h"
#include "models/model_impl.h"
#include "runtime/exec_impl.h"
#include "runtime/zero.h"
#include "schedule/memory.h"

typedef struct zero_state {
    bg__zero_t **z;     /* per chunk */
    int **first;        /* per chunk: executor bucket b is runtime/zero.c's buckets [first[b], first[b + 1]) */
    bg__xfer_t ***more; /* per chunk, per zero bucket: its reduction when not its executor bucket's first */
} zero_state_t;

static int zero_active(const exec_t *x) { return x->p.zero > 0; } /* 0 when dp = 1 (bg_executor_create) */

static bg__zero_t *of(void *self, const exec_t *x, const chunk_t *ch)
{
    return ((zero_state_t *)self)->z[ch - x->chunks];
}

static bg_status_t zero_setup(exec_t *x, void **self_p)
{
    zero_state_t *Z = calloc(1, sizeof(*Z));
    BG_ALLOC_CHECK(Z, sizeof(*Z), "zero state");
    Z->z = calloc((size_t)x->V, sizeof(*Z->z));
    Z->first = calloc((size_t)x->V, sizeof(*Z->first));
    Z->more = calloc((size_t)x->V, sizeof(*Z->more));
    *self_p = Z; /* freed by zero_destroy */
    if (!Z->z || !Z->first || !Z->more)
        return bg_error(BG_ERR_NOMEM, "zero state");
    return BG_OK;
}

/* Levels 2 and 3: the chunk's model made without its whole gradients (each
 * replica keeps their shard and a few bucket buffers: runtime/zero.c), so
 * that making it never holds them beside the parameters; level 1: as the
 * executor makes it. */
static bg_status_t zero_chunk_model(exec_t *x, void *self, chunk_t *ch)
{
    (void)self;
    BG_CHECK(x->p.zero >= 2 ? bg__model_create_gradless(x->desc, x->be, ch->first, ch->last, &ch->model)
                            : bg_model_create(x->desc, x->be, ch->first, ch->last, &ch->model));
    return bg_stage_create(ch->model, x->M, &ch->st);
}

/* Level 2: buckets sized from the shard (schedule/memory.h), so that their
 * buffers cost less than sharding the gradients saves. */
static size_t zero_bucket_floats(exec_t *x, void *self, chunk_t *ch, size_t configured)
{
    (void)self;
    if (x->p.zero < 2) /* level 3: level 2's buckets (its gathers are by bucket too) */
        return configured;
    return bg__zero2_bucket_floats(configured, bg_model_param_count(ch->model), bg_group_size(x->dp_group),
                                   bg__zero_buffers());
}

/* The zero buckets of the chunk's buckets (*n_p of them; first[b]: bucket b's first): one each, or under
 * expert parallelism one per run of tensors, each over its group. */
static bg_status_t zero_buckets(exec_t *x, chunk_t *ch, int *first, bg__zero_bucket_t **zb_p, int *n_p)
{
    int n = 0, cap = ch->nbuckets + 1;
    bg__zero_bucket_t *zb = calloc((size_t)cap, sizeof(*zb));
    BG_ALLOC_CHECK(zb, sizeof(*zb), "zero buckets");
    for (int b = 0; b < ch->nbuckets; b++) {
        const bg__bucket_t *bk = &ch->buckets[b];
        first[b] = n;
        size_t run = bk->off, end = bk->off + bk->count;
        do { /* an empty bucket: one empty zero bucket */
            int expert = 0;
            if (x->p.ep > 1 && bk->count)
                end = bg__exec_bucket_run(ch, b, run, &expert);
            if (n + 1 == cap) {
                bg__zero_bucket_t *g = realloc(zb, 2 * (size_t)cap * sizeof(*zb));
                if (!g) {
                    free(zb);
                    return bg_error(BG_ERR_NOMEM, "zero buckets");
                }
                zb = g, cap *= 2;
            }
            zb[n++] = (bg__zero_bucket_t){bk->lo, bk->hi, run, end - run, expert ? x->ep_coll : x->dp_coll};
            run = end;
        } while (run < bk->off + bk->count);
    }
    first[ch->nbuckets] = n;
    *zb_p = zb;
    *n_p = n;
    return BG_OK;
}

/* The chunk's sharded optimizer state over its buckets. */
static bg_status_t zero_chunk_optim(exec_t *x, void *self, chunk_t *ch)
{
    zero_state_t *Z = self;
    int v = (int)(ch - x->chunks), n = 0;
    bg__zero_bucket_t *zb = NULL;
    Z->first[v] = calloc((size_t)ch->nbuckets + 1, sizeof(int));
    BG_ALLOC_CHECK(Z->first[v], sizeof(int), "zero buckets");
    BG_CHECK(zero_buckets(x, ch, Z->first[v], &zb, &n));
    Z->more[v] = calloc((size_t)n + 1, sizeof(*Z->more[v]));
    bg_status_t st = Z->more[v] ? bg__zero_create(x->p.zero, ch->model, x->dp_coll, zb, n, x->p.optim.kind,
                                                  ch->param_store, &Z->z[v])
                                : bg_error(BG_ERR_NOMEM, "zero buckets");
    free(zb);
    BG_CHECK(st);
    if (x->p.zero == 3 && !bg__zero_params_sharded(Z->z[ch - x->chunks]))
        bg_log(BG_LOG_INFO, "zero", "stage %d (layers %d..%d): its largest bucket's gather buffer would hold what "
               "sharding the parameters saves: they stay whole (as at --zero 2)", ch->stage, ch->first, ch->last);
    return BG_OK;
}

static bg_status_t zero_step_begin(exec_t *x, void *self)
{
    for (int v = 0; v < x->V; v++)
        BG_CHECK(bg__zero_begin_step(of(self, x, &x->chunks[v])));
    return BG_OK;
}

enum { ZERO_SETTLE, ZERO_PREPARE, ZERO_LAYER_DONE, ZERO_GATHER_UP, ZERO_GATHER_DOWN };
static bg_status_t zero_call(exec_t *x, bg__zero_t *z, chunk_t *ch, int mb, int what, int layer)
{
    int64_t w0 = bg__zero_waits(z);
    double t0 = x->trace ? bg_now() : 0;
    BG_CHECK(what == ZERO_SETTLE       ? bg__zero_settle(z)
             : what == ZERO_PREPARE    ? bg__zero_prepare(z, layer)
             : what == ZERO_LAYER_DONE ? bg__zero_layer_done(z, layer)
                                       : bg__zero_gather_layer(z, layer, what == ZERO_GATHER_UP));
    if (x->trace && bg__zero_waits(z) != w0)
        bg__trace_event(x->trace, what == ZERO_PREPARE || what == ZERO_LAYER_DONE ? "rs_wait" : "ag_wait", mb,
                        ch->stage, t0, bg_now(), (int)x->step + 1);
    return BG_OK;
}

/* Level 3: the layer's weights gathered before each of its computes (a zero-bubble W too: gathered again
 * when its bucket was dropped since its B). */
static bg_status_t zero_layer_begin(exec_t *x, void *self, chunk_t *ch, int layer, int mb, bg_stage_pass_t pass)
{
    if (x->p.zero < 3)
        return BG_OK;
    int up = pass == BG_PASS_FORWARD || pass == BG_PASS_RECOMPUTE;
    return zero_call(x, of(self, x, ch), ch, mb, up ? ZERO_GATHER_UP : ZERO_GATHER_DOWN, layer);
}

/* A forward waits for the parameters' all-gathers of the last step; a
 * backward that writes weight gradients (level 2) aims them first. */
static bg_status_t zero_before_compute(exec_t *x, void *self, chunk_t *ch, int mb, bg_sched_op_kind_t kind)
{
    bg__zero_t *z = of(self, x, ch);
    if (kind == BG_OP_FORWARD)
        return zero_call(x, z, ch, mb, ZERO_SETTLE, 0);
    if (kind == BG_OP_BACKWARD || kind == BG_OP_BACKWARD_WEIGHT)
        return zero_call(x, z, ch, mb, ZERO_PREPARE, ch->last);
    return BG_OK;
}

static int zero_per_microbatch(exec_t *x, void *self, chunk_t *ch, int layer)
{
    return bg__zero_per_microbatch(of(self, x, ch), layer);
}

/* Level 2: every microbatch's buckets. */
static bg_status_t zero_layer_done(exec_t *x, void *self, chunk_t *ch, int layer, int mb)
{
    return zero_call(x, of(self, x, ch), ch, mb, ZERO_LAYER_DONE, layer);
}

/* On the backend's buffers through each zero bucket's group's collectives (x->dp_coll; experts: x->ep_coll). */
static bg_status_t zero_reduce(exec_t *x, void *self, chunk_t *ch, int b)
{
    zero_state_t *Z = self;
    int v = (int)(ch - x->chunks), *first = Z->first[v];
    BG_CHECK(bg__zero_reduce(Z->z[v], first[b], &ch->buckets[b].req));
    for (int r = first[b] + 1; r < first[b + 1]; r++)
        BG_CHECK(bg__zero_reduce(Z->z[v], r, &Z->more[v][r]));
    bg__exec_trace_bucket(x, ch, b);
    return BG_OK;
}

/* Wait for executor bucket b's reductions: the executor's (its first run's), then the other runs'. */
static bg_status_t wait_bucket(exec_t *x, zero_state_t *Z, chunk_t *ch, int b)
{
    int v = (int)(ch - x->chunks);
    bg_status_t st = bg__exec_wait_bucket(x, ch, b);
    for (int r = Z->first[v][b] + 1; r < Z->first[v][b + 1]; r++) {
        bg_status_t s2 = bg__exec_wait_free(&Z->more[v][r]);
        st = st == BG_OK ? s2 : st;
    }
    return st;
}

/* The default optimizer step's order (bg__exec_optimizer_step), on the
 * owned elements: each bucket waited for, its owned squares summed, its
 * owned elements updated, then its parameters' all-gather starts. The norm
 * is each replica's shard (summed over the replicas at the step's end). */
static bg_status_t zero_optimizer(exec_t *x, void *self, chunk_t *ch)
{
    bg__zero_t *z = of(self, x, ch);
    int norm = ch->copy == 0; /* the model's norm counts one copy */
    int nt = bg_model_num_tensors(ch->model), t = (int)x->step + 1;
    for (int i = 0; i < nt; i++)
        ch->tsq[i] = 0;
    const int *first = ((zero_state_t *)self)->first[ch - x->chunks];
    for (int b = 0; b < ch->nbuckets; b++) {
        BG_CHECK(wait_bucket(x, self, ch, b));
        for (int r = first[b]; r < first[b + 1]; r++) {
            BG_CHECK(bg__zero_bucket_done(z, r, norm ? ch->tsq : NULL));
            if (!x->em && !(x->p.clip_grad > 0)) /* clipping: after every stage's norm (zero_update) */
                BG_CHECK(bg__zero_bucket_step(z, r, &x->p.optim, t));
        }
    }
    ch->norm_counted = norm;
    ch->gsq = norm ? bg__exec_grad_sumsq(x, ch) : 0;
    return BG_OK;
}

/* With clipping, after the norm: the owned elements scaled and updated, bucket by bucket. */
static bg_status_t zero_update(exec_t *x, void *self, chunk_t *ch, float k)
{
    bg__zero_t *z = of(self, x, ch);
    int nz = ((zero_state_t *)self)->first[ch - x->chunks][ch->nbuckets];
    for (int r = 0; r < nz && !x->em; r++) {
        if (k < 1)
            bg__zero_bucket_scale(z, r, k);
        BG_CHECK(bg__zero_bucket_step(z, r, &x->p.optim, (int)x->step + 1));
    }
    return BG_OK;
}

/* Level 3: the whole parameters held until the next step. */
static bg_status_t zero_settle(exec_t *x, void *self)
{
    for (int v = 0; v < x->V; v++)
        BG_CHECK(bg__zero_whole(of(self, x, &x->chunks[v])));
    return BG_OK;
}

/* Checkpoints hold the full state: gathered to save, loaded whole then the shard kept. */
static bg_status_t zero_state_begin(exec_t *x, void *self, int loading)
{
    for (int v = 0; v < x->V; v++)
        BG_CHECK(loading ? bg__zero_expand_state(of(self, x, &x->chunks[v]))
                         : bg__zero_gather_state(of(self, x, &x->chunks[v])));
    return BG_OK;
}

static void zero_state_end(exec_t *x, void *self, int loading, bg_status_t st)
{
    (void)st;
    for (int v = 0; v < x->V; v++)
        if (loading)
            bg__zero_take_state(of(self, x, &x->chunks[v]));
        else
            bg_model_optim_free(x->chunks[v].model);
}

static void zero_memory(exec_t *x, void *self, size_t *param_bytes, size_t *optim_elems, size_t *grad_bytes)
{
    *param_bytes = *optim_elems = *grad_bytes = 0;
    for (int v = 0; v < x->V; v++) {
        *param_bytes += bg__zero_param_bytes(of(self, x, &x->chunks[v]));
        *optim_elems += bg__zero_owned(of(self, x, &x->chunks[v]));
        *grad_bytes += bg__zero_grad_bytes(of(self, x, &x->chunks[v]));
    }
}

static void zero_cancel(exec_t *x, void *self)
{
    zero_state_t *Z = self;
    for (int v = 0; v < x->V; v++) {
        for (int r = 0; Z->more[v] && r < Z->first[v][x->chunks[v].nbuckets]; r++) {
            bg__xfree(Z->more[v][r]);
            Z->more[v][r] = NULL;
        }
        bg__zero_cancel(of(self, x, &x->chunks[v]));
    }
}

/* Level 3: the gathers' overlap with compute over the run, logged per rank (BRIGADE_LOG=info; bench/zero.sh
 * reads it): the share of their time in flight that no compute waited for. */
static void zero_finish(exec_t *x, void *self, int broken)
{
    double g = 0, e = 0;
    int any = 0;
    for (int v = 0; v < x->V && !broken; v++) {
        double gv, ev;
        any |= bg__zero_gather_seconds(of(self, x, &x->chunks[v]), &gv, &ev);
        g += gv;
        e += ev;
    }
    if (any && g > 0)
        bg_log(BG_LOG_INFO, "zero", "gather overlap %.3f (parameter gathers %.1f ms in flight, %.1f ms of it waited "
               "for)", 1 - e / g, 1e3 * g, 1e3 * e);
}

/* Before the stages and models: it aims the models' gradient pointers. */
static void zero_destroy(exec_t *x, void *self)
{
    zero_state_t *Z = self;
    if (!Z)
        return;
    for (int v = 0; v < x->V && Z->z; v++) {
        bg__zero_destroy(Z->z[v]);
        for (int r = 0; Z->more && Z->more[v] && r < Z->first[v][x->chunks[v].nbuckets]; r++)
            bg__xfree(Z->more[v][r]);
        free(Z->more ? Z->more[v] : NULL);
        free(Z->first ? Z->first[v] : NULL);
    }
    free(Z->z);
    free(Z->first);
    free(Z->more);
    free(Z);
}

const bg__strategy_ops_t bg__strategy_zero = {
    .name = "zero",
    .chunk_model = zero_chunk_model,
    .active = zero_active,
    .setup = zero_setup,
    .bucket_floats = zero_bucket_floats,
    .chunk_optim = zero_chunk_optim,
    .step_begin = zero_step_begin,
    .before_compute = zero_before_compute,
    .layer_begin = zero_layer_begin,
    .per_microbatch = zero_per_microbatch,
    .layer_done = zero_layer_done,
    .reduce = zero_reduce,
    .optimizer = zero_optimizer,
    .update = zero_update,
    .settle = zero_settle,
    .state_begin = zero_state_begin,
    .state_end = zero_state_end,
    .memory = zero_memory,
    .cancel = zero_cancel,
    .finish = zero_finish,
    .destroy = zero_destroy,
};
