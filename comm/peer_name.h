// How a timed-out wait names the peer it waited for: by its world rank, the number a user sees in every
// log tag ([rN ...]) and gives to mpirun, with its place in the group the operation ran in.
#pragma once

#include <mpi.h>

#include <string>

#include <fmt/format.h>

namespace shardline::comm {

// "rank 5 (rank 1 of this group)": a group's member by its world rank, then its place in the group.
inline std::string peer_name(int world_rank, int group_rank) {
  return fmt::format("rank {} (rank {} of this group)", world_rank, group_rank);
}

inline std::string peer_name(MPI_Comm group_comm, int group_rank) {
  int world_rank = MPI_UNDEFINED;
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  if (MPI_Comm_group(group_comm, &group) == MPI_SUCCESS && MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS) {
    MPI_Group_translate_ranks(group, 1, &group_rank, world, &world_rank);
  }
  if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
  if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
  if (world_rank == MPI_UNDEFINED) return fmt::format("rank {} of this group", group_rank);
  return peer_name(world_rank, group_rank);
}

}  // namespace shardline::comm
