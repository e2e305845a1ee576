/* tools/cmd_plan.c: `brigade plan`: how to split a model over devices, why,
 * and what it will cost (or, when it cannot fit, by how much). Parses the
 * flags, calls bg_plan_search() and prints the best plan's stages and the top
 * layouts; --json writes the plan `brigade train --plan` runs. `--bench`
 * times the partitioner and the search at scale. All logic lives in
 * partitioner/ through include/brigade/partitioner.h. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string.h>

#include "brigade/partitioner.h"
#include "tools/cli.h"
#include "tools/measure.h"

#define CMD "plan"
#define MAX_DEV 65536

static void usage(FILE *f)
{
    fprintf(f,
            "usage: brigade plan [model] --devices N --mem SIZE[,SIZE...] [--speed X[,X...]] [training] [options]\n\n"
            "Splits the model into contiguous pipeline stages that fit each device (exact: minimises the slowest\n"
            "stage), searches pipeline x data-parallel layouts, microbatch counts and schedules, simulates each\n"
            "and prints the best plan's stages and the top layouts. When nothing fits it says which stage and\n"
            "layer are too big, by how much, and the smallest budget and device count that fit.\n\n"
            "model (as brigade train):\n" BG_CLI_MODEL_HELP
            "devices:\n"
            "  --devices N        device count (the world size)\n"
            "  --mem LIST         memory budget: one size for all (24G) or one per device (80G,80G,40G,40G)\n"
            "  --speed LIST       relative speeds, one for all or one per device (default 1)\n"
            "  --flops X          FLOP/s of a speed-1 device (default 1e12: a guess, not this machine; without\n"
            "                     --flops or --measure the predicted times are uncalibrated and say so)\n"
            "  --link-bw SIZE     link bandwidth in bytes per second (default 10G; 0 = infinite)\n"
            "  --link-latency T   per message: 5us, 0.2ms, 1e-6 (seconds) (default 5us)\n"
            "  --host-bw SIZE     a device's link to its host memory in bytes per second, which offload's\n"
            "                     transfers take, none assumed hidden (default 25e9 bytes/s, about a PCIe 4.0\n"
            "                     x16 link's; with --measure on a cpu backend 0; 0 = infinite: the store is\n"
            "                     the device's own memory, as on the cpu backend)\n"
            "training:\n"
            "  --batch B          global batch in sequences (default 8)\n"
            "  --microbatch-size b  sequences per microbatch per replica (default: searched)\n"
            "  --schedule LIST    schedules to consider, comma-separated, or all (default all)\n"
            "  --pp N             fix the pipeline depth (default: searched)\n"
            "  --tp N|all         tensor-parallel degree: N only, or every degree dividing the devices\n"
            "                     (default: 1, and when no layout fits at 1 the smallest degree that\n"
            "                     fits, said so)\n"
            "  --cp N|auto        context-parallel degree (default 1): every sequence split over N devices\n"
            "                     (pp x dp groups of N x tp; --seq divisible by 2N), each member's layers\n"
            "                     counted at seq / N with the ring's traffic; auto: 1, and when nothing\n"
            "                     fits at 1 the smallest degree that fits, said so (GPT and Llama; not\n"
            "                     with --measure)\n"
            "  --sequence-parallel  GPT: plan tp > 1 with sequence parallelism (brigade train\n"
            "                     --sequence-parallel): activations between blocks split along the sequence;\n"
            "                     without it, SP is used only where a degree does not fit otherwise\n"
            "  --chunks V         chunks per rank for interleaved (default: the schedule's)\n"
            "  --optimizer adamw|sgd  (state bytes per parameter: 8 or 4; default adamw)\n"
            "  --zero 0|1|2|3|auto  count optimizer state (1), gradients (2) and parameters (3) sharded 1/dp\n"
            "                     (brigade train --zero); auto: per layout the fastest stage that fits (the\n"
            "                     lowest, except with offload, whose transfers shrink to the shard) (default 0)\n"
            "  --offload WHAT     none, or brigade train's --offload value: optimizer counts the optimizer\n"
            "                     state (its shard under --zero) outside the device budgets (host memory or\n"
            "                     files); optimizer,params: at --zero 3 the parameter shard too;\n"
            "                     activations (alone or after either): the stashed activations off the\n"
            "                     devices between a microbatch's forward and backward (the replay's points,\n"
            "                     BRIGADE_OFFLOAD_ACT_AHEAD), each moved out and back over --host-bw; auto:\n"
            "                     per layout, the fastest choice that fits, the transfers counted, activations\n"
            "                     only where nothing fits without them (default none)\n"
            "  --recompute        allow activation recomputation where needed to fit\n"
            "output:\n"
            "  --top N            layouts to list (default 5)\n"
            "  --choices          at the best layout, every sharding stage x offload x recomputation: its\n"
            "                     predicted peak, step (and of it the offload transfers) and whether it fits\n"
            "                     (shown with --zero/--offload auto)\n"
            "  --json FILE        write the best plan (docs/partitioner.md) for brigade train --plan\n"
            "  --measure          time every layer's forward and backward on this machine (--backend, default\n"
            "                     cpu; --threads N as brigade train) for the microbatch size and plan with those\n"
            "                     times (speed 1 = this machine); for tp > 1 the tp build's layers on a group of\n"
            "                     tp processes with their collectives (the degrees the search takes), with as\n"
            "                     many processes running beside as the plan has ranks (sharing the cores when\n"
            "                     they outnumber them, which it says)\n"
            "  --host-ranks N     with --measure: how many of the plan's ranks run on this machine (default: all)\n"
            "  --bench            time the partitioner (1000 layers) and the search (1024 devices)\n");
}

static int parse_list_double(const char *flag, const char *s, double *out, int max, int *n_p)
{
    if (!s || !*s)
        return bg_cli_fail(CMD, "%s needs a value", flag), -1;
    int n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        if (n >= max)
            return bg_cli_fail(CMD, "%s: more than %d entries", flag, max), -1;
        double v = strtod(p, &end);
        if (errno || end == p || !isfinite(v) || (*end && *end != ','))
            return bg_cli_fail(CMD, "%s: entry %d of \"%s\" is not a number", flag, n, s), -1;
        if (!(v > 0))
            return bg_cli_fail(CMD, "%s: entry %d is %g; speeds must be > 0", flag, n, v), -1;
        out[n++] = v;
        if (!*end)
            break;
        p = end + 1;
    }
    *n_p = n;
    return 0;
}

/* "5us", "0.2ms", "1e-6", "2s" -> seconds */
static int parse_time(const char *flag, const char *s, double *out)
{
    char *end;
    errno = 0;
    if (!s)
        return bg_cli_fail(CMD, "%s needs a value", flag), -1;
    double v = strtod(s, &end);
    double mul = 1;
    if (!strcmp(end, "s") || !*end)
        mul = 1;
    else if (!strcmp(end, "ms"))
        mul = 1e-3;
    else if (!strcmp(end, "us"))
        mul = 1e-6;
    else if (!strcmp(end, "ns"))
        mul = 1e-9;
    else
        mul = -1;
    if (errno || end == s || mul < 0 || !isfinite(v) || v < 0)
        return bg_cli_fail(CMD, "%s expects a time >= 0 like 5us, 0.2ms or 1e-6, got \"%s\"", flag, s), -1;
    *out = v * mul;
    return 0;
}

