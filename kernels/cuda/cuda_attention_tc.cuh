/* kernels/cuda/cuda_attention_tc.cuh: causal attention on tensor cores
 * (tf32 WMMA, m16n16k8, fp32 accumulation), included by cuda_kernels.cu.
 *
 * The same three passes as the CUDA-core kernels above (forward with the
 * log-sum-exp kept; backward as a dQ pass that also writes D = rowsum(dO o O)
 * and a dK/dV pass), each a block of BG_TC_WARPS warps over 16 rows each:
 * the products Q K^T, dO V^T, P V, dS K, P^T dO and dS^T Q run as 16 x 16 x 8
 * tiles, the softmax and the masks on a per-warp scratch tile in shared
 * memory (the fragments' element order is the hardware's), two lanes per
 * row. The forward keeps its output rows in shared memory, rescaled as the
 * row maximum moves (FlashAttention's online softmax); the backward's
 * accumulators stay in fragments. Every sum has a fixed order (no atomics):
 * results are reproducible run to run, but not the CUDA-core kernels' bits,
 * since the operands are rounded to tf32 (2^-11): attention is then as exact
 * as the tf32 GEMMs (conformance tolerance 300x fp32's, test_conformance).
 *
 * Used for head sizes up to BG_TC_MAX_HS when BRIGADE_CUDA_ATTN=tc, or by
 * default when the backend's GEMMs run on tensor cores (BRIGADE_CUDA_GEMM tf32
 * or bf16, --precision bf16): bg__cu_attention_tc_default. Shared memory per
 * block at head size 128: 115 KiB (forward, dQ) and 125 KiB (dK/dV), within
 * sm_80's 163 KiB.
 *
 * Status: run on the CPU by the CUDA emulation (tests/bg_cuda_emu.h, whose
 * WMMA holds every tile in every lane) against the CPU backend; not yet run
 * on a GPU. */
#ifndef BG_CUDA_EMU
#include <mma.h>
#include <string.h>
#endif

#define BG_TC_WARPS 4
#define BG_TC_ROWS (16 * BG_TC_WARPS) /* rows of the outer tile: queries (forward, dQ) or keys (dK/dV) */
#define BG_TC_BN 32                   /* rows of the inner tile: keys (forward, dQ) or queries (dK/dV) */
#define BG_TC_SLD (BG_TC_BN + 8)      /* leading dimension of a warp's 16 x BG_TC_BN scratch tile */
#define BG_TC_MAX_HS 128

namespace bg_wmma = nvcuda::wmma;
typedef bg_wmma::fragment<bg_wmma::matrix_a, 16, 16, 8, bg_wmma::precision::tf32, bg_wmma::row_major> bg_tc_a;
typedef bg_wmma::fragment<bg_wmma::matrix_b, 16, 16, 8, bg_wmma::precision::tf32, bg_wmma::row_major> bg_tc_b;
typedef bg_wmma::fragment<bg_wmma::matrix_b, 16, 16, 8, bg_wmma::precision::tf32, bg_wmma::col_major> bg_tc_bt;
typedef bg_wmma::fragment<bg_wmma::accumulator, 16, 16, 8, float> bg_tc_c;

/* head size padded to whole 16-column tiles, and the tiles' leading dimension
 * (8 more: rows stay 32-byte aligned, as WMMA's loads need) */
__host__ __device__ static inline int bg__tc_hp(int hs) { return (hs + 15) / 16 * 16; }
__host__ __device__ static inline int bg__tc_ld(int hs) { return bg__tc_hp(hs) + 8; }

template <class F> __device__ __forceinline__ void bg__tc_round(F &f)
{
    for (int t = 0; t < f.num_elements; t++)
        f.x[t] = bg_wmma::__float_to_tf32(f.x[t]);
}

/* dst[r*ld + d] = src row r0+r (rows lds apart), zero past T and past hs up
 * to hp: n rows, all threads of the block */
