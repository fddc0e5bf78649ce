#include "runtime/load_watch.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace shardline::runtime {

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

LoadWatch::LoadWatch(double stall_s, OnStall on_stall) : stall_s_(stall_s), on_stall_(std::move(on_stall)) {
  if (!(stall_s > 0) || std::isinf(stall_s) || !on_stall_) return;
  last_progress_ns_ = now_ns();
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

void LoadWatch::progress() { last_progress_ns_.store(now_ns(), std::memory_order_relaxed); }

void LoadWatch::watch() {
  // Looks a few times per bound: a stall is said within a quarter of it (at most a second) of the bound.
  const auto period = std::chrono::duration<double>(std::min(stall_s_ / 4, 1.0));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    if (armed_.load() == 0) continue;
    const double stalled_s = static_cast<double>(now_ns() - last_progress_ns_.load(std::memory_order_relaxed)) * 1e-9;
    if (stalled_s < stall_s_) continue;
    on_stall_(stalled_s);  // ends the process, as the caller's does; should it return, say it once
    return;
  }
}

LoadWatch::Armed::Armed(LoadWatch* watch) : watch_(watch) {
  if (watch_ == nullptr) return;
  watch_->progress();  // the time before arming (a collective's wait) is none of the loading's
  ++watch_->armed_;
}

LoadWatch::Armed::~Armed() {
  if (watch_ != nullptr) --watch_->armed_;
}

}  // namespace shardline::runtime
