// The read-bandwidth probe behind every roofline Shardline reports: how fast this rank's kernel threads
// can stream a set of buffers once, split among the threads exactly as matmul splits the weights.
// Pointed at a rank's own packed weights it measures the bandwidth that decode can get from those very
// bytes, wherever they live (L2, L3 or DRAM), so "fraction of the roofline" compares like with like.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace shardline::kernels::cpu {

struct ReadRegion {
  const std::byte* data = nullptr;  // 64-byte aligned
  std::size_t bytes = 0;
};

// Reads every region once with the kernel threads (the regions end to end, in bands of 64-byte lines that
// a thread done with its own takes from the back of a slower one's, as matmul's tiles are) and returns the
// seconds it took.
double time_stream_read(std::span<const ReadRegion> regions);
// The same reads, untimed: returns the sum the read kernel folds over them (tile::ReadKernel: 64-bit words,
// and single bytes past a region's last 256-byte block), so a test can tell each line was read once.
std::uint64_t stream_read(std::span<const ReadRegion> regions);

}  // namespace shardline::kernels::cpu
