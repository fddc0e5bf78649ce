// The AMX tile kernels for bf16 and int8 weights (compiled with -mamx-tile -mamx-bf16 -mamx-int8 and
// AVX-512 F/BW/VL/DQ + F16C).
//
// Why: once a batch shares the pass over the weights, bf16 and int8 matmuls on AVX-512 are bound by
// arithmetic (bf16 widens every weight and multiplies in fp32 FMAs; int8 issues one vpdpbusd per 4 k), so
// 16 rows cost nearly 16 times one row. One AMX tile multiply does up to 16 rows x 16 features x 32 k.
//
// The packed panels already are AMX's B operand (weight_format.h): 32 k of a bf16 panel are a 16-row tile of
// [16 features][2] pairs, as TDPBF16PS reads them, and 32 k of an int8 panel are an 8-row tile of [16][4]
// quads, as TDPBSUD reads them. A is up to 16 rows of prepared activations; C is those rows x the
// panel's 16 features. Tiles 0-3 hold C for up to 4 panels, the others A and B.
//
// bf16: x comes split into two bf16 halves, hi = bf16(x) and lo = bf16(x - hi), and C += hi·W + lo·W. A
// product of two bf16 values is exact in fp32 and hi + lo keeps 16 significant bits of x, so the
// activations are not rounded to bf16 (relative error <= 2^-17 rather than 2^-9); the sums are fp32.
// int8: per group (32 to 128 k: one to three tile multiplies of 32 or 64 k into one C), C = Σ x_q (w_q +
// 128), the exact integer vpdpbusd computes, then the VNNI kernel's fp32 epilogue in the same order: the
// results are bit-identical to tile_kernels_avx512_vnni.cpp, which therefore also takes the tiles of fewer
// than 4 rows, where it is faster. Storing C and scaling it in the epilogue cost as much as the multiplies (a
// tile store costs about four tile multiplies), hence groups as wide as k allows (128, else 96 or 64;
// weight_format.h), and an epilogue that runs between the next group's multiplies (int8_rows).
// AMX rows are independent, so a row's result never depends on the rows that came with it.
//
// Measured (BENCHMARKS.md, issue #7): bf16 batch 16 is 1.5-2x the AVX-512 kernel's. A single row needs
// software prefetching to stream (below); double-buffering the weight tiles and hi/lo as two A rows (one
// multiply per block) were tried without a gain end to end.
#include <immintrin.h>

#include "kernels/cpu/tile_kernels.h"

namespace shardline::kernels::cpu::tile {

namespace {

constexpr int kAmxRows = 16;  // rows of an A or C tile

// LDTILECFG's 64-byte operand, palette 1.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};

