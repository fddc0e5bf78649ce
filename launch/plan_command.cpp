#include "launch/plan_command.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <regex>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "common/printable.h"
#include "common/units.h"
#include "kernels/cpu/weight_format.h"
#include "launch/cli_options.h"
#include "partition/model_presets.h"
#include "partition/planner.h"
#include "runtime/checkpoint.h"
#include "runtime/kv_cache.h"
#include "runtime/machine_probe.h"

namespace shardline::launch {

namespace {

using partition::PlanEstimate;

std::string join(const std::vector<int>& values) { return fmt::format("{}", fmt::join(values, ",")); }

std::string seconds(double s) {
  if (s >= 1.0) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.0f} us", s * 1e6);
}

nlohmann::json plan_to_json(const PlanEstimate& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.stages) {
    stages.push_back({{"layers", {s.layers.begin, s.layers.end}},
                      {"decode_item_s", s.decode_item_s},
                      {"utilization", s.utilization},
                      {"rank_memory_bytes", s.rank_memory_bytes},
                      {"weight_bytes", s.weight_bytes},
                      {"kv_bytes", s.kv_bytes},
                      {"rank_bandwidth_bytes_per_s", s.bandwidth_bytes_per_s},
                      {"tp_link", partition::link_class_name(s.tp_link)}});
  }
  return {{"tp", p.layout.tp},
          {"pp", p.layout.pp},
          {"ranks", p.layout.world()},
          {"layers_per_stage", p.layout.layers_per_stage},
          {"micro_batches", p.layout.micro_batches},
          {"chunk_tokens", p.chunk_tokens},
          {"design_split_tokens", std::isfinite(p.design_split_tokens) ? nlohmann::json(p.design_split_tokens) : nlohmann::json(nullptr)},
          {"feasible", p.feasible},
          {"infeasible_reason", p.infeasible_reason},
          {"bytes_short", p.bytes_short},
          {"ttft_s", p.ttft_s},
          {"token_latency_s", p.token_latency_s},
          {"throughput_tok_s", p.throughput_tok_s},
          {"request_latency_s", p.request_latency_s},
          {"bubble", p.bubble},
          {"decode_efficiency", p.decode_efficiency},
          {"fractions", {{"compute", p.compute_fraction()}, {"memory", p.memory_fraction()}, {"comm", p.comm_fraction()}}},
          {"rank_memory_available_bytes", p.rank_memory_available_bytes},
          {"stages", stages}};
}

void print_table(const std::vector<PlanEstimate>& plans) {
  std::cout << fmt::format("{:>2}  {:>3} {:>3} {:>3}  {:<14} {:>9} {:>9} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7}\n",
                           "#", "tp", "pp", "m", "layers/stage", "TTFT", "tok/s", "token lat", "mem/rank", "bubble",
                           "comp%", "mem%", "comm%", "chunk", "s*");
  int i = 0;
  for (const auto& p : plans) {
    double memory = 0;
    for (const auto& s : p.stages) memory = std::max(memory, s.rank_memory_bytes);
    std::cout << fmt::format(
        "{:>2}  {:>3} {:>3} {:>3}  {:<14} {:>9} {:>9.1f} {:>10} {:>10} {:>6.2f} {:>5.0f}% {:>5.0f}% {:>5.0f}% {:>6} {:>7}{}\n",
        ++i, p.layout.tp, p.layout.pp, p.layout.micro_batches, join(p.layout.layers_per_stage), seconds(p.ttft_s),
        p.throughput_tok_s, seconds(p.token_latency_s), format_bytes(memory), p.bubble, 100 * p.compute_fraction(),
        100 * p.memory_fraction(), 100 * p.comm_fraction(), p.chunk_tokens,
        std::isfinite(p.design_split_tokens) ? fmt::format("{:.0f}", p.design_split_tokens) : "-",
        p.feasible ? "" : "  DOES NOT FIT");
  }
}

