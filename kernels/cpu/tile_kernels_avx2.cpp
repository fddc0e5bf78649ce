// The AVX2 + FMA tile kernels (compiled with -mavx2 -mfma -mf16c): CPUs without AVX-512, such as AMD Zen 2
// and 3 and Intel before Skylake-SP. Until session 30 this level ran the portable source compiled for
// AVX2; on an EPYC (Zen 3) its batched fp32 decode ran no faster than batch 1 and int8 at a third of fp32
// (BENCHMARKS.md, session 30).
//
// 16 ymm registers, a panel's 16 features in two of them. A block of R rows x P panels keeps 2 R P fp32
// accumulators (int8: int32 group dots) in registers; per k step the P panels' weight vectors are loaded
// once and each is multiplied by R broadcast activations. The shapes (kPanelsForRows) keep 8 to 12
// independent chains for FMA's latency and leave room for the weights and a broadcast.
//
// Every output is one FMA chain along k from zero, whatever the block shape, so a row's result does not
// depend on its batch, and fp32 and bf16 give the bits of the AVX-512 kernels. int8 computes each group's
// exact integer dot (the signed weight q = stored - 128 times x), then scales and adds it in fp32 as the
// VNNI kernel does: the same bits.
#include <immintrin.h>

#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu::tile {

