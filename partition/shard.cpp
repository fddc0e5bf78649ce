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

int n_reduction_segments(const ModelShape& shape) { return shape.n_kv_heads; }

int hidden_block(const ModelShape& shape) {
  const int hidden = shape.hidden_dim;
  return hidden % 128 == 0 && hidden / 128 >= n_reduction_segments(shape) ? 128 : 32;
}

namespace {

// Blocks floor(i B / parts) to floor((i + 1) B / parts) of hidden's B blocks of `unit` (the last one short):
// empty where B < parts.
Range floor_blocks(int hidden, int unit, int parts, int index) {
  const long long blocks = (hidden + unit - 1) / unit;
  const int begin = static_cast<int>(index * blocks / parts) * unit;
  const int end = static_cast<int>((index + 1) * blocks / parts) * unit;
  return {std::min(begin, hidden), std::min(end, hidden)};
}

}  // namespace

Range hidden_segment(const ModelShape& shape, int index) {
  SL_CHECK(index >= 0 && index < n_reduction_segments(shape));
  return floor_blocks(shape.hidden_dim, hidden_block(shape), n_reduction_segments(shape), index);
}

Range split_hidden(const ModelShape& shape, int tp_size, int tp_rank) {
  SL_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size && n_reduction_segments(shape) % tp_size == 0);
  return floor_blocks(shape.hidden_dim, hidden_block(shape), tp_size, tp_rank);
}

std::vector<int> local_hidden_bounds(const ModelShape& shape, int tp_size, int tp_rank) {
  const Range slice = split_hidden(shape, tp_size, tp_rank);
  std::vector<int> bounds;
  const int per_rank = n_reduction_segments(shape) / tp_size;
  for (int s = tp_rank * per_rank; s < (tp_rank + 1) * per_rank; ++s) {
    const Range segment = hidden_segment(shape, s);
    if (segment.empty()) continue;  // fewer blocks than segments: a segment may hold none
    SL_CHECK(segment.begin >= slice.begin && segment.end <= slice.end);  // a rank holds whole segments
    bounds.push_back(segment.begin - slice.begin);
  }
  bounds.push_back(slice.size());
  return bounds;
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
  if (pp_size > shape.n_layers) {
    return fmt::format("pp={} exceeds n_layers={} (every stage needs at least one layer)", pp_size,
                       shape.n_layers);
  }
  return std::nullopt;
}

std::optional<std::string> layer_split_problem(const std::vector<int>& layers_per_stage, int pp_size, int n_layers) {
  const std::size_t stages = layers_per_stage.size();
  if (static_cast<int>(stages) != pp_size) {
    return fmt::format("names {} stage{} but pp={}", stages, stages == 1 ? "" : "s", pp_size);
  }
  for (std::size_t s = 0; s < stages; ++s) {
    if (layers_per_stage[s] < 1) {
      return fmt::format("gives stage {} {} layers; every stage needs at least one", s, layers_per_stage[s]);
    }
  }
  const long total = std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), 0L);
  if (n_layers >= 0 && total != n_layers) {
    return fmt::format("sums to {} but the model has {} layer{}", total, n_layers, n_layers == 1 ? "" : "s");
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
  if (auto problem = layer_split_problem(layers_per_stage, pp_size, shape.n_layers)) {
    throw ConfigError("layer split " + *problem);
  }
  int begin = 0;
  for (int count : layers_per_stage) {
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
  shard.hidden = split_hidden(shape, mesh.tp_size(), mesh.tp_rank());
  shard.has_embedding = mesh.is_first_stage();
  shard.has_classifier = mesh.is_last_stage();
  if (shard.has_classifier) shard.vocab = split_evenly(shape.vocab_size, mesh.tp_size(), mesh.tp_rank());
  return shard;
}

}  // namespace shardline::partition
