// The AVX512_VNNI int8 tile kernel (compiled with -mavx512vnni and AVX-512 F/BW/VL/DQ).
//
// vpdpbusd multiplies 16 features x one k quad (unsigned weights q + 128) by the row's broadcast signed
// int8 quad into int32. After each group (32, 64, 96 or 128 k) the exact integer dot, corrected for the +128 offset (128 *
// the group's sum of x), is scaled by weight scale * x scale and added in fp32.
// A batch's block of R rows x P panels keeps its R x P int32 group sums in registers (R x P <= 24, with the
// P weight vectors and a broadcast: 29 of the 32 zmm) and its fp32 sums in the tile's output rows (and, in
// reduction segments, a scratch tile), which stay in L1: a group of 128 k is 32 vpdpbusd per (row, panel)
// against one load, FMA and store of its fp32 sum.
// That frees the registers for six rows a pass (three when the fp32 sums took registers too): a 4-row int8
// 768 -> 2048 matmul went 36-42 -> 27-30 us on one Zen 5 core when four rows fit one pass, and 16 rows take
// three passes instead of four (BENCHMARKS.md, issue #7). A GEMV (R = 1) keeps its sums in registers.
#include <immintrin.h>

#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu::tile {

namespace {

inline std::int32_t load_i32(const void* p) {
  std::int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// acc + the dots of w's unsigned quads with x's signed ones: vpdpbusd, in asm because GCC 12 compiles the
// intrinsic in a batch's block with two register copies around each instruction (the accumulator into a
// fresh register and back), which with 16 live sums (4 rows x 4 panels) spills.
inline __m512i dpbusd(__m512i acc, __m512i w, __m512i x) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
  return acc;
}

// ---- int8 -------------------------------------------------------------------------------------------

// Six rows x four panels a pass: 24 int32 sums, the 4 weight vectors and a broadcast in 29 of the 32 zmm,
// 24 vpdpbusd per 10 loads (4 rows: 16 per 8). 16 rows take 3 passes instead of 4.
constexpr int kInt8MaxRows = 6;
// The int8 kernel's chunk (PrefetchPlan), in lines per panel, rounded down to whole groups (at least one):
// 32 lines of 4 panels are 8 KiB, so the second and third passes over a chunk read it from L1 rather than L2.
// Against kChunkLines (512), with six rows a pass: 16 rows of 2048 -> 5632 on two threads from DRAM
// 23-25% faster, 64 rows 0-2% (BENCHMARKS.md, session 25).
constexpr int kInt8ChunkLines = 32;

// This pass's share of the next chunk's lines (PrefetchPlan) up to block_end_line, the end of the block it
// is about to read: the lines with line % passes == phase, from next_line on, in each of the P panels.
template <int P>
inline void prefetch_share(const PrefetchPlan& plan, int& next_line, int block_end_line, std::size_t stride) {
  for (; next_line < block_end_line; next_line += plan.passes) {
    if (next_line >= plan.lines) continue;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) _mm_prefetch(plan.next + p * stride + static_cast<std::size_t>(next_line) * 64, _MM_HINT_T1);
  }
}

// Where a group's fp32 sums go (R > 1): the running segment's in scratch, or a finished segment's into
// out, stored there (the first segment) or added onto the segments' before it.
enum class GroupEnd { kScratch, kStore, kAdd };

// A group's exact integer dots scaled and added onto the running segment's sums (from zero for its first
// group): R rows x P panels.
template <int R, int P, bool kFirst, GroupEnd kEnd>
[[gnu::always_inline]] inline void group_sums(const __m512i (&dot)[R][P], const __m512 (&ws)[P], const float* x_scales,
                                              const std::int32_t* x_sums, int groups, int g, float* out, float* scratch) {
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    const __m512i offset = _mm512_set1_epi32(128 * x_sums[static_cast<std::size_t>(r) * groups + g]);
    const __m512 xs = _mm512_set1_ps(x_scales[static_cast<std::size_t>(r) * groups + g]);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const __m512 exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r][p], offset));
      float* part = scratch + r * kTileStride + p * 16;
      float* sum = out + r * kTileStride + p * 16;
      const __m512 before = kFirst ? _mm512_setzero_ps() : _mm512_loadu_ps(part);
      const __m512 value = _mm512_fmadd_ps(exact, _mm512_mul_ps(ws[p], xs), before);
      if constexpr (kEnd == GroupEnd::kScratch) {
        _mm512_storeu_ps(part, value);
      } else if constexpr (kEnd == GroupEnd::kStore) {
        _mm512_storeu_ps(sum, value);
      } else {
        _mm512_storeu_ps(sum, _mm512_add_ps(_mm512_loadu_ps(sum), value));
      }
    }
  }
}

