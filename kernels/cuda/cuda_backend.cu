/* kernels/cuda/cuda_backend.cu: the CUDA backend's table, its memory (the
 * caching pool of cuda_pool.c over cudaMalloc, pinned staging for host copies),
 * GEMM (cuBLAS) and the host side of sum/sumsq; every kernel and its launch
 * live in cuda_kernels.cu.
 *
 * Three streams per instance. The compute stream carries every kernel, cuBLAS
 * call and synchronous copy, so ops run in the order they are called, as on
 * the CPU; to_host, sum and sumsq wait for it; from_host returns once the
 * data are in pinned memory. Two copy streams, one per direction, carry the
 * asynchronous copies between device and pinned host memory of the staging
 * layer (to_host_async on one, from_host_async on the other, so a send's
 * copies and a receive's overlap), ordered against the compute stream by
 * events only (cudaEventRecord, cudaStreamWaitEvent): the host never waits
 * for either stream there. An event is a cudaEvent_t (timing disabled) cast
 * to bg_event_t *.
 *
 * Determinism: GEMM is cublasSgemm (exact fp32, no
 * TF32) unless BRIGADE_CUDA_GEMM asks for tf32 or bf16 tensor cores
 * (cublasGemmEx on the same fp32 buffers, fp32 accumulation); cuBLAS results
 * are run-to-run reproducible on one GPU model and cuBLAS version but not
 * bitwise equal to OpenBLAS's.
 *
 * Compiled and linked in CI; NOT yet run on a GPU (docs/kernels.md). Must not
 * print or exit; errors go through bg_error / bg_log. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "brigade/core.h"
#include "kernels/backend_impl.h"
}
#include "kernels/cuda/cuda_impl.h"

/* --------------------------------------------------------------- errors */

void bg__cu_check(bg_backend_t *be, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return;
    bg_cuda_impl_t *impl = bg__cu(be);
    if (impl->first_error == cudaSuccess) {
        impl->first_error = e;
        snprintf(impl->error_msg, sizeof(impl->error_msg), "device %d: %s failed: %s (%s)", impl->device, what,
                 cudaGetErrorString(e), cudaGetErrorName(e));
        bg_log(BG_LOG_ERROR, "kernels", "cuda backend, %s; the step fails", impl->error_msg);
    }
}

static void bg__cublas_check(bg_backend_t *be, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return;
    bg_cuda_impl_t *impl = bg__cu(be);
    if (impl->first_error == cudaSuccess) {
        impl->first_error = cudaErrorUnknown;
        snprintf(impl->error_msg, sizeof(impl->error_msg), "device %d: %s failed: %s", impl->device, what,
                 cublasGetStatusString(s));
        bg_log(BG_LOG_ERROR, "kernels", "cuda backend, %s; the step fails", impl->error_msg);
    }
}

/* The sticky error (bg_backend_status): the first failed call, launch or
 * cuBLAS status, with the op it came from. A fault that made the context
 * unusable (an illegal address, a failed launch) reaches later calls too;
 * only the first is named. */
static bg_status_t bg__cu_error(bg_backend_t *be, char *msg, size_t len)
{
    bg_cuda_impl_t *impl = bg__cu(be);
    if (impl->first_error == cudaSuccess)
        return BG_OK;
    snprintf(msg, len, "%s", impl->error_msg);
    return BG_ERR_DEVICE;
}

/* --------------------------------------------------------------- memory */

/* ctx is the backend (bg__pool_init in bg__cuda_backend_init). Out of
 * memory is not sticky and is cleared, so the pool can release its cache and
 * retry; any other failure (a fault of an earlier kernel reported here) is
 * the backend's error, not "out of memory". */
static void *bg__cu_raw_alloc(void *ctx, size_t bytes)
{
    bg_backend_t *be = (bg_backend_t *)ctx;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return NULL;
    }
    bg__cu_check(be, e, "cudaMalloc");
    return e == cudaSuccess ? p : NULL;
}

static void bg__cu_raw_free(void *ctx, void *ptr) { bg__cu_check((bg_backend_t *)ctx, cudaFree(ptr), "cudaFree"); }