  void shape(int tile, int n_rows, int row_bytes) {
    rows[tile] = static_cast<std::uint8_t>(n_rows);
    bytes_per_row[tile] = static_cast<std::uint16_t>(row_bytes);
  }
};
static_assert(sizeof(TileConfig) == 64);

// LDTILECFG of a whole configuration. Not GCC 12's _tile_loadconfig(): its asm operand is
// *(const void**)config, so the optimiser takes the instruction to read 8 of the 64 bytes, and the stores
// that fill in the shapes just before it become dead stores it may drop. A stand-alone loop that built
// its configuration inline that way lost every shape and died of SIGILL at its first tile load; this file
// kept its stores only by the luck of how GCC compiled use_tile_config(). This operand names all 64 bytes.
inline void load_tile_config(const TileConfig& config) { asm volatile("ldtilecfg\t%X0" : : "m"(config)); }

// Loads a tile configuration unless this thread already has it: a decode step makes hundreds of small tile
// calls with the same shapes, and LDTILECFG (which also zeroes every tile) costs about as much as a small
// matrix's multiplies (measured: -10% time on a 288 x 768 GEMV without it). The tiles stay configured
// between calls; the kernel saves their state on context switches like any other register state.
// A call names its shapes by a key (the same key, the same configuration) and builds the configuration only
// when the key changes. Building it on every call and comparing it with the loaded one put 18% of a small
// tile's perf samples on the comparison: its 8-byte loads of a struct just written byte by byte cannot be
// forwarded from the store buffer, so they waited for the stores before them (the previous tile's results
// among them) to reach the cache. Measured: a 16-row int8 matmul 768 -> 2048 on two threads, weights in
// L2, 34.8-37.5 -> 33.6-34.4 us (bf16 about 2% faster; the classifier's streaming passes unchanged).
// One variable serves every kernel of the file: a per-template one would miss another kernel's load.
thread_local std::uint32_t loaded_tile_shape = 0;  // 0: none loaded yet

template <typename Build>
void use_tile_config(std::uint32_t key, Build&& build) {
  if (key == loaded_tile_shape) return;
  TileConfig config;
  build(config);
  load_tile_config(config);
  loaded_tile_shape = key;
}

// The key of a kernel's tile shapes: its kind (1 bf16, 2 int8), panels, k blocks per multiply and rows.
constexpr std::uint32_t tile_shape_key(int kind, int panels, int blocks_per_multiply, int rows) {
  return static_cast<std::uint32_t>(kind << 24 | panels << 16 | blocks_per_multiply << 8 | rows);
}

// Locality as __builtin_prefetch takes it: 3 is PREFETCHT0 (into L1), 2 PREFETCHT1 (into L2).
template <int Locality = 3>
inline void prefetch_lines(const char* at, int lines) {
  for (int line = 0; line < lines; ++line) __builtin_prefetch(at + line * 64, 0, Locality);
}

// Panel 0's k block `distance` blocks after `block` (of `blocks`, block_bytes each) for the kernels to
// prefetch: in this tile, or past its end in the next tile (only from the last row block, which is the last
// to read this one), or null. A tile of fewer blocks than the distance prefetches one tile ahead (block
// `block` of the next tile): the full distance would land past the next tile's first blocks, which nothing
// would then prefetch.
inline const char* block_ahead(const Tile& t, const char* w, int block, int distance, int blocks,
                               std::size_t block_bytes, bool last_rows) {
  const int next = block + (distance < blocks ? distance : blocks);
  if (next < blocks) return w + static_cast<std::size_t>(next) * block_bytes;
  if (t.prefetch == nullptr || !last_rows) return nullptr;
  return reinterpret_cast<const char*>(t.prefetch) + static_cast<std::size_t>(next - blocks) * block_bytes;
}

// ---- bf16 -------------------------------------------------------------------------------------------

// Each panel's weights kBf16PrefetchBlocks blocks ahead (8 KiB) are prefetched (or the start of the next
// tile): a tile load waits for its lines, and with two weight tiles only two loads are in flight, too few to
// stream from memory. Measured on the 110M shape: a single row went from 0.71 to 0.80-0.86 of the
// bandwidth roofline (4 KiB ahead: 0.79-0.83); batch 16 unchanged.
constexpr int kBf16PrefetchBlocks = 8;

// One bf16 k block of panel P: tiles 4/5 hold this block's x halves; B alternates between tiles 6 and 7 so
// one panel's load can overlap the previous panel's multiplies.
#define SHARDLINE_AMX_BF16_PANEL(P, B)                                                                 \
  do {                                                                                                 \
    _tile_loadd(B, w + (P) * t.panel_stride + block * 1024, 64);                                       \
    if (ahead != nullptr) prefetch_lines(ahead + (P) * t.panel_stride, 16);                           \
    _tile_dpbf16ps(P, 4, B);                                                                           \
    _tile_dpbf16ps(P, 5, B);                                                                           \
  } while (0)

template <int P>
void bf16_rows(const Tile& t, int r0, int m) {
  use_tile_config(tile_shape_key(1, P, 1, m), [m](TileConfig& config) {
    for (int p = 0; p < P; ++p) config.shape(p, m, 64);
    config.shape(4, m, 64);
    config.shape(5, m, 64);
    config.shape(6, 16, 64);
    config.shape(7, 16, 64);
  });
  const char* w = reinterpret_cast<const char*>(t.panels);
  const std::size_t x_bytes = static_cast<std::size_t>(t.x_bf16_stride) * 2;
  const char* hi = reinterpret_cast<const char*>(t.x_bf16_hi) + r0 * x_bytes;
  const char* lo = reinterpret_cast<const char*>(t.x_bf16_lo) + r0 * x_bytes;
  _tile_zero(0);
  if constexpr (P > 1) _tile_zero(1);
  if constexpr (P > 2) _tile_zero(2);
  if constexpr (P > 3) _tile_zero(3);
  const int blocks = (t.k + 31) / 32;  // the panels and x are zero past k up to the block
  for (int block = 0; block < blocks; ++block) {
    const char* ahead = block_ahead(t, w, block, kBf16PrefetchBlocks, blocks, 1024, r0 + m == t.n_rows);
    _tile_loadd(4, hi + block * 64, x_bytes);
    _tile_loadd(5, lo + block * 64, x_bytes);
    SHARDLINE_AMX_BF16_PANEL(0, 6);
    if constexpr (P > 1) SHARDLINE_AMX_BF16_PANEL(1, 7);
    if constexpr (P > 2) SHARDLINE_AMX_BF16_PANEL(2, 6);
    if constexpr (P > 3) SHARDLINE_AMX_BF16_PANEL(3, 7);
  }
  float* out = t.out + r0 * kTileStride;
  constexpr std::size_t out_bytes = kTileStride * sizeof(float);
  _tile_stored(0, out, out_bytes);
  if constexpr (P > 1) _tile_stored(1, out + 16, out_bytes);
  if constexpr (P > 2) _tile_stored(2, out + 32, out_bytes);
  if constexpr (P > 3) _tile_stored(3, out + 48, out_bytes);
}
#undef SHARDLINE_AMX_BF16_PANEL

// Rows in blocks of 16. A tile's weights (4 panels x k) stay in L2 between the row blocks of a prefill.
void bf16_tile(const Tile& t) {
  for (int r0 = 0; r0 < t.n_rows; r0 += kAmxRows) {
    const int m = t.n_rows - r0 < kAmxRows ? t.n_rows - r0 : kAmxRows;
    switch (t.n_panels) {
      case 1: bf16_rows<1>(t, r0, m); break;
      case 2: bf16_rows<2>(t, r0, m); break;
      case 3: bf16_rows<3>(t, r0, m); break;
      default: bf16_rows<4>(t, r0, m); break;
    }
  }
}

// ---- int8 -------------------------------------------------------------------------------------------

// 32 k (block b) or, where the group holds an even number of blocks, 64 k (blocks b and b + 1, which are
// contiguous in a panel: one 16-row B tile) of panel P added to C_P (tile P): A (tile 4: those k of x) x B.
// A tile multiply takes as long with 32 k as with 64 (measured: 16 cycles either way), so 64 k halves the
// multiplies and the A loads per weight: -2 to -3% for a batch-16 step's int8 matmuls of the 110M shape, four
// interleaved runs (an earlier kernel, whose epilogue ran once per block, measured -2 to +1%). The block
// kInt8PrefetchBlocks ahead (or the start of the next tile) is prefetched: +35% for batch-16 decode on the
// 110M shape against none. Into L2 (T1), not L1 as bf16's: the weights of four panels 8 KiB ahead crowd
// L1, and a tile load finds its lines in L2 about as fast. Measured on a batch-16 step's int8 matmuls of the
// 110M shape, variants interleaved step by step in one process (the VM's noise is +-10% between runs): -5%
// against L1 prefetches in three runs (again about even with 64-k multiplies, as were 4 and 12 KiB ahead).
// Also tried there: A tiles alternating between two registers (no gain), the C tiles preloaded with the
// -128 x sum offset instead of the epilogue's subtraction (+5 to +9%), and 16 KiB ahead (+6%). Timing
// only: with the epilogue cut to a store of fixed values a 15M batch-16 step ran 5-8% faster (an earlier
// cut that left garbage in the outputs ran slower, from what the garbage did downstream), so its arithmetic
// is at most that share; with the weights in L2 it is 30-45% of a matmul's time.
#define SHARDLINE_AMX_INT8_PANEL(P, B)                                                                 \
  do {                                                                                                 \
    _tile_loadd(B, w + (P) * t.panel_stride + static_cast<std::size_t>(b) * 512, 64);                  \
    if (ahead != nullptr) prefetch_lines<2>(ahead + (P) * t.panel_stride, 8 * blocks_per_multiply);   \
    _tile_dpbsud(P, 4, B);                                                                             \
  } while (0)

constexpr int kInt8PrefetchBlocks = 16;  // 8 KiB ahead in each panel

// The epilogue of one group for rows [r_begin, r_end): the VNNI kernel's, operation for operation, with each
// row's accumulators in `out` (exact fp32 loads and stores), so groups are added in order as there.
template <int P>
inline void int8_group_epilogue(const std::int32_t (*dots)[kAmxRows * 16], const float (*w_scales)[16],
                                const float* x_scales, const std::int32_t* x_sums, int groups, int g, float* out,
                                int r_begin, int r_end) {
  for (int r = r_begin; r < r_end; ++r) {
    const __m512i offset = _mm512_set1_epi32(128 * x_sums[static_cast<std::size_t>(r) * groups + g]);
    const __m512 xs = _mm512_set1_ps(x_scales[static_cast<std::size_t>(r) * groups + g]);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      float* acc = out + r * kTileStride + p * 16;
      const __m512 exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(dots[p] + r * 16), offset));
      _mm512_storeu_ps(acc, _mm512_fmadd_ps(exact, _mm512_mul_ps(_mm512_load_ps(w_scales[p]), xs),
                                            g == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(acc)));
    }
  }
}

