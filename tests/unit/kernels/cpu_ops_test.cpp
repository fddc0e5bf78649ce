// Each CPU kernel against a naive double-precision reference written here, compared with a normalised
// error as ggml's test-backend-ops does. Sizes are chosen to hit the kernels' edge paths, and shapes big
// enough that the OpenMP regions really run with 2 threads (their `if` clauses skip small work). The matmul
// the runtime uses (packed weights) has its own test: packed_matmul_test.cpp.
#include "kernels/cpu/ops.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/kernel_fixtures.h"
#include "tests/support/nmse.h"

namespace shardline::kernels::cpu {
namespace {

using test::nmse_below;
using test::random_floats;
using test::ScopedThreads;
// NMSE bound for a float kernel against a double reference, and why: tests/support/nmse.h.
constexpr double kMaxNmse = test::kFloatKernelMaxNmse;

constexpr int kThreadCounts[] = {1, 2};

// ---------------------------------------------------------------------------------------------------------
// Naive double-precision references. Inputs are the float values the kernel sees, widened.

// out, x: (n, dim)   weight: (dim)
std::vector<double> ref_rmsnorm(const std::vector<float>& x, const std::vector<float>& weight, int n, int dim,
                                double eps) {
  std::vector<double> out(x.size());
  for (int r = 0; r < n; ++r) {
    const float* xr = x.data() + static_cast<std::size_t>(r) * dim;
    double ss = 0.0;
    for (int j = 0; j < dim; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const double scale = 1.0 / std::sqrt(ss / dim + eps);
    for (int j = 0; j < dim; ++j) out[static_cast<std::size_t>(r) * dim + j] = xr[j] * scale * weight[j];
  }
  return out;
}

// vec: (n_heads, head_size). Pair (i, i+1), i even, rotates by pos · theta^(-i / head_size).
std::vector<double> ref_rope(const std::vector<float>& vec, int n_heads, int head_size, int pos, double theta) {
  std::vector<double> out(vec.size());
  for (int h = 0; h < n_heads; ++h) {
    const std::size_t base = static_cast<std::size_t>(h) * head_size;
    for (int i = 0; i < head_size; i += 2) {
      const double freq = 1.0 / std::pow(theta, static_cast<double>(i) / head_size);
      const double angle = pos * freq;
      const double v0 = vec[base + i];
      const double v1 = vec[base + i + 1];
      out[base + i] = v0 * std::cos(angle) - v1 * std::sin(angle);
      out[base + i + 1] = v0 * std::sin(angle) + v1 * std::cos(angle);
    }
  }
  return out;
}

std::vector<double> ref_softmax(std::span<const float> x) {
  double max_val = -std::numeric_limits<double>::infinity();
  for (float v : x) max_val = std::max(max_val, static_cast<double>(v));
  std::vector<double> out(x.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) sum += out[i] = std::exp(x[i] - max_val);
  for (double& v : out) v /= sum;
  return out;
}

// out: (n_heads, head_size)   q: (n_heads, head_size)   k_cache, v_cache: (n_ctx, kv_stride)
std::vector<double> ref_attention(const std::vector<float>& q, const std::vector<float>& k_cache,
                                  const std::vector<float>& v_cache, int n_ctx, int n_heads, int n_kv_heads,
                                  int head_size, int kv_stride) {
  std::vector<double> out(static_cast<std::size_t>(n_heads) * head_size, 0.0);
  for (int h = 0; h < n_heads; ++h) {
    const int kv_head = h / (n_heads / n_kv_heads);
    const std::size_t q_off = static_cast<std::size_t>(h) * head_size;
    std::vector<double> scores(n_ctx);
    double max_score = -std::numeric_limits<double>::infinity();
    for (int t = 0; t < n_ctx; ++t) {
      const std::size_t k_off = static_cast<std::size_t>(t) * kv_stride + static_cast<std::size_t>(kv_head) * head_size;
      double dot = 0.0;
      for (int i = 0; i < head_size; ++i) dot += static_cast<double>(q[q_off + i]) * k_cache[k_off + i];
      scores[t] = dot / std::sqrt(static_cast<double>(head_size));
      max_score = std::max(max_score, scores[t]);
    }
    double sum = 0.0;
    for (double& s : scores) sum += s = std::exp(s - max_score);
    for (int t = 0; t < n_ctx; ++t) {
      const std::size_t v_off = static_cast<std::size_t>(t) * kv_stride + static_cast<std::size_t>(kv_head) * head_size;
      for (int i = 0; i < head_size; ++i) out[q_off + i] += scores[t] / sum * v_cache[v_off + i];
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// threads

TEST(CpuThreads, SetReturnsPreviousAndClampsToOne) {
  ScopedThreads restore(1);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(set_num_threads(2), 1);
  EXPECT_EQ(num_threads(), 2);
  EXPECT_EQ(set_num_threads(0), 2);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(-3);
  EXPECT_EQ(num_threads(), 1);
}

// ---------------------------------------------------------------------------------------------------------
// rmsnorm

TEST(CpuRmsnorm, MatchesReference) {
  std::mt19937 rng(7);
  const float eps = 1e-5f;
  for (int dim : {1, 7, 17, 768}) {
    for (int n : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " dim=" << dim);
      const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * dim, -3.0f, 3.0f);
      const std::vector<float> weight = random_floats(rng, dim, 0.5f, 1.5f);
      std::vector<float> out(x.size());
      rmsnorm(out.data(), x.data(), weight.data(), n, dim, eps);
      EXPECT_TRUE(nmse_below(out, ref_rmsnorm(x, weight, n, dim, eps)));
    }
  }
}

// The kernel sums the squares of several rows side by side; each row must still be llama2.c's float
// computation bit for bit (one sequential sum per row), whatever the batch and the thread count.
TEST(CpuRmsnorm, EveryBatchGivesLlama2cBits) {
  std::mt19937 rng(9);
  const int dim = 288;
  const float eps = 1e-5f;
  const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(20) * dim, -3.0f, 3.0f);
  const std::vector<float> weight = random_floats(rng, dim, 0.5f, 1.5f);
  std::vector<float> want(x.size());
  for (int r = 0; r < 20; ++r) {
    const float* xr = x.data() + static_cast<std::size_t>(r) * dim;
    float ss = 0.0f;
    for (int j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    ss /= static_cast<float>(dim);
    ss += eps;
    const float scale = 1.0f / std::sqrt(ss);
    for (int j = 0; j < dim; ++j) want[static_cast<std::size_t>(r) * dim + j] = weight[j] * (scale * xr[j]);
  }
  for (int threads : {1, 2, 3}) {
    ScopedThreads scoped(threads);
    for (int n = 1; n <= 20; ++n) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " threads=" << threads);
      std::vector<float> out(static_cast<std::size_t>(n) * dim);
      rmsnorm(out.data(), x.data(), weight.data(), n, dim, eps);
      EXPECT_TRUE(std::equal(out.begin(), out.end(), want.begin()));
    }
  }
}

// Finite values whose float squares overflow (a damaged weight of 1e30 reached the hidden state): the row
// must still normalise (1 / sqrt(inf) = 0 zeroed it, every logit after it, and picked token 0 silently),
// beside ordinary rows that keep their bits; a row holding Inf stays non-finite, for the pipeline's warning.
TEST(CpuRmsnorm, RowsWhoseSquaresOverflowFloatStillNormalise) {
  std::mt19937 rng(10);
  const int dim = 64;
  const float eps = 1e-5f;
  std::vector<float> x = random_floats(rng, static_cast<std::size_t>(3) * dim, -3.0f, 3.0f);
  const std::vector<float> ordinary(x.begin() + 2 * dim, x.end());
  for (int j = 0; j < dim; ++j) x[j] *= 1e25f;  // row 0: squares up to 9e50
  x[dim + 5] = std::numeric_limits<float>::infinity();  // row 1
  const std::vector<float> weight = random_floats(rng, dim, 0.5f, 1.5f);
  std::vector<float> want_ordinary(dim);
  rmsnorm(want_ordinary.data(), ordinary.data(), weight.data(), 1, dim, eps);
  for (int threads : {1, 2}) {
    ScopedThreads scoped(threads);
    std::vector<float> out(x.size());
    rmsnorm(out.data(), x.data(), weight.data(), 3, dim, eps);
    double ss = 0.0;
    for (int j = 0; j < dim; ++j) ss += static_cast<double>(x[j]) * x[j];
    const double scale = 1.0 / std::sqrt(ss / dim);
    for (int j = 0; j < dim; ++j) {
      EXPECT_NEAR(out[j], weight[j] * x[j] * scale, 1e-5 * std::fabs(weight[j] * x[j] * scale) + 1e-7) << j;
    }
    EXPECT_FALSE(std::isfinite(out[dim + 5]));
    EXPECT_TRUE(std::equal(want_ordinary.begin(), want_ordinary.end(), out.begin() + 2 * dim));
  }
}

TEST(CpuRmsnorm, OutMayAliasX) {
  std::mt19937 rng(8);
  const int n = 3, dim = 37;
  const float eps = 1e-5f;
  const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * dim);
  const std::vector<float> weight = random_floats(rng, dim, 0.5f, 1.5f);
  std::vector<float> separate(x.size());
  rmsnorm(separate.data(), x.data(), weight.data(), n, dim, eps);
  std::vector<float> in_place = x;
  rmsnorm(in_place.data(), in_place.data(), weight.data(), n, dim, eps);
  EXPECT_EQ(in_place, separate);
  EXPECT_TRUE(nmse_below(in_place, ref_rmsnorm(x, weight, n, dim, eps)));
}

// ---------------------------------------------------------------------------------------------------------
// rope

TEST(CpuRope, PositionZeroIsIdentity) {
  std::mt19937 rng(11);
  const int n_heads = 4, head_size = 64;
  const std::vector<float> vec = random_floats(rng, static_cast<std::size_t>(n_heads) * head_size);
  std::vector<float> rotated = vec;
  rope(rotated.data(), n_heads, head_size, /*pos=*/0, 10000.0f);
  EXPECT_EQ(rotated, vec);  // cos 0 = 1 and sin 0 = 0 exactly, so not even rounding may change a value
}

TEST(CpuRope, MatchesFormulaAtLaterPositions) {
  // The kernel computes each frequency with powf and the angle pos · freq in float, so the angle's absolute
  // error grows like pos · freq · u and the NMSE like its square: measured 5e-13 at pos 100, 2e-11 at 511
  // and 7e-11 at 2047 (head_size 64). Positions up to 100 keep the common bound; 511 and 2047 (a long
  // context) get 1e-8, which still catches a wrong frequency or pairing (those cost NMSE of order 1).
  std::mt19937 rng(12);
  const struct {
    int pos;
    double max_nmse;
  } cases[] = {{1, kMaxNmse}, {2, kMaxNmse}, {17, kMaxNmse}, {100, kMaxNmse}, {511, 1e-8}, {2047, 1e-8}};
  for (int head_size : {2, 6, 64}) {
    for (const auto& c : cases) {
      SCOPED_TRACE(::testing::Message() << "head_size=" << head_size << " pos=" << c.pos);
      const int n_heads = 3;
      const std::vector<float> vec = random_floats(rng, static_cast<std::size_t>(n_heads) * head_size);
      std::vector<float> rotated = vec;
      rope(rotated.data(), n_heads, head_size, c.pos, 10000.0f);
      EXPECT_TRUE(nmse_below(rotated, ref_rope(vec, n_heads, head_size, c.pos, 10000.0), c.max_nmse));
    }
  }
}

TEST(CpuRope, AnglesOnceThenRotateIsRopeBitForBit) {
  // The stage computes a row's angles once per forward pass and rotates every layer's q and k with them:
  // it must be the very rope() each layer ran before. head_size 600 passes rope()'s 256-float chunks.
  std::mt19937 rng(13);
  for (int head_size : {2, 64, 128, 600}) {
    for (int pos : {0, 1, 37, 2047}) {
      SCOPED_TRACE(::testing::Message() << "head_size=" << head_size << " pos=" << pos);
      const int n_heads = 3;
      const std::vector<float> vec = random_floats(rng, static_cast<std::size_t>(n_heads) * head_size);
      std::vector<float> whole = vec, halves = vec, angles(head_size);
      rope(whole.data(), n_heads, head_size, pos, 10000.0f);
      rope_angles(angles.data(), head_size, pos, 10000.0f);
      rope_rotate(halves.data(), n_heads, head_size, angles.data());
      EXPECT_EQ(halves, whole);
      if (pos > 0) {
        EXPECT_TRUE(nmse_below(whole, ref_rope(vec, n_heads, head_size, pos, 10000.0), 1e-8));
      }
    }
  }
}

TEST(CpuRope, FrequencyDivisorsDivideEachPairsAngle) {
  // Llama 3.1's RoPE scaling (a GGUF file's rope_freqs.weight): pair i turns by pos * base^(-2i/d) / f[i], as
  // ggml divides its angle. Divisors of 1 change nothing.
  const int head_size = 8, pos = 37;
  const std::vector<float> divisors = {1.0f, 2.0f, 8.0f, 32.0f};
  std::vector<float> plain(head_size), ones(head_size), scaled(head_size);
  rope_angles(plain.data(), head_size, pos, 500000.0f);
  const std::vector<float> unit(head_size / 2, 1.0f);
  rope_angles(ones.data(), head_size, pos, 500000.0f, unit.data());
  EXPECT_EQ(ones, plain);
  rope_angles(scaled.data(), head_size, pos, 500000.0f, divisors.data());
  for (int p = 0; p < head_size / 2; ++p) {
    const double angle = pos * std::pow(500000.0, -2.0 * p / head_size) / divisors[p];
    EXPECT_NEAR(scaled[2 * p], std::cos(angle), 1e-6) << "pair " << p;
    EXPECT_NEAR(scaled[2 * p + 1], std::sin(angle), 1e-6) << "pair " << p;
  }
  EXPECT_EQ(scaled[0], plain[0]);  // pair 0's divisor is 1
  EXPECT_NE(scaled[2], plain[2]);
}

TEST(CpuRope, BitIdenticalOnEveryIsa) {
  // The rotation is a row kernel (row_kernels.h), with AVX-512 intrinsics on 8 pairs at a time and a masked
  // vector for what is left of a head (head sizes 6 and 600 leave tails; 600 also takes rope()'s chunks).
  std::mt19937 rng(14);
  for (int head_size : {6, 64, 128, 600}) {
    const int n_heads = 3, pos = 123;
    const std::vector<float> vec = random_floats(rng, static_cast<std::size_t>(n_heads) * head_size);
    std::vector<float> angles(head_size), want = vec, want_rope = vec;
    rope_angles(angles.data(), head_size, pos, 10000.0f);
    {
      test::ScopedIsa portable(Isa::kPortable);
      rope_rotate(want.data(), n_heads, head_size, angles.data());
      rope(want_rope.data(), n_heads, head_size, pos, 10000.0f);
    }
    for (Isa isa : test::runnable_isas()) {
      SCOPED_TRACE(::testing::Message() << "head_size=" << head_size << " " << isa_name(isa));
      test::ScopedIsa scoped(isa);
      std::vector<float> got = vec, got_rope = vec;
      rope_rotate(got.data(), n_heads, head_size, angles.data());
      rope(got_rope.data(), n_heads, head_size, pos, 10000.0f);
      EXPECT_EQ(got, want);
      EXPECT_EQ(got_rope, want_rope);
      EXPECT_EQ(got_rope, got);
    }
  }
}

TEST(CpuRope, FirstPairRotatesByPosRadians) {
  // freq for i = 0 is theta^0 = 1: the first pair of every head turns by exactly pos radians.
  std::vector<float> vec = {1.0f, 0.0f, 0.0f, 0.0f, /*head 1*/ 0.0f, 1.0f, 0.0f, 0.0f};
  rope(vec.data(), /*n_heads=*/2, /*head_size=*/4, /*pos=*/1, 10000.0f);
  EXPECT_NEAR(vec[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(vec[1], std::sin(1.0), 1e-6);
  EXPECT_NEAR(vec[4], -std::sin(1.0), 1e-6);
  EXPECT_NEAR(vec[5], std::cos(1.0), 1e-6);
}

// ---------------------------------------------------------------------------------------------------------
// softmax

TEST(CpuSoftmax, MatchesReferenceAndSumsToOne) {
  std::mt19937 rng(21);
  for (int size : {1, 2, 5, 17, 1000}) {
    SCOPED_TRACE(::testing::Message() << "size=" << size);
    const std::vector<float> x = random_floats(rng, size, -8.0f, 8.0f);
    std::vector<float> p = x;
    softmax(p.data(), size);
    EXPECT_TRUE(nmse_below(p, ref_softmax(x)));
    double sum = 0.0;
    for (float v : p) sum += v;
    EXPECT_NEAR(sum, 1.0, 1e-5);  // a float sum of 1000 terms, each rounded once
  }
}

TEST(CpuSoftmax, StableForLargeInputs) {
  // exp(1000) overflows float (and double); only the max-subtracted form gives finite results.
  const double e = std::numbers::e;
  std::vector<float> p = {1000.0f, 1001.0f};
  softmax(p.data(), 2);
  EXPECT_TRUE(nmse_below(p, std::vector<double>{1.0 / (1.0 + e), e / (1.0 + e)}));

  p = {-1000.0f, -1001.0f};
  softmax(p.data(), 2);
  EXPECT_TRUE(nmse_below(p, std::vector<double>{e / (1.0 + e), 1.0 / (1.0 + e)}));

  p = {3e38f, 3e38f, 3e38f, 3e38f};
  softmax(p.data(), 4);
  EXPECT_TRUE(nmse_below(p, std::vector<double>(4, 0.25)));
}

// The kernels' own exp (row_kernels_generic.inl) is within 2 ulp of the true value. softmax of (0, x)
// gives e^x / (1 + e^x) in its second entry, so for x <= 0 its relative error is exp's (plus a division,
// an addition and a multiplication, each half an ulp): bounded here by 4 ulp over [-87, 0], subnormal results
// excluded. Positive arguments go through swiglu below.
TEST(CpuSoftmax, ExpIsWithinUlpsOfTheTrueValue) {
  constexpr double kUlp = 1.0 / (1 << 23);
  double worst = 0;
  for (double x = -87.0; x <= 0.0; x += 0.0137) {
    std::vector<float> p = {0.0f, static_cast<float>(x)};
    softmax(p.data(), 2);
    const double ex = std::exp(static_cast<double>(static_cast<float>(x)));
    const double want = ex / (1.0 + ex);
    worst = std::max(worst, std::fabs(p[1] - want) / want);
  }
  EXPECT_LT(worst, 4 * kUlp) << "worst relative error " << worst / kUlp << " ulp";
}

// ---------------------------------------------------------------------------------------------------------
// swiglu, add_inplace

TEST(CpuSwiglu, ExpIsWithinUlpsOfTheTrueValue) {
  // silu(h) with u = 1 is h / (1 + e^-h): for h <= -1 its relative error is nearly all of exp(-h)'s, on
  // [1, 87]. Bound: 4 ulp (exp's 2 plus the addition, division and two multiplications).
  constexpr double kUlp = 1.0 / (1 << 23);
  std::vector<float> h, u;
  for (double x = -87.0; x <= -1.0; x += 0.0093) h.push_back(static_cast<float>(x));
  u.assign(h.size(), 1.0f);
  std::vector<float> got = h;
  swiglu(got.data(), u.data(), static_cast<int>(got.size()));
  double worst = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    const double want = h[i] / (1.0 + std::exp(-static_cast<double>(h[i])));
    worst = std::max(worst, std::fabs(got[i] - want) / std::fabs(want));
  }
  EXPECT_LT(worst, 4 * kUlp) << "worst relative error " << worst / kUlp << " ulp";
}

TEST(CpuSwiglu, SoftmaxAndSwigluBitIdenticalOnEveryIsa) {
  // Both are row kernels (AVX-512 intrinsics, the generic loops on the baseline build) with their own exp:
  // every level must give the portable bits, on lengths around the 16 lanes; the SwiGLU inputs pass exp's
  // clamps (+-120), its overflow and underflow, softmax's spread over +-12.
  std::mt19937 rng(32);
  for (int size : {1, 5, 16, 17, 100, 32000}) {
    std::vector<float> x = random_floats(rng, size, -120.0f, 120.0f);
    const std::vector<float> u = random_floats(rng, size, -2.0f, 2.0f);
    std::vector<float> want_softmax = x, want_swiglu = x;
    for (float& v : want_softmax) v *= 0.1f;  // a spread softmax can resolve
    const std::vector<float> scores = want_softmax;
    {
      test::ScopedIsa portable(Isa::kPortable);
      softmax(want_softmax.data(), size);
      swiglu(want_swiglu.data(), u.data(), size);
    }
    for (Isa isa : test::runnable_isas()) {
      SCOPED_TRACE(::testing::Message() << "size=" << size << " " << isa_name(isa));
      test::ScopedIsa scoped(isa);
      std::vector<float> got_softmax = scores, got_swiglu = x;
      softmax(got_softmax.data(), size);
      swiglu(got_swiglu.data(), u.data(), size);
      EXPECT_EQ(got_softmax, want_softmax);
      EXPECT_EQ(got_swiglu, want_swiglu);
    }
  }
}

// The exp's clamp and NaN pass-through are selects, not branches, so the generic loops vectorise (session
// 32): NaN, the infinities, signed zeros and the clamps' own bounds must still give the portable bits on every
// level, in and after whole vectors of lanes. Compared as bits, a NaN as any NaN: NaN == NaN is false, and
// which operand's NaN an instruction passes on (its sign) is the compiler's choice of operand order.
TEST(CpuSwiglu, SpecialValuesBitIdenticalOnEveryIsa) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> specials = {nan, inf, -inf, 0.0f, -0.0f, 104.0f, -104.0f, 89.0f, -89.0f, 88.72f,
                                       -87.3f, 1e-30f, -1e-30f, 3.0e38f, -3.0e38f, 1.0f, -1.0f};
  std::vector<float> x;
  for (int copy = 0; copy < 3; ++copy) x.insert(x.end(), specials.begin(), specials.end());  // 51: a tail
  const std::vector<float> u(x.size(), 1.5f);
  auto bits = [](const std::vector<float>& v) {
    std::vector<std::uint32_t> b(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) b[i] = std::isnan(v[i]) ? 0x7fc00000u : std::bit_cast<std::uint32_t>(v[i]);
    return b;
  };
  std::vector<float> want = x;
  {
    test::ScopedIsa portable(Isa::kPortable);
    swiglu(want.data(), u.data(), static_cast<int>(want.size()));
  }
  EXPECT_TRUE(std::isnan(want[0]));  // NaN in, NaN out
  EXPECT_EQ(want[3], 0.0f);
  for (Isa isa : test::runnable_isas()) {
    SCOPED_TRACE(isa_name(isa));
    test::ScopedIsa scoped(isa);
    std::vector<float> got = x;
    swiglu(got.data(), u.data(), static_cast<int>(got.size()));
    EXPECT_EQ(bits(got), bits(want));
  }
}

TEST(CpuSwiglu, MatchesReference) {
  std::mt19937 rng(31);
  for (int size : {1, 7, 1000}) {
    SCOPED_TRACE(::testing::Message() << "size=" << size);
    std::vector<float> h1 = random_floats(rng, size, -10.0f, 10.0f);
    const std::vector<float> h3 = random_floats(rng, size, -2.0f, 2.0f);
    std::vector<double> want(size);
    for (int i = 0; i < size; ++i) {
      const double v = h1[i];
      want[i] = v / (1.0 + std::exp(-v)) * h3[i];
    }
    swiglu(h1.data(), h3.data(), size);
    EXPECT_TRUE(nmse_below(h1, want));
  }
}

TEST(CpuSwiglu, LargeNegativeGateIsZeroNotNan) {
  // exp(100) overflows float to inf; silu must still come out as (-)0, not inf * 0 = NaN.
  std::vector<float> h1 = {-100.0f, 100.0f};
  const std::vector<float> h3 = {1.0f, 1.0f};
  swiglu(h1.data(), h3.data(), 2);
  EXPECT_EQ(h1[0], 0.0f);
  EXPECT_EQ(h1[1], 100.0f);
}

TEST(CpuAddInplace, EqualsCorrectlyRoundedSum) {
  // The sum of two floats is exact in double, so float addition must give exactly its rounding.
  std::mt19937 rng(41);
  for (int size : {1, 7, 1000}) {
    std::vector<float> y = random_floats(rng, size);
    const std::vector<float> x = random_floats(rng, size);
    std::vector<float> want(size);
    for (int i = 0; i < size; ++i) want[i] = static_cast<float>(static_cast<double>(y[i]) + x[i]);
    add_inplace(y.data(), x.data(), size);
    EXPECT_EQ(y, want) << "size=" << size;
  }
}

// ---------------------------------------------------------------------------------------------------------
// attention

TEST(CpuAttention, MatchesReferenceForGqaGroupings) {
  std::mt19937 rng(51);
  const int n_heads = 8;
  for (int n_kv_heads : {2, 4, 8}) {
    for (int head_size : {5, 16, 64}) {
      // n_ctx > 64 runs the heads in parallel when threads > 1.
      for (int n_ctx : {1, 7, 100, 257}) {
        // Padding columns past n_kv_heads * head_size are NaN: reading them would poison the result.
        for (int kv_pad : {0, 13}) {
          const int kv_dim = n_kv_heads * head_size;
          const int kv_stride = kv_dim + kv_pad;
          std::vector<float> q = random_floats(rng, static_cast<std::size_t>(n_heads) * head_size, -2.0f, 2.0f);
          std::vector<float> k_cache = random_floats(rng, static_cast<std::size_t>(n_ctx) * kv_stride, -2.0f, 2.0f);
          std::vector<float> v_cache = random_floats(rng, static_cast<std::size_t>(n_ctx) * kv_stride);
          for (int t = 0; t < n_ctx; ++t) {
            for (int c = kv_dim; c < kv_stride; ++c) {
              k_cache[static_cast<std::size_t>(t) * kv_stride + c] = std::numeric_limits<float>::quiet_NaN();
              v_cache[static_cast<std::size_t>(t) * kv_stride + c] = std::numeric_limits<float>::quiet_NaN();
            }
          }
          const std::vector<double> want =
              ref_attention(q, k_cache, v_cache, n_ctx, n_heads, n_kv_heads, head_size, kv_stride);
          for (int n_threads : kThreadCounts) {
            SCOPED_TRACE(::testing::Message() << "n_kv_heads=" << n_kv_heads << " head_size=" << head_size
                                              << " n_ctx=" << n_ctx << " kv_stride=" << kv_stride
                                              << " threads=" << n_threads);
            ScopedThreads threads(n_threads);
            std::vector<float> out(want.size());
            std::vector<float> scratch(static_cast<std::size_t>(n_heads) * n_ctx);
            attention(out.data(), q.data(), k_cache.data(), v_cache.data(), scratch.data(), n_ctx, n_heads,
                      n_kv_heads, head_size, kv_stride);
            EXPECT_TRUE(nmse_below(out, want));
          }
        }
      }
    }
  }
}

TEST(CpuAttention, SinglePositionCopiesItsValueRow) {
  // With one cached position the softmax weight is exactly 1, so each head returns its kv head's v row.
  const int n_heads = 4, n_kv_heads = 2, head_size = 3, kv_stride = 8;
  const std::vector<float> q(n_heads * head_size, 0.5f);
  const std::vector<float> k_cache(kv_stride, 1.0f);
  const std::vector<float> v_cache = {1, 2, 3, 4, 5, 6, -1, -1};
  std::vector<float> out(n_heads * head_size);
  std::vector<float> scratch(n_heads);
  attention(out.data(), q.data(), k_cache.data(), v_cache.data(), scratch.data(), 1, n_heads, n_kv_heads,
            head_size, kv_stride);
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6}));
}

