/* tools/bench_peak.c: the machine's anchor of `brigade bench kernels`
 * (tools/bench_peak.h): the theoretical fp32 peak of one core from a measured
 * clock and FMA rate, short FMA samples, and the best one-thread sgemm of the
 * BLAS libraries brigade uses. Measures only; must not print. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "brigade/brigade.h"
#include "tools/bench_peak.h"
#include "core/util.h"

#if defined(__x86_64__)
#include <immintrin.h>
/* One clock sample: 2^20 dependent register-register adds (an add of an
 * immediate would not do: Golden Cove and later fold immediate adds at
 * rename, two per cycle). Returns GHz. */
static double bg__clock_sample(void)
{
    unsigned long long x = 0, y = 1;
    double t0 = bg_now();
    for (int i = 0; i < 1 << 14; i++)
        __asm__ volatile(".rept 64\n\taddq %1, %0\n\t.endr" : "+r"(x) : "r"(y));
    return (double)(1 << 20) / (bg_now() - t0) * 1e-9;
}

#define BG__FMA_CHAINS 12
/* The body of the FMA throughput loop at one vector type: BG__FMA_CHAINS
 * independent accumulators (more than latency x ports), timed; the sum goes
 * to *sink so the loop is not removed. */
#define BG__FMA_BODY(VT, SET1, FMADD, ADD, STORE, LANES)                                                       \
    VT acc[BG__FMA_CHAINS], m = SET1(0.9999999f), a = SET1(1e-7f);                                             \
    for (int j = 0; j < BG__FMA_CHAINS; j++)                                                                  \
        acc[j] = SET1((float)j);                                                                              \
    double t0 = bg_now();                                                                                     \
    for (long i = 0; i < iters; i++)                                                                          \
        for (int j = 0; j < BG__FMA_CHAINS; j++)                                                              \
            acc[j] = FMADD(acc[j], m, a);                                                                     \
    double t = bg_now() - t0;                                                                                 \
    float f[LANES];                                                                                           \
    for (int j = 1; j < BG__FMA_CHAINS; j++)                                                                  \
        acc[0] = ADD(acc[0], acc[j]);                                                                         \
    STORE(f, acc[0]);                                                                                         \
    *sink += f[0];                                                                                            \
    return t

__attribute__((target("avx512f"))) static double bg__fma512(long iters, float *sink)
{
    BG__FMA_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, 16);
}

__attribute__((target("avx2,fma"))) static double bg__fma256(long iters, float *sink)
{
    BG__FMA_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, 8);
}

/* Seconds of the FMA loop at the widest vector width (bits 512 or 256) */
static double bg__fma_loop(int bits, long iters, float *sink)
{
    return bits == 512 ? bg__fma512(iters, sink) : bg__fma256(iters, sink);
}

/* The FMA throughput the core gives this thread now, in GFLOP/s: the widest
 * FMA loop, 2.4 M vector FMAs (about 0.65 ms at 512 bits and 2 FMAs per cycle
 * at 2.2 GHz), 0 without FMA. Taken next to each training step, it is what
 * the core could deliver at that moment: on a shared host a neighbour on the
 * sibling hyperthread or a lower clock slows both alike, while the
 * theoretical peak does not move. */
double bg__fma_now(void)
{
    bg_cpu_info_t cpu;
    bg_cpu_info(&cpu);
    if (!cpu.avx2_fma)
        return 0;
    float sink = 0;
    const long iters = 200000;
    double t = bg__fma_loop(cpu.vector_bits, iters, &sink);
    return (double)iters * BG__FMA_CHAINS * (cpu.vector_bits / 32) * 2 / t * 1e-9 + 0.0 * sink;
}

