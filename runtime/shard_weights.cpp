#include "runtime/shard_weights.h"

#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "runtime/checkpoint.h"

namespace shardline::runtime {

namespace {
constexpr std::uint64_t kF = sizeof(float);
}

ShardWeights::ShardWeights(const std::string& path, const partition::ModelShape& shape,
                           const partition::RankShard& shard, const WeightPlacement& placement)
    : shape_(shape), shard_(shard), file_(path), placement_(placement) {
  if (!placement_.arena) {
    own_arena_ = std::make_unique<memory::Arena>(
        memory::ArenaOptions{.initial_bytes = arena_bytes_needed(shape, shard, placement.copy_to_arena)});
    placement_.arena = own_arena_.get();
  }
  const partition::ModelShape on_disk = read_checkpoint_shape(path);
  if (!(on_disk == shape)) {
    throw FormatError(fmt::format("'{}' holds a model of shape ({}) but ({}) was expected", path,
                                  on_disk.describe(), shape.describe()));
  }
  const CheckpointLayout at = checkpoint_layout(shape);
  const std::uint64_t d = shape.dim, h = shape.hidden_dim, kv = shape.kv_dim(), hs = shape.head_size();
  const std::uint64_t q_rows = shard.heads.size() * hs, kv_rows = shard.kv_heads.size() * hs;
  const std::uint64_t q_begin = shard.heads.begin * hs, kv_begin = shard.kv_heads.begin * hs;
  const std::uint64_t h_rows = shard.hidden.size(), h_begin = shard.hidden.begin;
  const bool whole_heads = shard.heads.begin == 0 && shard.heads.end == shape.n_heads;
  const bool whole_hidden = shard.hidden.begin == 0 && shard.hidden.end == shape.hidden_dim;

  if (shard.has_embedding) {
    // Looked up by token id, so any row may be needed; not populated: only rows actually used fault in.
    token_embedding_ = map_floats(at.token_embedding, shape.vocab_size * d, false);
  }
  for (int l = shard.layers.begin; l < shard.layers.end; ++l) {
    LayerWeights w;
    w.rms_att = map_floats(at.rms_att + l * d * kF, d, true);
    w.rms_ffn = map_floats(at.rms_ffn + l * d * kF, d, true);
    w.wq = map_floats(at.wq + (l * d * d + q_begin * d) * kF, q_rows * d, true);
    w.wk = map_floats(at.wk + (l * kv * d + kv_begin * d) * kF, kv_rows * d, true);
    w.wv = map_floats(at.wv + (l * kv * d + kv_begin * d) * kF, kv_rows * d, true);
    w.w1 = map_floats(at.w1 + (l * h * d + h_begin * d) * kF, h_rows * d, true);
    w.w3 = map_floats(at.w3 + (l * h * d + h_begin * d) * kF, h_rows * d, true);
    w.wo = whole_heads ? map_floats(at.wo + l * d * d * kF, d * d, true)
                       : repack_columns(at.wo + l * d * d * kF, shape.dim, shape.dim,
                                        {static_cast<int>(q_begin), static_cast<int>(q_begin + q_rows)});
    w.w2 = whole_hidden ? map_floats(at.w2 + l * d * h * kF, d * h, true)
                        : repack_columns(at.w2 + l * d * h * kF, shape.dim, shape.hidden_dim, shard.hidden);
    layers_.push_back(w);
  }
  if (shard.has_classifier) {
    rms_final_ = map_floats(at.rms_final, d, true);
    if (placement_.copy_to_arena && shape.shared_classifier && token_embedding_) {
      // One copy serves both: the shared classifier is the embedding's rows.
      classifier_ = token_embedding_ + static_cast<std::uint64_t>(shard.vocab.begin) * d;
    } else {
      classifier_ = map_floats(at.classifier + static_cast<std::uint64_t>(shard.vocab.begin) * d * kF,
                               static_cast<std::uint64_t>(shard.vocab.size()) * d, true);
    }
  }
}

std::uint64_t ShardWeights::arena_bytes_needed(const partition::ModelShape& shape, const partition::RankShard& shard,
                                               bool copy_to_arena) {
  // Mirrors the constructor: which slices are repacked, and with copy_to_arena every slice it maps.
  const std::uint64_t d = shape.dim, h = shape.hidden_dim, hs = shape.head_size();
  const std::uint64_t q_rows = shard.heads.size() * hs, kv_rows = shard.kv_heads.size() * hs;
  const std::uint64_t h_rows = shard.hidden.size(), n_layers = shard.layers.size();
  const bool whole_heads = shard.heads.begin == 0 && shard.heads.end == shape.n_heads;
  const bool whole_hidden = shard.hidden.begin == 0 && shard.hidden.end == shape.hidden_dim;
  const std::uint64_t repacked_per_layer = (whole_heads ? 0 : d * q_rows) + (whole_hidden ? 0 : d * h_rows);
  std::uint64_t floats = n_layers * repacked_per_layer;
  if (copy_to_arena) {
    floats += n_layers * (2 * d + q_rows * d + 2 * kv_rows * d + 2 * h_rows * d + (whole_heads ? d * d : 0) +
                          (whole_hidden ? d * h : 0));
    if (shard.has_embedding) floats += static_cast<std::uint64_t>(shape.vocab_size) * d;
    if (shard.has_classifier) floats += d;  // rms_final
    if (shard.has_classifier && !(shape.shared_classifier && shard.has_embedding)) {
      floats += static_cast<std::uint64_t>(shard.vocab.size()) * d;
    }
  }
  const std::uint64_t allocations = n_layers * 9 + 3;  // each padded to 64-byte alignment at most
  return floats * kF + allocations * 64;
}

const float* ShardWeights::map_floats(std::uint64_t offset_bytes, std::uint64_t n_floats, bool populate) {
  if (placement_.copy_to_arena) {
    float* copy = placement_.arena->allocate<float>(n_floats);
    file_.read(offset_bytes, copy, n_floats * kF);
    copied_bytes_ += n_floats * kF;
    return copy;
  }
  regions_.push_back(file_.map(offset_bytes, n_floats * kF, {.populate = populate, .numa_node = placement_.numa_node}));
  mapped_bytes_ += n_floats * kF;
  return regions_.back().as<float>();
}

const float* ShardWeights::repack_columns(std::uint64_t matrix_offset_bytes, int rows, int cols,
                                          partition::Range columns) {
  // The mapping is dropped on return: its pages were only read to copy this rank's columns, so they do
  // not stay in the rank's resident set.
  memory::MappedRegion whole =
      file_.map(matrix_offset_bytes, static_cast<std::uint64_t>(rows) * cols * kF, {.populate = false});
  const float* src = whole.as<float>();
  // (rows, columns.size()), in the arena
  float* packed = placement_.arena->allocate<float>(static_cast<std::size_t>(rows) * columns.size());
  for (int r = 0; r < rows; ++r) {
    std::memcpy(packed + static_cast<std::size_t>(r) * columns.size(),
                src + static_cast<std::size_t>(r) * cols + columns.begin, columns.size() * kF);
  }
  repacked_bytes_ += static_cast<std::uint64_t>(rows) * columns.size() * kF;
  return packed;
}

}  // namespace shardline::runtime
