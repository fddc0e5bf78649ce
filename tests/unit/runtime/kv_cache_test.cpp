// KvCache over a block pool: growth across blocks through the block table, rows landing where the
// attention kernel's block pointers say, blocks returned on destruction and on move-assignment, and pool
// exhaustion surfacing as ResourceError from reserve_through.
#include <gtest/gtest.h>

#include "common/error.h"
#include "memory/kv_block_pool.h"
#include "runtime/kv_cache.h"

namespace shardline::runtime {
namespace {

constexpr int kLayers = 3, kKvDim = 8, kBlockTokens = 4;

TEST(KvCache, GrowsBlockByBlockAndRowsMatchTheBlockTables) {
  memory::KvBlockPool pool({KvCache::block_bytes(kLayers, kKvDim, kBlockTokens), 16});
  KvCache cache(pool, kLayers, kKvDim, kBlockTokens, 30);
  EXPECT_EQ(cache.blocks_held(), 0);
  cache.reserve_through(0);
  EXPECT_EQ(cache.blocks_held(), 1);
  cache.reserve_through(3);
  EXPECT_EQ(cache.blocks_held(), 1);
  cache.reserve_through(4);
  EXPECT_EQ(cache.blocks_held(), 2);
  cache.reserve_through(29);
  EXPECT_EQ(cache.blocks_held(), 8);  // ceil(30 / 4)
  EXPECT_EQ(pool.used_blocks(), 8);
  for (int l = 0; l < kLayers; ++l) {
    for (int p = 0; p < 30; ++p) {
      for (int i = 0; i < kKvDim; ++i) {
        cache.key_row(l, p)[i] = 1000.0f * l + 10.0f * p + i;
        cache.value_row(l, p)[i] = -(1000.0f * l + 10.0f * p + i);
      }
    }
  }
  // Read back through the kernel's view: block p / B, row p % B.
  for (int l = 0; l < kLayers; ++l) {
    for (int p = 0; p < 30; ++p) {
      const float* k = cache.key_blocks(l)[p / kBlockTokens] + (p % kBlockTokens) * kKvDim;
      const float* v = cache.value_blocks(l)[p / kBlockTokens] + (p % kBlockTokens) * kKvDim;
      for (int i = 0; i < kKvDim; ++i) {
        ASSERT_EQ(k[i], 1000.0f * l + 10.0f * p + i) << "layer " << l << " pos " << p;
        ASSERT_EQ(v[i], -(1000.0f * l + 10.0f * p + i)) << "layer " << l << " pos " << p;
      }
    }
  }
}

TEST(KvCache, BlocksGoBackToThePool) {
  memory::KvBlockPool pool({KvCache::block_bytes(kLayers, kKvDim, kBlockTokens), 6});
  {
    KvCache a(pool, kLayers, kKvDim, kBlockTokens, 12);
    a.reserve_through(11);
    EXPECT_EQ(pool.used_blocks(), 3);
    KvCache b = std::move(a);  // ownership moves; nothing is released twice
    EXPECT_EQ(pool.used_blocks(), 3);
    KvCache c(pool, kLayers, kKvDim, kBlockTokens, 8);
    c.reserve_through(7);
    EXPECT_EQ(pool.used_blocks(), 5);
    c = std::move(b);  // c's own blocks are released, b's move in
    EXPECT_EQ(pool.used_blocks(), 3);
  }
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.committed_blocks(), 5);
}

TEST(KvCache, ExhaustionIsAResourceError) {
  memory::KvBlockPool pool({KvCache::block_bytes(kLayers, kKvDim, kBlockTokens), 2});
  KvCache cache(pool, kLayers, kKvDim, kBlockTokens, 40);
  cache.reserve_through(7);
  EXPECT_THROW(cache.reserve_through(8), ResourceError);
  EXPECT_EQ(cache.blocks_held(), 2);  // what it had stays valid
  cache.key_row(0, 7)[0] = 1.0f;
}

}  // namespace
}  // namespace shardline::runtime
