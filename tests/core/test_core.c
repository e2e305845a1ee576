/* tests/core: status strings, error messages, configuration parsing, RNG, and
 * the log sink (a host program gets every message and brigade prints nothing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "brigade/core.h"
#include "bg_test_capture.h"
#include "core/cpu_floor.h"
#include "core/fiber.h"
#include "core/fileio.h"

#include <stdio.h>
#include <unistd.h>

static void test_status_strings(void **state)
{
    (void)state;
    assert_string_equal(bg_status_string(BG_OK), "ok");
    assert_string_equal(bg_status_string(BG_ERR_INVALID), "invalid argument");
    assert_string_equal(bg_status_string((bg_status_t)-999), "unknown status");
    assert_int_equal(bg_error(BG_ERR_IO, "file %s: %d", "x.bin", 3), BG_ERR_IO);
    assert_string_equal(bg_last_error(), "file x.bin: 3");
    /* wrapping the last message in a new one keeps it */
    bg_error(BG_ERR_PARSE, "$.stages[2].first_layer is 9");
    assert_int_equal(bg_error(BG_ERR_PARSE, "plan %s: %s", "p.json", bg_last_error()), BG_ERR_PARSE);
    assert_string_equal(bg_last_error(), "plan p.json: $.stages[2].first_layer is 9");
    bg_error_clear();
    assert_string_equal(bg_last_error(), "");
}

/* A message that quotes the previous one (the usual "%s: %s", where,
 * bg_last_error() pattern) keeps it: the buffer is also an argument. */
static void test_error_wraps_itself(void **state)
{
    (void)state;
    bg_error(BG_ERR_IO, "disk full at %d", 42);
    assert_int_equal(bg_error(BG_ERR_IO, "saving x.json: %s", bg_last_error()), BG_ERR_IO);
    assert_string_equal(bg_last_error(), "saving x.json: disk full at 42");
    bg_error(BG_ERR_IO, "%s; and %s", bg_last_error(), bg_last_error());
    assert_string_equal(bg_last_error(), "saving x.json: disk full at 42; and saving x.json: disk full at 42");
}

static void test_config(void **state)
{
    (void)state;
    long long v = 0;
    unsetenv("BRIGADE_TIMEOUT");
    assert_int_equal(bg_config_int("BRIGADE_TIMEOUT", &v), BG_OK);
    assert_int_equal(v, 60);
    setenv("BRIGADE_TIMEOUT", "12", 1);
    assert_int_equal(bg_config_int("BRIGADE_TIMEOUT", &v), BG_OK);
    assert_int_equal(v, 12);
    setenv("BRIGADE_TIMEOUT", "12x", 1);
    assert_int_equal(bg_config_int("BRIGADE_TIMEOUT", &v), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "BRIGADE_TIMEOUT"));
    assert_int_equal(v, 12); /* output untouched on failure */
    unsetenv("BRIGADE_TIMEOUT");
    /* a switch: off, its default (on); anything else named and refused, the output untouched (still 1,
     * where a refused value read as a switch would have made it 0) */
    int on = -1;
    setenv("BRIGADE_CP_OVERLAP", "off", 1);
    assert_int_equal(bg_config_on("BRIGADE_CP_OVERLAP", &on), BG_OK);
    assert_int_equal(on, 0);
    unsetenv("BRIGADE_CP_OVERLAP");
    assert_int_equal(bg_config_on("BRIGADE_CP_OVERLAP", &on), BG_OK);
    assert_int_equal(on, 1);
    setenv("BRIGADE_CP_OVERLAP", "yes", 1);
    assert_int_equal(bg_config_on("BRIGADE_CP_OVERLAP", &on), BG_ERR_INVALID);
    assert_string_equal(bg_last_error(), "BRIGADE_CP_OVERLAP=yes: expected on or off");
    assert_int_equal(on, 1);
    unsetenv("BRIGADE_CP_OVERLAP");
    assert_int_equal(bg_config_on("BRIGADE_NOT_DECLARED", &on), BG_ERR_INTERNAL);
    assert_null(bg_config_str("BRIGADE_NOT_DECLARED"));
    size_t n = 0;
    const bg_config_var_t *t = bg_config_table(&n);
    assert_true(n > 5);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(strncmp(t[i].name, "BRIGADE_", 8), 0);
        assert_true(strlen(t[i].help) > 0);
    }
}

