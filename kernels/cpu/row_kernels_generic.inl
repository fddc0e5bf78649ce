// The row kernels of row_kernels.h, included inside an anonymous namespace by row_kernels_portable.cpp and
// row_kernels_avx512.cpp. Plain loops with fixed trip counts where the compiler should vectorise, and no
// standard-library templates (see row_kernels.h on why the ISA files share no inline code).

constexpr int kMaxGroup = 128;  // k values per int8 scale: 32 or 128 (weight_format.h: int8_group)
constexpr int kLanes = 16;  // partial sums of the attention dot product

inline float max_of(float a, float b) { return a > b ? a : b; }

// Round to nearest, ties to even, for |v| < 2^22 (activation codes are within ±127.5): adding 1.5 * 2^23
// pushes the fraction bits out of a float's mantissa under the default rounding mode (the compiler may not
// fold it away without -ffast-math). Unlike nearbyintf, a library call at the baseline target, it vectorises.
inline float round_to_nearest_even(float v) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  return (v + kShift) - kShift;
}

// The largest |x| of n values (a multiple of 32), as 16 lane maxima folded in halves (max is exact in any
// order).
inline float group_amax(const float* x, int n) {
  float m[kLanes] = {};
  for (int i = 0; i < n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) m[l] = max_of(m[l], __builtin_fabsf(x[i + l]));
  }
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) m[l] = max_of(m[l], m[l + width]);
  }
  return m[0];
}

void quantize_int8_row(const float* x, int k, int kp, int group, std::int8_t* q, float* scales, std::int32_t* sums) {
  for (int g = 0, j0 = 0; j0 < kp; ++g, j0 += group) {
    const int valid = k - j0 < group ? k - j0 : group;  // the last group may pass k
    float v[kMaxGroup];
    for (int i = 0; i < group; ++i) v[i] = i < valid ? x[j0 + i] : 0.0f;
    const float amax = group_amax(v, group);
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    std::int32_t sum = 0;
    for (int i = 0; i < group; ++i) {
      float c = round_to_nearest_even(v[i] * inverse);
      c = c < -127.0f ? -127.0f : (c > 127.0f ? 127.0f : c);
      const std::int32_t code = static_cast<std::int32_t>(c);
      q[j0 + i] = static_cast<std::int8_t>(code);
      sum += code;
    }
    scales[g] = amax / 127.0f;
    sums[g] = sum;
  }
}

// float_to_bf16 of weight_format.cpp (round to nearest even, NaN kept quiet), on bits.
inline std::uint16_t to_bf16(float value) {
  const std::uint32_t b = __builtin_bit_cast(std::uint32_t, value);
  const std::uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((b & 0x7fffffffu) > 0x7f800000u ? (b >> 16) | 0x40u : rounded);
}

inline float from_bf16(std::uint16_t value) {
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(value) << 16);
}

void split_bf16_row(const float* x, int k, int kp, std::uint16_t* hi, std::uint16_t* lo) {
  for (int j = 0; j < k; ++j) {
    const std::uint16_t h = to_bf16(x[j]);
    hi[j] = h;
    lo[j] = to_bf16(x[j] - from_bf16(h));  // exact in fp32
  }
  for (int j = k; j < kp; ++j) hi[j] = lo[j] = 0;
}

// q . k over head_size floats in 16 interleaved partial sums, added up in a fixed order at the end. One
// running sum is a chain of dependent multiply-adds the compiler may not reorder (no -ffast-math): it cost
// a third of a batch-16 decode step on the 110M shape. The order is fixed, so every layout, batch and ISA
// computes the same score.
inline float dot(const float* a, const float* b, int n) {
  float partial[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) partial[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) partial[i % kLanes] += a[i] * b[i];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) partial[l] += partial[l + width];
  }
  return partial[0];
}

// Position-major: each cached key and value row (every kv head's slice of one position, contiguous) is read
// once, front to back, for all the heads, so the cache streams from memory; head-major order read 256
// bytes per position at a 3 KiB stride and waited on memory for each. Every score and every output element
// still accumulates over positions in increasing order, exactly as a head-by-head loop would.
void attention_heads(const AttentionHeads& a, int h0, int h1) {
  const int n_ctx = a.n_ctx, hs = a.head_size;
  for (int b = 0, t0 = 0; t0 < n_ctx; ++b, t0 += a.block_tokens) {
    const int rows = n_ctx - t0 < a.block_tokens ? n_ctx - t0 : a.block_tokens;
    for (int r = 0; r < rows; ++r) {
      const float* k_row = a.k_blocks[b] + static_cast<std::size_t>(r) * a.kv_stride;
      for (int h = h0; h < h1; ++h) {
        a.scratch[static_cast<std::size_t>(h) * n_ctx + t0 + r] =
            dot(a.q + static_cast<std::size_t>(h) * hs, k_row + (h / a.group) * hs, hs) * a.inv_sqrt;
      }
    }
  }
  for (int h = h0; h < h1; ++h) {
    softmax(a.scratch + static_cast<std::size_t>(h) * n_ctx, n_ctx);
    float* oh = a.out + static_cast<std::size_t>(h) * hs;
    for (int i = 0; i < hs; ++i) oh[i] = 0.0f;
  }
  for (int b = 0, t0 = 0; t0 < n_ctx; ++b, t0 += a.block_tokens) {
    const int rows = n_ctx - t0 < a.block_tokens ? n_ctx - t0 : a.block_tokens;
    for (int r = 0; r < rows; ++r) {
      const float* v_row = a.v_blocks[b] + static_cast<std::size_t>(r) * a.kv_stride;
      for (int h = h0; h < h1; ++h) {
        const float weight = a.scratch[static_cast<std::size_t>(h) * n_ctx + t0 + r];
        const float* vt = v_row + (h / a.group) * hs;
        float* oh = a.out + static_cast<std::size_t>(h) * hs;
        for (int i = 0; i < hs; ++i) oh[i] += weight * vt[i];
      }
    }
  }
}

RowKernels row_kernels() { return {quantize_int8_row, split_bf16_row, attention_heads}; }
