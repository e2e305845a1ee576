/* bench/gemm_transpose.c: the CPU backend's A B^T and A^T B GEMMs run
 * directly against "transpose then A B" (BRIGADE_GEMM_TRANSPOSE=off vs on),
 * at the GPT's shapes, on one thread, through be->ops->gemm (the backend's
 * tiles, its library per layout; the transpose's own time included). Both
 * backends live in one process (the knob is read when a backend is created;
 * the ISA and the libraries, once per process: BRIGADE_CPU_ISA, set by the
 * caller, bench/gemm_transpose.sh). Each round times off then on, one after
 * the other, each for >= 20 ms of the thread's CPU time (the time other
 * processes held the core left out); per shape it prints the medians of the
 * rounds: GFLOP/s off, on, and the median of the per-round ratios on / off.
 *
 *   build/bench/gemm_transpose [ROUNDS]     (BRIGADE_CPU_ISA=avx2|avx512|default)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm_bench.h"

#include "brigade/backend.h"
#include "brigade/core.h"
#include "brigade/cpu.h"


static double median(double *v, int n)
{
    qsort(v, n, sizeof v[0], bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static bg_backend_t *backend(const char *transpose)
{
    setenv("BRIGADE_GEMM_TRANSPOSE", transpose, 1);
    bg_backend_params_t p = BG_BACKEND_PARAMS_INIT;
    p.num_threads = 1;
    p.set_blas_threads = 1;
    bg_backend_t *be = NULL;
    if (bg_backend_create("cpu", &p, &be) != BG_OK) {
        fprintf(stderr, "gemm_transpose: cpu backend (BRIGADE_GEMM_TRANSPOSE=%s): %s\n", transpose, bg_last_error());
        exit(1);
    }
    return be;
}

static float *operand(bg_backend_t *be, size_t n, unsigned seed)
{
    float *h = malloc(n * sizeof(float)), *d = bg_backend_alloc(be, n * sizeof(float), "bench operand");
    if (!h || !d) {
        fprintf(stderr, "gemm_transpose: out of memory (%zu floats)\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        h[i] = (float)((i * 7 + seed) % 13) * 0.01f - 0.06f;
    be->ops->from_host(be, d, h, n * sizeof(float));
    free(h);
    return d;
}

/* calls of one shape on be, `inner` times; the seconds of thread CPU time */
static double run(bg_backend_t *be, int ta, int tb, int m, int n, int k, float beta, float *const *op, int inner)
{
    double t0 = bench_thread_seconds();
    for (int i = 0; i < inner; i++)
        be->ops->gemm(be, ta, tb, m, n, k, 1.0f, op[0], ta ? m : k, op[1], tb ? k : n, beta, op[2], n);
    return bench_thread_seconds() - t0;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > 64) {
        fprintf(stderr, "gemm_transpose: ROUNDS must be 1..64, got %s\n", argv[1]);
        return 1;
    }
    bg_backend_t *be[2] = {backend("off"), backend("on")};
    bg_gemm_info_t g;
    setenv("BRIGADE_GEMM_TRANSPOSE", "on", 1);
    if (bg_gemm_info(&g) != BG_OK) {
        fprintf(stderr, "gemm_transpose: %s\n", bg_last_error());
        return 1;
    }
    bg_cpu_isa_t isa;
    bg_cpu_isa(&isa);
    printf("# ISA %s; off: A B^T %s, A^T B %s (m > n: %s); on: \"... after transpose\"\n", bg_cpu_isa_name(isa),
           strncmp(g.nt, "oneDNN", 6) ? "OpenBLAS" : "oneDNN", strncmp(g.tn, "oneDNN", 6) ? "OpenBLAS" : "oneDNN",
           strncmp(g.tn_tall, "oneDNN", 6) ? "OpenBLAS" : "oneDNN");
    const struct bench_gemm_shape *s = bench_gemm_shapes;
    printf("%-13s %2s %5s %5s %5s %9s %9s %8s %8s\n", "shape", "op", "m", "n", "k", "off", "on", "on/off",
           "min-max");
    for (size_t i = 0; i < BENCH_GEMM_SHAPES; i++) {
        if (s[i].ta == s[i].tb) /* A B (and A^T B^T): never transposed */
            continue;
        int m = s[i].m, n = s[i].n, k = s[i].k, ta = s[i].ta, tb = s[i].tb;
        float *op[2][3];
        for (int b = 0; b < 2; b++) {
            op[b][0] = operand(be[b], (size_t)m * k, 1);
            op[b][1] = operand(be[b], (size_t)k * n, 2);
            op[b][2] = operand(be[b], (size_t)m * n, 3);
        }
        double flop = 2.0 * m * n * k;
        int inner = 1;
        while (run(be[0], ta, tb, m, n, k, s[i].beta, op[0], inner) < 0.02)
            inner *= 2;
        run(be[1], ta, tb, m, n, k, s[i].beta, op[1], inner); /* warm-up: the scratch, oneDNN's JIT */
        double gf[2][64], ratio[64];
        for (int r = 0; r < rounds; r++) {
            for (int b = 0; b < 2; b++)
                gf[b][r] = flop * inner / run(be[b], ta, tb, m, n, k, s[i].beta, op[b], inner) * 1e-9;
            ratio[r] = gf[1][r] / gf[0][r];
        }
        double lo = ratio[0], hi = ratio[0];
        for (int r = 1; r < rounds; r++)
            lo = ratio[r] < lo ? ratio[r] : lo, hi = ratio[r] > hi ? ratio[r] : hi;
        printf("%-13s %c%c %5d %5d %5d %9.1f %9.1f %8.3f %.2f-%.2f\n", s[i].name, ta ? 'T' : 'N', tb ? 'T' : 'N', m, n,
               k, median(gf[0], rounds), median(gf[1], rounds), median(ratio, rounds), lo, hi);
        fflush(stdout);
        for (int b = 0; b < 2; b++)
            for (int j = 0; j < 3; j++)
                bg_backend_free(be[b], op[b][j]);
    }
    bg_backend_destroy(be[0]);
    bg_backend_destroy(be[1]);
    return 0;
}
