#include "runtime/kv_cache.h"

#include <utility>

#include "common/error.h"
#include "kernels/cpu/isa.h"

namespace shardline::runtime {

kernels::cpu::KvDtype resolve_kv_dtype(std::optional<kernels::cpu::KvDtype> requested,
                                       kernels::cpu::WeightDtype weights, bool cuda) {
  using kernels::cpu::KvDtype;
  if (cuda) {
    if (requested && *requested != KvDtype::kF32) {
      throw ConfigError(fmt::format("--kv-dtype {} runs on the CPU only, and the CUDA backend (--device cuda, or auto "
                                    "where every rank has a GPU) keeps its KV cache in fp32; use --kv-dtype auto or "
                                    "fp32, or --device cpu",
                                    kernels::cpu::kv_dtype_name(*requested)));
    }
    return KvDtype::kF32;
  }
  if (requested) return *requested;
  // fp16 only where the row kernels read it with F16C (the AVX2 and AVX-512 builds): the portable ones
  // convert with integer code, and attention over an fp16 cache measured 2.1-2.3x slower than over fp32
  // there. On AVX2 (Zen 3) fp16 became the faster cache once attention kept its sums in registers: 110M int8
  // and bf16 decode at batch 16 ran 5-10% faster with it at 32 and 400 steps, batch 1 within -4..+10%
  // (docs/kv-cache.md, session 34).
  const bool reads_half_fast = kernels::cpu::active_isa() >= kernels::cpu::Isa::kAvx2;
  return weights == kernels::cpu::WeightDtype::kF32 || !reads_half_fast ? KvDtype::kF32 : KvDtype::kF16;
}

KvCache::KvCache(memory::KvBlockPool& pool, int n_layers, int kv_dim, int head_size, int block_tokens,
                 int max_positions, kernels::cpu::KvDtype dtype)
    : pool_(&pool),
      n_layers_(n_layers),
      kv_dim_(kv_dim),
      head_size_(head_size),
      row_bytes_(head_size >= 1 ? kernels::cpu::kv_row_bytes(dtype, kv_dim, head_size) : 0),
      block_tokens_(block_tokens),
      max_positions_(max_positions),
      max_blocks_(blocks_for(max_positions, block_tokens)),
      dtype_(dtype) {
  SL_CHECK(n_layers >= 1 && kv_dim >= 1 && head_size >= 1 && kv_dim % head_size == 0 && block_tokens >= 1 &&
           max_positions >= 1);
  const std::size_t needed = block_bytes(n_layers, kv_dim, head_size, block_tokens, dtype);
  SL_CHECK_MSG(pool.block_bytes() >= needed, "pool blocks of {} bytes, need {}", pool.block_bytes(), needed);
  blocks_.reserve(static_cast<std::size_t>(max_blocks_));
  k_tables_.assign(static_cast<std::size_t>(n_layers) * max_blocks_, nullptr);
  v_tables_.assign(static_cast<std::size_t>(n_layers) * max_blocks_, nullptr);
}

KvCache& KvCache::operator=(KvCache&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    n_layers_ = other.n_layers_;
    kv_dim_ = other.kv_dim_;
    head_size_ = other.head_size_;
    row_bytes_ = other.row_bytes_;
    block_tokens_ = other.block_tokens_;
    max_positions_ = std::exchange(other.max_positions_, 0);
    max_blocks_ = std::exchange(other.max_blocks_, 0);
    dtype_ = other.dtype_;
    blocks_ = std::move(other.blocks_);
    k_tables_ = std::move(other.k_tables_);
    v_tables_ = std::move(other.v_tables_);
    other.blocks_.clear();
  }
  return *this;
}

void KvCache::reserve_through(int pos) {
  SL_CHECK_MSG(pos >= 0 && pos < max_positions_, "position {} outside the cache's {} positions", pos, max_positions_);
  const int needed = pos / block_tokens_ + 1;
  while (static_cast<int>(blocks_.size()) < needed) {
    const int id = pool_->allocate();
    const int b = static_cast<int>(blocks_.size());
    blocks_.push_back(id);  // within the reserved capacity: no allocation
    const std::byte* base = pool_->data(id);
    const std::size_t part_bytes = static_cast<std::size_t>(block_tokens_) * row_bytes_;
    for (int l = 0; l < n_layers_; ++l) {
      k_tables_[static_cast<std::size_t>(l) * max_blocks_ + b] = base + static_cast<std::size_t>(2 * l) * part_bytes;
      v_tables_[static_cast<std::size_t>(l) * max_blocks_ + b] = base + static_cast<std::size_t>(2 * l + 1) * part_bytes;
    }
  }
}

void KvCache::release() {
  if (pool_) {
    for (int id : blocks_) pool_->release(id);
  }
  blocks_.clear();
}

}  // namespace shardline::runtime
