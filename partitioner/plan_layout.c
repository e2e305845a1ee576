/* partitioner/plan_layout.c: one layout of the search (pipeline depth, data
 * parallelism, microbatches, schedule, sharding stage) evaluated: its
 * schedule generated, the devices of its pipeline ranks, the layers' bytes
 * and times, the exact partition (bg_partition), the simulated step
 * (bg_schedule_simulate), each rank's peak memory, and the plan record kept
 * among the best. It must not enumerate layouts (plan_search.c) nor read or
 * write JSON (plan_json.c); no printing.
 *
 * Devices: device i is world rank i of the executor's rank layout
 * (schedule/layout.h), so pipeline rank r is served by its replicas' tensor
 * groups (bg__layout_rank); with heterogeneous devices a
 * pipeline rank gets the smallest budget and the lowest speed of its replicas
 * (every replica must fit, the slowest sets the pace). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/util.h"
#include "schedule/generate.h"
#include "schedule/layout.h"
#include "schedule/memory.h"
#include "schedule/offact.h"
#include "schedule/simulate.h"
#include "plan_impl.h"

/* One layout under evaluation: its schedule, the devices of its pipeline
 * ranks, the partition problem and its solution. Phases of evaluate() fill
 * it in order; candidate_free() undoes them all. */
typedef struct candidate {
    int pp, dp, m, n;             /* pipeline depth, replicas, microbatches, microbatch size */
    int zero;                     /* sharding stage (0 when dp = 1) */
    int offload;                  /* 1: the optimizer state is not on the device (--offload optimizer) */
    int offact;                   /* 1: stashed activations in host memory between their points (--offload activations) */
    int paired;                   /* BRIGADE_TP_OVERLAP=microbatch pairs its instructions (bg_plan_paired_for) */
    size_t guard;                 /* the stages' guard bytes after each buffer (bg_layer_profile_t.guard_bytes) */
    bg_schedule_kind_t kind;
    bg_schedule_t *sched;
    int V, S;                     /* chunks per rank, virtual stages */
    int copies, Lm;               /* model copies (dualpipe 2) and model stages S / copies: the partition's */
    bg_part_stage_spec_t *mspecs; /* [Lm] copies > 1: a model stage's spec, every copy's constraints */
    bg_part_counts_t **mcounts;   /* [Lm] their rows */
    double *rspeed;               /* [pp] the slowest replica's speed */
    uint64_t *rbudget;            /* [pp] the smallest replica's budget */
    bg_part_counts_t **rows;      /* [pp] each rank's slot counts, nrows[r] rows of V entries */
    int *nrows;                   /* [pp] */
    bg_part_counts_t **proj;      /* [S] a stage's own rows, dominated ones dropped */
    bg_part_layer_t *layers;      /* [L] */
    double *coll;                 /* [L] seconds of each layer's tensor-group collectives within its times */
    double *opt;                  /* [L] seconds of the optimizer step over each layer's parameters */
    int opt_measured;             /* opt was measured (else 10 FLOP per parameter at flops) */
    bg_part_stage_spec_t *specs;  /* [S] */
    bg_part_problem_t prob;
    bg_part_stage_t *out;         /* [S] the partition */
    int *moved;                   /* [S] activation offload: the microbatches whose stash a stage moves */
} candidate_t;

static void candidate_free(candidate_t *c)
{
    for (int r = 0; c->rows && r < c->pp; r++)
        free(c->rows[r]);
    for (int v = 0; c->proj && v < c->S; v++)
        free(c->proj[v]);
    free(c->rows);
    free(c->nrows);
    free(c->proj);
    free(c->rspeed);
    free(c->rbudget);
    free(c->layers);
    free(c->coll);
    free(c->opt);
    free(c->specs);
    free(c->moved);
    for (int k = 0; c->mcounts && k < c->Lm; k++)
        free(c->mcounts[k]);
    free(c->mcounts);
    free(c->mspecs);
    free(c->out);
    bg_schedule_free(c->sched);
}


static int cmp_plan(const void *x, const void *y)
{
    const bg_plan_t *a = *(bg_plan_t *const *)x, *b = *(bg_plan_t *const *)y;
    if (a->step_ms != b->step_ms)
        return a->step_ms < b->step_ms ? -1 : 1;
    if (a->pp != b->pp)
        return a->pp - b->pp;
    return a->microbatches - b->microbatches;
}

/* p joins the list of the best (sorted by cmp_plan, a later plan after an
 * equal one) when it is among the top. Its program is validated then: the
 * search simulates generated programs without validating them (trusted:
 * every order comes from an execution that respects every dependency), and
 * checks those of the plans it keeps. Takes p. */
static bg_status_t keep_plan(search_t *s, bg_plan_t *p, const bg_schedule_t *sched)
{
    int top = s->pp->top > 0 ? s->pp->top : 5;
    int at = s->nplans;
    while (at > 0 && cmp_plan(&s->plans[at - 1], &p) > 0)
        at--;
    if (at >= top) {
        bg_plan_free(p);
        return BG_OK;
    }
    bg_status_t st = bg_schedule_validate(sched);
    if (st != BG_OK) {
        bg_plan_free(p);
        return st;
    }
    if (s->nplans == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        bg_plan_t **n = realloc(s->plans, (size_t)cap * sizeof(*n));
        if (!n) {
            bg_plan_free(p);
            return bg_error(BG_ERR_NOMEM, "plan list");
        }
        s->plans = n;
        s->cap = cap;
    }
    memmove(&s->plans[at + 1], &s->plans[at], (size_t)(s->nplans - at) * sizeof(*s->plans));
    s->plans[at] = p;
    s->nplans++;
    while (s->nplans > top)
        bg_plan_free(s->plans[--s->nplans]);
    return BG_OK;
}

static int has_split_backward(const bg_schedule_t *sched, int rank)
{
    size_t n;
    const bg_sched_op_t *ops = bg_schedule_rank_ops(sched, rank, &n);
    for (size_t i = 0; i < n; i++)
        if (ops[i].kind == BG_OP_BACKWARD_INPUT)
            return 1;
    return 0;
}

/* Phase 1: every pipeline rank's device (the weakest of its replicas); made
 * before the schedule (the bound before generating reads the speeds). */
