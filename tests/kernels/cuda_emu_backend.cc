/* tests/kernels/cuda_emu_backend.cc: the CUDA backend's kernels of
 * kernels/cuda/cuda_kernels.cu compiled as C++ against tests/bg_cuda_emu.h and
 * run on the CPU, behind a backend table: the CPU backend's table (host
 * memory, copies, GEMM with k > 0, which is cuBLAS on the GPU) with every slot
 * that cuda_kernels.cu implements replaced by its CUDA version. test_conformance
 * (`cuda-emu`) then checks those kernels against the CPU backend on machines
 * without a GPU. Not a backend anyone can select: tests only. */
#define BG_CUDA_EMU 1
/* every header first, so that the namespace below wraps only cuda_kernels.cu's
 * own definitions (a CUDA build links the real ones into the same program) */
#include <math.h>
#include <stdint.h>
extern "C" {
#include "brigade/core.h"
}
#include "bg_cuda_emu.h" /* before cuda_impl.h, which expects it under BG_CUDA_EMU */
#include "kernels/backend_impl.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/bf16.h"
namespace bg_emu_ns {
#include "kernels/cuda/cuda_kernels.cu"
}


static int bg__emu_errors;

void bg_emu_check(bg_backend_t *be, cudaError_t e, const char *what) /* bg__cu_check, renamed by bg_cuda_emu.h */
{
    if (e != cudaSuccess) {
        bg__emu_errors++;
        fprintf(stderr, "cuda emulation: %s failed (%d)\n", what, e);
    }
}

extern "C" int bg_test_cuda_emu_errors(void) { return bg__emu_errors; }

/* bg__cu_colsum_scratch, renamed by bg_cuda_emu.h: host memory stands for the device's */
double *bg_emu_colsum_scratch(bg_backend_t *be, size_t *cap_p)
{
    static double scratch[BG_CUDA_COLSUM_DOUBLES];
    (void)be;
    *cap_p = BG_CUDA_COLSUM_DOUBLES;
    return scratch;
}

/* bg__cu_attention_tc_default, renamed by bg_cuda_emu.h: the emulated backend
 * has no GEMM setting, so BRIGADE_CUDA_ATTN alone chooses */
int bg_emu_attention_tc_default(bg_backend_t *be)
{
    (void)be;
    return 0;
}

/* the host side of cuda_backend.cu's sum/sumsq and GEMM, minus the runtime */
static double bg__emu_reduce(bg_backend_t *be, const float *x, size_t n, int sq)
{
    static double red[BG_CUDA_RED_BLOCKS + 1];
    if (n == 0)
        return 0.0;
    bg_emu_ns::bg__cu_reduce_launch(be, red, x, n, sq);
    return red[BG_CUDA_RED_BLOCKS];
}
static double bg__emu_sum(bg_backend_t *be, const float *x, size_t n) { return bg__emu_reduce(be, x, n, 0); }
static double bg__emu_sumsq(bg_backend_t *be, const float *x, size_t n) { return bg__emu_reduce(be, x, n, 1); }

static const bg_backend_ops_t *bg__emu_cpu; /* the CPU's table: cuBLAS's stand-in */

static void bg__emu_gemm_strided_batched(bg_backend_t *be, int ta, int tb, int m, int n, int k, float alpha,
                                         const float *a, int lda, long long sa, const float *b, int ldb, long long sb,
                                         float beta, float *c, int ldc, long long sc, int batch)
{
    if (m <= 0 || n <= 0 || batch <= 0)
        return;
    if (k <= 0)
        bg_emu_ns::bg__cu_gemm_scale_c(be, c, m, n, ldc, sc, beta, batch);
    else
        bg__emu_cpu->gemm_strided_batched(be, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
}
static void bg__emu_gemm(bg_backend_t *be, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                         const float *b, int ldb, float beta, float *c, int ldc)
{
    bg__emu_gemm_strided_batched(be, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

/* the CPU backend's table with cuda_kernels.cu's kernels; its name says so */
extern "C" bg_backend_t *bg_test_cuda_emu_backend(void)
{
    static bg_backend_ops_t ops;
    bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
    p.num_threads = 1;
    bg_backend_t *be = NULL;
    if (bg_backend_create("cpu", &p, &be) != BG_OK)
        return NULL;
    bg__emu_cpu = be->ops;
    ops = *be->ops;
    ops.name = "cuda-emu";
    /* every device kernel (kernels/backend_impl.h's KERNEL list) is cuda_kernels.cu's; the host slots are the
     * CPU's but GEMM and the reductions, which are cuda_backend.cu's host side (above). The CUDA backend has no
     * fused bias + GELU: its table leaves these NULL (the layers then run the pair), and so must this one, or
     * the conformance cases would compare the CPU's fused kernels with themselves */
#define BG__EMU_SLOT(slot) ops.slot = bg_emu_ns::bg__cu_##slot;
    BG__BACKEND_KERNEL_OPS(BG__EMU_SLOT)
    BG__BACKEND_LLAMA_OPS(BG__EMU_SLOT)
#undef BG__EMU_SLOT
    ops.gemm = bg__emu_gemm; /* the CPU's GEMM for k > 0 (cuBLAS cannot run here), the CUDA kernel for k = 0 */
    ops.gemm_strided_batched = bg__emu_gemm_strided_batched;
    ops.sum = bg__emu_sum;
    ops.sumsq = bg__emu_sumsq;
    ops.bias_gelu_forward = NULL;
    ops.gelu_bias_backward = NULL;
    be->ops = &ops;
    return be;
}
