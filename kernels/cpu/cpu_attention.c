/* kernels/cpu/cpu_attention.c: the CPU backend's fused causal attention,
 * flash-style: keys and values are visited in tiles of BG_ATT_BK with an
 * online softmax, so no T x T matrix exists, and key tiles wholly above the
 * diagonal are never touched (the masked half is skipped up to one tile per
 * row). Reads q, k, v straight from the packed qkv (B,T,3C) (grouped-query
 * attention: from the grouped layout, each group's key and value heads shared
 * by its query heads) and writes the output in (B,T,C): no layout copies.
 * Owns no memory: the caller passes the per-row logsumexp (kept for the
 * backward) and the backward's scratch.
 *
 * Determinism: one (batch, head) pair (grouped-query attention: one (batch,
 * group), its heads in order) is one thread's work from start to end, and inside it every sum runs in a fixed order (rows, then key tiles
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
#define BG_ATT_BK 32 /* bg__att_sum_bk and bg__att_max_bk assume 32 */
#define BG_ATT_BQ 64
/* The transposed tiles live on the stack: hs * BG_ATT_BK floats each, for
 * head sizes up to BG_ATT_MAX_HS (GPT's are 64-128). Larger heads take a
 * slower path of plain dot products, with no transposed tile. */
#define BG_ATT_MAX_HS 256
#define BG_ATT_MAX_TILE (BG_ATT_MAX_HS * BG_ATT_BK)

/* kt (hs, BK) = k rows j0..j0+nk of one head, transposed, zero past nk.
 * k rows are ld apart. Whole 8 x 8 blocks go through registers (cpu_vec.h's
 * bg__tr8x8); a scalar loop takes the columns past the last multiple of 8. */
static inline __attribute__((always_inline)) void bg__att_transpose(float *restrict kt, const float *restrict k,
                            size_t ld, int nk, int hs)
{
    int d8 = hs & ~7;
    for (int d0 = 0; d0 < d8; d0 += 8)
        for (int j0 = 0; j0 < BG_ATT_BK; j0 += 8) {
            bg__v8 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = j0 + i < nk ? *(const bg__v8 *)(k + (size_t)(j0 + i) * ld + d0) : (bg__v8){0};
            bg__tr8x8(kt + (size_t)d0 * BG_ATT_BK + j0, BG_ATT_BK, r);
        }
    for (int d = d8; d < hs; d++) {
        float *row = kt + (size_t)d * BG_ATT_BK;
        for (int j = 0; j < nk; j++)
            row[j] = k[(size_t)j * ld + d];
        for (int j = nk; j < BG_ATT_BK; j++)
            row[j] = 0.0f;
    }
}

/* 4-float vectors: one register on every x86-64 ISA (see bg__att_sum_bk) */
typedef float bg__v4r __attribute__((vector_size(16)));
typedef int bg__v4ri __attribute__((vector_size(16)));
#define BG_VMAX(a, b, ti) ((__typeof__(a))((((ti)((a) > (b))) & (ti)(a)) | (~((ti)((a) > (b))) & (ti)(b))))
static inline __attribute__((always_inline)) bg__v4r bg__att_ld4(const float *x)
{
    bg__v4r v;
    memcpy(&v, x, sizeof(v));
    return v;
}
/* sum of a*b in float over 16 lanes (lane j takes elements j, j+16, ...),
 * added in a fixed tree (lane j + lane j+8, then + j+4, j+2, j+1): D =
 * rowsum(dO o O) of the backward. The lanes are four 4-float vectors (lanes
 * 4q..4q+3 in vector q), registers on every ISA: as a float[16] array GCC
 * kept them in memory on AVX2, each sum waiting on the previous store. */
static inline __attribute__((always_inline)) float bg__att_dot(const float *restrict a, const float *restrict b, int n)
{
    bg__v4r acc[4] = {{0}};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int q = 0; q < 4; q++)
            acc[q] += bg__att_ld4(a + i + 4 * q) * bg__att_ld4(b + i + 4 * q);
    float t[16];
    memcpy(t, acc, sizeof(t));
    for (int j = 0; i + j < n; j++)
        t[j] += a[i + j] * b[i + j];
    memcpy(acc, t, sizeof(t));
    bg__v4r h0 = acc[0] + acc[2], h1 = acc[1] + acc[3]; /* + lanes 8 apart */
    bg__v4r c = h0 + h1;                                /* + 4 apart */
    return (c[0] + c[2]) + (c[1] + c[3]);               /* + 2 apart, then + 1 apart */
}

/* Sum and maximum of a tile row of BG_ATT_BK = 32 floats in a fixed tree
 * (halves added lane by lane: 16, 8, 4 lanes, then (0 + 2) + (1 + 3)), in
 * registers: a serial chain over the row would cost its latency 32 times.
 * Written on 4-float vectors, which every x86-64 ISA holds in one register
 * (wider GCC vectors than the ISA's are split through the stack: on AVX2 a
 * 64-byte vector went through memory in 16-byte pieces, whose reloads as
 * 32-byte ones stall on store forwarding). */
