#include "launch/placement_setup.h"

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "comm/host_group.h"
#include "common/log.h"
#include "memory/device_locality.h"

namespace shardline::launch {

namespace {

// The number a launcher variable starts with (Slurm's "4(x2),3" gives 4), from 0 to 2^30 as launch_env.cpp
// bounds its counts: anything else is no hint at all. A value past INT_MAX was narrowed to a negative local
// rank, and INT_MAX itself overflowed the "+ 1" below (a fuzzing pass under UBSan).
std::optional<int> env_int(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || parsed < 0 || parsed >= (1L << 30)) return std::nullopt;
  return static_cast<int>(parsed);
}

// What the launcher says about this host's ranks, if it says anything. Slurm's per-node task count comes
// as "4(x2),3"; its first number is this node's when the nodes are alike, so it is only a hint.
comm::HostRanks host_ranks_from_hints() {
  comm::HostRanks ranks;
  if (auto rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK")) {
    ranks.local_rank = *rank;
    ranks.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(*rank + 1);
  } else if (auto id = env_int("SLURM_LOCALID")) {
    ranks.local_rank = *id;
    ranks.local_size = env_int("SLURM_STEP_TASKS_PER_NODE").value_or(env_int("SLURM_TASKS_PER_NODE").value_or(*id + 1));
  }
  if (ranks.local_size <= ranks.local_rank) ranks.local_size = ranks.local_rank + 1;
  return ranks;
}

}  // namespace

PlacedRank place_this_rank(const MpiSession& mpi, memory::BindMode mode, const std::optional<RankGpu>& gpu) {
  const comm::HostRanks hint = host_ranks_from_hints();
  comm::HostRanks ranks = hint;
  if (mpi.active()) {
    ranks = comm::mpi_host_ranks();
    if (std::getenv("OMPI_COMM_WORLD_LOCAL_RANK") || std::getenv("SLURM_LOCALID")) {
      if (hint.local_rank != ranks.local_rank || hint.local_size != ranks.local_size) {
        log::warn("the launcher says local rank {} of {}, MPI's shared-memory split says {} of {}; using MPI's",
                  hint.local_rank, hint.local_size, ranks.local_rank, ranks.local_size);
      }
    }
  }
  PlacedRank placed;
  std::vector<int> gpu_nodes;
  if (gpu) {
    // Nothing may throw between here and the host all-gather, or the other ranks would wait in it: a
    // failure is carried past the collective and rethrown after it.
    std::exception_ptr failure;
    memory::DeviceNumaNode mine;
    try {
      placed.host = memory::discover_host_topology(/*with_devices=*/true);
      mine = memory::device_numa_node(placed.host, gpu->pci_bus_id, gpu->driver_numa_node);
    } catch (...) {
      failure = std::current_exception();
    }
    if (mpi.active()) {
      gpu_nodes = comm::mpi_host_all_gather(mine.numa_node);
    } else {
      // A plain process knows only its own GPU: other local ranks' count as unknown (the CPU spread).
      gpu_nodes.assign(static_cast<std::size_t>(ranks.local_size), -1);
      gpu_nodes[static_cast<std::size_t>(ranks.local_rank)] = mine.numa_node;
    }
    if (failure) std::rethrow_exception(failure);
    placed.gpu_note = mine.note;
    if (mine.numa_node < 0) log::warn("{}: this rank is placed as a CPU rank would be", mine.note);
  } else {
    placed.host = memory::discover_host_topology(/*with_devices=*/false);
  }
  placed.binding = runtime::bind_this_rank(placed.host, ranks.local_rank, ranks.local_size, mode, gpu_nodes);
  return placed;
}

}  // namespace shardline::launch
