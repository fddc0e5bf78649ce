// Each CUDA kernel against the CPU kernel (kernels/cpu/ops.h) or the CPU sampler on the same inputs. Label
// `cuda`: every test skips itself, with the reason, when there is no usable device (this CI machine has no
// NVIDIA driver); nothing else in the suite may skip.
//
// Comparisons use NMSE = Σ(gpu - cpu)² / Σ cpu², as tests/unit/kernels/cpu_ops_test.cpp does.
// - fp32, 1e-10: both sides are float with different summation orders (warp/block trees vs sequential).
//   Each side's error grows like k·u² in NMSE (u ≈ 6e-8): 1.7e-11 at k = 4096, the widest sum here. A real
//   mistake (a wrong kv head, a block-table row off by one, a dropped tail) costs at least one term in k,
//   NMSE ≥ ~1/k ≈ 2e-4.
// - elementwise ops with one transcendental (SwiGLU's expf, within 2 ulp on the device): 1e-12.
// - bf16 weights against the fp32 CPU matmul, 1e-5: bf16 keeps 8 significant bits, so rounding x and W each
//   costs a relative error uniform in ±2^-9 (RMS 1.1e-3); a product carries both (RMS 1.6e-3) and with
//   random signs the errors add like the terms, so NMSE ≈ 2.6e-6. 1e-5 is 4x that; a wrong layout or a
//   transposed matrix gives NMSE ≈ 2. Against a double reference of the same bf16-rounded inputs (what the
//   kernel computes exactly, up to fp32 accumulation) the bound is 1e-8.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/graph.h"
#include "kernels/cuda/ops.h"
#include "runtime/sampler.h"
#include "tests/support/nmse.h"
#include "tests/support/packed_weights.h"

