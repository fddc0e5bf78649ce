// int8 weights under tensor parallelism: every TP rank's wo and w2, which it holds as column slices, hold
// exactly the int8 codes and scales one rank holds for those columns, on layouts whose slices fall inside
// int8 groups of one rank: tiny-32k's wo (kv heads of 16 query columns, padded to a block of 32 each:
// runtime::WoInput) and its hidden dim of 172, no multiple of 32 (partition::split_hidden cuts it in blocks
// of 32); mini-gqa's aligned 64-column heads and 384 hidden. Also how WoInput pads for common shapes.
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/weight_format.h"
#include "partition/mesh.h"
#include "partition/model_presets.h"
#include "partition/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/shard_weights.h"
#include "tests/support/models.h"

namespace shardline::runtime {
namespace {

std::vector<float> unpacked(const PackedMatrix& w) {
  std::vector<float> out(static_cast<std::size_t>(w.d) * w.k);
  kernels::cpu::unpack_weights(w, out.data());
  return out;
}

TEST(WoInput, PadsOnlyInt8SegmentsThatAreNoWholeBlock) {
  struct Expected {
    const char* preset;
    int segment, padded, group;
  };
  // 15m: 6 heads of 48, one kv head each; 110m: heads of 64; 1.1b: 8 query heads of 64 per kv head.
  for (const Expected& e : {Expected{"15m", 48, 64, 64}, Expected{"110m", 64, 64, 64}, Expected{"1.1b", 512, 512, 128}}) {
    const partition::ModelShape shape = partition::find_model_preset(e.preset).shape;
    const WoInput in = wo_input(shape, WeightDtype::kInt8);
    EXPECT_EQ(in.segment, e.segment) << e.preset;
    EXPECT_EQ(in.padded_segment, e.padded) << e.preset;
    EXPECT_EQ(in.int8_group, e.group) << e.preset;
    const WoInput fp32 = wo_input(shape, WeightDtype::kF32);
    EXPECT_FALSE(fp32.padded()) << e.preset;
    EXPECT_EQ(fp32.packed_k(shape.dim), shape.dim) << e.preset;
  }
  partition::ModelShape one_kv = partition::find_model_preset("15m").shape;
  one_kv.n_kv_heads = 1;  // no layout slices wo: one segment, the default grouping
  const WoInput mqa = wo_input(one_kv, WeightDtype::kInt8);
  EXPECT_FALSE(mqa.padded());
  EXPECT_EQ(mqa.int8_group, kernels::cpu::default_int8_group(one_kv.dim));
}

TEST(WoInput, SpreadsEachSegmentToItsPaddedPlaceWithZerosAfterIt) {
  const WoInput in{3, 5, 32};
  std::vector<float> row = {1, 2, 3, 4, 5, 6, 7, 8, 9, -1, -1, -1, -1, -1, -1};
  in.spread(row.data(), 9);
  EXPECT_EQ(in.packed_k(9), 15);
  EXPECT_EQ(row, (std::vector<float>{1, 2, 3, 0, 0, 4, 5, 6, 0, 0, 7, 8, 9, 0, 0}));
}

// Whether every TP rank's w2 slice starts on one rank's groups (ShardWeights groups w2 by
// partition::hidden_block): every layout, a hidden dim too narrow for a block a rank included (its empty
// slices start on a border too).
bool w2_slices_on_one_ranks_groups(const partition::ModelShape& shape, int tp) {
  bool on_groups = true;
  for (int rank = 0; rank < tp; ++rank) {
    on_groups = on_groups && partition::split_hidden(shape, tp, rank).begin % partition::hidden_block(shape) == 0;
  }
  return on_groups;
}

TEST(Int8Slices, EveryLayoutsW2SlicesStartOnOneRanksGroups) {
  partition::ModelShape shape = partition::find_model_preset("110m").shape;  // hidden 2048, 12 kv heads
  for (const int tp : {1, 2, 3, 4, 6, 12}) EXPECT_TRUE(w2_slices_on_one_ranks_groups(shape, tp)) << tp;
  shape.hidden_dim = 172;  // tiny-32k's: six blocks of 32, the last one short
  for (const int tp : {2, 3, 4, 6}) EXPECT_TRUE(w2_slices_on_one_ranks_groups(shape, tp)) << tp;
  shape.hidden_dim = 32;  // one block for four ranks: three of them hold none
  EXPECT_TRUE(w2_slices_on_one_ranks_groups(shape, 4));
}

// Each TP rank's unpacked wo and w2 against one rank's: the same values, bit for bit, in the rank's columns
// (wo's in its padded segments, zeros in the padding).
TEST(Int8Slices, EveryTensorParallelRankHoldsOneRanksCodesAndScales) {
  const std::vector<std::pair<std::string, std::vector<int>>> cases = {{"tiny-32k.bin", {2, 4}}, {"mini-gqa.bin", {2}}};
  for (const auto& [model, tps] : cases) SHARDLINE_REQUIRE_MODEL_FILE(test::model_file(model));
  for (const auto& [model, tps] : cases) {
    const std::string path = test::model_file(model);
    const partition::ModelShape shape = read_checkpoint_shape(path);
    const WoInput in = wo_input(shape, WeightDtype::kInt8);
    const auto one_stage = partition::stage_layer_ranges(shape, 1);
    const ShardWeights one(path, shape, partition::shard_for(shape, partition::Mesh::single(), one_stage),
                           {.dtype = WeightDtype::kInt8});
    const std::vector<float> one_wo = unpacked(one.layer(0).wo), one_w2 = unpacked(one.layer(0).w2);
    const int one_wo_k = one.layer(0).wo.k;
    for (const int tp : tps) {
      for (int rank = 0; rank < tp; ++rank) {
        SCOPED_TRACE(model + " tp=" + std::to_string(tp) + " rank " + std::to_string(rank));
        const auto shard = partition::shard_for(shape, partition::Mesh(tp, rank, tp, 1), one_stage);
        const ShardWeights mine(path, shape, shard, {.dtype = WeightDtype::kInt8});
        const PackedMatrix& wo = mine.layer(0).wo;
        const PackedMatrix& w2 = mine.layer(0).w2;
        const int q_columns = shard.heads.size() * shape.head_size();
        ASSERT_EQ(wo.k, in.packed_k(q_columns));
        const int first = shard.heads.begin * shape.head_size() / in.segment * in.padded_segment;
        const std::vector<float> wo_values = unpacked(wo), w2_values = unpacked(w2);
        int differing = 0;
        for (int r = 0; r < shape.dim; ++r) {
          for (int c = 0; c < wo.k; ++c) {
            differing += wo_values[static_cast<std::size_t>(r) * wo.k + c] !=
                         one_wo[static_cast<std::size_t>(r) * one_wo_k + first + c];
            if (c % in.padded_segment >= in.segment) {
              EXPECT_EQ(wo_values[static_cast<std::size_t>(r) * wo.k + c], 0.0f);
            }
          }
          for (int c = 0; c < w2.k; ++c) {
            differing += w2_values[static_cast<std::size_t>(r) * w2.k + c] !=
                         one_w2[static_cast<std::size_t>(r) * shape.hidden_dim + shard.hidden.begin + c];
          }
        }
        EXPECT_EQ(differing, 0);
      }
    }
  }
}

}  // namespace
}  // namespace shardline::runtime
