/* tests/runtime/test_layout.c: the rank layout (schedule/layout.c) against
 * tables written out by hand from ARCHITECTURE.md's order (tp fastest, then
 * cp, then dp, then pp; parameter servers first, then each worker's pipeline), the
 * coordinates and ranks inverse of each other, the stage questions against
 * a generated schedule's placement, and the job-size checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "schedule/layout.h"

/* pp 2 x dp 2 x tp 2: rank -> (pp, dp, tp), written out */
static void test_order(void **state)
{
    (void)state;
    static const int want[8][3] = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1},
                                   {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};
    for (int r = 0; r < 8; r++) {
        bg_layout_t l;
        bg__layout_init(&l, 2, 2, 1, 2, 0);
        assert_int_equal(bg__layout_bind(&l, 8, r), BG_OK);
        assert_int_equal(l.me.pp, want[r][0]);
        assert_int_equal(l.me.dp, want[r][1]);
        assert_int_equal(l.me.tp, want[r][2]);
        assert_int_equal(l.me.role, BG_LAYOUT_WORKER);
        assert_int_equal(bg__layout_rank(&l, want[r][0], want[r][1], 0, want[r][2]), r);
        assert_int_equal(bg__layout_tp_first(&l), r - r % 2);
        int dp[2];
        assert_int_equal(bg__layout_dp_ranks(&l, dp), 2);
        assert_int_equal(dp[0], (r / 4) * 4 + r % 2); /* same pp and tp member, replicas 0 and 1 */
        assert_int_equal(dp[1], (r / 4) * 4 + 2 + r % 2);
    }
}

/* pp 2 x dp 2 x cp 2 x tp 2: rank -> (pp, dp, cp, tp), written out; the
 * context group (same pp, dp, tp; tp apart) and the gradient's group (dp x
 * cp members of the same pp and tp) */
static void test_order_cp(void **state)
{
    (void)state;
    for (int r = 0; r < 16; r++) {
        int want[4] = {r / 8, r / 4 % 2, r / 2 % 2, r % 2}; /* 16 = 2 x 2 x 2 x 2: the bits, pp highest */
        bg_layout_t l;
        bg__layout_init(&l, 2, 2, 2, 2, 0);
        assert_int_equal(bg__layout_bind(&l, 16, r), BG_OK);
        assert_int_equal(l.me.pp, want[0]);
        assert_int_equal(l.me.dp, want[1]);
        assert_int_equal(l.me.cp, want[2]);
        assert_int_equal(l.me.tp, want[3]);
        assert_int_equal(bg__layout_rank(&l, want[0], want[1], want[2], want[3]), r);
        assert_int_equal(bg__layout_tp_first(&l), r - r % 2);
        assert_int_equal(bg__layout_lead(&l), want[1] == 0 && want[2] == 0);
        int cp[2], dp[4];
        assert_int_equal(bg__layout_cp_ranks(&l, cp), 2);
        assert_int_equal(cp[0], r & ~2); /* cp bit 0 and 1, the rest the same */
        assert_int_equal(cp[1], r | 2);
        assert_int_equal(bg__layout_dp_ranks(&l, dp), 4);
        for (int d = 0; d < 2; d++)
            for (int c = 0; c < 2; c++)
                assert_int_equal(dp[d * 2 + c], (r & ~6) | d << 2 | c << 1);
    }
    bg_layout_t l;
    bg__layout_init(&l, 1, 2, 4, 1, 0);
    assert_int_equal(bg__layout_bind(&l, 4, 0), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "pp 1 x dp 2 x cp 4 = 8 ranks, but the job has 4"));
}