namespace shardline::kernels::cuda {
namespace {

constexpr double kFp32Nmse = 1e-10;
constexpr double kElementwiseNmse = 1e-12;
constexpr double kBf16VersusFp32Nmse = 1e-5;
constexpr double kBf16VersusExactNmse = 1e-8;

using test::nmse;

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Round to nearest even, as the CPU bf16 packer does (kernels/cpu weight_format's float_to_bf16).
std::uint16_t to_bf16(float value) {
  std::uint32_t b;
  std::memcpy(&b, &value, 4);
  return static_cast<std::uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
float from_bf16(std::uint16_t bits) {
  const std::uint32_t b = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    const DeviceCount devices = device_count();
    if (devices.count == 0) GTEST_SKIP() << "no CUDA device: " << devices.reason;
    select_device(0);
    stream_ = std::make_unique<Stream>();
  }

  template <typename T>
  DeviceBuffer to_device(const std::vector<T>& host) {
    DeviceBuffer buffer(host.size() * sizeof(T));
    copy_to_device(buffer.data(), host.data(), host.size() * sizeof(T));
    return buffer;
  }
  template <typename T>
  std::vector<T> to_host(const DeviceBuffer& buffer, std::size_t n) {
    stream_->synchronize();
    std::vector<T> host(n);
    copy_to_host(host.data(), buffer.data(), n * sizeof(T));
    return host;
  }
  StreamRef stream() const { return stream_->ref(); }

  std::unique_ptr<Stream> stream_;
};

TEST_F(CudaOps, RmsnormMatchesCpu) {
  for (const int dim : {288, 100, 4096}) {
    const int n = 3;
    const auto x = random_floats(static_cast<std::size_t>(n) * dim, 1, 3.0f);
    const auto w = random_floats(dim, 2);
    std::vector<float> want(x.size());
    cpu::rmsnorm(want.data(), x.data(), w.data(), n, dim, 1e-5f);
    DeviceBuffer dx = to_device(x), dw = to_device(w), dout(x.size() * sizeof(float));
    rmsnorm(dout.as<float>(), dx.as<float>(), dw.as<float>(), n, dim, 1e-5f, stream());
    EXPECT_LT(nmse(to_host<float>(dout, x.size()), want), kFp32Nmse) << "dim " << dim;
    rmsnorm(dx.as<float>(), dx.as<float>(), dw.as<float>(), n, dim, 1e-5f, stream());  // in place
    EXPECT_LT(nmse(to_host<float>(dx, x.size()), want), kFp32Nmse) << "in place, dim " << dim;
  }
}

TEST_F(CudaOps, RopeWithFrequencyDivisorsMatchesCpu) {
  // Llama 3.1's scaling: each pair's angle divided by its factor (1 for the fast pairs, up to 8 for the slow).
  const std::vector<int> positions = {0, 5, 300, 4095};
  const int n_heads = 4, head_size = 64, n_tokens = static_cast<int>(positions.size());
  std::vector<float> divisors(head_size / 2);
  for (int i = 0; i < head_size / 2; ++i) divisors[i] = 1.0f + 7.0f * static_cast<float>(i) / (head_size / 2 - 1);
  const std::size_t row = static_cast<std::size_t>(n_heads) * head_size;
  auto x = random_floats(n_tokens * row, 5);
  std::vector<float> want = x, cos_sin(head_size), plain = x;
  for (int t = 0; t < n_tokens; ++t) {
    cpu::rope_angles(cos_sin.data(), head_size, positions[t], 500000.0f, divisors.data());
    cpu::rope_rotate(want.data() + t * row, n_heads, head_size, cos_sin.data());
  }
  DeviceBuffer dx = to_device(x), dpos = to_device(positions), ddiv = to_device(divisors);
  rope(dx.as<float>(), dpos.as<int>(), n_tokens, n_heads, head_size, 500000.0f, ddiv.as<float>(), stream());
  const auto got = to_host<float>(dx, x.size());
  EXPECT_LT(nmse(got, want), kElementwiseNmse);
  DeviceBuffer dplain = to_device(plain);
  rope(dplain.as<float>(), dpos.as<int>(), n_tokens, n_heads, head_size, 500000.0f, nullptr, stream());
  EXPECT_GT(nmse(to_host<float>(dplain, x.size()), want), 1e-6) << "the divisors must change the rotation";
}

TEST_F(CudaOps, RopeMatchesCpuAtEveryPosition) {
  // Far positions matter most: an error in a frequency grows with the position.
  const std::vector<int> positions = {0, 1, 37, 255, 1023, 4095};
  for (const int head_size : {48, 128}) {
    const int n_heads = 6;
    const int n_tokens = static_cast<int>(positions.size());
    const std::size_t row = static_cast<std::size_t>(n_heads) * head_size;
    auto x = random_floats(n_tokens * row, 3);
    std::vector<float> want = x;
    for (int t = 0; t < n_tokens; ++t) cpu::rope(want.data() + t * row, n_heads, head_size, positions[t], 10000.0f);
    DeviceBuffer dx = to_device(x), dpos = to_device(positions);
    rope(dx.as<float>(), dpos.as<int>(), n_tokens, n_heads, head_size, 10000.0f, nullptr, stream());
    const auto got = to_host<float>(dx, x.size());
    EXPECT_LT(nmse(got, want), kElementwiseNmse) << "head size " << head_size;
    std::size_t identical = 0;
    for (std::size_t i = 0; i < got.size(); ++i) identical += got[i] == want[i] ? 1 : 0;
    // Double-precision pow/cos/sin rounded once reproduce glibc's floats in most cases: glibc's cosf/sinf are
    // within 1 ulp but not always correctly rounded. Simulating the device's arithmetic on the host with
    // these inputs gives 98.8% (head size 48) and 99.2% (128) bit-identical values and NMSE ~1e-16.
    EXPECT_GT(identical, got.size() * 95 / 100) << identical << " of " << got.size() << " bit-identical";
  }
}

TEST_F(CudaOps, SwigluAddEmbeddingMatchCpu) {
  const std::size_t size = 100003;  // not a multiple of the block
  auto h1 = random_floats(size, 4, 6.0f);
  const auto h3 = random_floats(size, 5);
  DeviceBuffer d1 = to_device(h1), d3 = to_device(h3);
  swiglu(d1.as<float>(), d3.as<float>(), size, stream());
  std::vector<float> want = h1;
  cpu::swiglu(want.data(), h3.data(), static_cast<int>(size));
  EXPECT_LT(nmse(to_host<float>(d1, size), want), kElementwiseNmse);

  DeviceBuffer dy = to_device(h1);
  add_inplace(dy.as<float>(), d3.as<float>(), size, stream());
  std::vector<float> sum = h1;
  cpu::add_inplace(sum.data(), h3.data(), static_cast<int>(size));
  EXPECT_EQ(to_host<float>(dy, size), sum);  // one rounding, same on both: exact

  const int vocab = 50, dim = 300;
  const auto table = random_floats(static_cast<std::size_t>(vocab) * dim, 6);
  const std::vector<int> tokens = {7, 0, 49, 7};
  DeviceBuffer dtable = to_device(table), dtokens = to_device(tokens), dout(tokens.size() * dim * sizeof(float));
  embedding(dout.as<float>(), dtable.as<float>(), dtokens.as<int>(), 4, dim, stream());
  const auto got = to_host<float>(dout, tokens.size() * dim);
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    EXPECT_TRUE(std::equal(got.begin() + t * dim, got.begin() + (t + 1) * dim, table.begin() + tokens[t] * dim)) << t;
  }
}

TEST_F(CudaOps, Bf16ConversionRoundsToNearestEven) {
  std::vector<float> x = random_floats(4099, 7, 100.0f);
  x.push_back(1.0f + 1.0f / 256.0f);        // exactly halfway between two bf16 values: rounds to even (down)
  x.push_back(1.0f + 3.0f / 256.0f);        // halfway, rounds to even (up)
  x.push_back(-0.0f);
  DeviceBuffer dx = to_device(x), dout(x.size() * 2);
  convert_to_bf16(dout.as<std::uint16_t>(), dx.as<float>(), x.size(), stream());
  const auto got = to_host<std::uint16_t>(dout, x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], to_bf16(x[i])) << "value " << x[i];
}

// Two sequences in a pool whose blocks are shuffled (so a block-table mistake cannot pass by luck), laid
// out as runtime/kv_cache.h lays them: (n_layers, 2, block_tokens, kv_dim) per block.
TEST_F(CudaOps, PagedAttentionMatchesContiguousCpuAttention) {
  const int n_layers = 2, layer = 1, block_tokens = 16, n_heads = 8, n_kv_heads = 2, head_size = 64;
  const int kv_dim = n_kv_heads * head_size;
  const std::vector<int> lengths = {300, 17};
  const int max_blocks = (300 + block_tokens - 1) / block_tokens;
  const int n_blocks = 2 * max_blocks + 3;
  const std::size_t block_floats = static_cast<std::size_t>(n_layers) * 2 * block_tokens * kv_dim;

  std::vector<int> pool_order(n_blocks);
  std::iota(pool_order.begin(), pool_order.end(), 0);
  std::shuffle(pool_order.begin(), pool_order.end(), std::mt19937(8));
  std::vector<float> pool = random_floats(n_blocks * block_floats, 9);  // unused rows hold garbage
  std::vector<int> tables(2 * max_blocks, -1);
  std::vector<std::vector<float>> keys(2), values(2);  // contiguous copies for the CPU: (len, kv_dim)
  int next_block = 0;
  for (int s = 0; s < 2; ++s) {
    keys[s] = random_floats(static_cast<std::size_t>(lengths[s]) * kv_dim, 10 + s);
    values[s] = random_floats(static_cast<std::size_t>(lengths[s]) * kv_dim, 20 + s);
    for (int p = 0; p < lengths[s]; ++p) {
      if (p % block_tokens == 0) tables[s * max_blocks + p / block_tokens] = pool_order[next_block++];
      const std::size_t block = static_cast<std::size_t>(tables[s * max_blocks + p / block_tokens]) * block_floats;
      const std::size_t k_row = block + (static_cast<std::size_t>(2 * layer) * block_tokens + p % block_tokens) * kv_dim;
      const std::size_t v_row = k_row + static_cast<std::size_t>(block_tokens) * kv_dim;
      std::copy_n(keys[s].begin() + p * kv_dim, kv_dim, pool.begin() + k_row);
      std::copy_n(values[s].begin() + p * kv_dim, kv_dim, pool.begin() + v_row);
    }
  }
  // Queries: a decode step of both sequences, and three prefill-style queries of sequence 0 at earlier
  // positions (each sees only its causal prefix).
  const std::vector<int> query_table = {0, 1, 0, 0, 0};
  const std::vector<int> query_n_ctx = {300, 17, 1, 16, 33};
  const int n_queries = static_cast<int>(query_table.size());
  const std::size_t q_row = static_cast<std::size_t>(n_heads) * head_size;
  const auto q = random_floats(n_queries * q_row, 30);

  std::vector<float> want(n_queries * q_row);
  std::vector<float> scratch(static_cast<std::size_t>(n_heads) * 300);
  for (int i = 0; i < n_queries; ++i) {
    const int s = query_table[i];
    cpu::attention(want.data() + i * q_row, q.data() + i * q_row, keys[s].data(), values[s].data(), scratch.data(),
                   query_n_ctx[i], n_heads, n_kv_heads, head_size, kv_dim);
  }

  DeviceBuffer dpool = to_device(pool), dtables = to_device(tables), dq = to_device(q);
  DeviceBuffer dquery_table = to_device(query_table), dn_ctx = to_device(query_n_ctx);
  DeviceBuffer dout(want.size() * sizeof(float)), dscratch(static_cast<std::size_t>(n_queries) * n_heads * 300 * 4);
  PagedAttention args;
  args.out = dout.as<float>();
  args.q = dq.as<float>();
  args.kv_pool = dpool.as<float>();
  args.block_floats = block_floats;
  args.layer = layer;
  args.block_tokens = block_tokens;
  args.block_tables = dtables.as<int>();
  args.max_blocks_per_table = max_blocks;
  args.query_table = dquery_table.as<int>();
  args.query_n_ctx = dn_ctx.as<int>();
  args.n_queries = n_queries;
  args.n_heads = n_heads;
  args.n_kv_heads = n_kv_heads;
  args.head_size = head_size;
  args.kv_stride = kv_dim;
  args.max_ctx = 300;
  args.scratch = dscratch.as<float>();
  attention_paged(args, stream());
  const auto got = to_host<float>(dout, want.size());
  for (int i = 0; i < n_queries; ++i) {
    EXPECT_LT(nmse(std::span(got).subspan(i * q_row, q_row), std::span(want).subspan(i * q_row, q_row)), kFp32Nmse)
        << "query " << i << " (sequence " << query_table[i] << ", " << query_n_ctx[i] << " positions)";
  }
}

TEST_F(CudaOps, KvWriteLandsEachRowInItsBlockAndReplaysAtNewPositions) {
  const int n_layers = 3, layer = 2, block_tokens = 4, kv_dim = 40, max_blocks = 4, n_blocks = 9;
  const std::size_t block_floats = static_cast<std::size_t>(n_layers) * 2 * block_tokens * kv_dim;
  // Two sequences: rows 0 and 2 belong to sequence 1, row 1 to sequence 0 (tables in a shuffled pool).
  const std::vector<int> tables = {5, 2, 7, -1, 0, 8, 3, 6};  // (2, max_blocks)
  const std::vector<int> query_table = {1, 0, 1};
  std::vector<int> positions = {9, 3, 10};
  const int n = static_cast<int>(query_table.size());
  const auto k = random_floats(static_cast<std::size_t>(n) * kv_dim, 40);
  const auto v = random_floats(static_cast<std::size_t>(n) * kv_dim, 41);
  DeviceBuffer dpool(n_blocks * block_floats * sizeof(float));
  fill_zero_async(dpool.data(), dpool.bytes(), stream());
  DeviceBuffer dtables = to_device(tables), dquery = to_device(query_table), dpos = to_device(positions);
  DeviceBuffer dk = to_device(k), dv = to_device(v);
  PagedKvWrite args;
  args.kv_pool = dpool.as<float>();
  args.block_floats = block_floats;
  args.layer = layer;
  args.block_tokens = block_tokens;
  args.block_tables = dtables.as<int>();
  args.max_blocks_per_table = max_blocks;
  args.query_table = dquery.as<int>();
  args.positions = dpos.as<int>();
  args.k = dk.as<float>();
  args.v = dv.as<float>();
  args.n_queries = n;
  args.kv_stride = kv_dim;
  auto expect_rows_at = [&](const std::vector<int>& pos, const char* when) {
    const auto pool = to_host<float>(dpool, n_blocks * block_floats);
    for (int r = 0; r < n; ++r) {
      const int block = tables[query_table[r] * max_blocks + pos[r] / block_tokens];
      const std::size_t key_row =
          block * block_floats + (static_cast<std::size_t>(2 * layer) * block_tokens + pos[r] % block_tokens) * kv_dim;
      const std::size_t value_row = key_row + static_cast<std::size_t>(block_tokens) * kv_dim;
      for (int i = 0; i < kv_dim; ++i) {
        ASSERT_EQ(pool[key_row + i], k[r * kv_dim + i]) << when << ": row " << r << " key " << i;
        ASSERT_EQ(pool[value_row + i], v[r * kv_dim + i]) << when << ": row " << r << " value " << i;
      }
    }
    // Nothing else was written: the pool holds exactly n keys and n values.
    const auto nonzero = std::count_if(pool.begin(), pool.end(), [](float x) { return x != 0.0f; });
    EXPECT_LE(nonzero, 2 * n * kv_dim) << when;
  };
  kv_write_paged(args, stream());
  expect_rows_at(positions, "eager");
  // Captured once, replayed after the positions moved on the device: the rows follow the positions.
  fill_zero_async(dpool.data(), dpool.bytes(), stream());
  const Graph graph = Graph::capture(*stream_, [&] { kv_write_paged(args, stream()); });
  positions = {11, 4, 12};  // sequence 0 crosses into its second block
  // On the replay's stream: a blocking copy runs on the legacy stream, unordered with this non-blocking one.
  copy_to_device_async(dpos.data(), positions.data(), positions.size() * sizeof(int), stream());
  graph.launch(stream());
  expect_rows_at(positions, "replay");
}

TEST_F(CudaOps, ArgmaxTakesTheFirstMaximum) {
  const int n_rows = 3, size = 32000;
  auto x = random_floats(static_cast<std::size_t>(n_rows) * size, 40);
  x[5] = 9.0f;  // row 0: a tie between 5 and 31000, the first wins
  x[31000] = 9.0f;
  x[size + size - 1] = 9.0f;  // row 1: the very last element
  x[2 * size] = 9.0f;         // row 2: the very first
  DeviceBuffer dx = to_device(x), dout(n_rows * sizeof(int));
  argmax(dout.as<int>(), dx.as<float>(), n_rows, size, stream());
  const auto got = to_host<int>(dout, n_rows);
  for (int r = 0; r < n_rows; ++r) EXPECT_EQ(got[r], cpu::argmax(x.data() + r * size, size)) << "row " << r;
  EXPECT_EQ(got[0], 5);
}

TEST_F(CudaOps, Fp32MatmulMatchesCpu) {
  Blas blas(BlasOptions{8, 0});
  for (const int n : {1, 5}) {
    for (const auto& [k, d] : {std::pair{288, 771}, std::pair{4096, 1024}}) {
      const auto x = random_floats(static_cast<std::size_t>(n) * k, 50);
      const auto w = random_floats(static_cast<std::size_t>(d) * k, 51);
      const std::vector<float> want = test::cpu_fp32_matmul(x, w, n, k, d);
      const DeviceMatrix dw = DeviceMatrix::upload(w.data(), k, d, k, DeviceDtype::kF32);
      DeviceBuffer dx = to_device(x), dy(want.size() * sizeof(float));
      blas.matmul(dy.as<float>(), dx.as<float>(), dw.view(), n, stream());
      EXPECT_LT(nmse(to_host<float>(dy, want.size()), want), kFp32Nmse) << "n " << n << " k " << k << " d " << d;
    }
  }
}

TEST_F(CudaOps, ColumnSliceUploadsWithItsRowStride) {
  // wo and w2 under tensor parallelism: columns [k0, k0 + k) of a (d, full_k) matrix, uploaded in place.
  const int d = 200, full_k = 512, k0 = 256, k = 256, n = 2;
  const auto w = random_floats(static_cast<std::size_t>(d) * full_k, 60);
  const auto x = random_floats(static_cast<std::size_t>(n) * k, 61);
  std::vector<float> slice(static_cast<std::size_t>(d) * k);
  for (int i = 0; i < d; ++i) std::copy_n(w.begin() + i * full_k + k0, k, slice.begin() + i * k);
  const std::vector<float> want = test::cpu_fp32_matmul(x, slice, n, k, d);
  for (const DeviceDtype dtype : {DeviceDtype::kF32, DeviceDtype::kBf16}) {
    Blas blas(BlasOptions{n, k});
    const DeviceMatrix dw = DeviceMatrix::upload(w.data() + k0, full_k, d, k, dtype);
    DeviceBuffer dx = to_device(x), dy(want.size() * sizeof(float));
    blas.matmul(dy.as<float>(), dx.as<float>(), dw.view(), n, stream());
    EXPECT_LT(nmse(to_host<float>(dy, want.size()), want),
              dtype == DeviceDtype::kF32 ? kFp32Nmse : kBf16VersusFp32Nmse);
  }
}

TEST_F(CudaOps, Bf16MatmulWithinItsStatedTolerance) {
  const int n = 4, k = 4096, d = 1000;
  const auto x = random_floats(static_cast<std::size_t>(n) * k, 70);
  const auto w = random_floats(static_cast<std::size_t>(d) * k, 71);
  const std::vector<float> fp32 = test::cpu_fp32_matmul(x, w, n, k, d);
  std::vector<float> exact(fp32.size());  // the same bf16-rounded operands, multiplied in double
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < d; ++i) {
      double acc = 0.0;
      for (int j = 0; j < k; ++j) {
        acc += static_cast<double>(from_bf16(to_bf16(x[r * k + j]))) * from_bf16(to_bf16(w[static_cast<std::size_t>(i) * k + j]));
      }
      exact[r * d + i] = static_cast<float>(acc);
    }
  }
  Blas blas(BlasOptions{n, k});
  const DeviceMatrix dw = DeviceMatrix::upload(w.data(), k, d, k, DeviceDtype::kBf16);
  EXPECT_EQ(dw.bytes(), static_cast<std::size_t>(d) * k * 2);
  DeviceBuffer dx = to_device(x), dy(fp32.size() * sizeof(float));
  blas.matmul(dy.as<float>(), dx.as<float>(), dw.view(), n, stream());
  const auto got = to_host<float>(dy, fp32.size());
  EXPECT_LT(nmse(got, exact), kBf16VersusExactNmse);
  const double versus_fp32 = nmse(got, fp32);
  EXPECT_LT(versus_fp32, kBf16VersusFp32Nmse);
  EXPECT_GT(versus_fp32, 1e-8) << "bf16 weights should not be as accurate as fp32: were they rounded at all?";
}

