/* tests/models/test_moe.c: the mixture-of-experts layer (bg_layer_moe):
 * input, router and expert gradients against central finite differences of
 * an objective that includes the load-balancing loss; the loss against its
 * closed form on a hand-made routing; the forward and the dropped count
 * against a double-precision brute force; bitwise equal results across
 * runs and thread counts; built for expert parallelism (ep 2 and 4, threads
 * playing the group with an alltoallv of shared memory), every member's
 * outputs, input and router gradients, routing and its experts' gradients
 * bitwise those of one layer holding every expert run on each member's
 * tokens in turn; the all-to-all's cost in closed form. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "brigade/brigade.h"
#include "bg_test_backend.h"

typedef struct {
    bg_layer_t *l;
    bg_backend_t *be;
    bg_shape_t in;
    size_t N, nx;
    float *x, *y, *R, *din;
    void *stash, *wstash, *scratch;
    float loss_scale;
} rig_t;

static float *falloc(bg_backend_t *b, size_t n) { return bg_backend_alloc(b, n * sizeof(float) + 64, "test"); }

static bg_layer_t *mk(int c, int E, int k, int h, bg_moe_gate_t gate, float cf, float aux)
{
    bg_moe_t m = {.c = c, .experts = E, .top_k = k, .ffn = h, .gate = gate, .capacity_factor = cf,
                  .aux_coef = aux, .init_std = 0.5f, .proj_std = 0.5f};
    bg_layer_t *l = NULL;
    assert_int_equal(bg_layer_moe("moe", &m, &l), BG_OK);
    return l;
}

static void rig_init(rig_t *r, bg_backend_t *b, bg_layer_t *l, bg_shape_t in, uint64_t seed)
{
    bg_rng_t rng;
    bg_rng_seed(&rng, seed);
    memset(r, 0, sizeof(*r));
    r->l = l, r->be = b, r->in = in;
    r->N = (size_t)in.n * in.t;
    r->nx = bg_shape_numel(in);
    r->x = falloc(b, r->nx), r->y = falloc(b, r->nx), r->R = falloc(b, r->nx), r->din = falloc(b, r->nx);
    for (size_t i = 0; i < r->nx; i++) {
        r->x[i] = (float)bg_rng_normal(&rng);
        r->R[i] = (float)bg_rng_normal(&rng);
    }
    r->stash = bg_backend_alloc(b, bg_layer_stash_bytes(l, in) + 64, "stash");
    r->wstash = bg_backend_alloc(b, bg_layer_wstash_bytes(l, in) + 64, "wstash");
    r->scratch = bg_backend_alloc(b, bg_layer_scratch_bytes(l, in) + 64, "scratch");
    for (int i = 0; i < l->nparams; i++) {
        bg_param_t *p = &l->params[i];
        p->data = falloc(b, p->numel);
        p->grad = falloc(b, p->numel);
        for (size_t j = 0; j < p->numel; j++) {
            p->data[j] = (float)(p->init_value * bg_rng_normal(&rng));
            p->grad[j] = 0;
        }
    }
    r->loss_scale = 1.0f / (float)(3 * r->N); /* as if the step had other microbatches */
}

static void rig_free(rig_t *r)
{
    for (int i = 0; i < r->l->nparams; i++) {
        bg_backend_free(r->be, r->l->params[i].data);
        bg_backend_free(r->be, r->l->params[i].grad);
    }
    bg_backend_free(r->be, r->x), bg_backend_free(r->be, r->y), bg_backend_free(r->be, r->R);
    bg_backend_free(r->be, r->din), bg_backend_free(r->be, r->stash), bg_backend_free(r->be, r->wstash);
    bg_backend_free(r->be, r->scratch);
    bg_layer_destroy(r->l);
}

static bg_layer_ctx_t rig_ctx(rig_t *r)
{
    bg_layer_ctx_t c = {0};
    c.be = r->be, c.in = r->in, c.loss_scale = r->loss_scale;
    c.stash = r->stash, c.wstash = r->wstash, c.scratch = r->scratch;
    return c;
}

