/* kernels/cuda/cuda_kernels.cu: every CUDA kernel of the CUDA backend and its
 * launch: elementwise ops, AdamW/SGD, the sum/sumsq reduction, GEMM's k = 0
 * case, bias, GELU, ReLU, LayerNorm, softmax (plain, causal, fused with
 * cross-entropy), embedding, the attention layout changes and the fused
 * causal attention; cuda_llama.cuh (included at the end) the Llama-style
 * kernels. cuda_backend.cu owns the runtime calls (memory, copies,
 * streams, cuBLAS) and the table.
 *
 * Row ops give one row to one block (256 threads, block reductions in a fixed
 * tree); reductions over rows: bias_backward and layernorm_backward_weight
 * give 32 columns to a block whose 8 warps sum interleaved rows in double and
 * then add up in warp order; embedding_backward gives each output element one
 * thread adding rows in (b,t) order, as the CPU does. No
 * kernel uses atomics, so results are run-to-run reproducible; they are not
 * bitwise those of the CPU backend (float reductions in another order).
 * sum/sumsq: a fixed grid of BG_CUDA_RED_BLOCKS blocks, each summing its
 * grid-strided elements per thread in double and then its threads in a fixed
 * tree; one thread adds the block partials in order.
 * Parameter gradients accumulate (+=), activation gradients are assigned (=).
 *
 * Attention is flash-style: one warp per query row, key/value tiles of 32 in
 * shared memory, an online softmax; no T x T buffer. The backward is two
 * kernels (dQ by query rows, then dK and dV by key rows) so that every output
 * has one owner and no atomics are needed. Head sizes up to 256.
 *
 * Compiled and linked in CI; NOT yet run on a GPU (docs/kernels.md). The
 * same source also compiles as C++ against tests/bg_cuda_emu.h, which runs
 * the kernels on the CPU (fibers for threads, barriers for __syncthreads and
 * warp shuffles) so that test_conformance_emu checks their indexing and
 * arithmetic without a GPU: launches go through BG_CU_LAUNCH, dynamic shared
 * memory through BG_CU_DYN_SMEM, and the stream through BG_CU_STREAM. */
#include <math.h>

extern "C" {
#include "brigade/core.h"
}
#include "kernels/cuda/cuda_impl.h"
#include "kernels/bf16.h"

#define BG_CU_FOR(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
                             i += (size_t)gridDim.x * blockDim.x)
#define BG_CU_FULL 0xffffffffu
#define BG_GELU_SCALE 0.7978845608028654f
#define BG_LN_EPS 1e-5f

