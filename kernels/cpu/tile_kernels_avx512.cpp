// The AVX-512 fp32 and bf16 tile kernels (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq).
//
// A register block of R rows x P panels: per k step, P weight vectors (16 features each) are loaded once
// and each is multiplied by R broadcast activations into R x P accumulators. R x P <= 24 keeps the
// accumulators, the P weight vectors and the broadcast within the 32 zmm registers. A decode GEMV (R = 1)
// has P = 4 independent FMA chains, plenty for a loop that waits on memory; a batch of B rows reuses every
// loaded weight vector for up to 6 rows from registers and for the rest from L1/L2.
//
// bf16 weights are widened to fp32 (a bf16 is the top half of a float: one shift for the even k of each
// pair, one mask for the odd k) and multiplied with fp32 activations: exactly the fp32 kernel's arithmetic
// on the rounded weights. Half the bytes of fp32, no rounding of the activations. Up to five rows widen in
// registers in one pass; more widen each chunk once into L1 and run the fp32 blocks over it.
#include <immintrin.h>

#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu::tile {

namespace {

inline void prefetch_line(const PrefetchPlan& plan, int& countdown, int line, int n_panels, std::size_t panel_stride) {
  prefetch_ahead(plan, line, n_panels, panel_stride);
  if (plan.next == nullptr || countdown-- != 0) return;
  countdown = plan.passes - 1;
  if (line >= plan.lines) return;
  const std::size_t next_stride = plan.next_stride != 0 ? plan.next_stride : panel_stride;
  for (int p = 0; p < n_panels; ++p) {
    _mm_prefetch(plan.next + p * next_stride + static_cast<std::size_t>(line) * 64, _MM_HINT_T2);
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

constexpr int kWideChunkPairs = 32;  // bf16_tile_widened's chunk: 64 k, 4 KiB of fp32 a panel, 16 KiB for four

// k steps [k0, k1) (even k0) of bf16 pairs, as f32_block. Store: also write each widened vector to
// wide (panel p at p * kWideChunkPairs * 32 floats, pair j of the chunk at j * 32), for the later passes.
template <int R, int P, bool Store = false>
void bf16_block(const Tile& t, const float* x, float* out, int k0, int k1, bool accumulate, const PrefetchPlan& plan,
                float* wide = nullptr) {
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
    if constexpr (Store) {
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) _mm512_store_ps(wide + p * kWideChunkPairs * 32 + (kk - k0) / 2 * 32, wf[p]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[static_cast<std::size_t>(r) * t.x_stride + kk]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_fmadd_ps(wf[p], xb, acc[r][p]);
    }
    if (kk + 1 == t.k) break;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) wf[p] = _mm512_castsi512_ps(_mm512_and_si512(wv[p], high_half));  // W(f, kk + 1)
    if constexpr (Store) {
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) _mm512_store_ps(wide + p * kWideChunkPairs * 32 + (kk - k0) / 2 * 32 + 16, wf[p]);
    }
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
// bf16_block that also stores what it widens into wide (bf16_tile_widened's first pass).
template <int R, int P>
struct Bf16Storing {
  static void run(const Tile& t, const float* x, float* out, int k0, int k1, bool accumulate, const PrefetchPlan& plan,
                  float* wide) {
    bf16_block<R, P, true>(t, x, out, k0, k1, accumulate, plan, wide);
  }
};

// Blocks of every panel of the tile (P = n_panels) and up to R rows: R x P accumulators, the P weight
// vectors and a broadcast fit the 32 registers for R <= 6 (fp32) or 5 (bf16, two widened vectors per pair).
template <template <int, int> class Block>
using BlockFnOf = decltype(&Block<1, 1>::run);

template <template <int, int> class Block, int R>
BlockFnOf<Block> for_panels(int n_panels) {
  switch (n_panels) {
    case 1: return Block<R, 1>::run;
    case 2: return Block<R, 2>::run;
    case 3: return Block<R, 3>::run;
    default: return Block<R, 4>::run;
  }
}

template <template <int, int> class Block, int MaxRows>
BlockFnOf<Block> block_for(int rows, int n_panels) {
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

// k in chunks of kF32ChunkLines lines (k_per_line k values each), each chunk in passes of up to max_rows
// rows (block(rows) gives the block function); prefetching as PrefetchPlan describes.
// 64 lines of 4 panels are 16 KiB, so the passes after the first read the chunk from L1 rather than L2:
// against kChunkLines (512 lines, 128 KiB), 16 rows of fp32 768 -> 2048 on two Emerald Rapids threads went
// 5-20% faster, 64 rows of 2048 -> 5632 0-8% (session 25).
constexpr int kF32ChunkLines = 64;

// The plan of a multi-pass chunk whose successor starts at line next_line of the tile's total_lines: that
// chunk in these panels, or the next tile's first (Tile::prefetch), chunk_lines lines at most.
PrefetchPlan next_chunk_plan(const Tile& t, int next_line, int total_lines, int chunk_lines, int passes) {
  PrefetchPlan plan;
  plan.passes = passes;
  if (next_line < total_lines) {
    plan.next = reinterpret_cast<const char*>(t.panels) + static_cast<std::size_t>(next_line) * 64;
    plan.lines = total_lines - next_line < chunk_lines ? total_lines - next_line : chunk_lines;
  } else if (t.prefetch != nullptr) {
    plan.next = reinterpret_cast<const char*>(t.prefetch);
    plan.lines = total_lines < chunk_lines ? total_lines : chunk_lines;
  }
  return plan;
}

template <typename BlockOf>
void run_passes(const Tile& t, int max_rows, int k_per_line, const BlockOf& block) {
  const float* x = static_cast<const float*>(t.x);
  const int passes = (t.n_rows + max_rows - 1) / max_rows;
  const int chunk_k = kF32ChunkLines * k_per_line;
  const int total_lines = (t.k + k_per_line - 1) / k_per_line;
  for (int k0 = 0; k0 < t.k; k0 += chunk_k) {
    const int k1 = k0 + chunk_k < t.k ? k0 + chunk_k : t.k;
    PrefetchPlan plan;
    if (passes > 1) {
      plan = next_chunk_plan(t, k1 / k_per_line, total_lines, kF32ChunkLines, passes);
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

// Several passes of bf16 (a batch, a prompt): each chunk of kWideChunkPairs pairs is widened once into an
// fp32 copy in L1 and the fp32 blocks make the passes over it, so the passes after the first neither widen
// again (two ALU operations per pair and panel, on the FMA ports) nor read L2, and take six rows rather than
// five. The same FMAs in the same order as bf16_block: the same bits. 16 rows of 2048 -> 5632 on two Emerald
// Rapids threads 10-20% faster than widening in every pass, 64 rows 10-13% (session 25). The first pass
// widens while it multiplies its rows (16 rows: 4 + 6 + 6) instead of after a loop that only loads and
// stores: 16 rows another 5-21% (best of 60) in four alternations, 7 or 8 rows 4%, 64 within 1%.
void bf16_tile_widened(const Tile& t) {
  alignas(64) float wide[kTilePanels * kWideChunkPairs * 32];
  const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(t.panels);
  const std::size_t stride = t.panel_stride / sizeof(std::uint32_t);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const float* x = static_cast<const float*>(t.x);
  const int total_lines = (t.k + 1) / 2;
  Tile wide_tile = t;
  wide_tile.panels = reinterpret_cast<const std::byte*>(wide);
  wide_tile.panel_stride = kWideChunkPairs * 32 * sizeof(float);
  // Rows past a multiple of six make the first pass (bf16_block, storing what it widens); with none the
  // chunk is widened by a loop of its own.
  const int first_rows = t.n_rows % 6;
  const int passes = (first_rows > 0 ? 1 : 0) + t.n_rows / 6;
  for (int j0 = 0; j0 < total_lines; j0 += kWideChunkPairs) {
    const int j1 = j0 + kWideChunkPairs < total_lines ? j0 + kWideChunkPairs : total_lines;
    if (first_rows == 0) {
      for (int p = 0; p < t.n_panels; ++p) {
        const std::uint32_t* src = w + p * stride + static_cast<std::size_t>(j0) * 16;
        float* dst = wide + p * kWideChunkPairs * 32;
        for (int j = 0; j < j1 - j0; ++j) {
          const __m512i v = _mm512_load_si512(src + j * 16);
          _mm512_store_ps(dst + j * 32, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));            // W(f, 2j)
          _mm512_store_ps(dst + j * 32 + 16, _mm512_castsi512_ps(_mm512_and_si512(v, high_half)));  // W(f, 2j + 1)
        }
      }
    }
    // The passes prefetch the next chunk of the bf16 panels (or the next tile's first), in their shares.
    PrefetchPlan plan = next_chunk_plan(t, j1, total_lines, kWideChunkPairs, passes);
    plan.next_stride = t.panel_stride;  // the fp32 passes' tile is the copy, with its own stride
    const int k0 = 2 * j0;
    const int k1 = 2 * j1 < t.k ? 2 * j1 : t.k;  // an odd k's last pair has no partner activation
    int pass = 0;
    if (first_rows > 0) {
      plan.phase = pass++;
      block_for<Bf16Storing, 5>(first_rows, t.n_panels)(t, x, t.out, k0, k1, j0 > 0, plan, wide);
    }
    for (int r = first_rows; r < t.n_rows; r += 6, ++pass) {
      const int rows = t.n_rows - r < 6 ? t.n_rows - r : 6;
      plan.phase = pass;
      block_for<F32, 6>(rows, t.n_panels)(wide_tile, x + static_cast<std::size_t>(r) * t.x_stride + k0,
                                          t.out + r * kTileStride, 0, k1 - k0, j0 > 0, plan);
    }
  }
}

void bf16_tile(const Tile& t) {
  if (t.n_rows > 5) return bf16_tile_widened(t);
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