static void test_rng(void **state)
{
    (void)state;
    bg_rng_t a, b;
    bg_rng_seed(&a, 42);
    bg_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++)
        assert_true(bg_rng_u64(&a) == bg_rng_u64(&b));
    /* moments of the normal and uniform generators against closed forms */
    double s = 0, s2 = 0, u = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = bg_rng_normal(&a);
        s += x;
        s2 += x * x;
        u += bg_rng_uniform(&a);
    }
    assert_true(fabs(s / n) < 0.01);
    assert_true(fabs(s2 / n - 1.0) < 0.02);
    assert_true(fabs(u / n - 0.5) < 0.005);
    int hist[7] = {0};
    for (int i = 0; i < 70000; i++)
        hist[bg_rng_below(&a, 7)]++;
    for (int i = 0; i < 7; i++)
        assert_true(abs(hist[i] - 10000) < 500);
}

static void *log_from_thread(void *arg)
{
    (void)arg;
    bg_log(BG_LOG_ERROR, "transport", "from another thread: %s", "peer gone");
    return NULL;
}

/* Every message that passes the level reaches the sink with its level,
 * subsystem, rank and text, from any thread; nothing reaches fd 1 or 2 until
 * the sink is removed, and then the default writer prints again. */
static void test_log_sink(void **state)
{
    (void)state;
    static bgt_sink_t sink, second; /* large: off the stack */
    bgt_sink_init(&sink);
    bgt_sink_init(&second);
    char out[4096];
    bgt_capture_t cap;
    assert_int_equal(bgt_capture_begin(&cap), 0);
    bg_log_set_rank(3);
    bg_log_set_sink(bgt_sink, &sink);
    bg_log(BG_LOG_WARN, "kernels", "backend %s has %d threads", "cpu", 2);
    bg_log(BG_LOG_INFO, "runtime", "step %d", 7);
    bg_log(BG_LOG_DEBUG, "runtime", "below BRIGADE_LOG=info: dropped");
    pthread_t t;
    int made = pthread_create(&t, NULL, log_from_thread, NULL) == 0;
    if (made)
        pthread_join(t, NULL);
    bg_log_set_rank(-1);
    bg_log_set_sink(bgt_sink, &second); /* a replacement gets what follows */
    bg_log(BG_LOG_WARN, "ucx", "to the second sink");
    bg_log_set_sink(NULL, NULL);
    bg_log(BG_LOG_WARN, "core", "back on stderr");
    long n = bgt_capture_end(&cap, out, sizeof(out));
    assert_true(made);
    /* only the line written after the sink was removed */
    assert_int_equal(n, (long)strlen(out));
    assert_string_equal(out, "[brigade WARN core] back on stderr\n");
    assert_int_equal(sink.n, 3);
    assert_int_equal(sink.m[0].level, BG_LOG_WARN);
    assert_string_equal(sink.m[0].subsystem, "kernels");
    assert_int_equal(sink.m[0].rank, 3);
    assert_string_equal(sink.m[0].message, "backend cpu has 2 threads");
    assert_int_equal(sink.m[1].level, BG_LOG_INFO);
    assert_string_equal(sink.m[1].subsystem, "runtime");
    assert_string_equal(sink.m[1].message, "step 7");
    assert_int_equal(sink.m[2].level, BG_LOG_ERROR);
    assert_string_equal(sink.m[2].subsystem, "transport");
    assert_int_equal(sink.m[2].rank, 3);
    assert_string_equal(sink.m[2].message, "from another thread: peer gone");
    assert_true(pthread_equal(sink.m[2].thread, t));
    assert_false(pthread_equal(sink.m[2].thread, pthread_self()));
    assert_int_equal(second.n, 1);
    assert_int_equal(second.m[0].rank, -1);
    assert_string_equal(second.m[0].subsystem, "ucx");
    assert_string_equal(second.m[0].message, "to the second sink");
}

/* The floor check's verdict: the first missing x86-64-v3 feature, or none. */
static void test_cpu_floor(void **state)
{
    (void)state;
    assert_null(bg__cpu_floor_missing(1, 1, 1, 1, 1));
    assert_string_equal(bg__cpu_floor_missing(0, 0, 0, 0, 0), "AVX");
    assert_string_equal(bg__cpu_floor_missing(1, 0, 1, 1, 1), "AVX2"); /* Sandy Bridge */
    assert_string_equal(bg__cpu_floor_missing(1, 1, 0, 1, 1), "FMA");
    assert_string_equal(bg__cpu_floor_missing(1, 1, 1, 1, 0), "BMI2");
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init(); /* this machine runs the build, so it has what the check asks for */
    if (__builtin_cpu_supports("avx2"))
        assert_null(bg__cpu_floor_missing(__builtin_cpu_supports("avx"), 1, __builtin_cpu_supports("fma"),
                                          __builtin_cpu_supports("bmi"), __builtin_cpu_supports("bmi2")));
#endif
}


