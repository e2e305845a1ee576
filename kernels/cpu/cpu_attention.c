/* kernels/cpu/cpu_attention.c: the CPU backend's fused causal attention,
 * flash-style: keys and values are visited in tiles of BG_ATT_BK with an
 * online softmax, so no T x T matrix exists, and key tiles wholly above the
 * diagonal are never touched (the masked half is skipped up to one tile per
 * row). Reads q, k, v straight from the packed qkv (B,T,3C) and writes the
 * output in (B,T,C): no layout copies. Owns no memory: the caller passes the
 * per-row logsumexp (kept for the backward) and the backward's scratch.
 *
 * Determinism: one (batch, head) pair is one thread's work from start to
 * end, and inside it every sum runs in a fixed order (rows, then key tiles
 * in order, lanes as cpu_vec.h fixes them), so results are bitwise the same
 * for any thread count. Must not print or exit. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_vec.h"

/* Key tile (columns of a score row): 32 floats are two AVX-512 or four AVX2
 * registers. Query rows are processed one at a time against a transposed key
 * tile that BG_ATT_BQ rows share. */
#define BG_ATT_BK 32
#define BG_ATT_BQ 64
/* The transposed tiles live on the stack: hs * BG_ATT_BK floats each, for
 * head sizes up to BG_ATT_MAX_HS (GPT's are 64-128). Larger heads take a
 * slower path of plain dot products, with no transposed tile. */
#define BG_ATT_MAX_HS 256
#define BG_ATT_MAX_TILE (BG_ATT_MAX_HS * BG_ATT_BK)

/* kt (hs, BK) = k rows j0..j0+nk of one head, transposed, zero past nk.
 * k rows are ld apart. */
static void bg__att_transpose(float *restrict kt, const float *restrict k, size_t ld, int nk, int hs)
{
    for (int d = 0; d < hs; d++) {
        float *row = kt + (size_t)d * BG_ATT_BK;
        for (int j = 0; j < nk; j++)
            row[j] = k[(size_t)j * ld + d];
        for (int j = nk; j < BG_ATT_BK; j++)
            row[j] = 0.0f;
    }
}

/* s[0..BK) = q . k_j for the tile's keys (0 past nk): with kt (hs, BK) the
 * transposed tile, vectorised across keys; without (large heads), as dot
 * products of the key rows (ld apart). */
static inline void bg__att_scores(float *restrict s, const float *restrict q, const float *restrict kt,
                                  const float *restrict k, size_t ld, int nk, int hs)
{
    if (!kt) {
        for (int j = 0; j < BG_ATT_BK; j++)
            s[j] = j < nk ? (float)bg__dot_f(q, k + (size_t)j * ld, hs) : 0.0f;
        return;
    }
    for (int j = 0; j < BG_ATT_BK; j++)
        s[j] = 0.0f;
    for (int d = 0; d < hs; d++) {
        float qd = q[d];
        const float *restrict kr = kt + (size_t)d * BG_ATT_BK;
        for (int j = 0; j < BG_ATT_BK; j++)
            s[j] += qd * kr[j];
    }
}

/* y[0..n) += a * x[0..n) */
static inline void bg__att_axpy(float *restrict y, float a, const float *restrict x, int n)
{
    for (int d = 0; d < n; d++)
        y[d] += a * x[d];
}

