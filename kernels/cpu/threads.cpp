#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <immintrin.h>
#include <vector>

#include "kernels/cpu/ops.h"

namespace shardline::kernels::cpu {

namespace {
int g_num_threads = 1;

// The barrier of one run_team() pass. OpenMP's own barrier wakes sleepers with a futex system call on every
// release, whether any thread sleeps or not: 1.5 us a barrier on a 2-vCPU VM whose system calls are slow
// (0.45 us for this one; a run_team pass of a 110M decode step has four). Here the last thread to arrive
// only bumps the generation; the others spin on it for up to kSpin (a layer's steps wait a few us on each
// other) and then sleep on it, so ranks oversubscribing their cores give the cores up, and the release
// makes the system call only when someone sleeps.
struct TeamBarrier {
  static constexpr auto kSpin = std::chrono::microseconds(50);
  alignas(64) std::atomic<int> arrived{0};
  alignas(64) std::atomic<std::uint32_t> generation{0};
  std::atomic<int> sleepers{0};

  // size: the threads of the pass, each of which calls wait() once per barrier.
  void wait(int size) {
    const std::uint32_t gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == size - 1) {
      arrived.store(0, std::memory_order_relaxed);  // seen by everyone who sees the new generation
      generation.store(gen + 1, std::memory_order_seq_cst);
      // seq_cst on both sides: a sleeper counted after this load sees the new generation before it sleeps.
      if (sleepers.load(std::memory_order_seq_cst) > 0) generation.notify_all();
      return;
    }
    const auto give_up = std::chrono::steady_clock::now() + kSpin;
    for (int spins = 1;; ++spins) {
      if (generation.load(std::memory_order_acquire) != gen) return;
      _mm_pause();
      if (spins % 64 == 0 && std::chrono::steady_clock::now() > give_up) break;
    }
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    while (generation.load(std::memory_order_seq_cst) == gen) generation.wait(gen, std::memory_order_seq_cst);
    sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
};

// StealingBands' claims, per loop of a pass and band: the items taken from the band's front (low half) and
// from its back (high half), so zero is a fresh band. One cache line each: a thread's claims on its own
// band stay in its core's cache until another thread steals from it.
struct alignas(64) BandClaims {
  std::atomic<std::uint64_t> taken{0};
};

// The running pass's barrier and claims (kTeamLoops x its threads), on each of its threads (null outside a
// pass), and the index of the next loop this thread's StealingBands takes.
thread_local TeamBarrier* t_team_barrier = nullptr;
thread_local BandClaims* t_team_claims = nullptr;
thread_local int t_next_loop = 0;

// The claims of this thread's next loop in the running pass (one per thread), or null. Only for the pass's
// own team: a Team made up inside it (a sub-team, one thread's loop of its own) would take a loop index
// the others do not, and their loops would share claims.
std::atomic<std::uint64_t>* next_loop_claims(Team team) {
  if (t_team_claims == nullptr || team.n_threads < 2 || t_next_loop >= kTeamLoops ||
      team.n_threads != omp_get_num_threads() || team.thread != omp_get_thread_num()) {
    return nullptr;
  }
  return &t_team_claims[static_cast<std::size_t>(t_next_loop++) * team.n_threads].taken;
}

// The running pass's thread-local state, cleared while this lives and put back after, however it ends.
class PassStateCleared {
 public:
  PassStateCleared() : barrier_(t_team_barrier), claims_(t_team_claims), next_loop_(t_next_loop) {
    t_team_barrier = nullptr;
    t_team_claims = nullptr;
  }
  ~PassStateCleared() {
    t_team_barrier = barrier_;
    t_team_claims = claims_;
    t_next_loop = next_loop_;
  }
  PassStateCleared(const PassStateCleared&) = delete;
  PassStateCleared& operator=(const PassStateCleared&) = delete;