#define BG_CU_LAUNCH1(kernel, n, ...)                                                              \
    do {                                                                                           \
        if ((n) == 0)                                                                              \
            return;                                                                                \
        BG_CU_LAUNCH(kernel, bg__cu_grid(n), BG_CUDA_THREADS, 0, BG_CU_STREAM(be), __VA_ARGS__);    \
        BG_CU_LAUNCHED(be, #kernel);                                                               \
    } while (0)
/* one block per row */
#define BG_CU_LAUNCH_ROWS(kernel, rows, ...)                                                       \
    do {                                                                                           \
        if ((rows) <= 0)                                                                           \
            return;                                                                                \
        BG_CU_LAUNCH(kernel, (unsigned)(rows), BG_CUDA_THREADS, 0, BG_CU_STREAM(be), __VA_ARGS__);  \
        BG_CU_LAUNCHED(be, #kernel);                                                               \
    } while (0)

/* ------------------------------------------------------- block reductions */

/* sum (is_max 0) or max over the warp, returned to every lane (a fixed tree) */
__device__ __forceinline__ float bg__warp_reduce(float v, int is_max)
{
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(BG_CU_FULL, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    return v;
}
__device__ __forceinline__ float bg__warp_sum(float v) { return bg__warp_reduce(v, 0); }
__device__ __forceinline__ float bg__warp_max(float v) { return bg__warp_reduce(v, 1); }

/* sum or max over the block, returned to every thread: the warps' results,
 * then one warp over them */
__device__ float bg__block_reduce(float v, int is_max)
{
    __shared__ float sh[32];
    v = bg__warp_reduce(v, is_max);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sh[lane] : is_max ? -INFINITY : 0.0f;
    return bg__warp_reduce(v, is_max);
}
__device__ float bg__block_sum(float v) { return bg__block_reduce(v, 0); }
__device__ float bg__block_max(float v) { return bg__block_reduce(v, 1); }

/* ------------------------------------------------ elementwise, optimizers */

__global__ void bg__k_fill(float *x, float v, size_t n) { BG_CU_FOR(i, n) x[i] = v; }
__global__ void bg__k_scale(float *x, float a, size_t n) { BG_CU_FOR(i, n) x[i] *= a; }
__global__ void bg__k_axpy(float *y, float a, const float *x, size_t n) { BG_CU_FOR(i, n) y[i] += a * x[i]; }
__global__ void bg__k_add(float *o, const float *a, const float *b, size_t n) { BG_CU_FOR(i, n) o[i] = a[i] + b[i]; }

void bg__cu_fill(bg_backend_t *be, float *x, float v, size_t n) { BG_CU_LAUNCH1(bg__k_fill, n, x, v, n); }
void bg__cu_scale(bg_backend_t *be, float *x, float a, size_t n) { BG_CU_LAUNCH1(bg__k_scale, n, x, a, n); }
void bg__cu_axpy(bg_backend_t *be, float *y, float a, const float *x, size_t n)
{
    BG_CU_LAUNCH1(bg__k_axpy, n, y, a, x, n);
}
void bg__cu_residual_forward(bg_backend_t *be, float *out, const float *a, const float *b, size_t n)
{
    BG_CU_LAUNCH1(bg__k_add, n, out, a, b, n);
}

/* fp32 <-> bf16 through kernels/bf16.h, the CPU backend's bits */
__global__ void bg__k_to_bf16(uint16_t *d, const uint32_t *s, size_t n) { BG_CU_FOR(i, n) d[i] = bg__bf16_from_bits(s[i]); }
__global__ void bg__k_from_bf16(uint32_t *d, const uint16_t *s, size_t n) { BG_CU_FOR(i, n) d[i] = bg__bf16_to_bits(s[i]); }
__global__ void bg__k_copy16(uint16_t *d, const uint16_t *s, size_t n) { BG_CU_FOR(i, n) d[i] = s[i]; }
__global__ void bg__k_copy32(uint32_t *d, const uint32_t *s, size_t n) { BG_CU_FOR(i, n) d[i] = s[i]; }

void bg__cu_convert(bg_backend_t *be, void *dst, bg_dtype_t dt, const void *src, bg_dtype_t st, size_t n)
{
    if (dt == BG_BF16 && st == BG_F32)
        BG_CU_LAUNCH1(bg__k_to_bf16, n, (uint16_t *)dst, (const uint32_t *)src, n);
    else if (dt == BG_F32 && st == BG_BF16)
        BG_CU_LAUNCH1(bg__k_from_bf16, n, (uint32_t *)dst, (const uint16_t *)src, n);
    else if (dt == BG_BF16)
        BG_CU_LAUNCH1(bg__k_copy16, n, (uint16_t *)dst, (const uint16_t *)src, n);
    else
        BG_CU_LAUNCH1(bg__k_copy32, n, (uint32_t *)dst, (const uint32_t *)src, n);
}

__global__ void bg__k_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
                            float beta2, float eps, float wd, float bc1, float bc2)
{
    BG_CU_FOR(i, n)
    {
        float g = grad[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * param[i]);
    }
}

__global__ void bg__k_sgd(float *param, const float *grad, float *mom, size_t n, float lr, float momentum, float wd)
{
    BG_CU_FOR(i, n)
    {
        float mi = momentum * mom[i] + grad[i] + wd * param[i];
        mom[i] = mi;
        param[i] -= lr * mi;
    }
}

void bg__cu_adamw(bg_backend_t *be, float *param, const float *grad, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t)
{
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    BG_CU_LAUNCH1(bg__k_adamw, n, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
}

void bg__cu_sgd_momentum(bg_backend_t *be, float *param, const float *grad, float *mom, size_t n, float lr,
                         float momentum, float weight_decay)
{
    BG_CU_LAUNCH1(bg__k_sgd, n, param, grad, mom, n, lr, momentum, weight_decay);
}

/* ------------------------------------------------------------ reductions */

/* Block b sums elements b*T+t, stepping by the whole grid, per thread in
 * order, then the block's threads in a fixed tree: a fixed grid, so the
 * result depends on n only. */
__global__ void bg__k_reduce_part(double *part, const float *x, size_t n, int sq)
{
    __shared__ double sh[BG_CUDA_THREADS];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)BG_CUDA_THREADS + threadIdx.x; i < n;
         i += (size_t)BG_CUDA_RED_BLOCKS * BG_CUDA_THREADS) {
        double v = x[i];
        s += sq ? v * v : v;
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = BG_CUDA_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        part[blockIdx.x] = sh[0];
}

__global__ void bg__k_reduce_final(double *total, const double *part) /* one warp, thread 0 works */
{
    if (threadIdx.x != 0)
        return;
    double s = 0.0;
    for (int i = 0; i < BG_CUDA_RED_BLOCKS; i++)
        s += part[i];
    *total = s;
}

/* red[0..BG_CUDA_RED_BLOCKS) the block partials, red[BG_CUDA_RED_BLOCKS] the
 * total (device memory; cuda_backend.cu copies it to the host) */
void bg__cu_reduce_launch(bg_backend_t *be, double *red, const float *x, size_t n, int sq)
{
    BG_CU_LAUNCH(bg__k_reduce_part, BG_CUDA_RED_BLOCKS, BG_CUDA_THREADS, 0, BG_CU_STREAM(be), red, x, n, sq);
    BG_CU_LAUNCHED(be, "bg__k_reduce_part");
    BG_CU_LAUNCH(bg__k_reduce_final, 1, 32, 0, BG_CU_STREAM(be), red + BG_CUDA_RED_BLOCKS, red);
    BG_CU_LAUNCHED(be, "bg__k_reduce_final");
}

/* ------------------------------------------------------------ GEMM, k = 0 */

/* C(i,j) = beta * C(i,j) for each matrix (k == 0: there is no product, and
 * cuBLAS would reject lda = 0); beta == 0 writes zeros, as BLAS does. */
__global__ void bg__k_scale_c(float *c, int m, int n, int ldc, long long stride_c, float beta, int batch)
{
    size_t total = (size_t)m * n * batch;
    BG_CU_FOR(idx, total)
    {
        size_t bi = idx / ((size_t)m * n), r = idx % ((size_t)m * n);
        float *p = c + bi * stride_c + (r / n) * (size_t)ldc + r % n;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

void bg__cu_gemm_scale_c(bg_backend_t *be, float *c, int m, int n, int ldc, long long stride_c, float beta, int batch)
{
    size_t total = (size_t)m * n * batch;
    BG_CU_LAUNCH1(bg__k_scale_c, total, c, m, n, ldc, stride_c, beta, batch);
}

/* ------------------------------------------------------------------ bias */

__global__ void bg__k_bias_fwd(float *out, const float *bias, int N, int C)
{
    BG_CU_FOR(i, (size_t)N * C) out[i] += bias[i % C];
}

/* Reductions over rows: a block per 32 columns (lane = column) and per slice
 * of BG_COL_SLICE rows; warp w sums the slice's rows w, w + 8, w + 16, ... in
 * double, then warp 0 adds the 8 warps' sums in warp order. With one slice
 * that is the column's total; with several, each slice's total goes to the
 * scratch (bg__cu_colsum_scratch) and a second kernel adds the slices in
 * order: a fixed order that depends on N and C only. Slices give the grid
 * enough blocks when C is small (768 columns: 24 blocks without them). */
#define BG_COL_WARPS (BG_CUDA_THREADS / 32)
#define BG_COL_GRID(C) (((C) + 31) / 32)
#define BG_COL_SLICE 512

/* slices for N rows of C columns whose nsum sums each need a double per slice */
static int bg__col_slices(bg_backend_t *be, int N, int C, int nsum, double **scratch_p)
{
    size_t cap = 0;
    *scratch_p = bg__cu_colsum_scratch(be, &cap);
    size_t want = ((size_t)N + BG_COL_SLICE - 1) / BG_COL_SLICE, fit = cap / ((size_t)nsum * (size_t)C);
    size_t sl = want < fit ? want : fit;
    return sl > 1 && *scratch_p ? (int)sl : 1;
}

/* the block's total of v for this lane's column, valid in warp 0; sh holds
 * BG_CUDA_THREADS doubles and may be reused after the call */
__device__ double bg__col_combine(double v, double *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    sh[w * 32 + lane] = v;
    __syncthreads();
    double t = 0.0;
    if (w == 0)
        for (int k = 0; k < BG_COL_WARPS; k++)
            t += sh[k * 32 + lane];
    __syncthreads();
    return t;
}

/* rows [lo, hi) of slice blockIdx.y (of gridDim.y slices of n rows) */
__device__ __forceinline__ void bg__col_rows(int n, int *lo, int *hi)
{
    int per = (n + (int)gridDim.y - 1) / (int)gridDim.y;
    *lo = (int)blockIdx.y * per;
    *hi = min(n, *lo + per);
}

/* column c's sum: added to dst (one slice) or written to part[slice * C + c] */
__device__ __forceinline__ void bg__col_out(float *dst, double *part, double v, int c, int C)
{
    if (gridDim.y == 1)
        dst[c] += (float)v;
    else
        part[(size_t)blockIdx.y * C + c] = v;
}

/* dst[c] += the slices' sums of column c, slices in order (k: which of the sums) */
__global__ void bg__k_col_final(float *dst, const double *part, int slices, int C, int k)
{
    BG_CU_FOR(c, (size_t)C)
    {
        double t = 0.0;
        for (int s = 0; s < slices; s++)
            t += part[((size_t)k * slices + s) * C + c];
        dst[c] += (float)t;
    }
}

__global__ void bg__k_colsum(float *dst, double *part, const float *src, int N, int C)
{
    __shared__ double sh[BG_CUDA_THREADS];
    int c = blockIdx.x * 32 + (threadIdx.x & 31), lo, hi;
    bg__col_rows(N, &lo, &hi);
    double s = 0.0;
    if (c < C)
        for (int n = lo + (threadIdx.x >> 5); n < hi; n += BG_COL_WARPS)
            s += src[(size_t)n * C + c];
    s = bg__col_combine(s, sh);
    if (threadIdx.x < 32 && c < C)
        bg__col_out(dst, part, s, c, C);
}

/* the slices' sums of the k-th of a reduction's outputs into dst (several slices) */
static void bg__col_finish(bg_backend_t *be, float *dst, const double *part, int slices, int C, int k)
{
    if (slices > 1 && dst)
        BG_CU_LAUNCH1(bg__k_col_final, (size_t)C, dst, part, slices, C, k);
}

void bg__cu_bias_forward(bg_backend_t *be, float *out, const float *bias, int N, int C)
{
    size_t n = (size_t)N * C;
    BG_CU_LAUNCH1(bg__k_bias_fwd, n, out, bias, N, C);
}

void bg__cu_bias_backward(bg_backend_t *be, float *dbias, const float *dout, int N, int C)
{
    if (C <= 0)
        return;
    double *part;
    int sl = bg__col_slices(be, N, C, 1, &part);
    BG_CU_LAUNCH(bg__k_colsum, dim3(BG_COL_GRID(C), sl), BG_CUDA_THREADS, 0, BG_CU_STREAM(be),
                 dbias, part, dout, N, C);
    BG_CU_LAUNCHED(be, "bg__k_colsum");
    bg__col_finish(be, dbias, part, sl, C, 0);
}

/* ----------------------------------------------------------- activations */

/* the CPU's one-exponential form; the exponent is clamped so that e stays
 * finite (s = 1 then, as the CPU's saturating expf gives) */
__device__ __forceinline__ void bg__gelu_s(float x, float *s, float *r)
{
    float a = BG_GELU_SCALE * (x + 0.044715f * x * x * x);
    float e = expf(fminf(2.0f * a, 80.0f));
    *r = 1.0f / (e + 1.0f);
    *s = e * *r;
}
__global__ void bg__k_gelu_fwd(float *out, const float *in, size_t n)
{
    BG_CU_FOR(i, n)
    {
        float s, r, x = in[i];
        bg__gelu_s(x, &s, &r);
        out[i] = x * s;
    }
}
__global__ void bg__k_gelu_bwd(float *din, const float *in, const float *dout, size_t n)
{
    BG_CU_FOR(i, n)
    {
        float s, r, x = in[i];
        bg__gelu_s(x, &s, &r);
        float xc = x > 10.0f ? 10.0f : x < -10.0f ? -10.0f : x; /* as the CPU's: x^2 cannot overflow */
        float g = s + xc * (2.0f * s * r) * BG_GELU_SCALE * (1.0f + 3.0f * 0.044715f * xc * xc);
        din[i] = g * dout[i];
    }
}
__global__ void bg__k_relu_fwd(float *out, const float *in, size_t n)
{
    BG_CU_FOR(i, n) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}
__global__ void bg__k_relu_bwd(float *din, const float *in, const float *dout, size_t n)
{
    BG_CU_FOR(i, n) din[i] = in[i] > 0.0f ? dout[i] : 0.0f;
}

void bg__cu_gelu_forward(bg_backend_t *be, float *out, const float *in, size_t n)
{
    BG_CU_LAUNCH1(bg__k_gelu_fwd, n, out, in, n);
}
void bg__cu_gelu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n)
{
    BG_CU_LAUNCH1(bg__k_gelu_bwd, n, din, in, dout, n);
}
void bg__cu_relu_forward(bg_backend_t *be, float *out, const float *in, size_t n)
{
    BG_CU_LAUNCH1(bg__k_relu_fwd, n, out, in, n);
}
void bg__cu_relu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n)
{
    BG_CU_LAUNCH1(bg__k_relu_bwd, n, din, in, dout, n);
}

/* ------------------------------------------------------------- LayerNorm */

__global__ void bg__k_ln_fwd(float *out, float *mean, float *rstd, const float *in, const float *w, const float *b,
                             int C)
{
    const float *x = in + (size_t)blockIdx.x * C;
    float *o = out + (size_t)blockIdx.x * C;
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += x[c];
    float m = bg__block_sum(s) / C;
    float v = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        v += (x[c] - m) * (x[c] - m);
    float r = 1.0f / sqrtf(bg__block_sum(v) / C + BG_LN_EPS);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = (x[c] - m) * r * w[c] + b[c];
    if (threadIdx.x == 0) {
        if (mean)
            mean[blockIdx.x] = m;
        if (rstd)
            rstd[blockIdx.x] = r;
    }
}

__global__ void bg__k_ln_bwd_in(float *din, const float *dout, const float *in, const float *w, const float *mean,
                                const float *rstd, int C)
{
    size_t off = (size_t)blockIdx.x * C;
    const float *x = in + off, *dy = dout + off;
    float m = mean[blockIdx.x], r = rstd[blockIdx.x], a1 = 0.0f, a2 = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float dn = w[c] * dy[c];
        a1 += dn;
        a2 += dn * (x[c] - m) * r;
    }
    float dmean = bg__block_sum(a1) / C, dnm = bg__block_sum(a2) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float norm = (x[c] - m) * r;
        din[off + c] = (w[c] * dy[c] - dmean - norm * dnm) * r;
    }
}

