/* tests/transport/test_transport_store.c: the rendezvous store driven
 * directly (in-process server, client threads): set/get/wait/add/barrier
 * under concurrent clients, while bad clients (wrong token, oversized length,
 * garbage bytes, silent) hammer it; liveness reports; bootstrap detection of
 * brigade, torchrun, Open MPI and Slurm variables. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "brigade/core.h"
#include "transport/store.h"
#include "transport/transport_impl.h"

#define NCLIENTS 8
#define NKEYS 50

static bg__store_server_t *start(const char *token, int world, double timeout_s)
{
    bg__store_server_params_t p = {.addr = "127.0.0.1", .port = 0, .token = token, .world_size = world,
                                   .timeout_s = timeout_s, .heartbeat_ms = 50, .hello_timeout_s = 1.0};
    bg__store_server_t *s = NULL;
    assert_int_equal(bg__store_server_start(&p, &s), BG_OK);
    return s;
}

typedef struct {
    int port, id, ok;
    char err[256];
} client_arg_t;

static void *good_client(void *argp)
{
    client_arg_t *a = argp;
    bg__store_client_t c;
    double dl = bg_now() + 20;
    if (bg__store_connect("127.0.0.1", a->port, "secret", a->id, BG__ROLE_KV, dl, NULL, NULL, &c) != BG_OK) {
        snprintf(a->err, sizeof(a->err), "connect: %s", bg_last_error());
        return NULL;
    }
    int st;
    uint8_t *v;
    size_t n;
    for (int k = 0; k < NKEYS; k++) {
        char key[64], val[64];
        snprintf(key, sizeof(key), "c%d/k%d", a->id, k);
        snprintf(val, sizeof(val), "v%d.%d", a->id, k);
        if (bg__store_call(&c, BG__OP_SET, 0, key, val, strlen(val), dl, &st, &v, &n) != BG_OK || st) {
            snprintf(a->err, sizeof(a->err), "set %s failed", key);
            goto out;
        }
        free(v);
        int64_t one = 1;
        if (bg__store_call(&c, BG__OP_ADD, 0, "total", &one, 8, dl, &st, &v, &n) != BG_OK || st || n != 8) {
            snprintf(a->err, sizeof(a->err), "add failed");
            goto out;
        }
        free(v);
    }
    /* wait for a key another client sets */
    char key[64], want[64];
    int other = (a->id + 1) % NCLIENTS;
    snprintf(key, sizeof(key), "c%d/k%d", other, NKEYS - 1);
    snprintf(want, sizeof(want), "v%d.%d", other, NKEYS - 1);
    if (bg__store_call(&c, BG__OP_WAIT, 10000, key, NULL, 0, dl, &st, &v, &n) != BG_OK || st ||
        n != strlen(want) || memcmp(v, want, n)) {
        snprintf(a->err, sizeof(a->err), "wait %s: st %d", key, st);
        goto out;
    }
    free(v);
    uint32_t ms = 10000;
    if (bg__store_call(&c, BG__OP_BARRIER, NCLIENTS, "b1", &ms, 4, dl, &st, &v, &n) != BG_OK || st) {
        snprintf(a->err, sizeof(a->err), "barrier st %d", st);
        goto out;
    }
    free(v);
    if (bg__store_call(&c, BG__OP_GET, 0, "total", NULL, 0, dl, &st, &v, &n) != BG_OK || st || n != 8) {
        snprintf(a->err, sizeof(a->err), "get total");
        goto out;
    }
    int64_t tot;
    memcpy(&tot, v, 8);
    free(v);
    if (tot != NCLIENTS * NKEYS) {
        snprintf(a->err, sizeof(a->err), "total %lld after the barrier, expected %d", (long long)tot,
                 NCLIENTS * NKEYS);
        goto out;
    }
    a->ok = 1;
out:
    bg__store_close(&c);
    return NULL;
}

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* 1 if the server closed the connection within a few seconds. */
static int closed_by_server(int fd)
{
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char b[256];
    for (;;) {
        ssize_t n = recv(fd, b, sizeof(b), 0);
        if (n == 0)
            return 1;
        if (n < 0)
            return 0;
    }
}