static bg_status_t candidate_devices(const search_t *s, candidate_t *c)
{
    int pp = c->pp, dp = c->dp;
    c->rspeed = malloc((size_t)pp * sizeof(double));
    c->rbudget = malloc((size_t)pp * sizeof(uint64_t));
    c->rows = calloc((size_t)pp, sizeof(*c->rows));
    c->nrows = calloc((size_t)pp, sizeof(int));
    if (!c->rspeed || !c->rbudget || !c->rows || !c->nrows)
        return bg_error(BG_ERR_NOMEM, "plan candidate");
    bg_layout_t lay; /* the executor's rank layout: device = world rank */
    bg__layout_init(&lay, pp, dp, s->cp, s->tp, 0);
    for (int r = 0; r < pp; r++) {
        c->rspeed[r] = INFINITY;
        c->rbudget[r] = UINT64_MAX;
        for (int d = 0; d < dp; d++)
            for (int k = 0; k < s->cp * s->tp; k++) { /* every replica's context x tensor group */
                int dev = bg__layout_rank(&lay, r, d, k / s->tp, k % s->tp);
                if (s->speed[dev] < c->rspeed[r])
                    c->rspeed[r] = s->speed[dev];
                if (s->mem[dev] < c->rbudget[r])
                    c->rbudget[r] = s->mem[dev];
            }
    }
    return BG_OK;
}

/* Phase 1b: the slot counts each rank's program keeps (bg_part_schedule_counts). With activation offload,
 * every rank's points from one walk (at the executor's BRIGADE_OFFLOAD_ACT_AHEAD): the stashes off the
 * device in the counts, and how many microbatches each stage moves (its transfers). */
static bg_status_t candidate_counts(candidate_t *c)
{
    if (!c->offact) {
        for (int r = 0; r < c->pp; r++)
            BG_CHECK(bg_part_schedule_counts(c->sched, r, c->paired, &c->rows[r], &c->nrows[r]));
        return BG_OK;
    }
    int ahead;
    bg__offact_slot_t *pts = NULL;
    BG_CHECK(bg__offact_ahead(&ahead));
    BG_CHECK(bg__offact_points_all(c->sched, ahead, &pts));
    size_t VM = (size_t)c->V * (size_t)c->m;
    bg_status_t st = BG_OK;
    c->moved = calloc((size_t)c->S, sizeof(int));
    if (!c->moved)
        st = bg_error(BG_ERR_NOMEM, "plan candidate");
    for (int r = 0; r < c->pp && st == BG_OK; r++)
        st = bg__part_schedule_counts_at(c->sched, r, pts + (size_t)r * VM, &c->rows[r], &c->nrows[r]);
    for (int v = 0; v < c->S && st == BG_OK; v++) {
        const bg__offact_slot_t *p = pts + (size_t)bg_schedule_stage_rank(c->sched, v) * VM +
                                     (size_t)bg_schedule_stage_chunk(c->sched, v) * (size_t)c->m;
        for (int mb = 0; mb < c->m; mb++)
            c->moved[v] += p[mb].out_at >= 0;
    }
    free(pts);
    return st;
}

/* Seconds of `calls` collectives over a tensor group of tp members putting
 * in `bytes` in all, each costed as a ring all-reduce: 2 (tp - 1) messages
 * of latency and 2 (tp - 1) / tp of the bytes through each link (a gather
 * moves less: an upper bound there). */
static double tp_time(const bg_plan_params_t *pa, int tp, double calls, double bytes)
{
    if (tp < 2 || calls <= 0)
        return 0;
    return calls * 2.0 * (tp - 1) * pa->link_latency +
           (pa->link_bandwidth > 0 ? 2.0 * (tp - 1) / tp * bytes / pa->link_bandwidth : 0.0);
}

/* The measured optimizer times per layer of pa (a field added later: NULL for older callers). */
static const double *layer_opt_s(const bg_plan_params_t *pa)
{
    return pa->size >= offsetof(bg_plan_params_t, layer_opt_s) + sizeof(double *) ? pa->layer_opt_s : NULL;
}

/* Phase 2: the layers as the partitioner sees them: the profile's bytes
 * (per device: a tensor-parallel build reports its shards), and times: as
 * measured on a tensor group of this degree (collectives included), else
 * from the FLOPs (or the times measured in one process, divided by tp) plus
 * the tensor group's collectives and the MoE layers' all-to-alls (built for
 * ep > 1) at the link's cost. */
static bg_status_t candidate_layers(const search_t *s, const bg_layer_profile_t *prof, candidate_t *c)
{
    const bg_plan_params_t *pa = s->pp;
    c->layers = calloc((size_t)s->L, sizeof(*c->layers));
    c->coll = calloc((size_t)s->L, sizeof(double));
    c->opt = calloc((size_t)s->L, sizeof(double));
    if (!c->layers || !c->coll || !c->opt)
        return bg_error(BG_ERR_NOMEM, "plan candidate");
    /* the optimizer step: measured (on the group, or in one process: / tp, the parameters being mostly
     * shards), else 10 FLOP per parameter */
    const double *mo = s->times ? s->times->opt_s : pa->layer_fwd_s ? layer_opt_s(pa) : NULL;
    c->opt_measured = mo != NULL;
    for (int i = 0; i < s->L; i++) {
        bg_part_layer_t *l = &c->layers[i];
        c->guard = prof[i].guard_bytes;
        l->params = prof[i].params;
        l->stash_bytes = prof[i].stash_bytes;
        l->wstash_bytes = prof[i].wstash_bytes;
        l->scratch_bytes = prof[i].scratch_bytes;
        l->output_bytes = prof[i].output_bytes;
        l->grad_bytes = prof[i].grad_bytes;
        c->opt[i] = mo ? mo[i] / (s->times ? 1 : s->tp) : 10.0 * (double)prof[i].params / pa->flops;
        if (s->times) { /* measured as the plan runs them: the split layers and their collectives */
            l->fwd_time = s->times->fwd_s[i];
            l->bwd_time = s->times->bwd_s[i];
            c->coll[i] = s->times->tp_s ? s->times->tp_s[i] : 0.0;
            continue;
        }
        if (pa->layer_fwd_s) { /* measured whole: a tensor group divides them (replicated parts do not) */
            l->fwd_time = pa->layer_fwd_s[i] / s->tp;
            l->bwd_time = pa->layer_bwd_s[i] / s->tp;
        } else {
            l->fwd_time = prof[i].fwd_flops / pa->flops;
            l->bwd_time = prof[i].bwd_flops / pa->flops;
        }
        /* the tensor group's collectives are blocking: on the layer's path */
        double cf = tp_time(pa, s->tp, prof[i].tp.fwd_calls, prof[i].tp.fwd_bytes);
        double cb = tp_time(pa, s->tp, prof[i].tp.bwd_calls, prof[i].tp.bwd_bytes);
        /* an MoE layer's expert-parallel all-to-alls: blocking too, point to point over the link */
        double ef = prof[i].tp.ep_fwd_msgs * pa->link_latency +
                    (pa->link_bandwidth > 0 ? prof[i].tp.ep_fwd_bytes / pa->link_bandwidth : 0.0);
        double eb = prof[i].tp.ep_bwd_msgs * pa->link_latency +
                    (pa->link_bandwidth > 0 ? prof[i].tp.ep_bwd_bytes / pa->link_bandwidth : 0.0);
        /* a bound attention layer's context ring (cp > 1): its steps point to point over the link, its
         * block transfers beside the block kernel, but costed blocking, as the all-to-alls */
        double rf = prof[i].tp.cp_fwd_msgs * pa->link_latency +
                    (pa->link_bandwidth > 0 ? prof[i].tp.cp_fwd_bytes / pa->link_bandwidth : 0.0);
        double rb = prof[i].tp.cp_bwd_msgs * pa->link_latency +
                    (pa->link_bandwidth > 0 ? prof[i].tp.cp_bwd_bytes / pa->link_bandwidth : 0.0);
        l->fwd_time += cf + ef + rf;
        l->bwd_time += cb + eb + rb;
        c->coll[i] = cf + cb + ef + eb + rf + rb;
    }
    return BG_OK;
}