namespace {

// Rows per pass and the panels a block takes for them: 2 R P accumulators of the 16 registers.
constexpr int kMaxRows = 6;
constexpr int kPanelsForRows[kMaxRows + 1] = {0, 4, 2, 2, 1, 1, 1};
// k chunk in 64-byte lines per panel (bf16's widened chunk and int8's; fp32 takes kF32ChunkLines): 16 KiB of
// fp32 for four panels, so the passes after the first read the chunk from L1 (32 KiB on Zen 2/3 and Haswell).
constexpr int kChunkLinesAvx2 = 64;
constexpr int kNoLine = 1 << 30;  // a line index past any chunk

// A single pass streams its panels kAheadLines ahead (tile_kernels.h prefetch_ahead): this plan. Past the
// panel's `lines` lines it goes on into the next tile's (then: Tile::prefetch at the same panel; null where
// none), so a tile does not start on lines nothing fetched (before, only the last panel's ran on into the
// next tile, the others' into panels this tile had already read). 110M int8 decode on two threads went from
// 127-144 to 141-162 tok/s, up in 4 of 4 alternations, with one thread in 7 of 8, bf16 in 3 of 4
// (BENCHMARKS.md, session 32). fp32 keeps the old prefetch (f32_chunk).
//
// The plan helpers fill a plan in place rather than return one: GCC copied a returned plan through the stack
// with 16-byte loads of fields just stored 8 and 4 bytes at a time, which store forwarding cannot serve, and
// the stalls put a tenth of a batch's time in the code around the block calls (perf, session 32).
inline void plan_ahead(PrefetchPlan& plan, const void* panels, int lines = 0, const void* then = nullptr) {
  plan.ahead = static_cast<const char*>(panels);
  plan.ahead_lines = lines;
  plan.ahead_then = static_cast<const char*>(then);
}

// Panel p of the next tile (Tile::prefetch), or null.
inline const char* next_tile_panel(const Tile& t, int p) {
  return t.prefetch != nullptr ? reinterpret_cast<const char*>(t.prefetch) + p * t.panel_stride : nullptr;
}

// Block<R, P>::fn for rows and panels known only at run time (template arguments, so that the accumulators
// live in registers): rows up to MaxRows and panels up to kTilePanels; more take the largest.
template <template <int, int> class Block, int MaxRows, int R = 1, int P = 1>
auto block_for(int rows, int panels) {
  if constexpr (R < MaxRows) {
    if (rows > R) return block_for<Block, MaxRows, R + 1, P>(rows, panels);
  }
  if constexpr (P < kTilePanels) {
    if (panels > P) return block_for<Block, MaxRows, R, P + 1>(rows, panels);
  }
  return Block<R, P>::fn;
}

// fn(pass, passes, r, rows, p, panels) for each block of a tile-shaped problem: the fewest passes of at most
// max_rows rows, their rows as equal as they divide (16 of 6: 6 + 5 + 5, not 6 + 6 + 4, whose 4-row block
// would have too few FMA chains), each pass over the panels in blocks of panels_for_rows[rows].
template <typename Fn>
void for_each_block(int n_rows, int n_panels, int max_rows, const int* panels_for_rows, const Fn& fn) {
  const int passes = (n_rows + max_rows - 1) / max_rows;
  for (int pass = 0, r = 0; pass < passes; ++pass) {
    const int rows = n_rows / passes + (pass < n_rows % passes ? 1 : 0);
    for (int p = 0; p < n_panels; p += panels_for_rows[rows]) {
      fn(pass, passes, r, rows, p, n_panels - p < panels_for_rows[rows] ? n_panels - p : panels_for_rows[rows]);
    }
    r += rows;
  }
}

// A batch's passes over a chunk fetch the next chunk (or the next tile's first) a share each: pass `phase`
// of `passes` takes every passes-th line of each of its panels. A chunk of a panel is 2-4 KiB, and the
// hardware prefetchers, which stop at 4 KiB pages, had not caught up before the chunk ended (fp32 at 16 and
// 64 rows waited on a fifth of its weight loads and ran at half the rate of bf16, whose widening loop
// streams). Until session 31 the first pass fetched the whole next chunk and the others none, so the memory
// bus idled while they computed; spread over every pass, 16 rows of 2048 -> 5632 on two threads went from
// 5.8-6.1 to 5.1-5.2 ms (best of 6-7) and 110M int8 decode at batch 16 from 387-394 to 463-473 tok/s
// (BENCHMARKS.md, session 31). Weights already in L3 (768 -> 2048, 6 MiB) run 6-9% slower than with the
// first pass's prefetch and 15-30% slower than with none; a model's weights are not in L3.
//
// The plan of a block's pass (PrefetchPlan::next: the next chunk's line 0 in the block's first panel, its
// panels next_stride apart): every line up to the current chunk's length, into L1.
// lines: the next chunk's lines a panel where it has fewer than this chunk's k steps (bf16's pairs).
inline void plan_next_chunk_share(PrefetchPlan& plan, const char* next, std::size_t next_stride, int pass, int passes,
                                  int lines = kNoLine) {
  plan.next = next;
  plan.next_stride = next_stride;
  plan.phase = pass;
  plan.passes = passes;
  plan.lines = lines;
}

// This pass's share of the next chunk (PrefetchPlan::next), prefetched as the pass walks its own chunk: line
// `line` of the next chunk in each of n_panels when the pass reaches line `line` of this one and it is the
// pass's (share: the next such line, from plan.phase; passes apart). No plan.next: share starts past any
// line, a compare that never holds. One compare per line, where a countdown behind null checks of the plan
// (a dozen instructions beside a 6-row block's 12 FMAs) held the fp32 block's loop to the front end's rate.
// Past plan.lines, none either.
inline int first_share(const PrefetchPlan& plan) { return plan.next != nullptr ? plan.phase : kNoLine; }
inline void prefetch_share(const PrefetchPlan& plan, int& share, int n_panels, int line) {
  if (line != share) return;
  share += plan.passes;
  if (share >= plan.lines) share = kNoLine;
  for (int p = 0; p < n_panels; ++p) {
    _mm_prefetch(plan.next + p * plan.next_stride + static_cast<std::size_t>(line) * 64, _MM_HINT_T0);
  }
}

// ---- fp32 -------------------------------------------------------------------------------------------

// The 2 R P fp32 sums of an R-row, P-panel block, in registers (every loop below unrolled): loaded from out
// (accumulate) or zero, one k step's FMAs, stored back. Shared by the fp32 block and bf16's register-widening
// one, so both make the same chains.
template <int R, int P>
struct BlockSums {
  __m256 acc[R][2 * P];

