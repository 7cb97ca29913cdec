/* The yardstick for the local communicator: Open MPI's MPI_Allreduce (float sum) between the ranks
 * of one machine, timed the way `cohort bench allreduce` times the local one (same sizes, a checked
 * call, 3 warm-up calls, then iterations worth about 256 MiB), printed in the same columns.
 *     mpirun -np 2 build/bench/mpi_allreduce [MIN_BYTES [MAX_BYTES]] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float fill_value(int rank, size_t i) { return (float)(rank + 1) + (float)(i % 13); }

static int run_size(float *buf, size_t count, int rank, int size)
{
    for (size_t i = 0; i < count; i++) buf[i] = fill_value(rank, i);
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int ok = 1;
    for (size_t i = 0; i < count && ok; i++) {
        float s = fill_value(0, i);
        for (int r = 1; r < size; r++) s += fill_value(r, i);
        ok = buf[i] == s;
    }
    memset(buf, 0, sizeof(float) * count);
    const size_t bytes = count * sizeof(float);
    int iters = (int)((256u << 20) / bytes);
    iters = iters < 5 ? 5 : (iters > 1000 ? 1000 : iters);
    for (int it = 0; it < 3; it++)
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int it = 0; it < iters; it++)
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / iters, tmax;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    int all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (rank == 0) {
        const double algbw = bytes / tmax / 1e9;
        printf("%12zu %12zu %10.1f %8.2f %8.2f %6s\n", bytes, count, tmax * 1e6, algbw,
               algbw * 2.0 * (size - 1) / size, all_ok ? "ok" : "WRONG");
        fflush(stdout);
    }
    return all_ok;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const size_t lo = argc > 1 ? strtoull(argv[1], NULL, 10) : 1024;
    const size_t hi = argc > 2 ? strtoull(argv[2], NULL, 10) : 64u << 20;
    float *buf = malloc(hi);
    int ok = buf != NULL && lo >= sizeof(float) && lo <= hi;
    if (rank == 0) {
        printf("# MPI_Allreduce (sum, float32), %d ranks\n", size);
        printf("%12s %12s %10s %8s %8s %6s\n", "size(B)", "count", "time(us)", "algbw", "busbw", "check");
    }
    for (size_t b = lo; ok && b <= hi; b *= 2) ok = run_size(buf, b / sizeof(float), rank, size);
    free(buf);
    MPI_Finalize();
    return ok ? 0 : 1;
}
