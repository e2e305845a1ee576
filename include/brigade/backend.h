/**
 * @file backend.h
 * @brief The kernel backend interface: a table of function pointers plus a context.
 *
 * Layers call kernels only through a bg_backend_t, so the CPU backend
 * (OpenBLAS + C/OpenMP loops) and the CUDA backend (cuBLAS + CUDA kernels)
 * are interchangeable. All tensors are float32, row-major, contiguous unless
 * a leading dimension says otherwise; pointers are device pointers of the
 * backend that allocated them.
 *
 * Conventions (llm.c order): outputs first, then inputs and weights, then
 * sizes. Parameter gradients ACCUMULATE (+=); activation gradients are
 * ASSIGNED (=). Every kernel reduces in a fixed order that does not depend on
 * the number of threads, so results are bitwise reproducible.
 *
 * Memory: every byte allocated through bg_backend_alloc() is counted
 * (current and peak) per backend instance; see bg_backend_memstats().
 *
 * Ownership and threads: the caller owns an instance from bg_backend_create()
 * until bg_backend_destroy(), and every buffer it allocates until
 * bg_backend_free() (all of them before the destroy). Call an instance's
 * kernels (be->ops) from one thread at a time; bg_backend_alloc/free and
 * bg_backend_memstats may be called from any thread (the counters are
 * locked). Distinct instances are independent.
 *
 * Example:
 * @code
 *   bg_backend_t *be;
 *   if (bg_backend_create("cpu", NULL, &be) != BG_OK) { puts(bg_last_error()); }
 *   float *x = bg_backend_alloc(be, 1024 * sizeof(float), "x");
 *   be->ops->fill(be, x, 1.0f, 1024);
 *   bg_backend_free(be, x);
 *   bg_backend_destroy(be);
 * @endcode
 */
#ifndef BRIGADE_BACKEND_H
#define BRIGADE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "brigade/core.h"
#include "brigade/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bg_backend bg_backend_t; /**< a backend instance (its body is below) */

/* bg_dtype_t, bg_dtype_size() and bg_dtype_name() live in brigade/core.h (the
 * transport's collectives take them too). Tensors a backend stores are BG_F32,
 * or BG_BF16 where a layer keeps its activations in bf16
 * (bg_layer_set_precision); the kernels take no other type. */
typedef struct bg_event bg_event_t;     /**< a point of one of a backend's streams (opaque; the backend's own) */

/** Kernel table. Sizes are ints (elements) unless named n (size_t elements).
 *  A table starts with BG_BACKEND_OPS_INIT (its size and name); a table
 *  whose size is smaller than this header's struct was built against an
 *  older header and is refused when its backend is created. New slots are
 *  appended last. */
