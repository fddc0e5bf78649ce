// The packed-weight kernels (weight_format.h, packed_matmul.h) against naive double-precision references,
// on every instruction-set path this CPU can run (portable, AVX2, AVX-512, AVX512_VNNI), with 1 and 2
// threads, on shapes that hit the edge paths: d not a multiple of the 16-wide panel, k not a multiple of
// the bf16 pair or the int8 group, row counts that leave remainders in every register block, and more rows
// than one tile.
//
// What is exact and what has a tolerance:
//  - Conversions (bf16, fp16) are round-to-nearest-even: checked bit for bit against the definition.
//  - Packing fp32 is a permutation (exact); bf16 rounds each weight; int8 keeps |w - s q| <= s / 2.
//  - The matmul reference uses the values the kernel really multiplies (unpacked weights, prepared
//    activations), so its only error is float accumulation: NMSE below 1e-10 as in cpu_ops_test.cpp.
//  - A row's result does not depend on the batch it is in, the thread count or the grouping: bitwise.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kernels/cpu/bandwidth_probe.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed_matmul.h"
#include "kernels/cpu/row_kernels.h"
#include "kernels/cpu/weight_format.h"
#include "tests/support/kernel_fixtures.h"
#include "tests/support/nmse.h"
#include "tests/support/packed_weights.h"

namespace shardline::kernels::cpu {
namespace {

using test::nmse;
using test::nmse_below;
using test::random_floats;
using test::runnable_isas;
using test::ScopedIsa;
using test::ScopedThreads;
constexpr WeightDtype kDtypes[] = {WeightDtype::kF32, WeightDtype::kBf16, WeightDtype::kInt8};

// An aligned packed copy of row-major w (d, k).
using Packed = test::PackedWeights;
Packed pack(WeightDtype dtype, const std::vector<float>& w, int d, int k, int int8_group = 0) {
  return test::pack_row_major(dtype, w.data(), d, k, int8_group);
}

std::vector<float> unpack(const PackedMatrix& m) {
  std::vector<float> out(static_cast<std::size_t>(m.d) * m.k);
  unpack_weights(m, out.data());
  return out;
}

// The activation values the kernel multiplies with: (n, k) as doubles.
std::vector<double> prepared_values(const Activations& a) {
  std::vector<double> out(static_cast<std::size_t>(a.n()) * a.k());
  for (int r = 0; r < a.n(); ++r) {
    for (int j = 0; j < a.k(); ++j) {
      const std::size_t at = static_cast<std::size_t>(r) * a.row_stride() + j;
      double v = 0;
      switch (a.dtype()) {
        case WeightDtype::kF32:
        case WeightDtype::kBf16: v = a.f32()[static_cast<std::size_t>(r) * a.k() + j]; break;
        case WeightDtype::kInt8:
          v = static_cast<double>(a.int8_scales()[static_cast<std::size_t>(r) * a.int8_groups() + j / a.int8_group()]) *
              a.int8()[at];
          break;
      }
      out[static_cast<std::size_t>(r) * a.k() + j] = v;
    }
  }
  return out;
}

// y (n, d) = x · Wᵀ in double.
std::vector<double> reference(const std::vector<double>& x, const std::vector<float>& w, int n, int k, int d) {
  std::vector<double> y(static_cast<std::size_t>(n) * d);
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < d; ++i) {
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += x[static_cast<std::size_t>(r) * k + j] * w[static_cast<std::size_t>(i) * k + j];
      y[static_cast<std::size_t>(r) * d + i] = sum;
    }
  }
  return y;
}

// ---------------------------------------------------------------------------------------------------------
// conversions

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

TEST(WeightFormat, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, odd rounds up to even
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808001)), 0x3f81);  // above the tie
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  std::mt19937 rng(1);
  for (float v : random_floats(rng, 10000, -100.0f, 100.0f)) {
    const float r = bf16_to_float(float_to_bf16(v));
    EXPECT_LE(std::fabs(r - v), std::fabs(v) * (1.0f / 256.0f)) << v;  // half an ulp of an 8-bit mantissa
  }
}

TEST(WeightFormat, Fp16RoundTripsNormalsAndSubnormals) {
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(70000.0f), 0x7c00);  // overflow -> infinity
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -26)), 0x0000);  // below half the smallest subnormal
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Every fp16 value converts to float and back unchanged.
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {
    ASSERT_EQ(float_to_fp16(fp16_to_float(static_cast<std::uint16_t>(h))), h) << h;
    ASSERT_EQ(float_to_fp16(fp16_to_float(static_cast<std::uint16_t>(h | 0x8000))), h | 0x8000) << h;
  }
}

TEST(WeightFormat, DtypeNamesParse) {
  for (WeightDtype dtype : kDtypes) EXPECT_EQ(parse_weight_dtype(weight_dtype_name(dtype)), dtype);
  EXPECT_FALSE(parse_weight_dtype("fp8").has_value());
}

// ---------------------------------------------------------------------------------------------------------
// packing

TEST(WeightFormat, PackedSizesArePanelsOfAlignedBytes) {
  EXPECT_EQ(packed_size_bytes(WeightDtype::kF32, 16, 10), 16u * 10 * 4);
  EXPECT_EQ(packed_size_bytes(WeightDtype::kF32, 17, 10), 2u * 16 * 10 * 4);
  EXPECT_EQ(packed_size_bytes(WeightDtype::kBf16, 16, 768), 16u * 768 * 2);
  EXPECT_EQ(packed_size_bytes(WeightDtype::kBf16, 16, 3), 16u * 32 * 2);  // k padded to one AMX block
  // int8 at k = 768: 16 x 768 quads + 6 groups of 128 x 16 fp16 scales = 1.016 bytes per weight.
  EXPECT_EQ(default_int8_group(768), 128);
  EXPECT_EQ(packed_size_bytes(WeightDtype::kInt8, 16, 768), 16u * 768 + 6 * 16 * 2);
  // k = 288 is no multiple of 128: the widest multiple of 32 up to 128 that divides it, 96 (1.021 bytes per
  // weight); 320 takes 64, and 800, which only 32 divides, groups of 32 as Q8_0 (1.0625 bytes per weight).
  EXPECT_EQ(default_int8_group(288), 96);
  EXPECT_EQ(int8_groups(288), 3);
  EXPECT_EQ(packed_size_bytes(WeightDtype::kInt8, 16, 288), 4736u);  // 4608 + 96 bytes, 64-byte aligned
  EXPECT_EQ(default_int8_group(320), 64);
  EXPECT_EQ(default_int8_group(800), 32);
  EXPECT_EQ(packed_size_bytes(WeightDtype::kInt8, 16, 800), 13632u);  // 12800 + 800 bytes, 64-byte aligned
  // k = 45: padded to 64, two groups of 32.
  EXPECT_EQ(int8_groups(45), 2);
  for (WeightDtype dtype : kDtypes) {
    for (int k : {1, 3, 31, 33, 288, 5632}) EXPECT_EQ(panel_bytes(dtype, k) % kPackedAlignment, 0u) << k;
  }
}

TEST(WeightFormat, Fp32PackingIsExact) {
  std::mt19937 rng(2);
  const int d = 37, k = 45;
  const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(d) * k);
  EXPECT_EQ(unpack(pack(WeightDtype::kF32, w, d, k).matrix), w);
}

TEST(WeightFormat, Bf16PackingRoundsEachWeight) {
  std::mt19937 rng(3);
  const int d = 19, k = 33;
  const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(d) * k);
  const std::vector<float> got = unpack(pack(WeightDtype::kBf16, w, d, k).matrix);
  for (std::size_t i = 0; i < w.size(); ++i) ASSERT_EQ(got[i], bf16_to_float(float_to_bf16(w[i]))) << i;
}

// Every default group size: k = 384 takes groups of 128, 288 of 96, 320 of 64, and 70 of 32 (the last one
// past k).
TEST(WeightFormat, Int8PackingKeepsEveryWeightWithinHalfAStep) {
  std::mt19937 rng(4);
  for (const auto& [k, want_group] : {std::pair{384, 128}, std::pair{288, 96}, std::pair{320, 64}, std::pair{70, 32}}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    const int d = 21;  // a partial last panel
    const int group = default_int8_group(k);
    ASSERT_EQ(group, want_group);
    std::vector<float> w = random_floats(rng, static_cast<std::size_t>(d) * k, -0.05f, 0.05f);
    for (int j = 0; j < k; ++j) w[5 * k + j] = 0.0f;  // an all-zero row: scale 0, no division by zero
    w[7 * k + 3] = 3.0f;                              // an outlier: only its own group gets the coarse step
    const std::vector<float> got = unpack(pack(WeightDtype::kInt8, w, d, k).matrix);
    for (int f = 0; f < d; ++f) {
      for (int g = 0; g * group < k; ++g) {
        float amax = 0;
        for (int j = g * group; j < std::min(k, (g + 1) * group); ++j) amax = std::max(amax, std::fabs(w[f * k + j]));
        const float step = fp16_to_float(float_to_fp16(amax / 127.0f));
        for (int j = g * group; j < std::min(k, (g + 1) * group); ++j) {
          ASSERT_LE(std::fabs(got[f * k + j] - w[f * k + j]), step * 0.5f * 1.001f + 1e-12f)
              << "feature " << f << " k " << j;
        }
      }
    }
    for (int j = 0; j < k; ++j) EXPECT_EQ(got[5 * k + j], 0.0f);
    EXPECT_NEAR(got[7 * k + 3], 3.0f, 3.0f / 127 / 2);
  }
}

