/* tools/bench.h: the benchmarks behind `brigade bench <kind>`. Each lives in
 * tools/bench_<kind>.c and prints measured figures next to a reference
 * measured in the same run. Declared weak so a build without one of them
 * still links and says the benchmark is not built. */
#ifndef BG_TOOLS_BENCH_H
#define BG_TOOLS_BENCH_H

#define BG_BENCH_LIST(X)                                                                    \
    X(kernels, "GEMM GFLOP/s against OpenBLAS's own peak, per-op throughput, GPT training FLOP/s") \
    X(p2p, "point-to-point latency and bandwidth over message sizes (2 ranks, under brigade launch)") \
    X(allreduce, "allreduce bus bandwidth over sizes and algorithms (under brigade launch)")   \
    X(schedule, "time to generate, validate and simulate large schedules")                     \
    X(schedules, "every generator's and the search's step, both bubbles and peak stash over a p x m grid") \
    X(plan, "exact partitioner on 1000 layers over 8..1000 stages; layout search on 1024 devices")

#define BG__BENCH_DECL(name, help) int bg_bench_##name(int argc, char **argv) __attribute__((weak));
BG_BENCH_LIST(BG__BENCH_DECL)
#undef BG__BENCH_DECL

#endif
