/* tests/kernels/test_conformance.c: every op of the kernel table on one
 * backend against the CPU backend, the reference that test_kernels checks
 * against double-precision formulas and finite differences.
 *
 *   test_conformance cuda        the CUDA backend against the CPU (fp32
 *                                tolerances; GEMM again with tf32 and bf16
 *                                tensor cores, looser); exit 77 (CTest: skipped) with
 *                                the reason on stdout when it is not compiled
 *                                in or no device is present
 *   test_conformance cpu         the CPU backend on 2 threads against 1 thread:
 *                                bitwise (the CPU's promise), then
 *   test_conformance cuda-emu    (test_conformance_emu only) the CUDA kernels of
 *                                kernels/cuda/cuda_kernels.cu run on the CPU by
 *                                tests/bg_cuda_emu.h, against the CPU backend
 *                                (fp32 tolerances): no GPU needed
 *   test_conformance --selftest  the harness against deliberately broken ops:
 *                                an unwritten element, an assignment where the
 *                                op accumulates, a 1e-4 error in GEMM must each
 *                                fail at the fp32 tolerances.
 *
 * Each case draws fresh random inputs (the seed is printed; BRIGADE_TEST_SEED
 * repeats a run), runs once on the reference and once on the candidate with
 * identical inputs, poisons assigned outputs with NaN before the run (an
 * element an op fails to write stays NaN), starts accumulated outputs from
 * random values (an op that assigns instead is caught), and compares every
 * output by the normalised error max|got - ref| / max|ref| against the case's
 * tolerance (NaN where the reference is finite is an infinite error). Sizes are
 * odd and span several tiles (attention T > 32, head sizes 24, 64, 128, 160). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "brigade/backend.h"
#include "brigade/core.h"

#define SKIP 77
#define MAXOUT 6
#define MAXBUF 16

/* Under AddressSanitizer the out-of-memory probe must get NULL, as it does
 * from the real allocators, instead of ASan's abort. */
const char *__asan_default_options(void) __attribute__((used));
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* tests/kernels/cuda_emu_backend.cc, linked into test_conformance_emu only */
bg_backend_t *bg_test_cuda_emu_backend(void) __attribute__((weak));
int bg_test_cuda_emu_errors(void) __attribute__((weak));

/* ------------------------------------------------------------- one run */

typedef struct {
    bg_backend_t *be;
    uint64_t seed;
    int slot; /* inputs drawn so far: the same sequence on both runs */
    struct {
        void *dev;
        size_t n;
    } out[MAXOUT];
    int nout;
    void *buf[MAXBUF];
    int nbuf;
    double scalar;
    int has_scalar;
} run_t;

typedef struct {
    float *out[MAXOUT];
    size_t n[MAXOUT];
    int nout;
    double scalar;
    int has_scalar;
} result_t;

static void die(const char *fmt, const char *a)
{
    printf("test_conformance: ");
    printf(fmt, a);
    printf("\n");
    exit(1);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        die("out of host memory%s", "");
    return p;
}

static void *dev_alloc(run_t *r, size_t bytes)
{
    if (r->nbuf == MAXBUF)
        die("more than MAXBUF buffers in one case%s", "");
    void *d = bg_backend_alloc(r->be, bytes, "conformance buffer");
    if (!d)
        die("%s", bg_last_error());
    r->buf[r->nbuf++] = d;
    return d;
}

static bg_rng_t next_rng(run_t *r)
{
    bg_rng_t g;
    bg_rng_seed(&g, r->seed * 1000003u + (uint64_t)r->slot++);
    return g;
}

/* kinds of random data */
enum { NORMAL, POSITIVE, WIDE };

static float *host_rand(run_t *r, size_t n, int kind)
{
    bg_rng_t g = next_rng(r);
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double x = bg_rng_normal(&g);
        h[i] = (float)(kind == POSITIVE ? 0.5 + bg_rng_uniform(&g) : kind == WIDE ? 6.0 * x : x);
    }
    return h;
}

static float *upload(run_t *r, float *h, size_t n)
{
    float *d = dev_alloc(r, n * sizeof(float));
    r->be->ops->from_host(r->be, d, h, n * sizeof(float));
    free(h);
    return d;
}

/* an input */
static float *in_k(run_t *r, size_t n, int kind) { return upload(r, host_rand(r, n, kind), n); }
static float *in(run_t *r, size_t n) { return in_k(r, n, NORMAL); }

static void track(run_t *r, void *d, size_t n)
{
    if (r->nout == MAXOUT)
        die("more than MAXOUT outputs in one case%s", "");
    r->out[r->nout].dev = d;
    r->out[r->nout].n = n;
    r->nout++;
}

/* an assigned output: NaN until the op writes it */
static float *out(run_t *r, size_t n)
{
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    float *d = upload(r, h, n);
    track(r, d, n);
    return d;
}

/* scratch the op may use: NaN, not compared */
static float *scratch(run_t *r, size_t n)
{
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = NAN;
    return upload(r, h, n);
}

