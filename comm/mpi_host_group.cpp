#include <mpi.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/host_group.h"
#include "common/error.h"

namespace shardline::comm {

namespace {
void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommError(fmt::format("MPI {} failed: {}", what, std::string(text, length)));
}
}  // namespace

HostRanks mpi_host_ranks() {
  int world_rank = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "Comm_rank");
  MPI_Comm host = MPI_COMM_NULL;
  // key = world rank: local ranks follow world order, so TP peers (neighbouring ranks) stay neighbours.
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &host),
        "Comm_split_type(shared)");
  HostRanks ranks;
  const int rank_code = MPI_Comm_rank(host, &ranks.local_rank);
  const int size_code = MPI_Comm_size(host, &ranks.local_size);
  MPI_Comm_free(&host);
  check(rank_code, "Comm_rank(host)");
  check(size_code, "Comm_size(host)");
  return ranks;
}

std::vector<int> mpi_host_all_gather(int value) {
  int world_rank = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "Comm_rank");
  MPI_Comm host = MPI_COMM_NULL;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &host),
        "Comm_split_type(shared)");
  int size = 0;
  int code = MPI_Comm_size(host, &size);
  std::vector<int> values(static_cast<std::size_t>(size > 0 ? size : 0));
  if (code == MPI_SUCCESS) code = MPI_Allgather(&value, 1, MPI_INT, values.data(), 1, MPI_INT, host);
  MPI_Comm_free(&host);
  check(code, "Allgather(host)");
  return values;
}

}  // namespace shardline::comm