// Groups [g0, g1) of R rows x P panels, in segments: each segment's sums run in `scratch` from zero (from
// its first group) and, after its last group, go into `out`, stored there for the first segment and added
// onto what is there for the others. Between calls (k chunks) out holds the sum of the segments finished so
// far and scratch the running segment's. One segment with scratch = out is a plain matmul, the sums in out.
// apart (Tile::segments_apart): each finished segment's sums are stored at apart + s * kSegmentTileFloats
// instead, none added. kSegmented = false: a plain matmul (scratch = out), compiled without the segments'
// bookkeeping.
template <int R, int P, bool kSegmented>
void int8_block(const Tile& t, const std::int8_t* x, const float* x_scales, const std::int32_t* x_sums, float* out,
                float* scratch, float* apart, const GroupSegments& segments, int g0, int g1, const PrefetchPlan& plan) {
  const std::uint8_t* w = reinterpret_cast<const std::uint8_t*>(t.panels);
  const std::size_t stride = t.panel_stride;
  const int groups = t.x_groups;  // x's scales and sums per row
  const int blocks_per_group = t.int8_group / 32;  // 32 k: 8 quads, 512 bytes of a panel
  const std::size_t scales_offset = t.int8_scales_offset;
  int s = segments.segment_of(g0), s_begin = segments.bound(s), s_end = segments.bound(s + 1);
  // R = 1: the fp32 sums in registers (acc the running segment's, total the finished ones'); R > 1: in
  // scratch and out, read back per group. The same FMAs and adds on the same values either way: a row's
  // bits do not depend on R.
  __m512 acc[R == 1 ? P : 1], total[R == 1 && kSegmented ? P : 1];
  if constexpr (R == 1) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      acc[p] = g0 > s_begin ? _mm512_loadu_ps(scratch + p * 16) : _mm512_setzero_ps();
      if constexpr (kSegmented) total[p] = s > 0 && apart == nullptr ? _mm512_loadu_ps(out + p * 16) : _mm512_setzero_ps();
    }
  }
  // The next line of the next chunk this pass prefetches (PrefetchPlan); none without a plan.
  int next_line = plan.next != nullptr ? plan.phase : 1 << 30;
  for (int g = g0; g < g1; ++g) {
    if (kSegmented && g == s_end) {  // the next segment
      ++s;
      s_begin = s_end;
      s_end = segments.bound(s + 1);
    }
    const bool first = g == s_begin, last = kSegmented && g + 1 == s_end;
    __m512i dot[R][P];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) dot[r][p] = _mm512_setzero_si512();
    }
    const int b1 = (g + 1) * blocks_per_group;
    if constexpr (R == 1) {
      // A GEMV: two interleaved integer chains per panel halve the wait on vpdpbusd's latency. Integer sums
      // are exact, so this changes no result.
      __m512i odd[P];
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) odd[p] = _mm512_setzero_si512();
      for (int b = g * blocks_per_group; b < b1; ++b) {
        const std::uint8_t* wb = w + static_cast<std::size_t>(b) * 512;
        prefetch_share<P>(plan, next_line, (b - g0 * blocks_per_group + 1) * 8, stride);
#pragma GCC unroll 4
        for (int q = 0; q < 8; q += 2) {
          const int line = (b - g0 * blocks_per_group) * 8 + q;
          prefetch_ahead(plan, line, P, stride);
          prefetch_ahead(plan, line + 1, P, stride);
          const __m512i x0 = _mm512_set1_epi32(load_i32(x + b * 32 + q * 4));
          const __m512i x1 = _mm512_set1_epi32(load_i32(x + b * 32 + q * 4 + 4));
#pragma GCC unroll 4
          for (int p = 0; p < P; ++p) {
            dot[0][p] = _mm512_dpbusd_epi32(dot[0][p], _mm512_load_si512(wb + p * stride + q * 64), x0);
            odd[p] = _mm512_dpbusd_epi32(odd[p], _mm512_load_si512(wb + p * stride + q * 64 + 64), x1);
          }
        }
      }
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) dot[0][p] = _mm512_add_epi32(dot[0][p], odd[p]);
    } else {
      // Pointers that walk the lines, so that GCC keeps the rows' and panels' offsets in registers: with
      // b * 512 + q * 64 recomputed it reloaded four of them from the stack every line, and 64 rows of
      // 2048 -> 5632 ran at 680-720 GOP/s on two Emerald Rapids cores against 940-1010 now (session 25).
      const std::size_t x_stride = static_cast<std::size_t>(t.x_stride);
      const std::uint8_t* wq = w + static_cast<std::size_t>(g) * blocks_per_group * 512;
      const std::int8_t* xq = x + g * t.int8_group;
      for (int b = g * blocks_per_group; b < b1; ++b) {
        prefetch_share<P>(plan, next_line, (b - g0 * blocks_per_group + 1) * 8, stride);
        const int line0 = (b - g0 * blocks_per_group) * 8;
        // Not unrolled: GCC hoists an unrolled loop's weight loads ahead and runs out of registers.
#pragma GCC unroll 1
        for (int q = 0; q < 8; ++q, wq += 64, xq += 4) {
          prefetch_ahead(plan, line0 + q, P, stride);
          __m512i wv[P];
#pragma GCC unroll 4
          for (int p = 0; p < P; ++p) wv[p] = _mm512_load_si512(wq + p * stride);
#pragma GCC unroll 6
          for (int r = 0; r < R; ++r) {
            const __m512i xr = _mm512_set1_epi32(load_i32(xq + r * x_stride));
#pragma GCC unroll 4
            for (int p = 0; p < P; ++p) dot[r][p] = dpbusd(dot[r][p], wv[p], xr);
          }
        }
      }
    }
    __m512 ws[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      ws[p] = _mm512_cvtph_ps(_mm256_load_si256(
          reinterpret_cast<const __m256i*>(w + p * stride + scales_offset + static_cast<std::size_t>(g) * 32)));
    }
    if constexpr (R == 1) {
      const __m512i offset = _mm512_set1_epi32(128 * x_sums[g]);
      const __m512 xs = _mm512_set1_ps(x_scales[g]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        const __m512 exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[0][p], offset));
        acc[p] = _mm512_fmadd_ps(exact, _mm512_mul_ps(ws[p], xs), first ? _mm512_setzero_ps() : acc[p]);
        if constexpr (kSegmented) {
          if (last && apart != nullptr) {
            _mm512_storeu_ps(apart + s * kSegmentTileFloats + p * 16, acc[p]);
          } else if (last) {
            total[p] = s == 0 ? acc[p] : _mm512_add_ps(total[p], acc[p]);
          }
        }
      }
    } else {
      // One branch a group, not one per row and panel (24 of them cost about a tenth of a 16-row matmul).
      const GroupEnd end = !last ? GroupEnd::kScratch : s == 0 || apart != nullptr ? GroupEnd::kStore : GroupEnd::kAdd;
      float* const sums = apart != nullptr ? apart + s * kSegmentTileFloats : out;
      const auto finish = [&]<bool kFirst>() __attribute__((always_inline)) {
        switch (end) {
          case GroupEnd::kScratch: group_sums<R, P, kFirst, GroupEnd::kScratch>(dot, ws, x_scales, x_sums, groups, g, sums, scratch); break;
          case GroupEnd::kStore: group_sums<R, P, kFirst, GroupEnd::kStore>(dot, ws, x_scales, x_sums, groups, g, sums, scratch); break;
          case GroupEnd::kAdd: group_sums<R, P, kFirst, GroupEnd::kAdd>(dot, ws, x_scales, x_sums, groups, g, sums, scratch); break;
        }
      };
      if (first) {
        finish.template operator()<true>();
      } else {
        finish.template operator()<false>();
      }
    }
  }
  if constexpr (R == 1 && !kSegmented) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) _mm512_storeu_ps(out + p * 16, acc[p]);
  } else if constexpr (R == 1) {
    // The finished segments' sum, and the running segment's unless it finished here.
    const bool finished = g1 == s_end;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      if (!finished) _mm512_storeu_ps(scratch + p * 16, acc[p]);
      if (apart == nullptr && (finished || s > 0)) _mm512_storeu_ps(out + p * 16, total[p]);
    }
  }
}

