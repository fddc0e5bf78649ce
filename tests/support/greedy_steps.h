// Greedy decode steps of several sequences on one Stage, one row each a step (embed, forward, the greedy
// pick), for tests that watch what a decode step does, such as whether it allocates.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/stage.h"

namespace shardline::test {

class GreedySteps {
 public:
  // sequences caches of `positions` positions each; sequence s starts from token 1 + s.
  GreedySteps(runtime::Stage& stage, int sequences, int positions)
      : stage_(stage),
        n_(sequences),
        rows_(sequences),
        tokens_(sequences),
        next_(sequences),
        x_(static_cast<std::size_t>(sequences) * stage.shape().dim),
        logits_(static_cast<std::size_t>(sequences) * stage.shape().vocab_size),
        values_(sequences),
        saw_nan_(sequences) {
    for (int s = 0; s < n_; ++s) {
      caches_.push_back(stage.make_kv_cache(positions));
      tokens_[s] = 1 + s;
    }
  }

  // Every sequence's token at position pos through the stage, and its greedy next token.
  void step(int pos) {
    for (int s = 0; s < n_; ++s) rows_[s] = {&caches_[s], pos};
    stage_.embed(tokens_.data(), n_, x_.data());
    stage_.forward(x_.data(), rows_.data(), n_);
    stage_.greedy_tokens(x_.data(), n_, logits_.data(), next_.data(), values_.data(), reinterpret_cast<bool*>(saw_nan_.data()));
    tokens_.swap(next_);
  }

  const std::vector<runtime::KvCache>& caches() const { return caches_; }
  const std::vector<int>& tokens() const { return tokens_; }

 private:
  runtime::Stage& stage_;
  int n_;
  std::vector<runtime::KvCache> caches_;
  std::vector<runtime::Row> rows_;
  std::vector<int> tokens_, next_;
  std::vector<float> x_, logits_, values_;
  std::vector<char> saw_nan_;  // bools (vector<bool> packs bits)
};

}  // namespace shardline::test
