// The fp16 and int8 KV caches' conversions (ops.h store_kv_row / load_kv_row). fp16: IEEE binary16 with
// round to nearest even, the same bits from the portable code and from F16C on AVX-512, and reading back
// exact; GCC's own _Float16 conversion (a correctly rounded software routine at the baseline target) is the
// reference. int8: per head, codes and a scale as an independent double-checked formula gives them, the
// same bytes on every ISA, and every value back within half a scale.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
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
  store_kv_row(h.data(), x.data(), static_cast<int>(x.size()), 1, KvDtype::kF16);
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
    load_kv_row(portable.data(), h.data(), static_cast<int>(h.size()), 1, KvDtype::kF16);
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
    load_kv_row(got.data(), h.data(), static_cast<int>(h.size()), 1, KvDtype::kF16);
    EXPECT_EQ(std::memcmp(got.data(), portable.data(), got.size() * sizeof(float)), 0) << isa_name(isa);
  }
}

// Odd lengths (the AVX-512 kernels' masked tails, the AVX2 ones' scalar tails) write and read exactly n
// values and nothing past them.
TEST(KvRowFp16, WritesExactlyNValues) {
  for (Isa isa : test::runnable_isas()) {
    test::ScopedIsa scoped(isa);
    for (int n : {1, 7, 9, 15, 16, 17, 40}) {
      std::vector<float> x(n, 2.0f);
      std::vector<std::uint16_t> h(n + 16, 0xabcd);
      store_kv_row(h.data(), x.data(), n, 1, KvDtype::kF16);
      for (int i = 0; i < n + 16; ++i) EXPECT_EQ(h[i], i < n ? 0x4000 : 0xabcd) << isa_name(isa) << " n " << n;
      std::vector<float> back(n + 16, -1.0f);
      load_kv_row(back.data(), h.data(), n, 1, KvDtype::kF16);
      for (int i = 0; i < n + 16; ++i) EXPECT_EQ(back[i], i < n ? 2.0f : -1.0f) << isa_name(isa) << " n " << n;
    }
  }
}

TEST(KvRow, NamesParseAndRowBytes) {
  EXPECT_EQ(parse_kv_dtype("fp16"), KvDtype::kF16);
  EXPECT_EQ(parse_kv_dtype("fp32"), KvDtype::kF32);
  EXPECT_EQ(parse_kv_dtype("int8"), KvDtype::kInt8);
  EXPECT_EQ(parse_kv_dtype("bf16"), std::nullopt);
  EXPECT_STREQ(kv_dtype_name(KvDtype::kF16), "fp16");
  EXPECT_STREQ(kv_dtype_name(KvDtype::kInt8), "int8");
  EXPECT_EQ(kv_row_bytes(KvDtype::kF32, 128, 64), 512u);
  EXPECT_EQ(kv_row_bytes(KvDtype::kF16, 128, 64), 256u);
  EXPECT_EQ(kv_row_bytes(KvDtype::kInt8, 128, 64), 136u);  // 128 codes, 2 scales
  EXPECT_EQ(kv_row_bytes(KvDtype::kInt8, 144, 48), 156u);
  EXPECT_DOUBLE_EQ(kv_bytes_per_value(KvDtype::kInt8, 64), 68.0 / 64);
  EXPECT_DOUBLE_EQ(kv_bytes_per_value(KvDtype::kF16, 64), 2.0);
}

// The int8 row of n values (heads of head_size): codes, then the scales' bytes.
std::vector<std::uint8_t> store_int8(const std::vector<float>& x, int head_size) {
  const int n = static_cast<int>(x.size());
  std::vector<std::uint8_t> row(kv_row_bytes(KvDtype::kInt8, n, head_size) + 16, 0xab);  // 16 guard bytes
  store_kv_row(row.data(), x.data(), n, head_size, KvDtype::kInt8);
  return row;
}

