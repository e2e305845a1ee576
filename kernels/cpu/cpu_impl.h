/* kernels/cpu/cpu_impl.h: what the CPU backend's source files share.
 * Owns the thread-count helper, the parallel thresholds and the per-ISA kernel
 * table's type; holds no state of its own (the backend instance carries
 * num_threads and its ISA's table). Must not be included outside kernels/cpu/. */
#ifndef BG_KERNELS_CPU_IMPL_H
#define BG_KERNELS_CPU_IMPL_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "brigade/backend.h"
#include "brigade/cpu.h"

/* Below these sizes an OpenMP region costs more than it saves. */
#define BG_CPU_PAR_ELEMS ((size_t)1 << 15) /* elementwise ops: elements */
#define BG_CPU_PAR_WORK ((size_t)1 << 14)  /* row ops: rows * cols */

/* Column block of the column-parallel reductions (bias, LayerNorm weight,
 * embedding backward). Each output column is summed serially over rows by
 * exactly one thread, so the result never depends on the thread count. */
#define BG_CPU_COL_BLOCK 64

/* Block of the sum/sumsq reductions: each block is summed serially in double,
 * then the block sums are added in block order. */
#define BG_CPU_SUM_BLOCK 4096

/* oneDNN 2.x's JIT sgemm kernels point rsp at a heap buffer while they run
 * (a oneDNN bug, github.com/oneapi-src/oneDNN/issues/4845, fixed in 3.11;
 * Debian ships 2.6): a signal handled on
 * that thread meanwhile has its frame written into the heap, which aborts the
 * process later ("corrupted size vs. prev_size": 6 SIGTERMs in 40 to a
 * one-process `brigade train` before this). A thread holds its asynchronous
 * signals while it runs oneDNN and gets them when oneDNN returns (a SIGTERM
 * for a stop lands one GEMM tile later). Faults (SEGV, BUS, FPE, ILL, TRAP,
 * SYS) and SIGABRT are never held. About 0.4 us per call. */
static inline void bg__cpu_hold_signals(sigset_t *old)
{
    static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    sigset_t held;
    sigfillset(&held);
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
        sigdelset(&held, faults[i]);
    pthread_sigmask(SIG_BLOCK, &held, old);
}

static inline void bg__cpu_release_signals(const sigset_t *old) { pthread_sigmask(SIG_SETMASK, old, NULL); }

/* The loaded BLAS (cpu_blas.c): NULL when it cannot be loaded (bg_blas_info
 * says why). Loads it on first use. */
const bg_blas_info_t *bg__cpu_blas(void);

/* bg_gemm_info, and per layout ([0] A B, [1] A B^T, [2] A^T B with m <= n,
 * [3] m > n) when "transpose then A B" runs (BRIGADE_GEMM_TRANSPOSE): 0
 * never, else for products with min(m, n, k) >= tr_min_p[i] (cpu_blas.c). */
bg_status_t bg__cpu_gemm_choice(bg_gemm_info_t *info_p, int tr_min_p[4]);

/* Floats per thread of the backend's "transpose then A B" scratch: 0 until that path first ran (tests). */
size_t bg__cpu_gemm_scratch_floats(const bg_backend_t *be);

/* oneDNN's dnnl_sgemm itself (cpu_blas.c; NULL when it cannot be used):
 * called from the GEMM tiles, whose OpenMP tasks are held to one thread. */
bg_dnnl_sgemm_fn bg__cpu_dnnl_sgemm(void);

/* The GEMM tile of --precision bf16 (cpu_bf16mm.c): C = alpha op(A) op(B) + beta C with op(A) and op(B)
 * rounded to bf16, products in bf16 hardware, fp32 accumulation; on the calling thread (held to one). 0 on
 * success, else nothing written. Available only where oneDNN has a bf16 hardware path (*why_p says why
 * not; *impl_p names oneDNN's implementation). */
int bg__cpu_bf16mm_available(const char **impl_p, const char **why_p);
int bg__cpu_bf16mm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                   int ldb, float beta, float *c, int ldc);

/* The stream emulation of the "cpu-async" test backend (cpu_async.c), kept
 * in the CPU backend's instance and destroyed with it. */
void bg__cpu_set_streams(bg_backend_t *be, void *streams, void (*destroy)(void *streams));
void *bg__cpu_streams(bg_backend_t *be);

static inline int bg__cpu_nt(const bg_backend_t *be) { return be->num_threads > 0 ? be->num_threads : 1; }

