/* kernels/cpu/cpu_backend.c: the CPU backend's table, its memory ops, the
 * elementwise ops, GEMM (OpenBLAS cblas_sgemm or oneDNN's dnnl_sgemm per
 * operand layout, row-major), the optimizers and
 * the host reductions. The neural-network kernels live in cpu_nn.c.
 *
 * Determinism: elementwise ops compute each element independently; sum and
 * sumsq add fixed-size blocks (BG_CPU_SUM_BLOCK; cpu_vec.h's fixed lanes, so
 * the bits do not depend on the vector width) serially in double and then
 * the block sums in block order, so no result depends on the thread count.
 * GEMM runs fixed tiles through single-threaded OpenBLAS or oneDNN (see
 * below), which test_kernels checks bitwise for 1, 2 and 3 threads.
 *
 * Changes no process-wide setting unless its params ask for it
 * (set_blas_threads: OpenBLAS's thread count; tune_malloc: glibc's mmap and
 * trim thresholds). Must not print or exit; errors go through bg_error. */
#include <math.h>
#include <omp.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "brigade/core.h"
#include "kernels/backend_impl.h"
#include "kernels/bf16.h"
#include "kernels/cpu/cpu_impl.h"

typedef struct bg_cpu_impl {
    const bg__cpu_kernels_t *k; /* the kernels compiled for the backend's ISA (cpu_impl.h) */
    const bg_blas_info_t *blas; /* OpenBLAS, loaded by cpu_blas.c */
    /* oneDNN's sgemm per operand layout (bg_gemm_info when the backend was
     * created): [0] A B, [1] A B^T, [2] A^T B and A^T B^T with m <= n,
     * [3] the same with m > n; NULL: OpenBLAS */
    bg_dnnl_sgemm_fn dnnl[4];
    /* the same layouts: "transpose then A B" for products with min(m, n, k) >= transpose_min[i], 0: never
     * (bg__cpu_gemm_choice; bg_gemm_info's "... after transpose") */
    int transpose_min[4];
    /* that path's per-thread scratch: scratch_threads blocks of scratch_floats floats, grown by the calling
     * thread before a GEMM's parallel region, freed at destroy; plain malloc, outside the counted device
     * memory, like the BLAS libraries' own packing buffers */
    float *scratch;
    size_t scratch_floats;
    int scratch_threads;
    int num_threads;
    int set_blas_threads; /* bg_backend_params_t.set_blas_threads */
    void *streams;        /* "cpu-async": its emulated copy stream (cpu_async.c); NULL for "cpu" */
    void (*streams_destroy)(void *streams);
    int bf16; /* --precision bf16 where oneDNN has a bf16 hardware path: GEMM tiles in bf16 (cpu_bf16mm.c) */
} bg_cpu_impl_t;

void bg__cpu_set_streams(bg_backend_t *be, void *streams, void (*destroy)(void *streams))
{
    bg_cpu_impl_t *impl = be->impl;
    impl->streams = streams;
    impl->streams_destroy = destroy;
}

void *bg__cpu_streams(bg_backend_t *be) { return ((bg_cpu_impl_t *)be->impl)->streams; }

/* ---------------------------------------------------------------- memory */

static void bg__cpu_destroy(bg_backend_t *be)
{
    bg_cpu_impl_t *impl = be->impl;
    if (impl && impl->streams_destroy)
        impl->streams_destroy(impl->streams);
    if (impl)
        free(impl->scratch);
    free(be->impl);
    be->impl = NULL;
}

static void *bg__cpu_alloc(bg_backend_t *be, size_t bytes)
{
    void *p = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0)
        return NULL;
    return p;
}

static void bg__cpu_free(bg_backend_t *be, void *ptr) { free(ptr); }

static void bg__cpu_to_host(bg_backend_t *be, void *dst_host, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst_host, src, bytes);
}

static void bg__cpu_from_host(bg_backend_t *be, void *dst, const void *src_host, size_t bytes)
{
    if (bytes)
        memcpy(dst, src_host, bytes);
}

static void bg__cpu_synchronize(bg_backend_t *be) {}

