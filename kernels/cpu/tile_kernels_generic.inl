// The portable tile kernels, written so the compiler vectorises the 16 lanes of a panel (one output
// feature per lane). Included by tile_kernels_portable.cpp and tile_kernels_avx2.cpp, each inside its own
// anonymous namespace and compiled with its own target flags. Deliberately free of library headers (see
// tile_kernels.h). Rows go four at a time so each weight value loaded serves four rows.

// multiply_add(a, b, c) = a * b + c: fused where the including file says the target has FMA (one rounding,
// the same whatever the compiler would otherwise contract), two roundings elsewhere.
inline float multiply_add(float a, float b, float c) {
#if SHARDLINE_TILE_HAS_FMA
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

constexpr int kLanes = 16;
constexpr int kRowBlock = 4;

inline float bits_to_float(std::uint32_t bits) {
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// fp16 (IEEE half) to float, subnormals included, as F16C's conversion gives it; the scales are
// non-negative, and NaN only where a weight group held a NaN or an Inf (pack_panel_int8), which must stay
// NaN here as it does in the VNNI and AMX kernels.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t exponent = (h >> 10) & 0x1f;
  const std::uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) return static_cast<float>(mantissa) * (1.0f / 16777216.0f);  // m * 2^-24
  if (exponent == 0x1f) return bits_to_float(0x7f800000u | (mantissa << 13));    // Inf or NaN
  return bits_to_float(((exponent + 112) << 23) | (mantissa << 13));
}

