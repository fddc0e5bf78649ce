// Communicator over MPI. Every blocking operation is a non-blocking MPI call polled against a deadline, so
// a peer that hangs (or died without the launcher noticing) ends in a CommError naming the operation and
// the peer instead of a job that waits forever.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace shardline::comm {

struct MpiCommOptions {
  double timeout_s = 120.0;  // longest wait for peers in one operation (--comm-timeout)
  // all_reduce_sum and all_gather_v through shared memory when every rank of the group is on one host
  // (host_collectives.h; MPI's collectives otherwise): the runtime's groups (runtime/comm_groups.cpp).
  bool host_collectives = false;
};

// This process's view of MPI_COMM_WORLD (MPI must be initialised by the caller: launch/ owns that scope).
std::unique_ptr<Communicator> make_mpi_world(const MpiCommOptions& options);

// A communicator of exactly `ranks` (world ranks, in the order they get ranks 0..n-1), which must contain
// this process. Collective over the world: every process calls it once with the group it belongs to, and
// the groups of all processes must partition the world.
std::unique_ptr<Communicator> make_mpi_group(const std::vector<int>& ranks, const MpiCommOptions& options);

}  // namespace shardline::comm