static void test_concurrent_and_bad_clients(void **s)
{
    (void)s;
    bg__store_server_t *srv = start("secret", 0, 30);
    int port = bg__store_server_port(srv);
    /* bad clients first, kept open while the good ones work */
    int silent = raw_connect(port);
    int garbage = raw_connect(port);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\nlots of garbage bytes";
    assert_true(send(garbage, junk, sizeof(junk), 0) > 0);
    int oversized = raw_connect(port);
    bg__store_hdr_t h = {.magic = BG__STORE_MAGIC, .op = BG__OP_HELLO, .key_len = 6,
                         .val_len = 0x7fffffff, .arg = 0};
    assert_true(send(oversized, &h, sizeof(h), 0) > 0);
    int wrongtok = raw_connect(port);
    size_t len;
    uint8_t *m = bg__msg_encode(BG__OP_HELLO, BG__ROLE_KV, 0, "wrong!", 6, NULL, 0, &len);
    assert_true(send(wrongtok, m, len, 0) > 0);
    free(m);
    /* a hello'd client that then sends an oversized SET */
    bg__store_client_t evil;
    assert_int_equal(bg__store_connect("127.0.0.1", port, "secret", 0, BG__ROLE_KV, bg_now() + 5, NULL, NULL, &evil),
                     BG_OK);
    bg__store_hdr_t h2 = {.magic = BG__STORE_MAGIC, .op = BG__OP_SET, .key_len = BG_STORE_MAX_KEY + 1,
                          .val_len = 1, .arg = 0};
    assert_true(send(evil.fd, &h2, sizeof(h2), 0) > 0);

    pthread_t th[NCLIENTS];
    client_arg_t args[NCLIENTS];
    for (int i = 0; i < NCLIENTS; i++) {
        args[i] = (client_arg_t){.port = port, .id = i};
        pthread_create(&th[i], NULL, good_client, &args[i]);
    }
    for (int i = 0; i < NCLIENTS; i++) {
        pthread_join(th[i], NULL);
        if (!args[i].ok)
            fail_msg("client %d: %s", i, args[i].err);
    }
    assert_true(closed_by_server(garbage));
    assert_true(closed_by_server(oversized));
    assert_true(closed_by_server(wrongtok));
    assert_true(closed_by_server(evil.fd));
    assert_true(closed_by_server(silent)); /* no hello within hello_timeout_s */
    assert_true(bg__store_server_dropped(srv) >= 5);
    /* the client API refuses a wrong token with a clear error */
    bg__store_client_t c;
    assert_int_equal(bg__store_connect("127.0.0.1", port, "nope", 1, BG__ROLE_KV, bg_now() + 5, NULL, NULL, &c),
                     BG_ERR_PEER);
    assert_non_null(strstr(bg_last_error(), "TOKEN"));
    /* and still serves the good ones */
    assert_int_equal(bg__store_connect("127.0.0.1", port, "secret", 1, BG__ROLE_KV, bg_now() + 5, NULL, NULL, &c),
                     BG_OK);
    int st;
    uint8_t *v;
    assert_int_equal(bg__store_call(&c, BG__OP_GET, 0, "c3/k7", NULL, 0, bg_now() + 5, &st, &v, &len),
                     BG_OK);
    assert_int_equal(st, BG__ST_OK);
    assert_memory_equal(v, "v3.7", 4);
    free(v);
    /* a wait that times out server-side, and a barrier that names who is missing */
    assert_int_equal(bg__store_call(&c, BG__OP_WAIT, 100, "never", NULL, 0, bg_now() + 5, &st, &v, &len),
                     BG_OK);
    assert_int_equal(st, BG__ST_TIMEOUT);
    free(v);
    /* client-side limits */
    char bigkey[BG_STORE_MAX_KEY + 2];
    memset(bigkey, 'k', sizeof(bigkey) - 1);
    bigkey[sizeof(bigkey) - 1] = 0;
    assert_int_equal(bg__store_call(&c, BG__OP_GET, 0, bigkey, NULL, 0, bg_now() + 5, &st, &v, &len),
                     BG_ERR_INVALID);
    bg__store_close(&c);
    close(silent);
    close(garbage);
    close(oversized);
    close(wrongtok);
    bg__store_close(&evil);
    bg__store_server_stop(srv, 0);
}

