// The row kernels of row_kernels.h, included inside an anonymous namespace by row_kernels_portable.cpp and
// row_kernels_avx512.cpp. Plain loops with fixed trip counts where the compiler should vectorise, and no
// standard-library templates (see row_kernels.h on why the ISA files share no inline code).

constexpr int kMaxGroup = 128;  // k values per int8 scale: 32, 64, 96 or 128 (weight_format.h: int8_group)
constexpr int kLanes = 16;  // partial sums of the attention dot product

inline float max_of(float a, float b) { return a > b ? a : b; }

// Round to nearest, ties to even, for |v| < 2^22 (activation codes are within ±127.5): adding 1.5 * 2^23
// pushes the fraction bits out of a float's mantissa under the default rounding mode (the compiler may not
// fold it away without -ffast-math). Unlike nearbyintf, a library call at the baseline target, it vectorises.
constexpr float kRoundShift = 12582912.0f;  // 1.5 * 2^23
inline float round_to_nearest_even(float v) { return (v + kRoundShift) - kRoundShift; }

// The sum of 16 partial sums in a fixed order: lane l gets lane l + 8, then l + 4, l + 2, l + 1 (the AVX-512
// build does the same in registers).
inline float fold_lanes(float (&partial)[kLanes]) {
#pragma GCC unroll 4
  for (int width = kLanes / 2; width > 0; width /= 2) {
#pragma GCC unroll 8
    for (int l = 0; l < width; ++l) partial[l] += partial[l + width];
  }
  return partial[0];
}

// exp(x) in single precision, the same bits in every build (the C library's expf is a call the AVX-512 build
// cannot vectorise, and one implementation for both builds keeps them identical): Cephes' expf, with
// x = n ln2 + r (n = round(x log2 e), ln2 in two parts so n ln2 is exact), e^r from its degree-7 polynomial
// on |r| <= ln2 / 2, times 2^n as two exact power-of-two multiplies (so results overflow to +inf past 88.72
// and fall to subnormals and 0 below -87.3, as expf's do). Within 2 ulp of the true value (tested against
// double precision). x is clamped to [-104, 89] first, where 2^n's two halves stay normal floats.
constexpr float kExpMin = -104.0f, kExpMax = 89.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr int kExpTerms = 6;
constexpr float kExpPoly[kExpTerms] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                       4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float pow2i(int e) {  // 2^e for e in [-126, 127]
  return __builtin_bit_cast(float, static_cast<std::uint32_t>(e + 127) << 23);
}

// exp_kernel() returns a NaN as itself, by a select at the end rather than an early return: a loop over exp_kernel()
// with a branch in it stayed scalar in the baseline and AVX2 builds (SwiGLU's gate ran one vdivss a value,
// about 1.7% of a 110M int8 decode on a Zen 3, session 32). The clamp's comparisons are false for a NaN, so
// the arithmetic runs on kExpMin and stays in int range (its result is dropped).
inline float exp_kernel(float x) {
  const float c = x > kExpMin ? (x < kExpMax ? x : kExpMax) : kExpMin;
  const float n = round_to_nearest_even(c * kLog2e);
  float r = c - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kExpPoly[0];
  for (int i = 1; i < kExpTerms; ++i) p = p * r + kExpPoly[i];
  const float y = (p * (r * r) + r) + 1.0f;
  const int e = static_cast<int>(n);
  const int e1 = e >> 1;  // arithmetic shift: e1 + e2 = e, both in [-75, 64]
  const float value = (y * pow2i(e1)) * pow2i(e - e1);
  return x == x ? value : x;
}

// The largest |x| of n values, as 16 lane maxima (value i in lane i % 16) folded in halves (max is exact in
// any order; the fixed order also fixes which NaN comes out, as the AVX-512 build's fold_max16() does).
inline float group_amax(const float* x, int n) {
  float m[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) m[l] = max_of(m[l], __builtin_fabsf(x[i + l]));
  }
  for (; i < n; ++i) m[i % kLanes] = max_of(m[i % kLanes], __builtin_fabsf(x[i]));
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) m[l] = max_of(m[l], m[l + width]);
  }
  return m[0];
}

// The int8 code of v at inverse = 127 / max|x|: rounded to nearest even, clamped to +-127.
inline std::int32_t int8_code(float v, float inverse) {
  float c = round_to_nearest_even(v * inverse);
  c = c >= -127.0f ? (c <= 127.0f ? c : 127.0f) : -127.0f;  // a NaN (from a non-finite x) becomes -127
  return static_cast<std::int32_t>(c);
}

