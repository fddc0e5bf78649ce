// This process's place in MPI_COMM_WORLD, for tests that run under mpirun with MPI already initialised.
#pragma once

#include <mpi.h>

namespace shardline::test {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

}  // namespace shardline::test
