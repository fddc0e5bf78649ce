// The read-bandwidth probe behind every roofline Shardline reports: how fast this rank's kernel threads
// can stream a set of buffers once, split among the threads exactly as matmul splits the weights.
// Pointed at a rank's own packed weights it measures the bandwidth that decode can get from those very
// bytes, wherever they live (L2, L3 or DRAM), so "fraction of the roofline" compares like with like.
#pragma once

#include <cstddef>
#include <span>

namespace shardline::kernels::cpu {

struct ReadRegion {
  const std::byte* data = nullptr;  // 64-byte aligned
  std::size_t bytes = 0;
};

// Reads every region once with the kernel threads (each thread a contiguous band of each region) and
// returns the seconds it took.
double time_stream_read(std::span<const ReadRegion> regions);

}  // namespace shardline::kernels::cpu
