// The KV block pool: a reservation that costs nothing until blocks are used, block-by-block commit, a free
// list that reuses blocks, exhaustion as a value (try_allocate) or a clear error (allocate), and blocks
// bound to the requested node.
#include <numaif.h>

#include <cstring>
#include <set>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/units.h"
#include "memory/binding.h"
#include "memory/kv_block_pool.h"
#include "memory/system_memory.h"
#include "memory/topology.h"
#include "tests/support/hugepages.h"

namespace shardline::memory {
namespace {

constexpr std::uint64_t kBlockBytes = 64 * 1024;

TEST(KvBlockPool, ReservesAddressSpaceAndCommitsBlockByBlock) {
  KvBlockPool pool({.block_bytes = kBlockBytes, .n_blocks = 64});
  EXPECT_EQ(pool.reserved_bytes(), 64 * kBlockBytes);
  EXPECT_EQ(pool.committed_blocks(), 0);
  EXPECT_EQ(backing_of(pool.data(0), pool.reserved_bytes()).resident_bytes, 0u);  // nothing touched yet
  const int a = pool.allocate();
  const int b = pool.allocate();
  EXPECT_NE(a, b);
  EXPECT_EQ(pool.committed_blocks(), 2);
  EXPECT_EQ(pool.used_blocks(), 2);
  EXPECT_EQ(pool.free_blocks(), 62);
  // Committed means faulted in: exactly the two blocks are resident.
  EXPECT_EQ(backing_of(pool.data(0), pool.reserved_bytes()).resident_bytes, 2 * kBlockBytes);
  std::memset(pool.data(a), 0xAB, kBlockBytes);
  std::memset(pool.data(b), 0xCD, kBlockBytes);
  EXPECT_EQ(static_cast<unsigned char>(pool.data(a)[kBlockBytes - 1]), 0xAB);
  EXPECT_EQ(static_cast<unsigned char>(pool.data(b)[0]), 0xCD);
}

TEST(KvBlockPool, ReleasedBlocksAreReusedBeforeNewOnesAreCommitted) {
  KvBlockPool pool({.block_bytes = kBlockBytes, .n_blocks = 8});
  const int a = pool.allocate();
  const int b = pool.allocate();
  pool.release(a);
  EXPECT_EQ(pool.used_blocks(), 1);
  EXPECT_EQ(pool.allocate(), a);  // from the free list
  EXPECT_EQ(pool.committed_blocks(), 2);
  pool.release(b);
  pool.release(a);
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.peak_used_blocks(), 2);
  std::set<int> got;
  for (int i = 0; i < 8; ++i) got.insert(pool.allocate());
  EXPECT_EQ(got.size(), 8u);
  EXPECT_EQ(pool.committed_blocks(), 8);
}

TEST(KvBlockPool, ExhaustionIsBackPressureOrOneClearError) {
  KvBlockPool pool({.block_bytes = kBlockBytes, .n_blocks = 3});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.try_allocate().has_value());
  EXPECT_FALSE(pool.try_allocate().has_value());
  EXPECT_EQ(pool.free_blocks(), 0);
  try {
    pool.allocate();
    FAIL() << "expected ResourceError";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("all 3 blocks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--kv-blocks"), std::string::npos) << e.what();
  }
  pool.release(1);
  EXPECT_EQ(pool.allocate(), 1);
}

TEST(KvBlockPool, DoubleReleaseIsABug) {
  KvBlockPool pool({.block_bytes = kBlockBytes, .n_blocks = 2});
  const int a = pool.allocate();
  pool.release(a);
  EXPECT_DEATH(pool.release(a), "released but not in use");
}

TEST(KvBlockPool, BlocksAreBoundToTheNode) {
  const int node = discover_host_topology(false).nodes_with_cores().front()->os_index;
  KvBlockPool pool({.block_bytes = kBlockBytes, .n_blocks = 4, .numa_node = node});
  EXPECT_TRUE(pool.node_bound());
  const int a = pool.allocate();
  const RangePolicy policy = range_policy(pool.data(a));
  EXPECT_EQ(policy.mode, MPOL_BIND);
  EXPECT_EQ(policy.nodes, std::vector<int>{node});
  EXPECT_EQ(node_of_page(pool.data(a)), node);
  EXPECT_NE(pool.describe().find("1 used, 3 free of 4 blocks"), std::string::npos) << pool.describe();
}

