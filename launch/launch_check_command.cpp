#include "launch/launch_check_command.h"

#include <cctype>
#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "common/error.h"
#include "launch/cli_options.h"
#include "launch/launch_check.h"
#include "launch/launch_env.h"
#include "launch/run_command.h"
#include "partition/shard.h"
#include "runtime/checkpoint.h"

namespace shardline::launch {

namespace {

constexpr const char* kUsage =
    "Usage: shardline launch-check --tp T --pp S [--np N] [--hostfile F] [--rankfile F] [--oversubscribe]\n"
    "                              [--model M.bin] [any of run's other flags, ignored; a flag neither has is an error]\n\n"
    "Checks, before mpirun or srun starts any rank, that the launch fits the layout: the rank count, the\n"
    "hostfile's slots and syntax, the rankfile, and (inside a Slurm job) the allocation's task count; with\n"
    "--model also that the model can be split tp x pp ways. Prints one line and exits 0 when it fits; else one\n"
    "error line and exit 2 (flags, hostfile, rankfile) or 4 (too few slots or tasks, a missing hostfile, rankfile or model). Example:\n"
    "  shardline launch-check --hostfile hosts --np 4 --tp 2 --pp 2 && mpirun --hostfile hosts -np 4 shardline run --tp 2 --pp 2 ...";

// ConfigError for a word of `unrecognized` (what launch-check's own flags left) that is a flag neither
// launch-check nor run has. Values (words without a dash, numbers such as -1) pass.
void refuse_unknown_flags(const std::vector<std::string>& unrecognized, const po::options_description& own) {
  const po::options_description run_flags = run_flag_descriptions();
  for (const std::string& word : unrecognized) {
    if (word.size() < 2 || word[0] != '-' || std::isdigit(static_cast<unsigned char>(word[1])) || word[1] == '.') continue;
    const bool is_long = word[1] == '-';
    const std::string name = is_long ? word.substr(2, word.find('=') == std::string::npos ? std::string::npos
                                                                                          : word.find('=') - 2)
                                     : word.substr(0, 2);
    if (run_flags.find_nothrow(name, /*approx=*/false) != nullptr) continue;
    po::options_description both;
    both.add(own).add(run_flags);
    throw ConfigError(fmt::format("shardline launch-check: unknown flag '{}'{}: neither launch-check nor run has it "
                                  "(see 'shardline launch-check --help')",
                                  word.substr(0, word.find('=')), did_you_mean(both, word)));
  }
}

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
      ("layers-per-stage", po::value(&layer_split), "explicit layer split, checked with --model");
  po::options_description all(options);
  all.add_options()("help,h", "show this help and exit");
  po::variables_map vm;
  try {
    // Flags of its own, and run's (--prompt, --steps ...), which it ignores: a script hands both commands the
    // same list. Anything else is a typo, which would otherwise skip the check it misspelled (--modle).
    const po::parsed_options parsed = po::command_line_parser(args).options(all).style(kFlagStyle).allow_unregistered().run();
    refuse_unknown_flags(po::collect_unrecognized(parsed.options, po::include_positional), all);
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::cout << kUsage << "\n\n" << all << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(fmt::format("shardline launch-check: {} (see 'shardline launch-check --help')", e.what()));
  }
  check_rank_flag("--tp", request.tp_size);
  check_rank_flag("--pp", request.pp_size);
  if (vm.count("np")) request.n_ranks = np;
  if (!hostfile.empty()) request.hostfile = read_hostfile(hostfile);
  if (!rankfile.empty()) request.rankfile = read_rankfile(rankfile);
  request.slurm = detect_launch_env().slurm;
  if (!model.empty()) {
    const partition::ModelShape shape = runtime::read_checkpoint_shape(model);
    if (auto problem = partition::find_layout_problem(shape, request.tp_size, request.pp_size)) {
      throw ConfigError(fmt::format("layout tp={} pp={} cannot serve {} ({}): {}", request.tp_size, request.pp_size,
                                    model, shape.describe(), *problem));
    }
    const std::vector<int> split = layer_split.empty() ? std::vector<int>{} : parse_int_list("--layers-per-stage", layer_split);
    partition::stage_layer_ranges(shape, request.pp_size, split);
  }
  const LaunchCheckReport report = check_launch(request);
  for (const auto& warning : report.warnings) std::fprintf(stderr, "launch-check: warning: %s\n", warning.c_str());
  std::printf("launch-check: ok: %s\n", report.summary(request.tp_size, request.pp_size).c_str());
  return 0;
}

}  // namespace shardline::launch
