#include "partition/shard.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::partition {

Range split_evenly(int n, int parts, int index) {
  SL_CHECK(parts >= 1 && index >= 0 && index < parts);
  const int base = n / parts;
  const int extra = n % parts;
  const int begin = index * base + (index < extra ? index : extra);
  const int size = base + (index < extra ? 1 : 0);
  return {begin, begin + size};
}

Range split_in_blocks(int n, int parts, int index, int unit) {
  SL_CHECK(unit >= 1);
  if (n % unit != 0 || n / unit < parts) return split_evenly(n, parts, index);
  const Range blocks = split_evenly(n / unit, parts, index);
  return {blocks.begin * unit, blocks.end * unit};
}

Range split_hidden(int hidden_dim, int tp_size, int tp_rank) {
  for (int unit : {128, 32}) {
    if (hidden_dim % unit == 0 && hidden_dim / unit >= tp_size) return split_in_blocks(hidden_dim, tp_size, tp_rank, unit);
  }
  // A hidden dim that is no multiple of 32 (tiny-32k's 172): blocks of 32 and a short last one, which the
  // last rank takes, so that every slice still starts on a multiple of 32.
  const int blocks = (hidden_dim + 31) / 32;
  if (blocks >= tp_size) {
    const Range b = split_evenly(blocks, tp_size, tp_rank);
    return {b.begin * 32, std::min(b.end * 32, hidden_dim)};
  }
  return split_evenly(hidden_dim, tp_size, tp_rank);
}

std::optional<std::string> find_layout_problem(const ModelShape& shape, int tp_size, int pp_size) {
  if (tp_size < 1 || pp_size < 1) return fmt::format("tp and pp must be >= 1 (tp={} pp={})", tp_size, pp_size);
  if (shape.n_kv_heads % tp_size != 0) {
    return fmt::format("tp={} does not divide n_kv_heads={} (each TP rank must own whole kv heads)", tp_size,
                       shape.n_kv_heads);
  }
  if (shape.n_heads % tp_size != 0) {
    return fmt::format("tp={} does not divide n_heads={}", tp_size, shape.n_heads);
  }
  if (tp_size > shape.hidden_dim) {
    return fmt::format("tp={} exceeds the MLP width hidden_dim={}", tp_size, shape.hidden_dim);
  }
  if (pp_size > shape.n_layers) {
    return fmt::format("pp={} exceeds n_layers={} (every stage needs at least one layer)", pp_size,
                       shape.n_layers);
  }
  return std::nullopt;
}

std::vector<Range> stage_layer_ranges(const ModelShape& shape, int pp_size,
                                      const std::vector<int>& layers_per_stage) {
  std::vector<Range> ranges;
  if (layers_per_stage.empty()) {
    for (int s = 0; s < pp_size; ++s) ranges.push_back(split_evenly(shape.n_layers, pp_size, s));
    return ranges;
  }
  if (static_cast<int>(layers_per_stage.size()) != pp_size) {
    throw ConfigError(fmt::format("layer split names {} stages but pp={}", layers_per_stage.size(), pp_size));
  }
  const int total = std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), 0);
  if (total != shape.n_layers) {
    throw ConfigError(fmt::format("layer split sums to {} but the model has {} layers", total, shape.n_layers));
  }
  int begin = 0;
  for (int count : layers_per_stage) {
    if (count < 1) throw ConfigError("every stage of a layer split needs at least one layer");
    ranges.push_back({begin, begin + count});
    begin += count;
  }
  return ranges;
}

RankShard shard_for(const ModelShape& shape, const Mesh& mesh, const std::vector<Range>& stage_layers) {
  SL_CHECK(!find_layout_problem(shape, mesh.tp_size(), mesh.pp_size()));
  SL_CHECK(static_cast<int>(stage_layers.size()) == mesh.pp_size());
  RankShard shard;
  shard.layers = stage_layers[mesh.pp_rank()];
  shard.kv_heads = split_evenly(shape.n_kv_heads, mesh.tp_size(), mesh.tp_rank());
  const int group = shape.n_heads / shape.n_kv_heads;
  shard.heads = {shard.kv_heads.begin * group, shard.kv_heads.end * group};
  shard.hidden = split_hidden(shape.hidden_dim, mesh.tp_size(), mesh.tp_rank());
  shard.has_embedding = mesh.is_first_stage();
  shard.has_classifier = mesh.is_last_stage();
  if (shard.has_classifier) shard.vocab = split_evenly(shape.vocab_size, mesh.tp_size(), mesh.tp_rank());
  return shard;
}

}  // namespace shardline::partition
