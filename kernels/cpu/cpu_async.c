/* kernels/cpu/cpu_async.c: "cpu-async", the CPU backend with the stream and
 * event slots of the table emulated, for tests of the code that uses them
 * (runtime/staging.c). The kernels are the CPU backend's, run at call time,
 * so the compute stream is the calling thread: an event recorded on it is
 * complete at once, and making it wait for an event (stream_wait) blocks the
 * caller. The copy stream is one worker thread that runs the asynchronous
 * copies in the order queued, each no earlier than BG_CPU_ASYNC_DELAY_US
 * after it was queued, and adversarially: when a copy is queued its
 * destination is filled with 0xff bytes (NaN as floats), and only the worker
 * writes the data, late. A send started before its device-to-host copy
 * completed sends NaN; a kernel that reads a received buffer before its
 * host-to-device copy completed reads NaN. Events are never freed before the
 * backend (destroy only returns them to the backend's list). Not for speed.
 *
 * BRIGADE_DEVICE_CHECK=on (testing only) makes it stand in for a device
 * faithfully: it reports device_buffers (so every device-only path runs:
 * staging, the host-held optimizer step) and the ops that take device
 * pointers (the device side of the copies to and from the host, synchronous
 * or not; copy, fill, scale, axpy, sum, sumsq, the optimizer kernels) refuse
 * a pointer that is not inside one of this backend's live allocations, as a
 * device would fault on a host address: the op is skipped, the first fault
 * is logged and kept (the error slot: bg_backend_status fails the step,
 * the save or the resume that follows), naming the op and the pointer. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "brigade/core.h"
#include "kernels/backend_impl.h"
#include "kernels/cpu/cpu_impl.h"

#define BG_CPU_ASYNC_DELAY_US 200

struct bg_event {
    unsigned long long seq;  /* the latest recording (0: never recorded) */
    unsigned long long done; /* the latest recording completed */
    struct bg_event *next;   /* every event of the backend (freed with it) */
};

typedef struct copy_job {
    void *dst;
    const void *src;
    size_t bytes;
    bg_event_t *after;           /* NULL: none */
    unsigned long long after_seq; /* its recording when the copy was queued */
    bg_event_t *done;            /* NULL: none */
    unsigned long long done_seq;
    double due; /* bg_now() */
    struct copy_job *next;
} copy_job_t;

typedef struct streams {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* a job queued, an event completed, or stop */
    pthread_t worker;
    copy_job_t *head, *tail;
    bg_event_t *events;
    unsigned long long seq;
    int stop;
    char fault[400]; /* BRIGADE_DEVICE_CHECK: the first refused op ("": none) */
} streams_t;

static streams_t *S(bg_backend_t *be) { return bg__cpu_streams(be); }

static int complete_locked(const bg_event_t *ev, unsigned long long seq) { return ev->done >= seq; }

