// Test-side quantisers for ggml's block formats (Q4_0 ... Q8_0, Q2_K ... Q6_K, IQ4_NL, IQ4_XS), to write GGUF files as llama-quantize would lay them out
// (ggml-common.h's block structs, packed as ggml-quants.c's quantize_row_*_ref packs them). They choose their
// scales simply (from each block's range, not llama.cpp's search), which any reader must decode alike, and
// report the value each weight decodes to, computed from the integer codes and scales they chose (in
// ggml's fp32 order), so a test can check the product's decoder (runtime/ggml_blocks.h) against packing
// code that shares nothing with it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/weight_format.h"

namespace shardline::test {

struct QuantizedBlocks {
  std::vector<char> bytes;    // the tensor's blocks, as a GGUF file holds them
  std::vector<float> values;  // what each weight decodes to
};

// ggml type ids of the block formats below.
inline constexpr std::uint32_t kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ5_0 = 6, kGgmlQ5_1 = 7, kGgmlQ8_0 = 8,
                               kGgmlQ2_K = 10, kGgmlQ3_K = 11, kGgmlQ4_K = 12, kGgmlQ5_K = 13, kGgmlQ6_K = 14,
                               kGgmlIQ4_NL = 20, kGgmlIQ4_XS = 23;

// Values per block of a ggml type id (1 for F32, F16, BF16).
inline int ggml_block_values(std::uint32_t type) {
  if (type == 0 || type == 1 || type == 30) return 1;
  return type == kGgmlQ2_K || type == kGgmlQ3_K || type == kGgmlQ4_K || type == kGgmlQ5_K || type == kGgmlQ6_K ||
                 type == kGgmlIQ4_XS
             ? 256
             : 32;
}

// Bytes per block of a ggml block type id.
inline std::size_t ggml_block_bytes(std::uint32_t type) {
  switch (type) {
    case kGgmlQ4_0: return 18;
    case kGgmlQ4_1: return 20;
    case kGgmlQ5_0: return 22;
    case kGgmlQ5_1: return 24;
    case kGgmlQ8_0: return 34;
    case kGgmlQ2_K: return 84;
    case kGgmlQ3_K: return 110;
    case kGgmlQ4_K: return 144;
    case kGgmlQ5_K: return 176;
    case kGgmlQ6_K: return 210;
    case kGgmlIQ4_NL: return 18;
    default: return 136;  // IQ4_XS
  }
}

namespace ggml_quants_detail {

inline std::uint16_t half_of(float x) { return kernels::cpu::float_to_fp16(x); }
inline float float_of(std::uint16_t h) { return kernels::cpu::fp16_to_float(h); }
inline void put_half(std::vector<char>& out, std::size_t at, std::uint16_t h) { std::memcpy(out.data() + at, &h, 2); }
inline int clamp(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }
inline int nearest(float x) { return static_cast<int>(std::lround(x)); }

// The value of largest magnitude, with its sign (ggml's Q4_0/Q5_0 scale is max / -8 or max / -16).
inline float signed_max(const float* x, int n) {
  float max = 0.0f, amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  return max;
}

// Q3_K's and Q6_K's scales: each 16-value sub-block's signed max over the code at that extreme (-4, -32),
// and the super-block's d, the largest |scale| over the largest stored scale (31, 127). Returns d.
inline float signed_sub_block_scales(const float* x, float extreme_code, float largest_scale, float scales[16]) {
  for (int s = 0; s < 16; ++s) scales[s] = signed_max(x + 16 * s, 16) / extreme_code;
  float max_scale = 0.0f;
  for (int s = 0; s < 16; ++s) max_scale = std::max(max_scale, std::fabs(scales[s]));
  return max_scale / largest_scale;
}

// A block of 32's codes as Q4_0 .. Q5_1 lay them out: low nibbles of qs for values 0-15, high ones for
// 16-31; for 5-bit codes the fifth bits in a 32-bit mask at qh (bit j for value j; qh < 0: 4-bit codes).
inline void pack_32_codes(const int* codes, std::vector<char>& out, std::size_t qs, std::ptrdiff_t qh_at) {
  std::uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    out[qs + j] = static_cast<char>((codes[j] & 0x0F) | ((codes[j + 16] & 0x0F) << 4));
    qh |= static_cast<std::uint32_t>((codes[j] & 0x10) >> 4) << j;
    qh |= static_cast<std::uint32_t>((codes[j + 16] & 0x10) >> 4) << (j + 16);
  }
  if (qh_at >= 0) std::memcpy(out.data() + qh_at, &qh, 4);
}

// Q4_0 and Q5_0: d = max / -2^(bits-1), code = x / d + 2^(bits-1); value = (code - 2^(bits-1)) * d.
inline void symmetric_32(const float* x, int bits, std::vector<char>& out, std::size_t at, float* values) {
  const int half = 1 << (bits - 1), top = (1 << bits) - 1;
  const float d = signed_max(x, 32) / static_cast<float>(-half), id = d != 0.0f ? 1.0f / d : 0.0f;
  const std::uint16_t d16 = half_of(d);
  put_half(out, at, d16);
  int codes[32];
  for (int j = 0; j < 32; ++j) codes[j] = clamp(static_cast<int>(x[j] * id + static_cast<float>(half) + 0.5f), 0, top);
  pack_32_codes(codes, out, at + (bits == 5 ? 6 : 2), bits == 5 ? static_cast<std::ptrdiff_t>(at + 2) : -1);
  for (int j = 0; j < 32; ++j) values[j] = static_cast<float>(codes[j] - half) * float_of(d16);
}

// Q4_1 and Q5_1: d = (max - min) / (2^bits - 1), m = min, code = (x - min) / d; value = code * d + m.
inline void affine_32(const float* x, int bits, std::vector<char>& out, std::size_t at, float* values) {
  const int top = (1 << bits) - 1;
  const float min = *std::min_element(x, x + 32), max = *std::max_element(x, x + 32);
  const float d = (max - min) / static_cast<float>(top), id = d != 0.0f ? 1.0f / d : 0.0f;
  const std::uint16_t d16 = half_of(d), m16 = half_of(min);
  put_half(out, at, d16);
  put_half(out, at + 2, m16);
  int codes[32];
  for (int j = 0; j < 32; ++j) codes[j] = clamp(static_cast<int>((x[j] - min) * id + 0.5f), 0, top);
  pack_32_codes(codes, out, at + (bits == 5 ? 8 : 4), bits == 5 ? static_cast<std::ptrdiff_t>(at + 4) : -1);
  for (int j = 0; j < 32; ++j) values[j] = static_cast<float>(codes[j]) * float_of(d16) + float_of(m16);
}

inline void q8_0(const float* x, std::vector<char>& out, std::size_t at, float* values) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  const std::uint16_t d16 = half_of(d);
  put_half(out, at, d16);
  for (int j = 0; j < 32; ++j) {
    const int code = static_cast<int>(std::round(x[j] * id));  // round half away from zero, as roundf
    out[at + 2 + j] = static_cast<char>(static_cast<std::int8_t>(code));
    values[j] = float_of(d16) * static_cast<float>(code);
  }
}

