/* tools/bench_schedules.c: `brigade bench schedules`: for a grid of pipeline
 * ranks p and microbatches m, every generator's and the search's simulated
 * step time, both bubbles (whole-step and per-stage) and peak stash, under
 * costs given per rank (F,B,W; a chunk of v costs 1/v) or from a profile
 * (brigade profile --json; layers split evenly over each layout's stages);
 * the table printed, written as CSV and drawn as an SVG bar chart.
 * Thin: generators, search and simulator are the library's; this file only
 * walks the grid and writes what they return. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/schedule.h"
#include "tools/bench.h"
#include "tools/cli.h"
#include "tools/schedule_auto.h"

#define CMD "bench schedules"
#define MAXG 16   /* p or m values */
#define NROW 1024 /* table rows */

typedef struct {
    int p, m, v;
    char name[24];
    double step, bubble, stage_bubble, peak, peak_bytes;
} row_t;

typedef struct {
    const char *profile;
    bg_sim_params_t link; /* costs per rank (given) and the link */
    double mem_limit;
} grid_t;

/* the costs of kind's layout: from the profile, or the per-rank costs / v */
static int layout_costs(const grid_t *g, int p, int v, int vshape, bg_sim_params_t *sim, void **mem)
{
    *mem = NULL;
    if (!g->profile) {
        *sim = g->link;
        sim->f_cost /= v, sim->b_cost /= v, sim->w_cost /= v, sim->stash_bytes = 1.0 / v;
        return 0;
    }
    bg_sim_params_t *sp;
    int rc = bg_auto_layout_costs(g->profile, p, v, vshape, &g->link, &sp, mem);
    if (rc == 0)
        *sim = *sp;
    return rc;
}

static void fill_row(row_t *w, int p, int m, int v, const char *name, const bg_sim_result_t *r)
{
    w->p = p, w->m = m, w->v = v;
    snprintf(w->name, sizeof w->name, "%s", name);
    w->step = bg_sim_step_time(r), w->bubble = bg_sim_bubble(r, -1), w->stage_bubble = bg_sim_stage_bubble(r, NULL);
    w->peak = w->peak_bytes = 0;
    for (int k = 0; k < p; k++) {
        w->peak = bg_sim_peak_stash(r, k) > w->peak ? bg_sim_peak_stash(r, k) : w->peak;
        w->peak_bytes = bg_sim_peak_stash_bytes(r, k) > w->peak_bytes ? bg_sim_peak_stash_bytes(r, k) : w->peak_bytes;
    }
}

/* one (p, m) cell of the grid: every generator, then the search over the
 * layouts; rows appended at *n. Returns the exit code (0 ok). */