void quantize_int8_row(const float* x, int k, int kp, int group, std::int8_t* q, float* scales, std::int32_t* sums) {
  for (int g = 0, j0 = 0; j0 < kp; ++g, j0 += group) {
    const int valid = k - j0 < group ? k - j0 : group;  // the last group may pass k
    float v[kMaxGroup];
    for (int i = 0; i < group; ++i) v[i] = i < valid ? x[j0 + i] : 0.0f;
    const float amax = group_amax(v, group);
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    std::int32_t sum = 0;
    std::uint32_t non_finite = 0;  // an integer, not a bool &=, which kept the loop scalar
    for (int i = 0; i < group; ++i) {
      const std::int32_t code = int8_code(v[i], inverse);
      q[j0 + i] = static_cast<std::int8_t>(code);
      sum += code;
      non_finite |= (__builtin_bit_cast(std::uint32_t, v[i]) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;  // NaN, Inf
    }
    const bool finite = non_finite == 0;
    // A group holding a NaN or an Inf (a damaged model's activations) gets a NaN scale, so its products
    // stay NaN as fp32's would and the run's warning about non-finite hidden states fires; its codes alone
    // would have made finite numbers of them (a NaN's code is -127).
    scales[g] = finite ? amax / 127.0f : __builtin_nanf("");
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

// binary32 -> binary16 bits, round to nearest even, on integers (the C library has no conversion, and the
// compiler's _Float16 one is a slow call at the baseline target): what VCVTPS2PH computes, NaN included.
inline std::uint16_t to_half(float value) {
  const std::uint32_t bits = __builtin_bit_cast(std::uint32_t, value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // 65520 and up round to inf
  if (magnitude >= 0x38800000u) {  // a normal half (2^-14 and up): rebias the exponent, round off 13 bits
    const std::uint32_t rebiased = magnitude - 0x38000000u;
    return static_cast<std::uint16_t>(sign | ((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13));
  }
  if (magnitude <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // up to 2^-25 (a tie) rounds to 0
  // A subnormal half: m 2^-24 with m = the float's significand shifted right by 126 - exponent (14 to 24),
  // rounded to nearest even (m = 1024 is the smallest normal half, the right bits too).
  const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const int shift = 126 - static_cast<int>(magnitude >> 23);
  const std::uint32_t m = significand >> shift, rest = significand & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return static_cast<std::uint16_t>(sign | (m + (rest > half || (rest == half && (m & 1u)) ? 1u : 0u)));
}

// binary16 bits -> binary32, exact: what VCVTPH2PS computes (a signalling NaN comes back quiet). Without
// branches, so that the attention loops that read an fp16 cache through it still vectorise:
//  - normal, infinite and NaN halves: the exponent and mantissa moved into place with the exponent 224 up
//    (so the half's 31 lands on the float's 255: infinity or NaN), then a multiply by 2^-112 brings a finite
//    value to its exponent exactly (infinity stays infinite; a NaN stays NaN, quiet with its payload, as
//    any multiply of a NaN on x86 leaves it);
//  - zero and subnormals (m 2^-24): the float with mantissa m and exponent 2^-1, minus 0.5, is exactly m 2^-24
//    (the difference is exact: both are multiples of 2^-24 below 1).
inline float from_half(std::uint16_t half) {
  const std::uint32_t magnitude = static_cast<std::uint32_t>(half & 0x7fffu);
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const float normal = __builtin_bit_cast(float, (magnitude << 13) + (224u << 23)) * 1.925929944387236e-34f;  // 2^-112
  const float subnormal = __builtin_bit_cast(float, magnitude | (126u << 23)) - 0.5f;
  const std::uint32_t normal_mask = 0u - static_cast<std::uint32_t>(magnitude >= 0x400u);  // a mask, not a branch
  const std::uint32_t bits = (__builtin_bit_cast(std::uint32_t, normal) & normal_mask) |
                             (__builtin_bit_cast(std::uint32_t, subnormal) & ~normal_mask);
  return __builtin_bit_cast(float, sign | bits);
}

void to_half_row(const float* x, int n, std::uint16_t* h) {
  for (int i = 0; i < n; ++i) h[i] = to_half(x[i]);
}

void from_half_row(const std::uint16_t* h, int n, float* x) {
  for (int i = 0; i < n; ++i) x[i] = from_half(h[i]);
}

// The largest of x[0, n) as the one-by-one scan x[i] > max ? x[i] : max from x[0] finds it, in kLanes lane
// maxima folded in halves (as the AVX-512 build's softmax does): max is exact in any order, a NaN never wins a
// compare (and a NaN x[0] stays), and of +0 and -0 either may come out, which x - max does not tell apart. The
// scan was one chain of dependent compares, most of a 512-value softmax on AVX2 (session 33).
inline float row_max(const float* x, int n) {
  float m[kLanes];
  for (int l = 0; l < kLanes; ++l) m[l] = x[0];
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 1  // so that it vectorises (fold_max_in_blocks())
    for (int l = 0; l < kLanes; ++l) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
  }
  for (; i < n; ++i) m[i % kLanes] = x[i] > m[i % kLanes] ? x[i] : m[i % kLanes];
#pragma GCC unroll 4
  for (int width = kLanes / 2; width > 0; width /= 2) {
#pragma GCC unroll 8
    for (int l = 0; l < width; ++l) m[l] = m[l + width] > m[l] ? m[l + width] : m[l];
  }
  return m[0];
}

// x = exp(x - max) / sum, in place. The sum gathers the values in 16 interleaved partial sums, folded as
// dot() folds them (which the AVX-512 build keeps in one register).
void softmax_row(float* x, int n) {
  const float max_val = row_max(x, n);
  float partial[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {  // whole vectors of lanes: vectorised
    for (int l = 0; l < kLanes; ++l) {
      x[i + l] = exp_kernel(x[i + l] - max_val);
      partial[l] += x[i + l];
    }
  }
  for (; i < n; ++i) {
    x[i] = exp_kernel(x[i] - max_val);
    partial[i % kLanes] += x[i];
  }
  const float inv = 1.0f / fold_lanes(partial);
  for (i = 0; i < n; ++i) x[i] *= inv;
}

// The SwiGLU gate: h = silu(h) * u = h * (1 / (1 + exp(-h))) * u.
void silu_mul(float* h, const float* u, int n) {
  for (int i = 0; i < n; ++i) {
    const float g = h[i];
    h[i] = g * (1.0f / (1.0f + exp_kernel(-g))) * u[i];
  }
}

// y += x. Compiled for AVX-512 in row_kernels_avx512.cpp, where GCC vectorizes it (the fold of a segment's
// products in matmul_segments: a tile of 64 rows x 64 features at a time, once per segment).
void add_row(float* __restrict y, const float* __restrict x, int n) {
  for (int i = 0; i < n; ++i) y[i] += x[i];
}

// An int8 cache row's scale for one head: the floats after the row's n codes (unaligned: a row of n codes
// need not end on a multiple of 4 bytes).
inline float int8_row_scale(const std::int8_t* row, int n, int head) {
  float scale;
  __builtin_memcpy(&scale, row + n + 4 * head, sizeof scale);
  return scale;
}
inline void set_int8_row_scale(std::int8_t* row, int n, int head, float scale) {
  __builtin_memcpy(row + n + 4 * head, &scale, sizeof scale);
}

// One int8 cache row (ToInt8KvRow): each head's codes and scale as quantize_int8_row() computes a group's,
// a head holding a NaN or an Inf included (its scale NaN, so it reads back as NaN, as an fp32 cache would).
void to_int8_kv_row(const float* x, int n, int head_size, void* row) {
  std::int8_t* codes = static_cast<std::int8_t*>(row);
  for (int h = 0, j0 = 0; j0 < n; ++h, j0 += head_size) {
    const float amax = group_amax(x + j0, head_size);
    const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    bool finite = true;
    for (int i = 0; i < head_size; ++i) {
      codes[j0 + i] = static_cast<std::int8_t>(int8_code(x[j0 + i], inverse));
      finite &= __builtin_fabsf(x[j0 + i]) <= __FLT_MAX__;
    }
    set_int8_row_scale(codes, n, h, finite ? amax / 127.0f : __builtin_nanf(""));
  }
}

void from_int8_kv_row(const void* row, int n, int head_size, float* x) {
  const std::int8_t* codes = static_cast<const std::int8_t*>(row);
  for (int h = 0, j0 = 0; j0 < n; ++h, j0 += head_size) {
    const float scale = int8_row_scale(codes, n, h);
    for (int i = 0; i < head_size; ++i) x[j0 + i] = static_cast<float>(codes[j0 + i]) * scale;
  }
}

// A cached value as a float: T is float, std::uint16_t for an fp16 cache's binary16 bits, or std::int8_t
// for an int8 cache's code (its head's scale is applied once per dot product or position, below).
inline float cached_value(const float* p) { return *p; }
inline float cached_value(const std::uint16_t* p) { return from_half(*p); }
inline float cached_value(const std::int8_t* p) { return static_cast<float>(*p); }

// A row's length in T: kv_stride values, and for int8 the scales of its kv_stride / head_size heads.
inline int row_stride(const float*, int kv_stride, int) { return kv_stride; }
inline int row_stride(const std::uint16_t*, int kv_stride, int) { return kv_stride; }
inline int row_stride(const std::int8_t*, int kv_stride, int head_size) { return kv_stride + 4 * (kv_stride / head_size); }

// What a head's dot product with a cached key, or a position's softmax weight, is multiplied by to use the
// row's values: nothing for fp32 and fp16 rows, the head's scale for int8 ones (one multiply per position
// and head instead of one per value).
inline float scaled_by_row(float v, const float*, int, int) { return v; }
inline float scaled_by_row(float v, const std::uint16_t*, int, int) { return v; }
inline float scaled_by_row(float v, const std::int8_t* row, int kv_stride, int kv_head) {
  return v * int8_row_scale(row, kv_stride, kv_head);
}

// Position t's row of a paged cache (a key or a value block list) of T; stride in T (row_stride()).
template <typename T>
inline const T* cached_row(const void* const* blocks, int block_tokens, int t, int stride) {
  return static_cast<const T*>(blocks[t / block_tokens]) + static_cast<std::size_t>(t % block_tokens) * stride;
}

// fn(t, row) for positions t = t_begin .. t_end - 1 in order, row = position t's cached row (of T).
template <typename T, typename Fn>
inline void for_each_cached_row(const void* const* blocks, int block_tokens, int t_begin, int t_end, int stride,
                                Fn&& fn) {
  int b = t_begin / block_tokens, first = t_begin % block_tokens;  // the first block's first row
  for (int t = t_begin; t < t_end; ++b, first = 0) {
    const int rows = t_end - t < block_tokens - first ? t_end - t : block_tokens - first;
    const T* block = static_cast<const T*>(blocks[b]) + static_cast<std::size_t>(first) * stride;
    for (int r = 0; r < rows; ++r) fn(t + r, block + static_cast<std::size_t>(r) * stride);
    t += rows;
  }
}
// Positions 0 .. n_ctx - 1.
template <typename T, typename Fn>
inline void for_each_cached_row(const void* const* blocks, int block_tokens, int n_ctx, int stride, Fn&& fn) {
  for_each_cached_row<T>(blocks, block_tokens, 0, n_ctx, stride, fn);
}

// Every 64-byte line of [p, p + n) (p need not be aligned: the walk starts at its line).
inline void prefetch_bytes(const void* p, int n) {
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  for (std::uintptr_t line = begin & ~std::uintptr_t{63}; line < begin + n; line += 64) {
    __builtin_prefetch(reinterpret_cast<const void*>(line));
  }
}

// The lines of a cached row that heads [h0, h1) read: their kv heads' values and, in an int8 row, their
// scales (which follow the codes). Both attention builds prefetch rows through it.
template <typename T>
class HeadSpan {
 public:
  HeadSpan(const AttentionHeads& a, int h0, int h1) {
    const int kv_h0 = h0 / a.group, kv_h1 = (h1 - 1) / a.group + 1;
    begin_ = kv_h0 * a.head_size;
    bytes_ = (kv_h1 - kv_h0) * a.head_size * static_cast<int>(sizeof(T));
    if constexpr (sizeof(T) == 1) {
      scales_begin_ = a.kv_stride + 4 * kv_h0;
      scales_bytes_ = 4 * (kv_h1 - kv_h0);
    }
  }
  void prefetch(const T* row) const {
    prefetch_bytes(row + begin_, bytes_);
    if (scales_bytes_ > 0) prefetch_bytes(row + scales_begin_, scales_bytes_);
  }

 private:
  int begin_ = 0, bytes_ = 0, scales_begin_ = 0, scales_bytes_ = 0;
};

// Positions the key loop prefetches ahead. A sequence's cache is a few short runs of rows (a block per
// 16 positions, a few KiB per row) that the weights of the layer before have pushed out of the caches, and
// the hardware prefetcher stops at every 4 KiB page: without software prefetching the loops waited on
// memory for most rows.
constexpr int kAttentionPrefetchRows = 4;

// The second half of attention_heads_with(): each head's scores (scratch) through the softmax, then its
// weighted sum of the values.
template <typename Softmax, typename Values>
void softmax_and_values(const AttentionHeads& a, int h0, int h1, Softmax&& softmax, Values&& values) {
  for (int h = h0; h < h1; ++h) {
    float* weights = a.scratch + static_cast<std::size_t>(h) * a.n_ctx;
    softmax(weights, a.n_ctx);
    values(a.out + static_cast<std::size_t>(h) * a.head_size, weights, h);
  }
}

// Attention of heads [h0, h1), with the score dot product, the softmax and the value accumulation of one
// head as parameters (the AVX-512 build passes register versions; every version keeps the same order of
// operations, so the bits do not change):
//   dot(q, k, head_size) -> q . k, as dot() below;
//   softmax(x, n) as softmax_row();
//   values(out, weights, h): out (head_size) = sum over positions t, in order, of weights[t] * value row t
//   of head h's kv head, from out = 0, as in attention_heads() below.
// Scores go position-major: each cached key row (every kv head's slice of one position, contiguous) is
// read once, front to back, for all the heads, and the keys kAttentionPrefetchRows positions ahead and the
// values of the position are prefetched (only the kv heads of [h0, h1)). Values then go head by head, out of
// cache, so a head's output stays in registers (or L1) across the positions.
template <typename T, typename Dot, typename Softmax, typename Values>
void attention_heads_with(const AttentionHeads& a, int h0, int h1, Dot&& dot, Softmax&& softmax, Values&& values) {
  const int n_ctx = a.n_ctx, hs = a.head_size;
  const int stride = row_stride(static_cast<const T*>(nullptr), a.kv_stride, hs);
  const HeadSpan<T> span(a, h0, h1);
  for (int t = 0; t < kAttentionPrefetchRows && t < n_ctx; ++t) {
    span.prefetch(cached_row<T>(a.k_blocks, a.block_tokens, t, stride));
  }
  for_each_cached_row<T>(a.k_blocks, a.block_tokens, n_ctx, stride, [&](int t, const T* k_row) {
    if (t + kAttentionPrefetchRows < n_ctx) {
      span.prefetch(cached_row<T>(a.k_blocks, a.block_tokens, t + kAttentionPrefetchRows, stride));
    }
    span.prefetch(cached_row<T>(a.v_blocks, a.block_tokens, t, stride));
    for (int h = h0; h < h1; ++h) {
      const float score = dot(a.q + static_cast<std::size_t>(h) * hs, k_row + (h / a.group) * hs, hs);
      a.scratch[static_cast<std::size_t>(h) * n_ctx + t] = scaled_by_row(score, k_row, a.kv_stride, h / a.group) * a.inv_sqrt;
    }
  });
  softmax_and_values(a, h0, h1, softmax, values);
}

#ifdef SHARDLINE_ROW_KERNELS_AVX2
// The AVX2 build (row_kernels_avx2.cpp) keeps the attention's 16 lanes in two registers itself, with
// intrinsics: GCC kept dot()'s partial sums in registers but folded them through the stack, and split a
// slice of values' 16 sums 8 + 4 + 2 + 1 + 1 (weighted_heads()); a 32-position attention took 8.2-8.4 us
// with them and 4.4-4.5 with intrinsics, dot() inlined (session 33), 3.2 with scores_by_8_positions() and
// four slices a walk (session 34). The same operations in the same order: the same bits.
//
// kLanes cached values as floats (cached_value()'s values: the conversions are exact). An fp16 cache reads
// with F16C's VCVTPH2PS, 8 halves an instruction, where the compiler turned from_half's bit operations
// into some eight instructions a vector.
inline void load_lanes(const float* p, __m256& lo, __m256& hi) {
  lo = _mm256_loadu_ps(p);
  hi = _mm256_loadu_ps(p + 8);
}
inline void load_lanes(const std::uint16_t* p, __m256& lo, __m256& hi) {
  lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
}
inline void load_lanes(const std::int8_t* p, __m256& lo, __m256& hi) {
  lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))));
}

// fold_lanes() of lanes 0-7 in lo and 8-15 in hi: l + 8, then l + 4, l + 2, l + 1.
inline float fold_lanes(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#endif

// q . k over head_size floats in 16 interleaved partial sums, added up in a fixed order at the end. One
// running sum is a chain of dependent multiply-adds the compiler may not reorder (no -ffast-math). The
// order is fixed, so every layout, batch and ISA computes the same score.
template <typename T>
inline float dot(const float* a, const T* b, int n) {
  int i = 0;
#ifdef SHARDLINE_ROW_KERNELS_AVX2
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (; i + kLanes <= n; i += kLanes) {
    __m256 b_lo, b_hi;
    load_lanes(b + i, b_lo, b_hi);
    lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(a + i), b_lo));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(a + i + 8), b_hi));
  }
  if (i == n) return fold_lanes(lo, hi);
  float partial[kLanes];
  _mm256_storeu_ps(partial, lo);
  _mm256_storeu_ps(partial + 8, hi);
