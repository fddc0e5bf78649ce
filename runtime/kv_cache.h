// A sequence's key/value cache for one stage's layers and one rank's kv heads, paged: its positions live in
// fixed-size blocks from the rank's KvBlockPool, found through the sequence's block table.
//
// Block layout, for block_tokens positions of every local layer:   (n_layers, 2, block_tokens) rows
//   of kv_dim values of the cache's dtype, each row_bytes() = kv_row_bytes(dtype, kv_dim, head_size) long
//   (fp32; fp16, half the bytes; int8, the row's codes then one float scale per head: kernels/cpu/ops.h):
//   keys of layer l from byte (2l) * block_tokens * row_bytes(), values from (2l + 1) * block_tokens *
//   row_bytes().
// Position p is row p % block_tokens of block table[p / block_tokens].
//
// Blocks are taken as positions are reached (reserve_through) and returned to the pool when the cache is
// destroyed. The block table and the per-layer pointer tables are sized for max_positions up front, so
// growing never allocates on the heap inside the decode loop.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/weight_format.h"
#include "memory/kv_block_pool.h"

namespace shardline::runtime {

// The KV cache dtype a run gets: the requested one, else fp32 for fp32 weights (the reference arithmetic,
// bit for bit) and fp16 for bf16 and int8 weights (their rounding dwarfs fp16's, and attention then streams
// half the bytes) on the AVX-512 kernels (kernels/cpu/isa.h active_isa(); below them, fp32). The CUDA
// backend keeps an fp32 cache: fp16 or int8 there is a ConfigError.
kernels::cpu::KvDtype resolve_kv_dtype(std::optional<kernels::cpu::KvDtype> requested,
                                       kernels::cpu::WeightDtype weights, bool cuda);

class KvCache {
 public:
  KvCache() = default;
  // Positions [0, max_positions) of one sequence, rows of kv_dim values (whole heads of head_size); nothing
  // is taken from the pool yet.
  KvCache(memory::KvBlockPool& pool, int n_layers, int kv_dim, int head_size, int block_tokens, int max_positions,
          kernels::cpu::KvDtype dtype = kernels::cpu::KvDtype::kF32);
  KvCache(KvCache&& other) noexcept { *this = std::move(other); }
  KvCache& operator=(KvCache&& other) noexcept;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;
  ~KvCache() { release(); }

  // Bytes of one block for this shape: what the pool's blocks must hold.
  static std::size_t block_bytes(int n_layers, int kv_dim, int head_size, int block_tokens,
                                 kernels::cpu::KvDtype dtype = kernels::cpu::KvDtype::kF32) {
    return static_cast<std::size_t>(n_layers) * 2 * block_tokens * kernels::cpu::kv_row_bytes(dtype, kv_dim, head_size);
  }
  static int blocks_for(int positions, int block_tokens) { return (positions + block_tokens - 1) / block_tokens; }

  // Makes positions [0, pos] writable, taking blocks from the pool as needed. ResourceError when the pool
  // is exhausted (the cache keeps the blocks it has).
  void reserve_through(int pos);

  // One position's row, kv_dim values of kv_dtype() (kv_row_bytes); pos must be reserved.
  void* key_row(int layer, int pos) { return row(layer, 0, pos); }
  void* value_row(int layer, int pos) { return row(layer, 1, pos); }
  // Block base pointers of one layer, for attention_paged: (blocks_held) pointers to block_tokens rows of
  // kv_dim values of kv_dtype().
  const void* const* key_blocks(int layer) const { return k_tables_.data() + static_cast<std::size_t>(layer) * max_blocks_; }
  const void* const* value_blocks(int layer) const { return v_tables_.data() + static_cast<std::size_t>(layer) * max_blocks_; }

  kernels::cpu::KvDtype kv_dtype() const { return dtype_; }
  int kv_dim() const { return kv_dim_; }
  int head_size() const { return head_size_; }
  std::size_t row_bytes() const { return row_bytes_; }  // one position's keys (or values) of one layer
  int seq_len() const { return max_positions_; }  // positions this cache may hold
  int block_tokens() const { return block_tokens_; }
  int blocks_held() const { return static_cast<int>(blocks_.size()); }
  // Pool block ids in position order (a device backend uploads them as the sequence's block table).
  const std::vector<int>& block_table() const { return blocks_; }

 private:
  void* row(int layer, int kind, int pos) {
    std::byte* block = pool_->data(blocks_[pos / block_tokens_]);
    return block + (static_cast<std::size_t>(2 * layer + kind) * block_tokens_ + pos % block_tokens_) * row_bytes_;
  }
  void release();

  memory::KvBlockPool* pool_ = nullptr;
  int n_layers_ = 0;
  int kv_dim_ = 0;
  int head_size_ = 1;
  std::size_t row_bytes_ = 0;  // kv_row_bytes(dtype_, kv_dim_, head_size_)
  int block_tokens_ = 1;
  int max_positions_ = 0;
  int max_blocks_ = 0;
  kernels::cpu::KvDtype dtype_ = kernels::cpu::KvDtype::kF32;
  std::vector<int> blocks_;             // the block table: pool block ids, in position order
  std::vector<const void*> k_tables_;   // (n_layers, max_blocks): key base pointer of each held block
  std::vector<const void*> v_tables_;   // (n_layers, max_blocks)
};

}  // namespace shardline::runtime
