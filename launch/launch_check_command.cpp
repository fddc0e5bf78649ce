#include "launch/launch_check_command.h"

#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "common/error.h"
#include "common/printable.h"
#include "launch/cli_options.h"
#include "launch/launch_check.h"
#include "launch/launch_env.h"
#include "launch/run_config.h"
#include "partition/shard.h"
#include "runtime/checkpoint.h"
#include "runtime/gguf.h"
#include "runtime/tokenizer.h"

namespace shardline::launch {

namespace {

constexpr const char* kUsage =
    "Usage: shardline launch-check --tp T --pp S [--np N] [--hostfile F] [--rankfile F] [--oversubscribe]\n"
    "                              [--model M.bin] [any of run's other flags, ignored; a flag neither has is an error]\n\n"
    "Checks, before mpirun or srun starts any rank, that the launch fits the layout: the rank count, the\n"
    "hostfile's slots and syntax, the rankfile, and (inside a Slurm job) the allocation's task count; with\n"
    "--model also that the model can be split tp x pp ways (and that a GGUF file's own vocabulary reads). Prints\n"
    "one line and exits 0 when it fits; else one error line and exit 2 (flags, hostfile, rankfile), 3 (a corrupt\n"
    "model file) or 4 (too few slots or tasks, a missing hostfile, rankfile or model).\n"
    "Under mpirun or srun it runs on the launch's first task only, and without --np checks the launch's own\n"
    "task count. Example:\n"
    "  shardline launch-check --hostfile hosts --np 4 --tp 2 --pp 2 && mpirun --hostfile hosts -np 4 shardline run --tp 2 --pp 2 ...";

}  // namespace

int launch_check_command(const std::vector<std::string>& args) {
  LaunchRequest request;
  int np = 0;
  std::string hostfile, rankfile, model, layer_split;
  po::options_description options("launch-check options");
  options.add_options()
      ("tp", po::value(&request.tp_size)->required(), "tensor-parallel ranks per stage, as given to run")
      ("pp", po::value(&request.pp_size)->required(), "pipeline stages, as given to run")
      ("np", po::value(&np), "ranks the launcher will start (mpirun -np / srun -n); default: tp x pp, or the "
                             "Slurm allocation's tasks")
      ("hostfile", po::value(&hostfile), "Open MPI hostfile mpirun will be given")
      ("rankfile", po::value(&rankfile), "Open MPI rankfile mpirun will be given")
      ("oversubscribe", po::bool_switch(&request.oversubscribe), "mpirun will run with --oversubscribe")
      ("model,m", po::value(&model), "check that this model (llama2.c or GGUF) can be split tp x pp ways")
      ("layers-per-stage", po::value(&layer_split), "explicit layer split: one count per stage; its sum is "
                                                    "checked with --model");
  po::options_description all(options);
  all.add_options()("help,h", "show this help and exit");
  // Its own flags, and run's (--prompt, --steps ...), parsed as run parses them and then ignored: a script
  // hands both commands the same list. Anything else is a typo, which would otherwise skip the check it
  // misspelled (--modle).
  po::options_description accepted(all);
  const po::options_description run_flags = run_flag_descriptions();
  for (const auto& flag : run_flags.options()) {
    if (all.find_nothrow(flag->long_name(), /*approx=*/false) == nullptr) accepted.add(flag);
  }
  po::variables_map vm;
  try {
    po::store(parse_flags(args, accepted), vm);
    if (vm.count("help")) {
      std::cout << kUsage << "\n\n" << all << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    throw ConfigError(fmt::format("shardline launch-check: unknown flag '{}'{}: neither launch-check nor run has it "
                                  "(see 'shardline launch-check --help')",
                                  e.get_option_name().substr(0, e.get_option_name().find('=')),
                                  did_you_mean(accepted, e.get_option_name())));
  } catch (const po::invalid_option_value& e) {
    throw ConfigError(fmt::format("shardline launch-check: {}{} (see 'shardline launch-check --help')", e.what(),
                                  number_value_hint(accepted, e)));
  } catch (const po::error& e) {
    throw ConfigError(fmt::format("shardline launch-check: {} (see 'shardline launch-check --help')", e.what()));
  }
  check_rank_flag("--tp", request.tp_size);
  check_rank_flag("--pp", request.pp_size);
  // (each alone may be a rank count; their product said "ok ... 1073741824 ranks")
  const long long world = static_cast<long long>(request.tp_size) * request.pp_size;
  if (world > kMaxRanksPerFlag) {
    throw ConfigError(fmt::format("--tp {} x --pp {} is {} ranks; a job has at most {}", request.tp_size,
                                  request.pp_size, world, kMaxRanksPerFlag));
  }
  if (vm.count("np")) {
    check_rank_flag("--np", np);
    request.n_ranks = np;
  }
  if (!hostfile.empty()) request.hostfile = read_hostfile(hostfile);
  if (!rankfile.empty()) request.rankfile = read_rankfile(rankfile);
  const LaunchEnv env = detect_launch_env();
  request.slurm = env.slurm;
  // Started by mpirun (or Hydra) itself: the launch's task count is the rank count to check (it said "ok:
  // tp=2 x pp=2 = 4 ranks" inside a launch of 3). Inside Slurm the allocation's count is checked instead.
  if (!vm.count("np") && (env.ompi || env.pmi) && env.task_count() > 0) {
    if (env.task_count() != world) {
      // Too few tasks is a missing resource (exit 4), too many a layout that leaves ranks idle (exit 2), as --np.
      const std::string text = fmt::format("this launch started {} task{} but tp={} x pp={} uses {} ranks: launch "
                                           "exactly {} (mpirun -np {})", env.task_count(),
                                           env.task_count() == 1 ? "" : "s", request.tp_size, request.pp_size, world,
                                           world, world);
      if (env.task_count() < world) throw ResourceError(text);
      throw ConfigError(text);
    }
    request.n_ranks = env.task_count();
  }
  // Given, even empty (an unset shell variable), it is parsed: an empty list is refused, as run refuses it.
  const std::vector<int> split =
      vm.count("layers-per-stage") ? parse_int_list("--layers-per-stage", layer_split) : std::vector<int>{};
  // The split's own problems need no model (its sum is checked against one below, with --model).
  if (auto problem = split.empty() ? std::nullopt : partition::layer_split_problem(split, request.pp_size)) {
    throw ConfigError(fmt::format("--layers-per-stage {} {}", printable(layer_split), *problem));
  }
  if (!model.empty()) {
    const partition::ModelShape shape = runtime::read_checkpoint_shape(model);
    if (auto problem = partition::find_layout_problem(shape, request.tp_size, request.pp_size)) {
      throw ConfigError(fmt::format("layout tp={} pp={} cannot serve {} ({}): {}", request.tp_size, request.pp_size,
                                    model, shape.describe(), *problem));
    }
    partition::stage_layer_ranges(shape, request.pp_size, split);
    // A GGUF file carries its vocabulary, which every rank of run reads: one run would refuse (a damaged
    // tokenizer.ggml.* key, a BOS id past the vocabulary) is refused here, before the launch (exit 3).
    if (runtime::is_gguf_file(model) && !vm.count("tokenizer")) runtime::Tokenizer(model, shape.vocab_size);
  }
  const LaunchCheckReport report = check_launch(request);
  for (const auto& warning : report.warnings) std::fprintf(stderr, "launch-check: warning: %s\n", warning.c_str());
  std::printf("launch-check: ok: %s\n", report.summary(request.tp_size, request.pp_size).c_str());
  return 0;
}

}  // namespace shardline::launch
