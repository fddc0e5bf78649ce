// ggml's quantised block formats, as GGUF files hold them, widened to fp32 at load: Q8_0 (what llama.cpp's
// converter writes with --outtype q8_0), and what llama-quantize writes for its common presets: Q4_0, Q4_1,
// Q5_0, Q5_1, IQ4_NL (blocks of 32) and the k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS (super-blocks
// of 256; Q4_K_M, Q5_K_M and Q3_K_M files mix them, and fall back to Q5_0, Q5_1, Q8_0 or IQ4_NL for rows that
// are no multiple of 256). The IQ2/IQ3/IQ1 types (lattice codebooks) are not decoded.
//
// Each block decodes as ggml's reference dequantize_row_* does (ggml-common.h's structs, ggml-quants.c's
// arithmetic, in fp32 and in its order; this file is built without FMA contraction, so the values do not
// depend on the build's flags). Where a model is then kept (--weights-dtype fp32, bf16 or int8) is the
// packers' business, as for every other element type.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/checkpoint.h"

namespace shardline::runtime {

// n values (whole blocks of `element`, a block type) from src into dst.
void widen_blocks(const std::byte* src, TensorElement element, std::uint64_t n, float* dst);

}  // namespace shardline::runtime
