/* tests/schedule: the schedule layer against independent references: closed
 * forms of the bubble and stash over a grid of p and m, a naive re-walk of
 * every generated program (deadlock freedom), hand-made wrong programs that
 * the validator must reject with the right message, JSON round trips and
 * errors, and hand-computed simulator timings with a link model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "brigade/schedule.h"
#include "schedule/simulate.h"

#define NEAR(a, b) (fabs((double)(a) - (double)(b)) <= 1e-9 * (1 + fabs((double)(b))))

static bg_schedule_t *gen(bg_schedule_kind_t kind, int p, int m, int v)
{
    bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
    gp.kind = kind, gp.stages = p, gp.microbatches = m, gp.chunks = v;
    bg_schedule_t *s = NULL;
    bg_status_t st = bg_schedule_generate(&gp, &s);
    if (st != BG_OK)
        fail_msg("generate %s p=%d m=%d v=%d: %s", bg_schedule_kind_name(kind), p, m, v, bg_last_error());
    return s;
}

static bg_sim_result_t *sim_unit(const bg_schedule_t *s)
{
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    bg_sim_result_t *r = NULL;
    if (bg_schedule_simulate(s, &sp, &r) != BG_OK)
        fail_msg("simulate %s: %s", bg_schedule_name(s), bg_last_error());
    return r;
}

/* ---------------- closed forms ---------------- */

static void test_gpipe_1f1b_closed_forms(void **state)
{
    (void)state;
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 32; m++)
            for (int k = 0; k < 2; k++) {
                bg_schedule_t *s = gen(k ? BG_SCHED_1F1B : BG_SCHED_GPIPE, p, m, 0);
                bg_sim_result_t *r = sim_unit(s);
                double want = (double)(p - 1) / (m + p - 1);
                if (!NEAR(bg_sim_step_time(r), 3.0 * (m + p - 1)) || !NEAR(bg_sim_bubble(r, -1), want))
                    fail_msg("%s p=%d m=%d: step %g bubble %g, want %d and %g", bg_schedule_name(s), p, m,
                             bg_sim_step_time(r), bg_sim_bubble(r, -1), 3 * (m + p - 1), want);
                for (int rk = 0; rk < p; rk++) {
                    int stash = k ? (p - rk < m ? p - rk : m) : m;
                    if (!NEAR(bg_sim_bubble(r, rk), want) || bg_sim_peak_stash(r, rk) != stash)
                        fail_msg("%s p=%d m=%d rank %d: bubble %g stash %d, want %g and %d", bg_schedule_name(s), p,
                                 m, rk, bg_sim_bubble(r, rk), bg_sim_peak_stash(r, rk), want, stash);
                }
                bg_sim_result_free(r);
                bg_schedule_free(s);
            }
}

static void test_interleaved_closed_form(void **state)
{
    (void)state;
    int checked = 0;
    for (int p = 1; p <= 8; p++)
        for (int v = 2; v <= 4; v++)
            for (int m = p; m <= 32; m += p) {
                bg_schedule_t *s = gen(BG_SCHED_INTERLEAVED, p, m, v);
                bg_sim_result_t *r = sim_unit(s);
                double want = (double)(p - 1) / (v * m + p - 1);
                for (int rk = -1; rk < p; rk++)
                    if (!NEAR(bg_sim_bubble(r, rk), want))
                        fail_msg("interleaved p=%d v=%d m=%d rank %d: bubble %g, want (p-1)/(vm+p-1) = %g", p, v, m,
                                 rk, bg_sim_bubble(r, rk), want);
                checked++;
                bg_sim_result_free(r);
                bg_schedule_free(s);
            }
    assert_true(checked > 100);
}

static void test_zero_bubble_closed_forms(void **state)
{
    (void)state;
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 32; m++) {
            /* ZB-H1: idle (p-1)(F+B-W) per rank vs 1F1B's (p-1)(F+B+W) when m >= p; stash <= p always */
            bg_schedule_t *h1 = gen(BG_SCHED_ZB_H1, p, m, 0), *ff = gen(BG_SCHED_1F1B, p, m, 0);
            bg_sim_result_t *r1 = sim_unit(h1), *rf = sim_unit(ff);
            for (int rk = 0; rk < p; rk++) {
                if (m >= p && (!NEAR(bg_sim_idle(r1, rk), p - 1.0) || !NEAR(bg_sim_idle(rf, rk), 3.0 * (p - 1))))
                    fail_msg("p=%d m=%d rank %d: zb-h1 idle %g (want %d), 1f1b idle %g (want %d)", p, m, rk,
                             bg_sim_idle(r1, rk), p - 1, bg_sim_idle(rf, rk), 3 * (p - 1));
                if (bg_sim_peak_stash(r1, rk) > (p < m ? p : m))
                    fail_msg("zb-h1 p=%d m=%d rank %d: stash %d > min(p, m)", p, m, rk, bg_sim_peak_stash(r1, rk));
            }
            bg_sim_result_free(r1), bg_sim_result_free(rf);
            bg_schedule_free(h1), bg_schedule_free(ff);
            /* ZB-H2: no bubble inside any rank's span for m >= 2p; stash <= 2p-1 always */
            bg_schedule_t *h2 = gen(BG_SCHED_ZB_H2, p, m, 0);
            bg_sim_result_t *r2 = sim_unit(h2);
            for (int rk = 0; rk < p; rk++) {
                if (m >= 2 * p && (bg_sim_span_bubble(r2, rk) != 0.0 || !NEAR(bg_sim_idle(r2, rk), p - 1.0)))
                    fail_msg("zb-h2 p=%d m=%d rank %d: span bubble %g idle %g, want 0 and %d", p, m, rk,
                             bg_sim_span_bubble(r2, rk), bg_sim_idle(r2, rk), p - 1);
                if (bg_sim_peak_stash(r2, rk) > 2 * p - 1)
                    fail_msg("zb-h2 p=%d m=%d rank %d: stash %d > 2p-1", p, m, rk, bg_sim_peak_stash(r2, rk));
            }
            bg_sim_result_free(r2);
            bg_schedule_free(h2);
            /* ZB-V: idle (p-1)F per rank for m >= 2p; stash <= 2p chunk-microbatches always */
            bg_schedule_t *zv = gen(BG_SCHED_ZBV, p, m, 0);
            bg_sim_result_t *rv = sim_unit(zv);
            for (int rk = 0; rk < p; rk++) {
                if (m >= 2 * p && !NEAR(bg_sim_idle(rv, rk), p - 1.0))
                    fail_msg("zbv p=%d m=%d rank %d: idle %g, want %d", p, m, rk, bg_sim_idle(rv, rk), p - 1);
                if (bg_sim_peak_stash(rv, rk) > 2 * p)
                    fail_msg("zbv p=%d m=%d rank %d: stash %d > 2p", p, m, rk, bg_sim_peak_stash(rv, rk));
            }
            bg_sim_result_free(rv);
            bg_schedule_free(zv);
        }
}

/* ---------------- validator on everything generated ---------------- */

/* naive reference of the deadlock walk: sweep all ranks until nothing moves */
static int naive_walk_ok(const bg_schedule_t *s)
{
    int p = bg_schedule_ranks(s), S = bg_schedule_stages(s), M = bg_schedule_microbatches(s);
    unsigned char *sent = calloc((size_t)2 * S * M, 1);
    size_t *ptr = calloc((size_t)p, sizeof(size_t));
    int moved = 1;
    while (moved) {
        moved = 0;
        for (int r = 0; r < p; r++) {
            size_t n;
            const bg_sched_op_t *ops = bg_schedule_rank_ops(s, r, &n);
            if (ptr[r] >= n)
                continue;
            const bg_sched_op_t *o = &ops[ptr[r]];
            if (o->kind == BG_OP_RECV_ACT && !sent[(size_t)(o->stage - 1) * M + o->microbatch])
                continue;
            if (o->kind == BG_OP_RECV_GRAD && !sent[(size_t)S * M + (size_t)(o->stage + 1) * M + o->microbatch])
                continue;
            if (o->kind == BG_OP_SEND_ACT)
                sent[(size_t)o->stage * M + o->microbatch] = 1;
            if (o->kind == BG_OP_SEND_GRAD)
                sent[(size_t)S * M + (size_t)o->stage * M + o->microbatch] = 1;
            ptr[r]++;
            moved = 1;
        }
    }
    int ok = 1;
    for (int r = 0; r < p; r++) {
        size_t n;
        bg_schedule_rank_ops(s, r, &n);
        ok &= ptr[r] == n;
    }
    free(sent), free(ptr);
    return ok;
}