typedef struct bg_backend_ops {
    size_t size;      /**< sizeof(bg_backend_ops_t) of the header the table was built against, set by BG_BACKEND_OPS_INIT */
    const char *name; /**< "cpu", "cpu-async" (tests), "cuda" */

    void (*destroy)(bg_backend_t *be); /**< frees impl; may be NULL */

    /* ---- memory (called through bg_backend_alloc/free, which count bytes) ---- */
    void *(*alloc)(bg_backend_t *be, size_t bytes);  /**< 64-byte aligned; NULL on failure */
    void (*free)(bg_backend_t *be, void *ptr);
    void (*to_host)(bg_backend_t *be, void *dst_host, const void *src, size_t bytes);
    void (*from_host)(bg_backend_t *be, void *dst, const void *src_host, size_t bytes);
    void (*synchronize)(bg_backend_t *be); /**< wait for queued work (no-op on CPU) */

    /* ---- elementwise ---- */
    void (*fill)(bg_backend_t *be, float *x, float value, size_t n);
    void (*copy)(bg_backend_t *be, float *dst, const float *src, size_t n);
    void (*scale)(bg_backend_t *be, float *x, float alpha, size_t n);                  /**< x *= alpha */
    void (*axpy)(bg_backend_t *be, float *y, float alpha, const float *x, size_t n);   /**< y += alpha*x */
    void (*residual_forward)(bg_backend_t *be, float *out, const float *a, const float *b, size_t n); /**< out = a + b */

    /* ---- GEMM, row-major: C(m,n) = alpha * op(A)(m,k) @ op(B)(k,n) + beta * C ----
     * op(A) = A when trans_a == 0 (A is (m,k), lda >= k), A^T when 1 (A is (k,m), lda >= m). */
    void (*gemm)(bg_backend_t *be, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
    /** batch independent GEMMs; matrix i starts at a + i*stride_a (etc.). */
    void (*gemm_strided_batched)(bg_backend_t *be, int trans_a, int trans_b, int m, int n, int k,
                                 float alpha, const float *a, int lda, long long stride_a,
                                 const float *b, int ldb, long long stride_b, float beta, float *c,
                                 int ldc, long long stride_c, int batch);

    /* ---- bias ---- */
    void (*bias_forward)(bg_backend_t *be, float *out /* (N,C) */, const float *bias /* (C) */, int N, int C); /**< out[n,c] += bias[c] */
    void (*bias_backward)(bg_backend_t *be, float *dbias /* (C) */, const float *dout /* (N,C) */, int N, int C); /**< dbias += sum over n */

    /* ---- activations (tanh-approximation GELU, as GPT-2) ---- */
    void (*gelu_forward)(bg_backend_t *be, float *out, const float *in, size_t n);
    void (*gelu_backward)(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n); /**< din = gelu'(in) * dout */
    void (*relu_forward)(bg_backend_t *be, float *out, const float *in, size_t n);
    void (*relu_backward)(bg_backend_t *be, float *din, const float *in, const float *dout, size_t n);

    /* ---- LayerNorm over the last dimension C, eps = 1e-5 ---- */
    void (*layernorm_forward)(bg_backend_t *be, float *out /* (N,C) */, float *mean /* (N) */, float *rstd /* (N) */,
                              const float *in /* (N,C) */, const float *weight /* (C) */, const float *bias /* (C) */, int N, int C);
    void (*layernorm_backward_input)(bg_backend_t *be, float *din /* (N,C) */, const float *dout /* (N,C) */,
                                     const float *in, const float *weight, const float *mean, const float *rstd, int N, int C);
    void (*layernorm_backward_weight)(bg_backend_t *be, float *dweight /* (C) */, float *dbias /* (C) */,
                                      const float *dout /* (N,C) */, const float *in, const float *mean,
                                      const float *rstd, int N, int C);

    /* ---- softmax (row-wise over C) ---- */
    void (*softmax_forward)(bg_backend_t *be, float *out /* (N,C) */, const float *in /* (N,C) */, int N, int C);
    void (*softmax_backward)(bg_backend_t *be, float *din, const float *dout, const float *out, int N, int C);
    /** att[b,i,j] = softmax_j(scale * preatt[b,i,j]) over j <= i; att[b,i,j>i] = 0.
     *  Must work in place (att == preatt): attention relies on it. */
    void (*causal_softmax_forward)(bg_backend_t *be, float *att /* (BH,T,T) */, const float *preatt /* (BH,T,T) */,
                                   float scale, int BH, int T);
    /** dpreatt = d/dpreatt given datt (upper triangle of dpreatt set to 0).
     *  Must work in place (dpreatt == datt). */
    void (*causal_softmax_backward)(bg_backend_t *be, float *dpreatt, const float *datt, const float *att,
                                    float scale, int BH, int T);

    /* ---- fused softmax + cross-entropy ---- */
    /** losses[n] = -log softmax(logits[n])[targets[n]]; probs = softmax(logits). */
    void (*crossentropy_forward)(bg_backend_t *be, float *losses /* (N) */, float *probs /* (N,V) */,
                                 const float *logits /* (N,V) */, const int32_t *targets /* (N) */, int N, int V);
    /** dlogits = (probs - onehot(targets)) * dloss, assigned. */
    void (*crossentropy_backward)(bg_backend_t *be, float *dlogits /* (N,V) */, const float *probs,
                                  const int32_t *targets, float dloss, int N, int V);

    /* ---- embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (wpe may be NULL) ---- */
    void (*embedding_forward)(bg_backend_t *be, float *out /* (B,T,C) */, const int32_t *tokens /* (B,T) */,
                              const float *wte /* (V,C) */, const float *wpe /* (T,C) */, int B, int T, int C);
    /** dwte, dwpe accumulate; rows summed in (b,t) order whatever the thread count. */
    void (*embedding_backward)(bg_backend_t *be, float *dwte, float *dwpe, const float *dout /* (B,T,C) */,
                               const int32_t *tokens, int B, int T, int C);

    /* ---- attention layout changes (C = NH * hs) ---- */
    /** qkv (B,T,3C) -> q, k, v each (B,NH,T,hs) */
    void (*qkv_split)(bg_backend_t *be, float *q, float *k, float *v, const float *qkv, int B, int T, int NH, int hs);
    /** dq, dk, dv (B,NH,T,hs) -> dqkv (B,T,3C), assigned */
    void (*qkv_merge)(bg_backend_t *be, float *dqkv, const float *dq, const float *dk, const float *dv, int B, int T, int NH, int hs);
    /** y (B,NH,T,hs) -> out (B,T,C) */
    void (*heads_merge)(bg_backend_t *be, float *out, const float *y, int B, int T, int NH, int hs);
    /** dout (B,T,C) -> dy (B,NH,T,hs) */
    void (*heads_split)(bg_backend_t *be, float *dy, const float *dout, int B, int T, int NH, int hs);

    /* ---- optimizers; t is the 1-based step ---- */
    void (*adamw)(bg_backend_t *be, float *param, const float *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t);
    /** mom = momentum*mom + grad + wd*param; param -= lr*mom */
    void (*sgd_momentum)(bg_backend_t *be, float *param, const float *grad, float *mom, size_t n,
                         float lr, float momentum, float weight_decay);

    /* ---- reductions to the host (deterministic, double accumulation) ---- */
    double (*sum)(bg_backend_t *be, const float *x, size_t n);
    double (*sumsq)(bg_backend_t *be, const float *x, size_t n);

    /* ---- fused causal attention (C = NH * hs, scale = 1/sqrt(hs)); appended
     *      last so the slots above keep their offsets ---- */
    /** out (B,T,C) = softmax_causal(scale q k^T) v per head, q/k/v read from qkv
     *  (B,T,3C); lse (B,NH,T) = the log of each row's softmax denominator
     *  (scaled scores), kept for the backward. No T x T buffer. */
    void (*attention_forward)(bg_backend_t *be, float *out /* (B,T,C) */, float *lse /* (B,NH,T) */,
                              const float *qkv /* (B,T,3C) */, int B, int T, int NH, int hs);
    /** dqkv (B,T,3C) assigned from dout and the forward's qkv, out and lse;
     *  dvec (B,NH,T) is scratch. */
    void (*attention_backward)(bg_backend_t *be, float *dqkv /* (B,T,3C) */, float *dvec /* (B,NH,T) */,
                               const float *dout /* (B,T,C) */, const float *qkv /* (B,T,3C) */,
                               const float *out /* (B,T,C) */, const float *lse /* (B,NH,T) */, int B, int T,
                               int NH, int hs);

    /** Bytes the backend's memory can still give, for out-of-memory messages:
     *  CUDA, free device memory plus the backend's cached blocks; CPU, the
     *  host's free physical memory. Appended last, as the attention slots. */
    size_t (*device_free)(bg_backend_t *be);

    /* ---- transfers between ranks (appended last, as the slots above) ---- */
    /** 1: buffers are device memory that the transport cannot read; the
     *  executor stages sends, receives and reductions through host memory
     *  (runtime/staging.c). 0 (CPU): the transport reads buffers in place. */
    int device_buffers;
    /** Host memory for staging, page-locked where the backend can (CUDA:
     *  cudaMallocHost) so to_host/from_host copy it by DMA. NULL slots:
     *  aligned malloc/free. */
    void *(*host_alloc)(bg_backend_t *be, size_t bytes);
    void (*host_free)(bg_backend_t *be, void *ptr);

    /* ---- streams and events (appended last; optional, all or none) ----
     * A backend that queues work has a compute stream (every kernel above, in
     * call order) and copy streams: the copies of one direction run in the
     * order queued (the two directions may overlap: order between them only
     * through events). An event marks a point of a stream; it
     * may be recorded again at any time (waits queued on an earlier
     * recording keep that point). Host buffers of the two copies come from
     * host_alloc. Slots NULL (the CPU backend): the staging layer
     * copies with to_host/from_host, synchronously, as before. */
    /** A new event, complete until first recorded; NULL on failure. */
    bg_event_t *(*event_create)(bg_backend_t *be);
    void (*event_destroy)(bg_backend_t *be, bg_event_t *ev);
    /** ev completes once the compute stream's work queued so far has. */
    void (*event_record)(bg_backend_t *be, bg_event_t *ev);
    /** 1 when ev has completed, else 0; never blocks. */
    int (*event_query)(bg_backend_t *be, bg_event_t *ev);
    /** The host waits for ev. */
    void (*event_wait)(bg_backend_t *be, bg_event_t *ev);
    /** Work queued on the compute stream from now on runs after ev; the host
     *  does not wait. */
    void (*stream_wait)(bg_backend_t *be, bg_event_t *ev);
    /** On the copy stream, once @p after (NULL: nothing) has completed: copy
     *  bytes from the device buffer src to dst_host, then complete @p done.
     *  Returns at once; dst_host is undefined until done completes, src must
     *  not be written before. */
    void (*to_host_async)(bg_backend_t *be, void *dst_host, const void *src, size_t bytes, bg_event_t *after,
                          bg_event_t *done);
    /** As to_host_async, host to device: dst is undefined until done
     *  completes; src_host must stay unchanged until then. */
    void (*from_host_async)(bg_backend_t *be, void *dst, const void *src_host, size_t bytes, bg_event_t *after,
                            bg_event_t *done);
    /** The PCI bus id of the backend's device ("0000:3b:00.0", for the NUMA
     *  node in sysfs) into buf; 0, or -1 when there is none. NULL: no device. */
    int (*pci_bus_id)(bg_backend_t *be, char *buf, size_t len);

    /* ---- storage types (appended last, as the slots above) ---- */
    /** dst (n elements of dst_type) = src (n elements of src_type), buffers that do not overlap. fp32 to
     *  bf16 rounds to nearest, ties to even (overflow gives infinity, a NaN stays a quiet NaN of the same
     *  sign, subnormals are kept, never flushed); bf16 to fp32 is exact; the same type is a copy. Every
     *  backend gives the same bits. */
    void (*convert)(bg_backend_t *be, void *dst, bg_dtype_t dst_type, const void *src, bg_dtype_t src_type,
                    size_t n);

    /* ---- fused kernels (appended last, as the slots above; optional: NULL, the caller runs the pair) ---- */
    /** pre (N,C) += bias (C) row by row, then out (N,C) = gelu(pre): bias_forward then gelu_forward in one
     *  pass, with their bits. */
    void (*bias_gelu_forward)(bg_backend_t *be, float *pre, float *out, const float *bias, int N, int C);
    /** din (N,C) = gelu'(pre) * dout, then dbias (C) += the column sums of din: gelu_backward then
     *  bias_backward in one pass, with their bits. */
    void (*gelu_bias_backward)(bg_backend_t *be, float *din, float *dbias, const float *pre, const float *dout,
                               int N, int C);

    /* ---- Llama-style kernels (appended last, as the slots above; optional: NULL, and the layers that need
     *      them refuse the backend with a message naming the slot) ---- */
    /** rstd (N) = 1 / sqrt(mean over C of in^2 + eps), out (N,C) = in * rstd * weight (C). */
    void (*rmsnorm_forward)(bg_backend_t *be, float *out, float *rstd, const float *in, const float *weight,
                            float eps, int N, int C);
    /** din (N,C) = rstd * (w dy - xhat mean over C of (w dy xhat)), xhat = in * rstd (assigned). */
    void (*rmsnorm_backward_input)(bg_backend_t *be, float *din, const float *dout, const float *in,
                                   const float *weight, const float *rstd, int N, int C);
    /** dweight (C) += sum over rows of dout * in * rstd, rows in order. */
    void (*rmsnorm_backward_weight)(bg_backend_t *be, float *dweight, const float *dout, const float *in,
                                    const float *rstd, int N, int C);
    /** SwiGLU: in (N, 2H) = [a | b] row by row, out (N,H) = silu(a) * b. */
    void (*swiglu_forward)(bg_backend_t *be, float *out, const float *in, int N, int H);
    /** din (N, 2H) = [dout b silu'(a) | dout silu(a)] (assigned). */
    void (*swiglu_backward)(bg_backend_t *be, float *din, const float *in, const float *dout, int N, int H);
    /** Rotary position embedding (rotate-half pairs (i, i + hs/2), frequency theta^(-2i/hs)) of grouped heads:
     *  a row (b, t) of in (B,T, G (R+1) hs) is G groups of R + 1 heads of hs; the first R heads of each group
     *  are rotated by the angles of position pos0 + t, the last is copied. inverse: rotated back (the
     *  backward: the transpose). out may equal in. */
    void (*rope)(bg_backend_t *be, float *out, const float *in, int B, int T, int G, int R, int hs, float theta,
                 int pos0, int inverse);
    /** Grouped-query attention's layout: grouped (B,T, G (g+2) hs), each group g query heads, one key head,
     *  one value head, to qkv (B,T,3C), C = G g hs, the attention's packed q | k | v with every key and value
     *  head repeated for its group's g query heads. */
    void (*gqa_expand)(bg_backend_t *be, float *qkv, const float *grouped, int B, int T, int G, int g, int hs);
    /** Its transpose: dgrouped (assigned) from dqkv, each key and value head the sum of its g copies in
     *  order. */
    void (*gqa_reduce)(bg_backend_t *be, float *dgrouped, const float *dqkv, int B, int T, int G, int g, int hs);

    /* ---- errors (appended last, as the slots above) ---- */
    /** The backend's sticky error: BG_OK while every op so far succeeded, else the status of the first
     *  failure (a CUDA fault, a failed launch or cuBLAS call) with a message naming the op written into msg
     *  (len bytes, NUL-terminated). Once set it stays set: later results of the instance are undefined.
     *  NULL: the backend's ops cannot fail (the CPU). Read through bg_backend_status(). */
    bg_status_t (*error)(bg_backend_t *be, char *msg, size_t len);
    /** The largest attention head size attention_forward/backward accept; 0: any. A layer with larger
     *  heads is refused at its first forward, before any weight changes. */
    int attention_max_head;

    /* ---- collective libraries (appended last, as the slots above; optional) ---- */
    /** The compute stream as the device runtime's handle (cuda: its cudaStream_t), with the backend's device
     *  made current for the calling thread, for a collective library that queues on it (NCCL:
     *  runtime/devcoll.c). NULL: none (the CPU). */
    void *(*native_stream)(bg_backend_t *be);
    /* ---- context parallelism's ring attention (appended last, as the slots above; NULL: --cp > 1 is
     *      refused on the backend). Head sizes up to 128. ---- */
    /** Causal attention of one block of queries against one block of keys at given global positions,
     *  merged by log-sum-exp: q read from qkv_q (B,T,3C), k and v from qkv_k (B,T,3C) (another rank's
     *  block); key j is visible to query i when kpos[j] <= qpos[i] (host arrays of T, both increasing).
     *  acc 0: out (B,T,C) and lse (B,NH,T) assigned (every row must see a key); 1: this block's result
     *  merged into what they hold (lse -inf: nothing yet; a row that sees no key is left as it is). */
    void (*attention_block_forward)(bg_backend_t *be, float *out, float *lse, const float *qkv_q,
                                    const float *qkv_k, const int *qpos, const int *kpos, int acc, int B, int T,
                                    int NH, int hs);
    /** Its backward, given the merged out and lse of every block: the q part of dqkv_q (B,T,3C) and the
     *  k and v parts of dqkv_k (B,T,3C) accumulated (+=); the other parts untouched; dvec (B,NH,T) is
     *  scratch. */
    void (*attention_block_backward)(bg_backend_t *be, float *dqkv_q, float *dqkv_k, float *dvec,
                                     const float *dout, const float *qkv_q, const float *qkv_k, const float *out,
                                     const float *lse, const int *qpos, const int *kpos, int B, int T, int NH,
                                     int hs);
    /* ---- grouped-query attention on the grouped layout (appended last, as the slots above; optional:
     *      NULL, the gqa_attention layer expands the layout with gqa_expand and calls attention_forward/
     *      backward, then gqa_reduce) ---- */
    /** Causal attention of grouped (B,T, G (g+2) hs) (each group g query heads, one key head, one value
     *  head, as gqa_expand reads it) into out (B,T, G g hs) (query head h = group j's i-th at h = j g + i)
     *  and lse (B, G g, T): what gqa_expand then attention_forward give, without the expanded copy (each
     *  group's key and value heads are read once for its g query heads). */
    void (*gqa_attention_forward)(bg_backend_t *be, float *out, float *lse, const float *grouped, int B, int T,
                                  int G, int g, int hs);
    /** Its backward: dgrouped (B,T, G (g+2) hs) assigned (each key and value head's gradient summed over
     *  its g query heads in the kernel, in a fixed order); dvec (B, G g, T) is scratch. */
    void (*gqa_attention_backward)(bg_backend_t *be, float *dgrouped, float *dvec, const float *dout,
                                   const float *grouped, const float *out, const float *lse, int B, int T, int G,
                                   int g, int hs);
} bg_backend_ops_t;
/** The first two fields of a table's initializer, its size and name; the slots follow, designated:
 *  `static const bg_backend_ops_t ops = {BG_BACKEND_OPS_INIT("mine"), .alloc = mine_alloc, ...};`
 *  (C++ before C++20, which has no designated initializers: a value-initialised table with size set to
 *  sizeof(bg_backend_ops_t) by hand.) */
#define BG_BACKEND_OPS_INIT(name) sizeof(bg_backend_ops_t), (name)

/** Counted memory of one backend instance, in bytes. */
typedef struct bg_memstats {
    size_t current; /**< bytes allocated now */
    size_t peak;    /**< highest value of current since creation or the last reset */
    size_t count;   /**< live allocations */
} bg_memstats_t;

/** Parameters of bg_backend_create(); grow by appending fields (size header). */
typedef struct bg_backend_params {
    size_t size;     /**< sizeof(bg_backend_params_t), set by BG_BACKEND_PARAMS_INIT */
    int device;      /**< device ordinal (CUDA); ignored by the CPU backend */
    int num_threads; /**< compute threads; 0 = BRIGADE_NUM_THREADS or OpenMP's default */
    /** CPU: 1 sets OpenBLAS's process-wide thread count to 1 at creation and
     *  before every GEMM (the backend's own threads carry GEMM's parallelism);
     *  a process-wide side effect. 0 leaves OpenBLAS's count to the host. Either
     *  way results do not depend on num_threads; they are bitwise those of
     *  set_blas_threads = 1 when OpenBLAS runs one thread (docs/kernels.md). */
    int set_blas_threads;
    /** CPU: 1 raises glibc's mmap and trim thresholds to 1 GiB (mallopt, a
     *  process-wide side effect, never undone) so that large buffers freed and
     *  re-allocated every microbatch are reused without page faults; 0 leaves
     *  malloc alone. */
    int tune_malloc;
    /** CUDA: 1 takes device (device % the device count), so that ranks given
     *  their local rank share a machine's GPUs round-robin; 0: a device that
     *  does not exist is an error. Ignored by the CPU backend. */
    int device_wrap;
    /** The training's storage precision (--precision). CUDA: BG_BF16 runs GEMMs on tensor cores with
     *  their inputs rounded to bf16 and fp32 accumulation (BRIGADE_CUDA_GEMM, when set, wins); BG_F32,
     *  exact fp32 GEMMs. The CPU backend computes in fp32 either way. */
    bg_dtype_t precision;
    /** The most bytes bg_backend_alloc may hold at once on this instance (a device memory cap, enforced
     *  on every backend, the CPU's included, so that "larger than one device" can be shown anywhere); an
     *  allocation past it fails with BG_ERR_NO_FIT naming the buffer, the bytes asked, in use and the cap.
     *  0: no cap (only the device's own memory). */
    size_t mem_cap;
} bg_backend_params_t;
/** Defaults of bg_backend_params_t: device 0, threads from the environment, no process-wide changes, fp32, no cap. */
#define BG_BACKEND_PARAMS_INIT                                                                          \
    { .size = sizeof(bg_backend_params_t), .device = 0, .num_threads = 0, .set_blas_threads = 0,          \
      .tune_malloc = 0, .device_wrap = 0, .precision = BG_F32, .mem_cap = 0 }

/** The instance. Backends put private state behind impl. */
struct bg_backend {
    const bg_backend_ops_t *ops;
    void *impl;
    int num_threads;
    bg_memstats_t mem; /**< maintained by bg_backend_alloc/free only */
    struct bg_backend_track *track; /**< allocation records (private) */
    size_t mem_cap;    /**< bg_backend_params_t.mem_cap (0: none); set at creation */
};

/** Create the backend named @p name ("cpu", "cuda"; "cpu-async", the CPU with emulated streams, for tests). params may be NULL. */
bg_status_t bg_backend_create(const char *name, const bg_backend_params_t *params, bg_backend_t **be_p);
void bg_backend_destroy(bg_backend_t *be); /**< frees the instance and its context (NULL is a no-op) */
/** Names of the backends compiled in, NULL-terminated. */
const char *const *bg_backend_names(void);

/** Counted allocation; @p what names the buffer in the out-of-memory message. NULL on failure. */
void *bg_backend_alloc(bg_backend_t *be, size_t bytes, const char *what);
/** Free a buffer from bg_backend_alloc (NULL is a no-op). */
void bg_backend_free(bg_backend_t *be, void *ptr);
/** BG_OK while every op of @p be so far succeeded; else the backend's sticky error, with its message
 *  (which op failed, and how) set as bg_last_error(). Cheap (no synchronization): call it after a
 *  synchronize to cover the work queued before it. The executor checks it after each step's program
 *  (synchronized), at the step's end (not waiting for the optimizer's queued update) and before a
 *  checkpoint or weights are written (synchronized), so a device fault fails the step or the save
 *  instead of giving a loss read from stale memory or writing undefined weights. */
bg_status_t bg_backend_status(bg_backend_t *be);
/** Current/peak counters. */
bg_memstats_t bg_backend_memstats(const bg_backend_t *be);
/** Set peak = current (to measure the peak of one phase). */
void bg_backend_reset_peak(bg_backend_t *be);

/**
 * Causal multi-head self-attention (the backend's fused attention ops).
 * Forward: out (B,T,C) from qkv (B,T,3C). The workspace @p ws must hold
 * bg_attention_ws_floats(B,T,C,NH) floats (the per-row logsumexp, B*NH*T)
 * and is kept for backward, as are qkv and out.
 */
size_t bg_attention_ws_floats(int B, int T, int C, int NH);
void bg_attention_forward(bg_backend_t *be, float *out, float *ws, const float *qkv, int B, int T, int C, int NH);
/** Backward: dqkv (B,T,3C) assigned from dout (B,T,C), the forward's input
 *  qkv, its output out and its ws. @p scratch holds
 *  bg_attention_scratch_floats(B,T,C,NH) floats (temporary, B*NH*T). */
size_t bg_attention_scratch_floats(int B, int T, int C, int NH);
void bg_attention_backward(bg_backend_t *be, float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *out, const float *ws, int B, int T, int C, int NH);

#ifdef __cplusplus
}
#endif
#endif /* BRIGADE_BACKEND_H */
