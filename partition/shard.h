// Which rows/columns of which weights a rank owns: pure functions returning slice descriptors.
//
// Megatron-style TP (one all-reduce after attention, one after the MLP):
//   wq, wk, wv  split by output rows = whole heads      (kv heads too: tp must divide n_kv_heads)
//   wo          split by input columns = the same heads  -> partial sums, all-reduce
//   w1, w3      split by output rows of the hidden dim   (uneven allowed: 260 over 3 = 87, 87, 86; in
//               whole blocks of 128, else of 32, where the width allows: 2048 over 3 = 768, 640, 640)
//   w2          split by input columns of the hidden dim -> partial sums, all-reduce
//   classifier  split by vocab rows across the last stage's TP ranks, logits gathered
// PP: contiguous layer ranges per stage, uneven allowed (7 layers over 3 stages = 3, 2, 2).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "partition/mesh.h"
#include "partition/model_shape.h"

namespace shardline::partition {

// Half-open [begin, end).
struct Range {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool operator==(const Range&) const = default;
};

// Part `index` of n items cut into `parts` contiguous pieces; the first n % parts pieces get one more.
Range split_evenly(int n, int parts, int index);

// The same in whole blocks of `unit` items when n is a multiple of unit and there are at least `parts`
// blocks (every piece then starts and ends on a block boundary), else split_evenly.
Range split_in_blocks(int n, int parts, int index, int unit);

// The hidden dim's TP split: in whole blocks of 128 features where hidden is a multiple of 128 with at
// least one block per rank, else of 32 where there are as many blocks of 32 as ranks (the last one short
// where hidden is no multiple of 32; the last rank takes it), else evenly. w2's column slices then start
// on multiples of its int8 scale group (128 where hidden has a block of 128 for each of n_kv_heads ranks,
// the most any layout has; else 32: runtime/shard_weights.cpp), so every rank's slice quantises exactly as
// one rank quantises those columns. Only a hidden dim of fewer than 32 x (tp - 1) + 1 features is cut evenly.
Range split_hidden(int hidden_dim, int tp_size, int tp_rank);

// One rank's share of the model.
struct RankShard {
  Range layers;    // transformer layers of this rank's stage
  Range heads;     // query heads (TP)
  Range kv_heads;  // key/value heads (TP)
  Range hidden;    // MLP hidden features (TP)
  Range vocab;     // classifier rows (TP, last stage only; empty elsewhere)
  bool has_embedding = false;   // first stage looks tokens up
  bool has_classifier = false;  // last stage produces logits
};

// Why tp x pp cannot serve this model, or nullopt. E.g. "tp=3 does not divide n_kv_heads=4".
std::optional<std::string> find_layout_problem(const ModelShape& shape, int tp_size, int pp_size);

// Layer ranges per stage. Without explicit counts: split evenly. With counts (one per stage, each >= 1,
// summing to n_layers) the planner's balanced split is used. Throws ConfigError on bad counts.
std::vector<Range> stage_layer_ranges(const ModelShape& shape, int pp_size,
                                      const std::vector<int>& layers_per_stage = {});

// The slices this rank owns. Layout must be valid (find_layout_problem() == nullopt).
RankShard shard_for(const ModelShape& shape, const Mesh& mesh, const std::vector<Range>& stage_layers);

}  // namespace shardline::partition