static int bench_cell(const grid_t *g, int p, int m, row_t *rows, int *n)
{
    double best = INFINITY;
    int best_v = 1;
    char best_from[96] = "";
    for (int kind = 0; kind < BG_SCHED_CUSTOM; kind++) {
        int vshape = kind == BG_SCHED_ZBV || kind == BG_SCHED_DUALPIPEV || kind == BG_SCHED_DUALPIPE;
        int v = vshape || kind == BG_SCHED_INTERLEAVED || kind == BG_SCHED_ZB_INTERLEAVED ? 2 : 1;
        if (kind == BG_SCHED_DUALPIPE && g->profile)
            continue; /* two model copies: the profile's split names one */
        bg_sim_params_t sim;
        void *mem;
        /* dualpipe: each chunk is a whole stage of one copy, costing the rank's costs */
        int rc = layout_costs(g, p, kind == BG_SCHED_DUALPIPE ? 1 : v, vshape && kind != BG_SCHED_DUALPIPE, &sim,
                              &mem);
        if (rc == 2)
            return 2;
        bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
        gp.kind = (bg_schedule_kind_t)kind, gp.stages = p, gp.microbatches = m, gp.chunks = v, gp.costs = &sim;
        bg_schedule_t *s = NULL;
        bg_sim_result_t *r = NULL;
        if (rc == 0 && bg_schedule_generate(&gp, &s) == BG_OK && bg_schedule_simulate(s, &sim, &r) == BG_OK) {
            fill_row(&rows[(*n)++], p, m, v, bg_schedule_kind_name(gp.kind), r);
        } /* else: the generator does not apply to this p, m (dualpipev m < 2p, ...) */
        bg_sim_result_free(r);
        bg_schedule_free(s);
        free(mem);
    }
    /* the search over the layouts: one stage per rank, interleaved v = 2, the V */
    static const int lay[3][2] = {{1, 0}, {2, 0}, {2, 1}};
    for (int k = 0; k < 3; k++) {
        bg_sim_params_t sim;
        void *mem;
        int rc = layout_costs(g, p, lay[k][0], lay[k][1], &sim, &mem);
        if (rc == 2)
            return 2;
        if (rc == 1)
            continue;
        bg_schedule_search_params_t sp = BG_SCHEDULE_SEARCH_PARAMS_INIT;
        sp.stages = p, sp.microbatches = m, sp.chunks = lay[k][0], sp.vshape = lay[k][1], sp.costs = &sim;
        sp.mem_limit = g->mem_limit;
        bg_schedule_search_result_t res;
        bg_schedule_t *s = NULL;
        bg_sim_result_t *r = NULL;
        if (bg_schedule_search(&sp, &res, &s) == BG_OK && res.step < best &&
            bg_schedule_simulate(s, &sim, &r) == BG_OK) {
            best = res.step, best_v = lay[k][0];
            snprintf(best_from, sizeof best_from, "%s%s", lay[k][1] ? "V: " : "", res.from);
            fill_row(&rows[*n], p, m, best_v, "search", r);
        }
        bg_sim_result_free(r);
        bg_schedule_free(s);
        free(mem);
    }
    if (best < INFINITY) {
        printf("  search (p=%d m=%d) won with %s\n", p, m, best_from);
        (*n)++;
    }
    return 0;
}

static int write_csv(const char *path, const row_t *rows, int n, int bytes)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return bg_cli_fail(CMD, "cannot write %s", path), 1;
    fprintf(f, "p,m,schedule,v,step,bubble,stage_bubble,peak_stash%s\n", bytes ? ",peak_stash_bytes" : "");
    for (int i = 0; i < n; i++) {
        fprintf(f, "%d,%d,%s,%d,%.9g,%.6f,%.6f,%.0f", rows[i].p, rows[i].m, rows[i].name, rows[i].v, rows[i].step,
                rows[i].bubble, rows[i].stage_bubble, rows[i].peak);
        if (bytes)
            fprintf(f, ",%.0f", rows[i].peak_bytes);
        fprintf(f, "\n");
    }
    if (fclose(f) != 0)
        return bg_cli_fail(CMD, "cannot write %s", path), 1;
    printf("wrote %s\n", path);
    return 0;
}

/* grouped bars: one group per (p, m), one bar per schedule, its step over the
 * group's fastest (1.0 = the fastest; the axis from 1) */