  __attribute__((always_inline)) BlockSums(const float* out, bool accumulate) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < 2 * P; ++v) acc[r][v] = accumulate ? _mm256_loadu_ps(out + r * kTileStride + v * 8) : _mm256_setzero_ps();
    }
  }
  // acc[r][v] += w[v] * x[r * x_stride]: one k step of every row (x at the step's k in row 0).
  __attribute__((always_inline)) void fma(const __m256 (&w)[2 * P], const float* x, std::size_t x_stride) {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * x_stride);
#pragma GCC unroll 8
      for (int v = 0; v < 2 * P; ++v) acc[r][v] = _mm256_fmadd_ps(w[v], xb, acc[r][v]);
    }
  }
  __attribute__((always_inline)) void store(float* out) const {
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < 2 * P; ++v) _mm256_storeu_ps(out + r * kTileStride + v * 8, acc[r][v]);
    }
  }
};

// k steps [k0, k1) of R rows x P panels (w: the first panel, stride floats apart); accumulate: continue the
// sums in out. plan: the panels' own lines kAheadLines ahead (a single pass, which waits on memory; ahead is
// w), or this pass's share of the next chunk.
// kAhead: the plan is a single pass's (plan.ahead), else a share of the next chunk's (or none): two loops, so
// each step checks one plan, not both.
template <int R, int P, bool kAhead>
void f32_block_loop(const float* w, std::size_t stride, const float* x, int x_stride, float* out, int k0, int k1,
                    bool accumulate, const PrefetchPlan& plan) {
  BlockSums<R, P> sums(out, accumulate);
  int share = first_share(plan);
  for (int kk = k0; kk < k1; ++kk) {
    if constexpr (kAhead) {
      prefetch_ahead(plan, kk, P, stride * sizeof(float));
    } else {
      prefetch_share(plan, share, P, kk - k0);
    }
    __m256 wv[2 * P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      wv[2 * p] = _mm256_load_ps(w + p * stride + static_cast<std::size_t>(kk) * 16);
      wv[2 * p + 1] = _mm256_load_ps(w + p * stride + static_cast<std::size_t>(kk) * 16 + 8);
    }
    sums.fma(wv, x + kk, static_cast<std::size_t>(x_stride));
  }
  sums.store(out);
}

template <int R, int P>
void f32_block(const float* w, std::size_t stride, const float* x, int x_stride, float* out, int k0, int k1,
               bool accumulate, const PrefetchPlan& plan) {
  if (plan.ahead != nullptr) {
    f32_block_loop<R, P, true>(w, stride, x, x_stride, out, k0, k1, accumulate, plan);
  } else {
    f32_block_loop<R, P, false>(w, stride, x, x_stride, out, k0, k1, accumulate, plan);
  }
}

template <int R, int P>
struct F32Block {
  static constexpr auto fn = f32_block<R, P>;
};

// k steps [k0, k1) of every row and panel of a tile-shaped problem: passes of up to kMaxRows rows, each
// over the panels in blocks of kPanelsForRows. next: the next chunk's first panel, next_stride bytes
// between its panels (prefetch_share; null: none).
// One row prefetches kAheadLines ahead on past the panels' end, not into the next tile as bf16 and int8 do
// (plan_ahead): for fp32, whose tiles are 2-4 times theirs in bytes, that read 1-14% slower in 8 of 10
// alternations of 110M decode with one thread and with tp=2 (BENCHMARKS.md, session 32).
void f32_chunk(const float* w, std::size_t stride, int n_panels, const float* x, int x_stride, int n_rows, float* out,
               int k0, int k1, bool accumulate, const char* next = nullptr, std::size_t next_stride = 0,
               int next_lines = kNoLine) {
  for_each_block(n_rows, n_panels, kMaxRows, kPanelsForRows, [&](int pass, int passes, int r, int rows, int p, int panels) {
    PrefetchPlan plan;
    if (n_rows == 1) {
      plan_ahead(plan, w + p * stride);
    } else if (next != nullptr) {
      plan_next_chunk_share(plan, next + p * next_stride, next_stride, pass, passes, next_lines);
    }
    block_for<F32Block, kMaxRows>(rows, panels)(w + p * stride, stride, x + static_cast<std::size_t>(r) * x_stride,
                                                x_stride, out + r * kTileStride + p * 16, k0, k1, accumulate, plan);
  });
}

