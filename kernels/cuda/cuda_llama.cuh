/* kernels/cuda/cuda_llama.cuh: the CUDA backend's Llama-style kernels (RMSNorm,
 * SwiGLU, rotary position embedding, grouped-query attention's layout) and
 * their launches: the op slots of the same names (include/brigade/backend.h).
 * Included at the end of cuda_kernels.cu, whose block reductions, column
 * combine and launch macros it uses, so that the same text compiles under
 * nvcc and under tests/bg_cuda_emu.h (test_conformance_emu runs it on the
 * CPU against the CPU backend). Must not be included anywhere else.
 *
 * RMSNorm's rows and its weight gradient follow LayerNorm's kernels (a block
 * per row; 32 columns per block summed over rows in double in a fixed order);
 * the rest is elementwise, each output written by one thread. No atomics. */

/* ---------------------------------------------------------------- RMSNorm */

__global__ void bg__k_rms_fwd(float *out, float *rstd, const float *in, const float *w, float eps, int C)
{
    const float *x = in + (size_t)blockIdx.x * C;
    float *o = out + (size_t)blockIdx.x * C;
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += x[c] * x[c];
    float r = 1.0f / sqrtf(bg__block_sum(s) / C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = x[c] * r * w[c];
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = r;
}

__global__ void bg__k_rms_bwd_in(float *din, const float *dout, const float *in, const float *w, const float *rstd,
                                 int C)
{
    size_t off = (size_t)blockIdx.x * C;
    const float *x = in + off, *dy = dout + off;
    float r = rstd[blockIdx.x], a = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        a += (w[c] * dy[c]) * (x[c] * r);
    float m = bg__block_sum(a) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        din[off + c] = r * (w[c] * dy[c] - x[c] * r * m);
}

__global__ void bg__k_rms_bwd_w(float *dw, double *part, const float *dout, const float *in, const float *rstd, int N,
                                int C)
{
    __shared__ double sh[BG_CUDA_THREADS];
    int c = blockIdx.x * 32 + (threadIdx.x & 31), lo, hi;
    bg__col_rows(N, &lo, &hi);
    double a = 0.0;
    if (c < C)
        for (int n = lo + (threadIdx.x >> 5); n < hi; n += BG_COL_WARPS)
            a += (double)(dout[(size_t)n * C + c] * (in[(size_t)n * C + c] * rstd[n]));
    a = bg__col_combine(a, sh);
    if (threadIdx.x < 32 && c < C)
        bg__col_out(dw, part, a, c, C);
}

void bg__cu_rmsnorm_forward(bg_backend_t *be, float *out, float *rstd, const float *in, const float *weight, float eps,
                            int N, int C)
{
    BG_CU_LAUNCH_ROWS(bg__k_rms_fwd, N, out, rstd, in, weight, eps, C);
}
void bg__cu_rmsnorm_backward_input(bg_backend_t *be, float *din, const float *dout, const float *in,
                                   const float *weight, const float *rstd, int N, int C)
{
    BG_CU_LAUNCH_ROWS(bg__k_rms_bwd_in, N, din, dout, in, weight, rstd, C);
}
void bg__cu_rmsnorm_backward_weight(bg_backend_t *be, float *dweight, const float *dout, const float *in,
                                    const float *rstd, int N, int C)
{
    if (C <= 0)
        return;
    double *part;
    int sl = bg__col_slices(be, N, C, 1, &part);
    BG_CU_LAUNCH(bg__k_rms_bwd_w, dim3(BG_COL_GRID(C), sl), BG_CUDA_THREADS, 0, BG_CU_STREAM(be), dweight, part, dout,
                 in, rstd, N, C);
    BG_CU_LAUNCHED(be, "bg__k_rms_bwd_w");
    bg__col_finish(be, dweight, part, sl, C, 0);
}

/* ----------------------------------------------------------------- SwiGLU */

__device__ __forceinline__ float bg__sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

__global__ void bg__k_swiglu_fwd(float *out, const float *in, int H, size_t n)
{
    BG_CU_FOR(i, n) {
        size_t r = i / H, j = i % H;
        float a = in[r * 2 * H + j], b = in[r * 2 * H + H + j];
        out[i] = a * bg__sigmoid(a) * b;
    }
}

__global__ void bg__k_swiglu_bwd(float *din, const float *in, const float *dout, int H, size_t n)
{
    BG_CU_FOR(i, n) {
        size_t r = i / H, j = i % H, ia = r * 2 * H + j, ib = ia + H;
        float a = in[ia], b = in[ib], s = bg__sigmoid(a), dy = dout[i];
        din[ia] = dy * b * (s + a * s * (1.0f - s));
        din[ib] = dy * a * s;
    }
}

void bg__cu_swiglu_forward(bg_backend_t *be, float *out, const float *in, int N, int H)
{
    size_t n = (size_t)N * (H > 0 ? H : 0);
    BG_CU_LAUNCH1(bg__k_swiglu_fwd, n, out, in, H, n);
}
void bg__cu_swiglu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, int N, int H)
{
    size_t n = (size_t)N * (H > 0 ? H : 0);
    BG_CU_LAUNCH1(bg__k_swiglu_bwd, n, din, in, dout, H, n);
}

