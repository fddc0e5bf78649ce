// The AVX-512 fp32 and bf16 tile kernels (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq).
//
// A register block of R rows x P panels: per k step, P weight vectors (16 features each) are loaded once
// and each is multiplied by R broadcast activations into R x P accumulators. R x P <= 24 keeps the
// accumulators, the P weight vectors and the broadcast within the 32 zmm registers. A decode GEMV (R = 1)
// has P = 4 independent FMA chains, plenty for a loop that waits on memory; a batch of B rows reuses every
// loaded weight vector for up to 6 rows from registers and for the rest from L1/L2.
//
// bf16 weights are widened to fp32 in registers (a bf16 is the top half of a float: one shift for the even
// k of each pair, one mask for the odd k) and multiplied with fp32 activations: exactly the fp32 kernel's
// arithmetic on the rounded weights. Half the bytes of fp32, no rounding of the activations.
#include <immintrin.h>

#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu::tile {

namespace {

inline void prefetch_line(const PrefetchPlan& plan, int& countdown, int line, int n_panels, std::size_t panel_stride) {
  prefetch_ahead(plan, line, n_panels, panel_stride);
  if (plan.next == nullptr || countdown-- != 0) return;
  countdown = plan.passes - 1;
  if (line >= plan.lines) return;
  for (int p = 0; p < n_panels; ++p) {
    _mm_prefetch(plan.next + p * panel_stride + static_cast<std::size_t>(line) * 64, _MM_HINT_T2);
  }
}

// k steps [k0, k1) of R rows x P panels; accumulate: continue the sums already in out.
template <int R, int P>
void f32_block(const Tile& t, const float* x, float* out, int k0, int k1, bool accumulate, const PrefetchPlan& plan) {
  const float* w = reinterpret_cast<const float*>(t.panels);
  const std::size_t stride = t.panel_stride / sizeof(float);
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      acc[r][p] = accumulate ? _mm512_loadu_ps(out + r * kTileStride + p * 16) : _mm512_setzero_ps();
    }
  }
  int countdown = plan.phase;
  for (int kk = k0; kk < k1; ++kk) {
    __m512 wv[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) wv[p] = _mm512_load_ps(w + p * stride + static_cast<std::size_t>(kk) * 16);
    prefetch_line(plan, countdown, kk - k0, P, t.panel_stride);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[static_cast<std::size_t>(r) * t.x_stride + kk]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(wv[p], xb, acc[r][p]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + r * kTileStride + p * 16, acc[r][p]);
  }
}

// k steps [k0, k1) (even k0) of bf16 pairs, as f32_block.
template <int R, int P>
void bf16_block(const Tile& t, const float* x, float* out, int k0, int k1, bool accumulate, const PrefetchPlan& plan) {
  const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(t.panels);  // (k / 2, 16) pairs
  const std::size_t stride = t.panel_stride / sizeof(std::uint32_t);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      acc[r][p] = accumulate ? _mm512_loadu_ps(out + r * kTileStride + p * 16) : _mm512_setzero_ps();
    }
  }
  int countdown = plan.phase;
  // Whole pairs; an odd k leaves one even half (its odd partner is zero padding and has no activation).
  for (int kk = k0; kk < k1; kk += 2) {
    __m512i wv[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) wv[p] = _mm512_load_si512(w + p * stride + static_cast<std::size_t>(kk / 2) * 16);
    prefetch_line(plan, countdown, (kk - k0) / 2, P, t.panel_stride);
    __m512 wf[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) wf[p] = _mm512_castsi512_ps(_mm512_slli_epi32(wv[p], 16));  // W(f, kk)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[static_cast<std::size_t>(r) * t.x_stride + kk]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(wf[p], xb, acc[r][p]);
    }
    if (kk + 1 == t.k) break;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) wf[p] = _mm512_castsi512_ps(_mm512_and_si512(wv[p], high_half));  // W(f, kk + 1)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[static_cast<std::size_t>(r) * t.x_stride + kk + 1]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(wf[p], xb, acc[r][p]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + r * kTileStride + p * 16, acc[r][p]);
  }
}

using BlockFn = void (*)(const Tile&, const float*, float*, int, int, bool, const PrefetchPlan&);

template <int R, int P>
struct F32 {
  static void run(const Tile& t, const float* x, float* out, int k0, int k1, bool accumulate, const PrefetchPlan& plan) {
    f32_block<R, P>(t, x, out, k0, k1, accumulate, plan);
  }
};
template <int R, int P>
struct Bf16 {
  static void run(const Tile& t, const float* x, float* out, int k0, int k1, bool accumulate, const PrefetchPlan& plan) {
    bf16_block<R, P>(t, x, out, k0, k1, accumulate, plan);
  }
};

