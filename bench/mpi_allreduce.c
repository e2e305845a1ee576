/* bench/mpi_allreduce.c: the reference for `brigade bench allreduce`: Open MPI's
 * MPI_Allreduce (in place, float32 sum) timed the same way (warm-up, then the
 * median of --reps repetitions of N back-to-back calls) and printed in the same
 * columns and JSON rows, algorithm "mpi". Built only when MPI is found. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k')
        v *= 1024;
    else if (*end == 'M' || *end == 'm')
        v *= 1024 * 1024;
    else if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, R;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &R);
    const char *sizes = "4K,64K,1M,4M,16M,64M", *json = NULL;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            sizes = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            if (rank == 0)
                fprintf(stderr, "usage: mpirun -np R mpi_allreduce [--sizes LIST] [--json FILE] [--reps N]\n");
            MPI_Finalize();
            return 2;
        }
    }
    if (reps < 1 || reps > 1000)
        reps = 5;
    FILE *js = NULL;
    if (rank == 0) {
        if (json && !(js = fopen(json, "w"))) {
            fprintf(stderr, "mpi_allreduce: cannot write %s\n", json);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        printf("%12s %6s %10s %12s %12s\n", "bytes", "ranks", "algorithm", "algbw_GB/s", "busbw_GB/s");
        if (js)
            fprintf(js, "[\n");
    }
    char list[1024];
    snprintf(list, sizeof(list), "%s", sizes);
    int first = 1;
    double t[1000];
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t bytes = parse_size(tok), count = bytes / 4;
        float *buf = malloc(count * 4 + 4);
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)(i % 13) * 0.25f;
        int it = (int)((256u << 20) / (bytes * (size_t)R + 1));
        it = it < 3 ? 3 : it > 500 ? 500 : it;
        for (int r = -1; r < reps; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < it; i++)
                MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (r >= 0)
                t[r] = (MPI_Wtime() - t0) / it;
        }
        free(buf);
        if (rank != 0)
            continue;
        qsort(t, (size_t)reps, sizeof(double), cmp_d);
        double tm = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        double alg = (double)count * 4 / tm / 1e9, bus = alg * 2.0 * (R - 1) / R;
        printf("%12zu %6d %10s %12.3f %12.3f\n", count * 4, R, "mpi", alg, bus);
        fflush(stdout);
        if (js) {
            fprintf(js, "%s  {\"bytes\": %zu, \"ranks\": %d, \"algorithm\": \"mpi\", \"algbw_gbps\": %.4f, "
                    "\"busbw_gbps\": %.4f}", first ? "" : ",\n", count * 4, R, alg, bus);
            first = 0;
        }
    }
    if (js) {
        fprintf(js, "\n]\n");
        fclose(js);
    }
    MPI_Finalize();
    return 0;
}
