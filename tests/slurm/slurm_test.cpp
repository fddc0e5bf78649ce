// Real Slurm: CTest's fixture (local-cluster.sh up/down) runs munged, slurmctld and slurmd on localhost;
// these tests submit the repository's own sbatch scripts (hostfiles/slurm/) with tiny-32k, wait for the
// job, and check its output against the goldens, and that a bad launch fails with one clear line.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <gtest/gtest.h>

#include "tests/support/golden_run.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

namespace fs = std::filesystem;

struct Job {
  std::string id;
  std::string state;  // COMPLETED, FAILED, ...
  int exit_code = -1;
  std::string out, err;
};

class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string cluster = SHARDLINE_SLURM_CLUSTER_DIR;
    // The fixture must have brought the cluster up: a missing one is a failure, never a skip.
    ASSERT_TRUE(fs::exists(cluster + "/slurm.conf"))
        << "no Slurm cluster at " << cluster << ": run through ctest (fixture slurm_cluster_up)";
    setenv("SLURM_CONF", (cluster + "/slurm.conf").c_str(), 1);
    setenv("SHARDLINE", shardline_binary().c_str(), 1);  // the sbatch scripts use $SHARDLINE
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(cluster) / "jobs" / info->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::permissions(dir_, fs::perms::all);
  }

  static std::string script(const std::string& name) {
    return std::string(SHARDLINE_SOURCE_DIR) + "/hostfiles/slurm/" + name;
  }

  // Run flags for the tiny-32k goldens (their goldens in golden_): every golden prompt, greedy, JSON out.
  std::string golden_run_args(int tp, int pp) {
    golden_ = prepare_golden_run("tiny-32k.bin", (dir_ / "prompts").string());
    return golden_.flags + " --tp " + std::to_string(tp) + " --pp " + std::to_string(pp);
  }

  // sbatch SBATCH_FLAGS SCRIPT ARGS; waits for the job to end (scancel after timeout_s).
  Job submit(const std::string& sbatch_flags, const std::string& script_path, const std::string& args,
             int timeout_s = 120) {
    const std::string out = (dir_ / "job.out").string(), err = (dir_ / "job.err").string();
    const ProcessResult submitted = run_process("sbatch --parsable --chdir=" + dir_.string() + " --output=" + out +
                                                " --error=" + err + " " + sbatch_flags + " " + script_path + " " + args,
                                                30);
    Job job;
    EXPECT_EQ(submitted.exit_code, 0) << "sbatch failed: " << submitted.err;
    if (submitted.exit_code != 0) return job;
    job.id = submitted.out.substr(0, submitted.out.find_first_of(";\n"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    const std::regex state_re("JobState=(\\S+)"), exit_re("ExitCode=(\\d+):(\\d+)");
    while (std::chrono::steady_clock::now() < deadline) {
      const ProcessResult shown = run_process("scontrol -o show job " + job.id, 30);
      std::smatch m;
      if (std::regex_search(shown.out, m, state_re)) job.state = m[1];
      if (job.state != "PENDING" && job.state != "RUNNING" && job.state != "CONFIGURING" &&
          job.state != "COMPLETING" && !job.state.empty()) {
        if (std::regex_search(shown.out, m, exit_re)) job.exit_code = std::stoi(m[1]);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (job.exit_code < 0) {
      run_process("scancel " + job.id, 30);
      ADD_FAILURE() << "job " << job.id << " did not finish within " << timeout_s << " s (state " << job.state << ")";
    }
    job.out = read_text_file(out);
    job.err = read_text_file(err);
    return job;
  }

  void expect_goldens(const Job& job) {
    ASSERT_EQ(job.state, "COMPLETED") << job.err;
    ASSERT_EQ(job.exit_code, 0) << job.err;
    expect_golden_ids(job.out, golden_.goldens, "job " + job.id);
  }

  // A job that must fail before any rank works: exit code, one error line naming the cause, no output.
  static void expect_one_error(const Job& job, int exit_code, const std::string& message) {
    EXPECT_EQ(job.state, "FAILED") << job.err;
    EXPECT_EQ(job.exit_code, exit_code) << job.err;
    EXPECT_EQ(count_of(job.err, "] error: "), 1u) << job.err;
    EXPECT_NE(job.err.find(message), std::string::npos) << job.err;
    EXPECT_TRUE(job.out.empty()) << job.out;
  }

  fs::path dir_;
  GoldenRun golden_;
};

TEST_F(Slurm, SrunScriptAtTp2ReproducesTheGoldens) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const Job job = submit("--ntasks=2", script("srun.sbatch"), golden_run_args(2, 1) + " --verbose");
  expect_goldens(job);
  // Both ranks say they were started by srun inside this job, and MPI agrees they share the node.
  EXPECT_EQ(count_of(job.err, "launched by srun (PMIx rank"), 2u) << job.err;
  EXPECT_NE(job.err.find("in Slurm job " + job.id + " step"), std::string::npos) << job.err;
  EXPECT_EQ(count_of(job.err, ", local rank 0 of 2"), 1u) << job.err;  // the MPI node line
  EXPECT_EQ(count_of(job.err, ", local rank 1 of 2"), 1u) << job.err;
}

TEST_F(Slurm, SrunScriptAtTp2Pp2WithOvercommitReproducesTheGoldens) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  // Four ranks on a node of two CPUs: --overcommit lets Slurm start more tasks than CPUs.
  const Job job = submit("--ntasks=4 --overcommit", script("srun.sbatch"), golden_run_args(2, 2));
  expect_goldens(job);
}

TEST_F(Slurm, MpirunScriptInsideTheAllocationReproducesTheGoldens) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const Job job = submit("--ntasks=2", script("mpirun.sbatch"), golden_run_args(1, 2) + " --verbose");
  expect_goldens(job);
  EXPECT_EQ(count_of(job.err, "launched by mpirun (rank"), 2u) << job.err;
  EXPECT_NE(job.err.find("in Slurm job " + job.id), std::string::npos) << job.err;
}