/* Phase 3: each virtual stage's spec: its rank's device, 1/V of its budget,
 * and its chunk's rows of the rank's slot counts, dominated rows dropped. */
static bg_status_t candidate_stages(candidate_t *c)
{
    c->specs = calloc((size_t)c->S, sizeof(*c->specs));
    c->proj = calloc((size_t)c->S, sizeof(*c->proj));
    if (!c->specs || !c->proj)
        return bg_error(BG_ERR_NOMEM, "plan candidate");
    for (int v = 0; v < c->S; v++) {
        int r = bg_schedule_stage_rank(c->sched, v), ch = bg_schedule_stage_chunk(c->sched, v);
        bg_part_counts_t *proj = c->proj[v] = malloc((size_t)c->nrows[r] * sizeof(bg_part_counts_t));
        if (!proj)
            return bg_error(BG_ERR_NOMEM, "plan counts");
        int np = 0;
        for (int k = 0; k < c->nrows[r]; k++) {
            bg_part_counts_t x = c->rows[r][(size_t)k * c->V + ch];
            int dominated = 0;
            for (int q = 0; q < np && !dominated; q++)
                dominated = bg__counts_dominate(&proj[q], &x);
            if (dominated)
                continue;
            int w = 0;
            for (int q = 0; q < np; q++)
                if (!bg__counts_dominate(&x, &proj[q]))
                    proj[w++] = proj[q];
            np = w;
            proj[np++] = x;
        }
        c->specs[v].speed = c->rspeed[r];
        c->specs[v].budget_bytes = (size_t)(c->rbudget[r] / (uint64_t)c->V);
        c->specs[v].split_backward = has_split_backward(c->sched, r);
        c->specs[v].ncounts = np;
        c->specs[v].counts = proj;
    }
    return BG_OK;
}

/* Copies > 1 (dualpipe): the partition is of the Lm model stages, each held
 * by `copies` virtual stages on different ranks (model stage k: virtual
 * stages k, k + Lm, ..). A model stage's spec must satisfy every copy: the
 * slowest of their devices, the smallest of their budgets (1/V of the rank's,
 * as for every chunk), and all their rows of slot counts. */
static bg_status_t candidate_copies(candidate_t *c)
{
    c->mspecs = calloc((size_t)c->Lm, sizeof(*c->mspecs));
    c->mcounts = calloc((size_t)c->Lm, sizeof(*c->mcounts));
    if (!c->mspecs || !c->mcounts)
        return bg_error(BG_ERR_NOMEM, "plan candidate");
    for (int k = 0; k < c->Lm; k++) {
        int n = 0;
        for (int v = k; v < c->S; v += c->Lm)
            n += c->specs[v].ncounts;
        bg_part_counts_t *rows = c->mcounts[k] = malloc((size_t)n * sizeof(*rows));
        if (!rows)
            return bg_error(BG_ERR_NOMEM, "plan counts");
        bg_part_stage_spec_t *m = &c->mspecs[k];
        *m = c->specs[k];
        m->ncounts = 0;
        for (int v = k; v < c->S; v += c->Lm) {
            const bg_part_stage_spec_t *e = &c->specs[v];
            if (e->speed < m->speed)
                m->speed = e->speed;
            if (e->budget_bytes < m->budget_bytes)
                m->budget_bytes = e->budget_bytes;
            m->split_backward |= e->split_backward;
            memcpy(rows + m->ncounts, e->counts, (size_t)e->ncounts * sizeof(*rows));
            m->ncounts += e->ncounts;
        }
        m->counts = rows;
    }
    return BG_OK;
}

/* Parameters of layers [first, last] of a candidate. */
static size_t range_params(const candidate_t *c, int first, int last)
{
    size_t n = 0;
    for (int i = first; i <= last; i++)
        n += c->layers[i].params;
    return n;
}

/* Bytes per parameter held by a replica: parameters, gradients and optimizer
 * state, the sharded ones 1/dp each (--zero 1: the state; 2: also the
 * gradients), rounded up to whole bytes (the partitioner counts integers).
 * Stage 2 also holds its bucket buffers (bg_part_problem_t.bucket_buffers),
 * stage 3 those and its parameter gather buffers (param_buffers).
 * Offloaded (--offload optimizer), the state, sharded or not, is not on the
 * device; offload 2 at stage 3 (--offload optimizer,params): nor is the parameter shard. */
static size_t zero_bytes_per_param(bg_optim_kind_t optim, int dp, int zero, int offload)
{
    size_t st = offload ? 0 : bg_optim_state_bytes(optim), d = (size_t)(dp > 1 ? dp : 1);
    if (zero == 1 && d > 1)
        return 8 + (st + d - 1) / d;
    if (zero == 2 && d > 1)
        return 4 + (4 + st + d - 1) / d;
    if (zero == 3 && d > 1)
        return ((offload >= 2 ? 4 : 8) + st + d - 1) / d;
    return 8 + st;
}

