// A sequence's key/value cache for one stage's layers and one rank's kv heads. Contiguous for now; the
// paged block pool (memory/kv_block_pool.h) will replace the storage without changing the callers.
#pragma once

#include <cstddef>
#include <vector>

namespace shardline::runtime {

class KvCache {
 public:
  KvCache() = default;
  KvCache(int n_layers, int seq_len, int kv_dim)
      : n_layers_(n_layers), seq_len_(seq_len), kv_dim_(kv_dim),
        k_(static_cast<std::size_t>(n_layers) * seq_len * kv_dim),
        v_(static_cast<std::size_t>(n_layers) * seq_len * kv_dim) {}

  // Rows of one layer: (seq_len, kv_dim).
  float* keys(int layer) { return k_.data() + offset(layer); }
  float* values(int layer) { return v_.data() + offset(layer); }
  int kv_dim() const { return kv_dim_; }
  int seq_len() const { return seq_len_; }

 private:
  std::size_t offset(int layer) const { return static_cast<std::size_t>(layer) * seq_len_ * kv_dim_; }
  int n_layers_ = 0;
  int seq_len_ = 0;
  int kv_dim_ = 0;
  std::vector<float> k_;  // (n_layers, seq_len, kv_dim)
  std::vector<float> v_;  // (n_layers, seq_len, kv_dim)
};

}  // namespace shardline::runtime
