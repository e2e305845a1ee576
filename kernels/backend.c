/* kernels/backend.c: the backend registry and the counted allocator.
 * Backends register in one static array; every allocation passes through
 * bg_backend_alloc so the per-device current/peak counters are exact. */
#include "brigade/backend.h"
#include "brigade/core.h"
#include "kernels/backend_impl.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The compiled-in backends, X(name, init): the registry and the list of
 * names are both constant, built from this one list. "cpu-async" is the CPU
 * backend with emulated streams (cpu/cpu_async.c), for tests of the staging
 * layer. */
#ifdef BG_HAVE_CUDA
#define BG__BACKEND_LIST(X) X("cpu", cpu) X("cpu-async", cpu_async) X("cuda", cuda)
#else
#define BG__BACKEND_LIST(X) X("cpu", cpu) X("cpu-async", cpu_async)
#endif
#define BG__BACKEND_ENTRY(name, fn) {name, bg__##fn##_backend_init},
#define BG__BACKEND_NAME(name, fn) name,

static const bg_backend_entry_t bg__backends[] = {BG__BACKEND_LIST(BG__BACKEND_ENTRY)};
static const char *const bg__backend_names[] = {BG__BACKEND_LIST(BG__BACKEND_NAME) NULL};

const char *const *bg_backend_names(void) { return bg__backend_names; }

/* The slot lists of backend_impl.h are the struct's function slots: each
 * names a member (a misspelt or removed slot does not compile), and a struct
 * of the same fields with one pointer per listed slot has its size (a slot
 * added to the struct but not to a list, or listed twice, fails here). */
#define BG__SLOT_MIRROR(slot) void (*slot)(void);
struct bg__ops_mirror {
    size_t size;
    const char *name;
    int device_buffers;
    BG__BACKEND_OPS(BG__SLOT_MIRROR)
    int attention_max_head;
};
#undef BG__SLOT_MIRROR
_Static_assert(sizeof(struct bg__ops_mirror) == sizeof(bg_backend_ops_t),
               "kernels/backend_impl.h's slot lists and bg_backend_ops_t's function slots differ");

