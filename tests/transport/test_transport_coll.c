/* tests/transport/test_transport_coll.c: groups and collectives on 2, 3 and
 * 4 forked ranks. Allreduce (ring and recursive doubling, sum and average) of
 * lengths that do not divide by the group size is compared bit for bit with
 * a serial emulation of the documented summation order, within tolerance
 * with a double-precision serial sum, exactly on integer data, and across two
 * separate runs. Subset groups (unsorted), concurrent non-blocking allreduces
 * on overlapping groups, broadcast, allgather, reduce-scatter (and their
 * non-blocking twins, mixed with the blocking calls on one group), barrier;
 * the element types other than fp32 (fp64, bf16, int32, int64, raw bytes);
 * the all-to-all with variable counts (zeros included, counts exchanged by
 * itself first) against a brute-force exchange of every member's buffers
 * built locally, on the whole world and on an unsorted subset. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "brigade/core.h"
#include "brigade/transport.h"
#include "ranks.h"
#include "transport/transport_impl.h"
#include <time.h>

static const char *const bgt_env[] = {"BRIGADE_TIMEOUT=30", NULL};

/* input of group rank r, element i: random magnitudes so the order matters */
static void fill(float *x, size_t n, int r, int integer, uint64_t salt)
{
    bg_rng_t g;
    bg_rng_seed(&g, 1000 + (uint64_t)r * 7919 + salt);
    for (size_t i = 0; i < n; i++) {
        if (integer)
            x[i] = (float)((int)bg_rng_below(&g, 2001) - 1000);
        else
            x[i] = (float)(bg_rng_normal(&g) * pow(10.0, bg_rng_uniform(&g) * 6 - 3));
    }
}

static void chunk(size_t count, int n, int c, size_t *off, size_t *len)
{
    size_t q = count / (size_t)n, rem = count % (size_t)n;
    *off = (size_t)c * q + ((size_t)c < rem ? (size_t)c : rem);
    *len = q + ((size_t)c < rem);
}

/* Serial emulation of the documented orders. x[r] is group rank r's input. */
static void ref_ring(float **x, int n, size_t count, int avg, float *out)
{
    for (int c = 0; c < n; c++) {
        size_t off, len;
        chunk(count, n, c, &off, &len);
        for (size_t i = off; i < off + len; i++) {
            float acc = x[(c + 1) % n][i];
            for (int j = 2; j <= n; j++)
                acc = acc + x[(c + j) % n][i];
            out[i] = avg ? acc / (float)n : acc;
        }
    }
}

static void ref_rd(float **x, int n, size_t count, int avg, float *out)
{
    int p = 1;
    while (p * 2 <= n)
        p *= 2;
    float *v = malloc((size_t)p * sizeof(float)), *w = malloc((size_t)p * sizeof(float));
    for (size_t i = 0; i < count; i++) {
        for (int r = 0; r < p; r++)
            v[r] = r < n - p ? x[r][i] + x[r + p][i] : x[r][i];
        for (int d = 1; d < p; d *= 2) {
            for (int r = 0; r < p; r++) {
                int q = r ^ d, lo = r < q ? r : q, hi = r < q ? q : r;
                w[r] = v[lo] + v[hi];
            }
            memcpy(v, w, (size_t)p * sizeof(float));
        }
        out[i] = avg ? v[0] / (float)n : v[0];
    }
    free(v);
    free(w);
}

static uint64_t hash_bytes(const void *p, size_t n, uint64_t h)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

typedef struct {
    const char *hash_file; /* rank 0 writes the hash of every result here */
} ar_arg_t;

