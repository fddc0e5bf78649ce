// Named model shapes: the generated test/benchmark models and common public models for the planner.
#pragma once

#include <string>
#include <vector>

#include "partition/model_shape.h"

namespace shardline::partition {

struct ModelPreset {
  std::string name;         // what --preset takes, e.g. "110m", "llama2-7b"
  std::string description;  // one line for --help and `plan`
  ModelShape shape;
};

const std::vector<ModelPreset>& model_presets();

// The preset of that name; ConfigError listing the known names otherwise.
const ModelPreset& find_model_preset(const std::string& name);

// "15m, 110m, 1.1b, ..." for help texts.
std::string model_preset_names();

}  // namespace shardline::partition