// Q4_K and Q5_K: per sub-block of 32 a scale and a min (value = d * scale * code - dmin * min), both
// quantised to 6 bits against the super-block's d and dmin, packed as quantize_row_q4_K_ref packs them.
inline void k_quant_4_or_5(const float* x, int bits, std::vector<char>& out, std::size_t at, float* values) {
  const int top = (1 << bits) - 1;
  float scales[8], mins[8];
  for (int s = 0; s < 8; ++s) {
    const float* v = x + 32 * s;
    const float lo = std::min(0.0f, *std::min_element(v, v + 32)), hi = *std::max_element(v, v + 32);
    scales[s] = (hi - lo) / static_cast<float>(top);
    mins[s] = -lo;
  }
  const float max_scale = *std::max_element(scales, scales + 8), max_min = *std::max_element(mins, mins + 8);
  const float d = max_scale / 63.0f, dmin = max_min / 63.0f;
  const std::uint16_t d16 = half_of(d), dmin16 = half_of(dmin);
  put_half(out, at, d16);
  put_half(out, at + 2, dmin16);
  std::uint8_t packed[12] = {};
  int ls[8], lm[8];
  for (int s = 0; s < 8; ++s) {
    ls[s] = d != 0.0f ? clamp(nearest(scales[s] / d), 0, 63) : 0;
    lm[s] = dmin != 0.0f ? clamp(nearest(mins[s] / dmin), 0, 63) : 0;
    if (s < 4) {
      packed[s] = static_cast<std::uint8_t>(ls[s]);
      packed[s + 4] = static_cast<std::uint8_t>(lm[s]);
    } else {
      packed[s + 4] = static_cast<std::uint8_t>((ls[s] & 0x0F) | ((lm[s] & 0x0F) << 4));
      packed[s - 4] |= static_cast<std::uint8_t>((ls[s] >> 4) << 6);
      packed[s] |= static_cast<std::uint8_t>((lm[s] >> 4) << 6);
    }
  }
  std::memcpy(out.data() + at + 4, packed, 12);
  int codes[256];
  for (int s = 0; s < 8; ++s) {
    const float step = float_of(d16) * static_cast<float>(ls[s]), offset = float_of(dmin16) * static_cast<float>(lm[s]);
    for (int j = 0; j < 32; ++j) {
      const int i = 32 * s + j;
      codes[i] = step != 0.0f ? clamp(nearest((x[i] + offset) / step), 0, top) : 0;
      values[i] = step * static_cast<float>(codes[i]) - offset;
    }
  }
  // Per 64 values: 32 bytes whose low nibbles are the first sub-block's and high nibbles the second's; Q5_K's
  // fifth bits in qh, bits 2k and 2k + 1 for the k-th 64.
  const std::size_t qh = at + 16, qs = at + (bits == 5 ? 48 : 16);
  std::uint8_t bit_low = 1, bit_high = 2;
  for (int n = 0; n < 256; n += 64) {
    for (int j = 0; j < 32; ++j) {
      const int low = codes[n + j], high = codes[n + 32 + j];
      out[qs + n / 2 + j] = static_cast<char>((low & 0x0F) | ((high & 0x0F) << 4));
      if (bits == 5) {
        std::uint8_t h = static_cast<std::uint8_t>(out[qh + j]);
        if (low > 15) h |= bit_low;
        if (high > 15) h |= bit_high;
        out[qh + j] = static_cast<char>(h);
      }
    }
    bit_low <<= 2;
    bit_high <<= 2;
  }
}

