// LoadWatch (runtime/load_watch.h): a stall is reported only while armed and only after stall_s without
// progress, from the watch's own thread (the loading thread may be stuck in the kernel); a stopped process
// does not read as a stall; ShardWeights reports its progress and leaves the watch disarmed; a stall ends the
// process with one line and exit 5. The bounds are wide (progress every 10 ms against 0.5-1 s; up to 20 s to
// notice), so a loaded machine cannot make them flaky: these check behaviour, not speed.
#include "runtime/load_watch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <limits>
#include <thread>

#include <gtest/gtest.h>

#include "partition/mesh.h"
#include "partition/model_shape.h"
#include "partition/shard.h"
#include "runtime/model_generator.h"
#include "runtime/shard_weights.h"

namespace shardline::runtime {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

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
  std::atomic<double> seconds{0};
  LoadWatch watch(0.5, [&](double s) {
    seconds = s;
    stalled = true;
  });
  {
    const LoadWatch::Armed armed(&watch);
    for (int i = 0; i < 100; ++i) {  // 1 s of loading, progress every 10 ms
      std::this_thread::sleep_for(10ms);
      watch.progress();
    }
  }
  std::this_thread::sleep_for(1s);  // disarmed: a collective's wait on a slower peer
  EXPECT_FALSE(stalled);
  // Arming again starts afresh: the stall said is no longer than the time since then.
  const Clock::time_point armed_at = Clock::now();
  const LoadWatch::Armed again(&watch);
  ASSERT_TRUE(eventually(stalled));
  EXPECT_LE(seconds.load(), std::chrono::duration<double>(Clock::now() - armed_at).count() + 0.01);
}

// A process stopped for longer than the bound (SIGSTOP, a suspended job) resumes without a stall: each of the
// watch's wake-ups counts at most two of its periods. In a child process, which the test stops for 3 s while
// its loading makes progress every 10 ms against a bound of 1 s; a stall would exit 42.
TEST(LoadWatch, AStoppedProcessDoesNotReadAsAStall) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    LoadWatch watch(1.0, [](double) { std::_Exit(42); });
    const LoadWatch::Armed armed(&watch);
    const Clock::time_point end = Clock::now() + 6s;  // (stopped 3 s of them)
    while (Clock::now() < end) {
      std::this_thread::sleep_for(10ms);
      watch.progress();
    }
    std::_Exit(0);
  }
  std::this_thread::sleep_for(1s);
  ::kill(child, SIGSTOP);
  std::this_thread::sleep_for(3s);
  ::kill(child, SIGCONT);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "42: the stopped time was taken for a stall";
}

TEST(LoadWatch, AnInfiniteBoundOrANullWatchIsNoWatch) {
  std::atomic<bool> stalled{false};
  LoadWatch watch(std::numeric_limits<double>::infinity(), [&](double) { stalled = true; });
  const LoadWatch::Armed armed(&watch);
  EXPECT_TRUE(watch.armed());
  const LoadWatch::Armed none(nullptr);  // (and nothing to tell)
  load_progress(nullptr);
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(stalled);
  LoadWatch without_callback(0.1, nullptr);
  const LoadWatch::Armed also(&without_callback);
  std::this_thread::sleep_for(300ms);  // (no thread: nothing to call)
}

TEST(LoadWatch, ShardWeightsTellItsProgressAndLeaveItDisarmed) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("load_watch_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const partition::ModelShape shape{.dim = 64, .hidden_dim = 160, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                                    .vocab_size = 300, .seq_len = 32, .shared_classifier = false};
  const GeneratedModelPaths paths{(dir / "m.bin").string(), (dir / "m.tokenizer.bin").string()};
  generate_model(shape, 3, paths);
  LoadWatch watch(1000.0, [](double) {});
  const partition::RankShard shard =
      partition::shard_for(shape, partition::Mesh::single(), partition::stage_layer_ranges(shape, 1, {}));
  {
    ShardWeights weights(paths.model, shape, shard, {.load_watch = &watch});
    // Each of the 2 x 7 matrices, the classifier, the norms and the embedding at least once.
    EXPECT_GE(watch.progress_count(), 2u * 7 + 1 + 2 * 2 + 1 + 1);
  }
  EXPECT_FALSE(watch.armed());
  std::filesystem::remove_all(dir);
}

TEST(LoadWatchDeathTest, AStallEndsTheProcessWithOneLineAndExitCode5) {
  EXPECT_EXIT(end_stalled_load("m.bin", 301.4, 300), ::testing::ExitedWithCode(5),
              "error: reading this rank's weights from 'm.bin' made no progress for 301 s \\(--comm-timeout, at least "
              "300 s\\): is its file system hung\\? The job ends");
}

}  // namespace
}  // namespace shardline::runtime