/* sum(y R) + coef * loss_scale * N * aux: what the layer's backward differentiates */
static double objective(rig_t *r, float coef)
{
    bg_layer_ctx_t c = rig_ctx(r);
    assert_int_equal(r->l->ops->forward(r->l, &c, r->x, r->y), BG_OK);
    double j = 0;
    for (size_t i = 0; i < r->nx; i++)
        j += (double)r->y[i] * r->R[i];
    bg_moe_stats_t st;
    assert_int_equal(bg_layer_moe_stats(r->l, &st), BG_OK);
    return j + (double)coef * r->loss_scale * (double)r->N * st.aux_loss;
}

static void backward(rig_t *r)
{
    for (int i = 0; i < r->l->nparams; i++)
        memset(r->l->params[i].grad, 0, r->l->params[i].numel * sizeof(float));
    bg_layer_ctx_t c = rig_ctx(r);
    assert_int_equal(r->l->ops->forward(r->l, &c, r->x, r->y), BG_OK);
    assert_int_equal(r->l->ops->backward_input(r->l, &c, r->x, r->y, r->R, r->din), BG_OK);
    assert_int_equal(r->l->ops->backward_weight(r->l, &c, r->x, r->y, r->R), BG_OK);
}

static double fd_error(rig_t *r, float coef, float *v, const float *g, size_t n, double eps, const char *what)
{
    double maxerr = 0, maxg = 1e-3;
    for (size_t i = 0; i < n; i++)
        maxg = fmax(maxg, fabs(g[i]));
    for (size_t i = 0; i < n; i++) {
        float save = v[i];
        v[i] = (float)(save + eps);
        double jp = objective(r, coef);
        v[i] = (float)(save - eps);
        double jm = objective(r, coef);
        v[i] = save;
        double err = fabs((jp - jm) / (2 * eps) - g[i]) / maxg;
        maxerr = fmax(maxerr, err);
    }
    if (getenv("BG_TEST_VERBOSE") || maxerr > 2e-3)
        print_error("%s: finite-difference error %.3g (max |grad| %.3g)\n", what, maxerr, maxg);
    return maxerr;
}

static void check_fd(bg_moe_gate_t gate, int k, float cf, float coef, uint64_t seed)
{
    bg_shape_t in = {2, 5, 6};
    rig_t r;
    rig_init(&r, be, mk(in.c, 4, k, 5, gate, cf, coef), in, seed);
    backward(&r);
    float *g = malloc(r.nx * sizeof(float));
    memcpy(g, r.din, r.nx * sizeof(float));
    assert_true(fd_error(&r, coef, r.x, g, r.nx, 1e-3, "input") < 2e-3);
    free(g);
    for (int i = 0; i < r.l->nparams; i++) {
        bg_param_t *p = &r.l->params[i];
        g = malloc(p->numel * sizeof(float));
        memcpy(g, p->grad, p->numel * sizeof(float));
        assert_true(fd_error(&r, coef, p->data, g, p->numel, 1e-3, p->name) < 2e-3);
        free(g);
    }
    rig_free(&r);
}

static void test_gradients(void **s)
{
    (void)s;
    check_fd(BG_MOE_SOFTMAX, 2, 0.0f, 0.5f, 1);  /* dropless */
    check_fd(BG_MOE_SOFTMAX, 2, 0.75f, 0.5f, 2); /* with dropped choices */
    check_fd(BG_MOE_SOFTMAX, 1, 0.0f, 2.0f, 3);
    check_fd(BG_MOE_SIGMOID, 2, 1.0f, 0.5f, 4);
}

