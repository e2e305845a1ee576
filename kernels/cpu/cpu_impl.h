/* kernels/cpu/cpu_impl.h: what the CPU backend's source files share.
 * Owns the thread-count helper and the parallel thresholds; holds no state of
 * its own (the backend instance carries num_threads). Must not be included
 * outside kernels/cpu/. */
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

/* The neural-network kernels of cpu_nn.c; cpu_backend.c puts them in the table. */
void bg__cpu_bias_forward(bg_backend_t *be, float *out, const float *bias, int N, int C);
void bg__cpu_bias_backward(bg_backend_t *be, float *dbias, const float *dout, int N, int C);
void bg__cpu_gelu_forward(bg_backend_t *be, float *out, const float *in, size_t n);
void bg__cpu_gelu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n);
void bg__cpu_bias_gelu_forward(bg_backend_t *be, float *pre, float *out, const float *bias, int N, int C);
void bg__cpu_gelu_bias_backward(bg_backend_t *be, float *din, float *dbias, const float *pre, const float *dout, int N,
                                int C);
void bg__cpu_relu_forward(bg_backend_t *be, float *out, const float *in, size_t n);
void bg__cpu_relu_backward(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n);
void bg__cpu_layernorm_forward(bg_backend_t *be, float *out, float *mean, float *rstd, const float *in,
                               const float *weight, const float *bias, int N, int C);
void bg__cpu_layernorm_backward_input(bg_backend_t *be, float *din, const float *dout, const float *in,
                                      const float *weight, const float *mean, const float *rstd, int N, int C);
void bg__cpu_layernorm_backward_weight(bg_backend_t *be, float *dweight, float *dbias, const float *dout,
                                       const float *in, const float *mean, const float *rstd, int N, int C);
void bg__cpu_softmax_forward(bg_backend_t *be, float *out, const float *in, int N, int C);
void bg__cpu_softmax_backward(bg_backend_t *be, float *din, const float *dout, const float *out, int N, int C);
void bg__cpu_causal_softmax_forward(bg_backend_t *be, float *att, const float *preatt, float scale, int BH, int T);
void bg__cpu_causal_softmax_backward(bg_backend_t *be, float *dpreatt, const float *datt, const float *att,
                                     float scale, int BH, int T);
void bg__cpu_crossentropy_forward(bg_backend_t *be, float *losses, float *probs, const float *logits,
                                  const int32_t *targets, int N, int V);
void bg__cpu_crossentropy_backward(bg_backend_t *be, float *dlogits, const float *probs, const int32_t *targets,
                                   float dloss, int N, int V);
void bg__cpu_embedding_forward(bg_backend_t *be, float *out, const int32_t *tokens, const float *wte,
                               const float *wpe, int B, int T, int C);
void bg__cpu_embedding_backward(bg_backend_t *be, float *dwte, float *dwpe, const float *dout,
                                const int32_t *tokens, int B, int T, int C);
void bg__cpu_qkv_split(bg_backend_t *be, float *q, float *k, float *v, const float *qkv, int B, int T, int NH, int hs);
void bg__cpu_qkv_merge(bg_backend_t *be, float *dqkv, const float *dq, const float *dk, const float *dv, int B, int T,
                       int NH, int hs);
void bg__cpu_heads_merge(bg_backend_t *be, float *out, const float *y, int B, int T, int NH, int hs);
void bg__cpu_heads_split(bg_backend_t *be, float *dy, const float *dout, int B, int T, int NH, int hs);
void bg__cpu_attention_forward(bg_backend_t *be, float *out, float *lse, const float *qkv, int B, int T, int NH,
                               int hs);
void bg__cpu_attention_backward(bg_backend_t *be, float *dqkv, float *dvec, const float *dout, const float *qkv,
                                const float *out, const float *lse, int B, int T, int NH, int hs);

#endif
