// Wires a rank's placement: its place among the ranks of its host (the MPI shared-memory split when MPI
// runs; SLURM_LOCALID / OMPI_COMM_WORLD_LOCAL_RANK as hints, and as the answer for plain processes), then
// runtime::bind_this_rank. Only launch/ reads the environment.
#pragma once

#include "launch/mpi_session.h"
#include "memory/placement.h"
#include "memory/topology.h"
#include "runtime/rank_binding.h"

namespace shardline::launch {

struct PlacedRank {
  memory::HostTopology host;
  runtime::RankBinding binding;
};

// Collective over the world when MPI is active (every rank calls it once, at the same point).
PlacedRank place_this_rank(const MpiSession& mpi, memory::BindMode mode);

}  // namespace shardline::launch