/* Token n is one-hot on expert e_n and the router is 10 I: the routing is known, so is every probability. */
static void test_aux_closed_form(void **s)
{
    (void)s;
    int E = 4, N = 8, route[8] = {0, 0, 0, 1, 1, 2, 0, 1}, cnt[4] = {4, 3, 1, 0};
    bg_shape_t in = {1, N, E};
    for (int pass = 0; pass < 2; pass++) {
        float cf = pass ? 1.0f : 0.0f; /* capacity ceil(8 / 4) = 2: drops 2 of expert 0's, 1 of expert 1's */
        rig_t r;
        rig_init(&r, be, mk(E, E, 1, 3, BG_MOE_SOFTMAX, cf, 1.0f), in, 5);
        for (int i = 0; i < E * E; i++)
            r.l->params[0].data[i] = i % (E + 1) == 0 ? 10.0f : 0.0f;
        for (int n = 0; n < N; n++)
            for (int e = 0; e < E; e++)
                r.x[n * E + e] = e == route[n] ? 1.0f : 0.0f;
        objective(&r, 0);
        bg_moe_stats_t st;
        assert_int_equal(bg_layer_moe_stats(r.l, &st), BG_OK);
        double a = exp(10.0) / (exp(10.0) + 3), b = 1.0 / (exp(10.0) + 3), want = 0;
        for (int e = 0; e < E; e++)
            want += E * ((double)cnt[e] / N) * ((cnt[e] * a + (N - cnt[e]) * b) / N);
        assert_true(fabs(st.aux_loss - want) < 1e-6);
        assert_int_equal(st.dropped, pass ? 3 : 0);
        rig_free(&r);
    }
}

/* The layer against a double-precision brute force: routing from host logits, capacity as "each expert's
 * first cap tokens", the dropped count as the sum of each expert's overflow. */
static void check_brute(int k, float cf, bg_moe_gate_t gate, uint64_t seed)
{
    int E = 8, c = 6, h = 4;
    bg_shape_t in = {4, 16, c};
    rig_t r;
    rig_init(&r, be, mk(c, E, k, h, gate, cf, 0.0f), in, seed);
    objective(&r, 0);
    int N = (int)r.N;
    const float *wr = r.l->params[0].data, *wu = r.l->params[1].data, *wd = r.l->params[2].data;
    int cap = cf > 0 ? (int)ceil(cf * N * k / E) : N, used[8] = {0}, routed[8] = {0};
    double *ref = calloc((size_t)N * c, sizeof(double)), maxerr = 0;
    for (int n = 0; n < N; n++) {
        double lg[8], z = 0;
        int chosen[8] = {0};
        for (int e = 0; e < E; e++) {
            lg[e] = 0;
            for (int i = 0; i < c; i++)
                lg[e] += (double)r.x[n * c + i] * wr[e * c + i];
        }
        int sel[8];
        for (int j = 0; j < k; j++) { /* repeated arg-max */
            sel[j] = -1;
            for (int e = 0; e < E; e++)
                if (!chosen[e] && (sel[j] < 0 || lg[e] > lg[sel[j]]))
                    sel[j] = e;
            chosen[sel[j]] = 1;
            z += exp(lg[sel[j]]);
        }
        for (int j = 0; j < k; j++) {
            int e = sel[j];
            routed[e]++;
            if (used[e]++ >= cap)
                continue;
            double g = gate == BG_MOE_SIGMOID ? 1 / (1 + exp(-lg[e])) : exp(lg[e]) / z, hid[4];
            for (int q = 0; q < h; q++) {
                double a = 0, bb = 0;
                for (int i = 0; i < c; i++) {
                    a += (double)wu[((size_t)e * 2 * h + q) * c + i] * r.x[n * c + i];
                    bb += (double)wu[((size_t)e * 2 * h + h + q) * c + i] * r.x[n * c + i];
                }
                hid[q] = a / (1 + exp(-a)) * bb;
            }
            for (int i = 0; i < c; i++) {
                double y = 0;
                for (int q = 0; q < h; q++)
                    y += (double)wd[((size_t)e * c + i) * h + q] * hid[q];
                ref[n * c + i] += g * y;
            }
        }
    }
    int64_t dropped = 0;
    for (int e = 0; e < E; e++)
        dropped += routed[e] > cap ? routed[e] - cap : 0;
    for (size_t i = 0; i < r.nx; i++)
        maxerr = fmax(maxerr, fabs(ref[i] - r.y[i]));
    bg_moe_stats_t st;
    assert_int_equal(bg_layer_moe_stats(r.l, &st), BG_OK);
    if (getenv("BG_TEST_VERBOSE"))
        print_message("k %d cf %.2f: dropped %lld (brute force %lld), max error %.3g\n", k, (double)cf,
                      (long long)st.dropped, (long long)dropped, maxerr);
    assert_int_equal(st.dropped, dropped);
    assert_true(cf > 0 || dropped == 0);
    assert_true(maxerr < 1e-4);
    free(ref);
    rig_free(&r);
}

