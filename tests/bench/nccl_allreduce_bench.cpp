// All-reduce through the NCCL communicator on device buffers, against the MPI communicator on host buffers
// measured in the same run, at the sizes tensor parallelism sends: 16 KiB is one decode token's activations
// at dim 4096, 256 KiB a micro-batch of 16, 4 MiB and 64 MiB prefill chunks. Times include what the
// runtime pays per call through the Communicator interface (the wait for completion).
//
//   mpirun -np <GPUs on the node> nccl_allreduce_bench [--iterations 50]
//
// Rank 0 prints a table, then "RESULT key=value" lines that scripts/gpu-check.sh collects.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "common/error.h"
#include "kernels/cuda/device.h"

namespace cuda = shardline::kernels::cuda;
namespace comm = shardline::comm;

namespace {

double mean_us(shardline::comm::Communicator& c, float* data, std::size_t count, int iterations) {
  for (int i = 0; i < 3; ++i) c.all_reduce_sum(data, count);
  c.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) c.all_reduce_sum(data, count);
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iterations;
}

int run(int argc, char** argv) {
  int iterations = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iterations") iterations = std::atoi(argv[i + 1]);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // The rank's index on its node picks its GPU (one GPU per rank).
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);

  const cuda::DeviceCount devices = cuda::device_count();
  if (devices.count == 0) throw shardline::ResourceError("no CUDA device: " + devices.reason);
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  comm::NcclCommOptions options;
  options.device = cuda::device_for_local_rank(local_rank, devices.count);
  options.timeout_s = 60;
  cuda::select_device(options.device);
  auto nccl = comm::make_nccl_group(ranks, options);
  auto mpi = comm::make_mpi_group(ranks, comm::MpiCommOptions{60});

  const std::vector<std::size_t> sizes_bytes = {16u << 10, 256u << 10, 4u << 20, 64u << 20};
  if (rank == 0) {
    std::printf("all-reduce over %d ranks, %d iterations each (mean per call)\n", size, iterations);
    std::printf("%10s %12s %14s %12s %14s %10s\n", "bytes", "nccl us", "nccl busbw", "mpi us", "mpi busbw",
                "mpi/nccl");
  }
  for (const std::size_t bytes : sizes_bytes) {
    const std::size_t count = bytes / sizeof(float);
    cuda::DeviceBuffer device_data(bytes);
    cuda::fill_zero_async(device_data.data(), bytes, cuda::StreamRef{});
    std::vector<float> host_data(count, 0.0f);
    const int n = bytes >= (64u << 20) ? std::max(5, iterations / 5) : iterations;
    const double nccl_us = mean_us(*nccl, device_data.as<float>(), count, n);
    const double mpi_us = mean_us(*mpi, host_data.data(), count, n);
    // Bus bandwidth as nccl-tests defines it: what each link carries in a ring all-reduce.
    const double factor = 2.0 * (size - 1) / size;
    if (rank == 0) {
      std::printf("%10zu %12.1f %12.1f GB/s %12.1f %10.1f GB/s %9.1fx\n", bytes, nccl_us, factor * bytes / nccl_us / 1e3,
                  mpi_us, factor * bytes / mpi_us / 1e3, mpi_us / nccl_us);
      std::printf("RESULT allreduce_%zuKiB_nccl_us=%.1f\n", bytes >> 10, nccl_us);
      std::printf("RESULT allreduce_%zuKiB_mpi_us=%.1f\n", bytes >> 10, mpi_us);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    code = run(argc, argv);
  } catch (const shardline::Error& e) {
    std::fprintf(stderr, "nccl_allreduce_bench: error: %s\n", e.what());
    code = static_cast<int>(e.code());
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  MPI_Finalize();
  return code;
}
