// The generic row kernels (row_kernels_generic.inl) compiled for AVX2 (-mavx2, -mf16c, no FMA, no
// contraction; kernels/CMakeLists.txt): 256-bit vectors for softmax, SwiGLU, attention and the int8
// quantisation on CPUs without AVX-512, where the baseline build ran them 128 bits wide. The same source
// (with the attention's 16 lanes held in two registers by intrinsics, SHARDLINE_ROW_KERNELS_AVX2) and the
// same operations in the same order as the portable build: the same bits (row_kernels.h).
#include <immintrin.h>

#include "kernels/cpu/row_kernels.h"

namespace shardline::kernels::cpu::row {

namespace {
#define SHARDLINE_ROW_KERNELS_AVX2 1  // the attention's lanes in registers, an fp16 cache read with VCVTPH2PS
#include "kernels/cpu/row_kernels_generic.inl"
}  // namespace

RowKernels avx2_row_kernels() { return row_kernels(); }

}  // namespace shardline::kernels::cpu::row
