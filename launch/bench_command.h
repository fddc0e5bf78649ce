#pragma once

#include <string>
#include <vector>

#include "launch/mpi_session.h"

namespace shardline::launch {

// `shardline bench`: decode (batch 1/4/16) and prefill throughput of generated 15M / 110M / 1.1B-shape
// models in each weight dtype, as fractions of a read-bandwidth roofline measured in the same run
// (runtime/roofline_bench.h). Runs as one plain process or under mpirun with --tp / --pp. Returns the exit
// code.
int bench_command(const std::vector<std::string>& args, const MpiSession& mpi);

}  // namespace shardline::launch
