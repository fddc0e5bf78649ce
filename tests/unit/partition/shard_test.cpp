#include <algorithm>

#include <gtest/gtest.h>

#include "common/error.h"
#include "partition/shard.h"

namespace shardline::partition {
namespace {

ModelShape shape(int dim, int hidden, int layers, int heads, int kv, int vocab) {
  ModelShape s;
  s.dim = dim;
  s.hidden_dim = hidden;
  s.n_layers = layers;
  s.n_heads = heads;
  s.n_kv_heads = kv;
  s.vocab_size = vocab;
  s.seq_len = 64;
  return s;
}

TEST(SplitEvenly, CoversEverythingOnceAndDiffersByAtMostOne) {
  for (int n = 0; n <= 40; ++n) {
    for (int parts = 1; parts <= 8; ++parts) {
      int next = 0;
      for (int i = 0; i < parts; ++i) {
        const Range r = split_evenly(n, parts, i);
        EXPECT_EQ(r.begin, next);
        EXPECT_TRUE(r.size() == n / parts || r.size() == n / parts + 1);
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
  }
  // The example: 260 hidden features over 3 ranks.
  EXPECT_EQ(split_evenly(260, 3, 0), (Range{0, 87}));
  EXPECT_EQ(split_evenly(260, 3, 1), (Range{87, 174}));
  EXPECT_EQ(split_evenly(260, 3, 2), (Range{174, 260}));
}

// In whole blocks where the width is a multiple of the block and has enough of them; evenly otherwise.
TEST(SplitInBlocks, WholeBlocksWhereTheWidthAllows) {
  EXPECT_EQ(split_in_blocks(2048, 3, 0, 32), (Range{0, 704}));
  EXPECT_EQ(split_in_blocks(2048, 3, 1, 32), (Range{704, 1376}));
  EXPECT_EQ(split_in_blocks(2048, 3, 2, 32), (Range{1376, 2048}));
  EXPECT_EQ(split_in_blocks(2048, 2, 1, 32), (Range{1024, 2048}));
  EXPECT_EQ(split_in_blocks(260, 3, 1, 32), split_evenly(260, 3, 1));  // not a multiple of 32
  EXPECT_EQ(split_in_blocks(64, 3, 2, 32), split_evenly(64, 3, 2));    // two blocks for three parts
}

// The hidden split: n_kv_heads segments of blocks of 128 where the width has one per segment, else of 32
// (the last one short where the width is no multiple of 32); a TP rank takes whole segments, balanced to a
// block, and a shard's hidden slice uses it.
TEST(SplitHidden, RanksTakeWholeSegmentsOfBlocksOf128ThenOf32) {
  const auto m110 = shape(768, 2048, 12, 12, 12, 32000);  // 16 blocks of 128 for 12 segments
  EXPECT_EQ(hidden_block(m110), 128);
  EXPECT_EQ(split_hidden(m110, 3, 0), (Range{0, 640}));     // blocks 0-4, 5-9, 10-15
  EXPECT_EQ(split_hidden(m110, 3, 1), (Range{640, 1280}));
  EXPECT_EQ(split_hidden(m110, 3, 2), (Range{1280, 2048}));
  EXPECT_EQ(split_hidden(m110, 2, 1), (Range{1024, 2048}));
  EXPECT_EQ(split_hidden(m110, 12, 11), (Range{1792, 2048}));  // floor(11 x 16 / 12) = 14
  EXPECT_EQ(hidden_segment(m110, 2), (Range{256, 512}));    // floor(2 x 16 / 12) = 2 to floor(3 x 16 / 12) = 4
  EXPECT_EQ(local_hidden_bounds(m110, 3, 1), (std::vector<int>{0, 128, 384, 512, 640}));  // segments 4-7
  const auto narrow128 = shape(64, 256, 2, 4, 4, 300);     // two blocks of 128 for four segments: of 32
  EXPECT_EQ(hidden_block(narrow128), 32);
  EXPECT_EQ(split_hidden(narrow128, 4, 1), (Range{64, 128}));
  // tiny-32k: 172 = 5 x 32 + 12, four segments; the short block on the last rank.
  const auto tiny = shape(64, 172, 3, 8, 4, 32000);
  EXPECT_EQ(split_hidden(tiny, 4, 3), (Range{128, 172}));
  EXPECT_EQ(split_hidden(tiny, 2, 0), (Range{0, 96}));
  EXPECT_EQ(local_hidden_bounds(tiny, 1, 0), (std::vector<int>{0, 32, 96, 128, 172}));
  EXPECT_EQ(local_hidden_bounds(tiny, 2, 1), (std::vector<int>{0, 32, 76}));
  // Every layout's slices are unions of the same segments, which is what makes the sums agree: each rank's
  // borders are one rank's. A toy width (two blocks for eight segments) leaves ranks of tp 4 and 8 empty.
  const auto toy = shape(48, 40, 2, 8, 8, 300);
  for (const auto& s : {m110, narrow128, tiny, shape(96, 260, 2, 6, 3, 300), shape(64, 2080, 2, 8, 8, 300), toy}) {
    const std::vector<int> whole = local_hidden_bounds(s, 1, 0);  // one rank's segments' borders
    for (int tp = 1; tp <= s.n_kv_heads; ++tp) {
      if (s.n_kv_heads % tp != 0) continue;
      int covered = 0;  // the slices, in rank order, tile hidden
      for (int r = 0; r < tp; ++r) {
        const Range slice = split_hidden(s, tp, r);
        EXPECT_EQ(slice.begin, covered) << s.hidden_dim << " tp=" << tp << " rank " << r;
        covered = slice.end;
        const int blocks = (s.hidden_dim + hidden_block(s) - 1) / hidden_block(s);
        EXPECT_EQ(slice.empty(), r * blocks / tp == (r + 1) * blocks / tp) << s.hidden_dim << " tp=" << tp;
        const std::vector<int> bounds = local_hidden_bounds(s, tp, r);
        EXPECT_EQ(bounds.back(), slice.size());
        for (const int b : bounds) {
          EXPECT_NE(std::find(whole.begin(), whole.end(), slice.begin + b), whole.end())
              << s.hidden_dim << " tp=" << tp << " rank " << r << " border " << b;
          EXPECT_TRUE((slice.begin + b) % 32 == 0 || slice.begin + b == s.hidden_dim);
        }
      }
      EXPECT_EQ(covered, s.hidden_dim) << s.hidden_dim << " tp=" << tp;
    }
  }
  EXPECT_EQ(hidden_block(toy), 32);
  EXPECT_EQ(local_hidden_bounds(toy, 1, 0), (std::vector<int>{0, 32, 40}));  // six empty segments left out
  EXPECT_EQ(split_hidden(toy, 2, 1), (Range{32, 40}));
  EXPECT_EQ(local_hidden_bounds(toy, 2, 1), (std::vector<int>{0, 8}));
  // Two blocks for four ranks: blocks floor(r 2 / 4) to floor((r + 1) 2 / 4), ranks 0 and 2 hold none.
  EXPECT_TRUE(split_hidden(toy, 4, 0).empty());
  EXPECT_EQ(split_hidden(toy, 4, 1), (Range{0, 32}));
  EXPECT_TRUE(split_hidden(toy, 4, 2).empty());
  EXPECT_EQ(split_hidden(toy, 4, 3), (Range{32, 40}));
  EXPECT_EQ(local_hidden_bounds(toy, 4, 0), (std::vector<int>{0}));
  EXPECT_EQ(local_hidden_bounds(toy, 4, 3), (std::vector<int>{0, 8}));
  const auto s = shape(64, 2048, 2, 6, 3, 300);
  EXPECT_EQ(shard_for(s, Mesh(3, 2, 3, 1), stage_layer_ranges(s, 1)).hidden, (Range{1280, 2048}));
}

TEST(StageLayerRanges, EvenUnevenAndExplicit) {
  const auto s = shape(64, 172, 7, 8, 4, 300);
  const auto even = stage_layer_ranges(s, 3);
  ASSERT_EQ(even.size(), 3u);
  EXPECT_EQ(even[0], (Range{0, 3}));
  EXPECT_EQ(even[1], (Range{3, 5}));
  EXPECT_EQ(even[2], (Range{5, 7}));
  const auto planned = stage_layer_ranges(s, 2, {2, 5});
  EXPECT_EQ(planned[1], (Range{2, 7}));
  EXPECT_THROW(stage_layer_ranges(s, 2, {3, 3}), ConfigError);
  EXPECT_THROW(stage_layer_ranges(s, 2, {7, 0}), ConfigError);
  EXPECT_THROW(stage_layer_ranges(s, 3, {3, 4}), ConfigError);
  // What is wrong, one wording for run (with the model) and launch-check (without: no sum to check).
  EXPECT_EQ(layer_split_problem({3, 4}, 3, 7), "names 2 stages but pp=3");
  EXPECT_EQ(layer_split_problem({7}, 2), "names 1 stage but pp=2");
  EXPECT_EQ(layer_split_problem({7, 0}, 2, 7), "gives stage 1 0 layers; every stage needs at least one");
  EXPECT_EQ(layer_split_problem({3, 3}, 2, 7), "sums to 6 but the model has 7 layers");
  EXPECT_EQ(layer_split_problem({3, 3}, 2), std::nullopt);
  EXPECT_EQ(layer_split_problem({2, 5}, 2, 7), std::nullopt);
}

TEST(LayoutProblem, NamesTheReason) {
  const auto s = shape(64, 172, 3, 8, 4, 32000);
  EXPECT_FALSE(find_layout_problem(s, 1, 1));
  EXPECT_FALSE(find_layout_problem(s, 4, 3));
  auto problem = find_layout_problem(s, 3, 1);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("tp=3 does not divide n_kv_heads=4"), std::string::npos) << *problem;
  problem = find_layout_problem(s, 1, 4);
  ASSERT_TRUE(problem);
  EXPECT_NE(problem->find("pp=4 exceeds n_layers=3"), std::string::npos) << *problem;
  EXPECT_TRUE(find_layout_problem(s, 8, 1));  // 8 does not divide 4 kv heads
}

// Over every rank of every valid grid, the TP slices tile heads, kv heads, hidden and vocab exactly,
// and query heads stay with their kv head (GQA groups are never split).
TEST(ShardFor, SlicesTileTheModelForEveryValidGrid) {
  const auto s = shape(128, 260, 7, 8, 4, 1001);
  for (int world = 1; world <= 8; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      if (world % tp != 0) continue;
      const int pp = world / tp;
      if (find_layout_problem(s, tp, pp)) continue;
      const auto stages = stage_layer_ranges(s, pp);
      for (int stage = 0; stage < pp; ++stage) {
        int heads = 0, kv = 0, hidden = 0, vocab = 0;
        for (int t = 0; t < tp; ++t) {
          const Mesh mesh(world, stage * tp + t, tp, pp);
          const RankShard shard = shard_for(s, mesh, stages);
          EXPECT_EQ(shard.layers, stages[stage]);
          EXPECT_EQ(shard.heads.begin, heads);
          EXPECT_EQ(shard.kv_heads.begin, kv);
          EXPECT_EQ(shard.hidden.begin, hidden);
          EXPECT_EQ(shard.heads.begin / (s.n_heads / s.n_kv_heads), shard.kv_heads.begin);
          EXPECT_EQ(shard.has_embedding, stage == 0);
          EXPECT_EQ(shard.has_classifier, stage == pp - 1);
          heads = shard.heads.end;
          kv = shard.kv_heads.end;
          hidden = shard.hidden.end;
          if (shard.has_classifier) {
            EXPECT_EQ(shard.vocab.begin, vocab);
            vocab = shard.vocab.end;
          } else {
            EXPECT_TRUE(shard.vocab.empty());
          }
        }
        EXPECT_EQ(heads, s.n_heads);
        EXPECT_EQ(kv, s.n_kv_heads);
        EXPECT_EQ(hidden, s.hidden_dim);
        EXPECT_EQ(vocab, stage == pp - 1 ? s.vocab_size : 0);
      }
    }
  }
}

}  // namespace
}  // namespace shardline::partition
