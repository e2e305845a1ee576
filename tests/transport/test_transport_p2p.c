/* tests/transport/test_transport_p2p.c: point-to-point over UCX between 2 and
 * 3 forked ranks: sizes 0, 1, odd, 256 MiB (once); out-of-order tags;
 * truncation; cancel; background progress; the store API across ranks. A
 * world of one (no variables needed) is in test_transport_guest.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "brigade/core.h"
#include "brigade/transport.h"
#include "ranks.h"
#include "transport/transport_impl.h"

static const char *const bgt_env[] = {"BRIGADE_TIMEOUT=30", NULL};

static uint8_t pat(int src, size_t size, size_t i)
{
    return (uint8_t)(i * 131u + (size_t)src * 17u + size * 7u + (i >> 9));
}

static int rank_sizes(int rank, int world, void *arg)
{
    (void)arg;
    bg_comm_t *c;
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    RK_OK(bg_comm_create(&p, &c));
    RK_CHECK(bg_comm_rank(c) == rank && bg_comm_size(c) == world, "rank %d size %d", bg_comm_rank(c),
             bg_comm_size(c));
    const size_t sizes[] = {0, 1, 7, 4097, 8193, 65537, (1u << 20) + 3, (5u << 20) + 1};
    int right = (rank + 1) % world, left = (rank + world - 1) % world;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        uint8_t *out = malloc(n + 1), *in = malloc(n + 16);
        for (size_t i = 0; i < n; i++)
            out[i] = pat(rank, n, i);
        memset(in, 0xEE, n + 16);
        bg_request_t *rr, *sr;
        RK_OK(bg_irecv(c, left, (uint32_t)k, in, n + 16, &rr));
        RK_OK(bg_isend(c, right, (uint32_t)k, out, n, &sr));
        RK_OK(bg_wait(sr));
        RK_OK(bg_wait(rr));
        RK_CHECK(bg_request_bytes(rr) == n, "size %zu: received %zu bytes (recvd %zu info %zu st %d)", n, bg_request_bytes(rr), rr->recvd, rr->info.length, rr->status);
        for (size_t i = 0; i < n; i++)
            RK_CHECK(in[i] == pat(left, n, i), "size %zu: byte %zu is %u, expected %u", n, i, in[i],
                     pat(left, n, i));
        RK_CHECK(in[n] == 0xEE, "size %zu: wrote past the message", n);
        bg_request_free(sr);
        bg_request_free(rr);
        free(out);
        free(in);
    }
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_sizes_2(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(2, rank_sizes, NULL, 60, bgt_env, -1, &r), 0);
}

static void test_sizes_3(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(3, rank_sizes, NULL, 60, bgt_env, -1, &r), 0);
}

/* Distinct tags from one peer, received in the reverse order; equal tags in order. */
static int rank_tags(int rank, int world, void *arg)
{
    (void)arg;
    (void)world;
    bg_comm_t *c;
    RK_OK(bg_comm_create(NULL, &c));
    enum { N = 8 };
    size_t sz[N];
    for (int t = 0; t < N; t++)
        sz[t] = (size_t)(t * 9000 + 3); /* short, eager and rendezvous sizes */
    if (rank == 0) {
        bg_request_t *rq[N + 2];
        uint8_t *b[N];
        for (int t = 0; t < N; t++) {
            b[t] = malloc(sz[t]);
            for (size_t i = 0; i < sz[t]; i++)
                b[t][i] = pat(t, sz[t], i);
            RK_OK(bg_isend(c, 1, 100 + (uint32_t)t, b[t], sz[t], &rq[t]));
        }
        int one = 1, two = 2;
        RK_OK(bg_isend(c, 1, 7, &one, sizeof(one), &rq[N]));
        RK_OK(bg_isend(c, 1, 7, &two, sizeof(two), &rq[N + 1]));
        for (int t = 0; t < N + 2; t++) {
            RK_OK(bg_wait(rq[t]));
            bg_request_free(rq[t]);
        }
        for (int t = 0; t < N; t++)
            free(b[t]);
    } else {
        /* give the sends time to arrive unexpected, then match in reverse */
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
        for (int t = N - 1; t >= 0; t--) {
            uint8_t *b = malloc(sz[t]);
            RK_OK(bg_recv(c, 0, 100 + (uint32_t)t, b, sz[t]));
            for (size_t i = 0; i < sz[t]; i++)
                RK_CHECK(b[i] == pat(t, sz[t], i), "tag %d byte %zu", 100 + t, i);
            free(b);
        }
        int x = 0, y = 0;
        RK_OK(bg_recv(c, 0, 7, &x, sizeof(x)));
        RK_OK(bg_recv(c, 0, 7, &y, sizeof(y)));
        RK_CHECK(x == 1 && y == 2, "equal tags out of order: %d then %d", x, y);
        /* truncation: a receive smaller than the message fails, naming the peer */
        char small[4];
        bg_status_t st = bg_recv(c, 0, 9, small, sizeof(small));
        RK_CHECK(st == BG_ERR_TRANSPORT && strstr(bg_last_error(), "rank 0"), "truncation: %s: %s",
                 bg_status_string(st), bg_last_error());
        /* cancel: a receive nobody will match */
        bg_request_t *rq;
        RK_OK(bg_irecv(c, 0, 12345, small, sizeof(small), &rq));
        RK_OK(bg_cancel(rq));
        st = bg_wait(rq);
        RK_CHECK(st == BG_ERR_CANCELED, "cancelled receive: %s", bg_status_string(st));
        bg_request_free(rq);
    }
    if (rank == 0) {
        char big[64] = {0};
        RK_OK(bg_send(c, 1, 9, big, sizeof(big)));
    }
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_tags(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(2, rank_tags, NULL, 60, bgt_env, -1, &r), 0);
}

