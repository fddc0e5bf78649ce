#include "launch/run_command.h"

#include <cstdio>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "common/error.h"
#include "common/log.h"
#include "common/units.h"
#include "launch/cli_options.h"
#include "partition/mesh.h"
#include "runtime/engine.h"
#include "runtime/model_generator.h"

namespace shardline::launch {

namespace {

struct RunConfig {
  runtime::EngineOptions engine;
  runtime::GenerationRequest request;
  bool steps_given = false;
  bool json = false;
  bool verbose = false;
  bool print_config = false;
  bool default_model = false;
};

// A model without --tokenizer: "<stem>.tokenizer.bin" (what gen-model writes), else tokenizer.bin beside it.
std::string find_tokenizer_for(const std::string& model_path) {
  namespace fs = std::filesystem;
  const std::string generated = runtime::default_tokenizer_path_for(model_path);
  if (fs::exists(generated)) return generated;
  const fs::path beside = fs::path(model_path).parent_path() / "tokenizer.bin";
  if (fs::exists(beside)) return beside.string();
  throw ConfigError(fmt::format("no tokenizer found for '{}' (looked for '{}' and '{}'); pass --tokenizer FILE",
                                model_path, generated, beside.string()));
}

RunConfig parse_run_config(const std::vector<std::string>& args, const MpiSession& mpi, bool& proceed) {
  RunConfig c;
  std::string log_level = "info";
  po::options_description options("run options");
  options.add_options()
      ("model,m", po::value(&c.engine.model_path), "llama2.c checkpoint (default: a built-in random-weight model)")
      ("tokenizer,z", po::value(&c.engine.tokenizer_path), "tokenizer.bin (default: found beside the model)")
      ("prompt,i", po::value(&c.request.prompt)->default_value("Once upon a time"), "prompt text")
      ("steps,n", po::value(&c.request.steps)->default_value(256), "tokens to generate after the prompt")
      ("temperature,t", po::value(&c.request.sampler.temperature)->default_value(0.0f, "0"),
       "sampling temperature; 0 = greedy")
      ("top-p,p", po::value(&c.request.sampler.top_p)->default_value(0.9f, "0.9"),
       "nucleus sampling threshold in (0,1); other values disable it")
      ("seed,s", po::value(&c.request.sampler.seed)->default_value(42), "random seed for sampling")
      ("threads", po::value<int>(), "kernel threads of this rank (default: the cores it may use)")
      ("chunk-tokens", po::value(&c.engine.chunk_tokens)->default_value(64), "prefill chunk size in tokens")
      ("json", po::bool_switch(&c.json), "print one JSON object per sequence instead of text")
      ("verbose,v", po::bool_switch(&c.verbose), "more statistics and placement details")
      ("print-config", po::bool_switch(&c.print_config), "print the resolved configuration and exit")
      ("log-level", po::value(&log_level)->default_value("info"), "debug|info|warn|error|off");
  po::variables_map vm;
  const std::string usage =
      "Usage: shardline run [--model M.bin --tokenizer T.bin] [--prompt TEXT] [--steps N] [options]\n"
      "       mpirun -np 1 shardline run ...\n\n"
      "Generates text. Prints the prompt and the generation to stdout, statistics to stderr.";
  proceed = parse_command_line("run", usage, options, args, vm);
  if (!proceed) return c;
  log::set_level(c.verbose && log_level == "info" ? log::Level::kDebug : log::parse_level(log_level));
  c.steps_given = !vm["steps"].defaulted();
  c.engine.threads = vm.count("threads") ? vm["threads"].as<int>() : available_cores();
  if (c.engine.threads < 1) throw ConfigError("--threads must be >= 1");
  if (c.engine.model_path.empty()) {
    if (!c.engine.tokenizer_path.empty()) {
      throw ConfigError("--tokenizer without --model: the built-in model has its own tokenizer; pass --model too");
    }
    c.default_model = true;
  } else if (c.engine.tokenizer_path.empty()) {
    c.engine.tokenizer_path = find_tokenizer_for(c.engine.model_path);
  }
  return c;
}

void print_json(const runtime::GenerationResult& r) {
  nlohmann::json j;
  j["prompt"] = r.prompt;
  j["prompt_ids"] = r.prompt_ids;
  j["ids"] = r.ids;
  j["text"] = r.text;
  j["generated_text"] = r.generated_text;
  // Generated text may hold partial UTF-8 sequences (byte tokens); replace rather than fail.
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
}

void print_stats(const runtime::Engine& engine, const runtime::GenerationResult& r, int threads) {
  const auto& s = r.stats;
  const int decode_forwards = s.generated_tokens > 1 ? s.generated_tokens - 1 : 0;
  log::info("load {:.3f} s | prefill {} tok in {:.3f} s ({:.1f} tok/s) | decode {} tok in {:.3f} s ({:.1f} tok/s) "
            "| {} thread{}",
            engine.load_s(), s.prompt_tokens, s.prefill_s, s.prefill_s > 0 ? s.prompt_tokens / s.prefill_s : 0.0,
            s.generated_tokens, s.decode_s, s.decode_s > 0 ? decode_forwards / s.decode_s : 0.0, threads,
            threads == 1 ? "" : "s");
}

}  // namespace

int run_command(const std::vector<std::string>& args, const MpiSession& mpi) {
  bool proceed = true;
  RunConfig config = parse_run_config(args, mpi, proceed);
  if (!proceed) return 0;
  if (mpi.world_size() > 1) {
    throw ConfigError(fmt::format("this job has {} ranks but a single-rank layout; launch with -np 1",
                                  mpi.world_size()));
  }
  const partition::Mesh mesh = partition::Mesh::single();
  if (config.default_model) {
    const auto paths = runtime::ensure_default_model();
    config.engine.model_path = paths.model;
    config.engine.tokenizer_path = paths.tokenizer;
    log::warn("no --model given: using the built-in default model, which has RANDOM WEIGHTS (its text is "
              "gibberish); pass --model to run a real checkpoint");
  }
  if (!config.steps_given) {
    // The default step count is a convenience; keep it inside the context like llama2.c does.
    config.request.steps = std::max(1, std::min(config.request.steps, 128));
  }
  if (config.print_config) {
    std::cout << fmt::format("model: {}\ntokenizer: {}\nprompt: {}\nsteps: {}\ntemperature: {}\ntop_p: {}\nseed: {}\n"
                             "threads: {}\nchunk_tokens: {}\nlauncher: {}\nworld_size: {}\ntp: 1\npp: 1\n",
                             config.engine.model_path, config.engine.tokenizer_path, config.request.prompt,
                             config.request.steps, config.request.sampler.temperature,
                             config.request.sampler.top_p, config.request.sampler.seed, config.engine.threads,
                             config.engine.chunk_tokens, mpi.launcher(), mpi.world_size());
    return 0;
  }

  auto tp_comm = comm::make_solo_communicator();
  runtime::Engine engine(config.engine, mesh, *tp_comm);
  log::debug("model {} ({}), mapped {}, launched as {}", config.engine.model_path, engine.shape().describe(),
             format_bytes(engine.weights().mapped_bytes()), mpi.launcher());

  runtime::PieceCallback stream;
  if (!config.json) {
    stream = [](std::string_view piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  }
  const runtime::GenerationResult result = engine.generate(config.request, stream);
  if (config.json) {
    print_json(result);
  } else {
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }
  print_stats(engine, result, config.engine.threads);
  return 0;
}

}  // namespace shardline::launch
