/* tests/partitioner: the exact partitioner against brute force on thousands
 * of random small instances (same optimum; infeasible exactly when brute
 * force finds nothing; the shortfall exact to the byte), the memory model
 * against bg_stage_memory() of real stages and against a hand computation,
 * the schedule replay against hand-counted 1F1B, the no-fit message, the
 * plan search's smallest budget (fits; one byte less does not), the plan
 * JSON round trip and its parse errors, plan searches against fixtures
 * written by the planner before its model became a description, and a
 * model of the test's own layers planned, saved, loaded and checked. */
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
#include <jansson.h>

#include "brigade/backend.h"
#include "brigade/partitioner.h"
#include "brigade/schedule.h"
#include "schedule/offact.h"

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

/* @p a written by bg_plan_save to a temporary file and read back by bg_plan_load. */
static bg_plan_t *saved_and_loaded(const bg_plan_t *a)
{
    char path[] = "/tmp/bg_plan_test_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    bg_plan_t *b = NULL;
    bg_status_t st = bg_plan_save(a, path);
    if (st == BG_OK)
        st = bg_plan_load(path, &b);
    unlink(path);
    assert_int_equal(st, BG_OK);
    return b;
}

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
    p.linger_bytes = rnd() % 2 ? 0 : (size_t)rint_(1, 3000); /* some boundaries linger, some not */
    size_t total = 0;
    for (int i = 0; i < L; i++) {
        bg_part_layer_t *l = &in->layers[i];
        l->params = (size_t)rint_(0, 200);
        /* outputs from tiny to huge: a longer range can be faster or smaller at its boundary */
        l->output_bytes = rnd() % 3 ? (size_t)rint_(1, 400) : (size_t)rint_(1000, 6000);
        /* a third kept in bf16: the gradient (the wstash's part, the messages back) twice the output */
        l->grad_bytes = rnd() % 3 ? 0 : 2 * l->output_bytes;
        l->stash_bytes = al64((size_t)rint_(0, 2000)) + al64(l->output_bytes);
        l->wstash_bytes = al64((size_t)rint_(0, 800)) + al64(l->grad_bytes ? l->grad_bytes : l->output_bytes);
        l->scratch_bytes = (size_t)rint_(0, 500);
        /* coarse times make ties (and so the tie-breaking) common */
        l->fwd_time = rnd() % 3 ? rint_(0, 4) : 0;
        l->bwd_time = rnd() % 3 ? 2.0 * l->fwd_time : (double)rint_(0, 6) * 0.5;
        total += l->params * p.bytes_per_param + l->stash_bytes * (p.linger_bytes ? 4 : 3); /* + a lingering slot */
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
            n->lingering = rnd() % 4 == 0;
            n->fused = rint_(0, n->backward); /* full backwards among them (DualPipe mixes both kinds) */
            n->offloaded = rnd() % 3 ? 0 : rint_(0, n->forwarded); /* activation offload's stashes off the device */
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
        {100, 1024, 512, 300, 256, 1.0, 2.0, 0},
        {200, 2048, 640, 700, 128, 2.0, 4.0, 0},
        {300, 4096, 192, 100, 64, 3.0, 6.0, 0},
    };
    bg_part_counts_t c0[] = {{2, 2, 1, 1, 2, 0, 0, 0}}, c1[] = {{3, 2, 1, 1, 2, 0, 0, 0}, {1, 1, 1, 0, 1, 0, 0, 0}};
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
    /* a lingering slot (its gradient's send issued, not yet complete): its backward buffer, which holds
     * that gradient (the executor releases the rest), only where the input gradient message is at least
     * linger_bytes; stage 0 sends none */
    bg_part_counts_t l1[] = {{1, 1, 0, 1, 1, 1, 1, 0}};
    sp[1].counts = l1, sp[1].ncounts = 1, sp[1].split_backward = 0;
    sp[0].counts = l1, sp[0].ncounts = 1;
    size_t fused1 = 2 * al64(256) + (640 - al64(128)); /* layers 1..2: max(in 256, outs) twice, + the largest wstash beyond its output */
    for (int k = 0; k < 3; k++) {
        static const size_t lb[3] = {0, 256, 257}; /* none; the input gradient (256 bytes) lingers; it does not */
        p.linger_bytes = lb[k];
        assert_int_equal(bg_part_stage_eval(&p, 1, 1, 2, 0, &e), BG_OK);
        assert_int_equal(e.bw_bytes, fused1);
        size_t slot = fused1;
        assert_int_equal(e.linger_bytes, k == 1 ? slot : 0);
        assert_int_equal(e.act_bytes, in + (data + act) + fused1 + (k == 1 ? slot : 0));
        assert_int_equal(bg_part_stage_eval(&p, 0, 0, 0, 0, &e), BG_OK);
        assert_int_equal(e.linger_bytes, 0);
    }
    /* a split stage that also runs full backwards (DualPipe, DualPipeV): a slot in one holds the fused buffer,
     * a slot between B and W the split one */
    bg_part_counts_t f1[] = {{2, 2, 0, 2, 2, 0, 1, 0}};
    sp[1].counts = f1, sp[1].ncounts = 1, sp[1].split_backward = 1;
    p.linger_bytes = 0;
    assert_int_equal(bg_part_stage_eval(&p, 1, 1, 2, 0, &e), BG_OK);
    assert_int_equal(e.bw_bytes, split);
    assert_int_equal(e.fused_bw_bytes, fused1);
    assert_int_equal(e.act_bytes, 2 * in + 2 * (data + act) + 1 * split + 1 * fused1);
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
                                  prof[i].scratch_bytes, prof[i].output_bytes, 1.0, 2.0, prof[i].grad_bytes};
    }
    bg_part_counts_t one = {1, 1, 1, 1, 1, 0, 0, 0};
    bg_part_stage_spec_t sp[2] = {{1.0, (size_t)1 << 40, 0, 1, &one}, {1.0, (size_t)1 << 40, 1, 1, &one}};
    bg_part_problem_t p = BG_PART_PROBLEM_INIT;
    p.nlayers = L, p.layers = ly, p.nstages = 2, p.stages = sp;
    p.guard_bytes = prof[0].guard_bytes; /* the stages' guards (BRIGADE_GUARD), as the planner sets it */
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

/* 1F1B on 4 stages, 8 microbatches */
static bg_schedule_t *gen_1f1b_4x8(void)
{
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = BG_SCHED_1F1B, sp.stages = 4, sp.microbatches = 8;
    bg_schedule_t *s = NULL;
    assert_int_equal(bg_schedule_generate(&sp, &s), BG_OK);
    return s;
}

static void test_replay_1f1b(void **state)
{
    (void)state;
    bg_schedule_t *s = gen_1f1b_4x8();
    for (int r = 0; r < 4; r++) {
        bg_part_counts_t *rows = NULL;
        int n = 0;
        assert_int_equal(bg_part_schedule_counts(s, r, 0, &rows, &n), BG_OK);
        assert_true(n >= 1);
        int maxf = 0, maxb = 0, maxl = 0, lingerb = 0;
        for (int k = 0; k < n; k++) {
            if (rows[k].forwarded > maxf)
                maxf = rows[k].forwarded;
            if (rows[k].backward > maxb)
                maxb = rows[k].backward;
            if (rows[k].lingering > maxl)
                maxl = rows[k].lingering;
            lingerb |= rows[k].lingering && rows[k].backward; /* the slot sent before is still held */
            assert_true(rows[k].begun >= rows[k].forwarded && rows[k].forwarded >= rows[k].backward);
        }
        /* 1F1B keeps p - r microbatches forwarded on rank r and one backward
         * at a time; a fused-backward slot ends when its gradient's send is
         * issued, or lingers (one at a time) until the next compute
         * instruction is over: on rank 0 never (it sends no gradient); on
         * the last rank that instruction is the next forward, elsewhere in
         * the steady state the next backward */
        static const int want_f[4] = {4, 3, 2, 1}, want_b[4] = {1, 1, 1, 1}, want_l[4] = {0, 1, 1, 1};
        static const int want_lb[4] = {0, 1, 1, 0};
        if (maxf != want_f[r] || maxb != want_b[r] || maxl != want_l[r] || lingerb != want_lb[r])
            fail_msg("rank %d: peak forwarded %d backward %d lingering %d (with a backward: %d), expected %d, %d, "
                     "%d, %d", r, maxf, maxb, maxl, lingerb, want_f[r], want_b[r], want_l[r], want_lb[r]);
        free(rows);
    }
    bg_schedule_free(s);
}