static int rank_allreduce(int rank, int world, void *argp)
{
    ar_arg_t *arg = argp;
    bg_comm_t *c;
    RK_OK(bg_comm_create(NULL, &c));
    int all[16];
    for (int i = 0; i < world; i++)
        all[i] = i;
    bg_group_t *g;
    RK_OK(bg_group_create(c, world, all, &g));
    const size_t counts[] = {0, 1, 3, 5, 17, 1000, 16411, 262147};
    const bg_allreduce_algo_t algos[] = {BG_ALLREDUCE_AUTO, BG_ALLREDUCE_RING, BG_ALLREDUCE_RECURSIVE};
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t n = counts[k];
        float **x = malloc((size_t)world * sizeof(float *));
        float *ref = malloc(n * sizeof(float) + 4), *buf = malloc(n * sizeof(float) + 4);
        for (int integer = 0; integer < 2; integer++) {
            for (int r = 0; r < world; r++) {
                x[r] = malloc(n * sizeof(float) + 4);
                fill(x[r], n, r, integer, k);
            }
            for (int a = 0; a < 3; a++)
                for (int avg = 0; avg < 2; avg++) {
                    memcpy(buf, x[rank], n * sizeof(float));
                    bg_request_t *rq;
                    RK_OK(bg_group_iallreduce_algo(g, buf, n, BG_F32, avg ? BG_REDUCE_AVG : BG_REDUCE_SUM,
                                                   algos[a], &rq));
                    RK_OK(bg_wait(rq));
                    bg_request_free(rq);
                    int ring = algos[a] == BG_ALLREDUCE_RING ||
                               (algos[a] == BG_ALLREDUCE_AUTO && n * 4 > 65536 && n >= (size_t)world);
                    if (ring)
                        ref_ring(x, world, n, avg, ref);
                    else
                        ref_rd(x, world, n, avg, ref);
                    for (size_t i = 0; i < n; i++) {
                        RK_CHECK(memcmp(&buf[i], &ref[i], 4) == 0,
                                 "count %zu algo %d avg %d int %d: element %zu is %.9g, the documented "
                                 "order gives %.9g", n, a, avg, integer, i, buf[i], ref[i]);
                        double s = 0, sa = 0;
                        for (int r = 0; r < world; r++) {
                            s += x[r][i];
                            sa += fabs(x[r][i]);
                        }
                        float exact = avg ? (float)s / (float)world : (float)s;
                        if (avg) {
                            s /= world;
                            sa /= world;
                        }
                        if (integer)
                            RK_CHECK(buf[i] == exact, "integer data: element %zu is %g, serial sum %g",
                                     i, buf[i], (double)exact);
                        else
                            RK_CHECK(fabs(buf[i] - s) <= 4e-7 * sa * world + 1e-30,
                                     "element %zu is %.9g, serial double sum %.9g", i, buf[i], s);
                    }
                    h = hash_bytes(buf, n * sizeof(float), h);
                }
            for (int r = 0; r < world; r++)
                free(x[r]);
        }
        free(x);
        free(ref);
        free(buf);
    }
    if (rank == 0 && arg && arg->hash_file) {
        FILE *f = fopen(arg->hash_file, "w");
        RK_CHECK(f != NULL, "cannot write %s", arg->hash_file);
        fprintf(f, "%016llx\n", (unsigned long long)h);
        fclose(f);
    }
    bg_group_destroy(g);
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static unsigned long long read_hash(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    unsigned long long h = 0;
    assert_int_equal(fscanf(f, "%llx", &h), 1);
    fclose(f);
    remove(path);
    return h;
}

static void run_allreduce(int world)
{
    char f1[64], f2[64];
    snprintf(f1, sizeof(f1), "/tmp/bgt_ar_%d_%d_a", (int)getpid(), world);
    snprintf(f2, sizeof(f2), "/tmp/bgt_ar_%d_%d_b", (int)getpid(), world);
    ar_arg_t a1 = {f1}, a2 = {f2};
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(world, rank_allreduce, &a1, 60, bgt_env, -1, &r), 0);
    assert_int_equal(bgt_run_ranks(world, rank_allreduce, &a2, 60, bgt_env, -1, &r), 0);
    assert_true(read_hash(f1) == read_hash(f2)); /* the same bits in two separate runs */
}

static void test_allreduce_2(void **s) { (void)s; run_allreduce(2); }
static void test_allreduce_3(void **s) { (void)s; run_allreduce(3); }
static void test_allreduce_4(void **s) { (void)s; run_allreduce(4); }