/* the sums for dw at part[0 .. slices*C), for db after them */
__global__ void bg__k_ln_bwd_w(float *dw, float *db, double *part, const float *dout, const float *in,
                               const float *mean, const float *rstd, int N, int C)
{
    __shared__ double sh[BG_CUDA_THREADS];
    int c = blockIdx.x * 32 + (threadIdx.x & 31), lo, hi;
    bg__col_rows(N, &lo, &hi);
    double aw = 0.0, ab = 0.0;
    if (c < C)
        for (int n = lo + (threadIdx.x >> 5); n < hi; n += BG_COL_WARPS) {
            float dy = dout[(size_t)n * C + c];
            float norm = (in[(size_t)n * C + c] - mean[n]) * rstd[n];
            aw += (double)(dy * norm);
            ab += (double)dy;
        }
    aw = bg__col_combine(aw, sh);
    ab = bg__col_combine(ab, sh);
    if (threadIdx.x >= 32 || c >= C)
        return;
    if (dw)
        bg__col_out(dw, part, aw, c, C);
    if (db)
        bg__col_out(db, part ? part + (size_t)gridDim.y * C : part, ab, c, C);
}

void bg__cu_layernorm_forward(bg_backend_t *be, float *out, float *mean, float *rstd, const float *in,
                              const float *weight, const float *bias, int N, int C)
{
    BG_CU_LAUNCH_ROWS(bg__k_ln_fwd, N, out, mean, rstd, in, weight, bias, C);
}
void bg__cu_layernorm_backward_input(bg_backend_t *be, float *din, const float *dout, const float *in,
                                     const float *weight, const float *mean, const float *rstd, int N, int C)
{
    BG_CU_LAUNCH_ROWS(bg__k_ln_bwd_in, N, din, dout, in, weight, mean, rstd, C);
}
void bg__cu_layernorm_backward_weight(bg_backend_t *be, float *dweight, float *dbias, const float *dout,
                                      const float *in, const float *mean, const float *rstd, int N, int C)
{
    if (C <= 0)
        return;
    double *part;
    int sl = bg__col_slices(be, N, C, 2, &part);
    BG_CU_LAUNCH(bg__k_ln_bwd_w, dim3(BG_COL_GRID(C), sl), BG_CUDA_THREADS, 0, BG_CU_STREAM(be),
                 dweight, dbias, part, dout, in, mean, rstd, N, C);
    BG_CU_LAUNCHED(be, "bg__k_ln_bwd_w");
    bg__col_finish(be, dweight, part, sl, C, 0);
    bg__col_finish(be, dbias, part, sl, C, 1);
}

