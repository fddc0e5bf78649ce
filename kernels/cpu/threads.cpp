#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <immintrin.h>

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

// The running pass's barrier, on each of its threads (null outside a pass).
thread_local TeamBarrier* t_team_barrier = nullptr;
}  // namespace

int set_num_threads(int n_threads) {
  int previous = g_num_threads;
  g_num_threads = n_threads < 1 ? 1 : n_threads;
  omp_set_num_threads(g_num_threads);
  return previous;
}

int num_threads() { return g_num_threads; }

void run_on_each_thread(void (*fn)(int thread, void* context), void* context) {
  const int n_threads = num_threads();
#pragma omp parallel num_threads(n_threads)
  fn(omp_get_thread_num(), context);
}

void run_team_impl(void (*body)(void* context, Team team), void* context) {
  const int n_threads = num_threads();
  if (n_threads == 1) {
    body(context, Team{});
    return;
  }
  TeamBarrier barrier;
#pragma omp parallel num_threads(n_threads)
  {
    const Team team{omp_get_thread_num(), omp_get_num_threads()};
    t_team_barrier = &barrier;
    body(context, team);
    t_team_barrier = nullptr;
  }
}

void team_barrier() {
  if (t_team_barrier == nullptr) return;
  // Inside the pass's parallel region: its thread count (OpenMP may give fewer than were asked for).
  const int size = omp_get_num_threads();
  if (size > 1) t_team_barrier->wait(size);
}

void parallel_for_impl(int n, void (*body)(void* context, int item, int thread), void* context) {
  if (n <= 1 || g_num_threads == 1) {
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
