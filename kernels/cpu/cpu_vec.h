/* kernels/cpu/cpu_vec.h: the CPU kernels' vector building blocks: a
 * vectorisable expf, and fixed-order lane sums and maxima. Holds no state.
 * Must not be included outside kernels/cpu/.
 *
 * ISAs: the files using these are compiled once per vector ISA (cpu_impl.h,
 * kernels/CMakeLists.txt) and the backend picks one compile's kernels when it
 * is created, so these plain loops are vectorised for AVX-512, AVX2 or the
 * baseline by the compiler's flags, not by attributes.
 *
 * Bits: C11 mode compiles with -ffp-contract=off (no FMA contraction), and
 * every sum below is written with explicit lanes whose order the source fixes,
 * so the AVX-512, AVX2 and scalar paths give the same bits, and no result
 * depends on the thread count (threads only choose who computes a row). */
#ifndef BG_KERNELS_CPU_VEC_H
#define BG_KERNELS_CPU_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Lanes of the fixed-order sums: 8 doubles (one AVX-512 register, two AVX2). */
#define BG_VEC_LANES 8

static inline float bg__f_from_bits(int32_t i)
{
    float f;
    memcpy(&f, &i, sizeof(f));
    return f;
}

static inline int32_t bg__bits_from_f(float f)
{
    int32_t i;
    memcpy(&i, &f, sizeof(i));
    return i;
}

/* e^x in float (Cephes expf: 2^n * p(r), r = x - n ln2 split in two parts,
 * degree-6 polynomial), written so that GCC vectorises it: no calls, no
 * branches, rounding by the 1.5 * 2^23 trick (round to nearest even), 2^n
 * built in the exponent bits. Relative error about 2 ulp (test_kernels
 * compares every kernel using it against double references). x below
 * ln(FLT_MIN) gives 0 (so -inf gives 0), x above 88.376 gives about 2^127
 * (finite), NaN gives NaN (it passes the clamps and poisons y). */
static inline float bg__expf(float x)
{
    const float hi = 88.3762626647949f, lo = -87.3365447505531f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    const float shifter = 12582912.0f; /* 1.5 * 2^23 */
    float t = xc * 1.44269504088896341f + shifter;
    float n = t - shifter;
    int32_t ni = bg__bits_from_f(t) - bg__bits_from_f(shifter);
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * (r * r) + r + 1.0f;
    y = y * bg__f_from_bits((int32_t)((uint32_t)(ni + 127) << 23)); /* unsigned: a NaN's ni overflows the shift */
    return x < lo ? 0.0f : y; /* NaN: the clamps keep it, so y is NaN */
}

/* Sums in double over BG_VEC_LANES lanes: lane j takes elements j, j+8, ...;
 * the lanes are then added in a fixed tree. */
static inline double bg__lanes_total(const double *acc)
{
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* The lanes as GCC vectors: 4 floats loaded from anywhere (unaligned), 4
 * doubles; the 8 lanes are two such halves (lo: lanes 0-3, hi: 4-7). Each
 * lane does exactly what the scalar lane loop would, so the bits are the
 * same; written out because GCC leaves the lane loops scalar when a loop body
 * holds two sums. Halves of 32 bytes, not one 64-byte vector: a vector wider
 * than the ISA's registers is split by GCC through the stack, and on AVX2 the
 * 64-byte one's pieces were reloaded across store forwarding (LayerNorm's
 * forward 4.2 ms on AVX-512, 17.8 on AVX2, 6.7 on SSE2). */
typedef float bg__f4 __attribute__((vector_size(16), aligned(4), may_alias));
typedef double bg__d4 __attribute__((vector_size(32)));
#define BG_D4(p) __builtin_convertvector(*(const bg__f4 *)(p), bg__d4)

/* the lanes of the two halves, for the tail and bg__lanes_total */
/* (a macro: a function taking a 32-byte vector by value changes the ABI where AVX is off, -Wpsabi) */
#define BG_D8_STORE(acc, lo, hi) (memcpy((acc), &(lo), sizeof(lo)), memcpy((acc) + 4, &(hi), sizeof(hi)))