/* -------------------------------------------------------------------- RoPE */

/* one thread per rotated pair (row, group, head, i) or per copied value element; the angle in double, as
 * the CPU computes it */
__global__ void bg__k_rope(float *out, const float *in, int T, int G, int R, int hs, float theta, int pos0,
                           int inverse, size_t n)
{
    int half = hs / 2;
    size_t per_row = (size_t)G * ((size_t)R * half + hs); /* work items of a row */
    BG_CU_FOR(i, n) {
        size_t row = i / per_row, k = i % per_row;
        size_t g = k / ((size_t)R * half + hs), e = k % ((size_t)R * half + hs);
        size_t base = row * (size_t)G * (R + 1) * hs + g * (size_t)(R + 1) * hs;
        if (e >= (size_t)R * half) { /* the group's value head: copied */
            size_t o = base + (size_t)R * hs + (e - (size_t)R * half);
            out[o] = in[o];
            continue;
        }
        int h = (int)(e / half), p = (int)(e % half);
        double a = (double)(pos0 + (int)(row % T)) * pow((double)theta, -2.0 * p / hs);
        float cs = (float)cos(a), sn = (float)sin(a);
        if (inverse)
            sn = -sn;
        size_t o = base + (size_t)h * hs + p;
        float x1 = in[o], x2 = in[o + half];
        out[o] = x1 * cs - x2 * sn;
        out[o + half] = x1 * sn + x2 * cs;
    }
}

void bg__cu_rope(bg_backend_t *be, float *out, const float *in, int B, int T, int G, int R, int hs, float theta,
                 int pos0, int inverse)
{
    size_t n = (size_t)B * T * G * ((size_t)R * (hs / 2) + hs);
    BG_CU_LAUNCH1(bg__k_rope, n, out, in, T, G, R, hs, theta, pos0, inverse, n);
}

/* ------------------------------------------------- grouped-query layout */

/* one thread per element of qkv (B,T,3C): which group element it copies */
__global__ void bg__k_gqa_expand(float *qkv, const float *grouped, int G, int g, int hs, size_t n)
{
    size_t C = (size_t)G * g * hs, Cg = (size_t)G * (g + 2) * hs;
    BG_CU_FOR(i, n) {
        size_t row = i / (3 * C), k = i % (3 * C), part = k / C, h = (k % C) / hs, c = k % hs, j = h / g;
        size_t src = part == 0 ? j * (g + 2) * hs + (h % g) * hs + c : j * (g + 2) * hs + (g + part - 1) * hs + c;
        qkv[i] = grouped[row * Cg + src];
    }
}

/* one thread per element of dgrouped: a query copied, a key or value the sum of its g copies in order */
__global__ void bg__k_gqa_reduce(float *dgrouped, const float *dqkv, int G, int g, int hs, size_t n)
{
    size_t C = (size_t)G * g * hs, Cg = (size_t)G * (g + 2) * hs;
    BG_CU_FOR(i, n) {
        size_t row = i / Cg, k = i % Cg, j = k / ((size_t)(g + 2) * hs), e = k % ((size_t)(g + 2) * hs);
        size_t head = e / hs, c = e % hs;
        const float *d = dqkv + row * 3 * C;
        if (head < (size_t)g) {
            dgrouped[i] = d[(j * g + head) * hs + c];
            continue;
        }
        size_t part = head - g + 1; /* 1: key, 2: value */
        float s = 0.0f;
        for (int q = 0; q < g; q++)
            s += d[part * C + (j * g + q) * hs + c];
        dgrouped[i] = s;
    }
}

void bg__cu_gqa_expand(bg_backend_t *be, float *qkv, const float *grouped, int B, int T, int G, int g, int hs)
{
    size_t n = (size_t)B * T * 3 * G * g * hs;
    BG_CU_LAUNCH1(bg__k_gqa_expand, n, qkv, grouped, G, g, hs, n);
}
void bg__cu_gqa_reduce(bg_backend_t *be, float *dgrouped, const float *dqkv, int B, int T, int G, int g, int hs)
{
    size_t n = (size_t)B * T * G * (g + 2) * hs;
    BG_CU_LAUNCH1(bg__k_gqa_reduce, n, dgrouped, dqkv, G, g, hs, n);
}
