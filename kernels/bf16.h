/* kernels/bf16.h: the fp32 <-> bf16 conversion of every backend's `convert`
 * (C for the CPU, CUDA device code, and the CUDA emulation in tests), so
 * that all of them give the same bits. On bit patterns: u is an fp32's bits.
 *   round to nearest, ties to even: add 0x7fff plus the lowest kept bit, keep
 *   the top 16 bits (a carry into the exponent rounds up to the next binade,
 *   or to infinity past the largest finite bf16);
 *   NaN (exponent all ones, mantissa non-zero): keep the sign and the top
 *   mantissa bits and set the quiet bit, so a NaN never rounds to infinity. */
#ifndef BG_KERNELS_BF16_H
#define BG_KERNELS_BF16_H

#include <stdint.h>

#if defined(__CUDACC__)
#define BG_BF16_FN static __host__ __device__ __forceinline__
#else
#define BG_BF16_FN static inline
#endif

BG_BF16_FN uint16_t bg__bf16_from_bits(uint32_t u)
{
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : r);
}

BG_BF16_FN uint32_t bg__bf16_to_bits(uint16_t h) { return (uint32_t)h << 16; }

#endif /* BG_KERNELS_BF16_H */
