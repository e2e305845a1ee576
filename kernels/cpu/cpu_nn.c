/* kernels/cpu/cpu_nn.c: the CPU backend's neural-network kernels: bias, GELU,
 * ReLU, LayerNorm, softmax (plain, causal, fused with cross-entropy),
 * embedding and the attention layout changes. C loops written for GCC's
 * vectoriser (cpu_vec.h: fixed-lane sums, a vectorisable expf) + OpenMP over
 * rows or chunks. Compiled once per vector ISA (cpu_impl.h): exports only
 * its ISA's kernel table, which holds these kernels, cpu_attention.c's and
 * cpu_llama.c's.
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
#include "kernels/cpu/cpu_vec.h"

#define BG_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define BG_LN_EPS 1e-5

/* parallelise over rows when rows*cols is large enough */
#define BG_ROWS_PAR(N, C) ((size_t)(N) * (size_t)(C) > BG_CPU_PAR_WORK && (N) > 1)

/* ------------------------------------------------------------------ bias */

static void bg__k_bias_forward(bg_backend_t *be, float *out, const float *bias, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++)
            o[c] += bias[c];
    }
}

static void bg__k_bias_backward(bg_backend_t *be, float *dbias, const float *dout, int N, int C)
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

/* GELU (tanh form) through one power of two: with
 * a = sqrt(2/pi) (x + 0.044715 x^3) and e = e^{2a} = 2^u,
 * u = x (c1 + c2 x^2), c1 = 2 sqrt(2/pi) log2(e), c2 = 0.044715 c1,
 * s = e / (e + 1) = (1 + tanh a) / 2, so
 *   gelu(x)  = x s
 *   gelu'(x) = s + x * 2 s (1 - s) * sqrt(2/pi) (1 + 3 * 0.044715 x^2),
 * with 1 - s = 1 / (e + 1) and 2 s (1 - s) = sech^2(a) / 2. s and its
 * derivative term are computed at x clamped to [-10, 10], where |u| < 126,
 * so 2^u is a normal float with no further clamp: at +-10, s is 1 or about
 * 1.2e-38 and the derivative term below 1e-35 (past them the true values
 * are 1, or smaller still). 2^u is
 * 2^n p(f), n = u rounded (the 1.5 * 2^23 trick), f = u - n in [-1/2, 1/2]
 * exactly, p Cephes' exp2f polynomial (degree 6, relative error about 1e-7,
 * evaluated in Estrin's order): under AVX2 the fused forward's loop is 44
 * instructions for 8 lanes where the exponential of cpu_vec.h and the scaling
 * to its argument made 51 (the backward's 57 where they made 76). A NaN passes the clamps
 * (the comparisons are false), so both kernels give NaN for it. No
 * contraction and no reassociation (kernels/CMakeLists.txt): the same bits on
 * every ISA. */
#define BG_GELU_CHUNK 4096
#define BG_GELU_C1 2.3022082f  /* 2 sqrt(2/pi) / ln 2 */
#define BG_GELU_C2 0.10294324f /* BG_GELU_C1 * 0.044715 */

/* s = e / (e + 1) and r = 1 / (e + 1) at xc (in [-10, 10] or NaN); x2 = xc^2 */
static inline __attribute__((always_inline)) float bg__gelu_sig(float xc, float x2, float *r_p)
{
    float u = xc * (BG_GELU_C1 + BG_GELU_C2 * x2);
    const float shifter = 12582912.0f; /* 1.5 * 2^23 */
    float t = u + shifter;
    float n = t - shifter;
    int32_t ni = bg__bits_from_f(t) - bg__bits_from_f(shifter);
    float f = u - n;
    /* 1 + f q(f), q in Estrin's order: pairs, then f^2 and f^4, a dependency chain of 6 operations
     * instead of Horner's 12 (the loop is latency-bound: 2.67 -> 2.53 cycles per element forward, 4.82
     * -> 4.47 backward, in the program of docs/kernels.md) */
    float f2 = f * f, f4 = f2 * f2;
    float qa = 6.931472028550421e-1f + 2.402264791363012e-1f * f;
    float qb = 5.550332471162809e-2f + 9.618437357674640e-3f * f;
    float qc = 1.339887440266574e-3f + 1.535336188319500e-4f * f;
    float p = 1.0f + f * ((qa + f2 * qb) + f4 * qc);
    float e = p * bg__f_from_bits((int32_t)((uint32_t)(ni + 127) << 23)); /* unsigned: a NaN's ni overflows the shift */
    float r = 1.0f / (e + 1.0f);
    *r_p = r;
    return e * r;
}