/* Activation offload's points and stash count, counted by hand on 1F1B, p = 2, m = 4. Rank 0 runs
 * F0 sa0 F1 sa1 rg0 B0 F2 sa2 rg1 B1 F3 sa3 rg2 B2 rg3 B3: compute instructions 0..7 = F0 F1 B0 F2 B1 F3 B2
 * B3. A stash leaves at the first compute instruction after its forward and send and comes back k before
 * its backward, when that is later: k = 0: mb 0 out at F1 (1), in at B0 (2); mb 1 out at B0 (2), in at B1
 * (4); mb 2 4..6; mb 3 6..7. So at most one stash is on the device at once (F1 holds mb 1's as it
 * forwards, mb 0's out; B0 mb 0's, mb 1's out; ...), where 1F1B keeps two. k = 1: mb 1 out at B0 (2), in
 * at F2 (3); mb 2 4..5; mb 0 and 3 never (back no later than they would leave): two at F1, as without
 * offload. Rank 1, the last stage, moves nothing: one. */
static void test_offact_1f1b(void **state)
{
    (void)state;
    bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
    sp.kind = BG_SCHED_1F1B, sp.stages = 2, sp.microbatches = 4;
    bg_schedule_t *s = NULL;
    assert_int_equal(bg_schedule_generate(&sp, &s), BG_OK);
    static const bg__offact_slot_t want[2][4] = {{{1, 2}, {2, 4}, {4, 6}, {6, 7}}, {{-1, -1}, {2, 3}, {4, 5}, {-1, -1}}};
    for (int k = 0; k < 2; k++) {
        bg__offact_slot_t *pts = NULL;
        assert_int_equal(bg__offact_points(s, 0, k, &pts), BG_OK);
        for (int mb = 0; mb < 4; mb++)
            if (pts[mb].out_at != want[k][mb].out_at || pts[mb].in_at != want[k][mb].in_at)
                fail_msg("ahead %d, microbatch %d: out at %d, in at %d; expected %d, %d", k, mb, pts[mb].out_at,
                         pts[mb].in_at, want[k][mb].out_at, want[k][mb].in_at);
        free(pts);
        assert_int_equal(bg__offact_points(s, 1, k, &pts), BG_OK);
        for (int mb = 0; mb < 4; mb++)
            assert_true(pts[mb].out_at == -1 && pts[mb].in_at == -1);
        free(pts);
    }
    size_t b = 0;
    assert_int_equal(bg_part_offact_stash_bytes(s, 0, 0, 0, 1000, &b), BG_OK);
    assert_int_equal(b, 1000);
    assert_int_equal(bg_part_offact_stash_bytes(s, 0, 0, 1, 1000, &b), BG_OK);
    assert_int_equal(b, 2000);
    assert_int_equal(bg_part_offact_stash_bytes(s, 1, 0, 0, 1000, &b), BG_OK);
    assert_int_equal(b, 1000);
    /* the same count without offload: the most forwarded slots */
    bg_part_counts_t *rows = NULL;
    int n = 0, most = 0;
    assert_int_equal(bg_part_schedule_counts(s, 0, 0, &rows, &n), BG_OK);
    for (int i = 0; i < n; i++)
        most = rows[i].forwarded > most ? rows[i].forwarded : most;
    free(rows);
    assert_int_equal(most, 2);
    assert_int_equal(bg_part_offact_stash_bytes(s, 0, 1, 0, 1000, &b), BG_ERR_INVALID); /* one chunk */
    assert_int_equal(bg_part_offact_stash_bytes(s, 2, 0, 0, 1000, &b), BG_ERR_INVALID); /* two ranks */
    bg_schedule_free(s);
}

/* An out point whose wait for the send would deadlock moves later. Two ranks, two chunks (rank 0 stages 0
 * and 2, rank 1 stages 1 and 3); stages 1 to 3 forward microbatch 1 first. Rank 1 posts its receive of
 * stage 0's microbatch 0 at its op 2 (the op after the second-to-last compute before that receive), after
 * F(1,1), which needs microbatch 1 from stage 0: rank 0 waiting at F(0,1) (compute 1) for microbatch 0's
 * send would never send it, so that stash leaves at F(2,1) (compute 2), by when rank 1 has posted it, and
 * is back at B(0,0) (compute 6, k = 0). Stage 0's microbatch 1 leaves there too (rank 1 posts its receive
 * first thing), until B(0,1) (7); stage 2's microbatch 1 3..5; stage 2's microbatch 0 is back no later
 * than it would leave (B(2,0) right after): never. Rank 1: stage 1's microbatch 1 1..7, microbatch 0 3..6;
 * stage 3 ends the chain: never. */
static void test_offact_deadlock(void **state)
{
    (void)state;
    bg_schedule_t *s = NULL;
    assert_int_equal(bg_schedule_create("offact", 2, 2, 2, NULL, &s), BG_OK);
    enum { F = BG_OP_FORWARD, B = BG_OP_BACKWARD, SA = BG_OP_SEND_ACT, RA = BG_OP_RECV_ACT, SG = BG_OP_SEND_GRAD,
           RG = BG_OP_RECV_GRAD };
    /* {kind, stage, mb} per rank; chunk = stage / 2, peers by direction */
    static const int prog[2][20][3] = {
        {{F, 0, 0}, {SA, 0, 0}, {F, 0, 1}, {SA, 0, 1}, {RA, 2, 1}, {F, 2, 1}, {SA, 2, 1}, {RA, 2, 0}, {F, 2, 0},
         {SA, 2, 0}, {RG, 2, 0}, {B, 2, 0}, {SG, 2, 0}, {RG, 2, 1}, {B, 2, 1}, {SG, 2, 1}, {RG, 0, 0}, {B, 0, 0},
         {RG, 0, 1}, {B, 0, 1}},
        {{RA, 1, 1}, {F, 1, 1}, {SA, 1, 1}, {RA, 3, 1}, {F, 3, 1}, {RA, 1, 0}, {F, 1, 0}, {SA, 1, 0}, {RA, 3, 0},
         {F, 3, 0}, {B, 3, 0}, {SG, 3, 0}, {B, 3, 1}, {SG, 3, 1}, {RG, 1, 0}, {B, 1, 0}, {SG, 1, 0}, {RG, 1, 1},
         {B, 1, 1}, {SG, 1, 1}}};
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 20; i++) {
            int kind = prog[r][i][0], st = prog[r][i][1];
            int peer = kind == SA || kind == RG ? st + 1 : kind == RA || kind == SG ? st - 1 : -1;
            bg_sched_op_t op = {kind, prog[r][i][2], st / 2, st, peer, peer >= 0 ? peer % 2 : -1};
            assert_int_equal(bg_schedule_append(s, r, &op), BG_OK);
        }
        for (int c = 0; c < 2; c++) {
            bg_sched_op_t red = {BG_OP_REDUCE_GRADS, -1, c, 2 * c + r, -1, -1};
            bg_sched_op_t opt = {BG_OP_OPTIMIZER_STEP, -1, c, 2 * c + r, -1, -1};
            assert_int_equal(bg_schedule_append(s, r, &red), BG_OK);
            assert_int_equal(bg_schedule_append(s, r, &opt), BG_OK);
        }
    }
    if (bg_schedule_validate(s) != BG_OK)
        fail_msg("the hand-made program: %s", bg_last_error());
    /* [rank][chunk * 2 + mb] */
    static const bg__offact_slot_t want[2][4] = {{{2, 6}, {2, 7}, {-1, -1}, {3, 5}},
                                                 {{3, 6}, {1, 7}, {-1, -1}, {-1, -1}}};
    for (int r = 0; r < 2; r++) {
        bg__offact_slot_t *pts = NULL;
        assert_int_equal(bg__offact_points(s, r, 0, &pts), BG_OK);
        for (int k = 0; k < 4; k++)
            if (pts[k].out_at != want[r][k].out_at || pts[k].in_at != want[r][k].in_at)
                fail_msg("rank %d chunk %d microbatch %d: out at %d, in at %d; expected %d, %d", r, k / 2, k % 2,
                         pts[k].out_at, pts[k].in_at, want[r][k].out_at, want[r][k].in_at);
        free(pts);
    }
    bg_schedule_free(s);
}

