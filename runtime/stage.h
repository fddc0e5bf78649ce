// One rank's forward pass: its layers, its heads, its slice of the MLP and of the classifier.
// The communication points of the forward pass are all here, and only here:
//   after attention's wo:  tp all-reduce (partial sums over heads)
//   after the MLP's w2:    tp all-reduce (partial sums over hidden features)
//   after the classifier:  tp all-gather of the vocab slices (last stage)
// Activations between stages are moved by the pipeline (pipeline.h), not here.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "kernels/cpu/packed_matmul.h"
#include "runtime/kv_cache.h"
#include "runtime/shard_weights.h"

namespace shardline::runtime {

// One row of a forward call: a token of some sequence at some position. A call may mix rows of several
// sequences (a micro-batch: one decode token each, or prefill chunks); rows of one sequence come in
// increasing position order.
struct Row {
  KvCache* cache = nullptr;  // the row's sequence's cache on this stage
  int pos = 0;               // the row's position in its sequence
};

struct StageOptions {
  int max_rows = 64;  // most rows one forward call takes; sizes the scratch buffers
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
};

class Stage {
 public:
  // tp_comm: this rank's TP group (solo for tp=1). Both must outlive the Stage.
  Stage(const ShardWeights& weights, comm::Communicator& tp_comm, const StageOptions& options = {});

  // A KV cache for this stage's layers and kv heads, holding positions [0, n_positions) (default seq_len).
  KvCache make_kv_cache(int n_positions = 0) const;

  // First stage: x[t] = embedding[tokens[t]].   x: (n, dim)
  void embed(const int* tokens, int n, float* x) const;

  // Runs n rows through this stage's layers, reading and extending each row's KV cache.
  // x: (n, dim), updated in place. n <= max_rows.
  void forward(float* x, const Row* rows, int n);
  // The common case: n consecutive tokens (positions pos .. pos+n-1) of one sequence.
  void forward(float* x, int n, int pos, KvCache& cache);

  // Last stage: logits of n activation rows in one pass over the classifier, gathered over the TP group.
  //   x: (n, dim)  logits: (n, vocab)
  void logits(const float* x, int n, float* logits);
  // One row.   x: (dim)  logits: (vocab)
  void logits(const float* x, float* logits) { this->logits(x, 1, logits); }

  const partition::ModelShape& shape() const { return weights_.shape(); }
  int max_rows() const { return options_.max_rows; }
  // Grows the scratch buffers to take max_rows rows per forward call.
  void reserve_rows(int max_rows);
  const ShardWeights& weights() const { return weights_; }

 private:
  void attention_block(const LayerWeights& w, float* x, const Row* rows, int n, int local_layer);
  void mlp_block(const LayerWeights& w, float* x, int n);

  const ShardWeights& weights_;
  comm::Communicator& tp_comm_;
  StageOptions options_;
  int q_dim_;       // local query heads * head_size
  int kv_dim_;      // local kv heads * head_size
  int hidden_;      // local hidden features
  std::vector<int> vocab_counts_;  // classifier rows per TP rank, for the logits gather
  std::vector<int> gather_counts_; // vocab_counts_ * rows of the current logits call

  // Scratch, sized once for max_rows rows: no allocation per token.
  std::vector<float> xb_;      // (max_rows, dim)
  std::vector<float> q_;       // (max_rows, q_dim)
  std::vector<float> k_;       // (max_rows, kv_dim)
  std::vector<float> v_;       // (max_rows, kv_dim)
  std::vector<float> att_;     // (max_rows, q_dim)
  std::vector<float> scores_;  // (kernel threads, local heads, seq_len): one scratch per thread
  std::vector<float> hb_;      // (max_rows, hidden)
  std::vector<float> out_;     // (max_rows, dim)
  std::vector<Row> rows_;      // (max_rows) for the single-sequence forward
  kernels::cpu::Activations act_;  // the matmuls' input, prepared for the weight dtype: (max_rows, <= max k)
  // Grown to the most rows one logits call has seen (batched decode: one per sequence of a micro-batch).
  std::vector<float> logits_x_;       // (rows, dim)
  std::vector<float> local_logits_;   // (rows, vocab slice)
  std::vector<float> gathered_;       // (rows, vocab) in rank order of the TP group
};

}  // namespace shardline::runtime
