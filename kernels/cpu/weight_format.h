// Weight matrices in the kernels' packed layout, for three dtypes chosen at load time.
//
// A matrix W (d, k) (rows = output features, as llama2.c stores them; y = W x) is cut into panels of
// kPanelWidth = 16 consecutive output features. Inside a panel the 16 features are interleaved along k, so
// one 64-byte load holds the same k position(s) of all 16 features:
//   fp32: panel[k][16]                      one float per feature per k
//   bf16: panel[k/2][16][2]                 k pairs, the operand layout of AVX512_BF16's vdpbf16ps
//   int8: panel[k/32][8][16][4] (+ scales)  k quads, the operand layout of AVX512_VNNI's vpdpbusd;
//         one fp16 scale per feature per group of 32, 64, 96 or 128 k values (the matrix's int8_group,
//         after the quads of the panel); value = scale * q with q in [-127, 127], stored as q + 128
//         (unsigned, what vpdpbusd multiplies). With groups of 128 the kernels convert and scale a group's
//         exact integer dot a quarter as often as with Q8_0's 32, which is what batched int8 decode spends
//         its time on (BENCHMARKS.md, issue #7). The default is the widest of 128, 96, 64 and 32 that
//         divides k (128 for the common dims; 96 for the 15M shape's 288); for the matrices that tensor
//         parallelism slices along k (wo, w2) the runtime picks groups on which every layout's slices fall,
//         padding wo's kv heads to whole blocks where needed, so that a TP rank's groups are one rank's
//         groups (runtime::WoInput in runtime/shard_weights.h).
// A decode GEMV then streams each panel once, front to back, and a batch of n rows multiplies every
// loaded weight vector by n broadcast activations: no horizontal sums, no transposes.
// The bf16 and int8 panels are also AMX's B operand as they stand: 32 k of a bf16 panel are one 16-row tile
// of pairs (TDPBF16PS), 32 k of int8 quads an 8-row tile (TDPBSUD).
// k is padded with zeros to 32 (one AMX tile multiply's k for both), d to whole panels; the padding is
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
inline constexpr int kInt8Block = 32;    // int8 k is padded to this: 8 quads, the k of one AMX int8 tile multiply
inline constexpr int kInt8WideGroup = 128;  // k values per int8 scale where k is a multiple of it
inline constexpr int kInt8HeadGroup = 64;   // wo's for heads of 64 where TP head slices are no multiple of 128
inline constexpr int kBf16Block = 32;    // bf16 k is padded to this: the k of one AMX bf16 tile multiply
inline constexpr std::size_t kPackedAlignment = 64;

// "fp32", "bf16", "int8": what --weights-dtype takes.
const char* weight_dtype_name(WeightDtype dtype);
std::optional<WeightDtype> parse_weight_dtype(std::string_view name);

// k as stored: padded to kBf16Block (bf16) or kInt8Block (int8).
int padded_k(WeightDtype dtype, int k);
int panel_count(int d);
// The default k values per int8 scale for rows of k values: the widest of 128, 96, 64 and 32 that divides k
// (32 also where none does: k is padded to 32).
int default_int8_group(int k);
// Scale groups of an int8 row of k values in groups of `group` (32, 64, 96 or 128; 0: the default).
int int8_groups(int k, int group = 0);
// Bytes per weight of a whole model in dtype, for estimates (the planner, auto-planned runs): 4, 2, and for
// int8 about 1.03 (a fp16 scale per 128 weights, per 96, 64 or 32 where k or, for wo and w2, their TP
// slices need it; wo's zero padding where a kv head's query columns are no multiple of 32, runtime::WoInput,
// is left out: 2.8% of a layer's weights for heads of 48, more for toy heads of 8 or 16).
double typical_bytes_per_weight(WeightDtype dtype);
// Bytes of one panel, a multiple of kPackedAlignment (int8_group: as in int8_groups).
std::size_t panel_bytes(WeightDtype dtype, int k, int int8_group = 0);
// Bytes of a whole packed (d, k) matrix.
std::size_t packed_size_bytes(WeightDtype dtype, int d, int k, int int8_group = 0);

// A packed matrix as the kernels read it: a view, the caller owns the memory.
struct PackedMatrix {
  WeightDtype dtype = WeightDtype::kF32;
  int d = 0;  // output features
  int k = 0;  // input features (unpadded)
  const std::byte* data = nullptr;  // packed_size_bytes(dtype, d, k, int8_group), kPackedAlignment-aligned
  int int8_group = 0;               // int8: k values per scale, as packed (0: default_int8_group(k))

  std::size_t size_bytes() const { return packed_size_bytes(dtype, d, k, int8_group); }
  int int8_group_size() const { return int8_group > 0 ? int8_group : default_int8_group(k); }
};

// Packs W into dst (packed_size_bytes(dtype, d, k, int8_group) bytes, kPackedAlignment-aligned). W is read
// row by row with a row stride: w[i * w_row_stride + j] is W(i, j), so a column slice of a bigger matrix (wo
// and w2 under tensor parallelism) packs without an intermediate copy. int8_group: int8's k values per
// scale, 32, 64, 96 or 128 (0: default_int8_group(k)); the PackedMatrix must say the same. Uses the kernel threads.
void pack_weights(WeightDtype dtype, const float* w, std::size_t w_row_stride, int d, int k, std::byte* dst,
                  int int8_group = 0);

// The values the kernels multiply with, back as row-major fp32 (d, k): for tests and accuracy reports.
void unpack_weights(const PackedMatrix& w, float* out);

// Round-to-nearest-even conversions the packers and the portable kernels use (exposed for tests).
std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t value);
std::uint16_t float_to_fp16(float value);
float fp16_to_float(std::uint16_t value);

}  // namespace shardline::kernels::cpu
