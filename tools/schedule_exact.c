/* tools/schedule_exact.c: `brigade schedule --auto --exact --stages P
 * --microbatches M [--costs F,B,W] [--latency T] [--mem-limit N]
 * [--max-nodes N]`: the library's exact search (bg_schedule_search_exact) on
 * the one-chunk layout and the V, each beside the heuristic search and the
 * lower bound, then the faster optimum printed like any schedule. Thin: the
 * search is the library's. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/schedule_auto.h"

#define CMD "schedule"

int bg_schedule_exact_cli(const bg_exact_args_t *a)
{
    printf("exact search: p=%d m=%d, costs per rank F=%g B=%g W=%g (a chunk of v: 1/v), latency %g, "
           "stash limit per rank %g stage-microbatches%s, budget %lld nodes per layout\n",
           a->p, a->m, a->costs->f_cost, a->costs->b_cost, a->costs->w_cost, a->costs->latency, a->mem_limit,
           a->mem_limit > 0 ? "" : " (none)", a->max_nodes);
    printf("%-10s %12s %12s %12s %8s %12s %8s %12s %s\n", "layout", "optimum", "bound", "heuristic", "gap",
           "lower bound", "gap", "nodes", "");
    bg_schedule_t *best = NULL;
    bg_sim_params_t best_sim = *a->costs;
    double best_step = INFINITY;
    for (int vs = 0; vs <= 1; vs++) {
        int v = vs ? 2 : 1;
        bg_sim_params_t sim = *a->costs;
        sim.f_cost /= v, sim.b_cost /= v, sim.w_cost /= v, sim.stash_bytes = 1.0 / v;
        bg_schedule_search_params_t sp = BG_SCHEDULE_SEARCH_PARAMS_INIT;
        sp.stages = a->p, sp.microbatches = a->m, sp.chunks = v, sp.vshape = vs, sp.costs = &sim;
        sp.mem_limit = a->mem_limit;
        bg_schedule_exact_params_t xp = BG_SCHEDULE_EXACT_PARAMS_INIT;
        xp.max_nodes = a->max_nodes;
        bg_schedule_exact_result_t r;
        bg_schedule_t *s = NULL;
        bg_status_t st = bg_schedule_search_exact(&sp, &xp, &r, &s);
        const char *name = vs ? "V" : "one chunk";
        if (st == BG_ERR_NOT_FOUND) {
            printf("%-10s (none fits the limit)\n", name);
            continue;
        }
        if (st != BG_OK) {
            bg_schedule_free(best);
            return bg_cli_status(CMD, st);
        }
        printf("%-10s %12g %12g %12g %7.1f%% %12g %7.1f%% %12lld %s\n", name, r.step, r.bound, r.heuristic_step,
               100 * (r.heuristic_step / r.step - 1), r.lower_bound, 100 * (r.step / r.lower_bound - 1), r.nodes,
               r.proved ? "optimal" : "stopped early: best found, bound");
        if (r.step < best_step) {
            bg_schedule_free(best);
            best = s, best_step = r.step, best_sim = sim;
        } else {
            bg_schedule_free(s);
        }
    }
    if (!best)
        return bg_cli_fail(CMD, "no program of either layout keeps its peak stash within %g stage-microbatches",
                           a->mem_limit);
    printf("(gap: the heuristic search's step over the optimum, the optimum over the lower bound)\n\n");
    int rc = bg_cli_schedule_run(best, &best_sim, a->text, 0, a->json_out, a->svg_out);
    bg_schedule_free(best);
    return rc;
}
