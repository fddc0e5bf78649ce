// Which ranks share this rank's host: the MPI shared-memory split (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED), ordered by world rank. Placement (memory/placement.h) spreads a host's ranks over
// its NUMA nodes by this local rank.
#pragma once

#include <vector>

namespace shardline::comm {

struct HostRanks {
  int local_rank = 0;  // this rank's index among the ranks on its host (ordered by world rank)
  int local_size = 1;  // ranks on this host
};

// Collective over MPI_COMM_WORLD (MPI must be initialised; launch/ owns that scope). CommError on failure.
HostRanks mpi_host_ranks();

// Every rank of this host contributes one value; all of them get the host's values in local-rank order.
// Collective over MPI_COMM_WORLD, like mpi_host_ranks. CommError on failure. (GPU placement: each rank
// knows only its own GPU's NUMA node, and the ranks of a node split its cores.)
std::vector<int> mpi_host_all_gather(int value);

}  // namespace shardline::comm
