// Real `mpirun --oversubscribe` jobs: every valid (tp, pp) layout of both reference models reproduces the
// goldens; micro-batch counts and chunk sizes do not change a token; logits stay within 1e-4 of one rank;
// invalid layouts fail fast with one message; a dead or stuck rank brings the whole job down.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/golden_run.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

namespace fs = std::filesystem;

struct Layout {
  std::string model;
  int tp;
  int pp;
};

class Distributed : public GoldenCliTest {
 protected:
  // `run` of the golden prompts of model (their goldens in golden_) on a layout.
  std::string run_args(const std::string& model, int tp, int pp, const std::string& extra = "") {
    return golden_run(model, "--tp " + std::to_string(tp) + " --pp " + std::to_string(pp) + " " + extra);
  }

  void expect_goldens(const std::string& model, int tp, int pp, const std::string& extra = "") {
    SHARDLINE_REQUIRE_MODEL_FILE(model_file(model));
    const ProcessResult r = run_process(mpirun(tp * pp) + run_args(model, tp, pp, extra), 180);
    test::expect_goldens(r, golden_.goldens,
                         model + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " " + extra);
  }
};

// --- Goldens on every valid layout of up to 8 ranks --------------------------------------------------

class EveryLayout : public Distributed, public ::testing::WithParamInterface<Layout> {};

TEST_P(EveryLayout, ReproducesTheGoldens) { expect_goldens(GetParam().model, GetParam().tp, GetParam().pp); }

// tiny-32k: 4 kv heads, 3 layers -> tp in {1,2,4}, pp in {1,2,3}. mini-gqa: 2 kv heads, 4 layers.
INSTANTIATE_TEST_SUITE_P(
    Goldens, EveryLayout,
    ::testing::Values(Layout{"tiny-32k.bin", 1, 1}, Layout{"tiny-32k.bin", 2, 1}, Layout{"tiny-32k.bin", 4, 1},
                      Layout{"tiny-32k.bin", 1, 2}, Layout{"tiny-32k.bin", 2, 2}, Layout{"tiny-32k.bin", 1, 3},
                      Layout{"tiny-32k.bin", 4, 2}, Layout{"tiny-32k.bin", 2, 3}, Layout{"mini-gqa.bin", 1, 1},
                      Layout{"mini-gqa.bin", 2, 1}, Layout{"mini-gqa.bin", 1, 2}, Layout{"mini-gqa.bin", 2, 2},
                      Layout{"mini-gqa.bin", 1, 3}, Layout{"mini-gqa.bin", 1, 4}, Layout{"mini-gqa.bin", 2, 3},
                      Layout{"mini-gqa.bin", 2, 4},
                      // The same models from llama.cpp's GGUF files, with the files' own vocabulary.
                      Layout{"tiny-32k.gguf", 4, 1}, Layout{"tiny-32k.gguf", 1, 3}, Layout{"mini-gqa.gguf", 2, 2},
                      Layout{"mini-gqa.gguf", 2, 4}),
    [](const auto& info) {
      std::string name = info.param.model;
      std::replace(name.begin(), name.end(), '-', '_');
      name = name.substr(0, name.find(".bin"));  // the llama2.c files keep their old names
      std::replace(name.begin(), name.end(), '.', '_');
      return name + "_tp" + std::to_string(info.param.tp) + "_pp" + std::to_string(info.param.pp);
    });

// --- Schedules: micro-batches and chunk sizes never change a token ------------------------------------

struct Schedule {
  int tp, pp, micro_batches, chunk_tokens;
};
class EverySchedule : public Distributed, public ::testing::WithParamInterface<Schedule> {};

TEST_P(EverySchedule, ReproducesTheGoldens) {
  const auto& p = GetParam();
  expect_goldens("mini-gqa.bin", p.tp, p.pp,
                 "--micro-batches " + std::to_string(p.micro_batches) + " --chunk-tokens " + std::to_string(p.chunk_tokens));
}

INSTANTIATE_TEST_SUITE_P(Pipeline, EverySchedule,
                         ::testing::Values(Schedule{1, 3, 1, 1}, Schedule{1, 3, 2, 3}, Schedule{1, 3, 4, 64},
                                           Schedule{2, 2, 1, 2}, Schedule{2, 2, 3, 5}, Schedule{1, 4, 4, 1}),
                         [](const auto& info) {
                           const auto& p = info.param;
                           return "tp" + std::to_string(p.tp) + "_pp" + std::to_string(p.pp) + "_m" +
                                  std::to_string(p.micro_batches) + "_chunk" + std::to_string(p.chunk_tokens);
                         });