// Per head: scale = max|x| / 127 (in float), code = x * (127 / max|x|) rounded to nearest even. Checked
// here with the division and the rounding in double, which gives the float expression's result wherever the
// product is not within float rounding of a .5 tie; the random values below never are.
TEST(KvRowInt8, CodesAndScalesPerHeadOnEveryIsa) {
  std::mt19937 rng(21);
  for (int head_size : {40, 48, 64, 128}) {
    const int n_heads = 3, n = n_heads * head_size;
    std::vector<float> x = test::random_floats(rng, static_cast<std::size_t>(n), -3.0f, 3.0f);
    for (int i = head_size; i < 2 * head_size; ++i) x[i] *= 1e-3f;  // heads of very different magnitudes
    x[2 * head_size + 5] = 0.0f;
    std::vector<std::uint8_t> portable;
    {
      test::ScopedIsa scoped(Isa::kPortable);
      portable = store_int8(x, head_size);
    }
    for (int h = 0; h < n_heads; ++h) {
      float amax = 0;
      for (int i = 0; i < head_size; ++i) amax = std::max(amax, std::abs(x[h * head_size + i]));
      float scale;
      std::memcpy(&scale, portable.data() + n + 4 * h, sizeof scale);
      EXPECT_EQ(scale, amax / 127.0f) << "head_size " << head_size << " head " << h;
      for (int i = 0; i < head_size; ++i) {
        const int j = h * head_size + i;
        const double want = std::nearbyint(static_cast<double>(x[j]) * static_cast<double>(127.0f / amax));
        ASSERT_EQ(static_cast<std::int8_t>(portable[j]), static_cast<std::int8_t>(want)) << "head_size " << head_size << " " << j;
      }
    }
    for (std::size_t i = kv_row_bytes(KvDtype::kInt8, n, head_size); i < portable.size(); ++i) {
      EXPECT_EQ(portable[i], 0xab) << "wrote past the row";
    }
    for (Isa isa : test::runnable_isas()) {
      test::ScopedIsa scoped(isa);
      EXPECT_TRUE(store_int8(x, head_size) == portable) << isa_name(isa) << ", head_size " << head_size;
      std::vector<float> back(n), back_portable(n);
      load_kv_row(back.data(), portable.data(), n, head_size, KvDtype::kInt8);
      {
        test::ScopedIsa portable_isa(Isa::kPortable);
        load_kv_row(back_portable.data(), portable.data(), n, head_size, KvDtype::kInt8);
      }
      EXPECT_EQ(std::memcmp(back.data(), back_portable.data(), back.size() * sizeof(float)), 0) << isa_name(isa);
    }
  }
}

// A non-finite value gives the same bytes on every ISA too (the head's maximum is folded in one order
// everywhere): a NaN at each lane position of a head, and an infinity.
TEST(KvRowInt8, NonFiniteValuesGiveTheSameBytesOnEveryIsa) {
  const int head_size = 64, n = 2 * head_size;
  for (int at : {0, 7, 8, 15, 31, 63, 64 + 9}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = test::random_floats(static_cast<std::size_t>(n), 23u + static_cast<std::uint32_t>(at));
      x[at] = bad;
      std::vector<std::uint8_t> portable;
      {
        test::ScopedIsa scoped(Isa::kPortable);
        portable = store_int8(x, head_size);
      }
      for (Isa isa : test::runnable_isas()) {
        test::ScopedIsa scoped(isa);
        EXPECT_TRUE(store_int8(x, head_size) == portable) << isa_name(isa) << ", " << bad << " at " << at;
      }
      // The head holding it reads back as NaN (its scale is NaN, as an fp32 cache would carry it on), the
      // other head as numbers.
      std::vector<float> back(static_cast<std::size_t>(n));
      load_kv_row(back.data(), portable.data(), n, head_size, KvDtype::kInt8);
      for (int i = 0; i < n; ++i) EXPECT_EQ(std::isnan(back[i]), i / head_size == at / head_size) << bad << " at " << at;
    }
  }
}

// Every value reads back within half its head's scale (plus the rounding of code * scale); a head of zeros
// stays zeros with scale 0; a value of max|x| comes back as exactly +-127 codes.
TEST(KvRowInt8, ReadsBackWithinHalfAScale) {
  std::mt19937 rng(22);
  const int head_size = 64, n = 4 * head_size;
  std::vector<float> x = test::random_floats(rng, static_cast<std::size_t>(n), -50.0f, 50.0f);
  for (int i = 2 * head_size; i < 3 * head_size; ++i) x[i] = 0.0f;
  x[5] = -60.0f;
  const std::vector<std::uint8_t> row = store_int8(x, head_size);
  EXPECT_EQ(static_cast<std::int8_t>(row[5]), -127);
  std::vector<float> back(n);
  load_kv_row(back.data(), row.data(), n, head_size, KvDtype::kInt8);
  for (int h = 0; h < n / head_size; ++h) {
    float amax = 0;
    for (int i = 0; i < head_size; ++i) amax = std::max(amax, std::abs(x[h * head_size + i]));
    for (int i = 0; i < head_size; ++i) {
      const int j = h * head_size + i;
      ASSERT_LE(std::abs(back[j] - x[j]), amax / 254.0f * 1.0001f) << j;
      if (amax == 0.0f) {
        ASSERT_EQ(back[j], 0.0f);
      }
    }
  }
}

}  // namespace
}  // namespace shardline::kernels::cpu