// The first line of the chunk after the one ending at line `end` of a tile of total_lines lines a panel:
// in the tile, or the next tile's first (Tile::prefetch, null where none).
inline const char* next_chunk(const Tile& t, int end, int total_lines) {
  if (end < total_lines) return reinterpret_cast<const char*>(t.panels) + static_cast<std::size_t>(end) * 64;
  return reinterpret_cast<const char*>(t.prefetch);
}

// fp32 takes chunks of 48 lines, not kChunkLinesAvx2: 12 KiB for four panels, so that the chunk, the next one
// its passes prefetch, 16 rows' x (3 KiB) and the tile's sums (4 KiB) fit the 32 KiB of L1 together (with 64
// lines they need 40). 16 rows of 2048 -> 5632 on two threads ran faster in 10 of 12 alternations (medians
// 3967 -> 3795 us), 64 rows of 768 -> 2048 in 8 of 10, 110M decode at batch 16 in 6 of 9 (BENCHMARKS.md,
// session 33).
constexpr int kF32ChunkLines = 48;

void f32_tile(const Tile& t) {
  const float* w = reinterpret_cast<const float*>(t.panels);
  const std::size_t stride = t.panel_stride / sizeof(float);
  for (int k0 = 0; k0 < t.k; k0 += kF32ChunkLines) {
    const int k1 = k0 + kF32ChunkLines < t.k ? k0 + kF32ChunkLines : t.k;
    f32_chunk(w, stride, t.n_panels, static_cast<const float*>(t.x), t.x_stride, t.n_rows, t.out, k0, k1, k0 > 0,
              next_chunk(t, k1, t.k), t.panel_stride);
  }
}

// ---- bf16 -------------------------------------------------------------------------------------------

// A bf16 is the top half of a float: a pair's even k widens with a shift, its odd k with a mask.
inline __m256 widen_even(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }
inline __m256 widen_odd(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// A single pass (decode of 1 to kMaxRows rows) of k steps [k0, k1) (k0 even) over P panels: each pair of k
// widened in registers, the even half and then the odd half multiplied into every row, so each output is the
// fp32 blocks' FMA chain along k (the same bits as bf16_tile_widened). Widening a chunk into L1 first stored
// and reloaded every value for a single pass over it; 4 rows read 0.55-0.61 of the roofline there against
// fp32's 0.89-1.01 (session 32). One row took a block of its own until session 34; this one ran it 27-30%
// faster with the weights in L3 (BM_PackedMatmul, 15M bf16 decode 1538-1548 -> 1869-1959 tok/s) and the
// same from memory (110M and 1.1B within the noise; BENCHMARKS.md, session 34).
// The prefetch runs kAheadLines ahead and on into the next tile's first panel (then: Tile::prefetch), as
// plan_ahead describes.
template <int R, int P>
void bf16_rows_block(const std::uint32_t* w, std::size_t stride, const float* x, int x_stride, int k, float* out,
                     int k0, int k1, bool accumulate, const char* then) {
  BlockSums<R, P> sums(out, accumulate);
  PrefetchPlan plan;
  plan_ahead(plan, w, (k + 1) / 2, then);
  for (int kk = k0; kk < k1; kk += 2) {
    prefetch_ahead(plan, kk / 2, P, stride * sizeof(std::uint32_t));
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      if (half == 1 && kk + 1 == k) break;  // an odd k: the last pair's odd half has no activation
      __m256 wide[2 * P];
#pragma GCC unroll 8
      for (int v = 0; v < 2 * P; ++v) {
        const __m256i pairs = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(w + (v / 2) * stride + static_cast<std::size_t>(kk / 2) * 16 + (v % 2) * 8));
        wide[v] = half == 0 ? widen_even(pairs) : widen_odd(pairs);
      }
      sums.fma(wide, x + kk + half, static_cast<std::size_t>(x_stride));
    }
  }
  sums.store(out);
}

