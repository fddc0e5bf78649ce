// The AVX512_BF16 bf16 tile kernel (compiled with -mavx512bf16 and AVX-512 F/BW/VL/DQ), for CPUs that have
// it but no AMX and retire vdpbf16ps at at least half their FMA rate (isa.h: AMD Zen 5, probably Zen 4).
//
// vdpbf16ps multiplies 16 features x one k pair of bf16 weights by a broadcast pair of bf16 activations and
// adds both products to fp32 sums. x goes in as the AMX kernel takes it: two bf16 halves, x ~ hi + lo (16
// bits of x; Activations::prepare_rows), each pair of weights multiplied by the pair of hi, then by the pair
// of lo, into the same sum. The products of two bf16 values are exact in fp32. One instruction per 32
// weights and half of x, where widening the weights (tile_kernels_avx512.cpp) takes a shift or a mask and an
// FMA per 16.
#include <immintrin.h>

#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu::tile {

namespace {

inline std::int32_t load_pair(const std::uint16_t* p) {
  std::int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

inline __m512 dpbf16(__m512 acc, __m512i w, __m512i x) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(w), reinterpret_cast<__m512bh>(x));
}

// Pairs [j0, j1) of R rows x P panels; accumulate: continue the sums already in out.
template <int R, int P>
void bf16_block(const Tile& t, float* out, int row0, int j0, int j1, bool accumulate, const PrefetchPlan& plan) {
  const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(t.panels);  // (k / 2, 16) pairs
  const std::size_t stride = t.panel_stride / sizeof(std::uint32_t);
  const std::uint16_t* hi = t.x_bf16_hi + static_cast<std::size_t>(row0) * t.x_bf16_stride;
  const std::uint16_t* lo = t.x_bf16_lo + static_cast<std::size_t>(row0) * t.x_bf16_stride;
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      acc[r][p] = accumulate ? _mm512_loadu_ps(out + r * kTileStride + p * 16) : _mm512_setzero_ps();
    }
  }
  int countdown = plan.phase;
  for (int j = j0; j < j1; ++j) {
    __m512i wv[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) wv[p] = _mm512_load_si512(w + p * stride + static_cast<std::size_t>(j) * 16);
    if (plan.next != nullptr && countdown-- == 0) {
      countdown = plan.passes - 1;
      const int line = j - j0;
      if (line < plan.lines) {
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) _mm_prefetch(plan.next + p * t.panel_stride + static_cast<std::size_t>(line) * 64, _MM_HINT_T2);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * t.x_bf16_stride + 2 * static_cast<std::size_t>(j);
      const __m512i xh = _mm512_set1_epi32(load_pair(hi + at));
      const __m512i xl = _mm512_set1_epi32(load_pair(lo + at));
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = dpbf16(dpbf16(acc[r][p], wv[p], xh), wv[p], xl);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + r * kTileStride + p * 16, acc[r][p]);
  }
}

using BlockFn = void (*)(const Tile&, float*, int, int, int, bool, const PrefetchPlan&);

template <int R>
BlockFn for_panels(int n_panels) {
  switch (n_panels) {
    case 1: return bf16_block<R, 1>;
    case 2: return bf16_block<R, 2>;
    case 3: return bf16_block<R, 3>;
    default: return bf16_block<R, 4>;
  }
}

constexpr int kMaxRows = 6;  // 24 sums, 4 weight vectors and two broadcasts: 30 of the 32 zmm

BlockFn block_for(int rows, int n_panels) {
  switch (rows) {
    case 1: return for_panels<1>(n_panels);
    case 2: return for_panels<2>(n_panels);
    case 3: return for_panels<3>(n_panels);
    case 4: return for_panels<4>(n_panels);
    case 5: return for_panels<5>(n_panels);
    default: return for_panels<kMaxRows>(n_panels);
  }
}

// k pairs in chunks of kChunkLines lines (one pair of 16 features is one line), each chunk in passes of up to
// kMaxRows rows, prefetching as PrefetchPlan describes. Every output is one chain of vdpbf16ps along k
// whatever the block shape, so a row's result does not depend on how many rows came with it.
void bf16_tile(const Tile& t) {
  const int total_lines = (t.k + 1) / 2;
  const int passes = (t.n_rows + kMaxRows - 1) / kMaxRows;
  for (int j0 = 0; j0 < total_lines; j0 += kChunkLines) {
    const int j1 = j0 + kChunkLines < total_lines ? j0 + kChunkLines : total_lines;
    PrefetchPlan plan;
    if (passes > 1) {
      if (j1 < total_lines) {
        plan.next = reinterpret_cast<const char*>(t.panels) + static_cast<std::size_t>(j1) * 64;
        plan.lines = total_lines - j1 < kChunkLines ? total_lines - j1 : kChunkLines;
      } else if (t.prefetch != nullptr) {
        plan.next = reinterpret_cast<const char*>(t.prefetch);
        plan.lines = total_lines < kChunkLines ? total_lines : kChunkLines;
      }
      plan.passes = passes;
    }
    for (int r = 0, pass = 0; r < t.n_rows; r += kMaxRows, ++pass) {
      const int rows = t.n_rows - r < kMaxRows ? t.n_rows - r : kMaxRows;
      plan.phase = pass;
      block_for(rows, t.n_panels)(t, t.out + r * kTileStride, r, j0, j1, j0 > 0, plan);
    }
  }
}

}  // namespace

TileKernel avx512_bf16_dot_tile_kernel() { return bf16_tile; }

}  // namespace shardline::kernels::cpu::tile
