// Internal to kernels/cpu: the per-ISA inner kernels of packed_matmul.cpp. One call computes a tile: up
// to kTilePanels consecutive panels of one packed matrix (weight_format.h) against up to kTileRows
// prepared rows, into a small dense buffer; packed_matmul.cpp splits the work over threads and copies the
// tile out (clipping the padded features, applying fused epilogues).
//
// The ISA files are compiled with their own target flags and include nothing but this header and
// <immintrin.h>: an inline function from a shared header compiled there with AVX-512 could be the copy the
// linker keeps for everyone, and crash older CPUs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardline::kernels::cpu::tile {

inline constexpr int kTilePanels = 4;
inline constexpr int kTileRows = 64;
inline constexpr int kTileStride = kTilePanels * 16;  // floats between rows of Tile::out

struct Tile {
  const std::byte* panels = nullptr;  // the first panel of the tile
  std::size_t panel_stride = 0;       // bytes between panels
  int n_panels = 0;                   // 1 .. kTilePanels
  int k = 0;                          // k of the activations: exact for fp32 / bf16, padded for int8
  // Prepared rows (see Activations), already offset to the first row of the tile.
  const void* x = nullptr;            // fp32 values (fp32 and bf16 weights) or int8 values
  int x_stride = 0;                   // elements between rows of x
  int int8_group = 0;                 // int8: k values per scale (32, 64, 96 or 128; weight_format.h), dividing k
  const float* x_scales = nullptr;    // int8: per row, k / int8_group scales
  const std::int32_t* x_sums = nullptr;  // int8: per row, k / int8_group sums of q
  int x_groups = 0;                   // int8: groups between rows of x_scales and x_sums (k / int8_group but
                                      // in a k range of the matrix: the whole matrix's count)
  std::size_t int8_scales_offset = 0; // int8: bytes from a panel's first quad of the tile to its first scale
                                      // (k * 16 but in a k range of the matrix: packed_matmul.h)
  // bf16 weights on avx512-bf16 and AMX: x as two bf16 halves (x ~ hi + lo), rows of x_bf16_stride elements,
  // zero past k.
  const std::uint16_t* x_bf16_hi = nullptr;
  const std::uint16_t* x_bf16_lo = nullptr;
  int x_bf16_stride = 0;
  int n_rows = 0;                     // 1 .. kTileRows
  float* out = nullptr;               // (n_rows, kTileStride): out[r * kTileStride + p * 16 + lane]
  // The next tile's panels (same stride and count), or null: see PrefetchPlan.
  const std::byte* prefetch = nullptr;
  // Kernels that take reduction segments (TileKernels::int8_segments; null here: one segment): the tile's k
  // in n_k_segments non-empty segments, segment s from k_segments[s] (int8: a multiple of int8_group) to
  // k_segments[s + 1] (the last ends at k, with its padding). Each segment's products are summed from zero
  // and added onto the sum of the segments before it, in order: matmul_segments' fold, in one call where a
  // call per segment cost a pass per row block and group (a 15M int8 prefill ran a third slower).
  // segment_scratch: (n_rows, kTileStride) floats for a segment's running sums. segments_apart (null: the
  // fold, into out): each segment's products apart instead, segment s's (n_rows, kTileStride) at
  // segments_apart + s * kSegmentTileFloats (a TP rank after the first passes them on one by one).
  const int* k_segments = nullptr;
  int n_k_segments = 0;
  float* segment_scratch = nullptr;
  float* segments_apart = nullptr;
};
inline constexpr int kSegmentTileFloats = kTileRows * kTileStride;

// Batched rows make a tile's later row blocks pure compute: the first pass over a tile's weights waits on
// memory, the others find them in cache, and the memory bus idles. So the kernels walk k in chunks of
// kChunkLines 64-byte lines per panel (32 KiB; 128 KiB for 4 panels, well inside L2; the AVX-512 fp32 and
// VNNI int8 kernels take chunks of 8-16 KiB for 4 panels instead, which stay in L1 for the passes after
// the first: faster on Emerald Rapids, session 25) and, when a tile
// takes several passes, each pass prefetches its share of the next chunk's lines (pass `phase` of
// `passes` takes every passes-th line), so the next chunk streams in while this one computes. The partial
// sums carry over between chunks exactly, so the order of the additions does not change. A single pass
// (decode of a few rows) streams its own panels kAheadLines ahead of the line it reads: the hardware
// prefetcher alone kept 4 panels a thread at 22-28 GB/s of an Emerald Rapids VM's 31 (the out-of-order
// window holds only a dozen lines of a panel when each takes 10-40 instructions); with it 29-31 GB/s, and
// bf16 decode of the 110M and 1.1B shapes went from 0.75-0.85 to 0.80-0.94 of the roofline (BENCHMARKS.md,
// session 24). On session 22's Zen 5 the same prefetch for int8 was within the noise.
inline constexpr int kChunkLines = 512;
inline constexpr int kAheadLines = 32;  // 2 KiB a panel: 24-64 measured the same, 96 no better than none