// Blocks of every panel of the tile (P = n_panels) and up to R rows: R x P accumulators, the P weight
// vectors and a broadcast fit the 32 registers for R <= 6 (fp32) or 5 (bf16, two widened vectors per pair).
template <template <int, int> class Block, int R>
BlockFn for_panels(int n_panels) {
  switch (n_panels) {
    case 1: return Block<R, 1>::run;
    case 2: return Block<R, 2>::run;
    case 3: return Block<R, 3>::run;
    default: return Block<R, 4>::run;
  }
}

template <template <int, int> class Block, int MaxRows>
BlockFn block_for(int rows, int n_panels) {
  static_assert(MaxRows == 5 || MaxRows == 6);
  switch (rows) {
    case 1: return for_panels<Block, 1>(n_panels);
    case 2: return for_panels<Block, 2>(n_panels);
    case 3: return for_panels<Block, 3>(n_panels);
    case 4: return for_panels<Block, 4>(n_panels);
    case 5: return for_panels<Block, 5>(n_panels);
    default: return for_panels<Block, MaxRows>(n_panels);
  }
}

// k in chunks of kChunkLines lines (k_per_line k values each), each chunk in passes of up to max_rows rows
// (block(rows) gives the block function); prefetching as PrefetchPlan describes.
template <typename BlockOf>
void run_passes(const Tile& t, int max_rows, int k_per_line, const BlockOf& block) {
  const float* x = static_cast<const float*>(t.x);
  const int passes = (t.n_rows + max_rows - 1) / max_rows;
  const int chunk_k = kChunkLines * k_per_line;
  const int total_lines = (t.k + k_per_line - 1) / k_per_line;
  for (int k0 = 0; k0 < t.k; k0 += chunk_k) {
    const int k1 = k0 + chunk_k < t.k ? k0 + chunk_k : t.k;
    PrefetchPlan plan;
    if (passes > 1) {
      const int line = k1 / k_per_line;  // the next chunk's first line, in these panels or the next
      if (line < total_lines) {
        plan.next = reinterpret_cast<const char*>(t.panels) + static_cast<std::size_t>(line) * 64;
        plan.lines = total_lines - line < kChunkLines ? total_lines - line : kChunkLines;
      } else if (t.prefetch != nullptr) {
        plan.next = reinterpret_cast<const char*>(t.prefetch);
        plan.lines = total_lines < kChunkLines ? total_lines : kChunkLines;
      }
      plan.passes = passes;
    } else {
      plan.ahead = reinterpret_cast<const char*>(t.panels) + static_cast<std::size_t>(k0 / k_per_line) * 64;
    }
    for (int r = 0, pass = 0; r < t.n_rows; r += max_rows, ++pass) {
      const int rows = t.n_rows - r < max_rows ? t.n_rows - r : max_rows;
      plan.phase = pass;
      block(rows)(t, x + static_cast<std::size_t>(r) * t.x_stride, t.out + r * kTileStride, k0, k1, k0 > 0, plan);
    }
  }
}

// Every output is one FMA chain along k whatever the block shape, so a row's result does not depend on how
// many rows came with it.
void f32_tile(const Tile& t) {
  run_passes(t, 6, 1, [&](int rows) { return block_for<F32, 6>(rows, t.n_panels); });
}
void bf16_tile(const Tile& t) {
  run_passes(t, 5, 2, [&](int rows) { return block_for<Bf16, 5>(rows, t.n_panels); });
}

// Four 64-byte loads per iteration into four independent integer sums.
std::uint64_t read_bytes(const std::byte* data, std::size_t bytes) {
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  std::size_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    s0 = _mm512_add_epi64(s0, _mm512_load_si512(data + i));
    s1 = _mm512_add_epi64(s1, _mm512_load_si512(data + i + 64));
    s2 = _mm512_add_epi64(s2, _mm512_load_si512(data + i + 128));
    s3 = _mm512_add_epi64(s3, _mm512_load_si512(data + i + 192));
  }
  std::uint64_t total = static_cast<std::uint64_t>(
      _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3))));
  for (; i < bytes; ++i) total += static_cast<std::uint8_t>(data[i]);
  return total;
}

}  // namespace

TileKernel avx512_f32_tile_kernel() { return f32_tile; }
TileKernel avx512_bf16_tile_kernel() { return bf16_tile; }
ReadKernel avx512_read_kernel() { return read_bytes; }

}  // namespace shardline::kernels::cpu::tile
