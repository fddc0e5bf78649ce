// Paged attention against the contiguous kernel: the same cache cut into blocks of several sizes, the
// blocks scattered through memory in shuffled order, must give bit-identical output (same arithmetic in
// the same order; only the addressing differs), with 1 and 2 threads. The contiguous kernel itself is
// checked against a double reference in cpu_ops_test.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/ops.h"
#include "tests/support/kernel_fixtures.h"

namespace shardline::kernels::cpu {
namespace {

TEST(AttentionPaged, BitIdenticalToContiguousForEveryBlockSize) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int n_heads = 8, n_kv_heads = 2, head_size = 16, kv_stride = n_kv_heads * head_size;
  const int n_ctx = 300;  // > 64: the OpenMP region really runs
  std::vector<float> q(n_heads * head_size), k(n_ctx * kv_stride), v(n_ctx * kv_stride);
  for (auto* buffer : {&q, &k, &v}) {
    for (float& x : *buffer) x = dist(rng);
  }
  for (int threads : {1, 2, 3}) {  // 3: a thread's heads can start and end inside a kv head's group
    const int previous = set_num_threads(threads);
    std::vector<float> want(n_heads * head_size), scratch(n_heads * n_ctx);
    attention(want.data(), q.data(), k.data(), v.data(), scratch.data(), n_ctx, n_heads, n_kv_heads, head_size,
              kv_stride);
    for (int block_tokens : {1, 7, 16, 64, 300, 512}) {
      const int n_blocks = (n_ctx + block_tokens - 1) / block_tokens;
      // Blocks in a shuffled order inside one pool, as a block allocator would hand them out.
      std::vector<int> slot(n_blocks);
      std::iota(slot.begin(), slot.end(), 0);
      std::shuffle(slot.begin(), slot.end(), rng);
      const std::size_t block_floats = static_cast<std::size_t>(block_tokens) * kv_stride;
      std::vector<float> k_pool(n_blocks * block_floats, NAN), v_pool(n_blocks * block_floats, NAN);
      std::vector<const void*> k_blocks(n_blocks), v_blocks(n_blocks);
      for (int b = 0; b < n_blocks; ++b) {
        float* kb = k_pool.data() + slot[b] * block_floats;
        float* vb = v_pool.data() + slot[b] * block_floats;
        const int rows = std::min(block_tokens, n_ctx - b * block_tokens);
        std::memcpy(kb, k.data() + static_cast<std::size_t>(b) * block_floats, rows * kv_stride * sizeof(float));
        std::memcpy(vb, v.data() + static_cast<std::size_t>(b) * block_floats, rows * kv_stride * sizeof(float));
        k_blocks[b] = kb;
        v_blocks[b] = vb;
      }
      std::vector<float> got(n_heads * head_size, -1.0f);
      attention_paged(got.data(), q.data(), k_blocks.data(), v_blocks.data(), KvDtype::kF32, block_tokens,
                      scratch.data(), n_ctx, n_heads, n_kv_heads, head_size, kv_stride);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
          << "block_tokens " << block_tokens << ", " << threads << " threads";
    }
    set_num_threads(previous);
  }
}

// The cache as rows of dtype, one row per kv_stride values of x: fp32 as is, fp16 and int8 through
// store_kv_row (each ISA's own conversion, which must agree too).
std::vector<std::uint8_t> to_rows(const std::vector<float>& x, int kv_stride, int head_size, KvDtype dtype) {
  const std::size_t row_bytes = kv_row_bytes(dtype, kv_stride, head_size), rows = x.size() / kv_stride;
  std::vector<std::uint8_t> out(rows * row_bytes);
  for (std::size_t r = 0; r < rows; ++r) {
    store_kv_row(out.data() + r * row_bytes, x.data() + r * kv_stride, kv_stride, head_size, dtype);
  }
  return out;
}

// Attention is compiled for the baseline target and, with intrinsics, for AVX-512 (row_kernels.h); both
// must give the same bits, with GQA, both thread counts, head sizes that are multiples of 16 (64; 80 and 128
// pass the AVX-512 kernel's 64-float value registers) and one that is not (40: the generic code on both),
// on a contiguous cache and on blocks of 7 and 16 positions, for fp32, fp16 and int8 caches.
void expect_bit_identical_on_every_isa(int head_size, int block_tokens, KvDtype dtype, std::mt19937& rng,
                                       int n_ctx = 130, int n_heads = 6, int n_kv_heads = 3) {
  SCOPED_TRACE(::testing::Message() << "head_size " << head_size << ", block_tokens " << block_tokens << ", "
                                    << kv_dtype_name(dtype) << ", n_ctx " << n_ctx << ", heads " << n_heads << "/"
                                    << n_kv_heads);
  const int kv_stride = n_kv_heads * head_size;
  const std::vector<float> q = test::random_floats(rng, static_cast<std::size_t>(n_heads) * head_size);
  const std::vector<float> k = test::random_floats(rng, static_cast<std::size_t>(n_ctx) * kv_stride);
  const std::vector<float> v = test::random_floats(rng, static_cast<std::size_t>(n_ctx) * kv_stride);
  std::vector<std::uint8_t> k_rows, v_rows;
  {
    test::ScopedIsa portable(Isa::kPortable);
    k_rows = to_rows(k, kv_stride, head_size, dtype);
    v_rows = to_rows(v, kv_stride, head_size, dtype);
  }
  for (Isa isa : test::runnable_isas()) {
    test::ScopedIsa scoped(isa);
    EXPECT_TRUE(to_rows(k, kv_stride, head_size, dtype) == k_rows && to_rows(v, kv_stride, head_size, dtype) == v_rows)
        << "stored rows differ on " << isa_name(isa);
  }
  const std::size_t row_bytes = kv_row_bytes(dtype, kv_stride, head_size);
  const auto* k_base = k_rows.data();
  const auto* v_base = v_rows.data();
  // Blocks are consecutive slices of the same cache here: the block walk, not the placement, is under test.
  std::vector<const void*> k_blocks, v_blocks;
  for (int t0 = 0; t0 < n_ctx; t0 += block_tokens) {
    k_blocks.push_back(k_base + static_cast<std::size_t>(t0) * row_bytes);
    v_blocks.push_back(v_base + static_cast<std::size_t>(t0) * row_bytes);
  }
  std::vector<float> scratch(static_cast<std::size_t>(n_heads) * n_ctx);
  auto run = [&](std::vector<float>& out) {
    attention_paged(out.data(), q.data(), k_blocks.data(), v_blocks.data(), dtype, block_tokens, scratch.data(), n_ctx,
                    n_heads, n_kv_heads, head_size, kv_stride);
  };
  for (int threads : {1, 2, 3}) {  // 3: a thread's heads can start and end inside a kv head's group
    test::ScopedThreads scoped_threads(threads);
    std::vector<float> want(n_heads * head_size), got(n_heads * head_size);
    {
      test::ScopedIsa portable(Isa::kPortable);
      run(want);
    }
    for (Isa isa : test::runnable_isas()) {
      test::ScopedIsa scoped(isa);
      run(got);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
          << isa_name(isa) << ", " << threads << " threads";
    }
  }
}

TEST(AttentionPaged, BitIdenticalOnEveryIsa) {
  std::mt19937 rng(8);
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kInt8}) {
    for (int head_size : {40, 64, 80, 128}) {
      for (int block_tokens : {7, 16, 130}) expect_bit_identical_on_every_isa(head_size, block_tokens, dtype, rng);
    }
    // Every head size the AVX-512 kernel scores 16 positions at a time (16 to 128), and contexts shorter than
    // one group of 16, one position past it, and a group and a half.
    for (int head_size : {16, 32, 48, 96, 112, 144}) expect_bit_identical_on_every_isa(head_size, 16, dtype, rng);
    for (int n_ctx : {1, 5, 16, 17, 24}) expect_bit_identical_on_every_isa(64, 7, dtype, rng, n_ctx);
    // GQA groups of 3 to 8 query heads: the AVX2 build sums the values of 4, 2 or 1 heads of a kv head at once
    // (8: 4 + 4, 6: 4 + 2, 5: 4 + 1, 3: 2 + 1), also over ranges of heads that start and end inside a group
    // (2 and 3 threads), and with the last 8 positions cut at each length.
    for (int head_size : {48, 64, 128}) {
      for (const auto& [heads, kv_heads] : {std::pair{16, 2}, {12, 2}, {10, 2}, {12, 4}, {4, 1}}) {
        expect_bit_identical_on_every_isa(head_size, 16, dtype, rng, 130, heads, kv_heads);
      }
    }
    for (int n_ctx : {129, 131, 133, 135, 136}) expect_bit_identical_on_every_isa(64, 16, dtype, rng, n_ctx, 12, 2);
  }
}