static inline __attribute__((always_inline)) float bg__gelu_clamp(float x)
{
    return x > 10.0f ? 10.0f : x < -10.0f ? -10.0f : x;
}

/* One element of each: the chunk kernels below and the fused bias + GELU
 * kernels (bg__k_bias_gelu_forward, bg__k_gelu_bias_backward) share them, so fused and
 * unfused give the same bits. */
static inline __attribute__((always_inline)) float bg__gelu_of(float x)
{
    float xc = bg__gelu_clamp(x), r;
    return x * bg__gelu_sig(xc, xc * xc, &r);
}

/* gelu'(x) * dy */
static inline __attribute__((always_inline)) float bg__gelu_grad_of(float x, float dy)
{
    float xc = bg__gelu_clamp(x), x2 = xc * xc, r;
    float s = bg__gelu_sig(xc, x2, &r);
    float grad = s + xc * (2.0f * s * r) * BG_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x2);
    return grad * dy;
}

static void bg__gelu_fwd_chunk(float *restrict out, const float *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = bg__gelu_of(in[i]);
}

static void bg__gelu_bwd_chunk(float *restrict din, const float *restrict in,
                               const float *restrict dout, size_t n)
{
    for (size_t i = 0; i < n; i++)
        din[i] = bg__gelu_grad_of(in[i], dout[i]);
}

static void bg__k_gelu_forward(bg_backend_t *be, float *out, const float *in, size_t n)
{
    int nt = bg__cpu_nt(be);
    size_t nch = (n + BG_GELU_CHUNK - 1) / BG_GELU_CHUNK;
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS / 8) schedule(static)
    for (size_t ch = 0; ch < nch; ch++) {
        size_t lo = ch * BG_GELU_CHUNK, len = n - lo < BG_GELU_CHUNK ? n - lo : BG_GELU_CHUNK;
        bg__gelu_fwd_chunk(out + lo, in + lo, len);
    }
}

static void bg__k_gelu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n)
{
    int nt = bg__cpu_nt(be);
    size_t nch = (n + BG_GELU_CHUNK - 1) / BG_GELU_CHUNK;
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS / 8) schedule(static)
    for (size_t ch = 0; ch < nch; ch++) {
        size_t lo = ch * BG_GELU_CHUNK, len = n - lo < BG_GELU_CHUNK ? n - lo : BG_GELU_CHUNK;
        bg__gelu_bwd_chunk(din + lo, in + lo, dout + lo, len);
    }
}

/* Bias + GELU fused (the MLP's fc -> gelu, models/layer.c): one pass each
 * way instead of two. Forward: pre += bias and out = gelu(pre), row by row
 * (rows to threads), the element operations of bias_forward then
 * gelu_forward. Backward: din = gelu'(pre) dout and dbias += the column sums
 * of din, by ranges of columns (ranges to threads), each column summed over
 * the rows in row order in double as bias_backward does. So both give the
 * bits of the two unfused kernels, for any thread count. At the MLP's shape
 * (256 x 1024, one thread): forward 0.86-0.88, backward 0.89-0.90 of the
 * unfused pair's time (docs/kernels.md). */
static void bg__bias_gelu_row(float *restrict pre, float *restrict out, const float *restrict bias, int C)
{
    for (int c = 0; c < C; c++) {
        float x = pre[c] + bias[c];
        pre[c] = x;
        out[c] = bg__gelu_of(x);
    }
}

static void bg__k_bias_gelu_forward(bg_backend_t *be, float *pre, float *out, const float *bias, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++)
        bg__bias_gelu_row(pre + (size_t)n * C, out + (size_t)n * C, bias, C);
}

/* Columns c0..c0+cn of every row: din, and their sums over the rows in row
 * order (double, as bias_backward) added to dbias. The column sums live in
 * acc (cn doubles). */
static void bg__gelu_bias_bwd_cols(float *restrict din, float *restrict dbias, const float *restrict pre,
                                   const float *restrict dout, double *restrict acc, int N, int C, int cn)
{
    for (int c = 0; c < cn; c++)
        acc[c] = 0;
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        for (int c = 0; c < cn; c++) {
            float d = bg__gelu_grad_of(pre[o + c], dout[o + c]);
            din[o + c] = d;
            acc[c] += d;
        }
    }
    for (int c = 0; c < cn; c++)
        dbias[c] += (float)acc[c];
}

