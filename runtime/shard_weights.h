// One rank's weights. Every weight matrix of the rank's slices is converted once, at load, into the rank's
// arena (hugepages when it has them, bound to its NUMA node) in the kernels' packed layout and the dtype
// asked for (fp32, bf16 or int8; see kernels/cpu/weight_format.h): its file pages are mapped only while
// they are read, so they do not stay in the rank's resident set. The norms stay zero-copy mappings,
// populated and bound to the node, and so does the token embedding, looked up one row per token (with
// copy_to_arena those are read into the arena too; a GGUF file's F16, BF16 or quantised norms and embedding are
// widened into rank-local fp32 copies either way). Nothing else of the file is mapped, so resident memory
// scales with the shard.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/bandwidth_probe.h"
#include "kernels/cpu/weight_format.h"
#include "memory/arena.h"
#include "memory/mapped_file.h"
#include "partition/model_shape.h"
#include "partition/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/weight_memory.h"

namespace shardline::runtime {

class LoadWatch;  // runtime/load_watch.h

using kernels::cpu::PackedMatrix;
using kernels::cpu::WeightDtype;

// Shapes use the rank-local sizes: q_dim = local heads * head_size, kv_dim = local kv heads * head_size,
// hidden = local hidden features. Matrices are (d, k) = (output features, input features).
struct LayerWeights {
  const float* rms_att = nullptr;  // (dim)
  PackedMatrix wq;                 // (q_dim, dim)
  PackedMatrix wk;                 // (kv_dim, dim)
  PackedMatrix wv;                 // (kv_dim, dim)
  PackedMatrix wo;                 // (dim, q_dim), or (dim, wo_input().packed_k(q_dim)) where bf16 or int8 pads it
  const float* rms_ffn = nullptr;  // (dim)
  PackedMatrix w1;                 // (hidden, dim)
  PackedMatrix w2;                 // (dim, hidden)
  PackedMatrix w3;                 // (hidden, dim)
};

// How wo's packed k holds its input, the attention output (this rank's query heads, head_size values each).
// A kv head's query columns are one of wo's reduction segments (partition::n_reduction_segments): its product
// is computed on its own and the products are added in order, on every layout (kernels::cpu::matmul_segments).
// int8 scales wo in groups inside the segments, and the bf16-dot kernels read k in blocks of 32, so for both
// a segment that is no multiple of 32 is padded with zeros to whole blocks (tiny-32k's 16 columns to 32,
// heads of 48 to 64), on every layout, one rank included: each rank quantises exactly one rank's groups, and
// each segment starts where a kernel can start. fp32, and segments of whole blocks, are not padded.
struct WoInput {
  int segment = 1;         // input values per segment
  int padded_segment = 1;  // a segment's width in wo's packed k (== segment: no padding)
  int int8_group = 0;      // int8's k values per scale (0: not int8)

  bool padded() const { return padded_segment != segment; }
  // wo's k for q_columns input values (whole segments).
  int packed_k(int q_columns) const { return q_columns / segment * padded_segment; }
  // A row of q_columns values spread in place to packed_k(q_columns) of them, each segment at its padded
  // place with zeros after it. The row must hold packed_k(q_columns) floats.
  void spread(float* row, int q_columns) const;
  // The segments' borders in wo's packed k for q_columns input values: 0, padded_segment, ..., packed_k.
  std::vector<int> bounds(int q_columns) const;
};
WoInput wo_input(const partition::ModelShape& shape, WeightDtype dtype);

struct ShardWeightsOptions {
  WeightDtype dtype = WeightDtype::kF32;  // what every weight matrix is converted to
  memory::Arena* arena = nullptr;  // converted matrices live here (it must outlive the weights); nullptr: heap
  int numa_node = -1;              // bind the mapped ranges to this node; -1: unbound
  bool copy_to_arena = false;      // read the norms and the embedding into the arena instead of mapping them
  LoadWatch* load_watch = nullptr;  // told of each tensor read (and armed for the construction); may be null
};

class ShardWeights {
 public:
  // Validates the file against `shape` first (size, header); throws FormatError / ResourceError. Converts
  // with the kernel threads (kernels::cpu::set_num_threads).
  ShardWeights(const std::string& path, const partition::ModelShape& shape, const partition::RankShard& shard,
               const ShardWeightsOptions& options = {});

