/* core/cpu_floor.h: the CPU against the build's instruction-set floor (core/cpu_floor.c). */
#ifndef BG_CORE_CPU_FLOOR_H
#define BG_CORE_CPU_FLOOR_H
/* The first feature of x86-64-v3 that the flags say is missing ("AVX2", ...), or NULL. */
const char *bg__cpu_floor_missing(int avx, int avx2, int fma, int bmi1, int bmi2);
#endif
