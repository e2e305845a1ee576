/* runtime/staging.c: transfers of backend buffers between ranks, staged
 * through host memory when the backend's buffers are device memory (see
 * staging.h). */
#include "runtime/staging.h"

#include <stdlib.h>
#include <string.h>

#include "brigade/core.h"
#include "core/check.h"

typedef enum { XF_SEND, XF_RECV, XF_REDUCE } xf_kind_t;

struct bg__xfer {
    bg__staging_t *sg; /* NULL: direct (one request on the caller's buffer) */
    xf_kind_t kind;
    char *dev;         /* the backend buffer */
    char *host;        /* staging block (staged only) */
    size_t bytes, chunk;
    int n, landed;     /* requests; those whose data are in dev (receive, reduction) */
    int failed;        /* a request failed: keep the host block */
    bg_request_t *rq[]; /* n */
};

const char *bg_executor_device_transport(void)
{
#ifdef BG_UCX_CUDA_DIR
    return "staged through pinned host memory in pipelined chunks (CUDA-aware UCX found at " BG_UCX_CUDA_DIR
           " but not used: brigade links the system UCX)";
#else
    return "staged through pinned host memory in pipelined chunks (no CUDA-aware UCX: libucx-cu13 not found at "
           "configure time)";
#endif
}

bg_status_t bg__staging_init(bg__staging_t *sg, bg_backend_t *be)
{
    memset(sg, 0, sizeof(*sg));
    const char *mode = bg_config_str("BRIGADE_STAGING");
    if (!strcmp(mode, "auto"))
        sg->on = be->ops->device_buffers;
    else if (!strcmp(mode, "always"))
        sg->on = 1;
    else
        return bg_error(BG_ERR_INVALID, "BRIGADE_STAGING=\"%s\": expected auto or always", mode);
    long long kb = 0;
    BG_CHECK(bg_config_int("BRIGADE_STAGE_CHUNK_KB", &kb));
    if (kb < 1 || kb > (1 << 20))
        return bg_error(BG_ERR_INVALID, "BRIGADE_STAGE_CHUNK_KB=%lld: expected 1 to 1048576", kb);
    sg->chunk = (size_t)kb << 10;
    pthread_mutex_init(&sg->lock, NULL);
    sg->be = be; /* ready: bg__staging_fini has work to do */
    return BG_OK;
}

static void host_release(bg__staging_t *sg, void *p)
{
    if (sg->be->ops->host_free)
        sg->be->ops->host_free(sg->be, p);
    else
        free(p);
}

void bg__staging_fini(bg__staging_t *sg)
{
    if (!sg->be)
        return;
    for (int i = 0; i < sg->nfree; i++)
        host_release(sg, sg->free_blocks[i].p);
    free(sg->free_blocks);
    pthread_mutex_destroy(&sg->lock);
    memset(sg, 0, sizeof(*sg));
}

/* A cached block of at least bytes (the smallest that fits), else a new one. */
static void *host_take(bg__staging_t *sg, size_t bytes)
{
    void *p = NULL;
    pthread_mutex_lock(&sg->lock);
    int best = -1;
    for (int i = 0; i < sg->nfree; i++)
        if (sg->free_blocks[i].bytes >= bytes && (best < 0 || sg->free_blocks[i].bytes < sg->free_blocks[best].bytes))
            best = i;
    if (best >= 0) {
        p = sg->free_blocks[best].p;
        sg->free_blocks[best] = sg->free_blocks[--sg->nfree];
    }
    pthread_mutex_unlock(&sg->lock);
    if (p)
        return p;
    size_t sz = bytes ? bytes : 1;
    if (sg->be->ops->host_alloc)
        p = sg->be->ops->host_alloc(sg->be, sz);
    else
        p = aligned_alloc(64, (sz + 63) & ~(size_t)63);
    if (!p) {
        bg_error(BG_ERR_NOMEM, "staging transfers through host memory: %zu bytes asked (%zu held)", sz,
                 sg->host_bytes);
        return NULL;
    }
    pthread_mutex_lock(&sg->lock);
    sg->host_bytes += sz;
    if (sg->host_bytes > sg->host_peak)
        sg->host_peak = sg->host_bytes;
    pthread_mutex_unlock(&sg->lock);
    return p;
}

