/* tests/models/test_tp_layers.c: the tensor-parallel layers in one process.
 * T threads play the members of a tensor group (a bg_tp_comm_t whose sums
 * and gathers go through shared memory in member order), each running one
 * microbatch of a user-style description built from the public layer calls;
 * the losses, the input gradient and every gathered full gradient must match
 * the same model built from the plain layers, run whole. Also: the shard
 * layout (q, k, v blocks), the layout-independent JSON, and the errors.
 * Sequence parallelism: the same GPT switched to it, and its regions (a
 * block split along the sequence) layer by layer: forward, backward-input
 * and backward-weight against the unsplit block. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "bg_test_backend.h"

#define MAXT 4

/* ------------------------------------------------ a group of threads */

typedef struct shared {
    int T;
    pthread_barrier_t bar;
    const float *bufs[MAXT];
} shared_t;

typedef struct member {
    shared_t *sh;
    int rank;
    bg_tp_comm_t comm;
    char log[4096]; /* lazy mode: S (a sum started), X (waited for), W (a GEMM accumulating, beta 1) */
    int nlog;
} member_t;

static void log_event(member_t *m, char e)
{
    if (m->nlog < (int)sizeof(m->log) - 1)
        m->log[m->nlog++] = e;
}

/* The start of every fake collective: member m's buffer is posted, and
 * every member's is there once this returns. */
static shared_t *post(member_t *m, const float *buf)
{
    shared_t *sh = m->sh;
    sh->bufs[m->rank] = buf;
    pthread_barrier_wait(&sh->bar);
    return sh;
}

static bg_status_t fake_allreduce(void *arg, float *buf, size_t n)
{
    float *sum = calloc(n ? n : 1, sizeof(float));
    shared_t *sh = post(arg, buf);
    for (int r = 0; r < sh->T; r++) /* member order: the same bits on every member */
        for (size_t i = 0; i < n; i++)
            sum[i] += sh->bufs[r][i];
    pthread_barrier_wait(&sh->bar);
    memcpy(buf, sum, n * sizeof(float));
    pthread_barrier_wait(&sh->bar);
    free(sum);
    return BG_OK;
}

static bg_status_t fake_allgather(void *arg, const float *send, float *recv, size_t n)
{
    shared_t *sh = post(arg, send);
    for (int r = 0; r < sh->T; r++)
        memcpy(recv + (size_t)r * n, sh->bufs[r], n * sizeof(float));
    pthread_barrier_wait(&sh->bar);
    return BG_OK;
}

/* member i gets the sum of elements [i n, (i+1) n) of every member's send, in member order */
static bg_status_t fake_reduce_scatter(void *arg, const float *send, float *recv, size_t n)
{
    member_t *m = arg;
    shared_t *sh = post(m, send);
    for (size_t i = 0; i < n; i++) {
        float sum = 0;
        for (int r = 0; r < sh->T; r++)
            sum += sh->bufs[r][(size_t)m->rank * n + i];
        recv[i] = sum;
    }
    pthread_barrier_wait(&sh->bar);
    return BG_OK;
}

/* The non-blocking in-place form, done at once: this member's chunk of buf gets the sum */
static bg_status_t fake_ireduce_scatter(void *arg, float *buf, size_t n, void **req_p)
{
    member_t *m = arg;
    float *mine = malloc(n ? n * sizeof(float) : 1);
    if (!mine)
        return BG_ERR_NOMEM;
    bg_status_t st = fake_reduce_scatter(arg, buf, mine, n); /* ends with a barrier: every member has read */
    memcpy(buf + (size_t)m->rank * n, mine, n * sizeof(float));
    free(mine);
    *req_p = buf;
    return st;
}

/* The non-blocking in-place gather, done at once: member r's chunk from member r's buf */
static bg_status_t fake_iallgather(void *arg, float *buf, size_t n, void **req_p)
{
    member_t *m = arg;
    shared_t *sh = post(m, buf);
    for (int r = 0; r < sh->T; r++)
        if (r != m->rank)
            memcpy(buf + (size_t)r * n, sh->bufs[r] + (size_t)r * n, n * sizeof(float));
    pthread_barrier_wait(&sh->bar);
    *req_p = buf;
    return BG_OK;
}

static bg_status_t fake_iallreduce(void *arg, float *buf, size_t n, void **req_p);
static bg_status_t fake_wait(void *arg, void *req);

/* The lazy non-blocking sum and reduce-scatter: nothing moves until wait,
 * which sums (every member waits for its collectives in the order it started
 * them). Logged: S started, X waited for. The non-blocking gather is done at
 * once (its request: kind 2, nothing left for wait). */
