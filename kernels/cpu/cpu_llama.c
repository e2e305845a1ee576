/* kernels/cpu/cpu_llama.c: the CPU backend's Llama-style kernels: RMSNorm,
 * SwiGLU, rotary position embedding and grouped-query attention's layout
 * (the op slots of the same names, include/brigade/backend.h). Compiled once
 * per vector ISA, as cpu_nn.c (kernels/CMakeLists.txt; cpu_nn.c puts these
 * in its table), OpenMP over rows.
 *
 * Determinism rule (as cpu_nn.c): row-wise kernels give each row to one
 * thread; rmsnorm_backward_weight gives each block of BG_CPU_COL_BLOCK
 * columns to one thread, which sums over rows in row order in double. So
 * every output is bitwise identical for any thread count. Compiled without
 * FMA contraction (C11 default), the row sums in cpu_vec.h's fixed double
 * lanes and the exponential cpu_vec.h's bg__expf, so the bits do not depend
 * on the ISA either (test_kernels compares them across ISAs).
 *
 * Must not print or exit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_vec.h"

#define ROWS_PAR(N, C) ((size_t)(N) * (size_t)(C) > BG_CPU_PAR_WORK && (N) > 1)

/* ---------------------------------------------------------------- RMSNorm */

void BG_ISA_FN(bg__k_rmsnorm_forward)(bg_backend_t *be, float *out, float *rstd, const float *in,
                                      const float *weight, float eps, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = in + (size_t)n * C;
        float *y = out + (size_t)n * C;
        float s = (float)(1.0 / sqrt(bg__dot_f(x, x, C) / C + (double)eps));
        rstd[n] = s;
        for (int c = 0; c < C; c++)
            y[c] = x[c] * s * weight[c];
    }
}

/* sum over c of (double)(w dy) * (double)(x s), in cpu_vec.h's lanes (its
 * bg__dot_f with the two float products formed first) */
static inline double bg__rms_dot(const float *restrict w, const float *restrict dy, const float *restrict x,
                                 float s, int n)
{
    double acc[BG_VEC_LANES];
    bg__d4 lo = {0}, hi = {0};
    int i = 0;
    for (; i + BG_VEC_LANES <= n; i += BG_VEC_LANES) {
        bg__f4 a0 = *(const bg__f4 *)(w + i) * *(const bg__f4 *)(dy + i), b0 = *(const bg__f4 *)(x + i) * s;
        bg__f4 a1 = *(const bg__f4 *)(w + i + 4) * *(const bg__f4 *)(dy + i + 4),
               b1 = *(const bg__f4 *)(x + i + 4) * s;
        lo += __builtin_convertvector(a0, bg__d4) * __builtin_convertvector(b0, bg__d4);
        hi += __builtin_convertvector(a1, bg__d4) * __builtin_convertvector(b1, bg__d4);
    }
    BG_D8_STORE(acc, lo, hi);
    for (int j = 0; i + j < n; j++)
        acc[j] += (double)(w[i + j] * dy[i + j]) * (double)(x[i + j] * s);
    return bg__lanes_total(acc);
}

void BG_ISA_FN(bg__k_rmsnorm_backward_input)(bg_backend_t *be, float *din, const float *dout, const float *in,
                                             const float *weight, const float *rstd, int N, int C)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (ROWS_PAR(N, C)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = in + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = din + (size_t)n * C, s = rstd[n];
        float m = (float)(bg__rms_dot(weight, dy, x, s, C) / C);
        for (int c = 0; c < C; c++)
            dx[c] = s * (weight[c] * dy[c] - x[c] * s * m);
    }
}

void BG_ISA_FN(bg__k_rmsnorm_backward_weight)(bg_backend_t *be, float *dweight, const float *dout, const float *in,
                                              const float *rstd, int N, int C)
{
    int nt = bg__cpu_nt(be);
    int nblk = (C + BG_CPU_COL_BLOCK - 1) / BG_CPU_COL_BLOCK;
#pragma omp parallel for num_threads(nt) if (nblk > 1 && ROWS_PAR(N, C)) schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * BG_CPU_COL_BLOCK;
        int cn = C - c0 < BG_CPU_COL_BLOCK ? C - c0 : BG_CPU_COL_BLOCK;
        double a[BG_CPU_COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *x = in + (size_t)n * C + c0, *dy = dout + (size_t)n * C + c0;
            for (int c = 0; c < cn; c++)
                a[c] += (double)(dy[c] * (x[c] * rstd[n]));
        }
        for (int c = 0; c < cn; c++)
            dweight[c0 + c] += (float)a[c];
    }
}

/* ----------------------------------------------------------------- SwiGLU */

/* 1 / (1 + e^-a) with cpu_vec.h's exponential (vectorised; libm's expf kept
 * these loops scalar): a below -88.38 gives about 2^-127 instead of 0 */
static inline float bg__sigmoidf(float a) { return 1.0f / (1.0f + bg__expf(-a)); }

void BG_ISA_FN(bg__k_swiglu_forward)(bg_backend_t *be, float *out, const float *in, int N, int H)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (ROWS_PAR(N, H)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *a = in + (size_t)n * 2 * H, *b = a + H;
        float *y = out + (size_t)n * H;
        for (int i = 0; i < H; i++)
            y[i] = a[i] * bg__sigmoidf(a[i]) * b[i];
    }
}

