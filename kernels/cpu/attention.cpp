#include <cmath>
#include <cstdint>
#include <cstring>

#include <omp.h>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/row_kernels.h"

namespace shardline::kernels::cpu {

const char* kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF16: return "fp16";
    case KvDtype::kInt8: return "int8";
    default: return "fp32";
  }
}

std::optional<KvDtype> parse_kv_dtype(std::string_view name) {
  if (name == "fp32") return KvDtype::kF32;
  if (name == "fp16") return KvDtype::kF16;
  if (name == "int8") return KvDtype::kInt8;
  return std::nullopt;
}

std::size_t kv_row_bytes(KvDtype dtype, int n, int head_size) {
  const auto values = static_cast<std::size_t>(n);
  switch (dtype) {
    case KvDtype::kF16: return 2 * values;
    case KvDtype::kInt8: return values + sizeof(float) * static_cast<std::size_t>(n / head_size);
    default: return 4 * values;
  }
}

double kv_bytes_per_value(KvDtype dtype, int head_size) {
  return static_cast<double>(kv_row_bytes(dtype, head_size, head_size)) / head_size;
}

void store_kv_row(void* dst, const float* x, int n, int head_size, KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF16: row::active_row_kernels().to_half(x, n, static_cast<std::uint16_t*>(dst)); break;
    case KvDtype::kInt8: row::active_row_kernels().to_int8_kv(x, n, head_size, dst); break;
    default: std::memcpy(dst, x, sizeof(float) * static_cast<std::size_t>(n)); break;
  }
}

void load_kv_row(float* x, const void* src, int n, int head_size, KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF16: row::active_row_kernels().from_half(static_cast<const std::uint16_t*>(src), n, x); break;
    case KvDtype::kInt8: row::active_row_kernels().from_int8_kv(src, n, head_size, x); break;
    default: std::memcpy(x, src, sizeof(float) * static_cast<std::size_t>(n)); break;
  }
}

namespace {
// The row kernels' arguments for one query row.
row::AttentionHeads heads_of_row(float* out, const float* q, const void* const* k_blocks, const void* const* v_blocks,
                                 KvDtype dtype, int block_tokens, float* scratch, int n_ctx, int n_heads,
                                 int n_kv_heads, int head_size, int kv_stride) {
  return {out,
          q,
          k_blocks,
          v_blocks,
          dtype == KvDtype::kF16    ? row::CachedAs::kF16
          : dtype == KvDtype::kInt8 ? row::CachedAs::kInt8
                                    : row::CachedAs::kF32,
          block_tokens,
          scratch,
          n_ctx,
          n_heads / n_kv_heads,  // query heads per kv head (GQA)
          head_size,
          kv_stride,
          1.0f / std::sqrt(static_cast<float>(head_size))};
}
}  // namespace

void attention_paged(float* out, const float* q, const void* const* k_blocks, const void* const* v_blocks,
                     KvDtype dtype, int block_tokens, float* scratch, int n_ctx, int n_heads, int n_kv_heads,
                     int head_size, int kv_stride, Team team) {
  const Band heads = team.share(n_heads);
  if (heads.begin == heads.end) return;
  row::active_row_kernels().attention_heads(heads_of_row(out, q, k_blocks, v_blocks, dtype, block_tokens, scratch,
                                                         n_ctx, n_heads, n_kv_heads, head_size, kv_stride),
                                            heads.begin, heads.end);
}

static_assert(kAttentionRowsAtOnce == row::kMaxAttentionRows);

int attention_rows_at_once() {
  return row::active_row_kernels().attention_rows != nullptr ? kAttentionRowsAtOnce : 1;
}

void attention_rows_paged(float* out, std::size_t out_stride, const float* q, std::size_t q_stride,
                          const void* const* k_blocks, const void* const* v_blocks, KvDtype dtype, int block_tokens,
                          float* scratch, std::size_t scratch_stride, int n_ctx, int rows, int n_heads,
                          int n_kv_heads, int head_size, int kv_stride, Team team) {
  SL_CHECK_MSG(rows >= 1 && rows <= kAttentionRowsAtOnce, "attention of {} rows at once (1 to {})", rows,
               kAttentionRowsAtOnce);
  const std::size_t q_floats = static_cast<std::size_t>(n_heads) * head_size;
  SL_CHECK_MSG(out_stride >= q_floats && q_stride >= q_floats &&
                   scratch_stride >= static_cast<std::size_t>(n_heads) * (n_ctx + rows - 1),
               "attention rows overlap: strides out {} q {} scratch {} for {} heads of {} and {} positions",
               out_stride, q_stride, scratch_stride, n_heads, head_size, n_ctx + rows - 1);
  const Band heads = team.share(n_heads);
  if (heads.begin == heads.end) return;
  const row::RowKernels& kernels = row::active_row_kernels();
  row::AttentionRows args{heads_of_row(out, q, k_blocks, v_blocks, dtype, block_tokens, scratch, n_ctx, n_heads,
                                       n_kv_heads, head_size, kv_stride),
                          rows, out_stride, q_stride, scratch_stride};
  if (kernels.attention_rows != nullptr && rows > 1) {
    kernels.attention_rows(args, heads.begin, heads.end);
    return;
  }
  for (int r = 0; r < rows; ++r) {  // one row, or no kernel for several in this build: row by row
    kernels.attention_heads(args.first, heads.begin, heads.end);
    args.first.out += out_stride;
    args.first.q += q_stride;
    args.first.scratch += scratch_stride;
    ++args.first.n_ctx;
  }
}

void attention_paged(float* out, const float* q, const void* const* k_blocks, const void* const* v_blocks,
                     KvDtype dtype, int block_tokens, float* scratch, int n_ctx, int n_heads, int n_kv_heads,
                     int head_size, int kv_stride) {
  // Long contexts split the heads over the kernel threads in contiguous bands.
  if (!open_parallel_region(n_heads > 1 && n_ctx > kMinParallelAttentionContext)) {
    attention_paged(out, q, k_blocks, v_blocks, dtype, block_tokens, scratch, n_ctx, n_heads, n_kv_heads, head_size,
                    kv_stride, Team{});
    return;
  }
#pragma omp parallel num_threads(num_threads())
  attention_paged(out, q, k_blocks, v_blocks, dtype, block_tokens, scratch, n_ctx, n_heads, n_kv_heads, head_size,
                  kv_stride, Team{omp_get_thread_num(), omp_get_num_threads()});
}

void attention(float* out, const float* q, const float* k_cache, const float* v_cache, float* scratch,
               int n_ctx, int n_heads, int n_kv_heads, int head_size, int kv_stride) {
  // A contiguous cache is one block holding every position.
  const void* k_block = k_cache;
  const void* v_block = v_cache;
  attention_paged(out, q, &k_block, &v_block, KvDtype::kF32, n_ctx > 0 ? n_ctx : 1, scratch, n_ctx, n_heads,
                  n_kv_heads, head_size, kv_stride);
}

}  // namespace shardline::kernels::cpu
