// shardline: serve a transformer LLM across MPI ranks. This file only dispatches subcommands and turns
// every expected failure into one clear line and a meaningful exit code (see common/error.h).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"
#include "common/printable.h"
#include "launch/bench_command.h"
#include "launch/gen_model_command.h"
#include "launch/launch_check_command.h"
#include "launch/launch_env.h"
#include "launch/mpi_session.h"
#include "launch/plan_command.h"
#include "launch/probe_command.h"
#include "launch/run_command.h"
#include "launch/topo_command.h"

namespace {

constexpr const char* kUsage = R"(shardline: tensor- and pipeline-parallel LLM inference over MPI

Usage: shardline <command> [options]      (shardline <command> --help for its options)
       shardline --version

Commands:
  run           generate text (plain process, or under mpirun / srun)
  gen-model     write a random-weight llama2.c checkpoint and tokenizer of any shape
  plan          lay a model out on a cluster and predict its cost (no MPI job, no weights)
  probe         measure links (under mpirun) and this host; write a cluster profile for plan
  bench         decode/prefill tokens/s of generated models against a measured bandwidth roofline
  topo          show the host's topology and where each local rank would be placed
  launch-check  before mpirun/srun: does the hostfile, rankfile or Slurm allocation fit tp x pp?

Exit codes: 0 ok, 1 unexpected error, 2 bad flags or layout, 3 corrupt input file,
            4 missing resource (file, memory, GPU, room for the output), 5 communication failure
            (peer died, timeout).
)";

// This process's launch as launch_env.h reads it; nullopt where its variables are nonsense (the commands that
// ask never read them, so they run as a plain process would).
std::optional<shardline::launch::LaunchEnv> this_launch() {
  try {
    return shardline::launch::detect_launch_env();
  } catch (const shardline::ConfigError&) {
    return std::nullopt;
  }
}

// The commands that are not MPI jobs, started under mpirun or srun anyway (`mpirun -np 4 shardline plan`):
// every task would do the same work and print it again. plan and launch-check run on the launch's first
// task; gen-model and topo on each host's first (a model written to each host's own disk; each host's
// topology). The other tasks end at once with exit 0 and print nothing (64 tasks printed 63 lines that said
// the same); the first says in one line that they did; SHARDLINE_EVERY_TASK=1 runs the command on every
// task (a script that gives each task its own --out). The task numbers are Open MPI's, Slurm's or Hydra's
// (launch_env.h).
bool left_to_another_task(const std::string& command) {
  const bool per_launch = command == "plan" || command == "launch-check";
  const bool per_host = command == "gen-model" || command == "topo";
  if (!per_launch && !per_host) return false;
  const char* every_task = std::getenv("SHARDLINE_EVERY_TASK");
  if (every_task != nullptr && std::string_view(every_task) == "1") return false;
  const auto env = this_launch();
  if (!env) return false;
  const int rank = per_host ? env->task_rank_on_host() : env->task_rank();
  if (rank > 0) return true;
  const int tasks = per_host ? env->task_count_on_host() : env->task_count();
  if (rank == 0 && tasks > 1) {
    shardline::log::info("{} runs on the first task{} of an mpirun or srun launch; the other {}{} end{} without "
                         "running it (SHARDLINE_EVERY_TASK=1 runs it on every task)",
                         command, per_host ? " on each host" : "", tasks > 2 ? fmt::format("{} tasks", tasks - 1) : "task",
                         per_host ? " on this host" : "", tasks > 2 ? "" : "s");
  }
  return false;
}

// `mpirun -np 4 shardline --help` (or --version): the first task prints it, the others print nothing, as a
// command's own --help does under mpirun.
bool printed_by_another_task() {
  const auto env = this_launch();
  return env && env->task_rank() > 0;
}