static void host_give(bg__staging_t *sg, void *p, size_t bytes)
{
    pthread_mutex_lock(&sg->lock);
    if (sg->nfree == sg->capfree) {
        int cap = sg->capfree ? 2 * sg->capfree : 16;
        struct bg__stage_block *b = realloc(sg->free_blocks, (size_t)cap * sizeof(*b));
        if (!b) { /* cannot cache it: give it back */
            sg->host_bytes -= bytes ? bytes : 1;
            pthread_mutex_unlock(&sg->lock);
            host_release(sg, p);
            return;
        }
        sg->free_blocks = b;
        sg->capfree = cap;
    }
    sg->free_blocks[sg->nfree].p = p;
    sg->free_blocks[sg->nfree].bytes = bytes ? bytes : 1;
    sg->nfree++;
    pthread_mutex_unlock(&sg->lock);
}

static bg_status_t xf_new(bg__staging_t *sg, xf_kind_t kind, void *buf, size_t bytes, int n, bg__xfer_t **x_p)
{
    bg__xfer_t *x = calloc(1, sizeof(*x) + (size_t)n * sizeof(bg_request_t *));
    BG_ALLOC_CHECK(x, sizeof(*x), "a transfer");
    x->sg = sg->on ? sg : NULL;
    x->kind = kind;
    x->dev = buf;
    x->bytes = bytes;
    x->chunk = kind == XF_REDUCE ? (bytes ? bytes : 1) : sg->chunk;
    x->n = n;
    if (x->sg && !(x->host = host_take(sg, bytes))) {
        free(x);
        return BG_ERR_NOMEM;
    }
    if (x->sg) {
        pthread_mutex_lock(&sg->lock);
        sg->transfers++;
        sg->chunks += (size_t)n;
        sg->bytes += bytes;
        pthread_mutex_unlock(&sg->lock);
    }
    *x_p = x;
    return BG_OK;
}

static int chunks_of(const bg__staging_t *sg, size_t bytes)
{
    return !sg->on || bytes == 0 ? 1 : (int)((bytes + sg->chunk - 1) / sg->chunk);
}

static size_t chunk_len(const bg__xfer_t *x, int i)
{
    size_t off = (size_t)i * x->chunk;
    return x->bytes - off < x->chunk ? x->bytes - off : x->chunk;
}

bg_status_t bg__xsend(bg__staging_t *sg, bg_comm_t *c, int peer, uint32_t tag, const void *buf, size_t bytes,
                      bg__xfer_t **x_p)
{
    bg__xfer_t *x;
    BG_CHECK(xf_new(sg, XF_SEND, (void *)buf, bytes, chunks_of(sg, bytes), &x));
    bg_backend_t *be = sg->be;
    bg_status_t st = BG_OK;
    for (int i = 0; i < x->n && st == BG_OK; i++) {
        size_t off = (size_t)i * x->chunk, len = chunk_len(x, i);
        if (x->sg) /* chunk i is copied while chunk i-1 is on the wire */
            be->ops->to_host(be, x->host + off, x->dev + off, len);
        st = bg_isend(c, peer, tag, x->sg ? x->host + off : x->dev, x->sg ? len : bytes, &x->rq[i]);
    }
    if (st != BG_OK) {
        x->failed = 1;
        bg__xfree(x);
        return st;
    }
    *x_p = x;
    return BG_OK;
}

