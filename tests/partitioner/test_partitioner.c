/* tests/partitioner: the exact partitioner against brute force on thousands
 * of random small instances (same optimum; infeasible exactly when brute
 * force finds nothing; the shortfall exact to the byte), the memory model
 * against bg_stage_memory() of real stages and against a hand computation,
 * the schedule replay against hand-counted 1F1B, the no-fit message, the
 * plan search's smallest budget (fits; one byte less does not), and the plan
 * JSON round trip and its parse errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>
#include <cmocka.h>

#include "brigade/backend.h"
#include "brigade/partitioner.h"
#include "brigade/schedule.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static int rint_(int lo, int hi) { return lo + (int)(rnd() % (uint64_t)(hi - lo + 1)); }
static size_t al64(size_t b) { return (b + 63) & ~(size_t)63; }

/* ---------------- brute force ---------------- */

/* The rule the partitioner documents: no recomputation if it fits, else
 * recomputation if allowed and it fits. */
static int stage_choose(const bg_part_problem_t *p, int s, int a, int b, bg_part_stage_t *e)
{
    assert_int_equal(bg_part_stage_eval(p, s, a, b, 0, e), BG_OK);
    if (e->fits)
        return 1;
    if (!p->allow_recompute)
        return 0;
    assert_int_equal(bg_part_stage_eval(p, s, a, b, 1, e), BG_OK);
    return e->fits;
}

/* Every composition of L into S non-empty ranges; INFINITY when none fits. */
static double brute(const bg_part_problem_t *p)
{
    int L = p->nlayers, S = p->nstages;
    int cut[8]; /* cut[s] = first layer of stage s */
    double best = INFINITY;
    cut[0] = 0;
    /* enumerate cuts 1..L-1 choose S-1 in increasing order */
    int c[8];
    for (int i = 0; i < S - 1; i++)
        c[i] = i + 1;
    for (;;) {
        for (int i = 0; i < S - 1; i++)
            cut[i + 1] = c[i];
        double worst = 0;
        int ok = 1;
        for (int s = 0; s < S && ok; s++) {
            int a = cut[s], b = s + 1 < S ? cut[s + 1] - 1 : L - 1;
            bg_part_stage_t e;
            if (!stage_choose(p, s, a, b, &e))
                ok = 0;
            else if (e.time > worst)
                worst = e.time;
        }
        if (ok && worst < best)
            best = worst;
        /* next combination */
        int i = S - 2;
        while (i >= 0 && c[i] == L - 1 - (S - 2 - i))
            i--;
        if (i < 0)
            break;
        c[i]++;
        for (int j = i + 1; j < S - 1; j++)
            c[j] = c[j - 1] + 1;
    }
    return best;
}

typedef struct inst {
    bg_part_layer_t layers[10];
    bg_part_stage_spec_t stages[6];
    bg_part_counts_t counts[6][3];
    bg_part_problem_t p;
} inst_t;

