// KvCache over a block pool: growth across blocks through the block table, rows landing where the
// attention kernel's block pointers say, blocks returned on destruction and on move-assignment, and pool
// exhaustion surfacing as ResourceError from reserve_through.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/isa.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "memory/kv_block_pool.h"
#include "runtime/kv_cache.h"

namespace shardline::runtime {
namespace {

constexpr int kLayers = 3, kKvDim = 8, kHeadSize = 4, kBlockTokens = 4;  // two heads per row

TEST(KvCache, GrowsBlockByBlockAndRowsMatchTheBlockTables) {
  memory::KvBlockPool pool({KvCache::block_bytes(kLayers, kKvDim, kHeadSize, kBlockTokens), 16});
  KvCache cache(pool, kLayers, kKvDim, kHeadSize, kBlockTokens, 30);
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
        static_cast<float*>(cache.key_row(l, p))[i] = 1000.0f * l + 10.0f * p + i;
        static_cast<float*>(cache.value_row(l, p))[i] = -(1000.0f * l + 10.0f * p + i);
      }
    }
  }
  // Read back through the kernel's view: block p / B, row p % B.
  for (int l = 0; l < kLayers; ++l) {
    for (int p = 0; p < 30; ++p) {
      const float* k = static_cast<const float*>(cache.key_blocks(l)[p / kBlockTokens]) + (p % kBlockTokens) * kKvDim;
      const float* v = static_cast<const float*>(cache.value_blocks(l)[p / kBlockTokens]) + (p % kBlockTokens) * kKvDim;
      for (int i = 0; i < kKvDim; ++i) {
        ASSERT_EQ(k[i], 1000.0f * l + 10.0f * p + i) << "layer " << l << " pos " << p;
        ASSERT_EQ(v[i], -(1000.0f * l + 10.0f * p + i)) << "layer " << l << " pos " << p;
      }
    }
  }
}

TEST(KvCache, BlocksGoBackToThePool) {
  memory::KvBlockPool pool({KvCache::block_bytes(kLayers, kKvDim, kHeadSize, kBlockTokens), 6});
  {
    KvCache a(pool, kLayers, kKvDim, kHeadSize, kBlockTokens, 12);
    a.reserve_through(11);
    EXPECT_EQ(pool.used_blocks(), 3);
    KvCache b = std::move(a);  // ownership moves; nothing is released twice
    EXPECT_EQ(pool.used_blocks(), 3);
    KvCache c(pool, kLayers, kKvDim, kHeadSize, kBlockTokens, 8);
    c.reserve_through(7);
    EXPECT_EQ(pool.used_blocks(), 5);
    c = std::move(b);  // c's own blocks are released, b's move in
    EXPECT_EQ(pool.used_blocks(), 3);
  }
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.committed_blocks(), 5);
}

// Rows row_bytes apart inside their block, keys then values per layer, where the block table says: for
// every layer and position of a cache reserved through position 11.
void expect_rows_where_the_block_tables_say(const memory::KvBlockPool& pool, KvCache& cache, std::size_t row_bytes) {
  for (int l = 0; l < kLayers; ++l) {
    for (int p = 0; p < 12; ++p) {
      const std::byte* block = pool.data(cache.block_table()[p / kBlockTokens]);
      const std::size_t key_at = (static_cast<std::size_t>(2 * l) * kBlockTokens + p % kBlockTokens) * row_bytes;
      EXPECT_EQ(static_cast<std::byte*>(cache.key_row(l, p)), block + key_at);
      EXPECT_EQ(static_cast<std::byte*>(cache.value_row(l, p)), block + key_at + kBlockTokens * row_bytes);
    }
  }
}