using Int8BlockFn = void (*)(const Tile&, const std::int8_t*, const float*, const std::int32_t*, float*, float*, float*,
                             const GroupSegments&, int, int, const PrefetchPlan&);

template <int R, bool kSegmented>
Int8BlockFn int8_block_for_panels(int n_panels) {
  switch (n_panels) {
    case 1: return int8_block<R, 1, kSegmented>;
    case 2: return int8_block<R, 2, kSegmented>;
    case 3: return int8_block<R, 3, kSegmented>;
    default: return int8_block<R, 4, kSegmented>;
  }
}

template <bool kSegmented>
Int8BlockFn int8_block_for(int rows, int n_panels) {
  switch (rows) {
    case 1: return int8_block_for_panels<1, kSegmented>(n_panels);
    case 2: return int8_block_for_panels<2, kSegmented>(n_panels);
    case 3: return int8_block_for_panels<3, kSegmented>(n_panels);
    case 4: return int8_block_for_panels<4, kSegmented>(n_panels);
    case 5: return int8_block_for_panels<5, kSegmented>(n_panels);
    default: return int8_block_for_panels<kInt8MaxRows, kSegmented>(n_panels);
  }
}

// The tile in k chunks of up to kInt8ChunkLines lines (whole groups: 4, 2, 1 or 1 of them), every chunk in
// passes of up to kInt8MaxRows rows; see PrefetchPlan in tile_kernels.h. Chunks need not end on segments.
void int8_tile(const Tile& t) {
  const std::int8_t* x = static_cast<const std::int8_t*>(t.x);
  const int groups = t.k / t.int8_group;
  const bool segmented = t.k_segments != nullptr;
  const GroupSegments segments{t.k_segments, segmented ? t.n_k_segments : 1, t.int8_group, groups};
  float* const scratch = segmented ? t.segment_scratch : t.out;
  const int group_lines = t.int8_group / 4;  // 64-byte lines of a whole group in one panel
  const int total_lines = t.k / 4;
  const int chunk_groups = kInt8ChunkLines / group_lines > 0 ? kInt8ChunkLines / group_lines : 1;
  const int chunk_lines = chunk_groups * group_lines;
  const int passes = (t.n_rows + kInt8MaxRows - 1) / kInt8MaxRows;
  for (int g0 = 0; g0 < groups; g0 += chunk_groups) {
    const int g1 = g0 + chunk_groups < groups ? g0 + chunk_groups : groups;
    PrefetchPlan plan;
    if (passes > 1) {
      if (g1 < groups) {
        plan.next = reinterpret_cast<const char*>(t.panels) + static_cast<std::size_t>(g1) * group_lines * 64;
        plan.lines = total_lines - g1 * group_lines < chunk_lines ? total_lines - g1 * group_lines : chunk_lines;
      } else if (t.prefetch != nullptr) {
        plan.next = reinterpret_cast<const char*>(t.prefetch);
        plan.lines = total_lines < chunk_lines ? total_lines : chunk_lines;
      }
      plan.passes = passes;
    } else {
      plan.ahead = reinterpret_cast<const char*>(t.panels) + static_cast<std::size_t>(g0) * group_lines * 64;
    }
    for (int r = 0, pass = 0; r < t.n_rows; r += kInt8MaxRows, ++pass) {
      const int rows = t.n_rows - r < kInt8MaxRows ? t.n_rows - r : kInt8MaxRows;
      plan.phase = pass;
      const Int8BlockFn block = segmented ? int8_block_for<true>(rows, t.n_panels) : int8_block_for<false>(rows, t.n_panels);
      block(t, x + static_cast<std::size_t>(r) * t.x_stride, t.x_scales + static_cast<std::size_t>(r) * t.x_groups,
            t.x_sums + static_cast<std::size_t>(r) * t.x_groups, t.out + r * kTileStride, scratch + r * kTileStride,
            t.segments_apart != nullptr ? t.segments_apart + r * kTileStride : nullptr, segments, g0, g1, plan);
    }
  }
}

}  // namespace

TileKernel avx512_vnni_int8_tile_kernel() { return int8_tile; }

}  // namespace shardline::kernels::cpu::tile