// Cache rows of dtype (to_rows()) read back as floats, row by row: what the attention kernels see.
std::vector<float> from_rows(const std::vector<std::uint8_t>& rows, int kv_stride, int head_size, KvDtype dtype) {
  const std::size_t row_bytes = kv_row_bytes(dtype, kv_stride, head_size), n_rows = rows.size() / row_bytes;
  std::vector<float> x(n_rows * kv_stride);
  for (std::size_t r = 0; r < n_rows; ++r) {
    load_kv_row(x.data() + r * kv_stride, rows.data() + r * row_bytes, kv_stride, head_size, dtype);
  }
  return x;
}

// The two cache dtypes' case: GQA (4 query heads per kv head), heads of 64, 97 positions, in one block.
struct CacheCase {
  static constexpr int n_heads = 8, n_kv_heads = 2, head_size = 64, kv_stride = n_kv_heads * head_size, n_ctx = 97;
  std::vector<float> q, k, v;

  explicit CacheCase(std::uint32_t seed) {
    std::mt19937 rng(seed);
    q = test::random_floats(rng, static_cast<std::size_t>(n_heads) * head_size);
    k = test::random_floats(rng, static_cast<std::size_t>(n_ctx) * kv_stride);
    v = test::random_floats(rng, static_cast<std::size_t>(n_ctx) * kv_stride);
  }
  // attention_paged over k and v stored as rows of dtype.
  std::vector<float> paged(const std::vector<std::uint8_t>& k_rows, const std::vector<std::uint8_t>& v_rows,
                           KvDtype dtype) const {
    std::vector<float> out(static_cast<std::size_t>(n_heads) * head_size), scratch(static_cast<std::size_t>(n_heads) * n_ctx);
    const void* k_block = k_rows.data();
    const void* v_block = v_rows.data();
    attention_paged(out.data(), q.data(), &k_block, &v_block, dtype, n_ctx, scratch.data(), n_ctx, n_heads, n_kv_heads,
                    head_size, kv_stride);
    return out;
  }
  // The contiguous fp32 kernel over keys and values as floats.
  std::vector<float> contiguous(const std::vector<float>& keys, const std::vector<float>& values) const {
    std::vector<float> out(static_cast<std::size_t>(n_heads) * head_size), scratch(static_cast<std::size_t>(n_heads) * n_ctx);
    attention(out.data(), q.data(), keys.data(), values.data(), scratch.data(), n_ctx, n_heads, n_kv_heads, head_size,
              kv_stride);
    return out;
  }
};

