/* tools/bench_kernels.c: `brigade bench kernels`: GEMM GFLOP/s through the
 * backend next to cblas_sgemm called directly in the same run (OpenBLAS's own
 * multi-threaded figure, the reference), per-op throughput at GPT-like
 * sizes, and GPT training FLOP/s on one thread anchored on the machine (its
 * theoretical fp32 peak per core, measured clock) and on the best sgemm.
 * Uses the public API only; the BLAS is called through bg_blas_info() (the
 * same library the backend loaded). Every figure is the median of --repeat
 * timed runs after one warm-up. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/bench.h"
#include "tools/cli.h"
#include "tools/bench_peak.h"
#include "core/util.h"

#define BG_BENCH_MAX_SIZES 16

typedef struct {
    bg_backend_t *be;
    int repeat;
    json_t *gemms, *ops;
} bg__kb_t;

static void bg__fill_random(bg_backend_t *be, float *dev, size_t n, uint64_t seed)
{
    float *h = malloc(n * sizeof(float));
    if (!h)
        return;
    bg_rng_t rng;
    bg_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(bg_rng_uniform(&rng) * 2.0 - 1.0);
    be->ops->from_host(be, dev, h, n * sizeof(float));
    free(h);
}

/* ------------------------------------------------------------------ GEMM */