typedef struct lazy_req {
    float *buf;
    size_t n;
    int kind; /* 0 sum, 1 reduce-scatter in place, 2 gather (done) */
} lazy_req_t;
static bg_status_t lazy_start(void *arg, float *buf, size_t n, int kind, void **req_p)
{
    lazy_req_t *q = malloc(sizeof(*q));
    if (!q)
        return BG_ERR_NOMEM;
    *q = (lazy_req_t){buf, n, kind};
    if (kind < 2)
        log_event(arg, 'S');
    *req_p = q;
    return BG_OK;
}
static bg_status_t lazy_iallreduce(void *arg, float *buf, size_t n, void **req_p)
{
    return lazy_start(arg, buf, n, 0, req_p);
}
static bg_status_t lazy_ireduce_scatter(void *arg, float *buf, size_t n, void **req_p)
{
    return lazy_start(arg, buf, n, 1, req_p);
}
static bg_status_t lazy_iallgather(void *arg, float *buf, size_t n, void **req_p)
{
    void *done;
    bg_status_t st = fake_iallgather(arg, buf, n, &done);
    return st == BG_OK ? lazy_start(arg, buf, n, 2, req_p) : st;
}
static bg_status_t lazy_wait(void *arg, void *req)
{
    lazy_req_t *q = req;
    bg_status_t st = BG_OK;
    if (q->kind < 2)
        log_event(arg, 'X');
    if (q->kind == 0)
        st = fake_allreduce(arg, q->buf, q->n);
    else if (q->kind == 1)
        st = fake_ireduce_scatter(arg, q->buf, q->n, &(void *){NULL});
    free(q);
    return st;
}

/* The group of member r of T; nb: 0 without the optional functions (the
 * layers' fallbacks), 1 with them (the non-blocking sums, the reduce-scatter,
 * the non-blocking reduce-scatter and gather), 2 with them and the lazy sums. */
static bg_tp_comm_t fake_comm(member_t *m, int T, int r, int nb)
{
    return (bg_tp_comm_t){T,
                          r,
                          fake_allreduce,
                          fake_allgather,
                          m,
                          nb == 2 ? lazy_iallreduce : nb ? fake_iallreduce : NULL,
                          nb == 2 ? lazy_wait : nb ? fake_wait : NULL,
                          nb ? fake_reduce_scatter : NULL,
                          nb == 2 ? lazy_ireduce_scatter : nb ? fake_ireduce_scatter : NULL,
                          nb == 2 ? lazy_iallgather : nb ? fake_iallgather : NULL, NULL};
}

/* The lazy mode's backend: the CPU's table with the GEMMs that accumulate
 * (beta 1: weight gradients) logged to the calling thread's member. */
static __thread member_t *log_member;
static __thread bg_backend_ops_t logged_ops;
static __thread const bg_backend_ops_t *real_ops;
static void logged_gemm(bg_backend_t *b, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                        const float *bm, int ldb, float beta, float *c, int ldc)
{
    if (beta == 1.0f && log_member)
        log_event(log_member, 'W');
    real_ops->gemm(b, ta, tb, m, n, k, alpha, a, lda, bm, ldb, beta, c, ldc);
}

/* The non-blocking form, done at once (the layers' split path: rows in
 * halves, each half summed on its own). */
static bg_status_t fake_iallreduce(void *arg, float *buf, size_t n, void **req_p)
{
    *req_p = buf;
    return fake_allreduce(arg, buf, n);
}
static bg_status_t fake_wait(void *arg, void *req)
{
    (void)arg;
    return req ? BG_OK : BG_ERR_INVALID;
}

/* ------------------------------------------------ the models */

enum { NB = 2, NT = 4, FEAT = 6, HID = 8, CLS = 8, VOC = 16, C = 8, HEADS = 4 };

/* The description name of NT positions, over tokens of a vocabulary of
 * width or over width features: the layers l[0..n) in order, checked. */
static bg_model_desc_t *assemble(const char *name, bg_input_kind_t input, int width, bg_layer_t **l, int n)
{
    bg_model_desc_params_t dp = BG_MODEL_DESC_PARAMS_INIT;
    dp.input = input;
    if (input == BG_INPUT_TOKENS)
        dp.vocab = width;
    else
        dp.features = width;
    dp.seq_len = NT;
    dp.name = name;
    bg_model_desc_t *d;
    assert_int_equal(bg_model_desc_create(&dp, &d), BG_OK);
    for (int i = 0; i < n; i++)
        assert_int_equal(bg_model_desc_add(d, l[i]), BG_OK);
    assert_int_equal(bg_model_desc_check(d), BG_OK);
    return d;
}

/* A user's MLP: column -> gelu -> row -> vocabulary-parallel head (tp > 0),
 * or the same from plain layers (tp = 0). */