/* ------------------------------------------------------ per-ISA kernels
 *
 * cpu_nn.c, cpu_attention.c and cpu_llama.c are compiled once per vector ISA (kernels/
 * CMakeLists.txt: BG_ISA_ID 0 = the plain x86-64 baseline, 1 = AVX2 + FMA
 * (x86-64-v3), 2 = AVX-512 (x86-64-v4); one compile, 0, elsewhere), and each
 * compile exports its kernels as one table, bg__cpu_kernels_<isa>. A backend
 * picks a table when it is created (bg_cpu_isa: the CPU's widest ISA, capped
 * by BRIGADE_CPU_ISA) and the functions of the op table (cpu_backend.c, names
 * bg__cpu_<kernel>) call through it: the choice can be forced, unlike an
 * ifunc resolved at load time. X(name, parameters, arguments): */
#define BG_CPU_ISA_KERNELS(X)                                                                                    \
    X(bias_forward, (bg_backend_t *be, float *out, const float *bias, int N, int C), (be, out, bias, N, C))      \
    X(bias_backward, (bg_backend_t *be, float *dbias, const float *dout, int N, int C), (be, dbias, dout, N, C)) \
    X(gelu_forward, (bg_backend_t *be, float *out, const float *in, size_t n), (be, out, in, n))                 \
    X(gelu_backward, (bg_backend_t *be, float *din, const float *in, const float *dout, size_t n),               \
      (be, din, in, dout, n))                                                                                    \
    X(bias_gelu_forward, (bg_backend_t *be, float *pre, float *out, const float *bias, int N, int C),            \
      (be, pre, out, bias, N, C))                                                                                \
    X(gelu_bias_backward, (bg_backend_t *be, float *din, float *dbias, const float *pre, const float *dout,      \
      int N, int C), (be, din, dbias, pre, dout, N, C))                                                          \
    X(relu_forward, (bg_backend_t *be, float *out, const float *in, size_t n), (be, out, in, n))                 \
    X(relu_backward, (bg_backend_t *be, float *din, const float *in, const float *dout, size_t n),               \
      (be, din, in, dout, n))                                                                                    \
    X(layernorm_forward, (bg_backend_t *be, float *out, float *mean, float *rstd, const float *in,               \
      const float *weight, const float *bias, int N, int C), (be, out, mean, rstd, in, weight, bias, N, C))      \
    X(layernorm_backward_input, (bg_backend_t *be, float *din, const float *dout, const float *in,               \
      const float *weight, const float *mean, const float *rstd, int N, int C),                                  \
      (be, din, dout, in, weight, mean, rstd, N, C))                                                             \
    X(layernorm_backward_weight, (bg_backend_t *be, float *dweight, float *dbias, const float *dout,             \
      const float *in, const float *mean, const float *rstd, int N, int C),                                      \
      (be, dweight, dbias, dout, in, mean, rstd, N, C))                                                          \
    X(softmax_forward, (bg_backend_t *be, float *out, const float *in, int N, int C), (be, out, in, N, C))       \
    X(softmax_backward, (bg_backend_t *be, float *din, const float *dout, const float *out, int N, int C),       \
      (be, din, dout, out, N, C))                                                                                \
    X(causal_softmax_forward, (bg_backend_t *be, float *att, const float *preatt, float scale, int BH, int T),   \
      (be, att, preatt, scale, BH, T))                                                                           \
    X(causal_softmax_backward, (bg_backend_t *be, float *dpreatt, const float *datt, const float *att,           \
      float scale, int BH, int T), (be, dpreatt, datt, att, scale, BH, T))                                       \
    X(crossentropy_forward, (bg_backend_t *be, float *losses, float *probs, const float *logits,                 \
      const int32_t *targets, int N, int V), (be, losses, probs, logits, targets, N, V))                         \
    X(crossentropy_backward, (bg_backend_t *be, float *dlogits, const float *probs, const int32_t *targets,      \
      float dloss, int N, int V), (be, dlogits, probs, targets, dloss, N, V))                                    \
    X(embedding_forward, (bg_backend_t *be, float *out, const int32_t *tokens, const float *wte,                 \
      const float *wpe, int B, int T, int C), (be, out, tokens, wte, wpe, B, T, C))                              \
    X(embedding_backward, (bg_backend_t *be, float *dwte, float *dwpe, const float *dout, const int32_t *tokens, \
      int B, int T, int C), (be, dwte, dwpe, dout, tokens, B, T, C))                                             \
    X(qkv_split, (bg_backend_t *be, float *q, float *k, float *v, const float *qkv, int B, int T, int NH,        \
      int hs), (be, q, k, v, qkv, B, T, NH, hs))                                                                 \
    X(qkv_merge, (bg_backend_t *be, float *dqkv, const float *dq, const float *dk, const float *dv, int B,       \
      int T, int NH, int hs), (be, dqkv, dq, dk, dv, B, T, NH, hs))                                              \
    X(heads_merge, (bg_backend_t *be, float *out, const float *y, int B, int T, int NH, int hs),                 \
      (be, out, y, B, T, NH, hs))                                                                                \
    X(heads_split, (bg_backend_t *be, float *dy, const float *dout, int B, int T, int NH, int hs),               \
      (be, dy, dout, B, T, NH, hs))                                                                              \
    X(attention_forward, (bg_backend_t *be, float *out, float *lse, const float *qkv, int B, int T, int NH,      \
      int hs), (be, out, lse, qkv, B, T, NH, hs))                                                                \
    X(attention_backward, (bg_backend_t *be, float *dqkv, float *dvec, const float *dout, const float *qkv,      \
      const float *out, const float *lse, int B, int T, int NH, int hs),                                         \
      (be, dqkv, dvec, dout, qkv, out, lse, B, T, NH, hs))                                                      \
    X(rmsnorm_forward, (bg_backend_t *be, float *out, float *rstd, const float *in, const float *weight,         \
      float eps, int N, int C), (be, out, rstd, in, weight, eps, N, C))                                          \
    X(rmsnorm_backward_input, (bg_backend_t *be, float *din, const float *dout, const float *in,                 \
      const float *weight, const float *rstd, int N, int C), (be, din, dout, in, weight, rstd, N, C))            \
    X(rmsnorm_backward_weight, (bg_backend_t *be, float *dweight, const float *dout, const float *in,            \
      const float *rstd, int N, int C), (be, dweight, dout, in, rstd, N, C))                                     \
    X(swiglu_forward, (bg_backend_t *be, float *out, const float *in, int N, int H), (be, out, in, N, H))        \
    X(swiglu_backward, (bg_backend_t *be, float *din, const float *in, const float *dout, int N, int H),         \
      (be, din, in, dout, N, H))                                                                                 \
    X(rope, (bg_backend_t *be, float *out, const float *in, int B, int T, int G, int R, int hs, float theta,     \
      int pos0, int inverse), (be, out, in, B, T, G, R, hs, theta, pos0, inverse))                               \
    X(gqa_expand, (bg_backend_t *be, float *qkv, const float *grouped, int B, int T, int G, int g, int hs),      \
      (be, qkv, grouped, B, T, G, g, hs))                                                                        \
    X(gqa_reduce, (bg_backend_t *be, float *dgrouped, const float *dqkv, int B, int T, int G, int g, int hs),    \
      (be, dgrouped, dqkv, B, T, G, g, hs))                                                                     \
    X(attention_block_forward, (bg_backend_t *be, float *out, float *lse, const float *qkv_q,                    \
      const float *qkv_k, const int *qpos, const int *kpos, int acc, int B, int T, int NH, int hs),               \
      (be, out, lse, qkv_q, qkv_k, qpos, kpos, acc, B, T, NH, hs))                                               \
    X(attention_block_backward, (bg_backend_t *be, float *dqkv_q, float *dqkv_k, float *dvec, const float *dout, \
      const float *qkv_q, const float *qkv_k, const float *out, const float *lse, const int *qpos,               \
      const int *kpos, int B, int T, int NH, int hs),                                                            \
      (be, dqkv_q, dqkv_k, dvec, dout, qkv_q, qkv_k, out, lse, qpos, kpos, B, T, NH, hs))                      \
    X(gqa_attention_forward, (bg_backend_t *be, float *out, float *lse, const float *grouped, int B, int T,      \
      int G, int g, int hs), (be, out, lse, grouped, B, T, G, g, hs))                                            \
    X(gqa_attention_backward, (bg_backend_t *be, float *dgrouped, float *dvec, const float *dout,                \
      const float *grouped, const float *out, const float *lse, int B, int T, int G, int g, int hs),             \
      (be, dgrouped, dvec, dout, grouped, out, lse, B, T, G, g, hs))