static int bg__bench_gemm(bg__kb_t *kb, const char *label, int ta, int tb, int m, int n, int k)
{
    bg_backend_t *be = kb->be;
    float *a = bg_backend_alloc(be, (size_t)m * k * sizeof(float), "bench A");
    float *b = bg_backend_alloc(be, (size_t)k * n * sizeof(float), "bench B");
    float *c = bg_backend_alloc(be, (size_t)m * n * sizeof(float), "bench C");
    if (!a || !b || !c) {
        bg_backend_free(be, a), bg_backend_free(be, b), bg_backend_free(be, c);
        return bg_cli_status("bench kernels", BG_ERR_NOMEM);
    }
    bg__fill_random(be, a, (size_t)m * k, 1);
    bg__fill_random(be, b, (size_t)k * n, 2);
    int lda = ta ? m : k, ldb = tb ? k : n;
    /* backend and reference alternate run by run, so load from other
     * processes on a shared machine hits both alike */
    double *t = malloc(2 * (size_t)kb->repeat * sizeof(double)), *tr = t + kb->repeat;
    double flop = 2.0 * m * n * k, gf[2];
    bg_blas_info_t blas;
    if (bg_blas_info(&blas) != BG_OK)
        return bg_cli_status("bench kernels", BG_ERR_NOT_FOUND);
    for (int r = -1; r < kb->repeat; r++) {
        for (int ref = 0; ref < 2; ref++) {
            if (ref)
                blas.set_num_threads(be->num_threads); /* OpenBLAS's own threading */
            double t0 = bg_now();
            if (ref)
                blas.sgemm(BG_CBLAS_ROW_MAJOR, ta ? BG_CBLAS_TRANS : BG_CBLAS_NO_TRANS,
                           tb ? BG_CBLAS_TRANS : BG_CBLAS_NO_TRANS, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
            else
                be->ops->gemm(be, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
            be->ops->synchronize(be);
            if (r >= 0)
                (ref ? tr : t)[r] = bg_now() - t0;
        }
    }
    gf[0] = flop / bg_median(t, (size_t)(kb->repeat)) * 1e-9;
    gf[1] = flop / bg_median(tr, (size_t)(kb->repeat)) * 1e-9;
    printf("  %-10s %c%c %5d %5d %5d  %8.1f  %8.1f  %6.2f\n", label, ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, gf[0],
           gf[1], gf[0] / gf[1]);
    json_array_append_new(kb->gemms, json_pack("{s:s, s:b, s:b, s:i, s:i, s:i, s:f, s:f, s:f}", "label", label,
                                               "trans_a", ta, "trans_b", tb, "m", m, "n", n, "k", k,
                                               "backend_gflops", gf[0], "openblas_gflops", gf[1], "ratio",
                                               gf[0] / gf[1]));
    free(t);
    bg_backend_free(be, a), bg_backend_free(be, b), bg_backend_free(be, c);
    return 0;
}

/* ------------------------------------------------------------ other ops */

typedef enum { BG_OP_LN, BG_OP_LN_BWD, BG_OP_GELU, BG_OP_GELU_BWD, BG_OP_SOFTMAX, BG_OP_CE, BG_OP_ATTN } bg__op_t;

/* One op at one shape: median time; bytes = minimal memory traffic, flops
 * only for attention (its GEMMs dominate). */
static int bg__bench_op(bg__kb_t *kb, bg__op_t op, const char *name, int B, int T, int C, int NH, int V)
{
    bg_backend_t *be = kb->be;
    const bg_backend_ops_t *o = be->ops;
    size_t N = (size_t)B * T, nc = N * C, n4 = nc * 4;
    size_t na = 0, nb = 0, nw = 0;
    double bytes = 0, flops = 0;
    char shape[96];
    switch (op) {
    case BG_OP_LN:
    case BG_OP_LN_BWD:
        na = nb = nc;
        bytes = (op == BG_OP_LN ? 2.0 : 3.0) * nc * 4; /* in, out (, dout) */
        snprintf(shape, sizeof(shape), "N=%zu C=%d", N, C);
        break;
    case BG_OP_GELU:
    case BG_OP_GELU_BWD:
        na = nb = n4;
        bytes = (op == BG_OP_GELU ? 2.0 : 3.0) * n4 * 4;
        snprintf(shape, sizeof(shape), "n=%zu", n4);
        break;
    case BG_OP_SOFTMAX:
        na = nb = (size_t)B * NH * T * T;
        bytes = 2.0 * na * 4;
        snprintf(shape, sizeof(shape), "BH=%d T=%d (causal)", B * NH, T);
        break;
    case BG_OP_CE:
        na = nb = N * V;
        bytes = 2.0 * na * 4;
        snprintf(shape, sizeof(shape), "N=%zu V=%d", N, V);
        break;
    case BG_OP_ATTN:
        na = 3 * nc;                                   /* qkv, then dqkv */
        nb = nc;                                       /* out, then dout */
        /* aux: workspace, scratch, dqkv */
        nw = bg_attention_ws_floats(B, T, C, NH) + bg_attention_scratch_floats(B, T, C, NH) + 3 * nc;
        /* the fused kernel's causal pairs: fwd 2 products, bwd 5, of hs multiply-adds */
        flops = 7.0 * 2.0 * B * (T * (T + 1.0) / 2.0) * C;
        /* fwd: qkv in, out out; bwd: qkv, out, dout in, dqkv out */
        bytes = (13.0 * nc) * 4;
        snprintf(shape, sizeof(shape), "B=%d T=%d C=%d NH=%d", B, T, C, NH);
        break;
    }
    float *a = bg_backend_alloc(be, na * sizeof(float), "bench in");
    float *b = bg_backend_alloc(be, nb * sizeof(float), "bench out");
    float *c = bg_backend_alloc(be, (nw ? nw : na) * sizeof(float), "bench aux");
    float *w = bg_backend_alloc(be, (size_t)(C > V ? C : V) * 3 * sizeof(float), "bench weights");
    float *stat = bg_backend_alloc(be, 2 * N * sizeof(float), "bench stats");
    int32_t *tg = bg_backend_alloc(be, N * sizeof(int32_t), "bench targets");
    if (!a || !b || !c || !w || !stat || !tg) {
        bg_backend_free(be, a), bg_backend_free(be, b), bg_backend_free(be, c);
        bg_backend_free(be, w), bg_backend_free(be, stat), bg_backend_free(be, tg);
        return bg_cli_status("bench kernels", BG_ERR_NOMEM);
    }
    bg__fill_random(be, a, na, 3);
    bg__fill_random(be, b, nb, 4);
    bg__fill_random(be, w, (size_t)(C > V ? C : V) * 3, 5);
    if (op == BG_OP_CE) {
        int32_t *h = malloc(N * sizeof(int32_t));
        for (size_t i = 0; h && i < N; i++)
            h[i] = (int32_t)(i * 7919 % (size_t)V);
        if (h)
            o->from_host(be, tg, h, N * sizeof(int32_t));
        free(h);
    }
    if (op == BG_OP_LN_BWD)
        o->layernorm_forward(be, c, stat, stat + N, a, w, w + C, (int)N, C);
    double *t = malloc((size_t)kb->repeat * sizeof(double));
    for (int r = -1; r < kb->repeat; r++) {
        double t0 = bg_now();
        switch (op) {
        case BG_OP_LN:
            o->layernorm_forward(be, b, stat, stat + N, a, w, w + C, (int)N, C);
            break;
        case BG_OP_LN_BWD:
            o->layernorm_backward_input(be, c, b, a, w, stat, stat + N, (int)N, C);
            break;
        case BG_OP_GELU:
            o->gelu_forward(be, b, a, na);
            break;
        case BG_OP_GELU_BWD:
            o->gelu_backward(be, c, a, b, na);
            break;
        case BG_OP_SOFTMAX:
            o->causal_softmax_forward(be, b, a, 0.125f, B * NH, T);
            break;
        case BG_OP_CE:
            o->crossentropy_forward(be, stat, b, a, tg, (int)N, V);
            break;
        case BG_OP_ATTN:
            bg_attention_forward(be, b, c, a, B, T, C, NH);
            bg_attention_backward(be, c + nw - 3 * nc, c + bg_attention_ws_floats(B, T, C, NH), b, a, b, c, B, T, C,
                                  NH);
            break;
        }
        o->synchronize(be);
        if (r >= 0)
            t[r] = bg_now() - t0;
    }
    double med = bg_median(t, (size_t)(kb->repeat));
    double gbps = bytes / med * 1e-9, gflops = flops / med * 1e-9;
    if (flops > 0)
        printf("  %-22s %-26s %9.3f ms  %7.2f GB/s  %7.1f GFLOP/s\n", name, shape, med * 1e3, gbps, gflops);
    else
        printf("  %-22s %-26s %9.3f ms  %7.2f GB/s\n", name, shape, med * 1e3, gbps);
    json_t *j = json_pack("{s:s, s:s, s:f, s:f}", "op", name, "shape", shape, "ms", med * 1e3, "gbps", gbps);
    if (flops > 0)
        json_object_set_new(j, "gflops", json_real(gflops));
    json_array_append_new(kb->ops, j);
    free(t);
    bg_backend_free(be, a), bg_backend_free(be, b), bg_backend_free(be, c);
    bg_backend_free(be, w), bg_backend_free(be, stat), bg_backend_free(be, tg);
    return 0;
}


static double bg__thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The GEMMs as they run inside the training step: the bench's own backend
 * instance gets a copy of its operation table whose two GEMM entries call the
 * real ones and record, while `on`, each call's shape (transposes, m, n, k,
 * batch, whether it accumulates) and, on a synchronous backend (the CPU's: the
 * time a call takes is its GEMM's), its seconds. Each recorded shape is then
 * timed alone through the same backend (bg__gshape_alone: warm operands, the
 * same call again and again). Set side by side, per shape and in total, they
 * show what the rest of the step costs the GEMMs (operands that other layers
 * pushed out of the caches), and the sum of the alone times is the step with
 * everything but its GEMMs free. The list of shapes is the step's own, so it
 * cannot drift from the model's layers. */
#define BG_GT_SHAPES 64
typedef struct {
    int ta, tb, m, n, k, batch, acc;
    long long calls;
    double s, alone; /* seconds inside the timed steps (all calls), and one call alone */
} bg__gshape_t;

static struct {
    const bg_backend_ops_t *inner;
    bg_backend_ops_t ops;
    int on, nsh, lost; /* lost: calls of shapes beyond BG_GT_SHAPES */
    bg__gshape_t sh[BG_GT_SHAPES];
} bg__gt;

static void bg__gt_record(int ta, int tb, int m, int n, int k, int batch, float beta, double sec)
{
    if (!bg__gt.on)
        return;
    int acc = beta != 0.0f, i = 0;
    while (i < bg__gt.nsh && !(bg__gt.sh[i].ta == ta && bg__gt.sh[i].tb == tb && bg__gt.sh[i].m == m &&
                               bg__gt.sh[i].n == n && bg__gt.sh[i].k == k && bg__gt.sh[i].batch == batch &&
                               bg__gt.sh[i].acc == acc))
        i++;
    if (i == BG_GT_SHAPES) {
        bg__gt.lost++;
        return;
    }
    if (i == bg__gt.nsh)
        bg__gt.sh[bg__gt.nsh++] = (bg__gshape_t){ta, tb, m, n, k, batch, acc, 0, 0, 0};
    bg__gt.sh[i].calls++;
    bg__gt.sh[i].s += sec;
}

static void bg__timed_gemm(bg_backend_t *be, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc)
{
    double t0 = bg_now();
    bg__gt.inner->gemm(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    bg__gt_record(ta, tb, m, n, k, 1, beta, bg_now() - t0);
}

static void bg__timed_gemm_sb(bg_backend_t *be, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                              int lda, long long sa, const float *b, int ldb, long long sb, float beta, float *c,
                              int ldc, long long sc, int batch)
{
    double t0 = bg_now();
    bg__gt.inner->gemm_strided_batched(be, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
    bg__gt_record(ta, tb, m, n, k, batch, beta, bg_now() - t0);
}

/* The step's other operations, timed the same way (synchronous backends):
 * every slot below whose real entry exists gets a wrapper that adds its
 * seconds to its line. What no wrapper sees (the layers' own code between
 * calls, and slots not listed: memory, reductions to the host) is the step
 * less the GEMMs and these. */
#define BG_OT_LIST(X)                                                                                                 \
    X(attention_forward, (bg_backend_t * be, float *out, float *lse, const float *qkv, int B, int T, int NH, int hs),  \
      (be, out, lse, qkv, B, T, NH, hs))                                                                              \
    X(attention_backward,                                                                                             \
      (bg_backend_t * be, float *dqkv, float *dvec, const float *dout, const float *qkv, const float *out,            \
       const float *lse, int B, int T, int NH, int hs),                                                               \
      (be, dqkv, dvec, dout, qkv, out, lse, B, T, NH, hs))                                                            \
    X(bias_gelu_forward, (bg_backend_t * be, float *pre, float *out, const float *bias, int N, int C),                 \
      (be, pre, out, bias, N, C))                                                                                     \
    X(gelu_bias_backward,                                                                                             \
      (bg_backend_t * be, float *din, float *dbias, const float *pre, const float *dout, int N, int C),               \
      (be, din, dbias, pre, dout, N, C))                                                                              \
    X(gelu_forward, (bg_backend_t * be, float *out, const float *in, size_t n), (be, out, in, n))                      \
    X(gelu_backward, (bg_backend_t * be, float *din, const float *in, const float *dout, size_t n),                   \
      (be, din, in, dout, n))                                                                                         \
    X(layernorm_forward,                                                                                              \
      (bg_backend_t * be, float *out, float *mean, float *rstd, const float *in, const float *weight,                 \
       const float *bias, int N, int C),                                                                              \
      (be, out, mean, rstd, in, weight, bias, N, C))                                                                  \
    X(layernorm_backward_input,                                                                                       \
      (bg_backend_t * be, float *din, const float *dout, const float *in, const float *weight, const float *mean,     \
       const float *rstd, int N, int C),                                                                              \
      (be, din, dout, in, weight, mean, rstd, N, C))                                                                  \
    X(layernorm_backward_weight,                                                                                      \
      (bg_backend_t * be, float *dweight, float *dbias, const float *dout, const float *in, const float *mean,        \
       const float *rstd, int N, int C),                                                                              \
      (be, dweight, dbias, dout, in, mean, rstd, N, C))                                                               \
    X(bias_forward, (bg_backend_t * be, float *out, const float *bias, int N, int C), (be, out, bias, N, C))           \
    X(bias_backward, (bg_backend_t * be, float *dbias, const float *dout, int N, int C), (be, dbias, dout, N, C))      \
    X(residual_forward, (bg_backend_t * be, float *out, const float *a, const float *b, size_t n), (be, out, a, b, n)) \
    X(axpy, (bg_backend_t * be, float *y, float alpha, const float *x, size_t n), (be, y, alpha, x, n))               \
    X(copy, (bg_backend_t * be, float *dst, const float *src, size_t n), (be, dst, src, n))                           \
    X(fill, (bg_backend_t * be, float *x, float value, size_t n), (be, x, value, n))                                  \
    X(scale, (bg_backend_t * be, float *x, float alpha, size_t n), (be, x, alpha, n))                                 \
    X(crossentropy_forward,                                                                                           \
      (bg_backend_t * be, float *losses, float *probs, const float *logits, const int32_t *targets, int N, int V),    \
      (be, losses, probs, logits, targets, N, V))                                                                     \
    X(crossentropy_backward,                                                                                          \
      (bg_backend_t * be, float *dlogits, const float *probs, const int32_t *targets, float dloss, int N, int V),     \
      (be, dlogits, probs, targets, dloss, N, V))                                                                     \
    X(embedding_forward,                                                                                              \
      (bg_backend_t * be, float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T, int C), \
      (be, out, tokens, wte, wpe, B, T, C))                                                                           \
    X(embedding_backward,                                                                                             \
      (bg_backend_t * be, float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C),   \
      (be, dwte, dwpe, dout, tokens, B, T, C))                                                                        \
    X(adamw,                                                                                                          \
      (bg_backend_t * be, float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,       \
       float beta2, float eps, float weight_decay, int t),                                                            \
      (be, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t))

#define BG_OT_ENUM(name, params, args) BG_OT_##name,
enum { BG_OT_LIST(BG_OT_ENUM) BG_OT_COUNT };
#define BG_OT_NAME(name, params, args) #name,
static const char *const bg__ot_names[BG_OT_COUNT] = {BG_OT_LIST(BG_OT_NAME)};
static struct {
    double s[BG_OT_COUNT];
    long long calls[BG_OT_COUNT];
} bg__ot;
#define BG_OT_FN(name, params, args)                                                                                  \
    static void bg__ot_##name params                                                                                  \
    {                                                                                                                 \
        double t0 = bg_now();                                                                                         \
        bg__gt.inner->name args;                                                                                      \
        if (bg__gt.on)                                                                                                \
            bg__ot.s[BG_OT_##name] += bg_now() - t0, bg__ot.calls[BG_OT_##name]++;                                    \
    }
BG_OT_LIST(BG_OT_FN)
#define BG_OT_SET(name, params, args)                                                                                 \
    if (bg__gt.inner->name)                                                                                           \
        bg__gt.ops.name = bg__ot_##name;

/* Seconds of one call of shape g alone through the backend's real GEMM
 * (median of r runs, each of >= 0.1 GFLOP; the operands stay warm); -1 when
 * the operands cannot be allocated. */
static double bg__gshape_alone(bg_backend_t *be, const bg__gshape_t *g, int r)
{
    size_t na = (size_t)g->m * g->k, nb = (size_t)g->k * g->n, nc = (size_t)g->m * g->n;
    float *a = bg_backend_alloc(be, na * g->batch * sizeof(float), "bench gemm a"),
          *b = bg_backend_alloc(be, nb * g->batch * sizeof(float), "bench gemm b"),
          *c = bg_backend_alloc(be, nc * g->batch * sizeof(float), "bench gemm c");
    double t[32], f = 2.0 * g->m * g->n * g->k * g->batch, sec = -1;
    if (a && b && c) {
        be->ops->fill(be, a, 0.01f, na * g->batch), be->ops->fill(be, b, 0.02f, nb * g->batch);
        be->ops->fill(be, c, 0.0f, nc * g->batch);
        int inner = (int)(1e8 / f) + 1;
        for (int it = -1; it < r; it++) {
            double t0 = bg_now();
            for (int j = 0; j < inner; j++)
                bg__gt.inner->gemm_strided_batched(be, g->ta, g->tb, g->m, g->n, g->k, 1.0f, a, g->ta ? g->m : g->k,
                                                   (long long)na, b, g->tb ? g->k : g->n, (long long)nb,
                                                   g->acc ? 1.0f : 0.0f, c, g->n, (long long)nc, g->batch);
            be->ops->synchronize(be);
            if (it >= 0)
                t[it] = (bg_now() - t0) / inner;
        }
        sec = bg_median(t, (size_t)r);
    }
    bg_backend_free(be, a), bg_backend_free(be, b), bg_backend_free(be, c);
    return sec;
}

/* GPT training FLOP/s: the reference GPT of docs/benchmarks.md (d_model 256, 4 heads,
 * seq 128, 2 sequences per microbatch, 16 microbatches per optimizer step;
 * 2 blocks instead of 8) trains (forward and backward of every microbatch,
 * gradients accumulated, then AdamW) on ONE thread; its model FLOPs per
 * second (the layers' reported forward + backward FLOPs / median step time)
 * are reported as fractions of the machine's theoretical fp32 peak per core,
 * of the best single-threaded sgemm of the BLAS in use, and of the step's
 * own GEMMs alone, all measured in the same run. Until 2026-12-02 a step was
 * one microbatch, so the optimizer's passes over the weights were 16 times
 * its share in the table's training (about a tenth of the step instead of
 * under 1 %). Target: >= 60% of the theoretical peak. Each timed
 * step is also set against the core's FMA throughput sampled just before and
 * after it (bg__fma_now): the median of those ratios is steadier on a shared
 * host than the fraction of the (fixed) theoretical peak. */
#define BG_BENCH_MICROBATCHES 16
static int bg__bench_gpt_training(bg__kb_t *kb, json_t *root)
{
    const char *cmd = "bench kernels";
    bg_backend_t *be = NULL;
    bg_backend_params_t bp = bg_cli_backend_params(1);
    bg_model_config_t cfg = BG_MODEL_CONFIG_INIT;
    cfg.layers = 2;
    cfg.d_model = 256;
    cfg.heads = 4;
    cfg.seq_len = 128;
    int n = 2, T = 128, rc = 0, timed = 0;
    bg_model_desc_t *desc = NULL;
    bg_model_t *m = NULL;
    bg_stage_t *st = NULL;
    int32_t *tok = malloc((size_t)n * T * sizeof(int32_t)), *tgt = malloc((size_t)n * T * sizeof(int32_t));
    bg_optim_config_t opt = BG_OPTIM_CONFIG_INIT;
    bg_status_t s = tok && tgt ? BG_OK : BG_ERR_NOMEM;
    if (s == BG_OK)
        s = bg_backend_create(kb->be->ops->name, &bp, &be);
    timed = s == BG_OK && !strcmp(be->ops->name, "cpu"); /* synchronous: a call's time is its GEMM's */
    if (s == BG_OK) { /* every backend's step records its GEMM shapes; only the CPU's are timed in it */
        bg__gt.inner = be->ops;
        bg__gt.ops = *be->ops;
        bg__gt.ops.gemm = bg__timed_gemm;
        bg__gt.ops.gemm_strided_batched = bg__timed_gemm_sb;
        BG_OT_LIST(BG_OT_SET)
        be->ops = &bg__gt.ops;
    }
    if (s == BG_OK)
        s = bg_model_build(&cfg, &desc);
    if (s == BG_OK)
        s = bg_model_create(desc, be, -1, -1, &m);
    if (s == BG_OK)
        s = bg_stage_create(m, 1, &st);
    if (s != BG_OK) {
        rc = bg_cli_status(cmd, s);
        goto out;
    }
    for (int i = 0; i < n * T; i++) {
        tok[i] = (i * 31 + 7) % 256;
        tgt[i] = (i * 17 + 3) % 256;
    }
    bg_layer_profile_t prof[8];
    int np = 0;
    s = bg_model_profile(desc, n, T, prof, 8, &np);
    double flops = 0, block_flops = 0;
    for (int i = 0; i < np; i++) {
        flops += prof[i].fwd_flops + prof[i].bwd_flops;
        if (!strncmp(prof[i].name, "blocks.", 7))
            block_flops += prof[i].fwd_flops + prof[i].bwd_flops;
    }
    const int M = BG_BENCH_MICROBATCHES;
    flops *= M, block_flops *= M;
    double t[32], tc[32], fm[32], fr[32]; /* fm: the core's FMA throughput around a step, fr: the step's FLOP/s over it */
    int r = kb->repeat < 32 ? kb->repeat : 32;
    for (int it = -1; it < r && s == BG_OK; it++) {
        bg__gt.on = it >= 0; /* the warm-up step is not counted */
        double f0 = it >= 0 ? bg__fma_now() : 0;
        double t0 = bg_now(), c0 = bg__thread_cpu();
        float *in, *out, *din;
        bg_shape_t os;
        bg_model_zero_grads(m);
        for (int mb = 0; mb < M && s == BG_OK; mb++) {
            s = bg_stage_begin(st, 0, bg_model_input_shape(m, n, T), &in);
            if (s == BG_OK)
                s = bg_stage_set_data(st, 0, tok, tgt, 1.0f / (float)(n * T * M));
            if (s == BG_OK)
                s = bg_stage_forward(st, 0, &out, &os);
            if (s == BG_OK)
                s = bg_stage_backward(st, 0, &din);
            bg_stage_end(st, 0);
        }
        if (s == BG_OK)
            s = bg_model_optim_step(m, &opt, it + 2);
        be->ops->synchronize(be);
        if (it >= 0) {
            t[it] = bg_now() - t0, tc[it] = bg__thread_cpu() - c0;
            fm[it] = (f0 + bg__fma_now()) / 2;
            fr[it] = fm[it] > 0 ? flops / t[it] / 1e9 / fm[it] : 0;
        }
    }
    bg__gt.on = 0;
    if (s != BG_OK) {
        rc = bg_cli_status(cmd, s);
        goto out;
    }
    double step = bg_median(t, (size_t)(r)), step_cpu = bg_median(tc, (size_t)(r)), of_fma = bg_median(fr, (size_t)r),
           fma_gflops = bg_median(fm, (size_t)r);
    double gflops = flops / step / 1e9;
    double libs[2];
    double best = bg__sgemm_best_1t(kb->repeat, libs);
    /* the step's GEMM shapes (per step: the r timed steps' calls / r): their
     * FLOPs, their seconds inside the step and alone */
    double gemm_flop = 0, gemm_s = 0, in_s = 0;
    for (int i = 0; i < bg__gt.nsh; i++) {
        bg__gshape_t *g = &bg__gt.sh[i];
        g->alone = gemm_s >= 0 ? bg__gshape_alone(be, g, r) : -1;
        gemm_s = g->alone < 0 ? -1 : gemm_s + g->alone * g->calls / r;
        gemm_flop += 2.0 * g->m * g->n * g->k * g->batch * g->calls / r;
        in_s += g->s / r;
    }
    if (gemm_s < 0 || bg__gt.lost) /* an operand not allocated, or shapes not recorded: no figure */
        gemm_s = 0;
    if (!timed || bg__gt.lost) /* asynchronous calls are not timed */
        in_s = 0;
    bg__peak_t pk = bg__machine_peak();
    printf("\nGPT training, one thread: d_model 256, 2 blocks, 4 heads, seq 128, %d microbatches of 2 sequences per "
           "step, AdamW\n", M);
    printf("  %.1f ms/step, %.3f GFLOP/step (layers' reports; blocks %.0f%%), %.1f GFLOP/s\n", step * 1e3,
           flops / 1e9, 100 * block_flops / flops, gflops);
    if (pk.peak > 0)
        printf("  machine peak per core: %.2f GHz (measured) x %d FMA units (measured %.2f/cycle) x %d fp32 lanes x 2 "
               "= %.1f GFLOP/s\n", pk.ghz, pk.units, pk.fma_per_cycle, pk.bits / 32, pk.peak);
    else
        printf("  machine peak per core: not estimated (no FMA, or not x86-64)\n");
    printf("  best sgemm on one thread (same run): %.1f GFLOP/s = %.0f%% of peak (OpenBLAS %.1f", best,
           pk.peak > 0 ? 100 * best / pk.peak : 0.0, libs[0]);
    if (libs[1] > 0)
        printf(", oneDNN %.1f", libs[1]);
    printf(")\n");
    printf("  training: %.0f%% of the machine's peak, %.0f%% of the best sgemm\n",
           pk.peak > 0 ? 100 * gflops / pk.peak : 0.0, best > 0 ? 100 * gflops / best : 0.0);
    /* BRIGADE_CPU_ISA below the CPU's widest: the peak of the vectors the kernels (and the BLAS) may use,
     * at the measured clock and FMA units: AVX2 8 lanes with FMA; the x86-64 default 4 lanes (SSE) with
     * the multiply and the add as two instructions on the same two ports (an estimate: cores with separate
     * add ports, Intel's Golden Cove and later, can pass it) */
    bg_cpu_isa_t isa = BG_CPU_ISA_DEFAULT;
    bg_cpu_info_t cpu;
    bg_cpu_info(&cpu);
    double isa_peak = 0;
    if (pk.peak > 0 && bg_cpu_isa(&isa) == BG_OK && (int)isa < (cpu.avx512 ? 2 : cpu.avx2_fma ? 1 : 0)) {
        isa_peak = isa == BG_CPU_ISA_AVX2 ? pk.ghz * pk.units * 8 * 2 : pk.ghz * pk.units * 4;
        printf("  the forced ISA's peak (BRIGADE_CPU_ISA=%s: %s): %.1f GFLOP/s; training %.0f%% of it, the best "
               "sgemm %.0f%%\n", bg_cpu_isa_name(isa),
               isa == BG_CPU_ISA_AVX2 ? "8 fp32 lanes x FMA" : "4 fp32 lanes, multiply and add apart", isa_peak,
               100 * gflops / isa_peak, 100 * best / isa_peak);
    }
    double ceiling = gemm_s > 0 ? flops / gemm_s / 1e9 : 0;
    if (gemm_s > 0)
        printf("  the step's GEMMs at its shapes, alone through this backend: %.1f ms (%.0f%% of the step; %.3f GFLOP "
               "at %.1f GFLOP/s = %.0f%% of peak);\n  so with everything else free the step would reach %.1f GFLOP/s "
               "= %.0f%% of peak\n",
               gemm_s * 1e3, 100 * gemm_s / step, gemm_flop / 1e9, gemm_flop / gemm_s / 1e9,
               pk.peak > 0 ? 100 * gemm_flop / gemm_s / 1e9 / pk.peak : 0.0, ceiling,
               pk.peak > 0 ? 100 * ceiling / pk.peak : 0.0);
    /* the same GEMMs inside the steps (all r timed steps: a mean, not a median) */
    double in_flop = in_s > 0 ? gemm_flop : 0;
    if (in_s > 0)
        printf("  the same GEMMs inside the step (mean of the %d steps): %.1f ms (%.0f%% of the step; %.3f GFLOP at "
               "%.1f GFLOP/s = %.0f%% of peak, %.2f of their rate alone)\n",
               r, in_s * 1e3, 100 * in_s / step, in_flop / 1e9, in_flop / in_s / 1e9,
               pk.peak > 0 ? 100 * in_flop / in_s / 1e9 / pk.peak : 0.0,
               gemm_s > 0 ? (in_flop / in_s) / (gemm_flop / gemm_s) : 0.0);
    if (in_s > 0 && gemm_s > 0) {
        printf("  the step's GEMMs by shape (calls per step; GFLOP/s inside the step, alone, and their ratio):\n");
        for (int i = 0; i < bg__gt.nsh; i++) {
            const bg__gshape_t *g = &bg__gt.sh[i];
            double f = 2.0 * g->m * g->n * g->k * g->batch, in_rate = f * g->calls / g->s / 1e9;
            char bt[24] = "";
            if (g->batch > 1)
                snprintf(bt, sizeof bt, " x%d", g->batch);
            printf("    %c%c %5d %5d %5d%-5s%s %4lld  %6.1f ms/step %5.1f %5.1f  %.2f\n", g->ta ? 'T' : 'N',
                   g->tb ? 'T' : 'N', g->m, g->n, g->k, bt, g->acc ? " +=" : "   ", g->calls / r, g->s / r * 1e3,
                   in_rate, f / g->alone / 1e9, in_rate / (f / g->alone / 1e9));
        }
    }
    double ops_s = 0;
    for (int i = 0; i < BG_OT_COUNT; i++)
        ops_s += bg__ot.s[i];
    if (in_s > 0 && ops_s > 0) {
        /* the largest first */
        int ord[BG_OT_COUNT];
        for (int i = 0; i < BG_OT_COUNT; i++) {
            int j = i;
            for (; j > 0 && bg__ot.s[ord[j - 1]] < bg__ot.s[i]; j--)
                ord[j] = ord[j - 1];
            ord[j] = i;
        }
        printf("  the rest of the step by operation (ms/step, share of the step, calls per step):\n");
        for (int i = 0; i < BG_OT_COUNT; i++)
            if (bg__ot.calls[ord[i]])
                printf("    %-26s %7.2f ms %5.1f%% %6lld\n", bg__ot_names[ord[i]], bg__ot.s[ord[i]] / r * 1e3,
                       100 * bg__ot.s[ord[i]] / r / step, bg__ot.calls[ord[i]] / r);
        /* the layers' own code and the slots not timed: the mean step (the
         * timed parts are means too) less the timed parts */
        double mean_step = 0;
        for (int i = 0; i < r; i++)
            mean_step += t[i] / r;
        double rest = mean_step - in_s - ops_s / r;
        printf("    %-26s %7.2f ms %5.1f%% (the mean step, %.1f ms, less the GEMMs and the above)\n",
               "between the calls", rest * 1e3, 100 * rest / mean_step, mean_step * 1e3);
    }
    /* the step's thread CPU time: other processes' share of a loaded machine
     * leaves it (not their effect on caches and clocks); one thread computes
     * everything, OpenBLAS and oneDNN included */
    double gflops_cpu = flops / step_cpu / 1e9;
    printf("  per CPU-second of the step's thread: %.1f ms/step, %.1f GFLOP/s = %.0f%% of the machine's peak\n",
           step_cpu * 1e3, gflops_cpu, pk.peak > 0 ? 100 * gflops_cpu / pk.peak : 0.0);
    /* the steady figure on a shared host: each step against the FMA rate the
     * core gave just before and after it (median of the per-step ratios) */
    if (of_fma > 0)
        printf("  against the FMA throughput measured around each step (%.1f GFLOP/s, %.0f%% of the peak: what the "
               "core gave then): %.0f%% (median of the %d steps' ratios)\n",
               fma_gflops, pk.peak > 0 ? 100 * fma_gflops / pk.peak : 0.0, 100 * of_fma, r);
    json_object_set_new(root, "gpt_training",
                        json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}",
                                  "d_model", 256, "layers", 2, "seq", T, "sequences", n * M, "step_ms", step * 1e3,
                                  "gflop_per_step", flops / 1e9, "gflops", gflops, "sgemm_best_1t_gflops", best,
                                  "sgemm_openblas_1t_gflops", libs[0], "sgemm_onednn_1t_gflops", libs[1],
                                  "step_cpu_ms", step_cpu * 1e3, "gflops_cpu", gflops_cpu,
                                  "clock_ghz", pk.ghz, "fma_per_cycle", pk.fma_per_cycle, "fma_units", pk.units,
                                  "vector_bits", pk.bits, "peak_gflops", pk.peak, "fraction_of_peak",
                                  pk.peak > 0 ? gflops / pk.peak : 0.0, "fraction_of_sgemm",
                                  best > 0 ? gflops / best : 0.0, "gemm_ms", gemm_s * 1e3, "gemm_gflop", gemm_flop / 1e9,
                                  "ceiling_gflops", ceiling));
    if (isa_peak > 0)
        json_object_set_new(json_object_get(root, "gpt_training"), "isa_peak_gflops", json_real(isa_peak));
    json_object_set_new(json_object_get(root, "gpt_training"), "fraction_of_fma_throughput", json_real(of_fma));
    json_object_set_new(json_object_get(root, "gpt_training"), "fma_throughput_gflops", json_real(fma_gflops));
    json_object_set_new(json_object_get(root, "gpt_training"), "gemm_in_step_ms", json_real(in_s * 1e3));
    json_object_set_new(json_object_get(root, "gpt_training"), "gemm_in_step_gflop", json_real(in_flop / 1e9));
    json_t *shapes = json_array();
    for (int i = 0; i < bg__gt.nsh && gemm_s > 0; i++) {
        const bg__gshape_t *g = &bg__gt.sh[i];
        json_array_append_new(shapes, json_pack("{s:b, s:b, s:i, s:i, s:i, s:i, s:b, s:f, s:f, s:f}", "trans_a", g->ta,
                                                "trans_b", g->tb, "m", g->m, "n", g->n, "k", g->k, "batch", g->batch,
                                                "accumulate", g->acc, "calls_per_step", (double)g->calls / r,
                                                "in_step_ms", timed ? g->s / r * 1e3 : 0.0, "alone_ms",
                                                g->alone * 1e3));
    }
    json_object_set_new(json_object_get(root, "gpt_training"), "gemm_shapes", shapes);
    json_t *ops = json_object();
    for (int i = 0; i < BG_OT_COUNT && timed; i++)
        if (bg__ot.calls[i])
            json_object_set_new(ops, bg__ot_names[i],
                                json_pack("{s:f, s:f}", "ms", bg__ot.s[i] / r * 1e3, "calls_per_step",
                                          (double)bg__ot.calls[i] / r));
    json_object_set_new(json_object_get(root, "gpt_training"), "ops_in_step", ops);
out:
    bg_stage_destroy(st);
    bg_model_destroy(m);
    bg_model_desc_destroy(desc);
    if (be && be->ops == &bg__gt.ops)
        be->ops = bg__gt.inner;
    bg_backend_destroy(be);
    free(tok);
    free(tgt);
    return rc;
}

/* ------------------------------------------------------------- attention */

static double bg__cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --attention B,T,NH,HS: the fused causal attention's forward and backward
 * alone, medians of wall time and of the process's CPU time (on a shared
 * machine the second leaves out the time other processes held the core; with
 * one thread the two agree on an idle one). */
static int bg__bench_attention(bg__kb_t *kb, int B, int T, int NH, int hs)
{
    bg_backend_t *be = kb->be;
    int C = NH * hs;
    size_t nc = (size_t)B * T * C, nws = bg_attention_ws_floats(B, T, C, NH),
           nsc = bg_attention_scratch_floats(B, T, C, NH);
    float *qkv = bg_backend_alloc(be, 3 * nc * sizeof(float), "bench qkv");
    float *dqkv = bg_backend_alloc(be, 3 * nc * sizeof(float), "bench dqkv");
    float *out = bg_backend_alloc(be, nc * sizeof(float), "bench out");
    float *dout = bg_backend_alloc(be, nc * sizeof(float), "bench dout");
    float *ws = bg_backend_alloc(be, (nws + nsc) * sizeof(float), "bench attention ws");
    double *t = malloc(4 * (size_t)kb->repeat * sizeof(double));
    int rc = 0;
    if (!qkv || !dqkv || !out || !dout || !ws || !t) {
        rc = bg_cli_status("bench kernels", BG_ERR_NOMEM);
        goto out;
    }
    bg__fill_random(be, qkv, 3 * nc, 7);
    bg__fill_random(be, dout, nc, 8);
    double *tf = t, *tb = t + kb->repeat, *cf = t + 2 * kb->repeat, *cb = t + 3 * kb->repeat;
    for (int r = -1; r < kb->repeat; r++) {
        double w0 = bg_now(), c0 = bg__cpu_seconds();
        bg_attention_forward(be, out, ws, qkv, B, T, C, NH);
        be->ops->synchronize(be);
        double w1 = bg_now(), c1 = bg__cpu_seconds();
        bg_attention_backward(be, dqkv, ws + nws, dout, qkv, out, ws, B, T, C, NH);
        be->ops->synchronize(be);
        double w2 = bg_now(), c2 = bg__cpu_seconds();
        if (r >= 0)
            tf[r] = w1 - w0, tb[r] = w2 - w1, cf[r] = c1 - c0, cb[r] = c2 - c1;
    }
    for (int r = 0; r < kb->repeat; r++)
        t[r] += tb[r], cf[r] += cb[r]; /* fwd+bwd per run, then the medians of each */
    double m_fb = bg_median(tf, (size_t)kb->repeat), m_b = bg_median(tb, (size_t)kb->repeat);
    double c_fb = bg_median(cf, (size_t)kb->repeat), c_b = bg_median(cb, (size_t)kb->repeat);
    /* the causal pairs: forward 2 products, backward 5, of hs multiply-adds each */
    double flop = 7.0 * 2.0 * B * (T * (T + 1.0) / 2.0) * C;
    printf("  attention B=%d T=%d NH=%d hs=%d (causal): fwd+bwd %.3f ms (backward %.3f), %.1f GFLOP/s; "
           "CPU time %.3f ms (backward %.3f)\n",
           B, T, NH, hs, m_fb * 1e3, m_b * 1e3, flop / m_fb * 1e-9, c_fb * 1e3, c_b * 1e3);
    json_array_append_new(kb->ops, json_pack("{s:s, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f}", "op", "attention",
                                              "B", B, "T", T, "NH", NH, "hs", hs, "ms", m_fb * 1e3,
                                              "backward_ms", m_b * 1e3, "cpu_ms", c_fb * 1e3,
                                              "cpu_backward_ms", c_b * 1e3));
out:
    free(t);
    bg_backend_free(be, qkv), bg_backend_free(be, dqkv), bg_backend_free(be, out);
    bg_backend_free(be, dout), bg_backend_free(be, ws);
    return rc;
}

/* -------------------------------------------------------- Llama kernels */

/* --llama B,T,G,g,HS,H: the Llama-style kernels alone at batch B, sequence T,
 * G key/value heads of g query heads each (head size HS, so d_model
 * C = G g HS) and a SwiGLU of H hidden units: RMSNorm (forward, input and
 * weight gradients) on (B T, C), SwiGLU (forward, backward) on (B T, 2H),
 * RoPE on the grouped projection (G groups of g query heads, a key head and a
 * value head: the g + 1 first rotated), the grouped layout's expansion and
 * reduction, and the grouped-query attention's forward and backward (expand,
 * the fused causal attention forward and backward, reduce; or the backend's
 * fused grouped-query attention where it has one, as the layer). Medians of wall
 * and CPU time, as --attention; GB/s of the minimal traffic, GFLOP/s of the
 * attention's causal pairs. MoE's experts are these SwiGLUs between GEMMs. */
enum { BG_LL_RMS, BG_LL_RMS_BWD_IN, BG_LL_RMS_BWD_W, BG_LL_SWIGLU, BG_LL_SWIGLU_BWD, BG_LL_ROPE, BG_LL_GQA_EXPAND,
       BG_LL_GQA_REDUCE, BG_LL_GQA_ATTN, BG_LL_COUNT };
static const char *const bg__ll_names[BG_LL_COUNT] = {
    "rmsnorm_forward", "rmsnorm_backward_input", "rmsnorm_backward_weight", "swiglu_forward", "swiglu_backward",
    "rope", "gqa_expand", "gqa_reduce", "gqa_attention fwd+bwd"};

typedef struct {
    int B, T, G, g, hs, H, N, C, Cg;
    float *in, *out, *aux, *dq, *att, *w, *rstd, *ws; /* in, out, aux, dq: N * max(2H, 3C, Cg); att: N C */
} bg__ll_t;

static void bg__ll_call(bg_backend_t *be, const bg__ll_t *s, int op)
{
    const bg_backend_ops_t *o = be->ops;
    switch (op) {
    case BG_LL_RMS: o->rmsnorm_forward(be, s->out, s->rstd, s->in, s->w, 1e-5f, s->N, s->C); break;
    case BG_LL_RMS_BWD_IN: o->rmsnorm_backward_input(be, s->out, s->aux, s->in, s->w, s->rstd, s->N, s->C); break;
    case BG_LL_RMS_BWD_W: o->rmsnorm_backward_weight(be, s->w + s->C, s->aux, s->in, s->rstd, s->N, s->C); break;
    case BG_LL_SWIGLU: o->swiglu_forward(be, s->out, s->in, s->N, s->H); break;
    case BG_LL_SWIGLU_BWD: o->swiglu_backward(be, s->out, s->in, s->aux, s->N, s->H); break;
    case BG_LL_ROPE: o->rope(be, s->out, s->in, s->B, s->T, s->G, s->g + 1, s->hs, 10000.0f, 0, 0); break;
    case BG_LL_GQA_EXPAND: o->gqa_expand(be, s->out, s->in, s->B, s->T, s->G, s->g, s->hs); break;
    case BG_LL_GQA_REDUCE: o->gqa_reduce(be, s->out, s->aux, s->B, s->T, s->G, s->g, s->hs); break;
    default: { /* grouped in -> qkv (out) -> att -> dqkv (dq, from dout = aux) -> dgrouped (out) */
        int NH = s->G * s->g;
        size_t nws = bg_attention_ws_floats(s->B, s->T, s->C, NH);
        if (o->gqa_attention_forward) { /* the fused kernels, as the gqa_attention layer calls them */
            o->gqa_attention_forward(be, s->att, s->ws, s->in, s->B, s->T, s->G, s->g, s->hs);
            o->gqa_attention_backward(be, s->out, s->ws + nws, s->aux, s->in, s->att, s->ws, s->B, s->T, s->G, s->g,
                                      s->hs);
            break;
        }
        o->gqa_expand(be, s->out, s->in, s->B, s->T, s->G, s->g, s->hs);
        bg_attention_forward(be, s->att, s->ws, s->out, s->B, s->T, s->C, NH);
        bg_attention_backward(be, s->dq, s->ws + nws, s->aux, s->out, s->att, s->ws, s->B, s->T, s->C, NH);
        o->gqa_reduce(be, s->out, s->dq, s->B, s->T, s->G, s->g, s->hs);
    }
    }
}

/* minimal bytes moved by one call (floats read and written, once each) */
static double bg__ll_bytes(const bg__ll_t *s, int op)
{
    double N = s->N, C = s->C, H = s->H, Cg = s->Cg;
    static const double per_c[] = {2, 3, 2}; /* RMSNorm: in, out (, dout) */
    switch (op) {
    case BG_LL_RMS: case BG_LL_RMS_BWD_IN: case BG_LL_RMS_BWD_W: return per_c[op] * N * C * 4;
    case BG_LL_SWIGLU: return 3 * N * H * 4;
    case BG_LL_SWIGLU_BWD: return 5 * N * H * 4;
    case BG_LL_ROPE: return 2 * N * Cg * 4;
    default: return (N * Cg + 3 * N * C) * 4; /* the layouts; the attention counts FLOPs */
    }
}

static int bg__bench_llama(bg__kb_t *kb, const long long *sh)
{
    bg_backend_t *be = kb->be;
    bg__ll_t s = {.B = (int)sh[0], .T = (int)sh[1], .G = (int)sh[2], .g = (int)sh[3], .hs = (int)sh[4],
                  .H = (int)sh[5]};
    s.N = s.B * s.T, s.C = s.G * s.g * s.hs, s.Cg = s.G * (s.g + 2) * s.hs;
    const bg_backend_ops_t *o = be->ops;
    if (!o->rmsnorm_forward || !o->swiglu_forward || !o->rope || !o->gqa_expand)
        return bg_cli_fail("bench kernels", "backend %s has no Llama kernels", o->name);
    size_t wide = (size_t)s.N * (size_t)(2 * s.H > 3 * s.C ? (2 * s.H > s.Cg ? 2 * s.H : s.Cg)
                                                           : (3 * s.C > s.Cg ? 3 * s.C : s.Cg));
    size_t nws = bg_attention_ws_floats(s.B, s.T, s.C, s.G * s.g) + bg_attention_scratch_floats(s.B, s.T, s.C, s.G * s.g);
    float **bufs[] = {&s.in, &s.out, &s.aux, &s.dq, &s.att, &s.w, &s.rstd, &s.ws};
    size_t len[] = {wide, wide, wide, wide, (size_t)s.N * s.C, 2 * (size_t)s.C, (size_t)s.N, nws};
    int rc = 0;
    for (size_t i = 0; i < sizeof(len) / sizeof(len[0]); i++)
        if (!(*bufs[i] = bg_backend_alloc(be, len[i] * sizeof(float), "bench llama")))
            rc = bg_cli_status("bench kernels", BG_ERR_NOMEM);
    double *t = malloc(2 * (size_t)kb->repeat * sizeof(double));
    if (!t && !rc)
        rc = bg_cli_status("bench kernels", BG_ERR_NOMEM);
    if (!rc) {
        bg__fill_random(be, s.in, wide, 11);
        bg__fill_random(be, s.aux, wide, 12);
        bg__fill_random(be, s.w, 2 * (size_t)s.C, 13);
        o->rmsnorm_forward(be, s.out, s.rstd, s.in, s.w, 1e-5f, s.N, s.C); /* the backward's rstd */
    }
    for (int op = 0; op < BG_LL_COUNT && !rc; op++) {
        double *tw = t, *tc = t + kb->repeat;
        for (int r = -1; r < kb->repeat; r++) {
            double w0 = bg_now(), c0 = bg__cpu_seconds();
            bg__ll_call(be, &s, op);
            be->ops->synchronize(be);
            if (r >= 0)
                tw[r] = bg_now() - w0, tc[r] = bg__cpu_seconds() - c0;
        }
        double mw = bg_median(tw, (size_t)kb->repeat), mc = bg_median(tc, (size_t)kb->repeat);
        double flop = op == BG_LL_GQA_ATTN ? 7.0 * 2.0 * s.B * (s.T * (s.T + 1.0) / 2.0) * s.C : 0;
        printf("  llama %-24s B=%d T=%d G=%d g=%d hs=%d H=%d: %9.3f ms, CPU time %9.3f ms, ", bg__ll_names[op], s.B,
               s.T, s.G, s.g, s.hs, s.H, mw * 1e3, mc * 1e3);
        if (flop > 0)
            printf("%.1f GFLOP/s (CPU time)\n", flop / mc * 1e-9);
        else
            printf("%.2f GB/s (CPU time)\n", bg__ll_bytes(&s, op) / mc * 1e-9);
        json_array_append_new(kb->ops, json_pack("{s:s, s:[i,i,i,i,i,i], s:f, s:f}", "op", bg__ll_names[op],
                                                 "shape", s.B, s.T, s.G, s.g, s.hs, s.H, "ms", mw * 1e3, "cpu_ms",
                                                 mc * 1e3));
    }
    free(t);
    for (size_t i = 0; i < sizeof(len) / sizeof(len[0]); i++)
        bg_backend_free(be, *bufs[i]);
    return rc;
}

static void bg__usage(FILE *f)
{
    fprintf(f, "usage: brigade bench kernels [--threads N] [--sizes 256,512,1024] [--repeat R] [--json FILE]\n"
               "                             [--attention B,T,NH,HS]... [--llama B,T,G,g,HS,H]...\n"
               "\n"
               "  --threads N   compute threads of the cpu backend (default: BRIGADE_NUM_THREADS or OpenMP's)\n"
               "  --sizes LIST  square GEMM sizes (default 256,512,1024)\n"
               "  --repeat R    timed runs per figure; the median is reported (default 5)\n"
               "  --attention B,T,NH,HS  only the fused causal attention, forward + backward, at batch B,\n"
               "                sequence T, NH heads of HS (repeatable); wall and CPU-time medians\n"
               "  --llama B,T,G,g,HS,H  only the Llama kernels (RMSNorm, SwiGLU of H units, RoPE, the grouped\n"
               "                layout and the grouped-query attention, forward + backward) at batch B,\n"
               "                sequence T, G key/value heads of g query heads of HS (repeatable; with\n"
               "                --attention, both run)\n"
               "  --json FILE   also write the figures as JSON\n"
               "\n"
               "Prints GEMM GFLOP/s through the backend next to cblas_sgemm called directly\n"
               "with OpenBLAS's own threads (the reference) and their ratio, square and\n"
               "GPT-shaped, then per-op throughput at GPT-like sizes, then GPT training on one thread\n"
               "against the core's theoretical fp32 peak: the step's GEMMs by shape (inside the step and\n"
               "alone) and the rest of the step by operation. The first line names the kernels' ISA\n"
               "(BRIGADE_CPU_ISA=avx512|avx2|default forces a narrower one, and the BLAS's with it).\n");
}

int bg_bench_kernels(int argc, char **argv)
{
    const char *cmd = "bench kernels";
    long long threads = 0, repeat = 5, sizes[BG_BENCH_MAX_SIZES] = {256, 512, 1024};
    int nsizes = 3;
    const char *json_path = NULL;
    long long att[BG_BENCH_MAX_SIZES][4], ll[BG_BENCH_MAX_SIZES][6];
    int natt = 0, nll = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            bg__usage(stdout);
            return 0;
        } else if (!strcmp(f, "--threads")) {
            if (bg_cli_int(cmd, f, v, 0, 1024, &threads))
                return 2;
            i++;
        } else if (!strcmp(f, "--repeat")) {
            if (bg_cli_int(cmd, f, v, 1, 1000, &repeat))
                return 2;
            i++;
        } else if (!strcmp(f, "--sizes")) {
            if (bg_cli_int_list(cmd, f, v, sizes, BG_BENCH_MAX_SIZES, &nsizes))
                return 2;
            for (int s = 0; s < nsizes; s++)
                if (sizes[s] < 1 || sizes[s] > 16384)
                    return bg_cli_fail(cmd, "--sizes: each size must be in [1, 16384], got %lld", sizes[s]);
            i++;
        } else if (!strcmp(f, "--json")) {
            if (!v)
                return bg_cli_fail(cmd, "--json needs a file name");
            json_path = v;
            i++;
        } else if (!strcmp(f, "--attention")) {
            int n = 0;
            if (natt == BG_BENCH_MAX_SIZES)
                return bg_cli_fail(cmd, "--attention: at most %d shapes", BG_BENCH_MAX_SIZES);
            if (bg_cli_int_list(cmd, f, v, att[natt], 4, &n))
                return 2;
            if (n != 4 || att[natt][0] < 1 || att[natt][1] < 1 || att[natt][2] < 1 || att[natt][3] < 1 ||
                att[natt][0] * att[natt][1] * att[natt][2] * att[natt][3] > (1LL << 28))
                return bg_cli_fail(cmd, "--attention: expected B,T,NH,HS, four positive sizes (B*T*NH*HS <= 2^28)");
            natt++;
            i++;
        } else if (!strcmp(f, "--llama")) {
            int n = 0;
            if (nll == BG_BENCH_MAX_SIZES)
                return bg_cli_fail(cmd, "--llama: at most %d shapes", BG_BENCH_MAX_SIZES);
            if (bg_cli_int_list(cmd, f, v, ll[nll], 6, &n))
                return 2;
            int ok = n == 6;
            for (int k = 0; k < n && ok; k++)
                ok = ll[nll][k] >= 1 && ll[nll][k] <= (1 << 16);
            if (!ok || ll[nll][4] % 2 || ll[nll][0] * ll[nll][1] * ll[nll][2] * (ll[nll][3] + 2) * ll[nll][4] > (1LL << 27) ||
                ll[nll][0] * ll[nll][1] * ll[nll][5] > (1LL << 27))
                return bg_cli_fail(cmd, "--llama: expected B,T,G,g,HS,H, six positive sizes, HS even "
                                        "(B*T*G*(g+2)*HS and B*T*H <= 2^27)");
            nll++;
            i++;
        } else {
            static const char *const known[] = {"--threads", "--repeat", "--sizes", "--json", "--attention", "--llama",
                                                "--help", NULL};
            return bg_cli_unknown_option(cmd, f, known);
        }
    }

    bg_backend_params_t p = bg_cli_backend_params((int)threads);
    bg_backend_t *be;
    bg_status_t st = bg_backend_create("cpu", &p, &be);
    if (st != BG_OK)
        return bg_cli_status(cmd, st);
    bg__kb_t kb = {be, (int)repeat, json_array(), json_array()};
    int rc = 0;

    bg_cpu_isa_t isa = BG_CPU_ISA_DEFAULT;
    bg_cpu_isa(&isa); /* the backend's creation checked it */
    bg_blas_info_t blas;
    int have_blas = bg_blas_info(&blas) == BG_OK;
    printf("brigade bench kernels: backend %s, %d threads, median of %d runs; kernels %s, OpenBLAS core %s\n\n",
           be->ops->name, be->num_threads, kb.repeat, bg_cpu_isa_name(isa), have_blas ? blas.core : "?");
    if (natt || nll) {
        for (int a = 0; a < natt && !rc; a++)
            rc = bg__bench_attention(&kb, (int)att[a][0], (int)att[a][1], (int)att[a][2], (int)att[a][3]);
        for (int a = 0; a < nll && !rc; a++)
            rc = bg__bench_llama(&kb, ll[a]);
        json_t *root = json_pack("{s:s, s:s, s:i, s:i, s:o}", "backend", be->ops->name, "isa", bg_cpu_isa_name(isa),
                                 "threads", be->num_threads, "repeat", kb.repeat, "ops", kb.ops);
        json_decref(kb.gemms);
        if (!rc && json_path && json_dump_file(root, json_path, JSON_INDENT(2)) != 0)
            rc = bg_cli_fail(cmd, "cannot write JSON to %s", json_path);
        json_decref(root);
        bg_backend_destroy(be);
        return rc;
    }
    printf("GEMM (GFLOP/s)          m     n     k   backend  OpenBLAS   ratio\n");
    for (int s = 0; s < nsizes && !rc; s++)
        rc = bg__bench_gemm(&kb, "square", 0, 0, (int)sizes[s], (int)sizes[s], (int)sizes[s]);
    /* GPT shapes, B*T rows: qkv, fc, fc-proj forward; a weight gradient (A^T B) and an input gradient (A B^T) */
    static const struct {
        const char *label;
        int ta, tb, m, n, k;
    } gpt[] = {
        {"gpt qkv", 0, 0, 1024, 1536, 512}, {"gpt fc", 0, 0, 1024, 2048, 512}, {"gpt proj", 0, 0, 1024, 512, 2048},
        {"gpt fc", 0, 0, 4096, 2048, 512},  {"gpt dW", 1, 0, 512, 2048, 4096}, {"gpt dX", 0, 1, 4096, 512, 2048},
    };
    for (size_t g = 0; g < sizeof(gpt) / sizeof(gpt[0]) && !rc; g++)
        rc = bg__bench_gemm(&kb, gpt[g].label, gpt[g].ta, gpt[g].tb, gpt[g].m, gpt[g].n, gpt[g].k);

    printf("\nops (GPT-like sizes; GB/s = minimal bytes moved / time)\n");
    if (!rc) rc = bg__bench_op(&kb, BG_OP_LN, "layernorm_forward", 8, 512, 768, 12, 0);
    if (!rc) rc = bg__bench_op(&kb, BG_OP_LN_BWD, "layernorm_backward_in", 8, 512, 768, 12, 0);
    if (!rc) rc = bg__bench_op(&kb, BG_OP_GELU, "gelu_forward", 8, 512, 768, 12, 0);
    if (!rc) rc = bg__bench_op(&kb, BG_OP_GELU_BWD, "gelu_backward", 8, 512, 768, 12, 0);
    if (!rc) rc = bg__bench_op(&kb, BG_OP_SOFTMAX, "causal_softmax_forward", 4, 256, 768, 12, 0);
    if (!rc) rc = bg__bench_op(&kb, BG_OP_CE, "crossentropy_forward", 1, 256, 768, 12, 50257);
    if (!rc) rc = bg__bench_op(&kb, BG_OP_ATTN, "attention fwd+bwd", 4, 256, 768, 12, 0);
    static const long long llama_shape[6] = {4, 256, 4, 3, 64, 2048}; /* d_model 768, 12 query heads */
    if (!rc) rc = bg__bench_llama(&kb, llama_shape);

    json_t *root = json_pack("{s:s, s:i, s:i, s:o, s:o}", "backend", be->ops->name, "threads", be->num_threads,
                             "repeat", kb.repeat, "gemm", kb.gemms, "ops", kb.ops);
    if (!rc)
        rc = bg__bench_gpt_training(&kb, root);
    if (!rc && json_path && json_dump_file(root, json_path, JSON_INDENT(2)) != 0) {
        bg_cli_fail(cmd, "cannot write JSON to %s", json_path);
        rc = 1;
    }
    json_decref(root);
    bg_backend_destroy(be);
    return rc;
}