static int same_programs(const bg_schedule_t *a, const bg_schedule_t *b)
{
    if (bg_schedule_ranks(a) != bg_schedule_ranks(b) || bg_schedule_chunks(a) != bg_schedule_chunks(b) ||
        bg_schedule_copies(a) != bg_schedule_copies(b) ||
        bg_schedule_microbatches(a) != bg_schedule_microbatches(b) || strcmp(bg_schedule_name(a), bg_schedule_name(b)))
        return 0;
    for (int st = 0; st < bg_schedule_stages(a); st++)
        if (bg_schedule_stage_rank(a, st) != bg_schedule_stage_rank(b, st) ||
            bg_schedule_stage_chunk(a, st) != bg_schedule_stage_chunk(b, st))
            return 0;
    for (int r = 0; r < bg_schedule_ranks(a); r++) {
        size_t na, nb;
        const bg_sched_op_t *oa = bg_schedule_rank_ops(a, r, &na), *ob = bg_schedule_rank_ops(b, r, &nb);
        if (na != nb || memcmp(oa, ob, na * sizeof(*oa)))
            return 0;
    }
    return 1;
}

static void add_op(bg_schedule_t *s, int kind, int mb, int stage)
{
    bg_sched_op_t o = {kind, mb, stage, stage, -1, -1}; /* one rank: chunk c holds stage c */
    assert_int_equal(bg_schedule_append(s, 0, &o), BG_OK);
}

/* LoopedBFS on one rank (torch's ScheduleLoopedBFS: every stage's forwards,
 * then the stages' backwards in reverse, last microbatch first): the input
 * halves stay, the weight halves run in microbatch order right after the
 * first microbatch's backward; again: nothing moves. A missing predecessor
 * is named. */
static void test_order_weights(void **state)
{
    (void)state;
    for (int v = 1; v <= 2; v++) {
        const int m = 4;
        bg_schedule_t *s;
        assert_int_equal(bg_schedule_create("lbfs", 1, m, v, NULL, &s), BG_OK);
        for (int st = 0; st < v; st++)
            for (int mb = 0; mb < m; mb++)
                add_op(s, BG_OP_FORWARD, mb, st);
        for (int st = v - 1; st >= 0; st--)
            for (int mb = m - 1; mb >= 0; mb--)
                add_op(s, BG_OP_BACKWARD, mb, st);
        for (int k = 0; k < 2; k++)
            for (int st = 0; st < v; st++)
                add_op(s, k ? BG_OP_OPTIMIZER_STEP : BG_OP_REDUCE_GRADS, -1, st);
        assert_int_equal(bg_schedule_validate(s), BG_ERR_INVALID);
        assert_non_null(strstr(bg_last_error(), "weight gradients add up in microbatch order"));
        int moved = -1;
        assert_int_equal(bg_schedule_order_weights(s, &moved), BG_OK);
        assert_int_equal(moved, v * (m - 1)); /* every backward but mb 0's is split */
        if (bg_schedule_validate(s) != BG_OK)
            fail_msg("v=%d: %s", v, bg_last_error());
        size_t n;
        const bg_sched_op_t *ops = bg_schedule_rank_ops(s, 0, &n);
        assert_int_equal(n, (size_t)v * m * 2 + (size_t)v * (m - 1) + 2u * v);
        for (int st = 0; st < v; st++) { /* per stage: b3 b2 b1 B0 W1 W2 W3, contiguous */
            size_t at = (size_t)v * m + (size_t)(v - 1 - st) * (2 * m - 1);
            for (int k = 0; k < 2 * m - 1; k++) {
                int kind = k < m - 1 ? BG_OP_BACKWARD_INPUT : k == m - 1 ? BG_OP_BACKWARD : BG_OP_BACKWARD_WEIGHT;
                int mb = k < m ? m - 1 - k : k - m + 1;
                assert_int_equal(ops[at + k].kind, kind);
                assert_int_equal(ops[at + k].microbatch, mb);
                assert_int_equal(ops[at + k].stage, st);
            }
        }
        assert_int_equal(bg_schedule_order_weights(s, &moved), BG_OK);
        assert_int_equal(moved, 0);
        bg_schedule_free(s);
    }
    bg_schedule_t *s;
    assert_int_equal(bg_schedule_create("gap", 1, 3, 1, NULL, &s), BG_OK);
    for (int mb = 0; mb < 3; mb++)
        add_op(s, BG_OP_FORWARD, mb, 0);
    for (int mb = 0; mb < 3; mb++)
        add_op(s, BG_OP_BACKWARD_INPUT, mb, 0);
    add_op(s, BG_OP_BACKWARD_WEIGHT, 1, 0);
    add_op(s, BG_OP_BACKWARD_WEIGHT, 2, 0);
    assert_int_equal(bg_schedule_order_weights(s, NULL), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "the weight gradient of microbatch 1 stage 0 waits for that of "
                                            "microbatch 0, which the program does not have"));
    bg_schedule_free(s);
}

static void test_validate_all_generated(void **state)
{
    (void)state;
    int n = 0;
    for (int k = 0; k < BG_SCHED_CUSTOM; k++)
        for (int p = 1; p <= 8; p++)
            for (int m = 1; m <= 20; m++)
                for (int v = 0; v <= (k == BG_SCHED_INTERLEAVED ? 4 : 0); v += (k == BG_SCHED_INTERLEAVED ? 2 : 1)) {
                    int vv = k == BG_SCHED_INTERLEAVED ? (v ? v - 1 : 0) + 2 : 0; /* 2, 3 */
                    if (k == BG_SCHED_INTERLEAVED && v == 4)
                        vv = 4;
                    if (k == BG_SCHED_DUALPIPEV && m < 2 * p)
                        continue; /* needs m >= 2p (test_bad_params) */
                    if (k == BG_SCHED_DUALPIPE && (p % 2 || m % 2 || m < 2 * p))
                        continue; /* needs p even, m even, m >= 2p (test_costs.c) */
                    bg_schedule_t *s = gen((bg_schedule_kind_t)k, p, m, vv);
                    if (bg_schedule_validate(s) != BG_OK)
                        fail_msg("%s p=%d m=%d v=%d does not validate: %s", bg_schedule_name(s), p, m, vv,
                                 bg_last_error());
                    assert_true(naive_walk_ok(s));
                    /* every (mb, stage) has exactly one forward on the stage's rank */
                    size_t cnt = 0;
                    for (int r = 0; r < p; r++) {
                        size_t no;
                        const bg_sched_op_t *ops = bg_schedule_rank_ops(s, r, &no);
                        for (size_t i = 0; i < no; i++)
                            cnt += ops[i].kind == BG_OP_FORWARD;
                        /* programs end with reduce_grads then optimizer_step per chunk */
                        assert_int_equal(ops[no - 1].kind, BG_OP_OPTIMIZER_STEP);
                    }
                    /* each copy's stages see the microbatches of its copy (one copy: all) */
                    assert_int_equal(cnt, (size_t)m * bg_schedule_stages(s) / bg_schedule_copies(s));
                    /* JSON round trip: write, read, equal */
                    char *js;
                    bg_schedule_t *back;
                    assert_int_equal(bg_schedule_to_json(s, &js), BG_OK);
                    if (bg_schedule_from_json(js, &back) != BG_OK)
                        fail_msg("read back %s p=%d m=%d: %s", bg_schedule_name(s), p, m, bg_last_error());
                    assert_true(same_programs(s, back));
                    assert_int_equal(bg_schedule_kind(back), k);
                    int moved = -1; /* the generators keep weight gradients in microbatch order */
                    assert_int_equal(bg_schedule_order_weights(back, &moved), BG_OK);
                    assert_int_equal(moved, 0);
                    assert_true(same_programs(s, back));
                    free(js);
                    bg_schedule_free(back);
                    bg_schedule_free(s);
                    n++;
                }
    assert_true(n >= 6 * 8 * 20);
}

/* ---------------- hand-made programs ---------------- */

/* 1F1B for p = 2, m = 1, written by hand in the JSON format */
#define OP(k, mb, st) "{\"kind\":\"" k "\",\"microbatch\":" #mb ",\"stage\":" #st "}"
#define TAIL(st) OP("reduce_grads", -1, st) "," OP("optimizer_step", -1, st)
static const char *good_r0[] = {OP("forward", 0, 0), OP("send_act", 0, 0), OP("recv_grad", 0, 0),
                                OP("backward", 0, 0), OP("reduce_grads", -1, 0), OP("optimizer_step", -1, 0)};
static const char *good_r1[] = {OP("recv_act", 0, 1), OP("forward", 0, 1), OP("backward", 0, 1),
                                OP("send_grad", 0, 1), OP("reduce_grads", -1, 1), OP("optimizer_step", -1, 1)};

