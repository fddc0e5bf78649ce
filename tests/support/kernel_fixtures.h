// Set-up shared by the CPU kernel tests and benchmarks: random inputs and a scoped kernel thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"

namespace shardline::test {

// count floats uniform in [lo, hi) from rng.
inline std::vector<float> random_floats(std::mt19937& rng, std::size_t count, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(count);
  for (float& v : out) v = dist(rng);
  return out;
}

// The same from a fresh generator seeded with seed, in [-1, 1).
inline std::vector<float> random_floats(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  return random_floats(rng, count);
}

// set_num_threads is process-wide; restore it so one test's thread count never leaks into the next.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n_threads) : previous_(kernels::cpu::set_num_threads(n_threads)) {}
  ~ScopedThreads() { kernels::cpu::set_num_threads(previous_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int previous_;
};

}  // namespace shardline::test
