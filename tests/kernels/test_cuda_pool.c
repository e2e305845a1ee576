/* tests/kernels/test_cuda_pool.c: the CUDA backend's caching pool
 * (kernels/cuda/cuda_pool.c) over malloc, so it runs on machines without a
 * GPU: a repeated allocation pattern makes no raw allocation after its first
 * round (the steady state of a training step), rounding and best fit with at
 * most 25% slack, release of the cache and one retry when the raw allocator
 * fails, the reserved/cached byte counts, foreign pointers refused, and every
 * raw block released on destroy (counted by the fake allocator). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "kernels/cuda/cuda_pool.h"

typedef struct {
    size_t live;  /* raw blocks outstanding */
    size_t bytes; /* raw bytes outstanding */
    size_t limit; /* raw allocations fail above this many bytes outstanding */
} fake_t;

static void *fake_alloc(void *ctx, size_t bytes)
{
    fake_t *f = ctx;
    if (f->bytes + bytes > f->limit)
        return NULL;
    size_t *p = malloc(bytes + sizeof(size_t));
    assert_non_null(p);
    p[0] = bytes;
    f->live++;
    f->bytes += bytes;
    return p + 1;
}

static void fake_free(void *ctx, void *ptr)
{
    fake_t *f = ctx;
    size_t *p = (size_t *)ptr - 1;
    assert_true(f->live > 0);
    f->live--;
    f->bytes -= p[0];
    free(p);
}

static void test_round(void **state)
{
    assert_int_equal(bg__pool_round(0), 512);
    assert_int_equal(bg__pool_round(1), 512);
    assert_int_equal(bg__pool_round(512), 512);
    assert_int_equal(bg__pool_round(513), 1024);
    assert_int_equal(bg__pool_round((size_t)1 << 20), (size_t)1 << 20);
    assert_int_equal(bg__pool_round(((size_t)1 << 20) + 1), (size_t)2 << 20);
    assert_int_equal(bg__pool_round((size_t)5 << 20), (size_t)6 << 20);
}

/* a training step's pattern: the same sizes allocated and freed each step,
 * in a different order; after step 1 no raw allocation */
static void test_steady_state(void **state)
{
    fake_t f = {0, 0, SIZE_MAX};
    bg_pool_t p;
    bg__pool_init(&p, fake_alloc, fake_free, &f);
    static const size_t sizes[] = {100, 4096, 70000, 3 << 20, 4096, 100, 1 << 20, 12345678};
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    void *ptr[N];
    size_t after_first = 0;
    for (int step = 0; step < 5; step++) {
        for (int i = 0; i < N; i++) {
            ptr[i] = bg__pool_alloc(&p, sizes[i]);
            assert_non_null(ptr[i]);
            for (int j = 0; j < i; j++)
                assert_ptr_not_equal(ptr[i], ptr[j]);
        }
        for (int i = 0; i < N; i++) /* free in an order that changes every step */
            assert_int_equal(bg__pool_free(&p, ptr[(i * 3 + step) % N]), 0);
        if (step == 0)
            after_first = bg__pool_stats(&p).raw_allocs;
    }
    bg_pool_stats_t s = bg__pool_stats(&p);
    assert_int_equal(after_first, N);
    assert_int_equal(s.raw_allocs, N); /* no raw allocation after the first step */
    assert_int_equal(s.raw_frees, 0);
    assert_int_equal(s.hits, 4 * N);
    size_t want = 0;
    for (int i = 0; i < N; i++)
        want += bg__pool_round(sizes[i]);
    assert_int_equal(s.reserved, want);
    assert_int_equal(s.cached, want);
    assert_int_equal(f.bytes, want);
    bg__pool_destroy(&p);
    assert_int_equal(f.live, 0);
}

/* best fit: a cached block is reused for a request up to 25% smaller, never
 * for a larger one nor a much smaller one */
static void test_best_fit(void **state)
{
    fake_t f = {0, 0, SIZE_MAX};
    bg_pool_t p;
    bg__pool_init(&p, fake_alloc, fake_free, &f);
    void *a = bg__pool_alloc(&p, 10 << 20), *b = bg__pool_alloc(&p, 8 << 20);
    assert_int_equal(bg__pool_free(&p, a), 0);
    assert_int_equal(bg__pool_free(&p, b), 0);
    void *c = bg__pool_alloc(&p, 7 << 20); /* 8 MiB block: 14% slack, the best fit */
    assert_ptr_equal(c, b);
    void *d = bg__pool_alloc(&p, 4 << 20); /* 10 MiB would be 150% slack: a new block */
    assert_ptr_not_equal(d, a);
    void *e = bg__pool_alloc(&p, 11 << 20); /* larger than every cached block */
    assert_ptr_not_equal(e, a);
    assert_int_equal(bg__pool_stats(&p).raw_allocs, 4);
    assert_int_equal(bg__pool_stats(&p).cached, (size_t)10 << 20);
    bg__pool_trim(&p);
    assert_int_equal(bg__pool_stats(&p).cached, 0);
    assert_int_equal(f.live, 3);
    bg__pool_destroy(&p); /* live blocks too */
    assert_int_equal(f.live, 0);
    assert_int_equal(f.bytes, 0);
}

/* out of memory: the cache is released and the request retried; when that
 * fails too, NULL and nothing leaks */
static void test_oom(void **state)
{
    fake_t f = {0, 0, (size_t)16 << 20};
    bg_pool_t p;
    bg__pool_init(&p, fake_alloc, fake_free, &f);
    void *a = bg__pool_alloc(&p, 6 << 20), *b = bg__pool_alloc(&p, 6 << 20);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(bg__pool_free(&p, a), 0); /* 6 MiB cached, 12 MiB reserved */
    void *c = bg__pool_alloc(&p, 9 << 20);     /* fits only once the cache is released */
    assert_non_null(c);
    bg_pool_stats_t s = bg__pool_stats(&p);
    assert_int_equal(s.cached, 0);
    assert_int_equal(s.raw_frees, 1);
    assert_int_equal(s.reserved, (size_t)16 << 20);
    assert_null(bg__pool_alloc(&p, 1 << 20)); /* full: NULL */
    assert_int_equal(bg__pool_stats(&p).reserved, (size_t)16 << 20);
    int x;
    assert_int_equal(bg__pool_free(&p, &x), -1); /* not a block of the pool */
    assert_int_equal(bg__pool_free(&p, b), 0);
    assert_int_equal(bg__pool_free(&p, b), -1); /* twice */
    assert_int_equal(bg__pool_free(&p, c), 0);
    bg__pool_destroy(&p);
    assert_int_equal(f.live, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round),
        cmocka_unit_test(test_steady_state),
        cmocka_unit_test(test_best_fit),
        cmocka_unit_test(test_oom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
