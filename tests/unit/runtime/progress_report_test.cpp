// The progress lines of a multi-sequence run: every ProgressReport::kEveryS seconds of its clock, none for a
// single sequence (which streams its text), and nothing when the log level is above info.
#include "runtime/progress_report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace shardline::runtime {
namespace {

std::size_t lines_of(const std::string& text) { return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')); }

// Runs `tokens` tokens through a report of these steps, the clock advancing `step_s` per token; returns
// what it printed.
std::string report(const std::vector<int>& steps, int tokens, double step_s) {
  double now = 100.0;
  long planned = 0;
  for (int s : steps) planned += s;
  ProgressReport progress(static_cast<int>(steps.size()), planned, [&] { return now; });
  testing::internal::CaptureStderr();
  for (int t = 0; t < tokens; ++t) {
    now += step_s;
    progress.token();
  }
  return testing::internal::GetCapturedStderr();
}

TEST(ProgressReport, SaysHowFarTheRunIsEveryFewSeconds) {
  log::set_level(log::Level::kInfo);
  // 40 tokens at 0.5 s each: 20 s, so a line at 5, 10, 15 and 20 s.
  const std::string out = report({20, 30}, 40, 0.5);
  EXPECT_EQ(lines_of(out), 4u) << out;
  EXPECT_NE(out.find("progress: 10 of at most 50 tokens of 2 sequences generated, 2.0 tok/s"), std::string::npos) << out;
  EXPECT_NE(out.find("progress: 40 of at most 50 tokens"), std::string::npos) << out;
  EXPECT_EQ(report({20, 30}, 40, 0.01), "");  // done within the first interval: nothing to report
}

TEST(ProgressReport, ASingleSequenceStreamsItsTextInstead) {
  log::set_level(log::Level::kInfo);
  EXPECT_EQ(report({100}, 100, 1.0), "");
}

TEST(ProgressReport, FollowsTheLogLevel) {
  log::set_level(log::Level::kWarn);
  EXPECT_EQ(report({20, 30}, 40, 0.5), "");
  log::set_level(log::Level::kInfo);
}

}  // namespace
}  // namespace shardline::runtime