/* builds a 2-rank program from two op lists (NULL entries skipped) */
static char *prog2(const char **r0, int n0, const char **r1, int n1)
{
    static char buf[8192];
    size_t len = (size_t)snprintf(buf, sizeof buf,
                                  "{\"schedule\":\"hand\",\"stages\":2,\"microbatches\":1,\"chunks\":1,\"ranks\":["
                                  "{\"rank\":0,\"ops\":[");
    for (int i = 0, first = 1; i < n0; i++)
        if (r0[i])
            len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", first ? "" : ",", r0[i]), first = 0;
    len += (size_t)snprintf(buf + len, sizeof buf - len, "]},{\"rank\":1,\"ops\":[");
    for (int i = 0, first = 1; i < n1; i++)
        if (r1[i])
            len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", first ? "" : ",", r1[i]), first = 0;
    snprintf(buf + len, sizeof buf - len, "]}]}");
    return buf;
}

static void expect_invalid(const char *json, bg_status_t want, const char *needle, const char *needle2)
{
    bg_schedule_t *s;
    if (bg_schedule_from_json(json, &s) != BG_OK)
        fail_msg("hand-made program does not parse: %s", bg_last_error());
    bg_status_t st = bg_schedule_validate(s);
    if (st != want || !strstr(bg_last_error(), needle) || (needle2 && !strstr(bg_last_error(), needle2)))
        fail_msg("want status %d with \"%s\"/\"%s\", got %d: %s", want, needle, needle2 ? needle2 : "", st,
                 bg_last_error());
    /* the simulator refuses it too */
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    bg_sim_result_t *r = NULL;
    assert_int_equal(bg_schedule_simulate(s, &sp, &r), want);
    assert_null(r);
    bg_schedule_free(s);
}

static void test_validator_rejects_wrong_programs(void **state)
{
    (void)state;
    const char *a[6], *b[6];
    bg_schedule_t *s;
    /* the reference program is valid */
    assert_int_equal(bg_schedule_from_json(prog2(good_r0, 6, good_r1, 6), &s), BG_OK);
    assert_int_equal(bg_schedule_validate(s), BG_OK);
    bg_schedule_free(s);

    /* missing recv: rank 1 never receives the activation */
    memcpy(a, good_r0, sizeof a), memcpy(b, good_r1, sizeof b);
    b[0] = NULL;
    expect_invalid(prog2(a, 6, b, 6), BG_ERR_INVALID, "rank 0 op 1 (send_act mb 0 stage 0 -> stage 1)",
                   "no matching recv_act on rank 1");

    /* F after B on the last stage */
    memcpy(b, good_r1, sizeof b);
    b[1] = good_r1[2], b[2] = good_r1[1];
    expect_invalid(prog2(good_r0, 6, b, 6), BG_ERR_INVALID, "rank 1 op 1 (backward mb 0 stage 1)",
                   "backward before its forward");

    /* duplicate send */
    const char *a7[7] = {good_r0[0], good_r0[1], good_r0[1], good_r0[2], good_r0[3], good_r0[4], good_r0[5]};
    expect_invalid(prog2(a7, 7, good_r1, 6), BG_ERR_INVALID, "rank 0 op 2 (send_act", "duplicate");

    /* deadlock: rank 0 waits for the gradient before sending the activation */
    memcpy(a, good_r0, sizeof a);
    a[1] = good_r0[2], a[2] = good_r0[1];
    expect_invalid(prog2(a, 6, good_r1, 6), BG_ERR_DEADLOCK, "rank 0 op 1 (recv_grad mb 0 stage 0 <- stage 1)",
                   "cycle: rank 0 -> rank 1 -> rank 0");

    /* send before the compute producing it */
    memcpy(b, good_r1, sizeof b);
    b[2] = good_r1[3], b[3] = good_r1[2];
    expect_invalid(prog2(good_r0, 6, b, 6), BG_ERR_INVALID, "rank 1 op 2 (send_grad", "before the backward");

    /* missing optimizer step */
    memcpy(b, good_r1, sizeof b);
    b[5] = NULL;
    expect_invalid(prog2(good_r0, 6, b, 6), BG_ERR_INVALID, "no optimizer_step for stage 1", NULL);

    /* reduce before the backward */
    memcpy(a, good_r0, sizeof a);
    a[3] = good_r0[4], a[4] = good_r0[3];
    expect_invalid(prog2(a, 6, good_r1, 6), BG_ERR_INVALID, "rank 0 op 3 (reduce_grads", "before the last backward");
}

/* ---------------- forward-only programs ---------------- */

/* s written as JSON (which must hold @p needle) and read back: the same programs; the copy read back */
static bg_schedule_t *json_round_trip(const bg_schedule_t *s, const char *needle)
{
    char *js;
    bg_schedule_t *back;
    assert_int_equal(bg_schedule_to_json(s, &js), BG_OK);
    assert_non_null(strstr(js, needle));
    assert_int_equal(bg_schedule_from_json(js, &back), BG_OK);
    assert_true(same_programs(s, back));
    free(js);
    return back;
}

/* Every generator's program maps to a forward-only one that validates, completes under the naive walk,
 * holds each (mb, stage)'s forward once and nothing but forwards and activation transfers, in the
 * training program's order, survives JSON, and keeps no stash: with unit costs and free links a
 * one-chunk pipeline's forward-only step is the fill m + p - 1 (the forwards of mb i on rank r start at
 * i + r). */
static void test_forward_only_all_generated(void **state)
{
    (void)state;
    int n = 0;
    for (int k = 0; k < BG_SCHED_CUSTOM; k++)
        for (int p = 1; p <= 6; p++)
            for (int m = 1; m <= 12; m++) {
                if ((k == BG_SCHED_DUALPIPEV && m < 2 * p) || (k == BG_SCHED_DUALPIPE && (p % 2 || m % 2 || m < 2 * p)))
                    continue;
                bg_schedule_t *s = gen((bg_schedule_kind_t)k, p, m, 0), *f = NULL;
                assert_int_equal(bg_schedule_is_forward_only(s), 0);
                if (bg_schedule_forward_only(s, &f) != BG_OK || bg_schedule_validate(f) != BG_OK)
                    fail_msg("forward-only %s p=%d m=%d: %s", bg_schedule_name(s), p, m, bg_last_error());
                assert_int_equal(bg_schedule_is_forward_only(f), 1);
                assert_int_equal(bg_schedule_kind(f), k);
                assert_int_equal(bg_schedule_copies(f), bg_schedule_copies(s));
                assert_true(naive_walk_ok(f));
                size_t cnt = 0;
                for (int r = 0; r < p; r++) {
                    size_t ns, nf, j = 0;
                    const bg_sched_op_t *os = bg_schedule_rank_ops(s, r, &ns), *of = bg_schedule_rank_ops(f, r, &nf);
                    for (size_t i = 0; i < nf; i++) {
                        int kind = of[i].kind;
                        assert_true(kind == BG_OP_FORWARD || kind == BG_OP_SEND_ACT || kind == BG_OP_RECV_ACT);
                        cnt += kind == BG_OP_FORWARD;
                        while (j < ns && memcmp(&os[j], &of[i], sizeof(*os))) /* a subsequence of the training order */
                            j++;
                        assert_true(j++ < ns);
                    }
                }
                assert_int_equal(cnt, (size_t)m * bg_schedule_stages(s) / bg_schedule_copies(s));
                bg_schedule_t *back = json_round_trip(f, "\"forward_only\":true");
                assert_int_equal(bg_schedule_is_forward_only(back), 1);
                bg_sim_result_t *r = sim_unit(f);
                for (int rk = 0; rk < p; rk++)
                    assert_int_equal(bg_sim_peak_stash(r, rk), 1); /* each forward's stash freed at once */
                if (bg_schedule_chunks(s) == 1 && bg_schedule_copies(s) == 1 && !NEAR(bg_sim_step_time(r), m + p - 1))
                    fail_msg("forward-only %s p=%d m=%d: step %g, want %d", bg_schedule_name(s), p, m,
                             bg_sim_step_time(r), m + p - 1);
                bg_sim_result_free(r);
                bg_schedule_free(back), bg_schedule_free(f), bg_schedule_free(s);
                n++;
            }
    assert_true(n >= 7 * 6 * 12);
}

static char *fwd_prog2(const char **r0, int n0, const char **r1, int n1)
{
    char *js = prog2(r0, n0, r1, n1);
    static char buf[8300];
    snprintf(buf, sizeof buf, "{\"forward_only\":true,%s", js + 1);
    return buf;
}

