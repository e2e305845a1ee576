/* tools/bench_schedule.c: `brigade bench schedule`: time to generate,
 * validate and simulate every schedule at a large size (default p = 64,
 * m = 1024), next to a reference measured in the same run: one pass that
 * copies every instruction (the floor for any tool that touches them all). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/schedule.h"
#include "tools/bench.h"
#include "tools/cli.h"

#define CMD "bench schedule"

static double best_of(double a, double b) { return a < b ? a : b; }

int bg_bench_schedule(int argc, char **argv)
{
    long long p = 64, m = 1024, reps = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: brigade bench schedule [--stages P] [--microbatches M] [--repeat N]\n"
                   "  times generate + validate + simulate of every schedule (best of N runs)\n");
            return 0;
        } else if (!strcmp(a, "--stages")) {
            if (bg_cli_int(CMD, a, val, 1, 4096, &p))
                return 2;
            i++;
        } else if (!strcmp(a, "--microbatches")) {
            if (bg_cli_int(CMD, a, val, 1, 1 << 20, &m))
                return 2;
            i++;
        } else if (!strcmp(a, "--repeat")) {
            if (bg_cli_int(CMD, a, val, 1, 100, &reps))
                return 2;
            i++;
        } else {
            static const char *const known[] = {"--stages", "--microbatches", "--repeat", "--help", NULL};
            return bg_cli_unknown_option(CMD, a, known);
        }
    }
    printf("schedule bench: p=%lld m=%lld, best of %lld runs, times in ms\n", p, m, reps);
    printf("%-14s %3s %10s %9s %9s %9s %9s %9s %8s\n", "schedule", "v", "ops", "generate", "validate", "simulate",
           "total", "copy-ref", "ns/op");
    int rc = 0;
    for (int k = 0; k < BG_SCHED_CUSTOM; k++) {
        double tg = 1e30, tv = 1e30, ts = 1e30, tc = 1e30;
        size_t nops = 0;
        int v = 0;
        for (long long rep = 0; rep < reps; rep++) {
            bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
            gp.kind = (bg_schedule_kind_t)k, gp.stages = (int)p, gp.microbatches = (int)m;
            bg_schedule_t *s;
            bg_sim_result_t *r;
            double t0 = bg_now();
            bg_status_t st = bg_schedule_generate(&gp, &s);
            if (st != BG_OK)
                return bg_cli_status(CMD, st);
            double t1 = bg_now();
            st = bg_schedule_validate(s);
            double t2 = bg_now();
            bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
            sp.latency = 0.01, sp.bandwidth = 1e3, sp.act_bytes = 4, sp.grad_bytes = 4;
            if (st == BG_OK)
                st = bg_schedule_simulate(s, &sp, &r); /* includes its own validation */
            double t3 = bg_now();
            if (st != BG_OK) {
                bg_schedule_free(s);
                return bg_cli_status(CMD, st);
            }
            /* reference: copy every instruction once */
            v = bg_schedule_chunks(s);
            nops = 0;
            double t4 = bg_now();
            volatile int sink = 0;
            for (int rk = 0; rk < p; rk++) {
                size_t n;
                const bg_sched_op_t *ops = bg_schedule_rank_ops(s, rk, &n);
                bg_sched_op_t *cp = malloc(n * sizeof(*cp));
                if (cp) {
                    memcpy(cp, ops, n * sizeof(*cp));
                    sink += cp[n / 2].kind;
                    free(cp);
                }
                nops += n;
            }
            double t5 = bg_now();
            (void)sink;
            tg = best_of(tg, t1 - t0), tv = best_of(tv, t2 - t1), ts = best_of(ts, t3 - t2);
            tc = best_of(tc, t5 - t4);
            bg_sim_result_free(r);
            bg_schedule_free(s);
        }
        double tot = tg + tv + ts;
        printf("%-14s %3d %10zu %9.1f %9.1f %9.1f %9.1f %9.2f %8.1f\n", bg_schedule_kind_name((bg_schedule_kind_t)k),
               v, nops, 1e3 * tg, 1e3 * tv, 1e3 * ts, 1e3 * tot, 1e3 * tc, 1e9 * tot / (double)nops);
        if (tot >= 1.0)
            rc = 1;
    }
    printf("(simulate includes its own validation; total = the three calls; the goal is well under 1000 ms)\n");
    return rc;
}