/* an accumulated (or in-place) output: random start values */
static float *acc_k(run_t *r, size_t n, int kind)
{
    float *d = in_k(r, n, kind);
    track(r, d, n);
    return d;
}
static float *acc(run_t *r, size_t n) { return acc_k(r, n, NORMAL); }

static int32_t *tokens(run_t *r, size_t n, int range)
{
    bg_rng_t g = next_rng(r);
    int32_t *h = xmalloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        h[i] = (int32_t)bg_rng_below(&g, (uint64_t)range);
    int32_t *d = dev_alloc(r, n * sizeof(int32_t));
    r->be->ops->from_host(r->be, d, h, n * sizeof(int32_t));
    free(h);
    return d;
}

/* ---------------------------------------------------------------- cases */

#define OPS (r->be->ops)
#define BE (r->be)

static void c_fill(run_t *r) { OPS->fill(BE, out(r, 1001), 0.37f, 1001); }
static void c_copy(run_t *r)
{
    float *x = in(r, 1001);
    OPS->copy(BE, out(r, 1001), x, 1001);
}
static void c_scale(run_t *r) { OPS->scale(BE, acc(r, 1001), -1.7f, 1001); }
static void c_axpy(run_t *r)
{
    float *x = in(r, 1001);
    OPS->axpy(BE, acc(r, 1001), 0.6f, x, 1001);
}
static void c_residual(run_t *r)
{
    float *a = in(r, 1001), *b = in(r, 1001);
    OPS->residual_forward(BE, out(r, 1001), a, b, 1001);
}
/* fp32 -> bf16 (1000 values: 500 floats of bf16 pairs, compared as their bits' floats, all finite for
 * these inputs) and the round trip back to fp32; WIDE data crosses binades, so carries are exercised */
static void c_to_bf16(run_t *r)
{
    float *x = in_k(r, 1000, WIDE);
    OPS->convert(BE, out(r, 500), BG_BF16, x, BG_F32, 1000);
}
static void c_bf16_round_trip(run_t *r)
{
    float *x = in_k(r, 1001, WIDE), *h = scratch(r, 501);
    OPS->convert(BE, h, BG_BF16, x, BG_F32, 1001);
    OPS->convert(BE, out(r, 1001), BG_F32, h, BG_BF16, 1001);
}

/* C (m,n) in an ldc = n + 3 buffer: the padding must stay untouched */
static void gemm_case(run_t *r, int ta, int tb, float beta, int k)
{
    int m = 33, n = 47, lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
    float *a = in(r, (size_t)(ta ? k : m) * lda + 1), *b = in(r, (size_t)(tb ? n : k) * ldb + 1);
    float *c = beta == 0.0f ? out(r, (size_t)m * ldc) : acc(r, (size_t)m * ldc);
    OPS->gemm(BE, ta, tb, m, n, k, 0.9f, a, lda, b, ldb, beta, c, ldc);
}
static void c_gemm_nn(run_t *r) { gemm_case(r, 0, 0, 0.0f, 29); }
static void c_gemm_nt(run_t *r) { gemm_case(r, 0, 1, 0.0f, 29); }
static void c_gemm_tn(run_t *r) { gemm_case(r, 1, 0, 0.0f, 29); }
static void c_gemm_tt(run_t *r) { gemm_case(r, 1, 1, 0.0f, 29); }
static void c_gemm_beta(run_t *r) { gemm_case(r, 0, 1, 0.5f, 300); }
static void c_gemm_k0(run_t *r) { gemm_case(r, 0, 0, 0.5f, 0); }
static void c_gemm_batched(run_t *r)
{
    int m = 19, n = 23, k = 17, batch = 3;
    float *a = in(r, (size_t)batch * k * m), *b = in(r, (size_t)batch * k * n);
    float *c = out(r, (size_t)batch * m * n);
    OPS->gemm_strided_batched(BE, 1, 0, m, n, k, 1.1f, a, m, (long long)k * m, b, n, (long long)k * n, 0.0f, c, n,
                              (long long)m * n, batch);
}

