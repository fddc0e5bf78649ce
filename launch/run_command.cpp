#include "launch/run_command.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_digest.h"
#include "common/input_file.h"
#include "common/log.h"
#include "common/output_file.h"
#include "common/units.h"
#include "kernels/cpu/isa.h"
#include "launch/agreed_fields.h"
#include "launch/field_agreement.h"
#include "launch/cli_options.h"
#include "launch/launch_env.h"
#include "launch/placement_setup.h"
#include "memory/arena.h"
#include "memory/bus_error_report.h"
#include "memory/placement.h"
#include "memory/system_memory.h"
#include "partition/mesh.h"
#include "partition/shard.h"
#include "comm/mpi_communicator.h"
#include "runtime/auto_plan.h"
#include "runtime/backend_choice.h"
#include "runtime/checkpoint.h"
#include "runtime/comm_groups.h"
#include "runtime/engine.h"
#include "runtime/gguf.h"
#include "runtime/machine_probe.h"
#include "runtime/model_generator.h"
#include "runtime/tokenizer.h"

namespace shardline::launch {

namespace {

// Positions per KV block at most: larger blocks only waste the cache (a block longer than any context
// holds one sequence's tail), and sizes near INT_MAX overflowed the block arithmetic.
constexpr int kMaxKvBlockTokens = 65536;

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
constexpr int kDefaultSteps = 128;

// A model without --tokenizer: a GGUF file its own vocabulary, else "<stem>.tokenizer.bin" (what gen-model writes),
// else tokenizer.bin beside it.
std::string find_tokenizer_for(const std::string& model_path) {
  namespace fs = std::filesystem;
  if (runtime::is_gguf_file(model_path)) return model_path;  // it carries its own vocabulary
  const std::string generated = runtime::default_tokenizer_path_for(model_path);
  if (fs::exists(generated)) return generated;
  const fs::path beside = fs::path(model_path).parent_path() / "tokenizer.bin";
  if (fs::exists(beside)) return beside.string();
  throw ResourceError(fmt::format("no tokenizer found for '{}' (looked for '{}' and '{}'); pass --tokenizer FILE",
                                model_path, generated, beside.string()));
}

// A prompts file's text at most: far more than any context holds (every rank holds a copy while it reads),
// far less than /dev/zero gives.
constexpr std::size_t kMaxPromptsFileBytes = std::size_t{256} << 20;

// several_tasks: the job has more than one task, each of which reads the file.
std::vector<std::string> read_prompts_file(const std::string& path, double timeout_s, bool several_tasks) {
  const std::string text = read_text_input(path, "--prompts-file", timeout_s, kMaxPromptsFileBytes, "--comm-timeout");
  std::vector<std::string> prompts;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    std::string_view line(text.data() + at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // A UTF-8 byte-order mark (Windows editors write one) is no part of the first prompt: kept, it gave that
    // prompt other token ids than the same text typed on the command line.
    if (at == 0 && line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);
    // Blank lines (empty, or only blanks) are skipped; a prompt keeps its own leading and trailing blanks.
    if (line.find_first_not_of(" \t\v\f") != std::string_view::npos) prompts.emplace_back(line);
    at = end + 1;
  }
  if (prompts.empty()) {
    // Under mpirun only the first task has the launcher's stdin, the others an empty one.
    std::error_code ec;
    const bool pipe = several_tasks && !std::filesystem::is_regular_file(path, ec);
    throw ConfigError(fmt::format("--prompts-file '{}' holds no prompt (one per line){}", path,
                                  pipe ? "; every rank reads it, and under mpirun or srun only the first task gets the "
                                         "launcher's stdin: write the prompts to a file"
                                       : ""));
  }
  return prompts;
}

// What run's flags hold as given, before they are checked and turned into a RunConfig.
struct RunFlags {
  RunConfig c;
  std::string log_level = "info", prompt, prompts_file, layer_split, weights_dtype, kv_dtype, isa;
  std::string bind = "auto", arena_pages = "auto", weights = "map", device = "auto", cuda_graphs = "on";
  int steps = kDefaultSteps, batch = 1;
  runtime::SamplerOptions sampler;
  std::string seed_text;
};

// run's flags, bound to f's members.
po::options_description run_options(RunFlags& f) {
  RunConfig& c = f.c;
  po::options_description options("run options");
  options.add_options()
      ("model,m", po::value(&c.engine.model_path), "llama2.c checkpoint (legacy, or export.py --version 1 or 2) or GGUF file (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K-Q6_K, IQ4_NL, IQ4_XS) of a llama model (default: a built-in random-weight model)")
      ("tokenizer,z", po::value(&c.engine.tokenizer_path), "tokenizer.bin (default: a GGUF model's own vocabulary, else found beside the model)")
      ("prompt,i", po::value(&f.prompt)->default_value("Once upon a time"), "prompt text")
      ("prompts-file", po::value(&f.prompts_file), "several sequences at once: one prompt per line (blank lines are skipped; not with --prompt)")
      ("batch", po::value(&f.batch)->default_value(1), "run each prompt this many times (sequence i samples with seed+i); "
       "refused up front when the sequences' prompts, ids and text would not fit in the host's available memory")
      ("steps,n", po::value(&f.steps)->default_value(kDefaultSteps, fmt::format("{}, or what the context holds", kDefaultSteps)),
       "tokens to generate after the prompt")
      ("temperature,t", po::value(&f.sampler.temperature)->default_value(0.0f, "0"), "sampling temperature; 0 = greedy")
      ("top-p,p", po::value(&f.sampler.top_p)->default_value(0.9f, "0.9"),
       "nucleus sampling threshold in (0,1); other values disable it")
      ("seed,s", po::value(&f.seed_text)->default_value("42"), "random seed for sampling")
      ("tp", po::value(&c.tp), "tensor-parallel ranks per stage (must divide n_kv_heads)")
      ("pp", po::value(&c.pp), "pipeline stages (tp x pp must equal the number of ranks)")
      ("layers-per-stage", po::value(&f.layer_split), "explicit layer split, e.g. 3,2,2 (default: the planner's with --plan auto and several ranks, else even)")
      ("plan", po::value(&c.plan)->default_value("auto"),
       "auto: the planner picks what --tp/--pp/--layers-per-stage/--micro-batches/--chunk-tokens leave open, from a "
       "quick probe of this job; none: tp = all ranks (else pp), even split, fixed chunks")
      ("micro-batches", po::value(&c.engine.micro_batches)->default_value(0, "planned"),
       "sequences are spread over this many micro-batches in flight (0: planned)")
      ("chunk-tokens", po::value(&c.engine.chunk_tokens)->default_value(0, "planned per prompt"),
       "prefill chunk size in tokens (split granularity; 0: planned per prompt)")
      ("threads", po::value<int>(), "kernel threads of this rank, 1 to 1024 (default: one per core of its placement)")
      ("device", po::value(&f.device)->default_value("auto"),
       "cpu|cuda|auto: where each rank's stage runs (auto: its GPU when it has one and the CUDA stage can take the "
       "run, else the CPU, saying why)")
      ("cuda-graphs", po::value(&f.cuda_graphs)->default_value("on"),
       "on|off: with --device cuda, replay each decode step from a captured CUDA graph (off: launch every kernel)")
      ("bind", po::value(&f.bind)->default_value("auto"),
       "where each rank runs: auto|numa|core|none (see `shardline topo`); a launcher's binding is kept")
      ("arena-pages", po::value(&f.arena_pages)->default_value("auto"),
       "pages of the rank's arena: auto (hugetlb, else THP, else 4 KiB)|hugetlb|thp|4k")
      ("weights", po::value(&f.weights)->default_value("map"),
       "norms and embedding: map (mapped from the file) or arena (read into the rank's arena); the weight "
       "matrices always go to the arena")
      ("kv-block-tokens", po::value(&c.engine.kv_block_tokens)->default_value(16), "positions per KV cache block")
      ("kv-blocks", po::value(&c.engine.kv_blocks)->default_value(0),
       "KV cache blocks per rank (0: 64 full contexts, at most the machine's memory, as address space committed as used); sequences beyond it wait and start as others finish")
      ("weights-dtype", po::value(&f.weights_dtype)->default_value("fp32"),
       "convert the weight matrices at load to fp32|bf16|int8 (int8: a fp16 scale per 128 weights; per 96, 64 or 32 where k or a TP slice needs it)")
      ("kv-dtype", po::value(&f.kv_dtype)->default_value("auto"), kKvDtypeFlagHelp)
      ("isa", po::value(&f.isa)->default_value("auto"), kIsaFlagHelp)
      ("comm-timeout", po::value(&c.comm_timeout_s)->default_value(kDefaultCommTimeoutS, "120"),
       "seconds a rank waits for a peer before failing the job, at least 1 (inf: no limit); also how long reading "
       "its weights may go without progress (at least 300)")
      ("json", po::bool_switch(&c.json), "print one JSON object per sequence instead of text")
      ("dump-logits", po::value(&c.dump_logits), "write every step's float32 logits (sequences in order) to FILE")
      ("verbose,v", po::bool_switch(&c.verbose), "per-rank placement, memory and stage statistics")
      ("print-config", po::bool_switch(&c.print_config), "print the resolved configuration and exit")
      ("log-level", po::value(&f.log_level)->default_value("info"), "debug|info|warn|error|off");
  return options;
}

}  // namespace

po::options_description run_flag_descriptions() {
  static RunFlags unused;  // the descriptions point into it: it outlives them
  return run_options(unused);
}

namespace {

// Host memory a sequence holds for the whole run: its request, result and pipeline state with their copies of
// the prompt, its ids and its text. Measured: about 0.85 KiB a sequence of a 16-byte prompt at --steps 3
// (run --batch 50000 and 200000); counted here with room to spare.
double sequence_host_bytes(double prompt_bytes, int steps) { return 1024.0 + 4.0 * prompt_bytes + 32.0 * steps; }

// ResourceError when `sequences` sequences needing `bytes` of host memory for their prompts, ids and text
// cannot fit in this host's available memory; `what` names them.
void check_sequences_fit_in_memory(double sequences, double bytes, const std::string& what) {
  const double available = static_cast<double>(memory::read_meminfo().available_bytes);
  if (available > 0 && bytes > available) {
    throw ResourceError(fmt::format("{} need about {} of host memory for their prompts, ids and text ({} each), and "
                                    "this host has {} available: run fewer sequences per job",
                                    what, format_bytes(bytes), format_bytes(bytes / sequences), format_bytes(available)));
  }
}

// Before the requests are built (--batch 2147483647 once grew to all of memory over a minute, then failed;
// 50000000 ran silent for minutes): the prompts alone. Their steps count once the model's context has
// bounded them (check_requests_fit_in_memory), so a --steps no model can take is that error, exit 2.
void check_prompts_fit_in_memory(const std::vector<std::string>& prompts, int batch) {
  const double sequences = static_cast<double>(prompts.size()) * batch;
  double bytes = 0;
  for (const std::string& prompt : prompts) bytes += sequence_host_bytes(static_cast<double>(prompt.size()), 1) * batch;
  check_sequences_fit_in_memory(sequences, bytes, fmt::format("{:.0f} sequences (--batch {} x {} prompt{})", sequences,
                                                              batch, prompts.size(), prompts.size() == 1 ? "" : "s"));
}

void check_requests_fit_in_memory(const std::vector<runtime::GenerationRequest>& requests) {
  double bytes = 0;
  for (const auto& request : requests) bytes += sequence_host_bytes(static_cast<double>(request.prompt.size()), request.steps);
  check_sequences_fit_in_memory(static_cast<double>(requests.size()), bytes,
                                fmt::format("{} sequences at their --steps", requests.size()));
}

// Returns nullopt when --help was printed.
std::optional<RunConfig> parse_run_config(const std::vector<std::string>& args, const MpiSession& mpi) {
  RunFlags f;
  const po::options_description options = run_options(f);
  RunConfig& c = f.c;
  po::variables_map vm;
  const std::string usage =
      "Usage: shardline run [--model M.bin --tokenizer T.bin] [--prompt TEXT | --prompts-file F] [--steps N] [options]\n"
      "       mpirun -np P shardline run --tp T --pp S ...     (P = T x S ranks, one shard each)\n\n"
      "Generates text. The output rank (last stage, tp 0) prints the prompt and the generation to stdout,\n"
      "statistics to stderr.";
  if (!parse_command_line("run", usage, options, args, vm, mpi.world_rank() == 0)) return std::nullopt;
  // An empty name is a slip (an unset shell variable), not "not given": --model '' ran the built-in model.
  for (const char* flag : {"model", "tokenizer", "prompts-file", "dump-logits"}) {
    if (vm.count(flag) && vm[flag].as<std::string>().empty()) throw ConfigError(fmt::format("--{} needs a file name", flag));
  }
  f.sampler.seed = parse_seed_flag(f.seed_text);
  log::set_level(log::parse_level(f.log_level));
  if (c.verbose && f.log_level == "info") log::set_level(log::Level::kDebug);
  c.bind = memory::parse_bind_mode(f.bind);
  c.device = runtime::parse_device_request(f.device);
  if (f.cuda_graphs != "on" && f.cuda_graphs != "off") {
    throw ConfigError(fmt::format("--cuda-graphs expects on or off; got '{}'", f.cuda_graphs));
  }
  c.engine.cuda_graphs = f.cuda_graphs == "on";
  c.engine.arena_pages = memory::parse_page_policy(f.arena_pages);
  if (f.weights != "map" && f.weights != "arena") throw ConfigError(fmt::format("--weights expects map or arena; got '{}'", f.weights));
  c.engine.weights_in_arena = f.weights == "arena";
  if (c.engine.kv_block_tokens < 1 || c.engine.kv_block_tokens > kMaxKvBlockTokens) {
    throw ConfigError(fmt::format("--kv-block-tokens must be from 1 to {}", kMaxKvBlockTokens));
  }
  if (c.engine.kv_blocks < 0) throw ConfigError("--kv-blocks must be >= 0 (0 = automatic)");
  if (vm.count("threads")) {  // else one per core of the rank's placement, once it is placed (phase 2)
    c.threads_given = true;
    c.engine.threads = vm["threads"].as<int>();
    check_threads_flag(c.engine.threads);
  }
  c.engine.weights_dtype = parse_weights_dtype_flag(f.weights_dtype);
  c.engine.kv_dtype = parse_kv_dtype_flag(f.kv_dtype);
  // --device cuda fixes the backend now: an fp16 cache it cannot keep is refused before anything starts.
  if (c.device == runtime::DeviceRequest::kCuda) {
    runtime::resolve_kv_dtype(c.engine.kv_dtype, c.engine.weights_dtype, /*cuda=*/true);
  }
  apply_isa_flag(f.isa);
  if (!f.layer_split.empty()) c.engine.layers_per_stage = parse_int_list("--layers-per-stage", f.layer_split);
  if (f.batch < 1) throw ConfigError("--batch must be >= 1");
  // Checked again per request against the model's context; here so that nothing (writing the built-in
  // model, say) happens before a value no model could take is refused.
  if (f.steps < 1) throw ConfigError(fmt::format("--steps must be >= 1, got {}", f.steps));
  if (vm.count("tp")) check_rank_flag("--tp", c.tp);
  if (vm.count("pp")) check_rank_flag("--pp", c.pp);
  check_comm_timeout_flag(c.comm_timeout_s);
  if (c.engine.micro_batches < 0) throw ConfigError("--micro-batches must be >= 1 (or 0: planned)");
  if (c.engine.chunk_tokens < 0) throw ConfigError("--chunk-tokens must be >= 1 (or 0: planned per prompt)");
  // A NaN would reach the sampler as probabilities that sum to nothing.
  if (!std::isfinite(f.sampler.temperature) || f.sampler.temperature < 0.0f) {
    throw ConfigError(fmt::format("--temperature must be a finite number >= 0 (0 = greedy); got {}", f.sampler.temperature));
  }
  if (std::isnan(f.sampler.top_p)) throw ConfigError("--top-p must be a number (values outside (0,1) disable it); got nan");
  if (c.plan != "auto" && c.plan != "none") throw ConfigError(fmt::format("--plan '{}' is not auto or none", c.plan));
  if (!f.prompts_file.empty() && !vm["prompt"].defaulted()) {
    throw ConfigError("--prompt and --prompts-file both give the prompts: use one (put the --prompt text in the file)");
  }
  const std::vector<std::string> prompts =
      f.prompts_file.empty() ? std::vector<std::string>{f.prompt}
                             : read_prompts_file(f.prompts_file, c.comm_timeout_s, mpi.world_size() > 1);
  c.prompts_file = f.prompts_file;
  c.steps_given = !vm["steps"].defaulted();
  check_prompts_fit_in_memory(prompts, f.batch);
  for (const auto& text : prompts) {
    for (int b = 0; b < f.batch; ++b) {
      runtime::SamplerOptions s = f.sampler;
      s.seed = f.sampler.seed + c.requests.size();
      c.requests.push_back({text, f.steps, s});
    }
  }
  // More micro-batches than sequences would be empty ones (the pipeline takes the smaller count anyway):
  // kept to the sequences, so the planner prices and reports what runs, and no buffer is sized for them.
  if (static_cast<std::size_t>(c.engine.micro_batches) > c.requests.size() && mpi.world_rank() == 0) {
    log::info("--micro-batches {} is more than the {} sequence{}: run as {}", c.engine.micro_batches, c.requests.size(),
              c.requests.size() == 1 ? "" : "s", c.requests.size());
  }
  c.engine.micro_batches = static_cast<int>(std::min<std::size_t>(c.engine.micro_batches, c.requests.size()));
  if (c.engine.model_path.empty()) {
    if (!c.engine.tokenizer_path.empty()) {
      throw ConfigError("--tokenizer without --model: the built-in model has its own tokenizer; pass --model too");
    }
    c.default_model = true;
  }
  return std::move(c);  // a tokenizer left open is looked for once the model's header has been read
}

// The least time loading may go without progress before a rank gives up (--comm-timeout when longer).
constexpr double kMinLoadStallS = 300.0;

// Why this run cannot go to a GPU, or "": the CUDA stage converts weights to fp32 or bf16 only. --device auto
// then keeps the CPU (and says why); --device cuda is refused (exit 2).
std::string cpu_only_reason(const RunConfig& c) {
  if (c.engine.weights_dtype == kernels::cpu::WeightDtype::kInt8) return "--weights-dtype int8 runs on the CPU only";
  return "";
}

// A file of quantised weights converted to fp32 or bf16 takes several times its bytes in memory, and streams
// them every token: one line names the compact choice, int8 on the CPU, bf16 on a GPU (whose stage takes no
// int8). (The first layer's w1 stands for the file: a llama-quantize preset mixes types, all of them blocks
// of a few bits a weight.)
std::string quantised_file_note(const RunConfig& c, bool on_gpu) {
  if (c.engine.weights_dtype == kernels::cpu::WeightDtype::kInt8) return "";
  const double bits = runtime::bits_per_weight(c.file_w1);
  if (bits >= 16.0) return "";  // F32, F16, BF16
  const double held = c.engine.weights_dtype == kernels::cpu::WeightDtype::kF32 ? 32.0 : 16.0;
  if (on_gpu && held == 16.0) return "";  // bf16 already: the GPU's compact choice
  return fmt::format("'{}' holds {} weights ({:.1f} bits each); --weights-dtype {} holds them in {:.0f} bits, {:.1f}x "
                     "their bytes in the file: --weights-dtype {} is the compact choice",
                     c.engine.model_path, runtime::element_name(c.file_w1.element), bits,
                     kernels::cpu::weight_dtype_name(c.engine.weights_dtype), held, held / bits,
                     on_gpu ? "bf16 (16 bits) on the GPU" : "int8 (8.5 bits)");
}

// What every rank must agree on, hashed: the model's shape and file size (not its path: hosts may keep
// copies in different places), the requests, and the flags that shape the layout or the arithmetic.
// Threads, binding and page tiers may differ per rank.
// What every rank of a run must share, in the order a differing rank is told of it (launch/agreed_fields.h;
// --help before them, launch/field_agreement.h). Flags that end a rank early (--print-config) count, since
// the others would wait for it in their first collective.
AgreedFields run_fields(const RunConfig& c, const partition::ModelShape& shape) {
  AgreedFields fields;
  const auto add = [&](std::string name, std::string value) { fields.push_back({std::move(name), std::move(value)}); };
  add("model shape", shape.describe());
  std::error_code size_error;
  const std::uintmax_t size = std::filesystem::file_size(c.engine.model_path, size_error);
  if (size_error) throw ResourceError(fmt::format("cannot read '{}': {}", c.engine.model_path, size_error.message()));
  add("model file size", fmt::format("{} bytes", size));
  // Last of the model's: a copy of the same shape and size at the same path on another host, with other weights.
  add("model file contents (a digest of 512 KiB sampled across it)", sampled_file_digest(c.engine.model_path));
  add("--tp", count_or_not_given(c.tp));
  add("--pp", count_or_not_given(c.pp));
  add("--plan", c.plan);
  add("--layers-per-stage", c.engine.layers_per_stage.empty() ? given(false) : fmt::format("{}", fmt::join(c.engine.layers_per_stage, ",")));
  add("--micro-batches", count_or_not_given(c.engine.micro_batches));
  add("--chunk-tokens", count_or_not_given(c.engine.chunk_tokens));
  add("--kv-block-tokens", std::to_string(c.engine.kv_block_tokens));
  add("--kv-blocks", std::to_string(c.engine.kv_blocks));
  add("--weights-dtype", kernels::cpu::weight_dtype_name(c.engine.weights_dtype));
  add("--kv-dtype", c.engine.kv_dtype ? kernels::cpu::kv_dtype_name(*c.engine.kv_dtype) : "auto");
  add("--dump-logits", given(!c.dump_logits.empty()));
  add("--print-config", given(c.print_config));
  add("number of sequences (--prompt, --prompts-file, --batch)", std::to_string(c.requests.size()));
  // Each sequence's own fields up to a point; past it, one digest of them all keeps rank 0's bytes small.
  constexpr std::size_t kSequencesByName = 64;
  if (c.requests.size() <= kSequencesByName) {
    for (std::size_t i = 0; i < c.requests.size(); ++i) {
      const runtime::GenerationRequest& r = c.requests[i];
      const std::string of = c.requests.size() == 1 ? "" : fmt::format(" of sequence {}", i + 1);
      add("prompt" + of, comparable_value(r.prompt));
      add("--steps" + of, std::to_string(r.steps));
      add("--temperature" + of, fmt::format("{}", r.sampler.temperature));
      add("--top-p" + of, fmt::format("{}", r.sampler.top_p));
      add("--seed" + of, fmt::format("{}", r.sampler.seed));
    }
  } else {
    std::string all;
    for (const auto& r : c.requests) {
      all += fmt::format("{}:{}|{}|{}|{}|{}\n", r.prompt.size(), r.prompt, r.steps, r.sampler.temperature,
                         r.sampler.top_p, r.sampler.seed);
    }
    add("prompts, --steps and sampling of the sequences (a digest)", fmt::format("{:016x}", std::hash<std::string>{}(all)));
  }
  // Another tokenizer (or vocabulary) encodes the same prompts differently.
  add("prompts' token ids (the tokenizer's; a digest)", fmt::format("{:016x}", c.prompt_ids_hash));
  return fields;
}

// tp x pp from the flags and the world size; without flags: all ranks in TP if the model allows, else PP.
partition::Mesh choose_mesh(const RunConfig& c, const partition::ModelShape& shape, const MpiSession& mpi) {
  const int world = mpi.world_size();
  int tp = c.tp, pp = c.pp;
  if (tp == 0 && pp == 0) {
    tp = world;
    pp = 1;
    if (partition::find_layout_problem(shape, tp, pp)) std::swap(tp, pp);
  } else if (tp == 0) {
    tp = world % pp == 0 ? world / pp : 0;
  } else if (pp == 0) {
    pp = world % tp == 0 ? world / tp : 0;
  }
  if (tp < 1 || pp < 1 || tp * pp != world) {
    throw ConfigError(rank_count_mismatch(c.tp, c.pp, world));
  }
  if (auto problem = partition::find_layout_problem(shape, tp, pp)) {
    // Without --tp/--pp the layout was this function's fallback (tp = every rank, else pp), which the user never
    // asked for: say so, and how to choose one.
    const std::string chosen =
        c.tp == 0 && c.pp == 0
            ? fmt::format("; that is --plan none's fallback (tp = all {} ranks, else pp = all of them): give --tp and "
                          "--pp that fit the model, or use --plan auto, which searches every layout",
                          world)
            : "";
    throw ConfigError(fmt::format("layout tp={} pp={} cannot serve this model ({}): {}{}", tp, pp, shape.describe(),
                                  *problem, chosen));
  }
  partition::stage_layer_ranges(shape, pp, c.engine.layers_per_stage);  // validates an explicit split
  return partition::Mesh(world, mpi.world_rank(), tp, pp);
}

// The weights stay mapped from the model file (--weights map): a file truncated or replaced in place during
// the run makes the next read of a vanished page a SIGBUS. Said as the job's usual one line, exit 3.
void report_model_bus_errors(const std::string& model_path) {
  memory::report_bus_errors(
      fmt::format("{} error: bus error reading mapped memory: the model file '{}' was truncated or replaced while this "
                  "rank had it mapped (or hugepages ran out); do not overwrite a model a run is using (--weights arena "
                  "copies the weights into memory at load)\n",
                  detail::rank_tag(), model_path),
      static_cast<int>(ExitCode::kFormat));
}

void print_json(const runtime::GenerationResult& r) {
  nlohmann::json j;
  j["prompt"] = r.prompt;
  j["prompt_ids"] = r.prompt_ids;
  j["ids"] = r.ids;
  j["text"] = r.text;
  j["generated_text"] = r.generated_text;
  // Generated text may hold partial UTF-8 sequences (byte tokens); replace rather than fail.
  std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // U+2028 and U+2029 are valid raw in JSON, but line splitters (Python's str.splitlines, JavaScript) break a
  // line at them, and a helper's comparison script lost sequences that way: written escaped, one object
  // stays one line for every reader. (Their UTF-8 bytes occur only as these characters.)
  for (const auto& [raw, escaped] : {std::pair<std::string_view, std::string_view>{"\xE2\x80\xA8", "\\u2028"},
                                     std::pair<std::string_view, std::string_view>{"\xE2\x80\xA9", "\\u2029"}}) {
    for (std::size_t at = line.find(raw); at != std::string::npos; at = line.find(raw, at + escaped.size())) {
      line.replace(at, raw.size(), escaped);
    }
  }
  std::cout << line << std::endl;
}

// A sequence stops where the model samples an end of text (llama2.c's BOS; a GGUF file's EOS, EOT or EOM):
// a run that printed its prompt and nothing after it looked broken without a word on why.
void report_early_ends(const runtime::Tokenizer& tokenizer, const std::vector<runtime::GenerationRequest>& requests,
                       const std::vector<runtime::GenerationResult>& results) {
  int early = 0, first = -1;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (static_cast<int>(results[i].ids.size()) >= requests[i].steps) continue;
    if (first < 0) first = static_cast<int>(i);
    ++early;
  }
  if (early == 0) return;
  const std::string end = tokenizer.end_description();
  if (results.size() == 1) {
    log::info("the model ended the text (sampled {}) after {} of --steps {} tokens", end, results[0].ids.size(),
              requests[0].steps);
  } else {
    log::info("{} of {} sequences ended early: the model sampled {} before --steps (the first: sequence {}, after {} "
              "of {} tokens)",
              early, results.size(), end, first, results[first].ids.size(), requests[first].steps);
  }
}

void print_stats(const runtime::Engine& engine, const std::vector<runtime::GenerationResult>& results, int threads) {
  int prompt_tokens = 0, generated = 0;
  double ttft_s = 0, ttft_sum_s = 0, end_s = 0, first_done_s = std::numeric_limits<double>::infinity();
  for (const auto& r : results) {
    prompt_tokens += r.stats.prompt_tokens;
    generated += r.stats.generated_tokens;
    ttft_s = std::max(ttft_s, r.stats.prefill_s);
    ttft_sum_s += r.stats.prefill_s;
    end_s = std::max(end_s, r.stats.prefill_s + r.stats.decode_s);
    first_done_s = std::min(first_done_s, r.stats.prefill_s + r.stats.decode_s);
  }
  const auto& mesh = engine.mesh();
  // Sequences that waited for KV blocks started after others had finished: there is no batch-wide prefill
  // followed by decode to split the time into, so only the whole run's rate means anything. (A sequence
  // may also finish before another's first token without any waiting: --steps 1, or mixed prompts.)
  if (engine.kv_queued() && ttft_s > first_done_s) {
    log::info("load {:.3f} s | {} prompt + {} generated tok in {:.3f} s ({:.1f} generated tok/s; sequences waited "
              "for KV blocks, so prefill and decode overlapped) | {} sequences | tp={} pp={} | {} thread{}/rank",
              engine.load_s(), prompt_tokens, generated, end_s, end_s > 0 ? generated / end_s : 0.0, results.size(),
              mesh.tp_size(), mesh.pp_size(), threads, threads == 1 ? "" : "s");
    return;
  }
  // Decode rate counts the tokens produced after each sequence's first one, over the time after the
  // last first token: the steady state of the batch.
  const int n = static_cast<int>(results.size());
  const int decode_tokens = generated - n;
  const double decode_s = end_s - ttft_s;
  // What a serving user reads first: the time to the first token (mean and worst over the sequences) and
  // the time between a sequence's tokens. The decode segment keeps its form: scripts/ parse it.
  const std::string ttft = n == 1 ? fmt::format("TTFT {:.3f} s", ttft_s)
                                  : fmt::format("TTFT mean {:.3f} s, max {:.3f} s", ttft_sum_s / n, ttft_s);
  // Each sequence's own time between tokens (they end at different steps: BOS, --steps), averaged.
  double step_sum_s = 0;
  int stepped = 0;
  for (const auto& r : results) {
    if (r.stats.generated_tokens < 2) continue;
    step_sum_s += r.stats.decode_s / (r.stats.generated_tokens - 1);
    ++stepped;
  }
  const std::string step = stepped > 0 ? fmt::format(" | {:.2f} ms/token per sequence", 1e3 * step_sum_s / stepped) : "";
  log::info("load {:.3f} s | prefill {} tok in {:.3f} s ({:.1f} tok/s) | {} | decode {} tok in {:.3f} s ({:.1f} tok/s){} "
            "| {} sequence{} | tp={} pp={} | {} thread{}/rank",
            engine.load_s(), prompt_tokens, ttft_s, ttft_s > 0 ? prompt_tokens / ttft_s : 0.0, ttft, generated, decode_s,
            decode_s > 0 && decode_tokens > 0 ? decode_tokens / decode_s : 0.0, step, n, n == 1 ? "" : "s",
            mesh.tp_size(), mesh.pp_size(), threads, threads == 1 ? "" : "s");
}

long peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      long kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 20, '\n');
  }
  return 0;
}

