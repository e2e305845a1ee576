/* runtime/strat_offload.c: --offload optimizer|params (docs/offload.md). Every
 * chunk's optimizer state (the model's, or a --zero 1|2 replica's shard,
 * which runtime/zero.c allocates through the same model store) lives in an
 * offload store (runtime/offload.c): host memory, or memory-mapped files
 * under --offload-dir. None of it counts against the backend's cap
 * (--device-mem), and the executor's prediction leaves it out.
 * --offload params (with --zero 3 over dp >= 2): each chunk's parameter
 * shard (runtime/zero_params.c) comes from the same store (chunk_t's
 * param_store); the gathers copy from it into their device buffers.
 *
 * The optimizer step itself is unchanged: the backend's AdamW/SGD kernel,
 * bucket by bucket as the reductions finish (bg__exec_optimizer_step, or
 * ZeRO's), on the same elements in the same order, so the weights are those
 * of no offload bit for bit. On a backend whose buffers the host may not
 * address (device_buffers: cuda; BRIGADE_OFFLOAD_STEP=host forces it on
 * cpu-async for tests) the store's step runs instead: each update's
 * parameters and gradients copied to pinned host memory on the copy stream,
 * the CPU backend's AdamW/SGD there on the host-held state, the parameters
 * copied back, the compute stream waiting for them (runtime/offload.c).
 * --offload params there (with --offload optimizer: the shard is stepped on
 * the host beside its state) keeps the shard in page-locked host memory (or
 * the files); each gather uploads the owned chunk on the copy stream
 * (runtime/zero_params.c) and the step updates it in place, only the
 * gradients copied down. Checkpoints read and write the state where it lives
 * (bg_model_optim_on_host: memcpy, ZeRO's gathers of it on the host, never
 * the backend's copies or kernels; the parameter shard through materialize's
 * uploads), so they need nothing here. With files, the state is read ahead
 * (madvise) when the last microbatch's backward of a chunk begins, so the
 * disk reads overlap that backward instead of stalling the update.
 *
 * It must not touch the interpreter's slots or the reductions. */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "runtime/exec_impl.h"
#include "runtime/offload.h"

typedef struct {
    bg__offload_t *store;
    bg_optim_store_t ops;
    int64_t prefetched; /* the step whose read-ahead was asked */
    int prefetch, evict; /* BRIGADE_OFFLOAD_PREFETCH, BRIGADE_OFFLOAD_EVICT */
} offload_t;

static int offload_active(const exec_t *x) { return (x->p.offload & (BG_OFFLOAD_OPTIMIZER | BG_OFFLOAD_PARAMS)) != 0; }

/* The host-held step (bg__offload_optim_store): on a backend whose buffers the host may not address, or
 * forced by BRIGADE_OFFLOAD_STEP=host (tests: cpu-async standing in for cuda). */
static bg_status_t host_step_on(const exec_t *x, int *on_p)
{
    const char *v = bg_config_str("BRIGADE_OFFLOAD_STEP");
    if (v && strcmp(v, "auto") && strcmp(v, "host"))
        return bg_error(BG_ERR_INVALID, "BRIGADE_OFFLOAD_STEP=%s: expected auto or host", v);
    *on_p = x->be->ops->device_buffers || (v && !strcmp(v, "host"));
    if (*on_p && (x->p.offload & BG_OFFLOAD_PARAMS) && !(x->p.offload & BG_OFFLOAD_OPTIMIZER))
        return bg_error(BG_ERR_UNSUPPORTED, "--offload params without optimizer on backend %s: its buffers are "
                        "device memory%s, so the host-held parameter shard is stepped on the host, where its "
                        "optimizer state must be too: --offload optimizer,params", x->be->ops->name,
                        x->be->ops->device_buffers ? "" : " (as BRIGADE_OFFLOAD_STEP=host treats them)");
    return BG_OK;
}

