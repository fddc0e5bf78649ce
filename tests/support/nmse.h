// Normalised mean squared error, the measure every kernel test compares results with (as ggml's
// test-backend-ops does): NMSE = Σ(got - want)² / Σ want², summed in double.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include <gtest/gtest.h>

namespace shardline::test {

// Tolerance for a float kernel against a double reference. float's unit roundoff is u ≈ 6e-8. A sum of k
// random-signed products accumulated in float has a relative error that grows like sqrt(k)·u at worst, so
// NMSE ≈ k·u²: about 7e-12 at k = 2048, the largest model dimension in the kernel tests (partial sums make
// it smaller still). Measured values run from 1e-16 to 3e-11. 1e-10 leaves headroom for that, while any
// real mistake (a dropped tail element, a wrong kv head, a row read with the wrong stride) costs at least one
// term in k, i.e. NMSE ≥ ~1/k ≈ 5e-4, six orders of magnitude above the bound.
constexpr double kFloatKernelMaxNmse = 1e-10;

namespace detail {
template <typename Want>
double nmse(std::span<const float> got, std::span<const Want> want) {
  double err = 0.0;
  double norm = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double diff = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    err += diff * diff;
    norm += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  // An all-zero reference (rope or attention of zeros) would divide by zero; fall back to the plain MSE.
  return norm > 0.0 ? err / norm : err;
}
}  // namespace detail

// got and want have the same size.
inline double nmse(std::span<const float> got, std::span<const double> want) { return detail::nmse(got, want); }
inline double nmse(std::span<const float> got, std::span<const float> want) { return detail::nmse(got, want); }

// EXPECT_TRUE(nmse_below(...)) checks sizes and finiteness too, and prints the measured error on failure.
inline ::testing::AssertionResult nmse_below(std::span<const float> got, std::span<const double> want,
                                             double max_nmse = kFloatKernelMaxNmse) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != reference size " << want.size();
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return ::testing::AssertionFailure() << "non-finite value " << got[i] << " at " << i;
  }
  const double e = nmse(got, want);
  if (e < max_nmse) return ::testing::AssertionSuccess() << "nmse " << e;
  return ::testing::AssertionFailure() << "nmse " << e << " >= " << max_nmse;
}

}  // namespace shardline::test
