/* tests/runtime/test_staging_unit.c: the staging layer (runtime/staging.c) in
 * one process, on a world of one (sends to itself): which backends get the
 * streams path, the all-or-none rule of the stream slots, the direct path
 * (device buffers handed to the transport, gated by events), and that a host
 * block a host-to-device copy still reads is not handed out again before
 * the copy completes (a backend whose compute stream does not wait, so the
 * copy is still in flight when the transfer is freed), also for a receive
 * cancelled after some of its chunks landed; cpu-async's device checker
 * (BRIGADE_DEVICE_CHECK=on): its own buffers pass, a host pointer or a range
 * past an allocation's end is refused (the op skipped, the fault named). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "runtime/staging.h"

static bg_comm_t *comm;

static int setup(void **state)
{
    (void)state;
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    p.rank = 0;
    p.world_size = 1;
    return bg_comm_create(&p, &comm) == BG_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return bg_comm_destroy(comm) == BG_OK ? 0 : -1;
}

static bg_backend_t *mkbe(const char *name)
{
    bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
    p.num_threads = 1;
    bg_backend_t *be = NULL;
    assert_int_equal(bg_backend_create(name, &p, &be), BG_OK);
    return be;
}

static void test_modes(void **state)
{
    (void)state;
    bg__staging_t sg;
    bg_backend_t *cpu = mkbe("cpu"), *as = mkbe("cpu-async");
    setenv("BRIGADE_STAGING", "auto", 1);
    assert_int_equal(bg__staging_init(&sg, as, comm), BG_OK); /* host buffers: direct, streams or not */
    assert_int_equal(sg.on, 0);
    assert_int_equal(sg.direct, 0);
    assert_int_equal(sg.async, 0);
    bg__staging_fini(&sg);
    setenv("BRIGADE_STAGING", "always", 1);
    assert_int_equal(bg__staging_init(&sg, as, NULL), BG_OK);
    assert_int_equal(sg.on, 1);
    assert_int_equal(sg.async, 1);
    bg__staging_fini(&sg);
    assert_int_equal(bg__staging_init(&sg, cpu, NULL), BG_OK); /* no stream slots: synchronous copies */
    assert_int_equal(sg.on, 1);
    assert_int_equal(sg.async, 0);
    bg__staging_fini(&sg);
    /* a table with 7 of the 8 slots is refused, by name */
    bg_backend_ops_t part = *as->ops;
    part.stream_wait = NULL;
    const bg_backend_ops_t *keep = as->ops;
    as->ops = &part;
    assert_int_equal(bg__staging_init(&sg, as, NULL), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "backend cpu-async fills 7 of the 8 stream and event slots"));
    as->ops = keep;
    unsetenv("BRIGADE_STAGING");
    bg_backend_destroy(as);
    bg_backend_destroy(cpu);
}

static void no_wait(bg_backend_t *be, bg_event_t *ev) { (void)be, (void)ev; }

/* Send n floats to itself through the streams path, receive them into dev. */
static void self_transfer(bg__staging_t *sg, const float *src, float *dev, size_t n, uint32_t tag)
{
    bg__xfer_t *rx = NULL, *tx = NULL;
    assert_int_equal(bg__xrecv(sg, comm, 0, tag, dev, n * sizeof(float), &rx), BG_OK);
    assert_int_equal(bg__xsend(sg, comm, 0, tag, src, n * sizeof(float), &tx), BG_OK);
    assert_int_equal(bg__xwait(tx), BG_OK);
    assert_int_equal(bg__xwait(rx), BG_OK);
    bg__xfree(tx);
    bg__xfree(rx);
}