/* BRIGADE_TP_OVERLAP=microbatch: the replay pairs a compute instruction with the next one of another
 * microbatch when one is a forward, and both hold their buffers at once. In 1F1B (p = 4) a forward and a
 * backward then run at once on every rank (recomputing, the count of running activations, peaks at 2,
 * not 1), still one backward; the forwarded peak p - r is unchanged where the warm-up holds more than
 * the pair (the warm-up's last forward is paired with the first backward), and is 2, not 1, on the last
 * rank, whose forward of microbatch m + 1 runs beside the backward of m. */
static void test_replay_paired(void **state)
{
    (void)state;
    bg_schedule_t *s = gen_1f1b_4x8();
    for (int r = 0; r < 4; r++) {
        int maxf[2] = {0, 0}, maxb[2] = {0, 0}, maxr[2] = {0, 0};
        for (int paired = 0; paired < 2; paired++) {
            bg_part_counts_t *rows = NULL;
            int n = 0;
            assert_int_equal(bg_part_schedule_counts(s, r, paired, &rows, &n), BG_OK);
            for (int k = 0; k < n; k++) {
                if (rows[k].forwarded > maxf[paired])
                    maxf[paired] = rows[k].forwarded;
                if (rows[k].backward > maxb[paired])
                    maxb[paired] = rows[k].backward;
                if (rows[k].recomputing > maxr[paired])
                    maxr[paired] = rows[k].recomputing;
            }
            free(rows);
        }
        int want = 4 - r > 2 ? 4 - r : 2;
        if (maxf[0] != 4 - r || maxf[1] != want || maxb[0] != 1 || maxb[1] != 1 || maxr[0] != 1 || maxr[1] != 2)
            fail_msg("rank %d: peak forwarded %d / %d (one at a time / paired), backward %d / %d, running %d / %d; "
                     "expected %d / %d, 1 / 1, 1 / 2", r, maxf[0], maxf[1], maxb[0], maxb[1], maxr[0], maxr[1], 4 - r,
                     want);
        /* the pairs themselves, walked as the executor walks them (a pair's second instruction is not
         * paired again): a forward and a backward of different microbatches, nothing else between. Rank r
         * warms up with w = p - r - 1 forwards, then alternates F(w + k), B(k): with w > 0 each of those
         * M - w steady F-B steps is a pair; with w = 0 (the last rank) F(k) meets its own B(k), and each
         * B(k) pairs with F(k + 1) instead: M - 1 pairs */
        size_t n;
        const bg_sched_op_t *ops = bg_schedule_rank_ops(s, r, &n);
        int pairs = 0, w = 4 - r - 1;
        for (size_t i = 0; i < n; i++) {
            size_t j = bg_sched_pair_partner(ops, n, i);
            if (!j)
                continue;
            pairs++;
            assert_true((ops[i].kind == BG_OP_FORWARD) != (ops[j].kind == BG_OP_FORWARD));
            assert_int_not_equal(ops[i].microbatch, ops[j].microbatch);
            for (size_t k = i + 1; k < j; k++)
                assert_true(ops[k].kind >= BG_OP_SEND_ACT && ops[k].kind <= BG_OP_RECV_GRAD);
            i = j;
        }
        assert_int_equal(pairs, w > 0 ? 8 - w : 8 - 1);
    }
    bg_schedule_free(s);
}

/* ---------------- messages and the plan ---------------- */

static void test_no_fit_message(void **state)
{
    (void)state;
    bg_part_layer_t ly[4] = {
        {10, 640, 128, 0, 64, 1, 2, 0}, {1000, 640, 128, 0, 64, 1, 2, 0}, {10, 640, 128, 0, 64, 1, 2, 0},
        {10, 640, 128, 0, 64, 1, 2, 0}};
    bg_part_counts_t c = {1, 1, 1, 1, 1, 0, 0, 0};
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

static bg_model_config_t small_gpt_config(void)
{
    bg_model_config_t mc = BG_MODEL_CONFIG_INIT;
    mc.layers = 6, mc.d_model = 64, mc.heads = 4, mc.seq_len = 32;
    return mc;
}

/* Plan parameters for a small GPT (6 blocks of 64) on 4 devices; *desc_p is
 * its description, which the caller destroys. */
static bg_plan_params_t small_gpt(uint64_t *mem, bg_model_desc_t **desc_p)
{
    bg_model_config_t mc = small_gpt_config();
    assert_int_equal(bg_model_build(&mc, desc_p), BG_OK);
    bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
    pp.model = *desc_p;
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
    bg_model_desc_t *desc;
    bg_plan_params_t pp = small_gpt(&mem, &desc);
    pp.tp = 1; /* the smallest budget at tp = 1 (by default the search would fall back to tp > 1) */
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
    bg_model_desc_destroy(desc);
}

/* Offload's transfers over the host link (docs/offload.md "The planner"): a
 * pp 1 x dp 4 plan with the optimizer state offloaded predicts the step of
 * a free link plus 12 bytes per parameter over the link (the replica updates
 * every parameter at zero 0), from the model's own profile; the plan read
 * back from its JSON keeps the figure; a bad bandwidth is refused. */
static void test_plan_host_link(void **state)
{
    (void)state;
    uint64_t mem = 1ull << 30;
    bg_model_desc_t *desc;
    bg_plan_params_t pp = small_gpt(&mem, &desc);
    pp.pp = 1;
    pp.tp = 1;
    pp.offload = 1;
    pp.schedules = "1f1b";
    bg_layer_profile_t prof[64];
    int L = 0;
    assert_int_equal(bg_model_profile(desc, pp.microbatch_size, bg_model_desc_params(desc)->seq_len, prof, 64, &L),
                     BG_OK);
    double P = 0;
    for (int i = 0; i < L; i++)
        P += (double)prof[i].params;
    bg_plan_set_t *free_link = NULL, *slow = NULL;
    pp.host_bandwidth = 0;
    assert_int_equal(bg_plan_search(&pp, &free_link), BG_OK);
    pp.host_bandwidth = 1e8;
    assert_int_equal(bg_plan_search(&pp, &slow), BG_OK);
    const bg_plan_t *a = bg_plan_set_get(free_link, 0), *b = bg_plan_set_get(slow, 0);
    assert_int_equal(bg_plan_offload(b), 1);
    assert_int_equal(bg_plan_dp(b), 4);
    assert_int_equal(bg_plan_microbatches(a), bg_plan_microbatches(b));
    double x = 1e3 * 12.0 * P / 1e8;
    assert_true(bg_plan_offload_ms(a) == 0);
    assert_float_equal(bg_plan_offload_ms(b), x, 1e-9 * x);
    assert_float_equal(bg_plan_step_ms(b), bg_plan_step_ms(a) + x, 1e-9 * bg_plan_step_ms(b));
    char *text;
    bg_plan_t *back;
    assert_int_equal(bg_plan_to_json(b, &text), BG_OK);
    assert_int_equal(bg_plan_from_json(text, &back), BG_OK);
    free(text);
    assert_true(bg_plan_offload_ms(back) == bg_plan_offload_ms(b));
    bg_plan_free(back);
    bg_plan_set_t *set = NULL;
    pp.host_bandwidth = -1;
    assert_int_equal(bg_plan_search(&pp, &set), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "host bandwidth"));
    pp.host_bandwidth = NAN;
    assert_int_equal(bg_plan_search(&pp, &set), BG_ERR_INVALID);
    bg_plan_set_free(free_link);
    bg_plan_set_free(slow);
    bg_model_desc_destroy(desc);
}