__device__ void bg__tc_load(float *dst, int ld, const float *src, size_t lds, int r0, int n, int T, int hs, int hp)
{
    for (int idx = threadIdx.x; idx < n * hp; idx += blockDim.x) {
        int r = idx / hp, d = idx % hp;
        dst[r * ld + d] = r0 + r < T && d < hs ? src[(size_t)(r0 + r) * lds + d] : 0.0f;
    }
}

/* acc[0..1] = A (16 x hp, rows ld apart) times B^T, B being the BG_TC_BN rows
 * of a tile (rows ld apart): a 16 x BG_TC_BN block of scores */
__device__ __forceinline__ void bg__tc_abt(bg_tc_c *acc, const float *A, const float *B, int ld, int hp)
{
    bg_wmma::fill_fragment(acc[0], 0.0f);
    bg_wmma::fill_fragment(acc[1], 0.0f);
    for (int k = 0; k < hp; k += 8) {
        bg_tc_a a;
        bg_wmma::load_matrix_sync(a, A + k, ld);
        bg__tc_round(a);
        for (int n = 0; n < BG_TC_BN / 16; n++) {
            bg_tc_bt b;
            bg_wmma::load_matrix_sync(b, B + (size_t)16 * n * ld + k, ld);
            bg__tc_round(b);
            bg_wmma::mma_sync(acc[n], a, b, acc[n]);
        }
    }
}

/* acc[n] (column tile n of hp) += S (16 x BG_TC_BN scratch) times the tile B
 * (BG_TC_BN x hp, rows ld apart) */
__device__ __forceinline__ void bg__tc_sb(bg_tc_c *acc, const float *S, const float *B, int ld, int hp)
{
    for (int k = 0; k < BG_TC_BN; k += 8) {
        bg_tc_a a;
        bg_wmma::load_matrix_sync(a, S + k, BG_TC_SLD);
        bg__tc_round(a);
        for (int n = 0; n < hp / 16; n++) {
            bg_tc_b b;
            bg_wmma::load_matrix_sync(b, B + (size_t)k * ld + 16 * n, ld);
            bg__tc_round(b);
            bg_wmma::mma_sync(acc[n], a, b, acc[n]);
        }
    }
}

/* the warp's 16 x hp accumulators through its shared rows (ld apart) to the
 * global rows i0.. (rows ldg apart), the first hs columns of the first T rows */
__device__ void bg__tc_store_rows(float *g, size_t ldg, float *sh, int ld, const bg_tc_c *acc, int i0, int T, int hs,
                                  int hp, int lane)
{
    for (int n = 0; n < hp / 16; n++)
        bg_wmma::store_matrix_sync(sh + 16 * n, acc[n], ld, bg_wmma::mem_row_major);
    __syncwarp();
    for (int idx = lane; idx < 16 * hs; idx += 32) {
        int r = idx / hs, d = idx % hs;
        if (i0 + r < T)
            g[(size_t)(i0 + r) * ldg + d] = sh[r * ld + d];
    }
}

/* Forward: block (bh, 64 query rows); warp w owns rows i0 + 16w ..; lane
 * pair (2r, 2r+1) owns row r's softmax state, each half of its columns. */
