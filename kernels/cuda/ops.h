// CUDA kernels: the same ops as kernels/cpu/ops.h, on device buffers, one signature per op. Needs no CUDA
// headers, so runtime/ includes it in every build (without CUDA every entry throws ResourceError "built
// without CUDA"; device buffers cannot exist there in the first place).
//
// Every pointer is device memory unless its comment says "host". Every kernel is stream-ordered: it is
// queued on `stream` and returns at once, never allocates and never synchronises, so a whole decode step
// can be captured in a CUDA graph. Kernels never throw: errors surface at the next Stream::synchronize().
// Batched where the CPU kernel is per token: a decode step of a micro-batch is one launch per op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/cuda/device.h"

namespace shardline::kernels::cuda {

// RMSNorm of n rows, as the CPU kernel: out[r] = weight * (x[r] / sqrt(mean(x[r]²) + eps)). out may alias x.
//   out, x: (n, dim)   weight: (dim)
void rmsnorm(float* out, const float* x, const float* weight, int n, int dim, float eps, StreamRef stream);

// Rotary embedding on adjacent pairs within each head (llama2.c's and the CPU kernel's arithmetic:
// freq = 1 / theta_base^(i / head_size) for pair (i, i+1), angle = pos * freq), token t at positions[t].
// Positions live on the device so a captured decode graph replays at any position. freq_divisors: null, or
// (head_size / 2) on the device: pair i's angle is divided by freq_divisors[i] (Llama 3.1's RoPE scaling, as
// kernels::cpu::rope_angles applies it).
//   vec: (n_tokens, n_heads, head_size)   positions: (n_tokens)
void rope(float* vec, const int* positions, int n_tokens, int n_heads, int head_size, float theta_base,
          const float* freq_divisors, StreamRef stream);

// h1 = silu(h1) * h3, elementwise.   h1, h3: (size)
void swiglu(float* h1, const float* h3, std::size_t size, StreamRef stream);

// y += x, elementwise (the residual connection).   y, x: (size)
void add_inplace(float* y, const float* x, std::size_t size, StreamRef stream);

// out[t] = table[tokens[t]]: the first stage's input.   out: (n_tokens, dim)   table: (vocab, dim)
// tokens: (n_tokens)
void embedding(float* out, const float* table, const int* tokens, int n_tokens, int dim, StreamRef stream);

// Rounds to bf16, to nearest even (what the CPU packer's float_to_bf16 does). out holds bf16 bit patterns.
//   out: (size) uint16   in: (size)
void convert_to_bf16(std::uint16_t* out, const float* in, std::size_t size, StreamRef stream);

// Causal grouped-query attention of n_queries query tokens over a PAGED KV cache.
//
// The cache is a pool of fixed-size blocks, the layout of runtime/kv_cache.h + memory/kv_block_pool.h: one
// block holds block_tokens positions of one sequence for every layer of the rank's stage,
//   block: (n_layers, 2, block_tokens, kv_stride)   keys of layer l at (2l) * block_tokens * kv_stride,
//                                                    values at (2l + 1) * block_tokens * kv_stride,
// and position p of a sequence is row p % block_tokens of block block_table[p / block_tokens]. Query q
// reads block table query_table[q] and attends to positions [0, query_n_ctx[q]) (so a prefill chunk's
// queries each see their own causal prefix, and a decode micro-batch mixes sequences of any length).
// Head h reads kv head h / (n_heads / n_kv_heads) at column offset (kv head) * head_size, as the CPU kernel.
struct PagedAttention {
  float* out = nullptr;               // (n_queries, n_heads, head_size)
  const float* q = nullptr;           // (n_queries, n_heads, head_size)
  const float* kv_pool = nullptr;     // (n_blocks, block_floats)
  std::size_t block_floats = 0;       // floats in one block: n_layers * 2 * block_tokens * kv_stride
  int layer = 0;                      // which layer's keys and values inside a block
  int block_tokens = 16;
  const int* block_tables = nullptr;  // (n_tables, max_blocks_per_table) pool block ids
  int max_blocks_per_table = 0;
  const int* query_table = nullptr;   // (n_queries) row of block_tables each query reads
  const int* query_n_ctx = nullptr;   // (n_queries) positions each query attends to, >= 1
  int n_queries = 1;
  int n_heads = 1;
  int n_kv_heads = 1;
  int head_size = 0;                  // even, <= 1024
  int kv_stride = 0;                  // floats in one cached row: n_kv_heads * head_size
  int max_ctx = 0;                    // >= every query_n_ctx; sizes scratch
  float* scratch = nullptr;           // (n_queries, n_heads, max_ctx) attention scores
};
void attention_paged(const PagedAttention& args, StreamRef stream);

// Writes each query row's key and value into its block of the paged cache (the layout above), at its own
// position: row p % block_tokens of block block_tables[query_table[q]][p / block_tokens], layer `layer`.
// Positions and tables are read on the device, so a captured decode step writes wherever the replay's
// positions say (a host-computed address would be frozen into the graph).
//   k, v: (n_queries, kv_stride)   positions: (n_queries)
struct PagedKvWrite {
  float* kv_pool = nullptr;           // (n_blocks, block_floats)
  std::size_t block_floats = 0;
  int layer = 0;
  int block_tokens = 16;
  const int* block_tables = nullptr;  // (n_tables, max_blocks_per_table)
  int max_blocks_per_table = 0;
  const int* query_table = nullptr;   // (n_queries)
  const int* positions = nullptr;     // (n_queries)
  const float* k = nullptr;
  const float* v = nullptr;
  int n_queries = 1;
  int kv_stride = 0;
};
void kv_write_paged(const PagedKvWrite& args, StreamRef stream);

// Index of the largest value of each row (first on ties, as the CPU argmax).   out: (n_rows)
// x: (n_rows, size)
void argmax(int* out, const float* x, int n_rows, int size, StreamRef stream);

// ---------------------------------------------------------------------------------------------------------
// Matmul through cuBLAS.

enum class DeviceDtype : std::uint8_t { kF32, kBf16 };

// A weight matrix on the device, row-major (d, k), rows = output features (as llama2.c stores them).
struct DeviceMatrixView {
  DeviceDtype dtype = DeviceDtype::kF32;
  int d = 0;
  int k = 0;
  const void* data = nullptr;  // (d, k) floats or bf16 bit patterns
};

// An uploaded weight matrix. Uploaded once, at load time, from the rank's own slice in host memory: the
// mapped file (F32), or the fp32 its F16, BF16 or quantised tensor decodes to.
class DeviceMatrix {
 public:
  DeviceMatrix() = default;
  // Reads W (d, k) from host memory with a row stride: host_w[i * row_stride + j] = W(i, j), so the column
  // slices of wo and w2 under tensor parallelism upload straight from whole rows. bf16 is
  // rounded on the device (to nearest even), through a bounded staging buffer.
  static DeviceMatrix upload(const float* host_w, std::size_t row_stride, int d, int k, DeviceDtype dtype);

