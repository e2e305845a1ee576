/* partitioner/plan.c: the layout search (pipeline x data parallel x
 * microbatches x schedule), each candidate partitioned exactly and simulated
 * with bg_schedule_simulate(); the plan object, its JSON (docs/partitioner.md)
 * and the checks `brigade train --plan` needs. No printing: the CLI prints.
 *
 * The model is a description (model.h): the search reads only its input
 * (kind, positions, features) and the sizes and FLOPs its layers report
 * (bg_model_profile), so any list of layers plans the same way. A plan keeps
 * the description's JSON (bg_model_desc_to_json) as it is; models/desc.c owns
 * that format.
 *
 * Devices: rank = pp_i * dp + dp_i (the executor's layout), so pipeline rank
 * r is served by devices r*dp .. r*dp+dp-1; with heterogeneous devices a
 * pipeline rank gets the smallest budget and the lowest speed of its replicas
 * (every replica must fit, the slowest sets the pace). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "brigade/partitioner.h"
#include "brigade/schedule.h"
#include "core/check.h"
#include "core/util.h"

#define PLAN_FORMAT "brigade-plan"
#define PLAN_VERSION 2 /* 2: "model" is the model's description (1: a GPT/MLP configuration) */

enum { NCOST = 4 }; /* per layer: forward, backward, collectives, optimizer (plan JSON fwd_ms .. opt_ms) */

struct bg_plan {
    char *model_json; /* bg_model_desc_to_json text of the model */
    int seq, world, pp, dp, tp, microbatches, microbatch_size, batch, chunks;
    char schedule[32];
    int optim;
    int zero; /* sharding stage counted (docs/data_parallel.md) */
    int sp;   /* sequence parallelism: the tp build's layers are split along the sequence */
    int paired; /* BRIGADE_TP_OVERLAP=microbatch counted (bg_part_problem_t.paired) */
    bg_dtype_t precision; /* the activations' storage the layer sizes count (bg_model_desc_precision) */
    double step_ms, bubble, tokens_per_s;
    double flops, link_latency, link_bandwidth;
    int nlayers;
    bg_layer_profile_t *layers;
    double *cost_ms;  /* [nlayers][NCOST]: the cost model's forward, backward and collectives (of both) per
                         microbatch, and the layer's share of the optimizer step */
    int times;        /* where the layer times came from: TIMES_FLOPS, TIMES_MEASURED or TIMES_MEASURED_TP */
    int nstages;
    bg_plan_stage_t *stages;
    uint64_t *rank_peak, *rank_budget; /* [pp] */
};

enum { TIMES_FLOPS, TIMES_MEASURED, TIMES_MEASURED_TP };
static const char *const times_names[] = {"flops", "measured", "measured_tp", NULL};

struct bg_plan_set {
    int count, evaluated;
    bg_plan_t **plans;
    char note[1400]; /* what the search had to do to fit (tensor parallelism), or empty */
};

void bg_plan_free(bg_plan_t *p)
{
    if (!p)
        return;
    free(p->model_json);
    free(p->layers);
    free(p->cost_ms);
    free(p->stages);
    free(p->rank_peak);
    free(p->rank_budget);
    free(p);
}

static bg_plan_t *plan_alloc(int nlayers, int nstages, int pp)
{
    bg_plan_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->nlayers = nlayers;
    p->nstages = nstages;
    p->layers = calloc((size_t)nlayers, sizeof(*p->layers));
    p->cost_ms = calloc((size_t)nlayers * NCOST, sizeof(double));
    p->stages = calloc((size_t)nstages, sizeof(*p->stages));
    p->rank_peak = calloc((size_t)pp, sizeof(uint64_t));
    p->rank_budget = calloc((size_t)pp, sizeof(uint64_t));
    if (!p->layers || !p->cost_ms || !p->stages || !p->rank_peak || !p->rank_budget) {
        bg_plan_free(p);
        return NULL;
    }
    return p;
}

bg_plan_t *bg_plan_copy(const bg_plan_t *src)
{
    bg_plan_t *p = plan_alloc(src->nlayers, src->nstages, src->pp);
    if (!p)
        return NULL;
    bg_layer_profile_t *l = p->layers;
    double *cm = p->cost_ms;
    bg_plan_stage_t *s = p->stages;
    uint64_t *rp = p->rank_peak, *rb = p->rank_budget;
    *p = *src;
    p->layers = l, p->cost_ms = cm, p->stages = s, p->rank_peak = rp, p->rank_budget = rb;
    memcpy(cm, src->cost_ms, (size_t)src->nlayers * NCOST * sizeof(double));
    p->model_json = src->model_json ? strdup(src->model_json) : NULL;
    memcpy(l, src->layers, (size_t)src->nlayers * sizeof(*l));
    memcpy(s, src->stages, (size_t)src->nstages * sizeof(*s));
    memcpy(rp, src->rank_peak, (size_t)src->pp * sizeof(uint64_t));
    memcpy(rb, src->rank_budget, (size_t)src->pp * sizeof(uint64_t));
    if (src->model_json && !p->model_json) {
        bg_plan_free(p);
        return NULL;
    }
    return p;
}

/* ------------------------------------------------------------------------ */
/* accessors                                                                */

int bg_plan_world(const bg_plan_t *p) { return p->world; }
int bg_plan_pp(const bg_plan_t *p) { return p->pp; }
int bg_plan_dp(const bg_plan_t *p) { return p->dp; }
int bg_plan_tp(const bg_plan_t *p) { return p->tp; }
int bg_plan_microbatches(const bg_plan_t *p) { return p->microbatches; }
int bg_plan_microbatch_size(const bg_plan_t *p) { return p->microbatch_size; }
int bg_plan_batch(const bg_plan_t *p) { return p->batch; }
int bg_plan_seq(const bg_plan_t *p) { return p->seq; }
const char *bg_plan_schedule(const bg_plan_t *p) { return p->schedule; }
int bg_plan_chunks(const bg_plan_t *p) { return p->chunks; }
double bg_plan_step_ms(const bg_plan_t *p) { return p->step_ms; }
double bg_plan_bubble(const bg_plan_t *p) { return p->bubble; }
double bg_plan_tokens_per_s(const bg_plan_t *p) { return p->tokens_per_s; }
const char *bg_plan_model(const bg_plan_t *p) { return p->model_json; }
int bg_plan_num_stages(const bg_plan_t *p) { return p->nstages; }
const bg_plan_stage_t *bg_plan_stage(const bg_plan_t *p, int i)
{
    return i >= 0 && i < p->nstages ? &p->stages[i] : NULL;
}
int bg_plan_recompute(const bg_plan_t *p)
{
    for (int i = 0; i < p->nstages; i++)
        if (p->stages[i].recompute)
            return 1;
    return 0;
}
bg_optim_kind_t bg_plan_optimizer(const bg_plan_t *p) { return (bg_optim_kind_t)p->optim; }
int bg_plan_zero(const bg_plan_t *p) { return p->zero; }
int bg_plan_sequence_parallel(const bg_plan_t *p) { return p->sp; }
bg_dtype_t bg_plan_precision(const bg_plan_t *p) { return p->precision; }
int bg_plan_paired(const bg_plan_t *p) { return p->paired; }
int bg_plan_split(const bg_plan_t *p, int *split, int max)
{
    for (int i = 0; i < p->nstages && i < max; i++)
        split[i] = p->stages[i].last_layer - p->stages[i].first_layer + 1;
    return p->nstages;
}
uint64_t bg_plan_rank_peak_bytes(const bg_plan_t *p, int r) { return r >= 0 && r < p->pp ? p->rank_peak[r] : 0; }
uint64_t bg_plan_rank_budget_bytes(const bg_plan_t *p, int r) { return r >= 0 && r < p->pp ? p->rank_budget[r] : 0; }

int bg_plan_set_count(const bg_plan_set_t *s) { return s->count; }
int bg_plan_set_evaluated(const bg_plan_set_t *s) { return s->evaluated; }
const char *bg_plan_set_note(const bg_plan_set_t *s) { return s->note; }
const bg_plan_t *bg_plan_set_get(const bg_plan_set_t *s, int i) { return i >= 0 && i < s->count ? s->plans[i] : NULL; }
void bg_plan_set_free(bg_plan_set_t *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->count; i++)
        bg_plan_free(s->plans[i]);
    free(s->plans);
    free(s);
}

/* The plan's layers against a description's: the count, the sequence length
 * and every layer's profile at the plan's microbatch size (name, sizes and
 * FLOPs as the layers report them), which also tells apart models whose
 * description JSON is the same (attention heads, for one). diff[0] = 0 when
 * they agree, else it names the first difference. */
static bg_status_t model_for_tp(const bg_model_desc_t *d, int tp, int sp, const bg_model_desc_t **d_p,
                                bg_model_desc_t **own_p);

