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

// Reduction segments. The row-parallel matmuls, wo (k = the query heads' columns) and w2 (k = hidden),
// are where tensor parallelism adds partial sums over k, and float addition depends on its order. So both
// are computed in n_kv_heads segments along k, the same on every layout: wo's are the kv heads' query
// columns, w2's hidden_segment()s. Each segment's product starts at zero and the products are added
// segment by segment in order (kernels::cpu::matmul_segments), on one rank in its tiles; under TP each rank
// adds its own onto the sum of the segments before them, received from the rank before, and passes it on
// (comm::Communicator::ordered_sum; a rank holds n_kv_heads / tp whole segments, tp dividing n_kv_heads).
// Every layout then adds the same floats in the same order: one rank's bits, so the same tokens, greedy or
// sampled, for every weight and cache dtype.
int n_reduction_segments(const ModelShape& shape);
// Rows of segment products a TP rank holds and sums at once: a batch-16 decode step in one ordered sum; a
// prefill chunk of 512 rows in eight, each computing its rows' products again from the weights (the
// products of a whole chunk would take n_kv_heads / tp times its rows of memory).
inline constexpr int kSegmentSumRows = 64;

// The hidden dim's unit for w2's segments and TP slices: 128 features where hidden is a multiple of 128 with
// a block for each of the n_kv_heads segments, else 32 (the last block short where hidden is no multiple of
// 32). w2's int8 scale groups are this unit: every segment and slice quantises as one rank quantises its
// columns, and every segment starts where the bf16 and int8 kernels can start one.
int hidden_block(const ModelShape& shape);
// Segment `index` of hidden: blocks floor(index * B / S) to floor((index + 1) * B / S) of the B blocks,
// S = n_reduction_segments(), the last one ending at hidden_dim; empty where B < S (a toy width).
Range hidden_segment(const ModelShape& shape, int index);
// The hidden dim's TP split (tp divides n_kv_heads): tp_rank's n_kv_heads / tp consecutive segments, blocks
// floor(r B / tp) to floor((r + 1) B / tp), so ranks differ by one block at most. A toy width of fewer
// blocks than ranks (hidden under 32 x (tp - 1) + 1) leaves some ranks none: their w2 adds nothing to the
// ordered sum, and every layout still gives one rank's bits (an all-reduce over even slices did not).
Range split_hidden(const ModelShape& shape, int tp_size, int tp_rank);
// The borders of w2's (non-empty) segments within tp_rank's hidden slice, from 0 to its size: {0} for an
// empty slice.
std::vector<int> local_hidden_bounds(const ModelShape& shape, int tp_size, int tp_rank);

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

// What is wrong with an explicit layer split (one count per stage, each >= 1, summing to n_layers) for
// pp_size stages, or nullopt; n_layers < 0: the model is not known yet (launch-check without --model), its
// sum is not checked. E.g. "names 3 stages but pp=2".
std::optional<std::string> layer_split_problem(const std::vector<int>& layers_per_stage, int pp_size, int n_layers = -1);

// Layer ranges per stage. Without explicit counts: split evenly. With counts (one per stage, each >= 1,
// summing to n_layers) the planner's balanced split is used. Throws ConfigError on bad counts
// ("layer split " + layer_split_problem()).
std::vector<Range> stage_layer_ranges(const ModelShape& shape, int pp_size,
                                      const std::vector<int>& layers_per_stage = {});

// The slices this rank owns. Layout must be valid (find_layout_problem() == nullopt).
RankShard shard_for(const ModelShape& shape, const Mesh& mesh, const std::vector<Range>& stage_layers);

}  // namespace shardline::partition
