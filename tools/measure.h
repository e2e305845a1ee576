/* tools/measure.h: per-layer timing shared by `brigade plan --measure` and `brigade profile`. */
#ifndef BG_TOOLS_MEASURE_H
#define BG_TOOLS_MEASURE_H

#include "tools/cli.h"

/* Time every layer of the model description for microbatches of n sequences
 * of t positions: fwd, bwd (fused), bsplit and wsplit (B and W of the split
 * backward), seconds, arrays of the model's layer count (<= 4096). Each layer
 * is bound to a model in turn (no other model may hold the description's
 * layers meanwhile). `ranks`: how many ranks will share this machine (copies
 * of the measurement run beside it up to the core count). 0 on success, else
 * a message was printed. */
int bg_cli_measure_layers(const char *cmd, bg_model_desc_t *desc, int n, int t, const char *backend, int threads,
                          int ranks, double *fwd, double *bwd, double *bsplit, double *wsplit, int *L_p);

#endif