static bg_status_t layers_diff(const bg_plan_t *p, const bg_model_desc_t *d, char *diff, size_t cap)
{
    int L = bg_model_desc_num_layers(d), seq = bg_model_desc_params(d)->seq_len, n = 0;
    diff[0] = 0;
    if (p->nlayers != L) {
        snprintf(diff, cap, "%d layers in the plan, %d in the model", p->nlayers, L);
        return BG_OK;
    }
    if (p->seq != seq) {
        snprintf(diff, cap, "sequence length %d in the plan, %d in the model", p->seq, seq);
        return BG_OK;
    }
    bg_model_desc_t *own; /* a tensor-parallel plan's layers are the tp build's, per device */
    const bg_model_desc_t *dt;
    BG_CHECK(model_for_tp(d, p->tp, p->sp, &dt, &own));
    if (!dt) {
        snprintf(diff, cap, "the plan is for tp %d, which the model has no build for", p->tp);
        return BG_OK;
    }
    bg_layer_profile_t *prof = malloc((size_t)L * sizeof(*prof));
    if (!prof) {
        bg_model_desc_destroy(own);
        return bg_error(BG_ERR_NOMEM, "profile");
    }
    bg_status_t st = bg_model_profile(dt, p->microbatch_size, p->seq, prof, L, &n);
    bg_model_desc_destroy(own);
    for (int i = 0; i < L && st == BG_OK && !diff[0]; i++) {
        const bg_layer_profile_t *a = &p->layers[i], *b = &prof[i];
        struct {
            const char *field;
            double x, y;
        } f[] = {{"params", (double)a->params, (double)b->params},
                 {"stash_bytes", (double)a->stash_bytes, (double)b->stash_bytes},
                 {"wstash_bytes", (double)a->wstash_bytes, (double)b->wstash_bytes},
                 {"scratch_bytes", (double)a->scratch_bytes, (double)b->scratch_bytes},
                 {"output_bytes", (double)a->output_bytes, (double)b->output_bytes},
                 {"grad_bytes", (double)a->grad_bytes, (double)b->grad_bytes},
                 {"fwd_flops", a->fwd_flops, b->fwd_flops},
                 {"bwd_flops", a->bwd_flops, b->bwd_flops}};
        if (strcmp(a->name, b->name) != 0) {
            snprintf(diff, cap, "layer %d is \"%s\" in the plan, \"%s\" in the model", i, a->name, b->name);
            break;
        }
        for (size_t k = 0; k < BG_ARRAY_LEN(f) && !diff[0]; k++)
            if (!(fabs(f[k].x - f[k].y) <= 1e-12 * fabs(f[k].y))) /* sizes exactly; FLOPs as written */
                snprintf(diff, cap, "layer %d (%s) has %s %.17g in the plan, %.17g in the model", i, a->name,
                         f[k].field, f[k].x, f[k].y);
    }
    free(prof);
    return st;
}

bg_status_t bg_plan_check_model(const bg_plan_t *p, const bg_model_desc_t *d)
{
    char diff[256];
    BG_CHECK(bg_model_desc_match_json(d, p->model_json, "the plan"));
    if (bg_model_desc_precision(d) != p->precision)
        return bg_error(BG_ERR_MISMATCH, "the plan counted the activations in %s, the model keeps them in %s "
                        "(--precision)", bg_dtype_name(p->precision), bg_dtype_name(bg_model_desc_precision(d)));
    BG_CHECK(layers_diff(p, d, diff, sizeof(diff)));
    if (diff[0])
        return bg_error(BG_ERR_MISMATCH, "the plan is from another model: %s", diff);
    return BG_OK;
}

/* ------------------------------------------------------------------------ */
/* search                                                                   */

typedef struct search {
    const bg_plan_params_t *pp;
    const bg_model_desc_t *desc; /* pp->model, or its build for tensor-parallel degree tp */
    int tp;                      /* tensor-parallel degree of this pass: pp x dp groups of tp devices */
    const bg_plan_layer_times_t *times; /* the times measured at degree tp (pp->tp_times), or NULL */
    int world, L, seq;
    int tokens;     /* the model's input is token ids (else features: floats) */
    uint64_t *mem;  /* [world] */
    double *speed;  /* [world] */
    int homogeneous_mem;
    int want_shortfall; /* compute shortfalls of non-fitting layouts (only once nothing fits: it costs) */
    /* best no-fit seen */
    int have_short;
    uint64_t short_extra;       /* the closest layout's extra bytes per device (chunk extra x chunks) */
    uint64_t short_key;         /* what "closest" minimises */
    uint64_t min_uniform_budget;/* smallest uniform per-device budget that fits some candidate (homogeneous) */
    char short_msg[1024];
    /* results */
    bg_plan_t **plans;
    int nplans, cap, evaluated;
} search_t;

/* One layout under evaluation: its schedule, the devices of its pipeline
 * ranks, the partition problem and its solution. Phases of evaluate() fill
 * it in order; candidate_free() undoes them all. */
typedef struct candidate {
    int pp, dp, m, n;             /* pipeline depth, replicas, microbatches, microbatch size */
    int zero;                     /* sharding stage (0 when dp = 1) */
    int paired;                   /* BRIGADE_TP_OVERLAP=microbatch pairs its instructions (bg_plan_paired_for) */
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
    for (int k = 0; c->mcounts && k < c->Lm; k++)
        free(c->mcounts[k]);
    free(c->mcounts);
    free(c->mspecs);
    free(c->out);
    bg_schedule_free(c->sched);
}