/* The columns go to the threads in ranges of whole BG_CPU_COL_BLOCK blocks
 * (one range per thread, so each thread's rows stay long); a column's sum is
 * the same serial sum whoever computes it, so the bits do not depend on the
 * thread count. The sums of a range are kept on the stack up to
 * BG_GELU_BIAS_COLS columns, in ranges of at most that many. */
#define BG_GELU_BIAS_COLS 2048
static void bg__k_gelu_bias_backward(bg_backend_t *be, float *din, float *dbias, const float *pre, const float *dout,
                                     int N, int C)
{
    int nt = bg__cpu_nt(be);
    int nblk = (C + BG_CPU_COL_BLOCK - 1) / BG_CPU_COL_BLOCK;
    int par = nblk > 1 && BG_ROWS_PAR(N, C), parts = par ? nt : 1;
    int per = (nblk + parts - 1) / parts * BG_CPU_COL_BLOCK; /* columns per range */
    per = per < BG_GELU_BIAS_COLS ? per : BG_GELU_BIAS_COLS;
    int nr = (C + per - 1) / per;
#pragma omp parallel for num_threads(nt) if (par && nr > 1) schedule(static)
    for (int r = 0; r < nr; r++) {
        double acc[BG_GELU_BIAS_COLS];
        int c0 = r * per, cn = C - c0 < per ? C - c0 : per;
        bg__gelu_bias_bwd_cols(din + c0, dbias + c0, pre + c0, dout + c0, acc, N, C, cn);
    }
}

static void bg__k_relu_forward(bg_backend_t *be, float *out, const float *in, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

static void bg__k_relu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++)
        din[i] = in[i] > 0.0f ? dout[i] : 0.0f;
}

/* ------------------------------------------------------------- LayerNorm */

/* One row: mean and variance (two passes) in double over fixed lanes
 * (cpu_vec.h), the normalisation in float. */
static void bg__ln_fwd_row(float *restrict o, float *mean, float *rstd, const float *restrict x,
                           const float *restrict w, const float *restrict b, int C)
{
    double mu = bg__sum_f(x, C) / C;
    double v = bg__sumsq_dev_f(x, mu, C);
    float m = (float)mu;
    float r = (float)(1.0 / sqrt(v / C + BG_LN_EPS));
    for (int c = 0; c < C; c++)
        o[c] = (x[c] - m) * r * w[c] + b[c];
    if (mean)
        *mean = m;
    if (rstd)
        *rstd = r;
}

static void bg__k_layernorm_forward(bg_backend_t *be, float *out, float *mean, float *rstd, const float *in,
                                    const float *weight, const float *bias, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++)
        bg__ln_fwd_row(out + (size_t)n * C, mean ? mean + n : NULL, rstd ? rstd + n : NULL, in + (size_t)n * C,
                       weight, bias, C);
}

/* One row of the input gradient; dnorm = w * dy and norm = (x - m) r are
 * formed in float, their sums in double lanes. */
static void bg__ln_bwd_row(float *restrict dx, const float *restrict dy, const float *restrict x,
                           const float *restrict w, float m, float r, int C)
{
    double a1[BG_VEC_LANES], a2[BG_VEC_LANES];
    bg__d4 v1[2] = {{0}}, v2[2] = {{0}};
    int c = 0;
    for (; c + BG_VEC_LANES <= C; c += BG_VEC_LANES)
        for (int h = 0; h < 2; h++) {
            int o = c + 4 * h;
            bg__f4 norm = (*(const bg__f4 *)(x + o) - m) * r;
            bg__f4 dnorm = *(const bg__f4 *)(w + o) * *(const bg__f4 *)(dy + o);
            bg__d4 dn = __builtin_convertvector(dnorm, bg__d4);
            v1[h] += dn;
            v2[h] += dn * __builtin_convertvector(norm, bg__d4);
        }
    BG_D8_STORE(a1, v1[0], v1[1]), BG_D8_STORE(a2, v2[0], v2[1]);
    for (int j = 0; c + j < C; j++) {
        float norm = (x[c + j] - m) * r;
        float dnorm = w[c + j] * dy[c + j];
        a1[j] += (double)dnorm;
        a2[j] += (double)dnorm * (double)norm;
    }
    float dmean = (float)(bg__lanes_total(a1) / C), dnm = (float)(bg__lanes_total(a2) / C);
    for (c = 0; c < C; c++) {
        float norm = (x[c] - m) * r;
        float dnorm = w[c] * dy[c];
        dx[c] = (dnorm - dmean - norm * dnm) * r;
    }
}

