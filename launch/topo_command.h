#pragma once

#include <string>
#include <vector>

namespace shardline::launch {

// `shardline topo`: prints the host's topology and the placement each local rank would get (no MPI job).
// Returns the process exit code.
int topo_command(const std::vector<std::string>& args);

}  // namespace shardline::launch
