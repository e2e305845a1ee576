/* bench/gemm_candidates.c: single-threaded sgemm of the candidate libraries at
 * the GPT's GEMM shapes, to choose brigade's BLAS by measurement.
 * Each library is loaded with dlopen (RTLD_LOCAL), so OpenBLAS and BLIS, which
 * both export cblas_sgemm, do not collide, and OPENBLAS_CORETYPE set before the
 * run picks OpenBLAS's core. Not part of the build or of CI:
 *
 *   gcc -O2 -o /tmp/gemm_candidates bench/gemm_candidates.c -ldl
 *   /tmp/gemm_candidates LIB [REPEATS]      LIB: openblas | blis | dnnl
 *
 * Prints one line per shape: name, transposes, m n k, median GFLOP/s of
 * REPEATS timed calls (each long enough to take >= 20 ms of the thread's CPU
 * time, which leaves out the time other processes of a shared machine held
 * the core) after a warm-up.
 * Run the libraries alternately (bench/gemm_candidates.sh) and compare medians. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm_bench.h"

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                               float *, int);
typedef int (*dnnl_sgemm_fn)(char, char, long, long, long, float, const float *, long, const float *, long, float,
                             float *, long);

static cblas_sgemm_fn cblas;
static dnnl_sgemm_fn dnnl;

/* row-major C = op(A) op(B) + beta C */
static void gemm(int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb, float beta,
                 float *c, int ldc)
{
    if (cblas)
        cblas(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
    else
        dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}


int main(int argc, char **argv)
{
    const char *lib = argc > 1 ? argv[1] : "openblas";
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    void *h = NULL;
    if (!strcmp(lib, "openblas")) {
        h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
        if (h) {
            void (*set)(int) = (void (*)(int))dlsym(h, "openblas_set_num_threads");
            char *(*core)(void) = (char *(*)(void))dlsym(h, "openblas_get_corename");
            set(1);
            fprintf(stderr, "openblas core %s\n", core());
            cblas = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
        }
    } else if (!strcmp(lib, "blis")) {
        h = dlopen("/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", RTLD_NOW | RTLD_LOCAL);
        if (h) {
            void (*set)(long) = (void (*)(long))dlsym(h, "bli_thread_set_num_threads");
            int (*id)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
            const char *(*name)(int) = (const char *(*)(int))dlsym(h, "bli_arch_string");
            set(1);
            fprintf(stderr, "blis arch %s\n", name(id()));
            cblas = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
        }
    } else if (!strcmp(lib, "dnnl")) {
        h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (h)
            dnnl = (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm");
    }
    if (!h || (!cblas && !dnnl)) {
        fprintf(stderr, "cannot load %s: %s\n", lib, dlerror());
        return 1;
    }
    const struct bench_gemm_shape *s = bench_gemm_shapes;
    for (size_t i = 0; i < BENCH_GEMM_SHAPES; i++) {
        int m = s[i].m, n = s[i].n, k = s[i].k, ta = s[i].ta, tb = s[i].tb;
        float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n), *c = malloc(sizeof(float) * m * n);
        for (long j = 0; j < (long)m * k; j++)
            a[j] = (float)((j * 7 % 13) - 6) * 0.01f;
        for (long j = 0; j < (long)k * n; j++)
            b[j] = (float)((j * 5 % 11) - 5) * 0.01f;
        memset(c, 0, sizeof(float) * m * n);
        int lda = ta ? m : k, ldb = tb ? k : n;
        double flop = 2.0 * m * n * k, t0 = bench_thread_seconds();
        int inner = 0;
        while (bench_thread_seconds() - t0 < 0.02 || inner < 3) {
            gemm(ta, tb, m, n, k, a, lda, b, ldb, s[i].beta, c, n);
            inner++;
        }
        double g[64];
        if (reps > 64)
            reps = 64;
        for (int r = 0; r < reps; r++) {
            t0 = bench_thread_seconds();
            for (int j = 0; j < inner; j++)
                gemm(ta, tb, m, n, k, a, lda, b, ldb, s[i].beta, c, n);
            g[r] = flop * inner / (bench_thread_seconds() - t0) * 1e-9;
        }
        qsort(g, reps, sizeof g[0], bench_cmp_double);
        printf("%-13s %c%c %5d %5d %5d %7.1f\n", s[i].name, ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, g[reps / 2]);
        free(a), free(b), free(c);
    }
    return 0;
}