// --plan auto fills in only what the flags leave open, and reports the layout the run uses: a split it
// would never pick itself (the classifier's stage gets fewer layers) is kept in the plan line and the run,
// and a fixed chunk in the run. It once printed its own balanced split while the engine ran the given one.
TEST_F(Distributed, PlanAutoReportsTheSplitTheFlagsFixed) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  const ProcessResult r = run_process(
      mpirun(2) + golden_run("mini-gqa.bin", "--tp 1 --pp 2 --layers-per-stage 1,3 --chunk-tokens 5 --print-config"),
      180);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("plan: tp=1 pp=2 layers/stage 1,3 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chunk_tokens: 5"), std::string::npos) << r.out;
  expect_goldens("mini-gqa.bin", 1, 2, "--layers-per-stage 1,3 --chunk-tokens 5");
}

// --- Logits parity ----------------------------------------------------------------------------------

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<float> values((fs::file_size(path)) / sizeof(float));
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
  return values;
}

// Tolerance: TP sums partial products over heads and hidden slices in another order, so logits differ by
// float rounding: about sqrt(k) * 2^-24 relative per dot product, compounded over a few layers: ~1e-6.
// 1e-4 relative to the step's largest logit leaves two orders of margin and still catches any real
// mistake (a wrong slice moves logits by O(1)).
TEST_F(Distributed, LogitsStayWithin1e4OfOneRank) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  const auto reference = path("one.logits");
  ASSERT_EQ(run_process(mpirun(1) + run_args("mini-gqa.bin", 1, 1, "--dump-logits " + reference)).exit_code, 0);
  const std::vector<float> one = read_floats(reference);
  const int vocab = 32000;
  ASSERT_EQ(one.size(), 4u * 64 * vocab);
  for (const auto& [tp, pp] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}, {2, 2}}) {
    const auto file = path("tp" + std::to_string(tp) + "pp" + std::to_string(pp) + ".logits");
    const ProcessResult r = run_process(mpirun(tp * pp) + run_args("mini-gqa.bin", tp, pp, "--dump-logits " + file));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<float> many = read_floats(file);
    ASSERT_EQ(many.size(), one.size());
    double worst = 0;
    for (std::size_t step = 0; step < one.size() / vocab; ++step) {
      double max_abs = 0, max_diff = 0;
      for (int v = 0; v < vocab; ++v) {
        max_abs = std::max(max_abs, std::fabs(double(one[step * vocab + v])));
        max_diff = std::max(max_diff, std::fabs(double(one[step * vocab + v]) - many[step * vocab + v]));
      }
      worst = std::max(worst, max_diff / max_abs);
    }
    EXPECT_LT(worst, 1e-4) << "tp=" << tp << " pp=" << pp;
    RecordProperty("worst_relative_logit_error_tp" + std::to_string(tp) + "_pp" + std::to_string(pp), std::to_string(worst));
    std::printf("tp=%d pp=%d: worst relative logit error %.3g\n", tp, pp, worst);
  }
}

// --- Invalid layouts ----------------------------------------------------------------------------------

TEST_F(Distributed, InvalidLayoutsFailFastWithOneMessage) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  struct Case {
    int np, tp, pp;
    std::string message;
  };
  for (const Case& c : {Case{3, 3, 1, "tp=3 does not divide n_kv_heads=4"}, Case{4, 1, 4, "pp=4 exceeds n_layers=3"},
                        Case{4, 2, 1, "does not match the 4 ranks"}, Case{2, 2, 2, "does not match the 2 ranks"}}) {
    const auto start = std::chrono::steady_clock::now();
    const ProcessResult r = run_process(mpirun(c.np) + run_args("tiny-32k.bin", c.tp, c.pp), 60);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    // Exactly one rank prints the reason (the others agree on it and exit quietly).
    std::size_t count = 0;
    for (std::size_t at = r.err.find(" error: "); at != std::string::npos; at = r.err.find(" error: ", at + 1)) ++count;
    EXPECT_EQ(count, 1u) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_LT(seconds, 20) << "a bad layout must be rejected before any work";
  }
}

// --- Failing ranks ----------------------------------------------------------------------------------

// Starts an mpirun job in the background; returns its pid. stdout/stderr go to files.
pid_t spawn(const std::string& command, const std::string& out, const std::string& err) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const std::string full = command + " >" + out + " 2>" + err + " </dev/null";
    execl("/bin/sh", "sh", "-c", ("exec " + full).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// pid of a rank of this job: the shardline process whose environment says OMPI_COMM_WORLD_RANK=rank and
// whose mpirun is `launcher`.
pid_t find_rank_pid(pid_t launcher, int rank) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string pid, comm, state, ppid;
    stat >> pid >> comm >> state >> ppid;
    if (comm != "(shardline)" || std::stoi(ppid) != launcher) continue;
    std::ifstream env(entry.path() / "environ");
    std::string var;
    while (std::getline(env, var, '\0')) {
      if (var == "OMPI_COMM_WORLD_RANK=" + std::to_string(rank)) return std::stoi(name);
    }
  }
  return -1;
}