/* --------------------------------------------------------------- softmax */

/* y[0..n) = softmax(scale * x[0..n)), y[n..len) = 0 (y may equal x: every
 * element is read and written by the same thread). Returns the sum of the
 * exponentials; *mx_p the maximum subtracted. */
__device__ float bg__softmax_row(float *y, float *mx_p, const float *x, float scale, int n, int len)
{
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        mx = fmaxf(mx, scale * x[j]);
    mx = bg__block_max(mx);
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float e = expf(scale * x[j] - mx);
        y[j] = e;
        s += e;
    }
    s = bg__block_sum(s);
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < len; j += blockDim.x)
        y[j] = j < n ? y[j] * inv : 0.0f;
    *mx_p = mx;
    return s;
}

/* dy[j] = scale a[j] (da[j] - sum_k a[k] da[k]) for j < n, 0 up to len (dy may equal da) */
__device__ void bg__softmax_bwd_row(float *dy, const float *da, const float *a, float scale, int n, int len)
{
    float d = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x)
        d += a[j] * da[j];
    d = bg__block_sum(d);
    for (int j = threadIdx.x; j < len; j += blockDim.x)
        dy[j] = j < n ? scale * a[j] * (da[j] - d) : 0.0f;
}

__global__ void bg__k_softmax_fwd(float *out, const float *in, int C)
{
    float mx;
    size_t off = (size_t)blockIdx.x * C;
    bg__softmax_row(out + off, &mx, in + off, 1.0f, C, C);
}
__global__ void bg__k_softmax_bwd(float *din, const float *dout, const float *out, int C)
{
    size_t off = (size_t)blockIdx.x * C;
    bg__softmax_bwd_row(din + off, dout + off, out + off, 1.0f, C, C);
}
__global__ void bg__k_causal_fwd(float *att, const float *preatt, float scale, int T)
{
    float mx;
    size_t off = (size_t)blockIdx.x * T;
    bg__softmax_row(att + off, &mx, preatt + off, scale, (int)(blockIdx.x % T) + 1, T);
}
__global__ void bg__k_causal_bwd(float *dpreatt, const float *datt, const float *att, float scale, int T)
{
    size_t off = (size_t)blockIdx.x * T;
    bg__softmax_bwd_row(dpreatt + off, datt + off, att + off, scale, (int)(blockIdx.x % T) + 1, T);
}

void bg__cu_softmax_forward(bg_backend_t *be, float *out, const float *in, int N, int C)
{
    BG_CU_LAUNCH_ROWS(bg__k_softmax_fwd, N, out, in, C);
}
void bg__cu_softmax_backward(bg_backend_t *be, float *din, const float *dout, const float *out, int N, int C)
{
    BG_CU_LAUNCH_ROWS(bg__k_softmax_bwd, N, din, dout, out, C);
}
void bg__cu_causal_softmax_forward(bg_backend_t *be, float *att, const float *preatt, float scale, int BH, int T)
{
    BG_CU_LAUNCH_ROWS(bg__k_causal_fwd, (long long)BH * T, att, preatt, scale, T);
}
void bg__cu_causal_softmax_backward(bg_backend_t *be, float *dpreatt, const float *datt, const float *att,
                                    float scale, int BH, int T)
{
    BG_CU_LAUNCH_ROWS(bg__k_causal_bwd, (long long)BH * T, dpreatt, datt, att, scale, T);
}

/* --------------------------------------------------------- cross-entropy */

