// The row kernels compiled for AVX-512 F/BW/VL/DQ (see kernels/CMakeLists.txt), called only on CPUs that
// have it: the generic bf16 split vectorised by the compiler, and intrinsics for the int8 quantisation,
// attention, RoPE, softmax and the SwiGLU gate.
#include <immintrin.h>

#include "kernels/cpu/row_kernels.h"

namespace shardline::kernels::cpu::row {

namespace {
#include "kernels/cpu/row_kernels_generic.inl"

// fold_lanes() in registers: lane l gets lane l + 8, then l + 4, l + 2, l + 1 (float addition commutes
// exactly).
inline float fold16(__m512 partial) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(partial), _mm512_extractf32x8_ps(partial, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// 16 cached values as floats: an fp16 cache's through VCVTPH2PS (exact, as from_half()).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const std::uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// An int8 cache's codes, sign-extended and converted (exact, as cached_value()).
inline __m512 load16(const std::int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <typename T>
float dot16(const float* q, const T* k, int n) {
  __m512 partial = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    partial = _mm512_add_ps(partial, _mm512_mul_ps(_mm512_loadu_ps(q + i), load16(k + i)));
  }
  return fold16(partial);
}

// exp_kernel() on 16 lanes, operation for operation (the clamp differs only for NaN, which is put back).
__m512 exp16(__m512 x) {
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512 c = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax));
  const __m512 shift = _mm512_set1_ps(kRoundShift);  // round_to_nearest_even()
  const __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(c, _mm512_set1_ps(kLog2e)), shift), shift);
  __m512 r = _mm512_sub_ps(c, _mm512_mul_ps(n, _mm512_set1_ps(kLn2Hi)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(kLn2Lo)));
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < kExpTerms; ++i) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kExpPoly[i]));
  const __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_cvttps_epi32(n);
  const __m512i e1 = _mm512_srai_epi32(e, 1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 pow1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e1, bias), 23));
  const __m512 pow2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(e, e1), bias), 23));
  return _mm512_mask_blend_ps(nan, _mm512_mul_ps(_mm512_mul_ps(y, pow1), pow2), x);
}

// The first n of 16 lanes (all of them from n = 16 on; n >= 1).
inline __mmask16 first_lanes(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

// softmax_row(): the maximum is exact in any order (lane maxima), the sum's 16 partial sums are dot()'s.
void softmax_avx512(float* x, int n) {
  __m512 lane_max = _mm512_set1_ps(x[0]);
  for (int i = 0; i < n; i += 16) {
    const __m512 v = _mm512_mask_loadu_ps(lane_max, first_lanes(n - i), x + i);
    lane_max = _mm512_max_ps(v, lane_max);
  }
  const __m512 max_val = _mm512_set1_ps(_mm512_reduce_max_ps(lane_max));
  __m512 partial = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = first_lanes(n - i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + i), max_val));
    _mm512_mask_storeu_ps(x + i, lanes, e);
    partial = _mm512_mask_add_ps(partial, lanes, partial, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / fold16(partial));
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = first_lanes(n - i);
    _mm512_mask_storeu_ps(x + i, lanes, _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, x + i), inv));
  }
}

void silu_mul_avx512(float* h, const float* u, int n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = first_lanes(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(lanes, h + i);
    const __m512 gate = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_xor_ps(g, sign))));
    _mm512_mask_storeu_ps(h + i, lanes, _mm512_mul_ps(_mm512_mul_ps(g, gate), _mm512_maskz_loadu_ps(lanes, u + i)));
  }
}

// The largest of 16 lanes folded as group_amax() folds them (lane l with l + 8, then l + 4, l + 2, l + 1,
// each as max_of(a, b) = a > b ? a : b, which is what MAXPS computes): the same value, NaN included, where
// _mm512_reduce_max_ps's order could pick another.
inline float fold_max16(__m512 m) {
  const __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(m), _mm512_extractf32x8_ps(m, 1));
  const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
}

inline __m512 abs16(__m512 x) { return _mm512_and_ps(x, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff))); }