  const partition::ModelShape& shape() const { return shape_; }
  const partition::RankShard& shard() const { return shard_; }
  WeightDtype dtype() const { return options_.dtype; }
  WoInput wo_input() const { return runtime::wo_input(shape_, options_.dtype); }

  const float* token_embedding() const { return token_embedding_; }  // (vocab, dim); first stage only
  const LayerWeights& layer(int local_index) const { return layers_[local_index]; }
  int n_local_layers() const { return static_cast<int>(layers_.size()); }
  const float* rms_final() const { return rms_final_; }         // (dim); last stage only
  const PackedMatrix& classifier() const { return classifier_; }  // (vocab slice, dim); last stage only

  // Arena bytes this shard's weights take (converted matrices, and with copy_to_arena the norms and the
  // embedding), alignment included: for sizing the arena before loading.
  static std::uint64_t arena_bytes_needed(const partition::ModelShape& shape, const partition::RankShard& shard,
                                          WeightDtype dtype, bool copy_to_arena);

  // Bytes still mapped from the file (norms, token embedding).
  std::uint64_t mapped_bytes() const { return mapped_bytes_; }
  std::uint64_t copied_bytes() const { return copied_bytes_; }  // norms/embedding copied (arena or widened)
  // Bytes of weight matrices converted into rank-local memory.
  std::uint64_t repacked_bytes() const { return repacked_bytes_; }
  // The rank-local buffers a forward pass streams, in the order it reads them (for the bandwidth probe).
  std::vector<kernels::cpu::ReadRegion> streamed_regions() const;

 private:
  // n_floats of the tensor as fp32: mapped in place (F32), or converted into the arena or an owned buffer.
  const float* map_floats(TensorRef tensor, std::uint64_t n_floats, bool populate);
  // The n floats of `matrix` as fp32 while `mapped` or `widened` (whichever it fills) lives: the file's pages
  // mapped in place (F32), else decoded into `widened`.
  const float* matrix_floats(TensorRef matrix, std::uint64_t n, std::optional<memory::MappedRegion>& mapped,
                             std::unique_ptr<float[]>& widened);
  // Converts rows [0, rows) x columns [columns.begin, columns.end) of the (rows, cols) matrix at `matrix`;
  // int8_group: int8's k values per scale (0: the default for the slice's k). Into `into` (packed_size of
  // the result's bytes) where given, else into memory of its own.
  PackedMatrix convert(TensorRef matrix, int rows, int cols, partition::Range columns, int int8_group = 0,
                       std::byte* into = nullptr);
  // W (rows, k), row_stride floats apart, packed into `into` (or memory of its own where null).
  PackedMatrix pack(const float* w, std::size_t row_stride, int rows, int k, int int8_group, std::byte* into);
  // wo's column slice `columns`, laid out as `input` says (WoInput::spread on every row where it pads).
  PackedMatrix convert_wo(TensorRef matrix, partition::Range columns, const WoInput& input);
  // Rank-local memory for bytes of packed weights: from the arena where there is one, else owned.
  std::byte* allocate_packed(std::size_t bytes);

  partition::ModelShape shape_;
  partition::RankShard shard_;
  ShardWeightsOptions options_;
  memory::MappedFile file_;
  std::vector<memory::MappedRegion> regions_;
  std::vector<WeightMemory> converted_;
  std::vector<std::vector<float>> widened_;  // norms and embedding not F32 in the file, as fp32 (outside an arena)
  std::vector<LayerWeights> layers_;
  const float* token_embedding_ = nullptr;
  const float* rms_final_ = nullptr;
  PackedMatrix classifier_;
  std::uint64_t mapped_bytes_ = 0;
  std::uint64_t repacked_bytes_ = 0;
  std::uint64_t copied_bytes_ = 0;
};

}  // namespace shardline::runtime
