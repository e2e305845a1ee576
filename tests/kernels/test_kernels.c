/* tests/kernels: every op of the CPU backend against a naive double-precision
 * reference written here, gradients against central finite differences in
 * double, attention against a naive causal attention, bitwise determinism
 * across thread counts, the counted allocator, the registry's errors, and the
 * process-wide settings the backend changes only when asked (OpenBLAS's thread
 * count, glibc's malloc thresholds).
 *
 * Buffers go through bg_backend_alloc + from_host/to_host, so the same checks
 * can later run against another backend. Tolerances are on the normalised
 * error max|got - ref| / (max|ref| + tiny). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <omp.h>
#include <cmocka.h>

#include <malloc.h>

#include "brigade/backend.h"
#include "brigade/core.h"
#include "brigade/cpu.h"
#include "kernels/backend_impl.h"
#include "kernels/cpu/cpu_impl.h"
#include "bg_test_capture.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* LeakSanitizer's tracer (ptrace at exit) crashes ("Tracer caught signal 11") in a process that ran AMX
 * code, as test_gemm_bf16 does on CPUs with AMX (oneDNN's bf16 matmul): leak detection is off for this
 * program; ASan's other checks stay on. */
const char *__asan_default_options(void) __attribute__((used));
const char *__asan_default_options(void) { return "detect_leaks=0"; }
/* Observed with the vectorised kernels (Xeon, AVX-512 path): elementwise and
 * row ops <= 1.6e-7, attention 1.5e-7 forward and 2.9e-7 against finite
 * differences (BRIGADE_TEST_VERBOSE=1 prints every error). */
#define TOL_EW 1e-6   /* elementwise and row ops */
#define TOL_GEMM 1e-5 /* GEMM */
#define TOL_ATT 1e-6  /* fused attention forward */
#define TOL_ATT_BWD 2e-6 /* fused attention backward against its closed form in double */
#define TOL_FD 2e-6   /* float kernel against double finite differences */

/* ------------------------------------------------------------- helpers */

/* set_blas_threads = 1: OpenBLAS single-threaded, the backend's threads over
 * the tiles (the configuration of docs/kernels.md and of the CLI). */
static bg_backend_t *mkbe_blas(int nt, int set_blas_threads)
{
    bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
    p.num_threads = nt;
    p.set_blas_threads = set_blas_threads;
    bg_backend_t *be = NULL;
    bg_status_t st = bg_backend_create("cpu", &p, &be);
    if (st != BG_OK)
        fail_msg("bg_backend_create(cpu): %s", bg_last_error());
    assert_int_equal(be->num_threads, nt);
    return be;
}

static bg_backend_t *mkbe(int nt) { return mkbe_blas(nt, 1); }

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static float *hrandn(bg_rng_t *rng, size_t n, double scale)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double r = bg_rng_normal(rng) * scale;
        if (fabs(r) < 1e-3 * scale)
            r = 1e-3 * scale; /* non-zero inputs */
        x[i] = (float)r;
    }
    return x;
}

static double *dcopy(const float *x, size_t n)
{
    double *d = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

/* device copy of a host array */
static float *up(bg_backend_t *be, const float *h, size_t n)
{
    float *d = bg_backend_alloc(be, n * sizeof(float), "test buffer");
    assert_non_null(d);
    if (h)
        be->ops->from_host(be, d, h, n * sizeof(float));
    return d;
}

static int32_t *upi(bg_backend_t *be, const int32_t *h, size_t n)
{
    int32_t *d = bg_backend_alloc(be, n * sizeof(int32_t), "test ints");
    assert_non_null(d);
    be->ops->from_host(be, d, h, n * sizeof(int32_t));
    return d;
}

/* host copy of a device array (caller frees) */
static float *down(bg_backend_t *be, const float *d, size_t n)
{
    float *h = xmalloc(n * sizeof(float));
    be->ops->synchronize(be);
    be->ops->to_host(be, h, d, n * sizeof(float));
    return h;
}

static double nerr(const float *got, const double *ref, size_t n)
{
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= md)) /* catches NaN */
            md = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > mr)
            mr = fabs(ref[i]);
    }
    return md / (mr + 1e-30);
}

#define CHECK_ERR(what, got, ref, n, tol)                                                          \
    do {                                                                                           \
        double e__ = nerr((got), (ref), (n));                                                      \
        if (getenv("BRIGADE_TEST_VERBOSE"))                                                        \
            printf("  %-50s normalised error %.3g (tolerance %.3g)\n", (what), e__, (double)(tol)); \
        if (!(e__ <= (tol)))                                                                       \
            fail_msg("%s: normalised error %.3g > %.3g (%s:%d)", (what), e__, (double)(tol),     \
                     __FILE__, __LINE__);                                                          \
    } while (0)

/* ------------------------------------------------------------------ GEMM */

static uint16_t ref_bf16(uint32_t u);
/* 1: the reference rounds A and B to bf16 first (a backend of precision bf16 with bf16 GEMMs) */
static int g_ref_bf16;
static double ref_in(float x)
{
    if (!g_ref_bf16)
        return x;
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (uint32_t)ref_bf16(u) << 16;
    memcpy(&x, &u, 4);
    return x;
}

/* C = alpha op(A) op(B) + beta C in double, row-major with leading dims */
static void ref_gemm(int ta, int tb, int m, int n, int k, double alpha, const float *a, int lda, const float *b,
                     int ldb, double beta, const float *c0, double *c, int ldc)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                double av = ref_in(ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]);
                double bv = ref_in(tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j]);
                s += av * bv;
            }
            c[(size_t)i * ldc + j] = alpha * s + (beta == 0 ? 0 : beta * c0[(size_t)i * ldc + j]);
        }
}

static void check_gemm_case(bg_backend_t *be, bg_rng_t *rng, int ta, int tb, int m, int n, int k, float beta, int pad,
                            int batch)
{
    int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    size_t arows = ta ? k : m, brows = tb ? n : k;
    long long sa = (long long)arows * lda + 5, sb = (long long)brows * ldb + 3, sc = (long long)m * ldc + 7;
    size_t na = (size_t)sa * batch, nb = (size_t)sb * batch, nc = (size_t)sc * batch;
    float *a = hrandn(rng, na, 1.0), *b = hrandn(rng, nb, 1.0), *c0 = hrandn(rng, nc, 1.0);
    const float SENT = 12345.0f;
    /* padding (outside the m x n window of each C) must not be written */
    for (size_t i = 0; i < nc; i++) {
        size_t bi = i / (size_t)sc, r = i % (size_t)sc;
        (void)bi;
        if (r >= (size_t)m * ldc || (int)(r % ldc) >= n)
            c0[i] = SENT;
        else if (beta == 0.0f)
            c0[i] = NAN; /* beta = 0 must not read C */
    }
    double *ref = xmalloc(nc * sizeof(double));
    for (size_t i = 0; i < nc; i++)
        ref[i] = c0[i];
    float alpha = 0.75f;
    for (int bi = 0; bi < batch; bi++)
        ref_gemm(ta, tb, m, n, k, alpha, a + bi * sa, lda, b + bi * sb, ldb, beta, c0 + bi * sc, ref + bi * sc, ldc);
    float *da = up(be, a, na), *db = up(be, b, nb), *dc = up(be, c0, nc);
    if (batch == 1)
        be->ops->gemm(be, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc);
    else
        be->ops->gemm_strided_batched(be, ta, tb, m, n, k, alpha, da, lda, sa, db, ldb, sb, beta, dc, ldc, sc, batch);
    float *c = down(be, dc, nc);
    char what[160];
    snprintf(what, sizeof(what), "gemm ta=%d tb=%d m=%d n=%d k=%d beta=%g pad=%d batch=%d", ta, tb, m, n, k, beta,
             pad, batch);
    for (size_t i = 0; i < nc; i++)
        if (ref[i] == SENT && c[i] != SENT)
            fail_msg("%s: padding element %zu overwritten (%g)", what, i, c[i]);
    CHECK_ERR(what, c, ref, nc, TOL_GEMM);
    bg_backend_free(be, da);
    bg_backend_free(be, db);
    bg_backend_free(be, dc);
    free(a), free(b), free(c0), free(c), free(ref);
}

static void test_gemm(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 1);
    static const int sizes[][3] = {{1, 1, 1}, {7, 13, 31}, {13, 1, 67}, {1, 31, 7}, {31, 67, 1}, {67, 7, 13},
                                   {129, 257, 67}, {33, 17, 1031}, {300, 7, 13}, {261, 300, 5}, {1100, 1040, 9}};
    for (size_t s = 0; s < NELEM(sizes); s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bt = 0; bt < 2; bt++)
                    check_gemm_case(be, &rng, ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], bt ? 1.0f : 0.0f,
                                    (int)(s % 3) * 3, 1);
    /* k = 0: C = beta C */
    check_gemm_case(be, &rng, 0, 0, 5, 7, 0, 1.0f, 2, 1);
    check_gemm_case(be, &rng, 1, 1, 5, 7, 0, 0.0f, 0, 1);
    bg_backend_destroy(be);
}

/* --precision bf16 on a CPU where oneDNN has a bf16 hardware path (AMX, AVX-512 BF16): every GEMM tile
 * multiplies A and B rounded to bf16 with fp32 accumulation, so it matches the double-precision product of
 * the rounded inputs to fp32's accumulation error (the same sizes, layouts, paddings and betas as
 * test_gemm), and its bits do not depend on the thread count. Skipped, with the reason, where the GEMMs
 * stay fp32 (probed: 1 + 2^-10 times 1 is 1 in bf16). */
static void test_gemm_bf16(void **state)
{
    (void)state;
    bg_backend_t *be[3];
    for (int t = 0; t < 3; t++) {
        bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
        p.num_threads = t + 1;
        p.set_blas_threads = 1;
        p.precision = BG_BF16;
        assert_int_equal(bg_backend_create("cpu", &p, &be[t]), BG_OK);
    }
    float one = 1.0f + 1.0f / 1024, x = 1.0f, r = 0;
    float *da = up(be[0], &one, 1), *db = up(be[0], &x, 1), *dc = up(be[0], &r, 1);
    be[0]->ops->gemm(be[0], 0, 0, 1, 1, 1, 1.0f, da, 1, db, 1, 0.0f, dc, 1);
    float *c = down(be[0], dc, 1);
    int active = c[0] == 1.0f;
    free(c);
    bg_backend_free(be[0], da), bg_backend_free(be[0], db), bg_backend_free(be[0], dc);
    if (!active) {
        print_message("skipped: this CPU's GEMMs stay fp32 under bf16 (oneDNN has no bf16 hardware path here, "
                      "or brigade was built without dnnl.h)\n");
        for (int t = 0; t < 3; t++)
            bg_backend_destroy(be[t]);
        skip();
    }
    bg_rng_t rng;
    bg_rng_seed(&rng, 11);
    g_ref_bf16 = 1;
    static const int sizes[][3] = {{1, 1, 1}, {7, 13, 31}, {13, 1, 67}, {67, 7, 13}, {129, 257, 67}, {33, 17, 1031},
                                   {261, 300, 5}, {1100, 1040, 9}};
    for (size_t s = 0; s < NELEM(sizes); s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                check_gemm_case(be[1], &rng, ta, tb, sizes[s][0], sizes[s][1], sizes[s][2],
                                (const float[]){0.0f, 1.0f, 0.5f}[s % 3], (int)(s % 2) * 3, s == 4 ? 3 : 1);
    g_ref_bf16 = 0;
    /* a batch whose B is one matrix for every product (stride 0: rounded once) gives the bits of one GEMM per
     * product */
    {
        int m = 70, n = 90, k = 40, nbat = 3;
        float *a = hrandn(&rng, (size_t)m * k * nbat, 1.0), *b = hrandn(&rng, (size_t)k * n, 1.0);
        float *xa = up(be[1], a, (size_t)m * k * nbat), *xb = up(be[1], b, (size_t)k * n);
        float *xc = bg_backend_alloc(be[1], (size_t)m * n * nbat * 4, "c"), *xs = bg_backend_alloc(be[1], (size_t)m * n * 4, "c1");
        be[1]->ops->gemm_strided_batched(be[1], 0, 1, m, n, k, 1.0f, xa, k, (long long)m * k, xb, k, 0, 0.0f, xc, n,
                                         (long long)m * n, nbat);
        float *cb = down(be[1], xc, (size_t)m * n * nbat);
        for (int i = 0; i < nbat; i++) {
            be[1]->ops->gemm(be[1], 0, 1, m, n, k, 1.0f, xa + (size_t)i * m * k, k, xb, k, 0.0f, xs, n);
            float *c1 = down(be[1], xs, (size_t)m * n);
            assert_memory_equal(c1, cb + (size_t)i * m * n, (size_t)m * n * 4);
            free(c1);
        }
        bg_backend_free(be[1], xa), bg_backend_free(be[1], xb), bg_backend_free(be[1], xc), bg_backend_free(be[1], xs);
        free(a), free(b), free(cb);
    }
    /* the same bits on 1, 2 and 3 threads (tiles of a shape-given size, one thread each) */
    int m = 700, n = 600, k = 300;
    float *a = hrandn(&rng, (size_t)m * k, 1.0), *b = hrandn(&rng, (size_t)k * n, 1.0), *out[3];
    for (int t = 0; t < 3; t++) {
        float *xa = up(be[t], a, (size_t)m * k), *xb = up(be[t], b, (size_t)k * n);
        float *xc = bg_backend_alloc(be[t], (size_t)m * n * 4, "c");
        be[t]->ops->gemm(be[t], 1, 0, m, n, k, 1.0f, xa, m, xb, n, 0.0f, xc, n);
        out[t] = down(be[t], xc, (size_t)m * n);
        bg_backend_free(be[t], xa), bg_backend_free(be[t], xb), bg_backend_free(be[t], xc);
    }
    assert_memory_equal(out[0], out[1], (size_t)m * n * 4);
    assert_memory_equal(out[0], out[2], (size_t)m * n * 4);
    for (int t = 0; t < 3; t++)
        free(out[t]), bg_backend_destroy(be[t]);
    free(a), free(b);
}

static void test_gemm_batched(void **state)
{
    (void)state;
    bg_rng_t rng;
    bg_rng_seed(&rng, 2);
    for (int nt = 1; nt <= 2; nt++) {
        bg_backend_t *be = mkbe(nt);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                check_gemm_case(be, &rng, ta, tb, 7, 13, 5, 0.0f, 1, 3);    /* small: batch across threads */
                check_gemm_case(be, &rng, ta, tb, 13, 7, 31, 1.0f, 0, 5);
                check_gemm_case(be, &rng, ta, tb, 1, 1, 1, 1.0f, 0, 2);
            }
        check_gemm_case(be, &rng, 0, 1, 131, 129, 131, 1.0f, 2, 2); /* large: threads inside each GEMM */
        check_gemm_case(be, &rng, 1, 0, 131, 129, 131, 0.0f, 0, 3);
        bg_backend_destroy(be);
    }
}

/* ----------------------------------------------------------- elementwise */

