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
#include "runtime/staging.h"

typedef struct block {
    void *ptr;
    size_t bytes;  /* asked */
    size_t mapped; /* mapped (page-rounded; 0: host memory) */
    int pinned;    /* from the pinning backend's host_alloc (bg__offload_pin) */
} block_t;

struct bg__offload {
    char *dir; /* NULL: host memory */
    block_t *blocks;
    int nblocks, cap;
    int seq;   /* file names */
    size_t bytes, peak;
    /* the host-held step (bg__offload_host_step), made at its first call: */
    bg_backend_t *dev, *cpu;  /* the buffers' backend; the CPU backend whose AdamW / SGD runs on the host */
    float *hw, *hg;           /* the fp32 parameters being stepped and their gradients, host_alloc'd (pinned) */
    size_t hcap;              /* floats of each */
    bg_event_t *ev_after, *ev_down, *ev_up; /* NULL: the backend has no streams (synchronous copies) */
    size_t updates;           /* host-held steps made (the log) */
    size_t in_place;          /* of which on parameters the store holds (--offload params) */
    bg_backend_t *pin;        /* host memory from its host_alloc (page-locked on cuda); NULL: posix_memalign */
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
    if (o->dir) {
        BG_CHECK(map_file(o, &blk, what));
    } else {
        if (o->pin)
            blk.ptr = bg__host_alloc(o->pin, bytes);
        else if (posix_memalign(&blk.ptr, 4096, bytes ? bytes : 1) != 0)
            blk.ptr = NULL;
        if (!blk.ptr)
            return bg_error(BG_ERR_NOMEM, "offload store: %zu bytes of %shost memory for the %s", bytes,
                            o->pin ? "page-locked " : "", what);
        memset(blk.ptr, 0, bytes);
        blk.pinned = o->pin != NULL;
    }
    o->blocks[o->nblocks++] = blk;
    o->bytes += bytes;
    if (o->bytes > o->peak)
        o->peak = o->bytes;
    *ptr_p = blk.ptr;
    return BG_OK;
}

static void block_free(const bg__offload_t *o, block_t *b)
{
    if (b->mapped)
        munmap(b->ptr, b->mapped);
    else if (b->pinned)
        bg__host_free(o->pin, b->ptr);
    else
        free(b->ptr);
}

void bg__offload_pin(bg__offload_t *o, bg_backend_t *be) { o->pin = be; }

/* 1 when ptr lies in one of the store's allocations: host memory the host steps in place. */
static int held(const bg__offload_t *o, const void *ptr)
{
    const char *p = ptr;
    for (int i = 0; i < o->nblocks; i++)
        if (p >= (const char *)o->blocks[i].ptr && p < (const char *)o->blocks[i].ptr + o->blocks[i].bytes)
            return 1;
    return 0;
}

static void store_release(void *arg, void *ptr)
{
    bg__offload_t *o = arg;
    for (int i = 0; i < o->nblocks; i++)
        if (o->blocks[i].ptr == ptr) {
            o->bytes -= o->blocks[i].bytes;
            block_free(o, &o->blocks[i]);
            o->blocks[i] = o->blocks[--o->nblocks];
            return;
        }
}

/* The host buffers for n floats (grown; the previous upload done first) and, the first time, the CPU backend
 * and the events. */
static bg_status_t host_ready(bg__offload_t *o, bg_backend_t *be, size_t n)
{
    if (o->dev && o->dev != be)
        return bg_error(BG_ERR_INVALID, "offload store: one store serves one backend");
    const bg_backend_ops_t *d = be->ops;
    if (!o->dev) {
        bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
        BG_CHECK(bg_backend_create("cpu", &bp, &o->cpu));
        o->dev = be;
        if (d->event_create && (!(o->ev_after = d->event_create(be)) || !(o->ev_down = d->event_create(be)) ||
                                !(o->ev_up = d->event_create(be))))
            return bg_error(BG_ERR_NOMEM, "offload store: the events of the host-held optimizer step");
    }
    if (n <= o->hcap)
        return BG_OK;
    if (o->ev_up)
        d->event_wait(be, o->ev_up); /* the last upload reads hw */
    bg__host_free(be, o->hw);
    bg__host_free(be, o->hg);
    o->hw = bg__host_alloc(be, n * sizeof(float));
    o->hg = bg__host_alloc(be, n * sizeof(float));
    o->hcap = o->hw && o->hg ? n : 0;
    if (!o->hcap)
        return bg_error(BG_ERR_NOMEM, "offload store: %zu bytes of host memory for the host-held optimizer step",
                        2 * n * sizeof(float));
    return BG_OK;
}