/* the host's free physical memory (for out-of-memory messages) */
static size_t bg__cpu_device_free(bg_backend_t *be)
{
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (size_t)pages * (size_t)size : 0;
}

/* ----------------------------------------------------------- elementwise */

static void bg__cpu_fill(bg_backend_t *be, float *x, float value, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] = value;
}

static void bg__cpu_copy(bg_backend_t *be, float *dst, const float *src, size_t n)
{
    if (n && dst != src)
        memcpy(dst, src, n * sizeof(float));
}

static void bg__cpu_scale(bg_backend_t *be, float *x, float alpha, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] *= alpha;
}

static void bg__cpu_axpy(bg_backend_t *be, float *y, float alpha, const float *x, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

static void bg__cpu_residual_forward(bg_backend_t *be, float *out, const float *a, const float *b, size_t n)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* fp32 <-> bf16 (kernels/bf16.h): elementwise, so any split gives the same bits */
static void bg__cpu_convert(bg_backend_t *be, void *dst, bg_dtype_t dt, const void *src, bg_dtype_t st, size_t n)
{
    int nt = bg__cpu_nt(be);
    if (dt == st) {
        if (n && dst != src)
            memcpy(dst, src, n * bg_dtype_size(dt));
    } else if (dt == BG_BF16) {
        uint16_t *d = dst;
        const uint32_t *s = src;
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
        for (size_t i = 0; i < n; i++)
            d[i] = bg__bf16_from_bits(s[i]);
    } else {
        uint32_t *d = dst;
        const uint16_t *s = src;
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
        for (size_t i = 0; i < n; i++)
            d[i] = bg__bf16_to_bits(s[i]);
    }
}

/* ------------------------------------------------------------------ GEMM */

/* OpenBLAS's own threading is NOT bitwise reproducible across thread counts:
 * it splits M and N into per-thread ranges whose edges fall on different
 * micro-kernel paths (measured: 200x200x300 differs between 2 and 3 threads).
 * So every GEMM here is cut into tiles of C whose size depends on the shape
 * only (bg__cpu_gemm_tiles), never on the thread count; each tile is one
 * single-threaded sgemm over the full K, and OpenMP spreads the tiles (and the
 * batch) over the threads. A C element is then always computed by the same
 * call with the same operands. Each tile packs its panels of A and B again,
 * so tiles are as large as parallelism allows: each edge cut into equal parts
 * of at most BG_CPU_GEMM_TILE_MAX (multiples of 16: whole micro-kernel
 * panels), then the larger tile edge cut into one more part (never below
 * BG_CPU_GEMM_TILE_MIN) until the whole (batched) product has at least
 * BG_CPU_GEMM_MIN_TASKS tiles: two equal halves keep two threads equally busy.
 * Measured on Emerald Rapids with OpenBLAS's SkylakeX kernels, one thread, the
 * 12 GEMMs of one transformer block and microbatch of the benchmark GPT (256
 * rows, d_model 256), best of 30: 0.91 of direct calls with the former rule
 * (256 x 256 tiles, at least 4), 0.99-1.0 with this one (docs/kernels.md). */
#define BG_CPU_GEMM_TILE_MAX 1024
#define BG_CPU_GEMM_TILE_MIN 128
#define BG_CPU_GEMM_MIN_TASKS 2
/* source rows per piece of a whole-operand transpose (a multiple of 16: each
 * 64-byte line of the copy is written by one thread) */
#define BG_CPU_GEMM_TR_ROWS 64
/* below this many multiply-adds in total a parallel region does not pay */
#define BG_CPU_GEMM_PAR ((long long)1 << 18)

static int bg__cdiv(int a, int b) { return (a + b - 1) / b; }

/* edge e cut into p equal parts, rounded up to a multiple of 16 (or e itself) */
static int bg__cpu_tile_edge(int e, int p)
{
    int t = (bg__cdiv(e, p) + 15) & ~15;
    return t < e ? t : e;
}

/* Tile edges for an m x n product repeated batch times: a function of the
 * shape only (determinism). */
static void bg__cpu_gemm_tiles(int m, int n, int batch, int *tm_p, int *tn_p)
{
    int pm = bg__cdiv(m, BG_CPU_GEMM_TILE_MAX), pn = bg__cdiv(n, BG_CPU_GEMM_TILE_MAX);
    int tm = bg__cpu_tile_edge(m, pm), tn = bg__cpu_tile_edge(n, pn);
    while ((long long)bg__cdiv(m, tm) * bg__cdiv(n, tn) * batch < BG_CPU_GEMM_MIN_TASKS) {
        /* cut the larger tile edge again, or the other when it would fall below the minimum */
        int cut_n = tn >= tm;
        if ((cut_n ? tn : tm) < 2 * BG_CPU_GEMM_TILE_MIN)
            cut_n = !cut_n;
        if ((cut_n ? tn : tm) < 2 * BG_CPU_GEMM_TILE_MIN)
            break;
        if (cut_n)
            tn = bg__cpu_tile_edge(n, ++pn);
        else
            tm = bg__cpu_tile_edge(m, ++pm);
    }
    *tm_p = tm;
    *tn_p = tn;
}

/* OpenBLAS's thread count is process-wide, so it is the host's unless
 * set_blas_threads asked the backend to own it. The tiles stay the same either
 * way; what carries the parallelism depends on it:
 * - OpenBLAS on one thread (set_blas_threads = 1 makes it so; cheap when it
 *   already is): each tile is a single-threaded call and OpenMP spreads the
 *   tiles over the backend's threads.
 * - OpenBLAS on N > 1 threads (the host's choice): the tiles run one after the
 *   other, each an N-threaded OpenBLAS call. Calling a threaded OpenBLAS from
 *   several OpenMP threads would oversubscribe the cores (and some pthread
 *   builds warn on stderr when called inside an OpenMP region; OpenMP builds
 *   go single-threaded there only, so a tile's bits would depend on whether
 *   the region is parallel); a serial loop keeps a tile's arithmetic
 *   independent of num_threads. Its bits then depend on N (OpenBLAS's own
 *   split), as they would for any OpenBLAS caller.
 * Returns the number of OpenMP threads for the tile loop. */
static int bg__cpu_gemm_threads(bg_backend_t *be)
{
    const bg_cpu_impl_t *impl = be->impl;
    int blas_nt = impl->blas->get_num_threads();
    if (impl->set_blas_threads && blas_nt != 1) {
        impl->blas->set_num_threads(1);
        blas_nt = 1;
    }
    return blas_nt == 1 ? bg__cpu_nt(be) : 1;
}

/* C = beta*C (k == 0: BLAS would reject lda = 0, and there is no product). */
static void bg__cpu_scale_c(float *c, int m, int n, int ldc, float beta)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
}

