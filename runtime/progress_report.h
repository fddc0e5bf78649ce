// Progress of a multi-sequence run. Several sequences print their text only at the end, which for a large
// batch is minutes away, so every few seconds the output rank says how far the run has got (at info level,
// on stderr: --json and the text on stdout are untouched). A single sequence streams its text, which is
// progress enough.
#pragma once

#include <chrono>
#include <functional>
#include <utility>

#include "common/log.h"

namespace shardline::runtime {

class ProgressReport {
 public:
  static constexpr double kEveryS = 5.0;

  // planned_tokens: the sequences' --steps summed. now_s: seconds on a steady clock (tests pass their own).
  ProgressReport(int sequences, long planned_tokens, std::function<double()> now_s = steady_seconds)
      : n_(sequences), planned_tokens_(planned_tokens), now_s_(std::move(now_s)), start_s_(now_s_()) {}

  // One generated token.
  void token() {
    ++tokens_;
    if (n_ < 2) return;
    const double elapsed = now_s_() - start_s_;
    if (elapsed - last_report_s_ < kEveryS) return;
    last_report_s_ = elapsed;
    // "At most": a sequence that samples BOS ends before its --steps.
    log::info("progress: {} of at most {} tokens of {} sequences generated, {:.1f} tok/s", tokens_, planned_tokens_,
              n_, tokens_ / elapsed);
  }

 private:
  static double steady_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  int n_;
  long planned_tokens_;
  std::function<double()> now_s_;
  double start_s_;
  long tokens_ = 0;
  double last_report_s_ = 0;
};

}  // namespace shardline::runtime
