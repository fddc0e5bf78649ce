#include "kernels/cpu/weight_format.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "kernels/cpu/ops.h"

namespace shardline::kernels::cpu {

namespace {

std::uint32_t float_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

float bits_float(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

std::size_t round_up(std::size_t value, std::size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// W(f, j), or 0 in the padding (f >= d or j >= k).
struct Source {
  const float* w;
  std::size_t row_stride;
  int d, k;
  float at(int f, int j) const { return f < d && j < k ? w[static_cast<std::size_t>(f) * row_stride + j] : 0.0f; }
};

void pack_panel_f32(const Source& s, int panel, float* dst) {
  for (int j = 0; j < s.k; ++j) {
    for (int l = 0; l < kPanelWidth; ++l) dst[static_cast<std::size_t>(j) * kPanelWidth + l] = s.at(panel * kPanelWidth + l, j);
  }
}

void pack_panel_bf16(const Source& s, int panel, std::uint16_t* dst) {
  const int kp = padded_k(WeightDtype::kBf16, s.k);
  for (int j = 0; j < kp; ++j) {
    for (int l = 0; l < kPanelWidth; ++l) {
      dst[static_cast<std::size_t>(j / 2) * 2 * kPanelWidth + l * 2 + j % 2] = float_to_bf16(s.at(panel * kPanelWidth + l, j));
    }
  }
}

// Per feature and group of `group` k values: scale = max|w| / 127 (stored as fp16) and q = round(w / scale).
// A group holding a NaN or an Inf (a damaged file) gets a NaN scale and codes of 0, so its products are NaN
// as fp32's would be and the run's warning about non-finite hidden states fires; std::max would have
// skipped a NaN (a finite scale, the weight silently turned into a code), and an Inf made the scale Inf,
// its inverse 0 and the code NaN, whose conversion to int is undefined.
void pack_panel_int8(const Source& s, int panel, int group, std::byte* dst) {
  const int kp = padded_k(WeightDtype::kInt8, s.k);
  auto* quads = reinterpret_cast<std::uint8_t*>(dst);
  auto* scales = reinterpret_cast<std::uint16_t*>(dst + static_cast<std::size_t>(kp) * kPanelWidth);
  for (int g = 0; g < kp / group; ++g) {
    const int j0 = g * group, j1 = j0 + group;
    for (int l = 0; l < kPanelWidth; ++l) {
      const int f = panel * kPanelWidth + l;
      float amax = 0.0f;
      bool finite = true;
      for (int j = j0; j < j1; ++j) {
        const float magnitude = std::fabs(s.at(f, j));
        finite &= magnitude <= std::numeric_limits<float>::max();  // false for NaN and Inf
        amax = std::max(amax, magnitude);
      }
      if (!finite) {
        scales[g * kPanelWidth + l] = float_to_fp16(std::numeric_limits<float>::quiet_NaN());
        for (int j = j0; j < j1; ++j) quads[static_cast<std::size_t>(j / 4) * 4 * kPanelWidth + l * 4 + j % 4] = 128;
        continue;
      }
      const std::uint16_t scale_bits = float_to_fp16(amax / 127.0f);
      const float scale = fp16_to_float(scale_bits);
      const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
      scales[g * kPanelWidth + l] = scale_bits;
      for (int j = j0; j < j1; ++j) {
        const float q = std::clamp(std::nearbyint(s.at(f, j) * inverse), -127.0f, 127.0f);
        quads[static_cast<std::size_t>(j / 4) * 4 * kPanelWidth + l * 4 + j % 4] = static_cast<std::uint8_t>(static_cast<int>(q) + 128);
      }
    }
  }
}

}  // namespace

const char* weight_dtype_name(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kF32: return "fp32";
    case WeightDtype::kBf16: return "bf16";
    case WeightDtype::kInt8: return "int8";
  }
  return "?";
}

std::optional<WeightDtype> parse_weight_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32") return WeightDtype::kF32;
  if (name == "bf16") return WeightDtype::kBf16;
  if (name == "int8") return WeightDtype::kInt8;
  return std::nullopt;
}

int padded_k(WeightDtype dtype, int k) {
  switch (dtype) {
    case WeightDtype::kF32: return k;
    case WeightDtype::kBf16: return static_cast<int>(round_up(k, kBf16Block));
    case WeightDtype::kInt8: return static_cast<int>(round_up(k, kInt8Block));
  }
  return k;
}

int panel_count(int d) { return (d + kPanelWidth - 1) / kPanelWidth; }

double typical_bytes_per_weight(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kF32: return 4.0;
    case WeightDtype::kBf16: return 2.0;
    case WeightDtype::kInt8: return 1.03;
  }
  return 4.0;
}

int default_int8_group(int k) {
  for (int group = kInt8WideGroup; group > kInt8Block; group -= kInt8Block) {
    if (k % group == 0) return group;
  }
  return kInt8Block;
}