template <int R, int P>
struct Bf16RowsBlock {
  static constexpr auto fn = bf16_rows_block<R, P>;
};

// Pairs per chunk that a batch widens once into L1: 64 k, 4 KiB of fp32 a panel, 16 KiB for four.
constexpr int kWideChunkPairs = 32;

// A batch of several passes (over kMaxRows rows): each chunk of the panels is widened once into fp32 in L1
// and the fp32 blocks run over it (the same FMAs in the same order: the same bits), so the passes neither
// widen again nor read bf16 from L2.
void bf16_tile_widened(const Tile& t) {
  alignas(64) float wide[kTilePanels * kWideChunkPairs * 32];
  const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(t.panels);
  const std::size_t stride = t.panel_stride / sizeof(std::uint32_t);
  const float* x = static_cast<const float*>(t.x);
  const int total_pairs = (t.k + 1) / 2;
  for (int j0 = 0; j0 < total_pairs; j0 += kWideChunkPairs) {
    const int j1 = j0 + kWideChunkPairs < total_pairs ? j0 + kWideChunkPairs : total_pairs;
    const char* next = next_chunk(t, j1, total_pairs);
    for (int p = 0; p < t.n_panels; ++p) {
      const std::uint32_t* src = w + p * stride + static_cast<std::size_t>(j0) * 16;
      float* dst = wide + p * kWideChunkPairs * 32;
      for (int j = 0; j < j1 - j0; ++j) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m256i pairs = _mm256_load_si256(reinterpret_cast<const __m256i*>(src + j * 16 + h * 8));
          _mm256_store_ps(dst + j * 32 + h * 8, widen_even(pairs));        // W(f, 2j)
          _mm256_store_ps(dst + j * 32 + 16 + h * 8, widen_odd(pairs));    // W(f, 2j + 1)
        }
      }
    }
    const int k0 = 2 * j0;
    const int k1 = 2 * j1 < t.k ? 2 * j1 : t.k;  // an odd k's last pair has no partner activation
    // The fp32 passes fetch the next bf16 chunk a share each (its kWideChunkPairs lines a panel over their 2x
    // as many k steps), behind their FMAs: the widening loop that fetched it all ran a burst of a hundred
    // prefetches the miss buffers could not hold and waited on its own loads for half its time (perf, 4 rows
    // of 2048 -> 5632, session 32).
    f32_chunk(wide, kWideChunkPairs * 32, t.n_panels, x + k0, t.x_stride, t.n_rows, t.out, 0, k1 - k0, j0 > 0,
              next, t.panel_stride, kWideChunkPairs);
  }
}

void bf16_tile(const Tile& t) {
  if (t.n_rows > kMaxRows) return bf16_tile_widened(t);  // several passes: widen once into L1
  const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(t.panels);
  const std::size_t stride = t.panel_stride / sizeof(std::uint32_t);
  const float* x = static_cast<const float*>(t.x);
  constexpr int kChunkK = 2 * kChunkLinesAvx2;
  for (int k0 = 0; k0 < t.k; k0 += kChunkK) {
    const int k1 = k0 + kChunkK < t.k ? k0 + kChunkK : t.k;
    for_each_block(t.n_rows, t.n_panels, kMaxRows, kPanelsForRows, [&](int, int, int r, int rows, int p, int panels) {
      block_for<Bf16RowsBlock, kMaxRows>(rows, panels)(w + p * stride, stride, x + static_cast<std::size_t>(r) * t.x_stride,
                                                       t.x_stride, t.k, t.out + r * kTileStride + p * 16, k0, k1,
                                                       k0 > 0, next_tile_panel(t, p));
    });
  }
}