#else
  float partial[kLanes] = {};
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) partial[l] += a[i + l] * cached_value(b + i + l);
  }
#endif
  for (; i < n; ++i) partial[i % kLanes] += a[i] * cached_value(b + i);
  return fold_lanes(partial);
}

// out[0, n) += weight times a cached row's n values.
template <typename T>
inline void add_weighted_row(float* out, float weight, const T* row, int n) {
  for (int i = 0; i < n; ++i) out[i] += weight * cached_value(row + i);
}

// One weighted sum over a kv head's cached values: out (head_size) = the sum over positions t in order, from
// zero, of weights[t] (scaled_by_row()) times position t's values. A head of one query row (weights: its
// softmax, in scratch), and the heads of a GQA group, or the rows of a prefill chunk, read the same values.
struct ValueSum {
  const float* weights;
  float* out;
};

// Values [first, first + S kLanes) of J weighted sums of kv head kv_head's values over positions [t_begin,
// t_end), from zero, or (resume) on from what out holds, the sums so far over the positions before t_begin.
// The sums stay in registers across the positions (two a slice of kLanes in the AVX2 build), each a chain
// of adds along the positions; a walk sums J S slices, so that several chains are in flight (one slice had
// two, and waited on the add's latency at every position), and the J sums read each position's values once
// (from L2 or L3 for long contexts) instead of J times. The same bits whatever J, S and the split of the
// positions.
template <typename T, int J, int S>
void weighted_sums(const AttentionHeads& a, int kv_head, int first, int stride, const ValueSum* sums, int t_begin,
                   int t_end, bool resume) {
  const int offset = kv_head * a.head_size + first;
  const float* weights[J];
  float* out[J];
#pragma GCC unroll 4
  for (int j = 0; j < J; ++j) {
    weights[j] = sums[j].weights;
    out[j] = sums[j].out + first;
  }
#ifdef SHARDLINE_ROW_KERNELS_AVX2
  __m256 lo[J][S], hi[J][S];
#pragma GCC unroll 4
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      lo[j][s] = resume ? _mm256_loadu_ps(out[j] + s * kLanes) : _mm256_setzero_ps();
      hi[j][s] = resume ? _mm256_loadu_ps(out[j] + s * kLanes + 8) : _mm256_setzero_ps();
    }
  }
  for_each_cached_row<T>(a.v_blocks, a.block_tokens, t_begin, t_end, stride, [&](int t, const T* v_row) {
    __m256 v_lo[S], v_hi[S];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) load_lanes(v_row + offset + s * kLanes, v_lo[s], v_hi[s]);
#pragma GCC unroll 4
    for (int j = 0; j < J; ++j) {
      const __m256 weight = _mm256_set1_ps(scaled_by_row(weights[j][t], v_row, a.kv_stride, kv_head));
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        lo[j][s] = _mm256_add_ps(lo[j][s], _mm256_mul_ps(weight, v_lo[s]));
        hi[j][s] = _mm256_add_ps(hi[j][s], _mm256_mul_ps(weight, v_hi[s]));
      }
    }
  });
