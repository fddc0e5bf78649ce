#pragma once

#include <string>
#include <vector>

#include "launch/mpi_session.h"

namespace shardline::launch {

// `shardline run`: generates text. Returns the process exit code.
int run_command(const std::vector<std::string>& args, const MpiSession& mpi);

}  // namespace shardline::launch