// A damaged file's NaN or Inf weight: its int8 group gets a NaN scale, so the products are NaN on every ISA
// as fp32's are (and the run warns about non-finite hidden states), never a finite code made from a NaN
// (std::max skips one) nor a NaN converted to an int (an Inf made the step's inverse 0, and Inf x 0).
TEST(WeightFormat, Int8GroupsWithNanOrInfWeightsBecomeNan) {
  std::mt19937 rng(12);
  const int d = 18, k = 256;  // groups of 128
  std::vector<float> w = random_floats(rng, static_cast<std::size_t>(d) * k);
  w[3 * k + 5] = std::numeric_limits<float>::quiet_NaN();    // feature 3, group 0
  w[9 * k + 200] = std::numeric_limits<float>::infinity();   // feature 9, group 1
  w[17 * k + 130] = -std::numeric_limits<float>::infinity(); // feature 17 (the second panel), group 1
  const Packed packed = pack(WeightDtype::kInt8, w, d, k);
  const std::vector<float> got = unpack(packed.matrix);
  for (int f = 0; f < d; ++f) {
    for (int j = 0; j < k; ++j) {
      const bool damaged = (f == 3 && j < 128) || (f == 9 && j >= 128) || (f == 17 && j >= 128);
      EXPECT_EQ(std::isnan(got[f * k + j]), damaged) << "feature " << f << " k " << j;
    }
  }
  std::vector<float> x = random_floats(rng, 2 * static_cast<std::size_t>(k), -1.0f, 1.0f);
  Activations a;
  a.reserve(2, k);
  a.prepare(x.data(), 2, k, WeightDtype::kInt8);
  for (Isa isa : runnable_isas()) {
    ScopedIsa scoped_isa(isa);
    std::vector<float> y(2 * static_cast<std::size_t>(d));
    matmul(y.data(), a, packed.matrix);
    for (int r = 0; r < 2; ++r) {
      for (int f = 0; f < d; ++f) {
        EXPECT_EQ(std::isnan(y[r * d + f]), f == 3 || f == 9 || f == 17) << isa_name(isa) << " row " << r << " f " << f;
      }
    }
  }
}

TEST(WeightFormat, PacksAColumnSliceThroughTheRowStride) {
  std::mt19937 rng(5);
  const int d = 18, cols = 50, begin = 7, k = 29;  // columns [7, 36) of a (18, 50) matrix
  const std::vector<float> whole = random_floats(rng, static_cast<std::size_t>(d) * cols);
  std::vector<float> slice(static_cast<std::size_t>(d) * k);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < k; ++j) slice[i * k + j] = whole[i * cols + begin + j];
  }
  for (WeightDtype dtype : kDtypes) {
    const std::size_t bytes = packed_size_bytes(dtype, d, k);
    std::unique_ptr<std::byte, decltype(&std::free)> a(static_cast<std::byte*>(std::aligned_alloc(64, bytes)), &std::free);
    pack_weights(dtype, whole.data() + begin, cols, d, k, a.get());
    const Packed b = pack(dtype, slice, d, k);
    EXPECT_EQ(std::memcmp(a.get(), b.matrix.data, bytes), 0) << weight_dtype_name(dtype);
  }
}

// ---------------------------------------------------------------------------------------------------------
// activations

// Groups of 128 (k = 256) and of 32 (k = 45, padded to 64), each with an all-zero group.
TEST(Activations, Int8QuantisationKeepsHalfAStepAndSums) {
  std::mt19937 rng(6);
  for (const int k : {256, 45}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    const int n = 3;
    const int group = default_int8_group(k), kp = padded_k(WeightDtype::kInt8, k), groups = kp / group;
    std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -4.0f, 4.0f);
    for (int j = 0; j < group; ++j) x[k + j] = 0.0f;  // row 1, group 0 all zero
    Activations a;
    a.reserve(n, k);
    a.prepare(x.data(), n, k, WeightDtype::kInt8);
    ASSERT_EQ(a.row_stride(), kp);
    ASSERT_EQ(a.int8_groups(), groups);
    for (int r = 0; r < n; ++r) {
      for (int g = 0; g < groups; ++g) {
        const float scale = a.int8_scales()[r * groups + g];
        int sum = 0;
        for (int j = g * group; j < (g + 1) * group; ++j) {
          const int q = a.int8()[r * kp + j];
          sum += q;
          if (j >= k) {
            EXPECT_EQ(q, 0) << "padding must be zero";
            continue;
          }
          EXPECT_LE(std::abs(q), 127);
          EXPECT_LE(std::fabs(scale * q - x[r * k + j]), scale * 0.5f * 1.001f + 1e-7f);
        }
        EXPECT_EQ(a.int8_sums()[r * groups + g], sum);
      }
    }
    EXPECT_EQ(a.int8_scales()[1 * groups + 0], 0.0f);
  }
}

TEST(Activations, Fp32AndBf16WeightsUseTheActivationsInPlace) {
  const std::vector<float> x = {1.0f, 2.0f, 3.0f};  // (1, 3): k odd
  Activations a;
  a.reserve(1, 3);
  for (WeightDtype dtype : {WeightDtype::kF32, WeightDtype::kBf16}) {
    a.prepare(x.data(), 1, 3, dtype);
    EXPECT_EQ(a.f32(), x.data()) << weight_dtype_name(dtype);
    EXPECT_EQ(a.row_stride(), 3) << weight_dtype_name(dtype);
  }
}

TEST(Activations, Bf16SplitKeepsSixteenBitsOfXWhereTheCpuHasBf16Dots) {
  std::mt19937 rng(9);
  const int n = 3, k = 45;  // k past one 32 block: the split rows are zero-padded to 64
  const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -50.0f, 50.0f);
  Activations a;
  a.reserve(n, k);
  a.prepare(x.data(), n, k, WeightDtype::kBf16);
  ASSERT_EQ(a.bf16_hi() != nullptr, best_isa() >= Isa::kAvx512Bf16)
      << "the split exists exactly when a kernel (AVX512_BF16 or AMX) can use it";
  if (a.bf16_hi() == nullptr) return;
  EXPECT_EQ(a.bf16_stride(), 64);
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < a.bf16_stride(); ++j) {
      const std::size_t at = static_cast<std::size_t>(r) * a.bf16_stride() + j;
      const float hi = bf16_to_float(a.bf16_hi()[at]), lo = bf16_to_float(a.bf16_lo()[at]);
      if (j >= k) {
        EXPECT_EQ(hi, 0.0f);
        EXPECT_EQ(lo, 0.0f);
        continue;
      }
      const float v = x[static_cast<std::size_t>(r) * k + j];
      EXPECT_EQ(hi, bf16_to_float(float_to_bf16(v)));
      EXPECT_LE(std::fabs(hi + lo - v), std::ldexp(std::fabs(v), -16)) << r << "," << j;
    }
  }
}

// prepare_normalised() is add_inplace(), rmsnorm() and prepare() in one pass: the same x afterwards, the
// same normalised rows and the same prepared activations (so the same matmul), bit for bit, with and
// without a residual, for every dtype, ISA and thread count.
TEST(Activations, NormalisedInOnePassEqualsAddNormThenPrepare) {
  std::mt19937 rng(17);
  const int k = 288, d = 40;
  for (int n : {1, 5, 16}) {
    const std::vector<float> x0 = random_floats(rng, static_cast<std::size_t>(n) * k, -2.0f, 2.0f);
    const std::vector<float> residual = random_floats(rng, x0.size(), -1.0f, 1.0f);
    const std::vector<float> weight = random_floats(rng, k, 0.5f, 1.5f);
    for (WeightDtype dtype : kDtypes) {
      const Packed packed = pack(dtype, random_floats(rng, static_cast<std::size_t>(d) * k), d, k);
      for (Isa isa : runnable_isas()) {
        for (int threads : {1, 2}) {
          for (bool with_residual : {false, true}) {
            SCOPED_TRACE(fmt::format("n {}, {}, {}, {} threads, residual {}", n, weight_dtype_name(dtype), isa_name(isa),
                                     threads, with_residual));
            ScopedIsa scoped(isa);
            ScopedThreads scoped_threads(threads);
            std::vector<float> x_apart = x0, x_fused = x0, norm_apart(x0.size()), norm_fused(x0.size(), -7.0f);
            Activations apart, fused;
            apart.reserve(n, k);
            fused.reserve(n, k);
            if (with_residual) add_inplace(x_apart.data(), residual.data(), n * k);
            rmsnorm(norm_apart.data(), x_apart.data(), weight.data(), n, k, 1e-5f);
            apart.prepare(norm_apart.data(), n, packed.matrix);
            if (with_residual) {
              fused.prepare_normalised(norm_fused.data(), x_fused.data(), residual.data(), weight.data(), 1e-5f, n,
                                       packed.matrix);
            } else {
              fused.prepare_normalised(norm_fused.data(), x_fused.data(), weight.data(), 1e-5f, n, packed.matrix);
            }
            EXPECT_EQ(x_fused, x_apart);
            EXPECT_EQ(norm_fused, norm_apart);
            std::vector<float> y_apart(static_cast<std::size_t>(n) * d), y_fused(y_apart.size(), -1.0f);
            matmul(y_apart.data(), apart, packed.matrix);
            matmul(y_fused.data(), fused, packed.matrix);
            EXPECT_EQ(0, std::memcmp(y_apart.data(), y_fused.data(), y_apart.size() * sizeof(float)));
            if (dtype == WeightDtype::kInt8) {
              const std::size_t codes = static_cast<std::size_t>(n) * apart.row_stride();
              const std::size_t groups = static_cast<std::size_t>(n) * apart.int8_groups();
              EXPECT_EQ(0, std::memcmp(apart.int8(), fused.int8(), codes));
              EXPECT_EQ(0, std::memcmp(apart.int8_scales(), fused.int8_scales(), groups * sizeof(float)));
              EXPECT_EQ(0, std::memcmp(apart.int8_sums(), fused.int8_sums(), groups * sizeof(std::int32_t)));
            }
          }
        }
      }
    }
  }
}