/* The store's step (bg_optim_store_t.step): param and grad copied to the host (on the copy stream, behind the
 * compute stream's work so far: their producers), the CPU kernel on them and the host-held state, the
 * parameters copied back on the copy stream; the compute stream waits for that copy, the host does not.
 * Parameters the store holds itself (--offload params: ZeRO-3's shard) are stepped where they are: only the
 * gradients come down, nothing goes back (the next gather uploads them: runtime/zero_params.c, which has
 * waited for its own uploads of them before this update). */
static bg_status_t host_step(void *arg, bg_backend_t *be, const bg_optim_config_t *opt, float wd, int t,
                             float *param, const float *grad, float *m, float *v, size_t n)
{
    bg__offload_t *o = arg;
    BG_CHECK(host_ready(o, be, n));
    const bg_backend_ops_t *d = be->ops;
    size_t bytes = n * sizeof(float);
    int in_place = held(o, param);
    float *w = in_place ? param : o->hw;
    if (o->ev_up) { /* the last upload is before ev_after too: the compute stream waits for it */
        d->event_record(be, o->ev_after);
        d->to_host_async(be, o->hg, grad, bytes, o->ev_after, in_place ? o->ev_down : NULL);
        if (!in_place)
            d->to_host_async(be, o->hw, param, bytes, o->ev_after, o->ev_down); /* one stream, in order */
        d->event_wait(be, o->ev_down);
    } else {
        d->synchronize(be);
        d->to_host(be, o->hg, grad, bytes);
        if (!in_place)
            d->to_host(be, o->hw, param, bytes);
    }
    bg_backend_t *c = o->cpu;
    if (opt->kind == BG_OPTIM_ADAMW)
        c->ops->adamw(c, w, o->hg, m, v, n, opt->lr, opt->beta1, opt->beta2, opt->eps, wd, t);
    else
        c->ops->sgd_momentum(c, w, o->hg, m, n, opt->lr, opt->momentum, wd);
    if (in_place) {
        o->updates++;
        o->in_place++;
        return BG_OK;
    }
    if (o->ev_up) {
        d->from_host_async(be, param, o->hw, bytes, NULL, o->ev_up);
        d->stream_wait(be, o->ev_up);
    } else {
        d->from_host(be, param, o->hw, bytes);
    }
    o->updates++;
    return BG_OK;
}

bg_optim_store_t bg__offload_optim_store(bg__offload_t *o, int host_step_on)
{
    return (bg_optim_store_t){
        .alloc = store_alloc, .release = store_release, .arg = o, .step = host_step_on ? host_step : NULL};
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
size_t bg__offload_host_updates(const bg__offload_t *o, size_t *in_place_p)
{
    *in_place_p = o ? o->in_place : 0;
    return o ? o->updates : 0;
}

void bg__offload_destroy(bg__offload_t *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->nblocks; i++)
        block_free(o, &o->blocks[i]);
    if (o->dev) {
        const bg_backend_ops_t *d = o->dev->ops;
        if (o->ev_up)
            d->event_wait(o->dev, o->ev_up); /* the last upload reads hw */
        bg_event_t *evs[3] = {o->ev_after, o->ev_down, o->ev_up};
        for (int i = 0; i < 3; i++)
            if (evs[i])
                d->event_destroy(o->dev, evs[i]);
        bg__host_free(o->dev, o->hw);
        bg__host_free(o->dev, o->hg);
        bg_backend_destroy(o->cpu);
    }
    free(o->blocks);
    free(o->dir);
    free(o);
}
