#include "runtime/kv_cache.h"

#include <utility>

#include "common/error.h"

namespace shardline::runtime {

KvCache::KvCache(memory::KvBlockPool& pool, int n_layers, int kv_dim, int block_tokens, int max_positions)
    : pool_(&pool),
      n_layers_(n_layers),
      kv_dim_(kv_dim),
      block_tokens_(block_tokens),
      max_positions_(max_positions),
      max_blocks_(blocks_for(max_positions, block_tokens)) {
  SL_CHECK(n_layers >= 1 && kv_dim >= 1 && block_tokens >= 1 && max_positions >= 1);
  SL_CHECK_MSG(pool.block_bytes() >= block_bytes(n_layers, kv_dim, block_tokens), "pool blocks of {} bytes, need {}",
               pool.block_bytes(), block_bytes(n_layers, kv_dim, block_tokens));
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
    block_tokens_ = other.block_tokens_;
    max_positions_ = std::exchange(other.max_positions_, 0);
    max_blocks_ = std::exchange(other.max_blocks_, 0);
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
    const float* base = reinterpret_cast<const float*>(pool_->data(id));
    for (int l = 0; l < n_layers_; ++l) {
      k_tables_[static_cast<std::size_t>(l) * max_blocks_ + b] = base + static_cast<std::size_t>(2 * l) * block_tokens_ * kv_dim_;
      v_tables_[static_cast<std::size_t>(l) * max_blocks_ + b] = base + static_cast<std::size_t>(2 * l + 1) * block_tokens_ * kv_dim_;
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