static void test_elementwise(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 3);
    static const size_t ns[] = {1, 7, 67, 100003};
    for (size_t s = 0; s < NELEM(ns); s++) {
        size_t n = ns[s];
        float *x = hrandn(&rng, n, 1.0), *y = hrandn(&rng, n, 1.0);
        double *ref = xmalloc(n * sizeof(double));
        float *dx = up(be, x, n), *dy = up(be, y, n), *dz = up(be, NULL, n), *h;

        be->ops->fill(be, dz, -2.5f, n);
        h = down(be, dz, n);
        for (size_t i = 0; i < n; i++)
            ref[i] = -2.5;
        CHECK_ERR("fill", h, ref, n, 0.0);
        free(h);

        be->ops->copy(be, dz, dx, n);
        h = down(be, dz, n);
        assert_memory_equal(h, x, n * sizeof(float));
        free(h);

        be->ops->scale(be, dz, 0.3f, n);
        h = down(be, dz, n);
        for (size_t i = 0; i < n; i++)
            ref[i] = 0.3 * x[i];
        CHECK_ERR("scale", h, ref, n, TOL_EW);
        free(h);

        be->ops->axpy(be, dz, -1.7f, dy, n); /* z = 0.3x - 1.7y */
        h = down(be, dz, n);
        for (size_t i = 0; i < n; i++)
            ref[i] = 0.3 * x[i] - 1.7 * y[i];
        CHECK_ERR("axpy", h, ref, n, TOL_EW);
        free(h);

        be->ops->residual_forward(be, dz, dx, dy, n);
        h = down(be, dz, n);
        for (size_t i = 0; i < n; i++)
            ref[i] = (double)x[i] + y[i];
        CHECK_ERR("residual_forward", h, ref, n, TOL_EW);
        free(h);

        bg_backend_free(be, dx), bg_backend_free(be, dy), bg_backend_free(be, dz);
        free(x), free(y), free(ref);
    }
    bg_backend_destroy(be);
}

/* ------------------------------------------------------------------ bias */

static void test_bias(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 4);
    static const int sz[][2] = {{1, 1}, {7, 13}, {31, 1}, {129, 257}, {1, 67}};
    for (size_t s = 0; s < NELEM(sz); s++) {
        int N = sz[s][0], C = sz[s][1];
        size_t nc = (size_t)N * C;
        float *out = hrandn(&rng, nc, 1.0), *bias = hrandn(&rng, C, 1.0), *db0 = hrandn(&rng, C, 1.0);
        double *ref = xmalloc(nc * sizeof(double));
        float *dout = up(be, out, nc), *dbias = up(be, bias, C), *ddb = up(be, db0, C);
        be->ops->bias_forward(be, dout, dbias, N, C);
        float *h = down(be, dout, nc);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)
                ref[(size_t)n * C + c] = (double)out[(size_t)n * C + c] + bias[c];
        CHECK_ERR("bias_forward", h, ref, nc, TOL_EW);
        free(h);
        /* backward accumulates onto db0, summing dout = out (the original values) */
        be->ops->from_host(be, dout, out, nc * sizeof(float));
        be->ops->bias_backward(be, ddb, dout, N, C);
        h = down(be, ddb, C);
        for (int c = 0; c < C; c++) {
            double s2 = db0[c];
            for (int n = 0; n < N; n++)
                s2 += out[(size_t)n * C + c];
            ref[c] = s2;
        }
        CHECK_ERR("bias_backward (accumulate)", h, ref, C, TOL_EW);
        free(h);
        bg_backend_free(be, dout), bg_backend_free(be, dbias), bg_backend_free(be, ddb);
        free(out), free(bias), free(db0), free(ref);
    }
    bg_backend_destroy(be);
}

/* ----------------------------------------------------------- activations */

static double ref_gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* GELU of non-finite and huge inputs: NaN stays NaN (the exponential's
 * NaN path once shifted a signed int past its range: UBSan), and the tails
 * are the limits, not inf or NaN: forward x and 0, derivative 1 and 0 (the
 * backward once squared x = -1e30 to inf times 0). n = 19: vector and tail. */
/* fp32 -> bf16 by the definition, apart from the kernel's bit trick: the two bf16 values around x (its
 * truncation and the next one away from zero, whose value is computed in double, so the step past the
 * largest finite bf16 is 2^128, not infinity), the nearer, on a tie the one with an even last bit;
 * NaN: quiet, its sign and top payload bits kept (what docs/kernels.md promises); infinity stays. */
static uint16_t ref_bf16(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    if (isnan(x))
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7fc0u | ((u >> 16) & 0x3fu));
    if (isinf(x))
        return (uint16_t)(u >> 16);
    uint32_t lo = u & 0xffff0000u;
    float lof;
    memcpy(&lof, &lo, 4);
    int e = ((lo >> 23) & 0xff) ? (int)((lo >> 23) & 0xff) - 127 : -126; /* subnormals: 2^-126 scale */
    double step = ldexp(1.0, e - 7), dlo = fabs((double)x - (double)lof), dhi = fabs((double)lof + copysign(step, x) - (double)x);
    int up = dhi < dlo || (dhi == dlo && ((lo >> 16) & 1u));
    return (uint16_t)((lo >> 16) + (up ? 1u : 0u));
}

static void check_to_bf16(bg_backend_t *be, const uint32_t *bits, size_t n)
{
    uint16_t *got = xmalloc(n * sizeof(uint16_t));
    void *d32 = bg_backend_alloc(be, n * 4, "bf16 test in"), *d16 = bg_backend_alloc(be, n * 2, "bf16 test out");
    be->ops->from_host(be, d32, bits, n * 4);
    be->ops->convert(be, d16, BG_BF16, d32, BG_F32, n);
    be->ops->to_host(be, got, d16, n * 2);
    for (size_t i = 0; i < n; i++) {
        uint16_t want = ref_bf16(bits[i]);
        if (got[i] != want)
            fail_msg("fp32 0x%08x -> bf16 0x%04x, the nearest (ties to even) is 0x%04x", (unsigned)bits[i],
                     (unsigned)got[i], (unsigned)want);
    }
    bg_backend_free(be, d32);
    bg_backend_free(be, d16);
    free(got);
}

/* convert: fp32 -> bf16 against the definition above on the edge cases (ties both ways, the carry into
 * the exponent, the largest finite values and the step to infinity, subnormals rounding up to the
 * smallest normal, signalling NaNs that naive rounding turns into infinity) and on random bit patterns
 * of every class; bf16 -> fp32 on all 65536 values (exact: the bits shifted up); the same type copies. */
static void test_convert_bf16(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(3);
    static const uint32_t edge[] = {
        0x00000000u, 0x80000000u, 0x3f800000u, 0xbf800000u, 0x3f808000u /* tie, even: down */,
        0x3f818000u /* tie, odd: up */, 0x3f808001u, 0x3f807fffu, 0x3fffffffu /* carry: 2.0 */,
        0x7f7fffffu /* largest float: infinity */, 0x7f7f7fffu, 0x7f7f8000u /* tie, odd: infinity */,
        0xff7f8000u, 0x00000001u, 0x00008000u /* subnormal tie, even */, 0x00018000u, 0x007fffffu,
        0x807fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u /* signalling NaN */,
        0xff800001u, 0x7fffffffu, 0xffffffffu, 0x7f80ffffu};
    check_to_bf16(be, edge, NELEM(edge));
    size_t n = 200003; /* parallel path, odd */
    uint32_t *bits = xmalloc(n * 4);
    bg_rng_t g;
    bg_rng_seed(&g, 7);
    for (size_t i = 0; i < n; i++)
        bits[i] = (uint32_t)bg_rng_u64(&g);
    check_to_bf16(be, bits, n);
    uint16_t *all = xmalloc(65536 * 2);
    uint32_t *back = xmalloc(65536 * 4);
    for (uint32_t i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    void *d16 = bg_backend_alloc(be, 65536 * 2, "bf16"), *d32 = bg_backend_alloc(be, 65536 * 4, "fp32");
    be->ops->from_host(be, d16, all, 65536 * 2);
    be->ops->convert(be, d32, BG_F32, d16, BG_BF16, 65536);
    be->ops->to_host(be, back, d32, 65536 * 4);
    for (uint32_t i = 0; i < 65536; i++)
        if (back[i] != i << 16)
            fail_msg("bf16 0x%04x -> fp32 0x%08x, want 0x%08x", (unsigned)i, (unsigned)back[i], (unsigned)(i << 16));
    uint16_t *cp = xmalloc(65536 * 2);
    void *e16 = bg_backend_alloc(be, 65536 * 2, "bf16 copy");
    be->ops->convert(be, e16, BG_BF16, d16, BG_BF16, 65536);
    be->ops->to_host(be, cp, e16, 65536 * 2);
    assert_memory_equal(cp, all, 65536 * 2);
    bg_backend_free(be, d16);
    bg_backend_free(be, d32);
    bg_backend_free(be, e16);
    free(all);
    free(back);
    free(bits);
    free(cp);
    bg_backend_destroy(be);
}

static void test_gelu_nonfinite(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(1);
    enum { N = 19 };
    const float v[] = {NAN, -NAN, 1e30f, -1e30f, 1e19f, -1e19f, 0.0f, 3.0f, -3.0f};
    float x[N], g[N], out[N], din[N];
    for (int i = 0; i < N; i++)
        x[i] = v[i % (int)NELEM(v)], g[i] = 1.0f;
    float *dx = up(be, x, N), *dg = up(be, g, N), *dz = up(be, x, N);
    be->ops->gelu_forward(be, dz, dx, N);
    be->ops->synchronize(be);
    be->ops->to_host(be, out, dz, sizeof out);
    be->ops->gelu_backward(be, dz, dx, dg, N);
    be->ops->synchronize(be);
    be->ops->to_host(be, din, dz, sizeof din);
    for (int i = 0; i < N; i++) {
        if (isnan(x[i])) {
            if (!isnan(out[i]) || !isnan(din[i]))
                fail_msg("gelu(NaN) at %d: forward %g, backward %g", i, (double)out[i], (double)din[i]);
            continue;
        }
        double e = 1e-4, fd = (ref_gelu(x[i] + e) - ref_gelu(x[i] - e)) / (2 * e);
        double f = ref_gelu(x[i]), d = fabs(x[i]) > 100 ? (x[i] > 0) : fd;
        if (!isfinite(out[i]) || fabs(out[i] - f) > 1e-6 * fabs(f) + 1e-6)
            fail_msg("gelu(%g) = %g, expected %g", (double)x[i], (double)out[i], f);
        if (!isfinite(din[i]) || fabs(din[i] - d) > 1e-4)
            fail_msg("gelu'(%g) = %g, expected %g", (double)x[i], (double)din[i], d);
    }
    bg_backend_free(be, dx);
    bg_backend_free(be, dg);
    bg_backend_free(be, dz);
    bg_backend_destroy(be);
}

static void test_activations(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 5);
    static const size_t ns[] = {1, 13, 4099, 70001};
    for (size_t s = 0; s < NELEM(ns); s++) {
        size_t n = ns[s];
        float *x = hrandn(&rng, n, 2.0), *g = hrandn(&rng, n, 1.0), *pre = hrandn(&rng, n, 1.0);
        if (n > 2)
            x[0] = 12.0f, x[1] = -12.0f; /* saturated tanh */
        double *ref = xmalloc(n * sizeof(double));
        float *dx = up(be, x, n), *dg = up(be, g, n), *dz = up(be, pre, n), *h;

        be->ops->gelu_forward(be, dz, dx, n);
        h = down(be, dz, n);
        for (size_t i = 0; i < n; i++)
            ref[i] = ref_gelu(x[i]);
        CHECK_ERR("gelu_forward", h, ref, n, TOL_EW);
        free(h);

        be->ops->from_host(be, dz, pre, n * sizeof(float)); /* assigned: pre-filled junk must vanish */
        be->ops->gelu_backward(be, dz, dx, dg, n);
        h = down(be, dz, n);
        for (size_t i = 0; i < n; i++) {
            double e = 1e-5;
            ref[i] = (ref_gelu(x[i] + e) - ref_gelu(x[i] - e)) / (2 * e) * g[i];
        }
        CHECK_ERR("gelu_backward vs finite differences", h, ref, n, 1e-5);
        free(h);

        be->ops->relu_forward(be, dz, dx, n);
        h = down(be, dz, n);
        for (size_t i = 0; i < n; i++)
            ref[i] = x[i] > 0 ? x[i] : 0;
        CHECK_ERR("relu_forward", h, ref, n, 0.0);
        free(h);

        be->ops->from_host(be, dz, pre, n * sizeof(float));
        be->ops->relu_backward(be, dz, dx, dg, n);
        h = down(be, dz, n);
        for (size_t i = 0; i < n; i++)
            ref[i] = x[i] > 0 ? g[i] : 0;
        CHECK_ERR("relu_backward", h, ref, n, 0.0);
        free(h);

        bg_backend_free(be, dx), bg_backend_free(be, dg), bg_backend_free(be, dz);
        free(x), free(g), free(pre), free(ref);
    }
    bg_backend_destroy(be);
}

/* ------------------------------------------------------------- LayerNorm */

/* loss = sum(g * LN(x)) in double; also fills out/mean/rstd when non-NULL */
static double ref_ln(const double *x, const double *w, const double *b, const double *g, int N, int C, double *out,
                     double *mean, double *rstd)
{
    double loss = 0;
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        double mu = 0, var = 0;
        for (int c = 0; c < C; c++)
            mu += xr[c];
        mu /= C;
        for (int c = 0; c < C; c++)
            var += (xr[c] - mu) * (xr[c] - mu);
        var /= C;
        double r = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < C; c++) {
            double o = (xr[c] - mu) * r * w[c] + b[c];
            if (out)
                out[(size_t)n * C + c] = o;
            if (g)
                loss += g[(size_t)n * C + c] * o;
        }
        if (mean)
            mean[n] = mu;
        if (rstd)
            rstd[n] = r;
    }
    return loss;
}

/* central difference of f over v[i], in double */
#define FD(v, i, expr, out)                                                                        \
    do {                                                                                           \
        double s__ = (v)[i], e__ = 1e-6 * (fabs(s__) > 1 ? fabs(s__) : 1);                         \
        (v)[i] = s__ + e__;                                                                        \
        double p__ = (expr);                                                                       \
        (v)[i] = s__ - e__;                                                                        \
        double m__ = (expr);                                                                       \
        (v)[i] = s__;                                                                              \
        (out) = (p__ - m__) / (2 * e__);                                                           \
    } while (0)

static void test_layernorm(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 6);
    static const int sz[][2] = {{1, 1}, {1, 7}, {7, 13}, {13, 129}, {3, 67}};
    for (size_t s = 0; s < NELEM(sz); s++) {
        int N = sz[s][0], C = sz[s][1];
        size_t nc = (size_t)N * C;
        float *x = hrandn(&rng, nc, 2.0), *w = hrandn(&rng, C, 1.0), *b = hrandn(&rng, C, 1.0);
        float *g = hrandn(&rng, nc, 1.0), *junk = hrandn(&rng, nc, 1.0), *dw0 = hrandn(&rng, C, 1.0),
              *db0 = hrandn(&rng, C, 1.0);
        for (int c = 0; c < C; c++)
            x[c] += 3.0f; /* a row with a large mean */
        double *xd = dcopy(x, nc), *wd = dcopy(w, C), *bd = dcopy(b, C), *gd = dcopy(g, nc);
        double *ro = xmalloc(nc * sizeof(double)), *rm = xmalloc(N * sizeof(double)),
               *rr = xmalloc(N * sizeof(double));
        ref_ln(xd, wd, bd, gd, N, C, ro, rm, rr);

        float *dx = up(be, x, nc), *dw = up(be, w, C), *db = up(be, b, C), *dg = up(be, g, nc);
        float *dout = up(be, junk, nc), *dmean = up(be, NULL, N), *drstd = up(be, NULL, N);
        float *ddin = up(be, junk, nc), *ddw = up(be, dw0, C), *ddb = up(be, db0, C);
        be->ops->layernorm_forward(be, dout, dmean, drstd, dx, dw, db, N, C);
        float *h = down(be, dout, nc), *hm = down(be, dmean, N), *hr = down(be, drstd, N);
        CHECK_ERR("layernorm_forward out", h, ro, nc, TOL_EW);
        CHECK_ERR("layernorm_forward mean", hm, rm, N, TOL_EW);
        CHECK_ERR("layernorm_forward rstd", hr, rr, N, TOL_EW);
        free(h), free(hm), free(hr);

        /* input gradient: assigned over junk; FD per element */
        be->ops->layernorm_backward_input(be, ddin, dg, dx, dw, dmean, drstd, N, C);
        h = down(be, ddin, nc);
        double *ref = xmalloc(nc * sizeof(double));
        for (size_t i = 0; i < nc; i++) {
            size_t r0 = i / C * C;
            FD(xd, i, ref_ln(xd + r0, wd, bd, gd + r0, 1, C, NULL, NULL, NULL), ref[i]);
        }
        CHECK_ERR("layernorm_backward_input vs finite differences", h, ref, nc, TOL_FD);
        free(h);

        /* weight/bias gradients accumulate onto dw0/db0 */
        be->ops->layernorm_backward_weight(be, ddw, ddb, dg, dx, dmean, drstd, N, C);
        h = down(be, ddw, C);
        for (int c = 0; c < C; c++) {
            FD(wd, c, ref_ln(xd, wd, bd, gd, N, C, NULL, NULL, NULL), ref[c]);
            ref[c] += dw0[c];
        }
        CHECK_ERR("layernorm_backward_weight dweight (accumulate) vs FD", h, ref, C, TOL_FD);
        free(h);
        h = down(be, ddb, C);
        for (int c = 0; c < C; c++) {
            FD(bd, c, ref_ln(xd, wd, bd, gd, N, C, NULL, NULL, NULL), ref[c]);
            ref[c] += db0[c];
        }
        CHECK_ERR("layernorm_backward_weight dbias (accumulate) vs FD", h, ref, C, TOL_FD);
        free(h);

        bg_backend_free(be, dx), bg_backend_free(be, dw), bg_backend_free(be, db), bg_backend_free(be, dg);
        bg_backend_free(be, dout), bg_backend_free(be, dmean), bg_backend_free(be, drstd);
        bg_backend_free(be, ddin), bg_backend_free(be, ddw), bg_backend_free(be, ddb);
        free(x), free(w), free(b), free(g), free(junk), free(dw0), free(db0);
        free(xd), free(wd), free(bd), free(gd), free(ro), free(rm), free(rr), free(ref);
    }
    bg_backend_destroy(be);
}

