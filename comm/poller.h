// The waiting policy of every blocking operation in comm/ (MPI requests, NCCL operations, the host
// collectives' flags): poll, and between polls spin briefly (most operations finish in microseconds),
// then yield, then sleep, so a waiting rank does not steal the core a peer on the same host needs when
// ranks outnumber cores; and give up once --comm-timeout has passed.
#pragma once

#include <sched.h>
#include <time.h>

#include <chrono>

namespace shardline::comm {

// A timeout of a year or more (or inf) never passes: a clock's nanoseconds would overflow near 292 years,
// and an overflowed deadline lies in the past, failing healthy jobs at once.
inline constexpr double kNeverTimeoutS = 365.0 * 24 * 3600;

class Poller {
 public:
  using Clock = std::chrono::steady_clock;

  // sleep_ns: the pause once spinning and yielding are over (50 us; longer for waits known to be long).
  // A timeout of kNeverTimeoutS or more never passes.
  explicit Poller(double timeout_s, long sleep_ns = 50'000) : deadline_(deadline_after(timeout_s)), sleep_ns_(sleep_ns) {}

  // The pause after a poll that found the operation unfinished. Returns false once the deadline has passed
  // (looked at every 64 polls after the first 20000).
  bool pause() {
    ++polls_;
    if (polls_ < kSpins) return true;
    if (polls_ < kYields) {
      sched_yield();
      return true;
    }
    if ((polls_ & 63) == 0 && Clock::now() > deadline_) return false;
    const timespec pause{sleep_ns_ / 1'000'000'000, sleep_ns_ % 1'000'000'000};
    nanosleep(&pause, nullptr);
    return true;
  }

  // Past the spinning: the wait is no longer a matter of microseconds.
  bool spun_out() const { return polls_ >= kSpins; }

 private:
  static Clock::time_point deadline_after(double timeout_s) {
    if (!(timeout_s < kNeverTimeoutS)) return Clock::time_point::max();
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  }

  static constexpr long kSpins = 2000;
  static constexpr long kYields = 20000;
  Clock::time_point deadline_;
  long sleep_ns_;
  long polls_ = 0;
};

}  // namespace shardline::comm