// An sbatch script whose geometry and run flags implement the plan (its layout, the weight and KV dtypes
// its memory per rank was computed for, the device); the run flags the plan does not fix (model, prompts,
// steps...) are the script's arguments.
std::string sbatch_for(const PlanEstimate& p, const partition::ClusterSpec& cluster, const std::string& description,
                       const std::string& dtype, const std::string& kv_dtype, const std::string& time_limit) {
  const int ranks = p.layout.world();
  const int per_node = cluster.domains_per_node * cluster.ranks_per_domain;
  const int nodes = (ranks + per_node - 1) / per_node;
  // Ranks fill slots in order, so the first domain and node are the fullest: the plan priced each rank with
  // its domain's cores shared by the ranks it put there (partition/cost_model.cpp), not by the slots.
  const int on_domain = std::min(cluster.ranks_per_domain, ranks), on_node = std::min(per_node, ranks);
  const int cpus = std::max(1, cluster.domain.cores / on_domain);
  const bool cuda = cluster.device == partition::Device::kCuda;
  // More ranks than cores on a domain (a plan with --ranks-per-domain past the cores): Slurm refuses
  // --ntasks-per-node beyond the node's CPUs ("Requested node configuration is not available") unless the job
  // overcommits; with --overcommit it refuses --ntasks-per-node in the allocation (22.05), so srun takes it,
  // and allocates one CPU a task per node, so --exclusive takes the node's cores for its ranks to share. Each
  // rank then runs the host's cores shared by its ranks, as the plan priced (RankBinding::default_threads).
  const bool overcommit = !cuda && on_domain > cluster.domain.cores;
  // Text that lands in a comment line: a newline in a cluster name or model path would start a shell line.
  std::string safe_description = description;
  for (char& c : safe_description) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  // --device cuda on a GPU cluster: a rank without a usable GPU then stops the job instead of running the plan
  // on its CPU (auto's fallback) at a fraction of the predicted rate.
  const std::string flags = fmt::format(
      "--tp {} --pp {} --layers-per-stage {} --micro-batches {} --weights-dtype {} --kv-dtype {}{}", p.layout.tp,
      p.layout.pp, join(p.layout.layers_per_stage), p.layout.micro_batches, dtype, kv_dtype,
      cuda ? " --device cuda" : "");
  std::string geometry = fmt::format("#SBATCH --nodes={}              # ranks fill nodes in order (TP groups first), "
                                     "as the plan assumed\n#SBATCH --ntasks={}             # tp x pp ranks, one per task\n",
                                     nodes, ranks);
  if (overcommit) {
    geometry += fmt::format("#SBATCH --overcommit           # {} ranks per node on {} cores, as the plan priced them\n"
                            "#SBATCH --exclusive            # the nodes' cores, which their ranks share\n",
                            on_node, cluster.domains_per_node * cluster.domain.cores);
  } else {
    geometry += fmt::format("#SBATCH --ntasks-per-node={}    # the plan's ranks per node, so Slurm cannot split a "
                            "node's share unevenly\n",
                            on_node);
  }
  geometry += fmt::format("#SBATCH --cpus-per-task={}      # each rank's cores (its kernel threads)\n", cpus);
  if (cuda) {
    // The first node is the fullest (ranks fill nodes in order): its domains are the GPUs each node needs.
    const int gpus = (on_node + cluster.ranks_per_domain - 1) / cluster.ranks_per_domain;
    geometry += fmt::format("#SBATCH --gres=gpu:{}           # GPUs per node: one per domain, as the plan priced\n", gpus);
  }
  return fmt::format(R"(#!/bin/bash
# Written by `shardline plan --emit sbatch`: {}
# Plan: tp={} x pp={} = {} ranks, layers per stage {}, {} micro-batch(es); predicted {:.1f} tok/s,
# {} per token, TTFT {}, {} per rank. Submit with run's other flags as arguments:
#   sbatch this.sbatch --model model.bin --tokenizer tokenizer.bin --prompt "Once upon a time"
#
#SBATCH --job-name=shardline-run
{}#SBATCH --mem=0                 # each node's whole memory: the plan's memory per rank assumed it
#SBATCH --time={}         # wall-clock limit (plan --time)
#SBATCH --output=shardline-run-%j.out   # the generated text
#SBATCH --error=shardline-run-%j.err    # statistics and messages
set -euo pipefail
SHARDLINE=${{SHARDLINE:-shardline}}
# Preflight: does the allocation hold the layout? One error line before any rank starts if not.
"$SHARDLINE" launch-check {} "$@" >&2
# --cpus-per-task again: since Slurm 22.05 srun does not inherit it from sbatch.
exec srun --mpi=pmix --cpus-per-task="${{SLURM_CPUS_PER_TASK:-1}}"{} --distribution=block --kill-on-bad-exit=1 \
  "$SHARDLINE" run {} "$@"
)",
                     safe_description, p.layout.tp, p.layout.pp, ranks, join(p.layout.layers_per_stage),
                     p.layout.micro_batches, p.throughput_tok_s, seconds(p.token_latency_s), seconds(p.ttft_s),
                     format_bytes(p.stages.empty() ? 0 : p.stages.front().rank_memory_bytes), geometry, time_limit,
                     flags, overcommit ? fmt::format(" --ntasks-per-node={}", on_node) : "", flags);
}