__global__ void bg__k_att_tc_fwd(float *out, float *lse, const float *qkv, int T, int NH, int hs, float scale)
{
    BG_CU_DYN_SMEM(sm);
    int hp = bg__tc_hp(hs), ld = bg__tc_ld(hs);
    float *Qs = sm, *Ks = Qs + BG_TC_ROWS * ld, *Vs = Ks + BG_TC_BN * ld, *Ss = Vs + BG_TC_BN * ld;
    float *Os = Ss + BG_TC_WARPS * 16 * BG_TC_SLD;
    int C = NH * hs, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    size_t ldg = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * ldg + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    int i0 = blockIdx.y * BG_TC_ROWS, iw = i0 + 16 * w, i = iw + r;
    int last = min(T - 1, i0 + BG_TC_ROWS - 1);
    float *Sw = Ss + w * 16 * BG_TC_SLD, *Ow = Os + w * 16 * ld;
    bg__tc_load(Qs, ld, q, ldg, i0, BG_TC_ROWS, T, hs, hp);
    for (int idx = lane; idx < 16 * hp; idx += 32)
        Ow[idx / hp * ld + idx % hp] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = 0; j0 <= last; j0 += BG_TC_BN) {
        __syncthreads();
        bg__tc_load(Ks, ld, k, ldg, j0, BG_TC_BN, T, hs, hp);
        bg__tc_load(Vs, ld, v, ldg, j0, BG_TC_BN, T, hs, hp);
        __syncthreads();
        if (j0 > iw + 15 || iw >= T)
            continue; /* every key of the tile is after the warp's rows */
        bg_tc_c s[2];
        bg__tc_abt(s, Qs + (size_t)16 * w * ld, Ks, ld, hp);
        bg_wmma::store_matrix_sync(Sw, s[0], BG_TC_SLD, bg_wmma::mem_row_major);
        bg_wmma::store_matrix_sync(Sw + 16, s[1], BG_TC_SLD, bg_wmma::mem_row_major);
        __syncwarp();
        float *srow = Sw + r * BG_TC_SLD + half * (BG_TC_BN / 2), mt = -INFINITY;
        for (int c = 0; c < BG_TC_BN / 2; c++) {
            int j = j0 + half * (BG_TC_BN / 2) + c;
            srow[c] = i < T && j <= i ? scale * srow[c] : -INFINITY;
            mt = fmaxf(mt, srow[c]);
        }
        mt = fmaxf(mt, __shfl_xor_sync(BG_CU_FULL, mt, 1));
        float mnew = fmaxf(m, mt), corr = mnew == -INFINITY ? 1.0f : expf(m - mnew), ps = 0.0f;
        for (int c = 0; c < BG_TC_BN / 2; c++) {
            float p = mnew == -INFINITY ? 0.0f : expf(srow[c] - mnew);
            srow[c] = p;
            ps += p;
        }
        ps += __shfl_xor_sync(BG_CU_FULL, ps, 1);
        l = l * corr + ps;
        m = mnew;
        for (int d = half; d < hp; d += 2)
            Ow[r * ld + d] *= corr;
        __syncwarp();
        bg_tc_c o[BG_TC_MAX_HS / 16];
        for (int n = 0; n < hp / 16; n++)
            bg_wmma::load_matrix_sync(o[n], Ow + 16 * n, ld, bg_wmma::mem_row_major);
        bg__tc_sb(o, Sw, Vs, ld, hp);
        for (int n = 0; n < hp / 16; n++)
            bg_wmma::store_matrix_sync(Ow + 16 * n, o[n], ld, bg_wmma::mem_row_major);
        __syncwarp();
    }
    if (i < T) {
        float *dst = out + ((size_t)b * T + i) * C + (size_t)h * hs, inv = 1.0f / l;
        for (int d = half; d < hs; d += 2)
            dst[d] = Ow[r * ld + d] * inv;
        if (!half)
            lse[(size_t)bh * T + i] = m + logf(l);
    }
}

/* Backward, dQ: block (bh, 64 query rows), warp w rows iw..iw+15. Writes
 * dvec = D_i = rowsum(dO_i o O_i) for the dK/dV pass; dQ_i = scale sum_j
 * P_ij (dP_ij - D_i) K_j, key tiles in order. */