enum { N_ = 37, C_ = 67 };
static void c_bias_fwd(run_t *r)
{
    float *b = in(r, C_);
    OPS->bias_forward(BE, acc(r, N_ * C_), b, N_, C_);
}
static void c_bias_bwd(run_t *r)
{
    float *d = in(r, N_ * C_);
    OPS->bias_backward(BE, acc(r, C_), d, N_, C_);
}
static void c_gelu_fwd(run_t *r)
{
    float *x = in_k(r, 1001, WIDE);
    OPS->gelu_forward(BE, out(r, 1001), x, 1001);
}
static void c_gelu_bwd(run_t *r)
{
    float *x = in_k(r, 1001, WIDE), *d = in(r, 1001);
    OPS->gelu_backward(BE, out(r, 1001), x, d, 1001);
}
/* the fused bias + GELU: on a backend without the slots (NULL), the pair it stands for (its contract) */
static void c_bias_gelu_fwd(run_t *r)
{
    float *b = in(r, C_), *pre = acc_k(r, N_ * C_, WIDE), *o = out(r, N_ * C_);
    if (OPS->bias_gelu_forward) {
        OPS->bias_gelu_forward(BE, pre, o, b, N_, C_);
    } else {
        OPS->bias_forward(BE, pre, b, N_, C_);
        OPS->gelu_forward(BE, o, pre, (size_t)N_ * C_);
    }
}
static void c_gelu_bias_bwd(run_t *r)
{
    float *x = in_k(r, N_ * C_, WIDE), *d = in(r, N_ * C_), *dx = out(r, N_ * C_), *db = acc(r, C_);
    if (OPS->gelu_bias_backward) {
        OPS->gelu_bias_backward(BE, dx, db, x, d, N_, C_);
    } else {
        OPS->gelu_backward(BE, dx, x, d, (size_t)N_ * C_);
        OPS->bias_backward(BE, db, dx, N_, C_);
    }
}
static void c_relu_fwd(run_t *r)
{
    float *x = in(r, 1001);
    OPS->relu_forward(BE, out(r, 1001), x, 1001);
}
static void c_relu_bwd(run_t *r)
{
    float *x = in(r, 1001), *d = in(r, 1001);
    OPS->relu_backward(BE, out(r, 1001), x, d, 1001);
}
static void c_ln_fwd(run_t *r)
{
    float *x = in_k(r, N_ * C_, WIDE), *w = in(r, C_), *b = in(r, C_);
    OPS->layernorm_forward(BE, out(r, N_ * C_), out(r, N_), out(r, N_), x, w, b, N_, C_);
}
static void c_ln_bwd_in(run_t *r)
{
    float *d = in(r, N_ * C_), *x = in(r, N_ * C_), *w = in(r, C_), *m = in(r, N_), *s = in_k(r, N_, POSITIVE);
    OPS->layernorm_backward_input(BE, out(r, N_ * C_), d, x, w, m, s, N_, C_);
}
static void c_ln_bwd_w(run_t *r)
{
    float *d = in(r, N_ * C_), *x = in(r, N_ * C_), *m = in(r, N_), *s = in_k(r, N_, POSITIVE);
    OPS->layernorm_backward_weight(BE, acc(r, C_), acc(r, C_), d, x, m, s, N_, C_);
}
/* rows enough for several of the CUDA reductions' row slices (512 rows each) */
enum { NS_ = 1201 };
static void c_bias_bwd_tall(run_t *r)
{
    float *d = in(r, NS_ * C_);
    OPS->bias_backward(BE, acc(r, C_), d, NS_, C_);
}
static void c_ln_bwd_w_tall(run_t *r)
{
    float *d = in(r, NS_ * C_), *x = in(r, NS_ * C_), *m = in(r, NS_), *s = in_k(r, NS_, POSITIVE);
    OPS->layernorm_backward_weight(BE, acc(r, C_), acc(r, C_), d, x, m, s, NS_, C_);
}
static void c_softmax_fwd(run_t *r)
{
    float *x = in_k(r, N_ * C_, WIDE);
    OPS->softmax_forward(BE, out(r, N_ * C_), x, N_, C_);
}
static void c_softmax_bwd(run_t *r)
{
    float *d = in(r, N_ * C_), *o = in_k(r, N_ * C_, POSITIVE);
    OPS->softmax_backward(BE, out(r, N_ * C_), d, o, N_, C_);
}
enum { BH_ = 3, T_ = 41 };
static void c_causal_fwd(run_t *r)
{
    float *x = in_k(r, BH_ * T_ * T_, WIDE);
    OPS->causal_softmax_forward(BE, out(r, BH_ * T_ * T_), x, 0.3f, BH_, T_);
}
static void c_causal_fwd_inplace(run_t *r)
{
    float *x = acc_k(r, BH_ * T_ * T_, WIDE);
    OPS->causal_softmax_forward(BE, x, x, 0.3f, BH_, T_);
}
static void c_causal_bwd(run_t *r)
{
    float *d = in(r, BH_ * T_ * T_), *a = in_k(r, BH_ * T_ * T_, POSITIVE);
    OPS->causal_softmax_backward(BE, out(r, BH_ * T_ * T_), d, a, 0.3f, BH_, T_);
}
static void c_causal_bwd_inplace(run_t *r)
{
    float *a = in_k(r, BH_ * T_ * T_, POSITIVE), *d = acc(r, BH_ * T_ * T_);
    OPS->causal_softmax_backward(BE, d, d, a, 0.3f, BH_, T_);
}
enum { V_ = 301 };
static void c_ce_fwd(run_t *r)
{
    float *x = in_k(r, N_ * V_, WIDE);
    int32_t *t = tokens(r, N_, V_);
    OPS->crossentropy_forward(BE, out(r, N_), out(r, N_ * V_), x, t, N_, V_);
}
static void c_ce_bwd(run_t *r)
{
    float *p = in_k(r, N_ * V_, POSITIVE);
    int32_t *t = tokens(r, N_, V_);
    OPS->crossentropy_backward(BE, out(r, N_ * V_), p, t, 0.25f, N_, V_);
}
enum { B_ = 2, TT_ = 19, EV_ = 13 }; /* 38 rows over 13 tokens: repeats */
static void c_emb_fwd(run_t *r)
{
    int32_t *t = tokens(r, B_ * TT_, EV_);
    float *wte = in(r, EV_ * C_), *wpe = in(r, TT_ * C_);
    OPS->embedding_forward(BE, out(r, B_ * TT_ * C_), t, wte, wpe, B_, TT_, C_);
}
static void c_emb_fwd_nopos(run_t *r)
{
    int32_t *t = tokens(r, B_ * TT_, EV_);
    float *wte = in(r, EV_ * C_);
    OPS->embedding_forward(BE, out(r, B_ * TT_ * C_), t, wte, NULL, B_, TT_, C_);
}
static void c_emb_bwd(run_t *r)
{
    int32_t *t = tokens(r, B_ * TT_, EV_);
    float *d = in(r, B_ * TT_ * C_);
    OPS->embedding_backward(BE, acc(r, EV_ * C_), acc(r, TT_ * C_), d, t, B_, TT_, C_);
}
/* 135 rows over 700 tokens: several tokens per bucket of the CUDA kernel's row lists (token mod 256) */
static void c_emb_bwd_wide(run_t *r)
{
    int32_t *t = tokens(r, 3 * 45, 700);
    float *d = in(r, 3 * 45 * C_);
    OPS->embedding_backward(BE, acc(r, 700 * C_), NULL, d, t, 3, 45, C_);
}
enum { LB = 2, LT = 7, LNH = 3, LHS = 5, LC = LNH * LHS, LN = LB * LT * LC };
static void c_qkv_split(run_t *r)
{
    float *x = in(r, 3 * LN);
    OPS->qkv_split(BE, out(r, LN), out(r, LN), out(r, LN), x, LB, LT, LNH, LHS);
}
static void c_qkv_merge(run_t *r)
{
    float *q = in(r, LN), *k = in(r, LN), *v = in(r, LN);
    OPS->qkv_merge(BE, out(r, 3 * LN), q, k, v, LB, LT, LNH, LHS);
}
static void c_heads_merge(run_t *r)
{
    float *y = in(r, LN);
    OPS->heads_merge(BE, out(r, LN), y, LB, LT, LNH, LHS);
}
static void c_heads_split(run_t *r)
{
    float *y = in(r, LN);
    OPS->heads_split(BE, out(r, LN), y, LB, LT, LNH, LHS);
}