/* Phases 1b-4: the partition problem of a candidate whose schedule is made
 * (its devices and layers are made before: candidate_devices, candidate_layers).
 * The input and target bytes come from the model's input: n sequences of
 * seq positions, token ids or `features` floats each. */
static bg_status_t build_problem(const search_t *s, candidate_t *c)
{
    const bg_plan_params_t *pa = s->pp;
    BG_CHECK(candidate_counts(c));
    BG_CHECK(candidate_stages(c));
    if (c->copies > 1)
        BG_CHECK(candidate_copies(c));
    c->out = calloc((size_t)c->S, sizeof(*c->out));
    if (!c->out)
        return bg_error(BG_ERR_NOMEM, "plan candidate");
    size_t positions = (size_t)c->n * (size_t)s->seq;
    bg_part_problem_t prob = BG_PART_PROBLEM_INIT;
    prob.nlayers = s->L;
    prob.layers = c->layers;
    prob.nstages = c->copies > 1 ? c->Lm : c->S; /* copies: the model stages */
    prob.stages = c->copies > 1 ? c->mspecs : c->specs;
    int group = c->dp * s->cp; /* the group that sums the gradients and shards them: dp x cp */
    prob.bytes_per_param = zero_bytes_per_param(pa->optim, group, c->zero, c->offload);
    prob.guard_bytes = c->guard;
    if (c->copies > 1) /* the executor's buffer for the other copy's gradient, summed before the step */
        prob.bytes_per_param += sizeof(float);
    if (c->zero >= 2 && group > 1) { /* the executor's buckets and its buffers for them (runtime/zero.c) */
        long long mb = 4, nbuf = 3, pre = 1;
        if (bg_config_int("BRIGADE_BUCKET_MB", &mb) != BG_OK || mb < 0)
            mb = 4;
        if (bg_config_int("BRIGADE_ZERO_BUFFERS", &nbuf) != BG_OK)
            nbuf = 3;
        prob.bucket_bytes = (size_t)mb * 1048576;
        prob.bucket_buffers = nbuf < 2 ? 2 : nbuf > 16 ? 16 : (int)nbuf;
        prob.bucket_dp = group;
        if (c->zero == 3 && bg_config_int("BRIGADE_ZERO_PREFETCH", &pre) != BG_OK)
            pre = 1;
        prob.param_buffers = c->zero == 3 ? (pre < 0 ? 0 : pre > 15 ? 15 : (int)pre) + 1 : 0;
    }
    prob.input_bytes =
        s->tokens ? 0 : positions * (size_t)bg_model_desc_params(s->desc)->features * sizeof(float);
    prob.token_bytes = s->tokens ? positions * sizeof(int32_t) : 0;
    prob.target_bytes = positions * sizeof(int32_t);
    prob.link_latency = pa->link_latency;
    prob.link_bandwidth = pa->link_bandwidth;
    prob.linger_bytes = bg_plan_linger_bytes();
    prob.paired = c->paired;
    prob.allow_recompute = pa->allow_recompute;
    prob.quick_no_fit = 1; /* the shortfall is measured apart, only when it is wanted */
    c->prob = prob;
    return BG_OK;
}

/* A candidate that does not fit: keep its message if it is the closest yet
 * (the one needing the smallest budget per device) and the smallest uniform
 * budget any candidate needs. */
static void record_shortfall(search_t *s, const bg_layer_profile_t *prof, const candidate_t *c,
                             const bg_part_shortfall_t *sf)
{
    uint64_t V = (uint64_t)c->V, need = V * ((uint64_t)c->specs[0].budget_bytes + sf->extra_bytes);
    uint64_t need_uniform = s->homogeneous_mem ? need : 0;
    uint64_t key = s->homogeneous_mem ? need : V * sf->extra_bytes;
    if (!s->have_short || key < s->short_key) {
        char a[32], b[32], cc[32], d[32], e[32];
        const bg_part_stage_t *ws = NULL;
        bg_part_stage_t ev;
        /* the variant the shortfall counted: without recomputation unless that is not what it needs */
        if (bg_part_stage_eval(&c->prob, sf->stage, sf->first, sf->last, 0, &ev) == BG_OK)
            ws = &ev;
        if (ws && ev.mem_bytes != sf->need_bytes && s->pp->allow_recompute &&
            bg_part_stage_eval(&c->prob, sf->stage, sf->first, sf->last, 1, &ev) != BG_OK)
            ws = NULL;
        int r = bg_schedule_stage_rank(c->sched, sf->stage);
        char tpb[64] = "";
        if (s->tp > 1 || s->cp > 1)
            snprintf(tpb, sizeof tpb, "%s%.0d tp=%d%s", s->cp > 1 ? " cp=" : "", s->cp > 1 ? s->cp : 0, s->tp,
                     bg_model_desc_sequence_parallel(s->desc) ? " (sequence-parallel)" : "");
        snprintf(s->short_msg, sizeof(s->short_msg),
                 "closest layout pp=%d dp=%d%s %s m=%d (microbatch %d): stage %d on pipeline rank %d "
                 "(layers %d..%d, %s..%s) needs %s (parameters+gradients%s %s, activations %s%s) but "
                 "its budget is %s: short by %s; its biggest layer is %s",
                 c->pp, c->dp, tpb, bg_schedule_kind_name(c->kind), c->m, c->n, sf->stage, r,
                 sf->first, sf->last,
                 prof[sf->first].name, prof[sf->last].name, bg__plan_sizestr(a, sizeof(a), (double)sf->need_bytes),
                 c->offload >= 2 ? " (optimizer and parameter shard offloaded)" : c->offload ? " (optimizer offloaded)" : "+optimizer",
                 bg__plan_sizestr(b, sizeof(b), ws ? (double)ws->static_bytes : 0),
                 bg__plan_sizestr(cc, sizeof(cc), ws ? (double)(ws->act_bytes + ws->scratch_bytes) : 0),
                 ws && ws->recompute ? ", with recomputation" : "", bg__plan_sizestr(d, sizeof(d), (double)sf->budget_bytes),
                 bg__plan_sizestr(e, sizeof(e), (double)(sf->need_bytes - sf->budget_bytes)), prof[sf->biggest_layer].name);
        s->short_extra = V * sf->extra_bytes;
        s->short_key = key;
        s->have_short = 1;
    }
    if (need_uniform && (s->min_uniform_budget == 0 || need_uniform < s->min_uniform_budget))
        s->min_uniform_budget = need_uniform;
}