/* d a = dy b silu'(a), silu'(a) = s + a s (1 - s); d b = dy silu(a) */
void BG_ISA_FN(bg__k_swiglu_backward)(bg_backend_t *be, float *din, const float *in, const float *dout, int N, int H)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (ROWS_PAR(N, H)) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *a = in + (size_t)n * 2 * H, *b = a + H, *dy = dout + (size_t)n * H;
        float *da = din + (size_t)n * 2 * H, *db = da + H;
        for (int i = 0; i < H; i++) {
            float s = bg__sigmoidf(a[i]);
            da[i] = dy[i] * b[i] * (s + a[i] * s * (1.0f - s));
            db[i] = dy[i] * a[i] * s;
        }
    }
}

/* -------------------------------------------------------------------- RoPE */

/* cos and sin of the T positions' angles, p * theta^(-2i/hs) for p = pos0 .. pos0+T-1, i < hs/2, in double
 * then rounded, into cs and sn (T x hs/2): computed once per call, not per row (the same table whatever the
 * row's place in the batch). inv (hs/2) is scratch for the frequencies. */
static void rope_table(float *cs, float *sn, double *inv, int pos0, int T, int hs, float theta)
{
    int half = hs / 2;
    for (int i = 0; i < half; i++)
        inv[i] = pow((double)theta, -2.0 * i / hs);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double a = (double)(pos0 + t) * inv[i];
            cs[(size_t)t * half + i] = (float)cos(a);
            sn[(size_t)t * half + i] = (float)sin(a);
        }
}

void BG_ISA_FN(bg__k_rope)(bg_backend_t *be, float *out, const float *in, int B, int T, int G, int R, int hs,
                           float theta, int pos0, int inverse)
{
    int nt = bg__cpu_nt(be), half = hs / 2, C = G * (R + 1) * hs;
    float *tab = malloc((size_t)T * half * 2 * sizeof(float) + 1);
    double inv[512]; /* hs <= 1024 (the layer checks) */
    if (tab)
        rope_table(tab, tab + (size_t)T * half, inv, pos0, T, hs, theta);
#pragma omp parallel for num_threads(nt) if (ROWS_PAR(B * T, C)) schedule(static)
    for (int r = 0; r < B * T; r++) {
        float row_cs[512], row_sn[512];
        double row_inv[512];
        const float *cs = row_cs, *sn = row_sn;
        if (tab) {
            cs = tab + (size_t)(r % T) * half;
            sn = tab + (size_t)T * half + (size_t)(r % T) * half;
        } else { /* no memory for the table: this row's angles alone, the same values */
            rope_table(row_cs, row_sn, row_inv, pos0 + r % T, 1, hs, theta);
        }
        const float *x = in + (size_t)r * C;
        float *y = out + (size_t)r * C;
        for (int g = 0; g < G; g++)
            for (int h = 0; h <= R; h++) {
                size_t o = ((size_t)g * (R + 1) + h) * hs;
                if (h == R) { /* the group's value head */
                    if (y != x)
                        memcpy(y + o, x + o, (size_t)hs * sizeof(float));
                    continue;
                }
                for (int i = 0; i < half; i++) {
                    float x1 = x[o + i], x2 = x[o + i + half], s = inverse ? -sn[i] : sn[i];
                    y[o + i] = x1 * cs[i] - x2 * s;
                    y[o + i + half] = x1 * s + x2 * cs[i];
                }
            }
    }
    free(tab);
}

/* ------------------------------------------------- grouped-query layout */

void BG_ISA_FN(bg__k_gqa_expand)(bg_backend_t *be, float *qkv, const float *grouped, int B, int T, int G, int g,
                                 int hs)
{
    int nt = bg__cpu_nt(be);
    size_t C = (size_t)G * g * hs, Cg = (size_t)G * (g + 2) * hs, hb = (size_t)hs * sizeof(float);
#pragma omp parallel for num_threads(nt) if (ROWS_PAR(B * T, 3 * C)) schedule(static)
    for (int r = 0; r < B * T; r++) {
        const float *x = grouped + (size_t)r * Cg;
        float *y = qkv + (size_t)r * 3 * C;
        for (int j = 0; j < G; j++) {
            const float *grp = x + (size_t)j * (g + 2) * hs;
            memcpy(y + (size_t)j * g * hs, grp, (size_t)g * hb);
            for (int i = 0; i < g; i++) {
                size_t h = (size_t)j * g + i;
                memcpy(y + C + h * hs, grp + (size_t)g * hs, hb);
                memcpy(y + 2 * C + h * hs, grp + (size_t)(g + 1) * hs, hb);
            }
        }
    }
}

void BG_ISA_FN(bg__k_gqa_reduce)(bg_backend_t *be, float *dgrouped, const float *dqkv, int B, int T, int G, int g,
                                 int hs)
{
    int nt = bg__cpu_nt(be);
    size_t C = (size_t)G * g * hs, Cg = (size_t)G * (g + 2) * hs;
#pragma omp parallel for num_threads(nt) if (ROWS_PAR(B * T, 3 * C)) schedule(static)
    for (int r = 0; r < B * T; r++) {
        const float *x = dqkv + (size_t)r * 3 * C;
        float *y = dgrouped + (size_t)r * Cg;
        for (int j = 0; j < G; j++) {
            float *grp = y + (size_t)j * (g + 2) * hs, *dk = grp + (size_t)g * hs, *dv = dk + hs;
            memcpy(grp, x + (size_t)j * g * hs, (size_t)g * hs * sizeof(float));
            /* each column the sum of its g copies in order, from 0; copy by copy, so the columns vectorise */
            for (int c = 0; c < hs; c++)
                dk[c] = dv[c] = 0.0f;
            for (int i = 0; i < g; i++) {
                const float *xk = x + C + ((size_t)j * g + i) * hs, *xv = xk + C;
                for (int c = 0; c < hs; c++) {
                    dk[c] += xk[c];
                    dv[c] += xv[c];
                }
            }
        }
    }
}
