// Wires a rank's placement: its place among the ranks of its host (the MPI shared-memory split when MPI
// runs; SLURM_LOCALID / OMPI_COMM_WORLD_LOCAL_RANK as hints, and as the answer for plain processes), then
// runtime::bind_this_rank. Only launch/ reads the environment.
#pragma once

#include <optional>
#include <string>

#include "launch/mpi_session.h"
#include "memory/placement.h"
#include "memory/topology.h"
#include "runtime/rank_binding.h"

namespace shardline::launch {

struct PlacedRank {
  memory::HostTopology host;
  runtime::RankBinding binding;
  std::string gpu_note;  // GPU ranks: where this rank's GPU is ("GPU 0000:17:00.0 is on NUMA node 0") or why unknown
};

// The GPU a rank drives, when it drives one (runtime::BackendChoice).
struct RankGpu {
  std::string pci_bus_id;     // "0000:17:00.0"
  int driver_numa_node = -1;  // the CUDA driver's idea of its node, used when hwloc has none
};

// Collective over the world when MPI is active (every rank calls it once, at the same point). With gpu, the
// topology is read with its PCI devices and the rank is placed on its GPU's NUMA node
// (memory::device_locality.h); every rank of the job must then pass one (all run on GPUs or none do).
PlacedRank place_this_rank(const MpiSession& mpi, memory::BindMode mode, const std::optional<RankGpu>& gpu = {});

}  // namespace shardline::launch