/* Phase 5: partition exactly. *fits_p = 0 when no split fits (with
 * s->want_shortfall, after measuring by how much: record_shortfall). */
static bg_status_t run_partition(search_t *s, const bg_layer_profile_t *prof, candidate_t *c, int *fits_p)
{
    double bottleneck;
    bg_part_shortfall_t sf;
    memset(&sf, 0, sizeof(sf));
    *fits_p = 0;
    if (s->want_shortfall) /* measures the miss, and says whether it fits, in one go */
        BG_CHECK(bg_part_shortfall(&c->prob, &sf));
    bg_status_t st = sf.extra_bytes ? BG_ERR_NO_FIT : bg_partition(&c->prob, c->out, &bottleneck);
    if (st == BG_ERR_NO_FIT) {
        if (s->want_shortfall)
            record_shortfall(s, prof, c, &sf);
        return BG_OK;
    }
    if (st == BG_OK) {
        *fits_p = 1;
        for (int v = c->Lm; v < c->S; v++) /* every copy of a model stage: the same layers */
            c->out[v] = c->out[v % c->Lm];
    }
    return st;
}

/* Phase 6: simulate the schedule with the partition's per-stage costs
 * (milliseconds), the largest boundary message, the gradient all-reduce
 * (dp > 1) and the optimizer step. *res_p = NULL (BG_OK) when a lower bound
 * of the step is above limit: the layout cannot be among the best, and its
 * simulation is skipped. */
/* Whether the schedule kind runs its backwards split (B then W), and the
 * B and W times measured apart (seconds per layer: on a tensor group of this
 * degree, or at tp = 1 in one process), both NULL when not measured or not
 * split: then the backward's time is halved between them. */
static int split_times(const search_t *s, bg_schedule_kind_t kind, const double **mb_p, const double **mw_p)
{
    const bg_plan_params_t *pa = s->pp;
    int split_bw = kind == BG_SCHED_ZB_H1 || kind == BG_SCHED_ZB_H2 || kind == BG_SCHED_ZBV ||
                   kind == BG_SCHED_ZB_INTERLEAVED || kind == BG_SCHED_DUALPIPEV; /* dualpipev: partly */
    const double *mb = s->times ? s->times->b_s : NULL, *mw = s->times ? s->times->w_s : NULL;
    if (!s->times && s->tp == 1 && pa->size >= offsetof(bg_plan_params_t, layer_w_s) + sizeof(double *))
        mb = pa->layer_b_s, mw = pa->layer_w_s;
    int measured_bw = split_bw && mb && mw;
    *mb_p = measured_bw ? mb : NULL;
    *mw_p = measured_bw ? mw : NULL;
    return split_bw;
}

/* Whether every backward of the kind's programs is whole (B and W in one
 * instruction): the list scheduler's families without a split, whose fixed
 * orders (Megatron's interleaved) are whole too (schedule/generate.c). */
static int whole_backwards(bg_schedule_kind_t kind)
{
    return kind == BG_SCHED_GPIPE || kind == BG_SCHED_1F1B || kind == BG_SCHED_INTERLEAVED;
}

/* The worst step kept when the list of the best is full: a layout whose step
 * is above it cannot enter the list (cmp_plan: a later one of equal step,
 * pp and m goes after it). INFINITY while the list has room, and when every
 * layout's work is wanted (the no-fit pass measuring shortfalls). */
static double keep_limit(const search_t *s)
{
    int top = s->pp->top > 0 ? s->pp->top : 5;
    if (s->want_shortfall || s->nplans < top)
        return INFINITY;
    return s->plans[top - 1]->step_ms;
}

/* Seconds virtual stage v of an offloaded candidate spends on the host link (docs/offload.md "The
 * planner"), as a device backend's offload moves the bytes: *step_s_p at its optimizer step, *gather_s_p
 * at each gather of its layers' parameters (forward, backward, recomputation), *act_s_p each way of one
 * microbatch's stashed activations, averaged over the microbatches (--offload activations: out after its
 * forward, back before its backward, for the microbatches whose stash the points move: c->moved; none
 * on a recomputing stage, which keeps no stash). Per element its replica
 * updates (the stage's parameters, their shard under --zero 1..3): --offload optimizer 12 bytes, the
 * gradient and the parameter down and the parameter back (runtime/offload.c's host step, one copy
 * stream); optimizer,params 4, the gradient shard down (the shard lives on the host), and every gather
 * copies the shard in (4 bytes each, runtime/zero_params.c). None is assumed hidden. Both 0 without
 * offload or with a free link (the CPU backend steps the state where it lives, and its gathers copy the
 * shard from the store as they copy it from the backend without offload). */
static void offload_seconds(const search_t *s, const candidate_t *c, int v, double *step_s_p, double *gather_s_p,
                            double *act_s_p)
{
    double hb = s->pp->host_bandwidth, g = (double)c->dp * s->cp;
    double n = (double)range_params(c, c->out[v].first, c->out[v].last) / (c->zero && g > 1 ? g : 1);
    *step_s_p = *gather_s_p = *act_s_p = 0;
    if (!(hb > 0))
        return;
    if (c->offact && !c->out[v].recompute)
        *act_s_p = (double)c->out[v].layer_act_bytes * c->moved[v] / c->m / hb;
    if (!c->offload)
        return;
    *step_s_p = (c->offload >= 2 ? 4.0 : 12.0) * n / hb;
    *gather_s_p = c->offload >= 2 ? 4.0 * n / hb : 0.0;
}