// Stores key value(l, p, i) and value -value(l, p, i) through the kernels into every row of positions
// 0-11, then reads each row back through attention's block pointers into check(l, p, keys, values).
template <typename Value, typename Check>
void store_and_read_back(KvCache& cache, Value&& value, Check&& check) {
  const kernels::cpu::KvDtype dtype = cache.kv_dtype();
  float row[kKvDim];
  for (int l = 0; l < kLayers; ++l) {
    for (int p = 0; p < 12; ++p) {
      for (int i = 0; i < kKvDim; ++i) row[i] = value(l, p, i);
      kernels::cpu::store_kv_row(cache.key_row(l, p), row, kKvDim, kHeadSize, dtype);
      for (int i = 0; i < kKvDim; ++i) row[i] = -row[i];
      kernels::cpu::store_kv_row(cache.value_row(l, p), row, kKvDim, kHeadSize, dtype);
    }
  }
  for (int l = 0; l < kLayers; ++l) {
    for (int p = 0; p < 12; ++p) {
      float k[kKvDim], v[kKvDim];
      const std::size_t at = (p % kBlockTokens) * cache.row_bytes();
      kernels::cpu::load_kv_row(k, static_cast<const std::byte*>(cache.key_blocks(l)[p / kBlockTokens]) + at, kKvDim,
                                kHeadSize, dtype);
      kernels::cpu::load_kv_row(v, static_cast<const std::byte*>(cache.value_blocks(l)[p / kBlockTokens]) + at, kKvDim,
                                kHeadSize, dtype);
      check(l, p, k, v);
    }
  }
}

// An int8 cache: each row is its kKvDim codes then one float scale per head (kv_row_bytes), rows follow
// each other at that stride inside their block, and a row stored through the kernels reads back through
// attention's block pointers within half a scale of what was stored.
TEST(KvCache, Int8RowsAreCodesThenAScalePerHead) {
  using kernels::cpu::KvDtype;
  const std::size_t row_bytes = kKvDim + 4 * (kKvDim / kHeadSize);
  ASSERT_EQ(kernels::cpu::kv_row_bytes(KvDtype::kInt8, kKvDim, kHeadSize), row_bytes);
  EXPECT_EQ(KvCache::block_bytes(kLayers, kKvDim, kHeadSize, kBlockTokens, KvDtype::kInt8),
            static_cast<std::size_t>(kLayers) * 2 * kBlockTokens * row_bytes);
  memory::KvBlockPool pool({KvCache::block_bytes(kLayers, kKvDim, kHeadSize, kBlockTokens, KvDtype::kInt8), 8});
  KvCache cache(pool, kLayers, kKvDim, kHeadSize, kBlockTokens, 12, KvDtype::kInt8);
  EXPECT_EQ(cache.kv_dtype(), KvDtype::kInt8);
  cache.reserve_through(11);
  EXPECT_EQ(cache.row_bytes(), row_bytes);
  expect_rows_where_the_block_tables_say(pool, cache, row_bytes);
  auto value = [](int l, int p, int i) { return 0.5f + 100.0f * l + 8.0f * p + i * (i % 2 ? -1.0f : 1.0f); };
  store_and_read_back(cache, value, [&](int l, int p, const float* k, const float* v) {
    for (int h = 0; h < kKvDim / kHeadSize; ++h) {
      float amax = 0;
      for (int i = h * kHeadSize; i < (h + 1) * kHeadSize; ++i) amax = std::max(amax, std::abs(value(l, p, i)));
      const float half_scale = amax / 127.0f / 2.0f * 1.0001f;
      for (int i = h * kHeadSize; i < (h + 1) * kHeadSize; ++i) {
        ASSERT_NEAR(k[i], value(l, p, i), half_scale) << "layer " << l << " pos " << p << " value " << i;
        ASSERT_NEAR(v[i], -value(l, p, i), half_scale) << "layer " << l << " pos " << p << " value " << i;
      }
    }
  });
}

TEST(KvCache, ExhaustionIsAResourceError) {
  memory::KvBlockPool pool({KvCache::block_bytes(kLayers, kKvDim, kHeadSize, kBlockTokens), 2});
  KvCache cache(pool, kLayers, kKvDim, kHeadSize, kBlockTokens, 40);
  cache.reserve_through(7);
  EXPECT_THROW(cache.reserve_through(8), ResourceError);
  EXPECT_EQ(cache.blocks_held(), 2);  // what it had stays valid
  static_cast<float*>(cache.key_row(0, 7))[0] = 1.0f;
}