static void att_fwd(run_t *r, int B, int T, int NH, int hs)
{
    size_t C = (size_t)NH * hs;
    float *qkv = in(r, (size_t)B * T * 3 * C);
    OPS->attention_forward(BE, out(r, (size_t)B * T * C), out(r, (size_t)B * NH * T), qkv, B, T, NH, hs);
}
static void att_bwd(run_t *r, int B, int T, int NH, int hs)
{
    size_t C = (size_t)NH * hs;
    float *qkv = in(r, (size_t)B * T * 3 * C), *dout = in(r, (size_t)B * T * C);
    float *o = out(r, (size_t)B * T * C), *lse = out(r, (size_t)B * NH * T);
    OPS->attention_forward(BE, o, lse, qkv, B, T, NH, hs);
    OPS->attention_backward(BE, out(r, (size_t)B * T * 3 * C), scratch(r, (size_t)B * NH * T), dout, qkv, o, lse, B,
                            T, NH, hs);
}
static void c_att_fwd24(run_t *r) { att_fwd(r, 2, 45, 3, 24); }
static void c_att_fwd64(run_t *r) { att_fwd(r, 1, 70, 2, 64); }
static void c_att_fwd160(run_t *r) { att_fwd(r, 1, 33, 1, 160); }
static void c_att_fwd128(run_t *r) { att_fwd(r, 1, 97, 1, 128); }
static void c_att_bwd24(run_t *r) { att_bwd(r, 2, 45, 3, 24); }
static void c_att_bwd64(run_t *r) { att_bwd(r, 1, 70, 2, 64); }
static void c_att_bwd160(run_t *r) { att_bwd(r, 1, 33, 1, 160); }
static void c_att_bwd128(run_t *r) { att_bwd(r, 1, 97, 1, 128); }

/* the Llama-style kernels: RMSNorm, SwiGLU, RoPE (3 groups of 2 query heads + key, hs 10, from position 5;
 * and its inverse in place), the grouped-query layout both ways */