// ---- int8 -------------------------------------------------------------------------------------------
//
// AVX2 has no vpdpbusd. vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16, which
// saturates for the stored weights (255 * 127 * 2 > 32767). So each k quad multiplies |x| (0..127) by the
// signed weight q (stored ^ 0x80) with x's sign moved onto it (vpsignb): q * x exactly, a pair at most
// 2 * 127 * 127 = 32258, never saturating. vpmaddwd against ones adds the pairs into a lane's int32. The
// group's dot is then q . x exactly, the VNNI kernel's dot less its +128 offset.

inline std::int32_t load_i32(const void* p) {
  std::int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// Rows per pass and panels per block for int8: 2 R P int32 dots, the weights, x, |x| and the ones in 16.
constexpr int kInt8MaxRows = 4;
constexpr int kInt8PanelsForRows[kInt8MaxRows + 1] = {0, 4, 2, 1, 1};

// Groups [g0, g1) of R rows x P panels, in reduction segments as the VNNI kernel takes them. Each group's
// dot is summed in registers, then scaled and added onto the running segment's fp32 sums in scratch (from
// zero at the segment's first group), which stay in L1. After a segment's last group its sums go into out:
// stored there for the first segment and added onto what is there for the others, or, with apart
// (Tile::segments_apart), stored apart at apart + s * kSegmentTileFloats. One segment with scratch = out
// is a plain matmul.
// kAhead: the plan is a single pass's (plan.ahead), else a batch's share of the next chunk (or none), as
// f32_block_loop.
template <int R, int P, bool kAhead>
void int8_block_loop(const Tile& t, const std::uint8_t* w, const std::int8_t* x, const float* x_scales, float* out,
                     float* scratch, float* apart, const GroupSegments& segments, int g0, int g1,
                     const PrefetchPlan& plan) {
  const std::size_t stride = t.panel_stride;
  const std::size_t x_stride = static_cast<std::size_t>(t.x_stride);
  const int quads_per_group = t.int8_group / 4;  // one 64-byte line of a panel each
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  int share = first_share(plan);
  // The running segment, followed group by group as the VNNI kernel does (segment_of for each group divided
  // once per segment before it; five alternations of BM_SegmentedMatmul/dtype:2 read the same either way).
  int s = segments.segment_of(g0), s_begin = segments.bound(s), s_end = segments.bound(s + 1);
  for (int g = g0; g < g1; ++g) {
    if (g == s_end) {  // the next segment
      ++s;
      s_begin = s_end;
      s_end = segments.bound(s + 1);
    }
    __m256i dot[R][2 * P];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < 2 * P; ++v) dot[r][v] = _mm256_setzero_si256();
    }
    const std::uint8_t* wq = w + static_cast<std::size_t>(g) * quads_per_group * 64;
    const std::int8_t* xq = x + g * t.int8_group;
#pragma GCC unroll 1
    for (int q = 0; q < quads_per_group; ++q, wq += 64, xq += 4) {
      if constexpr (kAhead) {
        prefetch_ahead(plan, g * quads_per_group + q, P, stride);
      } else {
        prefetch_share(plan, share, P, (g - g0) * quads_per_group + q);
      }
      __m256i xs[R], xa[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        xs[r] = _mm256_set1_epi32(load_i32(xq + r * x_stride));
        xa[r] = _mm256_abs_epi8(xs[r]);
      }
#pragma GCC unroll 8
      for (int v = 0; v < 2 * P; ++v) {
        const __m256i q8 = _mm256_xor_si256(
            _mm256_load_si256(reinterpret_cast<const __m256i*>(wq + (v / 2) * stride + (v % 2) * 32)), flip);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256i pairs = _mm256_maddubs_epi16(xa[r], _mm256_sign_epi8(q8, xs[r]));
          dot[r][v] = _mm256_add_epi32(dot[r][v], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    // dot * (weight scale * x scale), added in fp32 as the VNNI kernel adds it.
    const bool first = g == s_begin, last = g + 1 == s_end;
    // Where a finished segment goes: stored (the first, or apart) or added onto the segments before it.
    const bool add = last && s > 0 && apart == nullptr;
    float* const finished = apart != nullptr ? apart + s * kSegmentTileFloats : out;
#pragma GCC unroll 8
    for (int v = 0; v < 2 * P; ++v) {
      const __m256 ws = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(
          w + (v / 2) * stride + t.int8_scales_offset + static_cast<std::size_t>(g) * 32 + (v % 2) * 16)));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(x_scales[static_cast<std::size_t>(r) * t.x_groups + g]));
        float* part = scratch + r * kTileStride + v * 8;
        const __m256 before = first ? _mm256_setzero_ps() : _mm256_loadu_ps(part);
        const __m256 value = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][v]), scale, before);
        float* sum = finished + r * kTileStride + v * 8;
        if (!last) {
          _mm256_storeu_ps(part, value);
        } else if (add) {
          _mm256_storeu_ps(sum, _mm256_add_ps(_mm256_loadu_ps(sum), value));
        } else {
          _mm256_storeu_ps(sum, value);
        }
      }
    }
  }
}