// The quantisation and the bf16 split are compiled for several ISAs (row_kernels.h): every level must give
// the same bits, or a layout's tokens would depend on the CPU's level. Values span many magnitudes, with an
// all-zero group, ties at half a step and a last group that passes k, and
// non-finite values (a group's maximum is folded in one order everywhere).
TEST(Activations, PreparedRowsAreIdenticalOnEveryIsa) {
  std::mt19937 rng(11);
  // int8 groups of 32, 128, 64 and 96 (the defaults of these k), and of 96 asked for where k would take 128
  // (wo's, for heads of 96).
  for (const auto& [k, group] : {std::pair{203, 32}, std::pair{384, 128}, std::pair{320, 64}, std::pair{288, 96},
                                 std::pair{768, 96}}) {
    SCOPED_TRACE(::testing::Message() << "k " << k << ", groups of " << group);
    const int n = 5;
    std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -1.0f, 1.0f);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::ldexp(x[i], static_cast<int>(i % 41) - 20);
    for (int j = group; j < 2 * group; ++j) x[j] = 0.0f;        // row 0, group 1
    for (int j = 0; j < group; ++j) x[k + j] = (j % 5) * 0.5f;  // row 1, group 0: 127 / 2 codes land on .5
    // Row 2, group 0: amax 1, and values whose product with 127 lands so near .5 that a fused multiply-add
    // (one rounding instead of two) picks the other code: a build that contracted would differ here.
    for (int j = 0; j < group; ++j) x[2 * k + j] = 0.001f * static_cast<float>(j);
    const float near_ties[] = {1.0f, -0x1.08102p-1f, 0x1.20408p-1f, -0x1.f5ebd8p-1f};
    for (int j = 0; j < 4; ++j) x[2 * k + j] = near_ties[j];
    // Row 3: a NaN as group 0's last value (the last lane, which the fold of the lane maxima keeps, where
    // another order of the fold drops it), an infinity in group 1.
    x[3 * k + group - 1] = std::numeric_limits<float>::quiet_NaN();
    x[3 * k + 2 * group - 3] = std::numeric_limits<float>::infinity();
    struct Prepared {
      std::vector<std::int8_t> q;
      std::vector<float> scales;
      std::vector<std::int32_t> sums;
      std::vector<std::uint16_t> hi, lo;
    };
    auto prepare = [&](Isa isa) {
      ScopedIsa scoped(isa);
      Activations a;
      a.reserve(n, k);
      Prepared p;
      a.prepare(x.data(), n, k, WeightDtype::kInt8, group);
      EXPECT_EQ(a.int8_group(), group);
      const std::size_t groups = static_cast<std::size_t>(n) * a.int8_groups();
      p.q.assign(a.int8(), a.int8() + static_cast<std::size_t>(n) * a.row_stride());
      p.scales.assign(a.int8_scales(), a.int8_scales() + groups);
      p.sums.assign(a.int8_sums(), a.int8_sums() + groups);
      a.prepare(x.data(), n, k, WeightDtype::kBf16);
      if (a.bf16_hi() != nullptr) {
        p.hi.assign(a.bf16_hi(), a.bf16_hi() + static_cast<std::size_t>(n) * a.bf16_stride());
        p.lo.assign(a.bf16_lo(), a.bf16_lo() + static_cast<std::size_t>(n) * a.bf16_stride());
      }
      return p;
    };
    const Prepared want = prepare(Isa::kPortable);
    // Row 3's groups holding the NaN and the Inf get NaN scales (their products stay NaN, as fp32's do, and
    // the run warns), the row's other groups not; every ISA gives these bits.
    const std::size_t groups_per_row = want.scales.size() / n;
    EXPECT_TRUE(std::isnan(want.scales[3 * groups_per_row]));
    EXPECT_TRUE(std::isnan(want.scales[3 * groups_per_row + 1]));
    EXPECT_FALSE(std::isnan(want.scales[3 * groups_per_row + 2]));
    for (Isa isa : runnable_isas()) {
      SCOPED_TRACE(isa_name(isa));
      const Prepared got = prepare(isa);
      EXPECT_EQ(got.q, want.q);
      EXPECT_EQ(std::memcmp(got.scales.data(), want.scales.data(), want.scales.size() * sizeof(float)), 0);
      EXPECT_EQ(got.sums, want.sums);
      EXPECT_EQ(got.hi, want.hi);
      EXPECT_EQ(got.lo, want.lo);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// matmul

struct Shape {
  int n, k, d;
};

// n: every remainder of the 6-row (fp32, bf16 dots), 5-row (bf16 widened) and 4-row (int8) register blocks,
// more than a 64-row tile, and a 16-row AMX block with a 1-row tail (17). k: below, at and past a bf16 pair
// and an int8 group of 32, multiples of 128 (int8 groups of 128), of 96 and of 64 but not 128 (groups of 96:
// 96, 288, 2112; of 64: 64, 320), and long enough (2100, 2112, 2560) for several k chunks of 512 lines per
// panel in every dtype and int8 group size, with several row passes prefetching the next chunk. d: part, one
// and several panels, a partial last panel, and enough panels that 2 threads split a 4-panel tile.
constexpr Shape kShapes[] = {
    {1, 1, 1},    {1, 3, 15},   {2, 31, 16},  {3, 32, 17},  {4, 33, 33},  {5, 64, 64},   {6, 100, 100},
    {7, 288, 47}, {8, 65, 129}, {13, 40, 70}, {16, 768, 48}, {64, 96, 20}, {65, 70, 33}, {1, 2048, 200},
    {16, 300, 256}, {7, 2100, 40}, {5, 128, 64}, {65, 384, 33}, {7, 2560, 40}, {16, 288, 64}, {17, 288, 16},
    {7, 2112, 40}, {6, 320, 64},
};

TEST(PackedMatmul, MatchesReferenceForEveryDtypeIsaAndThreadCount) {
  std::mt19937 rng(10);
  for (const Shape& s : kShapes) {
    const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(s.n) * s.k, -2.0f, 2.0f);
    const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(s.d) * s.k);
    for (WeightDtype dtype : kDtypes) {
      const Packed packed = pack(dtype, w, s.d, s.k);
      Activations a;
      a.reserve(s.n, s.k);
      a.prepare(x.data(), s.n, s.k, dtype);
      const std::vector<double> want = reference(prepared_values(a), unpack(packed.matrix), s.n, s.k, s.d);
      for (Isa isa : runnable_isas()) {
        for (int threads : {1, 2}) {
          SCOPED_TRACE(::testing::Message() << weight_dtype_name(dtype) << " " << isa_name(isa) << " threads=" << threads
                                            << " n=" << s.n << " k=" << s.k << " d=" << s.d);
          ScopedIsa scoped_isa(isa);
          ScopedThreads scoped_threads(threads);
          const float kGuard = -12345.0f;
          std::vector<float> y(want.size() + 1, kGuard);
          matmul(y.data(), a, packed.matrix);
          EXPECT_EQ(y.back(), kGuard) << "matmul wrote past y[n * d]";
          EXPECT_TRUE(nmse_below(std::span(y).first(want.size()), want));
        }
      }
    }
  }
}

TEST(PackedMatmul, QuantisedResultsStayCloseToFp32) {
  // The end-to-end error of the dtypes on one GEMV against the exact fp32 product. bf16 rounds the
  // weights only, to 8 significant bits: an error up to 2^-9 of the value's power of two, NMSE of order
  // 2^-18 ≈ 4e-6. int8 rounds weights and activations to steps of max|group| / 127 (about 1/127 for
  // uniform [-1, 1] data): error variance (1/127)^2 / 12 against a signal variance of 1/3 per factor,
  // NMSE ≈ 3e-5. Measured: 2.1e-6 and 3.0e-5; the bounds leave 10x headroom.
  std::mt19937 rng(11);
  const int n = 4, k = 768, d = 96;
  const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k);
  const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(d) * k);
  std::vector<double> xd(x.begin(), x.end());
  const std::vector<double> exact = reference(xd, w, n, k, d);
  const struct {
    WeightDtype dtype;
    double max_nmse;
  } cases[] = {{WeightDtype::kBf16, 2e-5}, {WeightDtype::kInt8, 3e-4}};
  for (const auto& c : cases) {
    const Packed packed = pack(c.dtype, w, d, k);
    Activations a;
    a.reserve(n, k);
    a.prepare(x.data(), n, k, c.dtype);
    std::vector<float> y(static_cast<std::size_t>(n) * d);
    matmul(y.data(), a, packed.matrix);
    EXPECT_TRUE(nmse_below(y, exact, c.max_nmse)) << weight_dtype_name(c.dtype);
    std::printf("%s GEMV NMSE against exact fp32: %.2g\n", weight_dtype_name(c.dtype), nmse(y, exact));
  }
}

// The runtime packs wo and w2 in int8 groups of 96, 64 or 32 even where k would take 128 when a layout's TP
// slices of k need it (runtime/shard_weights.cpp): those groupings run on every ISA (6 rows: the VNNI
// kernel; 16: AMX where the CPU has it), match the reference, and activations prepared in another grouping
// are refused rather than misread. Group sizes other than 32, 64, 96 and 128, and groups that do not divide
// the padded k, are refused.
TEST(PackedMatmul, Int8GroupsNarrowerThanKWouldTake) {
  std::mt19937 rng(16);
  const int k = 768, d = 40;
  ASSERT_EQ(default_int8_group(k), 128);
  for (const int group : {96, kInt8HeadGroup, kInt8Block}) {
    for (const int n : {6, 16}) {
      SCOPED_TRACE(::testing::Message() << "groups of " << group << ", " << n << " rows");
      const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -2.0f, 2.0f);
      const Packed packed = pack(WeightDtype::kInt8, random_floats(rng, static_cast<std::size_t>(d) * k), d, k, group);
      EXPECT_EQ(packed.matrix.size_bytes(), packed_size_bytes(WeightDtype::kInt8, d, k, group));
      EXPECT_GT(packed.matrix.size_bytes(), packed_size_bytes(WeightDtype::kInt8, d, k));
      Activations a;
      a.reserve(n, k);
      a.prepare(x.data(), n, packed.matrix);
      ASSERT_EQ(a.int8_group(), group);
      const std::vector<double> want = reference(prepared_values(a), unpack(packed.matrix), n, k, d);
      for (Isa isa : runnable_isas()) {
        SCOPED_TRACE(isa_name(isa));
        ScopedIsa scoped(isa);
        std::vector<float> y(static_cast<std::size_t>(n) * d);
        matmul(y.data(), a, packed.matrix);
        EXPECT_TRUE(nmse_below(y, want, 1e-10));
      }
      a.prepare(x.data(), n, k, WeightDtype::kInt8);  // the default grouping: 128
      std::vector<float> y(static_cast<std::size_t>(n) * d);
      GTEST_FLAG_SET(death_test_style, "threadsafe");  // the kernel threads exist by now
      EXPECT_DEATH(matmul(y.data(), a, packed.matrix),
                   fmt::format("groups of 128 used with weights in groups of {}", group));
    }
  }
  EXPECT_DEATH(int8_groups(k, 48), "int8 group of 48 k values \\(32, 64, 96 or 128\\)");
  EXPECT_DEATH(int8_groups(512, 96), "int8 groups of 96 do not divide k = 512");
}