/* 256 MiB once, and background progress: the send completes while the sender sleeps. */
static int rank_big(int rank, int world, void *arg)
{
    (void)arg;
    (void)world;
    bg_comm_t *c;
    RK_OK(bg_comm_create(NULL, &c));
    size_t n = 256u << 20;
    uint64_t *b = malloc(n);
    RK_CHECK(b != NULL, "malloc 256 MiB");
    size_t words = n / 8;
    if (rank == 0) {
        for (size_t i = 0; i < words; i++)
            b[i] = i * 0x9E3779B97F4A7C15ull;
        RK_OK(bg_send(c, 1, 1, b, n));
    } else {
        memset(b, 0, n);
        RK_OK(bg_recv(c, 0, 1, b, n));
        for (size_t i = 0; i < words; i++)
            RK_CHECK(b[i] == i * 0x9E3779B97F4A7C15ull, "256 MiB: word %zu wrong", i);
    }
    /* background progress: post, sleep without calling transport, then one test */
    size_t m = 4u << 20;
    bg_request_t *rq;
    if (rank == 0)
        RK_OK(bg_isend(c, 1, 2, b, m, &rq));
    else
        RK_OK(bg_irecv(c, 0, 2, b, m, &rq));
    int done = 0;
    for (int i = 0; i < 100 && !done; i++) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
        done = atomic_load(&rq->done); /* read without progressing anything */
    }
    RK_CHECK(done, "a 4 MiB transfer did not complete in 2 s without test/wait calls: no background "
             "progress");
    RK_OK(bg_wait(rq));
    bg_request_free(rq);
    free(b);
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_big(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(2, rank_big, NULL, 90, bgt_env, -1, &r), 0);
}

/* The store through the communicator: set/get/wait/add/barrier from every rank. */
static int rank_store(int rank, int world, void *arg)
{
    (void)arg;
    bg_comm_t *c;
    RK_OK(bg_comm_create(NULL, &c));
    char key[32], val[64];
    snprintf(key, sizeof(key), "k%d", rank);
    snprintf(val, sizeof(val), "value of rank %d", rank);
    RK_OK(bg_store_set(c, key, val, strlen(val) + 1));
    int64_t v = 0;
    RK_OK(bg_store_add(c, "counter", rank + 1, &v));
    RK_OK(bg_store_barrier(c));
    RK_OK(bg_store_add(c, "counter", 0, &v));
    RK_CHECK(v == (int64_t)world * (world + 1) / 2, "counter %lld, expected %d", (long long)v,
             world * (world + 1) / 2);
    for (int r = 0; r < world; r++) {
        char k[32], got[64] = {0}, want[64];
        size_t len = 0;
        snprintf(k, sizeof(k), "k%d", r);
        snprintf(want, sizeof(want), "value of rank %d", r);
        RK_OK(bg_store_wait(c, k, got, sizeof(got), &len));
        RK_CHECK(len == strlen(want) + 1 && strcmp(got, want) == 0, "key %s: \"%s\"", k, got);
    }
    size_t len;
    bg_status_t st = bg_store_get(c, "never-set", val, sizeof(val), &len);
    RK_CHECK(st == BG_ERR_NOT_FOUND, "unset key: %s", bg_status_string(st));
    RK_OK(bg_store_barrier(c));
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_store(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(3, rank_store, NULL, 60, bgt_env, -1, &r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_2), cmocka_unit_test(test_sizes_3), cmocka_unit_test(test_tags),
        cmocka_unit_test(test_store),   cmocka_unit_test(test_big),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