static void bg__k_layernorm_backward_input(bg_backend_t *be, float *din, const float *dout, const float *in,
                                           const float *weight, const float *mean, const float *rstd, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++)
        bg__ln_bwd_row(din + (size_t)n * C, dout + (size_t)n * C, in + (size_t)n * C, weight, mean[n], rstd[n], C);
}

/* One column block of the weight gradient: rows in order, per-column double
 * accumulators (vectorised across the block's columns). */
static void bg__ln_wgrad_block(double *restrict aw, double *restrict ab, const float *dout,
                               const float *in, const float *mean, const float *rstd, int N, int C,
                               int c0, int cn)
{
    for (int n = 0; n < N; n++) {
        const float *restrict x = in + (size_t)n * C + c0, *restrict dy = dout + (size_t)n * C + c0;
        float m = mean[n], r = rstd[n];
        for (int c = 0; c < cn; c++) {
            float norm = (x[c] - m) * r;
            aw[c] += (double)(dy[c] * norm);
            ab[c] += (double)dy[c];
        }
    }
}

static void bg__k_layernorm_backward_weight(bg_backend_t *be, float *dweight, float *dbias, const float *dout,
                                            const float *in, const float *mean, const float *rstd, int N, int C)
{
    int nt = bg__cpu_nt(be);
    int nblk = (C + BG_CPU_COL_BLOCK - 1) / BG_CPU_COL_BLOCK;
#pragma omp parallel for num_threads(nt) if (nblk > 1 && BG_ROWS_PAR(N, C)) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * BG_CPU_COL_BLOCK;
        int cn = C - c0 < BG_CPU_COL_BLOCK ? C - c0 : BG_CPU_COL_BLOCK;
        double aw[BG_CPU_COL_BLOCK] = {0}, ab[BG_CPU_COL_BLOCK] = {0};
        bg__ln_wgrad_block(aw, ab, dout, in, mean, rstd, N, C, c0, cn);
        for (int c = 0; c < cn; c++) {
            if (dweight)
                dweight[c0 + c] += (float)aw[c];
            if (dbias)
                dbias[c0 + c] += (float)ab[c];
        }
    }
}

/* --------------------------------------------------------------- softmax */

/* Numerically stable softmax of x[0..n) * scale into y (y may equal x); the
 * sum of the exponentials in double lanes. Returns that sum and, when mx_p is
 * not NULL, the maximum subtracted. */
static double bg__softmax_row(float *y, float *mx_p, const float *x, float scale, int n)
{
    float mx = bg__max_scaled_f(x, scale, n);
    if (mx_p)
        *mx_p = mx;
    double s = bg__exp_shift_sum(y, x, scale, mx, n);
    float inv = (float)(1.0 / s);
    for (int j = 0; j < n; j++)
        y[j] *= inv;
    return s;
}

/* y[j] = scale * a[j] * (da[j] - sum_k a[k] da[k]) (dy may equal da) */
static void bg__softmax_bwd_row(float *dy, const float *da, const float *a, float scale, int n)
{
    float d = (float)bg__dot_f(a, da, n);
    for (int j = 0; j < n; j++)
        dy[j] = scale * a[j] * (da[j] - d);
}

static void bg__k_softmax_forward(bg_backend_t *be, float *out, const float *in, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++)
        bg__softmax_row(out + (size_t)n * C, NULL, in + (size_t)n * C, 1.0f, C);
}

static void bg__k_softmax_backward(bg_backend_t *be, float *din, const float *dout, const float *out, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++)
        bg__softmax_bwd_row(din + (size_t)n * C, dout + (size_t)n * C, out + (size_t)n * C, 1.0f, C);
}

/* In place (att == preatt) is allowed: the causal softmax ops are kept for
 * backends and tests (attention itself is the fused kernel of cpu_attention.c). */