// Waits for pid with a deadline; returns the exit status or -1 on time-out (then kills the group).
int wait_with_deadline(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(-pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

class FailingRank : public Distributed {
 protected:
  // A long job (a generated model with a long context) with the given layout; returns its launcher pid
  // once the output rank has started printing.
  pid_t start_long_job(int tp, int pp, const std::string& extra) {
    model_ = path("long.bin");
    EXPECT_EQ(run_process(shardline_binary() + " gen-model --dim 256 --hidden 768 --layers 4 --heads 8 --kv-heads 4 "
                                               "--vocab 512 --seq 4096 --out " + model_).exit_code, 0);
    const pid_t pid = spawn(mpirun(tp * pp) + shardline_binary() + " run --threads 1 --model " + model_ +
                                " --steps 4000 --tp " + std::to_string(tp) + " --pp " + std::to_string(pp) + " " + extra,
                            path("job.out"), path("job.err"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline && (!fs::exists(path("job.out")) || fs::file_size(path("job.out")) < 200)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return pid;
  }
  std::string model_;
};

TEST_F(FailingRank, KilledRankEndsTheJobWithin10Seconds) {
  const pid_t job = start_long_job(1, 2, "");
  const pid_t victim = find_rank_pid(job, 1);
  ASSERT_GT(victim, 0) << "rank 1 not found";
  const auto start = std::chrono::steady_clock::now();
  kill(victim, SIGKILL);
  const int status = wait_with_deadline(job, 10);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(status, -1) << "the job outlived a killed rank by 10 s";
  EXPECT_NE(status, 0);
  const std::string err = read_text_file(path("job.err"));
  EXPECT_NE(err.find("rank 1"), std::string::npos) << err;  // the launcher names the dead rank
  std::printf("job ended %.2f s after rank 1 was killed (exit %d)\n", seconds, status);
}

TEST_F(FailingRank, StuckRankTimesOutAndNamesTheCause) {
  // SIGSTOP: the rank is alive but never answers; its peer's --comm-timeout fires, it reports the failed
  // operation and aborts the job.
  const pid_t job = start_long_job(2, 1, "--comm-timeout 2");
  const pid_t victim = find_rank_pid(job, 1);
  ASSERT_GT(victim, 0);
  kill(victim, SIGSTOP);
  const int status = wait_with_deadline(job, 30);
  kill(victim, SIGKILL);
  EXPECT_NE(status, -1) << "the job hung on a stuck rank";
  EXPECT_EQ(status, 5) << read_text_file(path("job.err"));  // ExitCode::kComm
  const std::string err = read_text_file(path("job.err"));
  EXPECT_NE(err.find("[r0 pp0 tp0] error:"), std::string::npos) << err;
  EXPECT_NE(err.find("timed out"), std::string::npos) << err;
  EXPECT_EQ(err.find("with rank 0 ("), std::string::npos) << "rank 0 blamed itself:\n" << err;
}

// --- Memory scales with the shard -----------------------------------------------------------------

long peak_rss(const std::string& err, int rank_tag_rank) {
  const std::regex line("\\[r" + std::to_string(rank_tag_rank) + "[^\\]]*\\][^\\n]*peak RSS ([0-9.]+) (MiB|GiB)");
  std::smatch m;
  if (!std::regex_search(err, m, line)) return -1;
  return static_cast<long>(std::stod(m[1]) * (m[2] == "GiB" ? 1024 : 1));
}

TEST_F(Distributed, PerRankMemoryWithTp2IsWellUnderOneRank) {
  const std::string model = path("m110.bin");
  ASSERT_EQ(run_process(shardline_binary() + " gen-model --preset 110m --out " + model).exit_code, 0);
  const std::string args = " run --threads 1 --verbose --steps 4 --model " + model;
  const ProcessResult one = run_process(mpirun(1) + shardline_binary() + args + " --tp 1 --pp 1", 180);
  const ProcessResult two = run_process(mpirun(2) + shardline_binary() + args + " --tp 2 --pp 1", 180);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const long single = peak_rss(one.err, 0);
  const long rank0 = peak_rss(two.err, 0), rank1 = peak_rss(two.err, 1);
  ASSERT_GT(single, 0) << one.err;
  ASSERT_GT(rank0, 0) << two.err;
  ASSERT_GT(rank1, 0) << two.err;
  const double ratio = static_cast<double>(std::max(rank0, rank1)) / single;
  std::printf("peak RSS: one rank %ld MiB; tp=2 ranks %ld and %ld MiB; ratio %.2f\n", single, rank0, rank1, ratio);
  RecordProperty("rss_ratio_tp2", std::to_string(ratio));
  EXPECT_LT(ratio, 0.65) << "a TP rank should hold about half the weights";
}

}  // namespace
}  // namespace shardline::test
