/* runtime/offload.c: the offload store. Each allocation is either host
 * memory (page-aligned, zeroed) or a file of its own under the store's
 * directory: created exclusively (brigade-offload.<pid>.<n>), its bytes
 * reserved on disk at once (bg__fileio_reserve: a full disk fails here,
 * naming the file and the bytes, never later as a fault in the middle of a
 * step), mapped shared, then unlinked at once, so the file is gone from the
 * directory whatever happens to the process (a kill included) and its disk
 * space comes back when the mapping is unmapped at destroy or exit.
 * The memory is host memory every host kernel addresses; the kernel's page
 * cache moves it to and from the disk (bg__offload_prefetch reads ahead).
 *
 * Owns: the allocations and their byte counts. Must not know models or
 * optimizers (the model asks it for zeroed bytes through bg_optim_store_t). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fileio.h"
#include "runtime/offload.h"

typedef struct block {
    void *ptr;
    size_t bytes;  /* asked */
    size_t mapped; /* mapped (page-rounded; 0: host memory) */
} block_t;

struct bg__offload {
    char *dir; /* NULL: host memory */
    block_t *blocks;
    int nblocks, cap;
    int seq;   /* file names */
    size_t bytes, peak;
};

bg_status_t bg__offload_create(const char *dir, bg__offload_t **o_p)
{
    bg__offload_t *o = calloc(1, sizeof(*o));
    BG_ALLOC_CHECK(o, sizeof(*o), "offload store");
    if (dir && *dir) {
        bg_status_t st = bg_check_writable_dir(dir);
        if (st == BG_OK)
            st = bg__fileio_mkdir_p(dir);
        if (st != BG_OK) {
            free(o);
            return bg_error(st, "--offload-dir %s: %s", dir, bg_last_error());
        }
        if (!(o->dir = strdup(dir))) {
            free(o);
            return bg_error(BG_ERR_NOMEM, "offload store");
        }
    }
    *o_p = o;
    return BG_OK;
}

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* A file of `bytes` under the directory, mapped and unlinked (its name gone at once). */
static bg_status_t map_file(bg__offload_t *o, block_t *blk, const char *what)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/brigade-offload.%d.%d", o->dir, (int)getpid(), o->seq++);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return bg_error(BG_ERR_IO, "--offload-dir: cannot create %s for the %s: %s", path, what, strerror(errno));
    size_t mapped = page_round(blk->bytes ? blk->bytes : 1);
    void *p = MAP_FAILED;
    bg_status_t st = bg__fileio_reserve(fd, mapped, path);
    if (st != BG_OK) {
        st = bg_error(st, "--offload-dir %s has no room for the %s: %s; nothing was written: free space there or "
                          "choose another --offload-dir", o->dir, what, bg_last_error());
    } else if ((p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        st = bg_error(BG_ERR_IO, "--offload-dir: cannot map %s (%zu bytes, the %s): %s", path, mapped, what,
                      strerror(errno));
    }
    unlink(path);
    close(fd);
    if (st == BG_OK) {
        blk->ptr = p;
        blk->mapped = mapped;
    }
    return st;
}

static bg_status_t store_alloc(void *arg, size_t bytes, const char *what, void **ptr_p)
{
    bg__offload_t *o = arg;
    if (o->nblocks == o->cap) {
        int cap = o->cap ? 2 * o->cap : 16;
        block_t *b = realloc(o->blocks, (size_t)cap * sizeof(*b));
        if (!b)
            return bg_error(BG_ERR_NOMEM, "offload store: the list of blocks");
        o->blocks = b;
        o->cap = cap;
    }
    block_t blk = {.bytes = bytes};
    if (o->dir)
        BG_CHECK(map_file(o, &blk, what));
    else if (posix_memalign(&blk.ptr, 4096, bytes ? bytes : 1) != 0)
        return bg_error(BG_ERR_NOMEM, "offload store: %zu bytes of host memory for the %s", bytes, what);
    else
        memset(blk.ptr, 0, bytes);
    o->blocks[o->nblocks++] = blk;
    o->bytes += bytes;
    if (o->bytes > o->peak)
        o->peak = o->bytes;
    *ptr_p = blk.ptr;
    return BG_OK;
}

static void block_free(block_t *b)
{
    if (b->mapped)
        munmap(b->ptr, b->mapped);
    else
        free(b->ptr);
}

static void store_release(void *arg, void *ptr)
{
    bg__offload_t *o = arg;
    for (int i = 0; i < o->nblocks; i++)
        if (o->blocks[i].ptr == ptr) {
            o->bytes -= o->blocks[i].bytes;
            block_free(&o->blocks[i]);
            o->blocks[i] = o->blocks[--o->nblocks];
            return;
        }
}

bg_optim_store_t bg__offload_optim_store(bg__offload_t *o)
{
    return (bg_optim_store_t){.alloc = store_alloc, .release = store_release, .arg = o};
}

void bg__offload_prefetch(bg__offload_t *o)
{
    for (int i = 0; o && i < o->nblocks; i++)
        if (o->blocks[i].mapped)
            (void)madvise(o->blocks[i].ptr, o->blocks[i].mapped, MADV_WILLNEED);
}

bg_status_t bg__offload_evict(bg__offload_t *o)
{
    for (int i = 0; o && i < o->nblocks; i++) {
        block_t *b = &o->blocks[i];
        if (!b->mapped)
            continue;
        if (msync(b->ptr, b->mapped, MS_SYNC) != 0)
            return bg_error(BG_ERR_IO, "--offload-dir %s: writing back %zu bytes of optimizer state: %s", o->dir,
                            b->mapped, strerror(errno));
#ifdef MADV_PAGEOUT
        (void)madvise(b->ptr, b->mapped, MADV_PAGEOUT); /* advice: a kernel may keep some pages */
#endif
    }
    return BG_OK;
}

size_t bg__offload_bytes(const bg__offload_t *o) { return o ? o->bytes : 0; }
size_t bg__offload_peak(const bg__offload_t *o) { return o ? o->peak : 0; }

void bg__offload_destroy(bg__offload_t *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->nblocks; i++)
        block_free(&o->blocks[i]);
    free(o->blocks);
    free(o->dir);
    free(o);
}