TEST(PackedMatmul, ARowsResultDoesNotDependOnItsBatchOrTheThreadCount) {
  // k = 2100: several k chunks, whose partial sums a batch carries over between passes. n = 16 and 15: full
  // register blocks only, and a batch whose last pass is a short block (3 rows of int8's 4 and of the 6 of fp32 and bf16 dots).
  std::mt19937 rng(12);
  const int k = 2100, d = 150;
  const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(d) * k);
  for (const int n : {16, 15}) {
    const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k);
    for (WeightDtype dtype : kDtypes) {
      const Packed packed = pack(dtype, w, d, k);
      for (Isa isa : runnable_isas()) {
        SCOPED_TRACE(::testing::Message() << weight_dtype_name(dtype) << " " << isa_name(isa) << " n=" << n);
        ScopedIsa scoped_isa(isa);
        Activations batch;
        batch.reserve(n, k);
        batch.prepare(x.data(), n, k, dtype);
        std::vector<float> batched(static_cast<std::size_t>(n) * d), batched2(batched.size());
        {
          ScopedThreads threads(1);
          matmul(batched.data(), batch, packed.matrix);
        }
        {
          ScopedThreads threads(2);
          matmul(batched2.data(), batch, packed.matrix);
        }
        EXPECT_EQ(batched, batched2) << "thread count changed a result";
        for (int r = 0; r < n; ++r) {
          Activations one;
          one.reserve(1, k);
          one.prepare(x.data() + static_cast<std::size_t>(r) * k, 1, k, dtype);
          std::vector<float> single(d);
          matmul(single.data(), one, packed.matrix);
          EXPECT_EQ(0,
                    std::memcmp(single.data(), batched.data() + static_cast<std::size_t>(r) * d, d * sizeof(float)))
              << "row " << r << " differs alone and in a batch of " << n;
        }
      }
    }
  }
}

// Reduction segments (tensor parallelism's exact sums): each segment's product is, bit for bit, the matmul
// of its column slice packed on its own (as a TP rank packs it), and the fold adds them in order on any
// thread count. k = 300: the last segment ends in the int8 and bf16 padding; 70 rows: more than a tile's.
// The int8 kernels walk k in chunks of whole groups (the VNNI one: 4 groups of 32, 2 of 64, 1 of 128) and
// carry a segment's sums across them: segments that end inside a chunk and on its edge, with each group
// size the engine packs (wo's 64, w2's 128), and 1 to 4 panels (d = 16, 40, 50).
struct SegmentCase {
  int k, d, int8_group;
  std::vector<int> bounds;
};

class PackedMatmulSegments : public ::testing::TestWithParam<SegmentCase> {};

TEST_P(PackedMatmulSegments, EqualMatmulsOfTheirColumnSlicesAndFoldInOrder) {
  std::mt19937 rng(31);
  const auto& [k, d, int8_group, bounds] = GetParam();
  const int n_segments = static_cast<int>(bounds.size()) - 1;
  const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(d) * k);
  for (const int n : {1, 7, 70}) {
    const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -2.0f, 2.0f);
    for (WeightDtype dtype : kDtypes) {
      const Packed packed = pack(dtype, w, d, k, int8_group);
      Activations a;
      a.reserve(n, k);
      a.prepare(x.data(), n, packed.matrix);
      for (Isa isa : runnable_isas()) {
        SCOPED_TRACE(::testing::Message() << weight_dtype_name(dtype) << " " << isa_name(isa) << " n=" << n);
        ScopedIsa scoped_isa(isa);
        std::vector<float> partials(static_cast<std::size_t>(n_segments) * n * d);
        matmul_segments(partials.data(), a, packed.matrix, bounds, /*fold=*/false);
        for (int s = 0; s < n_segments; ++s) {
          const int k0 = bounds[s], ks = bounds[s + 1] - k0;
          std::vector<float> w_slice(static_cast<std::size_t>(d) * ks), x_slice(static_cast<std::size_t>(n) * ks);
          for (int i = 0; i < d; ++i) std::copy_n(w.begin() + i * k + k0, ks, w_slice.begin() + i * ks);
          for (int r = 0; r < n; ++r) std::copy_n(x.begin() + r * k + k0, ks, x_slice.begin() + r * ks);
          const Packed slice = pack(dtype, w_slice, d, ks, int8_group);
          Activations as;
          as.reserve(n, ks);
          as.prepare(x_slice.data(), n, slice.matrix);
          std::vector<float> want(static_cast<std::size_t>(n) * d);
          matmul(want.data(), as, slice.matrix);
          EXPECT_EQ(0, std::memcmp(want.data(), partials.data() + static_cast<std::size_t>(s) * n * d,
                                   want.size() * sizeof(float)))
              << "segment " << s;
        }
        std::vector<float> folded(static_cast<std::size_t>(n) * d), in_tiles(folded.size()), two(folded.size());
        // The first product, then the others added onto it in order, element by element (as TP ranks do).
        std::copy_n(partials.begin(), folded.size(), folded.begin());
        for (int s = 1; s < n_segments; ++s) {
          for (std::size_t i = 0; i < folded.size(); ++i) folded[i] += partials[s * folded.size() + i];
        }
        {
          ScopedThreads threads(1);
          matmul_segments(in_tiles.data(), a, packed.matrix, bounds, /*fold=*/true);
        }
        {
          ScopedThreads threads(2);
          matmul_segments(two.data(), a, packed.matrix, bounds, /*fold=*/true);
        }
        EXPECT_EQ(folded, in_tiles);
        EXPECT_EQ(folded, two);
        // And the sums are the matmul's, to float accumulation.
        const std::vector<double> want = reference(prepared_values(a), unpack(packed.matrix), n, k, d);
        EXPECT_TRUE(nmse_below(folded, want, 1e-10));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Borders, PackedMatmulSegments,
    ::testing::Values(SegmentCase{300, 50, kInt8Block, {0, 64, 96, 224, 300}},   // inside chunks, into the padding
                      SegmentCase{300, 40, kInt8Block, {0, 128, 256, 300}},      // on chunk edges (4 groups of 32)
                      SegmentCase{640, 16, 64, {0, 64, 256, 448, 640}},          // groups of 64 (2 a chunk), one panel
                      SegmentCase{768, 50, 128, {0, 128, 384, 768}}));           // groups of 128 (1 a chunk)

TEST(PackedMatmul, SegmentBordersTheKernelsCannotStartAtAreRefused) {
  std::mt19937 rng(31);
  const int k = 300, d = 50;
  const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(d) * k);
  const int n_segments = 2;
  const Packed packed = pack(WeightDtype::kInt8, w, d, k, kInt8Block);
  Activations a;
  a.reserve(1, k);
  a.prepare(w.data(), 1, packed.matrix);
  std::vector<float> y(static_cast<std::size_t>(n_segments) * d);
  const std::vector<int> off_group = {0, 40, 300};
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(matmul_segments(y.data(), a, packed.matrix, off_group, false), "k segment 1 starts at 40, not on a multiple of 32");
}

TEST(PackedMatmul, Bf16DotsAgreeWithTheWideningKernelWithinTheSplitOfX) {
  // vdpbf16ps (AVX512_BF16) and the AMX tiles multiply the bf16 weights by x as two bf16 halves, x ~ hi + lo,
  // where the AVX-512 kernel widens the weights and multiplies them by x itself. The products are exact in
  // fp32 either way, so the two differ by the split's remainder (|x - hi - lo| <= 2^-16 |x|) and by the sums'
  // roundings in another order. The bound, 2^-14 of sum |w| |x| per output, is empirical for these shapes: the
  // worst seen on AVX512_BF16 is 1/35 of it. Each level with bf16 dots that this CPU runs is compared; a CPU
  // without any runs none, and says so.
  std::vector<Isa> dot_levels;
  for (Isa isa : {Isa::kAvx512Bf16, Isa::kAmx}) {
    if (isa <= best_isa()) dot_levels.push_back(isa);
  }
  if (dot_levels.empty()) GTEST_SKIP() << "this CPU has no bf16 dot products (AVX512_BF16 or AMX)";
  std::mt19937 rng(21);
  for (const Shape& s : kShapes) {
    const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(s.n) * s.k, -2.0f, 2.0f);
    const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(s.d) * s.k);
    const Packed packed = pack(WeightDtype::kBf16, w, s.d, s.k);
    const std::vector<float> rounded = unpack(packed.matrix);
    Activations a;
    a.reserve(s.n, s.k);
    a.prepare(x.data(), s.n, s.k, WeightDtype::kBf16);
    std::vector<float> widened(static_cast<std::size_t>(s.n) * s.d);
    {
      ScopedIsa isa(Isa::kAvx512);
      matmul(widened.data(), a, packed.matrix);
    }
    for (Isa level : dot_levels) {
      ScopedIsa isa(level);
      std::vector<float> dots(widened.size());
      matmul(dots.data(), a, packed.matrix);
      double worst = 0;
      for (int r = 0; r < s.n; ++r) {
        for (int f = 0; f < s.d; ++f) {
          double magnitude = 0;
          for (int j = 0; j < s.k; ++j) {
            magnitude += std::fabs(static_cast<double>(rounded[static_cast<std::size_t>(f) * s.k + j]) *
                                   x[static_cast<std::size_t>(r) * s.k + j]);
          }
          const std::size_t at = static_cast<std::size_t>(r) * s.d + f;
          const double error = std::fabs(static_cast<double>(dots[at]) - widened[at]);
          worst = std::max(worst, error / magnitude);
          ASSERT_LE(error, std::ldexp(magnitude, -14)) << isa_name(level) << " n=" << s.n << " k=" << s.k
                                                       << " d=" << s.d << " row " << r << " feature " << f;
        }
      }
      EXPECT_GT(worst, 0.0) << isa_name(level) << " n=" << s.n << " k=" << s.k
                            << ": the split of x is real, so some output differs from the widening kernel's";
    }
  }
}

// What every FMA kernel computes, in scalar code: each output one fused multiply-add chain from zero, along k
// (fp32 and widened bf16), or along the int8 groups, each group's exact integer dot of q (the stored byte
// less 128) with x's int8 values times (weight scale * x scale), the product rounded to float first.
std::vector<float> fma_definition(const Activations& a, const PackedMatrix& m) {
  const int n = a.n(), k = a.k(), d = m.d;
  std::vector<float> y(static_cast<std::size_t>(n) * d);
  if (m.dtype != WeightDtype::kInt8) {
    const std::vector<float> w = unpack(m);
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < d; ++i) {
        float acc = 0.0f;
        for (int j = 0; j < k; ++j) {
          acc = std::fma(w[static_cast<std::size_t>(i) * k + j], a.f32()[static_cast<std::size_t>(r) * k + j], acc);
        }
        y[static_cast<std::size_t>(r) * d + i] = acc;
      }
    }
    return y;
  }
  // int8 panels (weight_format.h): panel[k / 32][8 quads][16 features][4], then fp16 scales [group][16].
  const int kp = padded_k(WeightDtype::kInt8, k), group = m.int8_group_size();
  const std::size_t panel = panel_bytes(WeightDtype::kInt8, k, group);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(m.data);
  for (int i = 0; i < d; ++i) {
    const std::uint8_t* p = bytes + static_cast<std::size_t>(i / kPanelWidth) * panel;
    const int lane = i % kPanelWidth;
    for (int r = 0; r < n; ++r) {
      float acc = 0.0f;
      for (int g = 0; g < kp / group; ++g) {
        std::int32_t dot = 0;
        for (int j = g * group; j < (g + 1) * group; ++j) {
          const int q = p[(j / 32) * 512 + (j % 32 / 4) * 64 + lane * 4 + j % 4] - 128;
          dot += q * a.int8()[static_cast<std::size_t>(r) * a.row_stride() + j];
        }
        std::uint16_t half;
        std::memcpy(&half, p + static_cast<std::size_t>(kp) * kPanelWidth + (g * kPanelWidth + lane) * 2, 2);
        const float scale = fp16_to_float(half) * a.int8_scales()[static_cast<std::size_t>(r) * a.int8_groups() + g];
        acc = std::fma(static_cast<float>(dot), scale, acc);
      }
      y[static_cast<std::size_t>(r) * d + i] = acc;
    }
  }
  return y;
}

