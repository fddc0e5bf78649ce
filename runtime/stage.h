// One rank's forward pass: its layers, its heads, its slice of the MLP and of the classifier.
// The communication points of the forward pass are all here, and only here:
//   after attention's wo:  tp all-reduce (partial sums over heads)
//   after the MLP's w2:    tp all-reduce (partial sums over hidden features)
//   after the classifier:  tp all-gather of the vocab slices (last stage)
// Activations between stages are moved by the pipeline (pipeline.h), not here.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "runtime/kv_cache.h"
#include "runtime/shard_weights.h"

namespace shardline::runtime {

struct StageOptions {
  int max_chunk_tokens = 64;  // most tokens one forward call takes (prefill chunk); sizes scratch buffers
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
};

class Stage {
 public:
  // tp_comm: this rank's TP group (solo for tp=1). Both must outlive the Stage.
  Stage(const ShardWeights& weights, comm::Communicator& tp_comm, const StageOptions& options = {});

  // A KV cache sized for this stage's layers and kv heads.
  KvCache make_kv_cache() const;

  // First stage: x[t] = embedding[tokens[t]].   x: (n, dim)
  void embed(const int* tokens, int n, float* x) const;

  // Runs n consecutive tokens (positions pos .. pos+n-1) of one sequence through this stage's layers,
  // reading and extending its KV cache. x: (n, dim), updated in place. n <= max_chunk_tokens.
  void forward(float* x, int n, int pos, KvCache& cache);

  // Last stage: logits of one activation row, gathered over the TP group.   x: (dim)  logits: (vocab)
  void logits(const float* x, float* logits);

  const partition::ModelShape& shape() const { return weights_.shape(); }
  int max_chunk_tokens() const { return options_.max_chunk_tokens; }

 private:
  void attention_block(const LayerWeights& w, float* x, int n, int pos, KvCache& cache, int local_layer);
  void mlp_block(const LayerWeights& w, float* x, int n);

  const ShardWeights& weights_;
  comm::Communicator& tp_comm_;
  StageOptions options_;
  int q_dim_;       // local query heads * head_size
  int kv_dim_;      // local kv heads * head_size
  int hidden_;      // local hidden features
  std::vector<int> vocab_counts_;  // classifier rows per TP rank, for the logits gather

  // Scratch, sized once for max_chunk_tokens rows: no allocation per token.
  std::vector<float> xb_;      // (chunk, dim)
  std::vector<float> q_;       // (chunk, q_dim)
  std::vector<float> k_;       // (chunk, kv_dim)
  std::vector<float> v_;       // (chunk, kv_dim)
  std::vector<float> att_;     // (chunk, q_dim)
  std::vector<float> scores_;  // (local heads, seq_len)
  std::vector<float> hb_;      // (chunk, hidden)
  std::vector<float> hb2_;     // (chunk, hidden)
  std::vector<float> out_;     // (chunk, dim)
  std::vector<float> local_logits_;  // (vocab slice)
};

}  // namespace shardline::runtime