/* "Transpose then A B" (BRIGADE_GEMM_TRANSPOSE): per tile, op(B) = B^T
 * (A B^T: nn x k of B becomes k x nn) or op(A) = A^T (A^T B: k x mm of A
 * becomes mm x k) is copied into the thread's scratch by the ISA's transpose
 * (exact), then one A B call runs. Where several tiles share those rows (B's
 * when the product is cut along m, A's when along n) the whole operand is
 * copied once instead, by all the threads before the tiles, into one shared
 * block. The choice is per layout (bg_gemm_info),
 * the tiles are unchanged, so a C element is still always computed by the
 * same call on the same operands: bits independent of the thread count.
 * Returns the scratch for nt threads of `floats` each, or NULL when it cannot
 * be allocated (the call then runs the layout directly, and says so once). */
static float *bg__cpu_gemm_scratch(bg_cpu_impl_t *impl, size_t floats, int nt)
{
    if (floats <= impl->scratch_floats && nt <= impl->scratch_threads)
        return impl->scratch;
    size_t f = floats > impl->scratch_floats ? floats : impl->scratch_floats;
    int t = nt > impl->scratch_threads ? nt : impl->scratch_threads;
    f = (f + 15) & ~(size_t)15; /* each thread's block 64-byte aligned */
    float *p = NULL;
    if (posix_memalign((void **)&p, 64, f * (size_t)t * sizeof(float)) != 0) {
        static int told;
        if (!told++)
            bg_log(BG_LOG_WARN, "kernels", "cpu backend: no memory for the GEMM transpose scratch (%zu bytes): "
                   "the layout runs directly", f * (size_t)t * sizeof(float));
        return NULL;
    }
    free(impl->scratch);
    impl->scratch = p;
    impl->scratch_floats = f;
    impl->scratch_threads = t;
    return p;
}