// 15.2M, 1.10B: a parameter count at the scale it has (small models are not "0.00B").
std::string format_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

}  // namespace

int plan_command(const std::vector<std::string>& args) {
  std::string model, preset, cluster_file, probe_file, tp_list, pp_list, m_list;
  std::string objective = "latency", dtype = "fp32", kv_dtype = "auto";
  int batch = 1, context = 0, prompt_tokens = 0, top = 5, ranks = 0, ranks_per_domain = 0;
  float temperature = 0.0f;
  bool json = false;
  std::string emit, time_limit = "01:00:00";
  po::options_description options("plan options");
  options.add_options()
      ("model,m", po::value(&model), "llama2.c checkpoint or GGUF file: only its header (metadata) is read")
      ("preset", po::value(&preset), fmt::format("model shape by name: {}", partition::model_preset_names()).c_str())
      ("cluster", po::value(&cluster_file), "cluster description JSON (examples in hostfiles/)")
      ("probe-file", po::value(&probe_file), "cluster profile written by `shardline probe`")
      ("objective", po::value(&objective)->default_value("latency"), "latency (one request) | throughput (batch B)")
      ("batch", po::value(&batch)->default_value(1), "sequences decoded together")
      ("context", po::value(&context)->default_value(0, "min(seq_len, 2048)"), "positions per sequence (prompt + generated); 0 means the default")
      ("prompt-tokens", po::value(&prompt_tokens)->default_value(0, "context/2"), "prompt length, for TTFT and the chunk size; 0 means the default")
      ("dtype,weights-dtype", po::value(&dtype)->default_value("fp32"), "weight dtype: fp32 | bf16 | int8 (also --weights-dtype, run's name for it)")
      ("kv-dtype", po::value(&kv_dtype)->default_value("auto"), kKvDtypeFlagHelp)
      ("temperature", po::value(&temperature)->default_value(0.0f, "0"),
       "the run's sampling temperature: 0 (greedy) exchanges each TP rank's best token, > 0 gathers the logits")
      ("np", po::value(&ranks)->default_value(0, "any"), "plan for exactly this many ranks (0: any)")
      ("ranks-per-domain", po::value(&ranks_per_domain)->default_value(0, "from the cluster"),
       "rank slots per domain (e.g. to plan an oversubscribed run); 0 means the default")
      ("tp", po::value(&tp_list), "only these tp values, e.g. 2 or 1,2,4")
      ("pp", po::value(&pp_list), "only these pp values")
      ("micro-batches", po::value(&m_list), "only these micro-batch counts")
      ("top", po::value(&top)->default_value(5), "how many plans to show")
      ("json", po::bool_switch(&json), "print the plans as JSON")
      ("emit", po::value(&emit), "sbatch: print an sbatch script that runs the best plan instead of the table")
      ("time", po::value(&time_limit)->default_value("01:00:00"),
       "with --emit sbatch: the job's wall-clock limit, in Slurm's format (minutes, H:MM:SS, D-HH:MM, ...)");
  po::variables_map vm;
  const std::string usage =
      "Usage: shardline plan (--model M.bin | --preset NAME) [--cluster FILE | --probe-file FILE]\n"
      "                      [--objective latency|throughput] [--batch B] [--context C] [--top K] [--json]\n\n"
      "Lays the model out on the cluster and predicts TTFT, tokens/s and memory per rank for the best\n"
      "layouts. Needs no MPI job and no weights. Without --cluster, this machine is measured (about 1 s).\n"
      "Under mpirun or srun it runs on the launch's first task only.";
  if (!parse_command_line("plan", usage, options, args, vm)) return 0;
  if (!emit.empty() && json) throw ConfigError("shardline plan: --emit prints a script, --json the plans: give one");
  if (!vm["time"].defaulted() && emit.empty()) throw ConfigError("shardline plan: --time is the script's: give --emit sbatch");
  // It lands on an #SBATCH line: one of Slurm's forms only (minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or no
  // limit: -1, INFINITE or UNLIMITED in any case, as Slurm's time_str2secs reads them), so no other text can
  // reach the script.
  static const std::regex kSlurmTime(R"((\d{1,8}-)?\d{1,8}(:\d{1,2}){0,2}|-1|unlimited|infinite)", std::regex::icase);
  if (!std::regex_match(time_limit, kSlurmTime)) {
    throw ConfigError(fmt::format("shardline plan: --time '{}' is not a Slurm time limit (minutes, H:MM:SS, D-HH:MM, ...)",
                                  printable(time_limit)));
  }

  partition::Workload w;
  if (model.empty() == preset.empty()) throw ConfigError("shardline plan: give exactly one of --model or --preset");
  w.shape = preset.empty() ? runtime::read_checkpoint_shape(model) : partition::find_model_preset(preset).shape;
  const std::optional<kernels::cpu::WeightDtype> weight_dtype = kernels::cpu::parse_weight_dtype(dtype);
  if (!weight_dtype) throw ConfigError(fmt::format("shardline plan: --dtype '{}' is not fp32, bf16 or int8", dtype));
  w.weight_bytes_per_param = kernels::cpu::typical_bytes_per_weight(*weight_dtype);
  w.weight_format = runtime::weight_format_of(*weight_dtype);
  const std::optional<kernels::cpu::KvDtype> requested_kv = parse_kv_dtype_flag(kv_dtype);
  if (objective == "latency") {
    w.objective = partition::Objective::kLatency;
  } else if (objective == "throughput") {
    w.objective = partition::Objective::kThroughput;
  } else {
    throw ConfigError(fmt::format("shardline plan: --objective '{}' is not latency or throughput", objective));
  }
  if (!std::isfinite(temperature) || temperature < 0.0f) {  // as run refuses it
    throw ConfigError(fmt::format("shardline plan: --temperature must be a finite number >= 0 (0 = greedy); got {}", temperature));
  }
  w.greedy = temperature == 0.0f;
  if (batch < 1) throw ConfigError("shardline plan: --batch must be >= 1");
  if (top < 1) throw ConfigError("shardline plan: --top must be >= 1");
  if (ranks < 0) throw ConfigError("shardline plan: --np must be >= 1 (or 0: any)");
  // A context of 1 holds the prompt's one token and nothing to decode (the plan priced "prompt 1 tokens").
  if (context < 0 || context == 1) throw ConfigError("shardline plan: --context must be >= 2 (or 0: min(seq_len, 2048))");
  w.batch = batch;
  w.context = context > 0 ? context : std::min(w.shape.seq_len, 2048);
  if (w.context > w.shape.seq_len) {
    throw ConfigError(fmt::format("shardline plan: --context {} exceeds the model's seq_len {}", w.context, w.shape.seq_len));
  }
  if (prompt_tokens < 0 || prompt_tokens >= w.context) {
    throw ConfigError(fmt::format("shardline plan: --prompt-tokens must be in [1, context) = [1, {}) (or 0: context/2)",
                                  w.context));
  }
  w.prompt_tokens = prompt_tokens;
  partition::PlanSearch search;  // the flags' filters, checked before this machine is measured
  search.world = ranks;
  search.top = top;
  // Given, even empty ("--tp ''", a shell variable left unset), a list is parsed: an empty one is refused.
  if (vm.count("tp")) search.tp_only = parse_int_list("--tp", tp_list);
  if (vm.count("pp")) search.pp_only = parse_int_list("--pp", pp_list);
  for (int tp : search.tp_only) check_rank_flag("--tp", tp);
  for (int pp : search.pp_only) check_rank_flag("--pp", pp);
  if (vm.count("micro-batches")) {
    // Counts past the batch are priced and shown as the batch (Workload::micro_batches_for), once.
    for (int m : parse_int_list("--micro-batches", m_list)) {
      if (m < 1) throw ConfigError(fmt::format("shardline plan: --micro-batches {} is not a count >= 1", m));
      const int kept = w.micro_batches_for(m);
      if (kept < m) log::warn("--micro-batches {} is more than --batch {}: planned as {}", m, w.batch, kept);
      if (std::find(search.micro_batches_only.begin(), search.micro_batches_only.end(), kept) ==
          search.micro_batches_only.end()) {
        search.micro_batches_only.push_back(kept);
      }
    }
  }

  if (!cluster_file.empty() && !probe_file.empty()) throw ConfigError("shardline plan: give --cluster or --probe-file, not both");
  partition::ClusterSpec cluster;
  if (!cluster_file.empty() || !probe_file.empty()) {
    cluster = partition::load_cluster_file(cluster_file.empty() ? probe_file : cluster_file);
  } else {
    log::info("no --cluster: measuring this machine (use `mpirun ... shardline probe` for measured links)");
    runtime::MachineProbeOptions probe;
    probe.only_for(w.weight_format);
    cluster = runtime::probe_this_machine(probe);
  }
  // The cluster's device decides what its runs can hold: the CUDA stage keeps an fp32 KV cache (auto resolves
  // to it; fp16 and int8 are run's ConfigError there) and takes no int8 weights.
  const bool cuda = cluster.device == partition::Device::kCuda;
  if (cuda && *weight_dtype == kernels::cpu::WeightDtype::kInt8) {
    throw ConfigError(fmt::format("shardline plan: the cluster '{}' runs on GPUs (\"device\": \"cuda\"), whose stage "
                                  "takes fp32 or bf16 weights; plan --dtype fp32 or bf16",
                                  printable(cluster.name)));
  }
  if (cuda && requested_kv && *requested_kv != kernels::cpu::KvDtype::kF32) {
    throw ConfigError(fmt::format("shardline plan: the cluster '{}' runs on GPUs (\"device\": \"cuda\"), whose stage "
                                  "keeps its KV cache in fp32; plan --kv-dtype auto or fp32",
                                  printable(cluster.name)));
  }
  const kernels::cpu::KvDtype resolved_kv = runtime::resolve_kv_dtype(requested_kv, *weight_dtype, cuda);
  w.kv_bytes_per_value = kernels::cpu::kv_bytes_per_value(resolved_kv, w.shape.head_size());
  if (ranks_per_domain < 0) throw ConfigError("shardline plan: --ranks-per-domain must be >= 1 (or 0: the cluster's)");
  if (ranks_per_domain > 0) {
    if (static_cast<double>(cluster.nodes) * cluster.domains_per_node * ranks_per_domain > (1 << 20)) {
      throw ConfigError(fmt::format("shardline plan: --ranks-per-domain {} makes over {} rank slots", ranks_per_domain, 1 << 20));
    }
    cluster.ranks_per_domain = ranks_per_domain;
  }
  if (ranks > cluster.total_slots()) {
    throw ConfigError(fmt::format("shardline plan: --np {} but the cluster '{}' has {} rank slots ({} per domain; "
                                  "--ranks-per-domain N plans more, e.g. an oversubscribed run)",
                                  ranks, printable(cluster.name), cluster.total_slots(), cluster.ranks_per_domain));
  }
  const auto plans = partition::search_plans(cluster, w, search);
  if (plans.empty()) {
    throw ConfigError(
        partition::no_layout_message(w.shape, search, search.world > 0 ? search.world : cluster.total_slots()));
  }
  const double weights = static_cast<double>(w.shape.n_params()) * w.weight_bytes_per_param;
  if (!emit.empty()) {
    if (emit != "sbatch") throw ConfigError(fmt::format("shardline plan: --emit '{}' is not sbatch", emit));
    // run gives each rank the GPU of its local rank (kernels::cuda::device_for_local_rank), not the
    // plan's consecutive ranks per GPU: a script could not run what the plan priced.
    if (cuda && cluster.ranks_per_domain > 1) {
      throw ConfigError(fmt::format("shardline plan: --emit sbatch on GPUs needs one rank per GPU, and the plan has "
                                    "{} ranks per domain; plan with --ranks-per-domain 1",
                                    cluster.ranks_per_domain));
    }
    if (!plans.front().feasible) {
      throw ResourceError(fmt::format("no layout fits, so no script: the closest, tp={} pp={}, {}",
                                      plans.front().layout.tp, plans.front().layout.pp, plans.front().infeasible_reason));
    }
    std::cout << sbatch_for(plans.front(), cluster,
                            fmt::format("{} on '{}', objective {}, batch {}, context {}", preset.empty() ? model : preset,
                                        cluster.name, partition::objective_name(w.objective), w.batch, w.context),
                            dtype, kernels::cpu::kv_dtype_name(resolved_kv), time_limit);
    return 0;
  }
  if (json) {
    nlohmann::json out = {{"model", {{"shape", w.shape.describe()}, {"params", w.shape.n_params()}, {"weight_bytes", weights}}},
                          {"cluster", partition::cluster_to_json(cluster)},
                          {"workload",
                           {{"objective", partition::objective_name(w.objective)},
                            {"batch", w.batch},
                            {"context", w.context},
                            {"prompt_tokens", w.prompt()},
                            {"dtype", dtype},
                            {"kv_bytes_per_value", w.kv_bytes_per_value},
                            {"greedy", w.greedy}}},
                          {"plans", nlohmann::json::array()}};
    for (const auto& p : plans) out["plans"].push_back(plan_to_json(p));
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << fmt::format("{} ({} params, {} {}) on '{}': {} node(s) x {} {} x {} slot(s), {} per rank "
                             "slot\nobjective {}: batch {}, context {}, prompt {} tokens, {}\n\n",
                             preset.empty() ? model : preset, format_count(static_cast<double>(w.shape.n_params())),
                             format_bytes(weights), dtype, printable(cluster.name), cluster.nodes,
                             cluster.domains_per_node, cuda ? "GPU(s)" : "domain(s)", cluster.ranks_per_domain,
                             format_bytes(cluster.domain.memory_bytes / cluster.ranks_per_domain),
                             partition::objective_name(w.objective), w.batch, w.context, w.prompt(),
                             w.greedy ? "greedy" : "sampled (the logits gathered)");
    print_table(plans);
    std::cout << "\nm = micro-batches; tok/s = decode tokens/s over the batch; token lat = one decode step; bubble = "
                 "(p-1)/(m+p-1);\ncomp/mem/comm = where decode time goes; chunk = prefill chunk; s* = the design's "
                 "sqrt(W log2 p / (a p)).\n";
  }
  if (!plans.front().feasible) {
    throw ResourceError(fmt::format("no layout fits: the closest, tp={} pp={}, {}", plans.front().layout.tp,
                                    plans.front().layout.pp, plans.front().infeasible_reason));
  }
  return 0;
}

}  // namespace shardline::launch