typedef struct bg__cpu_kernels {
#define BG__CPU_KFIELD(name, params, args) void(*name) params;
    BG_CPU_ISA_KERNELS(BG__CPU_KFIELD)
#undef BG__CPU_KFIELD
    /* one block of the sum/sumsq reductions: the sum (of squares when sq) in double over cpu_vec.h's lanes */
    double (*reduce_block)(const float *x, size_t n, int sq);
    /* dst (cols, rows; rows ldd apart) = src (rows, cols; rows lds apart) transposed: the GEMM's
     * "transpose then A B" operands (cpu_backend.c); a copy, so exact on every ISA */
    void (*transpose)(float *dst, size_t ldd, const float *src, size_t lds, int rows, int cols);
    /* the ISA this compile's instructions need, from the compiler's own macros (bg_cpu_isa_name's names):
     * the backend checks it against the ISA it asked for */
    const char *isa;
} bg__cpu_kernels_t;

extern const bg__cpu_kernels_t bg__cpu_kernels_base;
#ifdef BG_CPU_ISA_VARIANTS
extern const bg__cpu_kernels_t bg__cpu_kernels_avx2, bg__cpu_kernels_avx512;
#endif

#ifdef BG_ISA_ID
/* Inside a per-ISA compile: the names it exports carry the ISA's suffix. */
#if BG_ISA_ID == 2
#define BG_ISA_FN(name) name##_avx512
#elif BG_ISA_ID == 1
#define BG_ISA_FN(name) name##_avx2
#else
#define BG_ISA_FN(name) name##_base
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define BG_ISA_COMPILED "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define BG_ISA_COMPILED "avx2"
#else
#define BG_ISA_COMPILED "default"
#endif
/* cpu_attention.c's and cpu_llama.c's kernels, put in the table by cpu_nn.c */
void BG_ISA_FN(bg__k_attention_forward)(bg_backend_t *be, float *out, float *lse, const float *qkv, int B, int T,
                                        int NH, int hs);
