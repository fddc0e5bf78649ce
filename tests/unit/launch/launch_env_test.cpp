// Launcher detection from snapshots of the variables real launchers set (taken from Slurm 22.05 and
// Open MPI 4.1 on Debian 12), and Slurm's compressed count lists.
#include "launch/launch_env.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace shardline::launch {
namespace {

// The batch script of `sbatch --nodes=2 --ntasks-per-node=2 --cpus-per-task=4`.
Environment batch_script() {
  return {{"SLURM_JOB_ID", "42"},          {"SLURM_JOB_NODELIST", "node[01-02]"}, {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_NNODES", "2"},           {"SLURM_TASKS_PER_NODE", "2(x2)"},     {"SLURM_NTASKS", "4"},
          {"SLURM_NPROCS", "4"},           {"SLURM_CPUS_PER_TASK", "4"},          {"SLURM_PROCID", "0"},
          {"SLURM_LOCALID", "0"},          {"SLURMD_NODENAME", "node01"},         {"SLURM_JOB_CPUS_PER_NODE", "8(x2)"}};
}

// Task 3 of `srun --mpi=pmix` inside that script.
Environment srun_task() {
  Environment env = batch_script();
  env["SLURM_STEP_ID"] = "0";
  env["SLURM_PROCID"] = "3";
  env["SLURM_LOCALID"] = "1";
  env["SLURMD_NODENAME"] = "node02";
  env["PMIX_RANK"] = "3";
  env["PMIX_NAMESPACE"] = "slurm.pmix.42.0";
  return env;
}

// The same task when srun was not given PMIx (--mpi=none).
Environment srun_task_without_pmix() {
  Environment env = srun_task();
  env.erase("PMIX_RANK");
  env.erase("PMIX_NAMESPACE");
  return env;
}

TEST(LaunchEnv, NoVariablesIsAPlainProcess) {
  const LaunchEnv e = detect_launch_env(Environment{});
  EXPECT_EQ(e.launcher, Launcher::kPlain);
  EXPECT_FALSE(e.wired_by_launcher());
  EXPECT_FALSE(e.slurm || e.ompi || e.pmix);
  EXPECT_EQ(describe(e), "plain process");
}

TEST(LaunchEnv, MpirunRank) {
  const LaunchEnv e = detect_launch_env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "2"},
                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                         {"OMPI_COMM_WORLD_NODE_RANK", "0"}, {"PMIX_RANK", "2"},
                                         {"PMIX_NAMESPACE", "1234"}});
  EXPECT_EQ(e.launcher, Launcher::kMpirun);  // mpirun runs a PMIx server too: OMPI_* decides
  ASSERT_TRUE(e.ompi);
  EXPECT_EQ(e.ompi->world_size, 4);
  EXPECT_EQ(e.ompi->world_rank, 2);
  EXPECT_EQ(e.ompi->local_size, 2);
  EXPECT_FALSE(e.slurm);
  EXPECT_EQ(describe(e), "mpirun (rank 2 of 4, local rank 0 of 2 on its host)");
}

TEST(LaunchEnv, BatchScriptSeesTheAllocation) {
  const LaunchEnv e = detect_launch_env(batch_script());
  EXPECT_EQ(e.launcher, Launcher::kPlain);  // the script itself is not a rank
  ASSERT_TRUE(e.slurm);
  EXPECT_EQ(e.slurm->job_id, "42");
  EXPECT_FALSE(e.slurm->in_step());
  EXPECT_EQ(e.slurm->n_nodes, 2);
  EXPECT_EQ(e.slurm->n_tasks, 4);
  EXPECT_EQ(e.slurm->tasks_per_node, (std::vector<int>{2, 2}));
  EXPECT_EQ(e.slurm->cpus_per_task, 4);
  EXPECT_EQ(e.slurm->proc_id, -1);
  EXPECT_FALSE(e.srun_without_pmix());
  EXPECT_EQ(describe(e), "plain process in Slurm job 42 (4 tasks); nodes 2 (node[01-02]), tasks per node 2,2, 4 cpus per task");
}

TEST(LaunchEnv, SrunTaskWithPmix) {
  const LaunchEnv e = detect_launch_env(srun_task());
  EXPECT_EQ(e.launcher, Launcher::kSrun);
  EXPECT_TRUE(e.wired_by_launcher());
  ASSERT_TRUE(e.slurm && e.pmix);
  EXPECT_EQ(e.slurm->proc_id, 3);
  EXPECT_EQ(e.slurm->local_id, 1);
  EXPECT_EQ(e.pmix->rank, 3);
  EXPECT_EQ(describe(e), "srun (PMIx rank 3 in namespace slurm.pmix.42.0) in Slurm job 42 step 0 (task 3 of 4, local "
                         "id 1 on node02); nodes 2 (node[01-02]), tasks per node 2,2, 4 cpus per task");
}

