#include <cmath>

#include <omp.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/row_kernels.h"

namespace shardline::kernels::cpu {


void attention_paged(float* out, const float* q, const float* const* k_blocks, const float* const* v_blocks,
                     int block_tokens, float* scratch, int n_ctx, int n_heads, int n_kv_heads, int head_size,
                     int kv_stride) {
  const row::AttentionHeads args{out,    q,         k_blocks,  v_blocks, block_tokens,
                                 scratch, n_ctx, n_heads / n_kv_heads,  // query heads per kv head (GQA)
                                 head_size, kv_stride, 1.0f / std::sqrt(static_cast<float>(head_size))};
  const row::AttentionHeadsKernel attention_heads = row::active_row_kernels().attention_heads;
  const int n_threads = num_threads();
  // Long contexts split the heads over the kernel threads in contiguous bands (short ones are not worth
  // waking them; a batch's rows already run on different threads).
#pragma omp parallel num_threads(n_threads) if (n_threads > 1 && n_heads > 1 && n_ctx > 64)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int h0 = n_heads * t / nt, h1 = n_heads * (t + 1) / nt;
    if (h0 < h1) {
      attention_heads(args, h0, h1);
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