TEST(PackedMatmul, FmaKernelsGiveTheBitsOfTheirScalarDefinition) {
  // Every kernel from AVX2 up, bit for bit: fp32 and widened bf16 (AVX2, AVX-512; not the bf16-dot kernels,
  // whose split of x is another computation), and int8 (AVX2's vpmaddubsw, VNNI, AMX). So a layout's tokens
  // do not depend on which of these CPUs runs it. Every shape in its default int8 grouping, and k = 512 also
  // in groups of 32 and 64, k = 768 in groups of 96 (the runtime's wo and w2).
  std::mt19937 rng(15);
  std::vector<std::pair<Shape, int>> cases;
  for (const Shape& s : kShapes) cases.push_back({s, 0});
  cases.push_back({{16, 512, 64}, kInt8Block});
  cases.push_back({{5, 512, 40}, kInt8Block});
  cases.push_back({{16, 512, 64}, kInt8HeadGroup});
  cases.push_back({{5, 768, 40}, kInt8HeadGroup});
  cases.push_back({{13, 192, 70}, kInt8HeadGroup});
  cases.push_back({{16, 768, 64}, 96});
  cases.push_back({{3, 768, 40}, 96});
  int compared = 0;
  for (const auto& [s, group] : cases) {
    const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(s.n) * s.k, -2.0f, 2.0f);
    const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(s.d) * s.k);
    for (WeightDtype dtype : kDtypes) {
      if (dtype != WeightDtype::kInt8 && group != 0) continue;
      const Packed packed = pack(dtype, w, s.d, s.k, group);
      Activations a;
      a.reserve(s.n, s.k);
      a.prepare(x.data(), s.n, packed.matrix);
      const std::vector<float> want = fma_definition(a, packed.matrix);
      for (Isa isa : runnable_isas()) {
        if (isa < Isa::kAvx2 || (dtype == WeightDtype::kBf16 && isa >= Isa::kAvx512Bf16)) continue;
        ScopedIsa scoped(isa);
        std::vector<float> y(want.size());
        matmul(y.data(), a, packed.matrix);
        ++compared;
        EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
            << weight_dtype_name(dtype) << " " << isa_name(isa) << " n=" << s.n << " k=" << s.k << " d=" << s.d
            << " group=" << a.int8_group();
      }
    }
  }
  if (best_isa() < Isa::kAvx2) GTEST_SKIP() << "this CPU has no FMA kernels (portable only)";
  EXPECT_GT(compared, 0);
}

TEST(PackedMatmul, GroupedOutputsEqualSeparateMatmuls) {
  std::mt19937 rng(13);
  const int n = 5, k = 96;
  const int ds[] = {40, 24, 24};  // q, k, v of a GQA slice
  const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k);
  for (WeightDtype dtype : kDtypes) {
    SCOPED_TRACE(weight_dtype_name(dtype));
    std::vector<Packed> packed;
    for (int d : ds) packed.push_back(pack(dtype, random_floats(rng, static_cast<std::size_t>(d) * k), d, k));
    Activations a;
    a.reserve(n, k);
    a.prepare(x.data(), n, k, dtype);
    std::vector<std::vector<float>> grouped(3), separate(3);
    std::vector<MatmulOutput> outputs;
    for (int i = 0; i < 3; ++i) {
      grouped[i].assign(static_cast<std::size_t>(n) * ds[i], 0.0f);
      separate[i].assign(grouped[i].size(), 0.0f);
      outputs.push_back({grouped[i].data(), &packed[i].matrix});
      matmul(separate[i].data(), a, packed[i].matrix);
    }
    ScopedThreads threads(2);
    matmul(a, outputs);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(grouped[i], separate[i]) << "output " << i;
  }
}

// Matrices packed one after the other in one buffer (as ShardWeights packs q, k and v) are one matrix to
// the grouped matmul: its tiles span their borders, here with padding panels inside (40 and 24 features
// are no multiples of the 16-wide panel), and each tile's results still land in the right output, bit for
// bit as separate matmuls, for batches of one, one tile and more than one tile of rows, on 1 to 3 threads.
TEST(PackedMatmul, AdjacentMatricesGroupedEqualSeparateMatmuls) {
  std::mt19937 rng(16);
  const int k = 96;
  const int ds[] = {40, 24, 24};
  for (WeightDtype dtype : kDtypes) {
    SCOPED_TRACE(weight_dtype_name(dtype));
    std::size_t total = 0;
    for (int d : ds) total += packed_size_bytes(dtype, d, k);
    std::unique_ptr<std::byte, decltype(&std::free)> buffer(
        static_cast<std::byte*>(std::aligned_alloc(kPackedAlignment, total)), &std::free);
    std::vector<PackedMatrix> matrices;
    std::byte* at = buffer.get();
    for (int d : ds) {
      const std::vector<float> w = random_floats(rng, static_cast<std::size_t>(d) * k);
      pack_weights(dtype, w.data(), k, d, k, at);
      matrices.push_back({dtype, d, k, at});
      at += packed_size_bytes(dtype, d, k);
    }
    for (int n : {1, 16, 70}) {
      const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k);
      Activations a;
      a.reserve(n, k);
      a.prepare(x.data(), n, k, dtype);
      std::vector<std::vector<float>> separate(3);
      for (int i = 0; i < 3; ++i) {
        separate[i].assign(static_cast<std::size_t>(n) * ds[i], 0.0f);
        matmul(separate[i].data(), a, matrices[i]);
      }
      for (int threads : {1, 2, 3}) {
        ScopedThreads scoped(threads);
        std::vector<std::vector<float>> grouped(3);
        std::vector<MatmulOutput> outputs;
        for (int i = 0; i < 3; ++i) {
          grouped[i].assign(separate[i].size() + 1, -7.0f);  // one guard value past each output
          outputs.push_back({grouped[i].data(), &matrices[i]});
        }
        matmul(a, outputs);
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(grouped[i].back(), -7.0f) << "wrote past output " << i;
          grouped[i].pop_back();
          EXPECT_EQ(grouped[i], separate[i]) << "output " << i << ", " << n << " rows, " << threads << " threads";
        }
      }
    }
  }
}

// matmul_argmax against argmax() over matmul()'s output: the same index and value, bit for bit.
void expect_argmax_of_matmul(const Activations& a, const PackedMatrix& w, bool first_nan_wins) {
  const int n = a.n(), d = w.d;
  std::vector<float> y(static_cast<std::size_t>(n) * d);
  matmul(y.data(), a, w);
  std::vector<float> values(n + 1, -7.0f);
  std::vector<int> indices(n + 1, -7);
  std::unique_ptr<bool[]> has_nan = std::make_unique<bool[]>(n);
  matmul_argmax(a, w, values.data(), indices.data(), first_nan_wins, has_nan.get());
  EXPECT_EQ(values[n], -7.0f) << "wrote past values[n]";
  EXPECT_EQ(indices[n], -7) << "wrote past indices[n]";
  for (int r = 0; r < n; ++r) {
    const float* row = y.data() + static_cast<std::size_t>(r) * d;
    // Whether the row held a NaN anywhere, which the index alone hides (greedy decoding's NaN warning).
    EXPECT_EQ(has_nan[r], std::any_of(row, row + d, [](float v) { return std::isnan(v); })) << "row " << r;
    int want = argmax(row, d);
    if (!first_nan_wins && std::isnan(row[want])) {  // skip a NaN first value too: the largest other, or none
      want = -1;
      for (int i = 1; i < d; ++i) {
        if (!std::isnan(row[i]) && (want < 0 || row[i] > row[want])) want = i;
      }
    }
    SCOPED_TRACE(::testing::Message() << "row " << r);
    ASSERT_EQ(indices[r], want);
    if (want >= 0) {
      EXPECT_EQ(std::memcmp(&values[r], &row[want], sizeof(float)), 0) << values[r] << " != " << row[want];
    } else {
      EXPECT_TRUE(std::isnan(values[r]));
    }
  }
}

TEST(PackedMatmul, ArgmaxEqualsTheArgmaxOfTheMatmulForEveryDtypeIsaAndThreadCount) {
  std::mt19937 rng(15);
  // d: part of a panel, several tiles, a partial last panel, enough panels for 3 threads' bands, and 2
  // panels for 3 threads (thread 0's band empty); n: one row, a 16-row AMX block with a tail, more than one
  // and more than two 64-row tiles.
  constexpr Shape kArgmaxShapes[] = {{1, 32, 1},    {3, 33, 17},    {17, 288, 200}, {16, 128, 1000},
                                     {65, 70, 129}, {130, 64, 300}, {3, 1024, 17}};
  for (const Shape& s : kArgmaxShapes) {
    const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(s.n) * s.k, -2.0f, 2.0f);
    const std::vector<float> random_w = random_floats(rng, static_cast<std::size_t>(s.d) * s.k);
    // Equal maxima: from the middle on, the features cycle through three rows, w0, -w0 and w1, six times as
    // long as the others, so most rows' maximum is one of them (one of w0 and -w0 is positive), repeated in
    // every later panel, tile and thread band, where each copy must lose to the first.
    std::vector<float> tied_w = random_w;
    const int first_copy = s.d / 2;
    for (int i = first_copy; i < s.d; ++i) {
      const float sign = i % 3 == 1 ? -6.0f : 6.0f;
      const std::size_t source = static_cast<std::size_t>(i % 3 == 2 ? 1 : 0) * s.k;
      for (int j = 0; j < s.k; ++j) tied_w[static_cast<std::size_t>(i) * s.k + j] = sign * random_w[source + j];
    }
    for (const std::vector<float>* w : std::initializer_list<const std::vector<float>*>{&random_w, &tied_w}) {
      for (WeightDtype dtype : kDtypes) {
        const Packed packed = pack(dtype, *w, s.d, s.k);
        Activations a;
        a.reserve(s.n, s.k);
        a.prepare(x.data(), s.n, s.k, dtype);
        for (Isa isa : runnable_isas()) {
          for (int threads : {1, 2, 3}) {
            SCOPED_TRACE(::testing::Message() << weight_dtype_name(dtype) << " " << isa_name(isa) << " threads=" << threads
                                              << " n=" << s.n << " k=" << s.k << " d=" << s.d
                                              << (w == &tied_w ? " tied" : ""));
            ScopedIsa scoped_isa(isa);
            ScopedThreads scoped_threads(threads);
            expect_argmax_of_matmul(a, packed.matrix, true);
            expect_argmax_of_matmul(a, packed.matrix, false);
          }
        }
        if (w == &tied_w && s.d >= 200) {  // the premise: most rows' maximum is tied
          std::vector<float> y(static_cast<std::size_t>(s.n) * s.d);
          matmul(y.data(), a, packed.matrix);
          int tied_rows = 0;
          for (int r = 0; r < s.n; ++r) {
            const float* row = y.data() + static_cast<std::size_t>(r) * s.d;
            const int best = argmax(row, s.d);
            tied_rows += best >= first_copy && best + 3 < s.d && row[best + 3] == row[best];
          }
          EXPECT_GT(tied_rows, s.n / 2) << weight_dtype_name(dtype) << " d=" << s.d;
        }
      }
    }
  }
}

