// How this process was started, read from the variables launchers set: Slurm (SLURM_*, inside an
// allocation and inside an srun step), Open MPI's mpirun (OMPI_COMM_WORLD_*), another PMIx launcher
// (PMIX_*), a PMI-1/PMI-2 launcher that Open MPI cannot join (PMI_*: MPICH's and Intel MPI's mpiexec, i.e.
// Hydra), or nothing (a plain process). These are hints: once MPI is up, rank, node and local rank come
// from MPI itself (MpiSession); the environment says which launcher to blame and what the allocation holds.
//
// Example, `sbatch --nodes=2 --ntasks-per-node=2 job.sbatch` whose script runs `srun --mpi=pmix shardline run`:
//   launcher kSrun; slurm: job_id "42", step_id "0", n_nodes 2, tasks_per_node {2, 2}, n_tasks 4,
//   proc_id 0..3, local_id 0..1; pmix: rank 0..3.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace shardline::launch {

enum class Launcher { kPlain, kMpirun, kSrun, kPmix };

// "plain process", "mpirun", "srun", "pmix".
const char* launcher_name(Launcher launcher);

// A Slurm allocation as a job (batch script or srun task) sees it.
struct SlurmAllocation {
  std::string job_id;               // SLURM_JOB_ID
  std::string step_id;              // SLURM_STEP_ID; empty in the batch script itself
  std::string node_list;            // SLURM_JOB_NODELIST, compressed, e.g. "node[01-04]"
  int n_nodes = 0;                  // SLURM_JOB_NUM_NODES
  std::vector<int> tasks_per_node;  // SLURM_TASKS_PER_NODE "2(x3),1" -> {2, 2, 2, 1}; empty when not set
  int n_tasks = 0;                  // SLURM_NTASKS, else the sum of tasks_per_node; 0 when unknown
  int cpus_per_task = 0;            // SLURM_CPUS_PER_TASK; 0 when not requested
  bool overcommit = false;          // SLURM_OVERCOMMIT: more tasks than CPUs
  // Inside an srun step only (-1 / empty in the batch script):
  int proc_id = -1;                 // SLURM_PROCID: the task's rank in the step
  int local_id = -1;                // SLURM_LOCALID: its rank on the node
  std::string node_name;            // SLURMD_NODENAME
  bool in_step() const { return !step_id.empty(); }
};

// What Open MPI's mpirun tells each rank.
struct OmpiPlacement {
  int world_size = 0;   // OMPI_COMM_WORLD_SIZE
  int world_rank = -1;  // OMPI_COMM_WORLD_RANK
  int local_size = 0;   // OMPI_COMM_WORLD_LOCAL_SIZE: ranks on this host
  int local_rank = -1;  // OMPI_COMM_WORLD_LOCAL_RANK
  int node_rank = -1;   // OMPI_COMM_WORLD_NODE_RANK
};

// What any PMIx server (mpirun's or slurmd's) tells its clients.
struct PmixPlacement {
  std::string nspace;  // PMIX_NAMESPACE
  int rank = -1;       // PMIX_RANK
};

// What a PMI-1/PMI-2 process manager tells its tasks: MPICH's and Intel MPI's Hydra (mpiexec), also srun
// --mpi=pmi2. Debian's Open MPI speaks PMIx only, so such tasks cannot wire up; read to say so, and to
// number the tasks for the commands that run once.
// Read only where PMI_FD or PMI_PORT says the task has a live PMI connection.
struct PmiPlacement {
  int size = 0;         // PMI_SIZE
  int rank = -1;        // PMI_RANK
  int local_rank = -1;  // MPI_LOCALRANKID, Hydra's only (not srun's pmi2): the task's rank on its host
};

struct LaunchEnv {
  Launcher launcher = Launcher::kPlain;
  std::optional<SlurmAllocation> slurm;  // set inside any Slurm allocation, also for mpirun in sbatch
  std::optional<OmpiPlacement> ompi;
  std::optional<PmixPlacement> pmix;
  std::optional<PmiPlacement> pmi;

  // True when this process should bring up MPI: a launcher wired it to its peers.
  bool wired_by_launcher() const { return launcher != Launcher::kPlain; }
  // This process's place among the tasks one launch started, for the commands that are not MPI jobs (plan,
  // gen-model, topo, launch-check), which run once per launch or per host: mpirun's rank, else PMI's (Hydra's,
  // or srun --mpi=pmi2's), else the srun task's, else PMIx's; -1 where no launcher says (a plain process, the
  // batch script itself).
  int task_rank() const;
  // The same among this host's tasks: mpirun's local rank, else Hydra's, else the srun task's local id; -1
  // where unknown.
  int task_rank_on_host() const;
  // How many tasks the launch started (task_count) and how many of them run on this host, as the same
  // launchers say; 0 where none does.
  int task_count() const;
  int task_count_on_host() const;
  // An srun step of several tasks that were not given PMIx (srun without --mpi=pmix while the cluster's
  // MpiDefault is none): every task would run alone and print its own output. Run refuses this.
  bool srun_without_pmix() const;
  // Started by MPICH's or Intel MPI's mpiexec (Hydra), which sets MPI_LOCALRANKID; inside a Slurm allocation
  // its tasks also carry the SLURM_STEP_ID and SLURM_PROCID of the srun step that started its proxies.
  bool started_by_hydra() const;
  // Several tasks started by a PMI launcher other than srun (MPICH's or Intel MPI's mpiexec: Hydra), which
  // this build's Open MPI cannot join: every task would run alone. Run refuses this too.
  bool pmi_tasks_without_pmix() const;
};

using Environment = std::map<std::string, std::string>;

// Pure: from a snapshot of variables (tests pass their own). Throws ConfigError naming the variable when
// a launcher variable holds nonsense (e.g. SLURM_NTASKS=abc).
LaunchEnv detect_launch_env(const Environment& env);
// From this process's environment.
LaunchEnv detect_launch_env();
// This process's variables with one of the prefixes SLURM, OMPI_, PMIX_, PMI_, MPI_LOCAL (the only ones read).
Environment launcher_variables();

// Slurm's compressed counts: "2(x3),1" -> {2, 2, 2, 1}; "4" -> {4}. ConfigError naming `variable` otherwise.
std::vector<int> expand_slurm_counts(const std::string& variable, const std::string& text);

// One line for --verbose, e.g. "srun (Slurm job 42 step 0, task 3 of 4, localid 1 on node02; allocation
// 2 nodes x {2,2} tasks)" or "mpirun (rank 1 of 4, local rank 1 of 2) inside Slurm job 42".
std::string describe(const LaunchEnv& env);

}  // namespace shardline::launch