static const char *sizestr(char *buf, size_t n, double b)
{
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024)
        snprintf(buf, n, "%.2f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0)
        snprintf(buf, n, "%.2f KiB", b / 1024.0);
    else
        snprintf(buf, n, "%.0f B", b);
    return buf;
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

static bg_status_t keep_plan(search_t *s, bg_plan_t *p)
{
    int top = s->pp->top > 0 ? s->pp->top : 5;
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
    s->plans[s->nplans++] = p;
    qsort(s->plans, (size_t)s->nplans, sizeof(*s->plans), cmp_plan);
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

/* Phase 1: every pipeline rank's device (the weakest of its replicas) and the
 * slot counts its program keeps (bg_part_schedule_counts). */
static bg_status_t candidate_devices(const search_t *s, candidate_t *c)
{
    int pp = c->pp, dp = c->dp;
    c->rspeed = malloc((size_t)pp * sizeof(double));
    c->rbudget = malloc((size_t)pp * sizeof(uint64_t));
    c->rows = calloc((size_t)pp, sizeof(*c->rows));
    c->nrows = calloc((size_t)pp, sizeof(int));
    if (!c->rspeed || !c->rbudget || !c->rows || !c->nrows)
        return bg_error(BG_ERR_NOMEM, "plan candidate");
    for (int r = 0; r < pp; r++) {
        c->rspeed[r] = INFINITY;
        c->rbudget[r] = UINT64_MAX;
        for (int d = 0; d < dp * s->tp; d++) { /* every replica's tensor group: tp devices each */
            int dev = r * dp * s->tp + d;
            if (s->speed[dev] < c->rspeed[r])
                c->rspeed[r] = s->speed[dev];
            if (s->mem[dev] < c->rbudget[r])
                c->rbudget[r] = s->mem[dev];
        }
        BG_CHECK(bg_part_schedule_counts(c->sched, r, c->paired, &c->rows[r], &c->nrows[r]));
    }
    return BG_OK;
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
 * the tensor group's collectives at the link's cost. */
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
        l->fwd_time += cf;
        l->bwd_time += cb;
        c->coll[i] = cf + cb;
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
                dominated = bg_part_counts_dominate(&proj[q], &x);
            if (dominated)
                continue;
            int w = 0;
            for (int q = 0; q < np; q++)
                if (!bg_part_counts_dominate(&x, &proj[q]))
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
 * Stage 2 also holds two buckets whole (bg_part_problem_t.bucket_bytes). */
static size_t zero_bytes_per_param(bg_optim_kind_t optim, int dp, int zero)
{
    size_t st = bg_optim_state_bytes(optim), d = (size_t)(dp > 1 ? dp : 1);
    if (zero == 1 && d > 1)
        return 8 + (st + d - 1) / d;
    if (zero == 2 && d > 1)
        return 4 + (4 + st + d - 1) / d;
    return 8 + st;
}

/* Phases 1-4: the partition problem of a candidate whose schedule is made.
 * The input and target bytes come from the model's input: n sequences of
 * seq positions, token ids or `features` floats each. */
static bg_status_t build_problem(const search_t *s, const bg_layer_profile_t *prof, candidate_t *c)
{
    const bg_plan_params_t *pa = s->pp;
    c->paired = bg_plan_paired_for(s->tp, c->zero, c->dp);
    BG_CHECK(candidate_devices(s, c));
    BG_CHECK(candidate_layers(s, prof, c));
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
    prob.bytes_per_param = zero_bytes_per_param(pa->optim, c->dp, c->zero);
    if (c->copies > 1) /* the executor's buffer for the other copy's gradient, summed before the step */
        prob.bytes_per_param += sizeof(float);
    if (c->zero == 2 && c->dp > 1) { /* the executor's buckets and its buffers for them (runtime/zero.c) */
        long long mb = 4, nbuf = 3;
        if (bg_config_int("BRIGADE_BUCKET_MB", &mb) != BG_OK || mb < 0)
            mb = 4;
        if (bg_config_int("BRIGADE_ZERO_BUFFERS", &nbuf) != BG_OK)
            nbuf = 3;
        prob.bucket_bytes = (size_t)mb * 1048576;
        prob.bucket_buffers = nbuf < 2 ? 2 : nbuf > 16 ? 16 : (int)nbuf;
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
        char tpb[48] = "";
        if (s->tp > 1)
            snprintf(tpb, sizeof tpb, " tp=%d%s", s->tp,
                     bg_model_desc_sequence_parallel(s->desc) ? " (sequence-parallel)" : "");
        snprintf(s->short_msg, sizeof(s->short_msg),
                 "closest layout pp=%d dp=%d%s %s m=%d (microbatch %d): stage %d on pipeline rank %d "
                 "(layers %d..%d, %s..%s) needs %s (parameters+gradients+optimizer %s, activations %s%s) but "
                 "its budget is %s: short by %s; its biggest layer is %s",
                 c->pp, c->dp, tpb, bg_schedule_kind_name(c->kind), c->m, c->n, sf->stage, r,
                 sf->first, sf->last,
                 prof[sf->first].name, prof[sf->last].name, sizestr(a, sizeof(a), (double)sf->need_bytes),
                 sizestr(b, sizeof(b), ws ? (double)ws->static_bytes : 0),
                 sizestr(cc, sizeof(cc), ws ? (double)(ws->act_bytes + ws->scratch_bytes) : 0),
                 ws && ws->recompute ? ", with recomputation" : "", sizestr(d, sizeof(d), (double)sf->budget_bytes),
                 sizestr(e, sizeof(e), (double)(sf->need_bytes - sf->budget_bytes)), prof[sf->biggest_layer].name);
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
 * (dp > 1) and the optimizer step. */
static bg_status_t simulate(const search_t *s, const candidate_t *c, bg_sim_result_t **res_p)
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
    bg_schedule_kind_t kind = c->kind;
    int split_bw = kind == BG_SCHED_ZB_H1 || kind == BG_SCHED_ZB_H2 || kind == BG_SCHED_ZBV ||
                   kind == BG_SCHED_ZB_INTERLEAVED || kind == BG_SCHED_DUALPIPEV; /* dualpipev: partly */
    /* B and W measured apart: on a tensor group of this degree, or (tp = 1) in one process */
    const double *mb = s->times ? s->times->b_s : NULL, *mw = s->times ? s->times->w_s : NULL;
    if (!s->times && s->tp == 1 && pa->size >= offsetof(bg_plan_params_t, layer_w_s) + sizeof(double *))
        mb = pa->layer_b_s, mw = pa->layer_w_s;
    int measured_bw = split_bw && mb && mw;
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
        double spd = c->specs[v].speed;
        fc[v] = 1e3 * f / spd;
        bc[v] = 1e3 * (b + (out[v].recompute ? f : 0)) / spd;
        wc[v] = 1e3 * w / spd;
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
    int dp = c->dp;
    if (dp > 1) /* ring all-reduce of the largest stage's gradients (--zero 2: (m+1)/2 of it) */
        simp.reduce_cost = 1e3 * (c->zero == 2 ? (c->m + 1) / 2.0 : 1.0) *
                           (2.0 * (dp - 1) * pa->link_latency +
                            (pa->link_bandwidth > 0 ? 2.0 * (dp - 1) / dp * 4.0 * (double)maxparams /
                                                          pa->link_bandwidth
                                                    : 0.0));
    simp.optimizer_cost = c->opt_measured ? 1e3 * maxopt : 1e3 * 10.0 * (double)maxparams / (pa->flops * minspeed);
    st = bg_schedule_simulate(c->sched, &simp, res_p);
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
                               const bg_sim_result_t *res, bg_plan_t **plan_p)
{
    const bg_plan_params_t *pa = s->pp;
    bg_plan_t *p = plan_alloc(s->L, c->Lm, c->pp); /* copies > 1: the model stages (copy 0's) */
    if (!p)
        return bg_error(BG_ERR_NOMEM, "plan");
    p->seq = s->seq;
    p->world = c->pp * c->dp * s->tp;
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
    p->sp = s->tp > 1 && bg_model_desc_sequence_parallel(s->desc);
    p->precision = bg_model_desc_precision(s->desc);
    p->paired = c->prob.paired;
    p->step_ms = bg_sim_step_time(res);
    p->bubble = bg_sim_bubble(res, -1);
    p->tokens_per_s = p->step_ms > 0 ? (double)pa->batch * s->seq / (p->step_ms / 1e3) : 0;
    p->flops = pa->flops;
    p->link_latency = pa->link_latency;
    p->link_bandwidth = pa->link_bandwidth;
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

/* Evaluate one layout; a fitting one goes to the list, a non-fitting one may
 * become the best shortfall. *fits_p (optional) says whether it fit. */
static bg_status_t evaluate_zero(search_t *s, const bg_layer_profile_t *prof, int pp, int dp, int m, int n,
                                 bg_schedule_kind_t kind, int zero, int *fits_p)
{
    candidate_t c = {.pp = pp, .dp = dp, .m = m, .n = n, .zero = dp > 1 ? zero : 0, .kind = kind};
    bg_sim_result_t *res = NULL;
    bg_plan_t *p = NULL;
    bg_status_t st = BG_OK;
    int fits = 0;
    if (fits_p)
        *fits_p = 0;
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = kind;
    sp.stages = pp;
    sp.microbatches = m;
    sp.chunks = s->pp->chunks;
    if (bg_schedule_generate(&sp, &c.sched) != BG_OK)
        return BG_OK; /* this schedule cannot run this (p, m, v): not a candidate */
    c.V = bg_schedule_chunks(c.sched);
    c.S = bg_schedule_stages(c.sched);
    c.copies = bg_schedule_copies(c.sched);
    c.Lm = c.S / c.copies;
    if (c.Lm > s->L)
        goto out; /* more stages than layers: not a candidate */
    s->evaluated++;
    BG_CHECK_GOTO(build_problem(s, prof, &c), st, out);
    BG_CHECK_GOTO(run_partition(s, prof, &c, &fits), st, out);
    if (!fits)
        goto out;
    BG_CHECK_GOTO(simulate(s, &c, &res), st, out);
    BG_CHECK_GOTO(plan_record(s, prof, &c, res, &p), st, out);
    if (fits_p)
        *fits_p = 1;
    st = keep_plan(s, p);
out:
    bg_sim_result_free(res);
    candidate_free(&c);
    return st;
}

/* A layout at the sharding stage asked for, or (BG_PLAN_ZERO_AUTO) at the
 * lowest that fits: 0, else 1, else 2 (dp > 1). */
static bg_status_t evaluate(search_t *s, const bg_layer_profile_t *prof, int pp, int dp, int m, int n,
                            bg_schedule_kind_t kind, int *fits_p)
{
    int want = s->pp->zero;
    if (want != BG_PLAN_ZERO_AUTO)
        return evaluate_zero(s, prof, pp, dp, m, n, kind, want, fits_p);
    int fits = 0;
    for (int z = 0; z <= (dp > 1 ? 2 : 0) && !fits; z++)
        BG_CHECK(evaluate_zero(s, prof, pp, dp, m, n, kind, z, &fits));
    if (fits_p)
        *fits_p = fits;
    return BG_OK;
}

static bg_status_t parse_schedules(const char *list, bg_schedule_kind_t *kinds, int *n_p)
{
    static const bg_schedule_kind_t all[] = {BG_SCHED_1F1B, BG_SCHED_GPIPE, BG_SCHED_INTERLEAVED,
                                             BG_SCHED_ZB_H1, BG_SCHED_ZB_H2, BG_SCHED_ZBV};
    int n = 0;
    if (!list || !*list || !strcmp(list, "all")) {
        for (size_t i = 0; i < BG_ARRAY_LEN(all); i++)
            kinds[n++] = all[i];
        *n_p = n;
        return BG_OK;
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        bg_schedule_kind_t k;
        BG_CHECK(bg_schedule_kind_parse(tok, &k));
        if (k == BG_SCHED_CUSTOM)
            return bg_error(BG_ERR_INVALID, "the planner cannot search a custom schedule");
        if (n >= BG_SCHED_KIND_COUNT)
            return bg_error(BG_ERR_INVALID, "too many schedules in \"%s\"", list);
        kinds[n++] = k;
    }
    if (n == 0)
        return bg_error(BG_ERR_INVALID, "empty schedule list \"%s\"", list);
    *n_p = n;
    return BG_OK;
}

static bg_status_t check_params(const bg_plan_params_t *p)
{
    if (!p || p->size < sizeof(bg_plan_params_t))
        return bg_error(BG_ERR_INVALID, "plan params: NULL or size mismatch (use BG_PLAN_PARAMS_INIT)");
    if (!p->model)
        return bg_error(BG_ERR_INVALID, "plan params: no model (give a description, for instance from bg_model_build)");
    BG_CHECK(bg_model_desc_check(p->model));
    if (p->world < 1)
        return bg_error(BG_ERR_INVALID, "devices must be >= 1 (got %d)", p->world);
    if (!p->mem || (p->nmem != 1 && p->nmem != p->world))
        return bg_error(BG_ERR_INVALID, "%d memory budgets for %d devices (give one for all, or one per device)",
                        p->nmem, p->world);
    for (int i = 0; i < p->nmem; i++)
        if (p->mem[i] == 0)
            return bg_error(BG_ERR_INVALID, "memory budget %d is 0 (must be > 0)", i);
    if (p->nspeed && p->nspeed != 1 && p->nspeed != p->world)
        return bg_error(BG_ERR_INVALID, "%d speeds for %d devices (give one for all, or one per device)", p->nspeed,
                        p->world);
    for (int i = 0; i < p->nspeed; i++)
        if (!(p->speed[i] > 0) || !isfinite(p->speed[i]))
            return bg_error(BG_ERR_INVALID, "speed %d is %g (must be > 0)", i, p->speed[i]);
    if (p->batch < 1)
        return bg_error(BG_ERR_INVALID, "batch must be >= 1 (got %d)", p->batch);
    if (p->zero != BG_PLAN_ZERO_AUTO && (p->zero < 0 || p->zero > 2))
        return bg_error(BG_ERR_INVALID, "zero = %d: the sharding stage must be 0, 1, 2 or auto", p->zero);
    if (p->microbatch_size < 0 || p->pp < 0 || p->chunks < 0)
        return bg_error(BG_ERR_INVALID, "microbatch size, pp and chunks must be >= 0");
    if (!(p->flops > 0) || !isfinite(p->flops))
        return bg_error(BG_ERR_INVALID, "flops must be > 0 (got %g)", p->flops);
    if (!(p->link_latency >= 0) || !(p->link_bandwidth >= 0) || !isfinite(p->link_latency) ||
        !isfinite(p->link_bandwidth))
        return bg_error(BG_ERR_INVALID, "link latency and bandwidth must be finite and >= 0");
    if (!p->layer_fwd_s != !p->layer_bwd_s)
        return bg_error(BG_ERR_INVALID, "measured layer times: give forward and backward times both");
    if (p->layer_fwd_s && p->microbatch_size == 0)
        return bg_error(BG_ERR_INVALID, "measured layer times are for one microbatch size: give the microbatch size");
    int nt = p->size >= offsetof(bg_plan_params_t, ntp_times) + sizeof(int) && p->tp_times ? p->ntp_times : 0;
    for (int k = 0; k < nt; k++) {
        const bg_plan_layer_times_t *t = &p->tp_times[k];
        if (t->tp < 1 || t->tp > 4096)
            return bg_error(BG_ERR_INVALID, "tp_times[%d]: tp %d (must be 1..4096)", k, t->tp);
        if (!t->fwd_s || !t->bwd_s || !t->b_s != !t->w_s)
            return bg_error(BG_ERR_INVALID, "tp_times[%d] (tp %d): give forward and backward times (and B and W both "
                            "or neither)", k, t->tp);
        if (p->microbatch_size == 0)
            return bg_error(BG_ERR_INVALID, "measured layer times are for one microbatch size: give the microbatch "
                                            "size");
        for (int j = 0; j < k; j++)
            if (p->tp_times[j].tp == t->tp && !p->tp_times[j].sequence_parallel == !t->sequence_parallel)
                return bg_error(BG_ERR_INVALID, "tp_times[%d] and [%d] are both for tp %d%s", j, k, t->tp,
                                t->sequence_parallel ? " with sequence parallelism" : "");
        for (int i = 0; i < bg_model_desc_num_layers(p->model); i++)
            if (!(t->fwd_s[i] >= 0) || !(t->bwd_s[i] >= 0) || (t->b_s && !(t->b_s[i] >= 0 && t->w_s[i] >= 0)) ||
                (t->tp_s && !(t->tp_s[i] >= 0)))
                return bg_error(BG_ERR_INVALID, "tp_times[%d] (tp %d): measured time of layer %d is negative", k,
                                t->tp, i);
    }
    return BG_OK;
}

/* Run the search for world devices (s->mem/speed sized >= world); pp_only > 0 restricts pp. */
static bg_status_t search_world(search_t *s, const bg_schedule_kind_t *kinds, int nk, int world, int pp_only,
                                int stop_at_first_fit, int *found_p)
{
    const bg_plan_params_t *pa = s->pp;
    bg_layer_profile_t *prof = NULL;
    int cap = s->L;
    prof = malloc((size_t)cap * sizeof(*prof));
    BG_ALLOC_CHECK(prof, (size_t)cap * sizeof(*prof), "profile");
    bg_status_t st = BG_OK;
    *found_p = 0;
    int last_n = -1;
    for (int pp = 1; pp <= world; pp++) {
        if (world % pp || pp > s->L || (pp_only && pp != pp_only) || (pa->pp && pp != pa->pp))
            continue;
        int dp = world / pp;
        if (pa->batch % dp)
            continue;
        int per = pa->batch / dp; /* sequences per replica per step */
        for (int m = 1; m <= per; m++) {
            if (per % m)
                continue;
            int n = per / m;
            if (pa->microbatch_size && n != pa->microbatch_size)
                continue;
            /* without a fixed microbatch size, keep the count near the pipeline depth */
            if (!pa->microbatch_size && m > 4 * pp && m > 8)
                continue;
            if (n != last_n) {
                int cnt;
                BG_CHECK_GOTO(bg_model_profile(s->desc, n, s->seq, prof, cap, &cnt), st, out);
                last_n = n;
            }
            for (int k = 0; k < nk; k++) {
                if (pp == 1 && kinds[k] != BG_SCHED_1F1B && kinds[k] != BG_SCHED_GPIPE)
                    continue; /* the others need p >= 2 to differ (and some refuse p = 1) */
                if (pp == 1 && dp == 1 && kinds[k] != BG_SCHED_1F1B)
                    continue; /* one process trains microbatch after microbatch: 1F1B's memory */
                int fits;
                BG_CHECK_GOTO(evaluate(s, prof, pp, dp, m, n, kinds[k], &fits), st, out);
                if (fits) {
                    *found_p = 1;
                    if (stop_at_first_fit)
                        goto out;
                }
            }
        }
    }
out:
    free(prof);
    return st;
}

/* The model built for tensor-parallel degree tp: the given description when
 * it is of that degree, else its builder's configuration with tp (and, sp >=
 * 0, sequence parallelism on or off; -1: the builder's) (*own_p:
 * the caller destroys it). *d_p = NULL when there is none (a host's own
 * layers, or sizes tp does not divide). */
static bg_status_t model_for_tp(const bg_model_desc_t *d, int tp, int sp, const bg_model_desc_t **d_p,
                                bg_model_desc_t **own_p)
{
    bg_model_config_t c;
    *own_p = NULL;
    *d_p = NULL;
    int deg = bg_model_desc_tp_degree(d);
    if (deg == tp) {
        *d_p = d;
        return BG_OK;
    }
    if (deg != 1 || bg_model_desc_builder(d, &c) != BG_OK)
        return BG_OK;
    c.tp = tp;
    if (sp >= 0)
        c.sequence_parallel = sp;
    if (bg_model_config_check(&c) != BG_OK)
        return BG_OK;
    BG_CHECK(bg_model_build(&c, own_p));
    *d_p = *own_p;
    return BG_OK;
}

/* The layer times measured at degree tp for a build with (sp = 1) or without
 * sequence parallelism (bg_plan_params_t.tp_times), or NULL. */
static const bg_plan_layer_times_t *times_for(const bg_plan_params_t *pa, int tp, int sp)
{
    if (pa->size < offsetof(bg_plan_params_t, ntp_times) + sizeof(int))
        return NULL;
    for (int k = 0; pa->tp_times && k < pa->ntp_times; k++)
        if (pa->tp_times[k].tp == tp && !!pa->tp_times[k].sequence_parallel == sp)
            return &pa->tp_times[k];
    return NULL;
}

/* One pass of the search at tensor-parallel degree tp: pp x dp = world / tp
 * groups of tp devices, with sequence parallelism on or off (sp; -1: as the
 * model's builder says). Nothing to do when the model has no build for tp. */
static bg_status_t search_tp(search_t *s, const bg_schedule_kind_t *kinds, int nk, int tp, int sp, int *found_p)
{
    bg_model_desc_t *own;
    const bg_model_desc_t *d;
    *found_p = 0;
    BG_CHECK(model_for_tp(s->pp->model, tp, sp, &d, &own));
    if (!d)
        return BG_OK;
    s->tp = tp;
    s->desc = d;
    s->times = times_for(s->pp, tp, tp > 1 && bg_model_desc_sequence_parallel(d));
    bg_status_t st = search_world(s, kinds, nk, s->world / tp, 0, 0, found_p);
    s->tp = 1;
    s->times = NULL;
    s->desc = s->pp->model;
    bg_model_desc_destroy(own);
    return st;
}

/* search_tp at degree tp as the builder says, and when no layout of that
 * degree fits and its sequence parallelism is off, again with it on: it
 * splits the layernorms', the residuals' and the pipeline's activations by tp
 * (a GPT builder's; docs/partitioner.md). *sp_p = 1 when only that fit. */
static bg_status_t search_tp_fit(search_t *s, const bg_schedule_kind_t *kinds, int nk, int tp, int *sp_p)
{
    int before = s->nplans, found;
    bg_model_config_t c;
    *sp_p = 0;
    BG_CHECK(search_tp(s, kinds, nk, tp, -1, &found));
    if (s->nplans > before || tp == 1 || bg_model_desc_tp_degree(s->pp->model) != 1 ||
        bg_model_desc_builder(s->pp->model, &c) != BG_OK || c.kind != BG_MODEL_GPT || c.sequence_parallel)
        return BG_OK;
    BG_CHECK(search_tp(s, kinds, nk, tp, 1, &found));
    *sp_p = s->nplans > before;
    return BG_OK;
}

bg_status_t bg_plan_search(const bg_plan_params_t *pa, bg_plan_set_t **set_p)
{
    BG_CHECK(check_params(pa));
    bg_schedule_kind_t kinds[BG_SCHED_KIND_COUNT];
    int nk = 0;
    BG_CHECK(parse_schedules(pa->schedules, kinds, &nk));
    search_t s;
    memset(&s, 0, sizeof(s));
    s.pp = pa;
    s.world = pa->world;
    s.desc = pa->model;
    s.tp = 1;
    /* tp_req: 0 every degree; N only N; auto: 1, then the smallest degree that fits */
    int tp_req = pa->size >= offsetof(bg_plan_params_t, tp) + sizeof(int) ? pa->tp : 0, tp_auto = tp_req == 0;
    int deg = bg_model_desc_tp_degree(pa->model);
    if (tp_req < BG_PLAN_TP_ALL || (tp_req > 0 && pa->world % tp_req))
        return bg_error(BG_ERR_INVALID, "tp %d does not divide %d devices", tp_req, pa->world);
    if (deg > 1 && tp_req > 0 && tp_req != deg)
        return bg_error(BG_ERR_INVALID, "tp %d but the model's layers are split for tp %d", tp_req, deg);
    tp_req = tp_req == BG_PLAN_TP_ALL ? 0 : tp_req == 0 ? 1 : tp_req;
    if (deg > 1) { /* a description of tensor-parallel layers runs at their degree only */
        tp_req = deg;
        tp_auto = 0;
    }
    const bg_model_desc_params_t *mp = bg_model_desc_params(s.desc);
    s.tokens = mp->input == BG_INPUT_TOKENS;
    s.seq = mp->seq_len; /* token models train at their sequence length; features have fixed positions */
    s.L = bg_model_desc_num_layers(s.desc);
    if (pa->pp && (pa->world % pa->pp))
        return bg_error(BG_ERR_INVALID, "--pp %d does not divide %d devices", pa->pp, pa->world);
    if (pa->pp > s.L)
        return bg_error(BG_ERR_INVALID, "--pp %d but the model has only %d layers", pa->pp, s.L);
    if (pa->microbatch_size && pa->batch % pa->microbatch_size)
        return bg_error(BG_ERR_INVALID, "batch %d is not a multiple of the microbatch size %d", pa->batch,
                        pa->microbatch_size);
    if (pa->layer_fwd_s) {
        for (int i = 0; i < s.L; i++)
            if (!(pa->layer_fwd_s[i] >= 0) || !(pa->layer_bwd_s[i] >= 0))
                return bg_error(BG_ERR_INVALID, "measured time of layer %d is negative", i);
    }
    char *model_json = NULL;
    s.mem = malloc((size_t)pa->world * sizeof(uint64_t));
    s.speed = malloc((size_t)pa->world * sizeof(double));
    bg_status_t st = BG_OK;
    if (!s.mem || !s.speed) {
        st = bg_error(BG_ERR_NOMEM, "device table");
        goto out;
    }
    s.homogeneous_mem = 1;
    for (int i = 0; i < pa->world; i++) {
        s.mem[i] = pa->mem[pa->nmem == 1 ? 0 : i];
        s.speed[i] = pa->nspeed ? pa->speed[pa->nspeed == 1 ? 0 : i] : 1.0;
        if (s.mem[i] != s.mem[0])
            s.homogeneous_mem = 0;
    }
    int sp_only = 0;
    char note[1400] = "";
    if (tp_req == 0) { /* every degree that divides the devices */
        for (int t = 1; t <= pa->world; t++)
            if (pa->world % t == 0)
                BG_CHECK_GOTO(search_tp_fit(&s, kinds, nk, t, &sp_only), st, out);
    } else {
        BG_CHECK_GOTO(search_tp_fit(&s, kinds, nk, tp_req, &sp_only), st, out);
    }
    if (s.nplans == 0 && s.evaluated > 0) {
        /* nothing fits: again, now measuring by how much each layout misses */
        s.want_shortfall = 1;
        s.evaluated = 0;
        BG_CHECK_GOTO(search_tp_fit(&s, kinds, nk, tp_req ? tp_req : 1, &sp_only), st, out);
        s.want_shortfall = 0;
        if (tp_auto) {
            /* a layer too big for one device: the smallest tensor-parallel degree that fits, said so */
            int evaluated = s.evaluated, t;
            for (t = 2; t <= pa->world && s.nplans == 0; t++)
                if (pa->world % t == 0)
                    BG_CHECK_GOTO(search_tp_fit(&s, kinds, nk, t, &sp_only), st, out);
            if (s.nplans > 0)
                snprintf(note, sizeof note, "nothing fits at tp = 1 (%s); tp = %d%s is the smallest tensor-parallel "
                                            "degree that fits", s.short_msg, s.plans[0]->tp,
                         sp_only && s.plans[0]->sp ? " with sequence parallelism" : "");
            else
                s.evaluated = evaluated;
        }
    } else if (sp_only && s.nplans > 0 && s.plans[0]->sp) {
        snprintf(note, sizeof note, "tp = %d fits only with sequence parallelism (the activations between blocks "
                                    "split along the sequence)", s.plans[0]->tp);
    }
    if (s.nplans == 0) {
        char a[32], b[160] = "";
        if (s.evaluated == 0) {
            st = bg_error(BG_ERR_INVALID,
                          "no layout to evaluate for %d devices, batch %d%s: pp must divide the devices, dp the "
                          "batch, and the microbatch size the per-replica batch",
                          pa->world, pa->batch, pa->microbatch_size ? " and the given microbatch size" : "");
            goto out;
        }
        /* smallest device count (devices like the smallest given) that fits */
        int min_dev = 0;
        uint64_t minmem = s.mem[0];
        for (int i = 0; i < pa->world; i++)
            if (s.mem[i] < minmem)
                minmem = s.mem[i];
        {
            search_t s2 = s;
            s2.plans = NULL;
            s2.nplans = s2.cap = 0;
            int wmax = 4 * s.L; /* pipelines of up to L stages, times some data parallelism */
            uint64_t *mem2 = malloc((size_t)wmax * sizeof(uint64_t));
            double *sp2 = malloc((size_t)wmax * sizeof(double));
            if (!mem2 || !sp2) {
                free(mem2);
                free(sp2);
                st = bg_error(BG_ERR_NOMEM, "device table");
                goto out;
            }
            double maxspeed = 0;
            for (int i = 0; i < pa->world; i++)
                if (s.speed[i] > maxspeed)
                    maxspeed = s.speed[i];
            for (int i = 0; i < wmax; i++)
                mem2[i] = minmem, sp2[i] = maxspeed;
            s2.mem = mem2;
            s2.speed = sp2;
            bg_plan_params_t p2 = *pa;
            p2.pp = 0;
            s2.pp = &p2;
            for (int w = pa->world + 1; w <= wmax && !min_dev; w++) {
                int f2;
                st = search_world(&s2, kinds, nk, w, 0, 1, &f2);
                if (st != BG_OK)
                    break;
                if (f2)
                    min_dev = w;
            }
            for (int i = 0; i < s2.nplans; i++)
                bg_plan_free(s2.plans[i]);
            free(s2.plans);
            free(mem2);
            free(sp2);
            if (st != BG_OK)
                goto out;
        }
        if (min_dev)
            snprintf(b, sizeof(b), "%d devices of %s", min_dev, sizestr(a, sizeof(a), (double)minmem));
        else
            snprintf(b, sizeof(b), "none up to %d devices of %s%s", 4 * s.L, sizestr(a, sizeof(a), (double)minmem),
                     pa->allow_recompute ? "" : " (recomputation may help: --recompute)");
        if (s.homogeneous_mem && s.min_uniform_budget) {
            char c[32];
            st = bg_error(BG_ERR_NO_FIT,
                          "no layout of %d devices of %s fits; %s. Smallest budget that fits: %llu bytes (%s) per "
                          "device; smallest device count that fits: %s",
                          pa->world, sizestr(a, sizeof(a), (double)s.mem[0]), s.short_msg,
                          (unsigned long long)s.min_uniform_budget,
                          sizestr(c, sizeof(c), (double)s.min_uniform_budget), b);
        } else {
            char c[32];
            st = bg_error(BG_ERR_NO_FIT,
                          "no layout of these %d devices fits; %s. Every device needs %s more (%llu bytes); smallest "
                          "device count that fits: %s",
                          pa->world, s.short_msg, sizestr(c, sizeof(c), (double)s.short_extra),
                          (unsigned long long)s.short_extra, b);
        }
        goto out;
    }
    /* the kept plans carry the model (the search's own candidates did not
     * need it); its JSON is the same under any tensor-parallel degree */
    BG_CHECK_GOTO(bg_model_desc_to_json(pa->model, &model_json), st, out);
    for (int i = 0; i < s.nplans; i++)
        if (!(s.plans[i]->model_json = strdup(model_json))) {
            st = bg_error(BG_ERR_NOMEM, "plan model");
            goto out;
        }
    bg_plan_set_t *set = calloc(1, sizeof(*set));
    if (!set) {
        st = bg_error(BG_ERR_NOMEM, "plan set");
        goto out;
    }
    set->plans = s.plans;
    set->count = s.nplans;
    set->evaluated = s.evaluated;
    snprintf(set->note, sizeof set->note, "%s", note);
    s.plans = NULL;
    s.nplans = 0;
    *set_p = set;
out:
    for (int i = 0; i < s.nplans; i++)
        bg_plan_free(s.plans[i]);
    free(s.plans);
    free(s.mem);
    free(s.speed);
    free(model_json);
    return st;
}

/* ------------------------------------------------------------------------ */
/* JSON                                                                     */

static json_t *plan_json(const bg_plan_t *p)
{
    json_t *root = json_object(), *layers = json_array(), *stages = json_array(), *ranks = json_array(),
           *split = json_array(), *model = p->model_json ? json_loads(p->model_json, 0, NULL) : NULL;
    if (!root || !layers || !stages || !ranks || !split || !model) {
        json_decref(root), json_decref(layers), json_decref(stages), json_decref(ranks), json_decref(split);
        json_decref(model);
        return NULL;
    }
    json_object_set_new(root, "format", json_string(PLAN_FORMAT));
    json_object_set_new(root, "version", json_integer(PLAN_VERSION));
    json_object_set_new(root, "world", json_integer(p->world));
    json_object_set_new(root, "pp", json_integer(p->pp));
    json_object_set_new(root, "dp", json_integer(p->dp));
    json_object_set_new(root, "tp", json_integer(p->tp));
    json_object_set_new(root, "microbatches", json_integer(p->microbatches));
    json_object_set_new(root, "microbatch_size", json_integer(p->microbatch_size));
    json_object_set_new(root, "batch", json_integer(p->batch));
    json_object_set_new(root, "seq", json_integer(p->seq));
    json_object_set_new(root, "schedule", json_string(p->schedule));
    json_object_set_new(root, "chunks", json_integer(p->chunks));
    json_object_set_new(root, "optimizer", json_string(p->optim == BG_OPTIM_SGD ? "sgd" : "adamw"));
    if (p->zero)
        json_object_set_new(root, "zero", json_integer(p->zero));
    if (p->sp)
        json_object_set_new(root, "sequence_parallel", json_true());
    if (p->precision != BG_F32)
        json_object_set_new(root, "precision", json_string(bg_dtype_name(p->precision)));
    if (p->paired)
        json_object_set_new(root, "tp_overlap", json_string("microbatch"));
    json_object_set_new(root, "recompute", json_boolean(bg_plan_recompute(p)));
    json_object_set_new(root, "predicted_step_ms", json_real(p->step_ms));
    json_object_set_new(root, "predicted_bubble", json_real(p->bubble));
    json_object_set_new(root, "predicted_tokens_per_s", json_real(p->tokens_per_s));
    json_object_set_new(root, "devices", json_pack("{s:f, s:f, s:f}", "flops", p->flops, "link_latency_s",
                                                   p->link_latency, "link_bandwidth", p->link_bandwidth));
    json_object_set_new(root, "layer_times", json_string(times_names[p->times]));
    json_object_set_new(root, "model", model);
    for (int i = 0; i < p->nstages; i++)
        json_array_append_new(split, json_integer(p->stages[i].last_layer - p->stages[i].first_layer + 1));
    json_object_set_new(root, "split", split);
    for (int i = 0; i < p->nlayers; i++) {
        const bg_layer_profile_t *l = &p->layers[i];
        const double *cm = &p->cost_ms[NCOST * i];
        json_array_append_new(layers, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "name",
                                                l->name, "params", (json_int_t)l->params, "stash_bytes",
                                                (json_int_t)l->stash_bytes, "wstash_bytes",
                                                (json_int_t)l->wstash_bytes, "scratch_bytes",
                                                (json_int_t)l->scratch_bytes, "output_bytes",
                                                (json_int_t)l->output_bytes, "fwd_flops", l->fwd_flops, "bwd_flops",
                                                l->bwd_flops, "fwd_ms", cm[0], "bwd_ms", cm[1], "tp_ms", cm[2],
                                                "opt_ms", cm[3]));
        if (l->grad_bytes && l->grad_bytes != l->output_bytes) /* bf16 outputs; absent: the same */
            json_object_set_new(json_array_get(layers, json_array_size(layers) - 1), "grad_bytes",
                                json_integer((json_int_t)l->grad_bytes));
    }
    json_object_set_new(root, "layers", layers);
    for (int i = 0; i < p->nstages; i++) {
        const bg_plan_stage_t *s = &p->stages[i];
        json_array_append_new(
            stages, json_pack("{s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:b, s:f}", "stage", i, "rank", s->rank,
                              "chunk", s->chunk, "first_layer", s->first_layer, "last_layer", s->last_layer,
                              "params", (json_int_t)s->params, "budget_bytes", (json_int_t)s->budget_bytes,
                              "predicted_peak_bytes", (json_int_t)s->predicted_peak_bytes, "recompute",
                              s->recompute, "predicted_ms_per_microbatch", s->predicted_ms_per_microbatch));
    }
    json_object_set_new(root, "stages", stages);
    for (int r = 0; r < p->pp; r++)
        json_array_append_new(ranks, json_pack("{s:i, s:I, s:I}", "rank", r, "budget_bytes",
                                               (json_int_t)p->rank_budget[r], "predicted_peak_bytes",
                                               (json_int_t)p->rank_peak[r]));
    json_object_set_new(root, "ranks", ranks);
    return root;
}

bg_status_t bg_plan_to_json(const bg_plan_t *p, char **json_p)
{
    json_t *root = plan_json(p);
    if (!root)
        return bg_error(BG_ERR_NOMEM, "plan JSON");
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (!s)
        return bg_error(BG_ERR_NOMEM, "plan JSON text");
    *json_p = s;
    return BG_OK;
}

bg_status_t bg_plan_save(const bg_plan_t *p, const char *path)
{
    char *s;
    BG_CHECK(bg_plan_to_json(p, &s));
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        free(s);
        return bg_error(BG_ERR_IO, "cannot write plan %s", tmp);
    }
    int ok = fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(s);
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        return bg_error(BG_ERR_IO, "cannot write plan %s", path);
    }
    return BG_OK;
}

/* Field readers: BG_ERR_PARSE naming the JSON path. */
static bg_status_t get_int(json_t *o, const char *where, const char *key, long long lo, long long hi, long long *v)
{
    json_t *x = json_object_get(o, key);
    if (!x)
        return bg_error(BG_ERR_PARSE, "plan: %s.%s is missing", where, key);
    if (!json_is_integer(x))
        return bg_error(BG_ERR_PARSE, "plan: %s.%s must be an integer", where, key);
    long long y = json_integer_value(x);
    if (y < lo || y > hi)
        return bg_error(BG_ERR_PARSE, "plan: %s.%s is %lld, expected %lld..%lld", where, key, y, lo, hi);
    *v = y;
    return BG_OK;
}
static bg_status_t get_num(json_t *o, const char *where, const char *key, double *v)
{
    json_t *x = json_object_get(o, key);
    if (!x)
        return bg_error(BG_ERR_PARSE, "plan: %s.%s is missing", where, key);
    if (!json_is_number(x))
        return bg_error(BG_ERR_PARSE, "plan: %s.%s must be a number", where, key);
    *v = json_number_value(x);
    return BG_OK;
}
static bg_status_t get_str(json_t *o, const char *where, const char *key, const char **v)
{
    json_t *x = json_object_get(o, key);
    if (!x || !json_is_string(x))
        return bg_error(BG_ERR_PARSE, "plan: %s.%s must be a string", where, key);
    *v = json_string_value(x);
    return BG_OK;
}
static bg_status_t get_bool(json_t *o, const char *where, const char *key, int *v)
{
    json_t *x = json_object_get(o, key);
    if (!x || !json_is_boolean(x))
        return bg_error(BG_ERR_PARSE, "plan: %s.%s must be true or false", where, key);
    *v = json_is_true(x);
    return BG_OK;
}

/* $.model: the model's description (models/desc.c owns its format), kept as
 * text. A builder-made model is rebuilt from it, which checks it whole, into
 * *desc_p; a model of the host's own layers cannot be rebuilt from a file
 * (*desc_p = NULL): bg_plan_check_model() checks it against the host's
 * description. */
static bg_status_t parse_model(json_t *root, char **json_p, bg_model_desc_t **desc_p)
{
    json_t *jm = json_object_get(root, "model");
    if (!json_is_object(jm))
        return bg_error(BG_ERR_PARSE, "plan: $.model must be an object (the model's description)");
    char *text = json_dumps(jm, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text)
        return bg_error(BG_ERR_NOMEM, "plan model");
    bg_model_desc_t *d = NULL;
    bg_status_t st = bg_model_desc_from_json(text, &d);
    if (st != BG_OK && st != BG_ERR_UNSUPPORTED) {
        st = bg_error(BG_ERR_PARSE, "plan: $.model: %s", bg_last_error());
        free(text);
        return st;
    }
    *json_p = text;
    *desc_p = st == BG_OK ? d : NULL;
    return BG_OK;
}

#define BIG 0x7fffffffffffffffLL
/* A loaded plan's stages must be one layout: $.split (absent in hand-written
 * plans) gives the layer counts the stages hold, and no two stages sit on
 * the same (rank, chunk), and every rank holds one (a plan naming a rank
 * twice would leave another rank idle and overwrite a stage). */
static bg_status_t stages_agree(const bg_plan_t *p, json_t *split)
{
    if (split && (!json_is_array(split) || (int)json_array_size(split) != p->nstages))
        return bg_error(BG_ERR_PARSE, "plan: $.split must be an array of the %d stages' layer counts", p->nstages);
    for (int i = 0; split && i < p->nstages; i++) {
        json_t *e = json_array_get(split, (size_t)i);
        int have = p->stages[i].last_layer - p->stages[i].first_layer + 1;
        if (!json_is_integer(e) || json_integer_value(e) != have)
            return bg_error(BG_ERR_PARSE, "plan: $.split[%d] is %s%lld but $.stages[%d] holds layers %d..%d (%d layers)",
                            i, json_is_integer(e) ? "" : "not an integer: ", json_is_integer(e) ? (long long)json_integer_value(e) : 0LL,
                            i, p->stages[i].first_layer, p->stages[i].last_layer, have);
    }
    /* who[rank * chunks + chunk]: the stage there + 1 (0: none) */
    int *who = calloc((size_t)p->pp * (size_t)p->chunks, sizeof(*who));
    if (!who)
        return bg_error(BG_ERR_NOMEM, "plan: stage map of %d x %d", p->pp, p->chunks);
    bg_status_t st = BG_OK;
    for (int i = 0; i < p->nstages && st == BG_OK; i++) {
        int *w = &who[(size_t)p->stages[i].rank * (size_t)p->chunks + (size_t)p->stages[i].chunk];
        if (*w)
            st = bg_error(BG_ERR_PARSE, "plan: $.stages[%d] and $.stages[%d] are both rank %d's chunk %d", *w - 1, i,
                          p->stages[i].rank, p->stages[i].chunk);
        *w = i + 1;
    }
    for (int r = 0; r < p->pp && st == BG_OK; r++) {
        int held = 0;
        for (int c = 0; c < p->chunks && !held; c++)
            held = who[(size_t)r * (size_t)p->chunks + (size_t)c] != 0;
        if (!held)
            st = bg_error(BG_ERR_PARSE, "plan: no stage in $.stages is on rank %d of the %d pipeline ranks", r, p->pp);
    }
    free(who);
    return st;
}

static bg_status_t parse_plan(json_t *root, bg_plan_t **plan_p)
{
    if (!json_is_object(root))
        return bg_error(BG_ERR_PARSE, "plan: the top level must be an object");
    const char *fmt = NULL;
    BG_CHECK(get_str(root, "$", "format", &fmt));
    if (strcmp(fmt, PLAN_FORMAT))
        return bg_error(BG_ERR_PARSE, "plan: $.format is \"%s\", expected \"%s\"", fmt, PLAN_FORMAT);
    long long version = 0, world = 0, pp = 0, dp = 0, tp = 0, mbs = 0, mbsize = 0, batch = 0, seq = 0, chunks = 0;
    BG_CHECK(get_int(root, "$", "version", 1, PLAN_VERSION, &version));
    if (version < PLAN_VERSION)
        return bg_error(BG_ERR_PARSE, "plan: $.version is %lld, a plan from before model descriptions (its $.model "
                                      "is a configuration); this brigade reads version %d: run brigade plan again",
                        version, PLAN_VERSION);
    BG_CHECK(get_int(root, "$", "world", 1, 1 << 20, &world));
    BG_CHECK(get_int(root, "$", "pp", 1, 1 << 20, &pp));
    BG_CHECK(get_int(root, "$", "dp", 1, 1 << 20, &dp));
    BG_CHECK(get_int(root, "$", "tp", 1, 4096, &tp));
    if (pp * dp * tp != world)
        return bg_error(BG_ERR_PARSE, "plan: pp %lld x dp %lld x tp %lld is not world %lld", pp, dp, tp, world);
    BG_CHECK(get_int(root, "$", "microbatches", 1, 1 << 20, &mbs));
    BG_CHECK(get_int(root, "$", "microbatch_size", 1, 1 << 30, &mbsize));
    BG_CHECK(get_int(root, "$", "batch", 1, 1 << 30, &batch));
    if (batch != dp * mbs * mbsize)
        return bg_error(BG_ERR_PARSE, "plan: batch %lld is not dp %lld x microbatches %lld x microbatch_size %lld",
                        batch, dp, mbs, mbsize);
    BG_CHECK(get_int(root, "$", "seq", 1, 1 << 30, &seq));
    BG_CHECK(get_int(root, "$", "chunks", 1, 1 << 10, &chunks));
    const char *sched = NULL, *opt = NULL;
    BG_CHECK(get_str(root, "$", "schedule", &sched));
    bg_schedule_kind_t kind;
    if (bg_schedule_kind_parse(sched, &kind) != BG_OK || kind == BG_SCHED_CUSTOM)
        return bg_error(BG_ERR_PARSE, "plan: $.schedule \"%s\" is not a schedule the executor runs", sched);
    BG_CHECK(get_str(root, "$", "optimizer", &opt));
    if (strcmp(opt, "adamw") && strcmp(opt, "sgd"))
        return bg_error(BG_ERR_PARSE, "plan: $.optimizer \"%s\" (expected adamw or sgd)", opt);
    long long zero = 0;
    if (json_object_get(root, "zero"))
        BG_CHECK(get_int(root, "$", "zero", 0, 2, &zero));
    json_t *jsp = json_object_get(root, "sequence_parallel");
    if (jsp && !json_is_boolean(jsp))
        return bg_error(BG_ERR_PARSE, "plan: $.sequence_parallel must be true or false");
    json_t *jpr = json_object_get(root, "precision");
    if (jpr && (!json_is_string(jpr) || (strcmp(json_string_value(jpr), "fp32") && strcmp(json_string_value(jpr), "bf16"))))
        return bg_error(BG_ERR_PARSE, "plan: $.precision must be \"fp32\" or \"bf16\" (or absent: fp32)");
    json_t *jov = json_object_get(root, "tp_overlap");
    if (jov && (!json_is_string(jov) || strcmp(json_string_value(jov), "microbatch")))
        return bg_error(BG_ERR_PARSE, "plan: $.tp_overlap must be \"microbatch\" (or absent)");
    double step_ms = 0, bubble = 0, tps = 0;
    BG_CHECK(get_num(root, "$", "predicted_step_ms", &step_ms));
    if (json_object_get(root, "predicted_bubble"))
        BG_CHECK(get_num(root, "$", "predicted_bubble", &bubble));
    if (json_object_get(root, "predicted_tokens_per_s"))
        BG_CHECK(get_num(root, "$", "predicted_tokens_per_s", &tps));

    char *model_json = NULL;
    bg_model_desc_t *md = NULL; /* NULL: a model of the host's own layers */
    BG_CHECK(parse_model(root, &model_json, &md));
    long long v = 0;
    bg_plan_t *p = NULL;
    bg_status_t st = BG_OK;
    json_t *jl = json_object_get(root, "layers"), *js = json_object_get(root, "stages"),
           *jr = json_object_get(root, "ranks");
    int L = md ? bg_model_desc_num_layers(md) : json_is_array(jl) ? (int)json_array_size(jl) : 0;
    if (!json_is_array(jl) || L < 1 || (int)json_array_size(jl) != L) {
        st = md ? bg_error(BG_ERR_PARSE, "plan: $.layers must be an array of %d layers (the model's)", L)
                : bg_error(BG_ERR_PARSE, "plan: $.layers must be a non-empty array (the model's layers)");
        goto err;
    }
    /* dualpipe: its two copies hold the same model stages, listed once */
    long long nst = kind == BG_SCHED_DUALPIPE ? pp * chunks / 2 : pp * chunks;
    if (!json_is_array(js) || (long long)json_array_size(js) != nst) {
        st = kind == BG_SCHED_DUALPIPE
                 ? bg_error(BG_ERR_PARSE, "plan: $.stages must be an array of the pp x chunks / 2 copies = %lld model "
                            "stages of dualpipe", nst)
                 : bg_error(BG_ERR_PARSE, "plan: $.stages must be an array of pp x chunks = %lld stages", nst);
        goto err;
    }
    if (nst > L) {
        st = bg_error(BG_ERR_PARSE, "plan: %lld stages for %d layers", nst, L);
        goto err;
    }
    if (!(p = plan_alloc(L, (int)nst, (int)pp))) {
        st = bg_error(BG_ERR_NOMEM, "plan");
        goto err;
    }
    p->model_json = model_json;
    model_json = NULL;
    p->world = (int)world, p->pp = (int)pp, p->dp = (int)dp, p->tp = (int)tp;
    p->microbatches = (int)mbs, p->microbatch_size = (int)mbsize, p->batch = (int)batch, p->seq = (int)seq;
    p->chunks = (int)chunks;
    snprintf(p->schedule, sizeof(p->schedule), "%s", bg_schedule_kind_name(kind));
    p->optim = strcmp(opt, "sgd") ? BG_OPTIM_ADAMW : BG_OPTIM_SGD;
    p->zero = (int)zero;
    p->sp = tp > 1 && json_is_true(jsp);
    p->precision = jpr && !strcmp(json_string_value(jpr), "bf16") ? BG_BF16 : BG_F32;
    p->paired = tp > 1 && jov;
    p->step_ms = step_ms, p->bubble = bubble, p->tokens_per_s = tps;
    json_t *jt = json_object_get(root, "layer_times");
    if (jt) {
        int k = 0;
        while (times_names[k] && !(json_is_string(jt) && !strcmp(json_string_value(jt), times_names[k])))
            k++;
        if (!times_names[k]) {
            st = bg_error(BG_ERR_PARSE, "plan: $.layer_times must be \"flops\", \"measured\" or \"measured_tp\"");
            goto err;
        }
        p->times = k;
    }
    json_t *jd = json_object_get(root, "devices");
    if (json_is_object(jd)) {
        if (json_object_get(jd, "flops"))
            BG_CHECK_GOTO(get_num(jd, "$.devices", "flops", &p->flops), st, err);
        if (json_object_get(jd, "link_latency_s"))
            BG_CHECK_GOTO(get_num(jd, "$.devices", "link_latency_s", &p->link_latency), st, err);
        if (json_object_get(jd, "link_bandwidth"))
            BG_CHECK_GOTO(get_num(jd, "$.devices", "link_bandwidth", &p->link_bandwidth), st, err);
    }
    for (int i = 0; i < L; i++) {
        json_t *e = json_array_get(jl, (size_t)i);
        char where[64];
        snprintf(where, sizeof(where), "$.layers[%d]", i);
        if (!json_is_object(e)) {
            st = bg_error(BG_ERR_PARSE, "plan: %s must be an object", where);
            goto err;
        }
        bg_layer_profile_t *l = &p->layers[i];
        const char *name = NULL;
        BG_CHECK_GOTO(get_str(e, where, "name", &name), st, err);
        snprintf(l->name, sizeof(l->name), "%s", name);
        BG_CHECK_GOTO(get_int(e, where, "params", 0, BIG, &v), st, err);
        l->params = (size_t)v;
        BG_CHECK_GOTO(get_int(e, where, "stash_bytes", 0, BIG, &v), st, err);
        l->stash_bytes = (size_t)v;
        BG_CHECK_GOTO(get_int(e, where, "output_bytes", 0, BIG, &v), st, err);
        l->output_bytes = (size_t)v;
        l->grad_bytes = l->output_bytes;
        if (json_object_get(e, "grad_bytes")) {
            BG_CHECK_GOTO(get_int(e, where, "grad_bytes", 0, BIG, &v), st, err);
            l->grad_bytes = (size_t)v;
        }
        if (json_object_get(e, "wstash_bytes")) {
            BG_CHECK_GOTO(get_int(e, where, "wstash_bytes", 0, BIG, &v), st, err);
            l->wstash_bytes = (size_t)v;
        }
        if (json_object_get(e, "scratch_bytes")) {
            BG_CHECK_GOTO(get_int(e, where, "scratch_bytes", 0, BIG, &v), st, err);
            l->scratch_bytes = (size_t)v;
        }
        BG_CHECK_GOTO(get_num(e, where, "fwd_flops", &l->fwd_flops), st, err);
        BG_CHECK_GOTO(get_num(e, where, "bwd_flops", &l->bwd_flops), st, err);
        static const char *const cost_keys[NCOST] = {"fwd_ms", "bwd_ms", "tp_ms", "opt_ms"}; /* optional */
        for (int k = 0; k < NCOST; k++)
            if (json_object_get(e, cost_keys[k])) {
                BG_CHECK_GOTO(get_num(e, where, cost_keys[k], &p->cost_ms[NCOST * i + k]), st, err);
                if (!(p->cost_ms[NCOST * i + k] >= 0)) {
                    st = bg_error(BG_ERR_PARSE, "plan: %s.%s is %g (a time must be >= 0)", where, cost_keys[k],
                                  p->cost_ms[NCOST * i + k]);
                    goto err;
                }
            }
    }
    int next = 0;
    for (int i = 0; i < p->nstages; i++) {
        json_t *e = json_array_get(js, (size_t)i);
        char where[64];
        snprintf(where, sizeof(where), "$.stages[%d]", i);
        if (!json_is_object(e)) {
            st = bg_error(BG_ERR_PARSE, "plan: %s must be an object", where);
            goto err;
        }
        bg_plan_stage_t *s = &p->stages[i];
        long long a = 0, b = 0;
        BG_CHECK_GOTO(get_int(e, where, "first_layer", 0, L - 1, &a), st, err);
        BG_CHECK_GOTO(get_int(e, where, "last_layer", a, L - 1, &b), st, err);
        if (a != next) {
            st = bg_error(BG_ERR_PARSE, "plan: %s.first_layer is %lld but the previous stage ended at layer %d", where,
                          a, next - 1);
            goto err;
        }
        next = (int)b + 1;
        s->first_layer = (int)a;
        s->last_layer = (int)b;
        BG_CHECK_GOTO(get_int(e, where, "budget_bytes", 0, BIG, &v), st, err);
        s->budget_bytes = (uint64_t)v;
        BG_CHECK_GOTO(get_int(e, where, "predicted_peak_bytes", 0, BIG, &v), st, err);
        s->predicted_peak_bytes = (uint64_t)v;
        BG_CHECK_GOTO(get_bool(e, where, "recompute", &s->recompute), st, err);
        BG_CHECK_GOTO(get_num(e, where, "predicted_ms_per_microbatch", &s->predicted_ms_per_microbatch), st, err);
        if (json_object_get(e, "rank")) {
            BG_CHECK_GOTO(get_int(e, where, "rank", 0, pp - 1, &v), st, err);
            s->rank = (int)v;
        } else {
            s->rank = i % (int)pp;
        }
        if (json_object_get(e, "chunk")) {
            BG_CHECK_GOTO(get_int(e, where, "chunk", 0, chunks - 1, &v), st, err);
            s->chunk = (int)v;
        } else {
            s->chunk = i / (int)pp;
        }
        size_t np = 0;
        for (int k = s->first_layer; k <= s->last_layer; k++)
            np += p->layers[k].params;
        s->params = np;
    }
    if (next != L) {
        st = bg_error(BG_ERR_PARSE, "plan: the stages end at layer %d but the model has %d layers", next - 1, L);
        goto err;
    }
    BG_CHECK_GOTO(stages_agree(p, json_object_get(root, "split")), st, err);
    if (md) { /* a builder-made model: its layers must be the plan's (at the precision the plan counted) */
        char diff[256];
        if (p->precision == BG_BF16 && bg_model_desc_params(md)->input != BG_INPUT_TOKENS) {
            st = bg_error(BG_ERR_PARSE, "plan: $.precision bf16 needs a GPT (the model in $.model has no blocks)");
            goto err;
        }
        BG_CHECK_GOTO(bg_model_desc_set_precision(md, p->precision), st, err);
        BG_CHECK_GOTO(layers_diff(p, md, diff, sizeof(diff)), st, err);
        if (diff[0]) {
            st = bg_error(BG_ERR_PARSE, "plan: $.layers and $.seq are not those of the model in $.model: %s", diff);
            goto err;
        }
    }
    for (int r = 0; r < p->pp; r++) {
        p->rank_peak[r] = 0;
        p->rank_budget[r] = 0;
        for (int i = 0; i < p->nstages; i++)
            if (p->stages[i].rank == r) {
                p->rank_peak[r] += p->stages[i].predicted_peak_bytes;
                p->rank_budget[r] += p->stages[i].budget_bytes;
            }
    }
    if (json_is_array(jr)) {
        if ((long long)json_array_size(jr) != pp) {
            st = bg_error(BG_ERR_PARSE, "plan: $.ranks must have pp = %lld entries", pp);
            goto err;
        }
        for (int r = 0; r < p->pp; r++) {
            json_t *e = json_array_get(jr, (size_t)r);
            char where[64];
            snprintf(where, sizeof(where), "$.ranks[%d]", r);
            if (!json_is_object(e)) {
                st = bg_error(BG_ERR_PARSE, "plan: %s must be an object", where);
                goto err;
            }
            BG_CHECK_GOTO(get_int(e, where, "predicted_peak_bytes", 0, BIG, &v), st, err);
            p->rank_peak[r] = (uint64_t)v;
            BG_CHECK_GOTO(get_int(e, where, "budget_bytes", 0, BIG, &v), st, err);
            p->rank_budget[r] = (uint64_t)v;
        }
    }
    bg_model_desc_destroy(md);
    *plan_p = p;
    return BG_OK;
err:
    bg_plan_free(p);
    free(model_json);
    bg_model_desc_destroy(md);
    return st;
}

bg_status_t bg_plan_from_json(const char *text, bg_plan_t **plan_p)
{
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    if (!root)
        return bg_error(BG_ERR_PARSE, "plan: line %d column %d: %s", err.line, err.column, err.text);
    bg_status_t st = parse_plan(root, plan_p);
    json_decref(root);
    return st;
}

bg_status_t bg_plan_load(const char *path, bg_plan_t **plan_p)
{
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return bg_error(BG_ERR_PARSE, "plan %s: line %d column %d: %s", path, err.line, err.column, err.text);
    bg_status_t st = parse_plan(root, plan_p);
    json_decref(root);
    if (st != BG_OK)
        return bg_error(st, "%s: %s", path, bg_last_error());
    return BG_OK;
}