void write_logits(const std::string& path, const std::vector<std::vector<float>>& per_sequence) {
  std::ofstream out = open_output_file(path, std::ios::binary, "--dump-logits file");
  for (const auto& logits : per_sequence) {
    out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  }
  close_output_file(out, path, "--dump-logits file");
}

}  // namespace

int run_command(const std::vector<std::string>& args, const MpiSession& mpi) {
  // Phase 1, identical on every rank: flags, model header, tokenizer, prompts. Nothing is mapped yet.
  std::optional<RunConfig> config;
  std::optional<partition::ModelShape> shape;
  std::optional<partition::Mesh> mesh;
  int longest_prompt = 1;
  int longest_sequence = 1;  // prompt + steps of the longest request: the planner's context
  bool help = false;
  double timeout_s = kDefaultCommTimeoutS;  // until the flags are read
  int code = agreed_phase(mpi, timeout_s, [&] {
    config = parse_run_config(args, mpi);
    if (!config) {
      help = true;
      return;
    }
    timeout_s = config->comm_timeout_s;
    if (config->default_model) {
      const auto paths = runtime::ensure_default_model();
      config->engine.model_path = paths.model;
      config->engine.tokenizer_path = paths.tokenizer;
      if (mpi.world_rank() == 0) {  // every rank uses it; one says so
        log::warn("no --model given: using the built-in default model, which has RANDOM WEIGHTS (its text is "
                  "gibberish); pass --model to run a real checkpoint");
      }
    }
    const runtime::ModelFile model = runtime::read_model_file(config->engine.model_path);  // a missing one first
    report_model_bus_errors(config->engine.model_path);
    shape = model.shape;
    config->cpu_only_reason = cpu_only_reason(*config);  // the phases below only look it up
    if (!model.layout.layers.empty()) config->file_w1 = model.layout.layers.front().w1;
    // A rank's share of the weights on a GPU (fp32 or bf16 there: int8 never goes), for --device auto's choice.
    config->gpu_weight_bytes = static_cast<std::uint64_t>(
        static_cast<double>(shape->n_params()) * kernels::cpu::typical_bytes_per_weight(config->engine.weights_dtype) /
        std::max(1, mpi.world_size()));
    if (config->engine.tokenizer_path.empty()) config->engine.tokenizer_path = find_tokenizer_for(config->engine.model_path);
    const runtime::Tokenizer tokenizer(config->engine.tokenizer_path, shape->vocab_size);
    std::string all_ids;
    const std::vector<std::vector<int>> encoded = runtime::encode_prompts(tokenizer, config->requests);
    for (std::size_t i = 0; i < config->requests.size(); ++i) {
      runtime::GenerationRequest& request = config->requests[i];
      const std::vector<int>& ids = encoded[i];
      const int prompt_tokens = static_cast<int>(ids.size());
      if (!config->steps_given) request.steps = std::clamp(shape->seq_len - prompt_tokens + 1, 1, kDefaultSteps);
      longest_prompt = std::max(longest_prompt, prompt_tokens);
      longest_sequence = std::max(longest_sequence, prompt_tokens + request.steps);
      all_ids += fmt::format("{};", fmt::join(ids, ","));
    }
    config->prompt_ids_hash = std::hash<std::string>{}(all_ids);
    runtime::check_requests(tokenizer, shape->seq_len, config->requests);  // before any rank maps weights
    check_requests_fit_in_memory(config->requests);
    // Flags that fix the layout are checked here, before anyone measures anything.
    const bool planned = config->plan == "auto" && mpi.world_size() > 1;
    if (!planned || config->tp > 0 || config->pp > 0) mesh = choose_mesh(*config, *shape, mpi);
  });
  if (code != 0) return code;
  // Every rank must run the same model, requests and layout flags: an MPMD launch that gave ranks different
  // ones would otherwise wait in its first collective until --comm-timeout (--help and --print-config, which
  // end a rank early, count). Every rank reaches the broadcast, whatever computing its own value did. A rank
  // that differs names the field and both values (launch/agreed_fields.h). Alone, a rank has nobody to
  // differ from (and reads no samples of its model for the digest).
  code = agreed_phase(mpi, timeout_s, [&] {
    require_same_fields(mpi, timeout_s, help, [&] { return run_fields(*config, *shape); },
                        "give every rank the same model file, prompts and layout flags");
  });
  if (code != 0 || help) return code;

  // Phase 1b (collective): the planner fills in whatever the flags left open (with one stage there is
  // nothing to overlap, so a fixed layout needs no plan).
  std::optional<runtime::AutoPlan> plan;
  const bool open_choices = !mesh || (mesh->pp_size() > 1 && (config->engine.layers_per_stage.empty() ||
                                                              config->engine.micro_batches == 0 ||
                                                              config->engine.chunk_tokens == 0));
  if (config->plan == "auto" && mpi.world_size() > 1 && open_choices) {
    if (mesh) {
      config->tp = mesh->tp_size();
      config->pp = mesh->pp_size();
    }
    code = agreed_phase(mpi, timeout_s, [&] {
      auto world = comm::make_mpi_world({config->comm_timeout_s});
      runtime::AutoPlanRequest request{*shape, static_cast<int>(config->requests.size()),
                                       longest_sequence, longest_prompt, config->tp,
                                       config->pp, config->engine.micro_batches,
                                       kernels::cpu::typical_bytes_per_weight(config->engine.weights_dtype),
                                       runtime::weight_format_of(config->engine.weights_dtype)};
      // The cache's dtype depends on the backend this rank will get (CUDA keeps fp32), which --device auto
      // decides by whether the rank sees a GPU: the same test as the backend choice below. A cache dtype the
      // CUDA backend refuses is priced as the CPU keeps it: throwing here, on the GPU ranks alone, would
      // leave the others in plan_job's collectives (the refusal comes after the backends are agreed).
      const bool refused_on_gpu = config->engine.kv_dtype && *config->engine.kv_dtype != kernels::cpu::KvDtype::kF32;
      const bool cuda = !refused_on_gpu &&
                        runtime::choose_backend(config->device, mpi.local_rank(), config->cpu_only_reason,
                                                config->gpu_weight_bytes)
                            .cuda;
      request.kv_bytes_per_value = kernels::cpu::kv_bytes_per_value(
          runtime::resolve_kv_dtype(config->engine.kv_dtype, config->engine.weights_dtype, cuda), shape->head_size());
      // What the flags fixed is priced as given, so the plan line reports the layout the run uses.
      request.layers_per_stage = config->engine.layers_per_stage;
      request.chunk_tokens = config->engine.chunk_tokens;
      request.greedy = config->dump_logits.empty() &&
                       std::all_of(config->requests.begin(), config->requests.end(),
                                   [](const auto& r) { return r.sampler.temperature == 0.0f; });
      plan = runtime::plan_job(*world, request);
      RunConfig planned = *config;
      planned.tp = plan->tp;
      planned.pp = plan->pp;
      mesh = choose_mesh(planned, *shape, mpi);
    });
    if (code != 0) return code;
    if (config->engine.layers_per_stage.empty()) config->engine.layers_per_stage = plan->layers_per_stage;
    if (config->engine.micro_batches == 0) config->engine.micro_batches = plan->micro_batches;
    config->engine.chunk_policy = plan->chunk_policy;
  }
  if (config->engine.micro_batches == 0) {
    config->engine.micro_batches = std::max(1, std::min<int>(config->requests.size(), mesh->pp_size()));
  }
  if (config->plan == "none" && config->engine.chunk_tokens == 0) config->engine.chunk_tokens = 64;
  const int output_rank = mesh->rank_of(mesh->pp_size() - 1, 0);
  log::set_place(mesh->tag(), mesh->rank() == output_rank);
  report_model_bus_errors(config->engine.model_path);  // again, with the rank's full tag
  if (plan) {
    // Ranks that outnumber their host's cores take turns on them, so the link probe timed the scheduler as
    // much as the links: the same job's prediction ranged over 36-4315 tok/s from run to run.
    const int cores = static_cast<int>(std::thread::hardware_concurrency());  // the host's (a bound rank has one)
    const std::string noisy =
        mpi.local_size() > cores && cores > 0
            ? fmt::format(" (the {} ranks on this host outnumber its {} CPUs: the links it measured, and so this "
                          "prediction, vary from run to run)",
                          mpi.local_size(), cores)
            : std::string();
    log::info("plan auto: {}{}", runtime::describe(*plan), noisy);
  }

  if (config->print_config) {
    if (mesh->rank() == output_rank) {
      std::cout << fmt::format(
          "model: {}\ntokenizer: {}\nsequences: {}\nsteps: {}\ntemperature: {}\ntop_p: {}\nseed: {}\nthreads: {}\n"
          "chunk_tokens: {}\nmicro_batches: {}\nlauncher: {}\nworld_size: {}\ntp: {}\npp: {}\ncomm_timeout_s: {}\n"
          "plan: {}\nbind: {}\narena_pages: {}\nweights: {}\nkv_block_tokens: {}\nkv_blocks: {}\n"
          "weights_dtype: {}\nkv_dtype: {}\nkernel_isa: {}\ndevice: {}\n",
          config->engine.model_path, config->engine.tokenizer_path, config->requests.size(),
          config->requests[0].steps, config->requests[0].sampler.temperature, config->requests[0].sampler.top_p,
          config->requests[0].sampler.seed,
          config->threads_given ? std::to_string(config->engine.threads) : "one per core of the rank's placement",
          config->engine.chunk_tokens > 0 ? std::to_string(config->engine.chunk_tokens) : "planned per prompt",
          config->engine.micro_batches, mpi.launcher(), mpi.world_size(), mesh->tp_size(), mesh->pp_size(),
          config->comm_timeout_s, plan ? runtime::describe(*plan) : config->plan, memory::bind_mode_name(config->bind),
          memory::page_policy_name(config->engine.arena_pages), config->engine.weights_in_arena ? "arena" : "map",
          config->engine.kv_block_tokens, config->engine.kv_blocks == 0 ? std::string("auto")
                                                                         : std::to_string(config->engine.kv_blocks),
          kernels::cpu::weight_dtype_name(config->engine.weights_dtype),
          config->engine.kv_dtype ? std::string(kernels::cpu::kv_dtype_name(*config->engine.kv_dtype))
                                  : fmt::format("auto ({} on the CPU, fp32 on CUDA)",
                                                kernels::cpu::kv_dtype_name(runtime::resolve_kv_dtype(
                                                    std::nullopt, config->engine.weights_dtype, false))),
          kernels::cpu::isa_name(kernels::cpu::active_isa()), runtime::device_request_name(config->device));
    }
    return 0;
  }

  // Phase 2: communicators (collective), then each rank takes its place on its host (collective: the host
  // split), binds, maps its own shard into memory on its node, and checks the requests.
  runtime::CommGroups groups = runtime::make_comm_groups(*mesh, {mpi.active(), config->comm_timeout_s});
  std::optional<runtime::LoadWatch> load_watch;  // before the engine: it is armed while the engine loads
  std::unique_ptr<runtime::Engine> engine;
  std::optional<PlacedRank> placed;
  runtime::BackendChoice backend;
  // The backend comes first: a GPU rank is placed next to its GPU.
  code = agreed_phase(mpi, timeout_s, [&] {
    // The rank that will write --dump-logits finds out now whether it can, not after the whole generation
    // (opened for appending, so an existing file is untouched; one made only to test is removed again).
    if (!config->dump_logits.empty() && mesh->rank() == output_rank) {
      // Not one of the run's own inputs: the logits would overwrite the model it is reading (a slip of the
      // shell's history, and the next run finds no model).
      const std::pair<const std::string&, const char*> inputs[] = {
          {config->engine.model_path, "model"}, {config->engine.tokenizer_path, "tokenizer"}, {config->prompts_file, "prompts"}};
      for (const auto& [input, kind] : inputs) {
        std::error_code ec;
        if (!input.empty() && std::filesystem::equivalent(config->dump_logits, input, ec)) {
          throw ConfigError(fmt::format("--dump-logits '{}' is the run's own {} file; write the logits elsewhere",
                                        config->dump_logits, kind));
        }
      }
      require_writable_output(config->dump_logits, "--dump-logits file");
    }
    // --device cuda for a run the CUDA stage cannot take is a bad flag, said before any rank builds NCCL groups.
    if (config->device == runtime::DeviceRequest::kCuda && !config->cpu_only_reason.empty()) {
      throw ConfigError(fmt::format("--device cuda: {}; run with --device cpu or auto", config->cpu_only_reason));
    }
    backend = runtime::choose_backend(config->device, mpi.local_rank(), config->cpu_only_reason,
                                      config->gpu_weight_bytes);
  });
  if (code != 0) return code;
  // Every rank runs the same backend (the TP all-reduces of one group are all NCCL or all MPI): auto uses
  // the GPUs only when every rank has one.
  const runtime::BackendChoice own_backend = backend;
  const MpiSession::Agreement all_gpu = mpi.agree(own_backend.cuda ? 0 : 1, timeout_s);
  if (all_gpu.exit_code != 0) {
    backend = {};
    backend.cpu_reason = own_backend.cuda ? fmt::format("rank {} has no usable GPU", all_gpu.first_failed_rank)
                                          : own_backend.cpu_reason;
  }
  code = agreed_phase(mpi, timeout_s, [&] {
    std::optional<RankGpu> gpu;
    if (backend.cuda) gpu = RankGpu{backend.pci_bus_id, backend.driver_numa_node};
    placed = place_this_rank(mpi, config->bind, gpu);
    if (!config->threads_given) config->engine.threads = placed->binding.default_threads(placed->host);
    runtime::start_kernel_threads(placed->binding, config->engine.threads);
    config->engine.numa_node = placed->binding.placement.numa_node;
  });
  if (code != 0) return code;
  config->engine.cuda_device = backend.cuda ? backend.cuda_device : -1;
  config->engine.comm_timeout_s = config->comm_timeout_s;
  // Loading waits for the slowest rank without a bound (below), so each rank bounds its own: reading its
  // weights may go --comm-timeout, and at least 5 minutes, without progress (64 MiB read in, a tensor
  // converted); then it says so and leaves, and the launcher ends the job. It lives as long as the engine.
  load_watch.emplace(std::max(config->comm_timeout_s, kMinLoadStallS), [model = config->engine.model_path](double s) {
    runtime::end_stalled_load(model, s, kMinLoadStallS);
  });
  config->engine.load_watch = &*load_watch;
  // Loading a shard takes what its file system needs (minutes for a large model on a busy one, and not the
  // same on every rank), so the agreement after it waits without the --comm-timeout bound.
  const double loading_s = std::numeric_limits<double>::infinity();
  code = agreed_phase(mpi, loading_s, [&] {
    engine = std::make_unique<runtime::Engine>(config->engine, *mesh, *groups.world, *groups.tp);
    engine->check_kv_capacity(config->requests);  // (encodes and checks every request first)
  });
  if (code != 0) return code;
  // Said once the job is sure to run, so a bad request still gets exactly one line.
  if (config->device == runtime::DeviceRequest::kAuto && !backend.cuda) {
    log::info("--device auto: running on the CPU: {}", backend.cpu_reason);
  }
  if (const std::string note = quantised_file_note(*config, backend.cuda); !note.empty()) log::info("{}", note);
  log::debug("stage backend: {}", engine->backend());
  int rank_cpus = 0;  // hardware threads: two kernel threads on one core's two still both run
  for (const auto& core : placed->binding.cpu_cores) rank_cpus += static_cast<int>(core.pus.size());
  if (config->engine.threads > rank_cpus && rank_cpus > 0) {
    // Kernel threads beyond the CPUs take turns on them, and every barrier waits for a descheduled thread.
    log::warn("--threads {} is more than the {} CPU{} this rank runs on: threads will take turns on them and decode "
              "slows down many times; use --threads {} or fewer",
              config->engine.threads, rank_cpus, rank_cpus == 1 ? "" : "s", rank_cpus);
  }
  if (placed->binding.placement.launcher_bound) {
    log::info("the launcher bound each rank's CPUs; keeping that binding (launch with mpirun --bind-to none or srun "
              "--cpu-bind=none to let --bind place the ranks)");
  }
  if (config->verbose) {
    log::note("placement: host {} | {} | arena {} | KV pool {} tokens/block of {}, {}", placed->host.hostname,
              placed->binding.describe(), engine->arena().describe(), config->engine.kv_block_tokens,
              kernels::cpu::kv_dtype_name(engine->kv_dtype()), engine->kv_pool().describe());
    if (!placed->gpu_note.empty()) log::note("GPU placement: {}", placed->gpu_note);
  }
  if (engine->has_host_weights()) {
    log::debug("launched as {}; model {} ({}); this rank maps {} and holds {} repacked", mpi.launcher(),
               config->engine.model_path, engine->shape().describe(), format_bytes(engine->weights().mapped_bytes()),
               format_bytes(engine->weights().repacked_bytes()));
  }
  log::debug("weights {} on {}; kernel threads {}", kernels::cpu::weight_dtype_name(config->engine.weights_dtype),
             kernels::cpu::describe_active_isa(), placed->binding.pinned_threads > 0 ? "pinned to cores" : "not pinned");

  if (config->verbose) {
    // What the launcher's variables say, then where MPI itself places this rank (the authority).
    log::note("launched {} {} | {} {}, local rank {} of {}", mpi.active() ? "by" : "as a", describe(mpi.launch_env()),
              mpi.active() ? "MPI node" : "host", mpi.node_name(), mpi.local_rank(), mpi.local_size());
  }

  // Phase 3: generation. A failure from here on aborts the whole job (main() does that).
  const bool output = engine->is_output_rank();
  runtime::PieceCallback stream;
  if (output && !config->json) {
    // A write that fails (a full disk) ends the run at that token, not after the whole generation.
    stream = [](std::string_view piece) {
      if (std::fwrite(piece.data(), 1, piece.size(), stdout) != piece.size() || std::fflush(stdout) != 0) {
        throw ResourceError(fmt::format("writing the output failed: {}", std::strerror(errno)));
      }
    };
  }
  std::vector<std::vector<float>> dumped(config->requests.size());
  runtime::LogitsCallback on_logits;
  if (!config->dump_logits.empty()) {
    on_logits = [&](int sequence, int, const float* logits) {
      dumped[sequence].insert(dumped[sequence].end(), logits, logits + engine->shape().vocab_size);
    };
  }
  const auto results = engine->generate(config->requests, stream, on_logits);
  if (output) {
    if (config->json) {
      for (const auto& r : results) print_json(r);
    } else if (results.size() == 1) {
      std::fputs("\n", stdout);  // the text itself was streamed
    } else {
      for (const auto& r : results) std::cout << r.text << "\n";
    }
    std::fflush(stdout);
    if (!config->dump_logits.empty()) write_logits(config->dump_logits, dumped);
    print_stats(*engine, results, config->engine.threads);
    report_early_ends(engine->tokenizer(), config->requests, results);
  }
  if (config->verbose) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    const auto& st = engine->pipeline_stats();
    const auto& shard = engine->shard();
    log::note("host {} | layers [{}, {}) heads [{}, {}) hidden [{}, {}) | mapped {} repacked {} | peak RSS {} | "
              "{} items, {} rows, busy {:.3f} of {:.3f} s ({:.0f}%)",
              host, shard.layers.begin, shard.layers.end, shard.heads.begin, shard.heads.end, shard.hidden.begin,
              shard.hidden.end, format_bytes(engine->has_host_weights() ? engine->weights().mapped_bytes() : 0),
              format_bytes(engine->has_host_weights() ? engine->weights().repacked_bytes() : 0), format_bytes(peak_rss_bytes()), st.items, st.rows,
              st.busy_s, st.total_s, st.total_s > 0 ? 100.0 * st.busy_s / st.total_s : 0.0);
    log::note("memory: arena {} | KV pool {}", engine->arena().describe(), engine->kv_pool().describe());
  }
  return 0;
}

}  // namespace shardline::launch
