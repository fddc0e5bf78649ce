// The fp16 KV cache's conversions (ops.h store_kv_row / load_kv_row): IEEE binary16 with round to nearest
// even, the same bits from the portable code and from F16C on AVX-512, and reading back exact. GCC's own
// _Float16 conversion (a correctly rounded software routine at the baseline target) is the reference.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "tests/support/kernel_fixtures.h"

namespace shardline::kernels::cpu {
namespace {

std::uint16_t reference_half(float x) { return std::bit_cast<std::uint16_t>(static_cast<_Float16>(x)); }

float reference_float(std::uint16_t bits) { return static_cast<float>(std::bit_cast<_Float16>(bits)); }

bool is_half_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

std::vector<std::uint16_t> store_halves(const std::vector<float>& x) {
  std::vector<std::uint16_t> h(x.size());
  store_kv_row(h.data(), x.data(), static_cast<int>(x.size()), KvDtype::kF16);
  return h;
}

// Rounding at the edges of the format, each value and its negation.
TEST(KvRowFp16, RoundsToNearestEvenAtTheEdges) {
  const std::pair<float, std::uint16_t> cases[] = {
      {0.0f, 0x0000},
      {1.0f, 0x3c00},
      {1.0f + 0x1p-11f, 0x3c00},             // a tie between 1 and 1 + 2^-10: to even (1)
      {1.0f + 3 * 0x1p-11f, 0x3c02},         // a tie between 1 + 2^-10 and 1 + 2^-9: to even
      {65504.0f, 0x7bff},                    // the largest half
      {65519.99f, 0x7bff},
      {65520.0f, 0x7c00},                    // the tie above it rounds to even: infinity
      {std::numeric_limits<float>::infinity(), 0x7c00},
      {0x1p-14f, 0x0400},                    // the smallest normal half
      {0x1p-24f, 0x0001},                    // the smallest subnormal
      {0x1p-25f, 0x0000},                    // half of it: a tie, to even (0)
      {std::nextafter(0x1p-25f, 1.0f), 0x0001},
      {3 * 0x1p-25f, 0x0002},                // 1.5 x 2^-24: a tie, to even (2)
      {5 * 0x1p-25f, 0x0002},                // 2.5 x 2^-24: to even (2)
      {0x1p-14f - 0x1p-25f, 0x0400},         // rounds up into the normals
      {std::numeric_limits<float>::denorm_min(), 0x0000},
  };
  for (Isa isa : test::runnable_isas()) {
    test::ScopedIsa scoped(isa);
    for (const auto& [value, bits] : cases) {
      SCOPED_TRACE(::testing::Message() << isa_name(isa) << ": " << value);
      const std::vector<std::uint16_t> h = store_halves({value, -value});
      EXPECT_EQ(h[0], bits);
      EXPECT_EQ(h[1], bits | 0x8000u);
      EXPECT_EQ(reference_half(value), bits);
    }
  }
}

// Every 4099th bit pattern of the 2^32 floats (about a million, every exponent and sign, normals,
// subnormals, infinities and NaNs): the portable and AVX-512 conversions agree bit for bit, and with the
// compiler's correctly rounded conversion except for NaN payloads (both stay NaN).
TEST(KvRowFp16, EveryIsaAgreesWithCorrectRoundingOnASweep) {
  std::vector<float> x;
  for (std::uint64_t bits = 0; bits < (1ull << 32); bits += 4099) {
    x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  }
  std::vector<std::uint16_t> portable;
  {
    test::ScopedIsa scoped(Isa::kPortable);
    portable = store_halves(x);
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::uint16_t want = reference_half(x[i]);
    if (is_half_nan(want)) {
      ASSERT_TRUE(is_half_nan(portable[i])) << i;
    } else {
      ASSERT_EQ(portable[i], want) << "float bits " << std::hex << i * 4099;
    }
  }
  for (Isa isa : test::runnable_isas()) {
    test::ScopedIsa scoped(isa);
    EXPECT_TRUE(store_halves(x) == portable) << isa_name(isa);
  }
}

// All 65536 halves read back: exact (the compiler's conversion) and the same bits on every ISA, NaNs
// included (quiet, payload kept).
TEST(KvRowFp16, ReadsEveryHalfBackExactly) {
  std::vector<std::uint16_t> h(1 << 16);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint16_t>(i);
  std::vector<float> portable(h.size());
  {
    test::ScopedIsa scoped(Isa::kPortable);
    load_kv_row(portable.data(), h.data(), static_cast<int>(h.size()), KvDtype::kF16);
  }
  for (std::size_t i = 0; i < h.size(); ++i) {
    if (is_half_nan(h[i])) {
      ASSERT_TRUE(std::isnan(portable[i])) << i;
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(portable[i]), std::bit_cast<std::uint32_t>(reference_float(h[i]))) << i;
    }
  }
  for (Isa isa : test::runnable_isas()) {
    test::ScopedIsa scoped(isa);
    std::vector<float> got(h.size());
    load_kv_row(got.data(), h.data(), static_cast<int>(h.size()), KvDtype::kF16);
    EXPECT_EQ(std::memcmp(got.data(), portable.data(), got.size() * sizeof(float)), 0) << isa_name(isa);
  }
}

// Odd lengths (the AVX-512 kernels' masked tails) write exactly n values and nothing past them.
TEST(KvRowFp16, WritesExactlyNValues) {
  for (Isa isa : test::runnable_isas()) {
    test::ScopedIsa scoped(isa);
    for (int n : {1, 15, 16, 17, 40}) {
      std::vector<float> x(n, 2.0f);
      std::vector<std::uint16_t> h(n + 16, 0xabcd);
      store_kv_row(h.data(), x.data(), n, KvDtype::kF16);
      for (int i = 0; i < n + 16; ++i) EXPECT_EQ(h[i], i < n ? 0x4000 : 0xabcd) << isa_name(isa) << " n " << n;
    }
  }
}

TEST(KvRowFp16, NamesParse) {
  EXPECT_EQ(parse_kv_dtype("fp16"), KvDtype::kF16);
  EXPECT_EQ(parse_kv_dtype("fp32"), KvDtype::kF32);
  EXPECT_EQ(parse_kv_dtype("bf16"), std::nullopt);
  EXPECT_STREQ(kv_dtype_name(KvDtype::kF16), "fp16");
  EXPECT_EQ(kv_value_bytes(KvDtype::kF16), 2u);
  EXPECT_EQ(kv_value_bytes(KvDtype::kF32), 4u);
}

}  // namespace
}  // namespace shardline::kernels::cpu