static void random_instance(inst_t *in)
{
    int L = rint_(1, 9), S = rint_(1, L < 6 ? L : 6);
    bg_part_problem_t p = BG_PART_PROBLEM_INIT;
    p.nlayers = L;
    p.nstages = S;
    p.layers = in->layers;
    p.stages = in->stages;
    p.bytes_per_param = (size_t)rint_(8, 16);
    p.input_bytes = rnd() % 2 ? (size_t)rint_(0, 300) : 0;
    p.token_bytes = p.input_bytes ? 0 : (size_t)rint_(0, 200);
    p.target_bytes = (size_t)rint_(0, 200);
    p.link_latency = rnd() % 2 ? 0.0 : 0.01 * rint_(0, 10);
    p.link_bandwidth = rnd() % 2 ? 0.0 : 1000.0 * rint_(1, 10);
    p.allow_recompute = (int)(rnd() % 2);
    size_t total = 0;
    for (int i = 0; i < L; i++) {
        bg_part_layer_t *l = &in->layers[i];
        l->params = (size_t)rint_(0, 200);
        /* outputs from tiny to huge: a longer range can be faster or smaller at its boundary */
        l->output_bytes = rnd() % 3 ? (size_t)rint_(1, 400) : (size_t)rint_(1000, 6000);
        l->stash_bytes = al64((size_t)rint_(0, 2000)) + al64(l->output_bytes);
        l->wstash_bytes = al64((size_t)rint_(0, 800)) + al64(l->output_bytes);
        l->scratch_bytes = (size_t)rint_(0, 500);
        /* coarse times make ties (and so the tie-breaking) common */
        l->fwd_time = rnd() % 3 ? rint_(0, 4) : 0;
        l->bwd_time = rnd() % 3 ? 2.0 * l->fwd_time : (double)rint_(0, 6) * 0.5;
        total += l->params * p.bytes_per_param + l->stash_bytes * 3;
    }
    for (int s = 0; s < S; s++) {
        bg_part_stage_spec_t *sp = &in->stages[s];
        sp->speed = (double)rint_(1, 4) / 2.0;
        /* budgets around what an even split needs: many fit, some do not */
        sp->budget_bytes = 1 + (size_t)((double)total / S * (0.3 + (double)(rnd() % 1000) / 700.0));
        sp->split_backward = (int)(rnd() % 2);
        sp->ncounts = rint_(1, 3);
        for (int k = 0; k < sp->ncounts; k++) {
            bg_part_counts_t *n = &in->counts[s][k];
            n->backward = rint_(0, 2);
            n->dout = n->backward + rint_(0, 2);
            n->forwarded = n->dout + rint_(0, 2);
            n->begun = n->forwarded + rint_(0, 1);
            n->recomputing = rint_(n->backward, n->forwarded + 1);
        }
        sp->counts = in->counts[s];
    }
    in->p = p;
}

static void test_exact_vs_brute_force(void **state)
{
    (void)state;
    int feasible = 0, infeasible = 0, recomputed = 0;
    for (int it = 0; it < 4000; it++) {
        inst_t in;
        random_instance(&in);
        const bg_part_problem_t *p = &in.p;
        double want = brute(p);
        bg_part_stage_t out[6];
        double got = -1;
        bg_status_t st = bg_partition(p, out, &got);
        if (want == INFINITY) {
            if (st != BG_ERR_NO_FIT)
                fail_msg("instance %d: brute force finds no split but bg_partition says %s (%g)", it,
                         bg_status_string(st), got);
            infeasible++;
            /* the shortfall is exact: every budget + extra fits, + extra - 1 does not */
            bg_part_shortfall_t sf;
            assert_int_equal(bg_part_shortfall(p, &sf), BG_OK);
            assert_true(sf.extra_bytes > 0);
            inst_t in2 = in;
            in2.p.stages = in2.stages;
            for (int s = 0; s < p->nstages; s++) {
                in2.stages[s].counts = in2.counts[s];
                in2.stages[s].budget_bytes = in.stages[s].budget_bytes + sf.extra_bytes;
            }
            if (brute(&in2.p) == INFINITY)
                fail_msg("instance %d: shortfall %zu does not make it fit", it, sf.extra_bytes);
            for (int s = 0; s < p->nstages; s++)
                in2.stages[s].budget_bytes = in.stages[s].budget_bytes + sf.extra_bytes - 1;
            if (brute(&in2.p) != INFINITY)
                fail_msg("instance %d: shortfall %zu is not the smallest", it, sf.extra_bytes);
            assert_true(sf.need_bytes - sf.budget_bytes == sf.extra_bytes);
            assert_true(sf.first >= 0 && sf.last >= sf.first && sf.last < p->nlayers);
            continue;
        }
        if (st != BG_OK)
            fail_msg("instance %d: brute force finds %g but bg_partition fails: %s", it, want, bg_last_error());
        if (got != want)
            fail_msg("instance %d (L=%d S=%d): optimum %.17g, brute force %.17g", it, p->nlayers, p->nstages, got,
                     want);
        /* the returned split is valid and achieves the value */
        double worst = 0;
        int next = 0;
        for (int s = 0; s < p->nstages; s++) {
            assert_int_equal(out[s].first, next);
            assert_true(out[s].last >= out[s].first);
            next = out[s].last + 1;
            bg_part_stage_t e;
            assert_true(stage_choose(p, s, out[s].first, out[s].last, &e));
            assert_int_equal(e.recompute, out[s].recompute);
            assert_int_equal(e.mem_bytes, out[s].mem_bytes);
            assert_true(out[s].mem_bytes <= p->stages[s].budget_bytes);
            recomputed += out[s].recompute;
            if (e.time > worst)
                worst = e.time;
        }
        assert_int_equal(next, p->nlayers);
        assert_true(worst == got);
        feasible++;
    }
    /* the generator must exercise both outcomes and recomputation */
    assert_true(feasible > 500);
    assert_true(infeasible > 200);
    assert_true(recomputed > 50);
}

