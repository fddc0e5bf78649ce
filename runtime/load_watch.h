// Bounds the time a rank's own loading of its weights may go without progress.
//
// Why: the agreement after loading waits without a bound (a shard takes what its file system needs: minutes
// for a large model on a busy one, not the same on every rank), so a rank stuck while reading its weights (a
// hung file system under its mapping) held every other rank there until the job's time limit.
//
// How: a thread of its own, which needs no MPI and runs on while the loading thread waits in the kernel,
// watches the time since the last progress (a tensor read and converted, or 2^14 of its values decoded)
// while the loading is armed (ShardWeights' construction, the CUDA stage's upload: not the collectives
// around them, whose waits on slower peers are bounded by --comm-timeout themselves), and calls on_stall
// when it passes stall_s. The caller's on_stall says so and ends the process (launch/run_command.cpp); the
// launcher then ends the job, as after any rank's death.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace shardline::runtime {

class LoadWatch {
 public:
  using OnStall = std::function<void(double stalled_s)>;
  // stall_s: infinite (or not positive) for no watch at all.
  LoadWatch(double stall_s, OnStall on_stall);
  ~LoadWatch();
  LoadWatch(const LoadWatch&) = delete;
  LoadWatch& operator=(const LoadWatch&) = delete;

  // From any thread.
  void progress();

  // Arms the watch for its lifetime (the clock starts at construction); a null watch is no watch.
  class Armed {
   public:
    explicit Armed(LoadWatch* watch);
    ~Armed();
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;

   private:
    LoadWatch* watch_;
  };

 private:
  void watch();

  double stall_s_;
  OnStall on_stall_;
  std::atomic<std::int64_t> last_progress_ns_{0};
  std::atomic<int> armed_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

// watch->progress() where there is a watch.
inline void load_progress(LoadWatch* watch) {
  if (watch != nullptr) watch->progress();
}

}  // namespace shardline::runtime
