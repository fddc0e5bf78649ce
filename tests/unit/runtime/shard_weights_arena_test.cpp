// Weights and the arena: the up-front size (ShardWeights::arena_bytes_needed) holds every rank's repacked
// slices, or all its slices with copy_to_arena, in one chunk, for several TP x PP layouts; and the copies
// are the same numbers as the mapped slices.
#include <cstring>

#include <gtest/gtest.h>

#include "memory/arena.h"
#include "partition/mesh.h"
#include "partition/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/shard_weights.h"
#include "tests/support/models.h"

namespace shardline::runtime {
namespace {

bool same_floats(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

TEST(ShardWeightsArena, SizedUpFrontForEveryRankOfSeveralLayouts) {
  for (const std::string model : {"tiny-32k.bin", "mini-gqa.bin"}) {
    SHARDLINE_REQUIRE_MODEL_FILE(test::model_file(model));
    const std::string path = test::model_file(model);
    const partition::ModelShape shape = read_checkpoint_shape(path);
    for (const auto& [tp, pp] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 2}, {2, 3}}) {
      const auto stages = partition::stage_layer_ranges(shape, pp);
      for (int rank = 0; rank < tp * pp; ++rank) {
        const auto shard = partition::shard_for(shape, partition::Mesh(tp * pp, rank, tp, pp), stages);
        SCOPED_TRACE(model + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " rank " + std::to_string(rank));
        for (bool copy : {false, true}) {
          const std::uint64_t needed = ShardWeights::arena_bytes_needed(shape, shard, copy);
          memory::Arena arena({.initial_bytes = needed, .growth_bytes = 1, .pages = memory::PagePolicy::kSmall});
          const std::uint64_t first_chunk = arena.reserved_bytes();
          ShardWeights weights(path, shape, shard, {.arena = &arena, .copy_to_arena = copy});
          EXPECT_EQ(arena.n_chunks(), 1) << "needed " << needed << ", used " << arena.used_bytes();
          EXPECT_LE(arena.used_bytes(), first_chunk);
          EXPECT_LE(arena.used_bytes(), needed) << "the estimate must cover what loading takes";
          EXPECT_EQ(weights.copied_bytes() > 0, copy);
          if (copy) {
            EXPECT_EQ(weights.mapped_bytes(), 0u);
            EXPECT_TRUE(arena.contains(weights.layer(0).wq));
          }
        }
      }
    }
  }
}

TEST(ShardWeightsArena, CopiesHoldTheSameNumbersAsTheMappings) {
  SHARDLINE_REQUIRE_MODEL_FILE(test::model_file("mini-gqa.bin"));
  const std::string path = test::model_file("mini-gqa.bin");
  const partition::ModelShape shape = read_checkpoint_shape(path);
  const auto stages = partition::stage_layer_ranges(shape, 2);
  const auto shard = partition::shard_for(shape, partition::Mesh(4, 3, 2, 2), stages);  // tp 1 of stage 1
  ShardWeights mapped(path, shape, shard);
  ShardWeights copied(path, shape, shard, {.copy_to_arena = true});
  const std::size_t d = shape.dim, q = shard.heads.size() * shape.head_size(), h = shard.hidden.size();
  for (int l = 0; l < mapped.n_local_layers(); ++l) {
    const LayerWeights& a = mapped.layer(l);
    const LayerWeights& b = copied.layer(l);
    EXPECT_TRUE(same_floats(a.wq, b.wq, q * d)) << l;
    EXPECT_TRUE(same_floats(a.wo, b.wo, d * q)) << l;
    EXPECT_TRUE(same_floats(a.w1, b.w1, h * d)) << l;
    EXPECT_TRUE(same_floats(a.w2, b.w2, d * h)) << l;
    EXPECT_TRUE(same_floats(a.rms_ffn, b.rms_ffn, d)) << l;
  }
  EXPECT_TRUE(same_floats(mapped.classifier(), copied.classifier(), shard.vocab.size() * d));
}

}  // namespace
}  // namespace shardline::runtime