bg__peak_t bg__machine_peak(void)
{
    bg__peak_t p = {0};
    bg_cpu_info_t cpu;
    bg_cpu_info(&cpu);
    if (!cpu.avx2_fma)
        return p; /* no FMA: not estimated */
    p.bits = cpu.vector_bits;
    /* short samples (about 0.3 ms), clock and FMA alternately, the best of
     * each: on a shared machine some samples run without preemption, and
     * both see the same (turbo) clock */
    float sink = 0;
    long iters = 50000;
    double best = 1e30;
    for (int r = 0; r < 200; r++) {
        double t = bg__fma_loop(p.bits, iters, &sink);
        best = t < best ? t : best;
        double g = bg__clock_sample();
        p.ghz = g > p.ghz ? g : p.ghz;
    }
    p.fma_per_cycle = (double)iters * BG__FMA_CHAINS / best / (p.ghz * 1e9);
    p.units = (int)(p.fma_per_cycle + 0.5);
    p.units = p.units < 1 ? 1 : p.units > 2 ? 2 : p.units; /* no x86 core has more than 2 FMA ports */
    p.peak = p.ghz * p.units * (p.bits / 32) * 2 + 0.0 * sink;
    return p;
}
#else
bg__peak_t bg__machine_peak(void)
{
    bg__peak_t p = {0};
    return p;
}
double bg__fma_now(void) { return 0; }
#endif

/* The best single-threaded sgemm of the GEMM libraries the backend uses
 * (OpenBLAS, and oneDNN when bg_gemm_info says it runs some layout): a square
 * product and the GEMM shapes of the training model below (forward, input and
 * weight gradients of a block with d_model 256 and 256 rows). The best of
 * each library goes to best_p[0] (OpenBLAS) and best_p[1] (oneDNN, 0 when
 * unused); returns the larger. */
double bg__sgemm_best_1t(int repeat, double best_p[2])
{
    static const int shapes[][5] = {{0, 0, 1024, 1024, 1024}, {0, 1, 256, 768, 256}, {0, 1, 256, 1024, 256},
                                    {0, 1, 256, 256, 1024}, {0, 0, 256, 256, 1024}, {1, 0, 1024, 256, 256}};
    best_p[0] = best_p[1] = 0;
    bg_blas_info_t blas;
    bg_gemm_info_t gi;
    if (bg_blas_info(&blas) != BG_OK || bg_gemm_info(&gi) != BG_OK)
        return 0;
    int saved = blas.get_num_threads();
    blas.set_num_threads(1);
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int ta = shapes[s][0], tb = shapes[s][1], m = shapes[s][2], n = shapes[s][3], k = shapes[s][4];
        float *a = malloc((size_t)m * k * sizeof(float)), *b = malloc((size_t)k * n * sizeof(float)),
              *c = malloc((size_t)m * n * sizeof(float));
        if (!a || !b || !c) {
            free(a), free(b), free(c);
            break;
        }
        for (size_t i = 0; i < (size_t)m * k; i++)
            a[i] = (float)((i * 7) % 13) * 0.01f;
        for (size_t i = 0; i < (size_t)k * n; i++)
            b[i] = (float)((i * 5) % 11) * 0.01f;
        int r = repeat < 32 ? repeat : 32, lda = ta ? m : k, ldb = tb ? k : n;
        int inner = (int)(2e8 / (2.0 * m * n * k)) + 1; /* >= 0.2 GFLOP per timed run */
        for (int lib = 0; lib < (gi.onednn ? 2 : 1); lib++) {
            double t[32];
            for (int i = -1; i < r; i++) {
                double t0 = bg_now();
                for (int j = 0; j < inner; j++)
                    if (lib) /* on this thread only */
                        gi.dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
                    else
                        blas.sgemm(BG_CBLAS_ROW_MAJOR, ta ? BG_CBLAS_TRANS : BG_CBLAS_NO_TRANS,
                                   tb ? BG_CBLAS_TRANS : BG_CBLAS_NO_TRANS, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
                if (i >= 0)
                    t[i] = (bg_now() - t0) / inner;
            }
            double g = 2.0 * m * n * k / bg_median(t, (size_t)(r)) / 1e9;
            if (g > best_p[lib])
                best_p[lib] = g;
        }
        free(a), free(b), free(c);
    }
    blas.set_num_threads(saved);
    return best_p[1] > best_p[0] ? best_p[1] : best_p[0];
}
