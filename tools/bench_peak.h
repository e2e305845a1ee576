/* tools/bench_peak.h: the machine's anchor for `brigade bench kernels`
 * (tools/bench_peak.c): one core's theoretical fp32 peak, measured clock and
 * FMA units, a short FMA sample for the ratio of a step to the core's
 * throughput, and the best single-threaded sgemm of the BLAS libraries in
 * use. Private to tools/. */
#ifndef BG_TOOLS_BENCH_PEAK_H
#define BG_TOOLS_BENCH_PEAK_H

/* The theoretical fp32 peak of one core = clock x FMA units x lanes x 2.
 * - lanes: the widest fp32 FMA vector the CPU and OS support (CPUID).
 * - clock: a chain of dependent register-register integer adds retires one
 *   add per cycle on every x86 core since the P6, so adds / second = cycles
 *   / second. The best of 40 samples of about 1 ms (load from other
 *   processes only slows a sample down).
 * - FMA units per core are not in CPUID: 12 independent FMA chains at that
 *   width are timed, and FMAs per cycle (at the measured clock) rounded to
 *   the nearest whole number is the unit count (2 on Skylake-SP Gold and
 *   later Xeons, 2 x 256-bit on Haswell..Zen 3; 1 x 512-bit equivalent on
 *   Zen 4 and some Xeon Silver). Measured, then rounded: the peak stays
 *   "theoretical" (clock x units x lanes x 2), not a throughput figure. */
typedef struct {
    double ghz;       /* measured clock */
    double fma_per_cycle; /* measured vector FMAs per cycle */
    int units;        /* rounded */
    int bits;         /* vector width */
    double peak;      /* GFLOP/s per core */
} bg__peak_t;

/* Clock, FMA units and the peak they give (all 0 without FMA or off x86). */
bg__peak_t bg__machine_peak(void);
/* GFLOP/s of one short FMA sample (about 0.65 ms) at the CPU's widest vector; 0 off x86. */
double bg__fma_now(void);
/* The best one-thread sgemm GFLOP/s of OpenBLAS (best_p[0]) and oneDNN
 * (best_p[1], 0 when unused) at a square and the training model's shapes;
 * returns the larger. */
double bg__sgemm_best_1t(int repeat, double best_p[2]);

#endif
