/* kernels/cuda/cuda_impl.h: what the CUDA backend's source files share: the
 * instance state, the launch helpers and the neural-network kernels of
 * cuda_kernels.cu that cuda_backend.cu puts in the table. Must not be included
 * outside kernels/cuda/. */
#ifndef BG_KERNELS_CUDA_IMPL_H
#define BG_KERNELS_CUDA_IMPL_H

#include <stdint.h>
#ifdef BG_CUDA_EMU
/* the kernels compiled as C++ for the CPU by a test, which includes its CUDA
 * emulation first: kernels/ includes nothing of tests/ */
#ifndef BG_CUDA_EMU_H
#error "BG_CUDA_EMU: include the CUDA emulation (tests/bg_cuda_emu.h) before kernels/cuda/cuda_impl.h"
#endif
#else
#include <cuda_runtime.h>
#include <cublas_v2.h>
#define BG_CU_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define BG_CU_DYN_SMEM(name) extern __shared__ float name[]
#define BG_CU_STREAM(be) bg__cu_stream(be)
#endif

#include "brigade/backend.h"
#include "kernels/cuda/cuda_pool.h"

/* pinned staging chunk of host<->device copies (two of them, alternating) */
#define BG_CUDA_STAGE_BYTES ((size_t)4 << 20)
/* blocks of the deterministic sum/sumsq reduction (a fixed grid) */
#define BG_CUDA_RED_BLOCKS 256
#define BG_CUDA_THREADS 256
/* scratch of the row reductions' slices (4 MiB: 32 slices of 8192 columns, two sums) */
#define BG_CUDA_COLSUM_DOUBLES ((size_t)1 << 19)
/* the largest attention head size the kernels take (ops.attention_max_head) */
#define BG_CUDA_ATT_MAX_HS 256

typedef struct bg_cuda_impl {
    int device;
    cudaStream_t stream;  /* the compute stream: every kernel, cuBLAS call and synchronous copy */
    cudaStream_t copy;    /* the device-to-host copy stream: to_host_async (the staging of transfers) */
    cudaStream_t copy_in; /* the host-to-device copy stream: from_host_async */
    cublasHandle_t blas;
    int gemm_math;        /* BRIGADE_CUDA_GEMM: 0 fp32 (cublasSgemm), else the compute type below */
    cublasComputeType_t gemm_compute;
    bg_pool_t pool;
    void *stage[2];       /* pinned host staging buffers */
    cudaEvent_t stage_ev[2];
    int stage_next;
    double *red;          /* device: BG_CUDA_RED_BLOCKS partial sums + the total */
    double *colsum;       /* device: BG_CUDA_COLSUM_DOUBLES, the row reductions' per-slice sums */
    double *red_host;     /* pinned: the total */
    cudaError_t first_error; /* the first error seen: sticky (bg__cu_error) */
    char error_msg[320];      /* which op, and the error's text */
    char name[256];
    size_t total_mem;
} bg_cuda_impl_t;

static inline bg_cuda_impl_t *bg__cu(bg_backend_t *be) { return (bg_cuda_impl_t *)be->impl; }
/* The backend's device made current (bg__cu_use), and the compute stream with
 * it (bg__cu_stream): every launch and runtime call of an op goes through one
 * of them, so two backends on two
 * GPUs in one process (or one thread) each launch on their own device.
 * cudaGetDevice/cudaSetDevice are thread-local and cheap. */
static inline void bg__cu_use(bg_backend_t *be)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != bg__cu(be)->device)
        (void)cudaSetDevice(bg__cu(be)->device);
}
static inline cudaStream_t bg__cu_stream(bg_backend_t *be)
{
    bg__cu_use(be);
    return bg__cu(be)->stream;
}

/* Attention on tensor cores unless BRIGADE_CUDA_ATTN says (tc | simt): yes
 * when the backend's GEMMs run on them (BRIGADE_CUDA_GEMM tf32 or bf16). */
int bg__cu_attention_tc_default(bg_backend_t *be);
/* Device scratch of the row reductions' per-slice sums (cuda_kernels.cu,
 * bias / LayerNorm / RMSNorm weight backward) and of the embedding
 * backward's row lists, *cap_p doubles; NULL: none (one slice, no lists).
 * Used by one op at a time on the compute stream. */
double *bg__cu_colsum_scratch(bg_backend_t *be, size_t *cap_p);
/* Records (and logs, the first time) a failed CUDA call or launch. */
void bg__cu_check(bg_backend_t *be, cudaError_t e, const char *what);
#define BG_CU_LAUNCHED(be, what) bg__cu_check((be), cudaGetLastError(), (what))

/* grid for n elements, grid-stride loops beyond it */
static inline unsigned bg__cu_grid(size_t n)
{
    size_t g = (n + BG_CUDA_THREADS - 1) / BG_CUDA_THREADS;
    if (g == 0)
        g = 1;
    return g > 65535u * 16u ? 65535u * 16u : (unsigned)g;
}