static void test_brute_force(void **s)
{
    (void)s;
    check_brute(2, 0.0f, BG_MOE_SOFTMAX, 11);
    check_brute(2, 1.0f, BG_MOE_SOFTMAX, 12);
    check_brute(1, 0.5f, BG_MOE_SOFTMAX, 13);
    check_brute(3, 1.25f, BG_MOE_SIGMOID, 14);
}

/* Forward and backward twice on one thread and once on two: bitwise the same outputs and gradients. */
static void test_deterministic(void **s)
{
    (void)s;
    bg_backend_t *be2 = NULL;
    bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
    bp.num_threads = 2;
    assert_int_equal(bg_backend_create("cpu", &bp, &be2), BG_OK);
    bg_shape_t in = {4, 32, 16};
    rig_t r[3];
    for (int i = 0; i < 3; i++) {
        rig_init(&r[i], i == 2 ? be2 : be, mk(16, 8, 2, 24, BG_MOE_SOFTMAX, 1.0f, 0.1f), in, 21);
        backward(&r[i]);
    }
    for (int i = 1; i < 3; i++) {
        assert_memory_equal(r[0].y, r[i].y, r[0].nx * sizeof(float));
        assert_memory_equal(r[0].din, r[i].din, r[0].nx * sizeof(float));
        for (int p = 0; p < 3; p++)
            assert_memory_equal(r[0].l->params[p].grad, r[i].l->params[p].grad,
                                r[0].l->params[p].numel * sizeof(float));
    }
    bg_moe_stats_t st;
    objective(&r[0], 0);
    assert_int_equal(bg_layer_moe_stats(r[0].l, &st), BG_OK);
    assert_true(st.dropped > 0);
    assert_int_equal(st.dropped_total, 2 * st.dropped); /* two forwards */
    for (int i = 0; i < 3; i++)
        rig_free(&r[i]);
    bg_backend_destroy(be2);
}

static void test_bad_args(void **s)
{
    (void)s;
    bg_moe_t m = {.c = 8, .experts = 4, .top_k = 5, .ffn = 8};
    bg_layer_t *l = NULL;
    assert_int_equal(bg_layer_moe("m", &m, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "top-k 5"));
    m.top_k = 2, m.capacity_factor = -1;
    assert_int_equal(bg_layer_moe("m", &m, &l), BG_ERR_INVALID);
    bg_moe_stats_t st;
    assert_int_equal(bg_layer_linear("lin", 2, 2, 0, 0.1f, &l), BG_OK);
    assert_int_equal(bg_layer_moe_stats(l, &st), BG_ERR_INVALID);
    bg_layer_destroy(l);
}

/* ------------------------------------------------ expert parallelism: threads playing the group */

#define EP_MAX 4

typedef struct {
    int P;
    pthread_barrier_t bar;
    const float *send[EP_MAX];
    const size_t *sc[EP_MAX], *sd[EP_MAX];
} ep_shared_t;

typedef struct {
    ep_shared_t *sh;
    int rank;
    bg_tp_comm_t comm;
    rig_t r;
    bg_backend_t *be;
    bg_status_t st;
} ep_member_t;

