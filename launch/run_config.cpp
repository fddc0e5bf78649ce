#include "launch/run_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "common/input_file.h"
#include "common/log.h"
#include "common/units.h"
#include "memory/system_memory.h"
#include "runtime/gguf.h"
#include "runtime/kv_cache.h"
#include "runtime/model_generator.h"

namespace shardline::launch {

namespace {

// Positions per KV block at most: larger blocks only waste the cache (a block longer than any context
// holds one sequence's tail), and sizes near INT_MAX overflowed the block arithmetic.
constexpr int kMaxKvBlockTokens = 65536;

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
      ("threads", po::value<int>(), "kernel threads of this rank, 1 to 1024 (default: one per core of its placement; the host's cores over its ranks where a launcher's CPU sets overlap)")
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
       "KV cache blocks per rank (0: 64 full contexts, at most 3/4 of the host's usable memory shared by its ranks, as address space committed as used; a value past the rank's share of usable memory is refused, exit 4); sequences beyond it wait and start as others finish")
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
  const double available = static_cast<double>(memory::usable_memory_bytes().value_or(0));  // 0: unknown
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

}  // namespace

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

void check_requests_fit_in_memory(const std::vector<runtime::GenerationRequest>& requests) {
  double bytes = 0;
  for (const auto& request : requests) bytes += sequence_host_bytes(static_cast<double>(request.prompt.size()), request.steps);
  check_sequences_fit_in_memory(static_cast<double>(requests.size()), bytes,
                                fmt::format("{} sequences at their --steps", requests.size()));
}

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
  // Given, even empty (an unset shell variable), it is parsed: an empty list is refused, as plan's lists are.
  if (vm.count("layers-per-stage")) c.engine.layers_per_stage = parse_int_list("--layers-per-stage", f.layer_split);
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

}  // namespace shardline::launch
