// Kernel threads pinned one per core by runtime::start_kernel_threads, checked with sched_getcpu on each
// kernel thread: under --bind core always, otherwise only when the rank's CPU set holds exactly one core
// per thread. (Binding whole ranks under mpirun: tests/mpi/placement_probe.cpp.)
#include "runtime/rank_binding.h"

#include <sched.h>

#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/ops.h"

namespace shardline::runtime {
namespace {

// The CPUs each kernel thread runs on right now.
std::vector<int> cpu_of_each_thread() {
  std::vector<int> seen(static_cast<std::size_t>(kernels::cpu::num_threads()), -1);
  kernels::cpu::run_on_each_thread([](int thread, void* context) { (*static_cast<std::vector<int>*>(context))[thread] = sched_getcpu(); },
                                   &seen);
  return seen;
}

// Puts every kernel thread back on the CPUs the process started with, so later tests are not confined.
class KernelThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(sched_getaffinity(0, sizeof(original_), &original_), 0);
    for (int c = 0; c < CPU_SETSIZE && cpus_.size() < 2; ++c) {
      if (CPU_ISSET(c, &original_)) cpus_.push_back(c);
    }
    previous_threads_ = kernels::cpu::num_threads();
  }
  void TearDown() override {
    kernels::cpu::run_on_each_thread(
        [](int, void* context) { sched_setaffinity(0, sizeof(cpu_set_t), static_cast<cpu_set_t*>(context)); }, &original_);
    kernels::cpu::set_num_threads(previous_threads_);
  }

  // One core per CPU of cpus_ (as if each were a core of one PU).
  std::vector<memory::CoreInfo> one_core_per_cpu() const {
    std::vector<memory::CoreInfo> cores;
    for (int c : cpus_) cores.push_back({static_cast<int>(cores.size()), {c}});
    return cores;
  }

  cpu_set_t original_;
  std::vector<int> cpus_;  // up to two CPUs this process may use
  int previous_threads_ = 1;
};

TEST_F(KernelThreads, OneCorePerThreadPinsEachThreadToItsCore) {
  RankBinding binding;  // not bound by us (--bind none, or a launcher's binding kept)
  binding.cpu_cores = one_core_per_cpu();
  const int threads = static_cast<int>(cpus_.size());
  start_kernel_threads(binding, threads);
  EXPECT_EQ(kernels::cpu::num_threads(), threads);
  EXPECT_EQ(binding.pinned_threads, threads);
  EXPECT_EQ(cpu_of_each_thread(), cpus_);
}

TEST_F(KernelThreads, MoreThreadsThanCoresAreLeftAloneUnlessBoundToCores) {
  RankBinding binding;
  binding.cpu_cores = one_core_per_cpu();
  start_kernel_threads(binding, static_cast<int>(cpus_.size()) + 1);
  EXPECT_EQ(binding.pinned_threads, 0) << "more threads than cores must not be pinned";

  // --bind core to one core: every thread on it (thread t on core t % cores).
  RankBinding bound;
  bound.placement.applied = memory::BindMode::kCore;
  bound.placement.cores = {{0, {cpus_[0]}}};
  bound.cpu_cores = bound.placement.cores;
  start_kernel_threads(bound, 2);
  EXPECT_EQ(bound.pinned_threads, 2);
  EXPECT_EQ(cpu_of_each_thread(), std::vector<int>(2, cpus_[0]));
}

TEST(DefaultThreads, OverlappingLauncherSetsShareTheHostsCores) {
  memory::HostTopology host;
  host.n_cores = 8;
  RankBinding binding;
  binding.placement.launcher_bound = true;
  binding.placement.local_size = 2;
  binding.placement.cores.resize(4);  // disjoint halves of the host: a thread per core of its own
  EXPECT_EQ(binding.default_threads(host), 4);
  binding.placement.local_size = 4;  // four ranks each given four of the eight cores: they overlap
  EXPECT_EQ(binding.default_threads(host), 2);
  host.n_cores = 16;  // mpirun --bind-to socket, two sockets of 8 cores, 20 ranks: 10 on each socket's 8
  binding.placement.cores.resize(8);
  binding.placement.local_size = 20;
  EXPECT_EQ(binding.default_threads(host), 1);
  binding.placement.launcher_bound = false;  // our own --bind core keeps a thread per core of its placement
  binding.placement.applied = memory::BindMode::kCore;
  binding.placement.cores.resize(1);
  EXPECT_EQ(binding.default_threads(host), 1);
}

}  // namespace
}  // namespace shardline::runtime
