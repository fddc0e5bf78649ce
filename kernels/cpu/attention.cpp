#include <cmath>

#include <omp.h>

#include "kernels/cpu/ops.h"

namespace shardline::kernels::cpu {

void attention_paged(float* out, const float* q, const float* const* k_blocks, const float* const* v_blocks,
                     int block_tokens, float* scratch, int n_ctx, int n_heads, int n_kv_heads, int head_size,
                     int kv_stride) {
  const int group = n_heads / n_kv_heads;  // query heads sharing one kv head (GQA)
  const float inv_sqrt = 1.0f / std::sqrt(static_cast<float>(head_size));
  const int n_threads = num_threads();
#pragma omp parallel for num_threads(n_threads) if (n_threads > 1 && n_heads > 1 && n_ctx > 64)
  for (int h = 0; h < n_heads; ++h) {
    const float* qh = q + static_cast<std::size_t>(h) * head_size;
    float* att = scratch + static_cast<std::size_t>(h) * n_ctx;
    const int kv_offset = (h / group) * head_size;
    // Positions in increasing order, block by block (no division per position).
    for (int b = 0, t0 = 0; t0 < n_ctx; ++b, t0 += block_tokens) {
      const float* kb = k_blocks[b] + kv_offset;
      const int rows = n_ctx - t0 < block_tokens ? n_ctx - t0 : block_tokens;
      for (int r = 0; r < rows; ++r) {
        const float* kt = kb + static_cast<std::size_t>(r) * kv_stride;
        float score = 0.0f;
        for (int i = 0; i < head_size; ++i) score += qh[i] * kt[i];
        att[t0 + r] = score * inv_sqrt;
      }
    }
    softmax(att, n_ctx);
    float* oh = out + static_cast<std::size_t>(h) * head_size;
    for (int i = 0; i < head_size; ++i) oh[i] = 0.0f;
    for (int b = 0, t0 = 0; t0 < n_ctx; ++b, t0 += block_tokens) {
      const float* vb = v_blocks[b] + kv_offset;
      const int rows = n_ctx - t0 < block_tokens ? n_ctx - t0 : block_tokens;
      for (int r = 0; r < rows; ++r) {
        const float* vt = vb + static_cast<std::size_t>(r) * kv_stride;
        const float a = att[t0 + r];
        for (int i = 0; i < head_size; ++i) oh[i] += a * vt[i];
      }
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
