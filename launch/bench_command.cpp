#include "launch/bench_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "common/units.h"
#include "kernels/cpu/isa.h"
#include "launch/agreed_fields.h"
#include "launch/cli_options.h"
#include "launch/field_agreement.h"
#include "launch/placement_setup.h"
#include "partition/mesh.h"
#include "partition/model_presets.h"
#include "partition/shard.h"
#include "runtime/comm_groups.h"
#include "runtime/engine.h"
#include "runtime/model_generator.h"
#include "runtime/roofline_bench.h"

namespace shardline::launch {

namespace {

struct BenchConfig {
  std::vector<std::string> presets;
  std::vector<kernels::cpu::WeightDtype> dtypes;
  std::optional<kernels::cpu::KvDtype> kv_dtype;  // unset: each dtype's default (runtime::resolve_kv_dtype)
  runtime::RooflineBenchOptions bench;
  int threads = 1;
  int chunk_tokens = 64;
  int tp = 0, pp = 0;  // 0: not given
  std::string models_dir;
  double comm_timeout_s = kDefaultCommTimeoutS;
  bool json = false;
};

// A comma list of names; an empty item (a doubled or trailing comma) is refused, as --batches refuses one.
std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) throw ConfigError(fmt::format("{} '{}' has an empty entry", flag, text));
    items.push_back(item);
  }
  if (!text.empty() && text.back() == ',') throw ConfigError(fmt::format("{} '{}' has an empty entry", flag, text));
  return items;
}

