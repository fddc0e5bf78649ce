// Row and elementwise kernels: the same arithmetic as kernels/cpu/elementwise.cpp, on the device.
// Not compiled with fast math: expf and sqrtf are CUDA's accurate versions (expf within 2 ulp, sqrtf and
// division correctly rounded), so results stay within a few ulp of the CPU's.
#include <cuda_bf16.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace shardline::kernels::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::size_t items) { return static_cast<unsigned>((items + kThreads - 1) / kThreads); }

// One block per row: sum of squares, then scale.
__global__ void rmsnorm_kernel(float* out, const float* x, const float* weight, int dim, float eps) {
  const std::size_t row = static_cast<std::size_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += x[row + j] * x[row + j];
  ss = block_sum(ss);
  float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if (isinf(ss)) {  // finite values whose squares overflow float: in double, as the CPU's overflowed_rms_scale
    double ssd = 0.0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ssd += static_cast<double>(x[row + j]) * x[row + j];
    ssd = block_sum(ssd);  // ss is the block's: every thread takes this branch
    scale = isfinite(ssd) ? static_cast<float>(1.0 / sqrt(ssd / dim + eps)) : 0.0f;
  }
  for (int j = threadIdx.x; j < dim; j += blockDim.x) out[row + j] = weight[j] * (scale * x[row + j]);
}

// One thread per adjacent pair (i, i+1) of one head of one token.
__global__ void rope_kernel(float* vec, const int* positions, int n_tokens, int n_heads, int head_size,
                            float theta_base, const float* freq_divisors) {
  const int half = head_size / 2;
  const std::size_t pair = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pair >= static_cast<std::size_t>(n_tokens) * n_heads * half) return;
  const int token = static_cast<int>(pair / (static_cast<std::size_t>(n_heads) * half));
  const int i = static_cast<int>(pair % half) * 2;
  float* v = vec + pair * 2;  // pairs are laid out consecutively: (token, head, pair)
  // The CPU rounds glibc's powf/cosf/sinf, which are correctly rounded in nearly all cases; CUDA's float
  // versions may be 2-4 ulp off, and an error in freq grows with the position (x 4096 at the end of a
  // long context). Computing in double and rounding once reproduces the CPU's floats in nearly all cases.
  const float exponent = static_cast<float>(i) / static_cast<float>(head_size);
  const float freq = 1.0f / static_cast<float>(pow(static_cast<double>(theta_base), static_cast<double>(exponent)));
  float angle = static_cast<float>(positions[token]) * freq;
  if (freq_divisors != nullptr) angle = __fdiv_rn(angle, freq_divisors[i / 2]);  // IEEE division, as the CPU's
  const float fcr = static_cast<float>(cos(static_cast<double>(angle)));
  const float fci = static_cast<float>(sin(static_cast<double>(angle)));
  const float v0 = v[0];
  const float v1 = v[1];
  // Explicit roundings: nvcc would otherwise fuse a multiply into the add (an FMA), which the CPU does not.
  v[0] = __fsub_rn(__fmul_rn(v0, fcr), __fmul_rn(v1, fci));
  v[1] = __fadd_rn(__fmul_rn(v0, fci), __fmul_rn(v1, fcr));
}

__global__ void swiglu_kernel(float* h1, const float* h3, std::size_t size) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size) return;
  const float v = h1[i];
  h1[i] = v * (1.0f / (1.0f + expf(-v))) * h3[i];
}

__global__ void add_kernel(float* y, const float* x, std::size_t size) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < size) y[i] += x[i];
}

__global__ void embedding_kernel(float* out, const float* table, const int* tokens, int dim) {
  const std::size_t src = static_cast<std::size_t>(tokens[blockIdx.y]) * dim;
  const std::size_t dst = static_cast<std::size_t>(blockIdx.y) * dim;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < dim; j += gridDim.x * blockDim.x) {
    out[dst + j] = table[src + j];
  }
}

__global__ void bf16_kernel(std::uint16_t* out, const float* in, std::size_t size) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < size) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}

}  // namespace

void rmsnorm(float* out, const float* x, const float* weight, int n, int dim, float eps, StreamRef stream) {
  if (n <= 0) return;
  rmsnorm_kernel<<<n, kRowThreads, 0, native(stream)>>>(out, x, weight, dim, eps);
}

void rope(float* vec, const int* positions, int n_tokens, int n_heads, int head_size, float theta_base,
          const float* freq_divisors, StreamRef stream) {
  const std::size_t pairs = static_cast<std::size_t>(n_tokens) * n_heads * (head_size / 2);
  if (pairs == 0) return;
  rope_kernel<<<blocks_for(pairs), kThreads, 0, native(stream)>>>(vec, positions, n_tokens, n_heads, head_size,
                                                                  theta_base, freq_divisors);
}

void swiglu(float* h1, const float* h3, std::size_t size, StreamRef stream) {
  if (size == 0) return;
  swiglu_kernel<<<blocks_for(size), kThreads, 0, native(stream)>>>(h1, h3, size);
}

void add_inplace(float* y, const float* x, std::size_t size, StreamRef stream) {
  if (size == 0) return;
  add_kernel<<<blocks_for(size), kThreads, 0, native(stream)>>>(y, x, size);
}

void embedding(float* out, const float* table, const int* tokens, int n_tokens, int dim, StreamRef stream) {
  if (n_tokens <= 0) return;
  SL_CHECK_MSG(n_tokens <= 65535, "embedding of {} tokens in one launch (grid.y limit)", n_tokens);
  const dim3 grid((dim + kThreads - 1) / kThreads, n_tokens);
  embedding_kernel<<<grid, kThreads, 0, native(stream)>>>(out, table, tokens, dim);
}

void convert_to_bf16(std::uint16_t* out, const float* in, std::size_t size, StreamRef stream) {
  if (size == 0) return;
  bf16_kernel<<<blocks_for(size), kThreads, 0, native(stream)>>>(out, in, size);
}

}  // namespace shardline::kernels::cuda