__global__ void bg__k_att_tc_dq(float *dqkv, float *dvec, const float *dout, const float *qkv, const float *out,
                                const float *lse, int T, int NH, int hs, float scale)
{
    BG_CU_DYN_SMEM(sm);
    int hp = bg__tc_hp(hs), ld = bg__tc_ld(hs);
    float *Qs = sm, *Ds = Qs + BG_TC_ROWS * ld, *Ks = Ds + BG_TC_ROWS * ld, *Vs = Ks + BG_TC_BN * ld;
    float *S1 = Vs + BG_TC_BN * ld, *S2 = S1 + BG_TC_WARPS * 16 * BG_TC_SLD;
    int C = NH * hs, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    size_t ldg = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * ldg + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    const float *dob = dout + (size_t)b * T * C + (size_t)h * hs, *ob = out + (size_t)b * T * C + (size_t)h * hs;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    int i0 = blockIdx.y * BG_TC_ROWS, iw = i0 + 16 * w, i = iw + r;
    int last = min(T - 1, i0 + BG_TC_ROWS - 1);
    float *S1w = S1 + w * 16 * BG_TC_SLD, *S2w = S2 + w * 16 * BG_TC_SLD;
    bg__tc_load(Qs, ld, q, ldg, i0, BG_TC_ROWS, T, hs, hp);
    bg__tc_load(Ds, ld, dob, C, i0, BG_TC_ROWS, T, hs, hp);
    __syncthreads();
    float dd = 0.0f, li = 0.0f;
    if (i < T) {
        for (int d = half; d < hs; d += 2)
            dd += Ds[(16 * w + r) * ld + d] * ob[(size_t)i * C + d];
        li = lse[(size_t)bh * T + i];
    }
    dd += __shfl_xor_sync(BG_CU_FULL, dd, 1);
    if (i < T && !half)
        dvec[(size_t)bh * T + i] = dd;
    bg_tc_c dq[BG_TC_MAX_HS / 16];
    for (int n = 0; n < hp / 16; n++)
        bg_wmma::fill_fragment(dq[n], 0.0f);
    for (int j0 = 0; j0 <= last; j0 += BG_TC_BN) {
        __syncthreads();
        bg__tc_load(Ks, ld, k, ldg, j0, BG_TC_BN, T, hs, hp);
        bg__tc_load(Vs, ld, v, ldg, j0, BG_TC_BN, T, hs, hp);
        __syncthreads();
        if (j0 > iw + 15 || iw >= T)
            continue;
        bg_tc_c s[2];
        bg__tc_abt(s, Qs + (size_t)16 * w * ld, Ks, ld, hp);
        bg_wmma::store_matrix_sync(S1w, s[0], BG_TC_SLD, bg_wmma::mem_row_major);
        bg_wmma::store_matrix_sync(S1w + 16, s[1], BG_TC_SLD, bg_wmma::mem_row_major);
        bg__tc_abt(s, Ds + (size_t)16 * w * ld, Vs, ld, hp); /* dP = dO V^T */
        bg_wmma::store_matrix_sync(S2w, s[0], BG_TC_SLD, bg_wmma::mem_row_major);
        bg_wmma::store_matrix_sync(S2w + 16, s[1], BG_TC_SLD, bg_wmma::mem_row_major);
        __syncwarp();
        for (int c = half * (BG_TC_BN / 2); c < (half + 1) * (BG_TC_BN / 2); c++) {
            int j = j0 + c;
            float p = i < T && j <= i ? expf(scale * S1w[r * BG_TC_SLD + c] - li) : 0.0f;
            S1w[r * BG_TC_SLD + c] = p * (S2w[r * BG_TC_SLD + c] - dd) * scale;
        }
        __syncwarp();
        bg__tc_sb(dq, S1w, Ks, ld, hp);
        __syncwarp();
    }
    __syncthreads(); /* Qs's rows of this warp become its output staging */
    bg__tc_store_rows(dqkv + (size_t)b * T * ldg + (size_t)h * hs, ldg, Qs + (size_t)16 * w * ld, ld, dq, iw, T, hs,
                      hp, lane);
}