static void test_validator_forward_only(void **state)
{
    (void)state;
    const char *f0[] = {OP("forward", 0, 0), OP("send_act", 0, 0)};
    const char *f1[] = {OP("recv_act", 0, 1), OP("forward", 0, 1)};
    bg_schedule_t *s;
    /* well formed: accepted, and without the flag the same program is a training one missing its backward */
    assert_int_equal(bg_schedule_from_json(fwd_prog2(f0, 2, f1, 2), &s), BG_OK);
    assert_int_equal(bg_schedule_is_forward_only(s), 1);
    assert_int_equal(bg_schedule_validate(s), BG_OK);
    bg_schedule_free(s);
    expect_invalid(prog2(f0, 2, f1, 2), BG_ERR_INVALID, "has no backward of mb 0 stage", NULL);
    /* a backward in a forward-only program */
    const char *b1[] = {OP("recv_act", 0, 1), OP("forward", 0, 1), OP("backward", 0, 1)};
    expect_invalid(fwd_prog2(f0, 2, b1, 3), BG_ERR_INVALID, "rank 1 op 2 (backward mb 0 stage 1)",
                   "forward-only program holds forwards and activation transfers only");
    /* a whole training program marked forward-only */
    expect_invalid(fwd_prog2(good_r0, 6, good_r1, 6), BG_ERR_INVALID, "rank 0 op 2 (recv_grad", "forward-only");
    const char *o1[] = {OP("recv_act", 0, 1), OP("forward", 0, 1), OP("optimizer_step", -1, 1)};
    expect_invalid(fwd_prog2(f0, 2, o1, 3), BG_ERR_INVALID, "rank 1 op 2 (optimizer_step", "forward-only");
    /* a missing forward, a missing receive, a send before its forward, a deadlock */
    const char *m1[] = {OP("recv_act", 0, 1)};
    expect_invalid(fwd_prog2(f0, 2, m1, 1), BG_ERR_INVALID, "no forward of mb 0 stage 1 after it", NULL);
    const char *n1[] = {OP("forward", 0, 1)};
    expect_invalid(fwd_prog2(f0, 2, n1, 1), BG_ERR_INVALID, "rank 0 op 1 (send_act", "no matching recv_act on rank 1");
    expect_invalid(fwd_prog2(f0, 1, n1, 1), BG_ERR_INVALID, "rank 1 op 0 (forward mb 0 stage 1)",
                   "needs recv_act of mb 0 from stage 0");
    const char *s0[] = {OP("send_act", 0, 0), OP("forward", 0, 0)};
    expect_invalid(fwd_prog2(s0, 2, f1, 2), BG_ERR_INVALID, "sends an activation before the forward", NULL);
    /* the flag must be a boolean */
    char bad[9000];
    snprintf(bad, sizeof bad, "{\"forward_only\":1,%s", prog2(f0, 2, f1, 2) + 1);
    assert_int_equal(bg_schedule_from_json(bad, &s), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "forward_only"));
    /* a hand-built one: set the flag, then it validates */
    assert_int_equal(bg_schedule_create("hand", 1, 2, 1, NULL, &s), BG_OK);
    for (int mb = 0; mb < 2; mb++) {
        bg_sched_op_t op = {BG_OP_FORWARD, mb, 0, 0, -1, -1};
        assert_int_equal(bg_schedule_append(s, 0, &op), BG_OK);
    }
    assert_int_not_equal(bg_schedule_validate(s), BG_OK);
    assert_int_equal(bg_schedule_set_forward_only(s, 1), BG_OK);
    assert_int_equal(bg_schedule_validate(s), BG_OK);
    bg_schedule_free(s);
}

/* a copy of s with op `from` of rank r moved to position `to` */
static bg_schedule_t *moved(const bg_schedule_t *s, int r, size_t from, size_t to)
{
    int p = bg_schedule_ranks(s), v = bg_schedule_chunks(s);
    int map[64];
    for (int k = 0; k < p; k++)
        for (int c = 0; c < v; c++)
            map[k * v + c] = -1;
    for (int st = 0; st < bg_schedule_stages(s); st++)
        map[bg_schedule_stage_rank(s, st) * v + bg_schedule_stage_chunk(s, st)] = st;
    bg_schedule_t *t;
    assert_int_equal(bg_schedule_create("moved", p, bg_schedule_microbatches(s), v, map, &t), BG_OK);
    for (int k = 0; k < p; k++) {
        size_t n;
        const bg_sched_op_t *ops = bg_schedule_rank_ops(s, k, &n);
        bg_sched_op_t *o = malloc(n * sizeof(*o));
        memcpy(o, ops, n * sizeof(*o));
        if (k == r) {
            bg_sched_op_t x = o[from];
            if (from < to)
                memmove(&o[from], &o[from + 1], (to - from) * sizeof(*o));
            else
                memmove(&o[to + 1], &o[to], (from - to) * sizeof(*o));
            o[to] = x;
        }
        for (size_t i = 0; i < n; i++)
            assert_int_equal(bg_schedule_append(t, k, &o[i]), BG_OK);
        free(o);
    }
    return t;
}

static size_t find_op(const bg_schedule_t *s, int r, int kind, int mb, int stage)
{
    size_t n;
    const bg_sched_op_t *ops = bg_schedule_rank_ops(s, r, &n);
    for (size_t i = 0; i < n; i++)
        if (ops[i].kind == kind && ops[i].microbatch == mb && (stage < 0 || ops[i].stage == stage))
            return i;
    fail_msg("no op kind %d mb %d stage %d on rank %d", kind, mb, stage, r);
    return 0;
}

static void expect_refused(bg_schedule_t *t, const char *needle, const char *needle2)
{
    bg_status_t st = bg_schedule_validate(t);
    if (st != BG_ERR_INVALID || !strstr(bg_last_error(), needle) || !strstr(bg_last_error(), needle2))
        fail_msg("want BG_ERR_INVALID with \"%s\" and \"%s\", got %d: %s", needle, needle2, st, bg_last_error());
    bg_schedule_free(t);
}

/* What the executor needs beyond data dependencies (brigade train
 * --schedule-json runs any valid program bitwise equal to one process):
 * weight gradients of a stage in microbatch order, a send_grad before the W
 * that frees its gradient, optimizer steps after the rank's other work. */
static void test_validator_executor_contract(void **state)
{
    (void)state;
    /* zb-h1 p=2 m=4, rank 1: ra0 F0 b0 sg0 ra1 F1 b1 sg1 W0 ra2 F2 b2 sg2 W1 ... */
    bg_schedule_t *z = gen(BG_SCHED_ZB_H1, 2, 4, 0);
    size_t w0 = find_op(z, 1, BG_OP_BACKWARD_WEIGHT, 0, 1), w1 = find_op(z, 1, BG_OP_BACKWARD_WEIGHT, 1, 1);
    expect_refused(moved(z, 1, w1, w0), "(backward_weight mb 1 stage 1)",
                   "weight gradients add up in microbatch order: the weight gradient of mb 0 stage 1 must come before it");
    /* the W of mb 0 before the send_grad of its gradient: ra0 F0 b0 W0 sg0 */
    expect_refused(moved(z, 1, w0, find_op(z, 1, BG_OP_SEND_GRAD, 0, 1)), "rank 1 op 3 (backward_weight mb 0 stage 1)",
                   "frees the input gradient that send_grad (op 4) sends later");
    /* full backwards out of order on one rank: F0 F1 B1 B0 */
    bg_schedule_t *f = gen(BG_SCHED_1F1B, 1, 2, 0), *f2 = moved(f, 0, 2, 1); /* F0 F1 B0 B1: fine */
    assert_int_equal(bg_schedule_validate(f2), BG_OK);
    expect_refused(moved(f2, 0, 3, 2), "rank 0 op 2 (backward mb 1 stage 0)",
                   "the weight gradient of mb 0 stage 0 must come before it");
    bg_schedule_free(f), bg_schedule_free(f2);
    /* zbv p=2 m=4, rank 0 (stages 0 and 3): a chunk's reduce_grads may come early, its optimizer step may not */
    bg_schedule_t *v = gen(BG_SCHED_ZBV, 2, 4, 0);
    size_t n, last = 0;
    const bg_sched_op_t *ops = bg_schedule_rank_ops(v, 0, &n);
    for (size_t i = 0; i < n; i++)
        if (ops[i].kind != BG_OP_REDUCE_GRADS && ops[i].kind != BG_OP_OPTIMIZER_STEP)
            last = i;
    assert_int_equal(ops[last].kind, BG_OP_BACKWARD_WEIGHT);
    int other = ops[last].stage == 0 ? 3 : 0;
    bg_schedule_t *v2 = moved(v, 0, find_op(v, 0, BG_OP_REDUCE_GRADS, -1, other), last);
    assert_int_equal(bg_schedule_validate(v2), BG_OK);
    char want[64];
    snprintf(want, sizeof want, "rank 0 op %zu (optimizer_step mb -1 stage %d)", last + 1, other);
    expect_refused(moved(v2, 0, find_op(v2, 0, BG_OP_OPTIMIZER_STEP, -1, other), last + 1), want,
                   "optimizer step before the rank's compute and communication are done");
    bg_schedule_free(v), bg_schedule_free(v2);
    bg_schedule_free(z);
}

