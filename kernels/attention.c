/* kernels/attention.c: causal multi-head self-attention on the backend's
 * fused attention ops (attention_forward/backward: flash-style, no T x T
 * buffer). Owns the layout of the forward workspace and of the backward
 * scratch; it must not touch memory directly (pointers may be device
 * pointers).
 *
 * Shapes: C = NH * hs.
 *
 * Forward workspace (kept for backward, with the forward's qkv and out):
 *   lse  (B,NH,T)   the log of each query row's softmax denominator
 * Backward scratch (temporary):
 *   dvec (B,NH,T)   rowsum(dout * out) per head */
#include "brigade/backend.h"

size_t bg_attention_ws_floats(int B, int T, int C, int NH) { return (size_t)B * NH * T; }

size_t bg_attention_scratch_floats(int B, int T, int C, int NH) { return (size_t)B * NH * T; }

void bg_attention_forward(bg_backend_t *be, float *out, float *ws, const float *qkv, int B, int T, int C, int NH)
{
    be->ops->attention_forward(be, out, ws, qkv, B, T, NH, C / NH);
}

void bg_attention_backward(bg_backend_t *be, float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *out, const float *ws, int B, int T, int C, int NH)
{
    be->ops->attention_backward(be, dqkv, scratch, dout, qkv, out, ws, B, T, NH, C / NH);
}