/* One (batch, head): rows of q/k/v are ld = 3C apart, of o C apart. */
BG_CPU_CLONES static void bg__att_fwd_head(float *o, float *lse, const float *q, const float *k, const float *v,
                                           size_t ld, size_t ldo, int T, int hs, float scale)
{
    float ktile[BG_ATT_MAX_TILE];
    float *kt = hs <= BG_ATT_MAX_HS ? ktile : NULL;
    float s[BG_ATT_BK];
    for (int i0 = 0; i0 < T; i0 += BG_ATT_BQ) {
        int nq = T - i0 < BG_ATT_BQ ? T - i0 : BG_ATT_BQ;
        float m[BG_ATT_BQ], l[BG_ATT_BQ];
        for (int i = 0; i < nq; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
            memset(o + (size_t)(i0 + i) * ldo, 0, (size_t)hs * sizeof(float));
        }
        /* key tiles j0 <= the tile's last row */
        for (int j0 = 0; j0 < i0 + nq; j0 += BG_ATT_BK) {
            int nk = T - j0 < BG_ATT_BK ? T - j0 : BG_ATT_BK;
            if (kt)
                bg__att_transpose(kt, k + (size_t)j0 * ld, ld, nk, hs);
            for (int i = 0; i < nq; i++) {
                int ti = i0 + i;
                if (j0 > ti)
                    continue;
                int nv = ti - j0 + 1 < nk ? ti - j0 + 1 : nk; /* keys j0..j0+nv-1 are visible */
                bg__att_scores(s, q + (size_t)ti * ld, kt, k + (size_t)j0 * ld, ld, nk, hs);
                float mx = m[i];
                for (int j = 0; j < nv; j++) {
                    float x = scale * s[j];
                    mx = x > mx ? x : mx;
                }
                float corr = bg__expf(m[i] - mx); /* 0 on the first tile (m = -inf) */
                float psum = 0.0f;
                for (int j = 0; j < BG_ATT_BK; j++) {
                    float p = j < nv ? bg__expf(scale * s[j] - mx) : 0.0f;
                    s[j] = p;
                    psum += p;
                }
                m[i] = mx;
                l[i] = l[i] * corr + psum;
                float *orow = o + (size_t)ti * ldo;
                for (int d = 0; d < hs; d++)
                    orow[d] *= corr;
                for (int j = 0; j < nv; j++)
                    bg__att_axpy(orow, s[j], v + (size_t)(j0 + j) * ld, hs);
            }
        }
        for (int i = 0; i < nq; i++) {
            float inv = 1.0f / l[i];
            float *orow = o + (size_t)(i0 + i) * ldo;
            for (int d = 0; d < hs; d++)
                orow[d] *= inv;
            lse[i0 + i] = m[i] + logf(l[i]);
        }
    }
}

/* The shapes both entry points share: rows of qkv are ld = 3C apart, of out
 * ldo = C; (batch, head) pair bh starts at qoff(bh) in qkv and ooff(bh) in
 * out; par says whether the heads are worth an OpenMP region. */
typedef struct {
    size_t ld, ldo;
    int NH, hs, T, BH, par;
    float scale;
} bg__att_dims_t;

static bg__att_dims_t bg__att_dims(int B, int T, int NH, int hs)
{
    bg__att_dims_t d = {(size_t)3 * NH * hs, (size_t)NH * hs, NH, hs, T, B * NH, 0, 1.0f / sqrtf((float)hs)};
    d.par = d.BH > 1 && (size_t)d.BH * T * T * hs > BG_CPU_PAR_WORK;
    return d;
}
static size_t bg__att_qoff(const bg__att_dims_t *d, int bh)
{
    return (size_t)(bh / d->NH) * d->T * d->ld + (size_t)(bh % d->NH) * d->hs;
}
static size_t bg__att_ooff(const bg__att_dims_t *d, int bh)
{
    return (size_t)(bh / d->NH) * d->T * d->ldo + (size_t)(bh % d->NH) * d->hs;
}

void bg__cpu_attention_forward(bg_backend_t *be, float *out, float *lse, const float *qkv, int B, int T, int NH,
                               int hs)
{
    int nt = bg__cpu_nt(be);
    bg__att_dims_t d = bg__att_dims(B, T, NH, hs);
    size_t C = d.ldo;
#pragma omp parallel for num_threads(nt) if (d.par) schedule(dynamic, 1)
    for (int bh = 0; bh < d.BH; bh++) {
        const float *q = qkv + bg__att_qoff(&d, bh);
        bg__att_fwd_head(out + bg__att_ooff(&d, bh), lse + (size_t)bh * T, q, q + C, q + 2 * C, d.ld, d.ldo, T, hs,
                         d.scale);
    }
}

