/* tools/cmd_simulate.c: `brigade simulate --from-trace FILE`: feed the per-op
 * costs measured in an executor trace (brigade train --trace) to the schedule
 * simulator and compare its step time with the measured one. */
#include <stdio.h>
#include <string.h>

#include "brigade/schedule.h"
#include "tools/cli.h"

int bg_cmd_simulate(int argc, char **argv)
{
    const char *cmd = "simulate", *path = NULL, *svg = NULL, *svg_measured = NULL;
    double latency = 0, bandwidth = 0;
    int compute_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: brigade simulate --from-trace FILE [--svg OUT] [--svg-measured OUT] [--link-latency S]\n"
                   "                        [--link-bw BYTES_PER_S] [--compute-only]\n"
                   "  replays the schedule of a trace written by brigade train --trace with the per-stage\n"
                   "  F, B, W (or full backward) times measured in it (medians over steps 2..; the time a\n"
                   "  stage spends issuing its sends is charged to the compute op before it), free links\n"
                   "  unless given, and prints the predicted step time next to the measured one.\n"
                   "  --compute-only: charge nothing for sends (the compute-only critical path).\n");
            return 0;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--from-trace") && v)
            path = argv[++i];
        else if (!strcmp(argv[i], "--svg") && v)
            svg = argv[++i];
        else if (!strcmp(argv[i], "--svg-measured") && v)
            svg_measured = argv[++i];
        else if (!strcmp(argv[i], "--compute-only"))
            compute_only = 1;
        else if (!strcmp(argv[i], "--link-latency")) {
            if (bg_cli_double(cmd, "--link-latency", v, 0, 10, &latency))
                return 2;
            i++;
        } else if (!strcmp(argv[i], "--link-bw")) {
            if (bg_cli_double(cmd, "--link-bw", v, 1, 1e15, &bandwidth))
                return 2;
            i++;
        } else
            return bg_cli_fail(cmd, "unknown or incomplete option \"%s\" (see brigade simulate --help)", argv[i]);
    }
    if (!path)
        return bg_cli_fail(cmd, "--from-trace FILE is required");
    bg_trace_costs_t *tc = NULL;
    bg_status_t st = bg_trace_costs_load(path, &tc);
    if (st != BG_OK)
        return bg_cli_status(cmd, st);
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    bg_trace_costs_schedule(tc, &sp);
    bg_schedule_t *sched = NULL;
    bg_sim_result_t *res = NULL;
    int rc = 0;
    if ((st = bg_schedule_generate(&sp, &sched)) != BG_OK) {
        rc = bg_cli_status(cmd, st);
        goto out;
    }
    bg_sim_params_t simp = BG_SIM_PARAMS_INIT;
    bg_trace_costs_sim(tc, compute_only, &simp);
    simp.latency = latency;
    simp.bandwidth = bandwidth;
    if ((st = bg_schedule_simulate(sched, &simp, &res)) != BG_OK) {
        rc = bg_cli_status(cmd, st);
        goto out;
    }
    int S = bg_schedule_stages(sched), nsteps;
    double pred = bg_sim_step_time(res), meas = bg_trace_costs_step_time(tc, &nsteps);
    printf("schedule %s, p=%d, m=%d, v=%d; per-stage medians (ms):\n  stage      F      B      W\n",
           bg_schedule_kind_name(sp.kind), sp.stages, sp.microbatches, sp.chunks);
    for (int s = 0; s < S; s++)
        printf("  %5d %6.2f %6.2f %6.2f\n", s, simp.f_costs[s] * 1e3, simp.b_costs[s] * 1e3, simp.w_costs[s] * 1e3);
    printf("simulated step %.2f ms (bubble %.1f%%, per stage %.1f%%), measured step %.2f ms (median of %d): "
           "simulated/measured = %.3f\n",
           pred * 1e3, 100 * bg_sim_bubble(res, -1), 100 * bg_sim_stage_bubble(res, NULL), meas * 1e3, nsteps,
           meas > 0 ? pred / meas : 0.0);
    /* both pictures in ms on one axis (the longer step and a margin), so they can be laid side by side */
    bg_svg_params_t gp = BG_SVG_PARAMS_INIT;
    gp.time_scale = 1e3;
    gp.unit = "ms";
    double drawn = bg_trace_costs_drawn_span(tc), longest = pred > drawn ? pred : drawn;
    gp.x_max = 1.04 * (longest > meas ? longest : meas) * 1e3;
    char title[160];
    snprintf(title, sizeof title, "simulated %s: p=%d m=%d v=%d, step %.4g ms, bubble %.1f%% (per stage %.1f%%)",
             bg_schedule_kind_name(sp.kind), sp.stages, sp.microbatches, bg_schedule_chunks(sched), pred * 1e3,
             100 * bg_sim_bubble(res, -1), 100 * bg_sim_stage_bubble(res, NULL));
    gp.title = title;
    if (svg) {
        if ((st = bg_schedule_svg_with(sched, res, &gp, svg)) != BG_OK)
            rc = bg_cli_status(cmd, st);
        else
            printf("wrote %s\n", svg);
    }
    if (svg_measured && !rc) {
        int step;
        gp.title = NULL;
        if ((st = bg_trace_costs_svg_with(tc, &gp, svg_measured, &step)) != BG_OK)
            rc = bg_cli_status(cmd, st);
        else
            printf("wrote %s (measured step %d)\n", svg_measured, step);
    }
out:
    bg_sim_result_free(res);
    bg_schedule_free(sched);
    bg_trace_costs_free(tc);
    return rc;
}
