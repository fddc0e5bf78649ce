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

namespace {
// to_half_row() and from_half_row() 8 values an instruction through F16C (VCVTPS2PH with round to nearest
// even, VCVTPH2PS), which the generic code computes bit for bit (NaNs included: kv_row_test's sweeps); the
// tail takes the generic conversions. The generic loops took some eight integer instructions a vector, 1% of
// a 110M int8 batch-16 decode once fp16 became AVX2's default cache (session 34).
void to_half_row_avx2(const float* x, int n, std::uint16_t* h) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), half);
  }
  for (; i < n; ++i) h[i] = to_half(x[i]);
}

void from_half_row_avx2(const std::uint16_t* h, int n, float* x) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  }
  for (; i < n; ++i) x[i] = from_half(h[i]);
}
}  // namespace

RowKernels avx2_row_kernels() {
  RowKernels kernels = row_kernels();
  kernels.to_half = to_half_row_avx2;
  kernels.from_half = from_half_row_avx2;
  kernels.attention_rows = attention_rows;
  return kernels;
}

}  // namespace shardline::kernels::cpu::row