// int8_code() of 16 values: round to nearest even by the 1.5 * 2^23 shift, clamp (MAXPS returns its second
// operand for a NaN: -127, as the generic clamp), truncate.
inline __m512i int8_codes16(__m512 x, __m512 inv) {
  const __m512 shift = _mm512_set1_ps(kRoundShift);
  const __m512 c = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, inv), shift), shift);
  return _mm512_cvttps_epi32(_mm512_min_ps(_mm512_max_ps(c, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f)));
}

// quantize_int8_row() 16 values at a time: the group's max |x| in group_amax()'s order, the codes by
// int8_codes16(), and the code sum an exact integer sum. The compiled generic loop copied each group to the stack and back (measured: the
// quantisation of a batch-16 step's activations went from 0.6 to 0.2 ms on the 110M shape).
void quantize_int8_row_avx512(const float* x, int k, int kp, int group, std::int8_t* q, float* scales,
                              std::int32_t* sums) {
  auto load = [&](int j) {  // x[j .. j + 16), zero from k on (the padding of the last group)
    return j < k ? _mm512_maskz_loadu_ps(first_lanes(k - j), x + j) : _mm512_setzero_ps();
  };
  const __m512 largest = _mm512_set1_ps(__FLT_MAX__);
  for (int g = 0, j0 = 0; j0 < kp; ++g, j0 += group) {
    __m512 amax = _mm512_setzero_ps();
    __mmask16 not_finite = 0;  // |x| > FLT_MAX or unordered: Inf or NaN (quantize_int8_row's NaN scale)
    for (int i = 0; i < group; i += 16) {
      const __m512 magnitude = abs16(load(j0 + i));
      amax = _mm512_max_ps(amax, magnitude);
      not_finite |= _mm512_cmp_ps_mask(magnitude, largest, _CMP_NLE_UQ);
    }
    const float group_max = fold_max16(amax);
    const __m512 inv = _mm512_set1_ps(group_max > 0.0f ? 127.0f / group_max : 0.0f);
    __m512i sum = _mm512_setzero_si512();
    for (int i = 0; i < group; i += 16) {
      const __m512i code = int8_codes16(load(j0 + i), inv);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j0 + i), _mm512_cvtepi32_epi8(code));
      sum = _mm512_add_epi32(sum, code);
    }
    scales[g] = not_finite == 0 ? group_max / 127.0f : __builtin_nanf("");
    sums[g] = _mm512_reduce_add_epi32(sum);
  }
}

constexpr int kValueRegisters = 4;  // 64 floats of a head's output per pass over the positions

// fold16() of 16 vectors at once: lane p of the result is fold16(v[fold_slot(p)]), bit for bit. It is the
// same tree of additions (lane l with l + 8, then l + 4, l + 2, l + 1), done two vectors at a time with
// shuffles that pair their halves, quarters, pairs and single lanes: 15 additions and 30 shuffles for 16
// sums, where 16 fold16() take 64 of each, each waiting on its own chain. The tree leaves the sum of slot s
// in lane 4 (s % 4) + s / 4, so callers put position p's vector in slot fold_slot(p) (its own inverse).
constexpr int fold_slot(int p) { return 4 * (p % 4) + p / 4; }

