/* tests/bg_cuda_emu.h: just enough of CUDA to run kernels/cuda/cuda_kernels.cu on
 * the CPU, compiled as C++ (tests/kernels/cuda_emu_backend.cc). A block's
 * threads are fibers on one OS thread (ucontext to start, _setjmp/_longjmp to
 * switch); __syncthreads is a barrier of the block's fibers and a warp
 * shuffle two barriers of its warp's 32 fibers around a shared slot array;
 * blocks run one after another, so static __shared__ arrays are per block.
 * Dynamic shared memory and every new launch's shared memory start as NaN
 * bytes, so a read of an unwritten element shows. A barrier some thread never
 * reaches aborts with a message (a real GPU would hang or misbehave).
 *
 * What it cannot check: timing, memory coalescing, races between blocks, the
 * device's expf/logf (glibc's here), and anything outside cuda_kernels.cu (cuBLAS,
 * the pool over cudaMalloc, streams). Include only from one C++ file. */
#ifndef BG_CUDA_EMU_H
#define BG_CUDA_EMU_H

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <functional>
#include <ucontext.h>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorUnknown = 999 };
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef void *cublasHandle_t;
typedef int cublasComputeType_t;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
template <class F> static inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static /* block-shared: blocks run one at a time */
using std::max;
using std::min;

static dim3 threadIdx, blockIdx, blockDim, gridDim;

enum { BG_EMU_MAXT = 1024, BG_EMU_STACK = 64 * 1024 };
enum { BG_EMU_NEW, BG_EMU_RUN, BG_EMU_WAIT, BG_EMU_DONE };
struct bg_emu_fiber {
    jmp_buf jb;
    ucontext_t uc;
    int state;
    const unsigned *wait_ptr; /* waits until *wait_ptr != wait_gen */
    unsigned wait_gen;
};
static bg_emu_fiber bg_emu_f[BG_EMU_MAXT];
static char *bg_emu_stacks;
static jmp_buf bg_emu_sched;
static int bg_emu_cur;
static std::function<void()> bg_emu_body; /* the launch's kernel call (no nested launches) */
static unsigned bg_emu_bar_count, bg_emu_bar_gen, bg_emu_w_count[BG_EMU_MAXT / 32], bg_emu_w_gen[BG_EMU_MAXT / 32];
static float bg_emu_w_buf[BG_EMU_MAXT / 32][32];
static char *bg_emu_smem;
static size_t bg_emu_smem_cap;

static void bg_emu_entry(void)
{
    bg_emu_body();
    bg_emu_f[bg_emu_cur].state = BG_EMU_DONE;
    _longjmp(bg_emu_sched, 1);
}

static void bg_emu_wait(const unsigned *ptr, unsigned gen)
{
    bg_emu_fiber *f = &bg_emu_f[bg_emu_cur];
    f->state = BG_EMU_WAIT;
    f->wait_ptr = ptr;
    f->wait_gen = gen;
    if (!_setjmp(f->jb))
        _longjmp(bg_emu_sched, 1);
}

static void __syncthreads(void)
{
    unsigned gen = bg_emu_bar_gen;
    if (++bg_emu_bar_count == blockDim.x) {
        bg_emu_bar_count = 0;
        bg_emu_bar_gen++;
    } else {
        bg_emu_wait(&bg_emu_bar_gen, gen);
    }
}

static void bg_emu_warp_barrier(void)
{
    unsigned w = threadIdx.x / 32, gen = bg_emu_w_gen[w];
    if (++bg_emu_w_count[w] == 32) {
        bg_emu_w_count[w] = 0;
        bg_emu_w_gen[w]++;
    } else {
        bg_emu_wait(&bg_emu_w_gen[w], gen);
    }
}

static float bg_emu_shfl(float v, unsigned src)
{
    unsigned w = threadIdx.x / 32, lane = threadIdx.x % 32;
    bg_emu_w_buf[w][lane] = v;
    bg_emu_warp_barrier();
    float r = bg_emu_w_buf[w][src % 32];
    bg_emu_warp_barrier();
    return r;
}
static float __shfl_sync(unsigned mask, float v, int src) { return bg_emu_shfl(v, (unsigned)src); }
static float __shfl_xor_sync(unsigned mask, float v, int m) { return bg_emu_shfl(v, (threadIdx.x % 32) ^ (unsigned)m); }

static void __syncwarp(unsigned mask = 0xffffffffu)
{
    (void)mask;
    bg_emu_warp_barrier();
}

