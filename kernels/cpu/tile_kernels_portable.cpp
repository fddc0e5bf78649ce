// The portable tile kernels for the compiler's baseline target (see tile_kernels_generic.inl).
#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu::tile {

namespace {
#define SHARDLINE_TILE_HAS_FMA 0
#include "kernels/cpu/tile_kernels_generic.inl"
#undef SHARDLINE_TILE_HAS_FMA
}  // namespace

TileKernels portable_tile_kernels() { return {f32_tile, bf16_tile, int8_tile}; }

namespace {
std::uint64_t read_bytes(const std::byte* data, std::size_t bytes) {
  // Eight independent sums over 64-byte lines keep several loads in flight.
  const auto* words = reinterpret_cast<const std::uint64_t*>(data);
  std::uint64_t sum[8] = {};
  const std::size_t n = bytes / 64 * 8;
  for (std::size_t i = 0; i < n; i += 8) {
    for (int j = 0; j < 8; ++j) sum[j] += words[i + j];
  }
  std::uint64_t total = 0;
  for (int j = 0; j < 8; ++j) total += sum[j];
  for (std::size_t i = n * 8; i < bytes; ++i) total += static_cast<std::uint8_t>(data[i]);
  return total;
}
}  // namespace

ReadKernel portable_read_kernel() { return read_bytes; }

}  // namespace shardline::kernels::cpu::tile