inline __m512 fold16x16(const __m512 (&v)[16]) {
  __m512 halves[8], quarters[4], pairs[2];
  for (int i = 0; i < 8; ++i) {  // lane l < 8 of each vector + lane l + 8
    halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 4; ++i) {  // + lane l + 4
    quarters[i] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_f32x4(halves[2 * i], halves[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  for (int i = 0; i < 2; ++i) {  // + lane l + 2
    pairs[i] = _mm512_add_ps(_mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(quarters[2 * i], quarters[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  return _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),  // + lane l + 1
                       _mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// The scores of heads [h0, h1) over all positions, 16 positions at a time: per head, the 16 positions' dot
// products (dot16()'s partial sums, with the head's R registers of q kept across them) folded together by
// fold16x16(), then scaled as attention_heads_with() scales a score. The same bits as its position-by-
// position loop, with about 40% fewer instructions per score and 16 independent sums in flight.
template <typename T, int R>
void scores_by_16_positions(const AttentionHeads& a, int h0, int h1) {
  constexpr int hs = 16 * R;
  const int n_ctx = a.n_ctx;
  const int stride = row_stride(static_cast<const T*>(nullptr), a.kv_stride, hs);
  static const T zeros[hs] = {};  // the row of a position past n_ctx: its sum is never stored
  const HeadSpan<T> span(a, h0, h1);
  for (int p = 0; p < 16 && p < n_ctx; ++p) span.prefetch(cached_row<T>(a.k_blocks, a.block_tokens, p, stride));
  for (int t0 = 0; t0 < n_ctx; t0 += 16) {
    const int m = n_ctx - t0 < 16 ? n_ctx - t0 : 16;
    const T* rows[16];
    for (int p = 0; p < 16; ++p) rows[p] = p < m ? cached_row<T>(a.k_blocks, a.block_tokens, t0 + p, stride) : nullptr;
    for (int p = 0; p < 16 && t0 + 16 + p < n_ctx; ++p) {  // the next 16 keys, and these positions' values
      span.prefetch(cached_row<T>(a.k_blocks, a.block_tokens, t0 + 16 + p, stride));
    }
    for (int p = 0; p < m; ++p) span.prefetch(cached_row<T>(a.v_blocks, a.block_tokens, t0 + p, stride));
    for (int h = h0; h < h1; ++h) {
      const int kv_head = h / a.group;
      __m512 q[R];
      for (int i = 0; i < R; ++i) q[i] = _mm512_loadu_ps(a.q + static_cast<std::size_t>(h) * hs + 16 * i);
      __m512 partial[16];
#pragma GCC unroll 16
      for (int p = 0; p < 16; ++p) {
        const T* k = rows[p] != nullptr ? rows[p] + kv_head * hs : zeros;
        __m512 sum = _mm512_setzero_ps();
        for (int i = 0; i < R; ++i) sum = _mm512_add_ps(sum, _mm512_mul_ps(q[i], load16(k + 16 * i)));
        partial[fold_slot(p)] = sum;
      }
      __m512 scores = fold16x16(partial);
      if constexpr (sizeof(T) == 1) {  // int8: times each key row's scale for this head (scaled_by_row())
        alignas(64) float scale[16];
        for (int p = 0; p < 16; ++p) scale[p] = p < m ? int8_row_scale(rows[p], a.kv_stride, kv_head) : 1.0f;
        scores = _mm512_mul_ps(scores, _mm512_load_ps(scale));
      }
      scores = _mm512_mul_ps(scores, _mm512_set1_ps(a.inv_sqrt));
      _mm512_mask_storeu_ps(a.scratch + static_cast<std::size_t>(h) * n_ctx + t0, first_lanes(m), scores);
    }
  }
}

// Values [i0, i0 + 16 R) of one head's weighted sum over the positions (attention_heads_avx512_of()), in R
// registers. R is a template argument so the accumulators stay in registers: with a run-time count (a head of
// 48 values takes 3 of the 4) GCC kept them on the stack, and every position's additions waited on a store
// and a reload of each.
template <typename T, int R>
void value_sum(const AttentionHeads& a, float* out, const float* weights, int h, int i0, int stride) {
  const int kv_head = h / a.group;
  const int offset = kv_head * a.head_size + i0;
  __m512 acc[R];
  for (int j = 0; j < R; ++j) acc[j] = _mm512_setzero_ps();
  for_each_cached_row<T>(a.v_blocks, a.block_tokens, a.n_ctx, stride, [&](int t, const T* v_row) {
    const __m512 weight = _mm512_set1_ps(scaled_by_row(weights[t], v_row, a.kv_stride, kv_head));
    const T* v = v_row + offset;
    for (int j = 0; j < R; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(weight, load16(v + 16 * j)));
  });
  for (int j = 0; j < R; ++j) _mm512_storeu_ps(out + i0 + 16 * j, acc[j]);
}

// Attention for head sizes that are a multiple of 16, operation for operation the generic dot() and value
// sum, with the compiler's bookkeeping taken out of the way: the compiled generic dot() folded its 16
// partial sums through the stack (a store, then narrower loads that wait for it) for every position and
// head, and the value sum loaded and stored a head's output for every position. That made attention
// arithmetic-bound at about 100 cycles per position and head. Here the scores go 16 positions at a time
// (scores_by_16_positions(), heads of up to 128) and a head's output is up to four accumulators (64
// floats) per pass over the positions. (Two heads' values at a time, 8 accumulators, measured no faster.)
template <typename T>
void attention_heads_avx512_of(const AttentionHeads& a, int h0, int h1) {
  const int hs = a.head_size;
  const int stride = row_stride(static_cast<const T*>(nullptr), a.kv_stride, hs);
  auto values = [&](float* out, const float* weights, int h) {
    for (int i0 = 0; i0 < hs; i0 += 16 * kValueRegisters) {
      switch ((hs - i0) / 16 < kValueRegisters ? (hs - i0) / 16 : kValueRegisters) {
        case 1: value_sum<T, 1>(a, out, weights, h, i0, stride); break;
        case 2: value_sum<T, 2>(a, out, weights, h, i0, stride); break;
        case 3: value_sum<T, 3>(a, out, weights, h, i0, stride); break;
        default: value_sum<T, kValueRegisters>(a, out, weights, h, i0, stride); break;
      }
    }
  };
  switch (hs / 16) {
    case 1: scores_by_16_positions<T, 1>(a, h0, h1); break;
    case 2: scores_by_16_positions<T, 2>(a, h0, h1); break;
    case 3: scores_by_16_positions<T, 3>(a, h0, h1); break;
    case 4: scores_by_16_positions<T, 4>(a, h0, h1); break;
    case 5: scores_by_16_positions<T, 5>(a, h0, h1); break;
    case 6: scores_by_16_positions<T, 6>(a, h0, h1); break;
    case 7: scores_by_16_positions<T, 7>(a, h0, h1); break;
    case 8: scores_by_16_positions<T, 8>(a, h0, h1); break;
    default:
      attention_heads_with<T>(a, h0, h1, dot16<T>, softmax_avx512, values);
      return;
  }
  softmax_and_values(a, h0, h1, softmax_avx512, values);
}

void attention_heads_avx512(const AttentionHeads& a, int h0, int h1) {
  if (a.head_size % 16 != 0) {
    attention_heads(a, h0, h1);
    return;
  }
  switch (a.cached) {
    case CachedAs::kF16: attention_heads_avx512_of<std::uint16_t>(a, h0, h1); break;
    case CachedAs::kInt8: attention_heads_avx512_of<std::int8_t>(a, h0, h1); break;
    default: attention_heads_avx512_of<float>(a, h0, h1); break;
  }
}

// to_int8_kv_row() 16 values at a time for heads of a multiple of 16 (others take the generic loop), as
// quantize_int8_row_avx512() does a group.
void to_int8_kv_row_avx512(const float* x, int n, int head_size, void* row) {
  if (head_size % 16 != 0) {
    to_int8_kv_row(x, n, head_size, row);
    return;
  }
  std::int8_t* codes = static_cast<std::int8_t*>(row);
  for (int h = 0, j0 = 0; j0 < n; ++h, j0 += head_size) {
    __m512 amax = _mm512_setzero_ps();
    __mmask16 not_finite = 0;
    for (int i = 0; i < head_size; i += 16) {
      const __m512 magnitude = abs16(_mm512_loadu_ps(x + j0 + i));
      amax = _mm512_max_ps(amax, magnitude);
      not_finite |= _mm512_cmp_ps_mask(magnitude, _mm512_set1_ps(__FLT_MAX__), _CMP_NLE_UQ);
    }
    const float head_max = fold_max16(amax);
    const __m512 inv = _mm512_set1_ps(head_max > 0.0f ? 127.0f / head_max : 0.0f);
    for (int i = 0; i < head_size; i += 16) {
      const __m512i code = int8_codes16(_mm512_loadu_ps(x + j0 + i), inv);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + j0 + i), _mm512_cvtepi32_epi8(code));
    }
    set_int8_row_scale(codes, n, h, not_finite == 0 ? head_max / 127.0f : __builtin_nanf(""));
  }
}

// to_half_row() and from_half_row() through F16C's conversions (AVX-512 F forms), which the generic code
// computes bit for bit; the tail is masked.
void to_half_row_avx512(const float* x, int n, std::uint16_t* h) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = first_lanes(n - i);
    const __m256i half = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(lanes, x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(h + i, lanes, half);
  }
}

void from_half_row_avx512(const std::uint16_t* h, int n, float* x) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = first_lanes(n - i);
    _mm512_mask_storeu_ps(x + i, lanes, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, h + i)));
  }
}