__global__ void bg__k_ce_fwd(float *losses, float *probs, const float *logits, const int32_t *targets, int V)
{
    size_t off = (size_t)blockIdx.x * V;
    float mx;
    float s = bg__softmax_row(probs + off, &mx, logits + off, 1.0f, V, V);
    if (threadIdx.x == 0) {
        int32_t t = targets[blockIdx.x];
        /* an out-of-range target gives NaN (the layer validates tokens) */
        losses[blockIdx.x] = (t >= 0 && t < V) ? logf(s) - (logits[off + t] - mx) : NAN;
    }
}

__global__ void bg__k_ce_bwd(float *dlogits, const float *probs, const int32_t *targets, float dloss, int N, int V)
{
    BG_CU_FOR(i, (size_t)N * V)
    {
        int32_t t = targets[i / V];
        float p = probs[i];
        dlogits[i] = (int)(i % V) == t ? (p - 1.0f) * dloss : p * dloss;
    }
}

void bg__cu_crossentropy_forward(bg_backend_t *be, float *losses, float *probs, const float *logits,
                                 const int32_t *targets, int N, int V)
{
    BG_CU_LAUNCH_ROWS(bg__k_ce_fwd, N, losses, probs, logits, targets, V);
}
void bg__cu_crossentropy_backward(bg_backend_t *be, float *dlogits, const float *probs, const int32_t *targets,
                                  float dloss, int N, int V)
{
    size_t n = (size_t)N * V;
    BG_CU_LAUNCH1(bg__k_ce_bwd, n, dlogits, probs, targets, dloss, N, V);
}

/* ------------------------------------------------------------- embedding */

__global__ void bg__k_emb_fwd(float *out, const int32_t *tokens, const float *wte, const float *wpe, int T, int C,
                              size_t n)
{
    BG_CU_FOR(i, n)
    {
        size_t r = i / C;
        int c = (int)(i % C);
        float e = wte[(size_t)tokens[r] * C + c];
        out[i] = wpe ? e + wpe[(size_t)(r % T) * C + c] : e;
    }
}

/* dwte: thread (c, bucket) owns the column c of every token t with
 * t % BG_EMB_BUCKETS == bucket and adds the rows in (b,t) order, as the CPU
 * does: no atomics, and the vocabulary size is not needed. */
#define BG_EMB_BUCKETS 32
__global__ void bg__k_emb_bwd_wte(float *dwte, const float *dout, const int32_t *tokens, int rows, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, bucket = blockIdx.y;
    if (c >= C)
        return;
    for (int r = 0; r < rows; r++) {
        int32_t t = tokens[r];
        if (t % BG_EMB_BUCKETS == bucket)
            dwte[(size_t)t * C + c] += dout[(size_t)r * C + c];
    }
}
/* The same sums from row lists: the rows of each of BG_EMB_LISTS token
 * buckets (token mod BG_EMB_LISTS) listed in row order (one warp per bucket
 * counts, then lists them after an order-keeping compaction), and thread
 * (c, bucket) adds only its bucket's rows: the same order per token, so the
 * same bits, with every thread walking rows / BG_EMB_LISTS rows on average
 * instead of all of them. */
#define BG_EMB_LISTS 256
__device__ __forceinline__ int bg__emb_list(int32_t t) { return (int)((uint32_t)t % BG_EMB_LISTS); }
__global__ void bg__k_emb_count(int *counts, const int32_t *tokens, int rows)
{
    int b = blockIdx.x, lane = threadIdx.x, n = 0;
    for (int r = lane; r < rows; r += 32)
        n += bg__emb_list(tokens[r]) == b;
    float t = bg__warp_sum((float)n); /* exact: rows < 2^24 (the launcher checks) */
    if (lane == 0)
        counts[b] = (int)t;
}
__global__ void bg__k_emb_offsets(int *off, const int *counts)
{
    if (threadIdx.x != 0)
        return;
    off[0] = 0;
    for (int b = 0; b < BG_EMB_LISTS; b++)
        off[b + 1] = off[b] + counts[b];
}
__global__ void bg__k_emb_lists(int *list, const int *off, const int32_t *tokens, int rows)
{
    int b = blockIdx.x, lane = threadIdx.x, at = off[b];
    for (int r0 = 0; r0 < rows; r0 += 32) {
        int r = r0 + lane, f = r < rows && bg__emb_list(tokens[r]) == b;
        float x = (float)f; /* inclusive prefix count over the lanes */
        for (int o = 1; o < 32; o <<= 1) {
            float y = __shfl_sync(BG_CU_FULL, x, lane >= o ? lane - o : 0);
            if (lane >= o)
                x += y;
        }
        int total = (int)__shfl_sync(BG_CU_FULL, x, 31);
        if (f)
            list[at + (int)x - 1] = r;
        at += total;
    }
}
__global__ void bg__k_emb_bwd_lists(float *dwte, const float *dout, const int32_t *tokens, const int *list,
                                    const int *off, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c >= C)
        return;
    for (int k = off[b]; k < off[b + 1]; k++) {
        int r = list[k];
        dwte[(size_t)tokens[r] * C + c] += dout[(size_t)r * C + c];
    }
}

/* dwte through the row lists when the scratch holds them (else the
 * bucket-per-thread kernel above) */
static void bg__emb_bwd_wte(bg_backend_t *be, float *dwte, const float *dout, const int32_t *tokens, int rows, int C)
{
    size_t cap = 0;
    int *sc = (int *)bg__cu_colsum_scratch(be, &cap), *counts = sc, *off = sc + BG_EMB_LISTS;
    int *list = off + BG_EMB_LISTS + 1;
    if (!sc || (size_t)rows + 2 * BG_EMB_LISTS + 1 > 2 * cap || rows >= 1 << 24) {
        dim3 grid((C + BG_CUDA_THREADS - 1) / BG_CUDA_THREADS, BG_EMB_BUCKETS);
        BG_CU_LAUNCH(bg__k_emb_bwd_wte, grid, BG_CUDA_THREADS, 0, BG_CU_STREAM(be), dwte, dout, tokens, rows, C);
        BG_CU_LAUNCHED(be, "bg__k_emb_bwd_wte");
        return;
    }
    BG_CU_LAUNCH(bg__k_emb_count, BG_EMB_LISTS, 32, 0, BG_CU_STREAM(be), counts, tokens, rows);
    BG_CU_LAUNCHED(be, "bg__k_emb_count");
    BG_CU_LAUNCH(bg__k_emb_offsets, 1, 32, 0, BG_CU_STREAM(be), off, (const int *)counts);
    BG_CU_LAUNCHED(be, "bg__k_emb_offsets");
    BG_CU_LAUNCH(bg__k_emb_lists, BG_EMB_LISTS, 32, 0, BG_CU_STREAM(be), list, (const int *)off, tokens, rows);
    BG_CU_LAUNCHED(be, "bg__k_emb_lists");
    dim3 grid((C + BG_CUDA_THREADS - 1) / BG_CUDA_THREADS, BG_EMB_LISTS);
    BG_CU_LAUNCH(bg__k_emb_bwd_lists, grid, BG_CUDA_THREADS, 0, BG_CU_STREAM(be), dwte, dout, tokens,
                 (const int *)list, (const int *)off, C);
    BG_CU_LAUNCHED(be, "bg__k_emb_bwd_lists");
}