int int8_groups(int k, int group) {
  if (group == 0) group = default_int8_group(k);
  SL_CHECK_MSG(group >= kInt8Block && group <= kInt8WideGroup && group % kInt8Block == 0,
               "int8 group of {} k values (32, 64, 96 or 128)", group);
  const int kp = padded_k(WeightDtype::kInt8, k);
  SL_CHECK_MSG(kp % group == 0, "int8 groups of {} do not divide k = {} (padded to {})", group, k, kp);
  return kp / group;
}

std::size_t panel_bytes(WeightDtype dtype, int k, int int8_group) {
  const std::size_t kp = padded_k(dtype, k);
  switch (dtype) {
    case WeightDtype::kF32: return kp * kPanelWidth * sizeof(float);
    case WeightDtype::kBf16: return kp * kPanelWidth * sizeof(std::uint16_t);
    // Quads, then one fp16 scale per feature and group.
    case WeightDtype::kInt8:
      return round_up(kp * kPanelWidth + static_cast<std::size_t>(int8_groups(k, int8_group)) * kPanelWidth * 2,
                      kPackedAlignment);
  }
  return 0;
}

std::size_t packed_size_bytes(WeightDtype dtype, int d, int k, int int8_group) {
  return static_cast<std::size_t>(panel_count(d)) * panel_bytes(dtype, k, int8_group);
}

void pack_weights(WeightDtype dtype, const float* w, std::size_t w_row_stride, int d, int k, std::byte* dst,
                  int int8_group) {
  SL_CHECK(d >= 1 && k >= 1 && w_row_stride >= static_cast<std::size_t>(k));
  SL_CHECK(reinterpret_cast<std::uintptr_t>(dst) % kPackedAlignment == 0);
  const Source source{w, w_row_stride, d, k};
  const int panels = panel_count(d);
  const std::size_t stride = panel_bytes(dtype, k, int8_group);
  const int group = int8_group > 0 ? int8_group : default_int8_group(k);
  const int n_threads = num_threads();
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1 && panels > 1)
  for (int p = 0; p < panels; ++p) {
    std::byte* panel = dst + p * stride;
    std::memset(panel, 0, stride);
    switch (dtype) {
      case WeightDtype::kF32: pack_panel_f32(source, p, reinterpret_cast<float*>(panel)); break;
      case WeightDtype::kBf16: pack_panel_bf16(source, p, reinterpret_cast<std::uint16_t*>(panel)); break;
      case WeightDtype::kInt8: pack_panel_int8(source, p, group, panel); break;
    }
  }
}

void unpack_weights(const PackedMatrix& w, float* out) {
  const std::size_t stride = panel_bytes(w.dtype, w.k, w.int8_group);
  const int kp = padded_k(w.dtype, w.k);
  for (int f = 0; f < w.d; ++f) {
    const std::byte* panel = w.data + (f / kPanelWidth) * stride;
    const int l = f % kPanelWidth;
    for (int j = 0; j < w.k; ++j) {
      float value = 0.0f;
      switch (w.dtype) {
        case WeightDtype::kF32:
          value = reinterpret_cast<const float*>(panel)[static_cast<std::size_t>(j) * kPanelWidth + l];
          break;
        case WeightDtype::kBf16:
          value = bf16_to_float(reinterpret_cast<const std::uint16_t*>(panel)[static_cast<std::size_t>(j / 2) * 2 * kPanelWidth + l * 2 + j % 2]);
          break;
        case WeightDtype::kInt8: {
          const int g = j / w.int8_group_size();
          const auto q = reinterpret_cast<const std::uint8_t*>(panel)[static_cast<std::size_t>(j / 4) * 4 * kPanelWidth + l * 4 + j % 4];
          const auto scale = reinterpret_cast<const std::uint16_t*>(panel + static_cast<std::size_t>(kp) * kPanelWidth)[g * kPanelWidth + l];
          value = fp16_to_float(scale) * static_cast<float>(static_cast<int>(q) - 128);
          break;
        }
      }
      out[static_cast<std::size_t>(f) * w.k + j] = value;
    }
  }
}

std::uint16_t float_to_bf16(float value) {
  const std::uint32_t b = float_bits(value);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((b >> 16) | 0x40);  // quiet NaN
  return static_cast<std::uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

float bf16_to_float(std::uint16_t value) { return bits_float(static_cast<std::uint32_t>(value) << 16); }

std::uint16_t float_to_fp16(float value) {
  const std::uint32_t b = float_bits(value);
  const std::uint32_t sign = (b >> 16) & 0x8000u;
  const std::uint32_t magnitude = b & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (magnitude < 0x38800000u) {
    // Below fp16's smallest normal (2^-14): a subnormal m * 2^-24; the scaling by 2^24 is exact.
    const auto m = static_cast<std::uint32_t>(std::nearbyint(bits_float(magnitude) * 16777216.0f));
    return static_cast<std::uint16_t>(sign | m);  // m = 1024 is exactly the smallest normal
  }
  const std::uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);  // to nearest, ties to even
  return static_cast<std::uint16_t>(sign | ((rounded >> 13) - (112u << 10)));   // exponent bias 127 -> 15
}

float fp16_to_float(std::uint16_t value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value & 0x8000u) << 16;
  const std::uint32_t exponent = (value >> 10) & 0x1fu;
  const std::uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace shardline::kernels::cpu