std::optional<BenchConfig> parse_bench_config(const std::vector<std::string>& args, const MpiSession& mpi) {
  BenchConfig c;
  std::string presets, dtypes, batches, log_level, statistic, isa, kv_dtype;
  po::options_description options("bench options");
  options.add_options()
      ("presets", po::value(&presets)->default_value("15m,110m,1.1b"),
       fmt::format("model shapes to generate and measure (of {})", partition::model_preset_names()).c_str())
      ("dtypes", po::value(&dtypes)->default_value("fp32,bf16,int8"), "weight dtypes to measure, in order")
      ("kv-dtype", po::value(&kv_dtype)->default_value("auto"), kKvDtypeFlagHelp)
      ("batches", po::value(&batches)->default_value("1,4,16"), "decode batch sizes (sequences in one micro-batch)")
      ("steps", po::value(&c.bench.decode_steps)->default_value(32), "decode steps per sequence")
      ("prompt-tokens", po::value(&c.bench.decode_prompt_tokens)->default_value(8), "prompt tokens per decoded sequence")
      ("prefill-tokens", po::value(&c.bench.prefill_tokens)->default_value(128), "prompt tokens of the prefill run")
      ("chunk-tokens", po::value(&c.chunk_tokens)->default_value(64), "prefill chunk size in tokens")
      ("repeats", po::value(&c.bench.repeats)->default_value(3), "runs per number (the batch sizes' decode runs take turns)")
      ("statistic", po::value(&statistic)->default_value("median"),
       "median|best: the median run, or the fastest run and highest roofline (for a shared, noisy machine)")
      ("threads", po::value<int>(), "kernel threads of this rank, 1 to 1024 (default: its cores / ranks on the host)")
      ("isa", po::value(&isa)->default_value("auto"), kIsaFlagHelp)
      ("tp", po::value(&c.tp), "tensor-parallel ranks per stage (default: every rank)")
      ("pp", po::value(&c.pp), "pipeline stages (tp x pp must equal the number of ranks)")
      ("models-dir", po::value(&c.models_dir), "where the generated models are kept (default: <cache>/bench)")
      ("comm-timeout", po::value(&c.comm_timeout_s)->default_value(kDefaultCommTimeoutS, "120"), "seconds a rank waits for a peer before failing the job, at least 1 (inf: no limit)")
      ("json", po::bool_switch(&c.json), "one JSON object per model and dtype instead of the table")
      ("log-level", po::value(&log_level)->default_value("info"), "debug|info|warn|error|off");
  po::variables_map vm;
  const std::string usage =
      "Usage: shardline bench [--presets 15m,110m,1.1b] [--dtypes fp32,bf16,int8] [--batches 1,4,16] [options]\n"
      "       mpirun -np P shardline bench --tp T --pp S ...\n\n"
      "Measures the read bandwidth of this rank's own weights, then decode tokens/s at each batch size and\n"
      "prefill tokens/s, each as a fraction of that bandwidth roofline, on generated random-weight models.";
  if (!parse_command_line("bench", usage, options, args, vm, mpi.world_rank() == 0)) return std::nullopt;
  log::set_level(log::parse_level(log_level));
  c.presets = split_list("--presets", presets);
  for (const auto& name : c.presets) partition::find_model_preset(name);  // ConfigError listing the known names
  for (const auto& name : split_list("--dtypes", dtypes)) c.dtypes.push_back(parse_weights_dtype_flag(name, "--dtypes entry"));
  c.kv_dtype = parse_kv_dtype_flag(kv_dtype);
  c.bench.batches = parse_int_list("--batches", batches);
  if (c.presets.empty() || c.dtypes.empty()) throw ConfigError("--presets and --dtypes need at least one entry each");
  // Bounds far past any use, so that sums of them stay ints and nothing is allocated for them first (a
  // fuzzing pass: --steps 2^31-1 wrapped the context check and failed an internal check; --batches 2^31-1
  // ran out of memory after the model was generated; 10,000 batch sizes ran on for minutes).
  constexpr int kMaxBatch = 4096, kMaxBatches = 64, kMaxTokens = 1 << 20;
  if (c.bench.batches.size() > kMaxBatches) {
    throw ConfigError(fmt::format("--batches lists {} sizes; at most {}", c.bench.batches.size(), kMaxBatches));
  }
  for (int b : c.bench.batches) {
    if (b < 1 || b > kMaxBatch) throw ConfigError(fmt::format("--batches entries must be from 1 to {}, got {}", kMaxBatch, b));
  }
  for (const auto& [flag, value] : {std::pair{"--steps", c.bench.decode_steps},
                                    std::pair{"--prompt-tokens", c.bench.decode_prompt_tokens},
                                    std::pair{"--prefill-tokens", c.bench.prefill_tokens},
                                    std::pair{"--chunk-tokens", c.chunk_tokens}}) {
    if (value > kMaxTokens) throw ConfigError(fmt::format("{} {} is more than any context; at most {}", flag, value, kMaxTokens));
  }
  if (c.bench.decode_steps < 2) throw ConfigError("--steps must be >= 2 (the first token ends the prefill)");
  if (c.bench.decode_prompt_tokens < 1 || c.bench.prefill_tokens < 1) {
    throw ConfigError("--prompt-tokens and --prefill-tokens must be >= 1");
  }
  if (c.bench.repeats < 1) throw ConfigError("--repeats must be >= 1");
  if (statistic == "median") {
    c.bench.statistic = runtime::RooflineBenchOptions::Statistic::kMedian;
  } else if (statistic == "best") {
    c.bench.statistic = runtime::RooflineBenchOptions::Statistic::kBest;
  } else {
    throw ConfigError(fmt::format("--statistic must be median or best, got '{}'", statistic));
  }
  if (c.chunk_tokens < 1) throw ConfigError("--chunk-tokens must be >= 1");
  apply_isa_flag(isa);
  c.threads = vm.count("threads") ? vm["threads"].as<int>() : default_threads();
  check_threads_flag(c.threads);
  if (vm.count("tp")) check_rank_flag("--tp", c.tp);
  if (vm.count("pp")) check_rank_flag("--pp", c.pp);
  check_comm_timeout_flag(c.comm_timeout_s);
  if (vm.count("models-dir") && c.models_dir.empty()) throw ConfigError("--models-dir needs a folder name");
  if (c.models_dir.empty()) c.models_dir = (std::filesystem::path(runtime::cache_dir()) / "bench").string();
  return c;
}