/* Subset groups on 4 ranks: B = {3, 0, 2} (unsorted), A = {1, 3}; concurrent
 * non-blocking allreduces on overlapping groups; bcast, allgather,
 * reduce-scatter, barrier; a non-member is refused. */
static int rank_groups(int rank, int world, void *arg)
{
    (void)arg;
    bg_comm_t *c;
    RK_OK(bg_comm_create(NULL, &c));
    const int bl[3] = {3, 0, 2}, al[2] = {1, 3}, wl[4] = {0, 1, 2, 3};
    bg_group_t *A, *B, *W;
    RK_OK(bg_group_create(c, 3, bl, &B));
    RK_OK(bg_group_create(c, 2, al, &A));
    RK_OK(bg_group_create(c, 4, wl, &W));
    int gb = bg_group_rank(B);
    RK_CHECK(gb == (rank == 3 ? 0 : rank == 0 ? 1 : rank == 2 ? 2 : -1), "group rank %d", gb);
    if (gb < 0) {
        float f = 1;
        RK_CHECK(bg_group_allreduce(B, &f, 1, BG_F32, BG_REDUCE_SUM) == BG_ERR_INVALID, "non-member allowed");
    } else {
        /* allreduce on B, ring, 1001 floats */
        size_t n = 1001;
        float *x[3], *buf = malloc(n * 4), *ref = malloc(n * 4);
        for (int r = 0; r < 3; r++) {
            x[r] = malloc(n * 4);
            fill(x[r], n, r, 0, 99);
        }
        memcpy(buf, x[gb], n * 4);
        bg_request_t *rq;
        RK_OK(bg_group_iallreduce_algo(B, buf, n, BG_F32, BG_REDUCE_SUM, BG_ALLREDUCE_RING, &rq));
        RK_OK(bg_wait(rq));
        bg_request_free(rq);
        ref_ring(x, 3, n, 0, ref);
        RK_CHECK(memcmp(buf, ref, n * 4) == 0, "subset group allreduce differs from the ring order");
        /* broadcast from group rank 2 (world 2) */
        char msg[100];
        memset(msg, gb == 2 ? 'z' : 0, sizeof(msg));
        RK_OK(bg_group_bcast(B, msg, sizeof(msg), BG_U8, 2));
        for (size_t i = 0; i < sizeof(msg); i++)
            RK_CHECK(msg[i] == 'z', "bcast byte %zu", i);
        /* allgather of 5 odd-sized blocks */
        char mine[5], all[15];
        for (int i = 0; i < 5; i++)
            mine[i] = (char)('a' + gb * 5 + i);
        RK_OK(bg_group_allgather(B, mine, all, 5, BG_U8));
        for (int i = 0; i < 15; i++)
            RK_CHECK(all[i] == (char)('a' + i), "allgather byte %d is %c", i, all[i]);
        /* reduce-scatter: 3 x 7 floats, average */
        size_t cnt = 7;
        float *in[3], out[7];
        for (int r = 0; r < 3; r++) {
            in[r] = malloc(cnt * 3 * 4);
            fill(in[r], cnt * 3, r, 0, 5);
        }
        RK_OK(bg_group_reduce_scatter(B, in[gb], out, cnt, BG_F32, BG_REDUCE_AVG));
        float *full = malloc(cnt * 3 * 4);
        ref_ring(in, 3, cnt * 3, 1, full);
        RK_CHECK(memcmp(out, full + (size_t)gb * cnt, cnt * 4) == 0, "reduce-scatter block %d", gb);
        /* the non-blocking twins send the same messages: some members wait for them while another calls
         * the blocking one, and the results are the same bits; the send buffer is copied at the start */
        float *inc = malloc(cnt * 3 * 4), out2[7];
        memcpy(inc, in[gb], cnt * 3 * 4);
        if (gb == 0) {
            RK_OK(bg_group_reduce_scatter(B, inc, out2, cnt, BG_F32, BG_REDUCE_AVG));
        } else {
            RK_OK(bg_group_ireduce_scatter(B, inc, out2, cnt, BG_F32, BG_REDUCE_AVG, &rq));
            memset(inc, 0xff, cnt * 3 * 4); /* NaNs: read after the start, they would show */
            RK_OK(bg_wait(rq));
            bg_request_free(rq);
        }
        RK_CHECK(memcmp(out2, out, cnt * 4) == 0, "non-blocking reduce-scatter block %d differs", gb);
        free(inc);
        char mine2[5], all2[15];
        memcpy(mine2, mine, 5);
        if (gb == 1) {
            RK_OK(bg_group_allgather(B, mine2, all2, 5, BG_U8));
        } else {
            RK_OK(bg_group_iallgather(B, mine2, all2, 5, BG_U8, &rq));
            memset(mine2, '?', 5);
            RK_OK(bg_wait(rq));
            bg_request_free(rq);
        }
        RK_CHECK(memcmp(all2, all, 15) == 0, "non-blocking allgather differs on member %d", gb);
        /* in-place reduce-scatter (--zero): each member's chunk bit for bit the
         * allreduce's, ring-sized (1001 x 4 B with a small-buffer threshold of
         * 64 KiB is below it: recursive doubling, whole) and 20011 floats (ring);
         * then the chunk allgather gives every member the whole allreduce */
        size_t lens[2] = {1001, 20011};
        for (int li = 0; li < 2; li++) {
            size_t len = lens[li];
            float *y[3], *got = malloc(len * 4), *want = malloc(len * 4);
            for (int r = 0; r < 3; r++) {
                y[r] = malloc(len * 4);
                fill(y[r], len, r, 0, 50 + (uint64_t)li);
            }
            memcpy(want, y[gb], len * 4);
            RK_OK(bg_group_allreduce(B, want, len, BG_F32, BG_REDUCE_SUM));
            memcpy(got, y[gb], len * 4);
            RK_OK(bg_group_ireduce_scatter_inplace(B, got, len, BG_F32, BG_REDUCE_SUM, &rq));
            RK_OK(bg_wait(rq));
            bg_request_free(rq);
            size_t co, cl;
            bg_group_chunk(len, 3, gb, &co, &cl);
            RK_CHECK(cl == len / 3 + ((size_t)gb < len % 3), "chunk %d of %zu has %zu", gb, len, cl);
            RK_CHECK(memcmp(got + co, want + co, cl * 4) == 0, "in-place reduce-scatter chunk %d of %zu", gb, len);
            for (size_t i = 0; i < len; i++) /* others' chunks: garbage the gather must overwrite */
                if (i < co || i >= co + cl)
                    got[i] = -1e30f;
            RK_OK(bg_group_iallgather_chunks(B, got, len, BG_F32, &rq));
            RK_OK(bg_wait(rq));
            bg_request_free(rq);
            RK_CHECK(memcmp(got, want, len * 4) == 0, "chunk allgather of %zu differs from the allreduce", len);
            for (int r = 0; r < 3; r++)
                free(y[r]);
            free(got);
            free(want);
        }
        RK_OK(bg_group_barrier(B));
        for (int r = 0; r < 3; r++) {
            free(x[r]);
            free(in[r]);
        }
        free(full);
        free(buf);
        free(ref);
    }
    /* concurrent: several buckets on W, plus one on A, all in flight at once */
    enum { NB = 4 };
    size_t n = 50000;
    float *bk[NB], av[3] = {1, 2, 3};
    bg_request_t *rq[NB], *ra = NULL;
    for (int b = 0; b < NB; b++) {
        bk[b] = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            bk[b][i] = (float)(rank * 1000 + b * 10) + (float)(i % 7);
        RK_OK(bg_group_iallreduce(W, bk[b], n, BG_F32, BG_REDUCE_SUM, &rq[b]));
    }
    if (bg_group_rank(A) >= 0) {
        av[0] = (float)rank;
        RK_OK(bg_group_iallreduce(A, av, 3, BG_F32, BG_REDUCE_AVG, &ra));
    }
    for (int b = 0; b < NB; b++) {
        RK_OK(bg_wait(rq[b]));
        bg_request_free(rq[b]);
        for (size_t i = 0; i < n; i++) {
            float want = (float)((0 + 1 + 2 + 3) * 1000 + 4 * b * 10) + 4.0f * (float)(i % 7);
            RK_CHECK(bk[b][i] == want, "bucket %d element %zu is %g, expected %g", b, i, bk[b][i], want);
        }
        free(bk[b]);
    }
    if (ra) {
        RK_OK(bg_wait(ra));
        bg_request_free(ra);
        RK_CHECK(av[0] == 2.0f && av[1] == 2.0f && av[2] == 3.0f, "group A average %g %g %g", av[0], av[1],
                 av[2]);
    }
    RK_OK(bg_group_barrier(W));
    bg_group_destroy(A);
    bg_group_destroy(B);
    bg_group_destroy(W);
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_groups_4(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(4, rank_groups, NULL, 60, bgt_env, -1, &r), 0);
}

