#include "runtime/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/sort/spreadsort/integer_sort.hpp>
#include <fmt/format.h>

#include "common/error.h"
#include "kernels/cpu/ops.h"

namespace shardline::runtime {

Sampler::Sampler(int vocab_size, const SamplerOptions& options)
    : vocab_size_(vocab_size), options_(options), rng_state_(options.seed) {
  SL_CHECK(vocab_size > 0);
  if (!std::isfinite(options.temperature) || options.temperature < 0.0f || std::isnan(options.top_p)) {
    throw ConfigError(fmt::format("sampler: temperature must be finite and >= 0 and top-p a number; got {} and {}",
                                  options.temperature, options.top_p));
  }
  // xorshift never leaves the all-zero state; llama2.c users pass non-zero seeds, we make sure of it.
  if (rng_state_ == 0) rng_state_ = 0x9E3779B97F4A7C15ull;
}

float Sampler::random_f32() {
  // xorshift64*, exactly as llama2.c's random_u32 / random_f32.
  rng_state_ ^= rng_state_ >> 12;
  rng_state_ ^= rng_state_ << 25;
  rng_state_ ^= rng_state_ >> 27;
  const auto u32 = static_cast<std::uint32_t>((rng_state_ * 0x2545F4914F6CDD1Dull) >> 32);
  return static_cast<float>(u32 >> 8) / 16777216.0f;
}

int Sampler::greedy_token(const float* logits) const { return kernels::cpu::argmax(logits, vocab_size_); }

int Sampler::sample(float* logits) {
  if (leaves_logits_unchanged()) return greedy_token(logits);
  // A temperature so small that the largest logit over it leaves float's range (1e-38 made every logit +-Inf,
  // softmax NaN, and every token 0): its limit, the greedy pick. The coin is drawn all the same, so the
  // sequence's later draws stay where a seed puts them.
  const float largest = *std::max_element(logits, logits + vocab_size_);
  if (std::isfinite(largest) && !std::isfinite(largest / options_.temperature)) {
    random_f32();
    return greedy_token(logits);
  }
  for (int i = 0; i < vocab_size_; ++i) logits[i] /= options_.temperature;
  kernels::cpu::softmax(logits, vocab_size_);
  const float coin = random_f32();
  if (options_.top_p <= 0.0f || options_.top_p >= 1.0f) {
    float cdf = 0.0f;
    for (int i = 0; i < vocab_size_; ++i) {
      cdf += logits[i];
      if (coin < cdf) return i;
    }
    return vocab_size_ - 1;  // rounding: the cdf may end just below 1
  }
  return sample_top_p(logits, coin);
}

namespace {

// A nucleus candidate as one sortable number: the probability's bits inverted, then the token. Probabilities
// are >= +0 (softmax's; -0 is made +0), whose bits order as their values do, so ascending keys are
// descending probabilities, equal ones by increasing token: the order of llama2.c's comparator, made total
// (its qsort leaves equal probabilities in any order).
std::uint64_t candidate_key(float probability, int token) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(probability + 0.0f);
  return static_cast<std::uint64_t>(~bits) << 32 | static_cast<std::uint32_t>(token);
}
float candidate_probability(std::uint64_t key) { return std::bit_cast<float>(~static_cast<std::uint32_t>(key >> 32)); }
int candidate_token(std::uint64_t key) { return static_cast<int>(key & 0xFFFFFFFFu); }

}  // namespace

int Sampler::sample_top_p(const float* probs, float coin) {
  // Candidate scratch, one per thread rather than one per sequence: a sampler per sequence reserving a
  // vocabulary's worth (256 KB for 32000 tokens) cost thousands of prompts gigabytes of address space.
  thread_local std::vector<std::uint64_t> candidates;
  // Tokens below (1 - top_p) / (n - 1) cannot be in the nucleus, so they are dropped before sorting.
  candidates.clear();
  const float cutoff = (1.0f - options_.top_p) / static_cast<float>(vocab_size_ - 1);
  for (int i = 0; i < vocab_size_; ++i) {
    if (probs[i] >= cutoff) candidates.push_back(candidate_key(probs[i], i));
  }
  // Valid probabilities always leave the largest (>= 1/n >= cutoff); NaN ones (from NaN logits) leave none,
  // and the token is then the probabilities' argmax, a valid id, rather than an index past the end.
  if (candidates.empty()) return kernels::cpu::argmax(probs, vocab_size_);
  // Boost's radix-based integer sort: a flat distribution (a random-weight model's, or a high temperature)
  // keeps most of the vocabulary, whose std::sort of (probability, token) pairs took 3.9-4.1 ms for 32000;
  // these keys take 1.5-1.7 ms.
  boost::sort::spreadsort::integer_sort(candidates.begin(), candidates.end());
  float cumulative = 0.0f;
  std::size_t last = candidates.size() - 1;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    cumulative += candidate_probability(candidates[i]);
    if (cumulative > options_.top_p) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (std::size_t i = 0; i <= last; ++i) {
    cdf += candidate_probability(candidates[i]);
    if (r < cdf) return candidate_token(candidates[i]);
  }
  return candidate_token(candidates[last]);
}

}  // namespace shardline::runtime