static bg_status_t simulate(const search_t *s, const candidate_t *c, double limit, bg_sim_result_t **res_p,
                            double *offload_ms_p)
{
    const bg_plan_params_t *pa = s->pp;
    int S = c->S;
    const bg_part_stage_t *out = c->out;
    double *fc = calloc((size_t)S, sizeof(double)), *bc = calloc((size_t)S, sizeof(double));
    double *wc = calloc((size_t)S, sizeof(double)), *sb = calloc((size_t)S, sizeof(double));
    bg_status_t st = BG_OK;
    if (!fc || !bc || !wc || !sb) {
        st = bg_error(BG_ERR_NOMEM, "plan candidate");
        goto out;
    }
    size_t act_msg = 0, grad_msg = 0; /* the largest boundary messages: activation (kept type), gradient (fp32) */
    size_t maxparams = 0;
    double maxopt = 0; /* the slowest stage's optimizer step (measured), seconds */
    double maxxfer = 0; /* the largest stage's offload transfers at its optimizer step, seconds */
    *offload_ms_p = 0;
    const double *mb, *mw;
    split_times(s, c->kind, &mb, &mw);
    int measured_bw = mb != NULL;
    for (int v = 0; v < S; v++) {
        double f = 0, bw = 0, b = 0, w = 0;
        for (int i = out[v].first; i <= out[v].last; i++) {
            f += c->layers[i].fwd_time;
            bw += c->layers[i].bwd_time;
            if (measured_bw) {
                b += mb[i];
                w += mw[i];
            }
        }
        if (!measured_bw) /* no measurement of the split: half and half */
            b = w = bw / 2;
        double spd = c->specs[v].speed, xs, xg, xa;
        offload_seconds(s, c, v, &xs, &xg, &xa); /* the link's, not the device's: not scaled by its speed */
        fc[v] = 1e3 * (f / spd + xg + xa);
        bc[v] = 1e3 * ((b + (out[v].recompute ? f : 0)) / spd + (out[v].recompute ? 2 : 1) * xg + xa);
        wc[v] = 1e3 * w / spd;
        if (xs > maxxfer)
            maxxfer = xs;
        sb[v] = (double)out[v].stash_per_mb;
        if (v < S - 1 && out[v].dout_bytes > grad_msg)
            grad_msg = out[v].dout_bytes;
        if (v < S - 1 && c->layers[out[v].last].output_bytes > act_msg)
            act_msg = c->layers[out[v].last].output_bytes;
        size_t np = range_params(c, out[v].first, out[v].last);
        if (np > maxparams)
            maxparams = np;
        double o = 0;
        for (int i = out[v].first; i <= out[v].last; i++)
            o += c->opt[i];
        if (o / spd > maxopt)
            maxopt = o / spd;
    }
    bg_sim_params_t simp = BG_SIM_PARAMS_INIT;
    simp.f_costs = fc;
    simp.b_costs = bc;
    simp.w_costs = wc;
    simp.latency = 1e3 * pa->link_latency;
    simp.bandwidth = pa->link_bandwidth / 1e3;
    simp.act_bytes = (double)act_msg;
    simp.grad_bytes = (double)grad_msg;
    simp.stash_bytes_per_stage = sb;
    double minspeed = INFINITY;
    for (int r = 0; r < c->pp; r++)
        if (c->rspeed[r] < minspeed)
            minspeed = c->rspeed[r];
    int dp = c->dp * s->cp; /* the reducing group: dp x cp */
    if (dp > 1) /* ring all-reduce of the largest stage's gradients (--zero 2: (m+1)/2 of it; 3: also the
                 * parameters' gathers, two a microbatch at least, each half an all-reduce) */
        simp.reduce_cost = 1e3 * (c->zero == 3 ? (c->m + 1) / 2.0 + c->m : c->zero == 2 ? (c->m + 1) / 2.0 : 1.0) *
                           (2.0 * (dp - 1) * pa->link_latency +
                            (pa->link_bandwidth > 0 ? 2.0 * (dp - 1) / dp * 4.0 * (double)maxparams /
                                                          pa->link_bandwidth
                                                    : 0.0));
    simp.optimizer_cost = c->opt_measured ? 1e3 * maxopt : 1e3 * 10.0 * (double)maxparams / (pa->flops * minspeed);
    simp.optimizer_cost += 1e3 * maxxfer;
    for (int r = 0; r < c->pp && (c->offload || c->offact); r++) { /* what the rank charged most pays */
        double t = c->V * 1e3 * maxxfer, xs, xg, xa; /* the steps, gathers, stashes out and back */
        for (int v = 0; v < S; v++)
            if (bg_schedule_stage_rank(c->sched, v) == r) {
                offload_seconds(s, c, v, &xs, &xg, &xa);
                t += 1e3 * c->m * ((out[v].recompute ? 3 : 2) * xg + 2 * xa);
            }
        if (t > *offload_ms_p)
            *offload_ms_p = t;
    }
    *res_p = NULL;
    if (limit < INFINITY) {
        double bw = simp.bandwidth > 0 ? simp.bandwidth : INFINITY; /* the simulator's delay of a message */
        double lb = bg__plan_step_bound(c->sched, c->m, fc, bc, wc, whole_backwards(c->kind),
                                        simp.latency + simp.act_bytes / bw, simp.latency + simp.grad_bytes / bw,
                                        c->V * (simp.reduce_cost + simp.optimizer_cost));
        if (lb * (1 - BG__PLAN_BOUND_MARGIN) > limit)
            goto out;
    }
    st = bg__schedule_simulate_figures(c->sched, &simp, res_p); /* the plan keeps no timeline */
out:
    free(fc);
    free(bc);
    free(wc);
    free(sb);
    return st;
}

/* Phase 7: each pipeline rank's peak: with one chunk the partitioner's own
 * evaluation; with several, their static memory plus the largest joint
 * activation row (every chunk's counts at one program point). */
static void rank_memory(const candidate_t *c, bg_plan_t *p)
{
    int S = c->S, V = c->V;
    const bg_part_stage_t *out = c->out;
    for (int r = 0; r < c->pp; r++) {
        uint64_t stat = 0, best = 0;
        p->rank_budget[r] = c->rbudget[r];
        if (V == 1) { /* one chunk: the partitioner's own evaluation is the rank's */
            for (int v = 0; v < S; v++)
                if (bg_schedule_stage_rank(c->sched, v) == r)
                    p->rank_peak[r] = out[v].mem_bytes;
            continue;
        }
        for (int v = 0; v < S; v++)
            if (bg_schedule_stage_rank(c->sched, v) == r)
                stat += out[v].static_bytes + out[v].scratch_bytes;
        for (int k = 0; k < c->nrows[r]; k++) {
            uint64_t sum = 0;
            for (int v = 0; v < S; v++) {
                if (bg_schedule_stage_rank(c->sched, v) != r)
                    continue;
                sum += bg_part_row_bytes(&c->rows[r][(size_t)k * V + bg_schedule_stage_chunk(c->sched, v)], &out[v]);
            }
            if (sum > best)
                best = sum;
        }
        p->rank_peak[r] = stat + best;
    }
}

/* Phase 8: the plan record of a fitting, simulated candidate (its model JSON
 * is attached when the search keeps it, see bg_plan_search). */