// An fp16 cache is an fp32 cache of the rounded values: attention over the fp16 rows must equal, bit for
// bit, fp32 attention over those rows converted back; and it stays close to attention over the unrounded
// rows (each value within 2^-11 relative, so the output within a few 2^-11 of the fp32 output's scale).
TEST(AttentionPaged, Fp16CacheIsFp32AttentionOverTheRoundedRows) {
  const CacheCase c(11);
  const auto k16 = to_rows(c.k, c.kv_stride, c.head_size, KvDtype::kF16);
  const auto v16 = to_rows(c.v, c.kv_stride, c.head_size, KvDtype::kF16);
  const std::vector<float> half = c.paged(k16, v16, KvDtype::kF16);
  const std::vector<float> rounded = c.contiguous(from_rows(k16, c.kv_stride, c.head_size, KvDtype::kF16),
                                                  from_rows(v16, c.kv_stride, c.head_size, KvDtype::kF16));
  const std::vector<float> exact = c.contiguous(c.k, c.v);
  EXPECT_EQ(std::memcmp(half.data(), rounded.data(), half.size() * sizeof(float)), 0);
  float scale = 0, worst = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    scale = std::max(scale, std::abs(exact[i]));
    worst = std::max(worst, std::abs(half[i] - exact[i]));
  }
  EXPECT_GT(worst, 0.0f);  // the rounding is real
  EXPECT_LT(worst, 8 * 0x1p-11f * scale);
}