static void test_validator_split_and_vshape(void **state)
{
    (void)state;
    /* one rank, two stages (a V turn on one rank): B/W split; W before B is rejected */
    const char *ok = "{\"stages\":1,\"microbatches\":1,\"chunks\":2,\"ranks\":[{\"rank\":0,\"ops\":["
        OP("forward", 0, 0) "," OP("forward", 0, 1) "," OP("backward_input", 0, 1) "," OP("backward_input", 0, 0) ","
        OP("backward_weight", 0, 1) "," OP("backward_weight", 0, 0) "," TAIL(0) "," TAIL(1) "]}]}";
    bg_schedule_t *s;
    assert_int_equal(bg_schedule_from_json(ok, &s), BG_OK);
    assert_int_equal(bg_schedule_validate(s), BG_OK);
    bg_schedule_free(s);
    const char *wb = "{\"stages\":1,\"microbatches\":1,\"chunks\":2,\"ranks\":[{\"rank\":0,\"ops\":["
        OP("forward", 0, 0) "," OP("forward", 0, 1) "," OP("backward_weight", 0, 1) "," OP("backward_input", 0, 1) ","
        OP("backward_input", 0, 0) "," OP("backward_weight", 0, 0) "," TAIL(0) "," TAIL(1) "]}]}";
    expect_invalid(wb, BG_ERR_INVALID, "rank 0 op 2 (backward_weight mb 0 stage 1)", "W before its B");
    /* a send between two stages on the same rank is not needed */
    const char *loc = "{\"stages\":1,\"microbatches\":1,\"chunks\":2,\"ranks\":[{\"rank\":0,\"ops\":["
        OP("forward", 0, 0) "," OP("send_act", 0, 0) "," OP("forward", 0, 1) "," OP("backward", 0, 1) ","
        OP("backward", 0, 0) "," TAIL(0) "," TAIL(1) "]}]}";
    expect_invalid(loc, BG_ERR_INVALID, "rank 0 op 1 (send_act", "no transfer between them is needed");
    /* backward on stage 0 before the backward of stage 1 on the same rank */
    const char *ord = "{\"stages\":1,\"microbatches\":1,\"chunks\":2,\"ranks\":[{\"rank\":0,\"ops\":["
        OP("forward", 0, 0) "," OP("forward", 0, 1) "," OP("backward", 0, 0) "," OP("backward", 0, 1) ","
        TAIL(0) "," TAIL(1) "]}]}";
    expect_invalid(ord, BG_ERR_INVALID, "rank 0 op 2 (backward mb 0 stage 0)", "needs the backward of mb 0 stage 1");
    /* the generators' V: stage map and no transfer at the turn */
    s = gen(BG_SCHED_ZBV, 3, 4, 0);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(bg_schedule_stage_rank(s, r), r);
        assert_int_equal(bg_schedule_stage_rank(s, 5 - r), r);
        assert_int_equal(bg_schedule_stage_chunk(s, 5 - r), 1);
    }
    size_t n;
    const bg_sched_op_t *ops = bg_schedule_rank_ops(s, 2, &n);
    for (size_t i = 0; i < n; i++)
        if (ops[i].peer_stage >= 0)
            assert_true(ops[i].peer_rank != 2);
    bg_schedule_free(s);
}

/* two model copies (DualPipe's IR): one rank, two stages, each its own copy's
 * chain; mb 0 goes through copy 0 (stage 0), mb 1 through copy 1 (stage 1) */
#define DUAL_HEAD "{\"stages\":1,\"microbatches\":2,\"chunks\":2,\"copies\":2,\"ranks\":[{\"rank\":0,\"ops\":["
static void test_validator_copies(void **state)
{
    (void)state;
    const char *ok = DUAL_HEAD OP("forward", 0, 0) "," OP("forward", 1, 1) "," OP("backward", 1, 1) ","
        OP("backward", 0, 0) "," TAIL(0) "," TAIL(1) "]}]}";
    bg_schedule_t *s;
    assert_int_equal(bg_schedule_from_json(ok, &s), BG_OK);
    assert_int_equal(bg_schedule_copies(s), 2);
    assert_int_equal(bg_schedule_validate(s), BG_OK);
    assert_int_equal(bg_schedule_microbatch_copy(s, 1), 1);
    assert_int_equal(bg_schedule_model_stage(s, 1), 0);
    /* the JSON keeps the copies */
    bg_schedule_free(json_round_trip(s, "\"copies\":2"));
    /* the same ops as one copy: stage 1 follows stage 0, so each stage misses a microbatch */
    assert_int_equal(bg_schedule_set_copies(s, 1), BG_OK);
    assert_int_equal(bg_schedule_validate(s), BG_ERR_INVALID);
    assert_int_equal(bg_schedule_set_copies(s, 3), BG_ERR_INVALID); /* 3 does not divide 2 stages */
    bg_schedule_free(s);
    /* a microbatch on the other copy's stage */
    const char *cross = DUAL_HEAD OP("forward", 0, 0) "," OP("forward", 0, 1) "," OP("forward", 1, 1) ","
        OP("backward", 1, 1) "," OP("backward", 0, 0) "," TAIL(0) "," TAIL(1) "]}]}";
    expect_invalid(cross, BG_ERR_INVALID, "rank 0 op 1 (forward mb 0 stage 1)",
                   "microbatch 0 goes through copy 0 of the model, but stage 1 belongs to copy 1");
    /* nothing flows from one copy's last stage into the other's first */
    const char *two = "{\"stages\":2,\"microbatches\":2,\"copies\":2,\"ranks\":[{\"rank\":0,\"ops\":["
        OP("forward", 0, 0) "," OP("send_act", 0, 0) "," OP("backward", 0, 0) "," TAIL(0) "]},{\"rank\":1,\"ops\":["
        OP("forward", 1, 1) "," OP("backward", 1, 1) "," TAIL(1) "]}]}";
    expect_invalid(two, BG_ERR_INVALID, "rank 0 op 1 (send_act mb 0 stage 0 -> stage 1)",
                   "stage 0 has no next neighbour to talk to (it ends its copy's chain of stages)");
    /* copies that do not divide the stages or the microbatches */
    const char *odd = "{\"stages\":1,\"microbatches\":3,\"chunks\":2,\"copies\":2,\"ranks\":[{\"ops\":[]}]}";
    assert_int_equal(bg_schedule_from_json(odd, &s), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "$.copies = 2 must divide both"));
}

/* a wait chain into a 2-rank cycle, built with the C API: rank 1 waits for
 * rank 2's gradient before sending rank 2 its activation; rank 0 waits on 1 */
static void test_validator_chain_into_cycle(void **state)
{
    (void)state;
    const bg_sched_op_t r0[] = {{BG_OP_FORWARD, 0, 0, 0, -1, -1},   {BG_OP_SEND_ACT, 0, 0, 0, 1, 1},
                                {BG_OP_RECV_GRAD, 0, 0, 0, 1, 1},   {BG_OP_BACKWARD, 0, 0, 0, -1, -1},
                                {BG_OP_REDUCE_GRADS, -1, 0, 0, -1, -1}, {BG_OP_OPTIMIZER_STEP, -1, 0, 0, -1, -1}};
    const bg_sched_op_t r1[] = {{BG_OP_RECV_ACT, 0, 0, 1, 0, 0},    {BG_OP_FORWARD, 0, 0, 1, -1, -1},
                                {BG_OP_RECV_GRAD, 0, 0, 1, 2, 2},   {BG_OP_SEND_ACT, 0, 0, 1, 2, 2},
                                {BG_OP_BACKWARD, 0, 0, 1, -1, -1},  {BG_OP_SEND_GRAD, 0, 0, 1, 0, 0},
                                {BG_OP_REDUCE_GRADS, -1, 0, 1, -1, -1}, {BG_OP_OPTIMIZER_STEP, -1, 0, 1, -1, -1}};
    const bg_sched_op_t r2[] = {{BG_OP_RECV_ACT, 0, 0, 2, 1, 1},    {BG_OP_FORWARD, 0, 0, 2, -1, -1},
                                {BG_OP_BACKWARD, 0, 0, 2, -1, -1},  {BG_OP_SEND_GRAD, 0, 0, 2, 1, 1},
                                {BG_OP_REDUCE_GRADS, -1, 0, 2, -1, -1}, {BG_OP_OPTIMIZER_STEP, -1, 0, 2, -1, -1}};
    bg_schedule_t *s;
    assert_int_equal(bg_schedule_create("chain", 3, 1, 1, NULL, &s), BG_OK);
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(bg_schedule_append(s, 0, &r0[i]), BG_OK);
    for (size_t i = 0; i < 8; i++)
        assert_int_equal(bg_schedule_append(s, 1, &r1[i]), BG_OK);
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(bg_schedule_append(s, 2, &r2[i]), BG_OK);
    assert_int_equal(bg_schedule_validate(s), BG_ERR_DEADLOCK);
    const char *msg = bg_last_error();
    assert_non_null(strstr(msg, "deadlock: rank 0 op 2 (recv_grad mb 0 stage 0 <- stage 1) waits for rank 1 op 5, "
                                "which is blocked behind a cycle"));
    assert_non_null(strstr(msg, "rank 1 op 2 (recv_grad mb 0 stage 1 <- stage 2) waits for rank 2 op 3"));
    assert_non_null(strstr(msg, "rank 2 op 0 (recv_act mb 0 stage 2 <- stage 1) waits for rank 1 op 3"));
    assert_non_null(strstr(msg, "cycle: rank 1 -> rank 2 -> rank 1"));
    assert_false(naive_walk_ok(s)); /* the independent walk agrees */
    bg_schedule_free(s);
}

