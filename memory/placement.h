// Where each rank of a host runs: pure math over a HostTopology (no hwloc calls, no binding), so every rule
// below is unit-tested on synthetic topologies.
//
// Rules, for local_size ranks on a host whose NUMA nodes with cores are n_0 .. n_{N-1}:
//   - Ranks are spread over the nodes in contiguous blocks: local rank r goes to node slot r * N / local_size.
//     (8 ranks on 2 nodes: ranks 0-3 on node 0, 4-7 on node 1. TP peers have neighbouring ranks, so they
//     share a node, where their all-reduces are cheapest. 2 ranks on 4 nodes: nodes 0 and 2.)
//   - The ranks of one node split its cores into disjoint contiguous blocks (sizes differ by at most one).
//     Example, 3 ranks on a node of 8 cores: cores 0-1, 2-4, 5-7.
//   - --bind core: the rank's CPU set is its cores; its threads are pinned one per core.
//     --bind numa: the rank's CPU set is all cores of its node (ranks of a node share them).
//     --bind auto: core when the node has at least one core per rank, else numa (and says why).
//     --bind none: nothing is bound.
//   - Memory (arena, KV pool, weights) is bound to the rank's node in every mode but none.
// If the launcher already bound the process (mpirun --bind-to, srun --cpu-bind), that binding is kept:
// see adopt_launcher_binding.
#pragma once

#include <string>
#include <vector>

#include "memory/topology.h"

namespace shardline::memory {

enum class BindMode { kAuto, kNuma, kCore, kNone };

// "auto" | "numa" | "core" | "none"; ConfigError otherwise.
BindMode parse_bind_mode(const std::string& text);
const char* bind_mode_name(BindMode mode);

struct RankPlacement {
  int local_rank = 0;
  int local_size = 1;
  BindMode requested = BindMode::kAuto;
  BindMode applied = BindMode::kNone;  // kCore, kNuma or kNone once auto is resolved
  bool launcher_bound = false;         // the launcher's binding was kept (adopt_launcher_binding)
  int numa_node = -1;                  // OS index of the node memory is bound to; -1: not bound
  std::vector<CoreInfo> cores;         // the cores this rank runs on (with their PUs, for thread pinning)
  std::vector<int> pus;                // OS indices of the CPUs of its CPU set (empty: unbound)
  int ranks_on_node = 0;               // local ranks sharing this rank's node
  std::string note;                    // why the mode differs from the request, if it does

  std::vector<int> core_indices() const;
  // One line: "NUMA node 0, cores 2-3 (PUs 2-3,66-67), bind core".
  std::string describe() const;
};

// The placement of local rank local_rank of local_size on this host. ConfigError when --bind core cannot
// give every rank a core of its own; ResourceError when the topology has no usable core.
RankPlacement plan_placement(const HostTopology& host, int local_rank, int local_size, BindMode mode);

// The placement of a rank that drives a GPU: local rank r of gpu_numa_nodes.size() goes to the node its GPU
// is attached to, gpu_numa_nodes[r] (memory/device_locality.h), and the ranks whose GPUs share a node split
// that node's cores as above, in local-rank order. Example, 4 ranks with GPUs on nodes {1, 1, 0, 0} of a
// host with cores 0-3 on node 0 and 4-7 on node 1, --bind core: rank 0 -> cores 4-5, rank 1 -> 6-7,
// rank 2 -> 0-1, rank 3 -> 2-3. When any rank's GPU has no known node (-1, or a node without cores), every
// rank falls back to plan_placement's spread (so the ranks' core sets stay disjoint), and note says why.
RankPlacement plan_gpu_placement(const HostTopology& host, int local_rank, const std::vector<int>& gpu_numa_nodes,
                                 BindMode mode);

// The launcher bound this process to bound_pus (a strict subset of the CPUs it may use): keep that CPU set,
// bind memory to the node holding those CPUs if they lie on one node, and record it (launcher_bound).
RankPlacement adopt_launcher_binding(const HostTopology& host, const RankPlacement& planned,
                                     const std::vector<int>& bound_pus);

// True when bound_pus is a strict, non-empty subset of host.allowed_pus (someone bound us).
bool is_launcher_bound(const HostTopology& host, const std::vector<int>& bound_pus);

}  // namespace shardline::memory