/* dwpe: thread per (t, c), batch rows in order */
__global__ void bg__k_emb_bwd_wpe(float *dwpe, const float *dout, int B, int T, int C)
{
    BG_CU_FOR(i, (size_t)T * C)
    {
        float s = dwpe[i];
        for (int b = 0; b < B; b++)
            s += dout[(size_t)b * T * C + i];
        dwpe[i] = s;
    }
}

void bg__cu_embedding_forward(bg_backend_t *be, float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    BG_CU_LAUNCH1(bg__k_emb_fwd, n, out, tokens, wte, wpe, T, C, n);
}

void bg__cu_embedding_backward(bg_backend_t *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return;
    if (dwte)
        bg__emb_bwd_wte(be, dwte, dout, tokens, B * T, C);
    if (dwpe) {
        size_t n = (size_t)T * C;
        BG_CU_LAUNCH1(bg__k_emb_bwd_wpe, n, dwpe, dout, B, T, C);
    }
}

/* --------------------------------------------------- attention layouts */

/* element i of (B,NH,T,hs) <-> its place in a (B,T,width) row-major buffer at
 * column offset col0 + h*hs */
__device__ __forceinline__ size_t bg__head_to_row(size_t i, int T, int NH, int hs, int width, int col0)
{
    int d = (int)(i % hs);
    size_t r = i / hs;
    int t = (int)(r % T);
    r /= T;
    int h = (int)(r % NH);
    size_t b = r / NH;
    return (b * T + t) * (size_t)width + col0 + h * hs + d;
}

__global__ void bg__k_qkv_split(float *q, float *k, float *v, const float *qkv, int T, int NH, int hs, size_t n)
{
    int C = NH * hs;
    BG_CU_FOR(i, n)
    {
        size_t s = bg__head_to_row(i, T, NH, hs, 3 * C, 0);
        q[i] = qkv[s];
        k[i] = qkv[s + C];
        v[i] = qkv[s + 2 * C];
    }
}
__global__ void bg__k_qkv_merge(float *dqkv, const float *dq, const float *dk, const float *dv, int T, int NH, int hs,
                                size_t n)
{
    int C = NH * hs;
    BG_CU_FOR(i, n)
    {
        size_t s = bg__head_to_row(i, T, NH, hs, 3 * C, 0);
        dqkv[s] = dq[i];
        dqkv[s + C] = dk[i];
        dqkv[s + 2 * C] = dv[i];
    }
}
/* dir 0: heads -> rows (heads_merge); 1: rows -> heads (heads_split) */
__global__ void bg__k_heads(float *dst, const float *src, int T, int NH, int hs, size_t n, int dir)
{
    BG_CU_FOR(i, n)
    {
        size_t s = bg__head_to_row(i, T, NH, hs, NH * hs, 0);
        if (dir == 0)
            dst[s] = src[i];
        else
            dst[i] = src[s];
    }
}

void bg__cu_qkv_split(bg_backend_t *be, float *q, float *k, float *v, const float *qkv, int B, int T, int NH, int hs)
{
    size_t n = (size_t)B * NH * T * hs;
    BG_CU_LAUNCH1(bg__k_qkv_split, n, q, k, v, qkv, T, NH, hs, n);
}
void bg__cu_qkv_merge(bg_backend_t *be, float *dqkv, const float *dq, const float *dk, const float *dv, int B, int T,
                      int NH, int hs)
{
    size_t n = (size_t)B * NH * T * hs;
    BG_CU_LAUNCH1(bg__k_qkv_merge, n, dqkv, dq, dk, dv, T, NH, hs, n);
}
void bg__cu_heads_merge(bg_backend_t *be, float *out, const float *y, int B, int T, int NH, int hs)
{
    size_t n = (size_t)B * NH * T * hs;
    BG_CU_LAUNCH1(bg__k_heads, n, out, y, T, NH, hs, n, 0);
}
void bg__cu_heads_split(bg_backend_t *be, float *dy, const float *dout, int B, int T, int NH, int hs)
{
    size_t n = (size_t)B * NH * T * hs;
    BG_CU_LAUNCH1(bg__k_heads, n, dy, dout, T, NH, hs, n, 1);
}

/* ------------------------------------------------------------- attention */

#define BG_ATT_W 8   /* warps (rows) per block */
#define BG_ATT_BK 32 /* keys (or queries) per shared tile: one per lane */
#define BG_ATT_MAX_HS BG_CUDA_ATT_MAX_HS

/* dst[j*(hs+1) + d] = src row j0+j (rows ld apart), 0 past T: one tile, all threads */
__device__ void bg__att_load_tile(float *dst, const float *src, size_t ld, int j0, int T, int hs)
{
    for (int idx = threadIdx.x; idx < BG_ATT_BK * hs; idx += blockDim.x) {
        int j = idx / hs, d = idx % hs;
        dst[j * (hs + 1) + d] = j0 + j < T ? src[(size_t)(j0 + j) * ld + d] : 0.0f;
    }
}

/* the key and value tiles of keys j0.., between two block barriers */
__device__ void bg__att_load_kv(float *Ks, float *Vs, const float *k, const float *v, size_t ld, int j0, int T, int hs)
{
    __syncthreads();
    bg__att_load_tile(Ks, k, ld, j0, T, hs);
    bg__att_load_tile(Vs, v, ld, j0, T, hs);
    __syncthreads();
}

__device__ __forceinline__ float bg__att_dot(const float *a, const float *b, int hs)
{
    float s = 0.0f;
    for (int d = 0; d < hs; d++)
        s += a[d] * b[d];
    return s;
}

/* acc[r] (dims lane + 32 r) += sum over lanes jj in [lo, hi) of w_jj * tile row
 * jj (rows hs + 1 apart): w is one value per lane, broadcast by shuffles */