/* "10G", "500M" -> bytes per second; "0" -> 0 (infinite) */
static int parse_bandwidth(const char *flag, const char *s, double *out)
{
    uint64_t bw = 0;
    if ((!s || strcmp(s, "0")) && bg_cli_bytes(CMD, flag, s, &bw))
        return -1;
    *out = (double)bw;
    return 0;
}

/* --schedule all, or a comma-separated list of schedule names: 0, or 2 after a message */
static int check_schedules(const char *s)
{
    char buf[256];
    if (!strcmp(s, "all"))
        return 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
        if (bg_cli_choice(CMD, "--schedule", tok, bg_cli_schedule_names()) < 0)
            return 2;
    return 0;
}

static const char *gib(char *buf, size_t n, double b)
{
    if (b >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else
        snprintf(buf, n, "%.1f MiB", b / (1024.0 * 1024));
    return buf;
}

/* calibrated: the layer times were measured (--measure) or the device speed given (--flops) */
static void print_plan(const bg_plan_t *p, int calibrated, bg_optim_kind_t optim)
{
    char a[32], b[32];
    char cps[24] = "";
    if (bg_plan_cp(p) > 1)
        snprintf(cps, sizeof cps, " x cp %d", bg_plan_cp(p));
    printf("best plan: pp %d x dp %d%s x tp %d = %d devices, schedule %s", bg_plan_pp(p), bg_plan_dp(p), cps,
           bg_plan_tp(p), bg_plan_world(p), bg_plan_schedule(p));
    if (bg_plan_chunks(p) > 1)
        printf(" (%d chunks per rank)", bg_plan_chunks(p));
    printf(", %d microbatches of %d", bg_plan_microbatches(p), bg_plan_microbatch_size(p));
    if (bg_plan_zero(p))
        printf(", --zero %d", bg_plan_zero(p));
    if (*bg_plan_offload_name(p))
        printf(", --offload %s", bg_plan_offload_name(p));
    printf("\n");
    printf("predicted%s: step %.3f ms, bubble %.1f %%, %.0f tokens/s%s\n", calibrated ? "" : " (UNCALIBRATED)",
           bg_plan_step_ms(p), 100.0 * bg_plan_bubble(p), bg_plan_tokens_per_s(p),
           bg_plan_recompute(p) ? "; recomputes activations on the stages marked (not yet run by the executor)"
                                : "");
    if (*bg_plan_offload_name(p))
        printf("  of the step, %.3f ms are the offload's transfers over the host link (none assumed hidden)\n",
               bg_plan_offload_ms(p));
    if (!calibrated)
        printf("  times assume 1e12 FLOP/s per speed-1 device, not a measurement of this machine, so the\n"
               "  milliseconds (and the balance of compute against the links) may be far off.\n"
               "  --measure --microbatch-size N times this machine's layers (seconds); --flops X sets the speed.\n");
    printf("\n");
    printf("%5s %4s %5s  %-34s %12s  %-25s %6s  %10s  %s\n", "stage", "rank", "chunk", "layers", "parameters",
           "memory / budget", "use", "ms/microb", "recompute");
    for (int i = 0; i < bg_plan_num_stages(p); i++) {
        const bg_plan_stage_t *s = bg_plan_stage(p, i);
        char layers[64], mem[96];
        snprintf(layers, sizeof(layers), "%d..%d (%d)", s->first_layer, s->last_layer,
                 s->last_layer - s->first_layer + 1);
        snprintf(mem, sizeof(mem), "%s / %s", gib(a, sizeof(a), (double)s->predicted_peak_bytes),
                 gib(b, sizeof(b), (double)s->budget_bytes));
        printf("%5d %4d %5d  %-34s %12zu  %-25s %5.1f%%  %10.3f  %s\n", i, s->rank, s->chunk, layers, s->params, mem,
               100.0 * (double)s->predicted_peak_bytes / (double)s->budget_bytes, s->predicted_ms_per_microbatch,
               s->recompute ? "yes" : "no");
    }
    if (bg_plan_offload(p)) { /* what the budgets above leave out */
        size_t d = bg_plan_zero(p) ? (size_t)bg_plan_dp(p) : 1;
        size_t per = bg_optim_state_bytes(optim) + (bg_plan_offload(p) >= 2 ? 4 : 0); /* + the parameter shard */
        printf("%s offloaded (host memory or --offload-dir, outside the budgets above):",
               bg_plan_offload(p) >= 2 ? "optimizer state and parameter shard" : "optimizer state");
        for (int i = 0; i < bg_plan_num_stages(p); i++)
            printf("%s stage %d %s", i ? "," : "", i,
                   gib(a, sizeof(a), (double)((bg_plan_stage(p, i)->params * per + d - 1) / d)));
        printf("\n");
    }
    if (!strcmp(bg_plan_schedule(p), "dualpipe"))
        printf("(dualpipe: two copies of the model; stage k above is copy 0's, chunk 0 of rank k; copy 1's is\n"
               " chunk 1 of rank %d-k: the per-rank memory below counts both)\n", bg_plan_pp(p) - 1);
    if (bg_plan_chunks(p) > 1) {
        printf("\nper pipeline rank (all chunks):\n");
        for (int r = 0; r < bg_plan_pp(p); r++)
            printf("  rank %d: %s / %s\n", r, gib(a, sizeof(a), (double)bg_plan_rank_peak_bytes(p, r)),
                   gib(b, sizeof(b), (double)bg_plan_rank_budget_bytes(p, r)));
    }
    int split[4096];
    int n = bg_plan_split(p, split, 4096);
    printf("\nrun it: brigade launch -n %d -- brigade train ... --pp %d --dp %d --schedule %s", bg_plan_world(p),
           bg_plan_pp(p), bg_plan_dp(p), bg_plan_schedule(p));
    if (bg_plan_cp(p) > 1)
        printf(" --cp %d", bg_plan_cp(p));
    if (bg_plan_tp(p) > 1)
        printf(" --tp %d%s", bg_plan_tp(p), bg_plan_sequence_parallel(p) ? " --sequence-parallel" : "");
    if (bg_plan_chunks(p) > 1 && strcmp(bg_plan_schedule(p), "zbv"))
        printf(" --chunks %d", bg_plan_chunks(p));
    if (bg_plan_zero(p))
        printf(" --zero %d", bg_plan_zero(p));
    if (*bg_plan_offload_name(p))
        printf(" --offload %s", bg_plan_offload_name(p));
    printf(" --batch %d --microbatches %d --split ", bg_plan_batch(p), bg_plan_microbatches(p));
    for (int i = 0; i < n && i < 4096; i++)
        printf("%s%d", i ? "," : "", split[i]);
    printf("\n   (or brigade train --plan FILE with --json FILE)\n");
}

static void print_top(const bg_plan_set_t *set)
{
    char a[32], b[32];
    printf("\ntop layouts (%d evaluated):\n", bg_plan_set_evaluated(set));
    printf("%3s %4s %4s %3s %-12s %5s %6s %12s %8s %14s  %s\n", "#", "pp", "dp", "tp", "schedule", "m", "mb", "step ms",
           "bubble", "tokens/s", "max memory / budget");
    for (int i = 0; i < bg_plan_set_count(set); i++) {
        const bg_plan_t *p = bg_plan_set_get(set, i);
        double worst = -1;
        int wr = 0;
        for (int r = 0; r < bg_plan_pp(p); r++) {
            double u = (double)bg_plan_rank_peak_bytes(p, r) / (double)bg_plan_rank_budget_bytes(p, r);
            if (u > worst)
                worst = u, wr = r;
        }
        char with[112];
        snprintf(with, sizeof with, "%s%.0d%s%s%.0d%s%s", bg_plan_cp(p) > 1 ? " cp " : "", bg_plan_cp(p) > 1 ? bg_plan_cp(p) : 0,
                 bg_plan_recompute(p) ? " recompute" : "",
                 bg_plan_zero(p) ? " zero " : "", bg_plan_zero(p), *bg_plan_offload_name(p) ? " offload " : "",
                 bg_plan_offload_name(p));
        printf("%3d %4d %4d %3d %-12s %5d %6d %12.3f %7.1f%% %14.0f  %s / %s (rank %d)%s\n", i + 1, bg_plan_pp(p),
               bg_plan_dp(p), bg_plan_tp(p), bg_plan_schedule(p), bg_plan_microbatches(p), bg_plan_microbatch_size(p),
               bg_plan_step_ms(p), 100.0 * bg_plan_bubble(p), bg_plan_tokens_per_s(p),
               gib(a, sizeof(a), (double)bg_plan_rank_peak_bytes(p, wr)),
               gib(b, sizeof(b), (double)bg_plan_rank_budget_bytes(p, wr)), wr, with);
    }
}


/* The largest per-rank predicted peak of plan p. */
static uint64_t plan_peak(const bg_plan_t *p)
{
    uint64_t m = 0;
    for (int r = 0; r < bg_plan_pp(p); r++)
        if (bg_plan_rank_peak_bytes(p, r) > m)
            m = bg_plan_rank_peak_bytes(p, r);
    return m;
}

/* The memory choices at the best plan's layout (its pp, dp, tp, microbatch
 * size and schedule): each sharding stage (dp > 1), offload (the list the
 * planner knows: none, optimizer, optimizer+params at stage 3, each with
 * and without the activations where pp > 1) and
 * recomputation (when allowed), searched again with that choice fixed: its
 * largest per-rank predicted peak, predicted step and whether it fits the
 * smallest budget given. A choice that does not fit is searched without a
 * budget for its peak; with recomputation allowed it fits or is left "-". */
static void print_choices(const bg_plan_params_t *pa, const bg_plan_t *best)
{
    uint64_t cap = pa->mem[0], none = UINT64_MAX / 4;
    for (int i = 1; i < pa->nmem; i++)
        if (pa->mem[i] < cap)
            cap = pa->mem[i];
    char sched[32], a[32], hbs[32] = "infinite bandwidth";
    snprintf(sched, sizeof sched, "%s", bg_plan_schedule(best));
    if (pa->host_bandwidth > 0)
        snprintf(hbs, sizeof hbs, "%.3g bytes/s", pa->host_bandwidth);
    printf("\nmemory choices at this layout (pp %d x dp %d x tp %d, %s; peak: the largest rank's predicted):\n",
           bg_plan_pp(best), bg_plan_dp(best), bg_plan_tp(best), sched);
    printf("%5s %-28s %9s %14s %12s %12s  %s\n", "zero", "offload", "recompute", "peak bytes", "step ms",
           "offload ms", "fits");
    int zmax = bg_plan_dp(best) > 1 ? 3 : 0, na = bg_plan_pp(best) > 1 ? 2 : 1; /* pp 1 moves no stash */
    for (int z = 0; z <= zmax; z++)
        for (int oa = 0; oa < (z == 3 ? 3 : 2) * na; oa++) /* offload o = oa / na, activations oa % na */
            for (int r = 0; r <= (pa->allow_recompute ? 1 : 0); r++) {
                int o = oa / na;
                const char *name = oa ? bg_plan_offload_choice_name(o, oa % na) : "none";
                bg_plan_params_t q = *pa;
                q.pp = bg_plan_pp(best);
                q.tp = bg_plan_tp(best);
                q.microbatch_size = bg_plan_microbatch_size(best);
                q.schedules = sched;
                q.chunks = bg_plan_chunks(best);
                q.zero = z;
                q.offload = o;
                q.offload_activations = oa % na;
                q.top = 1;
                q.allow_recompute = r;
                q.mem = &none; /* unbounded: the choice's own peak, without recomputation */
                q.nmem = 1;
                bg_plan_set_t *set = NULL;
                int fits = 0;
                if (bg_plan_search(&q, &set) != BG_OK) {
                    bg_plan_set_free(set);
                    continue; /* no such layout for this choice */
                }
                const bg_plan_t *p = bg_plan_set_get(set, 0);
                fits = plan_peak(p) <= cap;
                if (!fits && r) { /* recomputation is chosen by the partitioner only under a budget */
                    bg_plan_set_t *set2 = NULL;
                    q.mem = pa->mem;
                    q.nmem = pa->nmem;
                    if (bg_plan_search(&q, &set2) == BG_OK) {
                        bg_plan_set_free(set);
                        set = set2;
                        p = bg_plan_set_get(set, 0);
                        fits = 1;
                    } else {
                        bg_plan_set_free(set2);
                        p = NULL;
                    }
                }
                if (p)
                    printf("%5d %-28s %9s %14llu %12.3f %12.3f  %s\n", z, name, r ? "allowed" : "no",
                           (unsigned long long)plan_peak(p), bg_plan_step_ms(p), bg_plan_offload_ms(p),
                           fits ? "yes" : "no");
                else
                    printf("%5d %-28s %9s %14s %12s %12s  no\n", z, name, "allowed", "-", "-", "-");
                bg_plan_set_free(set);
            }
    printf("(budget: %llu bytes (%s) per device, the smallest given; offload ms: of the step, the transfers "
           "over the host link at %s)\n", (unsigned long long)cap, gib(a, sizeof a, (double)cap), hbs);
}

static double now_s(void) { return bg_now(); }

/* --measure at tensor-parallel degree tp > 1: the model of `mc` built for tp,
 * its layers timed on a group of tp processes (tools/measure.c), into times
 * entry *e, whose arrays come from one malloc (*buf_p). 0; 1 after a message;
 * -1 when the model has no build for tp (sizes tp does not divide: the search
 * skips that degree too). */
static int measure_tp(const bg_model_config_t *mc, int n, const char *backend, int threads, int ranks, int tp, int sp,
                      bg_optim_kind_t optim, bg_plan_layer_times_t *e, double **buf_p)
{
    bg_model_config_t c = *mc;
    c.tp = tp;
    c.sequence_parallel = sp;
    bg_model_desc_t *d = NULL;
    if (bg_model_build(&c, &d) != BG_OK)
        return -1;
    int L = bg_model_desc_num_layers(d);
    double *buf = malloc((size_t)L * 6 * sizeof(double));
    if (!buf) {
        bg_model_desc_destroy(d);
        return bg_cli_fail(CMD, "out of memory");
    }
    int rc = bg_cli_measure_layers(CMD, d, n, bg_model_desc_params(d)->seq_len, backend, threads, ranks, tp, optim,
                                   buf, buf + L, buf + 2 * L, buf + 3 * L, buf + 5 * L, buf + 4 * L, &L);
    bg_model_desc_destroy(d);
    if (rc) {
        free(buf);
        return 1;
    }
    *e = (bg_plan_layer_times_t){.tp = tp, .fwd_s = buf, .bwd_s = buf + L, .b_s = buf + 2 * L, .w_s = buf + 3 * L,
                                 .tp_s = buf + 4 * L, .sequence_parallel = sp, .opt_s = buf + 5 * L};
    *buf_p = buf;
    return 0;
}

/* Has degree tp, with sequence parallelism sp or without, been measured (an entry of times)? */
static int measured_at(const bg_plan_layer_times_t *times, int n, int tp, int sp)
{
    for (int k = 0; k < n; k++)
        if (times[k].tp == tp && times[k].sequence_parallel == sp)
            return 1;
    return 0;
}

static int bench(void)
{
    printf("partitioner benchmark (exact pruned DP; wall time of one bg_partition call)\n");
    printf("%7s %7s %-14s %10s %12s\n", "layers", "stages", "devices", "ms", "bottleneck");
    int L = 1000;
    bg_part_layer_t *ly = calloc((size_t)L, sizeof(*ly));
    bg_part_stage_spec_t *sp = calloc(1024, sizeof(*sp));
    bg_part_counts_t *cnt = calloc(1024, sizeof(*cnt));
    bg_part_stage_t *out = calloc(1024, sizeof(*out));
    if (!ly || !sp || !cnt || !out)
        return bg_cli_fail(CMD, "out of memory");
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < L; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double r = (double)(x % 1000) / 1000.0;
        ly[i].params = 1000000 + (size_t)(r * 4e6);
        ly[i].stash_bytes = 4000000 + (size_t)(r * 8e6);
        ly[i].wstash_bytes = ly[i].stash_bytes / 2;
        ly[i].output_bytes = 1 << 20;
        ly[i].fwd_time = 1e-3 * (0.5 + r);
        ly[i].bwd_time = 2e-3 * (0.5 + r);
    }
    int counts[] = {8, 64, 512, 1000};
    for (int ci = 0; ci < 4; ci++) {
        for (int het = 0; het < 2; het++) {
            int S = counts[ci];
            for (int s = 0; s < S; s++) {
                cnt[s] = (bg_part_counts_t){S - s, S - s, S - s - 1 > 0 ? S - s - 1 : 0, 1, 2, 0, 0, 0};
                sp[s].speed = het ? (s % 2 ? 0.5 : 1.0) : 1.0;
                sp[s].budget_bytes = (size_t)(het && s % 2 ? 40.0 : 80.0) * (1ull << 30);
                sp[s].ncounts = 1;
                sp[s].counts = &cnt[s];
            }
            bg_part_problem_t p = BG_PART_PROBLEM_INIT;
            p.nlayers = L;
            p.layers = ly;
            p.nstages = S;
            p.stages = sp;
            p.link_latency = 5e-6;
            p.link_bandwidth = 10e9;
            p.allow_recompute = 1;
            double bn = 0, t0 = now_s();
            bg_status_t st = bg_partition(&p, out, &bn);
            double dt = now_s() - t0;
            printf("%7d %7d %-14s %10.2f %12s\n", L, S, het ? "80G/1,40G/0.5" : "80G/1", dt * 1e3,
                   st == BG_OK ? "ok" : bg_status_string(st));
        }
    }
    free(ly);
    free(sp);
    free(cnt);
    free(out);

    printf("\nplan search benchmark: GPT with 997 blocks (1000 layers), 1024 devices of 80G, batch 1024, microbatch 1\n");
    bg_model_config_t mc = BG_MODEL_CONFIG_INIT;
    mc.layers = 997;
    mc.d_model = 1024;
    mc.heads = 16;
    mc.seq_len = 512;
    bg_model_desc_t *desc = NULL;
    bg_status_t st = bg_model_build(&mc, &desc);
    if (st != BG_OK)
        return bg_cli_status(CMD, st);
    bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
    pp.model = desc;
    pp.world = 1024;
    uint64_t mem = 80ull << 30;
    pp.mem = &mem;
    pp.nmem = 1;
    pp.batch = 1024;
    pp.microbatch_size = 1;
    pp.schedules = "1f1b";
    double t0 = now_s();
    bg_plan_set_t *set = NULL;
    st = bg_plan_search(&pp, &set);
    double dt = now_s() - t0;
    if (st != BG_OK) {
        bg_model_desc_destroy(desc);
        return bg_cli_status(CMD, st);
    }
    const bg_plan_t *b = bg_plan_set_get(set, 0);
    printf("  1f1b only: %d layouts evaluated in %.3f s; best pp %d dp %d m %d, step %.2f ms\n",
           bg_plan_set_evaluated(set), dt, bg_plan_pp(b), bg_plan_dp(b), bg_plan_microbatches(b), bg_plan_step_ms(b));
    bg_plan_set_free(set);
    pp.schedules = NULL;
    t0 = now_s();
    st = bg_plan_search(&pp, &set);
    dt = now_s() - t0;
    bg_model_desc_destroy(desc);
    if (st != BG_OK)
        return bg_cli_status(CMD, st);
    b = bg_plan_set_get(set, 0);
    printf("  all schedules: %d layouts evaluated in %.3f s; best pp %d dp %d %s m %d, step %.2f ms\n",
           bg_plan_set_evaluated(set), dt, bg_plan_pp(b), bg_plan_dp(b), bg_plan_schedule(b),
           bg_plan_microbatches(b), bg_plan_step_ms(b));
    bg_plan_set_free(set);
    return 0;
}