// Q6_K: per sub-block of 16 an int8 scale against the super-block's d (last in the block), codes - 32 in
// -32..31, packed as quantize_row_q6_K_ref packs them.
inline void q6_k(const float* x, std::vector<char>& out, std::size_t at, float* values) {
  float scales[16];
  const float d = signed_sub_block_scales(x, -32.0f, 127.0f, scales);
  const std::uint16_t d16 = half_of(d);
  put_half(out, at + 208, d16);
  int codes[256];  // 0..63
  for (int s = 0; s < 16; ++s) {
    const int ls = d != 0.0f ? clamp(nearest(scales[s] / d), -128, 127) : 0;
    out[at + 192 + s] = static_cast<char>(static_cast<std::int8_t>(ls));
    const float step = float_of(d16) * static_cast<float>(ls);
    for (int j = 0; j < 16; ++j) {
      const int i = 16 * s + j;
      const int q = step != 0.0f ? clamp(nearest(x[i] / step), -32, 31) : 0;
      codes[i] = q + 32;
      values[i] = float_of(d16) * static_cast<float>(ls) * static_cast<float>(q);
    }
  }
  for (int n = 0; n < 256; n += 128) {
    const std::size_t ql = at + n / 2, qh = at + 128 + n / 4;
    for (int l = 0; l < 32; ++l) {
      const int* c = codes + n;
      out[ql + l] = static_cast<char>((c[l] & 0x0F) | ((c[l + 64] & 0x0F) << 4));
      out[ql + l + 32] = static_cast<char>((c[l + 32] & 0x0F) | ((c[l + 96] & 0x0F) << 4));
      out[qh + l] = static_cast<char>((c[l] >> 4) | ((c[l + 32] >> 4) << 2) | ((c[l + 64] >> 4) << 4) |
                                      ((c[l + 96] >> 4) << 6));
    }
  }
}

// Q2_K and Q3_K pack their codes alike: byte l of each 32 holds values l, l + 32, l + 64 and l + 96 of its
// 128, two bits each (quantize_row_q2_K_ref's and q3_K's packing).
inline void pack_2_bit_codes(const int* codes, std::vector<char>& out, std::size_t qs) {
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int* c = codes + n + l;
      out[qs + n / 4 + l] = static_cast<char>((c[0] & 3) | ((c[32] & 3) << 2) | ((c[64] & 3) << 4) | ((c[96] & 3) << 6));
    }
  }
}

