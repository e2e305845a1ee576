/* tests/transport/test_transport_fail.c: failure detection. One of four ranks
 * is SIGKILLed in the middle of an allreduce, and in the middle of a large
 * send; rank 0 (the store) dies; a rank never shows up; a rank hangs
 * (SIGSTOP: heartbeats stop); a live peer stays silent past the deadline.
 * The survivors must report an error naming the rank and exit well within
 * the deadline, never hang. A failed job's teardown keeps UCX's warnings on
 * messages nobody received off the terminal, without brigade's process-wide
 * log handler too (a host such as Python's). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "brigade/core.h"
#include "brigade/transport.h"
#include "ranks.h"

/* With brigade's UCX log handler (docs/transport.md, failure detection, 4): a
 * shared-memory copy from a rank killed mid-send must fail, not abort. */
static bg_status_t comm_create(bg_comm_t **c)
{
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    p.ucx_log_handler = 1;
    return bg_comm_create(&p, c);
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The survivor's check: a peer error that names @p dead. */
#define RK_PEER_ERROR(st, dead)                                                              \
    do {                                                                                     \
        char rk__want[32];                                                                   \
        snprintf(rk__want, sizeof(rk__want), "rank %d died", (dead));                        \
        RK_CHECK((st) == BG_ERR_PEER && strstr(bg_last_error(), rk__want),                    \
                 "expected BG_ERR_PEER naming rank %d, got %s: %s", (dead),                  \
                 bg_status_string(st), bg_last_error());                                     \
    } while (0)

static int rank_kill_allreduce(int rank, int world, void *arg)
{
    (void)arg;
    bg_comm_t *c;
    RK_OK(comm_create(&c));
    int all[4] = {0, 1, 2, 3};
    bg_group_t *g;
    RK_OK(bg_group_create(c, world, all, &g));
    size_t n = 8u << 20; /* 32 MiB */
    float *buf = calloc(n, sizeof(float));
    bg_status_t st = BG_OK;
    for (int it = 0; it < 1000 && st == BG_OK; it++) {
        bg_request_t *rq;
        st = bg_group_iallreduce(g, buf, n, BG_F32, BG_REDUCE_SUM, &rq);
        if (st != BG_OK)
            break;
        if (rank == 2 && it == 1) {
            sleep_s(0.01); /* in the middle of the second allreduce */
            kill(getpid(), SIGKILL);
        }
        st = bg_wait(rq);
        bg_request_free(rq);
    }
    RK_PEER_ERROR(st, 2);
    RK_CHECK(strstr(bg_last_error(), "allreduce") != NULL, "the message names the operation: %s",
             bg_last_error());
    bg_group_destroy(g);
    RK_OK(bg_comm_destroy(c));
    free(buf);
    return 0;
}

static void check_survivors(const bgt_result_t *r, int world, int victim, double max_s)
{
    double last = 0;
    for (int i = 0; i < world; i++)
        if (i != victim && r->exit_s[i] > last)
            last = r->exit_s[i];
    print_message("survivors exited %.2f s after the start (bound %.0f s)\n", last, max_s);
    for (int i = 0; i < world; i++) {
        if (i == victim) {
            assert_true(r->status[i] == -1 || (WIFSIGNALED(r->status[i])));
            continue;
        }
        if (r->status[i] != 0)
            fail_msg("survivor rank %d: status %d", i, r->status[i]);
        if (r->exit_s[i] > max_s)
            fail_msg("survivor rank %d exited after %.1f s (bound %.1f s)", i, r->exit_s[i], max_s);
    }
}

static void test_kill_in_allreduce(void **s)
{
    (void)s;
    const char *env[] = {"BRIGADE_TIMEOUT=60", NULL};
    bgt_result_t r;
    bgt_run_ranks(4, rank_kill_allreduce, NULL, 40, env, -1, &r);
    assert_false(r.timed_out);
    assert_true(WIFSIGNALED(r.status[2]) && WTERMSIG(r.status[2]) == SIGKILL);
    check_survivors(&r, 4, 2, 20); /* far below BRIGADE_TIMEOUT=60: liveness, not the deadline */
}

static int rank_kill_send(int rank, int world, void *arg)
{
    (void)arg;
    (void)world;
    bg_comm_t *c;
    RK_OK(comm_create(&c));
    size_t n = 64u << 20;
    char *buf = malloc(n);
    memset(buf, 1, n);
    RK_OK(bg_store_barrier(c));
    bg_status_t st;
    if (rank == 0) {
        st = bg_send(c, 1, 5, buf, n); /* rendezvous, never matched */
        RK_PEER_ERROR(st, 1);
        RK_CHECK(strstr(bg_last_error(), "send to rank 1"), "%s", bg_last_error());
    } else if (rank == 1) {
        sleep_s(0.3);
        kill(getpid(), SIGKILL);
    } else {
        st = bg_recv(c, 1, 6, buf, n);
        RK_PEER_ERROR(st, 1);
        /* and operations started afterwards fail at once */
        st = bg_send(c, 1, 6, buf, 10);
        RK_PEER_ERROR(st, 1);
    }
    RK_OK(bg_comm_destroy(c));
    /* the failed send's buffer stays owned by transport until destroy: free after */
    free(buf);
    return 0;
}

static void test_kill_in_large_send(void **s)
{
    (void)s;
    const char *env[] = {"BRIGADE_TIMEOUT=60", NULL};
    bgt_result_t r;
    bgt_run_ranks(4, rank_kill_send, NULL, 40, env, -1, &r);
    assert_false(r.timed_out);
    check_survivors(&r, 4, 1, 20);
}

static int rank_kill_store(int rank, int world, void *arg)
{
    (void)arg;
    (void)world;
    bg_comm_t *c;
    RK_OK(comm_create(&c));
    if (rank == 0) {
        sleep_s(0.2);
        kill(getpid(), SIGKILL);
    }
    char b[16];
    bg_status_t st = bg_recv(c, 0, 1, b, sizeof(b));
    RK_PEER_ERROR(st, 0);
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_kill_store_rank(void **s)
{
    (void)s;
    const char *env[] = {"BRIGADE_TIMEOUT=60", NULL};
    bgt_result_t r;
    bgt_run_ranks(3, rank_kill_store, NULL, 40, env, -1, &r);
    assert_false(r.timed_out);
    check_survivors(&r, 3, 0, 20);
}

static int rank_never_joins(int rank, int world, void *arg)
{
    (void)arg;
    (void)world;
    (void)rank;
    bg_comm_t *c;
    double t0 = bg_now();
    bg_status_t st = comm_create(&c);
    RK_CHECK(st == BG_ERR_TIMEOUT, "comm_create without rank 2: %s: %s", bg_status_string(st),
             bg_last_error());
    RK_CHECK(strstr(bg_last_error(), "missing: 2"), "the message names rank 2: %s", bg_last_error());
    RK_CHECK(bg_now() - t0 < 10, "took %.1f s", bg_now() - t0);
    return 0;
}

static void test_never_joins(void **s)
{
    (void)s;
    const char *env[] = {"BRIGADE_TIMEOUT=2", NULL};
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(3, rank_never_joins, NULL, 30, env, 2, &r), 0);
}

/* A rank with the wrong job token is refused by the store, with a message
 * that says so; the others then fail the join naming it. */
static int rank_wrong_token(int rank, int world, void *arg)
{
    (void)arg;
    (void)world;
    if (rank == 1)
        setenv("BRIGADE_JOB_TOKEN", "not-the-job-token", 1);
    bg_comm_t *c;
    bg_status_t st = comm_create(&c);
    if (rank == 1)
        RK_CHECK(st == BG_ERR_PEER && strstr(bg_last_error(), "wrong job token"), "%s: %s",
                 bg_status_string(st), bg_last_error());
    else
        RK_CHECK(st == BG_ERR_TIMEOUT && strstr(bg_last_error(), "missing: 1"), "%s: %s",
                 bg_status_string(st), bg_last_error());
    return 0;
}

static void test_wrong_token(void **s)
{
    (void)s;
    const char *env[] = {"BRIGADE_TIMEOUT=2", NULL};
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(2, rank_wrong_token, NULL, 30, env, -1, &r), 0);
}

