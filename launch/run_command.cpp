#include "launch/run_command.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
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
#include "launch/run_config.h"
#include "launch/run_output.h"
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

// What every rank of a run must share, in the order a differing rank is told of it (launch/agreed_fields.h;
// --help before them, launch/field_agreement.h): the model's shape, file size and a digest of its contents
// (not its path: hosts may keep copies in different places), the requests, and the flags that shape the
// layout or the arithmetic. Flags that end a rank early (--print-config) count, since the others would wait
// for it in their first collective. Threads, binding and page tiers may differ per rank.
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
    // The CUDA stage all-reduces w2's partial sums and needs hidden features on every TP rank; a toy width
    // of fewer blocks of 32 than ranks leaves some none (partition::split_hidden), which only the CPU takes.
    if (config->cpu_only_reason.empty() && partition::split_hidden(*shape, mesh->tp_size(), 0).empty()) {
      config->cpu_only_reason = fmt::format("hidden_dim {} leaves some of tp={} ranks no hidden features, which only "
                                            "the CPU stage takes", shape->hidden_dim, mesh->tp_size());
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
  config->engine.ranks_on_host = mpi.local_size();
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
              format_bytes(engine->has_host_weights() ? engine->weights().repacked_bytes() : 0), format_bytes(static_cast<double>(memory::process_status_bytes("VmHWM"))), st.items, st.rows,
              st.busy_s, st.total_s, st.total_s > 0 ? 100.0 * st.busy_s / st.total_s : 0.0);
    log::note("memory: arena {} | KV pool {}", engine->arena().describe(), engine->kv_pool().describe());
  }
  return 0;
}

}  // namespace shardline::launch