// An int8 cache: attention over its rows is attention over the dequantized rows (code x scale) up to where
// the scales are applied (once per score and per softmax weight instead of per value: a few float roundings,
// checked against a double-precision computation over the dequantized values), and it stays within the
// int8 rounding of attention over the original rows (each value within max|x| / 254 of its head).
TEST(AttentionPaged, Int8CacheIsAttentionOverTheDequantizedRows) {
  const CacheCase c(12);
  const int n_heads = c.n_heads, head_size = c.head_size, kv_stride = c.kv_stride, n_ctx = c.n_ctx;
  const auto k8 = to_rows(c.k, kv_stride, head_size, KvDtype::kInt8);
  const auto v8 = to_rows(c.v, kv_stride, head_size, KvDtype::kInt8);
  const std::vector<float> k_back = from_rows(k8, kv_stride, head_size, KvDtype::kInt8);
  const std::vector<float> v_back = from_rows(v8, kv_stride, head_size, KvDtype::kInt8);
  // Double-precision attention over the dequantized rows.
  std::vector<double> want(static_cast<std::size_t>(n_heads) * head_size, 0.0);
  for (int h = 0; h < n_heads; ++h) {
    const int kv = h / (n_heads / c.n_kv_heads);
    std::vector<double> score(n_ctx);
    double max_score = -1e300, sum = 0;
    for (int t = 0; t < n_ctx; ++t) {
      double dot = 0;
      for (int i = 0; i < head_size; ++i) dot += double(c.q[h * head_size + i]) * k_back[t * kv_stride + kv * head_size + i];
      score[t] = dot / std::sqrt(double(head_size));
      max_score = std::max(max_score, score[t]);
    }
    for (double& s : score) sum += (s = std::exp(s - max_score));
    for (int t = 0; t < n_ctx; ++t) {
      for (int i = 0; i < head_size; ++i) want[h * head_size + i] += score[t] / sum * v_back[t * kv_stride + kv * head_size + i];
    }
  }
  const std::vector<float> got = c.paged(k8, v8, KvDtype::kInt8);
  const std::vector<float> exact = c.contiguous(c.k, c.v);
  float scale = 0, worst_float = 0, worst_int8 = 0;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    scale = std::max(scale, std::abs(exact[i]));
    worst_float = std::max(worst_float, static_cast<float>(std::abs(got[i] - want[i])));
    worst_int8 = std::max(worst_int8, std::abs(got[i] - exact[i]));
  }
  EXPECT_LT(worst_float, 1e-5f * scale);  // float rounding only
  EXPECT_GT(worst_int8, 1e-4f * scale);   // the int8 rounding is real
  EXPECT_LT(worst_int8, 0.02f * scale);   // and as small as its half-scale steps make it
}

