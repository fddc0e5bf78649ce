#include "launch/gen_model_command.h"

#include <cstdio>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"
#include "common/units.h"
#include "launch/cli_options.h"
#include "partition/model_presets.h"
#include "runtime/checkpoint.h"
#include "runtime/model_generator.h"

namespace shardline::launch {
namespace {

namespace fs = std::filesystem;

// Where gen-model writes the file --flag names: the file a symbolic link points to, followed link by link so
// that a link to a file not made yet names that file (renaming into place would replace the link itself).
// ConfigError for an empty name, a loop of links, or a path that holds something other than a regular file:
// the file is renamed onto it, which replaced /dev/null itself with a model.
std::string output_target(const std::string& path, const char* flag) {
  if (path.empty()) throw ConfigError(fmt::format("shardline gen-model: --{} needs a file name", flag));
  std::error_code ec;
  fs::path target = path;
  for (int links = 0; fs::is_symlink(fs::symlink_status(target, ec)); ++links) {
    const fs::path next = fs::read_symlink(target, ec);
    if (ec || links == 40) {  // (40: the kernel's own limit on links in a path)
      throw ConfigError(fmt::format("shardline gen-model: --{} '{}' is a link that does not lead to a file ({})", flag,
                                    path, ec ? ec.message() : "a loop of links"));
    }
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const fs::file_status status = fs::status(target, ec);
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    const char* kind = fs::is_directory(status) ? "a folder"
                       : fs::is_character_file(status) || fs::is_block_file(status) ? "a device"
                       : fs::is_fifo(status) ? "a FIFO"
                                              : "not a regular file";
    throw ConfigError(fmt::format("shardline gen-model: --{} '{}' is {}; gen-model writes a new file and renames "
                                  "it into place, which would replace it: name a file",
                                  flag, path, kind));
  }
  return target.string();
}

}  // namespace

int gen_model_command(const std::vector<std::string>& args) {
  partition::ModelShape shape;
  std::string preset, out, tokenizer_out;
  std::string seed_text;
  bool unshared = false;
  po::options_description options("gen-model options");
  options.add_options()
      ("preset", po::value(&preset), fmt::format("start from a named shape ({}); explicit flags override it",
                                                 partition::model_preset_names()).c_str())
      ("dim", po::value<int>(), "residual width")
      ("hidden", po::value<int>(), "MLP width")
      ("layers", po::value<int>(), "transformer layers")
      ("heads", po::value<int>(), "query heads")
      ("kv-heads", po::value<int>(), "key/value heads (GQA when fewer than --heads; default = --heads)")
      ("vocab", po::value<int>(), "vocabulary size (>= 259: specials + 256 byte tokens)")
      ("seq", po::value<int>(), "maximum context length")
      ("unshared-classifier", po::bool_switch(&unshared), "write a separate classifier matrix")
      ("seed", po::value(&seed_text)->default_value("42"), "random seed (same seed and shape = same file)")
      ("out", po::value(&out)->required(), "checkpoint path to write, e.g. model.bin")
      ("tokenizer-out", po::value(&tokenizer_out), "tokenizer path (default: --out with .bin replaced by .tokenizer.bin)");
  po::variables_map vm;
  const std::string usage =
      "Usage: shardline gen-model (--preset NAME | --dim D --hidden H --layers L --heads N --vocab V --seq S) "
      "--out FILE\n\nWrites a llama2.c checkpoint with random weights and a matching synthetic tokenizer, each under\n"
      "a temporary name renamed into place at the end (an earlier writer's leftover that was killed outright\n"
      "is removed first). Under mpirun or srun it runs on each host's first task.";
  if (!parse_command_line("gen-model", usage, options, args, vm)) return 0;
  const std::uint64_t seed = parse_seed_flag(seed_text);

  if (!preset.empty()) shape = partition::find_model_preset(preset).shape;
  auto take = [&](const char* flag, int& field) {
    if (vm.count(flag)) {
      field = vm[flag].as<int>();
    } else if (preset.empty()) {
      throw ConfigError(fmt::format("shardline gen-model: --{} is required without --preset", flag));
    }
  };
  take("dim", shape.dim);
  take("hidden", shape.hidden_dim);
  take("layers", shape.n_layers);
  take("heads", shape.n_heads);
  take("vocab", shape.vocab_size);
  take("seq", shape.seq_len);
  if (vm.count("kv-heads")) {
    shape.n_kv_heads = vm["kv-heads"].as<int>();
  } else if (preset.empty() || vm.count("heads")) {
    shape.n_kv_heads = shape.n_heads;
  }
  if (unshared) shape.shared_classifier = false;
  if (auto problem = shape.find_problem()) throw ConfigError(fmt::format("shardline gen-model: {}", *problem));
  if (shape.vocab_size < 259) {
    throw ConfigError(fmt::format("shardline gen-model: --vocab {} is too small: the tokenizer needs 3 special "
                                  "and 256 byte tokens (use --vocab 259 or more)",
                                  shape.vocab_size));
  }
  if (out.ends_with(".gguf")) {  // a llama2.c file under a GGUF name would only mislead
    throw ConfigError(fmt::format("shardline gen-model: --out '{}': gen-model writes llama2.c checkpoints; name it "
                                  "*.bin",
                                  out));
  }
  // The tokenizer goes beside the name given (where run --model looks for it), a link's target or not.
  const std::string default_tokenizer = runtime::default_tokenizer_path_for(out);
  out = output_target(out, "out");
  tokenizer_out = vm.count("tokenizer-out") ? output_target(tokenizer_out, "tokenizer-out")
                                            : output_target(default_tokenizer, "out's tokenizer");
  // (both resolved already: compared as absolute paths, "a/../m.bin" as "m.bin")
  if (fs::absolute(out).lexically_normal() == fs::absolute(tokenizer_out).lexically_normal()) {
    throw ConfigError(fmt::format("shardline gen-model: --out and --tokenizer-out are both '{}': the tokenizer would "
                                  "replace the model; name two files",
                                  out));
  }

  const std::uint64_t total = runtime::checkpoint_layout(shape).total_bytes;
  runtime::prepare_model_destinations(shape, {out, tokenizer_out});  // its one error line before the info line
  log::info("writing {} ({}, {} params, {})", out, shape.describe(), shape.n_params(), format_bytes(total));
  int last_percent = -1;
  const bool show_progress = total > 256 * kMiB;
  runtime::generate_model(shape, seed, {out, tokenizer_out}, [&](std::uint64_t done, std::uint64_t all) {
    const int percent = static_cast<int>(100 * done / all);
    if (show_progress && percent / 10 != last_percent / 10) {
      log::info("  {}% of {}", percent, format_bytes(all));
      last_percent = percent;
    }
  });
  log::info("wrote {} and {}", out, tokenizer_out);
  return 0;
}

}  // namespace shardline::launch
