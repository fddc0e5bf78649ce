#include "runtime/ggml_blocks.h"

#include <cstring>

#include "common/error.h"
#include "kernels/cpu/weight_format.h"

namespace shardline::runtime {

namespace {

float half_at(const std::uint8_t* at) {
  std::uint16_t bits;
  std::memcpy(&bits, at, sizeof bits);
  return kernels::cpu::fp16_to_float(bits);
}

// Blocks of 32: the first 16 values are the low nibbles of qs, the last 16 the high ones; Q5's fifth bits
// are a 32-bit mask (bit j for value j).
void q8_0(const std::uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(static_cast<std::int8_t>(b[2 + j]));
}

void q4_0(const std::uint8_t* b, float* y) {
  const float d = half_at(b);
  const std::uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void q4_1(const std::uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const std::uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// The 5-bit codes of a Q5 block: low nibbles of qs with bit j of qh, high nibbles with bit j + 16.
template <typename Emit>
void q5_codes(const std::uint8_t* qh_bytes, const std::uint8_t* qs, Emit&& emit) {
  std::uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof qh);
  for (int j = 0; j < 16; ++j) {
    const int high_0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int high_1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    emit(j, (qs[j] & 0x0F) | high_0, (qs[j] >> 4) | high_1);
  }
}

void q5_0(const std::uint8_t* b, float* y) {
  const float d = half_at(b);
  q5_codes(b + 2, b + 6, [&](int j, int low, int high) {
    y[j] = static_cast<float>(low - 16) * d;
    y[j + 16] = static_cast<float>(high - 16) * d;
  });
}

void q5_1(const std::uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  q5_codes(b + 4, b + 8, [&](int j, int low, int high) {
    y[j] = static_cast<float>(low) * d + m;
    y[j + 16] = static_cast<float>(high) * d + m;
  });
}

// Q4_K and Q5_K: eight sub-blocks of 32, each with a 6-bit scale and a 6-bit min packed into 12 bytes
// (ggml's get_scale_min_k4): sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins),
// sub-blocks 4-7 in the nibbles of bytes 8-11 with their top two bits in the top bits of bytes 0-7.
void scale_and_min(int j, const std::uint8_t* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// A Q4_K or Q5_K super-block: value = d * scale * code - dmin * min, per 64 values two sub-blocks that share
// 32 bytes of qs (low nibbles, then high ones); Q5_K's fifth bits come from qh, two bits further on each 64.
template <bool kFifthBit>
void k_quant_4_or_5(const std::uint8_t* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const std::uint8_t* scales = b + 4;
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* q = kFifthBit ? b + 48 : b + 16;
  std::uint8_t bit_low = 1, bit_high = 2;
  for (int j = 0, sub = 0; j < 256; j += 64, sub += 2, q += 32) {
    int scale, min;
    scale_and_min(sub, scales, scale, min);
    const float d1 = d * static_cast<float>(scale), m1 = dmin * static_cast<float>(min);
    scale_and_min(sub + 1, scales, scale, min);
    const float d2 = d * static_cast<float>(scale), m2 = dmin * static_cast<float>(min);
    for (int l = 0; l < 32; ++l) {
      const int fifth = kFifthBit && (qh[l] & bit_low) ? 16 : 0;
      *y++ = d1 * static_cast<float>((q[l] & 0x0F) + fifth) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      const int fifth = kFifthBit && (qh[l] & bit_high) ? 16 : 0;
      *y++ = d2 * static_cast<float>((q[l] >> 4) + fifth) - m2;
    }
    bit_low <<= 2;
    bit_high <<= 2;
  }
}

// Q6_K: 16 sub-blocks of 16 with an int8 scale each and d last in the block; per 128 values, 64 bytes of
// low nibbles (ql) and 32 of two-bit high parts (qh), codes centred on 32.
void q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

// Q2_K: 16 sub-blocks of 16, each a 4-bit scale and a 4-bit min in one byte (scales first in the block,
// d and dmin last); 2-bit codes, four to a byte: byte l of each 32 holds values l, l + 32, l + 64, l + 96 of
// its 128 (as for Q3_K).
void q2_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* scales = b;
  const std::uint8_t* q = b + 16;
  const float d = half_at(b + 80), dmin = half_at(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half) {
        const int sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K: 3-bit codes as Q2_K's 2 bits plus a high bit in hmask (bit k of byte l for value 32k + l; a set bit
// means the code is not lowered by 4), and 16 signed 6-bit scales (+32) packed into 12 bytes: the low
// nibbles of scales 0-7 and then the high nibbles of bytes 0-7 for scales 8-15, their top two bits in bytes
// 8-11 (scale j's in byte 8 + j % 4, bits 2 * (j / 4)). d comes last.
void q3_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* hm = b;
  const std::uint8_t* q = b + 32;
  const std::uint8_t* packed = b + 96;
  const float d_all = half_at(b + 108);
  int scales[16];
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? packed[j] & 0x0F : packed[j - 8] >> 4;
    scales[j] = (low | (((packed[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
  }
  int is = 0;
  std::uint8_t m = 1;
  for (int n = 0; n < 256; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * static_cast<float>(scales[is++]);
        for (int l = 16 * half; l < 16 * half + 16; ++l) {
          *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
        }
      }
    }
  }
}

// IQ4_NL and IQ4_XS: 4-bit indices into a fixed non-linear table (ggml-common.h's kvalues_iq4nl), nibbles
// laid out as Q4_0's. IQ4_NL: blocks of 32 with an fp16 d. IQ4_XS: super-blocks of 256 with an fp16 d and,
// per sub-block of 32, a 6-bit scale (+32): low nibble in scales_l, top two bits in scales_h.
constexpr float kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

void iq4_32(const std::uint8_t* qs, float dl, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = dl * kIq4Values[qs[j] & 0x0F];
    y[j + 16] = dl * kIq4Values[qs[j] >> 4];
  }
}

void iq4_nl(const std::uint8_t* b, float* y) { iq4_32(b + 2, half_at(b), y); }

void iq4_xs(const std::uint8_t* b, float* y) {
  const float d = half_at(b);
  std::uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, sizeof scales_h);
  const std::uint8_t* scales_l = b + 4;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) | (((scales_h >> (2 * ib)) & 3) << 4);
    iq4_32(b + 8 + 16 * ib, d * static_cast<float>(ls - 32), y + 32 * ib);
  }
}

using BlockDecoder = void (*)(const std::uint8_t*, float*);

BlockDecoder decoder_of(TensorElement element) {
  switch (element) {
    case TensorElement::kQ8_0: return q8_0;
    case TensorElement::kQ4_0: return q4_0;
    case TensorElement::kQ4_1: return q4_1;
    case TensorElement::kQ5_0: return q5_0;
    case TensorElement::kQ5_1: return q5_1;
    case TensorElement::kQ4_K: return k_quant_4_or_5<false>;
    case TensorElement::kQ5_K: return k_quant_4_or_5<true>;
    case TensorElement::kQ6_K: return q6_k;
    case TensorElement::kQ2_K: return q2_k;
    case TensorElement::kQ3_K: return q3_k;
    case TensorElement::kIQ4_NL: return iq4_nl;
    case TensorElement::kIQ4_XS: return iq4_xs;
    default: return nullptr;
  }
}

}  // namespace

void widen_blocks(const std::byte* src, TensorElement element, std::uint64_t n, float* dst) {
  const BlockDecoder decode = decoder_of(element);
  const ElementBlock block = element_block(element);
  SL_CHECK_MSG(decode != nullptr && n % block.elements == 0, "{} values of element type {} are no whole blocks", n,
               element_name(element));
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(src);
  for (std::uint64_t i = 0; i < n / block.elements; ++i) decode(bytes + i * block.bytes, dst + i * block.elements);
}

}  // namespace shardline::runtime
