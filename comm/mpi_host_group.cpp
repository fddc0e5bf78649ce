#include <mpi.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/host_group.h"
#include "comm/mpi_check.h"
#include "common/error.h"

namespace shardline::comm {

HostRanks mpi_host_ranks() {
  int world_rank = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "Comm_rank");
  MPI_Comm host = MPI_COMM_NULL;
  // key = world rank: local ranks follow world order, so TP peers (neighbouring ranks) stay neighbours.
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &host),
        "Comm_split_type(shared)");
  HostRanks ranks;
  const int rank_code = MPI_Comm_rank(host, &ranks.local_rank);
  const int size_code = MPI_Comm_size(host, &ranks.local_size);
  MPI_Comm_free(&host);
  check_mpi(rank_code, "Comm_rank(host)");
  check_mpi(size_code, "Comm_size(host)");
  return ranks;
}

std::vector<int> mpi_host_all_gather(int value) {
  int world_rank = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "Comm_rank");
  MPI_Comm host = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &host),
        "Comm_split_type(shared)");
  int size = 0;
  int code = MPI_Comm_size(host, &size);
  std::vector<int> values(static_cast<std::size_t>(size > 0 ? size : 0));
  if (code == MPI_SUCCESS) code = MPI_Allgather(&value, 1, MPI_INT, values.data(), 1, MPI_INT, host);
  MPI_Comm_free(&host);
  check_mpi(code, "Allgather(host)");
  return values;
}

}  // namespace shardline::comm