partition::Mesh bench_mesh(const BenchConfig& c, const MpiSession& mpi) {
  const int world = mpi.world_size();
  int tp = c.tp, pp = c.pp;
  if (tp == 0 && pp == 0) tp = world, pp = 1;
  if (tp == 0) tp = world % pp == 0 ? world / pp : 0;
  if (pp == 0) pp = world % tp == 0 ? world / tp : 0;
  if (tp < 1 || pp < 1 || tp * pp != world) {
    throw ConfigError(rank_count_mismatch(c.tp, c.pp, world));
  }
  return partition::Mesh(world, mpi.world_rank(), tp, pp);
}

// Why this layout cannot run the preset (the bench skips it), or nothing.
std::optional<std::string> layout_problem(const partition::ModelShape& shape, const partition::Mesh& mesh,
                                          const runtime::RooflineBenchOptions& bench) {
  if (auto problem = partition::find_layout_problem(shape, mesh.tp_size(), mesh.pp_size())) return problem;
  if (bench.decode_prompt_tokens + bench.decode_steps - 1 > shape.seq_len || bench.prefill_tokens > shape.seq_len) {
    return fmt::format("prompts and steps exceed its context of {} tokens", shape.seq_len);
  }
  return std::nullopt;
}

std::string fraction_cell(const runtime::ThroughputMeasurement& m) {
  return fmt::format("{:.1f} ({:.2f})", m.tok_s, m.fraction());
}

void print_header(const BenchConfig& c, const partition::Mesh& mesh, bool pinned) {
  std::cout << fmt::format(
      "# shardline bench: tp={} pp={}, {} thread{}/rank ({}), {}; decode: {}-token prompts + {} steps; prefill: "
      "{} tokens in chunks of {}; {} of {} run{}\n"
      "# roofline: the rank's weights (+ KV cache) streamed at the read bandwidth a probe measured on those very "
      "buffers, with the same threads, right before each run. (x.xx) = fraction of that roofline.\n",
      mesh.tp_size(), mesh.pp_size(), c.threads, c.threads == 1 ? "" : "s", pinned ? "pinned" : "not pinned",
      kernels::cpu::describe_active_isa(), c.bench.decode_prompt_tokens, c.bench.decode_steps,
      c.bench.prefill_tokens, c.chunk_tokens,
      c.bench.statistic == runtime::RooflineBenchOptions::Statistic::kBest ? "best" : "median", c.bench.repeats,
      c.bench.repeats == 1 ? "" : "s");
  std::string line = fmt::format("{:<6} {:<5} {:<4} {:>10} {:>9} ", "model", "dtype", "kv", "weights", "read GB/s");
  for (int b : c.bench.batches) line += fmt::format(" {:>16}", fmt::format("decode b={} tok/s", b));
  line += fmt::format(" {:>18} {:>14} {:>7}\n", "prefill tok/s", "prefill GFLOP/s", "load s");
  std::cout << line;
}

void print_row(const std::string& preset, kernels::cpu::WeightDtype dtype, kernels::cpu::KvDtype kv_dtype,
               const runtime::RooflineBenchResult& r, double load_s) {
  std::string line = fmt::format("{:<6} {:<5} {:<4} {:>10} {:>9.1f} ", preset, kernels::cpu::weight_dtype_name(dtype),
                                 kernels::cpu::kv_dtype_name(kv_dtype), format_bytes(static_cast<double>(r.weight_bytes)),
                                 r.read_gbps);
  for (const auto& m : r.decode) line += fmt::format(" {:>16}", fraction_cell(m));
  line += fmt::format(" {:>18} {:>14.1f} {:>7.2f}\n", fraction_cell(r.prefill), r.prefill.gflops, load_s);
  std::cout << line << std::flush;
}

// Ratios within one model, all from this run: each dtype's decode against fp32 at the same batch, and the
// largest batch against batch 1.
void print_ratios(const std::string& preset, const std::vector<kernels::cpu::WeightDtype>& dtypes,
                  const std::vector<runtime::RooflineBenchResult>& results) {
  const runtime::RooflineBenchResult* fp32 = nullptr;
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    if (dtypes[i] == kernels::cpu::WeightDtype::kF32) fp32 = &results[i];
  }
  std::string line = fmt::format("# {} ratios:", preset);
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    const auto& d = results[i].decode;
    if (d.size() > 1) {
      line += fmt::format(" {} b={}/b={} {:.2f}x;", kernels::cpu::weight_dtype_name(dtypes[i]), d.back().rows,
                          d.front().rows, d.back().tok_s / d.front().tok_s);
    }
    if (fp32 != nullptr && &results[i] != fp32) {
      line += fmt::format(" {}/fp32 at b={} {:.2f}x;", kernels::cpu::weight_dtype_name(dtypes[i]), d.front().rows,
                          d.front().tok_s / fp32->decode.front().tok_s);
    }
  }
  if (line.back() != ';') return;  // nothing to compare
  line.back() = '\n';
  std::cout << line << std::flush;
}

