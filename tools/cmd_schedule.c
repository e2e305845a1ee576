/* tools/cmd_schedule.c: `brigade schedule`: generate (or read) pipeline
 * schedule programs, validate them, simulate them, and print the text table,
 * bubble and memory per rank; optionally write JSON and an SVG timeline, or
 * compare every schedule for one (p, m). Thin: all logic is in
 * schedule/ through include/brigade/schedule.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/schedule.h"
#include "tools/cli.h"
#include "tools/schedule_auto.h"

#define CMD "schedule"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: brigade schedule --schedule gpipe|1f1b|interleaved|zb-h1|zb-h2|zbv|zb-interleaved|dualpipev|dualpipe\n"
            "                        --stages P --microbatches M\n"
            "                        [--chunks V] [--costs F,B,W] [--latency T] [--bandwidth BYTES_PER_T]\n"
            "                        [--act-bytes N] [--grad-bytes N] [--stash-bytes N] [--json OUT] [--sim-json OUT]\n"
            "                        [--svg OUT] [--comm] [--text | --no-text] [--forward-only]\n"
            "       brigade schedule --compare --stages P --microbatches M [--chunks V] [--costs F,B,W] ...\n"
            "       brigade schedule --from-json FILE | --from-torch-csv FILE [--costs F,B,W] [--svg OUT] ...\n"
            "       brigade schedule --auto --profile PROFILE.json --stages P --microbatches M [--mem-limit BYTES]\n"
            "                        [--split A,B,..] [--latency T] [--bandwidth BYTES_PER_S] [--json OUT] [--svg OUT]\n"
            "       brigade schedule --auto --exact --stages P --microbatches M [--costs F,B,W] [--latency T]\n"
            "                        [--mem-limit N] [--max-nodes N] [--json OUT] [--svg OUT]\n\n"
            "Generates the per-rank programs for the given costs, proves them correct (validator), simulates\n"
            "them and prints the program table, the step time, the bubble (whole-step: idle / (p x step); per-stage,\n"
            "the zero-bubble paper's: the worst rank's idle inside its own span) and the peak stash per rank.\n"
            "  --costs F,B,W   forward, backward-input and backward-weight time of one chunk (default 1,1,1;\n"
            "                  a full backward costs B+W)\n"
            "  --f-costs a,b,..  --b-costs ..  --w-costs ..  per-stage costs, one per virtual stage (p x v)\n"
            "  --latency, --bandwidth, --act-bytes, --grad-bytes  link model: a transfer takes\n"
            "                  latency + bytes / bandwidth (bandwidth 0 = infinite, the default)\n"
            "  --stash-bytes   bytes held per stashed microbatch per stage (peak bytes per rank)\n"
            "  --comm          show send/recv/reduce/optimizer instructions in the table\n"
            "  --json OUT      write the programs in the JSON interchange format (docs/schedules.md)\n"
            "  --sim-json OUT  write the simulator's figures (step, both bubbles, per rank) as JSON\n"
            "  --svg OUT       write an SVG Gantt chart of the simulated step\n"
            "  --compare       run every schedule for this p and m and print them side by side\n"
            "  --from-json F   validate and simulate your own programs\n"
            "  --forward-only  the program's forward-only version (evaluation: forwards and activation\n"
            "                  transfers in the program's order, no backward; brigade train --eval-every)\n"
            "  --from-torch-csv F  read torch.distributed.pipelining's CSV schedule (_dump_csv, compute only:\n"
            "                  one row per rank, cells like 2F0 1I3 0W1 3B2), then as --from-json\n"
            "  --to-torch-csv OUT  write the compute order in that CSV format (torch's _load_csv reads it)\n"
            "  --auto          search the program with the smallest simulated step whose peak stash fits\n"
            "                  --mem-limit on every rank, over every layout (one stage per rank, interleaved\n"
            "                  v=2..4, V), with per-stage F, B, W and stash bytes from --profile (brigade profile\n"
            "                  --json; layers split evenly, or by --split); prints the lower bound and the gap,\n"
            "                  every fixed generator at the same limit, and the smallest limit that works when\n"
            "                  none fits (times in seconds; the link: --latency s, --bandwidth bytes/s)\n"
            "  --exact         with --auto: the optimal program of the one-chunk layout and the V by branch and\n"
            "                  bound (small p and m), beside the heuristic search and the lower bound; --costs\n"
            "                  per rank (a V chunk costs half), --mem-limit in stage-microbatches; after\n"
            "                  --max-nodes N nodes per layout (default 10M) it reports the best found and a bound\n");
}

static int parse_costs(const char *s, double *f, double *b, double *w)
{
    double v[3];
    const char *p = s;
    if (!s) {
        bg_cli_fail(CMD, "--costs needs a value F,B,W");
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        char *end;
        errno = 0;
        v[i] = strtod(p, &end);
        if (errno || end == p || !isfinite(v[i]) || v[i] < 0 || (i < 2 && *end != ',') || (i == 2 && *end)) {
            bg_cli_fail(CMD, "--costs expects three numbers >= 0 as F,B,W (like 1,1,1), got \"%s\"", s);
            return -1;
        }
        p = end + 1;
    }
    *f = v[0], *b = v[1], *w = v[2];
    return 0;
}

/* comma-separated numbers >= 0; *out malloc'ed */
static int parse_list(const char *flag, const char *s, double **out, int *n_out)
{
    if (!s || !*s) {
        bg_cli_fail(CMD, "%s needs a comma-separated list of numbers", flag);
        return -1;
    }
    int n = 1;
    for (const char *c = s; *c; c++)
        n += *c == ',';
    double *v = malloc(sizeof(double) * (size_t)n);
    if (!v) {
        bg_cli_fail(CMD, "out of memory");
        return -1;
    }
    const char *p = s;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        v[i] = strtod(p, &end);
        if (errno || end == p || !isfinite(v[i]) || v[i] < 0 || (i < n - 1 && *end != ',') || (i == n - 1 && *end)) {
            free(v);
            bg_cli_fail(CMD, "%s expects comma-separated numbers >= 0, one per stage, got \"%s\"", flag, s);
            return -1;
        }
        p = end + 1;
    }
    *out = v;
    *n_out = n;
    return 0;
}

