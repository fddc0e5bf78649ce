#include <set>

#include <gtest/gtest.h>

#include "common/error.h"
#include "partition/mesh.h"

namespace shardline::partition {
namespace {

// Every rank of every grid with up to 8 ranks: the coordinates, the groups and the neighbours agree.
TEST(Mesh, EveryRankOfEveryGridUpTo8) {
  for (int world = 1; world <= 8; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      if (world % tp != 0) continue;
      const int pp = world / tp;
      std::set<std::pair<int, int>> seen;
      for (int rank = 0; rank < world; ++rank) {
        const Mesh mesh(world, rank, tp, pp);
        EXPECT_EQ(mesh.tp_rank(), rank % tp);
        EXPECT_EQ(mesh.pp_rank(), rank / tp);
        EXPECT_EQ(mesh.rank_of(mesh.pp_rank(), mesh.tp_rank()), rank);
        EXPECT_TRUE(seen.insert({mesh.pp_rank(), mesh.tp_rank()}).second) << "two ranks share a place";
        const auto group = mesh.tp_group();
        ASSERT_EQ(static_cast<int>(group.size()), tp);
        EXPECT_EQ(group[mesh.tp_rank()], rank);
        for (int member : group) EXPECT_EQ(Mesh(world, member, tp, pp).pp_rank(), mesh.pp_rank());
        if (mesh.is_last_stage()) {
          EXPECT_EQ(mesh.next_stage_rank(), -1);
        } else {
          const Mesh next(world, mesh.next_stage_rank(), tp, pp);
          EXPECT_EQ(next.pp_rank(), mesh.pp_rank() + 1);
          EXPECT_EQ(next.tp_rank(), mesh.tp_rank());
          EXPECT_EQ(next.prev_stage_rank(), rank);
        }
        EXPECT_EQ(mesh.is_first_stage(), mesh.prev_stage_rank() == -1);
      }
      EXPECT_EQ(static_cast<int>(seen.size()), world);
    }
  }
}

TEST(Mesh, EightRanksTp2Pp4MatchesTheDocumentedGroups) {
  // The example in mesh.h: stage 1 = ranks {2,3}; the PP chain of tp_rank 1 = {1,3,5,7}.
  EXPECT_EQ(Mesh(8, 3, 2, 4).tp_group(), (std::vector<int>{2, 3}));
  EXPECT_EQ(Mesh(8, 3, 2, 4).next_stage_rank(), 5);
  EXPECT_EQ(Mesh(8, 5, 2, 4).next_stage_rank(), 7);
  EXPECT_EQ(Mesh(8, 3, 2, 4).tag(), "[r3 pp1 tp1]");
}

TEST(Mesh, RejectsGridsThatDoNotFitTheWorld) {
  EXPECT_THROW(Mesh(4, 0, 3, 1), ConfigError);
  EXPECT_THROW(Mesh(4, 4, 2, 2), ConfigError);
  EXPECT_THROW(Mesh(4, -1, 2, 2), ConfigError);
  EXPECT_THROW(Mesh(2, 0, 0, 2), ConfigError);
  EXPECT_THROW(Mesh(0, 0, 1, 1), ConfigError);
  try {
    Mesh(4, 0, 3, 1);
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tp=3 x pp=1"), std::string::npos) << e.what();
  }
}

TEST(Mesh, IsAComparableValue) {
  EXPECT_EQ(Mesh(4, 1, 2, 2), Mesh(4, 1, 2, 2));
  EXPECT_NE(Mesh(4, 1, 2, 2), Mesh(4, 2, 2, 2));
  const Mesh copy = Mesh::single();
  EXPECT_EQ(copy.world_size(), 1);
  EXPECT_TRUE(copy.is_first_stage() && copy.is_last_stage());
}

}  // namespace
}  // namespace shardline::partition
