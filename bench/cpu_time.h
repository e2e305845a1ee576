/* bench/cpu_time.h: what the single-threaded GEMM benchmarks share
 * (gemm_candidates.c, gemm_transpose.c): the calling thread's CPU time, which
 * leaves out the time other processes of a shared machine held the core, and
 * a comparison of doubles for qsort. Header-only: gemm_candidates.c is built
 * by its script with gcc alone. */
#ifndef BG_BENCH_CPU_TIME_H
#define BG_BENCH_CPU_TIME_H
#include <time.h>

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