static bg_model_desc_t *user_mlp(int tp)
{
    bg_layer_t *l[4];
    if (tp) {
        assert_int_equal(bg_layer_column_linear("up", FEAT, HID, 1, 1, 0.3f, tp, &l[0]), BG_OK);
        assert_int_equal(bg_layer_activation("act", BG_ACT_GELU, &l[1]), BG_OK);
        assert_int_equal(bg_layer_row_linear("down", HID, C, 1, 0.3f, tp, &l[2]), BG_OK);
        assert_int_equal(bg_layer_vocab_head("head", C, CLS, 1, 0.3f, tp, &l[3]), BG_OK);
    } else {
        assert_int_equal(bg_layer_linear("up", FEAT, HID, 1, 0.3f, &l[0]), BG_OK);
        assert_int_equal(bg_layer_activation("act", BG_ACT_GELU, &l[1]), BG_OK);
        assert_int_equal(bg_layer_linear("down", HID, C, 1, 0.3f, &l[2]), BG_OK);
        assert_int_equal(bg_layer_head("head", C, CLS, 1, 0.3f, &l[3]), BG_OK);
    }
    return assemble("user-mlp", BG_INPUT_FEATURES, FEAT, l, 4);
}

/* A one-block transformer: embedding, block, ln_f, head. */
static bg_model_desc_t *user_gpt(int tp)
{
    bg_layer_t *l[4];
    if (tp) {
        assert_int_equal(bg_layer_vocab_embedding("embed", VOC, NT, C, 0.3f, tp, &l[0]), BG_OK);
        assert_int_equal(bg_layer_tp_transformer_block("block", C, HEADS, 0.3f, 0.2f, tp, &l[1]), BG_OK);
    } else {
        assert_int_equal(bg_layer_embedding("embed", VOC, NT, C, 0.3f, &l[0]), BG_OK);
        assert_int_equal(bg_layer_transformer_block("block", C, HEADS, 0.3f, 0.2f, &l[1]), BG_OK);
    }
    assert_int_equal(bg_layer_layernorm("ln_f", C, &l[2]), BG_OK);
    if (tp)
        assert_int_equal(bg_layer_vocab_head("head", C, VOC, 0, 0.3f, tp, &l[3]), BG_OK);
    else
        assert_int_equal(bg_layer_head("head", C, VOC, 0, 0.3f, &l[3]), BG_OK);
    return assemble("user-gpt", BG_INPUT_TOKENS, VOC, l, 4);
}

/* The same GPT under sequence parallelism (tp > 0). */
static bg_model_desc_t *user_gpt_sp(int tp)
{
    bg_model_desc_t *d = user_gpt(tp);
    for (int i = 0; tp && i < bg_model_desc_num_layers(d); i++)
        assert_int_equal(bg_layer_sequence_parallel(bg_model_desc_layer(d, i)), BG_OK);
    return d;
}

/* One microbatch's forward and backward: losses (NB*NT) and full gradients
 * (host, in tensor order, concatenated; gathered from the group). */
typedef struct result {
    float loss[NB * NT];
    float *grads;
    size_t ngrads;
    bg_status_t st;
} result_t;

typedef struct job {
    bg_model_desc_t *(*build)(int tp);
    int tp;
    member_t *me; /* NULL: whole */
    result_t *out;
} job_t;

static void run_one(job_t *j)
{
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = 1;
    bg_backend_t *b;
    bg_model_desc_t *d = j->build(j->tp);
    result_t *r = j->out;
    r->st = bg_backend_create("cpu", &bp, &b);
    if (r->st != BG_OK)
        return;
    if (j->me && j->me->comm.iallreduce == lazy_iallreduce) {
        log_member = j->me;
        real_ops = b->ops;
        logged_ops = *b->ops;
        logged_ops.gemm = logged_gemm;
        b->ops = &logged_ops;
    }
    if (j->me)
        r->st = bg_model_desc_set_tp(d, &j->me->comm);
    bg_model_t *m = NULL;
    bg_stage_t *s = NULL;
    if (r->st == BG_OK)
        r->st = bg_model_create(d, b, -1, -1, &m);
    if (r->st == BG_OK)
        r->st = bg_stage_create(m, 1, &s);
    int32_t tokens[NB * NT], targets[NB * NT];
    for (int i = 0; i < NB * NT; i++) {
        tokens[i] = (i * 7 + 3) % VOC;
        targets[i] = (i * 5 + 1) % CLS;
    }
    const bg_model_desc_params_t *mp = bg_model_desc_params(d);
    bg_shape_t in = bg_model_desc_input_shape(d, NB, NT);
    float *x = NULL, *out;
    bg_shape_t os;
    if (r->st == BG_OK)
        r->st = bg_stage_begin(s, 0, in, &x);
    if (r->st == BG_OK && mp->input == BG_INPUT_FEATURES) {
        float h[NB * NT * FEAT];
        for (int i = 0; i < NB * NT * FEAT; i++)
            h[i] = sinf(0.7f * (float)i);
        b->ops->from_host(b, x, h, sizeof h);
    }
    if (r->st == BG_OK)
        r->st = bg_stage_set_data(s, 0, mp->input == BG_INPUT_TOKENS ? tokens : NULL, targets, 1.0f / (NB * NT));
    if (r->st == BG_OK)
        r->st = bg_stage_forward(s, 0, &out, &os);
    if (r->st == BG_OK)
        b->ops->to_host(b, r->loss, out, sizeof r->loss);
    float *din = NULL;
    if (r->st == BG_OK)
        r->st = bg_stage_backward(s, 0, &din);
    if (r->st == BG_OK) /* sequence parallelism: the layernorms' parts (else nothing) */
        r->st = bg_model_tp_sum_grads(m, -1);
    if (r->st == BG_OK)
        bg_stage_end(s, 0);
    size_t total = 0;
    int64_t shape[BG_PARAM_MAX_DIMS];
    for (int i = 0; r->st == BG_OK && i < bg_model_num_tensors(m); i++)
        total += bg_param_full_shape(bg_model_tensor(m, i), shape);
    r->grads = calloc(total ? total : 1, sizeof(float));
    r->ngrads = total;
    size_t off = 0;
    for (int i = 0; r->st == BG_OK && i < bg_model_num_tensors(m); i++) {
        bg_param_t *p = bg_model_tensor(m, i);
        r->st = bg_param_gather_full(bg_model_desc_tp(d), b, p, p->grad, r->grads + off);
        off += bg_param_full_shape(p, shape);
    }
    bg_stage_destroy(s);
    bg_model_destroy(m);
    bg_model_desc_destroy(d);
    if (b->ops == &logged_ops)
        b->ops = real_ops;
    bg_backend_destroy(b);
}

