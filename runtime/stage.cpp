#include "runtime/stage.h"

#include <cstring>

#include "common/error.h"
#include "kernels/cpu/ops.h"

namespace shardline::runtime {

namespace cpu = kernels::cpu;

Stage::Stage(const ShardWeights& weights, comm::Communicator& tp_comm, const StageOptions& options)
    : weights_(weights), tp_comm_(tp_comm), options_(options), arena_(options.arena) {
  const auto& s = weights.shape();
  const auto& shard = weights.shard();
  q_dim_ = shard.heads.size() * s.head_size();
  kv_dim_ = shard.kv_heads.size() * s.head_size();
  hidden_ = shard.hidden.size();
  if (!arena_) {
    own_arena_ = std::make_unique<memory::Arena>(
        memory::ArenaOptions{.initial_bytes = scratch_bytes(s, shard, options.max_rows)});
    arena_ = own_arena_.get();
  }
  SL_CHECK(options.kv_block_tokens >= 1 && options.kv_blocks >= 0);
  const int n_layers = weights.n_local_layers();
  const int kv_blocks = options.kv_blocks > 0 ? options.kv_blocks : kDefaultKvContexts * kv_blocks_for(s.seq_len);
  kv_pool_ = std::make_unique<memory::KvBlockPool>(memory::KvBlockPoolOptions{
      KvCache::block_bytes(n_layers, kv_dim_, options.kv_block_tokens), kv_blocks, options.numa_node});
  scores_ = arena_->allocate_array<float>(static_cast<std::size_t>(shard.heads.size()) * s.seq_len);
  reserve_rows(options.max_rows);
  if (shard.has_classifier) {
    local_logits_ = arena_->allocate_array<float>(shard.vocab.size());
    for (int t = 0; t < tp_comm.size(); ++t) {
      vocab_counts_.push_back(partition::split_evenly(s.vocab_size, tp_comm.size(), t).size());
    }
  }
}

std::size_t Stage::scratch_bytes(const partition::ModelShape& s, const partition::RankShard& shard, int max_rows) {
  const std::size_t rows = static_cast<std::size_t>(max_rows);
  const std::size_t q_dim = shard.heads.size() * s.head_size(), kv_dim = shard.kv_heads.size() * s.head_size();
  const std::size_t hidden = shard.hidden.size();
  const std::size_t floats = rows * (3 * s.dim + 2 * q_dim + 2 * kv_dim + 2 * hidden) +
                             static_cast<std::size_t>(shard.heads.size()) * s.seq_len +
                             (shard.has_classifier ? shard.vocab.size() : 0);
  return floats * sizeof(float) + rows * sizeof(Row) + 16 * 64;  // + one alignment pad per buffer
}

void Stage::reserve_rows(int max_rows) {
  SL_CHECK(max_rows >= 1);
  options_.max_rows = max_rows;
  if (max_rows <= scratch_rows_) return;
  scratch_rows_ = max_rows;
  const std::size_t rows = static_cast<std::size_t>(max_rows);
  const int dim = shape().dim;
  rows_ = arena_->allocate_array<Row>(rows);
  xb_ = arena_->allocate_array<float>(rows * dim);
  q_ = arena_->allocate_array<float>(rows * q_dim_);
  k_ = arena_->allocate_array<float>(rows * kv_dim_);
  v_ = arena_->allocate_array<float>(rows * kv_dim_);
  att_ = arena_->allocate_array<float>(rows * q_dim_);
  hb_ = arena_->allocate_array<float>(rows * hidden_);
  hb2_ = arena_->allocate_array<float>(rows * hidden_);
  out_ = arena_->allocate_array<float>(rows * dim);
}

KvCache Stage::make_kv_cache(int n_positions) {
  SL_CHECK(n_positions >= 0 && n_positions <= shape().seq_len);
  return KvCache(*kv_pool_, weights_.n_local_layers(), kv_dim_, options_.kv_block_tokens,
                 n_positions > 0 ? n_positions : shape().seq_len);
}

void Stage::embed(const int* tokens, int n, float* x) const {
  SL_CHECK(weights_.token_embedding() != nullptr);
  const int dim = shape().dim;
  for (int t = 0; t < n; ++t) {
    SL_CHECK(tokens[t] >= 0 && tokens[t] < shape().vocab_size);
    std::memcpy(x + static_cast<std::size_t>(t) * dim,
                weights_.token_embedding() + static_cast<std::size_t>(tokens[t]) * dim, sizeof(float) * dim);
  }
}

void Stage::forward(float* x, int n, int pos, KvCache& cache) {
  SL_CHECK(n >= 1 && n <= options_.max_rows);
  for (int t = 0; t < n; ++t) rows_[t] = {&cache, pos + t};
  forward(x, rows_.data(), n);
}

void Stage::forward(float* x, const Row* rows, int n) {
  SL_CHECK(n >= 1 && n <= options_.max_rows);
  // Blocks for every row's position first: an exhausted pool fails here, before any layer ran.
  for (int t = 0; t < n; ++t) rows[t].cache->reserve_through(rows[t].pos);
  for (int l = 0; l < weights_.n_local_layers(); ++l) {
    const LayerWeights& w = weights_.layer(l);
    attention_block(w, x, rows, n, l);
    mlp_block(w, x, n);
  }
}

void Stage::attention_block(const LayerWeights& w, float* x, const Row* rows, int n, int local_layer) {
  const auto& s = shape();
  const int hs = s.head_size();
  const int n_local_heads = q_dim_ / hs;
  const int n_local_kv = kv_dim_ / hs;
  cpu::rmsnorm(xb_.data(), x, w.rms_att, n, s.dim, options_.rms_eps);
  cpu::matmul(q_.data(), xb_.data(), w.wq, n, s.dim, q_dim_);
  cpu::matmul(k_.data(), xb_.data(), w.wk, n, s.dim, kv_dim_);
  cpu::matmul(v_.data(), xb_.data(), w.wv, n, s.dim, kv_dim_);
  // Every row's key and value go into its cache first, so rows of one prefill chunk see each other.
  for (int t = 0; t < n; ++t) {
    const int pos = rows[t].pos;
    float* qt = q_.data() + static_cast<std::size_t>(t) * q_dim_;
    float* kt = k_.data() + static_cast<std::size_t>(t) * kv_dim_;
    cpu::rope(qt, n_local_heads, hs, pos, options_.rope_theta);
    cpu::rope(kt, n_local_kv, hs, pos, options_.rope_theta);
    std::memcpy(rows[t].cache->key_row(local_layer, pos), kt, sizeof(float) * kv_dim_);
    std::memcpy(rows[t].cache->value_row(local_layer, pos), v_.data() + static_cast<std::size_t>(t) * kv_dim_,
                sizeof(float) * kv_dim_);
  }
  for (int t = 0; t < n; ++t) {
    // Causal: the token at pos sees positions 0 .. pos of its own sequence.
    const KvCache& cache = *rows[t].cache;
    cpu::attention_paged(att_.data() + static_cast<std::size_t>(t) * q_dim_,
                         q_.data() + static_cast<std::size_t>(t) * q_dim_, cache.key_blocks(local_layer),
                         cache.value_blocks(local_layer), cache.block_tokens(), scores_.data(), rows[t].pos + 1,
                         n_local_heads, n_local_kv, hs, kv_dim_);
  }
  cpu::matmul(out_.data(), att_.data(), w.wo, n, q_dim_, s.dim);
  tp_comm_.all_reduce_sum(out_.data(), static_cast<std::size_t>(n) * s.dim);  // sum over heads of the group
  cpu::add_inplace(x, out_.data(), n * s.dim);
}

void Stage::mlp_block(const LayerWeights& w, float* x, int n) {
  const auto& s = shape();
  cpu::rmsnorm(xb_.data(), x, w.rms_ffn, n, s.dim, options_.rms_eps);
  cpu::matmul(hb_.data(), xb_.data(), w.w1, n, s.dim, hidden_);
  cpu::matmul(hb2_.data(), xb_.data(), w.w3, n, s.dim, hidden_);
  cpu::swiglu(hb_.data(), hb2_.data(), n * hidden_);
  cpu::matmul(out_.data(), hb_.data(), w.w2, n, hidden_, s.dim);
  tp_comm_.all_reduce_sum(out_.data(), static_cast<std::size_t>(n) * s.dim);  // sum over hidden slices
  cpu::add_inplace(x, out_.data(), n * s.dim);
}

void Stage::logits(const float* x, float* logits) {
  SL_CHECK(weights_.classifier() != nullptr);
  const auto& s = shape();
  cpu::rmsnorm(xb_.data(), x, weights_.rms_final(), 1, s.dim, options_.rms_eps);
  cpu::matmul(local_logits_.data(), xb_.data(), weights_.classifier(), 1, s.dim,
              static_cast<int>(local_logits_.size()));
  tp_comm_.all_gather_v(local_logits_.data(), logits, vocab_counts_);
}

}  // namespace shardline::runtime
