#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "runtime/sampler.h"

namespace shardline::runtime {
namespace {

TEST(Sampler, GreedyPicksTheFirstMaximum) {
  Sampler sampler(5, {.temperature = 0.0f});
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f, 2.0f};
  EXPECT_EQ(sampler.sample(logits.data()), 1);
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDifferent) {
  auto draw = [](std::uint64_t seed) {
    Sampler sampler(50, {.temperature = 1.0f, .top_p = 0.0f, .seed = seed});
    std::vector<int> picks;
    for (int i = 0; i < 40; ++i) {
      std::vector<float> logits(50, 0.0f);
      picks.push_back(sampler.sample(logits.data()));
    }
    return picks;
  };
  EXPECT_EQ(draw(1234), draw(1234));
  EXPECT_NE(draw(1234), draw(4321));
}

TEST(Sampler, FollowsTheDistribution) {
  // logits log(0.7), log(0.2), log(0.1): 20000 draws land within a few standard errors (< 0.01).
  Sampler sampler(3, {.temperature = 1.0f, .top_p = 0.0f, .seed = 7});
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> logits = {std::log(0.7f), std::log(0.2f), std::log(0.1f)};
    counts[sampler.sample(logits.data())]++;
  }
  EXPECT_NEAR(counts[0] / double(n), 0.7, 0.015);
  EXPECT_NEAR(counts[1] / double(n), 0.2, 0.015);
  EXPECT_NEAR(counts[2] / double(n), 0.1, 0.015);
}

TEST(Sampler, TopPNeverPicksOutsideTheNucleus) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: with top_p 0.75 the nucleus is {0, 1} (0.5 + 0.3 > 0.75).
  Sampler sampler(4, {.temperature = 1.0f, .top_p = 0.75f, .seed = 99});
  std::map<int, int> counts;
  for (int i = 0; i < 5000; ++i) {
    std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
    counts[sampler.sample(logits.data())]++;
  }
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_NEAR(counts[0] / 5000.0, 0.5 / 0.8, 0.03);
}

// llama2.c's sample_topp() over the probabilities the sampler left in place, its comparator made total (equal
// probabilities by increasing token, as runtime/sampler.cpp orders them), with the coin drawn by llama2.c's
// xorshift64* from the same seed: the reference the sampler's radix-sorted nucleus must match.
class ReferenceTopP {
 public:
  explicit ReferenceTopP(std::uint64_t seed) : state_(seed) {}

  int pick(const std::vector<float>& probs, float top_p) {
    const float coin = random_f32();
    std::vector<std::pair<float, int>> candidates;
    const float cutoff = (1.0f - top_p) / static_cast<float>(probs.size() - 1);
    for (std::size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] >= cutoff) candidates.emplace_back(probs[i], static_cast<int>(i));
    }
    std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    float cumulative = 0.0f;
    std::size_t last = candidates.size() - 1;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      cumulative += candidates[i].first;
      if (cumulative > top_p) {
        last = i;
        break;
      }
    }
    const float r = coin * cumulative;
    float cdf = 0.0f;
    for (std::size_t i = 0; i <= last; ++i) {
      cdf += candidates[i].first;
      if (r < cdf) return candidates[i].second;
    }
    return candidates[last].second;
  }

 private:
  float random_f32() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return static_cast<float>(static_cast<std::uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32) >> 8) / 16777216.0f;
  }
  std::uint64_t state_;
};

TEST(Sampler, TopPPicksLlama2csTokenOnFlatPeakedAndTiedDistributions) {
  constexpr int kVocab = 32000;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Spreads of the logits: a random-weight model's flat ones (most of the vocabulary in the nucleus), a
  // trained model's peaked ones, and logits on a coarse grid (many equal probabilities: the tie order).
  const std::vector<std::pair<const char*, float>> shapes = {{"flat", 0.3f}, {"peaked", 4.0f}, {"tied", -1.0f}};
  for (const auto& [name, spread] : shapes) {
    for (float top_p : {0.5f, 0.9f, 0.99f}) {
      for (float temperature : {0.7f, 1.5f}) {
        const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(top_p * 100) + static_cast<std::uint64_t>(temperature * 10);
        Sampler sampler(kVocab, {.temperature = temperature, .top_p = top_p, .seed = seed});
        ReferenceTopP reference(seed);
        for (int draw = 0; draw < 3; ++draw) {
          std::vector<float> logits(kVocab);
          for (float& v : logits) v = spread > 0 ? spread * normal(rng) : std::round(2.0f * normal(rng)) / 2.0f;
          const int token = sampler.sample(logits.data());  // leaves the probabilities it used in logits
          EXPECT_EQ(token, reference.pick(logits, top_p))
              << name << " top-p " << top_p << " temperature " << temperature << " draw " << draw;
        }
      }
    }
  }
}

TEST(Sampler, RejectsATemperatureOrTopPThatIsNotANumber) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_THROW(Sampler(4, {.temperature = nan}), ConfigError);
  EXPECT_THROW(Sampler(4, {.temperature = inf}), ConfigError);
  EXPECT_THROW(Sampler(4, {.temperature = -1.0f}), ConfigError);
  EXPECT_THROW(Sampler(4, {.temperature = 1.0f, .top_p = nan}), ConfigError);
  EXPECT_NO_THROW(Sampler(4, {.temperature = 1.0f, .top_p = inf}));  // outside (0, 1): no nucleus
}

TEST(Sampler, ATemperatureTooSmallForFloatsRangeIsItsLimitTheGreedyPick) {
  // 5 / 1e-38 is past float's range: every logit became +-Inf, softmax NaN, and every pick token 0.
  for (float top_p : {0.9f, 0.0f}) {
    for (float temperature : {1e-38f, 1e-45f}) {
      Sampler tiny(5, {.temperature = temperature, .top_p = top_p, .seed = 11});
      Sampler usual(5, {.temperature = 1.0f, .top_p = top_p, .seed = 11});
      std::vector<float> logits = {0.1f, 3.0f, -1.0f, 5.0f, 2.0f}, negative = {-7.0f, -9.0f, -3.0f, -8.0f, -4.0f};
      EXPECT_EQ(tiny.sample(logits.data()), 3) << temperature;
      EXPECT_EQ(tiny.sample(negative.data()), 2) << temperature;
      // The coins were drawn all the same: the later draws (flat logits, where the temperature changes
      // nothing) are those of a sampler that sampled twice before.
      logits = {0.1f, 3.0f, -1.0f, 5.0f, 2.0f};
      usual.sample(logits.data());
      usual.sample(logits.data());
      for (int i = 0; i < 12; ++i) {
        std::vector<float> a(5, 0.0f), b(5, 0.0f);
        EXPECT_EQ(tiny.sample(a.data()), usual.sample(b.data())) << temperature << ", draw " << i;
      }
    }
  }
}

TEST(Sampler, NanLogitsStillGiveATokenOfTheVocabulary) {
  // NaN weights make NaN logits; with and without a nucleus the pick must stay an id in [0, vocab).
  for (float top_p : {0.9f, 0.0f}) {
    Sampler sampler(50, {.temperature = 0.8f, .top_p = top_p, .seed = 3});
    for (int i = 0; i < 20; ++i) {
      std::vector<float> logits(50, std::numeric_limits<float>::quiet_NaN());
      if (i % 2 == 1) logits[7] = 1.0f;  // one real logit among NaNs: softmax still gives NaNs
      const int token = sampler.sample(logits.data());
      EXPECT_GE(token, 0);
      EXPECT_LT(token, 50);
    }
  }
}

}  // namespace
}  // namespace shardline::runtime