static void *thread_main(void *arg)
{
    run_one(arg);
    return NULL;
}

/* Run `build` whole and over T threads (nb as fake_comm); compare. With
 * keep: member 0's log and gathered gradients (to free) there. */
typedef struct kept {
    char log[4096];
    float *grads;
    size_t ngrads;
} kept_t;
static void check_equivalent_keep(bg_model_desc_t *(*build)(int), int T, int nb, kept_t *keep)
{
    result_t whole = {0}, parts[MAXT];
    memset(parts, 0, sizeof parts);
    job_t wj = {build, 0, NULL, &whole};
    run_one(&wj);
    assert_int_equal(whole.st, BG_OK);
    shared_t sh = {.T = T};
    pthread_barrier_init(&sh.bar, NULL, (unsigned)T);
    member_t mem[MAXT];
    job_t jobs[MAXT];
    pthread_t th[MAXT];
    for (int r = 0; r < T; r++) {
        mem[r] = (member_t){.sh = &sh, .rank = r};
        mem[r].comm = fake_comm(&mem[r], T, r, nb);
        jobs[r] = (job_t){build, T, &mem[r], &parts[r]};
        assert_int_equal(pthread_create(&th[r], NULL, thread_main, &jobs[r]), 0);
    }
    for (int r = 0; r < T; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&sh.bar);
    for (int r = 0; r < T; r++) {
        assert_int_equal(parts[r].st, BG_OK);
        for (int i = 0; i < NB * NT; i++) /* every member: the whole model's losses */
            assert_float_equal(parts[r].loss[i], whole.loss[i], 1e-5 * fabsf(whole.loss[i]) + 1e-6);
        assert_int_equal(parts[r].ngrads, whole.ngrads);
        double num = 0, den = 0, maxd = 0;
        for (size_t i = 0; i < whole.ngrads; i++) {
            double dd = fabs((double)parts[r].grads[i] - whole.grads[i]);
            num += dd * dd;
            den += (double)whole.grads[i] * whole.grads[i];
            maxd = dd > maxd ? dd : maxd;
        }
        assert_true(den > 0);
        if (sqrt(num / den) > 1e-5)
            fail_msg("tp %d member %d: gradients differ by %g relative (max abs %g)", T, r, sqrt(num / den), maxd);
        for (size_t i = 0; i < whole.ngrads; i++)
            if (parts[r].grads[i] != parts[0].grads[i])
                fail_msg("tp %d: member %d's gathered gradient %zu is %.9g, member 0's %.9g", T, r, i,
                         (double)parts[r].grads[i], (double)parts[0].grads[i]);
    }
    if (keep) {
        memcpy(keep->log, mem[0].log, (size_t)mem[0].nlog);
        keep->log[mem[0].nlog] = 0;
        keep->grads = parts[0].grads;
        keep->ngrads = parts[0].ngrads;
        parts[0].grads = NULL;
    }
    for (int r = 0; r < T; r++)
        free(parts[r].grads);
    free(whole.grads);
}

static void check_equivalent_nb(bg_model_desc_t *(*build)(int), int T, int nb)
{
    check_equivalent_keep(build, T, nb, NULL);
}

static void check_equivalent(bg_model_desc_t *(*build)(int), int T)
{
    check_equivalent_nb(build, T, 0);
    check_equivalent_nb(build, T, 1);
}

/* Whether a GEMM that accumulates (a weight gradient) ran while a sum was
 * started and not yet waited for. */
