// Set-up shared by the CPU kernel tests and benchmarks: random inputs, a scoped kernel thread count and a
// scoped instruction-set level.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
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

// set_isa is process-wide too: steps the kernels down to isa for one scope.
class ScopedIsa {
 public:
  explicit ScopedIsa(kernels::cpu::Isa isa) : previous_(kernels::cpu::set_isa(isa)) {}
  ~ScopedIsa() { kernels::cpu::set_isa(previous_); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  kernels::cpu::Isa previous_;
};

// Every level this CPU can run, portable first.
inline std::vector<kernels::cpu::Isa> runnable_isas() {
  std::vector<kernels::cpu::Isa> isas;
  for (int level = 0; level <= static_cast<int>(kernels::cpu::best_isa()); ++level) {
    isas.push_back(static_cast<kernels::cpu::Isa>(level));
  }
  return isas;
}

}  // namespace shardline::test