static void test_held_block(void **state)
{
    (void)state;
    setenv("BRIGADE_STAGING", "always", 1);
    setenv("BRIGADE_STAGE_CHUNK_KB", "1", 1);
    bg_backend_t *be = mkbe("cpu-async");
    bg_backend_ops_t ops = *be->ops; /* the compute stream does not wait: the copy is in flight at free */
    ops.stream_wait = no_wait;
    const bg_backend_ops_t *keep = be->ops;
    be->ops = &ops;
    bg__staging_t sg;
    assert_int_equal(bg__staging_init(&sg, be, NULL), BG_OK);
    const size_t n = 1000; /* 4 chunks of 1 KiB */
    float *src = bg_backend_alloc(be, n * sizeof(float), "src"), *dev = bg_backend_alloc(be, n * sizeof(float), "dev");
    for (size_t i = 0; i < n; i++)
        src[i] = (float)i + 0.5f;
    self_transfer(&sg, src, dev, n, 7);
    /* freed before its copy to dev completed (200 us late): held, not cached */
    assert_int_equal(sg.nheld, 1);
    int cached = sg.nfree;
    /* the receive's block holds exactly the bytes of the transfer; taking
     * one of that size now must not give it (it would be overwritten while
     * the copy still reads it): a second transfer runs meanwhile */
    for (size_t i = 0; i < n; i++)
        src[i] = -(float)i;
    float *dev2 = bg_backend_alloc(be, n * sizeof(float), "dev2");
    self_transfer(&sg, src, dev2, n, 8);
    bg__staging_fini(&sg); /* waits for the copies still held */
    for (size_t i = 0; i < n; i++) {
        if (dev[i] != (float)i + 0.5f || dev2[i] != -(float)i)
            fail_msg("element %zu: %g and %g, expected %g and %g", i, dev[i], dev2[i], (float)i + 0.5f, -(float)i);
    }
    assert_true(cached >= 1); /* the send's block went back to the cache at once */
    be->ops = keep;
    bg_backend_free(be, dev2);
    bg_backend_free(be, dev);
    bg_backend_free(be, src);
    bg_backend_destroy(be);
    unsetenv("BRIGADE_STAGING");
    unsetenv("BRIGADE_STAGE_CHUNK_KB");
}

/* A receive freed (cancelled) after some of its chunks landed: their
 * host-to-device copies still read the host block, so it must not be handed
 * out again before they complete. The sender is a synchronous staging on
 * the CPU backend (its chunks leave at once); the receiver's compute stream
 * does not wait (its copies are in flight when it is freed); a staged send
 * taken right after fills its block with NaN at once (cpu-async), which the
 * cancelled receive's copies would then write to dev. */
static void test_cancelled_recv(void **state)
{
    (void)state;
    setenv("BRIGADE_STAGING", "always", 1);
    setenv("BRIGADE_STAGE_CHUNK_KB", "1", 1);
    bg_backend_t *be = mkbe("cpu-async"), *cpu = mkbe("cpu");
    bg_backend_ops_t ops = *be->ops;
    ops.stream_wait = no_wait;
    const bg_backend_ops_t *keep = be->ops;
    be->ops = &ops;
    bg__staging_t sg, tx_sg;
    assert_int_equal(bg__staging_init(&sg, be, NULL), BG_OK);
    assert_int_equal(bg__staging_init(&tx_sg, cpu, NULL), BG_OK);
    assert_true(sg.async && !tx_sg.async);
    const size_t n = 1000, part = 512; /* 4 chunks of 1 KiB posted; 2 sent */
    float *src = bg_backend_alloc(cpu, n * sizeof(float), "src"), *dev = bg_backend_alloc(be, n * sizeof(float), "dev");
    for (size_t i = 0; i < n; i++)
        src[i] = (float)i + 0.75f;
    bg__xfer_t *rx = NULL, *tx = NULL, *rx2 = NULL, *tx2 = NULL;
    assert_int_equal(bg__xrecv(&sg, comm, 0, 13, dev, n * sizeof(float), &rx), BG_OK);
    assert_int_equal(bg__xsend(&tx_sg, comm, 0, 13, src, part * sizeof(float), &tx), BG_OK);
    assert_int_equal(bg__xwait(tx), BG_OK);
    for (int k = 0; k < 64; k++) { /* lands the two chunks (never all four) */
        int done = 1;
        assert_int_equal(bg__xtest(rx, &done), BG_OK);
        assert_false(done);
    }
    bg__xfree(rx); /* cancelled: chunks 2 and 3 never come */
    /* a staged send of the same size right away: it must not get the block the copies read */
    float *dev2 = bg_backend_alloc(cpu, n * sizeof(float), "dev2");
    assert_int_equal(bg__xsend(&sg, comm, 0, 14, src, n * sizeof(float), &tx2), BG_OK);
    assert_int_equal(bg__xrecv(&tx_sg, comm, 0, 14, dev2, n * sizeof(float), &rx2), BG_OK);
    assert_int_equal(bg__xwait(tx2), BG_OK);
    assert_int_equal(bg__xwait(rx2), BG_OK);
    bg__xfree(tx2);
    bg__xfree(rx2);
    bg__xfree(tx);
    bg__staging_fini(&sg); /* waits for the copies still held */
    bg__staging_fini(&tx_sg);
    for (size_t i = 0; i < part; i++)
        if (dev[i] != src[i])
            fail_msg("element %zu of the landed chunks: %g, expected %g", i, dev[i], src[i]);
    assert_memory_equal(dev2, src, n * sizeof(float));
    be->ops = keep;
    bg_backend_free(cpu, dev2);
    bg_backend_free(be, dev);
    bg_backend_free(cpu, src);
    bg_backend_destroy(be);
    bg_backend_destroy(cpu);
    unsetenv("BRIGADE_STAGING");
    unsetenv("BRIGADE_STAGE_CHUNK_KB");
}