static void c_rms_fwd(run_t *r)
{
    float *x = in_k(r, N_ * C_, WIDE), *w = in(r, C_);
    OPS->rmsnorm_forward(BE, out(r, N_ * C_), out(r, N_), x, w, 1e-5f, N_, C_);
}
static void c_rms_bwd_in(run_t *r)
{
    float *d = in(r, N_ * C_), *x = in(r, N_ * C_), *w = in(r, C_), *s = in_k(r, N_, POSITIVE);
    OPS->rmsnorm_backward_input(BE, out(r, N_ * C_), d, x, w, s, N_, C_);
}
static void c_rms_bwd_w(run_t *r)
{
    float *d = in(r, N_ * C_), *x = in(r, N_ * C_), *s = in_k(r, N_, POSITIVE);
    OPS->rmsnorm_backward_weight(BE, acc(r, C_), d, x, s, N_, C_);
}
static void c_rms_bwd_w_tall(run_t *r)
{
    float *d = in(r, NS_ * C_), *x = in(r, NS_ * C_), *s = in_k(r, NS_, POSITIVE);
    OPS->rmsnorm_backward_weight(BE, acc(r, C_), d, x, s, NS_, C_);
}
static void c_swiglu_fwd(run_t *r)
{
    float *x = in_k(r, N_ * 2 * C_, WIDE);
    OPS->swiglu_forward(BE, out(r, N_ * C_), x, N_, C_);
}
static void c_swiglu_bwd(run_t *r)
{
    float *x = in_k(r, N_ * 2 * C_, WIDE), *d = in(r, N_ * C_);
    OPS->swiglu_backward(BE, out(r, N_ * 2 * C_), x, d, N_, C_);
}
enum { RB_ = 2, RT_ = 9, RG_ = 3, Rg_ = 2, RHS_ = 10 };
static void c_rope(run_t *r)
{
    size_t n = (size_t)RB_ * RT_ * RG_ * (Rg_ + 2) * RHS_;
    float *x = in(r, n);
    OPS->rope(BE, out(r, n), x, RB_, RT_, RG_, Rg_ + 1, RHS_, 10000.0f, 5, 0);
}
static void c_rope_inverse(run_t *r)
{
    size_t n = (size_t)RB_ * RT_ * RG_ * (Rg_ + 2) * RHS_;
    float *x = in(r, n), *y = out(r, n);
    OPS->copy(BE, y, x, n);
    OPS->rope(BE, y, y, RB_, RT_, RG_, Rg_ + 1, RHS_, 500.0f, 0, 1);
}
static void c_gqa_expand(run_t *r)
{
    float *x = in(r, (size_t)RB_ * RT_ * RG_ * (Rg_ + 2) * RHS_);
    OPS->gqa_expand(BE, out(r, (size_t)RB_ * RT_ * 3 * RG_ * Rg_ * RHS_), x, RB_, RT_, RG_, Rg_, RHS_);
}
static void c_gqa_reduce(run_t *r)
{
    float *d = in(r, (size_t)RB_ * RT_ * 3 * RG_ * Rg_ * RHS_);
    OPS->gqa_reduce(BE, out(r, (size_t)RB_ * RT_ * RG_ * (Rg_ + 2) * RHS_), d, RB_, RT_, RG_, Rg_, RHS_);
}

