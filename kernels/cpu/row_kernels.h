// Internal to kernels/cpu: per-row loops that run on every matmul's input and every token's attention:
// int8 quantisation of activations, the bf16 split for the bf16-dot kernels, attention over the cached rows
// and the rotary embedding of q and k. Like the tile kernels (tile_kernels.h), one source
// (row_kernels_generic.inl) is compiled for the baseline target, for AVX2 and for AVX-512, and the level is
// chosen at run time. Where the compiler's vectorisation fell short (attention, RoPE, softmax, SwiGLU, the
// int8 quantisation), the AVX-512 build replaces a kernel with intrinsics that perform the generic code's
// operations in the generic code's order.
//
// Every build gives bit-identical results (tests: every ISA against the portable build): all are compiled
// with -ffp-contract=off (a multiply and an add are never fused into an FMA), and every loop keeps its
// order of additions (the attention dot product spells out its 16 partial sums).
//
// The ISA files include nothing but this header: an inline function from a shared header compiled there
// with AVX-512 could be the copy the linker keeps for everyone, and crash older CPUs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardline::kernels::cpu::row {

// One row of x (k values) as int8 in groups of `group` (32, 64, 96 or 128, dividing kp = k padded to 32): per group,
// scale = max|x| / 127 and q = round(x / scale), with the sum of q (the int8 kernels undo their +128 weight
// offset with it); q is zero past k.
using QuantizeInt8Row = void (*)(const float* x, int k, int kp, int group, std::int8_t* q, float* scales,
                                 std::int32_t* sums);

// One row of x (k values) as two bf16 halves, hi = bf16(x) and lo = bf16(x - hi), zero from k to kp.
using SplitBf16Row = void (*)(const float* x, int k, int kp, std::uint16_t* hi, std::uint16_t* lo);

// n floats as IEEE binary16 bits, rounded to nearest even, as F16C's VCVTPS2PH does (NaN stays NaN, quiet,
// with the top of its payload): the rows of an fp16 KV cache.
using ToHalfRow = void (*)(const float* x, int n, std::uint16_t* h);
// n binary16 values as floats (exact), as VCVTPH2PS does: how the attention kernels read an fp16 cache.
using FromHalfRow = void (*)(const std::uint16_t* h, int n, float* x);

// n floats (n / head_size heads) as one int8 cache row: per head, scale = max|x| / 127 and code =
// round(x * (127 / max|x|)) (to nearest even, clamped to +-127; quantize_int8_row's arithmetic), the n codes
// first, then the n / head_size scales as floats, unaligned (kv_row_bytes in ops.h).
using ToInt8KvRow = void (*)(const float* x, int n, int head_size, void* row);
// An int8 cache row back as floats: code * its head's scale.
using FromInt8KvRow = void (*)(const void* row, int n, int head_size, float* x);

// What a cache row holds (ops.h KvDtype).
enum class CachedAs { kF32, kF16, kInt8 };

// Attention of one query token for heads [h0, h1) over n_ctx positions of a paged cache (the arguments of
// attention_paged in ops.h, plus group = query heads per kv head and inv_sqrt = 1 / sqrt(head_size)).
// The blocks hold rows of floats, binary16 bits (std::uint16_t) or int8 codes with their heads' scales
// (ToInt8KvRow), as `cached` says; kv_stride counts the values of a row.
struct AttentionHeads {
  float* out;
  const float* q;
  const void* const* k_blocks;
  const void* const* v_blocks;
  CachedAs cached;
  int block_tokens;
  float* scratch;
  int n_ctx;
  int group;
  int head_size;
  int kv_stride;
  float inv_sqrt;
};
using AttentionHeadsKernel = void (*)(const AttentionHeads& a, int h0, int h1);

// Query rows an AttentionRows kernel takes at most (ops.h kAttentionRowsAtOnce).
inline constexpr int kMaxAttentionRows = 16;