/* The group collectives on backend buffers (bg__xcoll, bg__xbcast), on a group of one: every kind
 * through the synchronous and the streams paths, staged and direct, gives its input back (a result read
 * before its copy completed is NaN on cpu-async), and the direct path hands over the gather in chunks
 * only. The members' slots of a larger group are test_staging's (tp 2 with sequence parallelism). */
static void test_collectives(void **state)
{
    (void)state;
    int me = 0;
    bg_group_t *g = NULL;
    assert_int_equal(bg_group_create(comm, 1, &me, &g), BG_OK);
    const char *modes[] = {"always", "direct"}, *names[] = {"cpu", "cpu-async"};
    const size_t n = 777;
    for (int m = 0; m < 2; m++) {
        for (int k = 0; k < 2; k++) {
            setenv("BRIGADE_STAGING", modes[m], 1);
            bg_backend_t *be = mkbe(names[k]);
            bg__staging_t sg;
            assert_int_equal(bg__staging_init(&sg, be, comm), BG_OK);
            float *src = bg_backend_alloc(be, n * sizeof(float), "src");
            float *dst = bg_backend_alloc(be, n * sizeof(float), "dst");
            for (bg__coll_kind_t ck = BG__COLL_ALLREDUCE; ck <= BG__COLL_REDUCE_SCATTER; ck++) {
                for (size_t i = 0; i < n; i++)
                    src[i] = 0.5f + (float)i + 1000.0f * (float)ck, dst[i] = -7.0f;
                int inplace = ck != BG__COLL_ALLGATHER && ck != BG__COLL_REDUCE_SCATTER;
                bg__xfer_t *x = NULL;
                assert_int_equal(bg__xcoll(&sg, g, ck, inplace ? NULL : src, inplace ? src : dst, n, BG_REDUCE_SUM,
                                           &x),
                                 BG_OK);
                assert_int_equal(bg__xwait(x), BG_OK);
                bg__xfree(x);
                const float *out = inplace ? src : dst;
                for (size_t i = 0; i < n; i++)
                    if (out[i] != 0.5f + (float)i + 1000.0f * (float)ck)
                        fail_msg("%s, %s, kind %d, element %zu: %g", modes[m], names[k], (int)ck, i, out[i]);
            }
            for (size_t i = 0; i < n; i++)
                src[i] = (float)i;
            assert_int_equal(bg__xbcast(&sg, g, src, n, 0), BG_OK);
            for (size_t i = 0; i < n; i++)
                assert_true(src[i] == (float)i);
            /* the direct provider hands the gather in chunks over; the staged one copies every collective */
            assert_int_equal(sg.direct_transfers, m == 1 ? 1 : 0);
            assert_int_equal(sg.transfers, m == 1 ? 4 : 5);
            bg__staging_fini(&sg);
            bg_backend_free(be, dst);
            bg_backend_free(be, src);
            bg_backend_destroy(be);
        }
    }
    unsetenv("BRIGADE_STAGING");
    bg_group_destroy(g);
}

/* The streams path and the synchronous one move the same bytes. */
static void test_equal_paths(void **state)
{
    (void)state;
    setenv("BRIGADE_STAGING", "always", 1);
    setenv("BRIGADE_STAGE_CHUNK_KB", "1", 1);
    const size_t n = 3333; /* a partial last chunk */
    float *out[2];
    const char *names[2] = {"cpu", "cpu-async"};
    for (int k = 0; k < 2; k++) {
        bg_backend_t *be = mkbe(names[k]);
        bg__staging_t sg;
        assert_int_equal(bg__staging_init(&sg, be, NULL), BG_OK);
        assert_int_equal(sg.async, k);
        float *src = bg_backend_alloc(be, n * sizeof(float), "src");
        float *dev = bg_backend_alloc(be, n * sizeof(float), "dev");
        for (size_t i = 0; i < n; i++)
            src[i] = sinf((float)i);
        self_transfer(&sg, src, dev, n, 9);
        out[k] = malloc(n * sizeof(float));
        memcpy(out[k], dev, n * sizeof(float)); /* read after the compute stream waited */
        bg__staging_fini(&sg);
        bg_backend_free(be, dev);
        bg_backend_free(be, src);
        bg_backend_destroy(be);
    }
    assert_memory_equal(out[0], out[1], n * sizeof(float));
    free(out[0]);
    free(out[1]);
    unsetenv("BRIGADE_STAGING");
    unsetenv("BRIGADE_STAGE_CHUNK_KB");
}

