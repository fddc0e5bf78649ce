#include <cmath>

#include "kernels/cpu/ops.h"

namespace shardline::kernels::cpu {

void rmsnorm(float* out, const float* x, const float* weight, int n, int dim, float eps) {
  // Rows are independent (a batch's rows go to the kernel threads); within a row the sum of squares keeps
  // llama2.c's order.
  const int n_threads = num_threads();
#pragma omp parallel for num_threads(n_threads) if (n_threads > 1 && n > 1)
  for (int r = 0; r < n; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * dim;
    float* outr = out + static_cast<std::size_t>(r) * dim;
    float ss = 0.0f;
    for (int j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    ss /= static_cast<float>(dim);
    ss += eps;
    const float scale = 1.0f / std::sqrt(ss);
    for (int j = 0; j < dim; ++j) outr[j] = weight[j] * (scale * xr[j]);
  }
}

void rope(float* vec, int n_heads, int head_size, int pos, float theta_base) {
  // Same arithmetic as llama2.c: frequency from the index within the head, float powf/cosf/sinf. The
  // rotation depends on (pos, i) only, so it is computed once per pair index and applied to every head
  // (llama2.c recomputes it per head; the values are identical).
  for (int i = 0; i < head_size; i += 2) {
    const float freq = 1.0f / std::pow(theta_base, static_cast<float>(i) / static_cast<float>(head_size));
    const float angle = static_cast<float>(pos) * freq;
    const float fcr = std::cos(angle);
    const float fci = std::sin(angle);
    for (int h = 0; h < n_heads; ++h) {
      float* head = vec + static_cast<std::size_t>(h) * head_size;
      const float v0 = head[i];
      const float v1 = head[i + 1];
      head[i] = v0 * fcr - v1 * fci;
      head[i + 1] = v0 * fci + v1 * fcr;
    }
  }
}

void softmax(float* x, int size) {
  float max_val = x[0];
  for (int i = 1; i < size; ++i) max_val = x[i] > max_val ? x[i] : max_val;
  float sum = 0.0f;
  for (int i = 0; i < size; ++i) {
    x[i] = std::exp(x[i] - max_val);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < size; ++i) x[i] *= inv;
}

void swiglu(float* h1, const float* h3, int size) {
  for (int i = 0; i < size; ++i) {
    const float v = h1[i];
    h1[i] = v * (1.0f / (1.0f + std::exp(-v))) * h3[i];
  }
}

void add_inplace(float* y, const float* x, int size) {
  for (int i = 0; i < size; ++i) y[i] += x[i];
}

int argmax(const float* x, int size) {
  int best = 0;
  for (int i = 1; i < size; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

}  // namespace shardline::kernels::cpu