bg_status_t bg__backend_check_ops(const bg_backend_ops_t *ops)
{
#define BG__SLOT_MEMBER(slot) (void)sizeof(ops->slot);
    BG__BACKEND_OPS(BG__SLOT_MEMBER)
#undef BG__SLOT_MEMBER
    const char *name = ops && ops->size >= offsetof(bg_backend_ops_t, name) + sizeof(ops->name) && ops->name
                           ? ops->name : "?";
    if (!ops || ops->size < sizeof(bg_backend_ops_t))
        return bg_error(BG_ERR_MISMATCH, "backend %s: its op table is %zu bytes but this build's bg_backend_ops_t is "
                        "%zu: it was built against an older include/brigade/backend.h (or without "
                        "BG_BACKEND_OPS_INIT); rebuild the backend against this header", name, ops ? ops->size : 0,
                        sizeof(bg_backend_ops_t));
#define BG__REQUIRED(slot)                                                                                         \
    if (!ops->slot)                                                                                                \
        return bg_error(BG_ERR_INVALID, "backend %s: its op table leaves the required slot %s NULL", name, #slot);
    BG__BACKEND_HOST_OPS(BG__REQUIRED)
    BG__BACKEND_KERNEL_OPS(BG__REQUIRED)
#undef BG__REQUIRED
    int events = 0, filled = 0;
#define BG__EVENT(slot) events++, filled += ops->slot != NULL;
    BG__BACKEND_EVENT_OPS(BG__EVENT)
#undef BG__EVENT
    if (filled != 0 && filled != events)
        return bg_error(BG_ERR_INVALID, "backend %s: its op table fills %d of the %d event and stream slots: all or "
                        "none", name, filled, events);
    return BG_OK;
}

bg_status_t bg_backend_create(const char *name, const bg_backend_params_t *params, bg_backend_t **be_p)
{
    bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
    if (params) {
        size_t n = params->size < sizeof(p) ? params->size : sizeof(p);
        memcpy(&p, params, n);
        p.size = sizeof(p);
    }
    if (!name)
        name = bg_config_str("BRIGADE_BACKEND");
    for (size_t i = 0; i < BG_ARRAY_LEN(bg__backends); i++) {
        if (strcmp(bg__backends[i].name, name) != 0)
            continue;
        bg_backend_t *be = calloc(1, sizeof(*be));
        bg_backend_track_t *track = calloc(1, sizeof(*track));
        if (!be || !track) {
            free(be);
            free(track);
            return bg_error(BG_ERR_NOMEM, "cannot allocate backend %s", name);
        }
        pthread_mutex_init(&track->lock, NULL);
        be->track = track;
        be->mem_cap = p.mem_cap;
        if (p.num_threads <= 0) {
            long long nt = 0;
            if (bg_config_int("BRIGADE_NUM_THREADS", &nt) == BG_OK && nt > 0)
                p.num_threads = (int)nt;
        }
        bg_status_t st = bg__backends[i].init(be, &p);
        if (st == BG_OK && (st = bg__backend_check_ops(be->ops)) != BG_OK) {
            /* its impl is freed through the table where the table reaches its destroy slot */
            if (be->ops && be->ops->size >= offsetof(bg_backend_ops_t, destroy) + sizeof(be->ops->destroy) &&
                be->ops->destroy)
                be->ops->destroy(be);
        }
        if (st != BG_OK) {
            pthread_mutex_destroy(&track->lock);
            free(track);
            free(be);
            return st;
        }
        *be_p = be;
        return BG_OK;
    }
    char known[256] = "";
    for (size_t i = 0; i < BG_ARRAY_LEN(bg__backends); i++) {
        strncat(known, i ? ", " : "", sizeof(known) - strlen(known) - 1);
        strncat(known, bg__backends[i].name, sizeof(known) - strlen(known) - 1);
    }
#ifndef BG_HAVE_CUDA
    if (strcmp(name, "cuda") == 0)
        return bg_error(BG_ERR_UNSUPPORTED, "backend \"cuda\" is not compiled in: this build found no CUDA "
                        "toolkit or was configured with -DBG_CUDA=OFF (compiled in: %s)", known);
#endif
    return bg_error(BG_ERR_UNSUPPORTED, "unknown backend \"%s\" (compiled in: %s)", name, known);
}

void bg_backend_destroy(bg_backend_t *be)
{
    if (!be)
        return;
    if (be->mem.count)
        bg_log(BG_LOG_WARN, "kernels", "backend %s destroyed with %zu live allocations (%zu bytes)",
               be->ops->name, be->mem.count, be->mem.current);
    if (be->ops->destroy)
        be->ops->destroy(be);
    pthread_mutex_destroy(&be->track->lock);
    free(be->track->recs);
    free(be->track);
    free(be);
}

/* Sizes are tracked in a side table (not a header in front of the block) so
 * device pointers (CUDA) are counted as well as host ones. */
static bg_status_t bg__track(bg_backend_t *be, void *ptr, size_t bytes)
{
    bg_backend_track_t *t = be->track;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        void *r = realloc(t->recs, cap * sizeof(*t->recs));
        if (!r)
            return BG_ERR_NOMEM;
        t->recs = r;
        t->cap = cap;
    }
    t->recs[t->n].ptr = ptr;
    t->recs[t->n].bytes = bytes;
    t->n++;
    return BG_OK;
}

/* Gives back a reservation of bg_backend_alloc whose allocation did not happen. */
static void unreserve(bg_backend_t *be, size_t bytes)
{
    pthread_mutex_lock(&be->track->lock);
    be->mem.current -= bytes;
    pthread_mutex_unlock(&be->track->lock);
}

