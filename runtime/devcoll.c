/* runtime/devcoll.c: group collectives on backend buffers, a provider per
 * group (see devcoll.h). NCCL is loaded with dlopen and declared here (the
 * few types and entry points of nccl.h, whose ABI is stable across 2.x), so
 * this file compiles and links without CUDA; it runs only on a backend with
 * a native stream (cuda). */
#include "runtime/devcoll.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/core.h"
#include "core/check.h"

/* ------------------------------------------------------------------ NCCL */

typedef struct {
    char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
} nccl_id_t;
typedef void *nccl_comm_t;
enum { NCCL_FLOAT32 = 7, NCCL_SUM = 0, NCCL_AVG = 4 };

static struct {
    pthread_once_t once;
    void *lib;
    char why[256]; /* why it is not usable ("": usable) */
    int version;
    int (*get_version)(int *);
    int (*get_unique_id)(nccl_id_t *);
    int (*comm_init_rank)(nccl_comm_t *, int, nccl_id_t, int);
    int (*comm_destroy)(nccl_comm_t);
    int (*all_reduce)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    int (*reduce_scatter)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    int (*all_gather)(const void *, void *, size_t, int, nccl_comm_t, void *);
    int (*broadcast)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    const char *(*error_string)(int);
} nccl = {.once = PTHREAD_ONCE_INIT};

static void nccl_load(void)
{
    static const char *const names[] = {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2",
                                        "/usr/local/cuda/lib/libnccl.so.2"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !nccl.lib; i++)
        nccl.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!nccl.lib) {
        snprintf(nccl.why, sizeof(nccl.why), "libnccl.so.2 not found (%s)", dlerror());
        return;
    }
#define NCCL_SYM(field, name)                                                                  \
    do {                                                                                       \
        *(void **)&nccl.field = dlsym(nccl.lib, name);                                         \
        if (!nccl.field) {                                                                     \
            snprintf(nccl.why, sizeof(nccl.why), "libnccl.so.2 has no %s", name);               \
            return;                                                                            \
        }                                                                                      \
    } while (0)
    NCCL_SYM(get_version, "ncclGetVersion");
    NCCL_SYM(get_unique_id, "ncclGetUniqueId");
    NCCL_SYM(comm_init_rank, "ncclCommInitRank");
    NCCL_SYM(comm_destroy, "ncclCommDestroy");
    NCCL_SYM(all_reduce, "ncclAllReduce");
    NCCL_SYM(reduce_scatter, "ncclReduceScatter");
    NCCL_SYM(all_gather, "ncclAllGather");
    NCCL_SYM(broadcast, "ncclBroadcast");
    NCCL_SYM(error_string, "ncclGetErrorString");
#undef NCCL_SYM
    if (nccl.get_version(&nccl.version) != 0 || nccl.version < 21000)
        snprintf(nccl.why, sizeof(nccl.why), "NCCL %d is older than 2.10 (no average reduction)", nccl.version);
}

/* NULL when NCCL can be used, else why not. */
static const char *nccl_unusable(void)
{
    pthread_once(&nccl.once, nccl_load);
    return nccl.why[0] ? nccl.why : NULL;
}

static bg_status_t nccl_check(int r, const char *what)
{
    if (r == 0)
        return BG_OK;
    return bg_error(BG_ERR_TRANSPORT, "NCCL %s failed: %s (%d)", what, nccl.error_string(r), r);
}

/* --------------------------------------------------------------- groups */

struct bg__dcoll {
    bg__staging_t *sg; /* the transfers' staging (&none when the group has no backend) */
    bg__staging_t none;
    bg_group_t *g;
    const char *provider;
    nccl_comm_t nc; /* nccl: the group's communicator */
    void *stream;   /* nccl: the backend's compute stream */
};

static char describe_buf[1024];
static pthread_once_t describe_once = PTHREAD_ONCE_INIT;