// The fold's definition, one value at a time: a NaN sets nan and is skipped, the first value or a greater one
// becomes the maximum (so of equal maxima the first stays).
void fold_one_by_one(const std::vector<float>& x, row::RowMax& max) {
  for (int i = 0; i < static_cast<int>(x.size()); ++i) {
    if (std::isnan(x[i])) {
      max.nan = true;
    } else if (max.index < 0 || x[i] > max.value) {
      max = {x[i], i, max.nan};
    }
  }
}

// merge_row_max(): a row cut into pieces, each folded on its own (fold_max, as a tile is) and the pieces'
// maxima merged in a random order (as threads that took tiles from each other's bands merge them), gives
// what one fold over the row in order does: the first of equal maxima (values from a small set, so ties
// abound), NaNs skipped but flagged, and argmax()'s NaN first value, which beats everything. And each ISA's
// fold (the AVX2 and AVX-512 ones skip blocks that cannot win) gives the definition's maximum: rows with
// NaNs in most blocks and rows with one or none, rising runs (a new maximum in many blocks) and flat ones.
TEST(PackedMatmul, MergedMaximaOfARowsPiecesInAnyOrderEqualOneFoldInOrder) {
  for (Isa isa : runnable_isas()) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsa scoped(isa);
    std::mt19937 rng(17);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const row::FoldMax fold_max = row::active_row_kernels().fold_max;
    const row::RowMax none{nan, -1};
    for (int trial = 0; trial < 2000; ++trial) {
      const int n = 1 + static_cast<int>(rng() % 200);
      const unsigned nan_odds = trial % 3 == 0 ? 10 : 400;  // a NaN in most blocks, or in few rows at all
      const bool rising = trial % 5 == 0;
      std::vector<float> x(n);
      for (int i = 0; i < n; ++i) {
        const unsigned pick = rng() % nan_odds;
        const float value = rising ? static_cast<float>(i / 7) : static_cast<float>(static_cast<int>(rng() % 5) - 2);
        x[i] = pick == 0 ? nan : pick == 1 ? -0.0f : value;
      }
      const bool first_nan_wins = rng() % 2 == 0;
      row::RowMax whole = none;
      if (first_nan_wins && std::isnan(x[0])) whole = {x[0], 0};
      row::RowMax want = whole;
      fold_max(x.data(), n, 0, whole);
      fold_one_by_one(x, want);
      ASSERT_EQ(whole.index, want.index) << "trial " << trial;
      ASSERT_EQ(whole.nan, want.nan) << "trial " << trial;
      if (want.index >= 0 && !std::isnan(want.value)) {
        ASSERT_EQ(std::signbit(whole.value), std::signbit(want.value)) << "trial " << trial;
      }
      // Pieces [cuts[i], cuts[i + 1]), merged in a shuffled order.
      std::vector<int> cuts = {0, n};
      for (int c = static_cast<int>(rng() % 6); c > 0; --c) cuts.push_back(static_cast<int>(rng() % (n + 1)));
      std::sort(cuts.begin(), cuts.end());
      std::vector<row::RowMax> pieces;
      for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
        row::RowMax piece = none;
        if (first_nan_wins && cuts[i] == 0 && cuts[i + 1] > 0 && std::isnan(x[0])) piece = {x[0], 0};
        fold_max(x.data() + cuts[i], cuts[i + 1] - cuts[i], cuts[i], piece);
        pieces.push_back(piece);
      }
      std::shuffle(pieces.begin(), pieces.end(), rng);
      row::RowMax merged = none;
      for (const row::RowMax& piece : pieces) merged = row::merge_row_max(merged, piece);
      ASSERT_EQ(merged.index, whole.index) << "trial " << trial;
      ASSERT_EQ(merged.nan, whole.nan) << "trial " << trial;
      if (whole.index >= 0 && !std::isnan(whole.value)) {
        ASSERT_EQ(std::signbit(merged.value), std::signbit(whole.value)) << "trial " << trial;
        ASSERT_EQ(merged.value, whole.value) << "trial " << trial;
      } else {
        ASSERT_TRUE(std::isnan(merged.value)) << "trial " << trial;
      }
    }
  }
}

TEST(PackedMatmul, ArgmaxSkipsNaNsUnlessTheFirstValueIsOneAndAskedTo) {
  // fp32 weights keep a NaN as it is, so a weight row of NaNs makes that feature NaN in every row.
  std::mt19937 rng(16);
  const int n = 5, k = 64, d = 300;
  const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -2.0f, 2.0f);
  const std::vector<float> random_w = random_floats(rng, static_cast<std::size_t>(d) * k);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto with_nan_features = [&](std::initializer_list<int> features) {
    std::vector<float> w = random_w;
    for (int f : features) std::fill_n(w.begin() + static_cast<std::size_t>(f) * k, k, nan);
    return w;
  };
  std::vector<float> all_nan(static_cast<std::size_t>(d) * k, nan);
  // The bands of 2 threads start at features 0 and 144, of 3 at 0, 96 and 192 (19 panels).
  std::vector<float> band_0_nan = random_w;  // all of 2 threads' first band and the start of the second
  std::fill_n(band_0_nan.begin(), static_cast<std::size_t>(160) * k, nan);
  const std::vector<std::vector<float>> cases = {with_nan_features({0}),          with_nan_features({0, 1, 150, 299}),
                                                 with_nan_features({7, 64, 65, 200}), all_nan,
                                                 with_nan_features({144}),        with_nan_features({96, 192}),
                                                 band_0_nan};
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const Packed packed = pack(WeightDtype::kF32, cases[c], d, k);
    Activations a;
    a.reserve(n, k);
    a.prepare(x.data(), n, k, WeightDtype::kF32);
    for (Isa isa : runnable_isas()) {
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(::testing::Message() << "case " << c << " " << isa_name(isa) << " threads=" << threads);
        ScopedIsa scoped_isa(isa);
        ScopedThreads scoped_threads(threads);
        expect_argmax_of_matmul(a, packed.matrix, true);
        expect_argmax_of_matmul(a, packed.matrix, false);
      }
    }
  }
  // What the cases above compare against, spelled out: a NaN first value wins only when asked to, and a
  // row of NaNs has no index without it.
  const Packed first_nan = pack(WeightDtype::kF32, cases[0], d, k);
  const Packed nans = pack(WeightDtype::kF32, all_nan, d, k);
  Activations a;
  a.reserve(n, k);
  a.prepare(x.data(), n, k, WeightDtype::kF32);
  std::vector<float> values(n);
  std::vector<int> indices(n);
  matmul_argmax(a, first_nan.matrix, values.data(), indices.data(), true);
  EXPECT_EQ(indices[0], 0);
  matmul_argmax(a, first_nan.matrix, values.data(), indices.data(), false);
  EXPECT_GT(indices[0], 0);
  EXPECT_FALSE(std::isnan(values[0]));
  matmul_argmax(a, nans.matrix, values.data(), indices.data(), false);
  EXPECT_EQ(indices[0], -1);
  EXPECT_TRUE(std::isnan(values[0]));
}

TEST(PackedMatmul, FusedSwigluEqualsMatmulsThenSwiglu) {
  std::mt19937 rng(14);
  const int n = 7, k = 64, d = 90;
  const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -3.0f, 3.0f);
  for (WeightDtype dtype : kDtypes) {
    SCOPED_TRACE(weight_dtype_name(dtype));
    const Packed w1 = pack(dtype, random_floats(rng, static_cast<std::size_t>(d) * k), d, k);
    const Packed w3 = pack(dtype, random_floats(rng, static_cast<std::size_t>(d) * k), d, k);
    Activations a;
    a.reserve(n, k);
    a.prepare(x.data(), n, k, dtype);
    std::vector<float> h1(static_cast<std::size_t>(n) * d), h3(h1.size()), fused(h1.size() + 1, -7.0f);
    matmul(h1.data(), a, w1.matrix);
    matmul(h3.data(), a, w3.matrix);
    swiglu(h1.data(), h3.data(), n * d);
    for (int threads : {1, 2}) {
      ScopedThreads scoped(threads);
      matmul_swiglu(fused.data(), a, w1.matrix, w3.matrix);
      EXPECT_EQ(fused.back(), -7.0f) << "wrote past h[n * d]";
      EXPECT_EQ(std::vector<float>(fused.begin(), fused.end() - 1), h1) << threads << " threads";
    }
  }
}