/* ---------------- closed form ---------------- */

static void test_memory_closed_form(void **state)
{
    (void)state;
    /* 3 layers, 2 stages; stage 1 = layers 1..2 (last stage) */
    bg_part_layer_t ly[3] = {
        {100, 1024, 512, 300, 256, 1.0, 2.0},
        {200, 2048, 640, 700, 128, 2.0, 4.0},
        {300, 4096, 192, 100, 64, 3.0, 6.0},
    };
    bg_part_counts_t c0[] = {{2, 2, 1, 1, 2}}, c1[] = {{3, 2, 1, 1, 2}, {1, 1, 1, 0, 1}};
    bg_part_stage_spec_t sp[2] = {{1.0, 1 << 20, 0, 1, c0}, {2.0, 1 << 20, 1, 2, c1}};
    bg_part_problem_t p = BG_PART_PROBLEM_INIT;
    p.nlayers = 3, p.layers = ly, p.nstages = 2, p.stages = sp;
    p.bytes_per_param = 16, p.token_bytes = 40, p.target_bytes = 40;
    p.link_latency = 0.5, p.link_bandwidth = 256;
    bg_part_stage_t e;
    /* stage 1, layers 1..2, split backward, no recomputation */
    assert_int_equal(bg_part_stage_eval(&p, 1, 1, 2, 0, &e), BG_OK);
    size_t in = 256, data = 40, act = 2048 + 4096, dout = 0;
    size_t split = (640 + 192) - al64(64) + al64(256);
    assert_int_equal(e.static_bytes, (200 + 300) * 16);
    assert_int_equal(e.scratch_bytes, 700);
    assert_int_equal(e.input_bytes, in);
    assert_int_equal(e.data_bytes, data);
    assert_int_equal(e.layer_act_bytes, act);
    assert_int_equal(e.dout_bytes, dout);
    assert_int_equal(e.bw_bytes, split);
    size_t row0 = 3 * in + 2 * (data + act) + 1 * dout + 1 * split;
    size_t row1 = 1 * in + 1 * (data + act) + 1 * dout;
    assert_int_equal(e.act_bytes, row0 > row1 ? row0 : row1);
    assert_int_equal(e.mem_bytes, 8000 + 700 + (row0 > row1 ? row0 : row1));
    assert_true(e.compute_time == (2.0 + 4.0 + 3.0 + 6.0) / 2.0);
    assert_true(e.comm_time == 0.5 + 256.0 / 256.0); /* input gradient back only: it is the last stage */
    /* with recomputation: each slot keeps the stage's output; the
     * "recomputing" count of full activations */
    assert_int_equal(bg_part_stage_eval(&p, 1, 1, 2, 1, &e), BG_OK);
    size_t keep = 64;
    assert_int_equal(e.keep_bytes, keep);
    row0 = 3 * in + 2 * (data + keep) + 2 * act + 1 * dout + 1 * split;
    row1 = 1 * in + 1 * (data + keep) + 1 * act;
    assert_int_equal(e.act_bytes, row0 > row1 ? row0 : row1);
    assert_true(e.compute_time == (2.0 + 4.0 + 3.0 + 6.0 + 2.0 + 3.0) / 2.0);
    /* stage 0, layer 0 alone, fused backward: 2 x max output + max wstash (no input gradient) */
    assert_int_equal(bg_part_stage_eval(&p, 0, 0, 0, 0, &e), BG_OK);
    size_t fused = 2 * al64(256) + (512 - al64(256));
    assert_int_equal(e.bw_bytes, fused);
    assert_int_equal(e.input_bytes, 0);
    assert_int_equal(e.data_bytes, 40);
    assert_int_equal(e.dout_bytes, 256);
    assert_int_equal(e.act_bytes, 2 * 0 + 2 * (40 + 1024) + 1 * 256 + 1 * fused);
    assert_true(e.comm_time == 0.5 + 1.0);
}

