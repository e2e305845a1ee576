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

/* The slots of bg_backend_ops_t (include/brigade/backend.h), X(slot), by
 * who must fill them. Every backend's table is written from these lists
 * (X defined as `.slot = prefix_slot,`), and bg__backend_check_ops checks a
 * table against them; kernels/backend.c asserts at compile time that they
 * name every function slot of the struct, each once.
 *   HOST    required; the CUDA backend implements them on the host (the
 *           runtime API, cuBLAS, reductions read back)
 *   KERNEL  required; device kernels (CUDA: kernels/cuda/cuda_kernels.cu)
 *   EVENT   optional, all or none: a backend that queues work
 *   MEMORY  optional: page-locked host memory, the device's PCI bus id
 *   FUSED   optional: NULL, the layers run the unfused pair
 *   LLAMA   optional: NULL, the RMSNorm, SwiGLU and rotary attention layers refuse the backend
 *   STATUS  optional: NULL, the backend's ops cannot fail
 *   COLL    optional: NULL, no collective library queues on the backend's stream (NCCL: cuda only)
 *   CP      optional: NULL, context parallelism (--cp > 1) refuses the backend
 * destroy is optional too (NULL: impl needs no freeing). */
#define BG__BACKEND_HOST_OPS(X)                                                                                    \
    X(alloc) X(free) X(to_host) X(from_host) X(synchronize) X(copy) X(gemm) X(gemm_strided_batched) X(sum)         \
    X(sumsq) X(device_free)
#define BG__BACKEND_KERNEL_OPS(X)                                                                                  \
    X(fill) X(scale) X(axpy) X(residual_forward) X(bias_forward) X(bias_backward) X(gelu_forward) X(gelu_backward) \
    X(relu_forward) X(relu_backward) X(layernorm_forward) X(layernorm_backward_input)                            \
    X(layernorm_backward_weight) X(softmax_forward) X(softmax_backward) X(causal_softmax_forward)                 \
    X(causal_softmax_backward) X(crossentropy_forward) X(crossentropy_backward) X(embedding_forward)              \
    X(embedding_backward) X(qkv_split) X(qkv_merge) X(heads_merge) X(heads_split) X(adamw) X(sgd_momentum)        \
    X(attention_forward) X(attention_backward) X(convert)
#define BG__BACKEND_EVENT_OPS(X)                                                                                   \
    X(event_create) X(event_destroy) X(event_record) X(event_query) X(event_wait) X(stream_wait) X(to_host_async) \
    X(from_host_async)
#define BG__BACKEND_MEMORY_OPS(X) X(host_alloc) X(host_free) X(pci_bus_id)
#define BG__BACKEND_FUSED_OPS(X) X(bias_gelu_forward) X(gelu_bias_backward)
#define BG__BACKEND_LLAMA_OPS(X)                                                                                   \
    X(rmsnorm_forward) X(rmsnorm_backward_input) X(rmsnorm_backward_weight) X(swiglu_forward) X(swiglu_backward)  \
    X(rope) X(gqa_expand) X(gqa_reduce)
#define BG__BACKEND_STATUS_OPS(X) X(error)
#define BG__BACKEND_COLL_OPS(X) X(native_stream)
#define BG__BACKEND_CP_OPS(X) X(attention_block_forward) X(attention_block_backward)
#define BG__BACKEND_GQA_OPS(X) X(gqa_attention_forward) X(gqa_attention_backward)
/* every function slot */
#define BG__BACKEND_OPS(X)                                                                                         \
    X(destroy) BG__BACKEND_HOST_OPS(X) BG__BACKEND_KERNEL_OPS(X) BG__BACKEND_EVENT_OPS(X) BG__BACKEND_MEMORY_OPS(X) \
    BG__BACKEND_FUSED_OPS(X) BG__BACKEND_LLAMA_OPS(X) BG__BACKEND_STATUS_OPS(X) BG__BACKEND_COLL_OPS(X)       \
    BG__BACKEND_CP_OPS(X) BG__BACKEND_GQA_OPS(X)

/* BG_OK when ops can run in this build: its size is this build's
 * sizeof(bg_backend_ops_t) or more (a table built against an older header,
 * without the slots appended since, is refused: BG_ERR_MISMATCH), every
 * required slot is filled and the event slots are all filled or all NULL
 * (BG_ERR_INVALID). The message names the backend and the slot.
 * bg_backend_create checks every table its backend's init sets. */
bg_status_t bg__backend_check_ops(const bg_backend_ops_t *ops);

/* 1 when [p, p + bytes) lies inside one live allocation of be (bg_backend_alloc's records). */
int bg__backend_owns(bg_backend_t *be, const void *p, size_t bytes);

bg_status_t bg__cpu_backend_init(bg_backend_t *be, const bg_backend_params_t *params);
bg_status_t bg__cpu_async_backend_init(bg_backend_t *be, const bg_backend_params_t *params);
#ifdef BG_HAVE_CUDA
bg_status_t bg__cuda_backend_init(bg_backend_t *be, const bg_backend_params_t *params);
#endif

#endif