// Several steps in one pass of the threads (run_team, as a stage's layer runs them): each step's Team form
// does its thread's share, and together the shares are the whole matmul, bit for bit, for any thread count.
TEST(PackedMatmul, TeamSharesInOnePassEqualTheWholeMatmuls) {
  std::mt19937 rng(15);
  const int n = 5, k = 96, d = 150;
  const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -3.0f, 3.0f);
  for (WeightDtype dtype : kDtypes) {
    SCOPED_TRACE(weight_dtype_name(dtype));
    const Packed w1 = pack(dtype, random_floats(rng, static_cast<std::size_t>(d) * k), d, k);
    const Packed w3 = pack(dtype, random_floats(rng, static_cast<std::size_t>(d) * k), d, k);
    const Packed w2 = pack(dtype, random_floats(rng, static_cast<std::size_t>(k) * d), k, d);
    Activations a, a2;
    a.reserve(n, k);
    a2.reserve(n, d);
    a.prepare(x.data(), n, k, dtype);
    std::vector<float> y1(static_cast<std::size_t>(n) * d), h(y1.size()), y2(static_cast<std::size_t>(n) * k);
    const MatmulOutput grouped[] = {{y1.data(), &w1.matrix}};
    matmul(a, grouped);
    matmul_swiglu(h.data(), a, w1.matrix, w3.matrix);
    a2.prepare(h.data(), n, w2.matrix);
    matmul(y2.data(), a2, w2.matrix);
    for (int threads : {1, 2, 3}) {
      ScopedThreads scoped(threads);
      std::vector<float> team_y1(y1.size()), team_h(h.size()), team_y2(y2.size());
      Activations b;
      b.reserve(n, d);
      b.prepare_shape(team_h.data(), n, w2.matrix);
      const MatmulOutput team_grouped[] = {{team_y1.data(), &w1.matrix}};
      run_team([&](Team team) {
        matmul(a, team_grouped, team);
        matmul_swiglu(team_h.data(), a, w1.matrix, w3.matrix, team);
        team_barrier();  // w2's rows need all of h
        const Band rows = team.share(n);
        b.prepare_rows(team_h.data(), rows.begin, rows.end);
        team_barrier();
        matmul(team_y2.data(), b, w2.matrix, team);
      });
      EXPECT_EQ(team_y1, y1) << threads << " threads";
      EXPECT_EQ(team_h, h) << threads << " threads";
      EXPECT_EQ(team_y2, y2) << threads << " threads";
    }
  }
}

