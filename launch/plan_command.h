#pragma once

#include <string>
#include <vector>

namespace shardline::launch {

// `shardline plan`: lays a model out on a cluster and predicts what it costs. No MPI job, no weights.
int plan_command(const std::vector<std::string>& args);

}  // namespace shardline::launch