  DeviceMatrixView view() const { return {dtype_, d_, k_, buffer_.data()}; }
  std::size_t bytes() const { return buffer_.bytes(); }

 private:
  DeviceBuffer buffer_;
  DeviceDtype dtype_ = DeviceDtype::kF32;
  int d_ = 0;
  int k_ = 0;
};

struct BlasOptions {
  int max_rows = 1;  // most rows of x in one matmul (decode: the micro-batch; prefill: the chunk)
  int max_k = 0;     // widest input of any bf16 matrix (sizes the bf16 copy of x)
};

// A cuBLAS handle with its own workspace (so capturing it in a CUDA graph allocates nothing).
class Blas {
 public:
  explicit Blas(const BlasOptions& options);
  Blas(Blas&&) noexcept;
  Blas& operator=(Blas&&) noexcept;
  ~Blas();

  // y = x · Wᵀ for n rows of x, as kernels::cpu::matmul.   y: (n, d)   x: (n, k)
  // fp32 weights: fp32 products and sums (never TF32). bf16 weights: x is rounded to bf16 first, as the
  // CPU bf16 kernels do, and products accumulate in fp32. A cuBLAS failure throws ResourceError.
  void matmul(float* y, const float* x, const DeviceMatrixView& w, int n, StreamRef stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------------------
// Sampling on the device, llama2.c's sampler (runtime/sampler.cpp): temperature 0 is argmax; otherwise
// softmax(logits / T), then top-p when 0 < top_p < 1 (candidates sorted by probability, ties by token id)
// or the whole distribution. The random numbers come from the caller (coins), drawn with the runtime's
// seeded RNG exactly as the CPU sampler draws them, so a seed means the same thing on both backends.
// Sums are parallel, so a coin within rounding of a cumulative boundary may pick the neighbouring token.

struct TokenSamplerOptions {
  int max_rows = 1;    // sequences sampled in one call
  int vocab_size = 0;
};

class TokenSampler {
 public:
  explicit TokenSampler(const TokenSamplerOptions& options);  // allocates all its scratch once
  TokenSampler(TokenSampler&&) noexcept;
  TokenSampler& operator=(TokenSampler&&) noexcept;
  ~TokenSampler();

  // tokens: (n_rows)   logits: (n_rows, vocab_size), scaled and normalised in place when temperature > 0
  // coins: (n_rows) uniform in [0, 1); may be null when temperature == 0
  void sample(int* tokens, float* logits, const float* coins, int n_rows, float temperature, float top_p,
              StreamRef stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardline::kernels::cuda