/* the kernels of cuda_kernels.cu */
void bg__cu_fill(bg_backend_t *be, float *x, float v, size_t n);
void bg__cu_scale(bg_backend_t *be, float *x, float a, size_t n);
void bg__cu_axpy(bg_backend_t *be, float *y, float a, const float *x, size_t n);
void bg__cu_residual_forward(bg_backend_t *be, float *out, const float *a, const float *b, size_t n);
void bg__cu_convert(bg_backend_t *be, void *dst, bg_dtype_t dt, const void *src, bg_dtype_t st, size_t n);
void bg__cu_adamw(bg_backend_t *be, float *param, const float *grad, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t);
void bg__cu_sgd_momentum(bg_backend_t *be, float *param, const float *grad, float *mom, size_t n, float lr,
                         float momentum, float weight_decay);
void bg__cu_reduce_launch(bg_backend_t *be, double *red, const float *x, size_t n, int sq);
void bg__cu_gemm_scale_c(bg_backend_t *be, float *c, int m, int n, int ldc, long long stride_c, float beta, int batch);
void bg__cu_bias_forward(bg_backend_t *be, float *out, const float *bias, int N, int C);
void bg__cu_bias_backward(bg_backend_t *be, float *dbias, const float *dout, int N, int C);
void bg__cu_gelu_forward(bg_backend_t *be, float *out, const float *in, size_t n);
void bg__cu_gelu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n);
void bg__cu_relu_forward(bg_backend_t *be, float *out, const float *in, size_t n);
void bg__cu_relu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n);
void bg__cu_layernorm_forward(bg_backend_t *be, float *out, float *mean, float *rstd, const float *in,
                              const float *weight, const float *bias, int N, int C);
void bg__cu_layernorm_backward_input(bg_backend_t *be, float *din, const float *dout, const float *in,
                                     const float *weight, const float *mean, const float *rstd, int N, int C);
void bg__cu_layernorm_backward_weight(bg_backend_t *be, float *dweight, float *dbias, const float *dout,
                                      const float *in, const float *mean, const float *rstd, int N, int C);
void bg__cu_softmax_forward(bg_backend_t *be, float *out, const float *in, int N, int C);
void bg__cu_softmax_backward(bg_backend_t *be, float *din, const float *dout, const float *out, int N, int C);
void bg__cu_causal_softmax_forward(bg_backend_t *be, float *att, const float *preatt, float scale, int BH, int T);
void bg__cu_causal_softmax_backward(bg_backend_t *be, float *dpreatt, const float *datt, const float *att,
                                    float scale, int BH, int T);
void bg__cu_crossentropy_forward(bg_backend_t *be, float *losses, float *probs, const float *logits,
                                 const int32_t *targets, int N, int V);
void bg__cu_crossentropy_backward(bg_backend_t *be, float *dlogits, const float *probs, const int32_t *targets,
                                  float dloss, int N, int V);
void bg__cu_embedding_forward(bg_backend_t *be, float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C);
void bg__cu_embedding_backward(bg_backend_t *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C);
void bg__cu_qkv_split(bg_backend_t *be, float *q, float *k, float *v, const float *qkv, int B, int T, int NH, int hs);
void bg__cu_qkv_merge(bg_backend_t *be, float *dqkv, const float *dq, const float *dk, const float *dv, int B, int T,
                      int NH, int hs);
void bg__cu_heads_merge(bg_backend_t *be, float *out, const float *y, int B, int T, int NH, int hs);
void bg__cu_heads_split(bg_backend_t *be, float *dy, const float *dout, int B, int T, int NH, int hs);
void bg__cu_rmsnorm_forward(bg_backend_t *be, float *out, float *rstd, const float *in, const float *weight, float eps,
                            int N, int C);
void bg__cu_rmsnorm_backward_input(bg_backend_t *be, float *din, const float *dout, const float *in,
                                   const float *weight, const float *rstd, int N, int C);
void bg__cu_rmsnorm_backward_weight(bg_backend_t *be, float *dweight, const float *dout, const float *in,
                                    const float *rstd, int N, int C);
void bg__cu_swiglu_forward(bg_backend_t *be, float *out, const float *in, int N, int H);
void bg__cu_swiglu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, int N, int H);
void bg__cu_rope(bg_backend_t *be, float *out, const float *in, int B, int T, int G, int R, int hs, float theta,
                 int pos0, int inverse);
void bg__cu_gqa_expand(bg_backend_t *be, float *qkv, const float *grouped, int B, int T, int G, int g, int hs);
void bg__cu_gqa_reduce(bg_backend_t *be, float *dgrouped, const float *dqkv, int B, int T, int G, int g, int hs);
void bg__cu_attention_forward(bg_backend_t *be, float *out, float *lse, const float *qkv, int B, int T, int NH,
                              int hs);
void bg__cu_attention_backward(bg_backend_t *be, float *dqkv, float *dvec, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int NH, int hs);

#endif
