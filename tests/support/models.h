// Where tests find the reference models (../shared/models, or $SHARDLINE_MODELS_DIR), and the rule for a
// missing file: a failure under CI=true, a skip elsewhere (a developer without the data still gets the
// other tests).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace shardline::test {

inline std::string models_dir() {
  if (const char* env = std::getenv("SHARDLINE_MODELS_DIR"); env && *env) return env;
  return SHARDLINE_DEFAULT_MODELS_DIR;
}

inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

inline std::string model_file(const std::string& name) { return models_dir() + "/" + name; }

// Use inside a TEST body: returns from it (skip or failure) when the file is missing.
#define SHARDLINE_REQUIRE_MODEL_FILE(path)                                                        \
  do {                                                                                            \
    if (!std::filesystem::exists(path)) {                                                         \
      if (::shardline::test::in_ci()) FAIL() << "reference file missing under CI=true: " << (path); \
      GTEST_SKIP() << "reference file missing: " << (path) << " (set SHARDLINE_MODELS_DIR)";      \
    }                                                                                             \
  } while (0)

struct Golden {
  std::string model;
  std::string prompt;
  std::vector<int> prompt_ids;
  int steps = 0;
  std::string run_c_text;
  std::vector<int> ids;
  double min_margin = 0;
};

inline std::vector<Golden> load_goldens() {
  std::vector<Golden> goldens;
  std::ifstream in(model_file("goldens.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    goldens.push_back({j["model"], j["prompt"], j["prompt_ids"].get<std::vector<int>>(), j["steps"],
                       j["run_c_text"], j["ids"].get<std::vector<int>>(), j["min_margin"]});
  }
  return goldens;
}

// The goldens of one model (a file name in the models folder), in file order.
inline std::vector<Golden> goldens_of(const std::string& model) {
  std::vector<Golden> of_model;
  for (auto& g : load_goldens()) {
    if (g.model == model) of_model.push_back(std::move(g));
  }
  return of_model;
}

}  // namespace shardline::test
