/* runtime/trace.c: per-rank event buffers, clock offsets (NTP-style ping to
 * rank 0, minimum round trip of several), and the merged Chrome trace. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fiber.h"
#include "runtime/trace.h"

#define TRACE_TAG 0x7fffff00u

typedef struct ev {
    char name[16];
    int32_t mb, stage, step, lane; /* lane: of the executor's coroutine pair (core/fiber.h), 0 outside one */
    double t0, t1;
} ev_t;

struct bg_trace {
    bg_comm_t *comm;
    int rank, world;
    double offset; /* add to local times to get rank 0's clock */
    double origin; /* rank 0's time at creation */
    ev_t *ev;
    size_t n, cap;
};

bg_status_t bg__trace_create(bg_comm_t *comm, int rank, bg_trace_t **trace_p)
{
    bg_trace_t *t = calloc(1, sizeof(*t));
    BG_ALLOC_CHECK(t, sizeof(*t), "trace");
    t->comm = comm;
    t->rank = rank;
    t->world = bg_comm_size(comm);
    bg_status_t st = BG_OK;
    enum { ROUNDS = 8 };
    if (rank == 0) {
        for (int r = 1; r < t->world && st == BG_OK; r++)
            for (int k = 0; k < ROUNDS && st == BG_OK; k++) {
                char ping;
                st = bg_recv(comm, r, TRACE_TAG + 1, &ping, 1);
                double now = bg_now();
                if (st == BG_OK)
                    st = bg_send(comm, r, TRACE_TAG + 2, &now, sizeof(now));
            }
        t->origin = bg_now();
    } else {
        double best_rtt = 1e30;
        for (int k = 0; k < ROUNDS && st == BG_OK; k++) {
            char ping = 1;
            double a = bg_now(), remote = 0;
            st = bg_send(comm, 0, TRACE_TAG + 1, &ping, 1);
            if (st == BG_OK)
                st = bg_recv(comm, 0, TRACE_TAG + 2, &remote, sizeof(remote));
            double b = bg_now();
            if (st == BG_OK && b - a < best_rtt) {
                best_rtt = b - a;
                t->offset = remote - (a + b) / 2;
            }
        }
    }
    if (st != BG_OK) {
        free(t);
        return st;
    }
    *trace_p = t;
    return BG_OK;
}

void bg__trace_event(bg_trace_t *t, const char *name, int microbatch, int stage, double t0, double t1, int step)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        ev_t *e = realloc(t->ev, cap * sizeof(*e));
        if (!e)
            return; /* tracing never fails the run: the event is dropped */
        t->ev = e;
        t->cap = cap;
    }
    ev_t *e = &t->ev[t->n++];
    memset(e, 0, sizeof(*e));
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->mb = microbatch;
    e->stage = stage;
    e->step = step;
    e->lane = bg__pair_lane();
    e->t0 = t0 + t->offset;
    e->t1 = t1 + t->offset;
}

static void write_events(FILE *f, int rank, const ev_t *ev, size_t n, double origin, int *first)
{
    /* one process per rank, two tracks in it: compute (tid 0), communication (tid 1) */
    fprintf(f,
            "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"communication\"}}",
            *first ? "" : ",\n", rank, rank, rank, rank);
    *first = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].lane) { /* BRIGADE_TP_OVERLAP=microbatch: the second instruction of a pair has a track of its own */
            fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":2,\"args\":{\"name\":\"compute "
                       "(lane 1)\"}}", rank);
            break;
        }
    for (size_t i = 0; i < n; i++) {
        /* sends, receives, all-reduces ("reduce_grads" included) and --zero's waits (rs_wait, ag_wait) are
         * communication; "step" spans the compute track */
        int comm = (ev[i].name[0] == 's' && strcmp(ev[i].name, "step")) || ev[i].name[0] == 'r' ||
                   !strncmp(ev[i].name, "ar_", 3) || !strncmp(ev[i].name, "ag_", 3);
        const char *cat = comm ? "comm" : "compute";
        /* an instant (zero duration) is drawn as a marker */
        fprintf(f,
                ",\n{\"name\":\"%s%s%d\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                "\"args\":{\"op\":\"%s\",\"microbatch\":%d,\"stage\":%d,\"step\":%d}}",
                ev[i].name, ev[i].mb >= 0 ? " mb" : "", ev[i].mb >= 0 ? ev[i].mb : ev[i].stage, cat, rank,
                comm ? 1 : ev[i].lane ? 2 : 0,
                (ev[i].t0 - origin) * 1e6, (ev[i].t1 - ev[i].t0) * 1e6, ev[i].name, ev[i].mb, ev[i].stage,
                ev[i].step);
    }
}

bg_status_t bg__trace_write(bg_trace_t *t, const char *path, const char *meta_json)
{
    bg_status_t st = BG_OK;
    if (t->rank != 0) {
        uint64_t n = t->n;
        BG_CHECK(bg_send(t->comm, 0, TRACE_TAG + 3, &n, sizeof(n)));
        return bg_send(t->comm, 0, TRACE_TAG + 4, t->ev, t->n * sizeof(ev_t));
    }
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return bg_error(BG_ERR_IO, "cannot write trace %s: %s", tmp, strerror(errno));
    double origin = t->n ? t->ev[0].t0 : 0;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":%s,\"traceEvents\":[\n", meta_json ? meta_json : "{}");
    int first = 1;
    write_events(f, 0, t->ev, t->n, origin, &first);
    for (int r = 1; r < t->world && st == BG_OK; r++) {
        uint64_t n = 0;
        st = bg_recv(t->comm, r, TRACE_TAG + 3, &n, sizeof(n));
        ev_t *ev = st == BG_OK ? malloc(n ? n * sizeof(ev_t) : 1) : NULL;
        if (st == BG_OK && !ev)
            st = bg_error(BG_ERR_NOMEM, "trace of rank %d", r);
        if (st == BG_OK)
            st = bg_recv(t->comm, r, TRACE_TAG + 4, ev, n * sizeof(ev_t));
        if (st == BG_OK)
            write_events(f, r, ev, n, origin, &first);
        free(ev);
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) != 0 && st == BG_OK)
        st = bg_error(BG_ERR_IO, "writing trace %s: %s", tmp, strerror(errno));
    if (st == BG_OK && rename(tmp, path) != 0)
        st = bg_error(BG_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (st != BG_OK)
        unlink(tmp);
    return st;
}

void bg__trace_destroy(bg_trace_t *t)
{
    if (!t)
        return;
    free(t->ev);
    free(t);
}
