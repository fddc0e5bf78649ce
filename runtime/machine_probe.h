// Measures this host's compute side for the cost model: weight-streaming bandwidth (GEMV) with one core
// and with all cores, from memory and from cache (and how much cache the weights really get), the GEMM
// rate of one core, per weight format, and the costs of a kernel call and of a step inside a pass.
// Links are measured by comm/link_probe.h under MPI; without MPI, defaults for shared memory are used.
#pragma once

#include <vector>

#include "partition/cluster.h"

namespace shardline::runtime {

struct MachineProbeOptions {
  bool quick = true;                 // ~0.5 s instead of a few seconds (smaller buffers, fewer repeats)
  int cores = 0;                     // 0: the cores this process may use
  std::size_t max_buffer_bytes = 0;  // cap on the streamed buffer (0: twice the last-level cache, <= 1-2 GiB)
  // The weight formats measured besides fp32 (whose rates are the domain's own fields and always
  // measured): `probe` takes every one, `plan` the one it plans for.
  std::vector<partition::WeightFormat> formats = {partition::WeightFormat::kBf16, partition::WeightFormat::kInt8};
};

// A one-node, one-domain ClusterSpec describing this machine as measured now.
partition::ClusterSpec probe_this_machine(const MachineProbeOptions& options = {});

// Cores this process may run on, and usable memory (MemAvailable from /proc/meminfo).
int usable_cores();
double available_memory_bytes();

}  // namespace shardline::runtime
