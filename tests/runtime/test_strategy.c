/* tests/runtime/test_strategy.c: the executor's strategy registry
 * (runtime/strategy.c) without running anything: every registered strategy
 * is named and answers `active`; which are active for a layout is the
 * table written out here by hand from the flags (--dp, --zero, --ps, the
 * schedule's copies, ties, --emulate), with at most one owner of the
 * gradients (dp, zero, ps-*) and ps-server / ps-worker split by role; a ONE
 * hook goes to the first active strategy that has it, and none to the
 * core's default. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "runtime/exec_impl.h"

static int count(void)
{
    int n = 0;
    while (bg__strategies[n])
        n++;
    return n;
}

static void test_registry(void **state)
{
    (void)state;
    int n = count();
    assert_true(n >= 7); /* ps-server, ps-worker, zero, dp, copies, ties, emulate */
    for (int i = 0; i < n; i++) {
        assert_non_null(bg__strategies[i]->name);
        assert_non_null(bg__strategies[i]->active);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(bg__strategies[i]->name, bg__strategies[j]->name);
    }
}

/* The names of the active strategies for x, in registry order, space separated. */
static void active_names(const exec_t *x, char *buf, size_t cap)
{
    buf[0] = 0;
    for (int i = 0; bg__strategies[i]; i++)
        if (bg__strategies[i]->active(x)) {
            strncat(buf, buf[0] ? " " : "", cap - strlen(buf) - 1);
            strncat(buf, bg__strategies[i]->name, cap - strlen(buf) - 1);
        }
}

typedef struct {
    int dp, zero, servers, server_role, copies, ties, emulate;
    const char *want;
    int ep;
    int cp; /* context members */
} row_t;

static void test_active(void **state)
{
    (void)state;
    static const row_t rows[] = {
        {1, 0, 0, 0, 1, 0, 0, "", 1, 1},                  /* one replica, nothing to reduce */
        {2, 0, 0, 0, 1, 0, 0, "dp", 1, 1},
        {2, 1, 0, 0, 1, 0, 0, "zero", 1, 1},
        {2, 2, 0, 0, 1, 1, 0, "zero ties", 1, 1},
        {1, 0, 0, 0, 2, 1, 0, "copies ties", 1, 1},        /* dualpipe: the copies' sum before the ties' */
        {2, 0, 0, 0, 2, 0, 0, "dp copies", 1, 1},
        {2, 0, 2, 1, 1, 1, 0, "ps-server", 1, 1},           /* a tie's a + b is the servers' */
        {2, 0, 2, 0, 1, 1, 0, "ps-worker", 1, 1},
        {2, 0, 1, 0, 1, 0, 1, "ps-worker emulate", 1, 1},
        {1, 0, 0, 0, 1, 0, 1, "emulate", 1, 1},
        {2, 0, 0, 0, 1, 0, 0, "ep dp", 2, 1},           /* expert parallelism: its buckets before dp's */
        {4, 0, 0, 0, 2, 1, 0, "ep dp copies ties", 2, 1},
        {1, 0, 0, 0, 1, 0, 0, "dp", 1, 2},              /* context members sum their gradients */
        {2, 0, 0, 0, 1, 1, 0, "dp ties", 1, 2},
    };
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    c.layers = 2, c.d_model = 16, c.heads = 2, c.seq_len = 8;
    bg_model_desc_t *plain = NULL, *tied = NULL;
    assert_int_equal(bg_model_build(&c, &plain), BG_OK);
    c.tie_embeddings = 1;
    assert_int_equal(bg_model_build(&c, &tied), BG_OK);
    bg__emulate_t em;
    memset(&em, 0, sizeof em);
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const row_t *w = &rows[r];
        exec_t *x = calloc(1, sizeof(*x));
        assert_non_null(x);
        x->lay.dp = w->dp;
        x->lay.cp = w->cp;
        x->lay.servers = w->servers;
        x->lay.me.role = w->server_role ? BG_LAYOUT_SERVER : BG_LAYOUT_WORKER;
        x->p.zero = w->zero;
        x->p.ep = w->ep;
        x->copies = w->copies;
        x->desc = w->ties ? tied : plain;
        x->em = w->emulate ? &em : NULL;
        char got[256];
        active_names(x, got, sizeof got);
        if (strcmp(got, w->want) != 0)
            fail_msg("row %zu: active \"%s\", expected \"%s\"", r, got, w->want);
        free(x);
    }
    bg_model_desc_destroy(plain);
    bg_model_desc_destroy(tied);
}

static bg_status_t reduce_a(exec_t *x, void *self, chunk_t *ch, int b)
{
    (void)x, (void)self, (void)ch, (void)b;
    return BG_OK;
}

/* ONE hooks: the first active strategy with the slot set; none: NULL (the core's default). */
static void test_one(void **state)
{
    (void)state;
    static const bg__strategy_ops_t without = {.name = "without"}, with = {.name = "with", .reduce = reduce_a},
                                    other = {.name = "other", .reduce = reduce_a};
    exec_t *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    x->strat[0].ops = &without;
    x->strat[1].ops = &with;
    x->strat[2].ops = &other;
    x->nstrat = 3;
    assert_ptr_equal(BG__ONE(x, reduce), &x->strat[1]);
    assert_null(BG__ONE(x, optimizer));
    x->nstrat = 1;
    assert_null(BG__ONE(x, reduce));
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_active),
        cmocka_unit_test(test_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