static int weight_grad_overlaps_sum(const char *log)
{
    int open = 0, seen = 0;
    for (const char *c = log; *c; c++) {
        open += *c == 'S' ? 1 : *c == 'X' ? -1 : 0;
        seen |= *c == 'W' && open > 0;
    }
    assert_int_equal(open, 0); /* every sum waited for */
    return seen;
}

/* The fused backward (BRIGADE_TP_OVERLAP=weight, the default) leaves the
 * column-parallel and head layers' input-gradient sums (reduce-scatters under
 * sequence parallelism) running during their weight gradients; =layer waits
 * inside the layer. Lazy collectives (nothing moves before wait) make the
 * order observable, and a result read before its wait would be wrong: both
 * must equal the whole model, and each other bitwise. */
static void test_overlap_weight_grad(void **s)
{
    (void)s;
    bg_model_desc_t *(*builds[])(int) = {user_mlp, user_gpt, user_gpt_sp};
    for (int b = 0; b < 3; b++) {
        kept_t weight = {0}, layer = {0};
        assert_int_equal(unsetenv("BRIGADE_TP_OVERLAP"), 0);
        check_equivalent_keep(builds[b], 2, 2, &weight);
        assert_int_equal(setenv("BRIGADE_TP_OVERLAP", "layer", 1), 0);
        check_equivalent_keep(builds[b], 2, 2, &layer);
        assert_int_equal(unsetenv("BRIGADE_TP_OVERLAP"), 0);
        if (!strchr(weight.log, 'S') || !strchr(weight.log, 'W'))
            fail_msg("model %d: no non-blocking sum or weight gradient logged: %s", b, weight.log);
        if (!weight_grad_overlaps_sum(weight.log))
            fail_msg("model %d, weight: no weight gradient ran while a sum was in flight: %s", b, weight.log);
        if (weight_grad_overlaps_sum(layer.log))
            fail_msg("model %d, layer: a weight gradient ran while a sum was in flight: %s", b, layer.log);
        assert_int_equal(weight.ngrads, layer.ngrads);
        assert_memory_equal(weight.grads, layer.grads, weight.ngrads * sizeof(float));
        free(weight.grads);
        free(layer.grads);
    }
}

static void test_overlap_bad_setting(void **s)
{
    (void)s;
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = 1;
    bg_backend_t *b;
    bg_model_desc_t *d = user_mlp(0);
    bg_model_t *m = NULL;
    bg_stage_t *st = NULL;
    assert_int_equal(bg_backend_create("cpu", &bp, &b), BG_OK);
    assert_int_equal(bg_model_create(d, b, -1, -1, &m), BG_OK);
    assert_int_equal(setenv("BRIGADE_TP_OVERLAP", "always", 1), 0);
    assert_int_equal(bg_stage_create(m, 1, &st), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "BRIGADE_TP_OVERLAP=\"always\": expected weight, layer or microbatch"));
    assert_int_equal(unsetenv("BRIGADE_TP_OVERLAP"), 0);
    bg_model_destroy(m);
    bg_model_desc_destroy(d);
    bg_backend_destroy(b);
}

static void test_user_mlp_tp2(void **s) { (void)s; check_equivalent(user_mlp, 2); }
static void test_user_mlp_tp4(void **s) { (void)s; check_equivalent(user_mlp, 4); }
static void test_user_gpt_tp2(void **s) { (void)s; check_equivalent(user_gpt, 2); }
static void test_user_gpt_tp4(void **s) { (void)s; check_equivalent(user_gpt, 4); }
static void test_user_gpt_sp2(void **s) { (void)s; check_equivalent(user_gpt_sp, 2); }
static void test_user_gpt_sp4(void **s) { (void)s; check_equivalent(user_gpt_sp, 4); }

/* ------------------------------------------------ sequence-parallel regions */

/* An activation, a block (attention or MLP), a head: the block alone is
 * the region tested (layers [1, 1]: a stage that is neither the first nor
 * the last takes an output gradient and gives an input gradient). tp > 0: the tensor-parallel block switched to sequence
 * parallelism; 0: the plain block. */
static bg_model_desc_t *region_desc(int tp, int attn)
{
    bg_layer_t *l[3];
    assert_int_equal(bg_layer_activation("act", BG_ACT_GELU, &l[0]), BG_OK);
    if (tp) {
        assert_int_equal(attn ? bg_layer_tp_attention_block("blk", C, HEADS, 0.3f, 0.2f, tp, &l[1])
                              : bg_layer_tp_mlp_block("blk", C, 0.3f, 0.2f, tp, &l[1]), BG_OK);
        assert_int_equal(bg_layer_vocab_head("head", C, CLS, 0, 0.3f, tp, &l[2]), BG_OK);
        for (int i = 1; i < 3; i++)
            assert_int_equal(bg_layer_sequence_parallel(l[i]), BG_OK);
    } else {
        assert_int_equal(attn ? bg_layer_attention_block("blk", C, HEADS, 0.3f, 0.2f, &l[1])
                              : bg_layer_mlp_block("blk", C, 0.3f, 0.2f, &l[1]), BG_OK);
        assert_int_equal(bg_layer_head("head", C, CLS, 0, 0.3f, &l[2]), BG_OK);
    }
    return assemble("region", BG_INPUT_FEATURES, C, l, 3);
}

