// Sets the kernel's 2 MiB hugepage pool (/proc/sys/vm/nr_hugepages) for the lifetime of an object and
// ALWAYS puts the old value back: in the destructor (test failures and exceptions included), and, should a
// holder die without running it (SIGKILL by a time-out), the next holder restores the value the dead one
// saved before doing anything else.
//
// The pool is host-wide, so every user takes an exclusive flock first (one lock file for all test
// processes and all checkouts on the host): tests that need "some pages" and tests that need "no pages"
// never see each other's settings. Needs root; under CI=true a pool that cannot be set is a failure.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace shardline::test {

class HugepagePool {
 public:
  static constexpr const char* kControl = "/proc/sys/vm/nr_hugepages";
  static constexpr const char* kLock = "/tmp/shardline-hugepages.lock";
  static constexpr const char* kSaved = "/tmp/shardline-hugepages.saved";

  // True when this process may change the pool (root, writable control file).
  static bool can_change() { return ::access(kControl, W_OK) == 0; }

  enum class Change { kSetTo, kAdd };
  // Sets the pool to `pages` 2 MiB pages (kAdd: to its current size plus pages, read under the lock).
  // Throws std::runtime_error when it cannot.
  explicit HugepagePool(long pages, Change change = Change::kSetTo) {
    lock_fd_ = ::open(kLock, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX) != 0) throw std::runtime_error("cannot lock " + std::string(kLock));
    // A previous holder died with the pool changed: put its saved value back first.
    if (std::ifstream saved(kSaved); saved) {
      long old = -1;
      if (saved >> old && old >= 0) write_pool(old);
      ::unlink(kSaved);
    }
    old_pages_ = read_pool();
    std::ofstream(kSaved) << old_pages_ << "\n";
    write_pool(change == Change::kAdd ? old_pages_ + pages : pages);
    obtained_ = read_pool();
  }
  HugepagePool(const HugepagePool&) = delete;
  HugepagePool& operator=(const HugepagePool&) = delete;
  ~HugepagePool() {
    try {
      write_pool(old_pages_);
    } catch (...) {
    }
    if (read_pool() == old_pages_) ::unlink(kSaved);  // else the next holder retries
    ::flock(lock_fd_, LOCK_UN);
    ::close(lock_fd_);
  }

  long old_pages() const { return old_pages_; }
  long obtained() const { return obtained_; }  // the kernel may grant fewer than asked (fragmentation)

  static long read_pool() {
    std::ifstream in(kControl);
    long value = -1;
    in >> value;
    return value;
  }

 private:
  static void write_pool(long pages) {
    // Lowering the pool frees pages at once; raising it needs free 2 MiB ranges, which transparent hugepages
    // and the page cache fragment, so when the kernel grants fewer pages than asked it is asked to compact
    // memory (/proc/sys/vm/compact_memory) and asked again, a few times.
    for (int attempt = 0; attempt < 5; ++attempt) {
      std::ofstream out(kControl);
      out << pages << "\n";
      out.close();
      if (!out) throw std::runtime_error(std::string("cannot write ") + kControl + " (needs root)");
      if (read_pool() >= pages) return;
      std::ofstream("/proc/sys/vm/compact_memory") << "1\n";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  int lock_fd_ = -1;
  long old_pages_ = 0;
  long obtained_ = 0;
};

// Refuses transparent hugepages for this process (prctl PR_SET_THP_DISABLE) for the lifetime of an object,
// and puts the process's previous setting back on scope exit. `refused` says whether the prctl took.
struct ThpRefused {
  ThpRefused() : previous(::prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1) {
    refused = ::prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0;
  }
  ~ThpRefused() { ::prctl(PR_SET_THP_DISABLE, previous ? 1 : 0, 0, 0, 0); }
  ThpRefused(const ThpRefused&) = delete;
  ThpRefused& operator=(const ThpRefused&) = delete;
  bool previous;
  bool refused = false;
};

}  // namespace shardline::test
