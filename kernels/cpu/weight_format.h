// Weight matrices in the kernels' packed layout, for three dtypes chosen at load time.
//
// A matrix W (d, k) (rows = output features, as llama2.c stores them; y = W x) is cut into panels of
// kPanelWidth = 16 consecutive output features. Inside a panel the 16 features are interleaved along k, so
// one 64-byte load holds the same k position(s) of all 16 features:
//   fp32: panel[k][16]                      one float per feature per k
//   bf16: panel[k/2][16][2]                 k pairs, the operand layout of AVX512_BF16's vdpbf16ps
//   int8: panel[k/32][8][16][4] (+ scales)  k quads, the operand layout of AVX512_VNNI's vpdpbusd;
//         Q8_0-like: one scale per 32 k values per feature (fp16, after the quads of the panel), value
//         = scale * q with q in [-127, 127], stored as q + 128 (unsigned, what vpdpbusd multiplies)
// A decode GEMV then streams each panel once, front to back, and a batch of n rows multiplies every
// loaded weight vector by n broadcast activations: no horizontal sums, no transposes.
// The bf16 and int8 panels are also AMX's B operand as they stand: 32 k of a bf16 panel are one 16-row tile
// of pairs (TDPBF16PS), a 32-group of int8 quads an 8-row tile (TDPBSUD).
// k is padded with zeros to 32 (bf16: one AMX tile's k; int8: the group), d to whole panels; the padding is
// never written to y.
// Panels are 64-byte aligned (their sizes are multiples of 64 bytes) when the buffer is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace shardline::kernels::cpu {

enum class WeightDtype : std::uint8_t { kF32, kBf16, kInt8 };

inline constexpr int kPanelWidth = 16;   // output features per panel
inline constexpr int kInt8Group = 32;    // k values per int8 scale
inline constexpr int kBf16Block = 32;    // bf16 k is padded to this: the k of one AMX bf16 tile multiply
inline constexpr std::size_t kPackedAlignment = 64;

// "fp32", "bf16", "int8": what --weights-dtype takes.
const char* weight_dtype_name(WeightDtype dtype);
std::optional<WeightDtype> parse_weight_dtype(std::string_view name);

// k as stored: padded to kBf16Block (bf16) or the 32-group (int8).
int padded_k(WeightDtype dtype, int k);
int panel_count(int d);
// Bytes of one panel, a multiple of kPackedAlignment.
std::size_t panel_bytes(WeightDtype dtype, int k);
// Bytes of a whole packed (d, k) matrix.
std::size_t packed_size_bytes(WeightDtype dtype, int d, int k);

// A packed matrix as the kernels read it: a view, the caller owns the memory.
struct PackedMatrix {
  WeightDtype dtype = WeightDtype::kF32;
  int d = 0;  // output features
  int k = 0;  // input features (unpadded)
  const std::byte* data = nullptr;  // packed_size_bytes(dtype, d, k), kPackedAlignment-aligned

  std::size_t size_bytes() const { return packed_size_bytes(dtype, d, k); }
};

// Packs W into dst (packed_size_bytes(dtype, d, k) bytes, kPackedAlignment-aligned). W is read row by row
// with a row stride: w[i * w_row_stride + j] is W(i, j), so a column slice of a bigger matrix (wo and w2
// under tensor parallelism) packs without an intermediate copy. Uses the kernel threads.
void pack_weights(WeightDtype dtype, const float* w, std::size_t w_row_stride, int d, int k, std::byte* dst);

// The values the kernels multiply with, back as row-major fp32 (d, k): for tests and accuracy reports.
void unpack_weights(const PackedMatrix& w, float* out);

// Round-to-nearest-even conversions the packers and the portable kernels use (exposed for tests).
std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t value);
std::uint16_t float_to_fp16(float value);
float fp16_to_float(std::uint16_t value);

}  // namespace shardline::kernels::cpu