// Query rows of one sequence at consecutive positions that attend together (a prefill chunk's rows): row r
// is `first` with out + r out_stride, q + r q_stride, scratch + r scratch_stride and n_ctx + r positions,
// rows <= kMaxAttentionRows. What attention_heads() gives each row, bit for bit; a kernel that reads
// each key and value once for all the rows instead of once per row. Null in the RowKernels of builds that
// have none (attention_rows_paged() then runs attention_heads() row by row).
struct AttentionRows {
  AttentionHeads first;
  int rows;
  std::size_t out_stride, q_stride, scratch_stride;
};
using AttentionRowsKernel = void (*)(const AttentionRows& a, int h0, int h1);

// Rotary embedding of pairs [i0, i1) (float indices, even) of every head of vec (n_heads, head_size), by
// cos_sin[i - i0] and cos_sin[i - i0 + 1] (the layout of ops.h rope_angles), as llama2.c computes it.
using RopeRotate = void (*)(float* vec, int n_heads, int head_size, const float* cos_sin, int i0, int i1);

// In-place softmax of n values (ops.h softmax), with the row kernels' own exp (row_kernels_generic.inl).
using Softmax = void (*)(float* x, int n);
// The SwiGLU gate, h = silu(h) * u over n values (ops.h swiglu), with the same exp.
using SiluMul = void (*)(float* h, const float* u, int n);
// y += x over n values (ops.h add_inplace's additions; matmul_segments' folds, a tile at a time).
using AddRow = void (*)(float* y, const float* x, int n);
// Index of the largest of n values, the first of equal maxima, NaNs skipped but for a NaN first value,
// which nothing replaces (ops.h argmax, llama2.c's scan).
using Argmax = int (*)(const float* x, int n);

// The largest of a row's values seen so far and its index: the first of equal maxima, NaNs skipped (index -1
// and a NaN value while nothing else came); and whether any value seen was a NaN (greedy decoding's only sign
// of a NaN classifier row that argmax skipped).
struct RowMax {
  float value;
  int index;
  bool nan = false;
};
// Folds n values into max: x[i] has index first + i, after every index max saw. What argmax() returns
// when the row's first value is no NaN; a fold over a row's pieces in order gives what one over the row does.
// Sets max.nan when one of the values is a NaN.
using FoldMax = void (*)(const float* x, int n, int first, RowMax& max);
// The maximum over two disjoint sets of a row's indices, from each set's RowMax, whatever order the sets
// come in: the larger value, of equal ones the lower index, so merging the pieces of a row in any order
// gives what folding them in order does (matmul_argmax merges the tiles each thread took, stolen ones
// included). A NaN value with an index is argmax()'s NaN first value (fold_max skips every other NaN):
// nothing beats it. Plain code, defined in packed_matmul.cpp.
RowMax merge_row_max(const RowMax& a, const RowMax& b);

struct RowKernels {
  QuantizeInt8Row quantize_int8 = nullptr;
  SplitBf16Row split_bf16 = nullptr;
  AttentionHeadsKernel attention_heads = nullptr;
  RopeRotate rope_rotate = nullptr;
  ToHalfRow to_half = nullptr;
  FromHalfRow from_half = nullptr;
  ToInt8KvRow to_int8_kv = nullptr;
  FromInt8KvRow from_int8_kv = nullptr;
  Softmax softmax = nullptr;
  SiluMul silu_mul = nullptr;
  AddRow add = nullptr;
  Argmax argmax = nullptr;
  FoldMax fold_max = nullptr;
  AttentionRowsKernel attention_rows = nullptr;
};

RowKernels portable_row_kernels();
RowKernels avx2_row_kernels();  // the generic source compiled for AVX2: the portable kernels' bits
RowKernels avx512_row_kernels();

// The kernels of the active ISA level (isa.h: AVX-512 from kAvx512 up, the AVX2 build of the generic source
// from kAvx2, else the baseline build).
const RowKernels& active_row_kernels();

}  // namespace shardline::kernels::cpu::row
