#include "runtime/load_watch.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "common/error.h"

namespace shardline::runtime {

LoadWatch::LoadWatch(double stall_s, OnStall on_stall) : stall_s_(stall_s), on_stall_(std::move(on_stall)) {
  if (!(stall_s > 0) || std::isinf(stall_s) || !on_stall_) return;
  thread_ = std::thread([this] { watch(); });
}

LoadWatch::~LoadWatch() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void LoadWatch::progress() { progress_count_.fetch_add(1, std::memory_order_relaxed); }

void LoadWatch::watch() {
  // Wakes a few times per bound (a stall is said within a quarter of it, at most a second, of the bound)
  // and adds the time since its last wake-up, at most two periods of it, while armed and without progress.
  using Clock = std::chrono::steady_clock;
  const std::chrono::duration<double> period(std::min(stall_s_ / 4, 1.0));
  double stalled_s = 0;
  std::uint64_t seen = progress_count();
  Clock::time_point last = Clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    const Clock::time_point now = Clock::now();
    const double waited_s = std::min(std::chrono::duration<double>(now - last).count(), 2 * period.count());
    last = now;
    const std::uint64_t count = progress_count();
    if (count != seen || !armed()) {
      seen = count;
      stalled_s = 0;
      continue;
    }
    stalled_s += waited_s;
    if (stalled_s < stall_s_) continue;
    on_stall_(stalled_s);  // ends the process, as the caller's does; should it return, say it once
    return;
  }
}

void end_stalled_load(const std::string& model, double stalled_s, double least_s) {
  print_error_line(fmt::format("reading this rank's weights from '{}' made no progress for {:.0f} s (--comm-timeout, "
                               "at least {:.0f} s): is its file system hung? The job ends",
                               model, stalled_s, least_s));
  std::fflush(stderr);
  std::_Exit(static_cast<int>(ExitCode::kComm));
}

LoadWatch::Armed::Armed(LoadWatch* watch) : watch_(watch) {
  if (watch_ == nullptr) return;
  watch_->progress();
  ++watch_->armed_;
}

void LoadWatch::Armed::release() {
  if (watch_ == nullptr) return;
  --watch_->armed_;
  watch_->progress();  // what follows (a collective) starts with a clean count when the next arm comes
  watch_ = nullptr;
}

}  // namespace shardline::runtime