/* a long wait chain (40 ranks) must give a bounded message that still starts at rank 0 */
static void test_validator_long_chain_message(void **state)
{
    (void)state;
    const int p = 40;
    bg_schedule_t *s = gen(BG_SCHED_1F1B, p, 1, 0), *bad;
    assert_int_equal(bg_schedule_create("long", p, 1, 1, NULL, &bad), BG_OK);
    for (int r = 0; r < p; r++) {
        size_t n;
        const bg_sched_op_t *ops = bg_schedule_rank_ops(s, r, &n);
        for (size_t i = 0; i < n; i++) {
            bg_sched_op_t o = ops[i];
            /* rank p-2 waits for the gradient before sending the activation */
            if (r == p - 2 && o.kind == BG_OP_SEND_ACT)
                o = ops[i + 1];
            else if (r == p - 2 && i > 0 && ops[i - 1].kind == BG_OP_SEND_ACT)
                o = ops[i - 1];
            assert_int_equal(bg_schedule_append(bad, r, &o), BG_OK);
        }
    }
    assert_int_equal(bg_schedule_validate(bad), BG_ERR_DEADLOCK);
    const char *msg = bg_last_error();
    assert_true(strlen(msg) < 1024);
    assert_non_null(strstr(msg, "cycle: rank 38 -> rank 39 -> rank 38"));
    assert_non_null(strstr(msg, "(40 of 40 ranks blocked)"));
    assert_non_null(strstr(msg, "deadlock: rank 0 op 2 (recv_grad mb 0 stage 0 <- stage 1)"));
    assert_false(naive_walk_ok(bad));
    bg_schedule_free(bad);
    bg_schedule_free(s);
}

/* ---------------- JSON errors ---------------- */

static void expect_parse_error(const char *json, const char *needle)
{
    bg_schedule_t *s = (bg_schedule_t *)0x1;
    bg_status_t st = bg_schedule_from_json(json, &s);
    if (st != BG_ERR_PARSE || !strstr(bg_last_error(), needle))
        fail_msg("want a parse error with \"%s\", got %d: %s", needle, st, bg_last_error());
    assert_ptr_equal(s, (bg_schedule_t *)0x1); /* output untouched on failure */
}

static void test_json_errors(void **state)
{
    (void)state;
    const char *head = "{\"stages\":1,\"microbatches\":2,\"ranks\":[{\"rank\":0,\"ops\":[";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s%s]}]}", head, "{\"kind\":\"fwd\",\"microbatch\":0,\"stage\":0}");
    expect_parse_error(buf, "$.ranks[0].ops[0].kind: unknown kind \"fwd\"");
    snprintf(buf, sizeof buf, "%s%s]}]}", head, "{\"kind\":\"forward\",\"microbatch\":2,\"stage\":0}");
    expect_parse_error(buf, "$.ranks[0].ops[0].microbatch = 2 is out of range 0..1");
    snprintf(buf, sizeof buf, "%s%s]}]}", head, "{\"kind\":\"forward\",\"microbatch\":0,\"stage\":1}");
    expect_parse_error(buf, "$.ranks[0].ops[0].stage = 1 is out of range 0..0");
    snprintf(buf, sizeof buf, "%s%s]}]}", head, "{\"kind\":\"forward\",\"microbatch\":\"0\",\"stage\":0}");
    expect_parse_error(buf, "microbatch must be an integer");
    expect_parse_error("{\"stages\":1,\"microbatches\":2,\"ranks\":[", "malformed");
    expect_parse_error("{\"stages\":0,\"microbatches\":2,\"ranks\":[]}", "$.stages = 0 is out of range");
    expect_parse_error("{\"stages\":2,\"microbatches\":2,\"ranks\":[{\"rank\":0,\"ops\":[]}]}",
                       "$.ranks has 1 entries but stages = 2");
    /* found by fuzz_schedule: an op naming only a stage the map gives to another
     * rank was accepted, and written back as JSON the reader refused */
    expect_parse_error("{\"stages\":2,\"microbatches\":1,\"chunks\":2,\"ranks\":[{\"rank\":0,\"ops\":[]},"
                       "{\"rank\":1,\"ops\":[{\"kind\":\"forward\",\"microbatch\":0,\"stage\":2}]}]}",
                       "$.ranks[1].ops[0]: stage 2 is chunk 1 of rank 0, not chunk 1 of rank 1");
    expect_parse_error("[1,2]", "top level must be an object");
    expect_parse_error("{\"microbatches\":2,\"ranks\":[]}", "$.stages is missing");
    bg_schedule_t *s;
    assert_int_equal(bg_schedule_from_json_file("/nonexistent/sched.json", &s), BG_ERR_IO);
    assert_non_null(strstr(bg_last_error(), "/nonexistent/sched.json"));
}

/* ---------------- executor traces ---------------- */

/* A trace of 1F1B p = 2, m = 1 with steps 1..3 (step 1 is warm-up): stage s
 * runs F in (s + 1) ms, B in 2 ms, W in 1 ms on steps 2 and 3 (10x slower on
 * step 1), and `extra` (may be "") appended as the last events. */
static char *trace_text(const char *extra)
{
    size_t cap = 16384, off = 0;
    char *t = malloc(cap);
    off += (size_t)snprintf(t + off, cap - off,
                            "{\"otherData\":{\"schedule\":\"1f1b\",\"pp\":2,\"dp\":1,\"microbatches\":1,\"chunks\":1},"
                            "\"traceEvents\":[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"r\"}}");
    for (int step = 1; step <= 3; step++)
        for (int st = 0; st < 2; st++) {
            double k = step == 1 ? 10 : 1;
            const char *op[] = {"F", "B", "W"};
            double dur[] = {1000.0 * (st + 1), 2000, 1000};
            for (int o = 0; o < 3; o++)
                off += (size_t)snprintf(t + off, cap - off,
                                        ",{\"ph\":\"X\",\"pid\":%d,\"ts\":%d,\"dur\":%g,\"args\":{\"op\":\"%s\","
                                        "\"microbatch\":0,\"stage\":%d,\"step\":%d}}",
                                        st, step * 100000 + o * 3000, k * dur[o], op[o], st, step);
            off += (size_t)snprintf(t + off, cap - off,
                                    ",{\"ph\":\"X\",\"pid\":%d,\"ts\":%d,\"dur\":%d,\"args\":{\"op\":\"step\","
                                    "\"microbatch\":-1,\"stage\":-1,\"step\":%d}}",
                                    st, step * 100000, 9000 + 1000 * step + st, step);
        }
    snprintf(t + off, cap - off, "%s]}", extra);
    return t;
}

static void test_trace_costs(void **state)
{
    (void)state;
    char *t = trace_text("");
    bg_trace_costs_t *c = NULL;
    assert_int_equal(bg_trace_costs_parse(t, strlen(t), "t.json", &c), BG_OK);
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    bg_trace_costs_schedule(c, &sp);
    assert_int_equal(sp.kind, BG_SCHED_1F1B);
    assert_int_equal(sp.stages, 2);
    assert_int_equal(sp.microbatches, 1);
    bg_sim_params_t simp = BG_SIM_PARAMS_INIT;
    bg_trace_costs_sim(c, 1, &simp);
    assert_true(NEAR(simp.f_costs[0], 1e-3) && NEAR(simp.f_costs[1], 2e-3));
    assert_true(NEAR(simp.b_costs[1], 2e-3) && NEAR(simp.w_costs[0], 1e-3));
    int n;
    /* steps 2 and 3: the longest rank's spans 11.001 and 12.001 ms */
    assert_true(NEAR(bg_trace_costs_step_time(c, &n), 11.501e-3));
    assert_int_equal(n, 2);
    bg_trace_costs_free(c);
    free(t);
}

static void expect_trace_error(const char *extra, const char *msg)
{
    char *t = trace_text(extra);
    bg_trace_costs_t *c = NULL;
    bg_status_t st = bg_trace_costs_parse(t, strlen(t), "t.json", &c);
    if (st != BG_ERR_PARSE || !strstr(bg_last_error(), msg))
        fail_msg("trace with %s: status %d, message \"%s\"; expected one containing \"%s\"", extra, st,
                 bg_last_error(), msg);
    assert_null(c);
    free(t);
}

