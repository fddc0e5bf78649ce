// Grouped-query attention over the paged KV cache (layout in ops.h), the CPU kernel's arithmetic per
// (query, head): scores q·k / sqrt(head_size), a stable softmax, then the weighted sum of values.
//
// One thread block per (query, head). Warps take positions round-robin for the scores (the lanes of a warp
// split the head's dot product, so a key row is read coalesced); the scores go to the caller's scratch in
// global memory, which bounds nothing by shared memory and lets any context length through. The value sum
// gives each thread one or more columns of the head and walks the positions, reading each value row
// coalesced across the block.
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace shardline::kernels::cuda {

namespace {

constexpr int kWarp = 32;

__device__ float warp_sum(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Start of position t's row of one layer's keys (kind 0) or values (kind 1), for one sequence.
__device__ const float* paged_row(const PagedAttention& a, const int* table, int kind, int t) {
  const int block = table[t / a.block_tokens];
  const std::size_t inside =
      (static_cast<std::size_t>(2 * a.layer + kind) * a.block_tokens + t % a.block_tokens) * a.kv_stride;
  return a.kv_pool + static_cast<std::size_t>(block) * a.block_floats + inside;
}

__global__ void attention_paged_kernel(PagedAttention a) {
  extern __shared__ float q_shared[];  // (head_size)
  const int h = blockIdx.x;
  const int query = blockIdx.y;
  const int n_ctx = a.query_n_ctx[query];
  const int* table = a.block_tables + static_cast<std::size_t>(a.query_table[query]) * a.max_blocks_per_table;
  const int kv_offset = (h / (a.n_heads / a.n_kv_heads)) * a.head_size;
  const std::size_t head = (static_cast<std::size_t>(query) * a.n_heads + h) * a.head_size;
  float* att = a.scratch + (static_cast<std::size_t>(query) * a.n_heads + h) * a.max_ctx;
  const float inv_sqrt = 1.0f / sqrtf(static_cast<float>(a.head_size));

  for (int i = threadIdx.x; i < a.head_size; i += blockDim.x) q_shared[i] = a.q[head + i];
  __syncthreads();

  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int n_warps = blockDim.x / kWarp;
  for (int t = warp; t < n_ctx; t += n_warps) {
    const float* k = paged_row(a, table, 0, t) + kv_offset;
    float partial = 0.0f;
    for (int i = lane; i < a.head_size; i += kWarp) partial += q_shared[i] * k[i];
    const float score = warp_sum(partial);
    if (lane == 0) att[t] = score * inv_sqrt;
  }
  __syncthreads();  // scores written by every warp, visible to the whole block

  float local_max = -INFINITY;
  for (int t = threadIdx.x; t < n_ctx; t += blockDim.x) local_max = fmaxf(local_max, att[t]);
  const float max_score = block_max(local_max);
  float local_sum = 0.0f;
  for (int t = threadIdx.x; t < n_ctx; t += blockDim.x) {
    const float e = expf(att[t] - max_score);
    att[t] = e;
    local_sum += e;
  }
  const float inv_sum = 1.0f / block_sum(local_sum);  // block_sum synchronises: every att[t] is written

  for (int i = threadIdx.x; i < a.head_size; i += blockDim.x) {
    float acc = 0.0f;
    for (int t = 0; t < n_ctx; ++t) acc += (att[t] * inv_sum) * paged_row(a, table, 1, t)[kv_offset + i];
    a.out[head + i] = acc;
  }
}

// One thread block per query row, threads across the row's columns (keys then values, both coalesced).
__global__ void kv_write_paged_kernel(PagedKvWrite a) {
  const int query = blockIdx.x;
  const int pos = a.positions[query];
  const int* table = a.block_tables + static_cast<std::size_t>(a.query_table[query]) * a.max_blocks_per_table;
  const std::size_t block = static_cast<std::size_t>(table[pos / a.block_tokens]);
  const std::size_t half = static_cast<std::size_t>(a.block_tokens) * a.kv_stride;
  float* keys = a.kv_pool + block * a.block_floats + (2 * a.layer) * half +
                static_cast<std::size_t>(pos % a.block_tokens) * a.kv_stride;
  float* values = keys + half;
  const std::size_t row = static_cast<std::size_t>(query) * a.kv_stride;
  for (int i = threadIdx.x; i < a.kv_stride; i += blockDim.x) {
    keys[i] = a.k[row + i];
    values[i] = a.v[row + i];
  }
}

}  // namespace

void kv_write_paged(const PagedKvWrite& args, StreamRef stream) {
  if (args.n_queries <= 0 || args.kv_stride <= 0) return;
  kv_write_paged_kernel<<<args.n_queries, kRowThreads, 0, native(stream)>>>(args);
}

void attention_paged(const PagedAttention& args, StreamRef stream) {
  if (args.n_queries <= 0) return;
  SL_CHECK_MSG(args.n_heads % args.n_kv_heads == 0, "{} heads over {} kv heads", args.n_heads, args.n_kv_heads);
  SL_CHECK_MSG(args.head_size > 0 && args.head_size <= 1024, "head size {}", args.head_size);
  SL_CHECK_MSG(args.n_queries <= 65535, "{} queries in one launch (grid.y limit)", args.n_queries);
  const dim3 grid(args.n_heads, args.n_queries);
  const std::size_t shared_bytes = static_cast<std::size_t>(args.head_size) * sizeof(float);
  attention_paged_kernel<<<grid, kRowThreads, shared_bytes, native(stream)>>>(args);
}

}  // namespace shardline::kernels::cuda
