// Which ranks share this rank's host: the MPI shared-memory split (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED), ordered by world rank. Placement (memory/placement.h) spreads a host's ranks over
// its NUMA nodes by this local rank.
#pragma once

namespace shardline::comm {

struct HostRanks {
  int local_rank = 0;  // this rank's index among the ranks on its host (ordered by world rank)
  int local_size = 1;  // ranks on this host
};

// Collective over MPI_COMM_WORLD (MPI must be initialised; launch/ owns that scope). CommError on failure.
HostRanks mpi_host_ranks();

}  // namespace shardline::comm