template <int R>
__device__ __forceinline__ void bg__att_accumulate(float *acc, float w, const float *tile, int lo, int hi, int hs,
                                                   int lane)
{
    for (int jj = lo; jj < hi; jj++) {
        float wj = __shfl_sync(BG_CU_FULL, w, jj);
        const float *row = tile + jj * (hs + 1);
#pragma unroll
        for (int r = 0; r < R; r++) {
            int d = lane + 32 * r;
            if (d < hs)
                acc[r] += wj * row[d];
        }
    }
}

/* dst[lane + 32 r] = acc[r] * mul */
template <int R> __device__ __forceinline__ void bg__att_store(float *dst, const float *acc, float mul, int hs, int lane)
{
#pragma unroll
    for (int r = 0; r < R; r++) {
        int d = lane + 32 * r;
        if (d < hs)
            dst[d] = acc[r] * mul;
    }
}

/* Forward: block (bh, query tile of BG_ATT_W rows); warp w owns row i; lane
 * j scores key j0+j; lane owns output dims lane + 32 r. */
template <int R>
__global__ void bg__k_att_fwd(float *out, float *lse, const float *qkv, int T, int NH, int hs, float scale)
{
    BG_CU_DYN_SMEM(sm);
    float *Ks = sm, *Vs = Ks + BG_ATT_BK * (hs + 1), *Qs = Vs + BG_ATT_BK * (hs + 1);
    int C = NH * hs, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    size_t ld = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int i = blockIdx.y * BG_ATT_W + w, last = min(T - 1, (int)blockIdx.y * BG_ATT_W + BG_ATT_W - 1);
    float *qw = Qs + w * hs;
    for (int d = lane; d < hs; d += 32)
        qw[d] = i < T ? q[(size_t)i * ld + d] : 0.0f;
    float m = -INFINITY, l = 0.0f, acc[R] = {};
    for (int j0 = 0; j0 <= last; j0 += BG_ATT_BK) {
        bg__att_load_kv(Ks, Vs, k, v, ld, j0, T, hs);
        if (i >= T || j0 > i)
            continue;
        int nv = min(BG_ATT_BK, i - j0 + 1);
        float s = lane < nv ? scale * bg__att_dot(qw, Ks + lane * (hs + 1), hs) : -INFINITY;
        float mnew = fmaxf(m, bg__warp_max(s));
        float p = lane < nv ? expf(s - mnew) : 0.0f;
        float corr = expf(m - mnew); /* 0 on the first tile */
        l = l * corr + bg__warp_sum(p);
        m = mnew;
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[r] *= corr;
        bg__att_accumulate<R>(acc, p, Vs, 0, nv, hs, lane);
    }
    if (i >= T)
        return;
    bg__att_store<R>(out + ((size_t)b * T + i) * C + (size_t)h * hs, acc, 1.0f / l, hs, lane);
    if (lane == 0)
        lse[(size_t)bh * T + i] = m + logf(l);
}

/* Backward, dQ: warp per query row i; D_i = rowsum(dO o O) is written to dvec
 * for the dK/dV kernel. dQ_i = scale sum_j P_ij (dP_ij - D_i) K_j over the
 * key tiles in order. */
template <int R>
__global__ void bg__k_att_bwd_dq(float *dqkv, float *dvec, const float *dout, const float *qkv, const float *out,
                                 const float *lse, int T, int NH, int hs, float scale)
{
    BG_CU_DYN_SMEM(sm);
    float *Ks = sm, *Vs = Ks + BG_ATT_BK * (hs + 1), *Qs = Vs + BG_ATT_BK * (hs + 1), *Ds = Qs + BG_ATT_W * hs;
    int C = NH * hs, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    size_t ld = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    const float *dob = dout + (size_t)b * T * C + (size_t)h * hs, *ob = out + (size_t)b * T * C + (size_t)h * hs;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int i = blockIdx.y * BG_ATT_W + w, last = min(T - 1, (int)blockIdx.y * BG_ATT_W + BG_ATT_W - 1);
    float *qw = Qs + w * hs, *dow = Ds + w * hs;
    float dd = 0.0f;
    for (int d = lane; d < hs; d += 32) {
        qw[d] = i < T ? q[(size_t)i * ld + d] : 0.0f;
        float g = i < T ? dob[(size_t)i * C + d] : 0.0f;
        dow[d] = g;
        dd += i < T ? g * ob[(size_t)i * C + d] : 0.0f;
    }
    float Di = bg__warp_sum(dd), li = i < T ? lse[(size_t)bh * T + i] : 0.0f;
    if (i < T && lane == 0)
        dvec[(size_t)bh * T + i] = Di;
    float acc[R] = {};
    for (int j0 = 0; j0 <= last; j0 += BG_ATT_BK) {
        bg__att_load_kv(Ks, Vs, k, v, ld, j0, T, hs);
        if (i >= T || j0 > i)
            continue;
        int nv = min(BG_ATT_BK, i - j0 + 1);
        float ds = 0.0f;
        if (lane < nv) {
            float p = expf(scale * bg__att_dot(qw, Ks + lane * (hs + 1), hs) - li);
            float dp = bg__att_dot(dow, Vs + lane * (hs + 1), hs);
            ds = p * (dp - Di) * scale;
        }
        bg__att_accumulate<R>(acc, ds, Ks, 0, nv, hs, lane);
    }
    if (i >= T)
        return;
    bg__att_store<R>(dqkv + ((size_t)b * T + i) * ld + (size_t)h * hs, acc, 1.0f, hs, lane);
}

/* Backward, dK and dV: warp per key row j, query tiles from the one holding
 * the block's first key to the end; lane i scores query i0+i.
 *   dV_j = sum_i P_ij dO_i,  dK_j = scale sum_i P_ij (dP_ij - D_i) Q_i. */
