#include <cmath>

#include <omp.h>

#include "kernels/cpu/ops.h"

namespace shardline::kernels::cpu {

namespace {

// q . k over head_size floats in 16 interleaved partial sums, added up in a fixed order at the end. One
// running sum is a chain of dependent multiply-adds the compiler may not reorder (no -ffast-math): it cost
// a third of a batch-16 decode step on the 110M shape. The order is fixed, so every layout and batch
// computes the same score.
inline float dot(const float* a, const float* b, int n) {
  constexpr int kLanes = 16;
  float partial[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) partial[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) partial[i % kLanes] += a[i] * b[i];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) partial[l] += partial[l + width];
  }
  return partial[0];
}

// Heads [h0, h1) of attention_paged. Position-major: each cached key and value row (every kv head's slice of
// one position, contiguous) is read once, front to back, for all the heads, so the cache streams from
// memory; head-major order read 256 bytes per position at a 3 KiB stride and waited on memory for each.
// Every score and every output element still accumulates over positions in increasing order, exactly as a
// head-by-head loop would.
void attention_heads(float* out, const float* q, const float* const* k_blocks, const float* const* v_blocks,
                     int block_tokens, float* scratch, int n_ctx, int h0, int h1, int group, int head_size,
                     int kv_stride, float inv_sqrt) {
  for (int b = 0, t0 = 0; t0 < n_ctx; ++b, t0 += block_tokens) {
    const int rows = n_ctx - t0 < block_tokens ? n_ctx - t0 : block_tokens;
    for (int r = 0; r < rows; ++r) {
      const float* k_row = k_blocks[b] + static_cast<std::size_t>(r) * kv_stride;
      for (int h = h0; h < h1; ++h) {
        scratch[static_cast<std::size_t>(h) * n_ctx + t0 + r] =
            dot(q + static_cast<std::size_t>(h) * head_size, k_row + (h / group) * head_size, head_size) * inv_sqrt;
      }
    }
  }
  for (int h = h0; h < h1; ++h) {
    softmax(scratch + static_cast<std::size_t>(h) * n_ctx, n_ctx);
    float* oh = out + static_cast<std::size_t>(h) * head_size;
    for (int i = 0; i < head_size; ++i) oh[i] = 0.0f;
  }
  for (int b = 0, t0 = 0; t0 < n_ctx; ++b, t0 += block_tokens) {
    const int rows = n_ctx - t0 < block_tokens ? n_ctx - t0 : block_tokens;
    for (int r = 0; r < rows; ++r) {
      const float* v_row = v_blocks[b] + static_cast<std::size_t>(r) * kv_stride;
      for (int h = h0; h < h1; ++h) {
        const float a = scratch[static_cast<std::size_t>(h) * n_ctx + t0 + r];
        const float* vt = v_row + (h / group) * head_size;
        float* oh = out + static_cast<std::size_t>(h) * head_size;
        for (int i = 0; i < head_size; ++i) oh[i] += a * vt[i];
      }
    }
  }
}

}  // namespace

void attention_paged(float* out, const float* q, const float* const* k_blocks, const float* const* v_blocks,
                     int block_tokens, float* scratch, int n_ctx, int n_heads, int n_kv_heads, int head_size,
                     int kv_stride) {
  const int group = n_heads / n_kv_heads;  // query heads sharing one kv head (GQA)
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(head_size));
  const int n_threads = num_threads();
  // Long contexts split the heads over the kernel threads in contiguous bands (short ones are not worth
  // waking them; a batch's rows already run on different threads).
#pragma omp parallel num_threads(n_threads) if (n_threads > 1 && n_heads > 1 && n_ctx > 64)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int h0 = n_heads * t / nt, h1 = n_heads * (t + 1) / nt;
    if (h0 < h1) {
      attention_heads(out, q, k_blocks, v_blocks, block_tokens, scratch, n_ctx, h0, h1, group, head_size, kv_stride,
                      inv_sqrt);
    }
  }
}

void attention(float* out, const float* q, const float* k_cache, const float* v_cache, float* scratch,
               int n_ctx, int n_heads, int n_kv_heads, int head_size, int kv_stride) {
  // A contiguous cache is one block holding every position.
  attention_paged(out, q, &k_cache, &v_cache, n_ctx > 0 ? n_ctx : 1, scratch, n_ctx, n_heads, n_kv_heads, head_size,
                  kv_stride);
}

}  // namespace shardline::kernels::cpu
