/* The collective benchmark's Open MPI reference: the same size sweep as
 * collective_sweep.h, float32 only, through MPI's own collectives, timed the same way
 * (warm-up operations, a barrier, then the timed ones back to back; each rank's mean; the
 * slowest rank's mean is the time). bench_collectives starts it under mpirun with the
 * shared-memory transport (--mca btl self,vader) and reads one line per size from rank 0:
 * "BYTES SECONDS_PER_OP".
 *
 *   mpi_sweep OP WARMUP ITERS COUNT...   (OP: allreduce allgather reducescatter broadcast
 *                                         alltoall barrier; COUNT: elements of the whole
 *                                         buffer, as nccl-tests counts it) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run(const char* op, long count, int world, float* a, float* b) {
  const long chunk = count / world;
  if (strcmp(op, "allreduce") == 0) {
    MPI_Allreduce(a, b, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (strcmp(op, "allgather") == 0) {
    MPI_Allgather(a, (int)chunk, MPI_FLOAT, b, (int)chunk, MPI_FLOAT, MPI_COMM_WORLD);
  } else if (strcmp(op, "reducescatter") == 0) {
    MPI_Reduce_scatter_block(a, b, (int)chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (strcmp(op, "broadcast") == 0) {
    MPI_Bcast(a, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);
  } else if (strcmp(op, "alltoall") == 0) {
    MPI_Alltoall(a, (int)chunk, MPI_FLOAT, b, (int)chunk, MPI_FLOAT, MPI_COMM_WORLD);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 4) {
    if (rank == 0) fprintf(stderr, "usage: mpi_sweep OP WARMUP ITERS COUNT...\n");
    MPI_Finalize();
    return 2;
  }
  const char* op = argv[1];
  const int warmup = atoi(argv[2]);
  const int iters = atoi(argv[3]);
  for (int i = 4; i < argc || (i == 4 && strcmp(op, "barrier") == 0); ++i) {
    const long count = i < argc ? atol(argv[i]) : 0;
    float* a = calloc((size_t)count + 1, sizeof(float));
    float* b = calloc((size_t)count + 1, sizeof(float));
    if (a == NULL || b == NULL) {
      fprintf(stderr, "mpi_sweep: out of memory at %ld elements\n", count);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (long j = 0; j < count; ++j) a[j] = (float)(rank + j % 7);
    for (int w = 0; w < warmup; ++w) run(op, count, world, a, b);
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int t = 0; t < iters; ++t) run(op, count, world, a, b);
    double mean = (MPI_Wtime() - start) / iters;
    double slowest = 0;
    MPI_Reduce(&mean, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%ld %.9f\n", count * (long)sizeof(float), slowest);
    free(a);
    free(b);
  }
  fflush(stdout);
  MPI_Finalize();
  return 0;
}
