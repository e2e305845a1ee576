/* kernels/cuda/cuda_pool.c: the caching pool of cuda_pool.h. Linear searches
 * over the live and cached arrays: a training step holds hundreds to a few
 * thousand buffers, and the search is far cheaper than a cudaMalloc. */
#include <stdlib.h>

#include "kernels/cuda/cuda_pool.h"

#define BG_POOL_SMALL ((size_t)1 << 20)     /* up to 1 MiB: 512-byte granules */
#define BG_POOL_SMALL_GRAIN ((size_t)512)
#define BG_POOL_LARGE_GRAIN ((size_t)2 << 20) /* above: 2 MiB granules */

void bg__pool_init(bg_pool_t *p, bg_pool_raw_alloc_fn raw_alloc, bg_pool_raw_free_fn raw_free, void *ctx)
{
    *p = (bg_pool_t){.raw_alloc = raw_alloc, .raw_free = raw_free, .ctx = ctx};
    pthread_mutex_init(&p->lock, NULL);
}

size_t bg__pool_round(size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    size_t g = bytes <= BG_POOL_SMALL ? BG_POOL_SMALL_GRAIN : BG_POOL_LARGE_GRAIN;
    return (bytes + g - 1) / g * g;
}

static int bg__pool_push(bg_pool_block_t **arr, size_t *n, size_t *cap, bg_pool_block_t b)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        void *r = realloc(*arr, nc * sizeof(**arr));
        if (!r)
            return -1;
        *arr = r;
        *cap = nc;
    }
    (*arr)[(*n)++] = b;
    return 0;
}

/* caller holds the lock */
static void bg__pool_trim_locked(bg_pool_t *p)
{
    for (size_t i = 0; i < p->ncache; i++) {
        p->raw_free(p->ctx, p->cache[i].ptr);
        p->stats.raw_frees++;
        p->stats.reserved -= p->cache[i].size;
    }
    p->ncache = 0;
    p->stats.cached = 0;
}

void *bg__pool_alloc(bg_pool_t *p, size_t bytes)
{
    size_t want = bg__pool_round(bytes);
    pthread_mutex_lock(&p->lock);
    /* best fit among the cached blocks, at most 25% larger than asked */
    size_t best = p->ncache;
    for (size_t i = 0; i < p->ncache; i++) {
        size_t s = p->cache[i].size;
        if (s >= want && s - want <= want / 4 && (best == p->ncache || s < p->cache[best].size))
            best = i;
        if (best != p->ncache && p->cache[best].size == want)
            break;
    }
    bg_pool_block_t b = {NULL, want};
    if (best != p->ncache) {
        b = p->cache[best];
        p->cache[best] = p->cache[--p->ncache];
        p->stats.cached -= b.size;
        p->stats.hits++;
    } else {
        b.ptr = p->raw_alloc(p->ctx, want);
        if (!b.ptr && p->ncache) { /* give the cache back and try once more */
            bg__pool_trim_locked(p);
            b.ptr = p->raw_alloc(p->ctx, want);
        }
        if (!b.ptr) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        p->stats.raw_allocs++;
        p->stats.reserved += want;
    }
    if (bg__pool_push(&p->live, &p->nlive, &p->caplive, b) != 0) {
        p->raw_free(p->ctx, b.ptr);
        p->stats.raw_frees++;
        p->stats.reserved -= b.size;
        b.ptr = NULL;
    }
    pthread_mutex_unlock(&p->lock);
    return b.ptr;
}

int bg__pool_free(bg_pool_t *p, void *ptr)
{
    pthread_mutex_lock(&p->lock);
    for (size_t i = p->nlive; i-- > 0;) {
        if (p->live[i].ptr != ptr)
            continue;
        bg_pool_block_t b = p->live[i];
        p->live[i] = p->live[--p->nlive];
        if (bg__pool_push(&p->cache, &p->ncache, &p->capcache, b) == 0) {
            p->stats.cached += b.size;
        } else {
            p->raw_free(p->ctx, b.ptr);
            p->stats.raw_frees++;
            p->stats.reserved -= b.size;
        }
        pthread_mutex_unlock(&p->lock);
        return 0;
    }
    pthread_mutex_unlock(&p->lock);
    return -1;
}

void bg__pool_trim(bg_pool_t *p)
{
    pthread_mutex_lock(&p->lock);
    bg__pool_trim_locked(p);
    pthread_mutex_unlock(&p->lock);
}

bg_pool_stats_t bg__pool_stats(bg_pool_t *p)
{
    pthread_mutex_lock(&p->lock);
    bg_pool_stats_t s = p->stats;
    pthread_mutex_unlock(&p->lock);
    return s;
}

void bg__pool_destroy(bg_pool_t *p)
{
    bg__pool_trim(p);
    for (size_t i = 0; i < p->nlive; i++)
        p->raw_free(p->ctx, p->live[i].ptr);
    free(p->live);
    free(p->cache);
    pthread_mutex_destroy(&p->lock);
    *p = (bg_pool_t){0};
}
