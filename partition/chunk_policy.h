// The dynamic split by sequence length: how many prompt tokens one prefill forward call takes, chosen per
// request. A pass over a stage costs a fixed part (streaming the stage's weights, kernel overheads,
// message latency) plus a part per token; cutting a prompt of L tokens into chunks of s lets the p stages
// overlap, and prefill takes about (L/s + p - 1)(A + b·s), smallest at s = sqrt(L·A / ((p-1)·b)).
// With one stage nothing overlaps, so the prompt is not split (up to the runtime's largest chunk).
#pragma once

#include <algorithm>
#include <cmath>

namespace shardline::partition {

struct ChunkPolicy {
  double per_pass_s = 0;   // A: fixed cost of one pass over the slowest stage
  double per_token_s = 0;  // b: added cost per token of the slowest stage
  int pp = 1;
  int max_chunk_tokens = 512;

  int chunk_for(int prompt_tokens) const {
    const int cap = std::max(1, std::min(prompt_tokens, max_chunk_tokens));
    if (pp <= 1 || per_token_s <= 0) return cap;
    const double best = std::sqrt(prompt_tokens * per_pass_s / ((pp - 1) * per_token_s));
    return std::clamp(static_cast<int>(std::lround(best)), 1, cap);
  }
};

}  // namespace shardline::partition