// An fp16 cache: blocks of half the bytes, the same layout in 2-byte values, and rows stored through the
// kernels' conversion land where attention's block pointers read them.
TEST(KvCache, Fp16RowsHaveHalfTheBytesAndTheSameLayout) {
  using kernels::cpu::KvDtype;
  EXPECT_EQ(KvCache::block_bytes(kLayers, kKvDim, kHeadSize, kBlockTokens, KvDtype::kF16) * 2,
            KvCache::block_bytes(kLayers, kKvDim, kHeadSize, kBlockTokens));
  memory::KvBlockPool pool({KvCache::block_bytes(kLayers, kKvDim, kHeadSize, kBlockTokens, KvDtype::kF16), 8});
  KvCache cache(pool, kLayers, kKvDim, kHeadSize, kBlockTokens, 12, KvDtype::kF16);
  EXPECT_EQ(cache.kv_dtype(), KvDtype::kF16);
  cache.reserve_through(11);
  // Rows at 2-byte strides inside their block, keys then values per layer, the last value row ending at the
  // block's fp16 size.
  const std::size_t row_bytes = kKvDim * 2;
  EXPECT_EQ(cache.row_bytes(), row_bytes);
  expect_rows_where_the_block_tables_say(pool, cache, row_bytes);
  EXPECT_EQ(static_cast<std::byte*>(cache.value_row(kLayers - 1, kBlockTokens - 1)) + row_bytes,
            pool.data(cache.block_table()[0]) + KvCache::block_bytes(kLayers, kKvDim, kHeadSize, kBlockTokens, KvDtype::kF16));
  auto value = [](int l, int p, int i) { return 100.0f * l + 8.0f * p + i; };  // exact in fp16
  store_and_read_back(cache, value, [&](int l, int p, const float* k, const float* v) {
    for (int i = 0; i < kKvDim; ++i) {
      ASSERT_EQ(k[i], value(l, p, i)) << "layer " << l << " pos " << p;
      ASSERT_EQ(v[i], -value(l, p, i)) << "layer " << l << " pos " << p;
    }
  });
}

// --kv-dtype auto: fp32 keeps fp32 weights on the reference arithmetic; bf16 and int8 take fp16 on the
// AVX2 and AVX-512 kernels. The CUDA backend has an fp32 cache only.
TEST(KvCache, ResolvesTheDefaultDtypePerWeightsAndBackend) {
  using kernels::cpu::KvDtype;
  using kernels::cpu::WeightDtype;
  // fp16 where the AVX2 and AVX-512 kernels read it (this machine's best ISA decides what auto can give here).
  const KvDtype half_if_fast =
      kernels::cpu::active_isa() >= kernels::cpu::Isa::kAvx2 ? KvDtype::kF16 : KvDtype::kF32;
  EXPECT_EQ(resolve_kv_dtype(std::nullopt, WeightDtype::kF32, false), KvDtype::kF32);
  EXPECT_EQ(resolve_kv_dtype(std::nullopt, WeightDtype::kBf16, false), half_if_fast);
  EXPECT_EQ(resolve_kv_dtype(std::nullopt, WeightDtype::kInt8, false), half_if_fast);
  EXPECT_EQ(resolve_kv_dtype(KvDtype::kF16, WeightDtype::kF32, false), KvDtype::kF16);
  EXPECT_EQ(resolve_kv_dtype(KvDtype::kF32, WeightDtype::kInt8, false), KvDtype::kF32);
  EXPECT_EQ(resolve_kv_dtype(std::nullopt, WeightDtype::kBf16, true), KvDtype::kF32);
  EXPECT_EQ(resolve_kv_dtype(KvDtype::kF32, WeightDtype::kBf16, true), KvDtype::kF32);
  EXPECT_THROW(resolve_kv_dtype(KvDtype::kF16, WeightDtype::kF32, true), ConfigError);
  EXPECT_THROW(resolve_kv_dtype(KvDtype::kInt8, WeightDtype::kInt8, true), ConfigError);
  EXPECT_EQ(resolve_kv_dtype(KvDtype::kInt8, WeightDtype::kF32, false), KvDtype::kInt8);  // only when asked
  // The portable kernels read fp16 through integer conversions: auto keeps fp32 there.
  const kernels::cpu::Isa previous = kernels::cpu::set_isa(kernels::cpu::Isa::kPortable);
  EXPECT_EQ(resolve_kv_dtype(std::nullopt, WeightDtype::kInt8, false), KvDtype::kF32);
  EXPECT_EQ(resolve_kv_dtype(KvDtype::kF16, WeightDtype::kInt8, false), KvDtype::kF16);
  kernels::cpu::set_isa(previous);
}

}  // namespace
}  // namespace shardline::runtime
