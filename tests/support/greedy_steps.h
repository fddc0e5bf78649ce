// Decode steps of several sequences on one Stage, one row each a step (embed, forward, the next token), for
// tests that watch what a decode step does, such as whether it allocates; and the cases such tests run.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/weight_format.h"
#include "runtime/stage.h"

namespace shardline::test {

// How the next token is picked: greedy_tokens (the classifier's pass picks it; greedy decoding), or the
// logits written and their argmax taken after (the path sampling takes).
enum class Pick { kGreedyTokens, kLogits };

class GreedySteps {
 public:
  // sequences caches of `positions` positions each; sequence s starts from token 1 + s.
  GreedySteps(runtime::Stage& stage, int sequences, int positions, Pick pick = Pick::kGreedyTokens)
      : stage_(stage),
        n_(sequences),
        pick_(pick),
        rows_(sequences),
        tokens_(sequences),
        next_(sequences),
        x_(static_cast<std::size_t>(sequences) * stage.shape().dim),
        logits_(static_cast<std::size_t>(sequences) * stage.shape().vocab_size),
        values_(sequences),
        saw_nan_(new bool[sequences]) {
    for (int s = 0; s < n_; ++s) {
      caches_.push_back(stage.make_kv_cache(positions));
      tokens_[s] = 1 + s;
    }
  }

  // Every sequence's token at position pos through the stage, and its next token.
  void step(int pos) {
    for (int s = 0; s < n_; ++s) rows_[s] = {&caches_[s], pos};
    stage_.embed(tokens_.data(), n_, x_.data());
    stage_.forward(x_.data(), rows_.data(), n_);
    if (pick_ == Pick::kGreedyTokens) {
      stage_.greedy_tokens(x_.data(), n_, logits_.data(), next_.data(), values_.data(), saw_nan_.get());
    } else {
      const int vocab = stage_.shape().vocab_size;
      stage_.logits(x_.data(), n_, logits_.data());
      for (int s = 0; s < n_; ++s) next_[s] = kernels::cpu::argmax(logits_.data() + static_cast<std::size_t>(s) * vocab, vocab);
    }
    tokens_.swap(next_);
  }

  const std::vector<runtime::KvCache>& caches() const { return caches_; }

 private:
  runtime::Stage& stage_;
  int n_;
  Pick pick_;
  std::vector<runtime::KvCache> caches_;
  std::vector<runtime::Row> rows_;
  std::vector<int> tokens_, next_;
  std::vector<float> x_, logits_, values_;
  std::unique_ptr<bool[]> saw_nan_;
};

// A decode loop test's case: the weights' and the cache's dtypes, sequences decoding together, the pick.
struct DecodeCase {
  kernels::cpu::WeightDtype dtype;
  kernels::cpu::KvDtype kv_dtype;
  int rows;
  Pick pick = Pick::kGreedyTokens;
};

// What the decode loop tests run: one row and a batch, every weight dtype and cache dtype the CPU takes, both
// picks.
inline std::vector<DecodeCase> decode_cases() {
  using kernels::cpu::KvDtype;
  using kernels::cpu::WeightDtype;
  return {{WeightDtype::kF32, KvDtype::kF32, 1},
          {WeightDtype::kF32, KvDtype::kF32, 4},
          {WeightDtype::kBf16, KvDtype::kF16, 4},
          {WeightDtype::kInt8, KvDtype::kF16, 1},
          {WeightDtype::kInt8, KvDtype::kInt8, 4},
          {WeightDtype::kF32, KvDtype::kF32, 2, Pick::kLogits},
          {WeightDtype::kInt8, KvDtype::kF16, 1, Pick::kLogits}};
}

inline std::string decode_case_name(const testing::TestParamInfo<DecodeCase>& info) {
  return std::string(kernels::cpu::weight_dtype_name(info.param.dtype)) + "_kv" +
         kernels::cpu::kv_dtype_name(info.param.kv_dtype) + "_" + std::to_string(info.param.rows) + "rows" +
         (info.param.pick == Pick::kLogits ? "_logits" : "");
}

}  // namespace shardline::test
