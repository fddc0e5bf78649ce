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
  const comm::MpiCommOptions mpi{options.timeout_s};
  groups.world = comm::make_mpi_world(mpi);
  SL_CHECK(groups.world->size() == mesh.world_size() && groups.world->rank() == mesh.rank());
  groups.tp = comm::make_mpi_group(mesh.tp_group(), mpi);
  return groups;
}

}  // namespace shardline::runtime