static inline double bg__sum_f(const float *restrict x, int n)
{
    double acc[BG_VEC_LANES];
    bg__d4 lo = {0}, hi = {0};
    int i = 0;
    for (; i + BG_VEC_LANES <= n; i += BG_VEC_LANES)
        lo += BG_D4(x + i), hi += BG_D4(x + i + 4);
    BG_D8_STORE(acc, lo, hi);
    for (int j = 0; i + j < n; j++)
        acc[j] += (double)x[i + j];
    return bg__lanes_total(acc);
}

/* sum of (x - mu)^2 */
static inline double bg__sumsq_dev_f(const float *restrict x, double mu, int n)
{
    double acc[BG_VEC_LANES];
    bg__d4 lo = {0}, hi = {0};
    int i = 0;
    for (; i + BG_VEC_LANES <= n; i += BG_VEC_LANES) {
        bg__d4 d0 = BG_D4(x + i) - mu, d1 = BG_D4(x + i + 4) - mu;
        lo += d0 * d0, hi += d1 * d1;
    }
    BG_D8_STORE(acc, lo, hi);
    for (int j = 0; i + j < n; j++) {
        double d = (double)x[i + j] - mu;
        acc[j] += d * d;
    }
    return bg__lanes_total(acc);
}

/* sum of a*b, products in double */
static inline double bg__dot_f(const float *restrict a, const float *restrict b, int n)
{
    double acc[BG_VEC_LANES];
    bg__d4 lo = {0}, hi = {0};
    int i = 0;
    for (; i + BG_VEC_LANES <= n; i += BG_VEC_LANES)
        lo += BG_D4(a + i) * BG_D4(b + i), hi += BG_D4(a + i + 4) * BG_D4(b + i + 4);
    BG_D8_STORE(acc, lo, hi);
    for (int j = 0; i + j < n; j++)
        acc[j] += (double)a[i + j] * (double)b[i + j];
    return bg__lanes_total(acc);
}

/* max of scale * x[0..n), n >= 1 (max is exact, so lanes change no bits) */
static inline float bg__max_scaled_f(const float *restrict x, float scale, int n)
{
    float m[16];
    for (int j = 0; j < 16; j++)
        m[j] = -INFINITY;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) {
            float v = scale * x[i + j];
            m[j] = v > m[j] ? v : m[j];
        }
    for (int j = 0; i + j < n; j++) {
        float v = scale * x[i + j];
        m[j] = v > m[j] ? v : m[j];
    }
    float mx = m[0];
    for (int j = 1; j < 16; j++)
        mx = m[j] > mx ? m[j] : mx;
    return mx;
}

/* y[j] = e^(scale * x[j] - mx); returns the sum of y in double lanes (y may equal x) */
static inline double bg__exp_shift_sum(float *y, const float *x, float scale, float mx, int n)
{
    double acc[BG_VEC_LANES] = {0};
    int i = 0;
    for (; i + BG_VEC_LANES <= n; i += BG_VEC_LANES)
        for (int j = 0; j < BG_VEC_LANES; j++) {
            float e = bg__expf(scale * x[i + j] - mx);
            y[i + j] = e;
            acc[j] += (double)e;
        }
    for (int j = 0; i + j < n; j++) {
        float e = bg__expf(scale * x[i + j] - mx);
        y[i + j] = e;
        acc[j] += (double)e;
    }
    return bg__lanes_total(acc);
}

/* 8 x 8 transpose in registers: r[i] holds row i (8 floats); column c of the
 * block is stored at dst + c * ldd. Generic shuffles (GCC's and clang's
 * __builtin_shufflevector): unpack, shufps and a 128-bit lane swap on AVX2 and
 * AVX-512, pairs of SSE shuffles on the default ISA. Pure copies: exact. Used
 * by attention's transposed key tiles and the GEMM's transposed operands. */
typedef float bg__v8 __attribute__((vector_size(32), aligned(4), may_alias));
static inline __attribute__((always_inline)) void bg__tr8x8(float *restrict dst, size_t ldd, const bg__v8 *r)
{
    bg__v8 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            u[i + h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[i + h + 2] = __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    /* u[0..3] hold columns 0, 2, 1, 3 (low lanes) and 4, 6, 5, 7 (high) of rows 0-3, u[4..7] of rows 4-7 */
    static const int col[4] = {0, 2, 1, 3};
    for (int i = 0; i < 4; i++) {
        *(bg__v8 *)(dst + (size_t)col[i] * ldd) = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        *(bg__v8 *)(dst + (size_t)(col[i] + 4) * ldd) =
            __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

#endif