/* every member posts its buffer and counts; each copies its blocks; nobody reuses a buffer before all have read */
static bg_status_t fake_alltoallv(void *arg, const float *send, const size_t *sc, const size_t *sd, float *recv,
                                  const size_t *rc, const size_t *rd)
{
    ep_member_t *m = arg;
    ep_shared_t *sh = m->sh;
    sh->send[m->rank] = send, sh->sc[m->rank] = sc, sh->sd[m->rank] = sd;
    pthread_barrier_wait(&sh->bar);
    bg_status_t st = BG_OK;
    for (int j = 0; j < sh->P; j++) {
        if (sh->sc[j][m->rank] != rc[j])
            st = BG_ERR_INVALID;
        else if (rc[j])
            memcpy(recv + rd[j], sh->send[j] + sh->sd[j][m->rank], rc[j] * sizeof(float));
    }
    pthread_barrier_wait(&sh->bar);
    return st;
}

static void *ep_member_run(void *arg)
{
    ep_member_t *m = arg;
    rig_t *r = &m->r;
    bg_layer_ctx_t c = rig_ctx(r);
    c.ep = &m->comm;
    m->st = r->l->ops->forward(r->l, &c, r->x, r->y);
    if (m->st == BG_OK)
        m->st = r->l->ops->backward_input(r->l, &c, r->x, r->y, r->R, r->din);
    if (m->st == BG_OK)
        m->st = r->l->ops->backward_weight(r->l, &c, r->x, r->y, r->R);
    return NULL;
}

static void check_ep(int P, float cf, uint64_t seed)
{
    const int c = 8, E = 8, k = 2, h = 12;
    bg_shape_t in = {2, 6, c};
    rig_t w; /* one layer holding every expert */
    rig_init(&w, be, mk(c, E, k, h, BG_MOE_SOFTMAX, cf, 0.1f), in, seed);
    ep_shared_t sh = {.P = P};
    pthread_barrier_init(&sh.bar, NULL, (unsigned)P);
    ep_member_t m[EP_MAX];
    for (int s = 0; s < P; s++) {
        bg_moe_t mo = {.c = c, .experts = E, .top_k = k, .ffn = h, .gate = BG_MOE_SOFTMAX, .capacity_factor = cf,
                       .aux_coef = 0.1f, .init_std = 0.5f, .proj_std = 0.5f, .ep = P};
        bg_layer_t *l = NULL;
        assert_int_equal(bg_layer_moe("moe", &mo, &l), BG_OK);
        assert_int_equal(l->params[1].shape[0], E / P); /* E/P experts, slices of the whole tensors */
        assert_true(l->params[1].split_ep && l->params[2].split_ep && !l->params[0].split_ep);
        bg_backend_params_t bp = BG_BACKEND_PARAMS_INIT;
        bp.num_threads = 1;
        assert_int_equal(bg_backend_create("cpu", &bp, &m[s].be), BG_OK);
        m[s].sh = &sh, m[s].rank = s;
        m[s].comm = (bg_tp_comm_t){.size = P, .rank = s, .arg = &m[s], .alltoallv = fake_alltoallv};
        rig_init(&m[s].r, m[s].be, l, in, seed + 1 + (uint64_t)s); /* its own tokens */
        for (int i = 0; i < 3; i++) {
            bg_param_t *p = &l->params[i];
            memcpy(p->data, w.l->params[i].data + (i ? (size_t)s * p->numel : 0), p->numel * sizeof(float));
        }
    }
    pthread_t t[EP_MAX];
    for (int s = 0; s < P; s++)
        assert_int_equal(pthread_create(&t[s], NULL, ep_member_run, &m[s]), 0);
    for (int s = 0; s < P; s++)
        pthread_join(t[s], NULL);
    /* the reference: member s's tokens through the whole layer, in member order (the experts' gradients add up) */
    int64_t dropped = 0;
    for (int s = 0; s < P; s++) {
        assert_int_equal(m[s].st, BG_OK);
        rig_t *r = &m[s].r;
        memcpy(w.x, r->x, w.nx * sizeof(float));
        memcpy(w.R, r->R, w.nx * sizeof(float));
        memset(w.l->params[0].grad, 0, w.l->params[0].numel * sizeof(float));
        bg_layer_ctx_t cw = rig_ctx(&w);
        assert_int_equal(w.l->ops->forward(w.l, &cw, w.x, w.y), BG_OK);
        assert_int_equal(w.l->ops->backward_input(w.l, &cw, w.x, w.y, w.R, w.din), BG_OK);
        assert_int_equal(w.l->ops->backward_weight(w.l, &cw, w.x, w.y, w.R), BG_OK);
        assert_memory_equal(w.y, r->y, w.nx * sizeof(float));
        assert_memory_equal(w.din, r->din, w.nx * sizeof(float));
        assert_memory_equal(w.l->params[0].grad, r->l->params[0].grad, w.l->params[0].numel * sizeof(float));
        bg_moe_stats_t a, b;
        assert_int_equal(bg_layer_moe_stats(w.l, &a), BG_OK);
        assert_int_equal(bg_layer_moe_stats(r->l, &b), BG_OK);
        assert_int_equal(a.dropped, b.dropped);
        assert_memory_equal(&a.aux_loss, &b.aux_loss, sizeof(double));
        dropped += b.dropped;
    }
    if (cf > 0)
        assert_true(dropped > 0); /* the capacity was exercised */
    for (int s = 0; s < P; s++)
        for (int i = 1; i < 3; i++) {
            const bg_param_t *p = &m[s].r.l->params[i];
            assert_memory_equal(w.l->params[i].grad + (size_t)s * p->numel, p->grad, p->numel * sizeof(float));
        }
    for (int s = 0; s < P; s++) {
        rig_free(&m[s].r);
        bg_backend_destroy(m[s].be);
    }
    rig_free(&w);
    pthread_barrier_destroy(&sh.bar);
}