static void test_barrier_timeout_names_missing(void **s)
{
    (void)s;
    bg__store_server_t *srv = start("", 3, 30);
    int port = bg__store_server_port(srv);
    bg__store_client_t c;
    assert_int_equal(bg__store_connect("127.0.0.1", port, "", 1, BG__ROLE_KV, bg_now() + 5, NULL, NULL, &c), BG_OK);
    uint32_t ms = 200;
    int st;
    uint8_t *v;
    size_t n;
    assert_int_equal(bg__store_call(&c, BG__OP_BARRIER, 3, "b", &ms, 4, bg_now() + 5, &st, &v, &n), BG_OK);
    assert_int_equal(st, BG__ST_TIMEOUT);
    assert_non_null(strstr((char *)v, "missing: 0, 2"));
    free(v);
    bg__store_close(&c);
    bg__store_server_stop(srv, 0);
}

/* Liveness: a rank whose connection closes is reported to the others; a BYE is not. */
static void test_liveness(void **s)
{
    (void)s;
    bg__store_server_t *srv = start("", 3, 1.0);
    int port = bg__store_server_port(srv);
    bg__store_client_t a, b, c;
    assert_int_equal(bg__store_connect("127.0.0.1", port, "", 0, BG__ROLE_LIVE, bg_now() + 5, NULL, NULL, &a), BG_OK);
    assert_int_equal(bg__store_connect("127.0.0.1", port, "", 1, BG__ROLE_LIVE, bg_now() + 5, NULL, NULL, &b), BG_OK);
    assert_int_equal(bg__store_connect("127.0.0.1", port, "", 2, BG__ROLE_LIVE, bg_now() + 5, NULL, NULL, &c), BG_OK);
    /* a second process claiming rank 2 is refused, naming the reason */
    bg__store_client_t dup;
    assert_int_equal(bg__store_connect("127.0.0.1", port, "", 2, BG__ROLE_LIVE, bg_now() + 5, NULL, NULL, &dup),
                     BG_ERR_PEER);
    assert_non_null(strstr(bg_last_error(), "rank already taken"));
    bg__store_close(&b); /* rank 1 "dies" */
    /* rank 0 must hear DEAD(1) quickly; rank 2 stays silent and is declared dead after 1 s */
    int got1 = 0, got2 = 0;
    double t0 = bg_now();
    size_t len;
    uint8_t *hb = bg__msg_encode(BG__OP_HB, 0, 0, NULL, 0, NULL, 0, &len);
    while (bg_now() - t0 < 5 && !(got1 && got2)) {
        assert_int_equal(bg__write_all(a.fd, hb, len, bg_now() + 1), BG_OK);
        bg__rd_fill(&a.rd, a.fd);
        bg__store_hdr_t h;
        const uint8_t *k, *v;
        while (bg__rd_peek(&a.rd, &h, &k, &v) > 0) {
            if (h.op == BG__OP_DEAD && h.arg == 1) {
                got1 = 1;
                assert_true(bg_now() - t0 < 0.9); /* EOF: immediate, not the heartbeat timeout */
                assert_memory_equal(v, "connection closed", 17);
            }
            if (h.op == BG__OP_DEAD && h.arg == 2) {
                got2 = 1;
                assert_memory_equal(v, "no heartbeat", 12);
            }
            bg__rd_pop(&a.rd);
        }
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    free(hb);
    assert_true(got1);
    assert_true(got2);
    bg__store_close(&a);
    bg__store_close(&c);
    bg__store_server_stop(srv, 0);
}

static void test_bind_given_address_only(void **s)
{
    (void)s;
    /* bound to 127.0.0.1: another loopback address must not reach it */
    bg__store_server_t *srv = start("", 0, 30);
    int port = bg__store_server_port(srv);
    bg__store_client_t c;
    bg_status_t st = bg__store_connect("127.0.0.2", port, "", 0, BG__ROLE_KV, bg_now() + 0.3, NULL, NULL, &c);
    assert_int_equal(st, BG_ERR_TIMEOUT);
    assert_non_null(strstr(bg_last_error(), "could not reach the store"));
    bg__store_server_stop(srv, 0);
}

static void clear_env(void)
{
    const char *v[] = {"BRIGADE_RANK", "BRIGADE_WORLD_SIZE", "BRIGADE_LOCAL_RANK", "BRIGADE_MASTER_ADDR",
                       "BRIGADE_MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                       "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri",
                       "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID"};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        unsetenv(v[i]);
}

static void test_bootstrap_sources(void **s)
{
    (void)s;
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    bg__boot_t b;
    clear_env();
    assert_int_equal(bg__bootstrap(&p, &b), BG_OK);
    assert_int_equal(b.size, 1);
    assert_string_equal(b.source, "single");
    /* Slurm, lowest priority */
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_JOB_ID", "4242", 1);
    assert_int_equal(bg__bootstrap(&p, &b), BG_OK);
    assert_string_equal(b.source, "slurm");
    assert_int_equal(b.rank, 3);
    assert_int_equal(b.size, 8);
    assert_int_equal(b.local_rank, 1);
    assert_string_equal(b.addr, "127.0.0.1");
    int slurm_port = b.port;
    assert_true(slurm_port >= 20000 && slurm_port < 32000);
    assert_int_equal(bg__bootstrap(&p, &b), BG_OK);
    assert_int_equal(b.port, slurm_port); /* deterministic */
    /* Open MPI beats Slurm */
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
    setenv("OMPI_MCA_ess_base_jobid", "2054291457", 1);
    assert_int_equal(bg__bootstrap(&p, &b), BG_OK);
    assert_string_equal(b.source, "openmpi");
    assert_int_equal(b.rank, 2);
    assert_int_equal(b.size, 4);
    assert_true(b.port >= 20000 && b.port < 32000);
    setenv("MASTER_PORT", "23456", 1);
    assert_int_equal(bg__bootstrap(&p, &b), BG_OK);
    assert_int_equal(b.port, 23456);
    /* torchrun beats Open MPI */
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "6", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    assert_int_equal(bg__bootstrap(&p, &b), BG_OK);
    assert_string_equal(b.source, "torchrun");
    assert_int_equal(b.rank, 5);
    assert_int_equal(b.size, 6);
    assert_int_equal(b.local_rank, 0);
    assert_string_equal(b.addr, "10.1.2.3");
    assert_int_equal(b.port, 23456);
    /* brigade's own beat everything */
    setenv("BRIGADE_RANK", "1", 1);
    setenv("BRIGADE_WORLD_SIZE", "2", 1);
    setenv("BRIGADE_MASTER_PORT", "34567", 1);
    assert_int_equal(bg__bootstrap(&p, &b), BG_OK);
    assert_string_equal(b.source, "brigade");
    assert_int_equal(b.rank, 1);
    assert_int_equal(b.size, 2);
    assert_int_equal(b.port, 34567);
    assert_string_equal(b.addr, "127.0.0.1");
    /* params override */
    p.rank = 0;
    p.master_port = 40000;
    assert_int_equal(bg__bootstrap(&p, &b), BG_OK);
    assert_int_equal(b.rank, 0);
    assert_int_equal(b.port, 40000);
    /* malformed values are errors naming the variable */
    p = (bg_comm_params_t)BG_COMM_PARAMS_INIT;
    setenv("BRIGADE_RANK", "2", 1);
    assert_int_equal(bg__bootstrap(&p, &b), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "BRIGADE_RANK"));
    setenv("BRIGADE_RANK", "x", 1);
    assert_int_equal(bg__bootstrap(&p, &b), BG_ERR_INVALID);
    unsetenv("BRIGADE_WORLD_SIZE");
    setenv("BRIGADE_RANK", "0", 1);
    assert_int_equal(bg__bootstrap(&p, &b), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "BRIGADE_WORLD_SIZE"));
    clear_env();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_and_bad_clients),
        cmocka_unit_test(test_barrier_timeout_names_missing),
        cmocka_unit_test(test_liveness),
        cmocka_unit_test(test_bind_given_address_only),
        cmocka_unit_test(test_bootstrap_sources),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
