/* kernels/cuda/cuda_pool.h: the caching pool under the CUDA backend's
 * allocator. Plain C with the raw allocator passed in (cudaMalloc/cudaFree in
 * the backend, malloc/free in the unit test), so the caching logic is tested
 * on machines without a GPU (tests/kernels/test_cuda_pool.c).
 *
 * Blocks are rounded up (to 512 bytes, to 2 MiB above 1 MiB) and a freed
 * block is kept for the next request of a size it fits with at most 25% slack
 * (best fit), so a training loop that allocates the same buffers every step
 * makes no raw allocation after its first step. When the raw allocator fails,
 * the cached blocks are released and the request retried once. Thread-safe
 * (one mutex). Blocks are reused in the order the caller frees them, with no
 * event: a block freed while a queued kernel still reads it is handed to work
 * queued after that kernel on the compute stream, which carries every kernel.
 * The second (copy) stream touches device memory only for the staging
 * layer's transfers (runtime/staging.c), and the rule that keeps reuse safe
 * is: a device buffer is freed only after every transfer on it is freed, and
 * bg__xfree makes the compute stream wait for the transfer's copies still
 * queued (a completed receive or reduction has made it wait already; a
 * completed send's copies have completed). So a block freed on the host is
 * free on both streams for any work queued after the free on the compute
 * stream. The executor keeps the first half (a slot's buffers are freed after
 * its sends and receives; cancel_all frees transfers before buffers). */
#ifndef BG_KERNELS_CUDA_POOL_H
#define BG_KERNELS_CUDA_POOL_H

#include <pthread.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *(*bg_pool_raw_alloc_fn)(void *ctx, size_t bytes); /* NULL on failure */
typedef void (*bg_pool_raw_free_fn)(void *ctx, void *ptr);

typedef struct bg_pool_block {
    void *ptr;
    size_t size; /* rounded size of the raw allocation */
} bg_pool_block_t;

typedef struct bg_pool_stats {
    size_t reserved;   /* bytes held from the raw allocator (live + cached) */
    size_t cached;     /* bytes of freed blocks kept for reuse */
    size_t raw_allocs; /* raw allocations made since creation */
    size_t raw_frees;  /* raw frees made since creation */
    size_t hits;       /* requests served from the cache */
} bg_pool_stats_t;

typedef struct bg_pool {
    pthread_mutex_t lock;
    bg_pool_raw_alloc_fn raw_alloc;
    bg_pool_raw_free_fn raw_free;
    void *ctx;
    bg_pool_block_t *live, *cache;
    size_t nlive, caplive, ncache, capcache;
    bg_pool_stats_t stats;
} bg_pool_t;

void bg__pool_init(bg_pool_t *p, bg_pool_raw_alloc_fn raw_alloc, bg_pool_raw_free_fn raw_free, void *ctx);
/* Releases every block (live ones too) to the raw allocator. */
void bg__pool_destroy(bg_pool_t *p);
/* The rounded size a request of @p bytes takes. */
size_t bg__pool_round(size_t bytes);
void *bg__pool_alloc(bg_pool_t *p, size_t bytes);
/* Returns 0, or -1 when @p ptr is not a live block of this pool. */
int bg__pool_free(bg_pool_t *p, void *ptr);
/* Releases the cached blocks to the raw allocator. */
void bg__pool_trim(bg_pool_t *p);
bg_pool_stats_t bg__pool_stats(bg_pool_t *p);

#ifdef __cplusplus
}
#endif
#endif
