// LoadWatch (runtime/load_watch.h): a stall is reported only while armed and only after stall_s without
// progress, from the watch's own thread (the loading thread may be stuck in the kernel). The bounds are wide
// (1 s of stall against progress every 10 ms; up to 20 s to notice), so a loaded machine cannot make them
// flaky: these check behaviour, not speed.
#include "runtime/load_watch.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include <gtest/gtest.h>

namespace shardline::runtime {
namespace {

using namespace std::chrono_literals;

// Waits up to 20 s for flag to be set.
bool eventually(const std::atomic<bool>& flag) {
  for (int i = 0; i < 2000 && !flag; ++i) std::this_thread::sleep_for(10ms);
  return flag;
}

TEST(LoadWatch, AnArmedLoadWithoutProgressIsReportedFromTheWatchsThread) {
  std::atomic<bool> stalled{false};
  std::atomic<double> seconds{0};
  std::thread::id reporter;
  LoadWatch watch(0.3, [&](double s) {
    reporter = std::this_thread::get_id();
    seconds = s;
    stalled = true;
  });
  const LoadWatch::Armed armed(&watch);
  ASSERT_TRUE(eventually(stalled));  // this thread sleeps, as one stuck on a hung file system would
  EXPECT_GE(seconds.load(), 0.3);
  EXPECT_NE(reporter, std::this_thread::get_id());
}

TEST(LoadWatch, ProgressAndDisarmedTimeDoNotCount) {
  std::atomic<bool> stalled{false};
  LoadWatch watch(1.0, [&](double) { stalled = true; });
  {
    const LoadWatch::Armed armed(&watch);
    for (int i = 0; i < 200; ++i) {  // 2 s of loading, progress every 10 ms
      std::this_thread::sleep_for(10ms);
      watch.progress();
    }
  }
  std::this_thread::sleep_for(2s);  // disarmed: a collective's wait on a slower peer
  EXPECT_FALSE(stalled);
  // Arming again starts the clock afresh, and a stall then still counts.
  const LoadWatch::Armed again(&watch);
  EXPECT_TRUE(eventually(stalled));
}

TEST(LoadWatch, AnInfiniteBoundOrANullWatchIsNoWatch) {
  std::atomic<bool> stalled{false};
  LoadWatch watch(std::numeric_limits<double>::infinity(), [&](double) { stalled = true; });
  const LoadWatch::Armed armed(&watch);
  const LoadWatch::Armed none(nullptr);
  load_progress(nullptr);
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(stalled);
}

}  // namespace
}  // namespace shardline::runtime