// A decode-like chain (norm, matmul, residual, rope at a device-side position, argmax) recorded into a
// CUDA graph replays to the result of running it directly: every op is capture-safe.
TEST_F(CudaOps, GraphReplaysADecodeLikeChain) {
  const int dim = 512, vocab = 3000, head_size = 64;
  const auto x0 = random_floats(dim, 80);
  const auto norm_w = random_floats(dim, 81);
  const auto w = random_floats(static_cast<std::size_t>(vocab) * dim, 82);
  Blas blas(BlasOptions{1, dim});
  const DeviceMatrix dw = DeviceMatrix::upload(w.data(), dim, vocab, dim, DeviceDtype::kBf16);
  DeviceBuffer dx = to_device(x0), dnorm = to_device(norm_w), dpos = to_device(std::vector<int>{41});
  DeviceBuffer dh(dim * 4), dlogits(vocab * 4), dtoken(4);
  auto step = [&] {
    rmsnorm(dh.as<float>(), dx.as<float>(), dnorm.as<float>(), 1, dim, 1e-5f, stream());
    rope(dh.as<float>(), dpos.as<int>(), 1, dim / head_size, head_size, 10000.0f, nullptr, stream());
    add_inplace(dh.as<float>(), dx.as<float>(), dim, stream());
    blas.matmul(dlogits.as<float>(), dh.as<float>(), dw.view(), 1, stream());
    argmax(dtoken.as<int>(), dlogits.as<float>(), 1, vocab, stream());
  };
  step();
  const auto eager_logits = to_host<float>(dlogits, vocab);
  const int eager_token = to_host<int>(dtoken, 1)[0];
  fill_zero_async(dlogits.data(), vocab * 4, stream());
  const Graph graph = Graph::capture(*stream_, step);
  ASSERT_FALSE(graph.empty());
  EXPECT_EQ(to_host<float>(dlogits, vocab), std::vector<float>(vocab, 0.0f)) << "capture must not run the work";
  for (int replay = 0; replay < 3; ++replay) {
    graph.launch(stream());
    EXPECT_LT(nmse(to_host<float>(dlogits, vocab), eager_logits), kFp32Nmse) << "replay " << replay;
    EXPECT_EQ(to_host<int>(dtoken, 1)[0], eager_token);
  }
}