// run's --comm-timeout, read ahead of its flags (MPI starts before they are parsed) to bound MPI's own
// start-up; the default when it is absent, unreadable or below run's 1 s (the flag parser then reports it).
double comm_timeout_flag(const std::vector<std::string>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string value;
    if (args[i] == "--comm-timeout" && i + 1 < args.size()) {
      value = args[i + 1];
    } else if (args[i].rfind("--comm-timeout=", 0) == 0) {
      value = args[i].substr(std::string("--comm-timeout=").size());
    } else {
      continue;
    }
    char* end = nullptr;
    const double timeout_s = std::strtod(value.c_str(), &end);
    if (end != value.c_str() && *end == '\0' && timeout_s >= shardline::launch::kMinCommTimeoutS) return timeout_s;
    break;
  }
  return shardline::launch::kDefaultCommTimeoutS;
}

int dispatch(const std::string& command, const std::vector<std::string>& args,
             std::unique_ptr<shardline::launch::MpiSession>& mpi) {
  using namespace shardline::launch;
  if (left_to_another_task(command)) return 0;
  // A job's start-up lines name their rank (until the command knows its place in the mesh).
  const auto name_the_rank = [&] {
    if (mpi->active() && mpi->world_size() > 1) {
      shardline::log::set_place(fmt::format("[r{}]", mpi->world_rank()), mpi->world_rank() == 0);
    }
  };
  if (command == "run") {
    mpi = std::make_unique<MpiSession>(comm_timeout_flag(args));
    name_the_rank();
    return run_command(args, *mpi);
  }
  if (command == "gen-model") return gen_model_command(args);
  if (command == "plan") return plan_command(args);
  if (command == "probe") {
    mpi = std::make_unique<MpiSession>();
    name_the_rank();
    return probe_command(args, *mpi);
  }
  if (command == "launch-check") return launch_check_command(args);
  if (command == "topo") return topo_command(args);
  if (command == "bench") {
    mpi = std::make_unique<MpiSession>();
    name_the_rank();
    return bench_command(args, *mpi);
  }
  throw shardline::ConfigError(fmt::format("unknown command '{}' (see 'shardline --help')", command));
}

// What a successful command printed must have arrived: a full disk behind stdout is a failed run (exit 4),
// not exit 0 with the output cut short. Other codes stay: the command's own failure is the one to report.
int checked_output(int code) {
  if (code != 0) return code;
  const bool flush_failed = std::fflush(stdout) != 0;  // errno tells why only when this failed
  if (!flush_failed && !std::ferror(stdout)) return code;
  shardline::print_error_line(fmt::format("writing the output failed: {}", flush_failed ? std::strerror(errno)
                                                                                      : "a write to stdout failed (disk full?)"));
  return static_cast<int>(shardline::ExitCode::kResource);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return static_cast<int>(shardline::ExitCode::kConfig);
  }
  // `shardline help run` is `shardline run --help` (it printed the command list); `help help` is `help`
  // (it was refused as an unexpected argument, exit 2).
  if (args[0] == "help" && args.size() == 2 && args[1] == "help") args.pop_back();
  if (args[0] == "help" && args.size() > 1 && !args[1].starts_with("-") && args[1] != "help") {
    args.erase(args.begin());
    args.insert(args.begin() + 1, "--help");
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help" || args[0] == "--version") {
    if (args.size() > 1) {  // ("--version extra" printed the version)
      shardline::print_error_line(fmt::format("unexpected argument '{}' after {} (see 'shardline --help')",
                                              shardline::printable(args[1], 60), args[0]));
      return static_cast<int>(shardline::ExitCode::kConfig);
    }
    if (printed_by_another_task()) return 0;
    if (args[0] == "--version") {
      std::puts("shardline 0.1.0");
    } else {
      std::fputs(kUsage, stdout);
    }
    return checked_output(0);
  }
  const std::string command = args[0];
  args.erase(args.begin());
  std::unique_ptr<shardline::launch::MpiSession> mpi;
  int code = 0;
  bool failed_outside_command = false;
  try {
    code = dispatch(command, args, mpi);
  } catch (const std::exception& e) {
    failed_outside_command = true;
    const shardline::Failure failure = shardline::failure_of(e);
    shardline::print_error_line(failure.message);
    code = static_cast<int>(failure.code);
  }
  code = checked_output(code);
  // Failures that escaped a command (after start-up agreement) end the whole job, so no peer waits.
  if (code != 0 && mpi && failed_outside_command) mpi->abort_job(code);
  return code;
}
