// Which ranks keep memory after one MPI_Ireduce_scatter_block (issue 30: why rank 0's RSS is the
// highest before any checkpoint save). Open MPI's non-blocking collectives (coll/libnbc) reduce to
// rank 0 over a binomial tree, then scatter: every rank mallocs twice the full input, the ranks
// that receive (rank 0 twice, rank 2 of 4 once) write into it, and with the trainer's heap policy
// (sys::keep_host_heap: no mmap, no trim) the freed pages stay resident.
//
//   mpicc -O2 -o /tmp/rs_rss bench/mpi_reduce_scatter_rss.c
//   mpirun -np 4 --oversubscribe --bind-to none /tmp/rs_rss 100     # MB of fp32 input per rank
#include <malloc.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long rss_mib(void) {
  long size = 0, resident = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f == NULL || fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
  if (f != NULL) fclose(f);
  return resident * 4 / 1024;
}

int main(int argc, char** argv) {
  int provided = 0, rank = 0, world = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mallopt(M_MMAP_MAX, 0);  // the trainer's keep_host_heap()
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const long mb = argc > 1 ? atol(argv[1]) : 100;
  const int n = (int)(mb * 1000 * 1000 / 4 / world);  // elements each rank keeps
  float* in = malloc((size_t)n * world * 4);
  float* out = malloc((size_t)n * 4);
  memset(in, 1, (size_t)n * world * 4);
  memset(out, 0, (size_t)n * 4);
  const long before = rss_mib();
  MPI_Request req;
  MPI_Ireduce_scatter_block(in, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  const long after = rss_mib();
  printf("rank %d: RSS %ld MiB before, %+ld MiB after one MPI_Ireduce_scatter_block of %ld MB\n", rank, before,
         after - before, mb);
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