// A thread that falls behind (here it starts its first matmul only when the others have finished it; on a
// VM a neighbour on its core holds it back) has its tiles taken by the others (StealingBands): whoever computes a tile, each step's results
// are the whole matmul's, bit for bit, for every dtype, a decode row and a batch.
TEST(PackedMatmul, TilesTakenFromASlowThreadGiveTheSameBits) {
  std::mt19937 rng(16);
  const int k = 96, d = 300;
  for (WeightDtype dtype : kDtypes) {
    for (int n : {1, 16}) {
      SCOPED_TRACE(fmt::format("{}, {} rows", weight_dtype_name(dtype), n));
      const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -3.0f, 3.0f);
      const Packed w1 = pack(dtype, random_floats(rng, static_cast<std::size_t>(d) * k), d, k);
      const Packed w3 = pack(dtype, random_floats(rng, static_cast<std::size_t>(d) * k), d, k);
      Activations a;
      a.reserve(n, k);
      a.prepare(x.data(), n, k, dtype);
      std::vector<float> y(static_cast<std::size_t>(n) * d), h(y.size());
      {
        ScopedThreads one(1);
        matmul(y.data(), a, w1.matrix);
        matmul_swiglu(h.data(), a, w1.matrix, w3.matrix);
      }
      for (int threads : {2, 3}) {
        ScopedThreads scoped(threads);
        for (int slow = 0; slow < threads; ++slow) {
          std::vector<float> team_y(y.size()), team_h(h.size());
          std::atomic<int> done{0};
          run_team([&](Team team) {
            // The slow thread starts only when the others have finished the matmul: they took all its tiles.
            while (team.thread == slow && done.load() < team.n_threads - 1) std::this_thread::yield();
            matmul(team_y.data(), a, w1.matrix, team);
            ++done;
            matmul_swiglu(team_h.data(), a, w1.matrix, w3.matrix, team);
          });
          EXPECT_EQ(team_y, y) << threads << " threads, thread " << slow << " slow";
          EXPECT_EQ(team_h, h) << threads << " threads, thread " << slow << " slow";
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// threads and the bandwidth probe

TEST(Isa, SetIsaClampsToTheBestAndRestores) {
  const Isa best = best_isa();
  {
    ScopedIsa portable(Isa::kPortable);
    EXPECT_EQ(active_isa(), Isa::kPortable);
    set_isa(Isa::kAvx512Vnni);
    EXPECT_LE(static_cast<int>(active_isa()), static_cast<int>(best));
  }
  EXPECT_EQ(active_isa(), default_isa()) << "the scope restores the level the kernels start on";
  EXPECT_STRNE(isa_name(best), "?");
}

// auto runs the best level, except where that is avx512-bf16 and vdpbf16ps is slow next to FMA: then one
// below, which differs only in widening bf16 weights. The rate is a measured instruction throughput ratio:
// 0.25 on Intel Emerald Rapids, 0.94 on AMD Zen 5; nothing retires it faster than 4 per FMA.
TEST(Isa, AutoStepsBelowAvx512Bf16OnlyWhereItsDotsAreSlow) {
  const Isa best = best_isa();
  if (best >= Isa::kAvx512Bf16) {
    EXPECT_GT(bf16_dot_rate(), 0.05);
    EXPECT_LT(bf16_dot_rate(), 4.0);
    EXPECT_NEAR(measure_bf16_dot_rate(), bf16_dot_rate(), 0.3 * bf16_dot_rate()) << "a second measurement agrees";
  } else {
    EXPECT_EQ(bf16_dot_rate(), 0.0);
  }
  const bool slow_dots = best == Isa::kAvx512Bf16 && bf16_dot_rate() < kMinBf16DotRate;
  EXPECT_EQ(default_isa(), slow_dots ? Isa::kAvx512Vnni : best) << "rate " << bf16_dot_rate();
  ScopedIsa start(default_isa());
  const std::string said = describe_active_isa();
  EXPECT_EQ(said.rfind(std::string(isa_name(default_isa())) + " kernels", 0), 0u) << said;
  EXPECT_EQ(said.find("vdpbf16ps") != std::string::npos, slow_dots) << said;
  set_isa(best);
  EXPECT_EQ(describe_active_isa(), std::string(isa_name(best)) + " kernels") << "a level chosen on purpose needs no why";
}

TEST(Threads, ParallelForVisitsEveryItemOnceOnAKernelThread) {
  for (int threads : {1, 2}) {
    ScopedThreads scoped(threads);
    for (int n : {0, 1, 2, 7}) {
      std::vector<int> visits(n, 0), thread_of(n, -1);
      parallel_for(n, [&](int item, int thread) {
        ++visits[item];
        thread_of[item] = thread;
      });
      EXPECT_EQ(visits, std::vector<int>(n, 1)) << "threads " << threads << " n " << n;
      for (int t : thread_of) EXPECT_TRUE(t >= 0 && t < threads);
      // Contiguous bands: thread indices never decrease along the items.
      EXPECT_TRUE(std::is_sorted(thread_of.begin(), thread_of.end()));
    }
    // One item runs on the calling thread, outside any parallel region, so its own kernels may use threads.
    int level = -1;
    parallel_for(1, [&](int, int) { level = omp_get_level(); });
    EXPECT_EQ(level, 0);
  }
}

TEST(Threads, RunTeamRunsOncePerThreadAndTheBarrierPublishesEveryWrite) {
  for (int threads : {1, 2, 3}) {
    ScopedThreads scoped(threads);
    std::vector<int> ran(threads, 0), seen(threads, 0), bands(10, -1);
    run_team([&](Team team) {
      ASSERT_EQ(team.n_threads, threads);
      ++ran[team.thread];
      const Band mine = team.share(10);
      for (int i = mine.begin; i < mine.end; ++i) bands[i] = team.thread;
      team_barrier();
      // After the barrier every thread sees what every other wrote before it.
      for (int v : ran) seen[team.thread] += v;
    });
    EXPECT_EQ(ran, std::vector<int>(threads, 1)) << threads << " threads";
    EXPECT_EQ(seen, std::vector<int>(threads, threads)) << threads << " threads";
    EXPECT_TRUE(std::is_sorted(bands.begin(), bands.end()) && bands.front() == 0 && bands.back() == threads - 1)
        << threads << " threads: the shares are contiguous bands in thread order covering every item";
  }
}

// A kernel that opens its own pass, called inside a pass (or any parallel region), runs on its caller
// alone, and the enclosing pass's barrier and claims still hold after it: the threads meet at the next
// barrier, and a matmul of the whole pass after it still splits and steals as usual.
TEST(Threads, APassInsideAPassRunsOnItsCallerAloneAndLeavesTheOuterPassWhole) {
  std::mt19937 rng(18);
  const int n = 16, k = 64, d = 200;
  const std::vector<float> x = random_floats(rng, static_cast<std::size_t>(n) * k, -2.0f, 2.0f);
  const Packed w = pack(WeightDtype::kF32, random_floats(rng, static_cast<std::size_t>(d) * k), d, k);
  Activations a;
  a.reserve(n, k);
  a.prepare(x.data(), n, k, WeightDtype::kF32);
  std::vector<float> y(static_cast<std::size_t>(n) * d);
  matmul(y.data(), a, w.matrix);
  for (int threads : {2, 3}) {
    ScopedThreads scoped(threads);
    std::vector<int> inner_threads(threads, 0);
    std::vector<std::vector<float>> inner_y(threads, std::vector<float>(y.size()));
    std::vector<float> outer_y(y.size());
    std::atomic<int> arrived{0}, early{0}, finished{0}, late_took{0};
    run_team([&](Team team) {
      run_team([&](Team inner) { inner_threads[team.thread] = inner.n_threads; });
      matmul(inner_y[team.thread].data(), a, w.matrix);  // opens its own pass: here the caller's alone
      ++arrived;
      team_barrier();
      early += arrived.load() != team.n_threads;
      matmul(outer_y.data(), a, w.matrix, team);
      // The outer pass's claims still work: a thread that comes late finds its band taken by the others.
      StealingBands items(100, 1, team);
      const bool late = team.thread == team.n_threads - 1;
      while (late && finished.load() < team.n_threads - 1) std::this_thread::yield();
      for (Band run = items.next(); run.begin >= 0; run = items.next()) late_took += late ? run.end - run.begin : 0;
      ++finished;
    });
    EXPECT_EQ(late_took.load(), 0) << threads << " threads: the others took the late thread's band";
    EXPECT_EQ(inner_threads, std::vector<int>(threads, 1)) << threads << " threads";
    for (const auto& inner : inner_y) EXPECT_EQ(inner, y) << threads << " threads";
    EXPECT_EQ(early.load(), 0) << threads << " threads: the outer barrier still waits for everyone";
    EXPECT_EQ(outer_y, y) << threads << " threads";
  }
}

// The barrier is reused round after round, and a thread that arrives late (here by 0.2 ms, past the others'
// spin) finds them asleep and must wake them: every round each thread sees every thread's write of that
// round, and no thread runs ahead into the next round's writes before the others have read.
TEST(Threads, TheBarrierHoldsOverManyRoundsAndWakesThreadsThatWentToSleep) {
  for (int threads : {2, 3}) {
    ScopedThreads scoped(threads);
    constexpr int kRounds = 200;
    std::vector<std::atomic<int>> slot(threads);
    std::atomic<int> mismatches{0};
    run_team([&](Team team) {
      for (int round = 1; round <= kRounds; ++round) {
        if (round % 20 == 0 && team.thread == round / 20 % team.n_threads) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        slot[team.thread].store(round, std::memory_order_relaxed);
        team_barrier();
        for (const auto& s : slot) mismatches += s.load(std::memory_order_relaxed) != round;
        team_barrier();
      }
    });
    EXPECT_EQ(mismatches.load(), 0) << threads << " threads";
  }
}

// share_by_cost(): contiguous bands in thread order that cover every item once, whatever the costs, and
// whose costs differ by at most twice the largest item's (each item goes where the middle of its cost falls,
// so each end of a band is at most half an item off its equal share).
TEST(Threads, SharesByCostTileTheItemsAndBalanceTheirCost) {
  std::mt19937 rng(5);
  std::vector<std::vector<long>> cases = {
      {},                                    // nothing
      std::vector<long>(10, 3),              // equal: bands of equal counts (within one)
      {0, 0, 0, 0},                          // no cost at all: share()'s bands
      {1000, 1, 1, 1, 1, 1, 1, 1},           // one item outweighs the rest
      {5, 5, 0, 0, 0},                       // free items at the end still go to a thread
  };
  std::vector<long> prefill(64);  // a prefill chunk's rows see 1 .. 64 positions
  for (int i = 0; i < 64; ++i) prefill[i] = i + 1;
  cases.push_back(prefill);
  for (int c = 0; c < 20; ++c) {
    std::vector<long> random(1 + rng() % 40);
    for (long& v : random) v = static_cast<long>(rng() % 600);
    cases.push_back(random);
  }
  for (const std::vector<long>& costs : cases) {
    const int n = static_cast<int>(costs.size());
    const long largest = n > 0 ? *std::max_element(costs.begin(), costs.end()) : 0;
    for (int threads = 1; threads <= 5; ++threads) {
      std::vector<int> owner(n, -1);
      std::vector<long> band_cost(threads, 0);
      int next = 0;
      for (int t = 0; t < threads; ++t) {
        const Band band = Team{t, threads}.share_by_cost(n, [&](int i) { return costs[i]; });
        ASSERT_EQ(band.begin, next) << "thread " << t << " of " << threads << ", " << n << " items";
        ASSERT_LE(band.begin, band.end);
        for (int i = band.begin; i < band.end; ++i) band_cost[t] += costs[i];
        next = band.end;
      }
      EXPECT_EQ(next, n) << threads << " threads: every item has a thread";
      const auto [low, high] = std::minmax_element(band_cost.begin(), band_cost.end());
      if (n >= threads) {
        EXPECT_LE(*high - *low, 2 * largest) << threads << " threads, " << n << " items";
      }
    }
  }
  // A 64-row prefill chunk on two threads: 1035 and 1045 of 2080 positions, where equal counts give 528
  // and 1552.
  const Band first = Team{0, 2}.share_by_cost(64, [&](int i) { return prefill[i]; });
  EXPECT_EQ(first.begin, 0);
  EXPECT_EQ(first.end, 45);
}

// StealingBands: every item of a loop goes to exactly one thread; each thread takes its own band from the
// front, in order, in runs of a quarter of what is left (so a band of b items takes about
// log(b / grain) / log(4 / 3) claims); a thread that is late finds its band taken from the back by the others, a grain at a time. Past
// kTeamLoops loops in one pass, and outside a pass, each thread takes its own band alone.
TEST(Threads, StealingBandsGiveEveryItemOnceAndTakeFromALateThread) {
  for (int threads : {1, 2, 3}) {
    ScopedThreads scoped(threads);
    for (int n_items : {0, 1, 7, 50, 301}) {
      for (int grain : {1, 4}) {
        SCOPED_TRACE(fmt::format("{} threads, {} items, grain {}", threads, n_items, grain));
        constexpr int kLoops = kTeamLoops + 3;  // the last three with no claims left: bands alone
        std::vector<std::vector<int>> owner(kLoops, std::vector<int>(n_items, -1));
        std::vector<std::vector<int>> times(kLoops, std::vector<int>(n_items, 0));
        std::atomic<int> bad_runs{0}, out_of_order{0}, done{0}, too_many_own_runs{0};
        const int late = threads - 1;
        run_team([&](Team team) {
          for (int loop = 0; loop < kLoops; ++loop) {
            StealingBands items(n_items, grain, team);
            // Loop 0: the late thread looks only when the others have run out of items.
            while (loop == 0 && team.thread == late && done.load() < team.n_threads - 1) std::this_thread::yield();
            const Band own = team.share(n_items);
            int own_next = own.begin, own_runs = 0;
            bool stole = false;
            for (Band run = items.next(); run.begin >= 0; run = items.next()) {
              const bool stolen = run.begin < own.begin || run.begin >= own.end;
              if (run.end <= run.begin || run.begin < 0 || run.end > n_items || (stolen && run.end - run.begin > grain) ||
                  (!stolen && run.end > own.end)) {
                ++bad_runs;
                continue;
              }
              // A band of b items in runs of a quarter of what is left: about log(b) / log(4 / 3) of them
              // (one run, the whole band, without claims); 301 items in grains of 1 took 301 before.
              const double quarters = std::log(std::max(1, own.end - own.begin)) / std::log(4.0 / 3.0);
              if (!stolen && ++own_runs > 4 + static_cast<int>(quarters)) {
                ++too_many_own_runs;
              }
              if (!stolen && run.begin != own_next) ++out_of_order;
              if (stolen) stole = true;
              if (!stolen && stole) ++out_of_order;  // an own run after a stolen one
              if (run.begin == own_next) own_next = run.end;
              for (int i = run.begin; i < run.end; ++i) {
                owner[loop][i] = team.thread;  // each item's thread; times counts every claim of it
                ++times[loop][i];
              }
            }
            if (loop == 0) ++done;
            team_barrier();  // all of this loop's claims are in before the next reads owner
          }
        });
        EXPECT_EQ(bad_runs.load(), 0);
        EXPECT_EQ(too_many_own_runs.load(), 0) << "own runs take a quarter of what is left of the band";
        EXPECT_EQ(out_of_order.load(), 0) << "a thread's own items come first, from the front of its band, in order";
        for (int loop = 0; loop < kLoops; ++loop) {
          EXPECT_EQ(times[loop], std::vector<int>(n_items, 1)) << "loop " << loop << ": every item exactly once";
        }
        if (threads > 1) {
          EXPECT_EQ(std::count(owner[0].begin(), owner[0].end(), late), 0) << "the others took all the late band";
          for (int loop = kTeamLoops; loop < kLoops; ++loop) {
            for (int t = 0; t < threads; ++t) {
              const Band band = thread_band(n_items, t, threads);
              for (int i = band.begin; i < band.end; ++i) ASSERT_EQ(owner[loop][i], t) << "loop " << loop;
            }
          }
        }
      }
    }
  }
  // Outside a run_team() pass: the band of Team::share, as one run.
  StealingBands outside(10, 4, Team{1, 2});
  EXPECT_EQ(outside.likely_next(), 5);
  const Band first = outside.next();
  EXPECT_EQ(first.begin, 5);
  EXPECT_EQ(first.end, 10);
  EXPECT_EQ(outside.next().begin, -1);
  EXPECT_EQ(outside.likely_next(), -1);
}

// Each 64-byte line holds a 1 in its first byte and zeros after it (but past a region's end): as a 64-bit
// word and as a byte alike it adds 1 to the read kernel's sum, however the lines are split, so the sum
// counts the lines read. Regions of
// odd sizes, end to end as one run of lines that the threads split and take from each other, are read
// line for line once.
TEST(BandwidthProbe, ReadsEveryLineOfEveryRegionOnce) {
  const std::size_t bytes = 8u << 20;
  std::unique_ptr<std::byte, decltype(&std::free)> buffer(static_cast<std::byte*>(std::aligned_alloc(64, bytes)), &std::free);
  std::memset(buffer.get(), 0, bytes);
  for (std::size_t at = 0; at < bytes; at += 64) buffer.get()[at] = std::byte{1};
  const std::size_t sizes[] = {64, 5 * 64 + 3, 1000 * 64, 1, 257 * 64, 3u << 20, 12345 * 64 + 63};
  std::vector<ReadRegion> regions;
  std::uint64_t lines = 0;
  std::size_t at = 0;
  for (std::size_t size : sizes) {
    regions.push_back({buffer.get() + at, size});
    lines += (size + 63) / 64;
    at += (size + 63) / 64 * 64;
    // The rest of a region's last line is not the region's: a read past its end would add these.
    for (std::size_t past = at - (size + 63) / 64 * 64 + size; past < at; ++past) buffer.get()[past] = std::byte{0x10};
  }
  ASSERT_LE(at, bytes);
  for (int threads : {1, 2, 3}) {
    ScopedThreads scoped(threads);
    for (int round = 0; round < 20; ++round) EXPECT_EQ(stream_read(regions), lines) << threads << " threads";
    EXPECT_EQ(stream_read(std::span<const ReadRegion>()), 0u);
  }
}

TEST(BandwidthProbe, ReadsEveryRegionInPlausibleTime) {
  const std::size_t bytes = 64u << 20;
  std::unique_ptr<std::byte, decltype(&std::free)> buffer(static_cast<std::byte*>(std::aligned_alloc(64, bytes)), &std::free);
  std::memset(buffer.get(), 1, bytes);
  const ReadRegion regions[] = {{buffer.get(), bytes / 2}, {buffer.get() + bytes / 2, bytes / 2 - 64 * 3 - 5}};
  for (int threads : {1, 2}) {
    ScopedThreads scoped(threads);
    const double s = time_stream_read(regions);
    // 64 MiB in more than 1 us (1000 TB/s) and less than 10 s (6.7 MB/s): a probe that skipped the reads or
    // got stuck would fall outside.
    EXPECT_GT(s, 1e-6);
    EXPECT_LT(s, 10.0);
  }
}

}  // namespace
}  // namespace shardline::kernels::cpu