bg_status_t bg__xrecv(bg__staging_t *sg, bg_comm_t *c, int peer, uint32_t tag, void *buf, size_t bytes,
                      bg__xfer_t **x_p)
{
    bg__xfer_t *x;
    BG_CHECK(xf_new(sg, XF_RECV, buf, bytes, chunks_of(sg, bytes), &x));
    bg_status_t st = BG_OK;
    for (int i = 0; i < x->n && st == BG_OK; i++) { /* equal tags: chunks match in the order sent */
        size_t off = (size_t)i * x->chunk;
        st = bg_irecv(c, peer, tag, x->sg ? x->host + off : x->dev, x->sg ? chunk_len(x, i) : bytes, &x->rq[i]);
    }
    if (st != BG_OK) {
        x->failed = 1;
        bg__xfree(x);
        return st;
    }
    *x_p = x;
    return BG_OK;
}

bg_status_t bg__xallreduce(bg__staging_t *sg, bg_group_t *g, float *buf, size_t count, bg_reduce_op_t op,
                           bg__xfer_t **x_p)
{
    bg__xfer_t *x;
    size_t bytes = count * sizeof(float);
    /* one collective, as the direct path: the same algorithm and summation order */
    BG_CHECK(xf_new(sg, XF_REDUCE, buf, bytes, 1, &x));
    if (x->sg)
        sg->be->ops->to_host(sg->be, x->host, x->dev, bytes);
    bg_status_t st = bg_group_iallreduce(g, x->sg ? (float *)x->host : buf, count, op, &x->rq[0]);
    if (st != BG_OK) {
        x->failed = 1;
        bg__xfree(x);
        return st;
    }
    *x_p = x;
    return BG_OK;
}

bg_status_t bg__xwrap(bg__staging_t *sg, bg_request_t *rq, bg__xfer_t **x_p)
{
    (void)sg;
    *x_p = NULL;
    if (!rq)
        return BG_OK;
    bg__xfer_t *x = calloc(1, sizeof(*x) + sizeof(bg_request_t *));
    if (!x) {
        bg_request_free(rq);
        return bg_error(BG_ERR_NOMEM, "out of memory: a transfer");
    }
    x->kind = XF_REDUCE; /* direct: x->sg NULL, nothing lands */
    x->n = 1;
    x->rq[0] = rq;
    *x_p = x;
    return BG_OK;
}

/* Request i completed: its data go to the device. */
static void land(bg__xfer_t *x, int i)
{
    if (x->sg && x->kind != XF_SEND) {
        size_t off = (size_t)i * x->chunk;
        x->sg->be->ops->from_host(x->sg->be, x->dev + off, x->host + off, chunk_len(x, i));
    }
    x->landed = i + 1;
}

bg_status_t bg__xtest(bg__xfer_t *x, int *done_p)
{
    while (x->landed < x->n) {
        int done = 0;
        bg_status_t st = bg_test(x->rq[x->landed], &done);
        if (st != BG_OK) {
            x->failed = 1;
            return st;
        }
        if (!done) {
            *done_p = 0;
            return BG_OK;
        }
        land(x, x->landed);
    }
    *done_p = 1;
    return BG_OK;
}

bg_status_t bg__xwait(bg__xfer_t *x)
{
    while (x->landed < x->n) {
        bg_status_t st = bg_wait(x->rq[x->landed]);
        if (st != BG_OK) {
            x->failed = 1;
            return st;
        }
        land(x, x->landed); /* chunk i goes to the device while chunk i+1 arrives */
    }
    return BG_OK;
}

void bg__xfree(bg__xfer_t *x)
{
    if (!x)
        return;
    int pending = x->landed < x->n;
    for (int i = 0; i < x->n; i++)
        bg_request_free(x->rq[i]);
    if (x->host) {
        /* a send that did not complete may still be read by the transport
         * until the comm is destroyed (transport.h): its block stays */
        if (x->kind == XF_SEND && (pending || x->failed))
            bg_log(BG_LOG_DEBUG, "executor", "staging: %zu-byte block of an unfinished send left to the transport",
                   x->bytes);
        else
            host_give(x->sg, x->host, x->bytes);
    }
    free(x);
}