static void c_adamw(run_t *r)
{
    float *g = in(r, 1001);
    OPS->adamw(BE, acc(r, 1001), g, acc(r, 1001), acc_k(r, 1001, POSITIVE), 1001, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
}
static void c_sgd(run_t *r)
{
    float *g = in(r, 1001);
    OPS->sgd_momentum(BE, acc(r, 1001), g, acc(r, 1001), 1001, 1e-2f, 0.9f, 0.1f);
}
static void c_sum(run_t *r)
{
    float *x = in(r, 100003);
    r->scalar = OPS->sum(BE, x, 100003);
    r->has_scalar = 1;
}
static void c_sumsq(run_t *r)
{
    float *x = in(r, 100003);
    r->scalar = OPS->sumsq(BE, x, 100003);
    r->has_scalar = 1;
}

/* fp32 tolerances of a candidate against the CPU: exact for data movement,
 * ~1e-6 elementwise (another expf), 1e-5 for reductions in another order */
typedef struct {
    const char *name;
    void (*run)(run_t *r);
    double tol;
} case_t;

static const case_t cases[] = {
    {"fill", c_fill, 0},
    {"copy", c_copy, 0},
    {"scale", c_scale, 0},
    {"axpy", c_axpy, 1e-6},
    {"residual_forward", c_residual, 0},
    {"convert fp32 -> bf16", c_to_bf16, 0},
    {"convert fp32 -> bf16 -> fp32", c_bf16_round_trip, 0},
    {"gemm (n,n)", c_gemm_nn, 1e-5},
    {"gemm (n,t)", c_gemm_nt, 1e-5},
    {"gemm (t,n)", c_gemm_tn, 1e-5},
    {"gemm (n,t) beta 0.5 k 300", c_gemm_beta, 1e-5},
    {"gemm (t,t)", c_gemm_tt, 1e-5},
    {"gemm k 0 beta 0.5", c_gemm_k0, 1e-6},
    {"gemm_strided_batched", c_gemm_batched, 1e-5},
    {"bias_forward", c_bias_fwd, 0},
    {"bias_backward", c_bias_bwd, 1e-6},
    {"bias_backward 1201 rows", c_bias_bwd_tall, 1e-6},
    {"gelu_forward", c_gelu_fwd, 2e-6},
    {"gelu_backward", c_gelu_bwd, 2e-6},
    {"bias_gelu_forward (or bias_forward + gelu_forward)", c_bias_gelu_fwd, 2e-6},
    {"gelu_bias_backward (or gelu_backward + bias_backward)", c_gelu_bias_bwd, 2e-6},
    {"relu_forward", c_relu_fwd, 0},
    {"relu_backward", c_relu_bwd, 0},
    {"layernorm_forward", c_ln_fwd, 1e-5},
    {"layernorm_backward_input", c_ln_bwd_in, 1e-5},
    {"layernorm_backward_weight", c_ln_bwd_w, 1e-6},
    {"layernorm_backward_weight 1201 rows", c_ln_bwd_w_tall, 1e-6},
    {"softmax_forward", c_softmax_fwd, 1e-5},
    {"softmax_backward", c_softmax_bwd, 1e-5},
    {"causal_softmax_forward", c_causal_fwd, 1e-5},
    {"causal_softmax_forward in place", c_causal_fwd_inplace, 1e-5},
    {"causal_softmax_backward", c_causal_bwd, 1e-5},
    {"causal_softmax_backward in place", c_causal_bwd_inplace, 1e-5},
    {"crossentropy_forward", c_ce_fwd, 1e-5},
    {"crossentropy_backward", c_ce_bwd, 1e-6},
    {"embedding_forward", c_emb_fwd, 0},
    {"embedding_forward (no wpe)", c_emb_fwd_nopos, 0},
    {"embedding_backward", c_emb_bwd, 1e-6},
    {"embedding_backward 700 tokens, no wpe", c_emb_bwd_wide, 1e-6},
    {"qkv_split", c_qkv_split, 0},
    {"qkv_merge", c_qkv_merge, 0},
    {"heads_merge", c_heads_merge, 0},
    {"heads_split", c_heads_split, 0},
    {"attention_forward hs 24", c_att_fwd24, 2e-5},
    {"attention_forward hs 64", c_att_fwd64, 2e-5},
    {"attention_forward hs 160", c_att_fwd160, 2e-5},
    {"attention_forward hs 128", c_att_fwd128, 2e-5},
    {"attention_backward hs 24", c_att_bwd24, 5e-5},
    {"attention_backward hs 64", c_att_bwd64, 5e-5},
    {"attention_backward hs 160", c_att_bwd160, 5e-5},
    {"attention_backward hs 128", c_att_bwd128, 5e-5},
    {"rmsnorm_forward", c_rms_fwd, 1e-5},
    {"rmsnorm_backward_input", c_rms_bwd_in, 1e-5},
    {"rmsnorm_backward_weight", c_rms_bwd_w, 1e-6},
    {"rmsnorm_backward_weight 1201 rows", c_rms_bwd_w_tall, 1e-6},
    {"swiglu_forward", c_swiglu_fwd, 2e-6},
    {"swiglu_backward", c_swiglu_bwd, 2e-6},
    {"rope", c_rope, 1e-6},
    {"rope inverse in place", c_rope_inverse, 1e-6},
    {"gqa_expand", c_gqa_expand, 0},
    {"gqa_reduce", c_gqa_reduce, 1e-6},
    {"adamw", c_adamw, 1e-6},
    {"sgd_momentum", c_sgd, 1e-6},
    {"sum", c_sum, 1e-12},
    {"sumsq", c_sumsq, 1e-12},
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

/* ------------------------------------------------------------- harness */

static result_t run_case(bg_backend_t *be, const case_t *c, uint64_t seed)
{
    run_t r = {.be = be, .seed = seed};
    size_t live = be->mem.count;
    c->run(&r);
    be->ops->synchronize(be);
    result_t res = {.nout = r.nout, .scalar = r.scalar, .has_scalar = r.has_scalar};
    for (int i = 0; i < r.nout; i++) {
        res.n[i] = r.out[i].n;
        res.out[i] = xmalloc(r.out[i].n * sizeof(float));
        be->ops->to_host(be, res.out[i], r.out[i].dev, r.out[i].n * sizeof(float));
    }
    for (int i = 0; i < r.nbuf; i++)
        bg_backend_free(be, r.buf[i]);
    if (be->mem.count != live)
        die("a case leaked backend allocations (%s)", c->name);
    return res;
}

static void free_result(result_t *r)
{
    for (int i = 0; i < r->nout; i++)
        free(r->out[i]);
}

/* max|got - ref| / max|ref|; both NaN counts as equal (an element the op must
 * leave alone, such as GEMM's ldc padding), one NaN as infinite */
static double nerr(const float *got, const float *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) && isnan(got[i]))
            continue;
        double d = fabs((double)got[i] - (double)ref[i]);
        if (isnan(d) || isinf(d))
            return INFINITY;
        md = d > md ? d : md;
        mr = fabs(ref[i]) > mr ? fabs(ref[i]) : mr;
    }
    return md / (mr + 1e-30);
}

/* Runs every case on cand against ref with the tolerances scaled by
 * tol_scale (0: bitwise). Returns the number of failed cases; prints one line
 * per case when verbose (always for failures). */