/* Two coroutines: a lane runs until it yields, then the other resumes where
 * it left off; a lane whose partner is done runs on without switching; the
 * statuses and messages come back per lane; yielding outside a pair is a
 * no-op. The sequence is checked against the order a reader derives by hand. */
typedef struct {
    char *log;
    int yields;  /* how many times this lane yields */
    int fail;    /* return an error after yielding */
    char id;
    int busy_at_start, lane_seen;
} lane_arg_t;

static bg_status_t lane_fn(void *arg)
{
    lane_arg_t *a = arg;
    char big[64 * 1024]; /* the lanes have stacks of their own: a large frame fits */
    memset(big, a->id, sizeof(big));
    a->busy_at_start = bg__pair_busy();
    a->lane_seen = bg__pair_lane();
    for (int k = 0; k < a->yields; k++) {
        size_t n = strlen(a->log);
        a->log[n] = a->id;
        a->log[n + 1] = '\0';
        if (!bg__pair_yield()) {
            n = strlen(a->log);
            a->log[n] = '-'; /* the partner was done: no switch */
            a->log[n + 1] = '\0';
        }
    }
    if (big[sizeof(big) - 1] != a->id)
        return bg_error(BG_ERR_INTERNAL, "lane %c: its stack changed under it", a->id);
    if (a->fail)
        return bg_error(BG_ERR_INVALID, "lane %c failed on purpose", a->id);
    return BG_OK;
}

static void test_fiber_pair(void **state)
{
    (void)state;
    assert_int_equal(bg__pair_yield(), 0);
    assert_int_equal(bg__pair_busy(), 0);
    assert_int_equal(bg__pair_lane(), 0);
    bg_pair_t *p;
    assert_int_equal(bg__pair_create(256 * 1024, &p), BG_OK);
    char log[64] = "";
    lane_arg_t a = {.log = log, .yields = 2, .id = 'a'}, b = {.log = log, .yields = 4, .id = 'b', .fail = 1};
    bg_status_t st[2];
    char msg[2][256];
    bg__pair_run(p, lane_fn, &a, lane_fn, &b, st, msg);
    /* a, b, a, b (each yield switches while the other is not done); a resumes and returns; b resumes
     * and yields twice more with a done: no switch */
    assert_string_equal(log, "ababb-b-");
    assert_int_equal(st[0], BG_OK);
    assert_int_equal(st[1], BG_ERR_INVALID);
    assert_string_equal(msg[0], "");
    assert_non_null(strstr(msg[1], "lane b failed on purpose"));
    assert_int_equal(a.lane_seen, 0);
    assert_int_equal(b.lane_seen, 1);
    assert_int_equal(a.busy_at_start, 1);
    assert_int_equal(b.busy_at_start, 1);
    assert_int_equal(bg__pair_yield(), 0); /* outside again */
    int idle = 0;
    assert_int_equal(bg__pair_wait_turn(&idle), 0); /* nothing to hand the thread to */
    assert_int_equal(idle, 0);
    /* the pair runs again, lane 0 done at once: lane 1 never switches */
    log[0] = '\0';
    a.yields = 0;
    b.fail = 0;
    b.yields = 2;
    bg__pair_run(p, lane_fn, &a, lane_fn, &b, st, msg);
    assert_string_equal(log, "b-b-");
    assert_int_equal(st[0], BG_OK);
    assert_int_equal(st[1], BG_OK);
    bg__pair_destroy(p);
}

/* A --save directory is replaceable when it holds only weights files; another rank's write probe, there
 * for an instant while it checks the same directory, does not count (two ranks checking at once failed
 * one of them); anything else is named. */
static void test_replaceable_dir(void **state)
{
    (void)state;
    char dir[] = "/tmp/bg_test_replace.XXXXXX", path[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/model-stage000.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(bg_check_replaceable_dir(dir, ".safetensors"), BG_OK);
    snprintf(path, sizeof path, "%s/.brigade-write-probe.4242", dir);
    assert_non_null(f = fopen(path, "wb"));
    fclose(f);
    assert_int_equal(bg_check_replaceable_dir(dir, ".safetensors"), BG_OK);
    unlink(path);
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    assert_non_null(f = fopen(path, "wb"));
    fclose(f);
    assert_int_equal(bg_check_replaceable_dir(dir, ".safetensors"), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "holds notes.txt, which is not a *.safetensors file"));
    unlink(path);
    snprintf(path, sizeof path, "%s/model-stage000.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    /* before the level is first resolved: info passes, debug does not */
    setenv("BRIGADE_LOG", "info", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_error_wraps_itself),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_log_sink),
        cmocka_unit_test(test_cpu_floor),
        cmocka_unit_test(test_fiber_pair),
        cmocka_unit_test(test_replaceable_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
