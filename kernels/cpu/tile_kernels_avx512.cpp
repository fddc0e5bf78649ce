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

constexpr int kMaxRows = 6;

template <int R, int P>
void f32_block(const Tile& t, const float* x, float* out) {
  const float* w = reinterpret_cast<const float*>(t.panels);
  const std::size_t stride = t.panel_stride / sizeof(float);
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int kk = 0; kk < t.k; ++kk) {
    __m512 wv[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) wv[p] = _mm512_load_ps(w + p * stride + static_cast<std::size_t>(kk) * 16);
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

using BlockFn = void (*)(const Tile&, const float*, float*);

template <int R, int P>
void bf16_block(const Tile& t, const float* x, float* out) {
  const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(t.panels);  // (k / 2, 16) pairs
  const std::size_t stride = t.panel_stride / sizeof(std::uint32_t);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  // Whole pairs; an odd k leaves one even half (its odd partner is zero padding and has no activation).
  for (int kk = 0; kk < t.k; kk += 2) {
    __m512i wv[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) wv[p] = _mm512_load_si512(w + p * stride + static_cast<std::size_t>(kk / 2) * 16);
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

// The block function for `rows` rows (1 .. max) and `n_panels` panels (1 .. 4).
template <int R>
BlockFn bf16_block_for_panels(int n_panels) {
  switch (n_panels) {
    case 1: return bf16_block<R, 1>;
    case 2: return bf16_block<R, 2>;
    case 3: return bf16_block<R, 3>;
    default: return bf16_block<R, 4>;
  }
}

BlockFn bf16_block_for(int rows, int n_panels) {
  switch (rows) {
    case 1: return bf16_block_for_panels<1>(n_panels);
    case 2: return bf16_block_for_panels<2>(n_panels);
    case 3: return bf16_block_for_panels<3>(n_panels);
    case 4: return bf16_block_for_panels<4>(n_panels);
    default: return bf16_block_for_panels<5>(n_panels);
  }
}

// Two weight vectors per pair are live at once, so one row fewer than fp32 fits the registers.
constexpr int kBf16MaxRows = 5;

void bf16_tile(const Tile& t) {
  const float* x = static_cast<const float*>(t.x);
  for (int r = 0; r < t.n_rows; r += kBf16MaxRows) {
    const int rows = t.n_rows - r < kBf16MaxRows ? t.n_rows - r : kBf16MaxRows;
    bf16_block_for(rows, t.n_panels)(t, x + static_cast<std::size_t>(r) * t.x_stride, t.out + r * kTileStride);
  }
}

template <int R>
BlockFn block_for_panels(int n_panels) {
  switch (n_panels) {
    case 1: return f32_block<R, 1>;
    case 2: return f32_block<R, 2>;
    case 3: return f32_block<R, 3>;
    default: return f32_block<R, 4>;
  }
}

BlockFn block_for(int rows, int n_panels) {
  switch (rows) {
    case 1: return block_for_panels<1>(n_panels);
    case 2: return block_for_panels<2>(n_panels);
    case 3: return block_for_panels<3>(n_panels);
    case 4: return block_for_panels<4>(n_panels);
    case 5: return block_for_panels<5>(n_panels);
    default: return block_for_panels<6>(n_panels);
  }
}

void f32_tile(const Tile& t) {
  const float* x = static_cast<const float*>(t.x);
  for (int r = 0; r < t.n_rows; r += kMaxRows) {
    const int rows = t.n_rows - r < kMaxRows ? t.n_rows - r : kMaxRows;
    block_for(rows, t.n_panels)(t, x + static_cast<std::size_t>(r) * t.x_stride, t.out + r * kTileStride);
  }
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