void *bg_backend_alloc(bg_backend_t *be, size_t bytes, const char *what)
{
    if (bytes == 0)
        bytes = 1;
    /* the bytes are reserved under the lock first, so threads allocating at once share the cap (if any) */
    pthread_mutex_lock(&be->track->lock);
    size_t cur = be->mem.current;
    int over = be->mem_cap && (bytes > be->mem_cap || cur > be->mem_cap - bytes);
    if (!over)
        be->mem.current += bytes;
    pthread_mutex_unlock(&be->track->lock);
    if (over) {
        bg_error(BG_ERR_NO_FIT, "%s backend memory cap: %zu bytes asked for %s with %zu in use would make %zu, "
                 "above the cap of %zu (--device-mem)", be->ops->name, bytes, what ? what : "a buffer", cur,
                 cur + bytes, be->mem_cap);
        return NULL;
    }
    void *p = be->ops->alloc(be, bytes);
    if (!p) {
        unreserve(be, bytes);
        if (bg_backend_status(be) != BG_OK) { /* a failed device, not a full one */
            char msg[768];
            snprintf(msg, sizeof(msg), "%s", bg_last_error());
            bg_error(BG_ERR_DEVICE, "%s (allocating %zu bytes for %s)", msg, bytes, what ? what : "a buffer");
        } else {
            bg_error(BG_ERR_NOMEM, "%s backend out of memory: %zu bytes asked for %s, %zu bytes free (%zu bytes in "
                     "use by this backend)", be->ops->name, bytes, what ? what : "a buffer", be->ops->device_free(be),
                     be->mem.current);
        }
        return NULL;
    }
    pthread_mutex_lock(&be->track->lock);
    if (bg__track(be, p, bytes) != BG_OK) {
        be->mem.current -= bytes;
        pthread_mutex_unlock(&be->track->lock);
        be->ops->free(be, p);
        bg_error(BG_ERR_NOMEM, "cannot record an allocation of %zu bytes for %s", bytes, what);
        return NULL;
    }
    be->mem.count++;
    if (be->mem.current > be->mem.peak)
        be->mem.peak = be->mem.current;
    pthread_mutex_unlock(&be->track->lock);
    return p;
}

void bg_backend_free(bg_backend_t *be, void *ptr)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&be->track->lock);
    bg_backend_track_t *t = be->track;
    /* search from the end: stashes are freed in roughly LIFO order */
    for (size_t i = t->n; i-- > 0;) {
        if (t->recs[i].ptr == ptr) {
            be->mem.current -= t->recs[i].bytes;
            be->mem.count--;
            t->recs[i] = t->recs[t->n - 1];
            t->n--;
            pthread_mutex_unlock(&be->track->lock);
            be->ops->free(be, ptr);
            return;
        }
    }
    pthread_mutex_unlock(&be->track->lock);
    bg_log(BG_LOG_ERROR, "kernels", "free of a pointer %p not allocated by backend %s", ptr, be->ops->name);
}

int bg__backend_owns(bg_backend_t *be, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    int in = 0;
    pthread_mutex_lock(&be->track->lock);
    for (size_t i = 0; i < be->track->n && !in; i++) {
        uintptr_t lo = (uintptr_t)be->track->recs[i].ptr;
        size_t cap = be->track->recs[i].bytes;
        in = a >= lo && a - lo <= cap && bytes <= cap - (a - lo);
    }
    pthread_mutex_unlock(&be->track->lock);
    return in;
}

bg_memstats_t bg_backend_memstats(const bg_backend_t *be) { return be->mem; }

bg_status_t bg_backend_status(bg_backend_t *be)
{
    if (!be || !be->ops->error)
        return BG_OK;
    char msg[512] = "";
    bg_status_t st = be->ops->error(be, msg, sizeof(msg));
    if (st == BG_OK)
        return BG_OK;
    return bg_error(st, "%s backend: %s", be->ops->name, msg[0] ? msg : bg_status_string(st));
}

void bg_backend_reset_peak(bg_backend_t *be) { be->mem.peak = be->mem.current; }