/* A non-blocking allreduce completes while every rank sleeps (no transport
 * call at all): the communication thread posts the steps and reduces. */
static int rank_background(int rank, int world, void *arg)
{
    (void)arg;
    bg_comm_t *c;
    RK_OK(bg_comm_create(NULL, &c));
    int all[3] = {0, 1, 2};
    bg_group_t *g;
    RK_OK(bg_group_create(c, world, all, &g));
    size_t n = 1u << 20; /* 4 MiB: ring, 4 steps */
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rank + 1);
    bg_request_t *rq;
    RK_OK(bg_group_iallreduce(g, x, n, BG_F32, BG_REDUCE_SUM, &rq));
    int done = 0;
    for (int i = 0; i < 200 && !done; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
        done = atomic_load(&rq->done); /* read without progressing anything */
    }
    RK_CHECK(done, "a 4 MiB allreduce did not finish in 2 s without test/wait calls");
    RK_OK(bg_wait(rq));
    bg_request_free(rq);
    for (size_t i = 0; i < n; i++)
        RK_CHECK(x[i] == 6.0f, "element %zu is %g", i, x[i]);
    free(x);
    bg_group_destroy(g);
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_background_3(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(3, rank_background, NULL, 60, bgt_env, -1, &r), 0);
}

/* Element types other than fp32, on 3 ranks (ring and recursive doubling):
 * fp64 keeps what fp32 would lose (each rank adds 2^-40 * (rank + 1) to 1:
 * the fp32 sum would be exactly 3), int64 sums beyond int32's range and
 * averages truncating toward zero, int32 wraps modulo 2^32, bf16 sums small
 * integers exactly, in each algorithm's order, rounding ties to even; the
 * typed reduce-scatter, all-gather, broadcast and chunk gather move whole
 * elements; a reduction of BG_U8 is refused. */
