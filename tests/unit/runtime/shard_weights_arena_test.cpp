// Weights and the arena: the up-front size (ShardWeights::arena_bytes_needed) holds every rank's converted
// matrices (fp32 and int8), and with copy_to_arena its norms and embedding too, in one chunk, for several TP x
// PP layouts;
// and the arena's copies are the same numbers as the heap/mapped ones.
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
bool same_packed(const kernels::cpu::PackedMatrix& a, const kernels::cpu::PackedMatrix& b) {
  return a.size_bytes() == b.size_bytes() && std::memcmp(a.data, b.data, a.size_bytes()) == 0;
}

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
        // int8 pads wo's k on tiny-32k (runtime::WoInput), which the estimate must count.
        for (const auto& [dtype, copy] : std::vector<std::pair<WeightDtype, bool>>{
                 {WeightDtype::kF32, false}, {WeightDtype::kF32, true}, {WeightDtype::kInt8, false}}) {
          const std::uint64_t needed = ShardWeights::arena_bytes_needed(shape, shard, dtype, copy);
          memory::Arena arena({.initial_bytes = needed, .growth_bytes = 1, .pages = memory::PagePolicy::kSmall});
          const std::uint64_t first_chunk = arena.reserved_bytes();
          ShardWeights weights(path, shape, shard, {.dtype = dtype, .arena = &arena, .copy_to_arena = copy});
          EXPECT_EQ(arena.n_chunks(), 1) << "needed " << needed << ", used " << arena.used_bytes();
          EXPECT_LE(arena.used_bytes(), first_chunk);
          EXPECT_LE(arena.used_bytes(), needed) << "the estimate must cover what loading takes";
          EXPECT_EQ(weights.copied_bytes() > 0, copy);
          EXPECT_TRUE(arena.contains(weights.layer(0).wq.data));  // converted matrices always live there
          if (copy) {
            EXPECT_EQ(weights.mapped_bytes(), 0u);
            EXPECT_TRUE(arena.contains(weights.layer(0).rms_att));
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
  memory::Arena arena({.initial_bytes = ShardWeights::arena_bytes_needed(shape, shard, WeightDtype::kF32, true)});
  ShardWeights copied(path, shape, shard, {.arena = &arena, .copy_to_arena = true});
  const std::size_t d = shape.dim, q = shard.heads.size() * shape.head_size(), h = shard.hidden.size();
  for (int l = 0; l < mapped.n_local_layers(); ++l) {
    const LayerWeights& a = mapped.layer(l);
    const LayerWeights& b = copied.layer(l);
    EXPECT_TRUE(same_packed(a.wq, b.wq)) << l;
    EXPECT_TRUE(same_packed(a.wo, b.wo)) << l;
    EXPECT_TRUE(same_packed(a.w1, b.w1)) << l;
    EXPECT_TRUE(same_packed(a.w2, b.w2)) << l;
    EXPECT_TRUE(same_floats(a.rms_ffn, b.rms_ffn, d)) << l;
  }
  EXPECT_TRUE(same_packed(mapped.classifier(), copied.classifier()));
  (void)q;
  (void)h;
}

}  // namespace
}  // namespace shardline::runtime