static void test_expert_parallel(void **s)
{
    (void)s;
    check_ep(2, 1.0f, 31);
    check_ep(4, 1.25f, 32);
    check_ep(2, 0.0f, 33); /* dropless */
}

/* the all-to-alls' messages and bytes per call, and the refusals */
static void test_expert_parallel_cost(void **s)
{
    (void)s;
    bg_moe_t mo = {.c = 8, .experts = 4, .top_k = 2, .ffn = 8, .init_std = 0.5f, .proj_std = 0.5f, .ep = 2};
    bg_layer_t *l = NULL;
    assert_int_equal(bg_layer_moe("moe", &mo, &l), BG_OK);
    bg_tp_cost_t cost = {0};
    bg_layer_tp_cost(l, (bg_shape_t){1, 6, 8}, &cost);
    /* 12 choices, half of them to the other member; counts 2 floats; rows out and back (fwd), dY and dx (bwd) */
    assert_true(cost.ep_fwd_msgs == 3 && cost.ep_fwd_bytes == 2 * 4 + 2 * 6 * 8 * 4);
    assert_true(cost.ep_bwd_msgs == 2 && cost.ep_bwd_bytes == 2 * 6 * 8 * 4);
    assert_true(cost.fwd_calls == 0 && cost.bwd_calls == 0);
    rig_t r;
    rig_init(&r, be, l, (bg_shape_t){1, 6, 8}, 5);
    bg_layer_ctx_t c = rig_ctx(&r);
    assert_int_equal(l->ops->forward(l, &c, r.x, r.y), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "built for ep 2 but runs in no expert-parallel group"));
    rig_free(&r);
    mo.ep = 3;
    assert_int_equal(bg_layer_moe("moe", &mo, &l), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "ep 3 does not divide experts 4"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients),    cmocka_unit_test(test_aux_closed_form),
        cmocka_unit_test(test_brute_force),  cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_bad_args),     cmocka_unit_test(test_expert_parallel),
        cmocka_unit_test(test_expert_parallel_cost),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