static double max_stash(const bg_sim_result_t *r, int p, int *rank_p)
{
    int best = 0, at = 0;
    for (int k = 0; k < p; k++)
        if (bg_sim_peak_stash(r, k) > best)
            best = bg_sim_peak_stash(r, k), at = k;
    if (rank_p)
        *rank_p = at;
    return best;
}

static void print_result(const bg_schedule_t *s, const bg_sim_result_t *r, const bg_sim_params_t *sp)
{
    int p = bg_schedule_ranks(s);
    printf("step time %.6g   bubble %.2f%% (idle / (p x step))   steady-state bubble %.2f%% (idle inside each "
           "rank's span)\n",
           bg_sim_step_time(r), 100 * bg_sim_bubble(r, -1), 100 * bg_sim_span_bubble(r, -1));
    int worst;
    double sb = bg_sim_stage_bubble(r, &worst);
    printf("per-stage bubble %.2f%% (the zero-bubble paper's: the worst rank's span-bub, rank %d)\n", 100 * sb, worst);
    printf("%5s %10s %10s %8s %8s %12s%s\n", "rank", "busy", "idle", "bubble", "span-bub", "peak-stash",
           sp->stash_bytes > 0 ? "   peak-bytes" : "");
    for (int k = 0; k < p; k++) {
        printf("%5d %10.6g %10.6g %7.2f%% %7.2f%% %12d", k, bg_sim_busy(r, k), bg_sim_idle(r, k),
               100 * bg_sim_bubble(r, k), 100 * bg_sim_span_bubble(r, k), bg_sim_peak_stash(r, k));
        if (sp->stash_bytes > 0)
            printf("   %.6g", bg_sim_peak_stash_bytes(r, k));
        printf("\n");
    }
}

