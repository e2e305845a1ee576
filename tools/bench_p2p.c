/* tools/bench_p2p.c: `brigade bench p2p` (point-to-point latency and
 * bandwidth between 2 ranks) and `brigade bench allreduce` (algorithm and bus
 * bandwidth on R ranks), both run as ranks of a job (brigade launch, mpirun,
 * torchrun...). Rank 0 prints the table and writes the JSON rows. The
 * side-by-side with ucx_perftest and MPI_Allreduce is bench/compare_transport.sh.
 * Uses the public API only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/transport.h"
#include "tools/bench.h"
#include "tools/cli.h"
#include "core/util.h"

#define BG__MAX_SIZES 64

static int bg__sizes(const char *cmd, const char *s, uint64_t *out, int *n_p)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", s);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == BG__MAX_SIZES)
            return bg_cli_fail(cmd, "--sizes: more than %d sizes", BG__MAX_SIZES), -1;
        if (!strcmp(tok, "0"))
            out[n] = 0; /* an empty message: latency only */
        else if (bg_cli_bytes(cmd, "--sizes", tok, &out[n]) != 0)
            return -1;
        n++;
    }
    if (!n)
        return bg_cli_fail(cmd, "--sizes needs at least one size"), -1;
    *n_p = n;
    return 0;
}

typedef struct {
    const char *sizes, *json, *algo;
    int reps;
    uint64_t size[BG__MAX_SIZES], max_size; /* --sizes parsed, and the largest */
    int nsizes;
} bg__bench_opts_t;

/* The options of a bench: 1 after --help, -1 after an error (printed), 0 with
 * o filled in, --sizes parsed into size[0..nsizes) and its largest. */
static int bg__parse(const char *cmd, int argc, char **argv, bg__bench_opts_t *o, const char *usage)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 1;
        } else if (!strcmp(a, "--sizes") && i + 1 < argc) {
            o->sizes = argv[++i];
        } else if (!strcmp(a, "--json") && i + 1 < argc) {
            o->json = argv[++i];
        } else if (!strcmp(a, "--algo") && i + 1 < argc) {
            o->algo = argv[++i];
        } else if (!strcmp(a, "--reps") && i + 1 < argc) {
            long long v;
            if (bg_cli_int(cmd, "--reps", argv[++i], 1, 1000, &v) != 0)
                return -1;
            o->reps = (int)v;
        } else {
            static const char *const known[] = {"--sizes", "--json", "--algo", "--reps", "--help", NULL};
            for (int k = 0; known[k]; k++)
                if (!strcmp(a, known[k])) {
                    bg_cli_fail(cmd, "%s needs a value", a);
                    return -1;
                }
            bg_cli_unknown_option(cmd, a, known);
            return -1;
        }
    }
    if (bg__sizes(cmd, o->sizes, o->size, &o->nsizes) != 0)
        return -1;
    for (int i = 0; i < o->nsizes; i++)
        o->max_size = o->size[i] > o->max_size ? o->size[i] : o->max_size;
    return 0;
}

static const char bg__p2p_usage[] =
    "usage: brigade launch -n 2 -- brigade bench p2p [--sizes LIST] [--json FILE] [--reps N]\n"
    "  Ping-pong latency (half round trip, microseconds) and streaming bandwidth\n"
    "  (a window of 16 back-to-back sends from one buffer, as ucx_perftest\n"
    "  tag_bw; GB/s = 1e9 bytes/s) between ranks 0 and 1.\n"
    "  --sizes   comma-separated sizes with K/M/G suffixes (default 8,1K,64K,1M,4M,16M,64M)\n"
    "  --json    write rows {\"bytes\", \"latency_us\", \"bandwidth_gbps\"} to FILE\n"
    "  --reps    timed repetitions per size; the median is reported (default 5)\n";