/* Layouts with more model stages than layers are no candidates, whether or
 * not their schedule is made first (the search refuses them before): for
 * each schedule kind, the layouts evaluated are counted here from the
 * schedules bg_schedule_generate makes for every depth, and no plan has more
 * stages than the model has layers. */
static void test_plan_stages_bound(void **state)
{
    (void)state;
    uint64_t mem = 1ull << 30;
    bg_model_desc_t *desc;
    bg_plan_params_t pp = small_gpt(&mem, &desc);
    int L = bg_model_desc_num_layers(desc);
    pp.world = 16;
    pp.batch = 64; /* m = 4 pp: dualpipe's and dualpipev's at least 2 pp microbatches */
    pp.microbatch_size = 1;
    pp.tp = 1;
    pp.top = 1000;
    const char *kinds[] = {"1f1b", "interleaved", "zbv", "dualpipev", "dualpipe"};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        bg_schedule_kind_t kind;
        assert_int_equal(bg_schedule_kind_parse(kinds[k], &kind), BG_OK);
        int want = 0, refused = 0;
        for (int d = 1; d <= pp.world; d++) { /* the search's layouts: pp | world, dp | batch, m = batch / dp */
            if (pp.world % d || d > L || pp.batch % (pp.world / d))
                continue;
            if (d == 1 && kind != BG_SCHED_1F1B)
                continue; /* depth 1: 1F1B only (one process) */
            bg_schedule_params_t sp = BG_SCHEDULE_PARAMS_INIT;
            sp.kind = kind;
            sp.stages = d;
            sp.microbatches = pp.batch / (pp.world / d);
            bg_schedule_t *s = NULL;
            if (bg_schedule_generate(&sp, &s) != BG_OK)
                continue;
            if (bg_schedule_stages(s) / bg_schedule_copies(s) <= L)
                want++;
            else
                refused++;
            bg_schedule_free(s);
        }
        pp.schedules = kinds[k];
        bg_plan_set_t *set = NULL;
        bg_status_t st = bg_plan_search(&pp, &set);
        if (want == 0) {
            assert_int_not_equal(st, BG_OK);
            continue;
        }
        assert_int_equal(st, BG_OK);
        assert_int_equal(bg_plan_set_evaluated(set), want);
        for (int i = 0; i < bg_plan_set_count(set); i++)
            assert_true(bg_plan_num_stages(bg_plan_set_get(set, i)) <= L);
        bg_plan_set_free(set);
        if (kind == BG_SCHED_ZBV) /* the case in point: the deepest V layouts outnumber the layers */
            assert_true(refused > 0);
    }
    bg_model_desc_destroy(desc);
}

/* Tensor parallelism in the memory model: a tp = 2 build's per-device
 * profile divides what tp divides and keeps what it replicates (closed
 * forms), the cost carries the group's sums; a head too big for one device
 * at tp = 1 makes the search fall back to the smallest tp that fits, and say so. */
static void test_plan_tp(void **state)
{
    (void)state;
    bg_model_config_t mc = small_gpt_config();
    const size_t C = 64, V = 256, T = 32, n = 2;
    bg_model_desc_t *d1, *d2;
    assert_int_equal(bg_model_build(&mc, &d1), BG_OK);
    mc.tp = 2;
    assert_int_equal(bg_model_build(&mc, &d2), BG_OK);
    bg_layer_profile_t p1[16], p2[16];
    int c1, c2;
    assert_int_equal(bg_model_profile(d1, (int)n, (int)T, p1, 16, &c1), BG_OK);
    assert_int_equal(bg_model_profile(d2, (int)n, (int)T, p2, 16, &c2), BG_OK);
    assert_int_equal(c1, c2);
    /* block: divided qkv (3C^2 + 3C), proj weight (C^2), fc (4C^2 + 4C), proj weight (4C^2); replicated: two
     * layernorms (4C) and the two row-parallel biases (2C) */
    assert_int_equal(p1[1].params, 12 * C * C + 13 * C);
    assert_int_equal(p2[1].params, (12 * C * C + 7 * C) / 2 + 6 * C);
    assert_int_equal(p2[0].params, V * C / 2 + T * C); /* wte divided, wpe replicated */
    assert_int_equal(p2[c2 - 1].params, V * C / 2);   /* head */
    assert_true(p2[1].stash_bytes < p1[1].stash_bytes); /* qkv, attention, the 4C hidden: halved */
    assert_true(p2[1].stash_bytes > p1[1].stash_bytes / 2); /* the residual stream and layernorms are not */
    /* two sums forward, two backward, of (n, T, C) each */
    assert_float_equal(p2[1].tp.fwd_calls, 2, 0);
    assert_float_equal(p2[1].tp.bwd_bytes, 2.0 * n * T * C * 4, 0);
    assert_float_equal(p1[1].tp.fwd_calls, 0, 0);
    bg_model_desc_destroy(d2);

    /* fallback: the head (V x C with AdamW) exceeds the budget at tp = 1 */
    bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
    mc.tp = 1;
    mc.vocab = 8192;
    bg_model_desc_t *big;
    assert_int_equal(bg_model_build(&mc, &big), BG_OK);
    uint64_t mem = (uint64_t)8192 * C * 16 * 9 / 10; /* 90% of the head's static bytes */
    pp.model = big;
    pp.world = 4;
    pp.mem = &mem;
    pp.nmem = 1;
    pp.batch = 8;
    pp.microbatch_size = 1;
    pp.tp = 1;
    bg_plan_set_t *set = NULL;
    assert_int_equal(bg_plan_search(&pp, &set), BG_ERR_NO_FIT);
    pp.tp = 0;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    const bg_plan_t *b = bg_plan_set_get(set, 0);
    assert_int_equal(bg_plan_tp(b), 2);
    assert_int_equal(bg_plan_pp(b) * bg_plan_dp(b) * 2, 4);
    assert_non_null(strstr(bg_plan_set_note(set), "tp = 2 is the smallest tensor-parallel degree that fits"));
    assert_non_null(strstr(bg_plan_set_note(set), "biggest layer is head"));
    for (int r = 0; r < bg_plan_pp(b); r++)
        assert_true(bg_plan_rank_peak_bytes(b, r) <= mem);
    /* the plan's model is the whole one (layout-independent) and checks against it */
    assert_int_equal(bg_plan_check_model(b, big), BG_OK);
    bg_plan_set_free(set);
    bg_model_desc_destroy(big);
    bg_model_desc_destroy(d1);
}

/* The plan JSON's layers as the plan wrote them: their cost fields and the source of the times. */
static json_t *plan_layers_json(const bg_plan_t *b, const char *want_times)
{
    char *text;
    assert_int_equal(bg_plan_to_json(b, &text), BG_OK);
    json_t *root = json_loads(text, 0, NULL);
    free(text);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "layer_times")), want_times);
    json_t *l = json_incref(json_object_get(root, "layers"));
    json_decref(root);
    return l;
}

/* Layer times measured on a tensor group (bg_plan_params_t.tp_times) are the
 * cost model's times at their degree as they are: not divided by tp, no link
 * cost added for the collectives (the measurement includes them), B and W as
 * measured; the plan records them per layer ("fwd_ms", "bwd_ms", "tp_ms",
 * "layer_times": "measured_tp") and a save loads back with them. Without an
 * entry for the degree, one-process times are divided by tp and each layer's
 * collectives costed on the link (the closed form below). */
