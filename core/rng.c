/* core/rng.c: xoshiro256** seeded by splitmix64, and the monotonic clock.
 * Bit-identical on every platform: initialisation and data order depend on it. */
#include "brigade/core.h"

#include <math.h>
#include <time.h>

static uint64_t bg__splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void bg_rng_seed(bg_rng_t *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        rng->s[i] = bg__splitmix64(&x);
}

static inline uint64_t bg__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t bg_rng_u64(bg_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = bg__rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = bg__rotl(s[3], 45);
    return result;
}

double bg_rng_uniform(bg_rng_t *rng) { return (double)(bg_rng_u64(rng) >> 11) * 0x1.0p-53; }

double bg_rng_normal(bg_rng_t *rng)
{
    double u1 = bg_rng_uniform(rng), u2 = bg_rng_uniform(rng);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t bg_rng_below(bg_rng_t *rng, uint64_t n)
{
    /* rejection sampling: unbiased */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = bg_rng_u64(rng);
    } while (x >= limit);
    return x % n;
}

double bg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