static const char *sim_json_out;  /* --sim-json: the simulator's figures */
static const char *torch_csv_out; /* --to-torch-csv: the order in torch.distributed.pipelining's CSV */
static int stage_costs_n[3]; /* entries given with --f-costs, --b-costs, --w-costs (0 = none) */

static int check_stage_costs(const bg_schedule_t *s)
{
    static const char *const flags[3] = {"--f-costs", "--b-costs", "--w-costs"};
    for (int k = 0; k < 3; k++)
        if (stage_costs_n[k] && stage_costs_n[k] != bg_schedule_stages(s))
            return bg_cli_fail(CMD, "%s has %d values but the schedule has %d stages (p x v)", flags[k],
                               stage_costs_n[k], bg_schedule_stages(s));
    return 0;
}

/* an output written (st == BG_OK: say so) or not (the message; exit code) */
static int wrote(bg_status_t st, const char *path)
{
    if (st != BG_OK)
        return bg_cli_status(CMD, st);
    printf("wrote %s\n", path);
    return 0;
}

int bg_cli_schedule_run(const bg_schedule_t *s, const bg_sim_params_t *sp, int text, unsigned tflags,
                        const char *json_out, const char *svg_out)
{
    if (check_stage_costs(s))
        return 2;
    bg_status_t st = bg_schedule_validate(s);
    if (st != BG_OK)
        return bg_cli_status(CMD, st);
    int p = bg_schedule_ranks(s), m = bg_schedule_microbatches(s), v = bg_schedule_chunks(s);
    char bw[32];
    if (sp->bandwidth > 0)
        snprintf(bw, sizeof bw, "%g", sp->bandwidth);
    else
        snprintf(bw, sizeof bw, "inf");
    if (sp->f_costs || sp->b_costs || sp->w_costs)
        printf("schedule %s: p=%d m=%d v=%d  per-stage costs  link latency %g bandwidth %s  (valid%s)\n",
               bg_schedule_name(s), p, m, v, sp->latency, bw, bg_schedule_is_forward_only(s) ? ", forward-only" : "");
    else
        printf("schedule %s: p=%d m=%d v=%d  costs per chunk F=%g B=%g W=%g  link latency %g bandwidth %s  (valid%s)\n",
               bg_schedule_name(s), p, m, v, sp->f_cost, sp->b_cost, sp->w_cost, sp->latency, bw,
               bg_schedule_is_forward_only(s) ? ", forward-only" : "");
    if (text < 0)
        text = p <= 32 && (long long)m * v <= 64;
    if (text) {
        char *t;
        st = bg_schedule_format_text(s, tflags, &t);
        if (st != BG_OK)
            return bg_cli_status(CMD, st);
        fputs(t, stdout);
        free(t);
        printf("(F forward, B full backward, b backward-input, W backward-weight%s%s)\n",
               v > 1 ? ", .c = chunk c" : "",
               (tflags & BG_SCHED_TEXT_COMM) ? ", sa/ra send/recv activation, sg/rg send/recv gradient, "
                                               "R reduce-grads, O optimizer-step" : "");
    }
    bg_sim_result_t *r;
    st = bg_schedule_simulate(s, sp, &r);
    if (st != BG_OK)
        return bg_cli_status(CMD, st);
    print_result(s, r, sp);
    int rc = 0;
    if (json_out)
        rc = wrote(bg_schedule_to_json_file(s, json_out), json_out);
    if (torch_csv_out && !rc)
        rc = wrote(bg_schedule_to_torch_csv_file(s, torch_csv_out), torch_csv_out);
    if (sim_json_out && !rc)
        rc = wrote(bg_sim_result_to_json_file(r, sim_json_out), sim_json_out);
    if (svg_out && !rc)
        rc = wrote(bg_schedule_svg(s, r, svg_out), svg_out);
    bg_sim_result_free(r);
    return rc;
}