// Software-pipelined: the integer dots of group g are stored from the tiles into one of two buffers, and the
// epilogue of group g - 1 (from the other) runs a few rows after each of group g's multiplies, so the AVX-512
// scaling overlaps the tile unit's multiplies instead of following them. Run apart (8 groups' multiplies,
// then their epilogue), a stand-alone loop measured the multiplies at about a third of the kernel's time and
// the epilogue at about a third; pipelined, a 768 x 2048 matmul of 16 rows went from 80-86 to 60-64 us on one
// thread, and batch-16 int8 decode on the 110M shape gained 10%.
template <int P>
void int8_rows(const Tile& t, int r0, int m) {
  const int blocks_per_group = t.int8_group / 32;
  const int blocks_per_multiply = blocks_per_group % 2 == 0 ? 2 : 1;  // 64 k where the group allows
  use_tile_config(tile_shape_key(2, P, blocks_per_multiply, m), [m, blocks_per_multiply](TileConfig& config) {
    for (int p = 0; p < P; ++p) config.shape(p, m, 64);
    config.shape(4, m, 32 * blocks_per_multiply);
    config.shape(6, 8 * blocks_per_multiply, 64);
    config.shape(7, 8 * blocks_per_multiply, 64);
  });
  const char* w = reinterpret_cast<const char*>(t.panels);
  const int groups = t.k / t.int8_group;
  const int blocks = t.k / 32;
  const std::size_t scales_offset = t.int8_scales_offset;
  const char* x = static_cast<const char*>(t.x) + static_cast<std::size_t>(r0) * t.x_stride;
  const float* x_scales = t.x_scales + static_cast<std::size_t>(r0) * t.x_groups;
  const std::int32_t* x_sums = t.x_sums + static_cast<std::size_t>(r0) * t.x_groups;
  float* out = t.out + r0 * kTileStride;
  alignas(64) std::int32_t dots[2][4][kAmxRows * 16];
  alignas(64) float w_scales[2][4][16];
  const int multiplies_per_group = blocks_per_group / blocks_per_multiply;
  // Rows of the previous group's epilogue after each of this group's multiplies.
  const int rows_per_multiply = (m + multiplies_per_group - 1) / multiplies_per_group;
  for (int g = 0; g < groups; ++g) {
    const int buffer = g & 1, previous = buffer ^ 1;
    _tile_zero(0);
    if constexpr (P > 1) _tile_zero(1);
    if constexpr (P > 2) _tile_zero(2);
    if constexpr (P > 3) _tile_zero(3);
    for (int i = 0; i < multiplies_per_group; ++i) {
      const int b = g * blocks_per_group + i * blocks_per_multiply;
      const char* ahead = block_ahead(t, w, b, kInt8PrefetchBlocks, blocks, 512, r0 + m == t.n_rows);
      _tile_loadd(4, x + b * 32, t.x_stride);
      SHARDLINE_AMX_INT8_PANEL(0, 6);
      if constexpr (P > 1) SHARDLINE_AMX_INT8_PANEL(1, 7);
      if constexpr (P > 2) SHARDLINE_AMX_INT8_PANEL(2, 6);
      if constexpr (P > 3) SHARDLINE_AMX_INT8_PANEL(3, 7);
      if (g > 0) {
        const int r_begin = i * rows_per_multiply;
        const int r_end = r_begin + rows_per_multiply < m ? r_begin + rows_per_multiply : m;
        int8_group_epilogue<P>(dots[previous], w_scales[previous], x_scales, x_sums, t.x_groups, g - 1, out, r_begin,
                               r_end);
      }
    }
    _tile_stored(0, dots[buffer][0], 64);
    if constexpr (P > 1) _tile_stored(1, dots[buffer][1], 64);
    if constexpr (P > 2) _tile_stored(2, dots[buffer][2], 64);
    if constexpr (P > 3) _tile_stored(3, dots[buffer][3], 64);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      _mm512_store_ps(w_scales[buffer][p], _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(
                                               w + p * t.panel_stride + scales_offset + static_cast<std::size_t>(g) * 32))));
    }
  }
  const int last = groups - 1;
  int8_group_epilogue<P>(dots[last & 1], w_scales[last & 1], x_scales, x_sums, t.x_groups, last, out, 0, m);
}
#undef SHARDLINE_AMX_INT8_PANEL

