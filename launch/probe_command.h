#pragma once

#include <string>
#include <vector>

#include "launch/mpi_session.h"

namespace shardline::launch {

// `shardline probe`: measures links (under mpirun) and this host's compute, writes a cluster profile.
int probe_command(const std::vector<std::string>& args, const MpiSession& mpi);

}  // namespace shardline::launch