/* ---------------- against bg_stage_memory of real stages ---------------- */

static void check_model_ranges(const bg_model_config_t *cfg, int n, int t)
{
    bg_backend_t *be = NULL;
    assert_int_equal(bg_backend_create("cpu", NULL, &be), BG_OK);
    bg_layer_profile_t prof[64];
    int L = 0;
    bg_model_desc_t *desc = NULL;
    assert_int_equal(bg_model_build(cfg, &desc), BG_OK);
    assert_int_equal(bg_model_profile(desc, n, t, prof, 64, &L), BG_OK);
    bg_part_layer_t ly[64];
    for (int i = 0; i < L; i++) {
        ly[i] = (bg_part_layer_t){prof[i].params,       prof[i].stash_bytes, prof[i].wstash_bytes,
                                  prof[i].scratch_bytes, prof[i].output_bytes, 1.0, 2.0};
    }
    bg_part_counts_t one = {1, 1, 1, 1, 1};
    bg_part_stage_spec_t sp[2] = {{1.0, (size_t)1 << 40, 0, 1, &one}, {1.0, (size_t)1 << 40, 1, 1, &one}};
    bg_part_problem_t p = BG_PART_PROBLEM_INIT;
    p.nlayers = L, p.layers = ly, p.nstages = 2, p.stages = sp;
    int gpt = cfg->kind == BG_MODEL_GPT;
    size_t nt = (size_t)n * (size_t)(gpt ? t : 1) * 4;
    p.input_bytes = gpt ? 0 : (size_t)n * (size_t)cfg->in_features * 4;
    p.token_bytes = gpt ? nt : 0;
    p.target_bytes = nt;
    for (int a = 0; a < L; a++)
        for (int b = a; b < L; b++) {
            bg_model_t *m = NULL;
            bg_stage_t *stg = NULL;
            assert_int_equal(bg_model_create(desc, be, a, b, &m), BG_OK);
            assert_int_equal(bg_stage_create(m, 1, &stg), BG_OK);
            bg_shape_t in = bg_model_input_shape(m, n, t);
            for (int i = 0; i < a; i++)
                assert_int_equal(bg_layer_out_shape(bg_model_layer(m, i), in, &in), BG_OK);
            bg_stage_mem_t mem;
            assert_int_equal(bg_stage_memory(stg, in, &mem), BG_OK);
            bg_part_stage_t fused, split;
            assert_int_equal(bg_part_stage_eval(&p, 0, a, b, 0, &fused), BG_OK);
            assert_int_equal(bg_part_stage_eval(&p, 1, a, b, 0, &split), BG_OK);
            if (fused.input_bytes + fused.layer_act_bytes != mem.stash)
                fail_msg("layers %d..%d: stash %zu, stage says %zu", a, b, fused.input_bytes + fused.layer_act_bytes,
                         mem.stash);
            assert_int_equal(fused.data_bytes, mem.data);
            assert_int_equal(fused.dout_bytes, mem.dout);
            assert_int_equal(fused.bw_bytes, mem.fused_bw);
            assert_int_equal(split.bw_bytes, mem.split_bw);
            assert_int_equal(fused.scratch_bytes, mem.scratch);
            assert_int_equal(fused.static_bytes, bg_model_param_count(m) * 16);
            /* with recomputation: the slot keeps input and output, the backward rebuilds the rest */
            bg_stage_set_recompute(stg, 1);
            assert_int_equal(bg_stage_memory(stg, in, &mem), BG_OK);
            bg_part_stage_t rc;
            assert_int_equal(bg_part_stage_eval(&p, 0, a, b, 1, &rc), BG_OK);
            assert_int_equal(rc.input_bytes + rc.keep_bytes, mem.stash);
            assert_int_equal(rc.layer_act_bytes, mem.recompute);
            bg_stage_destroy(stg);
            bg_model_destroy(m);
        }
    bg_model_desc_destroy(desc);
    bg_backend_destroy(be);
}

