/* core/cpu_floor.c: the CPU against the build's instruction-set floor. A
 * Release build for x86-64-v3 (BG_MARCH, CMakeLists.txt) executes AVX2 and FMA
 * instructions anywhere in the library; on an older CPU that is an illegal
 * instruction at some later point. This file is compiled for plain x86-64, and
 * its constructor runs when the library loads, before any other code of
 * brigade: on a CPU below the floor it prints one line saying what is missing
 * and how to build for that CPU, and exits with status 1. */
#include <stdio.h>
#include <unistd.h>

#include "core/cpu_floor.h"

const char *bg__cpu_floor_missing(int avx, int avx2, int fma, int bmi1, int bmi2)
{
    return !avx ? "AVX" : !avx2 ? "AVX2" : !fma ? "FMA" : !bmi1 ? "BMI1" : !bmi2 ? "BMI2" : NULL;
}

#if defined(BG_MARCH_X86_64_V3) && defined(__x86_64__) && defined(__GNUC__)
__attribute__((constructor(101))) static void cpu_floor_check(void)
{
    __builtin_cpu_init();
    const char *missing =
        bg__cpu_floor_missing(__builtin_cpu_supports("avx"), __builtin_cpu_supports("avx2"),
                              __builtin_cpu_supports("fma"), __builtin_cpu_supports("bmi"),
                              __builtin_cpu_supports("bmi2"));
    if (missing) {
        fprintf(stderr, "brigade: this build was compiled for x86-64-v3 (cmake -DBG_MARCH=x86-64-v3, the default), "
                        "but this CPU has no %s: build with cmake -DBG_MARCH=x86-64 for it\n", missing);
        _exit(1);
    }
}
#endif