static bg_status_t offload_setup(exec_t *x, void **self_p)
{
    int host_step = 0;
    BG_CHECK(host_step_on(x, &host_step));
    if (x->lay.servers > 0)
        return bg_error(BG_ERR_INVALID, "--offload optimizer with --ps: the servers hold the optimizer state; "
                                        "leave --offload out");
    int prefetch = 1, evict = 0;
    BG_CHECK(bg_config_on("BRIGADE_OFFLOAD_PREFETCH", &prefetch));
    BG_CHECK(bg_config_on("BRIGADE_OFFLOAD_EVICT", &evict));
    offload_t *o = calloc(1, sizeof(*o));
    BG_ALLOC_CHECK(o, sizeof(*o), "offload strategy");
    o->prefetch = prefetch;
    o->evict = evict;
    bg_status_t st = bg__offload_create(x->p.offload_dir, &o->store);
    if (st != BG_OK) {
        free(o);
        return st;
    }
    if (host_step && (x->p.offload & BG_OFFLOAD_PARAMS))
        bg__offload_pin(o->store, x->be); /* the shard's uploads from page-locked memory: asynchronous */
    o->ops = bg__offload_optim_store(o->store, host_step);
    o->prefetched = -1;
    *self_p = o;
    return BG_OK;
}

/* Before any optimizer state or parameter shard exists (chunk_optim, ZeRO's included). */
static bg_status_t offload_chunk_made(exec_t *x, void *self, chunk_t *ch)
{
    offload_t *o = self;
    if (x->p.offload & BG_OFFLOAD_PARAMS)
        ch->param_store = &o->ops;
    return x->p.offload & BG_OFFLOAD_OPTIMIZER ? bg_model_set_optim_store(ch->model, &o->ops) : BG_OK;
}

/* BRIGADE_OFFLOAD_EVICT: the state leaves memory before the step (benchmarks). */
static bg_status_t offload_step_begin(exec_t *x, void *self)
{
    (void)x;
    offload_t *o = self;
    return o->evict ? bg__offload_evict(o->store) : BG_OK;
}

/* The last microbatch's first backward on this rank: read the state ahead
 * while the backwards run (files only; host memory is there already). */
static bg_status_t offload_before_compute(exec_t *x, void *self, chunk_t *ch, int mb, bg_sched_op_kind_t kind)
{
    offload_t *o = self;
    if (o->prefetch && mb == ch->mb_last && kind != BG_OP_FORWARD && o->prefetched != x->step) {
        o->prefetched = x->step;
        bg__offload_prefetch(o->store);
    }
    return BG_OK;
}

/* Offloaded state is not the backend's memory (an offloaded parameter shard is left out by ZeRO's count). */
static void offload_memory(exec_t *x, void *self, size_t *param_bytes, size_t *optim_elems, size_t *grad_bytes)
{
    (void)self, (void)param_bytes, (void)grad_bytes;
    if (x->p.offload & BG_OFFLOAD_OPTIMIZER)
        *optim_elems = 0;
}

/* After ZeRO's destroy (registered before this one): the models' state back, then the store. */
static void offload_destroy(exec_t *x, void *self)
{
    offload_t *o = self;
    if (!o)
        return;
    for (int v = 0; x->chunks && v < x->V; v++)
        if (x->chunks[v].model) {
            bg_model_optim_free(x->chunks[v].model);
            (void)bg_model_set_optim_store(x->chunks[v].model, NULL);
        }
    bg_log(BG_LOG_INFO, "offload", "rank %d: %zu bytes of offloaded state at most in %s", x->lay.rank,
           bg__offload_peak(o->store), x->p.offload_dir && *x->p.offload_dir ? x->p.offload_dir : "host memory");
    size_t in_place = 0, updates = bg__offload_host_updates(o->store, &in_place);
    if (o->ops.step)
        bg_log(BG_LOG_INFO, "offload", "rank %d: host-held step: %zu updates on the host, %zu of them in place "
               "on the host-held parameter shard (the gradients copied from backend %s; for the others the "
               "parameters too, and back)", x->lay.rank, updates, in_place, x->be->ops->name);
    bg__offload_destroy(o->store);
    free(o);
}

const bg__strategy_ops_t bg__strategy_offload = {
    .name = "offload",
    .active = offload_active,
    .setup = offload_setup,
    .chunk_made = offload_chunk_made,
    .step_begin = offload_step_begin,
    .before_compute = offload_before_compute,
    .memory = offload_memory,
    .destroy = offload_destroy,
};