template <int R>
__global__ void bg__k_att_bwd_dkv(float *dqkv, const float *dvec, const float *dout, const float *qkv,
                                  const float *lse, int T, int NH, int hs, float scale)
{
    BG_CU_DYN_SMEM(sm);
    float *Qt = sm, *Dt = Qt + BG_ATT_BK * (hs + 1), *Kw = Dt + BG_ATT_BK * (hs + 1), *Vw = Kw + BG_ATT_W * hs;
    float *lt = Vw + BG_ATT_W * hs, *dt = lt + BG_ATT_BK;
    int C = NH * hs, bh = blockIdx.x, b = bh / NH, h = bh % NH;
    size_t ld = 3 * (size_t)C;
    const float *q = qkv + (size_t)b * T * ld + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    const float *dob = dout + (size_t)b * T * C + (size_t)h * hs;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int j = blockIdx.y * BG_ATT_W + w, first = blockIdx.y * BG_ATT_W;
    float *kw = Kw + w * hs, *vw = Vw + w * hs;
    for (int d = lane; d < hs; d += 32) {
        kw[d] = j < T ? k[(size_t)j * ld + d] : 0.0f;
        vw[d] = j < T ? v[(size_t)j * ld + d] : 0.0f;
    }
    float dk[R] = {}, dv[R] = {};
    for (int i0 = first / BG_ATT_BK * BG_ATT_BK; i0 < T; i0 += BG_ATT_BK) {
        __syncthreads();
        bg__att_load_tile(Qt, q, ld, i0, T, hs);
        bg__att_load_tile(Dt, dob, C, i0, T, hs);
        if (threadIdx.x < BG_ATT_BK) {
            int ii = i0 + threadIdx.x;
            lt[threadIdx.x] = ii < T ? lse[(size_t)bh * T + ii] : 0.0f;
            dt[threadIdx.x] = ii < T ? dvec[(size_t)bh * T + ii] : 0.0f;
        }
        __syncthreads();
        if (j >= T)
            continue;
        int lo = max(0, j - i0), hi = min(BG_ATT_BK, T - i0); /* visible queries: i0+lo .. i0+hi-1 */
        if (lo >= hi)
            continue;
        float p = 0.0f, ds = 0.0f;
        if (lane >= lo && lane < hi) {
            p = expf(scale * bg__att_dot(Qt + lane * (hs + 1), kw, hs) - lt[lane]);
            float dp = bg__att_dot(Dt + lane * (hs + 1), vw, hs);
            ds = p * (dp - dt[lane]) * scale;
        }
        bg__att_accumulate<R>(dv, p, Dt, lo, hi, hs, lane);
        bg__att_accumulate<R>(dk, ds, Qt, lo, hi, hs, lane);
    }
    if (j >= T)
        return;
    float *dkr = dqkv + ((size_t)b * T + j) * ld + (size_t)h * hs + C;
    bg__att_store<R>(dkr, dk, 1.0f, hs, lane);
    bg__att_store<R>(dkr + C, dv, 1.0f, hs, lane);
}

static size_t bg__att_smem_fwd(int hs) { return (2 * BG_ATT_BK * (size_t)(hs + 1) + BG_ATT_W * (size_t)hs) * 4; }
static size_t bg__att_smem_dq(int hs) { return (2 * BG_ATT_BK * (size_t)(hs + 1) + 2 * BG_ATT_W * (size_t)hs) * 4; }
static size_t bg__att_smem_dkv(int hs)
{
    return (2 * BG_ATT_BK * (size_t)(hs + 1) + 2 * BG_ATT_W * (size_t)hs + 2 * BG_ATT_BK) * 4;
}

/* launches kern with smem bytes of dynamic shared memory, raising the
 * kernel's limit above the default 48 KiB when needed */
template <typename K, typename... A>
static void bg__att_launch(bg_backend_t *be, K kern, const char *what, int T, int BH, size_t smem, A... args)
{
    if (smem > 48 * 1024)
        bg__cu_check(be, cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), what);
    dim3 grid(BH, (T + BG_ATT_W - 1) / BG_ATT_W); /* (batch, head) on x: no 65535 limit */
    BG_CU_LAUNCH(kern, grid, BG_ATT_W * 32, smem, BG_CU_STREAM(be), args...);
    BG_CU_LAUNCHED(be, what);
}

static int bg__att_r(bg_backend_t *be, int hs)
{
    if (hs <= 0 || hs > BG_ATT_MAX_HS) {
        bg__cu_check(be, cudaErrorInvalidValue, "attention (head size must be 1..256)");
        return 0;
    }
    return hs <= 32 ? 1 : hs <= 64 ? 2 : hs <= 128 ? 4 : 8;
}

/* the tensor-core kernels: their own file */
#include "kernels/cuda/cuda_attention_tc.cuh"

void bg__cu_attention_forward(bg_backend_t *be, float *out, float *lse, const float *qkv, int B, int T, int NH,
                              int hs)
{
    int R = bg__att_r(be, hs), BH = B * NH;
    if (!R || T <= 0 || BH <= 0)
        return;
    if (bg__att_tc(be, hs)) {
        bg__att_tc_forward(be, out, lse, qkv, B, T, NH, hs);
        return;
    }
    float scale = 1.0f / sqrtf((float)hs);
    size_t sm = bg__att_smem_fwd(hs);
#define BG_ATT_FWD(RR) bg__att_launch(be, bg__k_att_fwd<RR>, "attention forward", T, BH, sm, out, lse, qkv, T, NH, hs, scale)
    switch (R) {
    case 1: BG_ATT_FWD(1); break;
    case 2: BG_ATT_FWD(2); break;
    case 4: BG_ATT_FWD(4); break;
    default: BG_ATT_FWD(8); break;
    }
#undef BG_ATT_FWD
}

void bg__cu_attention_backward(bg_backend_t *be, float *dqkv, float *dvec, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int NH, int hs)
{
    int R = bg__att_r(be, hs), BH = B * NH;
    if (!R || T <= 0 || BH <= 0)
        return;
    if (bg__att_tc(be, hs)) {
        bg__att_tc_backward(be, dqkv, dvec, dout, qkv, out, lse, B, T, NH, hs);
        return;
    }
    float scale = 1.0f / sqrtf((float)hs);
    size_t s1 = bg__att_smem_dq(hs), s2 = bg__att_smem_dkv(hs);
#define BG_ATT_BWD(RR)                                                                                          \
    do {                                                                                                        \
        bg__att_launch(be, bg__k_att_bwd_dq<RR>, "attention backward (dq)", T, BH, s1, dqkv, dvec, dout, qkv,  \
                       out, lse, T, NH, hs, scale);                                                             \
        bg__att_launch(be, bg__k_att_bwd_dkv<RR>, "attention backward (dk, dv)", T, BH, s2, dqkv,              \
                       (const float *)dvec, dout, qkv, lse, T, NH, hs, scale);                                  \
    } while (0)
    switch (R) {
    case 1: BG_ATT_BWD(1); break;
    case 2: BG_ATT_BWD(2); break;
    case 4: BG_ATT_BWD(4); break;
    default: BG_ATT_BWD(8); break;
    }
#undef BG_ATT_BWD
}

/* the Llama-style kernels: their own file, sharing this one's helpers */
#include "kernels/cuda/cuda_llama.cuh"
