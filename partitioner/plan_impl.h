/* partitioner/plan_impl.h: what the planner's files share and nothing else
 * sees: the plan record (struct bg_plan) and the plan set, the search state
 * (search_t) one bg_plan_search() call threads through the layouts it
 * evaluates, and the few functions one file defines for another. Not a public
 * header: the API is include/brigade/partitioner.h; nothing outside
 * partitioner/ includes this.
 *
 * The files: plan.c (the plan object, its accessors and the model check),
 * plan_layout.c (one layout: its schedule, devices, partition, simulation and
 * memory per rank), plan_bound.c (lower bounds of a layout's step time, to
 * skip layouts that cannot be among the best), plan_search.c (the layouts enumerated, tensor-parallel
 * degrees, the no-fit diagnosis) and plan_json.c (the plan's JSON, written,
 * read and validated). */
#ifndef BG_PARTITIONER_PLAN_IMPL_H
#define BG_PARTITIONER_PLAN_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/partitioner.h"
#include "brigade/schedule.h"


#define PLAN_FORMAT "brigade-plan"
#define PLAN_VERSION 2 /* 2: "model" is the model's description (1: a GPT/MLP configuration) */

enum { NCOST = 4 }; /* per layer: forward, backward, collectives, optimizer (plan JSON fwd_ms .. opt_ms) */

struct bg_plan {
    char *model_json; /* bg_model_desc_to_json text of the model */
    int seq, world, pp, dp, tp, microbatches, microbatch_size, batch, chunks;
    int cp; /* context-parallel degree: each sequence split over cp ranks (seq is the whole length) */
    char schedule[32];
    int optim;
    int zero; /* sharding stage counted (docs/data_parallel.md) */
    int offload; /* 1: the optimizer state counted outside the device (docs/offload.md) */
    int sp;   /* sequence parallelism: the tp build's layers are split along the sequence */
    int paired; /* BRIGADE_TP_OVERLAP=microbatch counted (bg_part_problem_t.paired) */
    bg_dtype_t precision; /* the activations' storage the layer sizes count (bg_model_desc_precision) */
    double step_ms, bubble, tokens_per_s;
    double flops, link_latency, link_bandwidth;
    double host_bandwidth; /* bg_plan_params_t.host_bandwidth (0: infinite) */
    double offload_ms;     /* of step_ms, the offload transfers on the rank they cost most (bg_plan_offload_ms) */
    int offact;            /* 1: activation offload (bg_plan_offload_activations) */
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

struct bg_plan_set {
    int count, evaluated;
    bg_plan_t **plans;
    char note[1400]; /* what the search had to do to fit (tensor parallelism), or empty */
};

/* The state of one bg_plan_search() call: the devices, the pass's
 * tensor-parallel degree and model build, the best no-fit seen and the plans
 * kept (the best pp->top, sorted). */
typedef struct search {
    const bg_plan_params_t *pp;
    const bg_model_desc_t *desc; /* pp->model, or its build for tensor-parallel degree tp */
    int tp;                      /* tensor-parallel degree of this pass: pp x dp groups of cp x tp devices */
    int cp;                      /* context-parallel degree of this pass (desc bound to a group of cp) */
    const bg_plan_layer_times_t *times; /* the times measured at degree tp (pp->tp_times), or NULL */
    int world, L, seq; /* seq: the positions a rank holds (the sequence / cp) */
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

/* plan.c: a plan with room for nlayers layers, nstages stages and pp ranks
 * (zeroed), or NULL when out of memory. */
bg_plan_t *bg__plan_alloc(int nlayers, int nstages, int pp);

/* plan.c: b bytes as "1.50 GiB" (B, KiB, MiB, GiB) in buf; returns buf. */
const char *bg__plan_sizestr(char *buf, size_t n, double b);

/* plan.c: the plan's layers against a description's; diff[0] = 0 when they
 * agree, else it names the first difference (see there). */
bg_status_t bg__plan_layers_diff(const bg_plan_t *p, const bg_model_desc_t *d, char *diff, size_t cap);

/* plan_search.c: the model built for tensor-parallel degree tp (see there). */
bg_status_t bg__plan_model_for_tp(const bg_model_desc_t *d, int tp, int sp, const bg_model_desc_t **d_p,
                                  bg_model_desc_t **own_p);
/* plan_search.c: bg__plan_model_for_tp's build, bound when ring->size > 1 to a context group of that
 * many members, as each member's layers are (their ring's scratch and steps counted; a build of its own,
 * rebuilt from the builder, which holds *ring: the caller keeps it until *own_p is destroyed). The ring
 * runs no step. *d_p = NULL when there is none (no builder, sizes tp does not divide). */
bg_status_t bg__plan_model_for(const bg_model_desc_t *d, int tp, int sp, bg_cp_comm_t *ring,
                               const bg_model_desc_t **d_p, bg_model_desc_t **own_p);

/* plan_layout.c: evaluate the layout pp x dp (m microbatches of n sequences,
 * schedule kind) at the sharding stage and offload asked for (s->pp->zero,
 * s->pp->offload; auto: the fastest that fits); a fitting one joins s->plans, a non-fitting one may
 * become s's best shortfall. *fits_p (optional) says whether it fit. */
bg_status_t bg__plan_evaluate(search_t *s, const bg_layer_profile_t *prof, int pp, int dp, int m, int n,
                              bg_schedule_kind_t kind, int *fits_p);

/* plan_bound.c: the relative margin a bound must exceed a limit by before a
 * layout is skipped (its sums are not in the simulator's order). */
#define BG__PLAN_BOUND_MARGIN 1e-9

/* plan_bound.c: a lower bound (ms) of the simulated step of the program
 * sched (one model copy; 0 for two) with per-stage costs fc, bc, wc (ms, as
 * given to the simulator; full_backward: its backwards are whole, costing
 * bc + wc, else split), m microbatches, a message's delay hop_act / hop_grad
 * between two ranks, and end_cost the reduce and optimizer instructions of
 * a rank (chunks x their costs). */
double bg__plan_step_bound(const bg_schedule_t *sched, int m, const double *fc, const double *bc, const double *wc,
                           int full_backward, double hop_act, double hop_grad, double end_cost);

/* plan_bound.c: 1 when every split of L layers (per layer f, b, w: ms at
 * speed 1) over pp stages, stage r alone on rank r, with every stage's
 * speed at most speed and every message at least hop ms, has a step above
 * limit (ms), by bg__plan_step_bound's terms (reduce and optimizer left
 * out); 0 when some split might not. Costs nothing like the layout's
 * schedule: O(L). */
int bg__plan_bound_exceeds(int L, const double *f, const double *b, const double *w, int full_backward, int pp,
                           int m, double speed, double hop, double limit);

/* brigade train's --offload value of each [offload][offact] (bg_plan_offload_name; "" for none) */
extern const char *const bg__plan_offload_names[3][2];

#endif