nlohmann::json to_json(const std::string& preset, kernels::cpu::WeightDtype dtype, kernels::cpu::KvDtype kv_dtype,
                       const runtime::RooflineBenchResult& r, const BenchConfig& c, const partition::Mesh& mesh,
                       double load_s) {
  auto measurement = [](const runtime::ThroughputMeasurement& m) {
    return nlohmann::json{{"rows", m.rows}, {"tok_s", m.tok_s}, {"roofline_tok_s", m.roofline_tok_s},
                          {"fraction", m.fraction()}, {"gflops", m.gflops}};
  };
  nlohmann::json j{{"model", preset},
                   {"dtype", kernels::cpu::weight_dtype_name(dtype)},
                   {"kv_dtype", kernels::cpu::kv_dtype_name(kv_dtype)},
                   {"tp", mesh.tp_size()},
                   {"pp", mesh.pp_size()},
                   {"threads", c.threads},
                   {"isa", kernels::cpu::isa_name(kernels::cpu::active_isa())},
                   {"weight_bytes", r.weight_bytes},
                   {"read_gbps", r.read_gbps},
                   {"load_s", load_s},
                   {"repeats", c.bench.repeats},
                   {"statistic", c.bench.statistic == runtime::RooflineBenchOptions::Statistic::kBest ? "best" : "median"},
                   {"prefill", measurement(r.prefill)}};
  for (const auto& m : r.decode) j["decode"].push_back(measurement(m));
  return j;
}

}  // namespace

// What every rank of a bench must share, in the order a differing rank is told of it: the measurement's
// flags (ranks measuring other batches or steps would exchange rows of other sizes). --threads, --isa and the
// output's form may differ by rank.
AgreedFields bench_fields(const BenchConfig& c) {
  std::vector<std::string> dtypes;
  for (const auto dtype : c.dtypes) dtypes.emplace_back(kernels::cpu::weight_dtype_name(dtype));
  const runtime::RooflineBenchOptions& b = c.bench;
  return {{"--presets", fmt::format("{}", fmt::join(c.presets, ","))},
          {"--dtypes", fmt::format("{}", fmt::join(dtypes, ","))},
          {"--kv-dtype", c.kv_dtype ? kernels::cpu::kv_dtype_name(*c.kv_dtype) : "auto"},
          {"--batches", fmt::format("{}", fmt::join(b.batches, ","))},
          {"--steps", std::to_string(b.decode_steps)},
          {"--prompt-tokens", std::to_string(b.decode_prompt_tokens)},
          {"--prefill-tokens", std::to_string(b.prefill_tokens)},
          {"--chunk-tokens", std::to_string(c.chunk_tokens)},
          {"--repeats", std::to_string(b.repeats)},
          {"--statistic", b.statistic == runtime::RooflineBenchOptions::Statistic::kBest ? "best" : "median"},
          {"--tp", count_or_not_given(c.tp)},
          {"--pp", count_or_not_given(c.pp)}};
}