static void test_memory_matches_stages(void **state)
{
    (void)state;
    bg_model_config_t g = BG_MODEL_CONFIG_INIT;
    g.layers = 3, g.d_model = 32, g.heads = 4, g.seq_len = 16, g.vocab = 64;
    check_model_ranges(&g, 2, 16);
    bg_model_config_t m = BG_MODEL_CONFIG_INIT;
    m.kind = BG_MODEL_MLP, m.layers = 3, m.d_model = 24, m.in_features = 12, m.classes = 5;
    check_model_ranges(&m, 3, 1);
}

/* ---------------- schedule replay ---------------- */

static void test_replay_1f1b(void **state)
{
    (void)state;
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = BG_SCHED_1F1B, sp.stages = 4, sp.microbatches = 8;
    bg_schedule_t *s = NULL;
    assert_int_equal(bg_schedule_generate(&sp, &s), BG_OK);
    for (int r = 0; r < 4; r++) {
        bg_part_counts_t *rows = NULL;
        int n = 0;
        assert_int_equal(bg_part_schedule_counts(s, r, &rows, &n), BG_OK);
        assert_true(n >= 1);
        int maxf = 0, maxb = 0;
        for (int k = 0; k < n; k++) {
            if (rows[k].forwarded > maxf)
                maxf = rows[k].forwarded;
            if (rows[k].backward > maxb)
                maxb = rows[k].backward;
            assert_true(rows[k].begun >= rows[k].forwarded && rows[k].forwarded >= rows[k].backward);
        }
        /* 1F1B keeps p - r microbatches forwarded on rank r and one backward
         * at a time (a fused-backward slot ends when its gradient's send is
         * issued: BG_PART_SEND_LINGER = 0, what the transport does now) */
        static const int want_f[4] = {4, 3, 2, 1}, want_b[4] = {1, 1, 1, 1};
        if (maxf != want_f[r] || maxb != want_b[r])
            fail_msg("rank %d: peak forwarded %d backward %d, expected %d and %d", r, maxf, maxb, want_f[r],
                     want_b[r]);
        free(rows);
    }
    bg_schedule_free(s);
}

/* ---------------- messages and the plan ---------------- */

static void test_no_fit_message(void **state)
{
    (void)state;
    bg_part_layer_t ly[4] = {
        {10, 640, 128, 0, 64, 1, 2}, {1000, 640, 128, 0, 64, 1, 2}, {10, 640, 128, 0, 64, 1, 2},
        {10, 640, 128, 0, 64, 1, 2}};
    bg_part_counts_t c = {1, 1, 1, 1, 1};
    bg_part_stage_spec_t sp[2] = {{1, 4000, 0, 1, &c}, {1, 4000, 0, 1, &c}};
    bg_part_problem_t p = BG_PART_PROBLEM_INIT;
    p.nlayers = 4, p.layers = ly, p.nstages = 2, p.stages = sp;
    bg_part_stage_t out[2];
    double bn;
    assert_int_equal(bg_partition(&p, out, &bn), BG_ERR_NO_FIT);
    const char *msg = bg_last_error();
    assert_non_null(strstr(msg, "biggest layer is 1"));
    assert_non_null(strstr(msg, "at best stage ")); /* names the stage and its range */
    assert_non_null(strstr(msg, "(layers "));
    bg_part_shortfall_t sf;
    assert_int_equal(bg_part_shortfall(&p, &sf), BG_OK);
    char want[64];
    snprintf(want, sizeof(want), "needs %zu more bytes", sf.extra_bytes);
    assert_non_null(strstr(msg, want));
    sp[0].budget_bytes += sf.extra_bytes, sp[1].budget_bytes += sf.extra_bytes;
    assert_int_equal(bg_partition(&p, out, &bn), BG_OK);
    sp[0].budget_bytes -= 1, sp[1].budget_bytes -= 1;
    assert_int_equal(bg_partition(&p, out, &bn), BG_ERR_NO_FIT);
    /* bad problems */
    sp[0].budget_bytes = 0;
    assert_int_equal(bg_partition(&p, out, &bn), BG_ERR_INVALID);
    sp[0].budget_bytes = 100, sp[0].speed = 0;
    assert_int_equal(bg_partition(&p, out, &bn), BG_ERR_INVALID);
    sp[0].speed = 1, p.nstages = 5;
    assert_int_equal(bg_partition(&p, out, &bn), BG_ERR_INVALID);
}

