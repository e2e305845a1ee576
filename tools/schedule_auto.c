/* tools/schedule_auto.c: `brigade schedule --auto --profile PROFILE.json
 * --mem-limit BYTES`: per-stage F, B, W and stash bytes from a layer profile
 * (brigade profile --json), split over the stages of every layout (one stage
 * per rank, interleaved v = 2..4, the V), then bg_schedule_search() per layout
 * under the limit, the fixed generators beside it at the same limit, and the
 * winner printed (and written) like any schedule. Thin: the search is the
 * library's. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/schedule_auto.h"

#define CMD "schedule"
#define MAXL 4096

typedef struct {
    int n;
    double f[MAXL], b[MAXL], w[MAXL], stash[MAXL], out[MAXL];
} profile_t;

static int num(json_t *o, const char *key, const char *path, int i, double *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v) || !(json_number_value(v) >= 0) || !isfinite(json_number_value(v)))
        return bg_cli_fail(CMD, "%s: layers[%d].%s must be a number >= 0 (write the file with brigade profile --json)",
                           path, i, key);
    *out = json_number_value(v);
    return 0;
}

static int load_profile(const char *path, profile_t *pr)
{
    if (bg_cli_check_json_object(CMD, path))
        return 1;
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return bg_cli_fail(CMD, "%s: malformed JSON at line %d column %d: %s", path, err.line, err.column, err.text);
    json_t *layers = json_object_get(root, "layers");
    int rc = 0;
    if (!json_is_array(layers) || json_array_size(layers) == 0 || json_array_size(layers) > MAXL) {
        rc = bg_cli_fail(CMD, "%s: no \"layers\" array of 1..%d entries (write the file with brigade profile --json)",
                         path, MAXL);
        goto out;
    }
    pr->n = (int)json_array_size(layers);
    for (int i = 0; i < pr->n && !rc; i++) {
        json_t *l = json_array_get(layers, (size_t)i);
        if (!json_is_object(l)) {
            rc = bg_cli_fail(CMD, "%s: layers[%d] is not an object", path, i);
            break;
        }
        rc = num(l, "fwd_s", path, i, &pr->f[i]) || num(l, "bwd_input_s", path, i, &pr->b[i]) ||
             num(l, "bwd_weight_s", path, i, &pr->w[i]) || num(l, "stash_bytes", path, i, &pr->stash[i]) ||
             num(l, "output_bytes", path, i, &pr->out[i]);
    }
out:
    json_decref(root);
    return rc;
}

/* One layout's per-stage costs (seconds) and stash bytes from the profile. */
typedef struct {
    int v, vshape, S;
    double f[MAXL], b[MAXL], w[MAXL], sb[MAXL], act;
    bg_sim_params_t sim;
} layout_t;

static int make_layout(const profile_t *pr, const bg_auto_args_t *a, int v, int vshape, layout_t *L)
{
    int S = a->p * v;
    if (S > pr->n || S > MAXL || (a->split && a->nsplit != S))
        return 0; /* not a layout of this model (or of this split) */
    L->v = v, L->vshape = vshape, L->S = S, L->act = 0;
    for (int s = 0, at = 0; s < S; s++) {
        int n = a->split ? a->split[s] : pr->n / S + (s < pr->n % S);
        L->f[s] = L->b[s] = L->w[s] = 0;
        L->sb[s] = at > 0 ? pr->out[at - 1] : 0; /* the stage's input */
        for (int i = at; i < at + n; i++) {
            L->f[s] += pr->f[i], L->b[s] += pr->b[i], L->w[s] += pr->w[i];
            L->sb[s] += pr->stash[i] + pr->out[i];
        }
        at += n;
        if (pr->out[at - 1] > L->act)
            L->act = pr->out[at - 1];
    }
    bg_sim_params_t sim = BG_SIM_PARAMS_INIT;
    sim.f_costs = L->f, sim.b_costs = L->b, sim.w_costs = L->w;
    sim.stash_bytes_per_stage = L->sb;
    sim.latency = a->link->latency, sim.bandwidth = a->link->bandwidth;
    sim.act_bytes = sim.grad_bytes = L->act;
    L->sim = sim;
    return 1;
}

