/* runtime/clip.c: the exact sum of squares and the clipping factor
 * (runtime/clip.h). Pure arithmetic: no ranks, no backend. */
#include <math.h>
#include <stdint.h>

#include "runtime/clip.h"

enum { LIMB_BITS = 20, MIN_EXP = -1074 };

void bg__clip_add(double *limbs, double v)
{
    if (!(v >= 0) || isinf(v)) { /* a NaN or infinite gradient: the norm is infinite (the top limb saturates) */
        limbs[BG__CLIP_LIMBS - 1] = INFINITY;
        return;
    }
    if (v == 0)
        return;
    int e;
    double f = frexp(v, &e); /* v = f * 2^e, f in [0.5, 1) */
    uint64_t m = (uint64_t)ldexp(f, 53); /* v = m * 2^(e - 53), exactly */
    int p = e - 53 - MIN_EXP;            /* bit position of m's lowest bit */
    if (p < 0) {                         /* subnormal: m has trailing zeros below 2^-1074 */
        m >>= -p;
        p = 0;
    }
    int k = p / LIMB_BITS, shift = p % LIMB_BITS;
    uint64_t piece = (m & ((1ULL << (LIMB_BITS - shift)) - 1)) << shift;
    limbs[k++] += (double)piece;
    m >>= LIMB_BITS - shift;
    for (; m && k < BG__CLIP_LIMBS; k++, m >>= LIMB_BITS)
        limbs[k] += (double)(m & ((1ULL << LIMB_BITS) - 1));
}

double bg__clip_value(const double *limbs)
{
    if (isinf(limbs[BG__CLIP_LIMBS - 1]))
        return INFINITY;
    /* carries low to high (each limb an exact integer < 2^53), then the value from the top down */
    uint64_t n[BG__CLIP_LIMBS], carry = 0;
    for (int k = 0; k < BG__CLIP_LIMBS; k++) {
        uint64_t t = (uint64_t)limbs[k] + carry;
        n[k] = t & ((1ULL << LIMB_BITS) - 1);
        carry = t >> LIMB_BITS;
    }
    double v = ldexp((double)carry, BG__CLIP_LIMBS * LIMB_BITS + MIN_EXP);
    for (int k = BG__CLIP_LIMBS - 1; k >= 0; k--)
        v += ldexp((double)n[k], k * LIMB_BITS + MIN_EXP);
    return v;
}

float bg__clip_factor(double clip, double norm)
{
    if (!(clip > 0))
        return 1.0f;
    double k = clip / (norm + BG__CLIP_EPS);
    return k < 1 ? (float)k : 1.0f;
}