static int conform(bg_backend_t *ref, bg_backend_t *cand, double tol_scale, uint64_t seed, int verbose,
                   const char *only)
{
    int failed = 0;
    for (size_t ci = 0; ci < NCASES; ci++) {
        const case_t *c = &cases[ci];
        if (only && !strstr(c->name, only))
            continue;
        uint64_t s = seed + ci;
        result_t a = run_case(ref, c, s), b = run_case(cand, c, s);
        double err = 0;
        for (int i = 0; i < a.nout; i++) {
            double e = nerr(b.out[i], a.out[i], a.n[i]);
            err = e > err ? e : err;
        }
        if (a.has_scalar) {
            double e = fabs(a.scalar - b.scalar) / (fabs(a.scalar) + 1e-30);
            err = isnan(e) ? INFINITY : e > err ? e : err;
        }
        double tol = c->tol * tol_scale;
        int ok = err <= tol;
        failed += !ok;
        if (verbose || !ok)
            printf("  %-34s %-4s normalised error %.3g (tolerance %.3g)\n", c->name, ok ? "ok" : "FAIL", err, tol);
        free_result(&a);
        free_result(&b);
    }
    return failed;
}

/* Attention on tensor cores (BRIGADE_CUDA_ATTN=tc: tf32 operands) against
 * the CPU at the tf32 GEMMs' tolerance, and taken where it should be: at
 * head size 64 its output differs from the CUDA-core kernels' (tf32
 * rounding), at 160 (above its limit) it is theirs, bitwise. */
static int attention_tc(bg_backend_t *ref, bg_backend_t *cand, uint64_t seed, int verbose)
{
    setenv("BRIGADE_CUDA_ATTN", "tc", 1);
    int failed = conform(ref, cand, 300.0, seed, verbose, "attention");
    static const int hs[2] = {64, 160};
    for (int k = 0; k < 2; k++) {
        const int B = 2, T = 37, NH = 2, C = NH * hs[k];
        size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
        float *qkv = bg_backend_alloc(cand, nq * 4, "qkv"), *o[2], *lse = bg_backend_alloc(cand, nl * 4, "lse");
        float *h = malloc(nq * 4), *got[2] = {malloc(no * 4), malloc(no * 4)};
        uint64_t st = seed ^ 0x7c;
        for (size_t i = 0; i < nq; i++)
            h[i] = (float)((st = st * 6364136223846793005ull + 1442695040888963407ull) >> 40) / (1 << 24) - 0.5f;
        cand->ops->from_host(cand, qkv, h, nq * 4);
        for (int tc = 0; tc < 2; tc++) {
            setenv("BRIGADE_CUDA_ATTN", tc ? "tc" : "simt", 1);
            o[tc] = bg_backend_alloc(cand, no * 4, "out");
            cand->ops->attention_forward(cand, o[tc], lse, qkv, B, T, NH, hs[k]);
            cand->ops->to_host(cand, got[tc], o[tc], no * 4);
            bg_backend_free(cand, o[tc]);
        }
        int same = !memcmp(got[0], got[1], no * 4), want_same = hs[k] > 128;
        if (same != want_same) {
            printf("  attention hs %d: the tensor-core path %s\n", hs[k],
                   want_same ? "differs from the CUDA-core kernels above its head-size limit"
                             : "gives the CUDA-core kernels' bits (was it taken?)");
            failed++;
        } else if (verbose) {
            printf("  attention hs %d: tensor cores %s\n", hs[k], want_same ? "not used (above 128)" : "used");
        }
        bg_backend_free(cand, qkv), bg_backend_free(cand, lse);
        free(h), free(got[0]), free(got[1]);
    }
    unsetenv("BRIGADE_CUDA_ATTN");
    printf("%s attention on tensor cores (tf32) against cpu: %d failed\n", cand->ops->name, failed);
    return failed;
}

static bg_backend_t *make(const char *name, int threads, int quiet_fail)
{
    bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
    p.num_threads = threads;
    p.set_blas_threads = 1;
    bg_backend_t *be = NULL;
    if (bg_backend_create(name, &p, &be) != BG_OK) {
        if (quiet_fail)
            return NULL;
        die("%s", bg_last_error());
    }
    return be;
}

/* ------------------------------------------------------ broken backends */

static void bad_relu(bg_backend_t *be, float *out, const float *in, size_t n) /* leaves the last element */
{
    float *h = xmalloc(n * sizeof(float));
    be->ops->to_host(be, h, in, n * sizeof(float));
    for (size_t i = 0; i + 1 < n; i++)
        h[i] = h[i] > 0 ? h[i] : 0;
    be->ops->from_host(be, out, h, (n - 1) * sizeof(float));
    free(h);
}

static const bg_backend_ops_t *good_ops;

static void bad_bias_bwd(bg_backend_t *be, float *dbias, const float *dout, int N, int C) /* assigns */
{
    good_ops->fill(be, dbias, 0.0f, (size_t)C);
    good_ops->bias_backward(be, dbias, dout, N, C);
}

static void bad_gemm(bg_backend_t *be, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc) /* 1e-4 relative error */
{
    good_ops->gemm(be, ta, tb, m, n, k, alpha * (1.0f + 1e-4f), a, lda, b, ldb, beta, c, ldc);
}

