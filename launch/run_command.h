#pragma once

#include <string>
#include <vector>

#include "launch/cli_options.h"
#include "launch/mpi_session.h"

namespace shardline::launch {

// `shardline run`: generates text. Returns the process exit code.
int run_command(const std::vector<std::string>& args, const MpiSession& mpi);

// run's flags, for reference only (never parse with them): launch-check takes run's flags and ignores them,
// and must still refuse a typo.
po::options_description run_flag_descriptions();

}  // namespace shardline::launch
