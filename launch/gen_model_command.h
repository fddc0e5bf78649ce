#pragma once

#include <string>
#include <vector>

namespace shardline::launch {

// `shardline gen-model`: writes a random-weight checkpoint and a synthetic tokenizer. Returns exit code.
int gen_model_command(const std::vector<std::string>& args);

}  // namespace shardline::launch
