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

#endif
