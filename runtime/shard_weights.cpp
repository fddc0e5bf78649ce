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
                           const partition::RankShard& shard)
    : shape_(shape), shard_(shard), file_(path) {
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
    classifier_ = map_floats(at.classifier + static_cast<std::uint64_t>(shard.vocab.begin) * d * kF,
                             static_cast<std::uint64_t>(shard.vocab.size()) * d, true);
  }
}

const float* ShardWeights::map_floats(std::uint64_t offset_bytes, std::uint64_t n_floats, bool populate) {
  regions_.push_back(file_.map(offset_bytes, n_floats * kF, {.populate = populate}));
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
  std::vector<float> packed(static_cast<std::size_t>(rows) * columns.size());  // (rows, columns.size())
  for (int r = 0; r < rows; ++r) {
    std::memcpy(packed.data() + static_cast<std::size_t>(r) * columns.size(),
                src + static_cast<std::size_t>(r) * cols + columns.begin, columns.size() * kF);
  }
  repacked_bytes_ += packed.size() * kF;
  repacked_.push_back(std::move(packed));
  return repacked_.back().data();
}

}  // namespace shardline::runtime