/* ------------------------------------------------ RMSNorm and SwiGLU */

/* The Llama kernels (compiled per ISA) against their closed forms in double: RMSNorm forward, input gradient
 * (assigned over junk) and weight gradient (accumulated), SwiGLU forward and backward; inputs to +-40 (the
 * exponential's saturation). The outputs of one run, for the thread-count and ISA comparisons. */
enum { LL_N = 5, LL_C = 203 };
static void assert_same_bits(const char *what, const float *a, const float *b, size_t n);
static float *llama_run(bg_backend_t *be, int check)
{
    bg_rng_t rng;
    bg_rng_seed(&rng, 11);
    size_t nc = (size_t)LL_N * LL_C, n2 = 2 * nc, nout = 3 * nc + LL_N + LL_C + 2 * nc;
    float *x = hrandn(&rng, n2, 2.0), *w = hrandn(&rng, LL_C, 1.0), *g = hrandn(&rng, nc, 1.0);
    float *junk = hrandn(&rng, n2, 1.0), *dw0 = hrandn(&rng, LL_C, 1.0);
    x[0] = 40.0f, x[1] = -40.0f, x[LL_C + 2] = 30.0f, x[LL_C + 3] = -30.0f; /* gates of rows 0 and 1 */
    float *dx = up(be, x, n2), *dw = up(be, w, LL_C), *dg = up(be, g, nc), *dy = up(be, junk, nc);
    float *dr = up(be, NULL, LL_N), *ddin = up(be, junk, nc), *ddw = up(be, dw0, LL_C), *ds = up(be, junk, nc);
    float *dsb = up(be, junk, n2);
    /* RMSNorm of the first nc inputs as (N, C); SwiGLU of all 2 nc as (N, 2C) */
    be->ops->rmsnorm_forward(be, dy, dr, dx, dw, 1e-5f, LL_N, LL_C);
    be->ops->rmsnorm_backward_input(be, ddin, dg, dx, dw, dr, LL_N, LL_C);
    be->ops->rmsnorm_backward_weight(be, ddw, dg, dx, dr, LL_N, LL_C);
    be->ops->swiglu_forward(be, ds, dx, LL_N, LL_C);
    be->ops->swiglu_backward(be, dsb, dx, dg, LL_N, LL_C);
    float *h = xmalloc(nout * sizeof(float)), *p = h;
    float *part[] = {dy, ddin, ds, dr, ddw, dsb};
    size_t len[] = {nc, nc, nc, LL_N, LL_C, n2};
    for (size_t i = 0; i < NELEM(part); i++) {
        float *t = down(be, part[i], len[i]);
        memcpy(p, t, len[i] * sizeof(float));
        p += len[i];
        free(t);
    }
    if (check) {
        double *ro = xmalloc(nout * sizeof(double));
        double *ry = ro, *rdin = ry + nc, *rs = rdin + nc, *rr = rs + nc, *rdw = rr + LL_N, *rsb = rdw + LL_C;
        for (int c = 0; c < LL_C; c++)
            rdw[c] = dw0[c];
        for (int n = 0; n < LL_N; n++) {
            const float *xr = x + (size_t)n * LL_C, *gr = g + (size_t)n * LL_C;
            double ss = 0, dot = 0;
            for (int c = 0; c < LL_C; c++)
                ss += (double)xr[c] * xr[c];
            double r = 1.0 / sqrt(ss / LL_C + 1e-5);
            rr[n] = r;
            for (int c = 0; c < LL_C; c++) {
                ry[(size_t)n * LL_C + c] = xr[c] * r * w[c];
                dot += (double)w[c] * gr[c] * xr[c] * r;
                rdw[c] += (double)gr[c] * xr[c] * r;
            }
            for (int c = 0; c < LL_C; c++) /* d/dx of w x r: r (w g - xhat mean(w g xhat)) */
                rdin[(size_t)n * LL_C + c] = r * ((double)w[c] * gr[c] - xr[c] * r * dot / LL_C);
            const float *a = x + (size_t)n * 2 * LL_C, *b = a + LL_C;
            for (int i = 0; i < LL_C; i++) {
                double sg = 1.0 / (1.0 + exp(-(double)a[i])), gi = gr[i];
                rs[(size_t)n * LL_C + i] = a[i] * sg * b[i];
                rsb[(size_t)n * 2 * LL_C + i] = gi * b[i] * (sg + a[i] * sg * (1.0 - sg));
                rsb[(size_t)n * 2 * LL_C + LL_C + i] = gi * a[i] * sg;
            }
        }
        CHECK_ERR("rmsnorm_forward out", h, ry, nc, TOL_EW);
        CHECK_ERR("rmsnorm_backward_input (assigned)", h + nc, rdin, nc, TOL_FD);
        CHECK_ERR("swiglu_forward", h + 2 * nc, rs, nc, TOL_EW);
        CHECK_ERR("rmsnorm_forward rstd", h + 3 * nc, rr, LL_N, TOL_EW);
        CHECK_ERR("rmsnorm_backward_weight (accumulated)", h + 3 * nc + LL_N, rdw, LL_C, TOL_FD);
        CHECK_ERR("swiglu_backward (assigned)", h + 3 * nc + LL_N + LL_C, rsb, n2, TOL_FD);
        free(ro);
    }
    float *bufs[] = {dx, dw, dg, dy, dr, ddin, ddw, ds, dsb};
    for (size_t i = 0; i < NELEM(bufs); i++)
        bg_backend_free(be, bufs[i]);
    free(x), free(w), free(g), free(junk), free(dw0);
    return h;
}

static void test_llama_kernels(void **state)
{
    (void)state;
    bg_backend_t *be1 = mkbe(1), *be3 = mkbe(3);
    float *a = llama_run(be1, 1), *b = llama_run(be3, 1);
    assert_same_bits("llama kernels, 1 vs 3 threads", a, b, (size_t)5 * LL_N * LL_C + LL_N + LL_C);
    free(a), free(b);
    bg_backend_destroy(be1), bg_backend_destroy(be3);
}

/* --------------------------------------------------------------- softmax */

/* loss = sum over rows of g . softmax(scale x) (causal: over j <= i of row i of each T x T block) */
static double ref_softmax(const double *x, const double *g, double scale, int N, int C, int causal_T, int row0,
                          double *out)
{
    double loss = 0;
    for (int n = 0; n < N; n++) {
        int len = causal_T ? ((row0 + n) % causal_T) + 1 : C;
        const double *xr = x + (size_t)n * C;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < len; j++)
            mx = fmax(mx, scale * xr[j]);
        for (int j = 0; j < len; j++)
            s += exp(scale * xr[j] - mx);
        for (int j = 0; j < C; j++) {
            double p = j < len ? exp(scale * xr[j] - mx) / s : 0.0;
            if (out)
                out[(size_t)n * C + j] = p;
            if (g)
                loss += g[(size_t)n * C + j] * p;
        }
    }
    return loss;
}

static void test_softmax(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 7);
    static const int sz[][2] = {{1, 1}, {7, 13}, {3, 257}, {67, 31}};
    for (size_t s = 0; s < NELEM(sz); s++) {
        int N = sz[s][0], C = sz[s][1];
        size_t nc = (size_t)N * C;
        float *x = hrandn(&rng, nc, 3.0), *g = hrandn(&rng, nc, 1.0), *junk = hrandn(&rng, nc, 1.0);
        x[0] = 80.0f; /* exp overflows without max subtraction */
        double *xd = dcopy(x, nc), *gd = dcopy(g, nc), *ref = xmalloc(nc * sizeof(double)),
               *p = xmalloc(nc * sizeof(double));
        ref_softmax(xd, NULL, 1.0, N, C, 0, 0, p);
        float *dx = up(be, x, nc), *dg = up(be, g, nc), *dy = up(be, junk, nc), *dd = up(be, junk, nc);
        be->ops->softmax_forward(be, dy, dx, N, C);
        float *h = down(be, dy, nc);
        CHECK_ERR("softmax_forward", h, p, nc, TOL_EW);
        free(h);
        be->ops->softmax_backward(be, dd, dg, dy, N, C);
        h = down(be, dd, nc);
        for (size_t i = 0; i < nc; i++) { /* row-local: only row i/C depends on x[i] */
            size_t r0 = i / C * C;
            FD(xd, i, ref_softmax(xd + r0, gd + r0, 1.0, 1, C, 0, 0, NULL), ref[i]);
        }
        CHECK_ERR("softmax_backward vs FD", h, ref, nc, TOL_FD);
        free(h);
        bg_backend_free(be, dx), bg_backend_free(be, dg), bg_backend_free(be, dy), bg_backend_free(be, dd);
        free(x), free(g), free(junk), free(xd), free(gd), free(ref), free(p);
    }
    bg_backend_destroy(be);
}

static void test_causal_softmax(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 8);
    static const int sz[][2] = {{1, 1}, {3, 7}, {2, 13}, {5, 31}, {1, 131}};
    for (size_t s = 0; s < NELEM(sz); s++) {
        int BH = sz[s][0], T = sz[s][1];
        size_t n = (size_t)BH * T * T;
        float scale = 0.37f;
        float *x = hrandn(&rng, n, 3.0), *g = hrandn(&rng, n, 1.0), *junk = hrandn(&rng, n, 1.0);
        double *xd = dcopy(x, n), *gd = dcopy(g, n), *ref = xmalloc(n * sizeof(double)),
               *p = xmalloc(n * sizeof(double));
        ref_softmax(xd, NULL, scale, BH * T, T, T, 0, p);
        float *dx = up(be, x, n), *dg = up(be, g, n), *da = up(be, junk, n), *dd = up(be, junk, n);
        be->ops->causal_softmax_forward(be, da, dx, scale, BH, T);
        float *h = down(be, da, n);
        CHECK_ERR("causal_softmax_forward", h, p, n, TOL_EW);
        /* in place gives the same bits */
        be->ops->causal_softmax_forward(be, dx, dx, scale, BH, T);
        float *h2 = down(be, dx, n);
        assert_memory_equal(h, h2, n * sizeof(float));
        free(h), free(h2);

        be->ops->causal_softmax_backward(be, dd, dg, da, scale, BH, T);
        h = down(be, dd, n);
        for (size_t i = 0; i < n; i++) {
            size_t row = i / T;
            FD(xd, i, ref_softmax(xd + row * T, gd + row * T, scale, 1, T, T, (int)row, NULL), ref[i]);
        }
        CHECK_ERR("causal_softmax_backward vs FD", h, ref, n, TOL_FD);
        for (int r = 0; r < BH * T; r++)
            for (int j = r % T + 1; j < T; j++)
                assert_true(h[(size_t)r * T + j] == 0.0f);
        /* in place */
        be->ops->causal_softmax_backward(be, dg, dg, da, scale, BH, T);
        h2 = down(be, dg, n);
        assert_memory_equal(h, h2, n * sizeof(float));
        free(h), free(h2);
        bg_backend_free(be, dx), bg_backend_free(be, dg), bg_backend_free(be, da), bg_backend_free(be, dd);
        free(x), free(g), free(junk), free(xd), free(gd), free(ref), free(p);
    }
    bg_backend_destroy(be);
}

/* --------------------------------------------------------- cross-entropy */

static double ref_ce(const double *x, const int32_t *t, int N, int V, double *losses, double *probs)
{
    double total = 0;
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            mx = fmax(mx, xr[j]);
        for (int j = 0; j < V; j++)
            s += exp(xr[j] - mx);
        double l = log(s) - (xr[t[n]] - mx);
        if (losses)
            losses[n] = l;
        if (probs)
            for (int j = 0; j < V; j++)
                probs[(size_t)n * V + j] = exp(xr[j] - mx) / s;
        total += l;
    }
    return total;
}

static void test_crossentropy(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 9);
    static const int sz[][2] = {{1, 1}, {7, 13}, {31, 257}, {3, 1031}};
    for (size_t s = 0; s < NELEM(sz); s++) {
        int N = sz[s][0], V = sz[s][1];
        size_t nv = (size_t)N * V;
        float *x = hrandn(&rng, nv, 4.0), *junk = hrandn(&rng, nv, 1.0);
        int32_t *t = xmalloc(N * sizeof(int32_t));
        for (int n = 0; n < N; n++)
            t[n] = (int32_t)bg_rng_below(&rng, (uint64_t)V);
        if (V > 1) { /* target probability underflows in float: the loss must stay finite (about 200) */
            x[0] = 100.0f;
            t[0] = 1;
            x[1] = -100.0f;
        }
        double *xd = dcopy(x, nv), *rl = xmalloc(N * sizeof(double)), *rp = xmalloc(nv * sizeof(double)),
               *ref = xmalloc(nv * sizeof(double));
        ref_ce(xd, t, N, V, rl, rp);
        float *dx = up(be, x, nv), *dp = up(be, junk, nv), *dl = up(be, junk, N), *dd = up(be, junk, nv);
        int32_t *dt = upi(be, t, N);
        be->ops->crossentropy_forward(be, dl, dp, dx, dt, N, V);
        float *hl = down(be, dl, N), *hp = down(be, dp, nv);
        CHECK_ERR("crossentropy_forward losses", hl, rl, N, TOL_EW);
        CHECK_ERR("crossentropy_forward probs", hp, rp, nv, TOL_EW);
        free(hl), free(hp);
        float dloss = 0.3f;
        be->ops->crossentropy_backward(be, dd, dp, dt, dloss, N, V);
        float *h = down(be, dd, nv);
        for (size_t i = 0; i < nv; i++) {
            size_t row = i / V;
            FD(xd, i, ref_ce(xd + row * V, t + row, 1, V, NULL, NULL), ref[i]);
            ref[i] *= dloss;
        }
        CHECK_ERR("crossentropy_backward vs FD", h, ref, nv, TOL_FD);
        free(h);
        bg_backend_free(be, dx), bg_backend_free(be, dp), bg_backend_free(be, dl), bg_backend_free(be, dd);
        bg_backend_free(be, dt);
        free(x), free(junk), free(t), free(xd), free(rl), free(rp), free(ref);
    }
    bg_backend_destroy(be);
}