struct PrefetchPlan {
  const char* next = nullptr;  // panel 0 of the next chunk (null: none); panel p at + p * panel_stride
  int lines = 0;               // lines per panel in the next chunk
  int phase = 0;
  int passes = 1;
  std::size_t next_stride = 0;  // bytes between the next chunk's panels where not the tile's (0: the tile's)
  // A single pass: panel 0 of this chunk, whose lines the pass prefetches kAheadLines ahead (null: none).
  const char* ahead = nullptr;
  // A single pass past line ahead_lines of ahead (the panel's last) goes on into ahead_then's lines (the
  // next tile's panel 0, Tile::prefetch), where non-null; null: on past the panel, into what follows it.
  int ahead_lines = 0;
  const char* ahead_then = nullptr;
};

// The single pass's prefetch for the line `line` of its chunk (PrefetchPlan::ahead) in each of n_panels.
// static: each ISA file compiles its own copy with its own flags (see the top of this file).
static inline void prefetch_ahead(const PrefetchPlan& plan, int line, int n_panels, std::size_t panel_stride) {
  if (plan.ahead == nullptr) return;
  const char* panel = plan.ahead;
  int ahead = line + kAheadLines;
  if (plan.ahead_then != nullptr && ahead >= plan.ahead_lines) {
    panel = plan.ahead_then;
    ahead -= plan.ahead_lines;
  }
  for (int p = 0; p < n_panels; ++p) {
    __builtin_prefetch(panel + p * panel_stride + static_cast<std::size_t>(ahead) * 64, 0, 3);
  }
}

// A tile's reduction segments in groups (Tile::k_segments), or one segment of every group without them: for
// the int8 kernels that take segments. In an anonymous namespace: each ISA file compiles its own copy with
// its own flags (see the top of this file).
namespace {
struct GroupSegments {
  const int* k_bounds = nullptr;  // Tile::k_segments
  int n = 1;
  int group = 0;
  int groups = 0;
  int bound(int s) const { return s == 0 ? 0 : s >= n ? groups : k_bounds[s] / group; }  // first group of s
  int segment_of(int g) const {
    int s = 0;
    while (bound(s + 1) <= g) ++s;
    return s;
  }
};
}  // namespace

using TileKernel = void (*)(const Tile&);

struct TileKernels {
  TileKernel f32 = nullptr;
  TileKernel bf16 = nullptr;
  TileKernel int8 = nullptr;
  TileKernel int8_segments = nullptr;  // int8 if it takes Tile::k_segments, else null
};

// Plain C++ compiled for the baseline target, and the same source compiled for AVX2 + FMA.
TileKernels portable_tile_kernels();
TileKernels avx2_tile_kernels();
// Hand-written AVX-512 fp32 and bf16 (widened to fp32 in registers) kernels.
TileKernel avx512_f32_tile_kernel();
TileKernel avx512_bf16_tile_kernel();
// Hand-written AVX512_VNNI (vpdpbusd) int8 kernel.
TileKernel avx512_vnni_int8_tile_kernel();
// Hand-written AVX512_BF16 (vdpbf16ps) bf16 kernel: x as the AMX kernel's two bf16 halves.
TileKernel avx512_bf16_dot_tile_kernel();

// AMX tile kernels for bf16 (x split into two bf16 halves) and int8 (bit-identical to the VNNI kernel).
TileKernel amx_bf16_tile_kernel();
TileKernel amx_int8_tile_kernel();

// Reads bytes [data, data + bytes) once and returns a value that depends on all of them (so the reads
// cannot be optimised away): the read-bandwidth probe's inner loop. data is 64-byte aligned.
using ReadKernel = std::uint64_t (*)(const std::byte* data, std::size_t bytes);
ReadKernel portable_read_kernel();
ReadKernel avx512_read_kernel();

}  // namespace shardline::kernels::cpu::tile