static int run_compare(int p, int m, int v, const bg_sim_params_t *sp0)
{
    printf("p=%d m=%d  costs per rank F=%g B=%g W=%g (with v chunks per rank each chunk costs 1/v of them)\n", p, m,
           sp0->f_cost, sp0->b_cost, sp0->w_cost);
    printf("%-14s %3s %12s %9s %9s %9s %11s %14s\n", "schedule", "v", "step", "bubble", "steady", "per-stage",
           "peak-stash", "(rank of peak)");
    int rc = 0;
    for (int k = 0; k < BG_SCHED_CUSTOM; k++) {
        bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
        gp.kind = (bg_schedule_kind_t)k;
        gp.stages = p, gp.microbatches = m;
        gp.chunks = k == BG_SCHED_INTERLEAVED || k == BG_SCHED_ZB_INTERLEAVED ? v : 0;
        bg_schedule_t *s;
        bg_sim_result_t *r;
        const char *name = bg_schedule_kind_name(gp.kind);
        if (bg_schedule_generate(&gp, &s) != BG_OK) {
            printf("%-14s cannot apply: %s\n", name, bg_last_error());
            continue;
        }
        bg_sim_params_t spc = *sp0;
        int vv = bg_schedule_chunks(s) / bg_schedule_copies(s); /* dualpipe: each chunk is a whole stage */
        spc.f_cost /= vv, spc.b_cost /= vv, spc.w_cost /= vv, spc.stash_bytes /= vv;
        bg_schedule_free(s); /* again, built for the per-chunk costs */
        gp.costs = &spc;
        if (bg_schedule_generate(&gp, &s) != BG_OK) {
            printf("%-14s cannot apply: %s\n", name, bg_last_error());
            continue;
        }
        bg_status_t st = bg_schedule_simulate(s, &spc, &r);
        if (st != BG_OK) {
            printf("%-14s invalid: %s\n", name, bg_last_error());
            rc = 1;
        } else {
            int at;
            int peak = (int)max_stash(r, p, &at);
            printf("%-14s %3d %12.6g %8.2f%% %8.2f%% %8.2f%% %11d %14d\n", name, bg_schedule_chunks(s),
                   bg_sim_step_time(r), 100 * bg_sim_bubble(r, -1), 100 * bg_sim_span_bubble(r, -1),
                   100 * bg_sim_stage_bubble(r, NULL), peak, at);
            bg_sim_result_free(r);
        }
        bg_schedule_free(s);
    }
    printf("(peak stash: chunk-microbatches held from a forward to their last backward piece; with v chunks\n"
           " per rank each holds 1/v of the rank's activations, so divide by v to compare with v = 1;\n"
           " dualpipe's 2 chunks are whole stages, one of each of its 2 model copies: do not divide)\n");
    return rc;
}

/* --forward-only: run the forward-only program of *s instead (*s replaced, or freed on an error) */
static int forward_only(bg_schedule_t **s)
{
    bg_schedule_t *f = NULL;
    bg_status_t st = bg_schedule_forward_only(*s, &f);
    bg_schedule_free(*s);
    *s = f;
    return st != BG_OK ? bg_cli_status(CMD, st) : 0;
}

