// How fast this CPU retires vdpbf16ps against vfmadd231ps (compiled with -mavx512bf16; called only where
// the CPU has AVX512_BF16). The bf16-dot tile kernel does one vdpbf16ps per 32 weights and half of x, where
// the widening kernel does an FMA and a shift or mask per 16 weights, so the dots win only where vdpbf16ps
// runs at a good share of the FMA rate: 0.94 of it on an AMD Zen 5 VM, a quarter on an Intel Emerald Rapids
// one (BENCHMARKS.md, sessions 22 and 24).
#include <immintrin.h>

#include <chrono>

#include "kernels/cpu/isa.h"

namespace shardline::kernels::cpu {

namespace {

// Enough independent sums to cover a 6-cycle latency at two instructions a cycle.
constexpr int kChains = 12;
constexpr int kIterations = 8192;  // 98304 instructions: 20-80 us

// Seconds for kIterations x kChains instructions of one kind; dots: vdpbf16ps, else vfmadd231ps.
double time_instructions(bool dots) {
  __m512 sums[kChains];
  for (int c = 0; c < kChains; ++c) sums[c] = _mm512_set1_ps(static_cast<float>(c) * 1e-9f);
  __m512i pair = _mm512_set1_epi32(0x3f803f80);  // two bf16 ones
  __m512 factor = _mm512_set1_ps(0.999999f);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kIterations; ++i) {
    // Opaque to the optimiser, so the loop body is really executed kIterations times.
    __asm__ volatile("" : "+v"(pair), "+v"(factor));
    if (dots) {
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) {
        sums[c] = _mm512_dpbf16_ps(sums[c], reinterpret_cast<__m512bh>(pair), reinterpret_cast<__m512bh>(pair));
      }
    } else {
#pragma GCC unroll 12
      for (int c = 0; c < kChains; ++c) sums[c] = _mm512_fmadd_ps(sums[c], factor, factor);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  __m512 total = sums[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, sums[c]);
  volatile float keep = _mm512_reduce_add_ps(total);
  (void)keep;
  return seconds;
}

}  // namespace

double measure_bf16_dot_rate() {
  // The fastest of five alternating tries of each: the first warms the vector units up, and a try that
  // another process interrupted loses to one that ran undisturbed.
  double best_dots = 1e9, best_fmas = 1e9;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const double dots = time_instructions(true);
    const double fmas = time_instructions(false);
    if (dots < best_dots) best_dots = dots;
    if (fmas < best_fmas) best_fmas = fmas;
  }
  return best_fmas / best_dots;
}

}  // namespace shardline::kernels::cpu
