/* tests/core: status strings, error messages, configuration parsing, RNG. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "brigade/core.h"

static void test_status_strings(void **state)
{
    (void)state;
    assert_string_equal(bg_status_string(BG_OK), "ok");
    assert_string_equal(bg_status_string(BG_ERR_INVALID), "invalid argument");
    assert_string_equal(bg_status_string((bg_status_t)-999), "unknown status");
    assert_int_equal(bg_error(BG_ERR_IO, "file %s: %d", "x.bin", 3), BG_ERR_IO);
    assert_string_equal(bg_last_error(), "file x.bin: 3");
    bg_error_clear();
    assert_string_equal(bg_last_error(), "");
}

/* Wrapping the current message in a new one (the executor's batch-source
 * errors, plan loading) passes bg_last_error() as an argument of bg_error:
 * the cause must survive, not be overwritten while it is being read. */
static void test_error_wraps_last_error(void **state)
{
    (void)state;
    bg_error(BG_ERR_INVALID, "the cause");
    assert_int_equal(bg_error(BG_ERR_IO, "%s: %s", "where", bg_last_error()), BG_ERR_IO);
    assert_string_equal(bg_last_error(), "where: the cause");
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_error_wraps_last_error),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_rng),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
