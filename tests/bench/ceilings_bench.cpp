// What this machine's cores and memory can do at best, to read the kernels' numbers against
// (BENCHMARKS.md, session 31). Both are x86 AVX2 + FMA loops; on a CPU without them each benchmark says so
// and skips.
//
//   ceilings_bench --benchmark_min_time=0.5
//
// BM_FmaPeak: 12 independent vfmadd231ps chains on registers, no loads: the FMA peak (items_per_second:
// flop/s, all threads together). Divided by 32 flop a cycle (two 256-bit FMA pipes), it is the cores' clock.
//
// BM_Int8DotPeak/sign:S: the AVX2 int8 kernel's integer products on registers (below), as BM_FmaPeak.
//
// BM_StreamBehindFma/fmas_per_line:F/prefetch:P: each thread streams its own 128 MiB (far past any L3) and
// makes F FMAs on registers per 64-byte line, prefetching kAheadLines ahead when P is 1 (bytes_per_second:
// the streams together; items_per_second: flop/s). F = 0 is a plain read stream. If the memory system can hide a stream behind compute, F = 48 runs as fast as
// BM_FmaPeak's 48 FMAs would alone; where it runs slower than both the stream and the FMAs alone, a
// kernel with that many FMAs per line of weights cannot reach max(compute, memory) here. (fp32 weights make
// two FMAs per line and row: 24 are 12 rows, 48 are 24; 16 rows make 32.)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include <benchmark/benchmark.h>

namespace {

bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

constexpr int kChains = 12;  // two FMA pipes x latency 4-5, with room to spare

__attribute__((target("avx2,fma"))) float fma_chains(long rounds, float factor) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 scale = _mm256_set1_ps(factor), add = _mm256_set1_ps(1e-4f);
  for (long r = 0; r < rounds; ++r) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], scale, add);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  return _mm256_cvtss_f32(sum);
}

void BM_FmaPeak(benchmark::State& state) {
  if (!has_avx2_fma()) return state.SkipWithError("this CPU has no AVX2 + FMA");
  constexpr long kRounds = 1 << 20;
  for (auto _ : state) {
    float factor = 0.999f;
    benchmark::DoNotOptimize(factor);  // an input the compiler cannot see: the call is not hoisted
    benchmark::DoNotOptimize(fma_chains(kRounds, factor));
  }
  state.SetItemsProcessed(state.iterations() * 2 * 8 * kChains * kRounds);  // items_per_second: flop/s
}
BENCHMARK(BM_FmaPeak)->Threads(1)->Threads(2)->UseRealTime();

// BM_Int8DotPeak/sign:S: the AVX2 int8 kernel's products on registers, no loads: per 32 byte products
// vpmaddubsw (|x| times the weight with x's sign moved onto it by vpsignb when S is 1, as
// tile_kernels_avx2.cpp makes them exact; without it, what a kernel with unsigned-safe operands would pay),
// vpmaddwd against ones into int32 and vpaddd, in 2 rows x 4 weight vectors of independent dots
// (items_per_second: multiply-adds a second, all threads together; BM_FmaPeak's flop/s / 2 are fp32's).
template <bool kSign>
__attribute__((target("avx2"))) int int8_dot_chains(long rounds, int seed) {
  constexpr int kRows = 2, kVectors = 4;
  __m256i dot[kRows][kVectors], x[kRows], x_abs[kRows], w[kVectors];
  for (int r = 0; r < kRows; ++r) {
    x[r] = _mm256_set1_epi32(seed + 0x01fe03fd * (r + 1));
    x_abs[r] = _mm256_abs_epi8(x[r]);
    for (int v = 0; v < kVectors; ++v) dot[r][v] = _mm256_setzero_si256();
  }
  for (int v = 0; v < kVectors; ++v) w[v] = _mm256_set1_epi32(seed + 0x05060708 * (v + 1));
  const __m256i ones = _mm256_set1_epi16(1);
  for (long i = 0; i < rounds; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
#pragma GCC unroll 2
      for (int r = 0; r < kRows; ++r) {
        const __m256i pairs = _mm256_maddubs_epi16(x_abs[r], kSign ? _mm256_sign_epi8(w[v], x[r]) : w[v]);
        dot[r][v] = _mm256_add_epi32(dot[r][v], _mm256_madd_epi16(pairs, ones));
      }
    }
    // The weights as if loaded anew each round: the compiler may not hoist the products out of the loop.
    for (int v = 0; v < kVectors; ++v) asm volatile("" : "+x"(w[v]));
  }
  __m256i sum = dot[0][0];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) sum = _mm256_add_epi32(sum, dot[r][v]);
  }
  return _mm256_extract_epi32(sum, 0);
}