// Below this many rows the VNNI kernel is as fast or faster (a 1-row tile multiply still pays the tile
// store and the epilogue through memory for every group); the results are identical either way.
constexpr int kInt8AmxMinRows = 4;

// No reduction segments (Tile::k_segments): TileKernels::int8_segments is null with AMX, so matmul_segments
// calls it per segment (the VNNI kernel it hands short tiles to would take them, these tiles would not).
void int8_tile(const Tile& t) {
  if (t.k_segments != nullptr) __builtin_trap();
  if (t.n_rows < kInt8AmxMinRows) {
    avx512_vnni_int8_tile_kernel()(t);
    return;
  }
  for (int r0 = 0; r0 < t.n_rows; r0 += kAmxRows) {
    const int m = t.n_rows - r0 < kAmxRows ? t.n_rows - r0 : kAmxRows;
    switch (t.n_panels) {
      case 1: int8_rows<1>(t, r0, m); break;
      case 2: int8_rows<2>(t, r0, m); break;
      case 3: int8_rows<3>(t, r0, m); break;
      default: int8_rows<4>(t, r0, m); break;
    }
  }
}

}  // namespace

TileKernel amx_bf16_tile_kernel() { return bf16_tile; }
TileKernel amx_int8_tile_kernel() { return int8_tile; }

}  // namespace shardline::kernels::cpu::tile