// A long context's heads split over a team (what a stage does for fewer rows than threads): each thread's
// share, with its own scratch, together give one thread's result bit for bit; so does the pass
// attention_paged() opens itself.
TEST(AttentionPaged, TeamSharesOfTheHeadsEqualOneThread) {
  const CacheCase c(12);
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kInt8}) {
    SCOPED_TRACE(kv_dtype_name(dtype));
    const std::vector<std::uint8_t> k_rows = to_rows(c.k, c.kv_stride, c.head_size, dtype);
    const std::vector<std::uint8_t> v_rows = to_rows(c.v, c.kv_stride, c.head_size, dtype);
    std::vector<float> one_thread;
    {
      test::ScopedThreads scoped(1);
      one_thread = c.paged(k_rows, v_rows, dtype);
    }
    const void* k_block = k_rows.data();
    const void* v_block = v_rows.data();
    for (int threads : {2, 3}) {
      test::ScopedThreads scoped(threads);
      EXPECT_EQ(c.paged(k_rows, v_rows, dtype), one_thread) << threads << " threads, attention_paged's own pass";
      std::vector<float> out(one_thread.size(), -1.0f);
      std::vector<float> scratch(static_cast<std::size_t>(threads) * c.n_heads * c.n_ctx);
      run_team([&](Team team) {
        attention_paged(out.data(), c.q.data(), &k_block, &v_block, dtype, c.n_ctx,
                        scratch.data() + static_cast<std::size_t>(team.thread) * c.n_heads * c.n_ctx, c.n_ctx,
                        c.n_heads, c.n_kv_heads, c.head_size, c.kv_stride, team);
      });
      EXPECT_EQ(out, one_thread) << threads << " threads, shares of one team";
    }
  }
}

// Several query rows of one sequence at consecutive positions at once (a prefill chunk's rows: row r sees
// n_ctx + r positions): every ISA, every row count up to kAttentionRowsAtOnce and each thread's band of the
// heads of a team of 1 to 3 must give what attention_paged gives each row alone, bit for bit. The rows' sums
// share a walk over the positions all of them see and go on alone over the rest, so contexts around the
// 8-position groups of the scores, GQA groups that do and do not fill a walk of 4, head sizes the AVX2
// kernel takes (multiples of 16 up to 128) and ones it leaves to the row-by-row code (40, 144), and the three
// cache dtypes.
void expect_rows_equal_each_row(int head_size, int n_heads, int n_kv_heads, int n_ctx, KvDtype dtype, std::mt19937& rng,
                                int block_tokens = 16) {
  SCOPED_TRACE(::testing::Message() << "head_size " << head_size << ", heads " << n_heads << "/" << n_kv_heads
                                    << ", n_ctx " << n_ctx << ", " << kv_dtype_name(dtype) << ", block_tokens "
                                    << block_tokens);
  constexpr int kRows = kAttentionRowsAtOnce;
  const int kv_stride = n_kv_heads * head_size, positions = n_ctx + kRows - 1;
  const std::size_t q_dim = static_cast<std::size_t>(n_heads) * head_size;
  const std::vector<float> q = test::random_floats(rng, kRows * q_dim);
  std::vector<std::uint8_t> k_rows, v_rows;
  {
    test::ScopedIsa portable(Isa::kPortable);
    k_rows = to_rows(test::random_floats(rng, static_cast<std::size_t>(positions) * kv_stride), kv_stride, head_size, dtype);
    v_rows = to_rows(test::random_floats(rng, static_cast<std::size_t>(positions) * kv_stride), kv_stride, head_size, dtype);
  }
  const std::size_t row_bytes = kv_row_bytes(dtype, kv_stride, head_size);
  std::vector<const void*> k_blocks, v_blocks;
  for (int t0 = 0; t0 < positions; t0 += block_tokens) {
    k_blocks.push_back(k_rows.data() + static_cast<std::size_t>(t0) * row_bytes);
    v_blocks.push_back(v_rows.data() + static_cast<std::size_t>(t0) * row_bytes);
  }
  const std::size_t scratch_stride = static_cast<std::size_t>(n_heads) * positions;
  std::vector<float> want(kRows * q_dim), scratch(kRows * scratch_stride);
  {
    test::ScopedIsa portable(Isa::kPortable);
    for (int r = 0; r < kRows; ++r) {
      attention_paged(want.data() + r * q_dim, q.data() + r * q_dim, k_blocks.data(), v_blocks.data(), dtype,
                      block_tokens, scratch.data(), n_ctx + r, n_heads, n_kv_heads, head_size, kv_stride, Team{});
    }
  }
  for (Isa isa : test::runnable_isas()) {
    test::ScopedIsa scoped(isa);
    for (int rows = 1; rows <= kRows; ++rows) {
      for (int threads : {1, 2, 3}) {
        // Rows [kRows - rows, kRows): the last rows, whose contexts start at n_ctx + kRows - rows.
        const int r0 = kRows - rows;
        std::vector<float> got(kRows * q_dim, -1.0f);
        for (int thread = 0; thread < threads; ++thread) {
          attention_rows_paged(got.data() + r0 * q_dim, q_dim, q.data() + r0 * q_dim, q_dim, k_blocks.data(),
                               v_blocks.data(), dtype, block_tokens, scratch.data(), scratch_stride, n_ctx + r0, rows,
                               n_heads, n_kv_heads, head_size, kv_stride, Team{thread, threads});
        }
        EXPECT_EQ(std::memcmp(got.data() + r0 * q_dim, want.data() + r0 * q_dim, rows * q_dim * sizeof(float)), 0)
            << isa_name(isa) << ", " << rows << " rows, " << threads << " threads";
      }
    }
  }
}