int bench_command(const std::vector<std::string>& args, const MpiSession& mpi) {
  // Start-up checks run on every rank; the ranks agree on the outcome and one of them says why.
  std::optional<BenchConfig> config;
  std::optional<partition::Mesh> mesh;
  bool help = false;
  double timeout_s = kDefaultCommTimeoutS;  // until the flags are read
  const int code = agreed_phase(mpi, timeout_s, [&] {
    config = parse_bench_config(args, mpi);
    if (config) {
      timeout_s = config->comm_timeout_s;
      mesh = bench_mesh(*config, mpi);
      // A bench that would skip every preset measures nothing: that is bad flags, not a result.
      std::string reasons;
      for (const std::string& preset : config->presets) {
        const auto problem = layout_problem(partition::find_model_preset(preset).shape, *mesh, config->bench);
        if (!problem) {
          reasons.clear();
          break;
        }
        reasons += fmt::format("{}{}: {}", reasons.empty() ? "" : "; ", preset, *problem);
      }
      if (!reasons.empty()) throw ConfigError(fmt::format("no preset can run with these flags ({})", reasons));
    } else {
      help = true;
    }
  });
  if (code != 0) return code;
  const int agreed = agreed_phase(mpi, timeout_s, [&] {
    require_same_fields(mpi, timeout_s, help, [&] { return bench_fields(*config); },
                        "give every rank the same bench flags");
  });
  if (agreed != 0) return agreed;
  if (help) return 0;
  const BenchConfig& c = *config;
  const int output_rank = mesh->rank_of(mesh->pp_size() - 1, 0);
  const bool output = mesh->rank() == output_rank;
  log::set_place(mesh->tag(), output);
  runtime::CommGroups groups = runtime::make_comm_groups(*mesh, {mpi.active(), c.comm_timeout_s});
  // The rank stays where the launcher put it (no --bind here); its threads are pinned one per core when
  // it has exactly one core per thread, as `run` pins them.
  PlacedRank placed = place_this_rank(mpi, memory::BindMode::kNone);
  runtime::start_kernel_threads(placed.binding, c.threads);

  bool header_printed = false;
  for (const std::string& preset : c.presets) {
    const partition::ModelShape shape = partition::find_model_preset(preset).shape;
    if (auto problem = layout_problem(shape, *mesh, c.bench)) {
      if (output) std::cout << fmt::format("# {}: skipped: {}\n", preset, *problem) << std::flush;
      continue;
    }
    // One rank writes the model (once: later runs reuse it); the others wait for it, without a bound (a large
    // preset takes minutes to write, and the writing rank says so). A failure to write it (a folder that
    // cannot be made, a full disk) is that rank's one error line and the same exit code on every rank: it
    // had ended the job through MPI_Abort, whose banner buried the line.
    runtime::GeneratedModelPaths paths;
    const double unbounded = std::numeric_limits<double>::infinity();
    const int generated = agreed_phase(mpi, unbounded, [&] {
      if (mesh->rank() == 0) {
        runtime::ensure_generated_model(shape, 42, c.models_dir, "bench-" + preset,
                                        fmt::format("the {} benchmark model", preset));
      }
    });
    if (generated != 0) return generated;
    paths.model = (std::filesystem::path(c.models_dir) / ("bench-" + preset + ".bin")).string();
    paths.tokenizer = runtime::default_tokenizer_path_for(paths.model);

    std::vector<runtime::RooflineBenchResult> results;
    for (kernels::cpu::WeightDtype dtype : c.dtypes) {
      runtime::EngineOptions options;
      options.model_path = paths.model;
      options.tokenizer_path = paths.tokenizer;
      options.threads = c.threads;
      options.chunk_tokens = c.chunk_tokens;
      options.micro_batches = 1;  // a batch decodes as one micro-batch: one pass over the weights per step
      options.weights_dtype = dtype;
      options.kv_dtype = c.kv_dtype;
      runtime::Engine engine(options, *mesh, *groups.world, *groups.tp);
      if (output && !c.json && !header_printed) {
        print_header(c, *mesh, placed.binding.pinned_threads > 0);
        header_printed = true;
      }
      results.push_back(runtime::run_roofline_bench(engine, *groups.world, c.bench));
      if (!output) continue;
      if (c.json) {
        std::cout << to_json(preset, dtype, engine.kv_dtype(), results.back(), c, *mesh, engine.load_s()).dump()
                  << std::endl;
      } else {
        print_row(preset, dtype, engine.kv_dtype(), results.back(), engine.load_s());
      }
    }
    if (output && !c.json) print_ratios(preset, c.dtypes, results);
  }
  return 0;
}

}  // namespace shardline::launch
