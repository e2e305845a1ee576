/* partitioner/plan.c: the plan object (allocation, copy, free), its
 * accessors, the plan set's, and the check `brigade train --plan` makes that a
 * plan is of the model it is given (bg_plan_check_model). The search is
 * plan_search.c and plan_layout.c, the JSON plan_json.c; shared definitions in
 * plan_impl.h. No printing: the CLI prints; no search or JSON here.
 *
 * A plan keeps the model's description JSON (bg_model_desc_to_json) as it
 * is; models/desc.c owns that format. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/util.h"
#include "plan_impl.h"

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

bg_plan_t *bg__plan_alloc(int nlayers, int nstages, int pp)
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
    bg_plan_t *p = bg__plan_alloc(src->nlayers, src->nstages, src->pp);
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
int bg_plan_cp(const bg_plan_t *p) { return p->cp > 1 ? p->cp : 1; }
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
int bg_plan_offload(const bg_plan_t *p) { return p->offload; }
double bg_plan_offload_ms(const bg_plan_t *p) { return p->offload_ms; }
int bg_plan_offload_activations(const bg_plan_t *p) { return p->offact; }
const char *bg_plan_offload_name(const bg_plan_t *p) { return bg__plan_offload_names[p->offload][p->offact]; }
const char *bg_plan_offload_choice_name(int offload, int activations)
{
    return offload >= 0 && offload <= 2 ? bg__plan_offload_names[offload][activations != 0] : "";
}

/* [offload][offact]: brigade train's --offload values (plan_json.c reads them back through this table) */
const char *const bg__plan_offload_names[3][2] = {
    {"", "activations"}, {"optimizer", "optimizer,activations"}, {"optimizer,params", "optimizer,params,activations"}};
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

const char *bg__plan_sizestr(char *buf, size_t n, double b)
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

/* The plan's layers against a description's: the count, the sequence length
 * and every layer's profile at the plan's microbatch size (name, sizes and
 * FLOPs as the layers report them), which also tells apart models whose
 * description JSON is the same (attention heads, for one). diff[0] = 0 when
 * they agree, else it names the first difference. */
bg_status_t bg__plan_layers_diff(const bg_plan_t *p, const bg_model_desc_t *d, char *diff, size_t cap)
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
    bg_cp_comm_t ring = {.size = bg_plan_cp(p)}; /* a context member's layers, at seq / cp; held by own */
    BG_CHECK(bg__plan_model_for(d, p->tp, p->sp, &ring, &dt, &own));
    if (!dt) {
        snprintf(diff, cap, "the plan is for tp %d x cp %d, which the model has no build for", p->tp, ring.size);
        return BG_OK;
    }
    bg_layer_profile_t *prof = malloc((size_t)L * sizeof(*prof));
    if (!prof) {
        bg_model_desc_destroy(own);
        return bg_error(BG_ERR_NOMEM, "profile");
    }
    bg_status_t st = bg_model_profile(dt, p->microbatch_size, p->seq / ring.size, prof, L, &n);
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
    BG_CHECK(bg__plan_layers_diff(p, d, diff, sizeof(diff)));
    if (diff[0])
        return bg_error(BG_ERR_MISMATCH, "the plan is from another model: %s", diff);
    return BG_OK;
}