int bg_cmd_plan(int argc, char **argv)
{
    bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
    bg_model_config_t mc = BG_MODEL_CONFIG_INIT; /* the model flags; the planner gets its description */
    static uint64_t mem[MAX_DEV];
    static double speed[MAX_DEV];
    int nmem = 0, nspeed = 0, have_devices = 0, do_bench = 0, do_measure = 0, threads = 0, have_flops = 0;
    int host_ranks = 0; /* --host-ranks; 0: all the devices */
    int show_choices = 0; /* --choices (and --zero auto, --offload auto): the memory choices' table */
    int have_host_bw = 0; /* --host-bw given (else 25G, or 0 when --measure times a cpu backend) */
    const char *json_path = NULL, *mem_arg = NULL, *speed_arg = NULL, *backend = "cpu";
    static double mfwd[4096], mbwd[4096], mbs[4096], mws[4096], mopt[4096];
    enum { MAX_TP_TIMES = 16 };
    bg_plan_layer_times_t tp_times[MAX_TP_TIMES];
    double *tp_bufs[MAX_TP_TIMES];
    int ntp = 0;
    enum { O_DEVICES = 256, O_MEM, O_SPEED,
           O_FLOPS, O_LINKBW, O_LINKLAT, O_BATCH, O_MBS, O_SCHED, O_PP, O_TP, O_CHUNKS, O_OPT, O_RECOMP, O_TOP, O_JSON,
           O_BENCH, O_HELP, O_MEASURE, O_BACKEND, O_THREADS, O_ZERO, O_SP, O_HOST_RANKS, O_OFFLOAD, O_CP, O_CHOICES, O_HOSTBW };
    static const struct option opts[] = {
        BG_CLI_MODEL_OPTIONS,
        {"devices", required_argument, 0, O_DEVICES}, {"mem", required_argument, 0, O_MEM},
        {"speed", required_argument, 0, O_SPEED},     {"flops", required_argument, 0, O_FLOPS},
        {"link-bw", required_argument, 0, O_LINKBW},  {"link-latency", required_argument, 0, O_LINKLAT},
        {"batch", required_argument, 0, O_BATCH},     {"microbatch-size", required_argument, 0, O_MBS},
        {"schedule", required_argument, 0, O_SCHED},  {"pp", required_argument, 0, O_PP}, {"tp", required_argument, 0, O_TP},
        {"chunks", required_argument, 0, O_CHUNKS},   {"optimizer", required_argument, 0, O_OPT},
        {"recompute", no_argument, 0, O_RECOMP},      {"top", required_argument, 0, O_TOP},
        {"json", required_argument, 0, O_JSON},       {"bench", no_argument, 0, O_BENCH},
        {"help", no_argument, 0, O_HELP},             {"measure", no_argument, 0, O_MEASURE},
        {"backend", required_argument, 0, O_BACKEND}, {"threads", required_argument, 0, O_THREADS},
        {"host-ranks", required_argument, 0, O_HOST_RANKS},
        {"zero", required_argument, 0, O_ZERO},        {"offload", required_argument, 0, O_OFFLOAD},        {"sequence-parallel", no_argument, 0, O_SP},
        {"cp", required_argument, 0, O_CP},           {"choices", no_argument, 0, O_CHOICES},
        {"host-bw", required_argument, 0, O_HOSTBW},
        {0, 0, 0, 0}};
    long long v;
    double d;
    int o;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
#define INT_FLAG(code, flag, lo, hi, dst) BG_CLI_INT_CASE(CMD, code, flag, lo, hi, dst)
            INT_FLAG(O_BATCH, "--batch", 1, 1 << 24, pp.batch)
            INT_FLAG(O_MBS, "--microbatch-size", 1, 1 << 24, pp.microbatch_size)
            INT_FLAG(O_PP, "--pp", 1, 1 << 16, pp.pp)
        case O_TP:
            if (strcmp(optarg, "all") == 0) {
                pp.tp = BG_PLAN_TP_ALL;
                break;
            }
            if (bg_cli_int(CMD, "--tp", optarg, 1, 4096, &v))
                return 2;
            pp.tp = (int)v;
            break;
            INT_FLAG(O_CHUNKS, "--chunks", 1, 64, pp.chunks)
            INT_FLAG(O_TOP, "--top", 1, 1000, pp.top)
#undef INT_FLAG
        case O_DEVICES:
            if (bg_cli_int(CMD, "--devices", optarg, 1, MAX_DEV, &v))
                return 2;
            pp.world = (int)v;
            have_devices = 1;
            break;
        case O_MEM:
            mem_arg = optarg;
            break;
        case O_SPEED:
            speed_arg = optarg;
            break;
        case O_FLOPS:
            if (bg_cli_double(CMD, "--flops", optarg, 1e-300, 1e300, &d))
                return 2;
            pp.flops = d;
            have_flops = 1;
            break;
        case O_LINKBW:
            if (parse_bandwidth("--link-bw", optarg, &pp.link_bandwidth))
                return 2;
            break;
        case O_HOSTBW:
            if (parse_bandwidth("--host-bw", optarg, &pp.host_bandwidth))
                return 2;
            have_host_bw = 1;
            break;
        case O_LINKLAT:
            if (parse_time("--link-latency", optarg, &pp.link_latency))
                return 2;
            break;
        case O_SCHED:
            if (check_schedules(optarg))
                return 2;
            pp.schedules = optarg;
            break;
        case O_OPT: {
            static const char *const optims[] = {"adamw", "sgd", NULL};
            int k = bg_cli_choice(CMD, "--optimizer", optarg, optims);
            if (k < 0)
                return 2;
            pp.optim = k == 0 ? BG_OPTIM_ADAMW : BG_OPTIM_SGD;
            break;
        }
        case O_RECOMP:
            pp.allow_recompute = 1;
            break;
        case O_OFFLOAD: { /* the table's [offload][activations], then auto: both chosen */
            static const char *const offs[] = {"none", "activations", "optimizer", "optimizer,activations",
                                               "optimizer,params", "optimizer,params,activations", "auto", NULL};
            int k = bg_cli_choice(CMD, "--offload", optarg, offs);
            if (k < 0)
                return 2;
            pp.offload = k == 6 ? BG_PLAN_OFFLOAD_AUTO : k / 2;
            pp.offload_activations = k == 6 ? BG_PLAN_OFFLOAD_AUTO : k % 2;
            break;
        }
        case O_ZERO: {
            static const char *const zeros[] = {"0", "1", "2", "3", "auto", NULL};
            int k = bg_cli_choice(CMD, "--zero", optarg, zeros);
            if (k < 0)
                return 2;
            pp.zero = k == 4 ? BG_PLAN_ZERO_AUTO : k;
            break;
        }
        case O_JSON:
            json_path = optarg;
            break;
        case O_BENCH:
            do_bench = 1;
            break;
        case O_MEASURE:
            do_measure = 1;
            break;
        case O_BACKEND:
            backend = optarg;
            break;
        case O_THREADS:
            if (bg_cli_int(CMD, "--threads", optarg, 0, 4096, &v))
                return 2;
            threads = (int)v;
            break;
        case O_HOST_RANKS:
            if (bg_cli_int(CMD, "--host-ranks", optarg, 1, 4096, &v))
                return 2;
            host_ranks = (int)v;
            break;
        case O_SP: mc.sequence_parallel = 1; break;
        case O_CHOICES: show_choices = 1; break;
        case O_CP:
            if (!strcmp(optarg, "auto")) {
                pp.cp = BG_PLAN_CP_AUTO;
                break;
            }
            if (bg_cli_int(CMD, "--cp", optarg, 1, 4096, &v))
                return 2;
            pp.cp = (int)v;
            break;
        case O_HELP:
        case 'h':
            usage(stdout);
            return 0;
        default:
            if (o >= BG_CLI_MODEL_FIRST && o < BG_CLI_MODEL_LAST) {
                if (bg_cli_model_option(CMD, o, optarg, &mc))
                    return 2;
                break;
            }
            return bg_cli_getopt_error(CMD, argv, optind, opts);
        }
    }
    if (optind < argc)
        return bg_cli_fail(CMD, "unexpected argument \"%s\"", argv[optind]);
    if (do_bench)
        return bench();
    if (!have_devices)
        return bg_cli_fail(CMD, "--devices N is required (the number of devices to plan for)");
    if (!mem_arg)
        return bg_cli_fail(CMD, "--mem is required: one budget for all devices (24G) or one per device");
    if (bg_cli_bytes_list(CMD, "--mem", mem_arg, mem, MAX_DEV, &nmem))
        return 2;
    if (nmem != 1 && nmem != pp.world)
        return bg_cli_fail(CMD, "--mem has %d entries but --devices is %d (give one for all, or one per device)",
                           nmem, pp.world);
    if (speed_arg) {
        if (parse_list_double("--speed", speed_arg, speed, MAX_DEV, &nspeed))
            return 2;
        if (nspeed != 1 && nspeed != pp.world)
            return bg_cli_fail(CMD,
                               "--speed has %d entries but --devices is %d (give one for all, or one per device)",
                               nspeed, pp.world);
    }
    pp.mem = mem;
    pp.nmem = nmem;
    pp.speed = nspeed ? speed : NULL;
    pp.nspeed = nspeed;
    if (pp.top <= 0)
        pp.top = 5;
    if (host_ranks && !do_measure)
        return bg_cli_fail(CMD, "--host-ranks says how many ranks --measure runs at once: give --measure");
    if (host_ranks > pp.world)
        return bg_cli_fail(CMD, "--host-ranks %d is more than the plan's %d devices", host_ranks, pp.world);
    if (!host_ranks)
        host_ranks = pp.world;
    if (do_measure && !have_host_bw && !strncmp(backend, "cpu", 3))
        pp.host_bandwidth = 0; /* the cpu backend's store is its own memory: offload moves nothing */
    if (do_measure && !pp.microbatch_size)
        return bg_cli_fail(CMD, "--measure times one microbatch size: give --microbatch-size");
    bg_model_desc_t *desc = NULL;
    bg_plan_set_t *set = NULL;
    int rc = 0;
    bg_status_t st = bg_model_build(&mc, &desc);
    if (st != BG_OK) {
        bg_cli_status(CMD, st);
        return 2;
    }
    pp.model = desc;
    pp.tp_times = tp_times;
    if (do_measure) {
        /* tp 1: the layers whole, in one process; tp > 1: the tp build's, on a group of tp processes with
         * their collectives (docs/partitioner.md). The degrees the search takes: --tp N, every divisor for
         * --tp all, and 1 by default (then the degree it falls back to, below) */
        for (int tp = 1; tp <= pp.world && tp <= 64 && ntp < MAX_TP_TIMES; tp++) {
            if (pp.tp > 0 ? tp != pp.tp : pp.tp == 0 ? tp != 1 : pp.world % tp != 0)
                continue;
            if (tp == 1) {
                int L = 0;
                if (bg_cli_measure_layers(CMD, desc, pp.microbatch_size, bg_model_desc_params(desc)->seq_len,
                                          backend, threads, host_ranks, 1, pp.optim, mfwd, mbwd, mbs, mws, mopt, NULL,
                                          &L)) {
                    rc = 1;
                    goto out;
                }
                pp.layer_fwd_s = mfwd;
                pp.layer_bwd_s = mbwd;
                pp.layer_b_s = mbs;
                pp.layer_w_s = mws;
                pp.layer_opt_s = mopt;
                continue;
            }
            int r = measure_tp(&mc, pp.microbatch_size, backend, threads, host_ranks, tp, mc.sequence_parallel,
                               pp.optim, &tp_times[ntp], &tp_bufs[ntp]);
            if (r > 0) {
                rc = 1;
                goto out;
            }
            if (r == 0)
                pp.ntp_times = ++ntp;
        }
    }
    st = bg_plan_search(&pp, &set);
    /* by default a degree > 1 is searched only when nothing fits at 1, and sequence parallelism tried only
     * when nothing fits without it: measure the build the best plan took, search again */
    int tp_found = st == BG_OK ? bg_plan_tp(bg_plan_set_get(set, 0)) : 1;
    int sp_found = st == BG_OK && bg_plan_sequence_parallel(bg_plan_set_get(set, 0));
    if (do_measure && tp_found > 1 && !measured_at(tp_times, ntp, tp_found, sp_found) && ntp < MAX_TP_TIMES) {
        int r = measure_tp(&mc, pp.microbatch_size, backend, threads, host_ranks, tp_found, sp_found, pp.optim,
                           &tp_times[ntp], &tp_bufs[ntp]);
        if (r) {
            if (r < 0)
                bg_cli_fail(CMD, "cannot build the model for tp %d to measure it: %s", tp_found, bg_last_error());
            rc = 1;
            goto out;
        }
        pp.ntp_times = ++ntp;
        bg_plan_set_free(set);
        set = NULL;
        st = bg_plan_search(&pp, &set);
    }
    if (st != BG_OK) {
        bg_cli_status(CMD, st);
        rc = st == BG_ERR_NO_FIT ? 1 : 2;
        goto out;
    }
    const bg_plan_t *best = bg_plan_set_get(set, 0);
    if (!do_measure && !have_flops)
        fprintf(stderr, "brigade plan: warning: uncalibrated: the predicted times assume 1e12 FLOP/s per device "
                        "(use --measure or --flops)\n");
    if (bg_plan_set_note(set)[0])
        printf("%s\n\n", bg_plan_set_note(set));
    print_plan(best, do_measure || have_flops, pp.optim);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (do_measure && (long)host_ranks * (threads > 1 ? threads : 1) > ncpu)
        /* measured sharing the cores, but how the scheduler interleaves the ranks' waits is not modelled:
         * bench/tp_plan.sh's tp 2 x pp 2 plan on 2 cores predicted 0.65-1.69 of its runs (docs/benchmarks.md) */
        printf("note: the plan's %d ranks outnumber this machine's %ld cores: its layers were measured sharing "
               "them, but how the ranks' waits interleave when they run here is not modelled, so this step time is "
               "no prediction (docs/partitioner.md)\n\n", host_ranks, ncpu);
    print_top(set);
    if (show_choices || pp.zero == BG_PLAN_ZERO_AUTO || pp.offload == BG_PLAN_OFFLOAD_AUTO)
        print_choices(&pp, best);
    if (json_path) {
        st = bg_plan_save(best, json_path);
        if (st != BG_OK) {
            rc = bg_cli_status(CMD, st);
            goto out;
        }
        printf("\nplan written to %s\n", json_path);
    }
out:
    bg_plan_set_free(set);
    bg_model_desc_destroy(desc);
    for (int k = 0; k < ntp; k++)
        free(tp_bufs[k]);
    return rc;
}