// ---------------------------------------------------------------------------------------------------------
// argmax

TEST(CpuArgmax, PicksLargestFirstOnTies) {
  EXPECT_EQ(argmax(std::vector<float>{0.5f}.data(), 1), 0);
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}.data(), 4), 1);
  EXPECT_EQ(argmax(std::vector<float>{2.0f, 2.0f, 2.0f}.data(), 3), 0);
  EXPECT_EQ(argmax(std::vector<float>{-5.0f, -1.0f, -3.0f}.data(), 3), 1);
  EXPECT_EQ(argmax(std::vector<float>{-std::numeric_limits<float>::infinity(), -1e30f, 7.0f}.data(), 3), 2);

  std::mt19937 rng(61);
  std::vector<float> logits = random_floats(rng, 32000);
  logits[31999] = 2.0f;  // last index, beyond every random value
  EXPECT_EQ(argmax(logits.data(), 32000), 31999);
  logits[123] = 2.0f;  // an equal value earlier wins
  EXPECT_EQ(argmax(logits.data(), 32000), 123);
}

TEST(CpuArgmax, SameIndexAsAPlainScanWithTiesAndNaNs) {
  // argmax skips blocks of 64 that cannot win; this holds it to llama2.c's one-by-one scan on every
  // length around the block (tails, a winner in the tail), with many equal values and NaNs, which never win.
  auto scan = [](const std::vector<float>& x) {
    int best = 0;
    for (int i = 1; i < static_cast<int>(x.size()); ++i) {
      if (x[i] > x[best]) best = i;
    }
    return best;
  };
  // Every ISA's kernel (the AVX-512 one tests its blocks with mask compares).
  for (Isa isa : test::runnable_isas()) {
    test::ScopedIsa scoped(isa);
    std::mt19937 rng(62);
    std::uniform_int_distribution<int> level(0, 40);
    for (int size = 1; size <= 200; ++size) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> x(size);
        for (float& v : x) v = static_cast<float>(level(rng) % 8);  // few distinct values: ties everywhere
        if (trial % 3 == 0) x[level(rng) % size] = std::numeric_limits<float>::quiet_NaN();
        if (trial % 5 == 0) x[0] = std::numeric_limits<float>::quiet_NaN();
        if (trial % 4 == 0) x[size - 1] = 100.0f;
        if (trial % 7 == 0) x[level(rng) % size] = -std::numeric_limits<float>::quiet_NaN();
        ASSERT_EQ(argmax(x.data(), size), scan(x)) << isa_name(isa) << " size " << size << " trial " << trial;
      }
    }
  }
}

}  // namespace
}  // namespace shardline::kernels::cpu
