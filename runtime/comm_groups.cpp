#include "runtime/comm_groups.h"

#include "comm/mpi_communicator.h"
#include "common/error.h"

namespace shardline::runtime {

CommGroups make_comm_groups(const partition::Mesh& mesh, const CommGroupOptions& options) {
  CommGroups groups;
  if (!options.use_mpi) {
    SL_CHECK_MSG(mesh.world_size() == 1, "a {}-rank mesh needs MPI", mesh.world_size());
    groups.world = comm::make_solo_communicator();
    groups.tp = comm::make_solo_communicator();
    return groups;
  }
  // Shared-memory collectives where a group's ranks share a host: the TP groups' two all-reduces per layer
  // and logits gather are on every step's critical path, and the world's all-reduce is what the planner's
  // link probe times for them (runtime/auto_plan.cpp).
  const comm::MpiCommOptions mpi{.timeout_s = options.timeout_s, .host_collectives = true};
  groups.world = comm::make_mpi_world(mpi);
  SL_CHECK(groups.world->size() == mesh.world_size() && groups.world->rank() == mesh.rank());
  groups.tp = comm::make_mpi_group(mesh.tp_group(), mpi);
  return groups;
}

}  // namespace shardline::runtime