template <int R>
void f32_rows(const float* w, const float* x, int x_stride, int k, float* out) {
  float acc[R][kLanes] = {};
  for (int kk = 0; kk < k; ++kk) {
    const float* wk = w + static_cast<std::size_t>(kk) * kLanes;
    for (int r = 0; r < R; ++r) {
      const float xv = x[static_cast<std::size_t>(r) * x_stride + kk];
      for (int l = 0; l < kLanes; ++l) acc[r][l] = multiply_add(wk[l], xv, acc[r][l]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int l = 0; l < kLanes; ++l) out[r * kTileStride + l] = acc[r][l];
  }
}

void f32_tile(const Tile& t) {
  const float* x = static_cast<const float*>(t.x);
  for (int p = 0; p < t.n_panels; ++p) {
    const float* w = reinterpret_cast<const float*>(t.panels + p * t.panel_stride);
    int r = 0;
    for (; r + kRowBlock <= t.n_rows; r += kRowBlock) {
      f32_rows<kRowBlock>(w, x + static_cast<std::size_t>(r) * t.x_stride, t.x_stride, t.k,
                          t.out + r * kTileStride + p * kLanes);
    }
    for (; r < t.n_rows; ++r) {
      f32_rows<1>(w, x + static_cast<std::size_t>(r) * t.x_stride, t.x_stride, t.k, t.out + r * kTileStride + p * kLanes);
    }
  }
}

// bf16 weights widened to float (exact) times fp32 activations: the fp32 kernel's arithmetic.
template <int R>
void bf16_rows(const std::uint16_t* w, const float* x, int x_stride, int k, float* out) {
  float acc[R][kLanes] = {};
  for (int kk = 0; kk < k; kk += 2) {
    const std::uint16_t* wk = w + static_cast<std::size_t>(kk) * kLanes;  // (16 lanes, 2 values)
    float w0[kLanes], w1[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      w0[l] = bits_to_float(static_cast<std::uint32_t>(wk[2 * l]) << 16);
      w1[l] = bits_to_float(static_cast<std::uint32_t>(wk[2 * l + 1]) << 16);
    }
    for (int r = 0; r < R; ++r) {
      const float* xr = x + static_cast<std::size_t>(r) * x_stride + kk;
      const float x0 = xr[0];
      const float x1 = kk + 1 < k ? xr[1] : 0.0f;  // k may be odd: the pair's padding weight is zero
      for (int l = 0; l < kLanes; ++l) acc[r][l] = multiply_add(w1[l], x1, multiply_add(w0[l], x0, acc[r][l]));
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int l = 0; l < kLanes; ++l) out[r * kTileStride + l] = acc[r][l];
  }
}

void bf16_tile(const Tile& t) {
  const float* x = static_cast<const float*>(t.x);
  for (int p = 0; p < t.n_panels; ++p) {
    const std::uint16_t* w = reinterpret_cast<const std::uint16_t*>(t.panels + p * t.panel_stride);
    int r = 0;
    for (; r + kRowBlock <= t.n_rows; r += kRowBlock) {
      bf16_rows<kRowBlock>(w, x + static_cast<std::size_t>(r) * t.x_stride, t.x_stride, t.k,
                           t.out + r * kTileStride + p * kLanes);
    }
    for (; r < t.n_rows; ++r) {
      bf16_rows<1>(w, x + static_cast<std::size_t>(r) * t.x_stride, t.x_stride, t.k, t.out + r * kTileStride + p * kLanes);
    }
  }
}

// Integer dot products per group (32, 64, 96 or 128 k) are exact; each group's sum is then scaled by (weight scale *
// x scale) and added in float, in the same order as the VNNI kernel.
template <int R>
void int8_rows(const std::uint8_t* w, const std::int8_t* x, int x_stride, const float* x_scales, int x_groups, int k,
               int group, std::size_t scales_offset, float* out) {
  const int groups = k / group;
  const std::uint16_t* w_scales = reinterpret_cast<const std::uint16_t*>(w + scales_offset);
  float acc[R][kLanes] = {};
  for (int g = 0; g < groups; ++g) {
    std::int32_t dot[R][kLanes] = {};
    for (int j0 = g * group; j0 < (g + 1) * group; j0 += 32) {
      const std::uint8_t* wb = w + static_cast<std::size_t>(j0) * kLanes;  // 32 k: (8 quads, 16 lanes, 4)
      for (int q = 0; q < 8; ++q) {
        for (int j = 0; j < 4; ++j) {
          for (int r = 0; r < R; ++r) {
            const std::int32_t xv = x[static_cast<std::size_t>(r) * x_stride + j0 + q * 4 + j];
            for (int l = 0; l < kLanes; ++l) dot[r][l] += (static_cast<std::int32_t>(wb[q * 64 + l * 4 + j]) - 128) * xv;
          }
        }
      }
    }
    float ws[kLanes];
    for (int l = 0; l < kLanes; ++l) ws[l] = half_to_float(w_scales[g * kLanes + l]);
    for (int r = 0; r < R; ++r) {
      const float xs = x_scales[static_cast<std::size_t>(r) * x_groups + g];
      for (int l = 0; l < kLanes; ++l) acc[r][l] = multiply_add(static_cast<float>(dot[r][l]), ws[l] * xs, acc[r][l]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int l = 0; l < kLanes; ++l) out[r * kTileStride + l] = acc[r][l];
  }
}

void int8_tile(const Tile& t) {
  const std::int8_t* x = static_cast<const std::int8_t*>(t.x);
  const int groups = t.x_groups;
  for (int p = 0; p < t.n_panels; ++p) {
    const std::uint8_t* w = reinterpret_cast<const std::uint8_t*>(t.panels + p * t.panel_stride);
    int r = 0;
    for (; r + kRowBlock <= t.n_rows; r += kRowBlock) {
      int8_rows<kRowBlock>(w, x + static_cast<std::size_t>(r) * t.x_stride, t.x_stride,
                           t.x_scales + static_cast<std::size_t>(r) * groups, groups, t.k, t.int8_group,
                           t.int8_scales_offset, t.out + r * kTileStride + p * kLanes);
    }
    for (; r < t.n_rows; ++r) {
      int8_rows<1>(w, x + static_cast<std::size_t>(r) * t.x_stride, t.x_stride,
                   t.x_scales + static_cast<std::size_t>(r) * groups, groups, t.k, t.int8_group, t.int8_scales_offset,
                   t.out + r * kTileStride + p * kLanes);
    }
  }
}
