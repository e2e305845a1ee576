/* kernels/cpu/cpu_nn.c: the CPU backend's neural-network kernels: bias, GELU,
 * ReLU, LayerNorm, softmax (plain, causal, fused with cross-entropy),
 * embedding and the attention layout changes. Plain C loops + OpenMP.
 *
 * Determinism rule: row-wise kernels give each row to one thread; the
 * reductions over rows (bias_backward, layernorm_backward_weight,
 * embedding_backward) give each block of BG_CPU_COL_BLOCK output columns to
 * one thread, which sums over rows in row order. So every output is computed
 * in a fixed serial order and is bitwise identical for any thread count.
 * Parameter gradients accumulate (+=), activation gradients are assigned (=).
 *
 * Must not print or exit. */
#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

#define BG_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define BG_LN_EPS 1e-5

/* parallelise over rows when rows*cols is large enough */
#define BG_ROWS_PAR(N, C) ((size_t)(N) * (size_t)(C) > BG_CPU_PAR_WORK && (N) > 1)

/* ------------------------------------------------------------------ bias */

void bg__cpu_bias_forward(bg_backend_t *be, float *out, const float *bias, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++)
            o[c] += bias[c];
    }
}

void bg__cpu_bias_backward(bg_backend_t *be, float *dbias, const float *dout, int N, int C)
{
    int nt = bg__cpu_nt(be);
    int nblk = (C + BG_CPU_COL_BLOCK - 1) / BG_CPU_COL_BLOCK;
#pragma omp parallel for num_threads(nt) if (nblk > 1 && BG_ROWS_PAR(N, C)) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * BG_CPU_COL_BLOCK;
        int cn = C - c0 < BG_CPU_COL_BLOCK ? C - c0 : BG_CPU_COL_BLOCK;
        double acc[BG_CPU_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C + c0;
            for (int c = 0; c < cn; c++)
                acc[c] += d[c];
        }
        for (int c = 0; c < cn; c++)
            dbias[c0 + c] += (float)acc[c];
    }
}

/* ----------------------------------------------------------- activations */

/* tanh(a) = 1 - 2/(e^{2a} + 1) through expf: glibc's tanhf costs about 13 ns
 * here against 2.5 ns for expf. The absolute error stays ~1e-7 (GELU adds
 * tanh to 1, so absolute error is what matters); overflow of e^{2a} gives
 * exactly +-1. sech^2(a) = 4 / (e^a + e^-a)^2 is 0 in both overflow limits. */
static inline float bg__tanh_from_exp(float e2a) { return 1.0f - 2.0f / (e2a + 1.0f); }

void bg__cpu_gelu_forward(bg_backend_t *be, float *out, const float *in, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS / 8) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = in[i];
        float arg = BG_GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + bg__tanh_from_exp(expf(2.0f * arg)));
    }
}

void bg__cpu_gelu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS / 8) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = in[i];
        float arg = BG_GELU_SCALE * (x + 0.044715f * x * x * x);
        float e = expf(arg);
        float th = bg__tanh_from_exp(e * e);
        float ch2 = e + 1.0f / e; /* 2 cosh(arg) */
        float sech2 = 4.0f / (ch2 * ch2);
        float grad = 0.5f * (1.0f + th) + x * 0.5f * sech2 * BG_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        din[i] = grad * dout[i];
    }
}

void bg__cpu_relu_forward(bg_backend_t *be, float *out, const float *in, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

void bg__cpu_relu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++)
        din[i] = in[i] > 0.0f ? dout[i] : 0.0f;
}

/* ------------------------------------------------------------- LayerNorm */

void bg__cpu_layernorm_forward(bg_backend_t *be, float *out, float *mean, float *rstd, const float *in,
                               const float *weight, const float *bias, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = in + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double s = 0.0;
        for (int c = 0; c < C; c++)
            s += x[c];
        double mu = s / C;
        double v = 0.0;
        for (int c = 0; c < C; c++) {
            double d = x[c] - mu;
            v += d * d;
        }
        float m = (float)mu;
        float r = (float)(1.0 / sqrt(v / C + BG_LN_EPS));
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * r * weight[c] + bias[c];
        if (mean)
            mean[n] = m;
        if (rstd)
            rstd[n] = r;
    }
}

void bg__cpu_layernorm_backward_input(bg_backend_t *be, float *din, const float *dout, const float *in,
                                      const float *weight, const float *mean, const float *rstd, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = in + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = din + (size_t)n * C;
        float m = mean[n], r = rstd[n];
        double s1 = 0.0, s2 = 0.0;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * r;
            float dnorm = weight[c] * dy[c];
            s1 += dnorm;
            s2 += (double)dnorm * norm;
        }
        float dmean = (float)(s1 / C), dnm = (float)(s2 / C);
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * r;
            float dnorm = weight[c] * dy[c];
            dx[c] = (dnorm - dmean - norm * dnm) * r;
        }
    }
}