static void bg__k_causal_softmax_forward(bg_backend_t *be, float *att, const float *preatt, float scale, int BH, int T)
{
    int nt = bg__cpu_nt(be);
    long long rows = (long long)BH * T;
#pragma omp parallel for num_threads(nt) if (rows > 1 && (size_t)rows * T > BG_CPU_PAR_WORK) schedule(static)
    for (long long r = 0; r < rows; r++) {
        int i = (int)(r % T);
        float *y = att + (size_t)r * T;
        bg__softmax_row(y, NULL, preatt + (size_t)r * T, scale, i + 1);
        memset(y + i + 1, 0, (size_t)(T - i - 1) * sizeof(float));
    }
}

/* In place (dpreatt == datt) is allowed. */
static void bg__k_causal_softmax_backward(bg_backend_t *be, float *dpreatt, const float *datt, const float *att,
                                          float scale, int BH, int T)
{
    int nt = bg__cpu_nt(be);
    long long rows = (long long)BH * T;
#pragma omp parallel for num_threads(nt) if (rows > 1 && (size_t)rows * T > BG_CPU_PAR_WORK) schedule(static)
    for (long long r = 0; r < rows; r++) {
        int i = (int)(r % T);
        float *dp = dpreatt + (size_t)r * T;
        bg__softmax_bwd_row(dp, datt + (size_t)r * T, att + (size_t)r * T, scale, i + 1);
        memset(dp + i + 1, 0, (size_t)(T - i - 1) * sizeof(float));
    }
}

/* --------------------------------------------------------- cross-entropy */

static void bg__scale_row(float *restrict d, const float *restrict p, float s, int n)
{
    for (int j = 0; j < n; j++)
        d[j] = p[j] * s;
}

static void bg__k_crossentropy_forward(bg_backend_t *be, float *losses, float *probs, const float *logits,
                                       const int32_t *targets, int N, int V)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, V)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float mx;
        double s = bg__softmax_row(probs + (size_t)n * V, &mx, x, 1.0f, V);
        int32_t t = targets[n];
        assert(t >= 0 && t < V && "crossentropy target out of [0, V): the layer validates tokens");
        /* log-sum-exp form: finite even when the target's probability underflows */
        losses[n] = (t >= 0 && t < V) ? (float)(log(s) - (double)(x[t] - mx)) : NAN;
    }
}

/* dlogits = probs * dloss, then the target's entry (p - 1) * dloss: the same
 * bits as (p - onehot) * dloss. */
static void bg__k_crossentropy_backward(bg_backend_t *be, float *dlogits, const float *probs, const int32_t *targets,
                                        float dloss, int N, int V)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(N, V)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        bg__scale_row(d, p, dloss, V);
        int32_t t = targets[n];
        if (t >= 0 && t < V)
            d[t] = (p[t] - 1.0f) * dloss;
    }
}

/* ------------------------------------------------------------- embedding */

