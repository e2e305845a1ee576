/* examples/byom/user_layers.h: two layers defined outside brigade, through
 * its public layer interface only: RMSNorm and the SwiGLU gate, and a
 * pre-norm SwiGLU feed-forward block built from them and built-in linears.
 *
 * They compute with plain C loops on host memory, so they run on the CPU
 * backend (a GPU version would call the backend's kernels, be->ops). */
#ifndef BYOM_USER_LAYERS_H
#define BYOM_USER_LAYERS_H

#include <brigade/brigade.h>

/** RMSNorm over the channels: y = x / sqrt(mean(x^2) + eps) * weight. */
bg_status_t byom_rmsnorm(const char *name, int c, bg_layer_t **layer_p);
/** SwiGLU gate: (n, t, 2h) -> (n, t, h), y = silu(a) * b for [a | b] = x. No parameters. */
bg_status_t byom_swiglu(const char *name, int h, bg_layer_t **layer_p);
/** x + down(swiglu(up(rmsnorm(x)))), up: c -> 2h, down: h -> c. */
bg_status_t byom_ffn_block(const char *name, int c, int h, float init_std, bg_layer_t **layer_p);

#endif