static bg_plan_params_t small_gpt(uint64_t *mem)
{
    bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
    pp.model.layers = 6, pp.model.d_model = 64, pp.model.heads = 4, pp.model.seq_len = 32;
    pp.world = 4;
    pp.mem = mem;
    pp.nmem = 1;
    pp.batch = 16;
    pp.microbatch_size = 2;
    return pp;
}

static void test_plan_smallest_budget(void **state)
{
    (void)state;
    uint64_t mem = 200000;
    bg_plan_params_t pp = small_gpt(&mem);
    bg_plan_set_t *set = NULL;
    assert_int_equal(bg_plan_search(&pp, &set), BG_ERR_NO_FIT);
    const char *msg = bg_last_error();
    const char *at = strstr(msg, "Smallest budget that fits: ");
    assert_non_null(at);
    assert_non_null(strstr(msg, "short by"));
    assert_non_null(strstr(msg, "smallest device count that fits"));
    uint64_t need = strtoull(at + strlen("Smallest budget that fits: "), NULL, 10);
    assert_true(need > mem);
    mem = need;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    const bg_plan_t *b = bg_plan_set_get(set, 0);
    for (int r = 0; r < bg_plan_pp(b); r++)
        assert_true(bg_plan_rank_peak_bytes(b, r) <= need);
    bg_plan_set_free(set);
    mem = need - 1;
    assert_int_equal(bg_plan_search(&pp, &set), BG_ERR_NO_FIT);
}

