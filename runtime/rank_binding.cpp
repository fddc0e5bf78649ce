#include "runtime/rank_binding.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/ops.h"
#include "memory/binding.h"

namespace shardline::runtime {

int RankBinding::default_threads(const memory::HostTopology& host) const {
  if (!placement.cores.empty() && placement.launcher_bound) {
    // A launcher that gave the host's ranks more cores than it has gave them overlapping sets (mpirun
    // --bind-to socket with more ranks on a socket than its cores): a thread per core of each set would run
    // ranks x cores threads on them. The host's cores shared by its ranks instead. (A set that is the whole
    // host, as srun --overcommit --exclusive gives, is no launcher binding: plan_placement's rules apply.)
    const int cores = static_cast<int>(placement.cores.size());
    if (static_cast<long long>(cores) * placement.local_size > host.n_cores) {
      return std::clamp(host.n_cores / std::max(1, placement.local_size), 1, cores);
    }
    return cores;
  }
  if (!placement.cores.empty() && placement.applied == memory::BindMode::kCore) {
    return static_cast<int>(placement.cores.size());
  }
  if (placement.applied == memory::BindMode::kNuma) {
    return std::max(1, static_cast<int>(placement.cores.size()) / std::max(1, placement.ranks_on_node));
  }
  return std::max(1, host.n_cores / std::max(1, placement.local_size));
}

std::string RankBinding::describe() const {
  std::string text = fmt::format("local rank {} of {}: {}", placement.local_rank, placement.local_size,
                                 placement.describe());
  if (pinned_threads > 0) text += fmt::format(", {} thread{} pinned one per core", pinned_threads, pinned_threads == 1 ? "" : "s");
  if (!memory_note.empty()) text += fmt::format("; memory not bound: {}", memory_note);
  return text;
}

namespace {
// The cores holding any of pus, each with only its PUs among them, in the host's order.
std::vector<memory::CoreInfo> cores_within(const memory::HostTopology& host, const std::vector<int>& pus) {
  const std::set<int> wanted(pus.begin(), pus.end());
  std::vector<memory::CoreInfo> cores;
  for (const auto& node : host.numa_nodes) {
    for (const auto& core : node.cores) {
      memory::CoreInfo kept{core.index, {}};
      for (int pu : core.pus) {
        if (wanted.count(pu)) kept.pus.push_back(pu);
      }
      if (!kept.pus.empty()) cores.push_back(std::move(kept));
    }
  }
  return cores;
}
}  // namespace

RankBinding bind_this_rank(const memory::HostTopology& host, int local_rank, int local_size, memory::BindMode mode,
                           const std::vector<int>& gpu_numa_nodes) {
  SL_CHECK(host.is_this_system);
  SL_CHECK(gpu_numa_nodes.empty() || static_cast<int>(gpu_numa_nodes.size()) == local_size);
  RankBinding b;
  b.initial_pus = memory::process_cpus();
  const memory::RankPlacement planned = gpu_numa_nodes.empty()
                                            ? memory::plan_placement(host, local_rank, local_size, mode)
                                            : memory::plan_gpu_placement(host, local_rank, gpu_numa_nodes, mode);
  const bool launcher_bound = memory::is_launcher_bound(host, b.initial_pus);
  if (launcher_bound && mode != memory::BindMode::kNone) {
    // Do not fight the launcher (mpirun --bind-to, srun --cpu-bind): keep its CPUs, follow them with memory.
    b.placement = memory::adopt_launcher_binding(host, planned, b.initial_pus);
  } else {
    b.placement = planned;
    if (launcher_bound) {
      b.placement.note = fmt::format("the launcher bound this process to PUs {}", memory::format_index_list(b.initial_pus));
    }
    if (b.placement.applied != memory::BindMode::kNone) memory::bind_process_cpus(b.placement.pus);
  }
  b.cpu_cores = cores_within(host, b.placement.applied != memory::BindMode::kNone ? b.placement.pus : b.initial_pus);
  if (b.placement.numa_node >= 0 && !memory::prefer_node_for_this_thread(b.placement.numa_node, &b.memory_note)) {
    b.placement.numa_node = -1;  // no NUMA support in the kernel, or not permitted: nothing can be bound
    if (host.numa_nodes.size() > 1) {  // where it matters; an info line, so one rank (the output rank) says it
      log::info("memory is not bound to the ranks' NUMA nodes: {}; pages land wherever the kernel puts them",
                b.memory_note);
    }
  }
  return b;
}

namespace {
struct PinJob {
  const std::vector<memory::CoreInfo>* cores;
  int node;
  std::vector<std::string> errors;  // (threads): an exception must not leave an OpenMP region
};
void pin_one(int thread, void* context) {
  auto& job = *static_cast<PinJob*>(context);
  const auto& core = (*job.cores)[static_cast<std::size_t>(thread) % job.cores->size()];
  try {
    memory::bind_this_thread_cpus(core.pus);
    if (job.node >= 0) memory::prefer_node_for_this_thread(job.node);
  } catch (const std::exception& e) {
    job.errors[thread] = e.what();
  }
}
}  // namespace

void start_kernel_threads(RankBinding& binding, int threads) {
  SL_CHECK(threads >= 1);
  kernels::cpu::set_num_threads(threads);
  const auto& p = binding.placement;
  const std::vector<memory::CoreInfo>* cores = nullptr;
  if (p.applied == memory::BindMode::kCore && !p.cores.empty()) {
    cores = &p.cores;
  } else if (static_cast<int>(binding.cpu_cores.size()) == threads) {
    cores = &binding.cpu_cores;
  }
  if (cores == nullptr) return;  // fewer or more threads than cores: leave them to the OS
  PinJob job{cores, p.numa_node, std::vector<std::string>(threads)};
  kernels::cpu::run_on_each_thread(&pin_one, &job);
  for (const auto& error : job.errors) {
    if (!error.empty()) throw ResourceError(fmt::format("pinning kernel threads: {}", error));
  }
  binding.pinned_threads = threads;
}

}  // namespace shardline::runtime