static int write_svg(const char *path, const row_t *rows, int n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return bg_cli_fail(CMD, "cannot write %s", path), 1;
    int groups = 0;
    double top = 1.05;
    for (int i = 0; i < n; i++) {
        groups += i == 0 || rows[i].p != rows[i - 1].p || rows[i].m != rows[i - 1].m;
    }
    int per = n / (groups ? groups : 1) + 1, bw = 12;
    double W = 80 + groups * (per * bw + 20) + 160, H = 360, x0 = 60, y0 = 300, h = 240;
    double best = INFINITY;
    for (int i = 0; i < n; i++) {
        if (i == 0 || rows[i].p != rows[i - 1].p || rows[i].m != rows[i - 1].m) {
            best = INFINITY;
            for (int j = i; j < n && rows[j].p == rows[i].p && rows[j].m == rows[i].m; j++)
                best = rows[j].step < best ? rows[j].step : best;
        }
        top = rows[i].step / best > top ? rows[i].step / best : top;
    }
    static const char *const col[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                      "#b07aa1", "#ff9da7", "#9c755f", "#222222"};
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
               "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"11\">\n"
               "<title>brigade bench schedules</title>\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
               "<text class=\"title\" x=\"%.0f\" y=\"20\" font-size=\"14\">brigade bench schedules: simulated step "
               "time over the fastest of each (p, m)</text>\n"
               "<text class=\"axis-label\" x=\"14\" y=\"%.0f\" transform=\"rotate(-90 14 %.0f)\" "
               "text-anchor=\"middle\">step / fastest (x)</text>\n",
            W, H, W, H, x0, y0 - h / 2, y0 - h / 2);
    for (int t = 0; t <= 4; t++) { /* y axis from 1 to top */
        double val = 1 + (top - 1) * t / 4, y = y0 - h * t / 4;
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                   "<text class=\"tick\" x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", x0, y, W - 160, y,
                x0 - 4, y + 4, val);
    }
    double x = x0 + 10;
    char names[12][24];
    int nn = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && (rows[i].p != rows[i - 1].p || rows[i].m != rows[i - 1].m))
            x += 20;
        if (i == 0 || rows[i].p != rows[i - 1].p || rows[i].m != rows[i - 1].m) {
            best = INFINITY;
            for (int j = i; j < n && rows[j].p == rows[i].p && rows[j].m == rows[i].m; j++)
                best = rows[j].step < best ? rows[j].step : best;
            fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">p=%d m=%d</text>\n", x, y0 + 16, rows[i].p, rows[i].m);
        }
        int c = 0;
        while (c < nn && strcmp(names[c], rows[i].name))
            c++;
        if (c == nn && nn < 12)
            snprintf(names[nn++], sizeof names[0], "%s", rows[i].name);
        double bh = top > 1 ? h * (rows[i].step / best - 1) / (top - 1) : 0;
        fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"><title>%s p=%d m=%d: step %g "
                   "(%.3fx), bubble %.1f%%, per-stage %.1f%%, peak stash %.0f</title></rect>\n",
                x, y0 - bh - 1, bw - 2, bh + 1, col[c % 10], rows[i].name, rows[i].p, rows[i].m, rows[i].step,
                rows[i].step / best, 100 * rows[i].bubble, 100 * rows[i].stage_bubble, rows[i].peak);
        x += bw;
    }
    for (int c = 0; c < nn; c++) /* the legend */
        fprintf(f, "<g class=\"legend-item\"><rect x=\"%.0f\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                   "<text x=\"%.0f\" y=\"%d\">%s</text></g>\n", W - 150, 40 + 16 * c, col[c % 10], W - 135, 49 + 16 * c,
                names[c]);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return bg_cli_fail(CMD, "cannot write %s", path), 1;
    printf("wrote %s\n", path);
    return 0;
}

static void usage(void)
{
    printf("usage: brigade bench schedules [--stages P,P,..] [--microbatches M,M,..] [--costs F,B,W]\n"
           "                               [--profile PROFILE.json] [--latency T] [--mem-limit N]\n"
           "                               [--csv OUT] [--svg OUT]\n"
           "  for every p and m of the grid (default p 4,8 and m 8,16,32): every generator's and the\n"
           "  search's simulated step time, bubble (whole-step: idle / (p x step); per-stage: the\n"
           "  zero-bubble paper's, the worst rank's idle inside its span) and peak stash (chunk-\n"
           "  microbatches; a chunk of v holds 1/v of a stage). Costs per rank (default 1,1,1; a\n"
           "  chunk costs 1/v), or from a profile (brigade profile --json; seconds and bytes).\n"
           "  --mem-limit bounds the search's peak stash (in stage-microbatches, or bytes with --profile).\n"
           "  --csv writes the table, --svg a bar chart of each step over its (p, m)'s fastest.\n");
}