/* --ps 2 --pp 3 on 8 ranks: servers 0, 1; worker 0 ranks 2..4, worker 1 ranks 5..7 */
static void test_servers(void **state)
{
    (void)state;
    static const int want[8][3] = {{0, -1, 1}, {0, -1, 1}, {0, 0, 0}, {1, 0, 0},
                                   {2, 0, 0}, {0, 1, 0}, {1, 1, 0}, {2, 1, 0}}; /* pp, dp, server */
    for (int r = 0; r < 8; r++) {
        bg_layout_t l;
        bg__layout_init(&l, 3, 1, 1, 1, 2);
        assert_int_equal(bg__layout_bind(&l, 8, r), BG_OK);
        assert_int_equal(l.dp, 2); /* the workers are the replicas */
        assert_int_equal(l.me.role, want[r][2] ? BG_LAYOUT_SERVER : BG_LAYOUT_WORKER);
        assert_int_equal(l.me.pp, want[r][0]);
        assert_int_equal(l.me.dp, want[r][1]);
        if (!want[r][2])
            assert_int_equal(bg__layout_rank(&l, l.me.pp, l.me.dp, 0, 0), r);
        int dp[2];
        assert_int_equal(bg__layout_dp_ranks(&l, dp), 0); /* the workers push to the servers */
    }
}

static void test_checks(void **state)
{
    (void)state;
    bg_layout_t l;
    bg__layout_init(&l, 2, 2, 1, 1, 0);
    assert_int_equal(bg__layout_bind(&l, 3, 0), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "pp 2 x dp 2 = 4 ranks, but the job has 3"));
    bg__layout_init(&l, 2, 1, 1, 1, 1);
    assert_int_equal(bg__layout_bind(&l, 4, 0), BG_ERR_INVALID); /* 3 workers' ranks, not whole pipelines */
    bg__layout_init(&l, 1, 3, 1, 1, 1);
    assert_int_equal(bg__layout_bind(&l, 3, 0), BG_ERR_INVALID); /* --dp 3 but 2 workers */
    bg__layout_init(&l, 1, 1, 1, 1, 2);
    assert_int_equal(bg__layout_bind(&l, 2, 0), BG_ERR_INVALID); /* no worker left */
}

/* The stage questions follow the schedule's placement: dualpipev on pp 2
 * (a V: stages 0 and 3 on rank 0, 1 and 2 on rank 1), dp 2. */
static void test_stages(void **state)
{
    (void)state;
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = BG_SCHED_DUALPIPEV;
    sp.stages = 2;
    sp.microbatches = 4;
    bg_schedule_t *s = NULL;
    assert_int_equal(bg_schedule_generate(&sp, &s), BG_OK);
    bg_layout_t l;
    bg__layout_init(&l, 2, 2, 1, 1, 0);
    assert_int_equal(bg__layout_bind(&l, 4, 1), BG_OK); /* pp 0, replica 1 */
    bg__layout_set_schedule(&l, s);
    for (int st = 0; st < bg_schedule_stages(s); st++) {
        int pp = bg_schedule_stage_rank(s, st);
        assert_int_equal(bg__layout_stage_pp(&l, st), pp);
        assert_int_equal(bg__layout_stage_rank(&l, st, 1), pp * 2 + 1);
        assert_int_equal(bg__layout_chunk_stage(&l, pp, bg_schedule_stage_chunk(s, st)), st);
        assert_int_equal(bg__layout_copy(&l, st), 0); /* dualpipev: one copy */
        assert_int_equal(bg__layout_model_stage(&l, st), st);
    }
    assert_int_equal(bg__layout_stage_pp(&l, 0), 0);
    assert_int_equal(bg__layout_stage_pp(&l, 3), 0);
    assert_int_equal(bg__layout_stage_pp(&l, 1), 1);
    bg_schedule_free(s);
    /* dualpipe: two copies of 2 model stages; stage 2 is copy 1 of model stage 0, its twin stage 0 */
    sp.kind = BG_SCHED_DUALPIPE;
    assert_int_equal(bg_schedule_generate(&sp, &s), BG_OK);
    bg__layout_set_schedule(&l, s);
    assert_int_equal(bg_schedule_copies(s), 2);
    assert_int_equal(bg__layout_model_stage(&l, 2), 0);
    assert_int_equal(bg__layout_copy(&l, 2), 1);
    assert_int_equal(bg__layout_twin(&l, 2), 0);
    assert_int_equal(bg__layout_twin(&l, 1), 3);
    bg_schedule_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_order_cp),
        cmocka_unit_test(test_servers),
        cmocka_unit_test(test_checks),
        cmocka_unit_test(test_stages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
