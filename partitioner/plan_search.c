/* partitioner/plan_search.c: the layout search (pipeline x data parallel x
 * microbatches x schedule, at one or every tensor-parallel degree, with or
 * without sequence parallelism), its parameters checked, and when nothing
 * fits the diagnosis: the closest layout, the smallest budget and device
 * count that fit. Each layout is evaluated by plan_layout.c; it must not
 * partition, simulate or build plan records itself, nor touch JSON
 * (plan_json.c); no printing: the CLI prints.
 *
 * The model is a description (model.h): the search reads only its input
 * (kind, positions, features) and the sizes and FLOPs its layers report
 * (bg_model_profile), so any list of layers plans the same way. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/util.h"
#include "plan_impl.h"

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
    if (p->zero != BG_PLAN_ZERO_AUTO && (p->zero < 0 || p->zero > 3))
        return bg_error(BG_ERR_INVALID, "zero = %d: the sharding stage must be 0, 1, 2, 3 or auto", p->zero);
    if (p->offload != BG_PLAN_OFFLOAD_AUTO && (p->offload < 0 || p->offload > 2))
        return bg_error(BG_ERR_INVALID, "offload = %d: must be 0, 1, 2 or auto", p->offload);
    int offact = p->size >= offsetof(bg_plan_params_t, offload_activations) + sizeof(int) ? p->offload_activations : 0;
    if (offact != BG_PLAN_OFFLOAD_AUTO && offact != 0 && offact != 1)
        return bg_error(BG_ERR_INVALID, "offload_activations = %d: must be 0, 1 or auto", offact);
    if (p->offload == 2 && p->zero != 3 && p->zero != BG_PLAN_ZERO_AUTO)
        return bg_error(BG_ERR_INVALID, "offload params needs zero 3 (or auto): the parameter shard is zero 3's "
                                        "(got zero %d)", p->zero);
    if (p->microbatch_size < 0 || p->pp < 0 || p->chunks < 0)
        return bg_error(BG_ERR_INVALID, "microbatch size, pp and chunks must be >= 0");
    if (!(p->flops > 0) || !isfinite(p->flops))
        return bg_error(BG_ERR_INVALID, "flops must be > 0 (got %g)", p->flops);
    if (!(p->link_latency >= 0) || !(p->link_bandwidth >= 0) || !isfinite(p->link_latency) ||
        !isfinite(p->link_bandwidth))
        return bg_error(BG_ERR_INVALID, "link latency and bandwidth must be finite and >= 0");
    if (!(p->host_bandwidth >= 0) || !isfinite(p->host_bandwidth))
        return bg_error(BG_ERR_INVALID, "host bandwidth must be finite and >= 0 (got %g; 0 = infinite)",
                        p->host_bandwidth);
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
        int dp = world / pp, ep = bg_model_desc_ep_degree(pa->model);
        if (pa->batch % dp || (ep > 1 && dp % ep)) /* an expert-parallel group is ep of a stage's replicas */
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
                BG_CHECK_GOTO(bg__plan_evaluate(s, prof, pp, dp, m, n, kinds[k], &fits), st, out);
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
bg_status_t bg__plan_model_for_tp(const bg_model_desc_t *d, int tp, int sp, const bg_model_desc_t **d_p,
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

/* The planner's context group: its layers are profiled, never run (a ring step is an error). */
static bg_status_t plan_ring_start(void *arg, int lane, const float *send, float *recv, size_t count, void **req_p)
{
    (void)arg, (void)lane, (void)send, (void)recv, (void)count, (void)req_p;
    return bg_error(BG_ERR_INTERNAL, "the planner's context group runs no ring step (its model is profiled only)");
}
static bg_status_t plan_ring_wait(void *arg, void *req)
{
    (void)arg, (void)req;
    return bg_error(BG_ERR_INTERNAL, "the planner's context group runs no ring step");
}

bg_status_t bg__plan_model_for(const bg_model_desc_t *d, int tp, int sp, bg_cp_comm_t *ring,
                               const bg_model_desc_t **d_p, bg_model_desc_t **own_p)
{
    BG_CHECK(bg__plan_model_for_tp(d, tp, sp, d_p, own_p));
    if (ring->size <= 1 || !*d_p)
        return BG_OK;
    bg_model_config_t c;
    if (!*own_p) { /* the caller's description stays unbound: a build of its own */
        if (bg_model_desc_builder(d, &c) != BG_OK) {
            *d_p = NULL;
            return BG_OK;
        }
        BG_CHECK(bg_model_build(&c, own_p));
    }
    /* member 0's layers: every member's profile is the same */
    *ring = (bg_cp_comm_t){.size = ring->size, .rank = 0, .ring_start = plan_ring_start, .wait = plan_ring_wait};
    bg_status_t st = bg_model_desc_set_precision(*own_p, bg_model_desc_precision(d));
    if (st == BG_OK)
        st = bg_model_desc_set_cp(*own_p, ring);
    if (st != BG_OK) {
        bg_model_desc_destroy(*own_p);
        *own_p = NULL;
        *d_p = NULL;
        return st;
    }
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
    bg_cp_comm_t ring = {.size = s->cp}; /* outlives own, which holds it */
    if (s->world % (tp * s->cp))
        return BG_OK;
    BG_CHECK(bg__plan_model_for(s->pp->model, tp, sp, &ring, &d, &own));
    if (!d)
        return BG_OK;
    s->tp = tp;
    s->desc = d;
    s->times = times_for(s->pp, tp, tp > 1 && bg_model_desc_sequence_parallel(d));
    bg_status_t st = search_world(s, kinds, nk, s->world / (tp * s->cp), 0, 0, found_p);
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

/* --cp auto when nothing fits at cp 1 (activations too big): the smallest
 * context-parallel degree dividing the devices and half the sequence that
 * fits at tensor-parallel degree tp, said in note; none: s back at cp 1. */
static bg_status_t search_cp_auto(search_t *s, const bg_schedule_kind_t *kinds, int nk, int tp, int seq_whole,
                                  char *note, size_t cap)
{
    int evaluated = s->evaluated, sp_only;
    char why[1024];
    snprintf(why, sizeof why, "%s", s->short_msg);
    for (int k = 2; k <= s->world && s->nplans == 0; k++) {
        if (s->world % k || seq_whole % (2 * k))
            continue;
        s->cp = k, s->seq = seq_whole / k;
        BG_CHECK(search_tp_fit(s, kinds, nk, tp, &sp_only));
    }
    if (s->nplans > 0)
        snprintf(note, cap, "nothing fits at cp = 1 (%s); cp = %d is the smallest context-parallel degree that fits",
                 why, s->plans[0]->cp);
    else
        s->cp = 1, s->seq = seq_whole, s->evaluated = evaluated;
    return BG_OK;
}

/* Nothing fits: the error that says so, with the closest layout (s's
 * shortfall), the smallest budget that fits and the smallest device count
 * (a search of larger worlds of devices like the smallest given). No
 * layout to evaluate at all is another error. s is read, not changed. */
static bg_status_t no_fit_error(const search_t *sp, const bg_schedule_kind_t *kinds, int nk)
{
    const bg_plan_params_t *pa = sp->pp;
    const search_t s = *sp;
    bg_status_t st = BG_OK;
    char a[32], b[160] = "";
    if (s.evaluated == 0) {
        st = bg_error(BG_ERR_INVALID,
                      "no layout to evaluate for %d devices, batch %d%s: pp must divide the devices, dp the "
                      "batch (and be a multiple of --ep), and the microbatch size the per-replica batch",
                      pa->world, pa->batch, pa->microbatch_size ? " and the given microbatch size" : "");
        return st;
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
            return st;
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
            return st;
    }
    /* would these devices do with the optimizer state offloaded (when it was counted on them)? */
    int off_fits = 0;
    if (pa->offload == 0) {
        search_t s3 = s;
        s3.plans = NULL;
        s3.nplans = s3.cap = 0;
        bg_plan_params_t p3 = *pa;
        p3.offload = 1;
        s3.pp = &p3;
        st = search_world(&s3, kinds, nk, pa->world, pa->pp, 1, &off_fits);
        for (int i = 0; i < s3.nplans; i++)
            bg_plan_free(s3.plans[i]);
        free(s3.plans);
        if (st != BG_OK)
            return st;
    }
    const char *off_note = off_fits ? "; with the optimizer state offloaded these devices fit (--offload auto)" : "";
    if (min_dev)
        snprintf(b, sizeof(b), "%d devices of %s", min_dev, bg__plan_sizestr(a, sizeof(a), (double)minmem));
    else
        snprintf(b, sizeof(b), "none up to %d devices of %s%s", 4 * s.L, bg__plan_sizestr(a, sizeof(a), (double)minmem),
                 pa->allow_recompute ? (pa->offload ? "" : " (offloading the optimizer state may help: --offload auto)")
                 : pa->offload ? " (recomputation may help: --recompute)"
                               : " (recomputation or offloading the optimizer state may help: --recompute, --offload auto)");
    if (s.homogeneous_mem && s.min_uniform_budget) {
        char c[32];
        st = bg_error(BG_ERR_NO_FIT,
                      "no layout of %d devices of %s fits; %s. Smallest budget that fits: %llu bytes (%s) per "
                      "device; smallest device count that fits: %s%s",
                      pa->world, bg__plan_sizestr(a, sizeof(a), (double)s.mem[0]), s.short_msg,
                      (unsigned long long)s.min_uniform_budget,
                      bg__plan_sizestr(c, sizeof(c), (double)s.min_uniform_budget), b, off_note);
    } else {
        char c[32];
        st = bg_error(BG_ERR_NO_FIT,
                      "no layout of these %d devices fits; %s. Every device needs %s more (%llu bytes); smallest "
                      "device count that fits: %s%s",
                      pa->world, s.short_msg, bg__plan_sizestr(c, sizeof(c), (double)s.short_extra),
                      (unsigned long long)s.short_extra, b, off_note);
    }
    return st;
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
    s.cp = 1;
    /* cp_req: 1 (or 0) only 1; N only N; auto: 1, then the smallest degree that fits */
    int cp_req = pa->size >= offsetof(bg_plan_params_t, cp) + sizeof(int) ? pa->cp : 1;
    int cp_auto = cp_req == BG_PLAN_CP_AUTO;
    cp_req = cp_req == 0 || cp_auto ? 1 : cp_req;
    if (cp_req < 1 || pa->world % cp_req)
        return bg_error(BG_ERR_INVALID, "cp %d does not divide %d devices", cp_req, pa->world);
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
    bg_model_config_t mc;
    if ((cp_req > 1 || cp_auto) && (!s.tokens || bg_model_desc_builder(pa->model, &mc) != BG_OK))
        return bg_error(BG_ERR_UNSUPPORTED, "cp %s: context parallelism is planned for builder-made token models "
                        "(GPT, Llama) only", cp_auto ? "auto" : "> 1");
    if ((cp_req > 1 || cp_auto) && (pa->layer_fwd_s || (pa->tp_times && pa->ntp_times)))
        return bg_error(BG_ERR_UNSUPPORTED, "cp %s with measured layer times: they are at the whole sequence "
                        "(plan context groups from the FLOPs)", cp_auto ? "auto" : "> 1");
    if (cp_req > 1 && s.seq % (2 * cp_req))
        return bg_error(BG_ERR_INVALID, "cp %d: the sequence length %d is not divisible by 2 x cp = %d", cp_req, s.seq,
                        2 * cp_req);
    int seq_whole = s.seq;
    s.cp = cp_req;
    s.seq = seq_whole / cp_req; /* a context member's positions */
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
        for (int t = 1; t <= pa->world / s.cp; t++)
            if (pa->world / s.cp % t == 0)
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
            for (t = 2; t <= pa->world / s.cp && s.nplans == 0; t++)
                if (pa->world / s.cp % t == 0)
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
    if (s.nplans == 0 && cp_auto)
        BG_CHECK_GOTO(search_cp_auto(&s, kinds, nk, tp_req ? tp_req : 1, seq_whole, note, sizeof note), st, out);
    if (s.nplans == 0) {
        st = no_fit_error(&s, kinds, nk);
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