TEST(LaunchEnv, SrunWithoutPmixIsRecognised) {
  Environment env = srun_task_without_pmix();
  const LaunchEnv e = detect_launch_env(env);
  EXPECT_EQ(e.launcher, Launcher::kPlain);
  EXPECT_TRUE(e.srun_without_pmix());
  // One task alone is just a plain process: nothing to wire.
  env["SLURM_NTASKS"] = "1";
  env["SLURM_TASKS_PER_NODE"] = "1";
  EXPECT_FALSE(detect_launch_env(env).srun_without_pmix());
}

// What MPICH's Hydra (mpiexec -n 2) gives its second task: PMI-1 variables, no PMIx.
Environment hydra_task() {
  return {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"PMI_FD", "8"}, {"MPI_LOCALNRANKS", "2"}, {"MPI_LOCALRANKID", "1"}};
}

TEST(LaunchEnv, HydraTasksAreRecognisedAsUnwired) {
  const LaunchEnv e = detect_launch_env(hydra_task());
  EXPECT_EQ(e.launcher, Launcher::kPlain);  // Open MPI cannot join PMI: nothing wires these tasks
  EXPECT_FALSE(e.wired_by_launcher());
  ASSERT_TRUE(e.pmi);
  EXPECT_EQ(e.pmi->size, 2);
  EXPECT_TRUE(e.pmi_tasks_without_pmix());
  EXPECT_EQ(e.task_rank(), 1);
  EXPECT_EQ(e.task_rank_on_host(), 1);
  EXPECT_EQ(describe(e), "plain process (PMI rank 1 of 2, without PMIx)");
  // One task alone needs no wiring; srun --mpi=pmi2 (PMI_* inside a step, no MPI_LOCALRANKID) is srun's
  // case, with srun's fix.
  EXPECT_FALSE(detect_launch_env({{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}, {"PMI_FD", "3"}}).pmi_tasks_without_pmix());
  Environment pmi2 = srun_task_without_pmix();
  pmi2.insert({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"PMI_FD", "5"}});
  EXPECT_TRUE(detect_launch_env(pmi2).srun_without_pmix());
  EXPECT_FALSE(detect_launch_env(pmi2).pmi_tasks_without_pmix());
  EXPECT_EQ(detect_launch_env(pmi2).task_rank(), 3);
  EXPECT_EQ(detect_launch_env(pmi2).task_rank_on_host(), 1);
  // Hydra inside an allocation: its tasks inherit the step of its proxies (every task SLURM_PROCID 0 on the
  // first node); PMI and MPI_LOCALRANKID tell them apart, and it is Hydra's case, not srun's.
  Environment in_allocation = hydra_task();
  in_allocation.insert({{"SLURM_JOB_ID", "9"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
                        {"SLURM_NTASKS", "2"}});
  const LaunchEnv hydra_in_slurm = detect_launch_env(in_allocation);
  EXPECT_TRUE(hydra_in_slurm.started_by_hydra());
  EXPECT_FALSE(hydra_in_slurm.srun_without_pmix());
  EXPECT_TRUE(hydra_in_slurm.pmi_tasks_without_pmix());
  EXPECT_EQ(hydra_in_slurm.task_rank(), 1);
  EXPECT_EQ(hydra_in_slurm.task_rank_on_host(), 1);
  // PMI variables without a live connection (PMI_FD, PMI_PORT) are a shell's leftovers: not a task.
  Environment leftover = hydra_task();
  leftover.erase("PMI_FD");
  EXPECT_FALSE(detect_launch_env(leftover).pmi);
  EXPECT_EQ(detect_launch_env(leftover).task_rank(), -1);
  // A launcher Open MPI does join decides: mpirun's ranks with a stray PMI_SIZE are wired.
  Environment mpirun = hydra_task();
  mpirun.insert({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}});
  EXPECT_FALSE(detect_launch_env(mpirun).pmi_tasks_without_pmix());
  EXPECT_EQ(detect_launch_env(mpirun).task_rank(), 0);
  EXPECT_THROW(detect_launch_env({{"PMI_SIZE", "two"}, {"PMI_PORT", "host:1234"}}), ConfigError);
}

TEST(LaunchEnv, PmixWithoutSlurmOrMpirun) {
  const LaunchEnv e = detect_launch_env({{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "prte-1"}});
  EXPECT_EQ(e.launcher, Launcher::kPmix);
}