/* Backward, dK and dV: block (bh, 64 key rows), warp w keys jw..jw+15; the
 * query tiles from the first that sees them, in order: dV_j = sum_i P_ij dO_i,
 * dK_j = scale sum_i P_ij (dP_ij - D_i) Q_i. */
__global__ void bg__k_att_tc_dkv(float *dqkv, const float *dvec, const float *dout, const float *qkv,
                                 const float *lse, int T, int NH, int hs, float scale)
{
    BG_CU_DYN_SMEM(sm);
    int hp = bg__tc_hp(hs), ld = bg__tc_ld(hs);
    float *Ks = sm, *Vs = Ks + BG_TC_ROWS * ld, *Qs = Vs + BG_TC_ROWS * ld, *Ds = Qs + BG_TC_BN * ld;
    float *S1 = Ds + BG_TC_BN * ld, *S2 = S1 + BG_TC_WARPS * 16 * BG_TC_SLD, *lt = S2 + BG_TC_WARPS * 16 * BG_TC_SLD;
    float *dt = lt + BG_TC_BN;
    int C = NH * hs, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    size_t ldg = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * ldg + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    const float *dob = dout + (size_t)b * T * C + (size_t)h * hs;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    int j0b = blockIdx.y * BG_TC_ROWS, jw = j0b + 16 * w, j = jw + r;
    float *S1w = S1 + w * 16 * BG_TC_SLD, *S2w = S2 + w * 16 * BG_TC_SLD;
    bg__tc_load(Ks, ld, k, ldg, j0b, BG_TC_ROWS, T, hs, hp);
    bg__tc_load(Vs, ld, v, ldg, j0b, BG_TC_ROWS, T, hs, hp);
    bg_tc_c dk[BG_TC_MAX_HS / 16], dv[BG_TC_MAX_HS / 16];
    for (int n = 0; n < hp / 16; n++) {
        bg_wmma::fill_fragment(dk[n], 0.0f);
        bg_wmma::fill_fragment(dv[n], 0.0f);
    }
    for (int i0 = j0b / BG_TC_BN * BG_TC_BN; i0 < T; i0 += BG_TC_BN) {
        __syncthreads();
        bg__tc_load(Qs, ld, q, ldg, i0, BG_TC_BN, T, hs, hp);
        bg__tc_load(Ds, ld, dob, C, i0, BG_TC_BN, T, hs, hp);
        for (int t = threadIdx.x; t < BG_TC_BN; t += blockDim.x) {
            lt[t] = i0 + t < T ? lse[(size_t)bh * T + i0 + t] : 0.0f;
            dt[t] = i0 + t < T ? dvec[(size_t)bh * T + i0 + t] : 0.0f;
        }
        __syncthreads();
        if (i0 + BG_TC_BN - 1 < jw || jw >= T)
            continue; /* every query of the tile is before the warp's keys */
        bg_tc_c s[2];
        bg__tc_abt(s, Ks + (size_t)16 * w * ld, Qs, ld, hp); /* S^T = K Q^T */
        bg_wmma::store_matrix_sync(S1w, s[0], BG_TC_SLD, bg_wmma::mem_row_major);
        bg_wmma::store_matrix_sync(S1w + 16, s[1], BG_TC_SLD, bg_wmma::mem_row_major);
        bg__tc_abt(s, Vs + (size_t)16 * w * ld, Ds, ld, hp); /* dP^T = V dO^T */
        bg_wmma::store_matrix_sync(S2w, s[0], BG_TC_SLD, bg_wmma::mem_row_major);
        bg_wmma::store_matrix_sync(S2w + 16, s[1], BG_TC_SLD, bg_wmma::mem_row_major);
        __syncwarp();
        for (int c = half * (BG_TC_BN / 2); c < (half + 1) * (BG_TC_BN / 2); c++) {
            int i = i0 + c;
            float p = j < T && i < T && j <= i ? expf(scale * S1w[r * BG_TC_SLD + c] - lt[c]) : 0.0f;
            S1w[r * BG_TC_SLD + c] = p;
            S2w[r * BG_TC_SLD + c] = p * (S2w[r * BG_TC_SLD + c] - dt[c]) * scale;
        }
        __syncwarp();
        bg__tc_sb(dv, S1w, Ds, ld, hp);
        bg__tc_sb(dk, S2w, Qs, ld, hp);
        __syncwarp();
    }
    float *g = dqkv + (size_t)b * T * ldg + (size_t)h * hs + C;
    bg__tc_store_rows(g, ldg, Ks + (size_t)16 * w * ld, ld, dk, jw, T, hs, hp, lane);
    bg__tc_store_rows(g + C, ldg, Vs + (size_t)16 * w * ld, ld, dv, jw, T, hs, hp, lane);
}