static int rank_dtypes(int rank, int world, void *arg)
{
    (void)arg;
    bg_comm_t *c;
    RK_OK(bg_comm_create(NULL, &c));
    int all[3] = {0, 1, 2};
    bg_group_t *g;
    RK_OK(bg_group_create(c, world, all, &g));
    const bg_allreduce_algo_t algos[2] = {BG_ALLREDUCE_RING, BG_ALLREDUCE_RECURSIVE};
    enum { N = 1001 };
    double *d = malloc(N * sizeof(double));
    int64_t *l = malloc(N * sizeof(int64_t));
    int32_t *w = malloc(N * sizeof(int32_t));
    uint16_t *h = malloc(N * sizeof(uint16_t));
    for (int a = 0; a < 2; a++) {
        bg_request_t *rq;
        for (size_t i = 0; i < N; i++)
            d[i] = 1.0 + ldexp((double)(rank + 1), -40) * (double)(i % 5 + 1);
        RK_OK(bg_group_iallreduce_algo(g, d, N, BG_F64, BG_REDUCE_SUM, algos[a], &rq));
        RK_OK(bg_wait(rq));
        bg_request_free(rq);
        for (size_t i = 0; i < N; i++) {
            double want = 3.0 + ldexp(6.0, -40) * (double)(i % 5 + 1);
            RK_CHECK(d[i] == want, "fp64 algo %d element %zu is %.17g, expected %.17g", a, i, d[i], want);
        }
        for (size_t i = 0; i < N; i++)
            l[i] = (int64_t)3000000000ll * (rank + 1) - (int64_t)i - (rank == 2 ? 2 : 0);
        RK_OK(bg_group_iallreduce_algo(g, l, N, BG_I64, BG_REDUCE_AVG, algos[a], &rq));
        RK_OK(bg_wait(rq));
        bg_request_free(rq);
        for (size_t i = 0; i < N; i++) { /* (18e9 - 3i - 2) / 3, truncated */
            int64_t want = (18000000000ll - 3 * (int64_t)i - 2) / 3;
            RK_CHECK(l[i] == want, "int64 algo %d element %zu is %lld, expected %lld", a, i, (long long)l[i],
                     (long long)want);
        }
        for (size_t i = 0; i < N; i++)
            w[i] = rank == 0 ? INT32_MAX : (int32_t)i;
        RK_OK(bg_group_iallreduce_algo(g, w, N, BG_I32, BG_REDUCE_SUM, algos[a], &rq));
        RK_OK(bg_wait(rq));
        bg_request_free(rq);
        for (size_t i = 0; i < N; i++) {
            int32_t want = (int32_t)(uint32_t)((uint32_t)INT32_MAX + 2u * (uint32_t)i);
            RK_CHECK(w[i] == want, "int32 algo %d element %zu is %d, expected %d", a, i, w[i], want);
        }
        /* bf16: 0x3f80 is 1.0, 0x3b80 is 2^-8 (bf16's spacing at 1 is 2^-7), 0x3c40 is 1.5 * 2^-7.
         * Element 0 is 1 (rank 0) and 2^-8 (ranks 1, 2): the ring adds 2^-8 + 2^-8 + 1 = 1 + 2^-7
         * (0x3f81) exactly; recursive doubling adds (1 + 2^-8) + 2^-8, two ties that round to the
         * even 1.0 each time. Element 1 is 1 + 0 + 1.5 * 2^-7 in either order: a tie between 0x3f81
         * and 0x3f82, to even 0x3f82 (truncation would give 0x3f81). The rest: 2 + 4 + 8 = 14. */
        for (size_t i = 0; i < N; i++)
            h[i] = i == 0   ? (rank == 0 ? 0x3f80 : 0x3b80)
                 : i == 1 ? (rank == 0 ? 0x3f80 : rank == 1 ? 0 : 0x3c40)
                          : (uint16_t)(0x3f80 + 0x80 * (rank + 1));
        RK_OK(bg_group_iallreduce_algo(g, h, N, BG_BF16, BG_REDUCE_SUM, algos[a], &rq));
        RK_OK(bg_wait(rq));
        bg_request_free(rq);
        for (size_t i = 0; i < N; i++) {
            uint16_t want = i == 0 ? (algos[a] == BG_ALLREDUCE_RING ? 0x3f81 : 0x3f80) : i == 1 ? 0x3f82 : 0x4160;
            RK_CHECK(h[i] == want, "bf16 algo %d element %zu is 0x%04x, expected 0x%04x", a, i, h[i], want);
        }
    }
    /* typed reduce-scatter: 3 x 4 doubles, member i gets elements [4i, 4i + 4) of the sum */
    double rs_in[12], rs_out[4];
    for (int i = 0; i < 12; i++)
        rs_in[i] = (double)(i * 10 + rank) + 0.125;
    RK_OK(bg_group_reduce_scatter(g, rs_in, rs_out, 4, BG_F64, BG_REDUCE_SUM));
    for (int i = 0; i < 4; i++) {
        int e = rank * 4 + i;
        RK_CHECK(rs_out[i] == (double)(e * 30 + 3) + 0.375, "fp64 reduce-scatter element %d is %g", e, rs_out[i]);
    }
    /* typed all-gather and broadcast */
    int64_t mine[2] = {(int64_t)rank << 40, -(int64_t)rank}, got[6];
    RK_OK(bg_group_allgather(g, mine, got, 2, BG_I64));
    for (int r = 0; r < 3; r++)
        RK_CHECK(got[2 * r] == (int64_t)r << 40 && got[2 * r + 1] == -(int64_t)r, "int64 allgather of rank %d", r);
    double b[3] = {rank == 1 ? 0.1 : 0, rank == 1 ? 1e300 : 0, rank == 1 ? -2.5 : 0};
    RK_OK(bg_group_bcast(g, b, 3, BG_F64, 1));
    RK_CHECK(b[0] == 0.1 && b[1] == 1e300 && b[2] == -2.5, "fp64 broadcast %g %g %g", b[0], b[1], b[2]);
    /* chunk gather of int64: member i contributes chunk i */
    for (size_t i = 0; i < N; i++)
        l[i] = -1;
    size_t co, cl;
    bg_group_chunk(N, 3, rank, &co, &cl);
    for (size_t i = co; i < co + cl; i++)
        l[i] = (int64_t)i << 33;
    bg_request_t *rq;
    RK_OK(bg_group_iallgather_chunks(g, l, N, BG_I64, &rq));
    RK_OK(bg_wait(rq));
    bg_request_free(rq);
    for (size_t i = 0; i < N; i++)
        RK_CHECK(l[i] == (int64_t)i << 33, "int64 chunk gather element %zu", i);
    uint8_t u = 1;
    RK_CHECK(bg_group_allreduce(g, &u, 1, BG_U8, BG_REDUCE_SUM) == BG_ERR_INVALID, "a uint8 sum was accepted");
    RK_CHECK(bg_group_allreduce(g, &u, 1, (bg_dtype_t)99, BG_REDUCE_SUM) == BG_ERR_INVALID, "type 99 accepted");
    RK_OK(bg_group_barrier(g));
    free(d);
    free(l);
    free(w);
    free(h);
    bg_group_destroy(g);
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_dtypes_3(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(3, rank_dtypes, NULL, 60, bgt_env, -1, &r), 0);
}

