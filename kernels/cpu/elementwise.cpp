#include <omp.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/row_kernels.h"

namespace shardline::kernels::cpu {

namespace {

// Rows whose sums of squares run side by side: each row's sum is one chain of dependent adds in llama2.c's
// order (4 cycles apiece), and a batch's rows give independent chains to overlap. Bits are unchanged.
constexpr int kRmsnormChains = 8;

// The scale of a row whose float sum of squares overflowed (finite values beyond about 1.8e19 / sqrt(dim),
// from a damaged weight or activations that grew without bound): float's 1 / sqrt(inf) is 0, which zeroed the
// row, every logit after it, and gave token 0 with no NaN for the pipeline's check to see. In double the
// sum is exact enough and the row normalises as it should. Rows of ordinary size never come here, so their
// bits stay llama2.c's. A row holding Inf or NaN keeps float's result (NaN), which the pipeline warns of.
float overflowed_rms_scale(const float* x, int dim, float eps) {
  double ss = 0.0;
  for (int j = 0; j < dim; ++j) ss += static_cast<double>(x[j]) * x[j];
  if (!std::isfinite(ss)) return 0.0f;
  return static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
}

template <int R>
void rmsnorm_rows(float* out, const float* x, const float* weight, int dim, float eps) {
  float ss[R] = {};
  for (int j = 0; j < dim; ++j) {
    for (int r = 0; r < R; ++r) {
      const float v = x[static_cast<std::size_t>(r) * dim + j];
      ss[r] += v * v;
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * dim;
    float* outr = out + static_cast<std::size_t>(r) * dim;
    float mean = ss[r] / static_cast<float>(dim);
    mean += eps;
    const float scale = std::isinf(ss[r]) ? overflowed_rms_scale(xr, dim, eps) : 1.0f / std::sqrt(mean);
    for (int j = 0; j < dim; ++j) outr[j] = weight[j] * (scale * xr[j]);
  }
}

template <int... R>
void rmsnorm_rows(int rows, float* out, const float* x, const float* weight, int dim, float eps,
                  std::integer_sequence<int, R...>) {
  ((rows == R + 1 ? rmsnorm_rows<R + 1>(out, x, weight, dim, eps) : void()), ...);
}

}  // namespace

void rmsnorm_serial(float* out, const float* x, const float* weight, int n, int dim, float eps) {
  for (int r = 0; r < n; r += kRmsnormChains) {
    const std::size_t at = static_cast<std::size_t>(r) * dim;
    rmsnorm_rows(std::min(kRmsnormChains, n - r), out + at, x + at, weight, dim, eps,
                 std::make_integer_sequence<int, kRmsnormChains>());
  }
}

void rmsnorm(float* out, const float* x, const float* weight, int n, int dim, float eps) {
  // Rows are independent (a batch's rows go to the kernel threads, in runs of up to kRmsnormChains); within
  // a row the sum of squares keeps llama2.c's order.
  if (!open_parallel_region(n > 1)) {
    rmsnorm_serial(out, x, weight, n, dim, eps);
    return;
  }
  const int n_threads = num_threads();
  const int chunks = std::max((n + kRmsnormChains - 1) / kRmsnormChains, std::min(n, n_threads));
#pragma omp parallel for num_threads(n_threads)
  for (int c = 0; c < chunks; ++c) {
    const int r0 = static_cast<int>(static_cast<long>(n) * c / chunks);
    const int r1 = static_cast<int>(static_cast<long>(n) * (c + 1) / chunks);
    const std::size_t at = static_cast<std::size_t>(r0) * dim;
    rmsnorm_serial(out + at, x + at, weight, r1 - r0, dim, eps);
  }
}

namespace {

// Same arithmetic as llama2.c: the frequency from the index within the head, float powf/cosf/sinf. Pairs
// [i0, i1) (i counts floats, even); cos_sin[0] is pair i0's cosine. Pair p's angle is divided by
// freq_divisors[p] where given (as ggml divides by a model's rope_freqs).
void pair_angles(float* cos_sin, int head_size, int pos, float theta_base, int i0, int i1,
                 const float* freq_divisors = nullptr) {
  for (int i = i0; i < i1; i += 2) {
    const float freq = 1.0f / std::pow(theta_base, static_cast<float>(i) / static_cast<float>(head_size));
    float angle = static_cast<float>(pos) * freq;
    if (freq_divisors != nullptr) angle /= freq_divisors[i / 2];
    cos_sin[i - i0] = std::cos(angle);
    cos_sin[i - i0 + 1] = std::sin(angle);
  }
}

}  // namespace

void rope_angles(float* cos_sin, int head_size, int pos, float theta_base, const float* freq_divisors) {
  pair_angles(cos_sin, head_size, pos, theta_base, 0, head_size, freq_divisors);
}

void rope_rotate(float* vec, int n_heads, int head_size, const float* cos_sin) {
  row::active_row_kernels().rope_rotate(vec, n_heads, head_size, cos_sin, 0, head_size);
}

void rope(float* vec, int n_heads, int head_size, int pos, float theta_base) {
  constexpr int kChunk = 256;  // floats of angles on the stack at a time (kernels never allocate)
  float cos_sin[kChunk];
  const row::RopeRotate rotate = row::active_row_kernels().rope_rotate;
  for (int i0 = 0; i0 < head_size; i0 += kChunk) {
    const int i1 = head_size - i0 < kChunk ? head_size : i0 + kChunk;
    pair_angles(cos_sin, head_size, pos, theta_base, i0, i1);
    rotate(vec, n_heads, head_size, cos_sin, i0, i1);
  }
}

void softmax(float* x, int size) { row::active_row_kernels().softmax(x, size); }

void swiglu(float* h1, const float* h3, int size) { row::active_row_kernels().silu_mul(h1, h3, size); }

void add_inplace(float* y, const float* x, int size) {
  // A batch's residual (rows x dim) is split over the kernel threads; one row stays on the caller's, and so
  // does a call from inside a parallel pass (matmul_segments' folds, a tile at a time).
  constexpr int kMinParallelValues = 8192;
  const row::AddRow add = row::active_row_kernels().add;
  if (!open_parallel_region(size >= kMinParallelValues)) {
    add(y, x, size);
    return;
  }
#pragma omp parallel num_threads(num_threads())
  {
    const Band band = thread_band(size, omp_get_thread_num(), omp_get_num_threads());
    add(y + band.begin, x + band.begin, band.end - band.begin);
  }
}

int argmax(const float* x, int size) { return row::active_row_kernels().argmax(x, size); }

}  // namespace shardline::kernels::cpu
