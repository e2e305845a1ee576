/* tools/measure.h: per-layer timing shared by `brigade plan --measure` and `brigade profile`. */
#ifndef BG_TOOLS_MEASURE_H
#define BG_TOOLS_MEASURE_H

#include "tools/cli.h"

/* Time every layer of the model description for microbatches of n sequences
 * of t positions: fwd, bwd (fused), bsplit and wsplit (B and W of the split
 * backward), seconds, arrays of the model's layer count (<= 4096); opt (NULL:
 * not wanted) the optimizer `optim`'s step over each layer's parameters (with
 * the gradients' sums of squares, as the executor's step); coll (NULL: not
 * wanted) the part of fwd + bwd spent in the tensor group's collectives.
 * Medians of rounds over the layers (at least 15; more while the rounds'
 * totals spread by more than 10 %, then a warning on stderr).
 * tp: the description's tensor-parallel degree; tp > 1 measures on a group of
 * tp processes (its own world on 127.0.0.1) with the real collectives, and
 * gives each layer's largest time over the members. `ranks`: how many ranks
 * will share this machine (copies of the measurement run beside it, one
 * process per rank up to 64, sharing the cores when they outnumber them, which
 * a line on stdout says). The measuring runs in child processes, so this process
 * computes nothing. 0 on success, else a message was printed. */
int bg_cli_measure_layers(const char *cmd, bg_model_desc_t *desc, int n, int t, const char *backend, int threads,
                          int ranks, int tp, bg_optim_kind_t optim, double *fwd, double *bwd, double *bsplit,
                          double *wsplit, double *opt, double *coll, int *L_p);

#endif