static size_t bg__att_tc_smem_fwd(int hs)
{
    return ((size_t)(BG_TC_ROWS + 2 * BG_TC_BN + BG_TC_ROWS) * bg__tc_ld(hs) + BG_TC_WARPS * 16 * BG_TC_SLD) * 4;
}
static size_t bg__att_tc_smem_dq(int hs)
{
    return ((size_t)(2 * BG_TC_ROWS + 2 * BG_TC_BN) * bg__tc_ld(hs) + 2 * BG_TC_WARPS * 16 * BG_TC_SLD) * 4;
}
static size_t bg__att_tc_smem_dkv(int hs)
{
    return ((size_t)(2 * BG_TC_ROWS + 2 * BG_TC_BN) * bg__tc_ld(hs) + 2 * BG_TC_WARPS * 16 * BG_TC_SLD +
            2 * BG_TC_BN) * 4;
}

/* the tensor-core kernels for this call (1), or the CUDA-core ones (0) */
static int bg__att_tc(bg_backend_t *be, int hs)
{
    const char *e = bg_config_str("BRIGADE_CUDA_ATTN");
    int want = !strcmp(e, "tc") ? 1 : !strcmp(e, "simt") ? 0 : bg__cu_attention_tc_default(be);
    return want && hs >= 1 && hs <= BG_TC_MAX_HS;
}

template <typename K, typename... A>
static void bg__att_tc_launch(bg_backend_t *be, K kern, const char *what, int T, int BH, size_t smem, A... args)
{
    if (smem > 48 * 1024)
        bg__cu_check(be, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), what);
    dim3 grid(BH, (T + BG_TC_ROWS - 1) / BG_TC_ROWS);
    BG_CU_LAUNCH(kern, grid, BG_TC_WARPS * 32, smem, BG_CU_STREAM(be), args...);
    BG_CU_LAUNCHED(be, what);
}

static void bg__att_tc_forward(bg_backend_t *be, float *out, float *lse, const float *qkv, int B, int T, int NH,
                               int hs)
{
    float scale = 1.0f / sqrtf((float)hs);
    bg__att_tc_launch(be, bg__k_att_tc_fwd, "attention forward (tensor cores)", T, B * NH, bg__att_tc_smem_fwd(hs),
                      out, lse, qkv, T, NH, hs, scale);
}

static void bg__att_tc_backward(bg_backend_t *be, float *dqkv, float *dvec, const float *dout, const float *qkv,
                                const float *out, const float *lse, int B, int T, int NH, int hs)
{
    float scale = 1.0f / sqrtf((float)hs);
    bg__att_tc_launch(be, bg__k_att_tc_dq, "attention backward (dq, tensor cores)", T, B * NH,
                      bg__att_tc_smem_dq(hs), dqkv, dvec, dout, qkv, out, lse, T, NH, hs, scale);
    bg__att_tc_launch(be, bg__k_att_tc_dkv, "attention backward (dk, dv, tensor cores)", T, B * NH,
                      bg__att_tc_smem_dkv(hs), dqkv, (const float *)dvec, dout, qkv, lse, T, NH, hs, scale);
}
