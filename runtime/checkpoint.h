// Model files: llama2.c "legacy" checkpoints (a 7 x int32 header, then float32 tensors in a fixed order; see
// ../shared/models/README.md), llama2.c's versioned exports (llama2c_export.h) and GGUF files of llama models
// (gguf_model.h). This file knows where each tensor is; shard_weights.h maps one rank's slices of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "partition/model_shape.h"

namespace shardline::runtime {

inline constexpr std::uint64_t kCheckpointHeaderBytes = 7 * sizeof(std::int32_t);

// The element types a model file's tensors may have: llama2.c's legacy and version-1 files are all F32; a
// GGUF file's matrices may be F16, BF16, or one of ggml's quantised block formats (runtime/ggml_blocks.h),
// converted to fp32 as a rank reads its slice; its norms usually stay F32. The values are ggml's type ids, so
// GGUF's tables (block sizes, names: runtime/gguf.h) describe them; but for kLlama2cQ8, which is no ggml type:
// llama2.c's version-2 matrices (runq.c's Q8_0), int8 values whose fp32 scales, one per `group` consecutive
// values of the tensor, follow the tensor's values (TensorRef::scales).
enum class TensorElement : std::uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12,
  kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kIQ4_XS = 23, kBF16 = 30, kLlama2cQ8 = 0x10000
};
// Elements per block and a block's bytes: {1, 4} for F32, {1, 2} for F16 and BF16, {32, 34} for Q8_0 ...,
// {1, 1} for kLlama2cQ8 (its values; the scales lie apart).
struct ElementBlock {
  std::uint64_t elements, bytes;
};
ElementBlock element_block(TensorElement element);
// "F32", "F16", "BF16", "Q8_0", "Q4_K" ...: ggml's names; "Q8_0 (llama2.c)" for kLlama2cQ8.
std::string element_name(TensorElement element);
// Bytes of n consecutive elements (for a block format, n a multiple of its block's elements).
std::uint64_t tensor_bytes(TensorElement element, std::uint64_t n);

// Where a tensor is: its first byte in the file and its elements' type. at(i) is element i of it (row r of
// a (rows, cols) matrix starts at element r * cols; for a block format, i a multiple of its block).
struct TensorRef {
  std::uint64_t offset = 0;
  TensorElement element = TensorElement::kF32;
  // kLlama2cQ8 only: the file offset of the whole tensor's fp32 scales, its values per scale, and which value
  // of the tensor `offset` is (a slice may start inside a group: the groups run over the flattened tensor).
  std::uint64_t scales = 0;
  std::uint32_t group = 0;
  std::uint64_t first = 0;
  TensorRef at(std::uint64_t index) const {
    TensorRef t = *this;
    t.offset += tensor_bytes(element, index);
    if (element == TensorElement::kLlama2cQ8) t.first += index;
    return t;
  }
  bool operator==(const TensorRef&) const = default;
};
// Bits a weight of the tensor takes in its file: 32 for F32, 16 for F16, 8.5 for Q8_0, 4.5 for Q4_0, 8 + 32 /
// group for kLlama2cQ8 ...
double bits_per_weight(const TensorRef& tensor);

// One layer's tensors, each row-major with rows = output features.
struct LayerTensors {
  TensorRef rms_att;  // (dim)
  TensorRef wq;       // (dim, dim)
  TensorRef wk;       // (kv_dim, dim)
  TensorRef wv;       // (kv_dim, dim)
  TensorRef wo;       // (dim, dim)
  TensorRef rms_ffn;  // (dim)
  TensorRef w1;       // (hidden, dim)
  TensorRef w2;       // (dim, hidden)
  TensorRef w3;       // (hidden, dim)
};

// Every tensor a rank may read: llama2.c stacks each kind over the layers, GGUF puts them wherever its
// tensor table says; the readers only see these references.
struct CheckpointLayout {
  TensorRef token_embedding;        // (vocab, dim)
  TensorRef rms_final;              // (dim)
  TensorRef classifier;             // (vocab, dim): == token_embedding when shared
  std::vector<LayerTensors> layers;  // (n_layers)
  std::uint64_t total_bytes = 0;     // llama2.c: the exact file size the header implies; GGUF: the file's size
  // Whether every tensor is F32 (a legacy or version-1 llama2.c file's are).
  bool all_f32() const;
};

// The llama2.c layout of a model of this shape (header, then the tensors in the fixed order).
CheckpointLayout checkpoint_layout(const partition::ModelShape& shape);

enum class ModelFormat { kLlama2c, kGguf };

// A model file as the engine reads it: its shape, where its tensors are, and the constants of its arithmetic
// that a file may set (GGUF's layer_norm_rms_epsilon, rope.freq_base and rope_freqs; llama2.c's are fixed).
struct ModelFile {
  ModelFormat format = ModelFormat::kLlama2c;
  int llama2c_version = 0;  // llama2.c: 0 (legacy), or export.py's version 1 or 2
  partition::ModelShape shape;
  CheckpointLayout layout;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  // Empty, or head_size / 2 positive divisors of RoPE's pair angles (Llama 3.1's frequency scaling, the
  // tensor rope_freqs.weight of its GGUF files; kernels/cpu/ops.h rope_angles).
  std::vector<float> rope_freq_divisors;
};

// Reads and validates a llama2.c checkpoint (legacy, or export.py's version 1 or 2) or a GGUF file (told apart
// by their magics): the header or metadata, and that every tensor lies inside the file. Throws ResourceError (missing/unreadable) or
// FormatError (nonsense header, size not matching it, a GGUF tensor of a type or shape shardline cannot
// use) with the path and what to do.
ModelFile read_model_file(const std::string& path);
// FormatError unless a llama2.c file of file_bytes is the size its header (named `header` in the message)
// implies for the model: "'m.bin' is truncated: the header (dim 288 ...) implies N bytes but the file has M".
void require_size_the_header_implies(const std::string& path, const std::string& header, const ModelFile& model,
                                     std::uint64_t file_bytes);
// read_model_file(path).shape.
partition::ModelShape read_checkpoint_shape(const std::string& path);

// Writes the 7 x int32 header (negative vocab for an unshared classifier).
void encode_checkpoint_header(const partition::ModelShape& shape, std::int32_t out[7]);

}  // namespace shardline::runtime