static int rank_hang(int rank, int world, void *arg)
{
    (void)arg;
    (void)world;
    bg_comm_t *c;
    RK_OK(comm_create(&c));
    if (rank == 1)
        kill(getpid(), SIGSTOP); /* hung: no heartbeats any more */
    char b[16];
    bg_status_t st = bg_recv(c, 1, 1, b, sizeof(b));
    RK_PEER_ERROR(st, 1);
    RK_CHECK(strstr(bg_last_error(), "no heartbeat"), "%s", bg_last_error());
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_hung_rank(void **s)
{
    (void)s;
    const char *env[] = {"BRIGADE_TIMEOUT=5", "BRIGADE_HEARTBEAT_MS=100", NULL};
    bgt_result_t r;
    bgt_run_ranks(3, rank_hang, NULL, 8, env, -1, &r); /* the stopped rank is killed at 8 s */
    check_survivors(&r, 3, 1, 7);
}

static int rank_silent(int rank, int world, void *arg)
{
    (void)arg;
    (void)world;
    bg_comm_t *c;
    RK_OK(comm_create(&c));
    if (rank == 0) {
        char b[16];
        double t0 = bg_now();
        bg_status_t st = bg_recv(c, 1, 1, b, sizeof(b));
        RK_CHECK(st == BG_ERR_TIMEOUT && strstr(bg_last_error(), "rank 1"), "%s: %s",
                 bg_status_string(st), bg_last_error());
        RK_CHECK(bg_now() - t0 < 5, "deadline of 1 s took %.1f s", bg_now() - t0);
        /* a loop of tests ends at the deadline too (the coroutines' waits test, not wait) */
        bg_request_t *rq;
        RK_OK(bg_irecv(c, 1, 2, b, sizeof(b), &rq));
        t0 = bg_now();
        int done = 0;
        while ((st = bg_test(rq, &done)) == BG_OK && !done && bg_now() - t0 < 10)
            ;
        RK_CHECK(st == BG_ERR_TIMEOUT && strstr(bg_last_error(), "rank 1"), "test loop: %s: %s",
                 bg_status_string(st), bg_last_error());
        RK_CHECK(bg_now() - t0 < 5, "the test loop's deadline of 1 s took %.1f s", bg_now() - t0);
        bg_request_free(rq);
    }
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_silent_peer_deadline(void **s)
{
    (void)s;
    const char *env[] = {"BRIGADE_TIMEOUT=1", NULL};
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(2, rank_silent, NULL, 30, env, -1, &r), 0);
}

/* Rank 0 dies while the others leave the job (after their last operation
 * succeeded): their bg_comm_destroy must fail naming it, so that a CLI or host
 * never reports a clean finish of such a job (it used to return BG_OK). */
static int rank_die_in_teardown(int rank, int world, void *arg)
{
    (void)arg;
    (void)world;
    bg_comm_t *c;
    RK_OK(comm_create(&c));
    RK_OK(bg_store_barrier(c));
    if (rank == 0) {
        sleep_s(0.05);
        kill(getpid(), SIGKILL);
    }
    sleep_s(rank == 1 ? 0 : 0.5); /* rank 1 is in the teardown barrier, rank 2 after the notice */
    bg_status_t st = bg_comm_destroy(c);
    RK_PEER_ERROR(st, 0);
    RK_CHECK(strstr(bg_last_error(), "did not end cleanly"), "%s", bg_last_error());
    return 0;
}

static void test_death_during_teardown(void **s)
{
    (void)s;
    const char *env[] = {"BRIGADE_TIMEOUT=20", NULL};
    bgt_result_t r;
    bgt_run_ranks(3, rank_die_in_teardown, NULL, 30, env, -1, &r);
    assert_false(r.timed_out);
    check_survivors(&r, 3, 0, 10);
}

/* Rank 1 sends a message rank 0 never receives, then one it does; rank 0
 * stops on an error and destroys its comm with the first still unexpected,
 * its stdout and stderr (where UCX logs) captured. */
static int rank_unmatched_after_failure(int rank, int world, void *arg)
{
    (void)world;
    const char *out = arg;
    bg_comm_t *c;
    bg_comm_params_t p = BG_COMM_PARAMS_INIT; /* no process-wide UCX log handler */
    RK_OK(bg_comm_create(&p, &c));
    int v = 7;
    if (rank == 1) {
        RK_OK(bg_send(c, 0, 11, &v, sizeof v)); /* never received */
        RK_OK(bg_send(c, 0, 12, &v, sizeof v));
        bg_comm_destroy(c); /* fails: rank 0 stopped on an error */
        return 0;
    }
    RK_OK(bg_recv(c, 1, 12, &v, sizeof v)); /* progress: tag 11 waits unexpected */
    bg_comm_abort(c, "the test stops here");
    fflush(stdout);
    fflush(stderr);
    int saved1 = dup(1), saved2 = dup(2);
    FILE *f = fopen(out, "w");
    RK_CHECK(f && saved1 >= 0 && saved2 >= 0, "cannot capture the output in %s", out);
    dup2(fileno(f), 1);
    dup2(fileno(f), 2);
    bg_comm_destroy(c);
    fflush(stdout);
    fflush(stderr);
    dup2(saved1, 1);
    dup2(saved2, 2);
    fclose(f);
    return 0;
}

static void test_no_ucx_warnings_after_failure(void **s)
{
    (void)s;
    char out[] = "/tmp/bg-unmatched-XXXXXX";
    int fd = mkstemp(out);
    assert_true(fd >= 0);
    close(fd);
    const char *env[] = {"BRIGADE_TIMEOUT=20", "UCX_TLS=sm,self", NULL};
    bgt_result_t r;
    bgt_run_ranks(2, rank_unmatched_after_failure, out, 30, env, -1, &r);
    assert_false(r.timed_out);
    assert_int_equal(r.status[0], 0);
    char text[8192] = "";
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    unlink(out);
    if (strstr(text, "was not matched"))
        fail_msg("UCX's warning reached the terminal after the failure:\n%s", text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_in_allreduce), cmocka_unit_test(test_kill_in_large_send),
        cmocka_unit_test(test_kill_store_rank),   cmocka_unit_test(test_never_joins),
        cmocka_unit_test(test_hung_rank),         cmocka_unit_test(test_silent_peer_deadline),
        cmocka_unit_test(test_wrong_token),       cmocka_unit_test(test_death_during_teardown),
        cmocka_unit_test(test_no_ucx_warnings_after_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