template <int R, int P>
void int8_block(const Tile& t, const std::uint8_t* w, const std::int8_t* x, const float* x_scales, float* out,
                float* scratch, float* apart, const GroupSegments& segments, int g0, int g1, const PrefetchPlan& plan) {
  if (plan.ahead != nullptr) {
    int8_block_loop<R, P, true>(t, w, x, x_scales, out, scratch, apart, segments, g0, g1, plan);
  } else {
    int8_block_loop<R, P, false>(t, w, x, x_scales, out, scratch, apart, segments, g0, g1, plan);
  }
}

template <int R, int P>
struct Int8Block {
  static constexpr auto fn = int8_block<R, P>;
};

// The tile in chunks of whole groups (about kChunkLinesAvx2 / 2 lines a panel: 8 KiB for four panels, in
// L1 for the passes after the first), each chunk in passes of up to kInt8MaxRows rows.
void int8_tile(const Tile& t) {
  const std::uint8_t* w = reinterpret_cast<const std::uint8_t*>(t.panels);
  const std::int8_t* x = static_cast<const std::int8_t*>(t.x);
  const int groups = t.k / t.int8_group;
  const bool segmented = t.k_segments != nullptr;
  const GroupSegments segments{t.k_segments, segmented ? t.n_k_segments : 1, t.int8_group, groups};
  float* const scratch = segmented ? t.segment_scratch : t.out;
  const int group_lines = t.int8_group / 4;
  const int chunk_groups = kChunkLinesAvx2 / 2 / group_lines > 0 ? kChunkLinesAvx2 / 2 / group_lines : 1;
  for (int g0 = 0; g0 < groups; g0 += chunk_groups) {
    const int g1 = g0 + chunk_groups < groups ? g0 + chunk_groups : groups;
    const char* next = t.n_rows > 1 ? next_chunk(t, g1 * group_lines, groups * group_lines) : nullptr;
    for_each_block(t.n_rows, t.n_panels, kInt8MaxRows, kInt8PanelsForRows,
                   [&](int pass, int passes, int r, int rows, int p, int panels) {
      const int at = r * kTileStride + p * 16;
      PrefetchPlan plan;
      if (rows == 1) {  // a single row: for_each_block splits more rows into passes of two or more
        plan_ahead(plan, w + p * t.panel_stride, groups * group_lines, next_tile_panel(t, p));
      } else if (next != nullptr) {
        plan_next_chunk_share(plan, next + p * t.panel_stride, t.panel_stride, pass, passes);
      }
      block_for<Int8Block, kInt8MaxRows>(rows, panels)(
          t, w + p * t.panel_stride, x + static_cast<std::size_t>(r) * t.x_stride,
          t.x_scales + static_cast<std::size_t>(r) * t.x_groups, t.out + at, scratch + at,
          t.segments_apart != nullptr ? t.segments_apart + at : nullptr, segments, g0, g1, plan);
    });
  }
}

}  // namespace

TileKernels avx2_tile_kernels() { return {f32_tile, bf16_tile, int8_tile, int8_tile}; }

}  // namespace shardline::kernels::cpu::tile
