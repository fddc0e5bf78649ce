#include "kernels/cpu/bandwidth_probe.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu {

namespace {
// Folded into by every probe, so the compiler must perform the reads.
std::atomic<std::uint64_t> g_sink{0};
}  // namespace

double time_stream_read(std::span<const ReadRegion> regions) {
  const tile::ReadKernel read =
      active_isa() >= Isa::kAvx512 ? tile::avx512_read_kernel() : tile::portable_read_kernel();
  const int n_threads = num_threads();
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(n_threads) if (n_threads > 1)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    std::uint64_t sum = 0;
    for (const ReadRegion& region : regions) {
      // Bands on 64-byte lines, as the kernels' panels are.
      const std::size_t lines = region.bytes / 64;
      const std::size_t begin = lines * t / nt * 64;
      const std::size_t end = t + 1 == nt ? region.bytes : lines * (t + 1) / nt * 64;
      if (begin < end) sum += read(region.data + begin, end - begin);
    }
    g_sink.fetch_add(sum, std::memory_order_relaxed);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace shardline::kernels::cpu
