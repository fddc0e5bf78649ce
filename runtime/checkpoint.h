// Model files: llama2.c "legacy" checkpoints (a 7 x int32 header, then float32 tensors in a fixed order; see
// ../shared/models/README.md) and GGUF files of llama models (gguf_model.h). This file knows where each
// tensor is; shard_weights.h maps one rank's slices of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "partition/model_shape.h"

namespace shardline::runtime {

inline constexpr std::uint64_t kCheckpointHeaderBytes = 7 * sizeof(std::int32_t);

// Byte offsets of one layer's tensors in the file, each row-major with rows = output features.
struct LayerTensors {
  std::uint64_t rms_att = 0;  // (dim)
  std::uint64_t wq = 0;       // (dim, dim)
  std::uint64_t wk = 0;       // (kv_dim, dim)
  std::uint64_t wv = 0;       // (kv_dim, dim)
  std::uint64_t wo = 0;       // (dim, dim)
  std::uint64_t rms_ffn = 0;  // (dim)
  std::uint64_t w1 = 0;       // (hidden, dim)
  std::uint64_t w2 = 0;       // (dim, hidden)
  std::uint64_t w3 = 0;       // (hidden, dim)
};

// Byte offsets of every float32 tensor a rank may read: llama2.c stacks each kind over the layers, GGUF
// puts them wherever its tensor table says; the readers only see these offsets.
struct CheckpointLayout {
  std::uint64_t token_embedding = 0;  // (vocab, dim)
  std::uint64_t rms_final = 0;        // (dim)
  std::uint64_t classifier = 0;       // (vocab, dim): == token_embedding when shared
  std::vector<LayerTensors> layers;   // (n_layers)
  std::uint64_t total_bytes = 0;      // llama2.c: the exact file size the header implies; GGUF: the file's size
};

// The llama2.c layout of a model of this shape (header, then the tensors in the fixed order).
CheckpointLayout checkpoint_layout(const partition::ModelShape& shape);

enum class ModelFormat { kLlama2c, kGguf };

// A model file as the engine reads it: its shape, where its tensors are, and the two constants of its
// arithmetic that a file may set (GGUF's layer_norm_rms_epsilon and rope.freq_base; llama2.c's are fixed).
struct ModelFile {
  ModelFormat format = ModelFormat::kLlama2c;
  partition::ModelShape shape;
  CheckpointLayout layout;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
};

// Reads and validates a llama2.c checkpoint or a GGUF file (told apart by GGUF's magic): the header or
// metadata, and that every tensor lies inside the file. Throws ResourceError (missing/unreadable) or
// FormatError (nonsense header, size not matching it, a GGUF tensor of a type or shape shardline cannot
// use) with the path and what to do.
ModelFile read_model_file(const std::string& path);
// read_model_file(path).shape.
partition::ModelShape read_checkpoint_shape(const std::string& path);

// Writes the 7 x int32 header (negative vocab for an unshared classifier).
void encode_checkpoint_header(const partition::ModelShape& shape, std::int32_t out[7]);

}  // namespace shardline::runtime