void BG_ISA_FN(bg__k_attention_backward)(bg_backend_t *be, float *dqkv, float *dvec, const float *dout,
                                         const float *qkv, const float *out, const float *lse, int B, int T, int NH,
                                         int hs);
void BG_ISA_FN(bg__k_rmsnorm_forward)(bg_backend_t *be, float *out, float *rstd, const float *in,
                                      const float *weight, float eps, int N, int C);
void BG_ISA_FN(bg__k_rmsnorm_backward_input)(bg_backend_t *be, float *din, const float *dout, const float *in,
                                             const float *weight, const float *rstd, int N, int C);
void BG_ISA_FN(bg__k_rmsnorm_backward_weight)(bg_backend_t *be, float *dweight, const float *dout, const float *in,
                                              const float *rstd, int N, int C);
void BG_ISA_FN(bg__k_swiglu_forward)(bg_backend_t *be, float *out, const float *in, int N, int H);
void BG_ISA_FN(bg__k_swiglu_backward)(bg_backend_t *be, float *din, const float *in, const float *dout, int N, int H);
void BG_ISA_FN(bg__k_rope)(bg_backend_t *be, float *out, const float *in, int B, int T, int G, int R, int hs,
                           float theta, int pos0, int inverse);
void BG_ISA_FN(bg__k_gqa_expand)(bg_backend_t *be, float *qkv, const float *grouped, int B, int T, int G, int g,
                                 int hs);
void BG_ISA_FN(bg__k_gqa_reduce)(bg_backend_t *be, float *dgrouped, const float *dqkv, int B, int T, int G, int g,
                                 int hs);
void BG_ISA_FN(bg__k_attention_block_forward)(bg_backend_t *be, float *out, float *lse, const float *qkv_q,
                                              const float *qkv_k, const int *qpos, const int *kpos, int acc, int B,
                                              int T, int NH, int hs);
void BG_ISA_FN(bg__k_attention_block_backward)(bg_backend_t *be, float *dqkv_q, float *dqkv_k, float *dvec,
                                               const float *dout, const float *qkv_q, const float *qkv_k,
                                               const float *out, const float *lse, const int *qpos,
                                               const int *kpos, int B, int T, int NH, int hs);
void BG_ISA_FN(bg__k_gqa_attention_forward)(bg_backend_t *be, float *out, float *lse, const float *grouped, int B,
                                            int T, int G, int g, int hs);
void BG_ISA_FN(bg__k_gqa_attention_backward)(bg_backend_t *be, float *dgrouped, float *dvec, const float *dout,
                                             const float *grouped, const float *out, const float *lse, int B,
                                             int T, int G, int g, int hs);
#else
/* The op table's entries (cpu_backend.c): each calls the backend's ISA's kernel. */
#define BG__CPU_KDECL(name, params, args) void bg__cpu_##name params;
BG_CPU_ISA_KERNELS(BG__CPU_KDECL)
#undef BG__CPU_KDECL
#endif

#endif