#pragma GCC unroll 4
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      _mm256_storeu_ps(out[j] + s * kLanes, lo[j][s]);
      _mm256_storeu_ps(out[j] + s * kLanes + 8, hi[j][s]);
    }
  }
#else
  float partial[J][S * kLanes];
  for (int j = 0; j < J; ++j) {
    for (int l = 0; l < S * kLanes; ++l) partial[j][l] = resume ? out[j][l] : 0.0f;
  }
  for_each_cached_row<T>(a.v_blocks, a.block_tokens, t_begin, t_end, stride, [&](int t, const T* v_row) {
    for (int j = 0; j < J; ++j) {
      const float weight = scaled_by_row(weights[j][t], v_row, a.kv_stride, kv_head);
      for (int l = 0; l < S * kLanes; ++l) partial[j][l] += weight * cached_value(v_row + offset + l);
    }
  });
  for (int j = 0; j < J; ++j) {
    for (int l = 0; l < S * kLanes; ++l) out[j][l] = partial[j][l];
  }
#endif
}

// Slices (of kLanes values) a walk of weighted_sums() sums: 4 in the AVX2 build (8 sums, a weight and a
// slice's values: 11 of the 16 ymm registers), over 1 to 4 sums.
#ifdef SHARDLINE_ROW_KERNELS_AVX2
constexpr int kSlicesAtOnce = 4;
#else
constexpr int kSlicesAtOnce = 1;
#endif

