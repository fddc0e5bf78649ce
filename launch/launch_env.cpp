#include "launch/launch_env.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "common/printable.h"

extern char** environ;

namespace shardline::launch {

namespace {

const std::string* find(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

std::string text_of(const Environment& env, const char* name) {
  const std::string* value = find(env, name);
  return value ? *value : std::string();
}

int parse_count(const char* variable, const std::string& text) {
  try {
    std::size_t used = 0;
    const long value = std::stol(text, &used);
    if (used == text.size() && value >= 0 && value < (1L << 30)) return static_cast<int>(value);
  } catch (const std::exception&) {
  }
  throw ConfigError(fmt::format("{}='{}' is not a count; the launcher's environment looks corrupt (unset it or "
                                "launch through mpirun/srun)",
                                variable, printable(text)));
}

// An integer variable, or `fallback` when it is not set.
int int_of(const Environment& env, const char* name, int fallback) {
  const std::string* value = find(env, name);
  return value ? parse_count(name, *value) : fallback;
}

SlurmAllocation read_slurm(const Environment& env) {
  SlurmAllocation s;
  s.job_id = text_of(env, "SLURM_JOB_ID");
  s.step_id = text_of(env, "SLURM_STEP_ID");
  s.node_list = text_of(env, "SLURM_JOB_NODELIST");
  s.n_nodes = int_of(env, "SLURM_JOB_NUM_NODES", int_of(env, "SLURM_NNODES", 0));
  if (const std::string* tasks = find(env, "SLURM_TASKS_PER_NODE")) {
    s.tasks_per_node = expand_slurm_counts("SLURM_TASKS_PER_NODE", *tasks);
  }
  std::int64_t tasks_sum = 0;  // (up to 2^20 nodes of up to 10^9 tasks each)
  for (int t : s.tasks_per_node) tasks_sum += t;
  if (tasks_sum >= (std::int64_t{1} << 30)) {
    throw ConfigError(fmt::format("SLURM_TASKS_PER_NODE='{}' adds up to {} tasks; the launcher's environment looks "
                                  "corrupt (unset it or launch through mpirun/srun)",
                                  printable(text_of(env, "SLURM_TASKS_PER_NODE")), tasks_sum));
  }
  // Inside an srun step SLURM_NTASKS is the step's task count; in the batch script, the allocation's.
  s.n_tasks = int_of(env, "SLURM_NTASKS", int_of(env, "SLURM_NPROCS", static_cast<int>(tasks_sum)));
  s.cpus_per_task = int_of(env, "SLURM_CPUS_PER_TASK", 0);
  s.overcommit = find(env, "SLURM_OVERCOMMIT") != nullptr;
  if (s.in_step()) {
    s.proc_id = int_of(env, "SLURM_PROCID", -1);
    s.local_id = int_of(env, "SLURM_LOCALID", -1);
  }
  s.node_name = text_of(env, "SLURMD_NODENAME");
  return s;
}

std::string join(const std::vector<int>& values) { return fmt::format("{}", fmt::join(values, ",")); }

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::kPlain: return "plain process";
    case Launcher::kMpirun: return "mpirun";
    case Launcher::kSrun: return "srun";
    case Launcher::kPmix: return "pmix";
  }
  return "?";
}

std::vector<int> expand_slurm_counts(const std::string& variable, const std::string& text) {
  // Grammar: item (',' item)*, item = count | count '(x' repeat ')'. At most 2^20 nodes in all (Slurm's own
  // limit is lower): '1(x999999999)' took 4 GB before anything was checked.
  constexpr std::size_t kMaxNodes = std::size_t{1} << 20;
  std::vector<int> counts;
  std::size_t at = 0;
  const auto bad = [&] {
    return ConfigError(fmt::format("{}='{}' is not in Slurm's count format (like 2(x3),1)", variable, printable(text)));
  };
  if (text.empty()) throw bad();
  while (at < text.size()) {
    const std::size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    const std::size_t paren = item.find("(x");
    int repeat = 1;
    std::string count = item;
    if (paren != std::string::npos) {
      if (item.back() != ')') throw bad();
      count = item.substr(0, paren);
      const std::string times = item.substr(paren + 2, item.size() - paren - 3);
      if (times.empty() || times.size() > 9 || times.find_first_not_of("0123456789") != std::string::npos) throw bad();
      repeat = std::stoi(times);
    }
    if (count.empty() || count.size() > 9 || count.find_first_not_of("0123456789") != std::string::npos || repeat < 1) {
      throw bad();
    }
    if (static_cast<std::size_t>(repeat) > kMaxNodes - counts.size()) {
      throw ConfigError(fmt::format("{}='{}' names more than {} nodes; the launcher's environment looks corrupt (unset "
                                    "it or launch through mpirun/srun)",
                                    variable, printable(text), kMaxNodes));
    }
    counts.insert(counts.end(), repeat, std::stoi(count));
    at = end + 1;
    if (end + 1 == text.size()) throw bad();  // trailing comma
  }
  return counts;
}

// Open MPI's variables first: inside an allocation mpirun starts its daemons as an srun step, whose
// SLURM_PROCID and SLURM_LOCALID its ranks inherit (the daemon's node index, 0).
// PMI's rank before the srun step's: Hydra inside an allocation starts its tasks through an srun step of its
// own proxies, whose SLURM_PROCID (the proxy's node index) they inherit; srun --mpi=pmi2 sets PMI_RANK to
// SLURM_PROCID anyway.
int LaunchEnv::task_rank() const {
  if (ompi) return ompi->world_rank;
  if (pmi) return pmi->rank;
  if (slurm && slurm->in_step()) return slurm->proc_id;
  return pmix ? pmix->rank : -1;
}

int LaunchEnv::task_rank_on_host() const {
  if (ompi) return ompi->local_rank;
  if (started_by_hydra()) return pmi->local_rank;
  return slurm && slurm->in_step() ? slurm->local_id : -1;
}

int LaunchEnv::task_count() const {
  if (ompi) return ompi->world_size;
  if (pmi) return pmi->size;
  return slurm && slurm->in_step() ? slurm->n_tasks : 0;
}

int LaunchEnv::task_count_on_host() const {
  if (ompi) return ompi->local_size;
  if (!slurm || !slurm->in_step() || slurm->tasks_per_node.empty()) return 0;
  const std::vector<int>& per_node = slurm->tasks_per_node;  // which entry is this node's is not said
  return std::all_of(per_node.begin(), per_node.end(), [&](int n) { return n == per_node[0]; }) ? per_node[0] : 0;
}

bool LaunchEnv::started_by_hydra() const { return pmi && pmi->local_rank >= 0; }

bool LaunchEnv::srun_without_pmix() const {
  return launcher == Launcher::kPlain && slurm && slurm->in_step() && slurm->n_tasks > 1 && !started_by_hydra();
}

// srun --mpi=pmi2 sets PMI_* as well: srun_without_pmix() names that case (and its fix).
bool LaunchEnv::pmi_tasks_without_pmix() const {
  return launcher == Launcher::kPlain && pmi && pmi->size > 1 && !srun_without_pmix();
}

LaunchEnv detect_launch_env(const Environment& env) {
  LaunchEnv e;
  if (find(env, "SLURM_JOB_ID")) e.slurm = read_slurm(env);
  if (find(env, "OMPI_COMM_WORLD_SIZE")) {
    e.ompi = OmpiPlacement{int_of(env, "OMPI_COMM_WORLD_SIZE", 0), int_of(env, "OMPI_COMM_WORLD_RANK", -1),
                           int_of(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 0), int_of(env, "OMPI_COMM_WORLD_LOCAL_RANK", -1),
                           int_of(env, "OMPI_COMM_WORLD_NODE_RANK", -1)};
  }
  if (find(env, "PMIX_RANK")) e.pmix = PmixPlacement{text_of(env, "PMIX_NAMESPACE"), int_of(env, "PMIX_RANK", -1)};
  // Only with a live PMI connection (PMI_FD or PMI_PORT): a shell left over from a Hydra launch keeps PMI_RANK
  // and PMI_SIZE, and its plain processes are not tasks of anything.
  if (find(env, "PMI_SIZE") && (find(env, "PMI_FD") || find(env, "PMI_PORT"))) {
    e.pmi = PmiPlacement{int_of(env, "PMI_SIZE", 0), int_of(env, "PMI_RANK", -1), int_of(env, "MPI_LOCALRANKID", -1)};
  }
  // mpirun inside an allocation starts its ranks through an srun step of its own daemons, so its variables
  // decide before Slurm's; mpirun also runs a PMIx server, so OMPI_* before PMIX_*.
  if (e.ompi) {
    e.launcher = Launcher::kMpirun;
  } else if (e.pmix) {
    e.launcher = e.slurm && e.slurm->in_step() ? Launcher::kSrun : Launcher::kPmix;
  }
  return e;
}

Environment launcher_variables() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const char* text = *entry;
    if (std::strncmp(text, "SLURM", 5) != 0 && std::strncmp(text, "OMPI_", 5) != 0 &&
        std::strncmp(text, "PMIX_", 5) != 0 && std::strncmp(text, "PMI_", 4) != 0 &&
        std::strncmp(text, "MPI_LOCAL", 9) != 0) {
      continue;
    }
    const char* eq = std::strchr(text, '=');
    if (eq) env.emplace(std::string(text, eq), std::string(eq + 1));
  }
  return env;
}

