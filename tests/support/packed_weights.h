// Plain row-major weights through the CPU backend's own matmul (packed weights, kernels/cpu/packed_matmul.h),
// for tests and benchmarks that hold a (d, k) matrix and need what the runtime would compute from it: the
// CUDA tests' CPU side, the CPU baseline of the GPU benchmark, the packed kernel tests themselves.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kernels/cpu/packed_matmul.h"
#include "kernels/cpu/weight_format.h"

namespace shardline::test {

// An aligned packed copy of row-major w (d, k); matrix points into buffer. int8_group: int8's k values per
// scale (0: the default for k).
struct PackedWeights {
  std::unique_ptr<std::byte, decltype(&std::free)> buffer{nullptr, &std::free};
  kernels::cpu::PackedMatrix matrix;
};

inline PackedWeights pack_row_major(kernels::cpu::WeightDtype dtype, const float* w, int d, int k,
                                    int int8_group = 0) {
  PackedWeights p;
  const std::size_t bytes = kernels::cpu::packed_size_bytes(dtype, d, k, int8_group);
  p.buffer.reset(static_cast<std::byte*>(std::aligned_alloc(kernels::cpu::kPackedAlignment, bytes)));
  kernels::cpu::pack_weights(dtype, w, k, d, k, p.buffer.get(), int8_group);
  p.matrix = {dtype, d, k, p.buffer.get(), int8_group};
  return p;
}

// y (n, d) = x (n, k) · Wᵀ for row-major fp32 w (d, k), as the CPU backend computes it with fp32 weights.
// Packs w on every call: for checks, not for timing.
inline std::vector<float> cpu_fp32_matmul(const std::vector<float>& x, const std::vector<float>& w, int n, int k,
                                          int d) {
  const PackedWeights packed = pack_row_major(kernels::cpu::WeightDtype::kF32, w.data(), d, k);
  kernels::cpu::Activations activations;
  activations.reserve(n, k);
  activations.prepare(x.data(), n, k, kernels::cpu::WeightDtype::kF32);
  std::vector<float> y(static_cast<std::size_t>(n) * d);
  kernels::cpu::matmul(y.data(), activations, packed.matrix);
  return y;
}

}  // namespace shardline::test
