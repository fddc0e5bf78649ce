#include "kernels/cpu/bandwidth_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu {

namespace {
// Folded into by every probe, so the compiler must perform the reads.
std::atomic<std::uint64_t> g_sink{0};
// A claim of the probe's lines: 16 KiB, a few microseconds of reading for one CAS on a thread's own line.
constexpr int kRunLines = 4096;
}  // namespace

std::uint64_t stream_read(std::span<const ReadRegion> regions) {
  const tile::ReadKernel read =
      active_isa() >= Isa::kAvx512 ? tile::avx512_read_kernel() : tile::portable_read_kernel();
  // The regions as one run of 64-byte lines, as matmul's tiles are: each thread a band of them, taken in
  // runs of kRunLines, and a thread done with its band reads from the back of a slower one's
  // (StealingBands). first_line[i]: the line where region i starts.
  std::vector<std::size_t> first_line(regions.size() + 1, 0);
  for (std::size_t i = 0; i < regions.size(); ++i) first_line[i + 1] = first_line[i] + (regions[i].bytes + 63) / 64;
  const std::size_t total_lines = first_line.back();
  SL_CHECK_MSG(total_lines <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
               "{} lines of 64 bytes are too many for one probe", total_lines);
  std::atomic<std::uint64_t> total{0};
  run_team([&](Team team) {
    StealingBands lines(static_cast<int>(total_lines), kRunLines, team);
    std::uint64_t sum = 0;
    for (Band run = lines.next(); run.begin >= 0; run = lines.next()) {
      // The regions the run crosses, each read from the run's part of it.
      auto region = std::upper_bound(first_line.begin(), first_line.end(), static_cast<std::size_t>(run.begin)) - 1;
      for (std::size_t line = run.begin; line < static_cast<std::size_t>(run.end); ++region) {
        const std::size_t i = static_cast<std::size_t>(region - first_line.begin());
        const std::size_t end_line = std::min<std::size_t>(first_line[i + 1], run.end);
        const std::size_t begin = (line - first_line[i]) * 64;
        const std::size_t end = std::min(regions[i].bytes, (end_line - first_line[i]) * 64);
        if (begin < end) sum += read(regions[i].data + begin, end - begin);
        line = end_line;
      }
    }
    total.fetch_add(sum, std::memory_order_relaxed);
  });
  return total.load(std::memory_order_relaxed);
}

double time_stream_read(std::span<const ReadRegion> regions) {
  const auto start = std::chrono::steady_clock::now();
  g_sink.fetch_add(stream_read(regions), std::memory_order_relaxed);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace shardline::kernels::cpu