static void test_plan_roundtrip(void **state)
{
    (void)state;
    uint64_t mem[4] = {64u << 20, 64u << 20, 32u << 20, 32u << 20};
    double speed[4] = {1, 1, 0.5, 0.5};
    bg_plan_params_t pp = small_gpt(mem);
    pp.nmem = 4;
    pp.speed = speed;
    pp.nspeed = 4;
    pp.top = 8;
    bg_plan_set_t *set = NULL;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    assert_true(bg_plan_set_count(set) >= 2);
    for (int i = 1; i < bg_plan_set_count(set); i++)
        assert_true(bg_plan_step_ms(bg_plan_set_get(set, i - 1)) <= bg_plan_step_ms(bg_plan_set_get(set, i)));
    char path[] = "/tmp/bg_plan_test_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    for (int i = 0; i < bg_plan_set_count(set); i++) {
        const bg_plan_t *a = bg_plan_set_get(set, i);
        assert_int_equal(bg_plan_save(a, path), BG_OK);
        bg_plan_t *b = NULL;
        assert_int_equal(bg_plan_load(path, &b), BG_OK);
        assert_int_equal(bg_plan_world(b), bg_plan_world(a));
        assert_int_equal(bg_plan_pp(b), bg_plan_pp(a));
        assert_int_equal(bg_plan_dp(b), bg_plan_dp(a));
        assert_int_equal(bg_plan_tp(b), 1);
        assert_int_equal(bg_plan_microbatches(b), bg_plan_microbatches(a));
        assert_int_equal(bg_plan_microbatch_size(b), 2);
        assert_int_equal(bg_plan_batch(b), 16);
        assert_string_equal(bg_plan_schedule(b), bg_plan_schedule(a));
        assert_int_equal(bg_plan_chunks(b), bg_plan_chunks(a));
        assert_int_equal(bg_plan_optimizer(b), BG_OPTIM_ADAMW);
        assert_true(bg_plan_step_ms(b) == bg_plan_step_ms(a));
        assert_int_equal(bg_plan_num_stages(b), bg_plan_num_stages(a));
        assert_int_equal(bg_plan_check_model(b, &pp.model), BG_OK);
        int sa[64], sb[64], total = 0;
        int na = bg_plan_split(a, sa, 64), nb = bg_plan_split(b, sb, 64);
        assert_int_equal(na, nb);
        for (int k = 0; k < na; k++) {
            assert_int_equal(sa[k], sb[k]);
            total += sa[k];
            const bg_plan_stage_t *x = bg_plan_stage(a, k), *y = bg_plan_stage(b, k);
            assert_int_equal(x->first_layer, y->first_layer);
            assert_int_equal(x->last_layer, y->last_layer);
            assert_int_equal(x->rank, y->rank);
            assert_int_equal(x->chunk, y->chunk);
            assert_int_equal(x->params, y->params);
            assert_int_equal(x->budget_bytes, y->budget_bytes);
            assert_int_equal(x->predicted_peak_bytes, y->predicted_peak_bytes);
            assert_int_equal(x->recompute, y->recompute);
            assert_true(x->predicted_ms_per_microbatch == y->predicted_ms_per_microbatch);
            assert_true(x->predicted_peak_bytes <= x->budget_bytes);
        }
        assert_int_equal(total, pp.model.layers + 3);
        for (int r = 0; r < bg_plan_pp(a); r++) {
            assert_int_equal(bg_plan_rank_peak_bytes(a, r), bg_plan_rank_peak_bytes(b, r));
            assert_true(bg_plan_rank_peak_bytes(a, r) <= bg_plan_rank_budget_bytes(a, r));
        }
        bg_model_config_t other = pp.model;
        other.d_model = 128;
        assert_int_equal(bg_plan_check_model(b, &other), BG_ERR_MISMATCH);
        bg_plan_free(b);
    }
    /* the slow half of the devices gets the smaller share of a pure pipeline */
    bg_plan_set_free(set);
    pp.pp = 4;
    pp.schedules = "1f1b";
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    const bg_plan_t *a = bg_plan_set_get(set, 0);
    int fast = 0, slow = 0;
    for (int k = 0; k < 4; k++) {
        const bg_plan_stage_t *x = bg_plan_stage(a, k);
        if (x->first_layer > 0 && x->last_layer < pp.model.layers + 2)
        {
            if (x->rank < 2)
                fast += x->last_layer - x->first_layer + 1;
            else
                slow += x->last_layer - x->first_layer + 1;
        }
    }
    assert_true(fast > slow);
    bg_plan_set_free(set);
    unlink(path);

    /* parse errors name the field */
    bg_plan_t *b = NULL;
    assert_int_equal(bg_plan_from_json("{", &b), BG_ERR_PARSE);
    assert_int_equal(bg_plan_from_json("{\"format\": \"brigade-plan\", \"version\": 1}", &b), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "$.world"));
    assert_int_equal(bg_plan_from_json("{\"format\": \"other\"}", &b), BG_ERR_PARSE);
    assert_int_equal(bg_plan_load("/nonexistent/plan.json", &b), BG_ERR_PARSE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_vs_brute_force), cmocka_unit_test(test_memory_closed_form),
        cmocka_unit_test(test_memory_matches_stages), cmocka_unit_test(test_replay_1f1b),
        cmocka_unit_test(test_no_fit_message),       cmocka_unit_test(test_plan_smallest_budget),
        cmocka_unit_test(test_plan_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