/* ------------------------------------------------------------- embedding */

static void test_embedding(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 10);
    static const int sz[][4] = {{1, 1, 1, 1}, {3, 13, 67, 5}, {2, 7, 129, 3}, {4, 31, 13, 97}}; /* B,T,C,V */
    for (size_t s = 0; s < NELEM(sz); s++) {
        int B = sz[s][0], T = sz[s][1], C = sz[s][2], V = sz[s][3];
        size_t btc = (size_t)B * T * C;
        int32_t *tok = xmalloc((size_t)B * T * sizeof(int32_t));
        for (int i = 0; i < B * T; i++)
            tok[i] = (int32_t)bg_rng_below(&rng, (uint64_t)V); /* repeats when V < B*T */
        float *wte = hrandn(&rng, (size_t)V * C, 1.0), *wpe = hrandn(&rng, (size_t)T * C, 1.0);
        float *g = hrandn(&rng, btc, 1.0), *junk = hrandn(&rng, btc, 1.0);
        double *ref = xmalloc((btc + (size_t)V * C) * sizeof(double));
        float *dwte = up(be, wte, (size_t)V * C), *dwpe = up(be, wpe, (size_t)T * C), *dout = up(be, junk, btc),
              *dg = up(be, g, btc);
        int32_t *dtok = upi(be, tok, (size_t)B * T);
        for (int withpe = 0; withpe < 2; withpe++) {
            be->ops->embedding_forward(be, dout, dtok, dwte, withpe ? dwpe : NULL, B, T, C);
            float *h = down(be, dout, btc);
            for (int r = 0; r < B * T; r++)
                for (int c = 0; c < C; c++)
                    ref[(size_t)r * C + c] =
                        (double)wte[(size_t)tok[r] * C + c] + (withpe ? wpe[(size_t)(r % T) * C + c] : 0.0);
            CHECK_ERR(withpe ? "embedding_forward" : "embedding_forward (no wpe)", h, ref, btc, TOL_EW);
            free(h);
        }
        /* backward accumulates onto the current contents (wte, wpe values) */
        be->ops->embedding_backward(be, dwte, dwpe, dg, dtok, B, T, C);
        float *h = down(be, dwte, (size_t)V * C);
        for (size_t i = 0; i < (size_t)V * C; i++)
            ref[i] = wte[i];
        for (int r = 0; r < B * T; r++)
            for (int c = 0; c < C; c++)
                ref[(size_t)tok[r] * C + c] += g[(size_t)r * C + c];
        CHECK_ERR("embedding_backward dwte (accumulate)", h, ref, (size_t)V * C, TOL_EW);
        free(h);
        h = down(be, dwpe, (size_t)T * C);
        for (size_t i = 0; i < (size_t)T * C; i++)
            ref[i] = wpe[i];
        for (int r = 0; r < B * T; r++)
            for (int c = 0; c < C; c++)
                ref[(size_t)(r % T) * C + c] += g[(size_t)r * C + c];
        CHECK_ERR("embedding_backward dwpe (accumulate)", h, ref, (size_t)T * C, TOL_EW);
        free(h);
        bg_backend_free(be, dwte), bg_backend_free(be, dwpe), bg_backend_free(be, dout), bg_backend_free(be, dg);
        bg_backend_free(be, dtok);
        free(tok), free(wte), free(wpe), free(g), free(junk), free(ref);
    }
    bg_backend_destroy(be);
}

/* ----------------------------------------------------- attention layouts */

static void test_layouts(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 11);
    static const int sz[][4] = {{1, 1, 1, 1}, {2, 7, 3, 5}, {3, 13, 4, 16}}; /* B,T,NH,hs */
    for (size_t s = 0; s < NELEM(sz); s++) {
        int B = sz[s][0], T = sz[s][1], NH = sz[s][2], hs = sz[s][3], C = NH * hs;
        size_t btc = (size_t)B * T * C;
        float *qkv = hrandn(&rng, 3 * btc, 1.0), *junk = hrandn(&rng, 3 * btc, 1.0);
        float *d = up(be, qkv, 3 * btc), *q = up(be, junk, btc), *k = up(be, junk, btc), *v = up(be, junk, btc),
              *back = up(be, junk, 3 * btc), *m = up(be, junk, btc), *sp = up(be, junk, btc);
        be->ops->qkv_split(be, q, k, v, d, B, T, NH, hs);
        float *hq = down(be, q, btc), *hk = down(be, k, btc), *hv = down(be, v, btc);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < NH; h++)
                    for (int e = 0; e < hs; e++) {
                        size_t src = ((size_t)b * T + t) * 3 * C + (size_t)h * hs + e;
                        size_t dst = (((size_t)b * NH + h) * T + t) * hs + e;
                        assert_true(hq[dst] == qkv[src]);
                        assert_true(hk[dst] == qkv[src + C]);
                        assert_true(hv[dst] == qkv[src + 2 * C]);
                    }
        be->ops->qkv_merge(be, back, q, k, v, B, T, NH, hs);
        float *hb = down(be, back, 3 * btc);
        assert_memory_equal(hb, qkv, 3 * btc * sizeof(float));
        /* heads_merge: out[b,t,h*hs+e] = y[b,h,t,e]; heads_split is its inverse */
        be->ops->heads_merge(be, m, q, B, T, NH, hs);
        float *hm = down(be, m, btc);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < NH; h++)
                    for (int e = 0; e < hs; e++)
                        assert_true(hm[((size_t)b * T + t) * C + (size_t)h * hs + e] ==
                                    hq[(((size_t)b * NH + h) * T + t) * hs + e]);
        be->ops->heads_split(be, sp, m, B, T, NH, hs);
        float *hs2 = down(be, sp, btc);
        assert_memory_equal(hs2, hq, btc * sizeof(float));
        free(hq), free(hk), free(hv), free(hb), free(hm), free(hs2);
        bg_backend_free(be, d), bg_backend_free(be, q), bg_backend_free(be, k), bg_backend_free(be, v);
        bg_backend_free(be, back), bg_backend_free(be, m), bg_backend_free(be, sp);
        free(qkv), free(junk);
    }
    bg_backend_destroy(be);
}

/* ------------------------------------------------------------ optimizers */

static void test_optimizers(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 12);
    static const size_t ns[] = {1, 31, 50001};
    for (size_t s = 0; s < NELEM(ns); s++) {
        size_t n = ns[s];
        float *p = hrandn(&rng, n, 1.0), *m = hrandn(&rng, n, 0.1), *v = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            v[i] = (float)bg_rng_uniform(&rng) * 0.01f + 1e-4f;
        double *rp = dcopy(p, n), *rm = dcopy(m, n), *rv = dcopy(v, n);
        float *dp = up(be, p, n), *dm = up(be, m, n), *dv = up(be, v, n), *dgr = up(be, NULL, n);
        const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
        for (int t = 1; t <= 3; t++) {
            float *g = hrandn(&rng, n, 1.0);
            be->ops->from_host(be, dgr, g, n * sizeof(float));
            be->ops->adamw(be, dp, dgr, dm, dv, n, lr, b1, b2, eps, wd, t);
            for (size_t i = 0; i < n; i++) {
                rm[i] = (double)b1 * rm[i] + (1 - (double)b1) * g[i];
                rv[i] = (double)b2 * rv[i] + (1 - (double)b2) * (double)g[i] * g[i];
                double mh = rm[i] / (1 - pow(b1, t)), vh = rv[i] / (1 - pow(b2, t));
                rp[i] -= lr * (mh / (sqrt(vh) + eps) + wd * rp[i]);
            }
            free(g);
        }
        float *h = down(be, dp, n);
        CHECK_ERR("adamw param", h, rp, n, TOL_EW);
        free(h);
        h = down(be, dm, n);
        CHECK_ERR("adamw m", h, rm, n, TOL_EW);
        free(h);
        h = down(be, dv, n);
        CHECK_ERR("adamw v", h, rv, n, TOL_EW);
        free(h);

        /* SGD with momentum, mom starts at m */
        be->ops->from_host(be, dp, p, n * sizeof(float));
        be->ops->from_host(be, dm, m, n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            rp[i] = p[i], rm[i] = m[i];
        for (int t = 1; t <= 3; t++) {
            float *g = hrandn(&rng, n, 1.0);
            be->ops->from_host(be, dgr, g, n * sizeof(float));
            be->ops->sgd_momentum(be, dp, dgr, dm, n, 0.05f, 0.9f, 0.01f);
            for (size_t i = 0; i < n; i++) {
                rm[i] = 0.9 * rm[i] + g[i] + 0.01 * rp[i];
                rp[i] -= 0.05 * rm[i];
            }
            free(g);
        }
        h = down(be, dp, n);
        CHECK_ERR("sgd_momentum param", h, rp, n, TOL_EW);
        free(h);
        h = down(be, dm, n);
        CHECK_ERR("sgd_momentum mom", h, rm, n, TOL_EW);
        free(h);
        bg_backend_free(be, dp), bg_backend_free(be, dm), bg_backend_free(be, dv), bg_backend_free(be, dgr);
        free(p), free(m), free(v), free(rp), free(rm), free(rv);
    }
    bg_backend_destroy(be);
}

/* ------------------------------------------------------------ reductions */

static void test_reductions(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 13);
    static const size_t ns[] = {1, 7, 4097, 1024 * 4096 + 4099}; /* last one spans two groups of blocks */
    for (size_t s = 0; s < NELEM(ns); s++) {
        size_t n = ns[s];
        float *x = hrandn(&rng, n, 1.0);
        for (size_t i = 0; i < n; i++)
            x[i] += 0.25f; /* non-zero mean */
        double rs = 0, rq = 0;
        for (size_t i = 0; i < n; i++)
            rs += x[i], rq += (double)x[i] * x[i];
        float *d = up(be, x, n);
        double gs = be->ops->sum(be, d, n), gq = be->ops->sumsq(be, d, n);
        if (!(fabs(gs - rs) <= 1e-10 * (fabs(rs) + 1)))
            fail_msg("sum n=%zu: %.17g vs %.17g", n, gs, rs);
        if (!(fabs(gq - rq) <= 1e-10 * (fabs(rq) + 1)))
            fail_msg("sumsq n=%zu: %.17g vs %.17g", n, gq, rq);
        bg_backend_free(be, d);
        free(x);
    }
    float *d = up(be, NULL, 1);
    assert_true(be->ops->sum(be, d, 0) == 0.0);
    bg_backend_free(be, d);
    bg_backend_destroy(be);
}

/* ------------------------------------------------------------- attention */

/* out (B,T,C) of naive causal attention on qkv (B,T,3C), in double; returns sum(g * out) */
static double ref_attention(const double *qkv, const double *g, int B, int T, int C, int NH, double *out)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs), loss = 0;
    double *w = xmalloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
                double mx = -INFINITY, s = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
                    double d = 0;
                    for (int e = 0; e < hs; e++)
                        d += q[e] * k[e];
                    w[j] = d * scale;
                    mx = fmax(mx, w[j]);
                }
                for (int j = 0; j <= t; j++)
                    s += (w[j] = exp(w[j] - mx));
                for (int e = 0; e < hs; e++) {
                    double y = 0;
                    for (int j = 0; j <= t; j++)
                        y += w[j] / s * qkv[((size_t)b * T + j) * 3 * C + 2 * C + (size_t)h * hs + e];
                    size_t o = ((size_t)b * T + t) * C + (size_t)h * hs + e;
                    if (out)
                        out[o] = y;
                    if (g)
                        loss += g[o] * y;
                }
            }
    free(w);
    return loss;
}

/* The closed-form backward of ref_attention in double: dqkv (B,T,3C) from dout = g (B,T,C).
 * For each query t: p = softmax(s), s_j = scale q.k_j; dv_j += p_j g; dp_j = g.v_j;
 * ds_j = p_j (dp_j - sum_k p_k dp_k); dq += scale sum_j ds_j k_j; dk_j += scale ds_j q. */
static void ref_attention_backward(const double *qkv, const double *g, int B, int T, int C, int NH, double *d)
{
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *p = xmalloc((size_t)T * sizeof(double)), *dp = xmalloc((size_t)T * sizeof(double));
    memset(d, 0, (size_t)B * T * 3 * C * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t qo = ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
                const double *q = qkv + qo, *gt = g + ((size_t)b * T + t) * C + (size_t)h * hs;
                double mx = -INFINITY, s = 0, pdp = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
                    double x = 0;
                    for (int e = 0; e < hs; e++)
                        x += q[e] * k[e];
                    p[j] = x * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= t; j++)
                    s += (p[j] = exp(p[j] - mx));
                for (int j = 0; j <= t; j++) {
                    size_t vo = ((size_t)b * T + j) * 3 * C + 2 * C + (size_t)h * hs;
                    double x = 0;
                    p[j] /= s;
                    for (int e = 0; e < hs; e++) {
                        x += gt[e] * qkv[vo + e];
                        d[vo + e] += p[j] * gt[e];
                    }
                    dp[j] = x;
                    pdp += p[j] * x;
                }
                for (int j = 0; j <= t; j++) {
                    size_t ko = ((size_t)b * T + j) * 3 * C + C + (size_t)h * hs;
                    double ds = p[j] * (dp[j] - pdp) * scale;
                    for (int e = 0; e < hs; e++) {
                        d[qo + e] += ds * qkv[ko + e];
                        d[ko + e] += ds * q[e];
                    }
                }
            }
    free(p), free(dp);
}

static void test_attention(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 14);
    /* B,T,C,NH: T = 70 spans 3 key tiles and 2 query tiles of the fused kernel;
     * C = 600, NH = 2 (head size 300) takes its large-head path; head size 72 spans three
     * 32-float column chunks of the blocked path with padding, T = 38 a partial row block;
     * head sizes 64 and 32 (whole 32-float chunks) read q, k, v and dO rows in place */
    static const int sz[][4] = {{1, 1, 1, 1},   {2, 7, 12, 3},  {1, 13, 10, 2}, {3, 5, 8, 1},   {2, 70, 12, 2},
                                {1, 5, 600, 2}, {1, 38, 72, 1}, {1, 38, 64, 1}, {1, 70, 64, 2}};
    for (size_t s = 0; s < NELEM(sz); s++) {
        int B = sz[s][0], T = sz[s][1], C = sz[s][2], NH = sz[s][3];
        size_t btc = (size_t)B * T * C;
        float *qkv = hrandn(&rng, 3 * btc, 1.0), *g = hrandn(&rng, btc, 1.0), *junk = hrandn(&rng, 3 * btc, 1.0);
        double *qd = dcopy(qkv, 3 * btc), *gd = dcopy(g, btc), *ro = xmalloc(btc * sizeof(double)),
               *ref = xmalloc(3 * btc * sizeof(double));
        ref_attention(qd, NULL, B, T, C, NH, ro);
        size_t nws = bg_attention_ws_floats(B, T, C, NH), nsc = bg_attention_scratch_floats(B, T, C, NH);
        assert_true(nws == (size_t)B * NH * T && nsc == (size_t)B * NH * T); /* no T x T buffer */
        float *dq = up(be, qkv, 3 * btc), *dout = up(be, junk, btc), *ws = up(be, NULL, nws),
              *sc = up(be, NULL, nsc), *dg = up(be, g, btc), *dd = up(be, junk, 3 * btc);
        be->ops->fill(be, ws, NAN, nws); /* every workspace float must be written before it is read */
        be->ops->fill(be, sc, NAN, nsc);
        bg_attention_forward(be, dout, ws, dq, B, T, C, NH);
        float *h = down(be, dout, btc);
        CHECK_ERR("attention forward vs naive causal attention", h, ro, btc, TOL_ATT);
        free(h);
        bg_attention_backward(be, dd, sc, dg, dq, dout, ws, B, T, C, NH);
        h = down(be, dd, 3 * btc);
        ref_attention_backward(qd, gd, B, T, C, NH, ref);
        CHECK_ERR("attention backward vs closed-form backward", h, ref, 3 * btc, TOL_ATT_BWD);
        /* finite differences of the naive forward at up to 192 inputs (every input of the small
         * cases; a random spread over q, k and v of the large ones, where all 3BTC would cost
         * minutes under the sanitizers) check the closed form and the kernel at once */
        size_t nfd = 3 * btc < 192 ? 3 * btc : 192;
        float *hs_ = xmalloc(nfd * sizeof(float));
        double *fd = xmalloc(nfd * sizeof(double));
        for (size_t f = 0; f < nfd; f++) {
            size_t i = nfd == 3 * btc ? f : (size_t)bg_rng_below(&rng, 3 * btc);
            FD(qd, i, ref_attention(qd, gd, B, T, C, NH, NULL), fd[f]);
            hs_[f] = h[i];
        }
        CHECK_ERR("attention backward vs finite differences", hs_, fd, nfd, TOL_FD);
        free(hs_), free(fd), free(h);
        bg_backend_free(be, dq), bg_backend_free(be, dout), bg_backend_free(be, ws), bg_backend_free(be, sc);
        bg_backend_free(be, dg), bg_backend_free(be, dd);
        free(qkv), free(g), free(junk), free(qd), free(gd), free(ro), free(ref);
    }
    bg_backend_destroy(be);
}