static inline __attribute__((always_inline)) float bg__att_sum_bk(const float *x)
{
    bg__v4r a[4], b[2], c;
    for (int i = 0; i < 4; i++)
        a[i] = bg__att_ld4(x + 4 * i) + bg__att_ld4(x + 16 + 4 * i);
    b[0] = a[0] + a[2], b[1] = a[1] + a[3];
    c = b[0] + b[1];
    return (c[0] + c[2]) + (c[1] + c[3]);
}
static inline __attribute__((always_inline)) float bg__att_max_bk(const float *x)
{
    bg__v4r a[4], b[2], c;
    for (int i = 0; i < 4; i++)
        a[i] = BG_VMAX(bg__att_ld4(x + 4 * i), bg__att_ld4(x + 16 + 4 * i), bg__v4ri);
    b[0] = BG_VMAX(a[0], a[2], bg__v4ri), b[1] = BG_VMAX(a[1], a[3], bg__v4ri);
    c = BG_VMAX(b[0], b[1], bg__v4ri);
    float m02 = c[0] > c[2] ? c[0] : c[2], m13 = c[1] > c[3] ? c[1] : c[3];
    return m02 > m13 ? m02 : m13;
}

/* One row's online-softmax step on a key tile: s[0..BK) holds the raw
 * scores, keys j < nv are visible (nv >= 1). Folds the tile into the running
 * max *m and sum *l, turns s into the probabilities (0 past nv) and returns
 * the factor the row's output accumulated so far must be scaled by. */
