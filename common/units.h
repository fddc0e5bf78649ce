// Units: sizes and times carry their unit in the name (bytes, _us, _s, _gbps); these are the conversions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace shardline {

inline constexpr std::uint64_t kKiB = 1024;
inline constexpr std::uint64_t kMiB = 1024 * kKiB;
inline constexpr std::uint64_t kGiB = 1024 * kMiB;

// "1.5 GiB", "438.0 MiB", "512 B": for logs and tables.
inline std::string format_bytes(double bytes) {
  constexpr double kTiB = 1024.0 * kGiB;
  if (bytes >= 1024.0 * kTiB) return fmt::format("{:.2f} PiB", bytes / (1024.0 * kTiB));
  if (bytes >= kTiB) return fmt::format("{:.2f} TiB", bytes / kTiB);
  if (bytes >= kGiB) return fmt::format("{:.2f} GiB", bytes / kGiB);
  if (bytes >= kMiB) return fmt::format("{:.1f} MiB", bytes / kMiB);
  if (bytes >= kKiB) return fmt::format("{:.1f} KiB", bytes / kKiB);
  return fmt::format("{:.0f} B", bytes);
}

// Monotonic wall clock in seconds, for statistics (never for tests).
inline double now_s() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

}  // namespace shardline