void BM_Int8DotPeak(benchmark::State& state) {
  if (!__builtin_cpu_supports("avx2")) return state.SkipWithError("this CPU has no AVX2");
  const bool sign = state.range(0) != 0;
  constexpr long kRounds = 1 << 20;
  for (auto _ : state) {
    int seed = 3;
    benchmark::DoNotOptimize(seed);
    benchmark::DoNotOptimize(sign ? int8_dot_chains<true>(kRounds, seed) : int8_dot_chains<false>(kRounds, seed));
  }
  state.SetItemsProcessed(state.iterations() * 2 * 4 * 32 * kRounds);  // items_per_second: multiply-adds/s
}
BENCHMARK(BM_Int8DotPeak)->ArgName("sign")->Arg(1)->Arg(0)->Threads(1)->Threads(2)->UseRealTime();

constexpr std::size_t kStreamBytes = std::size_t{128} << 20;
constexpr int kAheadLines = 64;  // 4 KiB: 64-256 measured the same on a Zen 3 VM

// fmas_per_line FMAs (a multiple of kChains) per 64-byte line of data, each line's two vectors feeding them.
template <int kFmasPerLine, bool kPrefetch>
__attribute__((target("avx2,fma"))) float stream_behind_fma(const float* data, std::size_t lines) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_setzero_ps();
  const __m256 add = _mm256_set1_ps(1e-4f);
  for (std::size_t l = 0; l < lines; ++l) {
    if (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(data + (l + kAheadLines) * 16), _MM_HINT_T0);
    const __m256 lo = _mm256_load_ps(data + l * 16), hi = _mm256_load_ps(data + l * 16 + 8);
    if (kFmasPerLine == 0) {
      acc[l % 2] = _mm256_add_ps(acc[l % 2], l % 2 == 0 ? lo : hi);
      acc[2 + l % 2] = _mm256_add_ps(acc[2 + l % 2], l % 2 == 0 ? hi : lo);
    }
#pragma GCC unroll 4
    for (int f = 0; f < kFmasPerLine / kChains; ++f) {
#pragma GCC unroll 12
      for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], i % 2 == 0 ? lo : hi, add);
    }
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  return _mm256_cvtss_f32(sum);
}

template <int kFmasPerLine>
float stream(const float* data, std::size_t lines, bool prefetch) {
  return prefetch ? stream_behind_fma<kFmasPerLine, true>(data, lines)
                  : stream_behind_fma<kFmasPerLine, false>(data, lines);
}

void BM_StreamBehindFma(benchmark::State& state) {
  if (!has_avx2_fma()) return state.SkipWithError("this CPU has no AVX2 + FMA");
  const int fmas_per_line = static_cast<int>(state.range(0));
  const bool prefetch = state.range(1) != 0;
  // The thread's own stream, 64-byte aligned, with kAheadLines lines of slack for the prefetches, written
  // once so that every page is there before the timing.
  const std::size_t floats = kStreamBytes / sizeof(float) + kAheadLines * 16;
  std::unique_ptr<float, decltype(&std::free)> data(
      static_cast<float*>(std::aligned_alloc(64, floats * sizeof(float))), &std::free);
  for (std::size_t i = 0; i < floats; ++i) data.get()[i] = 1.0f;
  const std::size_t lines = kStreamBytes / 64;
  for (auto _ : state) {
    switch (fmas_per_line) {
      case 0: benchmark::DoNotOptimize(stream<0>(data.get(), lines, prefetch)); break;
      case 24: benchmark::DoNotOptimize(stream<24>(data.get(), lines, prefetch)); break;
      case 48: benchmark::DoNotOptimize(stream<48>(data.get(), lines, prefetch)); break;
      default: return state.SkipWithError("fmas_per_line: 0, 24 or 48");
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(kStreamBytes));
  state.SetItemsProcessed(state.iterations() * std::int64_t{2 * 8} * fmas_per_line *
                          static_cast<std::int64_t>(lines));  // items_per_second: flop/s
}
BENCHMARK(BM_StreamBehindFma)
    ->ArgNames({"fmas_per_line", "prefetch"})
    ->ArgsProduct({{0, 24, 48}, {0, 1}})
    ->Threads(1)
    ->Threads(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