static void bg__k_embedding_forward(bg_backend_t *be, float *out, const int32_t *tokens, const float *wte,
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
static void bg__k_embedding_backward(bg_backend_t *be, float *dwte, float *dwpe, const float *dout,
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

static void bg__k_qkv_split(bg_backend_t *be, float *q, float *k, float *v, const float *qkv, int B, int T, int NH,
                            int hs)
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

static void bg__k_qkv_merge(bg_backend_t *be, float *dqkv, const float *dq, const float *dk, const float *dv, int B,
                            int T, int NH, int hs)
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

/* Copies between the rows [B*T, NH*hs] and the heads [B, NH, T, hs]: to_rows
 * reads heads from src into rows of dst (merge), else rows into heads (split). */
static void bg__heads_move(bg_backend_t *be, float *dst, const float *src, int to_rows, int B, int T, int NH, int hs)
{
    int nt = bg__cpu_nt(be);
    int C = NH * hs;
    int rows = B * T;
#pragma omp parallel for num_threads(nt) if (BG_ROWS_PAR(rows, C)) schedule(static)
    for (int r = 0; r < rows; r++) {
        int b = r / T, t = r % T;
        for (int h = 0; h < NH; h++) {
            size_t ro = (size_t)r * C + (size_t)h * hs, ho = (((size_t)b * NH + h) * T + t) * hs;
            memcpy(dst + (to_rows ? ro : ho), src + (to_rows ? ho : ro), (size_t)hs * sizeof(float));
        }
    }
}

static void bg__k_heads_merge(bg_backend_t *be, float *out, const float *y, int B, int T, int NH, int hs)
{
    bg__heads_move(be, out, y, 1, B, T, NH, hs);
}

static void bg__k_heads_split(bg_backend_t *be, float *dy, const float *dout, int B, int T, int NH, int hs)
{
    bg__heads_move(be, dy, dout, 0, B, T, NH, hs);
}

/* ------------------------------------------------------------ reductions */

/* One block of the backend's sum and sumsq (cpu_backend.c). */
static double bg__k_reduce_block(const float *restrict x, size_t n, int sq)
{
    return sq ? bg__dot_f(x, x, (int)n) : bg__sum_f(x, (int)n);
}

/* dst (cols, rows) = src (rows, cols) transposed, 8 x 8 blocks through
 * registers (cpu_vec.h's bg__tr8x8), scalar loops for the edges past the
 * last multiple of 8. Stripes of h source rows (32, then 16 and 8 for what
 * is left) walk all columns, so each row of dst receives h contiguous floats
 * at once (whole 64-byte lines from 16 rows up) and a row of src is read
 * from one place for h / 8 blocks' worth of columns. With 8-row stripes each
 * dst line was written in two halves, far apart in time, its rows ldd apart:
 * at power-of-two ldd they fall in few L1 sets, and the first half was evicted
 * before the second came (a 512 x 256 source in L1/L2, Emerald Rapids, AVX2:
 * 0.91 -> 0.61 cycles per float; 1024 x 256: 1.59 -> 1.18). */
static void bg__transpose_stripe(float *restrict dst, size_t ldd, const float *restrict src, size_t lds, int h,
                                 int cols)
{
    int c8 = cols & ~7;
    for (int c0 = 0; c0 < c8; c0 += 8)
        for (int b = 0; b < h; b += 8) {
            bg__v8 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = *(const bg__v8 *)(src + (size_t)(b + i) * lds + c0);
            bg__tr8x8(dst + (size_t)c0 * ldd + b, ldd, r);
        }
    for (int c = c8; c < cols; c++)
        for (int i = 0; i < h; i++)
            dst[(size_t)c * ldd + i] = src[(size_t)i * lds + c];
}

static void bg__k_transpose(float *restrict dst, size_t ldd, const float *restrict src, size_t lds, int rows,
                            int cols)
{
    int r0 = 0;
    for (int h = 32; h >= 8; h /= 2)
        for (; r0 + h <= rows; r0 += h)
            bg__transpose_stripe(dst + r0, ldd, src + (size_t)r0 * lds, lds, h, cols);
    for (int r = r0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

/* ----------------------------------------------------------------- table */

#define bg__k_attention_forward BG_ISA_FN(bg__k_attention_forward)
#define bg__k_attention_backward BG_ISA_FN(bg__k_attention_backward)
#define bg__k_rmsnorm_forward BG_ISA_FN(bg__k_rmsnorm_forward)
#define bg__k_rmsnorm_backward_input BG_ISA_FN(bg__k_rmsnorm_backward_input)
#define bg__k_rmsnorm_backward_weight BG_ISA_FN(bg__k_rmsnorm_backward_weight)
#define bg__k_swiglu_forward BG_ISA_FN(bg__k_swiglu_forward)
#define bg__k_swiglu_backward BG_ISA_FN(bg__k_swiglu_backward)
#define bg__k_rope BG_ISA_FN(bg__k_rope)
#define bg__k_gqa_expand BG_ISA_FN(bg__k_gqa_expand)
#define bg__k_gqa_reduce BG_ISA_FN(bg__k_gqa_reduce)
#define bg__k_attention_block_forward BG_ISA_FN(bg__k_attention_block_forward)
#define bg__k_attention_block_backward BG_ISA_FN(bg__k_attention_block_backward)
#define bg__k_gqa_attention_forward BG_ISA_FN(bg__k_gqa_attention_forward)
#define bg__k_gqa_attention_backward BG_ISA_FN(bg__k_gqa_attention_backward)
const bg__cpu_kernels_t BG_ISA_FN(bg__cpu_kernels) = {
#define BG__CPU_KFILL(name, params, args) .name = bg__k_##name,
    BG_CPU_ISA_KERNELS(BG__CPU_KFILL)
#undef BG__CPU_KFILL
    .reduce_block = bg__k_reduce_block,
    .transpose = bg__k_transpose,
    .isa = BG_ISA_COMPILED,
};