static void describe(void)
{
    const char *why = nccl_unusable();
    char nv[64] = "";
    if (!why)
        snprintf(nv, sizeof(nv), "libnccl.so.2 loaded, version %d", nccl.version);
#ifdef BG_UCX_CUDA_DIR
    const char *direct = "where UCX reports CUDA memory at run time (this build links a CUDA-aware UCX)";
#else
    const char *direct = "not with this build's UCX (no CUDA transports; BRIGADE_STAGING=direct forces it in tests)";
#endif
    snprintf(describe_buf, sizeof(describe_buf),
             "  host     host buffers: the transport's collectives in place\n"
             "  staging  device buffers through pinned host memory, the transport's collective on the copy "
             "(bitwise the host results)\n"
             "  direct   gathers on the device buffer, reductions staged: %s\n"
             "  nccl     cuda backend with BRIGADE_COLL=nccl, one GPU per rank: %s\n"
             "  tensor-parallel, data-parallel and ZeRO groups alike would use: cpu host; cpu-async host (staging "
             "with BRIGADE_STAGING=always, direct with =direct); cuda %s%s",
             direct, why ? why : nv,
#ifdef BG_UCX_CUDA_DIR
             "direct where UCX reports CUDA memory, else staging",
#else
             "staging",
#endif
             why ? "" : " (nccl with BRIGADE_COLL=nccl)");
}

const char *bg_executor_collective_providers(void)
{
    pthread_once(&describe_once, describe);
    return describe_buf;
}

/* The provider of a group on sg's backend: nccl when asked for (an error where it cannot run). */
static bg_status_t choose(bg__dcoll_t *dc)
{
    const char *want = bg_config_str("BRIGADE_COLL");
    bg__staging_t *sg = dc->sg;
    dc->provider = !sg->on ? "host" : sg->direct ? "direct" : "staging";
    if (!sg->be || !strcmp(want, "auto")) /* no backend: host buffers (a tensor group not bound yet) */
        return BG_OK;
    if (strcmp(want, "nccl") != 0)
        return bg_error(BG_ERR_INVALID, "BRIGADE_COLL=\"%s\": expected auto or nccl", want);
    const char *why = nccl_unusable();
    bg_backend_t *be = sg->be;
    if (!why && (!be->ops->device_buffers || !be->ops->native_stream))
        why = "the backend has no device stream NCCL can queue on (only cuda has)";
    if (why)
        return bg_error(BG_ERR_UNSUPPORTED, "BRIGADE_COLL=nccl on backend %s: %s", be->ops->name, why);
    dc->stream = be->ops->native_stream(be); /* also makes the backend's device current */
    int n = bg_group_size(dc->g), me = bg_group_rank(dc->g);
    nccl_id_t id;
    memset(&id, 0, sizeof(id));
    if (me == 0)
        BG_CHECK(nccl_check(nccl.get_unique_id(&id), "ncclGetUniqueId"));
    BG_CHECK(bg_group_bcast(dc->g, &id, sizeof(id), BG_U8, 0)); /* over the transport, before any NCCL traffic */
    BG_CHECK(nccl_check(nccl.comm_init_rank(&dc->nc, n, id, me), "ncclCommInitRank"));
    dc->provider = "nccl";
    return BG_OK;
}

bg_status_t bg__dcoll_create(bg__staging_t *sg, bg_group_t *g, const char *what, int log_rank, bg__dcoll_t **dc_p)
{
    bg__dcoll_t *dc = calloc(1, sizeof(*dc));
    BG_ALLOC_CHECK(dc, sizeof(*dc), "a group's collectives");
    dc->sg = sg ? sg : &dc->none; /* none: on = 0, the transport on the caller's buffers */
    dc->g = g;
    bg_status_t st = choose(dc);
    if (st != BG_OK) {
        free(dc);
        return st;
    }
    if (sg && bg_group_size(g) > 1)
        bg_log(BG_LOG_INFO, "executor", "rank %d: collectives of the %s group (%d members): %s", log_rank, what,
               bg_group_size(g), dc->provider);
    *dc_p = dc;
    return BG_OK;
}