/* ------------------------------------------- grouped-query attention */

/* The fused grouped-query attention (gqa_attention_forward/backward) on the grouped layout against the
 * naive causal attention in double on the expanded layout (each key and value head repeated for its g query
 * heads, their gradients summed back), and against the backend's own expanded path (gqa_expand, the fused
 * attention, gqa_reduce): the same bits for the output, the logsumexp and dQ (each row's sums run in the
 * same order), dK and dV within the tolerance (summed over the group inside the kernel). Shapes: head size
 * 24 (padded), 64 over 3 key tiles, 128 with 17 heads in a group (the forward's passes split the group),
 * 160 (the large-head path). The outputs of one run (out, lse, dgrouped of each shape), for the thread-count
 * and ISA comparisons. */
static const int gqa_sz[][5] = {{2, 37, 2, 3, 24}, {1, 70, 3, 2, 64}, {1, 9, 1, 17, 128}, {1, 6, 2, 2, 160}};
static size_t gqa_floats(void)
{
    size_t n = 0;
    for (size_t s = 0; s < NELEM(gqa_sz); s++) {
        size_t BT = (size_t)gqa_sz[s][0] * gqa_sz[s][1], G = gqa_sz[s][2], g = gqa_sz[s][3], hs = gqa_sz[s][4];
        n += BT * G * g * hs + BT * G * g + BT * G * (g + 2) * hs;
    }
    return n;
}
static void gqa_check(bg_backend_t *be, const float *h, const float *x, const float *dy, int B, int T, int G, int g,
                      int hs)
{
    int NH = G * g, C = NH * hs, Cg = G * (g + 2) * hs;
    size_t BT = (size_t)B * T, btc = BT * C, ng = BT * Cg, nl = BT * NH;
    /* the expanded layout in double, and the backend's expanded path */
    double *qd = xmalloc(3 * btc * sizeof(double)), *gd = dcopy(dy, btc), *ro = xmalloc(btc * sizeof(double));
    double *rd = xmalloc(3 * btc * sizeof(double)), *rg = xmalloc(ng * sizeof(double));
    for (size_t r = 0; r < BT; r++)
        for (int j = 0; j < G; j++)
            for (int i = 0; i < g; i++)
                for (int d = 0; d < hs; d++) {
                    const float *grp = x + r * Cg + (size_t)j * (g + 2) * hs;
                    size_t hd = ((size_t)j * g + i) * hs + d;
                    qd[r * 3 * C + hd] = grp[(size_t)i * hs + d];
                    qd[r * 3 * C + C + hd] = grp[(size_t)g * hs + d];
                    qd[r * 3 * C + 2 * C + hd] = grp[(size_t)(g + 1) * hs + d];
                }
    ref_attention(qd, NULL, B, T, C, NH, ro);
    ref_attention_backward(qd, gd, B, T, C, NH, rd);
    for (size_t i = 0; i < ng; i++)
        rg[i] = 0.0;
    for (size_t r = 0; r < BT; r++)
        for (int j = 0; j < G; j++)
            for (int i = 0; i < g; i++)
                for (int d = 0; d < hs; d++) {
                    double *grp = rg + r * Cg + (size_t)j * (g + 2) * hs;
                    size_t hd = ((size_t)j * g + i) * hs + d;
                    grp[(size_t)i * hs + d] = rd[r * 3 * C + hd];
                    grp[(size_t)g * hs + d] += rd[r * 3 * C + C + hd];
                    grp[(size_t)(g + 1) * hs + d] += rd[r * 3 * C + 2 * C + hd];
                }
    CHECK_ERR("gqa_attention_forward vs naive attention on the expanded layout", h, ro, btc, TOL_ATT);
    CHECK_ERR("gqa_attention_backward vs the closed form, summed per group", h + btc + nl, rg, ng, TOL_ATT_BWD);
    float *dx = up(be, x, ng), *dqkv = up(be, NULL, 3 * btc), *dout = up(be, NULL, btc), *lse = up(be, NULL, nl);
    float *dg = up(be, dy, btc), *dd = up(be, NULL, 3 * btc), *sc = up(be, NULL, nl), *dgr = up(be, NULL, ng);
    be->ops->gqa_expand(be, dqkv, dx, B, T, G, g, hs);
    bg_attention_forward(be, dout, lse, dqkv, B, T, C, NH);
    bg_attention_backward(be, dd, sc, dg, dqkv, dout, lse, B, T, C, NH);
    be->ops->gqa_reduce(be, dgr, dd, B, T, G, g, hs);
    float *eo = down(be, dout, btc), *el = down(be, lse, nl), *eg = down(be, dgr, ng);
    assert_same_bits("gqa forward vs the expanded path", h, eo, btc);
    assert_same_bits("gqa lse vs the expanded path", h + btc, el, nl);
    for (size_t r = 0; r < BT; r++) /* dQ of each group */
        for (int j = 0; j < G; j++) {
            size_t o = r * Cg + (size_t)j * (g + 2) * hs;
            assert_same_bits("gqa dQ vs the expanded path", h + btc + nl + o, eg + o, (size_t)g * hs);
        }
    float *bufs[] = {dx, dqkv, dout, lse, dg, dd, sc, dgr};
    for (size_t i = 0; i < NELEM(bufs); i++)
        bg_backend_free(be, bufs[i]);
    free(eo), free(el), free(eg), free(qd), free(gd), free(ro), free(rd), free(rg);
}
static float *gqa_run(bg_backend_t *be, int check)
{
    bg_rng_t rng;
    bg_rng_seed(&rng, 29);
    float *res = xmalloc(gqa_floats() * sizeof(float)), *p = res;
    for (size_t s = 0; s < NELEM(gqa_sz); s++) {
        int B = gqa_sz[s][0], T = gqa_sz[s][1], G = gqa_sz[s][2], g = gqa_sz[s][3], hs = gqa_sz[s][4];
        size_t BT = (size_t)B * T, btc = BT * G * g * hs, nl = BT * G * g, ng = BT * G * (g + 2) * hs;
        float *x = hrandn(&rng, ng, 1.0), *dy = hrandn(&rng, btc, 1.0), *junk = hrandn(&rng, ng, 1.0);
        float *dx = up(be, x, ng), *dout = up(be, junk, btc), *lse = up(be, NULL, nl), *sc = up(be, NULL, nl);
        float *dg = up(be, dy, btc), *dgr = up(be, junk, ng);
        be->ops->fill(be, lse, NAN, nl); /* every float of lse and the scratch is written before it is read */
        be->ops->fill(be, sc, NAN, nl);
        be->ops->gqa_attention_forward(be, dout, lse, dx, B, T, G, g, hs);
        be->ops->gqa_attention_backward(be, dgr, sc, dg, dx, dout, lse, B, T, G, g, hs);
        float *parts[] = {dout, lse, dgr};
        size_t len[] = {btc, nl, ng};
        for (size_t i = 0; i < NELEM(parts); i++) {
            float *t = down(be, parts[i], len[i]);
            memcpy(p + (i ? (i == 1 ? btc : btc + nl) : 0), t, len[i] * sizeof(float));
            free(t);
        }
        if (check)
            gqa_check(be, p, x, dy, B, T, G, g, hs);
        p += btc + nl + ng;
        float *bufs[] = {dx, dout, lse, sc, dg, dgr};
        for (size_t i = 0; i < NELEM(bufs); i++)
            bg_backend_free(be, bufs[i]);
        free(x), free(dy), free(junk);
    }
    return res;
}

static void test_gqa_attention(void **state)
{
    (void)state;
    bg_backend_t *be1 = mkbe(1), *be3 = mkbe(3);
    assert_non_null(be1->ops->gqa_attention_forward);
    float *a = gqa_run(be1, 1), *b = gqa_run(be3, 0);
    assert_same_bits("gqa attention, 1 vs 3 threads", a, b, gqa_floats());
    free(a), free(b);
    bg_backend_destroy(be1), bg_backend_destroy(be3);
}

/* Context parallelism's ring blocks (attention_block_forward/backward): a
 * group of N members simulated in one process, member m holding chunks m and
 * 2N-1-m of every sequence of T = 2N c positions. Each member attends to
 * every member's block in ring order (its own first) with the blocks merged
 * by log-sum-exp, and accumulates the backward's dq and every block's dk/dv;
 * the rows, put back at their global positions, match naive causal attention
 * over the whole sequence and its closed-form backward, in double. */
static void test_attention_block(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 15);
    /* N, c, B, C, NH: head size 4; 64 with 48 rows per member (two key tiles); 4 members of 3 */
    static const int sz[][5] = {{2, 5, 2, 12, 3}, {3, 8, 1, 64, 1}, {2, 24, 1, 64, 1}, {4, 3, 2, 8, 2}};
    for (size_t z = 0; z < NELEM(sz); z++) {
        int N = sz[z][0], c = sz[z][1], B = sz[z][2], C = sz[z][3], NH = sz[z][4], T = 2 * N * c, tl = 2 * c;
        size_t btc = (size_t)B * T * C, ltc = (size_t)B * tl * C;
        float *qkv = hrandn(&rng, 3 * btc, 1.0), *g = hrandn(&rng, btc, 1.0);
        double *qd = dcopy(qkv, 3 * btc), *gd = dcopy(g, btc), *ro = xmalloc(btc * sizeof(double)),
               *ref = xmalloc(3 * btc * sizeof(double));
        ref_attention(qd, NULL, B, T, C, NH, ro);
        ref_attention_backward(qd, gd, B, T, C, NH, ref);
        /* member m's positions, its qkv and dout rows (host), then on the backend */
        int *pos = xmalloc((size_t)N * tl * sizeof(int));
        float **mq = xmalloc((size_t)N * sizeof(float *)), **mo = xmalloc((size_t)N * sizeof(float *)),
              **ml = xmalloc((size_t)N * sizeof(float *)), **mg = xmalloc((size_t)N * sizeof(float *)),
              **md = xmalloc((size_t)N * sizeof(float *));
        float *hq = xmalloc(3 * ltc * sizeof(float)), *hg = xmalloc(ltc * sizeof(float));
        for (int m = 0; m < N; m++) {
            for (int t = 0; t < tl; t++)
                pos[m * tl + t] = t < c ? m * c + t : (2 * N - 1 - m) * c + t - c;
            for (int b = 0; b < B; b++)
                for (int t = 0; t < tl; t++) {
                    size_t gr = (size_t)b * T + pos[m * tl + t], lr = (size_t)b * tl + t;
                    memcpy(hq + lr * 3 * C, qkv + gr * 3 * C, 3 * (size_t)C * sizeof(float));
                    memcpy(hg + lr * C, g + gr * C, (size_t)C * sizeof(float));
                }
            mq[m] = up(be, hq, 3 * ltc), mg[m] = up(be, hg, ltc), mo[m] = up(be, NULL, ltc);
            ml[m] = up(be, NULL, (size_t)B * NH * tl), md[m] = up(be, NULL, 3 * ltc);
            be->ops->fill(be, md[m], 0.0f, 3 * ltc);
        }
        float *dvec = up(be, NULL, (size_t)B * NH * tl);
        for (int m = 0; m < N; m++)
            for (int s = 0; s < N; s++) {
                int src = (m - s + N) % N;
                be->ops->attention_block_forward(be, mo[m], ml[m], mq[m], mq[src], pos + m * tl, pos + src * tl,
                                                 s > 0, B, tl, NH, C / NH);
            }
        for (int m = 0; m < N; m++)
            for (int s = 0; s < N; s++) {
                int src = (m - s + N) % N;
                be->ops->attention_block_backward(be, md[m], md[src], dvec, mg[m], mq[m], mq[src], mo[m], ml[m],
                                                  pos + m * tl, pos + src * tl, B, tl, NH, C / NH);
            }
        /* every member's rows back at their global positions */
        float *out = xmalloc(btc * sizeof(float)), *dqkv = xmalloc(3 * btc * sizeof(float));
        for (int m = 0; m < N; m++) {
            float *ho = down(be, mo[m], ltc), *hd = down(be, md[m], 3 * ltc);
            for (int b = 0; b < B; b++)
                for (int t = 0; t < tl; t++) {
                    size_t gr = (size_t)b * T + pos[m * tl + t], lr = (size_t)b * tl + t;
                    memcpy(out + gr * C, ho + lr * C, (size_t)C * sizeof(float));
                    memcpy(dqkv + gr * 3 * C, hd + lr * 3 * C, 3 * (size_t)C * sizeof(float));
                }
            free(ho), free(hd);
            bg_backend_free(be, mq[m]), bg_backend_free(be, mg[m]), bg_backend_free(be, mo[m]);
            bg_backend_free(be, ml[m]), bg_backend_free(be, md[m]);
        }
        CHECK_ERR("ring blocks forward vs naive causal attention", out, ro, btc, TOL_ATT);
        CHECK_ERR("ring blocks backward vs closed-form backward", dqkv, ref, 3 * btc, TOL_ATT_BWD);
        bg_backend_free(be, dvec);
        free(out), free(dqkv), free(pos), free(mq), free(mo), free(ml), free(mg), free(md), free(hq), free(hg);
        free(qkv), free(g), free(qd), free(gd), free(ro), free(ref);
    }
    bg_backend_destroy(be);
}

/* ----------------------------------------------------------- determinism */

/* Runs the reductions and the big row kernels at sizes that take the
 * parallel paths; returns every output concatenated (host, caller frees). */