void bg__cpu_layernorm_backward_weight(bg_backend_t *be, float *dweight, float *dbias, const float *dout,
                                       const float *in, const float *mean, const float *rstd, int N, int C)
{
    int nt = bg__cpu_nt(be);
    int nblk = (C + BG_CPU_COL_BLOCK - 1) / BG_CPU_COL_BLOCK;
#pragma omp parallel for num_threads(nt) if (nblk > 1 && BG_ROWS_PAR(N, C)) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * BG_CPU_COL_BLOCK;
        int cn = C - c0 < BG_CPU_COL_BLOCK ? C - c0 : BG_CPU_COL_BLOCK;
        double aw[BG_CPU_COL_BLOCK] = {0}, ab[BG_CPU_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = in + (size_t)n * C + c0, *dy = dout + (size_t)n * C + c0;
            float m = mean[n], r = rstd[n];
            for (int c = 0; c < cn; c++) {
                float norm = (x[c] - m) * r;
                aw[c] += (double)(dy[c] * norm);
                ab[c] += dy[c];
            }
        }
        for (int c = 0; c < cn; c++) {
            if (dweight)
                dweight[c0 + c] += (float)aw[c];
            if (dbias)
                dbias[c0 + c] += (float)ab[c];
        }
    }
}

/* --------------------------------------------------------------- softmax */

/* Numerically stable softmax of x[0..n) * scale into y (y may equal x). */
static inline void bg__softmax_row(float *y, const float *x, float scale, int n)
{
    float mx = -INFINITY;
    for (int j = 0; j < n; j++)
        mx = fmaxf(mx, scale * x[j]);
    double s = 0.0;
    for (int j = 0; j < n; j++) {
        float e = expf(scale * x[j] - mx);
        y[j] = e;
        s += e;
    }
    float inv = (float)(1.0 / s);
    for (int j = 0; j < n; j++)
        y[j] *= inv;
}

void bg__cpu_softmax_forward(bg_backend_t *be, float *out, const float *in, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++)
        bg__softmax_row(out + (size_t)n * C, in + (size_t)n * C, 1.0f, C);
}

void bg__cpu_softmax_backward(bg_backend_t *be, float *din, const float *dout, const float *out, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *y = out + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = din + (size_t)n * C;
        double dot = 0.0;
        for (int c = 0; c < C; c++)
            dot += (double)y[c] * dy[c];
        float d = (float)dot;
        for (int c = 0; c < C; c++)
            dx[c] = y[c] * (dy[c] - d);
    }
}

/* In place (att == preatt) is allowed: attention.c relies on it. */
void bg__cpu_causal_softmax_forward(bg_backend_t *be, float *att, const float *preatt, float scale, int BH, int T)
{
    int nt = bg__cpu_nt(be);
    long long rows = (long long)BH * T;
#pragma omp parallel for num_threads(nt) if (rows > 1 && (size_t)rows * T > BG_CPU_PAR_WORK) schedule(static)
    for (long long r = 0; r < rows; r++) {
        int i = (int)(r % T);
        const float *x = preatt + (size_t)r * T;
        float *y = att + (size_t)r * T;
        bg__softmax_row(y, x, scale, i + 1);
        for (int j = i + 1; j < T; j++)
            y[j] = 0.0f;
    }
}

/* In place (dpreatt == datt) is allowed. */
void bg__cpu_causal_softmax_backward(bg_backend_t *be, float *dpreatt, const float *datt, const float *att,
                                     float scale, int BH, int T)
{
    int nt = bg__cpu_nt(be);
    long long rows = (long long)BH * T;
#pragma omp parallel for num_threads(nt) if (rows > 1 && (size_t)rows * T > BG_CPU_PAR_WORK) schedule(static)
    for (long long r = 0; r < rows; r++) {
        int i = (int)(r % T);
        const float *a = att + (size_t)r * T, *da = datt + (size_t)r * T;
        float *dp = dpreatt + (size_t)r * T;
        double dot = 0.0;
        for (int j = 0; j <= i; j++)
            dot += (double)a[j] * da[j];
        float d = (float)dot;
        for (int j = 0; j <= i; j++)
            dp[j] = scale * a[j] * (da[j] - d);
        for (int j = i + 1; j < T; j++)
            dp[j] = 0.0f;
    }
}

/* --------------------------------------------------------- cross-entropy */

void bg__cpu_crossentropy_forward(bg_backend_t *be, float *losses, float *probs, const float *logits,
                                  const int32_t *targets, int N, int V)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, V)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            mx = fmaxf(mx, x[j]);
        double s = 0.0;
        for (int j = 0; j < V; j++) {
            float e = expf(x[j] - mx);
            p[j] = e;
            s += e;
        }
        float inv = (float)(1.0 / s);
        for (int j = 0; j < V; j++)
            p[j] *= inv;
        int32_t t = targets[n];
        assert(t >= 0 && t < V && "crossentropy target out of [0, V): the layer validates tokens");
        /* log-sum-exp form: finite even when the target's probability underflows */
        losses[n] = (t >= 0 && t < V) ? (float)(log(s) - (double)(x[t] - mx)) : NAN;
    }
}

