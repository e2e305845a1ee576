/* runtime/offload.h: the offload store (--offload optimizer): memory outside
 * the backend's allocator, so outside its cap: host memory, or files under
 * --offload-dir mapped into memory (a CPU "device" under --device-mem, NVMe
 * beside a GPU). See runtime/offload.c. Internal to runtime/. */
#ifndef BG_RUNTIME_OFFLOAD_H
#define BG_RUNTIME_OFFLOAD_H

#include <stddef.h>

#include "brigade/model.h"

typedef struct bg__offload bg__offload_t;

/* A store in host memory (dir NULL or "") or in files under dir (created
 * when missing; checked writable now, naming it). */
bg_status_t bg__offload_create(const char *dir, bg__offload_t **o_p);
/* Frees what is still allocated (its files are gone already: see offload.c). */
void bg__offload_destroy(bg__offload_t *o);
/* The store as a model's optimizer store (bg_model_set_optim_store). host_step 1: with its step (for buffers
 * the host may not address: a device backend's): each update copies the parameters and gradients to pinned
 * host memory on the copy stream, runs the CPU backend's AdamW / SGD there on them and the held state, and
 * copies the parameters back on the copy stream, the compute stream (not the host) waiting for it; parameters
 * in the store itself (--offload params) are stepped in place, only their gradients copied. */
bg_optim_store_t bg__offload_optim_store(bg__offload_t *o, int host_step);
/* Host memory (no directory) from be's host_alloc from now on: page-locked on cuda, so that uploads of the
 * parameter shard from it are asynchronous DMA (--offload params on a device backend). */
void bg__offload_pin(bg__offload_t *o, bg_backend_t *be);
/* Ask the kernel to read every file-backed allocation in ahead (no-op in
 * host memory): the backward runs while the state comes back from disk. */
void bg__offload_prefetch(bg__offload_t *o);
/* Write the file-backed allocations back and drop their pages from memory
 * (msync, MADV_PAGEOUT; no-op in host memory): what a machine short of
 * memory does to them, for measuring the read-ahead (BRIGADE_OFFLOAD_EVICT). */
bg_status_t bg__offload_evict(bg__offload_t *o);
/* Bytes held now and at most so far. */
size_t bg__offload_bytes(const bg__offload_t *o);
size_t bg__offload_peak(const bg__offload_t *o);
/* Updates made by the host-held step so far; *in_place_p: of which on parameters the store holds. */
size_t bg__offload_host_updates(const bg__offload_t *o, size_t *in_place_p);

#endif
