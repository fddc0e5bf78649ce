// llama2.c "legacy" checkpoints: a 7 x int32 header, then float32 tensors in a fixed order (see
// ../shared/models/README.md). This file knows the layout; shard_weights.h maps one rank's slices of it.
#pragma once

#include <cstdint>
#include <string>

#include "partition/model_shape.h"

namespace shardline::runtime {

inline constexpr std::uint64_t kCheckpointHeaderBytes = 7 * sizeof(std::int32_t);

// Byte offsets of every tensor in the file; per-layer tensors are stacked (n_layers, rows, cols).
struct CheckpointLayout {
  std::uint64_t token_embedding = 0;  // (vocab, dim)
  std::uint64_t rms_att = 0;          // (n_layers, dim)
  std::uint64_t wq = 0;               // (n_layers, dim, dim)
  std::uint64_t wk = 0;               // (n_layers, kv_dim, dim)
  std::uint64_t wv = 0;               // (n_layers, kv_dim, dim)
  std::uint64_t wo = 0;               // (n_layers, dim, dim)
  std::uint64_t rms_ffn = 0;          // (n_layers, dim)
  std::uint64_t w1 = 0;               // (n_layers, hidden, dim)
  std::uint64_t w2 = 0;               // (n_layers, dim, hidden)
  std::uint64_t w3 = 0;               // (n_layers, hidden, dim)
  std::uint64_t rms_final = 0;        // (dim)
  std::uint64_t rope_tables = 0;      // 2 x (seq_len, head_size / 2), unused: RoPE is computed
  std::uint64_t classifier = 0;       // (vocab, dim): == token_embedding when shared
  std::uint64_t total_bytes = 0;      // exact file size the header implies
};

CheckpointLayout checkpoint_layout(const partition::ModelShape& shape);

// Reads and validates the header and the file size. Throws ResourceError (missing/unreadable) or
// FormatError (nonsense header, size not matching the header) with the path and what to do.
partition::ModelShape read_checkpoint_shape(const std::string& path);

// Writes the 7 x int32 header (negative vocab for an unshared classifier).
void encode_checkpoint_header(const partition::ModelShape& shape, std::int32_t out[7]);

}  // namespace shardline::runtime