static void *bg__cu_alloc(bg_backend_t *be, size_t bytes)
{
    bg__cu_use(be);
    return bg__pool_alloc(&bg__cu(be)->pool, bytes);
}

static void bg__cu_free(bg_backend_t *be, void *ptr)
{
    bg__cu_use(be);
    if (bg__pool_free(&bg__cu(be)->pool, ptr) != 0)
        bg_log(BG_LOG_ERROR, "kernels", "cuda backend: free of %p, not a block of its pool", ptr);
}

/* Bytes the device could still give this backend: free device memory plus
 * the pool's cached blocks (released and retried on a failed allocation). */
static size_t bg__cu_device_free(bg_backend_t *be)
{
    size_t fr = 0, total = 0;
    if (cudaMemGetInfo(&fr, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        fr = 0;
    }
    return fr + bg__pool_stats(&bg__cu(be)->pool).cached;
}

static void bg__cu_synchronize(bg_backend_t *be)
{
    bg__cu_check(be, cudaStreamSynchronize(bg__cu_stream(be)), "cudaStreamSynchronize");
}

/* Host copies through the two pinned chunks, taken in turn; a chunk is reused
 * once its last transfer's event completed.
 * to_host: each chunk's copy is queued, waited for and copied out of pinned
 * memory (synchronous, as the CPU's). from_host: a chunk is copied into pinned
 * memory while the previous chunk's transfer runs; returns once the last chunk
 * is queued (the caller may reuse its buffer at once). */
static void bg__cu_staged_copy(bg_backend_t *be, char *dst, const char *src, size_t bytes, int to_host)
{
    bg__cu_use(be);
    bg_cuda_impl_t *impl = bg__cu(be);
    for (size_t off = 0; off < bytes; off += BG_CUDA_STAGE_BYTES) {
        size_t len = bytes - off < BG_CUDA_STAGE_BYTES ? bytes - off : BG_CUDA_STAGE_BYTES;
        int s = impl->stage_next;
        impl->stage_next ^= 1;
        bg__cu_check(be, cudaEventSynchronize(impl->stage_ev[s]), "staging wait");
        if (to_host) {
            bg__cu_check(be, cudaMemcpyAsync(impl->stage[s], src + off, len, cudaMemcpyDeviceToHost, impl->stream),
                         "cudaMemcpyAsync D2H");
            bg__cu_check(be, cudaStreamSynchronize(impl->stream), "cudaStreamSynchronize (D2H)");
            memcpy(dst + off, impl->stage[s], len);
        } else {
            memcpy(impl->stage[s], src + off, len);
            bg__cu_check(be, cudaMemcpyAsync(dst + off, impl->stage[s], len, cudaMemcpyHostToDevice, impl->stream),
                         "cudaMemcpyAsync H2D");
            bg__cu_check(be, cudaEventRecord(impl->stage_ev[s], impl->stream), "cudaEventRecord");
        }
    }
}

/* 1 when p is page-locked host memory (host_alloc's): copied by DMA directly. */
static int bg__cu_pinned(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeHost;
}

/* Pinned host memory (the executor's staging of transfers between ranks):
 * one copy, waited for, both ways (the caller may reuse the buffer at once). */
static void bg__cu_direct_copy(bg_backend_t *be, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    bg__cu_check(be, cudaMemcpyAsync(dst, src, bytes, kind, bg__cu_stream(be)), "cudaMemcpyAsync (pinned)");
    bg__cu_check(be, cudaStreamSynchronize(bg__cu_stream(be)), "cudaStreamSynchronize (pinned copy)");
}

static void bg__cu_to_host(bg_backend_t *be, void *dst_host, const void *src, size_t bytes)
{
    if (bytes && bg__cu_pinned(dst_host))
        bg__cu_direct_copy(be, dst_host, src, bytes, cudaMemcpyDeviceToHost);
    else
        bg__cu_staged_copy(be, (char *)dst_host, (const char *)src, bytes, 1);
}

static void bg__cu_from_host(bg_backend_t *be, void *dst, const void *src_host, size_t bytes)
{
    if (bytes && bg__cu_pinned(src_host))
        bg__cu_direct_copy(be, dst, src_host, bytes, cudaMemcpyHostToDevice);
    else
        bg__cu_staged_copy(be, (char *)dst, (const char *)src_host, bytes, 0);
}

static void *bg__cu_host_alloc(bg_backend_t *be, size_t bytes)
{
    void *p = NULL;
    (void)be;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void bg__cu_host_free(bg_backend_t *be, void *ptr)
{
    if (ptr)
        bg__cu_check(be, cudaFreeHost(ptr), "cudaFreeHost");
}

/* --------------------------------------------------- streams and events */

static cudaEvent_t bg__cu_ev(bg_event_t *ev) { return (cudaEvent_t)(void *)ev; }

static bg_event_t *bg__cu_event_create(bg_backend_t *be)
{
    bg__cu_use(be);
    cudaEvent_t e = NULL;
    cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        bg__cu_check(be, err, "cudaEventCreateWithFlags");
        return NULL;
    }
    return (bg_event_t *)(void *)e;
}

/* Allowed while the event is pending: CUDA releases it once it completes. */
static void bg__cu_event_destroy(bg_backend_t *be, bg_event_t *ev)
{
    bg__cu_check(be, cudaEventDestroy(bg__cu_ev(ev)), "cudaEventDestroy");
}

static void bg__cu_event_record(bg_backend_t *be, bg_event_t *ev)
{
    bg__cu_check(be, cudaEventRecord(bg__cu_ev(ev), bg__cu_stream(be)), "cudaEventRecord (compute)");
}

/* An error counts as complete (it is logged and kept): nothing polls forever.
 * NotReady is cleared from the last error (as PyTorch's caching allocator
 * does, pytorch#18584), or the next launch's check would report it. */
static int bg__cu_event_query(bg_backend_t *be, bg_event_t *ev)
{
    cudaError_t e = cudaEventQuery(bg__cu_ev(ev));
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    bg__cu_check(be, e, "cudaEventQuery");
    return 1;
}

static void bg__cu_event_wait(bg_backend_t *be, bg_event_t *ev)
{
    bg__cu_check(be, cudaEventSynchronize(bg__cu_ev(ev)), "cudaEventSynchronize");
}

static void bg__cu_stream_wait(bg_backend_t *be, bg_event_t *ev)
{
    bg__cu_check(be, cudaStreamWaitEvent(bg__cu_stream(be), bg__cu_ev(ev), 0), "cudaStreamWaitEvent (compute)");
}

/* On the copy stream: wait for after, copy, record done. Host memory is the
 * staging layer's pinned blocks (host_alloc), so the copy is a DMA that
 * returns at once. */
static void bg__cu_copy_async(bg_backend_t *be, void *dst, const void *src, size_t bytes, bg_event_t *after,
                              bg_event_t *done, cudaMemcpyKind kind)
{
    bg__cu_use(be);
    cudaStream_t cs = kind == cudaMemcpyDeviceToHost ? bg__cu(be)->copy : bg__cu(be)->copy_in;
    if (after)
        bg__cu_check(be, cudaStreamWaitEvent(cs, bg__cu_ev(after), 0), "cudaStreamWaitEvent (copy)");
    if (bytes)
        bg__cu_check(be, cudaMemcpyAsync(dst, src, bytes, kind, cs), "cudaMemcpyAsync (copy stream)");
    if (done)
        bg__cu_check(be, cudaEventRecord(bg__cu_ev(done), cs), "cudaEventRecord (copy)");
}

static void bg__cu_to_host_async(bg_backend_t *be, void *dst_host, const void *src, size_t bytes, bg_event_t *after,
                                 bg_event_t *done)
{
    bg__cu_copy_async(be, dst_host, src, bytes, after, done, cudaMemcpyDeviceToHost);
}

static void bg__cu_from_host_async(bg_backend_t *be, void *dst, const void *src_host, size_t bytes,
                                   bg_event_t *after, bg_event_t *done)
{
    bg__cu_copy_async(be, dst, src_host, bytes, after, done, cudaMemcpyHostToDevice);
}

/* "0000:3b:00.0" (the NUMA node is in /sys/bus/pci/devices/<id>/numa_node). */
static int bg__cu_pci_bus_id(bg_backend_t *be, char *buf, size_t len)
{
    if (len < 2 || len > 1 << 16)
        return -1;
    cudaError_t e = cudaDeviceGetPCIBusId(buf, (int)len, bg__cu(be)->device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- elementwise */

static void bg__cu_copy(bg_backend_t *be, float *dst, const float *src, size_t n)
{
    if (n && dst != src)
        bg__cu_check(be, cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, bg__cu_stream(be)),
                     "cudaMemcpyAsync D2D");
}

/* ------------------------------------------------------------------ GEMM */

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS is
 * called with the operands swapped and m, n exchanged. */
static void bg__cu_gemm_strided_batched(bg_backend_t *be, int trans_a, int trans_b, int m, int n, int k, float alpha,
                                        const float *a, int lda, long long stride_a, const float *b, int ldb,
                                        long long stride_b, float beta, float *c, int ldc, long long stride_c,
                                        int batch)
{
    bg__cu_use(be);
    if (m <= 0 || n <= 0 || batch <= 0)
        return;
    if (k <= 0) {
        bg__cu_gemm_scale_c(be, c, m, n, ldc, stride_c, beta, batch);
        return;
    }
    cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    bg_cuda_impl_t *impl = bg__cu(be);
    cublasHandle_t h = impl->blas;
    if (!impl->gemm_math && batch == 1)
        bg__cublas_check(be, cublasSgemm(h, tb, ta, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc), "cublasSgemm");
    else if (!impl->gemm_math)
        bg__cublas_check(be,
                         cublasSgemmStridedBatched(h, tb, ta, n, m, k, &alpha, b, ldb, stride_b, a, lda, stride_a,
                                                   &beta, c, ldc, stride_c, batch),
                         "cublasSgemmStridedBatched");
    else if (batch == 1) /* tf32 / bf16 tensor cores on fp32 data, fp32 accumulation */
        bg__cublas_check(be,
                         cublasGemmEx(h, tb, ta, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c,
                                      CUDA_R_32F, ldc, impl->gemm_compute, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmEx");
    else
        bg__cublas_check(be,
                         cublasGemmStridedBatchedEx(h, tb, ta, n, m, k, &alpha, b, CUDA_R_32F, ldb, stride_b, a,
                                                    CUDA_R_32F, lda, stride_a, &beta, c, CUDA_R_32F, ldc, stride_c,
                                                    batch, impl->gemm_compute, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmStridedBatchedEx");
}

static void bg__cu_gemm(bg_backend_t *be, int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
                        int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    bg__cu_gemm_strided_batched(be, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

/* ------------------------------------------------------------ reductions */

static double bg__cu_reduce(bg_backend_t *be, const float *x, size_t n, int sq)
{
    bg__cu_use(be);
    bg_cuda_impl_t *impl = bg__cu(be);
    if (n == 0)
        return 0.0;
    bg__cu_reduce_launch(be, impl->red, x, n, sq);
    bg__cu_check(be, cudaMemcpyAsync(impl->red_host, impl->red + BG_CUDA_RED_BLOCKS, sizeof(double),
                                     cudaMemcpyDeviceToHost, impl->stream), "cudaMemcpyAsync (sum)");
    bg__cu_check(be, cudaStreamSynchronize(impl->stream), "cudaStreamSynchronize (sum)");
    return *impl->red_host;
}

static double bg__cu_sum(bg_backend_t *be, const float *x, size_t n) { return bg__cu_reduce(be, x, n, 0); }
static double bg__cu_sumsq(bg_backend_t *be, const float *x, size_t n) { return bg__cu_reduce(be, x, n, 1); }

/* ----------------------------------------------------------------- table */

static void bg__cu_destroy(bg_backend_t *be)
{
    bg_cuda_impl_t *impl = bg__cu(be);
    if (!impl)
        return;
    bg__cu_use(be);
    if (impl->copy)
        cudaStreamSynchronize(impl->copy);
    if (impl->copy_in)
        cudaStreamSynchronize(impl->copy_in);
    if (impl->stream)
        cudaStreamSynchronize(impl->stream);
    bg__pool_destroy(&impl->pool);
    for (int i = 0; i < 2; i++) {
        if (impl->stage[i])
            cudaFreeHost(impl->stage[i]);
        if (impl->stage_ev[i])
            cudaEventDestroy(impl->stage_ev[i]);
    }
    if (impl->red)
        cudaFree(impl->red);
    if (impl->red_host)
        cudaFreeHost(impl->red_host);
    if (impl->colsum)
        cudaFree(impl->colsum);
    if (impl->blas)
        cublasDestroy(impl->blas);
    if (impl->copy)
        cudaStreamDestroy(impl->copy);
    if (impl->copy_in)
        cudaStreamDestroy(impl->copy_in);
    if (impl->stream)
        cudaStreamDestroy(impl->stream);
    free(impl);
    be->impl = NULL;
}

/* The compute stream for NCCL (runtime/devcoll.c); bg__cu_stream makes the device current. */
static void *bg__cu_native_stream(bg_backend_t *be) { return (void *)bg__cu_stream(be); }

/* every slot is bg__cu_<slot> (kernels/backend_impl.h's lists) but the fused bias + GELU, which stays NULL
 * (the layers then run the pair) */
static bg_backend_ops_t bg__cu_make_ops(void)
{
    bg_backend_ops_t o = {}; /* C++ before C++20 has no designated initializers: BG_BACKEND_OPS_INIT's two fields */
    o.size = sizeof(bg_backend_ops_t);
    o.name = "cuda";
#define BG__CU_SLOT(slot) o.slot = bg__cu_##slot;
    BG__BACKEND_HOST_OPS(BG__CU_SLOT)
    BG__BACKEND_KERNEL_OPS(BG__CU_SLOT)
    BG__BACKEND_EVENT_OPS(BG__CU_SLOT)
    BG__BACKEND_MEMORY_OPS(BG__CU_SLOT)
    BG__BACKEND_LLAMA_OPS(BG__CU_SLOT)
    BG__BACKEND_STATUS_OPS(BG__CU_SLOT)
    BG__BACKEND_COLL_OPS(BG__CU_SLOT)
#undef BG__CU_SLOT
    o.destroy = bg__cu_destroy;
    o.device_buffers = 1;
    o.attention_max_head = BG_CUDA_ATT_MAX_HS;
    return o;
}

static const bg_backend_ops_t bg__cu_ops = bg__cu_make_ops();

#define BG_CU_INIT(call, what)                                                                             \
    do {                                                                                                   \
        cudaError_t e_ = (call);                                                                           \
        if (e_ != cudaSuccess) {                                                                           \
            bg__cu_destroy(be);                                                                            \
            return bg_error(BG_ERR_UNSUPPORTED, "cuda backend, device %d: %s failed: %s", dev, what,      \
                            cudaGetErrorString(e_));                                                       \
        }                                                                                                  \
    } while (0)

int bg__cu_attention_tc_default(bg_backend_t *be) { return bg__cu(be)->gemm_math != 0; }

double *bg__cu_colsum_scratch(bg_backend_t *be, size_t *cap_p)
{
    *cap_p = BG_CUDA_COLSUM_DOUBLES;
    return bg__cu(be)->colsum;
}

extern "C" bg_status_t bg__cuda_backend_init(bg_backend_t *be, const bg_backend_params_t *params)
{
    int dev = params ? params->device : 0, count = 0, math = 0;
    const char *env = getenv("BRIGADE_CUDA_GEMM");
    /* the training's precision chooses, unless the variable is set: bf16 storage, bf16 tensor-core GEMMs */
    const char *gm = env && *env ? env : params && params->precision == BG_BF16 ? "bf16" : bg_config_str("BRIGADE_CUDA_GEMM");
    if (!strcmp(gm, "fp32"))
        math = 0;
    else if (!strcmp(gm, "tf32"))
        math = 1;
    else if (!strcmp(gm, "bf16"))
        math = 2;
    else
        return bg_error(BG_ERR_INVALID, "BRIGADE_CUDA_GEMM must be fp32, tf32 or bf16, got \"%s\"", gm);
    const char *attn = bg_config_str("BRIGADE_CUDA_ATTN"); /* read again per call (tests switch it) */
    if (strcmp(attn, "auto") && strcmp(attn, "tc") && strcmp(attn, "simt"))
        return bg_error(BG_ERR_INVALID, "BRIGADE_CUDA_ATTN must be auto, tc or simt, got \"%s\"", attn);
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return bg_error(BG_ERR_UNSUPPORTED, "cuda backend: no CUDA device (%s)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices");
    }
    if (params && params->device_wrap && dev >= 0)
        dev %= count;
    if (dev < 0 || dev >= count)
        return bg_error(BG_ERR_INVALID, "cuda backend: device %d does not exist (%d device%s)", dev, count,
                        count == 1 ? "" : "s");
    bg_cuda_impl_t *impl = (bg_cuda_impl_t *)calloc(1, sizeof(*impl));
    BG_ALLOC_CHECK(impl, sizeof(*impl), "the CUDA backend");
    impl->device = dev;
    impl->gemm_math = math;
    impl->gemm_compute = math == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_FAST_16BF;
    be->impl = impl;
    be->ops = &bg__cu_ops;
    be->num_threads = 1;
    bg__pool_init(&impl->pool, bg__cu_raw_alloc, bg__cu_raw_free, be);
    BG_CU_INIT(cudaSetDevice(dev), "cudaSetDevice");
    cudaDeviceProp prop;
    BG_CU_INIT(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    snprintf(impl->name, sizeof(impl->name), "%s", prop.name);
    impl->total_mem = prop.totalGlobalMem;
    BG_CU_INIT(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    BG_CU_INIT(cudaStreamCreateWithFlags(&impl->copy, cudaStreamNonBlocking), "cudaStreamCreate (copy)");
    BG_CU_INIT(cudaStreamCreateWithFlags(&impl->copy_in, cudaStreamNonBlocking), "cudaStreamCreate (copy in)");
    for (int i = 0; i < 2; i++) {
        BG_CU_INIT(cudaMallocHost(&impl->stage[i], BG_CUDA_STAGE_BYTES), "cudaMallocHost (staging)");
        BG_CU_INIT(cudaEventCreateWithFlags(&impl->stage_ev[i], cudaEventDisableTiming), "cudaEventCreate");
    }
    BG_CU_INIT(cudaMalloc((void **)&impl->red, (BG_CUDA_RED_BLOCKS + 1) * sizeof(double)), "cudaMalloc (sum)");
    BG_CU_INIT(cudaMallocHost((void **)&impl->red_host, sizeof(double)), "cudaMallocHost (sum)");
    BG_CU_INIT(cudaMalloc((void **)&impl->colsum, BG_CUDA_COLSUM_DOUBLES * sizeof(double)), "cudaMalloc (row sums)");
    cublasStatus_t bs = cublasCreate(&impl->blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        impl->blas = NULL;
        bg__cu_destroy(be);
        return bg_error(BG_ERR_UNSUPPORTED, "cuda backend, device %d: cublasCreate failed: %s", dev,
                        cublasGetStatusString(bs));
    }
    bs = cublasSetStream(impl->blas, impl->stream);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        bg__cu_destroy(be);
        return bg_error(BG_ERR_UNSUPPORTED, "cuda backend, device %d: cublasSetStream failed: %s", dev,
                        cublasGetStatusString(bs));
    }
    bg_log(BG_LOG_INFO, "kernels", "cuda backend: device %d \"%s\" (sm_%d%d, %.1f GiB), GEMM %s", dev, impl->name,
           prop.major, prop.minor, (double)impl->total_mem / (1 << 30), gm);
    return BG_OK;
}