static bg_status_t plan_record(const search_t *s, const bg_layer_profile_t *prof, const candidate_t *c,
                               const bg_sim_result_t *res, double offload_ms, bg_plan_t **plan_p)
{
    const bg_plan_params_t *pa = s->pp;
    bg_plan_t *p = bg__plan_alloc(s->L, c->Lm, c->pp); /* copies > 1: the model stages (copy 0's) */
    if (!p)
        return bg_error(BG_ERR_NOMEM, "plan");
    p->seq = s->seq * s->cp; /* the whole sequence; each context member profiled at its seq / cp */
    p->cp = s->cp;
    p->world = c->pp * c->dp * s->cp * s->tp;
    p->pp = c->pp;
    p->dp = c->dp;
    p->tp = s->tp;
    p->microbatches = c->m;
    p->microbatch_size = c->n;
    p->batch = pa->batch;
    p->chunks = c->V;
    snprintf(p->schedule, sizeof(p->schedule), "%s", bg_schedule_kind_name(c->kind));
    p->optim = (int)pa->optim;
    p->zero = c->zero;
    p->offload = c->offload;
    p->sp = s->tp > 1 && bg_model_desc_sequence_parallel(s->desc);
    p->precision = bg_model_desc_precision(s->desc);
    p->paired = c->prob.paired;
    p->step_ms = bg_sim_step_time(res);
    p->bubble = bg_sim_bubble(res, -1);
    p->tokens_per_s = p->step_ms > 0 ? (double)pa->batch * p->seq / (p->step_ms / 1e3) : 0;
    p->flops = pa->flops;
    p->link_latency = pa->link_latency;
    p->link_bandwidth = pa->link_bandwidth;
    p->host_bandwidth = pa->host_bandwidth;
    p->offload_ms = offload_ms;
    p->offact = c->offact;
    memcpy(p->layers, prof, (size_t)s->L * sizeof(*prof));
    p->times = s->times ? TIMES_MEASURED_TP : pa->layer_fwd_s ? TIMES_MEASURED : TIMES_FLOPS;
    for (int i = 0; i < s->L; i++) {
        p->cost_ms[NCOST * i] = 1e3 * c->layers[i].fwd_time;
        p->cost_ms[NCOST * i + 1] = 1e3 * c->layers[i].bwd_time;
        p->cost_ms[NCOST * i + 2] = 1e3 * c->coll[i];
        p->cost_ms[NCOST * i + 3] = 1e3 * c->opt[i];
    }
    for (int v = 0; v < c->Lm; v++) {
        bg_plan_stage_t *ps = &p->stages[v];
        const bg_part_stage_t *o = &c->out[v];
        ps->rank = bg_schedule_stage_rank(c->sched, v);
        ps->chunk = bg_schedule_stage_chunk(c->sched, v);
        ps->first_layer = o->first;
        ps->last_layer = o->last;
        ps->params = range_params(c, o->first, o->last);
        ps->budget_bytes = c->specs[v].budget_bytes;
        ps->predicted_peak_bytes = o->mem_bytes;
        ps->recompute = o->recompute;
        ps->predicted_ms_per_microbatch = 1e3 * o->time;
    }
    rank_memory(c, p);
    *plan_p = p;
    return BG_OK;
}

/* The model stages a schedule of this kind (and chunks, 0: the kind's
 * default) has on pp ranks: pp x its chunks per rank / its model copies.
 * bg_schedule_generate fixes both from the kind and the chunks alone, not
 * from the depth or the microbatches, so a schedule of 2 ranks and 4
 * microbatches tells them for every layout, at a tiny fraction of the cost
 * of the layout's own (pp x m x chunks steps). 0 when even that one cannot
 * be made: the layout's own generation decides then. */
static long long model_stages(bg_schedule_kind_t kind, int chunks, int pp)
{
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = kind;
    sp.stages = 2;
    sp.microbatches = 4;
    sp.chunks = chunks;
    bg_schedule_t *probe = NULL;
    if (bg_schedule_generate(&sp, &probe) != BG_OK)
        return 0;
    long long n = (long long)pp * bg_schedule_chunks(probe) / bg_schedule_copies(probe);
    bg_schedule_free(probe);
    return n;
}

/* Before generating a layout's schedule: *skip_p = 1 when no split of the
 * layers can give it a step within limit (the worst kept, keep_limit), by
 * bg__plan_bound_exceeds. Only for the kinds of one chunk per rank and one
 * chain (stage r on rank r), whose program bg_schedule_generate would make
 * (its checks pass), and not under --zero auto or --offload auto, which try
 * the next sharding stage or offloading when a layout does not fit: a
 * skipped layout's fit is not known. */
static bg_status_t skip_before_schedule(const search_t *s, const candidate_t *c, const bg_schedule_params_t *sp,
                                        double limit, int *skip_p)
{
    *skip_p = 0;
    bg_schedule_kind_t kind = c->kind;
    if (!(limit < INFINITY) || s->pp->zero == BG_PLAN_ZERO_AUTO || s->pp->offload == BG_PLAN_OFFLOAD_AUTO ||
        (kind != BG_SCHED_GPIPE && kind != BG_SCHED_1F1B && kind != BG_SCHED_ZB_H1 && kind != BG_SCHED_ZB_H2) ||
        bg__schedule_generate_check(sp) != BG_OK)
        return BG_OK;
    int L = s->L;
    double *f = malloc((size_t)L * 3 * sizeof(double));
    if (!f)
        return bg_error(BG_ERR_NOMEM, "plan bound");
    double *b = f + L, *w = f + 2 * L, speed = 0;
    const double *mb, *mw;
    split_times(s, kind, &mb, &mw);
    for (int i = 0; i < L; i++) { /* simulate()'s costs, per layer (ms at speed 1) */
        f[i] = 1e3 * c->layers[i].fwd_time;
        b[i] = 1e3 * (mb ? mb[i] : c->layers[i].bwd_time / 2);
        w[i] = 1e3 * (mw ? mw[i] : c->layers[i].bwd_time / 2);
    }
    for (int r = 0; r < c->pp; r++)
        if (c->rspeed[r] > speed)
            speed = c->rspeed[r];
    *skip_p = bg__plan_bound_exceeds(L, f, b, w, whole_backwards(kind), c->pp, c->m, speed,
                                     1e3 * s->pp->link_latency, limit);
    free(f);
    return BG_OK;
}

/* Evaluate one layout at one sharding stage and offload; a fitting one that
 * could be among the best comes back in *plan_p with its program in
 * *sched_p (both the caller's; NULL otherwise), a non-fitting one may become
 * the best shortfall. *fits_p says whether it fit (0 for a layout skipped
 * before its schedule was made: not known). */
