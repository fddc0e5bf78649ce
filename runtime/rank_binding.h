// Puts this rank where its placement says: plans it from the host's topology and the rank's place among
// the host's ranks (memory/placement.h), binds the process's CPUs (unless the launcher already did: then
// its binding is kept and reported), makes memory prefer the rank's NUMA node, and pins the kernel threads
// one per core. This is the only place that pins kernel threads. The arena, KV pool and weight mappings are bound to the same node by the
// Engine (EngineOptions::numa_node = placement.numa_node).
#pragma once

#include <string>
#include <vector>

#include "memory/placement.h"
#include "memory/topology.h"

namespace shardline::runtime {

struct RankBinding {
  memory::RankPlacement placement;
  std::vector<int> initial_pus;  // the CPU set the process started with
  std::string memory_note;       // why memory is not bound to a node, if it is not
  // The cores of the CPU set the process runs on once bound (ours, the launcher's, or all it was allowed),
  // each with its PUs in that set.
  std::vector<memory::CoreInfo> cpu_cores;
  int pinned_threads = 0;        // kernel threads pinned to a core each (0: none pinned)

  // Kernel threads to use when --threads is not given: one per core of the placement, or the host's cores
  // shared by its ranks when unbound or when the launcher's sets overlap (more cores over the ranks than the
  // host has).
  int default_threads(const memory::HostTopology& host) const;
  // "local rank 1 of 2: NUMA node 0, cores 1 (PUs 1), bind core, 1 thread pinned".
  std::string describe() const;
};

// Plans and applies this rank's placement. ConfigError when the mode cannot be met (--bind core with more
// ranks than cores on a node); ResourceError when binding fails. gpu_numa_nodes: empty for CPU ranks; for
// GPU ranks the NUMA node of every local rank's GPU (size local_size, -1 where unknown), so each rank runs
// next to its GPU (memory::plan_gpu_placement).
RankBinding bind_this_rank(const memory::HostTopology& host, int local_rank, int local_size, memory::BindMode mode,
                           const std::vector<int>& gpu_numa_nodes = {});

// Sets the kernel thread count and pins the threads one per core, so each keeps its core and its L2:
//   - under --bind core, thread t to core t % cores of the placement (always);
//   - otherwise when the rank's CPU set holds exactly `threads` cores (a launcher bound it to that many, or
//     --bind numa / none left it that many), thread t to cpu_cores[t].
// Pinned threads' memory prefers the rank's node. Records the count in pinned_threads.
void start_kernel_threads(RankBinding& binding, int threads);

}  // namespace shardline::runtime