TEST_F(Slurm, PlanOnlyScriptEmitsARunScriptThatReproducesTheGoldens) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  setenv("MODEL", model_file("tiny-32k.bin").c_str(), 1);
  setenv("CLUSTER", (std::string(SHARDLINE_SOURCE_DIR) + "/hostfiles/cluster-this-vm.json").c_str(), 1);
  setenv("PLAN_FLAGS", "--np 2", 1);
  setenv("BATCH", "4", 1);
  const Job plan = submit("--nodes=1 --ntasks=1", script("plan-only.sbatch"), "");
  unsetenv("MODEL");
  unsetenv("CLUSTER");
  unsetenv("PLAN_FLAGS");
  unsetenv("BATCH");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_NE(plan.out.find("layers/stage"), std::string::npos) << plan.out;  // the plan table
  const fs::path emitted = dir_ / ("shardline-run-" + plan.id + ".sbatch");
  ASSERT_TRUE(fs::exists(emitted)) << plan.out;
  const std::string text = read_text_file(emitted.string());
  EXPECT_NE(text.find("#SBATCH --ntasks=2"), std::string::npos) << text;
  // ... and the dtypes its memory per rank was computed for (plan's defaults here).
  EXPECT_NE(text.find("--weights-dtype fp32 --kv-dtype fp32"), std::string::npos) << text;
  // The emitted script carries the layout; the job passes only what to generate.
  std::string args = golden_run_args(1, 1);
  args = args.substr(0, args.find(" --tp "));
  const Job run = submit("--time=00:10:00", emitted.string(), args);  // this partition allows 30 min
  expect_goldens(run);
}