size_t bg__cpu_gemm_scratch_floats(const bg_backend_t *be)
{
    return ((const bg_cpu_impl_t *)be->impl)->scratch_floats;
}

static void bg__cpu_gemm_strided_batched(bg_backend_t *be, int trans_a, int trans_b, int m, int n, int k,
                                         float alpha, const float *a, int lda, long long stride_a, const float *b,
                                         int ldb, long long stride_b, float beta, float *c, int ldc,
                                         long long stride_c, int batch)
{
    if (m <= 0 || n <= 0 || batch <= 0)
        return;
    if (k <= 0) {
        for (int i = 0; i < batch; i++)
            bg__cpu_scale_c(c + i * stride_c, m, n, ldc, beta);
        return;
    }
    bg_cpu_impl_t *impl = be->impl;
    const bg_blas_info_t *blas = impl->blas;
    int layout = trans_a ? (m > n ? 3 : 2) : trans_b ? 1 : 0;
    bg_dnnl_sgemm_fn dnnl = impl->dnnl[layout];
    /* OpenBLAS's count is checked (and reset when owned) before every GEMM;
     * oneDNN tiles run on the backend's threads, one thread each */
    int nt = bg__cpu_gemm_threads(be), bf16 = impl->bf16;
    if (dnnl || bf16)
        nt = bg__cpu_nt(be);
    int tm, tn;
    bg__cpu_gemm_tiles(m, n, batch, &tm, &tn);
    int tiles_m = bg__cdiv(m, tm), tiles_n = bg__cdiv(n, tn);
    long long per = (long long)tiles_m * tiles_n, ntask = per * batch;
    long long work = (long long)m * n * k * batch;
    /* transpose then A B: A B^T and A^T B (not A^T B^T), never in bf16 (its tiles convert the operands anyway) */
    int tmin = impl->transpose_min[layout], mn = m < n ? m : n;
    int tr = !bf16 && tmin > 0 && (mn < k ? mn : k) >= tmin, tr_b = tr && !trans_a, tr_a = tr && !trans_b;
    /* whole: the operand is copied once, before the tiles, when several tiles would each
     * copy the same rows of it (B's rows j0.. are every tile row's; A's columns i0.., every
     * tile column's): one shared block, n x k or m x k floats; else each tile copies its own
     * part into its thread's block */
    int whole = batch == 1 && ((tr_b && tiles_m > 1) || (tr_a && tiles_n > 1));
    size_t scr_floats = whole ? (size_t)(tr_b ? n : m) * k : tr_b ? (size_t)tn * k : tr_a ? (size_t)tm * k : 0;
    float *scratch = scr_floats ? bg__cpu_gemm_scratch(impl, scr_floats, whole ? 1 : nt) : NULL;
    if (!scratch)
        tr_a = tr_b = whole = 0;
    void (*transpose)(float *, size_t, const float *, size_t, int, int) = impl->k->transpose;
#pragma omp parallel num_threads(nt) if (nt > 1 && ntask > 1 && work > BG_CPU_GEMM_PAR)
    {
        /* oneDNN (OpenMP build) would run a tile on omp_get_max_threads()
         * threads outside an active parallel region: hold this region's
         * implicit tasks to one. The setting belongs to these tasks (OpenMP's
         * nthreads-var is per task) and ends with the region. */
        if (dnnl || bf16)
            omp_set_num_threads(1);
        if (whole) { /* B (n x k) -> k x n, or A (k x m) -> m x k, in blocks of 64 source rows; a barrier ends it */
            int rows = tr_b ? n : k, cols = tr_b ? k : m;
            const float *src = tr_b ? b : a;
            size_t lds = (size_t)(tr_b ? ldb : lda);
#pragma omp for schedule(static)
            for (int r0 = 0; r0 < rows; r0 += BG_CPU_GEMM_TR_ROWS)
                transpose(scratch + r0, (size_t)rows, src + (size_t)r0 * lds, lds,
                          rows - r0 < BG_CPU_GEMM_TR_ROWS ? rows - r0 : BG_CPU_GEMM_TR_ROWS, cols);
        }
#pragma omp for schedule(dynamic, 1)
        for (long long task = 0; task < ntask; task++) {
            long long bi = task / per, r = task % per;
            int i0 = (int)(r / tiles_n) * tm, j0 = (int)(r % tiles_n) * tn;
            int mm = m - i0 < tm ? m - i0 : tm;
            int nn = n - j0 < tn ? n - j0 : tn;
            /* rows i0.. of op(A): rows of A, or columns when transposed; likewise columns j0.. of op(B) */
            const float *ap = a + bi * stride_a + (trans_a ? (size_t)i0 : (size_t)i0 * lda);
            const float *bp = b + bi * stride_b + (trans_b ? (size_t)j0 * ldb : (size_t)j0);
            float *cp = c + bi * stride_c + (size_t)i0 * ldc + j0;
            char tac = trans_a ? 'T' : 'N', tbc = trans_b ? 'T' : 'N';
            int lda_t = lda, ldb_t = ldb;
            if (whole && tr_b) /* columns j0.. of the k x n copy */
                bp = scratch + j0, ldb_t = n, tbc = 'N';
            else if (whole) /* rows i0.. of the m x k copy */
                ap = scratch + (size_t)i0 * k, lda_t = k, tac = 'N';
            else if (tr_a || tr_b) {
                float *scr = scratch + (size_t)omp_get_thread_num() * impl->scratch_floats;
                if (tr_b) /* B's rows j0.. (nn x k) -> (k x nn) */
                    transpose(scr, (size_t)nn, bp, (size_t)ldb, nn, k), bp = scr, ldb_t = nn, tbc = 'N';
                else /* A's columns i0.. (k x mm) -> (mm x k) */
                    transpose(scr, (size_t)k, ap, (size_t)lda, k, mm), ap = scr, lda_t = k, tac = 'N';
            }
            /* a oneDNN error (none is expected: the arguments are BLAS's)
             * falls back to OpenBLAS for the tile, the same for a given shape */
            if (bf16 && bg__cpu_bf16mm(trans_a, trans_b, mm, nn, k, alpha, ap, lda, bp, ldb, beta, cp, ldc) == 0)
                continue;
            if (!dnnl || dnnl(tac, tbc, mm, nn, k, alpha, ap, lda_t, bp, ldb_t, beta, cp, ldc) != 0)
                blas->sgemm(BG_CBLAS_ROW_MAJOR, tac == 'T' ? BG_CBLAS_TRANS : BG_CBLAS_NO_TRANS,
                            tbc == 'T' ? BG_CBLAS_TRANS : BG_CBLAS_NO_TRANS, mm, nn, k, alpha, ap, lda_t, bp, ldb_t,
                            beta, cp, ldc);
        }
    }
}