 private:
  TeamBarrier* barrier_;
  BandClaims* claims_;
  int next_loop_;
};
}  // namespace

int set_num_threads(int n_threads) {
  int previous = g_num_threads;
  g_num_threads = n_threads < 1 ? 1 : n_threads;
  omp_set_num_threads(g_num_threads);
  return previous;
}

int num_threads() { return g_num_threads; }

// omp_get_level, not omp_in_parallel: the latter is false inside a region of one thread (an inactive one),
// where a kernel's own region would still be a nested team.
bool open_parallel_region(bool enough_work) { return g_num_threads > 1 && enough_work && omp_get_level() == 0; }

void run_on_each_thread(void (*fn)(int thread, void* context), void* context) {
  const int n_threads = num_threads();
#pragma omp parallel num_threads(n_threads)
  fn(omp_get_thread_num(), context);
}

void run_team_impl(void (*body)(void* context, Team team), void* context) {
  const int n_threads = num_threads();
  if (n_threads == 1 || omp_get_level() > 0) {
    // One thread, or called from inside a parallel region (a pass of its own, or another kernel's): the
    // caller alone, which OpenMP would give a nested region anyway, with no barrier or claims of a pass
    // (an enclosing pass's are put back after, so its threads still meet at its barriers).
    const PassStateCleared cleared;
    body(context, Team{});
    return;
  }
  TeamBarrier barrier;
  // Grown once per calling thread, zero between passes: each pass zeroes the loops it used (every thread
  // of a pass runs the same loops, so the caller's count is everyone's), a few lines where zeroing every
  // slot would write kTeamLoops x threads of them.
  thread_local std::vector<BandClaims> claims;
  const std::size_t slots = static_cast<std::size_t>(kTeamLoops) * n_threads;
  if (claims.size() < slots) claims = std::vector<BandClaims>(slots);
  BandClaims* const all_claims = claims.data();
  int loops_used = 0;
#pragma omp parallel num_threads(n_threads)
  {
    const Team team{omp_get_thread_num(), omp_get_num_threads()};
    t_team_barrier = &barrier;
    t_team_claims = all_claims;
    t_next_loop = 0;
    body(context, team);
    if (team.thread == 0) loops_used = t_next_loop;
    t_team_barrier = nullptr;
    t_team_claims = nullptr;
  }
  for (std::size_t i = 0; i < static_cast<std::size_t>(loops_used) * n_threads; ++i) {
    all_claims[i].taken.store(0, std::memory_order_relaxed);
  }
}

void team_barrier() {
  if (t_team_barrier == nullptr) return;
  // Inside the pass's parallel region: its thread count (OpenMP may give fewer than were asked for).
  const int size = omp_get_num_threads();
  if (size > 1) t_team_barrier->wait(size);
}

namespace {
constexpr std::uint64_t kFront = 1;                   // one item taken from a band's front
constexpr std::uint64_t kBack = std::uint64_t{1} << 32;  // one from its back
int front_taken(std::uint64_t taken) { return static_cast<int>(taken & 0xffffffffu); }
int back_taken(std::uint64_t taken) { return static_cast<int>(taken >> 32); }
// Band `thread`'s claims among a loop's (next_loop_claims()).
std::atomic<std::uint64_t>& claims_of(std::atomic<std::uint64_t>* loop, int thread) {
  return reinterpret_cast<BandClaims*>(loop)[thread].taken;
}
}  // namespace

StealingBands::StealingBands(int n_items, int grain, Team team)
    : n_items_(n_items),
      grain_(grain),
      team_(team),
      // Outside a pass the team is OpenMP's or one thread's: a band each, no stealing.
      words_(next_loop_claims(team)),
      own_next_(team.share(n_items).begin) {}

Band StealingBands::next() {
  if (words_ == nullptr) {  // nobody to share with: the band in one run
    const Band band = team_.share(n_items_);
    if (own_next_ >= band.end) return {-1, -1};
    const int begin = own_next_;
    own_next_ = band.end;
    return {begin, own_next_};
  }
  // Bands from this thread's own (victim_ 0) on, each until it is empty.
  for (; victim_ < team_.n_threads; ++victim_) {
    const int thread = (team_.thread + victim_) % team_.n_threads;
    const Band of = thread_band(n_items_, thread, team_.n_threads);
    const int size = of.end - of.begin;
    std::atomic<std::uint64_t>& word = claims_of(words_, thread);
    std::uint64_t taken = word.load(std::memory_order_relaxed);
    for (;;) {
      const int left = size - front_taken(taken) - back_taken(taken);
      if (left <= 0) break;
      const bool own = victim_ == 0;
      // Own runs take a quarter of what is left (whole grains; at least one): few claims while the band is
      // long (each waits for the core's loads in flight), single grains near its end, where the thieves
      // take theirs one grain at a time. A slowed owner holds at most a quarter of what it had left.
      const int run = std::min(left, own ? std::max(grain_, left / 4 / grain_ * grain_) : grain_);
      if (word.compare_exchange_weak(taken, taken + (own ? kFront : kBack) * run, std::memory_order_relaxed)) {
        if (own) return {of.begin + front_taken(taken), of.begin + front_taken(taken) + run};
        const int end = of.end - back_taken(taken);
        return {end - run, end};
      }
    }
  }
  return {-1, -1};
}

int StealingBands::likely_next() const {
  if (words_ == nullptr) return own_next_ < team_.share(n_items_).end ? own_next_ : -1;
  if (victim_ != 0) return -1;
  const Band own = team_.share(n_items_);
  const std::uint64_t taken = claims_of(words_, team_.thread).load(std::memory_order_relaxed);
  const int next = own.begin + front_taken(taken);
  return next < own.end - back_taken(taken) ? next : -1;
}

void parallel_for_impl(int n, void (*body)(void* context, int item, int thread), void* context) {
  if (!open_parallel_region(n > 1)) {
    for (int i = 0; i < n; ++i) body(context, i, 0);
    return;
  }
#pragma omp parallel num_threads(g_num_threads)
  {
    const int t = omp_get_thread_num();
    const Band band = thread_band(n, t, omp_get_num_threads());
    for (int i = band.begin; i < band.end; ++i) body(context, i, t);
  }
}

}  // namespace shardline::kernels::cpu