/* nvcuda::wmma for tf32 (m16n16k8, fp32 accumulation): every thread of the
 * warp holds the whole tile (the hardware spreads it over the lanes in an
 * order the API leaves unspecified, so kernels may only apply the same
 * operation to every element) and does the whole product; the products add
 * in k order in float. Loads and stores are warp-collective, as on the
 * device: each starts with a barrier of the warp, so no lane stores a tile
 * before every lane has loaded what it loads before that store. Operands are rounded to tf32 as __float_to_tf32 does
 * (to nearest, ties away: 10 bits of mantissa kept). */
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K> struct bg_emu_dims;
template <int M, int N, int K> struct bg_emu_dims<matrix_a, M, N, K> { enum { R = M, C = K }; };
template <int M, int N, int K> struct bg_emu_dims<matrix_b, M, N, K> { enum { R = K, C = N }; };
template <int M, int N, int K> struct bg_emu_dims<accumulator, M, N, K> { enum { R = M, C = N }; };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    enum { rows = bg_emu_dims<Use, M, N, K>::R, cols = bg_emu_dims<Use, M, N, K>::C, num_elements = rows * cols };
    float x[num_elements]; /* row-major */
};
template <class L> static inline int bg_emu_col_major(L *) { return 0; }
static inline int bg_emu_col_major(col_major *) { return 1; }
template <class Use, int M, int N, int K, class T, class L>
static void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const float *p, unsigned ldm)
{
    typedef fragment<Use, M, N, K, T, L> F;
    int cm = bg_emu_col_major((L *)0);
    bg_emu_warp_barrier();
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++)
            f.x[r * F::cols + c] = cm ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
}
template <int M, int N, int K>
static void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ldm, layout_t l)
{
    bg_emu_warp_barrier();
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            f.x[r * N + c] = l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
}
template <int M, int N, int K>
static void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm, layout_t l)
{
    bg_emu_warp_barrier();
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            (l == mem_col_major ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]) = f.x[r * N + c];
}
template <class F> static void fill_fragment(F &f, float v)
{
    for (int i = 0; i < F::num_elements; i++)
        f.x[i] = v;
}
template <int M, int N, int K, class LA, class LB>
static void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, precision::tf32, LA> &a,
                     const fragment<matrix_b, M, N, K, precision::tf32, LB> &b,
                     const fragment<accumulator, M, N, K, float> &c)
{
    float t[M * N];
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = c.x[i * N + j];
            for (int k = 0; k < K; k++)
                s += a.x[i * K + k] * b.x[k * N + j];
            t[i * N + j] = s;
        }
    memcpy(d.x, t, sizeof t);
}
static inline float __float_to_tf32(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) /* finite: round the 13 dropped bits to nearest, ties away */
        u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&v, &u, 4);
    return v;
}
} // namespace wmma
} // namespace nvcuda

/* one block: every fiber runs until it finishes or waits on a barrier not yet
 * complete; waiting fibers resume once their barrier's generation moved on */
static void bg_emu_run_block(int nt)
{
    for (int i = 0; i < nt; i++) {
        bg_emu_fiber *f = &bg_emu_f[i];
        f->state = BG_EMU_NEW;
        getcontext(&f->uc);
        f->uc.uc_stack.ss_sp = bg_emu_stacks + (size_t)i * BG_EMU_STACK;
        f->uc.uc_stack.ss_size = BG_EMU_STACK;
        f->uc.uc_link = NULL;
        makecontext(&f->uc, bg_emu_entry, 0);
    }
    bg_emu_bar_count = 0;
    memset(bg_emu_w_count, 0, sizeof(bg_emu_w_count));
    volatile int done = 0;
    while (done < nt) {
        volatile int progress = 0;
        for (volatile int i = 0; i < nt; i++) {
            bg_emu_fiber *f = &bg_emu_f[i];
            if (f->state == BG_EMU_DONE || (f->state == BG_EMU_WAIT && *f->wait_ptr == f->wait_gen))
                continue;
            progress = 1;
            bg_emu_cur = i;
            threadIdx = dim3((unsigned)i);
            int was_new = f->state == BG_EMU_NEW;
            if (!_setjmp(bg_emu_sched)) {
                f->state = BG_EMU_RUN;
                if (was_new)
                    setcontext(&f->uc);
                else
                    _longjmp(f->jb, 1);
            }
            if (bg_emu_f[i].state == BG_EMU_DONE)
                done = done + 1;
        }
        if (!progress) {
            fprintf(stderr, "cuda emulation: deadlock in block (%u, %u): a barrier some threads never reach\n",
                    blockIdx.x, blockIdx.y);
            abort();
        }
    }
    if (bg_emu_bar_count) {
        fprintf(stderr, "cuda emulation: block (%u, %u) ended with %u threads waiting at __syncthreads\n", blockIdx.x,
                blockIdx.y, bg_emu_bar_count);
        abort();
    }
}

template <class F> static void bg_emu_launch(dim3 grid, dim3 block, size_t smem, F body)
{
    if (block.x == 0 || block.x > BG_EMU_MAXT || block.x % 32 || block.y != 1 || block.z != 1 || grid.z != 1) {
        fprintf(stderr, "cuda emulation: unsupported block (%u, %u, %u)\n", block.x, block.y, block.z);
        abort();
    }
    if (!bg_emu_stacks && !(bg_emu_stacks = (char *)malloc((size_t)BG_EMU_MAXT * BG_EMU_STACK)))
        abort();
    if (smem > bg_emu_smem_cap) {
        free(bg_emu_smem);
        if (!(bg_emu_smem = (char *)malloc(smem)))
            abort();
        bg_emu_smem_cap = smem;
    }
    bg_emu_body = body;
    blockDim = block;
    gridDim = grid;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            blockIdx = dim3(bx, by);
            if (smem)
                memset(bg_emu_smem, 0xff, smem); /* NaN floats */
            bg_emu_run_block((int)block.x);
        }
}

#define BG_CU_LAUNCH(kernel, grid, block, smem, stream, ...)                                       \
    bg_emu_launch(dim3(grid), dim3(block), (smem), [&]() { kernel(__VA_ARGS__); })
#define BG_CU_DYN_SMEM(name) float *name = (float *)bg_emu_smem
#define BG_CU_STREAM(be) ((cudaStream_t)0)
/* the test program defines its own (a CUDA build links the real one too) */
#define bg__cu_check bg_emu_check
#define bg__cu_attention_tc_default bg_emu_attention_tc_default
#define bg__cu_colsum_scratch bg_emu_colsum_scratch

#endif