static void bg__cpu_gemm(bg_backend_t *be, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    bg__cpu_gemm_strided_batched(be, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

/* ------------------------------------------------------------ optimizers */

static void bg__cpu_adamw(bg_backend_t *be, float *param, const float *grad, float *m, float *v, size_t n, float lr,
                          float beta1, float beta2, float eps, float weight_decay, int t)
{
    int nt = bg__cpu_nt(be);
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        m[i] = mi;
        v[i] = vi;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
    }
}

static void bg__cpu_sgd_momentum(bg_backend_t *be, float *param, const float *grad, float *mom, size_t n, float lr,
                                 float momentum, float weight_decay)
{
    int nt = bg__cpu_nt(be);
#pragma omp parallel for num_threads(nt) if (n > BG_CPU_PAR_ELEMS) schedule(static)
    for (size_t i = 0; i < n; i++) {
        float mi = momentum * mom[i] + grad[i] + weight_decay * param[i];
        mom[i] = mi;
        param[i] -= lr * mi;
    }
}

/* ------------------------------------------------------------ reductions */

/* Sum (squares when sq) of x[0..n) in double: blocks of BG_CPU_SUM_BLOCK
 * elements are summed over fixed lanes (in parallel across blocks), then the
 * block sums are added serially in block order. Partial sums are kept in a
 * stack array of GROUP blocks at a time. */
static double bg__cpu_reduce(bg_backend_t *be, const float *x, size_t n, int sq)
{
    enum { GROUP = 1024 };
    double part[GROUP];
    int nt = bg__cpu_nt(be);
    double (*block)(const float *, size_t, int) = ((const bg_cpu_impl_t *)be->impl)->k->reduce_block;
    size_t nblocks = (n + BG_CPU_SUM_BLOCK - 1) / BG_CPU_SUM_BLOCK;
    double total = 0.0;
    for (size_t g0 = 0; g0 < nblocks; g0 += GROUP) {
        size_t gn = nblocks - g0 < GROUP ? nblocks - g0 : GROUP;
#pragma omp parallel for num_threads(nt) if (gn > 4) schedule(static)
        for (size_t bi = 0; bi < gn; bi++) {
            size_t lo = (g0 + bi) * BG_CPU_SUM_BLOCK;
            part[bi] = block(x + lo, lo + BG_CPU_SUM_BLOCK < n ? BG_CPU_SUM_BLOCK : n - lo, sq);
        }
        for (size_t bi = 0; bi < gn; bi++)
            total += part[bi];
    }
    return total;
}

static double bg__cpu_sum(bg_backend_t *be, const float *x, size_t n) { return bg__cpu_reduce(be, x, n, 0); }
static double bg__cpu_sumsq(bg_backend_t *be, const float *x, size_t n) { return bg__cpu_reduce(be, x, n, 1); }

/* --------------------------------------------------------- ISA dispatch */

/* The op table's kernel entries: each calls the kernel compiled for the
 * backend's ISA (chosen once, in bg__cpu_backend_init). */
#define BG__CPU_KWRAP(name, params, args) \
    void bg__cpu_##name params { ((const bg_cpu_impl_t *)be->impl)->k->name args; }
BG_CPU_ISA_KERNELS(BG__CPU_KWRAP)
#undef BG__CPU_KWRAP

static const bg__cpu_kernels_t *bg__cpu_kernels_for(bg_cpu_isa_t isa)
{
#ifdef BG_CPU_ISA_VARIANTS
    if (isa == BG_CPU_ISA_AVX512)
        return &bg__cpu_kernels_avx512;
    if (isa == BG_CPU_ISA_AVX2)
        return &bg__cpu_kernels_avx2;
#endif
    return &bg__cpu_kernels_base;
}

/* ----------------------------------------------------------------- table */

/* every required slot is bg__cpu_<slot> (kernels/backend_impl.h's lists); no events: the CPU computes in
 * the caller's order and the staging layer copies synchronously */
#define BG__CPU_SLOT(slot) .slot = bg__cpu_##slot,
static const bg_backend_ops_t bg__cpu_ops = {
    BG_BACKEND_OPS_INIT("cpu"),
    BG__BACKEND_HOST_OPS(BG__CPU_SLOT)
    BG__BACKEND_KERNEL_OPS(BG__CPU_SLOT)
    BG__BACKEND_FUSED_OPS(BG__CPU_SLOT)
    BG__BACKEND_LLAMA_OPS(BG__CPU_SLOT)
    BG__BACKEND_CP_OPS(BG__CPU_SLOT)
    BG__BACKEND_GQA_OPS(BG__CPU_SLOT)
    .destroy = bg__cpu_destroy,
};
#undef BG__CPU_SLOT

bg_status_t bg__cpu_backend_init(bg_backend_t *be, const bg_backend_params_t *params)
{
    int nt = params ? params->num_threads : 0;
    if (nt <= 0)
        nt = omp_get_max_threads();
    if (nt <= 0)
        nt = 1;
    bg_cpu_isa_t isa; /* BRIGADE_CPU_ISA: a bad value or an ISA the CPU lacks fails here */
    BG_CHECK(bg_cpu_isa(&isa));
    bg_gemm_info_t gemm; /* loads OpenBLAS (and oneDNN) on first use (cpu_blas.c) */
    int tr_min[4];
    BG_CHECK(bg__cpu_gemm_choice(&gemm, tr_min));
    /* the table's own ISA (its compile's macros) is the one asked for: a
     * build whose per-ISA flags went missing fails here, not silently */
    const bg__cpu_kernels_t *k = bg__cpu_kernels_for(isa);
    if (strcmp(k->isa, bg_cpu_isa_name(isa)) != 0)
        return bg_error(BG_ERR_INTERNAL, "cpu backend: the kernels picked for %s were compiled for %s "
                        "(kernels/CMakeLists.txt's per-ISA flags)", bg_cpu_isa_name(isa), k->isa);
    bg_cpu_impl_t *impl = calloc(1, sizeof(*impl));
    BG_ALLOC_CHECK(impl, sizeof(*impl), "the CPU backend");
    impl->k = k;
    impl->blas = bg__cpu_blas();
    bg_dnnl_sgemm_fn dnnl = bg__cpu_dnnl_sgemm();
    const char *lib[4] = {gemm.nn, gemm.nt, gemm.tn, gemm.tn_tall}; /* "oneDNN" or "OpenBLAS"[ after transpose...] */
    for (int i = 0; i < 4; i++) {
        impl->dnnl[i] = strncmp(lib[i], "oneDNN", 6) ? NULL : dnnl;
        impl->transpose_min[i] = tr_min[i];
    }
    impl->num_threads = nt;
    const char *bf_impl = NULL, *bf_why = NULL;
    impl->bf16 = params && params->precision == BG_BF16 && bg__cpu_bf16mm_available(&bf_impl, &bf_why);
    if (params && params->precision == BG_BF16)
        bg_log(BG_LOG_INFO, "kernels", "cpu backend, precision bf16: GEMMs %s%s%s", impl->bf16 ? "in bf16 (oneDNN " : "in fp32 (",
               impl->bf16 ? bf_impl : bf_why, ")");
    impl->set_blas_threads = params && params->set_blas_threads;
    if (impl->set_blas_threads && impl->blas->get_num_threads() != 1)
        impl->blas->set_num_threads(1);
    /* Training allocates and frees the same large activation buffers every
     * microbatch. glibc would serve them with fresh mmaps, and every page of a
     * fresh mapping faults and is zeroed on first touch (measured: a 6 MiB
     * stash cost 4 ms of page faults, 30% of a stage's forward). Keep large
     * blocks in the heap and do not trim it, so freed buffers are reused
     * without faults. Process-wide, so only when the caller asks. */
    if (params && params->tune_malloc) {
        mallopt(M_MMAP_THRESHOLD, 1 << 30);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
    be->ops = &bg__cpu_ops;
    be->impl = impl;
    be->num_threads = nt;
    bg_log(BG_LOG_DEBUG, "kernels", "cpu backend kernels: %s (BRIGADE_CPU_ISA=%s)", k->isa,
           bg_config_str("BRIGADE_CPU_ISA"));
    bg_log(BG_LOG_DEBUG, "kernels", "cpu backend GEMM: A B %s, A B^T %s, A^T B %s (m > n: %s) (BRIGADE_GEMM=%s%s%s)",
           gemm.nn, gemm.nt, gemm.tn, gemm.tn_tall, gemm.mode, gemm.onednn ? "" : "; oneDNN: ",
           gemm.onednn ? "" : gemm.onednn_why);
    int blas_nt = impl->blas->get_num_threads();
    if (blas_nt == 1)
        bg_log(BG_LOG_DEBUG, "kernels", "cpu backend: %d OpenMP threads, OpenBLAS single-threaded per GEMM tile%s",
               nt, impl->set_blas_threads ? " (set by the backend)" : "");
    else
        bg_log(BG_LOG_INFO, "kernels",
               "cpu backend: %d OpenMP threads; OpenBLAS runs %d threads (the host's setting), so GEMM tiles run "
               "one at a time on OpenBLAS's threads and their bits depend on that count (set_blas_threads or "
               "OPENBLAS_NUM_THREADS=1 for results independent of it)", nt, blas_nt);
    return BG_OK;
}
