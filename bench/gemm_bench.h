/* bench/gemm_bench.h: what the single-threaded GEMM benchmarks share
 * (gemm_candidates.c, gemm_transpose.c): the GPT's GEMM shapes, the calling
 * thread's CPU time, which leaves out the time other processes of a shared
 * machine held the core, and a comparison of doubles for qsort. Header-only:
 * gemm_candidates.c is built by its script with gcc alone. */
#ifndef BG_BENCH_GEMM_BENCH_H
#define BG_BENCH_GEMM_BENCH_H
#include <time.h>

/* (rows = microbatch tokens, C = d_model); weights are (c_out, c_in):
 * forward NT (m rows, n c_out, k c_in), input gradient NN (m rows, n c_in,
 * k c_out), weight gradient TN (m c_out, n c_in, k rows, beta 1); "attn" is
 * the attention output projection (d_model x d_model). */
static const struct bench_gemm_shape {
    const char *name;
    int ta, tb, m, n, k;
    float beta;
} bench_gemm_shapes[] = {
    {"d256.qkv.F", 0, 1, 256, 768, 256, 0},    {"d256.fc.F", 0, 1, 256, 1024, 256, 0},
    {"d256.proj.F", 0, 1, 256, 256, 1024, 0},  {"d256.attn.F", 0, 1, 256, 256, 256, 0},
    {"d256.qkv.dX", 0, 0, 256, 256, 768, 0},   {"d256.fc.dX", 0, 0, 256, 256, 1024, 0},
    {"d256.qkv.dW", 1, 0, 768, 256, 256, 1},   {"d256.fc.dW", 1, 0, 1024, 256, 256, 1},
    {"d256.proj.dW", 1, 0, 256, 1024, 256, 1}, {"d256.attn.dW", 1, 0, 256, 256, 256, 1},
    {"d128.qkv.F", 0, 1, 128, 384, 128, 0},    {"d128.fc.F", 0, 1, 128, 512, 128, 0},
    {"d128.proj.F", 0, 1, 128, 128, 512, 0},   {"d128.fc.dX", 0, 0, 128, 128, 512, 0},
    {"d128.fc.dW", 1, 0, 512, 128, 128, 1},    {"d128.proj.dW", 1, 0, 128, 512, 128, 1},
    {"square.1024", 0, 0, 1024, 1024, 1024, 0},
};
#define BENCH_GEMM_SHAPES (sizeof bench_gemm_shapes / sizeof bench_gemm_shapes[0])

static inline double bench_thread_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}
#endif