LaunchEnv detect_launch_env() { return detect_launch_env(launcher_variables()); }

std::string describe(const LaunchEnv& e) {
  std::string line = launcher_name(e.launcher);
  if (e.ompi) {
    line += fmt::format(" (rank {} of {}, local rank {} of {} on its host)", e.ompi->world_rank, e.ompi->world_size,
                        e.ompi->local_rank, e.ompi->local_size);
  } else if (e.pmix) {
    line += fmt::format(" (PMIx rank {} in namespace {})", e.pmix->rank, e.pmix->nspace);
  } else if (e.pmi) {
    line += fmt::format(" (PMI rank {} of {}, without PMIx)", e.pmi->rank, e.pmi->size);
  }
  if (e.slurm) {
    const SlurmAllocation& s = *e.slurm;
    line += fmt::format(" in Slurm job {}", s.job_id);
    if (s.in_step()) {
      line += fmt::format(" step {} (task {} of {}, local id {} on {})", s.step_id, s.proc_id, s.n_tasks, s.local_id,
                          s.node_name.empty() ? "?" : s.node_name);
    } else {
      line += fmt::format(" ({} tasks)", s.n_tasks);
    }
    line += fmt::format("; nodes {} ({}), tasks per node {}", s.n_nodes, s.node_list.empty() ? "?" : s.node_list,
                        s.tasks_per_node.empty() ? "?" : join(s.tasks_per_node));
    if (s.cpus_per_task > 0) line += fmt::format(", {} cpus per task", s.cpus_per_task);
    if (s.overcommit) line += ", overcommitted";
  }
  return line;
}

}  // namespace shardline::launch