void bg__dcoll_destroy(bg__dcoll_t *dc)
{
    if (!dc)
        return;
    if (dc->nc)
        (void)nccl.comm_destroy(dc->nc);
    free(dc);
}

const char *bg__dcoll_provider(const bg__dcoll_t *dc) { return dc->provider; }
bg_group_t *bg__dcoll_group(const bg__dcoll_t *dc) { return dc->g; }

/* The collective queued on the compute stream; 0 when NCCL cannot take it
 * (chunks of unequal sizes, an operation it has no equal of): staged instead. */
static int nccl_start(bg__dcoll_t *dc, bg__coll_kind_t ck, const float *send, float *recv, size_t count,
                      bg_reduce_op_t op, bg_status_t *st_p)
{
    int n = bg_group_size(dc->g), me = bg_group_rank(dc->g);
    int rop = op == BG_REDUCE_SUM ? NCCL_SUM : op == BG_REDUCE_AVG ? NCCL_AVG : -1;
    size_t c = count / (size_t)n; /* a member's chunk of an in-place scatter or gather */
    int equal = count % (size_t)n == 0;
    int r;
    switch (ck) {
    case BG__COLL_ALLREDUCE:
        if (rop < 0)
            return 0;
        r = nccl.all_reduce(recv, recv, count, NCCL_FLOAT32, rop, dc->nc, dc->stream);
        break;
    case BG__COLL_REDUCE_SCATTER_INPLACE: /* NCCL's in place: recv = send + rank * recvcount */
        if (rop < 0 || !equal)
            return 0;
        r = nccl.reduce_scatter(recv, recv + (size_t)me * c, c, NCCL_FLOAT32, rop, dc->nc, dc->stream);
        break;
    case BG__COLL_ALLGATHER_CHUNKS:
        if (!equal)
            return 0;
        r = nccl.all_gather(recv + (size_t)me * c, recv, c, NCCL_FLOAT32, dc->nc, dc->stream);
        break;
    case BG__COLL_ALLGATHER:
        r = nccl.all_gather(send, recv, count, NCCL_FLOAT32, dc->nc, dc->stream);
        break;
    default:
        if (rop < 0)
            return 0;
        r = nccl.reduce_scatter(send, recv, count, NCCL_FLOAT32, rop, dc->nc, dc->stream);
        break;
    }
    *st_p = nccl_check(r, "collective");
    return 1;
}

bg_status_t bg__dcoll_start(bg__dcoll_t *dc, bg__coll_kind_t ck, const float *send, float *recv, size_t count,
                            bg_reduce_op_t op, bg__xfer_t **x_p)
{
    if (dc->nc) {
        bg_status_t st = BG_OK;
        if (nccl_start(dc, ck, send, recv, count, op, &st)) {
            BG_CHECK(st);
            return bg__xdone(dc->sg, x_p); /* ordered on the compute stream: nothing for the host to wait for */
        }
    }
    return bg__xcoll(dc->sg, dc->g, ck, send, recv, count, op, x_p);
}

bg_status_t bg__dcoll_start_host(bg__dcoll_t *dc, bg__coll_kind_t ck, const float *send, float *recv, size_t count,
                                 bg_reduce_op_t op, bg__xfer_t **x_p)
{
    return bg__xcoll(&dc->none, dc->g, ck, send, recv, count, op, x_p); /* none: on = 0, nothing staged */
}

bg_status_t bg__dcoll_bcast(bg__dcoll_t *dc, float *buf, size_t count, int root)
{
    if (dc->nc)
        return nccl_check(nccl.broadcast(buf, buf, count, NCCL_FLOAT32, root, dc->nc, dc->stream), "ncclBroadcast");
    return bg__xbcast(dc->sg, dc->g, buf, count, root);
}