static bg_status_t evaluate_zero(search_t *s, const bg_layer_profile_t *prof, int pp, int dp, int m, int n,
                                 bg_schedule_kind_t kind, int zero, int offload, int offact, int *fits_p,
                                 bg_plan_t **plan_p, bg_schedule_t **sched_p)
{
    candidate_t c = {.pp = pp, .dp = dp, .m = m, .n = n, .zero = dp * s->cp > 1 ? zero : 0, .kind = kind,
                     .offact = offact};
    c.offload = offload >= 2 && c.zero != 3 ? 1 : offload; /* the parameter shard exists at stage 3 only */
    bg_sim_result_t *res = NULL;
    bg_plan_t *p = NULL;
    bg_status_t st = BG_OK;
    int fits = 0;
    double offload_ms = 0;
    *fits_p = 0;
    *plan_p = NULL;
    *sched_p = NULL;
    /* more model stages than layers: not a candidate, made or not (the check after generating, done
     * first: the largest schedules are those of the deepest pipelines, often the ones refused here) */
    if (model_stages(kind, s->pp->chunks, pp) > s->L)
        return BG_OK;
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = kind;
    sp.stages = pp;
    sp.microbatches = m;
    sp.chunks = s->pp->chunks;
    c.paired = !offact && bg_plan_paired_for(s->tp, c.zero, c.dp); /* activation offload runs unpaired */
    BG_CHECK_GOTO(candidate_devices(s, &c), st, out);
    BG_CHECK_GOTO(candidate_layers(s, prof, &c), st, out);
    double limit = keep_limit(s);
    int skip = 0;
    BG_CHECK_GOTO(skip_before_schedule(s, &c, &sp, limit, &skip), st, out);
    if (skip) { /* counted as the layouts it would have made, its fit left unknown */
        s->evaluated++;
        goto out;
    }
    if (bg_schedule_generate(&sp, &c.sched) != BG_OK)
        goto out; /* this schedule cannot run this (p, m, v): not a candidate */
    c.V = bg_schedule_chunks(c.sched);
    c.S = bg_schedule_stages(c.sched);
    c.copies = bg_schedule_copies(c.sched);
    c.Lm = c.S / c.copies;
    if (c.Lm > s->L)
        goto out; /* more stages than layers: not a candidate */
    s->evaluated++;
    BG_CHECK_GOTO(build_problem(s, &c), st, out);
    BG_CHECK_GOTO(run_partition(s, prof, &c, &fits), st, out);
    if (!fits)
        goto out;
    *fits_p = 1;
    BG_CHECK_GOTO(simulate(s, &c, limit, &res, &offload_ms), st, out);
    if (!res)
        goto out; /* its step is above the worst kept: it would not be kept */
    BG_CHECK_GOTO(plan_record(s, prof, &c, res, offload_ms, &p), st, out);
    *plan_p = p;
    *sched_p = c.sched;
    c.sched = NULL;
out:
    bg_sim_result_free(res);
    candidate_free(&c);
    return st;
}

/* A layout at the sharding stage and offload asked for, or the fastest of
 * the choices that fit (BG_PLAN_ZERO_AUTO: stages 0..3, dp > 1;
 * BG_PLAN_OFFLOAD_AUTO: none, the optimizer state, at stage 3 also the
 * parameter shard). The cost model prunes: at one stage more offload is
 * never faster (its transfers only add), so each stage takes the least
 * offload that fits there; at one offload a higher stage is never faster
 * (its reductions only grow) except from 0 to 1 with offload, whose
 * transfers shrink to the shard. So the stages are tried from the lowest up
 * until one fits with the least offload allowed, without offload or at a
 * stage >= 1. Activation offload (BG_PLAN_OFFLOAD_AUTO in
 * offload_activations) is tried at each offload where it does not fit
 * without it, and a fit that needs it goes on to the next offload (its
 * stashes' transfers may cost more than the optimizer state's). The fastest
 * fitting one joins the list. */
bg_status_t bg__plan_evaluate(search_t *s, const bg_layer_profile_t *prof, int pp, int dp, int m, int n,
                              bg_schedule_kind_t kind, int *fits_p)
{
    int zauto = s->pp->zero == BG_PLAN_ZERO_AUTO, oauto = s->pp->offload == BG_PLAN_OFFLOAD_AUTO;
    int g = dp * s->cp; /* the sharding group */
    int z0 = zauto ? 0 : s->pp->zero, z1 = zauto ? (g > 1 ? 3 : 0) : s->pp->zero;
    int o0 = oauto ? 0 : s->pp->offload, any = 0, done = 0;
    int aask = s->pp->size >= offsetof(bg_plan_params_t, offload_activations) + sizeof(int) ? s->pp->offload_activations : 0;
    int a0 = aask == BG_PLAN_OFFLOAD_AUTO ? 0 : aask, a1 = aask == BG_PLAN_OFFLOAD_AUTO ? 1 : aask;
    bg_plan_t *best = NULL;
    bg_schedule_t *best_sched = NULL;
    bg_status_t st = BG_OK;
    for (int z = z0; z <= z1 && !done && st == BG_OK; z++) {
        int plain = 0; /* a fit at this stage without more activation offload than asked */
        for (int o = o0; o <= (oauto ? (z == 3 && g > 1 ? 2 : 1) : s->pp->offload) && !plain && st == BG_OK; o++)
            for (int a = a0, fits = 0; a <= a1 && !fits && st == BG_OK; a++) {
                bg_plan_t *p;
                bg_schedule_t *sched;
                st = evaluate_zero(s, prof, pp, dp, m, n, kind, z, o, a, &fits, &p, &sched);
                if (p && (!best || p->step_ms < best->step_ms)) { /* a tie keeps the lower stage */
                    bg_plan_free(best);
                    bg_schedule_free(best_sched);
                    best = p, best_sched = sched;
                } else {
                    bg_plan_free(p);
                    bg_schedule_free(sched);
                }
                any |= fits;
                plain = fits && a == a0;
                done = plain && o == o0 && (o == 0 || z >= 1 || g < 2);
            }
    }
    if (fits_p)
        *fits_p = any;
    if (best && st == BG_OK)
        st = keep_plan(s, best, best_sched);
    else
        bg_plan_free(best);
    bg_schedule_free(best_sched);
    return st;
}