int bg_bench_p2p(int argc, char **argv)
{
    const char *cmd = "bench p2p";
    bg__bench_opts_t o = {.sizes = "8,1K,64K,1M,4M,16M,64M", .reps = 5};
    int pr = bg__parse(cmd, argc, argv, &o, bg__p2p_usage);
    if (pr)
        return pr > 0 ? 0 : 2;
    bg_comm_t *c;
    bg_comm_params_t cp = bg_cli_comm_params();
    bg_status_t st = bg_comm_create(&cp, &c);
    if (st != BG_OK)
        return bg_cli_status(cmd, st);
    int rank = bg_comm_rank(c);
    if (bg_comm_size(c) != 2) {
        int w = bg_comm_size(c);
        bg_comm_destroy(c);
        return bg_cli_fail(cmd, "needs exactly 2 ranks, got %d (brigade launch -n 2 -- brigade bench p2p)", w);
    }
    enum { WIN = 16 };
    uint64_t maxs = o.max_size;
    char *buf = malloc(maxs + 1);
    FILE *js = NULL;
    if (!buf) {
        bg_comm_destroy(c);
        return bg_cli_fail(cmd, "cannot allocate %llu bytes", (unsigned long long)maxs);
    }
    memset(buf, 1, maxs + 1);
    if (rank == 0) {
        if (o.json && !(js = fopen(o.json, "w"))) {
            free(buf);
            bg_comm_destroy(c);
            return bg_cli_fail(cmd, "cannot write %s", o.json);
        }
        printf("%12s %14s %16s\n", "bytes", "latency_us", "bandwidth_GB/s");
        if (js)
            fprintf(js, "[\n");
    }
    int peer = 1 - rank;
    double lat[1000], bw[1000];
    for (int k = 0; k < o.nsizes && st == BG_OK; k++) {
        size_t n = o.size[k];
        /* iterations per rep: about 64 MiB of traffic, 10..2000 */
        int it = (int)((64u << 20) / (n + 1));
        it = it < 10 ? 10 : it > 2000 ? 2000 : it;
        int reps = o.reps > 1000 ? 1000 : o.reps;
        for (int r = -1; r < reps && st == BG_OK; r++) { /* r = -1: warm-up */
            /* latency: ping-pong */
            double t0 = bg_now();
            for (int i = 0; i < it && st == BG_OK; i++) {
                if (rank == 0) {
                    st = bg_send(c, peer, 1, buf, n);
                    if (st == BG_OK)
                        st = bg_recv(c, peer, 2, buf, n);
                } else {
                    st = bg_recv(c, peer, 1, buf, n);
                    if (st == BG_OK)
                        st = bg_send(c, peer, 2, buf, n);
                }
            }
            double tl = (bg_now() - t0) / it / 2;
            /* bandwidth: windows of WIN sends, one ack per window */
            int wit = it / 4 > 2 ? it / 4 : 2;
            t0 = bg_now();
            for (int i = 0; i < wit && st == BG_OK; i++) {
                bg_request_t *rq[WIN];
                int posted = 0;
                for (int w = 0; w < WIN && st == BG_OK; w++, posted++)
                    /* one buffer for the whole window, as ucx_perftest does: the
                                     * figure is the transport's, not the cache's */
                    st = rank == 0 ? bg_isend(c, peer, 3, buf, n, &rq[w])
                                   : bg_irecv(c, peer, 3, buf, n, &rq[w]);
                for (int w = 0; w < posted; w++) {
                    bg_status_t s2 = bg_wait(rq[w]);
                    if (st == BG_OK)
                        st = s2;
                    bg_request_free(rq[w]);
                }
                char ack = 0;
                if (st == BG_OK)
                    st = rank == 0 ? bg_recv(c, peer, 4, &ack, 1) : bg_send(c, peer, 4, &ack, 1);
            }
            double tb = bg_now() - t0;
            if (r >= 0) {
                lat[r] = tl * 1e6;
                bw[r] = (double)n * WIN * wit / tb / 1e9;
            }
        }
        if (st != BG_OK)
            break;
        if (rank == 0) {
            double ml = bg_median(lat, (size_t)(reps)), mb = bg_median(bw, (size_t)(reps));
            printf("%12zu %14.2f %16.3f\n", n, ml, mb);
            if (js)
                fprintf(js, "  {\"bytes\": %zu, \"latency_us\": %.3f, \"bandwidth_gbps\": %.4f}%s\n", n, ml,
                        mb, k + 1 < o.nsizes ? "," : "");
            fflush(stdout);
        }
    }
    if (js) {
        fprintf(js, "]\n");
        fclose(js);
    }
    free(buf);
    if (st != BG_OK) {
        int rc = bg_cli_status(cmd, st);
        bg_comm_destroy(c);
        return rc;
    }
    bg_comm_destroy(c);
    return 0;
}

static const char bg__ar_usage[] =
    "usage: brigade launch -n R -- brigade bench allreduce [--sizes LIST] [--algo A] [--json FILE] [--reps N]\n"
    "  In-place float32 sum allreduce over all R ranks. algbw = bytes / time;\n"
    "  busbw = algbw * 2(R-1)/R (what each link carries, as nccl-tests); GB/s = 1e9 bytes/s.\n"
    "  --sizes   comma-separated byte sizes with K/M/G suffixes (default 4K,64K,1M,4M,16M,64M)\n"
    "  --algo    auto|ring|recursive|all (default all: auto, then each algorithm)\n"
    "  --json    write rows {\"bytes\", \"ranks\", \"algorithm\", \"algbw_gbps\", \"busbw_gbps\"} to FILE\n"
    "  --reps    timed repetitions per size (median reported; default 5)\n";