// Every whole slice of J weighted sums (a.head_size / kLanes slices), kSlicesAtOnce / J a walk.
template <typename T, int J>
void weighted_sums_slices(const AttentionHeads& a, int kv_head, int stride, const ValueSum* sums, int t_begin, int t_end,
                          bool resume) {
  constexpr int kS = kSlicesAtOnce / J > 0 ? kSlicesAtOnce / J : 1;
  const int slices = a.head_size / kLanes;
  int s = 0;
  for (; s + kS <= slices; s += kS) weighted_sums<T, J, kS>(a, kv_head, s * kLanes, stride, sums, t_begin, t_end, resume);
  if constexpr (kS > 1) {
    const int first = s * kLanes;
    switch (slices - s) {
      case 3: weighted_sums<T, J, (kS > 3 ? 3 : 1)>(a, kv_head, first, stride, sums, t_begin, t_end, resume); break;
      case 2: weighted_sums<T, J, (kS > 2 ? 2 : 1)>(a, kv_head, first, stride, sums, t_begin, t_end, resume); break;
      case 1: weighted_sums<T, J, 1>(a, kv_head, first, stride, sums, t_begin, t_end, resume); break;
      default: break;
    }
  }
}

// The whole slices of n weighted sums of kv head kv_head's values, sum i over its positions in [t_begin,
// t_end) (of [0, n_ctx[i])), on from out where t_begin > 0: 4, 2 or 1 at a time over the positions they all
// have, then each on alone over the positions only it has.
template <typename T>
void weighted_sums_of(const AttentionHeads& a, int kv_head, int stride, const ValueSum* sums, const int* n_ctx, int n,
                      int t_begin, int t_end) {
  for (int i = 0; i < n;) {
    const int take = n - i >= 4 ? 4 : n - i >= 2 ? 2 : 1;
    int shared = t_end;
    for (int j = 0; j < take; ++j) shared = n_ctx[i + j] < shared ? n_ctx[i + j] : shared;
    if (shared > t_begin) {
      const bool resume = t_begin > 0;
      switch (take) {
        case 4: weighted_sums_slices<T, 4>(a, kv_head, stride, sums + i, t_begin, shared, resume); break;
        case 2: weighted_sums_slices<T, 2>(a, kv_head, stride, sums + i, t_begin, shared, resume); break;
        default: weighted_sums_slices<T, 1>(a, kv_head, stride, sums + i, t_begin, shared, resume); break;
      }
    }
    const int alone = shared > t_begin ? shared : t_begin;  // where each goes on alone
    for (int j = 0; j < take; ++j) {
      const int end = n_ctx[i + j] < t_end ? n_ctx[i + j] : t_end;
      if (end > alone) weighted_sums_slices<T, 1>(a, kv_head, stride, sums + i + j, alone, end, alone > 0);
    }
    i += take;
  }
}

// Positions in a tile of the values that several rows' sums walk (attention_rows_by_8_positions()): every
// sum walks one tile before any walks the next, so that the tile (a kv head's values at 64 positions, 16 KiB
// in fp32) stays in L2 for all of them. Walked a sum's whole context at a time, a long context's slice of one
// head is a column of lines a cache row apart, and those fall into a few of L2's sets: a 110M cache row of
// 3 KiB hits 64 of the 1024, so a column of more than 512 positions never stayed in L2 for the next walk.
constexpr int kValueTile = 64;

