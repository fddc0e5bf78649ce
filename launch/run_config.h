// run's flags: their descriptions, and what they hold once checked (RunConfig). The checks here need no
// model and no peer: only the world's size and rank (a prompts file every task reads, a message said once).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "launch/cli_options.h"
#include "launch/mpi_session.h"
#include "memory/placement.h"
#include "runtime/backend_choice.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"

namespace shardline::launch {

struct RunConfig {
  runtime::EngineOptions engine;
  std::vector<runtime::GenerationRequest> requests;
  int tp = 0;  // 0 = not given
  int pp = 0;
  double comm_timeout_s = kDefaultCommTimeoutS;
  std::string plan = "auto";
  std::string dump_logits;
  std::string prompts_file;  // or ""
  bool json = false;
  bool verbose = false;
  bool print_config = false;
  bool default_model = false;
  bool threads_given = false;  // else: one thread per core of the rank's placement
  bool steps_given = false;    // else: kDefaultSteps, cut to what each prompt leaves of the context
  std::string cpu_only_reason;  // why the CUDA stage cannot take this run (phase 1), or ""
  runtime::TensorRef file_w1;   // the first layer's w1 as the file holds it, for the quantised-file note (phase 1)
  std::uint64_t gpu_weight_bytes = 0;  // about what a rank's weights take on a GPU (phase 1; --device auto)
  std::uint64_t prompt_ids_hash = 0;  // of every request's token ids (phase 1): ranks must encode alike
  memory::BindMode bind = memory::BindMode::kAuto;
  runtime::DeviceRequest device = runtime::DeviceRequest::kAuto;
};

// Without --steps: a demo's length, as far as the model's context allows (an explicit --steps is checked).
inline constexpr int kDefaultSteps = 128;

// run's flags parsed and checked; nullopt when --help was printed.
std::optional<RunConfig> parse_run_config(const std::vector<std::string>& args, const MpiSession& mpi);

// A model without --tokenizer: a GGUF file its own vocabulary, else "<stem>.tokenizer.bin" (what gen-model
// writes), else tokenizer.bin beside it. ResourceError when none is there.
std::string find_tokenizer_for(const std::string& model_path);

// ResourceError when the requests' prompts, ids and text (at their --steps) would not fit in this host's
// available memory.
void check_requests_fit_in_memory(const std::vector<runtime::GenerationRequest>& requests);

// run's flags, for reference only (never parse with them): launch-check takes run's flags and ignores them,
// and must still refuse a typo.
po::options_description run_flag_descriptions();

}  // namespace shardline::launch