TEST_F(Slurm, AnOversubscribedPlansScriptOvercommitsAndReproducesTheGoldens) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  // Four ranks planned on this 2-CPU node: Slurm refuses --ntasks-per-node=4 there ("Requested node
  // configuration is not available"), so the script must overcommit and leave the per-node count to srun.
  const fs::path emitted = dir_ / "oversubscribed.sbatch";
  const ProcessResult plan = run_process(
      shardline_binary() + " plan --model " + model_file("tiny-32k.bin") + " --cluster " + SHARDLINE_SOURCE_DIR +
          "/hostfiles/cluster-this-vm.json --np 4 --ranks-per-domain 4 --tp 2 --pp 2 --emit sbatch",
      60);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const std::string& text = plan.out;
  std::ofstream(emitted) << text;
  EXPECT_NE(text.find("#SBATCH --overcommit"), std::string::npos) << text;
  // With --overcommit Slurm allocates one CPU a task per node: --exclusive takes the node's cores, which each
  // rank shares with the others (one thread each, as the plan priced: checked below).
  EXPECT_NE(text.find("#SBATCH --exclusive"), std::string::npos) << text;
  EXPECT_EQ(text.find("#SBATCH --ntasks-per-node"), std::string::npos) << text;
  EXPECT_NE(text.find("srun --mpi=pmix --cpus-per-task=\"${SLURM_CPUS_PER_TASK:-1}\" --ntasks-per-node=4"),
            std::string::npos) << text;
  std::string args = golden_run_args(1, 1);
  args = args.substr(0, args.find(" --tp "));
  const std::string threads = " --threads 1";  // the threads are the launch's to decide here
  ASSERT_NE(args.find(threads), std::string::npos) << args;
  args.erase(args.find(threads), threads.size());
  const Job run = submit("--time=00:10:00", emitted.string(), args + " --verbose");  // the partition allows 30 min
  expect_goldens(run);
  EXPECT_EQ(count_of(run.err, "1 thread/rank"), 1u) << run.err;  // the statistics line, from the output rank
  const ProcessResult shown = run_process("scontrol -o show job " + run.id, 30);
  EXPECT_NE(shown.out.find("NumCPUs=2"), std::string::npos) << shown.out;  // both of the node's CPUs
}

TEST_F(Slurm, AllocationTooSmallForTheLayoutFailsBeforeAnyRankStarts) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const auto start = std::chrono::steady_clock::now();
  const Job job = submit("--ntasks=2", script("srun.sbatch"), golden_run_args(2, 2));
  expect_one_error(job, 4, "has 2 tasks (SLURM_NTASKS) but tp=2 x pp=2 needs 4 ranks");
  EXPECT_NE(job.err.find("--ntasks=4"), std::string::npos) << "the message says what to submit: " << job.err;
  EXPECT_EQ(job.err.find("srun"), std::string::npos) << "srun must not have started: " << job.err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30);
}

TEST_F(Slurm, MoreTasksThanTheLayoutNeedsFailsBeforeAnyRankStarts) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const Job job = submit("--ntasks=4 --overcommit", script("srun.sbatch"), golden_run_args(2, 1));
  expect_one_error(job, 2, "has 4 tasks but tp=2 x pp=1 uses 2");
}

TEST_F(Slurm, SrunWithMoreRanksThanTheLayoutFailsWithOneLine) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  // srun straight away (it makes its own allocation): the ranks agree on the problem, one prints it.
  const ProcessResult r = run_process("srun --mpi=pmix --ntasks=3 --overcommit " + shardline_binary() + " run " +
                                          golden_run_args(2, 1), 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count_of(r.err, "] error: "), 1u) << r.err;
  EXPECT_NE(r.err.find("does not match the 3 ranks"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(Slurm, SrunWithoutPmixIsRefusedWithOneLine) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  // MpiDefault=none: without --mpi=pmix the tasks cannot find each other; they must not run as two jobs.
  const ProcessResult r = run_process("srun --ntasks=2 " + shardline_binary() + " run " + golden_run_args(2, 1), 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count_of(r.err, "] error: "), 1u) << r.err;
  EXPECT_NE(r.err.find("srun --mpi=pmix"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// MPICH's mpiexec (Hydra) inside an allocation starts its proxies as an srun step, so its tasks carry that
// step's SLURM_STEP_ID and SLURM_PROCID (0 on every task of the first node) beside Hydra's PMI variables: it
// must be refused as Hydra, by one task, and the commands that run once must count Hydra's tasks.
TEST_F(Slurm, HydraInsideAnAllocationIsRefusedWithOneLine) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string hydra = "salloc --ntasks=2 --overcommit mpiexec.hydra -n 2 " + shardline_binary();
  ProcessResult r = run_process(hydra + " run " + golden_run_args(1, 1), 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count_of(r.err, "] error: "), 1u) << r.err;
  EXPECT_NE(r.err.find("started as 2 tasks by a PMI launcher"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = run_process(hydra + " --version", 60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "shardline 0.1.0\n") << r.err;
}

}  // namespace
}  // namespace shardline::test
