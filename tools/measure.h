/* tools/measure.h: per-layer timing shared by `brigade plan --measure` and `brigade profile`. */
#ifndef BG_TOOLS_MEASURE_H
#define BG_TOOLS_MEASURE_H

#include "tools/cli.h"

/* Time every layer of the model description for microbatches of n sequences
 * of t positions: fwd, bwd (fused), bsplit and wsplit (B and W of the split
 * backward), seconds, arrays of the model's layer count (<= 4096); coll (NULL:
 * not wanted) the part of fwd + bwd spent in the tensor group's collectives.
 * tp: the description's tensor-parallel degree; tp > 1 measures on a group of
 * tp processes (its own world on 127.0.0.1) with the real collectives, and
 * gives each layer's largest time over the members. `ranks`: how many ranks
 * will share this machine (copies of the measurement run beside it, up to the
 * core count). The measuring runs in child processes, so this process
 * computes nothing. 0 on success, else a message was printed. */
int bg_cli_measure_layers(const char *cmd, bg_model_desc_t *desc, int n, int t, const char *backend, int threads,
                          int ranks, int tp, double *fwd, double *bwd, double *bsplit, double *wsplit, double *coll,
                          int *L_p);

#endif
