// A `shardline run` of a model's golden prompts and the check of its output against the goldens, for every
// suite that launches the real binary (one process, mpirun, Slurm, two hosts):
//
//   const GoldenRun golden = prepare_golden_run("tiny-32k.bin", path("prompts"));
//   const ProcessResult r = run_process(mpirun(2) + shardline_binary() + " run " + golden.flags + " --tp 2");
//   expect_goldens(r, golden.goldens, "tp=2");
// or, in a GoldenCliTest:
//   expect_goldens(run_process(mpirun(2) + golden_run("tiny-32k.bin", "--tp 2")), golden_.goldens, "tp=2");
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_fixture.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {

struct GoldenRun {
  std::vector<Golden> goldens;  // the model's goldens, in the order of the prompts file
  // `run` flags that generate every golden: model, tokenizer, prompts file, 64 greedy steps, one JSON line
  // per sequence, one kernel thread. Layout flags (--tp, --pp) and the like come after them.
  std::string flags;
};

// Writes the golden prompts of `model` (a file name in the models folder) to prompts_path, one per line.
// A GGUF model ("tiny-32k.gguf") has its checkpoint's goldens and brings its own vocabulary.
inline GoldenRun prepare_golden_run(const std::string& model, const std::string& prompts_path) {
  GoldenRun run;
  std::ofstream prompts(prompts_path);
  const bool gguf = model.size() > 5 && model.substr(model.size() - 5) == ".gguf";
  run.goldens = goldens_of(gguf ? model.substr(0, model.size() - 5) + ".bin" : model);
  for (const auto& g : run.goldens) prompts << g.prompt << "\n";
  run.flags = "--model " + model_file(model) + (gguf ? "" : " --tokenizer " + model_file("tokenizer.bin")) +
              " --prompts-file " + prompts_path + " --steps 64 --json --threads 1";
  return run;
}

// The ids of each sequence in `run --json` output (one JSON object per line).
inline std::vector<std::vector<int>> ids_of_json_lines(const std::string& out) {
  std::vector<std::vector<int>> ids;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    ids.push_back(nlohmann::json::parse(line)["ids"].get<std::vector<int>>());
  }
  return ids;
}

// `run --json` output `out` holds exactly the goldens' ids, in order. `what` names the run in failures.
inline void expect_golden_ids(const std::string& out, const std::vector<Golden>& goldens, const std::string& what) {
  ASSERT_FALSE(goldens.empty()) << what << ": no goldens for this model";
  const auto ids = ids_of_json_lines(out);
  ASSERT_EQ(ids.size(), goldens.size()) << what << "\n" << out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(ids[i], goldens[i].ids) << what << " / prompt '" << goldens[i].prompt << "'";
  }
}

// The same for a finished process, which must have exited with 0.
inline void expect_goldens(const ProcessResult& r, const std::vector<Golden>& goldens, const std::string& what) {
  ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.err;
  expect_golden_ids(r.out, goldens, what);
}

// Base fixture for suites that run the golden prompts through the real binary in their scratch folder.
class GoldenCliTest : public CliTest {
 protected:
  // `shardline run` of the golden prompts of model with extra flags; their goldens are in golden_.
  std::string golden_run(const std::string& model, const std::string& extra) {
    golden_ = prepare_golden_run(model, path(model + ".prompts"));
    return shardline_binary() + " run " + golden_.flags + " " + extra;
  }

  GoldenRun golden_;
};

}  // namespace shardline::test
