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
// The probe's unit of work: 4096 lines, 256 KiB, a claim of which is one compare-and-swap per 10-20 us of
// reading (claims of 16 KiB read 10% slower: each waits for the core's loads in flight). Counting blocks,
// not lines, lets an int index 512 TiB.
constexpr std::size_t kBlockLines = 4096;
}  // namespace

std::uint64_t stream_read(std::span<const ReadRegion> regions) {
  const tile::ReadKernel read =
      active_isa() >= Isa::kAvx512 ? tile::avx512_read_kernel() : tile::portable_read_kernel();
  // The regions end to end as one run of 64-byte lines, in blocks of kBlockLines, as matmul's tiles are:
  // each thread a band of the blocks, and a thread done with its band reads from the back of a slower
  // one's (StealingBands). first_line[i]: the line where region i starts.
  std::vector<std::size_t> first_line(regions.size() + 1, 0);
  for (std::size_t i = 0; i < regions.size(); ++i) first_line[i + 1] = first_line[i] + (regions[i].bytes + 63) / 64;
  const std::size_t total_lines = first_line.back();
  const std::size_t blocks = (total_lines + kBlockLines - 1) / kBlockLines;
  SL_CHECK_MSG(blocks <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
               "{} blocks of {} lines are too many for one probe", blocks, kBlockLines);
  std::atomic<std::uint64_t> total{0};
  run_team([&](Team team) {
    StealingBands runs(static_cast<int>(blocks), 1, team);
    std::uint64_t sum = 0;
    for (Band run = runs.next(); run.begin >= 0; run = runs.next()) {
      const std::size_t run_begin = run.begin * kBlockLines, run_end = std::min(run.end * kBlockLines, total_lines);
      // The regions the run crosses, each read from the run's part of it.
      auto region = std::upper_bound(first_line.begin(), first_line.end(), run_begin) - 1;
      for (std::size_t line = run_begin; line < run_end; ++region) {
        const std::size_t i = static_cast<std::size_t>(region - first_line.begin());
        const std::size_t end_line = std::min(first_line[i + 1], run_end);
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
