/* tools/schedule_auto.h: `brigade schedule --auto` (tools/schedule_auto.c). */
#ifndef BG_TOOLS_SCHEDULE_AUTO_H
#define BG_TOOLS_SCHEDULE_AUTO_H

#include <stdint.h>

#include "brigade/schedule.h"

/* What --auto was given: the profile, the layout, the limit, the link
 * (latency, bandwidth of link), a split (NULL: even) and the outputs. */
typedef struct bg_auto_args {
    const char *profile;
    int p, m;
    double mem_limit;         /* bytes; 0: none */
    const int *split;         /* layers per virtual stage, or NULL */
    int nsplit;
    const bg_sim_params_t *link; /* latency and bandwidth */
    const char *json_out, *svg_out;
    int text;                 /* -1 auto, 0, 1 */
} bg_auto_args_t;

/* Validates, simulates and prints one program (the table, step, bubble and
 * peak stash per rank), writing JSON and SVG when asked (tools/cmd_schedule.c);
 * returns the exit code. */
int bg_cli_schedule_run(const bg_schedule_t *s, const bg_sim_params_t *sp, int text, unsigned tflags,
                        const char *json_out, const char *svg_out);

/* Runs the search; returns the process exit code (messages printed). */
int bg_schedule_auto(const bg_auto_args_t *a);

/* What --auto --exact was given: costs per rank (a chunk of v costs 1/v,
 * and holds 1/v of a stage's stash), the link's latency, the limit in
 * stage-microbatches (0: none), the node budget and the outputs. */
typedef struct bg_exact_args {
    int p, m;
    const bg_sim_params_t *costs;
    double mem_limit;
    long long max_nodes;
    const char *json_out, *svg_out;
    int text;
} bg_exact_args_t;

/* Runs the exact search on the one-chunk layout and the V (tools/schedule_exact.c);
 * returns the process exit code (messages printed). */
int bg_schedule_exact_cli(const bg_exact_args_t *a);

/* Per-stage costs (s) and stash bytes of one layout of p ranks (v chunks per
 * rank; the V when vshape) from a profile (brigade profile --json), layers
 * split evenly, the link's latency and bandwidth from link: *sim_p points
 * into *mem_p, which the caller frees. 0: done; 1: too few layers for the
 * layout; 2: the profile cannot be read (message printed). */
int bg_auto_layout_costs(const char *profile, int p, int v, int vshape, const bg_sim_params_t *link,
                         bg_sim_params_t **sim_p, void **mem_p);

#endif