static inline __attribute__((always_inline)) float bg__att_online(float *s, float *m, float *l, int nv, float scale)
{
    float x[BG_ATT_BK];
    for (int j = 0; j < BG_ATT_BK; j++)
        x[j] = j < nv ? scale * s[j] : -INFINITY;
    float mx = bg__att_max_bk(x);
    mx = mx > *m ? mx : *m;
    float corr = bg__expf(*m - mx); /* 0 on the first tile (m = -inf) */
    for (int j = 0; j < BG_ATT_BK; j++)
        s[j] = j < nv ? bg__expf(x[j] - mx) : 0.0f;
    *m = mx;
    *l = *l * corr + bg__att_sum_bk(s);
    return corr;
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
static void bg__att_fwd_head(float *o, float *lse, const float *q, const float *k, const float *v,
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
                float corr = bg__att_online(s, &m[i], &l[i], nv, scale);
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

/* ------------------------------------------------ register-blocked path */

/* Head sizes up to BG_ATT_BLK_HS (GPT's 64-128) take this path: BG_ATT_RB query
 * rows at a time against a key tile, in explicit vectors of the ISA's width
 * (GCC vector extensions: 16 floats on AVX-512, 8 on AVX2, 4 below), so each
 * loaded key or value vector feeds BG_ATT_RB multiply-adds and dK/dV/O
 * accumulate in small local tiles instead of one rank-1 update per row. The
 * columns go in groups of two vectors (BG_ATT_CW floats), so a 4-row block
 * holds 8 accumulators, 2 loaded vectors and a broadcast: 11 registers, which
 * AVX2's 16 hold (a whole 32-float tile row per group, 16 accumulators, did
 * not: it spilled). Every output element sums its products in the same order
 * whatever the width. Rows of V, K, Q and dO are copied into tiles padded to
 * HP = hs rounded up to 32 floats, zeros in the padding. */
#define BG_ATT_BLK_HS 128
#define BG_ATT_RB 4
#if defined(__AVX512F__)
#define BG_ATT_VW 16
#elif defined(__AVX__)
#define BG_ATT_VW 8
#else
#define BG_ATT_VW 4
#endif
#define BG_ATT_CW (2 * BG_ATT_VW) /* floats per column group; divides BG_ATT_BK and HP */
typedef float bg__vf __attribute__((vector_size(BG_ATT_VW * 4), aligned(4), may_alias));
#define BG_VF(p) (*(bg__vf *)(p))

static int bg__att_hp(int hs) { return (hs + 31) & ~31; }

/* s[r][0..ncol) = q_r . k_j for 4 rows (q_r rows ld apart; rows past nr
 * repeat the last), kt (hs, BK) the transposed key tile; ncol a multiple of
 * BG_ATT_CW up to BK (the columns past it are left as they were) */
static inline __attribute__((always_inline)) void bg__att_s4(float s[BG_ATT_RB][BG_ATT_BK], const float *q,
                            size_t ld, int nr, const float *kt, int hs, int ncol)
{
    const float *q0 = q, *q1 = q + (nr > 1 ? ld : 0), *q2 = q + (nr > 2 ? 2 * ld : 0),
                *q3 = q + (nr > 3 ? 3 * ld : 0);
    for (int c = 0; c < ncol; c += BG_ATT_CW) {
        bg__vf a00 = {0}, a01 = {0}, a10 = {0}, a11 = {0}, a20 = {0}, a21 = {0}, a30 = {0}, a31 = {0};
        for (int d = 0; d < hs; d++) {
            const float *kr = kt + (size_t)d * BG_ATT_BK + c;
            bg__vf k0 = BG_VF(kr), k1 = BG_VF(kr + BG_ATT_VW);
            float x0 = q0[d], x1 = q1[d], x2 = q2[d], x3 = q3[d];
            a00 += x0 * k0, a01 += x0 * k1, a10 += x1 * k0, a11 += x1 * k1;
            a20 += x2 * k0, a21 += x2 * k1, a30 += x3 * k0, a31 += x3 * k1;
        }
        BG_VF(s[0] + c) = a00, BG_VF(s[0] + c + BG_ATT_VW) = a01, BG_VF(s[1] + c) = a10;
        BG_VF(s[1] + c + BG_ATT_VW) = a11, BG_VF(s[2] + c) = a20, BG_VF(s[2] + c + BG_ATT_VW) = a21;
        BG_VF(s[3] + c) = a30, BG_VF(s[3] + c + BG_ATT_VW) = a31;
    }
}

/* acc[r][0..HP) += sum_{j < nk} p[r][j] * x[j][0..HP) for 4 rows (acc rows HP
 * apart, x rows ldx apart, HP floats readable in each) */
static inline __attribute__((always_inline)) void bg__att_pv4(float *acc, const float p[BG_ATT_RB][BG_ATT_BK],
                            const float *x, size_t ldx, int nk, int HP)
{
    for (int c = 0; c < HP; c += BG_ATT_CW) {
        float *r0 = acc + c, *r1 = r0 + HP, *r2 = r1 + HP, *r3 = r2 + HP;
        bg__vf a00 = BG_VF(r0), a01 = BG_VF(r0 + BG_ATT_VW), a10 = BG_VF(r1), a11 = BG_VF(r1 + BG_ATT_VW);
        bg__vf a20 = BG_VF(r2), a21 = BG_VF(r2 + BG_ATT_VW), a30 = BG_VF(r3), a31 = BG_VF(r3 + BG_ATT_VW);
        for (int j = 0; j < nk; j++) {
            const float *xr = x + (size_t)j * ldx + c;
            bg__vf x0 = BG_VF(xr), x1 = BG_VF(xr + BG_ATT_VW);
            float p0 = p[0][j], p1 = p[1][j], p2 = p[2][j], p3 = p[3][j];
            a00 += p0 * x0, a01 += p0 * x1, a10 += p1 * x0, a11 += p1 * x1;
            a20 += p2 * x0, a21 += p2 * x1, a30 += p3 * x0, a31 += p3 * x1;
        }
        BG_VF(r0) = a00, BG_VF(r0 + BG_ATT_VW) = a01, BG_VF(r1) = a10, BG_VF(r1 + BG_ATT_VW) = a11;
        BG_VF(r2) = a20, BG_VF(r2 + BG_ATT_VW) = a21, BG_VF(r3) = a30, BG_VF(r3 + BG_ATT_VW) = a31;
    }
}

/* acc[j][0..HP) += sum_r w[r][j] * x_r[0..HP) for j < nk (acc (BK, HP), x_r
 * the 4 rows, HP floats readable in each): the transposed product of
 * bg__att_pv4, for dK and dV */
static inline __attribute__((always_inline)) void bg__att_tv4(float *acc, const float w[BG_ATT_RB][BG_ATT_BK],
                            const float *const x[BG_ATT_RB], int nk, int HP)
{
    for (int c = 0; c < HP; c += BG_ATT_CW) {
        const float *x0 = x[0] + c, *x1 = x[1] + c, *x2 = x[2] + c, *x3 = x[3] + c;
        bg__vf b00 = BG_VF(x0), b01 = BG_VF(x0 + BG_ATT_VW), b10 = BG_VF(x1), b11 = BG_VF(x1 + BG_ATT_VW);
        bg__vf b20 = BG_VF(x2), b21 = BG_VF(x2 + BG_ATT_VW), b30 = BG_VF(x3), b31 = BG_VF(x3 + BG_ATT_VW);
        for (int j = 0; j < nk; j++) {
            float *a = acc + (size_t)j * HP + c;
            float w0 = w[0][j], w1 = w[1][j], w2 = w[2][j], w3 = w[3][j];
            /* four multiply-adds in row order into the loaded accumulator */
            bg__vf s0 = BG_VF(a), s1 = BG_VF(a + BG_ATT_VW);
            s0 += w0 * b00, s1 += w0 * b01, s0 += w1 * b10, s1 += w1 * b11;
            s0 += w2 * b20, s1 += w2 * b21, s0 += w3 * b30, s1 += w3 * b31;
            BG_VF(a) = s0, BG_VF(a + BG_ATT_VW) = s1;
        }
    }
}

/* dst (nk, HP) = rows j0.. of x (ld apart), padded with zeros (rows to BK, columns to HP) */
static void bg__att_pad_rows(float *restrict dst, const float *restrict x, size_t ld, int nk, int hs, int HP)
{
    for (int j = 0; j < BG_ATT_BK; j++)
        for (int d = 0; d < HP; d++)
            dst[(size_t)j * HP + d] = j < nk && d < hs ? x[(size_t)j * ld + d] : 0.0f;
}

/* Which keys a query row sees. Causal attention (qpos = kpos = NULL): key j
 * is visible to row i when j <= i. Context parallelism's ring blocks pass
 * the global positions of their rows (increasing, host arrays of T): key j
 * is visible to row i when kpos[j] <= qpos[i], so the visible keys of a tile
 * are a prefix of it, as on the diagonal. */
static inline int bg__att_sees(const int *qpos, const int *kpos, int ti, int j0)
{
    return qpos ? kpos[j0] <= qpos[ti] : j0 <= ti;
}
static inline int bg__att_nvis(const int *qpos, const int *kpos, int ti, int j0, int nk)
{
    if (!qpos)
        return ti - j0 + 1 < nk ? ti - j0 + 1 : nk;
    int nv = 0;
    while (nv < nk && kpos[j0 + nv] <= qpos[ti])
        nv++;
    return nv;
}

/* The columns of a 4-row block's scores worth computing: those its last row
 * sees (the rows below see a prefix of them), rounded up to whole column
 * groups. On the diagonal tile the first blocks see few keys: at 32-key tiles
 * and 4-row blocks, the products past them were about a seventh of the
 * kernel's multiply-adds at T = 128. */
static inline int bg__att_ncol(int vis)
{
    return (vis + BG_ATT_CW - 1) / BG_ATT_CW * BG_ATT_CW;
}

/* Row i's result of this call (o_b, its log-sum-exp lb; a row that saw no
 * key has lb = -inf) merged into the running (orow, *lse) by log-sum-exp. */
static void bg__att_merge(float *orow, float *lse, const float *ob, float inv, float lb, int hs)
{
    if (lb == -INFINITY)
        return;
    float la = *lse, mx = la > lb ? la : lb;
    float wa = la == -INFINITY ? 0.0f : expf(la - mx), wb = expf(lb - mx), sum = wa + wb;
    for (int d = 0; d < hs; d++)
        orow[d] = (orow[d] * wa + ob[d] * inv * wb) / sum;
    *lse = mx + logf(sum);
}

/* Grouped heads: g query heads share one key/value head (grouped-query
 * attention; g = 1: one head). Head i's queries and outputs sit i * hs floats
 * after the first head's (in the row of q and of o), its lse and D rows i * T
 * floats after. A pass keeps BG_ATT_FWD_ROWS rows of output accumulators:
 * rq rows of each of hn heads (bg__att_rows); every key tile is transposed
 * once per pass and read by all of them. */
#define BG_ATT_FWD_ROWS (BG_ATT_BQ * BG_ATT_BLK_HS / 32) /* query rows of a pass, 32-float heads */
static void bg__att_rows(int g, int HP, int *rq, int *hn)
{
    int rows = BG_ATT_BQ * BG_ATT_BLK_HS / HP; /* what oacc holds */
    *rq = rows / g / BG_ATT_RB * BG_ATT_RB;
    *rq = *rq > BG_ATT_BQ ? BG_ATT_BQ : *rq < BG_ATT_RB ? BG_ATT_RB : *rq;
    *hn = rows / *rq < g ? rows / *rq : g;
}

/* The forward's online-softmax steps of nq query rows (i0.., of one head)
 * against one prepared key tile (kt transposed, vx rows ldv apart), into
 * acc (rows HP apart), m and l. */
static inline __attribute__((always_inline)) void bg__att_fwd_tile(float *acc, float *m, float *l, const float *q,
                            size_t ld, int i0, int nq, int j0, int nk, const float *kt, const float *vx,
                            size_t ldv, int hs, int HP, float scale, const int *qpos, const int *kpos)
{
    float s[BG_ATT_RB][BG_ATT_BK];
    memset(s, 0, sizeof(s)); /* columns past a block's ncol are read (and not used) by bg__att_online */
    for (int r0 = 0; r0 < nq; r0 += BG_ATT_RB) {
        int nr = nq - r0 < BG_ATT_RB ? nq - r0 : BG_ATT_RB;
        int vis = bg__att_nvis(qpos, kpos, i0 + r0 + nr - 1, j0, nk); /* keys j0..j0+vis-1: any row's */
        if (vis <= 0)
            continue; /* the whole tile is above these rows' diagonal */
        bg__att_s4(s, q + (size_t)(i0 + r0) * ld, ld, nr, kt, hs, bg__att_ncol(vis));
        float *a = acc + (size_t)r0 * HP;
        for (int r = 0; r < BG_ATT_RB; r++) {
            int ti = i0 + r0 + (r < nr ? r : nr - 1), i = r0 + r;
            int nv = bg__att_nvis(qpos, kpos, ti, j0, nk); /* keys j0..j0+nv-1 are visible */
            if (r >= nr || nv <= 0) {
                for (int j = 0; j < BG_ATT_BK; j++)
                    s[r][j] = 0.0f;
                continue;
            }
            float corr = bg__att_online(s[r], &m[i], &l[i], nv, scale);
            for (int d = 0; d < HP; d++)
                a[(size_t)r * HP + d] *= corr;
        }
        bg__att_pv4(a, (const float(*)[BG_ATT_BK])s, vx, ldv, vis, HP);
    }
}

/* g heads sharing k and v. acc 0: o and lse assigned (causal: every row sees
 * a key); 1: merged into what they hold (bg__att_merge). Each row's result
 * is the same whatever the pass's size (its key tiles in order). */
static void bg__att_fwd_head_blk(float *o, float *lse, const float *q, const float *k, const float *v,
                                 size_t ld, size_t ldo, int T, int hs, int g, float scale, const int *qpos,
                                 const int *kpos, int acc)
{
    const int HP = bg__att_hp(hs);
    float kt[BG_ATT_BLK_HS * BG_ATT_BK], vp[BG_ATT_BK * BG_ATT_BLK_HS], oacc[BG_ATT_BQ * BG_ATT_BLK_HS];
    float m[BG_ATT_FWD_ROWS], l[BG_ATT_FWD_ROWS];
    int rq, hn;
    bg__att_rows(g, HP, &rq, &hn);
    for (int h0 = 0; h0 < g; h0 += hn) {
        int nh = g - h0 < hn ? g - h0 : hn;
        for (int i0 = 0; i0 < T; i0 += rq) {
            int nq = T - i0 < rq ? T - i0 : rq;
            /* whole blocks of 4 rows; rows past nq are computed on copies of the last and dropped */
            memset(oacc, 0, (size_t)nh * rq * HP * sizeof(float));
            for (int i = 0; i < nh * rq; i++)
                m[i] = -INFINITY, l[i] = 0.0f;
            for (int j0 = 0; j0 < T && bg__att_sees(qpos, kpos, i0 + nq - 1, j0); j0 += BG_ATT_BK) {
                int nk = T - j0 < BG_ATT_BK ? T - j0 : BG_ATT_BK;
                bg__att_transpose(kt, k + (size_t)j0 * ld, ld, nk, hs);
                /* V's rows are read in place when the head size needs no padding */
                const float *vx = v + (size_t)j0 * ld;
                size_t ldv = ld;
                if (HP != hs)
                    bg__att_pad_rows(vp, vx, ld, nk, hs, HP), vx = vp, ldv = HP;
                for (int h = 0; h < nh; h++)
                    bg__att_fwd_tile(oacc + (size_t)h * rq * HP, m + h * rq, l + h * rq, q + (size_t)(h0 + h) * hs,
                                     ld, i0, nq, j0, nk, kt, vx, ldv, hs, HP, scale, qpos, kpos);
            }
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < nq; i++) {
                    int x = h * rq + i;
                    float inv = 1.0f / l[x], *orow = o + (size_t)(i0 + i) * ldo + (size_t)(h0 + h) * hs;
                    float *lr = lse + (size_t)(h0 + h) * T + i0 + i;
                    if (acc) {
                        bg__att_merge(orow, lr, oacc + (size_t)x * HP, inv, l[x] > 0 ? m[x] + logf(l[x]) : -INFINITY,
                                      hs);
                        continue;
                    }
                    for (int d = 0; d < hs; d++)
                        orow[d] = oacc[(size_t)x * HP + d] * inv;
                    *lr = m[x] + logf(l[x]);
                }
        }
    }
}

/* One head's part of a key tile in the backward: rows rfirst..T of q and dO
 * (ld and ldo apart) against the prepared tile (kt, vt transposed, kx rows
 * ldk apart): dK and dV of the tile accumulate in dka and dva (rows in order,
 * 4 at a time); each block's dQ contribution is summed locally and added to
 * its dq rows (ld apart). */
static inline __attribute__((always_inline)) void bg__att_bwd_tile(float *dka, float *dva, float *dq,
                            const float *dvec, const float *dout, const float *lse, const float *q, size_t ld,
                            size_t ldo, int rfirst, int T, int j0, int nk, const float *kt, const float *vt,
                            const float *kx, size_t ldk, int hs, int HP, float scale, const int *qpos,
                            const int *kpos)
{
    float qp[BG_ATT_RB * BG_ATT_BLK_HS], dop[BG_ATT_RB * BG_ATT_BLK_HS], dqa[BG_ATT_RB * BG_ATT_BLK_HS];
    float p[BG_ATT_RB][BG_ATT_BK], dp[BG_ATT_RB][BG_ATT_BK];
    memset(p, 0, sizeof(p)), memset(dp, 0, sizeof(dp)); /* as the forward's s */
    const float *xq[BG_ATT_RB], *xdo[BG_ATT_RB];
    /* with a head size of whole 32-float chunks, rows of q and dO are read in place instead of padded copies */
    const int direct = HP == hs;
    for (int r0 = rfirst; r0 < T; r0 += BG_ATT_RB) {
        int nr = T - r0 < BG_ATT_RB ? T - r0 : BG_ATT_RB;
        const float *qrow = q + (size_t)r0 * ld, *dorow = dout + (size_t)r0 * ldo;
        int vis = bg__att_nvis(qpos, kpos, r0 + nr - 1, j0, nk), ncol = bg__att_ncol(vis);
        bg__att_s4(p, qrow, ld, nr, kt, hs, ncol);
        bg__att_s4(dp, dorow, ldo, nr, vt, hs, ncol);
        for (int r = 0; r < BG_ATT_RB; r++) {
            int ti = r0 + r, nv = r < nr ? bg__att_nvis(qpos, kpos, ti, j0, nk) : 0; /* rows past T: none */
            float li = r < nr ? lse[ti] : 0.0f, di = r < nr ? dvec[ti] : 0.0f;
            for (int j = 0; j < BG_ATT_BK; j++) { /* past nv (and ncol: not computed) both 0 */
                float pj = j < nv ? bg__expf(scale * p[r][j] - li) : 0.0f;
                p[r][j] = pj;
                dp[r][j] = j < nv ? pj * (dp[r][j] - di) * scale : 0.0f; /* scale dS */
            }
            if (direct) {
                /* rows past T have weights 0: read row r0 (in bounds) */
                xq[r] = qrow + (size_t)(r < nr ? r : 0) * ld;
                xdo[r] = dorow + (size_t)(r < nr ? r : 0) * ldo;
            } else {
                for (int d = 0; d < HP; d++) {
                    qp[r * HP + d] = r < nr && d < hs ? qrow[(size_t)r * ld + d] : 0.0f;
                    dop[r * HP + d] = r < nr && d < hs ? dorow[(size_t)r * ldo + d] : 0.0f;
                }
                xq[r] = qp + r * HP, xdo[r] = dop + r * HP;
            }
        }
        memset(dqa, 0, (size_t)BG_ATT_RB * HP * sizeof(float));
        bg__att_pv4(dqa, (const float(*)[BG_ATT_BK])dp, kx, ldk, vis, HP);
        bg__att_tv4(dka, (const float(*)[BG_ATT_BK])dp, xq, vis, HP);
        bg__att_tv4(dva, (const float(*)[BG_ATT_BK])p, xdo, vis, HP);
        for (int r = 0; r < nr; r++)
            for (int d = 0; d < hs; d++)
                dq[(size_t)(r0 + r) * ld + d] += dqa[r * HP + d];
    }
}

/* The backward of bg__att_bwd_head in blocks of 4 query rows, for g heads
 * sharing k and v (as bg__att_fwd_head_blk's; dq's heads as q's): per key
 * tile, dK and dV of the tile accumulate in local tiles (head by head, rows
 * in order, 4 at a time: a fixed order) and are written once; each block's
 * dQ contribution from the tile is summed locally and added to its dQ rows
 * (key tiles in order). acc: dq, dk and dv accumulated (+=), else assigned. */
static void bg__att_bwd_head_blk(float *dq, float *dk, float *dv, float *dvec, const float *dout,
                                 const float *o, const float *lse, const float *q, const float *k,
                                 const float *v, size_t ld, size_t ldo, int T, int hs, int g, float scale,
                                 const int *qpos, const int *kpos, int acc)
{
    const int HP = bg__att_hp(hs);
    float kt[BG_ATT_BLK_HS * BG_ATT_BK], vt[BG_ATT_BLK_HS * BG_ATT_BK], kp[BG_ATT_BK * BG_ATT_BLK_HS];
    float dka[BG_ATT_BK * BG_ATT_BLK_HS], dva[BG_ATT_BK * BG_ATT_BLK_HS];
    for (int h = 0; h < g; h++)
        for (int i = 0; i < T; i++) {
            size_t ro = (size_t)i * ldo + (size_t)h * hs;
            dvec[(size_t)h * T + i] = bg__att_dot(dout + ro, o + ro, hs);
            if (!acc)
                memset(dq + (size_t)i * ld + (size_t)h * hs, 0, (size_t)hs * sizeof(float));
        }
    for (int j0 = 0; j0 < T; j0 += BG_ATT_BK) {
        int nk = T - j0 < BG_ATT_BK ? T - j0 : BG_ATT_BK;
        int rfirst = j0; /* the first row that sees the tile */
        if (qpos)
            for (rfirst = 0; rfirst < T && !bg__att_sees(qpos, kpos, rfirst, j0); rfirst++) {
            }
        bg__att_transpose(kt, k + (size_t)j0 * ld, ld, nk, hs);
        bg__att_transpose(vt, v + (size_t)j0 * ld, ld, nk, hs);
        const float *kx = k + (size_t)j0 * ld;
        size_t ldk = ld;
        if (HP != hs)
            bg__att_pad_rows(kp, kx, ld, nk, hs, HP), kx = kp, ldk = HP;
        memset(dka, 0, (size_t)BG_ATT_BK * HP * sizeof(float));
        memset(dva, 0, (size_t)BG_ATT_BK * HP * sizeof(float));
        for (int h = 0; h < g; h++) {
            size_t ho = (size_t)h * hs;
            bg__att_bwd_tile(dka, dva, dq + ho, dvec + (size_t)h * T, dout + ho, lse + (size_t)h * T, q + ho, ld,
                             ldo, rfirst, T, j0, nk, kt, vt, kx, ldk, hs, HP, scale, qpos, kpos);
        }
        for (int j = 0; j < nk; j++) {
            float *dkr = dk + (size_t)(j0 + j) * ld, *dvr = dv + (size_t)(j0 + j) * ld;
            if (acc) {
                for (int d = 0; d < hs; d++) {
                    dkr[d] += dka[(size_t)j * HP + d];
                    dvr[d] += dva[(size_t)j * HP + d];
                }
                continue;
            }
            memcpy(dkr, dka + (size_t)j * HP, (size_t)hs * sizeof(float));
            memcpy(dvr, dva + (size_t)j * HP, (size_t)hs * sizeof(float));
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

/* Every (batch, head) of the register-blocked forward: queries of qkv_q
 * against keys and values of qkv_k (the same for causal attention), with
 * positions or none, assigned or merged (acc). */
static void bg__att_fwd_blocks(bg_backend_t *be, float *out, float *lse, const float *qkv_q, const float *qkv_k,
                               const int *qpos, const int *kpos, int acc, int B, int T, int NH, int hs)
{
    int nt = bg__cpu_nt(be);
    bg__att_dims_t d = bg__att_dims(B, T, NH, hs);
    size_t C = d.ldo;
#pragma omp parallel for num_threads(nt) if (d.par) schedule(dynamic, 1)
    for (int bh = 0; bh < d.BH; bh++) {
        size_t qoff = bg__att_qoff(&d, bh);
        bg__att_fwd_head_blk(out + bg__att_ooff(&d, bh), lse + (size_t)bh * T, qkv_q + qoff, qkv_k + qoff + C,
                             qkv_k + qoff + 2 * C, d.ld, d.ldo, T, hs, 1, d.scale, qpos, kpos, acc);
    }
}

void BG_ISA_FN(bg__k_attention_forward)(bg_backend_t *be, float *out, float *lse, const float *qkv, int B, int T,
                                        int NH, int hs)
{
    if (hs <= BG_ATT_BLK_HS) {
        bg__att_fwd_blocks(be, out, lse, qkv, qkv, NULL, NULL, 0, B, T, NH, hs);
        return;
    }
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

/* Context parallelism's ring block (backend.h, attention_block_forward): the
 * queries of qkv_q against the keys and values of qkv_k at the given
 * positions, merged into out and lse. Head sizes up to BG_ATT_BLK_HS (the
 * layer checks). */
void BG_ISA_FN(bg__k_attention_block_forward)(bg_backend_t *be, float *out, float *lse, const float *qkv_q,
                                              const float *qkv_k, const int *qpos, const int *kpos, int acc, int B,
                                              int T, int NH, int hs)
{
    bg__att_fwd_blocks(be, out, lse, qkv_q, qkv_k, qpos, kpos, acc, B, T, NH, hs);
}

/* Backward of one (batch, head), FlashAttention-2 style: for each key tile,
 * every query row at or below it recomputes its probabilities from the saved
 * logsumexp, P = exp(scale q k^T - lse), then
 *   dV_j += P^T dO,  dP = dO V_j^T,  dS = P (dP - D),  D = rowsum(dO o O),
 *   dQ += scale dS K_j,  dK_j += scale dS^T Q.
 * dK and dV of the tile are summed over rows in order in dk/dv (the
 * destination rows of dqkv, zeroed first); dQ rows over key tiles in order. */
static void bg__att_bwd_head(float *dq, float *dk, float *dv, float *dvec, const float *dout,
                             const float *o, const float *lse, const float *q, const float *k,
                             const float *v, size_t ld, size_t ldo, int T, int hs, float scale, int first)
{
    float ktile[BG_ATT_MAX_TILE], vtile[BG_ATT_MAX_TILE];
    float *kt = hs <= BG_ATT_MAX_HS ? ktile : NULL, *vt = kt ? vtile : NULL;
    float p[BG_ATT_BK], dp[BG_ATT_BK];
    for (int i = 0; i < T; i++) {
        dvec[i] = bg__att_dot(dout + (size_t)i * ldo, o + (size_t)i * ldo, hs);
        memset(dq + (size_t)i * ld, 0, (size_t)hs * sizeof(float));
        if (first) {
            memset(dk + (size_t)i * ld, 0, (size_t)hs * sizeof(float));
            memset(dv + (size_t)i * ld, 0, (size_t)hs * sizeof(float));
        }
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

/* Every (batch, head) of the register-blocked backward (qkv_q = qkv_k and
 * dqkv_q = dqkv_k for causal attention; acc as bg__att_bwd_head_blk's). */
static void bg__att_bwd_blocks(bg_backend_t *be, float *dqkv_q, float *dqkv_k, float *dvec, const float *dout,
                               const float *qkv_q, const float *qkv_k, const float *out, const float *lse,
                               const int *qpos, const int *kpos, int acc, int B, int T, int NH, int hs)
{
    int nt = bg__cpu_nt(be);
    bg__att_dims_t d = bg__att_dims(B, T, NH, hs);
    size_t C = d.ldo;
#pragma omp parallel for num_threads(nt) if (d.par) schedule(dynamic, 1)
    for (int bh = 0; bh < d.BH; bh++) {
        size_t qoff = bg__att_qoff(&d, bh), ooff = bg__att_ooff(&d, bh);
        bg__att_bwd_head_blk(dqkv_q + qoff, dqkv_k + qoff + C, dqkv_k + qoff + 2 * C, dvec + (size_t)bh * T,
                             dout + ooff, out + ooff, lse + (size_t)bh * T, qkv_q + qoff, qkv_k + qoff + C,
                             qkv_k + qoff + 2 * C, d.ld, d.ldo, T, hs, 1, d.scale, qpos, kpos, acc);
    }
}

void BG_ISA_FN(bg__k_attention_backward)(bg_backend_t *be, float *dqkv, float *dvec, const float *dout,
                                         const float *qkv, const float *out, const float *lse, int B, int T, int NH,
                                         int hs)
{
    if (hs <= BG_ATT_BLK_HS) {
        bg__att_bwd_blocks(be, dqkv, dqkv, dvec, dout, qkv, qkv, out, lse, NULL, NULL, 0, B, T, NH, hs);
        return;
    }
    int nt = bg__cpu_nt(be);
    bg__att_dims_t d = bg__att_dims(B, T, NH, hs);
    size_t C = d.ldo;
#pragma omp parallel for num_threads(nt) if (d.par) schedule(dynamic, 1)
    for (int bh = 0; bh < d.BH; bh++) {
        size_t qoff = bg__att_qoff(&d, bh), ooff = bg__att_ooff(&d, bh);
        float *dq = dqkv + qoff;
        const float *q = qkv + qoff;
        bg__att_bwd_head(dq, dq + C, dq + 2 * C, dvec + (size_t)bh * T, dout + ooff, out + ooff,
                         lse + (size_t)bh * T, q, q + C, q + 2 * C, d.ld, d.ldo, T, hs, d.scale, 1);
    }
}

/* Its backward (attention_block_backward): dq of dqkv_q, dk and dv of dqkv_k accumulated. */
void BG_ISA_FN(bg__k_attention_block_backward)(bg_backend_t *be, float *dqkv_q, float *dqkv_k, float *dvec,
                                               const float *dout, const float *qkv_q, const float *qkv_k,
                                               const float *out, const float *lse, const int *qpos,
                                               const int *kpos, int B, int T, int NH, int hs)
{
    bg__att_bwd_blocks(be, dqkv_q, dqkv_k, dvec, dout, qkv_q, qkv_k, out, lse, qpos, kpos, 1, B, T, NH, hs);
}

/* ------------------------------------------------- grouped-query attention */

/* Grouped-query attention on the grouped layout (backend.h, gqa_attention_forward): rows of grouped are
 * ld = G (g + 2) hs floats, each group g query heads, its key head and its value head; out (B,T,G g hs),
 * lse and dvec (B, G g, T). One (batch, group) is one thread's work: its g query heads read the group's
 * key and value tiles once (bg__att_fwd_head_blk and bg__att_bwd_head_blk with g heads), no copies. */
typedef struct {
    size_t ld, ldo;
    int items, par, nt;
    float scale;
} bg__gqa_dims_t;
static bg__gqa_dims_t bg__gqa_dims(bg_backend_t *be, int B, int T, int G, int g, int hs)
{
    bg__gqa_dims_t d = {(size_t)G * (g + 2) * hs, (size_t)G * g * hs, B * G, 0, bg__cpu_nt(be),
                        1.0f / sqrtf((float)hs)};
    d.par = d.items > 1 && (size_t)B * G * g * T * T * hs > BG_CPU_PAR_WORK;
    return d;
}
/* item bi = (b, j): its group's first query head in grouped (the key head g hs after, the value head
 * (g + 1) hs), its first output head in out, its first lse row */
static size_t bg__gqa_in(const bg__gqa_dims_t *d, int bi, int G, int g, int T, int hs)
{
    return (size_t)(bi / G) * T * d->ld + (size_t)(bi % G) * (g + 2) * hs;
}
static size_t bg__gqa_out(const bg__gqa_dims_t *d, int bi, int G, int g, int T, int hs)
{
    return (size_t)(bi / G) * T * d->ldo + (size_t)(bi % G) * g * hs;
}

void BG_ISA_FN(bg__k_gqa_attention_forward)(bg_backend_t *be, float *out, float *lse, const float *grouped, int B,
                                            int T, int G, int g, int hs)
{
    bg__gqa_dims_t d = bg__gqa_dims(be, B, T, G, g, hs);
#pragma omp parallel for num_threads(d.nt) if (d.par) schedule(dynamic, 1)
    for (int bi = 0; bi < d.items; bi++) {
        const float *q = grouped + bg__gqa_in(&d, bi, G, g, T, hs), *k = q + (size_t)g * hs, *v = k + hs;
        float *o = out + bg__gqa_out(&d, bi, G, g, T, hs), *lr = lse + (size_t)bi * g * T;
        if (hs <= BG_ATT_BLK_HS) {
            bg__att_fwd_head_blk(o, lr, q, k, v, d.ld, d.ldo, T, hs, g, d.scale, NULL, NULL, 0);
            continue;
        }
        for (int i = 0; i < g; i++)
            bg__att_fwd_head(o + (size_t)i * hs, lr + (size_t)i * T, q + (size_t)i * hs, k, v, d.ld, d.ldo, T, hs,
                             d.scale);
    }
}

void BG_ISA_FN(bg__k_gqa_attention_backward)(bg_backend_t *be, float *dgrouped, float *dvec, const float *dout,
                                             const float *grouped, const float *out, const float *lse, int B,
                                             int T, int G, int g, int hs)
{
    bg__gqa_dims_t d = bg__gqa_dims(be, B, T, G, g, hs);
#pragma omp parallel for num_threads(d.nt) if (d.par) schedule(dynamic, 1)
    for (int bi = 0; bi < d.items; bi++) {
        size_t io = bg__gqa_in(&d, bi, G, g, T, hs), oo = bg__gqa_out(&d, bi, G, g, T, hs), ko = (size_t)g * hs;
        const float *q = grouped + io, *lr = lse + (size_t)bi * g * T;
        float *dq = dgrouped + io, *dv_ = dvec + (size_t)bi * g * T;
        if (hs <= BG_ATT_BLK_HS) {
            bg__att_bwd_head_blk(dq, dq + ko, dq + ko + hs, dv_, dout + oo, out + oo, lr, q, q + ko, q + ko + hs,
                                 d.ld, d.ldo, T, hs, g, d.scale, NULL, NULL, 0);
            continue;
        }
        for (int i = 0; i < g; i++) /* dK and dV summed head by head, in order */
            bg__att_bwd_head(dq + (size_t)i * hs, dq + ko, dq + ko + hs, dv_ + (size_t)i * T,
                             dout + oo + (size_t)i * hs, out + oo + (size_t)i * hs, lr + (size_t)i * T,
                             q + (size_t)i * hs, q + ko, q + ko + hs, d.ld, d.ldo, T, hs, d.scale, i == 0);
    }
}