static float *det_run(int nt, int set_blas_threads, size_t *n_p)
{
    bg_backend_t *be = mkbe_blas(nt, set_blas_threads);
    bg_rng_t rng;
    bg_rng_seed(&rng, 99);
    const int N = 257, C = 301, B = 3, T = 67, V = 11, NV = 1031, NA = 67, GM = 1100, GN = 1040, GK = 24;
    const int AB = 2, AT = 67, AC = 64, ANH = 4;
    size_t nc = (size_t)N * C, btc = (size_t)B * T * C, abtc = (size_t)AB * AT * AC;
    size_t total = 3 * C + nc + 2 + (size_t)V * C + (size_t)T * C + nc + 2 * N + (size_t)NA * NV + NA +
                   (size_t)GM * GN + 8 * 32 * 32 + abtc + 3 * abtc + nc + nc + nc;
    float *res = xmalloc(total * sizeof(float)), *w = res;
#define TAKE(dptr, cnt)                                                                            \
    do {                                                                                           \
        float *h__ = down(be, (dptr), (cnt));                                                      \
        memcpy(w, h__, (cnt) * sizeof(float));                                                     \
        w += (cnt);                                                                                \
        free(h__);                                                                                 \
    } while (0)
    float *x = hrandn(&rng, nc, 1.0), *g = hrandn(&rng, nc, 1.0), *p = hrandn(&rng, C, 1.0);
    float *dx = up(be, x, nc), *dg = up(be, g, nc), *db = up(be, p, C), *dw = up(be, p, C), *dbb = up(be, p, C);
    float *dmean = up(be, NULL, N), *drstd = up(be, NULL, N), *dy = up(be, NULL, nc), *dz = up(be, NULL, nc);
    be->ops->bias_backward(be, db, dg, N, C);
    TAKE(db, (size_t)C);
    be->ops->layernorm_forward(be, dy, dmean, drstd, dx, dw, dbb, N, C);
    TAKE(dy, nc);
    be->ops->layernorm_backward_weight(be, dw, dbb, dg, dx, dmean, drstd, N, C);
    TAKE(dw, (size_t)C);
    TAKE(dbb, (size_t)C);
    float s2[2] = {(float)be->ops->sum(be, dx, nc), (float)be->ops->sumsq(be, dx, nc)};
    double ds = be->ops->sum(be, dx, nc), dq = be->ops->sumsq(be, dx, nc);
    assert_true(ds == (double)be->ops->sum(be, dx, nc) && dq == be->ops->sumsq(be, dx, nc));
    memcpy(w, s2, sizeof(s2));
    w += 2;
    /* embedding backward: B*T = 201 rows of dout taken from g, V = 11 so tokens repeat */
    int32_t tok[4 * 67];
    for (int i = 0; i < B * T; i++)
        tok[i] = (int32_t)bg_rng_below(&rng, (uint64_t)V);
    int32_t *dtok = upi(be, tok, (size_t)B * T);
    float *dwte = up(be, NULL, (size_t)V * C), *dwpe = up(be, NULL, (size_t)T * C);
    be->ops->fill(be, dwte, 0.5f, (size_t)V * C);
    be->ops->fill(be, dwpe, -0.5f, (size_t)T * C);
    assert_true(btc <= nc);
    be->ops->embedding_backward(be, dwte, dwpe, dg, dtok, B, T, C);
    TAKE(dwte, (size_t)V * C);
    TAKE(dwpe, (size_t)T * C);
    be->ops->layernorm_backward_input(be, dz, dg, dx, dw, dmean, drstd, N, C);
    TAKE(dz, nc);
    TAKE(dmean, (size_t)N);
    TAKE(drstd, (size_t)N);
    /* cross-entropy on logits taken from x */
    int32_t tgt[67];
    for (int i = 0; i < NA; i++)
        tgt[i] = (int32_t)bg_rng_below(&rng, (uint64_t)NV);
    int32_t *dtgt = upi(be, tgt, NA);
    float *dl = up(be, NULL, NA);
    be->ops->crossentropy_forward(be, dl, dy, dx, dtgt, NA, NV);
    TAKE(dy, (size_t)NA * NV);
    TAKE(dl, (size_t)NA);
    /* GEMM over several tiles (edges above the 1024 tile limit: 2 x 2), and a batch of small ones */
    float *dc = up(be, NULL, (size_t)GM * GN);
    be->ops->gemm(be, 0, 1, GM, GN, GK, 1.0f, dx, GK, dg, GK, 0.0f, dc, GN);
    TAKE(dc, (size_t)GM * GN);
    bg_backend_free(be, dc);
    be->ops->gemm_strided_batched(be, 1, 0, 32, 32, 32, 1.0f, dx, 32, 1024, dg, 32, 1024, 0.0f, dy, 32, 1024, 8);
    TAKE(dy, (size_t)8 * 32 * 32);
    /* attention forward + backward */
    float *ws = up(be, NULL, bg_attention_ws_floats(AB, AT, AC, ANH));
    float *sc = up(be, NULL, bg_attention_scratch_floats(AB, AT, AC, ANH));
    bg_attention_forward(be, dy, ws, dx, AB, AT, AC, ANH);
    TAKE(dy, abtc);
    bg_attention_backward(be, dz, sc, dg, dx, dy, ws, AB, AT, AC, ANH);
    TAKE(dz, 3 * abtc);
    /* elementwise with their own parallel split */
    be->ops->gelu_backward(be, dy, dx, dg, nc);
    TAKE(dy, nc);
    be->ops->softmax_forward(be, dy, dx, N, C);
    TAKE(dy, nc);
    be->ops->adamw(be, dx, dg, dy, dz, nc, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 2);
    TAKE(dx, nc);
#undef TAKE
    assert_int_equal((size_t)(w - res), total);
    bg_backend_free(be, dx), bg_backend_free(be, dg), bg_backend_free(be, db), bg_backend_free(be, dw);
    bg_backend_free(be, dbb), bg_backend_free(be, dmean), bg_backend_free(be, drstd), bg_backend_free(be, dy);
    bg_backend_free(be, dz), bg_backend_free(be, dtok), bg_backend_free(be, dwte), bg_backend_free(be, dwpe);
    bg_backend_free(be, dtgt), bg_backend_free(be, dl), bg_backend_free(be, ws), bg_backend_free(be, sc);
    assert_int_equal(bg_backend_memstats(be).count, 0);
    bg_backend_destroy(be);
    free(x), free(g), free(p);
    *n_p = total;
    return res;
}

static void test_determinism(void **state)
{
    (void)state;
    size_t n1, n2, n3;
    float *r1 = det_run(1, 1, &n1), *r2 = det_run(2, 1, &n2), *r3 = det_run(3, 1, &n3);
    assert_int_equal(n1, n2);
    assert_int_equal(n1, n3);
    for (size_t i = 0; i < n1; i++)
        if (memcmp(&r1[i], &r2[i], sizeof(float)) || memcmp(&r1[i], &r3[i], sizeof(float)))
            fail_msg("result %zu differs across thread counts: %.9g (1) %.9g (2) %.9g (3)", i, r1[i], r2[i], r3[i]);
    free(r1), free(r2), free(r3);
}

static void assert_same_bits(const char *what, const float *a, const float *b, size_t n);

/* The fused bias + GELU kernels (the MLP's fc -> gelu) give the bits of the
 * kernels they replace: bias_forward then gelu_forward, gelu_backward then
 * bias_backward (each of those checked against double references above), on
 * 1, 2 and 3 threads, at shapes with a partial column block, and with inputs
 * out to +-30 (the GELU's clamps) and a NaN. */
static void test_bias_gelu_fused(void **state)
{
    (void)state;
    static const int sz[][2] = {{1, 1}, {7, 13}, {31, 1}, {129, 257}, {5, 64}, {300, 200}};
    for (int nt = 1; nt <= 3; nt++) {
        bg_backend_t *be = mkbe(nt);
        assert_non_null(be->ops->bias_gelu_forward);
        assert_non_null(be->ops->gelu_bias_backward);
        bg_rng_t rng;
        bg_rng_seed(&rng, 91 + (uint64_t)nt);
        for (size_t s = 0; s < NELEM(sz); s++) {
            int N = sz[s][0], C = sz[s][1];
            size_t nc = (size_t)N * C;
            float *x = hrandn(&rng, nc, 10.0), *b = hrandn(&rng, C, 1.0), *g = hrandn(&rng, nc, 1.0),
                  *db = hrandn(&rng, C, 1.0);
            x[nc / 2] = NAN;
            float *p1 = up(be, x, nc), *p2 = up(be, x, nc), *o1 = up(be, NULL, nc), *o2 = up(be, NULL, nc);
            float *bias = up(be, b, C), *dout = up(be, g, nc), *d1 = up(be, NULL, nc), *d2 = up(be, NULL, nc);
            float *db1 = up(be, db, C), *db2 = up(be, db, C);
            be->ops->bias_forward(be, p1, bias, N, C);
            be->ops->gelu_forward(be, o1, p1, nc);
            be->ops->bias_gelu_forward(be, p2, o2, bias, N, C);
            be->ops->gelu_backward(be, d1, p1, dout, nc);
            be->ops->bias_backward(be, db1, d1, N, C);
            be->ops->gelu_bias_backward(be, d2, db2, p2, dout, N, C);
            float *h[8] = {down(be, p1, nc), down(be, p2, nc), down(be, o1, nc), down(be, o2, nc),
                           down(be, d1, nc), down(be, d2, nc), down(be, db1, C), down(be, db2, C)};
            char what[96];
            snprintf(what, sizeof what, "%d threads, %d x %d: pre + bias", nt, N, C);
            assert_same_bits(what, h[0], h[1], nc);
            snprintf(what, sizeof what, "%d threads, %d x %d: gelu", nt, N, C);
            assert_same_bits(what, h[2], h[3], nc);
            snprintf(what, sizeof what, "%d threads, %d x %d: input gradient", nt, N, C);
            assert_same_bits(what, h[4], h[5], nc);
            snprintf(what, sizeof what, "%d threads, %d x %d: bias gradient (accumulated)", nt, N, C);
            assert_same_bits(what, h[6], h[7], C);
            for (int i = 0; i < 8; i++)
                free(h[i]);
            float *dev[] = {p1, p2, o1, o2, bias, dout, d1, d2, db1, db2};
            for (size_t i = 0; i < NELEM(dev); i++)
                bg_backend_free(be, dev[i]);
            free(x), free(b), free(g), free(db);
        }
        bg_backend_destroy(be);
    }
}

/* ------------------------------------------- process-wide settings (guest) */

static void assert_same_bits(const char *what, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            fail_msg("%s: result %zu differs: %.9g vs %.9g", what, i, a[i], b[i]);
}

/* The OpenBLAS the CPU backend loaded (the test does not link OpenBLAS: the
 * backend loads it itself, with a core chosen from CPUID). */
static const bg_blas_info_t *blas(void)
{
    static bg_blas_info_t b;
    if (!b.sgemm && bg_blas_info(&b) != BG_OK)
        fail_msg("%s", bg_last_error());
    return &b;
}
static void blas_set_threads(int n) { blas()->set_num_threads(n); }
static int blas_threads(void) { return blas()->get_num_threads(); }

/* The BLAS in use is not a generic fallback (Debian's OpenBLAS
 * 0.3.21 runs SSE3 "Prescott" kernels on Emerald Rapids unless brigade picks
 * the core): on a CPU with AVX2, its kernels use at least AVX2. Fails with
 * BRIGADE_BLAS_CORE=openblas on such a CPU (checked by hand). */
static void test_blas_not_fallback(void **state)
{
    (void)state;
    bg_cpu_info_t cpu;
    bg_cpu_info(&cpu);
    const bg_blas_info_t *b = blas();
    print_message("cpu: %s family %d model %d \"%s\", vector %d bits; BLAS %s: core %s (chosen by %s)\n",
                  cpu.vendor, cpu.family, cpu.model, cpu.brand, cpu.vector_bits, b->version, b->core, b->chosen_by);
    if (!cpu.avx2_fma) {
        print_message("skipped: this CPU has no AVX2+FMA, any OpenBLAS core will do\n");
        skip();
    }
    if (b->fallback)
        fail_msg("OpenBLAS runs its \"%s\" kernels on a CPU with %s (chosen by %s)", b->core,
                 cpu.avx512 ? "AVX-512" : "AVX2", b->chosen_by);
    /* and the cores named by the table are the ones the features ask for */
    if (!strcmp(b->chosen_by, "cpuid"))
        assert_string_equal(b->core, cpu.avx512 ? "SkylakeX"
                                     : (!strcmp(cpu.vendor, "AuthenticAMD") || !strcmp(cpu.vendor, "HygonGenuine"))
                                         ? "Zen"
                                         : "Haswell");
}

/* OpenBLAS's thread count belongs to the host unless set_blas_threads asks the
 * backend to set it; either way results do not depend on the backend's thread
 * count, and with OpenBLAS on one thread both give the same bits. */
static void test_blas_threads(void **state)
{
    (void)state;
    size_t n1, n2, n3, nr, n0;
    /* the host runs OpenBLAS on 3 threads: left alone, GEMM still right and deterministic */
    blas_set_threads(3);
    bg_backend_t *be = mkbe_blas(2, 0);
    assert_int_equal(blas_threads(), 3);
    bg_rng_t rng;
    bg_rng_seed(&rng, 5);
    check_gemm_case(be, &rng, 0, 1, 261, 300, 67, 1.0f, 3, 1); /* several tiles */
    check_gemm_case(be, &rng, 1, 0, 33, 40, 300, 0.0f, 0, 5); /* batched */
    assert_int_equal(blas_threads(), 3);
    bg_backend_destroy(be);
    char out[4096];
    bgt_capture_t cap;
    assert_int_equal(bgt_capture_begin(&cap), 0);
    float *r1 = det_run(1, 0, &n1), *r2 = det_run(2, 0, &n2), *r3 = det_run(3, 0, &n3);
    long printed = bgt_capture_end(&cap, out, sizeof(out));
    /* nothing printed (some pthread builds of OpenBLAS warn on stderr when called inside an OpenMP region) */
    assert_int_equal(printed, 0);
    assert_int_equal(blas_threads(), 3);
    assert_int_equal(n1, n2);
    assert_int_equal(n1, n3);
    assert_same_bits("OpenBLAS on 3 threads, backend 1 vs 2 threads", r1, r2, n1);
    assert_same_bits("OpenBLAS on 3 threads, backend 1 vs 3 threads", r1, r3, n1);
    free(r1), free(r2), free(r3);
    /* OpenBLAS on one thread (the host's choice): the same bits as set_blas_threads */
    blas_set_threads(1);
    float *r0 = det_run(2, 0, &n0), *rr = det_run(2, 1, &nr);
    assert_int_equal(n0, nr);
    assert_same_bits("set_blas_threads 0 vs 1 with OpenBLAS on one thread", r0, rr, n0);
    free(r0), free(rr);
    /* set_blas_threads = 1: one thread from creation on, and again before each GEMM */
    blas_set_threads(3);
    be = mkbe_blas(2, 1);
    assert_int_equal(blas_threads(), 1);
    blas_set_threads(3);
    check_gemm_case(be, &rng, 0, 0, 129, 257, 67, 0.0f, 0, 1);
    assert_int_equal(blas_threads(), 1);
    bg_backend_destroy(be);
}

/* glibc's malloc thresholds stay as they are unless tune_malloc asks: a 64 MiB
 * block is served by mmap (above glibc's largest dynamic threshold, 32 MiB)
 * until the backend raised the threshold to 1 GiB. Process-wide and permanent,
 * so tune_malloc = 0 is checked first. */
#if defined(__SANITIZE_ADDRESS__)
#define BG_TEST_GLIBC_MALLOC 0 /* AddressSanitizer replaces malloc: mallopt and mallinfo2 say nothing */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BG_TEST_GLIBC_MALLOC 0
#endif
#endif
#ifndef BG_TEST_GLIBC_MALLOC
#define BG_TEST_GLIBC_MALLOC 1
#endif

static void test_tune_malloc(void **state)
{
    (void)state;
    if (!BG_TEST_GLIBC_MALLOC)
        skip();
    const size_t big = (size_t)64 << 20;
    for (int tune = 0; tune < 2; tune++) {
        bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
        p.num_threads = 1;
        p.tune_malloc = tune;
        bg_backend_t *be = NULL;
        assert_int_equal(bg_backend_create("cpu", &p, &be), BG_OK);
        size_t before = mallinfo2().hblks;
        void *x = bg_backend_alloc(be, big, "big");
        assert_non_null(x);
        size_t during = mallinfo2().hblks;
        bg_backend_free(be, x);
        bg_backend_destroy(be);
        if (tune)
            assert_int_equal(during, before); /* from the heap */
        else
            assert_int_equal(during, before + 1); /* its own mapping */
    }
}

/* ----------------------------------------------- memory and the registry */