/* BRIGADE_STAGING=direct (the path of a CUDA-aware transport): sends and receives on the backend's buffer
 * itself, in the staged path's chunks, none started before its event completes. A backend whose events
 * stay incomplete while `gate_closed` holds: nothing may move until the gate opens. */
static const bg_backend_ops_t *gate_base;
static int gate_closed;
static int gate_query(bg_backend_t *be, bg_event_t *ev) { return !gate_closed && gate_base->event_query(be, ev); }

static void test_direct(void **state)
{
    (void)state;
    setenv("BRIGADE_STAGING", "direct", 1);
    setenv("BRIGADE_STAGE_CHUNK_KB", "1", 1);
    bg_backend_t *be = mkbe("cpu-async");
    bg_backend_ops_t ops = *be->ops;
    gate_base = be->ops;
    ops.event_query = gate_query;
    be->ops = &ops;
    bg__staging_t sg;
    assert_int_equal(bg__staging_init(&sg, be, comm), BG_OK);
    assert_true(sg.on && sg.direct && sg.async);
    const size_t n = 1000; /* 4 chunks of 1 KiB */
    float *src = bg_backend_alloc(be, n * sizeof(float), "src"), *dev = bg_backend_alloc(be, n * sizeof(float), "dev");
    for (size_t i = 0; i < n; i++)
        src[i] = (float)i + 0.25f, dev[i] = -1.0f;
    gate_closed = 1;
    bg__xfer_t *rx = NULL, *tx = NULL;
    assert_int_equal(bg__xrecv(&sg, comm, 0, 11, dev, n * sizeof(float), &rx), BG_OK);
    assert_int_equal(bg__xsend(&sg, comm, 0, 11, src, n * sizeof(float), &tx), BG_OK);
    for (int k = 0; k < 200; k++) { /* 20 ms of polling: the events hold both back */
        int d1 = 0, d2 = 0;
        assert_int_equal(bg__xtest(rx, &d1), BG_OK);
        assert_int_equal(bg__xtest(tx, &d2), BG_OK);
        assert_false(d1 || d2);
        nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    for (size_t i = 0; i < n; i++)
        assert_true(dev[i] == -1.0f);
    assert_int_equal(sg.direct_transfers, 2);
    assert_int_equal(sg.transfers, 0); /* no host block */
    assert_int_equal(sg.host_peak, 0);
    gate_closed = 0;
    assert_int_equal(bg__xwait(tx), BG_OK);
    assert_int_equal(bg__xwait(rx), BG_OK);
    assert_memory_equal(dev, src, n * sizeof(float));
    assert_int_equal(sg.deferred, 2); /* both waited for their events */
    bg__xfree(tx);
    bg__xfree(rx);
    /* without streams (cpu): the same bytes, at once */
    bg__staging_fini(&sg);
    be->ops = gate_base;
    bg_backend_t *cpu = mkbe("cpu");
    assert_int_equal(bg__staging_init(&sg, cpu, comm), BG_OK);
    assert_true(sg.on && sg.direct && !sg.async);
    float *dev2 = bg_backend_alloc(cpu, n * sizeof(float), "dev2");
    self_transfer(&sg, src, dev2, n, 12);
    assert_memory_equal(dev2, src, n * sizeof(float));
    assert_int_equal(sg.direct_transfers, 2);
    bg__staging_fini(&sg);
    bg_backend_free(cpu, dev2);
    bg_backend_destroy(cpu);
    bg_backend_free(be, dev);
    bg_backend_free(be, src);
    bg_backend_destroy(be);
    unsetenv("BRIGADE_STAGING");
    unsetenv("BRIGADE_STAGE_CHUNK_KB");
}

/* A fresh checked cpu-async backend with one 64-float allocation. */
static bg_backend_t *checked(float **dev_p)
{
    setenv("BRIGADE_DEVICE_CHECK", "on", 1);
    bg_backend_t *be = mkbe("cpu-async");
    unsetenv("BRIGADE_DEVICE_CHECK");
    *dev_p = bg_backend_alloc(be, 64 * sizeof(float), "test buffer");
    assert_non_null(*dev_p);
    return be;
}

/* The fault is kept (the first one), names the op, the side and the pointer. */
static void assert_fault(bg_backend_t *be, const char *op, const char *side, const void *ptr)
{
    char want[160];
    assert_int_equal(bg_backend_status(be), BG_ERR_DEVICE);
    snprintf(want, sizeof want, "BRIGADE_DEVICE_CHECK: %s refused: its %s %p", op, side, ptr);
    if (!strstr(bg_last_error(), want))
        fail_msg("expected \"%s\" in: %s", want, bg_last_error());
}

static void test_device_check(void **state)
{
    (void)state;
    float host[64], *dev;
    bg__staging_t sg;
    setenv("BRIGADE_DEVICE_CHECK", "bogus", 1);
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bg_backend_t *bad = NULL;
    assert_int_equal(bg_backend_create("cpu-async", &bp, &bad), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "BRIGADE_DEVICE_CHECK=bogus: expected on or off"));
    unsetenv("BRIGADE_DEVICE_CHECK");
    /* its own buffers: every op runs, nothing is refused; device buffers, so the staging is on */
    bg_backend_t *be = checked(&dev);
    assert_int_equal(be->ops->device_buffers, 1);
    setenv("BRIGADE_STAGING", "auto", 1);
    assert_int_equal(bg__staging_init(&sg, be, comm), BG_OK);
    assert_int_equal(sg.on, 1);
    bg__staging_fini(&sg);
    unsetenv("BRIGADE_STAGING");
    for (int i = 0; i < 64; i++)
        host[i] = (float)i;
    be->ops->from_host(be, dev, host, sizeof host);
    be->ops->copy(be, dev, dev + 32, 32);
    be->ops->scale(be, dev + 32, 2.0f, 32);
    be->ops->to_host(be, host, dev, sizeof host);
    assert_true(host[0] == 32.0f && host[63] == 126.0f);
    assert_int_equal(bg_backend_status(be), BG_OK);
    /* a host pointer as the source of a copy to the host: skipped (host keeps its values), the fault named */
    float other[4] = {7, 7, 7, 7};
    be->ops->to_host(be, host, other, sizeof other);
    assert_true(host[0] == 32.0f);
    assert_fault(be, "to_host", "source", other);
    be->ops->fill(be, host, 0.0f, 4); /* a second fault: skipped (host keeps its values), the first one kept */
    assert_true(host[0] == 32.0f && host[3] == 35.0f);
    assert_fault(be, "to_host", "source", other);
    bg_backend_free(be, dev);
    bg_backend_destroy(be);
    /* one float past the allocation's end: refused */
    be = checked(&dev);
    be->ops->from_host(be, dev + 61, host, 4 * sizeof(float));
    assert_fault(be, "from_host", "destination", dev + 61);
    bg_backend_free(be, dev);
    bg_backend_destroy(be);
    /* an asynchronous copy refused still completes its event: a fault, never a hang */
    be = checked(&dev);
    bg_event_t *ev = be->ops->event_create(be);
    be->ops->to_host_async(be, host, other, sizeof other, NULL, ev);
    be->ops->event_wait(be, ev);
    assert_fault(be, "to_host_async", "source", other);
    be->ops->event_destroy(be, ev);
    bg_backend_free(be, dev);
    bg_backend_destroy(be);
    /* the optimizer kernels: a host-held first moment refused */
    be = checked(&dev);
    float before[64], after[64];
    be->ops->to_host(be, before, dev, sizeof before);
    be->ops->adamw(be, dev, dev + 16, other, dev + 48, 4, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    assert_fault(be, "adamw", "first moment", other);
    be->ops->to_host(be, after, dev, sizeof after); /* skipped: the parameters and moments as they were */
    assert_memory_equal(before, after, sizeof before);
    assert_true(other[0] == 7.0f && other[3] == 7.0f);
    bg_backend_free(be, dev);
    bg_backend_destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_held_block),
        cmocka_unit_test(test_equal_paths),
        cmocka_unit_test(test_direct),
        cmocka_unit_test(test_cancelled_recv),
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_device_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