typedef struct region_job {
    int tp, attn;
    member_t *me;              /* NULL: whole */
    float out[NB * NT * C];    /* at the positions this member holds (all: whole) */
    float din[NB * NT * C];
    float *grads;              /* full, gathered, after the group's sum */
    size_t ngrads;
    bg_status_t st;
} region_job_t;

static float region_x(int i) { return sinf(0.37f * (float)i + 0.1f); }
static float region_dy(int i) { return 0.05f * cosf(0.23f * (float)i); }

/* F, B and W (apart) of the block on this member's positions (n, NT/T, C) of
 * one activation and output gradient. */
static void *region_run(void *arg)
{
    region_job_t *j = arg;
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = 1;
    bg_backend_t *b;
    bg_model_desc_t *d = region_desc(j->tp, j->attn);
    if ((j->st = bg_backend_create("cpu", &bp, &b)) != BG_OK)
        return NULL;
    int T = j->me ? j->tp : 1, r = j->me ? j->me->rank : 0, tl = NT / T;
    if (j->me)
        j->st = bg_model_desc_set_tp(d, &j->me->comm);
    bg_model_t *m = NULL;
    bg_stage_t *s = NULL;
    if (j->st == BG_OK)
        j->st = bg_model_create(d, b, 1, 1, &m);
    if (j->st == BG_OK)
        j->st = bg_stage_create(m, 1, &s);
    float x[NB * NT * C], h[NB * NT * C], *in = NULL, *out = NULL, *dout = NULL, *din = NULL;
    size_t rows = (size_t)tl * C;
    for (int q = 0; q < NB; q++) /* this member's positions [r tl, (r+1) tl) of sequence q */
        for (size_t k = 0; k < rows; k++)
            x[q * rows + k] = region_x((int)((size_t)q * NT * C + (size_t)r * rows + k));
    bg_shape_t os;
    if (j->st == BG_OK)
        j->st = bg_stage_begin(s, 0, (bg_shape_t){NB, tl, C}, &in);
    if (j->st == BG_OK) {
        b->ops->from_host(b, in, x, (size_t)NB * rows * sizeof(float));
        j->st = bg_stage_forward(s, 0, &out, &os);
    }
    if (j->st == BG_OK && (os.n != NB || os.t != tl || os.c != C))
        j->st = bg_error(BG_ERR_INVALID, "region output (%d,%d,%d)", os.n, os.t, os.c);
    if (j->st == BG_OK)
        j->st = bg_stage_grad_buffer(s, 0, &dout);
    if (j->st == BG_OK) {
        b->ops->to_host(b, h, out, (size_t)NB * rows * sizeof(float));
        for (int q = 0; q < NB; q++)
            for (size_t k = 0; k < rows; k++) {
                size_t g = (size_t)q * NT * C + (size_t)r * rows + k;
                j->out[g] = h[q * rows + k];
                x[q * rows + k] = region_dy((int)g);
            }
        b->ops->from_host(b, dout, x, (size_t)NB * rows * sizeof(float));
        j->st = bg_stage_backward_input(s, 0, &din);
    }
    if (j->st == BG_OK && !din)
        j->st = bg_error(BG_ERR_INVALID, "no input gradient");
    if (j->st == BG_OK) {
        b->ops->to_host(b, h, din, (size_t)NB * rows * sizeof(float));
        for (int q = 0; q < NB; q++)
            for (size_t k = 0; k < rows; k++)
                j->din[(size_t)q * NT * C + (size_t)r * rows + k] = h[q * rows + k];
    }
    if (j->st == BG_OK)
        j->st = bg_stage_backward_weight(s, 0);
    if (j->st == BG_OK)
        j->st = bg_model_tp_sum_grads(m, -1);
    int64_t shape[BG_PARAM_MAX_DIMS];
    size_t total = 0;
    for (int i = 0; j->st == BG_OK && i < bg_model_num_tensors(m); i++)
        total += bg_param_full_shape(bg_model_tensor(m, i), shape);
    j->grads = calloc(total ? total : 1, sizeof(float));
    j->ngrads = total;
    for (size_t i = 0, off = 0; j->st == BG_OK && i < (size_t)bg_model_num_tensors(m); i++) {
        bg_param_t *p = bg_model_tensor(m, (int)i);
        j->st = bg_param_gather_full(bg_model_desc_tp(d), b, p, p->grad, j->grads + off);
        off += bg_param_full_shape(p, shape);
    }
    bg_stage_destroy(s);
    bg_model_destroy(m);
    bg_model_desc_destroy(d);
    bg_backend_destroy(b);
    return NULL;
}