void bg__cpu_crossentropy_backward(bg_backend_t *be, float *dlogits, const float *probs, const int32_t *targets,
                                   float dloss, int N, int V)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, V)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        int32_t t = targets[n];
        for (int j = 0; j < V; j++)
            d[j] = (p[j] - (j == t ? 1.0f : 0.0f)) * dloss;
    }
}

/* ------------------------------------------------------------- embedding */

void bg__cpu_embedding_forward(bg_backend_t *be, float *out, const int32_t *tokens, const float *wte,
                               const float *wpe, int B, int T, int C)
{
    int nt = bg__cpu_nt(be);
    int rows = B * T;
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(rows, C)) schedule(static)
    for (int r = 0; r < rows; r++) {
        float *o = out + (size_t)r * C;
        const float *e = wte + (size_t)tokens[r] * C;
        if (wpe) {
            const float *pe = wpe + (size_t)(r % T) * C;
            for (int c = 0; c < C; c++)
                o[c] = e[c] + pe[c];
        } else {
            memcpy(o, e, (size_t)C * sizeof(float));
        }
    }
}

/* Column blocks: each thread owns whole columns of dwte and dwpe, so rows
 * sharing a token are added in (b,t) order by one thread. */
void bg__cpu_embedding_backward(bg_backend_t *be, float *dwte, float *dwpe, const float *dout,
                                const int32_t *tokens, int B, int T, int C)
{
    int nt = bg__cpu_nt(be);
    int nblk = (C + BG_CPU_COL_BLOCK - 1) / BG_CPU_COL_BLOCK;
    int rows = B * T;
#pragma omp parallel for num_threads(nt) if (nblk > 1 && BG_ROWS_PAR(rows, C)) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * BG_CPU_COL_BLOCK;
        int cn = C - c0 < BG_CPU_COL_BLOCK ? C - c0 : BG_CPU_COL_BLOCK;
        for (int r = 0; r < rows; r++) {
            const float *d = dout + (size_t)r * C + c0;
            if (dwte) {
                float *w = dwte + (size_t)tokens[r] * C + c0;
                for (int c = 0; c < cn; c++)
                    w[c] += d[c];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)(r % T) * C + c0;
                for (int c = 0; c < cn; c++)
                    p[c] += d[c];
            }
        }
    }
}

/* --------------------------------------------------- attention layouts */

void bg__cpu_qkv_split(bg_backend_t *be, float *q, float *k, float *v, const float *qkv, int B, int T, int NH, int hs)
{
    int nt = bg__cpu_nt(be);
    int C = NH * hs;
    int rows = B * T;
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(rows, 3 * C)) schedule(static)
    for (int r = 0; r < rows; r++) {
        int b = r / T, t = r % T;
        const float *src = qkv + (size_t)r * 3 * C;
        for (int h = 0; h < NH; h++) {
            size_t dst = (((size_t)b * NH + h) * T + t) * hs;
            memcpy(q + dst, src + h * hs, (size_t)hs * sizeof(float));
            memcpy(k + dst, src + C + h * hs, (size_t)hs * sizeof(float));
            memcpy(v + dst, src + 2 * C + h * hs, (size_t)hs * sizeof(float));
        }
    }
}

void bg__cpu_qkv_merge(bg_backend_t *be, float *dqkv, const float *dq, const float *dk, const float *dv, int B, int T,
                       int NH, int hs)
{
    int nt = bg__cpu_nt(be);
    int C = NH * hs;
    int rows = B * T;
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(rows, 3 * C)) schedule(static)
    for (int r = 0; r < rows; r++) {
        int b = r / T, t = r % T;
        float *dst = dqkv + (size_t)r * 3 * C;
        for (int h = 0; h < NH; h++) {
            size_t src = (((size_t)b * NH + h) * T + t) * hs;
            memcpy(dst + h * hs, dq + src, (size_t)hs * sizeof(float));
            memcpy(dst + C + h * hs, dk + src, (size_t)hs * sizeof(float));
            memcpy(dst + 2 * C + h * hs, dv + src, (size_t)hs * sizeof(float));
        }
    }
}

void bg__cpu_heads_merge(bg_backend_t *be, float *out, const float *y, int B, int T, int NH, int hs)
{
    int nt = bg__cpu_nt(be);
    int C = NH * hs;
    int rows = B * T;
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(rows, C)) schedule(static)
    for (int r = 0; r < rows; r++) {
        int b = r / T, t = r % T;
        for (int h = 0; h < NH; h++)
            memcpy(out + (size_t)r * C + h * hs, y + (((size_t)b * NH + h) * T + t) * hs, (size_t)hs * sizeof(float));
    }
}

void bg__cpu_heads_split(bg_backend_t *be, float *dy, const float *dout, int B, int T, int NH, int hs)
{
    int nt = bg__cpu_nt(be);
    int C = NH * hs;
    int rows = B * T;
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(rows, C)) schedule(static)
    for (int r = 0; r < rows; r++) {
        int b = r / T, t = r % T;
        for (int h = 0; h < NH; h++)
            memcpy(dy + (((size_t)b * NH + h) * T + t) * hs, dout + (size_t)r * C + h * hs, (size_t)hs * sizeof(float));
    }
}