TEST(LaunchEnv, MpirunInsideAnAllocation) {
  Environment env = batch_script();
  env["SLURM_STEP_ID"] = "1";  // mpirun's daemons run as a step
  env["OMPI_COMM_WORLD_SIZE"] = "4";
  env["OMPI_COMM_WORLD_RANK"] = "1";
  const LaunchEnv e = detect_launch_env(env);
  EXPECT_EQ(e.launcher, Launcher::kMpirun);
  EXPECT_TRUE(e.slurm);
}

// The commands that are not MPI jobs run on one task of a launch (or of each host): which one this is.
TEST(LaunchEnv, TaskRanksForCommandsThatRunOnce) {
  EXPECT_EQ(detect_launch_env(Environment{}).task_rank(), -1);
  EXPECT_EQ(detect_launch_env(Environment{}).task_rank_on_host(), -1);
  EXPECT_EQ(detect_launch_env(batch_script()).task_rank(), -1);  // the script is one process, not a task
  EXPECT_EQ(detect_launch_env(batch_script()).task_rank_on_host(), -1);
  const LaunchEnv srun = detect_launch_env(srun_task());
  EXPECT_EQ(srun.task_rank(), 3);
  EXPECT_EQ(srun.task_rank_on_host(), 1);
  EXPECT_EQ(detect_launch_env(srun_task_without_pmix()).task_rank(), 3);  // srun's tasks are numbered either way
  // mpirun inside an allocation: its ranks inherit the daemons' SLURM_PROCID / SLURM_LOCALID; OMPI_* decides.
  Environment mpirun = batch_script();
  mpirun["SLURM_STEP_ID"] = "1";
  mpirun["SLURM_PROCID"] = "1";
  mpirun["OMPI_COMM_WORLD_SIZE"] = "4";
  mpirun["OMPI_COMM_WORLD_RANK"] = "2";
  mpirun["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  const LaunchEnv e = detect_launch_env(mpirun);
  EXPECT_EQ(e.task_rank(), 2);
  EXPECT_EQ(e.task_rank_on_host(), 0);
  EXPECT_EQ(detect_launch_env({{"PMIX_RANK", "5"}, {"PMIX_NAMESPACE", "prte-1"}}).task_rank(), 5);
  EXPECT_EQ(detect_launch_env({{"PMIX_RANK", "5"}, {"PMIX_NAMESPACE", "prte-1"}}).task_rank_on_host(), -1);
}

TEST(LaunchEnv, TaskCountFallsBackToTasksPerNode) {
  const LaunchEnv e = detect_launch_env({{"SLURM_JOB_ID", "7"}, {"SLURM_TASKS_PER_NODE", "3(x2),1"}});
  ASSERT_TRUE(e.slurm);
  EXPECT_EQ(e.slurm->n_tasks, 7);
}

TEST(LaunchEnv, NonsenseInALauncherVariableIsAConfigError) {
  EXPECT_THROW(detect_launch_env({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "four"}}), ConfigError);
  EXPECT_THROW(detect_launch_env({{"OMPI_COMM_WORLD_SIZE", "-2"}}), ConfigError);
  try {
    detect_launch_env({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "four"}});
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_NTASKS='four'"), std::string::npos) << e.what();
  }
}

TEST(SlurmCounts, Expand) {
  EXPECT_EQ(expand_slurm_counts("V", "4"), (std::vector<int>{4}));
  EXPECT_EQ(expand_slurm_counts("V", "2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_slurm_counts("V", "1,16(x2)"), (std::vector<int>{1, 16, 16}));
  for (const char* bad : {"", "x", "2(x)", "2(x3", "2,", ",2", "2,,3", "-1", "2(x0)", "99999999999"}) {
    EXPECT_THROW(expand_slurm_counts("V", bad), ConfigError) << bad;
  }
}

// A fuzzing pass: '999999999(x3)' summed to a negative int, so launch-check let a 2-rank layout pass; and
// '1(x999999999)' expanded to 4 GB before anything was checked.
TEST(SlurmCounts, CountsBeyondAnyClusterAreRefused) {
  try {
    detect_launch_env({{"SLURM_JOB_ID", "77"}, {"SLURM_TASKS_PER_NODE", "999999999(x3)"}});
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_TASKS_PER_NODE='999999999(x3)' adds up to 2999999997 tasks"),
              std::string::npos) << e.what();
  }
  try {
    expand_slurm_counts("V", "1(x999999999)");
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("names more than 1048576 nodes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(expand_slurm_counts("V", "1(x1048576)").size(), 1048576u);
}

}  // namespace
}  // namespace shardline::launch
