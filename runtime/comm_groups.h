// The one place where a rank's Mesh becomes communicators.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "partition/mesh.h"

namespace shardline::runtime {

struct CommGroups {
  std::unique_ptr<comm::Communicator> world;  // every rank; stages send activations through it
  std::unique_ptr<comm::Communicator> tp;     // this rank's TP group (mesh.tp_group())
};

struct CommGroupOptions {
  bool use_mpi = false;      // false: a one-rank job without MPI (solo communicators)
  double timeout_s = 120.0;  // --comm-timeout
};

// Collective over the world when use_mpi: every rank calls it once, with its own mesh.
CommGroups make_comm_groups(const partition::Mesh& mesh, const CommGroupOptions& options);

}  // namespace shardline::runtime