// weighted_sums_of() the n sums over all their positions, a tile of positions at a time.
template <typename T>
void weighted_sums_in_tiles(const AttentionHeads& a, int kv_head, int stride, const ValueSum* sums, const int* n_ctx,
                            int n) {
  int longest = 0;
  for (int i = 0; i < n; ++i) longest = n_ctx[i] > longest ? n_ctx[i] : longest;
  for (int t0 = 0; t0 < longest; t0 += kValueTile) {
    weighted_sums_of<T>(a, kv_head, stride, sums, n_ctx, n, t0, t0 + kValueTile);
  }
}

#ifdef SHARDLINE_ROW_KERNELS_AVX2
// fold_lanes() of 8 positions' dot products at once: s8[p] = position p's lanes l + l + 8 (fold_lanes()'s first
// step); lane p of the result = position p's l + 4, then l + 2, l + 1, each add with the operands of
// fold_lanes()'s: the same bits as 8 calls. Positions p and p + 4 share a register for the first step (their
// halves by permute2f128), and two shuffles of two such registers line up the next step's operands.
inline __m256 fold8x8(const __m256 (&s8)[8]) {
  __m256 s4[4];  // [position p's l + 4 | position p + 4's]
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    s4[p] = _mm256_add_ps(_mm256_permute2f128_ps(s8[p], s8[p + 4], 0x20), _mm256_permute2f128_ps(s8[p], s8[p + 4], 0x31));
  }
  // [p's l + 2 (2 lanes), p + 1's | p + 4's, p + 5's] for p = 0 and 2
  const __m256 s2a = _mm256_add_ps(_mm256_shuffle_ps(s4[0], s4[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(s4[0], s4[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 s2b = _mm256_add_ps(_mm256_shuffle_ps(s4[2], s4[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm256_shuffle_ps(s4[2], s4[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm256_add_ps(_mm256_shuffle_ps(s2a, s2b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm256_shuffle_ps(s2a, s2b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The scores of heads [h0, h1) over all positions, 8 positions at a time, for heads of 16 R values, of n
// query rows that share a cache (rows[r]: its q, scratch and n_ctx; one row but in attention_rows()): per
// head, each position's dot() in two registers (the row's q loaded once for the 8), folded 8 positions
// together by fold8x8(), then scaled as attention_heads_with() scales a score: the same bits. One position at
// a time, each score waited on its own fold's dependent adds and a store; here 8 positions' chains are in
// flight together (as in the AVX-512 build's 16-position version). With weighted_sums(), a 32-position
// attention of 12 heads went from 4.4-4.5 to 3.2 us, 256 positions from 46 to 35 us, 1024 positions of
// 32 heads over 4 kv heads from 510 to 300 us, and to 246 with a GQA group's heads summing their values
// together (BENCHMARKS.md, session 34). The rows take a head's 8 keys in turn, the later ones from L1.
template <typename T, int R>
void scores_by_8_positions(const AttentionHeads* rows, int n, int h0, int h1) {
  constexpr int hs = 16 * R;
  const AttentionHeads& a = rows[0];  // the cache, the same for every row
  int n_ctx = 0;  // positions of the longest row
  for (int r = 0; r < n; ++r) n_ctx = rows[r].n_ctx > n_ctx ? rows[r].n_ctx : n_ctx;
  const int stride = row_stride(static_cast<const T*>(nullptr), a.kv_stride, hs);
  const HeadSpan<T> span(a, h0, h1);
  for (int p = 0; p < 8 && p < n_ctx; ++p) span.prefetch(cached_row<T>(a.k_blocks, a.block_tokens, p, stride));
  for (int t0 = 0; t0 < n_ctx; t0 += 8) {
    const int m = n_ctx - t0 < 8 ? n_ctx - t0 : 8;
    const T* keys[8];
    // Positions past n_ctx read position t0's row again: their sums are never stored.
    for (int p = 0; p < 8; ++p) keys[p] = cached_row<T>(a.k_blocks, a.block_tokens, t0 + (p < m ? p : 0), stride);
    for (int p = 0; p < 8 && t0 + 8 + p < n_ctx; ++p) {  // the next 8 keys, and these positions' values
      span.prefetch(cached_row<T>(a.k_blocks, a.block_tokens, t0 + 8 + p, stride));
    }
    for (int p = 0; p < m; ++p) span.prefetch(cached_row<T>(a.v_blocks, a.block_tokens, t0 + p, stride));
    for (int h = h0; h < h1; ++h) {
      const int kv_head = h / a.group;
      for (int r = 0; r < n; ++r) {
        const int row_m = rows[r].n_ctx - t0 < 8 ? rows[r].n_ctx - t0 : 8;  // this row's positions of the 8
        if (row_m <= 0) continue;
        const float* q = rows[r].q + static_cast<std::size_t>(h) * hs;
        __m256 s8[8];
#pragma GCC unroll 8
        for (int p = 0; p < 8; ++p) {
          const T* k = keys[p] + kv_head * hs;
          __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
#pragma GCC unroll 8
          for (int i = 0; i < R; ++i) {
            __m256 k_lo, k_hi;
            load_lanes(k + 16 * i, k_lo, k_hi);
            lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(q + 16 * i), k_lo));
            hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(q + 16 * i + 8), k_hi));
          }
          s8[p] = _mm256_add_ps(lo, hi);
        }
        __m256 scores = fold8x8(s8);
        if constexpr (sizeof(T) == 1) {  // int8: times each key row's scale for this head (scaled_by_row())
          float scale[8];
          for (int p = 0; p < 8; ++p) scale[p] = int8_row_scale(keys[p], a.kv_stride, kv_head);
          scores = _mm256_mul_ps(scores, _mm256_loadu_ps(scale));
        }
        scores = _mm256_mul_ps(scores, _mm256_set1_ps(a.inv_sqrt));
        float* out = rows[r].scratch + static_cast<std::size_t>(h) * rows[r].n_ctx + t0;
        if (row_m == 8) {
          _mm256_storeu_ps(out, scores);
        } else {
          const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
          _mm256_maskstore_ps(out, _mm256_cmpgt_epi32(_mm256_set1_epi32(row_m), lanes), scores);
        }
      }
    }
  }
}

// scores_by_8_positions() for heads of 16 R values, R up to 8; false (nothing done) for other heads.
template <typename T>
bool scores_by_8_positions(const AttentionHeads* rows, int n, int h0, int h1) {
  const int head_size = rows[0].head_size;
  if (head_size % 16 != 0) return false;
  switch (head_size / 16) {
    case 1: scores_by_8_positions<T, 1>(rows, n, h0, h1); return true;
    case 2: scores_by_8_positions<T, 2>(rows, n, h0, h1); return true;
    case 3: scores_by_8_positions<T, 3>(rows, n, h0, h1); return true;
    case 4: scores_by_8_positions<T, 4>(rows, n, h0, h1); return true;
    case 5: scores_by_8_positions<T, 5>(rows, n, h0, h1); return true;
    case 6: scores_by_8_positions<T, 6>(rows, n, h0, h1); return true;
    case 7: scores_by_8_positions<T, 7>(rows, n, h0, h1); return true;
    case 8: scores_by_8_positions<T, 8>(rows, n, h0, h1); return true;
    default: return false;
  }
}

// Attention of heads [h0, h1) of n query rows that share a cache (rows[r]), heads of whole slices, after
// their scores (scores_by_8_positions()): each row's softmax, then, kv head by kv head, the weighted sums of
// its heads' values for every row, 4, 2 or 1 a walk (the sums row by row, so that a GQA group's heads of one
// row walk together, and rows of one head otherwise) and a tile of positions at a time: the 16 rows of
// BM_AttentionRows over 1024 positions read a kv head's values from L3 once per tile instead of once per
// row and head, and took 1.6 ms instead of 3.1 row by row (BENCHMARKS.md, session 35).
template <typename T>
void attention_rows_by_8_positions(const AttentionHeads* rows, int n, int h0, int h1) {
  const AttentionHeads& a = rows[0];
  const int stride = row_stride(static_cast<const T*>(nullptr), a.kv_stride, a.head_size);
  for (int r = 0; r < n; ++r) {
    for (int h = h0; h < h1; ++h) softmax_row(rows[r].scratch + static_cast<std::size_t>(h) * rows[r].n_ctx, rows[r].n_ctx);
  }
  // One row (decode): its heads of a kv head 4, 2 or 1 a walk, straight over its context. Through the list
  // of sums and the tiles below, a 32-position attention took 3.34 us instead of 3.23 (session 35).
  if (n == 1) {
    for (int h = h0; h < h1;) {
      const int group_end = (h / a.group + 1) * a.group;  // `left` of h's kv head's heads are in [h, h1)
      const int left = (group_end < h1 ? group_end : h1) - h;
      const int take = left >= 4 ? 4 : left >= 2 ? 2 : 1;
      ValueSum heads[4];
      for (int j = 0; j < take; ++j) {
        heads[j] = {a.scratch + static_cast<std::size_t>(h + j) * a.n_ctx, a.out + static_cast<std::size_t>(h + j) * a.head_size};
      }
      switch (take) {
        case 4: weighted_sums_slices<T, 4>(a, h / a.group, stride, heads, 0, a.n_ctx, false); break;
        case 2: weighted_sums_slices<T, 2>(a, h / a.group, stride, heads, 0, a.n_ctx, false); break;
        default: weighted_sums_slices<T, 1>(a, h / a.group, stride, heads, 0, a.n_ctx, false); break;
      }
      h += take;
    }
    return;
  }
  constexpr int kMostSums = kMaxAttentionRows * 8;  // a walk's sums come 4 at a time from at most this many
  ValueSum sums[kMostSums];
  int n_ctx[kMostSums];
  for (int kv_head = h0 / a.group; kv_head * a.group < h1; ++kv_head) {
    const int begin = kv_head * a.group > h0 ? kv_head * a.group : h0;
    const int end = (kv_head + 1) * a.group < h1 ? (kv_head + 1) * a.group : h1;
    int count = 0;
    for (int r = 0; r < n; ++r) {
      for (int h = begin; h < end; ++h) {
        if (count == kMostSums) {
          weighted_sums_in_tiles<T>(a, kv_head, stride, sums, n_ctx, count);
          count = 0;
        }
        sums[count] = {rows[r].scratch + static_cast<std::size_t>(h) * rows[r].n_ctx,
                       rows[r].out + static_cast<std::size_t>(h) * a.head_size};
        n_ctx[count++] = rows[r].n_ctx;
      }
    }
    weighted_sums_in_tiles<T>(a, kv_head, stride, sums, n_ctx, count);
  }
}
#endif

template <typename T>
void attention_heads_of(const AttentionHeads& a, int h0, int h1) {
#ifdef SHARDLINE_ROW_KERNELS_AVX2
  if (scores_by_8_positions<T>(&a, 1, h0, h1)) {  // heads of whole slices: no tail
    attention_rows_by_8_positions<T>(&a, 1, h0, h1);
    return;
  }
#endif
  const int hs = a.head_size;
  // dot() in a lambda inlines into the position loop, where passed as a function GCC kept a call per position
  // and head (3% of a 32-position attention).
  const auto score = [](const float* q, const T* k, int n) { return dot<T>(q, k, n); };
  // A head's values in slices of kLanes outputs, each slice's sums kept in registers across the positions
  // (the last, narrower slice in out). Summed in out, every position waited on the previous one's stores: 40%
  // of a 32-position attention on AVX2 (session 33). Each output is still the sum over the positions in
  // order from zero: the same bits.
  const int stride = row_stride(static_cast<const T*>(nullptr), a.kv_stride, hs);
  const auto values = [&](float* out, const float* weights, int h) {
    const int kv_head = h / a.group, offset = kv_head * hs;
    const int i0 = hs / kLanes * kLanes;
    const ValueSum sum{weights, out};
    weighted_sums_slices<T, 1>(a, kv_head, stride, &sum, 0, a.n_ctx, false);
    if (i0 == hs) return;
    for (int i = i0; i < hs; ++i) out[i] = 0.0f;
    for_each_cached_row<T>(a.v_blocks, a.block_tokens, a.n_ctx, stride, [&](int t, const T* v_row) {
      add_weighted_row(out + i0, scaled_by_row(weights[t], v_row, a.kv_stride, kv_head), v_row + offset + i0, hs - i0);
    });
  };
  attention_heads_with<T>(a, h0, h1, score, softmax_row, values);
}

void attention_heads(const AttentionHeads& a, int h0, int h1) {
  switch (a.cached) {
    case CachedAs::kF16: attention_heads_of<std::uint16_t>(a, h0, h1); break;
    case CachedAs::kInt8: attention_heads_of<std::int8_t>(a, h0, h1); break;
    default: attention_heads_of<float>(a, h0, h1); break;
  }
}

#ifdef SHARDLINE_ROW_KERNELS_AVX2
template <typename T>
void attention_rows_of(const AttentionRows& a, int h0, int h1) {
  AttentionHeads rows[kMaxAttentionRows];
  rows[0] = a.first;
  for (int r = 1; r < a.rows; ++r) {
    rows[r] = a.first;
    rows[r].out += r * a.out_stride;
    rows[r].q += r * a.q_stride;
    rows[r].scratch += r * a.scratch_stride;
    rows[r].n_ctx += r;
  }
  if (scores_by_8_positions<T>(rows, a.rows, h0, h1)) {
    attention_rows_by_8_positions<T>(rows, a.rows, h0, h1);
    return;
  }
  for (int r = 0; r < a.rows; ++r) attention_heads_of<T>(rows[r], h0, h1);  // heads of a narrower slice
}

// The AVX2 build's attention of several rows (row_kernels.h AttentionRows).
void attention_rows(const AttentionRows& a, int h0, int h1) {
  switch (a.first.cached) {
    case CachedAs::kF16: attention_rows_of<std::uint16_t>(a, h0, h1); break;
    case CachedAs::kInt8: attention_rows_of<std::int8_t>(a, h0, h1); break;
    default: attention_rows_of<float>(a, h0, h1); break;
  }
}
#endif

// llama2.c recomputes the rotation per head; the values are identical for every head. Not vectorised: where
// the build may use FMA (the AVX-512 file, or a baseline built with -march=native), GCC 12's vectoriser
// fuses the alternating subtract/add of the pairs into VFMADDSUB despite -ffp-contract=off, which rounds
// once instead of twice. The AVX-512 build has its own kernel; this loop is the baseline's.
__attribute__((optimize("no-tree-loop-vectorize"))) void rope_rotate(float* vec, int n_heads, int head_size,
                                                                     const float* cos_sin, int i0, int i1) {
  for (int h = 0; h < n_heads; ++h) {
    float* head = vec + static_cast<std::size_t>(h) * head_size;
    for (int i = i0; i < i1; i += 2) {
      const float fcr = cos_sin[i - i0], fci = cos_sin[i - i0 + 1];
      const float v0 = head[i];
      const float v1 = head[i + 1];
      head[i] = v0 * fcr - v1 * fci;
      head[i + 1] = v0 * fci + v1 * fcr;
    }
  }
}

constexpr int kArgmaxBlock = 64;  // values argmax tests at once (a multiple of 16)

int argmax_row(const float* x, int size) {
  // llama2.c's scan (the first of equal maxima; a NaN never wins), 64 values at a time: a block is walked
  // one by one only when some value in it beats the best so far, which 16 independent running maxima tell
  // (a NaN never enters them). Over a vocabulary that happens a handful of times, so most values cost an
  // independent compare instead of one chained to the last (measured on 16 x 32000 logits: 1.6-1.7x faster
  // than the one-by-one loop).
  constexpr int kBlock = kArgmaxBlock;
  int best = 0;
  int i = 1;
  for (; i + kBlock <= size; i += kBlock) {
    const float best_value = x[best];
    float lane[kLanes];
    for (int l = 0; l < kLanes; ++l) lane[l] = best_value;
    for (int j = 0; j < kBlock; j += kLanes) {
      for (int l = 0; l < kLanes; ++l) lane[l] = x[i + j + l] > lane[l] ? x[i + j + l] : lane[l];
    }
    bool beaten = false;
    for (int l = 0; l < kLanes; ++l) beaten |= lane[l] > best_value;
    if (!beaten) continue;
    for (int l = 0; l < kBlock; ++l) {
      if (x[i + l] > x[best]) best = i + l;
    }
  }
  for (; i < size; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

void fold_max(const float* x, int n, int first, RowMax& max) {
  for (int i = 0; i < n; ++i) {
    if (x[i] != x[i]) {  // a NaN: never greater, nor equal to itself
      max.nan = true;
    } else if (x[i] > max.value || max.index < 0) {
      max.value = x[i];
      max.index = first + i;
    }
  }
}

// fold_max() kLanes values at a time, as the AVX-512 build's fold_max_avx512(): one independent compare a
// value tells whether any in the block beats the maximum so far or is a NaN (!(x <= max) holds for both),
// and only then does fold_max() walk the block one by one. A classifier's rows come here a tile at a time,
// and a handful of their values ever win; one by one, each value's compare and branch waited on the last
// (3% of a 15M fp32 batch-16 decode on AVX2, session 33). Before the first value (no index yet) and in the
// tail, fold_max() itself.
void fold_max_in_blocks(const float* x, int n, int first, RowMax& max) {
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if (max.index < 0) {
      fold_max(x + i, kLanes, first + i, max);
      continue;
    }
    const float best = max.value;
    std::uint32_t wins = 0;  // an integer, not a bool |=, so the loop vectorises
    // Not unrolled: GCC 12 unrolls a short loop inside another before vectorising, and its straight-line
    // vectoriser leaves an or-reduction of 16 compares scalar.
#pragma GCC unroll 1
    for (int l = 0; l < kLanes; ++l) wins |= static_cast<std::uint32_t>(!(x[i + l] <= best));
    if (wins != 0) fold_max(x + i, kLanes, first + i, max);
  }
  fold_max(x + i, n - i, first + i, max);
}

RowKernels row_kernels() {
  return {quantize_int8_row, split_bf16_row, attention_heads, rope_rotate, to_half_row, from_half_row, to_int8_kv_row,
          from_int8_kv_row, softmax_row, silu_mul, add_row, argmax_row, fold_max_in_blocks};
}
