// Measures this host's compute side for the cost model: weight-streaming bandwidth (GEMV) with one core
// and with all cores, from memory and from cache (and how much cache the weights really get), the GEMM
// rate of one core, per weight format, and the costs of a kernel call and of a step inside a pass.
// Links are measured by comm/link_probe.h under MPI; without MPI, defaults for shared memory are used.
#pragma once

#include <vector>

#include "kernels/cpu/weight_format.h"
#include "partition/cluster.h"

namespace shardline::runtime {

// The cost model's name for a weight dtype (partition/ knows no kernels).
partition::WeightFormat weight_format_of(kernels::cpu::WeightDtype dtype);

struct MachineProbeOptions {
  bool quick = true;                 // about 1-2 s instead of 4 (a smaller buffer, fewer repeats)
  int cores = 0;                     // 0: the cores this process may use
  std::size_t max_buffer_bytes = 0;  // cap on the streamed buffer (0: twice the last-level cache, <= 1-2 GiB)
  // The weight formats measured besides fp32 (whose rates are the domain's own fields and always
  // measured): `probe` takes every one, `plan` the one it plans for.
  std::vector<partition::WeightFormat> formats = {partition::WeightFormat::kBf16, partition::WeightFormat::kInt8};

  // fp32's rates and those of `format`: what a plan for weights of `format` needs.
  void only_for(partition::WeightFormat format) {
    formats.clear();
    if (format != partition::WeightFormat::kF32) formats.push_back(format);
  }
};

// A one-node, one-domain ClusterSpec describing this machine as measured now.
partition::ClusterSpec probe_this_machine(const MachineProbeOptions& options = {});

// Cores this process may run on, and usable memory (MemAvailable, within the memory cgroup's limit).
int usable_cores();
double available_memory_bytes();

}  // namespace shardline::runtime