static int selftest(uint64_t seed, int verbose)
{
    bg_backend_t *ref = make("cpu", 1, 0), *bad = make("cpu", 1, 0);
    good_ops = bad->ops;
    static bg_backend_ops_t broken;
    broken = *bad->ops;
    broken.relu_forward = bad_relu;
    broken.bias_backward = bad_bias_bwd;
    broken.gemm = bad_gemm;
    bad->ops = &broken;
    static const char *const must_fail[] = {"relu_forward", "bias_backward", "gemm (n,n)"};
    int bad_count = 0;
    for (size_t i = 0; i < sizeof(must_fail) / sizeof(must_fail[0]); i++) {
        if (conform(ref, bad, 1.0, seed, verbose, must_fail[i]) == 0) {
            printf("selftest: the harness did not catch the broken %s\n", must_fail[i]);
            bad_count++;
        }
    }
    /* and the untouched ops of the same table pass */
    if (conform(ref, bad, 1.0, seed, 0, "relu_backward") || conform(ref, bad, 1.0, seed, 0, "attention_backward"))
        bad_count++, printf("selftest: a correct op failed\n");
    bad->ops = good_ops;
    bg_backend_destroy(ref);
    bg_backend_destroy(bad);
    return bad_count;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("usage: test_conformance cpu|cuda|--selftest\n");
        return 2;
    }
    const char *name = argv[1];
    int verbose = getenv("BRIGADE_TEST_VERBOSE") != NULL;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    long long s;
    if (bg_config_int("BRIGADE_TEST_SEED", &s) == BG_OK && s > 0)
        seed = (uint64_t)s;
    printf("test_conformance %s: seed %llu (BRIGADE_TEST_SEED=%llu repeats it)\n", name, (unsigned long long)seed,
           (unsigned long long)seed);
    if (!strcmp(name, "--selftest")) {
        int f = selftest(seed, verbose);
        printf("selftest: %s\n", f ? "FAILED" : "the harness catches every broken op");
        return f ? 1 : 0;
    }
    if (!strcmp(name, "cuda-emu")) { /* cuda_kernels.cu's kernels on the CPU (tests/bg_cuda_emu.h) */
        if (!bg_test_cuda_emu_backend) {
            printf("SKIP: this program was built without the CUDA emulation (no C++ compiler)\n");
            return SKIP;
        }
        bg_backend_t *emu = bg_test_cuda_emu_backend(), *ref = make("cpu", 1, 0);
        if (!emu)
            die("%s", bg_last_error());
        int failed = conform(ref, emu, 1.0, seed, verbose, NULL) + bg_test_cuda_emu_errors();
        printf("cuda kernels (emulated on the CPU) against cpu: %d failed\n", failed);
        failed += attention_tc(ref, emu, seed, verbose);
        bg_backend_destroy(emu);
        bg_backend_destroy(ref);
        return failed ? 1 : 0;
    }
    int compiled = 0;
    for (const char *const *n = bg_backend_names(); *n; n++)
        compiled |= !strcmp(*n, name);
    if (!compiled) {
        printf("SKIP: backend %s is not compiled into this build\n", name);
        return SKIP;
    }
    int is_cpu = !strcmp(name, "cpu");
    bg_backend_t *cand = make(name, is_cpu ? 2 : 0, 1);
    if (!cand) {
        printf("SKIP: backend %s cannot start here: %s\n", name, bg_last_error());
        return SKIP;
    }
    bg_backend_t *ref = make("cpu", 1, 0);
    /* the CPU promises bitwise results for any thread count: tolerance 0 */
    int failed = conform(ref, cand, is_cpu ? 0.0 : 1.0, seed, verbose, NULL);
    printf("%s against cpu: %d of %zu cases failed\n", name, failed, NCASES);
    /* out of memory: NULL, and the message names the buffer, the bytes asked and the bytes free */
    size_t huge = (size_t)1 << 50;
    char want[128];
    snprintf(want, sizeof(want), "%zu bytes asked for oom probe, ", huge);
    if (bg_backend_alloc(cand, huge, "oom probe") != NULL || !strstr(bg_last_error(), want) ||
        !strstr(bg_last_error(), " bytes free")) {
        printf("out-of-memory message lacks \"%s\" or \"bytes free\": %s\n", want, bg_last_error());
        failed++;
    } else {
        printf("out of memory: %s\n", bg_last_error());
    }
    bg_backend_destroy(cand);
    if (!is_cpu) {
        /* tf32 and bf16 tensor-core GEMMs (BRIGADE_CUDA_GEMM): looser, by
         * their unit roundoff (2^-11, 2^-8) against fp32's */
        static const struct {
            const char *math;
            double scale;
        } modes[] = {{"tf32", 300.0}, {"bf16", 2000.0}};
        for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
            setenv("BRIGADE_CUDA_GEMM", modes[i].math, 1);
            bg_backend_t *m = make(name, 0, 0);
            int f = conform(ref, m, modes[i].scale, seed, verbose, "gemm");
            printf("%s GEMM %s against cpu: %d failed\n", name, modes[i].math, f);
            failed += f;
            bg_backend_destroy(m);
        }
        unsetenv("BRIGADE_CUDA_GEMM");
        bg_backend_t *m = make(name, 0, 0);
        failed += attention_tc(ref, m, seed, verbose);
        bg_backend_destroy(m);
    }
    bg_backend_destroy(ref);
    return failed ? 1 : 0;
}
