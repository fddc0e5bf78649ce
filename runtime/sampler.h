// Token sampling as llama2.c does it, so a seeded run is reproducible against the reference:
// temperature 0 = greedy argmax; otherwise softmax(logits / T), then top-p (nucleus) when 0 < top_p < 1,
// else sampling from the whole distribution; xorshift64* RNG seeded by --seed.
#pragma once

#include <cstdint>

namespace shardline::runtime {

struct SamplerOptions {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 0.9f;        // nucleus threshold; <= 0 or >= 1 disables it
  std::uint64_t seed = 42;
};

class Sampler {
 public:
  Sampler(int vocab_size, const SamplerOptions& options);
  // Picks the next token. Modifies logits in place (scaled and normalised when temperature > 0).
  int sample(float* logits);
  // Whether sample() only reads the logits (greedy: their argmax), so the caller needs no copy.
  bool leaves_logits_unchanged() const { return options_.temperature == 0.0f || vocab_size_ == 1; }
  // The greedy token (what sample() returns when leaves_logits_unchanged()); safe from several threads.
  int greedy_token(const float* logits) const;

 private:
  float random_f32();
  int sample_top_p(const float* probs, float coin);

  int vocab_size_;
  SamplerOptions options_;
  std::uint64_t rng_state_;
};

}  // namespace shardline::runtime