static void test_plan_tp_measured(void **state)
{
    (void)state;
    bg_model_config_t mc = small_gpt_config();
    bg_model_desc_t *d1, *d2;
    assert_int_equal(bg_model_build(&mc, &d1), BG_OK);
    mc.tp = 2;
    assert_int_equal(bg_model_build(&mc, &d2), BG_OK);
    enum { N = 2, MAXL = 16 };
    bg_layer_profile_t p2[MAXL];
    int L;
    assert_int_equal(bg_model_profile(d2, N, mc.seq_len, p2, MAXL, &L), BG_OK);
    double one[MAXL], f[MAXL], bw[MAXL], b[MAXL], w[MAXL], c[MAXL];
    for (int i = 0; i < L; i++) {
        one[i] = 4e-3 * (i + 1);
        f[i] = 1e-3 * (i + 1) + 1.5e-4, bw[i] = 2e-3 * (i + 1), b[i] = 1.2e-3 * (i + 1), w[i] = bw[i] - b[i];
        c[i] = 1e-4 * (i % 3);
    }
    uint64_t mem = 1ull << 30;
    bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
    pp.model = d1;
    pp.world = 2;
    pp.mem = &mem;
    pp.nmem = 1;
    pp.batch = 8;
    pp.microbatch_size = N;
    pp.pp = 1;
    pp.tp = 2;
    pp.schedules = "1f1b";
    pp.flops = 1e10;
    pp.link_latency = 2e-5;
    pp.link_bandwidth = 1e9;
    pp.layer_fwd_s = one;
    pp.layer_bwd_s = one;

    /* one-process times: / tp, plus the ring's cost of each layer's collectives */
    bg_plan_set_t *set = NULL;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    json_t *jl = plan_layers_json(bg_plan_set_get(set, 0), "measured");
    for (int i = 0; i < L; i++) {
        json_t *e = json_array_get(jl, (size_t)i);
        double cf = p2[i].tp.fwd_calls * 2 * pp.link_latency + p2[i].tp.fwd_bytes / pp.link_bandwidth;
        double cb = p2[i].tp.bwd_calls * 2 * pp.link_latency + p2[i].tp.bwd_bytes / pp.link_bandwidth;
        assert_float_equal(json_real_value(json_object_get(e, "fwd_ms")), 1e3 * (one[i] / 2 + cf), 1e-12);
        assert_float_equal(json_real_value(json_object_get(e, "bwd_ms")), 1e3 * (one[i] / 2 + cb), 1e-12);
        assert_float_equal(json_real_value(json_object_get(e, "tp_ms")), 1e3 * (cf + cb), 1e-12);
    }
    assert_true(p2[1].tp.fwd_calls > 0); /* the blocks' sums were costed */
    json_decref(jl);
    bg_plan_set_free(set);

    /* measured on a group of another degree: not used at tp 2 */
    bg_plan_layer_times_t tt[2] = {{.tp = 4, .fwd_s = f, .bwd_s = bw}, {.tp = 2, .fwd_s = f, .bwd_s = bw}};
    pp.tp_times = tt;
    pp.ntp_times = 1;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    json_decref(plan_layers_json(bg_plan_set_get(set, 0), "measured"));
    bg_plan_set_free(set);

    /* measured at tp 2: as they are; the stage's time per microbatch is their sum */
    pp.ntp_times = 2;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    const bg_plan_t *best = bg_plan_set_get(set, 0);
    jl = plan_layers_json(best, "measured_tp");
    double sum = 0;
    for (int i = 0; i < L; i++) {
        json_t *e = json_array_get(jl, (size_t)i);
        assert_float_equal(json_real_value(json_object_get(e, "fwd_ms")), 1e3 * f[i], 1e-12);
        assert_float_equal(json_real_value(json_object_get(e, "bwd_ms")), 1e3 * bw[i], 1e-12);
        assert_float_equal(json_real_value(json_object_get(e, "tp_ms")), 0, 0); /* not given */
        sum += 1e3 * (f[i] + bw[i]);
    }
    json_decref(jl);
    assert_int_equal(bg_plan_num_stages(best), 1);
    assert_float_equal(bg_plan_stage(best, 0)->predicted_ms_per_microbatch, sum, 1e-9);
    /* one stage, 1F1B, no reduction: the step is m microbatches' F and B, then the optimizer step, here
     * 10 FLOP per parameter at --flops (nothing measured) */
    int m = bg_plan_microbatches(best);
    size_t params = 0;
    for (int i = 0; i < L; i++)
        params += p2[i].params;
    assert_float_equal(bg_plan_step_ms(best), m * sum + 1e3 * 10.0 * (double)params / pp.flops, 1e-9);
    bg_plan_set_free(set);

    /* the optimizer step measured per layer: the stage's is their sum, in the step and recorded per layer
     * ("opt_ms"); by hand: m (F + B) + (o_0 + .. + o_L-1), o_i = 0.1 (i + 1) ms */
    double o[MAXL], osum = 0;
    for (int i = 0; i < L; i++)
        osum += o[i] = 1e-4 * (i + 1);
    tt[1].opt_s = o;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    best = bg_plan_set_get(set, 0);
    assert_float_equal(bg_plan_step_ms(best), m * sum + 1e3 * osum, 1e-9);
    assert_float_equal(bg_plan_step_ms(best), 4 * sum + 0.1 * L * (L + 1) / 2.0, 1e-9); /* m = 8 / 2 */
    jl = plan_layers_json(best, "measured_tp");
    for (int i = 0; i < L; i++)
        assert_float_equal(json_real_value(json_object_get(json_array_get(jl, (size_t)i), "opt_ms")),
                           0.1 * (i + 1), 1e-12);
    json_decref(jl);
    bg_plan_set_free(set);
    /* measured in one process (no entry for the degree): / tp, as the layers' times */
    pp.ntp_times = 1;
    pp.layer_opt_s = o;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    jl = plan_layers_json(bg_plan_set_get(set, 0), "measured");
    double one_sum = 0;
    for (int i = 0; i < L; i++) {
        json_t *e = json_array_get(jl, (size_t)i);
        assert_float_equal(json_real_value(json_object_get(e, "opt_ms")), 1e3 * o[i] / 2, 1e-12);
        one_sum += json_real_value(json_object_get(e, "fwd_ms")) + json_real_value(json_object_get(e, "bwd_ms"));
    }
    assert_float_equal(bg_plan_step_ms(bg_plan_set_get(set, 0)), m * one_sum + 1e3 * osum / 2, 1e-9);
    json_decref(jl);
    bg_plan_set_free(set);
    pp.layer_opt_s = NULL;
    pp.ntp_times = 2;

    /* with the collectives' share and B, W: recorded; saved and loaded with the plan */
    tt[1].b_s = b, tt[1].w_s = w, tt[1].tp_s = c;
    pp.schedules = "zb-h1"; /* pp 2 x tp 2 */
    pp.world = 4;
    pp.pp = 2;
    pp.batch = 16;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    best = bg_plan_set_get(set, 0);
    bg_plan_t *loaded = saved_and_loaded(best);
    assert_int_equal(bg_plan_tp(loaded), 2);
    assert_int_equal(bg_plan_check_model(loaded, d1), BG_OK);
    jl = plan_layers_json(loaded, "measured_tp");
    for (int i = 0; i < L; i++) {
        json_t *e = json_array_get(jl, (size_t)i);
        assert_float_equal(json_real_value(json_object_get(e, "fwd_ms")), 1e3 * f[i], 1e-12);
        assert_float_equal(json_real_value(json_object_get(e, "tp_ms")), 1e3 * c[i], 1e-12);
    }
    json_decref(jl);
    bg_plan_free(loaded);
    bg_plan_set_free(set);

    /* bad input */
    tt[0].tp = 2;
    assert_int_equal(bg_plan_search(&pp, &set), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "both for tp 2"));
    tt[0].tp = 4;
    c[1] = -1;
    assert_int_equal(bg_plan_search(&pp, &set), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "layer 1 is negative"));
    bg_model_desc_destroy(d2);
    bg_model_desc_destroy(d1);
}

/* bg_plan_check_model of plan @p b against the builder model @p oc: BG_OK
 * when @p mismatch is NULL, else BG_ERR_MISMATCH with a message containing it. */