static void *copy_worker(void *arg)
{
    streams_t *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cond, &s->lock);
        if (!s->head)
            break; /* stop, nothing queued */
        copy_job_t *j = s->head;
        while (j->after && !complete_locked(j->after, j->after_seq))
            pthread_cond_wait(&s->cond, &s->lock);
        pthread_mutex_unlock(&s->lock);
        double wait = j->due - bg_now();
        if (wait > 0) {
            struct timespec ts = {0, (long)(wait * 1e9)};
            nanosleep(&ts, NULL);
        }
        if (j->bytes)
            memcpy(j->dst, j->src, j->bytes);
        pthread_mutex_lock(&s->lock);
        if (j->done && j->done->done < j->done_seq)
            j->done->done = j->done_seq;
        s->head = j->next;
        if (!s->head)
            s->tail = NULL;
        free(j);
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static void streams_destroy(void *arg)
{
    streams_t *s = arg;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->worker, NULL); /* runs what is queued first */
    for (bg_event_t *e = s->events, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static bg_event_t *event_create(bg_backend_t *be)
{
    streams_t *s = S(be);
    bg_event_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    pthread_mutex_lock(&s->lock);
    e->next = s->events;
    s->events = e;
    pthread_mutex_unlock(&s->lock);
    return e;
}

static void event_destroy(bg_backend_t *be, bg_event_t *ev) { (void)be, (void)ev; /* freed with the backend */ }

static void event_record(bg_backend_t *be, bg_event_t *ev)
{
    streams_t *s = S(be);
    pthread_mutex_lock(&s->lock); /* the compute stream's work so far is done: complete now */
    ev->seq = ev->done = ++s->seq;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static int event_query(bg_backend_t *be, bg_event_t *ev)
{
    streams_t *s = S(be);
    pthread_mutex_lock(&s->lock);
    int done = complete_locked(ev, ev->seq);
    pthread_mutex_unlock(&s->lock);
    return done;
}

static void event_wait(bg_backend_t *be, bg_event_t *ev)
{
    streams_t *s = S(be);
    pthread_mutex_lock(&s->lock);
    unsigned long long seq = ev->seq;
    while (!complete_locked(ev, seq))
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

/* The compute stream is the caller: it waits. */
static void stream_wait(bg_backend_t *be, bg_event_t *ev) { event_wait(be, ev); }

static void copy_async(bg_backend_t *be, void *dst, const void *src, size_t bytes, bg_event_t *after, bg_event_t *done)
{
    streams_t *s = S(be);
    copy_job_t *j = calloc(1, sizeof(*j));
    if (!j) { /* cannot queue: copy now, after what it must follow */
        if (after)
            event_wait(be, after);
        if (bytes)
            memcpy(dst, src, bytes);
        if (done)
            event_record(be, done);
        return;
    }
    if (bytes)
        memset(dst, 0xff, bytes); /* undefined until done: NaN */
    j->dst = dst;
    j->src = src;
    j->bytes = bytes;
    j->after = after;
    j->done = done;
    j->due = bg_now() + BG_CPU_ASYNC_DELAY_US * 1e-6;
    pthread_mutex_lock(&s->lock);
    if (after)
        j->after_seq = after->seq;
    if (done)
        j->done_seq = done->seq = ++s->seq;
    if (s->tail)
        s->tail->next = j;
    else
        s->head = j;
    s->tail = j;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void to_host_async(bg_backend_t *be, void *dst_host, const void *src, size_t bytes, bg_event_t *after,
                          bg_event_t *done)
{
    copy_async(be, dst_host, src, bytes, after, done);
}

static void from_host_async(bg_backend_t *be, void *dst, const void *src_host, size_t bytes, bg_event_t *after,
                            bg_event_t *done)
{
    copy_async(be, dst, src_host, bytes, after, done);
}

static bg_backend_ops_t bg__cpu_async_ops, bg__cpu_checked_ops;
static pthread_once_t bg__cpu_async_once = PTHREAD_ONCE_INIT;
static const bg_backend_ops_t *bg__cpu_ops_seen;

/* ---- BRIGADE_DEVICE_CHECK ---- */

/* 1 when ptr (bytes) is this backend's memory; else the op is refused: the first refusal kept and logged. */
static int device_ptr(bg_backend_t *be, const char *op, const char *arg, const void *ptr, size_t bytes)
{
    if (bytes == 0 || bg__backend_owns(be, ptr, bytes))
        return 1;
    streams_t *s = S(be);
    pthread_mutex_lock(&s->lock);
    int first = !s->fault[0];
    if (first)
        snprintf(s->fault, sizeof s->fault, "BRIGADE_DEVICE_CHECK: %s refused: its %s %p (%zu bytes) is not in a live "
                 "allocation of this backend (a host pointer where device memory is expected)", op, arg, ptr, bytes);
    pthread_mutex_unlock(&s->lock);
    if (first) /* written once: nothing changes it after */
        bg_log(BG_LOG_ERROR, "kernels", "cpu-async: %s", s->fault);
    return 0;
}

#define DEV(op, arg, p, bytes) device_ptr(be, op, arg, p, bytes)
#define F(n) ((n) * sizeof(float))

static bg_status_t checked_error(bg_backend_t *be, char *msg, size_t len)
{
    streams_t *s = S(be);
    pthread_mutex_lock(&s->lock);
    bg_status_t st = s->fault[0] ? BG_ERR_DEVICE : BG_OK;
    snprintf(msg, len, "%s", s->fault);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static void checked_to_host(bg_backend_t *be, void *dst_host, const void *src, size_t bytes)
{
    if (DEV("to_host", "source", src, bytes))
        bg__cpu_async_ops.to_host(be, dst_host, src, bytes);
}

static void checked_from_host(bg_backend_t *be, void *dst, const void *src_host, size_t bytes)
{
    if (DEV("from_host", "destination", dst, bytes))
        bg__cpu_async_ops.from_host(be, dst, src_host, bytes);
}

static void checked_to_host_async(bg_backend_t *be, void *dst_host, const void *src, size_t bytes, bg_event_t *after,
                                  bg_event_t *done)
{
    if (!DEV("to_host_async", "source", src, bytes))
        src = NULL, bytes = 0; /* the events still complete: a fault, not a hang */
    copy_async(be, dst_host, src, bytes, after, done);
}

static void checked_from_host_async(bg_backend_t *be, void *dst, const void *src_host, size_t bytes,
                                    bg_event_t *after, bg_event_t *done)
{
    if (!DEV("from_host_async", "destination", dst, bytes))
        dst = NULL, bytes = 0;
    copy_async(be, dst, src_host, bytes, after, done);
}

static void checked_copy(bg_backend_t *be, float *dst, const float *src, size_t n)
{
    if (DEV("copy", "destination", dst, F(n)) && DEV("copy", "source", src, F(n)))
        bg__cpu_async_ops.copy(be, dst, src, n);
}

static void checked_fill(bg_backend_t *be, float *x, float value, size_t n)
{
    if (DEV("fill", "buffer", x, F(n)))
        bg__cpu_async_ops.fill(be, x, value, n);
}

static void checked_scale(bg_backend_t *be, float *x, float alpha, size_t n)
{
    if (DEV("scale", "buffer", x, F(n)))
        bg__cpu_async_ops.scale(be, x, alpha, n);
}

static void checked_axpy(bg_backend_t *be, float *y, float alpha, const float *x, size_t n)
{
    if (DEV("axpy", "y", y, F(n)) && DEV("axpy", "x", x, F(n)))
        bg__cpu_async_ops.axpy(be, y, alpha, x, n);
}

static double checked_sum(bg_backend_t *be, const float *x, size_t n)
{
    return DEV("sum", "buffer", x, F(n)) ? bg__cpu_async_ops.sum(be, x, n) : 0.0;
}

static double checked_sumsq(bg_backend_t *be, const float *x, size_t n)
{
    return DEV("sumsq", "buffer", x, F(n)) ? bg__cpu_async_ops.sumsq(be, x, n) : 0.0;
}

static void checked_adamw(bg_backend_t *be, float *param, const float *grad, float *m, float *v, size_t n, float lr,
                          float beta1, float beta2, float eps, float wd, int t)
{
    if (DEV("adamw", "parameters", param, F(n)) && DEV("adamw", "gradients", grad, F(n)) &&
        DEV("adamw", "first moment", m, F(n)) && DEV("adamw", "second moment", v, F(n)))
        bg__cpu_async_ops.adamw(be, param, grad, m, v, n, lr, beta1, beta2, eps, wd, t);
}

static void checked_sgd_momentum(bg_backend_t *be, float *param, const float *grad, float *mom, size_t n, float lr,
                                 float momentum, float wd)
{
    if (DEV("sgd_momentum", "parameters", param, F(n)) && DEV("sgd_momentum", "gradients", grad, F(n)) &&
        DEV("sgd_momentum", "momentum", mom, F(n)))
        bg__cpu_async_ops.sgd_momentum(be, param, grad, mom, n, lr, momentum, wd);
}

#undef DEV
#undef F

/* The CPU's table with the stream slots filled (once: the table is constant). */
static void make_ops(void)
{
    bg__cpu_async_ops = *bg__cpu_ops_seen;
    bg__cpu_async_ops.name = "cpu-async";
#define BG__ASYNC_SLOT(slot) bg__cpu_async_ops.slot = slot;
    BG__BACKEND_EVENT_OPS(BG__ASYNC_SLOT) /* this file's functions of the slots' names */
#undef BG__ASYNC_SLOT
    bg__cpu_checked_ops = bg__cpu_async_ops;
    bg__cpu_checked_ops.device_buffers = 1;
#define BG__CHECKED_SLOT(slot) bg__cpu_checked_ops.slot = checked_##slot;
    BG__CHECKED_SLOT(error) BG__CHECKED_SLOT(to_host) BG__CHECKED_SLOT(from_host) BG__CHECKED_SLOT(to_host_async)
    BG__CHECKED_SLOT(from_host_async) BG__CHECKED_SLOT(copy) BG__CHECKED_SLOT(fill) BG__CHECKED_SLOT(scale)
    BG__CHECKED_SLOT(axpy) BG__CHECKED_SLOT(sum) BG__CHECKED_SLOT(sumsq) BG__CHECKED_SLOT(adamw)
    BG__CHECKED_SLOT(sgd_momentum)
#undef BG__CHECKED_SLOT
}

bg_status_t bg__cpu_async_backend_init(bg_backend_t *be, const bg_backend_params_t *params)
{
    int check_on = 0;
    BG_CHECK(bg_config_on("BRIGADE_DEVICE_CHECK", &check_on));
    BG_CHECK(bg__cpu_backend_init(be, params));
    streams_t *s = calloc(1, sizeof(*s));
    if (!s) {
        be->ops->destroy(be);
        return bg_error(BG_ERR_NOMEM, "out of memory: the cpu-async backend's streams");
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    if (pthread_create(&s->worker, NULL, copy_worker, s) != 0) {
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
        free(s);
        be->ops->destroy(be);
        return bg_error(BG_ERR_INTERNAL, "cpu-async backend: cannot start its copy thread");
    }
    bg__cpu_set_streams(be, s, streams_destroy);
    bg__cpu_ops_seen = be->ops;
    pthread_once(&bg__cpu_async_once, make_ops);
    be->ops = check_on ? &bg__cpu_checked_ops : &bg__cpu_async_ops;
    return BG_OK;
}
