#pragma once

#include <string>
#include <vector>

namespace shardline::launch {

// `shardline launch-check`: the preflight a launch script runs before mpirun/srun (see launch_check.h).
// It takes the run flags too (reads --tp, --pp, --model, --layers-per-stage; ignores the rest), so a
// script passes one argument list to both. Never initialises MPI. Returns the process exit code.
int launch_check_command(const std::vector<std::string>& args);

}  // namespace shardline::launch
