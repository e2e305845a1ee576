/* tests/transport: the communicator as a guest in a host program. With the
 * default params it leaves UCX's process-wide log handlers alone and prints
 * nothing while a log sink is set; ucx_log_handler = 1 installs brigade's
 * handler, once per process. A world of one: no other process is needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <ucs/debug/log_def.h>

#include "brigade/core.h"
#include "brigade/transport.h"
#include "bg_test_capture.h"

/* A world of one: no variables needed; a message to itself goes through UCX
 * and the communication thread. */
static void one_comm(const bg_comm_params_t *p)
{
    bg_comm_t *c;
    assert_int_equal(bg_comm_create(p, &c), BG_OK);
    assert_int_equal(bg_comm_size(c), 1);
    char a[5] = "abcd", b[5] = {0};
    bg_request_t *rr;
    assert_int_equal(bg_irecv(c, 0, 3, b, 5, &rr), BG_OK);
    assert_int_equal(bg_send(c, 0, 3, a, 5), BG_OK);
    assert_int_equal(bg_wait(rr), BG_OK);
    bg_request_free(rr);
    assert_string_equal(a, b);
    assert_int_equal(bg_comm_destroy(c), BG_OK);
}

/* Runs first: nothing in this process has asked for the handler yet. */
static void test_ucx_log_handler(void **s)
{
    (void)s;
    unsigned before = ucs_log_num_handlers();
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    one_comm(&p);
    one_comm(NULL);
    assert_int_equal(ucs_log_num_handlers(), before);
    p.ucx_log_handler = 1;
    one_comm(&p);
    assert_int_equal(ucs_log_num_handlers(), before + 1);
    one_comm(&p); /* once per process */
    assert_int_equal(ucs_log_num_handlers(), before + 1);
}

/* A caller built against the header before ucx_log_handler existed passes a
 * shorter struct: accepted, and the missing field is off. */
static void test_old_params_size(void **s)
{
    (void)s;
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    p.size = offsetof(bg_comm_params_t, ucx_log_handler);
    p.ucx_log_handler = 12345; /* beyond size: must not be read */
    one_comm(&p);
    p.size = offsetof(bg_comm_params_t, heartbeat_ms);
    bg_comm_t *c = NULL;
    assert_int_equal(bg_comm_create(&p, &c), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "params.size"));
}

/* With a sink set, the communicator's messages (from the caller's thread and
 * the communication thread) go to the sink, and nothing to fd 1 or 2. */
static void test_logs_to_sink(void **s)
{
    (void)s;
    static bgt_sink_t sink;
    bgt_sink_init(&sink);
    char out[8192];
    bgt_capture_t cap;
    assert_int_equal(bgt_capture_begin(&cap), 0);
    bg_log_set_sink(bgt_sink, &sink);
    bg_comm_params_t p = BG_COMM_PARAMS_INIT;
    one_comm(&p);
    bg_log_set_sink(NULL, NULL);
    long n = bgt_capture_end(&cap, out, sizeof(out));
    assert_int_equal(n, 0);
    int i = bgt_sink_find(&sink, "transport");
    assert_true(i >= 0);
    assert_int_equal(sink.m[i].rank, 0);
    assert_non_null(strstr(sink.m[i].message, "rank 0 of 1"));
}

int main(void)
{
    unsetenv("BRIGADE_RANK");
    unsetenv("BRIGADE_WORLD_SIZE");
    setenv("BRIGADE_LOG", "debug", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ucx_log_handler),
        cmocka_unit_test(test_old_params_size),
        cmocka_unit_test(test_logs_to_sink),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