/* Elements group rank i sends group rank j in round k: a count in 0..4 that varies with i, j and k. */
static size_t a2a_count(int i, int j, int k) { return (size_t)((i * 7 + j * 3 + k * 5 + 1) % 5); }
/* Element e of what i sends j: unique over (i, j, e) and the round. */
static int32_t a2a_val(int i, int j, size_t e, int k) { return (int32_t)(k * 1000000 + i * 10000 + j * 100 + (int)e); }

/* One all-to-all round on g: counts exchanged by an alltoallv of one int64 each, then the data (blocking in even
 * rounds, bg_group_ialltoallv waited for in odd ones); the
 * receive buffer is compared with the blocks every other member's send buffer holds for this one. */
static int a2a_round(bg_group_t *g, int k)
{
    int n = bg_group_size(g), me = bg_group_rank(g);
    size_t sc[8], sd[8], rc[8], rd[8], one[8], disp[8], st = 0, rt = 0;
    int64_t cs[8], cr[8];
    for (int j = 0; j < n; j++) {
        sc[j] = a2a_count(me, j, k), sd[j] = st, st += sc[j] + 1; /* a gap between blocks */
        cs[j] = (int64_t)sc[j], one[j] = 1, disp[j] = (size_t)j;
    }
    RK_OK(bg_group_alltoallv(g, cs, one, disp, cr, one, disp, BG_I64));
    for (int i = 0; i < n; i++) {
        RK_CHECK(cr[i] == (int64_t)a2a_count(i, me, k), "count from %d is %lld", i, (long long)cr[i]);
        rc[i] = (size_t)cr[i], rd[i] = rt, rt += rc[i];
    }
    int32_t *sb = calloc(st + 1, sizeof(int32_t)), *rb = calloc(rt + 1, sizeof(int32_t));
    int32_t *want = calloc(rt + 1, sizeof(int32_t));
    for (int j = 0; j < n; j++)
        for (size_t e = 0; e < sc[j]; e++)
            sb[sd[j] + e] = a2a_val(me, j, e, k);
    if (k & 1) { /* odd rounds: the non-blocking one, the same messages */
        bg_request_t *rq = NULL;
        RK_OK(bg_group_ialltoallv(g, sb, sc, sd, rb, rc, rd, BG_I32, &rq));
        bg_status_t ws = bg_wait(rq);
        bg_request_free(rq);
        RK_OK(ws);
    } else {
        RK_OK(bg_group_alltoallv(g, sb, sc, sd, rb, rc, rd, BG_I32));
    }
    /* brute force: build every member i's send buffer as it does, take its block for me */
    for (int i = 0; i < n; i++) {
        size_t off = 0, mine = 0;
        int32_t *other = calloc(64, sizeof(int32_t));
        for (int j = 0; j < n; j++) {
            for (size_t e = 0; e < a2a_count(i, j, k); e++)
                other[off + e] = a2a_val(i, j, e, k);
            if (j == me)
                mine = off;
            off += a2a_count(i, j, k) + 1;
        }
        memcpy(want + rd[i], other + mine, rc[i] * sizeof(int32_t));
        free(other);
    }
    int same = memcmp(rb, want, rt * sizeof(int32_t)) == 0;
    free(sb), free(rb), free(want);
    RK_CHECK(same, "all-to-all round %d on group rank %d differs from the brute-force exchange", k, me);
    return 0;
}