int bg_bench_allreduce(int argc, char **argv)
{
    const char *cmd = "bench allreduce";
    bg__bench_opts_t o = {.sizes = "4K,64K,1M,4M,16M,64M", .algo = "all", .reps = 5};
    int pr = bg__parse(cmd, argc, argv, &o, bg__ar_usage);
    if (pr)
        return pr > 0 ? 0 : 2;
    struct { const char *name; bg_allreduce_algo_t a; } algos[] = {
        {"auto", BG_ALLREDUCE_AUTO}, {"ring", BG_ALLREDUCE_RING}, {"recursive", BG_ALLREDUCE_RECURSIVE}};
    int a0 = 0, a1 = 3;
    if (strcmp(o.algo, "all") != 0) {
        for (a0 = 0; a0 < 3 && strcmp(algos[a0].name, o.algo); a0++) {
        }
        if (a0 == 3)
            return bg_cli_fail(cmd, "--algo must be auto, ring, recursive or all, got \"%s\"", o.algo);
        a1 = a0 + 1;
    }
    bg_comm_t *c;
    bg_comm_params_t cp = bg_cli_comm_params();
    bg_status_t st = bg_comm_create(&cp, &c);
    if (st != BG_OK)
        return bg_cli_status(cmd, st);
    int rank = bg_comm_rank(c), R = bg_comm_size(c);
    int *all = malloc((size_t)R * sizeof(int));
    for (int i = 0; i < R; i++)
        all[i] = i;
    bg_group_t *g = NULL;
    st = bg_group_create(c, R, all, &g);
    free(all);
    uint64_t maxs = o.max_size;
    float *buf = malloc(maxs + 4);
    FILE *js = NULL;
    if (st == BG_OK && !buf)
        st = bg_error(BG_ERR_NOMEM, "cannot allocate %llu bytes", (unsigned long long)maxs);
    if (st == BG_OK && rank == 0) {
        if (o.json && !(js = fopen(o.json, "w")))
            st = bg_error(BG_ERR_IO, "cannot write %s", o.json);
        printf("%12s %6s %10s %12s %12s\n", "bytes", "ranks", "algorithm", "algbw_GB/s", "busbw_GB/s");
        if (js)
            fprintf(js, "[\n");
    }
    int first = 1;
    double t[1000];
    for (int k = 0; k < o.nsizes && st == BG_OK; k++) {
        size_t count = o.size[k] / sizeof(float);
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)(i % 13) * 0.25f;
        for (int a = a0; a < a1 && st == BG_OK; a++) {
            int it = (int)((256u << 20) / (o.size[k] * (size_t)R + 1));
            it = it < 3 ? 3 : it > 500 ? 500 : it;
            int reps = o.reps > 1000 ? 1000 : o.reps;
            for (int r = -1; r < reps && st == BG_OK; r++) {
                st = bg_group_barrier(g);
                double t0 = bg_now();
                for (int i = 0; i < it && st == BG_OK; i++) {
                    bg_request_t *rq;
                    st = bg_group_iallreduce_algo(g, buf, count, BG_F32, BG_REDUCE_SUM, algos[a].a, &rq);
                    if (st == BG_OK) {
                        st = bg_wait(rq);
                        bg_request_free(rq);
                    }
                }
                if (r >= 0)
                    t[r] = (bg_now() - t0) / it;
            }
            if (st != BG_OK || rank != 0)
                continue;
            double tm = bg_median(t, (size_t)(reps));
            double alg = (double)count * 4 / tm / 1e9, bus = alg * 2.0 * (R - 1) / R;
            printf("%12zu %6d %10s %12.3f %12.3f\n", count * 4, R, algos[a].name, alg, bus);
            fflush(stdout);
            if (js) {
                fprintf(js, "%s  {\"bytes\": %zu, \"ranks\": %d, \"algorithm\": \"%s\", \"algbw_gbps\": %.4f, "
                        "\"busbw_gbps\": %.4f}", first ? "" : ",\n", count * 4, R, algos[a].name, alg, bus);
                first = 0;
            }
        }
    }
    if (js) {
        fprintf(js, "\n]\n");
        fclose(js);
    }
    free(buf);
    bg_group_destroy(g);
    int rc = 0;
    if (st != BG_OK)
        rc = bg_cli_status(cmd, st);
    bg_comm_destroy(c);
    return rc;
}