static void check_against(const bg_plan_t *b, const bg_model_config_t *oc, const char *mismatch)
{
    bg_model_desc_t *d;
    assert_int_equal(bg_model_build(oc, &d), BG_OK);
    assert_int_equal(bg_plan_check_model(b, d), mismatch ? BG_ERR_MISMATCH : BG_OK);
    if (mismatch && !strstr(bg_last_error(), mismatch))
        fail_msg("\"%s\" lacks \"%s\"", bg_last_error(), mismatch);
    bg_model_desc_destroy(d);
}

static void test_plan_roundtrip(void **state)
{
    (void)state;
    uint64_t mem[4] = {64u << 20, 64u << 20, 32u << 20, 32u << 20};
    double speed[4] = {1, 1, 0.5, 0.5};
    bg_model_desc_t *desc;
    bg_plan_params_t pp = small_gpt(mem, &desc);
    bg_model_config_t mc = small_gpt_config();
    pp.nmem = 4;
    pp.speed = speed;
    pp.nspeed = 4;
    pp.top = 8;
    bg_plan_set_t *set = NULL;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    assert_true(bg_plan_set_count(set) >= 2);
    for (int i = 1; i < bg_plan_set_count(set); i++)
        assert_true(bg_plan_step_ms(bg_plan_set_get(set, i - 1)) <= bg_plan_step_ms(bg_plan_set_get(set, i)));
    for (int i = 0; i < bg_plan_set_count(set); i++) {
        const bg_plan_t *a = bg_plan_set_get(set, i);
        bg_plan_t *b = saved_and_loaded(a);
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
        assert_int_equal(bg_plan_check_model(b, desc), BG_OK);
        /* the model JSON is kept as it was written, and rebuilds the model */
        assert_string_equal(bg_plan_model(b), bg_plan_model(a));
        bg_model_desc_t *rebuilt;
        assert_int_equal(bg_model_desc_from_json(bg_plan_model(b), &rebuilt), BG_OK);
        assert_int_equal(bg_plan_check_model(b, rebuilt), BG_OK);
        bg_model_desc_destroy(rebuilt);
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
        assert_int_equal(total, bg_model_desc_num_layers(desc));
        for (int r = 0; r < bg_plan_pp(a); r++) {
            assert_int_equal(bg_plan_rank_peak_bytes(a, r), bg_plan_rank_peak_bytes(b, r));
            assert_true(bg_plan_rank_peak_bytes(a, r) <= bg_plan_rank_budget_bytes(a, r));
        }
        bg_model_config_t oc = mc;
        oc.d_model = 128; /* another width: the description differs (a tensor's shape) */
        check_against(b, &oc, "the plan is from another model: layers[0]");
        oc = mc;
        oc.heads = 2; /* other heads: the same description JSON, another profile (attention FLOPs) */
        check_against(b, &oc, "the plan is from another model: layer 1 (blocks.0) has");
        oc = mc;
        oc.seed = 99; /* another seed is the same model */
        check_against(b, &oc, NULL);
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
        if (x->first_layer > 0 && x->last_layer < bg_model_desc_num_layers(desc) - 1)
        {
            if (x->rank < 2)
                fast += x->last_layer - x->first_layer + 1;
            else
                slow += x->last_layer - x->first_layer + 1;
        }
    }
    assert_true(fast > slow);
    bg_plan_set_free(set);

    /* parse errors name the field */
    bg_plan_t *b = NULL;
    assert_int_equal(bg_plan_from_json("{", &b), BG_ERR_PARSE);
    assert_int_equal(bg_plan_from_json("{\"format\": \"brigade-plan\", \"version\": 2}", &b), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "$.world"));
    assert_int_equal(bg_plan_from_json("{\"format\": \"brigade-plan\", \"version\": 1}", &b), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "before model descriptions"));
    assert_int_equal(bg_plan_from_json("{\"format\": \"other\"}", &b), BG_ERR_PARSE);
    assert_int_equal(bg_plan_load("/nonexistent/plan.json", &b), BG_ERR_PARSE);
    bg_model_desc_destroy(desc);
}

/* ---------------------------------------------------------------- fixtures */

/* Is `got` the fixture's `want`? Integers and strings exactly, reals within
 * 1e-12 relative (the fixtures keep 17 digits; the margin only spares a
 * compiler's different rounding of the same formula). On a difference,
 * `path` (cap bytes, "$" to start) is left naming it as a JSON path. */
static int json_same(json_t *want, json_t *got, char *path, size_t cap)
{
    size_t len = strlen(path);
    if (json_is_object(want)) {
        if (!json_is_object(got) || json_object_size(want) != json_object_size(got))
            return 0;
        const char *k;
        json_t *v;
        json_object_foreach(want, k, v) {
            snprintf(path + len, cap - len, ".%s", k);
            if (!json_same(v, json_object_get(got, k), path, cap))
                return 0;
        }
    } else if (json_is_array(want)) {
        if (!json_is_array(got) || json_array_size(want) != json_array_size(got))
            return 0;
        for (size_t i = 0; i < json_array_size(want); i++) {
            snprintf(path + len, cap - len, "[%zu]", i);
            if (!json_same(json_array_get(want, i), json_array_get(got, i), path, cap))
                return 0;
        }
    } else if (json_is_real(want) || json_is_real(got)) {
        if (!json_is_number(got) || !json_is_number(want))
            return 0;
        double a = json_number_value(want), b = json_number_value(got);
        if (!(fabs(a - b) <= 1e-12 * fabs(a)))
            return 0;
    } else if (!json_equal(want, got)) {
        return 0;
    }
    path[len] = 0;
    return 1;
}

/* Search with `pp` (its model built from `mc`) and compare every plan of the
 * set, or the no-fit message, with tests/partitioner/fixtures/NAME.json,
 * which the planner of commit 4f03887 wrote (before plans stored model
 * descriptions; its "model" is left out, and its "version" was 1), rewritten
 * where a layer's reported sizes or FLOPs changed on purpose (the fused
 * attention kernel). BRIGADE_UPDATE_FIXTURES=1 rewrites a fixture from the
 * current planner instead of comparing: review its diff before committing. */
static void check_fixture(const char *name, const bg_model_config_t *mc, bg_plan_params_t pp)
{
    char file[1024], path[512] = "$";
    snprintf(file, sizeof(file), "%s/tests/partitioner/fixtures/%s.json", getenv("BRIGADE_SOURCE_DIR"), name);
    json_error_t e;
    json_t *want = json_load_file(file, 0, &e);
    if (!want)
        fail_msg("%s: %s", file, e.text);
    bg_model_desc_t *desc;
    assert_int_equal(bg_model_build(mc, &desc), BG_OK);
    pp.model = desc;
    bg_plan_set_t *set = NULL;
    bg_status_t st = bg_plan_search(&pp, &set);
    const char *upd = getenv("BRIGADE_UPDATE_FIXTURES");
    if (upd && strcmp(upd, "1") == 0) {
        json_object_set_new(want, "status", json_string(bg_status_string(st)));
        if (st != BG_OK) {
            json_object_set_new(want, "error", json_string(bg_last_error()));
        } else {
            json_t *np = json_array();
            for (int i = 0; i < bg_plan_set_count(set); i++) {
                char *text;
                assert_int_equal(bg_plan_to_json(bg_plan_set_get(set, i), &text), BG_OK);
                json_t *got = json_loads(text, 0, NULL);
                free(text);
                json_object_del(got, "model");
                json_array_append_new(np, got);
            }
            json_object_set_new(want, "evaluated", json_integer(bg_plan_set_evaluated(set)));
            json_object_set_new(want, "plans", np);
        }
        assert_int_equal(json_dump_file(want, file, JSON_INDENT(1) | JSON_REAL_PRECISION(17)), 0);
    }
    assert_string_equal(bg_status_string(st), json_string_value(json_object_get(want, "status")));
    if (st != BG_OK) {
        assert_string_equal(bg_last_error(), json_string_value(json_object_get(want, "error")));
    } else {
        json_t *plans = json_object_get(want, "plans");
        assert_int_equal(bg_plan_set_evaluated(set), json_integer_value(json_object_get(want, "evaluated")));
        assert_int_equal(bg_plan_set_count(set), json_array_size(plans));
        for (int i = 0; i < bg_plan_set_count(set); i++) {
            char *text;
            assert_int_equal(bg_plan_to_json(bg_plan_set_get(set, i), &text), BG_OK);
            json_t *got = json_loads(text, 0, NULL);
            free(text);
            assert_non_null(got);
            assert_int_equal(json_integer_value(json_object_get(got, "version")), 2);
            assert_true(json_is_object(json_object_get(got, "model")));
            json_object_del(got, "model");
            json_object_del(got, "version");
            json_t *w = json_deep_copy(json_array_get(plans, (size_t)i));
            json_object_del(w, "version");
            snprintf(path, sizeof(path), "$");
            if (!json_same(w, got, path, sizeof(path)))
                fail_msg("%s: plan %d differs from the fixture at %s", name, i, path);
            json_decref(w);
            json_decref(got);
        }
        bg_plan_set_free(set);
    }
    bg_model_desc_destroy(desc);
    json_decref(want);
}