static int cmd_main(int argc, char **argv, bg_sim_params_t *spp)
{
    const char *kind_s = NULL, *json_out = NULL, *svg_out = NULL, *from = NULL, *profile = NULL;
    long long p = 0, m = 0, v = 0;
    int have_p = 0, have_m = 0, compare = 0, text = -1, autos = 0, nsplit = 0, have_limit = 0, from_torch = 0, fwd = 0;
    int exact = 0;
    const char *mem_limit_s = NULL; /* --exact reads it as a number of stage-microbatches, fractions too */
    long long max_nodes = 10000000LL;
    static int split[4096];
    double mem_limit = 0;
    unsigned tflags = 0;
    uint64_t bytes;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--schedule")) {
            if (!val)
                return bg_cli_fail(CMD, "--schedule needs a value (gpipe, 1f1b, interleaved, zb-h1, zb-h2, zbv, zb-interleaved, "
                                        "dualpipev, dualpipe)");
            kind_s = val, i++;
        } else if (!strcmp(a, "--stages")) {
            if (bg_cli_int(CMD, a, val, 1, 65536, &p))
                return 2;
            have_p = 1, i++;
        } else if (!strcmp(a, "--microbatches")) {
            if (bg_cli_int(CMD, a, val, 1, 1 << 22, &m))
                return 2;
            have_m = 1, i++;
        } else if (!strcmp(a, "--chunks")) {
            if (bg_cli_int(CMD, a, val, 1, 64, &v))
                return 2;
            i++;
        } else if (!strcmp(a, "--costs")) {
            if (parse_costs(val, &spp->f_cost, &spp->b_cost, &spp->w_cost))
                return 2;
            i++;
        } else if (!strcmp(a, "--f-costs") || !strcmp(a, "--b-costs") || !strcmp(a, "--w-costs")) {
            int k = a[2] == 'f' ? 0 : a[2] == 'b' ? 1 : 2;
            double **dst = k == 0 ? (double **)&spp->f_costs : k == 1 ? (double **)&spp->b_costs : (double **)&spp->w_costs;
            free(*dst);
            if (parse_list(a, val, dst, &stage_costs_n[k]))
                return 2;
            i++;
        } else if (!strcmp(a, "--latency")) {
            if (bg_cli_double(CMD, a, val, 0, 1e300, &spp->latency))
                return 2;
            i++;
        } else if (!strcmp(a, "--bandwidth")) {
            if (bg_cli_double(CMD, a, val, 0, 1e300, &spp->bandwidth))
                return 2;
            i++;
        } else if (!strcmp(a, "--act-bytes") || !strcmp(a, "--grad-bytes") || !strcmp(a, "--stash-bytes")) {
            if (bg_cli_bytes(CMD, a, val, &bytes))
                return 2;
            double *dst = a[2] == 'a' ? &spp->act_bytes : a[2] == 'g' ? &spp->grad_bytes : &spp->stash_bytes;
            *dst = (double)bytes;
            i++;
        } else if (!strcmp(a, "--json")) {
            if (!val)
                return bg_cli_fail(CMD, "--json needs an output file");
            json_out = val, i++;
        } else if (!strcmp(a, "--to-torch-csv")) {
            if (!val)
                return bg_cli_fail(CMD, "--to-torch-csv needs an output file");
            torch_csv_out = val, i++;
        } else if (!strcmp(a, "--from-torch-csv")) {
            if (!val)
                return bg_cli_fail(CMD, "--from-torch-csv needs a file");
            from = val, from_torch = 1, i++;
        } else if (!strcmp(a, "--sim-json")) {
            if (!val)
                return bg_cli_fail(CMD, "--sim-json needs an output file");
            sim_json_out = val, i++;
        } else if (!strcmp(a, "--svg")) {
            if (!val)
                return bg_cli_fail(CMD, "--svg needs an output file");
            svg_out = val, i++;
        } else if (!strcmp(a, "--from-json")) {
            if (!val)
                return bg_cli_fail(CMD, "--from-json needs a file");
            from = val, i++;
        } else if (!strcmp(a, "--compare")) {
            compare = 1;
        } else if (!strcmp(a, "--auto")) {
            autos = 1;
        } else if (!strcmp(a, "--exact")) {
            exact = 1;
        } else if (!strcmp(a, "--max-nodes")) {
            if (bg_cli_int(CMD, a, val, 1, (long long)1 << 50, &max_nodes))
                return 2;
            i++;
        } else if (!strcmp(a, "--profile")) {
            if (!val)
                return bg_cli_fail(CMD, "--profile needs a file (brigade profile --json FILE writes one)");
            profile = val, i++;
        } else if (!strcmp(a, "--mem-limit")) {
            if (!val)
                return bg_cli_fail(CMD, "--mem-limit needs a value");
            mem_limit_s = val, have_limit = 1, i++; /* bytes, or stage-microbatches with --exact: read below */
        } else if (!strcmp(a, "--split")) {
            long long tmp[4096];
            if (bg_cli_int_list(CMD, a, val, tmp, 4096, &nsplit))
                return 2;
            for (int k = 0; k < nsplit; k++) {
                if (tmp[k] < 1 || tmp[k] > 1 << 20)
                    return bg_cli_fail(CMD, "--split entry %d is %lld; every stage needs at least one layer", k, tmp[k]);
                split[k] = (int)tmp[k];
            }
            i++;
        } else if (!strcmp(a, "--forward-only")) {
            fwd = 1;
        } else if (!strcmp(a, "--comm")) {
            tflags |= BG_SCHED_TEXT_COMM;
        } else if (!strcmp(a, "--text")) {
            text = 1;
        } else if (!strcmp(a, "--no-text")) {
            text = 0;
        } else {
            static const char *const known[] = {"--schedule", "--stages", "--microbatches", "--chunks", "--costs",
                                                "--f-costs", "--b-costs", "--w-costs", "--latency", "--bandwidth",
                                                "--act-bytes", "--grad-bytes", "--stash-bytes", "--json", "--sim-json", "--svg",
                                                "--to-torch-csv", "--from-torch-csv",
                                                "--from-json", "--compare", "--comm", "--text", "--no-text",
                                                "--auto", "--profile", "--mem-limit", "--split", "--forward-only",
                                                "--exact", "--max-nodes",
                                                "--help", NULL};
            return bg_cli_unknown_option(CMD, a, known);
        }
    }
    if (fwd && (autos || compare))
        return bg_cli_fail(CMD, "--forward-only goes with --schedule or --from-json (one program)");
    if (mem_limit_s && exact && bg_cli_double(CMD, "--mem-limit", mem_limit_s, 0, 1e300, &mem_limit))
        return 2;
    if (mem_limit_s && !exact) {
        if (bg_cli_bytes(CMD, "--mem-limit", mem_limit_s, &bytes))
            return 2;
        mem_limit = (double)bytes;
    }
    if (exact) {
        if (!autos)
            return bg_cli_fail(CMD, "--exact belongs to --auto (brigade schedule --auto --exact ...)");
        if (profile || nsplit || kind_s || compare || from || v || stage_costs_n[0] || stage_costs_n[1] ||
            stage_costs_n[2])
            return bg_cli_fail(CMD, "--auto --exact takes --costs F,B,W per rank, --latency and --mem-limit "
                                    "(stage-microbatches); drop --profile, --split, --schedule, --compare, "
                                    "--from-json, --chunks and the per-stage costs");
        if (!have_p || !have_m)
            return bg_cli_fail(CMD, "--stages P and --microbatches M are required (try brigade schedule --help)");
        bg_exact_args_t ea = {.p = (int)p, .m = (int)m, .costs = spp, .mem_limit = mem_limit,
                              .max_nodes = max_nodes, .json_out = json_out, .svg_out = svg_out, .text = text};
        return bg_schedule_exact_cli(&ea);
    }
    if (autos || profile || have_limit || nsplit) {
        if (!autos)
            return bg_cli_fail(CMD, "%s belongs to --auto (the schedule search)",
                               profile ? "--profile" : have_limit ? "--mem-limit" : "--split");
        if (!profile)
            return bg_cli_fail(CMD, "--auto needs --profile PROFILE.json (brigade profile --json FILE writes one)");
        if (kind_s || compare || from || v || stage_costs_n[0] || stage_costs_n[1] || stage_costs_n[2] ||
            spp->f_cost != 1 || spp->b_cost != 1 || spp->w_cost != 1)
            return bg_cli_fail(CMD, "--auto searches every schedule with the profile's costs: drop --schedule, "
                                    "--compare, --from-json, --chunks and --costs/--f-costs/--b-costs/--w-costs");
        if (!have_p || !have_m)
            return bg_cli_fail(CMD, "--stages P and --microbatches M are required (try brigade schedule --help)");
        bg_auto_args_t aa = {.profile = profile, .p = (int)p, .m = (int)m, .mem_limit = mem_limit,
                             .split = nsplit ? split : NULL, .nsplit = nsplit, .link = spp,
                             .json_out = json_out, .svg_out = svg_out, .text = text};
        return bg_schedule_auto(&aa);
    }
    if (from) {
        if (kind_s || compare || have_p || have_m || v)
            return bg_cli_fail(CMD, "%s takes the schedule, stages, microbatches and chunks from the file; "
                                    "drop --schedule/--compare/--stages/--microbatches/--chunks",
                               from_torch ? "--from-torch-csv" : "--from-json");
        bg_schedule_t *s;
        if (!from_torch && bg_cli_check_json_object(CMD, from))
            return 1;
        bg_status_t st = from_torch ? bg_schedule_from_torch_csv_file(from, &s) : bg_schedule_from_json_file(from, &s);
        if (st != BG_OK)
            return bg_cli_status(CMD, st);
        int moved = 0; /* what a run does too (bg_schedule_load_program); the torch reader already did it */
        if ((st = bg_schedule_order_weights(s, &moved)) != BG_OK) {
            bg_schedule_free(s);
            return bg_cli_status(CMD, st);
        }
        if (moved)
            printf("note: %d weight gradients run after the one of the microbatch before them, not where %s "
                   "places them (weight gradients add up in microbatch order); simulated as they run\n", moved, from);
        int rc = fwd ? forward_only(&s) : 0;
        if (!rc)
            rc = bg_cli_schedule_run(s, spp, text, tflags, json_out, svg_out);
        bg_schedule_free(s);
        return rc;
    }
    if (!have_p || !have_m)
        return bg_cli_fail(CMD, "--stages P and --microbatches M are required (try brigade schedule --help)");
    if (compare) {
        if (kind_s || json_out || svg_out)
            return bg_cli_fail(CMD, "--compare runs every schedule; it takes no --schedule, --json or --svg");
        if (stage_costs_n[0] || stage_costs_n[1] || stage_costs_n[2])
            return bg_cli_fail(CMD, "--compare runs schedules with different stage counts: use --costs, not per-stage costs");
        return run_compare((int)p, (int)m, (int)v, spp);
    }
    if (!kind_s)
        return bg_cli_fail(CMD, "--schedule is required (gpipe, 1f1b, interleaved, zb-h1, zb-h2, zbv, zb-interleaved, "
                                "dualpipev or dualpipe), "
                                "or use --compare or --from-json");
    bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
    int k = bg_cli_choice(CMD, "--schedule", kind_s, bg_cli_schedule_names());
    if (k < 0)
        return 2;
    gp.kind = (bg_schedule_kind_t)k;
    gp.stages = (int)p, gp.microbatches = (int)m, gp.chunks = (int)v;
    bg_schedule_t *s;
    /* the program is built for the costs it will be simulated with; the
     * per-stage lists must match its stage count first */
    bg_status_t st = bg_schedule_generate(&gp, &s);
    if (st == BG_OK) {
        int rc = check_stage_costs(s);
        bg_schedule_free(s);
        if (rc)
            return rc;
        gp.costs = spp;
        st = bg_schedule_generate(&gp, &s);
    }
    if (st != BG_OK) { /* the flags ask for a schedule that cannot exist: a usage error */
        bg_cli_status(CMD, st);
        return 2;
    }
    int rc = fwd ? forward_only(&s) : 0;
    if (!rc)
        rc = bg_cli_schedule_run(s, spp, text, tflags, json_out, svg_out);
    bg_schedule_free(s);
    return rc;
}

int bg_cmd_schedule(int argc, char **argv)
{
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    int rc = cmd_main(argc, argv, &sp);
    free((double *)sp.f_costs);
    free((double *)sp.b_costs);
    free((double *)sp.w_costs);
    return rc;
}