static const char *layout_name(const layout_t *L, char *buf, size_t n)
{
    if (L->v == 1)
        snprintf(buf, n, "one stage per rank");
    else if (L->vshape)
        snprintf(buf, n, "V (2 chunks)");
    else
        snprintf(buf, n, "interleaved v=%d", L->v);
    return buf;
}

static void mib(char *buf, size_t n, double bytes) { snprintf(buf, n, "%.3f MiB", bytes / 1048576.0); }

int bg_schedule_auto(const bg_auto_args_t *a)
{
    static profile_t pr;
    static layout_t lay[6];
    if (load_profile(a->profile, &pr))
        return 2;
    if (a->split) {
        long long sum = 0;
        for (int i = 0; i < a->nsplit; i++)
            sum += a->split[i];
        if (sum != pr.n)
            return bg_cli_fail(CMD, "--split sums to %lld layers but %s has %d", sum, a->profile, pr.n);
    }
    int nl = 0;
    nl += make_layout(&pr, a, 1, 0, &lay[nl]);
    nl += make_layout(&pr, a, 2, 1, &lay[nl]);
    for (int v = 2; v <= 4; v++)
        nl += make_layout(&pr, a, v, 0, &lay[nl]);
    if (nl == 0 && a->split)
        return bg_cli_fail(CMD, "--split has %d entries, but the layouts of %d ranks have %d, %d, %d or %d stages",
                           a->nsplit, a->p, a->p, 2 * a->p, 3 * a->p, 4 * a->p);
    if (nl == 0)
        return bg_cli_fail(CMD, "%s has %d layers: too few for %d pipeline ranks", a->profile, pr.n, a->p);
    char lim[32] = "none", buf[64], b2[32];
    if (a->mem_limit > 0)
        mib(lim, sizeof lim, a->mem_limit);
    printf("search: p=%d m=%d, costs from %s (%d layers), peak stash limit per rank %s\n", a->p, a->m, a->profile,
           pr.n, lim);
    printf("%-20s %-46s %10s %12s %5s\n", "layout", "best program", "step ms", "peak stash", "fits");
    bg_schedule_t *best = NULL;
    int best_l = -1;
    double best_step = INFINITY, lower = INFINITY, min_limit = INFINITY;
    int tried = 0;
    for (int k = 0; k < nl; k++) {
        bg_schedule_search_params_t sp = BG_SCHEDULE_SEARCH_PARAMS_INIT;
        sp.stages = a->p, sp.microbatches = a->m, sp.chunks = lay[k].v, sp.vshape = lay[k].vshape;
        sp.costs = &lay[k].sim, sp.mem_limit = a->mem_limit;
        bg_schedule_search_result_t res;
        bg_schedule_t *s = NULL;
        bg_status_t st = bg_schedule_search(&sp, &res, &s);
        if (st != BG_OK && st != BG_ERR_NOT_FOUND) {
            bg_schedule_free(best);
            return bg_cli_status(CMD, st);
        }
        tried += res.tried;
        if (res.lower_bound < lower)
            lower = res.lower_bound;
        if (res.min_limit < min_limit)
            min_limit = res.min_limit;
        layout_name(&lay[k], buf, sizeof buf);
        if (st == BG_OK) {
            mib(b2, sizeof b2, res.peak);
            printf("%-20s %-46s %10.4f %12s %5s\n", buf, res.from, res.step * 1e3, b2, "yes");
            if (res.step < best_step) {
                bg_schedule_free(best);
                best = s, best_step = res.step, best_l = k;
            } else {
                bg_schedule_free(s);
            }
        } else {
            mib(b2, sizeof b2, res.min_limit);
            printf("%-20s %-46s %10s %12s %5s\n", buf, "(none fits)", "-", b2, "no");
        }
    }
    /* every fixed generator at the same limit, on its own layout */
    printf("\nfixed generators (built for the same costs):\n%-16s %12s %14s %6s\n", "schedule", "step ms", "peak stash",
           "fits");
    for (int kind = 0; kind < BG_SCHED_CUSTOM; kind++) {
        if (kind == BG_SCHED_DUALPIPE)
            continue; /* two model copies: not one of the layouts searched here */
        int vshape = kind == BG_SCHED_ZBV || kind == BG_SCHED_DUALPIPEV;
        int v = kind == BG_SCHED_INTERLEAVED || kind == BG_SCHED_ZB_INTERLEAVED || vshape ? 2 : 1;
        int k = 0;
        while (k < nl && !(lay[k].v == v && lay[k].vshape == vshape))
            k++;
        if (k == nl)
            continue;
        bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
        gp.kind = (bg_schedule_kind_t)kind, gp.stages = a->p, gp.microbatches = a->m, gp.chunks = v;
        gp.costs = &lay[k].sim;
        bg_schedule_t *s = NULL;
        bg_sim_result_t *r;
        if (kind == BG_SCHED_DUALPIPEV && a->m < 2 * a->p)
            continue; /* needs m >= 2p */
        bg_status_t st = bg_schedule_generate(&gp, &s);
        if (st != BG_OK || (st = bg_schedule_simulate(s, &lay[k].sim, &r)) != BG_OK) {
            if (st != BG_OK && s)
                bg_schedule_free(s);
            bg_schedule_free(best);
            return bg_cli_status(CMD, st);
        }
        double peak = 0;
        for (int q = 0; q < a->p; q++)
            if (bg_sim_peak_stash_bytes(r, q) > peak)
                peak = bg_sim_peak_stash_bytes(r, q);
        mib(b2, sizeof b2, peak);
        printf("%-16s %12.4f %14s %6s\n", bg_schedule_kind_name(gp.kind), bg_sim_step_time(r) * 1e3, b2,
               a->mem_limit <= 0 || peak <= a->mem_limit * (1 + 1e-12) ? "yes" : "no");
        bg_sim_result_free(r);
        bg_schedule_free(s);
    }
    if (!best) {
        char m1[32];
        mib(m1, sizeof m1, min_limit);
        bg_cli_fail(CMD, "no program of the %d tried keeps its peak stash within %.0f bytes (%s) on every rank; the "
                         "smallest limit that works is %.0f bytes (%s)", tried, a->mem_limit, lim, min_limit, m1);
        return 1;
    }
    printf("\nsearched program: %s, step %.4f ms, lower bound %.4f ms (gap %.1f%%), %d programs tried\n\n",
           layout_name(&lay[best_l], buf, sizeof buf), best_step * 1e3, lower * 1e3,
           100 * (best_step / lower - 1), tried);
    int rc = bg_cli_schedule_run(best, &lay[best_l].sim, a->text, 0, a->json_out, a->svg_out);
    bg_schedule_free(best);
    return rc;
}

int bg_auto_layout_costs(const char *profile, int p, int v, int vshape, const bg_sim_params_t *link,
                         bg_sim_params_t **sim_p, void **mem_p)
{
    static profile_t pr;
    if (load_profile(profile, &pr))
        return 2;
    layout_t *L = malloc(sizeof *L);
    if (!L)
        return bg_cli_fail(CMD, "out of memory for the costs of %d ranks x %d chunks", p, v), 2;
    bg_auto_args_t a = {.profile = profile, .p = p, .link = link};
    if (!make_layout(&pr, &a, v, vshape, L)) {
        free(L);
        return 1;
    }
    *sim_p = &L->sim, *mem_p = L;
    return 0;
}
