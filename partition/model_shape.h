// The shape of a Llama-family transformer: everything the planner and the slicers need, nothing about
// where the weights live.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace shardline::partition {

struct ModelShape {
  int dim = 0;         // residual width
  int hidden_dim = 0;  // MLP width
  int n_layers = 0;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (GQA when < n_heads)
  int vocab_size = 0;
  int seq_len = 0;     // maximum context
  bool shared_classifier = true;  // classifier reuses the token embedding

  int head_size() const { return dim / n_heads; }
  int kv_dim() const { return head_size() * n_kv_heads; }

  // Why this shape cannot be a model, or nullopt when it can. Callers pick the exception type: a file
  // header gives a FormatError, a command line a ConfigError.
  std::optional<std::string> find_problem() const;

  // Parameter counts, for memory estimates and load statistics.
  std::uint64_t n_layer_params() const;  // one transformer layer (norms included)
  std::uint64_t n_params() const;        // whole model, embedding and classifier included

  std::string describe() const;  // "dim 64, hidden 172, 3 layers, 8 heads / 4 kv, vocab 32000, seq 256"

  bool operator==(const ModelShape&) const = default;
};

}  // namespace shardline::partition