TEST(AttentionRows, EachRowAsAttentionPagedGivesIt) {
  std::mt19937 rng(13);
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kInt8}) {
    for (int n_ctx : {1, 5, 6, 8, 9, 16, 30, 125}) expect_rows_equal_each_row(64, 6, 6, n_ctx, dtype, rng);
    for (int head_size : {16, 40, 48, 80, 128, 144}) expect_rows_equal_each_row(head_size, 4, 4, 37, dtype, rng);
    for (const auto& [heads, kv_heads] : {std::pair{6, 3}, {12, 2}, {16, 2}, {10, 2}, {12, 4}, {4, 1}}) {
      expect_rows_equal_each_row(64, heads, kv_heads, 45, dtype, rng);
    }
    // Across the 64-position value tiles: groups of 12 and 16 heads (16 rows of them are more sums than the
    // kernel collects at once), a group of 6 whose walks of 4 mix two rows' heads, and blocks of 5 and 48
    // positions, which the tiles start inside of.
    for (const auto& [heads, kv_heads] : {std::pair{12, 1}, {16, 1}, {12, 2}}) {
      expect_rows_equal_each_row(32, heads, kv_heads, 100, dtype, rng);
    }
    for (int block_tokens : {5, 48}) expect_rows_equal_each_row(32, 12, 2, 100, dtype, rng, block_tokens);
  }
}

// More rows than a kernel takes at once, or rows whose buffers overlap, are a bug in the caller: a CHECK,
// not a silent truncation or a race.
TEST(AttentionRowsDeathTest, MoreRowsThanAtOnceAborts) {
  std::vector<float> x(64 * kAttentionRowsAtOnce * 2);
  const void* block = x.data();
  EXPECT_DEATH(attention_rows_paged(x.data(), 16, x.data(), 16, &block, &block, KvDtype::kF32, 16, x.data(), 16, 1,
                                    kAttentionRowsAtOnce + 1, 1, 1, 16, 16, Team{}),
               "rows at once");
  // A scratch stride shorter than the last row's scores would have the rows overwrite each other's.
  EXPECT_DEATH(attention_rows_paged(x.data(), 16, x.data(), 16, &block, &block, KvDtype::kF32, 16, x.data(), 16, 16, 2,
                                    1, 1, 16, 16, Team{}),
               "attention rows overlap");
}

}  // namespace
}  // namespace shardline::kernels::cpu