TEST(KvBlockPool, BlockBytesRoundUpToPages) {
  KvBlockPool pool({.block_bytes = 100, .n_blocks = 2});
  EXPECT_EQ(pool.block_bytes(), kSmallPageBytes);
  EXPECT_EQ(pool.data(1) - pool.data(0), static_cast<std::ptrdiff_t>(kSmallPageBytes));
}

// Blocks of 1.5 MiB: the first 2 MiB step covers block 0 only, the second block ends at 3 MiB.
constexpr std::uint64_t kOddBlockBytes = 3ull << 19;

TEST(KvBlockPool, TransparentHugePagesCommitWholeAlignedSteps) {
  const std::string mode = transparent_hugepage_mode();
  ASSERT_TRUE(mode == "madvise" || mode == "always") << "this test needs THP enabled; it is '" << mode << "'";
  const int node = discover_host_topology(false).nodes_with_cores().front()->os_index;
  KvBlockPool pool({.block_bytes = kOddBlockBytes, .n_blocks = 6, .numa_node = node, .transparent_huge_pages = true});
  ASSERT_TRUE(pool.huge_page_steps());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pool.data(0)) % kHugePageBytes, 0u);
  EXPECT_EQ(pool.committed_bytes(), 0u);
  const int a = pool.allocate();
  EXPECT_EQ(pool.committed_bytes(), kHugePageBytes);  // block 0 and the start of block 1
  EXPECT_GT(backing_of(pool.data(a), kHugePageBytes).anon_huge_bytes, 0u) << "a 2 MiB aligned, advised step";
  const int b = pool.allocate();
  EXPECT_EQ(pool.committed_bytes(), 2 * kHugePageBytes);
  EXPECT_EQ(pool.committed_blocks(), 2);
  std::memset(pool.data(a), 0xAB, kOddBlockBytes);
  std::memset(pool.data(b), 0xCD, kOddBlockBytes);
  EXPECT_EQ(static_cast<unsigned char>(pool.data(a)[kOddBlockBytes - 1]), 0xAB);
  EXPECT_EQ(static_cast<unsigned char>(pool.data(b)[0]), 0xCD);
  // The last block's step passes the pool's end; it lies inside the rounded-up reservation.
  for (int i = 2; i < 6; ++i) pool.allocate();
  EXPECT_EQ(pool.committed_bytes(), 5 * kHugePageBytes);  // 9 MiB of blocks in whole 2 MiB steps
  std::memset(pool.data(5), 0xEF, kOddBlockBytes);
  // Bound to the node up to the end of that last step, past the last block.
  std::byte* past_last_block = pool.data(5) + kOddBlockBytes;
  EXPECT_EQ(range_policy(past_last_block).mode, MPOL_BIND);
  EXPECT_EQ(node_of_page(past_last_block), node);
  EXPECT_NE(pool.describe().find("THP"), std::string::npos) << pool.describe();
  EXPECT_NE(pool.describe().find("6 committed = 10.0 MiB of 10.0 MiB reserved"), std::string::npos) << pool.describe();
  // A pool smaller than one step is committed whole: it never reads "2.0 MiB of 12.0 KiB reserved".
  KvBlockPool tiny({.block_bytes = 4096, .n_blocks = 3, .numa_node = node, .transparent_huge_pages = true});
  tiny.allocate();
  EXPECT_NE(tiny.describe().find("= 2.0 MiB of 2.0 MiB reserved"), std::string::npos) << tiny.describe();
  EXPECT_EQ(format_bytes(3.0 * (1ull << 40)), "3.00 TiB");  // not "3072.00 GiB"
  EXPECT_EQ(format_bytes(2.0 * (1ull << 50)), "2.00 PiB");
}

TEST(KvBlockPool, SmallPageStepsWithoutThp) {
  // Not asked for, or refused by the process: block by block, exactly as before.
  for (bool asked : {false, true}) {
    test::ThpRefused refused;
    ASSERT_TRUE(refused.refused);
    KvBlockPool pool({.block_bytes = kOddBlockBytes, .n_blocks = 4, .transparent_huge_pages = asked});
    EXPECT_FALSE(pool.huge_page_steps());
    pool.allocate();
    EXPECT_EQ(pool.committed_bytes(), kOddBlockBytes);
    EXPECT_EQ(backing_of(pool.data(0), pool.reserved_bytes()).resident_bytes, kOddBlockBytes);
    EXPECT_EQ(pool.describe().find("THP"), std::string::npos) << pool.describe();
  }
}

}  // namespace
}  // namespace shardline::memory