// The CPU sampler's coin for a fresh Sampler with this seed: llama2.c's xorshift64* (runtime/sampler.cpp).
float first_coin(std::uint64_t seed) {
  std::uint64_t state = seed;
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  const auto u32 = static_cast<std::uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
  return static_cast<float>(u32 >> 8) / 16777216.0f;
}

TEST_F(CudaOps, SamplerPicksTheCpuSamplersTokens) {
  const int vocab = 32000, n_rows = 4;
  TokenSampler sampler(TokenSamplerOptions{n_rows, vocab});
  DeviceBuffer dlogits(static_cast<std::size_t>(n_rows) * vocab * 4), dcoins(n_rows * 4), dtokens(n_rows * 4);
  struct Setting {
    float temperature;
    float top_p;
  };
  for (const Setting setting : {Setting{0.0f, 0.9f}, Setting{1.0f, 0.9f}, Setting{0.8f, 0.5f}, Setting{1.0f, 1.0f}}) {
    for (std::uint64_t seed = 1; seed <= 25; ++seed) {
      // Peaked logits, like a model's: a few likely tokens, so top-p has a real nucleus to cut.
      auto logits = random_floats(static_cast<std::size_t>(n_rows) * vocab, static_cast<std::uint32_t>(seed), 2.0f);
      for (int r = 0; r < n_rows; ++r) {
        for (int j = 0; j < 8; ++j) logits[r * vocab + (seed * 131 + j * 977 + r) % vocab] += 6.0f + j;
      }
      std::vector<float> coins(n_rows);
      std::vector<int> want(n_rows);
      for (int r = 0; r < n_rows; ++r) {
        const std::uint64_t row_seed = seed * 100 + r;
        coins[r] = first_coin(row_seed);
        runtime::Sampler cpu_sampler(vocab, {setting.temperature, setting.top_p, row_seed});
        std::vector<float> row(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
        want[r] = cpu_sampler.sample(row.data());
      }
      copy_to_device(dlogits.data(), logits.data(), logits.size() * 4);
      copy_to_device(dcoins.data(), coins.data(), coins.size() * 4);
      sampler.sample(dtokens.as<int>(), dlogits.as<float>(), dcoins.as<float>(), n_rows, setting.temperature,
                     setting.top_p, stream());
      EXPECT_EQ(to_host<int>(dtokens, n_rows), want)
          << "temperature " << setting.temperature << " top-p " << setting.top_p << " seed " << seed;
    }
  }
}

}  // namespace
}  // namespace shardline::kernels::cuda