static int rank_alltoallv(int rank, int world, void *arg)
{
    (void)arg;
    bg_comm_t *c;
    RK_OK(bg_comm_create(NULL, &c));
    int all[4] = {0, 1, 2, 3}, sub[3] = {3, 0, 2};
    bg_group_t *g, *s = NULL;
    RK_OK(bg_group_create(c, world, all, &g));
    for (int k = 0; k < 4; k++)
        if (a2a_round(g, k))
            return 1;
    if (world == 4) {
        RK_OK(bg_group_create(c, 3, sub, &s));
        for (int k = 0; k < 3 && rank != 1; k++)
            if (a2a_round(s, k))
                return 1;
    }
    /* a member whose own block's counts disagree is refused before anything is sent */
    size_t one[4] = {1, 1, 1, 1}, two[4] = {2, 2, 2, 2}, d[4] = {0, 1, 2, 3};
    int32_t x[8] = {0}, y[8];
    RK_CHECK(bg_group_alltoallv(g, x, one, d, y, two, d, BG_I32) == BG_ERR_INVALID, "unequal own counts accepted");
    bg_request_t *rq = NULL;
    RK_CHECK(bg_group_ialltoallv(g, x, one, d, y, two, d, BG_I32, &rq) == BG_ERR_INVALID && !rq,
             "non-blocking: unequal own counts accepted");
    RK_CHECK(bg_group_ialltoallv(g, x, one, d, y, one, d, BG_I32, NULL) == BG_ERR_INVALID, "NULL request accepted");
    RK_OK(bg_group_barrier(g));
    bg_group_destroy(s);
    bg_group_destroy(g);
    RK_OK(bg_comm_destroy(c));
    return 0;
}

static void test_alltoallv_3(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(3, rank_alltoallv, NULL, 60, bgt_env, -1, &r), 0);
}

static void test_alltoallv_4(void **s)
{
    (void)s;
    bgt_result_t r;
    assert_int_equal(bgt_run_ranks(4, rank_alltoallv, NULL, 60, bgt_env, -1, &r), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_2),
        cmocka_unit_test(test_allreduce_3),
        cmocka_unit_test(test_allreduce_4),
        cmocka_unit_test(test_groups_4),
        cmocka_unit_test(test_background_3),
        cmocka_unit_test(test_dtypes_3),
        cmocka_unit_test(test_alltoallv_3),
        cmocka_unit_test(test_alltoallv_4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