// rope_rotate on 8 pairs per instruction: with C = (c0, c0, c1, c1, ...) and S = (-s0, s0, -s1, s1, ...),
// out = v * C + swap_pairs(v) * S gives v0 c - v1 s and v1 c + v0 s, the generic expressions bit for bit
// (a - b is a + (-b), and addition commutes). The compiled generic loop stayed scalar (pairs interleave).
// A head's last pairs go through a masked vector too, not the generic loop (which GCC 12 would fuse into
// VFMADDSUB here despite -ffp-contract=off, were it vectorised: see rope_rotate in the generic file).
void rope_rotate_avx512(float* vec, int n_heads, int head_size, const float* cos_sin, int i0, int i1) {
  const __m512 negate_even = _mm512_castsi512_ps(_mm512_set4_epi32(0, static_cast<int>(0x80000000u), 0,
                                                                   static_cast<int>(0x80000000u)));
  for (int h = 0; h < n_heads; ++h) {
    float* head = vec + static_cast<std::size_t>(h) * head_size;
    for (int i = i0; i < i1; i += 16) {
      const __mmask16 lanes = first_lanes(i1 - i);
      const __m512 angles = _mm512_maskz_loadu_ps(lanes, cos_sin + (i - i0));
      const __m512 c = _mm512_moveldup_ps(angles);
      const __m512 s = _mm512_xor_ps(_mm512_movehdup_ps(angles), negate_even);
      const __m512 v = _mm512_maskz_loadu_ps(lanes, head + i);
      const __m512 swapped = _mm512_permute_ps(v, 0xB1);  // (v1, v0, v3, v2, ...)
      _mm512_mask_storeu_ps(head + i, lanes, _mm512_add_ps(_mm512_mul_ps(v, c), _mm512_mul_ps(swapped, s)));
    }
  }
}

