/* tests/transport/bgt_mpi_allreduce.c: a rank program for the mpirun
 * integration test. It links no MPI: it is bootstrapped from the
 * OMPI_COMM_WORLD_* variables mpirun sets (store on 127.0.0.1, port derived
 * from the Open MPI job id), checks rank/size against them, runs a ring
 * exchange and allreduces (sum, average; both algorithms) on integer-valued
 * data compared exactly with the serial sum, and exits non-zero on a mismatch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brigade/core.h"
#include "brigade/transport.h"

#define FAIL(...) do { fprintf(stderr, "rank %d: ", rank); fprintf(stderr, __VA_ARGS__); \
                       fprintf(stderr, "\n"); return 1; } while (0)

int main(void)
{
    int rank = -1;
    const char *er = getenv("OMPI_COMM_WORLD_RANK"), *es = getenv("OMPI_COMM_WORLD_SIZE");
    if (!er || !es) {
        fprintf(stderr, "bgt_mpi_allreduce: run me under mpirun (OMPI_COMM_WORLD_* not set)\n");
        return 2;
    }
    bg_comm_t *c;
    bg_status_t st = bg_comm_create(NULL, &c);
    if (st != BG_OK) {
        fprintf(stderr, "rank %s: bg_comm_create: %s\n", er, bg_last_error());
        return 1;
    }
    rank = bg_comm_rank(c);
    int R = bg_comm_size(c);
    if (rank != atoi(er) || R != atoi(es))
        FAIL("rank/size %d/%d, Open MPI says %s/%s", rank, R, er, es);
    int right = (rank + 1) % R, left = (rank + R - 1) % R, got = -1;
    bg_request_t *rq;
    if (bg_irecv(c, left, 1, &got, sizeof(got), &rq) != BG_OK || bg_send(c, right, 1, &rank, sizeof(rank)) != BG_OK ||
        bg_wait(rq) != BG_OK)
        FAIL("ring exchange: %s", bg_last_error());
    bg_request_free(rq);
    if (got != left)
        FAIL("ring exchange: got %d from rank %d", got, left);
    int *all = malloc((size_t)R * sizeof(int));
    for (int i = 0; i < R; i++)
        all[i] = i;
    bg_group_t *g;
    if (bg_group_create(c, R, all, &g) != BG_OK)
        FAIL("group: %s", bg_last_error());
    const size_t counts[] = {1, 7, 1001, 300007};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
        for (int algo = 1; algo <= 2; algo++)
            for (int avg = 0; avg < 2; avg++) {
                size_t n = counts[k];
                float *x = malloc(n * sizeof(float));
                for (size_t i = 0; i < n; i++)
                    x[i] = (float)((int)((i * 7 + (size_t)rank * 13) % 101) - 50);
                if (bg_group_iallreduce_algo(g, x, n, BG_F32, avg ? BG_REDUCE_AVG : BG_REDUCE_SUM,
                                             (bg_allreduce_algo_t)algo, &rq) != BG_OK || bg_wait(rq) != BG_OK)
                    FAIL("allreduce of %zu: %s", n, bg_last_error());
                bg_request_free(rq);
                for (size_t i = 0; i < n; i++) {
                    int s = 0;
                    for (int r = 0; r < R; r++)
                        s += (int)((i * 7 + (size_t)r * 13) % 101) - 50;
                    float want = avg ? (float)s / (float)R : (float)s;
                    if (x[i] != want)
                        FAIL("allreduce of %zu (algo %d, avg %d): element %zu is %g, serial sum %g", n, algo,
                             avg, i, x[i], want);
                }
                free(x);
            }
    bg_group_destroy(g);
    free(all);
    if (bg_comm_destroy(c) != BG_OK)
        FAIL("destroy: %s", bg_last_error());
    if (rank == 0)
        printf("bgt_mpi_allreduce: %d ranks OK\n", R);
    return 0;
}