/* The planner gives the plans it gave before (same layouts, splits, memory,
 * times, recomputation; same no-fit messages) on GPTs and MLPs, uniform and
 * mixed devices, every schedule, measured times and SGD. */
static void test_plan_fixtures(void **state)
{
    (void)state;
    /* the fixtures pin the search, with the layers' own bytes: no guard bytes (BRIGADE_GUARD's are
     * checked against real stages by test_memory_matches_stages) */
    assert_int_equal(setenv("BRIGADE_GUARD", "off", 1), 0);
    { /* heterogeneous devices, every schedule */
        bg_model_config_t mc = small_gpt_config();
        static const uint64_t mem[] = {64u << 20, 64u << 20, 32u << 20, 32u << 20};
        static const double speed[] = {1, 1, 0.5, 0.5};
        bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
        pp.world = 4, pp.mem = mem, pp.nmem = 4, pp.speed = speed, pp.nspeed = 4;
        pp.batch = 16, pp.microbatch_size = 2;
        check_fixture("gpt_hetero", &mc, pp);
    }
    { /* a tight budget: recomputation on one stage */
        bg_model_config_t mc = small_gpt_config();
        static const uint64_t mem[] = {4600u << 10};
        bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
        pp.world = 2, pp.mem = mem, pp.nmem = 1;
        pp.batch = 16, pp.microbatch_size = 2, pp.allow_recompute = 1, pp.schedules = "1f1b,zb-h1";
        check_fixture("gpt_recompute", &mc, pp);
    }
    { /* MLP, SGD, searched microbatch size, infinite bandwidth */
        bg_model_config_t mc = BG_MODEL_CONFIG_INIT;
        mc.kind = BG_MODEL_MLP, mc.layers = 4, mc.d_model = 256, mc.in_features = 32, mc.classes = 8;
        static const uint64_t mem[] = {1u << 30};
        bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
        pp.world = 4, pp.mem = mem, pp.nmem = 1, pp.batch = 32, pp.optim = BG_OPTIM_SGD, pp.link_bandwidth = 0;
        pp.top = 8;
        check_fixture("mlp_sgd", &mc, pp);
    }
    { /* tied embeddings, interleaved and zbv, dp 2 */
        bg_model_config_t mc = BG_MODEL_CONFIG_INIT;
        mc.layers = 8, mc.d_model = 64, mc.heads = 4, mc.seq_len = 16, mc.vocab = 128, mc.tie_embeddings = 1;
        static const uint64_t mem[] = {1u << 30};
        bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
        pp.world = 4, pp.mem = mem, pp.nmem = 1, pp.batch = 8, pp.microbatch_size = 1;
        pp.schedules = "interleaved,zbv", pp.chunks = 2, pp.flops = 5e11, pp.link_latency = 1e-5;
        pp.link_bandwidth = 1e9;
        check_fixture("gpt_tied_interleaved", &mc, pp);
    }
    { /* measured layer times (synthetic), split B and W */
        bg_model_config_t mc = BG_MODEL_CONFIG_INIT;
        mc.layers = 4, mc.d_model = 32, mc.heads = 4, mc.seq_len = 16;
        static const uint64_t mem[] = {1u << 30};
        static double f[7], bw[7], b[7], w[7];
        for (int i = 0; i < 7; i++)
            f[i] = 1e-3 * (1 + i % 3), bw[i] = 2.5 * f[i], b[i] = 1.5 * f[i], w[i] = f[i];
        bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
        pp.world = 2, pp.mem = mem, pp.nmem = 1, pp.batch = 8, pp.microbatch_size = 2;
        pp.layer_fwd_s = f, pp.layer_bwd_s = bw, pp.layer_b_s = b, pp.layer_w_s = w;
        check_fixture("gpt_measured", &mc, pp);
    }
    { /* nothing fits: uniform budgets */
        bg_model_config_t mc = small_gpt_config();
        static const uint64_t mem[] = {200000};
        bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
        pp.world = 4, pp.mem = mem, pp.nmem = 1, pp.batch = 16, pp.microbatch_size = 2;
        check_fixture("gpt_nofit", &mc, pp);
    }
    { /* nothing fits: heterogeneous budgets */
        bg_model_config_t mc = BG_MODEL_CONFIG_INIT;
        mc.kind = BG_MODEL_MLP, mc.layers = 3, mc.d_model = 512, mc.in_features = 64;
        static const uint64_t mem[] = {2u << 20, 3u << 20};
        bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
        pp.world = 2, pp.mem = mem, pp.nmem = 2, pp.batch = 8, pp.allow_recompute = 1;
        check_fixture("mlp_nofit_hetero", &mc, pp);
    }
    assert_int_equal(unsetenv("BRIGADE_GUARD"), 0);
}

/* ---------------------------------------------------------------- a user's model */

/* A layer type of the test's own: out = in + shift, one shift per channel. */
static bg_status_t shift_out_shape(const bg_layer_t *l, bg_shape_t in, bg_shape_t *out_p)
{
    if (in.c != (int)l->params[0].numel)
        return bg_error(BG_ERR_INVALID, "shift %s: %d channels, expected %zu", l->name, in.c, l->params[0].numel);
    *out_p = in;
    return BG_OK;
}
static double shift_flops(const bg_layer_t *l, bg_shape_t in) { return (double)bg_shape_numel(in); }
static bg_status_t shift_forward(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, float *out)
{
    ctx->be->ops->copy(ctx->be, out, in, bg_shape_numel(ctx->in));
    ctx->be->ops->bias_forward(ctx->be, out, l->params[0].data, ctx->in.n * ctx->in.t, ctx->in.c);
    return BG_OK;
}
static bg_status_t shift_backward_input(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                        const float *dout, float *din)
{
    if (din)
        ctx->be->ops->copy(ctx->be, din, dout, bg_shape_numel(ctx->in));
    return BG_OK;
}
static bg_status_t shift_backward_weight(bg_layer_t *l, const bg_layer_ctx_t *ctx, const float *in, const float *out,
                                         const float *dout)
{
    ctx->be->ops->bias_backward(ctx->be, l->params[0].grad, dout, ctx->in.n * ctx->in.t, ctx->in.c);
    return BG_OK;
}
static const bg_layer_ops_t shift_ops = {
    .type = "test-shift",
    .out_shape = shift_out_shape,
    .fwd_flops = shift_flops,
    .bwd_flops = shift_flops,
    .forward = shift_forward,
    .backward_input = shift_backward_input,
    .backward_weight = shift_backward_weight,
};

/* linear / relu / shift / linear / gelu / layernorm / linear / head over
 * features of 3 positions: an order no builder makes, with a layer type no
 * builder knows. `wide` is the width of the middle linear's output. */
