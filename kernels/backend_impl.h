/* kernels/backend_impl.h: what backend implementations share with the registry. */
#ifndef BG_KERNELS_BACKEND_IMPL_H
#define BG_KERNELS_BACKEND_IMPL_H

#include <pthread.h>

#include "brigade/backend.h"
#include "core/check.h"

typedef struct bg_backend_track {
    pthread_mutex_t lock;
    struct {
        void *ptr;
        size_t bytes;
    } *recs;
    size_t n, cap;
} bg_backend_track_t;

/* init fills be->ops, be->impl, be->num_threads; returns an error with a message. */
typedef bg_status_t (*bg_backend_init_fn)(bg_backend_t *be, const bg_backend_params_t *params);

typedef struct bg_backend_entry {
    const char *name;
    bg_backend_init_fn init;
} bg_backend_entry_t;

bg_status_t bg__cpu_backend_init(bg_backend_t *be, const bg_backend_params_t *params);
bg_status_t bg__cpu_async_backend_init(bg_backend_t *be, const bg_backend_params_t *params);
#ifdef BG_HAVE_CUDA
bg_status_t bg__cuda_backend_init(bg_backend_t *be, const bg_backend_params_t *params);
#endif

#endif