/* ||a - b|| / ||b|| */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : INFINITY;
}

static void check_region(int attn, int T, int nb)
{
    static region_job_t whole, parts[MAXT]; /* large: off the stack */
    memset(&whole, 0, sizeof whole);
    memset(parts, 0, sizeof parts);
    whole.attn = attn;
    region_run(&whole);
    assert_int_equal(whole.st, BG_OK);
    shared_t sh = {.T = T};
    pthread_barrier_init(&sh.bar, NULL, (unsigned)T);
    member_t mem[MAXT];
    pthread_t th[MAXT];
    for (int r = 0; r < T; r++) {
        mem[r] = (member_t){.sh = &sh, .rank = r};
        mem[r].comm = fake_comm(&mem[r], T, r, nb);
        parts[r].tp = T;
        parts[r].attn = attn;
        parts[r].me = &mem[r];
        assert_int_equal(pthread_create(&th[r], NULL, region_run, &parts[r]), 0);
    }
    for (int r = 0; r < T; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&sh.bar);
    float out[NB * NT * C] = {0}, din[NB * NT * C] = {0};
    for (int r = 0; r < T; r++) { /* each member's positions into one activation */
        assert_int_equal(parts[r].st, BG_OK);
        for (int i = 0; i < NB * NT * C; i++) {
            out[i] += parts[r].out[i];
            din[i] += parts[r].din[i];
        }
    }
    const char *what = attn ? "attention" : "mlp";
    double e_out = rel_l2(out, whole.out, NB * NT * C), e_din = rel_l2(din, whole.din, NB * NT * C);
    if (e_out > 1e-5 || e_din > 1e-5)
        fail_msg("sp %s block, tp %d: output differs by %g, input gradient by %g (relative L2)", what, T, e_out, e_din);
    for (int r = 0; r < T; r++) {
        assert_int_equal(parts[r].ngrads, whole.ngrads);
        double e = rel_l2(parts[r].grads, whole.grads, whole.ngrads);
        if (e > 1e-5)
            fail_msg("sp %s block, tp %d member %d: weight gradients differ by %g (relative L2)", what, T, r, e);
        for (size_t i = 0; i < whole.ngrads; i++) /* replicated tensors stay replicated */
            if (parts[r].grads[i] != parts[0].grads[i])
                fail_msg("sp %s block, tp %d: member %d's gradient %zu is %.9g, member 0's %.9g", what, T, r, i,
                         (double)parts[r].grads[i], (double)parts[0].grads[i]);
    }
    for (int r = 0; r < T; r++)
        free(parts[r].grads);
    free(whole.grads);
}

static void test_sp_regions(void **s)
{
    (void)s;
    for (int attn = 0; attn < 2; attn++)
        for (int T = 2; T <= 4; T += 2)
            for (int nb = 0; nb < 2; nb++) /* with the group's reduce-scatter, and without (its fallback) */
                check_region(attn, T, nb);
}

/* A sequence the group cannot split, a plain loss layer: one message naming the sizes or the layer. */
static void test_sp_errors(void **s)
{
    (void)s;
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    c.tp = 4;
    c.seq_len = 18;
    c.sequence_parallel = 1;
    bg_model_desc_t *d;
    assert_int_equal(bg_model_build(&c, &d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "the sequence length 18 is not divisible by tp 4"));
    c.kind = BG_MODEL_MLP;
    c.seq_len = 16;
    assert_int_equal(bg_model_build(&c, &d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "sequence parallelism needs a GPT"));
    bg_layer_t *l;
    assert_int_equal(bg_layer_head("head", 4, 8, 0, 0.1f, &l), BG_OK);
    assert_int_equal(bg_layer_sequence_parallel(l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "layer head (head): sequence parallelism needs the vocabulary-parallel head"));
    bg_layer_destroy(l);
    /* a row-parallel layer fed a sequence its degree does not divide */
    assert_int_equal(bg_layer_row_linear("proj", 8, 4, 1, 0.1f, 4, &l), BG_OK);
    assert_int_equal(bg_layer_sequence_parallel(l), BG_OK);
    bg_shape_t o;
    assert_int_equal(bg_layer_out_shape(l, (bg_shape_t){2, 6, 2}, &o), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "layer proj (row_linear): sequence length 6 is not divisible by the "
                                            "tensor-parallel degree 4"));
    assert_int_equal(bg_layer_out_shape(l, (bg_shape_t){2, 8, 2}, &o), BG_OK);
    assert_true(o.n == 2 && o.t == 2 && o.c == 4);
    bg_layer_destroy(l);
}