#define TEV(step, stage, pid, dur)                                                                                     \
    ",{\"ph\":\"X\",\"pid\":" pid ",\"ts\":0,\"dur\":" dur ",\"args\":{\"op\":\"F\",\"microbatch\":0,\"stage\":" stage \
    ",\"step\":" step "}}"

/* A negative step, one >= 2^31, or a huge one once wrote out of bounds or
 * allocated gigabytes; stages, ranks and durations out of range. Each error
 * names the event (the 26th: the metadata event, 24 ops, then this) and field. */
static void test_trace_errors(void **state)
{
    (void)state;
    expect_trace_error(TEV("-1", "0", "0", "1"), "traceEvents[25].args.step is -1: expected an integer in [0, 2147483647]");
    expect_trace_error(TEV("2147483648", "0", "0", "1"), "traceEvents[25].args.step is 2147483648");
    expect_trace_error(TEV("1.5", "0", "0", "1"), "traceEvents[25].args.step is not an integer");
    expect_trace_error(TEV("2", "2", "0", "1"), "traceEvents[25].args.stage is 2: the trace's schedule has stages 0..1");
    expect_trace_error(TEV("2", "0", "2", "1"), "traceEvents[25].pid is 2: expected an integer in [0, 1]");
    expect_trace_error(TEV("2", "0", "0", "-1"), "traceEvents[25].dur is out of range or not a number");
    expect_trace_error(",7", "traceEvents[25] is not an object");
    /* the largest step is fine, and cheap: memory follows the events, not the numbers */
    char *t = trace_text(",{\"ph\":\"X\",\"pid\":0,\"ts\":0,\"dur\":5000,\"args\":{\"op\":\"step\",\"step\":2147483647}}");
    bg_trace_costs_t *c = NULL;
    assert_int_equal(bg_trace_costs_parse(t, strlen(t), "t.json", &c), BG_OK);
    int n;
    bg_trace_costs_step_time(c, &n);
    assert_int_equal(n, 3);
    bg_trace_costs_free(c);
    free(t);
    const char *meta[] = {"{\"otherData\":{\"schedule\":\"1f1b\",\"pp\":4294967298,\"microbatches\":1,\"chunks\":1},"
                          "\"traceEvents\":[]}",
                          "{\"otherData\":{\"schedule\":\"nope\",\"pp\":1,\"microbatches\":1,\"chunks\":1},"
                          "\"traceEvents\":[]}",
                          "{\"traceEvents\":[]}", "{\"otherData\":{\"schedule\":\"1f1b\"", ""};
    const char *want[] = {"otherData.pp is 4294967298", "otherData.schedule \"nope\"", "not a brigade executor trace",
                          "t.json: line 1", "t.json: line"};
    for (size_t i = 0; i < sizeof meta / sizeof *meta; i++) {
        c = NULL;
        assert_int_equal(bg_trace_costs_parse(meta[i], strlen(meta[i]), "t.json", &c), BG_ERR_PARSE);
        if (!strstr(bg_last_error(), want[i]))
            fail_msg("%s: message \"%s\", expected \"%s\"", meta[i], bg_last_error(), want[i]);
        assert_null(c);
    }
}

/* ---------------- simulator ---------------- */

static void test_simulator_link_model(void **state)
{
    (void)state;
    /* 1F1B, p = 2, m = 1: F0 | link | F1 B1 | link | B0, by hand */
    bg_schedule_t *s = gen(BG_SCHED_1F1B, 2, 1, 0);
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    double fc[2] = {1.0, 3.0};
    sp.f_costs = fc, sp.b_cost = 0.5, sp.w_cost = 0.25, sp.latency = 0.1, sp.bandwidth = 100;
    sp.act_bytes = 40, sp.grad_bytes = 20, sp.stash_bytes = 7;
    bg_sim_result_t *r;
    assert_int_equal(bg_schedule_simulate(s, &sp, &r), BG_OK);
    double want = 1.0 + (0.1 + 0.4) + 3.0 + 0.75 + (0.1 + 0.2) + 0.75;
    assert_true(NEAR(bg_sim_step_time(r), want));
    assert_true(NEAR(bg_sim_busy(r, 0), 1.75));
    assert_true(NEAR(bg_sim_busy(r, 1), 3.75));
    assert_true(NEAR(bg_sim_idle(r, 0), want - 1.75));
    assert_true(NEAR(bg_sim_rank_start(r, 1), 1.5));
    assert_true(NEAR(bg_sim_peak_stash_bytes(r, 0), 7));
    size_t ne;
    const bg_sim_event_t *ev = bg_sim_events(r, &ne);
    int found = 0;
    for (size_t i = 0; i < ne; i++)
        if (ev[i].kind == BG_OP_SEND_ACT) {
            assert_true(NEAR(ev[i].start, 1.0) && NEAR(ev[i].end, 1.5));
            assert_int_equal(ev[i].peer_stage, 1);
            found++;
        }
    assert_int_equal(found, 1);
    bg_sim_result_free(r);
    bg_schedule_free(s);

    /* GPipe p = 2, m = 2 with a slow link: the second activation queues behind the first */
    s = gen(BG_SCHED_GPIPE, 2, 2, 0);
    bg_sim_params_t sq = BG_SIM_PARAMS_INIT;
    sq.bandwidth = 1, sq.act_bytes = 5;
    assert_int_equal(bg_schedule_simulate(s, &sq, &r), BG_OK);
    ev = bg_sim_events(r, &ne);
    double arr[2] = {0, 0};
    for (size_t i = 0; i < ne; i++)
        if (ev[i].kind == BG_OP_SEND_ACT)
            arr[ev[i].microbatch] = ev[i].end;
    assert_true(NEAR(arr[0], 6.0));  /* issued at 1, 5 on the wire */
    assert_true(NEAR(arr[1], 11.0)); /* issued at 2, waits for the link until 6 */
    /* rank 1: F0 at 6, F1 at 11, then B0 B1 (2 each) */
    assert_true(NEAR(bg_sim_rank_end(r, 1), 16.0));
    bg_sim_result_free(r);
    bg_schedule_free(s);
}

static void test_simulator_timeline_consistent(void **state)
{
    (void)state;
    for (int k = 0; k < BG_SCHED_CUSTOM; k++) {
        if (k == BG_SCHED_DUALPIPE)
            continue; /* needs p even: test_costs.c's test_dualpipe_closed_forms checks its timeline */
        bg_schedule_t *s = gen((bg_schedule_kind_t)k, 5, 11, 0);
        bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
        sp.f_cost = 1.3, sp.b_cost = 1.7, sp.w_cost = 0.6, sp.latency = 0.05;
        bg_sim_result_t *r;
        assert_int_equal(bg_schedule_simulate(s, &sp, &r), BG_OK);
        size_t ne;
        const bg_sim_event_t *ev = bg_sim_events(r, &ne);
        double busy[5] = {0}, last_end[5] = {0};
        for (size_t i = 0; i < ne; i++) {
            const bg_sim_event_t *e = &ev[i];
            if (i > 0)
                assert_true(e->rank >= ev[i - 1].rank);
            if (e->kind > BG_OP_BACKWARD_WEIGHT)
                continue;
            assert_true(e->start >= last_end[e->rank] - 1e-12); /* one compute at a time */
            last_end[e->rank] = e->end;
            busy[e->rank] += e->end - e->start;
            assert_true(e->end <= bg_sim_step_time(r) + 1e-9);
        }
        for (int rk = 0; rk < 5; rk++)
            assert_true(NEAR(busy[rk], bg_sim_busy(r, rk)));
        /* total work is schedule independent: 11 mbs x (F + B + W) x chunks */
        double tot = 0;
        for (int rk = 0; rk < 5; rk++)
            tot += bg_sim_busy(r, rk);
        assert_true(NEAR(tot, 11 * 5 * bg_schedule_chunks(s) * 3.6));
        char *svg;
        assert_int_equal(bg_schedule_svg_string(s, r, &svg), BG_OK);
        assert_non_null(strstr(svg, "<svg"));
        assert_non_null(strstr(svg, "</svg>"));
        free(svg);
        bg_sim_result_free(r);
        bg_schedule_free(s);
    }
}

/* ---------------- params, names, text ---------------- */

