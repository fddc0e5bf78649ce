// Bounds the time a rank's own loading of its weights may go without progress.
//
// Why: the agreement after loading waits without a bound (a shard takes what its file system needs: minutes
// for a large model on a busy one, not the same on every rank), so a rank stuck while reading its weights (a
// hung file system under its mapping) held every other rank there until the job's time limit.
//
// How: a thread of its own, which needs no MPI and runs on while the loading thread waits in the kernel,
// adds up the time without progress (64 MiB of a tensor's pages read in, a tensor converted, 2^14 of its
// values decoded) while the loading is armed: the engine's reading of the header, tokenizer and weights and
// the CUDA stage's upload, not the collectives between them (the agreement after loading waits for the
// slowest rank without a bound: each rank's own watch is what ends a stuck one). When the sum reaches stall_s it calls on_stall; the caller's says so and ends the process
// (launch/run_command.cpp), and the launcher then ends the job, as after any rank's death. The time is
// summed from the watch's own wake-ups, each counting at most two periods, so a job that was stopped or
// suspended (SIGSTOP, scontrol suspend) does not read as a stall when it resumes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
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
  std::uint64_t progress_count() const { return progress_count_.load(std::memory_order_relaxed); }
  bool armed() const { return armed_.load() > 0; }

  // Arms the watch from construction until release() or destruction (nested arms count); a null watch is no
  // watch. Arming counts as progress: the time before it (a collective's wait) is none of the loading's.
  class Armed {
   public:
    explicit Armed(LoadWatch* watch);
    ~Armed() { release(); }
    void release();
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;

   private:
    LoadWatch* watch_;
  };

 private:
  void watch();

  double stall_s_;
  OnStall on_stall_;
  std::atomic<std::uint64_t> progress_count_{0};
  std::atomic<int> armed_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

// What `run` does on a stall (on the watch's thread): one error line naming the file, the time and the bound
// (--comm-timeout, at least least_s), then exit 5 without unwinding (the loading thread is stuck in the
// kernel). The launcher ends the rest of the job. (A thread stuck in an uninterruptible wait keeps the
// process alive until it wakes: the line is said, the exit may wait for it.)
[[noreturn]] void end_stalled_load(const std::string& model, double stalled_s, double least_s);

// watch->progress() where there is a watch.
inline void load_progress(LoadWatch* watch) {
  if (watch != nullptr) watch->progress();
}

}  // namespace shardline::runtime