static bg_model_desc_t *user_model(int wide)
{
    enum { F = 24, H = 192 };
    bg_model_desc_params_t dp = BG_MODEL_DESC_PARAMS_INIT;
    dp.name = "user-net", dp.input = BG_INPUT_FEATURES, dp.features = F, dp.seq_len = 3;
    bg_model_desc_t *d;
    assert_int_equal(bg_model_desc_create(&dp, &d), BG_OK);
    bg_param_t shift = {.name = "shift", .ndim = 1, .shape = {H}, .init = BG_INIT_CONST, .init_value = 0.0f};
    bg_layer_t *l[8];
    assert_int_equal(bg_layer_linear("in", F, H, 1, 0.1f, &l[0]), BG_OK);
    assert_int_equal(bg_layer_activation("relu", BG_ACT_RELU, &l[1]), BG_OK);
    assert_int_equal(bg_layer_create(&shift_ops, "shift", 1, &shift, NULL, &l[2]), BG_OK);
    assert_int_equal(bg_layer_linear("mid", H, wide, 1, 0.1f, &l[3]), BG_OK);
    assert_int_equal(bg_layer_activation("gelu", BG_ACT_GELU, &l[4]), BG_OK);
    assert_int_equal(bg_layer_layernorm("norm", wide, &l[5]), BG_OK);
    assert_int_equal(bg_layer_linear("out", wide, H, 1, 0.1f, &l[6]), BG_OK);
    assert_int_equal(bg_layer_head("head", H, 10, 1, 0.1f, &l[7]), BG_OK);
    for (int i = 0; i < 8; i++)
        assert_int_equal(bg_model_desc_add(d, l[i]), BG_OK);
    assert_int_equal(bg_model_desc_check(d), BG_OK);
    return d;
}

/* A model of the host's own layers is planned from what its layers report,
 * under a budget that one device cannot meet; its plan round-trips through a
 * file, and only the same description passes bg_plan_check_model. */
static void test_plan_user_model(void **state)
{
    (void)state;
    bg_model_desc_t *desc = user_model(256);
    int L = bg_model_desc_num_layers(desc);
    /* what one device needs for the whole model */
    uint64_t mem = 1ull << 40;
    bg_plan_params_t pp = BG_PLAN_PARAMS_INIT;
    pp.model = desc, pp.world = 1, pp.mem = &mem, pp.nmem = 1, pp.batch = 8, pp.microbatch_size = 2;
    bg_plan_set_t *set = NULL;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    uint64_t whole = bg_plan_rank_peak_bytes(bg_plan_set_get(set, 0), 0);
    assert_int_equal(bg_plan_seq(bg_plan_set_get(set, 0)), 3);
    bg_plan_set_free(set);
    /* two devices of 60% of that: only a pipeline fits */
    mem = whole * 6 / 10;
    pp.world = 2;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    const bg_plan_t *a = bg_plan_set_get(set, 0);
    assert_int_equal(bg_plan_pp(a), 2);
    for (int r = 0; r < bg_plan_pp(a); r++)
        assert_true(bg_plan_rank_peak_bytes(a, r) <= mem);
    int split[8], total = 0, ns = bg_plan_split(a, split, 8);
    for (int k = 0; k < ns; k++)
        total += split[k];
    assert_int_equal(total, L);
    /* the plan's layers are the description's profile */
    bg_layer_profile_t prof[8];
    int n;
    assert_int_equal(bg_model_profile(desc, 2, 3, prof, 8, &n), BG_OK);
    char *text;
    assert_int_equal(bg_plan_to_json(a, &text), BG_OK);
    json_t *root = json_loads(text, 0, NULL);
    free(text);
    json_t *jl = json_object_get(root, "layers");
    assert_int_equal(json_array_size(jl), L);
    for (int i = 0; i < L; i++) {
        json_t *e = json_array_get(jl, (size_t)i);
        assert_string_equal(json_string_value(json_object_get(e, "name")), prof[i].name);
        assert_int_equal(json_integer_value(json_object_get(e, "stash_bytes")), prof[i].stash_bytes);
        assert_true(json_number_value(json_object_get(e, "fwd_flops")) == prof[i].fwd_flops);
    }
    /* the features' bytes count on the first stage: 2 x 3 x 24 floats */
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_object_get(root, "model"), "input"),
                                                          "kind")),
                        "features");
    json_decref(root);
    /* save and load */
    bg_plan_t *b = saved_and_loaded(a);
    assert_string_equal(bg_plan_model(b), bg_plan_model(a));
    assert_int_equal(bg_plan_pp(b), 2);
    assert_true(bg_plan_step_ms(b) == bg_plan_step_ms(a));
    for (int r = 0; r < 2; r++)
        assert_int_equal(bg_plan_rank_peak_bytes(b, r), bg_plan_rank_peak_bytes(a, r));
    for (int k = 0; k < bg_plan_num_stages(a); k++) {
        assert_int_equal(bg_plan_stage(b, k)->first_layer, bg_plan_stage(a, k)->first_layer);
        assert_int_equal(bg_plan_stage(b, k)->last_layer, bg_plan_stage(a, k)->last_layer);
    }
    /* a file cannot rebuild the host's layers: the host checks its own description */
    bg_model_desc_t *rebuilt = NULL;
    assert_int_equal(bg_model_desc_from_json(bg_plan_model(b), &rebuilt), BG_ERR_UNSUPPORTED);
    bg_model_desc_t *same = user_model(256);
    assert_int_equal(bg_plan_check_model(b, same), BG_OK);
    bg_model_desc_destroy(same);
    bg_model_desc_t *other = user_model(128);
    assert_int_equal(bg_plan_check_model(b, other), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "the plan is from another model"));
    assert_non_null(strstr(bg_last_error(), "\"mid\""));
    bg_model_desc_destroy(other);
    bg_plan_free(b);
    bg_plan_set_free(set);
    bg_model_desc_destroy(desc);
}

/* A plan file whose layers are not its model's is refused on load (a
 * builder-made model is rebuilt and profiled), naming the layer and field. */
static void test_plan_load_checks_model(void **state)
{
    (void)state;
    uint64_t mem = 1u << 30;
    bg_model_desc_t *desc;
    bg_plan_params_t pp = small_gpt(&mem, &desc);
    bg_plan_set_t *set = NULL;
    assert_int_equal(bg_plan_search(&pp, &set), BG_OK);
    char *text;
    assert_int_equal(bg_plan_to_json(bg_plan_set_get(set, 0), &text), BG_OK);
    json_t *root = json_loads(text, 0, NULL);
    free(text);
    json_t *l2 = json_array_get(json_object_get(root, "layers"), 2);
    json_object_set_new(l2, "stash_bytes", json_integer(json_integer_value(json_object_get(l2, "stash_bytes")) + 64));
    text = json_dumps(root, 0);
    bg_plan_t *b = NULL;
    assert_int_equal(bg_plan_from_json(text, &b), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "not those of the model in $.model"));
    assert_non_null(strstr(bg_last_error(), "layer 2 (blocks.1) has stash_bytes"));
    free(text);
    /* a model that is not a description */
    json_object_set_new(root, "model", json_pack("{s:s, s:i}", "kind", "gpt", "layers", 6));
    text = json_dumps(root, 0);
    assert_int_equal(bg_plan_from_json(text, &b), BG_ERR_PARSE);
    assert_non_null(strstr(bg_last_error(), "$.model"));
    free(text);
    json_decref(root);
    bg_plan_set_free(set);
    bg_model_desc_destroy(desc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_vs_brute_force), cmocka_unit_test(test_memory_closed_form),
        cmocka_unit_test(test_memory_matches_stages), cmocka_unit_test(test_replay_1f1b),
        cmocka_unit_test(test_replay_paired),
        cmocka_unit_test(test_offact_1f1b),          cmocka_unit_test(test_offact_deadlock),
        cmocka_unit_test(test_no_fit_message),       cmocka_unit_test(test_plan_smallest_budget),
        cmocka_unit_test(test_plan_stages_bound),    cmocka_unit_test(test_plan_host_link),
        cmocka_unit_test(test_plan_tp),              cmocka_unit_test(test_plan_tp_measured),
        cmocka_unit_test(test_plan_roundtrip),       cmocka_unit_test(test_plan_fixtures),
        cmocka_unit_test(test_plan_user_model),      cmocka_unit_test(test_plan_load_checks_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