static void test_memstats(void **state)
{
    (void)state;
    bg_backend_t *be = mkbe(1);
    bg_memstats_t m = bg_backend_memstats(be);
    assert_int_equal(m.current, 0);
    assert_int_equal(m.peak, 0);
    assert_int_equal(m.count, 0);
    float *a = bg_backend_alloc(be, 1000, "a"), *b = bg_backend_alloc(be, 24, "b"), *c = bg_backend_alloc(be, 4096, "c");
    assert_non_null(a), assert_non_null(b), assert_non_null(c);
    assert_true(((uintptr_t)a % 64) == 0 && ((uintptr_t)b % 64) == 0 && ((uintptr_t)c % 64) == 0);
    m = bg_backend_memstats(be);
    assert_int_equal(m.current, 1000 + 24 + 4096);
    assert_int_equal(m.peak, 1000 + 24 + 4096);
    assert_int_equal(m.count, 3);
    bg_backend_free(be, b);
    m = bg_backend_memstats(be);
    assert_int_equal(m.current, 1000 + 4096);
    assert_int_equal(m.peak, 1000 + 24 + 4096);
    assert_int_equal(m.count, 2);
    bg_backend_reset_peak(be);
    assert_int_equal(bg_backend_memstats(be).peak, 1000 + 4096);
    float *d = bg_backend_alloc(be, 10, "d");
    assert_int_equal(bg_backend_memstats(be).peak, 1000 + 4096 + 10);
    bg_backend_free(be, a), bg_backend_free(be, c), bg_backend_free(be, d);
    bg_backend_free(be, NULL); /* no-op */
    m = bg_backend_memstats(be);
    assert_int_equal(m.current, 0);
    assert_int_equal(m.count, 0);
    assert_int_equal(m.peak, 1000 + 4096 + 10);
    bg_backend_destroy(be);
}

static void test_registry(void **state)
{
    (void)state;
    bg_backend_t *be = (bg_backend_t *)0x1;
    assert_int_equal(bg_backend_create("nosuch", NULL, &be), BG_ERR_UNSUPPORTED);
    assert_ptr_equal(be, (bg_backend_t *)0x1); /* output untouched on failure */
    assert_non_null(strstr(bg_last_error(), "nosuch"));
    assert_non_null(strstr(bg_last_error(), "cpu"));
    const char *const *names = bg_backend_names();
    assert_string_equal(names[0], "cpu");
    /* default thread count: positive */
    assert_int_equal(bg_backend_create("cpu", NULL, &be), BG_OK);
    assert_true(be->num_threads >= 1);
    assert_string_equal(be->ops->name, "cpu");
    /* the table is this header's, and every required slot is filled (kernels/backend_impl.h's lists; the
     * memory and event slots are NULL: plain host memory) */
    assert_int_equal(be->ops->size, sizeof(bg_backend_ops_t));
#define REQUIRED(slot) if (!be->ops->slot) fail_msg("cpu backend: the required slot %s is NULL", #slot);
    BG__BACKEND_HOST_OPS(REQUIRED)
    BG__BACKEND_KERNEL_OPS(REQUIRED)
#undef REQUIRED
    assert_int_equal(bg__backend_check_ops(be->ops), BG_OK);
    assert_int_equal(be->ops->device_buffers, 0); /* the transport reads CPU buffers in place */
    assert_int_equal(!be->ops->host_alloc, !be->ops->host_free);
    assert_null(be->ops->to_host_async); /* no streams: staging copies synchronously */
    assert_null(be->ops->event_create);
    bg_backend_destroy(be);
}

/* A table is checked when its backend is created (bg__backend_check_ops): one built against an older
 * header (a smaller size: without the slots appended since) is refused with a message saying so; a
 * required slot left NULL, or some event slots without the others, is refused naming it; the optional
 * slots (fused bias + GELU, memory, events all NULL) may be NULL. */
static void test_ops_check(void **state)
{
    (void)state;
    bg_backend_t *be;
    assert_int_equal(bg_backend_create("cpu-async", NULL, &be), BG_OK);
    assert_int_equal(bg__backend_check_ops(be->ops), BG_OK); /* events all filled */
    bg_backend_ops_t t = *be->ops;
    /* older: as a header before the fused slots, appended last */
    t.size = offsetof(bg_backend_ops_t, bias_gelu_forward);
    assert_int_equal(bg__backend_check_ops(&t), BG_ERR_MISMATCH);
    assert_non_null(strstr(bg_last_error(), "cpu-async"));
    assert_non_null(strstr(bg_last_error(), "older include/brigade/backend.h"));
    t.size = sizeof(bg_backend_ops_t) - 1;
    assert_int_equal(bg__backend_check_ops(&t), BG_ERR_MISMATCH);
    t.size = 0; /* never set: no BG_BACKEND_OPS_INIT */
    assert_int_equal(bg__backend_check_ops(&t), BG_ERR_MISMATCH);
    assert_int_equal(bg__backend_check_ops(NULL), BG_ERR_MISMATCH);
    t.size = sizeof(bg_backend_ops_t);
    assert_int_equal(bg__backend_check_ops(&t), BG_OK);
    /* optional slots NULL */
    t.bias_gelu_forward = NULL;
    t.gelu_bias_backward = NULL;
    t.host_alloc = NULL;
    t.destroy = NULL;
    assert_int_equal(bg__backend_check_ops(&t), BG_OK);
    /* some event slots only */
    t.stream_wait = NULL;
    assert_int_equal(bg__backend_check_ops(&t), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "7 of the 8 event"));
#define NO_EVENT(slot) t.slot = NULL;
    BG__BACKEND_EVENT_OPS(NO_EVENT)
#undef NO_EVENT
    assert_int_equal(bg__backend_check_ops(&t), BG_OK);
    /* every required slot, one at a time */
#define DROP(slot)                                                                                                 \
    {                                                                                                              \
        bg_backend_ops_t d = t;                                                                                    \
        d.slot = NULL;                                                                                             \
        assert_int_equal(bg__backend_check_ops(&d), BG_ERR_INVALID);                                               \
        assert_non_null(strstr(bg_last_error(), "required slot " #slot " NULL"));                                  \
    }
    BG__BACKEND_HOST_OPS(DROP)
    BG__BACKEND_KERNEL_OPS(DROP)
#undef DROP
    bg_backend_destroy(be);
}

/* cpu-async (kernels/cpu/cpu_async.c): the CPU's kernels, and a copy stream
 * whose copies land late, the destination NaN until their event completes. */
static void test_cpu_async(void **state)
{
    (void)state;
    bg_backend_t *be;
    assert_int_equal(bg_backend_create("cpu-async", NULL, &be), BG_OK);
    assert_string_equal(be->ops->name, "cpu-async");
    const size_t n = 1 << 16;
    float *dev = bg_backend_alloc(be, n * sizeof(float), "dev"), *host = malloc(n * sizeof(float));
    assert_non_null(host);
    be->ops->fill(be, dev, 2.5f, n);
    bg_event_t *prod = be->ops->event_create(be), *done = be->ops->event_create(be), *back = be->ops->event_create(be);
    assert_true(prod && done && back);
    assert_int_equal(be->ops->event_query(be, done), 1); /* never recorded: complete */
    be->ops->event_record(be, prod);
    assert_int_equal(be->ops->event_query(be, prod), 1); /* the compute stream is the caller */
    be->ops->to_host_async(be, host, dev, n * sizeof(float), prod, done);
    assert_int_equal(be->ops->event_query(be, done), 0); /* late... */
    assert_true(isnan(host[0]) && isnan(host[n - 1]));   /* ...and undefined until then */
    be->ops->event_wait(be, done);
    assert_int_equal(be->ops->event_query(be, done), 1);
    assert_true(host[0] == 2.5f && host[n - 1] == 2.5f);
    for (size_t i = 0; i < n; i++)
        host[i] = (float)i;
    be->ops->from_host_async(be, dev, host, n * sizeof(float), NULL, back);
    assert_true(isnan(dev[7]));
    be->ops->stream_wait(be, back); /* the next kernel runs after the copy */
    assert_true(dev[7] == 7.0f && dev[n - 1] == (float)(n - 1));
    be->ops->event_destroy(be, prod);
    be->ops->event_destroy(be, done);
    be->ops->event_destroy(be, back);
    free(host);
    bg_backend_free(be, dev);
    bg_backend_destroy(be);
}

/* ------------------------------------------------ GEMM libraries (BRIGADE_GEMM) */

/* Each GEMM library on its own (BRIGADE_GEMM read when a backend is created):
 * every layout against the double reference, bits independent of the thread
 * count, and the caller's OpenMP thread count left alone (the oneDNN tiles
 * hold their own OpenMP tasks to one thread). oneDNN is optional: skipped
 * with a message where libdnnl.so.2 is not installed or not usable. */
static double cpu_seconds(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A backend on one thread computes its GEMMs on the calling thread alone:
 * the process's CPU time during them is this thread's (another thread
 * working, as oneDNN would outside a parallel region with OpenMP's default
 * count, would double it). Idle OpenMP threads of earlier tests stop
 * spinning within milliseconds, hence the pause. */
static void gemm_on_one_thread(void)
{
    if (omp_get_max_threads() < 2) {
        print_message("one-thread check skipped: OpenMP's default is one thread here\n");
        return;
    }
    bg_backend_t *be = mkbe(1);
    const int n = 384;
    float *a = up(be, NULL, (size_t)n * n), *c = up(be, NULL, (size_t)n * n);
    be->ops->fill(be, a, 0.5f, (size_t)n * n);
    be->ops->gemm(be, 0, 0, n, n, n, 1.0f, a, n, a, n, 0.0f, c, n); /* warm-up (oneDNN's JIT) */
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    double p0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID), t0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < 40; i++)
        for (int ta = 0; ta < 2; ta++)
            be->ops->gemm(be, ta, !ta, n, n, n, 1.0f, a, n, a, n, 0.0f, c, n);
    double dp = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - p0, dt = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - t0;
    print_message("GEMMs on one backend thread: process CPU %.1f ms, this thread %.1f ms\n", dp * 1e3, dt * 1e3);
    if (dp > 1.3 * dt + 0.005)
        fail_msg("a one-thread backend's GEMMs used other threads: process CPU %.1f ms, calling thread %.1f ms",
                 dp * 1e3, dt * 1e3);
    bg_backend_free(be, a), bg_backend_free(be, c);
    bg_backend_destroy(be);
}

static void gemm_library(const char *mode, const char *name)
{
    setenv("BRIGADE_GEMM", mode, 1);
    setenv("BRIGADE_GEMM_TRANSPOSE", "off", 1); /* the layouts as the library runs them (test_gemm_transpose: on) */
    bg_gemm_info_t g;
    if (bg_gemm_info(&g) != BG_OK) {
        print_message("skipped: %s\n", bg_last_error());
        skip();
    }
    print_message("BRIGADE_GEMM=%s: A B %s, A B^T %s, A^T B %s (m > n: %s)\n", g.mode, g.nn, g.nt, g.tn, g.tn_tall);
    assert_string_equal(g.nn, name);
    assert_string_equal(g.nt, name);
    assert_string_equal(g.tn, name);
    assert_string_equal(g.tn_tall, name);
    int before = omp_get_max_threads();
    gemm_on_one_thread();
    test_gemm(NULL);
    test_gemm_batched(NULL);
    test_determinism(NULL);
    assert_int_equal(omp_get_max_threads(), before);
}

static void test_gemm_openblas(void **state)
{
    (void)state;
    gemm_library("openblas", "OpenBLAS");
}

static void test_gemm_onednn(void **state)
{
    (void)state;
    gemm_library("onednn", "oneDNN");
}

/* a BRIGADE_GEMM that names no library: the backend is not created, and says why */
/* var=value set: the cpu backend is not created, and the message names both */
static void backend_refuses(const char *var, const char *value)
{
    setenv(var, value, 1);
    bg_backend_t *be = NULL;
    assert_int_equal(bg_backend_create("cpu", NULL, &be), BG_ERR_INVALID);
    assert_null(be);
    char want[96];
    snprintf(want, sizeof want, "%s=\"%s\"", var, value);
    assert_non_null(strstr(bg_last_error(), want));
}

static void test_gemm_bad_mode(void **state)
{
    (void)state;
    backend_refuses("BRIGADE_GEMM", "mkl");
}

static int unset_gemm(void **state)
{
    (void)state;
    unsetenv("BRIGADE_GEMM");
    unsetenv("BRIGADE_GEMM_TRANSPOSE");
    return 0;
}

/* host (cols, rows) = x (rows, cols; rows ld apart) transposed */
static float *host_transpose(const float *x, int rows, int cols, int ld)
{
    float *t = xmalloc((size_t)rows * cols * sizeof(float));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            t[(size_t)c * rows + r] = x[(size_t)r * ld + c];
    return t;
}

/* The transposed layout under BRIGADE_GEMM_TRANSPOSE=on gives exactly the
 * bits of A B on the operand transposed here (with the layout's library,
 * transposes off): the copy is exact and the path runs. One tile (edges below
 * 256: not cut) or, with pad 0, tiles sharing a whole copy (its leading
 * dimension is the reference's). ta: A^T B (A is k x m), else A B^T (B is n x k). */
static void gemm_transpose_is_nn(bg_rng_t *rng, int ta, int m, int n, int k, int pad)
{
    int lda = (ta ? m : k) + pad, ldb = (ta ? n : k) + pad;
    size_t na = (size_t)(ta ? k : m) * lda, nb = (size_t)(ta ? k : n) * ldb;
    float *a = hrandn(rng, na, 1.0), *b = hrandn(rng, nb, 1.0), *c0 = hrandn(rng, (size_t)m * n, 1.0), *out[2];
    float *t = ta ? host_transpose(a, k, m, lda) : host_transpose(b, n, k, ldb); /* A^T (m x k) or B^T (k x n) */
    for (int on = 0; on < 2; on++) {
        setenv("BRIGADE_GEMM_TRANSPOSE", on ? "on" : "off", 1);
        bg_backend_t *be = mkbe(2);
        float *da = up(be, on || !ta ? a : t, on || !ta ? na : (size_t)m * k);
        float *db = up(be, on || ta ? b : t, on || ta ? nb : (size_t)k * n), *dc = up(be, c0, (size_t)m * n);
        if (on) {
            be->ops->gemm(be, ta, !ta, m, n, k, 0.75f, da, lda, db, ldb, 0.5f, dc, n);
            assert_true(bg__cpu_gemm_scratch_floats(be) >= (size_t)(ta ? m : n) * k); /* the path ran */
        } else {
            be->ops->gemm(be, 0, 0, m, n, k, 0.75f, da, ta ? k : lda, db, ta ? ldb : n, 0.5f, dc, n);
            assert_int_equal(bg__cpu_gemm_scratch_floats(be), 0);
        }
        out[on] = down(be, dc, (size_t)m * n);
        bg_backend_free(be, da), bg_backend_free(be, db), bg_backend_free(be, dc);
        bg_backend_destroy(be);
    }
    char what[96];
    snprintf(what, sizeof what, "%s %dx%dx%d after transpose vs A B", ta ? "A^T B" : "A B^T", m, n, k);
    assert_same_bits(what, out[0], out[1], (size_t)m * n);
    free(a), free(b), free(c0), free(t), free(out[0]), free(out[1]);
}

/* A B^T of a fixed m x n x k product on a 2-thread backend made under BRIGADE_GEMM_TRANSPOSE=mode */
static float *gemm_nt_under(const char *mode, int m, int n, int k, int *transposed_p)
{
    setenv("BRIGADE_GEMM_TRANSPOSE", mode, 1);
    bg_backend_t *be = mkbe(2);
    bg_rng_t rng;
    bg_rng_seed(&rng, 31);
    float *a = hrandn(&rng, (size_t)m * k, 1.0), *b = hrandn(&rng, (size_t)n * k, 1.0);
    float *da = up(be, a, (size_t)m * k), *db = up(be, b, (size_t)n * k), *dc = up(be, NULL, (size_t)m * n);
    be->ops->gemm(be, 0, 1, m, n, k, 1.0f, da, k, db, k, 0.0f, dc, n);
    *transposed_p = bg__cpu_gemm_scratch_floats(be) > 0; /* the scratch exists once the path ran */
    float *c = down(be, dc, (size_t)m * n);
    bg_backend_free(be, da), bg_backend_free(be, db), bg_backend_free(be, dc);
    bg_backend_destroy(be);
    free(a), free(b);
    return c;
}

