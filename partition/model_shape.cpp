#include "partition/model_shape.h"

#include <fmt/format.h>

namespace shardline::partition {

std::optional<std::string> ModelShape::find_problem() const {
  if (dim <= 0 || hidden_dim <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv_heads <= 0 || vocab_size <= 0 ||
      seq_len <= 0) {
    return fmt::format("every dimension must be positive ({})", describe());
  }
  if (dim % n_heads != 0) return fmt::format("n_heads={} does not divide dim={}", n_heads, dim);
  if (n_heads % n_kv_heads != 0) {
    return fmt::format("n_kv_heads={} does not divide n_heads={}", n_kv_heads, n_heads);
  }
  if (head_size() % 2 != 0) return fmt::format("head size {} is odd; RoPE rotates pairs", head_size());
  // Guards against headers that are garbage but pass the checks above (e.g. random bytes).
  constexpr int kMaxDim = 1 << 20;
  if (dim > kMaxDim || hidden_dim > kMaxDim || n_layers > 4096 || vocab_size > (1 << 24) || seq_len > (1 << 24)) {
    return fmt::format("implausibly large dimensions ({})", describe());
  }
  return std::nullopt;
}

std::uint64_t ModelShape::n_layer_params() const {
  const std::uint64_t d = dim, h = hidden_dim, kv = static_cast<std::uint64_t>(kv_dim());
  return 2 * d            // rms_att, rms_ffn
         + 2 * d * d      // wq, wo
         + 2 * kv * d     // wk, wv
         + 3 * h * d;     // w1, w2, w3
}

std::uint64_t ModelShape::n_params() const {
  const std::uint64_t embedding = static_cast<std::uint64_t>(vocab_size) * dim;
  return embedding + n_layers * n_layer_params() + dim + (shared_classifier ? 0 : embedding);
}

std::string ModelShape::describe() const {
  return fmt::format("dim {}, hidden {}, {} layer{}, {} heads / {} kv, vocab {}, seq {}{}", dim, hidden_dim,
                     n_layers, n_layers == 1 ? "" : "s", n_heads, n_kv_heads, vocab_size, seq_len,
                     shared_classifier ? "" : ", unshared classifier");
}

}  // namespace shardline::partition