// argmax_row() with the block test as four mask compares: a block of 64 is walked one by one only when
// some value is greater than the best so far (an ordered compare: a NaN is never greater, as in the scan).
// The compiled generic block test cost about 1.5 cycles per logit (measured 128 us for 16 x 32000 on one
// thread).
int argmax_avx512(const float* x, int n) {
  int best = 0;
  int i = 1;
  for (; i + kArgmaxBlock <= n; i += kArgmaxBlock) {
    const __m512 best_value = _mm512_set1_ps(x[best]);
    __mmask16 beaten = 0;
    for (int j = 0; j < kArgmaxBlock; j += 16) {
      beaten |= _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i + j), best_value, _CMP_GT_OQ);
    }
    if (beaten == 0) continue;
    for (int l = 0; l < kArgmaxBlock; ++l) {
      if (x[i + l] > x[best]) best = i + l;
    }
  }
  for (; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// fold_max() 16 values at a time: a mask compare tells whether any beats the maximum so far (or, before
// the first, whether any is no NaN), and only then does the generic fold walk them one by one. A classifier's
// tile rows come here: 64 values each, a handful of which ever win.
void fold_max_avx512(const float* x, int n, int first, RowMax& max) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 lanes = first_lanes(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(lanes, x + i);
    const __mmask16 wins = max.index < 0 ? _mm512_mask_cmp_ps_mask(lanes, v, v, _CMP_ORD_Q)
                                         : _mm512_mask_cmp_ps_mask(lanes, v, _mm512_set1_ps(max.value), _CMP_GT_OQ);
    if (_mm512_mask_cmp_ps_mask(lanes, v, v, _CMP_UNORD_Q) != 0) max.nan = true;
    if (wins != 0) fold_max(x + i, n - i >= 16 ? 16 : n - i, first + i, max);
  }
}

}  // namespace

RowKernels avx512_row_kernels() {
  RowKernels kernels = row_kernels();
  kernels.attention_heads = attention_heads_avx512;
  kernels.quantize_int8 = quantize_int8_row_avx512;
  kernels.rope_rotate = rope_rotate_avx512;
  kernels.to_half = to_half_row_avx512;
  kernels.from_half = from_half_row_avx512;
  kernels.to_int8_kv = to_int8_kv_row_avx512;
  kernels.softmax = softmax_avx512;
  kernels.silu_mul = silu_mul_avx512;
  kernels.argmax = argmax_avx512;
  kernels.fold_max = fold_max_avx512;
  return kernels;
}

}  // namespace shardline::kernels::cpu::row