static int parse_list(const char *flag, const char *val, int *out, int *n, int lo, int hi)
{
    long long t[MAXG];
    if (bg_cli_int_list(CMD, flag, val, t, MAXG, n))
        return 2;
    for (int i = 0; i < *n; i++) {
        if (t[i] < lo || t[i] > hi)
            return bg_cli_fail(CMD, "%s entry %d is %lld (expected %d..%d)", flag, i, t[i], lo, hi), 2;
        out[i] = (int)t[i];
    }
    return 0;
}

int bg_bench_schedules(int argc, char **argv)
{
    grid_t g = {.link = BG_SIM_PARAMS_INIT};
    int ps[MAXG] = {4, 8}, ms[MAXG] = {8, 16, 32}, np = 2, nm = 3;
    const char *csv = NULL, *svg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--stages") || !strcmp(a, "--microbatches")) {
            int rc = a[2] == 's' ? parse_list(a, val, ps, &np, 1, 64) : parse_list(a, val, ms, &nm, 1, 4096);
            if (rc)
                return rc;
            i++;
        } else if (!strcmp(a, "--costs")) {
            double c[3];
            int k = val ? sscanf(val, "%lf,%lf,%lf", &c[0], &c[1], &c[2]) : 0;
            if (k != 3 || !(c[0] >= 0 && c[1] >= 0 && c[2] >= 0) || !isfinite(c[0] + c[1] + c[2]))
                return bg_cli_fail(CMD, "--costs expects F,B,W (three numbers >= 0), got \"%s\"", val ? val : ""), 2;
            g.link.f_cost = c[0], g.link.b_cost = c[1], g.link.w_cost = c[2], i++;
        } else if (!strcmp(a, "--latency") || !strcmp(a, "--mem-limit")) {
            if (bg_cli_double(CMD, a, val, 0, 1e300, a[2] == 'l' ? &g.link.latency : &g.mem_limit))
                return 2;
            i++;
        } else if (!strcmp(a, "--profile") || !strcmp(a, "--csv") || !strcmp(a, "--svg")) {
            if (!val)
                return bg_cli_fail(CMD, "%s needs a file", a), 2;
            *(a[2] == 'p' ? &g.profile : a[3] == 's' ? &csv : &svg) = val, i++;
        } else {
            static const char *const known[] = {"--stages", "--microbatches", "--costs", "--profile", "--latency",
                                                "--mem-limit", "--csv", "--svg", "--help", NULL};
            return bg_cli_unknown_option(CMD, a, known);
        }
    }
    static row_t rows[NROW];
    int n = 0;
    printf("schedules bench: costs %s", g.profile ? g.profile : "per rank");
    if (!g.profile)
        printf(" F=%g B=%g W=%g", g.link.f_cost, g.link.b_cost, g.link.w_cost);
    printf(", link latency %g, search limit %s\n", g.link.latency, g.mem_limit > 0 ? "given" : "none");
    for (int i = 0; i < np; i++)
        for (int j = 0; j < nm; j++) {
            if (n + BG_SCHED_CUSTOM + 1 > NROW)
                return bg_cli_fail(CMD, "the grid has more than %d rows", NROW), 2;
            int rc = bench_cell(&g, ps[i], ms[j], rows, &n);
            if (rc)
                return rc;
        }
    printf("%4s %5s %-15s %2s %14s %9s %9s %11s\n", "p", "m", "schedule", "v", "step", "bubble", "per-stage",
           "peak-stash");
    for (int i = 0; i < n; i++)
        printf("%4d %5d %-15s %2d %14.6g %8.2f%% %8.2f%% %11.0f\n", rows[i].p, rows[i].m, rows[i].name, rows[i].v,
               rows[i].step, 100 * rows[i].bubble, 100 * rows[i].stage_bubble,
               g.profile ? rows[i].peak_bytes : rows[i].peak);
    printf("(peak stash: %s)\n", g.profile ? "bytes" : "chunk-microbatches; a chunk of v holds 1/v of a stage");
    if (csv && write_csv(csv, rows, n, g.profile != NULL))
        return 1;
    if (svg && write_svg(svg, rows, n))
        return 1;
    return 0;
}
