// ggml's block formats as a rank reads them (runtime/ggml_blocks.h): every format against blocks packed by the
// test's own quantisers (tests/support/ggml_quants.h, which share no code with the decoder), and a few blocks
// written byte by byte from ggml-common.h's structs, whose values follow by hand.
#include "runtime/ggml_blocks.h"

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/weight_format.h"
#include "tests/support/ggml_quants.h"

namespace shardline::test {
namespace {

using runtime::TensorElement;

std::vector<float> decoded(const std::vector<char>& bytes, TensorElement element, std::size_t n) {
  std::vector<float> out(n);
  runtime::widen_blocks(reinterpret_cast<const std::byte*>(bytes.data()), element, n, out.data());
  return out;
}

TEST(GgmlBlocks, EveryFormatDecodesTheCodesAndScalesItsBlocksHold) {
  const std::vector<std::pair<std::uint32_t, TensorElement>> formats = {
      {kGgmlQ8_0, TensorElement::kQ8_0}, {kGgmlQ4_0, TensorElement::kQ4_0}, {kGgmlQ4_1, TensorElement::kQ4_1},
      {kGgmlQ5_0, TensorElement::kQ5_0}, {kGgmlQ5_1, TensorElement::kQ5_1}, {kGgmlQ4_K, TensorElement::kQ4_K},
      {kGgmlQ5_K, TensorElement::kQ5_K}, {kGgmlQ6_K, TensorElement::kQ6_K}, {kGgmlQ2_K, TensorElement::kQ2_K},
      {kGgmlQ3_K, TensorElement::kQ3_K}, {kGgmlIQ4_NL, TensorElement::kIQ4_NL}, {kGgmlIQ4_XS, TensorElement::kIQ4_XS}};
  // Four super-blocks: values of every sign and size (a scale per sub-block that differs), one run of zeros
  // (scales of 0) and one of equal values.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(1024);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (1.0f + static_cast<float>(i % 96) / 8.0f);
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);
  std::fill(x.begin() + 512, x.begin() + 544, 0.25f);
  for (const auto& [type, element] : formats) {
    const QuantizedBlocks q = quantize_blocks(type, x.data(), x.size());
    ASSERT_EQ(q.bytes.size(), runtime::tensor_bytes(element, x.size())) << type;
    const std::vector<float> y = decoded(q.bytes, element, x.size());
    for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], q.values[i]) << "type " << type << " value " << i;
    // The values are the weights, quantised: close to them (a loose bound that a misplaced code breaks).
    double error = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      error += (y[i] - x[i]) * (y[i] - x[i]);
      norm += x[i] * x[i];
    }
    EXPECT_LT(error / norm, type == kGgmlQ2_K || type == kGgmlQ3_K ? 0.2 : 0.03) << "type " << type;
  }
}

// Blocks laid out from ggml-common.h's structs, byte by byte.
void put_half(std::vector<char>& b, std::size_t at, float value) {
  const std::uint16_t h = kernels::cpu::float_to_fp16(value);
  std::memcpy(b.data() + at, &h, 2);
}

TEST(GgmlBlocks, HandWrittenBlocksGiveTheValuesTheirStructsDefine) {
  // block_q4_0 {half d; uint8 qs[16]}: value j = (low nibble of qs[j] - 8) * d, value j + 16 the high one's.
  std::vector<char> q4_0(18, 0);
  put_half(q4_0, 0, 0.5f);
  q4_0[2] = static_cast<char>(0x9F);
  std::vector<float> y = decoded(q4_0, TensorElement::kQ4_0, 32);
  EXPECT_EQ(y[0], 3.5f);    // (15 - 8) * 0.5
  EXPECT_EQ(y[16], 0.5f);   // (9 - 8) * 0.5
  EXPECT_EQ(y[1], -4.0f);   // (0 - 8) * 0.5
  // block_q5_1 {half d, m; uint8 qh[4]; uint8 qs[16]}: the fifth bit of value j is bit j of qh.
  std::vector<char> q5_1(24, 0);
  put_half(q5_1, 0, 2.0f);
  put_half(q5_1, 2, -1.0f);
  q5_1[4 + 2] = 0x01;  // bit 16: value 16's fifth bit
  q5_1[8] = 0x31;      // value 0: code 1; value 16: code 3 + 16
  y = decoded(q5_1, TensorElement::kQ5_1, 32);
  EXPECT_EQ(y[0], 1.0f);    // 1 * 2 - 1
  EXPECT_EQ(y[16], 37.0f);  // 19 * 2 - 1
  // block_q4_K {half d, dmin; uint8 scales[12]; uint8 qs[128]}: sub-block 5's 6-bit scale is the low nibble of
  // scales[9] with the top bits of scales[1]; its min the high nibble of scales[9] with the top bits of
  // scales[5]. Its values are the high nibbles of qs[64..95].
  std::vector<char> q4_k(144, 0);
  put_half(q4_k, 0, 1.0f);
  put_half(q4_k, 2, 0.5f);
  q4_k[4 + 1] = static_cast<char>(0xC0);  // scale 53 = 0b11'0101
  q4_k[4 + 5] = static_cast<char>(0x80);  // min 34 = 0b10'0010
  q4_k[4 + 9] = 0x25;
  q4_k[16 + 64] = 0x70;
  y = decoded(q4_k, TensorElement::kQ4_K, 256);
  EXPECT_EQ(y[5 * 32], 354.0f);  // 1 * 53 * 7 - 0.5 * 34
  EXPECT_EQ(y[4 * 32], 0.0f);    // sub-block 4 (the low nibbles): scale 0, min 0
  // block_q6_K {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d}: d comes last. Value 0's code is ql[0]'s
  // low nibble with qh[0]'s bits 0-1 above it, value 64's ql[0]'s high nibble with qh[0]'s bits 4-5; codes
  // are centred on 32; value i's scale is scales[i / 16].
  std::vector<char> q6_k(210, 0);
  q6_k[0] = 0x21;
  q6_k[128] = 0x03;
  q6_k[192 + 0] = 2;
  q6_k[192 + 4] = -1;
  put_half(q6_k, 208, 0.5f);
  y = decoded(q6_k, TensorElement::kQ6_K, 256);
  EXPECT_EQ(y[0], 17.0f);   // 0.5 * 2 * ((1 | 3 << 4) - 32)
  EXPECT_EQ(y[64], 15.0f);  // 0.5 * -1 * (2 - 32)
}

}  // namespace
}  // namespace shardline::test