// Q2_K: per sub-block of 16 a 4-bit scale and a 4-bit min against the super-block's d and dmin (one byte:
// scale low, min high), codes 0..3; value = d * scale * code - dmin * min.
inline void q2_k(const float* x, std::vector<char>& out, std::size_t at, float* values) {
  float scales[16], mins[16];
  for (int s = 0; s < 16; ++s) {
    const float* v = x + 16 * s;
    const float lo = std::min(0.0f, *std::min_element(v, v + 16)), hi = *std::max_element(v, v + 16);
    scales[s] = (hi - lo) / 3.0f;
    mins[s] = -lo;
  }
  const float d = *std::max_element(scales, scales + 16) / 15.0f, dmin = *std::max_element(mins, mins + 16) / 15.0f;
  const std::uint16_t d16 = half_of(d), dmin16 = half_of(dmin);
  put_half(out, at + 80, d16);
  put_half(out, at + 82, dmin16);
  int codes[256];
  for (int s = 0; s < 16; ++s) {
    const int ls = d != 0.0f ? clamp(nearest(scales[s] / d), 0, 15) : 0;
    const int lm = dmin != 0.0f ? clamp(nearest(mins[s] / dmin), 0, 15) : 0;
    out[at + s] = static_cast<char>(ls | (lm << 4));
    const float step = float_of(d16) * static_cast<float>(ls), offset = float_of(dmin16) * static_cast<float>(lm);
    for (int j = 0; j < 16; ++j) {
      const int i = 16 * s + j;
      codes[i] = step != 0.0f ? clamp(nearest((x[i] + offset) / step), 0, 3) : 0;
      values[i] = step * static_cast<float>(codes[i]) - offset;
    }
  }
  pack_2_bit_codes(codes, out, at + 16);
}

// Q3_K: per sub-block of 16 a signed 6-bit scale (stored + 32) against d (last in the block), codes -4..3
// stored as 0..7: the low two bits as Q2_K's, the third in hmask (byte i % 32, bit i / 32); the scales'
// low nibbles in bytes 0-7 (scales 8-15 in the high nibbles), their top two bits in bytes 8-11
// (quantize_row_q3_K_ref's packing).
inline void q3_k(const float* x, std::vector<char>& out, std::size_t at, float* values) {
  float scales[16];
  const float d = signed_sub_block_scales(x, -4.0f, 31.0f, scales);
  const std::uint16_t d16 = half_of(d);
  put_half(out, at + 108, d16);
  int codes[256];
  for (int s = 0; s < 16; ++s) {
    const int ls = d != 0.0f ? clamp(nearest(scales[s] / d), -32, 31) : 0;
    const int stored = ls + 32;
    std::uint8_t* packed = reinterpret_cast<std::uint8_t*>(out.data() + at + 96);
    if (s < 8) {
      packed[s] |= static_cast<std::uint8_t>(stored & 0x0F);
    } else {
      packed[s - 8] |= static_cast<std::uint8_t>((stored & 0x0F) << 4);
    }
    packed[8 + s % 4] |= static_cast<std::uint8_t>((stored >> 4) << (2 * (s / 4)));
    const float step = float_of(d16) * static_cast<float>(ls);
    for (int j = 0; j < 16; ++j) {
      const int i = 16 * s + j;
      const int q = step != 0.0f ? clamp(nearest(x[i] / step), -4, 3) : 0;
      codes[i] = q + 4;
      values[i] = step * static_cast<float>(q);
    }
  }
  for (int i = 0; i < 256; ++i) {
    if (codes[i] > 3) out[at + i % 32] = static_cast<char>(static_cast<std::uint8_t>(out[at + i % 32]) | (1 << (i / 32)));
  }
  pack_2_bit_codes(codes, out, at + 32);
}

// IQ4_NL's and IQ4_XS's table (ggml-common.h's kvalues_iq4nl) and the index of its entry nearest to v.
inline constexpr float kIq4Table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
inline int nearest_iq4(float v) {
  int best = 0;
  for (int k = 1; k < 16; ++k) {
    if (std::fabs(kIq4Table[k] - v) < std::fabs(kIq4Table[best] - v)) best = k;
  }
  return best;
}

