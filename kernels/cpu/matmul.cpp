#include <omp.h>

#include "kernels/cpu/ops.h"

namespace shardline::kernels::cpu {

namespace {

// The dot products are the whole cost of decode. target_clones builds one copy per ISA and the loader
// picks the best for this CPU, so one binary runs at full width on AVX-512 machines and still runs on
// older ones. Eight independent accumulators let the compiler keep several FMA chains in flight.
[[gnu::target_clones("avx512f", "avx2,fma", "default")]]
void dot_rows(float* y, const float* x, const float* w, int k, int d_begin, int d_end) {
  for (int i = d_begin; i < d_end; ++i) {
    const float* row = w + static_cast<std::size_t>(i) * k;
    float acc[16] = {};
    int j = 0;
    for (; j + 16 <= k; j += 16) {
#pragma GCC unroll 16
      for (int l = 0; l < 16; ++l) acc[l] += row[j + l] * x[j + l];
    }
    float sum = 0.0f;
    for (; j < k; ++j) sum += row[j] * x[j];
    for (int l = 0; l < 16; ++l) sum += acc[l];
    y[i] = sum;
  }
}

// Prefill: several input rows share each weight row while it is in cache (4 rows of x per pass).
[[gnu::target_clones("avx512f", "avx2,fma", "default")]]
void dot_rows_x4(float* y, const float* x, const float* w, int k, int d, int d_begin, int d_end) {
  const float* x0 = x;
  const float* x1 = x + k;
  const float* x2 = x + 2 * static_cast<std::size_t>(k);
  const float* x3 = x + 3 * static_cast<std::size_t>(k);
  for (int i = d_begin; i < d_end; ++i) {
    const float* row = w + static_cast<std::size_t>(i) * k;
    float a0[16] = {}, a1[16] = {}, a2[16] = {}, a3[16] = {};
    int j = 0;
    for (; j + 16 <= k; j += 16) {
// omp simd, not a full unroll: unrolling the lane loop makes GCC vectorise across j and shuffle.
#pragma omp simd
      for (int l = 0; l < 16; ++l) {
        float wv = row[j + l];
        a0[l] += wv * x0[j + l];
        a1[l] += wv * x1[j + l];
        a2[l] += wv * x2[j + l];
        a3[l] += wv * x3[j + l];
      }
    }
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (; j < k; ++j) {
      s0 += row[j] * x0[j];
      s1 += row[j] * x1[j];
      s2 += row[j] * x2[j];
      s3 += row[j] * x3[j];
    }
    for (int l = 0; l < 16; ++l) {
      s0 += a0[l];
      s1 += a1[l];
      s2 += a2[l];
      s3 += a3[l];
    }
    y[i] = s0;
    y[d + i] = s1;
    y[2 * static_cast<std::size_t>(d) + i] = s2;
    y[3 * static_cast<std::size_t>(d) + i] = s3;
  }
}

}  // namespace

void matmul(float* y, const float* x, const float* w, int n, int k, int d) {
  // Threads split the output features: each thread streams a disjoint band of W, which is what a
  // bandwidth-bound GEMV wants. Static bands are deterministic, so results do not depend on timing.
  const int n_threads = num_threads();
#pragma omp parallel num_threads(n_threads) if (n_threads > 1 && static_cast<long>(d) * k * n > 32768)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    const int chunk = (d + nt - 1) / nt;
    const int d_begin = t * chunk;
    const int d_end = d_begin + chunk < d ? d_begin + chunk : d;
    if (d_begin < d_end) {
      int r = 0;
      for (; r + 4 <= n; r += 4) {
        dot_rows_x4(y + static_cast<std::size_t>(r) * d, x + static_cast<std::size_t>(r) * k, w, k, d,
                    d_begin, d_end);
      }
      for (; r < n; ++r) {
        dot_rows(y + static_cast<std::size_t>(r) * d, x + static_cast<std::size_t>(r) * k, w, k, d_begin,
                 d_end);
      }
    }
  }
}

}  // namespace shardline::kernels::cpu