static void test_bad_params(void **state)
{
    (void)state;
    bg_schedule_params_t gp = BG_SCHEDULE_PARAMS_INIT;
    bg_schedule_t *s = (bg_schedule_t *)0x1;
    gp.stages = 0, gp.microbatches = 4;
    assert_int_equal(bg_schedule_generate(&gp, &s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "stages must be >= 1, got 0"));
    gp.stages = 4, gp.microbatches = -1;
    assert_int_equal(bg_schedule_generate(&gp, &s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "microbatches must be >= 1, got -1"));
    gp.microbatches = 4, gp.chunks = 3;
    assert_int_equal(bg_schedule_generate(&gp, &s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "1f1b places one chunk per rank, got 3"));
    gp.kind = BG_SCHED_INTERLEAVED, gp.chunks = 1;
    assert_int_equal(bg_schedule_generate(&gp, &s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "use 1f1b"));
    gp.kind = BG_SCHED_ZBV, gp.chunks = 3;
    assert_int_equal(bg_schedule_generate(&gp, &s), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "exactly 2 chunks"));
    assert_ptr_equal(s, (bg_schedule_t *)0x1);
    bg_schedule_kind_t k;
    assert_int_equal(bg_schedule_kind_parse("zb-h2", &k), BG_OK);
    assert_int_equal(k, BG_SCHED_ZB_H2);
    assert_int_equal(bg_schedule_kind_parse("pipedream", &k), BG_ERR_NOT_FOUND);
    bg_sched_op_kind_t ok;
    assert_int_equal(bg_sched_op_kind_parse("backward_weight", &ok), BG_OK);
    assert_int_equal(ok, BG_OP_BACKWARD_WEIGHT);
    assert_string_equal(bg_sched_op_kind_name(BG_OP_RECV_GRAD), "recv_grad");
    /* simulator parameters */
    s = gen(BG_SCHED_1F1B, 2, 2, 0);
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    sp.f_cost = -1;
    bg_sim_result_t *r = NULL;
    assert_int_equal(bg_schedule_simulate(s, &sp, &r), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "forward cost"));
    assert_null(r);
    bg_schedule_free(s);
}

static void test_text_format(void **state)
{
    (void)state;
    bg_schedule_t *s = gen(BG_SCHED_1F1B, 2, 3, 0);
    char *t;
    assert_int_equal(bg_schedule_format_text(s, 0, &t), BG_OK);
    assert_string_equal(t, "rank 0 | F0 F1 B0 F2 B1 B2\nrank 1 | F0 B0 F1 B1 F2 B2\n");
    free(t);
    assert_int_equal(bg_schedule_format_text(s, BG_SCHED_TEXT_COMM, &t), BG_OK);
    assert_non_null(strstr(t, "rank 1 | ra0 F0 B0 sg0 ra1 F1 B1 sg1"));
    assert_non_null(strstr(t, " R O\n"));
    free(t);
    bg_schedule_free(s);
    s = gen(BG_SCHED_GPIPE, 2, 2, 0);
    assert_int_equal(bg_schedule_format_text(s, 0, &t), BG_OK);
    assert_string_equal(t, "rank 0 | F0 F1 B0 B1\nrank 1 | F0 F1 B0 B1\n");
    free(t);
    bg_schedule_free(s);
}

/* The planner's simulation without events (bg__schedule_simulate_figures)
 * gives every figure bg_schedule_simulate gives, bitwise: every kind, with
 * non-unit per-stage costs, a link and memory, so nothing is trivially equal. */
static void test_simulate_figures_match(void **state)
{
    (void)state;
    static const bg_schedule_kind_t kinds[] = {BG_SCHED_GPIPE, BG_SCHED_1F1B, BG_SCHED_INTERLEAVED, BG_SCHED_ZB_H1,
                                               BG_SCHED_ZB_H2, BG_SCHED_ZBV, BG_SCHED_ZB_INTERLEAVED,
                                               BG_SCHED_DUALPIPEV, BG_SCHED_DUALPIPE};
    int checked = 0;
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
        for (int p = 2; p <= 4; p += 2) {
            bg_schedule_t *s = gen(kinds[k], p, 4 * p, 0);
            int n = bg_schedule_stages(s);
            double f[64], b[64], w[64], sb[64];
            assert_true(n <= 64);
            for (int i = 0; i < n; i++)
                f[i] = 1.0 + 0.25 * (i % 3), b[i] = 2.0 + 0.5 * (i % 2), w[i] = 0.75 + 0.125 * i, sb[i] = 100.0 + i;
            bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
            sp.f_costs = f, sp.b_costs = b, sp.w_costs = w, sp.stash_bytes_per_stage = sb;
            sp.latency = 0.3, sp.bandwidth = 1000.0, sp.act_bytes = 50.0, sp.grad_bytes = 70.0;
            sp.reduce_cost = 0.5, sp.optimizer_cost = 0.25;
            bg_sim_result_t *full = NULL, *fig = NULL;
            assert_int_equal(bg_schedule_simulate(s, &sp, &full), BG_OK);
            assert_int_equal(bg__schedule_simulate_figures(s, &sp, &fig), BG_OK);
            assert_true(bg_sim_step_time(full) == bg_sim_step_time(fig));
            for (int r = -1; r < p; r++) {
                assert_true(bg_sim_bubble(full, r) == bg_sim_bubble(fig, r));
                assert_true(bg_sim_span_bubble(full, r) == bg_sim_span_bubble(fig, r));
            }
            for (int r = 0; r < p; r++) {
                assert_true(bg_sim_busy(full, r) == bg_sim_busy(fig, r));
                assert_true(bg_sim_rank_start(full, r) == bg_sim_rank_start(fig, r));
                assert_true(bg_sim_rank_end(full, r) == bg_sim_rank_end(fig, r));
                assert_int_equal(bg_sim_peak_stash(full, r), bg_sim_peak_stash(fig, r));
                assert_true(bg_sim_peak_stash_bytes(full, r) == bg_sim_peak_stash_bytes(fig, r));
            }
            size_t nev = 0;
            assert_non_null(bg_sim_events(full, &nev));
            assert_true(nev > 0);
            bg_sim_result_free(full);
            bg_sim_result_free(fig);
            bg_schedule_free(s);
            checked++;
        }
    assert_int_equal(checked, 18);
}

/* The planner's simulation trusts a generated program (no validation): one
 * that deadlocks (two ranks each receiving before they send) ends in an
 * error naming the stuck rank, not a hang or a result; bg_schedule_simulate
 * refuses it at validation (it also lacks the reduce and optimizer ops). */
static void test_simulate_figures_deadlock(void **state)
{
    (void)state;
    const bg_sched_op_t r0[] = {{BG_OP_FORWARD, 0, 0, 0, -1, -1}, {BG_OP_RECV_GRAD, 0, 0, 0, 1, 1},
                                {BG_OP_SEND_ACT, 0, 0, 0, 1, 1},  {BG_OP_BACKWARD, 0, 0, 0, -1, -1}};
    const bg_sched_op_t r1[] = {{BG_OP_RECV_ACT, 0, 0, 1, 0, 0}, {BG_OP_FORWARD, 0, 0, 1, -1, -1},
                                {BG_OP_BACKWARD, 0, 0, 1, -1, -1}, {BG_OP_SEND_GRAD, 0, 0, 1, 0, 0}};
    bg_schedule_t *s;
    assert_int_equal(bg_schedule_create("stuck", 2, 1, 1, NULL, &s), BG_OK);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(bg_schedule_append(s, 0, &r0[i]), BG_OK);
        assert_int_equal(bg_schedule_append(s, 1, &r1[i]), BG_OK);
    }
    bg_sim_params_t sp = BG_SIM_PARAMS_INIT;
    bg_sim_result_t *res = NULL;
    assert_int_equal(bg__schedule_simulate_figures(s, &sp, &res), BG_ERR_INTERNAL);
    assert_null(res);
    assert_non_null(strstr(bg_last_error(), "stuck"));
    assert_int_not_equal(bg_schedule_simulate(s, &sp, &res), BG_OK);
    assert_null(res);
    bg_schedule_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpipe_1f1b_closed_forms),
        cmocka_unit_test(test_simulate_figures_match),
        cmocka_unit_test(test_simulate_figures_deadlock),
        cmocka_unit_test(test_interleaved_closed_form),
        cmocka_unit_test(test_zero_bubble_closed_forms),
        cmocka_unit_test(test_validate_all_generated),
        cmocka_unit_test(test_order_weights),
        cmocka_unit_test(test_validator_rejects_wrong_programs),
        cmocka_unit_test(test_forward_only_all_generated),
        cmocka_unit_test(test_validator_forward_only),
        cmocka_unit_test(test_validator_split_and_vshape),
        cmocka_unit_test(test_validator_copies),
        cmocka_unit_test(test_validator_executor_contract),
        cmocka_unit_test(test_validator_chain_into_cycle),
        cmocka_unit_test(test_validator_long_chain_message),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_trace_costs),
        cmocka_unit_test(test_trace_errors),
        cmocka_unit_test(test_simulator_link_model),
        cmocka_unit_test(test_simulator_timeline_consistent),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_text_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