/* Backward of one (batch, head), FlashAttention-2 style: for each key tile,
 * every query row at or below it recomputes its probabilities from the saved
 * logsumexp, P = exp(scale q k^T - lse), then
 *   dV_j += P^T dO,  dP = dO V_j^T,  dS = P (dP - D),  D = rowsum(dO o O),
 *   dQ += scale dS K_j,  dK_j += scale dS^T Q.
 * dK and dV of the tile are summed over rows in order in dk/dv (the
 * destination rows of dqkv, zeroed first); dQ rows over key tiles in order. */
BG_CPU_CLONES static void bg__att_bwd_head(float *dq, float *dk, float *dv, float *dvec, const float *dout,
                                           const float *o, const float *lse, const float *q, const float *k,
                                           const float *v, size_t ld, size_t ldo, int T, int hs, float scale)
{
    float ktile[BG_ATT_MAX_TILE], vtile[BG_ATT_MAX_TILE];
    float *kt = hs <= BG_ATT_MAX_HS ? ktile : NULL, *vt = kt ? vtile : NULL;
    float p[BG_ATT_BK], dp[BG_ATT_BK];
    for (int i = 0; i < T; i++) {
        dvec[i] = (float)bg__dot_f(dout + (size_t)i * ldo, o + (size_t)i * ldo, hs);
        memset(dq + (size_t)i * ld, 0, (size_t)hs * sizeof(float));
        memset(dk + (size_t)i * ld, 0, (size_t)hs * sizeof(float));
        memset(dv + (size_t)i * ld, 0, (size_t)hs * sizeof(float));
    }
    for (int j0 = 0; j0 < T; j0 += BG_ATT_BK) {
        int nk = T - j0 < BG_ATT_BK ? T - j0 : BG_ATT_BK;
        if (kt) {
            bg__att_transpose(kt, k + (size_t)j0 * ld, ld, nk, hs);
            bg__att_transpose(vt, v + (size_t)j0 * ld, ld, nk, hs);
        }
        for (int ti = j0; ti < T; ti++) {
            int nv = ti - j0 + 1 < nk ? ti - j0 + 1 : nk;
            const float *qrow = q + (size_t)ti * ld, *dorow = dout + (size_t)ti * ldo;
            bg__att_scores(p, qrow, kt, k + (size_t)j0 * ld, ld, nk, hs);
            bg__att_scores(dp, dorow, vt, v + (size_t)j0 * ld, ld, nk, hs);
            float li = lse[ti], di = dvec[ti];
            for (int j = 0; j < BG_ATT_BK; j++) {
                float pj = j < nv ? bg__expf(scale * p[j] - li) : 0.0f;
                p[j] = pj;
                dp[j] = pj * (dp[j] - di) * scale; /* scale dS */
            }
            float *dqrow = dq + (size_t)ti * ld;
            for (int j = 0; j < nv; j++) {
                bg__att_axpy(dqrow, dp[j], k + (size_t)(j0 + j) * ld, hs);
                bg__att_axpy(dk + (size_t)(j0 + j) * ld, dp[j], qrow, hs);
                bg__att_axpy(dv + (size_t)(j0 + j) * ld, p[j], dorow, hs);
            }
        }
    }
}

void bg__cpu_attention_backward(bg_backend_t *be, float *dqkv, float *dvec, const float *dout, const float *qkv,
                                const float *out, const float *lse, int B, int T, int NH, int hs)
{
    int nt = bg__cpu_nt(be);
    bg__att_dims_t d = bg__att_dims(B, T, NH, hs);
    size_t C = d.ldo;
#pragma omp parallel for num_threads(nt) if (d.par) schedule(dynamic, 1)
    for (int bh = 0; bh < d.BH; bh++) {
        size_t qoff = bg__att_qoff(&d, bh), ooff = bg__att_ooff(&d, bh);
        const float *q = qkv + qoff;
        float *dq = dqkv + qoff;
        bg__att_bwd_head(dq, dq + C, dq + 2 * C, dvec + (size_t)bh * T, dout + ooff, out + ooff, lse + (size_t)bh * T,
                         q, q + C, q + 2 * C, d.ld, d.ldo, T, hs, d.scale);
    }
}