// 32 values as table indices against the step dl (Q4_0's nibble layout), at qs.
inline void iq4_32(const float* x, float dl, std::vector<char>& out, std::size_t qs, float* values) {
  int index[32];
  for (int j = 0; j < 32; ++j) {
    index[j] = dl != 0.0f ? nearest_iq4(x[j] / dl) : 8;
    values[j] = dl * kIq4Table[index[j]];
  }
  pack_32_codes(index, out, qs, -1);
}

inline void iq4_nl(const float* x, std::vector<char>& out, std::size_t at, float* values) {
  const std::uint16_t d16 = half_of(signed_max(x, 32) / -127.0f);
  put_half(out, at, d16);
  iq4_32(x, float_of(d16), out, at + 2, values);
}

// IQ4_XS: per sub-block of 32 a 6-bit scale (+32) against d: low nibble in scales_l[ib / 2] (ib odd: the high
// one), top two bits in the 16-bit scales_h at bit 2 * ib.
inline void iq4_xs(const float* x, std::vector<char>& out, std::size_t at, float* values) {
  float scales[8];
  for (int ib = 0; ib < 8; ++ib) scales[ib] = signed_max(x + 32 * ib, 32) / -127.0f;
  float max_scale = 0.0f;
  for (float v : scales) max_scale = std::max(max_scale, std::fabs(v));
  const std::uint16_t d16 = half_of(max_scale / 31.0f);
  const float d = float_of(d16);
  put_half(out, at, d16);
  std::uint16_t scales_h = 0;
  for (int ib = 0; ib < 8; ++ib) {
    const int stored = (d != 0.0f ? clamp(nearest(scales[ib] / d), -32, 31) : 0) + 32;
    out[at + 4 + ib / 2] = static_cast<char>(static_cast<std::uint8_t>(out[at + 4 + ib / 2]) | ((stored & 0x0F) << (4 * (ib % 2))));
    scales_h = static_cast<std::uint16_t>(scales_h | ((stored >> 4) << (2 * ib)));
    iq4_32(x + 32 * ib, d * static_cast<float>(stored - 32), out, at + 8 + 16 * ib, values + 32 * ib);
  }
  std::memcpy(out.data() + at + 2, &scales_h, 2);
}

}  // namespace ggml_quants_detail

// n floats (whole blocks) quantised as ggml type `type` (one of the kGgml* ids above).
inline QuantizedBlocks quantize_blocks(std::uint32_t type, const float* x, std::size_t n) {
  namespace q = ggml_quants_detail;
  const int per_block = ggml_block_values(type);
  const std::size_t block_bytes = ggml_block_bytes(type);
  QuantizedBlocks r{std::vector<char>(n / per_block * block_bytes), std::vector<float>(n)};
  for (std::size_t b = 0; b < n / per_block; ++b) {
    const float* v = x + b * per_block;
    float* values = r.values.data() + b * per_block;
    const std::size_t at = b * block_bytes;
    switch (type) {
      case kGgmlQ4_0: q::symmetric_32(v, 4, r.bytes, at, values); break;
      case kGgmlQ5_0: q::symmetric_32(v, 5, r.bytes, at, values); break;
      case kGgmlQ4_1: q::affine_32(v, 4, r.bytes, at, values); break;
      case kGgmlQ5_1: q::affine_32(v, 5, r.bytes, at, values); break;
      case kGgmlQ8_0: q::q8_0(v, r.bytes, at, values); break;
      case kGgmlQ4_K: q::k_quant_4_or_5(v, 4, r.bytes, at, values); break;
      case kGgmlQ5_K: q::k_quant_4_or_5(v, 5, r.bytes, at, values); break;
      case kGgmlQ6_K: q::q6_k(v, r.bytes, at, values); break;
      case kGgmlQ2_K: q::q2_k(v, r.bytes, at, values); break;
      case kGgmlQ3_K: q::q3_k(v, r.bytes, at, values); break;
      case kGgmlIQ4_NL: q::iq4_nl(v, r.bytes, at, values); break;
      default: q::iq4_xs(v, r.bytes, at, values); break;
    }
  }
  return r;
}

}  // namespace shardline::test
