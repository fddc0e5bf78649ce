// main() of the GoogleTest programs that run under mpirun: every rank runs every test between MPI_Init and
// MPI_Finalize, and the process exits with its own result (mpirun reports the worst).
#include <mpi.h>

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  MPI_Finalize();
  return result;
}
