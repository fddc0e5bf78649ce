// Private to kernels/cuda: block-wide reductions the row kernels share (one thread block per row).
#pragma once

#include <cub/block/block_reduce.cuh>

namespace shardline::kernels::cuda {

inline constexpr int kRowThreads = 256;  // threads of a block that owns one row

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return a > b ? a : b; }
};

// Reduces every thread's value; every thread gets the result. Must be called by the whole block.
template <typename T, typename Op>
__device__ T block_all_reduce(T value, Op op) {
  using Reduce = cub::BlockReduce<T, kRowThreads>;
  __shared__ typename Reduce::TempStorage storage;
  __shared__ T result;
  const T reduced = Reduce(storage).Reduce(value, op);
  if (threadIdx.x == 0) result = reduced;
  __syncthreads();
  const T out = result;
  __syncthreads();  // storage and result may be reused by the next call
  return out;
}

__device__ inline float block_sum(float value) { return block_all_reduce(value, SumOp()); }
__device__ inline double block_sum(double value) { return block_all_reduce(value, SumOp()); }
__device__ inline float block_max(float value) { return block_all_reduce(value, MaxOp()); }

}  // namespace shardline::kernels::cuda
