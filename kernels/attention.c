/* kernels/attention.c: causal multi-head self-attention composed only from
 * the backend's op table (qkv_split, gemm_strided_batched, causal_softmax,
 * heads_merge/split, qkv_merge), so every backend gets it for free. Owns the
 * layout of the forward workspace and of the backward scratch; it must not
 * touch memory directly (pointers may be device pointers).
 *
 * Shapes: C = NH * hs, BH = B * NH, scale = 1/sqrt(hs).
 *
 * Forward workspace (kept for backward), in floats, in this order:
 *   q    (B,NH,T,hs)   B*T*C
 *   k    (B,NH,T,hs)   B*T*C
 *   v    (B,NH,T,hs)   B*T*C
 *   att  (B,NH,T,T)    B*NH*T*T   softmax(scale * q k^T), causal, in place
 *   y    (B,NH,T,hs)   B*T*C      att v
 *
 * Backward scratch (temporary), in floats, in this order:
 *   dy   (B,NH,T,hs)   B*T*C
 *   datt (B,NH,T,T)    B*NH*T*T   dy v^T, then dpreatt in place
 *   dq, dk, dv (B,NH,T,hs) 3*B*T*C
 *
 * Both causal softmax ops are therefore called in place (out == in); every
 * backend must accept that (backend.h contract of these two ops). */
#include "brigade/backend.h"

#include <math.h>

size_t bg_attention_ws_floats(int B, int T, int C, int NH)
{
    size_t btc = (size_t)B * T * C;
    return 4 * btc + (size_t)B * NH * T * T;
}

size_t bg_attention_scratch_floats(int B, int T, int C, int NH)
{
    size_t btc = (size_t)B * T * C;
    return 4 * btc + (size_t)B * NH * T * T;
}

void bg_attention_forward(bg_backend_t *be, float *out, float *ws, const float *qkv, int B, int T, int C, int NH)
{
    const bg_backend_ops_t *o = be->ops;
    int hs = C / NH, BH = B * NH;
    size_t btc = (size_t)B * T * C;
    float *q = ws, *k = q + btc, *v = k + btc, *att = v + btc, *y = att + (size_t)BH * T * T;
    float scale = 1.0f / sqrtf((float)hs);
    long long s_qkv = (long long)T * hs, s_att = (long long)T * T;

    o->qkv_split(be, q, k, v, qkv, B, T, NH, hs);
    /* preatt (T,T) = q (T,hs) @ k^T, per head, into att */
    o->gemm_strided_batched(be, 0, 1, T, T, hs, 1.0f, q, hs, s_qkv, k, hs, s_qkv, 0.0f, att, T, s_att, BH);
    o->causal_softmax_forward(be, att, att, scale, BH, T);
    /* y (T,hs) = att (T,T) @ v (T,hs) */
    o->gemm_strided_batched(be, 0, 0, T, hs, T, 1.0f, att, T, s_att, v, hs, s_qkv, 0.0f, y, hs, s_qkv, BH);
    o->heads_merge(be, out, y, B, T, NH, hs);
}

void bg_attention_backward(bg_backend_t *be, float *dqkv, float *scratch, const float *dout, const float *ws,
                           int B, int T, int C, int NH)
{
    const bg_backend_ops_t *o = be->ops;
    int hs = C / NH, BH = B * NH;
    size_t btc = (size_t)B * T * C;
    const float *q = ws, *k = q + btc, *v = k + btc, *att = v + btc;
    float *dy = scratch, *datt = dy + btc, *dq = datt + (size_t)BH * T * T, *dk = dq + btc, *dv = dk + btc;
    float scale = 1.0f / sqrtf((float)hs);
    long long s_qkv = (long long)T * hs, s_att = (long long)T * T;

    o->heads_split(be, dy, dout, B, T, NH, hs);
    /* datt (T,T) = dy (T,hs) @ v^T */
    o->gemm_strided_batched(be, 0, 1, T, T, hs, 1.0f, dy, hs, s_qkv, v, hs, s_qkv, 0.0f, datt, T, s_att, BH);
    /* dv (T,hs) = att^T (T,T) @ dy (T,hs) */
    o->gemm_strided_batched(be, 1, 0, T, hs, T, 1.0f, att, T, s_att, dy, hs, s_qkv, 0.0f, dv, hs, s_qkv, BH);
    /* dpreatt (w.r.t. the unscaled q k^T), in place over datt */
    o->causal_softmax_backward(be, datt, datt, att, scale, BH, T);
    /* dq (T,hs) = dpreatt (T,T) @ k (T,hs);  dk (T,hs) = dpreatt^T @ q */
    o->gemm_strided_batched(be, 0, 0, T, hs, T, 1.0f, datt, T, s_att, k, hs, s_qkv, 0.0f, dq, hs, s_qkv, BH);
    o->gemm_strided_batched(be, 1, 0, T, hs, T, 1.0f, datt, T, s_att, q, hs, s_qkv, 0.0f, dk, hs, s_qkv, BH);
    o->qkv_merge(be, dqkv, dq, dk, dv, B, T, NH, hs);
}