/* The q, k, v blocks: member r holds rows [r*c/T, (r+1)*c/T) of each. */
static void test_shard_layout(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(bg_layer_column_linear("qkv", 2, 12, 3, 1, 0.1f, 2, &l), BG_OK);
    bg_param_t *w = &l->params[0];
    int64_t shape[BG_PARAM_MAX_DIMS];
    assert_int_equal(bg_param_full_shape(w, shape), 24);
    assert_int_equal(shape[0], 12);
    assert_int_equal(shape[1], 2);
    assert_int_equal(w->shape[0], 6);
    float full[24], shard[12], back[24], both[24];
    for (int i = 0; i < 24; i++)
        full[i] = (float)i;
    bg_param_shard_from_full(w, 1, full, shard);
    /* member 1: rows 2, 3 (q), 6, 7 (k), 10, 11 (v) */
    const int rows[6] = {2, 3, 6, 7, 10, 11};
    for (int i = 0; i < 6; i++) {
        assert_float_equal(shard[2 * i], (float)(2 * rows[i]), 0);
        assert_float_equal(shard[2 * i + 1], (float)(2 * rows[i] + 1), 0);
    }
    bg_param_shard_from_full(w, 0, full, both);
    bg_param_shard_from_full(w, 1, full, both + 12);
    bg_param_full_from_shards(w, both, back);
    assert_memory_equal(back, full, sizeof full);
    bg_layer_destroy(l);
}

/* A description's JSON names full tensors: a tp build matches the plain one. */
static void test_json_layout_independent(void **s)
{
    (void)s;
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    c.layers = 2;
    c.d_model = 16;
    c.heads = 4;
    c.seq_len = 8;
    bg_model_desc_t *d1, *d4;
    assert_int_equal(bg_model_build(&c, &d1), BG_OK);
    c.tp = 4;
    assert_int_equal(bg_model_build(&c, &d4), BG_OK);
    assert_int_equal(bg_model_desc_tp_degree(d1), 1);
    assert_int_equal(bg_model_desc_tp_degree(d4), 4);
    char *j1, *j4;
    assert_int_equal(bg_model_desc_to_json(d1, &j1), BG_OK);
    assert_int_equal(bg_model_desc_to_json(d4, &j4), BG_OK);
    assert_int_equal(bg_model_desc_match_json(d4, j1, "tp1"), BG_OK);
    assert_int_equal(bg_model_desc_match_json(d1, j4, "tp4"), BG_OK);
    assert_non_null(strstr(j4, "\"blocks.0.attn.qkv.weight\",\"shape\":[48,16]"));
    /* a file rebuilds the plain model */
    bg_model_desc_t *r;
    assert_int_equal(bg_model_desc_from_json(j4, &r), BG_OK);
    assert_int_equal(bg_model_desc_tp_degree(r), 1);
    bg_model_desc_destroy(r);
    free(j1);
    free(j4);
    /* a split model binds only in a group of its degree */
    bg_model_t *m;
    assert_int_not_equal(bg_model_create(d4, be, -1, -1, &m), BG_OK);
    assert_non_null(strstr(bg_last_error(), "tensor-parallel group"));
    bg_tp_comm_t two = fake_comm(NULL, 2, 0, 0);
    assert_int_equal(bg_model_desc_set_tp(d4, &two), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "degree 4"));
    bg_model_desc_destroy(d1);
    bg_model_desc_destroy(d4);
}

static void test_bad_sizes(void **s)
{
    (void)s;
    bg_layer_t *l;
    assert_int_equal(bg_layer_column_linear("fc", 4, 10, 1, 1, 0.1f, 4, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "column_linear fc: output features 10 is not divisible by the "
                                            "tensor-parallel degree 4"));
    assert_int_equal(bg_layer_row_linear("proj", 6, 4, 1, 0.1f, 4, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "row_linear proj: input features 6"));
    assert_int_equal(bg_layer_vocab_embedding("embed", 30, 8, 4, 0.1f, 4, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "vocabulary 30"));
    assert_int_equal(bg_layer_tp_attention_block("attn", 12, 6, 0.1f, 0.1f, 4, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "heads 6"));
    bg_model_config_t c = BG_MODEL_CONFIG_INIT;
    c.tp = 3;
    bg_model_desc_t *d;
    assert_int_equal(bg_model_build(&c, &d), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "layer blocks.0.attn has 4 heads, which tp 3 does not divide"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_mlp_tp2),
        cmocka_unit_test(test_user_mlp_tp4),
        cmocka_unit_test(test_user_gpt_tp2),
        cmocka_unit_test(test_user_gpt_tp4),
        cmocka_unit_test(test_user_gpt_sp2),
        cmocka_unit_test(test_user_gpt_sp4),
        cmocka_unit_test(test_overlap_weight_grad),
        cmocka_unit_test(test_overlap_bad_setting),
        cmocka_unit_test(test_sp_regions),
        cmocka_unit_test(test_sp_errors),
        cmocka_unit_test(test_shard_layout),
        cmocka_unit_test(test_json_layout_independent),
        cmocka_unit_test(test_bad_sizes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