/* auto's shape rule ("... where m, n, k >= 256", AVX2 with oneDNN): a product at the bound runs the
 * transposed path and gives the bits of BRIGADE_GEMM_TRANSPOSE=on, one below it neither */
static void gemm_transpose_auto_rule(void)
{
    setenv("BRIGADE_GEMM_TRANSPOSE", "auto", 1);
    bg_gemm_info_t g;
    assert_int_equal(bg_gemm_info(&g), BG_OK);
    print_message("BRIGADE_GEMM_TRANSPOSE=auto: A B^T %s, A^T B %s (m > n: %s)\n", g.nt, g.tn, g.tn_tall);
    if (!strstr(g.nt, "where m, n, k >= 256"))
        return;
    static const int sz[][3] = {{256, 300, 256}, {255, 300, 256}, {256, 300, 250}};
    for (int i = 0; i < 3; i++) {
        int tr_auto, tr_ref;
        float *c_auto = gemm_nt_under("auto", sz[i][0], sz[i][1], sz[i][2], &tr_auto);
        float *c_ref = gemm_nt_under(i == 0 ? "on" : "off", sz[i][0], sz[i][1], sz[i][2], &tr_ref);
        assert_int_equal(tr_auto, i == 0);
        assert_int_equal(tr_ref, i == 0);
        char what[96];
        snprintf(what, sizeof what, "auto A B^T %dx%dx%d vs %s", sz[i][0], sz[i][1], sz[i][2], i == 0 ? "on" : "off");
        assert_same_bits(what, c_auto, c_ref, (size_t)sz[i][0] * sz[i][1]);
        free(c_auto), free(c_ref);
    }
}

/* BRIGADE_GEMM_TRANSPOSE=on ("transpose then A B" for A B^T and A^T B, on this
 * run's ISA and GEMM library): bg_gemm_info says so; the GEMM tests (odd
 * shapes, padded leading dimensions, beta 0 and 1, batched strides) pass
 * against the double reference; beta 0.5 at tile-cut shapes; the bits are
 * those of 1 thread on 3, and exactly A B's on the transposed operand; auto
 * follows its shape rule. A bad value fails the backend's creation naming it. */
static void test_gemm_transpose(void **state)
{
    (void)state;
    backend_refuses("BRIGADE_GEMM_TRANSPOSE", "maybe");
    bg_gemm_info_t g;
    setenv("BRIGADE_GEMM_TRANSPOSE", "off", 1);
    assert_int_equal(bg_gemm_info(&g), BG_OK);
    assert_null(strstr(g.nt, "transpose")), assert_null(strstr(g.tn, "transpose"));
    assert_null(strstr(g.tn_tall, "transpose"));
    setenv("BRIGADE_GEMM_TRANSPOSE", "on", 1);
    assert_int_equal(bg_gemm_info(&g), BG_OK);
    print_message("BRIGADE_GEMM_TRANSPOSE=on: A B %s, A B^T %s, A^T B %s (m > n: %s)\n", g.nn, g.nt, g.tn, g.tn_tall);
    assert_non_null(strstr(g.nt, " after transpose")), assert_non_null(strstr(g.tn, " after transpose"));
    assert_non_null(strstr(g.tn_tall, " after transpose"));
    assert_null(strstr(g.nn, "transpose"));
    test_gemm(NULL);
    test_gemm_batched(NULL);
    bg_rng_t rng;
    bg_rng_seed(&rng, 29);
    bg_backend_t *be1 = mkbe(1), *be3 = mkbe(3);
    /* {ta, tb, m, n}: tiles cut along n (A B^T: each tile copies its rows of B; A^T B: A copied once for both),
     * along m (the converse), and both ways (B copied once for all four) */
    static const int sz[][4] = {{0, 1, 261, 300}, {1, 0, 300, 261}, {1, 0, 700, 300}, {0, 1, 1100, 1040},
                                {1, 0, 261, 300}};
    for (size_t s = 0; s < NELEM(sz); s++) {
        check_gemm_case(be3, &rng, sz[s][0], sz[s][1], sz[s][2], sz[s][3], 77, 0.5f, 3, 1);
        check_gemm_case(be3, &rng, sz[s][0], sz[s][1], 131, 67, 45, 0.5f, 5, 3);
        int ta = sz[s][0], m = sz[s][2], n = sz[s][3], k = 37 + (int)s * 40, lda = (ta ? m : k) + 3,
            ldb = (ta ? n : k) + 1;
        size_t na = (size_t)(ta ? k : m) * lda, nb = (size_t)(ta ? k : n) * ldb, nc = (size_t)m * n;
        float *a = hrandn(&rng, na, 1.0), *b = hrandn(&rng, nb, 1.0), *out[2];
        bg_backend_t *be[2] = {be1, be3};
        for (int i = 0; i < 2; i++) {
            float *da = up(be[i], a, na), *db = up(be[i], b, nb), *dc = up(be[i], NULL, nc);
            be[i]->ops->gemm(be[i], ta, !ta, m, n, k, 1.0f, da, lda, db, ldb, 0.0f, dc, n);
            out[i] = down(be[i], dc, nc);
            bg_backend_free(be[i], da), bg_backend_free(be[i], db), bg_backend_free(be[i], dc);
        }
        char what[96];
        snprintf(what, sizeof what, "after transpose, %dx%dx%d ta=%d: 1 vs 3 threads", m, n, k, ta);
        assert_same_bits(what, out[0], out[1], nc);
        free(a), free(b), free(out[0]), free(out[1]);
    }
    bg_backend_destroy(be1), bg_backend_destroy(be3);
    gemm_transpose_is_nn(&rng, 0, 100, 120, 77, 3);
    gemm_transpose_is_nn(&rng, 1, 100, 120, 77, 3);
    /* tiles sharing the copied operand: it is copied once, whole (cut both ways: the scratch then holds the
     * whole operand, more than a tile's part, so the check that the path ran tells the two apart) */
    gemm_transpose_is_nn(&rng, 0, 1100, 1040, 45, 0);
    gemm_transpose_is_nn(&rng, 1, 1040, 1100, 53, 0);
    /* A^T B with m > n runs the tall layout's library, which may not be A B's (OpenBLAS's on AVX-512 under
     * auto): one library for both, so the comparison is of the copy and not of two libraries */
    setenv("BRIGADE_GEMM", "openblas", 1);
    gemm_transpose_is_nn(&rng, 1, 150, 90, 61, 0);
    unsetenv("BRIGADE_GEMM");
    gemm_transpose_auto_rule();
    unsetenv("BRIGADE_GEMM_TRANSPOSE");
}

/* BRIGADE_CPU_ISA: a bad value fails the backend's creation naming it; auto
 * is the widest ISA the CPU has; each ISA the CPU executes is what a backend
 * created under it runs: the backend checks that the kernels it picked were
 * compiled for that ISA (their compile's own macros) and fails otherwise, and
 * in an optimised build the bits tell too: the attention kernels contract to
 * FMA where the ISA has it, so the plain x86-64 compile's differ from AVX2's
 * (GCC contracts only when optimising: not in Debug builds). */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__OPTIMIZE__)
static float *isa_attention(const char *isa)
{
    setenv("BRIGADE_CPU_ISA", isa, 1);
    bg_backend_t *be = mkbe(1);
    bg_rng_t rng;
    bg_rng_seed(&rng, 5);
    const int B = 1, T = 40, C = 128, NH = 2;
    size_t btc = (size_t)B * T * C;
    float *qkv = hrandn(&rng, 3 * btc, 1.0);
    float *dq = up(be, qkv, 3 * btc), *dout = up(be, NULL, btc), *ws = up(be, NULL, (size_t)B * NH * T);
    bg_attention_forward(be, dout, ws, dq, B, T, C, NH);
    float *h = down(be, dout, btc);
    bg_backend_free(be, dq), bg_backend_free(be, dout), bg_backend_free(be, ws);
    bg_backend_destroy(be);
    free(qkv);
    return h;
}
#endif

/* LayerNorm, softmax and GELU under one ISA (the Llama kernels: llama_run): C11's no-contraction and cpu_vec.h's fixed lanes make their bits
 * the same on every ISA (docs/kernels.md) */
enum { ISA_NN_N = 37, ISA_NN_C = 203 };
static float *isa_nn(const char *isa)
{
    setenv("BRIGADE_CPU_ISA", isa, 1);
    bg_backend_t *be = mkbe(1);
    bg_rng_t rng;
    bg_rng_seed(&rng, 6);
    size_t nc = (size_t)ISA_NN_N * ISA_NN_C;
    float *x = hrandn(&rng, nc, 3.0), *wb = hrandn(&rng, 2 * ISA_NN_C, 1.0);
    float *dx = up(be, x, nc), *dwb = up(be, wb, 2 * ISA_NN_C), *dy = up(be, NULL, 3 * nc);
    float *ms = up(be, NULL, 2 * ISA_NN_N);
    be->ops->layernorm_forward(be, dy, ms, ms + ISA_NN_N, dx, dwb, dwb + ISA_NN_C, ISA_NN_N, ISA_NN_C);
    be->ops->softmax_forward(be, dy + nc, dx, ISA_NN_N, ISA_NN_C);
    be->ops->gelu_forward(be, dy + 2 * nc, dx, nc);
    float *h = down(be, dy, 3 * nc);
    bg_backend_free(be, dx), bg_backend_free(be, dwb), bg_backend_free(be, dy), bg_backend_free(be, ms);
    bg_backend_destroy(be);
    free(x), free(wb);
    return h;
}

static void test_cpu_isa(void **state)
{
    (void)state;
    bg_cpu_info_t cpu;
    bg_cpu_info(&cpu);
    bg_cpu_isa_t isa, top;
    bg_backend_t *be = NULL;
    setenv("BRIGADE_CPU_ISA", "sse9", 1);
    assert_int_equal(bg_backend_create("cpu", NULL, &be), BG_ERR_INVALID);
    assert_non_null(strstr(bg_last_error(), "BRIGADE_CPU_ISA=\"sse9\""));
    setenv("BRIGADE_CPU_ISA", "auto", 1);
    assert_int_equal(bg_cpu_isa(&top), BG_OK);
    static const char *const names[] = {"default", "avx2", "avx512"};
    for (int i = 0; i < 3; i++) {
        setenv("BRIGADE_CPU_ISA", names[i], 1);
        assert_string_equal(bg_cpu_isa_name((bg_cpu_isa_t)i), names[i]);
        if (i <= (int)top) {
            assert_int_equal(bg_cpu_isa(&isa), BG_OK);
            assert_int_equal((int)isa, i);
        } else {
            assert_int_equal(bg_backend_create("cpu", NULL, &be), BG_ERR_UNSUPPORTED);
            assert_non_null(strstr(bg_last_error(), names[i]));
        }
    }
#if defined(__x86_64__) && defined(__GNUC__)
    /* an x86-64 GCC or clang build has the three compiles: auto is the CPU's widest */
    assert_int_equal((int)top, cpu.avx512 ? 2 : cpu.avx2_fma ? 1 : 0);
#endif
#if defined(__x86_64__) && defined(__GNUC__) && defined(__OPTIMIZE__)
    if (cpu.avx2_fma) {
        float *a = isa_attention("avx2"), *d = isa_attention("default");
        assert_true(memcmp(a, d, 40 * 128 * sizeof(float)) != 0);
        free(a), free(d);
    }
#endif
    float *ref = isa_nn("default");
    for (int i = 1; i <= (int)top; i++) {
        float *h = isa_nn(names[i]);
        assert_same_bits(names[i], h, ref, (size_t)3 * ISA_NN_N * ISA_NN_C);
        free(h);
    }
    free(ref);
    setenv("BRIGADE_CPU_ISA", "default", 1);
    bg_backend_t *bed = mkbe(1);
    ref = llama_run(bed, 0);
    bg_backend_destroy(bed);
    for (int i = 1; i <= (int)top; i++) {
        setenv("BRIGADE_CPU_ISA", names[i], 1);
        bg_backend_t *bei = mkbe(1);
        float *h = llama_run(bei, 0);
        bg_backend_destroy(bei);
        assert_same_bits(names[i], h, ref, (size_t)5 * LL_N * LL_C + LL_N + LL_C);
        free(h);
    }
    free(ref);
    unsetenv("BRIGADE_CPU_ISA");
}

/* The kernels compiled per vector ISA (everything but GEMM and the memory and
 * optimizer ops), against their references and across thread counts: run
 * once more under each ISA the CPU executes below its widest. */
static const struct CMUnitTest isa_tests[] = {
    cmocka_unit_test_teardown(test_gemm_transpose, unset_gemm),
    cmocka_unit_test(test_gelu_nonfinite), cmocka_unit_test(test_bias),
    cmocka_unit_test(test_activations),    cmocka_unit_test(test_layernorm),
    cmocka_unit_test(test_softmax),        cmocka_unit_test(test_causal_softmax),
    cmocka_unit_test(test_crossentropy),   cmocka_unit_test(test_embedding),
    cmocka_unit_test(test_layouts),        cmocka_unit_test(test_reductions),
    cmocka_unit_test(test_attention),      cmocka_unit_test(test_determinism),
    cmocka_unit_test(test_bias_gelu_fused), cmocka_unit_test(test_llama_kernels),
    cmocka_unit_test(test_attention_block), cmocka_unit_test(test_gqa_attention),
};

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),     cmocka_unit_test(test_ops_check),     cmocka_unit_test(test_cpu_async),
        cmocka_unit_test(test_memstats),     cmocka_unit_test(test_gelu_nonfinite),
        cmocka_unit_test(test_elementwise),  cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_batched), cmocka_unit_test(test_bias),
        cmocka_unit_test(test_activations),  cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_softmax),      cmocka_unit_test(test_causal_softmax),
        cmocka_unit_test(test_crossentropy), cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_layouts),      cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_reductions),   cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_block),
        cmocka_unit_test(test_determinism),  cmocka_unit_test(test_blas_threads), cmocka_unit_test(test_blas_not_fallback),
        cmocka_unit_test(test_tune_malloc),  cmocka_unit_test(test_convert_bf16),
        cmocka_unit_test(test_gemm_bf16),     cmocka_unit_test(test_bias_gelu_fused),
        cmocka_unit_test(test_llama_kernels), cmocka_unit_test(test_gqa_attention),
        cmocka_unit_test_teardown(test_gemm_openblas, unset_gemm),
        cmocka_unit_test_teardown(test_gemm_onednn, unset_gemm),
        cmocka_unit_test_teardown(test_gemm_bad_mode, unset_gemm),
        cmocka_unit_test_teardown(test_gemm_transpose, unset_gemm),
        cmocka_unit_test(test_cpu_isa),
    };
    unsetenv("BRIGADE_CPU_ISA"); /* the first run: the CPU's widest ISA */
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    bg_cpu_isa_t top;
    if (bg_cpu_isa(&top) != BG_OK)
        return failed + 1;
    for (int isa = (int)top - 1; isa >= 0; isa--) {
        setenv("BRIGADE_CPU_ISA", bg_cpu_isa_name((bg_cpu_isa_t)isa), 1);
        char name[64];
        snprintf(name, sizeof(name), "kernels under BRIGADE_CPU_ISA=%s", bg_cpu_isa_name((bg_cpu_isa_t)isa));
        failed += cmocka_run_group_tests_name(name, isa_tests, NULL, NULL);
    }
    unsetenv("BRIGADE_CPU_ISA");
    return failed;
}
